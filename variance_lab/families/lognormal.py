r"""The lognormal family and its correlated variant, AR(1) log-ratios.

Each class holds its parameters and validation, :math:`K(s)` (float64 and mpmath), the
log-ratio moments, the sampler parameters, and its float64 theory parts
(:attr:`variance_lab.families.base.Family.float_parts`); :func:`ar1_var_sum` is the one
formula for :math:`\operatorname{Var}(\log P_T)` of AR(1) log-ratios, which the aggregate
sampler's tables use too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np

from variance_lab._validate import check_finite
from variance_lab.families.base import CODE_AR1, CODE_LOGNORMAL, Family
from variance_lab.stats.special import UNIT_ROUNDOFF as U

__all__ = ["AR1", "LogNormal", "ar1_var_sum"]


def ar1_var_sum(v, rho, T):
    r""":math:`V_T = \operatorname{Var}(\sum_{t \le T} Y_t)`: stationary AR(1), marginal variance ``v``.

    .. math::

        V_T = v \Bigl[T \frac{1+\rho}{1-\rho} - \frac{2\rho(1-\rho^T)}{(1-\rho)^2}\Bigr].

    Computed in the arithmetic of its arguments: :meth:`AR1.var_sum_mp` passes mpmath numbers
    of the global context, the aggregate sampler's tables
    (:func:`variance_lab.simulate.aggregate.aggregate_table`) those of a private 50-digit one.

    Parameters
    ----------
    v : mpmath.mpf or float
        Marginal variance of one :math:`Y_t`.
    rho : mpmath.mpf or float
        Lag-one correlation, :math:`-1 < \rho < 1`.
    T : int
        Number of terms.

    Returns
    -------
    mpmath.mpf or float
        :math:`V_T`, of the type of ``v`` and ``rho``.
    """
    return v * (T * (1 + rho) / (1 - rho) - 2 * rho * (1 - rho**T) / (1 - rho) ** 2)


# ---------------------------------------------------------------------- float theory parts
# Family.float_parts: a dict of arrays broadcastable to (parameters, T), each with an
# absolute error estimate "e" + key (the keys are listed at Family.float_parts).
def _lognormal_parts(mu, s2, T, shape):
    """Float theory parts of the lognormal family (:attr:`Family.float_parts`): no cancellation."""
    v = np.log1p(s2 / (mu * mu))
    lmu = np.log(mu)
    zero = np.zeros_like(v)
    out = {
        "lmP": T * lmu,
        "wP": T * v,
        "bG": -0.5 * v + 0.5 * (v / T),  # gap + w_G / 2, the form var_G_lognormal takes
        "wG": v / T,
        "gap": -0.5 * v,
        "k2": v,
    }
    for key in ("r3P", "uP", "r3G", "uG"):
        out[key] = zero
    err = {f"e{k}": 2 * U * np.abs(x) for k, x in out.items()}
    return {**out, **err}


def _ar1_sum(rho, T):
    r"""(:math:`S_T = \sum_{k<T} (T-k)\rho^k`, its error estimate); :math:`V_T = v(T + 2S_T)`."""
    one = 1 - rho
    pw = np.power(rho, T)
    inner = T * one - (1 - pw)
    S = rho * inner / (one * one)
    eS = (2 * U * (T * one + 1 + np.abs(pw)) + U * T * np.abs(pw)) * np.abs(rho) / (one * one)
    return S, eS + 2 * U * np.abs(S)


def _ar1_parts(mu, s2, T, shape):
    """Compute AR(1) log-ratios: the lognormal parts plus the correlation terms.

    Exactly the lognormal's numbers at rho = 0.
    """
    out = _lognormal_parts(mu, s2, T, shape)
    v = out["k2"]
    S, eS = _ar1_sum(np.asarray(shape["rho"], dtype=float), T)
    add = {
        "lmP": v * S,  # log E[P_T] = T log mu + v S
        "wP": 2 * v * S,  # V_T = v T + 2 v S
        "bG": v * S / (T * T),
        "wG": 2 * v * S / (T * T),
    }
    for key, x in add.items():
        ex = np.abs(x) * (eS / np.maximum(np.abs(S), 1e-300) + 2 * U)
        out[key] = out[key] + x
        out[f"e{key}"] = out[f"e{key}"] + ex + U * np.abs(out[key])
    return out


@dataclass(frozen=True)
class LogNormal(Family):
    r"""Lognormal ratio: :math:`\log r \sim N(m, v)`.

    Here :math:`v = \log(1 + \sigma^2/\mu^2)` and :math:`m = \log\mu - v/2`.

    :math:`K(s) = s m + s^2 v / 2`. Reaches every :math:`\mu > 0, \sigma^2 \ge 0`.
    """

    name: ClassVar[str] = "lognormal"
    float_parts = staticmethod(_lognormal_parts)

    def _mv(self) -> tuple[float, float]:
        v = math.log1p(self.sigma2 / self.mu**2)
        return math.log(self.mu) - v / 2, v

    def _K(self, s):
        m, v = self._mv()
        return s * m + 0.5 * s * s * v

    def _log_moments_mp(self):
        v = mpmath.log1p(mpmath.mpf(self.sigma2) / mpmath.mpf(self.mu) ** 2)
        return mpmath.log(self.mu) - v / 2, v

    def _K_mp(self, s):
        m, v = self._log_moments_mp()
        return s * m + s * s * v / 2

    def _sampler_params(self):
        m, v = self._mv()
        return CODE_LOGNORMAL, np.array([m, math.sqrt(v)])


@dataclass(frozen=True)
class AR1(LogNormal):
    r"""Correlated lognormal ratios: :math:`\log r_t` is a stationary Gaussian AR(1) process.

    :math:`Y_t - m = \rho (Y_{t-1} - m) + \varepsilon_t`, with the lognormal family's
    marginal :math:`Y_t \sim N(m, v)` (so each :math:`r_t` has mean :math:`\mu` and
    variance :math:`\sigma^2`) and lag-one correlation :math:`\rho \in (-1, 1)`. The ratios
    are not independent, so :math:`\log P_T = \sum_t Y_t \sim N(T m, V_T)` with

    .. math::

        V_T = v \Bigl[T + 2\sum_{k=1}^{T-1} (T - k)\rho^k\Bigr]
            = v \Bigl[T \frac{1+\rho}{1-\rho} - \frac{2\rho(1-\rho^T)}{(1-\rho)^2}\Bigr],

    and :math:`\log E[P_T^s] = s T m + s^2 V_T / 2` replaces :math:`T K(s)` in the theory.
    :math:`K(s)` is the marginal (lognormal) one. :math:`\rho = 0` is the lognormal family.

    Parameters
    ----------
    rho : float, default 0
        Lag-one correlation of the log-ratios, ``-1 < rho < 1``.
    """

    rho: float = 0.0
    name: ClassVar[str] = "ar1"
    float_parts = staticmethod(_ar1_parts)

    def _check_reachable(self) -> None:
        rho = check_finite("rho", self.rho)
        if not -1.0 < rho < 1.0:
            raise ValueError(f"ar1 rho must lie in (-1, 1), got {rho!r}")
        object.__setattr__(self, "rho", rho)

    def var_sum_mp(self, T: int) -> mpmath.mpf:
        r""":math:`V_T = \operatorname{Var}(\log P_T)` at the current mpmath precision."""
        _, v = self.log_moments_mp()
        return ar1_var_sum(v, mpmath.mpf(self.rho), T)

    def cgf_sum_mp(self, T: int, s) -> mpmath.mpf:
        r""":math:`\log E[e^{s \log P_T}] = s T m + s^2 V_T / 2`, :math:`m = E[\log r]`: Gaussian."""
        m, _ = self.log_moments_mp()
        s = mpmath.mpf(s)
        return s * T * m + s * s * self.var_sum_mp(T) / 2

    def _sampler_params(self):
        m, v = self._mv()
        return CODE_AR1, np.array([m, math.sqrt(v), self.rho])

    def describe(self) -> dict:
        """Plain-dict description (family name, mu, sigma2 and rho), for provenance."""
        return {**super().describe(), "rho": self.rho}
