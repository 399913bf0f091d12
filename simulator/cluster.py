"""Replicas behind a router, fed by an arrival process (SimPy).

Actors: one arrival process for the open-loop requests, one process per replica
(:mod:`simulator.replica`), and follow-up requests (conversation turns, closed-loop users)
released when the request they follow finishes, after its think time; a rejected turn
ends its conversation (its later turns are not sent). With a client-side
``max_concurrency`` (``vllm bench serve --max-concurrency``), a request that arrives while
that many are in flight is held and sent, in arrival order, when one finishes.
"""

from __future__ import annotations

import heapq
from collections import deque

import simpy
from simpy.events import URGENT

from .policy import Request
from .policy.request import first_content_key
from .replica import _NEVER, Replica, new_request

ROUTERS = ("round_robin", "least_outstanding", "prefix_affinity", "session_affinity")


class _ArrivalTimer(simpy.Event):
    """A timeout with URGENT priority: arrivals at t precede step boundaries at t, so a
    step starting at t sees every request that arrived at t."""

    def __init__(self, env: simpy.Environment, delay: int):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, URGENT, delay)


class Router:
    """Chooses a replica for each arriving request.

    Policies:
        round_robin: replicas in turn.
        least_outstanding: fewest queued + running requests; ties in turn (from the
            replica after the last one chosen: at light load, where most choices tie,
            the lowest index would take the most requests).
        prefix_affinity: the replica whose prefix cache holds the longest prefix of the
            request, among replicas whose load is at most ``1.25 × mean + 1`` outstanding
            requests (bounded-load affinity, so a hot prefix cannot pile onto one replica);
            ties go to the least loaded, then in turn as above. It reads each replica's
            cache as it is at that instant (blocks scheduled but not yet computed
            included), where a production router keeps an approximate or lagging copy (a
            hash trie, KV events); a router matching prefixes with no load bound (vLLM
            production-stack's prefix-aware one) keeps more turns of a conversation on
            its replica, so its hit rate can be higher.
        session_affinity: every turn of a conversation to the replica that took its
            first turn, chosen as least_outstanding chooses (as a load balancer's sticky
            sessions do; vLLM production-stack's session router hashes the session id
            instead, which spreads conversations as a random split does); a request of
            no conversation as least_outstanding.

    Raises:
        ValueError: unknown policy.
    """

    LOAD_FACTOR = 1.25

    def __init__(self, policy: str):
        if policy not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {policy!r}")
        self.policy = policy
        self._next = 0
        self._home: dict = {}   # session_affinity: conversation -> replica of its first turn

    def choose(self, req: Request, replicas: list[Replica], session_id=None) -> Replica:
        """The replica that takes ``req`` under this router's policy (class docstring);
        advances the turn that round_robin and ties follow. ``session_id``: the
        conversation ``req`` is a turn of (None: a single request)."""
        if len(replicas) == 1:
            return replicas[0]
        if self.policy == "round_robin":
            rep = replicas[self._next % len(replicas)]
            self._next += 1
            return rep
        sticky = self.policy == "session_affinity" and session_id is not None
        home = self._home.get(session_id) if sticky else None
        if home is not None:   # a later turn: where its history is (the turn is not advanced)
            return replicas[home]
        n = len(replicas)
        order = [(self._next + k) % n for k in range(n)]   # ties go in turn
        loads = [r.num_outstanding for r in replicas]
        if self.policy in ("least_outstanding", "session_affinity"):
            best = min(order, key=lambda i: loads[i])
            if sticky:
                self._home[session_id] = best
        else:
            bound = self.LOAD_FACTOR * sum(loads) / n + 1
            best, best_key = None, None
            for i in order:
                if loads[i] > bound:
                    continue
                _, hit = replicas[i].scheduler.kv.get_computed_blocks(req)
                key = (-hit, loads[i])
                if best_key is None or key < best_key:
                    best, best_key = i, key
        self._next = best + 1
        return replicas[best]


class Cluster:
    """``replicas`` identical engines behind a router.

    Args:
        env: SimPy environment (integer ns).
        num_replicas: replicas (>= 1).
        config: scheduler configuration of every replica.
        cost_models: one cost model per replica (each with its own noise stream).
        metrics: shared metrics collector.
        router: routing policy name (see :class:`Router`).
        on_request_done: optional callback ``(count)`` after each finished request.
        max_concurrency: most requests in flight at once, client side (``vllm bench serve
            --max-concurrency``, a semaphore around each request): one that arrives while
            that many are in flight is held, then sent, first held first, when one
            finishes; its arrival (TTFT, E2EL) counts from then, as the client times it.
            ``None``: no limit.
    """

    def __init__(self, env, num_replicas: int, config, cost_models, metrics,
                 router: str = "round_robin", on_request_done=None, exact_steps: bool = False,
                 max_concurrency: int | None = None):
        self.env = env
        self.metrics = metrics
        self.router = Router(router)
        self.replicas = [Replica(env, i, config, cost_models[i], metrics, self._on_finish,
                                 self.next_event_ns, exact_steps)
                         for i in range(num_replicas)]
        self._children: dict = {}
        self._on_request_done = on_request_done
        self.num_done = 0
        self.turns_not_sent = 0   # later turns of conversations a rejection ended
        self._next_root_ns = _NEVER
        self._timers: list[int] = []  # heap of pending follow-up arrival times
        self._shared_first: set = set()
        self._quoted: set = set()
        self._max_concurrency = max_concurrency
        self._in_flight = 0
        self._held: deque = deque()   # (spec, held since ns) held back, in arrival order
        self._releasing = False
        self.client_arrivals: list[int] = []   # ns each request reached the client (gated)
        self.held_waits: list[int] = []        # ns each held request waited to be sent

    def next_event_ns(self, replica: Replica) -> int:
        """Earliest time anything outside ``replica`` can happen: the next arrival, a
        pending follow-up, or — while follow-ups wait on finishes — another replica's next
        move (a finish there may release a follow-up routed here at once)."""
        timers = self._timers
        while timers and timers[0] <= self.env.now:  # fired: URGENT, before any step
            heapq.heappop(timers)
        t = self._next_root_ns
        if timers and timers[0] < t:
            t = timers[0]
        if self._children or self._held:   # a finish there may send one here at once
            for rep in self.replicas:
                if rep is not replica and rep.busy_until_ns < t:
                    t = rep.busy_until_ns
        return t

    def run(self, specs) -> None:
        """Serve ``specs`` (RequestSpec list) to the end; follow-ups wait for their parent.

        One replica without follow-ups (and without ``exact_steps``) runs as a plain loop
        (:meth:`Replica.serve_alone`): with nothing else to interleave, SimPy would only
        deliver the arrivals, and the loop delivers them at the same instants and in the
        same order. Otherwise the arrivals and replicas run as SimPy processes.
        """
        roots = self._prepare(specs)
        rep = self.replicas[0]
        if (len(self.replicas) == 1 and not self._children and not rep.exact_steps
                and self._max_concurrency is None):
            rep.serve_alone([max(s.arrival_ns, 0) for s in roots],
                            lambda k, now: self._deliver(roots[k], now))
            return
        self.env.process(self._arrivals(roots))
        self.env.run()

    def start(self, specs) -> None:
        """Start serving ``specs`` as SimPy processes (``env.run()`` then serves them)."""
        self.env.process(self._arrivals(self._prepare(specs)))

    def _prepare(self, specs) -> list:
        """Root requests by arrival; follow-ups filed under their parent."""
        roots = []
        seen: set = set()
        shared: set = set()
        quoted: set = set()
        for s in specs:
            if s.after is None:
                roots.append(s)
            else:
                self._children.setdefault(s.after, []).append(s)
            key = first_content_key(s.prompt)
            if key in seen:
                shared.add(key)
            else:
                seen.add(key)
            for cid, _ in s.prompt:
                quoted.add(hash(cid))
        # Requests whose first token begins no other request's content cannot share KV
        # blocks, nor can blocks holding an answer that no prompt quotes: those are
        # hashed only if their request is preempted (Request.cache_private,
        # Request.output_private).
        self._shared_first = shared
        self._quoted = quoted
        roots.sort(key=lambda s: s.arrival_ns)
        return roots

    def _arrivals(self, specs):
        env, i, n = self.env, 0, len(specs)
        while i < n:
            t = specs[i].arrival_ns
            self._next_root_ns = t
            if t > env.now:
                yield _ArrivalTimer(env, t - env.now)
            while i < n and specs[i].arrival_ns <= env.now:
                self._deliver(specs[i])
                i += 1
        self._next_root_ns = _NEVER

    def _deliver(self, spec, now: int | None = None, held_since: int | None = None) -> None:
        t = self.env.now if now is None else now
        if self._max_concurrency is not None:
            if held_since is None:
                self.client_arrivals.append(t)
            else:
                self.held_waits.append(t - held_since)
            if self._in_flight >= self._max_concurrency:
                self._held.append((spec, t if held_since is None else held_since))
                return
            self._in_flight += 1
        req = new_request(spec, t)
        req.cache_private = first_content_key(spec.prompt) not in self._shared_first
        req.output_private = hash(req.output_content_id) not in self._quoted
        self.router.choose(req, self.replicas, spec.session_id).submit(
            req, self.metrics.delivered(req.arrival_ns))

    def _release(self) -> None:
        """Send held requests while slots are free (not re-entered: a held request
        rejected on delivery finishes inside this loop, which goes on)."""
        if self._releasing:
            return
        self._releasing = True
        while self._held and self._in_flight < self._max_concurrency:
            spec, since = self._held.popleft()
            self._deliver(spec, held_since=since)
        self._releasing = False

    def _on_finish(self, req: Request, t_ns: int) -> None:
        self.num_done += 1
        if self._on_request_done is not None:
            self._on_request_done(self.num_done)
        if self._max_concurrency is not None:
            self._in_flight -= 1
            self._release()   # the longest held goes first, before any follow-up below
        # A rejected turn ends its conversation: the client got an error (vLLM's server:
        # HTTP 400) and has no answer to follow up on, so the session's later turns are not
        # sent; a closed-loop user's next conversation still starts, a think time after.
        session = req.spec.session_id if req.spec is not None else None
        ended = session if req.record.finish_reason == "rejected" else None
        parents = [req.request_id]
        while parents:
            for child in self._children.pop(parents.pop(), ()):
                if ended is not None and child.session_id == ended:
                    self.turns_not_sent += 1
                    parents.append(child.request_id)
                elif child.think_time_ns <= 0:
                    self._deliver(child)  # seen by the step that starts now
                else:
                    ev = _ArrivalTimer(self.env, child.think_time_ns)
                    ev.callbacks.append(lambda _e, c=child: self._deliver(c))
                    heapq.heappush(self._timers, t_ns + child.think_time_ns)
