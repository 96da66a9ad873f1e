r"""One rule for "modified at a bound", with its convention explicit.

A clip or mask keeps a value :math:`x` when it lies in a band :math:`[lo, hi]` and modifies
(truncates, clips or masks) it otherwise. Frameworks differ only at the edges, so the rule
takes the convention as arguments, and every caller states its own:

- ``inclusive = (at_lo, at_hi)``: ``True`` at an end means a value *exactly at* that bound is
  kept (counts as inside, unmodified); ``False`` means it is modified. :data:`CLOSED`
  :math:`[lo, hi]`, :data:`OPEN` :math:`(lo, hi)`, :data:`LEFT_OPEN` :math:`(lo, hi]`,
  :data:`RIGHT_OPEN` :math:`[lo, hi)`.
- ``space``: ``"log"``: the values are logs (of a token ratio, of :math:`P_T`, of GSPO's
  :math:`s`) and the bounds are logs too (:func:`log_bounds` of a ratio band), compared as
  they are; ``"linear"``: the values are logs, the bounds ratios, and :math:`e^x` is compared
  with the bounds (overflow to ``inf`` is quiet); ``"value"``: any other statistic (verl's
  :math:`k_2`, a probability difference), compared as it is.
- ``dtype``: both the values and the bounds are cast to it before the comparison (and
  :math:`e^x` is taken in it): ``np.float32`` reproduces a framework that compares float32
  tensors with a Python threshold.

A missing bound (``None``, ``-inf`` below, ``inf`` above) never modifies anything. A NaN is
outside every band. :func:`compare` is the comparison alone, written with operators only, so the
torch paths (:mod:`variance_lab.experiment.train`, :mod:`variance_lab.lm.losses`) call it on
tensors in the tensor's own dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CLOSED",
    "LEFT_OPEN",
    "OPEN",
    "RIGHT_OPEN",
    "SPACES",
    "BoundRule",
    "compare",
    "log_bounds",
    "outside",
]

#: Both bounds kept: :math:`[lo, hi]`.
CLOSED = (True, True)
#: Both bounds modified: :math:`(lo, hi)`.
OPEN = (False, False)
#: The lower bound modified, the upper kept: :math:`(lo, hi]`.
LEFT_OPEN = (False, True)
#: The lower bound kept, the upper modified: :math:`[lo, hi)`.
RIGHT_OPEN = (True, False)
#: Where values and bounds are compared (module docstring).
SPACES = ("log", "linear", "value")


def log_bounds(lo, hi) -> tuple[float, float]:
    """Return ``(log lo, log hi)`` of a ratio band in float64 (0 or None below: -inf; None above: inf)."""
    a = -math.inf if lo is None or lo == 0 else math.log(lo)
    b = math.inf if hi is None else math.log(hi)
    return a, b


def compare(x, lo, hi, inclusive=CLOSED):
    """Return where ``x`` lies outside ``[lo, hi]`` under ``inclusive`` (the comparison alone).

    Written with ``<``, ``<=``, ``&`` and ``~`` only, so ``x`` may be a NumPy array or a torch
    tensor; ``lo``/``hi`` are scalars on ``x``'s scale, or None for no bound. NaN is outside.
    """
    at_lo, at_hi = inclusive
    keep = (x == x) if not hasattr(x, "isnan") else ~x.isnan()
    if lo is not None:
        keep = keep & ((lo <= x) if at_lo else (lo < x))
    if hi is not None:
        keep = keep & ((x <= hi) if at_hi else (x < hi))
    return ~keep


def outside(x, lo=None, hi=None, *, inclusive=CLOSED, space: str = "log", dtype=np.float64) -> np.ndarray:
    r"""Return a boolean array, True where ``x`` is modified by the band ``[lo, hi]`` (the module's rule).

    Parameters
    ----------
    x : array_like
        Logs (``space="log"`` or ``"linear"``) or values (``"value"``).
    lo, hi : float or None
        The bounds: logs for ``"log"``, ratios for ``"linear"``, the statistic's scale for
        ``"value"``; None for no bound on that side.
    inclusive : (bool, bool)
        Whether a value exactly at ``lo`` / ``hi`` is kept (:data:`CLOSED`, :data:`OPEN`, ...).
    space : {"log", "linear", "value"}
    dtype : numpy dtype
        The precision of the comparison (values and bounds cast to it).

    Returns
    -------
    ndarray of bool
    """
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    dt = np.dtype(dtype)
    v = np.asarray(x, dtype=dt)
    if space == "linear":
        with np.errstate(over="ignore"):
            v = np.exp(v)
    lo = None if lo is None or (space != "linear" and lo == -math.inf) else dt.type(lo)
    hi = None if hi is None or hi == math.inf else dt.type(hi)
    return np.asarray(compare(v, lo, hi, tuple(bool(b) for b in inclusive)))


@dataclass(frozen=True)
class BoundRule:
    """A caller's convention for the bound rule: inclusive ends, space and dtype.

    Attributes
    ----------
    inclusive : (bool, bool)
        Whether a value exactly at the lower / upper bound is kept.
    space : {"log", "linear", "value"}
    dtype : numpy dtype name
        ``"float64"`` or ``"float32"``.
    """

    inclusive: tuple[bool, bool] = CLOSED
    space: str = "log"
    dtype: str = "float64"

    def __post_init__(self):
        """Check the space and the dtype."""
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {self.space!r}")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")

    def outside(self, x, lo=None, hi=None) -> np.ndarray:
        """:func:`outside` under this convention."""
        return outside(x, lo, hi, inclusive=self.inclusive, space=self.space, dtype=self.dtype)

    def inside(self, x, lo=None, hi=None) -> np.ndarray:
        """Return the complement of :meth:`outside`: where the value is kept unmodified."""
        return ~self.outside(x, lo, hi)
