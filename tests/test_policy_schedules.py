"""Hand-derived schedules: each expected table was worked out on paper.

Rows are (request id, num_new_tokens, num_computed_before, samples_token), sorted by id.
"""

import pytest

from simulator.policy import (CAPPED, CAPPED_ABOVE_MAX_MODEL_LEN, RequestRejected,
                              SchedulerConfig)
from policy_helpers import make, req, step


def test_a_long_prompt_is_chunked_and_samples_only_at_its_last_chunk():
    s = make(max_num_batched_tokens=8, max_num_seqs=4)
    s.add_request(req("A", [("a", 20)], max_tokens=2))
    expected = [
        ([("A", 8, 0, False)], []),
        ([("A", 8, 8, False)], []),
        ([("A", 4, 16, True)], []),   # last prompt token computed -> first token
        ([("A", 1, 20, True)], ["A"]),  # second token, max_tokens reached
    ]
    for want_rows, want_fin in expected:
        r, pre, fin, _ = step(s)
        assert (r, fin) == (want_rows, want_fin)
    assert not s.has_unfinished_requests()


def test_b_running_decodes_are_served_before_a_new_prefill():
    s = make(max_num_batched_tokens=8, max_num_seqs=4)
    s.add_request(req("A", [("a", 6)], max_tokens=5))
    assert step(s)[0] == [("A", 6, 0, True)]
    s.add_request(req("B", [("b", 12)], max_tokens=2))
    # Budget 8: A's decode takes 1, B's first chunk the other 7.
    assert step(s)[0] == [("A", 1, 6, True), ("B", 7, 0, False)]
    assert step(s)[0] == [("A", 1, 7, True), ("B", 5, 7, True)]
    assert step(s)[0] == [("A", 1, 8, True), ("B", 1, 12, True)]


def test_c_max_num_seqs_caps_admission():
    s = make(max_num_seqs=2, max_num_batched_tokens=64)
    for rid in "ABC":
        s.add_request(req(rid, [(rid, 4)], max_tokens=2))
    assert step(s)[0] == [("A", 4, 0, True), ("B", 4, 0, True)]
    r, _, fin, _ = step(s)
    assert r == [("A", 1, 4, True), ("B", 1, 4, True)] and fin == ["A", "B"]
    assert step(s)[0] == [("C", 4, 0, True)]


def test_d_kv_exhaustion_preempts_the_newest_which_resumes_on_its_own_blocks():
    # 5 usable blocks of 4 tokens. A and B take 2 blocks each in step 1.
    s = make(num_gpu_blocks=6, max_model_len=20, max_num_batched_tokens=16)
    a, b = req("A", [("a", 8)], max_tokens=3), req("B", [("b", 8)], max_tokens=4)
    s.add_request(a)
    s.add_request(b)
    assert step(s)[0] == [("A", 8, 0, True), ("B", 8, 0, True)]
    b_blocks = list(b.block_ids)
    # Step 2: A takes the last free block for token 9; B cannot grow and preempts itself.
    r, pre, fin, _ = step(s)
    assert r == [("A", 1, 8, True)] and pre == ["B"]
    assert b.num_preemptions == 1 and b.num_output_tokens == 1 and b.block_ids == []
    # Step 3: B (9 tokens: 2 cached blocks, both free, + 1 new) needs 3 of the 2 free blocks.
    r, pre, fin, _ = step(s)
    assert r == [("A", 1, 9, True)] and fin == ["A"]
    # Step 4: B resumes, hitting its own two freed prompt blocks; recomputes only token 9.
    r, pre, fin, plan = step(s)
    assert r == [("B", 1, 8, True)]
    assert plan.prefills[0].num_cached_tokens == 8 and b.block_ids[:2] == b_blocks
    assert s.stats.preempted_hits == 8 and s.stats.preempted_queries == 9
    assert s.stats.prefix_hits == 0 and b.num_cached_tokens == 0  # first admission: no hit
    while s.has_unfinished_requests():
        step(s)
    assert b.num_output_tokens == 4


def test_e_block_aligned_fully_cached_prompt_recomputes_its_last_block():
    s = make()
    s.add_request(req("A", [("p", 8)], max_tokens=1))
    assert step(s)[0] == [("A", 8, 0, True)]
    s.add_request(req("B", [("p", 8)], max_tokens=1))
    r, _, _, plan = step(s)
    assert r == [("B", 4, 4, True)]          # block 1 is cached but holds the last token
    assert plan.prefills[0].num_cached_tokens == 4


def test_f_eviction_takes_the_deepest_block_of_the_least_recently_freed_request():
    s = make(num_gpu_blocks=7, max_model_len=24)
    a = req("A", [("a", 12)], max_tokens=1)
    s.add_request(a)
    step(s)
    a_blocks = [1, 2, 3]
    b = req("B", [("b", 12)], max_tokens=1)
    s.add_request(b)
    step(s)
    pool = s.kv.pool
    # Free queue: A's blocks were freed first, deepest first.
    assert list(pool.free_queue) == [3, 2, 1, 6, 5, 4]
    c = req("C", [("c", 4)], max_tokens=1)
    s.add_request(c)
    step(s)
    assert c.block_ids == [] and pool.block_hash[a_blocks[2]] == c.block_hash(0, 4)
    # A's deepest block was evicted for C; A's first two and all of B's are still cached.
    assert [pool.block_hash[i] == a.block_hash(i - 1, 4) for i in a_blocks] == [True, True, False]
    assert all(pool.block_hash[i] == b.block_hash(i - 4, 4) for i in (4, 5, 6))
    s.add_request(req("A2", [("a", 13)], max_tokens=1))
    r, _, _, plan = step(s)
    assert r == [("A2", 5, 8, True)] and plan.prefills[0].num_cached_tokens == 8


def test_g_no_admission_in_a_step_that_preempted():
    # Prefix caching off; budget 5. After B is preempted in step 6, B alone (a 4-token
    # chunk = 1 block) would fit, but vLLM admits nothing in a step that preempted.
    # Admission on the first chunk alone (scheduler_reserve_full_isl off; with it on, B's
    # 5 blocks would not fit the 4 free in step 7: test_g2).
    s = make(num_gpu_blocks=8, max_model_len=28, max_num_batched_tokens=5, max_num_seqs=2,
             enable_prefix_caching=False, scheduler_reserve_full_isl=False)
    s.add_request(req("X", [("x", 4)], max_tokens=20))
    s.add_request(req("B", [("b", 20)], max_tokens=2))
    expected = [
        [("B", 1, 0, False), ("X", 4, 0, True)],
        [("B", 4, 1, False), ("X", 1, 4, True)],
        [("B", 4, 5, False), ("X", 1, 5, True)],
        [("B", 4, 9, False), ("X", 1, 6, True)],
        [("B", 4, 13, False), ("X", 1, 7, True)],
    ]
    for want in expected:
        assert step(s)[0] == want
    r, pre, _, _ = step(s)
    assert r == [("X", 1, 8, True)] and pre == ["B"]
    assert s.kv.pool.num_free_blocks == 4 and s.waiting[0].request_id == "B"
    r, pre, _, _ = step(s)
    assert r == [("B", 4, 0, False), ("X", 1, 9, True)]


def test_g2_a_prompt_is_admitted_only_when_all_of_it_fits():
    # vLLM's scheduler_reserve_full_isl (default on): blocks of 4, 6 usable, budget 8,
    # prefix caching off. A (6 tokens, 10 out) takes 2 blocks in step 1. B's first chunk
    # (2 tokens in step 1, 7 from step 2) would fit, but its 20-token prompt (5 blocks)
    # does not fit the 4 free, so B waits until A finishes (step 10), then prefills
    # 8 + 8 + 4.
    def run(full_isl):
        s = make(num_gpu_blocks=7, max_model_len=24, max_num_batched_tokens=8,
                 max_num_seqs=4, enable_prefix_caching=False,
                 scheduler_reserve_full_isl=full_isl)
        s.add_request(req("A", [("a", 6)], max_tokens=10))
        s.add_request(req("B", [("b", 20)], max_tokens=1))
        return s

    s = run(True)
    assert step(s)[0] == [("A", 6, 0, True)]
    for k in range(2, 11):   # A decodes alone; its third block (step 4) leaves 3 free
        r, pre, fin, _ = step(s)
        assert (r, pre) == ([("A", 1, 4 + k, True)], []), k
        assert s.waiting[0].request_id == "B"
    assert fin == ["A"] and s.kv.pool.num_free_blocks == 6
    assert [step(s)[0] for _ in range(3)] == [
        [("B", 8, 0, False)], [("B", 8, 8, False)], [("B", 4, 16, True)]]
    assert s.stats.num_preemptions == 0

    # On the first chunk alone B is admitted in step 1 on the 2 tokens of budget left,
    # takes the free blocks as it prefills (1, 3, then 4 blocks), and is preempted in
    # step 4 when A's decode needs its third block.
    s = run(False)
    assert step(s)[0] == [("A", 6, 0, True), ("B", 2, 0, False)]
    assert step(s)[0] == [("A", 1, 6, True), ("B", 7, 2, False)]
    assert step(s)[0] == [("A", 1, 7, True), ("B", 7, 9, False)]
    r, pre, _, _ = step(s)
    assert (r, pre) == ([("A", 1, 8, True)], ["B"])

def test_g3_the_watermark_keeps_blocks_free_for_the_running():
    # vLLM's watermark 0.2 of 11 blocks: int(2.2) = 2 kept free when admitting while others
    # run. Blocks of 4, 10 usable, budget 8, prefix caching off. A (6 tokens, 10 out) takes
    # 2 blocks in step 1, leaving 8. B's 28-token prompt needs 7: 7 + 2 > 8, so B waits
    # while A runs (A grows to 4 blocks) and is admitted in step 11, when nothing runs and
    # the watermark does not apply, then prefills 8 + 8 + 8 + 4. Without the watermark,
    # 7 <= 8: B starts in step 1 on the 2 tokens of budget A leaves.
    def run(watermark):
        s = make(num_gpu_blocks=11, max_model_len=32, max_num_batched_tokens=8,
                 max_num_seqs=4, enable_prefix_caching=False, watermark=watermark)
        s.add_request(req("A", [("a", 6)], max_tokens=10))
        s.add_request(req("B", [("b", 28)], max_tokens=1))
        return s

    s = run(0.2)
    assert s._watermark_blocks == 2
    assert step(s)[0] == [("A", 6, 0, True)]
    for k in range(2, 11):
        r, _, fin, _ = step(s)
        assert r == [("A", 1, 4 + k, True)] and s.waiting[0].request_id == "B", k
    assert fin == ["A"] and s.kv.pool.num_free_blocks == 10
    assert [step(s)[0] for _ in range(4)] == [
        [("B", 8, 0, False)], [("B", 8, 8, False)], [("B", 8, 16, False)],
        [("B", 4, 24, True)]]

    s = run(0.0)
    assert step(s)[0] == [("A", 6, 0, True), ("B", 2, 0, False)]

    # Nothing running: a request needing 9 of the 10 free blocks is admitted, although
    # 9 + 2 > 10 (vLLM applies the watermark only when self.running is not empty).
    s = make(num_gpu_blocks=11, max_model_len=40, max_num_batched_tokens=64,
             enable_prefix_caching=False, watermark=0.2)
    s.add_request(req("C", [("c", 36)], max_tokens=1))
    assert step(s)[0] == [("C", 36, 0, True)]
    with pytest.raises(ValueError, match="watermark must be in \\[0, 1\\), got 1.0"):
        SchedulerConfig(watermark=1.0)


def test_g4_all_decode_steps_are_taken_whole_with_their_context():
    # Prefix caching off: both requests are light steady decodes after their prefill step.
    # Step k >= 2 decodes A at position k + 3 and B at k + 5 (prompts of 5 and 7), so the
    # context, each incl. its new token, is (k + 4) + (k + 6) = 2k + 10. Steps 2-9 are
    # quiet; step 10 samples both requests' 10th token and finishes them, so it is
    # scheduled.
    s = make(max_num_batched_tokens=64, block_size=4, enable_prefix_caching=False)
    s.add_request(req("A", [("a", 5)], max_tokens=10))
    s.add_request(req("B", [("b", 7)], max_tokens=10))
    assert s.quiet_step() is None   # prompts to prefill
    assert step(s)[0] == [("A", 5, 0, True), ("B", 7, 0, True)]
    for k in range(2, 10):
        assert s.quiet_step() == 2 * k + 10, k
        s.check_invariants()
    assert s.quiet_step() is None
    r, _, fin, plan = step(s)
    assert (r, fin, plan.decode_context_tokens) == ([("A", 1, 13, True), ("B", 1, 15, True)],
                                                    ["A", "B"], 30)


def test_g5_long_prefill_token_threshold_shares_the_budget_between_prompts():
    # vLLM's long_prefill_token_threshold 4, budget 16: two 10-token prompts get 4 tokens
    # each per step (4 + 4, 4 + 4, then the last 2 + 2, which sample), where without it the
    # first takes 10 at once and the second the 6 left. A prompt alone has nobody to starve:
    # no cap.
    def run(threshold, prompts=("A", "B")):
        s = make(max_num_batched_tokens=16, block_size=4, enable_prefix_caching=False,
                 long_prefill_token_threshold=threshold)
        for rid in prompts:
            s.add_request(req(rid, [(rid.lower(), 10)], max_tokens=2))
        return s

    s = run(4)
    assert [step(s)[0] for _ in range(4)] == [
        [("A", 4, 0, False), ("B", 4, 0, False)],
        [("A", 4, 4, False), ("B", 4, 4, False)],
        [("A", 2, 8, True), ("B", 2, 8, True)],
        [("A", 1, 10, True), ("B", 1, 10, True)]]
    s = run(0)
    assert [step(s)[0] for _ in range(2)] == [
        [("A", 10, 0, True), ("B", 6, 0, False)],
        [("A", 1, 10, True), ("B", 4, 6, True)]]
    assert step(run(4, "C"))[0] == [("C", 10, 0, True)]
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be in "
                                         "\\[0, max_model_len \\(256\\)\\], got 300"):
        SchedulerConfig(max_model_len=256, long_prefill_token_threshold=300)


def test_g6_without_chunked_prefill_a_prompt_runs_whole_or_waits():
    # Budget 16 = max_model_len. A (10) takes 10; B (8) would be cut to the 6 left with
    # chunked prefill, without it B waits and so does C (3 tokens, which would fit): the
    # first waiting request that does not fit stops admission (vLLM 0.32 breaks there).
    def run(chunked):
        s = make(max_num_batched_tokens=16, max_model_len=16, block_size=4,
                 enable_prefix_caching=False, enable_chunked_prefill=chunked)
        for rid, n in (("A", 10), ("B", 8), ("C", 3)):
            s.add_request(req(rid, [(rid.lower(), n)], max_tokens=2))
        return s

    s = run(False)
    assert [step(s)[:3] for _ in range(3)] == [
        ([("A", 10, 0, True)], [], []),
        ([("A", 1, 10, True), ("B", 8, 0, True), ("C", 3, 0, True)], [], ["A"]),
        ([("B", 1, 8, True), ("C", 1, 3, True)], [], ["B", "C"])]
    s = run(True)
    assert [step(s)[0] for _ in range(2)] == [
        [("A", 10, 0, True), ("B", 6, 0, False)],
        [("A", 1, 10, True), ("B", 2, 6, True), ("C", 3, 0, True)]]


def test_g7_without_chunked_prefill_hits_and_the_threshold_count_before_the_fit():
    # vLLM tests the tokens left after prefix-cache hits and the long-prefill cap. B shares
    # A's 8-token system prompt, hit in the step A fills it: 4 new tokens fit the 4 left.
    s = make(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    s.add_request(req("A", [("sys", 8), ("a", 4)], max_tokens=1))
    s.add_request(req("B", [("sys", 8), ("b", 4)], max_tokens=1))
    assert step(s)[0] == [("A", 12, 0, True), ("B", 4, 8, True)]
    # No cache: B's 12 tokens do not fit the 4 left, and wait for the next step.
    s = make(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False,
             enable_prefix_caching=False)
    s.add_request(req("A", [("sys", 8), ("a", 4)], max_tokens=1))
    s.add_request(req("B", [("sys", 8), ("b", 4)], max_tokens=1))
    assert step(s)[0] == [("A", 12, 0, True)]
    assert step(s)[0] == [("B", 12, 0, True)]
    # long_prefill_token_threshold 4 caps each of two 10-token prompts to 4 first, which
    # fits, so the threshold still splits prompts with chunked prefill off.
    s = make(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False,
             long_prefill_token_threshold=4, enable_prefix_caching=False)
    for rid in "AB":
        s.add_request(req(rid, [(rid.lower(), 10)], max_tokens=1))
    assert step(s)[0] == [("A", 4, 0, False), ("B", 4, 0, False)]
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8\) must be >= "
                                         r"max_model_len \(16\) with enable_chunked_prefill off"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8, max_model_len=16,
                        enable_chunked_prefill=False)


def test_h_second_request_hits_blocks_the_first_fills_in_the_same_step():
    s = make()
    s.add_request(req("A", [("sys", 8), ("a", 4)], max_tokens=1))
    s.add_request(req("B", [("sys", 8), ("b", 4)], max_tokens=1))
    r, _, _, plan = step(s)
    assert r == [("A", 12, 0, True), ("B", 4, 8, True)]
    assert [e.num_cached_tokens for e in plan.prefills] == [0, 8]
    assert (s.stats.prefix_queries, s.stats.prefix_hits) == (24, 8)


def test_multi_turn_hits_the_previous_answer_blocks():
    s = make()
    a = req("T1", [("sys", 8), ("u1", 3)], max_tokens=9)
    s.add_request(a)
    while s.has_unfinished_requests():
        step(s)
    # Turn 2 = turn 1 prompt + its 9-token answer + new user tokens. The answer's blocks
    # were registered as decode filled them: tokens 0..19 are 5 full blocks of 4.
    t2 = req("T2", [("sys", 8), ("u1", 3), (("out", "T1"), 9), ("u2", 5)], max_tokens=1)
    s.add_request(t2)
    r, _, _, plan = step(s)
    assert plan.prefills[0].num_cached_tokens == 16  # last token of the answer (pos 19) was never computed
    assert r == [("T2", 9, 16, True)]


def test_prompt_longer_than_max_model_len_is_rejected_and_outputs_are_capped():
    s = make(max_model_len=16)
    with pytest.raises(RequestRejected, match="max_model_len"):
        s.add_request(req("long", [("x", 17)], max_tokens=1))
    # a prompt of max_model_len tokens leaves no room for an output token: vLLM's input
    # processor rejects it too ("plus the number of requested output tokens (at least 1)")
    with pytest.raises(RequestRejected, match="prompt of 16 tokens leaves no room for an "
                                              "output token within max_model_len 16"):
        s.add_request(req("full", [("x", 16)], max_tokens=1))
    assert s.stats.num_rejected == 2
    r = req("capped", [("y", 12)], max_tokens=100)
    r1 = req("one", [("z", 15)], max_tokens=100)
    exact = req("exact", [("w", 10)], max_tokens=6)   # 10 + 6 = max_model_len: not cut
    within = req("within", [("v", 10)], max_tokens=16)   # <= max_model_len, past it with the prompt
    for x in (r, r1, exact, within):
        s.add_request(x)
    while s.has_unfinished_requests():
        step(s)
    # 100 > max_model_len itself: vLLM's server refuses such a max_tokens, its engine cuts it
    assert (r.num_output_tokens, r.finish_reason, r.capped) == (4, "length",
                                                                CAPPED_ABOVE_MAX_MODEL_LEN)
    assert (r1.num_output_tokens, r1.finish_reason, r1.capped) == (1, "length",
                                                                   CAPPED_ABOVE_MAX_MODEL_LEN)
    assert (within.num_output_tokens, within.capped) == (6, CAPPED)   # the server lowers it
    assert exact.num_output_tokens == 6 and not exact.capped


def test_config_refuses_a_cache_smaller_than_one_max_model_len_request():
    with pytest.raises(ValueError, match="max_model_len 64 needs 16 KV blocks"):
        SchedulerConfig(max_model_len=64, block_size=4, num_gpu_blocks=16)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8)


def test_output_private_request_rehits_its_decode_blocks_after_preemption():
    # A and B decode together until A needs a block and B (the tail) is preempted; B is
    # re-admitted when A finishes. Hashing B's decode blocks lazily (output_private: only
    # when preempted) must give the same steps as registering each as it fills, and B's
    # re-admission must hit blocks it filled while decoding (beyond its 4-token prompt).
    def run(private):
        s = make(num_gpu_blocks=12, max_model_len=36, block_size=4)
        a = req("A", [("a", 4)], max_tokens=24)
        b = req("B", [("b", 4)], max_tokens=30)
        for r in (a, b):
            r.output_private = private
            s.add_request(r)
        log = []
        while s.has_unfinished_requests():
            rows, pre, fin, plan = step(s)
            log.append((rows, pre, fin, [(e.request_id, e.num_cached_tokens)
                                         for e in plan.prefills if e.admitted]))
        return log
    eager, lazy = run(False), run(True)
    assert lazy == eager
    readmits = [hits for _, _, _, hits in eager[1:] if hits]
    assert [p for _, p, _, _ in eager if p] == [["B"]]
    assert readmits == [[("B", 16)]]


def test_a_freed_partial_block_is_reused_before_cached_ones():
    """vLLM 0.32 ``BlockPool.free_blocks``: a freed block without a hash (no request can
    hit it) goes to the free queue's head, one with a hash to its tail (LRU). Blocks of 4,
    3 usable. A (4 tokens) caches block 1; B (6 tokens) caches block 2 and frees its
    partial block 3; C (4 tokens) then takes block 3, not A's cached block 1, which A2
    hits. Freed to the tail, block 3 would sit behind 1 and C would evict A's prefix."""
    s = make(num_gpu_blocks=4, max_model_len=12)
    for rid, segs in (("A", [("a", 4)]), ("B", [("b", 6)])):
        s.add_request(req(rid, segs, max_tokens=1))
        assert step(s)[2] == [rid]
    assert s.kv.pool.free_queue == [3, 1, 2]
    c = req("C", [("c", 4)], max_tokens=1)
    s.add_request(c)
    step(s)
    assert c.block_ids == [] and s.kv.pool.free_queue == [1, 2, 3]
    s.add_request(req("A2", [("a", 4), ("x", 4)], max_tokens=1))
    r, _, _, plan = step(s)
    assert r == [("A2", 4, 4, True)] and plan.prefills[0].num_cached_tokens == 4
    pool, before = s.kv.pool, s.kv.pool.free_queue   # nothing taken, nothing lost
    assert pool.allocate(0) == [] and pool.free_queue == before
    # with prefix caching off every freed block is reused first, the deepest first
    s = make(num_gpu_blocks=4, max_model_len=12, enable_prefix_caching=False)
    s.add_request(req("B", [("b", 6)], max_tokens=1))
    step(s)
    assert s.kv.pool.free_queue == [2, 1, 3]
    assert s.kv.pool.allocate(0) == [] and s.kv.pool.free_queue == [2, 1, 3]
    # and, as vLLM's KVCacheManager, it keeps no prefix-cache queries then
    assert (s.stats.prefix_queries, s.stats.prefix_hits) == (0, 0)


def test_requests_finishing_in_one_step_free_their_blocks_in_admission_order():
    """vLLM's update_from_output frees finished requests in scheduling order (running ones
    in admission order), so their hashed blocks reach the LRU tail in that order. R1 (12
    tokens, chunks of 4 by long_prefill_token_threshold) is admitted before R2 (4 tokens,
    3 outputs), whose decodes take blocks after R1's chunks: R1 [1, 3, 5], R2 [2, 4]. Both
    finish in step 3, R1 on its last chunk, R2 on a decode: R1's blocks go to the tail
    first, deepest first, then R2's full block 2; R2's partial block 4 heads the queue,
    before the never-used 6..11."""
    s = make(num_gpu_blocks=12, max_num_batched_tokens=8, max_model_len=32,
             long_prefill_token_threshold=4)
    s.add_request(req("R1", [("a", 12)], max_tokens=1))
    s.add_request(req("R2", [("b", 4)], max_tokens=3))
    assert step(s)[0] == [("R1", 4, 0, False), ("R2", 4, 0, True)]
    assert step(s)[0] == [("R1", 4, 4, False), ("R2", 1, 4, True)]
    r, _, fin, _ = step(s)
    assert r == [("R1", 4, 8, True), ("R2", 1, 5, True)] and fin == ["R1", "R2"]
    assert s.kv.pool.free_queue == [4, *range(6, 12), 5, 3, 1, 2]


def test_never_used_blocks_head_the_free_queue_in_id_order():
    """vLLM's free list starts as blocks 1..n-1; blocks freed to its tail (free_blocks:
    those with a hash) join it behind the never-used ones (which this pool keeps unlisted
    until handed out)."""
    from simulator.policy.kv_cache import BlockPool
    pool = BlockPool(16384)
    assert len(pool.ref_cnt) == 1 and pool.num_free_blocks == 16383   # nothing per block yet
    a = pool.allocate(3)
    assert a == [1, 2, 3] and pool.allocate_one() == 4
    pool.free_blocks([3, 2, 1])
    assert pool.free_queue[:2] == [5, 6] and pool.free_queue[-3:] == [3, 2, 1]
    assert pool.num_free_blocks == 16382 and len(pool.free_queue) == 16382
    # the never-used ones go first, then the freed ones in the order they were freed
    assert pool.allocate(16380) == list(range(5, 16384)) + [3]
    assert pool.allocate(2) == [2, 1] and pool.num_free_blocks == 0
    with pytest.raises(RuntimeError, match="need 1 block, 0 free"):
        pool.allocate_one()


def test_scatter_reorders_the_free_queue_and_keeps_every_block_and_hash():
    """``BlockPool.scatter(seed)`` lists the free queue in ``random.Random(seed)``'s shuffle
    of its order: the same free blocks (never-used, freed to the head, freed to the tail,
    cached), allocated in the new order from then on, and cached free blocks still hit.
    Blocks of 4. A (8 tokens) caches blocks 1-2; B (6 tokens) caches 3 and frees its
    partial 4 to the head; 5..19 were never used. Seed 2's order (worked out with
    ``random.Random(2).shuffle``) puts 11, 10, 18, 12 first and A's blocks further back."""
    import random

    s = make(num_gpu_blocks=20, max_model_len=16)
    for rid, segs in (("A", [("a", 8)]), ("B", [("b", 6)])):
        s.add_request(req(rid, segs, max_tokens=1))
        assert step(s)[2] == [rid]
    pool = s.kv.pool
    before = pool.free_queue
    assert before == [4, *range(5, 20), 2, 1, 3]
    want = list(before)
    random.Random(2).shuffle(want)
    pool.scatter(2)
    assert pool.free_queue == want and want[:4] == [11, 10, 18, 12]
    assert pool.num_free_blocks == 19
    s.check_invariants()
    # A2 hits A's two cached blocks; its new block is the shuffled queue's head
    s.add_request(req("A2", [("a", 8), ("x", 4)], max_tokens=1))
    plan = step(s)[3]
    assert plan.prefills[0].num_cached_tokens == 8
    assert pool.allocate(2) == [10, 18] and pool.allocate_one() == 12
    from simulator.policy.kv_cache import BlockPool
    with pytest.raises(ValueError, match="unlimited"):
        BlockPool(None).scatter()


def test_a_step_counts_the_context_its_requests_read_again():
    """``StepPlan.reread_tokens``: for each block k >= 2 of the step's requests attend to,
    k - 1 blocks of tokens. Blocks of 4. A ('a' 8 + 'x' 4) is prefilled in step 1; B ('a' 8
    + 'y' 4) and C ('c' 12) arrive for step 2, where A decodes and B hits A's two 'a'
    blocks (8 tokens; its chunk's cached prefix), C hits nothing; from step 3 all three
    decode and B's context still holds those 8 tokens: 8 every step, 0 in step 1 (A
    alone). After A finishes (step 4, its 4th token), B alone holds them: 0."""
    s = make(max_model_len=32)
    s.add_request(req("A", [("a", 8), ("x", 4)], max_tokens=4))
    got = []
    for k in range(5):
        if k == 1:
            s.add_request(req("B", [("a", 8), ("y", 4)], max_tokens=5))
            s.add_request(req("C", [("c", 12)], max_tokens=5))
        plan = s.schedule()
        got.append((sorted(e.request_id for e in plan.scheduled()), plan.reread_tokens))
        s.update(plan)
    assert got == [(["A"], 0), (["A", "B", "C"], 8), (["A", "B", "C"], 8),
                   (["A", "B", "C"], 8), (["B", "C"], 0)]
