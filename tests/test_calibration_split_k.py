"""Split-K decode attention and padded prefill chunks (from position 0 and after cached
tokens; calibration/engine/attention.py) against dense attention.

The reference is plain softmax attention in float64 over each request's own context, read
straight from the K/V the test wrote (no block tables, no pieces); the engine's path pieces
the same contexts (one partition per block) through the runner's block tables and must
agree in float32.
"""

import math

import pytest
import torch

from calibration.engine import runner as runner_mod
from calibration.engine.attention import (AttentionMetadata, Padding, causal_chunk,
                                          context_chunk, paged_attention)
from calibration.engine.kv_store import KVStore

KV_HEADS, HEADS, HEAD_DIM = 2, 4, 8


class _Req:
    def __init__(self, ctx, block_ids):
        self.num_prompt_tokens = ctx + 1
        self.prompt_token_ids = [1] * (ctx + 1)
        self.block_ids = block_ids


class _Entry:
    def __init__(self, req, ctx):
        self.request, self.num_new_tokens, self.num_computed_before = req, 1, ctx - 1


class _Model:
    device = torch.device("cpu")


@pytest.mark.parametrize("BS", [2, 4, 8])
def test_split_k_matches_dense_attention(BS):
    # Contexts: one token, exactly one block, block boundaries, ragged lengths.
    ctxs = [1, 4, 8, 9, 13, 24, 31]
    g = torch.Generator().manual_seed(0)
    store = KVStore(1, 64, BS, KV_HEADS, HEAD_DIM, torch.float32)
    store.k[0].copy_(torch.randn(store.k[0].shape, generator=g))
    store.v[0].copy_(torch.randn(store.v[0].shape, generator=g))
    free = torch.randperm(63, generator=g).add(1).tolist()  # scattered blocks, never 0
    entries = []
    for c in ctxs:
        nb = -(-c // BS)
        entries.append(_Entry(_Req(c, [free.pop() for _ in range(nb)]), c))
    run = runner_mod.ModelRunner(_Model(), store, BS)
    _, _, meta, spans = run.prepare(entries)
    meta.slot_mapping = None
    n = len(ctxs)
    q = torch.randn(n, HEADS, HEAD_DIM, generator=g)

    class _NoWrite:  # keep the written K/V as they are: the test reads them back itself
        def __init__(self, s):
            self.s = s

        def write(self, *a):
            pass

        def gather(self, layer, ids):
            return self.s.gather(layer, ids)

    out = paged_attention(q, q[:, :KV_HEADS], q[:, :KV_HEADS], meta, _NoWrite(store), 0)
    key, val = store.key(0).double(), store.value(0).double()   # [blocks, bs, kv, d]
    group = HEADS // KV_HEADS
    for i, (e, c) in enumerate(zip(entries, ctxs)):
        row = spans[i][0]
        pos = torch.arange(c)
        blocks = torch.tensor(e.request.block_ids)[pos // BS]
        k = key[blocks, pos % BS]                                  # [c, kv, d]
        v = val[blocks, pos % BS]
        for h in range(HEADS):
            kh = h // group
            s = (k[:, kh] @ q[row, h].double()) / math.sqrt(HEAD_DIM)
            want = torch.softmax(s, 0) @ v[:, kh]
            assert torch.allclose(out[row, h].double(), want, atol=1e-5), (c, h)


def test_pieces_cover_each_context_once():
    """One partition per block of each decode's context, keys past the context masked in its
    last block; on CPU the 11 blocks are padded to 16 (CPU_PADDING.pieces) with the null
    block 0, owned by decode 0, every key masked."""
    ctxs = [1, 16, 17, 40]
    store = KVStore(1, 32, 8, 1, 4, torch.float32)
    entries, nxt = [], 1
    for c in ctxs:
        nb = -(-c // 8)
        entries.append(_Entry(_Req(c, list(range(nxt, nxt + nb))), c))
        nxt += nb
    run = runner_mod.ModelRunner(_Model(), store, 8)
    _, _, meta, _ = run.prepare(entries)
    d = meta.decodes
    assert d.piece_req.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3] + [0] * 5
    assert d.blocks.tolist() == list(range(1, 12)) + [0] * 5
    visible = (d.mask.view(-1, 8) == 0).sum(dim=1)
    assert visible.tolist() == [1, 8, 8, 8, 8, 1, 8, 8, 8, 8, 8] + [0] * 5


def test_context_chunk_pads_queries_and_keys_by_hand():
    """3 queries after 2 cached tokens, padded to (4 rows, 8 keys), blocks of 2: query i
    (position 2+i) sees keys 0..2+i of the 5 real ones; the padded row sees all 5; the 8
    keys take 4 blocks, the last real block (30) repeated for the padding."""
    c = context_chunk(7, 3, 2, [10, 20, 30, 40], 2, Padding(query_rows=4, keys=8))
    assert (c.start, c.n, c.c0) == (7, 3, 2)
    assert c.blocks.tolist() == [10, 20, 30, 30]
    assert c.mask.int().tolist() == [[1, 1, 1, 0, 0, 0, 0, 0],
                                     [1, 1, 1, 1, 0, 0, 0, 0],
                                     [1, 1, 1, 1, 1, 0, 0, 0],
                                     [1, 1, 1, 1, 1, 0, 0, 0]]
    same = context_chunk(0, 3, 2, [10, 20, 30, 40], 2)          # no padding
    assert same.blocks.tolist() == [10, 20, 30] and same.mask.shape == (3, 5)


@pytest.mark.parametrize("n,c0,pad", [(1, 5, (32, 64)), (13, 32, (32, 64)), (40, 90, (32, 64)),
                                      (32, 32, (32, 64)), (7, 9, (4, 8)), (13, 32, (1, 1))])
def test_padded_context_chunk_matches_dense_attention(n, c0, pad):
    """A chunk of ``n`` queries after ``c0`` cached tokens, padded or not, gives float64
    softmax attention over keys ``0 .. c0+i`` for query ``i``, read back from the cache."""
    BS = 8
    g = torch.Generator().manual_seed(n + c0)
    store = KVStore(1, 40, BS, KV_HEADS, HEAD_DIM, torch.float32)
    store.k[0].copy_(torch.randn(store.k[0].shape, generator=g))
    store.v[0].copy_(torch.randn(store.v[0].shape, generator=g))
    ctx = c0 + n
    blocks = (torch.randperm(39, generator=g) + 1)[:-(-ctx // BS)].tolist()
    q = torch.randn(n + 3, HEADS, HEAD_DIM, generator=g)     # 3 other tokens before it
    chunk = context_chunk(3, n, c0, blocks, BS, Padding(query_rows=pad[0], keys=pad[1]))
    meta = AttentionMetadata(slot_mapping=None, prefills=[chunk])
    out = paged_attention(q, q[:, :KV_HEADS], q[:, :KV_HEADS], meta, store, 0)
    key, val = store.key(0).double(), store.value(0).double()   # [blocks, bs, kv, d]
    pos = torch.arange(ctx)
    idx = torch.tensor(blocks)[pos // BS]
    k, v = key[idx, pos % BS], val[idx, pos % BS]                 # [ctx, kv, d]
    group = HEADS // KV_HEADS
    for i in range(n):
        for h in range(HEADS):
            s_ = (k[:c0 + i + 1, h // group] @ q[3 + i, h].double()) / math.sqrt(HEAD_DIM)
            want = torch.softmax(s_, 0) @ v[:c0 + i + 1, h // group]
            assert torch.allclose(out[3 + i, h].double(), want, atol=1e-5), (i, h)


def test_causal_chunk_pads_its_rows_to_the_multiple():
    assert [causal_chunk(5, n, Padding(causal_rows=32)).rows for n in (1, 31, 32, 33, 250)] \
        == [32, 32, 32, 64, 256]
    c = causal_chunk(5, 7)                                       # no padding
    assert (c.start, c.n, c.c0, c.rows, c.blocks, c.mask) == (5, 7, 0, 7, None, None)


@pytest.mark.parametrize("n,rows", [(1, 32), (13, 32), (32, 32), (45, 64), (45, 8), (45, 1)])
def test_padded_causal_chunk_matches_dense_attention(n, rows):
    """A chunk of ``n`` queries from position 0, run on ``rows`` padded rows or unpadded,
    gives float64 softmax attention over the chunk's keys ``0 .. i`` for query ``i`` (three
    tokens before it and one after, none of them seen)."""
    g = torch.Generator().manual_seed(n + rows)
    T = n + 4
    q, k, v = (torch.randn(T, heads, HEAD_DIM, generator=g)
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    meta = AttentionMetadata(slot_mapping=None,
                             prefills=[causal_chunk(3, n, Padding(causal_rows=rows))])
    out = paged_attention(q, k, v, meta, None, 0)
    group = HEADS // KV_HEADS
    for i in range(n):
        for h in range(HEADS):
            kk, vv = k[3:3 + i + 1, h // group].double(), v[3:3 + i + 1, h // group].double()
            want = torch.softmax(kk @ q[3 + i, h].double() / math.sqrt(HEAD_DIM), 0) @ vv
            assert torch.allclose(out[3 + i, h].double(), want, atol=1e-5), (i, h)
