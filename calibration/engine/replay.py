"""Replay a list of :class:`simulator.policy.RequestSpec` on the real engine in real time.

Each request joins the queue when the run's clock reaches its arrival (0 = replay start);
a follow-up turn (``spec.after``) arrives ``think_time_ns`` after the turn it follows
finished (after its arrival, if that one was rejected). Prompt segments become token ids:
``spec.prompt_token_ids`` when given; else, per segment ``(content_id, length)``, the
answer tokens the engine actually generated when ``content_id`` is an earlier request's
answer (so the KV that a later turn hits holds exactly the tokens its prompt claims), and
:func:`.tokenizer.content_tokens` otherwise. Block hashes follow the segments, as in the
simulator, so both see the same prefix-cache hits.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from simulator.errors import InputError
from simulator.policy import Request

from .sampling import SamplingParams
from .tokenizer import content_tokens


@dataclass
class ReplayResult:
    """Records of one replay (ns on the replay's clock).

    Attributes:
        records: one :class:`simulator.policy.RequestRecord` per spec, in spec order.
        steps: the :class:`.engine.StepRecord` of every step of the replay.
        stats: the scheduler's counters at the end (prefix-cache queries and hits).
        duration_ns: replay start to the last finish.
    """

    records: list
    steps: list
    stats: object
    duration_ns: int


_SPIN_NS = 5_000_000   # the last 5 ms before an arrival are polled, not slept


def materialise(spec, answers: dict, vocab_size: int) -> list[int]:
    """Token ids of ``spec``'s prompt (see module docstring)."""
    if spec.prompt_token_ids is not None:
        return list(spec.prompt_token_ids)
    ids = []
    for content_id, length in spec.prompt:
        known = list(answers.get(content_id, ()))[:length]
        ids.extend(known)
        if length > len(known):
            ids.extend(content_tokens(content_id, length, vocab_size)[len(known):])
    return ids


def replay(engine, specs, sampling: SamplingParams | None = None) -> ReplayResult:
    """Serve ``specs`` on ``engine`` as they arrive; returns a :class:`ReplayResult`.

    ``sampling`` defaults to greedy with ``ignore_eos`` so every request generates exactly
    its ``max_tokens`` (capped by ``max_model_len``), as the simulator assumes; its
    ``max_tokens`` is replaced by each spec's.

    Raises:
        InputError: duplicate request ids, or ``after`` naming an unknown request.
        RuntimeError: the engine is not idle.
    """
    base = sampling or SamplingParams(temperature=0.0, ignore_eos=True)
    ids = [s.request_id for s in specs]
    if len(set(ids)) != len(ids):
        raise InputError("specs: duplicate request_id")
    known = set(ids)
    followers: dict = {}
    for i, s in enumerate(specs):
        if s.after is not None:
            if s.after not in known:
                raise InputError(f"specs[{i}].after: unknown request {s.after!r}")
            followers.setdefault(s.after, []).append(s)
    order = {rid: i for i, rid in enumerate(ids)}
    pending = [(s.arrival_ns, order[s.request_id], s) for s in specs if s.after is None]
    heapq.heapify(pending)
    answers: dict = {}
    vocab = engine.model_config.vocab_size
    first_step = len(engine.step_records)
    engine.reset_clock()
    last = 0

    def arrive(spec, at_ns):
        heapq.heappush(pending, (at_ns, order[spec.request_id], spec))

    while True:
        now = engine.now_ns()
        while pending and pending[0][0] <= now:
            at, _, spec = heapq.heappop(pending)
            req = Request(spec)
            req.arrival_ns = at
            req.prompt_token_ids = materialise(spec, answers, vocab)
            req.output_token_ids = []
            req.eos_token_id = None if base.ignore_eos else engine.eos_token_id
            req.stop_token_ids = tuple(base.stop_token_ids)
            params = base.model_copy(update={"max_tokens": spec.max_tokens})
            req.sampling = params
            try:
                engine.add_spec_request(req, params)
            except InputError:
                for f in followers.get(spec.request_id, ()):
                    arrive(f, at + f.think_time_ns)
        if engine.has_unfinished_requests():
            for out in engine.step():
                spec = specs[order[out.request_id]]
                answers[spec.answer_content_id] = out.output_token_ids
                last = out.record.finish_ns
                for f in followers.get(out.request_id, ()):
                    arrive(f, out.record.finish_ns + f.think_time_ns)
        elif pending:
            # Sleep to within _SPIN_NS of the next arrival, then poll: a sleep
            # overshoots by up to milliseconds, and the step would start that late.
            wait_ns = pending[0][0] - engine.now_ns()
            if wait_ns > _SPIN_NS:
                time.sleep((wait_ns - _SPIN_NS) / 1e9)
        else:
            break
    return ReplayResult([engine.records[rid] for rid in ids],
                        engine.step_records[first_step:], engine.stats, last)
