"""Real public traces through the simulator (skipped when ../shared/traces is absent)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.run import simulate
from simulator.scenario import scenario_from_dict
from simulator.traces import read_trace
from simulator.workload import WorkloadConfig

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE_CONV = TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv"


def _scenario(workload, **engine):
    eng = {"max_num_seqs": 256, "max_num_batched_tokens": 16384, "max_model_len": 131072}
    eng.update(engine)
    return scenario_from_dict({"name": "trace", "model": "llama-3.1-8b",
                               "hardware": {"step_time": {"constant_s": 0.001}},
                               "engine": eng, "workload": workload})


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")
def test_mooncake_prefix_hits_equal_an_independent_count_from_hash_ids():
    bs = 128  # divides Mooncake's 512-token hash blocks
    wl = {"trace": {"path": str(MOONCAKE), "format": "mooncake"}}
    sc = _scenario(wl, max_num_seqs=1, block_size=bs)
    specs = [s.__class__(**{**s.__dict__, "max_tokens": 1})
             for s in read_trace(WorkloadConfig(**wl).trace)]
    res = simulate(sc, specs=specs)
    # Independent count: walk the trace in order; a 128-token block is cached when an
    # earlier request computed it: same 512-block hash id (ids encode the whole prefix)
    # and that request's copy of the 512-block covered it entirely.
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    order = np.argsort([r["timestamp"] for r in rows], kind="stable")
    covered: dict[int, int] = {}  # hash id -> tokens of that 512-block computed so far
    expected = {}
    for rid, i in enumerate(order):
        r = rows[i]
        n, ids = r["input_length"], r["hash_ids"]
        hit = 0
        for k, h in enumerate(ids):
            chunk = min(512, n - 512 * k)
            got = covered.get(h, 0) // bs * bs
            hit += min(got, chunk // bs * bs)
            if got < chunk:
                break
        expected[rid] = min(hit, (n - 1) // bs * bs)  # never the last prompt token
        for k, h in enumerate(ids):
            covered[h] = max(covered.get(h, 0), min(512, n - 512 * k) // bs * bs)
    got = res.requests.set_index("request_id")["cached_tokens"].to_dict()
    assert got == expected
    assert sum(expected.values()) > 0.3 * sum(r["input_length"] for r in rows)


@pytest.mark.skipif(not AZURE_CONV.exists(), reason="shared Azure trace not present")
def test_azure_replay_keeps_count_and_arrivals_and_rejects_overlong_prompts():
    wl = {"trace": {"path": str(AZURE_CONV), "format": "azure"}}
    res = simulate(_scenario(wl, max_model_len=4096))
    raw = pd.read_csv(AZURE_CONV)
    t = pd.to_datetime(raw["TIMESTAMP"])
    want = np.sort(((t - t.min()).dt.total_seconds()).to_numpy())
    df = res.requests.sort_values("arrival_s")
    assert len(df) == len(raw)
    np.testing.assert_allclose(df["arrival_s"].to_numpy(), want, atol=1e-6)
    # a prompt of max_model_len tokens leaves no room for an output token: vLLM rejects it
    too_long = int((raw["ContextTokens"] >= 4096).sum())
    assert too_long > 0
    assert res.summary["rejected"] == too_long
    assert res.summary["completed"] == len(raw) - too_long
    assert (df.loc[df.finish_reason == "rejected", "prompt_tokens"] >= 4096).all()
