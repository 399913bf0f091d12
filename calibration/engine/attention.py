"""Attention for one engine step's mixed batch, reading K/V through block tables.

The step's tokens are flattened: single-token queries (decodes) first, grouped by context
length, then one contiguous run of tokens per prefill chunk. Per layer:

1. The K/V of *every* scheduled token are written to the cache first, so a request can
   read blocks that another request of the same step fills (a prefix hit registered in the
   same scheduling pass, DESIGN.md §3).
2. Decode groups: each group gathers its block tables (padded with the null block) into
   ``[kv_heads, batch, context, head_dim]`` and runs one batched matmul / softmax / matmul
   with a padding mask. Cost follows context length, not its square. The query heads of one
   KV head are laid out as rows of one matrix (``[kv_heads, batch, group, head_dim]``), so
   grouped-query attention needs no repeated K/V.
3. Prefill chunks: queries at positions ``c0 .. c0+n-1`` attend to the ``c0`` cached tokens
   and causally to the chunk itself (one ``scaled_dot_product_attention`` per chunk). A
   chunk with no cached context uses its fresh K/V directly.

Scaling is ``1/sqrt(head_dim)`` (HF Llama/Qwen2 ``scaling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    """Single-token queries at flat tokens ``start .. start+n-1``.

    Attributes:
        start, n: token range. blocks: ``[n * max_blocks]`` int64 block tables, row-major,
        padded with block 0. context: ``max_blocks * block_size``.
        mask: ``[1, n, 1, context]`` float32, 0 where a key is visible, -inf for padding.
    """

    start: int
    n: int
    blocks: torch.Tensor
    context: int
    mask: torch.Tensor


@dataclass
class PrefillChunk:
    """Queries at flat tokens ``start .. start+n-1`` for positions ``c0 .. c0+n-1``.

    Attributes:
        blocks: ``[ceil((c0+n)/block_size)]`` int64 block ids (used when ``c0 > 0``).
        mask: ``[n, c0+n]`` bool (True = visible) when ``c0 > 0``, else None (causal).
    """

    start: int
    n: int
    c0: int
    blocks: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """What attention needs to know about one step (built by the model runner).

    Attributes:
        slot_mapping: ``[T]`` int64 cache slot of every flat token (None: no cache, e.g.
            the memory-profiling forward, which must be prefills from position 0).
        decode_groups, prefills: see :class:`DecodeGroup`, :class:`PrefillChunk`.
        max_position: largest position in the step (sizes the rotary table without a
            device sync).
    """

    slot_mapping: torch.Tensor | None
    max_position: int = 0
    decode_groups: list = field(default_factory=list)
    prefills: list = field(default_factory=list)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    meta: AttentionMetadata, kv_store, layer: int) -> torch.Tensor:
    """Attention output ``[T, heads, head_dim]`` for ``q [T, heads, head_dim]`` and the
    step's new ``k, v [T, kv_heads, head_dim]`` (see module docstring)."""
    if kv_store is not None:
        kv_store.write(layer, meta.slot_mapping, k, v)
    out = torch.empty_like(q)
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    group = n_heads // n_kv
    scale = head_dim ** -0.5
    for g in meta.decode_groups:
        kc, vc = kv_store.gather(layer, g.blocks)                   # [kv, n*ctx, d]
        kc = kc.view(n_kv, g.n, g.context, head_dim)
        vc = vc.view(n_kv, g.n, g.context, head_dim)
        qg = q[g.start:g.start + g.n].view(g.n, n_kv, group, head_dim).transpose(0, 1)
        scores = torch.matmul(qg, kc.transpose(-1, -2)).float() * scale + g.mask
        probs = torch.softmax(scores, dim=-1).to(q.dtype)         # [kv, n, group, ctx]
        og = torch.matmul(probs, vc)                               # [kv, n, group, d]
        out[g.start:g.start + g.n] = og.transpose(0, 1).reshape(g.n, n_heads, head_dim)
    for c in meta.prefills:
        qc = q[c.start:c.start + c.n].transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
        if c.c0 == 0:
            kc = k[c.start:c.start + c.n].transpose(0, 1).unsqueeze(0)
            vc = v[c.start:c.start + c.n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True,
                                               enable_gqa=group > 1)
        else:
            ctx = c.c0 + c.n
            kc, vc = kv_store.gather(layer, c.blocks)
            kc, vc = kc[:, :ctx].unsqueeze(0), vc[:, :ctx].unsqueeze(0)
            o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=c.mask,
                                               enable_gqa=group > 1)
        out[c.start:c.start + c.n] = o[0].transpose(0, 1)
    return out
