"""Scenario schema: vLLM defaults, one-line errors naming file/flag and key path, --set
overrides, relative paths, scheduler config, JSON schema."""

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.scenario import (apply_overrides, load_scenario, scenario_from_dict,
                                scenario_json_schema)

BASE = {
    "name": "chat",
    "model": "llama-test",
    "hardware": {"step_time": {"constant_s": 0.02}},
    "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0},
                 "prompt_tokens": {"dist": "fixed", "value": 100},
                 "output_tokens": {"dist": "fixed", "value": 10}},
}


@pytest.fixture
def chat(tmp_path):
    p = tmp_path / "chat.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False))
    return p


def err(fn, *a, **kw) -> str:
    with pytest.raises(InputError) as e:
        fn(*a, **kw)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_defaults_are_vllms(chat):
    sc = load_scenario(chat)
    e = sc.engine
    assert (e.block_size, e.gpu_memory_utilization, e.enable_prefix_caching) == (16, 0.92, True)
    # vllm serve's defaults depend on the device (vLLM EngineArgs.get_batch_defaults): an
    # inline step_time names none and gets the generic GPU's
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (2048, 256)
    assert sc.dtype == "bfloat16" and sc.cluster.replicas == 1
    assert sc.cluster.router == "round_robin" and sc.hardware.tensor_parallel == 1
    assert sc.max_model_len == 2048  # llama-test's max_position_embeddings
    assert sc.base_dir == chat.parent and sc.source == "chat.yaml"
    assert sc.slo.targets() == [] and sc.sim.replications == 1


def line_of(path, needle: str) -> int:
    """1-based number of the first line of ``path`` that contains ``needle``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_a_bad_set_value_is_one_line_naming_the_flag(chat):
    assert err(load_scenario, chat, ["engine.max_num_seqs=0"]) == (
        "--set engine.max_num_seqs=0: Input should be greater than or equal to 1 (got 0)")
    chat.write_text(chat.read_text() + "engine: {max_num_seqs: 0}\n")
    assert err(load_scenario, chat) == (
        f"chat.yaml:{line_of(chat, 'max_num_seqs: 0')}: engine.max_num_seqs: Input should be "
        f"greater than or equal to 1 (got 0)")
    chat.write_text(yaml.safe_dump({**BASE, "engine": {"max_num_seq": 8}}))
    assert err(load_scenario, chat) == (
        f"chat.yaml:{line_of(chat, 'max_num_seq: 8')}: engine.max_num_seq: unknown key; "
        "did you mean max_num_seqs? (allowed: block_size, max_num_seqs, "
        "max_num_batched_tokens, gpu_memory_utilization, enable_prefix_caching, "
        "max_model_len, num_gpu_blocks, scheduler_reserve_full_isl, watermark, "
        "long_prefill_token_threshold, enable_chunked_prefill)")
    chat.write_text(yaml.safe_dump(BASE))
    assert err(load_scenario, chat, ["engine.block_size=abc"]) == (
        "--set engine.block_size=abc: Input should be a valid integer >= 1 (got 'abc')")
    # the value as read: a quoted number is a string
    assert err(load_scenario, chat, ["engine.max_num_seqs='8'"]) == (
        "--set engine.max_num_seqs='8': Input should be a valid integer >= 1 and <= "
        "1000000000 (got '8': quoted, a number is text; write 8, unquoted)")
    assert err(load_scenario, chat, ["engine={max_num_seqs: abc}"]) == (
        "--set engine={max_num_seqs: abc}: engine.max_num_seqs: Input should be a valid "
        "integer >= 1 and <= 1000000000 (got 'abc')")


@pytest.mark.parametrize("override, expected", [
    ("engine.gpu_memory_utilization=1.5", "--set engine.gpu_memory_utilization=1.5: Input "
     "should be less than or equal to 1"),
    ("engine.gpu_memory_utilization=0", "greater than 0"),
    ("engine.block_size=true", "--set engine.block_size=true: Input should be a valid integer"),
    ("engine.block_size=7", "--set engine.block_size=7: must be 1, 8, 16, 32, 64 or 128, as "
     "vLLM's --block-size (got 7)"),
    ("cluster.replicas=0", "--set cluster.replicas=0: Input should be greater than or equal to 1"),
    # past these a value is a typo, refused at its own key (it would run for hours)
    ("cluster.replicas=1000000000", "--set cluster.replicas=1000000000: Input should be less "
     "than or equal to 10000"),
    ("engine.max_num_seqs=100000000000000000000000", "--set engine.max_num_seqs="
     "100000000000000000000000: Input should be less than or equal to 1000000000"),
    ("workload.seed=9223372036854775808", "--set workload.seed=9223372036854775808: Input "
     "should be less than or equal to 9223372036854775807"),   # 2**63, past int64
    ("workload.arrival={process: closed_loop, concurrency: 1000000000000}", "workload."
     "arrival.concurrency: Input should be less than or equal to 100000000"),
    ("cluster.router=random", "Input should be 'round_robin', 'least_outstanding', "
     "'prefix_affinity' or 'session_affinity'"),
    ("dtype=int8", "--set dtype=int8: Input should be 'float32', 'bfloat16' or 'float16'"),
    ("slo.ttft_ms.p98x=3", "--set slo.ttft_ms.p98x=3: unknown statistic 'p98x': "
     "use mean or pNN, a percentile in (0, 100]"),
    ("slo.ttft_ms={}", "give at least one statistic (mean, p50, p90, p95, p99, p99.9, ...)"),
    ("slo.goodput_ms={p99: 3}", "unknown key (allowed: ttft_ms, tpot_ms, itl_ms, e2el_ms, "
     "queue_ms)"),
    ("sim.warmup_requests=-1", "greater than or equal to 0"),
    ("sim.warmup_requests=10", "--set sim.warmup_requests=10: 10 leaves none of the 10 "
     "requests (workload.num_requests) to measure: must be < 10"),
    ("hardware.tensor_parallel=3", "--set hardware.tensor_parallel=3: 3 does not divide the "
     "model's num_attention_heads (4)"),
    ("hardware.profile=h100-sxm", "chat.yaml:3 (with --set hardware.profile=h100-sxm): hardware: "
     "give exactly one of profile"),
    ("hardware.step_time={constant_s: 1, base_s: 1}", "give either constant_s, or the linear"),
    ("hardware.step_time.constant_s=0", "greater than or equal to 0.000000001"),
    ("engine.max_model_len=4096", "--set engine.max_model_len=4096: 4096 is longer than the "
     "model's max_position_embeddings (2048)"),
    ("engine.max_num_seqs=4096", "--set engine.max_num_seqs=4096: engine: "
     "max_num_batched_tokens (2048) must be >= max_num_seqs (4096), as vLLM requires (the "
     "file has no engine; this flag makes one)"),
    ("workload.arrival.rate=-1", "--set workload.arrival.rate=-1: Input should be greater "
     "than 0"),
    ("model=llama-9", "--set model=llama-9: 'llama-9' is neither a catalog model"),
    ("model=3", "--set model=3: expected a catalog name"),
    ("name.x=1", "--set name.x=1: name is 'chat', not a mapping with a key x; set name "
     "itself (--set name=...)"),
    # what was given, as YAML writes it: null (not None), true, a list
    ("workload.arrival.rate=null", "--set workload.arrival.rate=null: Input should be a "
     "valid number > 0 and <= 1000000000 (got null)"),
    ("engine.max_num_seqs=true", "Input should be a valid integer >= 1 and <= 1000000000 "
     "(got true)"),
    ("workload.arrival.rate=[1]", "Input should be a valid number > 0 and <= 1000000000 "
     "(got [1])"),
    # a quoted number is text: say so, and how to write it
    ("engine.max_num_seqs='4'", "(got '4': quoted, a number is text; write 4, unquoted)"),
    ("engine.max_num_seqs='1e2'", "(got '1e2': quoted, a number is text; write 100, unquoted)"),
    ("workload.arrival.rate='2.5'", "--set workload.arrival.rate='2.5': Input should be a "
     "valid number > 0 and <= 1000000000 (got '2.5': quoted, a number is text; write 2.5, "
     "unquoted)"),
    ("engine.max_num_seqs='abc'", "<= 1000000000 (got 'abc')"),
    # a typo'd key: the closest allowed one first
    ("engine.max_num_seq=64", "--set engine.max_num_seq=64: unknown key; did you mean "
     "max_num_seqs? (allowed: block_size, max_num_seqs,"),
    ("engine.zzz=64", "--set engine.zzz=64: unknown key (allowed: block_size,"),
    # an empty key in the path
    ("engine..max_num_seqs=64", "--set engine..max_num_seqs=64: an empty key in "
     "'engine..max_num_seqs' (a dot at its start or end, or two in a row)"),
    (".engine=4", "--set .engine=4: an empty key in '.engine'"),
    # an int key refuses a float as vLLM's argparse does: say how to write it
    ("engine.max_num_seqs=1e2", "--set engine.max_num_seqs=1e2: Input should be a valid "
     "integer >= 1 and <= 1000000000 (got 100.0: write 100, without a point or exponent)"),
    ("engine.block_size=16.0", "--set engine.block_size=16.0: Input should be a valid integer "
     ">= 1 (got 16.0: write 16, without a point or exponent)"),
    # ... but not a whole number the key refuses in any form: the sizes it takes instead
    ("engine.block_size=1e12", "--set engine.block_size=1e12: must be 1, 8, 16, 32, 64 or 128, "
     "as vLLM's --block-size (got 1000000000000)"),
    ("engine", "--set engine: expected key.path=value"),
    ("", "--set '': expected key.path=value"),
    # a blank path or model would resolve to the scenario's folder: refused as empty
    ("model=''", "--set model='': empty: give a catalog model (llama-3.1-8b,"),
    ("hardware.profile=' '", "--set hardware.profile=' ': empty: give a catalog GPU or a "
     "calibration profile's name or path (servesim profiles lists them)"),
    ("workload.prompt_tokens={dist: empirical, path: ' ', column: a}",
     "workload.prompt_tokens.path: empty: give the file, relative to the scenario's folder"),
    ("workload={trace: {path: '', format: azure}}",
     "workload.trace.path: empty: give the file, relative to the scenario's folder"),
    ("workload.prefix={shared_tokens: 100, groups: 1000001}",
     "workload.prefix.groups: Input should be less than or equal to 1000000"),
    # every prompt is the prefix and a token of its own: none under max_model_len 2048
    ("workload.prefix={shared_tokens: 2048}", "--set workload.prefix={shared_tokens: 2048}: "
     "workload.prefix.shared_tokens: 2048 tokens leave no prompt under max_model_len (2048): "
     "every request would be rejected; must be < 2048"),
    # arrivals are integer ns: a faster rate would be a burst at t = 0
    ("workload.arrival.rate=1e30", "workload.arrival.rate=1e30: Input should be less than or "
                                   "equal to 1000000000 (got 1e+30)"),
    ("workload.trace.window_s.1=5", "--set workload.trace.window_s.1=5: 1 is not a key "
     "(scenario keys are names; a list is set whole, e.g. workload.trace.window_s=[0, 60])"),
    ("plan.candidates.hardware.profile.0=h200", "hardware.profile.0=h200: 0 is not a key"),
    ("engine.0=3", "--set engine.0=3: 0 is not a key"),
    ("engine.block_size=[1", "--set engine.block_size=[1: value is not valid YAML"),
    # no float key takes .nan/.inf: refused as not finite, not by a bound check ("<= 1 (got
    # nan)") or as a later key's error
    ("engine.gpu_memory_utilization=.nan", "engine.gpu_memory_utilization=.nan: Input should "
                                           "be a finite number (got nan)"),
    ("workload.arrival={process: gamma, rate: 1, burstiness: .inf}",
     "workload.arrival.burstiness: Input should be a finite number"),
    ("hardware.price_per_gpu_hour=.nan", "price_per_gpu_hour=.nan: Input should be a finite"),
])
def test_bad_values_one_line(chat, override, expected):
    assert expected in err(load_scenario, chat, [override])


def test_a_key_of_another_union_member_names_the_member_that_takes_it(chat):
    # swept process=poisson over a gamma scenario: the error also says how to sweep either
    chat.write_text(yaml.safe_dump({**BASE, "workload": {
        **BASE["workload"], "arrival": {"process": "gamma", "rate": 2, "burstiness": 0.5}}}))
    assert err(load_scenario, chat, ["workload.arrival.process=poisson"]).endswith(
        "workload.arrival.burstiness: unknown key (allowed: rate, normalize_duration, "
        "process); burstiness is a key of process: gamma, not of poisson (process: gamma "
        "with burstiness 1 is a Poisson process)")
    chat.write_text(yaml.safe_dump({**BASE, "workload": {
        **BASE["workload"], "prompt_tokens": {"dist": "fixed", "value": 8, "median": 9}}}))
    assert err(load_scenario, chat).endswith(
        "; median is a key of dist: lognormal, not of fixed")
    # several unknown keys at once: each that some member takes is named
    chat.write_text(yaml.safe_dump({**BASE, "workload": {**BASE["workload"], "arrival": {
        "process": "poisson", "rate": 2, "burstiness": 0.5, "concurrency": 3, "zz": 1}}}))
    assert err(load_scenario, chat).endswith(
        "workload.arrival: unknown keys: burstiness, concurrency, zz (allowed: rate, "
        "normalize_duration, process); burstiness is a key of process: gamma and concurrency "
        "is a key of process: closed_loop, not of poisson")
    chat.write_text(yaml.safe_dump({**BASE, "workload": {   # one owner: said once
        **BASE["workload"], "prompt_tokens": {"dist": "fixed", "value": 9, "median": 9,
                                              "p90": 20}}}))
    assert err(load_scenario, chat).endswith(
        "; median and p90 are keys of dist: lognormal, not of fixed")
    # a close key of its own as well: both said
    chat.write_text(yaml.safe_dump({**BASE, "workload": {
        **BASE["workload"], "prompt_tokens": {"dist": "normal", "mean": 9, "std": 1,
                                              "median": 9}}}))
    assert err(load_scenario, chat).endswith(
        "workload.prompt_tokens.median: unknown key; did you mean mean? (allowed: min, max, "
        "dist, mean, std); median is a key of dist: lognormal, not of normal")
    chat.write_text(yaml.safe_dump(BASE))   # a key no member takes: no such clause
    assert "is a key of" not in err(load_scenario, chat, ["workload.arrival.zzz=1"])


@pytest.mark.parametrize("model, tp, expected", [
    # Qwen2.5-7B: 28 heads, 4 KV heads: 7 divides the heads, yet a shard cannot hold a
    # whole KV head nor a replica of one (vLLM's QKVParallelLinear divides either way)
    ("qwen2.5-7b", 7, "7 neither divides the model's num_key_value_heads (4) nor is a "
                      "multiple of it, as vLLM requires; this model allows 1, 2, 4"),
    ("qwen2.5-7b", 2, None), ("llama-test", 4, None),   # 2 KV heads, each on 2 GPUs
    # the MLP's rows split evenly too (MergedColumnParallelLinear)
    ("{hidden_size: 64, intermediate_size: 100, num_hidden_layers: 1, "
     "num_attention_heads: 8, num_key_value_heads: 8, vocab_size: 50, "
     "max_position_embeddings: 4096}", 8,
     "8 does not divide the model's intermediate_size (100), as vLLM requires; this "
     "model allows 1, 2, 4"),
])
def test_tensor_parallel_must_shard_what_vllm_shards(chat, model, tp, expected):
    flags = [f"model={model}", f"hardware.tensor_parallel={tp}"]
    if expected is None:
        assert load_scenario(chat, flags).hardware.tensor_parallel == tp
    else:
        assert err(load_scenario, chat, flags) == \
            f"--set hardware.tensor_parallel={tp}: {expected}"


def test_a_flag_that_changes_a_distribution_is_named_in_the_errors_it_causes(chat):
    # output_tokens.value is on line 16 of the dumped BASE; that key is now unknown
    # because --set changed dist beside it
    assert err(load_scenario, chat, ["workload.output_tokens.dist=uniform"]) == (
        "chat.yaml:16 (with --set workload.output_tokens.dist=uniform): "
        "workload.output_tokens.value: unknown key (allowed: min, max, dist); value is a "
        "key of dist: fixed, not of uniform (and 2 more errors, at workload.output_tokens.min, workload.output_tokens.max)")
    # a flag elsewhere in the workload is not named
    assert err(load_scenario, chat, ["workload.num_requests=5",
                                     "workload.output_tokens={dist: fixed, value: 1, x: 2}"]
               ) == ("--set workload.output_tokens={dist: fixed, value: 1, x: 2}: "
                     "workload.output_tokens.x: unknown key (allowed: min, max, dist, value)")


def test_more_set_flags_than_a_scenario_has_keys_are_refused(chat):
    from simulator.scenario import MAX_OVERRIDES
    flags = [f"engine.k{i}=1" for i in range(MAX_OVERRIDES + 1)]
    assert err(load_scenario, chat, flags) == (
        f"--set is given {MAX_OVERRIDES + 1:,} times; at most {MAX_OVERRIDES:,} (put the "
        f"settings in the scenario file)")


def test_a_flag_below_a_mapping_flag_is_named_in_the_error_they_make_together(chat):
    # both the mapping flag and the key set inside it are named: each is half the cause
    assert err(load_scenario, chat, ["workload.prompt_tokens={dist: fixed, value: 100}",
                                     "workload.prompt_tokens.max=50"]) == (
        "--set workload.prompt_tokens={dist: fixed, value: 100} (with --set "
        "workload.prompt_tokens.max=50): max (50) is below the value (100): every sample "
        "would be clipped to max")


def test_a_flag_beside_a_file_error_that_cannot_have_caused_it_is_not_named(chat):
    # workload.num_requests is set beside workload.seed and workload.prompt_tokens, but
    # neither a non-integer seed nor p90 < median can come from it.
    text = chat.read_text()
    chat.write_text(text.replace("  num_requests: 10\n", "  num_requests: 10\n  seed: 1.5\n"))
    assert err(load_scenario, chat, ["workload.num_requests=100"]) == (
        f"chat.yaml:{line_of(chat, 'seed: 1.5')}: workload.seed: Input should be a valid "
        f"integer >= 0 and <= 9223372036854775807 (got 1.5)")
    lognormal = "  prompt_tokens:\n    dist: lognormal\n    median: 100\n    p90: 50\n"
    chat.write_text(text.replace("  prompt_tokens:\n    dist: fixed\n    value: 100\n",
                                 lognormal))
    assert err(load_scenario, chat, ["workload.num_requests=100"]) == (
        f"chat.yaml:{line_of(chat, 'prompt_tokens:')}: workload.prompt_tokens: p90 (50) must "
        f"be >= median (100)")
    # the arrival's process tag set by a flag does change what the file's keys may be
    msg = err(load_scenario, chat, ["workload.arrival.process=closed_loop",
                                    "workload.prompt_tokens.p90=500"])
    assert msg.startswith(f"chat.yaml:{line_of(chat, 'rate:')} (with --set "
                          f"workload.arrival.process=closed_loop): workload.arrival.rate: "
                          f"unknown key")


def test_an_error_names_every_flag_among_the_keys_it_depends_on(chat):
    # Scenario.error(depends=...): the flags on keys the error follows from are named,
    # flags on others are not.
    sc = load_scenario(chat, ["engine.gpu_memory_utilization=0.5", "hardware.tensor_parallel=2",
                              "workload.num_requests=5"])
    msg = str(sc.error("hardware", "no room", depends=("engine.gpu_memory_utilization",)))
    assert msg == (f"chat.yaml:{line_of(chat, 'hardware:')} (with --set "
                   f"engine.gpu_memory_utilization=0.5, --set hardware.tensor_parallel=2): "
                   f"hardware: no room")   # in command-line order
    # a cache sized from memory: max_model_len that does not fit names the memory flag
    chat.write_text(chat.read_text() + "engine: {max_model_len: 2048}\n")
    sc = load_scenario(chat, ["engine.gpu_memory_utilization=0.5", "workload.seed=3"])
    msg = err(sc.scheduler_config, 3)
    assert msg.startswith(f"chat.yaml:{line_of(chat, 'max_model_len')} (with --set "
                          f"engine.gpu_memory_utilization=0.5): engine.max_model_len: 2048 "
                          f"tokens need 128 KV blocks")


@pytest.mark.parametrize("bound, got", [
    (".inf", "inf: .inf, or a number past the largest float, 1.8e308"),
    ("-.inf", "-inf: -.inf, or a number below -1.8e308"), (".nan", "nan"),
                                        ("-5", "-5"), ("0", "0"), ("1e300", "1e+300"),
                                        ("1000000001", "1000000001")])
def test_slo_bound_errors_name_the_file_like_other_keys(chat, bound, got):
    # every bad SLO bound, an infinite one included, fails at load time with the file
    # prefix, not after the run
    chat.write_text(chat.read_text() + f"slo: {{ttft_ms: {{p99: {bound}}}}}\n")
    msg = err(load_scenario, chat)
    assert msg.startswith(f"chat.yaml:{line_of(chat, 'slo:')}: slo.ttft_ms.p99: Input should "
                          f"be ") and msg.endswith(
        f"(got {got})")


def test_an_slo_takes_mean_or_any_percentile(chat):
    chat.write_text(chat.read_text() + "slo:\n  ttft_ms: {p99.9: 800, p75: 200, mean: 90}\n")
    sc = load_scenario(chat, ["slo.tpot_ms.p99.9=50"])   # the statistic's dot is no path
    assert sc.slo.targets() == [("ttft_ms", "mean", 90.0), ("ttft_ms", "p75", 200.0),
                                ("ttft_ms", "p99.9", 800.0), ("tpot_ms", "p99.9", 50.0)]
    line = line_of(chat, "ttft_ms:")
    for bad, said in (("{p42x: 5}", ".p42x: unknown statistic 'p42x': use mean or pNN, a "
                                    "percentile in (0, 100]"),
                      ("{max: 5}", ".max: unknown statistic 'max'"),
                      ("{}", ": give at least one statistic (mean, p50, p90, p95, p99, "
                             "p99.9, ...)")):
        text = chat.read_text().replace("{p99.9: 800, p75: 200, mean: 90}", bad)
        chat.write_text(text)
        assert err(load_scenario, chat).startswith(f"chat.yaml:{line}: slo.ttft_ms{said}")
        chat.write_text(text.replace(bad, "{p99.9: 800, p75: 200, mean: 90}"))
    # a statistic on a line of its own is named there, not at its metric's line
    text = chat.read_text()
    chat.write_text(text.replace("{p99.9: 800, p75: 200, mean: 90}", "\n    p99: 800\n    p101: 5"))
    assert err(load_scenario, chat).startswith(
        f"chat.yaml:{line_of(chat, 'p101:')}: slo.ttft_ms.p101: unknown statistic 'p101'")


def test_exponent_numbers_read_as_floats_in_file_and_flags(chat):
    # PyYAML's YAML 1.1 rules would leave 1e5 and 1E-3 as strings ("valid number" errors)
    chat.write_text(chat.read_text() + "slo: {ttft_ms: {p99: 1e5}, tpot_ms: {p90: 2E+2}}\n")
    sc = load_scenario(chat, ["hardware.step_time.constant_s=1E-3",
                              "workload.arrival.rate=+1e1"])
    assert sc.slo.targets() == [("ttft_ms", "p99", 1e5), ("tpot_ms", "p90", 200.0)]
    assert sc.hardware.step_time.constant_s == 0.001 and sc.workload.arrival.rate == 10.0


def test_unknown_keys_reported_before_consequences(tmp_path):
    p = tmp_path / "s.yaml"
    raw = {k: v for k, v in BASE.items() if k != "hardware"}
    p.write_text(yaml.safe_dump({**raw, "hardwre": BASE["hardware"]}))
    assert err(load_scenario, p).startswith(
        f"s.yaml:{line_of(p, 'hardwre:')}: hardwre: unknown key; did you mean hardware? "
        "(allowed: name, model, dtype, "
        "hardware, engine, cluster, "
        "workload, slo, sim, plan) (and 1 more error, at hardware)")


def test_a_key_that_is_not_text_is_named_as_written(tmp_path, chat):
    # YAML reads `true:` as a boolean key (and `3:` as a number); pydantic puts it in the
    # path as 1: the error names the mapping and the key as YAML wrote it.
    p = tmp_path / "s.yaml"
    allowed = ("block_size, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, "
               "enable_prefix_caching, max_model_len, num_gpu_blocks, "
               "scheduler_reserve_full_isl, watermark, long_prefill_token_threshold, "
               "enable_chunked_prefill")
    for key in ("true", "3", "null", "1.5"):
        p.write_text(yaml.safe_dump(BASE, sort_keys=False) + f"engine:\n  {key}: 1\n")
        assert err(load_scenario, p) == (
            f"s.yaml:{line_of(p, 'engine:')}: engine: key {key} is not text: keys are names "
            f"(allowed: {allowed})")
    assert err(load_scenario, chat, ["engine={true: 1}"]) == (
        f"--set engine={{true: 1}}: key true is not text: keys are names (allowed: {allowed})")
    # a plain mapping (an SLO's statistics) is named the same way
    p.write_text(yaml.safe_dump(BASE, sort_keys=False) + "slo:\n  ttft_ms:\n    99: 500\n")
    assert err(load_scenario, p) == (f"s.yaml:{line_of(p, 'ttft_ms:')}: slo.ttft_ms: key 99 "
                                     f"is not text: keys are names")


@pytest.mark.parametrize("key", ["1", "~", "null", "true", "1.5"])
def test_a_top_level_key_that_is_not_text_names_its_line(tmp_path, key):
    # no mapping above it to name: the line of the key itself, as for an unknown key
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False) + f"{key}: foo\nslo: {{}}\n")
    shown = {"~": "null"}.get(key, key)
    assert err(load_scenario, p) == (
        f"s.yaml:{line_of(p, f'{key}: foo')}: key {shown} is not text: keys are names "
        "(allowed: name, model, dtype, hardware, engine, cluster, workload, slo, sim, plan)")


def test_a_decimal_comma_in_a_flow_mapping_is_named(tmp_path):
    # {rate: 4,0} is YAML for {rate: 4, 0: null}: the key 0 is the decimal comma's
    p = tmp_path / "s.yaml"
    raw = {k: v for k, v in BASE.items() if k != "workload"}
    p.write_text(yaml.safe_dump(raw, sort_keys=False) + (
        "workload:\n  num_requests: 10\n  arrival: {process: poisson, rate: 4,0}\n"
        "  prompt_tokens: {dist: fixed, value: 8}\n  output_tokens: {dist: fixed, value: 4}\n"))
    assert err(load_scenario, p) == (
        f"s.yaml:{line_of(p, 'arrival:')}: workload.arrival: key 0 is not text: keys are "
        "names (allowed: rate, normalize_duration, process); in a {…} mapping a comma "
        "separates entries (4,0): a decimal takes a point")


@pytest.mark.parametrize("key, value, said", [
    ("rate", "4,0", "Input should be a valid number > 0 and <= 1000000000 (got '4,0': YAML "
                    "reads a number with a comma as text; write 4.0 or 40)"),
    ("num_requests", "1,000", "Input should be a valid integer >= 1 and <= 100000000 (got "
                              "'1,000': YAML reads a number with a comma as text; write 1000)")])
def test_a_number_with_a_comma_says_how_to_write_it(tmp_path, key, value, said):
    p = tmp_path / "s.yaml"
    raw = {k: v for k, v in BASE.items() if k != "workload"}
    rate = value if key == "rate" else "4"
    n = value if key == "num_requests" else "10"
    p.write_text(yaml.safe_dump(raw, sort_keys=False) + (
        f"workload:\n  num_requests: {n}\n  arrival:\n    process: poisson\n"
        f"    rate: {rate}\n  prompt_tokens: {{dist: fixed, value: 8}}\n"
        f"  output_tokens: {{dist: fixed, value: 4}}\n"))
    path = "workload.arrival.rate" if key == "rate" else "workload.num_requests"
    assert err(load_scenario, p) == f"s.yaml:{line_of(p, key + ':')}: {path}: {said}"


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: llama-test\nengine: {block_size: [16}\n")
    assert err(load_scenario, p).startswith("bad.yaml:3: YAML syntax error:")
    # an unclosed { or quote is noticed a line later: the line where it starts is named too
    p.write_text("name: x\nmodel: llama-test\nengine: {block_size: 16\nworkload: {}\n")
    assert err(load_scenario, p) == (
        "bad.yaml:4: YAML syntax error: expected ',' or '}', but got ':' (in the flow "
        "mapping that starts at line 3)")
    p.write_text("name: 'x\nmodel: llama-test\n")
    assert err(load_scenario, p).endswith("(in the quoted scalar that starts at line 1)")
    p.write_text("- a\n- b\n")
    assert "a scenario is a mapping" in err(load_scenario, p)
    assert err(load_scenario, tmp_path / "nope.yaml").endswith("nope.yaml: scenario file not found")


def test_overrides_apply_yaml_values(chat):
    sc = load_scenario(chat, ["engine.max_num_seqs=8", "engine.enable_prefix_caching=false",
                              "slo.ttft_ms={p99: 500, mean: 200}", "cluster.router=prefix_affinity",
                              "hardware.step_time={base_s: 0.001, per_decode_seq_s: 0.0001}"])
    assert sc.engine.max_num_seqs == 8 and sc.engine.enable_prefix_caching is False
    assert sc.slo.targets() == [("ttft_ms", "mean", 200.0), ("ttft_ms", "p99", 500.0)]
    assert sc.hardware.step_time.form == "linear"
    assert BASE["hardware"] == {"step_time": {"constant_s": 0.02}}  # input not mutated
    assert sc.name == "chat"


def test_relative_model_path_resolves_against_scenario_folder(tmp_path):
    from simulator.catalog import load_model
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(
        json.dumps(load_model("llama-tiny-56m").hf_config()))
    (tmp_path / "sub").mkdir()
    p = tmp_path / "sub" / "s.yaml"
    p.write_text(yaml.safe_dump({**BASE, "model": "../models"}))
    sc = load_scenario(p)
    assert sc.model_shape.num_params == load_model("llama-tiny-56m").num_params


def test_every_path_in_a_scenario_may_start_with_home(tmp_path, monkeypatch):
    # ~ expands in every path key: profile, model, trace, empirical distribution
    from simulator.catalog import load_model
    from simulator.workload import build_workload
    home = tmp_path / "home"
    (home / "m").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / "m" / "config.json").write_text(json.dumps(load_model("llama-tiny-56m").hf_config()))
    (home / "t.csv").write_text("t,p,o\n0.0,5,3\n0.5,7,4\n")
    (home / "lens.csv").write_text("n\n9\n")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**BASE, "model": "~/m", "workload": {
        "trace": {"path": "~/t.csv", "format": "csv",
                  "columns": {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}}}}))
    sc = load_scenario(p)
    assert sc.model_shape.num_params == load_model("llama-tiny-56m").num_params
    specs = build_workload(sc.workload, base_dir=sc.base_dir)
    assert [(x.prompt_tokens, x.max_tokens) for x in specs] == [(5, 3), (7, 4)]
    p.write_text(yaml.safe_dump({**BASE, "workload": {**BASE["workload"], "prompt_tokens": {
        "dist": "empirical", "path": "~/lens.csv", "column": "n"}}}))
    sc = load_scenario(p)
    assert {x.prompt_tokens for x in build_workload(sc.workload, base_dir=sc.base_dir)} == {9}


def test_a_path_typed_in_a_flag_is_relative_to_the_current_directory(tmp_path, monkeypatch):
    # In the file, relative to the file's folder; on the command line, to the shell's.
    from simulator.catalog import load_model
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(
        json.dumps(load_model("llama-tiny-56m").hf_config()))
    (tmp_path / "sub").mkdir()
    p = tmp_path / "sub" / "s.yaml"
    p.write_text(yaml.safe_dump(BASE))
    monkeypatch.chdir(tmp_path)
    sc = load_scenario("sub/s.yaml", ["model=llama-tiny-56m"])
    assert sc.model == "llama-tiny-56m"   # no "/": a catalog name, as typed
    sc = load_scenario("sub/s.yaml", ["model=./models"])
    assert sc.model_shape.num_params == load_model("llama-tiny-56m").num_params
    # a bare name of a folder here is that folder, not a catalog name to refuse; a catalog
    # name wins over a folder of that name
    sc = load_scenario("sub/s.yaml", ["model=models"])
    assert sc.model_shape.num_params == load_model("llama-tiny-56m").num_params
    (tmp_path / "llama-test").mkdir()
    assert load_scenario("sub/s.yaml", ["model=llama-test"]).model == "llama-test"
    raw, _ = apply_overrides({}, ["hardware.profile=p/x.yaml", "workload.trace.path=/t.csv",
                                  "workload.prompt_tokens={dist: empirical, path: l.csv}"],
                             tmp_path)
    assert raw == {"hardware": {"profile": str(tmp_path / "p" / "x.yaml")},
                   "workload": {"trace": {"path": "/t.csv"},
                                "prompt_tokens": {"dist": "empirical",
                                                  "path": str(tmp_path / "l.csv")}}}
    # plan.candidates' keys are dotted scenario keys: the rest of a flag's path is one key,
    # and profile files in its value lists are the shell's paths too (catalog names stay)
    raw, origins = apply_overrides({}, [
        "plan.candidates.hardware.profile=[p/x.yaml, h100-sxm]",
        "plan.candidates.engine.max_num_seqs=[4, 8]"], tmp_path)
    assert raw == {"plan": {"candidates": {
        "hardware.profile": [str(tmp_path / "p" / "x.yaml"), "h100-sxm"],
        "engine.max_num_seqs": [4, 8]}}}
    assert ("plan", "candidates", "engine.max_num_seqs") in origins
    raw, _ = apply_overrides({}, ["plan.candidates={hardware.profile: [p/x.yaml], "
                                  "model: [m/config.json]}"], tmp_path)
    assert raw["plan"]["candidates"] == {"hardware.profile": [str(tmp_path / "p" / "x.yaml")],
                                         "model": [str(tmp_path / "m" / "config.json")]}


def test_an_unquoted_no_where_text_is_wanted_is_named(chat):
    # YAML 1.1, as PyYAML and vLLM's config files read it: unquoted no/on are booleans
    assert err(load_scenario, chat, ["name=no"]).endswith(
        "--set name=no: Input should be a valid string (got false: YAML reads unquoted no, "
        "off and false as false; quote text)")
    assert err(load_scenario, chat, ["cluster.router=on"]).endswith(
        "(got true: YAML reads unquoted yes, on and true as true; quote text)")
    assert err(load_scenario, chat, ["model=no"]).endswith(
        "(got false: YAML reads unquoted no, off and false as false; quote text)")
    assert err(load_scenario, chat, ["workload.arrival.process=on"]).endswith(
        "workload.arrival.process=on: true is not one of 'poisson', 'gamma', 'constant', "
        "'closed_loop' (got true: YAML reads unquoted yes, on and true as true; quote text)")
    assert load_scenario(chat, ["name='no'"]).name == "no"
    assert not load_scenario(chat, ["engine.enable_prefix_caching=off"]
                             ).engine.enable_prefix_caching


def test_scheduler_config():
    sc = scenario_from_dict({**BASE, "engine": {"max_num_seqs": 4, "block_size": 8}})
    cfg = sc.scheduler_config(None)
    assert (cfg.max_num_seqs, cfg.block_size, cfg.num_gpu_blocks, cfg.max_model_len,
            cfg.watermark) == (4, 8, None, 2048, 0.0)
    assert scenario_from_dict({**BASE, "engine": {"watermark": 0.01}}).scheduler_config(
        None).watermark == 0.01
    cfg = scenario_from_dict({**BASE, "engine": {"long_prefill_token_threshold": 512}}
                             ).scheduler_config(None)
    assert cfg.long_prefill_token_threshold == 512
    # past max_model_len (vLLM refuses it at start-up too) ...
    assert err(scenario_from_dict, {**BASE, "engine": {"long_prefill_token_threshold": 4096}}
               ).endswith("engine.long_prefill_token_threshold: 4096 cannot be greater than "
                          "max_model_len (2048), as vLLM requires")
    # ... but not past a default max_model_len capped to the cache: capped with it
    capped = scenario_from_dict({**BASE, "engine": {"long_prefill_token_threshold": 2048}}
                                ).scheduler_config(65)   # 64 blocks of 16: 1024 tokens
    assert (capped.max_model_len, capped.long_prefill_token_threshold) == (1024, 1024)
    assert "engine.watermark" in err(scenario_from_dict, {**BASE, "engine": {"watermark": 1}})
    # Chunked prefill off: vLLM raises the default token budget to max_model_len (the
    # model's 131072 here, above the generic 2048) and refuses an explicit one below it.
    off = {"enable_chunked_prefill": False}
    big = scenario_from_dict({**BASE, "model": "llama-3.1-8b", "engine": off})
    assert big.max_num_batched_tokens == 131072
    assert not big.scheduler_config(None).enable_chunked_prefill
    assert scenario_from_dict({**BASE, "model": "llama-3.1-8b", "engine": {
        **off, "max_model_len": 4096}}).max_num_batched_tokens == 4096
    assert scenario_from_dict({**BASE, "engine": off}).max_num_batched_tokens == 2048
    assert err(scenario_from_dict, {**BASE, "engine": {**off, "max_num_batched_tokens": 1024}}
               ).endswith("engine.max_num_batched_tokens: 1024 is smaller than max_model_len "
                          "(2048) with enable_chunked_prefill false: a longer prompt could "
                          "never be scheduled; vLLM requires max_num_batched_tokens >= "
                          "max_model_len (raise it, lower max_model_len, or leave "
                          "max_num_batched_tokens unset)")
    assert scenario_from_dict({**BASE, "engine": {"max_num_batched_tokens": 1024}}
                              ).scheduler_config(None).enable_chunked_prefill
    # a quoted 'false' is text: the error says what a boolean is
    assert err(scenario_from_dict, {**BASE, "engine": {"enable_chunked_prefill": "maybe"}}
               ).endswith("engine.enable_chunked_prefill: Input should be a valid boolean: "
                          "true or false (or yes/no, on/off), unquoted (got 'maybe')")
    # default max_model_len is capped to what (N - 1) blocks hold
    assert sc.scheduler_config(101).max_model_len == 800
    sc = scenario_from_dict({**BASE, "engine": {"block_size": 8, "max_model_len": 1000}})
    assert sc.scheduler_config(200).max_model_len == 1000
    msg = err(sc.scheduler_config, 101)
    assert msg == ("<scenario>: engine.max_model_len: 1000 tokens need 125 KV blocks of 8 but "
                   "the cache holds 100 for requests (101 blocks less block 0, which vLLM "
                   "reserves as its null block): lower max_model_len (to at most 800) or give the "
                   "KV cache more memory")


def test_two_block_cache_message_explains_the_null_block(chat):
    # num_gpu_blocks 2 leaves one block for requests: block 0 is vLLM's null block
    # (BlockPool.null_block). 64 tokens in blocks of 16 need ceil(64/16) = 4.
    sc = load_scenario(chat, ["engine.num_gpu_blocks=2", "engine.max_model_len=64"])
    assert err(sc.scheduler_config, sc.engine.num_gpu_blocks) == (
        "--set engine.max_model_len=64: 64 tokens need 4 KV blocks of 16 but the cache "
        "holds 1 for requests (2 blocks less block 0, which vLLM reserves as its null "
        "block): lower max_model_len (to at most 16) or raise engine.num_gpu_blocks (or "
        "remove it to size "
        "the cache from gpu_memory_utilization)")


def test_inline_model_mapping():
    sc = scenario_from_dict({**BASE, "model": {"name": "mini", "hidden_size": 32,
                                               "intermediate_size": 64, "num_hidden_layers": 1,
                                               "num_attention_heads": 2, "vocab_size": 50,
                                               "max_position_embeddings": 128}})
    assert sc.model_shape.name == "mini" and sc.max_model_len == 128
    assert "model.foo: unknown key" in err(scenario_from_dict, {**BASE, "model": {"foo": 1}})


def test_json_schema():
    s = scenario_json_schema()
    json.dumps(s)
    assert {"name", "model", "hardware", "engine", "cluster", "workload", "slo", "sim"} <= set(
        s["properties"])
    assert set(s["required"]) == {"model", "hardware", "workload"}
    eng = s["$defs"]["EngineConfig"]
    assert eng["additionalProperties"] is False
    assert "max_num_batched_tokens" in eng["properties"]


def test_the_json_schema_takes_every_shipped_scenario_and_the_shorthands():
    # editors validate scenarios with it: a form load_scenario takes must pass it too
    import jsonschema
    s = scenario_json_schema()
    check = jsonschema.Draft202012Validator(s)
    for path in sorted((Path(__file__).parents[1] / "scenarios").glob("*.yaml")):
        check.validate(yaml.safe_load(path.read_text()))
    wl = {**BASE["workload"], "sessions": {"turns": 3, "think_time_s": 0.5}}
    scenario_from_dict({**BASE, "workload": wl})   # taken by the loader ...
    check.validate({**BASE, "workload": wl})       # ... and by the schema
    loop = {**BASE["workload"], "arrival": {"process": "closed_loop", "concurrency": 4,
                                            "think_time_s": 0.5}}
    scenario_from_dict({**BASE, "workload": loop})
    check.validate({**BASE, "workload": loop})
    for bad in ({"turns": 0}, {"turns": 2, "think_time_s": -1}, {"turns": 1.5}):
        assert not check.is_valid({**BASE, "workload": {**BASE["workload"], "sessions": bad}})
    # SLO statistics: the schema takes what the loader takes, and no other
    for stat in ("mean", "p50", "p99.9", "p0.5", "p100", "p100.0", "p50.0", "p0", "p05",
                 "p00099", "p101", "p100.5", "p99.", "p.5", "p0.0", "max", "std"):
        slo = {**BASE, "slo": {"ttft_ms": {stat: 100}}}
        try:
            scenario_from_dict(slo)
            loads = True
        except InputError:
            loads = False
        assert check.is_valid(slo) == loads, stat
    assert not check.is_valid({**BASE, "slo": {"ttft_ms": {}}})   # no statistic
    # exactly one step-cost source, as the loader takes it
    for hw in ({"profile": "h100-sxm"}, {"step_time": {"constant_s": 0.01}},
               {"profile": "h100-sxm", "step_time": {"constant_s": 0.01}}, {},
               {"profile": None, "step_time": {"constant_s": 0.01}},
               {"profile": "h100-sxm", "step_time": None}, {"profile": None},
               {"step_time": {"constant_s": 0.01}, "cost_noise": "empirical"},
               {"step_time": {"constant_s": 0.01}, "cost_noise": "none"},
               {"step_time": {}}, {"step_time": {"constant_s": None}},
               {"step_time": {"constant_s": 0.01, "base_s": 0.01}},
               {"step_time": {"constant_s": None, "base_s": 0.01}},
               {"step_time": {"per_decode_seq_s": 0.01, "base_s": 0.001}}):
        try:
            scenario_from_dict({**BASE, "hardware": hw})
            loads = True
        except InputError:
            loads = False
        assert check.is_valid({**BASE, "hardware": hw}) == loads, hw
    # blank names and paths, block sizes vLLM does not take: refused by both
    blank = {"dist": "empirical", "path": " ", "column": "a"}
    for bad in ({**BASE, "model": ""}, {**BASE, "model": " "},
                {**BASE, "hardware": {"profile": " "}},
                {**BASE, "workload": {**BASE["workload"], "prompt_tokens": blank}},
                {**BASE, "workload": {"trace": {"path": "", "format": "azure"}}},
                {**BASE, "engine": {"block_size": 3}}, {**BASE, "engine": {"block_size": 256}},
                {**BASE, "plan": {"candidates": {"engine.max_num_seqs": []}}},
                {**BASE, "plan": {"prices": {"h100-sxm": -1}}},
                {**BASE, "plan": {"prices": {"h100-sxm": 1e7}}},
                *({**BASE, "name": n} for n in ("", " ", "x\0"))):
        with pytest.raises(InputError):
            scenario_from_dict(bad)
        assert not check.is_valid(bad), bad
    # names both take: a '/' only where the name makes the default folder (run without --out)
    for n in ("chat", "a.b", "...", " x ", "é", "meta-llama/Llama-3.1-8B", "a\\b", ".", ".."):
        scenario_from_dict({**BASE, "name": n})
        assert check.is_valid({**BASE, "name": n}), n
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_json_schema_states_which_trace_formats_take_columns(tmp_path):
    import jsonschema
    check = jsonschema.Draft202012Validator(scenario_json_schema())
    (tmp_path / "t.csv").write_text("t,p,o\n0,10,5\n1,12,6\n")
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,10,5\n"
                                    "2023-11-16 18:15:47.6805900,12,6\n")
    cols = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
    for trace, loads in (
            ({"path": "t.csv", "format": "csv", "columns": cols}, True),
            ({"path": "t.csv", "format": "csv", "columns": cols, "arrival_unit": "ms"}, True),
            ({"path": "t.csv", "format": "csv"}, False),                  # columns required
            ({"path": "t.csv", "format": "csv", "columns": None}, False),
            ({"path": "a.csv", "format": "azure"}, True),
            ({"path": "a.csv", "format": "azure", "columns": None}, True),
            ({"path": "a.csv", "format": "azure", "columns": cols}, False),   # csv/jsonl's
            ({"path": "a.csv", "format": "azure", "arrival_unit": "s"}, False),
            ({"path": "a.csv", "format": "azure", "window_s": [0, 5]}, True),
            ({"path": "a.csv", "format": "azure", "window_s": None}, True),   # null: no window
            ({"path": "a.csv", "format": "azure", "window_s": [-1, 5]}, False),
            ({"path": "a.csv", "format": "azure", "window_s": [0, 0]}, False)):
        d = {**BASE, "workload": {"trace": trace}}
        if loads:
            scenario_from_dict(d, base_dir=tmp_path)
        else:
            with pytest.raises(InputError):
                scenario_from_dict(d, base_dir=tmp_path)
        assert check.is_valid(d) == loads, trace


_NUMBERS = st.sampled_from([0, 0.5, 1, 1.0, 2, 2.5, 3, 100, 1e9, 1e9 + 1, 1e12])


@st.composite
def _count_dists(draw):
    """A distribution mapping with each key absent, or a number from around the count
    bounds (0, 1, whole or not, 1e9)."""
    dist = draw(st.sampled_from(["fixed", "uniform", "normal", "lognormal"]))
    keys = {"fixed": ["value"], "uniform": ["min", "max"], "normal": ["mean", "std"],
            "lognormal": ["median", "p90"]}[dist]
    d = {"dist": dist, **{k: draw(_NUMBERS) for k in keys}}
    for clip in ("min", "max"):
        if clip not in d and draw(st.booleans()):
            d[clip] = draw(_NUMBERS)
    return d


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(["prompt_tokens", "output_tokens", "turns"]),
       dist=_count_dists())
def test_the_json_schema_takes_every_count_the_loader_takes(where, dist):
    # an editor must never flag a count the loader runs (the schema cannot state the rules
    # across keys, min <= centre <= max, so it may take more)
    import jsonschema
    wl = dict(BASE["workload"])
    if where == "turns":
        wl["sessions"] = {"turns": dist}
    else:
        wl[where] = dist
    try:
        scenario_from_dict({**BASE, "workload": wl})
    except InputError:
        return
    assert jsonschema.Draft202012Validator(scenario_json_schema()).is_valid(
        {**BASE, "workload": wl}), (where, dist)


@pytest.mark.parametrize("dist", [
    {"dist": "fixed", "value": 2.5}, {"dist": "fixed", "value": 0},
    {"dist": "fixed", "value": 1e9 + 1}, {"dist": "fixed", "value": 5, "max": 1e9 + 1},
    {"dist": "uniform", "min": 0, "max": 5}, {"dist": "uniform", "min": 0.2, "max": 0.8},
    {"dist": "uniform", "min": 1, "max": 1e9 + 1},
    {"dist": "normal", "mean": 0.5, "std": 1}, {"dist": "normal", "mean": 1e9 + 1, "std": 1},
    {"dist": "normal", "mean": 5, "std": 1, "max": 0.5},
    {"dist": "lognormal", "median": 0.5, "p90": 2},
    {"dist": "empirical", "path": "x.csv", "column": "n", "max": 1e10}])
def test_counts_the_loader_refuses_the_json_schema_refuses(dist):
    import jsonschema
    check = jsonschema.Draft202012Validator(scenario_json_schema())
    for where in ("prompt_tokens", "output_tokens", "turns"):
        wl = dict(BASE["workload"])
        if where == "turns":
            wl["sessions"] = {"turns": dist}
        else:
            wl[where] = dist
        with pytest.raises(InputError):
            scenario_from_dict({**BASE, "workload": wl})
        assert not check.is_valid({**BASE, "workload": wl}), where
    # times take what counts may not: think_time_s 2.5 s, 0 s, 0.2..0.8 s
    if dist.get("value") in (2.5, 0) or dist.get("min") == 0.2:
        wl = {**BASE["workload"], "sessions": {"turns": 2, "think_time_s": dist}}
        scenario_from_dict({**BASE, "workload": wl})
        assert check.is_valid({**BASE, "workload": wl})


@pytest.mark.parametrize("hardware,expected", [
    ({"profile": "h100-sxm"}, (8192, 1024)),          # >= 70 GiB, not A100
    ({"profile": "h200"}, (8192, 1024)),
    ({"profile": "a100-80gb"}, (2048, 256)),          # A100 excluded (vLLM PR #17885)
    ({"profile": "l40s"}, (2048, 256)),
    ({"profile": "cpu-llama-tiny-56m-bfloat16"}, (2048, 128)),   # CPU, per rank
    ({"step_time": {"constant_s": 0.01}}, (2048, 256)),
])
def test_batch_defaults_follow_vllm_serve_by_device(hardware, expected):
    model = "llama-tiny-56m" if "cpu" in str(hardware) else "llama-3.1-8b"
    d = {"name": "d", "model": model, "hardware": hardware,
         "workload": BASE["workload"]}
    if "cpu" in str(hardware):
        d["dtype"] = "bfloat16"
    sc = scenario_from_dict(d)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == expected
    cfg = sc.scheduler_config(None)
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == expected
    # max_num_seqs defaults to at most the token budget, as vLLM does.
    small = scenario_from_dict({**d, "engine": {"max_num_batched_tokens": 100}})
    assert small.max_num_seqs == 100


LINED = """\
name: lined
model: llama-test
hardware:
  step_time: {{constant_s: 0.02}}
engine:
  block_size: 16
  max_num_seqs: {seqs}
workload:
  num_requests: 10
  arrival:
    process: gamma
    rate: {rate}
  prompt_tokens: {{dist: fixed, value: 100}}
  output_tokens: {{dist: fixed, value: 10}}
slo:
  ttft_ms: {{p99: 500}}
plan:
  candidates:
    engine.max_num_seqs: {cands}
"""


@pytest.mark.parametrize("fields, expected", [
    ({"seqs": "0"}, "s.yaml:7: engine.max_num_seqs: Input should be greater than or equal to 1"),
    # a union member's tag (gamma) is not a key of the file: the error names rate's line
    ({"rate": "-1"}, "s.yaml:12: workload.arrival.rate: Input should be greater than 0"),
    ({"cands": "[]"}, "s.yaml:19: plan.candidates.engine.max_num_seqs: give at least one"),
    ({"rate": "[1]"}, "s.yaml:12: workload.arrival.rate: Input should be a valid number"),
])
def test_schema_errors_name_the_yaml_line(tmp_path, fields, expected):
    p = tmp_path / "s.yaml"
    p.write_text(LINED.format(**{"seqs": "8", "rate": "2.0", "cands": "[8, 16]", **fields}))
    assert err(load_scenario, p).startswith(expected)


def test_missing_key_names_its_parents_line_and_flags_no_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(LINED.format(seqs=8, rate=2.0, cands="[8]").replace("    rate: 2.0\n", ""))
    assert err(load_scenario, p).startswith(
        "s.yaml:10: workload.arrival.rate: required key missing")
    p.write_text(LINED.format(seqs=8, rate=2.0, cands="[8]"))
    assert err(load_scenario, p, ["engine.max_num_seqs=0"]) == (
        "--set engine.max_num_seqs=0: Input should be greater than or equal to 1 (got 0)")
    # a mapping without the YAML (programmatic use) has no line to give
    assert err(scenario_from_dict, {**BASE, "engine": {"max_num_seqs": 0}}).startswith(
        "<scenario>: engine.max_num_seqs: ")


@pytest.mark.parametrize("section, value, msg", [
    ("arrival", {"rate": 2},
     "workload.arrival: process: required key missing (allowed: poisson, gamma, constant, "
     "closed_loop)"),
    ("output_tokens", {"value": 3},
     "workload.output_tokens: dist: required key missing (allowed: fixed, uniform, normal, "
     "lognormal, empirical)"),
])
def test_a_missing_union_tag_names_the_tag_and_its_values(section, value, msg):
    wl = {"num_requests": 5, "arrival": {"process": "poisson", "rate": 2},
          "prompt_tokens": {"dist": "fixed", "value": 10},
          "output_tokens": {"dist": "fixed", "value": 3}, section: value}
    with pytest.raises(InputError) as e:
        scenario_from_dict({"name": "t", "model": "llama-3.1-8b",
                            "hardware": {"profile": "h100-sxm"}, "workload": wl})
    assert str(e.value) == f"<scenario>: {msg}"


def test_a_bad_tag_is_named_at_its_own_line_and_a_bare_number_says_how_to_write_one(tmp_path):
    # the dist: line, not prompt_tokens: above it
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nmodel: llama-3.1-8b\nhardware: {profile: h100-sxm}\nworkload:\n"
                 "  num_requests: 5\n  arrival: {process: poisson, rate: 2}\n"
                 "  prompt_tokens:\n    dist: weibull\n    value: 8\n"
                 "  output_tokens: {dist: fixed, value: 3}\n")
    assert err(load_scenario, p) == (
        "s.yaml:8: workload.prompt_tokens.dist: 'weibull' is not one of 'fixed', 'uniform', "
        "'normal', 'lognormal', 'empirical'")
    # a count's centre below 1 is checked on the whole mapping, and named at its own key
    p.write_text(p.read_text().replace("dist: weibull", "dist: fixed").replace(
        "    value: 8", "    value: 0"))
    assert err(load_scenario, p) == (
        "s.yaml:9: workload.prompt_tokens.value: fixed value 0 is not a whole number >= 1 (a "
        "count of tokens or turns)")
    # said with how the section is written, not pydantic's "Input should be a valid dictionary"
    assert err(load_scenario, p, ["workload.prompt_tokens=3"]) == (
        "--set workload.prompt_tokens=3: must be a mapping of keys (got 3); a distribution is "
        "{dist: fixed, value: N} or dist: uniform, normal, lognormal, empirical")


@pytest.mark.parametrize("name, said", [
    *[(n, r"must not be empty or blank \(it titles the reports") for n in ["", " "]],
    # a newline or terminal escape in a name is refused (the name is a folder and a title)
    *[(n, r"printable characters only \(it names the default output folder")
      for n in ["a\nb", "x\x1b[31mRED", "tab\there"]],
    # a name past 200 bytes is refused at name:, before any folder is made; 100 two-byte
    # characters are 200 bytes and fit
    ("é" * 101, r"at most 200 bytes \(it names the default output folder reports/<name>\), "
                r"got 202")])
def test_a_scenario_name_is_a_printable_title(name, said):
    # it titles the reports (and names reports/<name>, checked where that folder is made)
    with pytest.raises(InputError, match=rf"^<scenario>: name: {said}"):
        scenario_from_dict({"name": name, "model": "llama-3.1-8b",
                            "hardware": {"profile": "h100-sxm"},
                            "workload": {"num_requests": 5,
                                         "arrival": {"process": "poisson", "rate": 2},
                                         "prompt_tokens": {"dist": "fixed", "value": 8},
                                         "output_tokens": {"dist": "fixed", "value": 3}}})


def test_a_scenario_name_of_200_bytes_is_one():
    sc = scenario_from_dict({"name": "é" * 100, "model": "llama-3.1-8b",
                             "hardware": {"profile": "h100-sxm"},
                             "workload": {"num_requests": 5,
                                          "arrival": {"process": "poisson", "rate": 2},
                                          "prompt_tokens": {"dist": "fixed", "value": 8},
                                          "output_tokens": {"dist": "fixed", "value": 3}}})
    assert len(sc.name.encode()) == 200


def test_errors_found_while_running_name_the_key_line_or_its_flag(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("name: k\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.02}}\n"
                 "engine:\n  num_gpu_blocks: 2\n  max_model_len: 64\n"
                 "workload: {num_requests: 1, arrival: {process: poisson, rate: 1.0},\n"
                 "  prompt_tokens: {dist: fixed, value: 1}, output_tokens: {dist: fixed, "
                 "value: 1}}\n")
    sc = load_scenario(p)
    msg = err(sc.scheduler_config, sc.engine.num_gpu_blocks)
    assert msg.startswith("k.yaml:6: engine.max_model_len: 64 tokens need 4 KV blocks")
    # a key the file does not hold takes its parent's line
    assert str(sc.error("engine.block_size", "m")) == "k.yaml:4: engine.block_size: m"
    # a value from --set is named by its flag, with no line
    sc = load_scenario(p, ["engine.max_model_len=48"])
    assert err(sc.scheduler_config, sc.engine.num_gpu_blocks).startswith(
        "--set engine.max_model_len=48: 48 tokens need 3 KV blocks")


MODEL_FILE = """name: m
model:
  hidden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 4
  vocab_size: 100
  max_position_embeddings: 512
hardware: {step_time: {constant_s: 0.02}}
workload: {num_requests: 1, arrival: {process: poisson, rate: 1.0},
  prompt_tokens: {dist: fixed, value: 1}, output_tokens: {dist: fixed, value: 1}}
"""


def test_the_json_schema_takes_an_inline_model_as_the_loader_does():
    import jsonschema
    check = jsonschema.Draft202012Validator(scenario_json_schema())
    model = yaml.safe_load(MODEL_FILE)["model"]
    for change, loads in (
            ({}, True), ({"num_key_value_heads": 2, "head_dim": 16}, True),
            ({"num_key_value_heads": None, "head_dim": None}, True),
            ({"architecture": "Qwen2", "rope_theta": 1e6, "rms_norm_eps": 1e-6,
              "rope_scaling": None, "torch_dtype": "bfloat16", "name": "x"}, True),
            ({"vocab_size": None}, False), ({"vocab_size": 0}, False),
            ({"hidden_size": "64"}, False), ({"num_hidden_layers": 10**13}, False),
            ({"architecture": "GPT2"}, False), ({"rope_theta": 0}, False),
            ({"architecture": None, "architectures": ["Qwen2ForCausalLM"]}, True),
            ({"architecture": None, "model_type": "mistral"}, True),
            # HF's class name or model_type in servesim's key
            ({"architecture": "Qwen2ForCausalLM"}, True), ({"architecture": "qwen2"}, True),
            ({"architecture": "Mistral", "architectures": ["MistralForCausalLM"],
              "model_type": "mistral"}, True),
            ({"architectures": "LlamaForCausalLM"}, False), ({"model_type": ["llama"]}, False),
            ({"rope_theta": None}, False), ({"rms_norm_eps": -1}, False),
            ({"rope_scaling": 3}, False), ({"layers": 2}, False)):
        d = {**yaml.safe_load(MODEL_FILE), "model": {**model, **change}}
        if loads:
            scenario_from_dict(d)
        else:
            with pytest.raises(InputError):
                scenario_from_dict(d)
        assert check.is_valid(d) == loads, change
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "vocab_size", "max_position_embeddings"):
        d = {**yaml.safe_load(MODEL_FILE), "model": {k: v for k, v in model.items() if k != key}}
        with pytest.raises(InputError):
            scenario_from_dict(d)
        assert not check.is_valid(d), key


@pytest.mark.parametrize("old,new,key,msg", [
    ("num_attention_heads: 4", "num_attention_heads: abc", "num_attention_heads",
     "must be a positive integer (got 'abc')"),
    ("vocab_size: 100", "vocab_size: 0", "vocab_size", "must be a positive integer (got 0)"),
    ("num_attention_heads: 4", "num_attention_heads: 4\n  num_key_value_heads: 3",
     "num_key_value_heads", "num_attention_heads (4) must be a multiple of "
                            "num_key_value_heads (3)"),
    ("vocab_size: 100", "vocab_size: 100\n  model_type: gpt2", "model_type",
     "architecture 'gpt2' is not supported (supported: Llama, Qwen2, Mistral)"),
    ("vocab_size: 100", "vocab_size: 100\n  rope_theta: abc", "rope_theta",
     "must be a finite number > 0 (got 'abc')"),
    ("vocab_size: 100", "vocab_size: 100\n  rope_theta: null", "rope_theta",
     "must be a finite number > 0 (got null)"),
    ("vocab_size: 100", "vocab_size: 100\n  rms_norm_eps: null", "rms_norm_eps",
     "must be a finite number > 0 (got null)"),
    # a mapping, a string or a list where a name belongs: each one error naming the key
    ("vocab_size: 100", "vocab_size: 100\n  architectures: {x: 1}", "architectures",
     "must be a list of class names such as [LlamaForCausalLM] (got {x: 1})"),
    ("vocab_size: 100", "vocab_size: 100\n  architectures: LlamaForCausalLM", "architectures",
     "must be a list of class names such as [LlamaForCausalLM] (got 'LlamaForCausalLM')"),
    ("vocab_size: 100", "vocab_size: 100\n  model_type: [llama]", "model_type",
     "must be a name such as llama (got [llama])"),
    ("vocab_size: 100", "vocab_size: 100\n  architecture: [Llama]", "architecture",
     "must be a name such as Llama (got [Llama])"),
    # keys naming two architectures are refused
    ("vocab_size: 100", "vocab_size: 100\n  architecture: Llama\n  architectures: "
                        "[MistralForCausalLM]", "architectures",
     "[MistralForCausalLM] (Mistral) contradicts architecture Llama (Llama): they must name "
     "one architecture"),
    ("vocab_size: 100", "vocab_size: 100\n  architectures: [Qwen2ForCausalLM]\n  "
                        "model_type: llama", "model_type",
     "llama (Llama) contradicts architectures [Qwen2ForCausalLM] (Qwen2): they must name "
     "one architecture"),
    ("vocab_size: 100", "vocab_size: 100\n  architecture: Qwen2ForCausalLM\n  "
                        "model_type: llama", "model_type",
     "llama (Llama) contradicts architecture Qwen2ForCausalLM (Qwen2): they must name "
     "one architecture"),
    # layers the engine refuses and the cost model does not price: refused, not run as absent
    ("vocab_size: 100", "vocab_size: 100\n  hidden_act: gelu", "hidden_act",
     "'gelu' not supported (the MLP is SwiGLU: silu)"),
    ("vocab_size: 100", "vocab_size: 100\n  mlp_bias: true", "mlp_bias",
     "true not supported (the MLP has no bias)"),
    ("vocab_size: 100", "vocab_size: 100\n  architecture: Mistral\n  sliding_window: 64",
     "sliding_window", "64 not supported (full attention only; set it to null)"),
    ("vocab_size: 100", "vocab_size: 100\n  rope_scaling: 3", "rope_scaling",
     "must be a mapping or null"),
    # a flag as text ("false", truthy) is refused: read as true it would tie the model
    ("vocab_size: 100", "vocab_size: 100\n  tie_word_embeddings: 'false'",
     "tie_word_embeddings", "must be true or false, got 'false'"),
    ("vocab_size: 100", "vocab_size: 100\n  attention_bias: 5", "attention_bias",
     "must be true or false, got 5"),
    # RoPE scalings the engine refuses as unrunnable by any model (any rope_type)
    ("vocab_size: 100", "vocab_size: 100\n  rope_scaling: {rope_type: llama3, factor: 0}",
     "rope_scaling", "factor: a finite number > 0, got 0"),
    ("vocab_size: 100", "vocab_size: 100\n  rope_scaling: {type: yarn, factor: -1}",
     "rope_scaling", "factor: a finite number > 0, got -1"),
    # a RoPE scaling vLLM does not run is refused, not read as a linear factor
    ("vocab_size: 100", "vocab_size: 100\n  rope_scaling: {rope_type: banana, factor: 4}",
     "rope_scaling", "rope_type: 'banana' is not a RoPE scaling vLLM runs "
     "(allowed: default, linear, ntk, dynamic, yarn, deepseek_yarn, deepseek_llama_scaling, "
     "longrope, su, llama3, proportional)"),
    # a linear scaling without its factor is refused, as HF and vLLM refuse it
    ("vocab_size: 100", "vocab_size: 100\n  rope_scaling: {rope_type: linear}",
     "rope_scaling", "factor: required for linear"),
    # rotary embeddings over an odd head_dim run nowhere
    ("vocab_size: 100", "vocab_size: 100\n  head_dim: 7", "head_dim",
     "7 not supported (rotary embeddings turn pairs of dimensions: an even head_dim)"),
    ("hidden_size: 64", "hidden_size: 60", "hidden_size",
     "60 // num_attention_heads 4 gives head_dim 15, odd: not supported (rotary embeddings "
     "turn pairs of dimensions; give an even head_dim)"),
])
def test_inline_model_errors_name_the_key_line(tmp_path, old, new, key, msg):
    p = tmp_path / "m.yaml"
    p.write_text(MODEL_FILE.replace(old, new))
    assert err(load_scenario, p) == f"m.yaml:{line_of(p, key + ':')}: model.{key}: {msg}"


def test_a_null_rope_base_inside_rope_parameters_is_one_line(tmp_path):
    # transformers 5's place for it: null is refused with its key
    p = tmp_path / "m.yaml"
    p.write_text(MODEL_FILE.replace("vocab_size: 100", "vocab_size: 100\n  rope_parameters: "
                                                      "{rope_theta: null}"))
    assert err(load_scenario, p) == (f"m.yaml:{line_of(p, 'rope_parameters:')}: model."
                                     f"rope_parameters.rope_theta: must be a finite number > 0 "
                                     f"(got null)")


def test_model_errors_after_the_schema_name_the_line_or_the_flag(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(MODEL_FILE.replace("  intermediate_size: 128\n", ""))
    # a missing key takes its parent's line, as in schema errors
    assert err(load_scenario, p) == ("m.yaml:2: model.intermediate_size: required key "
                                     "missing (an HF config key)")
    p.write_text(MODEL_FILE)
    assert err(load_scenario, p, ["model.num_attention_heads=abc"]) == (
        "--set model.num_attention_heads=abc: must be a positive integer (got 'abc')")
    q = tmp_path / "n.yaml"
    q.write_text(yaml.safe_dump(BASE, sort_keys=False).replace("llama-test", "llama-9"))
    assert err(load_scenario, q).startswith(
        f"n.yaml:{line_of(q, 'llama-9')}: model: 'llama-9' is neither a catalog model")


@pytest.mark.parametrize("flag, said", [
    ("hardware.price_per_gpu_hour=1e308", "Input should be less than or equal to 1000000"),
    ("plan.max_replications=1000001", "Input should be less than or equal to 1000"),
    ("plan.min_replications=1000001", "Input should be less than or equal to 1000"),
])
def test_prices_and_plan_replications_have_upper_bounds(tmp_path, flag, said):
    # bounded: a 1e308 price would overflow plan's replica arithmetic, and a million
    # replications per rate would run without end
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False) + "plan: {target_rate: 1}\n")
    assert said in err(load_scenario, p, [flag])


@pytest.mark.parametrize("prices,msg", [
    ("{l4: -1}", "a price is a finite number >= 0 (USD per GPU-hour), got -1"),
    ("{l4: .inf}", "a price is a finite number >= 0 (USD per GPU-hour), got inf"),
    ("{l4: 1e308}", "a price is at most 1e+06 USD per GPU-hour, got 1e+308"),
    ("{l4: abc}", "Input should be a valid number (got 'abc')"),
])
def test_a_bad_plan_price_names_its_gpu_key_and_line(tmp_path, prices, msg):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False)
                 + f"plan:\n  target_rate: 1\n  prices: {prices}\n")
    assert err(load_scenario, p) == f"p.yaml:{line_of(p, 'prices:')}: plan.prices.l4: {msg}"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False) + "plan: {target_rate: 1}\n")
    assert err(load_scenario, p, ["plan.prices.l4=-2"]) == (
        "--set plan.prices.l4=-2: a price is a finite number >= 0 (USD per GPU-hour), got -2")


def test_a_number_of_the_wrong_type_is_told_the_allowed_range_too(chat):
    # num_requests is bounded (1 .. 100000000, ~1 KiB each): a float past it names both
    assert err(load_scenario, chat, ["workload.num_requests=1.0e12"]) == (
        "--set workload.num_requests=1.0e12: Input should be a valid integer >= 1 and "
        "<= 100000000 (got 1e+12)")
    # a field without bounds keeps pydantic's words alone
    assert err(load_scenario, chat, ["name=3"]) == (
        "--set name=3: Input should be a valid string (got 3)")


def test_every_key_missing_beside_the_first_is_named_at_once(chat):
    assert err(load_scenario, chat, ["workload.prompt_tokens={dist: lognormal}"]) == (
        "--set workload.prompt_tokens={dist: lognormal}: required keys missing: median, p90")
    raw = {k: v for k, v in BASE.items() if k != "workload"}
    chat.write_text(yaml.safe_dump({**raw, "workload": {"seed": 1, "num_requests": 5}}))
    assert err(load_scenario, chat) == (
        f"chat.yaml:{line_of(chat, 'workload:')}: workload: arrival, prompt_tokens, "
        "output_tokens required (or give a trace)")


def test_unknown_keys_of_one_mapping_are_named_with_what_it_misses(chat, tmp_path):
    # a uniform written with numpy's low/high: both unknown, and so min/max missing
    assert err(load_scenario, chat, ["workload.prompt_tokens={dist: uniform, low: 1, "
                                     "high: 5}"]) == (
        "--set workload.prompt_tokens={dist: uniform, low: 1, high: 5}: unknown keys: low, "
        "high (allowed: min, max, dist); required keys missing: min, max")
    # one misspelt key keeps its own line and path
    assert err(load_scenario, chat, ["workload.prompt_tokens={dist: uniform, min: 1, "
                                     "mx: 5}"]).endswith(
        "workload.prompt_tokens.mx: unknown key; did you mean max? (allowed: min, max, dist) "
        "(and 1 more error, "
        "at workload.prompt_tokens.max)")


def test_another_kind_of_file_is_not_a_scenario(tmp_path):
    # a run's summary.json: its keys are not told one by one
    summary = {f"figure_{i}": i for i in range(10)} | {"slo": {}, "seed": 0}
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(summary))
    assert err(load_scenario, p) == (
        "summary.json: not a scenario: it has none of model, hardware, workload, and keys a "
        "scenario does not (figure_0, figure_1, figure_2, figure_3, figure_4, figure_5 and "
        "5 more); servesim schema lists a scenario's keys")


def test_a_misspelt_section_in_a_flag_is_blamed_on_the_flag(chat):
    # the flag made the unknown mapping, as --set engine.blok_size=8 makes an unknown key
    assert err(load_scenario, chat, ["engin.block_size=8"]) == (
        "--set engin.block_size=8: engin: unknown key; did you mean engine? (allowed: name, "
        "model, dtype, "
        "hardware, engine, cluster, workload, slo, sim, plan) (the file has no engin; this "
        "flag makes one)")
    assert err(load_scenario, chat, ["engine.blok_size=8"]).startswith(
        "--set engine.blok_size=8: unknown key; did you mean block_size? (allowed: block_size, ")
    # two letters swapped: "mena" is 0.75 like mean by difflib's ratio, below its 0.8 cutoff
    assert err(load_scenario, chat, ["workload.prompt_tokens={dist: normal, mena: 5, "
                                     "std: 1}"]).startswith(
        "--set workload.prompt_tokens={dist: normal, mena: 5, std: 1}: "
        "workload.prompt_tokens.mena: unknown key; did you mean mean? (allowed: ")
    assert err(load_scenario, chat, ["engine.max_num_sqes=8"]).startswith(
        "--set engine.max_num_sqes=8: unknown key; did you mean max_num_seqs? ")
    # a word with no such neighbour gets no guess
    assert "did you mean" not in err(load_scenario, chat, ["engine.blocks=8"])


@pytest.mark.parametrize("flags", [
    ["engine.max_num_seqs=8", "engine={max_num_seqs: 4}"],
    ["engine={max_num_seqs: 4}", "engine.max_num_seqs=8"],   # would also drop the file's keys
])
def test_a_mapping_and_a_key_inside_it_are_not_both_set(chat, flags):
    assert err(load_scenario, chat, flags) == (
        f"--set {flags[1]}: engine and engine.max_num_seqs inside it are both set (the later "
        f"flag would override the other; give the key inside the mapping, or the whole "
        f"mapping, once)")
    # two keys side by side in one mapping are fine
    sc = load_scenario(chat, ["engine.max_num_seqs=8", "engine.block_size=32"])
    assert (sc.engine.max_num_seqs, sc.engine.block_size) == (8, 32)


def test_a_later_flag_may_add_a_key_to_a_mapping_an_earlier_flag_set(chat):
    # nothing either flag gave is lost: the arrival becomes a closed loop of 3 users
    sc = load_scenario(chat, ["workload.arrival={process: closed_loop}",
                              "workload.arrival.concurrency=3"])
    assert (sc.workload.arrival.process, sc.workload.arrival.concurrency) == ("closed_loop", 3)
    # the other order would drop the key with the mapping set after it
    assert err(load_scenario, chat, ["workload.arrival.concurrency=3",
                                     "workload.arrival={process: closed_loop}"]).startswith(
        "--set workload.arrival={process: closed_loop}: workload.arrival and "
        "workload.arrival.concurrency inside it are both set")


def test_a_candidate_value_given_twice_is_refused(chat):
    # refused: they would plan two identical rows, one "cheapest" and one "ok"
    msg = err(load_scenario, chat, ["plan.candidates={engine.max_num_seqs: [64, 128, 64.0]}"])
    assert msg.endswith("engine.max_num_seqs: 64.0 is given twice (as 64: one value); each "
                        "value is one candidate, give it once")
    msg = err(load_scenario, chat, ["plan.candidates={engine.enable_prefix_caching: [true, "
                                    "yes]}"])
    assert msg.endswith("engine.enable_prefix_caching: true is given twice; each value is "
                        "one candidate, give it once")
    sc = load_scenario(chat, ["plan.candidates={engine.enable_prefix_caching: [true, false]}"])
    assert sc.plan.candidates == {"engine.enable_prefix_caching": [True, False]}
    # looked up, not compared pair by pair: 1 and true differ, lists compared as lists
    from simulator.scenario import given_twice
    assert given_twice(["1", "true", "[1]", "{a: 1}", "[1.0]"], [1, True, [1], {"a": 1}, [1.0]],
                       "point") == "[1.0] is given twice (as [1]: one value); each value is " \
                                   "one point, give it once"
    assert given_twice(["1", "true", "[1]"], [1, True, [1]], "point") is None


def test_an_endless_scenario_file_is_read_no_further_than_its_limit(tmp_path):
    # refused past MAX_SCENARIO_BYTES (a sparse file: no 16 MiB written), and a device such
    # as /dev/zero before reading, not read until memory runs out
    from simulator.scenario import MAX_SCENARIO_BYTES
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_SCENARIO_BYTES + 1)
    assert err(load_scenario, str(big)) == (f"{big}: larger than "
                                            f"{MAX_SCENARIO_BYTES >> 20} MiB: not a scenario file")
    if Path("/dev/zero").exists():
        assert err(load_scenario, "/dev/zero") == "/dev/zero: a device, not a scenario file"


def test_a_bad_byte_is_placed_by_its_character_column(tmp_path):
    # "model: é→ " is 10 characters but 13 bytes: an editor's column 11, not 14
    p = tmp_path / "s.yaml"
    p.write_bytes("name: x\nmodel: é→ ".encode() + b"\xff\n")
    assert err(load_scenario, p) == (
        f"{p}:2: not UTF-8 text (byte 0xff at column 11; save the file as UTF-8)")


def test_a_character_yaml_refuses_is_named_by_its_line(tmp_path):
    # PyYAML's reader gives only a position: the line is named too
    p = tmp_path / "s.yaml"
    p.write_text("name: x\nmodel: llama-3.1-8b\nhardware: {profile: h100-sxm}\a\n")
    assert err(load_scenario, p) == ("s.yaml:3: YAML syntax error: unacceptable character "
                                     "#x0007: special characters are not allowed")


def test_a_scenario_from_a_pipe_is_read_once(tmp_path):
    # as from <(...): the bytes are read once, so a bad byte's line is still named
    r, w = os.pipe()
    os.write(w, b"name: x\nmodel: \xff\n")
    os.close(w)
    try:
        assert err(load_scenario, f"/dev/fd/{r}") == (
            f"/dev/fd/{r}:2: not UTF-8 text (byte 0xff at column 8; save the file as UTF-8)")
    finally:
        os.close(r)


def test_an_empty_scenario_names_its_whole_path():
    # /dev/null (or a pipe) is named by its whole path, not "null"
    assert err(load_scenario, "/dev/null").startswith(
        "/dev/null: the scenario file is empty (a scenario needs at least model")


def test_one_slo_statistic_given_twice_is_refused(tmp_path):
    # p99 and p99.0 are one statistic: two bounds on it would list two rows for one figure
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(BASE, sort_keys=False)
                 + "slo:\n  ttft_ms:\n    p99: 2000\n    p99.0: 1000\n")
    assert err(load_scenario, p) == (f"s.yaml:{line_of(p, 'p99.0:')}: slo.ttft_ms.p99.0: the "
                                     f"same statistic as p99: give it once")
    p.write_text(yaml.safe_dump(BASE, sort_keys=False)
                 + "slo:\n  ttft_ms:\n    p99: 2000\n    p50: 1000\n    p99.9: 3000\n")
    assert list(load_scenario(p).slo.ttft_ms) == ["p50", "p99", "p99.9"]


def test_a_rope_scaling_the_engine_does_not_run_is_still_priced(tmp_path):
    # YaRN (Qwen2.5's long-context configs) changes no step cost: planned, not refused
    p = tmp_path / "m.yaml"
    p.write_text(MODEL_FILE.replace("vocab_size: 100", "vocab_size: 100\n  rope_scaling: "
                                    "{rope_type: yarn, factor: 4.0, "
                                    "original_max_position_embeddings: 128}"))
    assert load_scenario(p).model_shape.rope_scaling == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}


@pytest.mark.parametrize("extra, key, detail", [
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config",
     "('fp8') not supported: quantized weights are not modelled (weights and KV cache in "
     "bfloat16, float16 or float32)"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config",
     "('awq') not supported"),
    ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype",
     "'float8_e4m3fn' not supported: quantized weights are not modelled"),
])
def test_a_quantized_config_json_is_refused(tmp_path, extra, key, detail):
    # priced at the scenario's 16-bit dtype, its weights would read 2-4x too large, its KV
    # cache and steps with them; refused as the README says
    import json
    model = {**yaml.safe_load(MODEL_FILE)["model"], **extra}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(model))
    d = {**yaml.safe_load(MODEL_FILE), "model": str(tmp_path / "m")}
    with pytest.raises(InputError) as e:
        scenario_from_dict(d)
    assert f"config.json: {key} {detail}" in str(e.value)


@pytest.mark.parametrize("scaling, longest", [
    (None, 4096),
    ({"type": "linear", "factor": 4.0}, 16384),            # vicuna-7b-v1.5-16k's shape
    ({"rope_type": "dynamic", "factor": 2.5}, 10240),
    ({"rope_type": "yarn", "factor": 4.0}, 4096),            # given already scaled
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 512}, 4096),
])
def test_max_model_len_defaults_to_the_longest_context_vllm_derives(scaling, longest):
    # vLLM _get_and_verify_max_len: max_position_embeddings × the rope_scaling factor,
    # except for rope types whose max_position_embeddings is the scaled length already
    d = yaml.safe_load(MODEL_FILE)
    d["model"].update(max_position_embeddings=4096, rope_scaling=scaling)
    assert scenario_from_dict(d).max_model_len == longest
    d["engine"] = {"max_model_len": longest}
    assert scenario_from_dict(d).max_model_len == longest
    d["engine"] = {"max_model_len": longest + 1}
    with pytest.raises(InputError, match=f"{longest + 1} is longer than the model's "
                                         f"max_position_embeddings \\(4096\\)"):
        scenario_from_dict(d)


def test_architecture_takes_hf_s_class_name_or_model_type_for_the_same_shape():
    # "LlamaForCausalLM" in `architecture` names Llama, as HF's architectures list
    # does: the same model (a Qwen2 one adds the q/k/v bias)
    base = yaml.safe_load(MODEL_FILE)
    shapes = {a: scenario_from_dict({**base, "model": {**base["model"], "architecture": a}})
              .model_shape for a in ("Llama", "LlamaForCausalLM", "llama", "Qwen2",
                               "Qwen2ForCausalLM", "qwen2")}
    assert shapes["LlamaForCausalLM"] == shapes["llama"] == shapes["Llama"]
    assert shapes["Qwen2ForCausalLM"] == shapes["qwen2"] == shapes["Qwen2"]
    assert shapes["Qwen2"].architecture == "Qwen2" and shapes["llama"].architecture == "Llama"
    assert shapes["Qwen2"].num_params > shapes["Llama"].num_params   # q/k/v bias


@pytest.mark.parametrize("section", ["engine", "cluster", "slo", "sim"])
def test_a_null_section_that_may_be_left_out_is_its_defaults(tmp_path, section):
    # "null unsets a key that may be unset": --set slo=null runs without SLOs, as leaving slo
    # out or slo={} does
    import jsonschema
    d = yaml.safe_load(MODEL_FILE)
    d[section] = {"engine": {"max_num_seqs": 4}, "cluster": {"replicas": 2},
                  "slo": {"ttft_ms": {"p99": 100}}, "sim": {"replications": 2}}[section]
    given = scenario_from_dict(d)
    d.pop(section)
    left_out = scenario_from_dict(d)
    nulled = scenario_from_dict({**d, section: None})
    assert getattr(nulled, section) == getattr(left_out, section) != getattr(given, section)
    jsonschema.validate({**d, section: None}, scenario_json_schema())
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    flagged = load_scenario(p, [f"{section}=null"])
    assert getattr(flagged, section) == getattr(left_out, section)


def test_full_width_digits_and_a_number_past_the_largest_float_are_said_as_such(chat):
    # YAML reads only 0-9 as digits: "６４" is text, not quoted text (nothing was quoted)
    msg = err(load_scenario, chat, ["engine.max_num_seqs=６４"])
    assert msg.startswith("--set engine.max_num_seqs=６４: ") and "valid integer" in msg
    assert msg.endswith("(got '６４': YAML reads only the digits 0-9 as a number; write 64)")
    assert "quoted" not in msg
    msg = err(load_scenario, chat, ["workload.arrival.rate=１.５"])
    assert msg.endswith("(got '１.５': YAML reads only the digits 0-9 as a number; write 1.5)")
    # quoted ASCII digits are still quoted text
    assert err(load_scenario, chat, ["engine.max_num_seqs='64'"]).endswith(
        "(got '64': quoted, a number is text; write 64, unquoted)")
    # 1e400 is read as infinity: say how the inf came about
    msg = err(load_scenario, chat, ["workload.arrival.rate=1e400"])
    assert msg.startswith("--set workload.arrival.rate=1e400: ") and msg.endswith(
        "Input should be a finite number (got inf: .inf, or a number past the largest "
        "float, 1.8e308)")
    # an integer key says so too
    assert err(load_scenario, chat, ["engine.max_num_seqs=1e400"]).endswith(
        "(got inf: .inf, or a number past the largest float, 1.8e308)")


def test_an_empty_candidate_key_is_said_to_be_one(chat):
    # an empty part of a key is named as such, not as a --set syntax slip
    for key, got in (('""', "''"), ('" "', "' '"), ("engine..max_num_seqs",
                                                    "'engine..max_num_seqs'")):
        msg = err(load_scenario, chat, [f"plan={{target_rate: 5, candidates: {{{key}: [1]}}}}"])
        assert msg.endswith(f"plan.candidates: a candidate key is a setting's dotted path, "
                            f"e.g. engine.max_num_seqs (got {got})"), msg
