"""``LLMEngine``: the shared policy scheduler driving a real model, step by step.

Each :meth:`LLMEngine.step` is one vLLM V1 engine step with synchronous scheduling:
``plan = scheduler.schedule()``, run the plan's tokens through the model, sample, then
``scheduler.update(plan, sampled)``. The scheduler and its KV cache manager are the
simulator's own objects (:mod:`simulator.policy`), so batching, chunking, prefix caching and
preemption are identical in both; the engine only executes plans, and measures them.

Records (integer ns on the run's clock, 0 = engine start or ``replay`` start):
:class:`simulator.policy.RequestRecord` per request and :class:`StepRecord` per step.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      field_validator)

from simulator.errors import STRICT_SCHEMA, InputError
from simulator.policy import (Request, RequestRecord, RequestRejected, Scheduler,
                              SchedulerConfig)
from simulator.policy.kv_cache import GPU_MEMORY_UTILIZATION

from .kv_store import KVStore
from .memory import (blocks_for_budget, profile_cuda_kv_budget, report_kv_cache)
from .model import ModelConfig, Transformer
from .runner import ModelRunner
from .sampling import (Integer, SamplingParams, as_integer, request_generator, sample,
                       sampling_params, seed_in_range, validation_message)
from .tokenizer import load_tokenizer
from .weights import generation_eos, load_pretrained, parse_dtype, random_model

log = logging.getLogger("servesim.engine")


class EngineConfig(BaseModel):
    """Engine knobs, named and defaulted as vLLM's engine arguments.

    Attributes:
        block_size: tokens per KV block (vLLM GPU default 16).
        max_num_seqs, max_num_batched_tokens: batch limits (default 256 and 8192 here;
            ``vllm serve``'s depend on the device, see
            :meth:`simulator.scenario.Scenario.serving_defaults`).
        max_model_len: tokens per request at most; ``None`` = the model's
            ``max_position_embeddings``.
        enable_prefix_caching: automatic prefix caching (vLLM V1: on).
        scheduler_reserve_full_isl: admit a waiting request only when its whole sequence
            fits in the free KV blocks (vLLM's knob; default on).
        watermark: share of the KV blocks kept free when admitting while others run
            (vLLM's knob; default 0).
        long_prefill_token_threshold: most prompt tokens per request and step while others
            run or wait (vLLM's knob; default 0, no cap).
        enable_chunked_prefill: cut prompts to the step's token budget (vLLM's knob;
            default on); off, a prompt runs whole or waits, and ``max_num_batched_tokens``
            must be at least ``max_model_len``.
        num_gpu_blocks: KV blocks incl. the null block; overrides the memory-based size
            (vLLM ``num_gpu_blocks_override``).
        kv_cache_memory_bytes: KV cache memory on cpu (vLLM ``VLLM_CPU_KVCACHE_SPACE``; also
            accepted on cuda, as vLLM's ``kv_cache_memory_bytes``).
        gpu_memory_utilization: fraction of device memory for this engine (cuda; vLLM's
            default, :data:`~simulator.policy.kv_cache.GPU_MEMORY_UTILIZATION`, 0.92).
        dtype: ``float32`` or ``bfloat16``. device: ``cpu`` or ``cuda[:n]``.
        seed: seeds the random weights (when built from a config dict) and the sampling
            of requests without their own seed.

    Raises:
        InputError: a bad value or type (no coercion: ``"8"`` or ``True`` is not a count),
            naming ``engine.<field>``; an unknown key, with the allowed ones.
    """

    # strict as the scenario's engine section: "8" is not 8 here either
    model_config = ConfigDict(**STRICT_SCHEMA, frozen=True)

    # Integer: NumPy's integers too, as prompts and SamplingParams take them
    block_size: Integer = Field(16, ge=1)
    max_num_seqs: Integer = Field(256, ge=1)
    max_num_batched_tokens: Integer = Field(8192, ge=1)
    max_model_len: Integer | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    watermark: float = Field(0.0, ge=0.0, lt=1.0)
    long_prefill_token_threshold: Integer = Field(0, ge=0)
    enable_chunked_prefill: bool = True
    num_gpu_blocks: Integer | None = Field(None, ge=2)
    kv_cache_memory_bytes: Integer | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(GPU_MEMORY_UTILIZATION, gt=0.0, le=1.0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("cpu", pattern="^(cpu|cuda(:[0-9]+)?)$")
    seed: Annotated[Integer, AfterValidator(seed_in_range)] = 0

    @field_validator("device")
    @classmethod
    def _device_here(cls, v):
        # torch's own refusal is a bare AssertionError from deep inside the first tensor
        if v.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ValueError("no CUDA device here (torch built for CPU, or no GPU "
                                 "visible); use cpu")
            i = int(v.partition(":")[2] or 0)
            if i >= torch.cuda.device_count():
                raise ValueError(f"{v}: this machine has {torch.cuda.device_count()} CUDA "
                                 f"device(s), numbered from 0")
        return v

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise InputError(validation_message(e, "engine", EngineConfig)) from None


@dataclass
class StepRecord:
    """What one engine step did and how long it took (ns on the run's clock).

    Attributes:
        step: scheduler step index. start_ns: when the step began.
        duration_ns: the whole step (schedule + inputs + forward + sampling + update);
            on cuda after ``torch.cuda.synchronize``.
        execute_ns: forward + sampling only.
        prefills: ``(request_id, num_new_tokens, num_computed_before)`` per prefill chunk.
        num_decodes, decode_context_tokens, num_sampled, num_scheduled_tokens: as
            :class:`simulator.policy.StepPlan`. preempted: ids preempted in this step.
        num_running, num_waiting, kv_cache_usage: scheduler state after the step.
        reread_tokens: context tokens read again within the step, as
            :attr:`simulator.policy.StepPlan.reread_tokens` (0 where not counted).
    """

    step: int
    start_ns: int
    duration_ns: int
    execute_ns: int
    prefills: list
    num_decodes: int
    decode_context_tokens: int
    num_sampled: int
    num_scheduled_tokens: int
    preempted: list
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    reread_tokens: int = 0


@dataclass
class RequestOutput:
    """A finished request: its tokens, text, finish reason and record."""

    request_id: object
    prompt_token_ids: list
    output_token_ids: list
    text: str
    finish_reason: str
    record: RequestRecord


@dataclass
class _Live:
    params: SamplingParams
    generator: torch.Generator
    record: RequestRecord = field(default=None)


def _is_token_id(x) -> bool:
    """Whether ``x`` is one token id (a Python or NumPy integer, or a 0-d array or tensor)
    rather than a prompt (a list, array or tensor of them)."""
    return isinstance(x, numbers.Integral) or getattr(x, "ndim", None) == 0


@contextmanager
def _memory_named(what: str):
    """An allocation the device refuses (``RuntimeError``/``MemoryError``: a config of
    10**12 KV blocks or vocab entries) as one InputError naming ``what``."""
    try:
        yield
    except (RuntimeError, MemoryError, TypeError) as e:
        text = str(e)   # 2**62 blocks: "Storage size calculation overflowed"; 2**63: a
        # TypeError "Overflow when unpacking long long"
        if not isinstance(e, MemoryError) and not any(
                w in text.lower() for w in ("alloc", "out of memory", "overflow")):
            raise
        raise InputError(f"{what}: needs more memory than the device gives "
                         f"({text.splitlines()[0] if text else type(e).__name__})") from None


class LLMEngine:
    """A paged-KV-cache inference engine over :class:`simulator.policy.Scheduler`.

    Args:
        model: an HF-style config dict (random weights from ``config.seed``), a path to an
            HF-style directory (``config.json``, ``*.safetensors``, optional
            ``tokenizer.json``), or a :class:`.model.Transformer`.
        config: :class:`EngineConfig` or a dict of its fields.
        tokenizer: overrides the tokenizer found with the model.
        capture_logits: keep the logits of every computed position of every step in
            ``captured_logits`` as ``(request_id, positions [n], logits [n, vocab])`` (for
            reference tests; slow).

    Raises:
        InputError: bad config, or a ``model``/``config`` of another type; on cpu neither
            ``num_gpu_blocks`` nor ``kv_cache_memory_bytes``; a KV cache too small for one
            ``max_model_len`` request; ``max_model_len`` beyond the model's
            ``max_position_embeddings``; weights or a KV cache the device cannot allocate.
    """

    def __init__(self, model, config: EngineConfig | dict | None = None, tokenizer=None,
                 capture_logits: bool = False):
        if not isinstance(config, (EngineConfig, Mapping, type(None))):
            raise InputError(f"config: an EngineConfig or a mapping of its fields (got "
                             f"{type(config).__name__})")
        cfg = config if isinstance(config, EngineConfig) else EngineConfig(**(config or {}))
        self.config = cfg
        dtype = parse_dtype(cfg.dtype)
        model_dir = None
        with _memory_named("model"):
            if isinstance(model, Transformer):
                self.model = model.to(device=cfg.device, dtype=dtype).eval()
            elif isinstance(model, Mapping):
                self.model = random_model(dict(model), seed=cfg.seed, dtype=dtype,
                                          device=cfg.device)
            elif isinstance(model, (str, os.PathLike)):
                model_dir = Path(model)
                self.model = load_pretrained(model_dir, dtype=dtype, device=cfg.device)
            else:
                raise InputError(f"model: an HF config mapping, a model folder's path or a "
                                 f"Transformer (got {type(model).__name__})")
        mcfg: ModelConfig = self.model.config
        self.model_config = mcfg
        # oneDNN layouts for CPU matmuls, packed once (vLLM's CPU backend does the same).
        self.model.prepack(cfg.device == "cpu" and dtype in (torch.float32, torch.bfloat16))
        self.tokenizer = tokenizer or load_tokenizer(model_dir, mcfg.vocab_size)
        max_len = cfg.max_model_len or mcfg.max_position_embeddings
        if max_len > mcfg.max_position_embeddings:
            raise InputError(f"engine.max_model_len: {max_len} exceeds the model's "
                             f"max_position_embeddings {mcfg.max_position_embeddings}")
        self.max_model_len = max_len
        # ... and their kernels built for every step size served (Transformer.warm_up).
        self.model.warm_up(cfg.max_num_batched_tokens, cfg.max_num_seqs,
                           block_size=cfg.block_size, max_context=max_len)
        self.num_gpu_blocks = self._kv_blocks(dtype)
        try:
            sched_cfg = SchedulerConfig(
                max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=max_len,
                block_size=cfg.block_size, num_gpu_blocks=self.num_gpu_blocks,
                enable_prefix_caching=cfg.enable_prefix_caching,
                scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
                watermark=cfg.watermark,
                long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                enable_chunked_prefill=cfg.enable_chunked_prefill)
        except ValueError as e:
            raise InputError(f"engine: {e}") from None
        self.max_concurrency = report_kv_cache(self.num_gpu_blocks, cfg.block_size, max_len,
                                               cfg.device)
        self.scheduler = Scheduler(sched_cfg)
        with _memory_named("engine.num_gpu_blocks" if cfg.num_gpu_blocks is not None
                           or cfg.kv_cache_memory_bytes is None
                           else "engine.kv_cache_memory_bytes"):
            self.kv_store = KVStore(mcfg.num_hidden_layers, self.num_gpu_blocks,
                                    cfg.block_size, mcfg.num_key_value_heads, mcfg.head_dim,
                                    dtype, cfg.device)
        self.runner = ModelRunner(self.model, self.kv_store, cfg.block_size)
        eos = mcfg.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        eos_list = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
        if model_dir is not None:   # and the folder's generation config's, as vLLM
            eos_list += [t for t in generation_eos(model_dir, mcfg.vocab_size)
                         if t not in eos_list]
        self.eos_token_id = eos_list[0] if eos_list else None
        self._extra_stops = tuple(eos_list[1:])
        self.capture_logits = capture_logits
        # Steps schedule and allocate KV but skip the model (every sampling request gets
        # token 0): calibration sets up long contexts this way, since a later step's cost
        # depends on how many K/V slots it reads, not on their values.
        self.skip_forward = False
        self.captured_logits: list = []
        self.records: dict = {}
        self.step_records: list[StepRecord] = []
        self._live: dict[Request, _Live] = {}
        self._held: list[RequestOutput] = []   # others' outputs met inside generate()
        self._failed: str | None = None   # why a step raised: the engine cannot go on
        self._next_id = 0
        self._t0 = time.perf_counter_ns()
        self._cuda = cfg.device.startswith("cuda")

    @classmethod
    def from_catalog(cls, model, config: EngineConfig | dict | None = None,
                     **kwargs) -> "LLMEngine":
        """Engine with seeded random weights on a model shape from
        :func:`simulator.catalog.load_model` (a catalog name such as ``llama-tiny-56m``, a
        ``config.json`` path, or an inline mapping).

        Raises:
            InputError: unknown name or bad shape (from the catalog), or bad config.
        """
        from simulator.catalog import load_model
        return cls(load_model(model).hf_config(), config, **kwargs)

    # -- set-up -----------------------------------------------------------------------
    def _kv_blocks(self, dtype) -> int:
        cfg, mcfg = self.config, self.model.config
        if cfg.num_gpu_blocks is not None:
            return cfg.num_gpu_blocks
        if cfg.kv_cache_memory_bytes is not None:
            budget = cfg.kv_cache_memory_bytes
        elif cfg.device.startswith("cuda"):
            budget = profile_cuda_kv_budget(
                self.model, cfg.max_num_batched_tokens, self.max_model_len, cfg.max_num_seqs,
                cfg.gpu_memory_utilization)
        else:
            raise InputError("engine.kv_cache_memory_bytes: required on cpu (or give "
                             "engine.num_gpu_blocks)")
        blocks = blocks_for_budget(budget, mcfg, cfg.block_size, dtype)
        if blocks < 2:
            raise InputError(f"engine: KV cache memory of {budget} bytes holds {blocks} blocks; "
                             f"raise kv_cache_memory_bytes / gpu_memory_utilization")
        return blocks

    # -- clock ------------------------------------------------------------------------
    def now_ns(self) -> int:
        """Nanoseconds since the run's start (engine creation or last ``reset_clock``)."""
        return time.perf_counter_ns() - self._t0

    def reset_clock(self) -> None:
        """Start the run's clock at 0 now.

        Raises:
            RuntimeError: the engine has unfinished requests.
        """
        if self.scheduler.has_unfinished_requests():
            raise RuntimeError("reset_clock needs an idle engine")
        self._t0 = time.perf_counter_ns()

    @property
    def stats(self):
        """Scheduler counters incl. prefix-cache queries and hits
        (:class:`simulator.policy.SchedulerStats`)."""
        return self.scheduler.stats

    def has_unfinished_requests(self) -> bool:
        """Whether a request is queued or running, or finished inside :meth:`generate`
        with its output not yet handed back by :meth:`step`."""
        return bool(self._held) or self.scheduler.has_unfinished_requests()

    # -- requests ---------------------------------------------------------------------
    def _check_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (bytes, bytearray, Mapping, set, frozenset)):
            raise InputError(f"prompt: expected text or a list of token ids (got "
                             f"{type(prompt).__name__})")
        else:
            try:
                items = list(prompt)
            except TypeError:
                raise InputError("prompt: expected text or a list of token ids") from None
            ids = []
            for i, t in enumerate(items):
                try:
                    ids.append(as_integer(t))
                except ValueError:
                    raise InputError(f"prompt[{i}]: token ids are integers (got "
                                     f"{t!r})") from None
            vocab = self.model_config.vocab_size
            bad = [i for i, t in enumerate(ids) if not 0 <= t < vocab]
            if bad:
                raise InputError(f"prompt[{bad[0]}]: token id {ids[bad[0]]} outside the "
                                 f"vocab [0, {vocab})")
        if not ids:
            raise InputError("prompt: empty")
        return ids

    def add_request(self, prompt, params: SamplingParams | dict | None = None,
                    request_id=None, arrival_ns: int | None = None):
        """Queue a request; returns its id.

        Args:
            prompt: text (tokenised) or token ids. params: sampling (default
                ``SamplingParams()``). request_id: default a running counter.
            arrival_ns: arrival on the run's clock (default now).

        Raises:
            InputError: bad sampling values (``sampling.<field>``), a bad prompt, a
                prompt of ``max_model_len`` tokens or more (``prompt``), an unhashable or
                used ``request_id``, an ``arrival_ns`` that is no integer >= 0. Other
                requests are unaffected.
        """
        params = sampling_params(params)
        ids = self._check_prompt(prompt)
        try:
            hash(request_id)
        except TypeError:
            raise InputError(f"request_id: a hashable id such as a str or an int, got "
                             f"{type(request_id).__name__}") from None
        if arrival_ns is not None:
            try:
                if as_integer(arrival_ns) < 0:
                    raise ValueError
            except ValueError:
                raise InputError(f"arrival_ns: an integer >= 0 (ns on the run's clock), got "
                                 f"{arrival_ns!r}") from None
            arrival_ns = as_integer(arrival_ns)
        for t in params.stop_token_ids:
            if not 0 <= t < self.model_config.vocab_size:
                raise InputError(f"sampling.stop_token_ids: {t} outside the vocab "
                                 f"[0, {self.model_config.vocab_size})")
        rid = self._new_id() if request_id is None else request_id
        # None: up to max_model_len, as vLLM's input processor (a prompt of max_model_len
        # tokens or more is rejected whatever its max_tokens)
        max_tokens = params.max_tokens if params.max_tokens is not None else max(
            1, self.max_model_len - len(ids))
        req = Request(request_id=rid, prompt_token_ids=ids, max_tokens=max_tokens,
                      arrival_ns=self.now_ns() if arrival_ns is None else arrival_ns,
                      stop_token_ids=tuple(params.stop_token_ids) + (
                          () if params.ignore_eos else self._extra_stops),
                      eos_token_id=None if params.ignore_eos else self.eos_token_id,
                      sampling=params)
        self._enqueue(req, params)
        return rid

    def add_spec_request(self, req: Request, params: SamplingParams) -> None:
        """Queue a ready :class:`simulator.policy.Request` (token ids set).

        Raises:
            InputError: a prompt of ``max_model_len`` tokens or more (the record says
                ``rejected``).
        """
        self._enqueue(req, params)

    def _enqueue(self, req: Request, params: SamplingParams) -> None:
        if req.request_id in self.records:
            raise InputError(f"request_id: {req.request_id!r} already used")
        rec = RequestRecord(request_id=req.request_id, arrival_ns=req.arrival_ns,
                            prompt_tokens=req.num_prompt_tokens, token_times_ns=[])
        # before the scheduler holds the request: a request it holds must be live
        gen = request_generator(params, self.config.seed, req.request_id)
        self.records[req.request_id] = rec
        try:
            self.scheduler.add_request(req)
        except RequestRejected:
            rec.finish_reason = "rejected"
            raise InputError(f"prompt: {req.num_prompt_tokens} tokens; max_model_len "
                             f"{self.max_model_len} takes prompts of at most "
                             f"{self.max_model_len - 1} (one position is the first output "
                             f"token's; request {req.request_id!r})") from None
        self._live[req] = _Live(params, gen, rec)

    def _new_id(self):
        while self._next_id in self.records:
            self._next_id += 1
        rid = self._next_id
        self._next_id += 1
        return rid

    def abort_request(self, request_id) -> None:
        """Drop a queued or running request (finish reason ``abort``)."""
        for req, live in list(self._live.items()):
            if req.request_id == request_id:
                self.scheduler.abort_request(req)
                live.record.finish_reason = "abort"
                live.record.finish_ns = self.now_ns()
                del self._live[req]

    # -- one step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute and update one step; returns the requests finished in it,
        after those of requests added by :meth:`add_request` that finished inside a
        :meth:`generate` call (which returns only its own)."""
        held, self._held = self._held, []
        return held + self._step()

    def _step(self) -> list[RequestOutput]:
        """One step; a step that raises leaves its requests half-updated, so the engine
        then refuses to go on, as vLLM's engine core dies (the scheduler is not rolled
        back: a request stayed scheduled and was never served again).

        Raises:
            RuntimeError: an earlier step raised.
        """
        if self._failed is not None:
            raise RuntimeError(f"engine: an earlier step failed ({self._failed}); its "
                               f"requests cannot go on: build a new LLMEngine")
        try:
            return self._run_step()
        except BaseException as e:
            self._failed = f"{type(e).__name__}: {e}"
            raise

    def _run_step(self) -> list[RequestOutput]:
        t_start = self.now_ns()
        sched = self.scheduler
        plan = sched.schedule()
        if plan.is_empty:
            sched.update(plan, {})
            return []
        entries = plan.scheduled()
        for e in entries:
            rec = self._live[e.request].record
            if rec.first_scheduled_ns is None:
                rec.first_scheduled_ns = t_start
                rec.cached_tokens = e.num_cached_tokens
        t_exec = self.now_ns()
        sampled = ({e.request: 0 for e in entries if e.samples_token} if self.skip_forward
                   else self._execute(entries))
        if self._cuda:
            torch.cuda.synchronize()
        t_done = self.now_ns()
        summary = ([(e.request.request_id, e.num_new_tokens, e.num_computed_before)
                    for e in plan.prefills], plan.num_decodes, plan.decode_context_tokens,
                   plan.num_sampled, plan.num_scheduled_tokens,
                   [r.request_id for r in plan.preempted])
        finished = sched.update(plan, sampled)
        t_end = self.now_ns()
        records = [self._live[req].record for req in sampled]
        outputs = []
        for req in finished:
            live = self._live.pop(req)
            rec = live.record
            rec.output_tokens = req.num_output_tokens
            rec.preemptions = req.num_preemptions
            rec.finish_reason = req.finish_reason
            rec.capped = req.capped
            outputs.append(RequestOutput(
                req.request_id, req.prompt_token_ids, list(req.output_token_ids),
                self.tokenizer.decode(req.output_token_ids), req.finish_reason, rec))
        # A token counts as produced when step() hands it back (after the scheduler update
        # and detokenisation), as vLLM stamps outputs when its output processor sees them;
        # a replay's next queue check follows at once, so both clocks meet there.
        t_out = self.now_ns()
        for rec in records:
            if rec.first_token_ns is None:
                rec.first_token_ns = t_out
            rec.token_times_ns.append(t_out)
        for out in outputs:
            out.record.finish_ns = t_out
        self.step_records.append(StepRecord(
            plan.step, t_start, t_end - t_start, t_done - t_exec, *summary,
            sched.num_running, sched.num_waiting, sched.kv_cache_usage, plan.reread_tokens))
        return outputs

    def _execute(self, entries) -> dict:
        """Forward + sampling; ``{request: token}`` for the entries that sample."""
        model = self.model
        if self.capture_logits:
            hidden, spans = self.runner.execute(entries, all_tokens=True)
            with torch.inference_mode():
                logits = model.compute_logits(hidden)
            take = []
            for e, (start, n) in zip(entries, spans):
                c0 = e.num_computed_before
                self.captured_logits.append((e.request.request_id, torch.arange(c0, c0 + n),
                                             logits[start:start + n].cpu()))
                if e.samples_token:
                    take.append(start + n - 1)
            logits = logits[take]
        else:
            hidden, _ = self.runner.execute(entries)
            with torch.inference_mode():
                logits = model.compute_logits(hidden)
        samplers = [e for e in entries if e.samples_token]
        lives = [self._live[e.request] for e in samplers]
        tokens = sample(logits, [x.params for x in lives], [x.generator for x in lives])
        return {e.request: t for e, t in zip(samplers, tokens)}

    # -- offline and replay -----------------------------------------------------------
    def generate(self, prompts, params=None) -> list[RequestOutput]:
        """Run ``prompts`` (texts or token-id lists) to completion, in input order.

        ``params``: one :class:`SamplingParams` (or dict) for all, or one per prompt.
        Requests added earlier by :meth:`add_request` are served alongside; those that
        finish meanwhile are handed back by the next :meth:`step`.

        Raises:
            InputError: any invalid prompt or sampling value; then none of ``prompts`` is
                run and requests queued before the call are untouched.
        """
        given = prompts
        if isinstance(prompts, str):
            prompts = [prompts]
        try:
            if isinstance(prompts, (bytes, bytearray, Mapping, set, frozenset)):
                raise TypeError   # iterable, but neither text nor ordered token ids
            prompts = list(prompts)
        except TypeError:
            raise InputError(f"prompts: a text, a list of token ids, or a list of those (got "
                             f"{type(prompts).__name__})") from None
        if (prompts and _is_token_id(prompts[0])) or getattr(given, "ndim", None) == 1:
            prompts = [prompts]   # one prompt of token ids (an empty 1-D array too)
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InputError(f"params: {len(plist)} given for {len(prompts)} prompts")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, plist)):
                try:
                    ids.append(self.add_request(prompt, p))
                except InputError as e:   # which prompt, when there are several
                    raise InputError(f"prompts[{i}]: {e}" if len(prompts) > 1 else str(e)
                                     ) from None
        except InputError:
            for rid in ids:
                self.abort_request(rid)
            raise
        want = set(ids)
        done = {}
        while want - done.keys():
            for out in self._step():
                if out.request_id in want:
                    done[out.request_id] = out
                else:   # added by add_request: the next step() hands it back
                    self._held.append(out)
        return [done[i] for i in ids]

    def replay(self, specs, sampling: SamplingParams | None = None):
        """Serve a workload in real time; see :func:`.replay.replay`."""
        from .replay import replay
        return replay(self, specs, sampling)
