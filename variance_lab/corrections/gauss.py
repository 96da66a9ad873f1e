r"""Normal interval masses and truncated-lognormal moments, in log space.

The building blocks of every closed form of :mod:`variance_lab.corrections`:
:func:`log_phi_diff` (the log of a normal interval's mass, accurate everywhere),
:func:`log_moment` (:math:`\log E[w^j]` of a weight that is piecewise :math:`c X^p` in
:math:`\log X \sim N(M, S^2)`), :func:`log_frac_out` (the log of the mass outside an interval),
and their elementwise array forms. For :math:`\log X \sim N(M, S^2)`

.. math::

    E[X^k 1\{a < \log X \le b\}] = e^{kM + k^2 S^2/2}
        \Bigl[\Phi\Bigl(\frac{b - M - kS^2}{S}\Bigr) - \Phi\Bigl(\frac{a - M - kS^2}{S}\Bigr)\Bigr].
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = [
    "log_frac_out",
    "log_frac_out_array",
    "log_moment",
    "log_moment_array",
    "log_phi_diff",
    "log_phi_diff_array",
    "logsumexp_rows",
]

_INF = math.inf
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_GL_X, _GL_W = np.polynomial.legendre.leggauss(32)


def _log_phi_quad(a: float, b: float) -> float:
    """Log of the integral of the standard normal density over [a, b] (b - a <= 1): Gauss-Legendre."""
    half = 0.5 * (b - a)
    x = 0.5 * (a + b) + half * _GL_X
    return math.log(half) + float(special.logsumexp(-0.5 * x * x, b=_GL_W)) - _LOG_SQRT_2PI


def log_phi_diff(a: float, b: float) -> float:
    r""":math:`\log(\Phi(b) - \Phi(a))` for :math:`a \le b`, accurate everywhere.

    Tails by ``log_ndtr`` (the side of zero where :math:`\Phi` is small), an interval
    containing 0 by :math:`(\operatorname{erf}(b/\sqrt2) + \operatorname{erf}(-a/\sqrt2))/2`
    (two positive terms), and a narrow interval (:math:`b - a \le 1`) by 32-point
    Gauss-Legendre quadrature of :math:`\varphi`, where the difference would cancel.
    Returns :math:`-\infty` for an empty interval.
    """
    if not a < b:
        return -_INF
    if b - a <= 1.0:
        return _log_phi_quad(a, b)
    if b <= 0:
        la, lb = special.log_ndtr(a), special.log_ndtr(b)
        return float(lb + np.log(-np.expm1(la - lb)))
    if a >= 0:
        la, lb = special.log_ndtr(-a), special.log_ndtr(-b)
        return float(la + np.log(-np.expm1(lb - la)))
    return math.log(0.5 * (special.erf(b / math.sqrt(2)) + special.erf(-a / math.sqrt(2))))


def _log_tail_out(a: float, b: float) -> float:
    r""":math:`\log(\Phi(a) + 1 - \Phi(b))`: the mass outside :math:`(a, b]`."""
    return float(np.logaddexp(special.log_ndtr(a), special.log_ndtr(-b)))


def log_moment(pieces, M: float, S: float, j: float) -> float:
    r""":math:`\log E[w^j]` for :math:`\log X \sim N(M, S^2)` and a piecewise weight."""
    terms = []
    for a, b, logc, p in pieces:
        k = p * j
        if S == 0.0:
            if a < M <= b:
                terms.append(j * logc + k * M)
            continue
        shift = M + k * S * S
        mass = log_phi_diff((a - shift) / S, (b - shift) / S)
        terms.append(j * logc + k * M + 0.5 * k * k * S * S + mass)
    terms = [t for t in terms if t > -_INF]
    return float(special.logsumexp(terms)) if terms else -_INF


def log_frac_out(a: float, b: float, M: float, S: float) -> float:
    """Log P(log X outside (a, b]) for log X ~ N(M, S^2)."""
    if S == 0.0:
        return 0.0 if not a < M <= b else -_INF
    return _log_tail_out((a - M) / S, (b - M) / S)


def log_phi_diff_array(a, b) -> np.ndarray:
    """:func:`log_phi_diff` elementwise over arrays, by the same branches."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    out = np.full(a.shape, -_INF)
    ok = a < b
    narrow = ok & (b - a <= 1.0)
    left = ok & ~narrow & (b <= 0)
    right = ok & ~narrow & ~left & (a >= 0)
    mid = ok & ~narrow & ~left & ~right
    if narrow.any():
        aa, bb = a[narrow], b[narrow]
        half = 0.5 * (bb - aa)
        x = (0.5 * (aa + bb))[:, None] + half[:, None] * _GL_X
        out[narrow] = np.log(half) + special.logsumexp(-0.5 * x * x, b=_GL_W, axis=1) - _LOG_SQRT_2PI
    with np.errstate(divide="ignore", invalid="ignore"):
        if left.any():
            la, lb = special.log_ndtr(a[left]), special.log_ndtr(b[left])
            out[left] = lb + np.log(-np.expm1(la - lb))
        if right.any():
            la, lb = special.log_ndtr(-a[right]), special.log_ndtr(-b[right])
            out[right] = la + np.log(-np.expm1(lb - la))
    if mid.any():
        r2 = math.sqrt(2)
        out[mid] = np.log(0.5 * (special.erf(b[mid] / r2) + special.erf(-a[mid] / r2)))
    return out


def logsumexp_rows(terms: np.ndarray) -> np.ndarray:
    """Log-sum-exp over the first axis, -inf where every term is -inf."""
    mx = terms.max(axis=0)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(divide="ignore"):
        return np.where(np.isfinite(mx), safe + np.log(np.exp(terms - safe).sum(axis=0)), -_INF)


def log_moment_array(pieces, M: np.ndarray, S: np.ndarray, j: float) -> np.ndarray:
    """:func:`log_moment` elementwise over arrays of (M, S)."""
    terms = []
    pos = S > 0
    Ss = np.where(pos, S, 1.0)
    for a, b, logc, p in pieces:
        k = p * j
        shift = M + k * Ss * Ss
        mass = log_phi_diff_array((a - shift) / Ss, (b - shift) / Ss)
        t = j * logc + k * M + 0.5 * k * k * Ss * Ss + mass
        degenerate = np.where((a < M) & (b >= M), j * logc + k * M, -_INF)
        terms.append(np.where(pos, t, degenerate))
    return logsumexp_rows(np.array(terms))


def log_frac_out_array(a: float, b: float, M: np.ndarray, S: np.ndarray) -> np.ndarray:
    """:func:`log_frac_out` elementwise over arrays of (M, S)."""
    pos = S > 0
    Ss = np.where(pos, S, 1.0)
    tail = np.logaddexp(special.log_ndtr((a - M) / Ss), special.log_ndtr(-(b - M) / Ss))
    return np.where(pos, tail, np.where((a < M) & (b >= M), -_INF, 0.0))
