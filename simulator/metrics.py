"""Run metrics: per-request latencies, pooled ITL, step time series and the run summary.

Definitions follow ``vllm bench serve`` (``vllm/benchmarks/serve.py``):

* TTFT  = first token time - arrival (queueing and prefill included).
* TPOT  = (E2EL - TTFT) / (output_tokens - 1) per request; requests with <= 1 output token
  have no TPOT. GuideLLM's "TPOT" includes the first token; genai-perf's "ITL" is this TPOT.
* ITL   = every gap between consecutive tokens of a request, pooled over all requests.
* E2EL  = finish (last token) time - arrival.  queue = first scheduled - arrival.
* goodput = completed requests meeting every per-request SLO, per second of the run.
* An SLO on a statistic with no samples (TPOT/ITL when every completed request has one
  output token) is met vacuously, as goodput's per-request TPOT check passes such requests.

Percentiles are ``numpy.percentile`` with its default ``linear`` method. The pooled ITL is
kept as ``(gap_ns, count)`` runs, never per token, and its percentiles equal
``numpy.percentile`` of the expanded gaps exactly (:func:`percentile_from_runs`).

Warm-up: the first ``warmup_requests`` requests *by arrival* are excluded from every
request figure (counts, latencies, throughput, goodput, concurrency). The measurement
window is [0, last finish] without warm-up (``vllm bench serve``'s benchmark duration: its
clock starts before the first request's arrival gap) and [first counted arrival, last
counted finish] with it (ending at the last counted arrival instead when a rejected
request returns after the last finish); throughputs and time-weighted means are over that
window. Pooled ITL leaves warm-up requests' gaps out too: the simulator pools gaps per
step without request identity, except for the requests that may be warm-up ones
(:meth:`MetricsCollector.delivered`), whose gaps it keeps apart until the set is known.
Step-based figures (running requests, KV usage) cannot be split by request: they are cut
to the window at the resolution of the fine time bins (exact when no step straddles a
window edge, which always holds without warm-up).
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from .errors import InputError
from .policy.kv_cache import cdiv
from .policy.request import CAPPED_ABOVE_MAX_MODEL_LEN, NS_PER_MS, NS_PER_S, RequestRecord

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "queue_ms")
#: How reports and messages name each metric.
METRIC_LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2EL",
                 "queue_ms": "Queue"}
PER_REQUEST_METRICS = ("ttft_ms", "tpot_ms", "e2el_ms", "queue_ms")
STATS = ("mean", "std", "p50", "p90", "p95", "p99", "max")
SLO_STATS = ("mean", "p50", "p90", "p95", "p99")   # the SLO statistics every summary has
# Any other percentile is allowed in an SLO too, as ``vllm bench serve
# --metric-percentiles`` takes any (p75, p99.9): computed for that SLO when asked for.
_PERCENTILE = re.compile(r"p((?:[1-9]\d{0,2}|0)(?:\.\d+)?)")
#: The statistics :func:`slo_stat_rank` takes, as one regular expression (the JSON schema's).
SLO_STAT_PATTERN = r"^(mean|p(100(\.0+)?|[1-9]\d?(\.\d+)?|0\.\d*[1-9]\d*))$"


def slo_stat_rank(stat: str) -> float:
    """Where an SLO statistic sorts: ``mean`` first, then percentiles by their number.

    Raises:
        ValueError: neither ``mean`` nor ``pNN`` with NN in (0, 100] (e.g. p99, p99.9).
    """
    if stat == "mean":
        return -1.0
    m = _PERCENTILE.fullmatch(stat) if isinstance(stat, str) else None
    if m is None or not 0 < float(m.group(1)) <= 100:
        raise ValueError(f"unknown statistic {stat!r}: use mean or pNN, a percentile in "
                         f"(0, 100] (p50, p90, p99, p99.9, ...)")
    return float(m.group(1))


def slo_stat(values: np.ndarray, stat: str, counts: np.ndarray | None = None
             ) -> float | None:
    """``stat`` (``mean`` or ``pNN``, :func:`slo_stat_rank`) of ``values``, in their unit;
    with ``counts``, value ``i`` is taken ``counts[i]`` times (ITL runs,
    :func:`percentile_from_runs`). Percentiles are numpy's linear ones, as in ``vllm bench
    serve`` (vllm/benchmarks/serve.py). None with no samples.

    Raises:
        ValueError: an unknown statistic.
    """
    rank = slo_stat_rank(stat)
    if counts is None:
        if not values.size:
            return None
        return float(np.mean(values) if rank < 0 else np.percentile(values, rank))
    n = counts.sum()
    if not n:
        return None
    if rank < 0:
        return float((values * counts).sum() / n)
    return float(percentile_from_runs(values, counts, rank))


REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
    "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "replica",
    "ttft_ms", "tpot_ms", "e2el_ms", "queue_ms", "finish_reason", "warmup",
)
TIMESERIES_COLUMNS = (
    "time_s", "bin_s", "replica", "running", "waiting", "kv_cache_usage", "busy",
    "running_max", "waiting_max", "kv_cache_usage_max", "steps", "prefill_tokens",
    "decode_tokens",
    "prefill_tok_s", "decode_tok_s", "preemptions",
)

FINE_BIN_NS = 10 * NS_PER_MS      # default fine bin before coarsening at finalize
DEFAULT_OUTPUT_BINS = 500         # default time series length: span / 500
_MAX_FINE_BINS = 1 << 15          # default bins kept per replica (memory bound)
_MAX_GIVEN_BINS = 1 << 20         # bins kept per replica for an explicit bin width
_SIG_DIGITS = 6
_STEP_BUFFER = 1 << 13            # steps buffered before binning them in bulk
_ITL_FOLD = 1 << 23               # appended ITL runs kept before folding (16 bytes each)


def round_sig(x, digits: int = _SIG_DIGITS):
    """Round a number to ``digits`` significant digits for JSON; NaN/inf/None -> None.

    Integers (not bools) are returned unchanged.
    """
    if x is None or isinstance(x, (bool, np.bool_)):
        return None if x is None else bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    if not math.isfinite(x):
        return None
    if x == 0.0:
        return 0.0
    return float(f"{x:.{digits}g}")


def percentile_from_runs(values, counts, q):
    """Linear percentiles of a multiset given as runs, without expanding it.

    Args:
        values: run values, shape (k,), any order (e.g. ITL gaps in ns, int64).
        counts: occurrences of each value, shape (k,), non-negative integers.
        q: percentile(s) in [0, 100], scalar or shape (m,).

    Returns:
        ``numpy.percentile(numpy.repeat(values, counts), q)`` bit for bit: the virtual
        index ``(n - 1) * q``, neighbour lookup and interpolation follow numpy's ``linear``
        method (``numpy/lib/_function_base_impl.py``: ``_get_indexes``, ``_lerp``), the
        neighbours found by binary search on cumulative counts.

    Raises:
        ValueError: no values (all counts zero), or q outside [0, 100].
    """
    v = np.asarray(values)
    c = np.asarray(counts, dtype=np.int64)
    order = np.argsort(v, kind="stable")
    v, c = v[order], c[order]
    keep = c > 0
    v, c = v[keep], c[keep]
    n = int(c.sum())
    if n == 0:
        raise ValueError("percentile of an empty set of runs")
    qf = np.true_divide(np.asarray(q, dtype=np.float64), 100)
    if np.any((qf < 0) | (qf > 1)):
        raise ValueError("percentiles must be in the range [0, 100]")
    qa = np.atleast_1d(qf)
    virtual = (n - 1) * qa
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = n - 1          # numpy uses index -1 here: the last element
    nxt[above] = n - 1
    below = virtual < 0
    prev[below] = 0
    nxt[below] = 0
    prev = prev.astype(np.intp)
    nxt = nxt.astype(np.intp)
    gamma = virtual - np.where(above, -1, prev)   # numpy's gamma sees the -1 index
    cum = np.cumsum(c)
    a = v[np.searchsorted(cum, prev, side="right")]
    b = v[np.searchsorted(cum, nxt, side="right")]
    diff = b - a
    out = a + diff * gamma
    hi = gamma >= 0.5
    out[hi] = (b - diff * (1 - gamma))[hi]
    return out if np.ndim(q) else out[0]


@dataclass
class RunResult:
    """Everything a run produced, ready for :mod:`simulator.report`.

    Attributes:
        summary: JSON-able dict of run figures (see :meth:`MetricsCollector.finalize`).
        requests: one row per request, columns :data:`REQUEST_COLUMNS`, in arrival order.
            Times in s (``*_s``), latencies in ms (``*_ms``), NaN where an event did not
            happen; ``warmup`` marks rows excluded from the figures.
        timeseries: fixed-width bins, columns :data:`TIMESERIES_COLUMNS`, rows per replica
            (``replica`` "0", "1", ...) then the cluster total (``replica`` "all").
            ``running``/``waiting``/``kv_cache_usage``/``busy`` are time-weighted bin means
            (idle time counts as 0); ``*_max`` the largest step value; token counts are
            attributed to the bin in which the step ends.
        itl_runs: pooled ITL as runs, columns ``gap_ns`` (int64, ascending) and ``count``.
        exact: the figures of ``summary`` before their rounding to 6 significant digits
            (None where not known): a report cell rounds once from them
            (:func:`simulator.report.shown_summary`).
    """

    summary: dict
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    itl_runs: pd.DataFrame
    exact: dict | None = None


class _Bins:
    """Per-replica accumulators over fixed-width time bins (integrals in value x ns),
    float64 arrays filled in bulk from buffered steps (:meth:`MetricsCollector._flush`)."""

    # No waiting integral: the queue-length series comes from the requests' own waits.
    # prefill/decode: tokens counted in the bin where their step ends (as vLLM's counters);
    # prefill_spread/decode_spread: the same tokens spread over the step's time (rates).
    SUM = ("run", "kv", "busy", "prefill", "decode", "preempt", "steps", "prefill_spread",
           "decode_spread")
    MAX = ("run_max", "wait_max", "kv_max", "cmax")
    MIN = ("cmin",)

    def __init__(self):
        self.a = {name: np.empty(0) for name in self.SUM + self.MAX + self.MIN}

    def __len__(self):
        return len(self.a["run"])

    def grow(self, nbins: int) -> None:
        extra = nbins - len(self)
        if extra <= 0:
            return
        for name, x in self.a.items():
            fill = 0.0 if name in self.SUM else (-math.inf if name in self.MAX else math.inf)
            self.a[name] = np.concatenate([x, np.full(extra, fill)])

    def halve(self) -> None:
        """Merge bin pairs (2i, 2i+1) into one bin of twice the width."""
        if len(self) % 2:
            self.grow(len(self) + 1)
        for name, x in self.a.items():
            x = x.reshape(-1, 2)
            self.a[name] = (x[:, 0] + x[:, 1] if name in self.SUM else
                            x.max(axis=1) if name in self.MAX else x.min(axis=1))

    def as_arrays(self) -> dict:
        return {name: x.copy() for name, x in self.a.items()}


class MetricsCollector:
    """Collects what a run produces; :meth:`finalize` turns it into a :class:`RunResult`.

    Memory: one compact row per request (typed arrays), ITL as runs of distinct
    gaps, and per replica at most 2**15 fine time bins (2**20 with an explicit
    ``timeseries_bin_ns``): bins start at 10 ms and double in width when a run outgrows
    them. Nothing is stored per token or per step.

    Args:
        warmup_requests: the first N requests by arrival are excluded from the figures.
        timeseries_bin_ns: time series bin width, ns; default ``span / 500`` rounded to a
            multiple of the fine bin width.
        num_replicas: replicas in the run (for the cluster-mean KV usage); default the
            highest replica index seen + 1.

    Raises:
        ValueError: a negative warm-up count or a non-positive bin width.
    """

    def __init__(self, *, warmup_requests: int = 0, timeseries_bin_ns: int | None = None,
                 num_replicas: int | None = None):
        if warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {warmup_requests}")
        if timeseries_bin_ns is not None and timeseries_bin_ns < 1:
            raise ValueError(f"timeseries_bin_ns must be >= 1, got {timeseries_bin_ns}")
        self.warmup_requests = int(warmup_requests)
        self._given_bin = timeseries_bin_ns
        self._w = int(timeseries_bin_ns) if timeseries_bin_ns else FINE_BIN_NS
        self._cap = _MAX_GIVEN_BINS if timeseries_bin_ns else _MAX_FINE_BINS
        self._num_replicas = num_replicas
        self._bins: dict[int, _Bins] = {}
        self._limit = self._cap * self._w   # steps ending past this need coarser bins
        self._steps: list[tuple] = []       # steps not yet binned (see _flush)
        self._last_step_end = 0
        # Output tokens per second from the first admitted arrival (vllm bench serve's
        # peak output token throughput); None until a request is admitted.
        self._first_admitted_ns: int | None = None
        # sparse (second -> tokens): a run may span 1e9 s of think times, one slot per
        # second of it would take GBs
        self._tokens_per_s: dict[int, int] = {}
        # Pooled ITL: runs (gap, count) appended as steps end, folded into sorted distinct
        # gaps (exact counts) when the buffers grow long and at the end.
        self._itl_gap, self._itl_cnt = array("q"), array("q")
        self._itl_runs = (np.empty(0, np.int64), np.empty(0, np.int64))
        # Requests that may be warm-up ones (delivered): their gaps kept per request until
        # the warm-up set is known (finalize), then pooled unless they are warm-up.
        self._delivered = 0
        self._warm_edge_ns: int | None = None
        self._own_itl: dict = {}
        self._ids: list = []
        self._ns = {k: array("q") for k in ("arrival", "sched", "first", "finish")}
        self._ints = {k: array("q") for k in ("prompt", "cached", "output", "preempt",
                                              "replica", "reason", "capped")}
        self._reasons: dict = {}
        # Preempted requests' waits (preemption -> rescheduled): the queue-length series
        # counts them as vLLM's num_requests_waiting gauge does (preempted go back there).
        self._rewaits = {k: array("q") for k in ("replica", "start", "end")}

    # -- hot paths ------------------------------------------------------------------
    def record_request(self, rec: RequestRecord) -> None:
        """Store one finished or rejected request (called in finish order).

        Rejected (``finish_reason == "rejected"``) and aborted requests are counted but
        kept out of latency figures. ``token_times_ns`` is not read: ITL comes from
        :meth:`record_itl` (or :meth:`record_token_times`).
        """
        ns = self._ns
        self._ids.append(rec.request_id)
        ns["arrival"].append(rec.arrival_ns)
        ns["sched"].append(-1 if rec.first_scheduled_ns is None else rec.first_scheduled_ns)
        ns["first"].append(-1 if rec.first_token_ns is None else rec.first_token_ns)
        ns["finish"].append(-1 if rec.finish_ns is None else rec.finish_ns)
        ints = self._ints
        ints["prompt"].append(rec.prompt_tokens)
        ints["cached"].append(rec.cached_tokens)
        ints["output"].append(rec.output_tokens)
        ints["preempt"].append(rec.preemptions)
        ints["replica"].append(rec.replica)
        code = self._reasons.setdefault(rec.finish_reason, len(self._reasons))
        ints["reason"].append(code)
        ints["capped"].append(rec.capped)
        if len(self._itl_gap) > _ITL_FOLD:
            self._fold_itl()

    def record_rewait(self, replica: int, start_ns: int, end_ns: int) -> None:
        """A preempted request waited again on ``replica`` from its preemption
        (``start_ns``, the start of the step that preempted it) until it was scheduled
        again (``end_ns``): part of the ``waiting`` time series, not of ``queue_ms``
        (arrival to first scheduled, vLLM's ``request_queue_time_seconds``)."""
        w = self._rewaits
        w["replica"].append(replica)
        w["start"].append(start_ns)
        w["end"].append(end_ns)

    def itl_appenders(self) -> tuple:
        """``(append_gap, append_count)`` for hot loops: appending ``gap_ns`` and a count
        >= 1 to them is :meth:`record_itl` (folded by :meth:`itl_runs`)."""
        return self._itl_gap.append, self._itl_cnt.append

    def record_itl(self, gap_ns: int, count: int) -> None:
        """Add ``count`` inter-token gaps of ``gap_ns`` ns each to the pooled ITL."""
        if count:
            self._itl_gap.append(gap_ns)
            self._itl_cnt.append(count)

    def delivered(self, arrival_ns: int) -> bool:
        """Note a request reaching the engine (call in delivery order, which is arrival
        order); whether it may be a warm-up request: one of the first ``warmup_requests``
        delivered, or one delivered at the same ns as the last of those (ties are settled
        by request id, as in the figures). Such a request's gaps go to
        :meth:`record_own_itl`, not :meth:`record_itl`."""
        if not self.warmup_requests:
            return False
        k = self._delivered
        self._delivered = k + 1
        if k < self.warmup_requests:
            self._warm_edge_ns = arrival_ns
            return True
        return arrival_ns == self._warm_edge_ns

    def record_own_itl(self, request_id, gap_ns: int) -> None:
        """One inter-token gap of a request that may be a warm-up one (:meth:`delivered`):
        pooled at :meth:`finalize` unless the request is warm-up."""
        self._own_itl.setdefault(request_id, []).append(gap_ns)

    def _pool_own_itl(self, warm_ids: set) -> None:
        """Pool the gaps kept per request (:meth:`record_own_itl`) of those not in
        ``warm_ids``; drop the rest."""
        for rid, gaps in self._own_itl.items():
            if rid not in warm_ids:
                self._itl_gap.extend(gaps)
                self._itl_cnt.extend([1] * len(gaps))
        self._own_itl = {}

    def record_token_times(self, token_times_ns) -> None:
        """Add the gaps between consecutive output tokens of one request (engine records)."""
        t = np.asarray(token_times_ns, dtype=np.int64)
        if t.size > 1:
            gaps, counts = np.unique(np.diff(t), return_counts=True)
            self._itl_gap.extend(gaps.tolist())
            self._itl_cnt.extend(counts.tolist())

    def _fold_itl(self) -> None:
        """Merge the appended ITL runs into the sorted distinct-gap runs (exact counts)."""
        if not self._itl_gap:
            return
        g0, c0 = self._itl_runs
        g = np.concatenate([g0, np.frombuffer(self._itl_gap, dtype=np.int64)])
        c = np.concatenate([c0, np.frombuffer(self._itl_cnt, dtype=np.int64)])
        gaps, inv = np.unique(g, return_inverse=True)
        del g
        # Counts are integers far below 2**53, so float64 sums are exact.
        counts = np.bincount(inv, weights=c, minlength=gaps.size).astype(np.int64)
        self._itl_runs = (gaps, counts)
        # Emptied in place: hot loops hold their append methods (itl_appenders).
        del self._itl_gap[:]
        del self._itl_cnt[:]

    def note_admitted(self, arrival_ns: int) -> None:
        """A request the engine took (not rejected) arrived at ``arrival_ns``: the first
        one starts the seconds over which output tokens are counted for
        ``max_output_tokens_per_s``. Call in arrival order, before the steps that follow.
        """
        if self._first_admitted_ns is None:
            self._first_admitted_ns = int(arrival_ns)

    def record_step(self, replica: int, start_ns: int, end_ns: int, num_prefill_tokens: int,
                    num_decodes: int, num_running: int, num_waiting: int,
                    kv_cache_usage: float, num_preempted: int,
                    num_sampled: int | None = None) -> None:
        """Account one engine step of ``replica`` over ``[start_ns, end_ns)``.

        ``num_running``/``num_waiting``/``kv_cache_usage`` (fraction of usable blocks, as
        vLLM's ``kv_cache_usage_perc`` gauge) hold over the step; prefill tokens, decode
        tokens (one per decode) and preemptions count in the bin where the step ends; so do
        the output tokens the step samples (``num_sampled``, default ``num_decodes``:
        decodes plus prefill chunks that end a prompt) in the second where it ends, once a
        request was admitted (:meth:`note_admitted`). Steps are buffered and binned in bulk;
        the result is bit for bit that of adding each step to its bins in turn.

        Raises:
            ValueError: ``end_ns < start_ns``.
        """
        if (end_ns - 1 if end_ns > start_ns else end_ns) >= self._limit or end_ns < start_ns:
            if end_ns < start_ns:
                raise ValueError(f"step ends before it starts: {start_ns} > {end_ns}")
            # Past the last bin: bin what came before at the old width, then coarsen.
            self._flush()
            while (end_ns - 1 if end_ns > start_ns else end_ns) // self._w >= self._cap:
                self._coarsen()
        buf = self._steps
        buf.append((replica, start_ns, end_ns, num_prefill_tokens, num_decodes, num_running,
                    num_waiting, kv_cache_usage, num_preempted,
                    num_decodes if num_sampled is None else num_sampled))
        if len(buf) >= _STEP_BUFFER:
            self._flush()

    def _flush(self) -> None:
        """Add the buffered steps to their bins.

        Sums of integers (running x ns, busy ns, token and step counts) are exact in
        float64, so their order does not matter; KV usage x ns and tokens spread over a
        step's time are not, so they are added step by step in arrival order
        (``np.add.at`` is unbuffered), as a loop would.
        """
        buf = self._steps
        if not buf:
            return
        cols = list(zip(*buf))
        buf.clear()
        rep = np.array(cols[0], dtype=np.int64)
        start = np.array(cols[1], dtype=np.int64)
        end = np.array(cols[2], dtype=np.int64)
        ints = {k: np.array(cols[i], dtype=np.float64) for k, i in (
            ("prefill", 3), ("decode", 4), ("running", 5), ("waiting", 6), ("preempt", 8))}
        kv_cache_usage = np.array(cols[7], dtype=np.float64)
        self._last_step_end = max(self._last_step_end, int(end.max()))
        if self._first_admitted_ns is not None:   # int(token time - first start), as vLLM
            sec = (end - self._first_admitted_ns) // NS_PER_S
            keep = sec >= 0
            secs, at = np.unique(sec[keep], return_inverse=True)
            sums = np.bincount(at, weights=np.array(cols[9], np.float64)[keep])
            per_s = self._tokens_per_s
            for k, v in zip(secs.tolist(), sums.astype(np.int64).tolist()):
                per_s[k] = per_s.get(k, 0) + v
        w = self._w
        reps = dict.fromkeys(cols[0])   # replicas in order of their first step
        for r in reps:
            pick = None if len(reps) == 1 else rep == r
            s0, e0 = (start, end) if pick is None else (start[pick], end[pick])
            cols_r = {k: (v if pick is None else v[pick]) for k, v in ints.items()}
            kv_r = kv_cache_usage if pick is None else kv_cache_usage[pick]
            bins = self._bins.get(r)
            if bins is None:
                bins = self._bins[r] = _Bins()
            b0 = s0 // w
            b1 = np.where(e0 > s0, (e0 - 1) // w, b0)
            top = int(b1.max())
            if top >= len(bins):
                bins.grow(max(top + 1, 2 * len(bins)))
            # One piece per (step, bin) it covers, in step order.
            cnt = b1 - b0 + 1
            step = np.repeat(np.arange(len(s0)), cnt)
            first = np.repeat(np.cumsum(cnt) - cnt, cnt)
            b = b0[step] + (np.arange(len(step)) - first)
            ps = np.maximum(s0[step], b * w)
            pe = np.minimum(e0[step], (b + 1) * w)
            d = (pe - ps).astype(np.float64)
            a, n = bins.a, len(bins)
            a["run"] += np.bincount(b, weights=cols_r["running"][step] * d, minlength=n)
            np.add.at(a["kv"], b, kv_r[step] * d)
            a["busy"] += np.bincount(b, weights=d, minlength=n)
            np.minimum.at(a["cmin"], b, ps.astype(np.float64))
            np.maximum.at(a["cmax"], b, pe.astype(np.float64))
            np.maximum.at(a["run_max"], b, cols_r["running"][step])
            np.maximum.at(a["wait_max"], b, cols_r["waiting"][step])
            np.maximum.at(a["kv_max"], b, kv_r[step])
            for name, key in (("prefill", "prefill"), ("decode", "decode"),
                              ("preempt", "preempt")):
                a[name] += np.bincount(b1, weights=cols_r[key], minlength=n)
            a["steps"] += np.bincount(b1, minlength=n)
            # each piece's share of its step's time (a step of no time: all of it); not
            # integers, so added piece by piece in step order, as KV usage
            dur = (e0 - s0)[step].astype(np.float64)
            share = np.divide(d, dur, out=np.ones_like(d), where=dur > 0)
            for key in ("prefill", "decode"):
                np.add.at(a[f"{key}_spread"], b, cols_r[key][step] * share)

    def _coarsen(self) -> None:
        for bins in self._bins.values():
            bins.halve()
        self._w *= 2
        self._limit = self._cap * self._w

    # -- finalize ---------------------------------------------------------------------
    def finalize(self, *, slo: dict | None, extra: dict | None = None) -> RunResult:
        """Compute the run's figures.

        Args:
            slo: ``{metric: {stat: threshold}}`` with metric in :data:`METRICS`, stat in
                :data:`SLO_STATS`, thresholds in ms; ``None`` or ``{}`` for no SLO.
            extra: caller figures merged into the summary at top level, e.g.
                ``prefix_cache_hit_rate`` (the scheduler counts it), ``cost_label``
                ("measured" / "projected"), ``cost_source``, ``kv_note``, ``scenario``.
                Values must be JSON-able (numbers, strings, bools, None, lists, dicts).

        Returns:
            :class:`RunResult`. ``summary`` keys: ``num_requests`` (counted, i.e. after
            warm-up), ``warmup_requests``, ``completed``, ``rejected``, ``aborted``,
            ``capped`` (completed requests whose output max_model_len cut short, see
            :class:`~simulator.policy.request.RequestRecord`), ``capped_above_max_model_len``
            (those of them whose max_tokens exceeded max_model_len itself, which vLLM's
            OpenAI server refuses),
            ``duration_s``, ``request_throughput`` (req/s), ``output_throughput`` and
            ``total_token_throughput`` (tok/s), ``total_prompt_tokens``,
            ``total_output_tokens``, ``total_cached_tokens``, one dict per metric of
            :data:`METRICS` with :data:`STATS` (ms), ``itl_tokens``, ``goodput`` (req/s,
            None without SLO), ``good_requests``, ``slo`` (``{metric: {stat: {threshold,
            value, met, samples}}}``; a statistic over no samples, e.g. TPOT when every
            request has one output token, has value None and is met vacuously),
            ``slo_met`` (None without SLO), ``concurrency``
            (``requests_mean`` = sum E2EL / duration, Little's law, ``requests_max``,
            ``running_mean`` cluster total, ``running_max_per_replica``),
            ``max_concurrent_requests`` and ``max_output_tokens_per_s``: vllm bench
            serve's peak concurrent requests (:func:`_peak_per_second`) and peak output
            token throughput (most output tokens in one second counted from the first
            admitted arrival; None with warm-up or without steps), ``kv_cache_usage``
            (``mean`` time-weighted over replicas, ``max`` of any replica),
            ``preemptions``, ``preempted_requests``, ``timeseries_bin_s``, plus ``extra``.
            Floats rounded to 6 significant digits, NaN as None.

        Raises:
            InputError: a malformed SLO (names the ``slo.<metric>.<stat>`` key).
            ValueError: an ``extra`` key that would overwrite a computed figure.
            TypeError: an ``extra`` value that is not JSON-able.
        """
        slo_spec = parse_slo(slo)
        self._flush()
        self._fold_itl()   # before the request table exists: a lower memory peak
        req, ns, ints = self._request_frame()
        code = ints["reason"]
        counted = ~req["warmup"].to_numpy()
        self._pool_own_itl(set(req["request_id"].to_numpy()[~counted].tolist()))
        is_rej = code == self._reasons.get("rejected", -1)
        is_abort = code == self._reasons.get("abort", -1)
        done = counted & ~is_rej & ~is_abort & (ns["first"] >= 0) & (ns["finish"] >= 0)
        arrival_ns, finish_ns = ns["arrival"], ns["finish"]
        ws, we = _window(arrival_ns[counted], finish_ns[counted], from_zero=counted.all())
        duration_ns = we - ws
        dur_s = duration_ns / NS_PER_S if duration_ns > 0 else None

        s: dict = {}
        s["num_requests"] = int(counted.sum())
        s["warmup_requests"] = int((~counted).sum())
        s["completed"] = int(done.sum())
        s["rejected"] = int((counted & is_rej).sum())
        s["aborted"] = int((counted & is_abort).sum())
        s["capped"] = int((done & (ints["capped"] > 0)).sum())
        s["capped_above_max_model_len"] = int(
            (done & (ints["capped"] == CAPPED_ABOVE_MAX_MODEL_LEN)).sum())
        s["duration_s"] = dur_s
        out_tok = int(req["output_tokens"].to_numpy()[done].sum())
        prompt_tok = int(req["prompt_tokens"].to_numpy()[done].sum())
        s["total_prompt_tokens"] = prompt_tok
        s["total_output_tokens"] = out_tok
        s["total_cached_tokens"] = int(req["cached_tokens"].to_numpy()[done].sum())
        s["request_throughput"] = s["completed"] / dur_s if dur_s else None
        s["output_throughput"] = out_tok / dur_s if dur_s else None
        s["total_token_throughput"] = (prompt_tok + out_tok) / dur_s if dur_s else None

        lat = {m: req[m].to_numpy()[done] for m in PER_REQUEST_METRICS}
        lat = {m: x[~np.isnan(x)] for m, x in lat.items()}
        for m in PER_REQUEST_METRICS:
            s[m] = _stats(lat[m])
        itl = self.itl_runs()
        s["itl_ms"] = _stats_runs(itl["gap_ns"].to_numpy(), itl["count"].to_numpy())
        s["itl_tokens"] = int(itl["count"].sum())

        samples = {m: int(lat[m].size) for m in PER_REQUEST_METRICS}
        samples["itl_ms"] = s["itl_tokens"]
        for m, entries in slo_spec.items():   # percentiles an SLO asks for beyond STATS
            for st in entries:
                if st not in s[m] and m == "itl_ms":   # exact in ns, then ms
                    v = slo_stat(itl["gap_ns"].to_numpy(), st, itl["count"].to_numpy())
                    s[m][st] = v / NS_PER_MS if v is not None else None
                elif st not in s[m]:
                    s[m][st] = slo_stat(lat[m], st)
        s.update(_evaluate_slo(slo_spec, s, req, done, dur_s, samples))

        e2el = req["e2el_ms"].to_numpy()[done]
        s["concurrency"] = {
            "requests_mean": float(e2el.sum()) * NS_PER_MS / duration_ns
            if duration_ns > 0 else None,
            "requests_max": _max_overlap(arrival_ns[done], finish_ns[done]),
        }
        s["max_concurrent_requests"] = _peak_per_second(arrival_ns[done], finish_ns[done])
        # Every step's sampled tokens (warm-up requests' too): only without warm-up are
        # they the counted requests' (vllm bench serve has no warm-up inside its run).
        s["max_output_tokens_per_s"] = (
            float(max(self._tokens_per_s.values())) if self._tokens_per_s and s["completed"]
            and not self.warmup_requests else None)
        step = self._step_window(ws, we)
        s["concurrency"]["running_mean"] = step["running_mean"]
        s["concurrency"]["running_max_per_replica"] = step["running_max"]
        s["kv_cache_usage"] = {"mean": step["kv_mean"], "max": step["kv_max"]}
        pre = req["preemptions"].to_numpy()[counted]
        s["preemptions"] = int(pre.sum())
        s["preempted_requests"] = int((pre > 0).sum())
        ts, bin_ns = self._timeseries()
        s["timeseries_bin_s"] = bin_ns / NS_PER_S
        for key, value in (extra or {}).items():
            if key in s:
                raise ValueError(f"extra key {key!r} would overwrite a computed figure")
            s[key] = value
        return RunResult(summary=jsonable(s), requests=req, timeseries=ts, itl_runs=itl,
                         exact=s)

    def itl_runs(self) -> pd.DataFrame:
        """Pooled ITL runs so far: columns ``gap_ns`` (ascending) and ``count``."""
        self._fold_itl()
        gaps, counts = self._itl_runs
        return pd.DataFrame({"gap_ns": gaps, "count": counts})

    def _request_frame(self) -> tuple[pd.DataFrame, dict, np.ndarray]:
        """Requests in arrival order, plus the sorted ns and int columns (``reason``: the
        finish-reason codes)."""
        ns = {k: np.asarray(v, dtype=np.int64) for k, v in self._ns.items()}
        ints = {k: np.asarray(v, dtype=np.int64) for k, v in self._ints.items()}
        # Arrival order, ties by request id when ids are ints (else in finish order), so
        # the order never depends on which replica reported first: defines the warm-up set.
        ids = self._ids
        if all(type(i) is int for i in ids):
            order = np.lexsort((np.asarray(ids, dtype=np.int64), ns["arrival"]))
        else:
            order = np.argsort(ns["arrival"], kind="stable")
        ns = {k: v[order] for k, v in ns.items()}
        ints = {k: v[order] for k, v in ints.items()}

        def sec(x):
            return np.where(x >= 0, x / NS_PER_S, np.nan)

        def ms(a, b):
            ok = (a >= 0) & (b >= 0)
            return np.where(ok, (b - a) / NS_PER_MS, np.nan)

        out = ints["output"]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, ms(ns["first"], ns["finish"]) / (out - 1), np.nan)
        names = np.array(list(self._reasons), dtype=object)
        n = len(order)
        warm = np.zeros(n, dtype=bool)
        warm[:min(self.warmup_requests, n)] = True
        ids = self._ids
        df = pd.DataFrame({
            "request_id": pd.Series([ids[i] for i in order.tolist()], dtype=object),
            "arrival_s": ns["arrival"] / NS_PER_S,
            "first_scheduled_s": sec(ns["sched"]),
            "first_token_s": sec(ns["first"]),
            "finish_s": sec(ns["finish"]),
            "prompt_tokens": ints["prompt"],
            "cached_tokens": ints["cached"],
            "output_tokens": out,
            "preemptions": ints["preempt"],
            "replica": ints["replica"],
            "ttft_ms": ms(ns["arrival"], ns["first"]),
            "tpot_ms": tpot,
            "e2el_ms": ms(ns["arrival"], ns["finish"]),
            "queue_ms": ms(ns["arrival"], ns["sched"]),
            "finish_reason": pd.Series(names[ints["reason"]] if n else [], dtype=object),
            "warmup": warm,
        }, columns=list(REQUEST_COLUMNS))
        return df, ns, ints

    def _nrep(self) -> int:
        if self._num_replicas is not None:
            return self._num_replicas
        return max(self._bins) + 1 if self._bins else 1

    def _step_window(self, ws: int, we: int) -> dict:
        """Step-based figures over [ws, we]; edge bins pro rata of their covered span."""
        none = {"running_mean": None, "running_max": None, "kv_mean": None, "kv_max": None}
        if we <= ws or not self._bins:
            return none
        w = self._w
        run = kv = 0.0
        run_max = kv_max = -math.inf
        for bins in self._bins.values():
            a = bins.as_arrays()
            lo = np.arange(len(bins)) * w
            cmin, cmax = a["cmin"], a["cmax"]
            covered = np.isfinite(cmin)
            inter = np.clip(np.minimum(cmax, we) - np.maximum(cmin, ws), 0, None)
            span = cmax - cmin
            with np.errstate(invalid="ignore", divide="ignore"):
                frac = np.where(span > 0, inter / span,
                                ((cmin >= ws) & (cmin <= we)).astype(float))
            frac = np.where(covered, frac, 0.0)
            run += float((a["run"] * frac).sum())
            kv += float((a["kv"] * frac).sum())
            touch = covered & (lo < we) & (lo + w > ws) & (frac > 0)
            if touch.any():
                run_max = max(run_max, float(a["run_max"][touch].max()))
                kv_max = max(kv_max, float(a["kv_max"][touch].max()))
        dur = we - ws
        return {"running_mean": run / dur, "kv_mean": kv / dur / self._nrep(),
                "running_max": None if run_max == -math.inf else int(run_max),
                "kv_max": None if kv_max == -math.inf else kv_max}

    def _timeseries(self) -> tuple[pd.DataFrame, int]:
        """Time series at the output bin width (a multiple of the fine width)."""
        w = self._w
        # to the end of the run's window: its last finish, or a later arrival (a request
        # rejected after the others finished), as duration_s
        span = max(self._last_step_end, int(max(self._ns["finish"], default=0)),
                   int(max(self._ns["arrival"], default=0)))
        if self._given_bin:
            factor = max(1, cdiv(int(self._given_bin), w))
        else:
            factor = max(1, round(span / DEFAULT_OUTPUT_BINS / w))
        out_w = w * factor
        nbins = max(1, cdiv(span, out_w)) if span > 0 else 0
        if not self._bins or nbins == 0:
            return pd.DataFrame(columns=list(TIMESERIES_COLUMNS)), out_w
        start = np.arange(nbins, dtype=np.int64) * out_w
        width = np.minimum(start + out_w, span) - start
        frames, totals = [], None
        # Queue length from the requests' own waits (arrival -> first scheduled, and
        # preemption -> rescheduled), exact at any instant: the steps only see the queue at
        # their start, which misses requests that arrive and are admitted between two.
        sched = np.asarray(self._ns["sched"], dtype=np.int64)
        admitted = sched >= 0
        rw = {k: np.asarray(v, dtype=np.int64) for k, v in self._rewaits.items()}
        replica = np.concatenate([np.asarray(self._ints["replica"], np.int64)[admitted],
                                  rw["replica"]])
        order = np.argsort(replica, kind="stable")   # each replica's waits: one slice
        replica = replica[order]
        since = np.concatenate([np.asarray(self._ns["arrival"], np.int64)[admitted],
                                rw["start"]])[order]
        until = np.concatenate([sched[admitted], rw["end"]])[order]
        edges = np.append(start, start[-1] + width[-1])

        def waiting(lo=0, hi=None):
            return (_interval_integral(since[lo:hi], until[lo:hi], edges)
                    / width.astype(np.float64))

        def reduce(x, how):
            need = nbins * factor
            if len(x) < need:
                fill = 0.0 if how == "sum" else -math.inf
                x = np.concatenate([x, np.full(need - len(x), fill)])
            x = x[:need].reshape(nbins, factor)
            return x.sum(axis=1) if how == "sum" else x.max(axis=1)

        # every replica's rows, one that never ran a step (fewer requests than replicas) too
        for rep in range(self._nrep()):
            a = self._bins.get(rep, _Bins()).as_arrays()
            agg = {k: reduce(a[k], "sum") for k in _Bins.SUM}
            agg.update({k: reduce(a[k], "max") for k in ("run_max", "wait_max", "kv_max")})
            lo, hi = np.searchsorted(replica, (rep, rep + 1))
            frames.append(_ts_frame(start, width, str(rep), agg, 1, waiting(lo, hi)))
            if totals is None:
                totals = {k: v.copy() for k, v in agg.items()}
            else:
                for k in _Bins.SUM:
                    totals[k] += agg[k]
                totals["run_max"] = np.maximum(totals["run_max"], agg["run_max"])
                totals["wait_max"] = np.maximum(totals["wait_max"], agg["wait_max"])
                totals["kv_max"] = np.maximum(totals["kv_max"], agg["kv_max"])
        frames.append(_ts_frame(start, width, "all", totals, self._nrep(), waiting()))
        ts = pd.concat(frames, ignore_index=True)
        return ts, out_w


def t_interval(x) -> tuple[float, float] | None:
    """95% confidence interval of the mean of ``x`` (Student t, ``n - 1`` degrees of
    freedom); None for fewer than two values; ``(v, v)`` exactly when every value is ``v``.
    Figures that cannot be negative (latencies, rates, counts, SLO ratios: every value >= 0)
    keep a lower bound of at least 0."""
    n = len(x)
    if n < 2:
        return None
    if min(x) == max(x):   # no spread: the mean of equal values can differ from them by an ulp
        return (float(x[0]), float(x[0]))
    m = float(np.mean(x))
    h = float(sps.t.ppf(0.975, n - 1)) * float(np.std(x, ddof=1)) / math.sqrt(n)
    return (max(m - h, 0.0) if min(x) >= 0 else m - h, m + h)


def _interval_integral(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per bin ``[edges[k], edges[k+1])``: the integral over time of the number of intervals
    ``[starts[i], ends[i])`` that are open (ns × count), in O((n + bins) log n).

    ``F(e) = Σ_i max(0, min(e, end_i) − start_i) = Σ_{start_i < e} (e − start_i) −
    Σ_{end_i < e} (e − end_i)``, computed with sorted endpoints and prefix sums.
    """
    def ramp(points):
        p = np.sort(points.astype(np.float64))
        csum = np.concatenate([[0.0], np.cumsum(p)])
        k = np.searchsorted(p, edges, side="left")
        return k * edges.astype(np.float64) - csum[k]
    f = ramp(starts) - ramp(ends)
    return np.diff(f)


def _ts_frame(start, width, replica, agg, nrep, waiting) -> pd.DataFrame:
    wd = width.astype(np.float64)
    maxes = {k: np.where(np.isfinite(agg[k]), agg[k], 0.0)
             for k in ("run_max", "wait_max", "kv_max")}
    return pd.DataFrame({
        "time_s": start / NS_PER_S,
        "bin_s": wd / NS_PER_S,   # the last bin ends with the window
        "replica": replica,
        "running": agg["run"] / wd,
        "waiting": waiting,
        "kv_cache_usage": agg["kv"] / wd / nrep,
        "busy": agg["busy"] / wd / nrep,
        "running_max": maxes["run_max"].astype(np.int64),
        "waiting_max": maxes["wait_max"].astype(np.int64),
        "kv_cache_usage_max": maxes["kv_max"],
        "steps": agg["steps"].astype(np.int64),
        "prefill_tokens": agg["prefill"].astype(np.int64),
        "decode_tokens": agg["decode"].astype(np.int64),
        "prefill_tok_s": agg["prefill_spread"] / (wd / NS_PER_S),
        "decode_tok_s": agg["decode_spread"] / (wd / NS_PER_S),
        "preemptions": agg["preempt"].astype(np.int64),
    }, columns=list(TIMESERIES_COLUMNS))


def _window(arrival_ns: np.ndarray, finish_ns: np.ndarray,
            from_zero: bool = False) -> tuple[int, int]:
    """[start, end] of the counted requests (ns); (0, 0) when none. The start is the run's
    clock start with ``from_zero`` (no warm-up: ``vllm bench serve`` starts its duration
    before the first request's arrival gap), else the first counted arrival. The end is
    the last finish or, when later, the last arrival: a rejected request returns at its
    arrival, and ``vllm bench serve``'s duration runs until every request, failed ones
    too, has returned."""
    if arrival_ns.size == 0:
        return 0, 0
    ws = 0 if from_zero else int(arrival_ns.min())
    fin = finish_ns[finish_ns >= 0]
    we = max(int(fin.max()) if fin.size else ws, int(arrival_ns.max()), ws)
    return ws, we


def _stats(x: np.ndarray) -> dict:
    """mean/std/p50/p90/p95/p99/max of x (ms); all None when x is empty."""
    if x.size == 0:
        return {k: None for k in STATS}
    p = np.percentile(x, [50, 90, 95, 99])
    return {"mean": float(np.mean(x)), "std": float(np.std(x)), "p50": float(p[0]),
            "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3]),
            "max": float(np.max(x))}


def _stats_runs(gaps_ns: np.ndarray, counts: np.ndarray) -> dict:
    """:func:`_stats` of ITL runs, in ms (percentiles exact in ns, then converted)."""
    n = int(counts.sum())
    if n == 0:
        return {k: None for k in STATS}
    g = gaps_ns.astype(np.float64)
    mean = float((g * counts).sum() / n)
    std = math.sqrt(float((counts * (g - mean) ** 2).sum() / n))
    p = percentile_from_runs(gaps_ns, counts, [50, 90, 95, 99]) / NS_PER_MS
    return {"mean": mean / NS_PER_MS, "std": std / NS_PER_MS, "p50": float(p[0]),
            "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3]),
            "max": float(gaps_ns.max()) / NS_PER_MS}


def _max_overlap(arrival_ns: np.ndarray, finish_ns: np.ndarray) -> int:
    """Most requests in the system at once; intervals [arrival, finish), finish first."""
    if arrival_ns.size == 0:
        return 0
    t = np.concatenate([arrival_ns, finish_ns])
    d = np.concatenate([np.ones(arrival_ns.size, np.int64),
                        -np.ones(finish_ns.size, np.int64)])
    order = np.lexsort((d, t))   # by time, departures (-1) before arrivals at a tie
    return int(np.cumsum(d[order]).max())


def interval_counts(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """How many of the closed integer intervals ``[first[i], last[i]]`` (non-negative,
    ``first <= last``) cover each index ``0 .. max(last)``, by a difference array."""
    diff = np.zeros(int(last.max()) + 2, dtype=np.int64)
    np.add.at(diff, first, 1)
    np.add.at(diff, last + 1, -1)
    return np.cumsum(diff)[:-1]


def _peak_per_second(arrival_ns: np.ndarray, finish_ns: np.ndarray) -> int:
    """``vllm bench serve``'s "Peak concurrent requests" of the served requests whose
    ``[arrival, finish]`` are given (ns): seconds counted from the first arrival (that of
    the first successful request in vLLM), a request counts in every second from the one
    of its arrival to the one of its finish, both included (so two requests in one second
    count twice even if they never overlap); the most in any second. Source:
    ``calculate_metrics`` in ``vllm/benchmarks/serve.py`` (``max_concurrent_requests``)."""
    if arrival_ns.size == 0:
        return 0
    a = arrival_ns.min()
    first, last = (arrival_ns - a) // NS_PER_S, (finish_ns - a) // NS_PER_S
    # interval_counts(first, last).max() without one slot per second (a run may span 1e9 s):
    # the count only changes at a first or a last + 1, so its most is at one of them
    _, delta = np.unique(np.concatenate([first, last + 1]), return_inverse=True)
    change = np.bincount(delta, weights=np.concatenate([np.ones(first.size),
                                                        -np.ones(last.size)]))
    return int(np.cumsum(change).max())


def parse_slo(slo: dict | None) -> dict:
    """Validate an SLO dict ``{metric: {stat: threshold_ms}}``.

    Returns:
        ``{metric: {stat: float}}`` in canonical order (:data:`METRICS`, then
        :func:`slo_stat_rank`).

    Raises:
        InputError: unknown metric or statistic, or a threshold that is not a positive
            number; the message names ``slo.<metric>.<stat>``.
    """
    if not slo:
        return {}
    if not isinstance(slo, dict):
        raise InputError(f"slo: expected a mapping of metric -> {{stat: ms}}, got {slo!r}")
    out = {}
    for metric in slo:
        if metric not in METRICS:
            raise InputError(f"slo.{metric}: unknown metric; allowed: {', '.join(METRICS)}")
        entry = slo[metric]
        if not isinstance(entry, dict) or not entry:
            raise InputError(f"slo.{metric}: expected a mapping of statistic -> threshold "
                             f"ms (e.g. {{p99: 2000}}), got {entry!r}")
        for stat, thr in entry.items():
            try:
                slo_stat_rank(stat)
            except ValueError as e:
                raise InputError(f"slo.{metric}.{stat}: {e}") from None
            if (isinstance(thr, bool) or not isinstance(thr, (int, float))
                    or not math.isfinite(thr) or thr <= 0):
                raise InputError(f"slo.{metric}.{stat}: threshold must be a positive "
                                 f"number of ms, got {thr!r}")
    for metric in METRICS:
        if metric in slo:
            out[metric] = {st: float(slo[metric][st])
                           for st in sorted(slo[metric], key=slo_stat_rank)}
    return out


def _evaluate_slo(spec: dict, s: dict, req: pd.DataFrame, done: np.ndarray,
                  dur_s: float | None, samples: dict) -> dict:
    """SLO table, ``slo_met`` and goodput (vllm bench serve ``--goodput`` semantics).

    A request is good when it completed and, for every per-request metric with an SLO,
    its value is <= every threshold given for that metric. A request with <= 1 output
    token has no TPOT and passes the TPOT check. ITL entries are judged on the run
    statistic only (a request's ITL is not one number), so they do not affect goodput.

    Each table entry is ``{threshold, value, met, samples}``; ``samples`` is the number of
    values the statistic is over (requests for TTFT/TPOT/E2EL/queue, token gaps for ITL).
    A statistic over no samples while requests completed (TPOT and ITL when every request
    produced <= 1 output token) has value None and is met vacuously, as the per-request
    check in goodput passes those requests. With nothing completed every statistic is
    None and not met (nothing was served). Latency statistics cover served requests only,
    so requests that were never served (rejected: a prompt of max_model_len tokens or more) fail
    the SLO outright: they appear as a ``rejected_requests`` row whose threshold is 0.

    Args:
        samples: ``{metric: sample count}`` for every metric of :data:`METRICS`.
    """
    if not spec:
        return {"slo": {}, "slo_met": None, "goodput": None, "good_requests": None}
    table, met_all = {}, True
    if s.get("rejected"):
        table["rejected_requests"] = {"count": {"threshold": 0, "value": s["rejected"],
                                                "met": False}}
        met_all = False
    for metric, entries in spec.items():
        table[metric] = {}
        for stat, thr in entries.items():
            value = s[metric][stat]
            met = value <= thr if value is not None else s["completed"] > 0
            met_all &= met
            table[metric][stat] = {"threshold": thr, "value": value, "met": bool(met),
                                   "samples": samples[metric]}
    good = done.copy()
    for metric, entries in spec.items():
        if metric not in PER_REQUEST_METRICS:
            continue
        x = req[metric].to_numpy()
        ok = x <= min(entries.values())
        if metric == "tpot_ms":
            ok |= np.isnan(x)
        good &= ok
    n_good = int(good.sum())
    return {"slo": table, "slo_met": bool(met_all),
            "goodput": n_good / dur_s if dur_s else None, "good_requests": n_good}


def saturation_throughput(finish_ns, until_ns: float | None = None) -> float | None:
    """Requests/s of a burst run between its 10th and 90th percentile finishes (the ramp-up
    and the drain left out, so the figure is the engine's steady capacity). ``finish_ns``:
    finish times in ns, None or NaN for a request that did not finish; inf when those
    finishes fall in one instant (a step that ends most of the burst: no rate to bound).
    ``until_ns``: the window ends there if that is sooner (the engine stopped being
    saturated), and None is returned when fewer than a quarter of the finishes fall in it.

    Raises:
        ValueError: fewer than 5 finished requests.
    """
    f = np.asarray(finish_ns, dtype=np.float64)   # None -> NaN; no Python loop per job
    f = np.sort(f[~np.isnan(f)].astype(np.int64))
    if f.size < 5:
        raise ValueError("saturation run needs at least 5 finished requests")
    i0, i1 = f.size // 10, f.size - 1 - f.size // 10
    if until_ns is not None:
        i1 = min(i1, int(np.searchsorted(f, until_ns, side="right")) - 1)
        if i1 - i0 < max(5, f.size // 4):
            return None
    span = int(f[i1] - f[i0])
    return (i1 - i0) / (span / 1e9) if span > 0 else math.inf


def served_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of a run's request table (:data:`REQUEST_COLUMNS`) served to the end: a
    first token and a finish, neither rejected nor aborted; warm-up rows included (the
    figures leave them out, as :meth:`MetricsCollector.finalize` counts ``completed``)."""
    if not len(requests):
        return requests
    return requests[requests["finish_s"].notna() & requests["first_token_s"].notna()
                    & ~requests["finish_reason"].isin(["rejected", "abort"])]


def summary_at(summary: dict, path: tuple):
    """The value at ``path`` (keys) in a nested summary dict, or None where a key is
    missing or a value on the way is not a dict (``("ttft_ms", "p99")``)."""
    for k in path:
        summary = summary.get(k) if isinstance(summary, dict) else None
    return summary


def jsonable(x):
    """``x`` (nested dicts, lists, NumPy scalars, paths) as plain JSON types with floats
    rounded to 6 significant digits (:func:`round_sig`).

    Raises:
        TypeError: a value of another type.
    """
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_, int, float, np.integer, np.floating)):
        return round_sig(x)
    if hasattr(x, "__fspath__"):
        return str(x)
    raise TypeError(f"summary value {x!r} ({type(x).__name__}) is not JSON-able")


def exact_figures(summary: dict, exact: dict | None) -> dict:
    """``summary`` (a run summary, rounded) with each float taken from ``exact`` (the same
    figures before rounding, :attr:`RunResult.exact`; None: none known) where that rounds
    to it, so that a figure shown, or a mean over replications, rounds once from the exact
    figure (5 figures of summary.json's 6 would round twice: 12670.52 is 12670.5 there,
    then 12670, not 12671). Units as in ``summary``."""
    def merge(rounded, exact):
        if isinstance(rounded, dict):
            return {k: merge(v, exact.get(k) if isinstance(exact, dict) else None)
                    for k, v in rounded.items()}
        if (isinstance(rounded, float) and isinstance(exact, (float, np.floating))
                and round_sig(exact) == rounded):
            return float(exact)
        return rounded
    return merge(summary, exact)


def combine_replications(summaries: list[dict], rounded: bool = True) -> dict:
    """Mean and 95% confidence interval of every numeric figure across replications.

    Args:
        summaries: run summaries (:attr:`RunResult.summary`) of the same scenario with
            different seeds; for figures that round once, their exact figures
            (:func:`exact_figures`).
        rounded: round the means and intervals to 6 significant digits (False: as
            computed, for a table that rounds each cell once).

    Returns:
        The summaries' nesting with each numeric leaf replaced by ``{"mean": m, "ci95":
        [lo, hi], "n": n}``: Student t interval ``m -/+ t_{0.975, n-1} * s / sqrt(n)``
        (``s`` the sample standard deviation, ddof=1; ``scipy.stats.t``), ``ci95`` None
        when n = 1; in the figures' units. ``n`` counts the replications where the figure
        is a number (None, bools and strings are skipped).

    Raises:
        ValueError: an empty list.
    """
    if not summaries:
        raise ValueError("combine_replications needs at least one summary")

    def walk(values):
        dicts = [v for v in values if isinstance(v, dict)]
        if dicts:
            keys = list(dict.fromkeys(k for d in dicts for k in d))
            out = {}
            for k in keys:
                r = walk([d[k] for d in dicts if k in d])
                if r is not None:
                    out[k] = r
            return out or None
        nums = [float(v) for v in values
                if isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v)]
        if not nums:
            return None
        ci = t_interval(nums)
        return {"mean": float(np.mean(nums)), "ci95": list(ci) if ci else None, "n": len(nums)}

    out = walk(list(summaries)) or {}
    return jsonable(out) if rounded else out
