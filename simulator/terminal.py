"""The command line's rich console.

A reader of stdout that goes away (``servesim run … | head -1``) leaves the command to
finish: the rest of stdout goes to /dev/null and its warnings still reach stderr, and it
exits 0, as the commands that print plain text do (:func:`simulator.cli.main`); rich's own
handler (``Console.on_broken_pipe``) exits 1 at once, dropping those warnings.
"""

import os
import sys

from rich.console import Console


class Terminal(Console):
    """A :class:`rich.console.Console` that outlives a closed reader of stdout."""

    def on_broken_pipe(self) -> None:
        """Called by rich on ``BrokenPipeError`` writing to stdout: print nothing more
        through this console and point file descriptor 1 at /dev/null, without raising.

        Raises:
            OSError: /dev/null cannot be opened.
        """
        self.quiet = True   # as rich's handler, without its SystemExit(1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
