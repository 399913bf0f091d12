"""The one error type for bad user input.

Anything raised as :class:`InputError` reaches the user as one line (``servesim: error:
<message>``) with exit status 2 and no traceback; the message must name the field, file
and line, or flag at fault and say what is allowed.
"""

from __future__ import annotations

from typing import Sequence


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
