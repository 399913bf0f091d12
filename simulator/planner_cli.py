"""``servesim sweep | plan | compare`` (registered by :func:`add_parsers`)."""

from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError, Refused
from .files import check_folder, out_folder
from .executors import EXECUTORS, unbounded_warning
from .session_ramp import RAMP_TEXT
from .planner import MIN_PLAN_REQUESTS
from .sweep import _fmt_value, answer_title, knee_title, stat_column, unset
from .workload import MAX_RATE

#: Most local worker processes: each holds a simulator (hundreds of MB); past this a
#: number is a typo, not a machine.
MAX_WORKERS = 1024


def _executor_args(p: argparse.ArgumentParser, out: str) -> None:
    """The executor flags and ``--out``, whose help gives ``out``, the default folder."""
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: process pool over all cores (default); ray: a Ray cluster; "
                        "serial: this process")
    p.add_argument("--workers", type=int,
                   help=f"local processes (default: all cores; 1 to {MAX_WORKERS})")
    p.add_argument("--ray-address", help="ray.init(address=...) (default: local / RAY_ADDRESS)")
    p.add_argument("--out", help=f"output folder (default {out})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


@contextmanager
def _progress(args, what: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .terminal import Terminal

    console = Terminal(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True,
                  disable=args.quiet or not console.is_terminal) as bar:
        task = bar.add_task(what, total=None)

        def update(done, total=None):
            bar.update(task, completed=done, total=total)
        yield update


def _executor(args):
    from .executors import make_executor

    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise InputError(f"--workers: 1 to {MAX_WORKERS} processes, got {args.workers}")
    # a flag the chosen executor would ignore: the user meant another executor
    if args.ray_address is not None and args.executor != "ray":
        raise InputError(f"--ray-address: only with --executor ray (this run's executor: "
                         f"{args.executor})")
    if args.workers is not None and args.executor != "local":
        raise InputError(f"--workers: only with --executor local (this run's executor: "
                         f"{args.executor})")
    return make_executor(args.executor, workers=args.workers, address=args.ray_address)


# Terminal headers: short enough that a plan or sweep table fits 80 columns.
_LABELS = {"max_rate_per_replica": "req/s per replica", "replicas": "replicas",
           "cost_per_hour": "USD/h", "cost_per_hour_ci95": "USD/h 95% CI",
           "ttft_p99_ms": "TTFT p99 ms", "offered_rate": "offered req/s",
           "request_throughput": "served req/s", "ttft_p50_ms": "TTFT p50 ms",
           "tpot_p50_ms": "TPOT p50 ms", "tpot_p99_ms": "TPOT p99 ms",
           "slo_met": "SLO met", "tensor_parallel": "TP", "max_num_seqs": "max seqs",
           "max_num_batched_tokens": "max batched tokens", "goodput": "goodput req/s",
           "binding": "binding (rules)", "gpus": "GPUs", "capped": "output cut"}

#: Said under a sweep's or compare's binding column: a run of the same scenario also tries
#: the knobs and can name another limit.
RULES_NOTE = ("binding (rules): the diagnosis's rules on each point's first replication; "
              "servesim run also tries the knobs in counterfactual runs and can name another")


def _label(column: str) -> str:
    """Header for a column: a swept key shows its last part (``engine.max_num_seqs`` ->
    ``max seqs``), known figures their short name."""
    stat = re.fullmatch(r"(ttft|tpot|itl|e2el|queue)_(.+)_ms", str(column))
    if column not in _LABELS and stat:   # an SLO's statistic: e2el_p99.9_ms -> E2EL p99.9 ms
        return f"{stat[1].upper()} {stat[2]} ms"   # (its dot is no key path's)
    last = str(column).rsplit(".", 1)[-1]
    return _LABELS.get(column, _LABELS.get(last, last))


def _short(v, cents: bool = False) -> str:
    """A terminal cell: 3 significant figures in positional notation
    (:func:`simulator.report.fmt_number`; with ``cents``, two decimals: costs that differ
    by cents must not read alike), a 95% CI as ``lo–hi``, ``≤hi`` / ``≥lo`` when only
    one end is known, ``–`` when none is, a missing value as ``-``."""
    import math

    from .planner_report import _cell
    from .report import fmt_number

    if isinstance(v, (list, tuple)) and len(v) == 2:
        lo, hi = (None if x is None or (isinstance(x, float) and math.isnan(x)) else x
                  for x in v)
        if lo is None and hi is None:
            return "–"
        if lo is None:
            return f"≤{_short(hi, cents)}"
        if hi is None:
            return f"≥{_short(lo, cents)}"
        return f"{_short(lo, cents)}–{_short(hi, cents)}"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int, float)) and cents:
        return f"{v:.2f}"
    if isinstance(v, float):
        return fmt_number(v, 3)
    return _cell(v)


_STATUS = {"cheapest feasible": "cheapest", "best feasible": "best", "feasible": "ok",
           "infeasible": "fails SLO"}
# Terminal words for the sweep's stability column; sweep.csv keeps the full label.
_STABILITY = {"rejects requests": "rejects", "does not fit": "no fit",
              "ramp-up only": "ramp-up", "invalid config": "invalid"}
_CI_NOTES = {"–": "– in a 95% CI column: no interval (one replication, or no rate to "
                  "bound)",
             "≤": "≤x or ≥x: only one end of the 95% CI is known (the rate search bounded "
                  "the max rate on one side only, or a deployment showed only how many "
                  "replicas are too few)"}


def _header(column: str) -> str:
    """A column header folded one word per line, so a column is as narrow as its values
    (``engine.max_model_len`` -> ``max/model/len``)."""
    return _label(column).replace("_", " ").replace(" ", "\n")


def _print_table(df, title: str, columns=None, console=None, exact=()) -> None:
    """Print ``df``'s ``columns`` as a compact table that fits 80 columns: one-word
    header lines, one space between columns, numbers by :func:`_short` except in the
    ``exact`` columns (swept or candidate settings: as ``--set`` takes them, so that a
    point reads as the value it ran, 1000.5 not 1000). A ``status``
    longer than a word is numbered (rows with the same text share a number) and printed
    once in full under the table, and so is the
    meaning of an undefined (``–``) or one-sided (``≤x``, ``≥x``) confidence interval.

    Args:
        console: a ``rich.console.Console``; by default a new
            :class:`simulator.terminal.Terminal` on stdout (:func:`_console`).
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cols = columns or list(df.columns)
    # no edge columns (80 columns hold a sweep's table); as wide as its title, which
    # would otherwise wrap over a narrow table
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              show_edge=False, min_width=len(title))
    rows, notes, ci_notes = [], [], []
    for _, r in df.iterrows():
        row = [_fmt_value(getattr(r[c], "item", lambda: r[c])()) if c in exact
               else _short(r[c], cents=str(c).startswith("cost_per_hour"))
               for c in cols]   # .item(): a NumPy scalar as Python's
        for j, (c, cell) in enumerate(zip(cols, row)):
            if str(c).endswith("_ci95"):
                if cell == "-":      # no interval at all
                    cell = row[j] = "–"
                key = "–" if cell == "–" else "≤" if cell[:1] in "≤≥" else None
                if key and key not in ci_notes:
                    ci_notes.append(key)
        if "status" in cols:
            i = cols.index("status")
            if row[i] in _STATUS:
                row[i] = _STATUS[row[i]]
            else:   # one note per distinct text: every candidate may fail alike
                if row[i] not in notes:
                    notes.append(row[i])
                row[i] = f"note {notes.index(row[i]) + 1}"
        if "stability" in cols:
            i = cols.index("stability")
            row[i] = _STABILITY.get(row[i], row[i])
        rows.append(row)
    for c in cols:
        t.add_column(_header(c), overflow="fold",
                     justify="left" if c in ("status", "plan", "binding", "stability")
                     else "right")
    for row in rows:   # Text: a cell such as "[a, b]" is not rich markup
        t.add_row(*(Text(cell) for cell in row))
    console = console or _console()
    console.print(t)
    for i, note in enumerate(notes, 1):
        console.print(f"note {i}: {note}", highlight=False, markup=False)
    for key in ci_notes:
        console.print(_CI_NOTES[key], highlight=False, markup=False)
    if "stability" in cols and any(r[cols.index("stability")] == "rejects" for r in rows):
        console.print("rejects: some prompts have max_model_len tokens or more; vLLM refuses "
                      "them (the rejected column counts them per run)", highlight=False,
                      markup=False)
    if "stability" in cols and any(r[cols.index("stability")] == "ramp-up" for r in rows):
        console.print(f"ramp-up: {RAMP_TEXT}", highlight=False, markup=False)


def _console():
    """A console on stdout; piped (a log, a file) without COLUMNS, as wide as a table needs:
    80 columns would fold numbers mid-way (``11.96–14`` over ``.95``)."""
    import os

    from .terminal import Terminal

    c = Terminal()
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Terminal(width=1000)
    return c


def _workload_warnings(scenario) -> list[str]:
    """The workload's warnings (:func:`simulator.workload.workload_warnings`)."""
    from .workload import workload_warnings

    return workload_warnings(scenario.workload, scenario.base_dir)


def _warn(warnings: list[str]) -> None:
    """Each warning once on stderr (after the runs: an error in them stays the one line)."""
    for w in warnings:
        print(f"servesim: warning: {w}", file=sys.stderr)


def _cmd_sweep(args) -> int:
    from .cli import with_replications
    from .planner import split_sets, sweep
    from .planner_report import write_sweep_report
    from .scenario import load_scenario
    from .sweep import grid, typed_overrides, with_sweep_hint

    plain, axes = split_sets(args.overrides)
    # the base is the first point: a file valid only with a swept key (a closed loop's
    # concurrency inside --set 'workload.arrival={process: closed_loop}') loads
    first = (typed_overrides(grid({k: v[:1] for k, v in axes.items()}, parse=False)[0])
             if axes else [])
    try:
        scenario = load_scenario(args.scenario, plain, then=first)
    except Refused as e:   # the first point alone may be refused: sweep() shows it as a row
        if not axes:
            raise with_sweep_hint(e, plain, "sweep") from None
        scenario = e.scenario
    except InputError as e:
        raise with_sweep_hint(e, plain, "sweep") from None
    if not axes:
        raise InputError("--set: give at least one swept key with comma-separated values, "
                         "e.g. --set workload.arrival.rate=1,2,4,8")
    for key in axes:   # every point would be the same run
        unused = ("the plan: section changes only what servesim plan does"
                  if key == "plan" or key.startswith("plan.") else
                  "the name only labels the run and its folder" if key == "name" else None)
        if unused:
            raise InputError(f"--set {key}={','.join(axes[key])}: {unused}; every point of a "
                             f"sweep would be the same run")
    if args.replications is not None and "sim.replications" in axes:
        raise InputError("--replications: sim.replications is also swept by --set; give one")
    scenario = with_replications(scenario, args.replications)
    out = out_folder(args.out, lambda: scenario.default_folder("-sweep"))
    check_folder(out, "--out", "sweep")   # before the runs, not after
    with _executor(args) as ex, _progress(args, f"sweeping {scenario.name}") as prog:
        res = sweep(scenario, axes, ex, progress=prog)
    paths = write_sweep_report(out, res, title=f"{scenario.name}: sweep")
    # rejected only when a point rejects (sweep.csv keeps the column): 80 columns hold the rest
    slo = [stat_column(m, st) for m, st, _ in (scenario.slo.targets() if scenario.slo else [])]
    shown = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"]
    _print_table(res.table, "Sweep", [c for c in list(axes) + [
        "offered_rate", "request_throughput", "stability", "rejected", *shown,
        *(c for c in slo if c not in shown), "slo_met", "binding"] if c in res.table
        and (c != "rejected" or res.table[c].any())
        and (c != "offered_rate" or res.table[c].notna().any())], exact=tuple(axes))
    _warn(res.warnings)   # its points' own, and their workloads
    if scenario.workload.trace is None:   # a trace's rows are what they are
        _few_requests_note([s["num_requests"] for sums in res.summaries for s in sums],
                           "each point", "whether a rate keeps up")
    if "binding" in res.table:
        print(RULES_NOTE)
    if any(s.get("sessions") for sums in res.summaries for s in sums):
        print("offered req/s (conversations): the request rate the conversations build up "
              "to, the conversation rate × the mean turns; served req/s is over the whole "
              "run, its ramp-up and wind-down included")
    for (label, note), points in _misfits(res.table, list(axes)).items():
        print(f"{_STABILITY[label]} ({points}): {note}")
    first = list(axes)[0]
    for k in res.knees:   # per line: sweep.knees
        others = ", ".join(f"{a}={_fmt_value(v)}" for a, v in k.items() if a != "knee")
        print(f"{knee_title(first)}: {_knee_text(res.table, k, first)}"
              + (f" (with {others})" if others else ""))
    for m in res.met_at:   # the answer for a capacity axis
        others = ", ".join(f"{a}={_fmt_value(v)}" for a, v in m.items()
                           if a not in ("met_at", "answer"))
        print(f"every SLO met (stable) at {first}: "
              + (", ".join(_met_value(v) for v in m["met_at"]) or "none")
              + (f" (with {others})" if others else "")
              + (f"; {answer_title(first)}: {_met_value(m['answer'])}"
                 if len(m["met_at"]) > 1 and m["answer"] is not None else ""))
    print(f"report: {paths['report.html']}")
    return 0


def _met_value(v) -> str:
    return "null (unset)" if unset(v) else _fmt_value(v)


def _few_requests_note(counted: list[int], each: str, needs: str) -> None:
    """Say on stderr when the fewest ``counted`` requests of a run (workload.num_requests
    less sim.warmup_requests) are under :data:`MIN_PLAN_REQUESTS`: a handful of requests
    never fills the queue, so a rate far past capacity "meets" the SLOs and looks stable.
    Said after the runs, so that an error in them stays the one line."""
    if counted and min(counted) < MIN_PLAN_REQUESTS:
        print(f"servesim: note: {each} is judged from {min(counted)} requests "
              f"(workload.num_requests less sim.warmup_requests); {needs} needs at least "
              f"{MIN_PLAN_REQUESTS}, and a few hundred give steadier figures", file=sys.stderr)


def _misfits(table, keys: list[str], most: int = 3) -> dict[tuple[str, str], str]:
    """Per stability label of the points not run (does not fit its GPU, invalid config) and
    reason, the points' swept values (``TP=1; TP=2``), the first ``most`` and how many
    more."""
    from .sweep import NOT_RUN

    out: dict[tuple[str, str], list[str]] = {}
    if "note" not in table:
        return {}
    for _, r in table[table["stability"].isin(NOT_RUN)].iterrows():
        out.setdefault((r["stability"], r["note"]), []).append(
            ", ".join(f"{k.split('.')[-1]}={_fmt_value(r[k])}" for k in keys))
    return {why: "; ".join(p[:most]) + (f"; {len(p) - most} more" if len(p) > most else "")
            for why, p in out.items()}


def _knee_text(table, knee: dict, first: str) -> str:
    """A knee's value (of the first axis ``first``), or why a line has none (every point
    unstable, rejecting, ramp-up only or not fitting)."""
    from .sweep import DOES_NOT_FIT, NOT_RUN, RAMP_ONLY, SATURATING

    line = table
    for a, v in knee.items():
        if a != "knee":
            line = line[line[a] == v]
    if knee["knee"] is not None:   # as --set takes it (16384, not 16,384)
        # (null, no client limit, was swept too: what more in flight gives is known)
        last = (first in SATURATING and knee["knee"] == line[first].max() and len(line) > 1
                and line[first].notna().all())
        if knee["knee"] == "null":   # unset: vLLM's own sizing, or no client limit
            return "null (unset)"
        return _fmt_value(knee["knee"]) + (" (the largest swept: throughput may still grow "
                                           "with more in flight)" if last else "")
    if len(line) and (line["stability"] == DOES_NOT_FIT).all():
        return "none (no point fits its GPU)"
    if len(line) and line["stability"].isin(NOT_RUN).all():
        return "none (no point runs: vLLM refuses their settings or they do not fit)"
    if len(line) and (line["stability"] == RAMP_ONLY).all():
        return f"none (every point is ramp-up only: {RAMP_TEXT})"
    if len(line) and (line["stability"] == "rejects requests").all():
        return ("none (every point rejects requests: prompts of max_model_len tokens or more; "
                "raise engine.max_model_len or shorten the prompts)")
    return "none (no point is stable)"


# Exit status of `servesim plan` when it ran but no candidate meets every SLO: the report
# is written (valid output), yet a script sizing a deployment must not take it as a plan.
# 2 stays reserved for bad input, as argparse and every other command use it.
NO_PLAN_STATUS = 1


def _cmd_plan(args) -> int:
    from .planner import closest_miss, closest_text, default_efficiency_note, plan, plan_table
    from .planner_report import write_plan_report
    from .scenario import PlanConfig, load_scenario
    from .sweep import with_sweep_hint

    try:
        scenario = load_scenario(args.scenario, args.overrides)
    except InputError as e:
        raise with_sweep_hint(e, args.overrides, "plan") from None
    if args.target_rate is not None and not 0 < args.target_rate <= MAX_RATE:
        raise InputError(f"--target-rate: a rate > 0 and <= 1e9 req/s (arrivals are "
                         f"timed in nanoseconds), got {args.target_rate:g}")
    out = out_folder(args.out, lambda: scenario.default_folder("-plan"))
    check_folder(out, "--out", "plan")   # before the runs, not after
    with _executor(args) as ex, _progress(args, f"planning {scenario.name}") as prog:
        res = plan(scenario, ex, target_rate=args.target_rate, progress=prog,
                   confirm=not args.no_confirm)
    table = plan_table(res)   # written before any note: a failed write stays one line
    paths = write_plan_report(out, res, table, title=f"{scenario.name}: plan for "
                                                      f"{res.target_rate:g} req/s")
    from .cost_model import grid_text, merged_excess
    at_max = [(r.candidate.label, r.search.at_max.outputs) for r in res.rows
              if r.search is not None and r.search.at_max is not None]
    grid = [(label, merged_excess([o.get("grid") for o in outs])) for label, outs in at_max]
    _warn(list(dict.fromkeys(r.candidate.setup_warning for r in res.rows
                             if r.candidate.setup_warning)) + _workload_warnings(scenario)
          + [unbounded_warning(f"candidate {r.candidate.label}") for r in res.rows
             if r.search is not None and r.search.capacity and r.search.steady is None]
          # as run says it, of the runs at each candidate's max rate
          + [f"candidate {label} at its max rate: {grid_text(m, several=True)}"
             for label, m in grid if m])
    ranked = default_efficiency_note([r.candidate for r in res.rows])
    if ranked:
        print(f"servesim: note: {ranked}", file=sys.stderr)
    if not scenario.slo.targets():   # a throughput plan (batch jobs)
        print("servesim: note: the scenario sets no SLOs, so a candidate's max rate per "
              "replica is the highest it keeps up with (stability alone; queues there are "
              "long); set slo: (e.g. --set slo.ttft_ms.p99=2000) to plan for latency",
              file=sys.stderr)
    shown = table.copy()   # an estimate's count marked ≈: only a deployment run confirms it
    shown["replicas"] = [n if n is None or r.confirmed else
                         f"≥{_short(n)}" if r.refuted else f"≈{_short(n)}"
                         for n, r in zip(table["replicas"], res.rows)]
    _print_table(shown, f"Plans for {res.target_rate:g} req/s", list(
        table.columns[:len(res.rows[0].candidate.values)]) + [
        "max_rate_per_replica", "replicas", "cost_per_hour", "cost_per_hour_ci95",
        *(table.attrs.get("slo_columns") or ["ttft_p99_ms"]), "status"],
        exact=tuple(res.rows[0].candidate.values))
    if any(str(v).startswith("≈") for v in shown["replicas"]):
        print("≈ replicas: estimated from one replica's max rate, not simulated as a "
              "deployment (a router's pooling often needs fewer; plan.csv's confirmed is "
              "False where fewer were simulated and fell short)")
    pooled = [r for r in res.rows if r.confirmed and r.feasible
              and r.replicas * r.search.max_rate < res.target_rate]
    if pooled:   # 4.84 req/s per replica and 3 replicas for 23 req/s reads as a typo
        r = res.best if res.best in pooled else pooled[0]
        print(f"as simulated, {r.replicas} replicas of {r.candidate.label} serve "
              f"{res.target_rate:g} req/s, above {r.replicas} × its max rate per replica "
              f"({r.replicas * r.search.max_rate:.3g} req/s): a router pools the replicas, "
              f"which one replica alone cannot show (report: Replica count confirmed "
              f"by simulation)" + ("" if len(pooled) == 1 else
                                   "; so does 1 more candidate's count" if len(pooled) == 2
                                   else f"; so do {len(pooled) - 1} more candidates' counts"))
    if any(str(v).startswith("≥") for v in shown["replicas"]):
        print("≥ replicas: a deployment of one fewer missed the SLOs; more would cost as "
              "much as the plan, so none was simulated")
    if res.best is not None:
        cost = res.best.costs.get("cost_per_hour")
        ties = [r for r in res.rows if r is not res.best and r.feasible and cost is not None
                and not r.refuted and r.costs.get("cost_per_hour") == cost]
        print(("cheapest feasible: " if cost is not None else
               "best feasible (no price: the most capacity, replicas × max rate per replica, "
               "then the fewest replicas): ")
              + f"{res.best.candidate.label}, {res.best.replicas} replica(s)"
              + (_unsure_text(res.best, (scenario.plan or PlanConfig()).tolerance)
                 if res.best.confirmed else " (estimated from one "
                 "replica's max rate: not simulated as a deployment)")
              + (f", {cost:.2f} USD/h" if cost is not None else "")
              + (f" (as cheap: {'; '.join(r.candidate.label for r in ties)}; the most "
                 f"capacity, replicas × max rate per replica, then the fewest replicas, is "
                 f"chosen)" if ties else ""))
        print(f"report: {paths['report.html']}")
        return 0
    miss = closest_miss(res)
    cfg = scenario.plan
    print(f"no candidate meets every SLO at {res.target_rate:g} req/s"
          + (f"; {closest_text(miss, cfg.max_replicas if cfg else 64)}" if miss else
             "; none ran to an SLO figure to rank them by: each one's status says why"))
    print(f"report: {paths['report.html']}")
    return NO_PLAN_STATUS


def _unsure_text(row, tolerance: float) -> str:
    """For a confirmed count not decided by its confidence intervals, its 95% interval and,
    when the count itself met the SLOs only in the mean (within the indifference zone
    ``1 ± tolerance`` or at the replication cap), by how much (empty otherwise)."""
    n, (lo, hi) = row.replicas, row.replicas_ci95
    if (lo, hi) == (n, n):
        return ""
    at = next(t for t in row.confirmation if t["replicas"] == n)
    ci = at["ci95"]
    worst = (f"the worst SLO value is {at['mean_ratio']:.3g} × its threshold in the mean of "
             f"the replications" + (f", 95% CI {ci[0]:.3g}–{ci[1]:.3g}" if ci else "")
             + ", not confidently met") if row.candidate.scenario.slo.targets() else (
        "keeping up was not confidently decided (no SLOs)")
    return (f" (95% interval {lo}–{hi} replicas"
            + (f": at {n} {worst}; a plan.tolerance below {tolerance:g} with more "
               f"plan.max_replications decides it" if hi > n else
               f": {n - 1} was not confidently refuted") + ")")


def _cmd_compare(args) -> int:
    from .cli import with_replications
    from .diagnosis import find_limits
    from .planner import compare
    from .report import capped_text, md_literal, plan_capped, write_compare_report
    from .run import tail_warning, trace_shortfall
    from .scenario import load_scenario
    from .sweep import with_sweep_hint

    if len(args.scenarios) < 2:   # README: one workload through several plans
        raise InputError(f"compare needs two or more scenario files, got "
                         f"{len(args.scenarios)} ({args.scenarios[0]}); to simulate one "
                         f"scenario use servesim run")
    files = [Path(p).resolve() for p in args.scenarios]
    twice = next((p for i, p in enumerate(args.scenarios) if files[i] in files[:i]), None)
    if twice is not None:
        raise InputError(f"{twice} is given twice; compare takes each plan's file once")
    names = [Path(p).name for p in args.scenarios]   # two s.yaml: messages give the paths
    try:
        scenarios: list = []
        for p, n in zip(args.scenarios, names):   # a later plan may leave out the workload
            scenarios.append(load_scenario(p, args.overrides, source=p if names.count(n) > 1
                                           else None, serving=(scenarios or [None])[0]))
    except InputError as e:
        raise with_sweep_hint(e, args.overrides, "compare") from None
    scenarios = [with_replications(sc, args.replications) for sc in scenarios]
    seen: dict = {}
    for sc in scenarios:   # plans are keyed by name in the table, CSV and report
        if sc.name in seen:
            raise sc.error("name", f"{sc.name!r} is also the name of {seen[sc.name]}; give "
                                   f"each plan a distinct name")
        seen[sc.name] = sc.source
    out = out_folder(args.out, Path("reports") / "compare")
    check_folder(out, "--out", "compare")   # before the runs, not after
    with _executor(args) as ex, _progress(args, "comparing") as prog:
        entries = compare(scenarios, ex, progress=prog)
    for e in entries:
        e["binding"] = find_limits(e["scenario"], e["result"])["binding"]
    paths = write_compare_report(   # before any note: a failed write stays the one line
        out, entries, title="Plan comparison",
        note=f"Every plan serves the workload and SLO of "
             f"{md_literal(str(scenarios[0].source), cell=True)}, measured with its sim "
             f"settings (replications, warm-up).")
    from .cost_model import build_cost_model, extrapolation_warning
    from .sweep import setup_warnings
    grid = [(e["name"], extrapolation_warning(build_cost_model(e["scenario"]), e["scenario"],
                                              e["result"])) for e in entries]
    # as run says them, per plan; a tail warning every plan shares (the same requests
    # served by each) once
    tails = [(e["name"], tail_warning(e["scenario"], e["result"].summary)) for e in entries]
    same = len({w for _, w in tails}) == 1 and len(tails) > 1
    _warn(setup_warnings(scenarios) + _workload_warnings(scenarios[0])
          + [f"{name}: {w}" for name, w in grid if w]
          + ([f"every plan: {tails[0][1]}"] if same and tails[0][1] else
             [] if same else [f"{name}: {w}" for name, w in tails if w]))
    ignored = [sc.source for sc in scenarios[1:]
               if _served_workload(sc) != _served_workload(scenarios[0])]
    if ignored:  # a comparison holds the traffic fixed: say whose is used (after the runs,
        # so that an error in them stays the one line)
        print(f"servesim: note: workload, SLO and sim settings of {scenarios[0].source} used "
              f"for every plan; those of {', '.join(ignored)} are ignored", file=sys.stderr)
    planned = [sc.source for sc in scenarios if sc.plan is not None]
    if planned:   # its candidates are plan's to search: each file is served as written
        print(f"servesim: note: the plan: section{'s' if len(planned) > 1 else ''} of "
              f"{', '.join(planned)} {'are' if len(planned) > 1 else 'is'} not used: "
              f"compare serves each file's settings as written (servesim plan searches a "
              f"plan: section's candidates)", file=sys.stderr)
    short = trace_shortfall(scenarios[0], entries[0]["result"].summary)
    if short:   # every plan served the first one's trace
        print(f"servesim: note: {short}", file=sys.stderr)
    reps = scenarios[0].sim.replications   # every plan runs the first one's (serving())
    table = compare_table(entries)
    # the rejected and output-cut columns only where some plan rejects or cuts (compare.csv
    # keeps both rows): 80 columns hold the rest
    _print_table(table, f"Plans serving the workload of {scenarios[0].source}" + (
        f" (means over {reps} replications)" if reps > 1 else ""),
        [c for c in table.columns if c not in ("rejected", "capped") or table[c].any()])
    if reps > 1:   # means beside a verdict of every replication would read as a contradiction
        print(f"SLO met: yes only where every one of the {reps} replications met every SLO "
              f"(the figures are their means)")
    for e in entries:   # as run says it, per plan
        if text := capped_text(plan_capped(e)):
            print(f"{e['name']}: {text}")
    print(RULES_NOTE)
    print(_cheapest_text(entries))
    print(f"report: {paths['report.html']}")
    return 0


def _cheapest_text(entries: list[dict]) -> str:
    """Which compared plan meets every SLO, keeping up, at the least cost per hour (or why
    none is named: no SLO, none meets it, no prices). A plan whose max_model_len cut
    outputs (:func:`simulator.report.plan_capped`) is not named: it met the SLOs on
    shorter answers than the workload asks for, so not on the same work; the text names
    it after the verdict. Of plans of equal price the first given is named, and the
    others are listed as as cheap."""
    from .report import plan_capped

    if all(e.get("slo_met") is None for e in entries):
        return "no SLO in the workload: no plan is named the cheapest meeting it"
    met = [e for e in entries if e.get("slo_met") and e.get("stability") == "stable"]
    if not met:
        return "no plan meets every SLO while keeping up with the workload"
    ok, cut = [], []   # whole outputs; names of the plans that cut them
    for e in met:
        if plan_capped(e)["capped"]:
            cut.append(e["name"])
        else:
            ok.append(e)
    one = len(cut) == 1
    cut_text = (f"{', '.join(cut)} {'meets' if one else 'meet'} every SLO only with outputs "
                f"cut at max_model_len (see above), so {'is' if one else 'are'} not named"
                if cut else "")
    if not ok:
        return f"no plan meets every SLO with whole outputs: {cut_text}"
    priced = [e for e in ok if e.get("cost_per_hour") is not None]
    if not priced:
        return ("meeting every SLO: " + ", ".join(e["name"] for e in ok) + " (no prices)"
                + (f"; {cut_text}" if cut else ""))
    best = min(priced, key=lambda e: e["cost_per_hour"])   # the first of equal cost
    ties = [e["name"] for e in priced if e is not best
            and e["cost_per_hour"] == best["cost_per_hour"]]
    return (f"cheapest meeting every SLO: {best['name']} ({best['cost_per_hour']:.2f} USD/h"
            + (f"; as cheap: {', '.join(ties)}, the first given is named" if ties else "")
            + ")" + (f"; {cut_text}" if cut else ""))


def _served_workload(sc):
    """``sc``'s workload, SLO and sim settings as served: relative data-file paths (a
    trace, an empirical distribution) resolved against its folder, so that the same text
    naming another file counts as another workload."""
    from .scenario import _from_cwd

    wl = _from_cwd(("workload",), sc.workload.model_dump(mode="json"), sc.base_dir.resolve())
    return wl, sc.slo, sc.sim


def compare_table(entries: list[dict]):
    """One row per plan of :func:`simulator.planner.compare`, figures as the report's
    cells take them (:func:`simulator.report.plan_figure`, ``shown``: means over
    replications, else unrounded, for the cell to round once): ``plan``,
    ``ttft_p99_ms`` and ``tpot_p99_ms`` and each statistic the SLOs name
    (``queue_p95_ms``), ``request_throughput`` and ``goodput`` (req/s),
    ``slo_met`` (None without SLO), ``rejected`` (requests whose prompt does not fit
    max_model_len), ``capped`` (requests whose output max_model_len cut), ``stability``
    (as sweep's), ``binding`` (the diagnosis's binding limit, of replication 0), ``gpus``
    (replicas × tensor_parallel: what the price pays for) and ``cost_per_hour`` (USD,
    where some plan has a price)."""
    import pandas as pd

    from .report import plan_figure

    slo = entries[0]["scenario"].slo   # every plan serves the first's: its statistics too
    named = {stat_column(m, st): (m, st) for m, st, _ in (slo.targets() if slo else [])
             if (m, st) not in (("ttft_ms", "p99"), ("tpot_ms", "p99"))}
    rows = []
    for e in entries:
        rows.append({"plan": e["name"],
                     "ttft_p99_ms": plan_figure(e, ("ttft_ms", "p99"), True),
                     "tpot_p99_ms": plan_figure(e, ("tpot_ms", "p99"), True),
                     **{c: plan_figure(e, path, True) for c, path in named.items()},
                     "request_throughput": plan_figure(e, ("request_throughput",), True),
                     "goodput": plan_figure(e, ("goodput",), True),
                     "slo_met": plan_figure(e, ("slo_met",)),
                     "rejected": plan_figure(e, ("rejected",)),
                     "capped": plan_figure(e, ("capped",)),
                     "stability": e.get("stability"), "binding": e.get("binding"),
                     "gpus": _gpus(e["scenario"]), "cost_per_hour": e.get("cost_per_hour")})
    table = pd.DataFrame(rows)
    # a price column only where some plan has a price (an inline step time has none)
    return table if table["cost_per_hour"].notna().any() else \
        table.drop(columns="cost_per_hour")


def _gpus(scenario) -> int:
    """GPUs (devices) a scenario's deployment takes: replicas × tensor_parallel."""
    return scenario.cluster.replicas * scenario.hardware.tensor_parallel


def add_parsers(sub) -> None:
    """Add ``sweep``, ``plan`` and ``compare`` to an argparse sub-parser set."""
    from .cli import _add_scenario_args, add_replications_arg

    p = sub.add_parser("sweep", help="run the cross product of --set key=v1,v2,... values")
    _add_scenario_args(p)
    add_replications_arg(p)
    _executor_args(p, "reports/<scenario name>-sweep")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("plan", help="cheapest hardware/engine plan meeting the SLOs at a "
                                    "target rate (candidates from the scenario's plan:)")
    _add_scenario_args(p)
    p.add_argument("--target-rate", type=float,
                   help="requests/s, > 0 and at most 1e9 (default plan.target_rate)")
    p.add_argument("--no-confirm", action="store_true",
                   help="skip simulating the recommended deployment")
    _executor_args(p, "reports/<scenario name>-plan")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("compare", help="the same workload through several scenarios")
    p.add_argument("scenarios", nargs="+", help="two or more scenario YAML files (workload, "
                                                "SLO and sim of the first are used for all; "
                                                "the others may leave them out)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override applied to every scenario")
    add_replications_arg(p)
    _executor_args(p, "reports/compare")
    p.set_defaults(func=_cmd_compare)


__all__ = ["add_parsers", "compare_table"]
