"""A Llama-family decoder-only transformer in plain PyTorch.

Readable top to bottom: :class:`ModelConfig` (from an HF ``config.json`` dict), RMSNorm,
rotary embeddings (incl. Llama-3 frequency scaling), grouped-query attention over the paged
KV cache, SwiGLU MLP, the decoder stack and the LM head. The math follows HF
``transformers`` ``modeling_llama.py`` / ``modeling_qwen2.py`` so that logits agree with
them on the same weights (tests/test_engine_reference.py).

Every forward runs on the *flattened* tokens of one engine step (``[T, hidden]``): the dense
layers see one matmul per weight for the whole mixed batch of decodes and prefill chunks;
only attention (:mod:`calibration.engine.attention`) looks at request boundaries. q/k/v and
gate/up are fused into one weight each (as vLLM's ``QKVParallelLinear`` and
``MergedColumnParallelLinear``) so a layer does four matmuls; :mod:`.weights` splits and
joins them to HF parameter names.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simulator.catalog import (LLAMA3_ROPE_KEYS, flag_problem, rope_from_hf,
                               rope_scaling_problem, unsupported_layers)
from simulator.errors import InputError
from simulator.policy.kv_cache import cdiv

from .attention import (AttentionMetadata, Padding, causal_chunk, context_chunk,
                        decode_batch, paged_attention, padding)

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "vocab_size")
#: model_type -> the HF class its folder loads as (config.json ``architectures``).
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "mistral": "MistralForCausalLM"}


def _positive(v) -> bool:
    """A finite real number above 0 (not a bool or a string)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < math.inf


def token_ids(v, vocab_size: int, where: str) -> list[int]:
    """An HF config's special token id (``eos_token_id``: one id, a list, or null) as a
    list.

    Raises:
        InputError: ``<where>: ...`` for anything but ids in ``[0, vocab_size)``.
    """
    ids = [] if v is None else v if isinstance(v, list) else [v]
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
               for t in ids):
        raise InputError(f"{where}: a token id in [0, {vocab_size}) or a list of them, "
                         f"got {v!r}")
    return ids


@dataclass(frozen=True)
class ModelConfig:
    """Model shape, read from an HF-style config dict (LlamaConfig / Qwen2Config keys).

    Attributes:
        vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim: shapes (``head_dim`` defaults to
            ``hidden_size // num_attention_heads``, ``num_key_value_heads`` to
            ``num_attention_heads``, as in HF).
        rms_norm_eps: RMSNorm epsilon. rope_theta: RoPE base.
        rope_scaling: ``None`` or ``{rope_type: llama3, factor, low_freq_factor,
            high_freq_factor, original_max_position_embeddings}`` (Llama 3.1).
        tie_word_embeddings: LM head shares the embedding matrix.
        qkv_bias: bias on q/k/v projections (always for Qwen2; ``attention_bias`` for
            Llama). o_bias: bias on the output projection (Llama ``attention_bias``).
        max_position_embeddings: longest position the model was built for.
        model_type: ``llama``, ``qwen2`` or ``mistral`` (full attention only; the same
            layers as Llama); chooses the HF class a saved model loads as.
        eos_token_id, bos_token_id: special token ids (``eos`` may be a list in HF).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    max_position_embeddings: int = 4096
    model_type: str = "llama"
    eos_token_id: int | list | None = None
    bos_token_id: int | None = None

    @classmethod
    def from_hf(cls, d: dict, source: str = "config") -> "ModelConfig":
        """Build from an HF config dict.

        Accepts the transformers-4 keys (``rope_theta``, ``rope_scaling``) and the
        transformers-5 ``rope_parameters`` dict.

        Raises:
            InputError: a required key missing, a non-positive size, KV heads that do not
                divide the heads, an odd head_dim (given or derived), layers not run
                (:func:`simulator.catalog.unsupported_layers`), a non-finite or
                non-positive ``rms_norm_eps`` / ``rope_theta``, an EOS/BOS id outside the
                vocab, or an unsupported ``rope_type`` / ``model_type``; naming the key.
        """
        if not isinstance(d, dict):
            raise InputError(f"{source}: expected a mapping of HF config keys")
        for key in _REQUIRED:
            v = d.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{source}.{key}: required positive integer, got "
                                 f"{d.get(key)!r}")
        model_type = d.get("model_type", "llama")
        if not isinstance(model_type, str) or model_type not in _ARCHITECTURES:
            raise InputError(f"{source}.model_type: {model_type!r} not supported "
                             f"(allowed: {', '.join(_ARCHITECTURES)})")
        arch = d.get("architectures")
        if arch is not None and arch != [_ARCHITECTURES[model_type]]:   # read as Llama
            raise InputError(f"{source}.architectures: {arch!r} does not run here: "
                             f"model_type {model_type} is [{_ARCHITECTURES[model_type]!r}]")
        for key in ("num_key_value_heads", "head_dim"):   # optional: derived when absent
            v = d.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"{source}.{key}: a positive integer or null, got {v!r}")
        flag = flag_problem(d)   # "false" read as true
        if flag is not None:
            raise InputError(f"{source}.{flag[0]}: {flag[1]}")
        # what the layers do not do is refused, not run as if absent (HF would differ)
        try:
            unsupported = unsupported_layers(d, model_type)
        except ValueError as e:
            raise InputError(f"{source}.sliding_window: {e}") from None
        if unsupported is not None:
            raise InputError(f"{source}.{unsupported[0]}: {unsupported[1]}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise InputError(f"{source}.num_key_value_heads: {kv_heads} must divide "
                             f"num_attention_heads {heads}")
        head_dim = d.get("head_dim") or d["hidden_size"] // heads   # as HF derives it
        for key in ("rope_scaling", "rope_parameters"):
            if d.get(key) is not None and not isinstance(d[key], dict):
                raise InputError(f"{source}.{key}: a mapping (rope_type, factor, ...) or "
                                 f"null, got {d[key]!r}")
        # transformers 5 writes rope_theta inside rope_parameters (and reads it first)
        rope = d.get("rope_parameters") or {}
        # each as given, null included (a null RoPE base is none, in HF's too)
        given = {k: v for k, v, present in (
            ("rms_norm_eps", d.get("rms_norm_eps", 1e-6), True),
            ("rope_theta", d.get("rope_theta", 10000.0), True),
            ("rope_parameters.rope_theta", rope.get("rope_theta"), "rope_theta" in rope))
            if present}
        for key, v in given.items():   # NaN or a negative theta would load and give NaN logits
            if not _positive(v):
                raise InputError(f"{source}.{key}: a finite number > 0, got {v!r}")
        inner = rope.get("rope_theta")
        if "rope_theta" in d and inner is not None and inner != d["rope_theta"]:
            # which of the two a reader takes depends on its transformers version
            raise InputError(f"{source}.rope_parameters.rope_theta: {rope['rope_theta']!r} "
                             f"disagrees with rope_theta {d['rope_theta']!r}: give one")
        mpe = d.get("max_position_embeddings", 4096)
        if isinstance(mpe, bool) or not isinstance(mpe, int) or mpe < 1:
            raise InputError(f"{source}.max_position_embeddings: a positive integer, got "
                             f"{mpe!r}")
        for key in ("eos_token_id", "bos_token_id"):
            token_ids(d.get(key), d["vocab_size"], f"{source}.{key}")
        theta, scaling = rope_from_hf(d)
        bad = rope_scaling_problem(scaling)
        if bad is not None:
            raise InputError(f"{source}.rope_scaling.{bad[0]}: {bad[1]}")
        rtype = "default" if scaling is None else scaling.get("rope_type",
                                                               scaling.get("type"))
        if rtype not in ("default", "llama3"):   # the only scalings the layers run
            raise InputError(f"{source}.rope_scaling.rope_type: {rtype!r} not supported "
                             f"(allowed: llama3, default)")
        scaling = ({"rope_type": "llama3", **{k: scaling[k] for k in LLAMA3_ROPE_KEYS}}
                   if rtype == "llama3" else None)
        attn_bias = d.get("attention_bias", False)
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=scaling, tie_word_embeddings=d.get("tie_word_embeddings", False),
            qkv_bias=model_type == "qwen2" or attn_bias,
            o_bias=model_type == "llama" and attn_bias,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            model_type=model_type, eos_token_id=d.get("eos_token_id"),
            bos_token_id=d.get("bos_token_id"))

    def to_hf(self) -> dict:
        """The HF ``config.json`` dict (loads as LlamaForCausalLM / Qwen2ForCausalLM)."""
        d = {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "hidden_act": "silu",
            **{k: v for k, v in asdict(self).items()
               if k not in ("qkv_bias", "o_bias", "model_type", "rope_scaling")},
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
        }
        if self.model_type == "llama":
            d["attention_bias"] = self.o_bias
        return d


# Batch-size hint for oneDNN's weight layout: vLLM's CPU path prepacks with 32 too
# (vllm/model_executor/layers/utils.py, ``dispatch_cpu_unquantized_gemm``).
PREPACK_BATCH_HINT = 32


def prepack_weight(w: torch.Tensor) -> torch.Tensor:
    """``w [out, in]`` reordered once into oneDNN's blocked layout for CPU matmuls.

    ``F.linear`` on CPU reorders the weight on every call; a decode step's small batches
    then spend as long reordering as multiplying. The product is bitwise the same (the same
    oneDNN kernel runs), so only speed changes.
    """
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PREPACK_BATCH_HINT)


_prepack_ok: dict = {}   # dtype -> whether this CPU's oneDNN can prepack it


def prepack_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN here can prepack (:func:`prepack_weight`) a ``dtype`` weight: its
    bfloat16 path needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT and raises RuntimeError on an
    AVX2-only CPU, where plain ``F.linear`` still runs. Tried once per dtype on a tiny
    weight, since the CPU features it checks are oneDNN's own."""
    if dtype not in _prepack_ok:
        try:
            prepack_weight(torch.zeros(8, 8, dtype=dtype))
            _prepack_ok[dtype] = True
        except RuntimeError:
            _prepack_ok[dtype] = False
    return _prepack_ok[dtype]


# oneDNN's kernel for exactly two rows streams a prepacked weight slower than the one for
# three (bfloat16 on an AVX512-BF16 CPU, in a decode step: 104 against 80 us for q/k/v),
# so a 2-decode step takes longer than a 3-decode one (by 0.35-1.3 ms of ~11;
# benchmarks/results/small_batches.md). Two rows run as three, the third zero.
PAD_ROWS = {2: 3}


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias=None) -> torch.Tensor:
    """``x [T, in] @ W^T + bias`` with ``packed`` from :func:`prepack_weight` (``T`` in
    :data:`PAD_ROWS` runs padded with zero rows; the result has ``T`` rows)."""
    t = x.shape[0]
    if t in PAD_ROWS:
        y = torch.ops.mkldnn._linear_pointwise(F.pad(x, (0, 0, 0, PAD_ROWS[t] - t)), packed,
                                               bias, "none", [], "")
        return y[:t]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# oneDNN builds (JIT-compiles) a kernel the first time a weight meets a new row count: ~2 ms
# per step with a new token count for the 56M model on a 2-core CPU (a 40 ms mixed step
# pays 5 %). Served steps change their token count nearly every step, so the engine builds
# them at start-up (:meth:`Transformer.warm_up`) up to this many rows; above it a build is
# under 2 % of the step. ``calibration/engine/__init__.py`` raises oneDNN's kernel cache
# (default 1024 kernels, ~250 row counts of a layer's four weights) so they stay built.
WARMUP_MAX_ROWS = 512
# Wall-clock bound on one warm-up (a large model on CPU would otherwise spend minutes).
WARMUP_MAX_SECONDS = 20.0
# Keys of a chunk after cached tokens are warmed up to this count: the CPU attention splits
# keys in runs of 512, so longer contexts reuse the kernels of their last run's length.
WARMUP_MAX_CONTEXT = 1024
# ... and the decodes' block counts up to this many: a new count costs about 0.8 ms, under 2 %
# of a step of more blocks (a step of 32 decodes of 512 tokens takes about 45 ms), and
# warming counts to 4096 would take 3 s.
WARMUP_MAX_PIECES = 1024
_warmed: dict = {}  # weight shapes, biases, heads, dtype -> (rows, samples) built in this process
_warmed_shapes: dict = {}  # same key -> padded attention shapes built in this process


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) that runs on a prepacked copy of its
    weight when :meth:`Transformer.prepack` gave it one."""

    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, in_features] -> [T, out_features]``."""
        if self.packed is None:
            return super().forward(x)
        return packed_linear(x, self.packed, self.bias)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), computed in float32 as HF ``LlamaRMSNorm``."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim]`` over its root mean square (float32), back in ``x``'s dtype and
        then scaled by the weight."""
        x32 = x.float()
        rms = torch.sqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * (x32 / rms).to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies ``[head_dim/2]`` (float32), with Llama-3 scaling if configured.

    Default RoPE: ``theta^(-2i/d)`` (Su et al. 2021). Llama-3 scaling (Meta's Llama 3.1
    release; ``rope_scaling`` of its config.json): with ``r`` the rotations a frequency
    makes over the original context (``original_max_position_embeddings`` / wavelength),
    a frequency is divided by ``factor`` where ``r <= low_freq_factor``, kept where
    ``r >= high_freq_factor``, and in between scaled by the linear blend
    ``(1 - t) / factor + t``, ``t = (r - low) / (high - low)``: one clamped ``t`` covers
    the three bands.
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if not s:
        return inv
    lo, hi = s["low_freq_factor"], s["high_freq_factor"]
    rotations = s["original_max_position_embeddings"] * inv / (2 * math.pi)
    t = ((rotations - lo) / (hi - lo)).clamp(0.0, 1.0)
    return inv * ((1 - t) / s["factor"] + t)


class Rotary:
    """Rotary position embedding with a cos/sin table per position (HF ``rotate_half``
    convention: the two halves of each head are rotated against each other).

    The table is float32 and kept out of the module's parameters and buffers, so casting
    the model to bfloat16 does not coarsen the frequencies (HF keeps ``inv_freq`` float32
    too); it moves to the positions' device on first use and grows on demand.
    """

    def __init__(self, cfg: ModelConfig):
        self.inv_freq = rope_inv_freq(cfg).cpu()   # host-side, whatever the default device
        self._table(cfg.max_position_embeddings, torch.device("cpu"))

    def _table(self, n: int, device) -> None:
        t = torch.arange(n, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)
        self._cast = {}

    def __call__(self, positions: torch.Tensor, max_position: int, dtype: torch.dtype):
        """cos, sin ``[T, 1, head_dim]`` in ``dtype`` for integer ``positions [T]``, all
        ``<= max_position`` (passed in so that no device sync is needed)."""
        need = max_position + 1
        if need > self.cos.shape[0] or self.cos.device != positions.device:
            self._table(max(need, self.cos.shape[0]), positions.device)
        if dtype not in self._cast:  # cast once, index per step
            self._cast[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        cos, sin = self._cast[dtype]
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, head_dim]`` rotated: ``x·cos + rotate_half(x)·sin``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query self-attention (Ainslie et al. 2023) over the paged KV cache."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = (cfg.num_attention_heads,
                                                  cfg.num_key_value_heads, cfg.head_dim)
        self.q_size, self.kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)

    def forward(self, x, cos, sin, meta: AttentionMetadata, kv_store):
        """``x [T, hidden_size]`` (the step's tokens, requests concatenated), ``cos`` /
        ``sin [T, head_dim]`` of their positions -> ``[T, hidden_size]``; writes the
        tokens' K/V into ``kv_store`` at ``meta``'s slot mapping and attends over each
        request's cached and new tokens (:func:`paged_attention`)."""
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(-1, self.n_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(-1, self.n_kv, self.head_dim), cos, sin)
        v = v.view(-1, self.n_kv, self.head_dim)
        o = paged_attention(q, k, v, meta, kv_store, self.layer)
        return self.o_proj(o.reshape(-1, self.q_size))


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=False)

    def forward(self, x):
        """``x [T, hidden_size] -> [T, hidden_size]``."""
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, meta, kv_store):
        """``x [T, hidden_size] -> [T, hidden_size]`` (arguments as :meth:`Attention.forward`)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv_store)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """The decoder stack and LM head.

    ``forward(input_ids [T], positions [T], meta, kv_store) -> hidden [T, hidden_size]``
    (final norm applied); ``compute_logits(hidden [N, hidden]) -> [N, vocab]`` float32.
    The LM head runs only on the rows the caller selects (tokens that sample), as vLLM's
    ``LogitsProcessor`` does.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self._tied_head_packed = None

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_store=None):
        """``input_ids [T]``, ``positions [T]`` (int64) -> ``hidden [T, hidden_size]``, the
        final norm applied; ``kv_store`` holds the paged K/V ``meta`` addresses."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, meta.max_position, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, meta, kv_store)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [N, hidden_size]`` (the rows that sample) -> logits ``[N, vocab_size]``
        float32."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        if self._tied_head_packed is not None:
            return packed_linear(hidden, self._tied_head_packed).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    def prepack(self, enabled: bool) -> None:
        """Give every linear layer (and a tied LM head) a copy of its weight prepacked for
        oneDNN (:func:`prepack_weight`), or drop the copies. The engine enables it on CPU
        for float32 and bfloat16 after moving the model, as vLLM's CPU backend does; the
        copies are not parameters, so call it again after changing weights, dtype or
        device. Costs one more copy of the linear weights in memory. Does nothing where
        oneDNN cannot prepack the weights' dtype (:func:`prepack_supported`)."""
        enabled = (enabled and torch.backends.mkldnn.is_available()
                   and prepack_supported(self.embed_tokens.weight.dtype))
        for m in self.modules():
            if isinstance(m, Linear):
                m.packed = prepack_weight(m.weight) if enabled else None
        self._tied_head_packed = (prepack_weight(self.embed_tokens.weight)
                                  if enabled and self.lm_head is None else None)

    def warm_up(self, max_rows: int, max_samples: int,
                max_seconds: float = WARMUP_MAX_SECONDS, block_size: int = 0,
                max_context: int = 0) -> tuple[int, int]:
        """Run layer 0 once on ``1..max_rows`` rows of zeros (its attention as a prefill
        from position 0, then its MLP) and the LM head on ``1..max_samples``, so that oneDNN
        builds its kernels now rather than inside served steps (vLLM warms its GPU engine
        the same way, capturing CUDA graphs per batch size). The dense kernels are keyed by
        row count; the CPU ``scaled_dot_product_attention`` of a reduced-precision prefill
        builds its kernels per query length *and* memory layout (a first call at a new
        length costs about 1 ms more on the AMX host of ``benchmarks/results/
        fidelity_runs.md``, and a warm-up on contiguous tensors does not serve the strided
        views a step passes), so it runs through the model's own attention code. Layer 0
        suffices: every layer has the same shapes, and kernels are keyed by shape, not by
        weight. With ``block_size`` and ``max_context`` (tokens), it then runs layer 0's
        attention on every padded shape (:class:`.attention.Padding`) that decodes of up to
        ``max_samples`` requests (each samples a row) of up to ``max_context`` tokens take
        (blocks capped at :data:`WARMUP_MAX_PIECES`), and a chunk of at most ``max_rows`` rows
        after cached tokens (keys capped at :data:`WARMUP_MAX_CONTEXT`),
        on a scratch one-layer cache. Row counts are capped at :data:`WARMUP_MAX_ROWS` and the
        whole call at ``max_seconds``; counts built earlier in the process are skipped.
        Does nothing without prepacked weights (:meth:`prepack`; cuda needs no builds).

        Returns:
            ``(rows, samples)``: the row counts now built for layer 0 and the head.
        """
        layer = self.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        dense = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        head = self.lm_head.packed if self.lm_head is not None else self._tied_head_packed
        if head is None or any(m.packed is None for m in dense):
            return (0, 0)
        key = (tuple((*m.weight.shape, m.bias is not None) for m in dense),
               (attn.n_heads, attn.n_kv, attn.head_dim), self.config.vocab_size, self.dtype)
        done_rows, done_samples = _warmed.get(key, (0, 0))
        rows = min(max_rows, WARMUP_MAX_ROWS)
        samples = min(max_samples, rows)
        t_end = time.perf_counter() + max_seconds
        pad = padding(self.device)
        with torch.inference_mode():
            for n in range(1, max(rows, samples) + 1):
                if time.perf_counter() > t_end:
                    rows, samples = min(rows, n - 1), min(samples, n - 1)
                    break
                if done_rows < n <= rows:
                    x = torch.zeros(n, self.config.hidden_size, dtype=self.dtype,
                                    device=self.device)
                    positions = torch.arange(n, device=self.device)
                    cos, sin = self.rotary(positions, n - 1, self.dtype)
                    meta = AttentionMetadata(slot_mapping=None, max_position=n - 1,
                                             prefills=[causal_chunk(0, n, pad)])
                    mlp(attn(x, cos, sin, meta, None))
                if done_samples < n <= samples:
                    self.compute_logits(torch.zeros(n, self.config.hidden_size,
                                                    dtype=self.dtype, device=self.device))
        _warmed[key] = (max(done_rows, rows), max(done_samples, samples))
        if block_size and max_context:
            self._warm_up_attention(key, min(max_rows, WARMUP_MAX_ROWS), max_context,
                                    max_samples, block_size, t_end)
        return _warmed[key]

    def _warm_up_attention(self, key, rows: int, max_context: int, max_seqs: int,
                           block_size: int, t_end: float) -> None:
        """Layer 0's attention on each padded shape of :meth:`warm_up`, smallest first,
        until ``t_end`` (``time.perf_counter``): the decodes' block counts up to
        ``max_seqs · ceil(max_context / block_size)``, then each ``(nq, nk)`` of a chunk of
        ``n <= rows`` queries after ``c0 >= 1`` cached tokens with ``c0 + n <= keys``."""
        from .kv_store import KVStore

        pad = padding(self.device)
        if pad == Padding():   # only the CPU pads (and builds kernels); tensors stay there
            return
        attn = self.layers[0].self_attn
        done = _warmed_shapes.setdefault(key, set())
        keys = min(max_context, WARMUP_MAX_CONTEXT)
        qp, kp, pp = pad.query_rows, pad.keys, pad.pieces
        pieces = min(max(1, max_seqs) * cdiv(max_context, block_size), WARMUP_MAX_PIECES)
        shapes = [("decode", b) for b in range(pp, pieces + pp, pp)]
        shapes += [("chunk", nq, nk) for nq in range(qp, rows + qp, qp)
                   for nk in range(kp, keys + kp, kp) if nk > nq - qp + 1]
        shapes = [x for x in shapes if x not in done]
        if not shapes:
            return
        chunk_keys = [x[2] for x in shapes if x[0] == "chunk"]
        blocks = cdiv(max(chunk_keys, default=block_size), block_size)
        scratch = KVStore(1, blocks + 1, block_size, attn.n_kv, attn.head_dim, self.dtype,
                          self.device)
        with torch.inference_mode():
            for shape in shapes:
                if time.perf_counter() > t_end:
                    break
                if shape[0] == "decode":   # one decode over as many (null) blocks
                    n, first = 1, 0
                    meta = AttentionMetadata(slot_mapping=None, max_position=0,
                                             decodes=decode_batch([([0] * shape[1],
                                                                    shape[1] * block_size)],
                                                                  block_size, pad))
                else:
                    nq, nk = shape[1:]
                    n = min(nq, nk - 1, rows)       # the longest chunk of these shapes
                    first = nk - n
                    c = context_chunk(0, n, first, range(1, blocks + 1), block_size, pad)
                    meta = AttentionMetadata(slot_mapping=None, max_position=nk - 1,
                                             prefills=[c])
                x = torch.zeros(n, self.config.hidden_size, dtype=self.dtype,
                                device=self.device)
                positions = torch.arange(first, first + n, device=self.device)
                cos, sin = self.rotary(positions, first + n - 1, self.dtype)
                attn(x, cos, sin, meta, scratch)
                done.add(shape)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype."""
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        """The weights' device."""
        return self.embed_tokens.weight.device
