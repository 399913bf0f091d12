"""Synthetic workloads: arrival processes, length distributions, prefix groups, sessions.

:func:`build_workload` turns the ``workload:`` section of a scenario
(:class:`WorkloadConfig`) into a list of :class:`simulator.policy.RequestSpec`, sorted by
``(arrival_ns, request_id)``.

Prompt content (segments ``(content_id, length)``, see :mod:`simulator.policy.request`):

* single requests: optional shared prefix ``(("prefix", group), shared_tokens)`` then a
  unique segment ``(("user", request_id), n)``; ``prompt_tokens`` counts the whole prompt,
  so ``n = max(prompt_tokens - shared_tokens, 1)``.
* sessions: turn 1 is the prefix (if any) plus ``(("user", id), prompt_tokens)``; turn k
  is turn k-1's prompt, then turn k-1's answer ``(answer_content_id, max_tokens)``, then a
  new ``(("user", id), prompt_tokens)`` segment. In session mode ``prompt_tokens`` is the
  *new user tokens per turn*; the prompt grows with the conversation.

Request ids (integers):

* open loop: requests whose arrival is known (single requests, first turns) get
  ``0..S-1`` in arrival order; follow-up turns get ``S, S+1, ...`` session by session,
  turn by turn.
* closed loop (``concurrency = C``): request ``j`` is user ``j mod C``'s ``(j div C)``-th
  request, so users' first requests are ``0..C-1`` (all arriving at 0) and request
  ``j >= C`` has ``after = j - C``.

Follow-ups carry ``after`` (the request whose finish triggers them), ``think_time_ns`` and
``arrival_ns = 0`` (the simulator sets the real arrival).

Determinism: each purpose (arrivals, prompt lengths, ...) draws from its own
``numpy.random.Generator`` spawned from ``numpy.random.SeedSequence(seed)``, so the same
config and seed give identical specs, and changing one part of the config does not reshuffle
the others' draws.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, field_validator, model_validator

from .errors import STRICT_SCHEMA, InputError, KeyedInputError, SubkeyError
from .files import is_regular_file, missing_file, scenario_path
from .policy.request import MAX_COUNT, MAX_TIME_NS, NS_PER_S, RequestSpec
from .traces import (NONBLANK, TraceConfig, load_trace, nonempty_path, read_csv_table,
                     ties_warning, trace_specs)

#: z-score of the 90th percentile of the standard normal, ``scipy.stats.norm.ppf(0.9)``.
Z90 = 1.2815515655446004

# Order is part of the determinism contract: append new purposes, never reorder.
_PURPOSES = ("arrival", "prompt", "output", "prefix", "turns", "session_think",
             "loop_think")


# -- distributions ---------------------------------------------------------------------

class _Dist(BaseModel):
    """Common clip bounds: every sample is clipped to ``[min, max]`` (``None`` = open)."""

    model_config = STRICT_SCHEMA

    min: Optional[float] = Field(None, ge=0)   # counts and seconds: never negative
    max: Optional[float] = Field(None, ge=0)

    @model_validator(mode="after")
    def _bounds(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) must be <= max ({self.max:g})")
        return self


class FixedDist(_Dist):
    """``{dist: fixed, value}``: always ``value``."""

    dist: Literal["fixed"]
    value: float = Field(ge=0)

    @model_validator(mode="after")
    def _centre(self):
        _centre_inside(self, self.value, "value", "every sample")
        return self


class UniformDist(_Dist):
    """``{dist: uniform, min, max}``: integers in ``[min, max]`` inclusive for token counts
    and turns; continuous ``U(min, max)`` for times."""

    dist: Literal["uniform"]
    min: float = Field(ge=0)
    max: float = Field(ge=0)


def _centre_inside(d: _Dist, centre: float, name: str, share: str = "most samples") -> None:
    """Clip bounds that cut off the centre would turn ``share`` of the samples into the
    bound."""
    if d.max is not None and d.max < centre:
        raise ValueError(f"max ({d.max:g}) is below the {name} ({centre:g}): {share} "
                         f"would be clipped to max")
    if d.min is not None and d.min > centre:
        raise ValueError(f"min ({d.min:g}) is above the {name} ({centre:g}): {share} "
                         f"would be clipped to min")


class NormalDist(_Dist):
    """``{dist: normal, mean, std}``: ``N(mean, std²)`` (clipped, lengths rounded)."""

    dist: Literal["normal"]
    mean: float = Field(ge=0)   # counts and seconds: a negative centre clips nearly all
    std: float = Field(ge=0)

    @model_validator(mode="after")
    def _centre(self):
        _centre_inside(self, self.mean, "mean")
        return self


class LognormalDist(_Dist):
    """``{dist: lognormal, median, p90}``: ``exp(N(mu, sigma²))`` with ``mu = ln(median)``
    and ``sigma = ln(p90 / median) / z_0.9`` (``z_0.9 = 1.28155``), so the distribution's
    median and 90th percentile are exactly the given figures."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    p90: float = Field(gt=0)

    @model_validator(mode="after")
    def _order(self):
        if self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90:g}) must be >= median ({self.median:g})")
        _centre_inside(self, self.median, "median")
        if self.max is not None and self.max < self.p90:   # the p90 asked for is out of reach
            raise ValueError(f"max ({self.max:g}) is below p90 ({self.p90:g}): over a tenth "
                             f"of the samples would be clipped to max, and the 90th "
                             f"percentile would be max, not p90")
        return self

    @property
    def sigma(self) -> float:
        """Log-space standard deviation."""
        return math.log(self.p90 / self.median) / Z90


class EmpiricalDist(_Dist):
    """``{dist: empirical, path, column}``: resample (with replacement) a CSV column;
    ``path`` is relative to the scenario file's folder. Token and turn counts are whole
    numbers from 1 to 1e9, seconds any number >= 0; ``min`` and ``max`` clip the tails and
    may not pass the column's median."""

    dist: Literal["empirical"]
    path: str = Field(json_schema_extra={"pattern": NONBLANK})
    column: str

    _named = field_validator("path")(nonempty_path)


Dist = Annotated[Union[FixedDist, UniformDist, NormalDist, LognormalDist, EmpiricalDist],
                 Field(discriminator="dist")]


# What a count key (tokens, turns) takes, as the JSON schema states it. Never built: the
# loader checks counts in :func:`length_bounds`, with messages naming the rule; these only
# narrow the schema's bounds so that an editor flags what the loader refuses. Rules across
# keys (min <= centre <= max, p90 >= median) stay the loader's alone.
class _CountClip(_Dist):
    min: Optional[float] = Field(None, ge=0, le=MAX_COUNT)
    max: Optional[float] = Field(None, ge=1, le=MAX_COUNT)   # below 1 it holds no count


class FixedCount(_CountClip, FixedDist):
    """``{dist: fixed, value}`` for a count: a whole ``value`` from 1 to 1e9."""

    value: int = Field(ge=1, le=MAX_COUNT)   # a whole number (3.0 is one to JSON Schema)


class UniformCount(UniformDist):
    """``{dist: uniform, min, max}`` for a count: integers in ``[min, max]`` inclusive,
    ``0 < min``, ``1 <= max <= 1e9``."""

    min: float = Field(gt=0, le=MAX_COUNT)   # a draw of 0 would become 1
    max: float = Field(ge=1, le=MAX_COUNT)


class NormalCount(_CountClip, NormalDist):
    """``{dist: normal, mean, std}`` for a count: rounded draws, ``mean`` from 1 to 1e9."""

    mean: float = Field(ge=1, le=MAX_COUNT)


class LognormalCount(_CountClip, LognormalDist):
    """``{dist: lognormal, median, p90}`` for a count: rounded draws, ``median`` from 1 to
    1e9."""

    median: float = Field(ge=1, le=MAX_COUNT)


class EmpiricalCount(_CountClip, EmpiricalDist):
    """``{dist: empirical, path, column}`` for a count: the column's values are whole
    numbers from 1 to 1e9 (checked when the file is read)."""


CountDist = Annotated[Union[FixedCount, UniformCount, NormalCount, LognormalCount,
                            EmpiricalCount], Field(discriminator="dist")]
# What the shorthands take, as the JSON schema states it: a plain count of turns, a plain
# number of seconds (:func:`_turns_as_fixed`, :func:`_number_as_fixed`).
Turns = Union[Annotated[int, Field(ge=1, le=MAX_COUNT)], CountDist]
Seconds = Union[Annotated[float, Field(ge=0)], Dist]


def _empirical_values(cfg: EmpiricalDist, base_dir, key: str, count: bool) -> np.ndarray:
    """The file's column as floats; ``count``: token or turn counts, each in [1, 1e9] (a
    trace's bounds), else seconds >= 0.

    Raises:
        InputError: a malformed file or value (file:line).
        KeyedInputError: ``<key>.path``, the file is missing.
    """
    path = scenario_path(cfg.path, base_dir)
    if not is_regular_file(path):   # keyed: the scenario gives the line of <key>.path
        raise KeyedInputError(f"{key}.path", f"{path}: {missing_file(path)} (empirical "
                              f"distribution)")
    df = read_csv_table(path)   # the trace reader's: lines, fields, UTF-8 checked alike
    if cfg.column not in df.columns:
        raise InputError(f"{path}:1: missing column {cfg.column!r} "
                         f"(columns are {', '.join(map(repr, df.columns))}; {key}.column "
                         f"names it)")
    col = df[cfg.column]
    num = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
    lo, hi = (1, MAX_COUNT) if count else (0, math.inf)
    bad = ~np.isfinite(num) | (num < lo) | (num > hi)
    if count:   # 1.5 tokens would be rounded silently (half to even: 2.5 is 2)
        bad |= np.isfinite(num) & (num != np.floor(num))
    if bad.any():
        i = int(np.argmax(bad))
        want = (f"a whole count from 1 to {MAX_COUNT:.0e}" if count
                else "a number of seconds >= 0")
        raise InputError(f"{path}:{col.index[i] + 2}: {cfg.column}: expected {want}, "
                         f"got {col.iloc[i]!r}")
    if len(num) == 0:
        raise InputError(f"{path}:2: column {cfg.column!r} has no values")
    try:   # as for the other distributions: clip bounds past the centre clip most samples
        _centre_inside(cfg, float(np.median(num)), f"median of column {cfg.column!r}")
    except ValueError as e:
        raise KeyedInputError(key, str(e)) from None
    return num


def _raw_samples(cfg, n: int, rng: np.random.Generator, base_dir, integer: bool,
                 key: str) -> np.ndarray:
    if isinstance(cfg, FixedDist):
        return np.full(n, cfg.value, dtype=float)
    if isinstance(cfg, UniformDist):
        if integer:   # length_bounds has checked that [min, max] holds an integer
            return rng.integers(math.ceil(cfg.min), math.floor(cfg.max) + 1,
                                size=n).astype(float)
        return rng.uniform(cfg.min, cfg.max, size=n)
    if isinstance(cfg, NormalDist):
        return rng.normal(cfg.mean, cfg.std, size=n)
    if isinstance(cfg, LognormalDist):
        return rng.lognormal(math.log(cfg.median), cfg.sigma, size=n)
    if isinstance(cfg, EmpiricalDist):
        return rng.choice(_empirical_values(cfg, base_dir, key, integer), size=n,
                          replace=True)
    raise TypeError(f"unknown distribution {cfg!r}")


def _below_one(dist: str, key: str, x: float) -> str:
    """The error for a count distribution's centre below 1 (:func:`length_bounds`)."""
    if dist == "fixed":
        return f"fixed value {x:g} is not a whole number >= 1 (a count of tokens or turns)"
    return (f"{dist} {key} {x:g} is below 1: most samples would be clipped to 1 (a count of "
            f"tokens or turns is >= 1)")


def _count_centre_first(v):
    """Before the schema: a count's centre (fixed value, normal mean, lognormal median)
    below 1 is refused with the count's bound (1), not the schema's ``>= 0`` / ``> 0``,
    which hold for times (``think_time_s``)."""
    key = {"fixed": "value", "normal": "mean", "lognormal": "median"}.get(
        v.get("dist")) if isinstance(v, dict) else None
    x = v.get(key) if key else None
    if isinstance(x, (int, float)) and not isinstance(x, bool) and x < 1:
        raise SubkeyError(key, _below_one(v["dist"], key, x))
    return v


def _turns_as_fixed(v):
    """Before the schema: a plain integer of turns ``n`` is ``{dist: fixed, value: n}``
    (as ``think_time_s`` takes a plain number), then :func:`_count_centre_first`."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 1 <= v <= MAX_COUNT:   # said here: after the conversion it would name ".value"
            raise ValueError(f"must be a whole number of turns from 1 to {MAX_COUNT:.0e} (or "
                             f"a distribution such as {{dist: uniform, min: 2, max: 6}}), "
                             f"got {v!r}")
        v = {"dist": "fixed", "value": v}
    elif not isinstance(v, dict):
        raise ValueError(f"expected a whole number of turns >= 1 or a distribution such as "
                         f"{{dist: uniform, min: 2, max: 6}}, got {v!r}")
    return _count_centre_first(v)


def _number_as_fixed(v):
    """Before the schema: a plain number of seconds ``x`` is ``{dist: fixed, value: x}``
    (``think_time_s: 0``); anything else but a mapping is refused with both forms."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not (math.isfinite(v) and v >= 0):   # said here: the schema would name ".value"
            raise ValueError(f"must be a finite number of seconds >= 0 (or a distribution "
                             f"such as {{dist: fixed, value: 0}}), got {v!r}")
        return {"dist": "fixed", "value": v}
    if not isinstance(v, dict):
        raise ValueError(f"expected a number of seconds >= 0 or a distribution such as "
                         f"{{dist: fixed, value: 0}} or {{dist: uniform, min: 1, max: 5}}, "
                         f"got {v!r}")
    return v


def length_bounds(dist_cfg) -> tuple[int, int | None]:
    """The integer range ``[lo, hi]`` that count samples (tokens, turns) are clipped to:
    ``lo = max(ceil(min), 1)``, ``hi = floor(max)`` (``None`` = open).

    Raises:
        ValueError: the bounds hold no integer >= 1 (a uniform ``[min, max]`` with no
            integer inside, or ``max`` below 1), a uniform ``min`` of 0 (its draws of 0
            would become 1), a fixed value that is not a whole number
            >= 1 (it would be rounded silently), a normal mean or lognormal median below 1
            (most samples clipped to 1); the message says which.
        SubkeyError: a centre (value, mean, median), ``min`` or ``max`` above
            :data:`MAX_COUNT` (tokens or turns), keyed by that field.
    """
    centre = {FixedDist: "value", UniformDist: "min", NormalDist: "mean",
              LognormalDist: "median"}.get(type(dist_cfg))
    # past int64 once drawn (uniform's max is drawn too); no model holds such a context
    for name in (centre, "min", "max"):   # a clip max past it bounds nothing a run holds
        v = getattr(dist_cfg, name, None) if name else None
        if v is not None and v > MAX_COUNT:   # in full: 1000000001 is no "1e+09 above 1e+09"
            shown = f"{int(v)}" if v == int(v) and v < 1e16 else repr(v)
            raise SubkeyError(name, f"{shown} is above {MAX_COUNT:.0e} (a count of tokens or "
                                    f"turns)")
    if isinstance(dist_cfg, FixedDist) and (dist_cfg.value < 1
                                            or dist_cfg.value != int(dist_cfg.value)):
        raise ValueError(_below_one("fixed", "value", dist_cfg.value))
    centre_value = getattr(dist_cfg, centre, None) if centre in ("mean", "median") else None
    if centre_value is not None and centre_value < 1:
        raise ValueError(_below_one(dist_cfg.dist, centre, centre_value))
    if isinstance(dist_cfg, UniformDist) and math.ceil(dist_cfg.min) < 1 <= dist_cfg.max:
        # min is a parameter here, not a clip bound: every 0 drawn would become 1
        raise ValueError(f"uniform min {dist_cfg.min:g} draws 0, which a count (>= 1) would "
                         f"turn into 1, doubling its share: give min >= 1 "
                         f"(uniform [1, {dist_cfg.max:g}])")
    if isinstance(dist_cfg, UniformDist) and math.floor(dist_cfg.max) < math.ceil(dist_cfg.min):
        raise ValueError(f"uniform [{dist_cfg.min:g}, {dist_cfg.max:g}] holds no integer "
                         f"(a count is a whole number: give min and max with an integer "
                         f">= 1 between them)")
    lo = max(1, math.ceil(dist_cfg.min)) if dist_cfg.min is not None else 1
    hi = math.floor(dist_cfg.max) if dist_cfg.max is not None else None
    if hi is not None and hi < lo:
        what = (f"max ({dist_cfg.max:g})" if dist_cfg.min is None or dist_cfg.min <= 1
                else f"[min, max] = [{dist_cfg.min:g}, {dist_cfg.max:g}]")
        raise ValueError(f"{what} holds no integer >= 1 (a count is a whole number >= 1)")
    return lo, hi


def sample_lengths(dist_cfg, n: int, rng: np.random.Generator, base_dir=".",
                   key: str = "lengths") -> np.ndarray:
    """Draw ``n`` token counts (or turn counts) from a distribution config.

    Samples are rounded to the nearest integer and clipped to :func:`length_bounds`
    (``[max(min, 1), max]``, ``min`` rounded up, ``max`` rounded down), so every value
    is >= 1.

    Args:
        dist_cfg: one of :class:`FixedDist`, :class:`UniformDist` (integers, inclusive),
            :class:`NormalDist`, :class:`LognormalDist`, :class:`EmpiricalDist`.
        n: number of samples.
        rng: the generator to draw from.
        base_dir: folder an empirical ``path`` is relative to.
        key: key path of ``dist_cfg`` in the scenario (``workload.output_tokens``), named
            by a bounds error and a missing empirical file.

    Returns:
        int64 array of shape ``(n,)``, tokens.

    Raises:
        InputError: empirical file malformed (naming the file and line).
        KeyedInputError: ``<key>.path``, the empirical file is missing; ``<key>``, bounds
            that hold no integer >= 1, or clip bounds past the empirical column's median;
            ``<key>.<value|mean|median|min|max>`` above 1e9.
    """
    try:
        lo, hi = length_bounds(dist_cfg)
    except SubkeyError as e:
        raise KeyedInputError(f"{key}.{e.key}", str(e)) from None
    except ValueError as e:
        raise KeyedInputError(key, str(e)) from None
    x = _raw_samples(dist_cfg, n, rng, base_dir, integer=True, key=key)
    # a long tail may still draw past int64; any draw past MAX_COUNT exceeds every context
    return np.clip(np.rint(x), lo, MAX_COUNT if hi is None else hi).astype(np.int64)


def sample_durations_ns(dist_cfg, n: int, rng: np.random.Generator, base_dir=".",
                        key: str = "think_time_s") -> np.ndarray:
    """Draw ``n`` durations given in seconds (think times), returned as int64 ns.

    Samples are clipped to ``[max(min, 0), max]`` seconds (uniform is continuous here) and
    rounded to the nearest ns.

    ``key``: key path of ``dist_cfg`` in the scenario, named when an empirical file is
    missing.

    Returns:
        int64 array of shape ``(n,)``, ns.

    Raises:
        InputError: empirical file malformed (naming the file and line).
        KeyedInputError: ``<key>.path``, the empirical file is missing; ``<key>``, a draw at
            or past :data:`MAX_TIME_NS` (4.6e9 s: past it the value in ns overflows int64,
            into garbage such as a negative think time).
    """
    x = _raw_samples(dist_cfg, n, rng, base_dir, integer=False, key=key)
    lo = max(0.0, dist_cfg.min) if dist_cfg.min is not None else 0.0
    x = np.clip(x, lo, dist_cfg.max)
    if n and not x.max() < MAX_TIME_NS / NS_PER_S:
        raise KeyedInputError(key, f"draws a think time of {x.max():.3g} s, past the "
                              f"{MAX_TIME_NS / NS_PER_S:.2g} s a run can hold (lower its "
                              f"max, or give one)")
    return np.rint(x * NS_PER_S).astype(np.int64)


# -- arrival processes -----------------------------------------------------------------

#: Highest request rate (req/s): arrivals are timed in integer nanoseconds, and past 1e9
#: req/s every gap rounds to 0.
MAX_RATE = 1_000_000_000


class _OpenLoop(BaseModel):
    model_config = STRICT_SCHEMA

    rate: float = Field(gt=0, le=MAX_RATE, allow_inf_nan=False,
                        description="mean request rate, requests/s (at most 1e9)")
    normalize_duration: bool = Field(
        False, description="scale all arrivals so the last one lands at num_requests/rate "
                           "(conversations/rate with sessions), as `vllm bench serve` does "
                           "when it has no ramp-up")


class PoissonArrival(_OpenLoop):
    """``{process: poisson, rate}``: exponential gaps with mean ``1/rate``."""

    process: Literal["poisson"]


class GammaArrival(_OpenLoop):
    """``{process: gamma, rate, burstiness}``: gaps ~ Gamma(shape k = burstiness,
    scale = 1/(rate·k)), mean ``1/rate``, CV ``1/sqrt(k)``; k = 1 is Poisson, k < 1 burstier,
    k > 1 smoother (vLLM ``vllm/benchmarks/serve.py`` ``get_request``)."""

    process: Literal["gamma"]
    burstiness: float = Field(1.0, gt=0)


class ConstantArrival(_OpenLoop):
    """``{process: constant, rate}``: gaps exactly ``1/rate`` (vLLM's burstiness = inf)."""

    process: Literal["constant"]


class ClosedLoopArrival(BaseModel):
    """``{process: closed_loop, concurrency, think_time_s, dispatch}``: ``concurrency``
    virtual users. ``dispatch: per_user`` (default): each user owns every
    ``concurrency``-th request and sends its next one ``think_time_s`` after its previous
    one finished. ``dispatch: first_free``: the requests go out in order, the next as soon
    as any of the ``concurrency`` in flight finishes (``vllm bench serve --request-rate inf
    --max-concurrency``: a semaphore around each request); no think time then.
    ``think_time_s`` is a distribution of seconds or a plain number ``x >= 0``, read as
    ``{dist: fixed, value: x}``; default 0."""

    model_config = STRICT_SCHEMA

    process: Literal["closed_loop"]
    concurrency: int = Field(ge=1, le=100_000_000)   # as max_concurrency and num_requests
    think_time_s: Dist = Field(default_factory=lambda: FixedDist(dist="fixed", value=0))
    dispatch: Literal["per_user", "first_free"] = "per_user"

    _think_number = field_validator("think_time_s", mode="before",
                                    json_schema_input_type=Seconds)(_number_as_fixed)

    @model_validator(mode="after")
    def _first_free_sends_at_once(self):
        t = self.think_time_s
        if self.dispatch == "first_free" and not (isinstance(t, FixedDist) and t.value == 0):
            raise SubkeyError("think_time_s", "must be 0 with dispatch: first_free (the "
                              "next request goes out as a slot frees, as vllm bench serve "
                              "--max-concurrency sends it); think times need dispatch: "
                              "per_user")
        return self


Arrival = Annotated[Union[PoissonArrival, GammaArrival, ConstantArrival, ClosedLoopArrival],
                    Field(discriminator="process")]


def check_arrival_span(cfg: "WorkloadConfig") -> None:
    """Refuse, before anything is drawn, an open-loop workload (no trace, no sessions)
    whose ``num_requests`` at ``arrival.rate`` span, on average, past the 4.6e9 s a run
    can hold (:data:`MAX_TIME_NS`); :func:`arrival_times_ns` checks the drawn times too.

    Raises:
        KeyedInputError: ``workload.arrival.rate``, with the message of
            :func:`arrival_times_ns`.
    """
    rate, n = getattr(cfg.arrival, "rate", None), cfg.num_requests
    if cfg.trace is None and cfg.sessions is None and rate and n \
            and not n / rate < MAX_TIME_NS / NS_PER_S:
        raise _span_error(rate, n)


def _span_error(rate: float, n: int) -> KeyedInputError:
    return KeyedInputError("workload.arrival.rate", f"{rate:g} req/s spreads {n} arrivals "
                           f"over more than the 4.6e9 s a run can hold",
                           depends=("workload.num_requests",))


def arrival_times_ns(arrival_cfg, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests of an open-loop process, in ns.

    Arrival ``i`` is the sum of the first ``i + 1`` gaps (the first request arrives one gap
    after 0, as in ``vllm bench serve``). With ``normalize_duration`` all times are scaled so
    the last arrival is exactly ``n / rate`` s (vLLM ``get_request``).

    Args:
        arrival_cfg: :class:`PoissonArrival`, :class:`GammaArrival` or
            :class:`ConstantArrival`.
        n: number of arrivals.
        rng: the generator to draw gaps from.

    Returns:
        int64 array of shape ``(n,)``, non-decreasing, ns.

    Raises:
        ValueError: a closed-loop config (it has no arrival times; requests follow finishes).
        TypeError: ``arrival_cfg`` of no arrival process above.
        KeyedInputError: ``workload.arrival.rate`` (req/s) so low that the arrivals pass
            the int64 ns clock's 4.6e9 s, or a gamma ``workload.arrival.burstiness`` so
            small that the gaps' scale overflows.
    """
    if isinstance(arrival_cfg, ClosedLoopArrival):
        raise ValueError("closed_loop arrivals follow request finishes; no times to draw")
    rate = arrival_cfg.rate
    with np.errstate(over="ignore"):   # a tiny rate overflows to inf: refused below
        if isinstance(arrival_cfg, PoissonArrival):
            gaps = rng.exponential(1.0 / rate, size=n)
        elif isinstance(arrival_cfg, GammaArrival):
            k = arrival_cfg.burstiness
            scale = (1.0 / rate) / k   # not 1 / (rate × k), which overflows to 0 for a huge k
            if not math.isfinite(scale):
                raise KeyedInputError("workload.arrival.burstiness", (
                    f"{k:g} is too small: the gaps' scale 1 / (rate × burstiness) overflows"))
            gaps = rng.gamma(shape=k, scale=scale, size=n)
        elif isinstance(arrival_cfg, ConstantArrival):
            gaps = np.full(n, 1.0 / rate)
        else:
            raise TypeError(f"unknown arrival process {arrival_cfg!r}")
        t = np.cumsum(gaps)
        if arrival_cfg.normalize_duration and n and t[-1] > 0:
            t *= (n / rate) / t[-1]
    if n and not t[-1] < MAX_TIME_NS / NS_PER_S:
        raise _span_error(rate, n)
    return np.rint(t * NS_PER_S).astype(np.int64)


# -- prefix and sessions ---------------------------------------------------------------

class PrefixConfig(BaseModel):
    """``workload.prefix``: shared prefixes (system prompt, document) in ``groups`` groups.

    Group ``g`` (0 = most popular) is picked with probability ∝ ``(g + 1)^-zipf_s``
    (``zipf``, a finite Zipf law) or ``1/groups`` (``uniform``).
    """

    model_config = STRICT_SCHEMA

    shared_tokens: int = Field(ge=1, le=MAX_COUNT)
    # each group's probability is tabulated (8 bytes each): 1e9 groups take minutes and GBs
    groups: int = Field(1, ge=1, le=1_000_000)
    popularity: Literal["zipf", "uniform"] = "zipf"
    zipf_s: float = Field(1.1, gt=0)

    def probabilities(self) -> np.ndarray:
        """Group probabilities, shape ``(groups,)``, summing to 1."""
        if self.popularity == "uniform":
            return np.full(self.groups, 1.0 / self.groups)
        w = np.arange(1, self.groups + 1, dtype=float) ** -self.zipf_s
        return w / w.sum()


class SessionConfig(BaseModel):
    """``workload.sessions``: multi-turn conversations.

    ``turns`` is drawn per conversation (integers >= 1; a plain integer ``n`` is ``{dist:
    fixed, value: n}``); ``think_time_s`` between a turn's
    finish and the next turn's arrival (seconds, may be fractional): a distribution or a
    plain number ``x >= 0``, read as ``{dist: fixed, value: x}``; default 0.
    """

    model_config = STRICT_SCHEMA

    turns: Dist
    think_time_s: Dist = Field(default_factory=lambda: FixedDist(dist="fixed", value=0))

    _turns_count = field_validator("turns", mode="before",
                                   json_schema_input_type=Turns)(_turns_as_fixed)
    _think_number = field_validator("think_time_s", mode="before",
                                    json_schema_input_type=Seconds)(_number_as_fixed)

    @field_validator("turns")
    @classmethod
    def _turns_hold_integers(cls, v):
        length_bounds(v)   # refused here, where the error names workload.sessions.turns
        return v


class WorkloadConfig(BaseModel):
    """``workload:`` section of a scenario.

    Either synthetic (``num_requests``, ``arrival``, ``prompt_tokens``, ``output_tokens``,
    optional ``prefix`` and ``sessions``) or a ``trace`` replay (optional ``prefix`` for
    traces without content, optional ``num_requests`` cap). Turns count as requests.
    """

    model_config = STRICT_SCHEMA

    # int64: a sweep over the seed keeps it in an int64 column, and engine seeds derive from it
    seed: int = Field(0, ge=0, le=2**63 - 1)
    num_requests: Optional[int] = Field(None, ge=1, le=100_000_000)  # run.BYTES_PER_REQUEST each
    arrival: Optional[Arrival] = None
    prompt_tokens: Optional[Dist] = None
    output_tokens: Optional[Dist] = None
    prefix: Optional[PrefixConfig] = None
    sessions: Optional[SessionConfig] = None
    trace: Optional[TraceConfig] = None
    max_concurrency: Optional[int] = Field(None, ge=1, le=100_000_000, description=(
        "most requests in flight at once, client side (vllm bench serve --max-concurrency): "
        "one that arrives while that many are in flight is held and sent when one "
        "finishes, and timed from then; not with sessions or a closed loop"))

    @model_validator(mode="before")
    @classmethod
    def _trace_alone(cls, raw):
        # Before the keys' own checks: --set workload.arrival.rate=5 beside a trace would
        # otherwise fail as "arrival: process: required key missing", hiding the conflict.
        # Only beside a trace that names its file: a trace mapping a flag made up
        # (--set workload.trace.time_scale=2) is reported as missing its path.
        trace = raw.get("trace") if isinstance(raw, dict) else None
        if isinstance(trace, dict) and {"path", "format"} <= trace.keys():
            given = [k for k in ("arrival", "prompt_tokens", "output_tokens", "sessions")
                     if raw.get(k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} not allowed with trace "
                                 "(the trace gives arrivals and lengths)")
        return raw

    @model_validator(mode="after")
    def _check(self) -> "WorkloadConfig":
        if self.trace is None:
            missing = [k for k in ("num_requests", "arrival", "prompt_tokens", "output_tokens")
                       if getattr(self, k) is None]
            if missing:
                raise ValueError(f"{', '.join(missing)} required (or give a trace)")
        else:
            if self.prefix is not None and self.trace.format == "mooncake":
                raise ValueError("prefix not allowed with a mooncake trace "
                                 "(its hash_ids give the prompt content)")
        if self.max_concurrency is not None and self.sessions is not None:
            raise SubkeyError("max_concurrency", "not allowed with sessions (a "
                              "conversation's load is judged from its turns' arrivals, "
                              "which a client-side limit would shift)")
        if isinstance(self.arrival, ClosedLoopArrival):
            if self.max_concurrency is not None:
                raise SubkeyError("max_concurrency", "not allowed with a closed_loop arrival, "
                                  "whose concurrency bounds the requests in flight")
            if self.arrival.dispatch == "first_free" and self.sessions is not None:
                raise SubkeyError("sessions", "not allowed with dispatch: first_free (a "
                                  "conversation's turns follow one user: dispatch: per_user)")
        return self

    @property
    def client_concurrency(self) -> int | None:
        """Most requests in flight, client side: ``max_concurrency``, or a ``first_free``
        closed loop's ``concurrency``; None when the client sends without limit."""
        arr = self.arrival
        if isinstance(arr, ClosedLoopArrival) and arr.dispatch == "first_free":
            return arr.concurrency
        return self.max_concurrency

    _lengths_count = field_validator("prompt_tokens", "output_tokens", mode="before",
                                     json_schema_input_type=Optional[CountDist])(
                                         _count_centre_first)

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _lengths_hold_integers(cls, v):
        # Refused at validation, where the error names the key path and line, rather
        # than when the workload is drawn.
        if v is not None:
            length_bounds(v)
        return v


# -- building the request list ---------------------------------------------------------

def _rngs(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(_PURPOSES))
    return {name: np.random.default_rng(c) for name, c in zip(_PURPOSES, children)}


def _first_prompt(rid: int, tokens: int, group: int | None, prefix: PrefixConfig | None,
                  whole: bool) -> tuple:
    """Prompt of a single request or a first turn.

    ``whole``: ``tokens`` counts the prefix too (single requests); else it is the new user
    tokens only (sessions).
    """
    if prefix is None:
        return ((("user", rid), tokens),)
    n = max(tokens - prefix.shared_tokens, 1) if whole else tokens
    return ((("prefix", group), prefix.shared_tokens), (("user", rid), n))


def _groups(cfg: WorkloadConfig, n: int, rng) -> np.ndarray | None:
    if cfg.prefix is None:
        return None
    return rng.choice(cfg.prefix.groups, size=n, p=cfg.prefix.probabilities())


def _session_plan(cfg: WorkloadConfig, n: int, rng, base_dir) -> np.ndarray:
    """Turns per session so that they sum to exactly ``n`` (last session truncated)."""
    turns = sample_lengths(cfg.sessions.turns, n, rng, base_dir,
                           "workload.sessions.turns")  # >= 1 each: n suffice
    ends = np.cumsum(turns)
    s = int(np.searchsorted(ends, n)) + 1
    turns = turns[:s].copy()
    turns[-1] -= int(ends[s - 1]) - n
    return turns


def _build_open_loop(cfg, r, base_dir) -> list[RequestSpec]:
    n = cfg.num_requests
    prompt_len = sample_lengths(cfg.prompt_tokens, n, r["prompt"], base_dir,
                                "workload.prompt_tokens")
    output_len = sample_lengths(cfg.output_tokens, n, r["output"], base_dir,
                                "workload.output_tokens")
    if cfg.sessions is None:
        groups = _groups(cfg, n, r["prefix"])
        arrivals = arrival_times_ns(cfg.arrival, n, r["arrival"])
        return [RequestSpec(request_id=i, arrival_ns=int(arrivals[i]),
                            prompt=_first_prompt(i, int(prompt_len[i]),
                                                 None if groups is None else int(groups[i]),
                                                 cfg.prefix, whole=True),
                            max_tokens=int(output_len[i]))
                for i in range(n)]

    turns = _session_plan(cfg, n, r["turns"], base_dir)
    s = len(turns)
    groups = _groups(cfg, s, r["prefix"])
    arrivals = arrival_times_ns(cfg.arrival, s, r["arrival"])
    think = sample_durations_ns(cfg.sessions.think_time_s, n, r["session_think"], base_dir,
                                "workload.sessions.think_time_s")
    specs, next_id = [], s
    for sid in range(s):
        prev = RequestSpec(
            request_id=sid, arrival_ns=int(arrivals[sid]),
            prompt=_first_prompt(sid, int(prompt_len[sid]),
                                 None if groups is None else int(groups[sid]),
                                 cfg.prefix, whole=False),
            max_tokens=int(output_len[sid]), session_id=sid)
        specs.append(prev)
        for _ in range(int(turns[sid]) - 1):
            rid = next_id
            next_id += 1
            prev = _next_turn(prev, rid, int(prompt_len[rid]), int(output_len[rid]),
                              int(think[rid]), sid)
            specs.append(prev)
    return specs


def _next_turn(prev: RequestSpec, rid: int, new_tokens: int, max_tokens: int,
               think_ns: int, session_id) -> RequestSpec:
    prompt = prev.prompt + ((prev.answer_content_id, prev.max_tokens),
                            (("user", rid), new_tokens))
    return RequestSpec(request_id=rid, arrival_ns=0, prompt=prompt, max_tokens=max_tokens,
                       session_id=session_id, after=prev.request_id, think_time_ns=think_ns)


def _build_closed_loop(cfg, r, base_dir) -> list[RequestSpec]:
    n = cfg.num_requests
    c = min(cfg.arrival.concurrency, n)
    prompt_len = sample_lengths(cfg.prompt_tokens, n, r["prompt"], base_dir,
                                "workload.prompt_tokens")
    output_len = sample_lengths(cfg.output_tokens, n, r["output"], base_dir,
                                "workload.output_tokens")
    loop_think = sample_durations_ns(cfg.arrival.think_time_s, n, r["loop_think"], base_dir,
                                     "workload.arrival.think_time_s")
    groups = _groups(cfg, n, r["prefix"])  # indexed by the request starting a chain/session
    g = (lambda j: None) if groups is None else (lambda j: int(groups[j]))
    specs: list[RequestSpec] = []
    if cfg.sessions is None:
        for j in range(n):
            prompt = _first_prompt(j, int(prompt_len[j]), g(j), cfg.prefix, whole=True)
            if j < c or cfg.arrival.dispatch == "first_free":   # all at 0: the gate sends them
                specs.append(RequestSpec(request_id=j, arrival_ns=0, prompt=prompt,
                                         max_tokens=int(output_len[j])))
            else:
                specs.append(RequestSpec(request_id=j, arrival_ns=0, prompt=prompt,
                                         max_tokens=int(output_len[j]), after=j - c,
                                         think_time_ns=int(loop_think[j])))
        return specs

    # Sessions run back to back per user; a new session waits the loop's think time, a
    # next turn the session's think time. Turn counts are taken in order of session start.
    turns = sample_lengths(cfg.sessions.turns, n, r["turns"], base_dir,
                           "workload.sessions.turns")
    sess_think = sample_durations_ns(cfg.sessions.think_time_s, n, r["session_think"],
                                     base_dir, "workload.sessions.think_time_s")
    left = [0] * c              # turns left in each user's current session
    last: list = [None] * c     # each user's previous request
    sid = -1
    for j in range(n):
        u = j % c
        if left[u] == 0:
            sid += 1
            left[u] = int(turns[sid])
            prompt = _first_prompt(j, int(prompt_len[j]), g(j), cfg.prefix, whole=False)
            spec = RequestSpec(
                request_id=j, arrival_ns=0, prompt=prompt, max_tokens=int(output_len[j]),
                session_id=sid, after=None if j < c else j - c,
                think_time_ns=0 if j < c else int(loop_think[j]))
        else:
            spec = _next_turn(last[u], j, int(prompt_len[j]), int(output_len[j]),
                              int(sess_think[j]), last[u].session_id)
        left[u] -= 1
        last[u] = spec
        specs.append(spec)
    return specs


def _build_trace(cfg, r, base_dir) -> list[RequestSpec]:
    table = load_trace(cfg.trace, base_dir, cfg.num_requests)
    groups = _groups(cfg, len(table), r["prefix"])
    return trace_specs(table, lambda i, p: _first_prompt(
        i, p, None if groups is None else int(groups[i]), cfg.prefix, whole=True))


#: Share of single requests whose drawn prompt a shared prefix swallows above which a run
#: warns (their prompts become the prefix and one token of their own).
PREFIX_SWALLOWS = 0.01


def prefix_warning(cfg: WorkloadConfig, base_dir=".") -> str | None:
    """Why ``workload.prefix`` reshapes the prompt lengths (None when it does not): for
    single requests and trace rows the prompt length counts the whole prompt, so one at or
    below ``shared_tokens`` becomes ``shared_tokens + 1`` tokens; said when more than
    :data:`PREFIX_SWALLOWS` of the prompts are (the run's own: same seed, same trace rows).

    Raises:
        InputError: an empirical length file or the trace missing or malformed (as the run
            would).
    """
    if cfg.prefix is None or cfg.sessions is not None:
        return None
    if cfg.trace is not None:
        lengths = load_trace(cfg.trace, base_dir, cfg.num_requests).prompt_tokens
        what, fix = (f"the trace's prompts ({cfg.trace.path})",
                     "lower shared_tokens: a trace's lengths are data")
    else:
        lengths = sample_lengths(cfg.prompt_tokens, cfg.num_requests,
                                 _rngs(cfg.seed)["prompt"], base_dir, "workload.prompt_tokens")
        what, fix = ("the prompt_tokens drawn",
                     "lower shared_tokens, or raise prompt_tokens to lengths that include it")
    shared = cfg.prefix.shared_tokens
    share = float(np.mean(np.asarray(lengths) <= shared))
    if share <= PREFIX_SWALLOWS:
        return None
    return (f"workload.prefix.shared_tokens ({shared}) is as long as the whole prompt or "
            f"longer in {share:.0%} of {what} (they count the prefix too): those prompts are "
            f"{shared + 1} tokens, the prefix and one of their own ({fix})")


#: Share of a count's draws that its implicit floor (1, when no ``min`` is given) may take
#: before a run warns: a normal or lognormal whose spread reaches below 1 piles that share
#: onto 1-token prompts or outputs (a 1-token output has no TPOT) or 1-turn conversations.
FLOOR_SHARE = 0.05


def floor_warnings(cfg: WorkloadConfig) -> list[str]:
    """Why a count distribution is not the one written: the share of a normal's or
    lognormal's draws that round below 1 and are raised to 1, said when above
    :data:`FLOOR_SHARE` and no ``min`` >= 1 makes the floor explicit. Exact, not sampled:
    ``P(X < 0.5)`` is ``Phi((0.5 - mean) / std)`` for a normal and
    ``Phi((ln 0.5 - ln median) / sigma)`` for a lognormal.
    """
    keys = [("prompt_tokens", cfg.prompt_tokens), ("output_tokens", cfg.output_tokens)]
    if cfg.sessions is not None:
        keys.append(("sessions.turns", cfg.sessions.turns))
    found = []
    for key, d in keys:
        if d is None or (d.min is not None and d.min >= 1):   # below 1, the floor stays 1
            continue
        if isinstance(d, NormalDist) and d.std > 0:
            z = (0.5 - d.mean) / d.std
        elif isinstance(d, LognormalDist) and d.sigma > 0:
            z = (math.log(0.5) - math.log(d.median)) / d.sigma
        else:
            continue
        share = 0.5 * (1 + math.erf(z / math.sqrt(2)))
        if share > FLOOR_SHARE:
            what = "turn" if key == "sessions.turns" else "token"
            found.append(f"workload.{key}: {share:.0%} of its draws fall below 1 and are "
                         f"raised to 1 {what}, a spike the distribution written does not "
                         f"have (narrow it, or give min to make the floor explicit)")
    return found


#: How far the drawn arrivals' span may lie from num_requests / rate (a factor) before a run
#: warns that its offered rate is not the rate asked for.
SPAN_FACTOR = 2.0


def arrival_warning(cfg: WorkloadConfig) -> str | None:
    """Why the open-loop arrivals drawn do not offer ``rate`` (None when they do): their
    span, ``num_requests / rate`` in expectation, lies more than :data:`SPAN_FACTOR` from
    it — a gamma process with a tiny ``burstiness`` (gaps' CV ``1/sqrt(burstiness)``) puts
    most requests in a few bursts, or all at 0 s once its gaps underflow. The ratio does
    not depend on ``rate`` (every gap scales with ``1/rate``), so it holds for every rate a
    sweep or plan tries. Checked from 10 requests on (single requests, not sessions).
    """
    arr = cfg.arrival
    if (cfg.trace is not None or cfg.sessions is not None
            or isinstance(arr, ClosedLoopArrival) or (cfg.num_requests or 0) < 10):
        return None
    n = cfg.num_requests
    # the run's own draws, before normalize_duration forces their span to n / rate
    raw = arr.model_copy(update={"normalize_duration": False})
    t = arrival_times_ns(raw, n, _rngs(cfg.seed)["arrival"])
    want = n / arr.rate
    span = float(t[-1]) / NS_PER_S
    if want / SPAN_FACTOR <= span <= want * SPAN_FACTOR:
        return None
    why = (f" (gamma burstiness {arr.burstiness:g}: its gaps' coefficient of variation is "
           f"{1 / math.sqrt(arr.burstiness):.3g})" if isinstance(arr, GammaArrival) else "")
    drawn = f"workload.arrival: the {n} arrivals drawn span {span:.3g} s against " \
            f"num_requests / rate = {want:.3g} s{why}"
    if arr.normalize_duration and span > 0:   # a few long gaps make the span: bursts remain
        return (f"{drawn}; normalize_duration stretches them to {want:.3g} s, but a few gaps "
                f"make up most of it, so the requests come in a few bursts (raise burstiness)")
    fix = ("normalize_duration cannot stretch a span of 0 s: raise burstiness"
           if span == 0 and arr.normalize_duration else "raise burstiness" if span == 0
           else "set normalize_duration: true to rescale them as vllm bench serve does, or "
                "raise burstiness")
    offers = (f"{want / span:.3g} × its rate ({n / span:.3g} req/s at {arr.rate:g})"
              if span > 0 else "every request at once")
    return f"{drawn}, so the run offers {offers} ({fix})"


def workload_warnings(cfg: WorkloadConfig, base_dir=".") -> list[str]:
    """What in the workload may not be what its author meant, said after the runs: a
    shared prefix that swallows prompts (:func:`prefix_warning`), arrivals that do not offer
    their rate (:func:`arrival_warning`), counts piled onto 1 (:func:`floor_warnings`), a
    closed loop with more users than requests, trace arrivals that replay as bursts
    (:func:`simulator.traces.ties_warning`).

    Raises:
        InputError: a length or trace file missing or malformed (as the run would).
    """
    found = [prefix_warning(cfg, base_dir), arrival_warning(cfg), *floor_warnings(cfg)]
    arr = cfg.arrival
    if (cfg.trace is None and isinstance(arr, ClosedLoopArrival) and cfg.num_requests
            and arr.concurrency > cfg.num_requests):   # users past n never send
        found.append(f"workload.arrival.concurrency ({arr.concurrency}) is above "
                     f"num_requests ({cfg.num_requests}): only {cfg.num_requests} users "
                     f"send, one request each, all at 0 s")
    if cfg.trace is not None:
        found.append(ties_warning(cfg.trace, base_dir, cfg.num_requests))
    return [w for w in found if w]


def build_workload(cfg: WorkloadConfig, base_dir=".") -> list[RequestSpec]:
    """Build the request list of a workload.

    Args:
        cfg: the ``workload:`` section.
        base_dir: folder that relative paths (trace, empirical CSV) are relative to;
            normally the scenario file's folder.

    Returns:
        ``list[RequestSpec]`` of ``cfg.num_requests`` requests (all trace requests if no
        cap), sorted by ``(arrival_ns, request_id)``; see the module docstring for content
        ids, request ids and follow-up links.

    Raises:
        InputError: trace or empirical file missing or malformed, a trace window keeping no
            request, length bounds holding no integer >= 1.
        KeyedInputError: a think time key whose draws, alone or added up along one
            user's requests, pass the 4.6e9 s a run can hold; ``workload.arrival.rate``
            whose arrivals do (:func:`check_arrival_span`).
    """
    check_arrival_span(cfg)   # before a hundred million lengths are drawn for nothing
    r = _rngs(cfg.seed)
    if cfg.trace is not None:
        specs = _build_trace(cfg, r, base_dir)
    elif isinstance(cfg.arrival, ClosedLoopArrival):
        specs = _build_closed_loop(cfg, r, base_dir)
    else:
        specs = _build_open_loop(cfg, r, base_dir)
    if cfg.trace is None and (cfg.sessions is not None
                              or isinstance(cfg.arrival, ClosedLoopArrival)):
        _check_chains(specs)
    specs.sort(key=lambda s: (s.arrival_ns, s.request_id))
    return specs


def _check_chains(specs: list[RequestSpec]) -> None:
    """Refuse think times that add up, along one user's requests, past the time a run can
    hold (:data:`MAX_TIME_NS`): a follow-up arrives no earlier than its chain's first
    arrival plus every think time before it. ``specs`` in any order; a follow-up's id is
    above that of the request it follows.

    Raises:
        KeyedInputError: the think time key that added the most to the longest chain.
    """
    # id -> (earliest arrival, loop think, session think, session id)
    earliest: dict[int, tuple] = {}
    for s in sorted(specs, key=lambda s: s.request_id):
        if s.after is None:
            earliest[s.request_id] = (s.arrival_ns, 0, 0, s.session_id)
            continue
        t, loop, sess, sid = earliest[s.after]
        if s.session_id is not None and sid == s.session_id:
            sess += s.think_time_ns
        else:
            loop += s.think_time_ns
        earliest[s.request_id] = (t + s.think_time_ns, loop, sess, s.session_id)
    if not earliest:
        return
    t, loop, sess, _ = max(earliest.values(), key=lambda e: e[0])
    if t >= MAX_TIME_NS:
        key = ("workload.sessions.think_time_s" if sess >= loop
               else "workload.arrival.think_time_s")
        raise KeyedInputError(key, f"think times add up to {t / NS_PER_S:.3g} s along one "
                              f"user's requests, past the {MAX_TIME_NS / NS_PER_S:.2g} s a "
                              f"run can hold", depends=("workload.num_requests",))
