r"""Group advantages and the variance shares of two parts of a log-ratio.

:func:`group_advantages` is GRPO's group-normalised advantage,

.. math:: A_i = \frac{R_i - \bar R_g}{s_g + \epsilon},

with :math:`\bar R_g` and :math:`s_g` the mean and standard deviation (``ddof``) of the rewards of
sequence :math:`i`'s group :math:`g` (the responses to one prompt); a group whose rewards are all
equal (or that has no more than ``ddof`` members) gets 0. ``eps`` and ``ddof`` have no default: each
experiment states its own (the arithmetic experiment :math:`\epsilon = 10^{-4}`, ``ddof=0``; the
SmolLM2 experiment :math:`10^{-6}`, ``ddof=1``, as ``torch.std``).

:func:`variance_split` splits :math:`\operatorname{Var}(a + b) = \operatorname{Var}(a) +
\operatorname{Var}(b) + 2\operatorname{Cov}(a, b)` into shares that add to 1 (the mismatch and the
update of a total log-ratio). The shares do not depend on ``ddof``; the variances do.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["VarianceSplit", "group_advantages", "variance_split"]


def group_advantages(rewards, groups, *, eps: float, ddof: int) -> np.ndarray:
    """Return GRPO's group-normalised advantages (module docstring), float64.

    Parameters
    ----------
    rewards : array_like
        One reward per sequence, 1-D.
    groups : array_like
        The group (prompt) of each sequence, same shape.
    eps : float
        Added to each group's standard deviation.
    ddof : int
        Delta degrees of freedom of the standard deviation (0 or 1).

    Returns
    -------
    numpy.ndarray
    """
    rewards = np.asarray(rewards, dtype=float)
    groups = np.asarray(groups)
    if rewards.shape != groups.shape or rewards.ndim != 1:
        raise ValueError(f"rewards {rewards.shape} and groups {groups.shape} must be 1-D, same length")
    out = np.zeros_like(rewards)
    for g in np.unique(groups):
        sel = groups == g
        r = rewards[sel]
        if r.size > ddof and np.ptp(r) > 0:
            out[sel] = (r - r.mean()) / (r.std(ddof=ddof) + eps)
    return out


class VarianceSplit(NamedTuple):
    """:func:`variance_split`'s result: the variances, the covariance, their total and the shares."""

    var_a: float
    var_b: float
    cov: float
    total: float
    share_a: float
    share_b: float
    share_cross: float

    @classmethod
    def of(cls, va: float, vb: float, cov: float) -> VarianceSplit:
        """Return the split of variances ``va``, ``vb``, covariance ``cov`` (shares NaN unless total > 0)."""
        total = va + vb + 2.0 * cov
        if not (total > 0.0 and math.isfinite(total)):
            return cls(va, vb, cov, total, math.nan, math.nan, math.nan)
        return cls(va, vb, cov, total, va / total, vb / total, 2.0 * cov / total)


def variance_split(a, b, *, ddof: int) -> VarianceSplit:
    r"""Return the shares of :math:`\operatorname{Var}(a + b)` from ``a``, ``b`` and twice their covariance.

    Parameters
    ----------
    a, b : array_like
        Paired values, 1-D, same length.
    ddof : int
        Delta degrees of freedom of the variances and the covariance (``np.var``'s).

    Returns
    -------
    VarianceSplit
        The shares are NaN where the total is not a positive finite number (both parts constant).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a {a.shape} and b {b.shape} must be 1-D, same length")
    if a.size <= ddof:
        raise ValueError(f"variance_split needs more than ddof={ddof} values, got {a.size}")
    va, vb = float(np.var(a, ddof=ddof)), float(np.var(b, ddof=ddof))
    cov = float(np.sum((a - a.mean()) * (b - b.mean())) / (a.size - ddof))
    return VarianceSplit.of(va, vb, cov)
