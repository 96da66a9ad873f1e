"""Atomic file output shared by every writer: nothing already written is lost on failure."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Write ``path`` through ``write(tmp)`` into a fresh name beside it, then rename.

    An existing file is replaced only by a complete new one; on any error (Ctrl-C included)
    the temporary file is removed and the old file is untouched, and the error raised is the
    one that stopped the write (an ``OSError`` naming the file system's reason), never one
    from the clean-up. The temporary file is
    created by ``write`` itself, so it gets the usual permissions (``0666 & ~umask``). A path
    that exists but is not a regular file (``/dev/null``, a FIFO) is written in place, never
    replaced: renaming over a device as root would destroy it.

    Parameters
    ----------
    path : str or PathLike
        The file to write.
    write : callable
        Called with the temporary path (a :class:`~pathlib.Path`); writes the whole content.

    Returns
    -------
    Path
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        write(path)
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    return path


def _remove_quietly(tmp: Path) -> None:
    """Remove a temporary file if it is there.

    A clean-up that fails (a read-only file system, a folder such as ``/proc`` that refuses even
    the look-up) must not hide the first error.
    """
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
