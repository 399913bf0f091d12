"""Fast-forwarded runs equal step-by-step runs (``sim.exact_steps``) exactly.

Randomised scenarios with prefix sharing, sessions (follow-ups released by finishes) or a
client-side max_concurrency (held requests sent at finishes), KV-cache pressure
(preemption) and several replicas behind each router.
"""

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.run import simulate
from simulator.scenario import scenario_from_dict


@st.composite
def scenarios(draw):
    replicas = draw(st.integers(1, 3))
    sessions = draw(st.booleans())
    wl = {
        "seed": draw(st.integers(0, 10_000)),
        "num_requests": draw(st.integers(20, 120)),
        "arrival": {"process": "poisson", "rate": draw(st.floats(5, 80))},
        "prompt_tokens": {"dist": "uniform", "min": 1, "max": draw(st.integers(8, 200))},
        "output_tokens": {"dist": "uniform", "min": 1, "max": draw(st.integers(2, 60))},
        "prefix": {"shared_tokens": draw(st.sampled_from([16, 48, 64])),
                   "groups": draw(st.integers(1, 4)), "popularity": "zipf", "zipf_s": 1.1},
    }
    gate = draw(st.sampled_from([None, None, 1, 3, 8]))
    if gate is not None and not sessions:   # a client limit: held ones go out at finishes
        wl["max_concurrency"] = gate
    if sessions:
        wl["sessions"] = {"turns": {"dist": "uniform", "min": 1, "max": 4},
                          "think_time_s": {"dist": "uniform", "min": 0, "max": 0.05}}
        wl["prompt_tokens"]["max"] = 40
    mml = 1024
    return {
        "name": "ff",
        "model": "llama-test",
        "hardware": {"step_time": {"base_s": 0.004, "per_prefill_token_s": 1e-5,
                                   "per_decode_seq_s": 2e-4, "per_context_token_s": 1e-7}},
        "engine": {"block_size": draw(st.sampled_from([8, 16])),
                   "max_num_seqs": draw(st.integers(2, 16)),
                   "max_num_batched_tokens": draw(st.sampled_from([32, 64, 512])),
                   "max_model_len": mml,
                   "num_gpu_blocks": draw(st.sampled_from([None, 300, 600]))},
        "cluster": {"replicas": replicas,
                    "router": draw(st.sampled_from(["round_robin", "least_outstanding",
                                                    "prefix_affinity"]))},
        "workload": wl,
    }


def _run(d, exact):
    d = {**d, "sim": {"exact_steps": exact}}
    return simulate(scenario_from_dict(d))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_step_by_step(d):
    if d["engine"]["num_gpu_blocks"] is not None:
        bs = d["engine"]["block_size"]
        d["engine"]["num_gpu_blocks"] = max(d["engine"]["num_gpu_blocks"] // bs * 4,
                                            1024 // bs + 2)
    a, b = _run(d, True), _run(d, False)
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    assert a.timeseries.equals(b.timeseries)
    assert a.itl_runs.equals(b.itl_runs)


def test_fast_forward_case_with_preemption_is_exercised():
    d = {
        "name": "ff-pressure", "model": "llama-test",
        "hardware": {"step_time": {"base_s": 0.004, "per_prefill_token_s": 1e-5,
                                   "per_decode_seq_s": 2e-4, "per_context_token_s": 1e-7}},
        "engine": {"block_size": 16, "max_num_seqs": 16, "max_num_batched_tokens": 256,
                   "max_model_len": 1024, "num_gpu_blocks": 70},
        "cluster": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"seed": 1, "num_requests": 200,
                     "arrival": {"process": "poisson", "rate": 40},
                     "prompt_tokens": {"dist": "uniform", "min": 50, "max": 300},
                     "output_tokens": {"dist": "uniform", "min": 50, "max": 300},
                     "prefix": {"shared_tokens": 64, "groups": 3}},
    }
    a, b = _run(d, True), _run(d, False)
    assert a.summary["preemptions"] > 0
    assert a.summary == b.summary and a.requests.equals(b.requests)
    # The same on one replica, which runs as a plain loop with quiet steps taken whole.
    d["cluster"]["replicas"] = 1
    a, b = _run(d, True), _run(d, False)
    assert a.summary["preemptions"] > 0 and a.summary["prefix_cache_hit_tokens"] > 0
    assert a.summary == b.summary and a.requests.equals(b.requests)
    assert a.timeseries.equals(b.timeseries) and a.itl_runs.equals(b.itl_runs)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_single_replica_plain_loop_equals_step_by_step(d):
    """One replica without follow-ups runs without SimPy (Replica.serve_alone, quiet decode
    steps taken whole); it must still equal the SimPy step-by-step reference."""
    d["cluster"]["replicas"] = 1
    d["workload"].pop("sessions", None)
    bs = d["engine"]["block_size"]
    if d["engine"]["num_gpu_blocks"] is not None:
        d["engine"]["num_gpu_blocks"] = 1024 // bs + 2   # tight: preemptions likely
    a, b = _run(d, True), _run(d, False)
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    assert a.timeseries.equals(b.timeseries)
    assert a.itl_runs.equals(b.itl_runs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_step_by_step_with_a_wake_up_cost(d):
    """The first step after idle pays the cost model's wake-up cost (IdleInfo) in every
    run mode alike: SimPy step by step, fast-forwarded, and one replica's plain loop."""
    from simulator.cost_model import IdleInfo, build_cost_model

    if d["engine"]["num_gpu_blocks"] is not None:
        d["engine"]["num_gpu_blocks"] = 1024 // d["engine"]["block_size"] + 2

    def run(exact):
        sc = scenario_from_dict({**d, "sim": {"exact_steps": exact}})
        models = []
        for _ in range(sc.cluster.replicas):
            cm = build_cost_model(sc)
            cm.idle = IdleInfo(gaps_s=[0.005, 0.05], extra_s=[0.001, 0.003])
            models.append(cm)
        return simulate(sc, cost_models=models)

    a, b = run(True), run(False)
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    assert a.timeseries.equals(b.timeseries)
    assert a.itl_runs.equals(b.itl_runs)


def test_fast_forward_prices_re_reads_as_step_by_step(tmp_path):
    """Quiet steps taken whole price their re-read context (a shared prefix) as single
    steps do: a roofline profile whose re-read rate is 20x its first-read rate, requests
    sharing 512-token prefixes, on one replica (plain loop) and on two (SimPy)."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "simulator" / "profiles"
    text = (src / "cpu-llama-tiny-56m-float32.yaml").read_text()
    first = re.search(r"w_attn_bytes_per_s: ([0-9.e+]+)", text).group(1)
    d = {"name": "ff-reread", "model": "llama-tiny-56m", "dtype": "float32",
         "engine": {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 512,
                    "max_model_len": 2048},
         "workload": {"seed": 1, "num_requests": 120,
                      "arrival": {"process": "poisson", "rate": 20},
                      "prompt_tokens": {"dist": "uniform", "min": 50, "max": 300},
                      "output_tokens": {"dist": "uniform", "min": 50, "max": 300},
                      "prefix": {"shared_tokens": 512, "groups": 2}}}
    durations = []
    for i, rate in enumerate((first, f"{20 * float(first)!r}")):
        path = tmp_path / f"p{i}.yaml"
        path.write_text(text.replace(f"w_attn_bytes_per_s: {first}",
                                     f"w_attn_bytes_per_s: {first}, "
                                     f"w_reread_bytes_per_s: {rate}"))
        d["hardware"] = {"profile": str(path)}
        for replicas in (1, 2):
            d["cluster"] = {"replicas": replicas}
            a, b = _run(d, True), _run(d, False)
            assert a.summary == b.summary and a.requests.equals(b.requests)
            assert a.timeseries.equals(b.timeseries) and a.itl_runs.equals(b.itl_runs)
        durations.append(a.summary["duration_s"])   # (two replicas')
    # re-reads priced at 1/20 of a first read end the run sooner: the term is exercised
    assert durations[1] < durations[0]
