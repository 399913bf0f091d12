"""Latency of each request served alone: hand-computed floors, and the simulator's own
latencies when requests never overlap."""

import math

import numpy as np
import pandas as pd
import pytest

from simulator.alone import AloneLatency
from simulator.metrics import REQUEST_COLUMNS
from simulator.run import simulate
from simulator.scenario import scenario_from_dict

LINEAR = {"base_s": 0.002, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 0.001,
          "per_context_token_s": 1e-6}


def _frame(rows):
    """A request table with the given (prompt, cached, output, warmup, finished) rows."""
    df = pd.DataFrame({c: [np.nan] * len(rows) for c in REQUEST_COLUMNS})
    df["prompt_tokens"] = [r[0] for r in rows]
    df["cached_tokens"] = [r[1] for r in rows]
    df["output_tokens"] = [r[2] for r in rows]
    df["warmup"] = [r[3] for r in rows]
    df["finish_s"] = [1.0 if r[4] else np.nan for r in rows]
    df["first_token_s"] = df["finish_s"]
    df["finish_reason"] = ["length" if r[4] else "rejected" for r in rows]
    return df


def test_floors_by_hand():
    s = scenario_from_dict({
        "name": "a", "model": "llama-test", "hardware": {"step_time": LINEAR},
        "engine": {"max_model_len": 2048, "max_num_batched_tokens": 256},
        "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate": 1},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 8}}})
    a = AloneLatency(s, _frame([
        (600, 0, 5, False, True),     # chunks 256 + 256 + 88, then 4 decodes
        (100, 64, 1, False, True),    # one 36-token chunk after 64 cached; no decode
        (900, 0, 3, True, True),      # warm-up: only its token gaps count (pooled ITL)
        (3000, 0, 0, False, False),   # rejected (no finish): left out
    ]))
    # linear: 2 ms + 0.1 ms per prefill token + 1 ms per decode + 0.001 ms per context token
    chunks = [2 + 25.6 + 0.256, 2 + 25.6 + 0.512, 2 + 8.8 + 0.600]
    ttft = [sum(chunks), 2 + 3.6 + 0.100]
    gaps = [3 + 0.001 * ctx for ctx in (601, 602, 603, 604)]
    itl = gaps + [3 + 0.001 * ctx for ctx in (901, 902)]
    np.testing.assert_allclose(a.ttft_ms, ttft, rtol=1e-12)
    aborted = _frame([(600, 0, 5, False, True), (700, 0, 9, False, True)])
    aborted.loc[1, "finish_reason"] = "abort"       # finished by an abort: left out too
    np.testing.assert_allclose(AloneLatency(s, aborted).ttft_ms, ttft[:1], rtol=1e-12)
    np.testing.assert_allclose(a.tpot_ms, [sum(gaps) / 4], rtol=1e-12)
    np.testing.assert_allclose(a.e2el_ms, [ttft[0] + sum(gaps), ttft[1]], rtol=1e-12)
    assert a.stat("ttft_ms", "p50") == pytest.approx((ttft[0] + ttft[1]) / 2, rel=1e-12)
    assert a.stat("ttft_ms", "mean") == pytest.approx(sum(ttft) / 2, rel=1e-12)
    assert a.stat("itl_ms", "mean") == pytest.approx(sum(itl) / 6, rel=1e-12)
    assert a.stat("itl_ms", "p99") == pytest.approx(np.percentile(itl, 99), rel=1e-12)
    assert a.stat("itl_ms", "p12.5") == pytest.approx(np.percentile(itl, 12.5), rel=1e-12)
    with pytest.raises(ValueError, match="no floor for queue_ms"):
        a.stat("queue_ms", "p99")
    # no request with two output tokens: no TPOT or ITL floor
    b = AloneLatency(s, _frame([(100, 0, 1, False, True)]))
    assert b.stat("tpot_ms", "p99") is None and b.stat("itl_ms", "mean") is None
    assert b.stat("e2el_ms", "p99") == pytest.approx(2 + 10 + 0.1, rel=1e-12)


@pytest.mark.parametrize("hardware", [
    {"profile": "h100-sxm"},                                 # roofline projection
    {"step_time": LINEAR},
])
def test_floors_are_the_simulated_latencies_of_requests_that_never_overlap(hardware):
    # One request every 100 s: each finds the replica idle; shared prefixes give prefix-cache
    # hits after the first of each group, and 512-token chunks split the longer prompts.
    s = scenario_from_dict({
        "name": "a", "model": "llama-3.1-8b", "hardware": hardware,
        "engine": {"max_model_len": 8192, "max_num_batched_tokens": 512,
                   "enable_prefix_caching": True},
        "workload": {"seed": 3, "num_requests": 40,
                     "arrival": {"process": "constant", "rate": 0.01},
                     "prompt_tokens": {"dist": "lognormal", "median": 700, "p90": 2500,
                                       "max": 6000},
                     "output_tokens": {"dist": "lognormal", "median": 60, "p90": 300,
                                       "max": 900},
                     "prefix": {"shared_tokens": 256, "groups": 3}}})
    r = simulate(s)
    req = r.requests
    assert (req["cached_tokens"] > 0).sum() >= 30 and (req["prompt_tokens"] > 512).sum() >= 10
    assert (req["queue_ms"] == 0).all()                      # nothing overlapped
    a = AloneLatency(s, req)
    # step times are whole ns in the simulator: allow 1 ns per step
    steps = np.ceil(req["prompt_tokens"] / 512) + req["output_tokens"]
    np.testing.assert_allclose(a.ttft_ms, req["ttft_ms"], rtol=0, atol=1e-6 * steps.max())
    np.testing.assert_allclose(a.e2el_ms, req["e2el_ms"], rtol=0, atol=1e-6 * steps.max())
    many = req["output_tokens"] >= 2
    np.testing.assert_allclose(a.tpot_ms, req.loc[many, "tpot_ms"], rtol=0, atol=1e-5)
    for stat in ("mean", "p50", "p90", "p99"):
        assert a.stat("itl_ms", stat) == pytest.approx(r.summary["itl_ms"][stat], abs=1e-5)
        for m in ("ttft_ms", "tpot_ms", "e2el_ms"):
            assert a.stat(m, stat) == pytest.approx(r.summary[m][stat], abs=1e-5 * steps.max())
    assert not math.isnan(a.stat("ttft_ms", "p99.9"))
