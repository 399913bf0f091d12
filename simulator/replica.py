"""One engine replica as a SimPy process.

The replica drives the shared policy objects (:class:`simulator.policy.Scheduler`) exactly
as the real engine does — ``schedule()``, run the step, ``update()`` — except that a step's
duration comes from the cost model instead of a forward pass. Time is integer ns.

Timing rules: steps run back to back while there is work; an arrival at
time t is seen by a step that starts at t (arrivals are delivered with SimPy's URGENT
priority, ahead of the step boundary at the same instant); an idle replica starts a step
at the arrival that wakes it, and that step also pays the cost model's wake-up cost for
the time idle (``wake_ns``, measured by calibration; the replica starts idle at 0).

Three ways to run, with identical results: ``exact_steps`` (one SimPy event per step, the
reference); fast-forward (steps that nothing outside the replica can observe run without
SimPy events); and, for one replica without follow-up requests, a plain loop with no SimPy
at all (:meth:`Replica.serve_alone`). The last two take quiet all-decode steps whole
(:meth:`simulator.policy.Scheduler.quiet_step`).
"""

from __future__ import annotations

import simpy

from .policy import (MAX_TIME_NS, Request, RequestRecord, RequestRejected, Scheduler,
                     SchedulerConfig, StepPlan)

_NEVER = MAX_TIME_NS


class Replica:
    """A simulated vLLM engine: one scheduler, one cost model, one SimPy process.

    Args:
        env: the SimPy environment (integer ns clock).
        index: replica number (0-based), written into every record.
        config: scheduler / KV cache configuration.
        cost_model: object with ``step_time_ns(plan) -> int``; optionally
            ``intake_ns(plan) -> int``, ns from a step's start to the moment its batch is
            scheduled (the engine taking in the arrivals it saw; called, for steps that
            admit or preempt, before ``step_time_ns`` prices the same plan), which moves
            first-scheduled times only; optionally ``wake_ns(idle_ns) -> int``, the extra
            ns of the first step after ``idle_ns`` idle.
        metrics: collector with ``record_request``, ``record_itl``, ``record_own_itl``,
            ``itl_appenders``, ``record_step``, ``note_admitted``
            (:class:`simulator.metrics.MetricsCollector`).
        on_finish: callback ``(request, finish_ns)`` for finished requests (sessions).
        next_event_ns: callback ``(replica) -> int``: the earliest time at which anything
            outside this replica can happen (an arrival, a follow-up released by another
            replica); steps ending before it are fast-forwarded. Default: never.
        exact_steps: one SimPy event per step (the reference mode, ``--exact-steps``).
    """

    def __init__(self, env: simpy.Environment, index: int, config: SchedulerConfig,
                 cost_model, metrics, on_finish=None, next_event_ns=None,
                 exact_steps: bool = False):
        self.env = env
        self.index = index
        self.scheduler = Scheduler(config)
        self.cost_model = cost_model
        self.metrics = metrics
        self.on_finish = on_finish
        self._wake: simpy.Event | None = None
        self._last_token_ns: dict[Request, int] = {}  # preempted requests' last token
        self._preempted_ns: dict[Request, int] = {}   # waiting again since (preemption)
        self.busy_ns = 0
        self.exact_steps = exact_steps
        self.next_event_ns = next_event_ns or (lambda _rep: _NEVER)
        # Next time this replica acts (the end of its step in flight; now while a wake-up
        # is pending; never while idle): only then can it release a follow-up request.
        self.busy_until_ns = _NEVER
        self._pool = self.scheduler.kv.pool
        self._itl_gap, self._itl_cnt = metrics.itl_appenders()
        self._warm: set = set()   # unfinished requests that may be warm-up (metrics.delivered)
        self._record_step = metrics.record_step
        self._intake_ns = getattr(cost_model, "intake_ns", None)
        self.process = env.process(self._run())

    @property
    def num_outstanding(self) -> int:
        """Requests queued or running here (the least-outstanding router's load)."""
        s = self.scheduler
        return len(s.waiting) + len(s.running)

    def submit(self, req: Request, warm: bool = False) -> None:
        """Deliver an arrived request (its ``record`` already made) to this replica;
        ``warm``: it may be a warm-up request, whose gaps the metrics keep apart."""
        rec = req.record
        rec.replica = self.index
        try:
            self.scheduler.add_request(req)
        except RequestRejected:
            rec.finish_reason = "rejected"
            self.metrics.record_request(rec)
            if self.on_finish is not None:
                self.on_finish(req, self.env.now)  # ends its conversation (Cluster)
            return
        self.metrics.note_admitted(rec.arrival_ns)
        if warm:
            self._warm.add(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
            self.busy_until_ns = self.env.now

    def _run(self):
        env, sched, cost = self.env, self.scheduler, self.cost_model
        exact = self.exact_steps
        schedule, update, finishes_in = sched.schedule, sched.update, sched.finishes_in
        step_time_ns, record_step = cost.step_time_ns, self._record_step
        account = self._account
        waiting_q, pool, index = sched.waiting, self._pool, self.index
        usable = None if pool.unlimited else pool.num_gpu_blocks - 1
        quiet_step, steady, reread = sched.quiet_step, sched._steady, sched.reread_tokens
        quiet = StepPlan(0, steady)   # the plan of every quiet decode step
        wake_ns = getattr(cost, "wake_ns", None)
        while True:
            extra = 0   # the wake-up cost of the first step after idle
            if not sched.has_unfinished_requests():
                self.busy_until_ns = _NEVER
                idle_from = env.now
                self._wake = env.event()
                yield self._wake
                self._wake = None
                if wake_ns is not None:
                    extra = wake_ns(env.now - idle_from)
            t0 = env.now
            bound = self.next_event_ns(self)
            # Fast-forward: steps that end before anything else in the cluster can happen
            # (the next arrival, or the next move of another replica that could release a
            # follow-up) and that finish no request run here without SimPy events; nothing
            # outside this replica can observe the difference, so results are identical.
            while True:
                ctx = None if exact else quiet_step()
                if ctx is not None:
                    # All running requests decode and nothing else changes: the scheduler
                    # took the step whole (its update is invisible to the rest of the
                    # cluster: no finish, no admission, no hash).
                    nd = quiet.num_decodes = quiet.num_scheduled_tokens = len(steady)
                    quiet.decode_context_tokens = ctx
                    quiet.reread_tokens = reread()
                    usage = 0.0 if usable is None else 1.0 - pool._num_free / usable
                    waiting = len(waiting_q)
                    t1 = t0 + step_time_ns(quiet) + extra
                    extra = 0
                    if t1 >= bound:
                        plan = None
                        break
                    account(nd, t1 - t0)
                    record_step(index, t0, t1, 0, nd, nd, waiting, usage, 0)
                    t0 = t1
                    continue
                plan = schedule()
                prefills = plan.prefills
                if prefills or plan.preempted or not plan.num_scheduled_tokens:
                    self._note_scheduled(plan, t0)
                # The step's batch, queue and KV usage as it runs (before finishes leave).
                nd = plan.num_decodes
                batch = nd + len(prefills)
                waiting = len(waiting_q)
                usage = 0.0 if usable is None else 1.0 - pool._num_free / usable
                t1 = t0 + step_time_ns(plan) + extra
                extra = 0
                if exact or t1 >= bound or finishes_in(plan):
                    break
                # A step that finishes nothing: take it back here (see _end_step).
                account(nd, t1 - t0)
                if prefills:
                    self._note_tokens(prefills, t1)
                update(plan)
                record_step(index, t0, t1, plan.num_scheduled_tokens - nd, nd, batch,
                            waiting, usage, len(plan.preempted), plan.num_sampled)
                t0 = t1
            self.busy_until_ns = t1
            yield env.timeout(t1 - env.now)
            if plan is None:   # a quiet step
                account(nd, t1 - t0)
                record_step(index, t0, t1, 0, nd, nd, waiting, usage, 0)
            else:
                self._end_step(plan, t0, t1, batch, waiting, usage)

    def serve_alone(self, arrivals_ns: list, deliver) -> None:
        """Serve every request without SimPy: this replica is the only actor.

        Mirrors :meth:`_run` with the arrival process of :class:`simulator.cluster.Cluster`
        folded in: arrivals at or before a step's end are delivered before the step is
        taken back (SimPy fires them, URGENT, while the replica waits for the step to
        end), so a step starting at t sees every request that arrived at t; an idle
        replica jumps to the next arrival.

        Args:
            arrivals_ns: arrival times, ns, ascending.
            deliver: ``deliver(k, now_ns)`` submits arrival ``k`` (at ``now_ns``).
        """
        sched, cost = self.scheduler, self.cost_model
        schedule, update = sched.schedule, sched.update
        step_time_ns, record_step = cost.step_time_ns, self._record_step
        account = self._account
        waiting_q, pool, index = sched.waiting, self._pool, self.index
        usable = None if pool.unlimited else pool.num_gpu_blocks - 1
        has_work = sched.has_unfinished_requests
        quiet_step, reread = sched.quiet_step, sched.reread_tokens
        quiet = StepPlan(0, sched._steady)   # the plan of every quiet decode step
        wake_ns = getattr(cost, "wake_ns", None)
        k, n = 0, len(arrivals_ns)
        t0 = extra = 0
        while True:
            ctx = quiet_step()
            if ctx is not None:
                # All running requests decode, nothing else changes (Scheduler.quiet_step).
                nd = quiet.num_decodes = quiet.num_scheduled_tokens = len(sched._steady)
                quiet.decode_context_tokens = ctx
                quiet.reread_tokens = reread()
                usage = 0.0 if usable is None else 1.0 - pool._num_free / usable
                waiting = len(waiting_q)
                t1 = t0 + step_time_ns(quiet) + extra
                extra = 0
                if k < n and t1 >= arrivals_ns[k]:
                    while k < n and arrivals_ns[k] <= t1:
                        deliver(k, arrivals_ns[k])
                        k += 1
                account(nd, t1 - t0)
                record_step(index, t0, t1, 0, nd, nd, waiting, usage, 0)
                t0 = t1
                continue
            if not has_work():
                if k >= n:
                    return
                idle_from, t0 = t0, max(t0, arrivals_ns[k])
                if wake_ns is not None:
                    extra = wake_ns(t0 - idle_from)
                while k < n and arrivals_ns[k] <= t0:
                    deliver(k, arrivals_ns[k])
                    k += 1
                continue
            bound = arrivals_ns[k] if k < n else _NEVER
            plan = schedule()
            prefills = plan.prefills
            if prefills or plan.preempted or not plan.num_scheduled_tokens:
                self._note_scheduled(plan, t0)
            nd = plan.num_decodes
            batch = nd + len(prefills)
            waiting = len(waiting_q)
            usage = 0.0 if usable is None else 1.0 - pool._num_free / usable
            t1 = t0 + step_time_ns(plan) + extra
            extra = 0
            if t1 >= bound:
                while k < n and arrivals_ns[k] <= t1:
                    deliver(k, arrivals_ns[k])
                    k += 1
            # _end_step, inline.
            account(nd, t1 - t0)
            if prefills:
                self._note_tokens(prefills, t1)
            finished = update(plan)
            record_step(index, t0, t1, plan.num_scheduled_tokens - nd, nd, batch,
                        waiting, usage, len(plan.preempted), plan.num_sampled)
            if finished:
                self._note_finished(finished, t1)
            t0 = t1

    def _note_scheduled(self, plan, t0: int) -> None:
        """First-scheduled times (``t0`` plus the cost model's intake, if it has one),
        preempted requests' last token times and their waits again (preemption at ``t0``
        to rescheduled, :meth:`MetricsCollector.record_rewait`) of a step that starts at
        ``t0``.

        Raises:
            RuntimeError: an empty step while requests are unfinished (a scheduler bug).
        """
        sched = self.scheduler
        if not plan.num_scheduled_tokens:
            raise RuntimeError(f"replica {self.index}: scheduler made an empty step with "
                               f"{sched.num_waiting} waiting, {sched.num_running} running")
        ts = t0 if self._intake_ns is None else t0 + self._intake_ns(plan)
        for e in plan.prefills:
            if e.admitted:
                rec = e.request.record
                if rec.first_scheduled_ns is None:
                    rec.first_scheduled_ns = ts
                else:   # resumed after preemption
                    self.metrics.record_rewait(self.index,
                                               self._preempted_ns.pop(e.request), ts)
        for r in plan.preempted:
            self._preempted_ns[r] = t0
            if r.num_output_tokens:
                # Its last token came out of the previous step, which ended at t0, unless
                # it was preempted again while recomputing: its last token is older then.
                self._last_token_ns.setdefault(r, t0)

    def _note_tokens(self, prefills, t1: int) -> None:
        """First tokens (TTFT) and resumed requests' first gaps of a step ending at t1."""
        for e in prefills:
            if e.samples_token:
                rec = e.request.record
                if rec.first_token_ns is None:
                    rec.first_token_ns = t1
                else:  # a resumed request's first token after preemption
                    gap = t1 - self._last_token_ns.pop(e.request)
                    if e.request in self._warm:
                        self.metrics.record_own_itl(e.request.request_id, gap)
                    else:
                        self.metrics.record_itl(gap, 1)

    def _end_step(self, plan, t0: int, t1: int, batch: int, waiting: int, usage: float):
        """Take back a step that ran [t0, t1): tokens, finishes, metrics."""
        nd = plan.num_decodes
        self._account(nd, t1 - t0)
        if plan.prefills:
            self._note_tokens(plan.prefills, t1)
        finished = self.scheduler.update(plan)
        self._record_step(self.index, t0, t1, plan.num_scheduled_tokens - nd, nd, batch,
                          waiting, usage, len(plan.preempted), plan.num_sampled)
        if finished:
            self._note_finished(finished, t1)

    def _account(self, nd: int, dur: int) -> None:
        """Busy time and pooled ITL gaps of a step of ``nd`` steady decodes that ran
        ``dur`` ns: one gap of ``dur`` per decode, warm-up requests' kept apart."""
        self.busy_ns += dur
        pooled = nd - self._warm_itl(dur) if self._warm else nd
        if pooled:
            self._itl_gap(dur)
            self._itl_cnt(pooled)

    def _warm_itl(self, dur: int) -> int:
        """Record apart the gap ``dur`` of each possible warm-up request decoding in this
        step (its steady decodes: :attr:`StepPlan.decodes`); how many there were."""
        steady, own, k = self.scheduler._steady, self.metrics.record_own_itl, 0
        for r in self._warm:
            if r in steady:
                own(r.request_id, dur)
                k += 1
        return k

    def _note_finished(self, finished, t1: int) -> None:
        """Records of the requests that finished in a step ending at ``t1``."""
        metrics = self.metrics
        if self._warm:
            self._warm.difference_update(finished)
        for r in finished:
            rec = r.record
            rec.finish_ns = t1
            rec.output_tokens = r.num_output_tokens
            rec.cached_tokens = max(r.num_cached_tokens, 0)
            rec.preemptions = r.num_preemptions
            rec.finish_reason = r.finish_reason
            rec.capped = r.capped
            metrics.record_request(rec)
            if self.on_finish is not None:
                self.on_finish(r, t1)


def new_request(spec, arrival_ns: int) -> Request:
    """A live request for ``spec`` arriving at ``arrival_ns``, with its record attached."""
    r = Request(spec)
    r.arrival_ns = arrival_ns
    r.record = RequestRecord(request_id=spec.request_id, arrival_ns=arrival_ns,
                             prompt_tokens=r.num_prompt_tokens)
    return r
