"""The ``servesim`` console script.

Until :func:`simulator.cli.main` takes over, Ctrl-C or SIGTERM is only noted here: Python's
own SIGINT handler would raise KeyboardInterrupt inside the imports of the command-line
modules (a traceback, or another error that an import turns it into), and SIGTERM would
kill the process without a word. :func:`simulator.cli.main` then stops with its one line.
"""

import signal
import sys

_noted: list[int] = []


def _note(signum, frame) -> None:
    _noted.append(signum)


def main() -> int:
    """Note SIGINT and SIGTERM (each unless ignored at start), then run
    :func:`simulator.cli.main`; returns its exit status."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _note)
    from .cli import main as run   # imports for a tenth of a second or more
    return run(noted=_noted)


if __name__ == "__main__":
    sys.exit(main())
