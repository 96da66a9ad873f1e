"""JSON Lines input shared by every reader: plain or gzip text, one value per line, bad lines named.

A file whose name ends in ``.gz`` (any case) is read (and written) through :mod:`gzip`, any other
as plain text; both as UTF-8. Lines are streamed, never read whole, blank lines are skipped, and
Python's ``NaN``/``Infinity`` tokens are read as the floats they name. A line that is not JSON
(nested too deep for the parser included), a file that is not UTF-8 text, or a ``.gz`` that is
not an intact gzip stream, is a ``ValueError`` whose message names the file and the line: one
line on the command line, no traceback. Only JSON is ever parsed: nothing is unpickled.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["iter_jsonl", "open_text", "read_jsonl"]

#: What :mod:`gzip` raises for a stream that is not gzip, is cut short or is corrupt.
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def open_text(path: str | os.PathLike, mode: str = "r") -> IO[str]:
    """Open a text file as UTF-8, through gzip when its name ends in ``.gz``.

    Parameters
    ----------
    path : str or PathLike
    mode : {"r", "w", "a"}

    Returns
    -------
    file object
        A text stream; use it in a ``with`` block.
    """
    path = Path(path)
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, object]]:
    """Yield ``(line number, value)`` for each non-blank line of a JSON Lines file, streaming.

    Parameters
    ----------
    path : str or PathLike
        ``.jsonl``, ``.ndjson`` or any text file of JSON values, one a line; gzip when the
        name ends in ``.gz``.

    Yields
    ------
    (int, object)
        The 1-based line number and the parsed value (a dict for a JSON object; whatever JSON
        value the line holds otherwise: checking it is the caller's).

    Raises
    ------
    ValueError
        ``"NAME: line N: invalid JSON (reason)"`` for a line that is not JSON or is nested too
        deep for the parser, ``"NAME: not UTF-8 text (at or after line N)"`` for bytes that are
        not UTF-8, ``"NAME: not an intact gzip stream (at or after line N: reason)"`` for a
        ``.gz`` that is not gzip, is cut short or is corrupt.
    """
    path = Path(path)
    lineno = 0
    gz = path.name.lower().endswith(".gz")
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path.name}: line {lineno}: invalid JSON ({exc.msg})") from None
                except RecursionError:
                    raise ValueError(f"{path.name}: line {lineno}: invalid JSON (nested too deep)") from None
                yield lineno, value
    except UnicodeDecodeError:
        raise ValueError(f"{path.name}: not UTF-8 text (at or after line {lineno + 1})") from None
    except _GZIP_ERRORS as exc:
        if not gz:  # pragma: no cover - only gzip raises these
            raise
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"{path.name}: not an intact gzip stream (at or after line {lineno + 1}: {reason})"
        ) from None


def read_jsonl(path: str | os.PathLike) -> list:
    """Return the values of a JSON Lines file, one per non-blank line (:func:`iter_jsonl`).

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    list
    """
    return [value for _, value in iter_jsonl(path)]
