"""Reports of ``servesim sweep`` and ``servesim plan``: CSV/JSON tables, latency–throughput
curves, the cost-vs-latency Pareto plot, markdown and a self-contained report.html.

Written atomically with :func:`simulator.report.write_files`; plots use matplotlib's object
API (no pyplot state).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .report import (DEFINITIONS, _fmt, _png, cost_sources, line_styles, render_html,
                     render_markdown, write_files)
from .session_ramp import RAMP_TEXT
from .sweep import _fmt_value, answer_title, knee_title, unset

#: How the reports state :func:`simulator.executors.job_output`'s stability test.
UNSTABLE_RULE = (
    "A point is unstable when requests pile up: between the first finish and the last "
    "arrival it completes fewer than 0.98 × the requests that arrive, and over the last "
    "three quarters of the arrivals the requests waiting rise by at least 2% of the arrival "
    "rate, or those in the system by 20% of it (a least-squares trend over six segments, t "
    "≥ 3; the whole-run `request_throughput` also counts the drain after the last arrival, "
    "so a stable short run can show less than 0.98 × `offered_rate`); an unstable point's "
    "latencies depend on the run length.")


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        v = v.item()
    if isinstance(v, float) and np.isnan(v):
        return "n/a"
    return _fmt(v)


def _rounded(table):
    """``table`` with its finite floats (in CIs too) at 6 significant digits, as
    ``summary.json`` has them (``10.8``, not ``10.799999999999999`` from 6 × 1.8)."""
    from .metrics import round_sig

    def cell(v):
        if isinstance(v, (list, tuple)):
            return [cell(x) for x in v]
        if isinstance(v, (float, np.floating)) and np.isfinite(v):
            return round_sig(v)
        return v
    out = table.copy()
    for col in out.columns:   # object columns stay objects (a candidate's 64, not 64.0)
        out[col] = pd.Series([cell(v) for v in out[col]], index=out.index,
                             dtype=out[col].dtype)
    return out


def _json(obj) -> bytes:
    """``obj`` as strict JSON: a missing figure (NaN in a table: a point that did not run,
    a row without an operating point) is null, which every JSON reader takes."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (np.integer, np.floating, np.bool_)):
            x = x.item()
        if isinstance(x, float) and not np.isfinite(x):
            return None
        return x

    return (json.dumps(clean(obj), indent=2, sort_keys=True, default=_cell, allow_nan=False)
            + "\n").encode()


# -- sweep --------------------------------------------------------------------------------
#: Most line pairs a sweep plot names in its legend.
MAX_LEGEND = 16


def plot_sweep(result) -> bytes:
    """PNG: TTFT and TPOT (p50 solid, p99 dashed) vs achieved request throughput, one line
    per combination of the other swept keys; points not ``stable`` (unstable, or
    rejecting requests) marked ×. Up to :data:`MAX_LEGEND` combinations are named in a
    legend; past that (a legend taller than the plot) a note points to ``sweep.csv``.
    Points that do not fit their GPU or whose settings vLLM refuses are not run: no line or
    legend entry."""
    return _png(sweep_figure(result))


def sweep_figure(result) -> Figure:
    """The figure :func:`plot_sweep` draws (two axes: TTFT, TPOT)."""
    from .sweep import NOT_RUN

    t = result.table
    t = t[~t["stability"].isin(NOT_RUN)]   # not run: nothing to draw (sweep.csv says why)
    keys = list(result.axes)
    others = keys[1:]
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    groups = list(t.groupby(others, sort=False, dropna=False)) if others else [((), t)]
    # a colour per line (the dashes tell p50 from p99): distinct up to 20 lines, and the
    # legend names at most MAX_LEGEND of them
    colours = [c for c, _ in line_styles(len(groups))]
    for i, (_, df) in enumerate(groups):   # a null value is a line too, named as swept
        name = ", ".join(f"{k.split('.')[-1]}={_fmt_value(df[k].iloc[0])}"
                         for k in others) or "all"
        df = df.sort_values(keys[0])
        colour = colours[i]
        for ax, m in zip(axes, ("ttft", "tpot")):
            for st, ls in (("p50", "-"), ("p99", "--")):   # one legend entry per line pair
                ax.plot(df["request_throughput"], df[f"{m}_{st}_ms"], ls, color=colour,
                        marker="o", label=name if st == "p50" else None)
            bad = df[df["stability"] != "stable"]
            ax.plot(bad["request_throughput"], bad[f"{m}_p99_ms"], "x", color="k", ms=9)
    for ax, m in zip(axes, ("TTFT", "TPOT")):
        ax.set_xlabel("achieved throughput (req/s)")
        ax.set_ylabel(f"{m} (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.set_title(f"{m} p50 (solid), p99 (dashed); × not stable")
    if len(groups) <= MAX_LEGEND:
        axes[0].legend(fontsize="x-small")
    else:   # a legend of hundreds of entries collapses the axes to nothing
        fig.suptitle(f"{len(groups)} lines, one per combination of "
                     f"{', '.join(k.split('.')[-1] for k in others)} (too many to name: "
                     f"see sweep.csv)", fontsize="small")
    return fig


def write_sweep_report(out_dir, result, *, title: str) -> dict:
    """``sweep.csv``, ``sweep.json``, ``curves.png``, ``report.md``, ``report.html``.

    Under replications ``sweep.json`` keeps each 95% CI as ``[lo, hi]`` and ``sweep.csv``
    gives it as two numeric columns ``*_ci95_lo`` / ``*_ci95_hi`` (:func:`csv_table`), as
    the plan's files do."""
    t = result.table
    # in the table's row order, each once, in full (a profile's held-out MAPE included)
    kinds = cost_sources(s[0] for s in result.summaries if s)
    shown = list(result.axes) + ["offered_rate", "request_throughput", "stability",
                                 "rejected", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                 "tpot_p99_ms", "itl_p99_ms", "e2el_p99_ms", "goodput",
                                 "slo_met", "binding", "note"]
    shown = [c for c in shown if c in t and (c != "offered_rate" or t[c].notna().any())]
    b: list = [("h1", title),
               ("p", "Step costs: " + ("; ".join(f"**{k}**" for k in kinds) or "n/a")
                     + (" (each point's: `cost_model` in sweep.csv)" if len(kinds) > 1
                        else "") + ". " + UNSTABLE_RULE + " A "
                     "point *rejects requests* when some prompts have max_model_len "
                     "tokens or more (vLLM refuses them; `rejected` counts them per run): "
                     "they never finish, so the throughput test cannot judge its queue. "
                     "With open-loop conversations (sessions) a follow-up waits for the "
                     "answer before it, so the test is made on the conversations: unstable "
                     "when, past their ramp-up, the requests waiting or in the system rise as "
                     "above; `offered_rate` is the request rate they build up to (the "
                     "conversation rate × the mean turns), and a point is *ramp-up only* when "
                     f"{RAMP_TEXT} (to at least twice a conversation's length of openings). A "
                     "point *does not fit* when its model and KV cache do not fit its GPU's "
                     "memory (vLLM would not start), and *invalid config* when vLLM refuses "
                     "its settings together (max_num_batched_tokens below max_num_seqs, "
                     "...): neither is run, and `note` says why.")]
    axes = set(result.axes)

    def cell(key, v) -> str:   # swept values as --set takes them (4096, null), not 4,096
        if key in axes:
            return _fmt_value(v)
        return "" if key == "note" and not isinstance(v, str) else _cell(v)

    b.append(("table", None, shown, [[cell(c, r[c]) for c in shown] for _, r in t.iterrows()]))
    first = list(result.axes)[0]
    if result.knees:   # none for a first axis that is not numeric (a router, a GPU)
        b.append(("h2", f"Knee: {knee_title(first)}"))
        b.append(("table", None, list(result.knees[0]),
                  [[("none" if v is None else v if v == "null" else cell(first, v))
                    if a == "knee" else cell(a, v)
                    for a, v in k.items()] for k in result.knees]))
    met = result.met_at
    if met:
        b.append(("h2", f"Every SLO met (and stable) at {first}"))
        b.append(("table", None,
                  [f"answer ({answer_title(first)})" if k == "answer" else k for k in met[0]],
                  [[", ".join(cell(first, x) for x in v) or "none" if k == "met_at"
                    else ("" if v is None else cell(first, v)) if k == "answer"
                    else cell(k, v) for k, v in m.items()] for m in met]))
    b.append(("img", "curves.png", "Latency vs achieved throughput"))
    b.append(("h2", "Definitions"))
    b.append(("list", [f"**{k}**: {v}" for k, v in DEFINITIONS]))
    img = plot_sweep(result)
    t = _rounded(t)
    return write_files(out_dir, {
        "sweep.csv": csv_table(t, result.axes).to_csv(index=False,
                                                      lineterminator="\n").encode(),
        "sweep.json": _json({"axes": result.axes, "knees": result.knees, "slo_met_at": met,
                             "points": t.to_dict(orient="records")}),
        "curves.png": img,
        "report.md": render_markdown(b).encode(),
        "report.html": render_html(b, title, {"curves.png": img}).encode(),
    })


# -- plan -----------------------------------------------------------------------------------
def pareto_front(costs, latencies) -> list[int]:
    """Indices of points no other point beats on both cost and latency (lower is better)."""
    pts = [(c, l, i) for i, (c, l) in enumerate(zip(costs, latencies))
           if c is not None and l is not None]
    front = []
    for c, l, i in pts:
        if not any((c2 <= c and l2 <= l) and (c2 < c or l2 < l) for c2, l2, _ in pts):
            front.append(i)
    return sorted(front)


def plot_pareto(table, best_index: int | None) -> bytes:
    """PNG: cost per hour vs TTFT p99 and vs TPOT p99 at the operating point, with 95% CI
    error bars, the Pareto front joined, the cheapest feasible plan starred, each point
    labelled with its row numbers (``4,5`` where candidates coincide). Where no candidate
    has a price, GPUs (replicas × tensor_parallel, the table's ``gpus`` column) take the
    cost's place. A panel whose metric has no value (TPOT when every request has one
    output token) says so."""
    return _png(pareto_figure(table, best_index))


def pareto_figure(table, best_index: int | None) -> Figure:
    """The figure :func:`plot_pareto` draws (two axes: TTFT, TPOT)."""
    priced = table["cost_per_hour"].notna().any()
    x, x_label, best = (("cost_per_hour", "cost (USD / hour)", "cheapest") if priced else
                        ("gpus", "GPUs (replicas × tensor_parallel; no prices)", "best"))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    # a colour per candidate, distinct up to 20 rows (beyond, the row labels tell them
    # apart)
    colours = [c for c, _ in line_styles(len(table))]
    for ax, m in zip(axes, ("ttft", "tpot")):
        ok = table[table[x].notna() & table[f"{m}_p99_ms"].notna()]
        if ok.empty:
            ax.text(0.5, 0.5, f"no {m.upper()} p99 values", ha="center", va="center",
                    transform=ax.transAxes)
        for i, r in ok.iterrows():
            ci = r[f"{m}_p99_ci95"]
            yerr = None
            if isinstance(ci, (list, tuple)) and None not in ci:
                yerr = [[max(r[f"{m}_p99_ms"] - ci[0], 0)], [max(ci[1] - r[f"{m}_p99_ms"], 0)]]
            marker = "*" if i == best_index else "o"
            kind = r["cost_kind"]
            ax.errorbar([r[x]], [r[f"{m}_p99_ms"]], yerr=yerr, fmt=marker,
                        ms=12 if i == best_index else 6,
                        mfc="none" if kind == "projected" else None,
                        color=colours[i % len(colours)])
        _label_points(ax, [(str(i), r[x], r[f"{m}_p99_ms"]) for i, r in ok.iterrows()])
        front = pareto_front(list(ok[x]), list(ok[f"{m}_p99_ms"]))
        f = ok.iloc[front].sort_values(x)
        ax.plot(f[x], f[f"{m}_p99_ms"], "k-", lw=0.8, alpha=0.6)
        ax.set_xlabel(x_label)
        if not priced:   # whole GPUs
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{m.upper()} p99 at the operating point (ms)")
        ax.grid(alpha=0.3)
        ax.set_title(f"{'cost' if priced else 'GPUs'} vs {m.upper()} p99 (★ {best}; hollow "
                     f"= projected)")
    return fig


#: Points closer than this (fraction of an axis) share one label.
LABEL_NEAR = 0.02


def _label_points(ax, points: list[tuple[str, float, float]]) -> None:
    """Annotate ``(name, x, y)`` points; those within :data:`LABEL_NEAR` of the first of a
    group (in axes fractions, after autoscaling) share one label, ``0,2``, rather than
    printing over each other."""
    ax.autoscale_view()
    groups: list[tuple] = []
    for name, x, y in points:
        fx, fy = ax.transLimits.transform((x, y))
        g = next((g for g in groups if abs(g[0][0] - fx) < LABEL_NEAR
                  and abs(g[0][1] - fy) < LABEL_NEAR), None)
        if g is None:
            groups.append(((fx, fy), [name], (x, y)))
        else:
            g[1].append(name)
    for _, names, xy in groups:
        ax.annotate(",".join(names), xy, fontsize="x-small", xytext=(3, 3),
                    textcoords="offset points")


def csv_table(table, keys=()):
    """``table`` with each ``*_ci95`` column (cells ``[lo, hi]`` or ``None``) split into
    numeric ``*_ci95_lo`` and ``*_ci95_hi`` columns in its place, an open or missing end
    left empty, so a CSV reader gets numbers rather than Python list text. In the swept or
    candidate ``keys`` columns an unset value reads ``null``, as given (an empty cell
    elsewhere means none)."""
    import pandas as pd

    out = {}
    for col in table.columns:
        if col in keys:
            out[col] = table[col].map(lambda v: "null" if unset(v) else v)
            continue
        if not str(col).endswith("_ci95"):
            out[col] = table[col]
            continue
        ends = [v if isinstance(v, (list, tuple)) else (None, None) for v in table[col]]
        for i, side in enumerate(("lo", "hi")):
            out[f"{col}_{side}"] = pd.Series([e[i] for e in ends], index=table.index,
                                             dtype=object)
    return pd.DataFrame(out)


def write_plan_report(out_dir, result, table, *, title: str) -> dict:
    """``plan.csv``, ``plan.json``, ``pareto.png``, ``report.md``, ``report.html``.

    ``plan.json`` keeps each 95% CI as ``[lo, hi]`` (``null`` where open); ``plan.csv``
    gives it as two numeric columns ``*_ci95_lo`` / ``*_ci95_hi`` (:func:`csv_table`)."""
    best = result.best
    best_index = next((i for i, r in enumerate(result.rows) if r is best), None)
    b: list = [("h1", title)]
    if best is not None:
        row = table.iloc[best_index]
        priced = best.candidate.price_per_replica_hour is not None
        b.append(("p", (
            ("Cheapest plan" if priced else "Plan") +
            (f" meeting every SLO at {_fmt(result.target_rate)} req/s"
             if best.candidate.scenario.slo.targets() else
             f" keeping up with {_fmt(result.target_rate)} req/s (the scenario "
             f"sets no SLOs: a replica's max rate is the highest it keeps up with)") +
            ("" if priced else " (no candidate has a price: the most capacity, replicas × "
             "max rate per replica, then the fewest replicas)") + ": " +
            f"**{best.candidate.label}**, {row['replicas']} replica(s)"
            f" ({'confirmed by simulating the deployment' if best.confirmed else 'estimated'}),"
            + (f" {_cell(row['cost_per_hour'])} USD/h (95% CI "
               f"{_cell(row['cost_per_hour_ci95'])}), "
               f"{_cell(row['cost_per_million_output_tokens'])} USD per million output "
               f"tokens;" if priced else "") +
            f" max rate per replica {_cell(row['max_rate_per_replica'])} req/s (95% CI "
            f"{_cell(row['max_rate_ci95'])}); step costs {row['cost_kind']}.")))
    else:
        from .planner import closest_miss, closest_text

        miss = closest_miss(result)
        cfg = result.rows[0].candidate.scenario.plan if result.rows and \
            result.rows[0].candidate.scenario is not None else None
        b.append(("p", f"No candidate meets every SLO at {_fmt(result.target_rate)} req/s"
                       + (f"; {closest_text(miss, cfg.max_replicas if cfg else 64)}."
                          if miss else ".")))
    from .planner import default_efficiency_note

    ranked = default_efficiency_note([r.candidate for r in result.rows])
    if ranked:
        b.append(("p", f"Note: {ranked}."))
    b.append(("p", "Max rate per replica: bisection on the arrival rate with common random "
                   "numbers across candidates; an unstable run (its queue grows, below "
                   "0.98 × the offered rate) fails the rate. CIs: rates decided with 95% "
                   "confidence bound the max rate; "
                   "replicas and costs follow from them. Latencies are at the operating "
                   "point (target / replicas per replica; an estimate whose operating point "
                   "misses an SLO takes one more replica), mean and 95% CI over replications "
                   "(Student t; a lower end below 0 is shown as 0, since a latency cannot "
                   "be negative). A CI end shown n/a is not known: the rate search bounded "
                   "the max rate on one side only, so the fewest replicas (and the lowest "
                   "cost) or the most are open; a whole CI n/a means no interval (one "
                   "replication, or no rate to bound). Confirmed: yes when simulating the "
                   "whole deployment confirmed the replica count; no when it did not (for "
                   "a candidate after the first confirmed: fewer replicas than would cost as "
                   "much as the cheapest so far missed the SLOs, so it cannot be cheaper; "
                   "its count stays the estimate, its CI starting above the count tried, or, "
                   "where the estimate itself missed, becomes one more than the count tried, "
                   "without operating-point latencies); "
                   "n/a when it was not simulated (one replica of it costs as much as the "
                   "cheapest, it is infeasible, or confirmation was off)."))
    cols = list(table.columns)
    keys = set(result.rows[0].candidate.values) if result.rows else set()
    b.append(("table", None, ["#"] + cols,   # candidate values as --set takes them (8192)
              [[str(i)] + [_fmt_value(r[c]) if c in keys else _cell(r[c]) for c in cols]
               for i, r in table.iterrows()]))
    if best is not None and best.confirmation:
        b.append(("h2", "Replica count confirmed by simulation"))
        b.append(("table", None, ["replicas", "feasible", "confident", "unstable",
                                  "worst SLO value / threshold", "95% CI"],
                  [[_cell(c["replicas"]), _cell(c["feasible"]), _cell(c["confident"]),
                    _cell(c["unstable"]), _cell(c["mean_ratio"]), _cell(c["ci95"])]
                   for c in best.confirmation]))
    priced = table["cost_per_hour"].notna().any()
    b.append(("img", "pareto.png", ("Cost" if priced else "GPUs (no prices)")
              + " vs latency; numbers are the table's rows"))
    b.append(("h2", "Definitions"))
    b.append(("list", [f"**{k}**: {v}" for k, v in DEFINITIONS]))
    img = plot_pareto(table.assign(gpus=[   # the cost's place where nothing has a price
        r.replicas * r.candidate.scenario.hardware.tensor_parallel
        if r.replicas and r.candidate.scenario is not None else None
        for r in result.rows]), best_index)
    table = _rounded(table)
    return write_files(out_dir, {
        "plan.csv": csv_table(table, keys).to_csv(index=False, lineterminator="\n").encode(),
        "plan.json": _json({"target_rate": result.target_rate, "best": best_index,
                            "candidates": table.to_dict(orient="records")}),
        "pareto.png": img,
        "report.md": render_markdown(b).encode(),
        "report.html": render_html(b, title, {"pareto.png": img}).encode(),
    })


__all__ = ["pareto_front", "plot_pareto", "plot_sweep", "write_plan_report",
           "write_sweep_report"]
