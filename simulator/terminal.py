"""The command line's rich console.

A reader that goes away (``servesim run … | head -1``) ends a command as a
``BrokenPipeError``, which :func:`simulator.cli.main` turns into exit status 0, as for the
commands that print plain text; rich's own handler (``Console.on_broken_pipe``) exits 1.
"""

from rich.console import Console


class Terminal(Console):
    """A :class:`rich.console.Console` whose closed reader raises ``BrokenPipeError``."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the output is gone")
