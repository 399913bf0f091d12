"""Paged KV storage: one K and one V tensor per layer, indexed by block id.

The block ids are the ones :class:`simulator.policy.KVCacheManager` hands out; block 0 is
the null block (never written; padding in gathered block tables points at it). A token at
position ``p`` of a request lives in slot ``block_ids[p // block_size] * block_size +
p % block_size`` (vLLM's slot mapping).

Memory is block-major, ``[num_blocks, kv_heads, block_size, head_dim]`` (vLLM's CPU
attention layout): a block's keys of all heads are one contiguous run, so gathering a step's
block tables is one row copy per block, and the gathered ``[blocks, kv_heads, block_size,
head_dim]`` is the batch a per-block matmul wants. On a 2-core CPU this gathers a decode
batch's context about twice as fast as a head-major cache gathered along its block dimension
(four short runs per block). :meth:`KVStore.key` / :meth:`KVStore.value` give the logical
``[num_blocks, block_size, kv_heads, head_dim]`` view.
"""

from __future__ import annotations

import math

import torch

from simulator.catalog import kv_bytes_per_token


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes of one KV block over all layers: ``block_size ×``
    :func:`simulator.catalog.kv_bytes_per_token` (vLLM ``AttentionSpec.page_size_bytes`` ×
    layers)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, elem)


class KVStore:
    """K and V tensors for every layer (see module docstring for the layout).

    Args:
        num_layers, num_blocks (incl. the null block), block_size, num_kv_heads, head_dim:
            shapes. dtype, device: where the cache lives.

    Raises:
        ValueError: fewer than 2 blocks.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device="cpu"):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), "
                             f"got {num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Gathers land in one reused workspace (K half, V half), grown on demand: a fresh
        # tensor of tens of MB per layer would be mmapped and page-faulted every time on CPU.
        self._workspace = torch.empty(0, dtype=dtype, device=device)
        self._rows_for = self._rows_cache = None

    @property
    def nbytes(self) -> int:
        """Bytes held by all K and V tensors."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def key(self, layer: int) -> torch.Tensor:
        """Layer's K as ``[num_blocks, block_size, kv_heads, head_dim]`` (a view)."""
        return self.k[layer].transpose(1, 2)

    def value(self, layer: int) -> torch.Tensor:
        """Layer's V as ``[num_blocks, block_size, kv_heads, head_dim]`` (a view)."""
        return self.v[layer].transpose(1, 2)

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Store ``k, v [T, kv_heads, head_dim]`` at ``slot_mapping [T]`` (int64)."""
        rows = self._rows(slot_mapping)
        d = self.head_dim
        self.k[layer].view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
        self.v[layer].view(-1, d).index_copy_(0, rows, v.reshape(-1, d))

    def _rows(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        """Rows ``[T * kv_heads]`` of the ``[num_blocks * kv_heads * block_size, head_dim]``
        view that hold each token's heads: ``(block * kv_heads + head) * block_size +
        offset``. Every layer of a step writes the same slots: computed once per step."""
        if slot_mapping is not self._rows_for:
            h, bs = self.num_kv_heads, self.block_size
            base = (slot_mapping // bs) * (h * bs) + slot_mapping % bs
            heads = torch.arange(h, device=slot_mapping.device) * bs
            self._rows_cache = (base[:, None] + heads[None, :]).reshape(-1)
            self._rows_for = slot_mapping
        return self._rows_cache

    def gather(self, layer: int, block_ids: torch.Tensor):
        """K, V of the blocks ``block_ids [n]``: each ``[n, kv_heads, block_size,
        head_dim]``, copied into a workspace that the next ``gather`` overwrites (use them
        before gathering again; attention does, one layer and one gather at a time)."""
        n = block_ids.numel()
        shape = (n,) + tuple(self.k[layer].shape[1:])
        size = math.prod(shape)
        if self._workspace.numel() < 2 * size:
            self._workspace = torch.empty(max(2 * size, 2 * self._workspace.numel()),
                                          dtype=self._workspace.dtype,
                                          device=self._workspace.device)
        k = self._workspace[:size].view(shape)
        v = self._workspace[size:2 * size].view(shape)
        torch.index_select(self.k[layer], 0, block_ids, out=k)
        torch.index_select(self.v[layer], 0, block_ids, out=v)
        return k, v
