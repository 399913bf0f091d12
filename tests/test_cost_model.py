"""Cost model: hand-computed step times for each form, tensor-parallel division, KV capacity
by vLLM's formula, profiles (round trip, lookup, mismatch), noise, projection efficiencies."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from simulator import cost_model as cmod
from simulator.catalog import load_hardware, load_model
from simulator.cost_model import (Profile, RooflineConstants, build_cost_model, load_profile,
                                  roofline_seconds, save_profile, step_features)
from simulator.errors import InputError
from simulator.policy import Request, RequestSpec, Scheduler
from simulator.scenario import load_scenario, scenario_from_dict

WORKLOAD = {"num_requests": 1, "arrival": {"process": "poisson", "rate": 1.0},
            "prompt_tokens": {"dist": "fixed", "value": 10},
            "output_tokens": {"dist": "fixed", "value": 2}}

# llama-test by hand: hidden 64, intermediate 128, 2 layers, 4 heads / 2 kv heads of 16,
# vocab 256, bf16.
P_LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64   # 36992
P_NONEMB = 2 * P_LAYER + 64                                          # 74048
P_LM = 256 * 64                                                      # 16384
W_BYTES = (P_NONEMB + P_LM) * 2                                      # 180864
KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2                                    # 256
ATTN_PER_PAIR = 4 * 2 * 4 * 16                                       # 512

COEF = {"a0_s": 1e-3, "per_request_s": 1e-4, "w_eff_bytes_per_s": 1e8,
        "f_eff_flops_per_s": 1e9, "w_attn_bytes_per_s": 1e7, "f_attn_flops_per_s": 1e8}


def scenario(tmp_path=".", **kw):
    d = {"name": "t", "model": "llama-test", "workload": WORKLOAD,
         "hardware": {"step_time": {"constant_s": 0.02}}}
    d.update(kw)
    return scenario_from_dict(d, base_dir=tmp_path, source="t.yaml")


def chunk(n, c, samples):
    return SimpleNamespace(num_new_tokens=n, num_computed_before=c, samples_token=samples)


def plan(prefills=(), num_decodes=0, decode_context_tokens=0, reread_tokens=0):
    return SimpleNamespace(prefills=list(prefills), num_decodes=num_decodes,
                           decode_context_tokens=decode_context_tokens,
                           reread_tokens=reread_tokens)


def make_profile(**kw) -> Profile:
    shape = load_model("llama-test").to_dict()
    shape.pop("name")
    d = {"name": "cpu-llama-test", "device": {"name": "test-cpu", "kind": "cpu",
                                              "peak_flops": 1e11, "memory_bandwidth": 1e10,
                                              "memory_bytes": 2**34},
         "engine": "servesim-torch 0.1", "model": {"name": "llama-test", "shape": shape},
         "dtype": "bfloat16", "tensor_parallel": 1,
         "kv": {"bytes_per_token": 256, "block_size": 128, "num_gpu_blocks": 2048},
         "cost": {"form": "roofline", "coefficients": dict(COEF)},
         "efficiencies": {"mbu": 0.01, "mfu": 0.01},
         "noise": {"relative_residuals": [0.1]},
         "error": {"heldout": {"mape": 0.05, "p90": 0.08, "max": 0.2, "n": 30}},
         "provenance": {"kind": "measured", "date": "2026-11-30", "command": "servesim calibrate",
                        "source": "test", "measurements_csv": "cpu-llama-test.csv"}}
    for k, v in kw.items():
        d[k] = v
    return Profile.model_validate(d)


def run_plans(sc, cm, specs):
    """Drive a real Scheduler; return the list of (plan features, step ns)."""
    s = Scheduler(sc.scheduler_config(cm.num_gpu_blocks))
    for spec in specs:
        s.add_request(Request(spec))
    out = []
    while s.has_unfinished_requests():
        p = s.schedule()
        out.append((step_features(p), cm.step_time_ns(p)))
        s.update(p)
    return out


# -- forms ----------------------------------------------------------------------------------

def test_constant_inline():
    sc = scenario()
    cm = build_cost_model(sc)
    assert cm.label == "inline: constant 20 ms/step" and not cm.measured
    assert cm.num_gpu_blocks is None
    assert cm.kv_note == "unlimited (inline step_time, no num_gpu_blocks)"
    steps = run_plans(sc, cm, [RequestSpec(0, 0, (("a", 10),), 3)])
    assert [ns for _, ns in steps] == [20_000_000] * 3
    assert cm.setup_warning is None


def test_an_unchunked_default_budget_too_big_for_the_gpu_names_max_model_len():
    # Chunked prefill off and no budget given: max_num_batched_tokens is max_model_len
    # (131072 here), whose activation reserve fills an L4; the key to change is
    # max_model_len, not the budget the user never set (which must be >= it).
    kw = dict(model="llama-3.1-8b", dtype="bfloat16", hardware={"profile": "l4"})
    with pytest.raises(InputError) as e:
        build_cost_model(scenario(engine={"enable_chunked_prefill": False}, **kw))
    msg = str(e.value)
    assert "engine.max_model_len: llama-3.1-8b on l4" in msg
    assert msg.endswith("lower engine.max_model_len (with enable_chunked_prefill false, "
                        "max_num_batched_tokens defaults to it), or set "
                        "engine.enable_chunked_prefill true")
    assert build_cost_model(scenario(engine={"enable_chunked_prefill": False,
                                             "max_model_len": 8192}, **kw)).num_gpu_blocks
    # a max_num_batched_tokens given is the key named
    with pytest.raises(InputError, match="engine.max_num_batched_tokens: .*lower "
                                         "engine.max_num_batched_tokens$"):
        build_cost_model(scenario(engine={"max_num_batched_tokens": 131072}, **kw))


def test_inline_step_time_says_which_knobs_it_leaves_out():
    st = {"step_time": {"constant_s": 0.02}}
    cm = build_cost_model(scenario(hardware={**st, "tensor_parallel": 2},
                                   engine={"gpu_memory_utilization": 0.5}))
    assert cm.setup_warning == (
        "hardware.tensor_parallel 2 and engine.gpu_memory_utilization 0.5 do not enter an "
        "inline step_time: its seconds are the step's whole cost, and the KV cache is "
        "unlimited unless engine.num_gpu_blocks sets it")
    cm = build_cost_model(scenario(hardware={**st, "tensor_parallel": 2,
                                             "price_per_gpu_hour": 2.0},
                                   engine={"num_gpu_blocks": 100}))
    assert cm.setup_warning == (
        "hardware.tensor_parallel 2 does not enter an inline step_time: its seconds are the "
        "step's whole cost (tensor_parallel counts only in the price: 2 GPUs per replica)")
    assert cm.price_per_replica_hour == 4.0
    # vLLM's default, written out or not, is no surprise: not said
    assert build_cost_model(scenario(engine={"gpu_memory_utilization": 0.92})).setup_warning \
        is None


def test_linear_inline_on_real_scheduler_plans():
    sc = scenario(hardware={"step_time": {"base_s": 1e-3, "per_prefill_token_s": 1e-4,
                                          "per_decode_seq_s": 1e-3, "per_context_token_s": 1e-5}},
                  engine={"max_num_seqs": 2, "max_num_batched_tokens": 8})
    cm = build_cost_model(sc)
    steps = run_plans(sc, cm, [RequestSpec(0, 0, (("a", 12),), 3)])
    # 12-token prompt in chunks of 8 and 4, then two decodes attending 13 and 14 tokens.
    assert [ns for _, ns in steps] == [
        round((1e-3 + 8 * 1e-4 + 8 * 1e-5) * 1e9),
        round((1e-3 + 4 * 1e-4 + 12 * 1e-5) * 1e9),
        round((1e-3 + 1e-3 + 13 * 1e-5) * 1e9),
        round((1e-3 + 1e-3 + 14 * 1e-5) * 1e9)]
    assert cm.label.startswith("inline: linear 1 ms/step + 100 us/prefill token")


def test_roofline_by_hand(tmp_path):
    save_profile(make_profile(), tmp_path / "cpu-llama-test.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "cpu-llama-test.yaml"}))
    assert cm.measured and cm.form == "roofline"
    assert cm.label == ("measured: profile cpu-llama-test (servesim-torch 0.1, 2026-11-30; "
                        "held-out step-cost MAPE 5.0%)")
    # Mixed step: chunk of 10 after 6 cached (samples), chunk of 5 (partial), 3 decodes
    # attending 40 tokens. T = 18, R = 5; compute-bound dense part.
    p = plan([chunk(10, 6, True), chunk(5, 0, False)], 3, 40)
    dense = max(W_BYTES / 1e8, 2 * P_NONEMB * 18 / 1e9)
    assert dense == 2 * P_NONEMB * 18 / 1e9
    want = (1e-3 + 5 * 1e-4 + dense + (16 + 5 + 40) * KV_PER_TOKEN / 1e7
            + (10 * (6 + 5.5) + 5 * 3 + 40) * ATTN_PER_PAIR / 1e8 + 2 * P_LM * 4 / 1e9)
    assert want == pytest.approx(6.7288e-3, rel=1e-12)
    assert cm.step_seconds(p) == pytest.approx(want, rel=1e-12)
    # A lone decode is weight-bandwidth bound.
    want = 1e-3 + 1e-4 + W_BYTES / 1e8 + 10 * KV_PER_TOKEN / 1e7 + 10 * ATTN_PER_PAIR / 1e8 \
        + 2 * P_LM / 1e9
    assert cm.step_seconds(plan((), 1, 10)) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(3.248608e-3, rel=1e-12)


def test_roofline_attention_path_costs_by_hand():
    # A step holding prefill chunks pays prefill_step_s once, one holding decodes
    # decode_step_s once; a mixed step pays both (the optional roofline coefficients).
    k = RooflineConstants.of(load_model("llama-test"), "bfloat16")
    base = cmod._seconds_fn("roofline", COEF, k)
    paths = cmod._seconds_fn("roofline", {**COEF, "prefill_step_s": 2e-3,
                                          "decode_step_s": 5e-4}, k)
    for p, extra in ((plan([chunk(10, 6, True), chunk(5, 0, False)], 3, 40), 2.5e-3),
                     (plan([chunk(64, 0, False)]), 2e-3), (plan((), 7, 300), 5e-4)):
        assert paths(p) - base(p) == pytest.approx(extra, rel=1e-9)


def test_roofline_reread_rate_by_hand():
    # Re-read KV bytes at w_reread_bytes_per_s instead of w_attn_bytes_per_s: 7 decodes at
    # 300 context tokens, 96 of them read again (a shared prefix), at 4e7 B/s instead of
    # 1e7: 96 · 256 B · (1/4e7 − 1/1e7) s/B = −1.8432 ms. Without the rate a re-read is
    # priced as a first read.
    k = RooflineConstants.of(load_model("llama-test"), "bfloat16")
    base = cmod._seconds_fn("roofline", COEF, k)
    again = cmod._seconds_fn("roofline", {**COEF, "w_reread_bytes_per_s": 4e7}, k)
    p, q = plan((), 7, 300, 96), plan((), 7, 300)
    assert again(p) - base(p) == pytest.approx(96 * KV_PER_TOKEN * (1 / 4e7 - 1 / 1e7),
                                               rel=1e-9)
    assert again(p) - base(p) == pytest.approx(-1.8432e-3, rel=1e-9)
    assert base(p) == base(q) and again(q) == base(q)


def test_vectorised_roofline_matches_per_step():
    k = RooflineConstants.of(load_model("llama-test"), "bfloat16")
    fn = cmod._seconds_fn("roofline", COEF, k)
    plans = [plan([chunk(10, 6, True)], 3, 40, 16), plan((), 7, 300, 96),
             plan([chunk(64, 0, False)]), plan([chunk(1, 99, True), chunk(30, 2, True)], 1, 5)]
    f = [step_features(p) for p in plans]
    for coef in (COEF, {**COEF, "prefill_step_s": 2e-3, "decode_step_s": 5e-4},
                 {**COEF, "w_reread_bytes_per_s": 3e7}):
        fn = cmod._seconds_fn("roofline", coef, k)
        vec = roofline_seconds(coef, k, *(np.array([getattr(x, a) for x in f]) for a in (
            "tokens", "requests", "context_tokens", "attn_pairs", "sampled",
            "prefill_tokens", "decodes", "reread_tokens")))
        assert np.allclose(vec, [fn(p) for p in plans], rtol=1e-12)


def test_tensor_parallel_divides_work_and_adds_allreduce():
    shape, h100 = load_model("llama-test"), load_hardware("h100-sxm")
    k1 = RooflineConstants.of(shape, "bfloat16", 1, h100)
    k2 = RooflineConstants.of(shape, "bfloat16", 2, h100)
    assert (k1.weight_bytes, k1.dense_flops_per_token, k1.kv_bytes_per_token,
            k1.attn_flops_per_pair, k1.lm_head_flops_per_sample) == (
        W_BYTES, 2 * P_NONEMB, KV_PER_TOKEN, ATTN_PER_PAIR, 2 * P_LM)
    assert k1.allreduce_fixed_s == 0 and k1.allreduce_s_per_token == 0
    assert (k2.weight_bytes, k2.dense_flops_per_token, k2.kv_bytes_per_token,
            k2.attn_flops_per_pair, k2.lm_head_flops_per_sample) == (
        W_BYTES / 2, P_NONEMB, KV_PER_TOKEN / 2, ATTN_PER_PAIR / 2, P_LM)
    # two all-reduces per layer: latency + ring 2(tp-1)/tp x hidden x 2 bytes / 450 GB/s
    assert k2.allreduce_fixed_s == pytest.approx(2 * 2 * 5e-6)
    assert k2.allreduce_s_per_token == pytest.approx(2 * 2 * (2 * 1 / 2) * 64 * 2 / 450e9)
    # tp above the kv head count replicates kv heads: one head per GPU
    assert RooflineConstants.of(shape, "bfloat16", 4).kv_bytes_per_token == 2 * 2 * 1 * 16 * 2


def test_projection_label_and_tp_scaling():
    cm1 = build_cost_model(scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"}))
    cm2 = build_cost_model(scenario(model="llama-3.1-8b",
                                    hardware={"profile": "h100-sxm", "tensor_parallel": 2}))
    assert not cm1.measured and cm1.profile.provenance.kind == "projected"
    # the GPU count per replica is named as the knob it is, not a bare "×2"
    assert cm2.label.startswith("projected: roofline h100-sxm, tensor_parallel=2, ")
    assert "×" not in cm2.label and "(tensor_parallel=2; " in cm2.kv_note
    assert cm1.price_per_replica_hour == pytest.approx(2.99)
    assert cm2.price_per_replica_hour == pytest.approx(2 * 2.99)
    # one decode of 1000 tokens: weights + KV read over 0.7 x 3.35 TB/s, rest tiny
    m = load_model("llama-3.1-8b")
    bw = 0.7 * 3.35e12
    p = plan((), 1, 1000)
    t1 = (1e-3 + 1e-5 + (m.num_nonembedding_params + m.lm_head_params) * 2 / bw
          + 1000 * 131072 / bw + 1000 * 4 * 32 * 32 * 128 / (0.5 * 989.4e12)
          + 2 * m.lm_head_params / (0.5 * 989.4e12))
    assert cm1.step_seconds(p) == pytest.approx(t1, rel=1e-9)
    t2 = (1e-3 + 1e-5 + (t1 - 1e-3 - 1e-5) / 2 + 2 * 32 * 5e-6 + 2 * 32 * 1 * 4096 * 2 / 450e9)
    assert cm2.step_seconds(p) == pytest.approx(t2, rel=1e-9)


# -- KV capacity ----------------------------------------------------------------------------

def test_kv_blocks_llama_8b_h100_by_hand():
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"})
    cm = build_cost_model(sc)
    memory = 81559 * 2**20                       # H100 SXM 80GB as the driver reports it
    weights = 8_030_261_248 * 2                  # bf16
    # vllm serve's defaults on an H100: max_num_batched_tokens 8192, max_num_seqs 1024;
    # the sampler's 1024 rows of the vocabulary (38.4 B a logit), beside the hidden states
    # held, outgrow the forward's layer tensors
    forward = 8192 * 2 * (3 * 14336 + 3 * 4096 + (32 + 2 * 8) * 128)
    act = int(max(forward, 8192 * 2 * 4096 + 38.4 * 1024 * 128256))
    assert act > forward
    non_torch = 512 * 2**20
    budget = int(memory * 0.92) - weights - act - non_torch   # vLLM 0.32's default share
    want = budget // (16 * 2 * 32 * 8 * 128 * 2)
    assert want == 27166
    assert cm.num_gpu_blocks == want
    assert cm.kv_note.startswith("projected: h100-sxm 79.65 GiB × 0.92 − weights 14.96 GiB")
    assert cm.kv_note.endswith(f"→ {want} blocks of 16 tokens")
    cfg = sc.scheduler_config(cm.num_gpu_blocks)
    assert cfg.num_gpu_blocks == want and cfg.max_model_len == 131072


def test_kv_override_and_no_room():
    cm = build_cost_model(scenario(engine={"num_gpu_blocks": 500}))
    assert cm.num_gpu_blocks == 500 and "set in the scenario" in cm.kv_note
    with pytest.raises(InputError, match=r"^t.yaml: engine.gpu_memory_utilization: "
                                         r"llama-3.1-70b in bfloat16 \(131.4 GiB of weights "
                                         r"per GPU\) leaves no room"):
        build_cost_model(scenario(model="llama-3.1-70b", hardware={"profile": "h100-sxm"}))
    cm = build_cost_model(scenario(model="llama-3.1-70b",
                                   hardware={"profile": "h100-sxm", "tensor_parallel": 4}))
    assert cm.num_gpu_blocks > 1000



def test_no_room_for_a_kv_cache_names_what_the_user_can_change(tmp_path):
    y = tmp_path / "k.yaml"
    y.write_text("name: k\nmodel: llama-3.1-8b\nhardware: {profile: h100-sxm}\n"
                 "engine:\n  max_model_len: 4096\n  gpu_memory_utilization: 0.1\n"
                 "workload: {num_requests: 2, arrival: {process: poisson, rate: 1.0},\n"
                 "  prompt_tokens: {dist: fixed, value: 4}, output_tokens: {dist: fixed, "
                 "value: 2}}\n")
    with pytest.raises(InputError) as e:
        build_cost_model(load_scenario(y))
    msg = str(e.value)
    assert msg.startswith("k.yaml:6: engine.gpu_memory_utilization: llama-3.1-8b in bfloat16 ")
    at_least = float(msg.split("(to at least ")[1].split(")")[0])
    assert msg.endswith(f"raise engine.gpu_memory_utilization (to at least {at_least:g}), "
                        f"raise hardware.tensor_parallel or choose a larger GPU "
                        f"(hardware.profile)")
    # the utilization it names is the least (in hundredths) that holds one max_model_len
    # request (4096 tokens = 256 blocks) beside the null block, as vLLM requires
    def serves(util):
        sc = load_scenario(y, [f"engine.gpu_memory_utilization={util}"])
        sc.scheduler_config(build_cost_model(sc).num_gpu_blocks)
    serves(at_least)
    with pytest.raises(InputError, match="max_model_len: 4096 tokens need 256 KV blocks"):
        serves(round(at_least - 0.01, 2))
    # no utilization holds 70B's weights on one GPU: only tensor_parallel or the GPU helps
    with pytest.raises(InputError) as e:
        build_cost_model(load_scenario(y, ["model=llama-3.1-70b"]))
    assert str(e.value).startswith("k.yaml:6 (with --set model=llama-3.1-70b): "
                                   "engine.gpu_memory_utilization: llama-3.1-70b")
    assert str(e.value).endswith("not even gpu_memory_utilization 1 leaves room: raise "
                                 "hardware.tensor_parallel or choose a larger GPU "
                                 "(hardware.profile)")
    # the profiling-run reserve, not the weights, fills the GPU: the token budget is named
    with pytest.raises(InputError) as e:
        build_cost_model(load_scenario(y, ["engine.max_num_batched_tokens=2000000"]))
    assert str(e.value).startswith("--set engine.max_num_batched_tokens=2000000: "
                                   "llama-3.1-8b on h100-sxm with tensor_parallel=1: the "
                                   "activation reserve")

def test_a_sampler_reserve_that_fills_the_gpu_names_max_num_seqs():
    # A 2M-entry vocabulary: the start-up sampler run holds 38.4 B x 1024 rows x 2e6 logits
    # = 73.2 GiB, beyond the H100's 81559 MiB x 0.92 = 73.3 GiB less 1.9 GiB of weights
    # (2e6 x 512 x 2 B, tied); the forward's 8192 x 2 B x 6784 is 0.1 GiB. The fix is fewer
    # sampled rows (max_num_seqs): at 256 rows the sampler holds a quarter of that.
    shape = {"architecture": "Llama", "hidden_size": 512, "intermediate_size": 1408,
             "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 64, "vocab_size": 2_000_000, "max_position_embeddings": 4096,
             "tie_word_embeddings": True}
    kw = dict(model=shape, dtype="bfloat16", hardware={"profile": "h100-sxm"})
    assert 38.4 * 1024 * 2e6 > 81559 * 2**20 * 0.92 - 2e6 * 512 * 2 - 0.5 * 2**30
    with pytest.raises(InputError) as e:
        build_cost_model(scenario(engine={"max_num_seqs": 1024}, **kw))
    msg = str(e.value)
    assert msg.startswith("t.yaml: engine.max_num_seqs: inline on h100-sxm")
    assert "the sampler's reserve for 1024 rows" in msg
    assert "2000000-entry vocabulary" in msg and msg.endswith("lower engine.max_num_seqs")
    assert build_cost_model(scenario(engine={"max_num_seqs": 256}, **kw)).num_gpu_blocks > 2
    # the weights the larger part (8B's layers, a 2.5M vocabulary: 51.1 GiB), the sampler's
    # 38.4 B x 256 rows x 2.5e6 = 22.9 GiB beside them: utilization is the key, and fewer
    # rows a fix too, since 8 rows leave room
    big = dict(load_model("llama-3.1-8b").to_dict(), vocab_size=2_500_000)
    big.pop("name")
    kw = dict(model=big, dtype="bfloat16", hardware={"profile": "h100-sxm"})
    with pytest.raises(InputError) as e:
        build_cost_model(scenario(engine={"max_num_seqs": 256}, **kw))
    assert str(e.value).startswith("t.yaml: engine.gpu_memory_utilization: ")
    assert str(e.value).endswith("; or lower engine.max_num_seqs (the sampler's start-up "
                                 "reserve for 256 rows takes 23.0 GiB)")
    assert build_cost_model(scenario(engine={"max_num_seqs": 8}, **kw)).num_gpu_blocks > 2
    # where no row count makes room, fewer rows are not offered
    with pytest.raises(InputError) as e:
        build_cost_model(scenario(model="llama-3.1-70b", hardware={"profile": "h100-sxm"}))
    assert "max_num_seqs" not in str(e.value)


def test_a_block_count_from_set_is_named_as_such_and_its_errors_suggest_raising_it():
    d = {"name": "t", "model": "llama-test", "workload": WORKLOAD,
         "hardware": {"step_time": {"constant_s": 0.02}}, "engine": {"max_model_len": 512}}
    sc = scenario_from_dict(d, source="t.yaml", overrides=["engine.num_gpu_blocks=20"])
    cm = build_cost_model(sc)
    assert cm.kv_note == ("engine.num_gpu_blocks = 20 "
                          "(set with --set engine.num_gpu_blocks=20)")
    # 512 tokens need 32 blocks of 16; 19 usable: the fix is more blocks, not more memory
    with pytest.raises(InputError) as e:
        sc.scheduler_config(cm.num_gpu_blocks)
    assert str(e.value) == (
        "t.yaml (with --set engine.num_gpu_blocks=20): engine.max_model_len: 512 tokens "
        "need 32 KV blocks of 16 but the cache "
        "holds 19 for requests (20 blocks less block 0, which vLLM reserves as its null "
        "block): lower max_model_len (to at most 304) or raise engine.num_gpu_blocks (or "
        "remove it to size "
        "the cache from gpu_memory_utilization)")


def test_a_profile_with_an_efficiency_above_one_says_what_it_means(tmp_path):
    # MBU 4.0 in a profile reads as a bug to a vLLM user, who knows MBU <= 1
    from simulator.cost_model import load_profile
    save_profile(make_profile(efficiencies={"mbu": 2.5, "mfu": 0.5}), tmp_path / "p.yaml")
    text = (tmp_path / "p.yaml").read_text()
    assert ("\n# efficiencies: the fit's effective rates over the device's peaks (or measured "
            "ceilings);\n# mbu 2.50 > 1: faster than that peak, as when a small model's "
            "weights stay in cache, not a bound on the hardware\nefficiencies:") in text
    assert load_profile(tmp_path / "p.yaml").efficiencies.mbu == 2.5
    # at the fit's bound (4x the ceiling) the rate is not fitted, only capped: said too
    save_profile(make_profile(efficiencies={"mbu": 4.0, "mfu": 0.5}), tmp_path / "p.yaml")
    text = (tmp_path / "p.yaml").read_text()
    assert ("# mbu 4.00 (the fit's bound: too small a term to fit) > 1: faster than that "
            "peak") in text
    assert load_profile(tmp_path / "p.yaml").efficiencies.mbu == 4.0
    save_profile(make_profile(), tmp_path / "q.yaml")   # all <= 1: no comment
    assert "#" not in (tmp_path / "q.yaml").read_text()


def test_measured_profile_blocks_converted_to_block_size(tmp_path):
    save_profile(make_profile(), tmp_path / "p.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"}))
    assert cm.num_gpu_blocks == 2048 * 128 // 16
    # the steps were measured with blocks of 128: said, since only the KV count converts
    assert cm.setup_warning.startswith("profile p (name field: cpu-llama-test) measured its "
                                    "steps with blocks of 128 tokens, the scenario's "
                                    "engine.block_size is 16")
    same = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"},
                                     engine={"block_size": 128}))
    assert same.num_gpu_blocks == 2048 and same.setup_warning is None
    prof = make_profile(kv={"bytes_per_token": 256, "block_size": 128,
                            "num_gpu_blocks": 2**31 // (128 * 256), "kv_cache_memory_bytes": 2**31})
    save_profile(prof, tmp_path / "q.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "q.yaml"}))
    assert cm.num_gpu_blocks == 2**31 // (16 * 256)


def test_a_profile_file_says_its_schema_version(tmp_path):
    d = make_profile().model_dump(mode="json")
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    assert load_profile(p).schema_version == 1
    d.pop("schema_version")   # refused, as 2 or '1' are
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match=rf"^{re.escape(str(p))}: schema_version: required key "
                                         r"missing \(this servesim reads profiles of "
                                         r"schema_version 1; a profile is the YAML mapping"):
        load_profile(p)
    # misspelt, it is the unknown key that is named, with the one meant
    p.write_text(yaml.safe_dump({"schema_versoin": 1, **d}, sort_keys=False))
    with pytest.raises(InputError, match=r":1: schema_versoin: unknown key; did you mean "
                                         r"schema_version\?"):
        load_profile(p)
    d["kv"]["num_gpu_blocks"] = 2**19   # the device's whole memory: still accepted
    p.write_text(yaml.safe_dump({"schema_version": 1, **d}))
    assert load_profile(p).kv.num_gpu_blocks == 2**19
    # calibrate's measurements CSV beside it, given for the profile (read as YAML: "holds
    # a single value")
    c = tmp_path / "p.measurements.csv"
    c.write_text("# {\"dtype\": \"bfloat16\"}\nkind,tokens\nprefill,16\n")
    with pytest.raises(InputError, match=rf"^{re.escape(str(c))}: a CSV file, not a profile: "
                                         r"give the profile's .yaml"):
        load_profile(c)


@pytest.mark.parametrize("kv, message", [
    # llama-test in bfloat16: 2 x 2 layers x 2 kv heads x 16 head_dim x 2 bytes = 256
    ({"bytes_per_token": 1, "num_gpu_blocks": 2048},
     "kv.bytes_per_token: 1, but llama-test in bfloat16 holds 256 bytes of KV per token (2 "
     "x 2 layers x 2 kv heads x 16 head_dim x 2 bytes, its model.shape)"),
    ({"bytes_per_token": 256, "kv_cache_memory_bytes": 2**34 + 1},
     "kv.kv_cache_memory_bytes: 17179869185 bytes per GPU is more than the device holds "
     "(17179869184 bytes)"),
    ({"bytes_per_token": 256, "num_gpu_blocks": 3, "kv_cache_memory_bytes": 2**31},
     "kv.num_gpu_blocks: 3, but kv_cache_memory_bytes 2147483648 holds 65536 blocks of 128 "
     "tokens"),
    # the older key is named as the file gives it
    ({"bytes_per_token": 256, "memory_budget_bytes": 2**34 + 1},
     "kv.memory_budget_bytes: 17179869185 bytes per GPU is more than the device holds "
     "(17179869184 bytes)"),
    ({"bytes_per_token": 256, "num_gpu_blocks": 3, "memory_budget_bytes": 2**31},
     "kv.num_gpu_blocks: 3, but memory_budget_bytes 2147483648 holds 65536 blocks of 128 "
     "tokens"),
    # a memory that holds no usable block (one block of 128 x 256 bytes: only the null one)
    ({"bytes_per_token": 256, "kv_cache_memory_bytes": 100},
     "kv.kv_cache_memory_bytes: 100 bytes per GPU hold 0 blocks of 128 tokens (32768 bytes "
     "each); a KV cache needs at least 2 (block 0 is vLLM's null block)"),
    ({"bytes_per_token": 256, "memory_budget_bytes": 65535},
     "kv.memory_budget_bytes: 65535 bytes per GPU hold 1 block of 128 tokens"),
    # alone: 2**19 blocks of 128 x 256 bytes = 2**34, the device's memory; one more is not
    ({"bytes_per_token": 256, "num_gpu_blocks": 2**19 + 1},
     "kv.num_gpu_blocks: 524289 blocks of 32768 bytes per GPU are more than the device "
     "holds (17179869184 bytes)"),
])
def test_a_profile_whose_kv_facts_contradict_its_model_is_refused(tmp_path, kv, message):
    # each is refused: it would give 256x the blocks (1 byte per token), trillions (a budget
    # past the device's memory), or an ignored num_gpu_blocks (beside a budget)
    assert load_model("llama-test").kv_bytes_per_token("bfloat16") == 256
    p = tmp_path / "p.yaml"
    d = make_profile().model_dump(mode="json") | {"kv": {**kv, "block_size": 128}}
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError) as e:
        load_profile(p)
    assert str(e.value).startswith(f"{p}:") and message in str(e.value)


def test_kv_cache_memory_bytes_is_written_and_memory_budget_bytes_still_read(tmp_path, capsys):
    """The KV block's memory is vLLM's kv_cache_memory_bytes; a file written before that
    name (memory_budget_bytes) reads the same, and one giving both is refused."""
    kv = {"bytes_per_token": 256, "block_size": 128, "num_gpu_blocks": 2**31 // (128 * 256)}
    new = make_profile(kv={**kv, "kv_cache_memory_bytes": 2**31})
    assert new.kv.kv_cache_memory_bytes == 2**31
    p = save_profile(new, tmp_path / "new.yaml")
    text = p.read_text()
    assert "kv_cache_memory_bytes: 2147483648" in text and "memory_budget_bytes" not in text
    assert load_profile(p).kv.model_dump() == new.kv.model_dump()
    old = tmp_path / "old.yaml"   # as calibrate wrote it before (the shipped ones did)
    old.write_text(text.replace("kv_cache_memory_bytes:", "memory_budget_bytes:"))
    got = load_profile(old)
    assert got.kv.kv_cache_memory_bytes == 2**31 and got.kv.model_dump() == new.kv.model_dump()
    sc = {n: scenario(tmp_path, hardware={"profile": f"{n}.yaml"}) for n in ("new", "old")}
    assert build_cost_model(sc["old"]).num_gpu_blocks == \
        build_cost_model(sc["new"]).num_gpu_blocks == 2**31 // (16 * 256)
    assert "memory_budget_bytes" not in save_profile(got, tmp_path / "re.yaml").read_text()
    both = tmp_path / "both.yaml"
    both.write_text(text.replace("kv_cache_memory_bytes: 2147483648",
                                 "kv_cache_memory_bytes: 2147483648, memory_budget_bytes: "
                                 "2147483648"))
    line = next(i for i, t in enumerate(both.read_text().splitlines(), 1)
                if t.startswith("kv:"))
    with pytest.raises(InputError) as e:
        load_profile(both)
    assert str(e.value) == (
        f"{both}:{line}: kv.memory_budget_bytes: give kv_cache_memory_bytes (per GPU, as "
        "vLLM's --kv-cache-memory-bytes) or memory_budget_bytes (its older name: the "
        "tensor-parallel group's), not both")
    # through the CLI: that line, exit 2
    from simulator.cli import main
    sc_path = tmp_path / "sc.yaml"
    sc_path.write_text(yaml.safe_dump({"name": "t", "model": "llama-test", "workload": WORKLOAD,
                                       "hardware": {"profile": "both.yaml"}}))
    capsys.readouterr()
    assert main(["run", str(sc_path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(str(e.value)), err
    # a null new key is no key (null means unset elsewhere too): the older one is read
    nul = tmp_path / "nul.yaml"
    nul.write_text(text.replace("kv_cache_memory_bytes: 2147483648",
                                "kv_cache_memory_bytes: null, memory_budget_bytes: 2147483648"))
    assert load_profile(nul).kv.model_dump() == new.kv.model_dump()


@pytest.mark.parametrize("model, tp, seqs, logged_gib", [
    # vLLM V1 on H100 at its defaults (8192 tokens, 1024 rows): llm-d-benchmark
    # config_explorer/empirical-vllm-memory-results.md (Llama-3.3-70B has 3.1-70B's shape)
    ("llama-3.1-8b", 1, 1024, 4.76), ("llama-3.1-70b", 2, 1024, 4.84),
    # vLLM V0 at 256 rows, vLLM PR #10511 (Llama-3-8B: 3.1-8B's shape)
    ("llama-3.1-8b", 1, 256, 1.26)])
def test_activation_reserve_is_near_the_peak_vllm_logs(model, tp, seqs, logged_gib):
    from simulator.catalog import load_model
    from simulator.cost_model import activation_reserve_bytes

    act = activation_reserve_bytes(load_model(model), "bfloat16", 8192, seqs, tp)
    assert act / 2**30 == pytest.approx(logged_gib, rel=0.02)


def test_kv_blocks_at_tensor_parallel_2_charge_communication_buffers():
    """With tensor_parallel > 1 vLLM's non-torch memory holds NCCL and custom all-reduce
    buffers: 2 GiB per GPU (1.79 -> 3.58 GiB from TP1 to TP2 in vLLM PR #10511), 0.5 GiB on
    one GPU; weights, the tp-split activations and the KV heads are halved per GPU."""
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm", "tensor_parallel": 2})
    cm = build_cost_model(sc)
    memory = 81559 * 2**20
    weights = 8_030_261_248 * 2 // 2
    act = int(max(8192 * 2 * (3 * 14336 // 2 + 3 * 4096 + (32 + 2 * 8) * 128 // 2),
                  8192 * 2 * 4096 + 38.4 * 1024 * 128256))   # the full vocabulary per GPU
    budget = int(memory * 0.92) - weights - act - 2 * 2**30
    want = budget // (16 * 2 * 32 * (8 // 2) * 128 * 2)
    assert want == 60454
    assert cm.num_gpu_blocks == want
    assert "− non-torch 2.00 GiB = " in cm.kv_note and "non-torch estimated" in cm.kv_note


def test_kv_override_beyond_gpu_memory_warns(tmp_path):
    """engine.num_gpu_blocks past what the memory holds (27166 blocks for llama-3.1-8b on
    an H100 at 0.92, test_kv_blocks_llama_8b_h100_by_hand) is vLLM's override, which would
    fail to allocate: the run goes on, with a warning; at or below it, none."""
    gpu = {"model": "llama-3.1-8b", "hardware": {"profile": "h100-sxm"}}
    cm = build_cost_model(scenario(engine={"num_gpu_blocks": 27167}, **gpu))
    assert cm.num_gpu_blocks == 27167
    assert cm.setup_warning == (
        "engine.num_gpu_blocks = 27167 (set in the scenario) is more than the 27166 blocks "
        "that h100-sxm's memory holds at gpu_memory_utilization 0.92 (tensor_parallel=1); vLLM "
        "would fail to allocate that KV cache, so this run describes a GPU with more memory")
    assert cm.kv_note.endswith("; more than the 27166 blocks that h100-sxm's memory holds at "
                               "gpu_memory_utilization 0.92 (tensor_parallel=1)")
    assert build_cost_model(scenario(engine={"num_gpu_blocks": 27166}, **gpu)).setup_warning is None
    # a CPU profile's count is its calibration engine's setting, not a memory limit
    save_profile(make_profile(), tmp_path / "p.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"},
                                   engine={"num_gpu_blocks": 10**6, "block_size": 128}))
    assert cm.num_gpu_blocks == 10**6 and cm.setup_warning is None
    # a GPU profile's measured KV memory: 2**31 bytes / (16 tokens x 256 bytes) = 524288
    dev = {"name": "h100-sxm", "kind": "gpu", "peak_flops": 1e15, "memory_bandwidth": 3e12,
           "memory_bytes": 80 * 2**30}
    save_profile(make_profile(device=dev, kv={"bytes_per_token": 256, "block_size": 16,
                                              "kv_cache_memory_bytes": 2**31}),
                 tmp_path / "g.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "g.yaml"},
                                   engine={"num_gpu_blocks": 524289}))
    assert "more than the 524288 blocks that the KV memory measured in profile g (name " \
        "field: cpu-llama-test) holds;" in cm.setup_warning


# -- profiles -------------------------------------------------------------------------------

def test_profile_round_trip_and_lookup(tmp_path, monkeypatch):
    prof = make_profile()
    path = save_profile(prof, tmp_path / "store" / "cpu-llama-test.yaml")
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["cpu-llama-test.yaml"]
    back = load_profile(path)
    assert back.model_dump() == prof.model_dump() and back.path == path
    assert back.model_shape == load_model("llama-test")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "store"))
    assert cmod.list_profiles()["cpu-llama-test"] == path
    assert load_profile("cpu-llama-test").model_dump() == prof.model_dump()
    with pytest.raises(InputError, match=r"unknown profile 'nope' \(known: cpu-llama-test"):
        load_profile("nope")
    # a misspelt folder in $SERVESIM_PROFILES is named, not silently skipped
    monkeypatch.setenv("SERVESIM_PROFILES", f"{tmp_path / 'store'}:{tmp_path / 'stroe'}")
    with pytest.raises(InputError, match=r"known: cpu-llama-test.*\); \$SERVESIM_PROFILES "
                                         r"names folders that do not exist: .*stroe$"):
        load_profile("nope")
    # a file there is not said not to exist
    monkeypatch.setenv("SERVESIM_PROFILES", f"{tmp_path / 'store'}:{path}")
    with pytest.raises(InputError, match=r"\$SERVESIM_PROFILES names paths that are not "
                                         r"folders: .*cpu-llama-test\.yaml$"):
        load_profile("nope")
    with pytest.raises(InputError, match=r"store: profile is a folder, not a file$"):
        load_profile(tmp_path / "store")


def test_a_profile_name_is_at_most_200_characters(tmp_path):
    # a name is printed in the run's table and twice in every report: at most 200 characters
    d = make_profile().model_dump(mode="json")
    d["name"] = "p" * 201
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match="name: String should have at most 200 characters"):
        load_profile(tmp_path / "p.yaml")


def test_profile_schema_errors(tmp_path):
    # named by the whole path: a profile is often found in another folder than the scenario's
    bad = re.escape(str(tmp_path / "bad.yaml"))
    d = make_profile().model_dump(mode="json")
    d["cost"]["coefficients"].pop("a0_s")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
    line = yaml.safe_dump(d).splitlines().index("  coefficients:") + 1   # not cost:'s
    with pytest.raises(InputError, match=rf"^{bad}:{line}: cost.coefficients: roofline needs "
                                         r"exactly the "
                                         r"coefficients a0_s, .*; missing a0_s$"):
        load_profile(tmp_path / "bad.yaml")
    d = make_profile().model_dump(mode="json")
    d["kv"]["blocks"] = 3
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
    line = yaml.safe_dump(d).splitlines().index("  blocks: 3") + 1
    with pytest.raises(InputError, match=rf"^{bad}:{line}: kv.blocks: unknown key \(allowed: "
                                         r"bytes_per_token, block_size"):
        load_profile(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text("name: x\ndevice: [\n")
    with pytest.raises(InputError, match=rf"^{bad}:3: YAML syntax error"):
        load_profile(tmp_path / "bad.yaml")


def test_profile_for_another_model_or_dtype_refused(tmp_path):
    from simulator.catalog import load_model
    save_profile(make_profile(), tmp_path / "cpu-llama-test.yaml")
    test, tiny = load_model("llama-test"), load_model("llama-tiny-56m")
    first = next(k for k in ("hidden_size", "intermediate_size", "num_hidden_layers")
                 if getattr(test, k) != getattr(tiny, k))
    mine, theirs = getattr(test, first), getattr(tiny, first)
    with pytest.raises(InputError, match=rf"^t.yaml: hardware.profile: profile cpu-llama-test "
                                         rf"was measured for model llama-test \(bfloat16; "
                                         rf"{first} {mine}, not {theirs}\) but the "
                                         r"scenario runs llama-tiny-56m \(bfloat16\): .*, or run "
                                         r"the profile's own \(model: llama-test, dtype: "
                                         r"bfloat16\)$"):
        build_cost_model(scenario(tmp_path, model="llama-tiny-56m",
                                  hardware={"profile": "cpu-llama-test.yaml"}))
    # the same name on another shape: the difference is what the message can name
    d = make_profile().model_dump(mode="json")
    d["model"]["shape"]["num_hidden_layers"] *= 2
    d["kv"]["bytes_per_token"] *= 2   # as its layers
    (tmp_path / "deeper.yaml").write_text(yaml.safe_dump(d))
    layers = load_model("llama-test").num_hidden_layers
    with pytest.raises(InputError, match=rf"was measured for model llama-test \(bfloat16; "
                                         rf"num_hidden_layers {2 * layers}, not {layers}\) but "
                                         rf"the scenario runs llama-test \(bfloat16\)"):
        build_cost_model(scenario(tmp_path, hardware={"profile": "deeper.yaml"}))
    with pytest.raises(InputError, match=r"llama-test \(bfloat16\) but the scenario runs "
                                         r"llama-test \(float32\)"):
        build_cost_model(scenario(tmp_path, dtype="float32", hardware={"profile": "cpu-llama-test.yaml"}))
    with pytest.raises(InputError, match=r"^t.yaml: hardware.profile: 'nope' is neither a "
                                         r"catalog GPU \(h100-sxm"):
        build_cost_model(scenario(tmp_path, hardware={"profile": "nope"}))


# -- noise ----------------------------------------------------------------------------------

def test_empirical_noise(tmp_path):
    save_profile(make_profile(), tmp_path / "p.yaml")
    p = plan((), 1, 10)
    base = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"}))
    noisy = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml",
                                                          "cost_noise": "empirical"}))
    assert noisy.step_time_ns(p) == round(base.step_seconds(p) * 1.1 * 1e9)
    save_profile(make_profile(noise={"relative_residuals": [-0.5, 0.5]}), tmp_path / "q.yaml")
    sc = scenario(tmp_path, hardware={"profile": "q.yaml", "cost_noise": "empirical"})

    def draws(seed):
        cm = build_cost_model(sc, np.random.default_rng(seed))
        return [cm.step_time_ns(p) for _ in range(100)]

    t = base.step_seconds(p)
    a = draws(1)
    assert set(a) == {round(0.5 * t * 1e9), round(1.5 * t * 1e9)}
    assert a == draws(1) and a != draws(2)
    # the source says the steps are noisy, so a sweep over cost_noise tells its points apart
    assert build_cost_model(sc).label.endswith(
        "; each step × (1 + one of its 2 fit residuals, drawn at random: cost_noise empirical)")
    assert "cost_noise" not in base.label
    # replicas share one loaded profile, each with its own draws
    twin = build_cost_model(sc, np.random.default_rng(2)).with_rng(np.random.default_rng(1))
    assert [twin.step_time_ns(p) for _ in range(100)] == a
    save_profile(make_profile(noise={"relative_residuals": []}), tmp_path / "r.yaml")
    with pytest.raises(InputError, match=r"hardware.cost_noise: empirical needs residuals"):
        build_cost_model(scenario(tmp_path, hardware={"profile": "r.yaml",
                                                      "cost_noise": "empirical"}))



def test_empirical_noise_on_a_projection_names_cost_noise_once(tmp_path):
    y = tmp_path / "e.yaml"
    y.write_text("name: e\nmodel: llama-test\nhardware:\n  profile: h100-sxm\n"
                 "  cost_noise: empirical\n"
                 "workload: {num_requests: 2, arrival: {process: poisson, rate: 1.0},\n"
                 "  prompt_tokens: {dist: fixed, value: 4}, output_tokens: {dist: fixed, "
                 "value: 2}}\n")
    msg = ("empirical needs a measured profile's residuals; a projection has none")
    with pytest.raises(InputError) as e:   # the file and line once
        build_cost_model(load_scenario(y))
    assert str(e.value) == f"e.yaml:5: hardware.cost_noise: {msg}"
    y.write_text(y.read_text().replace("  cost_noise: empirical\n", ""))
    with pytest.raises(InputError) as e:
        build_cost_model(load_scenario(y, ["hardware.cost_noise=empirical"]))
    assert str(e.value) == f"--set hardware.cost_noise=empirical: {msg}"

def test_step_time_at_least_one_ns():
    # the clock ticks in ns: a linear step priced at 1 ps takes one tick; a constant step
    # below a tick is refused (it would run as 1 ns while the header printed its value)
    cm = build_cost_model(scenario(hardware={"step_time": {"base_s": 1e-12}}))
    assert cm.step_time_ns(plan()) == 1
    with pytest.raises(InputError, match=r"hardware.step_time.constant_s: Input should be "
                                         r"greater than or equal to 0.000000001 \(got 1e-12\)"):
        scenario(hardware={"step_time": {"constant_s": 1e-12}})
    assert build_cost_model(scenario(hardware={"step_time": {"constant_s": 1e-9}})
                            ).step_time_ns(plan()) == 1


# -- efficiencies for projections -----------------------------------------------------------

def test_cpu_efficiencies_never_carried_to_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    save_profile(make_profile(), tmp_path / "local" / "cpu-llama-test.yaml")
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"})
    assert build_cost_model(sc).label == (
        "projected: roofline h100-sxm, tensor_parallel=1, default efficiencies (MBU 0.7, "
        "MFU 0.5)")
    gpu = make_profile(name="h100-measured",
                       device={"name": "h100-sxm", "kind": "gpu", "peak_flops": 989.4e12,
                               "memory_bandwidth": 3.35e12, "memory_bytes": 81559 * 2**20},
                       efficiencies={"mbu": 0.6, "mfu": 0.4}, engine="vllm 0.32.0")
    save_profile(gpu, tmp_path / "local" / "h100-measured.yaml")
    cm = build_cost_model(sc)
    assert cm.label == ("projected: roofline h100-sxm, tensor_parallel=1, efficiencies of "
                        "measured profile h100-measured (MBU 0.6, MFU 0.4)")
    assert cm.profile.cost.coefficients["w_eff_bytes_per_s"] == pytest.approx(0.6 * 3.35e12)
    assert cm.profile.cost.coefficients["a0_s"] == COEF["a0_s"]


def test_a_gpu_profile_of_servesims_own_engine_is_never_borrowed(tmp_path, monkeypatch):
    # on a GPU servesim's engine runs eagerly (no CUDA graphs): its launch-bound steps
    # (a0 11 ms, MBU 0.28 on an H200) would make every catalog projection of vLLM as slow
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    eager = make_profile(name="h200-eager",
                         device={"name": "h200", "kind": "gpu", "peak_flops": 989.4e12,
                                 "memory_bandwidth": 4.8e12, "memory_bytes": 141 * 2**30},
                         efficiencies={"mbu": 0.28, "mfu": 0.66},
                         engine="servesim-torch 0.1.0")
    save_profile(eager, tmp_path / "local" / "h200-eager.yaml")
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"})
    cm = build_cost_model(sc)
    assert cm.label == ("projected: roofline h100-sxm, tensor_parallel=1, default "
                        "efficiencies (MBU 0.7, MFU 0.5)")
    c = cm.profile.cost.coefficients
    assert (c["w_eff_bytes_per_s"], c["a0_s"]) == (pytest.approx(0.7 * 3.35e12),
                                                   cmod.DEFAULT_STEP_OVERHEAD_S)
    # the profile itself still serves a scenario that names it, labelled measured
    mine = scenario(hardware={"profile": "h200-eager"})
    assert build_cost_model(mine).label.startswith("measured: profile h200-eager")
    # one of vLLM (however its name is cased) is borrowed
    save_profile(make_profile(name="h200-vllm", device=eager.device.model_dump(),
                              efficiencies={"mbu": 0.8, "mfu": 0.6}, engine="VLLM 0.32.0"),
                 tmp_path / "local" / "h200-vllm.yaml")
    assert build_cost_model(sc).label.endswith("efficiencies of measured profile h200-vllm "
                                               "(MBU 0.8, MFU 0.6)")


def test_a_borrowed_efficiency_past_the_spec_sheet_is_capped_and_said(tmp_path, monkeypatch):
    # a vLLM profile whose weights term pinned at the fit's bound (MBU 4): uncapped, an A100
    # decode of Llama-3.1-8B would be priced at 3.97 ms where reading its 15 GB of weights
    # at the spec sheet's full 2.039 TB/s takes 7.36 ms
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    save_profile(make_profile(name="h100-vllm",
                              device={"name": "h100-sxm", "kind": "gpu", "peak_flops": 989.4e12,
                                      "memory_bandwidth": 3.35e12,
                                      "memory_bytes": 81559 * 2**20},
                              efficiencies={"mbu": 4.0, "mfu": 0.55}, engine="vllm 0.32.0"),
                 tmp_path / "local" / "h100-vllm.yaml")
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "a100-80gb"})
    cm = build_cost_model(sc)
    c = cm.profile.cost.coefficients
    assert c["w_eff_bytes_per_s"] == pytest.approx(2.039e12)   # MBU 1 of the A100's peak
    assert c["f_eff_flops_per_s"] == pytest.approx(0.55 * cm.profile.device.peak_flops)
    assert cm.label.endswith("efficiencies of measured profile h100-vllm (MBU 1, MFU 0.55)")
    assert cm.setup_warning == (
        "measured profile h100-vllm has MBU 4, past its GPU's peak (its fit's bound: the "
        "term was too small to fit); the projection borrows it capped at 1")
    # a batch-1 decode is no faster than its weights read at the full bandwidth
    weights = cm.profile.model_shape.weight_bytes("bfloat16")
    step = cm.step_time_ns(plan((), 1, 1000)) / 1e9
    assert step > weights / 2.039e12


def test_a_projection_names_the_profile_files_it_could_not_read(tmp_path, monkeypatch):
    # a vLLM GPU profile broken by a hand edit is named in a warning, since the projection
    # then uses default efficiencies where the user expects theirs
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"})
    assert build_cost_model(sc).setup_warning is None
    broken = tmp_path / "local" / "h100-vllm.yaml"
    broken.parent.mkdir()
    broken.write_text("name: h100-vllm\nengine: vllm 0.32.0\ndevice: [\n")
    cm = build_cost_model(sc)
    assert cm.label.endswith("default efficiencies (MBU 0.7, MFU 0.5)")
    assert cm.setup_warning == (f"the projection borrowed no efficiencies from profile file "
                                f"{broken}: unreadable (servesim profiles says why)")
    # a measured profile the scenario names is not a projection: nothing borrowed, no word
    save_profile(make_profile(name="mine"), tmp_path / "local" / "mine.yaml")
    mine = build_cost_model(scenario(hardware={"profile": "mine"},
                                     engine={"block_size": 128}))
    assert mine.label.startswith("measured: profile mine") and mine.setup_warning is None


@pytest.mark.parametrize("name, gib, want", [
    # vLLM 0.32 EngineArgs.get_batch_defaults, OPENAI_API_SERVER: >= 160 GiB, then >= 70 GiB
    # other than an A100, then the rest
    ("b200", 180, (16384, 1024)), ("h200", 140, (8192, 1024)), ("a100-80gb", 80, (2048, 256)),
    ("l40s", 45, (2048, 256))])
def test_serving_defaults_follow_a_measured_gpus_memory(tmp_path, name, gib, want):
    device = {"name": name, "kind": "gpu", "peak_flops": 1e15, "memory_bandwidth": 4e12,
              "memory_bytes": gib * 2**30}
    save_profile(make_profile(name="g", device=device), tmp_path / "g.yaml")
    sc = scenario(tmp_path, hardware={"profile": "g.yaml"})
    assert sc.serving_defaults() == want
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == want
    # ... and the token budget is at most max_num_seqs x max_model_len, as vLLM caps it
    short = scenario(tmp_path, hardware={"profile": "g.yaml"},
                     engine={"max_model_len": 4, "max_num_seqs": 100})
    assert short.max_num_batched_tokens == 400
    assert scenario(tmp_path, hardware={"profile": "g.yaml"},
                    engine={"max_model_len": 4, "max_num_batched_tokens": 64}
                    ).max_num_batched_tokens == 64   # given: as given


def test_projection_borrows_the_newest_gpu_profile_by_date(tmp_path, monkeypatch):
    # dates compare as dates, whether YAML read them quoted (text) or not
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    device = {"name": "a100-80gb", "kind": "gpu", "peak_flops": 312e12,
              "memory_bandwidth": 2.0e12, "memory_bytes": 81920 * 2**20}
    for name, date, mbu, quoted in (("newer", "2026-12-01", 0.6, False),
                                    ("older", "2026-09-30", 0.5, True)):
        p = make_profile(name=name, device=device, efficiencies={"mbu": mbu, "mfu": 0.4},
                         provenance={"kind": "measured", "date": date}, engine="vllm 0.32.0")
        path = save_profile(p, tmp_path / "local" / f"{name}.yaml")
        assert f"date: '{date}'" in path.read_text()
        if not quoted:
            path.write_text(path.read_text().replace(f"'{date}'", date))
    sc = scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"})
    assert build_cost_model(sc).label.endswith("efficiencies of measured profile newer "
                                               "(MBU 0.6, MFU 0.4)")


@pytest.mark.parametrize("value, got", [("yesterday", "'yesterday'"),
                                        ("'2026-13-01'", "'2026-13-01'"),
                                        # unquoted: text, not a date
                                        ("2026-13-01", "'2026-13-01'"),
                                        ("2026-12-01 10:00:00", "'2026-12-01 10:00:00'")])
def test_a_provenance_date_is_an_iso_date(tmp_path, value, got):
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "date:" in t)
    (tmp_path / "p.yaml").write_text(text.replace("'2026-11-30'", value))
    with pytest.raises(InputError, match=rf"^{re.escape(str(tmp_path / 'p.yaml'))}:{line}: "
                                         rf"provenance\.date: must be an ISO date, YYYY-MM-DD "
                                         rf"\(got {re.escape(got)}\)$"):
        load_profile(tmp_path / "p.yaml")


@pytest.mark.parametrize("value, said", [
    ("-1.0", "a0_s: seconds of one step: it must be >= 0 and < 3600 (got -1)"),
    ("1e5", "a0_s: seconds of one step: it must be >= 0 and < 3600 (got 100000)"),
    (".nan", "a0_s: Input should be a finite number (got nan)"),
    ("1e400", "a0_s: Input should be a finite number (got inf: .inf, or a number past the "
              "largest float, 1.8e308)"),
    ('"1.0"', "a0_s: Input should be a valid number (got '1.0': quoted, a number is text; "
              "write 1.0, unquoted)"),
])
def test_a_bad_coefficient_is_named_at_its_own_line(tmp_path, value, said):
    # the key's line, not cost:'s (two lines up in a profile calibrate writes)
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "a0_s:" in t)
    assert text.splitlines()[line - 1].lstrip().startswith("coefficients:")
    (tmp_path / "p.yaml").write_text(re.sub(r"a0_s: [^,}]+", f"a0_s: {value}", text))
    with pytest.raises(InputError, match=rf"^{re.escape(str(tmp_path / 'p.yaml'))}:{line}: "
                                         rf"cost\.coefficients\.{re.escape(said)}$"):
        load_profile(tmp_path / "p.yaml")
    # a rate of 0 (a step priced at infinity) or below says what a rate may be
    for rate in ("0", "-2.0"):
        (tmp_path / "p.yaml").write_text(re.sub(r"f_eff_flops_per_s: [^,}]+",
                                                f"f_eff_flops_per_s: {rate}", text))
        with pytest.raises(InputError, match=rf":{line}: cost\.coefficients\.f_eff_flops_per_s: "
                                             rf"a rate: it must be >= 1 per second \(got "
                                             rf"{float(rate):g}\)$"):
            load_profile(tmp_path / "p.yaml")
    # a rate below 1 byte or FLOP per second likewise (1e-300 would price a step at 1e308 s)
    (tmp_path / "p.yaml").write_text(re.sub(r"w_attn_bytes_per_s: [^,}]+",
                                            "w_attn_bytes_per_s: 1e-300", text))
    at = next(i for i, t in enumerate(text.splitlines(), 1) if "w_attn_bytes_per_s" in t)
    with pytest.raises(InputError, match=rf":{at}: cost\.coefficients\.w_attn_bytes_per_s: "
                                         r"a rate: it must be >= 1 per second \(got 1e-300\)$"):
        load_profile(tmp_path / "p.yaml")
    # a re-read rate below the first-read rate (a read from cache slower than from memory)
    (tmp_path / "p.yaml").write_text(re.sub(r"w_attn_bytes_per_s: [^,}]+",
                                            "w_attn_bytes_per_s: 1e7, w_reread_bytes_per_s: 1",
                                            text))
    with pytest.raises(InputError, match=rf":{at}: cost\.coefficients\.w_reread_bytes_per_s: "
                                         r"a re-read rate: it must be >= w_attn_bytes_per_s "
                                         r"\(1e\+07; a read from cache is never slower\) and "
                                         r"<= 100 x it \(a re-read all but free\), got 1$"):
        load_profile(tmp_path / "p.yaml")
    # a rate past MAX_EFFICIENCY x its device peak (memory_bandwidth 1e10 here), or a
    # re-read rate past MAX_REREAD_SPEEDUP x w_attn (1e7): either prices its term at ~0
    for edit, said in (("w_attn_bytes_per_s: 4.0001e10", "w_attn_bytes_per_s: 4.0001e+10 is "
                        "4 x the device's memory_bandwidth (1e+10); a rate is at most 4 x it"),
                       ("w_attn_bytes_per_s: 1e7, w_reread_bytes_per_s: 1.01e9",
                        "w_reread_bytes_per_s: a re-read rate: it must be >= w_attn_bytes_per_s "
                        "(1e+07; a read from cache is never slower) and <= 100 x it (a re-read "
                        "all but free), got 1.01e+09")):
        (tmp_path / "p.yaml").write_text(re.sub(r"w_attn_bytes_per_s: [^,}]+", edit, text))
        with pytest.raises(InputError, match=rf":{at}: cost\.coefficients\.{re.escape(said)}"):
            load_profile(tmp_path / "p.yaml")
    for edit in ("w_attn_bytes_per_s: 4e10", "w_attn_bytes_per_s: 1e7, w_reread_bytes_per_s: 1e9"):
        (tmp_path / "p.yaml").write_text(re.sub(r"w_attn_bytes_per_s: [^,}]+", edit, text))
        load_profile(tmp_path / "p.yaml")   # at the bounds: as the fit may leave them
    # a fixed cost of an hour or more per step (MAX_STEP_S) likewise, before any pricing
    (tmp_path / "p.yaml").write_text(re.sub(r"a0_s: [^,}]+", "a0_s: 1e300", text))
    with pytest.raises(InputError, match=rf":{line}: cost\.coefficients\.a0_s: seconds of one "
                                         r"step: it must be >= 0 and < 3600 \(got 1e\+300\)$"):
        load_profile(tmp_path / "p.yaml")


def test_profile_reads_exponent_numbers_as_the_scenario_loader_does(tmp_path):
    # YAML 1.1 (yaml.safe_load) leaves 25e9 a string; here it is a float, as in scenarios:
    # a number where a float goes, refused where an integer goes (engine.max_num_seqs: 2e2
    # is refused the same way), with its line.
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    raw = yaml.safe_load(text)
    mem, bw = raw["device"]["memory_bytes"], raw["device"]["memory_bandwidth"]
    p = tmp_path / "e.yaml"
    p.write_text(text.replace(f"memory_bandwidth: {bw}", "memory_bandwidth: 25e9"))
    assert load_profile(p).device.memory_bandwidth == 25e9
    p, line = _edited_profile(tmp_path, "e.yaml", f"memory_bytes: {mem}", "memory_bytes: 25e9")
    with pytest.raises(InputError, match=rf"^{re.escape(str(p))}:{line}: device\.memory_bytes: "
                                         r"Input should be a valid integer > 0 "
                                         r"\(got 2\.5e\+10: write 25000000000, "
                                         r"without a point or exponent\)$"):
        load_profile(p)
    p.write_text(text.replace(f"memory_bytes: {mem}", "memory_bytes: true"))
    with pytest.raises(InputError, match=r"device\.memory_bytes: Input should be a valid "
                                         r"integer > 0 \(got true\)$"):
        load_profile(p)
    n = len(text.splitlines()) + 1
    p.write_text(text + "name: again\n")     # a key given twice is refused, as in scenarios
    with pytest.raises(InputError, match=rf"^{re.escape(str(p))}:{n}: YAML syntax error: duplicate key "
                                         r"'name'$"):
        load_profile(p)


def test_a_renamed_profile_copy_is_shown_by_the_name_that_selects_it(tmp_path):
    from simulator.cost_model import PROFILES_DIR
    stem = "cpu-llama-tiny-56m-bfloat16"
    text = (PROFILES_DIR / f"{stem}.yaml").read_text()
    (tmp_path / "mine.yaml").write_text(text)
    prof = load_profile(tmp_path / "mine.yaml")
    assert prof.display_name == f"mine (name field: {stem})"
    assert load_profile(PROFILES_DIR / f"{stem}.yaml").display_name == stem
    save_profile(make_profile(), tmp_path / "p.yaml")   # named cpu-llama-test inside
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"}))
    assert cm.label.startswith("measured: profile p (name field: cpu-llama-test) (")


def test_an_unreadable_profile_folder_is_skipped(tmp_path, monkeypatch):
    import pathlib
    locked = tmp_path / "locked"
    monkeypatch.setenv("SERVESIM_PROFILES", str(locked))
    real = pathlib.Path.is_dir

    def is_dir(self):   # as for another user's ~/.servesim (root ignores modes)
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)
    monkeypatch.setattr(pathlib.Path, "is_dir", is_dir)
    assert "cpu-llama-tiny-56m-bfloat16" in cmod.list_profiles()


def test_a_profile_that_is_not_utf8_is_one_error_and_skipped_by_projections(tmp_path,
                                                                           monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    (store / "bin.yaml").write_bytes(b"name: \xff\xfe\n")
    monkeypatch.setenv("SERVESIM_PROFILES", str(store))
    with pytest.raises(InputError, match=r"bin\.yaml:1: not UTF-8 text \(byte 0xff at column 7; "
                                         r"save the file as UTF-8\)$"):
        load_profile("bin")
    # a catalog GPU looks through every profile for measured efficiencies: it skips this one
    cm = build_cost_model(scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"}))
    assert cm.label.startswith("projected: roofline")


def test_a_noisy_profile_is_flagged_before_a_run(tmp_path, capsys):
    """A measured profile whose held-out or replay MAPE is above calibrate's warning bounds
    (10%, 20%) gets one warning line on stderr from `servesim run`; a good one, none."""
    from simulator.cli import main
    from simulator.cost_model import profile_warning

    stats = lambda m: {"mape": m, "p90": 2 * m, "max": 3 * m, "n": 30}  # noqa: E731
    path = tmp_path / "cpu-llama-test.yaml"
    save_profile(make_profile(error={"heldout": stats(0.154), "replay": stats(0.05)}), path)
    sc = scenario(tmp_path, hardware={"profile": path.name})
    expected = ("servesim: warning: profile cpu-llama-test: held-out MAPE 15.4% (> 10%) is "
                "high: step times were noisy (other work on the machine?); calibrate again "
                "on a quiet machine before trusting its predictions")
    assert profile_warning(build_cost_model(sc)) == expected
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(
        {"name": "t", "model": "llama-test", "hardware": {"profile": path.name},
         "workload": WORKLOAD}))
    assert main(["run", str(tmp_path / "t.yaml"), "--out", str(tmp_path / "out"),
                 "--quiet"]) == 0
    assert expected in capsys.readouterr().err.splitlines()

    save_profile(make_profile(error={"heldout": stats(0.10), "replay": stats(0.201)}), path)
    assert "replay MAPE 20.1% (> 20%)" in profile_warning(build_cost_model(sc))
    save_profile(make_profile(), path)                      # held-out 5%, no replay
    assert profile_warning(build_cost_model(sc)) is None
    assert profile_warning(build_cost_model(scenario(tmp_path))) is None   # inline step time


def test_a_profile_rewritten_in_place_is_read_again(tmp_path):
    # load_profile keeps parsed files by (path, mtime, size): a recalibration that
    # rewrites the file must be seen, and callers get their own copy.
    import os

    prof = make_profile()
    path = save_profile(prof, tmp_path / "cpu-llama-test.yaml")
    first = load_profile(path)
    first.cost.coefficients["a0_s"] = 123.0   # a caller's change stays its own
    assert load_profile(path).model_dump() == prof.model_dump()
    text = path.read_text().replace("cpu-llama-test", "cpu-llama-new")
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))   # mtime may not tick
    assert load_profile(path).name == "cpu-llama-new"
    path.write_text("name: [")
    with pytest.raises(InputError, match="cpu-llama-test.yaml:1"):
        load_profile(path)


def _edited_profile(tmp_path, name, old, new):
    """A saved test profile with ``old`` replaced by ``new``: (path, 1-based line of the
    key, the text before ``:`` in ``new``)."""
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    p = tmp_path / name
    p.write_text(text.replace(old, new))
    key = new.split(":")[0]
    return p, next(i for i, t in enumerate(p.read_text().splitlines(), 1) if key in t)


def test_a_profile_block_size_vllm_does_not_take_is_refused(tmp_path):
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    size = yaml.safe_load(text)["kv"]["block_size"]
    p, line = _edited_profile(tmp_path, "b.yaml", f"block_size: {size}", "block_size: 7")
    with pytest.raises(InputError, match=rf"^{re.escape(str(p))}:{line}: kv\.block_size: must "
                                         r"be 1, 8, 16, 32, 64 or 128, as vLLM's "
                                         r"--block-size \(got 7\)$"):
        load_profile(p)
    p.write_text(text.replace(f"block_size: {size}", "block_size: 128"))   # vLLM CPU's
    assert load_profile(p).kv.block_size == 128


def test_attention_path_costs_load_and_carry_to_projections(tmp_path, monkeypatch):
    # the optional roofline coefficients: a profile may hold them (and nothing else beyond
    # the six); a projection from a measured GPU profile carries them, as it carries a0_s
    monkeypatch.setattr(cmod, "PROFILES_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "local"))
    device = {"name": "a100-80gb", "kind": "gpu", "peak_flops": 312e12,
              "memory_bandwidth": 2.0e12, "memory_bytes": 81920 * 2**20}
    paths = {"prefill_step_s": 2e-3, "decode_step_s": 5e-4}
    p = make_profile(device=device, cost={"form": "roofline", "coefficients": {
        **COEF, **paths, "w_reread_bytes_per_s": 3e7}}, engine="vllm 0.32.0")
    assert load_profile(save_profile(p, tmp_path / "local" / "a.yaml")).cost.coefficients \
        == {**COEF, **paths, "w_reread_bytes_per_s": 3e7}
    cm = build_cost_model(scenario(model="llama-3.1-8b", hardware={"profile": "h100-sxm"}))
    assert {k: cm.profile.cost.coefficients[k] for k in paths} == paths
    # a re-read rate is the measured GPU's cache: not carried (re-reads priced as reads)
    assert "w_reread_bytes_per_s" not in cm.profile.cost.coefficients
    bad = tmp_path / "bad.yaml"
    save_profile(p, bad).write_text(bad.read_text().replace("prefill_step_s", "mixed_s"))
    with pytest.raises(InputError, match=r"cost\.coefficients: roofline needs exactly the "
                                         r"coefficients a0_s, .*, f_attn_flops_per_s \(and may "
                                         r"add prefill_step_s, decode_step_s, w_reread_bytes_per_s\); "
                                         r"unknown "
                                         r"mixed_s$"):
        load_profile(bad)


def test_idle_table_reads_linear_between_points_and_is_checked(tmp_path):
    # 0 at no idle; linear between (0, 0), (0.1 s, 2 ms), (1 s, 20 ms); 20 ms beyond
    idle = cmod.IdleInfo(gaps_s=[0.1, 1.0], extra_s=[0.002, 0.020], reference_s=0.03)
    assert [idle.seconds(g) for g in (0, 0.05, 0.1, 0.55, 1.0, 30.0)] == pytest.approx(
        [0, 0.001, 0.002, 0.011, 0.020, 0.020], abs=1e-12)
    assert idle.describe() == "+2 ms after 0.1 s, +20 ms after 1 s"
    path = save_profile(make_profile(idle=idle.model_dump()), tmp_path / "p.yaml")
    cm = build_cost_model(scenario(tmp_path, hardware={"profile": "p.yaml"}))
    assert (cm.wake_ns(0), cm.wake_ns(550_000_000), cm.wake_ns(10**10)) == \
        (0, 11_000_000, 20_000_000)
    assert cm.label.endswith("; the first step after idle pays +20 ms after 1 s (profile "
                             "idle)")
    # the timing check's scaled model scales the wake-up as its steps
    from calibration.timing_replay import ScaledCost
    assert ScaledCost(cm, 1.1).wake_ns(550_000_000) == 12_100_000
    # a profile without the table: no wake-up cost
    save_profile(make_profile(), tmp_path / "p2.yaml")
    assert build_cost_model(scenario(tmp_path, hardware={"profile": "p2.yaml"})).wake_ns(
        10**9) == 0
    text = path.read_text()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "gaps_s" in t)
    path.write_text(text.replace("gaps_s: [0.1, 1.0]", "gaps_s: [1.0, 0.1]"))
    with pytest.raises(InputError, match=rf"p\.yaml:{line}: idle\.gaps_s: ascending seconds "
                                         rf"> 0 and <= 86400 \(got \[1\.0, 0\.1\]\)$"):
        load_profile(path)
    # finite bounds: an extra is a step time (< MAX_STEP_S), a gap at most a day
    for bad, key, want in (({"gaps_s": [0.1], "extra_s": [1e300]}, "extra_s",
                            "seconds >= 0 and < 3600"),
                           ({"gaps_s": [0.1, 1e300], "extra_s": [0.1, 0.2]}, "gaps_s",
                            "ascending seconds > 0 and <= 86400"),
                           ({"gaps_s": [0.1], "extra_s": [0.1], "reference_s": 3600}, "reference_s",
                            "seconds > 0 and < 3600 \\(a step's time; got 3600\\)"),
                           ({"gaps_s": [0.1], "extra_s": [0.1], "reference_s": 0}, "reference_s",
                            "seconds > 0 and < 3600 \\(a step's time; got 0\\)")):
        with pytest.raises(ValueError, match=rf"{key}[\s\S]*{want}|{want}"):
            make_profile(idle=bad)


def test_a_bad_model_shape_in_a_profile_names_model_shape_once(tmp_path):
    text = save_profile(make_profile(), tmp_path / "p.yaml").read_text()
    (tmp_path / "p.yaml").write_text(re.sub(r"hidden_size: \d+", "hidden_size: -512", text))
    with pytest.raises(InputError) as e:
        load_profile(tmp_path / "p.yaml")
    assert str(e.value).endswith(": model.shape: hidden_size must be a positive integer "
                                 "(got -512)")
    assert str(e.value).count("model.shape") == 1


def test_a_tensor_parallel_profiles_budget_holds_each_gpus_own_kv_heads(tmp_path):
    """A saved profile at tensor_parallel 4 of llama-test (2 KV heads): vLLM keeps
    max(1, 2 // 4) = 1 KV head per GPU (vllm/config/model.py get_num_kv_heads), so each GPU
    holds its kv_cache_memory_bytes (vLLM's figure: per GPU) in blocks of 2 layers × 2 (K, V)
    × 1 head × 16 head_dim × 2 bytes × 16 tokens = 2048 bytes; read group-wide, twice as
    many blocks. An older file's memory_budget_bytes, the group's, is 4 times it."""
    from simulator.catalog import load_hardware, load_model
    from simulator.cost_model import project_profile

    prof = project_profile(load_model("llama-test"), "bfloat16", load_hardware("h100-sxm"), 4,
                           max_num_batched_tokens=8192, max_num_seqs=1024)
    budget = prof.kv.kv_cache_memory_bytes   # one GPU's, as vLLM's
    want = budget // (2 * 2 * 1 * 16 * 2 * 16)
    assert prof.kv.num_gpu_blocks == want
    save_profile(prof, tmp_path / "p.yaml")
    direct = scenario(model="llama-test", hardware={"profile": "h100-sxm", "tensor_parallel": 4})
    saved = scenario(model="llama-test",
                     hardware={"profile": str(tmp_path / "p.yaml"), "tensor_parallel": 4})
    assert build_cost_model(direct).num_gpu_blocks == want
    assert build_cost_model(saved).num_gpu_blocks == want
    text = (tmp_path / "p.yaml").read_text()
    assert f"kv_cache_memory_bytes: {budget}," in text
    (tmp_path / "p.yaml").write_text(text.replace(f"kv_cache_memory_bytes: {budget},",
                                                  f"memory_budget_bytes: {budget * 4},"))
    assert load_profile(tmp_path / "p.yaml").kv.kv_cache_memory_bytes == budget
    assert build_cost_model(saved).num_gpu_blocks == want


def test_a_measured_kv_cache_says_gpu_memory_utilization_does_not_resize_it(tmp_path):
    """A profile's KV cache is the one measured (the simulator uses the profile's
    number): a scenario's gpu_memory_utilization other than the one it was measured at
    (recorded, else vLLM's default 0.92) leaves it as it is, and says so."""
    dev = {"name": "h100-sxm", "kind": "gpu", "peak_flops": 1e15, "memory_bandwidth": 3e12,
           "memory_bytes": 80 * 2**30}
    kv = {"bytes_per_token": 256, "block_size": 16, "kv_cache_memory_bytes": 2**31}
    save_profile(make_profile(device=dev, kv=kv), tmp_path / "g.yaml")
    save_profile(make_profile(device=dev, kv={**kv, "gpu_memory_utilization": 0.8}),
                 tmp_path / "g8.yaml")
    save_profile(make_profile(), tmp_path / "c.yaml")   # a CPU's: 2048 blocks of 128

    def cm(profile, **engine):
        return build_cost_model(scenario(tmp_path, hardware={"profile": profile},
                                         engine=engine))
    assert cm("g.yaml").setup_warning is None and cm("g8.yaml", gpu_memory_utilization=0.8
                                                     ).setup_warning is None
    for got, util, blocks, at in (
            (cm("g.yaml", gpu_memory_utilization=0.8), 0.8, 524288, ""),
            (cm("g8.yaml"), 0.92, 524288, ", at gpu_memory_utilization 0.8"),
            (cm("c.yaml", gpu_memory_utilization=0.5, block_size=128), 0.5, 2048, "")):
        assert got.num_gpu_blocks == blocks
        assert got.setup_warning.endswith(
            f"engine.gpu_memory_utilization {util:g} does not resize the KV cache measured in "
            f"profile {got.profile.display_name} ({blocks} blocks{at}): set "
            f"engine.num_gpu_blocks for another size, or calibrate at it")
    # a count set in the scenario is the cache: nothing measured to leave as it is
    assert cm("g.yaml", gpu_memory_utilization=0.8, num_gpu_blocks=1000).setup_warning is None
