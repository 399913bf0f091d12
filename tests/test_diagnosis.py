"""Diagnosis: the binding limit in constructed cases, the TTFT split, counterfactuals."""

import numpy as np
import pytest

from simulator.diagnosis import diagnose, ttft_split
from simulator.run import simulate
from simulator.scenario import scenario_from_dict


def sc(engine, step, rate, prompt=16, out=32, n=1500):
    return scenario_from_dict({
        "name": "d", "model": "llama-test", "hardware": {"step_time": step},
        "engine": {"max_model_len": 2048, **engine},
        "workload": {"seed": 0, "num_requests": n,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": prompt},
                     "output_tokens": {"dist": "fixed", "value": out}}})


def test_max_num_seqs_binds():
    # 4 slots × 32 tokens × 10 ms: capacity 12.5 req/s, offered 16; KV unlimited.
    s = sc({"max_num_seqs": 4}, {"constant_s": 0.01}, 16)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "max_num_seqs"
    cf = d["counterfactual"]
    assert cf["change"] == "engine.max_num_seqs=8" and cf["moved"]


def test_kv_capacity_binds():
    # 63 usable blocks of 16; a request needs 3 blocks → ~21 fit, far below 128 slots;
    # offered concurrency 60 × 0.32 s ≈ 19 keeps the cache full and preempting.
    s = sc({"max_num_seqs": 128, "num_gpu_blocks": 64, "max_model_len": 256},
           {"constant_s": 0.01}, 60)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "kv_capacity"
    assert d["findings"][0]["change"] == "engine.num_gpu_blocks=128"


def test_compute_binds():
    # 2000-token prompts at 0.1 ms/token: 0.2 s of prefill each, 5 req/s at most.
    s = sc({"max_num_seqs": 256, "max_num_batched_tokens": 2048},
           {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 8, prompt=2000, out=4, n=600)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "compute"
    assert d["figures"]["busy_fraction"] > 0.95
    assert d["counterfactual"]["moved"]


def test_light_load_has_no_binding_limit_and_ttft_splits_exactly():
    s = sc({"max_num_seqs": 64}, {"constant_s": 0.01}, 2, n=400)
    r = simulate(s)
    d = diagnose(s, r)
    assert d["binding"] == "none" and d["counterfactual"] is None
    sp = ttft_split(r)
    req = r.requests
    assert sp["queue_ms"]["mean"] == pytest.approx(req["queue_ms"].mean(), rel=1e-9)
    # One prefill step (10 ms) from first scheduled to first token for every request.
    assert sp["prefill_ms"]["p50"] == pytest.approx(10.0) and sp["prefill_ms"]["p99"] == pytest.approx(10.0)
    assert sp["ttft_ms"]["mean"] == pytest.approx(sp["queue_ms"]["mean"] + 10.0)
