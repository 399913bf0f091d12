"""Measured fidelity of the simulator against the real engine, across load.

Two modes (the simulator differs from the engine only in where a step's
duration comes from):

* **timing replay** — the simulator takes the engine's recorded duration for each step;
  policy and simulator are then checked exactly: the same per-step batches, prefix hits
  and preemptions, every request timestamp within 1 ms (:mod:`calibration.timing_replay`,
  which also fixes the timing boundaries both sides share).
* **predicted** — the profile's cost model prices every step; this is the fidelity users
  get (:func:`validate`).

This module builds the workloads (saturation burst, Poisson loads), probes the host's
speed, runs both modes per load and replication and gathers the error table; the outputs
are :mod:`calibration.validate_report`'s. The engine's work between steps (turning arrivals
into token ids, detokenising finished requests) is measured as the front-end gap and
reported; it enters a prediction only with ``front_end=True``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator.errors import InputError
from simulator.files import check_folder, through_parents
from simulator.metrics import saturation_throughput, summary_at
from simulator.policy.kv_cache import cdiv

from .timing_replay import (ScaledCost, compare_timing, engine_config, engine_result,
                            run_engine, simulate_specs, simulate_timing)

#: figures compared per load: (label, summary path)
FIGURES = tuple(
    [(f"{m.split('_')[0].upper()} p{q}", (m, f"p{q}"))
     for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") for q in (50, 90, 99)]
    + [("throughput req/s", ("request_throughput",)),
       ("throughput out tok/s", ("output_throughput",)),
       ("concurrency mean", ("concurrency", "requests_mean")),
       ("concurrency max", ("concurrency", "requests_max")),
       ("preemptions", ("preemptions",)),
       ("prefix hit rate", ("prefix_cache_hit_rate",))])
BAND_FIGURES = ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2EL p50", "E2EL p99")


# == workloads ==============================================================================

def load_specs(scenario, rate: float | None, num_requests: int, seed: int, burst=False):
    """The scenario's request list with its arrival rate and count replaced (``burst``:
    every request arrives at 0, for the saturation run)."""
    from simulator.workload import build_workload
    wl = scenario.workload
    upd = {"seed": int(seed), "num_requests": int(num_requests)}
    if rate is not None:
        upd["arrival"] = wl.arrival.model_copy(update={"rate": float(rate)})
    specs = build_workload(wl.model_copy(update=upd), base_dir=scenario.base_dir)
    if burst:
        specs = [dataclasses.replace(s, arrival_ns=0) for s in specs]
    return specs


def replication_seed(seed: int, key) -> int:
    """Seed of one validation run, from ``numpy.random.SeedSequence([seed, *key])``."""
    return int(np.random.SeedSequence([int(seed), *key]).generate_state(1)[0])


def served_scenario(scenario, cfg: dict):
    """``scenario`` with the KV cache the engine serves it with (``cfg["num_gpu_blocks"]``
    blocks, ``cfg`` from :func:`engine_config`), so that the simulator preempts where the
    engine does."""
    return scenario.model_copy(update={"engine": scenario.engine.model_copy(
        update={"num_gpu_blocks": cfg["num_gpu_blocks"]})})


def saturation_specs(scenario, num_requests: int):
    """The saturation run's request list: ``num_requests`` of the scenario's lengths, all
    arriving at 0 (seed ``SeedSequence([workload.seed, 0])``)."""
    return load_specs(scenario, None, num_requests, replication_seed(scenario.workload.seed,
                                                                     (0,)), burst=True)


def replication_specs(scenario, load: float, rate: float, num_requests: int, r: int):
    """The request list of replication ``r`` (from 0) at ``load`` of saturation: Poisson
    arrivals at ``rate`` req/s (seed ``SeedSequence([workload.seed, load‰, r + 1])``)."""
    return load_specs(scenario, rate, num_requests,
                      replication_seed(scenario.workload.seed, (load_key(load), r + 1)))


def other_host(profile, host: tuple[str, str] | None = None) -> str | None:
    """The CPU a CPU profile was measured on, when it is not this host's model or matmul
    instruction set: step costs measured on one CPU do not price another's (an AMD EPYC
    profile on an Intel Xeon with AMX priced prefills x1.46 and decodes x0.60). Read from
    the device name ``servesim calibrate`` writes, ``cpu <model name> (<ISA>, <N>
    thread(s))`` (:func:`calibration.cli._device_info`).

    Args:
        profile: a :class:`simulator.cost_model.Profile`, or None (an inline step time).
        host: ``(model name, ISA)`` of this host (default :func:`calibration.profiler.cpu_name`,
            :func:`calibration.profiler.cpu_isa`).

    Returns:
        ``"<model name> (<ISA>)"`` of the profile's CPU; None for this host's (its model
        name begins with the profile's, and the ISA is the same where the profile states
        one), a GPU profile, an inline step time or a ``--device-name`` label.
    """
    from calibration.profiler import cpu_isa, cpu_name

    name = profile.device.name if profile is not None and profile.device.kind == "cpu" else ""
    m = re.fullmatch(r"cpu (.+) \((?:(.+), )?\d+ threads?\)", name)
    if m is None:
        return None
    name_here, isa_here = host or (cpu_name(), cpu_isa())
    # a profile may name its CPU shorter ("AMD EPYC") and leave out the ISA
    if name_here.startswith(m[1]) and m[2] in (None, isa_here):
        return None
    return m[1] + (f" ({m[2]})" if m[2] else "")


def profile_origin(profile) -> dict:
    """Where ``profile`` was measured, for a validation's ``meta``: ``profile_device`` (its
    device name, or ``inline step_time``) and, for a CPU profile from another CPU
    (:func:`other_host`), ``profile_warning``, also printed to stderr as a warning: its
    errors would be the two hosts' difference as much as the simulator's."""
    from calibration.profiler import cpu_isa, cpu_name

    out = {"profile_device": profile.device.name if profile is not None
           else "inline step_time"}
    elsewhere = other_host(profile)
    if elsewhere:
        isa = cpu_isa()
        out["profile_warning"] = f"measured on another CPU ({elsewhere})"
        print(f"servesim: warning: the profile was measured on another CPU, {elsewhere}; "
              f"this host is {cpu_name()}{f' ({isa})' if isa else ''}: its step costs need "
              f"not hold here, so the errors below would be the two hosts' difference as "
              f"much as the simulator's; calibrate on this host (servesim calibrate) and "
              f"validate with that profile", file=sys.stderr)
    return out


def profile_threads(profile) -> int | None:
    """CPU threads the profile was measured with: ``threads`` in its measurements CSV's
    header, else the count its provenance or device name states ("1 thread", "4 threads");
    None when neither says."""
    from calibration.profiler import read_csv_header

    if profile is None:
        return None
    rel = profile.provenance.measurements_csv
    if rel and profile.path is not None and (profile.path.parent / rel).is_file():
        threads = (read_csv_header(profile.path.parent / rel) or {}).get("threads")
        if isinstance(threads, int) and threads > 0:
            return threads
    m = re.search(r"(\d+) threads?\b", profile.provenance.source or "") or \
        re.search(r"(\d+) threads?\b", profile.device.name)
    return int(m.group(1)) if m else None


def wait_quiet(max_wait_s: float = 120.0, busy_pct: float = 15.0, need_s: int = 3,
               stat_path: str = "/proc/stat") -> float:
    """Wait until the whole machine is at most ``busy_pct`` % busy for ``need_s``
    consecutive seconds (from ``/proc/stat``), at most ``max_wait_s``; returns the wait."""
    from .profiler import busy_cores

    t0 = time.monotonic()
    quiet = 0
    cpus = os.cpu_count() or 1
    while quiet < need_s and time.monotonic() - t0 < max_wait_s:
        busy = busy_cores(1.0, stat_path)
        if busy is None:
            break
        quiet = quiet + 1 if 100.0 * busy / cpus <= busy_pct else 0
    return time.monotonic() - t0


# == the host's speed =====================================================================

# The probe re-measures four of the profile's grid cells, as the grid measured them: the
# cells nearest a small, a mid-sized and a full decode batch (memory-bound steps; a full
# batch streams the most KV, and a shared host's slowdowns hit it hardest: a saturation
# run can run 20% slow while the two smaller batches timed at their calibration speed) and a
# 256-token prefill (a compute-bound one).
PROBE_TARGETS = (("decode", 2, 256), ("decode", 8, 256), ("decode", 32, 256),
                 ("prefill", 256, 0))
PROBE_VISITS = 10
#: Tokens a probe's decode request keeps below ``max_model_len`` (its set-up and timed steps).
PROBE_HEADROOM = 8


def _measurements(profile):
    """``profile``'s measurements CSV as a table, None when it has none."""
    from calibration.profiler import read_measurements

    rel = profile.provenance.measurements_csv if profile is not None else None
    if not rel or profile.path is None or not (profile.path.parent / rel).is_file():
        return None
    return read_measurements(profile.path.parent / rel)


def grid_passes(profile) -> int:
    """How many passes ``profile``'s grid made (its CSV's ``pass`` values; 1 without a
    CSV): the probe visits its decode cells at the passes' context offsets in turn."""
    df = _measurements(profile)
    return 1 if df is None or df.empty else int(df["pass"].max()) + 1


def chunks_stepped(profile) -> bool:
    """Whether ``profile``'s grid stepped its chunk cells' chunks through their span over
    the passes (:func:`calibration.profiler.pass_chunk_tokens`): some prefill row of its
    CSV ran more tokens than its cell names. False without a CSV, and for a CSV measured
    before grids stepped them (its rows ran each cell's ``n``)."""
    from calibration.profiler import Cell

    df = _measurements(profile)
    if df is None:
        return False
    rows = df[df["kind"] == "prefill"]
    return any(str(run) != f"{cell.n}@{cell.c}" for cell, run in
               zip(map(Cell.from_key, rows["cell"]), rows["prefills"]) if cell is not None)


def probe_cells(profile) -> list | None:
    """Per :data:`PROBE_TARGETS` entry, ``(Cell, mean seconds)`` of the cell of that kind in
    ``profile``'s measurements CSV nearest to it (log distance); None without a CSV or
    without such cells."""
    from calibration.profiler import Cell

    df = _measurements(profile)
    if df is None:
        return None
    means = df.groupby("cell")["duration_ns"].mean()
    out = []
    for kind, a0, b0 in PROBE_TARGETS:
        best = None
        for key, mean_ns in means.items():
            cell = Cell.from_key(key)
            if cell is None or cell.kind != kind or cell.s:   # (no shared-prefix cell)
                continue
            a, b = (cell.B, cell.L) if kind == "decode" else (cell.n, cell.c)
            d = abs(math.log1p(a) - math.log1p(a0)) + abs(math.log1p(b) - math.log1p(b0))
            if best is None or d < best[0]:
                best = (d, cell, float(mean_ns) / 1e9)
        if best is None:
            return None
        out.append(best[1:])
    return out


class SpeedProbe:
    """The host's speed now relative to when the profile was measured: per probe cell
    (:func:`probe_cells`), the median of its steps measured now (``PROBE_VISITS`` visits,
    as the grid measured them, after one untimed visit; a decode cell's visits at the
    context offsets of the grid's ``passes`` in turn, a prefill cell's at its chunks, where
    the grid ``stepped`` them, :func:`chunks_stepped`) over its mean in the profile's CSV;
    the factor is the geometric mean over the cells (> 1: the host is slower now).

    A GPU keeps its speed; a shared CPU host does not (on a shared 2-core host,
    the same step's time moves by 10-50 % between minutes with no other process running),
    and a cost model measured minutes earlier then errs by that factor whatever its form.
    :func:`validate` probes before and after every timed run and reports the predictions
    both as they are and with every step cost scaled by the probe's factor.

    Every probe runs on a fresh engine whose free blocks are scattered as the grid's were
    (:func:`calibration.profiler.served_layout`): on a CPU a decode batch reading scattered
    blocks runs up to ~10% slower than one reading consecutive blocks
    (``benchmarks/results/kv_layout.md``), so a probe on a fresh pool would read the host as
    faster than it is, and one engine reused for every probe, its queue reordered by each
    probe's frees, as slowing down.
    """

    def __init__(self, model, config: dict, cells: list, passes: int = 1,
                 stepped: bool = True):
        from calibration.profiler import chunk_span, decode_lengths

        self.model, self.cells, self.passes, self.stepped = model, cells, passes, stepped
        bs = config["block_size"]
        # each cell's longest request: a stepped chunk after its context; a decode's
        # context and its steps (the grid's cells fitted its calibration's max_model_len)
        longest = max(c.c + c.n + chunk_span(c.n) if c.kind == "prefill"
                      else max(decode_lengths(c.B, c.L)) + PROBE_HEADROOM + 1
                      for c, _ in cells)
        blocks = max(c.B * cdiv(4 * c.L + 64, bs) + cdiv(c.n + chunk_span(c.n) + c.c, bs)
                     for c, _ in cells)
        # Only the shapes matter: knobs large enough that every cell runs as one step.
        self.config = {
            **config, "num_gpu_blocks": blocks + 16,
            "max_model_len": max(config["max_model_len"], longest),
            "max_num_seqs": max([config["max_num_seqs"]] + [c.B + 1 for c, _ in cells]),
            "max_num_batched_tokens": max([config["max_num_batched_tokens"]]
                                          + [c.n + chunk_span(c.n) + c.B
                                             for c, _ in cells])}
        self.engine = None   # the latest probe's engine

    @property
    def label(self) -> str:
        """The probe cells for a report: each cell's key with its mean step time in the
        profile's CSV (ms), comma-separated."""
        return ", ".join(f"{c.key} ({ref * 1e3:.2f} ms)" for c, ref in self.cells)

    def _measure(self, driver, cell, visit: int = 0) -> list[int]:
        """One visit's step durations (ns); a decode cell's contexts, a prefill cell's
        chunk, with the grid's offset of pass ``visit mod passes``
        (:func:`calibration.profiler.pass_extra_blocks`,
        :func:`~calibration.profiler.pass_chunk_tokens`), so that the visits average what
        the cell's mean in the CSV averaged."""
        from calibration.engine.attention import padding
        from calibration.profiler import (_check, decode_room_blocks, pass_chunk_tokens,
                                          pass_extra_blocks)

        n = None
        if cell.kind == "prefill":
            n = (pass_chunk_tokens(cell.n, visit % self.passes, self.passes)
                 if self.stepped else cell.n)
            recs = [driver.chunk_step(n, cell.c)]
        else:
            cfg = self.config
            room = decode_room_blocks(cell.B, cell.L, 0, cfg["block_size"],
                                      cfg["max_model_len"], PROBE_HEADROOM)
            extra = pass_extra_blocks(visit % self.passes, self.passes,
                                      padding(cfg.get("device", "cpu")).pieces)
            rids = driver.start_decodes(cell.B, cell.L, extra_blocks=max(0, min(extra, room)))
            recs = [driver.step() for _ in range(2)]
            driver.stop(rids)
        for r in recs:
            _check(cell, r, n)
        return [r.duration_ns for r in recs]

    def __call__(self) -> float:
        from calibration.engine import LLMEngine
        from calibration.profiler import _Driver, served_layout

        self.engine = LLMEngine(self.model, self.config)
        served_layout(self.engine)
        driver = _Driver(self.engine, seed=self.config.get("seed", 0) + 7)
        for cell, _ in self.cells:
            self._measure(driver, cell)
        logs = []
        for cell, ref in self.cells:
            times = [t for v in range(PROBE_VISITS) for t in self._measure(driver, cell, v)]
            logs.append(math.log(float(np.median(times)) / 1e9 / ref))
        return math.exp(sum(logs) / len(logs))


# == the comparison =========================================================================

def signed_error(pred, meas):
    """(predicted − measured) / measured, None when undefined."""
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas


def _spread(values):
    """``{mean, min, max, n}`` of the finite ``values`` (one per replication) and ``each``:
    every replication's, in order (None where undefined), so that validation.json can be
    judged again; None when none is finite."""
    each = [float(x) if x is not None and math.isfinite(x) else None for x in values]
    v = [x for x in each if x is not None]
    if not v:
        return None
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()),
            "n": int(a.size), "each": each}


@dataclass
class LoadResult:
    """One load level: per replication the measured, predicted and band summaries."""

    load: float
    rate: float
    num_requests: int
    measured: list = field(default_factory=list)
    predicted: list = field(default_factory=list)
    band_low: list = field(default_factory=list)    # predicted × (1 − MAPE)
    band_high: list = field(default_factory=list)   # predicted × (1 + MAPE)
    adjusted_low: list = field(default_factory=list)    # the same at host speed
    adjusted_high: list = field(default_factory=list)
    timing: list = field(default_factory=list)
    cdf: list = field(default_factory=list)
    speed: list = field(default_factory=list)       # host speed factor per replication
    adjusted: list = field(default_factory=list)    # predicted at that speed
    again: list = field(default_factory=list)       # the same requests served once more

    def table(self) -> list[dict]:
        """Per figure: measured, predicted, signed error (mean/min/max over replications),
        with repeat servings the second serving's signed difference from the first
        (``again_error``) and, for the band figures, whether the measured value lies in the
        MAPE band (``in_band``; ``in_band_adjusted``: in the band around the prediction at
        host speed; ``in_band_count*``: ``[inside, judged, replications]``, a replication
        being judged where its band and measured figure are defined)."""
        rows = []
        for label, path in FIGURES:
            m = [summary_at(s, path) for s in self.measured]
            p = [summary_at(s, path) for s in self.predicted]
            e = [signed_error(b, a) for a, b in zip(m, p)]
            row = {"figure": label, "measured": _spread(m), "predicted": _spread(p),
                   "error": _spread(e)}
            if self.adjusted:
                a = [summary_at(s, path) for s in self.adjusted]
                row["adjusted"] = _spread(a)
                row["adjusted_error"] = _spread([signed_error(b, x) for x, b in zip(m, a)])
            if self.again:
                row["again_error"] = _spread([signed_error(summary_at(s, path), x)
                                              for x, s in zip(m, self.again)])
            for key, center, low, high in (
                    ("", self.predicted, self.band_low, self.band_high),
                    ("_adjusted", self.adjusted, self.adjusted_low, self.adjusted_high)):
                if label in BAND_FIGURES and low:
                    (row["in_band" + key], row["band" + key],
                     row["in_band_count" + key]) = _in_band(m, center, low, high, path)
            if label in BAND_FIGURES and self.band_low and self.again:
                row["again_in_band"], row["again_in_band_count"] = _again_in_band(
                    m, p, [summary_at(s, path) for s in self.again], self.band_low,
                    self.band_high, path)
            rows.append(row)
        return rows


def _edges(center, lo, hi) -> tuple:
    """A replication's band: from the least to the most of its prediction ``center`` and its
    two simulations at ×(1 ∓ MAPE). A short run's percentile need not move steadily with the
    step cost (TPOT p99 188 ms predicted, 183 at ×0.97, 179 at ×1.03): the band is the
    prediction's, so it holds it."""
    vals = [v for v in (center, lo, hi) if v is not None]
    return min(vals), max(vals)


def _in_band(measured: list, center: list, low: list, high: list, path) -> tuple:
    """Whether every replication's measured figure lies in its band (:func:`_edges`: its
    prediction ``center`` and its two band simulations; None when undefined), the bands'
    ``[low, high]`` edge spreads over the replications, and ``[inside, judged,
    replications]``: a verdict from some replications says how many."""
    inside, ends = [], []
    for mv, c, lo, hi in zip(measured, center, low, high):
        lo_v, hi_v = summary_at(lo, path), summary_at(hi, path)
        ends.append((None, None) if None in (lo_v, hi_v) else
                    _edges(summary_at(c, path), lo_v, hi_v))
        if None not in (mv, *ends[-1]):
            inside.append(ends[-1][0] <= mv <= ends[-1][1])
    return (all(inside) if inside else None,
            [_spread([e[0] for e in ends]), _spread([e[1] for e in ends])],
            [sum(inside), len(inside), len(measured)])


def _again_in_band(measured: list, predicted: list, again: list, low: list, high: list,
                   path) -> tuple:
    """Whether every replication's second serving lies in its MAPE band moved onto the
    first serving (band × first / predicted): the band check as a predictor that hit the
    first serving exactly would fare, so the engine's own run-to-run spread against the
    band's width (None when undefined); and ``[inside, judged, replications]``."""
    inside = []
    for mv, pv, av, lo, hi in zip(measured, predicted, again, low, high):
        lo_v, hi_v = summary_at(lo, path), summary_at(hi, path)
        if None in (mv, pv, av, lo_v, hi_v) or not pv:
            continue
        a, b = _edges(pv, lo_v, hi_v)
        inside.append(a * mv / pv <= av <= b * mv / pv)
    return (all(inside) if inside else None), [sum(inside), len(inside), len(measured)]


# == the whole validation ===================================================================

# Bounds of the validation flags: a validation takes minutes to hours of wall clock (each
# load and replication serves ``--seconds`` of arrivals in real time), and the saturation
# figure counts finishes between the 10th and 90th percentile (at least 5 of them).
MIN_LOAD, MAX_LOAD = 0.01, 1.5
MAX_REPLICATIONS = 100
MAX_SECONDS_PER_LOAD = 3600.0
MIN_SATURATION_REQUESTS, MAX_SATURATION_REQUESTS = 5, 100_000
# The fewest requests a load serves unless ``--min-requests`` says otherwise (it takes 1 to
# MAX_SATURATION_REQUESTS): a percentile of a handful of requests is one request's figure.
MIN_REQUESTS = 10


def check_loads(loads) -> None:
    """Refuse loads outside [:data:`MIN_LOAD`, :data:`MAX_LOAD`] (fractions of the
    measured saturation throughput), or none.

    Raises:
        InputError: naming ``--loads``, the allowed range and the loads given.
    """
    if not loads or any(not MIN_LOAD <= x <= MAX_LOAD for x in loads):
        raise InputError(f"--loads: fractions of saturation in [{MIN_LOAD:g}, {MAX_LOAD:g}], "
                         f"got {','.join(f'{x:g}' for x in loads) or 'none'}")


def check_validation_args(scenario, loads, replications: int, seconds_per_load: float = 1.0,
                          saturation_requests: int | None = None,
                          min_requests: int | None = None) -> None:
    """What every validation needs, checked before any engine starts.

    Raises:
        InputError: more than one replica, or a flag outside its bounds (the constants
            above): loads in [0.01, 1.5], replications in [1, 100], seconds per load in
            (0, 3600], saturation requests in [5, 100000], minimum requests per load in
            [1, 100000].
    """
    if scenario.cluster.replicas != 1:
        raise scenario.error("cluster.replicas", f"validation serves one engine, so it must "
                                                 f"be 1 (got {scenario.cluster.replicas})")
    # Each load is a fixed list of arrival times at a rate set from the saturation; closed
    # loops, sessions and traces time arrivals by finishes or by the file (a list would put a
    # closed loop's requests all at 0: a burst at every load).
    wl = scenario.workload
    key = ("workload.trace" if wl.trace is not None else
           "workload.sessions" if wl.sessions is not None else
           "workload.arrival.process" if getattr(wl.arrival, "process", None) == "closed_loop"
           else "workload.max_concurrency" if wl.max_concurrency is not None   # no client
           else None)                                                           # gate there
    if key is not None:
        raise scenario.error(key, "validate serves open-loop arrivals (poisson, gamma or "
                                  "constant) at rates set from the measured saturation: give "
                                  "the scenario one of those, and no sessions, trace or "
                                  "max_concurrency")
    check_loads(loads)
    check_run_flags(replications, seconds_per_load, saturation_requests, min_requests)


def check_run_flags(replications: int, seconds_per_load: float = 1.0,
                    saturation_requests: int | None = None,
                    min_requests: int | None = None) -> None:
    """The flags of :func:`check_validation_args` that need no scenario, for the scripts
    that check them before loading one.

    Raises:
        InputError: replications outside [1, 100], seconds per load outside (0, 3600] or
            not finite, saturation requests outside [5, 100000], minimum requests per load
            outside [1, 100000] (the constants above).
    """
    if not 1 <= replications <= MAX_REPLICATIONS:
        raise InputError(f"--replications: 1 to {MAX_REPLICATIONS}, got {replications}")
    if not (math.isfinite(seconds_per_load) and 0 < seconds_per_load <= MAX_SECONDS_PER_LOAD):
        raise InputError(f"--seconds: seconds of arrivals per load, in (0, "
                         f"{MAX_SECONDS_PER_LOAD:g}]; got {seconds_per_load}")
    if saturation_requests is not None and not (
            MIN_SATURATION_REQUESTS <= saturation_requests <= MAX_SATURATION_REQUESTS):
        raise InputError(f"--saturation-requests: {MIN_SATURATION_REQUESTS} to "
                         f"{MAX_SATURATION_REQUESTS} (throughput is counted between the 10th "
                         f"and 90th percentile finishes), got {saturation_requests}")
    if min_requests is not None and not 1 <= min_requests <= MAX_SATURATION_REQUESTS:
        raise InputError(f"--min-requests: 1 to {MAX_SATURATION_REQUESTS} requests per load, "
                         f"got {min_requests}")


def saturation_warning(scenario, saturation_requests: int | None) -> str | None:
    """Why a ``--saturation-requests`` burst under twice ``max_num_seqs`` misleads (None
    otherwise): it runs as a batch or two draining, faster than the engine sustains with a
    queue, and every load is a fraction of that rate (0.5 of it can be an overload)."""
    n = scenario.max_num_seqs
    if saturation_requests is None or saturation_requests >= 2 * n:
        return None
    return (f"--saturation-requests {saturation_requests} is under twice max_num_seqs "
            f"({n}): the burst runs as a batch or two draining, not at the rate the engine "
            f"sustains with requests queued, and every load is a fraction of it (default "
            f"{4 * n}, 4 × max_num_seqs)")


def measure_fidelity(sc1, base, timed, *, loads, replications: int,
                     seconds_per_load: float, saturation_requests: int | None,
                     front_end: bool, progress, engine_name: str, speed=None,
                     again: bool = False, min_requests: int | None = None) -> dict:
    """The measurement loop of :func:`validate`, whatever engine serves: ``timed(specs,
    label)`` serves a request list in real time and returns its :class:`EngineRun`;
    ``sc1`` is the scenario with the engine's effective knobs and ``base`` its cost model;
    ``again``: serve every replication's request list a second time (the engine's own
    run-to-run difference: the floor under any prediction's error on this machine);
    ``min_requests``: the fewest requests a load serves, however few its seconds bring
    (None: :data:`MIN_REQUESTS`).

    Returns:
        ``saturation`` (requests, measured/predicted req/s, error, mean engine step ms,
        ``timing`` check of the burst), ``front_end`` (gap mean/p99 us, whether predictions
        include it), ``loads`` and ``cdf`` as :func:`validate` describes.
    """
    prof = base.profile
    mape = prof.error.heldout.mape if prof is not None and prof.error.heldout else None
    slo = sc1.slo.model_dump(exclude_none=True)

    def run_at(specs, label):
        """The timed run and the host's speed factor over it (geometric mean of the
        probes before and after; None without a probe)."""
        before = speed() if speed else None
        run = timed(specs, label)
        return run, (math.sqrt(before * speed()) if speed else None)

    # -- saturation ------------------------------------------------------------------------
    n_sat = saturation_requests or 4 * sc1.max_num_seqs
    sat_specs = saturation_specs(sc1, n_sat)
    progress(f"saturation: {n_sat} requests at once on {engine_name}")
    sat_run, sat_speed = run_at(sat_specs, "saturation")
    sat_meas = saturation_throughput([r.finish_ns for r in sat_run.records])

    def sat_predicted(cost):
        sim = simulate_specs(sc1, sat_specs, cost)
        return saturation_throughput((sim.requests["finish_s"] * 1e9).tolist())

    gaps = sat_run.front_end_gaps_ns()
    fe_ns = int(gaps.mean()) if gaps.size else 0
    fe = fe_ns if front_end else 0   # in the prediction, as at the loads (--front-end)
    sat_pred = sat_predicted(ScaledCost(base, 1.0, fe))
    sat_adj = sat_predicted(ScaledCost(base, sat_speed, fe)) if sat_speed else None
    steps_ns = np.asarray([s.duration_ns for s in sat_run.steps])
    progress(f"  measured {sat_meas:.3f} req/s, predicted {sat_pred:.3f} "
             f"({signed_error(sat_pred, sat_meas):+.1%})" + (
                 f"; probed steps took ×{sat_speed:.3f} their calibration time, predicted "
                 f"at that host speed {sat_adj:.3f} ({signed_error(sat_adj, sat_meas):+.1%})"
                 if sat_speed else ""))

    # -- loads -----------------------------------------------------------------------------
    # Replications are the outer loop, so the loads interleave (0.3, 0.6, 0.9, 0.3, ...): a
    # slow or fast phase of a shared host lands on one replication of several loads rather
    # than on every replication of one.
    results = []
    for x in loads:
        rate = x * sat_meas
        results.append(LoadResult(load=x, rate=rate,
                                  num_requests=max(min_requests or MIN_REQUESTS,
                                                   int(round(rate * seconds_per_load)))))
    cdf = []
    for r in range(replications):
        for lr in results:
            x, rate, n = lr.load, lr.rate, lr.num_requests
            specs = replication_specs(sc1, x, rate, n, r)
            progress(f"load {x:g}: {n} requests at {rate:.3f}/s, replication {r + 1}/"
                     f"{replications} (about {n / rate:.0f} s)")
            run, sp = run_at(specs, f"load {x:g} r{r + 1}")
            meas = engine_result(run, slo)
            tres, tcost = simulate_timing(sc1, specs, run, price=base)
            lr.timing.append(compare_timing(run, tres, tcost))
            pred = simulate_specs(sc1, specs, ScaledCost(base, 1.0, fe))
            if sp:
                lr.speed.append(sp)
                lr.adjusted.append(simulate_specs(sc1, specs, ScaledCost(base, sp, fe)).summary)
            lr.measured.append(meas.summary)
            lr.predicted.append(pred.summary)
            if again:
                progress(f"load {x:g}: replication {r + 1}/{replications} served again")
                lr.again.append(engine_result(timed(specs, f"load {x:g} r{r + 1} again"),
                                              slo).summary)
            if mape:   # around the prediction, and around it at the host's speed if probed
                for speed_f, low, high in ((1.0, lr.band_low, lr.band_high),) + (
                        ((sp, lr.adjusted_low, lr.adjusted_high),) if sp else ()):
                    for f, dest in ((1 - mape, low), (1 + mape, high)):
                        dest.append(simulate_specs(sc1, specs, ScaledCost(
                            base, f * speed_f, fe)).summary)
            if r == 0:
                cdf.append({"load": x, **{
                    f"{side}_{m}": [v for v in res.requests[m].tolist() if v == v]
                    for side, res in (("measured", meas), ("predicted", pred))
                    for m in ("ttft_ms", "tpot_ms", "e2el_ms")}})
    out_loads = [{"load": lr.load, "rate": lr.rate, "num_requests": lr.num_requests,
                  "table": lr.table(), "timing": lr.timing, "host_speed": lr.speed}
                 for lr in results]
    return {"saturation": {"requests": n_sat, "measured_rps": sat_meas,
                           "predicted_rps": sat_pred,
                           "error": signed_error(sat_pred, sat_meas),
                           "host_speed": sat_speed, "adjusted_rps": sat_adj,
                           "adjusted_error": signed_error(sat_adj, sat_meas),
                           "engine_step_ms_mean": float(steps_ns.mean() / 1e6),
                           "timing": compare_timing(sat_run, *simulate_timing(
                               sc1, sat_specs, sat_run, price=base))},
            "front_end": {"gap_us_mean": fe_ns / 1e3,
                          "gap_us_p99": float(np.percentile(gaps, 99) / 1e3) if gaps.size
                          else 0.0,
                          "in_prediction": bool(front_end)},
            "loads": out_loads, "cdf": cdf}


def predict_again(run: dict, scenario) -> dict:
    """A recorded validation's predictions made again with ``scenario``'s cost model, on
    the identical request lists (the run's seeds, rates and counts; no engine runs).

    ``run``: :func:`validate`'s result or its ``validation.json``; ``scenario``: the one it
    validated, with any profile. With the run's own profile it gives the run's predictions
    exactly; with another (refitted, or with a coefficient changed) it says how that profile
    would have fared against the same measured figures.

    Returns:
        ``saturation_rps`` (req/s) and ``loads``: per load of ``run``, per replication, the
        simulation's summary (:func:`summary_at` reads a figure from it).

    Raises:
        InputError: a projection (:func:`servable_cost_model`).
    """
    base = servable_cost_model(scenario)
    sc1 = served_scenario(scenario, engine_config(scenario, base.num_gpu_blocks,
                                                  scenario.workload.seed))
    fe = run["front_end"]
    cost = ScaledCost(base, 1.0, round(fe["gap_us_mean"] * 1e3) if fe["in_prediction"] else 0)
    sim = simulate_specs(sc1, saturation_specs(sc1, run["saturation"]["requests"]), cost)
    return {"saturation_rps": saturation_throughput((sim.requests["finish_s"] * 1e9).tolist()),
            "loads": [[simulate_specs(sc1, replication_specs(sc1, x["load"], x["rate"],
                                                             x["num_requests"], r), cost).summary
                       for r in range(len(x["timing"]))] for x in run["loads"]]}


def servable_cost_model(scenario):
    """The scenario's cost model (:func:`simulator.cost_model.build_cost_model`) when a
    validation can judge it: a measured profile or an inline step time.

    Raises:
        InputError: a projection (nothing measured on this machine to validate).
    """
    from simulator.cost_model import build_cost_model

    base = build_cost_model(scenario)
    prof = base.profile
    if prof is not None and prof.provenance.kind != "measured":
        key = "hardware.profile" if scenario.hardware.profile is not None else "hardware"
        raise scenario.error(key, f"validate serves the scenario on this machine's engine, "
                                  f"so it needs a profile measured here (servesim calibrate) "
                                  f"or an inline step_time, not a projection ({base.label})")
    return base


def validate(scenario, loads=(0.3, 0.6, 0.9), replications: int = 3, *,
             seconds_per_load: float = 60.0, saturation_requests: int | None = None,
             front_end: bool = False, quiet: bool = True, host_speed: bool = True,
             again: bool = False, min_requests: int | None = None,
             progress=print) -> dict:
    """Validate ``scenario``'s profile against the real engine on this machine.

    Steps: (1) saturation: every request of a burst arrives at 0; the engine's and the
    simulator's throughput between the 10th and 90th percentile finishes
    (:func:`saturation_throughput`); (2) per load ``x`` and replication ``r``: a workload
    of the scenario's lengths at ``x × measured saturation`` req/s (about
    ``seconds_per_load`` of arrivals, and at least ``min_requests`` requests, seed
    ``SeedSequence([seed, load‰, r])``) served in real time, then simulated on the
    identical request list: timing replay (exact check),
    predicted (the profile's costs) and the band with costs scaled by ``1 ± held-out
    MAPE`` of the profile. Replications are the outer loop: the loads interleave, so host
    drift spreads over the loads instead of biasing one.

    Args:
        scenario: validated scenario with a measured CPU profile (``hardware.profile``) or
            an inline step time; one replica.
        front_end: add the measured mean front-end gap per step (tokenising arrivals,
            detokenising finishes, between engine steps) to every predicted step.
        quiet: wait for a quiet machine before each timed run (:func:`wait_quiet`).
        host_speed: probe the host's speed before and after each timed run
            (:class:`SpeedProbe`) and add predictions at that speed (``adjusted``), with
            a MAPE band of their own (``in_band_adjusted``).
        again: serve every replication's request list a second time and report how far
            the second serving's figures lie from the first's (``again_error`` in the
            table rows) and, at the band figures, whether it lies in the MAPE band moved
            onto the first serving (``again_in_band``): the engine's own run-to-run spread
            on this machine, which no prediction can beat.

    Returns:
        JSON-able dict: ``meta`` (machine, versions, engine knobs, seeds, threads),
        ``saturation``, ``front_end``, ``loads`` (per load: rate, requests, ``table`` rows
        as :meth:`LoadResult.table`, ``timing`` checks) and ``cdf`` (per load, first
        replication: measured and predicted TTFT/TPOT/E2EL samples in ms).

    Raises:
        InputError: more than one replica, or a flag outside its bounds
            (:func:`check_validation_args`).
    """
    import platform

    import torch

    from calibration.engine.weights import parse_dtype, random_model

    from .cli import warn_if_emulated

    check_validation_args(scenario, loads, replications, seconds_per_load, saturation_requests,
                          min_requests)
    base = servable_cost_model(scenario)
    cfg = engine_config(scenario, base.num_gpu_blocks, scenario.workload.seed)
    # after every input error, so that a bad input stays one line
    warn_if_emulated("cpu", scenario.dtype, fix=(   # our engine serves on cpu here
        "validate in float32: --set dtype=float32 with a float32 profile (shipped: "
        "--set hardware.profile=cpu-llama-tiny-56m-float32)"))
    prof = base.profile
    where = profile_origin(prof)
    threads = profile_threads(prof)
    if threads:
        torch.set_num_threads(threads)
    mape = prof.error.heldout.mape if prof is not None and prof.error.heldout else None
    sc1 = served_scenario(scenario, cfg)
    model = random_model(scenario.model_shape.hf_config(), seed=cfg["seed"],
                         dtype=parse_dtype(scenario.dtype))

    def timed(specs, label):
        if quiet:
            waited = wait_quiet()
            if waited > 5:
                progress(f"  waited {waited:.0f} s for a quiet machine ({label})")
        return run_engine(model, cfg, specs)

    cells = probe_cells(prof) if host_speed else None
    probe = (SpeedProbe(model, cfg, cells, grid_passes(prof), chunks_stepped(prof))
             if cells else None)
    if host_speed and probe is None:
        progress("host speed: not probed (the profile has no measurements CSV with "
                 "decode and prefill cells)")
    result = measure_fidelity(sc1, base, timed, loads=loads,
                              replications=replications, seconds_per_load=seconds_per_load,
                              saturation_requests=saturation_requests, front_end=front_end,
                              progress=progress, engine_name="the engine", speed=probe,
                              again=again, min_requests=min_requests)
    meta = {
        "scenario": scenario.name, "source": scenario.source, "model": scenario.model_shape.name,
        "dtype": scenario.dtype, "engine": f"servesim-torch ({_version()})",
        "engine_knobs": {k: v for k, v in cfg.items()},
        "scheduling": "vLLM V1 semantics, synchronous (async_scheduling=False)",
        "cost_model": base.label, "heldout_mape": mape, **where,
        "replay_mape": prof.error.replay.mape if prof is not None and prof.error.replay
        else None,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "machine": f"{platform.machine()} "
        f"{os.cpu_count()} cpus", "cpu": _cpu_name(), "seed": scenario.workload.seed,
        "replications": replications, "seconds_per_load": seconds_per_load,
        "min_requests": min_requests or MIN_REQUESTS,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host_speed_probe": (f"{probe.label} (calibration means), {PROBE_VISITS} visits "
                             f"each") if probe else None,
    }
    result["front_end"]["note"] = ("engine time between a step's end and the next queue "
                                   "check (tokenising arrivals, detokenising finishes); "
                                   "measured in the saturation run")
    return {"meta": meta, **result}


def _version() -> str:
    from calibration.cli import engine_version
    return engine_version()


def _cpu_name() -> str:
    from calibration.profiler import cpu_name
    return cpu_name()


def load_key(load: float) -> int:
    """A load's thousandths, which seed its workloads (0.3 → 300)."""
    return round(load * 1000)


def parse_loads(text: str) -> list[float]:
    """``"0.3,0.6,0.9"`` → floats, each a whole number of thousandths (:func:`load_key`).

    Raises:
        InputError: not a comma-separated list of numbers in the digits 0-9, a load finer
            than a thousandth,
            or a load given twice (its workloads' seeds come from the load, so it would
            serve the same requests again).
    """
    import unicodedata

    for x in str(text).split(","):   # float() reads ０.５ and 0_5; YAML and every flag do not
        plain = unicodedata.normalize("NFKC", x).replace("_", "")
        if plain != x:
            raise InputError(f"--loads: {x!r} is not a number in the digits 0-9 (write "
                             f"{plain.strip()})")
    try:
        loads = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise InputError(f"--loads: {text!r} is not a comma-separated list of fractions "
                         f"such as 0.3,0.6,0.9") from None
    # a load out of range (inf, nan, 1e308) is check_validation_args's to name
    ranged = [MIN_LOAD <= x <= MAX_LOAD for x in loads]
    keys = [load_key(x) if ok else x for x, ok in zip(loads, ranged)]
    fine = [x for x, k, ok in zip(loads, keys, ranged) if ok and abs(x * 1000 - k) > 1e-9]
    if fine:   # 0.5 and 0.5004 would share their seeds
        raise InputError(f"--loads: {fine[0]!r} is finer than a thousandth (each load's "
                         f"workloads are seeded by its thousandths): give at most 3 decimals")
    twice = sorted({x for x, k in zip(loads, keys) if keys.count(k) > 1})
    if twice:
        raise InputError(f"--loads: {', '.join(f'{x:g}' for x in twice)} given twice (each "
                         f"load's workloads are seeded by it: the same requests again; use "
                         f"--replications)")
    return loads


def cmd_validate(args) -> int:
    """``servesim validate`` (its flags: :func:`calibration.cli.add_parsers`); exit status.

    Raises:
        InputError: a bad scenario, flag or environment (one line for the CLI).
    """
    if args.scenario is not None and args.scenario_flag is not None:
        raise InputError("validate: give the scenario once (positional or --scenario)")
    if args.scenario is None:   # "" goes on to load_scenario's "empty path"
        args.scenario = args.scenario_flag
    if args.model_dir is not None and args.backend != "vllm":
        raise InputError("--model-dir: only with --backend vllm (servesim's engine builds "
                         "the scenario's model with random weights)")
    if args.scenario is None:
        raise InputError("validate: a scenario YAML is required "
                         "(servesim validate SCENARIO [--profile P])")
    try:
        return _validate_command(args)
    except InputError as e:
        flag = f"--set hardware.profile={args.profile}"
        if args.profile is not None and flag in str(e):   # --profile goes in as that override
            raise InputError(str(e).replace(flag, f"--profile {args.profile}")) from None
        raise


def _validate_command(args) -> int:
    from simulator.scenario import load_scenario
    from simulator.sweep import with_sweep_hint
    check_folder(args.out, "--out", "validate")
    out = through_parents(Path(args.out))   # as checked: no folder left above a ".."
    overrides = list(args.set)
    if args.profile is not None:
        if not args.profile.strip():   # empty would fall back to the scenario's profile
            raise InputError(f"--profile {args.profile!r}: empty: give a profile name or the "
                             f"path to one (servesim profiles lists them)")
        overrides.append(f"hardware.profile={args.profile}")
    try:
        sc = load_scenario(args.scenario, overrides)
    except InputError as e:   # a list given to one key: say that validate takes one value
        raise with_sweep_hint(e, overrides, "validate") from None
    loads = parse_loads(args.loads)   # bad flags first, whatever is installed
    check_validation_args(sc, loads, args.replications, args.seconds, args.saturation_requests,
                          args.min_requests)
    warning = saturation_warning(sc, args.saturation_requests)
    if warning:
        print(f"servesim: warning: {warning}", file=sys.stderr)
    if args.backend == "servesim":
        from .cli import require_torch
        require_torch()

    def progress(msg: str) -> None:
        # on stderr, as the warnings: stdout holds the table, so a reader of it that goes
        # away (| head) ends nothing before the report is written (simulator.terminal)
        print(msg, file=sys.stderr, flush=True)

    if args.backend == "vllm":
        from .vllm import commands
        commands.QUIET_WAIT = not args.no_quiet_wait
        result = commands.validate_vllm(sc, loads, args.replications,
                                        seconds_per_load=args.seconds,
                                        saturation_requests=args.saturation_requests,
                                        front_end=args.front_end,
                                        model_dir_arg=args.model_dir, again=args.serve_again,
                                        min_requests=args.min_requests, progress=progress)
        result.pop("engine_object")
    else:
        result = validate(sc, loads, args.replications,
                          seconds_per_load=args.seconds,
                          saturation_requests=args.saturation_requests,
                          front_end=args.front_end, quiet=not args.no_quiet_wait,
                          host_speed=not args.no_host_speed, again=args.serve_again,
                          min_requests=args.min_requests, progress=progress)
    from .validate_report import markdown_table, write_outputs   # it imports this module
    paths = write_outputs(result, out)
    print(markdown_table(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
