"""File input and output: atomic writes (a reader sees the old file or the whole new one,
never half of it), YAML reading that refuses duplicate keys and reads YAML 1.2 floats, JSON
reading that refuses duplicate keys, key lines (:func:`yaml_line`), and CSV rows with the
file line each starts on (:func:`read_csv_rows`)."""

from __future__ import annotations

import csv
import fnmatch
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Hashable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import InputError

#: Called just before a command's outputs are renamed into place (:func:`commit_outputs`).
#: The console script sets it to ignore Ctrl-C from then on, so that an interrupt either
#: leaves no output (exit 130) or lets the command finish (exit 0), never a whole report
#: under status 130. None (the default, and in-process callers such as tests): nothing.
on_commit = None


def commit_outputs() -> None:
    """Run :data:`on_commit`, if set: the caller is about to rename its outputs in place."""
    if on_commit is not None:
        on_commit()


#: Most characters aliases may add to a YAML document: each ``*name`` repeats its anchor's
#: whole value, so a few lines can stand for gigabytes ("billion laughs").
MAX_ALIAS_EXPANSION = 1_000_000


class AliasError(yaml.composer.ComposerError):
    """Well-formed YAML whose anchors or aliases make a value no setting can be: an alias
    inside its own anchor (the value would hold itself), aliases adding more than
    :data:`MAX_ALIAS_EXPANSION` characters, an anchor given twice (PyYAML refuses it)."""


def _alias_blowup(root):
    """When aliases make the composed YAML tree ``root``, expanded, larger than its own
    nodes by more than :data:`MAX_ALIAS_EXPANSION` characters (a scalar counts its length,
    a collection 1 besides its items; an alias is its anchor's node itself, shared): the
    first node (depth first) that alone expands past that, to name its line; else None.
    Each distinct node is visited once, without recursion."""
    sizes: dict[int, int] = {}
    own = 0   # the tree without its aliases' repeats
    first = None
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            here = max(1, len(node.value)) if isinstance(node, yaml.ScalarNode) else 1
            own += here
            sizes[id(node)] = here + sum(sizes[id(k)] for k in kids)
            if first is None and sizes[id(node)] > MAX_ALIAS_EXPANSION:
                first = node
        elif id(node) not in sizes:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return first if sizes[id(root)] - own > MAX_ALIAS_EXPANSION else None


def echo(value) -> str:
    """``value`` as an error line shows what was given: text quoted (the string '4' is
    not the number 4), numbers as Python writes them (1e+30, nan), a float from 1e6 up with
    an exponent (1e+12), anything else as YAML writes it (null, true, [1, 2], {a: 1}); a
    long text, list or mapping by its size and start, so that the line stays one line (a
    list of a million values is not echoed whole)."""
    if isinstance(value, str) and len(value) > 80:
        return f"a text of {len(value):,} characters, {value[:40]!r}..."
    if isinstance(value, float) and 1e6 <= abs(value) < 1e16:
        # Python writes these in full (1000000000000.0 for 1e12); its shortest digits
        # with an exponent, as it writes larger ones
        import numpy as np
        return np.format_float_scientific(value, trim="-")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return repr(value)
    if isinstance(value, (list, dict)) and _more_values_than(value, 32):
        what, item = ("list", "value") if isinstance(value, list) else ("mapping", "key")
        return f"a {what} of {len(value):,} {item}{'' if len(value) == 1 else 's'}"
    return yaml.dump(value, Dumper=_PlainDumper, default_flow_style=True,
                     width=float("inf")).splitlines()[0]


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by aliases in full each time (``[[1], [1]]``), not as
    PyYAML's own anchors (``[&id001 [1], *id001]``)."""

    def ignore_aliases(self, data) -> bool:
        return True


def _more_values_than(value, n: int) -> bool:
    """Whether ``value`` (nested lists and mappings) holds more than ``n`` values or texts
    of over 80 characters; stops counting past ``n``."""
    todo, seen = [value], 0
    while todo:
        v = todo.pop()
        seen += 1
        if seen > n or (isinstance(v, str) and len(v) > 80):
            return True
        if isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            todo += v
    return False


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (plain PyYAML keeps the last value silently, so a typo'd override would go unseen)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._open_anchors: set[str] = set()   # anchors of the collections being composed

    # An alias inside its own anchor (``&a [1, *a]``) makes a value that holds itself: no
    # setting is one, and its echo would be PyYAML's ``&id001 [1, *id001]``.
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise AliasError(
                    None, None, f"the alias *{event.anchor} is inside its own anchor "
                    f"&{event.anchor}: the value would contain itself", event.start_mark)
        return super().compose_node(parent, index)

    def compose_sequence_node(self, anchor):
        return self._composing(anchor, super().compose_sequence_node)

    def compose_mapping_node(self, anchor):
        return self._composing(anchor, super().compose_mapping_node)

    # Aliases repeat their anchor's whole value: nine levels of ten ("billion laughs") are
    # a billion values, which any walk over them (a repr, a validation) exhausts memory on.
    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        big = _alias_blowup(node)
        if big is not None:
            raise AliasError(
                None, None, f"aliases (*name) expand this value past "
                f"{MAX_ALIAS_EXPANSION:,} characters, each repeating its anchor's whole "
                f"value; no setting needs that much", big.start_mark)
        return self.construct_document(node)

    def _composing(self, anchor, compose):
        self._open_anchors.add(anchor)
        try:
            return compose(anchor)
        finally:
            self._open_anchors.discard(anchor)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue   # "<<: *base": merged by SafeLoader, whose keys a mapping overrides
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue               # PyYAML itself refuses these below
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        # Integers as YAML 1.2's core schema reads them (010 is ten, not YAML 1.1's octal
        # eight; 0o10 is eight; base 60, 1:30 = 90 in YAML 1.1, is text), keeping YAML
        # 1.1's readable 100_000 and 0b101.
        value = node.value
        body = value.lstrip("+-")
        if ":" in value:
            return self.construct_scalar(node)
        # Python refuses to read integers of more than 4300 digits (sys.int_info)
        try:
            if body[:2] in ("0o", "0O"):
                return int(value.replace(body[:2], "", 1), 8)
            if body[:1] == "0" and body[1:2] and body[1:2] in "0123456789_":
                return int(value.replace("_", ""), 10)
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} digits (no setting needs "
                f"one that long)", node.start_mark) from None


# PyYAML resolves floats by YAML 1.1, which wants a dot and a signed exponent: ``1e30``,
# ``1E-3``, ``+1e5`` and ``1.5e3`` would stay strings. These are floats in YAML 1.2's core
# schema (yaml.org/spec/1.2.2, 10.2.1.4) and in JSON; plain integers and dotted numbers
# keep PyYAML's own resolvers.
_FLOAT_WITH_EXPONENT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$")
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_WITH_EXPONENT,
                                       list("-+.0123456789"))
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^0[oO][0-7]+$"),
                                       ["0"])   # YAML 1.2's octal
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor(   # base 60 floats (1:30.5) are text too, as in YAML 1.2
    "tag:yaml.org,2002:float",
    lambda loader, node: loader.construct_scalar(node) if ":" in node.value
    else loader.construct_yaml_float(node))
# YAML 1.2's core schema has no timestamps: an unquoted 2026-12-01 stays the text it is
# (PyYAML's YAML 1.1 resolver makes it a date, and 2026-13-01 a ValueError in the parser).
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp",
                                 lambda loader, node: loader.construct_scalar(node))


def load_yaml(text: str):
    """Parse YAML text safely (``yaml.safe_load``), refusing duplicate mapping keys.

    Numbers with an exponent resolve as YAML 1.2 floats (``1e30``, ``1E-3``, ``+1e5``,
    ``1.5e3``), which PyYAML's YAML 1.1 rules leave as strings; integers are YAML 1.2's
    (``010`` is 10, ``0o10`` is 8, base 60 ``1:30`` stays a string) with YAML 1.1's
    ``1_000`` and ``0b11`` kept; timestamps stay strings (YAML 1.2 has none); merge keys
    (``<<: *base``) merge, a key given beside them overriding; everything else resolves as
    in ``yaml.safe_load``.

    Raises:
        yaml.YAMLError: a syntax error or a duplicate key (``problem_mark`` gives the line),
            or collections nested too deeply for the parser (a RecursionError in PyYAML);
            :class:`AliasError` for an alias inside its own anchor, aliases adding more
            than :data:`MAX_ALIAS_EXPANSION` characters, or an anchor given twice.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:   # '[' * 500: PyYAML's composer recurses once per level
        raise yaml.YAMLError("collections nested too deeply") from None
    except yaml.composer.ComposerError as e:   # PyYAML's own words: "second occurrence"
        anchor = re.fullmatch(r"found duplicate anchor '(.*)'; first occurrence", e.context or "")
        if anchor is None or e.context_mark is None:
            raise
        raise AliasError(None, None, f"the anchor &{anchor[1]} is given twice (first on line "
                         f"{e.context_mark.line + 1}); give each anchor its own name",
                         e.problem_mark) from None


def yaml_error_text(source: str, e: yaml.YAMLError, text: str | None = None) -> str:
    """One line for a YAML syntax error in file ``source``: ``"<source>:LINE: YAML syntax
    error: <problem>"``. An unclosed ``{``, ``[`` or quote is only noticed where the text
    goes on, so the line where that flow collection or quoted scalar starts is added when
    it is an earlier one (PyYAML's ``context_mark``). ``text``: the YAML read, which places
    a character the reader refuses (a NUL or a BEL: PyYAML gives only its position)."""
    mark = getattr(e, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    if isinstance(e, yaml.reader.ReaderError) and text is not None:
        where = f"{source}:{text.count(chr(10), 0, e.position) + 1}"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if problem == "but found another document":   # PyYAML's wording is a fragment
        problem = "a second YAML document ('---'): the file must hold one (one per file)"
    context, start = getattr(e, "context", None) or "", getattr(e, "context_mark", None)
    what = re.sub(r"^while (parsing|scanning) an? ", "", context)
    if (what.startswith(("flow ", "quoted ")) and start is not None and mark is not None
            and start.line < mark.line):
        problem += f" (in the {what} that starts at line {start.line + 1})"
    return f"{where}: YAML {'' if isinstance(e, AliasError) else 'syntax '}error: {problem}"


class DuplicateKeyError(ValueError):
    """A JSON object gives one key twice. ``key``; ``line`` (1-based) of its second
    occurrence, or None when it cannot be placed."""

    def __init__(self, key: str, line: int | None):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line = key, line


def _refuse_duplicates(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise DuplicateKeyError(k, None)
        seen.add(k)
    return dict(pairs)


def load_json(text: str):
    """Parse JSON text (``json.loads``), refusing a key given twice in one object (plain
    ``json`` keeps the last value silently).

    Raises:
        json.JSONDecodeError: a syntax error (``lineno`` gives the line), or arrays and
            objects nested too deeply for the parser (a RecursionError in ``json``).
        DuplicateKeyError: a duplicate key, with the line of its second occurrence.
    """
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except RecursionError:   # '[' * 3000, as load_yaml's
        raise json.JSONDecodeError("arrays or objects nested too deeply", text, 0) from None
    except DuplicateKeyError as e:
        # json reports no position; JSON is YAML flow syntax, and the YAML loader's
        # duplicate-key error carries the line (None if it cannot read the text).
        line = None
        try:
            load_yaml(text)
        except yaml.MarkedYAMLError as y:
            if y.problem == f"duplicate key {e.key!r}" and y.problem_mark is not None:
                line = y.problem_mark.line + 1
        raise DuplicateKeyError(e.key, line) from None


def yaml_line(text: str, path: Sequence) -> int | None:
    """1-based line of key path ``path`` (mapping keys and list indices, as in a pydantic
    error ``loc``) in the YAML document ``text``, found through PyYAML's node marks.

    The line is that of the last key (or list item) of ``path`` that the document holds:
    a present key gives its own line, a missing one its parent's. ``None`` when not even
    the first part is in the document, or ``text`` does not parse.
    """
    return yaml_where(text, path)[0]


def yaml_where(text: str, path: Sequence) -> tuple[int | None, int]:
    """``(line, depth)`` of key path ``path`` in the YAML document ``text``: the line as
    :func:`yaml_line` gives it, and how many leading parts of ``path`` the document holds
    (``len(path)``: all of it; 0 when not the first, or ``text`` does not parse)."""
    try:
        node = yaml.compose(text, Loader=_UniqueKeyLoader)  # noqa: S506 (safe: no objects)
    except yaml.YAMLError:
        return None, 0
    line, depth = None, 0
    for part in path:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value
                        if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and str(part).isdigit() \
                and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
        depth += 1
    return line, depth


def yaml_key_line(text: str, path: Sequence, key) -> int | None:
    """1-based line of the key that YAML reads as ``key`` (a number, boolean or null: a
    key not written as text) in the mapping at key path ``path`` (``()``: the top level)
    of the YAML document ``text``; ``None`` when the document has no such key there."""
    try:
        node = yaml.compose(text, Loader=_UniqueKeyLoader)  # noqa: S506 (safe: no objects)
    except yaml.YAMLError:
        return None
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value
                     if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
    if not isinstance(node, yaml.MappingNode):
        return None
    read = yaml.SafeLoader("")
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode):
            try:
                value = read.construct_object(k)
            except yaml.YAMLError:
                continue
            if type(value) is type(key) and value == key:   # True is not 1
                return k.start_mark.line + 1
    return None


def name_too_long(path: str | Path) -> bool:
    """Whether ``path`` has a name longer than its file system takes (``NAME_MAX``, 255
    bytes on Linux) in a part not yet made, or is longer than ``PATH_MAX`` in all: the
    kernel refuses such a path (``ENAMETOOLONG``, which ``Path.exists()`` and
    ``is_file()`` raise), or, below a folder still to be made, reports only "not found"."""
    p = Path(os.path.abspath(path))
    existing = p
    while True:
        try:
            if existing.exists():
                break
        except OSError:   # itself too long: look further up
            pass
        existing = existing.parent
    name_max = os.pathconf(existing, "PC_NAME_MAX")
    return (len(os.fsencode(str(p))) >= os.pathconf(existing, "PC_PATH_MAX")
            or any(len(os.fsencode(part)) > name_max
                   for part in p.relative_to(existing).parts))


def utf8_problem(path: Path, raw: bytes | None = None) -> str:
    """``"<path>:<line>: not UTF-8 text (byte 0x.. at column N; save the file as UTF-8)"``
    for a file that does not decode: the first bad byte's line, which a decoder reading
    in chunks (pandas, a file iterator) does not give. ``raw``: the file's bytes, where
    they were read already (a pipe cannot be read twice)."""
    raw = path.read_bytes() if raw is None else raw
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        # CR, LF and CR LF each end a line, as YAML and the CSV reader count them
        before = raw[:e.start].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        line = before.count(b"\n") + 1
        # in characters, as an editor counts them (the line's text before it is UTF-8)
        col = len(before[before.rfind(b"\n") + 1:].decode("utf-8-sig" if line == 1
                                                           else "utf-8")) + 1
        return (f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col}; "
                f"save the file as UTF-8)")
    return f"{path}: not UTF-8 text (save the file as UTF-8)"


def no_column_line(path: Path) -> str:
    """Why a CSV that :func:`read_csv_rows` found no column line in is not a table:
    ``empty`` (0 bytes), ``no column line, only blank lines`` or ``no column line, only #
    lines`` (and blanks)."""
    data = Path(path).read_bytes()
    if not data:
        return "empty"
    return "no column line, only " + ("blank" if not data.strip() else "#") + " lines"


@dataclass(frozen=True)
class CsvRows:
    """A CSV's rows as text, each with the file line it starts on (lines numbered from 1),
    for errors that name a row's line.

    Attributes:
        name: the file as errors name it. columns: the column line's fields ([] when the
        file holds no line but comments and blanks). column_line: its file line (0 then).
        rows: each data row's fields, as text. lines: the file line each row starts on.
    """

    name: Path
    columns: list[str]
    column_line: int
    rows: list[list[str]]
    lines: list[int]

    def width_problem(self) -> str | None:
        """``"<file line>: <n> fields where the column line has <m>"`` for the first row
        whose field count is not the column line's, else None (pandas would pad a short
        row, a line cut off, with empty fields and blame the first of them, or read a long
        one as shifted)."""
        for n, row in zip(self.lines, self.rows):
            if len(row) != len(self.columns):
                return f"{n}: {len(row)} fields where the column line has {len(self.columns)}"
        return None

    def frame(self):
        """The rows as a ``pandas.DataFrame`` of text, one column per column-line field
        (rows of another width: :meth:`width_problem` first).

        Raises:
            InputError: ``"<name>:<column line>: column '<c>' appears twice"``.
        """
        import pandas as pd

        seen = set()
        for c in self.columns:
            if c in seen:
                raise InputError(f"{self.name}:{self.column_line}: column {c!r} appears twice")
            seen.add(c)
        return pd.DataFrame(self.rows, columns=self.columns, dtype=str)


def read_csv_rows(path: Path, name: Path | None = None) -> CsvRows:
    """Read the CSV at ``path``: where a row would start, lines that begin with ``#``
    (servesim's header of run facts) and blank lines are skipped; a byte order mark too.
    Unlike ``pandas``'s ``comment="#"``, a ``#`` inside a field is text, and a quoted field
    may hold line breaks, blank lines and lines that begin with ``#`` (its row is named by
    the line it starts on). CR, LF and CR LF each end a line.

    Raises:
        InputError: :func:`utf8_problem`'s line; ``"<name>:<line>: a quoted field that
            starts on this row is never closed ..."``; or ``"<name>:<line>: not CSV
            (<why>)"`` (text after a closing quote, a field over the csv module's limit of
            131072 characters); naming ``name`` (default ``path``) and the row's first line.
        OSError: as ``open``.
    """
    name = name or path
    kept: list[int] = []   # file line of each line handed to the reader
    at_start = True        # whether the reader asks for a row's first line

    def data(f):
        nonlocal at_start
        for n, line in enumerate(f, 1):
            # a comment or blank line where a row would start; inside a quoted field, text
            if at_start and (not line.strip() or line.startswith("#")):
                continue
            at_start = False
            kept.append(n)
            yield line

    rows, lines = [], []
    first = 0
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(data(f), strict=True)
            while True:
                first, at_start = len(kept), True   # the next line read is the row's first
                try:
                    row = next(reader)
                except StopIteration:
                    break
                rows.append(row)
                lines.append(kept[first])
    except UnicodeDecodeError:
        raise InputError(utf8_problem(name, path.read_bytes())) from None
    except csv.Error as e:
        line = kept[first] if first < len(kept) else 1
        if str(e) == "unexpected end of data":   # the file ends inside a quoted field
            raise InputError(f"{name}:{line}: a quoted field that starts on this row is "
                             "never closed (no second '\"')") from None
        raise InputError(f"{name}:{line}: not CSV ({e})") from None
    if not rows:
        return CsvRows(name, [], 0, [], [])
    return CsvRows(name, rows[0], lines[0], rows[1:], lines[1:])


def read_small_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of ``path`` (a file, or a pipe such as ``<(...)``), read once and at
    most ``limit`` bytes of it: a device like /dev/zero would otherwise be read until
    memory runs out.

    Raises:
        InputError: ``"<path>: larger than <limit in MiB> MiB: not a <what>"`` (``"<path>:
            a device, not a <what>"`` for one such as /dev/zero), or :func:`utf8_problem`'s
            line.
        OSError: as ``open`` (not found, no permission, a folder).
    """
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
        device = stat.S_ISCHR(os.fstat(f.fileno()).st_mode)
    if len(raw) > limit:
        raise InputError(f"{path}: a device, not a {what}" if device else
                         f"{path}: larger than {limit // 2**20} MiB: not a {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(utf8_problem(path, raw)) from None


def scenario_path(path: str | Path, base_dir: str | Path) -> Path:
    """A path a scenario gives (a trace, a model, a profile, an empirical distribution):
    ``~`` expanded, then relative to ``base_dir`` (the scenario file's folder) unless
    absolute."""
    return Path(base_dir) / Path(path).expanduser()


def is_regular_file(path: Path) -> bool:
    """``path.is_file()``, False for a path the kernel refuses (a name too long)."""
    try:
        return path.is_file()
    except OSError:
        return False


def missing_file(path: Path) -> str:
    """Why ``path`` (not a regular file) cannot be read as one: ``"name too long for the
    file system"``, ``"is a folder, not a file"``, ``"not a regular file"`` (a device
    such as /dev/null, a pipe, a socket) or ``"file not found"``."""
    if name_too_long(path):
        return "name too long for the file system"
    if path.is_dir():
        return "is a folder, not a file"
    return "not a regular file" if path.exists() else "file not found"


#: The file that marks a folder as one command's report. Reports share ``report.md`` and
#: ``report.html``, so one command writing into another's folder would leave a mix.
REPORT_MARKERS = {"run": "summary.json", "sweep": "sweep.json", "plan": "plan.json",
                  "compare": "compare.csv", "validate": "validation.json"}
#: The files (glob patterns) each command's report may hold: another file in a report's
#: folder is the user's, and a report written there would mix with it.
REPORT_FILES = {
    "run": ("summary.json", "requests.csv", "timeseries.csv", "itl_runs.csv",
            "latency_cdf.png", "timeline.png", "batch.png", "report.md", "report.html",
            "replications.json", "diagnosis.json"),
    "sweep": ("sweep.json", "sweep.csv", "curves.png", "report.md", "report.html"),
    "plan": ("plan.json", "plan.csv", "pareto.png", "report.md", "report.html"),
    "compare": ("compare.csv", "latency_cdf.png", "report.md", "report.html"),
    "validate": ("validation.json", "validation.md", "validation.html", "cdf_load_*.png"),
}


def out_folder(arg: str | None, default: str | Path | Callable[[], Path],
               flag: str = "--out") -> Path:
    """The output folder given as ``flag`` (``arg``), or ``default`` when it is not given
    (a callable: called then only, so that a folder made from a scenario's name is checked
    only where the name becomes one: :meth:`simulator.scenario.Scenario.default_folder`).

    Raises:
        InputError: an empty path (``--out ""`` would mean the current folder), or ``-``
            (standard output).
    """
    if arg is None:
        return Path(default() if callable(default) else default)
    if not arg.strip():
        raise InputError(f"{flag}: empty path (give a folder, or leave {flag} out)")
    _not_stdout(arg, flag)
    return through_parents(Path(arg))


def _not_stdout(arg: str, flag: str) -> None:
    """Refuse ``-``, the shell's name for standard output, which would make a folder
    named ``-``; ``./-`` names such a folder when one is meant."""
    if arg == "-":
        raise InputError(f"{flag} -: standard output takes no report: give a folder (./- "
                         f"names one called -)")


def through_parents(p: Path) -> Path:
    """``p`` with its ``..`` resolved as the OS will once the folders above exist
    (``os.path.realpath``): ``new/../plan`` is ``plan``, whose report the checks must see
    (``new`` does not exist yet, so the path itself did not); ``p`` unchanged without
    ``..``, so that messages show it as given."""
    return Path(os.path.realpath(p)) if ".." in p.parts else p


def check_folder(path: str | Path, flag: str, kind: str | None = None, *,
                 named: str | Path | None = None) -> None:
    """Refuse, before any work, an output folder that cannot be one: ``path`` is a file, a
    folder above it is, the folder (else the nearest existing one above it, where it
    would be created) takes no new file, or, with ``kind`` (a key of
    :data:`REPORT_MARKERS`), it holds another command's report or files that are no
    ``kind`` report (any file but hidden ones in a folder without its marker file, else
    any not in :data:`REPORT_FILES`: the report's files would replace them by name or sit
    beside them). Creates nothing.
    ``named``: the path the flag was given when ``path`` is the folder of a file to write
    (``calibrate --out d/p.yaml`` checks ``d``); messages name it instead of ``path``.

    Raises:
        InputError: ``<flag>: empty path``, ``<flag> -: standard output takes no report``
            (``-``, the shell's name for it), ``<flag> <path>: <which> is a file, not a
            folder``, ``<flag> <path>: cannot write there (<reason>)`` (no permission, a
            name too long for the file system) or ``<flag> <path>: holds a <command>
            report ...``, ``<flag> <path>: holds files that are not a <kind> report
            (<names>) ...`` or ``<flag> <path>: holds a folder named <file> ...`` (a file
            the report writes).
    """
    if not str(path).strip():   # Path("") would be the current folder
        raise InputError(f"{flag}: empty path (give a folder)")
    if isinstance(path, str):   # as typed: Path("./-") reads "-" too
        _not_stdout(path, flag)
    p = through_parents(Path(path))
    shown = path if named is None else named
    if name_too_long(p):   # before mkdir would make the folders above it, then fail
        raise InputError(f"{flag} {shown}: cannot write there (File name too long)")
    try:
        _check_folder(p, shown, flag, kind, it=p if named is None else None)
    except OSError as e:
        raise InputError(f"{flag} {shown}: cannot write there ({e.strerror})") from None


def _check_folder(p: Path, shown, flag: str, kind: str | None, it: Path | None) -> None:
    other = next((k for k, f in REPORT_MARKERS.items()
                  if kind is not None and k != kind and (p / f).is_file()), None)
    if other is not None:
        raise InputError(f"{flag} {shown}: holds a {other} report ({REPORT_MARKERS[other]}); "
                         f"a {kind} report there would mix with it: give another folder")
    if kind is not None and p.is_dir():
        # a report replaces its files by name: a user's requests.csv or report.md there
        # would be lost, and any other file would sit beside the report as if part of it
        # (hidden files and subfolders are left alone and never collide)
        report = (p / REPORT_MARKERS[kind]).is_file()
        # a folder where the report writes a file: the write would fail after the run
        blocked = sorted(f.name for f in p.iterdir() if f.is_dir() and any(
            fnmatch.fnmatch(f.name, pat) for pat in REPORT_FILES[kind]))
        if blocked:
            raise InputError(f"{flag} {shown}: holds a folder named {blocked[0]}, a file the "
                             f"{kind} report writes; move it, or give another folder")
        mine = sorted(f.name for f in p.iterdir() if not f.name.startswith(".")
                      and not f.is_dir() and not (report and any(
                          fnmatch.fnmatch(f.name, pat) for pat in REPORT_FILES[kind])))
        if mine:
            listed = ", ".join(mine[:3]) + (f" and {len(mine) - 3} more" if len(mine) > 3
                                            else "")
            raise InputError(
                f"{flag} {shown}: holds a {kind} report and files that are not part of it "
                f"({listed}); move them, or give another folder" if report else
                f"{flag} {shown}: holds files that are not a {kind} report ({listed}); give "
                f"a new or empty folder, or an earlier {kind} report's folder to replace it")
    for q in (p, *p.parents):
        which = "it" if q == it else q   # "it": the path the flag named
        if q.is_symlink() and not q.exists():   # found only when writing, after the run
            raise InputError(f"{flag} {shown}: {which} is a broken symbolic link (to "
                             f"{os.readlink(q)})")
        if q.exists():
            if not q.is_dir():
                raise InputError(f"{flag} {shown}: {which} is a file, not a folder")
            tempfile.TemporaryFile(dir=q).close()   # OSError: check_folder says why
            return


def check_writable(path: str | Path, flag: str) -> None:
    """Create folder ``path`` if missing and make sure a file can be written in it, before
    a long run that writes there at its end.

    Raises:
        InputError: ``<flag> <path>: cannot write there (<reason>)``.
    """
    check_folder(path, flag)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot write there ({e.strerror})") from None


def check_file_writable(path: str | Path, flag: str) -> None:
    """Make sure file ``path`` can be written, before a long run that writes it at its end:
    a new or regular file in a folder that exists and takes a new file (tried: a permission
    check passes anywhere for root, /proc included); it leaves nothing behind.

    Raises:
        InputError: ``<flag>: empty path``, or ``<flag> <path>: a file path in a folder that
            exists and can be written`` (not a regular file: a folder, /dev/null).
    """
    if not str(path).strip():
        raise InputError(f"{flag}: empty path (give a file path)")
    p = Path(path)
    try:
        if (p.exists() and not p.is_file()) or not p.parent.is_dir():
            raise OSError
        tempfile.TemporaryFile(dir=p.parent).close()   # as atomic_write makes its file there
    except OSError:
        raise InputError(f"{flag} {path}: a file path in a folder that exists and can be "
                         f"written") from None


@contextmanager
def removed_if_left_empty(*folders: str | Path | None):
    """Remove again, when the block raises (Ctrl-C included), the folders among ``folders``
    (None skipped) and the parents made with them that did not exist before it and that
    it left empty: a command stopped before writing leaves nothing behind."""
    made = [[p, *(q for q in p.parents)] for p in (Path(f) for f in folders if f)]
    made = [[p for p in chain if not p.exists()] for chain in made]   # deepest first
    try:
        yield
    except BaseException:
        for chain in made:
            for p in chain:
                try:
                    p.rmdir()   # only if empty: a resumable CSV written there stays
                except OSError:
                    break
        raise


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The folder is created if missing; the file gets ordinary permissions (0666 less the
    umask; ``mkstemp`` alone would leave 0600). On any error the temporary file is removed
    and ``path`` is left as it was.

    Raises:
        OSError: the folder or file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
