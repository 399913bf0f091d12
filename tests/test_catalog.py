"""Catalog: model shapes (checked against HF transformers' own parameter counts), GPU specs,
loading from names, config.json files and inline mappings."""

import json

import pytest

from simulator.catalog import (list_hardware, list_models, load_hardware, load_model,
                               shape_from_dict)
from simulator.errors import InputError


def test_llama_3_1_8b_counts_by_hand():
    m = load_model("llama-3.1-8b")
    h, i, layers, heads, kv, d, v = 4096, 14336, 32, 32, 8, 128, 128256
    layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i + 2 * h
    assert m.num_nonembedding_params == layers * layer + h
    assert m.lm_head_params == v * h
    assert m.num_params == 8_030_261_248  # "8.03B" on the model card
    assert m.weight_bytes("bfloat16") == 2 * m.num_params
    assert m.kv_bytes_per_token("bfloat16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert m.kv_bytes_per_token("float32") == 262144


def test_tiny_matches_vllm_peer_model():
    # llama-tiny-56m: 56.4 M parameters, 8 KiB of KV per token in bf16.
    m = load_model("llama-tiny-56m")
    assert round(m.num_params / 1e6, 1) == 56.4
    assert m.kv_bytes_per_token("bfloat16") == 8 * 1024


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mistral-7b",
                                  "llama-tiny-56m", "llama-test"])
def test_param_count_equals_transformers(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = load_model(name)
    cfg = m.hf_config()
    arch = getattr(transformers, cfg["architectures"][0])
    conf_cls = transformers.AutoConfig.for_model(cfg["model_type"]).__class__
    with torch.device("meta"):  # shapes only, no memory
        model = arch(conf_cls(**cfg))
    assert sum(p.numel() for p in model.parameters()) == m.num_params


def test_tied_embeddings_counted_once():
    m = load_model({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                    "max_position_embeddings": 512, "tie_word_embeddings": True})
    untied = load_model("llama-test")
    assert m.num_params == untied.num_params - 256 * 64
    assert m.lm_head_params == 256 * 64  # the LM head matmul still runs
    assert m.head_dim == 16  # hidden / heads when absent


def test_hf_config_round_trip_and_config_file(tmp_path):
    m = load_model("llama-3.1-8b")
    (tmp_path / "my-llama").mkdir()
    (tmp_path / "my-llama" / "config.json").write_text(json.dumps(m.hf_config()))
    from_dir = load_model("my-llama", base_dir=tmp_path)
    from_file = load_model(tmp_path / "my-llama" / "config.json")
    assert from_dir.name == "my-llama"
    for shape in (from_dir, from_file, load_model(m.hf_config())):
        assert shape.shape_key() == m.shape_key()
        assert shape.rope_scaling == m.rope_scaling and shape.rope_theta == m.rope_theta
    assert shape_from_dict(m.to_dict()) == m


def test_config_saved_by_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=1,
                                   vocab_size=300, max_position_embeddings=1024)
    cfg.save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert (m.architecture, m.num_hidden_layers, m.num_key_value_heads, m.head_dim) == (
        "Qwen2", 3, 1, 16)
    assert m.attention_bias  # Qwen2 always biases q/k/v
    layer = 64 * 64 * 2 + 2 * 64 * 16 + (64 + 2 * 16) + 3 * 64 * 96 + 2 * 64
    assert m.num_params == 300 * 64 * 2 + 3 * layer + 64


def test_model_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match=r"^model: 'llama-9' is neither a catalog model "
                                         r"\(known: llama-3.1-8b, .*llama-test\)"):
        load_model("llama-9")
    with pytest.raises(InputError, match=r"^model: 'empty' is a folder without a config\.json "
                                         r"\(an HF model folder holds one; or give a catalog "
                                         r"model: llama-3\.1-8b, "):
        (tmp_path / "empty").mkdir()
        load_model("empty", tmp_path)
    with pytest.raises(InputError, match=r"^model.hidden: unknown key \(allowed: "):
        load_model({"hidden": 5})
    with pytest.raises(InputError, match=r"^model: missing key hidden_size$"):
        load_model({"num_hidden_layers": 2})
    with pytest.raises(InputError, match=r"architecture 'MixtralForCausalLM' is not supported"):
        load_model({"architectures": ["MixtralForCausalLM"]})
    with pytest.raises(InputError, match=r"num_hidden_layers must be a positive integer"):
        load_model({**load_model("llama-test").hf_config(), "num_hidden_layers": 0})
    # 10**400 layers are refused (they would overflow the cost model's floats)
    with pytest.raises(InputError, match=r"num_hidden_layers must be at most 1e\+12 \(got "
                                         r"an integer of 401 digits\)$"):
        load_model({**load_model("llama-test").hf_config(), "num_hidden_layers": 10**400})
    # nested past json's recursion limit: one error line
    (tmp_path / "deep.json").write_text("[" * 3000 + "]" * 3000)
    with pytest.raises(InputError, match=r"deep.json:1: not valid JSON: arrays or objects "
                                         r"nested too deeply$"):
        load_model("deep.json", tmp_path)


def test_hardware_catalog():
    assert list_hardware() == ["h100-sxm", "h200", "a100-80gb", "l40s", "l4"]
    h = load_hardware("h100-sxm")
    assert h.peak_flops("bfloat16") == 989.4e12 and h.peak_flops("float32") == 66.9e12
    assert h.memory_bandwidth == 3.35e12 and h.interconnect == "nvlink"
    for name in list_hardware():
        g = load_hardware(name)
        assert g.memory_bytes > 20 * 2**30 and g.price_per_gpu_hour > 0
        assert g.peak_bf16_flops > g.peak_fp32_flops
    with pytest.raises(InputError, match=r"unknown GPU 'v100' \(known: h100-sxm, h200"):
        load_hardware("v100")
    assert {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mistral-7b", "llama-tiny-56m",
            "llama-test"} <= set(list_models())


def test_yaml_model_config_reads_as_scenarios_do(tmp_path):
    # one YAML loader: 8e0 is a float (YAML 1.2), not the string YAML 1.1 makes of it,
    # and a key given twice is refused
    cfg = {**load_model("llama-test").hf_config(), "rope_scaling": None}
    lines = [f"{k}: {json.dumps(v)}" for k, v in cfg.items() if k != "rope_scaling"]
    lines.append("rope_scaling: {rope_type: linear, factor: 8e0}")
    (tmp_path / "m.yaml").write_text("\n".join(lines) + "\n")
    m = load_model("m.yaml", base_dir=tmp_path)
    assert m.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert isinstance(m.rope_scaling["factor"], float)
    (tmp_path / "m.yaml").write_text("\n".join(lines + ["hidden_size: 64"]) + "\n")
    with pytest.raises(InputError) as e:
        load_model("m.yaml", base_dir=tmp_path)
    # the repeat is the file's last line
    assert str(e.value) == (f"model: {tmp_path / 'm.yaml'}:{len(lines) + 1}: YAML syntax "
                            f"error: duplicate key 'hidden_size' (give each key once)")
    # worded as a scenario's YAML errors are: an unclosed list names where it started
    (tmp_path / "m.yaml").write_text("\n".join(lines + ["x: [1,", "  2"]) + "\n")
    with pytest.raises(InputError) as e:
        load_model("m.yaml", base_dir=tmp_path)
    assert str(e.value).startswith(f"model: {tmp_path / 'm.yaml'}:{len(lines) + 3}: YAML "
                                   f"syntax error: ")
    assert str(e.value).endswith(f"(in the flow sequence that starts at line {len(lines) + 1})")


def test_a_binary_config_json_is_refused_with_the_line_of_its_first_bad_byte(tmp_path):
    """Not the codec's own message ("'utf-8' codec can't decode byte ..."): where it is."""
    (tmp_path / "config.json").write_bytes(b'{"a": 1,\n"b": "x\xd0\x01"}\n')
    with pytest.raises(InputError) as e:
        load_model(str(tmp_path), base_dir=tmp_path)
    assert str(e.value) == (f"model: {tmp_path / 'config.json'}:2: not UTF-8 text (byte 0xd0 "
                            f"at column 8; save the file as UTF-8)")


@pytest.mark.parametrize("text", ["", " \n\n"])
def test_an_empty_config_json_is_said_to_be_empty(tmp_path, text):
    """Not json's own "Expecting value"."""
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(InputError) as e:
        load_model(str(tmp_path), base_dir=tmp_path)
    assert str(e.value) == (f"model: {tmp_path / 'config.json'} is empty: an HF config holds "
                            f"a mapping of config keys")


def test_a_key_given_twice_in_a_config_json_is_refused_with_its_line(tmp_path):
    cfg = load_model("llama-test").hf_config()
    # one key per line from line 2; the repeat is the last
    body = [f'"{k}": {json.dumps(v)}' for k, v in cfg.items()] + ['"num_hidden_layers": 3']
    (tmp_path / "config.json").write_text("{\n" + ",\n".join(body) + "\n}\n")
    with pytest.raises(InputError) as e:
        load_model(str(tmp_path), base_dir=tmp_path)
    assert str(e.value) == (f"model: {tmp_path / 'config.json'}:{len(body) + 1}: duplicate "
                            f"key 'num_hidden_layers' (give each key once)")
    # the same key in two different objects is no repeat
    from simulator.files import load_json

    assert load_json('{"a": {"k": 1}, "b": {"k": 2}, "k": 3}')["k"] == 3
