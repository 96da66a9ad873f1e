"""Command-line grid syntax: comma lists and ranges, linear or log-spaced.

A grid is a comma-separated list of *items*; each item is one of

=================  ==================================================================
item               values
=================  ==================================================================
``x``              the number ``x``
``a:b:N``          ``N`` points spaced linearly from ``a`` to ``b``, both included
``a:b:logN``       ``N`` points spaced evenly in ``log`` from ``a`` to ``b``, both
                   included (needs ``a > 0`` and ``b > 0``)
=================  ==================================================================

Examples: ``1,10,100,1000``; ``0.9:1.1:5`` (0.9, 0.95, 1, 1.05, 1.1);
``1:1000:log20``; ``0.01,0.1:1:4``.

The union of all items is returned sorted and without duplicates. Real values are
rounded to 12 significant digits, so that ``0.9:1.1:5`` gives ``0.95`` and not
``0.9500000000000001`` (cell identities in :mod:`variance_lab.sweep` hash these values).
Integer grids (sequence lengths ``T``, draws ``n``) follow the one integer rule of the
command line (:func:`variance_lab._validate.parse_integer`): a single value must be an exact
integer in any notation (``1e6`` is 1,000,000; ``1.5`` is refused with the reason, never
rounded), and so must the ends of a range; the points inside a range (``1:1000:log20``) are
rounded to the nearest integer, and neighbouring points that round to the same integer are
merged, so that range can give fewer than 20 lengths. Duplicates are merged and the values
sorted, whether they come from ranges or are typed twice (``10,10`` is one length).
"""

from __future__ import annotations

import re

import numpy as np

from variance_lab._validate import parse_float, parse_integer

__all__ = ["GRID_HELP", "parse_grid", "parse_int_grid", "parse_name_list"]

#: One-line summary of the syntax, for ``--help`` texts.
GRID_HELP = (
    "grid: comma list of numbers and ranges a:b:N (N linear points) or a:b:logN (N log-spaced points), "
    "ends included"
)

_LOG_COUNT = re.compile(r"^log(\d+)$")
_SIG_DIGITS = 12


def _number(text: str, name: str, whole: str) -> float:
    return parse_float(text.strip(), name, f" in {whole!r}")


def _integer(text: str, name: str, whole: str) -> float:
    """One integer of an integer grid by the one rule (:func:`parse_integer`), as a float."""
    try:
        return float(parse_integer(text, name=name))
    except ValueError as exc:
        where = f" in {whole!r}" if text.strip() != whole.strip() else ""
        raise ValueError(f"{exc}{where}") from None


def _count(text: str, name: str, item: str) -> tuple[int, bool]:
    """Parse the third field of a range: ``N`` or ``logN``; returns (N, log-spaced)."""
    text = text.strip()
    match = _LOG_COUNT.match(text)
    digits = match.group(1) if match else text
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(
            f"{name}: range {item!r} needs a point count N >= 1 or logN as its third field, got {text!r}"
        )
    return int(digits), bool(match)


def _range(item: str, name: str, whole: str, integer: bool = False) -> np.ndarray:
    fields = item.split(":")
    if len(fields) != 3:
        raise ValueError(f"{name}: a range is a:b:N or a:b:logN, got {item!r} in {whole!r}")
    a, b = _number(fields[0], name, whole), _number(fields[1], name, whole)
    if integer:
        a, b = (_integer(f, name, whole) for f in fields[:2])
    count, log = _count(fields[2], name, item)
    if count == 1 and a != b:
        raise ValueError(f"{name}: range {item!r} has one point but two different ends")
    if not log:
        return np.linspace(a, b, count)
    if a <= 0 or b <= 0:
        raise ValueError(f"{name}: log-spaced range {item!r} needs ends > 0")
    return np.geomspace(a, b, count)


def _round_sig(values: np.ndarray) -> np.ndarray:
    return np.array([float(f"{v:.{_SIG_DIGITS}g}") for v in values], dtype=float)


def parse_grid(text: str, *, name: str = "grid", integer: bool = False) -> np.ndarray:
    """Parse a grid such as ``"0.9:1.1:5"``, ``"1:1000:log20"`` or ``"0.01,0.1,1"``.

    Parameters
    ----------
    text : str
        Comma-separated numbers and ranges (see the module docstring).
    name : str
        Name of the option, used in error messages (``"--mu"``).
    integer : bool
        Integer values (``T``, ``n``): single values and range ends must be exact integers
        (``1e6`` is fine, ``1.5`` is refused); points inside a range are rounded.

    Returns
    -------
    ndarray
        Sorted unique values: float64, or int64 when ``integer``.

    Raises
    ------
    ValueError
        For empty input, a bad number, a malformed range, a log range through 0 or, with
        ``integer``, a value with a fractional part.

    Examples
    --------
    >>> parse_grid("0.9:1.1:5").tolist()
    [0.9, 0.95, 1.0, 1.05, 1.1]
    >>> parse_grid("1:1000:log4", integer=True).tolist()
    [1, 10, 100, 1000]
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name}: empty grid")
    parts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"{name}: empty item in {text!r}")
        if ":" in item:
            parts.append(_range(item, name, text, integer))
        elif integer:
            parts.append(np.array([_integer(item, name, text)]))
        else:
            parts.append(np.array([_number(item, name, text)]))
    values = np.concatenate(parts)
    if integer:
        return np.unique(np.rint(values)).astype(np.int64)
    return np.unique(_round_sig(values))


def parse_int_grid(text: str, *, name: str = "grid", minimum: int | None = None) -> np.ndarray:
    """:func:`parse_grid` with ``integer=True``, then check every value is ``>= minimum``."""
    values = parse_grid(text, name=name, integer=True)
    if minimum is not None and values[0] < minimum:
        raise ValueError(f"{name}: values must be integers >= {minimum}, got {int(values[0])}")
    return values


def parse_name_list(text: str, *, name: str, choices) -> list[str]:
    """Parse a comma list of names, each one of ``choices``; order kept, duplicates dropped."""
    out: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if item not in choices:
            raise ValueError(f"{name}: unknown value {item!r}; choose from {', '.join(choices)}")
        if item not in out:
            out.append(item)
    return out
