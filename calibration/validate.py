"""Measured fidelity of the simulator against the real engine, across load.

Two modes (DESIGN.md §2: the simulator differs from the engine only in where a step's
duration comes from):

* **timing replay** — the simulator takes the engine's recorded duration for each step
  (:class:`StepReplayCost`); policy and simulator are then checked exactly: the same
  per-step batches, prefix hits and preemptions, every request timestamp within 1 ms
  (:func:`compare_timing`).
* **predicted** — the profile's cost model prices every step; this is the fidelity users
  get (:func:`validate`).

Timing boundaries are the same on both sides: a request's arrival is when it reaches the
engine's queue (its scheduled arrival on the replay clock); a step sees every request that
arrived before the engine looked at its queue, which is where a simulated step starts
(:func:`run_engine` records that instant for every step); in timing replay its batch is
scheduled where the engine's step began, after its intake. The engine's work between steps
(turning arrivals into token ids, detokenising finished requests) is measured as the
front-end gap and reported; it enters a prediction only with ``front_end=True``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from simulator.errors import InputError
from simulator.files import check_folder
from simulator.metrics import MetricsCollector, RunResult

NS_PER_MS = 1_000_000
#: figures compared per load: (label, summary path)
FIGURES = tuple(
    [(f"{m.split('_')[0].upper()} p{q}", (m, f"p{q}"))
     for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") for q in (50, 90, 99)]
    + [("throughput req/s", ("request_throughput",)),
       ("throughput out tok/s", ("output_throughput",)),
       ("concurrency mean", ("concurrency", "requests_mean")),
       ("concurrency max", ("concurrency", "requests_max")),
       ("preemptions", ("preemptions",)),
       ("prefix hit rate", ("prefix_cache_hit_rate",))])
BAND_FIGURES = ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2EL p50", "E2EL p99")


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
        raise InputError(f"{scenario.source}: engine.num_gpu_blocks: validation needs a "
                         f"finite KV cache (set it, or use a profile that records one)")
    e = scenario.engine
    return {"block_size": e.block_size, "max_num_seqs": scenario.max_num_seqs,
            "max_num_batched_tokens": scenario.max_num_batched_tokens,
            "max_model_len": scenario.max_model_len,
            "enable_prefix_caching": e.enable_prefix_caching,
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
    for s in run.steps:
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
    (:attr:`priced_ns`): the cost model's error on the very steps the engine ran.

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
        self._start, self._end = start, end
        self._begin = [s.start_ns for s in run.steps]
        self.steps: list[SimStep] = []

    def intake_ns(self, plan) -> int:
        """ns from the simulated step's start to where the engine's step began (its intake
        of arrivals; after an idle spell, its wake-up too): the batch's scheduled time."""
        k = len(self.steps)   # the step about to be priced
        return max(0, self._begin[k] - self._start[k]) if k < len(self._start) else 0

    def step_time_ns(self, plan) -> int:
        k = len(self.steps)
        if self.price is not None:
            self.priced_ns.append(self.price.step_time_ns(plan))
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
        t = self.base.step_time_ns(plan)
        return max(1, int(t * self.factor + 0.5) + self.front_end_ns)


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
        decode count, decode context or preemptions differ), ``first_mismatch`` (step
        index or None), ``prefix_hits_equal`` (per request), ``preemptions_equal``
        (per request), ``max_abs_diff_ms`` per timestamp kind (arrival, first_scheduled,
        first_token, finish, token: every output token), ``handback_max_ms`` (the
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
            if val is None:
                continue
            d = abs(float(row[f"{kind}_s"]) * 1e3 - val / NS_PER_MS)
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


# == workloads ==============================================================================

def load_specs(scenario, rate: float | None, num_requests: int, seed: int, burst=False):
    """The scenario's request list with its arrival rate and count replaced (``burst``:
    every request arrives at 0, for the saturation run)."""
    from simulator.workload import build_workload
    wl = scenario.workload
    upd = {"seed": int(seed), "num_requests": int(num_requests)}
    if rate is not None:
        upd["arrival"] = wl.arrival.model_copy(update={"rate": float(rate)})
    specs = build_workload(wl.model_copy(update=upd), base_dir=scenario.base_dir)
    if burst:
        specs = [dataclasses.replace(s, arrival_ns=0) for s in specs]
    return specs


def replication_seed(seed: int, key) -> int:
    """Seed of one validation run, from ``numpy.random.SeedSequence([seed, *key])``."""
    return int(np.random.SeedSequence([int(seed), *key]).generate_state(1)[0])


def saturation_throughput(finish_ns) -> float:
    """Requests/s of a burst run between its 10th and 90th percentile finishes (the ramp-up
    and the drain left out, so the figure is the engine's steady capacity)."""
    f = np.sort(np.asarray([x for x in finish_ns if x is not None], dtype=np.int64))
    if f.size < 5:
        raise ValueError("saturation run needs at least 5 finished requests")
    i0, i1 = f.size // 10, f.size - 1 - f.size // 10
    return (i1 - i0) / ((f[i1] - f[i0]) / 1e9)


def profile_threads(profile) -> int | None:
    """CPU threads the profile was measured with: ``threads`` in its measurements CSV's
    header, else the count its provenance or device name states ("1 thread", "4 threads");
    None when neither says."""
    from calibration.profiler import read_csv_header

    if profile is None:
        return None
    rel = profile.provenance.measurements_csv
    if rel and profile.path is not None and (profile.path.parent / rel).is_file():
        threads = (read_csv_header(profile.path.parent / rel) or {}).get("threads")
        if isinstance(threads, int) and threads > 0:
            return threads
    m = re.search(r"(\d+) threads?\b", profile.provenance.source or "") or \
        re.search(r"(\d+) threads?\b", profile.device.name)
    return int(m.group(1)) if m else None


def wait_quiet(max_wait_s: float = 120.0, busy_pct: float = 15.0, need_s: int = 3,
               stat_path: str = "/proc/stat") -> float:
    """Wait until the whole machine is at most ``busy_pct`` % busy for ``need_s``
    consecutive seconds (from ``/proc/stat``), at most ``max_wait_s``; returns the wait."""
    from .profiler import busy_cores

    t0 = time.monotonic()
    quiet = 0
    cpus = os.cpu_count() or 1
    while quiet < need_s and time.monotonic() - t0 < max_wait_s:
        busy = busy_cores(1.0, stat_path)
        if busy is None:
            break
        quiet = quiet + 1 if 100.0 * busy / cpus <= busy_pct else 0
    return time.monotonic() - t0


# == the host's speed =====================================================================

# The probe re-measures four of the profile's grid cells, as the grid measured them: the
# cells nearest a small, a mid-sized and a full decode batch (memory-bound steps; a full
# batch streams the most KV, and a shared host's slowdowns hit it hardest: a saturation
# run ran 20% slow while the two smaller batches timed at their calibration speed) and a
# 256-token prefill (a compute-bound one).
PROBE_TARGETS = (("decode", 2, 256), ("decode", 8, 256), ("decode", 32, 256),
                 ("prefill", 256, 0))
PROBE_VISITS = 10


def probe_cells(profile) -> list | None:
    """Per :data:`PROBE_TARGETS` entry, ``(Cell, mean seconds)`` of the cell of that kind in
    ``profile``'s measurements CSV nearest to it (log distance); None without a CSV or
    without such cells."""
    from calibration.profiler import Cell, read_measurements

    rel = profile.provenance.measurements_csv if profile is not None else None
    if not rel or profile.path is None or not (profile.path.parent / rel).is_file():
        return None
    means = read_measurements(profile.path.parent / rel).groupby("cell")["duration_ns"].mean()
    out = []
    for kind, a0, b0 in PROBE_TARGETS:
        best = None
        for key, mean_ns in means.items():
            cell = Cell.from_key(key)
            if cell is None or cell.kind != kind:
                continue
            a, b = (cell.B, cell.L) if kind == "decode" else (cell.n, cell.c)
            d = abs(math.log1p(a) - math.log1p(a0)) + abs(math.log1p(b) - math.log1p(b0))
            if best is None or d < best[0]:
                best = (d, cell, float(mean_ns) / 1e9)
        if best is None:
            return None
        out.append(best[1:])
    return out


class SpeedProbe:
    """The host's speed now relative to when the profile was measured: per probe cell
    (:func:`probe_cells`), the median of its steps measured now (``PROBE_VISITS`` visits,
    as the grid measured them, after one untimed visit) over its mean in the profile's CSV;
    the factor is the geometric mean over the cells (> 1: the host is slower now).

    A GPU keeps its speed; a shared CPU host does not (on this project's 2-core machine,
    the same step's time moved by 10-50 % between minutes with no other process running),
    and a cost model measured minutes earlier then errs by that factor whatever its form.
    :func:`validate` probes before and after every timed run and reports the predictions
    both as they are and with every step cost scaled by the probe's factor.

    Every probe runs on a fresh engine (the timed runs do too): an engine that has served
    a while hands out KV blocks in the order its requests freed them, and on a CPU a decode
    batch reading scattered blocks ran ~10% slower than one reading the consecutive blocks
    of a fresh engine (``benchmarks/results/fidelity_runs.md``), which a reused probe engine
    read as the host slowing down.
    """

    def __init__(self, model, config: dict, cells: list):
        self.model, self.cells = model, cells
        bs = config["block_size"]
        blocks = max(c.B * -(-(4 * c.L + 64) // bs) + -(-(c.n + c.c) // bs) for c, _ in cells)
        # Only the shapes matter: knobs large enough that every cell runs as one step.
        self.config = {
            **config, "num_gpu_blocks": blocks + 16,
            "max_num_seqs": max([config["max_num_seqs"]] + [c.B + 1 for c, _ in cells]),
            "max_num_batched_tokens": max([config["max_num_batched_tokens"]]
                                          + [c.n + c.B for c, _ in cells])}
        self.engine = None   # the latest probe's engine

    @property
    def label(self) -> str:
        return ", ".join(f"{c.key} ({ref * 1e3:.2f} ms)" for c, ref in self.cells)

    @staticmethod
    def _measure(driver, cell) -> list[int]:
        from calibration.profiler import _check

        if cell.kind == "prefill":
            recs = [driver.chunk_step(cell.n, cell.c)]
        else:
            rids = driver.start_decodes(cell.B, cell.L)
            recs = [driver.step() for _ in range(2)]
            driver.stop(rids)
        for r in recs:
            _check(cell, r)
        return [r.duration_ns for r in recs]

    def __call__(self) -> float:
        from calibration.engine import LLMEngine
        from calibration.profiler import _Driver

        self.engine = LLMEngine(self.model, self.config)
        driver = _Driver(self.engine, seed=self.config.get("seed", 0) + 7)
        for cell, _ in self.cells:
            self._measure(driver, cell)
        logs = []
        for cell, ref in self.cells:
            times = [t for _ in range(PROBE_VISITS) for t in self._measure(driver, cell)]
            logs.append(math.log(float(np.median(times)) / 1e9 / ref))
        return math.exp(sum(logs) / len(logs))


# == the comparison =========================================================================

def figure(summary: dict, path: tuple):
    v = summary
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v


def signed_error(pred, meas):
    """(predicted − measured) / measured, None when undefined."""
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas


def _spread(values):
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()),
            "n": int(a.size)}


@dataclass
class LoadResult:
    """One load level: per replication the measured, predicted and band summaries."""

    load: float
    rate: float
    num_requests: int
    measured: list = field(default_factory=list)
    predicted: list = field(default_factory=list)
    band_low: list = field(default_factory=list)    # predicted × (1 − MAPE)
    band_high: list = field(default_factory=list)   # predicted × (1 + MAPE)
    adjusted_low: list = field(default_factory=list)    # the same at host speed
    adjusted_high: list = field(default_factory=list)
    timing: list = field(default_factory=list)
    cdf: list = field(default_factory=list)
    speed: list = field(default_factory=list)       # host speed factor per replication
    adjusted: list = field(default_factory=list)    # predicted at that speed
    again: list = field(default_factory=list)       # the same requests served once more

    def table(self) -> list[dict]:
        """Per figure: measured, predicted, signed error (mean/min/max over replications),
        with repeat servings the second serving's signed difference from the first
        (``again_error``) and, for the band figures, whether the measured value lies in the
        MAPE band (``in_band``; ``in_band_adjusted``: in the band around the prediction at
        host speed)."""
        rows = []
        for label, path in FIGURES:
            m = [figure(s, path) for s in self.measured]
            p = [figure(s, path) for s in self.predicted]
            e = [signed_error(b, a) for a, b in zip(m, p)]
            row = {"figure": label, "measured": _spread(m), "predicted": _spread(p),
                   "error": _spread(e)}
            if self.adjusted:
                a = [figure(s, path) for s in self.adjusted]
                row["adjusted"] = _spread(a)
                row["adjusted_error"] = _spread([signed_error(b, x) for x, b in zip(m, a)])
            if self.again:
                row["again_error"] = _spread([signed_error(figure(s, path), x)
                                              for x, s in zip(m, self.again)])
            for key, low, high in (("", self.band_low, self.band_high),
                                   ("_adjusted", self.adjusted_low, self.adjusted_high)):
                if label in BAND_FIGURES and low:
                    row["in_band" + key], row["band" + key] = _in_band(m, low, high, path)
            if label in BAND_FIGURES and self.band_low and self.again:
                row["again_in_band"] = _again_in_band(
                    m, p, [figure(s, path) for s in self.again], self.band_low,
                    self.band_high, path)
            rows.append(row)
        return rows


def _in_band(measured: list, low: list, high: list, path) -> tuple:
    """Whether every replication's measured figure lies between its two band simulations
    (None when undefined), and the band's ``[low, high]`` spreads."""
    inside = []
    for mv, lo, hi in zip(measured, low, high):
        lo_v, hi_v = figure(lo, path), figure(hi, path)
        if None not in (mv, lo_v, hi_v):
            inside.append(min(lo_v, hi_v) <= mv <= max(lo_v, hi_v))
    return (all(inside) if inside else None,
            [_spread([figure(s, path) for s in low]), _spread([figure(s, path) for s in high])])


def _again_in_band(measured: list, predicted: list, again: list, low: list, high: list,
                   path) -> bool | None:
    """Whether every replication's second serving lies in its MAPE band moved onto the
    first serving (band × first / predicted): the band check as a predictor that hit the
    first serving exactly would fare, so the engine's own run-to-run spread against the
    band's width. None when undefined."""
    inside = []
    for mv, pv, av, lo, hi in zip(measured, predicted, again, low, high):
        lo_v, hi_v = figure(lo, path), figure(hi, path)
        if None in (mv, pv, av, lo_v, hi_v) or not pv:
            continue
        inside.append(min(lo_v, hi_v) * mv / pv <= av <= max(lo_v, hi_v) * mv / pv)
    return all(inside) if inside else None


# == the whole validation ===================================================================

# Bounds of the validation flags: a validation takes minutes to hours of wall clock (each
# load and replication serves ``--seconds`` of arrivals in real time), and the saturation
# figure counts finishes between the 10th and 90th percentile (at least 5 of them).
MIN_LOAD, MAX_LOAD = 0.01, 1.5
MAX_REPLICATIONS = 100
MAX_SECONDS_PER_LOAD = 3600.0
MIN_SATURATION_REQUESTS, MAX_SATURATION_REQUESTS = 5, 100_000


def check_validation_args(scenario, loads, replications: int, seconds_per_load: float = 1.0,
                          saturation_requests: int | None = None) -> None:
    """What every validation needs, checked before any engine starts.

    Raises:
        InputError: more than one replica, or a flag outside its bounds (the constants
            above): loads in [0.01, 1.5], replications in [1, 100], seconds per load in
            (0, 3600], saturation requests in [5, 100000].
    """
    if scenario.cluster.replicas != 1:
        raise InputError(f"{scenario.source}: cluster.replicas: validation serves one "
                         f"engine; set 1")
    if not loads or any(not MIN_LOAD <= x <= MAX_LOAD for x in loads):
        raise InputError(f"--loads: fractions of saturation in [{MIN_LOAD:g}, {MAX_LOAD:g}], "
                         f"got {list(loads)}")
    if not 1 <= replications <= MAX_REPLICATIONS:
        raise InputError(f"--replications: 1 to {MAX_REPLICATIONS}, got {replications}")
    if not (math.isfinite(seconds_per_load) and 0 < seconds_per_load <= MAX_SECONDS_PER_LOAD):
        raise InputError(f"--seconds: seconds of arrivals per load, in (0, "
                         f"{MAX_SECONDS_PER_LOAD:g}]; got {seconds_per_load}")
    if saturation_requests is not None and not (
            MIN_SATURATION_REQUESTS <= saturation_requests <= MAX_SATURATION_REQUESTS):
        raise InputError(f"--saturation-requests: {MIN_SATURATION_REQUESTS} to "
                         f"{MAX_SATURATION_REQUESTS} (throughput is counted between the 10th "
                         f"and 90th percentile finishes), got {saturation_requests}")


def measure_fidelity(sc1, base, timed, *, loads, replications: int,
                     seconds_per_load: float, saturation_requests: int | None,
                     front_end: bool, progress, engine_name: str, speed=None,
                     again: bool = False) -> dict:
    """The measurement loop of :func:`validate`, whatever engine serves: ``timed(specs,
    label)`` serves a request list in real time and returns its :class:`EngineRun`;
    ``sc1`` is the scenario with the engine's effective knobs and ``base`` its cost model;
    ``again``: serve every replication's request list a second time (the engine's own
    run-to-run difference: the floor under any prediction's error on this machine).

    Returns:
        ``saturation`` (requests, measured/predicted req/s, error, mean engine step ms,
        ``timing`` check of the burst), ``front_end`` (gap mean/p99 us, whether predictions
        include it), ``loads`` and ``cdf`` as :func:`validate` describes.
    """
    prof = base.profile
    mape = prof.error.heldout.mape if prof is not None and prof.error.heldout else None
    seed = sc1.workload.seed
    slo = sc1.slo.model_dump(exclude_none=True)

    def run_at(specs, label):
        """The timed run and the host's speed factor over it (geometric mean of the
        probes before and after; None without a probe)."""
        before = speed() if speed else None
        run = timed(specs, label)
        return run, (math.sqrt(before * speed()) if speed else None)

    # -- saturation ------------------------------------------------------------------------
    n_sat = saturation_requests or 4 * sc1.max_num_seqs
    sat_specs = load_specs(sc1, None, n_sat, replication_seed(seed, (0,)), burst=True)
    progress(f"saturation: {n_sat} requests at once on {engine_name}")
    sat_run, sat_speed = run_at(sat_specs, "saturation")
    sat_meas = saturation_throughput([r.finish_ns for r in sat_run.records])

    def sat_predicted(cost):
        sim = simulate_specs(sc1, sat_specs, cost)
        return saturation_throughput((sim.requests["finish_s"] * 1e9).tolist())

    sat_pred = sat_predicted(base)
    sat_adj = sat_predicted(ScaledCost(base, sat_speed)) if sat_speed else None
    gaps = sat_run.front_end_gaps_ns()
    fe_ns = int(gaps.mean()) if gaps.size else 0
    steps_ns = np.asarray([s.duration_ns for s in sat_run.steps])
    progress(f"  measured {sat_meas:.3f} req/s, predicted {sat_pred:.3f} "
             f"({signed_error(sat_pred, sat_meas):+.1%})" + (
                 f"; probed steps took ×{sat_speed:.3f} their calibration time, predicted "
                 f"at that host speed {sat_adj:.3f} ({signed_error(sat_adj, sat_meas):+.1%})"
                 if sat_speed else ""))

    # -- loads -----------------------------------------------------------------------------
    out_loads, cdf = [], []
    for x in loads:
        rate = x * sat_meas
        n = max(10, int(round(rate * seconds_per_load)))
        lr = LoadResult(load=x, rate=rate, num_requests=n)
        for r in range(replications):
            specs = load_specs(sc1, rate, n, replication_seed(seed, (int(x * 1000), r + 1)))
            progress(f"load {x:g}: {n} requests at {rate:.3f}/s, replication {r + 1}/"
                     f"{replications} (about {n / rate:.0f} s)")
            run, sp = run_at(specs, f"load {x:g} r{r + 1}")
            meas = engine_result(run, slo)
            tres, tcost = simulate_timing(sc1, specs, run, price=base)
            lr.timing.append(compare_timing(run, tres, tcost))
            pred = simulate_specs(sc1, specs, ScaledCost(base, 1.0, fe_ns if front_end else 0))
            if sp:
                lr.speed.append(sp)
                lr.adjusted.append(simulate_specs(sc1, specs, ScaledCost(
                    base, sp, fe_ns if front_end else 0)).summary)
            lr.measured.append(meas.summary)
            lr.predicted.append(pred.summary)
            if again:
                progress(f"load {x:g}: replication {r + 1}/{replications} served again")
                lr.again.append(engine_result(timed(specs, f"load {x:g} r{r + 1} again"),
                                              slo).summary)
            if mape:   # around the prediction, and around it at the host's speed if probed
                for speed_f, low, high in ((1.0, lr.band_low, lr.band_high),) + (
                        ((sp, lr.adjusted_low, lr.adjusted_high),) if sp else ()):
                    for f, dest in ((1 - mape, low), (1 + mape, high)):
                        dest.append(simulate_specs(sc1, specs, ScaledCost(
                            base, f * speed_f, fe_ns if front_end else 0)).summary)
            if r == 0:
                cdf.append({"load": x, **{
                    f"{side}_{m}": [v for v in res.requests[m].tolist() if v == v]
                    for side, res in (("measured", meas), ("predicted", pred))
                    for m in ("ttft_ms", "tpot_ms", "e2el_ms")}})
        out_loads.append({"load": x, "rate": rate, "num_requests": n,
                          "table": lr.table(), "timing": lr.timing, "host_speed": lr.speed})
    return {"saturation": {"requests": n_sat, "measured_rps": sat_meas,
                           "predicted_rps": sat_pred,
                           "error": signed_error(sat_pred, sat_meas),
                           "host_speed": sat_speed, "adjusted_rps": sat_adj,
                           "adjusted_error": signed_error(sat_adj, sat_meas),
                           "engine_step_ms_mean": float(steps_ns.mean() / 1e6),
                           "timing": compare_timing(sat_run, *simulate_timing(
                               sc1, sat_specs, sat_run, price=base))},
            "front_end": {"gap_us_mean": fe_ns / 1e3,
                          "gap_us_p99": float(np.percentile(gaps, 99) / 1e3) if gaps.size
                          else 0.0,
                          "in_prediction": bool(front_end)},
            "loads": out_loads, "cdf": cdf}


def servable_cost_model(scenario):
    """The scenario's cost model (:func:`simulator.cost_model.build_cost_model`) when a
    validation can judge it: a measured profile or an inline step time.

    Raises:
        InputError: a projection (nothing measured on this machine to validate).
    """
    from simulator.cost_model import build_cost_model

    base = build_cost_model(scenario)
    prof = base.profile
    if prof is not None and prof.provenance.kind != "measured":
        raise InputError(f"{scenario.source}: hardware: validate serves the scenario on this "
                         f"machine's engine, so it needs a profile measured here (servesim "
                         f"calibrate) or an inline step_time, not a projection ({base.label})")
    return base


def validate(scenario, loads=(0.3, 0.6, 0.9), replications: int = 3, *,
             seconds_per_load: float = 60.0, saturation_requests: int | None = None,
             front_end: bool = False, quiet: bool = True, host_speed: bool = True,
             again: bool = False, progress=print) -> dict:
    """Validate ``scenario``'s profile against the real engine on this machine.

    Steps: (1) saturation: every request of a burst arrives at 0; the engine's and the
    simulator's throughput between the 10th and 90th percentile finishes
    (:func:`saturation_throughput`); (2) per load ``x`` and replication ``r``: a workload
    of the scenario's lengths at ``x × measured saturation`` req/s (about
    ``seconds_per_load`` of arrivals, seed ``SeedSequence([seed, load‰, r])``) served in
    real time, then simulated on the identical request list: timing replay (exact check),
    predicted (the profile's costs) and the band with costs scaled by ``1 ± held-out
    MAPE`` of the profile.

    Args:
        scenario: validated scenario with a measured CPU profile (``hardware.profile``) or
            an inline step time; one replica.
        front_end: add the measured mean front-end gap per step (tokenising arrivals,
            detokenising finishes, between engine steps) to every predicted step.
        quiet: wait for a quiet machine before each timed run (:func:`wait_quiet`).
        host_speed: probe the host's speed before and after each timed run
            (:class:`SpeedProbe`) and add predictions at that speed (``adjusted``), with
            a MAPE band of their own (``in_band_adjusted``).
        again: serve every replication's request list a second time and report how far
            the second serving's figures lie from the first's (``again_error`` in the
            table rows) and, at the band figures, whether it lies in the MAPE band moved
            onto the first serving (``again_in_band``): the engine's own run-to-run spread
            on this machine, which no prediction can beat.

    Returns:
        JSON-able dict: ``meta`` (machine, versions, engine knobs, seeds, threads),
        ``saturation``, ``front_end``, ``loads`` (per load: rate, requests, ``table`` rows
        as :meth:`LoadResult.table`, ``timing`` checks) and ``cdf`` (per load, first
        replication: measured and predicted TTFT/TPOT/E2EL samples in ms).

    Raises:
        InputError: more than one replica, or a flag outside its bounds
            (:func:`check_validation_args`).
    """
    import platform

    import torch

    from calibration.engine.weights import parse_dtype, random_model

    from .cli import warn_if_emulated_bf16

    check_validation_args(scenario, loads, replications, seconds_per_load, saturation_requests)
    base = servable_cost_model(scenario)
    cfg = engine_config(scenario, base.num_gpu_blocks, scenario.workload.seed)
    # after every input error, so that a bad input stays one line
    warn_if_emulated_bf16("cpu", scenario.dtype, fix=(   # our engine serves on cpu here
        "validate in float32: --set dtype=float32 with a float32 profile (shipped: "
        "--set hardware.profile=cpu-llama-tiny-56m-float32)"))
    prof = base.profile
    threads = profile_threads(prof)
    if threads:
        torch.set_num_threads(threads)
    mape = prof.error.heldout.mape if prof is not None and prof.error.heldout else None
    sc1 = scenario.model_copy(update={"engine": scenario.engine.model_copy(
        update={"num_gpu_blocks": cfg["num_gpu_blocks"]})})
    model = random_model(scenario.model_shape.hf_config(), seed=cfg["seed"],
                         dtype=parse_dtype(scenario.dtype))

    def timed(specs, label):
        if quiet:
            waited = wait_quiet()
            if waited > 5:
                progress(f"  waited {waited:.0f} s for a quiet machine ({label})")
        return run_engine(model, cfg, specs)

    cells = probe_cells(prof) if host_speed else None
    probe = SpeedProbe(model, cfg, cells) if cells else None
    if host_speed and probe is None:
        progress("host speed: not probed (the profile has no measurements CSV with "
                 "decode and prefill cells)")
    result = measure_fidelity(sc1, base, timed, loads=loads,
                              replications=replications, seconds_per_load=seconds_per_load,
                              saturation_requests=saturation_requests, front_end=front_end,
                              progress=progress, engine_name="the engine", speed=probe,
                              again=again)
    meta = {
        "scenario": scenario.name, "source": scenario.source, "model": scenario.model_shape.name,
        "dtype": scenario.dtype, "engine": f"servesim-torch ({_version()})",
        "engine_knobs": {k: v for k, v in cfg.items()},
        "scheduling": "vLLM V1 semantics, synchronous (async_scheduling=False)",
        "cost_model": base.label, "heldout_mape": mape,
        "replay_mape": prof.error.replay.mape if prof is not None and prof.error.replay
        else None,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "machine": f"{platform.machine()} "
        f"{os.cpu_count()} cpus", "cpu": _cpu_name(), "seed": scenario.workload.seed,
        "replications": replications, "seconds_per_load": seconds_per_load,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host_speed_probe": (f"{probe.label} (calibration means), {PROBE_VISITS} visits "
                             f"each") if probe else None,
    }
    result["front_end"]["note"] = ("engine time between a step's end and the next queue "
                                   "check (tokenising arrivals, detokenising finishes); "
                                   "measured in the saturation run")
    return {"meta": meta, **result}


def _version() -> str:
    from calibration.cli import engine_version
    return engine_version()


def _cpu_name() -> str:
    from calibration.profiler import cpu_name
    return cpu_name()


# == output ================================================================================

def _fmt(v, pct=False):
    if v is None:
        return "–"
    if pct:
        return f"{v:+.1%}"
    return f"{v:.4g}"


def _cell(spread, pct=False):
    if spread is None:
        return "–"
    if spread["n"] == 1 or spread["min"] == spread["max"]:
        return _fmt(spread["mean"], pct)
    return f"{_fmt(spread['mean'], pct)} [{_fmt(spread['min'], pct)}, {_fmt(spread['max'], pct)}]"


def _timing_verdict(t: dict) -> str:
    """One timing-replay check in words (:func:`compare_timing`'s dict)."""
    dt = max(t["max_abs_diff_ms"].values())
    if t["ok"]:
        return f"exact ({t['steps_engine']} steps, max |Δt| {dt:.3f} ms)"
    if t["step_mismatches"] == 0 and t.get("prefix_hits_equal") and t.get("preemptions_equal"):
        return (f"same batches, hits and preemptions in all {t['steps_engine']} steps; "
                f"timestamps within {dt:.3f} ms, over the 1 ms tolerance (the engine took "
                f"up to {t['handback_max_ms']:.3f} ms to hand a step's tokens back)")
    late = t.get("late_wakes", 0)
    return (f"NOT exact ({t['steps_engine']} engine steps, {t['step_mismatches']} differ, "
            f"max |Δt| {dt:.3f} ms" + (
                f"; an idle engine woke {t['idle_wake_max_ms']:.3f} ms late, after a second "
                f"arrival, {late} time(s): it batched them, the simulator started at the "
                f"first" if late else "") + ")")


#: How far the served steps' step-cost ratio times the probe's host speed may sit from 1
#: before :func:`markdown_table` says the probe does not explain the mispricing.
PROBE_AGREEMENT = 0.10


def probe_disagreements(result: dict) -> list[tuple[str, float]]:
    """Timed runs where the host-speed probe does not account for the cost model's error
    on the run's own steps: ``step_cost_ratio × host_speed`` (1 when steps ran exactly the
    probe's factor slower than the profile prices them) off 1 by more than
    :data:`PROBE_AGREEMENT`. Returns ``(label, product)`` per such run: ``"saturation"``
    or ``"load X rN"``; runs without a probe or a ratio are skipped."""
    sat = result["saturation"]
    runs = [("saturation", (sat.get("timing") or {}).get("step_cost_ratio"),
             sat.get("host_speed"))]
    for ld in result["loads"]:
        runs += [(f"load {ld['load']:g} r{i + 1}", t.get("step_cost_ratio"), sp)
                 for i, (t, sp) in enumerate(zip(ld["timing"], ld.get("host_speed") or []))]
    return [(label, r * sp) for label, r, sp in runs
            if r is not None and sp is not None and abs(r * sp - 1) > PROBE_AGREEMENT]


def markdown_table(result: dict) -> str:
    """The validation as markdown: saturation line, then per load one row per figure
    (measured, predicted, signed error as mean [min, max] over replications; with a host
    speed probe also the prediction at the probed speed and its error)."""
    sat = result["saturation"]
    adj = sat.get("host_speed") is not None
    lines = [f"saturation throughput: measured {sat['measured_rps']:.3f} req/s, predicted "
             f"{sat['predicted_rps']:.3f} req/s, error {sat['error']:+.1%}" + (
                 f"; probed steps took ×{sat['host_speed']:.3f} their calibration time, "
                 f"predicted at that host speed {sat['adjusted_rps']:.3f} req/s, error "
                 f"{sat['adjusted_error']:+.1%}"
                 if adj else ""), ""]
    if adj:
        lines.append("host speed per replication (probe cells' step times / their "
                     "calibration means, geometric mean; > 1: slower than at calibration): "
                     + "; ".join(
                         f"load {ld['load']:g}: " + ", ".join(f"×{v:.3f}" for v in
                                                              ld["host_speed"])
                         for ld in result["loads"]))
        lines.append("")
    ratios = [("saturation", [(sat.get("timing") or {}).get("step_cost_ratio")])] + [
        (f"load {ld['load']:g}", [t.get("step_cost_ratio") for t in ld["timing"]])
        for ld in result["loads"]]
    if any(v is not None for _, vs in ratios for v in vs):
        lines += ["cost model on the engine's own steps (Σ priced / Σ measured step time; "
                  "< 1: priced too fast): " + "; ".join(
                      f"{label}: " + ", ".join("–" if v is None else f"×{v:.3f}" for v in vs)
                      for label, vs in ratios), ""]
    by_kind = []
    for label, timings in [("saturation", [sat.get("timing") or {}])] + [
            (f"load {ld['load']:g}", ld["timing"]) for ld in result["loads"]]:
        sums = {k: [0, 0, 0] for k in STEP_KINDS}
        for t in timings:
            for k, (p, m, n) in (t.get("step_cost_by_kind") or {}).items():
                sums[k] = [sums[k][0] + p, sums[k][1] + m, sums[k][2] + n]
        if any(n for _, _, n in sums.values()):
            by_kind.append(f"{label}: " + " / ".join(
                f"×{p / m:.3f} ({n})" if n and m else "–" for p, m, n in sums.values()))
    if by_kind:
        lines += ["the same by step kind, prefill-only / mixed / decode-only (steps), over "
                  "each load's replications: " + "; ".join(by_kind), ""]
    if adj:
        apart = probe_disagreements(result)
        if apart:
            lines += [f"probe and served steps disagree by more than {PROBE_AGREEMENT:.0%} "
                      "(priced/measured × probe, 1 when the probe's host speed explains the "
                      "mispricing) in " + "; ".join(f"{label}: ×{v:.3f}" for label, v in apart)
                      + ": the prediction at host speed is not reliable there.", ""]
    again = any("again_error" in row for ld in result["loads"] for row in ld["table"])
    head = ["load", "figure", "measured", "predicted", "error"]
    again_band = any("again_in_band" in row for ld in result["loads"] for row in ld["table"])
    if again:
        head.append("served again: difference")
    head.append("in MAPE band")
    if again_band:
        head.append("served again in MAPE band")
    if adj:
        head += ["predicted at host speed", "error at host speed", "in MAPE band around it"]
    lines += ["TTFT, TPOT, ITL and E2EL in ms (as vllm bench serve); error = (predicted − "
              "measured) / measured; cells: mean [min, max] over replications.", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def band(row, key):
        return {True: "yes", False: "no", None: "–"}[row[key]] if key in row else ""

    for ld in result["loads"]:
        for row in ld["table"]:
            cells = [f"{ld['load']:g}", row["figure"], _cell(row["measured"]),
                     _cell(row["predicted"]), _cell(row["error"], True)]
            if again:
                cells.append(_cell(row.get("again_error"), True))
            cells.append(band(row, "in_band"))
            if again_band:
                cells.append(band(row, "again_in_band"))
            if adj:
                cells += [_cell(row.get("adjusted")), _cell(row.get("adjusted_error"), True),
                          band(row, "in_band_adjusted")]
            lines.append("| " + " | ".join(cells) + " |")
    if again:
        lines += ["", "'served again': every replication's request list served a second "
                  "time on a fresh engine; the difference of its figure from the first "
                  "serving's, (again − first) / first: the engine's own run-to-run spread on "
                  "this machine, a floor under any prediction's error."]
    lines += ["", "'in MAPE band' is judged for " + ", ".join(BAND_FIGURES) + " (blank for "
              "the other figures): whether the measured value lies between simulations with "
              "every step cost scaled by (1 − held-out MAPE) and (1 + held-out MAPE)"
              + ("; 'around it': the same around the prediction at host speed." if adj
                 else ".")]
    if again_band:
        lines += ["", "'served again in MAPE band': whether the second serving lies in the "
                  "band moved onto the first serving (band × first / predicted), i.e. how a "
                  "prediction that hit the first serving exactly would fare against the "
                  "engine's own second serving: where it says no, the engine's own run-to-run "
                  "spread is wider than the band."]
    sat_t = sat.get("timing")
    lines += ["", "timing replay (engine step durations): "
              + "; ".join(([f"saturation: {_timing_verdict(sat_t)}"] if sat_t else [])
                          + [f"load {ld['load']:g}: " + ", ".join(
                              _timing_verdict(t) for t in ld["timing"])
                             for ld in result["loads"]])]
    return "\n".join(lines)


def write_outputs(result: dict, out_dir) -> dict:
    """Write ``validation.json``, ``validation.md``, one CDF PNG per load and
    ``validation.html`` into ``out_dir`` atomically (:func:`simulator.report.write_files`);
    returns file name -> path.

    Raises:
        InputError: ``out_dir`` cannot be written (``--out ...``).
    """
    import base64
    import html as html_lib
    import io
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.report import write_files

    files = {}
    body = {k: v for k, v in result.items() if k != "cdf"}
    files["validation.json"] = json.dumps(body, indent=1).encode()
    md = markdown_table(result)
    files["validation.md"] = md.encode()
    imgs = []
    for c in result.get("cdf", []):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, m in zip(axes, ("ttft_ms", "tpot_ms", "e2el_ms")):
            for side, style in (("measured", "-"), ("predicted", "--")):
                v = np.sort(np.asarray(c[f"{side}_{m}"], dtype=float))
                if v.size:
                    ax.step(v, np.arange(1, v.size + 1) / v.size, style, where="post",
                            label=side)
            ax.set_xlabel(m.replace("_ms", " (ms)").upper())
            ax.set_ylabel("CDF")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"load {c['load']:g} of saturation: measured (engine) vs predicted")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        files[f"cdf_load_{c['load']:g}.png"] = buf.getvalue()
        imgs.append(base64.b64encode(buf.getvalue()).decode())
    esc = html_lib.escape
    meta = "".join(f"<tr><th>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>"
                   for k, v in result["meta"].items())
    rows = []
    for line in md.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [x.strip() for x in line.strip("|").split("|")]
            tag = "th" if cells[0] == "load" else "td"
            rows.append("<tr>" + "".join(f"<{tag}>{esc(x)}</{tag}>" for x in cells) + "</tr>")
    other = [x for x in md.splitlines() if x and not x.startswith("|")]
    html = ("<!doctype html><meta charset='utf-8'><title>servesim validation</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;"
            "border-bottom:1px solid #ddd;text-align:left}</style>"
            f"<h1>Validation: {esc(str(result['meta']['scenario']))}</h1><table>{meta}</table>"
            + "".join(f"<p>{esc(x)}</p>" for x in other)
            + f"<table>{''.join(rows)}</table>"
            + "".join(f"<p><img src='data:image/png;base64,{b}'></p>" for b in imgs))
    files["validation.html"] = html.encode()
    return write_files(out_dir, files)


def parse_loads(text: str) -> list[float]:
    """``"0.3,0.6,0.9"`` → floats.

    Raises:
        InputError: not a comma-separated list of numbers, or a load given twice (its
            workloads' seeds come from the load, so it would serve the same requests again).
    """
    try:
        loads = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise InputError(f"--loads: {text!r} is not a comma-separated list of fractions "
                         f"such as 0.3,0.6,0.9") from None
    twice = sorted({x for x in loads if loads.count(x) > 1})
    if twice:
        raise InputError(f"--loads: {', '.join(f'{x:g}' for x in twice)} given twice (each "
                         f"load's workloads are seeded by it: the same requests again; use "
                         f"--replications)")
    return loads


def cmd_validate(args) -> int:
    """``servesim validate`` (its flags: :func:`calibration.cli.add_parsers`); exit status.

    Raises:
        InputError: a bad scenario, flag or environment (one line for the CLI).
    """
    if args.scenario and args.scenario_flag:
        raise InputError("validate: give the scenario once (positional or --scenario)")
    args.scenario = args.scenario or args.scenario_flag
    if args.model_dir is not None and args.backend != "vllm":
        raise InputError("--model-dir: only with --backend vllm (servesim's engine builds "
                         "the scenario's model with random weights)")
    if not args.scenario:
        raise InputError("validate: a scenario YAML is required "
                         "(servesim validate SCENARIO --profile P)")
    try:
        return _validate_command(args)
    except InputError as e:
        flag = f"--set hardware.profile={args.profile}"
        if args.profile and flag in str(e):   # --profile goes in as that override
            raise InputError(str(e).replace(flag, f"--profile {args.profile}")) from None
        raise


def _validate_command(args) -> int:
    from simulator.scenario import load_scenario
    from simulator.sweep import with_sweep_hint
    check_folder(args.out, "--out", "validate")
    overrides = list(args.set)
    if args.profile:
        overrides.append(f"hardware.profile={args.profile}")
    try:
        sc = load_scenario(args.scenario, overrides)
    except InputError as e:   # a list given to one key: say that validate takes one value
        raise with_sweep_hint(e, overrides, "validate") from None
    loads = parse_loads(args.loads)   # bad flags first, whatever is installed
    check_validation_args(sc, loads, args.replications, args.seconds, args.saturation_requests)
    if args.backend == "servesim":
        from .cli import require_torch
        require_torch()
    if args.backend == "vllm":
        from .vllm import commands
        commands.QUIET_WAIT = not args.no_quiet_wait
        result = commands.validate_vllm(sc, loads, args.replications,
                               seconds_per_load=args.seconds,
                               saturation_requests=args.saturation_requests,
                               front_end=args.front_end, model_dir_arg=args.model_dir,
                               again=args.serve_again)
        result.pop("engine_object")
        paths = write_outputs(result, args.out)
        print(markdown_table(result))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
        return 0
    result = validate(sc, loads, args.replications,
                      seconds_per_load=args.seconds,
                      saturation_requests=args.saturation_requests,
                      front_end=args.front_end, quiet=not args.no_quiet_wait,
                      host_speed=not args.no_host_speed, again=args.serve_again)
    paths = write_outputs(result, args.out)
    print(markdown_table(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
