"""Attention for one engine step's mixed batch, reading K/V through block tables.

The step's tokens are flattened: single-token queries (decodes) first, then one contiguous
run of tokens per prefill chunk. Per layer:

1. The K/V of *every* scheduled token are written to the cache first, so a request can
   read blocks that another request of the same step fills (a prefix hit registered in the
   same scheduling pass).
2. Decodes, all at once, split-K (vLLM ``paged_attention_v2``'s partitions; "flash
   decoding") with one block per partition: one gather of every decode's blocks gives
   ``[blocks, kv_heads, block_size, head_dim]`` (the cache's own layout, so no transpose);
   one batched matmul scores each block against its request's query, the softmax is taken
   over each request's blocks together (a per-request maximum, then per-request sums, by
   index), and one more batched matmul and an index-add give the outputs. Padding past a
   context's end (in its last block) is masked; on CPU the blocks are padded to a multiple
   of ``CPU_PADDING.pieces`` with fully masked ones (:func:`decode_batch`). The number of
   tensor operations per layer is the same for any batch, and the work is ``blocks ×
   block_size ≈ context tokens + decodes × block_size / 2``: the step cost follows the
   decode count and the summed context, the two quantities the cost model prices, however
   the contexts are spread.
   The query heads of one KV head are rows of one matrix (``[blocks, kv_heads, group,
   head_dim]``), so grouped-query attention needs no repeated K/V.
3. Prefill chunks: queries at positions ``c0 .. c0+n-1`` attend to the ``c0`` cached tokens
   and causally to the chunk itself (one ``scaled_dot_product_attention`` per chunk). A
   chunk with no cached context uses its fresh K/V directly. On CPU, every chunk runs
   padded (:data:`CPU_PADDING`; :func:`causal_chunk`, :func:`context_chunk`).

Scaling is ``1/sqrt(head_dim)`` (HF Llama/Qwen2 ``scaling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from simulator.policy.kv_cache import cdiv


@dataclass
class DecodeBatch:
    """Single-token queries at flat tokens ``start .. start+n-1`` and the blocks of their
    contexts.

    Attributes:
        start, n: token range (one token per decoding request).
        blocks: ``[pieces]`` int64, every decode's block table in turn.
        piece_req: ``[pieces]`` int64, the decode (``0 .. n-1``) each block belongs to.
        mask: ``[pieces, 1, 1, block_size]`` float32, 0 where a key is visible, -inf past
            the context's end.
    """

    start: int
    n: int
    blocks: torch.Tensor
    piece_req: torch.Tensor
    mask: torch.Tensor


@dataclass
class PrefillChunk:
    """Queries at flat tokens ``start .. start+n-1`` for positions ``c0 .. c0+n-1``.

    Attributes:
        blocks: int64 block ids covering the keys (used when ``c0 > 0``).
        mask: ``[nq, nk]`` bool (True = visible) when ``c0 > 0``, else None (causal):
            ``nq >= n`` query rows and ``nk >= c0 + n`` keys (:func:`context_chunk`).
        rows: with ``c0 == 0``, the query and key rows it runs on, ``>= n``
            (:func:`causal_chunk`; 0: ``n``).
    """

    start: int
    n: int
    c0: int
    blocks: torch.Tensor | None
    mask: torch.Tensor | None
    rows: int = 0


@dataclass(frozen=True)
class Padding:
    """Multiples that attention pads its shapes to (1: none).

    Attributes:
        causal_rows: of a prefill chunk from position 0 (:func:`causal_chunk`).
        query_rows, keys: of a prefill chunk after cached tokens (:func:`context_chunk`).
        pieces: of the decodes' blocks (:func:`decode_batch`).
    """

    causal_rows: int = 1
    query_rows: int = 1
    keys: int = 1
    pieces: int = 1


# On CPU, reduced-precision attention builds (JIT-compiles) a kernel per shape on first use,
# and a served step meets a new shape nearly every time. Padded to these multiples the
# shapes are few enough to build at start-up (Transformer.warm_up); and a prefill from
# position 0 runs fastest at a multiple of 32 rows, so a prompt of any length costs what
# the calibration grid's lengths (multiples of 32) measure. Measured on an Intel Xeon with AMX:
# - a build: 1-3 ms per new (query rows, keys) pair of a masked prefill's
#   scaled_dot_product_attention, about 0.8 ms per new block count of the decodes' matmuls;
# - unbuilt shapes: a burst of new requests served x0.86 of the cost model, the same
#   requests served again x0.98;
# - padding's cost: padded prefills run x0.94 of unpadded in steady state; 16 blocks pad a
#   decode step by 120 tokens of context on average;
# - causal attention, 8 layers: 10.0 ms at 254 rows, 4.6 ms at 256, 5.2 ms at 288 (a length
#   between multiples of 32 takes up to twice the next multiple's time).
CPU_PADDING = Padding(causal_rows=32, query_rows=32, keys=64, pieces=16)


def padding(device) -> Padding:
    """The :class:`Padding` of attention on ``device``: :data:`CPU_PADDING` on CPU, none
    elsewhere."""
    return CPU_PADDING if torch.device(device).type == "cpu" else Padding()


def decode_batch(contexts, block_size: int, pad: Padding = Padding()) -> DecodeBatch:
    """The :class:`DecodeBatch` of decodes at flat tokens ``0 .. len(contexts)-1``.

    Args:
        contexts: per decode, ``(block_ids, ctx)``: its block table and its context length
            in tokens (the query's own token included).
        block_size: tokens per block. pad: ``pad.pieces`` (fully masked copies of the null
            block 0, owned by decode 0, pad the blocks to a multiple of it).
    """
    bs = block_size
    tables, piece_req, first, length = [], [], [], []
    for j, (block_ids, ctx) in enumerate(contexts):
        nb = cdiv(ctx, bs)
        tables.extend(block_ids[:nb])
        piece_req.extend([j] * nb)
        first.extend(range(0, nb * bs, bs))
        length.extend([ctx] * nb)
    extra = -len(tables) % pad.pieces
    tables += [0] * extra
    piece_req += [0] * extra
    first += [0] * extra
    length += [0] * extra          # every key of a padded block lies past its "context"
    keys = torch.tensor(first)[:, None] + torch.arange(bs)[None, :]
    mask = torch.zeros(len(tables), bs).masked_fill(keys >= torch.tensor(length)[:, None],
                                                    float("-inf"))
    return DecodeBatch(0, len(contexts), torch.tensor(tables, dtype=torch.int64),
                       torch.tensor(piece_req, dtype=torch.int64),
                       mask.view(len(tables), 1, 1, bs))


def causal_chunk(start: int, n: int, pad: Padding = Padding()) -> PrefillChunk:
    """The :class:`PrefillChunk` of ``n`` queries from position 0, run on ``n`` rounded up
    to a multiple of ``pad.causal_rows`` rows of queries and keys (zeros, dropped after
    attention): with causal masking a real query never sees a padded key, which all lie
    after it."""
    return PrefillChunk(start, n, 0, None, None,
                        rows=cdiv(n, pad.causal_rows) * pad.causal_rows)


def context_chunk(start: int, n: int, c0: int, block_ids, block_size: int,
                  pad: Padding = Padding()) -> PrefillChunk:
    """The :class:`PrefillChunk` of ``n`` queries after ``c0 > 0`` cached tokens whose
    blocks are ``block_ids`` (at least ``ceil((c0+n)/block_size)`` of them).

    Query rows are padded to a multiple of ``pad.query_rows`` (zeros, dropped after
    attention) and keys to a multiple of ``pad.keys``; padded keys repeat the last block and
    are masked. Padded rows see every real key, so no row of the mask is empty (an empty
    row would give NaN). Mask ``[nq, nk]``: query ``i`` (position ``c0+i``) sees key ``j``
    iff ``j <= c0+i`` and ``j < c0+n``.
    """
    ctx = c0 + n
    nq = cdiv(n, pad.query_rows) * pad.query_rows
    nk = cdiv(ctx, pad.keys) * pad.keys
    ids = list(block_ids[:cdiv(ctx, block_size)])
    ids += ids[-1:] * (cdiv(nk, block_size) - len(ids))
    keys = torch.arange(nk)[None, :]
    mask = (keys <= torch.arange(c0, c0 + nq)[:, None]) & (keys < ctx)
    return PrefillChunk(start, n, c0, torch.tensor(ids, dtype=torch.int64), mask)


@dataclass
class AttentionMetadata:
    """What attention needs to know about one step (built by the model runner).

    Attributes:
        slot_mapping: ``[T]`` int64 cache slot of every flat token (None: no cache, e.g.
            the memory-profiling forward, which must be prefills from position 0).
        decodes: :class:`DecodeBatch` or None. prefills: :class:`PrefillChunk` per chunk.
        max_position: largest position in the step (sizes the rotary table without a
            device sync).
    """

    slot_mapping: torch.Tensor | None
    max_position: int = 0
    decodes: DecodeBatch | None = None
    prefills: list = field(default_factory=list)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    meta: AttentionMetadata, kv_store, layer: int) -> torch.Tensor:
    """Attention output ``[T, heads, head_dim]`` for ``q [T, heads, head_dim]`` and the
    step's new ``k, v [T, kv_heads, head_dim]`` (see module docstring)."""
    if meta.slot_mapping is not None:   # None: a forward with no cache slots (warm-ups)
        kv_store.write(layer, meta.slot_mapping, k, v)
    out = torch.empty_like(q)
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    group = n_heads // n_kv
    scale = head_dim ** -0.5
    if meta.decodes is not None:
        d = meta.decodes
        out[d.start:d.start + d.n] = _decode_attention(
            q[d.start:d.start + d.n], d, kv_store, layer, n_kv, group, scale)
    for c in meta.prefills:
        qc = q[c.start:c.start + c.n]
        if c.c0 == 0:
            qc, kc, vc = (x[c.start:c.start + c.n] for x in (q, k, v))
            if c.rows > c.n:
                qc, kc, vc = (F.pad(x, (0, 0, 0, 0, 0, c.rows - c.n)) for x in (qc, kc, vc))
            o = F.scaled_dot_product_attention(*(x.transpose(0, 1).unsqueeze(0)
                                                 for x in (qc, kc, vc)),
                                               is_causal=True, enable_gqa=group > 1)
        else:
            nq, nk = c.mask.shape
            if nq > c.n:
                qc = F.pad(qc, (0, 0, 0, 0, 0, nq - c.n))
            kc, vc = kv_store.gather(layer, c.blocks)               # [blocks, kv, bs, d]
            kc, vc = (x.transpose(0, 1).reshape(n_kv, -1, head_dim)[:, :nk].unsqueeze(0)
                      for x in (kc, vc))
            o = F.scaled_dot_product_attention(qc.transpose(0, 1).unsqueeze(0), kc, vc,
                                               attn_mask=c.mask, enable_gqa=group > 1)
        out[c.start:c.start + c.n] = o[0, :, :c.n].transpose(0, 1)
    return out


def _decode_attention(q: torch.Tensor, d: DecodeBatch, kv_store, layer: int, n_kv: int,
                      group: int, scale: float) -> torch.Tensor:
    """Split-K attention of ``q [n, heads, head_dim]`` (one query per decode) over the
    blocks of :class:`DecodeBatch` ``d``; returns ``[n, heads, head_dim]`` in ``q``'s dtype.

    Per request ``r`` with blocks ``b``: ``m_r = max_b max(s_b)``, ``l_r = Σ_b Σ exp(s_b −
    m_r)``, ``o_r = Σ_b exp(s_b − m_r) · V_b / l_r`` (the softmax over the whole context,
    computed in float32; the products with V run in the cache's dtype).
    """
    n, n_heads, head_dim = q.shape
    pieces = d.piece_req.numel()
    kc, vc = kv_store.gather(layer, d.blocks)                      # [pieces, kv, bs, d]
    qp = q.view(n, n_kv, group, head_dim).index_select(0, d.piece_req)
    s = torch.matmul(qp, kc.transpose(-1, -2)).float()             # [pieces, kv, group, bs]
    s = s.mul_(scale).add_(d.mask)
    idx = d.piece_req.view(pieces, 1, 1).expand(pieces, n_kv, group)
    m = s.new_full((n, n_kv, group), float("-inf")).scatter_reduce_(
        0, idx, s.amax(dim=-1), "amax", include_self=True)
    s = s.sub_(m.index_select(0, d.piece_req).unsqueeze(-1)).exp_()
    denom = s.new_zeros((n, n_kv, group)).index_add_(0, d.piece_req, s.sum(dim=-1))
    o = torch.matmul(s.to(q.dtype), vc)                             # [pieces, kv, group, d]
    acc = s.new_zeros((n, n_kv, group, head_dim)).index_add_(0, d.piece_req, o.float())
    return acc.div_(denom.unsqueeze(-1)).to(q.dtype).view(n, n_heads, head_dim)
