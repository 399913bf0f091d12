"""Planner: max rate under SLO against Pollaczek–Khinchine, replica sizing confirmed by
simulation, hand-computed costs, sweep knee against max_num_seqs / (O × step), CLI."""


import csv
import json

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.executors import make_executor
from simulator.metrics import round_sig
from simulator.planner import (cost_figures, expand_candidates, plan, plan_table,
                               replicas_needed, split_sets, sweep)
from simulator.planner_report import pareto_front
from simulator.scenario import load_scenario, scenario_from_dict
from simulator.search import max_rate_search, run_generator

STEP = 0.01


def strict_json(path):
    """The JSON file at ``path``, read as strict JSON readers do (NaN, Infinity refused)."""
    import json

    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def scenario(out=2, n=2000, slo=None, engine=None, plan_cfg=None, price=None, rate=1.0):
    hw = {"step_time": {"constant_s": STEP}}
    if price is not None:
        hw["price_per_gpu_hour"] = price
    d = {"name": "t", "model": "llama-test", "hardware": hw,
         "engine": {"max_num_seqs": 1, "max_model_len": 1024, **(engine or {})},
         "cluster": {"router": "least_outstanding"},
         "workload": {"seed": 0, "num_requests": n,
                      "arrival": {"process": "poisson", "rate": rate},
                      "prompt_tokens": {"dist": "fixed", "value": 8},
                      "output_tokens": {"dist": "fixed", "value": out}},
         "slo": slo or {}}
    if plan_cfg:
        d["plan"] = plan_cfg
    return scenario_from_dict(d)


def test_max_rate_matches_pollaczek_khinchine():
    # M/D/1: service S = out × step; mean wait Wq = λS² / (2(1 − λS)) = T
    # ⇔ λ = 2T / (S (S + 2T)). T chosen so that ρ = 0.5 at the answer.
    out = 2
    s = out * STEP
    t = 0.5 * s / (2 * (1 - 0.5))
    pk = 2 * t / (s * (s + 2 * t))
    sc = scenario(out=out, slo={"queue_ms": {"mean": t * 1e3}})
    with make_executor("serial") as ex:
        res = run_generator(max_rate_search(sc, min_replications=3, max_replications=6), ex)
    assert res.max_rate == pytest.approx(pk, rel=0.05)
    lo, hi = res.bracket
    assert hi / lo <= 1.02 + 1e-9
    assert res.ci95[0] <= res.max_rate and res.ci95[1] >= hi
    assert res.capacity == pytest.approx(1 / s, rel=0.02)   # saturation probe: 1 / S


def test_a_throughput_plan_stops_at_the_capacity_of_an_md1_queue():
    # no SLO: the highest rate kept up with. M/D/1 with S = 10 steps: capacity 1 / S. At
    # 1.03 / S the queue grows 3% of the rate, too slowly for the backlog's trend test over
    # 2000 requests alone; the saturation probe keeps the answer at or below capacity
    out = 10
    s = out * STEP
    with make_executor("serial") as ex:
        res = run_generator(max_rate_search(scenario(out=out, n=2000),
                                            min_replications=2, max_replications=2), ex)
    assert res.capacity == pytest.approx(1 / s, rel=1e-6)
    # within the search's own tolerance (2%) of capacity, never past it
    assert 0.98 / s <= res.max_rate <= 1.02 / s


def test_a_sweep_reads_a_rate_past_an_md1_queues_capacity_as_unstable():
    # the same queue swept: at 1.03 / S the backlog's trend over 2000 requests alone would
    # read stable (the knee past capacity); the saturation probe's bound (one
    # probe per line of the other axes) makes it unstable, as in a plan
    from simulator.sweep import sweep
    s = 10 * STEP
    rates = [0.95 / s, 1.03 / s, 1.05 / s]
    with make_executor("serial") as ex:
        res = sweep(scenario(out=10, n=2000), {"workload.arrival.rate": rates,
                                               "workload.seed": [0, 1]}, ex)
    t = res.table
    assert list(t["stability"]) == ["stable"] * 2 + ["unstable"] * 4   # rate, then seed
    assert [k["knee"] for k in res.knees] == [rates[0]] * 2


def test_a_burst_that_never_saturates_its_slots_bounds_no_rate():
    # 256 slots, 200 requests of ~108 output tokens at 10 ms a step: capacity ≈ 256 / 1.08 s
    # ≈ 237 req/s, but a burst of 200 is admitted at once and finishes as its outputs end
    # (its 10th-90th percentile finishes read 73 req/s); points at 100-200 req/s, which
    # never queue, would read unstable by that bound. No replica has anyone waiting by the
    # 90th percentile finish: the probe bounds nothing, and the points are stable.
    from simulator.executors import job_output
    from simulator.search import PROBE_RATE, with_rate
    from simulator.sweep import sweep
    d = {"name": "t", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
         "engine": {"max_model_len": 2048, "max_num_seqs": 256},
         "workload": {"seed": 1, "num_requests": 200,
                      "arrival": {"process": "poisson", "rate": 100.0},
                      "prompt_tokens": {"dist": "fixed", "value": 10},
                      "output_tokens": {"dist": "lognormal", "median": 60, "p90": 240}}}
    sc = scenario_from_dict(d)
    from simulator.run import simulate
    assert job_output(simulate(with_rate(sc, PROBE_RATE)))["steady_throughput"] is None
    with make_executor("serial") as ex:
        res = sweep(sc, {"workload.arrival.rate": [100.0, 150.0, 200.0]}, ex)
    assert list(res.table["stability"]) == ["stable"] * 3
    said = "the sweep: the saturation probe (all requests at once) did not keep every " \
           "replica's queue busy while a quarter of its requests finished, so no capacity " \
           "bound applies"
    assert any(w.startswith(said) for w in res.warnings)


def test_the_capacity_bound_by_hand():
    import numpy as np
    import pandas as pd

    from simulator.executors import over_capacity, steady_throughput
    # the rate the requests arrived at, not the nominal one: a short run of nominal 3.45
    # req/s that drew 2.95 is below a capacity of 3.33 (1.02 × 3.33 = 3.40)
    assert not over_capacity({"offered_rate": 2.95, "served_fraction": 0.9}, 3.33)
    assert over_capacity({"offered_rate": 3.41, "served_fraction": 0.9}, 3.33)
    assert not over_capacity({"offered_rate": 3.41, "served_fraction": 0.98}, 3.33)
    assert not over_capacity({"offered_rate": 3.41, "served_fraction": 0.9}, None)
    # 2 replicas, 40 requests each finishing 1 s apart from 1 s to 40 s; replica 1 admits
    # its last at 20.5 s, replica 0 at 30.5 s: both had someone waiting until 20.5 s, so
    # the window runs from the 10th percentile finish (index 8 of the 80) to the last
    # finish at or before 20.5 s
    rows = []
    for rep, last in ((0, 30.5), (1, 20.5)):
        for k in range(40):
            rows.append({"replica": rep, "first_scheduled_s": min(k * 1.0, last),
                         "first_token_s": k + 0.5, "finish_s": k + 1.0 + rep * 0.25,
                         "finish_reason": "length", "warmup": False})
    req = pd.DataFrame(rows)
    f = np.sort(req["finish_s"].to_numpy())
    i0, i1 = 80 // 10, int(np.searchsorted(f, 20.5, side="right")) - 1
    assert i1 - i0 >= 80 // 4
    assert steady_throughput(req) == pytest.approx((i1 - i0) / (f[i1] - f[i0]))
    req.loc[req["replica"] == 1, "first_scheduled_s"] = 0.0   # replica 1 never waited
    assert steady_throughput(req) is None


def test_unservable_slo_gives_zero_rate():
    # TPOT is one step (10 ms) at any load: a 5 ms TPOT SLO is out of reach.
    sc = scenario(out=4, n=300, slo={"tpot_ms": {"p99": 5}})
    with make_executor("serial") as ex:
        res = run_generator(max_rate_search(sc, min_replications=2, max_replications=2), ex)
    assert res.max_rate == 0 and res.at_max is None
    assert res.note == ("SLO not met even at low load; TPOT p99 of requests served alone "
                        "10 ms > 5 ms: only faster steps meet it")


def test_a_miss_at_low_load_names_the_slo_or_the_backlog():
    # no floor: the note says which SLO the lowest rate tried still misses (mean over
    # replications), or that its backlog grows
    from simulator.search import RateEval, _miss_note

    def out(ttft, e2el):
        s = {"slo": {"ttft_ms": {"p99": {"value": ttft, "threshold": 400, "met": ttft <= 400}},
                     "e2el_ms": {"p99": {"value": e2el, "threshold": 1500,
                                         "met": e2el <= 1500}}}}
        return {"summary": s, "exact": s,
                "alone_ms": {"ttft_ms": {"p99": 390.0}, "e2el_ms": {"p99": 900.0}}}
    e = RateEval(0.0581, False, True, False, [1.1, 1.0], 1.05, None,
                 [out(440.0, 1000.0), out(400.2, 1400.0)])
    assert _miss_note(e) == "; at 0.0581 req/s TTFT p99 420.1 ms > 400 ms"
    e.unstable = True
    assert _miss_note(e) == "; at 0.0581 req/s the backlog still grows"


def test_cost_figures_by_hand():
    # 3 replicas × 2 GPUs × 2.5 USD = 15 USD/h; 10 req/s × 200 tokens × 3600 s = 7.2 M tok/h.
    c = cost_figures(3, 2 * 2.5, 10.0, 200.0)
    assert c["cost_per_hour"] == pytest.approx(15.0)
    assert c["cost_per_million_output_tokens"] == pytest.approx(15.0 / 7.2)
    assert replicas_needed(40, 15.0) == 3 and replicas_needed(45, 15.0) == 3
    assert replicas_needed(45.01, 15.0) == 4 and replicas_needed(1, 0) is None


def test_plan_sizes_replicas_confirmed_by_simulation():
    # Per replica: max_num_seqs 2, 8 output tokens at 10 ms → capacity 25 req/s.
    cfg = {"target_rate": 60, "candidates": {"engine.max_num_seqs": [1, 2]},
           "min_replications": 2, "max_replications": 3}
    sc = scenario(out=8, n=500, slo={"ttft_ms": {"p99": 150}}, plan_cfg=cfg, price=2.0)
    with make_executor("serial") as ex:
        res = plan(sc, ex)
    best = res.best
    assert best is not None and best.confirmed
    assert best.candidate.values == {"engine.max_num_seqs": 2}
    trail = {c["replicas"]: c["feasible"] for c in best.confirmation}
    n = best.replicas
    assert trail[n] is True and trail[n - 1] is False      # N meets the SLOs, N − 1 not
    lo, hi = best.replicas_ci95
    assert lo <= n <= hi and hi - lo <= 2
    assert best.costs["cost_per_hour"] == pytest.approx(n * 2.0)
    mean_out = 8.0
    assert best.costs["cost_per_million_output_tokens"] == pytest.approx(
        n * 2.0 / (60 * mean_out * 3600) * 1e6)
    assert 60 / n <= 25                                    # below one replica's capacity
    table = plan_table(res)
    assert list(table["status"]).count("cheapest feasible") == 1
    assert set(table["cost_kind"]) == {"inline"}
    # max_num_seqs 1 serves half as much a replica: tried at fewer replicas than would
    # cost as much as the best (same price: at most n - 1), it misses there
    confirmed = dict(zip(table["engine.max_num_seqs"], table["confirmed"]))
    assert confirmed[2] is True and confirmed[1] is False
    other = next(r for r in res.rows if r is not best)
    assert max(c["replicas"] for c in other.confirmation) == n - 1
    assert not any(c["feasible"] for c in other.confirmation)


def test_sweep_knee_matches_max_num_seqs_bound():
    # Saturation by max_num_seqs: capacity = S / (O × step) = 4 / (8 × 0.01) = 50 req/s.
    mns, out = 4, 8
    cap = mns / (out * STEP)
    rates = [round(cap * f, 3) for f in (0.85, 0.9, 0.95, 1.0, 1.05, 1.1)]
    sc = scenario(out=out, n=1500, engine={"max_num_seqs": mns})
    with make_executor("serial") as ex:
        res = sweep(sc, {"workload.arrival.rate": rates}, ex)
    assert len(res.knees) == 1
    assert res.knees[0]["knee"] == pytest.approx(cap, rel=0.05)
    assert not res.table["stable"].iloc[-1]
    # past the knee the queue grows with every slot taken: max_num_seqs binds
    assert res.table["binding"].iloc[-1] == "max_num_seqs"



def test_slo_met_at_lists_the_stable_points_that_meet_every_slo_per_line():
    import pandas as pd

    from simulator.sweep import slo_met_at

    t = pd.DataFrame({"cluster.replicas": [1, 2, 3, 1, 2, 3],
                      "hardware.profile": ["h100-sxm"] * 3 + ["l4"] * 3,
                      "stability": ["unstable", "stable", "stable", "unstable", "unstable",
                                    "stable"],
                      "slo_met": [False, False, True, False, True, False]})
    # l4 × 2 meets the SLOs on an unstable run: not counted
    assert slo_met_at(t, ["cluster.replicas", "hardware.profile"]) == [
        {"hardware.profile": "h100-sxm", "met_at": [3], "answer": 3},
        {"hardware.profile": "l4", "met_at": [], "answer": None}]
    assert slo_met_at(t.assign(slo_met=None), ["cluster.replicas"]) == []   # no SLO


def test_the_answer_among_the_values_meeting_every_slo_is_the_fewest_replicas_the_highest_rate():
    import pandas as pd

    from simulator.sweep import slo_met_at

    # swept in descending order: the answer is the value, not the first listed
    met = {"stability": ["stable"] * 4, "slo_met": [True, True, True, False]}
    assert slo_met_at(pd.DataFrame({"cluster.replicas": [4, 3, 2, 1], **met}),
                      ["cluster.replicas"])[0]["answer"] == 2
    # the most work that still meets them: the highest rate, the most closed-loop users
    assert slo_met_at(pd.DataFrame({"workload.arrival.rate": [8, 4, 2, 16], **met}),
                      ["workload.arrival.rate"])[0]["answer"] == 8
    assert slo_met_at(pd.DataFrame({"workload.arrival.concurrency": [1, 8, 4, 16], **met}),
                      ["workload.arrival.concurrency"])[0]["answer"] == 8
    # null (unset: vLLM sizes the cache) ranks above every number
    assert slo_met_at(pd.DataFrame({"engine.num_gpu_blocks": [None, 4000, 8000, 100],
                                    **met}), ["engine.num_gpu_blocks"])[0]["answer"] == 4000
    # no order: a router, a seed
    assert slo_met_at(pd.DataFrame({"cluster.router": ["a", "b", "c", "d"], **met}),
                      ["cluster.router"])[0]["answer"] is None
    assert slo_met_at(pd.DataFrame({"workload.seed": [1, 2, 3, 4], **met}),
                      ["workload.seed"])[0]["answer"] is None


def test_a_knee_is_only_for_a_numeric_first_axis_and_reads_back_as_set(tmp_path, capsys):
    import pandas as pd

    from simulator.sweep import knees

    t = pd.DataFrame({"cluster.router": ["round_robin", "prefix_affinity"],
                      "stability": ["stable", "stable"]})
    assert knees(t, ["cluster.router"]) == []   # "highest stable router" means nothing
    for key in ("workload.seed", "slo.ttft_ms.p99", "sim.replications",
                "workload.num_requests"):   # neither load nor capacity: no knee either
        k = pd.DataFrame({key: [1, 2], "stability": ["stable", "stable"]})
        assert knees(k, [key]) == []
    t = pd.DataFrame({"engine.num_gpu_blocks": [16384, 20000, 30000],
                      "stability": ["stable", "stable", "unstable"]})
    assert knees(t, ["engine.num_gpu_blocks"]) == [{"knee": 16384}]   # capacity: the least
    # a key that adds capacity: the lowest stable value is the answer (fewest replicas)
    from simulator.sweep import knee_title
    r = pd.DataFrame({"cluster.replicas": [1, 2, 3], "stability": ["unstable", "stable",
                                                                   "stable"]})
    assert knees(r, ["cluster.replicas"]) == [{"knee": 2}]
    assert knee_title("cluster.replicas") == "lowest stable cluster.replicas"
    assert knee_title("workload.arrival.rate") == "highest stable workload.arrival.rate"
    # a closed loop is always stable: its knee is the fewest users reaching 95% of the
    # line's highest throughput (11.1 < 0.95 × 12.2 = 11.59 <= 11.9), per line
    c = pd.DataFrame({"workload.arrival.concurrency": [8, 32, 128, 256, 512] * 2,
                      "cluster.replicas": [1] * 5 + [2] * 5,
                      "stability": ["stable"] * 9 + ["rejects requests"],
                      "request_throughput": [3.2, 7.4, 11.1, 11.9, 12.2,
                                             3.2, 7.4, 14.8, 20.0, 30.0]})
    assert knees(c, ["workload.arrival.concurrency", "cluster.replicas"]) == [
        {"cluster.replicas": 1, "knee": 256}, {"cluster.replicas": 2, "knee": 256}]
    assert knee_title("workload.arrival.concurrency").startswith("throughput saturates")
    # a client-side limit caps what is in flight as users do: the same rule, among the
    # stable points (a limit whose sends fall behind the arrivals is unstable)
    m = c.rename(columns={"workload.arrival.concurrency": "workload.max_concurrency"})
    assert knees(m, ["workload.max_concurrency", "cluster.replicas"])[0] == {
        "cluster.replicas": 1, "knee": 256}
    assert knee_title("workload.max_concurrency").startswith("throughput saturates")
    from simulator.planner_cli import _knee_text
    # still rising at the largest swept (14.8 -> 20.0): the knee says the sweep stopped early
    rising = c[c["workload.arrival.concurrency"] <= 256]
    assert knees(rising, ["workload.arrival.concurrency", "cluster.replicas"])[1] == {
        "cluster.replicas": 2, "knee": 256}
    assert _knee_text(rising, {"cluster.replicas": 2, "knee": 256},
                      "workload.arrival.concurrency") == "256 (the largest swept: " \
        "throughput may still grow with more in flight)"
    assert _knee_text(c, {"cluster.replicas": 1, "knee": 256},
                      "workload.arrival.concurrency") == "256"
    y = tmp_path / "k.yaml"
    y.write_text(SMALL_PLAN.split("slo:")[0])
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", "engine.num_gpu_blocks=16384,20000", "--out",
                 str(out), "--executor", "serial", "--quiet"]) == 0
    # as --set takes it back (16,384 would sweep 16 and 384); blocks add capacity: the
    # lowest that keeps up is the answer
    assert "lowest stable engine.num_gpu_blocks: 16384\n" in capsys.readouterr().out
    out2 = tmp_path / "sw2"
    assert main(["sweep", str(y), "--set", "cluster.router=round_robin,least_outstanding",
                 "--out", str(out2), "--executor", "serial", "--quiet"]) == 0
    assert "stable cluster.router" not in capsys.readouterr().out
    assert "Knee" not in (out2 / "report.md").read_text()

def test_a_closed_loop_set_by_a_flag_sweeps_its_users(tmp_path):
    import pandas as pd

    # a Poisson file swept as a closed loop: the mapping flag lacks the concurrency the
    # sweep gives (the base is the first point). Every request is one 10 ms step of
    # prefill (+ first token) and one of decode, N users in lockstep: N per 20 ms.
    y = tmp_path / "c.yaml"
    y.write_text("""name: c
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 16}
workload:
  seed: 0
  num_requests: 200
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 2}
""")
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", "workload.arrival={process: closed_loop}",
                 "--set", "workload.arrival.concurrency=1,4", "--out", str(out),
                 "--executor", "serial", "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["workload.arrival.concurrency"]) == [1, 4]
    assert list(table["request_throughput"]) == pytest.approx([1 / 0.02, 4 / 0.02])
    plain, axes = split_sets(["workload.arrival={process: closed_loop}",
                              "workload.arrival.concurrency=1,4"])
    assert plain == ["workload.arrival={process: closed_loop}"]
    assert axes == {"workload.arrival.concurrency": ["1", "4"]}
    # a mapping that gives the swept key too, or one set after a key inside it, is refused
    # as run refuses it: one of the values typed would be dropped
    for sets in (["workload.arrival={process: closed_loop, concurrency: 2}",
                  "workload.arrival.concurrency=1,4"],
                 ["workload.arrival.rate=1,2", "workload.arrival={process: poisson, rate: 3}"],
                 ["workload.arrival.concurrency=2,4", "workload.arrival={process: closed_loop}"],
                 ["workload.arrival.rate=1,2", "workload.arrival=3,4"]):
        with pytest.raises(InputError, match="inside it are both set"):
            split_sets(sets)


def test_sweep_labels_points_that_reject_requests(tmp_path, capsys):
    import pandas as pd

    from simulator.workload import build_workload

    # prompts uniform in [8, 2000] against max_model_len 1024: the scheduler rejects every
    # prompt of 1024 tokens or more, as vLLM does, at whatever rate
    y = tmp_path / "r.yaml"
    y.write_text("""name: r
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 1024}
workload:
  seed: 0
  num_requests: 200
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: uniform, min: 8, max: 2000}
  output_tokens: {dist: fixed, value: 2}
""")
    from simulator.scenario import load_scenario
    want = sum(s.prompt_tokens >= 1024 for s in build_workload(load_scenario(y).workload))
    assert 0 < want < 200
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=5,10", "--out", str(out),
                 "--executor", "serial", "--quiet"]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["stability"]) == ["rejects requests"] * 2
    assert list(table["rejected"]) == [want, want]
    assert table["stable"].isna().all()   # the throughput test cannot judge their queue
    # the terminal's stability column says "rejects" beside the count; the knee line in full
    rows = [line.split() for line in printed.splitlines() if line.split()[:1] in (["5"], ["10"])]
    assert [r[3:5] for r in rows] == [["rejects", str(want)]] * 2
    assert printed.count("rejects requests") == 1
    assert "highest stable workload.arrival.rate: none (every point rejects requests" in printed
    md = (out / "report.md").read_text()
    assert md.count("| rejects requests |") == 2 and "| stability |" in md
    # the same scenario with room for every prompt is labelled stable, and has a knee
    assert main(["sweep", str(y), "--set", "engine.max_model_len=2048", "--set",
                 "workload.arrival.rate=5,10", "--out", str(out), "--executor", "serial",
                 "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["stability"]) == ["stable"] * 2 and list(table["rejected"]) == [0, 0]
    assert list(table["stable"]) == [True, True]
    assert "highest stable workload.arrival.rate: 10" in capsys.readouterr().out


def test_split_sets_and_candidates():
    plain, axes = split_sets(["workload.arrival.rate=1,2,4", "engine.max_num_seqs=8",
                              "slo.ttft_ms={p99: 500, mean: 200}"])
    assert axes == {"workload.arrival.rate": ["1", "2", "4"]}
    assert plain == ["engine.max_num_seqs=8", "slo.ttft_ms={p99: 500, mean: 200}"]
    # swept values read as the scenario file does: 1e3 is a float (YAML 1.2), 8 an int
    from simulator.sweep import grid
    assert grid({"a": ["1e3", "8"]}) == [{"a": 1000.0}, {"a": 8}]
    assert [type(p["a"]) for p in grid({"a": ["1e3", "8"]})] == [float, int]
    # a key given twice, swept or not, is refused (the later flag would silently win)
    for sets in (["a.b=1,2", "a.b=3,4"], ["a.b=1", "a.b=2"], ["a.b=1", "a . b=2,3"],
                 ["a.b=1,2", "a.b={c: 1}"]):
        with pytest.raises(InputError, match=rf"^--set {sets[1]}: a\.b is already set by "
                                             rf"--set {sets[0]} \(give each key once"):
            split_sets(sets)
    # a swept value YAML cannot read is said with its flag
    with pytest.raises(InputError, match=r"^--set a\.b=x: y: z,4: value 'x: y: z' is not "
                                         r"valid YAML: mapping values are not allowed here$"):
        split_sets(["a.b=x: y: z,4"])
    d = {"name": "c", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
         "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1},
                      "prompt_tokens": {"dist": "fixed", "value": 8},
                      "output_tokens": {"dist": "fixed", "value": 8}},
         "plan": {"candidates": {"hardware.profile": ["h100-sxm", "l4"],
                                 "hardware.tensor_parallel": [1, 2]},
                  "prices": {"h100-sxm": 1.5}}}
    cands = expand_candidates(scenario_from_dict(d))
    assert len(cands) == 4
    h100 = [c for c in cands if c.values["hardware.profile"] == "h100-sxm"]
    assert [c.price_per_replica_hour for c in h100] == [1.5, 3.0]   # override × TP
    assert all(c.cost_kind == "projected" for c in h100)
    d["plan"]["candidates"]["engine.max_num_seq"] = [4]
    with pytest.raises(InputError, match="plan.candidates"):
        expand_candidates(scenario_from_dict(d))


def test_a_ranking_of_gpus_on_default_efficiencies_says_so():
    from simulator.planner import default_efficiency_note

    d = {"name": "c", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
         "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1},
                      "prompt_tokens": {"dist": "fixed", "value": 8},
                      "output_tokens": {"dist": "fixed", "value": 8}},
         "plan": {"candidates": {"hardware.profile": ["h100-sxm", "l4"],
                                 "hardware.tensor_parallel": [1, 2]}}}
    note = default_efficiency_note(expand_candidates(scenario_from_dict(d)))
    assert note.startswith("the GPUs (h100-sxm, l4) are ranked by a roofline projection that "
                           "takes each to reach the same share of its peaks (MBU 0.7, MFU 0.5)")
    assert note.endswith("; tensor_parallel 1, 2 are projected at the same share of each "
                         "GPU's peaks, though a shard's smaller matmuls usually reach less of "
                         "it: the higher degrees' step times are likely optimistic (a profile "
                         "measured at each degree prices them)")
    d["plan"]["candidates"]["hardware.profile"] = ["h100-sxm"]   # one GPU: TP ranked only
    assert default_efficiency_note(expand_candidates(scenario_from_dict(d))).startswith(
        "tensor_parallel 1, 2 are projected")
    d["plan"]["candidates"]["hardware.tensor_parallel"] = [1]   # nothing ranked
    assert default_efficiency_note(expand_candidates(scenario_from_dict(d))) is None


def small_scenario(name: str, num_requests: int) -> str:
    """YAML of a small llama-test scenario on h100-sxm (fixed 8-token prompts, 4 out)."""
    return f"""name: {name}
model: llama-test
hardware: {{profile: h100-sxm}}
engine: {{max_num_seqs: 4, max_model_len: 512}}
workload:
  num_requests: {num_requests}
  arrival: {{process: poisson, rate: 5}}
  prompt_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: 4}}
"""


def test_plan_with_an_unknown_gpu_is_an_input_error(tmp_path, capsys):
    from simulator.catalog import list_hardware
    from simulator.cost_model import list_profiles

    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 50) + """slo: {ttft_ms: {p99: 500}}
plan: {target_rate: 10, candidates: {hardware.profile: [h100-sxm, h100-pcie]}}
""")
    out = tmp_path / "pl"
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # line 11 holds plan:, a flow mapping; h100-pcie is item 1 of the profile list
    assert err == [f"servesim: error: p.yaml:11: plan.candidates.hardware.profile.1: "
                   f"'h100-pcie' is "
                   f"neither a catalog GPU ({', '.join(list_hardware())}) nor a calibration "
                   f"profile (known: {', '.join(list_profiles())})"]
    assert not out.exists()
    # a plan whose own hardware (not a candidate) is unknown names that key
    y.write_text(y.read_text().replace("{profile: h100-sxm}", "{profile: h100-pcie}")
                 .replace("hardware.profile: [h100-sxm, h100-pcie]", "engine.max_num_seqs: [2]"))
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out", str(out)]) == 2
    assert "p.yaml:3: hardware.profile: 'h100-pcie' is neither" in capsys.readouterr().err


def test_pareto_front():
    assert pareto_front([1, 2, 3, 2], [5, 3, 1, 4]) == [0, 1, 2]
    assert pareto_front([1, None], [1, 2]) == [0]


def test_pareto_plot_labels_coinciding_candidates_once():
    # rows 0 and 1 (max_num_seqs 64 and 256 that ran alike) at one point: one label "0,1";
    # so are two that round apart (TP1 x 4 and TP2 x 2 at 11.96 USD/h, one cost 1e-9 more)
    import pandas as pd
    from simulator.planner_report import pareto_figure

    table = pd.DataFrame({"cost_per_hour": [4.0, 4.0 + 1e-9, 6.0],
                          "ttft_p99_ms": [100.0, 100.2, 80.0],
                          "ttft_p99_ci95": [None, None, [70.0, 90.0]],
                          "tpot_p99_ms": [20.0, 21.0, 15.0],
                          "tpot_p99_ci95": [None, None, None],
                          "cost_kind": ["projected"] * 3})
    ttft, tpot = pareto_figure(table, 0).axes
    assert sorted(t.get_text() for t in ttft.texts) == ["0,1", "2"]
    assert sorted(t.get_text() for t in tpot.texts) == ["0", "1", "2"]


def test_pareto_plot_gives_twelve_candidates_twelve_colours():
    # matplotlib's cycle of 10 coloured candidates 0 and 10 alike
    import pandas as pd
    from matplotlib.colors import to_hex
    from simulator.planner_report import pareto_figure

    n = 12
    table = pd.DataFrame({"cost_per_hour": [1.0 + i for i in range(n)],
                          "ttft_p99_ms": [100.0 - i for i in range(n)],
                          "ttft_p99_ci95": [None] * n, "tpot_p99_ms": [20.0] * n,
                          "tpot_p99_ci95": [None] * n, "cost_kind": ["measured"] * n})
    ttft, _ = pareto_figure(table, None).axes
    colours = {to_hex(line.get_color()) for line in ttft.lines if line.get_marker() == "o"}
    assert len(colours) == n


# 10 ms per step, max_num_seqs 4 or 2: a small plan that finds a feasible candidate
SMALL_PLAN = """name: s
model: llama-test
hardware: {step_time: {constant_s: 0.01}, price_per_gpu_hour: 1.0}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 200
  arrival: {process: poisson, rate: 10}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 4}
slo: {ttft_ms: {p99: 200}}
plan: {target_rate: 30, candidates: {engine.max_num_seqs: [2, 4]}, max_replications: 2}
"""


def test_plan_csv_writes_candidate_values_as_given(tmp_path, capsys):
    # a null beside 64 keeps the column's integers: "64", not "64.0", in plan.csv
    import csv
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("candidates: {engine.max_num_seqs: [2, 4]}",
                                    "candidates: {engine.max_num_batched_tokens: [64, null]}"))
    out = tmp_path / "pl"
    assert main(["plan", str(y), "--out", str(out), "--executor", "serial", "--quiet"]) == 0
    with open(out / "plan.csv", newline="") as f:
        col = [row["engine.max_num_batched_tokens"] for row in csv.DictReader(f)]
    assert col == ["64", "null"]   # unset, as given (an empty cell means none)


def test_a_null_swept_value_reads_null_unset_in_the_knee_and_met_lines(tmp_path, capsys):
    # both points keep up at 10 req/s (10 ms steps, 4 seqs): the lowest stable value is 64
    # (null, vLLM's own sizing, ranks above every number) and both meet the SLO
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    assert main(["sweep", str(y), "--set", "engine.max_num_batched_tokens=null,64", "--out",
                 str(tmp_path / "sw"), "--executor", "serial", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "lowest stable engine.max_num_batched_tokens: 64" in lines
    assert ("every SLO met (stable) at engine.max_num_batched_tokens: null (unset), 64; "
            "the fewest: 64" in lines)
    # sweep.json: the axis values as the points hold them (the number 64, not "64")
    import json
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert doc["axes"] == {"engine.max_num_batched_tokens": [None, 64]}
    assert [p["engine.max_num_batched_tokens"] for p in doc["points"]] == [None, 64]
    assert doc["slo_met_at"] == [{"met_at": [None, 64], "answer": 64}]


def test_a_plan_whose_every_prompt_is_rejected_says_why_nothing_completed(tmp_path, capsys):
    # 8-token prompts and max_model_len 8: vLLM rejects every one (prompt >= max_model_len)
    import json
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("max_model_len: 512", "max_model_len: 8"))
    assert main(["plan", str(y), "--out", str(tmp_path / "pl"), "--executor", "serial",
                 "--quiet"]) == 1
    assert ("no candidate meets every SLO at 30 req/s; none ran to an SLO figure to rank "
            "them by: each one's status says why") in capsys.readouterr().out.splitlines()
    cands = json.loads((tmp_path / "pl" / "plan.json").read_text())["candidates"]
    assert [c["status"] for c in cands] == [
        "nothing completed at saturation: every request is rejected (prompts of "
        "engine.max_model_len tokens or more): raise engine.max_model_len or shorten the "
        "prompts"] * 2


def test_cli_sweep_plan_compare(tmp_path, capsys):
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    args = ["--executor", "serial", "--quiet"]
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=10,20", "--out",
                 str(tmp_path / "sw")] + args) == 0
    assert (tmp_path / "sw" / "report.html").is_file()
    assert main(["plan", str(y), "--out", str(tmp_path / "pl")] + args) == 0
    assert "cheapest feasible" in capsys.readouterr().out
    # plan.csv gives each CI of plan.json as two numeric columns (lo, hi), never list text
    import json

    import pandas as pd
    plan_json = json.loads((tmp_path / "pl" / "plan.json").read_text())["candidates"]
    plan_csv = pd.read_csv(tmp_path / "pl" / "plan.csv")
    # plan.min_replications 2 (default) = max_replications 2: every figure from 2 runs
    assert set(plan_csv["operating_replications"].dropna()) == {2}
    # a count, written as one (2, not 2.0) in both files
    assert {r["operating_replications"] for r in plan_json} - {None} == {2}
    assert all(type(r["operating_replications"]) in (int, type(None)) for r in plan_json)
    ci_cols = [c for c in plan_json[0] if c.endswith("_ci95")]
    assert ci_cols and not any(c in plan_csv for c in ci_cols)
    for c in ci_cols:
        assert plan_csv[c + "_lo"].dtype.kind in "fi" and plan_csv[c + "_hi"].dtype.kind in "fi"
        for row, lo, hi in zip(plan_json, plan_csv[c + "_lo"], plan_csv[c + "_hi"]):
            want = row[c] or [None, None]
            assert [None if pd.isna(v) else v for v in (lo, hi)] == pytest.approx(want)
    y2 = tmp_path / "s2.yaml"
    y2.write_text(y.read_text().replace("name: s\n", "name: s2\n"))
    capsys.readouterr()
    assert main(["compare", str(y), str(y2), "--out", str(tmp_path / "cmp")] + args) == 0
    assert (tmp_path / "cmp" / "compare.csv").is_file()
    # compare serves each file as written, and says their candidates are not compared
    assert ("servesim: note: the plan: sections of s.yaml, s2.yaml are not used: compare "
            "serves each file's settings as written") in capsys.readouterr().err
    # and so does run
    assert main(["run", str(y), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert ("servesim: note: the plan: section of s.yaml is not used: run serves the "
            "settings as written (servesim plan searches its candidates)"
            in capsys.readouterr().err)
    # each report holds only files its command writes: a rerun replaces them all
    from fnmatch import fnmatch

    from simulator.files import REPORT_FILES, check_folder
    for kind, d in (("sweep", "sw"), ("plan", "pl"), ("compare", "cmp")):
        names = [f.name for f in (tmp_path / d).iterdir()]
        assert all(any(fnmatch(n, pat) for pat in REPORT_FILES[kind]) for n in names), names
        check_folder(tmp_path / d, "--out", kind)
    # one command's report folder is not another's: refused before any run, left as it was
    before = sorted(p.name for p in (tmp_path / "pl").iterdir())
    capsys.readouterr()
    assert main(["compare", str(y), str(y2), "--out", str(tmp_path / "pl")] + args) == 2
    assert capsys.readouterr().err.startswith(f"servesim: error: --out {tmp_path / 'pl'}: "
                                              "holds a plan report (plan.json)")
    assert sorted(p.name for p in (tmp_path / "pl").iterdir()) == before
    assert main(["sweep", str(y), "--out", str(tmp_path / "x")] + args) == 2
    assert "swept key" in capsys.readouterr().err
    assert main(["plan", str(y), "--target-rate", "-1"] + args) == 2


def test_sweep_and_compare_take_replications_as_run_does(tmp_path, capsys):
    import pandas as pd

    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    y2 = tmp_path / "s2.yaml"
    y2.write_text(SMALL_PLAN.replace("name: s\n", "name: s2\n"))
    args = ["--executor", "serial", "--quiet", "--replications", "3"]
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=10,20", "--out",
                 str(tmp_path / "sw")] + args) == 0
    table = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert table["ttft_p99_ci95_lo"].notna().all()   # a CI needs two or more runs
    assert main(["compare", str(y), str(y2), "--out", str(tmp_path / "cmp")] + args) == 0
    assert "(means over 3 replications)" in " ".join(capsys.readouterr().out.split())
    for cmd in (["sweep", str(y), "--set", "workload.arrival.rate=10,20"],
                ["compare", str(y), str(y2)]):
        assert main(cmd + ["--out", str(tmp_path / "bad"), "--replications", "0"]) == 2
        assert capsys.readouterr().err.startswith("servesim: error: --replications: 1 to ")
    assert main(["sweep", str(y), "--set", "sim.replications=1,2", "--replications", "2"]) == 2
    assert "sim.replications is also swept" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_sweep_table_shows_each_swept_value_as_given(tmp_path, capsys):
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=10.25,1000.5", "--out",
                 str(tmp_path / "sw"), "--executor", "serial", "--quiet"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows if r and r[0][:1].isdigit()] == ["10.25", "1000.5"]


def test_a_two_axis_sweep_table_fits_80_columns(tmp_path, capsys, monkeypatch):
    import pandas as pd

    # two swept keys, every figure column and the binding limit: no header word split,
    # no line past 80 columns; no rejections, so no rejected column (sweep.csv keeps it)
    monkeypatch.setenv("COLUMNS", "80")
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=10,20", "--set",
                 "engine.max_num_batched_tokens=8192,16384", "--out", str(tmp_path / "sw"),
                 "--executor", "serial", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[:next(i for i, x in enumerate(lines) if x.startswith("binding (rules):"))]
    assert max(map(len, table)) <= 80
    words = " ".join(table).split()
    assert "stability" in words and "rejected" not in words
    assert (pd.read_csv(tmp_path / "sw" / "sweep.csv")["rejected"] == 0).all()
    # an SLO on E2EL p99 adds its column, still within 80
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}",
                                    "slo: {ttft_ms: {p99: 200}, e2el_ms: {p99: 300}}"))
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=10,20", "--set",
                 "engine.max_num_batched_tokens=8192,16384", "--out", str(tmp_path / "sw2"),
                 "--executor", "serial", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[:next(i for i, x in enumerate(lines) if x.startswith("binding (rules):"))]
    assert max(map(len, table)) <= 80 and "E2EL" in " ".join(table).split()


def test_a_plan_without_prices_calls_its_pick_best_not_cheapest(tmp_path, capsys):
    # No price: every feasible row costs "inf", so the pick is by capacity (replicas × max
    # rate per replica), then the fewest replicas; nothing was cheaper than anything.
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace(", price_per_gpu_hour: 1.0", ""))
    assert main(["plan", str(y), "--out", str(tmp_path / "pl"), "--executor", "serial",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "cheapest" not in out
    assert "best feasible (no price: the most capacity" in out
    with open(tmp_path / "pl" / "plan.csv", newline="") as f:
        status = [r["status"] for r in csv.DictReader(f)]
    assert status.count("best feasible") == 1 and "cheapest feasible" not in status
    md = (tmp_path / "pl" / "report.md").read_text()
    assert "Plan meeting every SLO at 30 req/s (no candidate has a price" in md
    assert "Cheapest plan" not in md and "USD" not in md.split("## Definitions")[0]
    assert "GPUs (no prices) vs latency" in md


def test_a_plan_without_prices_plots_latency_against_gpus():
    # no cost to put on the x axis: GPUs (replicas × tensor_parallel) take its place
    import pandas as pd

    from simulator.planner_report import pareto_figure
    table = pd.DataFrame({"cost_per_hour": [None, None], "gpus": [2, 4],
                          "ttft_p99_ms": [30.0, 20.0], "ttft_p99_ci95": [None, None],
                          "tpot_p99_ms": [5.0, 6.0], "tpot_p99_ci95": [None, None],
                          "cost_kind": ["inline", "inline"]})
    fig = pareto_figure(table, best_index=0)
    for ax, ys in zip(fig.axes, ([30.0, 20.0], [5.0, 6.0])):
        assert ax.get_xlabel().startswith("GPUs (replicas × tensor_parallel")
        assert "★ best" in ax.get_title()
        points = [tuple(c.lines[0].get_xydata()[0]) for c in ax.containers]
        assert points == [(2.0, ys[0]), (4.0, ys[1])]


def test_plan_with_one_output_token_meets_a_tpot_slo_vacuously(tmp_path, capsys):
    # One output token per request: no TPOT exists, so a TPOT SLO cannot be missed (as
    # goodput counts it). One step of 10 ms per request and max_num_seqs 4: a candidate
    # serves well over the 30 req/s target with a 200 ms TTFT bound.
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("output_tokens: {dist: fixed, value: 4}",
                                    "output_tokens: {dist: fixed, value: 1}")
                 .replace("slo: {ttft_ms: {p99: 200}}",
                          "slo: {ttft_ms: {p99: 200}, tpot_ms: {p99: 5}}")
                 .replace("[2, 4]", "[4]"))
    args = ["--executor", "serial", "--quiet"]
    assert main(["plan", str(y), "--out", str(tmp_path / "pl")] + args) == 0
    assert "cheapest feasible" in capsys.readouterr().out
    assert (tmp_path / "pl" / "pareto.png").is_file()
    assert main(["run", str(y), "--out", str(tmp_path / "run")] + args[2:]) == 0
    md = (tmp_path / "run" / "report.md").read_text()
    assert "| TPOT | p99 | 5 ms | n/a (no samples) | yes |" in md
    assert "All SLOs met: **yes**" in md


def test_compare_reads_the_first_plans_trace_from_its_own_folder(tmp_path, capsys):
    # a relative trace path is the first scenario's, read beside its file, not beside each
    # other plan's
    text = """name: {name}
model: llama-test
hardware: {{step_time: {{constant_s: {step}}}}}
engine: {{max_num_seqs: 4, max_model_len: 512}}
workload:
  trace: {{path: t.csv, format: csv, columns: {{arrival: t, prompt_tokens: p,
           output_tokens: o}}, arrival_unit: s}}
"""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.csv").write_text("t,p,o\n" + "".join(f"{i},8,3\n" for i in range(5)))
    (tmp_path / "a" / "s.yaml").write_text(text.format(name="one", step=0.01))
    (tmp_path / "b" / "s.yaml").write_text(text.format(name="two", step=0.02))
    args = ["--executor", "serial", "--quiet", "--out"]
    assert main(["compare", str(tmp_path / "a" / "s.yaml"), str(tmp_path / "b" / "s.yaml")]
                + args + [str(tmp_path / "c1")]) == 0
    (tmp_path / "b" / "t.csv").write_text("t,p,o\n0,50,40\n")   # another trace there
    # b's own sim settings are not used either: every plan is measured as a is
    (tmp_path / "b" / "s.yaml").write_text(text.format(name="two", step=0.02)
                                           + "sim: {warmup_requests: 2}\n")
    capsys.readouterr()
    a_yaml, b_yaml = str(tmp_path / "a" / "s.yaml"), str(tmp_path / "b" / "s.yaml")
    assert main(["compare", a_yaml, b_yaml] + args + [str(tmp_path / "c2")]) == 0
    # the same text names another file: b's trace is said to be ignored, by its path (two
    # files named s.yaml)
    err = capsys.readouterr().err.splitlines()
    # (run's warning that the p99s rest on the trace's 5 requests, once for every plan)
    assert err[0].startswith("servesim: warning: every plan: the p99 figures rest on 5 ")
    assert err[1:] == [
        f"servesim: note: workload, SLO and sim settings of {a_yaml} used for every plan; "
        f"those of {b_yaml} are ignored"]
    rows = (tmp_path / "c2" / "compare.csv").read_text()
    assert (tmp_path / "c1" / "compare.csv").read_text() == rows
    # both serve a.csv's 3-token answers, one request at a time: E2EL = 3 steps of each
    # plan (b's trace, 40 tokens out, would give 800 ms for plan two)
    assert "E2EL p50 (ms),30.0,60.0" in rows.splitlines()
    # a later plan's file may leave out workload, SLO and sim: it serves the first's (its
    # trace read beside the first file), without a note that anything was ignored
    (tmp_path / "b" / "s.yaml").write_text(text.format(name="two", step=0.02)
                                           .split("workload:")[0])
    assert main(["compare", a_yaml, b_yaml] + args + [str(tmp_path / "c3")]) == 0
    assert "ignored" not in capsys.readouterr().err
    assert (tmp_path / "c3" / "compare.csv").read_text() == rows

def test_compare_with_replications_shows_the_mean_beside_its_interval(tmp_path, capsys):
    # the mean is shown beside its 95% CI, not replication 0's figure (it can lie outside)
    import csv
    import json

    text = """name: {name}
model: llama-test
hardware: {{step_time: {{constant_s: {step}}}}}
engine: {{max_num_seqs: 4, max_model_len: 512}}
workload:
  num_requests: 40
  arrival: {{process: poisson, rate: 30}}
  prompt_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: 5}}
slo: {{ttft_ms: {{p99: 150}}}}
sim: {{replications: 3}}
"""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(text.format(name="fast", step=0.01))
    b.write_text(text.format(name="slow", step=0.03))
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--executor", "serial", "--quiet", "--out",
                 str(out)]) == 0
    shown = capsys.readouterr().out
    assert "(means over 3 replications)" in shown
    # "SLO met: no" beside means that meet the SLO is explained, not left to read as a
    # contradiction
    assert ("SLO met: yes only where every one of the 3 replications met every SLO (the "
            "figures are their means)") in shown
    # the three runs of plan "fast", one by one, as servesim run --replications writes them
    assert main(["run", str(a), "--quiet", "--out", str(tmp_path / "r")]) == 0
    reps = json.loads((tmp_path / "r" / "replications.json").read_text())
    with open(out / "compare.csv") as f:
        rows = {r["figure"]: r for r in csv.DictReader(f)}
    ttft = rows["TTFT p99 (ms)"]
    assert float(ttft["fast"]) == pytest.approx(reps["ttft_ms"]["p99"]["mean"])
    lo, hi = reps["ttft_ms"]["p99"]["ci95"]
    assert (float(ttft["fast ci95 lo"]), float(ttft["fast ci95 hi"])) == pytest.approx((lo, hi))
    assert lo <= float(ttft["fast"]) <= hi
    md = (out / "report.md").read_text()
    assert "shows the mean over them" in md
    assert rows["SLO met"]["slow"] in ("True", "False")

# A compare plan: 5-token answers at 7 req/s, one token per step of ``step`` seconds.
COMPARE_PLAN = """name: {name}
model: llama-test
hardware: {{step_time: {{constant_s: {step}}}}}
engine: {{max_num_seqs: {seqs}, max_model_len: 512}}
workload:
  num_requests: {n}
  arrival: {{process: poisson, rate: 7}}
  prompt_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: 5}}
"""

def test_compare_prints_a_formatted_table_and_needs_two_scenarios(tmp_path, capsys):
    import re

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    # no SLO: goodput, SLO met unknown
    a.write_text(COMPARE_PLAN.format(name="fast", step=0.01, seqs=4, n=60))
    b.write_text(COMPARE_PLAN.format(name="slow", step=0.03, seqs=4, n=60))
    args = ["--executor", "serial", "--quiet", "--out", str(tmp_path / "cmp")]
    assert main(["compare", str(a), str(b)] + args) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "True" not in out and "nan" not in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["fast"], ["slow"])}
    # one token per engine step: TPOT is the step time, 10 and 30 ms
    assert rows["fast"][2] == "10" and rows["slow"][2] == "30"
    for r in rows.values():
        assert all(re.fullmatch(r"\d+(\.\d+)?", c) and len(c.replace(".", "")) <= 3
                   for c in r[1:4])                      # 3 significant figures
        assert r[4:6] == ["-", "-"]                      # goodput, SLO met: no SLO given
        assert r[6] == "stable"       # no rejected column: no plan rejects (compare.csv has it)
    head = out[:out.index("─")].split()
    assert "rejected" not in head and "cut" not in head
    assert max(len(line) for line in out[:out.index("binding (rules):")].splitlines()) <= 80
    csv = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert any(line.startswith("rejected requests,0,0") for line in csv)
    # the binding limit of each plan, as the terminal and report.md give it
    binding = next(line for line in csv if line.startswith("binding limit,"))
    # (before the GPUs column: no price here, so the last)
    assert binding.split(",")[1:] == [rows["fast"][-2], rows["slow"][-2]]
    assert rows["fast"][-1] == rows["slow"][-1] == "1"   # 1 replica × tensor_parallel 1
    assert main(["compare", str(a)] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"servesim: error: compare needs two or more scenario files, got 1 ({a}); "
                   "to simulate one scenario use servesim run"]
    # the same plan twice (or two plans of one name) would share one column of compare.csv
    assert main(["compare", str(a), str(tmp_path / "." / "a.yaml")] + args) == 2
    assert capsys.readouterr().err.strip() == (
        f"servesim: error: {tmp_path / '.' / 'a.yaml'} is given twice; compare takes each "
        "plan's file once")
    twin = tmp_path / "twin.yaml"
    twin.write_text(a.read_text())
    assert main(["compare", str(a), str(twin)] + args) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: twin.yaml:1: name: 'fast' is also the name of a.yaml; give each "
        "plan a distinct name")


def test_terminal_plan_table_fits_80_columns_and_spells_out_long_statuses(capsys, monkeypatch):
    import pandas as pd

    from simulator.planner_cli import _print_table

    monkeypatch.setenv("COLUMNS", "80")
    df = pd.DataFrame([
        {"hardware.profile": "a100-80gb", "hardware.tensor_parallel": 2,
         "engine.max_num_seqs": 256, "max_rate_per_replica": 8.31312, "replicas": 5,
         "cost_per_hour": 17.9, "cost_per_hour_ci95": [17.93, 25.14], "ttft_p99_ms": 636.26,
         "status": "cheapest feasible"},
        {"hardware.profile": "l4", "hardware.tensor_parallel": 1,
         "engine.max_num_seqs": 64, "max_rate_per_replica": float("nan"), "replicas": None,
         "cost_per_hour": None, "cost_per_hour_ci95": None, "ttft_p99_ms": None,
         "status": "model does not fit: 16.1 GB of weights on a 24 GB GPU leaves no KV room"},
    ])
    _print_table(df, "Plans", list(df.columns))
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    # costs to the cent: 17.93 and 17.9 must not read alike
    assert "8.31" in out and "17.90" in out and "17.93–25.14" in out and "cheapest" in out \
        and "note 1" in out
    assert "note 1: model does not fit: 16.1 GB of weights" in out.replace("\n", " ")


@pytest.mark.parametrize("command", [["sweep", "--set", "workload.arrival.rate=1,2"], ["plan"],
                                     ["compare", "SECOND"]])
def test_an_out_folder_under_a_file_is_refused_before_any_run(tmp_path, capsys, monkeypatch,
                                                                 command):
    import simulator.executors as executors

    y = tmp_path / "s.yaml"
    y.write_text("""name: s
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
workload:
  num_requests: 10
  arrival: {process: poisson, rate: 1}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 4}
plan: {target_rate: 3, candidates: {engine.max_num_seqs: [2]}}
""")
    y2 = tmp_path / "s2.yaml"
    y2.write_text(y.read_text().replace("name: s\n", "name: s2\n"))
    (tmp_path / "f").write_text("")

    def no_runs(*a, **kw):
        raise AssertionError("ran before checking --out")
    monkeypatch.setattr(executors.SerialExecutor, "run", no_runs)
    cmd = [command[0], str(y)] + [str(y2) if c == "SECOND" else c for c in command[1:]]
    assert main(cmd + ["--out", str(tmp_path / "f" / "x"), "--executor", "serial",
                       "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"servesim: error: --out {tmp_path / 'f' / 'x'}: {tmp_path / 'f'} is a file, not a "
        f"folder")


def test_terminal_tables_fit_80_columns_without_exponents_or_lost_cells(monkeypatch):
    import io

    import pandas as pd
    from rich.console import Console

    from simulator.planner_cli import _print_table

    # a plan whose CIs are undefined or one-sided, big numbers, a long swept key
    df = pd.DataFrame([
        {"engine.max_num_batched_tokens": 16384, "max_rate_per_replica": 13.1143,
         "max_rate_ci95": [11.64, None], "replicas": 4, "cost_per_hour": 11.96,
         "cost_per_hour_ci95": [None, 11.96], "ttft_p99_ms": 12345.6,
         "ttft_p99_ci95": [-3.5, 1380.46], "status": "feasible"},
        {"engine.max_num_batched_tokens": 2048, "max_rate_per_replica": 1234.5,
         "max_rate_ci95": None, "replicas": 1, "cost_per_hour": 2.99,
         "cost_per_hour_ci95": None, "ttft_p99_ms": 0.5, "ttft_p99_ci95": None,
         "status": "cheapest feasible"},
    ])
    buf = io.StringIO()
    _print_table(df, "Plans", list(df.columns),
                 console=Console(file=buf, width=80, color_system=None))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out and "e+" not in out
    first, second = (line.split() for line in out.splitlines()
                     if line.split()[:1] in (["16,384"], ["2,048"]))
    assert first == ["16,384", "13.1", "≥11.6", "4", "11.96", "≤11.96", "12346", "-3.5–1380",
                     "ok"]
    assert second == ["2,048", "1234", "–", "1", "2.99", "–", "0.5", "–", "cheapest"]
    assert "– in a 95% CI column: no interval" in out
    assert "only one end of the 95% CI is known" in out.replace("\n", " ")
    head = out[:out.index("─")]
    assert all(w in head.split() for w in ("max", "batched", "tokens"))


@pytest.mark.parametrize("values, said", [
    ("4,4", "4 is given twice"), ("2,4,4.0", "4.0 is given twice (as 4: one value)"),
    ("1,2,1", "1 is given twice"), ("1,true,yes", "yes is given twice (as true: one value)")])
def test_a_value_repeated_in_a_sweep_list_is_refused_before_any_point_runs(
        tmp_path, capsys, values, said):
    # the same point twice is refused, not two identical rows; 4 and 4.0 are one rate
    y = tmp_path / "s.yaml"
    y.write_text(small_scenario("s", 20))
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", f"workload.arrival.rate={values}", "--executor",
                 "serial", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"servesim: error: --set workload.arrival.rate={values}: {said}; each value is one "
        f"sweep point, give it once"]
    assert not out.exists()


def test_a_sweep_or_plan_past_ten_thousand_points_is_refused_before_any_runs(tmp_path,
                                                                             capsys):
    # 200 × 51 = 10,200 points: hours of simulation (a typed range), refused at once
    y = tmp_path / "s.yaml"
    y.write_text(small_scenario("s", 20))
    out = tmp_path / "sw"
    rates = ",".join(str(r) for r in range(1, 201))
    seqs = ",".join(str(n) for n in range(4, 55))
    assert main(["sweep", str(y), "--set", f"workload.arrival.rate={rates}", "--set",
                 f"engine.max_num_seqs={seqs}", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "servesim: error: --set: the swept values make 10,200 points (200 × 51 values); at "
        "most 10,000 in one run: split it"]
    assert not out.exists()
    y.write_text(small_scenario("s", 20) + "plan:\n  target_rate: 1\n  candidates:\n"
                 f"    engine.max_num_seqs: [{seqs}]\n    engine.block_size: [8, 16]\n"
                 f"    engine.max_num_batched_tokens: [{','.join(map(str, range(64, 164)))}]\n")
    with pytest.raises(InputError, match=r"^s\.yaml:\d+: plan\.candidates: the candidates "
                                         r"make 10,200 points \(51 × 2 × 100 values\)"):
        expand_candidates(load_scenario(y))


@pytest.mark.parametrize("flags, message", [
    (["--ray-address", "127.0.0.1:1"],
     "--ray-address: only with --executor ray (this run's executor: local)"),
    (["--executor", "serial", "--workers", "2"],
     "--workers: only with --executor local (this run's executor: serial)"),
])
def test_an_executor_flag_the_executor_would_ignore_is_refused(tmp_path, capsys, flags,
                                                               message):
    _refused_flags(tmp_path, capsys, flags, message)


@pytest.mark.parametrize("workers", ["0", "1025", "1000000"])
def test_a_worker_count_past_its_bounds_is_refused(tmp_path, capsys, workers):
    _refused_flags(tmp_path, capsys, ["--workers", workers],
                   f"--workers: 1 to 1024 processes, got {workers}")


def _refused_flags(tmp_path, capsys, flags, message):
    y = tmp_path / "s.yaml"
    y.write_text(small_scenario("s", 20))
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=4,8", *flags, "--out",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"servesim: error: {message}"]
    assert not out.exists()


def test_a_quoted_number_in_a_sweep_list_is_refused_before_any_point_runs(tmp_path, capsys):
    y = tmp_path / "s.yaml"
    y.write_text(small_scenario("s", 20))
    out = tmp_path / "sw"
    # the string "4" is not the number 4 (as for a single --set value)
    assert main(["sweep", str(y), "--set", 'workload.arrival.rate=2,"4"', "--executor",
                 "serial", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["servesim: error: --set workload.arrival.rate=\"4\": Input should be a "
                   "valid number > 0 and <= 1000000000 (got '4': quoted, a number is text; write 4, "
                   "unquoted)"]
    assert not out.exists()
    # names and numbers still travel unquoted
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=2,4", "--set",
                 "model=llama-test", "--executor", "serial", "--out", str(out)]) == 0


def test_plan_without_a_feasible_candidate_says_so_once_and_exits_1(tmp_path, capsys):
    # One token per engine step: TPOT is the step time at any load, 20 ms and 10 ms here,
    # so a 5 ms TPOT p99 SLO is out of reach for both; the 10 ms one is 2x over, the closest.
    y = tmp_path / "p.yaml"
    y.write_text("""name: p
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 100
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 4}
slo: {tpot_ms: {p99: 5}}
plan: {target_rate: 10, candidates: {hardware.step_time.constant_s: [0.02, 0.01]},
       max_replications: 2}
""")
    out = tmp_path / "pl"
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("note ")]) == 2
    # a request alone decodes at one step per token: 20 and 10 ms (rich wraps long lines)
    text = " ".join(" ".join(lines).split())
    for i, t in ((1, 20), (2, 10)):
        assert (f"note {i}: SLO not met even at low load; TPOT p99 of requests served "
                f"alone {t} ms > 5 ms: only faster steps meet it") in text
    verdict = [line for line in lines if line.startswith("no candidate")]
    assert len(verdict) == 1
    assert verdict[0].startswith("no candidate meets every SLO at 10 req/s; closest: "
                                 "constant_s=0.01, which misses at every rate tried "
                                 "(0 req/s in the table); at ")
    assert verdict[0].endswith("TPOT p99 10 ms against an SLO of 5 ms (2x the SLO)")
    assert (out / "plan.csv").is_file() and (out / "report.html").is_file()
    assert "closest: constant_s=0.01" in (out / "report.md").read_text()
    # the SLO's statistic keeps its column (empty: no candidate ran to an operating point)
    header = next(i for i, line in enumerate(lines) if "TPOT" in line.split())
    assert "TPOT" in lines[header] and "p99" in lines[header + 1]
    assert "tpot_p99_ms" in (out / "plan.csv").read_text().splitlines()[0].split(",")
    rows = strict_json(out / "plan.json")   # the missing figures are null, not NaN
    assert "NaN" not in (out / "plan.json").read_text() and rows


@pytest.mark.parametrize("candidates, want", [
    ("    engine.max_num_seqs: [64, -3]\n",
     "p.yaml:14: plan.candidates.engine.max_num_seqs.1: Input should be greater than or "
     "equal to 1 (got -3)"),
    ("    engine.max_num_seqs: [4]\n    engine.max_num_seqz: [64]\n",
     "p.yaml:15: plan.candidates.engine.max_num_seqz: unknown key; did you mean "
     "max_num_seqs? (allowed: block_size, "
     "max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, enable_prefix_caching, "
     "max_model_len, num_gpu_blocks, scheduler_reserve_full_isl, watermark, "
     "long_prefill_token_threshold, enable_chunked_prefill)"),
    # a quoted number is a string, refused as in engine: {max_num_seqs: '64'}
    # (read as 64 it would plan two identical candidates)
    ("    engine.max_num_seqs: [64, '64']\n",
     "p.yaml:14: plan.candidates.engine.max_num_seqs: Input should be a valid integer >= 1 "
     "and <= 1000000000 (got '64': quoted, a number is text; write 64, unquoted)"),
    # a key plan may not vary, at its own line: the workload, and the replica count,
    # which plan sizes itself (a candidate list of it would plan identical rows)
    ("    engine.max_num_seqs: [4]\n    workload.arrival.rate: [5, 10]\n",
     "p.yaml:15: plan.candidates.workload.arrival.rate: candidates vary hardware, model, "
     "dtype, engine or cluster keys, not the workload or the SLO"),
    ("    engine.max_num_seqs: [4]\n    cluster.replicas: [1, 2]\n",
     "p.yaml:15: plan.candidates.cluster.replicas: plan sizes the replica count of every "
     "candidate itself (up to plan.max_replicas): leave it out"),
    # one setting under two keys is refused, naming plan.candidates (not --set flags)
    ("    engine.max_num_seqs: [4, 8]\n    engine .max_num_seqs: [16]\n",
     "p.yaml:15: plan.candidates.engine .max_num_seqs: names the same key as "
     "engine.max_num_seqs; give each setting once"),
    ("    engine.max_num_seqs: [4, 8]\n    engine: [{max_num_seqs: 16}]\n",
     "p.yaml:15: plan.candidates.engine: engine and engine.max_num_seqs inside it are both "
     "candidates; give each setting once"),
    # a value given twice, or no value, at its key's line
    ("    engine.max_num_seqs: [4]\n    engine.block_size: [16, 16]\n",
     "p.yaml:15: plan.candidates.engine.block_size: 16 is given twice; each value is one "
     "candidate, give it once"),
    ("    engine.max_num_seqs: [4]\n    engine.block_size: []\n",
     "p.yaml:15: plan.candidates.engine.block_size: give at least one value"),
    # no one value is at fault: the line of plan.candidates and the combination
    ("    engine.max_num_batched_tokens: [2]\n",
     "p.yaml:13: plan.candidates (engine.max_num_batched_tokens=2): engine: "
     "max_num_batched_tokens (2) must be >= max_num_seqs (4), as vLLM requires"),
])
def test_a_bad_candidate_names_its_line_and_key_path(tmp_path, capsys, candidates, want):
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 50) + "slo: {ttft_ms: {p99: 500}}\nplan:\n"
                 "  target_rate: 10\n  candidates:\n" + candidates)
    out = tmp_path / "pl"
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"servesim: error: {want}"]
    assert not out.exists()


def test_a_candidate_list_set_by_its_dotted_key_is_that_flags_in_errors(tmp_path, capsys):
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 50) + "slo: {ttft_ms: {p99: 500}}\nplan:\n"
                 "  target_rate: 10\n  candidates:\n    engine.max_num_seqs: [2, 4]\n")
    out = tmp_path / "pl"
    flag = "plan.candidates.engine.max_num_seqs=[64, -3]"
    assert main(["plan", str(y), "--set", flag, "--executor", "serial", "--quiet", "--out",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"servesim: error: --set {flag}: plan.candidates.engine.max_num_seqs.1: Input should "
        "be greater than or equal to 1 (got -3)")
    assert not out.exists()


@pytest.mark.parametrize("where", ["flag", "file"])
def test_a_target_rate_past_1e9_is_refused(tmp_path, capsys, where):
    # as every arrival rate (timed in nanoseconds), not planned as "2.24e+10 replicas"
    y = tmp_path / "p.yaml"
    y.write_text(SMALL_PLAN.replace("target_rate: 30", "target_rate: 30" if where == "flag"
                                    else "target_rate: 1.0e12"))
    out = tmp_path / "pl"
    flags = ["--target-rate", "1e12"] if where == "flag" else []
    assert main(["plan", str(y), "--out", str(out), "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "servesim: error: --target-rate: a rate > 0 and <= 1e9 req/s (arrivals are "
        "timed in nanoseconds), got 1e+12" if where == "flag" else
        "servesim: error: p.yaml:11: plan.target_rate: Input should be less than or equal to "
        "1000000000 (got 1e+12)"]
    assert not out.exists()


def test_a_plan_without_target_rate_names_the_line_of_plan(tmp_path, capsys):
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 50) + "plan:\n  candidates: {engine.max_num_seqs: [2]}\n")
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "pl")]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: p.yaml:10: plan.target_rate: give the rate to serve (here or with "
        "--target-rate)")


def test_a_candidate_without_room_for_a_kv_cache_names_the_keys_to_change(tmp_path):
    from simulator.scenario import load_scenario

    p = tmp_path / "p.yaml"
    p.write_text("name: p\nmodel: llama-3.1-8b\nhardware: {profile: l4}\n"
                 "engine: {max_num_seqs: 4, max_model_len: 512}\n"
                 "workload: {num_requests: 2, arrival: {process: poisson, rate: 1.0},\n"
                 "  prompt_tokens: {dist: fixed, value: 4}, output_tokens: {dist: fixed, "
                 "value: 2}}\n"
                 "plan:\n  target_rate: 1\n  candidates:\n"
                 "    engine.gpu_memory_utilization: [0.3, 0.9]\n"
                 "    hardware.tensor_parallel: [1]\n")
    low, high = expand_candidates(load_scenario(p))
    assert high.error is None
    # 15 GiB of Llama-3.1-8B weights in 0.3 x 24 GB: the fix is in the keys a plan varies
    assert low.error.startswith("llama-3.1-8b in bfloat16 (15.0 GiB of weights per GPU) "
                                "leaves no room for a KV cache on l4 with tensor_parallel=1 "
                                "at gpu_memory_utilization 0.3")
    assert "raise engine.gpu_memory_utilization (to at least 0." in low.error
    assert low.error.endswith("raise hardware.tensor_parallel or choose a larger GPU "
                              "(hardware.profile)")
    # no candidate that runs: nothing to plan with, refused (exit 2) as a sweep of no point
    # that fits, not "no candidate meets every SLO" (exit 1)
    p.write_text(p.read_text().replace("[0.3, 0.9]", "[0.3, 0.35]"))
    with pytest.raises(InputError) as e:
        expand_candidates(load_scenario(p))
    assert str(e.value).startswith(
        "p.yaml:9: plan.candidates: no candidate can run (gpu_memory_utilization=0.3, "
        "tensor_parallel=1: llama-3.1-8b in bfloat16 (15.0 GiB of weights per GPU) leaves no "
        "room for a KV cache on l4")
    assert str(e.value).endswith("; nor can the other candidates)")


def test_a_price_for_a_gpu_no_candidate_runs_on_names_its_key(tmp_path):
    from simulator.catalog import list_hardware
    from simulator.scenario import load_scenario

    p = tmp_path / "p.yaml"
    p.write_text(small_scenario("p", 2) + "plan:\n  target_rate: 1\n"
                 "  prices: {h100-sxm: 2.0, l4: 0.5, h100: 1.5}\n"
                 "  candidates: {engine.max_num_seqs: [4]}\n")
    with pytest.raises(InputError) as e:   # a misspelt name is refused
        expand_candidates(load_scenario(p))
    assert str(e.value) == (f"p.yaml:12: plan.prices.h100: 'h100' is neither a catalog GPU "
                            f"({', '.join(list_hardware())}) nor a profile a candidate runs "
                            f"on (hardware.profile: h100-sxm)")
    # a catalog GPU no candidate uses is allowed (one price table for several plans)
    p.write_text(p.read_text().replace(", h100: 1.5", ""))
    (c,) = expand_candidates(load_scenario(p))
    assert c.price_per_replica_hour == 2.0


def test_one_price_for_candidates_on_several_gpus_is_refused(tmp_path, capsys):
    # an H100 price applied to an L4 too would rank the GPUs by speed alone
    p = tmp_path / "p.yaml"
    p.write_text(small_scenario("p", 50).replace("{profile: h100-sxm}",
                                                 "{profile: h100-sxm, price_per_gpu_hour: 2.2}")
                 + "plan:\n  target_rate: 1\n  candidates: {hardware.profile: [h100-sxm, l4]}\n")
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: p.yaml:3: hardware.price_per_gpu_hour: one price for every GPU the "
        "candidates try (h100-sxm, l4): give each its price in plan.prices (e.g. "
        "plan.prices: {h100-sxm: 2.2}), or leave it out for the catalog's\n")
    assert not (tmp_path / "o").exists()
    # one GPU, or a price per candidate: the scenario's price is what it says
    p.write_text(p.read_text().replace("[h100-sxm, l4]", "[h100-sxm]"))
    (c,) = expand_candidates(load_scenario(p))
    assert c.price_per_replica_hour == 2.2


def test_a_target_beyond_max_replicas_is_no_plan_and_is_not_simulated():
    # One replica serves at most 25 req/s (max_num_seqs 2, 8 tokens of 10 ms): 1e6 req/s
    # needs tens of thousands of replicas, past plan.max_replicas (64); the deployment is
    # not simulated (it would not fit in memory) and the table says what it would need.
    from simulator.planner import closest_miss, closest_text
    cfg = {"target_rate": 1e6, "max_replications": 2}
    sc = scenario(out=8, n=500, slo={"ttft_ms": {"p99": 150}}, engine={"max_num_seqs": 2},
                  plan_cfg=cfg, price=2.0)
    with make_executor("serial") as ex:
        res = plan(sc, ex)
    row = res.rows[0]
    need = replicas_needed(1e6, row.search.max_rate)
    assert need > 64 and row.beyond_max_replicas == need
    assert res.best is None and row.replicas is None and row.confirmation == []
    assert list(plan_table(res)["status"]) == [f"needs {need:,} replicas (> plan.max_replicas)"]
    from simulator.report import fmt_number
    assert closest_text(closest_miss(res), 64) == (
        f"closest: scenario as given meets every SLO on one replica up to "
        f"{fmt_number(row.search.max_rate, 3)} req/s, but 1e+06 req/s needs about "
        f"{need:,} replicas, more than plan.max_replicas (64)")


def test_replica_counts_in_statuses_are_grouped_or_in_three_figures():
    from simulator.planner import _count
    # past a float's range too: a target near 1e308 req/s over < 1 req/s per replica
    assert [_count(n) for n in (7, 1234, 999_999_999, 10**9, 31415926535, 10**306 * 965,
                                10**400)] \
        == ["7", "1,234", "999,999,999", "1.00e+9", "3.14e+10", "9.65e+308", "1.00e+400"]


@pytest.mark.parametrize("n_seqs", [4, 64])
def test_a_sweep_plot_of_many_lines_keeps_its_axes(n_seqs):
    # 64 lines: the legend is capped, so constrained layout keeps the axes' size (a
    # 128-entry legend taller than the figure would collapse them to zero)
    import warnings

    import pandas as pd

    from simulator.planner_report import plot_sweep
    from simulator.sweep import SweepResult

    rates, seqs = [1.0, 2.0, 3.0], list(range(1, n_seqs + 1))
    table = pd.DataFrame([{"workload.arrival.rate": r, "engine.max_num_seqs": s,
                           "request_throughput": r, "ttft_p50_ms": 10 + r,
                           "ttft_p99_ms": 20 + r, "tpot_p50_ms": 5 + s, "tpot_p99_ms": 8 + s,
                           "stability": "stable"}
                          for s in seqs for r in rates])
    result = SweepResult({"workload.arrival.rate": rates, "engine.max_num_seqs": seqs},
                         table, [], [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png = plot_sweep(result)
    assert png.startswith(b"\x89PNG")


def test_plan_refuses_too_few_requests_to_judge_a_rate(tmp_path, capsys):
    # 10 requests per run plan 0.76 req/s per H100 for chat, 30 give 5.3, 100 give 17.5
    # and 400 give 11.8: a handful never fills the queue, so a plan from it is no plan
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("num_requests: 200", "num_requests: 60")
                 + "sim: {warmup_requests: 10}\n")
    args = ["--executor", "serial", "--quiet", "--no-confirm"]
    assert main(["plan", str(y), "--out", str(tmp_path / "a")] + args) == 2
    line = y.read_text().splitlines().index("  num_requests: 60") + 1
    assert capsys.readouterr().err == (
        f"servesim: error: s.yaml:{line}: workload.num_requests: plan judges each rate it "
        "tries from 50 requests (60 less sim.warmup_requests 10); a maximum rate needs at "
        "least 100, and a few hundred give steadier figures\n")
    assert not (tmp_path / "a").exists()
    y.write_text(SMALL_PLAN)   # 200 requests: planned, no note
    assert main(["plan", str(y), "--out", str(tmp_path / "b")] + args) == 0
    assert "note" not in capsys.readouterr().err


def test_plan_without_slos_sizes_for_keeping_up_and_says_so(tmp_path, capsys):
    # a throughput plan (a batch job): a candidate's max rate is its stability limit. Each
    # request holds a slot 4 steps of 10 ms (prefill + first token, then 3 decodes), so a
    # slot serves 25 req/s: 50 req/s at max_num_seqs=2, 100 at 4; "keeps up" stops short of it
    import csv
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}\n", ""))
    assert main(["plan", str(y), "--out", str(tmp_path / "a"), "--executor", "serial",
                 "--quiet", "--no-confirm"]) == 0
    assert ("servesim: note: the scenario sets no SLOs, so a candidate's max rate per "
            "replica is the highest it keeps up with") in capsys.readouterr().err
    assert ("Cheapest plan keeping up with 30 req/s (the scenario sets no SLOs: a replica's "
            "max rate is the highest it keeps up with): **max_num_seqs=4**") in (
        tmp_path / "a" / "report.md").read_text()
    with open(tmp_path / "a" / "plan.csv", newline="") as f:
        rates = {int(r["engine.max_num_seqs"]): float(r["max_rate_per_replica"])
                 for r in csv.DictReader(f)}
    for seqs, capacity in ((2, 50.0), (4, 100.0)):
        assert 0.8 * capacity < rates[seqs] <= capacity
    y.write_text(SMALL_PLAN)   # with an SLO: no note
    main(["plan", str(y), "--out", str(tmp_path / "b"), "--executor", "serial", "--quiet",
          "--no-confirm"])
    assert "no SLOs" not in capsys.readouterr().err


def test_plan_says_when_a_pooled_deployment_beats_replicas_times_the_max_rate(tmp_path,
                                                                             capsys):
    # M/D/1 per replica: 100 ms of service (10 steps of 10 ms), SLO mean TTFT 60 ms = the
    # first step + Pollaczek-Khinchine's wait rho*S/(2(1-rho)), met up to rho = 0.5: 5 req/s.
    # 23 req/s then reads as 5 replicas; 2 cannot keep up (11.5 req/s each, 10 at most), and
    # least_outstanding pools 3 (mean TTFT ~54 ms): "3 replicas" beside "5 req/s" needs words
    import csv
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("max_num_seqs: 4, max_model_len: 512}",
                                    "max_num_seqs: 1, max_model_len: 512}\n"
                                    "cluster: {router: least_outstanding}")
                 .replace("num_requests: 200", "num_requests: 1000")
                 .replace("value: 8}", "value: 100}").replace("value: 4}", "value: 10}")
                 .replace("{ttft_ms: {p99: 200}}", "{ttft_ms: {mean: 60}}")
                 .split("plan:")[0])
    assert main(["plan", str(y), "--target-rate", "23", "--out", str(tmp_path / "a"),
                 "--executor", "serial", "--quiet"]) == 0
    with open(tmp_path / "a" / "plan.csv", newline="") as f:
        row = next(csv.DictReader(f))
    rate = float(row["max_rate_per_replica"])
    assert 4.5 < rate <= 5.0 and (row["replicas"], row["confirmed"]) == ("3", "True")
    assert (f"as simulated, 3 replicas of scenario as given serve 23 req/s, above 3 × its max "
            f"rate per replica ({3 * rate:.3g} req/s): a router pools the replicas"
            ) in capsys.readouterr().out


def test_sweep_says_when_too_few_requests_judge_a_point(tmp_path, capsys):
    # a handful of requests never fills a queue: said of a sweep as of a plan (10 requests
    # on 8 replicas read "unstable": the run says why)
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    args = ["--executor", "serial", "--quiet"]
    main(["sweep", str(y), "--set", "workload.num_requests=200,60", "--set",
          "sim.warmup_requests=10", "--out", str(tmp_path / "a")] + args)
    assert ("servesim: note: each point is judged from 50 requests (workload.num_requests "
            "less sim.warmup_requests); whether a rate keeps up needs at least 100") \
        in capsys.readouterr().err
    main(["sweep", str(y), "--set", "cluster.replicas=1,2", "--out", str(tmp_path / "b")]
         + args)
    assert "note" not in capsys.readouterr().err


def test_sweep_csv_gives_each_interval_as_two_numbers(tmp_path):
    # as plan.csv does; a "[lo, hi]" text cell read back as a string
    import json

    import pandas as pd

    y = tmp_path / "k.yaml"
    y.write_text(SMALL_PLAN.split("slo:")[0] + "sim: {replications: 2}\n")
    out = tmp_path / "sw"
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=5,10", "--out", str(out),
                 "--executor", "serial", "--quiet"]) == 0
    t = pd.read_csv(out / "sweep.csv")
    assert "ttft_p99_ci95" not in t and t["ttft_p99_ci95_lo"].dtype.kind == "f"
    points = json.loads((out / "sweep.json").read_text())["points"]
    for row, p in zip(t.itertuples(), points):
        assert [row.ttft_p99_ci95_lo, row.ttft_p99_ci95_hi] == pytest.approx(p["ttft_p99_ci95"])
        assert row.ttft_p99_ci95_lo <= row.ttft_p99_ms <= row.ttft_p99_ci95_hi


def test_a_candidate_that_could_be_cheaper_is_tried_at_fewer_replicas():
    # plan_chat at TTFT p99 <= 100 ms: both H100 TP2 candidates are estimated at 6
    # replicas; the one with the higher max rate per replica (the more capacity at equal
    # cost) is confirmed first: behind the router it confirms at 3 (17.94 USD/h at 5.98 a
    # replica), and the other, whose cost CI reaches below that, is tried at the most
    # replicas that would still be cheaper, ceil(17.94 / 5.98) - 1 = 2: it misses there, so
    # it cannot beat the first; it keeps its estimate, unconfirmed, its CI starting at 3.
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scenarios" / "plan_chat.yaml"
    sc = load_scenario(path, ["slo.ttft_ms.p99=100", "plan.candidates={hardware.tensor_parallel:"
                              " [2], engine.max_num_seqs: [64, 256]}"])
    with make_executor("serial") as ex:
        res = plan(sc, ex)
    first, second = sorted(res.rows, key=lambda r: -r.search.max_rate)
    assert res.best is first and first.confirmed and first.replicas == 3
    from simulator.catalog import load_hardware
    tp2 = 2 * load_hardware(sc.hardware.profile).price_per_gpu_hour   # one replica: 2 GPUs
    assert first.costs["cost_per_hour"] == pytest.approx(3 * tp2)
    assert second.costs_ci95["cost_per_hour"][0] is not None
    assert not second.confirmed
    assert [(c["replicas"], c["feasible"]) for c in second.confirmation] == [(2, False)]
    assert second.replicas_ci95[0] == 3 and second.replicas >= 3


def test_a_tie_on_cost_goes_to_the_most_capacity_and_is_said(tmp_path, capsys):
    # max_num_seqs 8 or 16: one replica each at 20 req/s, 1 USD/h; a request is 4 steps of
    # 10 ms (prefill + 3 decodes), so a replica serves about max_num_seqs / 0.04 s: twice
    # the rate with 16 slots, the headroom that breaks the tie
    import csv
    y = tmp_path / "t.yaml"
    y.write_text(SMALL_PLAN.replace("candidates: {engine.max_num_seqs: [2, 4]}",
                                    "candidates: {engine.max_num_seqs: [8, 16]}")
                 .replace("target_rate: 30", "target_rate: 20"))
    assert main(["plan", str(y), "--out", str(tmp_path / "p"), "--executor", "serial",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())
    # the plan's count was simulated as a deployment; the other's is one replica's estimate
    assert [line.split()[2] for line in out.splitlines()
            if line.split()[:1] in (["8"], ["16"])] == ["≈1", "1"]
    assert ("cheapest feasible: max_num_seqs=16, 1 replica(s), 1.00 USD/h (as cheap: "
            "max_num_seqs=8; the most capacity, replicas × max rate per replica, then the "
            "fewest replicas, is chosen)") in said
    with open(tmp_path / "p" / "plan.csv", newline="") as f:
        rate = [float(r["max_rate_per_replica"]) for r in csv.DictReader(f)]
    assert 1.8 < rate[1] / rate[0] < 2.2 and rate[0] < 8 / 0.04


def test_a_deployment_that_refutes_its_estimate_keeps_an_ordered_interval():
    # estimated at 2 replicas [2, 2] (8 req/s each at 16), its deployment missed at 2:
    # it needs 3 or more, the interval [3, open], and the 2-replica operating point goes
    from simulator.planner import Candidate, PlanRow, _needs_more_than

    row = PlanRow(Candidate({}, price_per_replica_hour=2.0), replicas=2,
                  replicas_ci95=(2, 2), operating={"ttft_ms": {"p99": {"mean": 150.0}}},
                  mean_output_tokens=100.0)
    _needs_more_than(row, 2, 16.0)
    assert (row.replicas, row.replicas_ci95, row.operating) == (3, (3, None), None)
    assert row.costs["cost_per_hour"] == 6.0
    assert row.costs_ci95["cost_per_hour"] == [6.0, None]
    # 3 is a lower bound, not an estimate shown to meet the SLOs: the row says so
    from simulator.planner import PlanResult
    from simulator.search import SearchResult
    assert row.refuted == 2
    row.search = SearchResult(8.0, (8.0, 8.1), (7.9, 8.2), None, [], None)
    best = PlanRow(Candidate({}, price_per_replica_hour=2.0), search=row.search, replicas=3,
                   confirmed=True)
    status = plan_table(PlanResult(16.0, [row, best], best))["status"].tolist()
    assert status == ["needs more than 2 replicas (a deployment of 2 missed the SLOs; more "
                      "would cost as much as the plan: not simulated)", "cheapest feasible"]
    # an estimate above the count tried stands, its interval starting just past it (the
    # estimate's own lower end, one replica's, does not bound a pooled deployment)
    row = PlanRow(Candidate({}, price_per_replica_hour=2.0), replicas=8,
                  replicas_ci95=(7, 9), operating={}, mean_output_tokens=100.0)
    _needs_more_than(row, 2, 16.0)
    assert (row.replicas, row.replicas_ci95, row.operating) == (8, (3, 9), {})
    assert row.refuted is None


def test_the_closest_deployment_says_when_its_backlog_grew():
    # a deployment whose stable runs met the SLOs (0.73x) but one run's backlog grew: the
    # ratio alone would read as a pass
    from simulator.planner import Candidate, PlanResult, PlanRow, closest_miss, closest_text
    from simulator.search import SearchResult

    row = PlanRow(Candidate({"hardware.profile": "h100-sxm"}),
                  search=SearchResult(max_rate=11.0, bracket=(11.0, 11.2), ci95=(10.0, 12.0),
                                      evaluations=[], at_max=None, capacity=None),
                  confirmation=[{"replicas": 2, "feasible": False, "confident": True,
                                 "unstable": True, "mean_ratio": 0.732, "ci95": None}])
    miss = closest_miss(PlanResult(16.0, [row], None))
    assert closest_text(miss, 2) == (
        "closest: profile=h100-sxm meets every SLO on one replica, but no deployment of up "
        "to 2 replicas did at 16 req/s (best: 2 replicas, worst SLO at 0.732x its threshold "
        "in its stable runs; a run's backlog grew)")


def test_a_target_below_what_one_replica_meets_that_no_count_meets_says_load_fell():
    # one replica met the SLOs at 3.24 req/s, yet 0.5 req/s missed on every count up to the
    # cap (a wake-up after idle: lighter loads are slower): "needs about 65 replicas" would
    # be wrong, more replicas are the problem
    from simulator.planner import Candidate, PlanResult, PlanRow, closest_miss, closest_text
    from simulator.search import SearchResult

    row = PlanRow(Candidate({}), search=SearchResult(
        max_rate=3.24, bracket=(3.24, 3.3), ci95=(3.0, 3.5), evaluations=[], at_max=None,
        capacity=None), replicas=65)
    row.beyond_max_replicas = 65
    miss = closest_miss(PlanResult(0.5, [row], None))
    text = closest_text(miss, 64)
    assert text.startswith("closest: scenario as given meets every SLO on one replica at "
                           "3.24 req/s, but no deployment of up to 64 replicas did at 0.5 "
                           "req/s: its latency rises as the load per replica falls")
    assert "needs about" not in text
    from simulator.planner import _beyond_text
    assert _beyond_text(row, 0.5) == ("misses at every count up to plan.max_replicas (64) "
                                      "although one replica meets the SLOs at 3.24 req/s: "
                                      "latency rises as load falls")
    assert _beyond_text(row, 5.0) == "needs 65 replicas (> plan.max_replicas)"


def test_the_plan_table_shows_the_statistics_the_slos_name(tmp_path, capsys):
    # an E2EL p99 SLO: the table, plan.csv and the terminal carry E2EL p99 (the mean over
    # the operating point's replications of the SLO's own value)
    import csv
    y = tmp_path / "t.yaml"
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}",
                                    "slo: {e2el_ms: {p99: 300}, ttft_ms: {p50: 200}}"))
    assert main(["plan", str(y), "--out", str(tmp_path / "p"), "--executor", "serial",
                 "--quiet"]) == 0
    head = capsys.readouterr().out.split("─")[0]
    assert "E2EL" in head and "TTFT" in head and "p50" in head
    with open(tmp_path / "p" / "plan.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cols = list(rows[0])
    assert cols.index("e2el_p99_ms") < cols.index("cost_kind")
    assert {"ttft_p50_ms", "ttft_p50_ci95_lo", "e2el_p99_ci95_hi"} <= set(cols)
    best = next(r for r in rows if r["status"] == "cheapest feasible")
    # 4 output tokens at 10 ms a step: E2EL at least 40 ms, within the 300 ms SLO
    assert 40 <= float(best["e2el_p99_ms"]) <= 300


@pytest.mark.parametrize("args, said", [
    # a --set value the candidates replace would be ignored unseen
    (["plan", "--set", "engine.max_num_seqs=8"],
     "--set engine.max_num_seqs=8: plan.candidates gives engine.max_num_seqs its values, which "
     "replace this one in every candidate; change plan.candidates.engine.max_num_seqs instead"),
    # a target so low that the operating point's arrivals outrun what a run holds
    (["plan", "--target-rate", "1e-9"],
     "--target-rate: 1e-09 req/s spreads 200 arrivals over more than the 4.6e9 s a run can "
     "hold"),
    # a scenario price and plan.prices for the same GPU: one would be dropped unseen
    (["plan", "--set", "hardware.price_per_gpu_hour=2", "--set", "plan.prices={h100-sxm: 3}",
      "--set", "hardware.profile=h100-sxm", "--set", "hardware.step_time=null"],
     "--set hardware.price_per_gpu_hour=2: 2 and plan.prices.h100-sxm (3) both price "
     "h100-sxm: give one"),
    # every point of a sweep over the plan: section is one run
    (["sweep", "--set", "plan.target_rate=10,20"],
     "--set plan.target_rate=10,20: the plan: section changes only what servesim plan does; "
     "every point of a sweep would be the same run"),
    (["sweep", "--set", "name=a,b"],
     "--set name=a,b: the name only labels the run and its folder; every point of a sweep "
     "would be the same run"),
])
def test_plan_and_sweep_settings_that_would_be_ignored_are_refused(tmp_path, capsys, args,
                                                                   said):
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN)
    cmd, *rest = args
    assert main([cmd, str(y), *rest, "--out", str(tmp_path / "o"), "--executor", "serial",
                 "--quiet"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {said}\n"
    assert not (tmp_path / "o").exists()


def test_an_unconfirmed_plan_says_so_and_its_files_round_costs(tmp_path, capsys):
    # --no-confirm: the replica count is one replica's estimate. At 100 req/s max_num_seqs
    # 2 (about 40 req/s a replica) needs 3 replicas: 3 x 3.6 USD/h is 10.8 in plan.csv, not
    # 10.799999999999999
    import csv
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("price_per_gpu_hour: 1.0", "price_per_gpu_hour: 3.6")
                 .replace("target_rate: 30", "target_rate: 100"))
    assert main(["plan", str(y), "--out", str(tmp_path / "p"), "--executor", "serial",
                 "--quiet", "--no-confirm"]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())
    assert "replica(s) (estimated from one replica's max rate: not simulated as a " \
           "deployment)" in said
    # the table marks each estimate (csv: confirmed empty) apart from a confirmed count
    assert [line.split()[2] for line in out.splitlines()
            if line.split()[:1] in (["2"], ["4"])] == ["≈3", "≈2"]
    assert "≈ replicas: estimated from one replica's max rate" in said
    with open(tmp_path / "p" / "plan.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["replicas"], r["cost_per_hour"]) for r in rows][0] == ("3", "10.8")


def test_compare_says_which_plan_cannot_keep_up(tmp_path, capsys):
    # 7 req/s of 5-token answers: 4 slots of 10 ms steps serve 80 req/s; 1 slot of 50 ms
    # steps serves 1 / 0.25 s = 4 req/s, so its backlog grows the whole run
    import csv
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(COMPARE_PLAN.format(name="fast", step=0.01, seqs=4, n=200))
    b.write_text(COMPARE_PLAN.format(name="tiny", step=0.05, seqs=1, n=200))
    assert main(["compare", str(a), str(b), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "cmp")]) == 0
    got = capsys.readouterr()
    rows = {line.split()[0]: line.split() for line in got.out.splitlines()
            if line.split()[:1] in (["fast"], ["tiny"])}
    assert "stable" in rows["fast"] and "unstable" in rows["tiny"]
    assert "plan: section" not in got.err   # no plan: section, no note of one
    with open(tmp_path / "cmp" / "compare.csv", newline="") as f:
        got = {r["figure"]: r for r in csv.DictReader(f)}
    assert (got["stability"]["fast"], got["stability"]["tiny"]) == ("stable", "unstable")
    assert "| stability | stable | unstable |" in (tmp_path / "cmp" / "report.md").read_text()


def test_sweep_plan_and_compare_warn_of_more_kv_blocks_than_the_gpu_holds(tmp_path, capsys):
    # 10**9 blocks of 16 tokens are past what an H100's memory holds: each command warns,
    # once per distinct cache (compare's two plans, max_num_batched_tokens 8192 and 4096,
    # reserve different activation memory, so their counts differ)
    y = tmp_path / "s.yaml"
    y.write_text(small_scenario("s", 100) + "slo: {ttft_ms: {p99: 500}}\n"
                 "plan: {target_rate: 5, candidates: {engine.max_num_seqs: [4]}}\n")
    z = tmp_path / "z.yaml"
    z.write_text(small_scenario("z", 60).replace(
        "max_num_seqs: 4", "max_num_seqs: 4, max_num_batched_tokens: 4096"))
    big = ["--set", "engine.num_gpu_blocks=1000000000"]
    for argv in (["sweep", str(y), "--set", "workload.arrival.rate=5,10"] + big,
                 ["plan", str(y)] + big, ["compare", str(y), str(z)] + big):
        out = tmp_path / argv[0]
        assert main(argv + ["--out", str(out), "--executor", "serial", "--quiet"]) in (0, 1)
        err = capsys.readouterr().err
        assert err.count("servesim: warning: engine.num_gpu_blocks = 1000000000") == (
            2 if argv[0] == "compare" else 1), argv
        assert "blocks that h100-sxm's memory holds" in err


def test_a_candidate_past_one_node_of_tensor_parallel_is_refused(tmp_path, capsys):
    # as run and sweep refuse it: the roofline prices the all-reduce within a node only
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 50) + "slo: {ttft_ms: {p99: 500}}\n"
                 "plan: {target_rate: 1, candidates: {hardware.tensor_parallel: [1, 16]}}\n")
    assert main(["plan", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: p.yaml:11: plan.candidates.hardware.tensor_parallel"
                          ".1: 16 GPUs span more than one node of 8") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_an_operating_point_that_misses_costs_one_more_replica(monkeypatch):
    # The search put the max rate at 10 req/s per replica, so 25 req/s needs ceil(2.5) = 3;
    # at 25 / 3 = 8.33 req/s the operating point's TPOT p99 (55 ms) misses the 50 ms SLO
    # (noise near the max rate): the row takes 4 replicas, whose operating point (6.25
    # req/s, 45 ms) meets it, so no row shows a latency over the SLO its count claims.
    from simulator import planner
    from simulator.planner import Candidate, _candidate_search
    from simulator.search import SearchResult, drive

    def fake_search(sc, **kw):
        return SearchResult(10.0, (10.0, 10.2), (9.0, 11.0), None, [], None)
        yield   # a generator that asks for no jobs

    monkeypatch.setattr(planner, "max_rate_search", fake_search)

    class Executor:
        def run(self, jobs):
            out = []
            for j in jobs:
                v = 55.0 if j.scenario.workload.arrival.rate > 7 else 45.0
                s = {"completed": 10, "total_output_tokens": 100, "tpot_ms": {"p99": v},
                     "slo": {"tpot_ms": {"p99": {"value": v, "threshold": 50.0,
                                                  "met": v <= 50.0}}}}
                out.append({"stable": True, "summary": s, "exact": s})
            return out

    kw = dict(min_replications=2, max_replications=5, tolerance=0.02)
    cand = Candidate({}, scenario(), price_per_replica_hour=2.0)
    row = drive({0: _candidate_search(cand, 25.0, kw, 64)}, Executor())[0]
    assert row.replicas == 4
    assert row.operating["tpot_ms"]["p99"]["mean"] == 45.0
    # the CI's upper end, ceil(25 / 9) = 3, is below the count the operating point needed
    assert row.replicas_ci95 == (3, 4)
    assert row.costs["cost_per_hour"] == 8.0
    # past plan.max_replicas (3 here) the row has no operating point: plan marks it
    row = drive({0: _candidate_search(cand, 25.0, kw, 3)}, Executor())[0]
    assert (row.replicas, row.operating) == (4, None)


def test_a_sweep_point_that_does_not_fit_is_a_row_and_no_point_fitting_is_refused(
        tmp_path, capsys):
    # 10 blocks of 16 tokens hold 9 for requests (block 0 is the null block): 144 tokens,
    # not one request of max_model_len 1024 (ceil(1024 / 16) = 64 blocks); 100 blocks do
    from pathlib import Path
    from simulator.sweep import DOES_NOT_FIT

    sc = scenario(n=200, engine={"num_gpu_blocks": 100})
    with make_executor("serial") as ex:
        res = sweep(sc, {"engine.num_gpu_blocks": ["10", "100"]}, ex)
    small, big = res.table.to_dict(orient="records")
    assert small["stability"] == DOES_NOT_FIT and small["request_throughput"] != \
        small["request_throughput"]   # NaN: not run
    assert small["note"].startswith("1024 tokens need 64 KV blocks of 16 but the cache "
                                    "holds 9 for requests")
    assert big["stability"] == "stable" and big["request_throughput"] > 0
    assert res.summaries[0] == [] and len(res.summaries[1]) == 1
    assert res.knees == [{"knee": 100}]
    # the CLI: a 70B model on one H100 (131 GiB of bfloat16 weights in 80 GB) beside two
    chat = Path(__file__).resolve().parents[1] / "scenarios" / "chat.yaml"
    args = ["sweep", str(chat), "--set", "model=llama-3.1-70b", "--set",
            "workload.num_requests=40", "--executor", "serial", "--quiet"]
    assert main(args + ["--set", "hardware.tensor_parallel=1,2", "--out",
                        str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "no fit (tensor_parallel=1): llama-3.1-70b in bfloat16" in out
    rows = (tmp_path / "s" / "sweep.csv").read_text().splitlines()
    assert rows[1].startswith("1,") and ",does not fit," in rows[1]
    # the curves have no line for the point that did not run (a legend entry without one)
    from simulator.planner_report import sweep_figure
    from simulator.sweep import SweepResult
    import pandas as pd
    t = pd.read_csv(tmp_path / "s" / "sweep.csv")
    fig = sweep_figure(SweepResult({"workload.arrival.rate": [10], "hardware.tensor_parallel":
                                    [1, 2]}, t.assign(**{"workload.arrival.rate": 10}), [], []))
    assert [x.get_text() for x in fig.axes[0].get_legend().get_texts()] == ["tensor_parallel=2"]
    assert "leaves no room for a KV cache" in rows[1] and "does not fit" not in rows[2]
    assert "does not fit" in (tmp_path / "s" / "report.md").read_text()
    # strict JSON (no NaN, which JSON readers refuse): a figure a point lacks is null
    points = strict_json(tmp_path / "s" / "sweep.json")["points"]
    assert points[0]["ttft_p99_ms"] is None and points[0]["binding"] is None
    assert points[1]["note"] is None and points[1]["ttft_p99_ms"] > 0
    # no point fits: the input is at fault, as for run
    assert main(args + ["--set", "hardware.tensor_parallel=1", "--set",
                        "workload.arrival.rate=1,2", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "leaves no room for a KV cache" in err
    assert not (tmp_path / "t").exists()


def test_sweep_and_plan_show_settings_vllm_refuses_together_as_rows(tmp_path, capsys):
    import pandas as pd

    # max_num_seqs 4: a budget of 2 tokens is refused by vLLM (max_num_batched_tokens >=
    # max_num_seqs), 16 is not; with chunked prefill off the budget must also cover
    # max_model_len (512): 256 is refused, 512 is not. The refused point is a row of its
    # own, as one that does not fit, so the two knobs can be swept together.
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 40))
    base = ["sweep", str(y), "--executor", "serial", "--quiet"]
    assert main(base + ["--set", "engine.max_num_batched_tokens=2,16", "--out",
                        str(tmp_path / "a")]) == 0   # the first point (the base) is refused
    out = capsys.readouterr().out
    assert ("invalid (max_num_batched_tokens=2): engine: max_num_batched_tokens (2) must be "
            ">= max_num_seqs (4), as vLLM requires") in out
    t = pd.read_csv(tmp_path / "a" / "sweep.csv")
    assert t["stability"].tolist() == ["invalid config", "stable"]
    assert t["request_throughput"].isna().tolist() == [True, False]
    assert main(base + ["--set", "engine.enable_chunked_prefill=true,false", "--set",
                        "engine.max_num_batched_tokens=256,512", "--out",
                        str(tmp_path / "b")]) == 0
    t = pd.read_csv(tmp_path / "b" / "sweep.csv")
    assert t["stability"].tolist() == ["stable", "stable", "invalid config", "stable"]
    assert t["note"].iloc[2].startswith("engine.max_num_batched_tokens: 256 is smaller than "
                                        "max_model_len (512) with enable_chunked_prefill "
                                        "false")
    assert "invalid config" in (tmp_path / "b" / "report.md").read_text()
    capsys.readouterr()
    # every point refused: the input is at fault, one line, nothing written
    assert main(base + ["--set", "engine.max_num_batched_tokens=2,3", "--out",
                        str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--set engine.max_num_batched_tokens=2" in err \
        and "must be >= max_num_seqs (4)" in err and err.endswith("(nor can the other point "
                                                                  "run)")
    assert err.startswith("servesim: error: p.yaml:4 ")   # the engine: line, as run names it
    assert not (tmp_path / "c").exists()
    # plan: the refused candidate is kept with its reason, the other is planned
    y.write_text(small_scenario("p", 100) + "slo: {ttft_ms: {p99: 500}}\nplan:\n"
                 "  target_rate: 10\n  candidates: {engine.max_num_batched_tokens: [2, 16]}\n")
    cands = expand_candidates(load_scenario(y))
    assert [c.error for c in cands] == [
        "engine: max_num_batched_tokens (2) must be >= max_num_seqs (4), as vLLM requires",
        None]
    assert cands[0].scenario.engine.max_num_batched_tokens == 2


def test_a_swept_int_beside_null_stays_an_int(tmp_path, capsys):
    # null (no client limit) beside 4: the column keeps 4 and null, not 4.0 and ".nan"
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 20))
    assert main(["sweep", str(y), "--executor", "serial", "--quiet", "--set",
                 "workload.max_concurrency=4,null", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert ".nan" not in out and "4.0" not in out
    # the unlimited point ran: "the largest swept" would wrongly say more may help
    assert "at workload.max_concurrency: 4\n" in out
    rows = (tmp_path / "s" / "sweep.csv").read_text().splitlines()
    assert rows[1].startswith("4,") and rows[2].startswith("null,")   # unset, not empty
    points = strict_json(tmp_path / "s" / "sweep.json")["points"]
    assert [p["workload.max_concurrency"] for p in points] == [4, None]
    assert [p["rejected"] for p in points] == [0, 0]   # a count: 0, not 0.0
    # as the second key: each knee line named by the value as swept
    assert main(["sweep", str(y), "--executor", "serial", "--quiet", "--set",
                 "workload.arrival.rate=2,4", "--set", "workload.max_concurrency=4,null",
                 "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "(with workload.max_concurrency=4)" in out and \
        "(with workload.max_concurrency=null)" in out and ".nan" not in out
    doc = strict_json(tmp_path / "t" / "sweep.json")
    assert [k["workload.max_concurrency"] for k in doc["knees"]] == [4, None]
    assert "| null | 4 |" in (tmp_path / "t" / "report.md").read_text()


def test_a_plan_that_rejects_prompts_names_the_rejections(tmp_path, capsys):
    # prompts uniform over 8..80 tokens with max_model_len 64: about a fifth are rejected
    # at any rate (an SLO entry that no lower load meets); the note names the rejections,
    # not the TPOT p99, which meets its bound
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 100).replace("max_model_len: 512", "max_model_len: 64")
                 .replace("{dist: fixed, value: 8}", "{dist: uniform, min: 8, max: 80}")
                 + "slo: {tpot_ms: {p99: 500}}\nplan: {target_rate: 10}\n")
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "o")]) == 1
    import pandas as pd

    status = pd.read_csv(tmp_path / "o" / "plan.csv")["status"].iloc[0]
    assert "requests per run are rejected (prompts of engine.max_model_len tokens or more)" \
        in status and "TPOT" not in status


def test_a_null_swept_value_ranks_above_every_number_in_a_knee():
    # null leaves a value unset: no client limit, the KV cache or max_model_len vLLM
    # sizes itself; it is the largest, and named "null" (None: no knee)
    import pandas as pd

    from simulator.sweep import knees

    def table(key, stable, tput):
        return pd.DataFrame({key: pd.Series([2, 8, None], dtype=object),
                             "stability": ["stable" if s else "unstable" for s in stable],
                             "request_throughput": tput})

    key = "engine.num_gpu_blocks"   # lowest stable
    assert knees(table(key, [False, True, True], [1, 2, 3]), [key]) == [{"knee": 8}]
    assert knees(table(key, [False, False, True], [1, 2, 3]), [key]) == [{"knee": "null"}]
    assert knees(table(key, [False, False, False], [1, 2, 3]), [key]) == [{"knee": None}]
    key = "workload.max_concurrency"   # throughput saturates: only the unlimited reaches
    assert knees(table(key, [True] * 3, [1.0, 5.0, 10.0]), [key]) == [{"knee": "null"}]
    assert knees(table(key, [True] * 3, [1.0, 9.6, 10.0]), [key]) == [{"knee": 8}]


def test_plan_shows_candidate_values_as_written_and_not_as_flags(tmp_path, capsys):
    # null and 1024 as plan.candidates gives them,
    # and a note on a candidate's value does not call it a --set flag the user never gave
    y = tmp_path / "p.yaml"
    y.write_text(small_scenario("p", 100) + "slo: {ttft_ms: {p99: 500}}\nplan:\n"
                 "  target_rate: 10\n  candidates: {engine.num_gpu_blocks: [null, 1024]}\n")
    cands = expand_candidates(load_scenario(y))
    assert cands[1].scenario.set_by("engine.num_gpu_blocks") is None
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert " null " in out and " 1024 " in out and "1,024" not in out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| 0 | null |" in md and "| 1 | 1024 |" in md
    rows = (tmp_path / "o" / "plan.csv").read_text().splitlines()
    assert rows[1].startswith("null,") and rows[2].startswith("1024,")


def test_a_refused_combination_does_not_hide_another_error():
    # the sweep skips a refused point only when nothing else is wrong with it
    import yaml

    from simulator.errors import Refused

    raw = yaml.safe_load(small_scenario("p", 10))
    with pytest.raises(Refused):
        scenario_from_dict({**raw, "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2}})
    with pytest.raises(InputError) as e:
        scenario_from_dict({**raw, "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2},
                            "sim": {"warmup_requests": 10}})
    assert not isinstance(e.value, Refused) and "sim.warmup_requests: 10 leaves none" in \
        str(e.value)


def test_compare_names_the_step_costs_in_the_plans_column_order(tmp_path, capsys):
    # a projected GPU first, a constant step second: the line reads in that order
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(COMPARE_PLAN.format(name="gpu", step=0.01, seqs=4, n=30).replace(
        "{step_time: {constant_s: 0.01}}", "{profile: h100-sxm}"))
    b.write_text(COMPARE_PLAN.format(name="const", step=0.01, seqs=4, n=30))
    assert main(["compare", str(a), str(b), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert ("Step costs: **projected: roofline h100-sxm, tensor_parallel=1, default "
            "efficiencies (MBU 0.7, MFU 0.5)**; **inline: constant 10 ms/step**") in md


def test_a_piped_table_wider_than_80_columns_keeps_each_number_whole(capsys, monkeypatch):
    # piped without COLUMNS a number is not folded at 80 columns ("11.96–14.95" into
    # "11.96–14" over ".95"); in a terminal of 80 columns (COLUMNS) the table still folds to fit
    import pandas as pd

    from simulator.planner_cli import _print_table

    monkeypatch.delenv("COLUMNS", raising=False)
    df = pd.DataFrame([{f"cost_per_hour_ci95_{i}": [11.96, 14.95] for i in range(9)}])
    _print_table(df, "wide")
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) > 80
    assert any(line.count("11.96–14.95") == 9 for line in lines)


def test_a_plan_of_conversations_is_refused_before_any_run(tmp_path, capsys):
    # with sessions the rate starts conversations: 600 turns of ~4.5 per conversation, their
    # later turns after think times, served about 3 req/s whatever the rate; the search
    # is refused (it would call 195 "req/s" feasible)
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scenarios" / "multi_turn.yaml"
    assert main(["plan", str(path), "--target-rate", "4", "--executor", "serial", "--quiet",
                 "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: multi_turn.yaml:17: workload.sessions: a rate "
                          "search sets the arrival rate of single requests; with sessions it "
                          "starts conversations") and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_plan_and_sweep_json_is_strict_json():
    # a missing figure is NaN in a pandas table; JSON has no NaN (JSON.parse refuses it)
    import json

    import numpy as np

    from simulator.planner_report import _json

    text = _json({"ttft_p99_ms": float("nan"), "ci": [np.float64("nan"), np.float64(1.5)],
                  "n": np.int64(3), "inf": float("inf")}).decode()
    assert json.loads(text) == {"ttft_p99_ms": None, "ci": [None, 1.5], "n": 3, "inf": None}
    assert "NaN" not in text and "Infinity" not in text


def test_compare_prices_each_plan_by_its_gpus(tmp_path, capsys):
    # catalog prices per GPU-hour: h100-sxm 2.99, a100-80gb 1.79 (simulator/catalog)
    body = """model: llama-3.1-8b
hardware: {{profile: {gpu}, tensor_parallel: {tp}}}
cluster: {{replicas: {n}}}
workload:
  num_requests: 20
  arrival: {{process: poisson, rate: 2}}
  prompt_tokens: {{dist: fixed, value: 64}}
  output_tokens: {{dist: fixed, value: 8}}
"""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(body.format(gpu="h100-sxm", tp=1, n=2))
    b.write_text(body.format(gpu="a100-80gb", tp=2, n=1))
    assert main(["compare", str(a), str(b), "--executor", "serial", "--quiet",
                 "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "USD/h" in out
    row = next(line for line in (tmp_path / "c" / "compare.csv").read_text().splitlines()
               if line.startswith("cost_per_hour,"))
    assert [float(x) for x in row.split(",")[1:]] == pytest.approx([2 * 2.99, 2 * 1.79])


def test_a_plan_count_met_only_in_the_mean_says_so():
    """A confirmed count whose SLO ratio lay inside the indifference zone (0.984: met by
    1.6% in the mean, its 95% CI across 1) is given with its interval and the ratio; one
    decided by its intervals on both sides adds nothing."""
    from types import SimpleNamespace

    from simulator.planner_cli import _unsure_text
    from simulator.scenario import SLOConfig

    trail = [{"replicas": 8, "confident": True, "mean_ratio": 1.3, "ci95": (1.2, 1.4)},
             {"replicas": 9, "confident": False, "mean_ratio": 0.984, "ci95": (0.529, 1.44)}]
    slo = SLOConfig(ttft_ms={"p99": 200})
    row = SimpleNamespace(replicas=9, replicas_ci95=(9, 10), confirmation=trail,
                          candidate=SimpleNamespace(scenario=SimpleNamespace(slo=slo)))
    assert _unsure_text(row, 0.02) == (
        " (95% interval 9–10 replicas: at 9 the worst SLO value is 0.984 × its threshold in "
        "the mean of the replications, 95% CI 0.529–1.44, not confidently met; a "
        "plan.tolerance below 0.02 with more plan.max_replications decides it)")
    row.candidate.scenario.slo = SLOConfig()   # no SLOs: no worst SLO value said
    assert _unsure_text(row, 0.02) == (
        " (95% interval 9–10 replicas: at 9 keeping up was not confidently decided (no SLOs); "
        "a plan.tolerance below 0.02 with more plan.max_replications decides it)")
    row.replicas_ci95 = (8, 9)   # 9 confidently met, 8 refuted only in the mean
    assert _unsure_text(row, 0.02) == " (95% interval 8–9 replicas: 8 was not confidently " \
                                      "refuted)"
    row.replicas_ci95 = (9, 9)
    assert _unsure_text(row, 0.02) == ""


def test_compare_names_the_cheapest_plan_meeting_every_slo():
    from simulator.planner_cli import _cheapest_text

    from types import SimpleNamespace

    def e(name, met, stability="stable", cost=None):
        return {"name": name, "slo_met": met, "stability": stability, "cost_per_hour": cost,
                "result": SimpleNamespace(summary={"capped": 0})}
    # the cheapest (1.0) misses; 2.0 keeps up and meets; 1.5 meets but cannot keep up
    assert _cheapest_text([e("a", False, cost=1.0), e("b", True, cost=2.0),
                           e("c", True, "unstable", 1.5), e("d", True, cost=3.0)]) == \
        "cheapest meeting every SLO: b (2.00 USD/h)"
    assert _cheapest_text([e("a", None), e("b", None)]).startswith("no SLO")
    assert _cheapest_text([e("a", False, cost=1.0)]) == \
        "no plan meets every SLO while keeping up with the workload"
    assert _cheapest_text([e("a", True), e("b", True)]) == \
        "meeting every SLO: a, b (no prices)"


def test_a_table_header_reads_an_slo_statistic_with_a_dot(tmp_path, capsys):
    # itl_p99.9_ms keeps its dot, not cut as a key path is
    from simulator.planner_cli import _label
    assert _label("itl_p99.9_ms") == "ITL p99.9 ms"
    assert _label("queue_mean_ms") == "QUEUE mean ms"
    assert (_label("ttft_p99_ms"), _label("engine.max_num_seqs")) == ("TTFT p99 ms",
                                                                     "max seqs")
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}",
                                    "slo: {itl_ms: {p99.9: 200}}"))
    main(["plan", str(y), "--out", str(tmp_path / "a"), "--executor", "serial",
          "--no-confirm"])
    head = capsys.readouterr().out.split("─")[0]
    assert [w for w in head.split() if w in ("ITL", "p99.9")] == ["ITL", "p99.9"]


def test_a_sweep_shows_the_statistics_its_slos_name(tmp_path, capsys):
    # an SLO on ITL p99.9 or E2EL p50 is shown where it is judged
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}",
                                    "slo: {itl_ms: {p99.9: 20}, e2el_ms: {p50: 100}, "
                                    "ttft_ms: {mean: 50}}"))
    sc = load_scenario(y)
    with make_executor("serial") as ex:
        res = sweep(sc, {"workload.arrival.rate": [5, 10]}, ex)
    for (_, row), (summary,) in zip(res.table.iterrows(), res.summaries):
        # the table holds the exact figure, which the summary rounds
        assert round_sig(row["itl_p99.9_ms"]) == summary["itl_ms"]["p99.9"]
        assert round_sig(row["e2el_p50_ms"]) == summary["e2el_ms"]["p50"]
        assert round_sig(row["ttft_mean_ms"]) == summary["ttft_ms"]["mean"]
    main(["sweep", str(y), "--set", "workload.arrival.rate=5,10", "--executor", "serial",
          "--quiet", "--out", str(tmp_path / "o")])
    head = capsys.readouterr().out.split("─")[0].split()
    assert "p99.9" in head and "mean" in head
    assert "itl_p99.9_ms" in (tmp_path / "o" / "sweep.csv").read_text().splitlines()[0]


def test_the_sweep_report_names_the_profile_with_its_held_out_error(tmp_path):
    # the run report states a profile's held-out step-cost MAPE beside its name: so does the
    # sweep's, once for all its points
    from pathlib import Path

    from simulator.cost_model import load_profile
    y = tmp_path / "s.yaml"
    y.write_text((Path(__file__).parents[1] / "scenarios" / "cpu_tiny.yaml").read_text()
                 .replace("num_requests: 400", "num_requests: 20"))
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=2,4", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    md = (tmp_path / "sw" / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Step costs: **"))
    p = load_profile("cpu-llama-tiny-56m-bfloat16")
    assert line.startswith(f"Step costs: **measured: profile cpu-llama-tiny-56m-bfloat16 "
                           f"({p.engine}, {p.provenance.date}; held-out step-cost MAPE "
                           f"{p.error.heldout.mape:.1%})")
    assert line.count("profile cpu-llama-tiny-56m-bfloat16") == 1
    # two sources (the same profile, with and without noise): each bold, each point's in
    # sweep.csv
    assert main(["sweep", str(y), "--set", "hardware.cost_noise=none,empirical", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "cn")]) == 0
    md = (tmp_path / "cn" / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Step costs: **"))
    import pandas as pd
    sources = list(pd.read_csv(tmp_path / "cn" / "sweep.csv")["cost_model"])
    assert sources[1] == sources[0] + (
        f"; each step × (1 + one of its {len(p.noise.relative_residuals)} fit residuals, "
        f"drawn at random: cost_noise empirical)")
    assert line.startswith(f"Step costs: **{sources[0]}**; **{sources[1]}** (each point's: "
                           f"`cost_model` in sweep.csv). ")


def test_a_report_that_cannot_be_written_is_the_one_line_plan_and_compare_print(
        tmp_path, capsys, monkeypatch):
    # a full disk: the error alone, not after the notes of a run whose report never landed
    import simulator.planner_report as planner_report
    import simulator.report as report

    def full(out_dir, contents, flag="--out", **kw):
        raise InputError(f"{flag} {out_dir}: cannot write there (No space left on device)")
    monkeypatch.setattr(report, "write_files", full)
    monkeypatch.setattr(planner_report, "write_files", full)
    y = tmp_path / "s.yaml"   # no SLO: plan notes that it plans for stability alone
    y.write_text(SMALL_PLAN.replace("slo: {ttft_ms: {p99: 200}}\n", "")
                 .replace("num_requests: 200", "num_requests: 100"))
    args = ["--executor", "serial", "--quiet"]
    assert main(["plan", str(y), "--out", str(tmp_path / "pl")] + args) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out {tmp_path / 'pl'}: cannot "
                                       f"write there (No space left on device)\n")
    y2 = tmp_path / "s2.yaml"   # a plan: section compare does not use: a note
    y2.write_text(y.read_text().replace("name: s\n", "name: s2\n"))
    assert main(["compare", str(y), str(y2), "--out", str(tmp_path / "cmp")] + args) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out {tmp_path / 'cmp'}: cannot "
                                       f"write there (No space left on device)\n")


def test_a_sweep_warns_of_each_points_workload(tmp_path, capsys):
    # normal prompts of mean 10: std 1 draws below 0.5 almost never; std 10 in
    # Phi(-9.5 / 10) = 17.1% of draws, std 20 in Phi(-9.5 / 20) = 31.7%. Every point is
    # checked: std=10 and std=20 warn
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("prompt_tokens: {dist: fixed, value: 8}",
                                    "prompt_tokens: {dist: normal, mean: 10, std: 10}")
                 .replace("num_requests: 200", "num_requests: 30"))
    assert main(["sweep", str(y), "--set", "workload.prompt_tokens.std=1,10,20", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "below 1" in x]
    tail = (" of its draws fall below 1 and are raised to 1 token, a spike the distribution "
            "written does not have (narrow it, or give min to make the floor explicit)")
    assert said == [
        "servesim: warning: at workload.prompt_tokens.std=10: workload.prompt_tokens: 17%"
        + tail,
        "servesim: warning: at workload.prompt_tokens.std=20: workload.prompt_tokens: 32%"
        + tail]
    # one every point has is said once, as is
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=5,10", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "sw2")]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "below 1" in x]
    assert said == ["servesim: warning: workload.prompt_tokens: 17%" + tail]


def test_empirical_noise_on_a_projection_is_one_invalid_point_of_a_sweep(tmp_path, capsys):
    # only that point is refused; the point without noise runs
    y = tmp_path / "s.yaml"
    y.write_text(SMALL_PLAN.replace("{step_time: {constant_s: 0.01}, price_per_gpu_hour: 1.0}",
                                    "{profile: h100-sxm}")
                 .replace("num_requests: 200", "num_requests: 30"))
    assert main(["sweep", str(y), "--set", "hardware.cost_noise=none,empirical", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    import pandas as pd
    t = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert list(t["stability"]) == ["stable", "invalid config"]
    assert t["note"][1] == ("hardware.cost_noise: empirical needs a measured profile's "
                            "residuals; a projection has none")


def test_compare_shows_the_gpus_each_plans_price_pays_for(tmp_path, capsys):
    # 3 replicas of TP 2 at 1 USD per GPU-hour: 6 GPUs, 6 USD/h (beside 1 GPU, 1 USD/h)
    import pandas as pd
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(SMALL_PLAN.replace("name: s\n", "name: a\n"))
    b.write_text(SMALL_PLAN.replace("name: s\n", "name: b\n").replace(
        "price_per_gpu_hour: 1.0}", "price_per_gpu_hour: 1.0, tensor_parallel: 2}")
        + "cluster: {replicas: 3}\n")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--executor",
                 "serial", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("plan"))
    assert out[header].split()[-2:] == ["GPUs", "USD/h"]
    assert [line.split()[-2:] for line in out[header + 2:header + 4]] == [["1", "1.00"],
                                                                         ["6", "6.00"]]
    csv = pd.read_csv(tmp_path / "c" / "compare.csv").set_index("figure")
    assert csv.loc[["replicas", "tensor_parallel", "cost_per_hour"]].astype(float).values \
        .tolist() == [[1, 3], [1, 2], [1, 6]]
    assert ("| deployment | 1 replica × 1 GPU (inline step time) | 3 replicas × 2 GPUs (inline "
            "step time) |"
            in (tmp_path / "c" / "report.md").read_text())


def test_compare_shows_each_statistic_the_slos_name(tmp_path, capsys):
    # "SLO met: no" rests on TTFT p90 and queue p95: the table, compare.csv and report show
    # them (numpy's linear percentile of the requests' own figures, as vllm bench serve)
    import numpy as np
    import pandas as pd
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    slo = "slo: {ttft_ms: {p90: 25}, queue_ms: {p95: 5}}\n"
    a.write_text(SMALL_PLAN.replace("name: s\n", "name: a\n").replace(
        "slo: {ttft_ms: {p99: 200}}\n", slo).replace("rate: 10", "rate: 300"))
    b.write_text(SMALL_PLAN.replace("name: s\n", "name: b\n").replace(
        "max_num_seqs: 4", "max_num_seqs: 2").replace("slo: {ttft_ms: {p99: 200}}\n", ""))
    args = ["--executor", "serial", "--quiet"]
    assert main(["run", str(a), "--out", str(tmp_path / "r")] + args[2:]) in (0, 1)
    req = pd.read_csv(tmp_path / "r" / "requests.csv")
    want = [np.percentile(req["ttft_ms"], 90), np.percentile(req["queue_ms"], 95)]
    assert want[0] > 25   # the SLO is missed: what the figure explains
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")] + args) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(line.split() for line in out if line.startswith("a "))
    # plan, TTFT p99, TPOT p99, then the SLOs' own statistics
    assert [float(x) for x in row[3:5]] == pytest.approx(want, rel=5e-3)   # 3 figures shown
    csv = pd.read_csv(tmp_path / "c" / "compare.csv").set_index("figure")
    assert csv.loc[["TTFT p90 (ms)", "Queue p95 (ms)"], "a"].astype(float).tolist() == \
        pytest.approx(want, rel=1e-5)
    md = (tmp_path / "c" / "report.md").read_text()
    assert "| TTFT p90 (ms) |" in md and "| Queue p95 (ms) |" in md


def test_a_closed_loop_sweep_has_no_offered_rate(tmp_path, capsys):
    # each user sends when its answer is back: 4 tokens of 10 ms steps, 25 req/s per user
    # up to the 4 slots (100 req/s); an "offered" rate would only repeat the served one
    import pandas as pd
    y = tmp_path / "c.yaml"
    y.write_text("name: c\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 "engine: {max_num_seqs: 4}\nworkload:\n  num_requests: 200\n"
                 "  arrival: {process: closed_loop, concurrency: 2}\n"
                 "  prompt_tokens: {dist: fixed, value: 8}\n"
                 "  output_tokens: {dist: fixed, value: 4}\n")
    assert main(["sweep", str(y), "--set", "workload.arrival.concurrency=1,2,8", "--out",
                 str(tmp_path / "s"), "--executor", "serial", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "offered" not in out
    t = pd.read_csv(tmp_path / "s" / "sweep.csv")
    assert t["offered_rate"].isna().all()
    assert t["request_throughput"].tolist() == pytest.approx([25, 50, 100], rel=0.02)
    assert "offered_rate" not in (tmp_path / "s" / "report.md").read_text().split(
        "| workload.arrival.concurrency |")[1].split("\n")[0]


def test_a_closed_loop_sweep_says_where_its_start_burst_sets_the_ttft_p99(tmp_path, capsys):
    # as run says it (test_cli.START_BURST_LOOP: 8 users, 2 slots, the burst's TTFTs
    # 10-40 ms against 10 ms after it): one user has no burst; 8 do, and the sweep
    # says so
    from test_cli import START_BURST_LOOP
    y = tmp_path / "cl.yaml"
    y.write_text(START_BURST_LOOP)
    args = ["--executor", "serial", "--quiet"]
    assert main(["sweep", str(y), "--set", "workload.arrival.concurrency=1,8", "--out",
                 str(tmp_path / "a")] + args) == 0
    err = capsys.readouterr().err
    assert ("servesim: warning: at workload.arrival.concurrency=8: the closed loop's users "
            "all send their first request at 0 s, and that burst's waits set the TTFT p99"
            in err)
    assert main(["sweep", str(y), "--set", "workload.arrival.concurrency=1,8", "--set",
                 "sim.warmup_requests=8", "--out", str(tmp_path / "b")] + args) == 0
    assert "burst" not in capsys.readouterr().err


def test_a_sweep_says_where_its_steps_go_past_the_profiles_calibration_grid(tmp_path, capsys):
    # the shipped CPU profile measured decode batches up to 32 (test_cli's run test): 64
    # or 128 sequences at once are priced by extrapolation. A sweep says so as run does,
    # for the points that went past, with the most sequences of them
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    scenario = str(root / "scenarios" / "cpu_tiny.yaml")
    fast = ["--set", "workload.num_requests=200", "--set", "workload.arrival.rate=40"]

    def run_says(seqs):   # what run says at that point, and its most sequences at once
        out = tmp_path / f"run{seqs}"
        assert main(["run", scenario, *fast, "--set", f"engine.max_num_seqs={seqs}",
                     "--out", str(out), "--quiet"]) == 0
        line = next(x for x in capsys.readouterr().err.splitlines()
                    if "calibration grid" in x)
        return line.removeprefix("servesim: warning: "), json.loads(
            (out / "summary.json").read_text())["concurrency"]["running_max_per_replica"]

    said64, running64 = run_says(64)
    said128, running128 = run_says(128)
    assert running64 > 32 and running128 > running64
    args = [*fast, "--executor", "serial", "--quiet"]
    assert main(["sweep", scenario, "--set", "engine.max_num_seqs=32,64", "--out",
                 str(tmp_path / "a"), *args]) == 0
    err = capsys.readouterr().err
    assert f"servesim: warning: at engine.max_num_seqs=64: {said64}\n" in err
    assert err.count("calibration grid") == 1   # 32 stays inside it
    # every point past it: no points named, the most sequences of them ("up to")
    assert main(["sweep", scenario, "--set", "engine.max_num_seqs=64,128", "--out",
                 str(tmp_path / "b"), *args]) == 0
    err = capsys.readouterr().err
    most = said128.replace(f": {running128} sequences", f": up to {running128} sequences")
    assert most != said128 and f"servesim: warning: {most}\n" in err
    assert "at engine.max_num_seqs" not in err
    # compare says it of each plan whose run went past, by the plan's name
    tiny = (root / "scenarios" / "cpu_tiny.yaml").read_text()
    plans = []
    for seqs in (32, 64):
        y = tmp_path / f"p{seqs}.yaml"
        y.write_text(tiny.replace("name: cpu-tiny", f"name: seqs{seqs}")
                     .replace("max_num_seqs: 32", f"max_num_seqs: {seqs}"))
        plans.append(str(y))
    assert main(["compare", *plans, *fast, "--out", str(tmp_path / "c"), "--executor",
                 "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"servesim: warning: seqs64: {said64}\n" in err
    assert err.count("calibration grid") == 1


def test_a_plan_says_which_candidates_max_rate_runs_go_past_the_calibration_grid(
        tmp_path, capsys):
    # max_num_seqs 64 on the shipped CPU profile (decode batches measured up to 32): at its
    # max rate under a loose TTFT SLO more than 32 sequences run at once; 32 cannot
    import re
    from pathlib import Path
    scenario = str(Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml")
    assert main(["plan", scenario, "--set", "workload.num_requests=200", "--set",
                 "slo={ttft_ms: {p99: 2000}}", "--set",
                 "plan={candidates: {engine.max_num_seqs: [32, 64]}}", "--target-rate", "50",
                 "--out", str(tmp_path / "p"), "--executor", "serial", "--quiet"]) == 0
    err = capsys.readouterr().err
    said = re.findall(r"servesim: warning: candidate (.*) at its max rate: profile "
                      r"cpu-llama-tiny-56m-bfloat16 prices steps past its calibration grid: "
                      r"up to (\d+) sequences running at once \(decode batches up to 32 were "
                      r"measured\)", err)
    assert len(said) == 1 and said[0][0] == "max_num_seqs=64" and int(said[0][1]) > 32


MD1 = """name: md1
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 1, max_model_len: 512}
workload:
  seed: 0
  num_requests: 400
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 10}
  output_tokens: {dist: fixed, value: 10}
"""


def test_a_plan_states_no_rate_past_capacity_where_its_draws_came_slow(tmp_path):
    # One slot, 10 steps of 10 ms a request: an M/D/1 queue of capacity exactly 10 req/s.
    # Seed 7's draws arrive up to 14% slower than their nominal rate, so runs at a nominal
    # 10.4 req/s keep up: judged by its draws alone, the plan would state 10.44 req/s per
    # replica and confirm 3 replicas for 31 req/s, which serve at most 30. A nominal rate
    # past the probe's throughput (here exactly 10 req/s) is unstable, and a deployment of
    # N is bounded by N x it.
    y = tmp_path / "md1.yaml"
    y.write_text(MD1)
    assert main(["plan", str(y), "--set", "workload.seed=7", "--target-rate", "31",
                 "--out", str(tmp_path / "p"), "--executor", "serial", "--quiet"]) == 0
    row = json.loads((tmp_path / "p" / "plan.json").read_text())["candidates"][0]
    assert row["max_rate_per_replica"] <= 10
    assert row["confirmed"] and row["replicas"] == 4   # ceil(31 / 10); 4 at rho 0.78 keep up
    # 2000 requests keep up at a nominal 10.11 (1.1% past capacity) within the run's
    # window: no rate past 10 either
    assert main(["plan", str(y), "--set", "workload.num_requests=2000", "--target-rate",
                 "31", "--out", str(tmp_path / "q"), "--executor", "serial", "--quiet"]) == 0
    row = json.loads((tmp_path / "q" / "plan.json").read_text())["candidates"][0]
    assert row["max_rate_per_replica"] <= 10 and row["replicas"] == 4


def test_an_estimate_past_max_replicas_is_still_deployed_at_the_cap(tmp_path):
    # M/D/1 with mean TTFT <= 60 ms (W + 10 ms): one replica meets it up to about 5 req/s
    # (Pollaczek-Khinchine: W = rho S / (2 (1 - rho)) = 50 ms at rho 0.5), so 12 req/s is
    # estimated at 3 replicas. Behind round_robin each of 2 replicas gets every other
    # arrival (Erlang-2 gaps at 6 req/s, rho 0.6), whose waits are far shorter than
    # M/D/1's 75 ms (a Lindley recursion gives a mean TTFT of about 39 ms): 2 replicas meet
    # it, and plan.max_replicas 2 must not refuse what its deployment of 2 meets
    y = tmp_path / "md1.yaml"
    y.write_text(MD1 + "slo: {ttft_ms: {mean: 60}}\n")
    base = ["--target-rate", "12", "--executor", "serial", "--quiet"]
    assert main(["plan", str(y), *base, "--out", str(tmp_path / "free")]) == 0
    free = json.loads((tmp_path / "free" / "plan.json").read_text())["candidates"][0]
    assert free["confirmed"] and free["replicas"] == 2
    assert main(["plan", str(y), *base, "--set", "plan.max_replicas=2",
                 "--out", str(tmp_path / "cap")]) == 0
    capped = json.loads((tmp_path / "cap" / "plan.json").read_text())["candidates"][0]
    assert capped["confirmed"] and capped["replicas"] == 2
    # 40 req/s needs 4 replicas even at capacity (10 req/s each): past a cap of 3, not run
    assert main(["plan", str(y), "--target-rate", "40", "--set", "plan.max_replicas=3",
                 "--executor", "serial", "--quiet", "--out", str(tmp_path / "far")]) == 1


def test_a_deployment_of_n_leaves_out_n_times_the_warm_up_as_n_times_the_requests():
    # each replica of a confirmation run sees as many requests, and leaves out as many
    # warm-up requests, as the one replica of the search did
    from simulator.planner import _cluster
    import yaml
    sc = scenario_from_dict({**yaml.safe_load(MD1), "sim": {"warmup_requests": 40}})
    dep = _cluster(sc, 3, 12.0)
    assert (dep.cluster.replicas, dep.workload.num_requests, dep.sim.warmup_requests,
            dep.workload.arrival.rate) == (3, 1200, 120, 12.0)


def test_a_plan_past_max_replicas_says_whether_the_cap_was_deployed(tmp_path, capsys):
    # M/D/1 (capacity 10 req/s per replica), mean TTFT <= 60 ms. 20 req/s on at most 2
    # replicas: 2 could serve it at capacity (rho 1), so 2 are simulated, and miss; 40 req/s
    # needs 4 even at capacity, past a cap of 3: nothing simulated, and nothing said of it
    y = tmp_path / "md1.yaml"
    y.write_text(MD1 + "slo: {ttft_ms: {mean: 60}}\n")
    base = ["--executor", "serial", "--quiet"]
    assert main(["plan", str(y), "--target-rate", "20", "--set", "plan.max_replicas=2",
                 *base, "--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out
    assert "more than plan.max_replicas (2); a deployment of 2 was simulated and missed" \
        in " ".join(out.split())
    assert "(> plan.max_replicas, whose deployment was simulated and missed)" in (
        tmp_path / "a" / "report.md").read_text()
    assert main(["plan", str(y), "--target-rate", "40", "--set", "plan.max_replicas=3",
                 *base, "--out", str(tmp_path / "b")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "more than plan.max_replicas (3)" in out and "simulated" not in out


def test_a_throughput_plans_max_rate_interval_reaches_capacity(tmp_path):
    # M/D/1 of capacity exactly 10 req/s, no SLO, seed 0: a backlog's trend calls 8.88
    # req/s unstable (noise, in 400 requests) and the max rate is 8.78; that verdict is not
    # a confident one, so the 95% interval runs up to the rates past capacity, and holds 10
    y = tmp_path / "md1.yaml"
    y.write_text(MD1)
    assert main(["plan", str(y), "--target-rate", "31", "--out", str(tmp_path / "p"),
                 "--executor", "serial", "--quiet"]) == 0
    row = json.loads((tmp_path / "p" / "plan.json").read_text())["candidates"][0]
    lo, hi = row["max_rate_ci95"]
    assert lo <= row["max_rate_per_replica"] <= 10 <= hi


def _once_and_twice(results, path):
    """The mean over ``results`` (RunResults) of the figure at ``path``: from the exact
    figures rounded once to 6 significant digits, and from the rounded summaries (rounded
    twice)."""
    import numpy as np

    from simulator.metrics import summary_at

    once = round_sig(float(np.mean([summary_at(r.exact, path) for r in results])))
    twice = round_sig(float(np.mean([summary_at(r.summary, path) for r in results])))
    return once, twice


def test_sweep_figures_are_means_of_exact_figures_rounded_once(tmp_path):
    # cpu_tiny at 4 req/s, 3 replications: the TTFT p99s 577.77451651, 414.38687064 and
    # 326.4150615 ms average 439.5254829 (439.525); their 6-figure summaries (577.775,
    # 414.387, 326.415) average 439.5256667, which sweep.csv showed as 439.526. The
    # goodputs average 4.11124997 req/s, 4.1112 at report.md's 5 figures; their summaries'
    # (4.03161, 4.13889, 4.16325) average 4.11125, which report.md showed as 4.1113.
    from pathlib import Path

    import pandas as pd

    from simulator.report import fmt_number
    from simulator.run import simulate
    from simulator.sweep import derive

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--set", "workload.arrival.rate=2,4", "--replications",
                 "3", "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    sc = derive(load_scenario(path), ["workload.arrival.rate=4"])
    runs = [simulate(sc, replication=k) for k in range(3)]
    once, twice = _once_and_twice(runs, ("ttft_ms", "p99"))
    assert (once, twice) == (439.525, 439.526)   # a case where rounding twice shows
    row = pd.read_csv(out / "sweep.csv").iloc[1]
    assert row["workload.arrival.rate"] == 4 and row["ttft_p99_ms"] == once
    goodput = sum(r.exact["goodput"] for r in runs) / 3
    assert fmt_number(goodput) == "4.1112"
    lines = (out / "report.md").read_text().splitlines()
    head = next(line for line in lines if line.startswith("| workload.arrival.rate |"))
    cells = next(line for line in lines if line.startswith("| 4 |"))   # the sweep table's
    assert dict(zip(head.split(" | "), cells.split(" | ")))["goodput"] == "4.1112"


def test_plan_figures_are_means_of_exact_figures_rounded_once(tmp_path):
    # the operating point's TTFT p99 over its two runs (3 replicas at 12 req/s): the exact
    # figures' mean rounds to 462.122 ms, the 6-figure summaries' to 462.121
    from simulator.planner import _cluster
    from simulator.run import simulate

    y = tmp_path / "p.yaml"
    y.write_text("""name: p
model: llama-tiny-56m
dtype: bfloat16
hardware: {profile: cpu-llama-tiny-56m-bfloat16, tensor_parallel: 1}
engine: {block_size: 16, max_num_seqs: 32, max_num_batched_tokens: 512, max_model_len: 2048}
workload:
  seed: 0
  num_requests: 300
  arrival: {process: poisson, rate: 4.0}
  prompt_tokens: {dist: lognormal, median: 96, p90: 320, max: 1024}
  output_tokens: {dist: lognormal, median: 24, p90: 64, max: 256}
slo: {ttft_ms: {p99: 500}, tpot_ms: {p99: 50}}
plan:
  target_rate: 12
  candidates: {engine.max_num_seqs: [16]}
  min_replications: 2
  max_replications: 3
""")
    with make_executor("serial") as ex:
        res = plan(load_scenario(y), ex)
    row = res.rows[0]
    assert row.confirmed and row.replicas == 3
    n = row.operating["ttft_ms"]["p99"]["n"]
    runs = [simulate(_cluster(row.candidate.scenario, 3, 12.0), replication=k)
            for k in range(n)]
    once, twice = _once_and_twice(runs, ("ttft_ms", "p99"))
    assert (once, twice) == (462.122, 462.121)   # a case where rounding twice shows
    out = tmp_path / "p"
    assert main(["plan", str(y), "--executor", "serial", "--quiet", "--out", str(out)]) == 0
    with open(out / "plan.csv", newline="") as f:
        assert float(next(csv.DictReader(f))["ttft_p99_ms"]) == once
