"""The calibration fit recovers known coefficients from synthetic steps, holds out whole
cells, and computes its error statistics as defined (hand-computed values)."""

import numpy as np
import pandas as pd
import pytest

from calibration.fit import (WITH_PATHS, WITH_REREAD, TooFewCells, cell_means, error_stats,
                             fit_linear, fit_measurements, fit_roofline, heldout_predictions,
                             pass_speeds, pass_spread, predict)
from simulator.catalog import load_model
from simulator.cost_model import RooflineConstants, roofline_seconds

K = RooflineConstants.of(load_model("llama-tiny-56m"), "float32")
# Every term matters somewhere on the grid below: a 2 ms floor, weight streaming at
# 10 GB/s (22 ms), dense FLOPs at 50 GFLOP/s (crossover near 14 tokens), KV reads and
# attention FLOPs visible at long contexts.
TRUE = {"a0_s": 2e-3, "per_request_s": 1e-4, "w_eff_bytes_per_s": 1e10,
        "f_eff_flops_per_s": 5e10, "w_attn_bytes_per_s": 4e9, "f_attn_flops_per_s": 2e10}


def synthetic_steps(coef, noise=0.0, seed=0, repeats=3, mixed=True, shared=False):
    """A measurements table over prefill, decode, (``mixed``) mixed and (``shared``)
    shared-prefix decode cells priced by the roofline."""
    rng = np.random.default_rng(seed)
    rows = []

    def add(cell, kind, chunks, B, L, s=0, g=1):
        pt = sum(n for n, _ in chunks)
        ctx = sum(c + n for n, c in chunks) + B * L
        pairs = sum(n * (c + (n + 1) / 2) for n, c in chunks) + B * L
        f = dict(tokens=pt + B, requests=len(chunks) + B, prefill_tokens=pt, decodes=B,
                 context_tokens=ctx, attn_pairs=pairs, sampled=len(chunks) + B,
                 reread_tokens=(B - g) * s)   # B decodes read g prefixes of s tokens
        t = float(roofline_seconds(coef, K, f["tokens"], f["requests"], ctx, pairs,
                                   f["sampled"], pt, B, f["reread_tokens"]))
        for _ in range(repeats):
            rows.append({"cell": cell, "kind": kind,
                         "duration_ns": t * (1 + noise * rng.standard_normal()) * 1e9, **f})

    for n in (16, 64, 256, 1024):
        for c in (0, 512, 2048):
            add(f"prefill n={n} c={c}", "prefill", [(n, c)], 0, 0)
    for B in (1, 2, 4, 8, 16, 32):
        for L in (64, 512, 2048):
            add(f"decode B={B} L={L}", "decode", [], B, L)
    for B, L, n, c in ((4, 256, 64, 0), (8, 1024, 256, 512)) if mixed else ():
        add(f"mixed B={B} L={L} n={n} c={c}", "mixed", [(n, c)], B, L)
    for B, L, s, g in ((8, 256, 128, 2), (24, 512, 128, 4), (24, 2048, 1024, 4)) if shared \
            else ():
        add(f"decode B={B} L={L} s={s} g={g}", "decode", [], B, L, s, g)
    return pd.DataFrame(rows)


def test_roofline_fit_recovers_known_coefficients():
    df = synthetic_steps(TRUE)
    cells = cell_means(df)
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    for name, want in TRUE.items():
        assert got[name] == pytest.approx(want, rel=2e-3), name
    # the path costs it may add are nil here
    assert got["prefill_step_s"] < 1e-6 and got["decode_step_s"] < 1e-6


def test_roofline_fit_recovers_the_attention_paths_fixed_costs():
    # a step holding a prefill chunk pays 3 ms more, one holding decodes 1 ms more: a mixed
    # step pays both, and the mixed cells tell the two apart from a0
    true = {**TRUE, "prefill_step_s": 3e-3, "decode_step_s": 1e-3}
    cells = cell_means(synthetic_steps(true))
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    assert set(got) == set(true)
    for name, want in true.items():
        assert got[name] == pytest.approx(want, rel=2e-3), name
    # without a mixed cell a0 and the two are not told apart: none is fitted
    cells = cell_means(synthetic_steps(TRUE, mixed=False))
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    assert set(got) == set(TRUE)


def test_roofline_fit_recovers_the_reread_rate_from_shared_prefix_cells():
    # re-read KV bytes at 3x a first read's rate; the shared-prefix decode cells (each step
    # re-reads (B - g) * s tokens) tell it apart from w_attn
    true = {**TRUE, "w_reread_bytes_per_s": 1.2e10}
    cells = cell_means(synthetic_steps(true, mixed=False, shared=True))
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    assert set(got) == set(true)
    for name, want in true.items():
        assert got[name] == pytest.approx(want, rel=2e-3), name
    # re-reads priced as first reads: the same cells fit w_attn there too
    cells = cell_means(synthetic_steps(TRUE, mixed=False, shared=True))
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    assert got["w_reread_bytes_per_s"] == pytest.approx(TRUE["w_attn_bytes_per_s"], rel=2e-3)
    # shared cells slower than their features say (a noisy host): a re-read is never
    # priced above a first read, the rate stops at w_attn
    cells = cell_means(synthetic_steps({**TRUE, "w_reread_bytes_per_s": 2e9}, mixed=False,
                                       shared=True))
    got = fit_roofline(cells, cells["seconds"], K, peak_flops=1e11, peak_bandwidth=2e10)
    assert got["w_reread_bytes_per_s"] == pytest.approx(got["w_attn_bytes_per_s"], rel=1e-9)
    # no cell re-reads: no rate to fit, none given (the cost model prices re-reads as reads)
    cells = cell_means(synthetic_steps(true, mixed=False))
    assert "w_reread_bytes_per_s" not in fit_roofline(cells, cells["seconds"], K, 1e11, 2e10)


def test_path_costs_are_kept_only_where_they_predict_held_out_cells_better():
    true = {**TRUE, "prefill_step_s": 3e-3, "decode_step_s": 1e-3}
    r = fit_measurements(synthetic_steps(true, noise=0.002), K, (1e11, 2e10))
    assert r.candidates[WITH_PATHS]["mape"] < r.candidates["roofline"]["mape"]
    assert r.heldout == r.candidates[WITH_PATHS]
    assert r.coefficients["prefill_step_s"] == pytest.approx(3e-3, rel=0.25)
    assert r.coefficients["decode_step_s"] == pytest.approx(1e-3, rel=0.25)
    # no mixed cell: not tried; paths=False (a profile fitted without them): not tried
    r = fit_measurements(synthetic_steps(true, noise=0.01, mixed=False), K, (1e11, 2e10))
    assert WITH_PATHS not in r.candidates and "prefill_step_s" not in r.coefficients
    r = fit_measurements(synthetic_steps(true, noise=0.01), K, (1e11, 2e10), paths=False)
    assert WITH_PATHS not in r.candidates and "prefill_step_s" not in r.coefficients


def test_the_reread_rate_is_kept_only_where_it_predicts_held_out_cells_better():
    # re-reads at 3x a first read's rate: the rate predicts the shared-prefix cells left
    # out (held-out MAPE 2.9% without it, 0.5% with it) and is kept
    true = {**TRUE, "w_reread_bytes_per_s": 1.2e10}
    r = fit_measurements(synthetic_steps(true, noise=0.01, mixed=False, shared=True), K,
                         (1e11, 2e10))
    name = "roofline" + WITH_REREAD
    assert r.candidates[name]["mape"] < r.candidates["roofline"]["mape"]
    assert r.heldout == r.candidates[name]
    assert r.coefficients["w_reread_bytes_per_s"] == pytest.approx(1.2e10, rel=0.1)
    # re-reads cost what first reads do: a rate fitted to the noise is left out (seed 0),
    # and where it predicts a little better by chance it lies near w_attn anyway
    for seed in (0, 1, 2):
        r = fit_measurements(synthetic_steps(TRUE, noise=0.01, seed=seed, mixed=False,
                                             shared=True), K, (1e11, 2e10))
        assert name in r.candidates
        assert (r.coefficients.get("w_reread_bytes_per_s", TRUE["w_attn_bytes_per_s"])
                == pytest.approx(TRUE["w_attn_bytes_per_s"], rel=0.05))
        if seed == 0:
            assert "w_reread_bytes_per_s" not in r.coefficients
    # reread=False (a profile fitted without it), or no cell re-reads: not tried
    for r in (fit_measurements(synthetic_steps(true, noise=0.01, mixed=False, shared=True), K,
                               (1e11, 2e10), reread=False),
              fit_measurements(synthetic_steps(true, noise=0.01, mixed=False), K,
                               (1e11, 2e10))):
        assert name not in r.candidates and "w_reread_bytes_per_s" not in r.coefficients


def test_linear_fit_recovers_known_coefficients():
    want = {"base_s": 3e-3, "per_prefill_token_s": 2e-4, "per_decode_seq_s": 5e-4,
            "per_context_token_s": 1e-6}
    X = pd.DataFrame({"prefill_tokens": [0, 0, 64, 256, 16, 0, 512],
                      "decodes": [1, 8, 0, 4, 0, 32, 2],
                      "context_tokens": [100, 4000, 64, 3000, 600, 20000, 700]})
    y = want["base_s"] + (want["per_prefill_token_s"] * X["prefill_tokens"]
                          + want["per_decode_seq_s"] * X["decodes"]
                          + want["per_context_token_s"] * X["context_tokens"])
    got = fit_linear(X, y)
    for name, v in want.items():
        assert got[name] == pytest.approx(v, rel=1e-6), name


def test_noisy_fit_keeps_roofline_and_reports_small_errors():
    df = synthetic_steps(TRUE, noise=0.02, repeats=4)
    r = fit_measurements(df, K, (1e11, 2e10))
    assert r.form == "roofline"
    assert r.heldout["n"] == df["cell"].nunique()
    assert r.heldout["mape"] < 0.03
    # residuals are measured / predicted - 1 of every repeat: spread ~ the 2 % noise
    assert len(r.residuals) == len(df)
    assert 0.01 < np.std(r.residuals) < 0.03


def test_heldout_prediction_never_sees_its_own_cell():
    df = synthetic_steps(TRUE, noise=0.01)
    cells = cell_means(df)
    base = heldout_predictions("roofline", cells, K, (1e11, 2e10))
    target = "decode B=8 L=512"
    i = list(cells.index).index(target)
    spoiled = cells.copy()
    spoiled.loc[target, "seconds"] *= 3.0          # a wild measurement of that cell only
    again = heldout_predictions("roofline", spoiled, K, (1e11, 2e10))
    assert again[i] == pytest.approx(base[i], rel=1e-9)
    assert not np.allclose(again, base)            # other folds did see it


def test_error_stats_hand_computed():
    s = error_stats([1.0, 2.0, 4.0, 5.0], [1.1, 1.8, 4.0, 6.0])
    # errors 0.1, 0.1, 0, 0.2 -> mean 0.1; p90 of sorted (0, .1, .1, .2) at rank 2.7 = 0.17
    assert s == pytest.approx({"mape": 0.1, "p90": 0.17, "max": 0.2, "n": 4})


def test_predict_matches_cost_model_form():
    X = {"tokens": [1, 300], "requests": [1, 2], "context_tokens": [65, 812],
         "attn_pairs": [65.0, 4e4], "sampled": [1, 2], "prefill_tokens": [0, 299],
         "decodes": [1, 1]}
    p = predict("roofline", TRUE, K, X)
    w = TRUE["a0_s"] + TRUE["per_request_s"] + K.weight_bytes / TRUE["w_eff_bytes_per_s"] \
        + 65 * K.kv_bytes_per_token / TRUE["w_attn_bytes_per_s"] \
        + 65 * K.attn_flops_per_pair / TRUE["f_attn_flops_per_s"] \
        + K.lm_head_flops_per_sample / TRUE["f_eff_flops_per_s"]
    assert p[0] == pytest.approx(w, rel=1e-12)


def test_too_few_cells_is_refused():
    df = synthetic_steps(TRUE)
    with pytest.raises(TooFewCells, match="at least 4"):
        fit_measurements(df[df["cell"].isin(sorted(df["cell"].unique())[:3])], K)


def test_pass_speeds_find_a_slow_pass():
    # two cells, three passes, the third 20% slow: cell medians 10 and 20 ns, so each
    # pass's steps are ×1, ×1 and ×1.2 their cell's median
    df = pd.DataFrame({"cell": ["a", "b"] * 3, "pass": [0, 0, 1, 1, 2, 2],
                       "duration_ns": [10, 20, 10, 20, 12, 24]})
    speeds = pass_speeds(df)
    assert speeds == pytest.approx({0: 1.0, 1: 1.0, 2: 1.2})
    assert pass_spread(speeds) == pytest.approx(0.2)
    assert pass_spread({0: 1.0}) == 0.0
    # with the grid's kinds, the prefill cells alone: a decode cell whose later pass runs
    # longer contexts (more blocks: slower) is no slow pass
    df = pd.DataFrame({"cell": ["p", "d"] * 2, "kind": ["prefill", "decode"] * 2,
                       "pass": [0, 0, 1, 1], "duration_ns": [10, 20, 10, 26]})
    assert pass_speeds(df) == pytest.approx({0: 1.0, 1: 1.0})


def test_pass_warning_names_the_slowest_pass(capsys):
    from calibration.cli import pass_warning
    assert pass_warning({0: 1.0, 1: 1.05, 2: 0.98}) is None      # 7% apart: steady enough
    line = pass_warning({0: 1.0, 1: 1.2, 2: 0.98})
    assert line.startswith("servesim: warning: the grid's passes ran up to 22% apart in "
                           "speed (of 3, pass 2 slowest at ×1.20 its cells' medians, pass 3 "
                           "fastest at ×0.98)")
    assert capsys.readouterr().err.strip() == line


def test_disturbed_steps_are_left_out_of_the_fit_and_said(capsys):
    from calibration.cli import outlier_warning
    from calibration.fit import fit_measurements

    clean = synthetic_steps(TRUE)
    # prefill steps 10-30x slow (a core taken from the engine's threads), in two of the
    # three passes of a cell at times: the cell's median is then a disturbed one
    wild = clean.copy()
    pre = wild.index[(wild["kind"] == "prefill") & ((wild.index % 3 == 1) | (
        (wild.index % 3 == 2) & (wild.index < 9)))]
    wild.loc[pre, "duration_ns"] *= np.linspace(10, 30, len(pre))
    got, want = fit_measurements(wild, K), fit_measurements(clean, K)
    assert got.dropped == len(pre) and want.dropped == 0
    # the fit of the other repeats: the true coefficients, residuals near 0
    for name, value in TRUE.items():
        assert got.coefficients[name] == pytest.approx(value, rel=2e-3), name
    assert max(abs(r) for r in got.residuals) < 1e-3
    line = outlier_warning(got.dropped, len(wild))
    assert line.startswith(f"servesim: warning: {len(pre)} of {len(wild)} measured steps "
                           f"took more than 3× their cell's fastest and were left out")
    assert capsys.readouterr().err.strip() == line
    assert outlier_warning(0, len(clean)) is None


def test_step_price_of_one_chunk_beside_decodes():
    from calibration.fit import step_price

    coef = {"base_s": 1.0, "per_prefill_token_s": 0.1, "per_decode_seq_s": 0.01,
            "per_context_token_s": 0.001}
    seconds = step_price("linear", coef, None)
    # 100 new tokens after 50 computed (context 150) and 4 decodes at context 50 each
    assert seconds(100, 50, 4) == pytest.approx(1 + 10 + 0.04 + 0.001 * (150 + 4 * 50))
    # decodes alone: no chunk, so c counts once per decode only
    assert seconds(0, 50, 4) == pytest.approx(1 + 0.04 + 0.001 * 200)
    assert step_price("constant", {"constant_s": 0.25}, None)(7, 3, 2) == 0.25


def test_step_price_counts_a_chunks_pairs_with_its_cached_context():
    # 100 tokens after 50 cached attend to 100·50 cached pairs and 100·101/2 causal ones;
    # 4 decodes at context 50 to 200
    from calibration.fit import step_price

    want = roofline_seconds(TRUE, K, 104, 5, 150 + 200, 100 * 50 + 5050 + 200, 5, 100, 4)
    assert step_price("roofline", TRUE, K)(100, 50, 4) == pytest.approx(float(want))


def test_an_efficiency_at_the_fits_bound_says_so():
    from calibration.fit import MAX_EFFICIENCY
    from calibration.report import efficiency_cells

    cells = efficiency_cells({"mbu": MAX_EFFICIENCY, "mfu": 0.512, "attn_mbu": None})
    assert cells == [("mbu", "4 (the fit's bound: too small a term in these steps to fit)"),
                     ("mfu", "0.512")]


def test_replay_steps_are_priced_with_the_wake_up_after_idle():
    # constant 10 ms steps; the second step followed 0.5 s idle: + 0.5 x 20 ms (IdleInfo
    # linear from 0 to 20 ms at 1 s); a table without idle_ns gets none
    from calibration.fit import replay_predictions
    from simulator.cost_model import IdleInfo
    idle = IdleInfo(gaps_s=[1.0], extra_s=[0.020])
    steps = pd.DataFrame({"tokens": [8, 8], "idle_ns": [0, 500_000_000],
                          "duration_ns": [10_000_000, 22_000_000]})
    got = replay_predictions("constant", {"constant_s": 0.01}, None, steps, idle)
    assert got.tolist() == pytest.approx([0.010, 0.020])
    assert replay_predictions("constant", {"constant_s": 0.01}, None,
                              steps.drop(columns="idle_ns"), idle).tolist() == [0.01, 0.01]
    from calibration.fit import replay_errors
    assert replay_errors("constant", {"constant_s": 0.01}, None, steps, idle)["mape"] == \
        pytest.approx((0 + 2 / 22) / 2)


def _cpu_grid_cells(coef):
    """Cell means of calibrate's default CPU grid priced by the roofline ``coef`` (bf16
    llama-tiny-56m), each step's features worked out from its cell: a prefill chunk of n
    tokens after c computed, and (decode, mixed cells) B decodes of the lengths the
    profiler gives them, each one token longer per step of a visit."""
    from calibration.profiler import decode_lengths, default_grid

    k = RooflineConstants.of(load_model("llama-tiny-56m"), "bfloat16")
    grid = default_grid("cpu", False, 4096)
    rows = []
    for cell in grid.cells(16, 4096, 1 << 40):
        chunks = [(cell.n, cell.c)] if cell.kind in ("prefill", "mixed") else []
        lengths = (decode_lengths(cell.B, cell.L, cell.s) if cell.kind in ("decode", "mixed")
                   else [])
        for s in range(grid.rows_per_visit(cell)):
            dl = [x + s for x in lengths]
            pt = sum(n for n, _ in chunks)
            f = dict(tokens=pt + len(dl), requests=len(dl) + len(chunks), prefill_tokens=pt,
                     decodes=len(dl), context_tokens=sum(n + c for n, c in chunks) + sum(dl),
                     attn_pairs=sum(n * (c + (n + 1) / 2) for n, c in chunks) + sum(dl),
                     sampled=len(dl) + len(chunks),
                     reread_tokens=(len(dl) - cell.g) * cell.s)
            t = float(roofline_seconds(coef, k, f["tokens"], f["requests"],
                                       f["context_tokens"], f["attn_pairs"], f["sampled"],
                                       pt, len(dl), f["reread_tokens"]))
            rows.append({"cell": cell.key, "kind": cell.kind, "duration_ns": t * 1e9, **f})
    return cell_means(pd.DataFrame(rows)), k


@pytest.mark.parametrize("paths", [{}, {"prefill_step_s": 4e-3, "decode_step_s": 2e-3}])
def test_the_fit_with_path_costs_is_never_worse_than_the_fit_it_contains(paths):
    # A weight-bound tiny model on calibrate's CPU grid: the fit with path costs must not
    # stop at the kink of the dense term's max(), above the fit without them (a0 5.1 ms for
    # 7 with true path costs of 4 and 2 ms), since it holds that fit (path costs 0): both
    # recover the truth exactly.
    true = {"a0_s": 7e-3, "per_request_s": 2e-5, "w_eff_bytes_per_s": 2.8e10,
            "f_eff_flops_per_s": 1.5e11, "w_attn_bytes_per_s": 5e9,
            "f_attn_flops_per_s": 6e10, **paths}
    cells, k = _cpu_grid_cells(true)
    got = fit_roofline(cells, cells["seconds"], k, peak_flops=1e11, peak_bandwidth=2e10)
    for name, want in true.items():
        assert got[name] == pytest.approx(want, rel=1e-3), name
    if not paths:   # the path costs it may add are nil
        assert got["prefill_step_s"] < 1e-6 and got["decode_step_s"] < 1e-6
