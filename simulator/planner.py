"""Capacity planning: sweeps, maximum rate under SLO, replica sizing, plan comparison.

* :func:`~simulator.sweep.sweep` (re-exported here): the cross product of ``--set
  key=v1,v2,...`` values; a table and latency–throughput curves.
* :func:`plan`: for each candidate (cross product of ``plan.candidates``), the maximum
  arrival rate per replica meeting every SLO (:mod:`simulator.search`), the replicas
  needed for a target rate, cost per hour and per million output tokens, and the cheapest
  feasible plan, whose replica count is then confirmed by simulating the whole deployment
  behind its router (N meets the SLOs, N − 1 does not).
* :func:`compare`: the same workload through several scenarios.

Every job runs on one executor (:mod:`simulator.executors`); results do not depend on which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from .errors import InputError, Refused
from .executors import Job
from .metrics import combine_replications, summary_at
from .search import (SearchResult, _worst_slo, drive, evaluate, max_rate_search,
                     run_generator, with_rate)
from .sweep import (SweepResult, _fmt_value, _point_overrides, _run, derive, grid,
                    knees, split_sets, sweep, unset)


# == candidates and plans ==================================================================

@dataclass
class Candidate:
    """One plan candidate: its key-path values and scenario (``error`` when it cannot run,
    e.g. the model does not fit)."""

    values: dict[str, Any]
    scenario: Any = None
    error: str | None = None
    price_per_replica_hour: float | None = None
    cost_kind: str | None = None
    cost_label: str | None = None
    setup_warning: str | None = None

    @property
    def label(self) -> str:
        """The candidate's values as ``key=value`` pairs (the last part of each key)."""
        return ", ".join(f"{k.split('.')[-1]}={_fmt_value(v)}" for k, v in self.values.items()) \
            or "scenario as given"


def default_efficiency_note(candidates) -> str | None:
    """Why a ranking of GPUs or tensor_parallel degrees may be off (None when neither is
    one): candidates on two or more GPUs, every one priced by the roofline at the default
    efficiencies (:data:`simulator.cost_model.DEFAULT_MBU`,
    :data:`~simulator.cost_model.DEFAULT_MFU`), which take every GPU to reach the same share
    of its peaks; or two or more projected tensor_parallel degrees, priced at one share
    whatever a shard's matmul size."""
    from .cost_model import DEFAULT_MBU, DEFAULT_MFU

    ran = [c for c in candidates if c.scenario is not None and c.error is None]
    gpus = {c.scenario.hardware.profile for c in ran}
    tps = {c.scenario.hardware.tensor_parallel for c in ran
           if (c.cost_label or "").startswith("projected")}
    notes = []
    if len(gpus) >= 2 and all("default efficiencies" in (c.cost_label or "") for c in ran):
        notes.append(f"the GPUs ({', '.join(sorted(gpus))}) are ranked by a roofline "
                     f"projection that takes each to reach the same share of its peaks (MBU "
                     f"{DEFAULT_MBU:g}, MFU {DEFAULT_MFU:g}); real kernels reach different "
                     f"shares on different GPUs, so the ratios between GPUs are projections "
                     f"too: a profile calibrated on each (servesim calibrate) ranks them on "
                     f"measured step costs")
    if len(tps) >= 2:
        notes.append(f"tensor_parallel {', '.join(map(str, sorted(tps)))} are projected at "
                     f"the same share of each GPU's peaks, though a shard's smaller matmuls "
                     f"usually reach less of it: the higher degrees' step times are likely "
                     f"optimistic (a profile measured at each degree prices them)")
    return "; ".join(notes) or None


def expand_candidates(scenario) -> list[Candidate]:
    """The cross product of ``plan.candidates`` applied to ``scenario``.

    Prices: ``plan.prices[gpu]`` sets ``hardware.price_per_gpu_hour`` unless the scenario or
    the candidate sets it. A candidate whose cost model cannot be built (no room for a KV
    cache, ...) or whose settings vLLM refuses together
    (:class:`~simulator.errors.Refused`) is kept with its ``error``.

    Raises:
        InputError: the first candidate's error when no candidate can run; a candidate key
            or value the schema refuses (names ``plan.candidates``),
            a ``plan.prices`` key that is neither a catalog GPU nor a candidate's profile,
            or a ``hardware.profile`` that is neither a catalog GPU nor a readable
            calibration profile (names the key and the known GPUs): a typo, not a plan
            that does not fit.
    """
    from .cost_model import build_cost_model

    cfg = scenario.plan
    axes = cfg.candidates if cfg else {}
    out = []
    try:
        points = grid(axes, parse=False)   # typed by the scenario's YAML already
    except ValueError as e:
        raise scenario.error("plan.candidates", f"the candidates make {e}") from None
    for key in axes:   # a --set value the candidates would replace unseen
        flag = scenario.set_by(key)
        if flag:
            raise InputError(f"--set {flag}: plan.candidates gives {key} its values, which "
                             f"replace this one in every candidate; change "
                             f"plan.candidates.{key} instead")
    gpus = list(dict.fromkeys(str(p["hardware.profile"]) for p in points
                              if "hardware.profile" in p))
    if len(gpus) > 1 and scenario.hardware.price_per_gpu_hour is not None \
            and "hardware.price_per_gpu_hour" not in axes:
        # One price for GPUs of different prices would rank them by their speed alone.
        raise scenario.error("hardware.price_per_gpu_hour", (
            f"one price for every GPU the candidates try ({', '.join(gpus)}): give each "
            f"its price in plan.prices (e.g. plan.prices: {{{gpus[0]}: "
            f"{scenario.hardware.price_per_gpu_hour:g}}}), or leave it out for the "
            f"catalog's"), depends=("plan.candidates",))
    used = gpus or [str(scenario.hardware.profile)]
    both = [g for g in used if cfg and g in cfg.prices]
    if both and scenario.hardware.price_per_gpu_hour is not None \
            and "hardware.price_per_gpu_hour" not in axes:   # one would be dropped unseen
        raise scenario.error("hardware.price_per_gpu_hour", (
            f"{scenario.hardware.price_per_gpu_hour:g} and plan.prices.{both[0]} "
            f"({cfg.prices[both[0]]:g}) both price {both[0]}: give one"),
            depends=("plan.prices",))
    first_error, refused = None, False
    for point in points:
        try:
            sc = derive(scenario, _point_overrides(point))
        except Refused as e:   # kept with its error, as a candidate that does not fit
            out.append(Candidate(point, e.scenario, error=e.detail))
            refused = True
            first_error = first_error or InputError(_candidate_error(scenario, point, str(e)))
            continue
        except InputError as e:
            raise InputError(_candidate_error(scenario, point, str(e))) from None
        gpu = sc.hardware.profile
        if gpu is not None:
            where = (_candidate_where(scenario, "hardware.profile", point)
                     if "hardware.profile" in point else None)
            _check_profile(gpu, sc, "hardware.profile", where)
        if (cfg and gpu in cfg.prices and sc.hardware.price_per_gpu_hour is None
                and "hardware.price_per_gpu_hour" not in point):
            sc = derive(sc, [f"hardware.price_per_gpu_hour={cfg.prices[gpu]}"])
        # its values are the plan's, not flags the user typed: later notes (a KV cache
        # larger than the GPU holds) must not name them as --set flags
        sc._origins = {o: f for o, f in sc._origins.items() if ".".join(o) not in point}
        c = Candidate(point, sc)
        try:
            cm = build_cost_model(sc)
            sc.scheduler_config(cm.num_gpu_blocks)
        except InputError as e:
            c.error = getattr(e, "detail", None) or str(e).split(": ", 1)[-1]
            first_error = first_error or e
        else:
            c.price_per_replica_hour = cm.price_per_replica_hour
            c.cost_label = cm.label
            c.setup_warning = cm.setup_warning
            c.cost_kind = cm.label.split(":", 1)[0]
        out.append(c)
    _check_prices(scenario, {c.scenario.hardware.profile for c in out})
    if all(c.error for c in out):   # nothing to plan with: the input is at fault (as sweep)
        if not axes or (len(out) == 1 and refused):   # its own error names its values
            raise first_error
        raise InputError(f"{_candidate_where(scenario)}: no candidate can run ("
                         f"{out[0].label}: {out[0].error}"
                         + ("; nor can the other candidates)" if len(out) > 1 else ")"))
    return out


def _check_prices(scenario, profiles: set) -> None:
    """Refuse a ``plan.prices`` key that is neither a catalog GPU nor a profile some
    candidate runs on: a misspelt name would leave the catalog price in force unseen."""
    from .catalog import list_hardware

    prices = scenario.plan.prices if scenario.plan else {}
    for gpu in prices:
        if gpu not in profiles and gpu not in list_hardware():
            used = ", ".join(sorted(p for p in profiles if p is not None)) or "none"
            raise scenario.error(f"plan.prices.{gpu}", (
                f"{gpu!r} is neither a catalog GPU ({', '.join(list_hardware())}) nor a "
                f"profile a candidate runs on (hardware.profile: {used})"))


def _candidate_where(scenario, key: str | None = None, point: dict | None = None) -> str:
    """``<file>:LINE: plan.candidates[.<key>[.<index>]]`` for one candidate key (and the
    index of ``point``'s value in its list), the line from the scenario's YAML; ``--set
    <flag>: ...`` when a flag gave the candidates."""
    from .files import yaml_line
    from .sweep import _parse

    path: list = ["plan", "candidates"]
    if key is not None:
        path.append(key)
        if point is not None:
            vals = scenario.plan.candidates.get(key, [])
            idx = next((i for i, v in enumerate(vals) if _parse(v) == point[key]
                        and type(_parse(v)) is type(point[key])), None)
            if idx is not None:
                path.append(idx)
    dotted = ".".join(map(str, path))
    flag = scenario.set_by(path)
    if flag:
        return f"--set {flag}: {dotted}"
    text = scenario._text
    line = yaml_line(text, path) if text is not None else None
    return f"{scenario.source}{f':{line}' if line else ''}: {dotted}"


def _candidate_error(scenario, point: dict, err: str) -> str:
    """The one-line error of a candidate the schema refuses, from ``err``, the error of
    :func:`derive` (``--set <key>=<value>: ...`` when one candidate value is at fault)."""
    flags = dict(zip(_point_overrides(point), point))
    for flag, key in flags.items():
        head = f"--set {flag}: "
        if err.startswith(head):
            msg = err[len(head):]
            if msg.startswith("unknown key"):   # wrong in itself, whichever its values
                return f"{_candidate_where(scenario, key)}: {msg}"
            if "(got " not in msg:   # a flag shows the value; the file's line does not
                msg += f" (got {point[key]!r})"
            return f"{_candidate_where(scenario, key, point)}: {msg}"
    # a combination (e.g. max_num_batched_tokens < max_num_seqs): no one value is at fault
    msg = err.split(": ", 1)[-1]
    return f"{_candidate_where(scenario)} ({', '.join(flags)}): {msg}"


def _check_profile(name: str, sc, key: str, where: str | None = None) -> None:
    """Raise InputError ``<file>: <key>: ...`` (or ``<where>: ...`` when given, a
    candidate's place) unless ``name`` is a catalog GPU or a calibration profile that
    loads."""
    from .catalog import list_hardware
    from .cost_model import hardware_profile_error, load_profile

    if name in list_hardware():
        return
    try:
        load_profile(name, sc.base_dir)
    except InputError as e:
        msg = hardware_profile_error(name, e)
        raise (InputError(f"{where}: {msg}") if where else sc.error(key, msg)) from None


def replicas_needed(target_rate: float, per_replica_rate: float) -> int | None:
    """``ceil(target / per-replica rate)`` (None when the per-replica rate is 0)."""
    if not per_replica_rate:
        return None
    return max(1, math.ceil(target_rate / per_replica_rate - 1e-9))


def cost_figures(replicas: int, price_per_replica_hour: float | None, target_rate: float,
                 mean_output_tokens: float | None) -> dict:
    """Cost of ``replicas`` replicas serving ``target_rate`` req/s.

    Returns:
        ``cost_per_hour`` = replicas × price per replica-hour (USD) and
        ``cost_per_million_output_tokens`` = cost per hour / (target rate × mean output
        tokens × 3600) × 1e6 (USD); None where a price or token count is unknown.
    """
    if price_per_replica_hour is None:
        return {"cost_per_hour": None, "cost_per_million_output_tokens": None}
    per_hour = replicas * price_per_replica_hour
    per_m = (per_hour / (target_rate * mean_output_tokens * 3600.0) * 1e6
             if mean_output_tokens else None)
    return {"cost_per_hour": per_hour, "cost_per_million_output_tokens": per_m}


def _cluster(scenario, replicas: int, rate: float):
    """``replicas`` replicas at total ``rate``, with requests and warm-up requests scaled
    so that each replica sees as many of both as the one-replica search did."""
    wl = scenario.workload
    n = (wl.num_requests or 0) * replicas
    sc = with_rate(scenario, rate)
    sc = sc.model_copy(update={
        "cluster": sc.cluster.model_copy(update={"replicas": replicas}),
        "workload": sc.workload.model_copy(update={"num_requests": n or None}),
        "sim": sc.sim.model_copy(update={
            "warmup_requests": sc.sim.warmup_requests * replicas})})
    return sc


def _per_replica(scenario):
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(
        update={"replicas": 1})})


@dataclass
class PlanRow:
    """One candidate's outcome (figures in req/s, USD, ms)."""

    candidate: Candidate
    search: SearchResult | None = None
    replicas: int | None = None
    replicas_ci95: tuple[int | None, int | None] | None = None
    confirmed: bool = False
    confirmation: list[dict] = field(default_factory=list)
    operating: dict | None = None
    costs: dict = field(default_factory=dict)
    costs_ci95: dict = field(default_factory=dict)
    mean_output_tokens: float | None = None
    beyond_max_replicas: int | None = None   # replicas the target needs, past the cap
    # a deployment of this many missed where the estimate was at most that: the count
    # shown (one more) is a lower bound, not an estimate that meets the SLOs
    refuted: int | None = None

    @property
    def feasible(self) -> bool:
        """Whether the candidate meets every SLO at some rate and has a replica count."""
        return bool(self.search and self.search.max_rate > 0 and self.replicas)


@dataclass
class PlanResult:
    """Result of :func:`plan`: ``rows`` per candidate, ``best`` the cheapest feasible row
    (None when none is), ``target_rate`` in req/s."""

    target_rate: float
    rows: list[PlanRow]
    best: PlanRow | None


def _candidate_search(c: Candidate, target: float, kw: dict, max_replicas: int):
    """Generator: max-rate search of one candidate, then its operating point (target /
    replicas per replica), judged as the search judges a rate: a miss there (another run
    near the max rate, within the search's noise) costs one more replica, up to
    ``max_replicas``, so that the latencies a row shows meet the SLOs its count claims."""
    sc = _per_replica(c.scenario)
    res = yield from max_rate_search(sc, **kw)
    row = PlanRow(c, res)
    n = replicas_needed(target, res.max_rate)
    if n is None:
        return row
    ev = None
    while n <= max_replicas:
        ev = yield from evaluate(with_rate(sc, target / n), **kw)
        if ev.feasible:
            break
        n, ev = n + 1, None
    row.replicas = n
    lo, hi = res.ci95
    most = replicas_needed(target, lo) if lo else None
    row.replicas_ci95 = (replicas_needed(target, hi) if hi else None,
                         max(most, n) if most else None)
    if ev is not None:
        _set_operating(row, [o["exact"] for o in ev.outputs])
    _set_costs(row, target)
    return row


def _set_operating(row: PlanRow, sums: list[dict]) -> None:
    """``row``'s operating figures from its runs' exact figures (job outputs' ``exact``),
    unrounded: the plan's cells round them once."""
    row.operating = combine_replications(sums, rounded=False)
    toks = [s["total_output_tokens"] / s["completed"] for s in sums if s.get("completed")]
    row.mean_output_tokens = float(np.mean(toks)) if toks else None


def _set_costs(row: PlanRow, target: float) -> None:
    price = row.candidate.price_per_replica_hour
    row.costs = cost_figures(row.replicas, price, target, row.mean_output_tokens)
    lo_n, hi_n = row.replicas_ci95 or (None, None)
    row.costs_ci95 = {k: [cost_figures(lo_n, price, target, row.mean_output_tokens)[k]
                          if lo_n else None,
                          cost_figures(hi_n, price, target, row.mean_output_tokens)[k]
                          if hi_n else None] for k in row.costs}


def _needs_more_than(row: PlanRow, limit: int, target: float) -> None:
    """``row``'s deployment missed the SLOs at every count up to ``limit``: its replica CI
    starts just above ``limit`` (what the deployment showed; the estimate's own lower end
    is one replica's, which a router's pooling can undercut), its upper end opens where it
    fell below, and an estimate at or below ``limit`` is refuted: the count becomes
    ``limit + 1``, a lower bound (``refuted`` = ``limit``), and the operating point
    (``target`` / estimate per replica, a count that misses) is dropped; costs follow."""
    hi = (row.replicas_ci95 or (None, None))[1]
    lo = limit + 1
    row.replicas_ci95 = (lo, hi if hi is None or hi >= lo else None)
    if limit + 1 > row.replicas:
        row.replicas, row.operating, row.refuted = limit + 1, None, limit
    _set_costs(row, target)


def confirm_replicas(scenario, target: float, start: int, *, max_replicas: int = 64,
                     min_replications: int = 2, max_replications: int = 5,
                     tolerance: float = 0.02, capacity: float | None = None):
    """Generator: the fewest replicas meeting every SLO at ``target`` req/s behind the
    scenario's router, starting from the estimate ``start``: up while infeasible, down
    while N − 1 is feasible; None past ``max_replicas`` (an estimate beyond it is not
    simulated). ``capacity``: one replica's saturation-probe steady throughput (req/s),
    N times which bounds the rates N replicas keep up with, as it bounds one replica's
    in the search (:func:`~simulator.search.evaluate`; without it 3 replicas of capacity
    10 req/s can pass at 31 req/s on runs whose draws come slow). Returns ``(N or None,
    [{replicas, feasible, confident, unstable, mean_ratio, ci95}], RateEval at N or
    None)``."""
    kw = dict(min_replications=min_replications, max_replications=max_replications,
              tolerance=tolerance)
    tried: dict[int, Any] = {}

    def ok(n):
        if n not in tried:
            tried[n] = yield from evaluate(_cluster(scenario, n, target), **kw,
                                           capacity=n * capacity if capacity else None)
        return tried[n].feasible

    n = start
    if n > max_replicas:
        return None, [], None
    while not (yield from ok(n)):
        n += 1
        if n > max_replicas:
            return None, _trail(tried), None
    while n > 1 and (yield from ok(n - 1)):
        n -= 1
    return n, _trail(tried), tried[n]


def _confirmed_interval(n: int, trail: list[dict]) -> tuple[int, int]:
    """95% interval of a confirmed replica count: ``[n, n]`` when both "n meets the SLOs"
    and "n − 1 does not" were decided by their confidence intervals; a side decided by
    the indifference zone or the replication cap widens by one replica."""
    by_n = {t["replicas"]: t for t in trail}
    below = by_n.get(n - 1)
    lo = n if n == 1 or (below is not None and below["confident"]) else n - 1
    hi = n if by_n[n]["confident"] else n + 1
    return lo, hi


def _trail(tried):
    return [{"replicas": n, "feasible": e.feasible, "confident": e.confident,
             "unstable": e.unstable, "mean_ratio": e.mean_ratio, "ci95": e.ci95}
            for n, e in sorted(tried.items())]


#: Fewest counted requests per run (workload.num_requests less sim.warmup_requests) that
#: :func:`plan` judges a rate from (fewer are refused), and below which a sweep's points are
#: noted as unreliable.
MIN_PLAN_REQUESTS = 100


def plan(scenario, executor, *, target_rate: float | None = None,
         progress: Callable[[int], None] | None = None, confirm: bool = True) -> PlanResult:
    """Size every candidate of ``scenario.plan`` for ``target_rate`` and pick the cheapest.

    Steps:

    1. Search every candidate's max rate per replica, all in lock-step with common random
       numbers (the same seeds for every candidate).
    2. Estimate replicas = ceil(target / max rate); run the operating point at
       target / replicas per replica (latency figures with 95% CIs), one more replica
       while it misses the SLOs; price it.
    3. With ``confirm``, from the cheapest estimate up, confirm each candidate's replica
       count by simulating the deployment (:func:`confirm_replicas`): a router's pooling
       can need far fewer than the estimate, below its CI (which is one replica's). After
       the first, a candidate is tried only at fewer replicas than would cost as much as
       the cheapest confirmed plan. One that fails keeps its estimate (``confirmed``
       False), its replica CI starting above the count tried.
    4. At equal cost the most capacity (replicas × max rate per replica) is confirmed
       first, then the fewest replicas; the first confirmed of equal cost is the plan.

    Args:
        target_rate: req/s for the whole deployment (default ``plan.target_rate``).
        confirm: run the deployment-level confirmation.

    Raises:
        InputError: no target rate, a bad candidate, a workload without arrival rate, or
            one of fewer than :data:`MIN_PLAN_REQUESTS` counted requests.
    """
    from .scenario import PlanConfig

    cfg = scenario.plan or PlanConfig()
    target = target_rate or cfg.target_rate
    # a workload without an arrival rate first: no target rate would make it plannable
    with_rate(scenario, 1.0)
    if not target:
        raise scenario.error("plan.target_rate", "give the rate to serve (here or with "
                                                 "--target-rate)")
    from .policy.request import MAX_TIME_NS, NS_PER_S

    n = scenario.workload.num_requests
    if n and n / target >= MAX_TIME_NS / NS_PER_S:   # the operating point's arrivals
        msg = (f"{target:g} req/s spreads {n} arrivals over more than the 4.6e9 s a run "
               f"can hold")
        raise (InputError(f"--target-rate: {msg}") if target_rate
               else scenario.error("plan.target_rate", msg))
    kw = dict(min_replications=cfg.min_replications, max_replications=cfg.max_replications,
              tolerance=cfg.tolerance)
    cands = expand_candidates(scenario)
    n, warm = scenario.workload.num_requests, scenario.sim.warmup_requests   # n: None, a trace
    if n is not None and n - warm < MIN_PLAN_REQUESTS:
        # a handful never fills the queue: a rate far past capacity "keeps up" (10 requests
        # plan 0.76 req/s per H100 replica for chat, where 400 plan 11.8)
        raise scenario.error(
            "workload.num_requests", f"plan judges each rate it tries from {n - warm} "
            f"request{'s' if n - warm != 1 else ''}"
            + (f" ({n} less sim.warmup_requests {warm})" if warm else "")
            + f"; a maximum rate needs at least {MIN_PLAN_REQUESTS}, and a few hundred give "
            "steadier figures", depends=("sim.warmup_requests",) if warm else ())
    gens = {i: _candidate_search(c, target, kw, cfg.max_replicas)
            for i, c in enumerate(cands) if c.error is None}
    found = drive(gens, executor, progress)
    rows = [found.get(i) or PlanRow(c) for i, c in enumerate(cands)]

    def cost(r):
        # At equal cost (TP1 x 4 and TP2 x 2 on one GPU type), the deployment with the most
        # capacity (replicas x max rate per replica: the most headroom over the target),
        # then the fewest replicas.
        capacity = (r.replicas or 0) * (r.search.max_rate if r.search else 0.0)
        return (r.costs.get("cost_per_hour") if r.costs.get("cost_per_hour") is not None
                else math.inf, -capacity, r.replicas or 0)

    def beyond(r):   # an estimate beyond the largest deployment considered is no plan
        r.beyond_max_replicas = r.replicas
        r.replicas = r.replicas_ci95 = None
        r.costs, r.costs_ci95 = {}, {}

    for r in rows:
        # One replica's estimate past plan.max_replicas is still a deployment to simulate
        # at plan.max_replicas (a router pools replicas: M/D/1 at 12 req/s, estimated 3 of
        # 4.7 req/s each, met its SLO at 2), unless even replicas at the probe's capacity
        # would need more.
        if r.replicas is not None and r.replicas > cfg.max_replicas and (
                not confirm or (replicas_needed(target, r.search.steady or r.search.capacity)
                                or math.inf) > cfg.max_replicas):
            beyond(r)
    feasible = sorted((r for r in rows if r.feasible), key=cost)
    best = None
    if confirm:
        # Every candidate is simulated as a deployment (a router pools replicas, so the
        # count confirmed is often well below the estimate, and below its CI: that CI is
        # of one replica's max rate); one after the first only at fewer replicas than
        # would cost as much as the best.
        for r in feasible:
            limit, price = cfg.max_replicas, r.candidate.price_per_replica_hour
            if best is not None:
                if price:
                    limit = min(limit, math.ceil(cost(best)[0] / price) - 1)
                if limit < 1:
                    continue
            n, trail, at_n = run_generator(confirm_replicas(
                r.candidate.scenario, target, min(r.replicas, limit), max_replicas=limit,
                capacity=r.search.steady, **kw), executor)
            r.confirmation = trail
            if n is None:
                if best is None and r.replicas > cfg.max_replicas:
                    beyond(r)   # neither the estimate nor max_replicas deployed meets them
                elif best is None:   # no deployment up to max_replicas meets the SLOs
                    r.replicas = None
                else:              # not cheaper than the best: it needs more than `limit`
                    _needs_more_than(r, limit, target)
                continue
            r.replicas, r.confirmed = n, True
            r.replicas_ci95 = _confirmed_interval(n, trail)
            _set_operating(r, [o["exact"] for o in at_n.outputs])   # the deployment itself
            _set_costs(r, target)
            if best is None or cost(r) < cost(best):
                best = r
        for r in feasible:   # left unsimulated (dearer than the plan) past the cap
            if not r.confirmed and r.replicas is not None and r.replicas > cfg.max_replicas:
                beyond(r)
    elif feasible:
        best = feasible[0]
    return PlanResult(target, rows, best)


def _best_status(row: PlanRow) -> str:
    """The chosen row's status: ``cheapest feasible``, or ``best feasible`` where it has no
    price (an inline step time, a CPU profile): priced rows rank first, so every feasible
    row is then unpriced and the pick is by capacity (replicas × max rate per replica), then
    the fewest replicas."""
    return ("cheapest feasible" if row.candidate.price_per_replica_hour is not None
            else "best feasible")


def plan_table(result: PlanResult) -> pd.DataFrame:
    """One row per candidate: values, max rate per replica (+ 95% CI), replicas (+ CI;
    ``confirmed``: True/False when the deployment was simulated at that count, None when
    it was not: infeasible, or one replica costs as much as the cheapest), cost per hour and per
    million output tokens (+ CI), operating-point TTFT and TPOT p99 (+ CI) and every
    statistic an SLO names (``e2el_p99_ms``, ``ttft_p50_ms``, + CI; their column names in
    ``table.attrs["slo_columns"]``), ``operating_replications`` (the runs behind those
    figures and CIs), cost kind, status.

    A ``*_ci95`` cell is ``[lo, hi]``, ``None`` where there is no interval (one
    replication, no max rate), or has one end ``None`` where the rate search bounded the
    max rate on one side only (the replica and cost ends that follow from the other side
    are then open). The TTFT/TPOT CIs are Student t intervals from
    :func:`simulator.metrics.combine_replications`, whose lower end is clipped at 0: these
    latencies cannot be negative. Rates, replicas and costs cannot be either; no CI here
    is clipped for any other reason."""
    rows = []
    for r in result.rows:
        c = r.candidate
        s = r.search
        op = r.operating or {}
        d = dict(c.values)
        d.update({
            "max_rate_per_replica": s.max_rate if s else None,
            "max_rate_ci95": list(s.ci95) if s else None,
            "replicas": r.replicas, "replicas_ci95": list(r.replicas_ci95)
            if r.replicas_ci95 else None,
            # None: never simulated as a deployment (infeasible, or one replica costs as
            # much as the cheapest)
            "confirmed": r.confirmed if r.confirmation else None,
            "cost_per_hour": r.costs.get("cost_per_hour"),
            "cost_per_hour_ci95": r.costs_ci95.get("cost_per_hour"),
            "cost_per_million_output_tokens": r.costs.get("cost_per_million_output_tokens"),
            "cost_per_million_output_tokens_ci95":
                r.costs_ci95.get("cost_per_million_output_tokens"),
            "ttft_p99_ms": summary_at(op, ("ttft_ms", "p99", "mean")),
            "ttft_p99_ci95": summary_at(op, ("ttft_ms", "p99", "ci95")),
            "tpot_p99_ms": summary_at(op, ("tpot_ms", "p99", "mean")),
            "tpot_p99_ci95": summary_at(op, ("tpot_ms", "p99", "ci95")),
            # runs behind the operating figures: with 2, a CI spans ±12.7 standard errors
            "operating_replications": summary_at(op, ("ttft_ms", "p99", "n")),
            "cost_kind": c.cost_kind,
            "status": (c.error or (s.note if s and s.max_rate == 0 else None)
                       or (_beyond_text(r, result.target_rate)
                           if r.beyond_max_replicas else None)
                       or (f"needs more than {r.refuted} replicas (a deployment of "
                           f"{r.refuted} missed the SLOs; more would cost as much as the "
                           f"plan: not simulated)" if r.refuted else None)
                       or (_best_status(r) if r is result.best else
                           "feasible" if r.feasible else "infeasible")),
        })
        rows.append(d)
    # the statistics the SLOs name (E2EL p99, TTFT p50, ...), beside TTFT and TPOT p99:
    # the scenario's (a column even where no candidate ran to an operating point)
    names = {}
    sc = result.rows[0].candidate.scenario if result.rows else None
    for m, st, _ in (sc.slo.targets() if sc is not None and sc.slo else []):
        names.setdefault(f"{m.removesuffix('_ms')}_{st}", (m, st))
    for r in result.rows:
        for m, stats in ((r.operating or {}).get("slo") or {}).items():
            for st in stats:
                names.setdefault(f"{m.removesuffix('_ms')}_{st}", (m, st))
    slo_cols = []
    for name, (m, st) in names.items():
        slo_cols.append(f"{name}_ms")
        if f"{name}_ms" in rows[0]:
            continue
        for d, r in zip(rows, result.rows):
            v = ((((r.operating or {}).get("slo") or {}).get(m) or {}).get(st) or {}).get(
                "value") or {}
            d[f"{name}_ms"], d[f"{name}_ci95"] = v.get("mean"), v.get("ci95")
    table = pd.DataFrame(rows)
    if len(table):   # the SLO columns beside the other latencies, before cost_kind
        cols = [c for c in table.columns if c not in ("cost_kind", "status")]
        table = table[cols + ["cost_kind", "status"]]
    table.attrs["slo_columns"] = slo_cols
    for key in (result.rows[0].candidate.values if result.rows else ()):
        # as given: a null beside 4096 would turn the column into floats (4096.0)
        table[key] = pd.Series([r.candidate.values[key] for r in result.rows], dtype=object)
    if len(table):   # counts stay integers beside a missing one (4, not 4.0)
        for col in ("replicas", "operating_replications"):
            table[col] = pd.Series([None if unset(v) else int(v)
                                    for v in table[col]], dtype=object)
    return table


def closest_miss(result: PlanResult) -> dict | None:
    """When no candidate meets every SLO, the one that came closest; None when a plan was
    found or no candidate ran to a finite SLO figure.

    A candidate that met the SLOs on one replica but whose deployment (up to
    ``plan.max_replicas`` replicas) did not comes before any that never met them; ties
    and the rest are ranked by the lowest mean worst-SLO ratio (value / threshold, as
    in :func:`simulator.search.slo_ratio`) among its stable evaluations, then by table
    order.

    Returns:
        ``{"row": PlanRow, "per_replica": bool`` (met on one replica), ``"ratio"``
        (worst SLO value / threshold; inf when the target needs more than
        ``plan.max_replicas`` replicas), ``"rate"`` (req/s: per replica, or the target for
        a deployment), ``"replicas"`` (deployment size, or the estimate past
        ``plan.max_replicas``; 1 for a per-replica run),
        ``"slo"``, ``"value"``, ``"threshold"`` (the worst SLO's name, mean value and
        threshold, ms or count; None when unknown), and for a deployment ``"unstable"``
        (a run's backlog grew)``}``.
    """
    if result.best is not None:
        return None
    found = []
    for i, r in enumerate(result.rows):
        if r.search is None:
            continue
        met = r.search.max_rate > 0
        if met and r.beyond_max_replicas:   # among these, the fewest replicas
            found.append(((0, math.inf, r.beyond_max_replicas, i), {
                "row": r, "per_replica": True, "ratio": math.inf,
                "rate": result.target_rate, "replicas": r.beyond_max_replicas,
                "slo": None, "value": None, "threshold": None}))
            continue
        if met and r.confirmation:
            t = min(r.confirmation, key=lambda c: (c["mean_ratio"], c["replicas"]))
            if math.isfinite(t["mean_ratio"]):
                found.append(((0, t["mean_ratio"], i), {
                    "row": r, "per_replica": True, "ratio": t["mean_ratio"],
                    "rate": result.target_rate, "replicas": t["replicas"],
                    "slo": None, "value": None, "threshold": None,
                    "unstable": t["unstable"]}))
            continue
        evals = [e for e in r.search.evaluations
                 if not e.unstable and not e.feasible and math.isfinite(e.mean_ratio)]
        if not evals:
            continue
        e = min(evals, key=lambda e: (e.mean_ratio, e.rate))
        slo, value, thr = _worst_slo(e.outputs) or (None, None, None)
        found.append(((1, e.mean_ratio, i), {
            "row": r, "per_replica": False, "ratio": e.mean_ratio, "rate": e.rate,
            "replicas": 1, "slo": slo, "value": value, "threshold": thr}))
    return min(found, key=lambda f: f[0])[1] if found else None


def _met_above(row, rate: float) -> float | None:
    """The rate at which one replica of ``row`` met the SLOs when it is at least ``rate``
    (so lighter loads per replica are what miss), else None."""
    top = row.search.max_rate if row.search else None
    return top if top and top >= rate else None


def _beyond_text(row, target: float) -> str:
    """Status of a row whose count passed ``plan.max_replicas``: the count one replica's
    max rate says it needs, or, where one replica met the SLOs at a rate above the
    target's (so every count up to the cap was simulated and missed: the count is the cap
    + 1), that lighter loads per replica miss (:func:`closest_text`)."""
    top = _met_above(row, target)
    if top:
        return (f"misses at every count up to plan.max_replicas "
                f"({row.beyond_max_replicas - 1}) although one replica meets the SLOs at "
                f"{top:.3g} req/s: latency rises as load falls")
    return (f"needs {_count(row.beyond_max_replicas)} replicas (> plan.max_replicas"
            + (", whose deployment was simulated and missed" if _cap_missed(row)
               else "") + ")")


def _cap_missed(row) -> bool:
    """Whether ``row``'s confirmation simulated a deployment of plan.max_replicas (its
    largest count tried) and it missed the SLOs."""
    trail = row.confirmation or []
    return bool(trail) and not any(t["feasible"] for t in trail)


def _count(n: int) -> str:
    """A replica count as people read it: ``1,234``; past a billion, 3 significant
    figures (``3.14e+45``) rather than hundreds of digits (Decimal: past ~1.8e308 a float
    overflows)."""
    from decimal import Decimal
    return f"{n:,}" if n < 10**9 else f"{Decimal(n):.3g}"


def closest_text(miss: dict, max_replicas: int) -> str:
    """One sentence on :func:`closest_miss`'s candidate, e.g. ``closest: profile=h100-sxm,
    max_num_seqs=64, which misses at every rate tried (0 req/s in the table); at 1.25 req/s
    per replica: TTFT p99 35.2 ms against an SLO of 1 ms (35.2x the SLO)``."""
    from .report import fmt_number

    label = miss["row"].candidate.label
    top = _met_above(miss["row"], miss["rate"])
    if miss["per_replica"] and math.isinf(miss["ratio"]) and top:
        # one replica met the SLOs at a load above the target's, yet no count of replicas
        # did at the lighter loads the target leaves each: latency rises as load falls
        return (f"closest: {label} meets every SLO on one replica at "
                f"{fmt_number(top, 3)} req/s, but no deployment of up to {max_replicas} "
                f"replicas did at {miss['rate']:g} req/s: its latency rises as the load per "
                f"replica falls (a profile's wake-up after idle prices the first step of an "
                f"idle replica higher), so more replicas do not help; see `servesim run` "
                f"at this rate for the diagnosis")
    if miss["per_replica"] and math.isinf(miss["ratio"]):
        return (f"closest: {label} meets every SLO on one replica up to "
                f"{fmt_number(miss['row'].search.max_rate, 3)} req/s, but "
                f"{miss['rate']:g} req/s needs about {_count(miss['replicas'])} "
                f"replicas, more than plan.max_replicas ({max_replicas})"
                + (f"; a deployment of {max_replicas} was simulated and missed"
                   if _cap_missed(miss["row"]) else ""))
    if miss["per_replica"]:
        return (f"closest: {label} meets every SLO on one replica, but no deployment of up "
                f"to {max_replicas} replicas did at {fmt_number(miss['rate'], 3)} req/s "
                f"(best: {miss['replicas']} replicas, worst SLO at "
                f"{fmt_number(miss['ratio'], 3)}x its threshold"
                + (" in its stable runs; a run's backlog grew" if miss.get("unstable") else "")
                + ")")
    what = "worst SLO"
    if miss["slo"]:
        metric, stat = miss["slo"].split(" ", 1)
        unit = " ms" if metric.endswith("_ms") else ""
        name = metric.removesuffix("_ms").upper() if unit else metric
        what = (f"{name} {stat} {fmt_number(miss['value'], 3)}{unit} against an SLO of "
                f"{fmt_number(miss['threshold'], 3)}{unit}")
    # its table row says 0 req/s (no rate met the SLO); this is the nearest miss
    return (f"closest: {label}, which misses at every rate tried (0 req/s in the table); "
            f"at {fmt_number(miss['rate'], 3)} req/s per replica: {what} "
            f"({fmt_number(miss['ratio'], 3)}x the SLO)")


# == compare ===============================================================================

def _cost_per_hour(scenario) -> float | None:
    """USD per hour of ``scenario``'s replicas (:attr:`CostModel.price_per_replica_hour`
    × replicas), None without a price (an inline step time, a CPU profile)."""
    from .cost_model import build_cost_model

    price = build_cost_model(scenario).price_per_replica_hour
    return None if price is None else price * scenario.cluster.replicas


def compare(scenarios: list, executor, *, progress=None) -> list[dict]:
    """Serve the first scenario's workload and SLO through every scenario.

    Returns:
        Per scenario ``{"name", "scenario", "result"`` (replication 0's RunResult),
        ``"replications"`` (:func:`combine_replications` of the runs' exact figures,
        unrounded, or None), ``"slo_met"`` (met in
        every replication; None without SLOs), ``"stability"`` (:func:`stability_label`
        of every replication: stable only when each is), ``"cost_per_hour"`` (USD for its
        replicas, from the GPU's price; None without one)``}``.
    """
    from .executors import job_output
    from .sweep import stability_label

    base = scenarios[0]
    scs = [sc if i == 0 else sc.serving(base) for i, sc in enumerate(scenarios)]
    jobs = [Job(sc, k, full=True) for sc in scs for k in range(sc.sim.replications)]
    outs = _run(jobs, executor, progress)
    res, i = [], 0
    for sc in scs:
        n = sc.sim.replications
        group = outs[i:i + n]
        i += n
        met = [g.summary.get("slo_met") for g in group]
        judged = [job_output(g) for g in group]
        stable = all(o["stable"] for o in judged)
        steady = all(o.get("steady", True) for o in judged)
        rejected = float(np.mean([g.summary.get("rejected") or 0 for g in group]))
        res.append({"name": sc.name, "scenario": sc, "result": group[0],
                    # unrounded, from the runs' exact figures: each shown figure rounds once
                    "replications": combine_replications([o["exact"] for o in judged],
                                                         rounded=False) if n > 1 else None,
                    "slo_met": None if None in met else all(met),
                    "stability": stability_label(stable, rejected, steady),
                    "cost_per_hour": _cost_per_hour(sc)})
    names = [r["name"] for r in res]
    for r in res:
        if names.count(r["name"]) > 1:
            r["name"] = f"{r['name']} ({r['scenario'].source})"
    return res


__all__ = ["Candidate", "PlanResult", "PlanRow", "SweepResult", "closest_miss", "closest_text",
           "compare", "confirm_replicas", "cost_figures", "derive", "expand_candidates", "grid",
           "knees", "plan", "plan_table", "replicas_needed", "split_sets", "sweep"]
