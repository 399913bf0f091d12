"""Metrics: hand-computed latencies, exact pooled-ITL percentiles, goodput, warm-up,
time-weighted concurrency and replication confidence intervals."""

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from simulator import metrics
from simulator.errors import InputError
from simulator.metrics import MetricsCollector, combine_replications, percentile_from_runs
from simulator.policy import RequestRecord

MS = 1_000_000


def approx(x):
    # Summary floats are rounded to 6 significant digits.
    return pytest.approx(x, rel=5e-6)


def timeline():
    """Four requests, in finish order (times in ms):

    id arrival sched first finish out  ->  TTFT  E2EL  TPOT          queue
    r3   50     -     -     50     0      rejected (not a latency sample)
    r2   40    60   130    130     1      90    90   none (1 token)  20
    r0    0    10    50    150    11      50   150   100/10 = 10     10
    r1   20    30    80    200     5      60   180   120/4  = 30     10
    """
    def rec(rid, a, s, f, fin, prompt, out, reason="length", rep=0):
        return RequestRecord(rid, a * MS, None if s is None else s * MS,
                             None if f is None else f * MS, fin * MS, prompt_tokens=prompt,
                             cached_tokens=16 if out else 0, output_tokens=out,
                             replica=rep, finish_reason=reason)
    return [rec("r3", 50, None, None, 50, 400, 0, "rejected"),
            rec("r2", 40, 60, 130, 130, 300, 1),
            rec("r0", 0, 10, 50, 150, 100, 11),
            rec("r1", 20, 30, 80, 200, 200, 5)]


def collect(records, **kw):
    c = MetricsCollector(**kw)
    for r in records:
        c.record_request(r)
    return c


def test_hand_made_timeline_latencies_and_percentiles():
    s = collect(timeline()).finalize(slo=None).summary
    assert (s["num_requests"], s["completed"], s["rejected"]) == (4, 3, 1)
    # TTFT sorted [50, 60, 90]: p50 = 60; p90 at index 1.8 -> 60 + 0.8*30; p99 at 1.98.
    t = s["ttft_ms"]
    assert t["mean"] == approx(200 / 3)
    assert (t["p50"], t["max"]) == (60.0, 90.0)
    assert t["p90"] == approx(84.0)
    assert t["p95"] == approx(87.0)
    assert t["p99"] == approx(89.4)
    # TPOT excludes the first token and the 1-token request: [10, 30].
    p = s["tpot_ms"]
    assert (p["mean"], p["p50"], p["max"]) == (20.0, 20.0, 30.0)
    assert p["p90"] == approx(28.0)
    assert p["p99"] == approx(29.8)
    # E2EL sorted [90, 150, 180].
    e = s["e2el_ms"]
    assert e["mean"] == approx(140.0)
    assert e["p50"] == 150.0
    assert e["p90"] == approx(174.0)
    # queue [10, 10, 20]
    q = s["queue_ms"]
    assert q["mean"] == approx(40 / 3)
    assert q["p50"] == 10.0
    assert q["p90"] == approx(18.0)


def test_throughput_window_and_request_concurrency():
    s = collect(timeline()).finalize(slo=None).summary
    # window [first arrival 0, last finish 200 ms]
    assert s["duration_s"] == approx(0.2)
    assert s["request_throughput"] == approx(3 / 0.2)
    assert s["output_throughput"] == approx(17 / 0.2)
    assert s["total_token_throughput"] == approx((600 + 17) / 0.2)
    # mean = sum E2EL / duration = (150 + 180 + 90) / 200; all three overlap in [40, 130)
    assert s["concurrency"]["requests_mean"] == approx(2.1)
    assert s["concurrency"]["requests_max"] == 3
    # all within the first second: vllm bench serve's peak counts the same three
    assert s["max_concurrent_requests"] == 3


def test_a_request_rejected_after_the_last_finish_ends_the_window():
    # vllm bench serve's duration runs until every request has returned, a refused one
    # (returned at its arrival, 300 ms, with no finish time) too: [0, 300 ms]
    late = RequestRecord("r4", 300 * MS, None, None, None, prompt_tokens=400,
                         finish_reason="rejected")
    c = collect(timeline() + [late], timeseries_bin_ns=50 * MS)
    c.record_step(0, 30 * MS, 60 * MS, 10, 0, 1, 0, 0.1, 0)
    res = c.finalize(slo=None)
    s = res.summary
    assert (s["completed"], s["rejected"]) == (3, 2)
    assert s["duration_s"] == approx(0.3)
    assert s["request_throughput"] == approx(3 / 0.3)
    # the time series covers the same window, not only to the last finish (230 ms)
    ts = res.timeseries[res.timeseries["replica"] == "all"]
    assert ts["time_s"].tolist() == approx([0, 0.05, 0.1, 0.15, 0.2, 0.25])
    assert ts["time_s"].iloc[-1] + ts["bin_s"].iloc[-1] == approx(0.3)


def test_the_window_starts_at_the_run_start_as_vllm_bench_serve_duration():
    # The same requests 30 ms later: vllm bench serve's clock starts before the first
    # arrival gap, so the window is [0, 230 ms], not [30, 230]; with warm-up it starts at
    # the first counted arrival (r1, 50 ms).
    late = [RequestRecord(r.request_id, r.arrival_ns + 30 * MS,
                          None if r.first_scheduled_ns is None else r.first_scheduled_ns + 30 * MS,
                          None if r.first_token_ns is None else r.first_token_ns + 30 * MS,
                          r.finish_ns + 30 * MS, prompt_tokens=r.prompt_tokens,
                          output_tokens=r.output_tokens, finish_reason=r.finish_reason)
            for r in timeline()]
    s = collect(late).finalize(slo=None).summary
    assert s["duration_s"] == approx(0.23)
    assert s["request_throughput"] == approx(3 / 0.23)
    assert s["concurrency"]["requests_mean"] == approx((150 + 180 + 90) / 230)
    w = collect(late, warmup_requests=1).finalize(slo=None).summary
    assert w["duration_s"] == approx(0.18)   # [50 ms, 230 ms]


def test_requests_frame_is_in_arrival_order_with_derived_columns():
    df = collect(timeline()).finalize(slo=None).requests
    assert list(df.columns) == list(metrics.REQUEST_COLUMNS)
    assert list(df["request_id"]) == ["r0", "r1", "r2", "r3"]
    assert list(df["ttft_ms"][:3]) == [50.0, 60.0, 90.0]
    assert list(df["tpot_ms"][:2]) == [10.0, 30.0]
    assert math.isnan(df["tpot_ms"][2]) and math.isnan(df["ttft_ms"][3])
    assert list(df["finish_reason"]) == ["length"] * 3 + ["rejected"]


def test_goodput_needs_every_slo():
    c = collect(timeline())
    # r0: ttft 50, tpot 10 -> good; r1: tpot 30 > 25 -> bad; r2: no TPOT -> passes it.
    s = c.finalize(slo={"ttft_ms": {"p99": 100}, "tpot_ms": {"p50": 25}}).summary
    assert s["good_requests"] == 2
    assert s["goodput"] == approx(2 / 0.2)
    assert s["slo"]["ttft_ms"]["p99"] == {"threshold": 100.0, "value": approx(89.4),
                                          "met": True, "samples": 3}
    assert s["slo"]["tpot_ms"]["p50"]["met"] is True
    # r3 was never served (rejected): an SLO cannot be met while requests are refused.
    assert s["slo"]["rejected_requests"]["count"] == {"threshold": 0, "value": 1, "met": False}
    assert s["slo_met"] is False
    served = collect(timeline()[1:]).finalize(
        slo={"ttft_ms": {"p99": 100}, "tpot_ms": {"p50": 25}}).summary
    assert served["slo_met"] is True and "rejected_requests" not in served["slo"]
    # Only r0 has E2EL <= 160 and TTFT <= 55; run mean TTFT 66.7 > 55 fails the SLO.
    s = c.finalize(slo={"e2el_ms": {"mean": 160}, "ttft_ms": {"mean": 55}}).summary
    assert s["good_requests"] == 1
    assert s["goodput"] == approx(1 / 0.2)
    assert s["slo"]["e2el_ms"]["mean"]["met"] is True
    assert s["slo"]["ttft_ms"]["mean"]["met"] is False
    assert s["slo_met"] is False


def test_itl_slo_is_judged_on_the_run_statistic_only():
    c = collect(timeline())
    c.record_itl(10 * MS, 14)
    s = c.finalize(slo={"itl_ms": {"p99": 5}}).summary
    assert s["slo"]["itl_ms"]["p99"] == {"threshold": 5.0, "value": 10.0, "met": False,
                                         "samples": 14}
    assert s["slo_met"] is False
    assert s["good_requests"] == 3


def test_an_slo_over_no_samples_is_met_vacuously_as_goodput_counts_it():
    # r2 alone: one output token, so no TPOT and no ITL gap; goodput passes it on TPOT,
    # and the run-level TPOT/ITL entries agree (met, value None, 0 samples).
    slo = {"ttft_ms": {"p99": 100}, "tpot_ms": {"p99": 50}, "itl_ms": {"mean": 5}}
    s = collect(timeline()[1:2]).finalize(slo=slo).summary
    assert s["good_requests"] == 1
    assert s["slo"]["tpot_ms"]["p99"] == {"threshold": 50.0, "value": None, "met": True,
                                          "samples": 0}
    assert s["slo"]["itl_ms"]["mean"] == {"threshold": 5.0, "value": None, "met": True,
                                          "samples": 0}
    assert s["slo"]["ttft_ms"]["p99"]["met"] is True and s["slo_met"] is True
    # Nothing completed (the only request aborted): nothing was served, no SLO is met.
    abort = RequestRecord("a", 0, finish_ns=5 * MS, prompt_tokens=10, finish_reason="abort")
    s = collect([abort]).finalize(slo=slo).summary
    assert s["completed"] == 0 and s["good_requests"] == 0
    assert s["slo"]["tpot_ms"]["p99"]["met"] is False
    assert s["slo"]["ttft_ms"]["p99"] == {"threshold": 100.0, "value": None, "met": False,
                                          "samples": 0}
    assert s["slo_met"] is False


def test_an_slo_may_bound_any_percentile():
    # TTFT [50, 60, 90] ms: p75 at index 1.5 -> 75; p99.9 at 1.998 -> 60 + 0.998 * 30.
    # ITL gaps 5, 10 x 4, 20 x 2 ms: p75 at index 4.5 -> halfway from 10 to 20.
    c = collect(timeline())
    c.record_itl(10 * MS, 4)
    c.record_itl(20 * MS, 2)
    c.record_itl(5 * MS, 1)
    s = c.finalize(slo={"ttft_ms": {"p99.9": 89, "p75": 80, "mean": 100},
                        "itl_ms": {"p75": 15}}).summary
    assert list(s["slo"]["ttft_ms"]) == ["mean", "p75", "p99.9"]   # mean, then by number
    assert s["slo"]["ttft_ms"]["p75"]["value"] == approx(75.0)
    assert s["slo"]["ttft_ms"]["p99.9"] == {"threshold": 89.0, "value": approx(89.94),
                                            "met": False, "samples": 3}
    assert s["ttft_ms"]["p99.9"] == approx(89.94)   # beside the fixed statistics
    assert s["slo"]["itl_ms"]["p75"] == {"threshold": 15.0, "value": approx(15.0), "met": True,
                                         "samples": 7}
    # goodput checks each request against the smallest bound of a metric (75 ms): r2's
    # 90 ms TTFT fails it
    assert s["good_requests"] == 2 and s["slo_met"] is False


def test_no_slo_gives_no_goodput():
    s = collect(timeline()).finalize(slo=None).summary
    assert (s["slo"], s["slo_met"], s["goodput"]) == ({}, None, None)


@pytest.mark.parametrize("slo, path", [
    ({"ttft": {"p99": 1}}, "slo.ttft:"),
    ({"ttft_ms": {"p42x": 1}}, "slo.ttft_ms.p42x:"),
    ({"ttft_ms": {"p0": 1}}, "slo.ttft_ms.p0:"),
    ({"ttft_ms": {"p100.5": 1}}, "slo.ttft_ms.p100.5:"),
    ({"tpot_ms": {"mean": -3}}, "slo.tpot_ms.mean:"),
    ({"tpot_ms": {"mean": "fast"}}, "slo.tpot_ms.mean:"),
    ({"e2el_ms": 100}, "slo.e2el_ms:"),
])
def test_bad_slo_names_the_key(slo, path):
    with pytest.raises(InputError) as err:
        collect(timeline()).finalize(slo=slo)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_warmup_excludes_first_requests_by_arrival():
    res = collect(timeline(), warmup_requests=1).finalize(slo=None)
    s = res.summary
    # r0 arrived first (though it finished third): counted are r1, r2, r3.
    assert (s["num_requests"], s["warmup_requests"], s["completed"]) == (3, 1, 2)
    assert s["ttft_ms"]["mean"] == approx(75.0)      # (60 + 90) / 2
    assert s["tpot_ms"]["mean"] == approx(30.0)
    assert s["duration_s"] == approx(0.18)           # [20 ms, 200 ms]
    assert s["request_throughput"] == approx(2 / 0.18)
    assert s["concurrency"]["requests_mean"] == approx((180 + 90) / 180)
    assert list(res.requests["warmup"]) == [True, False, False, False]


def test_itl_runs_and_summary():
    c = collect(timeline())
    c.record_itl(10 * MS, 3)
    c.record_itl(20 * MS, 1)
    c.record_itl(10 * MS, 1)
    c.record_itl(99 * MS, 0)
    c.record_token_times([0, 5 * MS, 25 * MS])       # gaps 5 ms and 20 ms
    res = c.finalize(slo=None)
    assert res.itl_runs["gap_ns"].tolist() == [5 * MS, 10 * MS, 20 * MS]
    assert res.itl_runs["count"].tolist() == [1, 4, 2]
    expanded = np.array([5] + [10] * 4 + [20] * 2, dtype=float)
    itl = res.summary["itl_ms"]
    assert res.summary["itl_tokens"] == 7
    assert itl["mean"] == approx(expanded.mean())
    assert itl["std"] == approx(expanded.std())
    for k, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert itl[k] == approx(np.percentile(expanded, q))
    assert itl["max"] == 20.0


def preempting_run(num_requests: int, replicas: int, **sim):
    """A run whose small KV cache and admission on a first chunk preempt requests, some
    again while they recompute."""
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict

    return simulate(scenario_from_dict({
        "name": "p", "model": "llama-3.1-8b", "cluster": {"replicas": replicas}, "sim": sim,
        "hardware": {"step_time": {"base_s": 0.01, "per_prefill_token_s": 1e-5,
                                   "per_decode_seq_s": 1e-4}},
        "engine": {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 128,
                   "num_gpu_blocks": 401, "max_model_len": 4800,
                   "scheduler_reserve_full_isl": False},
        "workload": {"seed": 2, "num_requests": num_requests,
                     "arrival": {"process": "poisson", "rate": 4.0},
                     "prompt_tokens": {"dist": "uniform", "min": 600, "max": 3000},
                     "output_tokens": {"dist": "uniform", "min": 200, "max": 1500}}}))


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("warmup, replicas", [(0, 1), (20, 1), (20, 2)])
def test_every_token_gap_counts_once_under_repeated_preemption(exact, warmup, replicas):
    """The ITL gaps of a request sum to its decode span (finish − first token): a request
    preempted again while recomputing its context, before any new token, keeps its last
    token's time (the second preemption is not a token). With warm-up, exactly the
    counted requests' gaps are pooled (vllm bench serve's warm-ups are not in its run)."""
    res = preempting_run(80, replicas, exact_steps=exact, warmup_requests=warmup)
    rq = res.requests
    assert (rq["preemptions"] >= 2).any()
    assert rq["warmup"].sum() == warmup
    rq = rq[~rq["warmup"]]
    gaps = int((res.itl_runs["gap_ns"] * res.itl_runs["count"]).sum())
    spans = ((rq["finish_s"] - rq["first_token_s"]) * 1e9).round().sum()
    assert gaps == pytest.approx(spans, abs=len(rq))   # (seconds in the table: ns rounding)
    assert res.summary["itl_tokens"] == int((rq["output_tokens"] - 1).sum())


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("warmup", [1, 11])   # 4 users start at 0; 3 requests at 110 ms
def test_warm_up_requests_tied_at_the_edge_are_told_apart_by_id(exact, warmup):
    """A closed loop without think time: users whose requests finish in one step send
    their next ones at the same ns, so the warm-up set's last arrival is shared by
    several requests; only those the figures count (ties by request id) are pooled."""
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict

    res = simulate(scenario_from_dict({
        "name": "t", "model": "llama-test", "sim": {"exact_steps": exact,
                                                    "warmup_requests": warmup},
        "hardware": {"step_time": {"constant_s": 0.01}},
        "workload": {"seed": 0, "num_requests": 60,
                     "arrival": {"process": "closed_loop", "concurrency": 4},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "uniform", "min": 2, "max": 6}}}))
    rq = res.requests
    edge = rq["arrival_s"][rq["warmup"]].max()
    # the edge is shared by a warm-up request and a counted one
    assert rq["warmup"][rq["arrival_s"] == edge].nunique() == 2
    rq = rq[~rq["warmup"]]
    gaps = int((res.itl_runs["gap_ns"] * res.itl_runs["count"]).sum())
    spans = ((rq["finish_s"] - rq["first_token_s"]) * 1e9).round().sum()
    assert gaps == pytest.approx(spans, abs=len(rq))
    assert res.summary["itl_tokens"] == int((rq["output_tokens"] - 1).sum())


def test_prefix_cache_figures_leave_warm_up_requests_out():
    """The schedulers count every admission's prompt and hit tokens; without warm-up those
    counts are the rows' sums, and with it the figures are the counted rows' alone."""
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict

    def run(warmup):
        return simulate(scenario_from_dict({
            "name": "w", "model": "llama-test", "sim": {"warmup_requests": warmup},
            "hardware": {"step_time": {"constant_s": 0.01}},
            "engine": {"max_num_seqs": 8, "num_gpu_blocks": 200},
            "workload": {"seed": 1, "num_requests": 120,
                         "arrival": {"process": "poisson", "rate": 20},
                         "prompt_tokens": {"dist": "uniform", "min": 40, "max": 200},
                         "output_tokens": {"dist": "fixed", "value": 8},
                         "prefix": {"shared_tokens": 64, "groups": 3}}}))

    for warmup in (0, 40):
        res = run(warmup)
        rq = res.requests
        own = ~rq["warmup"] & (rq["finish_reason"] != "rejected")
        q, h = int(rq["prompt_tokens"][own].sum()), int(rq["cached_tokens"][own].sum())
        s = res.summary
        assert (s["prefix_cache_queried_tokens"], s["prefix_cache_hit_tokens"]) == (q, h)
        assert 0 < h < q and s["prefix_cache_hit_rate"] == approx(h / q)
    assert run(40).summary["prefix_cache_hit_tokens"] < run(0).summary["prefix_cache_hit_tokens"]


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 10**10), st.integers(1, 40)),
                     min_size=1, max_size=25),
       q=st.lists(st.floats(0, 100), min_size=1, max_size=6))
def test_percentile_from_runs_equals_numpy_on_expanded(runs, q):
    values = np.array([v for v, _ in runs], dtype=np.int64)
    counts = np.array([c for _, c in runs], dtype=np.int64)
    expanded = np.repeat(values, counts)
    got = percentile_from_runs(values, counts, q)
    want = np.percentile(expanded, q)
    assert got.tolist() == want.tolist()
    assert percentile_from_runs(values, counts, q[0]) == np.percentile(expanded, q[0])


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(0, 9)), min_size=1,
                     max_size=15).filter(lambda r: sum(c for _, c in r) > 0),
       q=st.sampled_from([0, 1, 25, 50, 90, 95, 99, 99.9, 100]))
def test_percentile_from_runs_float_values(runs, q):
    values = np.array([v for v, _ in runs])
    counts = np.array([c for _, c in runs])
    assert percentile_from_runs(values, counts, q) == np.percentile(
        np.repeat(values, counts), q)


def steps_case(**kw):
    """Window [0, 200 ms] from one request; replica 0 runs 1 then 2 requests, replica 1
    runs 3 over [20, 100) ms."""
    c = MetricsCollector(**kw)
    c.record_request(RequestRecord(1, 0, 0, 10 * MS, 200 * MS, 10, 0, 5,
                                   finish_reason="length"))
    c.record_step(0, 0, 40 * MS, 8, 0, 1, 2, 0.1, 0)
    c.record_step(0, 50 * MS, 150 * MS, 0, 2, 2, 0, 0.3, 1)
    c.record_step(1, 20 * MS, 100 * MS, 4, 3, 3, 1, 0.5, 0)
    return c


def test_time_weighted_running_and_kv_usage():
    s = steps_case().finalize(slo=None).summary
    # running: (1*40 + 2*100 + 3*80) / 200; KV: (0.1*40 + 0.3*100 + 0.5*80) / 200 / 2
    assert s["concurrency"]["running_mean"] == approx(2.4)
    assert s["concurrency"]["running_max_per_replica"] == 3
    assert s["kv_cache_usage"]["mean"] == approx(0.185)
    assert s["kv_cache_usage"]["max"] == 0.5
    assert s["preemptions"] == 0


def test_timeseries_bins_per_replica_and_total():
    res = steps_case(timeseries_bin_ns=50 * MS).finalize(slo=None)
    ts = res.timeseries
    assert res.summary["timeseries_bin_s"] == 0.05

    def col(rep, name):
        return ts[ts["replica"] == rep][name].tolist()
    assert col("0", "time_s") == [0.0, 0.05, 0.1, 0.15]
    assert col("0", "running") == approx([40 / 50, 2, 2, 0])
    assert col("1", "running") == approx([3 * 30 / 50, 3, 0, 0])
    assert col("all", "running") == approx([0.8 + 1.8, 5, 2, 0])
    # The queue comes from the requests (arrival -> first scheduled): request 1 never waits.
    assert col("all", "waiting") == approx([0, 0, 0, 0])
    # maxima: what the steps saw (waiting: left after scheduling, vLLM's gauge); the all
    # rows' are the largest of one replica (README), not of the sum: bin 1 runs 2 + 3
    assert col("0", "waiting_max") == [2, 0, 0, 0]
    assert col("all", "waiting_max") == [2, 1, 0, 0]
    assert col("all", "running_max") == [3, 3, 2, 0]
    assert col("all", "kv_cache_usage_max") == approx([0.5, 0.5, 0.3, 0])
    assert col("all", "kv_cache_usage") == approx([(0.1 * 40 + 0.5 * 30) / 50 / 2,
                                             (0.3 + 0.5) / 2, 0.3 / 2, 0])
    # tokens count in the bin where the step ends: 40 ms -> bin 0, 100 -> 1, 150 -> 2
    assert col("all", "prefill_tokens") == [8, 4, 0, 0]
    assert col("all", "decode_tokens") == [0, 3, 2, 0]
    # rates spread each step's tokens over its time: replica 1's 3 decodes over [20, 100)
    # ms are 30/80 in bin 0 and 50/80 in bin 1; replica 0's 2 over [50, 150) half in each
    assert col("all", "decode_tok_s") == approx([3 * 30 / 80 / 0.05, (1 + 3 * 50 / 80) / 0.05,
                                                 1 / 0.05, 0])
    assert col("all", "prefill_tok_s") == approx([(8 + 4 * 30 / 80) / 0.05,
                                                  4 * 50 / 80 / 0.05, 0, 0])
    # no bin's rate runs faster than the steps did: 3 tokens in 80 ms at most 37.5 tok/s
    assert max(col("1", "decode_tok_s")) == approx(3 / 0.08)
    assert col("all", "preemptions") == [0, 0, 1, 0]
    assert col("all", "running_max") == [3, 3, 2, 0]


def test_the_last_bin_states_the_width_its_averages_cover():
    # 70 ms bins over the 200 ms window: the last covers [140, 200), 60 ms; its averages
    # are over 60 ms and so is its bin_s, so sums of value x bin_s are exact
    ts = steps_case(timeseries_bin_ns=70 * MS).finalize(slo=None).timeseries
    every = ts[ts["replica"] == "all"]
    assert every["bin_s"].tolist() == approx([0.07, 0.07, 0.06])
    # replica 0 runs 2 over [140, 150): 20 ms-requests in a 60 ms bin
    assert every["running"].iloc[-1] == approx(2 * 10 / 60)
    # (1*40 + 2*100 + 3*80) ms-requests over the window, as the summary's running_mean
    assert (every["running"] * every["bin_s"]).sum() == approx(0.48)
    assert (every["decode_tok_s"] * every["bin_s"]).sum() == approx(5)   # 2 + 3 decodes


def test_fine_bins_coarsen_without_losing_time(monkeypatch):
    monkeypatch.setattr(metrics, "_MAX_FINE_BINS", 4)   # 10 ms bins double past 40 ms
    c = steps_case()
    assert c._w == 40 * MS
    s = c.finalize(slo=None).summary
    assert s["concurrency"]["running_mean"] == approx(2.4)
    assert s["kv_cache_usage"]["mean"] == approx(0.185)


def test_summary_is_deterministic_and_json_able():
    a = steps_case().finalize(slo={"ttft_ms": {"p99": 100}}, extra={"scenario": "x"})
    b = steps_case().finalize(slo={"ttft_ms": {"p99": 100}}, extra={"scenario": "x"})
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
    assert a.summary["scenario"] == "x"
    with pytest.raises(ValueError):
        steps_case().finalize(slo=None, extra={"completed": 1})


def test_combine_replications_student_t():
    vals = [1.0, 2.0, 4.0]
    sums = [{"ttft_ms": {"p99": v}, "completed": int(v), "label": "x", "slo_met": True}
            for v in vals]
    sums[0]["only_first"] = 3.5
    out = combine_replications(sums)
    mean = statistics.mean(vals)
    sem = statistics.stdev(vals) / math.sqrt(3)
    lo, hi = sps.t.interval(0.95, df=2, loc=mean, scale=sem)
    got = out["ttft_ms"]["p99"]
    assert got["n"] == 3
    assert got["mean"] == approx(mean)
    assert lo < 0  # the t interval crosses 0; a latency's lower bound is clipped there
    assert got["ci95"] == [0.0, approx(hi)]
    signed = combine_replications([{"err": v - 3.0} for v in vals])["err"]["ci95"]
    assert signed == [approx(lo - 3.0), approx(hi - 3.0)]
    assert out["only_first"] == {"mean": 3.5, "ci95": None, "n": 1}
    assert "label" not in out and "slo_met" not in out
    same = combine_replications([{"a": 2.0}, {"a": 2.0}])
    assert same["a"] == {"mean": 2.0, "ci95": [2.0, 2.0], "n": 2}


def test_queue_length_series_integrates_each_requests_wait():
    # A waits [0, 30) ms on replica 0; B waits [20, 70) ms on replica 1; bins of 50 ms.
    c = MetricsCollector(timeseries_bin_ns=50 * MS)
    c.record_request(RequestRecord("A", 0, 30 * MS, 40 * MS, 60 * MS, 10, 0, 2, replica=0,
                                   finish_reason="length"))
    c.record_request(RequestRecord("B", 20 * MS, 70 * MS, 80 * MS, 190 * MS, 10, 0, 2,
                                   replica=1, finish_reason="length"))
    c.record_step(0, 30 * MS, 60 * MS, 10, 0, 1, 0, 0.1, 0)
    c.record_step(1, 70 * MS, 190 * MS, 10, 1, 1, 0, 0.1, 0)
    ts = c.finalize(slo=None).timeseries

    def col(rep):
        return ts[ts["replica"] == rep]["waiting"].tolist()
    assert col("0") == approx([30 / 50, 0, 0, 0])
    assert col("1") == approx([30 / 50, 20 / 50, 0, 0])
    assert col("all") == approx([60 / 50, 20 / 50, 0, 0])


def test_peak_concurrent_requests_by_hand():
    s = 10**9
    # From the first arrival (0.5 s): [0.5, 0.9) and [1.2, 1.4) fall in second 0 and never
    # overlap; [3.0, 3.1) in second 2; [1.0, 3.6) in seconds 0, 1, 2 and 3.
    a = np.array([0.5, 1.2, 3.0, 1.0]) * s
    f = np.array([0.9, 1.4, 3.1, 3.6]) * s
    assert metrics._max_overlap(a[:2].astype(np.int64), f[:2].astype(np.int64)) == 1
    assert metrics._peak_per_second(a[:2].astype(np.int64), f[:2].astype(np.int64)) == 2
    assert metrics._peak_per_second(a.astype(np.int64), f.astype(np.int64)) == 3
    assert metrics._peak_per_second(np.array([], np.int64), np.array([], np.int64)) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 9_000)), min_size=1,
                max_size=40))
def test_peak_concurrent_requests_is_vllm_bench_serves(spans_ms):
    # vllm bench serve (calculate_metrics): buckets int(t - min start) over seconds, each
    # request counted from its start bucket to its end bucket, both included.
    start = [t for t, _ in spans_ms]
    end = [t + d for t, d in spans_ms]
    t0 = min(start)
    buckets = [0] * ((max(end) - t0) // 1000 + 1)
    for b, e in zip(start, end):
        for k in range((b - t0) // 1000, (e - t0) // 1000 + 1):
            buckets[k] += 1
    ns = 10**6
    got = metrics._peak_per_second(np.array(start, np.int64) * ns, np.array(end, np.int64) * ns)
    assert got == max(buckets)
    assert got >= metrics._max_overlap(np.array(start, np.int64), np.array(end, np.int64))


def test_a_short_single_run_is_warned_of_with_what_steadies_its_p99():
    from types import SimpleNamespace as NS

    from simulator.run import tail_warning

    def sc(replications=1, warm=0, trace=None):
        return NS(workload=NS(trace=trace), sim=NS(replications=replications,
                                                   warmup_requests=warm))
    # p99 of n <= 100 values interpolates the 2 largest (0.99 (n - 1) > n - 2); of 250,
    # the 4 largest around 0.99 × 249 = 246.51 of 0..249: ⌈250/100⌉ + 1 = 4
    assert "rest on 50 requests (their 2 slowest set them)" in tail_warning(
        sc(), {"completed": 50})
    assert "rest on 250 requests (their 4 slowest set them)" in tail_warning(
        sc(), {"completed": 250})
    assert "rest on 1 request (one request sets them)" in tail_warning(sc(), {"completed": 1})
    # the warm-up is left out of the counted requests: the count to run includes it
    assert tail_warning(sc(warm=400), {"completed": 800}).endswith(
        "run at least 1400 (workload.num_requests, 400 of them warm-up), or --replications 3 "
        "to see their spread")
    assert tail_warning(sc(replications=3), {"completed": 50}) is None
    assert tail_warning(sc(), {"completed": 1000}) is None
    # a trace's replications are identical: a longer trace is the remedy
    assert tail_warning(sc(replications=3, trace=object()), {"completed": 3}).endswith(
        "a longer trace (or a wider workload.trace.window_s) steadies them")


def test_a_run_spanning_1e9_seconds_keeps_its_per_second_peaks_sparse():
    # One user, two requests of 16 + 4 tokens at 0.01 s a step: the first runs [0, 0.04 s]
    # (a prefill with its first token, three decodes), the second arrives 1e9 s of think
    # time later and runs as long. Per second from the first arrival: 4 tokens and one
    # request in second 0 and in second 1e9, none between. Counted without one slot per
    # second of the run, which would take ~16 GB.
    from simulator.run import simulate
    from simulator.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "name": "s", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 2048, "max_num_seqs": 4},
        "workload": {"seed": 0, "num_requests": 2,
                     "arrival": {"process": "closed_loop", "concurrency": 1,
                                 "think_time_s": 1e9},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 4}}})
    s = simulate(sc).summary
    assert s["duration_s"] == 1e9   # 1e9 + 0.08 s to the summary's 6 significant digits
    assert s["max_output_tokens_per_s"] == 4 and s["max_concurrent_requests"] == 1
    # the same peak as vllm bench serve's buckets over a span of 4e9 s: two requests meet
    # in second 4e9 + 1
    a = np.array([0, 4 * 10**18, 4 * 10**18 + 5 * 10**8], np.int64)
    f = a + np.array([10**9, 15 * 10**8, 10**9], np.int64)
    assert metrics._peak_per_second(a, f) == 2


def test_slo_stat_takes_a_run_of_equal_values_as_that_many_samples():
    from simulator.metrics import slo_stat
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert (slo_stat(x, "mean"), slo_stat(x, "p50"), slo_stat(x, "p90")) == (2.5, 2.5, 3.7)
    # [10, 20, 20, 20]: p25 lies between the 1st and 2nd samples (linear, rank 0.75)
    v, c = np.array([10, 20]), np.array([1, 3])
    assert (slo_stat(v, "mean", c), slo_stat(v, "p50", c), slo_stat(v, "p25", c)) == (
        17.5, 20.0, 17.5)
    assert slo_stat(np.array([]), "p99") is None
    assert slo_stat(v, "p99", np.array([0, 0])) is None
    with pytest.raises(ValueError, match="unknown statistic 'p0'"):
        slo_stat(x, "p0")


def test_served_rows_are_the_completed_requests_warm_up_included():
    from simulator.metrics import served_rows
    c = MetricsCollector(warmup_requests=1)
    c.record_request(RequestRecord(0, 0, 0, 5 * MS, 9 * MS, 4, 0, 2, finish_reason="length"))
    c.record_request(RequestRecord(1, MS, None, None, None, 9, finish_reason="rejected"))
    c.record_request(RequestRecord(2, 2 * MS, 2 * MS, 6 * MS, 10 * MS, 4, 0, 2,
                                   finish_reason="stop"))
    res = c.finalize(slo=None)
    rows = served_rows(res.requests)
    assert rows["request_id"].tolist() == [0, 2] and rows["warmup"].tolist() == [True, False]
    # the summary's completed is the same set less warm-up
    assert res.summary["completed"] == int((~rows["warmup"]).sum()) == 1


@pytest.mark.parametrize("replicas", [1, 2])
def test_queue_length_series_counts_preempted_requests_waiting_again(monkeypatch, replicas):
    """``waiting`` integrates the scheduler's waiting queue as vLLM's
    ``num_requests_waiting`` gauge counts it: preempted requests go back there until they
    are scheduled again. Reference: the queue itself, watched at every change (arrivals
    enter it on the clock; each scheduling decision admits and preempts at its step's
    start, the clock's time with exact steps)."""
    import simpy

    from simulator.policy.scheduler import Scheduler

    envs, since, waited = [], {}, []

    class Env(simpy.Environment):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            envs.append(self)

    add, schedule = Scheduler.add_request, Scheduler.schedule

    def watched_add(self, req):
        add(self, req)
        since[req] = envs[-1].now

    def watched_schedule(self):
        before = set(self.waiting)
        plan = schedule(self)
        after, now = set(self.waiting), envs[-1].now
        waited.extend(now - since.pop(r) for r in before - after)
        since.update((r, now) for r in after - before)
        return plan

    monkeypatch.setattr(simpy, "Environment", Env)
    monkeypatch.setattr(Scheduler, "add_request", watched_add)
    monkeypatch.setattr(Scheduler, "schedule", watched_schedule)
    res = preempting_run(60, replicas, exact_steps=True)
    assert res.summary["preemptions"] > 0 and not since
    rq, ts = res.requests, res.timeseries
    first_waits = ((rq["first_scheduled_s"] - rq["arrival_s"]) * 1e9).sum()
    assert sum(waited) > first_waits * 1.02   # the re-waits are a visible share here
    area = (ts["waiting"] * ts["bin_s"] * 1e9).groupby(ts["replica"]).sum()
    assert area["all"] == pytest.approx(sum(waited), rel=1e-9)
    assert area.drop("all").sum() == pytest.approx(sum(waited), rel=1e-9)


def test_a_replica_that_never_ran_a_step_still_has_its_rows():
    # 3 replicas, one 40 ms step on replica 0 only (the run's window: one bin of 40 ms):
    # rows for 0, 1 and 2 (replicas 1 and 2 idle: zeros), and the cluster's mean busy
    # share is 1/3 of replica 0's
    c = MetricsCollector(timeseries_bin_ns=50 * MS, num_replicas=3)
    c.record_request(RequestRecord("A", 0, 0, 40 * MS, 40 * MS, 10, 0, 1, replica=0,
                                   finish_reason="length"))
    c.record_step(0, 0, 40 * MS, 10, 0, 1, 0, 0.1, 0)
    ts = c.finalize(slo=None).timeseries
    assert ts["replica"].unique().tolist() == ["0", "1", "2", "all"]
    busy = ts.set_index("replica")["busy"]
    assert busy["0"] == 1 and busy["1"] == busy["2"] == 0
    assert busy["all"] == approx(1 / 3)
    idle = ts[ts["replica"] == "2"]
    assert (idle[["running", "running_max", "steps", "kv_cache_usage_max"]] == 0).all().all()


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False), st.integers(2, 20))
def test_equal_replications_have_an_interval_of_width_zero(x, n):
    # np.mean of n equal values can miss them by an ulp (935.0724237877682 three times), and
    # the report's "every replication gave the same figures" compares the bounds exactly
    assert metrics.t_interval([x] * n) == (x, x)


def test_the_t_interval_is_students():
    x = [1.0, 2.0, 4.0]
    h = sps.t.ppf(0.975, 2) * statistics.stdev(x) / math.sqrt(3)
    assert 7 / 3 - h < 0 and metrics.t_interval(x) == pytest.approx((0.0, 7 / 3 + h))   # >= 0
    assert metrics.t_interval([10.0, 11.0, 13.0]) == pytest.approx((34 / 3 - h, 34 / 3 + h))
    assert metrics.t_interval([-1.0, 1.0])[0] < 0   # a figure that can be negative keeps it
    assert metrics.t_interval([5.0]) is None
