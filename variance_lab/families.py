r"""Distributions of the per-token importance ratio :math:`r > 0`.

Every family is parametrised by the mean :math:`\mu = E[r] > 0` and the variance
:math:`\sigma^2 = \operatorname{Var}(r) \ge 0` of the ratio (the derivation's parameters),
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
    "LognormalMixture",
    "RandomScale",
    "TwoPoint",
    "format_components",
    "get_family",
    "parse_components",
]

# Kernel dispatch codes (see variance_lab.simulate); the degenerate ratio r = mu has
# its own code so that samplers never divide by a zero variance.
CODE_DEGENERATE = 0
CODE_LOGNORMAL = 1
CODE_GAMMA = 2
CODE_TWO_POINT = 3
CODE_AR1 = 4
CODE_RANDOM_SCALE = 5
CODE_MIXTURE = 6


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
    #: True when mu and sigma2 follow from the family's other parameters (a mixture's components).
    derived_moments: ClassVar[bool] = False
    #: Extra parameters given as text rather than numbers (a mixture's components).
    text_parameters: ClassVar[tuple[str, ...]] = ()

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

        ==============  =======================================================
        code            parameters
        ==============  =======================================================
        0 degenerate    ``[log mu]``
        1 lognormal     ``[mean_log, sd_log]``: ``log r = m + s Z``
        2 gamma         ``[shape k, log scale]``: ``r = scale * Gamma(k, 1)``
        3 two-point     ``[q, log a, log b]``: ``log r = log a`` with probability q
        4 ar1           ``[m, s, rho]``: ``Y_1 = m + s Z_1``,
                        ``Y_t = m + rho (Y_{t-1} - m) + s sqrt(1 - rho^2) Z_t``
        5 random-scale  ``[log mu, alpha, theta]``: per sequence
                        ``v = theta Gamma(alpha, 1)``, then
                        ``Y_t = log mu - v/2 + sqrt(v) Z_t``
        6 mixture       ``[K, c_1..c_K, m_1..m_K, s_1..s_K, p_1..p_K]`` (length
                        ``1 + 4K``): cumulative weights ``c_j = w_1 + .. + w_j``
                        (``c_K = 1``), component means and sds (``s_j = sqrt v_j``),
                        and ``p_j = w_j / (w_j + .. + w_K)``, the probability of
                        component j given that none of 1..j-1 was chosen
                        (``p_K = 1``): ``Y = m_j + s_j Z`` with ``j`` the first
                        index with ``U < c_j``
        ==============  =======================================================
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
    use = (k >= 10) & (k + s >= 10)
    ss = np.where(use, s, 0.0)  # np.where evaluates both branches: log1p(s / k) is NaN for s < -k
    series = (k + ss - 0.5) * np.log1p(ss / k) - ss + _stirling_tail(np.maximum(k + ss, 10.0))
    return np.where(use, series - _stirling_tail(np.asarray(k)), direct)


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


def parse_components(spec) -> tuple[tuple[float, float, float], ...]:
    """Components of a lognormal mixture as ``((weight, mean, variance), ...)`` in log space.

    Parameters
    ----------
    spec : str or sequence of (float, float, float)
        ``"w:m:v,w:m:v,..."`` (as on the command line, e.g. ``"0.98:0:1e-8,0.02:-0.005:0.01"``)
        or a sequence of triples. Weights must be > 0 and sum to 1 within 1e-9 (they
        are then normalised to sum to 1 exactly), means finite, variances >= 0.

    Returns
    -------
    tuple of (float, float, float)

    Raises
    ------
    ValueError
        Naming the bad component or value.
    """
    if isinstance(spec, str):
        triples = []
        for part in spec.split(","):
            fields_ = part.strip().split(":")
            if len(fields_) != 3:
                raise ValueError(f"component {part.strip()!r} must be weight:mean:variance, in {spec!r}")
            try:
                triples.append(tuple(float(x) for x in fields_))
            except ValueError:
                raise ValueError(f"component {part.strip()!r} has a value that is not a number") from None
    else:
        try:
            triples = [tuple(c) for c in spec]
        except TypeError:
            raise ValueError(
                f"components must be 'w:m:v,...' or a sequence of triples, got {spec!r}"
            ) from None
    if not triples:
        raise ValueError(
            "lognormal-mixture needs components: weight:mean:variance of log r, "
            "e.g. '0.98:0:1e-8,0.02:-0.005:0.01'"
        )
    out = []
    for i, c in enumerate(triples):
        if len(c) != 3:
            raise ValueError(f"component {i} must be (weight, mean, variance), got {c!r}")
        w = check_finite(f"component {i} weight", c[0])
        m = check_finite(f"component {i} mean", c[1])
        v = check_finite(f"component {i} variance", c[2])
        if w <= 0:
            raise ValueError(f"component {i} weight must be > 0, got {w!r}")
        if v < 0:
            raise ValueError(f"component {i} variance must be >= 0, got {v!r}")
        out.append((w, m, v))
    total = math.fsum(w for w, _, _ in out)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"component weights must sum to 1, got {total!r}")
    return tuple((w / total, m, v) for w, m, v in out)


def format_components(components) -> str:
    """Return the canonical ``"w:m:v,..."`` text of parsed components (shortest round-trip floats)."""
    return ",".join(":".join(repr(float(x)) for x in c) for c in components)


@dataclass(frozen=True)
class LognormalMixture(Family):
    r"""Heavy-tailed, sparse token ratios: a mixture of lognormals.

    Each token's log-ratio comes from component :math:`j`, :math:`N(m_j, v_j)`, with probability
    :math:`w_j`, independently.

    .. math::

        K(s) = \log \sum_j w_j \exp(s m_j + s^2 v_j / 2).

    The tokens stay i.i.d., so the theory is the i.i.d. one. The family is parametrised by
    its components in log space; :math:`\mu = e^{K(1)}` and
    :math:`\sigma^2 = e^{K(2)} - e^{2K(1)}` are derived (pass ``mu=None, sigma2=None``, or
    the derived values). :math:`E[\log r] = \sum_j w_j m_j`,
    :math:`\operatorname{Var}[\log r] = \sum_j w_j (v_j + (m_j - E[\log r])^2)`.

    Parameters
    ----------
    components : str or sequence of (weight, mean, variance)
        See :func:`parse_components`, e.g. ``"0.98:0:1e-8,0.02:-0.005:0.01"``.
    """

    components: tuple = ()
    name: ClassVar[str] = "lognormal-mixture"
    derived_moments: ClassVar[bool] = True
    text_parameters: ClassVar[tuple[str, ...]] = ("components",)

    def __post_init__(self) -> None:
        """Parse the components and derive mu and sigma2 from them; a given mu or sigma2 must agree."""
        comps = parse_components(self.components)
        object.__setattr__(self, "components", comps)
        with mpmath.workdps(60):
            ws = self._mp()
            e1 = mpmath.fsum(w * mpmath.exp(m + v / 2) for w, m, v in ws)
            e2 = mpmath.fsum(w * mpmath.exp(2 * m + 2 * v) for w, m, v in ws)
            mu, sigma2 = float(e1), float(e2 - e1 * e1)
        if len({m for _, m, _ in comps}) == 1 and all(v == 0 for _, _, v in comps):
            sigma2 = 0.0
        for label, given, derived in (("mu", self.mu, mu), ("sigma2", self.sigma2, sigma2)):
            if given is not None and not (
                isinstance(given, int | float) and abs(given - derived) <= 1e-9 * abs(derived)
            ):
                raise ValueError(
                    f"lognormal-mixture derives {label} from its components ({label} = {derived!r}); "
                    f"got {label}={given!r}: leave it unset"
                )
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma2", sigma2)

    def _K(self, s):
        w, m, v = (np.array(x) for x in zip(*self.components, strict=True))
        terms = np.log(w) + np.multiply.outer(s, m) + np.multiply.outer(s * s, v) / 2
        return special.logsumexp(terms, axis=-1)

    def _K_mp(self, s):
        return mpmath.log(mpmath.fsum(w * mpmath.exp(s * m + s * s * v / 2) for w, m, v in self._mp()))

    def _mp(self):
        """Return the components as mpmath numbers, the weights normalised to sum to 1.

        Normalised at this precision: float weights sum to 1 only up to rounding, and T K(1/T) would
        carry T times the error.
        """
        total = mpmath.fsum(mpmath.mpf(w) for w, _, _ in self.components)
        return [(mpmath.mpf(w) / total, mpmath.mpf(m), mpmath.mpf(v)) for w, m, v in self.components]

    def _log_moments_mp(self):
        comps = self._mp()
        mean = mpmath.fsum(w * m for w, m, _ in comps)
        return mean, mpmath.fsum(w * (v + (m - mean) ** 2) for w, m, v in comps)

    def _sampler_params(self):
        w = [c[0] for c in self.components]
        k = len(w)
        cum = [math.fsum(w[: j + 1]) for j in range(k)]
        cum[-1] = 1.0  # a uniform U < 1 always finds a component
        cond = [w[j] / math.fsum(w[j:]) for j in range(k)]
        cond[-1] = 1.0
        means = [c[1] for c in self.components]
        sds = [math.sqrt(c[2]) for c in self.components]
        return CODE_MIXTURE, np.array([float(k), *cum, *means, *sds, *cond])

    def describe(self) -> dict:
        """Plain-dict description (family name, mu, sigma2 and canonical components), for provenance."""
        return {**super().describe(), "components": format_components(self.components)}


FAMILIES: dict[str, type[Family]] = {
    cls.name: cls for cls in (LogNormal, Gamma, TwoPoint, AR1, RandomScale, LognormalMixture)
}


def get_family(name: str, mu: float | None = None, sigma2: float | None = None, **params) -> Family:
    """Build a family by name.

    Parameters
    ----------
    name : str
        One of :data:`FAMILIES` (``"lognormal"``, ``"gamma"``, ``"two-point"``, ``"ar1"``).
    mu, sigma2 : float
        Mean and variance of the ratio. ``lognormal-mixture`` derives both from its
        components: leave them ``None`` (or give the derived values).
    **params
        Extra family parameters (``q`` for ``two-point``, ``rho`` for ``ar1``, ``alpha``
        for ``random-scale``, ``components`` for ``lognormal-mixture``).

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
