"""Paged KV cache bookkeeping: block pool and KV cache manager (no tensors).

Semantics follow vLLM V1 (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``):

* Fixed ``block_size``; block 0 is the null block and is never handed out, so usable
  blocks = ``num_gpu_blocks - 1`` and usage = ``1 - free / (num_gpu_blocks - 1)``.
* Free blocks sit in an LRU queue. A request frees its blocks in reverse (its deepest
  first); those vLLM has hashed go to the *tail* in that order (LRU eviction), the others
  (never hit: the last partial block, or every block with prefix caching off) to the
  *head*, so they are reused first (vLLM 0.32 ``BlockPool.free_blocks``). Allocation pops
  the head and evicts that block's hash lazily, only then.
* A full block's hash is registered as soon as the block is full of *scheduled* tokens, in
  the same allocation call, so a request admitted later in the same step can hit it.
* Admission of a request with prefix hits needs ``new blocks + hit blocks that are
  currently free (ref_cnt 0) <= free blocks``: touching a free hit block takes it out of
  the free queue.

The real engine stores K/V tensors indexed by the block ids handed out here.
"""

from __future__ import annotations

import random

from .request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


#: vLLM's default share of device memory for one engine: weights, activations and the KV
#: cache (``CacheConfig.gpu_memory_utilization``, ``vllm/config/cache.py``, 0.92 in vLLM
#: 0.32, 0.9 in earlier releases).
GPU_MEMORY_UTILIZATION = 0.92


def min_gpu_blocks(max_model_len: int, block_size: int) -> int:
    """The fewest ``num_gpu_blocks`` that hold one request of ``max_model_len`` tokens: its
    blocks plus the null block (vLLM refuses to start with fewer)."""
    return cdiv(max_model_len, block_size) + 1


def blocks_in_budget(budget_bytes: int, block_bytes: int) -> int:
    """KV blocks that fit ``budget_bytes`` bytes, each block ``block_bytes`` bytes
    (``block_size`` tokens × KV bytes per token); 0 for a budget of 0 or less.

    vLLM's ``num_gpu_blocks = available_kv_cache_memory // page_size_bytes``
    (``vllm/v1/core/kv_cache_utils.py``). The block count includes the null block.
    """
    return max(0, int(budget_bytes // block_bytes))


class BlockPool:
    """Block ids, reference counts, the LRU free queue and the prefix-cache hash map.

    The free queue is a list read from a head index (allocation takes a slice, freeing
    extends it), so bookkeeping costs a few C-level operations per block. A block taken
    out of the middle of the queue (a prefix hit on a free block) leaves a *stale* entry
    behind, counted in ``_stale[b]``: stale entries of a block always precede its live one,
    so the head skips the first ``_stale[b]`` entries of ``b`` it meets.

    Blocks freed to the head sit before everything else in ``_front``, a stack (the next to
    allocate at its end). Blocks never handed out (the last ``_fresh_left`` ids) follow, in
    id order, as in vLLM's initial free list, without being listed: ``ref_cnt`` and
    ``block_hash`` grow as they are first handed out, so an idle replica costs no memory per
    block (thousands of replicas of 16k blocks each).

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
        self.num_gpu_blocks = num_gpu_blocks
        self.ref_cnt: list[int] = [0]                 # by block id, handed-out ids only
        self.block_hash: list[bytes | None] = [None]
        self._fresh_left = 0 if self.unlimited else num_gpu_blocks - 1
        self._front: list[int] = []   # freed to the head: allocated first, from the end
        self._queue: list[int] = []   # freed blocks; live entries from _head on
        self._head = 0
        self._stale: dict[int, int] = {}   # block -> stale entries of it in the queue
        self._num_stale = 0
        self._num_free = self._fresh_left
        self._extra_refs = 0   # sum over blocks of ref_cnt - 1 where ref_cnt >= 2
        self.cached: dict[bytes, dict[int, None]] = {}

    @property
    def free_queue(self) -> list[int]:
        """The free blocks, head (next to allocate) first (O(queue); for tests)."""
        start = len(self.ref_cnt)
        out, seen = self._front[::-1] + list(range(start, start + self._fresh_left)), \
            dict(self._stale)
        for b in self._queue[self._head:]:
            if seen.get(b):
                seen[b] -= 1
            else:
                out.append(b)
        return out

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now (unlimited: a very large number)."""
        if self.unlimited:
            return 1 << 62
        return self._num_free

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0 for an unlimited pool)."""
        if self.unlimited:
            return 0.0
        return 1.0 - self._num_free / (self.num_gpu_blocks - 1)

    @property
    def extra_refs(self) -> int:
        """References beyond the first, over all blocks: sum of ``ref_cnt - 1`` over blocks
        held by two or more requests (0 when no block is shared). O(1): kept as references
        are taken and dropped."""
        return self._extra_refs

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The first block registered under ``block_hash``, or ``None``."""
        blocks = self.cached.get(block_hash)
        if not blocks:
            return None
        return next(iter(blocks))

    def touch(self, block_ids) -> None:
        """Take a reference on hit blocks, removing free ones from the free queue."""
        ref = self.ref_cnt
        for b in block_ids:
            c = ref[b]
            if c == 0:
                # Free (a hit block has a hash, so an unlimited pool never queued it).
                if not self.unlimited:
                    self._stale[b] = self._stale.get(b, 0) + 1
                    self._num_stale += 1
                    self._num_free -= 1
            else:
                self._extra_refs += 1
            ref[b] = c + 1

    def _fresh(self, n: int) -> list[int]:
        """Hand out the next ``n`` never-used blocks (``ref_cnt`` 1, no hash to evict)."""
        start = len(self.ref_cnt)
        self.ref_cnt.extend([1] * n)
        self.block_hash.extend([None] * n)
        self._fresh_left -= n
        return list(range(start, start + n))

    def _pop(self, n: int) -> list[int]:
        """The ``n`` blocks at the head of the free queue, skipping stale entries."""
        q, h = self._queue, self._head
        if not self._num_stale:
            out = q[h:h + n]
            h += n
        else:
            out, stale = [], self._stale
            while len(out) < n:
                b = q[h]
                h += 1
                k = stale.get(b)
                if k:
                    if k == 1:
                        del stale[b]
                    else:
                        stale[b] = k - 1
                    self._num_stale -= 1
                else:
                    out.append(b)
        if h > 4096 and h * 2 > len(q):
            del q[:h]
            h = 0
        self._head = h
        return out

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their hashes.

        Raises:
            RuntimeError: fewer than ``n`` free blocks (callers check first).
        """
        if self.unlimited:
            return self._allocate_unlimited(n)
        if n > self._num_free:
            raise RuntimeError(f"need {n} blocks, {self._num_free} free")
        self._num_free -= n
        head = self._take_front(n) if self._front else None
        if head:
            n -= len(head)
            if not n:
                return head
        if self._fresh_left:   # they head the listed queue
            fresh = self._fresh(min(n, self._fresh_left))
            head = head + fresh if head else fresh
            n -= len(fresh)
            if not n:
                return head
        out = self._pop(n)
        ref = self.ref_cnt
        if self.cached:
            block_hash, cached = self.block_hash, self.cached
            for b in out:
                ref[b] = 1
                h = block_hash[b]
                if h is not None:  # lazy eviction: only now does the block lose its hash
                    same = cached[h]
                    del same[b]
                    if not same:
                        del cached[h]
                    block_hash[b] = None
        else:
            for b in out:
                ref[b] = 1
        return head + out if head else out

    def _take_front(self, n: int) -> list[int]:
        """Up to ``n`` blocks from the head stack (no hash to evict), ``ref_cnt`` 1."""
        front = self._front
        k = min(n, len(front))
        if k <= 0:   # del front[-0:] would empty it
            return []
        out = front[:-k - 1:-1]
        del front[-k:]
        ref = self.ref_cnt
        for b in out:
            ref[b] = 1
        return out

    def allocate_one(self) -> int:
        """Pop one block (:meth:`allocate` for ``n = 1``, without building a list).

        Raises:
            RuntimeError: no free block (callers check first).
        """
        if self.unlimited or self._num_stale:
            return self.allocate(1)[0]
        if not self._num_free:
            raise RuntimeError("need 1 block, 0 free")
        if self._front:
            b = self._front.pop()
            self._num_free -= 1
            self.ref_cnt[b] = 1
            return b
        if self._fresh_left:
            self._num_free -= 1
            return self._fresh(1)[0]
        h = self._head
        b = self._queue[h]
        self._head = h + 1
        self._num_free -= 1
        self.ref_cnt[b] = 1
        if self.cached:
            bh = self.block_hash[b]
            if bh is not None:
                same = self.cached[bh]
                del same[b]
                if not same:
                    del self.cached[bh]
                self.block_hash[b] = None
        return b

    def _allocate_unlimited(self, n: int) -> list[int]:
        # Reuse freed blocks without a hash; cached blocks are kept forever.
        take = min(n, self._num_free)
        self._num_free -= take
        out = self._take_front(take) if self._front else []
        if take > len(out):
            out += self._pop(take - len(out))
        ref = self.ref_cnt
        for b in out:
            ref[b] = 1
        extra = n - take
        if extra:
            start = len(ref)
            ref.extend([1] * extra)
            self.block_hash.extend([None] * extra)
            out.extend(range(start, start + extra))
        return out

    def scatter(self, seed: int = 0) -> None:
        """Put the free queue in a random order (``random.Random(seed).shuffle``), as the
        queue of a server that has run a while: its requests free blocks in the order they
        finish, so a new request's block table lands on blocks spread over the cache instead
        of a fresh pool's consecutive ids. Only the order changes: the same blocks stay free
        and cached free blocks keep their hashes.

        For measuring the real engine on a long-served pool's layout (on a CPU a step
        reading scattered blocks runs up to ~10% slower: ``benchmarks/kv_layout.py``); the
        simulator never calls it (block ids do not change a step's price).

        Raises:
            ValueError: an unlimited pool (it has no queue to order).
        """
        if self.unlimited:
            raise ValueError("an unlimited pool has no free queue to scatter")
        queue = self.free_queue
        random.Random(seed).shuffle(queue)
        n = self._fresh_left   # never handed out: listed from now on, in the shuffled queue
        self.ref_cnt.extend([0] * n)
        self.block_hash.extend([None] * n)
        self._fresh_left = 0
        self._front = []
        self._queue, self._head = queue, 0
        self._stale.clear()
        self._num_stale = 0

    def free_blocks(self, block_ids) -> None:
        """Drop one reference on each block; blocks reaching 0 join the queue tail in order."""
        ref = self.ref_cnt
        if not isinstance(block_ids, list):
            block_ids = list(block_ids)
        if not self._extra_refs and not self.unlimited:
            for b in block_ids:
                ref[b] = 0
            self._queue.extend(block_ids)
            self._num_free += len(block_ids)
            return
        q = self._queue
        keep_cached = self.unlimited
        block_hash = self.block_hash
        for b in block_ids:
            c = ref[b] - 1
            ref[b] = c
            if c == 0:
                if not (keep_cached and block_hash[b] is not None):
                    q.append(b)
                    self._num_free += 1
            else:
                self._extra_refs -= 1

    def free_blocks_first(self, block_ids) -> None:
        """Drop one reference on each block; blocks reaching 0 join the queue *head*, the
        first given allocated first (vLLM ``free_blocks``: blocks without a hash, which no
        request can hit, are reused first)."""
        ref, out = self.ref_cnt, []
        for b in block_ids:
            c = ref[b] - 1
            ref[b] = c
            if c == 0:
                out.append(b)
            else:
                self._extra_refs -= 1
        out.reverse()
        self._front.extend(out)
        self._num_free += len(out)

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
        if not self.enable_prefix_caching or (req.cache_private and not req.num_preemptions):
            # A private request's content starts no other request, so before it has been
            # preempted no cached block can hold its tokens.
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

    def _new_blocks(self, req: Request, num_tokens: int, new_computed_blocks,
                    keep_free: int = 0) -> tuple:
        """``(blocks to allocate, fits)`` for ``req``'s first ``num_tokens`` tokens: the
        blocks it lacks beyond those it holds and the hit blocks ``new_computed_blocks``;
        they fit when the free blocks cover them plus the hit blocks that are free (taking
        one out of the free queue uses it up) plus ``keep_free`` (the watermark's blocks),
        as vLLM ``KVCacheManager.allocate_slots`` counts them."""
        pool = self.pool
        need = max(0, cdiv(num_tokens, self.block_size) - len(req.block_ids)
                   - len(new_computed_blocks))
        if pool.unlimited:
            return need, True
        evictable = 0
        for b in new_computed_blocks:
            if pool.ref_cnt[b] == 0:
                evictable += 1
        return need, need + evictable + keep_free <= pool._num_free

    def fits(self, req: Request, num_tokens: int, new_computed_blocks=(),
             keep_free: int = 0) -> bool:
        """Whether :meth:`allocate_slots` would succeed for these arguments (it changes
        nothing): vLLM's ``full_sequence_must_fit`` check at admission."""
        return self._new_blocks(req, num_tokens, new_computed_blocks, keep_free)[1]

    def allocate_slots(self, req: Request, num_tokens: int,
                       new_computed_blocks=(), keep_free: int = 0) -> list[int] | None:
        """Make ``req`` hold blocks for its first ``num_tokens`` tokens.

        ``num_tokens`` = computed tokens (incl. prefix hits) + tokens scheduled now.
        Blocks that become full of scheduled tokens are registered in the prefix cache
        (for a :attr:`~simulator.policy.Request.cache_private` request only when it is
        preempted, see :meth:`free`: until then no other request can look them up).

        ``keep_free`` blocks must stay free besides (vLLM's watermark, for an admission
        while others run).

        Returns:
            The newly allocated block ids, or ``None`` (nothing changed) when the free
            blocks cannot cover new blocks plus the free hit blocks plus ``keep_free``.
        """
        pool = self.pool
        bs = self.block_size
        need, ok = self._new_blocks(req, num_tokens, new_computed_blocks, keep_free)
        if not ok:
            return None
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            req.block_ids.extend(new_computed_blocks)
            req.num_registered_blocks = req.num_hashed_blocks = len(req.block_ids)
        new = pool.allocate(need) if need else []
        if new:
            req.block_ids.extend(new)
        if self.enable_prefix_caching:
            full = min(num_tokens, req.num_tokens) // bs
            start = req.num_registered_blocks
            if full > start:
                req.num_registered_blocks = full
                if not req.cache_private:
                    self._register(req)
        return new

    def _register(self, req: Request) -> None:
        """Put ``req``'s registered-but-unhashed full blocks into the prefix cache."""
        start, full = req.num_hashed_blocks, req.num_registered_blocks
        if full > start:
            hashes = req.block_hashes(full, self.block_size)
            self.pool.cache_blocks(req.block_ids[start:full], hashes[start:full])
            req.num_hashed_blocks = full

    def free(self, req: Request, preempted: bool = False) -> None:
        """Release all of ``req``'s blocks, deepest first (vLLM ``free``): those vLLM has
        hashed to the free queue's tail, the rest to its head (:class:`BlockPool`).

        Args:
            req: the request.
            preempted: the request will be re-admitted later, so the full blocks of a
                private request (``cache_private`` or ``output_private``) not hashed yet
                are registered first (its re-admission may hit them).
        """
        if preempted and (req.cache_private or req.output_private):
            self._register(req)
        ids = req.block_ids
        if ids:
            # The blocks vLLM has hashed, counted whether or not this request's are in the
            # cache here (a private request's are not): at a preemption, the registered ones
            # (the victim was not scheduled in this step); at a finish, every full block
            # of computed tokens.
            n = 0 if not self.enable_prefix_caching else (
                req.num_registered_blocks if preempted
                else min(req.num_computed_tokens, req.num_tokens) // self.block_size)
            n = min(n, len(ids))
            if n < len(ids):
                self.pool.free_blocks_first(ids[:n - 1:-1] if n else ids[::-1])
            if n:
                self.pool.free_blocks(ids[n - 1::-1])
        req.block_ids = []
        req.num_registered_blocks = req.num_hashed_blocks = 0
