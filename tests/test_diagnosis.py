"""Diagnosis: the binding limit in constructed cases, the TTFT split, counterfactuals."""

import pytest

from simulator.diagnosis import diagnose, find_limits, ttft_split
from simulator.report import fmt_number
from simulator.executors import job_output
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
    # 4 slots × 32 tokens × 10 ms: capacity 12.5 req/s, offered 16; KV unlimited. A request
    # runs 32 steps, 0.32 s: the load needs L = 16 × 0.32 = 5.1 slots (Little's law), 5.1 +
    # 3 √5.1 = 11.9 with its peaks, so the change tried is 4 × 2^2 = 16 slots.
    s = sc({"max_num_seqs": 4}, {"constant_s": 0.01}, 16)
    r = simulate(s)
    d = diagnose(s, r)
    assert d["binding"] == "max_num_seqs"
    rate = d["figures"]["offered_rate"]
    assert 15 < rate < 17
    load = rate * 0.32
    assert d["figures"]["max_num_seqs_needed"] == pytest.approx(load + 3 * load ** 0.5,
                                                                rel=1e-4)
    cf = d["counterfactual"]
    assert cf["change"] == "engine.max_num_seqs=16" and cf["moved"]


def test_a_change_names_the_runs_own_flag_it_replaces():
    # the run set max_num_seqs with --set: appending the suggested flag would give the key
    # twice, which servesim refuses, so the advice says which flag it takes the place of
    from simulator.report import diagnosis_line

    base = sc({}, {"constant_s": 0.01}, 16).model_dump(mode="python", exclude_none=True)
    s = scenario_from_dict(base, overrides=["engine.max_num_seqs=4"])
    d = diagnose(s, simulate(s))
    assert d["binding"] == "max_num_seqs"
    assert d["findings"][0]["replaces"] == ["engine.max_num_seqs=4"]
    assert d["counterfactual"]["replaces"] == ["engine.max_num_seqs=4"]
    assert ("with --set engine.max_num_seqs=16 (in place of --set engine.max_num_seqs=4): "
            in diagnosis_line(d))
    # the same value from the file: nothing to replace
    s = sc({"max_num_seqs": 4}, {"constant_s": 0.01}, 16)
    d = diagnose(s, simulate(s))
    assert d["counterfactual"]["replaces"] == [] and "in place of" not in diagnosis_line(d)
    # a flag that gave the mapping above the key: merged, so that its other settings stay
    # (the counterfactual ran with them; the file's would differ)
    s = scenario_from_dict(base, overrides=["engine={max_num_seqs: 4, block_size: 32}"])
    d = diagnose(s, simulate(s))
    cf = d["counterfactual"]
    assert (cf["flags"], cf["replaces"]) == (["engine={max_num_seqs: 16, block_size: 32}"],
                                             ["engine={max_num_seqs: 4, block_size: 32}"])
    # quoted as a shell needs it, so that the flags can be pasted
    assert ("with --set 'engine={max_num_seqs: 16, block_size: 32}' (in place of --set "
            "'engine={max_num_seqs: 4, block_size: 32}'): " in diagnosis_line(d))


def test_suggested_flags_merge_settings_below_one_mapping_flag():
    from simulator.diagnosis import suggested_flags

    base = sc({}, {"constant_s": 0.01}, 16).model_dump(mode="python", exclude_none=True)
    s = scenario_from_dict(base, overrides=[
        "engine={enable_chunked_prefill: false, max_model_len: 512}", "cluster.replicas=2"])
    # two settings under one mapping flag make one flag; a key a flag gave is replaced;
    # a key no flag gave is added
    assert suggested_flags(s, "engine.enable_chunked_prefill=true,"
                              "engine.max_num_batched_tokens=512") == {
        "flags": ["engine={enable_chunked_prefill: true, max_model_len: 512, "
                  "max_num_batched_tokens: 512}"],
        "replaces": ["engine={enable_chunked_prefill: false, max_model_len: 512}"]}
    assert suggested_flags(s, "cluster.replicas=4") == {"flags": ["cluster.replicas=4"],
                                                        "replaces": ["cluster.replicas=2"]}
    assert suggested_flags(s, "cluster.router=least_outstanding") == {
        "flags": ["cluster.router=least_outstanding"], "replaces": []}
    assert suggested_flags(s, None) == {"flags": [], "replaces": []}
    # the flag re-read as the scenario read it: YAML 1.2's 010000 is ten thousand (YAML
    # 1.1, plain PyYAML's, read octal 4096)
    s = scenario_from_dict(base, overrides=["engine={max_num_batched_tokens: 010000}"])
    assert suggested_flags(s, "engine.max_num_seqs=8")["flags"] == [
        "engine={max_num_batched_tokens: 10000, max_num_seqs: 8}"]
    # a section a flag unset (engine=null: its defaults) takes the setting inside it (not
    # the file's engine block)
    s = scenario_from_dict(base, overrides=["engine=null"])
    assert suggested_flags(s, "engine.max_num_batched_tokens=512") == {
        "flags": ["engine={max_num_batched_tokens: 512}"], "replaces": ["engine=null"]}


def test_kv_capacity_binds():
    # 63 usable blocks of 16; a request needs 3 blocks → ~21 fit, far below 128 slots;
    # offered concurrency 60 × 0.32 s ≈ 19 keeps the cache full and preempting.
    s = sc({"max_num_seqs": 128, "num_gpu_blocks": 64, "max_model_len": 256},
           {"constant_s": 0.01}, 60)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "kv_capacity"
    assert d["findings"][0]["change"] == "engine.num_gpu_blocks=128"
    # A fixed block count ignores gpu_memory_utilization: the knob is the count itself.
    knob = d["findings"][0]["knob"]
    assert "raise engine.num_gpu_blocks" in knob and "raise gpu_memory_utilization" not in knob
    assert "scheduler_reserve_full_isl" not in knob   # already vLLM's default here


def test_full_slots_whose_steps_are_full_of_work_are_compute():
    # Each decode adds 1 ms to a 5 ms step: 256 slots decode 256 tokens per 261 ms, 512
    # would decode 512 per 517 ms, only 2·261/517 = 1.0097× the throughput. At 40 req/s ×
    # 32 tokens (capacity ~31 req/s) every slot is taken, but more slots would not serve
    # more: the replica's compute binds.
    s = sc({"max_num_seqs": 256}, {"base_s": 0.005, "per_decode_seq_s": 0.001}, 40)
    r = simulate(s)
    d = diagnose(s, r)
    assert d["queued"] and d["figures"]["running_per_replica_mean"] > 0.8 * 256
    assert d["figures"]["max_num_seqs_gain"] == pytest.approx(2 * 261 / 517, rel=1e-5)
    assert d["binding"] == "compute" and all(f["limit"] != "max_num_seqs"
                                             for f in d["findings"])
    assert "a decode step of 512 would take ×1.98 as long" in d["findings"][0]["evidence"]
    assert d["counterfactual"]["change"] == "cluster.replicas=2" and d["counterfactual"]["moved"]
    # With 4 slots the slots bind: a request runs 32 steps of 9 ms, 0.288 s, so the load
    # needs 40 × 0.288 = 11.5 slots, 21.7 with its peaks: 32 are tried, whose steps take
    # 37 ms (throughput 32 · 9 / (4 · 37) = ×1.95).
    s4 = sc({"max_num_seqs": 4}, {"base_s": 0.005, "per_decode_seq_s": 0.001}, 40, n=600)
    d4 = diagnose(s4, simulate(s4), counterfactual=False)
    assert d4["figures"]["max_num_seqs_gain"] == pytest.approx(32 * 9 / (4 * 37), rel=1e-5)
    assert d4["findings"][0]["change"] == "engine.max_num_seqs=32"
    assert d4["binding"] == "max_num_seqs"


def test_full_slots_do_not_bind_a_tpot_miss():
    # 8 slots full (22 req/s against ~19 served), a step of 5 ms + 1 ms per decode: more
    # slots would serve 2·13/21 = 1.24× as many tokens but make each step longer, so a
    # TPOT-only miss is not theirs: it binds the load (compute); with a TTFT SLO missed too,
    # the slots bind (they shorten the wait).
    def run(slo, **over):
        s = scenario_from_dict({**sc({"max_num_seqs": 8},
                                     {"base_s": 0.005, "per_decode_seq_s": 0.001}, 22,
                                     n=1000).model_dump(mode="python", exclude_none=True),
                                "slo": slo})
        return s, simulate(s)

    s, r = run({"tpot_ms": {"p99": 12}})
    d = diagnose(s, r, counterfactual=False)
    limits = [f["limit"] for f in d["findings"]]
    assert d["binding"] == "compute" and "max_num_seqs" in limits
    assert d["findings"][0]["evidence"].startswith("TPOT p99 is")
    # independently: 16 slots make that TPOT worse
    s16 = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                              "engine": {**s.engine.model_dump(exclude_none=True),
                                         "max_num_seqs": 16}})
    assert simulate(s16).summary["tpot_ms"]["p99"] > r.summary["tpot_ms"]["p99"]
    s, r = run({"tpot_ms": {"p99": 12}, "ttft_ms": {"p99": 200}})
    assert diagnose(s, r, counterfactual=False)["binding"] == "max_num_seqs"


def test_preemptions_with_first_chunk_admission_name_the_full_isl_knob():
    # 1000-token prompts (63 blocks of 16 with their output) in 250-token chunks, 80 usable
    # blocks: admitted on a first chunk, two requests outgrow the cache and preempt.
    s = sc({"max_num_seqs": 8, "num_gpu_blocks": 81, "max_num_batched_tokens": 250,
            "max_model_len": 1024, "scheduler_reserve_full_isl": False}, {"constant_s": 0.01}, 20, prompt=1000,
           out=8, n=60)
    d = diagnose(s, simulate(s), counterfactual=False)
    assert d["binding"] == "kv_capacity" and d["figures"]["preemptions"] > 0
    assert "engine.scheduler_reserve_full_isl=true" in d["findings"][0]["knob"]


def test_a_watermark_that_holds_admission_back_binds_and_is_named():
    # watermark 0.9 of 101 blocks: int(90.9) = 90 blocks kept free when admitting while
    # others run, so a request (1 block for its 16-token prompt) is admitted only while the
    # running hold at most 100 - 90 - 1 = 9 of the 100 usable blocks: at most 10 run, which
    # grow to 3 blocks each (16 + 32 tokens), 30 blocks, 30% of the cache, against 16 req/s
    # offered at 10 ms a step, 32 steps each. Requests queue with 70% of the cache free:
    # the watermark, not the cache's size, holds them back.
    s = sc({"num_gpu_blocks": 101, "watermark": 0.9, "max_model_len": 1024},
           {"constant_s": 0.01}, 16, n=600)
    r = simulate(s)
    d = diagnose(s, r)
    assert d["figures"]["watermark_holds_admission"]
    assert r.summary["kv_cache_usage"]["max"] <= 0.30 and r.summary["preemptions"] == 0
    assert r.summary["concurrency"]["running_max_per_replica"] <= 10
    assert d["binding"] == "kv_capacity"
    f = d["findings"][0]
    assert "engine.watermark 0.9 keeps 90% of its blocks free" in f["evidence"]
    assert f["change"] == "engine.watermark=0" and d["counterfactual"]["moved"]


def test_compute_binds():
    # 2000-token prompts at 0.1 ms/token: 0.2 s of prefill each, 5 req/s at most.
    s = sc({"max_num_seqs": 256, "max_num_batched_tokens": 2048},
           {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 8, prompt=2000, out=4, n=600)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "compute"
    assert d["figures"]["busy_fraction"] > 0.95
    assert d["counterfactual"]["moved"]
    # twice the replicas is the knob's test, not a sizing: the line says who sizes it
    from simulator.report import diagnosis_line
    assert d["counterfactual"]["change"] == "cluster.replicas=2"
    assert "; servesim plan finds the fewest replicas (details" in diagnosis_line(d)


def test_the_line_names_the_worst_slo_before_and_after_a_counterfactual():
    from simulator.report import diagnosis_line

    cf = {"limit": "compute", "change": "cluster.replicas=2",
          "figure": "worst SLO value / threshold", "before": 1.2, "after": 0.9,
          "slo_met_before": False, "slo_met_after": True, "worse": False, "breaks": [],
          "worst_before": {"metric": "tpot_ms", "stat": "p99", "value": 60.0,
                           "threshold": 50.0},
          "worst_after": {"metric": "ttft_ms", "stat": "p99", "value": 450.0,
                          "threshold": 500.0}}
    line = diagnosis_line({"binding": "compute", "counterfactual": cf, "findings": []})
    assert ("with --set cluster.replicas=2: worst SLO value / threshold 1.2 (TPOT p99 60 ms, "
            "SLO 50 ms) → 0.9 (TTFT p99 450 ms, SLO 500 ms), SLOs met no → yes") in line


def test_a_counterfactual_with_slos_records_the_worst_entry_of_each_run():
    # The compute-bound scenario above with a TTFT SLO: 0.2 s prefills at 4.5 req/s (about
    # 95% of the 5 req/s it serves, a stable run) queue, so TTFT p99 is the worst entry
    # before; two replicas at half that busy bring it under 1.5 s. (At 8 req/s, as above,
    # the run is unstable: its counterfactuals compare throughput, below.)
    s = sc({"max_num_seqs": 256, "max_num_batched_tokens": 2048},
           {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 4.5, prompt=2000, out=4, n=600)
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "slo": {"ttft_ms": {"p99": 1500}}}, s.base_dir)
    r = simulate(s)
    cf = diagnose(s, r)["counterfactual"]
    assert cf["change"] == "cluster.replicas=2"
    p99 = r.summary["ttft_ms"]["p99"]
    assert cf["worst_before"] == {"metric": "ttft_ms", "stat": "p99", "value": p99,
                                  "threshold": 1500}
    after = cf["worst_after"]
    assert cf["before"] == pytest.approx(p99 / 1500, rel=1e-5) and cf["before"] > 1
    assert after["metric"] == "ttft_ms" and after["value"] <= 1500
    assert cf["after"] == pytest.approx(after["value"] / 1500, rel=1e-5)


def test_an_unstable_runs_counterfactuals_compare_throughput_though_slos_are_given():
    # 2000-token prompts each take one 202 ms step (2 ms + 0.1 ms/token; their 3 decodes
    # ride in the next prompts' steps): one replica serves 1 / 0.202 = 4.95 req/s of the 8
    # offered and its backlog grows, so its TTFT p99 (and SLO ratio) grows with the run's
    # length: two such runs' ratios compare arbitrarily. Two replicas (9.9 req/s) serve all
    # that is offered.
    s = sc({"max_num_seqs": 256, "max_num_batched_tokens": 2048},
           {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 8, prompt=2000, out=4, n=600)
    s = _with_slo(s, {"ttft_ms": {"p99": 1500}})
    r = simulate(s)
    d = diagnose(s, r)
    assert not d["figures"]["stable"]
    cf = d["counterfactual"]
    assert cf["change"] == "cluster.replicas=2" and cf["slo_met_after"]
    assert cf["figure"] == "requests/s served" and not cf["lower_better"]
    assert cf["before"] == pytest.approx(1 / 0.202, rel=0.02)
    assert cf["after"] == pytest.approx(d["figures"]["offered_rate"], rel=0.02)
    assert "worst_before" not in cf   # the figure is not the SLO ratio


def test_bursts_that_queue_the_ttft_tail_are_compute_at_the_peaks():
    # A 1500-token prompt takes one 155 ms step (5 ms + 0.1 ms/token): at 1 req/s the
    # engine is busy ~18% of the time. Poisson arrivals meet TTFT p99 <= 500 ms; gamma
    # arrivals with burstiness 0.05 (CV 4.5) come ~20 at a time, and the last of a burst
    # waits for the prefills of those before it: the TTFT tail is waiting, not prefill.
    def run(arrival):
        s = scenario_from_dict({
            "name": "d", "model": "llama-test",
            "hardware": {"step_time": {"base_s": 0.005, "per_prefill_token_s": 1e-4}},
            "engine": {"max_model_len": 2048, "max_num_seqs": 64,
                       "max_num_batched_tokens": 2048},
            "workload": {"seed": 0, "num_requests": 600, "arrival": arrival,
                         "prompt_tokens": {"dist": "fixed", "value": 1500},
                         "output_tokens": {"dist": "fixed", "value": 4}},
            "slo": {"ttft_ms": {"p99": 500}}})
        return diagnose(s, simulate(s))

    d = run({"process": "gamma", "rate": 1.0, "burstiness": 0.05})
    assert d["figures"]["busy_fraction"] < 0.25 and d["figures"]["stable"]
    assert d["binding"] == "compute"
    assert d["findings"][0]["evidence"].startswith("requests queue in bursts: the p99 wait")
    split = d["ttft_split"]
    assert split["queue_ms"]["p99"] >= 0.5 * split["ttft_ms"]["p99"]
    assert d["counterfactual"]["change"] == "cluster.replicas=2" and d["counterfactual"]["moved"]
    assert "(inter-arrival CV 4." in d["findings"][0]["evidence"]   # 1 / sqrt(0.05) = 4.47
    calm = run({"process": "poisson", "rate": 1.0})
    assert calm["binding"] == "none" and all(f["limit"] != "compute" for f in calm["findings"])
    # Poisson arrivals at 4 req/s (busy ~66%) also wait most of the TTFT tail: chance
    # collisions at that utilisation, not bursts.
    busy = run({"process": "poisson", "rate": 4.0})
    ev = busy["findings"][0]["evidence"]
    assert busy["binding"] == "compute" and 0.5 < busy["figures"]["busy_fraction"] < 0.85
    assert "in bursts" not in ev and "no burstier than Poisson" in ev
    assert 0.85 < busy["figures"]["arrival_cv"] < 1.15


def test_bursts_on_an_engine_that_decodes_all_the_time_are_called_bursts():
    # gamma arrivals of burstiness 0.05 (CV 4.5) at about half an H100's capacity: decodes
    # keep a step running nearly all the time; the evidence gives the batch size, since
    # "the engine is busy 100% of the time" is not full; Poisson arrivals at that rate meet
    # the SLO
    def run(arrival):
        s = scenario_from_dict({
            "name": "d", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
            "engine": {"max_model_len": 16384},
            "workload": {"seed": 0, "num_requests": 1500, "arrival": arrival,
                         "prompt_tokens": {"dist": "lognormal", "median": 1020, "p90": 2735,
                                           "max": 14050},
                         "output_tokens": {"dist": "lognormal", "median": 129, "p90": 424,
                                           "max": 1000}},
            "slo": {"ttft_ms": {"p99": 1000}}})
        return diagnose(s, simulate(s), counterfactual=False)

    d = run({"process": "gamma", "rate": 8.0, "burstiness": 0.05})
    f = d["figures"]
    assert f["stable"] and f["busy_fraction"] > 0.85 and f["arrival_cv"] > 3
    compute = next(x for x in d["findings"] if x["limit"] == "compute")
    assert "in bursts" in compute["evidence"] and "busy 100%" not in compute["evidence"]
    assert f"(inter-arrival CV {f['arrival_cv']:.2f}, Poisson 1)" in compute["evidence"]
    calm = run({"process": "poisson", "rate": 8.0})
    assert calm["binding"] == "none"


def test_arrival_cv():
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    from simulator.diagnosis import arrival_cv

    def cv(arrivals, warmup=0):
        return arrival_cv(SimpleNamespace(requests=pd.DataFrame(
            {"arrival_s": arrivals, "warmup": [i < warmup for i in range(len(arrivals))]})))

    assert cv([0.0, 1.0, 2.0, 3.0]) == 0.0                 # a fixed rate
    # gaps 1, 3 (out of order in the table): mean 2, population std 1
    assert cv([4.0, 0.0, 1.0]) == pytest.approx(0.5)
    assert cv([0.0, 100.0, 101.0, 104.0], warmup=1) == pytest.approx(0.5)   # warm-up out
    assert cv([0.0, 1.0]) is None and cv([2.0, 2.0, 2.0]) is None
    gaps = np.random.default_rng(0).exponential(1.0, 20_000)
    assert cv(np.cumsum(gaps)) == pytest.approx(1.0, abs=0.03)          # Poisson


def test_a_busy_engine_without_queueing_that_misses_tpot_is_compute():
    # Each decode adds 1 ms to a 5 ms step, slots and KV unlimited: nothing waits past the
    # step in flight, but at 20 req/s × 32 tokens Little's law gives N ≥ 20·32·(5 + N) ms,
    # N ≥ 8.9 running, steps ≥ 14 ms back to back: TPOT p99 misses 12 ms. Two replicas
    # (N ≈ 4.7, steps ≈ 10 ms) meet it.
    s = sc({"max_num_seqs": 256}, {"base_s": 0.005, "per_decode_seq_s": 0.001}, 20)
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "slo": {"tpot_ms": {"p99": 12}}})
    r = simulate(s)
    assert r.summary["concurrency"]["running_mean"] >= 8.9
    d = diagnose(s, r)
    assert not d["queued"] and d["figures"]["busy_fraction"] > 0.95
    # a request alone decodes at 6 ms per token: the load adds the rest
    assert d["binding"] == "compute"
    assert "and 6 ms for requests served alone: sharing steps" in d["findings"][0]["evidence"]
    cf = d["counterfactual"]
    assert cf["change"] == "cluster.replicas=2" and cf["moved"] and cf["slo_met_after"]
    # figures as summary.json has them: 6 significant digits
    busy = d["figures"]["busy_fraction"]
    assert busy == float(f"{busy:.6g}") and len(repr(busy)) <= 8
    # the same load with the SLO met: busy alone is no finding
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "slo": {"tpot_ms": {"p99": 60}}})
    assert diagnose(s, simulate(s), counterfactual=False)["binding"] == "none"


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


def test_long_prefills_stalling_decodes():
    # 1900-token prompts add 38 ms to a 5 ms decode step: ITL p99 ≈ 43 ms vs p50 5 ms.
    # 512-token chunks bound the stall at ~15 ms, which the counterfactual confirms.
    s = sc({"max_num_seqs": 64}, {"base_s": 0.005, "per_prefill_token_s": 2e-5}, 2,
           prompt=1900, out=64, n=300)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "prefill_interference" and not d["queued"]
    cf = d["counterfactual"]
    assert cf["change"] == "engine.max_num_batched_tokens=512"
    assert cf["before"] == pytest.approx(5 + 38, rel=0.01)
    assert cf["after"] < 20 and cf["moved"]
    # Chunked prefill off: prompts run whole, so the knob turns chunking on as well (a
    # lower budget alone would be refused: it must hold max_model_len).
    s = sc({"max_num_seqs": 64, "enable_chunked_prefill": False},
           {"base_s": 0.005, "per_prefill_token_s": 2e-5}, 2, prompt=1900, out=64, n=300)
    d = diagnose(s, simulate(s))
    assert d["binding"] == "prefill_interference"
    assert "whole prompts stall decodes" in d["findings"][0]["evidence"]
    cf = d["counterfactual"]
    assert cf["change"] == ("engine.enable_chunked_prefill=true,"
                            "engine.max_num_batched_tokens=512")
    assert cf["before"] == pytest.approx(5 + 38, rel=0.01)
    assert cf["after"] < 20 and cf["moved"]
    from simulator.report import diagnosis_line
    assert ("--set engine.enable_chunked_prefill=true --set engine.max_num_batched_tokens=512"
            in diagnosis_line(d))


def test_prefix_cache_misses():
    s = scenario_from_dict({
        "name": "d", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 2048, "max_num_seqs": 64, "enable_prefix_caching": False},
        "workload": {"seed": 0, "num_requests": 300,
                     "arrival": {"process": "poisson", "rate": 5},
                     "prompt_tokens": {"dist": "fixed", "value": 600},
                     "output_tokens": {"dist": "fixed", "value": 8},
                     "prefix": {"shared_tokens": 512, "groups": 2}}})
    d = diagnose(s, simulate(s))
    assert d["binding"] == "prefix_cache"
    cf = d["counterfactual"]
    assert cf["change"] == "engine.enable_prefix_caching=true"
    # Two groups of 512 shared tokens (32 blocks): all but the first request of each group
    # hit all 512 tokens of their 600.
    assert cf["before"] == 0 and cf["after"] == pytest.approx(298 * 512 / (300 * 600), rel=1e-3)


def test_run_report_has_diagnosis(tmp_path, capsys):
    import json

    from simulator.cli import main

    y = tmp_path / "s.yaml"
    y.write_text("""model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 300
  arrival: {process: poisson, rate: 16}
  prompt_tokens: {dist: fixed, value: 16}
  output_tokens: {dist: fixed, value: 32}
""")
    assert main(["run", str(y), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    d = json.loads((tmp_path / "r" / "diagnosis.json").read_text())
    assert d["binding"] == "max_num_seqs"
    cf = d["counterfactual"]
    said = " ".join(capsys.readouterr().out.split())   # the terminal has it in one line
    # no SLO and 16 req/s offered against 12.5 served: the counterfactuals' figure is the
    # throughput (an unstable run's TTFT tail grows with its length); both knobs serve the
    # offered rate, and the first of equals binds
    assert not d["figures"]["stable"]
    (other,) = d["other_counterfactuals"]
    assert other["change"] == "cluster.replicas=2"
    assert (f"Binding limit: max_num_seqs; with --set {cf['change']}: requests/s served "
            f"{fmt_number(cf['before'])} → {fmt_number(cf['after'])}, SLOs met n/a → n/a "
            f"(also tried --set cluster.replicas=2: {fmt_number(other['before'])} → "
            f"{fmt_number(other['after'])}) (details: the report's Diagnosis).") in said
    assert cf["after"] == pytest.approx(16, rel=0.05) and cf["after"] >= other["after"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Diagnosis" in md
    # alone: one 10 ms prefill step, then 31 decode steps of 10 ms
    assert "Served alone on an idle replica" in md and "TTFT p50 10 / p99 10" in md
    assert "E2EL p50 320 / p99 320" in md
    # an SLO's own statistic takes its place among them (p90 between p50 and p99)
    y.write_text(y.read_text() + "slo: {e2el_ms: {p90: 1000, mean: 900}}\n")
    assert main(["run", str(y), "--out", str(tmp_path / "p90"), "--quiet"]) == 0
    md = (tmp_path / "p90" / "report.md").read_text()
    assert "E2EL mean 320 / p50 320 / p90 320 / p99 320" in md


def test_rejections_alone_are_neither_instability_nor_compute():
    # Prompts uniform in [16, 2000] over max_model_len 1024: about half are rejected. The
    # rest (32 tokens at 10 ms a step, 20 req/s) keep the engine busy ~94% of the time but
    # never queue: the rejections are the finding, not a backlog that never drains
    # (rejected requests are never scheduled) or saturation.
    s = scenario_from_dict({
        "name": "d", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 1024, "max_num_seqs": 64},
        "workload": {"seed": 0, "num_requests": 600,
                     "arrival": {"process": "poisson", "rate": 20},
                     "prompt_tokens": {"dist": "uniform", "min": 16, "max": 2000},
                     "output_tokens": {"dist": "fixed", "value": 32}},
        "slo": {"ttft_ms": {"p99": 100000}}})
    r = simulate(s)
    assert r.summary["rejected"] > 200 and job_output(r)["stable"]
    d = diagnose(s, r, counterfactual=False)
    assert d["figures"]["busy_fraction"] > 0.85
    assert [f["limit"] for f in d["findings"]] == ["max_model_len"]


def test_a_run_with_rejected_requests_writes_its_diagnosis(tmp_path):
    """Prompts over max_model_len are rejected and fail the SLO (an infinite worst-SLO
    ratio): the rejections are the binding limit, and the run still writes valid JSON."""
    import json
    from pathlib import Path

    from simulator.cli import main

    scen = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    out = tmp_path / "o"
    assert main(["run", str(scen), "--out", str(out), "--quiet",
                 "--set", "engine.max_model_len=300"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["rejected"] > 0 and s["slo_met"] is False
    d = json.loads((out / "diagnosis.json").read_text())
    assert d["binding"] == "max_model_len"
    assert d["findings"][0]["evidence"].startswith(f"{s['rejected']} requests rejected")
    cf = d["counterfactual"]
    assert cf is None or (cf["before"] is None and cf["moved"] is False)


def test_when_every_request_is_rejected_the_rejections_are_the_only_finding():
    # 4096-token prompts against max_model_len 2048: nothing is served, nothing queues
    res = simulate(sc({"max_num_seqs": 8}, {"constant_s": 0.01}, 5.0, prompt=4096, n=50))
    assert res.summary["completed"] == 0 and res.summary["rejected"] == 50
    d = diagnose(sc({"max_num_seqs": 8}, {"constant_s": 0.01}, 5.0, prompt=4096, n=50), res)
    assert [f["limit"] for f in d["findings"]] == ["max_model_len"]
    assert d["binding"] == "max_model_len" and d["queued"] is False


def test_a_default_max_model_len_capped_to_the_kv_cache_is_the_one_named():
    # llama-test's default max_model_len (its max_position_embeddings) does not fit in 33
    # blocks of 16: vLLM would refuse to start; servesim caps it to 32 × 16 = 512 tokens,
    # and a 600-token prompt is rejected against that, not against the default.
    s = scenario_from_dict({
        "name": "d", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_num_seqs": 8, "num_gpu_blocks": 33},
        "workload": {"seed": 0, "num_requests": 5, "arrival": {"process": "poisson", "rate": 5},
                     "prompt_tokens": {"dist": "fixed", "value": 600},
                     "output_tokens": {"dist": "fixed", "value": 4}}})
    assert s.max_model_len > 512
    res = simulate(s)
    assert res.summary["rejected"] == 5 and res.summary["max_model_len"] == 512
    f = diagnose(s, res)["findings"][0]
    assert f["evidence"] == (f"5 requests rejected: prompt too long for max_model_len 512 (the "
                             f"default, {s.max_model_len}, capped to what the KV cache "
                             f"holds, as vLLM's --max-model-len auto does; left unset, vLLM "
                             f"would refuse to start)")
    assert f["knob"].startswith("give the KV cache more memory")


def _with_slo(s, slo):
    return scenario_from_dict({**s.model_dump(mode="python", exclude_none=True), "slo": slo})


def test_an_slo_that_requests_alone_meet_but_this_load_misses_is_compute():
    # Decode steps: 5 ms + 1 ms per decoding request, so a request alone decodes at 6 ms
    # per token. At 3 req/s the engine is busy about half the time, nothing queues and no
    # other limit shows, yet TPOT p99 (8.5 ms) misses 7 ms: the load's share. The load
    # binds, not "none: headroom at this load" beside a missed SLO.
    s = _with_slo(sc({"max_num_seqs": 256}, {"base_s": 0.005, "per_decode_seq_s": 0.001},
                     3, n=600), {"tpot_ms": {"p99": 7}})
    d = diagnose(s, simulate(s))
    assert not d["queued"] and d["figures"]["busy_fraction"] < 0.85
    assert d["figures"]["alone_ms"]["tpot_ms"]["p99"] == pytest.approx(6.0, rel=1e-12)
    assert d["binding"] == "compute"
    assert "and 6 ms for requests served alone" in d["findings"][0]["evidence"]
    cf = d["counterfactual"]
    assert cf["change"] == "cluster.replicas=2" and cf["moved"] and cf["slo_met_after"]


def test_an_slo_below_what_a_request_alone_gets_is_the_latency_floor():
    # 1000-token prompts at 2 ms + 0.1 ms/token: 102 ms of prefill alone, at a load that
    # never queues; TTFT p99 <= 100 ms is out of reach of any number of replicas.
    s = _with_slo(sc({"max_num_seqs": 64, "max_num_batched_tokens": 2048},
                     {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 0.5, prompt=1000,
                     out=4, n=100), {"ttft_ms": {"p99": 100}, "tpot_ms": {"p99": 50}})
    d = diagnose(s, simulate(s))
    assert d["figures"]["alone_ms"]["ttft_ms"]["p99"] == pytest.approx(102.0, rel=1e-12)
    assert d["binding"] == "latency_floor"
    f = d["findings"][0]
    assert f["evidence"].startswith("TTFT p99 would be 102 ms for requests served alone")
    # an inline step time does not depend on tensor_parallel: nothing to try
    assert f["knob"].startswith("faster steps (hardware.step_time)")
    assert f["change"] is None and d["counterfactual"] is None


def test_the_latency_floor_counterfactual_doubles_tensor_parallel():
    # Llama-3.1-8B on an H100 (roofline): an 8000-token prompt alone takes ~0.27 s of
    # prefill; tensor_parallel 2 halves the per-GPU work and meets TTFT p99 <= 250 ms.
    s = scenario_from_dict({
        "name": "d", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
        "engine": {"max_model_len": 16384, "max_num_batched_tokens": 8192},
        "workload": {"seed": 0, "num_requests": 40,
                     "arrival": {"process": "poisson", "rate": 0.2},
                     "prompt_tokens": {"dist": "fixed", "value": 8000},
                     "output_tokens": {"dist": "fixed", "value": 16}},
        "slo": {"ttft_ms": {"p99": 250}}})
    r = simulate(s)
    d = diagnose(s, r)
    assert d["binding"] == "latency_floor"
    assert d["figures"]["alone_ms"]["ttft_ms"]["p99"] >= 250
    cf = d["counterfactual"]
    assert cf["change"] == "hardware.tensor_parallel=2" and cf["moved"] and cf["slo_met_after"]
    # the smallest tensor_parallel whose requests alone meet the SLO is the one to try:
    # the floor at each (TTFT p99 of the same requests served alone) decides it
    from simulator.alone import slo_floors
    from simulator.diagnosis import _valid_change

    alone = {k: slo_floors(_valid_change(s, f"hardware.tensor_parallel={k}"), r)["ttft_ms"]["p99"]
             for k in (2, 4, 8)}
    assert alone[2] > alone[4] > alone[8]
    for slo, want, short in ((alone[2] * 0.99, 4, False), (alone[8] * 0.99, 8, True)):
        s2 = _with_slo(s, {"ttft_ms": {"p99": slo}})
        f = diagnose(s2, simulate(s2), counterfactual=False)["findings"][0]
        assert f["limit"] == "latency_floor" and f["change"] == f"hardware.tensor_parallel={want}"
        assert ("even tensor_parallel 8 leaves TTFT p99" in f["knob"]) == short


def test_a_tensor_parallel_whose_loaded_run_still_misses_is_doubled():
    # Llama-3.1-8B on an H100 at 2 req/s, TPOT p99 <= 6 ms: requests alone decode at 7.7 ms
    # (p99), 4.7 at tensor_parallel 2, so 2 is the smallest whose floor meets the SLO; but
    # sharing steps under this load lifts TPOT p99 at 2 above 6 ms, and 4 meets it. 4 is
    # suggested, with 2 listed as tried (it still misses).
    from simulator.alone import slo_floors
    from simulator.report import diagnosis_line

    def mk(slo, tp=1):
        return scenario_from_dict({
            "name": "d", "model": "llama-3.1-8b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": tp},
            "engine": {"max_model_len": 16384, "max_num_batched_tokens": 8192},
            "workload": {"seed": 0, "num_requests": 300,
                         "arrival": {"process": "poisson", "rate": 2.0},
                         "prompt_tokens": {"dist": "lognormal", "median": 1020, "p90": 2735,
                                           "max": 14050},
                         "output_tokens": {"dist": "lognormal", "median": 129, "p90": 424,
                                           "max": 1000}},
            "slo": {"tpot_ms": {"p99": slo}}})

    r = simulate(mk(6))
    # independently: each tensor_parallel's floor (requests alone) and its own loaded run
    alone = {k: slo_floors(mk(6, k), r)["tpot_ms"]["p99"] for k in (1, 2, 4, 8)}
    loaded = {k: simulate(mk(6, k)).summary["tpot_ms"]["p99"] for k in (2, 4, 8)}
    assert alone[1] > 6 > alone[2] and loaded[2] > 6 > loaded[4]
    d = diagnose(mk(6), r)
    f, cf, (other,) = d["findings"][0], d["counterfactual"], d["other_counterfactuals"]
    assert d["binding"] == "latency_floor" and f["change"] == "hardware.tensor_parallel=4"
    assert cf["change"] == "hardware.tensor_parallel=4" and cf["slo_met_after"]
    assert cf["worst_after"]["value"] == pytest.approx(loaded[4], rel=1e-5)
    assert other["change"] == "hardware.tensor_parallel=2" and not other["slo_met_after"]
    assert other["worst_after"]["value"] == pytest.approx(loaded[2], rel=1e-5)
    assert f["knob"].endswith(f"; under this load tensor_parallel 2 still misses the SLOs "
                              f"(TPOT p99 {loaded[2]:.4g} ms against 6 ms): 4 meets them")
    assert diagnosis_line(d).startswith("Binding limit: latency of a request served alone; "
                                        "with --set hardware.tensor_parallel=4: ")
    # an SLO between the floor at 8 (the largest on one node) and its loaded run: 8 is
    # tried and misses, with nothing above it to try
    assert alone[8] < 2.3 < loaded[8]
    d = diagnose(mk(2.3), simulate(mk(2.3)))
    f = d["findings"][0]
    assert f["change"] == "hardware.tensor_parallel=8" and not d["other_counterfactuals"]
    assert not d["counterfactual"]["slo_met_after"]
    assert f["knob"].endswith(f"; under this load tensor_parallel 8 still misses the SLOs "
                              f"(TPOT p99 {loaded[8]:.4g} ms against 2.3 ms): none tried "
                              f"meets them")


def test_a_profile_measured_at_one_tensor_parallel_offers_no_other():
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    s = load_scenario(path, ["workload.num_requests=20", "slo.ttft_ms.p99=1",
                             "workload.arrival.rate=0.5"])
    d = diagnose(s, simulate(s), counterfactual=False)
    assert d["binding"] == "latency_floor" and d["findings"][0]["change"] is None


def test_an_slo_equal_to_the_floor_is_within_reach():
    # 102 ms of prefill alone: an SLO of exactly 102 ms is met by a request alone (a value
    # equal to its threshold meets it), so it is not the latency floor that misses it.
    s = _with_slo(sc({"max_num_seqs": 64, "max_num_batched_tokens": 2048},
                     {"base_s": 0.002, "per_prefill_token_s": 1e-4}, 8, prompt=1000,
                     out=4, n=200), {"ttft_ms": {"p99": 102}})
    r = simulate(s)
    assert not r.summary["slo_met"]
    d = diagnose(s, r, counterfactual=False)
    assert d["figures"]["alone_ms"]["ttft_ms"]["p99"] == pytest.approx(102.0, rel=1e-12)
    assert all(f["limit"] != "latency_floor" for f in d["findings"])
    assert d["binding"] == "compute"


def test_a_missed_slo_below_the_floor_and_one_above_it_are_both_explained():
    # Steps of 5 ms + 1 ms per decode: a 16-token prompt alone takes 5 ms to its first
    # token, above a TTFT p99 of 4 ms; TPOT p99 <= 7 ms is above the 6 ms a request alone
    # decodes at but missed at 3 req/s: the floor first, then the load.
    s = _with_slo(sc({"max_num_seqs": 256}, {"base_s": 0.005, "per_decode_seq_s": 0.001},
                     3, n=600), {"ttft_ms": {"p99": 4}, "tpot_ms": {"p99": 7}})
    d = diagnose(s, simulate(s), counterfactual=False)
    assert [f["limit"] for f in d["findings"]] == ["latency_floor", "compute"]
    assert d["findings"][0]["evidence"].startswith("TTFT p99 would be 5 ms for requests "
                                                   "served alone")
    assert d["findings"][1]["evidence"].startswith("TPOT p99 is ")
    assert "and 6 ms for requests served alone" in d["findings"][1]["evidence"]


def test_a_miss_without_any_overlap_is_step_cost_noise_not_load(tmp_path):
    # One request every 100 s on the measured CPU profile with its residuals drawn
    # (cost_noise: empirical): nothing overlaps, yet a TPOT SLO between the noise-free
    # floor and the noisy figure is missed; no replica count explains that.
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    over = ["workload.num_requests=40", "workload.arrival={process: constant, rate: 0.01}",
            "hardware.cost_noise=empirical"]
    s = load_scenario(path, over)
    r = simulate(s)
    assert r.summary["concurrency"]["requests_max"] == 1
    floor = diagnose(s, r, counterfactual=False)["figures"]["alone_ms"]["tpot_ms"]["p99"]
    value = r.summary["tpot_ms"]["p99"]
    assert value > floor * 1.001
    s = load_scenario(path, over + [f"slo.tpot_ms.p99={(floor + value) / 2}"])
    d = diagnose(s, simulate(s), counterfactual=False)
    assert d["binding"] == "latency_floor"
    assert "no two requests were in the system at once" in d["findings"][0]["evidence"]


def test_an_itl_slo_with_warm_up_has_a_floor(tmp_path):
    # The warm-up request's 49 gaps stay out of the pooled ITL (as vllm bench serve, whose
    # warm-ups are not in its run): only the counted 3-token request's 2 gaps (10 ms
    # steps) are pooled, and the ITL floor is found.
    from simulator.scenario import load_scenario

    (tmp_path / "t.csv").write_text("t,p,o\n0,100,50\n10,100,3\n20,100,1\n30,100,1\n")
    (tmp_path / "s.yaml").write_text("""model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_model_len: 2048}
sim: {warmup_requests: 1}
workload:
  trace: {path: t.csv, format: csv, columns: {arrival: t, prompt_tokens: p, output_tokens: o}}
slo: {itl_ms: {p99: 1}}
""")
    s = load_scenario(tmp_path / "s.yaml")
    r = simulate(s)
    assert r.summary["itl_tokens"] == 2
    assert r.summary["itl_ms"]["p99"] == pytest.approx(10.0)
    d = diagnose(s, r, counterfactual=False)
    assert d["figures"]["alone_ms"]["itl_ms"]["p99"] == pytest.approx(10.0)
    assert d["binding"] == "latency_floor"
    # no counted request has two tokens: no ITL sample, the SLO met vacuously
    (tmp_path / "t.csv").write_text("t,p,o\n0,100,50\n10,100,1\n20,100,1\n30,100,1\n")
    r = simulate(load_scenario(tmp_path / "s.yaml"))
    assert r.summary["itl_tokens"] == 0 and r.summary["itl_ms"]["p99"] is None
    assert r.summary["slo_met"] is True


def test_a_ttft_miss_is_not_blamed_on_prefill_chunks_stalling_decodes():
    # 1900-token prompts stall decodes (ITL p99 ≈ 9× its median), but the SLO missed is
    # TTFT's, above the 43 ms a request alone gets (5 ms + 1900 × 0.02 ms): shorter chunks
    # would lengthen every prefill; more replicas meet it.
    s = _with_slo(sc({"max_num_seqs": 64}, {"base_s": 0.005, "per_prefill_token_s": 2e-5},
                     2, prompt=1900, out=64, n=300), {"ttft_ms": {"p99": 60}})
    d = diagnose(s, simulate(s))
    assert [f["limit"] for f in d["findings"]] == ["compute", "prefill_interference"]
    assert d["binding"] == "compute"
    assert "and 43 ms for requests served alone" in d["findings"][0]["evidence"]
    cf = d["counterfactual"]
    assert cf["change"] == "cluster.replicas=2" and cf["moved"] and cf["slo_met_after"]
    # with an ITL SLO missed too, the chunks can bind (their knob moves ITL), but TTFT is
    # missed as well, which they lengthen: they come after more replicas (which meet both;
    # by the rules alone the chunks bind here, and their run leaves TTFT p99 at 115 ms)
    s = _with_slo(s, {"ttft_ms": {"p99": 60}, "itl_ms": {"p99": 20}})
    lim = find_limits(s, simulate(s))
    assert [f["limit"] for f in lim["findings"]] == ["compute", "prefill_interference"]
    assert lim["eligible"] == 2
    # with only the ITL SLO missed, the chunks bind, listed first
    s = _with_slo(s, {"itl_ms": {"p99": 20}})
    d = diagnose(s, simulate(s), counterfactual=False)
    assert d["binding"] == "prefill_interference"
    assert d["findings"][0]["limit"] == "prefill_interference"


def test_with_ttft_missed_shorter_prefill_chunks_are_tried_after_more_replicas():
    # The same 1900-token prompts, TTFT p99 <= 60 ms and TPOT p99 <= 7 ms both missed at
    # 2 req/s (requests alone: 43 ms and 5 ms). Shorter chunks may move TPOT, so they can
    # bind, but they lengthen every prefill, so more replicas are tried first (the chunks
    # would make TTFT worse and use up a try); they meet both SLOs, so the chunks are not
    # run at all.
    s = _with_slo(sc({"max_num_seqs": 64}, {"base_s": 0.005, "per_prefill_token_s": 2e-5},
                     2, prompt=1900, out=64, n=300), {"ttft_ms": {"p99": 60},
                                                      "tpot_ms": {"p99": 7}})
    r = simulate(s)
    assert r.summary["slo"]["ttft_ms"]["p99"]["value"] > 60
    assert r.summary["slo"]["tpot_ms"]["p99"]["value"] > 7
    lim = find_limits(s, r)
    assert [f["limit"] for f in lim["findings"]] == ["compute", "prefill_interference"]
    assert lim["eligible"] == 2   # both knobs move a missed SLO (TPOT)
    d = diagnose(s, r)
    assert d["binding"] == "compute" and d["counterfactual"]["change"] == "cluster.replicas=2"
    assert d["counterfactual"]["slo_met_after"] and d["other_counterfactuals"] == []
    # without a TTFT SLO the chunks keep their place before the load's compute finding
    s = _with_slo(s, {"tpot_ms": {"p99": 7}})
    lim = find_limits(s, simulate(s))
    assert [f["limit"] for f in lim["findings"]][:2] == ["prefill_interference", "compute"]


def test_a_counterfactual_that_makes_the_figure_worse_says_so():
    from simulator.diagnosis import _moved, _worse
    from simulator.report import diagnosis_blocks, diagnosis_line

    assert _worse(1.0, 1.6, True) and not _moved(1.0, 1.6, True)
    assert not _worse(1.0, 1.05, True) and not _worse(1.0, 0.5, True)
    assert _worse(0.5, 0.3, False) and not _worse(0.5, 0.5, False)   # a hit rate falls
    cf = {"change": "engine.max_num_batched_tokens=512", "figure": "worst SLO value / "
          "threshold", "before": 1.0671, "after": 1.6003, "slo_met_before": False,
          "slo_met_after": False, "moved": False, "worse": True}
    diag = {"binding": "prefill_interference", "findings": [], "counterfactual": cf}
    assert "1.0671 → 1.6003 (worse), SLOs met no → no" in diagnosis_line(diag)
    text = " ".join(str(b) for b in diagnosis_blocks(diag))
    assert "(makes it worse)" in text
    # a little worse, or not moved: the terminal says so too
    diag["counterfactual"] = {**cf, "before": 3.18, "after": 3.30, "worse": False}
    assert "3.18 → 3.3 (does not move it much), SLOs met no → no" in diagnosis_line(diag)
    diag["counterfactual"] = {**cf, "after": 0.9, "worse": False, "slo_met_after": True}
    assert "1.0671 → 0.9, SLOs met no → yes" in diagnosis_line(diag)


def test_a_waiting_ttft_tail_on_a_busy_engine_is_not_called_bursts():
    # chat.yaml's first 300 requests: decodes keep the engine stepping nearly all the time
    # and the TTFT tail is mostly waiting (queue p99 362 of TTFT p99 662 ms): not "bursts
    # while mostly idle".
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "chat.yaml"
    s = load_scenario(path, ["workload.num_requests=300", "slo.ttft_ms.p99=500"])
    d = diagnose(s, simulate(s), counterfactual=False)
    ev = d["findings"][0]["evidence"]
    assert not d["queued"] and d["figures"]["busy_fraction"] >= 0.85
    assert d["binding"] == "compute" and ev.startswith("the TTFT tail is waiting: the p99 wait")
    assert "in bursts" not in ev
    # busy is not full: the batch size says how far below max_num_seqs it steps
    f = d["figures"]
    assert ev.endswith(f"with the engine busy {f['busy_fraction']:.0%} of the time on batches "
                       f"of {f['running_per_replica_mean']:.3g} requests on average "
                       f"(max_num_seqs {f['max_num_seqs']})")


def test_slots_that_fill_in_bursts_are_max_num_seqs():
    # chat.yaml's first 300 requests at max_num_seqs 32: 22.5 running on average (below the
    # 80% rule), but bursty arrivals fill all 32 slots and nearly all the waiting happens
    # then; 64 slots meet the SLO (more replicas would too, at twice the GPUs).
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "chat.yaml"
    s = load_scenario(path, ["workload.num_requests=300", "engine.max_num_seqs=32",
                             "slo.ttft_ms.p99=1000"])
    r = simulate(s)
    d = diagnose(s, r)
    assert d["figures"]["running_per_replica_mean"] < 0.8 * 32
    # independently: the waiting in timeseries.csv's bins where a step ran all 32
    ts = r.timeseries[r.timeseries["replica"] == "0"]
    w = ts["waiting"] * ts["bin_s"]
    share = float((w * (ts["running_max"] >= 32)).sum() / w.sum())
    assert share > 0.9 and d["figures"]["waiting_at_max_num_seqs"] == pytest.approx(share,
                                                                                   rel=1e-5)
    assert d["binding"] == "max_num_seqs"
    cf = d["counterfactual"]
    assert cf["change"] == "engine.max_num_seqs=64" and cf["slo_met_after"]
    # 300 bursty requests end with a backlog (an unstable run): the figure compared is the
    # throughput, which the slots move little in so short a run; they meet the SLO
    assert not d["figures"]["stable"] and cf["figure"] == "requests/s served"


def test_a_knob_that_breaks_a_met_slo_does_not_bind():
    # 8 slots full at 22 req/s (steps of 5 ms + 1 ms per decode): TTFT p99 misses 200 ms,
    # TPOT p99 meets 14 ms (~13 ms with 8 running). The load needs 22 × 32 × 13 ms = 9.2
    # slots, 18.3 with its peaks: 32 are tried, which shorten the wait but put up to 32
    # decodes in a step: TPOT then misses. Two replicas meet both: they bind.
    s = scenario_from_dict({**sc({"max_num_seqs": 8}, {"base_s": 0.005,
                                                        "per_decode_seq_s": 0.001}, 22,
                                 n=1000).model_dump(mode="python", exclude_none=True),
                            "slo": {"tpot_ms": {"p99": 14}, "ttft_ms": {"p99": 200}}})
    r = simulate(s)
    assert r.summary["slo"]["tpot_ms"]["p99"]["met"]
    d = diagnose(s, r)
    assert find_limits(s, r)["binding"] == "max_num_seqs"   # by the rules alone
    assert d["binding"] == "compute" and d["counterfactual"]["change"] == "cluster.replicas=2"
    assert d["counterfactual"]["slo_met_after"] and not d["counterfactual"]["breaks"]
    (other,) = d["other_counterfactuals"]
    assert other["change"] == "engine.max_num_seqs=32" and other["moved"]
    # independently: the TPOT of 32 slots
    s32 = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                              "engine": {**s.engine.model_dump(exclude_none=True),
                                         "max_num_seqs": 32}})
    tpot32 = simulate(s32).summary["tpot_ms"]["p99"]
    assert tpot32 > 14
    (b,) = other["breaks"]
    assert (b["metric"], b["stat"], b["threshold"]) == ("tpot_ms", "p99", 14)
    assert b["after"] == pytest.approx(tpot32, rel=1e-5)
    from simulator.report import diagnosis_blocks, diagnosis_line

    line = diagnosis_line(d)
    assert line.startswith("Binding limit: compute capacity; with --set cluster.replicas=2")
    assert "(also tried --set engine.max_num_seqs=32: " in line and "; breaks TPOT p99 (" in line
    text = " ".join(str(x) for x in diagnosis_blocks(d))
    assert "Also tried for max_num_seqs: `--set engine.max_num_seqs=32`" in text


def test_preemptions_that_more_kv_barely_moves_bind_compute():
    # 200 blocks of 16 hold ~10 requests of 300 tokens; a step is 1 ms + 2 ms per decode,
    # so 10 or 20 running decode alike (476 vs 488 tokens/s): one replica serves ~2.4 of
    # 3.5 req/s offered and preempts. Twice the blocks barely help; two replicas meet the
    # TTFT SLO, so compute binds, with the KV finding still listed (and tried).
    s = sc({"max_num_seqs": 256, "num_gpu_blocks": 201}, {"base_s": 0.001,
                                                          "per_decode_seq_s": 0.002}, 3.5,
           prompt=100, out=200, n=600)
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "slo": {"ttft_ms": {"p99": 3000}}})
    r = simulate(s)
    assert r.summary["preemptions"] > 0
    assert find_limits(s, r)["binding"] == "kv_capacity"
    d = diagnose(s, r)
    assert d["binding"] == "compute" and d["counterfactual"]["slo_met_after"]
    (other,) = d["other_counterfactuals"]
    assert other["limit"] == "kv_capacity" and not other["slo_met_after"]
    assert [f["limit"] for f in d["findings"]] == ["compute", "kv_capacity"]


def _prefix_run(rate, slo, prefix=True, **engine):
    # 1000-token prompts, 900 of them one shared prefix; a step costs 2 ms + 0.1 ms per
    # prefill token: 100 ms of prefill per prompt without hits (≤ 10 req/s), 10 ms with.
    raw = {
        "name": "d", "model": "llama-test",
        "hardware": {"step_time": {"base_s": 0.002, "per_prefill_token_s": 1e-4}},
        "engine": {"max_model_len": 2048, "max_num_seqs": 64,
                   "max_num_batched_tokens": 2048, **engine},
        "workload": {"seed": 0, "num_requests": 600,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": 1000},
                     "output_tokens": {"dist": "fixed", "value": 4},
                     "prefix": {"shared_tokens": 900, "groups": 1}},
        "slo": slo}
    if not prefix:
        del raw["workload"]["prefix"]
    s = scenario_from_dict(raw)
    return s, simulate(s)


def test_prefix_caching_off_binds_before_more_gpus():
    # At 12 req/s without hits the engine cannot keep up (compute would bind, more replicas
    # would help); turning caching on removes 90% of the prefill work on the same GPU.
    s, r = _prefix_run(12, {"ttft_ms": {"p99": 500}}, enable_prefix_caching=False)
    assert not r.summary["slo_met"]
    rule = find_limits(s, r)
    assert rule["binding"] == "prefix_cache"
    assert "compute" in [f["limit"] for f in rule["findings"]]
    d = diagnose(s, r)
    cf = d["counterfactual"]
    assert cf["change"] == "engine.enable_prefix_caching=true" and cf["slo_met_after"]
    # an unstable run, SLO or not, is judged on its throughput: 1000-token prompts two to a
    # 2048-token step of 202 ms, 9.9 req/s at most; with hits all that is offered
    assert not d["figures"]["stable"] and d["other_counterfactuals"] == []
    assert cf["figure"] == "requests/s served"
    assert cf["before"] == pytest.approx(2 / 0.202, rel=0.02)
    assert cf["after"] == pytest.approx(d["figures"]["offered_rate"], rel=0.02)
    # A TTFT SLO below what requests alone get without hits (~100 ms), above it with
    # (~12 ms): the floor is listed, after the setting that lowers it.
    s, r = _prefix_run(2, {"ttft_ms": {"p99": 50}}, enable_prefix_caching=False)
    d = diagnose(s, r, counterfactual=False)
    assert [f["limit"] for f in d["findings"]][:2] == ["prefix_cache", "latency_floor"]
    assert d["findings"][1]["evidence"].endswith("more prefix-cache hits would lower it")


def test_prefill_chunks_that_set_the_floor_bind_max_num_batched_tokens():
    # 1000-token prompts in chunks of 64 tokens: 16 steps (15 of 64, one of 40), so alone
    # a prompt takes 16 · 2 + 1000 · 0.1 = 132 ms; in one chunk 102 ms. A TTFT p50 SLO of
    # 120 ms: only longer chunks meet it on this hardware, and vLLM's 2048 for an unnamed
    # device is what to try.
    s, r = _prefix_run(0.5, {"ttft_ms": {"p50": 120}}, prefix=False,
                       max_num_batched_tokens=64)
    d = diagnose(s, r)
    f = d["findings"][0]
    assert d["binding"] == "max_num_batched_tokens"
    assert f["change"] == "engine.max_num_batched_tokens=2048"
    alone = d["figures"]["alone_ms"]["ttft_ms"]["p50"]
    assert alone == pytest.approx(16 * 2 + 1000 * 0.1, rel=1e-6)
    assert "in prefill chunks of 64 tokens" in f["evidence"]
    assert f"and {2 + 100:.4g} ms in chunks of 2048" in f["evidence"]
    assert d["counterfactual"]["moved"] and d["counterfactual"]["slo_met_after"]
    from simulator.alone import slo_floors

    assert slo_floors(s, r, budget=128)["ttft_ms"]["p50"] == pytest.approx(8 * 2 + 100)


def test_a_full_token_budget_that_caps_throughput_binds_max_num_batched_tokens():
    # Steps of 64 tokens cost 8 ms + 0.01 ms per token: 64 tokens per 8.64 ms (≈ 7.4 k/s),
    # 128 per 9.28 ms (≈ 13.8 k/s): ×2·8.64/9.28 = 1.862 the throughput. 500-token prompts
    # at 16 req/s (8 k prompt tokens/s + decodes) fill every step's budget and queue.
    s = scenario_from_dict({
        "name": "d", "model": "llama-test",
        "hardware": {"step_time": {"base_s": 0.008, "per_prefill_token_s": 1e-5}},
        "engine": {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 64},
        "workload": {"seed": 0, "num_requests": 600,
                     "arrival": {"process": "poisson", "rate": 16},
                     "prompt_tokens": {"dist": "fixed", "value": 500},
                     "output_tokens": {"dist": "fixed", "value": 4}},
        "slo": {"ttft_ms": {"p99": 1000}}})
    r = simulate(s)
    d = diagnose(s, r)
    assert d["queued"] and d["figures"]["tokens_per_step_mean"] >= 0.9 * 64
    assert d["figures"]["max_num_batched_tokens_gain"] == pytest.approx(2 * 8.64 / 9.28,
                                                                        rel=1e-6)
    assert d["binding"] == "max_num_batched_tokens"
    assert d["counterfactual"]["change"] == "engine.max_num_batched_tokens=128"
    assert d["counterfactual"]["moved"]


def test_the_kv_change_tried_moves_the_cache_alone():
    from simulator.diagnosis import _kv_change

    def gpu(**over):
        hw = {"profile": "h100-sxm", "tensor_parallel": over.pop("tp", 1)}
        return scenario_from_dict({
            "name": "d", "model": "llama-3.1-8b", "hardware": hw, "engine": over,
            "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1},
                         "prompt_tokens": {"dist": "fixed", "value": 16},
                         "output_tokens": {"dist": "fixed", "value": 4}}})

    # memory-sized below vLLM's default share: that share, a setting these GPUs hold
    assert _kv_change(gpu(gpu_memory_utilization=0.3), 9000) == \
        "engine.gpu_memory_utilization=0.92"
    # else twice the blocks (vLLM's --num-gpu-blocks-override): the cache alone; a higher
    # tensor_parallel would add compute too and hide whether the cache binds
    assert _kv_change(gpu(), 27000) == "engine.num_gpu_blocks=54000"
    # an engine.num_gpu_blocks below what the memory holds: that count (twice the override
    # can still bind where the GPU would not); above it, twice the override
    from simulator.cost_model import build_cost_model
    held = build_cost_model(gpu(gpu_memory_utilization=0.3)).num_gpu_blocks
    assert 1000 < held < 5000
    assert _kv_change(gpu(num_gpu_blocks=1000, gpu_memory_utilization=0.3), 1000) == \
        f"engine.num_gpu_blocks={held}"
    assert _kv_change(gpu(num_gpu_blocks=5000, gpu_memory_utilization=0.3), 5000) == \
        "engine.num_gpu_blocks=10000"
    assert _kv_change(sc({"num_gpu_blocks": 64}, {"constant_s": 0.01}, 1), 64) == \
        "engine.num_gpu_blocks=128"
    assert _kv_change(sc({}, {"constant_s": 0.01}, 1), None) is None   # unlimited


def test_a_kv_try_beyond_the_gpus_memory_is_labelled_a_test_with_what_holds_it():
    # Llama-3.1-8B on one H100, 6000-token prompts at 20 req/s: the cache the memory sizes
    # runs out (preemptions). Twice its blocks is a test of the cache alone that vLLM could
    # not allocate on that GPU: the knob says so, and what holds it (tensor_parallel 2,
    # which halves the weights per GPU and splits the KV heads: more than twice the blocks)
    from simulator.cost_model import build_cost_model
    from simulator.diagnosis import _beyond_memory

    def gpu(tp=1, n=200, **engine):
        return scenario_from_dict({
            "name": "d", "model": "llama-3.1-8b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": tp},
            "engine": {"max_model_len": 8192, **engine},
            "workload": {"seed": 0, "num_requests": n,
                         "arrival": {"process": "poisson", "rate": 20},
                         "prompt_tokens": {"dist": "fixed", "value": 6000},
                         "output_tokens": {"dist": "fixed", "value": 300}}})

    held, held2 = (build_cost_model(gpu(tp)).num_gpu_blocks for tp in (1, 2))
    # 128 KiB of KV per token (32 layers x 8 KV heads x 128 x K,V x 2 bytes): 2 MiB a block;
    # 0.92 of 80 GB less 16 GB of weights and the activations leave 50-60 GiB
    assert 50 * 2**30 < held * 2**21 < 60 * 2**30 and held2 > 2 * held
    s = gpu()
    r = simulate(s)
    assert r.summary["preemptions"] > 0 and r.summary["num_gpu_blocks"] == held
    f = next(f for f in find_limits(s, r)["findings"] if f["limit"] == "kv_capacity")
    assert f["change"] == f"engine.num_gpu_blocks={2 * held}"
    assert f["knob"].endswith(
        f"; the try, {2 * held} blocks, is a test of more cache than this replica's GPUs "
        f"hold ({held} at gpu_memory_utilization 0.92: vLLM would fail to allocate "
        f"it); tensor_parallel 2 ({held2} blocks) or a GPU with more memory holds it")
    # and the terminal line, which gives only the flags, says it is a test
    from simulator.report import diagnosis_line
    assert f["beyond_memory"] is True
    assert (f"try --set engine.num_gpu_blocks={2 * held} (a test: more KV cache than the "
            f"GPUs hold; see the report)" in diagnosis_line({"binding": "kv_capacity",
                                                           "findings": [f]}))
    # at tensor_parallel 8 (the most on one node) only a GPU with more memory holds it
    held8 = build_cost_model(gpu(8)).num_gpu_blocks
    assert _beyond_memory(gpu(8), f"engine.num_gpu_blocks={2 * held8}").endswith(
        "vLLM would fail to allocate it); a GPU with more memory holds it")
    # tries the GPUs hold are not labelled: a higher gpu_memory_utilization, the blocks the
    # memory holds in place of a smaller override; nor a cache no memory sizes
    # more slots with the blocks to hold them: the blocks are what the GPUs may not hold
    assert _beyond_memory(s, f"engine.max_num_seqs=512,engine.num_gpu_blocks={held + 1}") \
        .startswith(f"the try, {held + 1} blocks, is a test of more cache")
    assert _beyond_memory(s, f"engine.max_num_seqs=512,engine.num_gpu_blocks={held}") == ""
    assert _beyond_memory(s, "engine.gpu_memory_utilization=0.92") == ""
    assert _beyond_memory(s, f"engine.num_gpu_blocks={held}") == ""
    assert _beyond_memory(gpu(num_gpu_blocks=held), f"engine.num_gpu_blocks={held + 1}") != ""
    assert _beyond_memory(sc({"num_gpu_blocks": 64}, {"constant_s": 0.01}, 1),
                          "engine.num_gpu_blocks=128") == ""


def test_more_slots_than_the_kv_cache_holds_come_with_the_cache_to_hold_them():
    from simulator.diagnosis import max_num_seqs_gain, max_num_seqs_needed

    # 100-token prompts, 200 output tokens: 200 tokens of context on average, 13 blocks of
    # 16; 8 slots, steps of 5 ms + 1 ms per decode.
    def run(blocks):
        s = sc({"max_num_seqs": 8, "num_gpu_blocks": blocks, "max_model_len": 512},
               {"base_s": 0.005, "per_decode_seq_s": 0.001}, 6, prompt=100, out=200, n=300)
        return s, simulate(s)

    s, r = run(201)    # 200 // 13 = 15 sequences fit (block 0 is vLLM's null block)
    assert max_num_seqs_gain(s, r) == pytest.approx((15 * 13 / (8 * 20), 15))   # n2·t(8)/(8·t(n2))
    d = diagnose(s, r, counterfactual=False)
    f = next(f for f in d["findings"] if f["limit"] == "max_num_seqs")
    # the load wants 8 · 2^k slots at or above its need, 32 here; the cache holds 15: the
    # slots it holds alone fall short, so the change brings 32 × 13 blocks + the null block
    assert 16 < max_num_seqs_needed(s, r) <= 32
    assert f["change"] == "engine.max_num_seqs=32,engine.num_gpu_blocks=417"
    assert "the KV cache holds about 15 at their mean context" in f["evidence"]
    assert f["knob"] == "raise max_num_seqs, with a KV cache that holds them (raise " \
                        "engine.num_gpu_blocks)"
    s, r = run(101)    # 100 // 13 = 7 fit: no more slots help without more KV cache
    assert max_num_seqs_gain(s, r) == (1.0, 7)
    d = diagnose(s, r, counterfactual=False)
    assert d["binding"] == "kv_capacity" and "max_num_seqs" not in [
        f["limit"] for f in d["findings"]]


def test_when_no_knob_meets_the_slos_the_one_that_moves_them_most_binds():
    # 40 req/s against 8 slots of 5 ms + 1 ms per decode: 32 steps a request, n / (32 ·
    # (5 + n) ms) = 19.2 req/s, or 27 with the 32 slots tried: neither those nor two
    # replicas (38.5 req/s) keep up, but two replicas come much closer; by the rules alone
    # the slots come first. The run is unstable: the figure is its throughput.
    s = sc({"max_num_seqs": 8}, {"base_s": 0.005, "per_decode_seq_s": 0.001}, 40, n=1000)
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "slo": {"ttft_ms": {"p99": 200}}})
    r = simulate(s)
    assert find_limits(s, r)["binding"] == "max_num_seqs"
    d = diagnose(s, r)
    cf, (other,) = d["counterfactual"], d["other_counterfactuals"]
    assert not cf["slo_met_after"] and not other["slo_met_after"]
    assert cf["figure"] == "requests/s served" and cf["moved"] and other["moved"]
    assert cf["before"] == pytest.approx(8 / (32 * 0.013), rel=0.03)
    assert other["change"] == "engine.max_num_seqs=32"
    assert other["after"] == pytest.approx(32 / (32 * 0.037), rel=0.03)
    assert cf["after"] == pytest.approx(2 * 8 / (32 * 0.013), rel=0.03)
    assert d["binding"] == "compute" and other["limit"] == "max_num_seqs"


def test_a_free_router_that_moves_the_slos_binds_before_more_replicas_that_meet_them():
    # 1000 prefix groups of 3500 tokens behind 4 round-robin A100s at 12 req/s: the router
    # scatters the groups (hits well below the share that repeats). prefix_affinity moves
    # the worst SLO ratio from 7.5 to 3.2; twice the replicas meet the SLOs. The free
    # setting binds (settings before any hardware), the replicas are listed after it.
    s = scenario_from_dict({
        "name": "d", "model": "qwen2.5-7b", "hardware": {"profile": "a100-80gb"},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192,
                   "max_model_len": 8192},
        "cluster": {"replicas": 4, "router": "round_robin"},
        "workload": {"seed": 0, "num_requests": 2000,
                     "arrival": {"process": "poisson", "rate": 12.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 4000, "p90": 4500},
                     "output_tokens": {"dist": "lognormal", "median": 100, "p90": 250},
                     "prefix": {"shared_tokens": 3500, "groups": 1000,
                                "popularity": "uniform"}},
        "slo": {"ttft_ms": {"p90": 1500}, "tpot_ms": {"p90": 60}}})
    d = diagnose(s, simulate(s))
    cf, (other,) = d["counterfactual"], d["other_counterfactuals"]
    assert d["binding"] == "prefix_cache" and cf["change"] == "cluster.router=prefix_affinity"
    assert cf["moved"] and not cf["slo_met_after"]
    assert other["change"] == "cluster.replicas=8" and other["slo_met_after"]


def test_shareable_share_of_prefixes_and_conversations():
    from simulator.diagnosis import shareable_share
    from simulator.policy.request import RequestSpec

    sys_p = (("prefix", 0), 100)
    specs = [
        RequestSpec(0, 0, (sys_p, (("user", 0), 50)), 10),
        RequestSpec(1, 5, (sys_p, (("user", 1), 30)), 10),
        # a follow-up turn: turn 0's prompt, its answer (10 tokens), a new 20-token message
        RequestSpec(2, 0, (sys_p, (("user", 0), 50), (("out", 0), 10), (("user", 2), 20)),
                    10, session_id=0, after=0),
        RequestSpec(3, 9, ((("user", 3), 1),), 10),   # one token: nothing to hit
    ]
    # hits: 0; 100 (the system prompt); 160 (prompt + answer of turn 0); 0
    assert shareable_share(specs) == pytest.approx((100 + 160) / (150 + 130 + 180 + 1))
    assert shareable_share([]) == 0.0
    # a prompt that repeats whole still computes its last token
    assert shareable_share([RequestSpec(0, 0, (sys_p,), 1),
                            RequestSpec(1, 1, (sys_p,), 1)]) == pytest.approx(99 / 200)


def test_conversations_scattered_by_round_robin_bind_the_router():
    # 4 replicas behind round_robin; 6-turn conversations whose history is most of each
    # prompt: a turn lands where its history is cached a quarter of the time.
    s = scenario_from_dict({
        "name": "d", "model": "llama-test",
        "hardware": {"step_time": {"base_s": 0.002, "per_prefill_token_s": 2e-4,
                                   "per_decode_seq_s": 1e-4}},
        "engine": {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        "cluster": {"replicas": 4, "router": "round_robin"},
        "workload": {"seed": 0, "num_requests": 600,
                     "arrival": {"process": "poisson", "rate": 2.5},
                     "prompt_tokens": {"dist": "fixed", "value": 200},
                     "output_tokens": {"dist": "fixed", "value": 50},
                     "sessions": {"turns": {"dist": "fixed", "value": 6},
                                  "think_time_s": 1}},
        "slo": {"ttft_ms": {"p99": 300}}})
    r = simulate(s)
    d = diagnose(s, r)
    f = d["findings"][0]
    # turn k repeats turns 1..k-1 with their answers: of 200k + 50(k-1) tokens, 250(k-1)
    # (less the last token of nothing: the new message follows); 6 turns, one session
    # each: sum 250(k-1) / sum (200k + 50(k-1)) = 3750 / 4950
    share = d["figures"]["shareable_prompt_share"]
    assert share == pytest.approx(3750 / 4950, rel=1e-6)
    assert r.summary["prefix_cache_hit_rate"] < 0.5 * share
    # a conversation's history is on its last turn's replica: sticky sessions keep it there
    assert d["binding"] == "prefix_cache" and f["change"] == "cluster.router=session_affinity"
    assert d["counterfactual"]["slo_met_after"]
    # every later turn then hits its whole history (its full blocks): the share but for the
    # partial last block of each history and the answers' last tokens
    alt = simulate(scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                                       "cluster": {"replicas": 4,
                                                   "router": "session_affinity"}}))
    assert 0.9 * share < alt.summary["prefix_cache_hit_rate"] <= share


def test_findings_of_a_run_that_meets_its_slos_read_as_observations():
    from simulator.report import diagnosis_blocks

    diag = {"binding": "none", "counterfactual": None, "findings": [
        {"limit": "prefill_interference", "evidence": "ITL p99 150 ms is 13.6× its median",
         "knob": "lower max_num_batched_tokens", "change": "engine.max_num_batched_tokens=512"}]}
    text = " ".join(str(x) for x in diagnosis_blocks(diag))
    assert "Nothing binds at this load. The findings below are observations" in text
    diag["binding"] = "prefill_interference"
    assert "Nothing binds" not in " ".join(str(x) for x in diagnosis_blocks(diag))


def _alternating(tmp_path, long_out, short_out, router="round_robin", ttft_p99_ms=500):
    """Two 1-slot replicas at 10 ms a step; a request every 100 ms, alternately
    ``long_out`` and ``short_out`` output tokens (16-token prompts)."""
    from simulator.scenario import load_scenario

    rows = [f"{i / 10:.1f},16,{long_out if i % 2 == 0 else short_out}" for i in range(200)]
    (tmp_path / "t.csv").write_text("t,p,o\n" + "\n".join(rows) + "\n")
    (tmp_path / "s.yaml").write_text(f"""model: llama-test
hardware: {{step_time: {{constant_s: 0.01}}}}
engine: {{max_model_len: 2048, max_num_seqs: 1}}
cluster: {{replicas: 2, router: {router}}}
workload:
  trace: {{path: t.csv, format: csv, arrival_unit: s,
           columns: {{arrival: t, prompt_tokens: p, output_tokens: o}}}}
slo: {{ttft_ms: {{p99: {ttft_p99_ms}}}}}
""")
    return load_scenario(tmp_path / "s.yaml")


def test_round_robin_piling_long_requests_on_one_replica_binds_the_router(tmp_path):
    # Round robin sends every 30-token request (30 steps: 300 ms) to replica 0, one every
    # 200 ms, and every 1-token one (10 ms) to replica 1: replica 0's k-th request waits
    # k x 100 ms while replica 1 never keeps anyone waiting, so all the waiting could have
    # started elsewhere. Balanced, the two replicas are 310 / 400 busy.
    s = _alternating(tmp_path, 30, 1)
    r = simulate(s)
    long_ttft = r.requests["ttft_ms"].to_numpy()[0::2]
    assert long_ttft == pytest.approx([100 * k + 10 for k in range(100)])
    assert (r.requests["ttft_ms"].to_numpy()[1::2] == 10).all()
    d = diagnose(s, r)
    assert d["figures"]["waiting_while_another_admits"] == 1.0
    f = d["findings"][0]
    assert d["binding"] == "router" and f["change"] == "cluster.router=least_outstanding"
    assert f["evidence"].startswith("100% of the waiting happens on a replica while another "
                                    "keeps nobody waiting")
    assert d["counterfactual"]["slo_met_after"]


def test_a_router_imbalance_under_slos_that_are_met_is_an_observation(tmp_path):
    # the same run under a TTFT p99 of 20 s (met: 9.9 s at most): the router's waiting is
    # listed, but with every SLO met only what caps the rate binds (a free setting under
    # met SLOs is an observation, as a prefix cache's)
    s = _alternating(tmp_path, 30, 1, ttft_p99_ms=20000)
    r = simulate(s)
    assert r.summary["slo_met"]
    d = diagnose(s, r)
    assert "router" in [f["limit"] for f in d["findings"]] and d["binding"] != "router"


def test_replicas_that_all_keep_requests_waiting_are_not_the_router(tmp_path):
    # Every request 300 ms, one every 200 ms to each replica in turn: both replicas build
    # the same backlog; only in the first bins (replica 1's first request arrives 100 ms
    # after replica 0's) does one wait while the other admits. Not the router: the one slot
    # (a step costs the same with two sequences, so two would serve twice as much).
    s = _alternating(tmp_path, 30, 30)
    d = diagnose(s, simulate(s))
    assert d["figures"]["waiting_while_another_admits"] < 0.001
    assert "router" not in [f["limit"] for f in d["findings"]]
    assert d["binding"] == "max_num_seqs"
    # a router that already looks at load is not offered again
    s = _alternating(tmp_path, 30, 1, router="least_outstanding")
    d = diagnose(s, simulate(s), counterfactual=False)
    assert "router" not in [f["limit"] for f in d["findings"]]


def test_waiting_while_another_admits_by_hand():
    import pandas as pd
    from simulator.diagnosis import waiting_while_another_admits

    # bin 0: replica 0 holds 2 waiting (on average) while replica 1 admits everyone;
    # bin 1: both hold 1; bin 2: replica 1's 0.5 waiting never outlives a step (not held)
    reps = pd.DataFrame({"time_s": [0, 1, 2] * 2, "bin_s": [1.0] * 6,
                         "replica": ["0"] * 3 + ["1"] * 3,
                         "waiting": [2.0, 1.0, 0.0, 0.0, 1.0, 0.5],
                         "waiting_max": [3, 1, 0, 0, 2, 0]})
    assert waiting_while_another_admits(reps) == pytest.approx(2 / (2 + 1 + 1))
    assert waiting_while_another_admits(reps[reps["replica"] == "0"]) is None


def _h100(engine: dict, rate: float, prompt: tuple, out: tuple, slo: dict):
    return scenario_from_dict({
        "name": "d", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
        "engine": {"max_num_batched_tokens": 8192, "max_model_len": 8192, **engine},
        "workload": {"seed": 0, "num_requests": 1500,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "lognormal", "median": prompt[0],
                                       "p90": prompt[1], "max": prompt[2]},
                     "output_tokens": {"dist": "lognormal", "median": out[0],
                                       "p90": out[1], "max": out[2]}},
        "slo": slo})


def test_a_free_knob_is_tried_far_enough_to_beat_more_replicas():
    # 8 slots on an H100 decoding 8 sequences in ~8 ms steps: the slots, not the GPU,
    # hold 6 req/s back. Twice the slots fall short of the load (about 12 running on average,
    # 22 at its peaks) and two replicas (twice everything) meet the SLOs, but the slots the
    # load needs (32) meet them on one GPU: those are named.
    s = _h100({"max_num_seqs": 8}, 6.0, (500, 1000, 4000), (200, 400, 1000),
              {"ttft_ms": {"p99": 1000}, "tpot_ms": {"p99": 40}})
    d = diagnose(s, simulate(s))
    assert d["binding"] == "max_num_seqs"
    cf = d["counterfactual"]
    assert cf["change"] == "engine.max_num_seqs=32" and cf["slo_met_after"]
    # 1200 blocks (an override) on a GPU whose memory holds ~28,000 preempt 434 times: the
    # cache tried is what the memory holds (twice the override still misses, 101x -> 27x
    # the SLO)
    s = _h100({"max_num_seqs": 256, "num_gpu_blocks": 1200}, 8.0, (1000, 2000, 6000),
              (300, 600, 1500), {"ttft_ms": {"p99": 2000}, "tpot_ms": {"p99": 60}})
    from simulator.cost_model import build_cost_model
    raw = s.model_dump(mode="python", exclude_none=True)
    raw["engine"].pop("num_gpu_blocks")
    held = build_cost_model(scenario_from_dict(raw)).num_gpu_blocks
    assert 20_000 < held < 40_000   # 8B bf16: 128 KiB per token, ~55 GiB for the cache
    r = simulate(s)
    assert r.summary["preemptions"] > 0
    d = diagnose(s, r)
    assert d["binding"] == "kv_capacity"
    cf = d["counterfactual"]
    assert cf["change"] == f"engine.num_gpu_blocks={held}" and cf["slo_met_after"]


def test_slots_and_a_cache_too_small_for_more_bind_max_num_seqs_with_the_cache():
    # 32 slots and 2600 blocks (an override) at 10 req/s on one H100: every slot is taken
    # and the cache holds about 41 at the mean context. 41 slots alone leave the SLOs missed
    # 10x; the slots the load needs with a cache that holds
    # them meet the SLOs on one GPU.
    s = _h100({"max_num_seqs": 32, "num_gpu_blocks": 2600}, 10.0, (800, 1200, 4000),
              (300, 500, 1000), {"ttft_ms": {"p99": 2000}, "tpot_ms": {"p99": 100}})
    d = diagnose(s, simulate(s))
    assert d["binding"] == "max_num_seqs"
    cf = d["counterfactual"]
    assert cf["change"].startswith("engine.max_num_seqs=64,engine.num_gpu_blocks=")
    assert cf["slo_met_after"]


def test_whole_prompts_stalling_decodes_try_512_token_chunks_whatever_the_default_slots():
    # chunked prefill off on an H100 (vllm serve's default max_num_seqs 1024): 512-token
    # chunks are a valid try (the default slots cap themselves at the budget); the chunk
    # is not floored at 1024, which still misses where 512 meets
    s = _h100({"enable_chunked_prefill": False}, 4.0, (3000, 6000, 8000), (300, 600, 1000),
              {"itl_ms": {"p99": 60}, "tpot_ms": {"p99": 40}})
    d = diagnose(s, simulate(s), counterfactual=False)
    f = next(f for f in d["findings"] if f["limit"] == "prefill_interference")
    assert f["change"] == "engine.enable_chunked_prefill=true,engine.max_num_batched_tokens=512"
    s = _h100({"enable_chunked_prefill": False, "max_num_seqs": 768}, 4.0, (3000, 6000, 8000),
              (300, 600, 1000), {"itl_ms": {"p99": 60}, "tpot_ms": {"p99": 40}})
    f = next(f for f in diagnose(s, simulate(s), counterfactual=False)["findings"]
             if f["limit"] == "prefill_interference")
    assert f["change"].endswith("engine.max_num_batched_tokens=768")   # slots set: at least


def test_a_cache_full_of_a_few_long_requests_is_found_below_the_nearly_full_mark():
    # 16 users of 2000-token prompts and 10 output tokens, 1000 blocks of 16: a request
    # holds ceil(2010 / 16) = 126 blocks, so 999 // 126 = 7 fit at once and 117 blocks
    # (fewer than one request's) stay free: the cache is 87% full on average, below the
    # 90% mark, yet it is what keeps 7 of 16 slots running while requests queue
    s = scenario_from_dict({
        "name": "d", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"num_gpu_blocks": 1000, "max_num_seqs": 16,
                   "max_num_batched_tokens": 2048, "max_model_len": 2048},
        "workload": {"seed": 0, "num_requests": 400,
                     "arrival": {"process": "closed_loop", "concurrency": 16,
                                 "think_time_s": 0},
                     "prompt_tokens": {"dist": "fixed", "value": 2000},
                     "output_tokens": {"dist": "fixed", "value": 10}}})
    r = simulate(s)
    d = diagnose(s, r, counterfactual=False)
    f = d["figures"]
    assert f["kv_holds_requests"] == 7 and f["running_per_replica_max"] == 7
    assert f["kv_cache_usage_mean"] < 0.9 and r.summary["preemptions"] == 0
    kv = next(x for x in d["findings"] if x["limit"] == "kv_capacity")
    assert "(it holds about 7 requests at their mean length, and 7 ran at once)" \
        in kv["evidence"]
    assert kv["change"] == "engine.num_gpu_blocks=2000"


def test_the_slots_a_burst_needs_are_at_most_its_requests():
    # 300 requests at once (1e6 req/s) on 4 slots: Little's law says hundreds of thousands
    # of slots; no more than the 300 requests can run at once, so 4 · 2^7 = 512 is tried
    from simulator.diagnosis import max_num_seqs_gain, max_num_seqs_needed

    s = sc({"max_num_seqs": 4}, {"constant_s": 0.01}, 1e6, n=300)
    r = simulate(s)
    assert max_num_seqs_needed(s, r) == 300
    assert max_num_seqs_gain(s, r)[1] == 512


def test_an_slo_near_what_requests_alone_take_is_met_by_faster_steps():
    # 1000-token prompts on an H100 take ~30 ms to prefill alone; a TTFT p99 SLO 5% above
    # that is missed when two prompts collide. More replicas leave collisions (and the
    # prefill) in place: two replicas still miss; tensor_parallel 2 halves the prefill
    def mk(slo, **over):
        return scenario_from_dict({
            "name": "d", "model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"},
            "engine": {"max_model_len": 4096}, "cluster": over,
            "workload": {"seed": 0, "num_requests": 400,
                         "arrival": {"process": "poisson", "rate": 2.0},
                         "prompt_tokens": {"dist": "fixed", "value": 1000},
                         "output_tokens": {"dist": "fixed", "value": 50}},
            "slo": slo})

    s = mk({})
    floor = diagnose(s, simulate(s), counterfactual=False)["figures"]["alone_ms"]
    slo = {"ttft_ms": {"p99": round(floor["ttft_ms"]["p99"] / 0.95, 3)}}
    s = mk(slo)
    d = diagnose(s, simulate(s))
    f = d["findings"][0]
    assert d["binding"] == "compute" and f["change"] == "hardware.tensor_parallel=2"
    assert "requests alone already take 95% of the SLO: faster steps make the headroom" \
        in f["evidence"]
    assert d["counterfactual"]["slo_met_after"]
    assert not simulate(mk(slo, replicas=2)).summary["slo_met"]


def _conversations(router, ttft_p99_ms):
    # 4 replicas; conversations of 4 turns behind a 64-token system prompt: a turn repeats
    # the prompt and the whole conversation so far, which only the replica that served the
    # turn before holds (each replica holds the system prompt).
    return scenario_from_dict({
        "name": "s", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 2048}, "cluster": {"replicas": 4, "router": router},
        "workload": {"seed": 0, "num_requests": 400,
                     "arrival": {"process": "poisson", "rate": 4},
                     "prompt_tokens": {"dist": "fixed", "value": 32},
                     "output_tokens": {"dist": "fixed", "value": 32},
                     "prefix": {"shared_tokens": 64},
                     "sessions": {"turns": 4, "think_time_s": 0.5}},
        "slo": {"ttft_ms": {"p99": ttft_p99_ms}}})


def test_a_router_that_scatters_conversations_over_replicas_is_found():
    from simulator.diagnosis import find_limits

    s = _conversations("round_robin", 5)
    r = simulate(s)
    d = find_limits(s, r)
    share = r.summary["prefix_cache_hit_rate"] / d["figures"]["shareable_prompt_share"]
    assert 0.5 < share < 0.8   # more than a single cache's suspicion, less than affinity's
    assert d["binding"] == "prefix_cache"
    # conversations: sticky sessions keep each history's replica
    assert d["findings"][0]["change"] == "cluster.router=session_affinity"
    for router in ("session_affinity", "prefix_affinity"):   # neither scatters them
        aff = _conversations(router, 5)
        ra = simulate(aff)
        da = find_limits(aff, ra)
        assert ra.summary["prefix_cache_hit_rate"] >= \
            0.8 * da["figures"]["shareable_prompt_share"]
        assert "prefix_cache" not in [f["limit"] for f in da["findings"]]
    # with every SLO met the free setting is listed, and does not bind
    met = _conversations("round_robin", 10_000)
    dm = find_limits(met, simulate(met))
    assert dm["binding"] == "none"
    assert [f["change"] for f in dm["findings"] if f["limit"] == "prefix_cache"] == \
        ["cluster.router=session_affinity"]


def test_the_fewest_replicas_are_found_by_plan_or_for_what_plan_refuses_by_a_sweep():
    from simulator.diagnosis import replica_sizer
    from simulator.report import diagnosis_line

    open_loop = sc({}, {"constant_s": 0.01}, 4)
    assert replica_sizer(open_loop) == "servesim plan"
    raw = open_loop.model_dump(mode="python", exclude_none=True)
    for change in ({"sessions": {"turns": 2, "think_time_s": 1}},
                   {"arrival": {"process": "closed_loop", "concurrency": 4}}):
        other = scenario_from_dict({**raw, "workload": {**raw["workload"], **change}},
                                   open_loop.base_dir)
        assert replica_sizer(other) == "servesim sweep --set cluster.replicas=1,2,3,..."
    cf = {"change": "cluster.replicas=2", "figure": "TTFT p99 (ms)", "before": 900,
          "after": 100, "slo_met_before": None, "slo_met_after": None, "breaks": []}
    line = diagnosis_line({"binding": "compute", "counterfactual": cf, "findings": [],
                           "sizer": replica_sizer(other)})
    assert "; servesim sweep --set cluster.replicas=1,2,3,... finds the fewest replicas" in line


def test_a_client_limit_that_falls_behind_binds_before_the_engine():
    # Poisson 50 req/s, one in flight at a time: 10 ms steps serve about 10 req/s
    # (10-token answers), while 64 slots stand free: raising the limit, not replicas,
    # moves the throughput (twice the limit, twice the requests served).
    s = sc({"max_num_seqs": 64}, {"constant_s": 0.01}, 50, prompt=8, out=10, n=300)
    s = scenario_from_dict({**s.model_dump(mode="python", exclude_none=True),
                            "workload": {**s.workload.model_dump(mode="python",
                                                                 exclude_none=True),
                                         "max_concurrency": 1}})
    d = diagnose(s, simulate(s))
    assert d["binding"] == "client_concurrency"
    assert d["findings"][0]["evidence"].startswith(
        "workload.max_concurrency 1 held ")
    cf = d["counterfactual"]
    assert cf["change"] == "workload.max_concurrency=2" and cf["moved"]
    assert cf["after"] == pytest.approx(2 * cf["before"], rel=0.05)


def test_wake_up_ms_by_hand():
    # IdleInfo: +10 ms after 1 s, +20 ms after 2 s, linear from 0 (5 ms after 0.5 s).
    # Replica 0: A @1.0 (idle since 0: +10), B @1.5 while A runs to 2.0 (0), a rejected
    # R @2.2 (wakes nothing), C @4.0 (idle since B's finish 2.5: +15), D @4.2 (C runs to
    # 4.1: idle 0.1 s, +1). Replica 1: E @0.5 (+5), F @3.0 unfinished at the end, G @9.0
    # (F holds the replica: 0).
    import pandas as pd

    from simulator.cost_model import IdleInfo
    from simulator.diagnosis import wake_up_ms

    nan = float("nan")
    rows = [("A", 1.0, 2.0, 0, "length"), ("B", 1.5, 2.5, 0, "length"),
            ("R", 2.2, nan, 0, "rejected"), ("C", 4.0, 4.1, 0, "length"),
            ("D", 4.2, 4.5, 0, "length"), ("E", 0.5, 0.9, 1, "length"),
            ("F", 3.0, nan, 1, None), ("G", 9.0, 9.5, 1, "length")]
    df = pd.DataFrame(rows, columns=["request_id", "arrival_s", "finish_s", "replica",
                                     "finish_reason"]).sample(frac=1, random_state=1)
    idle = IdleInfo(gaps_s=[1.0, 2.0], extra_s=[0.010, 0.020])
    got = dict(zip(df["request_id"], wake_up_ms(idle, df)))
    want = {"A": 10, "B": 0, "R": 0, "C": 15, "D": 1, "E": 5, "F": 20, "G": 0}
    assert got == pytest.approx(want, abs=1e-9)


def _idle_profile(tmp_path, extra_s=0.010):
    """The shipped CPU profile with a wake-up of ``extra_s`` after 1 s idle or more."""
    from pathlib import Path

    import yaml

    src = Path(__file__).resolve().parents[1] / "simulator" / "profiles" \
        / "cpu-llama-tiny-56m-bfloat16.yaml"
    prof = yaml.safe_load(src.read_text())
    prof["idle"] = {"gaps_s": [1.0], "extra_s": [extra_s]}
    out = tmp_path / "idle.yaml"
    out.write_text(yaml.safe_dump(prof))
    return out


def test_a_ttft_miss_that_is_the_wake_up_after_idle_binds_there(tmp_path):
    # One request every 5 s: each finds the replica idle for over 1 s, so its first step
    # pays 10 ms more, and nothing overlaps. TTFT p50 without the wake-up (the same run
    # on the profile without `idle`) is t0, with it t0 + 10 ms; an SLO of t0 + 5 ms is
    # missed for the wake-up alone: that binds, and more replicas (compute) are not offered.
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    over = ["workload.num_requests=30", "workload.arrival={process: constant, rate: 0.2}"]
    plain = simulate(load_scenario(path, over))
    t0 = plain.summary["ttft_ms"]["p50"]
    over += [f"hardware.profile={_idle_profile(tmp_path)}", f"slo.ttft_ms.p50={t0 + 5}"]
    s = load_scenario(path, over)
    r = simulate(s)
    assert r.summary["concurrency"]["requests_max"] == 1
    assert r.summary["ttft_ms"]["p50"] == pytest.approx(t0 + 10, abs=1e-5)
    d = diagnose(s, r)
    assert d["binding"] == "wake_up"
    assert [f["limit"] for f in d["findings"]] == ["wake_up"]
    w = d["figures"]["wake_up"]
    assert w["woke_share"] == 1.0 and w["extra_ms_mean"] == pytest.approx(10, abs=1e-6)
    assert w["without_ms"]["ttft_ms"]["p50"] == pytest.approx(t0, abs=1e-5)
    f = d["findings"][0]
    assert f["evidence"].startswith("100% of the requests arrived at an idle replica")
    assert "more replicas would idle longer" in f["evidence"] and f["change"] is None
    from simulator.report import diagnosis_blocks, diagnosis_line

    assert diagnosis_line(d).startswith("Binding limit: wake-up after idle")
    text = " ".join(str(b) for b in diagnosis_blocks(d))
    assert "noise-free, without the profile's wake-up after idle), ms" in text
    # with two replicas, one fewer is the knob tried
    s2 = load_scenario(path, over + ["cluster.replicas=2"])
    d2 = diagnose(s2, simulate(s2))
    assert d2["findings"][0]["limit"] == "wake_up"
    assert d2["findings"][0]["change"] == "cluster.replicas=1"
    line = diagnosis_line(d2)   # one replica fewer was tried: no pointer to more replicas
    assert "--set cluster.replicas=1" in line and "finds the fewest replicas" not in line


def test_a_wake_up_too_small_to_matter_is_not_a_finding(tmp_path):
    # +0.01 ms per wake-up moves no missed figure by 10%: the TTFT miss stays the load's
    # or the floor's, as without `idle`.
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    over = ["workload.num_requests=200", "slo.ttft_ms.p99=20"]
    s = load_scenario(path, over)
    plain = diagnose(s, simulate(s), counterfactual=False)
    s = load_scenario(path, over + [f"hardware.profile={_idle_profile(tmp_path, 1e-5)}"])
    d = diagnose(s, simulate(s), counterfactual=False)
    assert d["figures"]["wake_up"]["woke_share"] > 0
    assert [f["limit"] for f in d["findings"]] == [f["limit"] for f in plain["findings"]]


def test_a_miss_the_wake_up_explains_only_in_part_is_listed_after_the_load(tmp_path):
    # Poisson 0.5 req/s: most requests wake the replica (+10 ms), some overlap. An SLO
    # between the floor and the TTFT p50 of the same run without `idle` is missed even
    # without the wake-up: the load (compute) binds, and the wake-up, which moves the figure
    # by more than 10%, is listed after it.
    from pathlib import Path

    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    over = ["workload.num_requests=200", "workload.arrival.rate=0.5"]
    s0 = load_scenario(path, over)
    d0 = diagnose(s0, simulate(s0), counterfactual=False)
    floor = d0["figures"]["alone_ms"]["ttft_ms"]["p50"]
    t0 = d0["ttft_split"]["ttft_ms"]["p50"]
    assert floor < t0
    over += [f"hardware.profile={_idle_profile(tmp_path)}",
             f"slo.ttft_ms.p50={(floor + t0) / 2}"]
    s = load_scenario(path, over)
    d = diagnose(s, simulate(s), counterfactual=False)
    limits = [f["limit"] for f in d["findings"]]
    assert limits[0] == "compute" and "wake_up" in limits[1:]
    assert "; the wake-up after idle is part of it (TTFT p50: about" in \
        d["findings"][0]["evidence"]
    without = d["figures"]["wake_up"]["without_ms"]["ttft_ms"]["p50"]
    assert without > (floor + t0) / 2
    assert without == pytest.approx(t0, rel=0.05)   # an estimate: own wake-ups taken off


def test_an_unstable_runs_tries_that_keep_up_tie_and_the_nearest_its_slos_binds():
    from simulator.diagnosis import _winner

    def cf(after, ratio=None):   # a try of an unstable run serving 5 req/s of the 10 offered
        return {"before": 5.0, "after": after, "lower_better": False, "moved": True,
                "slo_met_after": False, **({} if ratio is None else {"slo_ratio_after": ratio})}
    # A and B both keep up (10.0 and 9.9 req/s: within 2%, Poisson noise); C serves 9 req/s.
    # B is nearer its SLOs (worst value 1.1 x its threshold against 1.4): B binds, not the
    # 1% more throughput of A
    a, b, c = ("A", cf(10.0, 1.4)), ("B", cf(9.9, 1.1)), ("C", cf(9.0, 0.5))
    assert _winner([a, b, c], unstable=True)[0] == "B"
    assert _winner([c, a], unstable=True)[0] == "A"   # C does not keep up: 9 < 0.98 x 10
    # without SLOs the tries that keep up tie and the first binds, whichever served more
    assert _winner([("A", cf(9.9)), ("B", cf(10.0))], unstable=True)[0] == "A"
    # a stable run's figure is compared as it is: the most gain, the first of equals
    assert _winner([("A", cf(9.9)), ("B", cf(10.0))], unstable=False)[0] == "B"
    assert _winner([("A", cf(10.0)), ("B", cf(10.0))], unstable=False)[0] == "A"
    # a try that meets every SLO beats any that only moves the figure
    met = dict(cf(9.0), slo_met_after=True)
    assert _winner([a, ("M", met)], unstable=True)[0] == "M"
    # nothing helps: no winner
    assert _winner([("N", dict(cf(5.0), moved=False))], unstable=True) is None
