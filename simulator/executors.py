"""Where simulation jobs run: in this process, a local process pool, or a Ray cluster.

A :class:`Job` is one replication of one scenario. Its random numbers come from the
scenario's ``workload.seed`` and the replication index alone (``simulate`` derives them
from ``numpy.random.SeedSequence([seed, replication])``), never from the worker that runs
it, so every executor returns identical results for the same jobs, in job order.

Executors (``make_executor``):

* ``serial``: in this process (tests, one job).
* ``local`` (default): a ``concurrent.futures.ProcessPoolExecutor`` over all cores. Workers
  come from a ``forkserver`` (``spawn`` where that is unavailable) so a parent holding
  threads (progress bars) is never forked. Where workers cannot be started or die (a
  sandbox that refuses the forkserver's socket, a worker killed for memory), the jobs run
  in this process instead, after one warning line on stderr. Ctrl-C reaches only this
  process (the workers ignore SIGINT), which stops the workers and exits 130 (SIGTERM: 143);
  a worker whose servesim died (SIGKILL, which no handler sees) ends itself.
* ``ray``: ``ray.init(address=...)`` then one remote task per job, for users who outgrow
  one machine. Needs the optional ``[ray]`` extra, and servesim installed on every node.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InputError
from .metrics import exact_figures, saturation_throughput, served_rows
from .policy.request import NS_PER_S

EXECUTORS = ("local", "serial", "ray")
#: A run is stable when its achieved request throughput is at least this fraction of the
#: offered rate; a slower run is an overloaded queue and is flagged, not averaged.
#: A heuristic (no flag sets it): a run below it is still stable unless its backlog grows
#: (:func:`backlog_grows`); 0.95 would pass overloads without that test, 0.99 test more runs.
STABLE_FRACTION = 0.98
#: Share above the saturation probe's steady throughput within which a run that falls behind
#: its arrivals may still be noise (a plan's default indifference zone).
#: The default of ``plan.tolerance``: a plan's rate search passes its own; sweeps and the
#: diagnosis's ties use this one.
CAPACITY_TOLERANCE = 0.02


@dataclass(frozen=True)
class Job:
    """One replication of one scenario.

    Attributes:
        scenario: a validated :class:`~simulator.scenario.Scenario`.
        replication: replication index (seed derivation as in :func:`simulator.run.simulate`).
        full: return the whole :class:`~simulator.metrics.RunResult` (per-request tables for
            CDFs) instead of the compact :func:`job_output` dict.
        diagnose: add the diagnosis's binding limit (``binding``,
            :func:`simulator.diagnosis.find_limits`) to the compact output.
        tag: caller's label, returned untouched (not used for seeding).
    """

    scenario: Any
    replication: int = 0
    full: bool = False
    diagnose: bool = False
    tag: Any = field(default=None, compare=False)


def _arrival_rate(req) -> float | None:
    """``(n − 1) / (last arrival − first arrival)`` of ``req``'s rows, requests/s; ``None``
    for fewer than 2 requests or no span."""
    arr = req["arrival_s"].to_numpy()
    if arr.size < 2 or arr.max() <= arr.min():
        return None
    return float((arr.size - 1) / (arr.max() - arr.min()))


def offered_rate(result) -> float | None:
    """Offered load of a run, requests/s: the counted requests' arrival rate
    (:func:`_arrival_rate`); with a client-side limit, the rate at which requests reached
    the client (``summary["client"]``, unrounded), before the limit held any back."""
    client = exact_figures(result.summary, result.exact).get("client") or {}
    if client.get("offered_rate"):
        return client["offered_rate"]
    req = result.requests
    return _arrival_rate(req[~req["warmup"]]) if len(req) else None


def _served(req):
    """The counted requests the engine took (not warm-up, not rejected): a rejected request
    is never scheduled nor finished, and would read as a backlog that never drains."""
    keep = ~req["warmup"]
    if "finish_reason" in req:
        keep &= req["finish_reason"] != "rejected"
    return req[keep]


def window_rates(result) -> tuple[float, float] | None:
    """Offered and achieved request rates (req/s) over one window: from the first finish
    to the last arrival of the counted requests. Arrivals and finishes are counted in the
    same window, so a stable run compares equal however long its drain after the last
    arrival (a whole-run throughput would count that drain against it). ``None`` when
    the window is shorter than a quarter of the arrival span (a burst, a very short run).
    Rejected requests are left out (:func:`_served`).
    """
    req = result.requests
    if len(req) == 0:
        return None
    req = _served(req)
    arr = req["arrival_s"].to_numpy(dtype=float)
    fin = req["finish_s"].to_numpy(dtype=float)
    done = fin[~np.isnan(fin)]
    if arr.size < 2 or done.size == 0:
        return None
    t0, t1 = float(done.min()), float(arr.max())
    if t1 - t0 <= 0.25 * (arr.max() - arr.min()):
        return None
    w = t1 - t0
    return (float(((arr >= t0) & (arr <= t1)).sum() / w),
            float(((done >= t0) & (done <= t1)).sum() / w))


#: Segments of the last three quarters of the arrival span whose mean counts the backlog
#: trend is fitted to (the first quarter is the start-up: requests in flight build up from
#: none to their steady number in about one E2EL).
TREND_SEGMENTS = 6
#: t statistic (slope / its standard error over the segments) from which a trend counts.
#: A heuristic: nominally a one-sided p of 0.02 with the 6 segments' 4 degrees of freedom
#: (2: 0.06, a stable run flagged too often; 6: 0.002, a slow growth missed).
TREND_T = 3.0
#: Growth of the requests in the system (running or waiting), as a share of the arrivals,
#: from which a run that does not keep its queue waiting is still unstable: its batch
#: swells without bound (A100, Llama-3.1-8B chat at 1.2x capacity: 0.33-0.53). A stable
#: batch drifts too: by chance, as the outputs in flight vary (up to 9% over 40 s of 4 s
#: answers), and near capacity while it settles, each added request slowing every step
#: (plan_chat at 10 req/s on one H100: 12% over its first 40 s, 0 over 300 s).
SWELL_FRACTION = 0.2


def open_trend(arr: np.ndarray, end: np.ndarray, start: float | None = None
               ) -> tuple[float, float]:
    """Slope (per second) of the number of intervals ``[arr, end)`` open at a time, fitted
    by least squares to its exact mean over :data:`TREND_SEGMENTS` equal segments from
    ``start`` (s; default: past the first quarter of the arrival span) to the last arrival,
    and its t statistic (inf for an exact line that rises)."""
    from scipy import stats

    a0, a1 = float(arr.min()), float(arr.max())
    edges = np.linspace(a0 + (a1 - a0) / 4 if start is None else start, a1,
                        TREND_SEGMENTS + 1)
    lo, hi = edges[:-1], edges[1:]
    # one segment at a time: memory of one column of the requests, however many there are
    mean_open = [np.clip(np.minimum(end, b) - np.maximum(arr, a), 0, None).sum() / (b - a)
                 for a, b in zip(lo, hi)]
    fit = stats.linregress((lo + hi) / 2, mean_open)
    t = fit.slope / fit.stderr if fit.stderr > 0 else (math.inf if fit.slope > 0 else 0.0)
    return float(fit.slope), float(t)


def backlog_grows(result) -> bool:
    """Whether requests pile up: over the last three quarters of the arrival span
    (:func:`open_trend`), the requests waiting to be scheduled rise by at least 1 −
    :data:`STABLE_FRACTION` of the arrival rate, or those in the system (running or
    waiting) by :data:`SWELL_FRACTION` of it, each with a t statistic of at least
    :data:`TREND_T`; the latter from one mean service time (first scheduled to finish, of
    the requests of the first quarter) after the first arrival where that is later, and
    not in a run whose arrivals end before twice that (the requests in the system are
    still building up). A short stable run can fall below ``STABLE_FRACTION`` in the
    window of :func:`window_rates` (the outputs still running when the arrivals end); it
    shows no such trend. Rejected requests are left out (:func:`_served`).
    """
    req = _served(result.requests)
    arr = req["arrival_s"].to_numpy(dtype=float)
    if arr.size < 2 or arr.max() <= arr.min():
        return False
    a0, span = float(arr.min()), float(arr.max() - arr.min())
    # The requests in the system build up from none to their steady number over about one
    # service time (first scheduled to finish: queueing, which is tested, left out; of the
    # first quarter's requests, before a swelling batch slows them): the swell is fitted
    # past it, and not at all when it takes over half the arrivals (10 requests in 0.7 s
    # of 3 s answers rise throughout, on an idle engine).
    early = req[req["arrival_s"] <= a0 + span / 4]
    service = (early["finish_s"] - early["first_scheduled_s"]).mean()
    swell = a0 + max(span / 4, 0.0 if np.isnan(service) else float(service))
    return piles_up(req, (arr.size - 1) / span, swell=swell <= a0 + span / 2,
                    swell_start=swell)


def piles_up(req, rate: float, start: float | None = None, *, swell: bool = True,
             swell_start: float | None = None) -> bool:
    """The trend test of :func:`backlog_grows` on requests ``req`` (``arrival_s``,
    ``first_scheduled_s``, ``finish_s``; NaN: never) arriving at ``rate`` req/s, fitted
    from ``start`` (s; default past the first quarter of the arrival span) to the last
    arrival of ``req``; the requests in the system from ``swell_start`` (s; default
    ``start``), and not at all without ``swell``."""
    arr = req["arrival_s"].to_numpy(dtype=float)
    tests = [("first_scheduled_s", 1 - STABLE_FRACTION, start)]
    if swell:
        tests.append(("finish_s", SWELL_FRACTION,
                      start if swell_start is None else swell_start))
    for col, share, begin in tests:
        end = req[col].to_numpy(dtype=float)
        slope, t = open_trend(arr, np.where(np.isnan(end), np.inf, end), begin)  # NaN: never
        if slope >= share * rate and t >= TREND_T:
            return True
    return False


def over_capacity(out: dict, capacity: float | None,
                  tolerance: float = CAPACITY_TOLERANCE, nominal: float | None = None) -> bool:
    """Whether a run (``out``: its :func:`job_output`) is unstable by the saturation
    probe's bound, ``capacity`` (req/s, the probe's ``steady_throughput``; None: unknown):
    its requests arrived more than ``tolerance`` faster than it, at the rate they arrived
    (``offered_rate``), and it served less than :data:`STABLE_FRACTION` of them, whatever
    its backlog's trend (:func:`backlog_grows` cannot tell a queue growing a few % a second
    from noise in a few thousand requests: M/D/1 at 1.03 × capacity passes it, 2000
    requests); or the ``nominal`` rate asked for (req/s) is past it at all, however the
    run's draws came: a short run's arrivals miss their nominal rate by several % (±5% in
    400 Poisson requests), and a search that states nominal rates must not state one past
    capacity (M/D/1 of capacity 10 req/s would plan 10.4, or 10.1 within a 2% margin)."""
    if capacity is None:
        return False
    rate = out.get("offered_rate")
    short = out.get("served_fraction") is not None and out["served_fraction"] < STABLE_FRACTION
    return (rate is not None and rate > capacity * (1 + tolerance) and short) or (
        nominal is not None and nominal > capacity)


def steady_throughput(requests) -> float | None:
    """Requests/s of a burst (a run's request table) while it kept every replica saturated:
    :func:`simulator.metrics.saturation_throughput` up to the last moment every replica
    still had a request waiting (the earliest of the replicas' last first-scheduled times),
    None when under a quarter of the requests (or 5) finish before it: a burst no larger
    than its slots (256 slots, 200 requests read 0.31 × capacity) or replicas that ran dry
    at different times finish as their requests run out, not at the engine's capacity."""
    req = served_rows(requests)
    if len(req) < 5:
        return None
    last_wait = float(req.groupby("replica")["first_scheduled_s"].max().min())
    return saturation_throughput(req["finish_s"].to_numpy() * NS_PER_S,
                                 until_ns=last_wait * NS_PER_S)


def unbounded_warning(what: str) -> str:
    """The warning for ``what`` (a plan candidate, a sweep's lines) whose saturation probe
    bounds nothing (:func:`steady_throughput` None)."""
    return (f"{what}: the saturation probe (all requests at once) did not keep every "
            f"replica's queue busy while a quarter of its requests finished, so no capacity "
            f"bound applies: a rate past capacity can read stable, more so in a short run; "
            f"raise workload.num_requests (to about 10 × the requests running at once)")


def job_output(result) -> dict:
    """The compact output of a job: ``summary`` (the run summary), ``exact`` (its figures
    unrounded where known, :func:`simulator.metrics.exact_figures`: tables and means over
    replications read them, to round once), ``offered_rate``
    (req/s, :func:`offered_rate`) and ``stable``: achieved >= :data:`STABLE_FRACTION` ×
    offered over the window of :func:`window_rates` (whole-run figures when that window
    is too short), or else no growing backlog (:func:`backlog_grows`); True when the rates
    are unknown (e.g. a closed loop). With them ``served_fraction``, achieved / offered over
    that window (None when unknown), and ``steady_throughput``, req/s between the 10th and
    90th percentile finishes while every replica had requests waiting
    (:func:`steady_throughput`; None when too few finished then): of a burst, the engine's
    capacity without its ramp-up and drain. For
    open-loop conversations (``summary["sessions"]``,
    :func:`simulator.session_ramp.session_ramp`): their steady request rate, their
    stability (True while the run is too short to judge) and ``steady``, whether it was
    long enough to judge."""
    s = result.summary
    exact = exact_figures(s, result.exact)
    conv = exact.get("sessions")
    if conv:   # follow-ups wait for answers: judged on the conversations' load instead
        return {"summary": s, "exact": exact, "offered_rate": conv["steady_request_rate"],
                "stable": conv["stable"] is not False, "steady": conv["steady_state"]}
    offered = offered_rate(result)
    rates = window_rates(result)
    if rates is None:   # whole run: what was served against what the engine took
        taken = _arrival_rate(_served(result.requests)) if len(result.requests) else None
        rates = (taken, s.get("request_throughput") or 0.0) if taken else None
    served = rates[1] / rates[0] if rates is not None and rates[0] else None
    stable = served is None or served >= STABLE_FRACTION or not backlog_grows(result)
    client = s.get("client") or {}
    if client.get("offered_rate") and len(result.requests) > 1:
        # a client limit keeps the engine's queue short however far behind it falls: the
        # requests then go out slower than they reach the client
        sent = _arrival_rate(result.requests)
        stable = stable and sent is not None and sent >= STABLE_FRACTION * offered
    return {"summary": s, "exact": exact, "offered_rate": offered, "stable": bool(stable),
            "served_fraction": served,
            "steady_throughput": steady_throughput(result.requests)
            if len(result.requests) else None}


def run_job(job: Job):
    """Run one job (in whatever process): ``RunResult`` if ``job.full``, else
    :func:`job_output` with ``alone_ms``: the SLO statistics of requests served alone
    (:func:`simulator.alone.slo_floors`) of a run that missed an SLO, which tell a rate
    search when no rate can meet it (``{}`` otherwise), ``start_burst``: whether a
    closed loop's start burst set its TTFT p99 (:func:`simulator.run.start_burst_warning`),
    and ``grid``: how far its steps went past its measured profile's calibration grid
    (:func:`simulator.cost_model.grid_excess`; None without a measurements CSV)."""
    from .alone import slo_floors
    from .cost_model import build_cost_model, grid_excess
    from .run import simulate, start_burst_warning

    res = simulate(job.scenario, replication=job.replication)
    if job.full:
        return res
    out = job_output(res)
    # floors only where an SLO was missed: the only place the search reads them
    out["alone_ms"] = slo_floors(job.scenario, res) if res.summary.get("slo_met") is False \
        else {}
    # a closed loop's users all sending at 0 s set its TTFT p99 (a sweep says where)
    out["start_burst"] = start_burst_warning(job.scenario, res) is not None
    out["grid"] = grid_excess(build_cost_model(job.scenario), job.scenario, res)
    if job.diagnose:
        from .diagnosis import find_limits
        out["binding"] = find_limits(job.scenario, res)["binding"]
    return out


class SerialExecutor:
    """Runs jobs one after another in this process."""

    name = "serial"

    def run(self, jobs: Sequence[Job], progress: Callable[[int, int], None] | None = None
            ) -> list:
        """Outputs of ``jobs`` in order; ``progress(done, total)`` after each."""
        out = []
        for i, j in enumerate(jobs):
            out.append(run_job(j))
            if progress:
                progress(i + 1, len(jobs))
        return out

    def close(self) -> None:
        """Release nothing: a serial executor holds no processes. Called on leaving a
        ``with`` block."""
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalExecutor(SerialExecutor):
    """A process pool kept for the executor's lifetime (one pool for a whole search).

    Args:
        workers: processes (default ``os.cpu_count()``); 1 runs serially in-process.
    """

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods
                                              else "spawn")
            if ctx.get_start_method() == "forkserver":
                ctx.set_forkserver_preload(["simulator.executors", "simulator.run"])
                _start_forkserver_ignoring_sigint(ctx)
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                             initializer=_end_with_parent)
        return self._pool

    def run(self, jobs, progress=None) -> list:
        """Outputs of ``jobs`` in job order (:func:`run_job` in the pool's processes);
        ``progress(done, total)`` as each result is collected in that order. One worker
        or one job runs in this process. A pool whose workers fail (``BrokenPipeError``,
        ``BrokenProcessPool``) is closed with a warning on stderr, and the jobs rerun here
        with ``workers`` set to 1: jobs are deterministic, so the results are the same.

        Raises:
            Exception: what a job raised (re-raised from its future).
            KeyboardInterrupt: after the workers are killed and the pool dropped.
        """
        if self.workers == 1 or len(jobs) <= 1:
            return super().run(jobs, progress)
        try:
            futures = [self._get_pool().submit(run_job, j) for j in jobs]
            out = []
            for i, f in enumerate(futures):
                out.append(f.result())
                if progress:
                    progress(i + 1, len(jobs))
            return out
        except KeyboardInterrupt:
            self._stop_workers()
            raise
        except (BrokenPipeError, BrokenProcessPool) as e:
            # Jobs are deterministic wherever they run: the same results, only slower.
            print(f"servesim: warning: worker processes failed ({e.__class__.__name__}: "
                  f"{e}); running the jobs in this process (--workers 1)", file=sys.stderr)
            self.close()
            self.workers = 1
            return super().run(jobs, progress)

    def _stop_workers(self) -> None:
        """Kill the workers (they ignore SIGINT, so an interrupted run would otherwise
        wait for their jobs) and drop the pool."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        terminate = getattr(pool, "terminate_workers", None)   # Python >= 3.14
        if terminate is not None:
            terminate()
            return
        for p in list((getattr(pool, "_processes", None) or {}).values()):
            p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Shut the process pool down, cancelling the jobs not started and waiting for the
        running ones; the next :meth:`run` starts a new pool."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _end_with_parent() -> None:
    """Pool worker initializer: end this worker when the servesim process that started it
    dies. A servesim killed by SIGKILL, which no handler sees, would otherwise leave its
    workers computing their jobs to the end (under ``forkserver`` a worker's parent is the
    fork server, which itself stays up while the workers do). A daemon thread waits on
    multiprocessing's sentinel of the parent process, readable once it has exited."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="servesim-parent-watch", daemon=True).start()


def _start_forkserver_ignoring_sigint(ctx) -> None:
    """Start the fork server with SIGINT ignored, which it and every worker it forks
    inherit (an interrupted worker prints its own traceback; the server imports the
    preloaded modules for seconds before it would ignore SIGINT itself), so Ctrl-C reaches
    only this process. Then wait for those imports with a no-op process: a pool worker
    whose start is interrupted there would outlive this process and fail to read its
    queues. Only the main thread may set signal handlers: elsewhere the server starts as
    the pool starts it."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, old)
    ready = ctx.Process(target=os.getpid, daemon=True)
    ready.start()
    ready.join()


#: An HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame
#: (RFC 9113 §3.4). Ray's GCS and client server are gRPC, so they answer with a SETTINGS
#: frame (type 0x4, the fourth byte of the 9-byte frame header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a Ray address where no Ray answers (``ray.init`` would retry for
    minutes, printing its C++ client's retries): ``host:port`` or ``ray://host[:port]``
    must accept a TCP connection and answer an HTTP/2 preface with a SETTINGS frame, as
    Ray's gRPC servers do, within ``timeout_s``. ``auto`` and ``local`` are left to Ray.

    Raises:
        InputError: naming ``--ray-address`` and what answered there.
    """
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep:   # no port given: Ray's defaults (GCS 6379, client server 10001)
        host, port = hostport, "10001" if address.startswith("ray://") else "6379"
    if ("://" in hostport or not host.strip("[] ") or host != host.strip()
            or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536):
        raise InputError(f"--ray-address {address!r}: expected host:port (port 1 to 65535), "
                         f"ray://host:port, auto or local")
    head = b""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as s:
            s.sendall(_H2_PREFACE)
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError) as e:
        if not head and not isinstance(e, TimeoutError):
            raise InputError(f"--ray-address {address}: no Ray cluster answers there "
                             f"({e.__class__.__name__}: {e}); start one with 'ray start "
                             f"--head' or leave out --ray-address for a local Ray") from None
    if len(head) < 9 or head[3] != 4:
        raise InputError(f"--ray-address {address}: something listens there but it is not "
                         f"Ray (it does not answer as a gRPC server does); the head's address "
                         f"is printed by 'ray start --head' (GCS port 6379 by default, "
                         f"ray:// client port 10001)")


#: A warning or error line of Ray's C++ core (``[date time W pid tid] file.cc:210: text``).
_RAY_WARNING = re.compile(r"^\[[^\]]* [WE] [^\]]*\] [\w.]+:\d+: (.*)$", re.MULTILINE)


@contextlib.contextmanager
def _stderr_to(file):
    """File descriptor 2 (Python's and C++'s stderr alike) goes to ``file`` inside."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class RayExecutor(SerialExecutor):
    """One Ray task per job on the cluster at ``address`` (``None``: a local Ray, or the
    one ``RAY_ADDRESS`` names). Results come back in job order.

    Raises:
        InputError: Ray is not installed, or nothing answers at ``address``.
    """

    name = "ray"

    def __init__(self, address: str | None = None, **init_kwargs):
        try:
            import ray
        except ImportError:
            raise InputError('--executor ray needs Ray: pip install -e ".[ray]"') from None
        self._ray = ray
        if not ray.is_initialized():
            if address is not None:
                _check_reachable(address)
            with tempfile.TemporaryFile("w+") as log:
                try:
                    # Joining a cluster, Ray's C++ client prints a line per retry (about
                    # 20 over 20 s when, say, the auth token differs): kept for the error.
                    with _stderr_to(log) if address else contextlib.nullcontext():
                        ray.init(address=address, **init_kwargs)
                except ConnectionError as e:
                    first = str(e).splitlines()[0] if str(e) else type(e).__name__
                    log.seek(0)
                    why = [m.group(1) for m in _RAY_WARNING.finditer(log.read())]
                    hint = ("; the cluster asks for a token: set RAY_AUTH_MODE=token here, "
                            "with its token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
                            if why and "Unauthenticated" in why[-1] else "")
                    raise InputError(f"--ray-address {address}: Ray did not connect: {first}"
                                     + (f" (last: {why[-1]})" if why else "") + hint
                                     ) from None
        self._task = ray.remote(run_job)

    def run(self, jobs, progress=None) -> list:
        """Outputs of ``jobs`` in job order, one Ray task each; ``progress(done, total)``
        as tasks finish, in whatever order they finish.

        Raises:
            ray.exceptions.RayTaskError: a job raised; Ray's error is also an instance of
                the job's exception class.
        """
        ray = self._ray
        refs = [self._task.remote(j) for j in jobs]
        index = {r: i for i, r in enumerate(refs)}
        out: list = [None] * len(refs)
        waiting = list(refs)
        done = 0
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for r in ready:
                out[index[r]] = ray.get(r)
                done += 1
            if progress:
                progress(done, len(refs))
        return out


def make_executor(kind: str = "local", *, workers: int | None = None,
                  address: str | None = None):
    """An executor by name (:data:`EXECUTORS`); use it as a context manager.

    Args:
        kind: ``local`` (process pool over ``workers`` or all cores), ``serial`` or
            ``ray`` (``ray.init(address=address)``).

    Raises:
        InputError: unknown kind, or ``ray`` without Ray installed.
    """
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "serial":
        return SerialExecutor()
    if kind == "ray":
        return RayExecutor(address)
    raise InputError(f"--executor {kind}: allowed: {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "Job", "LocalExecutor", "RayExecutor", "STABLE_FRACTION",
           "SerialExecutor", "job_output", "make_executor", "offered_rate", "run_job",
           "window_rates"]
