"""Projection as the planner uses it: a measured GPU profile's efficiencies carried onto
another catalog GPU by its spec-sheet ceilings, labelled projected in plan outputs."""

import pytest

from simulator import cost_model as cmod
from simulator.catalog import load_hardware
from simulator.cost_model import build_cost_model, save_profile
from simulator.planner import expand_candidates
from simulator.scenario import scenario_from_dict

from test_cost_model import make_profile


def test_measured_h100_efficiencies_carried_to_other_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    save_profile(make_profile(
        name="h100-measured",
        device={"name": "h100-sxm", "kind": "gpu", "peak_flops": 989.4e12,
                "memory_bandwidth": 3.35e12, "memory_bytes": 81559 * 2**20},
        efficiencies={"mbu": 0.6, "mfu": 0.4}, engine="vllm 0.32.0"),
        tmp_path / "local" / "h100-measured.yaml")
    sc = scenario_from_dict({
        "name": "p", "model": "llama-3.1-8b", "hardware": {"profile": "a100-80gb"},
        "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 8}},
        "plan": {"candidates": {"hardware.profile": ["a100-80gb", "l40s"],
                                "hardware.tensor_parallel": [1, 2]}}})
    a100, l40s = load_hardware("a100-80gb"), load_hardware("l40s")
    cm = build_cost_model(sc)
    c = cm.profile.cost.coefficients
    # Same efficiencies, the other GPU's ceilings: 0.6 × 2.039 TB/s, 0.4 × 312 TFLOP/s.
    assert c["w_eff_bytes_per_s"] == pytest.approx(0.6 * a100.memory_bandwidth)
    assert c["f_eff_flops_per_s"] == pytest.approx(0.4 * a100.peak_flops("bfloat16"))
    assert cm.label.startswith("projected: roofline a100-80gb, tensor_parallel=1, efficiencies of measured "
                               "profile h100-measured")
    cands = {(c.values["hardware.profile"], c.values["hardware.tensor_parallel"]): c
             for c in expand_candidates(sc)}
    assert all(c.cost_kind == "projected" for c in cands.values())
    assert cands[("l40s", 2)].price_per_replica_hour == pytest.approx(
        2 * l40s.price_per_gpu_hour)
    # Weights split per GPU: TP 2 leaves more KV blocks than TP 1 on the same GPU.
    b1 = build_cost_model(cands[("l40s", 1)].scenario).num_gpu_blocks
    b2 = build_cost_model(cands[("l40s", 2)].scenario).num_gpu_blocks
    assert b2 > 2 * b1
