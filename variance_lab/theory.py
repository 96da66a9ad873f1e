r"""Exact and approximate moments of :math:`P_T` and :math:`G_T`, for any family and any T.

For i.i.d. ratios with log-moment function :math:`K(s) = \log E[r^s]`:

.. math::

    E[P_T^k] = e^{T K(k)}, \qquad
    \operatorname{Var}(P_T) = e^{2TK(1)} \operatorname{expm1}\bigl(T(K(2) - 2K(1))\bigr)
                            = (\sigma^2 + \mu^2)^T - \mu^{2T},

    E[G_T^k] = e^{T K(k/T)}, \qquad
    \operatorname{Var}(G_T) = e^{2TK(1/T)} \operatorname{expm1}\bigl(T K(2/T) - 2T K(1/T)\bigr).

Approximations of the seed (section 2), with :math:`\mu_y = E[\log r]`,
:math:`\sigma_y^2 = \operatorname{Var}[\log r]`:

.. math::

    \text{lognormal: } (e^{\sigma_y^2/T} - 1)\, e^{2\mu_y + \sigma_y^2/T}, \qquad
    \text{small-x: } \sigma_y^2 e^{2\mu_y} / T, \qquad
    \text{seed's table: } \sigma^2 / T.

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

Numerics. Every value is computed with mpmath at a working precision that grows with
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
import numpy as np
import pandas as pd

from variance_lab._validate import check_n, check_T
from variance_lab.families import Family

__all__ = [
    "QUANTITIES",
    "TABLE_COLUMNS",
    "bias_G",
    "ess_frac_P",
    "kurtosis_G",
    "kurtosis_P",
    "mean_G",
    "mean_P",
    "mse_G",
    "n_needed_G",
    "n_needed_P",
    "rel_se_var_G",
    "rel_se_var_P",
    "summary",
    "value",
    "var_G",
    "var_G_delta",
    "var_G_lognormal",
    "var_G_seed",
    "var_P",
    "var_ratio",
]

DEFAULT_TARGET = 0.1


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
            kurt = m4 / v**2 if v > 0 else mpmath.nan
            out.append((mpmath.exp(log_mean), mpmath.exp(2 * log_mean) * v, kurt))
        (mP, vP, kP), (mG, vG, kG) = out
        if family.degenerate:  # r = mu: exact, free of exp(log(mu)) rounding
            mP, mG = mpmath.mpf(family.mu) ** T, mpmath.mpf(family.mu)
        return _Point(+mP, +vP, +kP, +mG, +vG, +kG, +mean_log, +var_log, dps)


def _rel_se(kurt, n: int):
    """Relative standard error of the unbiased sample variance of n draws."""
    if mpmath.isnan(kurt):  # zero variance: the sample variance is exactly 0
        return mpmath.mpf(0)
    return mpmath.sqrt((kurt - mpmath.mpf(n - 3) / (n - 1)) / n)


def _n_needed(kurt, target):
    """Smallest real n with rse(n) = target (root of a quadratic); 2 when v == 0."""
    if mpmath.isnan(kurt):
        return mpmath.mpf(2)
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
    if name == "var_G_seed":
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
    "var_G_seed",
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


def value(name: str, family: Family, T, *, log10: bool = False, n: int = 2, target: float = DEFAULT_TARGET):
    r"""Any quantity of :data:`QUANTITIES` at the lengths ``T``.

    Parameters
    ----------
    name : str
        One of :data:`QUANTITIES`.
    family : Family
        The ratio distribution.
    T : int or array_like of int
        Sequence lengths, integers >= 1.
    log10 : bool
        Return :math:`\log_{10}` of the absolute value instead (exact where the linear
        value over- or underflows float64).
    n : int
        Draws, for the ``rel_se_*`` quantities.
    target : float
        Target relative error, for the ``n_needed_*`` quantities.

    Returns
    -------
    float or ndarray
        Same shape as ``T``. Kurtosis is NaN where the variance is 0; every other value
        is finite, ``inf`` or ``0.0``, never NaN.
    """
    if name not in QUANTITIES:
        raise ValueError(f"unknown quantity {name!r}; choose one of {', '.join(QUANTITIES)}")
    if not isinstance(family, Family):
        raise ValueError(f"family must be a Family, got {family!r}")
    n = check_n(n)
    if not (isinstance(target, int | float) and 0 < target < math.inf):
        raise ValueError(f"target must be a finite number > 0, got {target!r}")
    Ts = check_T(T)
    out = np.empty(Ts.shape, dtype=float)
    for idx, t in np.ndenumerate(Ts):
        t = int(t)
        p = _point(family, t)
        with mpmath.workdps(p.dps):
            out[idx] = _to_float(_quantity(name, p, t, family, n, target), log10)
    return float(out) if out.ndim == 0 else out


def _doc_fn(name: str, doc: str):
    def fn(family: Family, T, *, log10: bool = False):
        return value(name, family, T, log10=log10)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"{doc}\n\nParameters\n----------\nfamily : Family\nT : int or array_like of int\n"
        "log10 : bool\n    Return log10 of the absolute value instead.\n\n"
        "Returns\n-------\nfloat or ndarray, the shape of ``T``.\n"
    )
    return fn


var_P = _doc_fn("var_P", r"Exact :math:`\operatorname{Var}(P_T) = (\sigma^2+\mu^2)^T - \mu^{2T}`.")
mean_P = _doc_fn("mean_P", r"Exact :math:`E[P_T] = \mu^T`.")
var_G = _doc_fn(
    "var_G", r"Exact :math:`\operatorname{Var}(G_T) = e^{2TK(1/T)}\operatorname{expm1}(TK(2/T) - 2TK(1/T))`."
)
mean_G = _doc_fn(
    "mean_G", r"Exact :math:`E[G_T] = e^{T K(1/T)}`, which tends to :math:`e^{\mu_y}`, not :math:`\mu`."
)
bias_G = _doc_fn("bias_G", r"Bias :math:`E[G_T] - \mu \le 0` (``log10`` gives :math:`\log_{10}|\cdot|`).")
mse_G = _doc_fn(
    "mse_G", r"Mean squared error :math:`E[(G_T - \mu)^2] = \operatorname{Var}(G_T) + \text{bias}^2`."
)
var_G_lognormal = _doc_fn(
    "var_G_lognormal", r"Seed's lognormal approximation :math:`(e^{\sigma_y^2/T}-1)e^{2\mu_y+\sigma_y^2/T}`."
)
var_G_delta = _doc_fn("var_G_delta", r"Seed's small-x form :math:`\sigma_y^2 e^{2\mu_y}/T`.")
var_G_seed = _doc_fn("var_G_seed", r"The seed table's :math:`\sigma^2/T`.")
var_ratio = _doc_fn(
    "var_ratio", r":math:`\operatorname{Var}(P_T)/\operatorname{Var}(G_T)` (NaN when both are 0)."
)
ess_frac_P = _doc_fn(
    "ess_frac_P",
    r"Kong's ESS fraction of the weights :math:`P_T`: :math:`e^{T(2K(1)-K(2))} = (1+\sigma^2/\mu^2)^{-T}`.",
)
kurtosis_P = _doc_fn("kurtosis_P", r":math:`m_4/v^2` of :math:`P_T` (NaN when :math:`\sigma^2 = 0`).")
kurtosis_G = _doc_fn("kurtosis_G", r":math:`m_4/v^2` of :math:`G_T` (NaN when :math:`\sigma^2 = 0`).")


def rel_se_var_P(family: Family, T, n: int, *, log10: bool = False):
    r"""Relative standard error of the sample variance of ``n`` draws of :math:`P_T`.

    :math:`\sqrt{(\kappa - (n-3)/(n-1))/n}`, :math:`\kappa = m_4/v^2` (0 when :math:`\sigma^2 = 0`).
    """
    return value("rel_se_var_P", family, T, n=n, log10=log10)


def rel_se_var_G(family: Family, T, n: int, *, log10: bool = False):
    r"""Relative standard error of the sample variance of ``n`` draws of :math:`G_T`."""
    return value("rel_se_var_G", family, T, n=n, log10=log10)


def n_needed_P(family: Family, T, target: float = DEFAULT_TARGET, *, log10: bool = False):
    r"""Draws for which the sample variance of :math:`P_T` has relative standard error ``target``.

    About :math:`(\kappa - 1)/\text{target}^2`; 2 when :math:`\sigma^2 = 0`.
    """
    return value("n_needed_P", family, T, target=target, log10=log10)


def n_needed_G(family: Family, T, target: float = DEFAULT_TARGET, *, log10: bool = False):
    r"""Draws for which the sample variance of :math:`G_T` has relative standard error ``target``."""
    return value("n_needed_G", family, T, target=target, log10=log10)


#: Columns of the comparison table (csv/json names), in order.
TABLE_COLUMNS = (
    "T",
    "var_P",
    "log10_var_P",
    "var_G",
    "log10_var_G",
    "var_G_lognormal",
    "var_G_delta",
    "var_G_seed",
    "mean_G",
    "bias_G",
    "mse_G",
    "ratio",
    "ess_frac_P",
    "n_needed_P",
    "n_needed_G",
    "log10_ratio",
    "log10_n_needed_P",
    "log10_n_needed_G",
)

_COLUMN_SOURCE = {"ratio": "var_ratio"}


def summary(family: Family, T, *, target: float = DEFAULT_TARGET) -> pd.DataFrame:
    """Return the exact comparison table: one row per T, columns :data:`TABLE_COLUMNS`.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
        Sequence lengths (kept in the given order).
    target : float
        Target relative error for the ``n_needed_*`` columns.

    Returns
    -------
    pandas.DataFrame
    """
    Ts = np.atleast_1d(check_T(T)).ravel()
    cols: dict[str, np.ndarray] = {"T": Ts}
    for col in TABLE_COLUMNS[1:]:
        log10 = col.startswith("log10_")
        base = col.removeprefix("log10_")
        cols[col] = np.atleast_1d(
            value(_COLUMN_SOURCE.get(base, base), family, Ts, log10=log10, target=target)
        )
    return pd.DataFrame(cols)


# (statistic, method) of each theory quantity in the tidy schema (variance_lab.schema).
_TIDY = {
    "mean_P": ("mean_P", "exact"),
    "var_P": ("var_P", "exact"),
    "mean_G": ("mean_G", "exact"),
    "var_G": ("var_G", "exact"),
    "bias_G": ("bias_G", "exact"),
    "mse_G": ("mse_G", "exact"),
    "var_G_lognormal": ("var_G", "lognormal"),
    "var_G_delta": ("var_G", "delta"),
    "var_G_seed": ("var_G", "seed"),
    "var_ratio": ("var_ratio", "exact"),
    "ess_frac_P": ("ess_frac_P", "exact"),
    "n_needed_P": ("n_needed_P", "exact"),
    "n_needed_G": ("n_needed_G", "exact"),
}


def tidy(family: Family, T, *, target: float = DEFAULT_TARGET, quantities=None) -> pd.DataFrame:
    """Theory in the tidy long schema (:mod:`variance_lab.schema`).

    One row per (T, statistic, method): exact values and the derivation's approximations.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    target : float
        Target relative error for the ``n_needed_*`` statistics.
    quantities : sequence of str, optional
        Only these quantities (names of :data:`QUANTITIES` that have a tidy
        (statistic, method), e.g. ``["var_P", "var_G_seed"]``), in this order; all by default.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.schema.TIDY_COLUMNS`.
    """
    from variance_lab.schema import TIDY_COLUMNS

    Ts = np.atleast_1d(check_T(T)).ravel()
    names = list(_TIDY) if quantities is None else list(quantities)
    unknown = [q for q in names if q not in _TIDY]
    if unknown:
        raise ValueError(f"no tidy statistic for quantity {unknown[0]!r}; choose from {', '.join(_TIDY)}")
    parts = []
    for name in names:
        stat, method = _TIDY[name]
        lin = np.atleast_1d(value(name, family, Ts, target=target))
        lg = np.atleast_1d(value(name, family, Ts, log10=True, target=target))
        parts.append(
            pd.DataFrame({"T": Ts, "statistic": stat, "method": method, "value": lin, "log10_value": lg})
        )
    out = pd.concat(parts, ignore_index=True)
    out.insert(0, "family", family.name)
    out.insert(1, "mu", family.mu)
    out.insert(2, "sigma2", family.sigma2)
    out["lo"] = np.nan
    out["hi"] = np.nan
    out["se"] = np.nan
    out["reliable"] = True
    out["reason"] = ""
    return out[list(TIDY_COLUMNS)]
