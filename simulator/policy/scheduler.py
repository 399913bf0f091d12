"""Continuous-batching scheduler with chunked prefill and recompute preemption.

One :meth:`Scheduler.schedule` call per engine step returns a :class:`StepPlan`; the
executor (the real engine's model runner, or the simulator's cost model) runs it and hands
the sampled tokens back through :meth:`Scheduler.update`. Semantics mirror vLLM V1's
``vllm/v1/core/sched/scheduler.py`` with synchronous scheduling
(``async_scheduling=False``):

1. Running requests first, in admission order. Each asks for ``num_tokens -
   num_computed_tokens`` tokens (1 for a decode, the rest of the prompt for a partial
   prefill), capped by the remaining token budget (``max_num_batched_tokens``) and by
   ``max_model_len``. If its blocks can't be allocated, the *last* running request is
   preempted (all its blocks freed, ``num_computed_tokens = 0``, put at the *front* of the
   waiting queue) and the allocation retried; a request that preempts itself ends the pass.
2. Only if nothing was preempted in this step, waiting requests are admitted FCFS while
   fewer than ``max_num_seqs`` run and budget remains: prefix-cache lookup (never the last
   token), the prompt chunked to the remaining budget, blocks allocated; the first request
   that does not fit stops admission (head-of-line blocking, as in vLLM). With
   ``scheduler_reserve_full_isl`` (vLLM's default) "fits" means its whole sequence so far,
   not only the chunk scheduled now (vLLM ``allocate_slots(full_sequence_must_fit=True)``);
   while others run, ``int(watermark × num_gpu_blocks)`` blocks must stay free besides
   (vLLM's ``watermark``, default 0).
   A prompt computes at most ``long_prefill_token_threshold`` tokens per step (when set and
   more than one request runs or waits), in both passes. With ``enable_chunked_prefill``
   off, a waiting request whose prompt (after hits and that cap) exceeds the remaining
   budget stops admission instead of being cut to it.
3. ``num_computed_tokens`` advances at scheduling time; a partial prefill samples nothing;
   the first output token comes from the step that computes the last prompt token.

Cost per step: a running request that decodes one token per step and needs no new block
(a *steady decode*) is not touched at all. Its counters advance with a shared clock and it
is revisited only at block boundaries and at its known ``max_tokens`` finish, so a step
costs O(requests whose state changes) plus O(1/block_size) per running request. A steady
decode whose blocks are hashed (prefix caching on, content others may share) is visited by
an event when a block fills (to register its hash) and when it starts the next one. A
*light* one (prefix caching off, or a ``cache_private`` or ``output_private`` request: no
other request can hit the blocks it fills while decoding) has nothing to register:
it sits in a list by block phase (``offset % block_size``), and a step finds the light
decodes that start a block with one lookup. The simulator takes all-decode steps in which
nothing else changes in one call (:meth:`Scheduler.quiet_step`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from .kv_cache import KVCacheManager, cdiv, min_gpu_blocks
from .request import CAPPED, CAPPED_ABOVE_MAX_MODEL_LEN, Request, RequestState

_RUNNING = RequestState.RUNNING


class RequestRejected(ValueError):
    """A request that can never be served (a prompt of ``max_model_len`` tokens or more)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler and KV cache knobs, named and defaulted as in vLLM.

    Attributes:
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one step. (Scenarios fill both with
            ``vllm serve``'s per-device defaults, :meth:`simulator.scenario.Scenario.
            serving_defaults`; the 256 / 8192 here only serve direct use, as in tests,
            and are not vLLM ``SchedulerConfig``'s class defaults, 128 / 2048.)
        max_model_len: most tokens (prompt + output) of one request.
        block_size: tokens per KV block (vLLM default 16).
        num_gpu_blocks: KV blocks incl. the reserved null block; ``None`` = unlimited.
        enable_prefix_caching: automatic prefix caching (on by default in vLLM V1).
        scheduler_reserve_full_isl: admit a waiting (or preempted) request only when the
            free blocks hold its whole sequence so far (prompt, and output before a
            preemption, up to ``max_model_len``), not only its first chunk (vLLM
            ``SchedulerConfig.scheduler_reserve_full_isl``, default on since it was added:
            a long prompt admitted on its first chunk preempted others chunk by chunk).
        watermark: share of ``num_gpu_blocks`` kept free when a waiting (or preempted)
            request is admitted while others run, so that running requests have room to
            grow before anything is preempted (vLLM ``SchedulerConfig.watermark``, in
            [0, 1), default 0: ``KVCacheManager.allocate_slots`` adds
            ``int(watermark × num_blocks)`` to the blocks an admission needs when
            ``self.running`` is not empty).
        long_prefill_token_threshold: most prompt tokens one request computes in a step,
            so that a long prompt does not take the whole budget from the others; 0 (the
            default) caps nothing, nor does it apply in a step with one request running or
            waiting (vLLM ``SchedulerConfig.long_prefill_token_threshold``; the lone-request
            exception is vLLM 0.32's ``Scheduler.schedule``, ``num_eligible_reqs > 1``;
            its ``long_prefill_token_threshold_adaptive`` is not modelled).
        enable_chunked_prefill: cut a waiting request's prompt to the step's remaining
            budget (on, vLLM's default); off, a prompt that does not fit whole waits and
            stops admission for the step, and ``max_num_batched_tokens`` must be at least
            ``max_model_len`` (vLLM ``SchedulerConfig.verify_max_model_len``; the
            admission test is vLLM 0.32's ``Scheduler.schedule``, checked after the
            ``long_prefill_token_threshold`` cap, so that cap still splits a prompt).

    Raises:
        ValueError: a knob out of range, naming it; or a cache too small for one request
            of ``max_model_len`` tokens (vLLM refuses to start then too).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    block_size: int = 16
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True

    def __post_init__(self):
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if not 0 <= self.long_prefill_token_threshold <= self.max_model_len:
            raise ValueError(f"long_prefill_token_threshold must be in [0, max_model_len "
                             f"({self.max_model_len})], got "
                             f"{self.long_prefill_token_threshold}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}), as vLLM requires")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}) with enable_chunked_prefill off, as "
                f"vLLM requires (a longer prompt could never be scheduled)")
        if self.num_gpu_blocks is not None:
            need = min_gpu_blocks(self.max_model_len, self.block_size) - 1
            if need > self.num_gpu_blocks - 1:
                raise ValueError(
                    f"max_model_len {self.max_model_len} needs {need} KV blocks of "
                    f"{self.block_size} tokens but the cache holds "
                    f"{max(self.num_gpu_blocks - 1, 0)} (num_gpu_blocks - 1): lower "
                    f"max_model_len or give the KV cache more memory")


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    Attributes:
        request: the live request.
        num_new_tokens: tokens computed in this step.
        num_computed_before: tokens already computed (incl. prefix-cache hits) before it.
        samples_token: whether this step samples a token for it (false for a partial
            prefill).
        new_block_ids: blocks allocated to it in this step.
        num_cached_tokens: prefix-cache hit tokens found on admission in this step (0
            otherwise).
        admitted: true when the request was admitted (new or resumed) in this step.
    """

    request: Request
    num_new_tokens: int
    num_computed_before: int
    samples_token: bool
    new_block_ids: list
    num_cached_tokens: int = 0
    admitted: bool = False

    @property
    def request_id(self):
        """The scheduled request's id."""
        return self.request.request_id


class StepPlan:
    """What the scheduler decided for one step: the contract between the scheduler and
    whatever executes the step (the engine runs it, the simulator prices it).

    Attributes:
        step: 1-based step index of this scheduler.
        prefills: explicit entries (:class:`ScheduledRequest`): every prefill chunk, new,
            continuing or resumed, in scheduling order.
        decodes: the requests decoding one token each in this step (a live view, valid
            until :meth:`Scheduler.update`); each has ``num_computed_tokens`` already
            advanced past its new token.
        num_decodes: ``len(decodes)``.
        decode_context_tokens: sum over decodes of the tokens each attends to (its
            context incl. the new token).
        decode_new_blocks: blocks allocated to decodes in this step, by request.
        preempted: requests preempted in this step, in preemption order.
        num_scheduled_tokens: tokens computed in this step (decodes + prefill chunks).
        reread_tokens: context tokens read again within the step: for each KV block that
            k >= 2 of its requests attend to (a shared prefix: only full, prefix-cached
            blocks are shared), (k - 1) x block_size. A step reads such a block once from
            memory and again from cache (:meth:`Scheduler.reread_tokens`).
    """

    __slots__ = ("step", "prefills", "decodes", "num_decodes", "decode_context_tokens",
                 "decode_new_blocks", "preempted", "num_scheduled_tokens", "reread_tokens")

    def __init__(self, step: int, decodes):
        self.step = step
        self.prefills: list[ScheduledRequest] = []
        self.decodes = decodes
        self.num_decodes = 0
        self.decode_context_tokens = 0
        self.decode_new_blocks: dict = {}
        self.preempted: list[Request] = []
        self.num_scheduled_tokens = 0
        self.reread_tokens = 0

    @property
    def is_empty(self) -> bool:
        """True when nothing was scheduled."""
        return self.num_scheduled_tokens == 0

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prefill chunks in this step."""
        return sum(e.num_new_tokens for e in self.prefills)

    @property
    def num_sampled(self) -> int:
        """Requests that sample a token in this step (the LM head runs once for each)."""
        return self.num_decodes + sum(1 for e in self.prefills if e.samples_token)

    def scheduled(self) -> list[ScheduledRequest]:
        """Every scheduled request, decodes first, materialised (O(batch); engine, tests)."""
        out = []
        for r in self.decodes:
            c = r.num_computed_tokens
            out.append(ScheduledRequest(r, 1, c - 1, True,
                                        list(self.decode_new_blocks.get(r, ()))))
        out.extend(self.prefills)
        return out


class _Clock:
    """Step counters that steady decodes advance with."""

    __slots__ = ("sched_tick", "update_tick")

    def __init__(self):
        self.sched_tick = 0
        self.update_tick = 0


@dataclass
class SchedulerStats:
    """Counters over a scheduler's life (prefix-cache figures in tokens).

    ``prefix_queries``/``prefix_hits`` count first admissions; re-admissions of preempted
    requests are counted apart in ``preempted_queries``/``preempted_hits``.
    """

    num_steps: int = 0
    num_preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    num_rejected: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens / queried tokens of first admissions (0 when none)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


class Scheduler:
    """vLLM-V1-style scheduler over a :class:`KVCacheManager` (see module docstring).

    Used identically by the simulator (``update(plan)`` with no tokens: requests stop at
    ``max_tokens``) and by the real engine (``update(plan, sampled)`` with token ids, so
    stop tokens apply as well).
    """

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.kv = KVCacheManager(config.num_gpu_blocks, config.block_size,
                                 config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: dict[Request, None] = {}      # admission order
        self._steady: dict[Request, None] = {}      # running, one token per step, lazy
        self._prefilling: dict[Request, None] = {}  # running, explicit
        self._clock = _Clock()
        self._alloc_events: dict[int, list] = defaultdict(list)   # sched tick -> reqs
        # Light steady decodes (nothing to hash) by phase: offset % block_size. Those of
        # phase p start a new block at the ticks t with (p + t) % block_size == 1 %
        # block_size, so a step finds its block demand without per-request events.
        self._phase: list[dict[Request, None]] = [{} for _ in range(config.block_size)]
        self._block_size = config.block_size
        self._max_tokens = config.max_num_batched_tokens
        self._max_seqs = config.max_num_seqs
        self._chunked = config.enable_chunked_prefill
        self._finish_events: dict[int, list] = defaultdict(list)  # update tick -> reqs
        self._steady_offset_sum = 0
        self._seq = 0
        self._budget = 0
        self._watermark_blocks = (int(config.watermark * config.num_gpu_blocks)
                                  if config.num_gpu_blocks is not None else 0)
        self._chunk_cap = 0   # this step's long_prefill_token_threshold (0: none)
        self.stats = SchedulerStats()

    # -- queue management -----------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; caps its output at ``max_model_len`` (sets ``req.capped``: 1 when
        its ``max_tokens`` was lowered to ``max_model_len - prompt``, as vLLM's engine and
        OpenAI server do; 2 when it asked for more than ``max_model_len`` itself, which
        vLLM 0.32's OpenAI server refuses, HTTP 400, ``renderers/params.py``, and its engine
        cuts as here).

        Raises:
            RequestRejected: a prompt of ``max_model_len`` tokens or more: it leaves no room
                for an output token (vLLM's input processor rejects it,
                ``_validate_prompt_len``).
        """
        cfg = self.config
        if req.num_prompt_tokens >= cfg.max_model_len:
            self.stats.num_rejected += 1
            raise RequestRejected(
                f"request {req.request_id}: prompt of {req.num_prompt_tokens} tokens leaves "
                f"no room for an output token within max_model_len {cfg.max_model_len}")
        room = cfg.max_model_len - req.num_prompt_tokens
        if req.max_tokens > room:
            req.capped = CAPPED_ABOVE_MAX_MODEL_LEN if req.max_tokens > cfg.max_model_len \
                else CAPPED
            req.max_tokens = room
        req._clock = self._clock
        req.state = RequestState.WAITING
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        """Whether any request waits or runs (vLLM's ``has_unfinished_requests``)."""
        return bool(self.waiting) or bool(self.running)

    @property
    def num_running(self) -> int:
        """Requests in the running queue (admitted, and neither finished nor preempted)."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue (new, or preempted and waiting to resume)."""
        return len(self.waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the usable KV blocks in use, 0 to 1 (vLLM's ``kv_cache_usage``)."""
        return self.kv.usage

    # -- one step -------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide the next step (see module docstring). Must be followed by :meth:`update`."""
        clock, stats = self._clock, self.stats
        tick = clock.sched_tick = clock.sched_tick + 1
        stats.num_steps += 1
        steady = self._steady
        plan = StepPlan(stats.num_steps, steady)
        # Every steady decode gets its one token (max_num_batched_tokens >= max_num_seqs).
        max_tokens = self._max_tokens
        self._budget = max_tokens - len(steady)
        # nobody to starve when one request runs or waits (vLLM scheduler.schedule)
        self._chunk_cap = (self.config.long_prefill_token_threshold
                           if len(self.running) + len(self.waiting) > 1 else 0)
        events = self._alloc_events.pop(tick, None)
        crossing = self._phase[(1 - tick) % self._block_size]
        if events or self._prefilling:
            self._schedule_running(plan, tick, events, crossing)
        elif crossing:
            pool = self.kv.pool
            if pool.unlimited or pool._num_free >= len(crossing):
                # Each starts a new block, in admission order as vLLM allocates them (any
                # order would only relabel unhashed blocks, but the labels then leave the
                # free queue in another order when freed).
                new_blocks = plan.decode_new_blocks
                for r, b in zip(_in_admission_order(crossing), pool.allocate(len(crossing))):
                    r.block_ids.append(b)
                    new_blocks[r] = [b]
            else:
                self._schedule_running(plan, tick, None, crossing)
        if (self.waiting and not plan.preempted and self._budget > 0
                and len(self.running) < self._max_seqs):
            self._admit(plan)
        n = len(steady)
        plan.num_decodes = n
        plan.decode_context_tokens = self._steady_offset_sum + n * tick
        plan.num_scheduled_tokens = max_tokens - self._budget
        plan.reread_tokens = self.reread_tokens()
        return plan

    def reread_tokens(self) -> int:
        """Context tokens read again in a step of every running request
        (:attr:`StepPlan.reread_tokens`): the pool's references beyond the first, in
        tokens, O(1). A block's holders are the running requests (``ref_cnt``) and every
        one of them is in every step, attending to the block: decodes always, and a
        prefilling request gets a chunk in each step after its admission, as those ahead
        of it take no more of the token budget than in the step that admitted it
        (tests/test_policy_properties.py checks the count against the block tables).
        The simulator's quiet decode steps (:meth:`quiet_step`) read it here."""
        return self.kv.pool.extra_refs * self._block_size

    def quiet_step(self) -> int | None:
        """Take the next step whole, :meth:`schedule` and :meth:`update` in one, when it is
        a *quiet* decode step: every running request is a steady decode, no hashed one
        is visited, the light ones that start a block all get one, nothing finishes and
        no waiting request can be admitted. Such a step's plan is ``num_decodes =
        len(steady)`` decodes and nothing else (the simulator prices it from those two
        numbers); the engine does not use this.

        Returns:
            The step's ``decode_context_tokens``, or ``None`` when the step is not quiet
            (nothing changed; call :meth:`schedule`).
        """
        clock = self._clock
        tick = clock.sched_tick + 1
        n = len(self._steady)
        if (not n or self._prefilling or tick in self._alloc_events
                or tick in self._finish_events):   # update tick == sched tick, then
            return None
        if (self.waiting and self._max_tokens > n and len(self.running) < self._max_seqs):
            return None
        crossing = self._phase[(1 - tick) % self._block_size]
        if crossing:
            pool = self.kv.pool
            if not pool.unlimited and pool._num_free < len(crossing):
                return None
            if len(crossing) == 1:
                next(iter(crossing)).block_ids.append(pool.allocate_one())
            else:
                for r, b in zip(_in_admission_order(crossing), pool.allocate(len(crossing))):
                    r.block_ids.append(b)
        clock.sched_tick = clock.update_tick = tick
        self.stats.num_steps += 1
        return self._steady_offset_sum + n * tick

    def _schedule_running(self, plan: StepPlan, tick: int, events, crossing) -> None:
        """Step 1: blocks of steady decodes (``events``: visits of hashed ones;
        ``crossing``: light ones starting a block) and the chunks of prefilling requests,
        in admission order."""
        cfg = self.config
        preempted = plan.preempted
        work = []
        if events:
            for r, epoch in events:
                if r._epoch == epoch:
                    work.append(r)
        if crossing:
            work.extend(crossing)
        if self._prefilling:
            work.extend(self._prefilling)
        if len(work) > 1:
            work.sort(key=_seq_key)  # running requests in admission order, as vLLM
        pool = self.kv.pool
        light = not self.kv.enable_prefix_caching
        for r in work:
            if r.state != _RUNNING:
                continue  # preempted earlier in this pass
            if r._steady:
                is_light = light or r.cache_private or r.output_private
                if is_light and (pool._num_free or pool.unlimited):
                    # Light: here only when it starts a new block; nothing to register.
                    b = pool.allocate_one()
                    r.block_ids.append(b)
                    plan.decode_new_blocks[r] = [b]
                    continue
                new = self._allocate(r, r.num_computed_tokens, preempted)
                if new is None:
                    break
                if new:
                    plan.decode_new_blocks[r] = new
                if not is_light:
                    self._schedule_alloc_event(r, tick + 1)
                continue
            before = r._computed
            n = min(self._capped(r.num_tokens - before), self._budget,
                    cfg.max_model_len - before)
            if n <= 0:
                continue
            new = self._allocate(r, before + n, preempted)
            if new is None:
                break
            self._budget -= n
            r._computed = before + n
            plan.prefills.append(ScheduledRequest(r, n, before, before + n == r.num_tokens, new))

    def _admit(self, plan: StepPlan) -> None:
        cfg, kv, stats = self.config, self.kv, self.stats
        waiting, running = self.waiting, self.running
        while waiting and self._budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            hits, n_hit = kv.get_computed_blocks(r)
            n = self._capped(r.num_tokens - n_hit)
            if n > self._budget:
                if not self._chunked:
                    break   # the prompt runs whole or waits (vLLM: chunked prefill off)
                n = self._budget
            keep = self._watermark_blocks if running else 0   # headroom for the running
            if (cfg.scheduler_reserve_full_isl and n_hit + n < r.num_tokens
                    and not kv.fits(r, min(r.num_tokens, cfg.max_model_len), hits, keep)):
                break  # the whole sequence would not fit: wait (vLLM full_sequence_must_fit)
            new = kv.allocate_slots(r, n_hit + n, hits, keep)
            if new is None:
                break  # head-of-line blocking, as in vLLM
            waiting.popleft()
            self._seq += 1
            r._seq = self._seq
            running[r] = None
            self._prefilling[r] = None
            r.state = _RUNNING
            r._computed = n_hit + n
            if kv.enable_prefix_caching:   # vLLM keeps no prefix-cache stats without it
                if r.num_preemptions:
                    stats.preempted_queries += r.num_tokens
                    stats.preempted_hits += n_hit
                else:
                    stats.prefix_queries += r.num_tokens
                    stats.prefix_hits += n_hit
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = n_hit
            self._budget -= n
            plan.prefills.append(ScheduledRequest(r, n, n_hit, n_hit + n == r.num_tokens,
                                                  new, n_hit, True))

    def _capped(self, n: int) -> int:
        """``n`` new tokens of one request, cut to this step's long-prefill threshold."""
        cap = self._chunk_cap
        return cap if 0 < cap < n else n

    def _allocate(self, r: Request, num_tokens: int, preempted: list) -> list | None:
        """Allocate for ``r``, preempting from the tail until it fits; None if r was."""
        while True:
            new = self.kv.allocate_slots(r, num_tokens)
            if new is not None:
                return new
            victim, _ = self.running.popitem()
            self._preempt(victim)
            preempted.append(victim)
            if victim is r:
                return None

    def _preempt(self, r: Request) -> None:
        if r._steady:
            if (r.cache_private or r.output_private) and self.kv.enable_prefix_caching:
                # No event visited it when a block filled: the blocks full before this
                # step are the ones registered (a victim's visit in this step comes after
                # the request that preempts it, so it never happened).
                r.num_registered_blocks = (r.num_computed_tokens - 1) // self.config.block_size
            self._leave_steady(r)
            self._budget += 1  # its implicit decode token is withdrawn
        else:
            self._prefilling.pop(r, None)
        self.kv.free(r, preempted=True)
        r._computed = 0
        r.state = RequestState.PREEMPTED
        r.num_preemptions += 1
        r._epoch += 1
        self.waiting.appendleft(r)
        self.stats.num_preemptions += 1

    # -- results --------------------------------------------------------------------
    def update(self, plan: StepPlan, sampled: dict | None = None) -> list[Request]:
        """Take back one step's results; returns the requests that finished in it.

        Args:
            plan: the plan returned by the last :meth:`schedule`.
            sampled: ``{request: token_id}`` for every request that sampled (engine), or
                ``None`` (simulator: a token is sampled wherever the plan says so and
                requests stop at ``max_tokens``).
        """
        clock = self._clock
        clock.update_tick += 1
        finished = []
        steady = self._steady
        if sampled is not None:
            for r in steady:
                r.output_token_ids.append(sampled[r])
        done = []   # (request, reason); freed below in admission order, as vLLM frees them
        # A stop token ends a request as "stop" even at its last allowed token: vLLM's
        # check_stop tests the stop tokens before the length (vllm/v1/core/sched/utils.py).
        events = self._finish_events.pop(clock.update_tick, None)
        if events:
            for r, epoch in events:
                if r._epoch == epoch:
                    stop = sampled is not None and self._is_stop(r, r.output_token_ids[-1])
                    done.append((r, "stop" if stop else "length"))
        if sampled is not None:
            ending = {r for r, _ in done}
            for r in steady:
                if r not in ending and self._is_stop(r, r.output_token_ids[-1]):
                    done.append((r, "stop"))
        for e in plan.prefills:
            r = e.request
            if not e.samples_token or r.state != _RUNNING:
                continue
            tok = sampled.get(r) if sampled is not None else None
            r.append_output_token(tok)
            del self._prefilling[r]
            if tok is not None and self._is_stop(r, tok):
                done.append((r, "stop"))
            elif r.num_output_tokens >= r.max_tokens:
                done.append((r, "length"))
            else:
                self._enter_steady(r)
        if len(done) > 1:
            done.sort(key=lambda d: d[0]._seq)
        for r, reason in done:
            self._finish(r, reason)
            finished.append(r)
        return finished

    def finishes_in(self, plan: StepPlan) -> bool:
        """Whether ``update(plan)`` without tokens will finish a request (at max_tokens).

        O(requests finishing or prefilling in the step). The simulator uses it to know
        which steps can release follow-up requests.
        """
        events = self._finish_events.get(self._clock.update_tick + 1)
        if events:
            for r, epoch in events:
                if r._epoch == epoch:
                    return True
        for e in plan.prefills:
            if e.samples_token and e.request.num_output_tokens + 1 >= e.request.max_tokens:
                return True
        return False

    @staticmethod
    def _is_stop(r: Request, tok: int) -> bool:
        return tok in r.stop_token_ids or (r.eos_token_id is not None and tok == r.eos_token_id)

    def _finish(self, r: Request, reason: str) -> None:
        if r._steady:
            self._leave_steady(r)
        else:
            self._prefilling.pop(r, None)
        del self.running[r]
        self.kv.free(r)
        r.state = RequestState.FINISHED
        r.finish_reason = reason
        r._epoch += 1

    def abort_request(self, r: Request) -> None:
        """Drop a waiting or running request, freeing its blocks."""
        if r.state == _RUNNING:
            self._finish(r, "abort")
        elif r.state != RequestState.FINISHED:
            self.waiting.remove(r)
            r.state = RequestState.FINISHED
            r.finish_reason = "abort"
            r._epoch += 1

    # -- steady decodes -------------------------------------------------------------
    def _enter_steady(self, r: Request) -> None:
        clock = self._clock
        r._computed -= clock.sched_tick     # now an offset: value = offset + tick
        r._output -= clock.update_tick
        r._steady = True
        self._steady[r] = None
        self._steady_offset_sum += r._computed
        if r.cache_private or r.output_private or not self.kv.enable_prefix_caching:
            self._phase[r._computed % self.config.block_size][r] = None
        else:
            self._schedule_alloc_event(r, clock.sched_tick + 1)
        self._finish_events[r.max_tokens - r._output].append((r, r._epoch))

    def _leave_steady(self, r: Request) -> None:
        c, o = r.num_computed_tokens, r.num_output_tokens
        self._steady_offset_sum -= r._computed
        self._phase[r._computed % self.config.block_size].pop(r, None)
        del self._steady[r]
        r._steady = False
        r._computed, r._output = c, o

    def _schedule_alloc_event(self, r: Request, tick: int) -> None:
        # Visit r at the first tick >= `tick` whose step fills a block (registers its
        # hash) or starts a new one (allocates it): after-step count % bs in {0, 1}.
        bs = self.config.block_size
        m = (r._computed + tick) % bs
        if bs > 1 and m > 1:
            tick += bs - m
        self._alloc_events[tick].append((r, r._epoch))

    # -- checks ---------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Assert the KV and queue invariants (O(blocks); for tests): the free-block count
        matches the free queue, free + used blocks = ``num_gpu_blocks`` − 1 (the null
        block), at most ``max_num_seqs`` run, a running request holds exactly
        ceil(num_computed_tokens / block_size) blocks, a waiting one none and no computed
        tokens.

        Raises:
            AssertionError: naming the broken invariant.
        """
        pool, bs = self.kv.pool, self.config.block_size
        if not pool.unlimited:
            used = pool.num_used_blocks()
            assert len(pool.free_queue) == pool.num_free_blocks, "free count drifted"
            assert len(pool.free_queue) + used == pool.num_gpu_blocks - 1, (
                f"free {len(pool.free_queue)} + used {used} != N-1")
        assert len(self.running) <= self.config.max_num_seqs, "running > max_num_seqs"
        for r in self.running:
            assert r.state == _RUNNING
            want = cdiv(r.num_computed_tokens, bs)
            assert len(r.block_ids) == want, (
                f"{r!r} holds {len(r.block_ids)} blocks, expected {want}")
        for r in self.waiting:
            assert not r.block_ids, f"waiting {r!r} holds blocks"
            assert r.num_computed_tokens == 0


def _in_admission_order(reqs):
    """``reqs`` (a dict of running requests) in admission order."""
    return sorted(reqs, key=_seq_key) if len(reqs) > 1 else reqs


def _seq_key(r: Request) -> int:
    return r._seq
