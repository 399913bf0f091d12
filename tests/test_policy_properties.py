"""Property tests: invariants after every step, and the lazy scheduler against a naive one.

The naive reference below re-states the scheduling rules (simulator/policy/scheduler.py's
docstring) as a plain O(running) loop per step (no steady-decode shortcut), sharing only the
KV cache manager. On random workloads both must produce the same plan, preemptions and
finishes at every step.
"""

import math
from collections import Counter, deque

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator.policy import (KVCacheManager, Request, RequestRejected, RequestSpec,
                              Scheduler, SchedulerConfig)
from simulator.policy.kv_cache import cdiv
from simulator.policy.request import first_content_key


class NaiveScheduler:
    """Reference: vLLM V1's loop written out step by step."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.kv = KVCacheManager(cfg.num_gpu_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.waiting, self.running = deque(), []

    def add(self, r):
        if r.num_prompt_tokens >= self.cfg.max_model_len:   # no room for an output token
            raise RequestRejected("too long")
        r.max_tokens = min(r.max_tokens, self.cfg.max_model_len - r.num_prompt_tokens)
        self.waiting.append(r)

    def _preempt(self, v):
        self.kv.free(v)
        v._computed = 0
        v.num_preemptions += 1
        self.waiting.appendleft(v)

    def schedule(self):
        cfg, kv = self.cfg, self.kv
        budget, sched, preempted, hits = cfg.max_num_batched_tokens, {}, [], {}
        cap = (cfg.long_prefill_token_threshold
               if len(self.running) + len(self.waiting) > 1 else 0) or math.inf
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.num_tokens - r._computed, cap, budget, cfg.max_model_len - r._computed)
            if n <= 0:
                i += 1
                continue
            while True:
                new = kv.allocate_slots(r, r._computed + n)
                if new is not None:
                    break
                v = self.running.pop()
                self._preempt(v)
                preempted.append(v.request_id)
                if v in sched:
                    budget += sched.pop(v)[0]
                if v is r:
                    break
            if new is None:
                break
            sched[r] = (n, r._computed)
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                r = self.waiting[0]
                blocks, n_hit = kv.get_computed_blocks(r)
                n = min(r.num_tokens - n_hit, cap)
                if n > budget and not cfg.enable_chunked_prefill:
                    break   # whole or not at all
                n = min(n, budget)
                if kv.pool.num_gpu_blocks is not None:
                    # the whole sequence so far (or the chunk alone) must fit: its blocks
                    # beyond the hits, the hits that are free (vLLM full_sequence_must_fit)
                    # and, while others run, the watermark's blocks
                    keep = int(cfg.watermark * kv.pool.num_gpu_blocks) if self.running else 0
                    free_hits = sum(1 for b in blocks if kv.pool.ref_cnt[b] == 0)
                    ends = [n_hit + n] + ([min(r.num_tokens, cfg.max_model_len)]
                                          if cfg.scheduler_reserve_full_isl else [])
                    if any(cdiv(e, cfg.block_size) - len(blocks) + free_hits + keep
                           > kv.pool.num_free_blocks for e in ends):
                        break
                if kv.allocate_slots(r, n_hit + n, blocks) is None:
                    break
                self.waiting.popleft()
                self.running.append(r)
                r._computed = n_hit
                sched[r] = (n, n_hit)
                hits[r.request_id] = n_hit
                budget -= n
        for r, (n, before) in sched.items():
            r._computed = before + n
        return sched, preempted, hits

    def update(self, sched):
        fin = []
        for r, (n, before) in sched.items():
            if before + n == r.num_tokens:
                r._output += 1
                if r._output >= r.max_tokens:
                    self.running.remove(r)
                    self.kv.free(r)
                    fin.append(r.request_id)
        return fin


@st.composite
def scenarios(draw):
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    max_num_seqs = draw(st.integers(1, 6))
    mnbt = max_num_seqs + draw(st.integers(0, 40))
    mml = draw(st.integers(8, 64))
    chunked = draw(st.booleans())
    if not chunked:   # vLLM: max_num_batched_tokens >= max_model_len then
        mnbt = max(mnbt, mml)
    blocks = draw(st.one_of(st.none(), st.integers(cdiv(mml, bs) + 1, cdiv(mml, bs) + 25)))
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
                          max_model_len=mml, block_size=bs, num_gpu_blocks=blocks,
                          enable_prefix_caching=draw(st.booleans()),
                          scheduler_reserve_full_isl=draw(st.booleans()),
                          watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])),
                          long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])),
                          enable_chunked_prefill=chunked)
    reqs = []
    for i in range(draw(st.integers(1, 12))):
        segs = []
        group = draw(st.integers(0, 2))
        if group:
            segs.append((("sys", group), draw(st.integers(1, 20))))
        segs.append((("u", i), draw(st.integers(1, 30))))
        reqs.append((draw(st.integers(0, 25)), i, tuple(segs), draw(st.integers(1, 20))))
    return cfg, sorted(reqs)


def reread_tokens(plan, bs):
    """Context tokens a step reads again, counted from the block tables: the blocks each
    scheduled request attends to (a decode its context, a chunk its cached prefix and
    itself), ``bs`` tokens for each reader of a block after its first."""
    reads = Counter()
    for r in plan.decodes:
        reads.update(r.block_ids[:cdiv(r.num_computed_tokens, bs)])
    for e in plan.prefills:   # (a request preempted later in the step holds no blocks)
        reads.update(e.request.block_ids[:cdiv(e.num_computed_before + e.num_new_tokens, bs)])
    return bs * sum(k - 1 for k in reads.values())


def _rows_lazy(plan):
    return sorted((e.request_id, e.num_new_tokens, e.num_computed_before, e.samples_token)
                  for e in plan.scheduled())


def _rows_naive(sched, s_of):
    return sorted((r.request_id, n, before, before + n == r.num_tokens)
                  for r, (n, before) in sched.items())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_lazy_scheduler_matches_naive_reference_and_keeps_invariants(case):
    cfg, reqs = case
    lazy, naive = Scheduler(cfg), NaiveScheduler(cfg)
    lazy_reqs = {}
    pending = deque(reqs)
    bs = cfg.block_size
    for t in range(3000):
        while pending and pending[0][0] <= t:
            _, rid, segs, mt = pending.popleft()
            a, b = (Request(RequestSpec(rid, 0, segs, mt)) for _ in range(2))
            rejected = []
            for sch, r in ((lazy, a), (naive, b)):
                try:
                    (sch.add_request if sch is lazy else sch.add)(r)
                except RequestRejected:
                    rejected.append(r)
            assert len(rejected) in (0, 2)
            # An unservable request is rejected, never left waiting.
            assert bool(rejected) == (a.num_prompt_tokens >= cfg.max_model_len)
            if not rejected:
                lazy_reqs[rid] = a
        if not pending and not lazy.has_unfinished_requests():
            break
        plan = lazy.schedule()
        sched, preempted, hits = naive.schedule()
        assert _rows_lazy(plan) == _rows_naive(sched, None)
        assert [p.request_id for p in plan.preempted] == preempted
        # max_num_batched_tokens, max_num_seqs and hit-token rules.
        assert plan.num_scheduled_tokens == sum(n for n, _ in sched.values())
        assert plan.num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert lazy.num_running <= cfg.max_num_seqs
        for e in plan.prefills:
            if e.admitted:
                assert e.num_cached_tokens == hits[e.request_id]
                assert e.num_cached_tokens % bs == 0
                assert e.num_cached_tokens < e.request.num_tokens
        ctx = sum(r.num_computed_tokens for r in plan.decodes)
        assert plan.decode_context_tokens == ctx
        assert plan.reread_tokens == reread_tokens(plan, bs)
        fin = [r.request_id for r in lazy.update(plan)]
        assert sorted(fin) == sorted(naive.update(sched))
        lazy.check_invariants()
    else:
        raise AssertionError("requests did not all finish within 3000 steps")
    # Every request that each fits in the cache alone finished with all its tokens.
    for r in lazy_reqs.values():
        assert r.is_finished and r.num_output_tokens == r.max_tokens


@settings(max_examples=60, deadline=None)
@given(shared_blocks_of_32=st.integers(1, 4), tails=st.lists(st.integers(1, 70), min_size=2,
                                                              max_size=6),
       outputs=st.lists(st.integers(1, 40), min_size=6, max_size=6))
def test_hit_tokens_do_not_depend_on_block_size_when_prefix_is_a_multiple_of_32(
        shared_blocks_of_32, tails, outputs):
    shared = 32 * shared_blocks_of_32
    hits = {}
    for bs in (16, 32):
        s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=4096,
                                      max_model_len=4096, block_size=bs))
        got = []
        for i, tail in enumerate(tails):
            s.add_request(Request(RequestSpec(i, 0, (("sys", shared), (("u", i), tail)),
                                              outputs[i])))
        while s.has_unfinished_requests():
            plan = s.schedule()
            got += [(e.request_id, e.num_cached_tokens) for e in plan.prefills if e.admitted]
            s.update(plan)
        hits[bs] = got
    assert hits[16] == hits[32]
    assert all(h == shared for rid, h in hits[16][1:])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Two light decodes start a block in the same step, then finish together: their blocks must
# be taken (and so freed) in admission order, as the hashed path takes them.
@example(case=(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=4, max_model_len=12,
                               block_size=1, num_gpu_blocks=15, enable_prefix_caching=True,
                               scheduler_reserve_full_isl=False,
                               long_prefill_token_threshold=3),
               [(0, 0, ((("u", 0), 10),), 2), (0, 1, ((("u", 1), 1),), 1),
                (0, 2, ((("u", 2), 1),), 1), (0, 4, ((("u", 4), 1),), 3),
                (1, 3, ((("u", 3), 1),), 1)]))
@given(scenarios())
def test_private_requests_schedule_exactly_as_hashed_ones(case):
    """Marking requests whose first token starts no other request ``cache_private`` (their
    blocks are hashed only on preemption), and every request ``output_private`` (no prompt
    here quotes an answer), changes nothing: plans, hits, the blocks taken
    from the free queue, preemptions and finishes agree step by step. (An unlimited pool
    keeps hashed blocks forever but reuses unhashed ones, so there block ids may differ.)"""
    cfg, reqs = case
    firsts = [first_content_key(segs) for _, _, segs, _ in reqs]
    private = {rid for (_, rid, _, _), k in zip(reqs, firsts) if firsts.count(k) == 1}
    runs = []
    for mark in (False, True):
        s, log, pending = Scheduler(cfg), [], deque(reqs)
        for t in range(3000):
            while pending and pending[0][0] <= t:
                _, rid, segs, mt = pending.popleft()
                r = Request(RequestSpec(rid, 0, segs, mt))
                r.cache_private = mark and rid in private
                r.output_private = mark   # no prompt here quotes an answer
                try:
                    s.add_request(r)
                except RequestRejected:
                    pass
            if not pending and not s.has_unfinished_requests():
                break
            plan = s.schedule()
            entries = plan.scheduled()
            log.append((sorted((e.request_id, e.num_new_tokens, e.num_computed_before,
                                e.num_cached_tokens, len(e.new_block_ids)) for e in entries),
                        # Unhashed blocks are interchangeable labels: the same blocks leave
                        # the free queue, though which decode gets which may differ.
                        sorted(b for e in entries for b in e.new_block_ids)
                        if cfg.num_gpu_blocks else [],
                        [p.request_id for p in plan.preempted],
                        sorted(f.request_id for f in s.update(plan)),
                        s.kv.pool.num_free_blocks))
            s.check_invariants()
        runs.append((log, s.stats))
    assert runs[0] == runs[1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_quiet_steps_equal_scheduled_steps(case):
    """``quiet_step`` (schedule + update in one, for all-decode steps) leaves the scheduler
    exactly where ``schedule`` + ``update`` would, step by step (that quiet steps are taken
    at all: test_policy_schedules.py::test_g4)."""
    cfg, reqs = case
    firsts = [first_content_key(segs) for _, _, segs, _ in reqs]
    private = {rid for (_, rid, _, _), k in zip(reqs, firsts) if firsts.count(k) == 1}
    runs = []
    for use_quiet in (False, True):
        s, log, pending = Scheduler(cfg), [], deque(reqs)
        for t in range(3000):
            while pending and pending[0][0] <= t:
                _, rid, segs, mt = pending.popleft()
                r = Request(RequestSpec(rid, 0, segs, mt))
                r.cache_private = rid in private
                r.output_private = rid % 2 == 0
                try:
                    s.add_request(r)
                except RequestRejected:
                    pass
            if not pending and not s.has_unfinished_requests():
                break
            ctx = s.quiet_step() if use_quiet else None
            if ctx is not None:
                log.append((len(s._steady), ctx, s.reread_tokens(), [], [], [],
                            s.kv.pool.num_free_blocks))
            else:
                plan = s.schedule()
                prefills = sorted((e.request_id, e.num_new_tokens, e.num_computed_before)
                                  for e in plan.prefills)
                pre = [p.request_id for p in plan.preempted]
                fin = sorted(f.request_id for f in s.update(plan))
                log.append((plan.num_decodes, plan.decode_context_tokens, plan.reread_tokens,
                            prefills, pre, fin, s.kv.pool.num_free_blocks))
            s.check_invariants()
        runs.append((log, s.stats, s._clock.sched_tick, s._clock.update_tick))
    assert runs[0] == runs[1]
