"""Split-K decode attention (calibration/engine/attention.py) against dense attention.

The reference is plain softmax attention in float64 over each request's own context, read
straight from the K/V the test wrote (no block tables, no pieces); the engine's path pieces
the same contexts (one partition per block) through the runner's block tables and must
agree in float32.
"""

import math

import pytest
import torch

from calibration.engine import runner as runner_mod
from calibration.engine.attention import paged_attention
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
    """One partition per block of each decode's context; padding only in the last block."""
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
    assert [int((d.piece_req == i).sum()) for i in range(len(ctxs))] == [1, 2, 3, 5]
    assert d.blocks.tolist() == list(range(1, 12))
    visible = (d.mask.view(-1, 8) == 0).sum(dim=1)
    assert visible.tolist() == [1, 8, 8, 8, 8, 1, 8, 8, 8, 8, 8]
