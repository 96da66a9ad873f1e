r"""The gamma family: :math:`r = \theta\,\Gamma_k` with shape :math:`k = \mu^2/\sigma^2`.

The class holds its parameters, :math:`K(s)` (float64 through
:func:`variance_lab.stats.special.lgamma_ratio`, and mpmath), the log-ratio moments, the
sampler parameters and the float64 theory parts (:attr:`Family.float_parts`): the
:math:`P_T` side from the exact moments :math:`E[(r/\mu)^k] = \prod_{i<k}(1 + i c^2)`,
:math:`c^2 = \sigma^2/\mu^2`, the :math:`G_T` side from differences of
:func:`~variance_lab.stats.special.lgamma_ratio` or the cumulant series
:math:`\kappa_j = \psi^{(j-1)}(k)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np
from scipy import special

from variance_lab.families.base import CODE_GAMMA, Family
from variance_lab.families.series import (
    FACTORIALS,
    SERIES_TERMS,
    forward_diffs,
    p_side_from_moments,
    pick,
    series_diffs,
)
from variance_lab.stats.special import UNIT_ROUNDOFF as U
from variance_lab.stats.special import lgamma_ratio

__all__ = ["Gamma"]


def _log1p_series(c, coef_of_n, n0: int):
    r""":math:`\sum_{n \ge n_0} (-1)^{n+1} a_n c^n / n`, a_n = ``coef_of_n(n)``."""
    acc = np.zeros_like(c)
    for n in range(SERIES_TERMS + 6, n0 - 1, -1):
        acc = acc * c + (-1) ** (n + 1) * coef_of_n(n) / n
    return acc * c**n0


def _gamma_p_side(c2, T):
    r""":math:`E[(r/\mu)^k] = \prod_{i<k}(1 + i c^2)`: w, r3, u (series in :math:`c^2` when small)."""
    l1, l2, l3 = np.log1p(c2), np.log1p(2 * c2), np.log1p(3 * c2)
    el = [U * l1, 2 * U * (l1 + l2), 3 * U * (l1 + l2 + l3)]
    w, r3, u, ew, er3, eu, g, eg = p_side_from_moments(T, l1, l1 + l2, l1 + l2 + l3, el)
    small = c2 < 0.05
    cs = np.where(small, c2, 0.0)
    s3 = _log1p_series(cs, lambda n: 2.0**n - 2, 2)
    s4 = _log1p_series(cs, lambda n: 3.0**n - 3 * 2.0**n + 3, 3)
    r3 = np.where(small, T * s3, r3)
    u = np.where(small, T * s4, u)
    er3 = np.where(small, 16 * U * np.abs(r3) + 1e-300, er3)
    eu = np.where(small, 16 * U * np.abs(u) + 1e-300, eu)
    g = T * (l2 + l3 - l1)  # f4 - 2 f2 = T log((1 + 2c^2)(1 + 3c^2)/(1 + c^2))
    eg = T * U * (l1 + l2 + l3) + 2 * U * np.abs(g)
    return w, r3, u, ew, er3, eu, g, eg


def _log_gap(k):
    r""":math:`\log k - \psi(k)` (the Jensen gap of the gamma family) and its error estimate."""
    big = k >= 10
    kb = np.where(big, k, 10.0)
    inv2 = 1 / (kb * kb)
    # B_2n / (2n), n = 1..10
    b = (
        1 / 12,
        -1 / 120,
        1 / 252,
        -1 / 240,
        1 / 132,
        -691 / 32760,
        1 / 12,
        -3617 / 8160,
        43867 / 14364,
        -174611 / 6600,
    )
    acc = np.zeros_like(kb)
    for c in reversed(b):
        acc = acc * inv2 + c
    asym = 0.5 / kb + acc * inv2
    ks = np.where(big, 1.0, k)
    lk, dg = np.log(ks), special.digamma(ks)
    return np.where(big, asym, lk - dg), np.where(big, 4 * U * asym, 4 * U * (np.abs(lk) + np.abs(dg) + 1))


def _gamma_parts(mu, s2, T, shape):
    """Float theory parts of the gamma family (:attr:`Family.float_parts`)."""
    k = mu * mu / s2
    c2 = s2 / (mu * mu)
    lmu = np.log(mu)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    keys = ("wP", "r3P", "uP", "ewP", "er3P", "euP", "gP", "egP")
    out.update(zip(keys, _gamma_p_side(c2, T), strict=True))
    out["k2"] = special.polygamma(1, k)
    out["ek2"] = 8 * U * out["k2"]
    s = 1.0 / T
    # plain differences of R(k, js) = lgamma(k + js) - lgamma(k) - js log k
    R, eR = [0.0], [0.0]
    for j in range(1, 5):
        r, e = lgamma_ratio(k, j * s)
        R.append(r)
        eR.append(e)
    plain = {n: forward_diffs(R, eR, n) for n in (2, 3, 4)}
    gap, egap = _log_gap(k)
    out["gap"], out["egap"] = -gap, egap
    bG_plain = (T * R[1], T * eR[1] + 2 * U * np.abs(T * R[1]))
    # series: Taylor coefficients kappa_j / j! with kappa_j = psi^(j-1)(k), in x = s
    coef = [None, None] + [special.polygamma(j - 1, k) / FACTORIALS[j] for j in range(2, SERIES_TERMS + 1)]
    coef[1] = np.zeros_like(k)
    ok = 4 * s < 0.5 * k  # inside the radius of convergence (k) with room
    sx = np.where(ok, s, 0.0) + np.zeros_like(k)
    for n, key in ((2, "wG"), (3, "r3G"), (4, "uG")):
        val, err = series_diffs(coef, sx, n)
        err = np.where(ok, err, np.inf)
        out[key], out[f"e{key}"] = pick((T * plain[n][0], T * plain[n][1]), (T * val, T * err))
    tail, etail = series_diffs(coef, sx, 1)  # sum_{j>=2} kappa_j s^j / j! (coef[1] = 0)
    b_series = -gap + T * tail
    e_series = np.where(ok, egap + T * etail + 2 * U * (np.abs(gap) + np.abs(T * tail)), np.inf)
    out["bG"], out["ebG"] = pick(bG_plain, (b_series, e_series))
    return out


@dataclass(frozen=True)
class Gamma(Family):
    r"""Gamma ratio with shape :math:`k = \mu^2/\sigma^2` and scale :math:`\theta = \sigma^2/\mu`.

    :math:`K(s) = \log\Gamma(k+s) - \log\Gamma(k) + s\log\theta` for :math:`s > -k`;
    :math:`E[\log r] = \psi(k) + \log\theta`, :math:`\operatorname{Var}[\log r] = \psi'(k)`.
    Reaches every :math:`\mu > 0, \sigma^2 \ge 0`.
    """

    name: ClassVar[str] = "gamma"
    float_parts = staticmethod(_gamma_parts)

    @property
    def shape(self) -> float:
        """Shape parameter k = mu^2 / sigma^2 of the gamma distribution of r."""
        return self.mu**2 / self.sigma2

    def _K(self, s):
        k = self.shape
        if np.any(s <= -k):
            raise ValueError(f"gamma K(s) needs s > -shape = {-k!r}")
        return lgamma_ratio(k, s)[0] + s * math.log(self.mu)

    def _kt_mp(self):
        mu, s2 = mpmath.mpf(self.mu), mpmath.mpf(self.sigma2)
        return mu * mu / s2, s2 / mu

    def _K_mp(self, s):
        k, theta = self._kt_mp()
        return mpmath.loggamma(k + s) - mpmath.loggamma(k) + s * mpmath.log(theta)

    def _log_moments_mp(self):
        k, theta = self._kt_mp()
        return mpmath.digamma(k) + mpmath.log(theta), mpmath.psi(1, k)

    def _sampler_params(self):
        return CODE_GAMMA, np.array([self.shape, math.log(self.sigma2 / self.mu)])
