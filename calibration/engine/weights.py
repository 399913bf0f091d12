"""Build, initialise, save and load models in the HF layout.

A saved model is an HF-style directory: ``config.json`` plus ``model.safetensors`` with
HF parameter names (``model.layers.{i}.self_attn.q_proj.weight`` …, ``lm_head.weight``
unless tied), loadable by ``transformers`` ``AutoModelForCausalLM.from_pretrained``.
The engine fuses q/k/v and gate/up (see :mod:`.model`); this module splits and joins them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from simulator.errors import InputError

from .model import ModelConfig, Transformer, token_ids

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype) -> torch.dtype:
    """``torch.dtype`` from a dtype or its name.

    Raises:
        InputError: unknown name (allowed: float32, bfloat16, float16).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise InputError(f"dtype: {dtype!r} not supported (allowed: {', '.join(_DTYPES)})")
    return _DTYPES[dtype]


def random_model(config: dict | ModelConfig, seed: int = 0, std: float = 0.02,
                 dtype="float32", device="cpu") -> Transformer:
    """A model with seeded random weights.

    Linear weights, biases and embeddings ~ N(0, std) (HF ``initializer_range``, default
    0.02); norm weights ~ 1 + N(0, std), not exactly 1, so that a norm weight lost in
    saving or loading shows up in a reference comparison. On cpu the weights are drawn in
    float32 from ``torch.Generator().manual_seed(seed)`` and then cast, so a seed gives the
    same model for every dtype. On cuda they are drawn on the device from a cuda generator
    with the same seed (an 8B shape takes seconds instead of minutes on the host; the values
    differ from the cpu draw, which is harmless for timing).
    """
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_hf(config)
    dev = torch.device(device)
    with dev:                        # build (and default-init) where the weights will live
        model = Transformer(cfg)
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, device=dev) * std
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return model.to(dtype=parse_dtype(dtype)).eval()


#: Tensors of older checkpoints that the model computes itself (vLLM skips them too).
_ROPE_CACHE = re.compile(r"rotary_emb\.(inv_freq|cos_cached|sin_cached)$")


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's parameters under HF names (q/k/v and gate/up split), contiguous."""
    cfg = model.config
    out = {}
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for name, t in model.state_dict().items():
        if name.startswith("rotary."):
            continue
        hf = name if name.startswith("lm_head") else "model." + name
        if ".qkv_proj." in name:
            for part, piece in zip("qkv", t.split([q, kv, kv], dim=0)):
                out[hf.replace("qkv_proj", f"{part}_proj")] = piece.contiguous()
        elif ".gate_up_proj." in name:
            gate, up = t.chunk(2, dim=0)
            out[hf.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[hf.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[hf] = t.contiguous()
    return out


def load_hf_state_dict(model: Transformer, tensors: dict[str, torch.Tensor],
                       source: str = "weights") -> None:
    """Copy HF-named ``tensors`` into ``model`` (joining q/k/v and gate/up).

    Raises:
        InputError: a missing or unexpected tensor, a shape mismatch, or a NaN or infinite
            value, naming the HF parameter.
    """
    want = to_hf_state_dict(model)
    missing = [n for n in want if n not in tensors]
    if missing:
        why = ""
        if missing[0].endswith(".bias"):   # the config asks for biases the weights lack
            why = (" (Qwen2's q/k/v projections have biases)"
                   if model.config.model_type == "qwen2" else
                   " (the config's attention_bias: true asks for attention biases)")
        raise InputError(f"{source}: missing tensor {missing[0]!r} "
                         f"({len(missing)} missing in all){why}")
    # a tensor the layers have no place for (an MLP bias, say) is an error: a model run
    # without it is another model; RoPE caches some checkpoints keep are skipped, as vLLM's
    # loaders do
    extra = [n for n in tensors if n not in want and not _ROPE_CACHE.search(n)]
    if extra:
        raise InputError(f"{source}: unexpected tensor {extra[0]!r} ({len(extra)} in all): "
                         f"the engine's {model.config.model_type} layers have no such "
                         f"parameter")
    for name, t in want.items():
        if tuple(tensors[name].shape) != tuple(t.shape):
            raise InputError(f"{source}: tensor {name!r} has shape "
                             f"{tuple(tensors[name].shape)}, expected {tuple(t.shape)}")
        if not torch.isfinite(tensors[name]).all():   # greedy would pick token 0 throughout
            raise InputError(f"{source}: tensor {name!r} holds NaN or infinite values")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            hf = name if name.startswith("lm_head") else "model." + name
            if ".qkv_proj." in name:
                src = torch.cat([tensors[hf.replace("qkv_proj", f"{x}_proj")] for x in "qkv"])
            elif ".gate_up_proj." in name:
                src = torch.cat([tensors[hf.replace("gate_up_proj", "gate_proj")],
                                 tensors[hf.replace("gate_up_proj", "up_proj")]])
            else:
                src = tensors[hf]
            p.copy_(src.to(p.dtype))


def save_pretrained(model: Transformer, path, tokenizer_json: str | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (and ``tokenizer.json`` when given,
    as the JSON text of an HF ``tokenizers`` tokenizer) to directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf()
    cfg["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(to_hf_state_dict(model), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer_json is not None:
        (path / "tokenizer.json").write_text(tokenizer_json)
    return path


def read_config(path) -> ModelConfig:
    """:class:`ModelConfig` of an HF directory's ``config.json``.

    Raises:
        InputError: ``path`` not a folder, no readable ``config.json``, or a bad key in it
            (:func:`simulator.catalog.read_hf_config`'s one line).
    """
    from simulator.catalog import read_hf_config

    f = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise InputError(f"{path}: {'not a folder' if Path(path).exists() else 'not found'}: "
                         f"give an HF model folder (config.json, *.safetensors)")
    if not f.is_file():
        raise InputError(f"{path}: no config.json (an HF model folder holds one)")
    return ModelConfig.from_hf(read_hf_config(f), source=str(f))


def generation_eos(path, vocab_size: int) -> list[int]:
    """The ``eos_token_id`` of an HF folder's ``generation_config.json`` as a list (empty
    without the file or the key). vLLM stops on these too unless ``ignore_eos``
    (``SamplingParams.update_from_generation_config``): Llama-3-Instruct's
    ``<|eot_id|>`` is only there.

    Raises:
        InputError: an unreadable file, or ids that are not token ids of the vocabulary.
    """
    from simulator.catalog import read_hf_config

    f = Path(path) / "generation_config.json"
    if not f.is_file():
        return []
    return token_ids(read_hf_config(f).get("eos_token_id"), vocab_size, f"{f}: eos_token_id")


def load_pretrained(path, dtype="float32", device="cpu") -> Transformer:
    """Load an HF-style directory (``config.json`` + ``*.safetensors``, HF names).

    Raises:
        InputError: missing config or weights, a weights file safetensors cannot read or
            a tensor in two of them, a missing tensor or a shape mismatch.
    """
    path = Path(path)
    cfg = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputError(f"{path}: no *.safetensors weight files")
    tensors, home = {}, {}
    for f in files:
        if not f.is_file():
            raise InputError(f"{f}: not a file (a weights file is a safetensors file)")
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    if name in home:   # shards hold disjoint tensors; which one is meant?
                        raise InputError(f"{f}: tensor {name!r} is in {home[name].name} too "
                                         f"(each tensor belongs to one shard)")
                    home[name] = f
                    tensors[name] = fh.get_tensor(name)
        except SafetensorError as e:   # cut short, or another format under the name
            raise InputError(f"{f}: not a readable safetensors file ({e})") from None
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model = Transformer(cfg)
    load_hf_state_dict(model, tensors, source=str(path))
    return model.to(device=device, dtype=parse_dtype(dtype)).eval()
