"""A hand-computed timeline, end to end through the CLI (trace → simulate → requests.csv).

Step time 10 ms, max_num_batched_tokens 16, prefix caching off. Worked out on paper:

  step 1 [0,10]   A prefill 10 tok → A token 1 @10          (B arrives @5 mid-step)
  step 2 [10,20]  A decode; B chunk 15/20 → A token 2 @20
  step 3 [20,30]  A decode → A token 3, A done @30; B last 5 → B token 1 @30 (C arrives @25)
  step 4 [30,40]  B decode → B token 2, B done @40; C 4 tok → C done @40;
                  D arrives @30 exactly and is seen by the step starting @30 → D done @40
"""

import json

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main

EXPECTED = {  # id: (arrival, first_scheduled, first_token, finish) in ms, output tokens
    0: ((0, 0, 10, 30), 3),
    1: ((5, 10, 30, 40), 2),
    2: ((25, 30, 40, 40), 1),
    3: ((30, 30, 40, 40), 1),
}


@pytest.fixture
def scenario(tmp_path):
    (tmp_path / "trace.csv").write_text(
        "t_ms,prompt,output\n0,10,3\n5,20,2\n25,4,1\n30,2,1\n")
    (tmp_path / "s.yaml").write_text("""
name: hand
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 8, max_num_batched_tokens: 16, enable_prefix_caching: false,
         max_model_len: 256}
workload:
  trace: {path: trace.csv, format: csv, arrival_unit: ms,
          columns: {arrival: t_ms, prompt_tokens: prompt, output_tokens: output}}
slo: {ttft_ms: {p99: 20}}
""")
    return tmp_path


def test_hand_timeline_in_requests_csv(scenario, capsys):
    out = scenario / "out"
    assert main(["run", str(scenario / "s.yaml"), "--out", str(out), "--quiet"]) == 0
    df = pd.read_csv(out / "requests.csv").set_index("request_id")
    for rid, ((arr, sched, first, fin), n_out) in EXPECTED.items():
        row = df.loc[rid]
        got = [row.arrival_s, row.first_scheduled_s, row.first_token_s, row.finish_s]
        np.testing.assert_allclose(got, [arr / 1e3, sched / 1e3, first / 1e3, fin / 1e3],
                                   atol=1e-9)
        assert row.output_tokens == n_out
        assert row.ttft_ms == pytest.approx(first - arr)
        assert row.e2el_ms == pytest.approx(fin - arr)
    assert df.loc[0].tpot_ms == pytest.approx(10.0)   # (30 - 10) / (3 - 1)
    assert df.loc[1].tpot_ms == pytest.approx(10.0)   # (40 - 30) / (2 - 1)
    assert np.isnan(df.loc[2].tpot_ms)                # one output token: no TPOT
    s = json.loads((out / "summary.json").read_text())
    assert s["itl_tokens"] == 3 and s["itl_ms"]["p50"] == pytest.approx(10.0)
    # TTFTs 10, 25, 15, 10 ms: only B misses the 20 ms SLO; goodput = 3 / 40 ms.
    assert s["good_requests"] == 3
    assert s["goodput"] == pytest.approx(3 / 0.040)
    assert s["slo_met"] is False
    assert "report:" in capsys.readouterr().out


class _Intake:
    """10 ms steps of which the first 3 ms, in steps that admit, take in arrivals."""

    num_gpu_blocks, label, kv_note, profile = None, "hand intake", "", None

    def step_time_ns(self, plan):
        return 10_000_000

    def intake_ns(self, plan):
        return 3_000_000


@pytest.mark.parametrize("exact", [True, False])
def test_intake_moves_first_scheduled_only(exact):
    """A cost model's intake delays a step's scheduled time within the step, nothing else.

    A (16-token prompt, 2 tokens) arrives at 0, B (16, 1) at 5 ms. Step [0, 10): A's
    prefill, scheduled at 0 + 3 ms, first token at 10. Step [10, 20): A's decode and B's
    prefill (B arrived before 10), B scheduled at 13; both finish at 20."""
    from simulator.policy import RequestSpec
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict
    sc = scenario_from_dict({
        "name": "intake", "model": "llama-test", "hardware": {"step_time": {"constant_s": 1}},
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256,
                   "enable_prefix_caching": False},
        "workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 1}},
        "sim": {"exact_steps": exact, "warmup_requests": 0}})
    specs = [RequestSpec("A", 0, (("a", 16),), 2), RequestSpec("B", 5_000_000, (("b", 16),), 1)]
    req = simulate(sc, specs=specs, cost_models=[_Intake()]).requests.set_index("request_id")
    got = {r: [round(req.loc[r, f"{k}_s"] * 1e3, 6) for k in
               ("arrival", "first_scheduled", "first_token", "finish")] for r in "AB"}
    assert got == {"A": [0, 3, 10, 20], "B": [5, 13, 20, 20]}


def test_peak_output_tokens_and_concurrency_per_second_by_hand(tmp_path):
    # The request at 0 is rejected (300 prompt tokens >= max_model_len). Steps of 300 ms
    # from the next arrival (100 ms): A and B (8 tokens each) prefill together: tokens at
    # 400, 700, ... 2500 ms. C (4 tokens) arrives at 1050 ms, during the step [1000,
    # 1300), and prefills in [1300, 1600): tokens at 1600 ... 2500 ms. vllm bench serve's
    # seconds run from the first successful request's start (100 ms): int(t - 0.1 s) puts
    # A's and B's tokens 3 + 3 + 2 in seconds 0, 1, 2 and C's 0 + 2 + 2: [6, 8, 6] → peak
    # 8 tok/s (from 0 s it would be [4, 10, 6]). Every request spans seconds 0..2 → 3.
    (tmp_path / "t.csv").write_text("t_ms,p,o\n0,300,4\n100,8,8\n100,8,8\n1050,8,4\n")
    (tmp_path / "s.yaml").write_text("""
name: peak
model: llama-test
hardware: {step_time: {constant_s: 0.3}}
engine: {max_num_seqs: 8, max_model_len: 256}
workload:
  trace: {path: t.csv, format: csv, arrival_unit: ms,
          columns: {arrival: t_ms, prompt_tokens: p, output_tokens: o}}
""")
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(out), "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    assert req["finish_reason"][0] == "rejected"
    assert req["first_token_s"][1:].tolist() == pytest.approx([0.4, 0.4, 1.6])
    assert req["finish_s"][1:].tolist() == pytest.approx([2.5, 2.5, 2.5])
    assert s["max_output_tokens_per_s"] == 8
    assert s["max_concurrent_requests"] == 3
    # with warm-up the steps also carry uncounted requests' tokens: no figure
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "w"), "--quiet",
                 "--set", "sim.warmup_requests=2"]) == 0
    w = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert w["max_output_tokens_per_s"] is None


@pytest.mark.parametrize("router", ["least_outstanding", "prefix_affinity",
                                    "session_affinity"])
def test_load_aware_routers_take_turns_when_replicas_tie(router):
    # one request a second, each served in 30 ms: every replica is empty at each arrival,
    # so every choice ties and the requests go round the 4 replicas in turn
    req = _one_a_second(router, prompt=8, output=3)
    assert req["replica"].astype(int).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def _one_a_second(router: str, prompt: int, output: int, **workload):
    """The requests of 10 arrivals a second apart (from 1 s) on 4 replicas of 10 ms steps
    behind ``router``, by arrival."""
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict

    s = scenario_from_dict({
        "name": "r", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_num_seqs": 8, "max_model_len": 256},
        "cluster": {"replicas": 4, "router": router},
        "workload": {"seed": 0, "num_requests": 10,
                     "arrival": {"process": "constant", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": prompt},
                     "output_tokens": {"dist": "fixed", "value": output}, **workload}})
    return simulate(s).requests.sort_values("arrival_s")


@pytest.mark.parametrize("router,replicas,cached", [
    # a later turn goes where its first went, and hits its history there
    ("session_affinity", [0, 0, 1, 1, 2, 2, 3, 3, 0, 0], [0, 32] * 5),
    # least_outstanding finds every replica empty and goes on in turn: no history hit
    ("least_outstanding", [0, 1, 2, 3, 0, 1, 2, 3, 0, 1], [0] * 10)])
def test_session_affinity_keeps_a_conversation_on_its_first_replica(router, replicas, cached):
    # a conversation a second (first turns at 1, 2, ... s), 2 turns: 16 new tokens and a
    # 32-token answer each, 10 ms steps: turn 1 ends at +0.32 s (1 prefill + 31 decode
    # steps), turn 2 arrives 0.5 s later with a 64-token prompt (16 + 32 + 16). Its history
    # holds 47 computed tokens (the last answer token is never fed back): 2 full blocks of 16
    req = _one_a_second(router, prompt=16, output=32,
                        sessions={"turns": 2, "think_time_s": 0.5})
    assert req["arrival_s"].tolist()[:4] == pytest.approx([1.0, 1.82, 2.0, 2.82])
    assert req["prompt_tokens"].tolist()[:2] == [16, 64]
    assert req["replica"].astype(int).tolist() == replicas
    assert req["cached_tokens"].tolist() == cached


def test_max_concurrency_holds_arrivals_until_a_request_finishes(tmp_path):
    """workload.max_concurrency 2 (vllm bench serve --max-concurrency): four requests at
    0 s, 4-token prompts, outputs 1, 3, 1, 2 tokens; 10 ms steps. Worked out on paper:

      step 1 [0,10]   r0, r1 prefill → first tokens @10; r0 done @10 → r2 sent @10
      step 2 [10,20]  r1 decode; r2 prefill → r2 done @20 → r3 sent @20
      step 3 [20,30]  r1 decode → r1 done @30; r3 prefill → token 1 @30
      step 4 [30,40]  r3 decode → r3 done @40

    A held request is timed from when it is sent (its arrival), as the client times it.
    Without the limit all four run from step 1 and finish by @30."""
    (tmp_path / "t.csv").write_text("t,p,o\n0,4,1\n0,4,3\n0,4,1\n0,4,2\n")
    base = """
name: gate
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 8, max_num_batched_tokens: 64, enable_prefix_caching: false,
         max_model_len: 256}
workload:
  trace: {path: t.csv, format: csv, arrival_unit: s,
          columns: {arrival: t, prompt_tokens: p, output_tokens: o}}
"""
    (tmp_path / "s.yaml").write_text(base + "  max_concurrency: 2\n")
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"),
                 "--quiet"]) == 0
    df = pd.read_csv(tmp_path / "o" / "requests.csv").set_index("request_id")
    want = {0: (0, 0, 10, 10), 1: (0, 0, 10, 30), 2: (10, 10, 20, 20), 3: (20, 20, 30, 40)}
    for rid, times in want.items():
        row = df.loc[rid]
        np.testing.assert_allclose([row.arrival_s, row.first_scheduled_s, row.first_token_s,
                                    row.finish_s], np.array(times) / 1e3, atol=1e-9)
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["concurrency"]["requests_max"] == 2
    # r2 held 0 -> 10 ms, r3 0 -> 20 ms; all reached the client at 0 s: no rate
    assert s["client"] == {"max_concurrency": 2, "held_requests": 2,
                           "wait_mean_s": pytest.approx(0.015), "wait_max_s": 0.02,
                           "offered_rate": None}
    (tmp_path / "u.yaml").write_text(base)
    assert main(["run", str(tmp_path / "u.yaml"), "--out", str(tmp_path / "p"),
                 "--quiet"]) == 0
    free = pd.read_csv(tmp_path / "p" / "requests.csv")
    assert free["arrival_s"].max() == 0 and free["finish_s"].max() == pytest.approx(0.03)


def test_a_client_limit_that_falls_behind_its_arrivals_is_unstable_and_said():
    """Poisson at 50 req/s of 10-token answers on 10 ms steps: one in flight serves about
    9 req/s, so the client's sends fall behind its arrivals (unstable; the engine's own
    queue never grows); 64 in flight keep up. The run's warning gives the held count."""
    from simulator.executors import job_output
    from simulator.run import client_warning, simulate
    from simulator.scenario import scenario_from_dict
    d = {"name": "c", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
         "engine": {"max_num_seqs": 64, "max_model_len": 256},
         "workload": {"seed": 1, "num_requests": 300, "max_concurrency": 1,
                      "arrival": {"process": "poisson", "rate": 50},
                      "prompt_tokens": {"dist": "fixed", "value": 8},
                      "output_tokens": {"dist": "fixed", "value": 10}}}
    r = simulate(scenario_from_dict(d))
    c = r.summary["client"]
    out = job_output(r)
    assert not out["stable"] and out["offered_rate"] == pytest.approx(c["offered_rate"])
    assert 40 < c["offered_rate"] < 60 and c["held_requests"] > 250
    assert r.summary["request_throughput"] < 10   # 0.1 s per request, one at a time
    w = client_warning(r.summary)
    assert w.startswith(f"workload.max_concurrency 1 held {c['held_requests']} requests "
                        f"at the client")
    d["workload"]["max_concurrency"] = 64
    r = simulate(scenario_from_dict(d))
    assert job_output(r)["stable"] and r.summary["client"]["held_requests"] == 0
    assert client_warning(r.summary) is None


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("exact", [True, False])
def test_the_first_step_after_idle_pays_the_wake_up_cost_by_hand(exact, replicas):
    # Steps of 10 ms; a replica idle for g seconds adds 10 ms x min(g, 1 s) to its next
    # step (IdleInfo: one point, 10 ms after 1 s; replicas start idle at 0).
    # One replica: A arrives @500 after 0.5 s idle: [500, 515] (+5), [515, 525] A done;
    # B @2000 after 1.475 s idle: [2000, 2020] (+10) B done; C @2005 finds it busy:
    # [2020, 2030]. Two (round robin: A, C on 0, B on 1): B's replica idled 2 s:
    # [2000, 2020]; A's replica idled from 525 to C @2005: [2005, 2025].
    from simulator.cost_model import IdleInfo, build_cost_model
    from simulator.policy import RequestSpec
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict
    sc = scenario_from_dict({
        "name": "wake", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256},
        "cluster": {"replicas": replicas, "router": "round_robin"},
        "workload": {"num_requests": 3, "arrival": {"process": "poisson", "rate": 1},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 1}},
        "sim": {"exact_steps": exact, "warmup_requests": 0}})
    models = []
    for _ in range(replicas):
        cm = build_cost_model(sc)
        cm.idle = IdleInfo(gaps_s=[1.0], extra_s=[0.010])
        models.append(cm)
    ms = 1_000_000
    specs = [RequestSpec("A", 500 * ms, (("a", 16),), 2),
             RequestSpec("B", 2000 * ms, (("b", 16),), 1),
             RequestSpec("C", 2005 * ms, (("c", 16),), 1)]
    req = simulate(sc, specs=specs, cost_models=models).requests.set_index("request_id")
    got = {r: [round(req.loc[r, f"{k}_s"] * 1e3, 6) for k in ("arrival", "first_token",
                                                               "finish")] for r in "ABC"}
    assert got == {"A": [500, 515, 525], "B": [2000, 2020, 2020],
                   "C": [2005, 2030, 2030] if replicas == 1 else [2005, 2025, 2025]}
