r"""The two-point family: :math:`r = a` with probability :math:`q`, else :math:`b`.

The class holds its parameters and reach, :math:`K(s)` (float64 and mpmath), the log-ratio
moments, the sampler parameters and the float64 theory parts (:attr:`Family.float_parts`):
the :math:`P_T` side from the standardised central moments of :math:`r/\mu`, the :math:`G_T`
side from :math:`K(s) = s\log b + \log(1 + q\operatorname{expm1}(s d))`,
:math:`d = \log(a/b)`, by plain differences or its Taylor series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np

from variance_lab._validate import check_finite
from variance_lab.families import series
from variance_lab.families.base import CODE_TWO_POINT, Family
from variance_lab.stats.special import UNIT_ROUNDOFF as U

__all__ = ["TwoPoint"]


def _bernoulli_cgf_coef(q):
    r"""Taylor coefficients :math:`h_j` of :math:`\log(1 + q\,\operatorname{expm1}(x))`, j = 0..24."""
    g = [q / series.FACTORIALS[n] if n else 0.0 * q for n in range(series.SERIES_TERMS + 1)]
    h = [0.0 * q, q]
    for n in range(2, series.SERIES_TERMS + 1):
        acc = n * g[n]
        for m in range(1, n):
            acc = acc - m * h[m] * g[n - m]
        h.append(acc / n)
    return h


def _two_point_parts(mu, s2, T, shape):
    """Float theory parts of the two-point family (:attr:`Family.float_parts`)."""
    q = np.asarray(shape["q"], dtype=float)
    c2 = s2 / (mu * mu)
    c = np.sqrt(c2)
    al, be = c * np.sqrt((1 - q) / q), c * np.sqrt(q / (1 - q))
    lmu = np.log(mu)
    la1, lb1 = np.log1p(-al), np.log1p(be)  # log(a / mu), log(b / mu)
    e_la1 = 4 * U * (al / (1 - al) + np.abs(la1))
    e_lb1 = 4 * U * (be / (1 + be) + np.abs(lb1))
    d = la1 - lb1
    ed = e_la1 + e_lb1 + U * np.abs(d)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    gap = q * la1 + (1 - q) * lb1  # E[log r] - log mu
    egap = q * e_la1 + (1 - q) * e_lb1 + 2 * U * (q * np.abs(la1) + (1 - q) * np.abs(lb1))
    out["gap"], out["egap"] = gap, egap
    out["k2"] = q * (1 - q) * d * d
    out["ek2"] = out["k2"] * (2 * ed / np.abs(d) + 6 * U)
    # P_T: standardised central moments of r / mu
    m3 = (1 - q) * be**3 - q * al**3
    m4 = (1 - q) * be**4 + q * al**4
    em = 12 * U * ((1 - q) * be**3 + q * al**3) + 16 * U * m4
    l2, l3, l4 = np.log1p(c2), np.log1p(3 * c2 + m3), np.log1p(6 * c2 + 4 * m3 + m4)
    el = [1.5 * U * l2, 2 * U * np.abs(l3) + em, 2 * U * np.abs(l4) + 4 * em]
    keys = ("wP", "r3P", "uP", "ewP", "er3P", "euP", "gP", "egP")
    out.update(zip(keys, series.p_side_from_moments(T, l2, l3, l4, el), strict=True))
    # G_T: K(s) = s log b + L(s d), L(x) = log1p(q expm1(x)); differences of order >= 2 drop s log b
    s = 1.0 / T
    Lv, eL = [0.0], [0.0]
    for j in range(1, 5):
        x = j * s * d
        em1 = np.expm1(x)
        val = np.log1p(q * em1)
        Lv.append(val)
        eL.append(4 * U * (np.abs(val) + q * np.abs(em1) / (1 + q * em1)) + j * s * ed)
    plain = {n: series.forward_diffs(Lv, eL, n) for n in (2, 3, 4)}
    bG_plain = (lb1 + T * Lv[1], e_lb1 + T * eL[1] + 2 * U * (np.abs(lb1) + np.abs(T * Lv[1])))
    h = _bernoulli_cgf_coef(q)
    x = s * d
    ok = 4 * np.abs(x) < 0.4  # radius of convergence >= pi
    xs = np.where(ok, x, 0.0)
    for n, key in ((2, "wG"), (3, "r3G"), (4, "uG")):
        val, err = series.series_diffs(h, xs, n)
        err = np.where(ok, T * (err + n * np.abs(val) * ed / np.abs(d)), np.inf)
        out[key], out[f"e{key}"] = series.pick((T * plain[n][0], T * plain[n][1]), (T * val, err))
    h2 = [0.0 * q, 0.0 * q, *h[2:]]
    tail, etail = series.series_diffs(h2, xs, 1)  # sum_{j >= 2} h_j x^j
    b_series = gap + T * tail
    e_series = (
        egap + T * (etail + 2 * np.abs(tail) * ed / np.abs(d)) + 2 * U * (np.abs(gap) + np.abs(T * tail))
    )
    out["bG"], out["ebG"] = series.pick(bG_plain, (b_series, np.where(ok, e_series, np.inf)))
    return out


@dataclass(frozen=True)
class TwoPoint(Family):
    r"""Two-point ratio: :math:`r = a` with probability :math:`q`, else :math:`b`.

    :math:`a = \mu - \sigma\sqrt{(1-q)/q}`, :math:`b = \mu + \sigma\sqrt{q/(1-q)}`, so that
    :math:`E[r] = \mu` and :math:`\operatorname{Var}(r) = \sigma^2`;
    :math:`K(s) = \log(q a^s + (1-q) b^s)`.

    **Reach.** :math:`a > 0` requires :math:`\sigma^2 < \mu^2 q / (1-q)`; with the
    default :math:`q = 1/2` the family cannot reach :math:`\sigma^2 \ge \mu^2`, and
    asking for it raises ``ValueError``.

    Parameters
    ----------
    q : float, default 0.5
        Probability of the lower value, ``0 < q < 1``.
    """

    q: float = 0.5
    name: ClassVar[str] = "two-point"
    float_parts = staticmethod(_two_point_parts)

    def _check_reachable(self) -> None:
        q = check_finite("q", self.q)
        if not 0.0 < q < 1.0:
            raise ValueError(f"two-point q must lie in (0, 1), got {q!r}")
        object.__setattr__(self, "q", q)
        limit = self.mu**2 * q / (1.0 - q)
        if self.sigma2 >= limit:
            raise ValueError(
                f"two-point family cannot reach sigma2={self.sigma2!r} with mu={self.mu!r}"
                f" and q={q!r}: it needs sigma2 < mu**2 * q / (1 - q) = {limit!r}"
            )

    def _ab(self) -> tuple[float, float]:
        sd = math.sqrt(self.sigma2)
        return (
            self.mu - sd * math.sqrt((1 - self.q) / self.q),
            self.mu + sd * math.sqrt(self.q / (1 - self.q)),
        )

    def _ab_mp(self):
        q, sd = mpmath.mpf(self.q), mpmath.sqrt(self.sigma2)
        mu = mpmath.mpf(self.mu)
        return mu - sd * mpmath.sqrt((1 - q) / q), mu + sd * mpmath.sqrt(q / (1 - q))

    def _K(self, s):
        a, b = self._ab()
        return np.logaddexp(math.log(self.q) + s * math.log(a), math.log1p(-self.q) + s * math.log(b))

    def _K_mp(self, s):
        a, b = self._ab_mp()
        q = mpmath.mpf(self.q)
        return mpmath.log(q * a**s + (1 - q) * b**s)

    def _log_moments_mp(self):
        a, b = self._ab_mp()
        q = mpmath.mpf(self.q)
        la, lb = mpmath.log(a), mpmath.log(b)
        return q * la + (1 - q) * lb, q * (1 - q) * (lb - la) ** 2

    def _sampler_params(self):
        a, b = self._ab()
        return CODE_TWO_POINT, np.array([self.q, math.log(a), math.log(b)])

    def describe(self) -> dict:
        """Plain-dict description (family name, mu, sigma2 and q), for provenance."""
        return {**super().describe(), "q": self.q}
