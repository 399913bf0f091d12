"""Open-loop conversations: the load they build up to, and whether a run reached it.

New conversations arrive open-loop, ``r`` per second; each lasts ``D`` seconds (its turns,
their answers and the think times between them). Conversations in progress build up from
none to about ``r·D`` (Little's law) over the first ``D`` seconds, and the request rate
with them, to ``r`` × the mean turns per conversation: the load the engine must sustain.
A follow-up turn waits for the answer before it, so an overloaded engine slows its own
arrivals: the request-level stability test (arrivals against finishes) passes however
overloaded the rate, and the test is made on conversations instead: an engine that keeps
up finishes conversations as fast as they open, so those in progress level off; one that
does not lets them pile up.

A run whose conversations all open within ``W`` seconds can show that only from ``D`` to
``W``; a short run (a sweep of the conversation rate at a fixed request count shortens
``W`` as it raises ``r``) ends in the ramp, and its latencies understate the rate. ``D``
here leaves out the time turns waited to be scheduled (``D₀``), which an overloaded run
stretches without end; the run is judged when ``W >= RAMP·D₀`` (the part after the ramp
at least as long as the ramp).
"""

from __future__ import annotations

import math

import pandas as pd

from .executors import piles_up

#: Opening window over conversation length (queueing left out) from which a run is judged.
RAMP = 2.0


def session_ramp(specs, requests: pd.DataFrame) -> dict | None:
    """The load of a run of open-loop conversations, and whether the engine kept up.

    Args:
        specs: the ``RequestSpec`` list served; conversations are the specs with a
            ``session_id``.
        requests: the run's per-request table (``request_id``, ``arrival_s``,
            ``first_scheduled_s``, ``finish_s``; NaN where an event did not happen, e.g. a
            rejected request, which ends at its arrival here).

    Returns:
        ``None`` for fewer than two conversations or all opening at one instant; else
        ``{conversations, opening_s (W: first to last opening, s), conversation_s (D₀: mean
        last finish − opening less the turns' queueing, s), mean_turns,
        steady_request_rate ((conversations − 1) / W × mean_turns, req/s), steady_state
        (W >= RAMP·D₀), stable (requests do not pile up, as
        :func:`simulator.executors.piles_up` tests, from D₀ after the first opening to the
        last; a run that ended in its ramp can only be told to pile up: False then, else
        None), num_requests_needed (requests for W = RAMP·D₀ at this run's rate, D₀ and
        turns)}``.
    """
    session = {s.request_id: s.session_id for s in specs if s.session_id is not None}
    req = requests[requests["request_id"].isin(session.keys())]
    if len(req) == 0:
        return None
    end = req["finish_s"].fillna(req["arrival_s"])
    waited = (req["first_scheduled_s"].fillna(end) - req["arrival_s"]).clip(lower=0)
    g = pd.DataFrame({"sid": req["request_id"].map(session), "start": req["arrival_s"],
                      "end": end, "waited": waited}).groupby("sid")
    conv = pd.DataFrame({"start": g["start"].min(), "end": g["end"].max(),
                         "waited": g["waited"].sum(), "turns": g.size()})
    n = len(conv)
    t0, t1 = float(conv["start"].min()), float(conv["start"].max())
    if n < 2 or t1 <= t0:
        return None
    opening = t1 - t0
    length = float((conv["end"] - conv["start"] - conv["waited"]).mean())
    turns = float(conv["turns"].mean())
    rate = (n - 1) / opening
    steady = opening >= RAMP * length
    # requests while conversations open (the last opening ends the window: later arrivals
    # are follow-ups of a load that is winding down), past the ramp when there is a past
    served = req[(req["arrival_s"] <= t1) & req["finish_s"].notna()]
    if steady:
        stable = not piles_up(served, rate * turns, start=t0 + length)
    else:   # a queue that grows during the ramp grows the more once the load is up
        stable = False if piles_up(served, rate * turns, start=t0) else None
    return {"conversations": n, "opening_s": opening, "conversation_s": length,
            "mean_turns": turns, "steady_request_rate": rate * turns,
            "steady_state": bool(steady), "stable": stable,
            "num_requests_needed": int(math.ceil((RAMP * length * rate + 1) * turns))}


#: What a sweep's or plan's ``ramp-up only`` point means.
RAMP_TEXT = ("the conversations (open-loop sessions) ended before they built up their load, "
             "so the latencies understate it and whether the engine keeps up is not known; "
             "raise workload.num_requests")


def ramp_warning(summary: dict) -> str | None:
    """What a run that ended in its ramp measured (None when it was judged or served no
    open-loop conversations): ``summary["sessions"]`` of :func:`session_ramp`."""
    s = summary.get("sessions")
    if not s or s.get("steady_state"):
        return None
    if s.get("stable") is False:   # overloaded already while the load built up
        return (f"workload.sessions: requests queued more and more while the conversations "
                f"opened ({s['opening_s']:.4g} s), before they even overlapped as under a "
                f"sustained load (about {s['steady_request_rate']:.4g} req/s: the "
                f"conversation rate × {s['mean_turns']:.3g} turns): this rate overloads the "
                f"engine, and a longer run only queues more")
    return (f"workload.sessions: the conversations opened over {s['opening_s']:.4g} s and "
            f"last {s['conversation_s']:.4g} s each on average (turns, answers and think "
            f"times, not counting waits for a slot), so the run ended before they overlapped "
            f"as under a sustained load (about {s['steady_request_rate']:.4g} req/s: the "
            f"conversation rate × {s['mean_turns']:.3g} turns): its latencies are those of "
            f"a ramp-up and understate that load; raise workload.num_requests to at least "
            f"{s['num_requests_needed']} (conversations opening over {RAMP:g}× their length; "
            f"more if the load lengthens them)")


__all__ = ["RAMP", "RAMP_TEXT", "ramp_warning", "session_ramp"]
