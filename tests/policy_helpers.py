"""Helpers for driving the policy in tests: build requests, run steps, tabulate plans."""

from simulator.policy import Request, RequestSpec, Scheduler, SchedulerConfig


def req(rid, segments, max_tokens, arrival_ns=0):
    """A segment-content request; ``segments`` is a list of (content_id, length)."""
    return Request(RequestSpec(rid, arrival_ns, tuple(segments), max_tokens))


def make(**kw):
    """A scheduler with small test defaults overridden by ``kw``."""
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, block_size=4,
               num_gpu_blocks=None, enable_prefix_caching=True)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))


def rows(plan):
    """Plan as sorted rows (id, num_new_tokens, num_computed_before, samples_token)."""
    return sorted((e.request_id, e.num_new_tokens, e.num_computed_before, e.samples_token)
                  for e in plan.scheduled())


def step(s):
    """Schedule, update, check invariants; returns (plan rows, preempted ids, finished ids, plan)."""
    plan = s.schedule()
    r = rows(plan)
    pre = [p.request_id for p in plan.preempted]
    fin = [f.request_id for f in s.update(plan)]
    s.check_invariants()
    return r, pre, fin, plan
