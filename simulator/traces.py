"""Readers for public LLM serving traces: arrivals and lengths, plus prefix content if any.

Formats (``TraceConfig.format``):

* ``azure`` — Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024):
  CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``, wall-clock timestamps such as
  ``2023-11-16 18:15:46.6805900`` (parsed by pandas at ns resolution).
* ``mooncake`` — Mooncake FAST'25 trace release: JSON lines with ``timestamp`` (ms from the
  start), ``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token prompt
  block; equal ids mean equal prefixes up to and including that block).
* ``csv`` / ``jsonl`` — any table with a ``columns`` mapping for arrival, prompt and output
  tokens and an ``arrival_unit`` (``s``, ``ms``, ``us`` or ``iso`` timestamps).

A trace lists its requests in arrival order (equal timestamps allowed); a timestamp
earlier than the one before it is refused with its line, since a shuffled file or a wrong
arrival column would otherwise replay silently as some other traffic. Every trace is
re-based so its first arrival is at 0, its ties spread if ``spread_ties`` asks (a trace
stamped at a coarse resolution), then multiplied by ``time_scale``, then cut to
``window_s = [start, end)`` (arrival becomes ``t - start``) and to the first
``num_requests`` requests. Request ids are ``0..N-1`` in file order.

Content: Mooncake blocks become segments ``(("mc", hash_id), 512)`` (the last one shorter),
so prefix reuse follows the trace; traces without content give every request a unique
prompt segment ``(("user", request_id), prompt_tokens)``.

Bad files raise :class:`simulator.errors.InputError` with ``file:line: what is wrong``; a
missing file, a time_scale past what int64 ns hold and a window that keeps no request raise
:class:`simulator.errors.KeyedInputError` naming their ``workload.trace`` key.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import STRICT_SCHEMA, InputError, KeyedInputError
from .files import (DuplicateKeyError, is_regular_file, load_json, missing_file, read_csv_rows,
                    scenario_path, utf8_problem)
from .policy.request import MAX_COUNT, MAX_TIME_NS, NS_PER_S, RequestSpec

#: Tokens per Mooncake ``hash_ids`` block (Mooncake FAST'25 trace README).
MOONCAKE_BLOCK_TOKENS = 512

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_UNIT_NS = {"s": NS_PER_S, "ms": 1_000_000, "us": 1_000}


#: What a name or path holds, as the JSON schema says it: a character that is not a space
#: (:func:`nonempty_path`).
NONBLANK = r"\S"


def nonempty_path(v: str) -> str:
    """``v`` unless blank: ``''`` resolved to the scenario's own folder ("is a folder").

    Raises:
        ValueError: ``v`` is blank (pydantic names the field).
    """
    if not v.strip():
        raise ValueError("empty: give the file, relative to the scenario's folder")
    return v


class TraceColumns(BaseModel):
    """Column (CSV) or key (JSONL) names of a generic trace."""

    model_config = ConfigDict(extra="forbid")

    arrival: str = Field(description="arrival time column")
    prompt_tokens: str = Field(description="prompt length column (tokens)")
    output_tokens: str = Field(description="output length column (tokens)")

    @model_validator(mode="after")
    def _distinct(self):
        # one column used as both arrival and a length would serve each request with its
        # arrival time as its token count
        named: dict[str, str] = {}
        for field, column in self:
            if column in named:
                raise ValueError(f"{named[column]} and {field} both name column {column!r}: "
                                 f"each reads a column of its own")
            named[column] = field
        return self


class TraceConfig(BaseModel):
    """``workload.trace``: replay a recorded trace instead of synthetic arrivals/lengths.

    Attributes:
        path: trace file, relative to the scenario file's folder.
        format: ``azure`` | ``mooncake`` | ``csv`` | ``jsonl``.
        columns: column mapping; required for ``csv``/``jsonl``, not allowed otherwise.
        arrival_unit: ``s`` | ``ms`` | ``us`` | ``iso`` for ``csv``/``jsonl`` (default ``s``);
            fixed by the format for ``azure`` (timestamps) and ``mooncake`` (ms).
        time_scale: multiplies every (re-based) arrival time; 0.5 replays twice as fast.
        window_s: keep arrivals in ``[start, end)`` seconds after scaling; arrival
            becomes ``t - start``.
        spread_ties: spread requests sharing a timestamp over one timestamp step
            (:func:`spread_ties`), before ``time_scale``; default off (replayed as one burst).
    """

    # Strict like the rest of the scenario ("1" and true are not numbers). The schema states
    # _check's rule: columns (and arrival_unit) belong to the generic formats alone.
    model_config = ConfigDict(**STRICT_SCHEMA, json_schema_extra={
        "if": {"properties": {"format": {"enum": ["csv", "jsonl"]}}},
        "then": {"required": ["columns"], "properties": {"columns": {"type": "object"}}},
        "else": {"properties": {"columns": {"type": "null"},
                                "arrival_unit": {"type": "null"}}}})

    path: str = Field(json_schema_extra={"pattern": NONBLANK})
    format: Literal["azure", "mooncake", "csv", "jsonl"]
    columns: Optional[TraceColumns] = None
    arrival_unit: Optional[Literal["s", "ms", "us", "iso"]] = None
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    window_s: Optional[tuple[float, float]] = None
    spread_ties: bool = Field(False, description=(
        "spread requests that share a timestamp evenly over one timestamp step (for traces "
        "stamped at a coarse resolution, such as Mooncake's 3 s steps)"))

    _named = field_validator("path")(nonempty_path)

    @field_validator("window_s", mode="before", json_schema_input_type=Optional[tuple[
        Annotated[float, Field(ge=0)], Annotated[float, Field(gt=0)]]])
    @classmethod
    def _yaml_list(cls, v):
        # Said here: pydantic's tuple errors read "window_s.1: required key missing".
        if v is None:   # no window, as when absent (--set workload.trace.window_s=null)
            return None
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError(f"must be a [start, end] pair of seconds (arrivals kept "
                             f"in [start, end)), got {v!r}")
        if any(isinstance(x, float) and not math.isfinite(x) for x in v):
            raise ValueError(f"start and end must be finite numbers of seconds, got "
                             f"{list(v)}")
        return tuple(v)   # YAML has lists, not tuples

    @field_validator("window_s")
    @classmethod
    def _ordered(cls, v):
        # A field check, so the error names trace.window_s rather than trace.
        if v is not None and not (0 <= v[0] < v[1]):
            raise ValueError(f"must be [start, end) with 0 <= start < end, got "
                             f"[{v[0]:g}, {v[1]:g}]")
        return v

    @model_validator(mode="after")
    def _check(self) -> "TraceConfig":
        generic = self.format in ("csv", "jsonl")
        if generic and self.columns is None:
            raise ValueError(f"columns is required for format {self.format} "
                             "({arrival: ..., prompt_tokens: ..., output_tokens: ...})")
        if not generic and self.columns is not None:
            raise ValueError(f"columns is only allowed for format csv or jsonl, "
                             f"not {self.format}")
        if not generic and self.arrival_unit is not None:
            raise ValueError(f"arrival_unit is only allowed for format csv or jsonl "
                             f"({self.format} fixes its own time unit)")
        return self


@dataclass
class TraceTable:
    """A trace after re-basing, scaling, windowing, sorting and truncation.

    Attributes:
        arrival_ns: int64 array (N,), arrival times in ns, non-decreasing (from 0 once
            :func:`load_trace` has re-based them).
        prompt_tokens: int64 array (N,), prompt lengths (>= 1).
        output_tokens: int64 array (N,), output lengths (>= 1).
        hash_ids: per request the list of 512-token block ids (Mooncake), else ``None``.
        source: the file read.
    """

    arrival_ns: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: Optional[list] = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival_ns)


# -- parsing helpers ------------------------------------------------------------------

def _resolve(path: str, base_dir) -> Path:
    """``path`` (relative to ``base_dir``), relative to the current folder when it lies
    below it: errors then name it as the user would type it (``bad.csv:3``)."""
    p = scenario_path(path, base_dir)
    try:
        return p.relative_to(Path.cwd()) if p.is_absolute() else p
    except (ValueError, OSError):   # outside the current folder, or that folder is gone
        return p


def _read_csv(path: Path) -> pd.DataFrame:
    _require_file(path)
    return read_csv_table(path)


def read_csv_table(path: Path) -> pd.DataFrame:
    """A CSV file with a header line, all cells as strings (empty = missing), blank lines
    dropped with the index kept: row label ``i`` is line ``i + 2`` of the file.

    Raises:
        InputError: ``<path>:<line>: ...`` for an empty file, a row with another number of
            fields than the header, a quote never closed (as :func:`~simulator.files.
            read_csv_rows`), a column named twice in the header, or bytes that are not UTF-8
            (a byte-order mark is fine); ``<path>: cannot read: ...`` for a file
            the process may not read.
    """
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}:1: empty file (expected a header line)") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
        if m:
            raise InputError(f"{path}:{m.group(2)}: expected {m.group(1)} fields, "
                             f"saw {m.group(3)}") from None
        read_csv_rows(path)   # a quote never closed, text after one: named at its line
        raise InputError(f"{path}: not a valid CSV file ({str(e).splitlines()[-1]})") from None
    except UnicodeDecodeError:
        raise InputError(utf8_problem(path)) from None
    except OSError as e:   # no permission to read it (its existence was checked)
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if not isinstance(df.index, pd.RangeIndex):
        # pandas takes surplus fields of the first row as an index rather than failing
        n = len(df.columns)
        raise InputError(f"{path}:2: expected {n} fields, saw {n + df.index.nlevels}")
    header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
    names = header.iloc[0].tolist()
    dup = next((c for i, c in enumerate(names) if c in names[:i]), None)
    if dup is not None:   # pandas would rename the second one silently ("t.1")
        raise InputError(f"{path}:1: column {dup!r} appears twice in the header")
    blank = (df.apply(lambda col: col.str.strip()) == "").all(axis=1)   # spaces: as blank
    if blank.any() and len(df.columns) > 1:
        # a blank line is skipped; a line of separators only (",,") is a row without values
        lines = re.split(r"\r\n|\r|\n", path.read_text(encoding="utf-8-sig"))
        bad = next((i for i in df.index[blank] if lines[i + 1].strip()), None)
        if bad is not None:
            raise InputError(f"{path}:{bad + 2}: every field is empty (give the row's values, "
                             f"or leave the line blank)")
    return df[~blank]


def _require_file(path: Path) -> None:
    if not is_regular_file(path):
        raise KeyedInputError("workload.trace.path", f"{path}: {missing_file(path)}")


def _require_columns(df: pd.DataFrame, path: Path, names, why: str) -> None:
    """Raises InputError naming the first of ``names`` missing from the header, the
    header's columns, and ``why`` they are needed (the format or key that names them)."""
    for name in names:
        if name not in df.columns:
            raise InputError(f"{path}:1: missing column {name!r} "
                             f"(columns are {', '.join(map(repr, df.columns))}; {why})")


def _numbers(values: pd.Series, lines: np.ndarray, path: Path, name: str, *,
             integer: bool, minimum: float) -> np.ndarray:
    """Parse a column of strings; the first bad row raises InputError naming its line,
    e.g. ``trace.csv:7: prompt_tokens: 0 is below 1 (a length must be >= 1)``.
    ``integer`` columns are lengths (tokens), the others arrival times."""
    num = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(num)
    if bad.any():
        i = int(np.argmax(bad))
        raw = values.iloc[i]
        what = ("missing value" if str(raw).strip() == "" else
                f"not a finite number: {raw!r}" if not np.isnan(num[i]) else  # inf, 1e400
                f"not a number: {raw!r}")
        raise InputError(f"{path}:{lines[i]}: {name}: {what}")
    if integer:
        frac = num != np.floor(num)
        if frac.any():
            i = int(np.argmax(frac))
            raise InputError(f"{path}:{lines[i]}: {name}: not an integer: {values.iloc[i]!r}")
    high = num > MAX_COUNT if integer else np.zeros(num.shape, bool)
    if high.any():   # past int64 once cast; no model holds such a context
        i = int(np.argmax(high))
        raise InputError(f"{path}:{lines[i]}: {name}: {str(values.iloc[i]).strip()} is above "
                         f"{MAX_COUNT:.0e} (a count of tokens)")
    low = num < minimum
    if low.any():
        i = int(np.argmax(low))
        what = "a length" if integer else "an arrival time"
        raise InputError(f"{path}:{lines[i]}: {name}: {str(values.iloc[i]).strip()} is below "
                         f"{minimum:g} ({what} must be >= {minimum:g})")
    return num


#: An ISO 8601 time zone at the end of a timestamp (``Z``, ``+02:00``, ``-0500``, ``+01``).
_ZONE = re.compile(r"(?:Z|[+-]\d\d(?::?\d\d)?)$", re.IGNORECASE)


def _timestamps_ns(values: pd.Series, lines: np.ndarray, path: Path, name: str) -> np.ndarray:
    try:
        ts = pd.to_datetime(values, format="ISO8601", errors="coerce")
    except ValueError:   # pandas: "Mixed timezones detected"
        # Offsets that differ are one clock in UTC; a timestamp without a zone among ones
        # with a zone is not on a known clock. A row that is no timestamp at all is said
        # so below, when it comes first.
        ts = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
        ok = ~ts.isna().to_numpy()
        zoned = values.astype(str).str.strip().str.contains(_ZONE).to_numpy()
        first = int(np.argmax(ok))
        mixed = ok & (zoned != zoned[first])
        if mixed.any() and ok[:int(np.argmax(mixed))].all():
            i = int(np.argmax(mixed))
            raise InputError(f"{path}:{lines[i]}: {name}: {values.iloc[i]!r} has "
                             f"{'a' if zoned[i] else 'no'} time zone and the one on line "
                             f"{lines[first]} has {'one' if zoned[first] else 'none'}: give "
                             f"every timestamp a zone (Z, +02:00) or none") from None
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raw = values.iloc[i]
        what = "missing value" if str(raw).strip() == "" else f"not a timestamp: {raw!r}"
        raise InputError(f"{path}:{lines[i]}: {name}: {what}")
    # pandas may infer us resolution when no value has sub-us digits; ask for ns.
    return ts.dt.as_unit("ns").astype("int64").to_numpy()


def _arrivals_ns(values: pd.Series, lines, path: Path, name: str, unit: str) -> np.ndarray:
    """Arrival times in ns, in file order; the first one earlier than its predecessor
    raises InputError naming its line."""
    if unit == "iso":
        ns = _timestamps_ns(values, lines, path, name)
    else:
        num = _numbers(values, lines, path, name, integer=False, minimum=0)
        with np.errstate(over="ignore"):   # 1e300 s is inf ns: beyond, said below
            over = np.flatnonzero(num * _UNIT_NS[unit] >= MAX_TIME_NS)
        if over.size:
            i = int(over[0])
            raise InputError(f"{path}:{lines[i]}: {name}: {values.iloc[i]!r} {unit} is beyond "
                             f"the 4.6e9 s a run can hold")
        ns = np.rint(num * _UNIT_NS[unit]).astype(np.int64)
    back = np.flatnonzero(np.diff(ns) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise InputError(f"{path}:{lines[i]}: {name}: {values.iloc[i]!r} is earlier than "
                         f"{values.iloc[i - 1]!r} on line {lines[i - 1]} (a trace lists "
                         f"requests in arrival order; sort the file by {name})")
    return ns


def _table_from_frame(df: pd.DataFrame, path: Path, arrival: str, prompt: str, output: str,
                      unit: str) -> TraceTable:
    lines = df.index.to_numpy() + 2  # header is line 1
    return TraceTable(
        arrival_ns=_arrivals_ns(df[arrival], lines, path, arrival, unit),
        prompt_tokens=_numbers(df[prompt], lines, path, prompt, integer=True,
                               minimum=1).astype(np.int64),
        output_tokens=_numbers(df[output], lines, path, output, integer=True,
                               minimum=1).astype(np.int64),
        source=str(path))


def _read_jsonl(path: Path, fmt: str) -> tuple[list[dict], list[int]]:
    """Parsed objects and their 1-based line numbers; blank lines skipped (``fmt``: the
    trace format, named when the file is not JSON lines)."""
    _require_file(path)
    rows, lines = [], []
    try:
        # utf-8-sig: a byte-order mark (as some Windows editors write) is not JSON's
        with open(path, encoding="utf-8-sig") as f:
            for lineno, text in enumerate(f, start=1):
                text = text.rstrip("\r\n")   # else a cut line's error is on "line 2"
                if not text.strip():
                    continue
                try:
                    obj = load_json(text)
                except DuplicateKeyError as e:   # json would keep the last value silently
                    raise InputError(f"{path}:{lineno}: key {e.key!r} given twice in one "
                                     f"object") from None
                except json.JSONDecodeError as e:
                    where = ("the end of the line: is it cut short?" if e.pos >= len(text)
                             else f"column {e.colno}")
                    raise InputError(f"{path}:{lineno}: bad JSON ({e.msg} at {where}; "
                                     f"workload.trace.format {fmt} reads one JSON object "
                                     f"per line)") from None
                except ValueError:   # an integer past Python's 4300 digits
                    raise InputError(f"{path}:{lineno}: a number with more digits than any "
                                     f"count or time needs") from None
                if not isinstance(obj, dict):
                    raise InputError(f"{path}:{lineno}: expected a JSON object, got "
                                     f"{type(obj).__name__}")
                rows.append(obj)
                lines.append(lineno)
    except UnicodeDecodeError:
        raise InputError(utf8_problem(path)) from None
    except OSError as e:   # no permission to read it (its existence was checked)
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if not rows:
        raise InputError(f"{path}:1: empty file (expected one JSON object per line)")
    return rows, lines


def _json_column(rows, lines, path: Path, key: str, *, text: bool = False) -> pd.Series:
    """One key of every object, as strings for :func:`_numbers` / :func:`_timestamps_ns`.
    JSON has numbers: a number written as a string (``"10"``) is refused, as the strict
    scenario does, unless ``text`` (ISO timestamps are strings)."""
    out = []
    for obj, lineno in zip(rows, lines):
        if key not in obj:
            raise InputError(f"{path}:{lineno}: missing key {key!r}")
        v = obj[key]
        if v is None:
            v = ""  # null reads as a missing value
        elif isinstance(v, bool) or not isinstance(v, (str, int, float) if text
                                                   else (int, float)):
            what = "a string" if text else "a number"
            raise InputError(f"{path}:{lineno}: {key}: expected {what}, got {json.dumps(v)}")
        elif isinstance(v, float) and not math.isfinite(v):   # NaN, Infinity, 1e400
            raise InputError(f"{path}:{lineno}: {key}: expected a finite number, got {v} "
                             f"(JSON's NaN or Infinity, or a number past 1.8e308)")
        out.append(str(v))
    return pd.Series(out, dtype=str)


def _read_azure(path: Path) -> TraceTable:
    df = _read_csv(path)
    _require_columns(df, path, _AZURE_COLUMNS, "workload.trace.format azure reads "
                     + ", ".join(_AZURE_COLUMNS))
    return _table_from_frame(df, path, *_AZURE_COLUMNS, unit="iso")


def _read_generic_csv(path: Path, cfg: TraceConfig) -> TraceTable:
    c = cfg.columns
    df = _read_csv(path)
    _require_columns(df, path, (c.arrival, c.prompt_tokens, c.output_tokens),
                     "workload.trace.columns names them")
    return _table_from_frame(df, path, c.arrival, c.prompt_tokens, c.output_tokens,
                             unit=cfg.arrival_unit or "s")


def _read_generic_jsonl(path: Path, cfg: TraceConfig) -> TraceTable:
    c = cfg.columns
    rows, lines = _read_jsonl(path, "jsonl")
    ln = np.asarray(lines)
    unit = cfg.arrival_unit or "s"
    cols = {k: _json_column(rows, lines, path, k, text=unit == "iso" and k == c.arrival)
            for k in (c.arrival, c.prompt_tokens, c.output_tokens)}
    return TraceTable(
        arrival_ns=_arrivals_ns(cols[c.arrival], ln, path, c.arrival, unit),
        prompt_tokens=_numbers(cols[c.prompt_tokens], ln, path, c.prompt_tokens,
                               integer=True, minimum=1).astype(np.int64),
        output_tokens=_numbers(cols[c.output_tokens], ln, path, c.output_tokens,
                               integer=True, minimum=1).astype(np.int64),
        source=str(path))


def _read_mooncake(path: Path) -> TraceTable:
    rows, lines = _read_jsonl(path, "mooncake")
    ln = np.asarray(lines)
    cols = {k: _json_column(rows, lines, path, k) for k in _MOONCAKE_KEYS}
    table = TraceTable(
        arrival_ns=_arrivals_ns(cols["timestamp"], ln, path, "timestamp", "ms"),
        prompt_tokens=_numbers(cols["input_length"], ln, path, "input_length",
                               integer=True, minimum=1).astype(np.int64),
        output_tokens=_numbers(cols["output_length"], ln, path, "output_length",
                               integer=True, minimum=1).astype(np.int64),
        source=str(path))
    hash_ids = []
    for obj, lineno, n in zip(rows, lines, table.prompt_tokens):
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise InputError(f"{path}:{lineno}: hash_ids: expected a list of integers")
        want = math.ceil(int(n) / MOONCAKE_BLOCK_TOKENS)
        if len(ids) != want:
            raise InputError(f"{path}:{lineno}: hash_ids has {len(ids)} ids but "
                             f"input_length {int(n)} needs ceil({int(n)}/"
                             f"{MOONCAKE_BLOCK_TOKENS}) = {want}")
        hash_ids.append(ids)
    table.hash_ids = hash_ids
    return table


# -- public API -----------------------------------------------------------------------

def timestamp_step_ns(t: np.ndarray) -> int:
    """A trace's timestamp step: the median gap between its distinct arrival times (ns),
    0 with fewer than two."""
    u = np.unique(t)
    return int(np.median(np.diff(u))) if len(u) > 1 else 0


def spread_ties(t: np.ndarray) -> np.ndarray:
    """Arrivals ``t`` (int64 ns, non-decreasing) with each group of equal timestamps spread
    evenly over one timestamp step (:func:`timestamp_step_ns`), never reaching the next
    timestamp: the ``k``-th of ``n`` requests stamped ``t0`` arrives at ``t0 + k·w/n``, ``w``
    the smaller of the step and the gap to the next timestamp (the step for the last). For
    a trace logged at a coarse resolution (Mooncake's conversation trace stamps arrivals in
    3 s steps), where the requests of one step did not arrive at once. Returns a new array."""
    u, first, counts = np.unique(t, return_index=True, return_counts=True)
    step = timestamp_step_ns(t)
    if step == 0 or counts.max() == 1:
        return t.copy()
    width = np.minimum(np.append(np.diff(u), step), step)
    rank = np.arange(len(t)) - np.repeat(first, counts)
    # floor(rank·width / n) without the product, which can pass int64 for long steps
    return t + (np.repeat(width // counts, counts) * rank
                + np.repeat(width % counts, counts) * rank // np.repeat(counts, counts))


#: Share of a trace's arrivals that share their timestamp with another above which a run
#: says they replay as bursts (:func:`ties_warning`).
TIES_SHARE = 0.1


def ties_warning(trace_cfg: TraceConfig, base_dir=".", num_requests: int | None = None
                 ) -> str | None:
    """Why a trace's arrivals may replay burstier than they came (None when they do not):
    more than :data:`TIES_SHARE` of the requests replayed share their timestamp with
    another and ``spread_ties`` is off, or all of them share one (which nothing spreads).

    Raises:
        InputError: as :func:`load_trace`.
    """
    t = load_trace(trace_cfg, base_dir, num_requests).arrival_ns
    u, counts = np.unique(t, return_counts=True)
    if len(u) == 1 and len(t) > 1:   # no timestamp step for spread_ties to spread them over
        return (f"workload.trace: all {len(t)} arrivals share one timestamp and replay as "
                f"one burst (spread_ties spreads the requests of a timestamp over the "
                f"trace's step between timestamps, and it has one timestamp)")
    share = 1 - len(u) / len(t)
    if trace_cfg.spread_ties or share <= TIES_SHARE:
        return None
    step = timestamp_step_ns(t) / NS_PER_S
    return (f"workload.trace: {share:.0%} of the arrivals share their timestamp with another "
            f"(up to {counts.max()} at one instant; timestamps come in steps of {step:g} s "
            f"after time_scale) and replay as simultaneous bursts; if the trace stamps "
            f"arrivals at that resolution, workload.trace.spread_ties: true spreads each "
            f"step's requests evenly over it")


def load_trace(trace_cfg: TraceConfig, base_dir=".", num_requests: int | None = None
               ) -> TraceTable:
    """Read a trace and apply re-basing, ``spread_ties``, ``time_scale``, ``window_s`` and
    truncation.

    Args:
        trace_cfg: the ``workload.trace`` section.
        base_dir: folder that a relative ``trace_cfg.path`` is relative to (the scenario's).
        num_requests: keep only the first this many requests (after windowing), if set.

    Returns:
        A :class:`TraceTable` in file (= arrival) order, arrivals in ns from 0.

    Raises:
        InputError: missing/empty file, bad JSON, missing column or key, non-numeric,
            non-integer or negative value, zero tokens, an arrival earlier than the one
            before it, Mooncake ``hash_ids`` of the wrong length (all as
            ``file:line: ...``).
        KeyedInputError: keyed ``workload.trace.time_scale`` when it scales the last
            arrival past what a run holds (about 4.6e9 s), ``workload.trace.window_s`` when
            the window keeps no request; the scenario prefixes the key's line.
    """
    path = _resolve(trace_cfg.path, base_dir)
    fmt = trace_cfg.format
    if fmt == "azure":
        table = _read_azure(path)
    elif fmt == "mooncake":
        table = _read_mooncake(path)
    elif fmt == "csv":
        table = _read_generic_csv(path, trace_cfg)
    else:
        table = _read_generic_jsonl(path, trace_cfg)
    if len(table) == 0:
        raise InputError(f"{path}:2: no requests (only a header line)")

    t = table.arrival_ns - table.arrival_ns[0]   # non-decreasing: the first is the earliest
    if trace_cfg.spread_ties:
        t = spread_ties(t)
    if trace_cfg.time_scale != 1.0:
        if float(t[-1]) * trace_cfg.time_scale >= MAX_TIME_NS:
            raise KeyedInputError(
                "workload.trace.time_scale", f"{trace_cfg.time_scale:g} scales the last "
                f"arrival of {path} ({t[-1] / NS_PER_S:g} s after the first) beyond 4.6e9 s, "
                f"more than a run can hold", depends=("workload.trace.path",))
        t = np.rint(t.astype(np.float64) * trace_cfg.time_scale).astype(np.int64)
    keep = np.ones(len(t), dtype=bool)
    if trace_cfg.window_s is not None:   # in float ns: an end of 1e300 s keeps all
        start_ns, end_ns = (np.rint(x * NS_PER_S) for x in trace_cfg.window_s)
        keep = (t >= start_ns) & (t < end_ns)
        if not keep.any():
            span = t.max() / NS_PER_S
            raise KeyedInputError(
                "workload.trace.window_s", f"[{trace_cfg.window_s[0]:g}, "
                f"{trace_cfg.window_s[1]:g}) keeps no request of {path} (its arrivals span "
                f"0..{span:.3f} s after time_scale)",
                depends=("workload.trace.path", "workload.trace.time_scale"))
        t = t - np.int64(start_ns)   # start <= the last arrival kept, so it fits
    idx = np.flatnonzero(keep)   # rint of a non-decreasing series keeps it non-decreasing
    if num_requests is not None:
        idx = idx[:num_requests]
    return TraceTable(
        arrival_ns=t[idx].astype(np.int64),
        prompt_tokens=table.prompt_tokens[idx],
        output_tokens=table.output_tokens[idx],
        hash_ids=None if table.hash_ids is None else [table.hash_ids[i] for i in idx],
        source=table.source)


def mooncake_segments(hash_ids, input_length: int) -> tuple:
    """Prompt segments of a Mooncake request: ``(("mc", id), 512)`` per block, last shorter.

    Args:
        hash_ids: block ids, ``len == ceil(input_length / 512)``.
        input_length: prompt tokens (>= 1).

    Returns:
        Tuple of ``(content_id, length)`` whose lengths sum to ``input_length``.
    """
    b = MOONCAKE_BLOCK_TOKENS
    segs = [(("mc", int(h)), b) for h in hash_ids]
    last = input_length - b * (len(hash_ids) - 1)
    segs[-1] = (segs[-1][0], last)
    return tuple(segs)


def read_trace(trace_cfg: TraceConfig, base_dir=".", num_requests: int | None = None
               ) -> list[RequestSpec]:
    """Read a trace as request specs (see :func:`load_trace` for the processing order), each
    prompt as :func:`trace_specs` gives it without a shared prefix.

    Raises:
        InputError: as :func:`load_trace`.
    """
    return trace_specs(load_trace(trace_cfg, base_dir, num_requests))


def trace_specs(table: TraceTable, prompt_of=None) -> list[RequestSpec]:
    """Request specs of a loaded trace, ids ``0..N-1`` in file order (arrival order).

    Mooncake prompts are block segments (:func:`mooncake_segments`); other formats get
    ``prompt_of(request_id, prompt_tokens)`` (default one unique segment
    ``(("user", request_id), prompt_tokens)``; a workload's shared prefix passes its own).

    Returns:
        ``list[RequestSpec]`` sorted by ``(arrival_ns, request_id)``.
    """
    specs = []
    for rid in range(len(table)):
        p = int(table.prompt_tokens[rid])
        if table.hash_ids is not None:
            prompt = mooncake_segments(table.hash_ids[rid], p)
        elif prompt_of is not None:
            prompt = prompt_of(rid, p)
        else:
            prompt = ((("user", rid), p),)
        specs.append(RequestSpec(request_id=rid, arrival_ns=int(table.arrival_ns[rid]),
                                 prompt=prompt, max_tokens=int(table.output_tokens[rid])))
    return specs
