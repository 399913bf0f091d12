"""The validation's outputs: the error table as markdown (:func:`markdown_table`), and
``validation.json``, ``validation.md``, ``validation.html`` and measured-vs-predicted CDF
plots per load (:func:`write_outputs`), from :func:`calibration.validate.validate`'s
result dict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.metrics import METRIC_LABELS
from simulator.report import (DEFINITIONS, fmt_number, md_literal, render_html,
                             render_markdown)

from .timing_replay import STEP_KINDS
from .validate import BAND_FIGURES


def _fmt(v, pct=False):
    if v is None:
        return "–"
    if pct:
        return f"{v:+.1%}"
    return fmt_number(v, 4)   # positional: 12346, not 1.235e+04


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


@dataclass(frozen=True)
class Targets:
    """Acceptance targets of a fidelity benchmark: |signed error| bounds on the saturation
    throughput and on the ``figures`` at p50 and p99 at the loads ``percentile_loads``
    (every load when None); at any other load whose rows carry a MAPE band, the band check
    (:data:`calibration.validate.BAND_FIGURES`)."""

    saturation: float
    p50: float
    p99: float
    figures: tuple = ("TTFT", "TPOT", "E2EL")
    percentile_loads: tuple | None = None


def target_verdicts(result: dict, targets: Targets) -> list[str]:
    """One line per target, on two readings of the replications, so that neither is left
    to be worked out from the table: the figure's mean error over the replications
    (:class:`calibration.validate.LoadResult` ``error.mean``, the reading of the fidelity
    tables) and every single replication's error (the worst of them). A band load counts
    the band figures whose mean measured value lies between the mean band edges, and those
    whose every replication lies in its own band (``in_band``), naming those outside with
    their mean measured value and mean band edges; with a host speed probe the same around
    the prediction at host speed. A figure undefined in some replication is
    judged on those where it is defined."""
    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    sat = result["saturation"]["error"]
    lines = [f"saturation throughput {sat:+.1%} (target ±{targets.saturation:.0%}): "
             f"{met(abs(sat) <= targets.saturation)}"]
    for ld in result["loads"]:
        rows = {row["figure"]: row for row in ld["table"]}
        if targets.percentile_loads is None or ld["load"] in targets.percentile_loads:
            for q in ("p50", "p99"):
                errs = [(rows[f"{f} {q}"]["error"], f"{f} {q}") for f in targets.figures
                        if (rows.get(f"{f} {q}") or {}).get("error")]
                if not errs:
                    continue
                bound = getattr(targets, q)
                mean, mean_fig = max(((e["mean"], fig) for e, fig in errs),
                                     key=lambda x: abs(x[0]))
                each, each_fig, r = max(
                    ((v, fig, i + 1) for e, fig in errs
                     for i, v in enumerate(e["each"]) if v is not None),
                    key=lambda x: abs(x[0]))
                lines.append(
                    f"load {ld['load']:g} {q}s of {', '.join(targets.figures)} (target "
                    f"±{bound:.0%}): mean over replications worst {mean:+.1%} ({mean_fig}): "
                    f"{met(abs(mean) <= bound)}; every replication worst {each:+.1%} "
                    f"({each_fig}, r{r}): {met(abs(each) <= bound)}")
            continue
        for key, label in (("", "MAPE band"), ("_adjusted", "MAPE band at host speed")):
            band = [row for row in ld["table"] if row.get("in_band" + key) is not None]
            if not band:
                continue
            center = "predicted" if not key else "adjusted"
            judged = [(row, row[f"band{key}"][0]["mean"], row[f"band{key}"][1]["mean"])
                      for row in band if None not in row[f"band{key}"] and row.get(center)]
            # the figures outside, with the edges they were judged on (the table prints
            # each replication's band, not the means')
            out = [f"{row['figure']} {_fmt(row['measured']['mean'])} outside "
                   f"[{_fmt(lo)}, {_fmt(hi)}]" for row, lo, hi in judged
                   if not lo <= row["measured"]["mean"] <= hi]
            lines.append(
                f"load {ld['load']:g} {label} ({len(band)} figures): the mean measured "
                f"value inside the mean band in {len(judged) - len(out)} of {len(band)}"
                + (f" ({'; '.join(out)})" if out else "") + "; every replication "
                f"inside its own band in {sum(row['in_band' + key] for row in band)} of "
                f"{len(band)}")
    return lines


def markdown_table(result: dict) -> str:
    """The validation as markdown (:func:`validation_blocks`)."""
    return render_markdown(validation_blocks(result))


def validation_blocks(result: dict) -> list:
    """The validation as report blocks (:func:`simulator.report.render_markdown` /
    ``render_html``): saturation line, then per load one row per figure (measured,
    predicted, signed error as mean [min, max] over replications; with a host speed probe
    also the prediction at the probed speed and its error), notes and definitions."""
    sat = result["saturation"]
    adj = sat.get("host_speed") is not None
    blocks = []

    def say(text: str) -> None:
        blocks.append(("p", text))

    say(f"saturation throughput ({sat['requests']} requests at once): measured "
        f"{sat['measured_rps']:.3f} req/s, predicted "
        f"{sat['predicted_rps']:.3f} req/s, error {sat['error']:+.1%}" + (
            f"; probed steps took ×{sat['host_speed']:.3f} their calibration time, "
            f"predicted at that host speed {sat['adjusted_rps']:.3f} req/s, error "
            f"{sat['adjusted_error']:+.1%}" if adj else ""))
    say("requests per replication (the scenario's arrival process at the load's rate, "
        "each replication its own seed): " + "; ".join(
        f"load {ld['load']:g}: {ld['num_requests']} requests at {ld['rate']:.3g} req/s"
        for ld in result["loads"]))
    if adj:
        say("host speed per replication (probe cells' median step times now / their "
            "calibration means, geometric mean over the cells; > 1: slower than at "
            "calibration): " + "; ".join(
                f"load {ld['load']:g}: " + ", ".join(f"×{v:.3f}" for v in ld["host_speed"])
                for ld in result["loads"]))
    ratios = [("saturation", [(sat.get("timing") or {}).get("step_cost_ratio")])] + [
        (f"load {ld['load']:g}", [t.get("step_cost_ratio") for t in ld["timing"]])
        for ld in result["loads"]]
    if any(v is not None for _, vs in ratios for v in vs):
        say("cost model on the engine's own steps (Σ priced / Σ measured step time; < 1: "
            "priced too fast): " + "; ".join(
                f"{label}: " + ", ".join("–" if v is None else f"×{v:.3f}" for v in vs)
                for label, vs in ratios))
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
        say("the same by step kind, prefill-only / mixed / decode-only (steps), over each "
            "load's replications: " + "; ".join(by_kind))
    apart = probe_disagreements(result) if adj else []
    if apart:
        say(f"probe and served steps disagree by more than {PROBE_AGREEMENT:.0%} "
            "(priced/measured × probe, 1 when the probe's host speed explains the "
            "mispricing) in " + "; ".join(f"{label}: ×{v:.3f}" for label, v in apart)
            + ": the prediction at host speed is not reliable there.")
    again = any("again_error" in row for ld in result["loads"] for row in ld["table"])
    again_band = any("again_in_band" in row for ld in result["loads"] for row in ld["table"])
    head = ["load", "figure", "measured", "predicted", "error"]
    if again:
        head.append("served again: difference")
    head.append("in MAPE band")
    if again_band:
        head.append("served again in MAPE band")
    if adj:
        head += ["predicted at host speed", "error at host speed", "in MAPE band around it"]
    say("TTFT, TPOT, ITL and E2EL in ms (as vllm bench serve); error = (predicted − "
        "measured) / measured; cells: mean [min, max] over replications. Below saturation "
        "both sides serve what arrives, so their throughputs agree by construction: the "
        "saturation line above is the throughput test.")

    def band(row, key):   # the verdict, and the band's edges where they are known
        if key not in row:
            return ""
        word = {True: "yes", False: "no", None: "–"}[row[key]]
        count = row.get(key.replace("in_band", "in_band_count"))
        if count and (count[2] > 1 or count[1] < count[2]):   # how many replications say so
            inside, judged, total = count
            word += f", {inside} of {judged}" + (f" judged of {total}" if judged < total
                                                 else "")
        edges = row.get(key.replace("in_band", "band"))
        if edges and None not in edges:   # every replication's band inside (each has its own)
            word += f" ({_fmt(edges[0]['min'], False)}–{_fmt(edges[1]['max'], False)})"
        return word

    rows = []
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
            rows.append(cells)
    blocks.append(("table", None, head, rows))
    if again:
        say("'served again': every replication's request list served a second time on a "
            "fresh engine; the difference of its figure from the first serving's, (again − "
            "first) / first: the engine's own run-to-run spread on this machine, a floor "
            "under any prediction's error.")
    say("'in MAPE band' is judged for " + ", ".join(BAND_FIGURES) + " (blank for the other "
        "figures): whether the measured value lies in the band of the prediction and the "
        "simulations with every step cost scaled by (1 − held-out MAPE) and (1 + held-out "
        "MAPE) (a short run's percentile need not move steadily with the step cost: the "
        "band holds its prediction), judged per replication against its own band: 'yes' "
        "when every judged replication lies in its band, after it how many of those judged "
        "do ('no, 2 of 3'; a replication whose figure or band is undefined is not judged); in "
        "parentheses the extent of the replications' bands (the lowest low end to the "
        "highest high end)"
        + ("; 'around it': the same around the prediction at host speed." if adj else "."))
    if again_band:
        say("'served again in MAPE band': whether the second serving lies in the band moved "
            "onto the first serving (band × first / predicted), i.e. how a prediction that "
            "hit the first serving exactly would fare against the engine's own second "
            "serving: where it says no, the engine's own run-to-run spread is wider than the "
            "band.")
    sat_t = sat.get("timing")
    say("timing replay (engine step durations): " + "; ".join(
        ([f"saturation: {_timing_verdict(sat_t)}"] if sat_t else [])
        + [f"load {ld['load']:g}: " + ", ".join(_timing_verdict(t) for t in ld["timing"])
           for ld in result["loads"]]))
    # the same definitions every servesim report carries (both sides are timed alike)
    return blocks + [("p", "Definitions:"), ("list", [f"{k}: {v}" for k, v in DEFINITIONS])]


def write_outputs(result: dict, out_dir) -> dict:
    """Write ``validation.json`` (the whole result, the first replication's per-request
    TTFT/TPOT/E2EL samples of each load under ``cdf`` too), ``validation.md``, one CDF PNG
    per load and ``validation.html`` into ``out_dir`` atomically
    (:func:`simulator.report.write_files`); returns file name -> path.

    Raises:
        InputError: ``out_dir`` cannot be written (``--out ...``).
    """
    import json

    from matplotlib.figure import Figure

    from simulator.report import _png, step_cdf, write_files

    files, images, captions = {}, {}, {}
    # with the first replication's per-request figures behind the CDF plots ("cdf"), so
    # that they can be checked without running again
    files["validation.json"] = json.dumps(result, indent=1).encode()
    for c in result.get("cdf", []):
        fig = Figure(figsize=(13, 3.8), layout="constrained")
        for ax, m in zip(fig.subplots(1, 3), ("ttft_ms", "tpot_ms", "e2el_ms")):
            for side, style in (("measured", "-"), ("predicted", "--")):
                v = np.sort(np.asarray(c[f"{side}_{m}"], dtype=float))
                if v.size:
                    step_cdf(ax, v, ls=style, label=side)
            ax.set_xlabel(f"{METRIC_LABELS[m]} (ms)")
            ax.set_ylabel("fraction ≤ x")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"load {c['load']:g} of saturation: measured (engine) vs predicted")
        name = f"cdf_load_{c['load']:g}.png"
        images[name] = files[name] = _png(fig)
        captions[name] = f"load {c['load']:g}: TTFT, TPOT and E2EL CDFs, measured vs predicted"
    title = f"Validation: {result['meta']['scenario']}"
    # the run's facts first: a table alone does not say what it is
    def fact(v) -> str:   # knobs as k=v, fractions to 4 figures
        if isinstance(v, dict):
            return ", ".join(f"{a}={fact(b)}" for a, b in v.items())
        return fmt_number(v, 4) if isinstance(v, float) else str(v)

    facts = [md_literal(f"{k}: {fact(v)}", cell=True) for k, v in result["meta"].items()]
    blocks = [("h1", title), ("list", facts),
              *validation_blocks(result),
              *(("img", name, caption) for name, caption in captions.items())]
    files["validation.md"] = render_markdown(blocks).encode()
    files["validation.html"] = render_html(blocks, title, images).encode()
    return write_files(out_dir, files)
