"""Model runner: turns one step's scheduled requests into tensors and runs the model.

Given ``plan.scheduled()`` (decodes first, then prefill chunks), it lays the step's tokens
out flat: single-token entries (decodes, and 1-token chunks) first, in plan order, with
their block tables for split-K attention (:class:`.attention.DecodeBatch`); then each
longer chunk's tokens. It builds the slot
mapping, block tables and masks (:class:`.attention.AttentionMetadata`),
runs the forward under ``torch.inference_mode`` and returns the final hidden states of the
tokens that sample (or of every token, for tests).
"""

from __future__ import annotations

import torch

from simulator.policy.kv_cache import cdiv

from .attention import (AttentionMetadata, causal_chunk, context_chunk, decode_batch,
                        padding)

def token_at(req, p: int) -> int:
    """Token id at position ``p`` of a request (prompt, then output)."""
    n = req.num_prompt_tokens
    return req.prompt_token_ids[p] if p < n else req.output_token_ids[p - n]


class ModelRunner:
    """Executes step plans on a model with a :class:`.kv_store.KVStore`.

    Args:
        model: :class:`.model.Transformer`. kv_store: its paged cache. block_size: tokens
        per block (the scheduler's).
    """

    def __init__(self, model, kv_store, block_size: int):
        self.model, self.kv_store, self.block_size = model, kv_store, block_size
        self.device = model.device

    def prepare(self, entries):
        """Flat inputs for ``entries`` (:class:`simulator.policy.ScheduledRequest`).

        Returns:
            ``(input_ids [T], positions [T], meta, spans)``: ``spans[i] = (start, n)`` is
            entry ``i``'s range of flat tokens.
        """
        bs, dev = self.block_size, self.device
        ids, pos, slots = [], [], []
        spans = [None] * len(entries)
        meta = AttentionMetadata(slot_mapping=None)
        pad = padding(dev)
        contexts = []
        for i, e in enumerate(entries):
            if e.num_new_tokens != 1:
                continue
            r = e.request
            p = e.num_computed_before
            spans[i] = (len(ids), 1)
            ids.append(token_at(r, p))
            pos.append(p)
            slots.append(r.block_ids[p // bs] * bs + p % bs)
            contexts.append((r.block_ids, p + 1))
        if contexts:
            d = decode_batch(contexts, bs, pad)
            d.blocks, d.piece_req, d.mask = d.blocks.to(dev), d.piece_req.to(dev), d.mask.to(dev)
            meta.decodes = d
        for i, e in enumerate(entries):
            n = e.num_new_tokens
            if n == 1:
                continue
            r, c0 = e.request, e.num_computed_before
            start = len(ids)
            spans[i] = (start, n)
            np_ = r.num_prompt_tokens
            if c0 + n <= np_:
                ids.extend(r.prompt_token_ids[c0:c0 + n])
            else:
                ids.extend(r.all_token_ids()[c0:c0 + n])
            p = torch.arange(c0, c0 + n)
            pos.append(p)
            blocks = torch.tensor(r.block_ids[:cdiv(c0 + n, bs)])
            slots.append(blocks[p // bs] * bs + p % bs)
            if c0 > 0:
                c = context_chunk(start, n, c0, r.block_ids, bs, pad)
                c.blocks, c.mask = c.blocks.to(dev), c.mask.to(dev)
            else:
                c = causal_chunk(start, n, pad)
            meta.prefills.append(c)
        positions = _cat_ints(pos)
        meta.slot_mapping = _cat_ints(slots).to(dev)
        meta.max_position = int(positions.max()) if positions.numel() else 0
        return torch.tensor(ids, device=dev), positions.to(dev), meta, spans

    @torch.inference_mode()
    def execute(self, entries, all_tokens: bool = False):
        """Run one step.

        Returns:
            ``(hidden, rows)``: with ``all_tokens`` false, ``hidden [S, hidden]`` holds the
            last token of each entry that samples, ``rows[i]`` is entry ``i``'s row or
            ``None``; with ``all_tokens``, ``hidden`` holds every flat token and
            ``rows[i] = (start, n)``.
        """
        input_ids, positions, meta, spans = self.prepare(entries)
        hidden = self.model(input_ids, positions, meta, self.kv_store)
        if all_tokens:
            return hidden, spans
        rows, take = [], []
        for e, (start, n) in zip(entries, spans):
            if e.samples_token:
                rows.append(len(take))
                take.append(start + n - 1)
            else:
                rows.append(None)
        if len(take) == hidden.shape[0]:
            return hidden, rows
        return hidden[torch.tensor(take, dtype=torch.long, device=hidden.device)], rows


def _cat_ints(parts) -> torch.Tensor:
    """Concatenate ints and 1-D int64 tensors, in order, into one int64 tensor."""
    out, run = [], []
    for x in parts:
        if isinstance(x, torch.Tensor):
            if run:
                out.append(torch.tensor(run, dtype=torch.int64))
                run = []
            out.append(x)
        else:
            run.append(x)
    if run:
        out.append(torch.tensor(run, dtype=torch.int64))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)
