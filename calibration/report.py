"""The calibration report: one PNG of three panels and an HTML page around it.

Panels: (1) measured vs predicted step time, grid cells (mean ± spread of repeats, coloured
by kind) and replay steps, on log axes with the y = x line and ±20 % band; (2) decode step
time vs batch size at each measured context length (cells without a shared prefix),
measured means against the fitted model and the device roofline ``max(weights / bandwidth,
FLOPs / peak)`` from the measured ceilings (the floor no engine beats); (3) relative residuals
of every grid repeat and replay step. The page adds the error table, the coefficients and the
per-cell table, as report blocks rendered by :func:`simulator.report.render_html` (the run
report's renderer).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from simulator.files import atomic_write, commit_outputs
from simulator.report import literal_text, render_html

from .fit import (WITH_PATHS, WITH_REREAD, error_stats, pass_speeds, pass_spread, predict,
                  replay_predictions)

_KIND_COLOURS = {"prefill": "tab:blue", "decode": "tab:orange", "mixed": "tab:green"}


def _figure(profile, result, df, replay_df, k, peaks):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    form, coef = result.form, result.coefficients
    cells = result.cells
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))

    ax = axes[0]
    if replay_df is not None and len(replay_df):
        pr = replay_predictions(form, coef, k, replay_df, profile.idle) * 1e3
        ax.scatter(pr, replay_df["duration_ns"] / 1e6, s=6, c="0.6", alpha=0.5,
                   label="replay steps")
    for kind, colour in _KIND_COLOURS.items():
        sub = cells[cells["kind"] == kind]
        if len(sub):
            ax.errorbar(sub["predicted"] * 1e3, sub["seconds"] * 1e3,
                        yerr=sub["seconds"] * sub["cv"] * 1e3, fmt="o", ms=4, c=colour,
                        label=f"{kind} cells (mean ± sd)")
    lo = float(min(cells["seconds"].min(), cells["predicted"].min())) * 1e3 * 0.8
    hi = float(max(cells["seconds"].max(), cells["predicted"].max())) * 1e3 * 1.25
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs / 1.2, xs * 1.2, color="k", alpha=0.07, label="±20 %")
    ax.set(xscale="log", yscale="log", xlabel="predicted step time (ms)",
           ylabel="measured step time (ms)", title="measured vs predicted")
    ax.legend(fontsize=7)

    ax = axes[1]
    # decode cells without a shared prefix (those re-read some context: panel 1 shows them)
    dec = cells[(cells["kind"] == "decode") & (cells["reread_tokens"] == 0)]
    flops, bw = peaks
    if len(dec):
        dec = dec.assign(B=dec["decodes"].round().astype(int),
                         L=[int(c.split("L=")[1].split()[0]) for c in dec.index])
        cmap = plt.get_cmap("viridis")
        Ls = sorted(dec["L"].unique())
        for i, L in enumerate(Ls):
            sub = dec[dec["L"] == L].sort_values("B")
            col = cmap(i / max(1, len(Ls) - 1))
            ax.plot(sub["B"], sub["seconds"] * 1e3, "o", c=col, label=f"measured, L={L}")
            B = np.geomspace(sub["B"].min(), sub["B"].max(), 40)
            X = {"tokens": B, "requests": B, "prefill_tokens": 0 * B, "decodes": B,
                 "context_tokens": B * (L + 1), "attn_pairs": B * (L + 1), "sampled": B}
            ax.plot(B, predict(form, coef, k, X) * 1e3, "-", c=col, lw=1)
            if flops and bw:
                roof = np.maximum(k.weight_bytes / bw, (k.dense_flops_per_token * B
                                                         + k.lm_head_flops_per_sample * B
                                                         + k.attn_flops_per_pair * B * L)
                                  / flops) + k.kv_bytes_per_token * B * L / bw
                ax.plot(B, roof * 1e3, ":", c=col, lw=1)
        ax.plot([], [], "k-", lw=1, label="fitted model")
        ax.plot([], [], "k:", lw=1, label="device roofline (ceilings)")
        ax.set(xscale="log", yscale="log")
    ax.set(xlabel="decode batch size", ylabel="step time (ms)",
           title="decode step time vs batch")
    ax.legend(fontsize=7)

    ax = axes[2]
    res = np.asarray(result.residuals) * 100
    bins = np.linspace(min(-50, res.min() if res.size else -50),
                       max(50, res.max() if res.size else 50), 60)
    ax.hist(res, bins=bins, alpha=0.6, density=True, label="grid repeats")
    if replay_df is not None and len(replay_df):
        rr = (replay_df["duration_ns"] / 1e9
              / replay_predictions(form, coef, k, replay_df, profile.idle) - 1) * 100
        ax.hist(rr, bins=bins, alpha=0.5, density=True, label="replay steps")
    ax.set(xlabel="measured / predicted − 1 (%)", ylabel="density", title="residuals")
    ax.legend(fontsize=7)
    fig.suptitle(f"{profile.name}: {profile.model.name} {profile.dtype} on "
                 f"{profile.device.name} ({profile.engine})", fontsize=10)
    fig.tight_layout()
    return fig


def efficiency_cells(eff: dict) -> list[tuple[str, str]]:
    """``(name, value)`` rows of a profile's efficiencies (None left out), 3 significant
    figures; one at the fit's bound (:data:`simulator.cost_model.MAX_EFFICIENCY` × the
    ceiling) says so: its term was too small in the measured steps to be fitted."""
    from simulator.cost_model import MAX_EFFICIENCY

    return [(n, f"{v:.3g}" + (" (the fit's bound: too small a term in these steps to fit)"
                              if v >= MAX_EFFICIENCY * (1 - 1e-6) else ""))
            for n, v in eff.items() if v is not None]


def report_files(profile, result, df, replay_df, k, peaks, html_path) -> dict[Path, bytes]:
    """The calibration report's files, built in memory: ``html_path`` and the PNG beside it
    (``.png`` instead of ``.html``).

    Args:
        profile: the :class:`simulator.cost_model.Profile` written. result:
            :class:`calibration.fit.FitResult`. df: grid measurements. replay_df: replay
            steps or ``None``. k: :class:`RooflineConstants`. peaks: measured (FLOP/s,
            bytes/s).

    Returns:
        ``{html path: bytes, png path: bytes}``.
    """
    html_path = Path(html_path)
    fig = _figure(profile, result, df, replay_df, k, peaks)
    buf = io.BytesIO()
    literal_text(fig)   # the title names the profile, its model and device as written
    fig.savefig(buf, format="png", dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    png = buf.getvalue()
    png_name = html_path.with_suffix(".png").name

    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    err_rows = [("held-out grid cells", result.heldout)]
    if profile.error and profile.error.replay:
        err_rows.append(("replay steps (never fitted)", profile.error.replay.model_dump()))
    for form, s in result.candidates.items():
        err_rows.append((f"held-out cells, {form} form", s))
    coef = profile.cost.coefficients
    kept = ((WITH_PATHS if "prefill_step_s" in coef else profile.cost.form)
            + (WITH_REREAD if "w_reread_bytes_per_s" in coef else ""))
    cells = result.cells
    fit_all = error_stats(cells["seconds"], cells["predicted"])
    speeds = pass_speeds(df)
    flops, bw = peaks
    title = f"Calibration {profile.name}"
    blocks = [
        ("h1", title),
        ("p", f"**measured** on {profile.device.name} with {profile.engine}: "
              f"{profile.model.name} ({profile.dtype}), {profile.provenance.date}. Device "
              f"ceilings measured: matmul {flops:.3g} FLOP/s, copy {bw:.3g} B/s. Kept form: "
              f"**{kept}**. Command: `{profile.provenance.command}`"),
        ("img", png_name, "measured vs predicted step time; decode step time vs batch; "
                          "residuals"),
        ("h2", "Step-time error"),
        ("p", "Absolute relative error |predicted / measured − 1|. Held-out: each grid cell "
              "(all its repeats) predicted by a fit that left it out. Replay: single steps of "
              "an engine replay of a Poisson workload that the fit never saw. In-sample (all "
              f"cells fitted): MAPE {pct(fit_all['mape'])}, max {pct(fit_all['max'])}."),
        ("table", None, ["error set", "n", "MAPE", "p90", "max"],
         [[n, str(s["n"]), pct(s["mape"]), pct(s["p90"]), pct(s["max"])]
          for n, s in err_rows]),
        ("p", "Speed of each interleaved pass over the grid (median over its steps of step "
              "time / the cell's median; 1 on a steady device; slowest over fastest "
              f"{pct(pass_spread(speeds))}): "
              + ", ".join(f"{p + 1}: ×{v:.3f}" for p, v in speeds.items())
              + ". A slow phase of a shared host moves every cell of a pass alike, so the "
                "held-out error does not show it; the profile prices the average over the "
                "passes."),
        ("h2", "Coefficients"),
        ("table", None, ["coefficient", "value"],
         [[n, f"{v:.4g}"] for n, v in profile.cost.coefficients.items()]),
    ]
    idle = profile.idle
    if idle is not None:
        blocks += [
            ("h2", "First step after idle"),
            ("p", "Extra time of a step that ends a wait for work, over the same step back "
                  "to back (" + (f"{idle.reference_s * 1e3:.3g} ms" if idle.reference_s
                                 else "") + "): per idle time the median over passes, "
                  "raised to the largest at any shorter idle time (a longer wait never costs "
                  "less); the simulator adds it, linear between these points, to the first "
                  "step after an idle replica wakes."),
            ("table", None, ["idle s", "extra ms"],
             [[f"{g:g}", f"{x * 1e3:.3g}"] for g, x in zip(idle.gaps_s, idle.extra_s)])]
    blocks += [
        ("h2", "Efficiencies (achieved / peak)"),
        ("table", None, ["efficiency", "value"],
         [list(c) for c in efficiency_cells(profile.efficiencies.model_dump())]),
        ("p", "Achieved rates of the fitted cost model over the ceilings measured above "
              "(mbu: weight bytes per second over the copy ceiling; mfu: FLOP/s over the "
              "matmul ceiling; attn_*: the same for attention). Above 1 means the fit's rate "
              "beats the measured ceiling: on a CPU the weights of a small model partly stay "
              "in cache between steps, which a streaming copy ceiling does not see. They are "
              "fitted figures, not device limits."),
        ("h2", "Grid cells"),
        ("table", None, ["cell", "repeats", "mean ms", "cv", "fitted ms", "fit error",
                         "held-out error"],
         [[str(idx), str(int(r["n"])), f"{r['seconds'] * 1e3:.3f}", pct(r["cv"]),
           f"{r['predicted'] * 1e3:.3f}", pct(r["predicted"] / r["seconds"] - 1),
           pct(r["heldout"] / r["seconds"] - 1)] for idx, r in cells.iterrows()]),
        ("p", profile.provenance.source),
    ]
    page = render_html(blocks, title, {png_name: png})
    return {html_path: page.encode("utf-8"), html_path.with_suffix(".png"): png}


def write_calibration(profile, out, result, df, replay_df, k, peaks, html_path) -> dict:
    """Write a calibration's outputs together: its report (:func:`report_files`) and the
    profile ``out`` (:func:`simulator.cost_model.save_profile`).

    The report is built in memory first, then :func:`simulator.files.commit_outputs` runs
    (the console script ignores Ctrl-C and SIGTERM from there on) and each file is renamed
    into place (:func:`simulator.files.atomic_write`): an interrupt leaves either none of
    them or all, never a profile without its report.

    Returns:
        ``{"html": Path, "png": Path}`` of the report.

    Raises:
        OSError: a file cannot be written.
    """
    from simulator.cost_model import save_profile

    report = report_files(profile, result, df, replay_df, k, peaks, html_path)
    commit_outputs()
    for path, data in report.items():
        atomic_write(path, data)
    save_profile(profile, out)
    return {"html": Path(html_path), "png": Path(html_path).with_suffix(".png")}


__all__ = ["report_files", "write_calibration"]
