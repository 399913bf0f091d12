"""Fit step-cost coefficients to measured steps and say how accurate they are.

Each grid cell's *mean* step time is fitted (throughput follows the mean; a median would
flatter the engine). Two forms of :mod:`simulator.cost_model` compete:

* ``roofline`` (the physically grounded starting point), fitted with
  ``scipy.optimize.least_squares`` in inverse rates (seconds per byte / per FLOP), bounded
  so that no rate exceeds :data:`MAX_EFFICIENCY` × the device's measured ceiling;
* ``linear``, fitted exactly by non-negative least squares (``scipy.optimize.nnls``).

Both minimise *relative* residuals ``predicted / measured − 1`` (every cell counts alike,
as percentage errors are what users read). The held-out error comes from k-fold cross
validation over whole cells (all repeats of a cell leave together). ``roofline`` is kept
unless ``linear`` beats its held-out MAPE by more than :data:`SWITCH_MARGIN`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import least_squares, nnls

from simulator.cost_model import (COEFFICIENTS, MAX_EFFICIENCY, MAX_REREAD_SPEEDUP,
                                  PATH_COEFFICIENTS, RooflineConstants, chunk_features,
                                  linear_seconds, roofline_seconds)

FEATURES = ("tokens", "requests", "prefill_tokens", "decodes", "context_tokens", "attn_pairs",
            "sampled", "reread_tokens")
# Keep the physically grounded form unless the other one's held-out MAPE is this much lower.
SWITCH_MARGIN = 0.10
#: Fewest grid cells a fit takes (some to fit, one at least held out).
MIN_CELLS = 4
HELDOUT_FOLDS = 5


class TooFewCells(ValueError):
    """A fit given fewer than :data:`MIN_CELLS` grid cells (nothing left to hold out)."""


#: The candidate name of the roofline fitted with its path costs (:func:`fit_measurements`).
WITH_PATHS = "roofline + path costs"
#: What the candidate name of the kept roofline adds with its re-read rate
#: (:func:`fit_measurements`): ``roofline + re-read rate``, ``roofline + path costs +
#: re-read rate``.
WITH_REREAD = " + re-read rate"
# Grid passes whose speeds (pass_speeds) differ by more than this: the host was not steady.
PASS_SPREAD_WARN = 0.10
MAX_RESIDUALS = 4000
# A step this many times its cell's fastest step was disturbed, not a cost of the engine:
# another process took a core its threads needed (10-40x seen on a 2-core CPU, 2 threads
# beside a busy core, in two of a cell's three passes at times, so not the median), which
# the run-queue check of a step can miss; a quiet host's steps stay within 1.8x of the
# fastest. Left out of the fit and its residuals (the CSV keeps every step).
OUTLIER_FACTOR = 3.0


def outlier_steps(df) -> np.ndarray:
    """Boolean mask of the steps of ``df`` (a measurements table) taking more than
    :data:`OUTLIER_FACTOR` × their cell's fastest step (a disturbance only slows a step)."""
    fastest = df.groupby("cell")["duration_ns"].transform("min")
    return (df["duration_ns"] > OUTLIER_FACTOR * fastest).to_numpy()


def pass_speeds(df) -> dict[int, float]:
    """Per grid pass (the ``pass`` column), the median over its steps of step time / that
    cell's median step time over all passes: 1 everywhere on a steady device; ×1.12 for a
    pass that runs 12% slow. A shared host's slow phase moves every cell measured in it
    alike, so the held-out error never shows it; this does (:data:`PASS_SPREAD_WARN`).
    Only the prefill cells' steps are compared where the table has a ``kind`` column with
    any: they are the same in every pass, while the decode groups' contexts grow from pass
    to pass on CPU (:func:`calibration.profiler.pass_extra_blocks`)."""
    if "kind" in df and (df["kind"] == "prefill").any():
        df = df[df["kind"] == "prefill"]
    med = df.groupby("cell")["duration_ns"].transform("median")
    r = (df["duration_ns"] / med).groupby(df["pass"]).median()
    return {int(p): float(v) for p, v in r.items()}


def pass_spread(speeds: dict[int, float]) -> float:
    """Slowest over fastest pass of :func:`pass_speeds`, minus 1 (0 with < 2 passes)."""
    v = list(speeds.values())
    return max(v) / min(v) - 1 if len(v) > 1 and min(v) > 0 else 0.0


def cell_means(df):
    """Per-cell means of duration (``seconds``) and features, with the repeat count ``n``
    and the relative standard deviation ``cv`` of the step time. Sorted by cell key."""
    g = df.assign(seconds=df["duration_ns"] / 1e9).groupby("cell", sort=True)
    out = g[["seconds", *FEATURES]].mean()
    out["n"] = g.size()
    out["cv"] = (g["seconds"].std(ddof=0) / out["seconds"]).fillna(0.0)
    out["kind"] = g["kind"].first()
    return out


def predict(form: str, coef: dict, k: RooflineConstants | None, X) -> np.ndarray:
    """Step seconds of ``form`` for feature rows ``X`` (a DataFrame or mapping of
    :data:`FEATURES` arrays); same arithmetic as the simulator's cost model."""
    if form == "roofline":
        return np.asarray(roofline_seconds(coef, k, X["tokens"], X["requests"],
                                           X["context_tokens"], X["attn_pairs"],
                                           X["sampled"], X["prefill_tokens"], X["decodes"],
                                           X["reread_tokens"] if "reread_tokens" in X else 0),
                          dtype=float)
    if form == "linear":
        return np.asarray(linear_seconds(coef, X["prefill_tokens"], X["decodes"],
                                         X["context_tokens"]), dtype=float)
    return np.full(len(X["tokens"]), float(coef["constant_s"]))


def step_price(form: str, coef: dict, k: RooflineConstants | None):
    """``seconds(n, c, B)``: :func:`predict` for one step of an ``n``-token prefill chunk
    after ``c`` computed tokens (none when ``n`` is 0) beside ``B`` decodes at context ``c``
    each, in seconds (what :func:`calibration.cli.replay_workload` sizes its load with)."""
    def seconds(n: int, c: int, B: int) -> float:
        f = chunk_features([(n, c)] if n else [], B, B * c, B + int(n > 0))
        return float(predict(form, coef, k, {x: [v] for x, v in asdict(f).items()})[0])
    return seconds


def error_stats(measured, predicted) -> dict:
    """Absolute relative errors ``|predicted / measured − 1|``: mean (MAPE), 90th percentile
    (``numpy.percentile``, linear), maximum, count; fractions."""
    e = np.abs(np.asarray(predicted, float) / np.asarray(measured, float) - 1.0)
    if e.size == 0:
        return {"mape": 0.0, "p90": 0.0, "max": 0.0, "n": 0}
    return {"mape": float(e.mean()), "p90": float(np.percentile(e, 90)),
            "max": float(e.max()), "n": int(e.size)}


# -- the two fits ---------------------------------------------------------------------------

def fit_linear(X, y) -> dict:
    """Non-negative ``base_s, per_prefill_token_s, per_decode_seq_s, per_context_token_s``
    minimising the relative residuals (rows divided by the measured time, then NNLS)."""
    y = np.asarray(y, float)
    A = np.column_stack([np.ones_like(y), np.asarray(X["prefill_tokens"], float),
                         np.asarray(X["decodes"], float), np.asarray(X["context_tokens"], float)])
    scale = np.abs(A / y[:, None]).max(axis=0)
    scale[scale == 0] = 1.0
    q, _ = nnls(A / y[:, None] / scale, np.ones_like(y))
    return dict(zip(COEFFICIENTS["linear"], (q / scale).tolist()))


def fit_roofline(X, y, k: RooflineConstants, peak_flops: float | None = None,
                 peak_bandwidth: float | None = None, paths: bool = True,
                 reread: bool = True) -> dict:
    """Roofline coefficients minimising the relative residuals.

    Unknowns ``a0, c, 1/W_eff, 1/F_eff, 1/W_attn, 1/F_attn`` are each scaled to the share
    of the median step they explain, then fitted from several starts (weight- or
    FLOP-bound dense layers, light or heavy attention); the lowest cost wins.
    Rates are capped at :data:`MAX_EFFICIENCY` × the given ceilings. Optional unknowns
    (:data:`simulator.cost_model.OPTIONAL_COEFFICIENTS`), fitted only where the cells tell
    them apart, then from that fit onwards, kept only if they lower the cost (else given
    at that fit's values: path costs at their bound, ~0, and re-reads priced as reads):

    * with ``paths`` and mixed cells (a prefill chunk beside decodes) among ``X``, the path
      costs ``prefill_step_s`` and ``decode_step_s``: only there does a step hold both, so
      that they and ``a0`` are told apart;
    * with ``reread`` and cells that re-read context (``reread_tokens`` > 0: decodes
      sharing a cached prefix), ``w_reread_bytes_per_s``, at least ``w_attn_bytes_per_s``
      (a read from cache is never slower than one from memory; a noisy host can make
      the shared cells look slower); elsewhere it equals ``w_attn_bytes_per_s`` (re-reads
      priced as first reads) and is not given.
    """
    y = np.asarray(y, float)
    T = np.asarray(X["tokens"], float)
    R = np.asarray(X["requests"], float)
    again = np.asarray(X["reread_tokens"], float) if "reread_tokens" in X else np.zeros_like(y)
    ctx = np.asarray(X["context_tokens"], float) - again
    pairs = np.asarray(X["attn_pairs"], float)
    S = np.asarray(X["sampled"], float)
    has_p = (np.asarray(X["prefill_tokens"], float) > 0).astype(float)
    has_d = (np.asarray(X["decodes"], float) > 0).astype(float)
    paths = paths and bool(np.any(has_p * has_d))
    reread = reread and bool(np.any(again > 0))
    wb, ft = k.weight_bytes, k.dense_flops_per_token * T
    kvb, af, lm = k.kv_bytes_per_token * ctx, k.attn_flops_per_pair * pairs, \
        k.lm_head_flops_per_sample * S
    kvr = k.kv_bytes_per_token * again
    med = float(np.median(y))

    def unit(v):
        v = v[v > 0]
        return med / float(np.median(v)) if v.size else 1.0

    # unknowns in order: the six of every fit, then W_attn / W_reread (a re-read's share of
    # a first read's time: at most 1, a byte from cache is never slower than from memory),
    # then the two path costs
    scale = np.array([med, unit(R), med / wb, unit(ft + lm), unit(kvb), unit(af), 1.0,
                      med, med])
    lo, hi = np.zeros(9), np.full(9, np.inf)
    if peak_bandwidth:
        lo[2] = lo[4] = 1.0 / (MAX_EFFICIENCY * peak_bandwidth)
    if peak_flops:
        lo[3] = lo[5] = 1.0 / (MAX_EFFICIENCY * peak_flops)
    lo = np.maximum(lo / scale, 1e-9)
    lo[6], hi[6] = 1.0 / MAX_REREAD_SPEEDUP, 1.0
    free = np.array([True] * 6 + [reread] + [paths] * 2)

    def full(p, m):
        """All nine unknowns from the ``m`` fitted: re-reads priced as reads and path costs
        at their bound where not fitted."""
        x = lo.copy()
        x[6] = 1.0
        x[np.flatnonzero(m)] = p
        return x * scale

    def model(x):
        a0, c, iw, i_f, iwa, ifa, share, sp, sd = x
        return (a0 + c * R + np.maximum(wb * iw, ft * i_f) + (kvb + share * kvr) * iwa
                + af * ifa + lm * i_f + sp * has_p + sd * has_d)

    starts = [np.array(x) for x in ([0.3, 0.05, 0.5, 0.2, 0.1, 0.1, 0.8, 0.05, 0.05],
                                    [0.1, 0.05, 0.2, 0.8, 0.1, 0.1, 0.6, 0.1, 0.1],
                                    [0.3, 0.05, 0.5, 0.5, 0.4, 0.4, 0.9, 0.02, 0.02],
                                    [0.05, 0.01, 0.9, 0.9, 0.02, 0.02, 0.5, 0.2, 0.2])]

    def fit(m, starts, **tol):
        """The lowest-cost fit of the unknowns ``m`` (a mask) over ``starts``."""
        def res(p):
            return model(full(p, m)) / y - 1.0
        best = None
        for start in starts:
            x0 = np.clip(start[m], lo[m] * 1.01, hi[m] * 0.99)
            r = least_squares(res, x0, bounds=(lo[m], hi[m]), method="trf", x_scale="jac",
                              **tol)
            if best is None or r.cost < best.cost:
                best = r
        return best

    base = free.copy()
    base[6:] = False
    best, m = fit(base, starts, max_nfev=2000), base
    if free[6:].any():
        # The path costs trade off against a0 along a shallow valley (tight tolerances),
        # and the max() of the dense term's kink traps every start above it at one point
        # worse than the fit without them (synthetic data: 15 of 16 fits). The model holds
        # that fit (re-reads priced as reads, path costs at 0): start there too, and never
        # keep a worse one.
        held = full(best.x, base) / scale
        held[6], held[7:] = 0.99, lo[7:] * 1.01
        more = fit(free, starts + [held], ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=5000)
        if more.cost <= best.cost:
            best, m = more, free
    a0, c, iw, i_f, iwa, ifa, share, sp, sd = full(best.x, m)
    coef = {"a0_s": float(a0), "per_request_s": float(c), "w_eff_bytes_per_s": float(1 / iw),
            "f_eff_flops_per_s": float(1 / i_f), "w_attn_bytes_per_s": float(1 / iwa),
            "f_attn_flops_per_s": float(1 / ifa)}
    if paths:
        coef.update(prefill_step_s=float(sp), decode_step_s=float(sd))
    if reread:
        coef["w_reread_bytes_per_s"] = float(1 / (iwa * share))
    return coef


def fit_form(form: str, X, y, k: RooflineConstants, peaks: tuple = (None, None),
             paths: bool = True, reread: bool = True) -> dict:
    """Coefficients of ``form`` (``roofline`` or ``linear``) for cell features ``X`` and
    mean seconds ``y``; ``peaks`` = (FLOP/s, bytes/s) ceilings for the roofline bounds;
    ``paths``, ``reread``: whether the roofline may fit its path costs and its re-read rate
    (:func:`fit_roofline`).

    Raises:
        ValueError: an unknown ``form``.
    """
    if form == "roofline":
        return fit_roofline(X, y, k, *peaks, paths=paths, reread=reread)
    if form == "linear":
        return fit_linear(X, y)
    raise ValueError(f"unknown form {form!r}")


def heldout_predictions(form: str, cells, k: RooflineConstants, peaks=(None, None),
                        folds: int = HELDOUT_FOLDS, seed: int = 0,
                        paths: bool = True, reread: bool = True) -> np.ndarray:
    """Each cell's mean step time predicted by a fit that never saw the cell: cells are
    shuffled (``numpy.random.default_rng(seed)``) into ``folds`` groups, each predicted from
    the others."""
    n = len(cells)
    folds = max(2, min(folds, n))
    order = np.random.default_rng(seed).permutation(n)
    fold_of = np.empty(n, dtype=int)
    fold_of[order] = np.arange(n) % folds
    out = np.empty(n)
    y = cells["seconds"].to_numpy()
    for f in range(folds):
        test = fold_of == f
        coef = fit_form(form, cells[~test], y[~test], k, peaks, paths, reread)
        out[test] = predict(form, coef, k, cells[test])
    return out


# -- the whole fit --------------------------------------------------------------------------

@dataclass
class FitResult:
    """A fitted step-cost model and its errors.

    Attributes:
        form, coefficients: the kept form and its coefficients (seconds, bytes/s, FLOP/s).
        roofline: the roofline coefficients (also when ``linear`` was kept; efficiencies
            come from them).
        heldout: :func:`error_stats` of the kept form on held-out cells.
        candidates: held-out stats of every form tried (and of :data:`WITH_PATHS`, and of
            the kept roofline with :data:`WITH_REREAD`).
        residuals: ``measured / predicted − 1`` of every measured step (all repeats but
            the disturbed ones).
        cells: per-cell table (:func:`cell_means`) with ``predicted`` and ``heldout``.
        dropped: disturbed steps left out (:func:`outlier_steps`).
    """

    form: str
    coefficients: dict
    roofline: dict
    heldout: dict
    candidates: dict
    residuals: list
    cells: object = field(repr=False)
    dropped: int = 0


def fit_measurements(df, k: RooflineConstants, peaks=(None, None), seed: int = 0,
                     forms=("roofline", "linear"), paths: bool = True,
                     reread: bool = True) -> FitResult:
    """Fit every form in ``forms`` to the cell means of ``df`` (a measurements table,
    :func:`calibration.profiler.read_measurements`), keep one (module docstring), and return
    its coefficients, held-out error and residuals, leaving out disturbed steps
    (:func:`outlier_steps`). Deterministic for a given table.

    The roofline is tried without and, given ``paths`` and mixed cells, with its path costs
    (:func:`fit_roofline`; candidate :data:`WITH_PATHS`); they are kept only if they lower
    its held-out MAPE (more coefficients fit the cells better, not always the cells left
    out). ``paths=False``: never (the roofline without path costs). Then, given ``reread``
    and cells that re-read context, the kept roofline is tried with its re-read rate
    (candidate :data:`WITH_REREAD`), kept on the same rule: a rate fitted from a few
    shared-prefix cells on a host whose speed moves may fit the noise, and it moves every
    shared-prefix workload's price.

    Raises:
        TooFewCells: fewer than 4 cells (nothing to hold out).
    """
    wild = outlier_steps(df)
    df = df[~wild]
    cells = cell_means(df)
    if len(cells) < MIN_CELLS:
        raise TooFewCells(f"need at least {MIN_CELLS} measured cells to fit and hold out, got "
                         f"{len(cells)}")
    y = cells["seconds"].to_numpy()
    cand, held = {}, {}
    for form in forms:
        held[form] = heldout_predictions(form, cells, k, peaks, seed=seed, paths=False,
                                         reread=False)
        cand[form] = error_stats(y, held[form])
    chosen = dict(cand)   # each form's kept variant

    def better(name: str, **opts) -> bool:
        """Whether the roofline fitted with ``opts`` predicts the held-out cells better
        than the kept variant; if so it is kept (candidate ``name`` either way)."""
        h = heldout_predictions("roofline", cells, k, peaks, seed=seed, **opts)
        cand[name] = error_stats(y, h)
        if cand[name]["mape"] < chosen["roofline"]["mape"]:
            held["roofline"], chosen["roofline"] = h, cand[name]
            return True
        return False

    tried = "roofline" in forms
    mixed = bool(((cells["prefill_tokens"] > 0) & (cells["decodes"] > 0)).any())
    paths = paths and tried and mixed and better(WITH_PATHS, paths=True, reread=False)
    reread = (reread and tried and bool((cells["reread_tokens"] > 0).any())
              and better((WITH_PATHS if paths else "roofline") + WITH_REREAD, paths=paths))
    form = forms[0]
    for other in forms[1:]:
        if chosen[other]["mape"] < (1 - SWITCH_MARGIN) * chosen[form]["mape"]:
            form = other
    coef = fit_form(form, cells, y, k, peaks, paths, reread)
    roof = coef if form == "roofline" else (fit_form("roofline", cells, y, k, peaks, paths,
                                                     reread)
                                            if "roofline" in forms else {})
    cells = cells.assign(predicted=predict(form, coef, k, cells), heldout=held[form])
    per_step = predict(form, coef, k, df)
    res = (df["duration_ns"].to_numpy() / 1e9) / per_step - 1.0
    if res.size > MAX_RESIDUALS:  # an even, deterministic thinning keeps the shape
        res = np.sort(res)[np.linspace(0, res.size - 1, MAX_RESIDUALS).round().astype(int)]
    return FitResult(form, coef, roof, chosen[form], cand,
                     [round(float(r), 5) for r in res], cells, int(wild.sum()))


def replay_predictions(form: str, coef: dict, k: RooflineConstants, steps,
                       idle=None) -> np.ndarray:
    """Seconds of single replay steps (a table with :data:`FEATURES`) as the simulator
    prices them: :func:`predict`, plus ``idle``'s wake-up cost
    (:class:`simulator.cost_model.IdleInfo`) for the ``idle_ns`` the engine waited before
    a step (a column a replay table may lack: then no wake-up cost)."""
    t = predict(form, coef, k, steps)
    if idle is not None and "idle_ns" in steps:
        t = t + idle.seconds(steps["idle_ns"].to_numpy() / 1e9)
    return t


def replay_errors(form: str, coef: dict, k: RooflineConstants, steps, idle=None) -> dict:
    """:func:`error_stats` of single replay steps (a table with :data:`FEATURES` and
    ``duration_ns``) against :func:`replay_predictions`."""
    return error_stats(steps["duration_ns"].to_numpy() / 1e9,
                       replay_predictions(form, coef, k, steps, idle))


def refit_profile(profile, reread: bool | None = None) -> FitResult:
    """Fit again from the measurements CSV beside a loaded profile (its
    ``provenance.measurements_csv``), with the profile's model, dtype and peaks, and its
    path costs and re-read rate only if it has them: the same numbers the profile reports, for
    checking a profile or re-deciding its form. ``reread``: whether the re-read rate may be
    fitted (default: whether the profile has one; ``False`` refits without it).

    Raises:
        InputError: the profile names no CSV, or the CSV is missing, malformed or holds
            fewer than :data:`MIN_CELLS` grid cells.
    """
    from simulator.errors import InputError

    from .profiler import read_measurements

    rel = profile.provenance.measurements_csv
    if not rel or profile.path is None:
        raise InputError(f"profile {profile.name}: no measurements CSV recorded")
    df = read_measurements(profile.path.parent / rel)
    k = RooflineConstants.of(profile.model_shape, profile.dtype, profile.tensor_parallel)
    coef = profile.cost.coefficients
    try:
        return fit_measurements(df, k, (profile.device.peak_flops,
                                        profile.device.memory_bandwidth),
                                paths=any(c in coef for c in PATH_COEFFICIENTS),
                                reread=("w_reread_bytes_per_s" in coef if reread is None
                                        else reread))
    except TooFewCells as e:   # a CSV cut short, or one of its header only
        raise InputError(f"{profile.path.parent / rel}: {e}") from None


__all__ = ["FEATURES", "FitResult", "MAX_EFFICIENCY", "OUTLIER_FACTOR", "PASS_SPREAD_WARN",
           "SWITCH_MARGIN", "TooFewCells", "WITH_PATHS", "WITH_REREAD", "cell_means",
           "error_stats", "fit_form", "fit_linear", "fit_measurements", "fit_roofline",
           "heldout_predictions", "outlier_steps", "pass_speeds", "pass_spread", "predict",
           "refit_profile", "replay_errors", "replay_predictions"]
