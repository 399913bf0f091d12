"""Maximum arrival rate at which every SLO is met, by bisection.

The search is written as generators that *yield* lists of :class:`~simulator.executors.Job`
and receive their outputs, so a driver (:func:`drive`) can run the searches of many
candidates in lock-step and hand each round's jobs to one executor in parallel.

Statistics (all per rate tried):

* Replication ``k`` uses the same seed at every rate and for every candidate (common random
  numbers): arrivals at rate ``r`` are the same standard draws scaled by ``1/r``, so two
  candidates or two rates differ only by what changed, not by sampling noise.
* Each replication yields its *SLO ratio*: the largest ``value / threshold`` over the SLO
  entries (met when <= 1). A run whose queue grows (achieved throughput below 0.98 ×
  offered, :data:`~simulator.executors.STABLE_FRACTION`, over the window of
  :func:`~simulator.executors.window_rates`, and a backlog that rises significantly over
  the run, :func:`~simulator.executors.backlog_grows`) is flagged *unstable* and the rate
  fails; its latencies are not averaged. Above the saturation probe's steady throughput
  (by more than ``tolerance``) the achieved throughput alone decides it.
* With ``n`` stable replications the mean ratio has a Student t 95% interval. A rate is
  decided *confidently* when that interval lies below 1 (feasible) or above it
  (infeasible). Otherwise replications are added up to ``max_replications``; when the mean
  lies within the indifference zone ``1 ± tolerance``, or the cap is reached, the sign of
  the mean decides, and the decision is marked not confident.
* Bisection (geometric midpoints) stops when ``hi / lo <= 1 + tolerance``. The reported
  maximum rate is ``lo``, a rate found feasible; its 95% interval runs from the highest
  confidently feasible rate to the lowest confidently infeasible one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

import numpy as np

from .executors import Job, over_capacity
from .metrics import t_interval

#: Arrival rate of the saturation probe, requests/s: effectively all requests at once.
PROBE_RATE = 1.0e6
_MAX_HALVINGS = 8
_MAX_DOUBLINGS = 6


def with_rate(scenario, rate: float):
    """``scenario`` with ``workload.arrival.rate = rate`` (req/s); other keys unchanged.

    Raises:
        InputError: the workload has no open-loop arrival rate (trace or closed loop), has
            sessions (the rate starts conversations, not requests) or a client-side
            ``max_concurrency``.
    """
    wl = scenario.workload
    arrival = getattr(wl, "arrival", None)
    if getattr(wl, "trace", None) is not None:   # blamed on the key the file has
        raise scenario.error("workload.trace", "a rate search needs an open-loop arrival "
                             "process with a rate (poisson, gamma or constant); a trace's "
                             "arrivals are its own (workload.trace.time_scale stretches "
                             "them)")
    if getattr(wl, "sessions", None) is not None:
        # The rate starts conversations whose later turns wait for think times: with a fixed
        # number of requests, a higher rate only packs the starts closer, and the run's
        # request rate stops following it (195 "req/s" serves 3).
        raise scenario.error("workload.sessions", "a rate search sets the arrival rate of "
                             "single requests; with sessions it starts conversations whose "
                             "turns follow think times, so the requests per second do not "
                             "follow it: size a multi-turn workload with servesim run or "
                             "sweep (they report the request rate served)")
    if getattr(wl, "max_concurrency", None) is not None:
        # the client holds what the engine cannot take: every rate looks sustained
        raise scenario.error("workload.max_concurrency", "a rate search finds the request "
                             "rate the engine sustains; a client-side max_concurrency holds "
                             "back what it cannot take, so every rate would pass: remove "
                             "it to plan")
    if arrival is None or not hasattr(arrival, "rate"):
        raise scenario.error("workload.arrival", "a rate search needs an open-loop arrival "
                             "process with a rate (poisson, gamma or constant)")
    new_wl = wl.model_copy(update={"arrival": arrival.model_copy(update={"rate": float(rate)})})
    return scenario.model_copy(update={"workload": new_wl})


def worst_slo(summary: dict) -> dict | None:
    """The run's SLO entry furthest past its threshold: ``{metric, stat, value, threshold,
    ratio}`` (value and threshold in the SLO's unit, ms or a count; ratio = value /
    threshold, ``inf`` when the value is missing and not met (nothing completed) or when a
    zero-threshold entry such as rejected requests is exceeded). ``None`` without SLO or
    when every entry is met with no value (a statistic over no samples, e.g. TPOT when every
    request has one output token: :func:`simulator.metrics._evaluate_slo`)."""
    worst = None
    for m, entries in (summary.get("slo") or {}).items():
        for st, e in entries.items():
            v, thr = e.get("value"), e["threshold"]
            if v is None and e.get("met"):
                continue
            ratio = (math.inf if v is None or (thr == 0 and v > 0)
                     else v / thr if thr else 0.0)
            if worst is None or ratio > worst["ratio"]:
                worst = {"metric": m, "stat": st, "value": v, "threshold": thr,
                         "ratio": ratio}
    return worst


def slo_ratio(summary: dict) -> float:
    """Largest ``value / threshold`` over the run's SLO entries (<= 1: all met); 0 without
    SLO; ``inf`` when a figure is missing and not met (nothing completed) or requests were
    rejected (:func:`worst_slo`)."""
    worst = worst_slo(summary)
    return 0.0 if worst is None else worst["ratio"]


@dataclass
class RateEval:
    """Outcome of the replications at one rate.

    Attributes:
        rate: offered rate, requests/s (per replica for a one-replica scenario).
        feasible: every SLO met (and every run stable).
        confident: decided by the 95% interval (or by instability), not by the
            indifference zone or the replication cap.
        unstable: whether a run's queue grew (:func:`simulator.executors.job_output`).
        ratios: SLO ratio of each stable replication (from its exact figures).
        mean_ratio, ci95: mean SLO ratio and its Student t 95% interval (None for n = 1).
        outputs: the job outputs (:func:`~simulator.executors.job_output`).
    """

    rate: float
    feasible: bool
    confident: bool
    unstable: bool
    ratios: list[float]
    mean_ratio: float
    ci95: tuple[float, float] | None
    outputs: list[dict] = field(repr=False)

    @property
    def n(self) -> int:
        """Replications run at this rate."""
        return len(self.outputs)


def _interval(x: list[float]) -> tuple[float, float] | None:
    if not all(math.isfinite(v) for v in x):
        return None
    return t_interval(x)   # ratios are >= 0: the lower bound stays >= 0


def evaluate(scenario, *, min_replications: int = 2, max_replications: int = 5,
             tolerance: float = 0.02, capacity: float | None = None
             ) -> Generator[list[Job], list, RateEval]:
    """Replicate ``scenario`` (at its own rate) until feasibility is decided.

    ``capacity`` (req/s, the saturation probe's steady throughput): a run whose arrivals
    exceed it by more than ``tolerance`` and that falls behind them is unstable, and so is
    a rate asked for (the scenario's) past it (:func:`simulator.executors.over_capacity`).

    Yields lists of jobs, receives their outputs; returns a :class:`RateEval`.
    """
    rate = float(scenario.workload.arrival.rate)

    def stable(o: dict) -> bool:
        return o["stable"] and not over_capacity(o, capacity, tolerance, nominal=rate)

    outs: list[dict] = []
    n = min_replications
    while True:
        new = yield [Job(scenario, k) for k in range(len(outs), n)]
        outs.extend(new)
        if not all(stable(o) for o in outs):
            ratios = [slo_ratio(o["exact"]) for o in outs if stable(o)]
            # a backlog's trend alone cannot tell a queue growing a few % from noise: below
            # the probe's bound its verdict is not a confident one (the max rate's CI reaches
            # past it; M/D/1 of capacity 10: 8.78 decided at 8.88 by the trend alone)
            sure = capacity is None or any(over_capacity(o, capacity, tolerance, nominal=rate)
                                           for o in outs)
            return RateEval(rate, False, sure, True, ratios,
                            float(np.mean(ratios)) if ratios else math.inf, None, outs)
        ratios = [slo_ratio(o["exact"]) for o in outs]
        m = float(np.mean(ratios))
        ci = _interval(ratios)
        if ci is not None and ci[1] <= 1.0:
            return RateEval(rate, True, True, False, ratios, m, ci, outs)
        if (ci is not None and ci[0] > 1.0) or m == math.inf:
            return RateEval(rate, False, True, False, ratios, m, ci, outs)
        if abs(m - 1.0) <= tolerance or n >= max_replications:
            return RateEval(rate, m <= 1.0, False, False, ratios, m, ci, outs)
        n += 1


@dataclass
class SearchResult:
    """Maximum rate under the SLOs for one scenario (requests/s).

    Attributes:
        max_rate: highest rate found feasible (0 when none is).
        bracket: ``(lo, hi)``: ``lo`` feasible, ``hi`` infeasible (``hi`` None when no
            infeasible rate was found).
        ci95: ``(highest confidently feasible, lowest confidently infeasible)`` rate;
            either end None when no such rate was tried.
        capacity: achieved throughput of the saturation probe (all requests at once).
        steady: the probe's steady throughput, the bound on the rates a run keeps up with
            (:func:`simulator.executors.steady_throughput`; None: the burst did not keep
            every replica saturated long enough to bound anything).
        evaluations: every :class:`RateEval`, in the order tried.
        at_max: the :class:`RateEval` at ``max_rate`` (None when infeasible).
        note: why the search ended early, if it did.
    """

    max_rate: float
    bracket: tuple[float, float | None]
    ci95: tuple[float | None, float | None]
    capacity: float | None
    evaluations: list[RateEval]
    at_max: RateEval | None
    note: str = ""
    steady: float | None = None


#: Why vLLM rejects a request, and what to do (the plan's notes on rejecting candidates).
REJECTED_WHY = ("(prompts of engine.max_model_len tokens or more): raise engine.max_model_len "
                "or shorten the prompts")


def max_rate_search(scenario, *, min_replications: int = 2, max_replications: int = 5,
                    tolerance: float = 0.02) -> Generator[list[Job], list, SearchResult]:
    """Bisection for the maximum arrival rate of ``scenario`` meeting every SLO.

    A saturation probe (one replication at :data:`PROBE_RATE`) gives the capacity, the
    first upper guess, and its steady throughput, above which a run that falls behind its
    arrivals is unstable (:func:`evaluate`); the bracket is then widened (doubling / halving)
    until one rate is feasible and one is not, and bisected to ``hi / lo <= 1 + tolerance``.
    Yields lists of jobs, receives their outputs; returns a :class:`SearchResult`.

    Raises:
        InputError: the workload has no arrival rate (:func:`with_rate`).
    """
    probe = (yield [Job(with_rate(scenario, PROBE_RATE), 0)])[0]
    cap = probe["summary"].get("request_throughput")
    kw = dict(min_replications=min_replications, max_replications=max_replications,
              tolerance=tolerance, capacity=probe.get("steady_throughput"))
    evals: list[RateEval] = []

    def ev(rate):
        e = yield from evaluate(with_rate(scenario, rate), **kw)
        evals.append(e)
        return e

    def result(lo, hi, note=""):
        feas = [e.rate for e in evals if e.feasible and e.confident]
        infeas = [e.rate for e in evals if not e.feasible and e.confident]
        at = next((e for e in evals if e.rate == lo and e.feasible), None)
        return SearchResult(lo, (lo, hi), (max(feas) if feas else None,
                                           min(infeas) if infeas else None),
                            cap, evals, at, note, probe.get("steady_throughput"))

    if not cap:
        why = (f": every request is rejected {REJECTED_WHY}"
               if probe["summary"].get("rejected") else "")
        return result(0.0, None, "nothing completed at saturation" + why)
    lo, hi = None, cap
    e = yield from ev(hi)
    if e.feasible:
        lo, hi = hi, None
        for _ in range(_MAX_DOUBLINGS):
            e = yield from ev(lo * 2)
            if not e.feasible:
                hi = e.rate
                break
            lo = e.rate
        if hi is None:
            return result(lo, None, "feasible at every rate tried; upper bound not found")
    else:
        prev = e
        for _ in range(_MAX_HALVINGS):
            e = yield from ev(hi / 2)
            if e.feasible:
                lo = e.rate
                break
            # Halving the load no longer helps: the SLO is out of reach at any rate.
            if not e.unstable and not prev.unstable and e.mean_ratio >= 0.99 * prev.mean_ratio:
                hi = e.rate
                return result(0.0, hi, "SLO not met even at low load" + _miss_note(e))
            hi, prev = e.rate, e
        if lo is None:
            return result(0.0, hi, "SLO not met even at low load" + _miss_note(e))
    while hi / lo > 1.0 + tolerance:
        mid = math.sqrt(lo * hi)
        e = yield from ev(mid)
        if e.feasible:
            lo = mid
        else:
            hi = mid
    return result(lo, hi)


def _miss_note(e: RateEval) -> str:
    """Why the lowest rate tried, ``e``, misses: what requests served alone get where that
    already misses an SLO (first replication), else its growing backlog, its rejected
    requests, or the SLO furthest from its threshold (:func:`_worst_slo`) at that rate."""
    from .alone import below_floor
    from .metrics import METRIC_LABELS

    out = e.outputs[0]
    missed = below_floor(out["summary"], out.get("alone_ms") or {})
    if missed:
        return "".join(f"; {METRIC_LABELS[m]} {st} of requests served alone {fl:.4g} ms > "
                       f"{thr:g} ms: only faster steps meet it" for m, st, thr, _, fl in missed)
    if e.unstable:
        return f"; at {e.rate:.3g} req/s the backlog still grows"
    rejected = float(np.mean([o["summary"].get("rejected") or 0 for o in e.outputs]))
    if rejected:   # an SLO entry of its own (threshold 0) that no lower rate meets
        one = rejected == 1
        return (f"; at {e.rate:.3g} req/s {rejected:g} request{'' if one else 's'} per run "
                f"{'is' if one else 'are'} rejected {REJECTED_WHY}")
    worst = _worst_slo(e.outputs)
    if worst is None:
        return ""
    key, value, thr = worst
    metric, stat = key.split(" ", 1)
    unit = " ms" if metric.endswith("_ms") else ""
    return (f"; at {e.rate:.3g} req/s {METRIC_LABELS.get(metric, metric)} {stat} "
            f"{value:.4g}{unit} > {thr:g}{unit}")


def _worst_slo(outputs: list[dict]) -> tuple[str, float, float] | None:
    """The SLO furthest from its threshold over ``outputs``' exact figures, by mean
    value / threshold: ``(\"<metric> <stat>\", mean value, threshold)`` (ms or a count)."""
    worst, where = None, None
    keys = {(m, st) for o in outputs for m, e in (o["exact"].get("slo") or {}).items()
            for st in e}
    for m, st in sorted(keys):
        vals = [o["exact"]["slo"][m][st] for o in outputs]
        if any(v.get("value") is None or not v["threshold"] for v in vals):
            continue
        value = float(np.mean([v["value"] for v in vals]))
        ratio = value / vals[0]["threshold"]
        if worst is None or ratio > worst:
            worst, where = ratio, (f"{m} {st}", value, float(vals[0]["threshold"]))
    return where


def drive(searches: dict[Any, Generator], executor,
          progress: Callable[[int], None] | None = None) -> dict[Any, Any]:
    """Run job-yielding generators in lock-step: each round collects every generator's
    pending jobs, runs them as one batch on ``executor``, and sends each its outputs.

    Returns:
        key -> the generator's return value.
        ``progress(jobs_done)`` is called after each round.
    """
    pending: dict[Any, list[Job]] = {}
    results: dict[Any, Any] = {}
    gens = dict(searches)
    for k, g in gens.items():
        try:
            pending[k] = next(g)
        except StopIteration as stop:
            results[k] = stop.value
    done = 0
    while pending:
        batch = [(k, j) for k, jobs in pending.items() for j in jobs]
        outs = executor.run([j for _, j in batch])
        done += len(batch)
        by_key: dict[Any, list] = {k: [] for k in pending}
        for (k, _), o in zip(batch, outs):
            by_key[k].append(o)
        pending = {}
        for k, o in by_key.items():
            try:
                pending[k] = gens[k].send(o)
            except StopIteration as stop:
                results[k] = stop.value
        if progress:
            progress(done)
    return results


def run_generator(gen: Generator, executor):
    """Drive one job-yielding generator to its return value."""
    return drive({0: gen}, executor)[0]


__all__ = ["PROBE_RATE", "RateEval", "SearchResult", "drive", "evaluate",
           "max_rate_search", "run_generator", "slo_ratio", "with_rate"]
