r"""Special functions shared by the theory, the families and the rollout models (one home each).

Vectorised float64 helpers that several rooms need with the same rounding, so that every
path that evaluates them gets the same bits:

- :func:`log_expm1`, :math:`\log(e^x - 1)` without overflow (the log of a variance
  :math:`e^{2\ell}\operatorname{expm1}(w)`, :mod:`variance_lab.theory` and
  :mod:`variance_lab.rollouts.cgf`);
- :func:`stirling_tail`, the remainder of Stirling's series for :math:`\log\Gamma`, and
  :func:`lgamma_ratio`, :math:`\log\Gamma(k+s) - \log\Gamma(k) - s\log k` with an error of
  order :math:`u|s|` rather than :math:`u\,k\log k` at large :math:`k` (the gamma family's
  :math:`K(s)` and its float theory parts; :math:`u` the unit roundoff).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = [
    "LN10",
    "STIRLING_COEFFICIENTS",
    "UNIT_ROUNDOFF",
    "lgamma_ratio",
    "log1mexp",
    "log_expm1",
    "stirling_tail",
]

#: ln 10: a natural log over it is a log10 (the tidy frames' ``log10_*`` columns).
LN10 = math.log(10.0)

#: Unit roundoff of float64 (half the machine epsilon): the unit of the error estimates.
UNIT_ROUNDOFF = np.finfo(float).eps / 2

#: Stirling-series coefficients :math:`B_{2j} / (2j (2j - 1))`, :math:`j = 1..8`.
STIRLING_COEFFICIENTS = (
    1 / 12,
    -1 / 360,
    1 / 1260,
    -1 / 1680,
    1 / 1188,
    -691 / 360360,
    1 / 156,
    -3617 / 122400,
)


def log_expm1(x):
    r""":math:`\log(e^x - 1)` in float64, without overflow.

    .. math::

        \log(e^x - 1) = \begin{cases}
            \log\operatorname{expm1}(x) & x \le 30, \\
            x + \operatorname{log1p}(-e^{-x}) & x > 30,
        \end{cases}

    so that no :math:`e^x` is formed for large :math:`x` (the value is finite for every finite
    :math:`x > 0`, ``-inf`` at 0, ``inf`` at ``inf``, ``nan`` for :math:`x < 0` or NaN; no
    floating-point warning is raised).

    Parameters
    ----------
    x : float or array_like of float
        :math:`x \ge 0`.

    Returns
    -------
    ndarray of float64
        The shape of ``x`` (a 0-d array for a scalar).
    """
    x = np.asarray(x, dtype=np.float64)
    big = x > 30.0
    with np.errstate(all="ignore"):
        small = np.log(np.expm1(np.where(big, 0.0, x)))
        large = x + np.log1p(-np.exp(-np.where(big, x, 30.0)))
    return np.where(big, large, small)


def log1mexp(x: float) -> float:
    r""":math:`\log(1 - e^x)` for a float :math:`x \le 0`, accurate on both sides of :math:`-\log 2`.

    .. math::

        \log(1 - e^x) = \begin{cases}
            \log(-\operatorname{expm1}(x)) & -\log 2 < x \le 0, \\
            \operatorname{log1p}(-e^x) & x \le -\log 2
        \end{cases}

    (Mächler's rule: each branch where its argument is not a difference of near-equal numbers);
    ``-inf`` at 0 and 0 at ``-inf``.
    """
    if x == 0.0:
        return -math.inf
    if x == -math.inf:
        return 0.0
    return math.log(-math.expm1(x)) if x > -math.log(2.0) else math.log1p(-math.exp(x))


def stirling_tail(x):
    r"""Remainder of Stirling's series: :math:`\log\Gamma(x)` minus its leading terms.

    .. math::

        c(x) = \sum_{j=1}^{8} \frac{B_{2j}}{2j(2j-1)\,x^{2j-1}}
             \approx \log\Gamma(x) - \bigl(x - \tfrac12\bigr)\log x + x - \tfrac12\log(2\pi),

    with the Bernoulli numbers :math:`B_{2j}` (:data:`STIRLING_COEFFICIENTS`), evaluated by
    Horner's rule in :math:`1/x^2`. The truncation error is below the next term,
    :math:`|B_{18}|/(18 \cdot 17\, x^{17})`: under :math:`10^{-17}` relative for :math:`x \ge 10`,
    the range the gamma family uses it on.

    Parameters
    ----------
    x : float or array_like of float
        :math:`x \ge 10` for full float64 accuracy.

    Returns
    -------
    ndarray of float64
        The shape of ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    inv2 = 1.0 / (x * x)
    out = np.zeros_like(x)
    for c in reversed(STIRLING_COEFFICIENTS):
        out = out * inv2 + c
    return out / x


def lgamma_ratio(k, s):
    r""":math:`\log|\Gamma(k+s)| - \log\Gamma(k) - s\log k` in float64, and an estimate of its error.

    Where :math:`k \ge 10` and :math:`k + s \ge 10` it uses Stirling's series,

    .. math::

        \bigl(k + s - \tfrac12\bigr)\operatorname{log1p}(s/k) - s + \bigl(c(k+s) - c(k)\bigr),

    with the tail :math:`c` of :func:`stirling_tail`: the plain difference of ``gammaln``
    loses digits as :math:`k` grows (both terms are of order :math:`k \log k`, and so is their
    rounding). Elsewhere it is that plain difference. Both branches are evaluated
    (``np.where``) without a warning.

    Parameters
    ----------
    k : float or array_like of float
        :math:`k > 0`.
    s : float or array_like of float
        Broadcastable with ``k``; :math:`k + s` not a pole of :math:`\Gamma`.

    Returns
    -------
    value, error : ndarray of float64
        The value and an estimate of its absolute error (a few units of roundoff of each term,
        the two tails included, plus the series' truncation), broadcast over ``k`` and ``s``.
    """
    k, s = np.asarray(k, dtype=np.float64), np.asarray(s, dtype=np.float64)
    big = (k >= 10) & (k + s >= 10)
    kb = np.where(big, k, 10.0)
    x = np.where(big, s, 0.0)  # both branches are evaluated: log1p(s / k) is NaN for s < -k
    lp = np.log1p(x / kb)
    a = (kb + x - 0.5) * lp
    t1, t0 = stirling_tail(kb + x), stirling_tail(kb)
    tail = t1 - t0
    stir = a - x + tail
    ax = np.abs(x)
    e_stir = 4 * UNIT_ROUNDOFF * (np.abs(a) + ax + t1 + t0) + 1e-16 / (kb * kb) * ax / kb
    ks = np.where(big, 1.0, k)
    g1, g0 = special.gammaln(ks + s), special.gammaln(ks)
    xl = s * np.log(ks)
    plain = g1 - g0 - xl
    e_plain = 4 * UNIT_ROUNDOFF * (np.abs(g1) + np.abs(g0) + np.abs(xl) + 1)
    return np.where(big, stir, plain), np.where(big, e_stir, e_plain)
