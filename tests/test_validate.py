"""Validation: timing replay of a real-engine run reproduces it exactly (same per-step
batches, prefix hits, preemptions; timestamps within 1 ms), and the pieces of the
predicted mode (saturation figure, signed error, band check) compute what they claim."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from calibration import timing_replay as TR
from calibration import validate as V
from calibration import validate_report as VR
from calibration.engine.weights import random_model
from simulator import files
from simulator.cost_model import build_cost_model
from simulator.metrics import summary_at
from simulator.scenario import scenario_from_dict

SCENARIO = {
    "name": "timing", "model": "llama-test", "dtype": "float32",
    "hardware": {"step_time": {"constant_s": 0.002}},
    # A small KV cache (19 usable blocks of 16) and outputs long enough that the run
    # preempts (admission waits until a whole prompt fits: growing decodes preempt).
    "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 128,
               "max_model_len": 300, "num_gpu_blocks": 20},
    "workload": {"seed": 3, "num_requests": 30, "arrival": {"process": "poisson", "rate": 15.0},
                 "prompt_tokens": {"dist": "lognormal", "median": 48, "p90": 160, "max": 200},
                 "output_tokens": {"dist": "lognormal", "median": 32, "p90": 80, "max": 120},
                 "prefix": {"shared_tokens": 32, "groups": 2}}}


@pytest.fixture(scope="module")
def timing_run():
    sc = scenario_from_dict(SCENARIO)
    cfg = TR.engine_config(sc, build_cost_model(sc).num_gpu_blocks)
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=torch.float32)
    specs = V.load_specs(sc, None, 30, 3)
    for _ in range(3):   # a run whose process was stalled while idle is repeated
        run = TR.run_engine(model, cfg, specs)
        res, cost = TR.simulate_timing(sc, specs, run)
        if TR.compare_timing(run, res, cost)["late_wakes"] == 0:
            break
    return sc, specs, run, res, cost


def test_timing_replay_is_exact(timing_run):
    _, specs, run, res, cost = timing_run
    cmp = TR.compare_timing(run, res, cost)
    if cmp["late_wakes"]:
        pytest.skip("the engine's process was stalled while idle in three runs (machine "
                    "too busy for an exact replay)")
    # The workload exercises what the check is about.
    assert run.prefix_hits > 0
    assert sum(r.preemptions for r in run.records) > 0
    assert cmp["steps_engine"] == cmp["steps_sim"] == len(run.steps)
    assert cmp["step_mismatches"] == 0
    assert cmp["prefix_hits_equal"] and cmp["preemptions_equal"]
    assert cmp["tokens_not_before_engine"]
    assert cmp["max_abs_diff_ms"]["arrival"] < 1e-6
    # A batch is scheduled where the engine's step began (its intake of arrivals, or its
    # wake-up, taken from the run), so first-scheduled times are the engine's own.
    assert cmp["max_abs_diff_ms"]["first_scheduled"] < 1e-6
    assert cmp["idle_wake_max_ms"] > 0   # the intake was needed: the engine woke late
    # Tokens and finishes land where the engine next looked at its queue, so they differ
    # from the engine's by at most its time handing a step's tokens back. (On a quiet
    # machine that stays under 1 ms; a shared CI machine can interrupt it, so the test
    # bounds the difference by the hand-back time the run had.)
    worst = max(cmp["max_abs_diff_ms"].values())
    assert worst <= cmp["handback_max_ms"] + 1e-6
    # the simulator's own clock between tokens: each gap within the hand-back time too
    assert len(res.itl_runs) > 0
    assert cmp["max_abs_diff_ms"]["itl"] <= cmp["handback_max_ms"] + 1e-6
    if cmp["handback_max_ms"] < 1.0:   # a quiet run: the 1 ms bound itself
        assert cmp["ok"]
    # ... and the check fails where the simulator's times do not match: a finish 50 ms late,
    # a first token never recorded (NaN is no match)
    late = res.requests.copy()
    late.loc[late.index[0], "finish_s"] += 0.05
    bad = TR.compare_timing(run, dataclasses.replace(res, requests=late), cost)
    slack = cmp["handback_max_ms"] + 1e-6   # what the two already differ by
    assert not bad["ok"] and bad["max_abs_diff_ms"]["finish"] >= 50 - slack
    lost = res.requests.copy()
    lost.loc[lost.index[0], "first_token_s"] = float("nan")
    bad = TR.compare_timing(run, dataclasses.replace(res, requests=lost), cost)
    assert not bad["ok"] and bad["max_abs_diff_ms"]["first_token"] == float("inf")
    # a simulator clock whose gaps differ (one gap 5 ms longer) fails the ITL check
    itl = res.itl_runs.copy()
    itl.loc[itl.index[-1], "gap_ns"] += 5_000_000
    bad = TR.compare_timing(run, dataclasses.replace(res, itl_runs=itl), cost)
    assert not bad["ok"] and bad["max_abs_diff_ms"]["itl"] >= 5 - slack
    # Same queue-length series through both metric paths, preempted requests' waits again
    # included on both sides (each wait's ends within the hand-back time).
    def waited_s(result):
        ts = result.timeseries
        ts = ts[ts["replica"] == "all"]
        return float((ts["waiting"] * ts["bin_s"]).sum())
    eng_run = TR.engine_result(run)
    rewaits = sum(r.preemptions for r in run.records)
    first = sum(r.first_scheduled_ns - r.arrival_ns for r in run.records) / 1e9
    assert waited_s(eng_run) > first   # the preempted requests' second waits count
    assert waited_s(res) == pytest.approx(
        waited_s(eng_run), abs=2 * (len(run.records) + rewaits) * cmp["handback_max_ms"] / 1e3
        + 1e-9)
    # Same totals through both metric paths.
    eng = eng_run.summary
    assert eng["preemptions"] == res.summary["preemptions"]
    assert eng["prefix_cache_hit_tokens"] == res.summary["prefix_cache_hit_tokens"]
    assert eng["total_output_tokens"] == res.summary["total_output_tokens"] == sum(
        s.max_tokens for s in specs)


class _PerToken:
    """1 us per scheduled token: a price whose total is known from the engine's steps."""

    def step_time_ns(self, plan):
        return 1000 * plan.num_scheduled_tokens


def test_priced_timing_replay_gives_the_cost_models_error_on_the_engines_steps(timing_run):
    sc, specs, run, _, _ = timing_run
    res, cost = TR.simulate_timing(sc, specs, run, price=_PerToken())
    cmp = TR.compare_timing(run, res, cost)
    if cmp["step_mismatches"]:
        pytest.skip("the replay was not exact (machine too busy)")
    want = (1000 * sum(s.num_scheduled_tokens for s in run.steps)
            / sum(s.duration_ns for s in run.steps))
    assert cmp["step_cost_ratio"] == pytest.approx(want, rel=1e-12)
    # by kind: the same sums (1000 ns per scheduled token) split by what each step held
    want_kinds: dict = {}
    for st in run.steps:
        kind = ("mixed" if st.num_decodes else "prefill") if st.prefills else "decode"
        acc = want_kinds.setdefault(kind, [0, 0, 0])
        acc[0] += 1000 * st.num_scheduled_tokens
        acc[1] += st.duration_ns
        acc[2] += 1
    assert cmp["step_cost_by_kind"] == want_kinds and "decode" in want_kinds
    # unpriced, or on steps that differ from the engine's, there is no ratio
    assert TR.compare_timing(run, *TR.simulate_timing(sc, specs, run))["step_cost_ratio"] is None
    other = sc.model_copy(update={"engine": sc.engine.model_copy(
        update={"max_num_batched_tokens": 64})})
    cmp = TR.compare_timing(run, *TR.simulate_timing(other, specs, run, price=_PerToken()))
    assert cmp["step_mismatches"] > 0 and cmp["step_cost_ratio"] is None


class _Waking(_PerToken):
    """_PerToken, and 1 ns per us idle for the step that ends a wait (``wake_ns``)."""

    def wake_ns(self, idle_ns):
        return idle_ns // 1000


def test_priced_timing_replay_adds_the_wake_up_cost_where_the_engine_idled(timing_run):
    # the priced steps pay the price's wake-up for the idle time before them, as the
    # simulator's replica does: its idle gaps are where a simulated step starts after the
    # previous one ended (the replica starts idle at 0)
    sc, specs, run, _, _ = timing_run
    res, cost = TR.simulate_timing(sc, specs, run, price=_Waking())
    if TR.compare_timing(run, res, cost)["step_mismatches"]:
        pytest.skip("the replay was not exact (machine too busy)")
    ends = [0] + [st.end_ns for st in cost.steps[:-1]]
    gaps = [st.start_ns - e for st, e in zip(cost.steps, ends)]
    if sum(g > 0 for g in gaps) < 2:   # a loaded host can leave fewer than two idle gaps
        pytest.skip("the engine never idled between arrivals (machine too busy)")
    assert cost.priced_ns == [1000 * s.num_scheduled_tokens + g // 1000
                              for s, g in zip(run.steps, gaps)]


def test_timing_replay_detects_a_different_policy(timing_run):
    """The check can fail: a simulator with half the token budget batches differently."""
    sc, specs, run, _, _ = timing_run
    other = sc.model_copy(update={"engine": sc.engine.model_copy(
        update={"max_num_batched_tokens": 64})})
    res, cost = TR.simulate_timing(other, specs, run)
    cmp = TR.compare_timing(run, res, cost)
    assert cmp["step_mismatches"] > 0 and not cmp["ok"]


def test_saturation_throughput_excludes_ramp_and_drain():
    # 100 finishes: a slow ramp (0, 0.1, ..., 0.9 s), then one every 0.05 s from 1.0 s.
    # Percentile finishes: index 10 at 1.0 s, index 89 at 1.0 + 79 * 0.05 = 4.95 s, so
    # 79 requests in 3.95 s = 20 req/s, the steady rate; the ramp is left out.
    f = [int(i * 1e8) for i in range(10)] + [int(1e9 + i * 5e7) for i in range(90)]
    assert V.saturation_throughput(f[::-1]) == pytest.approx(20.0)
    # saturated until 3.0 s: index 10 (1.0 s) to index 50 (3.0 s), 40 in 2 s; until 1.5 s
    # only 10 of the 100 finish in the window, under a quarter: no figure
    assert V.saturation_throughput(f, until_ns=3e9) == pytest.approx(20.0)
    assert V.saturation_throughput(f, until_ns=1.5e9) is None
    with pytest.raises(ValueError):
        V.saturation_throughput([1, 2, 3])
    import warnings
    with warnings.catch_warnings():   # most of a burst ending in one step: no rate, no 1/0
        warnings.simplefilter("error")
        assert V.saturation_throughput([0] + [10**9] * 18 + [2 * 10**9]) == float("inf")


def test_signed_error_and_band_table():
    assert V.signed_error(110.0, 100.0) == pytest.approx(0.10)
    assert V.signed_error(90.0, 100.0) == pytest.approx(-0.10)
    assert V.signed_error(None, 1.0) is None and V.signed_error(1.0, 0.0) is None
    lr = V.LoadResult(load=0.9, rate=1.0, num_requests=10)
    meas = {"ttft_ms": {"p50": 100.0, "p99": 300.0}}
    lr.measured = [meas]
    lr.predicted = [{"ttft_ms": {"p50": 120.0, "p99": 240.0}}]
    lr.band_low = [{"ttft_ms": {"p50": 90.0, "p99": 200.0}}]
    lr.band_high = [{"ttft_ms": {"p50": 150.0, "p99": 280.0}}]
    rows = {r["figure"]: r for r in lr.table()}
    assert rows["TTFT p50"]["error"]["mean"] == pytest.approx(0.20)
    assert rows["TTFT p99"]["error"]["mean"] == pytest.approx(-0.20)
    assert rows["TTFT p50"]["in_band"] is True     # 90 <= 100 <= 150
    assert rows["TTFT p99"]["in_band"] is False    # 300 > 280
    assert "in_band_adjusted" not in rows["TTFT p50"]
    # with a probe, a second band around the prediction at host speed, judged on its own
    lr.adjusted = [{"ttft_ms": {"p50": 130.0, "p99": 290.0}}]
    lr.adjusted_low = [{"ttft_ms": {"p50": 110.0, "p99": 260.0}}]
    lr.adjusted_high = [{"ttft_ms": {"p50": 160.0, "p99": 320.0}}]
    rows = {r["figure"]: r for r in lr.table()}
    assert rows["TTFT p50"]["in_band"] is True and rows["TTFT p50"]["in_band_adjusted"] is False
    assert rows["TTFT p99"]["in_band"] is False and rows["TTFT p99"]["in_band_adjusted"] is True
    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05, "host_speed": 1.1, "adjusted_rps": 1.9,
                             "adjusted_error": -0.05},
              "loads": [{"load": 0.9, "rate": 1.25, "num_requests": 10,
                         "table": list(rows.values()), "timing": [], "host_speed": [1.1]}]}
    md = VR.markdown_table(result).splitlines()
    assert md[0].startswith("saturation throughput (20 requests at once): measured 2.000")
    assert md[2].endswith("own seed): load 0.9: 10 requests at 1.25 req/s")
    assert next(x for x in md if x.startswith("| load |")).endswith(
        "| error | in MAPE band | predicted at host speed | error at host speed | "
        "in MAPE band around it |")
    p50 = next(x for x in md if x.startswith("| 0.9 | TTFT p50 |"))
    assert p50.endswith("| +20.0% | yes (90–150) | 130 | +30.0% | no (110–160) |")


def test_bad_input_is_one_line():
    from simulator.cli import main
    from simulator.errors import InputError
    with pytest.raises(InputError, match="--loads"):
        V.parse_loads("0.3,high")
    with pytest.raises(InputError, match=r"--loads: '0\.3,,0\.6' is not a comma-separated"):
        V.parse_loads("0.3,,0.6")
    with pytest.raises(InputError, match=r"--loads: 0\.5 given twice .* --replications"):
        V.parse_loads("0.5,0.9,0.50")
    # float() reads full-width digits and underscores; a flag takes 0-9 as a scenario does
    with pytest.raises(InputError, match=r"^--loads: '０\.５' is not a number in the digits "
                                         r"0-9 \(write 0\.5\)$"):
        V.parse_loads("0.3,０.５")
    with pytest.raises(InputError, match=r"^--loads: '0_5' is not a number"):
        V.parse_loads("0_5")
    # seeds come from a load's thousandths: 1.001 has requests of its own, and a finer
    # load (0.5004, which would share 0.5's) is refused
    assert V.load_key(0.5) == 500 and V.load_key(1.001) == 1001 and V.load_key(0.9) == 900
    with pytest.raises(InputError, match=r"^--loads: 0\.5004 is finer than a thousandth "
                                         r"\(each load's workloads are seeded by its "
                                         r"thousandths\): give at most 3 decimals$"):
        V.parse_loads("0.5,0.5004")
    assert V.parse_loads("1.001,1.0") == [1.001, 1.0]
    assert len({V.load_key(k / 1000) for k in range(10, 1501)}) == 1491
    assert V.parse_loads("0.3, 0.6") == [0.3, 0.6]
    sc = scenario_from_dict({**SCENARIO, "cluster": {"replicas": 2}})
    with pytest.raises(InputError, match="cluster.replicas"):
        V.validate(sc, [0.3], 1, quiet=False)
    with pytest.raises(InputError, match="--loads"):
        V.validate(scenario_from_dict(SCENARIO), [0.0], 1, quiet=False)
    assert main(["validate", "--scenario", "/nonexistent.yaml", "--no-quiet-wait"]) == 2


@pytest.mark.parametrize("workload, key", [
    # a closed loop's arrivals follow its finishes, so a list would put them all at 0 (a
    # burst at every load): refused
    ({"arrival": {"process": "closed_loop", "concurrency": 4}}, "workload.arrival.process"),
    ({"sessions": {"turns": {"dist": "fixed", "value": 2}}}, "workload.sessions"),
    # the engines serve without a client gate: the simulation would hold requests alone
    ({"max_concurrency": 4}, "workload.max_concurrency"),
])
def test_validate_refuses_arrivals_it_cannot_set_a_rate_for(workload, key):
    from simulator.errors import InputError
    sc = scenario_from_dict({**SCENARIO, "workload": {**SCENARIO["workload"], **workload}})
    with pytest.raises(InputError, match=rf"^<scenario>: {key}: validate serves open-loop "
                                         r"arrivals \(poisson, gamma or constant\)"):
        V.validate(sc, loads=(0.3,), replications=1)


def test_validate_refuses_a_projected_cost_model():
    from simulator.errors import InputError
    sc = scenario_from_dict({**SCENARIO, "hardware": {"profile": "h100-sxm"}})
    with pytest.raises(InputError, match="measured here"):
        V.validate(sc, loads=(0.3,), replications=1)


def test_probe_cells_are_the_nearest_cells_of_the_profile():
    from simulator.cost_model import PROFILES_DIR, load_profile
    import pandas as pd
    prof = load_profile(PROFILES_DIR / "cpu-llama-tiny-56m-bfloat16.yaml")
    cells = V.probe_cells(prof)
    assert [c.key for c, _ in cells] == ["decode B=2 L=256", "decode B=8 L=256",
                                         "decode B=32 L=256",
                                         "prefill n=256 c=0"]   # the full CPU grid has them
    df = pd.read_csv(prof.path.parent / prof.provenance.measurements_csv, comment="#")
    for c, ref in cells:
        assert ref == pytest.approx(df.loc[df.cell == c.key, "duration_ns"].mean() / 1e9)
    assert V.probe_cells(prof.model_copy(update={"provenance": prof.provenance.model_copy(
        update={"measurements_csv": None})})) is None


def test_chunks_stepped_reads_whether_the_grid_stepped_its_chunks(tmp_path):
    # the shipped CPU profiles' grids ran each chunk cell's n; a grid that stepped them
    # (calibration.profiler.pass_chunk_tokens) ran more
    import shutil
    from simulator.cost_model import PROFILES_DIR, load_profile
    prof = load_profile(PROFILES_DIR / "cpu-llama-tiny-56m-bfloat16.yaml")
    assert V.chunks_stepped(prof) is False
    assert V.chunks_stepped(prof.model_copy(update={"provenance": prof.provenance.model_copy(
        update={"measurements_csv": None})})) is False
    shutil.copy(prof.path, tmp_path / "p.yaml")
    csv = prof.path.parent / prof.provenance.measurements_csv
    text = csv.read_text()
    # a 'prefill n=256 c=0' row run at 260 tokens: its counts follow its chunk
    row = "prefill n=256 c=0,prefill,0,87767912,87659682,256@0,0,0,1,256,1,256,0,256,32896.0,1"
    assert row in text
    stepped = ("prefill n=256 c=0,prefill,0,87767912,87659682,260@0,0,0,1,260,1,260,0,260,"
               f"{260 * 261 / 2},1")
    (tmp_path / prof.provenance.measurements_csv).write_text(text.replace(row, stepped, 1))
    assert V.chunks_stepped(load_profile(tmp_path / "p.yaml")) is True


def test_profile_threads_read_from_the_csv_header_else_the_text(tmp_path):
    """validate runs the engine with the thread count the profile was measured with."""
    import shutil
    from simulator.cost_model import PROFILES_DIR, load_profile
    name = "cpu-llama-tiny-56m-bfloat16"
    for suffix in (".yaml", ".measurements.csv"):
        shutil.copy(PROFILES_DIR / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    csv = tmp_path / f"{name}.measurements.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text(lines[0].replace('"threads": 1', '"threads": 3') + "".join(lines[1:]))
    prof = load_profile(tmp_path / f"{name}.yaml")
    assert V.profile_threads(prof) == 3          # the header, not the text ("1 thread")
    csv.unlink()                                 # no CSV: the text says it
    for text, want in (("cpu X (1 thread)", 1), ("cpu X (12 threads)", 12), ("cpu X", None),
                       ("cpu X (AVX512-BF16, 2 threads)", 2)):
        p = prof.model_copy(update={
            "device": prof.device.model_copy(update={"name": text}),
            "provenance": prof.provenance.model_copy(update={"source": "s"})})
        assert V.profile_threads(p) == want


@pytest.mark.parametrize("name,host,want", [
    # this host, named as calibrate names it, or shorter and without the ISA (shipped ones)
    ("cpu Intel(R) Xeon(R) Processor (AMX-BF16, AVX512-BF16, 1 thread)",
     ("Intel(R) Xeon(R) Processor", "AMX-BF16, AVX512-BF16"), None),
    ("cpu AMD EPYC (1 thread)", ("AMD EPYC 9R14 96-Core Processor", "AVX512-BF16"), None),
    # another model, or the same model name with another ISA
    ("cpu AMD EPYC (1 thread)", ("Intel(R) Xeon(R) Processor", "AMX-BF16"), "AMD EPYC"),
    ("cpu AMD EPYC 7R13 Processor (AVX2, 2 threads)",
     ("AMD EPYC 7R13 Processor", "AVX512-BF16"), "AMD EPYC 7R13 Processor (AVX2)"),
    # nothing to compare: a --device-name label, a GPU
    ("my-box", ("AMD EPYC", ""), None),
])
def test_a_profile_from_another_cpu_is_named(name, host, want):
    from types import SimpleNamespace as NS
    prof = NS(device=NS(name=name, kind="cpu"))
    assert V.other_host(prof, host) == want
    assert V.other_host(NS(device=NS(name=name, kind="gpu")), host) is None
    assert V.other_host(None, host) is None


def test_profile_origin_names_the_device_and_warns_for_another_cpu(capsys, monkeypatch):
    from types import SimpleNamespace as NS
    from calibration import profiler
    monkeypatch.setattr(profiler, "cpu_name", lambda: "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(profiler, "cpu_isa", lambda: "AMX-BF16")
    assert V.profile_origin(None) == {"profile_device": "inline step_time"}
    here = NS(device=NS(name="cpu Intel(R) Xeon(R) Processor (AMX-BF16, 1 thread)", kind="cpu"))
    assert V.profile_origin(here) == {"profile_device": here.device.name}
    assert capsys.readouterr().err == ""
    there = NS(device=NS(name="cpu AMD EPYC (1 thread)", kind="cpu"))
    assert V.profile_origin(there) == {"profile_device": "cpu AMD EPYC (1 thread)",
                                       "profile_warning": "measured on another CPU (AMD EPYC)"}
    assert capsys.readouterr().err.startswith(
        "servesim: warning: the profile was measured on another CPU, AMD EPYC; this host is "
        "Intel(R) Xeon(R) Processor (AMX-BF16): its step costs need not hold here")


def test_what_validate_cannot_serve_names_the_flag_or_the_file_line(tmp_path):
    # the --set flag at fault is named, else the file's line
    import yaml
    from simulator.errors import InputError
    from simulator.scenario import load_scenario
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    for flags, call, want in [
        (["cluster.replicas=2"], lambda sc: V.check_validation_args(sc, [0.3], 1),
         "--set cluster.replicas=2: validation serves one engine, so it must be 1 (got 2)"),
        (["hardware={profile: h100-sxm}", "model=llama-3.1-8b", "dtype=bfloat16"],
         V.servable_cost_model, "--set hardware={profile: h100-sxm}: hardware.profile: "
         "validate serves the scenario on this machine's engine, so it needs a profile "
         "measured here"),
        (["engine.num_gpu_blocks=null"], lambda sc: TR.engine_config(sc, None),
         "--set engine.num_gpu_blocks=null: validation needs a finite KV cache"),
    ]:
        with pytest.raises(InputError) as e:
            call(load_scenario(path, flags))
        assert str(e.value).startswith(want), str(e.value)
    with pytest.raises(InputError) as e:   # the file's own value: its line
        TR.engine_config(load_scenario(path), None)
    assert str(e.value).startswith("v.yaml:12: engine.num_gpu_blocks: validation needs")


def speed_probe(cells, max_model_len=300, **kw):
    """A SpeedProbe of ``cells`` on SCENARIO's model (random weights) with the scenario's
    knobs but ``max_model_len``."""
    sc = scenario_from_dict(SCENARIO)
    cfg = {**TR.engine_config(sc, 400), "max_model_len": max_model_len}
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=torch.float32)
    return V.SpeedProbe(model, cfg, cells, **kw)


def test_speed_probe_times_the_cells_against_their_references():
    from calibration.profiler import Cell, decode_lengths
    probe = speed_probe([(Cell("decode", B=4, L=40), 1e-3),
                         (Cell("prefill", n=160, c=32), 4e-3)])
    factor = probe()
    steps = probe.engine.step_records
    # one untimed visit of each cell first, on a fresh engine every probe
    dec = [s for s in steps if s.num_decodes == 4 and not s.prefills][2:]
    # the prefill cell's chunk as the grid's one pass ran it: 160 + 32 // 2 tokens
    # (calibration.profiler.pass_chunk_tokens)
    pre = [s for s in steps if s.prefills and s.prefills[0][1:] == (176, 32)][1:]
    assert len(dec) == 2 * V.PROBE_VISITS and len(pre) == V.PROBE_VISITS
    assert all(s.num_decodes == 0 for s in pre)    # 160 > the scenario's 128-token budget
    # each visit times two consecutive steps of the cell's contexts (sum of decode_lengths,
    # plus the few tokens decoded while the batch was set up): one token more per decode
    base = sum(decode_lengths(4, 40))
    ctx = [s.decode_context_tokens for s in dec]
    assert all(b - a == 4 for a, b in zip(ctx[::2], ctx[1::2]))
    assert all(4 <= c - base <= 16 for c in ctx)
    med = lambda xs: float(np.median([s.duration_ns for s in xs])) / 1e9  # noqa: E731
    assert factor == pytest.approx(np.sqrt(med(dec) / 1e-3 * med(pre) / 4e-3))
    first = probe.engine
    probe()
    assert probe.engine is not first and len(probe.engine.step_records) == len(steps)


def test_the_speed_probe_fits_its_cells_in_max_model_len_whatever_the_scenarios():
    # knobs large enough for every cell: a scenario's max_model_len of 170 takes neither the
    # stepped 176-token chunk of prefill n=160 nor decode B=32 L=256's longest request
    from calibration.profiler import Cell, decode_lengths
    probe = speed_probe([(Cell("decode", B=32, L=256), 1e-3),
                         (Cell("prefill", n=160, c=0), 4e-3)], max_model_len=170)
    assert probe.config["max_model_len"] == max(160 + 32, max(decode_lengths(32, 256)) + 9)
    probe()
    # one untimed visit and PROBE_VISITS timed ones, each one step of the chunk alone
    chunks = [s.prefills[0][1] for s in probe.engine.step_records
              if len(s.prefills) == 1 and s.num_decodes == 0
              and 160 <= s.prefills[0][1] < 192 and s.prefills[0][2] == 0]
    assert chunks == [176] * (1 + V.PROBE_VISITS)
    assert any(s.num_decodes == 32 for s in probe.engine.step_records)


def test_the_speed_probe_visits_decode_cells_at_the_grids_pass_offsets():
    # a profile measured in 2 passes (pass 1 adding 8 KV blocks of context on CPU): the
    # probe's visits alternate the two, so its median compares with the cell's mean over
    # both passes
    from calibration.profiler import Cell, decode_lengths
    probe = speed_probe([(Cell("decode", B=4, L=40), 1e-3),
                         (Cell("prefill", n=160, c=32), 4e-3)], passes=2)
    probe()
    dec = [s for s in probe.engine.step_records if s.num_decodes == 4 and not s.prefills][2:]
    base = sum(decode_lengths(4, 40))
    extra = [c - base for c in (s.decode_context_tokens for s in dec[::2])]
    assert all(4 <= e <= 16 for e in extra[0::2]) and all(132 <= e <= 144 for e in extra[1::2])
    # and a prefill cell at the chunks of the two passes: 160 + 8 and 160 + 24 tokens
    # (pass_chunk_tokens), after the untimed visit (pass 0's)
    chunks = [s.prefills[0][1] for s in probe.engine.step_records
              if s.prefills and s.prefills[0][2] == 32]
    assert chunks == [168] + [168, 184] * (V.PROBE_VISITS // 2)
    # a profile whose grid ran each chunk cell's n (chunks_stepped False): n every visit
    probe = speed_probe([(Cell("prefill", n=160, c=32), 4e-3)], passes=2, stepped=False)
    probe()
    assert {s.prefills[0][1] for s in probe.engine.step_records
            if s.prefills and s.prefills[0][2] == 32} == {160}


def test_host_speed_columns_in_the_table():
    lr = V.LoadResult(load=0.3, rate=1.0, num_requests=10)
    lr.measured = [{"ttft_ms": {"p50": 100.0}}]
    lr.predicted = [{"ttft_ms": {"p50": 80.0}}]
    lr.adjusted = [{"ttft_ms": {"p50": 96.0}}]
    row = {r["figure"]: r for r in lr.table()}["TTFT p50"]
    assert row["error"]["mean"] == pytest.approx(-0.20)
    assert row["adjusted_error"]["mean"] == pytest.approx(-0.04)


def test_served_again_in_band_moves_the_band_onto_the_first_serving():
    # prediction 80, band [76, 88] (-5%, +10% of it); first serving 100 -> moved band
    # [95, 110]: a second serving of 108 lies in it, 94 does not
    def load(again):
        lr = V.LoadResult(load=0.9, rate=1.0, num_requests=10)
        lr.measured, lr.predicted = [{"ttft_ms": {"p50": 100.0}}], [{"ttft_ms": {"p50": 80.0}}]
        lr.band_low, lr.band_high = [{"ttft_ms": {"p50": 76.0}}], [{"ttft_ms": {"p50": 88.0}}]
        lr.again = [{"ttft_ms": {"p50": again}}]
        return {r["figure"]: r for r in lr.table()}
    assert load(108.0)["TTFT p50"]["again_in_band"] is True
    assert load(94.0)["TTFT p50"]["again_in_band"] is False
    assert load(108.0)["TTFT p50"]["in_band"] is False          # 100 is outside [76, 88]
    assert "again_in_band" not in load(108.0)["TTFT p90"]      # not a band figure
    assert load(108.0)["TPOT p50"]["again_in_band"] is None     # no figures: undefined


def test_serving_again_reports_the_engines_difference_from_itself(tmp_path):
    sc = scenario_from_dict(SCENARIO)
    base = build_cost_model(sc)
    cfg = TR.engine_config(sc, base.num_gpu_blocks)
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=torch.float32)
    runs = []

    def timed(specs, label):
        runs.append((label, TR.run_engine(model, cfg, specs)))
        return runs[-1][1]

    res = V.measure_fidelity(sc, base, timed, loads=[0.5], replications=1,
                             seconds_per_load=0.5, saturation_requests=8, front_end=False,
                             progress=lambda m: None, engine_name="the engine", again=True)
    assert [label for label, _ in runs] == ["saturation", "load 0.5 r1", "load 0.5 r1 again"]
    assert len(runs[1][1].records) == V.MIN_REQUESTS == 10   # a load serves 10 at least
    first, second = (TR.engine_result(r).summary for _, r in runs[1:])
    rows = {r["figure"]: r for r in res["loads"][0]["table"]}
    for name, key in (("TTFT p50", "ttft_ms"), ("E2EL p99", "e2el_ms")):
        a, b = first[key]["p50" if "p50" in name else "p99"], \
            second[key]["p50" if "p50" in name else "p99"]
        assert rows[name]["again_error"]["mean"] == pytest.approx((b - a) / a)
    md = VR.markdown_table(res)
    assert "| served again: difference |" in md and "run-to-run spread" in md
    # the saturation run's timing replay is reported beside the loads'
    verdict = VR._timing_verdict(res["saturation"]["timing"])
    assert f"timing replay (engine step durations): saturation: {verdict}; load 0.5: " in md
    assert "\n- TTFT: time to first token: first token time − arrival time" in md
    html = (tmp_path / "v" / "validation.html")
    VR.write_outputs({**res, "meta": {"scenario": "a<b&c"}}, tmp_path / "v")
    # the JSON holds the per-request figures behind the plots: the first serving's TTFTs
    import json
    written = json.loads((tmp_path / "v" / "validation.json").read_text())
    ttft = TR.engine_result(runs[1][1]).requests["ttft_ms"].tolist()
    assert written["cdf"][0]["measured_ttft_ms"] == pytest.approx(ttft)
    text = html.read_text()
    assert "&lt; 1: priced too fast" in text and "< 1: priced" not in text
    assert "Validation: a&lt;b&amp;c</h1>" in text
    # the markdown opens with the same facts as the HTML, then the table
    written = (tmp_path / "v" / "validation.md").read_text()
    # (the name as typed: escaped for markdown, which passes HTML through)
    assert written.startswith("# Validation: a\\<b\\&c\n\n- scenario: a\\<b\\&c\n\n")
    assert md in written and written.endswith(
        "![load 0.5: TTFT, TPOT and E2EL CDFs, measured vs predicted](cdf_load_0.5.png)\n")
    # one renderer for both: the HTML has the table's rows as cells, the plot inline
    assert "<td>TTFT p50</td>" in text and text.count("data:image/png;base64,") == 1
    from fnmatch import fnmatch

    from simulator.files import REPORT_FILES
    names = [f.name for f in (tmp_path / "v").iterdir()]
    assert all(any(fnmatch(n, pat) for pat in REPORT_FILES["validate"]) for n in names), names
    assert "served again" not in VR.markdown_table(V.measure_fidelity(
        sc, base, timed, loads=[0.5], replications=1, seconds_per_load=0.5,
        saturation_requests=8, front_end=False, progress=lambda m: None,
        engine_name="the engine"))


def test_loads_interleave_across_replications():
    # a shared host's slow phase must fall on one replication of several loads, not on
    # every replication of one load: runs go r1 at each load, then r2 at each load
    sc = scenario_from_dict(SCENARIO)
    base = build_cost_model(sc)
    cfg = TR.engine_config(sc, base.num_gpu_blocks)
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=torch.float32)
    runs = {}

    def timed(specs, label):
        runs[label] = TR.run_engine(model, cfg, specs)
        return runs[label]

    # half a second of either load brings under 12 requests: each serves 12 (min_requests)
    res = V.measure_fidelity(sc, base, timed, loads=[0.3, 0.6], replications=2,
                             seconds_per_load=0.5, saturation_requests=8, front_end=False,
                             progress=lambda m: None, engine_name="the engine",
                             min_requests=12)
    assert list(runs) == ["saturation", "load 0.3 r1", "load 0.6 r1", "load 0.3 r2",
                          "load 0.6 r2"]
    assert [len(run.records) for run in runs.values()] == [8, 12, 12, 12, 12]
    assert [c["load"] for c in res["cdf"]] == [0.3, 0.6]
    for out in res["loads"]:      # each load's table holds its own two runs, whatever order
        x = out["load"]
        own = [TR.engine_result(runs[f"load {x:g} r{r}"]).summary["e2el_ms"]["p50"]
               for r in (1, 2)]
        row = {r["figure"]: r for r in out["table"]}["E2EL p50"]
        assert row["measured"]["mean"] == pytest.approx(sum(own) / 2)
        assert row["measured"]["n"] == 2
    # the run's request lists, simulated again from its record alone, give its predictions
    again = V.predict_again(json.loads(json.dumps(res)), sc)
    assert again["saturation_rps"] == res["saturation"]["predicted_rps"]
    for out, sums in zip(res["loads"], again["loads"], strict=True):
        for label, path in V.FIGURES:
            row = {r["figure"]: r for r in out["table"]}[label]
            got = [V._spread([summary_at(s, path)]) for s in sums]   # as the table keeps it
            assert [g and g["each"][0] for g in got] == (row["predicted"] or {}).get(
                "each", [None] * len(sums)), label


def _read_only(*args, **kwargs):
    raise OSError(30, "Read-only file system")


@pytest.mark.parametrize("flags, field", [(["--out", "FILE/x"], "is a file, not a folder"),
                                          (["--seconds", "-1"], "--seconds"),
                                          (["--seconds", "nan"], "--seconds"),
                                          (["--seconds", "1e12"], "in (0, 3600]"),
                                          (["--saturation-requests", "4"],
                                           "--saturation-requests: 5 to 100000"),
                                          (["--replications", "101"], "1 to 100"),
                                          (["--min-requests", "0"],
                                           "--min-requests: 1 to 100000 requests per load, "
                                           "got 0"),
                                          (["--loads", "1e-9"], "in [0.01, 1.5]"),
                                          (["--out", "RO/x"], "cannot write there"),
                                          (["--set", "engine.max_num_seqs=4,8"],
                                           "servesim validate takes one value per key: to "
                                           "run each of 4,8 use one servesim validate per "
                                           "value")])
def test_validate_refuses_bad_flags_before_serving(flags, field, tmp_path, capsys,
                                                   monkeypatch):
    from simulator.cli import main
    import yaml
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "v"
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "RO").mkdir()
    if "RO/x" in flags:   # a read-only folder (root ignores permission bits, so say so)
        monkeypatch.setattr(files.tempfile, "TemporaryFile", _read_only)
    flags = [str(tmp_path / a) if a.startswith(("FILE", "RO")) else a for a in flags]
    own_out = [] if "--out" in flags else ["--out", str(out)]   # a flag may be given once
    assert main(["validate", "--scenario", str(y), "--no-quiet-wait", *own_out,
                 *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
    assert not out.exists()


def test_validate_says_its_progress_on_stderr(tmp_path, capsys, monkeypatch):
    # progress on stdout met a closed reader (| head) at the first line and ended the run
    # there, before any report was written, with exit status 0
    from simulator.cli import main
    from simulator.errors import InputError
    import yaml
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump(SCENARIO))

    def served(*args, progress, **kwargs):
        progress("load 0.5: 12 requests")
        raise InputError("stopped here")
    monkeypatch.setattr(V, "validate", served)
    assert main(["validate", str(y), "--no-quiet-wait", "--out", str(tmp_path / "v")]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.splitlines() == ["load 0.5: 12 requests", "servesim: error: stopped here"]


def test_a_bad_profile_flag_is_named_as_typed(tmp_path, capsys):
    from simulator.cli import main
    import yaml
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump({**SCENARIO, "hardware": {"profile": "h100-sxm"}}))
    out = tmp_path / "v"
    assert main(["validate", "--scenario", str(y), "--profile", "no-such", "--no-quiet-wait",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "servesim: error: --profile no-such: 'no-such' is neither a catalog GPU"), err
    assert not out.exists()
    # an empty --profile is refused, not taken as none given
    assert main(["validate", "--scenario", str(y), "--profile", "", "--no-quiet-wait",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "servesim: error: --profile '': empty: give a profile name or the path to one "
        "(servesim profiles lists them)"]
    assert not out.exists()


def test_the_scenario_is_positional_or_flagged_once(tmp_path, capsys):
    """Like every other command, validate takes the scenario positionally; --scenario too."""
    from simulator.cli import main
    import yaml
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "v"
    for argv, words in (
            ([str(y), "--scenario", str(y)], "give the scenario once"),
            ([], "a scenario YAML is required"),
            # an empty path is one, as run says
            ([""], "scenario: empty path (give a scenario YAML file)"),
            (["--scenario", ""], "scenario: empty path"),
            (["", "--scenario", str(y)], "give the scenario once"),
            ([str(y), "--loads", "0.3,high"], "--loads: '0.3,high'"),   # parsed: got past it
            (["--scenario", str(y), "--loads", "0.3,high"], "--loads: '0.3,high'")):
        assert main(["validate", *argv, "--no-quiet-wait", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)
    assert not out.exists()


def test_timing_verdict_words():
    t = {"ok": False, "steps_engine": 10, "step_mismatches": 0, "prefix_hits_equal": True,
         "preemptions_equal": True, "handback_max_ms": 1.2, "idle_wake_max_ms": 7.26,
         "late_wakes": 0, "max_abs_diff_ms": {"token": 1.4, "finish": 0.1}}
    assert VR._timing_verdict(t) == (
        "same batches, hits and preemptions in all 10 steps; timestamps within 1.400 ms, "
        "over the 1 ms tolerance (the engine took up to 1.200 ms to hand a step's tokens "
        "back)")
    assert VR._timing_verdict({**t, "ok": True}) == "exact (10 steps, max |Δt| 1.400 ms)"
    assert VR._timing_verdict({**t, "step_mismatches": 3}) == (
        "NOT exact (10 engine steps, 3 differ, max |Δt| 1.400 ms)")
    assert VR._timing_verdict({**t, "step_mismatches": 3, "late_wakes": 2}).endswith(
        "; an idle engine woke 7.260 ms late, after a second arrival, 2 time(s): it batched "
        "them, the simulator started at the first)")


def test_step_cost_by_kind_is_pooled_over_replications_in_the_table():
    lr = V.LoadResult(load=0.6, rate=1.0, num_requests=10)
    lr.measured = [{"ttft_ms": {"p50": 100.0}}] * 2
    lr.predicted = [{"ttft_ms": {"p50": 90.0}}] * 2

    def timing(by_kind):
        return {"step_cost_ratio": 1.0, "ok": True, "steps_engine": 10,
                "max_abs_diff_ms": {"arrival": 0.0}, "step_cost_by_kind": by_kind}

    # prefill: (80 + 100) / (100 + 100) = 0.9 over 3 steps; decode 50 / 40 = 1.25
    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05},
              "loads": [{"load": 0.6, "rate": 1.0, "num_requests": 10, "table": lr.table(),
                         "timing": [
                  timing({"prefill": [80, 100, 1], "decode": [50, 40, 7]}),
                  timing({"prefill": [100, 100, 2]})]}]}
    md = VR.markdown_table(result)
    assert ("the same by step kind, prefill-only / mixed / decode-only (steps), over each "
            "load's replications: load 0.6: ×0.900 (3) / – / ×1.250 (7)") in md


def test_runs_where_the_probe_does_not_explain_the_mispricing_are_named():
    # steps ran 1.25x their price (ratio 0.8) while the probe said 1.25x slower: explained
    # (0.8 * 1.25 = 1); 0.8 with a probe of 1.0 is not (0.8 off by 20% > 10%)
    lr = V.LoadResult(load=0.6, rate=1.0, num_requests=10)
    lr.measured = [{"ttft_ms": {"p50": 100.0}}] * 3
    lr.predicted = [{"ttft_ms": {"p50": 90.0}}] * 3

    def timing(ratio):   # an exact timing replay whose steps were priced ×ratio
        return {"step_cost_ratio": ratio, "ok": True, "steps_engine": 10,
                "max_abs_diff_ms": {"arrival": 0.0}}

    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05,
                             "host_speed": 1.25, "adjusted_rps": 2.0, "adjusted_error": 0.0,
                             "timing": timing(0.8)},
              "loads": [{"load": 0.6, "rate": 1.0, "num_requests": 10, "table": lr.table(),
                         "timing": [timing(0.8), timing(1.2), timing(None)],
                         "host_speed": [1.0, 0.95, 1.0]}]}
    apart = VR.probe_disagreements(result)
    assert [label for label, _ in apart] == ["load 0.6 r1", "load 0.6 r2"]
    assert [v for _, v in apart] == pytest.approx([0.8, 1.14])
    md = VR.markdown_table(result)
    assert ("probe and served steps disagree by more than 10% (priced/measured × probe, 1 "
            "when the probe's host speed explains the mispricing) in load 0.6 r1: ×0.800; "
            "load 0.6 r2: ×1.140: the prediction at host speed is not reliable there.") in md
    for r in result["loads"][0]["timing"][:2]:
        r["step_cost_ratio"] = 1.0
    assert VR.probe_disagreements(result) == [] and "disagree" not in VR.markdown_table(result)


def test_table_says_which_figures_the_band_is_judged_for():
    lr = V.LoadResult(load=0.3, rate=1.0, num_requests=10)
    lr.measured = [{"ttft_ms": {"p50": 100.0, "p90": 150.0}}]
    lr.predicted = [{"ttft_ms": {"p50": 80.0, "p90": 140.0}}]
    rows = {r["figure"]: r for r in lr.table()}
    rows["TTFT p50"]["in_band"] = False
    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05},
              "loads": [{"load": 0.3, "rate": 1.0, "num_requests": 10,
                         "table": list(rows.values()), "timing": []}]}
    md = VR.markdown_table(result).splitlines()
    assert next(x for x in md if x.startswith("| 0.3 | TTFT p50 |")).endswith("| no |")
    assert "TTFT, TPOT, ITL and E2EL in ms (as vllm bench serve); error = (predicted − " \
        "measured) / measured" in "\n".join(md)
    assert next(x for x in md if x.startswith("| 0.3 | TTFT p90 |")).endswith("|  |")
    assert any(x.startswith("'in MAPE band' is judged for TTFT p50, TTFT p99, TPOT p50")
               for x in md)


def test_bad_flags_are_named_before_a_missing_torch(tmp_path, capsys, monkeypatch):
    # a planner-only install (no torch) still hears what is wrong with its flags first
    import importlib.util

    import yaml
    from simulator.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    y = tmp_path / "s.yaml"
    y.write_text(yaml.safe_dump(SCENARIO))
    args = ["validate", "--scenario", str(y), "--no-quiet-wait", "--out", str(tmp_path / "v")]
    assert main([*args, "--seconds", "1e12"]) == 2
    assert "--seconds" in capsys.readouterr().err
    assert main(args) == 2
    assert "needs torch" in capsys.readouterr().err


def test_a_bad_bfloat16_scenario_is_one_line_without_the_emulation_warning(tmp_path, capsys):
    # the error is the one line, without the bfloat16 warning (emulated on CPUs without
    # AVX512-BF16) before it
    from simulator.cli import main
    y = tmp_path / "s.yaml"
    y.write_text("model: llama-tiny-56m\ndtype: bfloat16\n"
                 "hardware: {step_time: {constant_s: 0.01}}\n"
                 "workload: {num_requests: 20, arrival: {process: poisson, rate: 2},\n"
                 "  prompt_tokens: {dist: fixed, value: 50},\n"
                 "  output_tokens: {dist: fixed, value: 5}}\n")
    out = tmp_path / "v"
    assert main(["validate", str(y), "--no-quiet-wait", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["servesim: error: s.yaml: engine.num_gpu_blocks: validation needs a finite "
                   "KV cache (set it, or use a profile that records one)"]
    assert not out.exists()


def test_model_dir_without_the_vllm_backend_and_an_empty_scenario_are_refused(capsys):
    from simulator.cli import main
    assert main(["validate", "scenarios/cpu_tiny.yaml", "--model-dir", "/tmp/m"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "servesim: error: --model-dir: only with --backend vllm (servesim's engine builds the "
        "scenario's model with random weights)"]
    assert main(["run", ""]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "servesim: error: scenario: empty path (give a scenario YAML file)"]


def test_a_saturation_burst_under_twice_max_num_seqs_is_warned_of():
    # max_num_seqs 8: 15 requests run as two batches draining (no queue to sustain), 16 keep
    # one batch's worth waiting throughout the first
    sc = scenario_from_dict(SCENARIO)
    assert V.saturation_warning(sc, None) is None and V.saturation_warning(sc, 16) is None
    said = V.saturation_warning(sc, 15)
    assert said.startswith("--saturation-requests 15 is under twice max_num_seqs (8)")
    assert "(default 32, 4 × max_num_seqs)" in said


def test_the_reports_facts_read_as_knobs_and_rounded_figures(tmp_path):
    # engine knobs as k=v, fractions rounded, not a Python dict to 17 digits
    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05},
              "loads": [], "meta": {"scenario": "s", "engine_knobs": {"block_size": 128,
                                                                      "watermark": 0.0123456},
                                    "heldout_mape": 0.09369114258886693}}
    VR.write_outputs(result, tmp_path / "v")
    md = (tmp_path / "v" / "validation.md").read_text()
    assert "- engine_knobs: block_size=128, watermark=0.01235\n" in md
    assert "- heldout_mape: 0.09369\n" in md
    assert "<li>engine_knobs: block_size=128, watermark=0.01235</li>" in (
        tmp_path / "v" / "validation.html").read_text()


def test_a_measured_front_end_enters_the_saturation_prediction_too(monkeypatch):
    # --front-end adds the engine's measured time between steps to the saturation's
    # prediction, as to the loads'
    sc = scenario_from_dict(SCENARIO)
    base = build_cost_model(sc)
    cfg = TR.engine_config(sc, base.num_gpu_blocks)
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=torch.float32)
    front, simulated = [], V.simulate_specs

    def spy(scenario, specs, cost):
        front.append(getattr(cost, "front_end_ns", 0))
        return simulated(scenario, specs, cost)
    monkeypatch.setattr(V, "simulate_specs", spy)
    runs = []

    def timed(specs, label):
        runs.append(TR.run_engine(model, cfg, specs))
        return runs[-1]
    V.measure_fidelity(sc, base, timed, loads=[0.5], replications=1, seconds_per_load=0.5,
                       saturation_requests=8, front_end=True, progress=lambda m: None,
                       engine_name="the engine")
    gaps = runs[0].front_end_gaps_ns()   # the saturation run's, as validate measures it
    assert gaps.size and int(gaps.mean()) > 0
    # the saturation's simulation first, then the load's: both with the same front end
    assert front[0] == front[-1] == int(gaps.mean())


def test_the_mape_band_holds_its_own_prediction():
    # TPOT p99 188 ms predicted, 182.7 at x(1 - MAPE), 178.9 at x(1 + MAPE): the band
    # holds the prediction itself (the two simulations alone span [178.9, 182.7])
    lr = V.LoadResult(load=0.9, rate=1.0, num_requests=10)
    lr.measured = [{"tpot_ms": {"p99": 188.0}}, {"tpot_ms": {"p99": 100.0}}]
    lr.predicted = [{"tpot_ms": {"p99": 188.0}}, {"tpot_ms": {"p99": 104.0}}]
    lr.band_low = [{"tpot_ms": {"p99": 182.7}}, {"tpot_ms": {"p99": 101.0}}]
    lr.band_high = [{"tpot_ms": {"p99": 178.9}}, {"tpot_ms": {"p99": 107.0}}]
    row = {r["figure"]: r for r in lr.table()}["TPOT p99"]
    assert row["in_band"] is False   # replication 2: 100 below its band [101, 107]
    lr.measured[1] = {"tpot_ms": {"p99": 101.5}}
    row = {r["figure"]: r for r in lr.table()}["TPOT p99"]
    assert row["in_band"] is True    # 188 in [178.9, 188]; 101.5 in [101, 107]
    # the report gives the extent of the replications' bands: 101 to 188
    assert [row["band"][0]["min"], row["band"][1]["max"]] == [101.0, 188.0]


def test_a_band_verdict_says_how_many_replications_it_judged():
    # three replications: 188 in [178.9, 188]; 100 below [101, 107]; the third's band
    # simulations have no p99 (too few tokens), so it is not judged
    lr = V.LoadResult(load=0.9, rate=1.0, num_requests=10)
    lr.measured = [{"tpot_ms": {"p99": 188.0}}, {"tpot_ms": {"p99": 100.0}},
                   {"tpot_ms": {"p99": 50.0}}]
    lr.predicted = [{"tpot_ms": {"p99": 188.0}}, {"tpot_ms": {"p99": 104.0}},
                    {"tpot_ms": {"p99": 50.0}}]
    lr.band_low = [{"tpot_ms": {"p99": 182.7}}, {"tpot_ms": {"p99": 101.0}}, {}]
    lr.band_high = [{"tpot_ms": {"p99": 178.9}}, {"tpot_ms": {"p99": 107.0}}, {}]
    lr.again = [{"tpot_ms": {"p99": 190.0}}, {"tpot_ms": {"p99": 90.0}},
                {"tpot_ms": {"p99": 50.0}}]
    row = {r["figure"]: r for r in lr.table()}["TPOT p99"]
    assert row["in_band"] is False and row["in_band_count"] == [1, 2, 3]
    # every replication's figures and band edges are kept, in order, to be judged again
    assert row["measured"]["each"] == [188.0, 100.0, 50.0]
    assert row["band"][0]["each"] == [178.9, 101.0, None]
    assert row["band"][1]["each"] == [188.0, 107.0, None]
    # served again: 190 above [178.9, 188] x 188/188; 90 below [101, 107] x 100/104
    assert row["again_in_band"] is False and row["again_in_band_count"] == [0, 2, 3]
    result = {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                             "error": 0.05},
              "loads": [{"load": 0.9, "rate": 1.0, "num_requests": 10, "table": [row],
                         "timing": []}]}
    line = next(x for x in VR.markdown_table(result).splitlines()
                if x.startswith("| 0.9 | TPOT p99"))
    assert "| no, 1 of 2 judged of 3 (101–188) |" in line
    assert "| no, 0 of 2 judged of 3 |" in line
    # one replication: the bare word
    one = V.LoadResult(load=0.9, rate=1.0, num_requests=10)
    one.measured, one.predicted = lr.measured[:1], lr.predicted[:1]
    one.band_low, one.band_high = lr.band_low[:1], lr.band_high[:1]
    row = {r["figure"]: r for r in one.table()}["TPOT p99"]
    assert row["in_band_count"] == [1, 1, 1]
    result["loads"][0]["table"] = [row]
    line = next(x for x in VR.markdown_table(result).splitlines()
                if x.startswith("| 0.9 | TPOT p99"))
    assert "| yes (178.9–188) |" in line


def test_target_verdicts_read_the_mean_and_every_replication():
    # load 0.3, two replications: TTFT p50 +8% and -12% (mean -2%), TPOT p50 +5% twice;
    # TTFT p99 -25% and +25% (mean 0); E2EL undefined (not judged)
    lo = V.LoadResult(load=0.3, rate=1.0, num_requests=10)
    lo.measured = [{"ttft_ms": {"p50": 100.0, "p99": 200.0}, "tpot_ms": {"p50": 10.0}}] * 2
    lo.predicted = [{"ttft_ms": {"p50": 108.0, "p99": 150.0}, "tpot_ms": {"p50": 10.5}},
                    {"ttft_ms": {"p50": 88.0, "p99": 250.0}, "tpot_ms": {"p50": 10.5}}]
    # load 0.9: TTFT p50 100 in [90, 110], 145 below [150, 170]: the means 122.5 in
    # [120, 140]; TTFT p99 300 below [310, 330] in both
    hi = V.LoadResult(load=0.9, rate=2.0, num_requests=10)
    hi.measured = [{"ttft_ms": {"p50": 100.0, "p99": 300.0}},
                   {"ttft_ms": {"p50": 145.0, "p99": 300.0}}]
    hi.predicted = [{"ttft_ms": {"p50": 100.0, "p99": 320.0}},
                    {"ttft_ms": {"p50": 160.0, "p99": 320.0}}]
    hi.band_low = [{"ttft_ms": {"p50": 90.0, "p99": 310.0}},
                   {"ttft_ms": {"p50": 150.0, "p99": 310.0}}]
    hi.band_high = [{"ttft_ms": {"p50": 110.0, "p99": 330.0}},
                    {"ttft_ms": {"p50": 170.0, "p99": 330.0}}]
    result = {"saturation": {"error": 0.06},
              "loads": [{"load": lr.load, "table": lr.table()} for lr in (lo, hi)]}
    lines = VR.target_verdicts(result, VR.Targets(0.05, 0.10, 0.20, percentile_loads=(0.3,)))
    assert lines == [
        "saturation throughput +6.0% (target ±5%): NOT met",
        "load 0.3 p50s of TTFT, TPOT, E2EL (target ±10%): mean over replications worst "
        "+5.0% (TPOT p50): met; every replication worst -12.0% (TTFT p50, r2): NOT met",
        "load 0.3 p99s of TTFT, TPOT, E2EL (target ±20%): mean over replications worst "
        "+0.0% (TTFT p99): met; every replication worst -25.0% (TTFT p99, r1): NOT met",
        "load 0.9 MAPE band (2 figures): the mean measured value inside the mean band in 1 "
        "of 2 (TTFT p99 300 outside [310, 330]); every replication inside its own band in 0 "
        "of 2"]
    # every load judged on percentiles (the vLLM targets): 0.9's TTFT p50 +0% and +10.3%
    lines = VR.target_verdicts(result, VR.Targets(0.10, 0.15, 0.25))
    assert lines[0] == "saturation throughput +6.0% (target ±10%): met"
    assert lines[3] == (
        "load 0.9 p50s of TTFT, TPOT, E2EL (target ±15%): mean over replications worst "
        "+5.2% (TTFT p50): met; every replication worst +10.3% (TTFT p50, r2): met")


@pytest.mark.parametrize("script", [["benchmarks/fidelity.py"],
                                    ["-m", "calibration.vllm.fidelity", "--profile", "p"]])
@pytest.mark.parametrize("loads, said", [
    ("０.３", "--loads: '０.３' is not a number in the digits 0-9 (write 0.3)"),
    ("0.3,0.3", "--loads: 0.3 given twice"),
    ("0.3,x", "--loads: '0.3,x' is not a comma-separated list of fractions"),
    ("1.6", "--loads: fractions of saturation in [0.01, 1.5], got 1.6"),
    ("nan", "--loads: fractions of saturation in [0.01, 1.5], got nan")])
def test_fidelity_scripts_read_loads_as_validate_does(script, loads, said):
    # float() read ０.３ and served a load given twice again with the same seeds
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, *script, "--loads", loads], cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[-1].split(": error: ", 1)[1].startswith(said)


@pytest.mark.parametrize("script, args, line", [
    (["benchmarks/fidelity.py"], ["--bogus"],
     "benchmarks/fidelity.py: error: unrecognized arguments: --bogus (see python "
     "benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--replications", "x"],
     "benchmarks/fidelity.py: error: --replications: 'x' is not a whole number in digits "
     "— its help: workloads per load, each with its own seed (default 3; 1 to 100) (see "
     "python benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--loads", "2"],
     "benchmarks/fidelity.py: error: --loads: fractions of saturation in [0.01, 1.5], got "
     "2 (see python benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--replications", "0"],
     "benchmarks/fidelity.py: error: --replications: 1 to 100, got 0 (see python "
     "benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--min-requests", "0"],
     "benchmarks/fidelity.py: error: --min-requests: 1 to 100000 requests per load, got 0 "
     "(see python benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--seconds", "inf"],
     "benchmarks/fidelity.py: error: --seconds: seconds of arrivals per load, in (0, 3600]; "
     "got inf (see python benchmarks/fidelity.py --help)"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "p", "--replications", "101"],
     "calibration.vllm.fidelity: error: --replications: 1 to 100, got 101 (see python -m "
     "calibration.vllm.fidelity --help)"),
    (["benchmarks/fidelity.py"], ["--calibrate-attempts", "0"],
     "benchmarks/fidelity.py: error: --calibrate-attempts: a whole number >= 1, got 0 (see "
     "python benchmarks/fidelity.py --help)"),
    (["benchmarks/shared_prefix_reads.py"], ["--profile", "p.yaml", "--rates", "1"],
     "benchmarks/shared_prefix_reads.py: error: --rates: give 2 rates > 0 (req/s), one per "
     "workload (see python benchmarks/shared_prefix_reads.py --help)"),
    # --only twice, before every other check: a script that let it pass would stop at the
    # bad --calibrate-attempts (or the missing profile p), never calibrating
    (["benchmarks/fidelity.py"], ["--only", "poisson-chat", "--only", "shared-system-prompt",
                                  "--only", "poisson-chat", "--calibrate-attempts", "0"],
     "benchmarks/fidelity.py: error: --only: poisson-chat given twice (see python "
     "benchmarks/fidelity.py --help)"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "p", "--only", "poisson-chat",
                                           "--only", "poisson-chat"],
     "calibration.vllm.fidelity: error: --only: poisson-chat given twice (see python -m "
     "calibration.vllm.fidelity --help)"),
    # every flag before anything runs: the output file, attempts, the block size named as
    # given (it reaches the scenario as an override), a projected profile, a model too big
    (["-m", "calibration.vllm.fidelity"], ["--profile", "p", "--attempts", "0"],
     "calibration.vllm.fidelity: error: --attempts: a whole number >= 1, got 0 (see python -m "
     "calibration.vllm.fidelity --help)"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "p", "--out", "/no-such-folder/x.md"],
     "calibration.vllm.fidelity: error: --out /no-such-folder/x.md: a file path in a folder "
     "that exists and can be written (see python -m calibration.vllm.fidelity --help)"),
    (["-m", "calibration.vllm.fidelity"],
     ["--profile", "simulator/profiles/cpu-llama-tiny-56m-bfloat16.yaml", "--block-size", "7"],
     "calibration.vllm.fidelity: error: --block-size 7: must be 1, 8, 16, 32, 64 or 128, as "
     "vLLM's --block-size (got 7)"),
    (["-m", "calibration.vllm.fidelity"],   # the profile before vLLM is looked for
     ["--profile", "simulator/profiles/cpu-llama-tiny-56m-float32.yaml", "--scenario",
      "scenarios/multi_turn.yaml"],
     "calibration.vllm.fidelity: error: multi_turn.yaml:17: workload.sessions: validate serves "
     "open-loop arrivals (poisson, gamma or constant) at rates set from the measured "
     "saturation: give the scenario one of those, and no sessions, trace or max_concurrency"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "", "--out", "/dev/null"],
     "calibration.vllm.fidelity: error: --profile: empty path (give a profile from calibrate "
     "--backend vllm) (see python -m calibration.vllm.fidelity --help)"),
    (["benchmarks/fidelity.py"], ["--calibrate-repeats", "101"],   # calibrate's --repeats
     "benchmarks/fidelity.py: error: --calibrate-repeats: 1 to 100, got 101 (see python "
     "benchmarks/fidelity.py --help)"),
    (["benchmarks/fidelity.py"], ["--scenario", "scenarios/chat.yaml", "--no-calibrate"],
     "benchmarks/fidelity.py: error: chat.yaml:9: hardware.profile: validate serves the "
     "scenario on this machine's engine, so it needs a profile measured here (servesim "
     "calibrate) or an inline step_time, not a projection (projected: roofline h100-sxm, "
     "tensor_parallel=1, default efficiencies (MBU 0.7, MFU 0.5))"),
    (["-m", "calibration.vllm.fidelity"], ["--bogus"],
     "calibration.vllm.fidelity: error: the following arguments are required: --profile "
     "(see python -m calibration.vllm.fidelity --help)"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "p", "--bogus"],
     "calibration.vllm.fidelity: error: unrecognized arguments: --bogus (see python -m "
     "calibration.vllm.fidelity --help)"),
    # every benchmark script's flags, as servesim's own
    (["benchmarks/sim_speed.py"], ["--requests", "-5"],
     "benchmarks/sim_speed.py: error: --requests: a whole number >= 1, got -5 (see python "
     "benchmarks/sim_speed.py --help)"),
    (["benchmarks/policy_step_cost.py"], ["--cycles", "0"],
     "benchmarks/policy_step_cost.py: error: --cycles: a whole number >= 1, got 0 (see python "
     "benchmarks/policy_step_cost.py --help)"),
    (["benchmarks/fit_traces.py"], ["--traces", "/no-such-folder"],
     "benchmarks/fit_traces.py: error: --traces /no-such-folder: not a folder (see python "
     "benchmarks/fit_traces.py --help)"),
    (["benchmarks/plan_speed.py"], ["--workers", "0"],
     "benchmarks/plan_speed.py: error: --workers: a whole number >= 1, got 0 (see python "
     "benchmarks/plan_speed.py --help)"),
    (["benchmarks/vs_vidur.py"], ["--requests", "10,-5"],
     "benchmarks/vs_vidur.py: error: --requests: whole numbers >= 1, comma-separated, got "
     "'10,-5' (see python benchmarks/vs_vidur.py --help)"),
    (["benchmarks/warmup_effect.py"], ["--rounds", "-1"],   # it rewrote warmup.md empty
     "benchmarks/warmup_effect.py: error: --rounds: '-1': give a whole number >= 1 (see "
     "python benchmarks/warmup_effect.py --help)"),
    (["benchmarks/host_drift.py"], ["--seconds", "-1"],
     "benchmarks/host_drift.py: error: --seconds: '-1': give a number of seconds > 0 and <= "
     "3600 (see python benchmarks/host_drift.py --help)"),
    (["benchmarks/engine_speed.py"], ["--bandwidth", "nan"],   # it started the run
     "benchmarks/engine_speed.py: error: --bandwidth: a number of GB/s > 0, got nan (see "
     "python benchmarks/engine_speed.py --help)"),
    (["benchmarks/vllm_scheduler_diff.py"], ["--cases", "-1"],   # before vLLM is looked for
     "benchmarks/vllm_scheduler_diff.py: error: --cases: '-1': give a whole number >= 1 (see "
     "python benchmarks/vllm_scheduler_diff.py --help)"),
    (["benchmarks/kv_layout.py"], ["--scenario", "/no-such.yaml"],
     "benchmarks/kv_layout.py: error: /no-such.yaml: scenario file not found (see python "
     "benchmarks/kv_layout.py --help)"),
    (["benchmarks/reread_ablation.py"], ["--reports", "/no-such-folder"],
     "benchmarks/reread_ablation.py: error: --reports /no-such-folder: not a folder "
     "(benchmarks/fidelity.py writes reports/fidelity) (see python "
     "benchmarks/reread_ablation.py --help)"),
    (["benchmarks/reread_ablation.py"], ["--reports", "benchmarks"],
     "benchmarks/reread_ablation.py: error: --reports benchmarks: no "
     "shared-system-prompt/validation.json with its profile/ (run benchmarks/fidelity.py "
     "first) (see python benchmarks/reread_ablation.py --help)")])
def test_a_fidelity_scripts_bad_flag_is_one_line(script, args, line):
    # servesim's parser: one error line and exit 2, not argparse's usage block before it
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, *script, *args], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [line]


def test_fidelity_refuses_a_model_it_could_not_calibrate_before_measuring():
    # it printed its first workload's header, then calibrate refused the model in flags
    # the user never gave (--model, --kv-cache-memory)
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "benchmarks/fidelity.py", "--scenario",
                        "scenarios/chat.yaml"], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    [line] = p.stderr.splitlines()
    assert line.startswith("benchmarks/fidelity.py: error: chat.yaml:7: model: each workload "
                           "is calibrated first (servesim calibrate --device cpu), and it "
                           "cannot be here: --model llama-3.1-8b: its weights")


def test_fidelity_workloads_named_twice_are_refused():
    # --only X --only X measured X twice with the same seeds and wrote its section twice
    from calibration.vllm.fidelity import WORKLOADS, chosen_workloads
    from simulator.errors import InputError

    assert chosen_workloads(None) == list(WORKLOADS)
    assert chosen_workloads(["shared-system-prompt", "poisson-chat"]) == [
        "shared-system-prompt", "poisson-chat"]
    with pytest.raises(InputError, match=r"^--only: poisson-chat given twice$"):
        chosen_workloads(["poisson-chat", "shared-system-prompt", "poisson-chat"])


def test_vllm_fidelity_script_runs_by_its_path(tmp_path):
    # python calibration/vllm/fidelity.py failed on its relative import (no package); --help
    # and a missing profile need no vLLM
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "calibration" / "vllm" / "fidelity.py"
    p = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith("usage: python -m calibration.vllm.fidelity")
    p = subprocess.run([sys.executable, str(script), "--profile", "no-such-profile"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"calibration.vllm.fidelity: error: --profile no-such-profile: "
        f"{tmp_path / 'no-such-profile'}: profile file not found"]


@pytest.mark.parametrize("script, args, line", [
    (["benchmarks/fidelity.py"], ["--scenario", "no-such.yaml"],
     "benchmarks/fidelity.py: error: no-such.yaml: scenario file not found"),
    (["-m", "calibration.vllm.fidelity"], ["--profile", "no-such-profile"],
     "calibration.vllm.fidelity: error: "),
    (["benchmarks/shared_prefix_reads.py"], ["--profile", "no-such-profile.yaml"],
     "benchmarks/shared_prefix_reads.py: error: no-such-profile.yaml: ")])
def test_a_fidelity_scripts_bad_file_is_one_line(script, args, line):
    # an InputError from the scenario or the profile: one line and exit 2, no traceback
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, *script, *args], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith(line)
    assert p.stderr.rstrip().endswith("file not found")
