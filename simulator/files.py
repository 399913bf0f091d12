"""Atomic file output: a reader sees the old file or the whole new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
