r"""Distributions of the per-token importance ratio :math:`r > 0`.

Every family is parametrised by the mean :math:`\mu = E[r] > 0` and the variance
:math:`\sigma^2 = \operatorname{Var}(r) \ge 0` of the ratio (the seed's parameters),
and exposes the log-moment function

.. math::

    K(s) = \log E[r^s] = \log E[e^{sY}], \qquad Y = \log r,

which is the cumulant generating function of :math:`Y`. Everything in
:mod:`variance_lab.theory` follows from :math:`K`. Each family gives :math:`K` twice:
vectorised in float64 (:meth:`Family.K`) and at arbitrary precision with mpmath
(:meth:`Family.K_mp`), which the theory uses so that differences such as
:math:`T K(2/T) - 2 T K(1/T)` keep their digits at :math:`T = 10^6`.

:math:`\sigma^2 = 0` is the degenerate ratio :math:`r = \mu` in every family.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from functools import cached_property
from typing import ClassVar

import mpmath
import numpy as np
from scipy import special

from variance_lab._validate import check_finite, check_positive

__all__ = [
    "AR1",
    "FAMILIES",
    "Family",
    "Gamma",
    "LogNormal",
    "TwoPoint",
    "get_family",
]

# Kernel dispatch codes (see variance_lab.simulate); the degenerate ratio r = mu has
# its own code so that samplers never divide by a zero variance.
CODE_DEGENERATE = 0
CODE_LOGNORMAL = 1
CODE_GAMMA = 2
CODE_TWO_POINT = 3
CODE_AR1 = 4


@dataclass(frozen=True)
class Family(ABC):
    """A distribution of the per-token ratio ``r`` with mean ``mu`` and variance ``sigma2``.

    Parameters
    ----------
    mu : float
        Mean of the ratio, ``mu > 0``.
    sigma2 : float
        Variance of the ratio, ``sigma2 >= 0``; ``0`` is the degenerate ratio ``r = mu``.
    """

    mu: float
    sigma2: float
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        """Check mu > 0 and a finite sigma2 >= 0, and that the family can reach them."""
        object.__setattr__(self, "mu", check_positive("mu", self.mu))
        sigma2 = check_finite("sigma2", self.sigma2)
        if sigma2 < 0:
            raise ValueError(f"sigma2 must be >= 0, got {sigma2!r}")
        object.__setattr__(self, "sigma2", sigma2)
        self._check_reachable()

    # -- to be provided by each family ------------------------------------------------
    def _check_reachable(self) -> None:
        """Raise ``ValueError`` if the family cannot have this (mu, sigma2); all reachable here."""
        return None

    @abstractmethod
    def _K(self, s: np.ndarray) -> np.ndarray:
        """float64 K(s) for sigma2 > 0."""

    @abstractmethod
    def _K_mp(self, s: mpmath.mpf) -> mpmath.mpf:
        """Return K(s) in mpmath for sigma2 > 0, at the current working precision."""

    @abstractmethod
    def _log_moments_mp(self) -> tuple[mpmath.mpf, mpmath.mpf]:
        """(E[log r], Var[log r]) for sigma2 > 0, at the current working precision."""

    @abstractmethod
    def _sampler_params(self) -> tuple[int, np.ndarray]:
        """(kernel code, float64 parameter vector) for sigma2 > 0."""

    # -- public interface -------------------------------------------------------------
    @property
    def degenerate(self) -> bool:
        """True when ``sigma2 == 0``, that is ``r = mu`` with probability one."""
        return self.sigma2 == 0.0

    def K(self, s):
        r"""Log-moment function :math:`K(s) = \log E[r^s]`, vectorised over ``s``.

        Parameters
        ----------
        s : float or array_like
            Real moment orders; the gamma family needs ``s > -mu**2/sigma2``.

        Returns
        -------
        float or ndarray
            :math:`K(s)` in float64, the shape of ``s``.
        """
        s_arr = np.asarray(s, dtype=float)
        out = s_arr * math.log(self.mu) if self.degenerate else self._K(s_arr)
        return float(out) if np.ndim(out) == 0 else out

    def K_mp(self, s) -> mpmath.mpf:
        """:math:`K(s)` as an ``mpmath.mpf`` at the current mpmath working precision."""
        s = mpmath.mpf(s)
        if self.degenerate:
            return s * mpmath.log(self.mu)
        return self._K_mp(s)

    def cgf_sum_mp(self, T: int, s) -> mpmath.mpf:
        r""":math:`\log E[e^{s S_T}]` of the sum :math:`S_T = \sum_{t \le T} \log r_t = \log P_T`.

        :math:`T K(s)` for i.i.d. ratios; a family with dependent ratios (AR(1)) overrides
        this, and the theory follows, since :math:`E[P_T^k] = e^{\mathrm{cgf}(T, k)}` and
        :math:`E[G_T^k] = e^{\mathrm{cgf}(T, k/T)}`.
        """
        return T * self.K_mp(s)

    def log_moments_mp(self) -> tuple[mpmath.mpf, mpmath.mpf]:
        r""":math:`(E[\log r], \operatorname{Var}[\log r])` as mpmath numbers."""
        if self.degenerate:
            return mpmath.log(self.mu), mpmath.mpf(0)
        return self._log_moments_mp()

    @cached_property
    def mean_log(self) -> float:
        r""":math:`\mu_y = E[\log r] = K'(0)`."""
        with mpmath.workdps(30):
            return float(self.log_moments_mp()[0])

    @cached_property
    def var_log(self) -> float:
        r""":math:`\sigma_y^2 = \operatorname{Var}[\log r] = K''(0)`."""
        with mpmath.workdps(30):
            return float(self.log_moments_mp()[1])

    def sampler_params(self) -> tuple[int, np.ndarray]:
        """Return what a kernel needs to draw ``log r``: an integer code and a float64 vector.

        ============  =======================================================
        code          parameters
        ============  =======================================================
        0 degenerate  ``[log mu]``
        1 lognormal   ``[mean_log, sd_log]``: ``log r = m + s Z``
        2 gamma       ``[shape k, log scale]``: ``r = scale * Gamma(k, 1)``
        3 two-point   ``[q, log a, log b]``: ``log r = log a`` with probability q
        4 ar1         ``[m, s, rho]``: ``Y_1 = m + s Z_1``,
                      ``Y_t = m + rho (Y_{t-1} - m) + s sqrt(1 - rho^2) Z_t``
        ============  =======================================================
        """
        if self.degenerate:
            return CODE_DEGENERATE, np.array([math.log(self.mu)])
        return self._sampler_params()

    def describe(self) -> dict:
        """Plain-dict description (family name and parameters), for provenance."""
        return {"family": self.name, "mu": self.mu, "sigma2": self.sigma2}


@dataclass(frozen=True)
class LogNormal(Family):
    r"""Lognormal ratio: :math:`\log r \sim N(m, v)`.

    Here :math:`v = \log(1 + \sigma^2/\mu^2)` and :math:`m = \log\mu - v/2`.

    :math:`K(s) = s m + s^2 v / 2`. Reaches every :math:`\mu > 0, \sigma^2 \ge 0`.
    """

    name: ClassVar[str] = "lognormal"

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
class Gamma(Family):
    r"""Gamma ratio with shape :math:`k = \mu^2/\sigma^2` and scale :math:`\theta = \sigma^2/\mu`.

    :math:`K(s) = \log\Gamma(k+s) - \log\Gamma(k) + s\log\theta` for :math:`s > -k`;
    :math:`E[\log r] = \psi(k) + \log\theta`, :math:`\operatorname{Var}[\log r] = \psi'(k)`.
    Reaches every :math:`\mu > 0, \sigma^2 \ge 0`.
    """

    name: ClassVar[str] = "gamma"

    @property
    def shape(self) -> float:
        """Shape parameter k = mu^2 / sigma^2 of the gamma distribution of r."""
        return self.mu**2 / self.sigma2

    def _K(self, s):
        k = self.shape
        if np.any(s <= -k):
            raise ValueError(f"gamma K(s) needs s > -shape = {-k!r}")
        return _lgamma_ratio(k, s) + s * math.log(self.mu)

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


# Stirling-series coefficients B_2j / (2j (2j - 1)), j = 1..8.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400)


def _stirling_tail(x):
    """sum_j B_2j / (2j (2j-1) x^(2j-1)): log Gamma(x) minus its leading Stirling terms."""
    inv, inv2 = 1.0 / x, 1.0 / (x * x)
    out = np.zeros_like(x)
    for c in reversed(_STIRLING):
        out = out * inv2 + c
    return out * inv


def _lgamma_ratio(k: float, s):
    r""":math:`\log\Gamma(k+s) - \log\Gamma(k) - s\log k` in float64, accurate for large ``k``.

    For :math:`\min(k, k+s) \ge 10` it uses Stirling's series,
    :math:`(k + s - \tfrac12)\operatorname{log1p}(s/k) - s + c(k+s) - c(k)` with the
    tail :math:`c`; the plain difference of ``gammaln`` loses digits as :math:`k` grows.
    """
    s = np.asarray(s, dtype=float)
    direct = special.gammaln(k + s) - special.gammaln(k) - s * math.log(k)
    x = np.maximum(k + s, 10.0)
    series = (k + s - 0.5) * np.log1p(s / k) - s + _stirling_tail(x) - _stirling_tail(np.asarray(k))
    return np.where((k >= 10) & (k + s >= 10), series, direct)


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

    def _check_reachable(self) -> None:
        rho = check_finite("rho", self.rho)
        if not -1.0 < rho < 1.0:
            raise ValueError(f"ar1 rho must lie in (-1, 1), got {rho!r}")
        object.__setattr__(self, "rho", rho)

    def var_sum_mp(self, T: int) -> mpmath.mpf:
        r""":math:`V_T = \operatorname{Var}(\log P_T)` at the current mpmath precision."""
        _, v = self.log_moments_mp()
        rho = mpmath.mpf(self.rho)
        return v * (T * (1 + rho) / (1 - rho) - 2 * rho * (1 - rho**T) / (1 - rho) ** 2)

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


FAMILIES: dict[str, type[Family]] = {cls.name: cls for cls in (LogNormal, Gamma, TwoPoint, AR1)}


def get_family(name: str, mu: float, sigma2: float, **params) -> Family:
    """Build a family by name.

    Parameters
    ----------
    name : str
        One of :data:`FAMILIES` (``"lognormal"``, ``"gamma"``, ``"two-point"``, ``"ar1"``).
    mu, sigma2 : float
        Mean and variance of the ratio.
    **params
        Extra family parameters (``q`` for ``two-point``, ``rho`` for ``ar1``).

    Raises
    ------
    ValueError
        For an unknown family, a bad parameter, or one the family cannot reach.
    """
    try:
        cls = FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}") from None
    allowed = {f.name for f in fields(cls)} - {"mu", "sigma2"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        takes = f"takes only {', '.join(sorted(allowed))}" if allowed else "takes no extra parameters"
        raise ValueError(f"family {name!r} has no parameter {unknown[0]!r}; it {takes}")
    return cls(mu, sigma2, **params)
