"""vLLM's in-process engine, driven step by step and timed at the engine boundary.

:class:`VllmEngine` builds ``vllm.LLMEngine`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
(``InprocClient``: the EngineCore and, on CPU, the ``UniProcExecutor`` worker live in this
process), ``async_scheduling=False`` (vLLM-CPU forces it off anyway), and wraps two bound
methods of that instance — the scheduler's ``schedule`` (to read each step's
``SchedulerOutput``) and the executor's ``execute_model`` / ``sample_tokens`` (to time the
forward pass). vLLM's own code is not changed.

A step is one ``LLMEngine.step()``: schedule, forward, sampling, scheduler update and the
output processor (detokenising); its wall time is the step duration the simulator prices,
and every token it returns is stamped with the instant it returned.

Needs ``vllm`` (import this module only after :func:`calibration.vllm.require_vllm`).
"""

from __future__ import annotations

import heapq
import os
import time

from simulator.errors import InputError

from .core import (RecordBook, Scheduled, block_tables, engine_knobs, external_id,
                   not_modelled, reread_tokens, summarise)


class VllmEngine:
    """One vLLM engine in this process.

    Args:
        model_dir: Hugging Face model folder vLLM loads (e.g. ``/tmp/vllm-peer-model``).
        dtype, max_model_len, max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
            seed: passed to ``vllm.EngineArgs``; ``block_size`` too unless ``None`` (vLLM's
            platform default: 128 on CPU), and ``watermark`` and
            ``long_prefill_token_threshold`` unless 0 (vLLM's defaults; a vLLM without the
            knob refuses another), ``enable_chunked_prefill`` when off, and
            ``num_gpu_blocks`` (KV blocks incl. the null block) as vLLM's
            ``num_gpu_blocks_override`` when given.

    Attributes:
        knobs: :func:`calibration.vllm.core.engine_knobs` of the built engine (effective
            values, read back from ``vllm_config``).
        block_size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens, max_model_len:
            effective values.
        steps: :class:`calibration.engine.StepRecord` of every recorded step.
        book: :class:`calibration.vllm.core.RecordBook` of the requests added.
    """

    def __init__(self, model_dir: str, *, dtype: str, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, enable_prefix_caching: bool = True,
                 block_size: int | None = None, watermark: float = 0.0,
                 long_prefill_token_threshold: int = 0, enable_chunked_prefill: bool = True,
                 num_gpu_blocks: int | None = None, seed: int = 0):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import EngineArgs, LLMEngine

        kw = dict(model=str(model_dir), dtype=dtype, max_model_len=int(max_model_len),
                  max_num_seqs=int(max_num_seqs),
                  max_num_batched_tokens=int(max_num_batched_tokens),
                  enable_prefix_caching=bool(enable_prefix_caching), seed=int(seed),
                  async_scheduling=False, disable_log_stats=True)
        if block_size is not None:
            kw["block_size"] = int(block_size)
        if watermark:
            kw["watermark"] = float(watermark)
        if long_prefill_token_threshold:
            kw["long_prefill_token_threshold"] = int(long_prefill_token_threshold)
        if not enable_chunked_prefill:
            kw["enable_chunked_prefill"] = False
        if num_gpu_blocks is not None:
            kw["num_gpu_blocks_override"] = int(num_gpu_blocks)
        self.llm = LLMEngine.from_engine_args(EngineArgs(**kw))
        core = getattr(self.llm.engine_core, "engine_core", None)
        if core is None:
            raise RuntimeError("vLLM did not build an in-process EngineCore (is "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 honoured?)")
        self.core = core
        self.scheduler = core.scheduler
        cfg = self.llm.vllm_config
        self.knobs = engine_knobs(cfg)
        self.knobs["scheduler_class"] = type(self.scheduler).__name__
        self.knobs["executor_class"] = type(core.model_executor).__name__
        self.block_size = int(cfg.cache_config.block_size)
        self.num_gpu_blocks = int(cfg.cache_config.num_gpu_blocks)
        self.max_num_seqs = int(cfg.scheduler_config.max_num_seqs)
        self.max_num_batched_tokens = int(cfg.scheduler_config.max_num_batched_tokens)
        self.max_model_len = int(cfg.model_config.max_model_len)
        self.enable_prefix_caching = bool(cfg.cache_config.enable_prefix_caching)
        self.vocab_size = int(cfg.model_config.get_vocab_size())
        if self.knobs.get("async_scheduling") not in (False, "absent"):
            raise RuntimeError(f"vLLM runs with async_scheduling="
                               f"{self.knobs['async_scheduling']}; servesim models the "
                               f"synchronous loop")
        unmodelled = not_modelled(self.knobs, self.max_num_batched_tokens)
        if unmodelled:
            raise RuntimeError(f"vLLM runs with {unmodelled}, which servesim does not model")
        self._hook()
        self._t0 = time.perf_counter_ns()
        self.steps: list = []
        self.book = RecordBook()
        self._ext: dict = {}      # vLLM's id for servesim's id -> servesim's id
        self._preemptions: dict = {}
        self._steady: set = set()  # servesim ids decoding (see core.summarise)
        self.output_ids: dict = {}
        self._ids = 0

    # -- instrumentation ----------------------------------------------------------------
    def _hook(self) -> None:
        sched, ex = self.scheduler, self.core.model_executor
        schedule, execute, sample = sched.schedule, ex.execute_model, ex.sample_tokens
        self._plan = None
        self._exec_ns = 0

        def timed(fn):
            def call(*a, **k):
                t = time.perf_counter_ns()
                try:
                    return fn(*a, **k)
                finally:
                    self._exec_ns += time.perf_counter_ns() - t
            return call

        def hooked_schedule(*a, **k):
            out = schedule(*a, **k)
            # num_computed_tokens is advanced inside schedule(): before = after - n.
            rows = []
            for rid, n in out.num_scheduled_tokens.items():
                req = sched.requests[rid]
                rows.append(Scheduled(self._ext.get(external_id(rid), external_id(rid)),
                                      int(n), int(req.num_computed_tokens) - int(n),
                                      int(req.num_prompt_tokens), int(req.num_tokens)))
            pre = sorted(self._ext.get(external_id(r), external_id(r))
                         for r in (out.preempted_req_ids or ()))
            tables = block_tables(sched.kv_cache_manager, out.num_scheduled_tokens)
            self._plan = (rows, pre, reread_tokens(tables, self.block_size))
            return out

        sched.schedule = hooked_schedule
        ex.execute_model = timed(execute)
        ex.sample_tokens = timed(sample)

    # -- requests -----------------------------------------------------------------------
    def now_ns(self) -> int:
        """ns since the clock was last reset."""
        return time.perf_counter_ns() - self._t0

    def reset(self) -> None:
        """Start a new run: clock to 0, no steps or records, an empty prefix cache.

        Raises:
            RuntimeError: a request is still unfinished (``engine is not idle``).
        """
        if self.has_unfinished():
            raise RuntimeError("engine is not idle")
        self.llm.reset_prefix_cache()
        self.steps = []
        self.book = RecordBook()
        self._ext = {}
        self._preemptions = {}
        self._steady = set()
        self.output_ids = {}
        self._t0 = time.perf_counter_ns()

    def add(self, request_id, token_ids: list[int], max_tokens: int,
            arrival_ns: int | None = None) -> bool:
        """Queue a request (greedy, ``ignore_eos``, ``max_tokens`` capped so that it fits
        ``max_model_len`` as the simulator caps it); returns False when vLLM refuses it
        (its record says ``rejected``)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        try:   # vLLM 0.32 refuses with its own error class; earlier ones raise ValueError
            from vllm.exceptions import VLLMValidationError as Refused
        except ImportError:
            Refused = ValueError

        self._ids += 1
        vid = f"s{self._ids}"
        self._ext[vid] = request_id
        self.book.arrive(request_id, self.now_ns() if arrival_ns is None else arrival_ns,
                         len(token_ids))
        m = max(1, min(int(max_tokens), self.max_model_len - len(token_ids)))
        params = SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA)
        try:
            self.llm.add_request(vid, TokensPrompt(prompt_token_ids=list(token_ids)), params)
        except (ValueError, Refused):   # e.g. a prompt of max_model_len tokens
            self.book.reject(request_id)
            return False
        return True

    def has_unfinished(self) -> bool:
        """True while vLLM holds a request that has not finished (waiting or running)."""
        return self.llm.has_unfinished_requests()

    def step(self) -> list:
        """One engine step; servesim ids of the requests that finished in it. The step is
        recorded when it scheduled any token."""
        from calibration.engine import StepRecord

        self._plan, self._exec_ns = None, 0
        t_start = self.now_ns()
        outs = self.llm.step()
        t_end = self.now_ns()
        finished = []
        if self._plan is not None and self._plan[0]:
            rows, pre, reread = self._plan
            prefills, nd, dctx, n_sampled, total = summarise(rows, self._steady)
            for rid in pre:
                self._preemptions[rid] = self._preemptions.get(rid, 0) + 1
                self._steady.discard(rid)   # it recomputes before it decodes again
            self.book.scheduled([r.request_id for r in rows], t_start)
            sched = self.scheduler
            self.steps.append(StepRecord(
                len(self.steps) + 1, t_start, t_end - t_start, self._exec_ns, prefills, nd,
                dctx, n_sampled, total, pre, len(sched.running), len(sched.waiting),
                float(sched.kv_cache_manager.usage), reread))
        for o in outs:
            rid = self._ext.get(o.request_id, o.request_id)
            c = o.outputs[0]
            self.output_ids.setdefault(rid, []).extend(c.token_ids)
            self.book.output(rid, t_end, len(c.token_ids), cached_tokens=o.num_cached_tokens,
                             finished=o.finished, finish_reason=c.finish_reason,
                             preemptions=self._preemptions.get(rid, 0))
            if o.finished:
                finished.append(rid)
                self._steady.discard(rid)
        return finished

    def run_until_idle(self) -> None:
        """Run :meth:`step` until no request is unfinished; what vLLM's step raises
        propagates."""
        while self.has_unfinished():
            self.step()

    def prefill_step_ns(self, token_ids: list[int]) -> int:
        """Duration (ns) of the step that prefills ``token_ids`` and samples one token, as
        the only request of an idle engine (the step that :func:`calibration.profiler.
        measure_idle` times after a wait)."""
        n = len(self.steps)
        self.add(("prefill-step", n), token_ids, 1)
        self.run_until_idle()
        return self.steps[n].duration_ns

    # -- warm-up and replay ---------------------------------------------------------------
    def warm_up(self, seed: int = 12345) -> None:
        """Unrecorded requests of several sizes: vLLM-CPU's first calls of each shape
        compile / pick kernels (0.5-0.8 s a step on CPU), which would otherwise land in the
        first measured steps. Leaves an empty prefix cache and a reset clock."""
        import numpy as np

        rng = np.random.default_rng(seed)
        tok = lambda n: rng.integers(100, self.vocab_size, n).tolist()  # noqa: E731
        for n in (16, 100, 300, 512, min(1536, self.max_model_len - 8)):
            self.add(("warmup", n), tok(n), 1)
            self.run_until_idle()
        for b in (1, 3, 8, 17, 32, 64):
            for i in range(min(b, self.max_num_seqs)):
                self.add(("warmup", b, i), tok(20), 6)
            self.run_until_idle()
        self.reset()

    def replay(self, specs):
        """Serve ``specs`` (:class:`simulator.policy.RequestSpec`) as they arrive, in real
        time on a reset engine; returns a :class:`calibration.timing_replay.EngineRun`.

        Token ids come from the segments as in servesim's own replay
        (:func:`calibration.engine.replay.materialise`), so shared prefixes hit vLLM's
        prefix cache where the simulator's hit. Arrival = the spec's arrival on the run's
        clock (the request is added at the first queue check after it); follow-up turns
        arrive ``think_time_ns`` after the turn they follow finished.

        Raises:
            InputError: duplicate ids, or ``after`` naming an unknown request.
        """
        from calibration.engine.replay import materialise
        from calibration.timing_replay import EngineRun

        ids = [s.request_id for s in specs]
        if len(set(ids)) != len(ids):
            raise InputError("specs: duplicate request_id")
        order = {rid: i for i, rid in enumerate(ids)}
        followers: dict = {}
        for i, s in enumerate(specs):
            if s.after is not None:
                if s.after not in order:
                    raise InputError(f"specs[{i}].after: unknown request {s.after!r}")
                followers.setdefault(s.after, []).append(s)
        pending = [(s.arrival_ns, order[s.request_id], s) for s in specs if s.after is None]
        heapq.heapify(pending)
        answers: dict = {}
        self.reset()
        checks, after = [], []
        state = {"last": 0, "after": False}

        def clock() -> int:
            t = self.now_ns()
            state["last"] = t
            if state["after"]:
                after.append(t)
                state["after"] = False
            return t

        t_wall = time.perf_counter()
        while True:
            now = clock()
            while pending and pending[0][0] <= now:
                at, _, spec = heapq.heappop(pending)
                ok = self.add(spec.request_id, materialise(spec, answers, self.vocab_size),
                              spec.max_tokens, arrival_ns=at)
                if not ok:
                    for f in followers.get(spec.request_id, ()):
                        heapq.heappush(pending, (at + f.think_time_ns, order[f.request_id], f))
            if self.has_unfinished():
                n = len(self.steps)
                done = self.step()
                if len(self.steps) > n:
                    checks.append(state["last"])
                    state["after"] = True
                for rid in done:
                    rec = self.book.records[rid]
                    answers[specs[order[rid]].answer_content_id] = self.output_ids.get(rid, [])
                    for f in followers.get(rid, ()):
                        heapq.heappush(pending, (rec.finish_ns + f.think_time_ns,
                                                 order[f.request_id], f))
            elif pending:
                time.sleep(max(0, pending[0][0] - self.now_ns()) / 1e9)
            else:
                break
        wall = time.perf_counter() - t_wall
        tail = clock()
        after += [tail] * (len(checks) - len(after))
        recs = self.book.ordered(ids)
        served = [r for r in recs if r.finish_reason != "rejected"]
        return EngineRun(recs, self.steps, checks, after,
                         sum(r.prompt_tokens for r in served), sum(r.cached_tokens for r in served),
                         0, 0, self.num_gpu_blocks, self.block_size, wall)


__all__ = ["VllmEngine"]
