"""Input checks shared by the public API: each raises ``ValueError`` naming the bad value."""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "NonFiniteError",
    "check_T",
    "check_finite",
    "check_n",
    "check_positive",
    "check_seed",
    "check_workers",
    "parse_float",
    "parse_integer",
]


def check_finite(name: str, value) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` if it is not a finite real."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def check_positive(name: str, value) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` unless it is finite and > 0."""
    value = check_finite(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def check_T(T, *, grid: bool = False) -> np.ndarray:
    """Validate sequence lengths: integers >= 1 (ints or integral floats).

    Parameters
    ----------
    T : int or array_like
        Sequence length(s).
    grid : bool
        If true, ``T`` must also be one-dimensional, non-empty and free of duplicates
        (a simulation sweep); it is returned sorted.

    Returns
    -------
    ndarray of int64
    """
    arr = np.asarray(T)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError(f"T must be integers >= 1, got {T!r}")
    if arr.size == 0:
        raise ValueError("T must not be empty")
    flat = arr.ravel()
    for t in flat:
        if not np.isfinite(t) or t != np.floor(t) or t < 1:
            raise ValueError(f"T must be integers >= 1, got {t.item()!r}")
    out = arr.astype(np.int64)
    if grid:
        out = out.ravel()
        uniq, counts = np.unique(out, return_counts=True)
        if np.any(counts > 1):
            raise ValueError(f"T grid has duplicate entries: {uniq[counts > 1].tolist()!r}")
        out = uniq
    return out


def check_n(n, *, minimum: int = 2) -> int:
    """Validate a number of draws: an integer >= ``minimum``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        if isinstance(n, float) and n.is_integer():
            n = int(n)
        else:
            raise ValueError(f"n must be an integer >= {minimum}, got {n!r}")
    if n < minimum:
        raise ValueError(f"n must be an integer >= {minimum}, got {n!r}")
    return int(n)


def check_workers(workers) -> int:
    """Validate a number of worker threads: an integer >= 1."""
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return int(workers)


def check_seed(seed) -> int:
    """Validate a seed: an integer >= 0 (``SeedSequence`` entropy); the one seed check."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


class NonFiniteError(ValueError):
    """A number that reads as a float but is not finite (``inf``, ``nan``): raised by :func:`parse_float`.

    A ``ValueError``, so callers that catch that still do; a caller with its own message for each
    case (not a number, not finite) tells the two apart by this class.
    """


def parse_float(raw: str, name: str, context: str = "") -> float:
    """Return the text ``raw`` as a finite float, or raise ``ValueError`` naming ``name`` and ``raw``.

    Parameters
    ----------
    raw : str
        A number in any notation :func:`float` reads (``1e6``, ``0.5``).
    name : str
        The option or field named in the error message.
    context : str
        Appended to the message, e.g. ``" in '1,x,3'"``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``raw`` is not a number; :class:`NonFiniteError` (a ``ValueError``) where it is one but
        not finite.
    """
    try:
        number = float(raw)
    except ValueError:
        raise ValueError(f"{name}: not a number: {raw!r}{context}") from None
    if not math.isfinite(number):
        raise NonFiniteError(f"{name}: values must be finite, got {raw!r}{context}")
    return number


def _integer_from_float(raw: str, name: str) -> int:
    number = parse_float(raw, name)
    if not number.is_integer():
        raise ValueError(f"{name}: {raw!r} is not an integer (integers are never rounded)")
    return int(number)


def parse_integer(text: str, *, name: str, minimum: int | None = None) -> int:
    """Read one integer typed by a user: the one rule of every integer option.

    Any notation of an exact integer is accepted (``1000000``, ``1e6``, ``1_000_000``,
    ``10.0``); a number with a fractional part (``1.5``) is refused, never rounded, and so
    are non-numbers, infinities and values below ``minimum``.

    Parameters
    ----------
    text : str
        What was typed.
    name : str
        The option, for the message (``"--n"``).
    minimum : int, optional
        Smallest value allowed.

    Returns
    -------
    int
        The value, exactly (``1e6`` gives ``1000000``).

    Raises
    ------
    ValueError
        Naming the option and the bad text, with the reason.
    """
    raw = str(text).strip()
    try:
        value = int(raw)
    except ValueError:
        value = _integer_from_float(raw, name)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: values must be integers >= {minimum}, got {raw!r}")
    return value
