"""Scenario grids and sweeps: ``--set key=v1,v2,...`` values, their cross product, and
one run (× replications) per point, with a table and the knee of each curve.

Every point × replication is one :class:`~simulator.executors.Job`; all of a sweep's jobs
go to the executor as one batch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import yaml

from .errors import InputError, Refused
from .executors import Job, over_capacity, unbounded_warning
from .files import load_yaml
from .scenario import given_twice, split_override
from .metrics import combine_replications, summary_at


# == deriving scenarios ====================================================================

def derive(scenario, overrides: list[str], overrides_cwd=None):
    """``scenario`` with ``key.path=value`` overrides applied and revalidated
    (``overrides_cwd``: see :func:`simulator.scenario.scenario_from_dict`).

    Raises:
        InputError: as :func:`simulator.scenario.scenario_from_dict` (names the ``--set``).
    """
    from .scenario import scenario_from_dict

    if not overrides:
        return scenario
    raw = scenario.model_dump(mode="python", exclude_none=True)
    sc = scenario_from_dict(raw, scenario.base_dir, overrides=list(overrides),
                            source=scenario.source, overrides_cwd=overrides_cwd,
                            text=scenario._text)   # an error names the file's line
    # Keys the parent's file or flags gave keep their line or flag in later errors.
    sc._origins = {**scenario._origins, **sc._origins}
    sc._text = scenario._text
    return sc


def split_sets(sets: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split ``--set`` flags into plain overrides and sweep axes.

    A value with top-level commas (``workload.arrival.rate=1,2,4``) is a list of sweep
    values; a YAML flow collection (``slo.ttft_ms={p99: 500, mean: 200}``) or a single
    value is a plain override.

    Returns:
        ``(plain overrides, {key: [value strings]})``, axes in flag order.

    Raises:
        InputError: a malformed flag, an empty value in a list, a value that is not
            valid YAML, a value given twice in one list, a key given twice (swept or
            not), or a mapping and a key inside it that it gives or that came first
            (:func:`simulator.scenario.split_override`).
    """
    plain, axes = [], {}
    seen: dict = {}   # checked in flag order, as run's flags (split_override)
    for s in sets:
        k = ".".join(p.strip() for p in s.partition("=")[0].strip().split("."))
        split_override(s, seen, f"; sweep values go in one flag: {k}=v1,v2,...")
        v = s.partition("=")[2].strip()
        if v.startswith(("[", "{")) or "," not in v:
            plain.append(s)
            continue
        vals = [x.strip() for x in v.split(",")]
        if not all(vals):
            raise InputError(f"--set {s}: empty value in the list (use v1,v2,...)")
        read = []   # as YAML reads them: 4 and 4.0 are one point (True and 1 are not)
        for x in vals:
            try:
                read.append(_parse(x))
            except yaml.YAMLError as e:
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise InputError(f"--set {s}: value {x!r} is not valid YAML: "
                                 f"{problem}") from None
        twice = given_twice(vals, read, "sweep point")
        if twice is not None:
            raise InputError(f"--set {s}: {twice}")
        axes[k] = vals
    return plain, axes


def with_sweep_hint(err: InputError, overrides: list[str], command: str) -> InputError:
    """``err`` (a scenario load error of ``servesim <command>``) with a hint when the flag
    it names holds several values where the key takes one: a comma-separated list, which
    only ``servesim sweep`` (and ``plan.candidates``) read as several values, or a
    bracketed list of scalars (``rate=[4,8]``), which is one value, a list, everywhere;
    ``err`` itself otherwise."""
    msg = str(err)
    for s in overrides:
        key, _, v = (x.strip() for x in s.partition("="))
        if not msg.startswith(f"--set {s}:") or "value is not valid YAML" in msg:
            continue
        listed = _scalar_list(v) if "Input should be a valid" in msg else None
        if listed is not None and command == "sweep":
            return InputError(f"{msg}; sweep values are written without brackets: "
                              f"{key}={listed}")
        commas = command != "sweep" and "," in v and not v.startswith(("[", "{"))
        values = listed or (v if commas else None)
        if values:
            where = {"plan": "servesim sweep, or list them in plan.candidates",
                     "validate": "one servesim validate per value"}.get(command,
                                                                       "servesim sweep")
            return InputError(f"{msg}; servesim {command} takes one value per key: to run "
                              f"each of {values} use {where}")
    return err


def _scalar_list(v: str) -> str | None:
    """``"4,8"`` for the flag value ``"[4, 8]"`` (a YAML list of two or more scalars);
    None for anything else."""
    if not v.startswith("["):
        return None
    try:
        items = load_yaml(v)
    except yaml.YAMLError:
        return None
    if not isinstance(items, list) or len(items) < 2 or any(
            isinstance(x, (list, dict)) or x is None for x in items):
        return None
    return ",".join(_fmt_value(x) for x in items)


def _parse(v):
    return load_yaml(v) if isinstance(v, str) else v


def _fmt_value(v) -> str:
    # A string is dumped too: YAML quotes the ones that would read back as something else
    # ("4" stays the string '4' and is refused by the schema, not run as the number 4).
    v = _plain(v)   # a NumPy scalar from a table as Python's
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


#: Most points one sweep or plan crosses (each is at least one whole simulation).
MAX_GRID_POINTS = 10_000


def grid(axes: dict[str, list], parse: bool = True) -> list[dict[str, Any]]:
    """Cross product of ``axes`` (first axis varies slowest), string values parsed as YAML
    (as typed on the command line) unless ``parse`` is False (values read from a YAML file
    already: a quoted '64' stays the string the schema refuses, not the number 64).

    Raises:
        ValueError: more than :data:`MAX_GRID_POINTS` points (the message counts them).
    """
    n = math.prod(len(v) for v in axes.values())
    if n > MAX_GRID_POINTS:
        raise ValueError(f"{n:,} points ({' × '.join(str(len(v)) for v in axes.values())} "
                         f"values); at most {MAX_GRID_POINTS:,} in one run: split it")
    keys = list(axes)
    return [dict(zip(keys, (_parse(v) if parse else v for v in combo)))
            for combo in itertools.product(*(axes[k] for k in keys))]


def _point_overrides(point: dict) -> list[str]:
    return [f"{k}={_fmt_value(v)}" for k, v in point.items()]


def typed_overrides(point: dict) -> list[str]:
    """``key=value`` flags of a point of :func:`grid` (``parse=False``) over values typed
    on the command line, each as typed: an error then names ``1.5e3``, not ``1500.0``
    (values that are not strings are written as YAML)."""
    return [f"{k}={v if isinstance(v, str) else _fmt_value(v)}" for k, v in point.items()]


def _run(jobs: list[Job], executor, progress=None) -> list:
    return executor.run(jobs, progress)


# == sweep ==================================================================================

@dataclass
class SweepResult:
    """Result of :func:`sweep`.

    Attributes:
        axes: ``{key: [values]}`` swept (first axis = the x of each curve), each value
            as YAML reads it (the number 4 for ``--set key=4``).
        table: one row per point: the swept values, ``offered_rate`` (for open-loop
            conversations the request rate they build up to; None for a closed loop, which
            sends as answers come back) and
            ``request_throughput`` (req/s), ``output_throughput`` (tok/s), ``stable``
            (every replication passed the throughput test, and the saturation probe's
            bound where there is one, :func:`saturation_probes`; None where requests were
            rejected or conversations ended in their ramp, which it cannot judge),
            ``rejected`` (requests rejected per replication, mean), ``stability``
            (:func:`stability_label`), TTFT/TPOT/ITL/E2EL p50 and p99 (ms), ``goodput``,
            ``slo_met``, ``cost_kind``, ``cost_model`` (the step-cost source in full), and
            ``*_ci95`` columns (``[lo, hi]``) with replications; figures unrounded (means of the
            runs' exact figures: each shown cell rounds once). A point
            whose model and KV cache do not fit its GPU, or whose settings vLLM refuses
            together, is not run: its ``stability`` is :data:`DOES_NOT_FIT` or
            :data:`INVALID`, ``note`` says why (a column only then), its figures are
            empty.
        knees: per line (combination of the other axes), the first axis's knee
            (:func:`knees`: the highest stable rate, the concurrency where throughput
            saturates, the lowest stable value of a capacity key such as replicas):
            ``[{...other axis values, "knee": value}]`` (``None`` when there is none).
        summaries: per point, the replication summaries (none for a point not run).
        warnings: distinct cost-model warnings of the points (an engine.num_gpu_blocks
            beyond what the GPU's memory holds), then their workloads' warnings
            (:func:`point_warnings`).
        met_at: per line, the first axis's values meeting every SLO on a stable run
            (:func:`slo_met_at`; empty without SLOs).
    """

    axes: dict[str, list]
    table: pd.DataFrame
    knees: list[dict]
    summaries: list[list[dict]] = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    met_at: list[dict] = field(default_factory=list)


_SWEEP_FIGURES = [("request_throughput",), ("output_throughput",), ("goodput",),
                  ("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"),
                  ("tpot_ms", "p99"), ("itl_ms", "p99"), ("e2el_ms", "p99"),
                  ("queue_ms", "mean")]


#: A sweep point whose model and KV cache do not fit its GPU (not run; why in ``note``).
DOES_NOT_FIT = "does not fit"

#: A sweep point whose settings vLLM refuses together (:class:`~simulator.errors.Refused`;
#: not run; why in ``note``).
INVALID = "invalid config"

#: Values of ``stability`` of the points that are not run.
NOT_RUN = (DOES_NOT_FIT, INVALID)

#: A sweep point of open-loop conversations that ended before they built up their load
#: (:func:`simulator.session_ramp.session_ramp`): too short to judge.
RAMP_ONLY = "ramp-up only"

#: Values of the sweep table's ``stability`` column.
STABILITY = ("stable", "unstable", "rejects requests", RAMP_ONLY, DOES_NOT_FIT, INVALID)


def stability_label(stable: bool, rejected: float, steady: bool = True) -> str:
    """``rejects requests`` when a run rejected any request (a prompt of
    max_model_len tokens or more, as vLLM refuses it): those never finish, so the run falls
    short of the offered rate whatever the load and the throughput test says nothing about the
    queue.
    Else :data:`RAMP_ONLY` when a run of conversations ended in its ramp (not ``steady``)
    without piling up.
    Otherwise ``stable`` or ``unstable`` as the test (:func:`simulator.executors.job_output`)
    says."""
    if rejected:
        return "rejects requests"
    if not steady and stable:   # an overload shows even in the ramp: unstable then
        return RAMP_ONLY
    return "stable" if stable else "unstable"


def sweep(scenario, axes: dict[str, list], executor, *,
          progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Run every point of the cross product of ``axes`` (``sim.replications`` each).

    Args:
        scenario: the base scenario (plain overrides already applied).
        axes: ``{key path: [values]}`` (strings are parsed as YAML).
        executor: from :func:`simulator.executors.make_executor`.

    Raises:
        InputError: a point that is not a valid scenario (names the ``--set``); a
            :class:`~simulator.errors.DoesNotFit` when no point fits its GPU.
    """
    try:
        points = grid(axes)
    except ValueError as e:
        raise InputError(f"--set: the swept values make {e}") from None
    typed = grid(axes, parse=False)
    scs, misfits = [], []
    for p in typed:
        try:
            sc = derive(scenario, typed_overrides(p), Path.cwd())   # values typed on the CLI
        except Refused as e:   # a row of its own, as a point that does not fit
            scs.append(e.scenario)
            misfits.append(e)
        else:
            scs.append(sc)
            misfits.append(_does_not_fit(sc))
    if all(misfits):   # nothing to compare a row with: the input is at fault
        first = misfits[0]
        if len(misfits) > 1:   # the first point's reason, and that no other runs either
            more = len(misfits) - 1
            raise type(first)(f"{first} (nor can the other point{'s' if more > 1 else ''} "
                              f"run)", first.detail) from None
        raise first
    runs = [sc for sc, m in zip(scs, misfits) if m is None]
    # the binding limit of each point, from its first replication (as compare's)
    jobs = [Job(sc, k, diagnose=k == 0) for sc in runs for k in range(sc.sim.replications)]
    keys, probes = saturation_probes(runs)
    outs = _run(jobs + list(probes.values()), executor, progress)
    capacity = dict(zip(probes, (o.get("steady_throughput") for o in outs[len(jobs):])))
    unbounded = sum(v is None for v in capacity.values())
    key_of = iter(keys)   # each run's probe key, in run order
    rows, per_point, burst, grids = [], [], [], []
    i = 0
    for p, sc, misfit in zip(points, scs, misfits):
        if misfit is not None:
            rows.append({**p, "stability": INVALID if isinstance(misfit, Refused)
                         else DOES_NOT_FIT, "note": misfit.detail})
            per_point.append([])
            continue
        n = sc.sim.replications
        group = outs[i:i + n]
        i += n
        cap = capacity.get(next(key_of))
        if any(o.get("start_burst") for o in group):
            burst.append(p)
        grids.append((p, [o.get("grid") for o in group]))
        sums = [o["summary"] for o in group]
        per_point.append(sums)
        exact = [o["exact"] for o in group]   # the figures shown round once, from these
        comb = combine_replications(exact, rounded=False) if n > 1 else None
        row = dict(p)
        offered = [o["offered_rate"] for o in group if o["offered_rate"]]
        # a closed loop sends as answers come back: its "offered" rate is the served one
        closed = getattr(sc.workload.arrival, "process", None) == "closed_loop"
        row["offered_rate"] = float(np.mean(offered)) if offered and not closed else None
        stable = row["stable"] = all(o["stable"] and not over_capacity(o, cap)
                                     for o in group)
        steady = all(o.get("steady", True) for o in group)
        rejected = float(np.mean([s.get("rejected") or 0 for s in sums]))
        row["rejected"] = int(rejected) if rejected.is_integer() else rejected   # a count
        row["stability"] = stability_label(stable, row["rejected"], steady)
        # rejected requests never finish, a ramp never loads: the test cannot judge them
        row["stable"] = None if row["rejected"] or (not steady and stable) else stable
        # and the statistics the SLOs name (ITL p99.9, E2EL p50, TTFT mean), as plan shows
        slo = [(m, st) for m, st, _ in (sc.slo.targets() if sc.slo else [])]
        for path in _SWEEP_FIGURES + [p for p in slo if p not in _SWEEP_FIGURES]:
            name = stat_column(*path) if len(path) > 1 else path[0]
            vals = [summary_at(s, path) for s in exact]
            vals = [v for v in vals if v is not None]
            row[name] = float(np.mean(vals)) if vals else None
            if comb is not None:
                node = summary_at(comb, path)
                row[name.removesuffix("_ms") + "_ci95"] = (node.get("ci95")
                                                            if isinstance(node, dict) else None)
        row["slo_met"] = (all(s.get("slo_met") for s in sums)
                          if sums[0].get("slo_met") is not None else None)
        row["cost_kind"] = sums[0].get("cost_kind")
        row["cost_model"] = sums[0].get("cost_model")   # in full: a swept profile or noise
        row["binding"] = group[0].get("binding")
        rows.append(row)
    ran = next(r for r in rows if r["stability"] not in NOT_RUN)
    # a row that did not run has no figures; the reason it did not, last
    table = pd.DataFrame(rows, columns=list(ran) + (["note"] if len(runs) < len(scs) else []))
    for k in axes:   # as swept: an int beside null stays an int (not 4.0 beside NaN)
        table[k] = pd.Series([p[k] for p in points], index=table.index, dtype=object)
    table["rejected"] = pd.Series([r.get("rejected") for r in rows], index=table.index,
                                  dtype=object)   # a count beside a point not run: 7, not 7.0
    keys = list(axes)
    ran = [p for p, m in zip(typed, misfits) if m is None]
    # the values as the points hold them (4, not the "4" typed on the command line)
    return SweepResult({k: [_parse(v) for v in vs] for k, vs in axes.items()}, table,
                       knees(table, keys), per_point,
                       setup_warnings(runs) + point_warnings(ran, runs)
                       + _burst_warning(burst, len(runs)) + grid_warnings(grids) + (
                           [unbounded_warning(
                               "the sweep" if len(probes) == 1 else
                               f"{unbounded} of its {len(probes)} lines (points that differ "
                               f"only in their rate)")] if unbounded else []),
                       slo_met_at(table, keys))


def saturation_probes(scenarios) -> tuple[list, dict]:
    """``(keys, {key: Job})``: each scenario's saturation probe as JSON (all its requests
    at once, :data:`simulator.search.PROBE_RATE`; the same for points that differ only in
    their rate; None without an open-loop request rate: a trace, a closed loop, sessions,
    a client-side max_concurrency), and one probe job (one replication) per distinct key.
    Its steady throughput bounds the rates a point keeps up with
    (:func:`simulator.executors.over_capacity`), as in a plan: near capacity the backlog's
    trend cannot tell a queue growing a few % from noise."""
    from .search import PROBE_RATE, with_rate
    keys, probes = [], {}
    for sc in scenarios:
        try:
            probe = with_rate(sc, PROBE_RATE)
        except InputError:
            keys.append(None)
            continue
        key = probe.model_dump_json()
        keys.append(key)
        probes.setdefault(key, Job(probe, 0))
    return keys, probes


def point_warnings(points: list[dict], scenarios) -> list[str]:
    """The workload warnings (:func:`simulator.workload.workload_warnings`) of every point
    run, each once: as is when every point has it, else after the points that do
    (``at workload.prompt_tokens.std=20: ...``; a swept key moves them)."""
    from .workload import workload_warnings

    said: dict[str, list[dict]] = {}
    checked: dict[tuple, list[str]] = {}   # points sharing a workload: a trace read once
    for p, sc in zip(points, scenarios):
        key = (sc.workload.model_dump_json(), str(sc.base_dir))
        if key not in checked:
            checked[key] = workload_warnings(sc.workload, sc.base_dir)
        for w in checked[key]:
            said.setdefault(w, []).append(p)
    return [w if len(at) == len(points) else
            "at " + "; ".join(" ".join(typed_overrides(p)) for p in at) + f": {w}"
            for w, at in said.items()]


def _burst_warning(points: list[dict], ran: int) -> list[str]:
    """The warning for the ``points`` (of ``ran`` run) whose closed loop's start burst set
    the TTFT p99 (:func:`simulator.run.start_burst_warning`, as ``run`` says it)."""
    if not points:
        return []
    where = "" if len(points) == ran else \
        "at " + "; ".join(" ".join(typed_overrides(p)) for p in points) + ": "
    return [f"{where}the closed loop's users all send their first request at 0 s, and that "
            f"burst's waits set the TTFT p99: sim.warmup_requests of at least "
            f"workload.arrival.concurrency leaves it out of the figures, as a steady state"]


def grid_warnings(points: list[tuple[dict, list]]) -> list[str]:
    """The past-the-grid warning of ``points`` run (``(point, [each replication's
    grid_excess])``), one per profile, as ``run`` says it
    (:func:`simulator.cost_model.grid_text`) with the most sequences and the longest chunks
    of the runs that went past, after those points when not every point did."""
    from .cost_model import grid_text, merged_excess

    past: dict[str, list[tuple[dict, dict]]] = {}   # profile -> (point, excess)
    for p, excesses in points:
        for e in (e for e in excesses if grid_text(e)):
            past.setdefault(e["profile"], []).append((p, e))
    out = []
    for hits in past.values():
        at = list({id(p): p for p, _ in hits}.values())   # each point once, in order
        where = "" if len(at) == len(points) else \
            "at " + "; ".join(" ".join(typed_overrides(p)) for p in at) + ": "
        out.append(where + grid_text(merged_excess([e for _, e in hits]),
                                     several=len(hits) > 1))
    return out


def _does_not_fit(sc):
    """The :class:`~simulator.errors.DoesNotFit` of a point whose model and KV cache do
    not fit its GPU (None when it does); any other error of its cost model is raised: a
    typo stops the sweep before it runs."""
    from .cost_model import build_cost_model
    from .errors import DoesNotFit

    try:
        sc.scheduler_config(build_cost_model(sc).num_gpu_blocks)
    except DoesNotFit as e:
        return e
    return None


def setup_warnings(scenarios) -> list[str]:
    """The distinct ``setup_warning`` of the scenarios' cost models
    (:class:`simulator.cost_model.CostModel`: e.g. more blocks than the GPU's memory holds), in
    order; a scenario whose cost model cannot be built adds none (its run says why)."""
    from .cost_model import build_cost_model

    out: list[str] = []
    for sc in scenarios:
        try:
            w = build_cost_model(sc).setup_warning
        except InputError:
            continue
        if w and w not in out:
            out.append(w)
    return out


#: The rate of open-loop arrivals: a sweep's knee is its highest stable value. A closed
#: loop is always stable (each user waits for its answer), so its concurrency's knee is
#: where throughput stops growing: the fewest users reaching SATURATION_SHARE of the line's
#: highest request throughput (more users past it only wait longer: Little's law at flat
#: throughput). Any other numeric key adds capacity or changes the engine (replicas,
#: max_num_seqs, blocks): its knee is the lowest stable value, the least that keeps up.
RATE, CONCURRENCY = "workload.arrival.rate", "workload.arrival.concurrency"
#: Keys whose knee is where throughput saturates: users of a closed loop, and a
#: client-side limit (each value caps what is in flight, as users do).
SATURATING = (CONCURRENCY, "workload.max_concurrency")
#: Share of a line's highest throughput that marks saturation (see :data:`RATE`). A
#: heuristic (no flag sets it): throughput nears its highest slowly, so 0.99 would put the
#: knee where noise between replications decides, 0.9 before users stop adding throughput.
SATURATION_SHARE = 0.95
#: Keys (and key prefixes, ending in ".") that change neither the load nor the capacity: a
#: sweep over them has no knee ("lowest stable workload.seed" would mean nothing).
NO_KNEE = ("workload.seed", "workload.num_requests", "slo.", "sim.")


def stat_column(metric: str, stat: str) -> str:
    """The table column of a latency statistic, the unit last as plan.csv names its
    columns: ``stat_column("ttft_ms", "p99")`` is ``ttft_p99_ms``."""
    return f"{metric.removesuffix('_ms')}_{stat}_ms"


def knee_title(key: str) -> str:
    """What a sweep's knee over ``key`` is, as printed before its value: ``highest stable
    workload.arrival.rate``, ``throughput saturates (>= 95% of the highest) at
    workload.arrival.concurrency`` or ``lowest stable cluster.replicas``."""
    if key in SATURATING:
        return f"throughput saturates (>= {SATURATION_SHARE:.0%} of the highest) at {key}"
    return f"{'highest' if key == RATE else 'lowest'} stable {key}"


def answer_title(key: str) -> str:
    """Which of the values meeting every SLO answers a sweep over ``key``
    (:func:`slo_met_at`): ``the highest``, ``the most`` users, or ``the fewest``."""
    return ("the highest" if key == RATE else "the most" if key in SATURATING
            else "the fewest")


def knees(table: pd.DataFrame, keys: list[str]) -> list[dict]:
    """Per line (other axes' values), the knee of the first axis (see :data:`RATE`): for
    the arrival rate the highest value whose ``stability`` is ``stable`` (``stable`` alone
    for a table without that column); for a closed loop's concurrency the lowest stable
    value whose ``request_throughput`` reaches :data:`SATURATION_SHARE` of the line's
    highest; for any other key the lowest stable value. A null value (unset) ranks above
    every number and is the knee ``"null"``; the knee is None where no point qualifies.
    No knees when the first axis is not numeric (a router, a GPU: "highest" means
    nothing), nor for a key of :data:`NO_KNEE` (seeds, SLO thresholds, run lengths)."""
    if not keys or table.empty:
        return []
    x, others = keys[0], keys[1:]
    if not _ordered(table, x):
        return []
    out = []
    for line, df in _lines(table, others):
        ok = df["stability"] == "stable" if "stability" in df else df["stable"].astype(bool)
        stable = df[ok]
        if x in SATURATING and len(stable):
            tput = stable["request_throughput"]
            stable = stable[tput >= SATURATION_SHARE * tput.max()]
        # null (unset: no client limit, the KV cache or max_model_len vLLM sizes) ranks
        # above every number, and is named "null" as the axis lists it (None: no knee)
        rank = stable[x].map(lambda v: math.inf if unset(v) else v)
        knee = (None if not len(stable) else
                stable[x].loc[rank.idxmax() if x == RATE else rank.idxmin()])
        out.append({**line, "knee": "null" if len(stable) and unset(knee) else _plain(knee)})
    return out


def _ordered(table: pd.DataFrame, x: str) -> bool:
    """Whether the axis ``x`` has an answer: numeric values (not a router, a GPU: "highest"
    means nothing there) of a key outside :data:`NO_KNEE`."""
    if any(x == k or (k.endswith(".") and x.startswith(k)) for k in NO_KNEE):
        return False
    return all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in table[x].dropna().tolist())


def _lines(table: pd.DataFrame, others: list[str]):
    """``({other axis: value}, rows)`` per line of a sweep table: per combination of the
    axes after the first, in the table's order (one line without other axes)."""
    groups = table.groupby(others, sort=False, dropna=False) if others else [((), table)]
    for _, df in groups:   # the values as swept (the group key turns null into NaN)
        yield {k: _plain(df[k].iloc[0]) for k in others}, df


def unset(v) -> bool:
    """Whether a swept or candidate value is null (None, or the NaN a table made of it)."""
    return v is None or v != v


def _plain(v):
    """A numpy scalar as the Python value (JSON-ready); anything else as it is."""
    return getattr(v, "item", lambda: v)()


def slo_met_at(table: pd.DataFrame, keys: list[str]) -> list[dict]:
    """Per line (other axes' values), the values of the first axis whose point is stable
    and meets every SLO, in the table's order, and the one that answers the sweep:
    ``[{...other axis values, "met_at": [values], "answer": value}]``; empty for a table
    without SLOs. The answer is the highest rate, the most users of a closed loop or client
    limit (:data:`SATURATING`), and for any other numeric key (replicas, max_num_seqs,
    blocks: capacity) the fewest (null, unset, ranking above every number); None where no
    value meets them, and for a key with no order (a router, a GPU) or one of
    :data:`NO_KNEE` (seeds, SLO thresholds)."""
    if not keys or table.empty or "slo_met" not in table or table["slo_met"].isna().all():
        return []
    x, others = keys[0], keys[1:]
    ordered = _ordered(table, x)
    out = []
    for line, df in _lines(table, others):
        ok = (df["stability"] == "stable") & (df["slo_met"] == True)  # noqa: E712 (None)
        met = [_plain(v) for v in df.loc[ok, x]]
        answer = None
        if met and ordered:
            most = x == RATE or x in SATURATING
            answer = (max if most else min)(met, key=lambda v: math.inf if unset(v) else v)
        out.append({**line, "met_at": met, "answer": answer})
    return out


__all__ = ["CONCURRENCY", "DOES_NOT_FIT", "INVALID", "NOT_RUN", "RAMP_ONLY", "RATE",
           "SATURATION_SHARE", "SATURATING", "STABILITY", "SweepResult", "answer_title",
           "derive", "grid", "grid_warnings", "knee_title", "knees", "point_warnings",
           "setup_warnings", "slo_met_at", "split_sets", "stability_label", "stat_column",
           "sweep", "unset"]
