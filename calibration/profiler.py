"""Measure engine step times over a grid of step shapes.

The grid covers what the scheduler produces:

* ``prefill n=N c=C``: one prompt chunk of ``N`` new tokens after ``C`` cached ones (a
  prefix-cache hit), no decodes;
* ``decode B=B L=L``: ``B`` requests decoding one token each, contexts of mean ``L``
  spread as in served traffic (:func:`decode_lengths`);
* ``decode B=B L=L s=S g=G``: the same, each context starting with one of ``G`` cached
  ``S``-token prefixes (system prompts) in turn: a step reads each prefix block once per
  request holding it (``reread_tokens``);
* ``mixed B=B L=L n=N c=C``: both in one step (vLLM V1 chunked-prefill steps).

Each measurement is one real :meth:`LLMEngine.step` of the engine (schedule, inputs,
forward, sampling, update: the ``duration_ns`` of its :class:`StepRecord`, which is what the
simulator prices). Repeats are interleaved: pass ``p`` visits every cell once, so a slow
spell of the machine spreads over all cells instead of biasing one. Every repeat is kept.

The KV pool is scattered first (:func:`served_layout`): served requests' block tables are
spread over the cache, and on a CPU a step reads scattered blocks up to ~10% slower than
a fresh pool's consecutive ones.

Getting a step into a wanted shape needs KV for its context. Its *values* do not change the
cost, so the requests that build the context run through the scheduler and KV manager as
usual but skip the forward pass (:func:`_no_forward`); cached prefixes come from the prefix
cache. Only measured steps run the model.

Rows are appended to a CSV (first line ``# {json header}``) and flushed as they are
measured; a rerun with the same CSV skips what it already holds.

On a shared machine another process can take a core in the middle of a step; with one
torch thread per core, every parallel operation then waits for the descheduled thread and
the step takes several times as long. Each measured step's run-queue wait (the time this
process's threads were runnable but not running, ``/proc/self/task/*/schedstat``) is read,
and a disturbed step (:func:`disturbed`) is measured again, up to :data:`MAX_RETRIES` times.
"""

from __future__ import annotations

import codecs
import csv
import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from simulator.cost_model import chunk_features
from simulator.errors import InputError
from simulator.files import (is_regular_file, missing_file, no_column_line, read_csv_rows,
                             utf8_problem)
from simulator.policy.kv_cache import cdiv

CSV_COLUMNS = ("cell", "kind", "pass", "duration_ns", "execute_ns", "prefills",
               "num_decodes", "decode_context_tokens", "num_sampled", "tokens", "requests",
               "prefill_tokens", "decodes", "context_tokens", "attn_pairs", "sampled",
               "reread_tokens")
#: Columns an older measurements CSV may lack, read as 0: it was measured before they were
#: counted (its steps re-read no context: no grid cell then shared a prefix).
OPTIONAL_COLUMNS = ("reread_tokens",)
# Header keys that must agree before a CSV is resumed: rows measured with another thread
# count or torch build ran at another speed and would be fitted as one machine.
IDENTITY_KEYS = ("model", "shape", "dtype", "device", "block_size", "threads", "torch")


# == disturbed steps ==========================================================================

# A step is disturbed when its threads waited for a CPU longer than this share of the step
# (or 1 ms). Undisturbed steps on a 2-core CPU wait 0.2-0.4 ms per 20 ms step (thread
# wake-ups); a step that lost a core for one scheduler slice waits several ms.
MAX_WAIT_SHARE = 0.05
MAX_RETRIES = 8


def run_queue_wait_ns() -> int | None:
    """Summed run-queue wait of this process's threads (ns, Linux schedstat), or None."""
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_times(stat_path: str = "/proc/stat") -> tuple[int, int] | None:
    """``(total, idle)`` clock ticks of all CPUs since boot (``/proc/stat``; idle includes
    iowait), or None where there is no such file."""
    try:
        with open(stat_path) as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(v), v[3] + (v[4] if len(v) > 4 else 0)


def busy_cores(interval_s: float = 1.0, stat_path: str = "/proc/stat") -> float | None:
    """Cores' worth of CPU the whole machine used over the next ``interval_s`` seconds
    (this process sleeps meanwhile, so it is other work), or None without ``/proc/stat``.
    Unlike the load average, it does not remember work that ended a minute ago."""
    a = cpu_times(stat_path)
    time.sleep(interval_s)
    b = cpu_times(stat_path)
    if a is None or b is None or b[0] <= a[0]:
        return None
    return (os.cpu_count() or 1) * (1 - (b[1] - a[1]) / (b[0] - a[0]))


def disturbed(wait_ns: int | None, duration_ns: int) -> bool:
    """Whether a step that waited ``wait_ns`` for a CPU (None: unknown) was disturbed."""
    return wait_ns is not None and wait_ns > max(1_000_000, MAX_WAIT_SHARE * duration_ns)


# == grid =====================================================================================

@dataclass(frozen=True)
class Cell:
    """One grid point. ``kind`` is ``prefill``, ``decode`` or ``mixed``; ``B`` decodes at
    mean context ``L`` tokens, whose first ``s`` tokens are one of ``g`` prefixes they
    share through the prefix cache, request ``i`` the prefix ``i mod g`` (``s`` = 0: none;
    decode cells only); one chunk of ``n`` tokens after ``c`` cached ones (0 = none)."""

    kind: str
    B: int = 0
    L: int = 0
    n: int = 0
    c: int = 0
    s: int = 0
    g: int = 1

    @property
    def key(self) -> str:
        """Stable id used in the CSV, e.g. ``mixed B=8 L=256 n=64 c=0``, ``decode B=8
        L=256 s=128 g=2`` (``s`` and ``g`` only when ``s`` > 0)."""
        parts = {"prefill": (("n", self.n), ("c", self.c)),
                 "decode": (("B", self.B), ("L", self.L)) + ((("s", self.s), ("g", self.g))
                                                              if self.s else ()),
                 "mixed": (("B", self.B), ("L", self.L), ("n", self.n), ("c", self.c))}
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in parts[self.kind])

    @classmethod
    def from_key(cls, key: str) -> "Cell | None":
        """The cell whose :attr:`key` is ``key``, or None for another string."""
        kind, _, rest = key.partition(" ")
        try:
            fields = {k: int(v) for k, v in (p.split("=") for p in rest.split())}
            cell = cls(kind, **fields)
        except (TypeError, ValueError):
            return None
        return cell if kind in ("prefill", "decode", "mixed") and cell.key == key else None


@dataclass(frozen=True)
class Grid:
    """The step shapes to measure.

    Attributes:
        prefill_chunks, prefill_contexts: chunk sizes ``n`` × cached contexts ``c`` (tokens;
            contexts are rounded up to block multiples, as only full blocks are cached).
        decode_batches, decode_contexts: batch sizes ``B`` × context lengths ``L``.
        mixed_batches, mixed_contexts, mixed_chunks: ``B`` × ``L`` × ``(n, c)`` pairs.
        shared_decodes: ``(B, L, s, g)`` decode cells whose requests share ``g``
            ``s``-token prefixes (rounded up to whole blocks), interleaved: each step
            re-reads ``(B − g) · s`` context tokens, which fits the re-read rate
            (:data:`simulator.cost_model.OPTIONAL_COEFFICIENTS`). Interleaved as served
            batches hold several system prompts: between two reads of a block, the
            other prefixes' and requests' KV pass through the caches.
        repeats: visits per cell (passes over the grid).
        decode_steps_per_visit: consecutive decode steps measured per visit of a decode cell.
    """

    prefill_chunks: tuple = (16, 64, 256)
    prefill_contexts: tuple = (0, 256)
    decode_batches: tuple = (1, 4, 16)
    decode_contexts: tuple = (64, 512)
    mixed_batches: tuple = (4,)
    mixed_contexts: tuple = (256,)
    mixed_chunks: tuple = ((64, 0),)
    shared_decodes: tuple = ()
    repeats: int = 3
    decode_steps_per_visit: int = 2

    def cells(self, block_size: int, max_model_len: int, kv_tokens: int) -> list[Cell]:
        """The feasible cells: ``c + n + chunk_span(n) < max_model_len`` (a prompt must
        leave room for an output token, as vLLM requires, in every pass:
        :func:`pass_chunk_tokens`); decodes need ``B · (L + headroom) ≤ kv_tokens`` (KV
        capacity in tokens); shared-prefix decodes ``s < L`` and ``1 ≤ g < B``."""
        bs = block_size
        rc = lambda c: cdiv(c, bs) * bs  # noqa: E731
        out = []
        for c in self.prefill_contexts:
            for n in self.prefill_chunks:
                top = n + chunk_span(n)   # the chunk's last pass runs fewer tokens than this
                if rc(c) + top < max_model_len and rc(c) + top <= kv_tokens:
                    out.append(Cell("prefill", n=n, c=rc(c)))
        head = self.decode_headroom(len(self.mixed_chunks))
        shapes = [(B, L, 0, 1) for L in self.decode_contexts for B in self.decode_batches]
        shapes += [(B, L, rc(s), g) for B, L, s, g in self.shared_decodes
                   if shares_prefixes(B, L, rc(s), g)]   # as a CSV's cells are read back
        for B, L, s, g in shapes:
            if max(decode_lengths(B, L, s)) + head <= max_model_len \
                    and B * (L + head + bs) <= kv_tokens:
                out.append(Cell("decode", B=B, L=L, s=s, g=g))
        for L in self.mixed_contexts:
            for B in self.mixed_batches:
                for n, c in self.mixed_chunks:
                    top = n + chunk_span(n)
                    need = B * (L + head + bs) + rc(c) + top + bs
                    if max(decode_lengths(B, L)) + head <= max_model_len \
                            and rc(c) + top < max_model_len \
                            and need <= kv_tokens:
                        out.append(Cell("mixed", B=B, L=L, n=n, c=rc(c)))
        return out

    def extra_blocks(self, members: list[Cell], p: int, pieces: int, block_size: int,
                     max_model_len: int, kv_tokens: int) -> int:
        """:func:`pass_extra_blocks` for the decode group ``members`` (its decode and mixed
        cells, one ``(B, L, s, g)``) in pass ``p``, cut to what the group leaves free: every
        request still fits ``max_model_len`` and the group's largest step the KV cache
        (the margins :meth:`cells` checked, whole blocks)."""
        bs, head = block_size, self.decode_headroom(len(self.mixed_chunks))
        B, L, s = members[0].B, members[0].L, members[0].s
        rc = lambda c: cdiv(c, bs) * bs  # noqa: E731
        need = max(B * (L + head + bs)
                   + (rc(c.c) + c.n + chunk_span(c.n) + bs if c.kind == "mixed" else 0)
                   for c in members)
        room = min(decode_room_blocks(B, L, s, bs, max_model_len, head),
                   (kv_tokens - need) // bs)
        return max(0, min(pass_extra_blocks(p, self.repeats, pieces), room))

    def decode_headroom(self, n_mixed: int) -> int:
        """Decode steps one visit of a (B, L) group runs: warm-up, measured decodes, and
        two per mixed cell (prefix set-up, measured step)."""
        return 2 + self.decode_steps_per_visit + 2 * n_mixed

    def rows_per_visit(self, cell: Cell) -> int:
        """Measured steps (CSV rows) one visit of ``cell`` adds: ``decode_steps_per_visit``
        for a decode cell, 1 for a prefill or mixed cell."""
        return self.decode_steps_per_visit if cell.kind == "decode" else 1

    def max_batch(self) -> int:
        """The largest decode batch ``B`` (sequences) of the decode and mixed lists, at
        least 1; taken over the lists, feasible cells or not."""
        return max((*self.decode_batches, *self.mixed_batches,
                    *(B for B, *_ in self.shared_decodes), 1))

    def max_chunk(self) -> int:
        """The most tokens a prefill chunk of the prefill and mixed lists runs in any pass
        (``n + chunk_span(n)`` bounds it, :func:`pass_chunk_tokens`), at least 1; taken
        over the lists, feasible cells or not."""
        return max((*(n + chunk_span(n) for n in self.prefill_chunks),
                    *(n + chunk_span(n) for n, _ in self.mixed_chunks), 1))


#: The CPU grid's shared-prefix decode cells ``(B, L, s, g)`` (``--quick``: the first two);
#: the vLLM backend's grid measures the same (:func:`calibration.vllm.core.default_vllm_grid`).
CPU_SHARED_DECODES = ((8, 256, 128, 2), (24, 512, 128, 4), (24, 1024, 512, 4))


def default_grid(device: str, quick: bool, max_model_len: int) -> Grid:
    """The grid ``servesim calibrate`` measures.

    CPU grids are sized for a ~50M-parameter model on two cores (full run ≲ 10 min,
    ``--quick`` ≲ 3 min); GPU grids for an 8B model on one GPU (batches to 256, contexts to
    8k, chunks to 8192 = vLLM's default ``max_num_batched_tokens``). Shared-prefix decode
    cells share 2 or 4 system-prompt-sized prefixes (128 tokens) or prefixes of half the
    context. Contexts above ``max_model_len`` are dropped. The chunk sizes name the cells;
    over the passes each chunk runs fewer than :data:`CHUNK_CYCLE` tokens more
    (:func:`pass_chunk_tokens`).
    """
    fit = lambda xs: tuple(x for x in xs if x < max_model_len)  # noqa: E731
    shared = lambda xs: tuple(x for x in xs if x[1] < max_model_len)  # noqa: E731
    if device == "cpu":
        if quick:  # the full grid's shapes, thinned: every batch size, fewer contexts
            return Grid(prefill_chunks=(16, 64, 256, 768), prefill_contexts=fit((0, 1024)),
                        decode_batches=(1, 2, 4, 8, 16, 32), decode_contexts=fit((64, 512)),
                        mixed_batches=(2, 8), mixed_contexts=fit((256,)),
                        mixed_chunks=((32, 0), (256, 256)),
                        shared_decodes=shared(CPU_SHARED_DECODES[:2]),
                        repeats=3,
                        decode_steps_per_visit=2)
        return Grid(prefill_chunks=(16, 64, 256, 768), prefill_contexts=fit((0, 256, 1024)),
                    decode_batches=(1, 2, 4, 8, 16, 32), decode_contexts=fit((64, 256, 1024)),
                    mixed_batches=(2, 8, 24), mixed_contexts=fit((128, 512)),
                    mixed_chunks=((32, 0), (128, 256), (512, 0)),
                    shared_decodes=shared(CPU_SHARED_DECODES),
                    repeats=4, decode_steps_per_visit=2)
    if quick:
        return Grid(prefill_chunks=(64, 512, 2048, 8192), prefill_contexts=fit((0, 2048)),
                    decode_batches=(1, 16, 64, 256), decode_contexts=fit((256, 2048)),
                    mixed_batches=(16, 64), mixed_contexts=fit((1024,)),
                    mixed_chunks=((256, 0), (2048, 1024)),
                    shared_decodes=shared(((64, 1024, 512, 4),)), repeats=3,
                    decode_steps_per_visit=3)
    return Grid(prefill_chunks=(16, 128, 512, 2048, 8192),
                prefill_contexts=fit((0, 1024, 4096)),
                decode_batches=(1, 4, 16, 64, 128, 256), decode_contexts=fit((128, 1024, 4096)),
                mixed_batches=(8, 64), mixed_contexts=fit((512, 2048)),
                mixed_chunks=((128, 0), (1024, 1024), (4096, 0)),
                shared_decodes=shared(((64, 1024, 512, 4), (256, 2048, 1024, 4))), repeats=4,
                decode_steps_per_visit=3)


def least_max_model_len(device: str, quick: bool, block_size: int, cells: int) -> int:
    """The smallest ``max_model_len`` (tokens) whose :func:`default_grid` holds ``cells``
    feasible cells and whose prompts take the :data:`IDLE_STEP_TOKENS`-token step timed
    after idle (feasibility grows with ``max_model_len``: a bisection)."""
    def enough(n: int) -> bool:
        return n > IDLE_STEP_TOKENS and len(
            default_grid(device, quick, n).cells(block_size, n, 1 << 62)) >= cells
    lo, hi = 1, 1 << 20
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


# == step features ============================================================================

def record_features(rec) -> dict:
    """Cost-model features (:class:`simulator.cost_model.StepFeatures` fields) of an engine
    :class:`~calibration.engine.StepRecord`, plus its raw plan summary."""
    chunks = [(n, c) for _, n, c in rec.prefills]
    return {"prefills": ";".join(f"{n}@{c}" for n, c in chunks),
            "num_decodes": rec.num_decodes, "decode_context_tokens": rec.decode_context_tokens,
            "num_sampled": rec.num_sampled,
            **asdict(chunk_features(chunks, rec.num_decodes, rec.decode_context_tokens,
                                    rec.num_sampled, rec.reread_tokens))}


#: The measurements columns a step's plan determines (:func:`chunk_features` of its
#: ``prefills``, ``num_decodes``, ``decode_context_tokens`` and ``num_sampled``): the fit
#: reads them, so a row's must agree with those.
PLAN_FEATURES = ("tokens", "requests", "prefill_tokens", "decodes", "context_tokens",
                 "attn_pairs", "sampled")


# == CSV store ================================================================================

def read_csv_header(path: Path) -> dict | None:
    """The JSON header of a measurements CSV, or ``None`` if the file has none (or its
    first line is not UTF-8 text, or its JSON is no object: ``# [1, 2]`` names no key). A
    UTF-8 byte order mark before it (an editor's "UTF-8 with BOM") is skipped, as pandas
    skips it."""
    with open(path, "rb") as f:   # text mode would decode a whole buffer, not the line
        first = f.readline().removeprefix(codecs.BOM_UTF8)
    if not first.startswith(b"# "):
        return None
    try:
        header = json.loads(first[2:].decode("utf-8"))
    except ValueError:   # UnicodeDecodeError too
        return None
    return header if isinstance(header, dict) else None


def read_measurements(path: str | Path, shown: str | Path | None = None):
    """A measurements CSV as a ``pandas.DataFrame`` (columns :data:`CSV_COLUMNS`).
    ``shown``: the name errors give the file (default ``path``; a checked copy's original).

    Raises:
        InputError: missing file, or a file that is not a servesim measurements CSV.
    """
    import pandas as pd

    path = Path(path)
    name = Path(shown) if shown is not None else path
    if not is_regular_file(path):   # (a device or a pipe would be read forever)
        raise InputError(f"{name}: measurements CSV {missing_file(path)}")
    table = read_csv_rows(path, name)
    bad = table.width_problem()   # a short row (a line cut off) is named as short
    if bad:
        raise InputError(f"{name}:{bad}: not a measurements row (delete the row to measure "
                         f"it again)")
    missing = [c for c in CSV_COLUMNS if c not in table.columns and c not in OPTIONAL_COLUMNS]
    if missing:
        why = f"missing column {missing[0]}" if table.columns else no_column_line(path)
        where = f"{name}:{table.column_line}" if table.columns else str(name)
        raise InputError(f"{where}: not a measurements CSV ({why}; the column line is "
                         f"{', '.join(CSV_COLUMNS)})")
    df = table.frame()
    for c in OPTIONAL_COLUMNS:
        if c not in df.columns:
            df[c] = "0"
    lines = table.lines
    for c in CSV_COLUMNS:
        if c in _TEXT_COLUMNS:
            continue
        num = pd.to_numeric(df[c], errors="coerce")
        # inf, 1e400 or a zero step time would break the fit's least squares
        ok = np.isfinite(num) & (num > 0 if c == "duration_ns" else num >= 0)
        if c in _COUNT_COLUMNS:
            ok &= num == np.floor(num)
        bad = (~ok).to_numpy().nonzero()[0]
        if len(bad):   # a row edited or written by something else: name its line
            i = int(bad[0])
            v = df[c].iloc[i]   # as the file writes it
            want = ("a step time > 0" if c == "duration_ns" else "a whole number >= 0"
                    if c in _COUNT_COLUMNS else "a finite number >= 0")
            raise InputError(f"{name}:{lines[i]}: {c} is {v!r}: a measurements "
                             f"row holds {want} there (delete the row to measure it again)")
        df[c] = num
    bad = (df["reread_tokens"] > df["context_tokens"]).to_numpy().nonzero()[0]
    if len(bad):   # a re-read token is one of the step's context tokens
        i = int(bad[0])
        raise InputError(f"{name}:{lines[i]}: reread_tokens is "
                         f"{df['reread_tokens'].iloc[i]:g}: more than the row's context_tokens "
                         f"({df['context_tokens'].iloc[i]:g}), which hold every token read "
                         f"again (delete the row to measure it again)")
    for c, ok, want in (("cell", df["cell"].str.strip() != "", "names its grid cell"),
                        ("kind", df["kind"].isin(CELL_KINDS),
                         f"kind is one of {', '.join(CELL_KINDS)}"),
                        ("prefills", df["prefills"].str.fullmatch(_PREFILLS),
                         "lists its prefill chunks as tokens@computed_before, ';' between "
                         "them (e.g. '64@0;32@128'; at most 15 digits each), or none")):
        bad = (~ok).to_numpy().nonzero()[0]
        if len(bad):
            i = int(bad[0])
            raise InputError(f"{name}:{lines[i]}: {c} is {df[c].iloc[i]!r}: a "
                             f"measurements row {want} (delete the row to measure it again)")
    header = read_csv_header(path) or {}
    if not str(header.get("engine", "")).startswith(OTHER_ENGINES):
        _check_own_cells(df, lines, name)   # the row's plan is its cell's ...
    _check_plan_features(df, lines, name)   # ... and its counts are its plan's
    return df


def _check_plan_features(df, lines: list[int], name: Path) -> None:
    """Each row's :data:`PLAN_FEATURES` are those of its plan (:func:`chunk_features`): a row
    edited in one of them (``prefills`` '95@0' beside prefill_tokens 69) would be fitted
    as a step it did not run. Errors name ``name``.

    Raises:
        InputError: naming the first bad row's file line and column.
    """
    import pandas as pd

    want = pd.DataFrame(
        [asdict(chunk_features([tuple(map(int, x.split("@"))) for x in p.split(";") if x],
                               nd, d, s))
         for p, nd, d, s in zip(df["prefills"], df["num_decodes"],
                                df["decode_context_tokens"], df["num_sampled"])],
        index=df.index, columns=list(PLAN_FEATURES))
    # whole and half counts: exact in float
    rows, cols = (df[list(PLAN_FEATURES)] != want).to_numpy().nonzero()
    if len(rows):
        i, c = int(rows[0]), PLAN_FEATURES[cols[0]]
        row = df.iloc[i]
        raise InputError(
            f"{name}:{lines[i]}: {c} is {row[c]:.15g}: the row's prefills "
            f"{row['prefills']!r}, num_decodes {row['num_decodes']:.15g}, "
            f"decode_context_tokens {row['decode_context_tokens']:.15g} and num_sampled "
            f"{row['num_sampled']:.15g} make it {want[c].iloc[i]:.15g} (delete the row to "
            f"measure it again)")


#: The ``engine`` of a measurements CSV that servesim's engine wrote (its cells are
#: :attr:`Cell.key` strings).
OWN_ENGINE = "servesim-torch"
#: ``engine`` prefixes of CSVs whose cells are named otherwise (the vLLM backend's by run
#: and step, :func:`calibration.vllm.core.label_steps`); every other CSV's are checked.
OTHER_ENGINES = ("vllm",)


def _check_own_cells(df, lines: list[int], name: Path) -> None:
    """Each row of a servesim-engine CSV names a grid cell (:meth:`Cell.from_key`, sizes
    >= 0; a shared prefix shorter than the mean context, among fewer prefixes than
    requests) of its own kind, ran that cell's chunk beside its decodes (as
    :func:`measure_grid` checks each step it takes) and re-read its shared prefixes'
    ``(B − g) · s`` tokens: a row edited to another kind would be fitted as that kind, then
    break the report's per-kind plots. Errors name ``name``.

    Raises:
        InputError: naming the first bad row's file line.
    """
    cells = {key: Cell.from_key(key) for key in df["cell"].unique()}
    for i, (key, kind, prefills, decodes, again) in enumerate(zip(
            df["cell"], df["kind"], df["prefills"], df["num_decodes"], df["reread_tokens"])):
        cell = cells[key]
        if (cell is None or min(cell.B, cell.L, cell.n, cell.c, cell.s, cell.g - 1) < 0
                or cell.s and not shares_prefixes(cell.B, cell.L, cell.s, cell.g)):
            what = (f"cell is {key!r}: not a grid cell (e.g. 'prefill n=64 c=0', 'decode B=8 "
                    f"L=256', 'decode B=8 L=256 s=128 g=2' with s < L and g < B, 'mixed B=8 "
                    f"L=256 n=64 c=0')")
        elif cell.kind != kind:
            what = f"cell {key!r} is a {cell.kind} cell, the row's kind is {kind!r}"
        elif not _runs_shape(cell, prefills, decodes):   # _check's rule when measuring
            want = repr(_shape_of(cell)[0])
            if chunk_span(cell.n) > 1:
                want += f" to {_shape_of(cell, cell.n + chunk_span(cell.n) - 1)[0]!r}"
            what = (f"cell {key!r} runs prefills {want} beside {cell.B} decodes, the "
                    f"row's are {prefills!r} beside {decodes:g}")
        elif again != (cell.B - cell.g) * cell.s:
            what = (f"cell {key!r} re-reads {(cell.B - cell.g) * cell.s} context tokens a "
                    f"step ((B − g) · s), the row's reread_tokens are {again:g}")
        else:
            continue
        raise InputError(f"{name}:{lines[i]}: {what} (delete the row to measure "
                         f"it again)")


def _shape_of(cell: Cell, n: int | None = None) -> tuple[str, int]:
    """``(prefills, num_decodes)`` of a step of ``cell`` whose chunk runs ``n`` tokens
    (default the cell's ``n``), as its measurements row writes them
    (:func:`record_features`)."""
    chunk = f"{cell.n if n is None else n}@{cell.c}" if cell.kind in ("prefill", "mixed") else ""
    return chunk, cell.B


def _runs_shape(cell: Cell, prefills: str, decodes) -> bool:
    """Whether a step with ``prefills`` (``n@c`` or empty) beside ``decodes`` decodes is
    one of ``cell``'s: its decodes, its cached context, and a chunk of ``n`` to
    ``n + chunk_span(n)`` tokens in some pass (:func:`pass_chunk_tokens`; rows measured
    before chunks stepped through their span ran ``n``)."""
    if cell.kind == "decode":
        return (prefills, decodes) == _shape_of(cell)
    n = str(prefills).partition("@")[0]
    return (n.isdigit() and decodes == cell.B
            and (prefills, decodes) == _shape_of(cell, int(n))
            and cell.n <= int(n) <= cell.n + max(0, chunk_span(cell.n) - 1))


#: Columns of a measurements CSV that hold text; every other one holds a number >= 0.
_TEXT_COLUMNS = ("cell", "kind", "prefills")
#: Columns that count (passes, steps' requests and tokens): whole numbers.
_COUNT_COLUMNS = ("pass", "num_decodes", "decode_context_tokens", "num_sampled", "tokens",
                  "requests", "prefill_tokens", "decodes", "context_tokens", "sampled",
                  "reread_tokens")
#: The ``prefills`` column: ``n@c`` per chunk (:func:`record_features`), or empty; at most
#: 15 digits each, so that their sums stay exact in float (a longer one is no step's).
_PREFILLS = r"(?:[0-9]{1,15}@[0-9]{1,15}(?:;[0-9]{1,15}@[0-9]{1,15})*)?"
#: A grid cell's kinds (:class:`Cell`).
CELL_KINDS = ("prefill", "decode", "mixed")


def check_resumable(path: Path, identity: dict) -> bool:
    """Whether ``path`` holds rows to resume (False: absent or empty). Every whole row is
    read and checked (:func:`read_measurements`) and a last line cut off by a kill
    mid-write dropped from the file (:func:`_repair_tail`), before any measuring.

    Raises:
        InputError: the file is not a measurements CSV, was measured for another run
            identity (:data:`IDENTITY_KEYS` of ``identity``; the message names the key), or
            holds a row that is no measurement (its line named).
    """
    if not (path.is_file() and path.stat().st_size > 0):
        return False
    old = read_csv_header(path)
    if old is None:
        first = path.read_bytes().split(b"\n", 1)[0]
        try:
            first.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(utf8_problem(path)) from None
        raise InputError(f"{path}:1: exists but is not a servesim measurements CSV (its "
                         f"first line is '# ' and the run's identity in JSON): move it or use "
                         f"another --out")
    for k in IDENTITY_KEYS:
        if old.get(k) != identity.get(k):
            raise InputError(f"{path}: measured with {k} = {old.get(k)!r}, this run has "
                             f"{identity.get(k)!r}: use another --out")
    if str(old.get("engine", "")).startswith(OTHER_ENGINES):   # calibrate resumes its own
        raise InputError(f"{path}: measured with engine = {old['engine']!r}, this run on "
                         f"servesim's engine: use another --out")
    table = read_csv_rows(path)   # (before the repair: a file refused is left as it was)
    if table.columns and table.columns != list(CSV_COLUMNS):
        # (an older servesim's file lacks OPTIONAL_COLUMNS: new rows would not fit it)
        missing = [c for c in CSV_COLUMNS if c not in table.columns]
        extra = [c for c in table.columns if c not in CSV_COLUMNS]
        what = []
        if missing:
            what.append(f"it lacks {', '.join(missing)}" + (
                ", as an older servesim's file does"
                if not extra and set(missing) <= set(OPTIONAL_COLUMNS) else ""))
        if extra:
            what.append(f"it adds {', '.join(map(repr, extra))}")
        what = "; ".join(what) or "they are in another order, or one is repeated"
        raise InputError(f"{path}:{table.column_line}: its columns are not this servesim's "
                         f"({what}; this servesim's are {', '.join(CSV_COLUMNS)}): use "
                         f"another --out")
    _repair_tail(path)
    return True


def _repair_tail(path: Path) -> None:
    """Check every whole line of ``path`` (:func:`read_measurements`), then drop a last line
    cut off by a kill mid-write. The check runs on a copy without that line, so a file
    refused is left as it was.

    Raises:
        InputError: as :func:`read_measurements`, naming ``path``.
    """
    from simulator.files import atomic_write

    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        read_measurements(path)
        return
    whole = data[:data.rfind(b"\n") + 1]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / path.name).write_bytes(whole)
        read_measurements(Path(d) / path.name, shown=path)
    atomic_write(path, whole)


class MeasurementLog:
    """Append-only measurements CSV, resumable.

    Args:
        path: the CSV. header: run identity (:data:`IDENTITY_KEYS`) and facts to record.

    Raises:
        InputError: the file exists but was measured for another model, dtype, device,
            block size, thread count or torch version (its header says which), or another
            run holds it (``flock``).
    """

    def __init__(self, path: str | Path, header: dict):
        self.path = Path(path)
        self.counts: dict[str, int] = {}
        if check_resumable(self.path, header):
            for cell in read_measurements(self.path)["cell"]:
                self.counts[cell] = self.counts.get(cell, 0) + 1
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w", encoding="utf-8", newline="") as f:
                f.write("# " + json.dumps(header, sort_keys=True) + "\n")
                csv.writer(f, lineterminator="\n").writerow(CSV_COLUMNS)
        self._f = open(self.path, "a", encoding="utf-8", newline="")
        try:  # one writer at a time: two runs on one CSV would each miss the other's rows
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._f.close()
            raise InputError(f"{self.path}: another calibration is writing this file") from None
        self._w = csv.writer(self._f, lineterminator="\n")   # as the header line

    def append(self, row: dict) -> None:
        """Write one measurement (a dict keyed by :data:`CSV_COLUMNS`) and sync it to disk,
        so a kill loses at most the row being written."""
        self._w.writerow([row[c] for c in CSV_COLUMNS])
        self._f.flush()
        os.fsync(self._f.fileno())
        self.counts[row["cell"]] = self.counts.get(row["cell"], 0) + 1

    def close(self) -> None:
        """Close the file (and release its lock)."""
        self._f.close()


# == driving the engine into a step shape =====================================================

@contextmanager
def _no_forward(engine):
    """Steps run scheduling and KV allocation but not the model: set-up requests only need
    their KV *slots* (their values do not change a later step's cost). Samples token 0."""
    engine.skip_forward = True
    try:
        yield
    finally:
        engine.skip_forward = False


# Contexts of one decode batch span this factor, as in served traffic: the Azure LLM
# inference 2023 conversation trace's prompt lengths have p90 / p10 ≈ 7-8 (lognormal σ ≈
# 0.8). The runner's split-K decode attention pads each context to whole pieces, so
# served-like spreads keep that padding as it is in service.
CONTEXT_SPREAD = 8.0


def shares_prefixes(B: int, L: int, s: int, g: int) -> bool:
    """Whether ``B`` decodes of mean context ``L`` can share ``g`` ``s``-token prefixes as a
    grid cell does: each prefix shorter than the context, fewer prefixes than requests (so
    some are read again), at least one."""
    return s < L and 1 <= g < B


def pass_extra_blocks(p: int, repeats: int, pieces: int) -> int:
    """KV blocks of context added to a decode group's requests in pass ``p`` of
    ``repeats``: ``p · pieces // repeats``, so that over the passes a step's block count
    steps evenly through a whole cycle of the attention's padding to ``pieces`` blocks
    (:data:`calibration.engine.attention.CPU_PADDING`; 0 where ``pieces`` is 1).

    A decode step's attention on CPU runs on its blocks padded up to a multiple of
    ``pieces``, so its cost is a staircase in the summed context that the cost model
    prices as a line. A cell at one fixed context sits at one point of the staircase: the
    grid's contexts (64, 256 and 1024 tokens, and a step or two of output) sat just past
    its steps (one decode padded by 11-15 blocks against the 7.5 a served step averages),
    and profiles priced their Poisson replay's decode-only steps ×1.06 of their time
    (median −6%, mixed steps ±2%); with the offsets, ×0.97–1.02 in five calibrations
    (medians −2% to +0.3%; their mixed steps ×0.91–0.98). Averaged over the passes, each
    cell pays the served average; its rows record the contexts it ran.
    """
    return p * pieces // repeats


#: Tokens through which a chunk cell's chunk steps over the grid's passes
#: (:func:`pass_chunk_tokens`). Matmuls run their rows in blocks, and a step whose token
#: count is a multiple of 32 runs faster than its neighbours: on one thread of an AVX512
#: Xeon, the 56M-parameter model in float32, a 64-token prefill 38.5 ms against 40.4 and
#: 42.7 ms at 63 and 65 tokens, 96 tokens 54.9 against 57.1 and 58.7, 256 tokens 116 ms
#: against 129 ms at 258. Served steps' token counts (a prompt's chunk and the running
#: decodes) fall anywhere; a grid at 16, 64, 256 and 768 tokens measured only the fast
#: counts, and its fit priced a Poisson replay's steps with a prefill at a median ×0.90 of
#: their time (decode-only steps ×1.00).
CHUNK_CYCLE = 32


def chunk_span(n: int) -> int:
    """Tokens over which an ``n``-token chunk cell's chunk steps: :data:`CHUNK_CYCLE`, or
    ``n // 2`` for chunks shorter than two cycles (a 16-token cell stays a short chunk)."""
    return min(CHUNK_CYCLE, n // 2)


def pass_chunk_tokens(n: int, p: int, repeats: int) -> int:
    """Tokens the chunk of an ``n``-token chunk cell (prefill or mixed) runs in pass ``p`` of
    ``repeats``: ``n + (2p + 1) · chunk_span(n) // (2 · repeats)``, the mid-points of
    ``repeats`` equal parts of the span, so that the passes average over the matmuls' row
    blocking as served steps do (:data:`CHUNK_CYCLE`; 64 tokens over 4 passes: 68, 76, 84,
    92). Always ``n ≤`` tokens ``< n + chunk_span(n)`` (``n`` itself when the span is 0).
    The cell keeps its name; its rows record the chunks it ran."""
    return n + (2 * p + 1) * chunk_span(n) // (2 * repeats)


def decode_room_blocks(B: int, L: int, s: int, block_size: int, max_model_len: int,
                       headroom: int) -> int:
    """KV blocks of context a ``decode B=B L=L s=s`` group can take in all
    (:meth:`_Driver.start_decodes` ``extra_blocks``, to the shortest requests first) with
    every request still ``headroom`` tokens under ``max_model_len``: as many per request as
    the longest has room for."""
    return B * ((max_model_len - headroom - max(decode_lengths(B, L, s))) // block_size)


def decode_lengths(B: int, L: int, s: int = 0) -> list[int]:
    """Context lengths of a ``decode B=B L=L s=s`` cell: the shared ``s`` tokens, then ``B``
    values spaced geometrically over a factor :data:`CONTEXT_SPREAD`, scaled to mean
    ``L − s`` (``[L]`` for ``B = 1``)."""
    if B == 1:
        return [L]
    g = CONTEXT_SPREAD ** (np.arange(B) / (B - 1))
    return [s + max(1, int(round(x))) for x in (L - s) * g / g.mean()]


class _Driver:
    """Builds the contexts of the grid's cells on one engine and measures steps."""

    def __init__(self, engine, seed: int):
        from calibration.engine import SamplingParams

        self.engine = engine
        self.vocab = engine.model_config.vocab_size
        self.rng = np.random.default_rng(seed)
        self._prefix: dict[tuple, list[int]] = {}
        self._params = SamplingParams
        self._ids = 0
        self.last_wait_ns: int | None = None

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, self.vocab, n).tolist()

    def prefix(self, c: int, i: int = 0) -> list[int]:
        """The fixed ``c``-token prefix number ``i`` whose KV the prefix cache holds for
        chunk cells (``i`` = 0) and shared-prefix decode cells."""
        if (c, i) not in self._prefix:
            self._prefix[c, i] = self.tokens(c)
        return self._prefix[c, i]

    def add(self, prompt: list[int], max_tokens: int):
        self._ids += 1
        rid = f"calib-{self._ids}"
        while rid in self.engine.records:  # another driver ran on this engine before
            self._ids += 1
            rid = f"calib-{self._ids}"
        self.engine.add_request(prompt, self._params(temperature=0.0, max_tokens=max_tokens,
                                                     ignore_eos=True), request_id=rid)
        return rid

    def until_first_tokens(self, rids) -> None:
        recs = self.engine.records
        while any(recs[r].first_token_ns is None for r in rids):
            self.engine.step()

    def cache_prefix(self, c: int) -> None:
        """Make sure the prefix cache holds the ``c``-token prefix (no forward)."""
        if c == 0:
            return
        with _no_forward(self.engine):
            rid = self.add(self.prefix(c), 1)
            self.until_first_tokens([rid])

    def start_decodes(self, B: int, L: int, s: int = 0, g: int = 1,
                      extra_blocks: int = 0) -> list:
        """``B`` requests with fresh prompts (:func:`decode_lengths`) after ``s``-token
        prefixes, request ``i`` the prefix ``i mod g`` (whole blocks: later requests hit
        the first one's blocks), prefilled without a forward, decoding until stopped (or
        ``max_model_len``). ``extra_blocks`` more KV blocks of context in all, one at a
        time to the shortest requests first (:func:`pass_extra_blocks`)."""
        lens = decode_lengths(B, L, s)
        order = sorted(range(B), key=lambda i: lens[i])
        for j in range(extra_blocks):
            lens[order[j % B]] += self.engine.config.block_size
        with _no_forward(self.engine):
            rids = [self.add(self.prefix(s, i % g) + self.tokens(n - s),
                             self.engine.max_model_len - n) for i, n in enumerate(lens)]
            self.until_first_tokens(rids)
        return rids

    def stop(self, rids) -> None:
        for r in rids:
            self.engine.abort_request(r)

    def step(self):
        """One real step; its :class:`StepRecord` (its run-queue wait in
        :attr:`last_wait_ns`).

        Raises:
            RuntimeError: the engine scheduled nothing (the set-up is broken).
        """
        n0 = len(self.engine.step_records)
        w0 = run_queue_wait_ns()
        self.engine.step()
        w1 = run_queue_wait_ns()
        self.last_wait_ns = None if w0 is None or w1 is None else w1 - w0
        if len(self.engine.step_records) == n0:
            raise RuntimeError("calibration step scheduled nothing")
        return self.engine.step_records[-1]

    def chunk_step(self, n: int, c: int):
        """Prefill ``n`` fresh tokens after the cached ``c``-token prefix, one real step."""
        self.cache_prefix(c)
        self.add(self.prefix(c) + self.tokens(n), 1)
        return self.step()


def _check(cell: Cell, rec, n: int | None = None) -> None:
    """The measured step has the shape the cell asks for, its chunk ``n`` tokens (default
    the cell's; else the set-up is broken)."""
    got = (record_features(rec)["prefills"], rec.num_decodes)
    if got != _shape_of(cell, n):
        raise RuntimeError(f"{cell.key}: engine ran chunks {got[0]!r} with {got[1]} decodes "
                           f"instead")


# == the measurement run ======================================================================

@dataclass
class GridRun:
    """What :func:`measure_grid` did: ``measured`` new rows, ``skipped`` rows already in the
    CSV, ``cells`` measured, ``seconds`` of wall time, ``retried`` disturbed steps measured
    again, ``kept_disturbed`` rows still disturbed after :data:`MAX_RETRIES` tries."""

    measured: int = 0
    skipped: int = 0
    retried: int = 0
    kept_disturbed: int = 0
    cells: list = field(default_factory=list)
    seconds: float = 0.0


def _groups(cells: Iterable[Cell]):
    """Visit order: prefill cells by context; decode and mixed cells by (B, L, s, g)."""
    groups: dict = {}
    for cell in cells:
        key = ("p", cell.c) if cell.kind == "prefill" else ("d", cell.B, cell.L, cell.s, cell.g)
        groups.setdefault(key, []).append(cell)
    return list(groups.items())


def served_layout(engine, seed: int = 0) -> None:
    """Scatter ``engine``'s free KV blocks (:meth:`simulator.policy.kv_cache.BlockPool.scatter`)
    before measuring, so that steps read their blocks as served steps do.

    A served request's block table is scattered whether the engine is fresh or has run for
    hours: its prompt's blocks come chunk by chunk and its decode blocks one at a time,
    interleaved with every other running request's. On a CPU a decode step over scattered
    blocks runs up to ~10% slower than over the consecutive blocks a fresh pool hands a
    set-up request (the more KV a step reads, the more: ``benchmarks/results/kv_layout.md``),
    and a grid measured on a fresh pool priced a Poisson workload's served steps ×0.93 of
    their time, the same whether those were served on a fresh or a scattered pool.
    """
    engine.scheduler.kv.pool.scatter(seed)


def warm_up(engine, grid: Grid, cells: list[Cell], seed: int = 1) -> None:
    """Unrecorded steps of every kind before measuring: first calls allocate buffers and
    pick kernels, and would otherwise inflate the first cells' times."""
    d = _Driver(engine, seed)
    for cell in cells:   # cached contexts too: on cuda a new attention shape picks kernels
        if cell.kind == "prefill":
            d.chunk_step(cell.n, cell.c)
    dec = [c for c in cells if c.kind != "prefill"]
    if dec:
        big = max(dec, key=lambda c: c.B * c.L)
        rids = d.start_decodes(big.B, big.L)
        for _ in range(3):
            d.step()
        d.stop(rids)
    mixed = [c for c in cells if c.kind == "mixed"]
    if mixed:   # each chunk beside the decodes it was sized for (so the KV cache holds it)
        big = max(mixed, key=lambda c: c.B * c.L)
        rids = d.start_decodes(big.B, big.L)
        for cell in mixed:
            if (cell.B, cell.L) == (big.B, big.L):
                d.chunk_step(cell.n, cell.c)
        d.stop(rids)


def measure_grid(engine, grid: Grid, log: MeasurementLog, *, seed: int = 0,
                 progress: bool = True,
                 on_measure: Callable[[dict], None] | None = None) -> GridRun:
    """Measure every cell of ``grid`` ``grid.repeats`` times on ``engine``, appending rows to
    ``log`` as they are taken; rows already in ``log`` are skipped.

    Args:
        engine: an idle :class:`calibration.engine.LLMEngine` whose ``max_num_seqs`` and
            ``max_num_batched_tokens`` admit the grid's largest step.
        grid: what to measure. log: the CSV. seed: prompt contents.
        progress: show a rich progress bar (on stderr).
        on_measure: called with each new row after it is written.

    Returns:
        :class:`GridRun`.

    Raises:
        InputError: no cell of the grid fits the engine's max_model_len and KV cache.
        ValueError: the engine's max_num_batched_tokens / max_num_seqs admit no step of the
            grid's largest shape.
    """
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                               TimeRemainingColumn)

    from calibration.engine.attention import padding

    cfg = engine.config
    pieces = padding(cfg.device).pieces
    kv_tokens = (engine.num_gpu_blocks - 1) * cfg.block_size
    cells = grid.cells(cfg.block_size, engine.max_model_len, kv_tokens)
    if not cells:
        raise InputError("calibration grid: no cell fits max_model_len and the KV cache")
    if grid.max_chunk() + grid.max_batch() > cfg.max_num_batched_tokens \
            or grid.max_batch() + 1 > cfg.max_num_seqs:
        raise ValueError("engine max_num_batched_tokens / max_num_seqs too small for the grid")
    want = {c.key: grid.repeats * grid.rows_per_visit(c) for c in cells}
    todo = sum(max(0, want[k] - log.counts.get(k, 0)) for k in want)
    run = GridRun(skipped=sum(min(want[k], log.counts.get(k, 0)) for k in want),
                  cells=cells)
    t0 = time.perf_counter()
    if todo == 0:
        return run
    served_layout(engine, seed)
    warm_up(engine, grid, cells, seed + 1)
    d = _Driver(engine, seed)
    groups = _groups(cells)

    def measure(cell: Cell, p: int, take=None) -> None:
        """``take()`` runs one measured step (default: the chunk cell's chunk of pass
        ``p``, :func:`pass_chunk_tokens`); a disturbed one is taken again."""
        n = None
        if take is None:
            n = pass_chunk_tokens(cell.n, p, grid.repeats)
            take = lambda: d.chunk_step(n, cell.c)  # noqa: E731
        for attempt in range(MAX_RETRIES + 1):
            rec = take()
            if not disturbed(d.last_wait_ns, rec.duration_ns):
                break
            if attempt == MAX_RETRIES:
                run.kept_disturbed += 1
            else:
                run.retried += 1
                time.sleep(0.05)
        record(cell, p, rec, n)

    def record(cell: Cell, p: int, rec, n: int | None) -> None:
        _check(cell, rec, n)
        row = {"cell": cell.key, "kind": cell.kind, "pass": p,
               "duration_ns": rec.duration_ns, "execute_ns": rec.execute_ns,
               **record_features(rec)}
        log.append(row)
        run.measured += 1
        bar.advance(task)
        if on_measure is not None:
            on_measure(row)

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  disable=not progress, transient=False) as bar:
        task = bar.add_task("calibrating", total=todo)
        for p in range(grid.repeats):
            for key, members in groups:
                needs = [c for c in members
                         if log.counts.get(c.key, 0) < (p + 1) * grid.rows_per_visit(c)]
                if not needs:
                    continue
                bar.update(task, description=f"pass {p + 1}/{grid.repeats} {members[0].key}")
                if key[0] == "p":
                    for cell in needs:
                        measure(cell, p)
                    continue
                rids = d.start_decodes(*key[1:], extra_blocks=grid.extra_blocks(
                    members, p, pieces, cfg.block_size, engine.max_model_len, kv_tokens))
                d.step()  # the first full decode step after set-up is not measured
                for cell in needs:
                    if cell.kind == "decode":
                        left = (p + 1) * grid.rows_per_visit(cell) - log.counts.get(cell.key, 0)
                        for _ in range(left):
                            measure(cell, p, d.step)
                    else:
                        measure(cell, p)
                d.stop(rids)
    run.seconds = time.perf_counter() - t0
    return run


# == wake-up after idle =======================================================================

#: Idle times (seconds) after which ``calibrate`` times the first step: a served engine
#: idles between arrivals from milliseconds to seconds at low load.
IDLE_GAPS_S = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
#: The step timed: one prefill chunk of this many tokens, nothing cached (a grid cell's
#: shape; the first step after idle is a new request's prefill).
IDLE_STEP_TOKENS = 64
#: Passes over :data:`IDLE_GAPS_S` at most (each waits 4.4 s in all).
IDLE_PASSES = 4


def measure_idle(step: Callable[[], int], gaps=IDLE_GAPS_S, repeats: int = 3,
                 sleep: Callable[[float], None] = time.sleep) -> dict:
    """What the first step after idling costs on top of the same step back to back
    (:class:`simulator.cost_model.IdleInfo`).

    For each of ``repeats`` passes and each gap ``g``: one step to warm up again, one step
    back to back (the reference), ``sleep(g)`` (the engine waits for work as the replay
    loop does), the same step again; the extra is its time less the reference's. Per gap,
    the median over passes, at least 0 and non-decreasing in ``g`` (a longer wait cools
    at least as much; the median's noise is not a faster wake-up).

    Args:
        step: runs one step of a fixed shape; returns its duration in ns.
        gaps: idle times, seconds, ascending. repeats: passes (>= 1).

    Returns:
        ``{"gaps_s", "extra_s", "reference_s"}`` (seconds; the reference the median of
        every pass's back-to-back step).
    """
    ref, extra = [], {g: [] for g in gaps}
    for _ in range(repeats):
        for g in gaps:
            step()
            r = step()
            sleep(g)
            extra[g].append(step() - r)
            ref.append(r)
    med = np.maximum.accumulate(np.maximum(0.0, [np.median(extra[g]) for g in gaps]))
    return {"gaps_s": [float(g) for g in gaps], "extra_s": [float(x) / 1e9 for x in med],
            "reference_s": float(np.median(ref)) / 1e9}


def idle_step(engine, seed: int = 0) -> Callable[[], int]:
    """The step :func:`measure_idle` times on ``engine`` (idle, as after
    :func:`measure_grid`): a :data:`IDLE_STEP_TOKENS`-token prefill of fresh tokens; each
    call runs one and returns its duration in ns."""
    d = _Driver(engine, seed)
    return lambda: d.chunk_step(IDLE_STEP_TOKENS, 0).duration_ns


# == device ceilings ==========================================================================

def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_ceilings(device: str, dtype: str, quick: bool = False, matmul_n: int | None = None,
                     copy_bytes: int | None = None) -> tuple[float, float]:
    """The device's achievable FLOP/s and bytes/s in ``dtype``.

    FLOP/s: the best of several square matmuls ``n × n @ n × n`` (``2·n³`` FLOPs; default
    n = 2048 on cpu, 8192 on cuda). Bytes/s: the best of several copies of a tensor far
    larger than the caches (default 256 MiB on cpu, 2 GiB on cuda), counting the read and
    the write (``2 · size``), as STREAM's copy does.
    """
    import torch

    from calibration.engine.weights import parse_dtype

    dt = parse_dtype(dtype)
    cuda = device.startswith("cuda")
    n = matmul_n or (8192 if cuda else 2048)
    reps = 3 if quick else 5
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    flops = 2 * n ** 3 / best
    del a, b
    nbytes = copy_bytes or ((2 << 30) if cuda else (256 << 20))
    x = torch.empty(nbytes // dt.itemsize, dtype=dt, device=device).fill_(1)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        y.copy_(x)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return flops, 2 * nbytes / best


def cpu_name() -> str:
    """``model name`` of the first CPU in ``/proc/cpuinfo`` (or ``platform.processor()``)."""
    import platform
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


#: CPU flags (``/proc/cpuinfo``) that decide how fast oneDNN runs a dtype's matmuls: the
#: bfloat16 and float16 paths first, then the vector width (bfloat16 is emulated without
#: AVX512: calibration.cli.warn_if_emulated).
_ISA = (("amx_bf16", "AMX-BF16"), ("avx512_fp16", "AVX512-FP16"),
        ("avx512_bf16", "AVX512-BF16"))
_WIDTH = (("avx512f", "AVX512"), ("avx2", "AVX2"))


def cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The matmul instruction sets of the first CPU (``"AVX512-BF16"``, ``"AMX-BF16,
    AVX512-FP16, AVX512-BF16"``, ``"AVX2"``): its bfloat16/float16 extensions, else its
    widest vector set; ``""`` when ``cpuinfo`` says none of them or cannot be read."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in
                      Path(cpuinfo).read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        return ""
    found = [name for flag, name in _ISA if flag in flags]
    return ", ".join(found) or next((name for flag, name in _WIDTH if flag in flags), "")


def memory_bytes(device: str) -> int:
    """Total memory of the device (host RAM for cpu)."""
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    from simulator.run import host_memory_bytes
    return host_memory_bytes()


__all__ = ["CONTEXT_SPREAD", "CPU_SHARED_DECODES", "CSV_COLUMNS", "Cell", "decode_lengths",
           "disturbed", "Grid",
           "GridRun", "MAX_RETRIES", "MAX_WAIT_SHARE", "MeasurementLog", "check_resumable",
           "cpu_isa", "cpu_name",
           "default_grid", "least_max_model_len", "IDLE_GAPS_S", "IDLE_PASSES", "IDLE_STEP_TOKENS",
           "idle_step", "measure_ceilings", "measure_grid", "measure_idle",
           "memory_bytes", "PLAN_FEATURES", "read_measurements", "record_features",
           "run_queue_wait_ns",
           "served_layout", "shares_prefixes", "warm_up"]
