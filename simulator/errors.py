"""The one error type for bad user input.

Anything raised as :class:`InputError` reaches the user as one line (``servesim: error:
<message>``) with exit status 2 and no traceback; the message must name the field, file
and line, or flag at fault and say what is allowed.
"""

from __future__ import annotations

import re
from typing import Sequence

from pydantic import ConfigDict

#: The pydantic config of every scenario schema: unknown keys are errors, no silent
#: coercion of "16" or true into numbers, and no .nan/.inf, which pass or fail bounds
#: checks by accident ("<= 1 (got nan)").
STRICT_SCHEMA = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

#: Longest run of non-space characters an error line shows whole (a path is shorter).
MAX_WORD = 200


class InputError(ValueError):
    """Bad user input: scenario YAML, ``--set`` override, trace row, CLI flag, profile."""


class KeyedInputError(InputError):
    """Bad input at a known scenario key, raised by a loader that knows the key but not
    where its value came from (the file's line or a ``--set`` flag); the scenario prefixes
    it with that through :meth:`simulator.scenario.Scenario.error`.

    Attributes:
        key: dotted key path (``workload.trace.path``, ``model.hidden_size``).
        detail: what is wrong and what is allowed, without the key.
        depends: further dotted key paths the error follows from (a window that keeps no
            request depends on the trace file and its time_scale too).

    ``str()`` is ``message`` when given (a loader's own wording for callers without a
    scenario), else ``"<key>: <detail>"``.
    """

    def __init__(self, key: str, detail: str, message: str | None = None,
                 depends: Sequence[str] = ()):
        super().__init__(message if message is not None else f"{key}: {detail}")
        self.key, self.detail, self.depends = key, detail, tuple(depends)

    def __reduce__(self):   # a worker process sends it back whole (args holds the line only)
        return type(self), (self.key, self.detail, str(self), self.depends)


class DoesNotFit(InputError):
    """A valid scenario whose model and KV cache do not fit the GPU's memory (no room for a
    KV cache, or max_model_len beyond it): as vLLM, which refuses to start. A sweep shows
    such a point as a row (``does not fit``) beside the points that run.

    Attributes:
        detail: what does not fit and what to change, without the file, line or key.
    """

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail

    def __reduce__(self):   # a worker process sends it back whole (args holds the line only)
        return type(self), (str(self), self.detail)


class Refused(InputError):
    """A scenario whose settings are each valid but that vLLM refuses to start with together
    (max_num_batched_tokens below max_num_seqs, or below max_model_len with chunked prefill
    off; a tensor_parallel that does not divide the heads; ...). A sweep or plan shows such
    a point as a row (``invalid config``) beside the points that run.

    Attributes:
        detail: the key and why, without the file, line or flag.
        scenario: the scenario as read (every field set; None once sent from a worker).
    """

    def __init__(self, message: str, detail: str, scenario=None):
        super().__init__(message)
        self.detail, self.scenario = detail, scenario

    def __reduce__(self):   # a worker process sends it back without the scenario
        return type(self), (str(self), self.detail)


class KeyedDoesNotFit(KeyedInputError):
    """:class:`DoesNotFit` at a known key, before the scenario names its line or flag."""


class SubkeyError(ValueError):
    """A schema validator's error about one key of the mapping it checks as a whole (a
    before-validator): the error line names ``<mapping>.<key>`` and that key's line.
    ``key``: one key (a dotted plan candidate key is one key), or a tuple of keys below."""

    def __init__(self, key: str | tuple[str, ...], message: str):
        super().__init__(message)
        self.key = key


def one_line(message: str) -> str:
    """``message`` as the one line the CLI prints (``"invalid input"`` when blank): control
    characters escaped (``\\n``, ``\\t``, ``\\x1b``: a value echoed from a flag may hold
    them, and its first line alone would lose the reason), with every run of more than
    :data:`MAX_WORD` non-space characters (a 10,000-digit value echoed from a flag or a
    file) cut to its first 60 characters and its length (and its closing ``:``, ``,``,
    ``;`` or ``)``), so that the error stays readable."""
    def cut(m: re.Match) -> str:
        word = m[0]
        return f"{word[:60]}… ({len(word):,} characters){word[-1] if word[-1] in ':,;)' else ''}"

    # an echoed value's newline or escape is shown as \n, \x1b: the line stays one line
    line = _CONTROL.sub(_escape, message.strip()) or "invalid input"
    return re.sub(rf"\S{{{MAX_WORD + 1},}}", cut, line)


#: Characters an error line shows escaped: C0/C1 controls (a terminal escape, a tab) and the
#: bidirectional overrides that would reorder what follows them on the terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    return m[0].encode("unicode_escape").decode("ascii")
