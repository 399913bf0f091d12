"""slo_ratio / worst_slo: the worst value / threshold over a run's SLO table, by hand."""

import math

import pytest

from simulator.search import slo_ratio, worst_slo


def entry(value, thr, met, samples=1):
    return {"threshold": thr, "value": value, "met": met, "samples": samples}


def test_slo_ratio_is_the_worst_value_over_threshold():
    s = {"slo": {"ttft_ms": {"p99": entry(150.0, 200.0, True)},
                 "tpot_ms": {"p50": entry(30.0, 20.0, False)}}}
    assert slo_ratio(s) == 30.0 / 20.0
    assert slo_ratio({"slo": {}}) == 0.0


def test_a_statistic_over_no_samples_that_is_met_adds_nothing():
    # TPOT with every request at one output token: no value, met vacuously.
    s = {"slo": {"ttft_ms": {"p99": entry(100.0, 200.0, True)},
                 "tpot_ms": {"p99": entry(None, 50.0, True, samples=0)}}}
    assert slo_ratio(s) == 0.5


def test_a_missing_figure_that_is_not_met_or_rejected_requests_are_infinite():
    nothing = {"slo": {"ttft_ms": {"p99": entry(None, 200.0, False, samples=0)}}}
    assert slo_ratio(nothing) == math.inf
    rejected = {"slo": {"rejected_requests": {"count": {"threshold": 0, "value": 2,
                                                        "met": False}}}}
    assert slo_ratio(rejected) == math.inf


def _scenario_file(tmp_path, workload: str):
    from simulator.scenario import load_scenario

    (tmp_path / "t.csv").write_text("t,p,o\n0,10,5\n1,10,5\n")
    y = tmp_path / "s.yaml"
    y.write_text("model: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 "engine: {max_model_len: 512}\nworkload:\n" + workload)
    return load_scenario(y)


def test_a_rate_search_on_a_trace_or_a_closed_loop_names_the_key_the_file_has(tmp_path):
    import pytest

    from simulator.errors import InputError
    from simulator.search import with_rate

    trace = _scenario_file(tmp_path, "  trace: {path: t.csv, format: csv, columns: "
                                     "{arrival: t, prompt_tokens: p, output_tokens: o}}\n")
    with pytest.raises(InputError, match=r"^s\.yaml:5: workload\.trace: a rate search needs "
                                         r"an open-loop .*time_scale stretches them\)$"):
        with_rate(trace, 2.0)
    closed = _scenario_file(tmp_path, "  num_requests: 4\n"
                                      "  arrival: {process: closed_loop, concurrency: 2}\n"
                                      "  prompt_tokens: {dist: fixed, value: 10}\n"
                                      "  output_tokens: {dist: fixed, value: 5}\n")
    with pytest.raises(InputError, match=r"^s\.yaml:6: workload\.arrival: a rate search "):
        with_rate(closed, 2.0)


def test_worst_slo_names_the_entry_furthest_past_its_threshold():
    s = {"slo": {"ttft_ms": {"p99": entry(450.0, 500.0, True)},
                 "tpot_ms": {"p50": entry(30.0, 20.0, False), "p99": entry(40.0, 50.0, True)}}}
    assert worst_slo(s) == {"metric": "tpot_ms", "stat": "p50", "value": 30.0,
                            "threshold": 20.0, "ratio": 1.5}
    assert worst_slo({"slo": {}}) is None
    rejected = {"slo": {"ttft_ms": {"p99": entry(900.0, 500.0, False)},
                        "rejected_requests": {"count": entry(3, 0, False)}}}
    assert worst_slo(rejected)["metric"] == "rejected_requests"
    assert worst_slo(rejected)["ratio"] == math.inf


def test_plan_refuses_conversations_before_asking_for_a_target_rate(tmp_path, capsys):
    # the workload is refused before any rate is asked for
    from simulator.cli import main

    y = tmp_path / "s.yaml"
    y.write_text("model: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 "engine: {max_model_len: 512}\nworkload:\n  num_requests: 4\n"
                 "  arrival: {process: poisson, rate: 1}\n"
                 "  prompt_tokens: {dist: fixed, value: 10}\n"
                 "  output_tokens: {dist: fixed, value: 5}\n"
                 "  sessions: {turns: 2, think_time_s: 1}\n")
    assert main(["plan", str(y), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: s.yaml:9: workload.sessions: a rate search ")
    assert not (tmp_path / "p").exists()


def test_ratio_interval_is_student_t_and_never_below_zero():
    from simulator.search import _interval
    # mean 0.8, sample sd 1.4 / sqrt(2), t(0.975, 1) = 12.7062: half-width 12.7062 × 0.7
    lo, hi = _interval([0.1, 1.5])
    assert lo == 0.0 and hi == pytest.approx(0.8 + 12.7062047 * 0.7, rel=1e-6)
    assert _interval([2.0, 2.0]) == (2.0, 2.0) and _interval([1.0]) is None
    assert _interval([1.0, float("inf")]) is None
