"""Catalogs of model shapes and GPU specs, shipped as data (``models.yaml``, ``hardware.yaml``).

A model is given by catalog name, by the path of a Hugging Face ``config.json`` (or a folder
holding one) or by an inline mapping of HF config keys; :func:`load_model` turns any of them
into a :class:`ModelShape`. :func:`load_hardware` returns a :class:`HardwareSpec`. Unknown
names raise :class:`simulator.errors.InputError` listing the known ones; a bad model spec
raises :class:`simulator.errors.KeyedInputError` naming the ``model`` key (inside an inline
mapping, the key at fault) so a scenario can give the key's line.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..errors import InputError, KeyedInputError
from ..files import (DuplicateKeyError, echo, is_regular_file, load_json, load_yaml,
                     name_too_long, scenario_path, utf8_problem, yaml_error_text)

_HERE = Path(__file__).resolve().parent

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# HF `architectures[0]` / `model_type` -> family. Only dense decoder-only families whose
# layer layout (GQA attention + gated SiLU MLP + RMSNorm) the parameter counts below assume.
_ARCH_BY_HF = {"LlamaForCausalLM": "Llama", "Qwen2ForCausalLM": "Qwen2",
               "MistralForCausalLM": "Mistral"}
_ARCH_BY_TYPE = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
_HF_BY_ARCH = {v: k for k, v in _ARCH_BY_HF.items()}
_TYPE_BY_ARCH = {v: k for k, v in _ARCH_BY_TYPE.items()}

#: Largest value of a model shape's integer (layers, sizes, vocabulary, positions).
MAX_SHAPE_INT = 10**12
_INT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
_SHAPE_KEYS = ("architecture",) + _INT_KEYS + (
    "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias", "rms_norm_eps")
# HF config keys accepted (and ignored) in an inline mapping besides the shape keys.
_INLINE_EXTRA = ("name", "architectures", "model_type", "torch_dtype", "dtype",
                 "rope_parameters", "sliding_window", "use_sliding_window", "bos_token_id",
                 "eos_token_id", "pad_token_id", "hidden_act", "initializer_range",
                 "use_cache", "mlp_bias", "pretraining_tp", "attention_dropout",
                 "max_window_layers", "transformers_version")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """KV-cache bytes one token takes: ``2 (K, V) × layers × kv_heads × head_dim × element
    bytes`` (vLLM's ``AttentionSpec.page_size_bytes`` / ``block_size``, summed over the
    layers); ``kv_heads`` of one GPU under tensor parallelism."""
    return 2 * layers * kv_heads * head_dim * element_bytes


#: HF config flags read as booleans: text such as "false" (truthy) is refused, not read.
BOOL_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")


def flag_problem(cfg: dict) -> tuple[str, str] | None:
    """The first of :data:`BOOL_FLAGS` in ``cfg`` that is not true or false, as ``(key,
    detail)``; None when each is a bool or absent."""
    for key in BOOL_FLAGS:
        v = cfg.get(key, False)
        if not isinstance(v, bool):
            return key, f"true or false, got {v!r}"
    return None


def quantization_problem(cfg: dict) -> tuple[str, str] | None:
    """``(key, detail)`` when an HF config describes quantized weights (a
    ``quantization_config``, or a ``torch_dtype`` of 8 bits or fewer), which the cost model
    would price at the scenario's 16- or 32-bit dtype; None otherwise."""
    q = cfg.get("quantization_config")
    if q is not None:
        method = q.get("quant_method") if isinstance(q, dict) else None
        return "quantization_config", (
            f"{'(' + repr(method) + ') ' if method else ''}not supported: quantized weights "
            f"are not modelled (weights and KV cache in bfloat16, float16 or float32)")
    td = cfg.get("torch_dtype")
    if isinstance(td, str) and td.startswith(("float8", "int", "uint", "fp8", "float4")):
        return "torch_dtype", (f"{td!r} not supported: quantized weights are not modelled "
                               f"(bfloat16, float16 or float32)")
    return None


def rope_type(scaling: dict | None) -> str | None:
    """An HF ``rope_scaling`` mapping's type: ``rope_type``, or the older ``type``."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type"))


def rope_scaling_problem(scaling: dict | None) -> tuple[str, str] | None:
    """The first figure of an HF ``rope_scaling`` mapping that no RoPE scaling takes, as
    ``(key, detail)``, ``key`` under ``rope_scaling``; None when there is none. Any
    rope_type: ``factor`` and ``original_max_position_embeddings``, when given, are finite
    numbers > 0 (a factor of 0 gives NaN logits). ``llama3`` (Llama 3.1) needs all four of
    its figures, ``low_freq_factor`` below ``high_freq_factor``. Which rope_types run is
    the engine's own rule (the cost model prices every one alike)."""
    if scaling is None:
        return None
    kind = rope_type(scaling)
    if kind is not None and kind not in ROPE_TYPES:   # vLLM's get_rope refuses it too
        return ("rope_type" if "rope_type" in scaling else "type",
                f"{kind!r} is not a RoPE scaling vLLM runs (allowed: {', '.join(ROPE_TYPES)})")
    llama3 = kind == "llama3"
    for key in LLAMA3_ROPE_KEYS if llama3 else ("factor", "original_max_position_embeddings"):
        if key not in scaling:
            if llama3:
                return key, "required for llama3"
            if key == "factor" and kind in FACTOR_ROPE_TYPES:   # HF and vLLM need it
                return key, f"required for {kind}"
            continue
        v = scaling[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            return key, f"a finite number > 0, got {v!r}"
    if llama3 and not scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        return "high_freq_factor", (
            f"{scaling['high_freq_factor']!r} must be above low_freq_factor "
            f"{scaling['low_freq_factor']!r} (the band between them is interpolated)")
    return None


#: RoPE scalings of a decoder-only text model that vLLM runs
#: (vllm/model_executor/layers/rotary_embedding/__init__.py get_rope; "su" is longrope).
ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "deepseek_yarn",
              "deepseek_llama_scaling", "longrope", "su", "llama3", "proportional")

#: RoPE scalings that scale by their ``factor`` (HF's and vLLM's refuse them without one).
FACTOR_ROPE_TYPES = ("linear", "dynamic", "ntk", "yarn", "deepseek_yarn")

#: RoPE scalings whose ``max_position_embeddings`` is already the scaled length: vLLM
#: does not multiply it by their ``factor`` (vllm/config/model.py).
PRESCALED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn",
                        "deepseek_llama_scaling")

#: The figures of a ``llama3`` RoPE scaling (Llama 3.1's config.json).
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")


def unsupported_layers(cfg: dict, model_type: str) -> tuple[str, str] | None:
    """The first HF config key whose layers servesim neither runs (its engine) nor prices
    (its cost model: a SwiGLU MLP without bias, full attention over the whole context),
    and why, as ``(key, detail)``; None when there is none. Refused rather than run as if
    absent: HF and vLLM would compute (and size the KV cache) otherwise.

    Sliding windows: a ``layer_types`` entry (transformers 5) other than
    ``full_attention``; Mistral's ``sliding_window`` below ``max_position_embeddings``;
    Qwen2's with ``use_sliding_window`` on layers from ``max_window_layers`` (its default
    28 when absent).

    Rotary embeddings turn pairs of dimensions: an odd ``head_dim`` (given, or derived as
    HF derives it, ``hidden_size // num_attention_heads``, which need not divide) runs
    nowhere, HF included; it is named at ``head_dim`` when given, else at ``hidden_size``.
    ``cfg``'s shape integers must have been checked (positive integers).

    Raises:
        ValueError: a ``sliding_window`` that is neither a positive integer nor null (the
            detail, to be prefixed with the key).
    """
    heads = cfg["num_attention_heads"]
    if cfg.get("head_dim"):
        if cfg["head_dim"] % 2:
            return "head_dim", f"{cfg['head_dim']} not supported (rotary embeddings turn " \
                               f"pairs of dimensions: an even head_dim)"
    elif (cfg["hidden_size"] // heads) % 2:
        return "hidden_size", (f"{cfg['hidden_size']} // num_attention_heads {heads} gives "
                               f"head_dim {cfg['hidden_size'] // heads}, odd: not supported "
                               f"(rotary embeddings turn pairs of dimensions; give an even "
                               f"head_dim)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        return "hidden_act", f"{act!r} not supported (the MLP is SwiGLU: silu)"
    if cfg.get("mlp_bias"):
        return "mlp_bias", "true not supported (the MLP has no bias)"
    types = cfg.get("layer_types") or ()
    if any(t != "full_attention" for t in types):
        return "layer_types", f"{types!r} not supported (full attention only; list " \
                              f"full_attention only)"
    window, mpe = cfg.get("sliding_window"), cfg.get("max_position_embeddings", 4096)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        raise ValueError(f"a positive integer or null, got {window!r}")
    if window is None or not isinstance(mpe, int) or window >= mpe:
        return None
    if model_type == "qwen2":
        slides = bool(cfg.get("use_sliding_window")) and (
            cfg.get("max_window_layers", 28) < cfg.get("num_hidden_layers", 0))
    else:
        slides = model_type == "mistral"
    if not slides:
        return None
    fix = "set it to null" + (" or use_sliding_window to false" if model_type == "qwen2"
                              else "")
    return "sliding_window", f"{window!r} not supported (full attention only; {fix})"


def inline_model_json_schema() -> dict:
    """JSON Schema of an inline ``model:`` mapping, from the keys :func:`load_model` reads:
    the shape's integers (1 to :data:`MAX_SHAPE_INT`; ``num_key_value_heads`` and
    ``head_dim`` may be left out or null, derived as HF derives them), a supported
    ``architecture`` (Llama, or HF's LlamaForCausalLM or llama; null: from
    ``architectures``, a list of names, or ``model_type``, a name), RoPE base
    and RMSNorm epsilon > 0, and no other keys than
    :data:`_SHAPE_KEYS` and :data:`_INLINE_EXTRA`. Rules across keys (heads that divide)
    stay the loader's."""
    derived = ("num_key_value_heads", "head_dim")
    count = {"type": "integer", "minimum": 1, "maximum": MAX_SHAPE_INT}
    props = {key: {} for key in _SHAPE_KEYS + _INLINE_EXTRA}
    props.update({key: {"anyOf": [count, {"type": "null"}]} if key in derived else count
                  for key in _INT_KEYS})
    props.update(architecture={"enum": [*_HF_BY_ARCH, *_ARCH_BY_HF, *_ARCH_BY_TYPE, None]},
                 architectures={"type": ["array", "null"], "items": {"type": "string"}},
                 model_type={"type": ["string", "null"]},
                 rope_theta={"type": "number", "exclusiveMinimum": 0},
                 rms_norm_eps={"type": "number", "exclusiveMinimum": 0},
                 rope_scaling={"type": ["object", "null"]},
                 rope_parameters={"type": ["object", "null"]})
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": [key for key in _INT_KEYS if key not in derived]}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``float32`` 4, ``bfloat16``/``float16`` 2).

    Raises:
        InputError: unknown dtype, listing the allowed ones.
    """
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise InputError(f"dtype: {dtype!r} is not supported (allowed: "
                         f"{', '.join(DTYPE_BYTES)})") from None


@dataclass(frozen=True)
class ModelShape:
    """Shape of a dense decoder-only transformer (Llama / Qwen2 / Mistral family).

    Field names and meanings are those of the Hugging Face ``config.json``; ``architecture``
    is the family. Parameter counts assume GQA attention (q, k, v, o projections), a gated
    SiLU MLP (gate, up, down) and RMSNorm (a weight vector, no bias), as in HF
    ``modeling_llama.py``.
    """

    name: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    rms_norm_eps: float = 1e-5

    @property
    def rope_factor(self) -> float:
        """What the RoPE scaling multiplies ``max_position_embeddings`` by for the longest
        context (vLLM ``_get_and_verify_max_len``, vllm/config/model.py): its ``factor``,
        except for rope types whose ``max_position_embeddings`` is already the scaled length
        (:data:`PRESCALED_ROPE_TYPES`); 1 without one."""
        if rope_type(self.rope_scaling) in PRESCALED_ROPE_TYPES:
            return 1.0
        return float((self.rope_scaling or {}).get("factor", 1.0))

    @property
    def derived_max_model_len(self) -> int:
        """Longest context the model allows (tokens), vLLM's default ``max_model_len``:
        ``max_position_embeddings`` × :attr:`rope_factor` (a linear or dynamic scaling of
        4 makes a 4096-position model a 16384-token one)."""
        return int(self.max_position_embeddings * self.rope_factor)

    def max_len_text(self) -> str:
        """Where :attr:`derived_max_model_len` comes from, for messages."""
        mpe = self.max_position_embeddings
        if self.rope_factor == 1.0:
            return f"max_position_embeddings ({mpe})"
        return (f"max_position_embeddings ({mpe}) × its rope_scaling factor "
                f"({self.rope_factor:g}): {self.derived_max_model_len}")

    # -- parameter counts ---------------------------------------------------------------
    @property
    def _layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            # Qwen2 biases q/k/v only; Llama/Mistral's attention_bias covers o_proj too.
            attn += q + 2 * kv + (0 if self.architecture == "Qwen2" else h)
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h  # two RMSNorm weights

    @property
    def num_nonembedding_params(self) -> int:
        """Parameters every token passes through in the decoder layers (+ final norm).

        Excludes the embedding table (a gather) and the LM head (priced separately: it runs
        only for tokens that sample).
        """
        return self.num_hidden_layers * self._layer_params + self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the LM head matmul, ``vocab_size * hidden_size`` (tied or not)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Stored parameters: embedding + layers + final norm + LM head unless tied."""
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return emb + self.num_nonembedding_params + head

    def weight_bytes(self, dtype: str) -> int:
        """Bytes of all stored weights in ``dtype``."""
        return self.num_params * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str) -> int:
        """KV-cache bytes per token of the whole model (:func:`kv_bytes_per_token`)."""
        return kv_bytes_per_token(self.num_hidden_layers, self.num_key_value_heads,
                                  self.head_dim, dtype_bytes(dtype))

    # -- conversions --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain mapping of every field (YAML/JSON friendly)."""
        return asdict(self)

    def shape_key(self) -> tuple:
        """Fields that change step cost or KV size (names excluded), for mismatch checks."""
        return (self.architecture,) + tuple(getattr(self, k) for k in _INT_KEYS[:-1])

    def shape_difference(self, other: "ModelShape") -> str | None:
        """The first field of :meth:`shape_key` where ``other`` differs, as ``"hidden_size
        1024, not 512"`` (``other``'s value first); None when the shapes are equal."""
        keys = ("architecture",) + tuple(_INT_KEYS[:-1])
        return next((f"{k} {getattr(other, k)}, not {getattr(self, k)}" for k in keys
                     if getattr(other, k) != getattr(self, k)), None)

    def describe(self) -> str:
        """One-line summary, e.g. ``llama-3.1-8b (Llama, 8.03 B params)``."""
        return f"{self.name} ({self.architecture}, {self.num_params / 1e9:.3g} B params)"

    def hf_config(self) -> dict:
        """A config mapping usable as ``transformers.LlamaConfig(**cfg)`` (or Qwen2Config,
        MistralConfig, per ``model_type``)."""
        cfg = {
            "architectures": [_HF_BY_ARCH[self.architecture]],
            "model_type": _TYPE_BY_ARCH[self.architecture],
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
        }
        if self.architecture != "Qwen2":  # Qwen2 always has q/k/v bias, no such key
            cfg["attention_bias"] = self.attention_bias
        return cfg


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU's spec-sheet numbers (see ``hardware.yaml`` for sources).

    Attributes:
        name: catalog name. memory_bytes: device memory, bytes. peak_bf16_flops: dense
        BF16/FP16 tensor peak, FLOP/s. peak_fp32_flops: FP32 peak, FLOP/s.
        memory_bandwidth: bytes/s. interconnect: ``nvlink`` or ``pcie``.
        interconnect_bandwidth: bytes/s in one direction. interconnect_latency_s: seconds
        per small all-reduce. price_per_gpu_hour: USD.
    """

    name: str
    memory_bytes: int
    peak_bf16_flops: float
    peak_fp32_flops: float
    memory_bandwidth: float
    interconnect: str
    interconnect_bandwidth: float
    interconnect_latency_s: float
    price_per_gpu_hour: float
    kind: str = "gpu"

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (tensor cores for bf16/fp16, FP32 otherwise)."""
        dtype_bytes(dtype)
        return self.peak_fp32_flops if dtype == "float32" else self.peak_bf16_flops


@functools.lru_cache(maxsize=None)
def _catalog(filename: str) -> dict:
    return load_yaml((_HERE / filename).read_text(encoding="utf-8"))


def list_models() -> list[str]:
    """Catalog model names, in file order."""
    return list(_catalog("models.yaml"))


def list_hardware() -> list[str]:
    """Catalog GPU names, in file order."""
    return list(_catalog("hardware.yaml"))


def load_hardware(name: str) -> HardwareSpec:
    """The :class:`HardwareSpec` of catalog GPU ``name``.

    Raises:
        InputError: unknown name, listing the known ones.
    """
    hw = _catalog("hardware.yaml")
    if name not in hw:
        raise InputError(f"unknown GPU {name!r} (known: {', '.join(hw)})")
    e = hw[name]
    return HardwareSpec(
        name=name, memory_bytes=int(e["memory_bytes"]),
        peak_bf16_flops=float(e["peak_bf16_flops"]), peak_fp32_flops=float(e["peak_fp32_flops"]),
        memory_bandwidth=float(e["memory_bandwidth"]), interconnect=str(e["interconnect"]),
        interconnect_bandwidth=float(e["interconnect_bandwidth"]),
        interconnect_latency_s=float(e["interconnect_latency_s"]),
        price_per_gpu_hour=float(e["price_per_gpu_hour"]))


def load_model(spec, base_dir=".") -> ModelShape:
    """Resolve a model spec into a :class:`ModelShape`.

    Args:
        spec: a catalog name (``llama-3.1-8b``), a path to an HF ``config.json`` or to a
            folder holding one (relative paths resolve against ``base_dir``), an inline
            mapping of HF config keys, or a :class:`ModelShape` (returned as is).
        base_dir: folder that relative paths are resolved against (the scenario's folder).

    Raises:
        KeyedInputError: unknown name, unreadable file, missing/invalid/unknown key, an
            unsupported architecture, or layers servesim does not model
            (:func:`unsupported_layers`: a GELU or biased MLP, sliding-window attention);
            the message starts with ``model``, and ``key`` is
            ``model`` or, in an inline mapping, ``model.<the key at fault>``.
    """
    if isinstance(spec, ModelShape):
        return spec
    if isinstance(spec, dict):
        unknown = [k for k in spec if k not in _SHAPE_KEYS and k not in _INLINE_EXTRA]
        if unknown:
            raise KeyedInputError(f"model.{unknown[0]}", f"unknown key (allowed: "
                                  f"{', '.join(_SHAPE_KEYS + ('name',))})")
        return _shape_from_hf(spec, str(spec.get("name", "inline")), "model", inline=True)
    if not isinstance(spec, (str, Path)):
        raise KeyedInputError("model", f"expected a catalog name, a path or a mapping, "
                                       f"got {type(spec).__name__}")
    models = _catalog("models.yaml")
    if not str(spec).strip():   # Path("") would be the scenario's folder
        raise KeyedInputError("model", f"empty: give a catalog model ({', '.join(models)}), "
                                       f"an HF config.json or a folder holding one")
    if isinstance(spec, str) and spec in models:
        return _shape_from_hf(models[spec], spec, f"model {spec}")
    path = scenario_path(spec, base_dir)
    folder = not name_too_long(path) and path.is_dir()
    if folder:
        path = path / "config.json"
    if not is_regular_file(path):
        raise KeyedInputError("model", (
            f"{str(spec)!r} is a folder without a config.json (an HF model folder holds "
            f"one; or give a catalog model: {', '.join(models)})" if folder else
            f"{str(spec)!r} is neither a catalog model (known: {', '.join(models)}) nor an "
            f"HF config.json file or a folder holding one"))
    try:
        cfg = read_hf_config(path)
    except InputError as e:
        raise KeyedInputError("model", str(e)) from None
    name = path.parent.name if path.name == "config.json" else path.stem
    return _shape_from_hf(cfg, name, f"model ({path})")


def read_hf_config(path: Path) -> dict:
    """The mapping of an HF config file (``config.json``; a ``.yaml``/``.yml`` file is read
    as YAML), keys unchecked.

    Raises:
        InputError: one line naming the file (and line, where there is one): unreadable,
            empty, not UTF-8, not valid JSON/YAML, a key given twice, or not a mapping.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        # (empty: json's own word for it would be "Expecting value")
        cfg = None if not text.strip() else (
            load_json(text) if path.suffix == ".json" else load_yaml(text))
    except DuplicateKeyError as e:   # json would keep the last value silently
        where = f"{path}:{e.line}" if e.line else str(path)
        raise InputError(f"{where}: duplicate key {e.key!r} (give each key once)") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    except yaml.YAMLError as e:   # worded as a scenario's or a profile's
        said = yaml_error_text(str(path), e, text)
        if (getattr(e, "problem", None) or "").startswith("duplicate key"):
            said += " (give each key once)"
        raise InputError(said) from None
    except UnicodeDecodeError:   # a binary file: say where, not the codec's own words
        raise InputError(utf8_problem(path)) from None
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path} is empty: an HF config holds a mapping of config keys"
                         if not text.strip() else
                         f"{path} does not hold a mapping of config keys")
    return cfg


def rope_from_hf(cfg: dict) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` from an HF config: the transformers-4 keys
    (``rope_theta``, ``rope_scaling``) or the transformers-5 ``rope_parameters`` mapping,
    whose ``rope_type`` other than ``default`` makes it the scaling. The scaling is returned
    as given (validated by the caller)."""
    rope = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return theta, scaling


def _shape_from_hf(cfg: dict, name: str, where: str, inline: bool = False) -> ModelShape:
    """Build a ModelShape from HF config keys; ``where`` prefixes error messages.

    Errors are :class:`KeyedInputError`: keyed ``model.<key>`` for the key at fault in an
    inline mapping (``inline``), else ``model`` with the file or catalog entry in the
    detail; their text stays ``<where>: <what is wrong>``.
    """
    def fail(key: str | None, msg: str, keyed: str | None = None):
        text = f"{where}: {msg}"
        if inline and key:
            return KeyedInputError(f"model.{key}", keyed or msg, message=text)
        place = where.removeprefix("model").strip().strip("()")
        return KeyedInputError("model", f"{place}: {msg}" if place else msg, message=text)

    for key, what in (("architecture", "a name such as Llama"),
                      ("model_type", "a name such as llama")):
        v = cfg.get(key)
        if v is not None and not isinstance(v, str):   # a list is unhashable: refused here
            raise fail(key, f"{key} must be {what} (got {echo(v)})",
                       f"must be {what} (got {echo(v)})")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        # a string would be read letter by letter, a mapping raise KeyError: both refused
        raise fail("architectures", f"architectures must be a list of class names such as "
                                    f"[LlamaForCausalLM] (got {echo(archs)})",
                   f"must be a list of class names such as [LlamaForCausalLM] (got "
                   f"{echo(archs)})")
    # Each key that names the architecture (servesim's, HF's class, HF's model_type) must
    # name the same one; a contradiction is refused, not settled by whichever comes first.
    named = []
    if cfg.get("architecture") is not None:   # servesim's name, or either of HF's
        a = cfg["architecture"]
        named.append(("architecture", _ARCH_BY_HF.get(a, _ARCH_BY_TYPE.get(a, a)), a))
    if cfg.get("architectures"):
        a = cfg["architectures"][0]
        named.append(("architectures", _ARCH_BY_HF.get(a, a), f"[{a}]"))
    if cfg.get("model_type") is not None:
        t = cfg["model_type"]
        named.append(("model_type", _ARCH_BY_TYPE.get(t, t), t))
    for key, arch, _ in named:
        if arch not in _HF_BY_ARCH:
            raise fail(key, f"architecture {arch!r} is not supported (supported: "
                            f"{', '.join(_HF_BY_ARCH)})")
    arch_key, arch, given = named[0] if named else (None, "Llama", None)
    for key, other, said in named[1:]:
        if other != arch:
            raise fail(key, f"{key} {said} ({other}) contradicts {arch_key} {given} ({arch}): "
                            f"they must name one architecture",
                       f"{said} ({other}) contradicts {arch_key} {given} ({arch}): they must "
                       f"name one architecture")
    vals = {}
    for key in _INT_KEYS:
        v = cfg.get(key)
        if v is None and key == "num_key_value_heads":
            v = cfg.get("num_attention_heads")
        if v is None and key == "head_dim":
            if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
                v = cfg["hidden_size"] // cfg["num_attention_heads"]
        if v is None:
            raise fail(key, f"missing key {key}", "required key missing (an HF config key)")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise fail(key, f"{key} must be a positive integer (got {echo(v)})",
                       f"must be a positive integer (got {echo(v)})")
        if v > MAX_SHAPE_INT:   # past it (10**400 layers) the cost model's floats overflow
            big = f"{v:.3g}" if v < 10**300 else f"an integer of {len(str(v))} digits"
            raise fail(key, f"{key} must be at most {MAX_SHAPE_INT:.0e} (got {big})",
                       f"must be at most {MAX_SHAPE_INT:.0e} (got {big})")
        vals[key] = v
    flag = flag_problem(cfg)
    if flag is not None:
        raise fail(flag[0], f"{flag[0]} must be {flag[1]}", f"must be {flag[1]}")
    quantized = quantization_problem(cfg)
    if quantized is not None:
        raise fail(quantized[0], f"{quantized[0]} {quantized[1]}", quantized[1])
    try:   # layers the cost model does not price (a sliding window sizes the KV otherwise)
        unsupported = unsupported_layers(cfg, _TYPE_BY_ARCH[arch])
    except ValueError as e:
        raise fail("sliding_window", f"sliding_window must be {e}", f"must be {e}") from None
    if unsupported is not None:
        key, detail = unsupported
        raise fail(key, f"{key} {detail}", detail)
    if vals["num_attention_heads"] % vals["num_key_value_heads"]:
        raise fail("num_key_value_heads",
                   f"num_attention_heads ({vals['num_attention_heads']}) must be a multiple "
                   f"of num_key_value_heads ({vals['num_key_value_heads']})")
    rope = cfg.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise fail("rope_parameters", "rope_parameters must be a mapping or null",
                   "must be a mapping or null")
    for key, holder in (("rope_theta", cfg), ("rope_theta", rope or {}),
                        ("rms_norm_eps", cfg)):
        v = holder.get(key)
        # null is no value (transformers would build a NaN or fail)
        if key in holder and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
            where_key = key if holder is cfg else f"rope_parameters.{key}"
            raise fail(where_key, f"{where_key} must be a finite number > 0 (got {echo(v)})",
                       f"must be a finite number > 0 (got {echo(v)})")
    rope_theta, rope_scaling = rope_from_hf(cfg)
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise fail("rope_scaling", "rope_scaling must be a mapping or null",
                   "must be a mapping or null")
    bad = rope_scaling_problem(rope_scaling)
    if bad is not None:   # as the engine refuses it
        raise fail("rope_scaling", f"rope_scaling.{bad[0]}: {bad[1]}",
                   f"{bad[0]}: {bad[1]}")
    try:
        return ModelShape(
            name=name, architecture=arch, **vals, rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", arch == "Qwen2"),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)))
    except (TypeError, ValueError) as e:
        raise fail(None, str(e)) from None


def shape_from_dict(d: dict) -> ModelShape:
    """Inverse of :meth:`ModelShape.to_dict` (profiles store shapes this way).

    Raises:
        InputError: missing or invalid keys.
    """
    d = dict(d)
    name = str(d.pop("name", "inline"))
    unknown = [k for k in d if k not in _SHAPE_KEYS]
    if unknown:
        raise InputError(f"model.shape.{unknown[0]}: unknown key (allowed: "
                         f"{', '.join(_SHAPE_KEYS)})")
    return _shape_from_hf(d, name, "model.shape")


__all__ = ["DTYPE_BYTES", "HardwareSpec", "ModelShape", "dtype_bytes",
           "inline_model_json_schema", "list_hardware", "list_models", "load_hardware",
           "load_model", "rope_from_hf", "shape_from_dict", "unsupported_layers",
           "BOOL_FLAGS", "LLAMA3_ROPE_KEYS", "flag_problem", "kv_bytes_per_token",
           "rope_scaling_problem", "rope_type", "quantization_problem", "ROPE_TYPES"]
