"""Engine behaviour without a reference model: it executes the policy's plans unchanged,
reports the policy's prefix-cache figures, rejects bad input by field, samples as asked,
replays workloads on time, and sizes its KV cache as stated."""

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from calibration.engine import (EngineConfig, KVStore, LLMEngine, ModelConfig, SamplingParams,
                                kv_bytes_per_block)
from calibration.engine.replay import materialise
from calibration.engine.sampling import sample
from calibration.engine.tokenizer import ByteTokenizer, content_tokens
from simulator.errors import InputError
from simulator.policy import Request, RequestSpec, Scheduler, SchedulerConfig

CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
           eos_token_id=3)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def engine(**kw):
    knobs = dict(num_gpu_blocks=128, block_size=16, max_num_seqs=8,
                 max_num_batched_tokens=64, max_model_len=256)
    knobs.update(kw)
    return LLMEngine(CFG, knobs)


def ids(seed, n):
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("watermark,threshold,budget", [(0.0, 0, 48), (0.1, 0, 48),
                                                        (0.0, 20, 48), (0.0, 0, None)])
def test_engine_steps_equal_a_policy_only_run(watermark, threshold, budget):
    """The engine's steps are exactly the plans of a bare Scheduler on the same requests
    (with vLLM's watermark, long-prefill threshold and chunked prefill off too: the engine
    passes them to the one scheduler). ``budget`` None: chunked prefill off, a budget of
    max_model_len."""
    chunked = budget is not None
    budget = budget or 256
    prompts = [ids(i, n) for i, n in enumerate((70, 9, 33, 120, 16))]
    eng = engine(block_size=8, num_gpu_blocks=34, max_num_batched_tokens=budget,
                 watermark=watermark, long_prefill_token_threshold=threshold,
                 enable_chunked_prefill=chunked)
    for i, p in enumerate(prompts):
        eng.add_request(p, dict(temperature=0.0, max_tokens=12, ignore_eos=True),
                        request_id=i)
    while eng.has_unfinished_requests():
        eng.step()
        eng.scheduler.check_invariants()
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget,
                                      max_model_len=256, block_size=8, num_gpu_blocks=34,
                                      watermark=watermark,
                                      long_prefill_token_threshold=threshold,
                                      enable_chunked_prefill=chunked))
    for i, p in enumerate(prompts):
        sched.add_request(Request(request_id=i, prompt_token_ids=p, max_tokens=12))
    plans, chunks = [], set()
    while sched.has_unfinished_requests():
        plan = sched.schedule()
        plans.append(([(e.request_id, e.num_new_tokens, e.num_computed_before)
                       for e in plan.prefills], plan.num_decodes,
                      [r.request_id for r in plan.preempted]))
        chunks |= {e.num_new_tokens for e in plan.prefills}
        sched.update(plan)
    got = [(s.prefills, s.num_decodes, s.preempted) for s in eng.step_records]
    assert got == plans
    assert eng.stats == sched.stats
    # 33 usable blocks of 8 are too few for all five; int(0.1 × 34) = 3 blocks kept free at
    # admission leave the running room to grow here
    assert sched.stats.num_preemptions > 0 if not watermark else \
        sched.stats.num_preemptions == 0 and sched._watermark_blocks == 3
    # a chunk never passes the threshold; unchunked, the longest prompt runs whole
    assert max(chunks) == (threshold or (48 if chunked else 120))


def test_shared_prefix_batch_skips_exactly_the_cached_tokens():
    shared = ids(100, 48)                       # 3 full blocks of 16
    prompts = [shared + ids(101 + i, 10 + i) for i in range(4)]
    eng = engine(max_num_batched_tokens=256)
    eng.generate([prompts[0]], GREEDY)          # warms the cache
    eng.generate(prompts[1:], GREEDY)
    # Hand count: request 0 queries 58 tokens and hits nothing; 1..3 hit 48 each.
    assert eng.stats.prefix_queries == sum(len(p) for p in prompts)
    assert eng.stats.prefix_hits == 3 * 48
    assert [eng.records[i].cached_tokens for i in range(4)] == [0, 48, 48, 48]
    first = [s for s in eng.step_records if any(c[0] == 1 for c in s.prefills)][0]
    assert first.prefills == [(1, 11, 48), (2, 12, 48), (3, 13, 48)]
    assert first.num_scheduled_tokens == 11 + 12 + 13


@pytest.mark.parametrize("bad, field", [
    (dict(temperature=-1.0), "sampling.temperature"),
    (dict(top_p=0.0), "sampling.top_p"),
    (dict(top_p=1.5), "sampling.top_p"),
    (dict(top_k=-2), "sampling.top_k"),
    (dict(max_tokens=0), "sampling.max_tokens"),
    (dict(stop_token_ids=[500]), "sampling.stop_token_ids"),
    (dict(temprature=0.5), "sampling.temprature"),
    # refused: pydantic's lax mode would run them as 4, 4, 1, True and 0.5
    (dict(max_tokens="4"), "sampling.max_tokens: Input should be a valid integer (got '4')"),
    (dict(max_tokens=4.0), "sampling.max_tokens: Input should be a valid integer (got 4.0)"),
    (dict(max_tokens=True), "sampling.max_tokens: Input should be a valid integer, not a bool"),
    (dict(ignore_eos="yes"), "sampling.ignore_eos: Input should be a valid boolean"),
    (dict(temperature="0.5"), "sampling.temperature: Input should be a valid number"),
    (dict(temperature=float("nan")), "sampling.temperature: Input should be a finite number"),
    (dict(stop_token_ids=[3.0]), "sampling.stop_token_ids.0: Input should be a valid integer"),
    (dict(seed=2**64), "sampling.seed: a seed is from -2**63 to 2**64 - 1"),
])
def test_bad_sampling_values_name_the_field(bad, field):
    eng = engine()
    with pytest.raises(InputError) as e:
        eng.add_request(ids(0, 5), bad)
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_sampling_takes_numpy_numbers():
    import numpy as np
    from calibration.engine.sampling import SamplingParams
    p = SamplingParams(max_tokens=np.int64(4), temperature=np.float32(0.5),
                       ignore_eos=np.bool_(True), stop_token_ids=[np.int32(3)],
                       seed=np.uint64(2**64 - 1))
    assert (p.max_tokens, p.temperature, p.ignore_eos, p.stop_token_ids, p.seed) == \
        (4, 0.5, True, (3,), 2**64 - 1)
    assert all(type(v) in (int, float, bool, tuple) for v in p.model_dump().values())


def test_a_seed_torch_cannot_take_leaves_the_engine_serving():
    # a request whose generator fails is refused before it is scheduled
    eng = engine()
    with pytest.raises(InputError, match=r"^sampling\.seed"):
        eng.add_request(ids(1, 5), {"seed": 2**70})
    assert not eng.has_unfinished_requests()
    out, = eng.generate([ids(1, 5)], {"seed": -1, "max_tokens": 3})
    assert len(out.output_token_ids) == 3


@pytest.mark.parametrize("call, said", [
    (lambda eng: LLMEngine(123, {"num_gpu_blocks": 64}),
     "model: an HF config mapping, a model folder's path or a Transformer (got int)"),
    (lambda eng: LLMEngine(CFG, [("block_size", 16)]),
     "config: an EngineConfig or a mapping of its fields (got list)"),
    (lambda eng: eng.generate(None), "prompts: a text, a list of token ids, or a list of "
                                     "those (got NoneType)"),
    (lambda eng: eng.generate(5), "prompts: a text, a list of token ids, or a list of those "
                                  "(got int)"),
    (lambda eng: eng.add_request(ids(1, 5), "greedy"),
     "sampling: a SamplingParams or a mapping of its fields (got str)"),
    (lambda eng: eng.generate([ids(1, 5)], [4]),
     "sampling: a SamplingParams or a mapping of its fields (got int)"),
    (lambda eng: eng.add_request(ids(1, 5), GREEDY, request_id=[1]),
     "request_id: a hashable id such as a str or an int, got list"),
    (lambda eng: eng.add_request(ids(1, 5), GREEDY, arrival_ns="a"),
     "arrival_ns: an integer >= 0 (ns on the run's clock), got 'a'"),
    (lambda eng: eng.add_request(ids(1, 5), GREEDY, arrival_ns=-5),
     "arrival_ns: an integer >= 0 (ns on the run's clock), got -5"),
    (lambda eng: eng.add_request("a\ud800b", GREEDY),
     "prompt: character 1 ('\\ud800') is a lone surrogate, not text UTF-8 can encode"),
    (lambda eng: eng.add_request(b"abc", GREEDY),
     "prompt: expected text or a list of token ids (got bytes)"),
    (lambda eng: eng.generate({"a": 1}, GREEDY),
     "prompts: a text, a list of token ids, or a list of those (got dict)"),
    (lambda eng: eng.generate([ids(1, 3), [2.5]], GREEDY),
     "prompts[1]: prompt[0]: token ids are integers (got 2.5)"),
    (lambda eng: LLMEngine(CFG, dict(num_gpu_blocks=64, seed=2**70)),
     "engine.seed: a seed is from -2**63 to 2**64 - 1 (torch.Generator.manual_seed's "
     "range) (got 1180591620717411303424)"),
    (lambda eng: LLMEngine({**CFG, "rope_scaling": "x"}, dict(num_gpu_blocks=64)),
     "config.rope_scaling: a mapping (rope_type, factor, ...) or null, got 'x'"),
    (lambda eng: LLMEngine({**CFG, "rms_norm_eps": float("nan")}, dict(num_gpu_blocks=64)),
     "config.rms_norm_eps: a finite number > 0, got nan"),
    (lambda eng: LLMEngine({**CFG, "rope_theta": -1}, dict(num_gpu_blocks=64)),
     "config.rope_theta: a finite number > 0, got -1"),
    (lambda eng: LLMEngine({**CFG, "rope_theta": None}, dict(num_gpu_blocks=64)),
     "config.rope_theta: a finite number > 0, got None"),
    (lambda eng: LLMEngine({**CFG, "rms_norm_eps": None}, dict(num_gpu_blocks=64)),
     "config.rms_norm_eps: a finite number > 0, got None"),
    (lambda eng: LLMEngine({**CFG, "rope_parameters": {"rope_theta": None}},
                           dict(num_gpu_blocks=64)),
     "config.rope_parameters.rope_theta: a finite number > 0, got None"),
    (lambda eng: LLMEngine({**CFG, "model_type": ["llama"]}, dict(num_gpu_blocks=64)),
     "config.model_type: ['llama'] not supported (allowed: llama, qwen2, mistral)"),
    (lambda eng: LLMEngine({**CFG, "eos_token_id": 999}, dict(num_gpu_blocks=64)),
     "config.eos_token_id: a token id in [0, 128) or a list of them, got 999"),
    (lambda eng: LLMEngine({**CFG, "hidden_size": 30}, dict(num_gpu_blocks=64)),
     "config.hidden_size: 30 // num_attention_heads 4 gives head_dim 7, odd: not supported "
     "(rotary embeddings turn pairs of dimensions; give an even head_dim)"),
    (lambda eng: LLMEngine({**CFG, "head_dim": 7}, dict(num_gpu_blocks=64)),   # torch's error
     "config.head_dim: 7 not supported (rotary embeddings turn pairs of dimensions: an even "
     "head_dim)"),
    (lambda eng: eng.generate(__import__("numpy").array([], dtype="int64"), GREEDY),
     "prompt: empty"),   # one 1-D array is one prompt, empty or not
])
def test_bad_arguments_are_one_input_error(call, said):
    # each is one InputError naming the argument, not an error from inside the engine, a
    # model that runs (NaN logits, token 999 as EOS) or a string stored as a time
    eng = engine()
    with pytest.raises(InputError) as e:
        call(eng)
    assert str(e.value) == said
    assert not eng.has_unfinished_requests()


def test_generate_takes_one_prompt_of_numpy_token_ids():
    import numpy as np
    eng = engine()
    one, = eng.generate(np.array(ids(7, 20)), GREEDY)
    assert one.output_token_ids == engine().generate([ids(7, 20)], GREEDY)[0].output_token_ids


@pytest.mark.parametrize("kw", [dict(temperature=1e-39), dict(top_p=1e-50),
                                dict(temperature=0.7, top_p=1e-50, top_k=5)])
def test_a_tiny_temperature_or_top_p_samples_the_most_likely_token(kw):
    # a temperature of 1e-39 (logits / 1e-39 would overflow to NaN) and a top_p below
    # float32's least number (it would drop every token) still sample a token
    from calibration.engine.sampling import SAMPLING_EPS
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    assert sample(logits, [SamplingParams(**kw)] * 3, gens) == logits.argmax(-1).tolist()
    assert SamplingParams(temperature=SAMPLING_EPS / 2).greedy   # as vLLM's _SAMPLING_EPS
    assert not SamplingParams(temperature=SAMPLING_EPS).greedy
    eng = engine()
    out = eng.generate([ids(1, 5), ids(2, 5)], [GREEDY, dict(max_tokens=6, ignore_eos=True,
                                                             **kw)])
    assert out[1].output_token_ids == engine().generate([ids(2, 5)], GREEDY)[0].output_token_ids
    assert not eng.has_unfinished_requests()


def test_an_allocation_the_host_refuses_names_what_asked_for_it():
    for model, knobs, what in ((CFG, dict(num_gpu_blocks=10**12), "engine.num_gpu_blocks"),
                               (CFG, dict(num_gpu_blocks=2**62), "engine.num_gpu_blocks"),
                               (CFG, dict(num_gpu_blocks=2**63), "engine.num_gpu_blocks"),
                               (CFG, dict(kv_cache_memory_bytes=2**80),
                                "engine.kv_cache_memory_bytes"),
                               ({**CFG, "vocab_size": 10**12}, dict(num_gpu_blocks=64),
                                "model")):
        with pytest.raises(InputError) as e:
            LLMEngine(model, knobs)
        assert str(e.value).startswith(f"{what}: needs more memory than the device gives (")


def test_generate_takes_a_list_of_arrays_or_tensors_as_prompts():
    import numpy as np
    want = [o.output_token_ids for o in engine().generate([ids(1, 7), ids(2, 5)], GREEDY)]
    for prompts in ([np.array(ids(1, 7)), np.array(ids(2, 5))],
                    [torch.tensor(ids(1, 7)), torch.tensor(ids(2, 5))]):
        got = [o.output_token_ids for o in engine().generate(prompts, GREEDY)]
        assert got == want
    two = np.array([ids(1, 7), ids(3, 7)])   # a 2-D array: two prompts
    assert len(engine().generate(two, GREEDY)) == 2


def test_invalid_requests_are_rejected_and_others_keep_running():
    alone = engine().generate([ids(7, 20)], GREEDY)[0].output_token_ids
    eng = engine()
    good = eng.add_request(ids(7, 20), GREEDY)
    eng.step()                                   # good is running now
    with pytest.raises(InputError) as e:   # a prompt of max_model_len tokens leaves no room
        eng.add_request(ids(8, 256), GREEDY)
    assert str(e.value) == ("prompt: 256 tokens; max_model_len 256 takes prompts of at most "
                            "255 (one position is the first output token's; request 1)")
    with pytest.raises(InputError, match=r"^prompt\[2\]: token id 999"):
        eng.add_request([1, 2, 999], GREEDY)
    with pytest.raises(InputError, match=r"^prompt: empty"):
        eng.add_request([], GREEDY)
    # a float would run as another token (int(1.5) is 1); numpy and torch integers are ids
    for bad, i in (([1.5, 2], 0), ([1, 2.0], 1), ([1, True], 1), ([1, "2"], 1),
                   # torch's __index__ reads these as 5 and 1: rows of ids are no ids
                   ([1, torch.tensor([5])], 1), ([torch.tensor([[5]])], 0),
                   ([1, torch.tensor(True)], 1),
                   ([1, torch.tensor(5, device="meta")], 1)):   # holds no value at all
        with pytest.raises(InputError, match=rf"^prompt\[{i}\]: token ids are integers"):
            eng.add_request(bad, GREEDY)
    with pytest.raises(InputError, match=r"^prompt: expected text or a list of token ids"):
        eng.add_request(3, GREEDY)
    with pytest.raises(InputError, match=r"^sampling\.top_p"):
        eng.add_request(ids(9, 4), dict(top_p=2.0))
    with pytest.raises(InputError, match=r"^prompt: byte 0xc3"):
        eng.add_request("é", GREEDY)
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert [o.request_id for o in outs] == [good]
    assert outs[0].output_token_ids == alone
    assert eng.stats.num_rejected == 1
    assert [r.finish_reason for r in eng.records.values()] == ["length", "rejected"]
    eng.add_request(ids(8, 255), GREEDY)   # the longest prompt max_model_len takes


def test_an_output_past_max_model_len_is_cut_and_its_record_says_so():
    long, short = engine().generate([ids(1, 250), ids(2, 20)],
                                    dict(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert (len(long.output_token_ids), long.finish_reason, long.record.capped) == \
        (6, "length", True)   # 250 + 10 > max_model_len 256: cut to 6
    assert (len(short.output_token_ids), short.record.capped) == (10, False)


def test_generate_rejects_all_when_one_prompt_is_bad():
    eng = engine()
    with pytest.raises(InputError):
        eng.generate([ids(1, 5), ids(2, 400)], GREEDY)
    assert not eng.has_unfinished_requests()


def test_bad_engine_and_model_config_name_the_key():
    with pytest.raises(InputError, match=r"^engine\.block_size"):
        LLMEngine(CFG, dict(num_gpu_blocks=8, block_size=0))
    # strict as a scenario's engine section: text is not a number, a bool not a count
    for key, value in (("max_num_seqs", "8"), ("max_num_seqs", True), ("block_size", 16.0),
                       ("enable_prefix_caching", 1)):
        with pytest.raises(InputError, match=rf"^engine\.{key}: .* \(got {value!r}\)$"):
            LLMEngine(CFG, {"num_gpu_blocks": 8, key: value})
    # NumPy's integers are integers here too, as in prompts and SamplingParams
    import numpy as np
    cfg = EngineConfig(num_gpu_blocks=np.int64(200), block_size=np.int32(16), seed=np.uint32(7))
    assert (cfg.num_gpu_blocks, cfg.block_size, cfg.seed) == (200, 16, 7)
    assert type(cfg.num_gpu_blocks) is int
    # an unknown key is named first, with the keys there are
    with pytest.raises(InputError) as e:
        LLMEngine(CFG, dict(num_gpu_blocks="8", max_num_seq=4))
    assert str(e.value) == ("engine.max_num_seq: unknown key (allowed: "
                            + ", ".join(EngineConfig.model_fields) + ")")
    assert "max_num_seqs, max_num_batched_tokens" in str(e.value)
    with pytest.raises(InputError, match=r"^sampling\.max_token: unknown key \(allowed: "
                                         r"max_tokens, temperature, "):
        SamplingParams(max_token=4)
    with pytest.raises(InputError, match=r"^engine\.kv_cache_memory_bytes: required"):
        LLMEngine(CFG, dict(max_model_len=64))
    with pytest.raises(InputError, match=r"^engine\.max_model_len: 1024 exceeds"):
        LLMEngine(CFG, dict(num_gpu_blocks=8, max_model_len=1024))
    with pytest.raises(InputError, match=r"^config\.hidden_size"):
        ModelConfig.from_hf({k: v for k, v in CFG.items() if k != "hidden_size"})
    with pytest.raises(InputError, match=r"^config\.rope_scaling\.rope_type"):
        ModelConfig.from_hf(dict(CFG, rope_scaling={"rope_type": "yarn", "factor": 4.0}))


@pytest.mark.parametrize("change, message", [
    # each is refused: the model would differ from the one HF builds from the same config
    ({"hidden_act": "gelu"}, "config.hidden_act: 'gelu' not supported (the MLP is SwiGLU: "
                             "silu)"),
    ({"mlp_bias": True}, "config.mlp_bias: true not supported (the MLP has no bias)"),
    ({"tie_word_embeddings": "false"}, "config.tie_word_embeddings: true or false, got "
                                       "'false'"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8,
      "max_window_layers": 0}, "config.sliding_window: 8 not supported (full attention only; "
                               "set it to null or use_sliding_window to false)"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     "config.layer_types: ['full_attention', 'sliding_attention'] not supported (full "
     "attention only; list full_attention only)"),
    ({"model_type": "mistral", "sliding_window": "128"}, "config.sliding_window: a positive "
                                                         "integer or null, got '128'"),
    # both thetas, disagreeing: refused (transformers 5 takes the inner one)
    ({"rope_theta": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
     "config.rope_parameters.rope_theta: 500000.0 disagrees with rope_theta 10000: give one"),
    ({"rope_theta": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": -5}},
     "config.rope_parameters.rope_theta: a finite number > 0, got -5"),
    ({"architectures": ["GPT2LMHeadModel"]}, "config.architectures: ['GPT2LMHeadModel'] does "
                                             "not run here: model_type llama is "
                                             "['LlamaForCausalLM']"),
    # refused at its key, not where torch meets it (TypeError, 'negative dimension')
    ({"num_key_value_heads": "2"}, "config.num_key_value_heads: a positive integer or null, "
                                   "got '2'"),
    ({"head_dim": -8}, "config.head_dim: a positive integer or null, got -8"),
    ({"hidden_size": True}, "config.hidden_size: required positive integer, got True"),
    # transformers 5 keeps theta in rope_parameters: -5 and 'abc' are refused there too
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}},
     "config.rope_parameters.rope_theta: a finite number > 0, got -5.0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}},
     "config.rope_parameters.rope_theta: a finite number > 0, got 'abc'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "config.rope_scaling.factor: a finite number > 0, got 0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "config.rope_scaling.high_freq_factor: 4.0 must be above low_freq_factor 4.0"),
])
def test_a_model_config_the_engine_would_run_otherwise_is_refused(change, message):
    with pytest.raises(InputError) as e:
        ModelConfig.from_hf(dict(CFG, **change))
    assert str(e.value).startswith(message)


def test_a_config_the_layers_run_as_hf_does_loads():
    # silu written out, a full-attention layer list, and a window past every position
    cfg = ModelConfig.from_hf(dict(CFG, hidden_act="silu", mlp_bias=False,
                                   architectures=["LlamaForCausalLM"],
                                   layer_types=["full_attention"] * 2, num_key_value_heads=None,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert cfg.rope_theta == 5e5 and cfg.num_key_value_heads == CFG["num_attention_heads"]
    assert ModelConfig.from_hf(dict(CFG, model_type="qwen2", use_sliding_window=True,
                                    sliding_window=8, max_window_layers=2)).model_type == "qwen2"
    assert ModelConfig.from_hf(dict(CFG, rope_theta=1e4, rope_parameters={
        "rope_type": "default", "rope_theta": 10000})).rope_theta == 1e4   # the same theta


def test_kv_blocks_from_memory_budget_and_report(caplog):
    # 16 tokens x (K+V) x 2 layers x 2 kv heads x 8 dims x 4 bytes = 4096 bytes per block.
    assert kv_bytes_per_block(2, 16, 2, 8, torch.float32) == 4096
    with caplog.at_level(logging.INFO, logger="servesim.engine"):
        eng = LLMEngine(CFG, dict(kv_cache_memory_bytes=4096 * 100 + 5, max_model_len=320))
    assert eng.num_gpu_blocks == 100
    assert eng.kv_store.nbytes == 4096 * 100
    assert eng.max_concurrency == pytest.approx(100 / 20)
    assert "1,600 tokens" in caplog.text and "5.00x" in caplog.text


def test_kv_store_slot_mapping_layout():
    store = KVStore(1, num_blocks=4, block_size=2, num_kv_heads=2, head_dim=3)
    k = torch.arange(12, dtype=torch.float32).view(2, 2, 3)
    store.write(0, torch.tensor([5, 2]), k, -k)          # slot 5 = block 2 offset 1
    key = store.key(0)
    assert key.shape == (4, 2, 2, 3)
    assert torch.equal(key[2, 1], k[0]) and torch.equal(key[1, 0], k[1])
    assert torch.equal(store.value(0)[2, 1], -k[0])
    assert key[0].abs().sum() == 0                        # null block untouched


def test_generate_leaves_other_requests_outputs_to_step():
    # a request added before generate() may finish inside its loop: its output is handed
    # back by the next step()
    eng = engine()
    a = eng.add_request(ids(1, 5), GREEDY.model_copy(update={"max_tokens": 2}))
    mine = eng.generate([ids(2, 9)], GREEDY)
    assert [len(o.output_token_ids) for o in mine] == [6]
    assert eng.has_unfinished_requests()   # until step() hands A's output back
    held = eng.step()
    assert [o.request_id for o in held] == [a] and len(held[0].output_token_ids) == 2
    assert held[0].output_token_ids == engine().generate(
        [ids(1, 5)], GREEDY.model_copy(update={"max_tokens": 2}))[0].output_token_ids
    assert not eng.has_unfinished_requests() and eng.step() == []


def test_an_engine_whose_step_failed_says_so_rather_than_stall(monkeypatch):
    # after a sampler error (NaN probabilities) every step raises, rather than returning []
    # forever while has_unfinished_requests() stays true
    eng = engine()
    eng.add_request(ids(1, 5), GREEDY)
    monkeypatch.setattr(eng, "_execute", lambda entries: (_ for _ in ()).throw(
        RuntimeError("probability tensor contains either inf, nan or element < 0")))
    with pytest.raises(RuntimeError, match="probability tensor"):
        eng.step()
    monkeypatch.undo()
    for call in (eng.step, lambda: eng.generate([ids(2, 5)], GREEDY)):
        with pytest.raises(RuntimeError, match=r"^engine: an earlier step failed \(RuntimeError: "
                                               r"probability tensor .*\); its requests cannot "
                                               r"go on: build a new LLMEngine$"):
            call()


def test_stop_token_and_eos():
    eng = engine()
    free = eng.generate([ids(3, 12)], SamplingParams(temperature=0.0, max_tokens=8,
                                                      ignore_eos=True))[0].output_token_ids
    stop = free[2]
    cut = free.index(stop) + 1
    out = engine().generate([ids(3, 12)], SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop]))[0]
    assert out.output_token_ids == free[:cut] and out.finish_reason == "stop"
    # The config's eos_token_id (3) ends a request unless ignore_eos: the first prompt
    # whose free greedy run emits 3 stops right after it without ignore_eos.
    eng = engine()
    req = eng.add_request(ids(3, 12), dict(temperature=0.0))
    assert [r for r in eng.scheduler.waiting if r.request_id == req][0].eos_token_id == 3
    for seed in range(3, 30):   # 40 greedy tokens of 128: 3 comes up within a few prompts
        free = engine().generate([ids(seed, 12)], SamplingParams(
            temperature=0.0, max_tokens=40, ignore_eos=True))[0].output_token_ids
        if 3 in free[:-1]:
            break
    else:
        pytest.fail("no prompt emitted token 3")
    out = engine().generate([ids(seed, 12)], SamplingParams(temperature=0.0,
                                                             max_tokens=40))[0]
    assert out.output_token_ids == free[:free.index(3) + 1] and out.finish_reason == "stop"


def test_a_stop_token_that_is_also_the_last_allowed_one_finishes_as_stop():
    # vLLM's check_stop tests the stop tokens before max_tokens / max_model_len: a request
    # whose last allowed token is a stop token finishes "stop" there, and here too
    free = engine().generate([ids(3, 12)], SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True))[0].output_token_ids
    k = next(i for i, t in enumerate(free) if t not in free[:i] and i >= 1)
    for n in (k + 1, 1):   # the stop token at the last decode, and as the first token
        out = engine().generate([ids(3, 12)], SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True, stop_token_ids=[free[n - 1]]))[0]
        assert out.output_token_ids == free[:n] and out.finish_reason == "stop"
    out = engine().generate([ids(3, 12)], SamplingParams(
        temperature=0.0, max_tokens=k + 1, ignore_eos=True))[0]
    assert out.output_token_ids == free[:k + 1] and out.finish_reason == "length"


def test_max_tokens_none_generates_up_to_max_model_len():
    # vLLM SamplingParams(max_tokens=None): max_model_len − the prompt's length
    eng = LLMEngine(CFG, dict(num_gpu_blocks=64, max_model_len=40))
    out = eng.generate([ids(3, 12)], SamplingParams(temperature=0.0, max_tokens=None,
                                                     ignore_eos=True))[0]
    assert len(out.output_token_ids) == 40 - 12 and out.finish_reason == "length"
    assert out.record.capped == 0


def test_seeded_sampling_is_reproducible():
    p = ids(4, 10)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=123, max_tokens=12,
                            ignore_eos=True)
    a = engine().generate([p], params)[0].output_token_ids
    b = engine().generate([p, ids(5, 30)], [params, GREEDY])[0].output_token_ids
    c = engine().generate([p], params.model_copy(update={"seed": 124}))[0].output_token_ids
    assert a == b and a != c
    top1 = engine().generate([p], dict(temperature=1.0, top_k=1, max_tokens=6,
                                       ignore_eos=True))[0].output_token_ids
    assert top1 == engine().generate([p], GREEDY)[0].output_token_ids


def test_top_k_and_top_p_filters():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(400, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(400)]
    for params, allowed in ((SamplingParams(top_p=0.7), {0, 1}),
                            (SamplingParams(top_p=0.85), {0, 1, 2}),
                            (SamplingParams(top_k=2), {0, 1}),
                            (SamplingParams(top_p=0.2), {0})):
        got = sample(logits, [params] * 400, gens)
        assert set(got) == allowed
    # Unfiltered, token 0 is drawn about half of the time (binomial sd 0.025).
    got = sample(logits, [SamplingParams()] * 400, gens)
    assert abs(got.count(0) / 400 - 0.5) < 0.1


def test_replay_arrivals_followups_and_answer_reuse():
    bs = 16
    specs = [
        RequestSpec("a", 0, (("sys", 32), ("q", 8)), max_tokens=20),
        RequestSpec("b", 30_000_000, (("sys", 32), ("r", 5)), max_tokens=4),
        # Turn 2 of "a": its prompt is turn 1 (prompt + answer) and a new question.
        RequestSpec("a2", 0, (("sys", 32), ("q", 8), (("out", "a"), 20), ("q2", 6)),
                    max_tokens=3, after="a", think_time_ns=5_000_000),
        RequestSpec("long", 0, (("x", 300),), max_tokens=2),
    ]
    eng = engine(block_size=bs)
    res = eng.replay(specs)
    rec = {r.request_id: r for r in res.records}
    assert rec["long"].finish_reason == "rejected"
    assert rec["a"].output_tokens == 20 and rec["b"].output_tokens == 4
    assert rec["b"].arrival_ns == 30_000_000 and rec["b"].first_scheduled_ns >= 30_000_000
    assert rec["a2"].arrival_ns == rec["a"].finish_ns + 5_000_000
    assert rec["a2"].first_scheduled_ns >= rec["a2"].arrival_ns
    for r in (rec["a"], rec["b"], rec["a2"]):
        assert r.first_token_ns == r.token_times_ns[0] and r.finish_ns == r.token_times_ns[-1]
        assert r.token_times_ns == sorted(r.token_times_ns)
        assert len(r.token_times_ns) == r.output_tokens
    # b shares 2 full blocks of "sys"; a2 reuses turn 1's prompt and 19 computed answer
    # tokens: floor((40 + 19) / 16) = 3 blocks = 48 tokens.
    assert rec["b"].cached_tokens == 32
    assert rec["a2"].cached_tokens == 48
    assert res.stats.prefix_hits == 32 + 48
    # a2's prompt holds a's real answer where it quotes it.
    a_out = eng.records["a"]
    toks = materialise(specs[2], {("out", "a"): [9] * 20}, 128)
    assert toks[40:60] == [9] * 20 and toks[:32] == content_tokens("sys", 32, 128)
    assert a_out.output_tokens == 20
    # An answer shorter than the segment quoting it is continued by the answer's stream.
    short = materialise(specs[2], {("out", "a"): [9] * 12}, 128)
    assert short[40:60] == [9] * 12 + content_tokens(("out", "a"), 20, 128)[12:]


def test_content_tokens_are_prefix_consistent_and_not_salted():
    long = content_tokens(("conv", 3), 500, 1000)
    assert content_tokens(("conv", 3), 37, 1000) == long[:37]
    assert all(0 <= t < 1000 for t in long) and len(set(long)) > 300
    assert content_tokens(("conv", 4), 500, 1000) != long
    # Same tokens in another process with another hash salt.
    code = ("from calibration.engine.tokenizer import content_tokens;"
            "print(content_tokens(('conv', 3), 500, 1000))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert out.stdout.strip() == str(long)


def test_byte_tokenizer_roundtrip_and_text_prompts():
    tok = ByteTokenizer(128)
    assert tok.decode(tok.encode("hi there")) == "hi there"
    out = engine().generate(["hi there"], GREEDY)[0]
    assert out.prompt_token_ids == list(b"hi there")
    assert len(out.output_token_ids) == 6


def test_hf_tokenizer_from_model_dir(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from calibration.engine import random_model, save_pretrained
    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", "foo"])}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    save_pretrained(random_model(CFG), tmp_path, tokenizer_json=tk.to_str())
    eng = LLMEngine(tmp_path, dict(num_gpu_blocks=16, max_model_len=64))
    out = eng.generate(["hello world foo bar"], GREEDY)[0]
    assert out.prompt_token_ids == [1, 2, 3, 0]


def test_generation_config_eos_ids_stop_requests_as_in_vllm(tmp_path):
    # Llama-3-Instruct's <|eot_id|> is only in generation_config.json: vLLM stops on it
    import json
    from calibration.engine import random_model, save_pretrained
    knobs = dict(num_gpu_blocks=32, max_model_len=128)
    save_pretrained(random_model(dict(CFG, eos_token_id=None)), tmp_path)
    free = LLMEngine(tmp_path, knobs).generate([ids(3, 12)], GREEDY)[0].output_token_ids
    stop = free[2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    out = LLMEngine(tmp_path, knobs).generate(
        [ids(3, 12)], GREEDY.model_copy(update={"ignore_eos": False}))[0]
    assert out.output_token_ids == free[:free.index(stop) + 1] and out.finish_reason == "stop"
    assert LLMEngine(tmp_path, knobs).generate([ids(3, 12)], GREEDY)[0].output_token_ids == free
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 999}')
    with pytest.raises(InputError, match=r"generation_config\.json: eos_token_id: a token id in "
                                         r"\[0, 128\) or a list of them, got 999$"):
        LLMEngine(tmp_path, knobs)


def test_a_broken_model_folder_is_one_input_error_naming_the_file(tmp_path):
    from calibration.engine import random_model, save_pretrained
    knobs = dict(num_gpu_blocks=16, max_model_len=64)
    save_pretrained(random_model(CFG), tmp_path)
    weights, = tmp_path.glob("*.safetensors")
    good = weights.read_bytes()
    weights.write_bytes(good[:-64])   # cut short: the file is named
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value).startswith(f"{weights}: not a readable safetensors file (")
    weights.write_bytes(good)
    cfg = tmp_path / "config.json"
    cfg.write_text("")   # said empty, as the CLI's model check says
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == f"{cfg} is empty: an HF config holds a mapping of config keys"
    cfg.write_text('{"hidden_size": 32,\n "hidden_size": 64}')   # refused: json keeps the last
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == f"{cfg}:2: duplicate key 'hidden_size' (give each key once)"
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path / "nowhere", knobs)
    assert str(e.value) == (f"{tmp_path / 'nowhere'}: not found: give an HF model folder "
                            f"(config.json, *.safetensors)")
    cfg.write_text(__import__("json").dumps(CFG))
    (tmp_path / "tokenizer.json").write_text("{}")   # named, not tokenizers' bare Exception
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value).startswith(f"{tmp_path / 'tokenizer.json'}: not a tokenizer.json "
                                   f"the tokenizers library reads (")
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.json").mkdir()   # refused, not replaced by the byte tokenizer
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == (f"{tmp_path / 'tokenizer.json'}: not a file (a tokenizer.json is "
                            f"a file)")
    (tmp_path / "tokenizer.json").rmdir()
    (tmp_path / "zz.safetensors").mkdir()   # named, not an OSError
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == (f"{tmp_path / 'zz.safetensors'}: not a file (a weights file is a "
                            f"safetensors file)")
    (tmp_path / "zz.safetensors").rmdir()
    (tmp_path / "zz.safetensors").write_bytes(good)   # every tensor twice: refused, not merged
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert " is in " + weights.name + " too (each tensor belongs to one shard)" in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'zz.safetensors'}: tensor ")
    (tmp_path / "zz.safetensors").unlink()
    # a tensor the layers have no place for is refused (dropping an MLP bias moves logits
    # by 3.5)
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(weights))
    bias = "model.layers.0.mlp.down_proj.bias"
    save_file({**tensors, bias: torch.zeros(CFG["hidden_size"]),
               "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}, str(weights))
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == (f"{tmp_path}: unexpected tensor {bias!r} (1 in all): the engine's "
                            f"llama layers have no such parameter")   # the RoPE cache is not
    # a config whose attention_bias asks for biases the weights lack says so
    import json
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "attention_bias": True}))
    save_file(tensors, str(weights))
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value).startswith(f"{tmp_path}: missing tensor 'model.layers.0.self_attn.")
    assert str(e.value).endswith("missing in all) (the config's attention_bias: true asks for "
                                 "attention biases)")
    cfg_path.write_text(json.dumps(cfg))
    # one NaN weight is refused (greedy would pick token 0 at every step)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(weights))
    with pytest.raises(InputError) as e:
        LLMEngine(tmp_path, knobs)
    assert str(e.value) == f"{tmp_path}: tensor {name!r} holds NaN or infinite values"


def test_from_catalog_builds_the_catalog_shape():
    from simulator.catalog import load_model
    shape = load_model("llama-test")
    eng = LLMEngine.from_catalog("llama-test", dict(num_gpu_blocks=8, block_size=16,
                                                    max_model_len=64))
    cfg = eng.model_config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (
        shape.hidden_size, shape.num_hidden_layers, shape.num_key_value_heads)
    assert sum(p.numel() for p in eng.model.parameters()) == shape.num_params


def _packable() -> torch.dtype:
    """bfloat16 where oneDNN here prepacks it (AVX512 or AVX-NE-CONVERT), else float32."""
    from calibration.engine.model import prepack_supported

    return torch.bfloat16 if prepack_supported(torch.bfloat16) else torch.float32


def test_a_dtype_onednn_cannot_prepack_runs_unpacked_with_the_same_logits(monkeypatch):
    """On an AVX2-only CPU oneDNN refuses to prepack bfloat16 (RuntimeError): the model then
    keeps plain weights and computes what it computes unpacked."""
    from calibration.engine import model as M
    from calibration.engine.weights import random_model

    assert M.prepack_supported(torch.float32)
    assert not M.prepack_supported(torch.float64)   # oneDNN has no float64 path anywhere
    tm = random_model(dict(CFG), seed=0, dtype=torch.float32)
    monkeypatch.setitem(M._prepack_ok, torch.float32, False)   # as bfloat16 on AVX2
    tm.prepack(True)
    packed = [m.packed for m in tm.modules() if isinstance(m, M.Linear)]
    assert packed and all(p is None for p in packed) and tm._tied_head_packed is None
    h = torch.randn(3, CFG["hidden_size"], generator=torch.Generator().manual_seed(0))
    head = tm.lm_head.weight if tm.lm_head is not None else tm.embed_tokens.weight
    assert torch.equal(tm.compute_logits(h), F.linear(h, head).float())


def test_warm_up_runs_each_layer0_weight_once_per_row_count(monkeypatch):
    """Start-up builds oneDNN kernels: each of layer 0's four prepacked weights sees every
    row count 1..max_num_batched_tokens once (capped), the LM head 1..max_num_seqs; counts
    already built in the process are not run again; unpacked weights are left alone."""
    from calibration.engine import model as M
    from calibration.engine.weights import random_model

    cfg = dict(CFG, hidden_size=24, intermediate_size=40)  # a shape no other test warms
    tm = random_model(cfg, seed=0, dtype=_packable())
    seen = []
    orig = M.Linear.forward
    monkeypatch.setattr(M.Linear, "forward",
                        lambda self, x: seen.append((id(self), x.shape[0])) or orig(self, x))
    monkeypatch.setattr(M, "_warmed", {})
    layer = tm.layers[0]
    dense = [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
             layer.mlp.down_proj]

    assert tm.warm_up(6, 3) == (0, 0) and seen == []         # not prepacked: nothing built
    tm.prepack(True)
    assert tm.warm_up(6, 3) == (6, 3)
    for m in dense:
        assert [n for i, n in seen if i == id(m)] == [1, 2, 3, 4, 5, 6]
    assert [n for i, n in seen if i == id(tm.lm_head)] == [1, 2, 3]
    assert {i for i, _ in seen} == {id(m) for m in dense} | {id(tm.lm_head)}
    seen.clear()
    assert tm.warm_up(8, 2) == (8, 3)                        # only rows 7 and 8 are new
    assert [n for i, n in seen if i == id(dense[0])] == [7, 8] and len(seen) == 8
    seen.clear()
    # the row cap, whatever the machine's speed (no wall-clock bound here; see below)
    assert tm.warm_up(10**6, 10**6, max_seconds=float("inf"))[0] == M.WARMUP_MAX_ROWS
    assert [n for i, n in seen if i == id(dense[0])] == list(range(9, M.WARMUP_MAX_ROWS + 1))
    # the wall-clock bound, on a clock that ticks 1 s per reading: read once for the
    # deadline (3.5 s) and once before each row count, it stops before row 4
    import itertools
    import types

    monkeypatch.setattr(M, "_warmed", {})
    clock = itertools.count()
    monkeypatch.setattr(M, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    assert tm.warm_up(10, 10, max_seconds=3.5) == (3, 3)


def test_warm_up_meets_every_attention_call_a_prefill_step_makes(monkeypatch):
    """The CPU attention of a reduced-precision prefill builds kernels per query length and
    memory layout, so start-up runs layer 0's own attention code on 1..max_num_batched_tokens
    rows (attention padded to 32), on every padded shape of a chunk after cached tokens,
    and on every padded block count of the decodes: every ``scaled_dot_product_attention`` call (shapes, strides,
    dtype, flags, mask shape) that a served prefill then makes, from position 0, after a
    prefix hit, or as a later chunk of a long prompt, and every decode block count, was made
    during the warm-up."""
    from calibration.engine import attention as A
    from calibration.engine import model as M

    calls = []
    orig = A.F.scaled_dot_product_attention

    def record(q, k, v, **kw):
        mask = kw.get("attn_mask")
        calls.append((tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), v.stride(),
                      q.dtype, kw.get("is_causal", False), kw.get("enable_gqa", False),
                      None if mask is None else (tuple(mask.shape), mask.stride(), mask.dtype)))
        return orig(q, k, v, **kw)

    pieces = []
    orig_decode = A._decode_attention

    def record_decode(q, d, *a):
        pieces.append((d.blocks.numel(), q.dtype))
        return orig_decode(q, d, *a)

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", record)
    monkeypatch.setattr(A, "_decode_attention", record_decode)
    monkeypatch.setattr(M, "_warmed", {})
    monkeypatch.setattr(M, "_warmed_shapes", {})
    eng = engine(dtype=str(_packable()).removeprefix("torch."), max_num_batched_tokens=64)
    warmed = set(calls)
    # decodes: every block count padded to 16, up to max_num_seqs 8 x 256 / 16 blocks
    dtype = _packable()
    assert pieces == [(b, dtype) for b in range(16, 129, 16)]
    pieces.clear()
    causal = {c for c in warmed if c[8] is None}
    # chunks from position 0: every length 1..64 padded to 32 or 64 rows of queries and keys
    assert {(c[0][2], c[2][2]) for c in causal} == {(32, 32), (64, 64)}
    # chunks after cached tokens: query rows padded to 32 and 64, keys to 64 .. 256
    # (max_model_len); rows 64 need more than 33 keys, so all 4 x 2 shapes occur
    assert {(c[0][2], c[2][2]) for c in warmed - causal} == \
        {(q, k) for q in (32, 64) for k in (64, 128, 192, 256)}
    assert len(calls) == 64 + 8
    calls.clear()
    for n in (5, 37, 64):
        eng.add_request(ids(n, n), dict(temperature=0.0, max_tokens=1))
        eng.step()
    assert len(calls) == 3 * CFG["num_hidden_layers"] and set(calls) <= warmed
    calls.clear()
    eng.add_request(ids(37, 37)[:32] + ids(9, 13), dict(temperature=0.0, max_tokens=1))
    eng.add_request(ids(8, 150), dict(temperature=0.0, max_tokens=1))
    while eng.has_unfinished_requests():
        eng.step()
    masked = [c for c in calls if c[8] is not None]
    # the 13-token chunk after a 32-token prefix hit, then the 150-token prompt's chunks at
    # 64 and 128 computed tokens (the first chunk shares the budget of 64 with the 13)
    assert len(masked) >= 3 * CFG["num_hidden_layers"] and set(calls) <= warmed
    calls.clear()
    for n in (3, 40, 90, 130):   # decodes of 1..9 blocks each, side by side
        eng.add_request(ids(n, n), dict(temperature=0.0, max_tokens=20, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    assert pieces and set(pieces) <= {(b, dtype) for b in range(16, 129, 16)}


def test_packed_linear_pads_listed_row_counts_and_returns_the_rows_asked_for():
    """Two rows run as three (model.PAD_ROWS): same values as the unpadded product, two rows
    back; other counts are not padded."""
    from calibration.engine import model as M

    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 16, generator=g).to(_packable())
    packed = M.prepack_weight(w)
    for t in (1, 2, 3, 5):
        x = torch.randn(t, 16, generator=g).to(_packable())
        y = M.packed_linear(x, packed)
        ref = (x.float() @ w.float().T)
        assert y.shape == (t, 24)
        torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
    assert 2 in M.PAD_ROWS  # the padded path was exercised


def test_a_cuda_device_that_is_not_here_is_an_input_error(monkeypatch):
    """Not torch's bare AssertionError from inside the first tensor: one line naming
    engine.device and what to use instead."""
    from calibration.engine.engine import EngineConfig
    from simulator.errors import InputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^engine\.device: no CUDA device here \(torch built "
                                         r"for CPU, or no GPU visible\); use cpu \(got 'cuda'\)$"):
        EngineConfig(device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(InputError, match=r"^engine\.device: cuda:2: this machine has 2 CUDA "
                                         r"device\(s\), numbered from 0 \(got 'cuda:2'\)$"):
        EngineConfig(device="cuda:2")
    assert EngineConfig(device="cuda:1").device == "cuda:1"
