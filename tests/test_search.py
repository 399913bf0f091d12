"""slo_ratio: the worst value / threshold over a run's SLO table, by hand."""

import math

from simulator.search import slo_ratio


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
