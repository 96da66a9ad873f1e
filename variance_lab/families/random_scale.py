r"""The random-scale family: each sequence draws its own log-ratio variance.

The class holds its parameters, :math:`K(s)` (float64 and mpmath), the exact cumulant
generating function of :math:`\log P_T` (the tokens of a sequence share its variance, so it is
not :math:`T K(s)`), the log-ratio moments, the sampler parameters and the float64 theory
parts (:attr:`Family.float_parts`): differences of :math:`-\alpha\log(1 + z)` from exact
:math:`\log(1 + z)` series (integer coefficients for :math:`P_T`, rational ones in :math:`T`
for :math:`G_T`), with the moments that diverge flagged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np

from variance_lab._validate import check_positive
from variance_lab.families.base import CODE_RANDOM_SCALE, Family
from variance_lab.families.series import forward_diffs, pick
from variance_lab.stats.special import UNIT_ROUNDOFF as U

__all__ = ["RandomScale"]


# -------------------------------------------------------------------- random-scale
# C(s) = sT log mu + D(s), D(s) = -alpha log1p(-theta T s(s-1)/2): not T K(s), the tokens of a
# sequence share its variance. P_T (s = k): D = -alpha log1p(-c_k theta T), c_k = k(k-1)/2;
# G_T (s = k/T): D = -alpha log1p(theta g_k), g_k = k(T-k)/(2T). Both are log1p series in theta.
_RS_TERMS = 40  # series terms, P side (6 theta T <= 1/2)
_RS_TERMS_G = 40  # series terms, G side (theta <= 0.2, |g_k| <= 2)
_RS_C = (0, 0, 1, 3, 6)


def _rs_p_coef() -> dict:
    r"""Exact :math:`\Delta^m[c_k^n]` at 0 (step 1), n = 1.._RS_TERMS, and ``g``: :math:`c_4^n - 2c_2^n`."""
    out = {}
    for m in (2, 3, 4):
        out[m] = np.array(
            [
                float(sum(math.comb(m, j) * (-1) ** (m - j) * _RS_C[j] ** n for j in range(m + 1)))
                for n in range(1, _RS_TERMS + 1)
            ]
        )
    out["g"] = np.array([float(6**n - 2) for n in range(1, _RS_TERMS + 1)])
    return out


_RS_P = _rs_p_coef()


@functools.lru_cache(maxsize=4096)
def _rs_g_coef(T: int) -> np.ndarray:
    r"""Exact :math:`\Delta^m[g_k^n]` (m = 2, 3, 4; n = 1.._RS_TERMS_G), rounded once to float64.

    :math:`g_k = k(T-k)/(2T)`: integer numerators over :math:`(2T)^n`, so the differences, which
    cancel to order :math:`1/T` and beyond, carry no rounding error (Python's int division
    rounds correctly).
    """
    gk = [k * (T - k) for k in range(5)]
    out = np.empty((3, _RS_TERMS_G))
    for i, m in enumerate((2, 3, 4)):
        for n in range(1, _RS_TERMS_G + 1):
            num = sum(math.comb(m, j) * (-1) ** (m - j) * gk[j] ** n for j in range(1, m + 1))
            out[i, n - 1] = num / (2 * T) ** n
    return out


def _log1p_sum(coef, y, alpha, erel):
    r"""``alpha * sum_n coef[n-1] y^n / n`` with an error estimate (``erel``: relative error of y)."""
    acc = np.zeros_like(y)
    mag = np.zeros_like(y)
    dmag = np.zeros_like(y)
    ay = np.abs(y)
    for n in range(len(coef), 0, -1):
        acc = acc * y + coef[n - 1] / n
        mag = mag * ay + abs(coef[n - 1]) / n
        dmag = dmag * ay + abs(coef[n - 1])  # sum n |term|
    last = abs(coef[-1]) / len(coef) * ay ** len(coef)
    value = alpha * acc * y
    err = alpha * (4 * last + ay * (6 * U * mag + erel * dmag)) + 2 * U * np.abs(value)
    return value, err


def _rs_logs(z, e_ind, e_cor, alpha):
    r""":math:`D = -\alpha\log(1 + z)`, its error, ``inf`` flags and :math:`\partial D/\partial\log z`.

    ``e_ind`` is the relative error of ``z`` that is independent between the points of one
    difference, ``e_cor`` the one they share (that of :math:`\theta`): its effect on a difference
    is that difference of the derivatives :math:`E = -\alpha z/(1+z)`, which cancel as the
    values do. Where :math:`1 + z \le 0` certainly, the flag is set; where its sign is within
    rounding of 0, the error is ``inf``. Both get the placeholder value 0.
    """
    b = 1 + z
    ez = np.abs(z) * e_ind
    sure = np.abs(z) * (e_ind + e_cor) + 2 * U
    finite = b > sure
    inf = b < -sure
    bs = np.where(finite, b, 1.0)
    lg = np.log1p(np.where(finite, z, 0.0))
    D = -alpha * lg
    eD = alpha * (ez / bs + U * np.abs(lg)) + U * np.abs(D)
    E = np.where(finite, -alpha * z / bs, 0.0)
    return np.where(finite, D, 0.0), np.where(finite, eD, np.where(inf, 0.0, np.inf)), inf, E


def _rs_diffs(D, eD, E, e_cor, n):
    """n-th difference of D (``_diffs``) with the shared error ``e_cor`` propagated through E."""
    val, err = forward_diffs(D, eD, n)
    dE, _ = forward_diffs(E, [0.0] * len(E), n)
    return val, err + e_cor * np.abs(dE)


def _random_scale_parts(mu, s2, T, shape):
    """Float theory parts of the random-scale family (:attr:`Family.float_parts`)."""
    alpha = np.asarray(shape["alpha"], dtype=float)
    L = np.log1p(s2 / (mu * mu))  # -alpha log(1 - theta) = L
    theta = -np.expm1(-L / alpha)
    eth = 8 * U  # relative error of theta
    lmu = np.log(mu)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    out["gap"] = -alpha * theta / 2
    out["egap"] = 10 * U * np.abs(out["gap"])
    out["k2"] = alpha * theta * (1 + theta / 4)
    out["ek2"] = 12 * U * out["k2"]
    # P_T: D_k = -alpha log1p(-c_k y), y = theta T
    y = theta * T
    ey = eth + U
    D, eD, E, inf = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], {}
    for k in (2, 3, 4):
        d, e, inf[k], dd = _rs_logs(-_RS_C[k] * y, U, ey, alpha)
        D.append(d)
        eD.append(e)
        E.append(dd)
    D[2] = np.where(T == 1, L, D[2])  # 1 - theta = (1 + sigma^2/mu^2)^(-1/alpha): no cancellation
    eD[2] = np.where(T == 1, 2 * U * L, eD[2])
    E[2] = np.where(T == 1, 0.0, E[2])
    plain = {n: _rs_diffs(D[: n + 1], eD[: n + 1], E[: n + 1], ey, n) for n in (3, 4)}
    plain["w"] = (D[2], eD[2] + ey * np.abs(E[2]))
    plain["g"] = (
        D[4] - 2 * D[2],
        eD[4] + 2 * eD[2] + 2 * U * (np.abs(D[4]) + 2 * np.abs(D[2])) + ey * np.abs(E[4] - 2 * E[2]),
    )
    plain["r3"], plain["u"] = plain.pop(3), plain.pop(4)
    ok = 6 * y <= 0.5
    ys = np.where(ok, y, 0.0)
    for key, coef in (("w", _RS_P[2]), ("r3", _RS_P[3]), ("u", _RS_P[4]), ("g", _RS_P["g"])):
        val, err = _log1p_sum(coef, ys, alpha, ey)
        out[f"{key}P"], out[f"e{key}P"] = pick(plain[key], (val, np.where(ok, err, np.inf)))
    out["inf2P"] = inf[2]
    out["inf4P"] = inf[4] | inf[3] | inf[2]
    # G_T: D_k = -alpha log1p(theta g_k), g_k = k (T - k) / (2T)
    DG, eDG, EG, infG = [0.0], [0.0], [0.0], {}
    for k in (1, 2, 3, 4):
        g = k * (T - k) / (2 * T)
        d, e, infG[k], dd = _rs_logs(theta * g, 4 * U, eth, alpha)
        DG.append(d)
        eDG.append(e)
        EG.append(dd)
    out["bG"], out["ebG"] = DG[1], eDG[1] + eth * np.abs(EG[1])
    okG = theta <= 0.2
    Ts = np.broadcast_to(T, np.broadcast(T, theta).shape)
    if np.any(okG & (Ts > 1)):
        uniq, inv = np.unique(Ts, return_inverse=True)
        coefs = np.stack([_rs_g_coef(int(t)) for t in uniq])[inv.reshape(Ts.shape)]  # (..., 3, n)
    else:
        coefs = None
    th = np.broadcast_to(np.where(okG, theta, 0.0), Ts.shape)
    for i, (n, key) in enumerate(((2, "wG"), (3, "r3G"), (4, "uG"))):
        pl = _rs_diffs(DG[: n + 1], eDG[: n + 1], EG[: n + 1], eth, n)
        if coefs is None:
            out[key], out[f"e{key}"] = pl
            continue
        # alpha sum_n (-theta)^n Delta^m[g^n] / n
        val, err = _log1p_sum(np.moveaxis(coefs[..., i, :], -1, 0), -th, alpha, eth)
        out[key], out[f"e{key}"] = pick(pl, (val, np.where(okG, err, np.inf)))
    out["inf4G"] = np.where(T == 1, out["inf4P"], infG[4])
    return out


@dataclass(frozen=True)
class RandomScale(Family):
    r"""Sequence-level heterogeneity: each sequence draws its own log-ratio variance.

    A sequence draws :math:`v \sim \mathrm{Gamma}(\alpha, \theta)` (shape :math:`\alpha`,
    scale :math:`\theta`); given :math:`v` its tokens' log-ratios are i.i.d.
    :math:`N(\log\mu - v/2, v)`, so :math:`E[r \mid v] = \mu`. The tokens of one sequence
    are exchangeable, not independent, and averaging :math:`e^{T K_v(s)}` over :math:`v`
    gives, exactly,

    .. math::

        E[P_T^s] = \mu^{sT}\Bigl(1 - \theta T \frac{s(s-1)}{2}\Bigr)^{-\alpha}

    where the bracket is positive, and :math:`+\infty` otherwise. :math:`\theta` is set by
    the marginal variance of one ratio, :math:`E[r^2] = \mu^2 (1-\theta)^{-\alpha} =
    \mu^2 + \sigma^2`, so :math:`\theta = 1 - (1 + \sigma^2/\mu^2)^{-1/\alpha}`.

    Consequences: :math:`\operatorname{Var}(P_T)` is infinite for :math:`T \ge 1/\theta`
    (the bracket at :math:`s = 2` is :math:`1 - \theta T`), and
    :math:`\operatorname{Var}(G_T) = \mu^2[(1 + \theta(1 - 2/T))^{-\alpha}
    - (1 + \theta(1 - 1/T)/2)^{-2\alpha}]` levels off at
    :math:`\mu^2[(1+\theta)^{-\alpha} - (1+\theta/2)^{-2\alpha}]` instead of falling like
    :math:`1/T`. :math:`K(s)` is the marginal of one token (:math:`T = 1`);
    :math:`E[\log r] = \log\mu - \alpha\theta/2` and
    :math:`\operatorname{Var}[\log r] = \alpha\theta + \alpha\theta^2/4`. As
    :math:`\alpha \to \infty` (with :math:`\mu, \sigma^2` fixed) :math:`v` concentrates at
    :math:`\log(1 + \sigma^2/\mu^2)` and the family tends to the lognormal one.

    Parameters
    ----------
    alpha : float, default 1
        Shape of the gamma law of the per-sequence variance, ``alpha > 0``; small values
        mean strong heterogeneity between sequences.
    """

    alpha: float = 1.0
    name: ClassVar[str] = "random-scale"
    float_parts = staticmethod(_random_scale_parts)

    def _check_reachable(self) -> None:
        object.__setattr__(self, "alpha", check_positive("alpha", self.alpha))

    @property
    def theta(self) -> float:
        r"""Scale :math:`\theta = 1 - (1 + \sigma^2/\mu^2)^{-1/\alpha}` of the variance's gamma law."""
        return -math.expm1(-math.log1p(self.sigma2 / self.mu**2) / self.alpha)

    def theta_mp(self) -> mpmath.mpf:
        """:attr:`theta` at the current mpmath precision."""
        return -mpmath.expm1(-mpmath.log1p(mpmath.mpf(self.sigma2) / mpmath.mpf(self.mu) ** 2) / self.alpha)

    @property
    def critical_T(self) -> float:
        r""":math:`1/\theta`: :math:`\operatorname{Var}(P_T)` is infinite for every :math:`T \ge 1/\theta`."""
        return math.inf if self.degenerate else 1.0 / self.theta

    def var_G_limit(self) -> float:
        r"""Return the limit of :math:`\operatorname{Var}(G_T)` as :math:`T \to \infty`.

        It is :math:`\mu^2[(1+\theta)^{-\alpha} - (1+\theta/2)^{-2\alpha}]`.
        """
        with mpmath.workdps(40):
            th, a = self.theta_mp(), mpmath.mpf(self.alpha)
            return float(mpmath.mpf(self.mu) ** 2 * ((1 + th) ** -a - (1 + th / 2) ** (-2 * a)))

    def _K(self, s):
        bracket = 1.0 - self.theta * s * (s - 1.0) / 2.0
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = -self.alpha * np.log1p(-self.theta * s * (s - 1.0) / 2.0)
        return s * math.log(self.mu) + np.where(bracket > 0, inner, np.inf)

    def _K_mp(self, s):
        return self.cgf_sum_mp(1, s)

    def cgf_sum_mp(self, T: int, s) -> mpmath.mpf:
        r"""Return the log moment of :math:`P_T`.

        :math:`\log E[P_T^s] = sT\log\mu - \alpha\log(1 - \theta T s(s-1)/2)`, ``+inf`` where
        the bracket is not positive.
        """
        s = mpmath.mpf(s)
        if self.degenerate:
            return s * T * mpmath.log(self.mu)
        bracket = 1 - self.theta_mp() * T * s * (s - 1) / 2
        if bracket <= 0:
            return mpmath.inf
        return s * T * mpmath.log(self.mu) - self.alpha * mpmath.log(bracket)

    def _log_moments_mp(self):
        th, a = self.theta_mp(), mpmath.mpf(self.alpha)
        return mpmath.log(self.mu) - a * th / 2, a * th + a * th * th / 4

    def var_sum_mp(self, T: int) -> mpmath.mpf:
        r""":math:`\operatorname{Var}(\log P_T) = T\alpha\theta + T^2\alpha\theta^2/4` (mpmath).

        Given :math:`v`, :math:`\log P_T \sim N(T(\log\mu - v/2), Tv)`; with
        :math:`E[v] = \alpha\theta` and :math:`\operatorname{Var}(v) = \alpha\theta^2`,
        :math:`\operatorname{Var}(\log P_T) = T E[v] + T^2 \operatorname{Var}(v)/4`: the tokens
        of one sequence share :math:`v`, so it grows like :math:`T^2`, not :math:`T`.
        """
        if self.degenerate:
            return mpmath.mpf(0)
        th, a = self.theta_mp(), mpmath.mpf(self.alpha)
        return T * a * th + T * T * a * th * th / 4

    def _sampler_params(self):
        return CODE_RANDOM_SCALE, np.array([math.log(self.mu), self.alpha, self.theta])

    def describe(self) -> dict:
        """Plain-dict description (family name, mu, sigma2 and alpha), for provenance."""
        return {**super().describe(), "alpha": self.alpha}
