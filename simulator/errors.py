"""The one error type for bad user input.

Anything raised as :class:`InputError` reaches the user as one line (``servesim: error:
<message>``) with exit status 2 and no traceback; the message must name the field, file
and line, or flag at fault and say what is allowed.
"""


class InputError(ValueError):
    """Bad user input: scenario YAML, ``--set`` override, trace row, CLI flag, profile."""
