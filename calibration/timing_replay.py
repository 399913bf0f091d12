"""Timing replay: serve a request list on the real engine in real time, then simulate the
identical list with every simulated step lasting as the engine's step did, and check that
the two match exactly (the simulator differs from the engine only in where a
step's duration comes from).

Timing boundaries are the same on both sides: a request's arrival is when it reaches the
engine's queue (its scheduled arrival on the replay clock); a step sees every request that
arrived before the engine looked at its queue, which is where a simulated step starts
(:func:`run_engine` records that instant for every step); its batch is scheduled where the
engine's step began, after its intake (:meth:`StepReplayCost.intake_ns`). With the same
per-step batches, prefix hits and preemptions, every request timestamp then agrees within
1 ms (:func:`compare_timing`). :class:`ScaledCost` and :func:`simulate_specs` serve the
predicted side of :mod:`calibration.validate`.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from simulator.metrics import MetricsCollector, RunResult
from simulator.policy.request import NS_PER_MS


# == the engine side ========================================================================

class _CheckClock:
    """Engine proxy that remembers, for every step, when the replay loop last read the
    clock before it (the instant the loop looked at arrivals, where a simulated step
    starts) and first read it after it (where the loop looked again: the next step's
    check when the engine went straight on, else the moment it found nothing to do)."""

    def __init__(self, engine):
        self._engine = engine
        self._last = 0
        self._after = False
        self.checks: list[int] = []
        self.after_checks: list[int] = []

    def now_ns(self) -> int:
        self._last = self._engine.now_ns()
        if self._after:
            self.after_checks.append(self._last)
            self._after = False
        return self._last

    def step(self):
        n = len(self._engine.step_records)
        out = self._engine.step()
        if len(self._engine.step_records) > n:  # an empty plan records no step
            self.checks.append(self._last)
            self._after = True
        return out

    def __getattr__(self, name):
        return getattr(self._engine, name)


@dataclass
class EngineRun:
    """One real-time replay on the engine (ns on the replay clock).

    Attributes:
        records: :class:`simulator.policy.RequestRecord` per spec, in spec order.
        steps: :class:`calibration.engine.StepRecord` per step.
        checks_ns: per step, when the loop read the queue before it (<= ``start_ns``).
        after_checks_ns: per step, when the loop next read the queue (equal to the next
            step's check unless the engine went idle).
        prefix_queries, prefix_hits, preempted_queries, preempted_hits: scheduler
            counters of this replay alone (tokens).
        num_gpu_blocks, block_size: the engine's KV cache.
        wall_s: wall time of the replay.
    """

    records: list
    steps: list
    checks_ns: list
    after_checks_ns: list
    prefix_queries: int
    prefix_hits: int
    preempted_queries: int
    preempted_hits: int
    num_gpu_blocks: int
    block_size: int
    wall_s: float

    def front_end_gaps_ns(self) -> np.ndarray:
        """Per step but the last, ns from the end of a step to the next queue check when
        the engine stayed busy (arrivals tokenised, finished requests detokenised)."""
        gaps = []
        for a, b, c in zip(self.steps, self.steps[1:], self.checks_ns[1:]):
            if a.num_running + a.num_waiting > 0:
                gaps.append(c - (a.start_ns + a.duration_ns))
        return np.asarray(gaps, dtype=np.int64)


def engine_config(scenario, num_gpu_blocks: int, seed: int = 0) -> dict:
    """The real engine's configuration for ``scenario`` (same knobs as the simulator).

    Raises:
        InputError: an unlimited KV cache (the engine needs a block count).
    """
    if num_gpu_blocks is None:
        raise scenario.error("engine.num_gpu_blocks", "validation needs a finite KV cache "
                                                      "(set it, or use a profile that records "
                                                      "one)")
    e = scenario.engine
    return {"block_size": e.block_size, "max_num_seqs": scenario.max_num_seqs,
            "max_num_batched_tokens": scenario.max_num_batched_tokens,
            "max_model_len": scenario.max_model_len,
            "enable_prefix_caching": e.enable_prefix_caching,
            "scheduler_reserve_full_isl": e.scheduler_reserve_full_isl,
            "watermark": e.watermark,
            "long_prefill_token_threshold": e.long_prefill_token_threshold,
            "enable_chunked_prefill": e.enable_chunked_prefill,
            "num_gpu_blocks": int(num_gpu_blocks), "dtype": scenario.dtype, "device": "cpu",
            "seed": seed}


def run_engine(model, config: dict, specs, warmup: int = 2) -> EngineRun:
    """Serve ``specs`` in real time on a fresh engine over ``model`` (a
    :class:`calibration.engine.Transformer`, shared across runs so weights are built once).

    A fresh engine per run starts with an empty prefix cache, as the simulator does;
    ``warmup`` short requests (other token ids, never hit by the workload) run first.
    """
    from calibration.engine import LLMEngine, SamplingParams
    from calibration.engine.replay import replay

    eng = LLMEngine(model, config)
    if warmup:
        vocab = eng.model_config.vocab_size
        params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
        for i in range(warmup):  # ids of their own, so no workload id is taken
            eng.add_request([(7 * i + j) % vocab for j in range(32)], params,
                            request_id=("warmup", i))
        while eng.has_unfinished_requests():
            eng.step()
    s0 = dataclasses.replace(eng.stats)
    proxy = _CheckClock(eng)
    t0 = time.perf_counter()
    res = replay(proxy, specs)  # the shipped replay loop, through the clock proxy
    wall = time.perf_counter() - t0
    s1 = eng.stats
    after = proxy.after_checks + [proxy.now_ns()] * (len(proxy.checks) - len(proxy.after_checks))
    return EngineRun(res.records, res.steps, proxy.checks, after,
                     s1.prefix_queries - s0.prefix_queries, s1.prefix_hits - s0.prefix_hits,
                     s1.preempted_queries - s0.preempted_queries,
                     s1.preempted_hits - s0.preempted_hits, eng.num_gpu_blocks,
                     eng.config.block_size, wall)


def engine_result(run: EngineRun, slo: dict | None = None) -> RunResult:
    """The engine's figures, computed by the simulator's own metrics code."""
    m = MetricsCollector(num_replicas=1)
    for rec in run.records:
        m.record_request(rec)
        if rec.token_times_ns:
            m.record_token_times(rec.token_times_ns)
    preempted_at = {}   # request id -> start of the step that preempted it
    for s in run.steps:
        for rid, *_ in s.prefills:   # a preempted request's next chunk: rescheduled
            if rid in preempted_at:
                m.record_rewait(0, preempted_at.pop(rid), s.start_ns)
        preempted_at.update((rid, s.start_ns) for rid in s.preempted)
        m.record_step(0, s.start_ns, s.start_ns + s.duration_ns,
                      s.num_scheduled_tokens - s.num_decodes, s.num_decodes,
                      s.num_decodes + len(s.prefills), s.num_waiting, s.kv_cache_usage,
                      len(s.preempted))
    q = run.prefix_queries
    return m.finalize(slo=slo, extra={
        "prefix_cache_hit_rate": run.prefix_hits / q if q else 0.0,
        "prefix_cache_queried_tokens": q, "prefix_cache_hit_tokens": run.prefix_hits,
        "engine_steps": len(run.steps), "num_gpu_blocks": run.num_gpu_blocks})


# == the simulator side =====================================================================

@dataclass
class SimStep:
    """A simulated step as the timing check sees it."""

    prefills: list
    num_decodes: int
    decode_context_tokens: int
    preempted: list
    sampled: list
    start_ns: int
    end_ns: int


def plan_summary(plan):
    """``(prefills [(id, n, computed_before)], num_decodes, decode_context, preempted ids,
    sampled ids)`` of a :class:`simulator.policy.StepPlan`."""
    prefills = [(e.request.request_id, e.num_new_tokens, e.num_computed_before)
                for e in plan.prefills]
    sampled = [e.request.request_id for e in plan.prefills if e.samples_token]
    sampled += [r.request_id for r in plan.decodes]
    return (prefills, plan.num_decodes, plan.decode_context_tokens,
            [r.request_id for r in plan.preempted], sampled)


class StepReplayCost:
    """Timing replay: step ``k`` of the simulation lasts as the engine's step ``k`` did.

    With ``price`` (a cost model), every replayed step is also priced by it
    (:attr:`priced_ns`): the cost model's error on the very steps the engine ran; a step
    after the engine idled is priced with the model's wake-up cost for that idle time
    (``price.wake_ns``), as the simulator prices it.

    Step boundaries are the engine's queue checks: step ``k`` ends where the loop next
    looked at its queue (so the simulator delivers the same arrivals to step ``k + 1``);
    the next step starts there when the engine went straight on, else — the engine
    idle — at the waking arrival (the engine starts a sleep-overshoot later). Within a
    step, the batch is scheduled where the engine's step began (:meth:`intake_ns`: the
    engine took in the arrivals, or woke, first). Every plan is recorded (:attr:`steps`)
    for :func:`compare_timing`.
    """

    def __init__(self, run: EngineRun, price=None):
        self.price, self.priced_ns = price, []
        self.num_gpu_blocks = run.num_gpu_blocks
        self.label = "timing replay: the engine's recorded step durations"
        self.kv_note = f"engine: {run.num_gpu_blocks} blocks of {run.block_size}"
        self.profile = None
        arrivals = sorted(r.arrival_ns for r in run.records if r.finish_reason != "rejected")
        checks, after = run.checks_ns, run.after_checks_ns
        n = len(run.steps)
        start, end = [0] * n, [0] * n
        for k in range(n):
            if k == 0:
                start[k] = min(arrivals[0], checks[0]) if arrivals else checks[0]
            elif after[k - 1] == checks[k]:
                start[k] = checks[k]
            else:
                j = bisect.bisect_right(arrivals, after[k - 1])
                start[k] = min(arrivals[j], checks[k]) if j < len(arrivals) else checks[k]
        for k in range(n):
            end[k] = max(after[k], start[k] + 1)
        # ns the engine sat idle before step k (0: it went straight on), from the replay's
        # start for the first step, as the simulated replica starts idle at 0
        self._idle = [start[0]] + [0 if after[k - 1] == checks[k] else start[k] - end[k - 1]
                                   for k in range(1, n)] if n else []
        self._start, self._end = start, end
        self._begin = [s.start_ns for s in run.steps]
        self.steps: list[SimStep] = []

    def intake_ns(self, plan) -> int:
        """ns from the simulated step's start to where the engine's step began (its intake
        of arrivals; after an idle spell, its wake-up too): the batch's scheduled time."""
        k = len(self.steps)   # the step about to be priced
        return max(0, self._begin[k] - self._start[k]) if k < len(self._start) else 0

    def step_time_ns(self, plan) -> int:
        """Duration in ns of the next simulated step (the k-th call prices step ``k``):
        the engine's step ``k`` from its start to its end as laid out above (at least
        1 ns), or 1 ms for every step past the engine's last (a diverged replay). Records
        ``plan`` in :attr:`steps`; with ``price``, also appends ``price``'s duration for
        ``plan`` (plus its wake-up cost after an idle spell) to :attr:`priced_ns`."""
        k = len(self.steps)
        if self.price is not None:
            t = self.price.step_time_ns(plan)
            wake = getattr(self.price, "wake_ns", None)
            if wake is not None and k < len(self._start) and self._idle[k]:
                t += wake(self._idle[k])
            self.priced_ns.append(t)
        pre, nd, ctx, preempted, sampled = plan_summary(plan)
        if k >= len(self._start):  # diverged: compare_timing reports it; 1 ms steps finish
            t0 = self.steps[-1].end_ns if self.steps else 0
            self.steps.append(SimStep(pre, nd, ctx, preempted, sampled, t0, t0 + NS_PER_MS))
            return NS_PER_MS
        self.steps.append(SimStep(pre, nd, ctx, preempted, sampled, self._start[k],
                                  self._end[k]))
        return self._end[k] - self._start[k]


class ScaledCost:
    """A cost model with every step scaled by ``factor`` (the MAPE band at high load),
    plus an optional measured front-end gap per step."""

    def __init__(self, base, factor: float = 1.0, front_end_ns: int = 0):
        self.base = base
        self.factor = factor
        self.front_end_ns = int(front_end_ns)
        self.num_gpu_blocks = base.num_gpu_blocks
        self.kv_note = base.kv_note
        self.profile = base.profile
        self.label = base.label + (f" × {factor:g}" if factor != 1 else "") + (
            f" + front end {front_end_ns / 1e3:.0f} us/step" if front_end_ns else "")

    def step_time_ns(self, plan) -> int:
        """The base model's duration of ``plan`` in ns × ``factor``, rounded, plus
        ``front_end_ns``; at least 1 ns."""
        t = self.base.step_time_ns(plan)
        return max(1, int(t * self.factor + 0.5) + self.front_end_ns)

    def wake_ns(self, idle_ns: int) -> int:
        """The base's wake-up cost after ``idle_ns`` idle, scaled as its steps are."""
        wake = getattr(self.base, "wake_ns", None)
        return int(wake(idle_ns) * self.factor + 0.5) if wake is not None else 0


def simulate_specs(scenario, specs, cost_model) -> RunResult:
    """Simulate exactly ``specs`` (one replica) with ``cost_model``."""
    from simulator.run import simulate
    sc = scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"warmup_requests": 0})})
    return simulate(sc, specs=specs, cost_models=[cost_model])


def simulate_timing(scenario, specs, run: EngineRun, price=None):
    """Timing replay of ``run``; returns ``(RunResult, StepReplayCost)`` (``price``: see
    :class:`StepReplayCost`)."""
    cost = StepReplayCost(run, price)
    sc = scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"warmup_requests": 0, "exact_steps": True})})
    from simulator.run import simulate
    return simulate(sc, specs=specs, cost_models=[cost]), cost


def compare_timing(run: EngineRun, result: RunResult, cost: StepReplayCost) -> dict:
    """The exact check of a timing replay.

    Returns:
        ``steps_engine``, ``steps_sim``, ``step_mismatches`` (steps whose prefill chunks,
        decode count, decode context, sampled count or preemptions differ),
        ``first_mismatch`` (step
        index or None), ``prefix_hits_equal`` (per request), ``preemptions_equal``
        (per request), ``max_abs_diff_ms`` per timestamp kind (arrival, first_scheduled,
        first_token, finish: the simulator's request table against the engine's records,
        an event on one side only counting as ``inf``; token: every output token, where the
        simulator's steps end by the replayed durations; itl: the simulator's pooled
        inter-token gaps, its own clock, against the engine's, sorted), ``handback_max_ms`` (the
        engine's longest time from a step's end to its next queue check, tokens being
        handed back: the most a token or finish time can differ by construction, since the
        simulator's step ends at that check; a disturbed run shows here; first-scheduled
        times take the engine's intake, :meth:`StepReplayCost.intake_ns`, and match),
        ``idle_wake_max_ms`` (the longest an idle engine took to notice an arrival),
        ``late_wakes`` (idle wake-ups after which two or more arrivals were waiting: the
        engine batches them, the simulator, starting at the first, cannot),
        ``tokens_not_before_engine``, ``ok`` (all equal and every timestamp within
        1 ms), and ``step_cost_ratio``: with a priced replay (``cost.price``) whose steps
        all match, Σ priced / Σ measured step durations (``duration_ns``, the engine's
        own time outside steps excluded), the cost model's time-weighted error on exactly
        the steps served (< 1: priced too fast); else None. ``step_cost_by_kind``: the
        same sums split by step kind, ``{kind: [Σ priced ns, Σ measured ns, steps]}`` for
        ``prefill`` (prefill chunks only), ``mixed`` and ``decode`` (decodes only), kinds
        without steps left out; None when ``step_cost_ratio`` is.
    """
    mism, first = 0, None
    for k, (e, s) in enumerate(zip(run.steps, cost.steps)):
        same = ([tuple(p) for p in e.prefills] == [tuple(p) for p in s.prefills]
                and e.num_decodes == s.num_decodes
                and e.decode_context_tokens == s.decode_context_tokens
                and e.num_sampled == len(s.sampled)
                and list(e.preempted) == list(s.preempted))
        if not same:
            mism += 1
            first = k if first is None else first
    mism += abs(len(run.steps) - len(cost.steps))
    req = result.requests.set_index("request_id")
    sim_tokens: dict = {}
    for s in cost.steps:
        for rid in s.sampled:
            sim_tokens.setdefault(rid, []).append(s.end_ns)
    diffs = {k: 0.0 for k in ("arrival", "first_scheduled", "first_token", "finish", "token")}
    hits_eq = pre_eq = structural = True
    for rec in run.records:
        if rec.request_id not in req.index:
            hits_eq = pre_eq = False
            continue
        row = req.loc[rec.request_id]
        hits_eq &= int(row["cached_tokens"]) == rec.cached_tokens
        pre_eq &= int(row["preemptions"]) == rec.preemptions
        for kind, val in (("arrival", rec.arrival_ns), ("first_scheduled", rec.first_scheduled_ns),
                          ("first_token", rec.first_token_ns), ("finish", rec.finish_ns)):
            sim = float(row[f"{kind}_s"])
            if val is None and math.isnan(sim):
                continue
            # an event one side has and the other not is no match (max(0, nan) is 0)
            d = (math.inf if val is None or math.isnan(sim)
                 else abs(sim * 1e3 - val / NS_PER_MS))
            diffs[kind] = max(diffs[kind], d)
        et, st = rec.token_times_ns or [], sim_tokens.get(rec.request_id, [])
        if len(et) == len(st) and et:
            # The simulator's token lands where the engine next looked at its queue: the
            # engine's own time outside the step (update, detokenise, arrivals) apart.
            d = np.asarray(st, dtype=np.int64) - np.asarray(et, dtype=np.int64)
            structural = structural and bool(np.all(d >= 0))
        if len(et) != len(st):
            diffs["token"] = math.inf
        elif et:
            d = np.max(np.abs(np.asarray(et, dtype=np.int64) - np.asarray(st, dtype=np.int64)))
            diffs["token"] = max(diffs["token"], float(d) / NS_PER_MS)
    # The simulator's own clock between tokens: its pooled inter-token gaps against the
    # engine's, sorted (the closest pairing of two sets of gaps; each gap's two ends lie
    # within the hand-back time, so each pair does too). The token times above are where
    # the simulator's steps end by the replayed durations: the engine's next queue checks.
    eng_gaps = np.sort(np.concatenate(
        [np.diff(np.asarray(r.token_times_ns or [], dtype=np.int64)) for r in run.records]
        or [np.empty(0, np.int64)]))
    itl = result.itl_runs
    sim_gaps = (np.repeat(itl["gap_ns"].to_numpy(dtype=np.int64),
                          itl["count"].to_numpy(dtype=np.int64)) if len(itl)
                else np.empty(0, np.int64))
    diffs["itl"] = (math.inf if len(eng_gaps) != len(sim_gaps) else
                    float(np.max(np.abs(eng_gaps - np.sort(sim_gaps)))) / NS_PER_MS
                    if len(eng_gaps) else 0.0)
    ok = (mism == 0 and hits_eq and pre_eq and max(diffs.values()) <= 1.0)
    priced = bool(cost.priced_ns) and mism == 0 and bool(run.steps)
    # The engine handing tokens back between step k's end and its next queue check.
    gaps = [a - (s.start_ns + s.duration_ns) for s, a in zip(run.steps, run.after_checks_ns)]
    # An idle engine notices an arrival when it wakes; the simulator's step starts at the
    # arrival (and schedules where the engine's step began).
    wake = [c - s for c, s in zip(run.checks_ns, cost._start)]
    # A wake-up so late that a second arrival came first: the engine batches both, the
    # simulator (serving at once) the first alone. A disturbance of the engine's process,
    # not a policy difference; the check then cannot be exact.
    arrivals = sorted(r.arrival_ns for r in run.records)
    late = sum(1 for k in range(1, len(run.steps))
               if run.after_checks_ns[k - 1] != run.checks_ns[k]
               and bisect.bisect_right(arrivals, run.checks_ns[k])
               - bisect.bisect_right(arrivals, run.after_checks_ns[k - 1]) >= 2)
    return {"handback_max_ms": max(gaps) / NS_PER_MS if gaps else 0.0,
            "idle_wake_max_ms": max(wake) / NS_PER_MS if wake else 0.0,
            "late_wakes": late,
            "tokens_not_before_engine": structural,
            "steps_engine": len(run.steps), "steps_sim": len(cost.steps),
            "step_mismatches": mism, "first_mismatch": first,
            "step_cost_ratio": (sum(cost.priced_ns) / sum(e.duration_ns for e in run.steps)
                                if priced else None),
            "step_cost_by_kind": _cost_by_kind(run.steps, cost.priced_ns) if priced else None,
            "prefix_hits_equal": bool(hits_eq), "preemptions_equal": bool(pre_eq),
            "max_abs_diff_ms": diffs, "ok": bool(ok)}


STEP_KINDS = ("prefill", "mixed", "decode")


def step_kind(step) -> str:
    """``prefill`` (prefill chunks only), ``mixed`` (chunks and decodes) or ``decode``."""
    if step.prefills:
        return "mixed" if step.num_decodes else "prefill"
    return "decode"


def _cost_by_kind(steps, priced_ns) -> dict:
    """``{kind: [Σ priced ns, Σ measured ns, steps]}`` over ``steps`` (engine steps with
    ``duration_ns``) and their prices, for the kinds present."""
    out: dict = {}
    for e, p in zip(steps, priced_ns):
        acc = out.setdefault(step_kind(e), [0, 0, 0])
        acc[0] += int(p)
        acc[1] += int(e.duration_ns)
        acc[2] += 1
    return {k: out[k] for k in STEP_KINDS if k in out}
