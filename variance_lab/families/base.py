r"""The base class of every ratio family, and the kernels' sampler codes.

A family (:class:`Family`) is a frozen dataclass of its parameters that validates them on
construction and gives everything the rest of the package needs from it, in one place:
:math:`K(s)` in float64 and in mpmath, :math:`E[\log r]` and :math:`\operatorname{Var}[\log r]`,
the cumulant generating function of :math:`\log P_T`, the sampler code and parameters the
kernels of :mod:`variance_lab.simulate.draws` draw from, and its vectorised float64 theory
parts (:attr:`Family.float_parts`, read by :mod:`variance_lab.theory.fast`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from functools import cached_property
from typing import ClassVar

import mpmath
import numpy as np

from variance_lab._validate import check_finite, check_positive

__all__ = [
    "CODE_AR1",
    "CODE_DEGENERATE",
    "CODE_GAMMA",
    "CODE_LOGNORMAL",
    "CODE_MIXTURE",
    "CODE_RANDOM_SCALE",
    "CODE_TWO_POINT",
    "Family",
    "check_sigma2",
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


def check_sigma2(value) -> float:
    """Return ``value`` as a float if it is a finite variance ``sigma2 >= 0``, else ``ValueError``."""
    sigma2 = check_finite("sigma2", value)
    if sigma2 < 0:
        raise ValueError(f"sigma2 must be >= 0, got {sigma2!r}")
    return sigma2


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
    #: The family's vectorised float64 theory parts, ``float_parts(mu, sigma2, T, shape) -> dict``,
    #: or None where the theory has no float path for it (then it is computed with mpmath).
    #: The dict holds arrays broadcastable to (parameters, T): ``lmP, wP, r3P, uP`` (the
    #: :math:`P_T` side: :math:`\log E[P_T]` and the differences :math:`\Delta^2, \Delta^3,
    #: \Delta^4` of :math:`\log E[P_T^s]` at step 1), ``bG`` (:math:`\log E[G_T] - \log\mu`),
    #: ``wG, r3G, uG`` (the same at step :math:`1/T`), ``gap`` and ``k2``
    #: (:math:`E[\log r] - \log\mu`, :math:`\operatorname{Var}[\log r]`), optionally ``gP``
    #: (:math:`f_4 - 2f_2 = 4w + 4r_3 + u`, :mod:`variance_lab.theory.fast`) and the flags
    #: ``inf2P, inf4P, inf4G`` of infinite moments, each value with an absolute error estimate
    #: under ``"e" + key``. ``shape`` maps each of :meth:`extra_parameters` to a broadcastable array.
    float_parts: ClassVar = None

    def __post_init__(self) -> None:
        """Check mu > 0 and a finite sigma2 >= 0, and that the family can reach them."""
        object.__setattr__(self, "mu", check_positive("mu", self.mu))
        object.__setattr__(self, "sigma2", check_sigma2(self.sigma2))
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

    @classmethod
    def extra_parameters(cls) -> tuple[str, ...]:
        """Names of the family's parameters beyond ``mu`` and ``sigma2``, in field order."""
        return tuple(f.name for f in fields(cls) if f.name not in ("mu", "sigma2"))

    @classmethod
    def stack_parameters(cls, families) -> dict:
        """Extra parameters of many families of this class, stacked for one :attr:`float_parts` call.

        Parameters
        ----------
        families : sequence of Family
            Instances of this class.

        Returns
        -------
        dict
            Each of :meth:`extra_parameters` as a float64 array of shape ``(len(families), 1)``
            (T on the last axis of the call).
        """
        names = cls.extra_parameters()
        return {k: np.array([getattr(f, k) for f in families], dtype=float)[:, None] for k in names}

    def describe(self) -> dict:
        """Plain-dict description (family name and parameters), for provenance."""
        return {"family": self.name, "mu": self.mu, "sigma2": self.sigma2}
