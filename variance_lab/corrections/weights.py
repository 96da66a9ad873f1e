r"""Weights from log-ratios: each correction applied to measured or simulated values.

:func:`apply_sequence` acts on :math:`\log P_T` per sequence, :func:`apply_tokens` on each
token's :math:`\log r`; both return the weights and where they were truncated, clipped or
masked. Shared by the Monte Carlo (:mod:`variance_lab.corrections.monte_carlo`), the data
(:mod:`variance_lab.corrections.data`) and the frameworks' mirrors.

A value exactly at a bound is kept (:data:`BOUND_RULE`: :math:`1\{LO \le X \le HI\}`, as the
specs' table says), compared in log space in float64 with the bounds of
:meth:`~variance_lab.corrections.specs.Correction.log_bounds` (:mod:`variance_lab.ratios.bounds`).
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections.specs import Correction
from variance_lab.ratios import CLOSED, BoundRule

__all__ = ["BOUND_RULE", "apply_sequence", "apply_tokens"]

#: The corrections' convention on data: a value at a bound is kept, log space, float64.
BOUND_RULE = BoundRule(CLOSED, "log", "float64")


def apply_sequence(c: Correction, log_p: np.ndarray, T) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a sequence-level correction's weights from :math:`\log P_T` values.

    Parameters
    ----------
    c : Correction
        Of level ``"sequence"``.
    log_p : ndarray
        :math:`\log P_T` of each sequence.
    T : int or ndarray
        Each sequence's length (for :math:`G_T = P_T^{1/T}` and Geo-RS's bounds).

    Returns
    -------
    (w, modified) : tuple of ndarray
        The weights and a boolean array, True where the weight was truncated, clipped or masked.
    """
    if c.level != "sequence":
        raise ValueError(f"{c.spec!r} is a token-level correction")
    log_p = np.asarray(log_p, dtype=float)
    T = np.asarray(T, dtype=float)
    x = log_p / T if c.base == "G" else log_p
    if c.kind == "geo-rs":
        lo, hi = math.log(c.params[0]), math.log(c.params[1])
        out = BOUND_RULE.outside(log_p / T, lo, hi)
        return np.where(out, 0.0, np.exp(np.where(out, 0.0, log_p))), out
    return _apply_pieces(c, x)


def _apply_pieces(c: Correction, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights of the T-free pieces of ``c`` at base log-values ``x``; the ends by :data:`BOUND_RULE`."""
    a, b = c.log_bounds()
    out = BOUND_RULE.outside(x, a, b)
    w = np.zeros_like(x)
    for lo, hi, logc, p in c.pieces():
        if p == 1.0:
            w = np.where(out, w, np.exp(np.where(out, 0.0, x) + logc))
        else:
            w = np.where(out & (x > lo) & (x <= hi), math.exp(logc), w)
    return w, out


def apply_tokens(c: Correction, log_r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a token-level correction's per-token weights and modified flags (GMPO: clipped log-ratios).

    Returns
    -------
    (w, modified) : tuple of ndarray
        For ``gmpo`` ``w`` is :math:`\operatorname{clip}(\log r, -\epsilon, \epsilon)`, whose
        mean over a sequence is the log of its weight.
    """
    if c.level != "token":
        raise ValueError(f"{c.spec!r} is a sequence-level correction")
    log_r = np.asarray(log_r, dtype=float)
    if c.kind == "gmpo":
        e = c.params[0]
        return np.clip(log_r, -e, e), BOUND_RULE.outside(log_r, -e, e)
    return _apply_pieces(c, log_r)
