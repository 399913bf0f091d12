"""Paged KV cache bookkeeping: block pool and KV cache manager (no tensors).

Semantics follow vLLM V1 (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``):

* Fixed ``block_size``; block 0 is the null block and is never handed out, so usable
  blocks = ``num_gpu_blocks - 1`` and usage = ``1 - free / (num_gpu_blocks - 1)``.
* Free blocks sit in an LRU queue. Freed blocks go to the *tail* in the order given (a
  request frees its blocks in reverse, so its deepest block is evicted first); allocation
  pops the *head* and evicts that block's hash lazily, only then.
* A full block's hash is registered as soon as the block is full of *scheduled* tokens, in
  the same allocation call, so a request admitted later in the same step can hit it.
* Admission of a request with prefix hits needs ``new blocks + hit blocks that are
  currently free (ref_cnt 0) <= free blocks``: touching a free hit block takes it out of
  the free queue.

The real engine stores K/V tensors indexed by the block ids handed out here.
"""

from __future__ import annotations

from collections import OrderedDict

from .request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


class BlockPool:
    """Block ids, reference counts, the LRU free queue and the prefix-cache hash map.

    Args:
        num_gpu_blocks: total blocks including the null block 0; ``None`` means unlimited
            (blocks are created on demand and cached blocks are never evicted).

    Raises:
        ValueError: fewer than 2 blocks.
    """

    def __init__(self, num_gpu_blocks: int | None):
        self.unlimited = num_gpu_blocks is None
        if not self.unlimited and num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is reserved), "
                             f"got {num_gpu_blocks}")
        n = 1 if self.unlimited else num_gpu_blocks
        self.num_gpu_blocks = num_gpu_blocks
        self.ref_cnt: list[int] = [0] * n
        self.block_hash: list[bytes | None] = [None] * n
        # OrderedDict as an O(1) doubly linked free list: head = next to allocate.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, n))
        self.cached: dict[bytes, dict[int, None]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now (unlimited: a very large number)."""
        if self.unlimited:
            return 1 << 62
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0 for an unlimited pool)."""
        if self.unlimited:
            return 0.0
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The first block registered under ``block_hash``, or ``None``."""
        blocks = self.cached.get(block_hash)
        if not blocks:
            return None
        return next(iter(blocks))

    def touch(self, block_ids) -> None:
        """Take a reference on hit blocks, removing free ones from the free queue."""
        ref, free = self.ref_cnt, self.free_queue
        for b in block_ids:
            if ref[b] == 0 and b in free:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their hashes.

        Raises:
            RuntimeError: fewer than ``n`` free blocks (callers check first).
        """
        if self.unlimited:
            return self._allocate_unlimited(n)
        free = self.free_queue
        if n > len(free):
            raise RuntimeError(f"need {n} blocks, {len(free)} free")
        out = []
        ref, block_hash, cached = self.ref_cnt, self.block_hash, self.cached
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = block_hash[b]
            if h is not None:  # lazy eviction: only now does the block lose its hash
                same = cached[h]
                del same[b]
                if not same:
                    del cached[h]
                block_hash[b] = None
            ref[b] = 1
            out.append(b)
        return out

    def _allocate_unlimited(self, n: int) -> list[int]:
        # Reuse freed blocks without a hash; cached blocks are kept forever.
        out = []
        free = self.free_queue
        while free and len(out) < n:
            b, _ = free.popitem(last=False)
            self.ref_cnt[b] = 1
            out.append(b)
        extra = n - len(out)
        if extra:
            start = len(self.ref_cnt)
            self.ref_cnt.extend([1] * extra)
            self.block_hash.extend([None] * extra)
            out.extend(range(start, start + extra))
        return out

    def free_blocks(self, block_ids) -> None:
        """Drop one reference on each block; blocks reaching 0 join the queue tail in order."""
        ref, free = self.ref_cnt, self.free_queue
        keep_cached = self.unlimited
        for b in block_ids:
            ref[b] -= 1
            if ref[b] == 0 and not (keep_cached and self.block_hash[b] is not None):
                free[b] = None

    def cache_blocks(self, block_ids, hashes) -> None:
        """Register full blocks under their hashes; a block is registered once."""
        block_hash, cached = self.block_hash, self.cached
        for b, h in zip(block_ids, hashes):
            if block_hash[b] is None:
                block_hash[b] = h
                same = cached.get(h)
                if same is None:
                    cached[h] = {b: None}
                else:
                    same[b] = None

    def num_used_blocks(self) -> int:
        """Blocks with ``ref_cnt > 0`` (null block excluded)."""
        return sum(1 for c in self.ref_cnt[1:] if c > 0)


class KVCacheManager:
    """Allocates blocks to requests and looks up prefix-cache hits.

    Args:
        num_gpu_blocks: blocks in the cache incl. the null block (``None`` = unlimited).
        block_size: tokens per block (vLLM default 16).
        enable_prefix_caching: look up and register block hashes (vLLM V1 default on).
    """

    def __init__(self, num_gpu_blocks: int | None, block_size: int = 16,
                 enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_gpu_blocks)

    @property
    def usage(self) -> float:
        """KV cache usage in [0, 1] (vLLM ``kv_cache_usage``)."""
        return self.pool.usage

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Longest prefix-cache hit of full blocks, never covering the last token.

        Returns:
            (hit block ids, hit tokens); hit tokens are a multiple of ``block_size`` and
            ``< req.num_tokens`` (the last token is always recomputed so a token can be
            sampled, vLLM ``get_computed_blocks``).
        """
        if not self.enable_prefix_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        pool = self.pool
        hits = []
        for i in range(max_blocks):
            b = pool.get_cached_block(req.block_hash(i, bs))
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * bs

    def allocate_slots(self, req: Request, num_tokens: int,
                       new_computed_blocks=()) -> list[int] | None:
        """Make ``req`` hold blocks for its first ``num_tokens`` tokens.

        ``num_tokens`` = computed tokens (incl. prefix hits) + tokens scheduled now.
        Blocks that become full of scheduled tokens are registered in the prefix cache.

        Returns:
            The newly allocated block ids, or ``None`` (nothing changed) when the free
            blocks cannot cover new blocks plus the free hit blocks.
        """
        pool = self.pool
        bs = self.block_size
        num_held = len(req.block_ids) + len(new_computed_blocks)
        need = cdiv(num_tokens, bs) - num_held
        if need < 0:
            need = 0
        if not pool.unlimited:
            evictable = 0
            for b in new_computed_blocks:
                if pool.ref_cnt[b] == 0:
                    evictable += 1
            if need + evictable > len(pool.free_queue):
                return None
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            req.block_ids.extend(new_computed_blocks)
            req.num_registered_blocks = len(req.block_ids)
        new = pool.allocate(need) if need else []
        if new:
            req.block_ids.extend(new)
        if self.enable_prefix_caching:
            full = min(num_tokens, req.num_tokens) // bs
            start = req.num_registered_blocks
            if full > start:
                hashes = req.block_hashes(full, bs)
                pool.cache_blocks(req.block_ids[start:full], hashes[start:full])
                req.num_registered_blocks = full
        return new

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks, deepest first (vLLM ``free``)."""
        if req.block_ids:
            self.pool.free_blocks(reversed(req.block_ids))
        req.block_ids = []
        req.num_registered_blocks = 0
