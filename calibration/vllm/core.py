"""The vLLM-free parts of the vLLM backend: what to measure, how a vLLM step becomes a
servesim step record, how its outputs become :class:`simulator.policy.RequestRecord`s, and
which scheduler knobs are logged.

Everything here works on plain values, so it is tested without vLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from simulator.policy import RequestRecord

# == measurement grid =========================================================================


@dataclass(frozen=True)
class Run:
    """One controlled batch submitted at once to an idle engine.

    Attributes:
        key: stable name, e.g. ``prefill b=4 L=256``; prefixes every cell key of its steps.
        lengths: prompt length of each request (tokens, random token ids, fresh per pass).
        max_tokens: output tokens per request (``ignore_eos``); 1 = prefill only.
        prefix: tokens of a shared prefix every prompt starts with (0 = none). A first
            request of the prefix alone fills the prefix cache before the batch is added,
            so the batch's chunks run after a cache hit of the prefix's full blocks.
        groups: how many different prefixes of ``prefix`` tokens: request ``i`` starts
            with prefix ``i mod groups`` (each cached alone first), as the servesim grid's
            shared-prefix decode cells (:class:`calibration.profiler.Grid`).
    """

    key: str
    lengths: tuple
    max_tokens: int
    prefix: int = 0
    groups: int = 1

    @property
    def kind(self) -> str:
        """The first word of :attr:`key` (``prefill`` for ``prefill b=4 L=256``)."""
        return self.key.split(" ", 1)[0]


@dataclass(frozen=True)
class VllmGrid:
    """What ``calibrate --backend vllm`` measures.

    * prefill-only requests (``max_tokens=1``): every ``prefill_lengths`` × ``batches``;
    * after a cached shared prefix: ``prefix_chunk`` new tokens after each
      ``prefix_contexts`` prefix, ``batches`` requests;
    * decode throughput: ``decode_batches`` × mean contexts ``decode_contexts`` (lengths
      spread as :func:`calibration.profiler.decode_lengths`), ``decode_tokens`` output
      tokens each with ``ignore_eos``; their chunked-prefill and mixed steps are measured
      too. Pure decode steps are grouped ``decode_window`` consecutive steps to a cell;
    * decodes sharing prefixes: ``shared_decodes`` ``(B, L, s, g)`` as the decode runs, the
      requests after ``g`` cached ``s``-token prefixes taken in turn (whole blocks of
      vLLM's block size: each step re-reads ``(B − g) · s`` context tokens, which fits the
      re-read rate, :data:`simulator.cost_model.OPTIONAL_COEFFICIENTS`).

    ``repeats`` passes over all runs, interleaved, with fresh prompt tokens per pass.
    """

    prefill_lengths: tuple = (16, 64, 256, 768, 1536)
    batches: tuple = (1, 4)
    prefix_contexts: tuple = (256, 1024)
    prefix_chunk: int = 64
    decode_batches: tuple = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple = (64, 512)
    decode_tokens: int = 32
    decode_window: int = 8
    shared_decodes: tuple = ()
    repeats: int = 3

    def runs(self, max_model_len: int, kv_tokens: int, max_num_seqs: int) -> list[Run]:
        """The feasible runs: a prompt plus its outputs fits ``max_model_len``, a batch fits
        the KV cache (``kv_tokens``) and ``max_num_seqs``."""
        from calibration.profiler import decode_lengths, shares_prefixes

        out = []

        def add(run: Run) -> None:
            need = sum(n + run.max_tokens for n in run.lengths)
            if (max(run.lengths) + run.max_tokens <= max_model_len and need <= kv_tokens
                    and len(run.lengths) <= max_num_seqs):
                out.append(run)

        for L in self.prefill_lengths:
            for b in self.batches:
                add(Run(f"prefill b={b} L={L}", (L,) * b, 1))
        for c in self.prefix_contexts:
            for b in self.batches:
                add(Run(f"prefix b={b} c={c} n={self.prefix_chunk}",
                        (c + self.prefix_chunk,) * b, 1, prefix=c))
        for L in self.decode_contexts:
            for B in self.decode_batches:
                add(Run(f"decode B={B} L={L}", tuple(decode_lengths(B, L)),
                        self.decode_tokens))
        for B, L, s, g in self.shared_decodes:
            if shares_prefixes(B, L, s, g):   # (ends in " L=<int>", as label_steps needs)
                add(Run(f"decode B={B} s={s} g={g} L={L}", tuple(decode_lengths(B, L, s)),
                        self.decode_tokens, prefix=s, groups=g))
        return out


def default_vllm_grid(quick: bool) -> VllmGrid:
    """The grid for a ~50M-parameter model on a 2-core CPU (about 3 passes × 25 s; ``quick``
    thins it to about 2 × 12 s)."""
    from calibration.profiler import CPU_SHARED_DECODES as shared   # as servesim's grid

    if quick:
        return VllmGrid(prefill_lengths=(16, 128, 512, 1536), batches=(1, 4),
                        prefix_contexts=(512,), decode_batches=(1, 4, 16, 64),
                        decode_contexts=(64, 512), decode_tokens=24,
                        shared_decodes=shared[:2], repeats=2)
    return VllmGrid(shared_decodes=shared)


def schedule_passes(runs: list[Run], repeats: int) -> list[tuple[int, Run]]:
    """``(pass, run)`` in measuring order: pass-major, so a slow spell of the machine
    spreads over every cell instead of biasing one."""
    return [(p, r) for p in range(repeats) for r in runs]


def block_tables(kv_cache_manager, request_ids) -> list[list[int]]:
    """Each request's KV block ids, read from vLLM's ``KVCacheManager.get_block_ids`` (every
    KV cache group; block 0, vLLM's null block, a placeholder no request reads, left out)."""
    return [[b for group in kv_cache_manager.get_block_ids(rid) for b in group if b]
            for rid in request_ids]


def reread_tokens(block_tables, block_size: int) -> int:
    """Context tokens a step reads again (:attr:`simulator.policy.StepPlan.reread_tokens`)
    from the block tables of the requests it schedules: for each block in ``k`` >= 2 of
    them, ``(k − 1) · block_size`` (only full, prefix-cached blocks are shared).

    Args:
        block_tables: one iterable of KV block ids per scheduled request.
        block_size: tokens per block.
    """
    from collections import Counter

    seen = Counter(b for table in block_tables for b in table)
    return block_size * sum(k - 1 for k in seen.values())


def step_kind(prefills, num_decodes: int) -> str:
    """``prefill`` (no decodes), ``decode`` (no prefill chunks) or ``mixed``."""
    if not prefills:
        return "decode"
    return "prefill" if num_decodes == 0 else "mixed"


def label_steps(run_key: str, steps, window: int) -> list[tuple[str, str]]:
    """``(cell key, kind)`` for each step of one run, in order.

    Steps with a prefill chunk are keyed by their position in the run (``s<j>``; never
    ``#``, which the CSV reader takes for a comment): the
    schedule of a batch submitted at once to an idle engine is deterministic, so pass
    after pass the same position has the same shape. Pure decode steps are keyed by
    window: the ``i``-th pure decode step of the run goes to ``w{i // window}``.
    """
    out, i = [], 0
    head, _, L = run_key.rpartition(" L=")
    for j, s in enumerate(steps):
        kind = step_kind(s.prefills, s.num_decodes)
        if kind == "decode":  # ends in " L=<int>", as the calibration report parses it
            out.append((f"{head} w{i // window} L={L}" if head else f"{run_key} w{i // window}",
                        kind))
            i += 1
        else:
            out.append((f"{run_key} s{j}", kind))
    return out


def measurement_rows(run: Run, pass_no: int, steps, window: int) -> list[dict]:
    """Measurements-CSV rows (:data:`calibration.profiler.CSV_COLUMNS`) of one run's
    steps."""
    from calibration.profiler import record_features

    rows = []
    for (cell, kind), s in zip(label_steps(run.key, steps, window), steps):
        rows.append({"cell": cell, "kind": kind, "pass": pass_no,
                     "duration_ns": s.duration_ns, "execute_ns": s.execute_ns,
                     **record_features(s)})
    return rows


# == one vLLM step as a servesim step ============================================================

@dataclass(frozen=True)
class Scheduled:
    """One request in a vLLM ``SchedulerOutput``, as the scheduler saw it.

    Attributes:
        request_id: servesim's id. num_new_tokens: tokens scheduled this step.
        num_computed_before: tokens with KV before this step (prefix hits included).
        num_prompt_tokens: prompt length. num_tokens: prompt + output tokens so far.
    """

    request_id: object
    num_new_tokens: int
    num_computed_before: int
    num_prompt_tokens: int
    num_tokens: int


def summarise(scheduled: list[Scheduled], steady: set) -> tuple:
    """``(prefills, num_decodes, decode_context_tokens, num_sampled, num_scheduled_tokens)``
    of one step, with servesim's meanings (:class:`simulator.policy.StepPlan`).

    A *decode* is a request in ``steady`` (its last scheduled chunk reached its end and
    sampled, and it was not preempted since) that gets one token; its context counts the
    new token (``c + 1``). Everything else is a prefill chunk ``(id, n, c)``, in vLLM's
    scheduling order (running requests, then new ones), among them a resumed request's
    recomputation even when one token is left of it; a chunk samples a token when it
    reaches the request's last token (``c + n = num_tokens``). ``steady`` is updated with
    this step's chunks; the caller removes the requests preempted in the step.
    """
    prefills, nd, dctx, sampled, total = [], 0, 0, 0, 0
    for s in scheduled:
        total += s.num_new_tokens
        if s.num_new_tokens == 1 and s.request_id in steady:
            nd += 1
            dctx += s.num_computed_before + 1
            sampled += 1
            continue
        prefills.append((s.request_id, s.num_new_tokens, s.num_computed_before))
        if s.num_computed_before + s.num_new_tokens >= s.num_tokens:
            sampled += 1
            steady.add(s.request_id)
        else:
            steady.discard(s.request_id)
    return prefills, nd, dctx, sampled, total


# == request records ============================================================================

class RecordBook:
    """Builds a :class:`RequestRecord` per request from engine-boundary events (ns on the
    run's clock): arrival = ``add_request`` called, first scheduled = start of the step
    whose schedule first included it, each token = return of the step that produced it.
    """

    def __init__(self):
        self.records: dict = {}

    def arrive(self, request_id, arrival_ns: int, prompt_tokens: int) -> RequestRecord:
        """Start the record of ``request_id``, arrived at ``arrival_ns`` (ns) with a prompt
        of ``prompt_tokens`` tokens, and return it; an id seen before gets a new record."""
        rec = RequestRecord(request_id=request_id, arrival_ns=int(arrival_ns),
                            prompt_tokens=int(prompt_tokens), token_times_ns=[])
        self.records[request_id] = rec
        return rec

    def reject(self, request_id) -> None:
        """vLLM refused the request (e.g. a prompt of ``max_model_len`` tokens or more)."""
        self.records[request_id].finish_reason = "rejected"

    def scheduled(self, request_ids, start_ns: int) -> None:
        """The step starting at ``start_ns`` (ns) scheduled ``request_ids``: sets the first
        scheduled time of those not scheduled before; unknown ids are skipped."""
        for rid in request_ids:
            rec = self.records.get(rid)
            if rec is not None and rec.first_scheduled_ns is None:
                rec.first_scheduled_ns = int(start_ns)

    def output(self, request_id, t_ns: int, new_tokens: int, *, cached_tokens: int | None = None,
               finished: bool = False, finish_reason: str | None = None,
               preemptions: int = 0) -> None:
        """``new_tokens`` tokens of ``request_id`` returned at ``t_ns`` (a DELTA output)."""
        rec = self.records[request_id]
        if new_tokens:
            if rec.first_token_ns is None:
                rec.first_token_ns = int(t_ns)
            rec.token_times_ns.extend([int(t_ns)] * int(new_tokens))
            rec.output_tokens += int(new_tokens)
        if cached_tokens is not None and rec.first_token_ns == int(t_ns):
            rec.cached_tokens = int(cached_tokens)
        if finished:
            rec.finish_ns = int(t_ns)
            rec.finish_reason = finish_reason or "length"
            rec.preemptions = int(preemptions)

    def ordered(self, request_ids) -> list[RequestRecord]:
        """The records of ``request_ids``, in that order.

        Raises:
            KeyError: an id that never arrived.
        """
        return [self.records[r] for r in request_ids]


def external_id(internal: str) -> str:
    """vLLM appends ``-<random suffix>`` to the id given to ``add_request``."""
    return internal.rsplit("-", 1)[0]


# == knobs ======================================================================================

#: Every scheduler / KV knob logged, by its path in ``VllmConfig``.
KNOB_PATHS = {
    "block_size": "cache_config.block_size",
    "num_gpu_blocks": "cache_config.num_gpu_blocks",
    "kv_cache_size_tokens": "cache_config.kv_cache_size_tokens",
    "enable_prefix_caching": "cache_config.enable_prefix_caching",
    "prefix_caching_hash_algo": "cache_config.prefix_caching_hash_algo",
    "cache_dtype": "cache_config.cache_dtype",
    "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
    "max_num_scheduled_tokens": "scheduler_config.max_num_scheduled_tokens",
    "max_num_seqs": "scheduler_config.max_num_seqs",
    "max_num_active_seqs": "scheduler_config.max_num_active_seqs",
    "max_model_len": "model_config.max_model_len",
    "enable_chunked_prefill": "scheduler_config.enable_chunked_prefill",
    "long_prefill_token_threshold": "scheduler_config.long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive":
        "scheduler_config.long_prefill_token_threshold_adaptive",
    "max_num_partial_prefills": "scheduler_config.max_num_partial_prefills",
    "policy": "scheduler_config.policy",
    "scheduler_reserve_full_isl": "scheduler_config.scheduler_reserve_full_isl",
    "watermark": "scheduler_config.watermark",
    "prefill_schedule_interval": "scheduler_config.prefill_schedule_interval",
    "stream_interval": "scheduler_config.stream_interval",
    "async_scheduling": "scheduler_config.async_scheduling",
    "scheduler_cls": "scheduler_config.scheduler_cls",
    "dtype": "model_config.dtype",
    "seed": "model_config.seed",
    "enforce_eager": "model_config.enforce_eager",
    "compilation_mode": "compilation_config.mode",
    "tensor_parallel_size": "parallel_config.tensor_parallel_size",
    "distributed_executor_backend": "parallel_config.distributed_executor_backend",
}
#: Environment variables that change vLLM-CPU's behaviour, logged with the knobs.
KNOB_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
            "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")


def _plain(v):
    import enum
    if isinstance(v, enum.Enum):  # before int: IntEnum modes
        return v.name
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def engine_knobs(vllm_config, environ=None) -> dict:
    """Effective knobs of an engine: every :data:`KNOB_PATHS` entry read from
    ``vllm_config`` (``"absent"`` where this vLLM has no such field), then ``env.NAME`` for
    each :data:`KNOB_ENV` variable (``None`` when unset). Values are JSON scalars."""
    env = os.environ if environ is None else environ
    out = {}
    for name, path in KNOB_PATHS.items():
        v = vllm_config
        for part in path.split("."):
            v = getattr(v, part, _ABSENT)
            if v is _ABSENT:
                break
        out[name] = "absent" if v is _ABSENT else _plain(v)
    for name in KNOB_ENV:
        out[f"env.{name}"] = env.get(name)
    return out


_ABSENT = object()


def not_modelled(knobs: dict, max_num_batched_tokens: int) -> str:
    """The scheduler knobs of a vLLM engine (:func:`engine_knobs`) that servesim's policy
    does not model, as ``name=value`` text (empty when none): the adaptive long-prefill
    threshold, and a step budget (``max_num_scheduled_tokens``) other than
    ``max_num_batched_tokens``."""
    out = []
    if knobs.get("long_prefill_token_threshold_adaptive") is True:
        out.append("long_prefill_token_threshold_adaptive=True")
    m = knobs.get("max_num_scheduled_tokens")
    if m not in (None, "absent", max_num_batched_tokens):
        out.append(f"max_num_scheduled_tokens={m} (max_num_batched_tokens "
                   f"{max_num_batched_tokens})")
    return ", ".join(out)


# == foreign CPU load ===========================================================================

def foreign_cpu_pct(busy_jiffies: int, own_cpu_s: float, wall_s: float,
                    hz: int = 100) -> float:
    """CPU used by *other* processes during a run, in % of one core: machine busy time
    (``busy_jiffies`` / ``hz`` seconds) minus this process's CPU seconds, over the wall
    time. Clipped at 0 (jiffy rounding)."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, 100.0 * (busy_jiffies / hz - own_cpu_s) / wall_s)


class LoadMeter:
    """Measures :func:`foreign_cpu_pct` over a ``with`` block (``.pct`` afterwards; 0.0
    without ``/proc/stat``)."""

    def __enter__(self):
        import time
        self._t = time.perf_counter()
        self._busy = _busy_jiffies()
        self._own = _own_cpu_s()
        return self

    def __exit__(self, *exc):
        import time
        wall = time.perf_counter() - self._t
        busy = _busy_jiffies()
        self.pct = (foreign_cpu_pct(busy - self._busy, _own_cpu_s() - self._own, wall,
                                    os.sysconf("SC_CLK_TCK"))
                    if busy is not None and self._busy is not None else 0.0)
        return False


def _busy_jiffies() -> int | None:
    from calibration.profiler import cpu_times   # the one /proc/stat reader
    t = cpu_times()
    return None if t is None else t[0] - t[1]


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


__all__ = ["KNOB_ENV", "KNOB_PATHS", "LoadMeter", "RecordBook", "Run", "Scheduled",
           "VllmGrid", "default_vllm_grid", "engine_knobs", "external_id", "foreign_cpu_pct",
           "label_steps", "measurement_rows", "not_modelled", "schedule_passes",
           "step_kind", "summarise"]
