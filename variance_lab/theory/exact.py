r"""The mpmath reference path: exact and approximate moments at arbitrary precision.

For i.i.d. ratios with log-moment function :math:`K(s) = \log E[r^s]`:

.. math::

    E[P_T^k] = e^{T K(k)}, \qquad
    \operatorname{Var}(P_T) = e^{2TK(1)} \operatorname{expm1}\bigl(T(K(2) - 2K(1))\bigr)
                            = (\sigma^2 + \mu^2)^T - \mu^{2T},

    E[G_T^k] = e^{T K(k/T)}, \qquad
    \operatorname{Var}(G_T) = e^{2TK(1/T)} \operatorname{expm1}\bigl(T K(2/T) - 2T K(1/T)\bigr).

Approximations of the derivation (section 2), with :math:`\mu_y = E[\log r]`,
:math:`\sigma_y^2 = \operatorname{Var}[\log r]`:

.. math::

    \text{lognormal: } (e^{\sigma_y^2/T} - 1)\, e^{2\mu_y + \sigma_y^2/T}, \qquad
    \text{small-x: } \sigma_y^2 e^{2\mu_y} / T, \qquad
    \text{naive (the derivation's table): } \sigma^2 / T.

Reliability of plain Monte Carlo: with :math:`\kappa = m_4 / v^2` (fourth central moment
over squared variance) of :math:`X \in \{P_T, G_T\}`, the unbiased sample variance of
:math:`n` draws has relative standard error

.. math::

    \operatorname{rse}(n) = \sqrt{\bigl(\kappa - \tfrac{n-3}{n-1}\bigr) / n},

and the draws needed for a target relative error :math:`\varepsilon` are the root
:math:`n` of :math:`\operatorname{rse}(n) = \varepsilon`,
:math:`\varepsilon^2 n^2 - (\varepsilon^2 + \kappa - 1) n + (\kappa - 3) = 0`, that is
about :math:`(\kappa - 1)/\varepsilon^2`. The moments of :math:`Z = X / E[X]` are
:math:`E[Z^k] = e^{f_k}` with :math:`f_k = T(K(ks) - kK(s))`, :math:`s = 1` for
:math:`P_T` and :math:`s = 1/T` for :math:`G_T`, so
:math:`v / E[X]^2 = \operatorname{expm1}(f_2)` and
:math:`m_4 / E[X]^4 = e^{f_4} - 4e^{f_3} + 6e^{f_2} - 3`.

Numerics. Every value here is computed with mpmath at a working precision that grows with
:math:`\log_{10} T` and with :math:`-\log_{10}\sigma_y^2`, enough to absorb the
cancellation in :math:`T K(2/T) - 2TK(1/T)` and in the fourth central moment, and with
an unbounded exponent range. Linear values are then rounded to float64 (``inf`` or
``0.0`` beyond its range, never NaN); their ``log10`` twins stay exact. Results are
cached per (family, T).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import mpmath

from variance_lab.families import Family

__all__ = ["DEFAULT_TARGET", "QUANTITIES", "RENAMED_QUANTITIES", "exact_value"]

DEFAULT_TARGET = 0.1

#: Quantity names of earlier versions -> their names now. Asking for an old name is an error
#: that names the new one (:func:`variance_lab.theory.quantities.check_quantity`).
RENAMED_QUANTITIES = {"var_G_seed": "var_G_naive"}


class _Point(NamedTuple):
    """Exact quantities at one (family, T), as mpmath numbers."""

    mean_P: mpmath.mpf
    var_P: mpmath.mpf
    kurt_P: mpmath.mpf  # m4 / v**2 of P_T (nan when v == 0)
    mean_G: mpmath.mpf
    var_G: mpmath.mpf
    kurt_G: mpmath.mpf
    mean_log: mpmath.mpf
    var_log: mpmath.mpf
    dps: int  # working precision used, reused for derived quantities


def _dps(T: int, family: Family) -> int:
    """Working precision: 40 digits plus what the cancellations at this T can cost."""
    extra = 0
    if not family.degenerate:
        extra = max(0, -math.floor(math.log10(max(family.var_log, 1e-300))))
    return 40 + 4 * math.ceil(math.log10(T + 1)) + 2 * min(extra, 100)


def _normalised_moments(family: Family, T: int, s) -> tuple[mpmath.mpf, mpmath.mpf, mpmath.mpf]:
    """(log E[X], v / E[X]^2, m4 / E[X]^4) for X = exp(s * log P_T), from the family's cgf of log P_T."""
    c1 = family.cgf_sum_mp(T, s)
    if family.degenerate:  # X is constant: no rounding residue in place of a zero variance
        return c1, mpmath.mpf(0), mpmath.mpf(0)
    f2, f3, f4 = (family.cgf_sum_mp(T, k * s) - k * c1 for k in (2, 3, 4))
    v = mpmath.expm1(f2)
    if mpmath.isinf(f4):  # a moment of order <= 4 is infinite (random-scale beyond 1/theta)
        return c1, v, mpmath.inf
    m4 = mpmath.exp(f4) - 4 * mpmath.exp(f3) + 6 * mpmath.exp(f2) - 3
    return c1, v, m4


@lru_cache(maxsize=1 << 16)
def _point(family: Family, T: int) -> _Point:
    dps = _dps(T, family)
    with mpmath.workdps(dps):
        mean_log, var_log = family.log_moments_mp()
        out = []
        for s in (mpmath.mpf(1), mpmath.mpf(1) / T):
            log_mean, v, m4 = _normalised_moments(family, T, s)
            kurt = _kurtosis(v, m4)
            out.append((mpmath.exp(log_mean), mpmath.exp(2 * log_mean) * v, kurt))
        (mP, vP, kP), (mG, vG, kG) = out
        if family.degenerate:  # r = mu: exact, free of exp(log(mu)) rounding
            mP, mG = mpmath.mpf(family.mu) ** T, mpmath.mpf(family.mu)
        return _Point(+mP, +vP, +kP, +mG, +vG, +kG, +mean_log, +var_log, dps)


def _kurtosis(v, m4):
    """m4 / v^2: NaN for a constant (v == 0), inf when the fourth moment is infinite."""
    if not v > 0:
        return mpmath.nan
    if mpmath.isinf(m4):
        return mpmath.inf
    return m4 / v**2


def _rel_se(kurt, n: int):
    """Relative standard error of the unbiased sample variance of n draws."""
    if mpmath.isnan(kurt):  # zero variance: the sample variance is exactly 0
        return mpmath.mpf(0)
    if mpmath.isinf(kurt):  # infinite fourth moment: the sample variance has no finite error
        return mpmath.inf
    return mpmath.sqrt((kurt - mpmath.mpf(n - 3) / (n - 1)) / n)


def _n_needed(kurt, target):
    """Smallest real n with rse(n) = target (root of a quadratic); 2 when v == 0."""
    if mpmath.isnan(kurt):
        return mpmath.mpf(2)
    if mpmath.isinf(kurt):  # no number of draws gives a finite relative error
        return mpmath.inf
    e2 = mpmath.mpf(target) ** 2
    b = e2 + kurt - 1
    return (b + mpmath.sqrt(b * b - 4 * e2 * (kurt - 3))) / (2 * e2)


def _quantity(name: str, p: _Point, T: int, family: Family, n: int, target: float):
    """One named quantity at one point, as an mpmath number."""
    if name == "bias_G":
        return p.mean_G - family.mu
    if name == "mse_G":
        return p.var_G + (p.mean_G - family.mu) ** 2
    if name == "var_ratio":
        return p.var_P / p.var_G if p.var_G > 0 else mpmath.nan
    if name == "ess_frac_P":
        return p.mean_P**2 / (p.var_P + p.mean_P**2)
    if name == "var_G_lognormal":
        x = p.var_log / T
        return mpmath.expm1(x) * mpmath.exp(2 * p.mean_log + x)
    if name == "var_G_delta":
        return p.var_log * mpmath.exp(2 * p.mean_log) / T
    if name == "var_G_naive":
        return mpmath.mpf(family.sigma2) / T
    if name in ("rel_se_var_P", "rel_se_var_G"):
        return _rel_se(p.kurt_P if name.endswith("P") else p.kurt_G, n)
    if name in ("n_needed_P", "n_needed_G"):
        return _n_needed(p.kurt_P if name.endswith("P") else p.kurt_G, target)
    if name == "kurtosis_P":
        return p.kurt_P
    if name == "kurtosis_G":
        return p.kurt_G
    return getattr(p, name)


QUANTITIES = (
    "mean_P",
    "var_P",
    "mean_G",
    "var_G",
    "bias_G",
    "mse_G",
    "var_G_lognormal",
    "var_G_delta",
    "var_G_naive",
    "var_ratio",
    "ess_frac_P",
    "kurtosis_P",
    "kurtosis_G",
    "rel_se_var_P",
    "rel_se_var_G",
    "n_needed_P",
    "n_needed_G",
)


def _to_float(x, log10: bool) -> float:
    if mpmath.isnan(x):
        return math.nan
    if log10:
        return float(mpmath.log10(abs(x))) if x != 0 else -math.inf
    return float(x)


def exact_value(
    name: str, family: Family, T: int, *, log10: bool = False, n: int = 2, target: float = DEFAULT_TARGET
) -> float:
    """One quantity of :data:`QUANTITIES` at one length ``T``, with mpmath, rounded to float64.

    Inputs are not validated here (see :func:`variance_lab.theory.value`). Linear values
    beyond float range are ``inf`` or ``0.0``; ``log10`` gives log10 of ``|value|``.
    """
    T = int(T)
    p = _point(family, T)
    with mpmath.workdps(p.dps):
        return _to_float(_quantity(name, p, T, family, n, target), log10)
