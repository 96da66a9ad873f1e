r"""Intervals: the normal quantile, Wilson's score interval, the mean's and the variance's intervals.

Nothing here knows about families, theory or the engine; every function takes plain numbers or
arrays and is vectorised where that is natural. The bootstrap intervals are in
:mod:`variance_lab.stats.bootstrap`.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

__all__ = ["mean_interval", "var_interval", "var_se", "wilson_interval", "z_value"]


def z_value(ci: float) -> float:
    """Two-sided standard normal quantile of a confidence level ``ci`` in (0, 1)."""
    if isinstance(ci, bool) or not isinstance(ci, int | float) or not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be a confidence level in (0, 1), got {ci!r}")
    return NormalDist().inv_cdf(0.5 + ci / 2.0)


def wilson_interval(k, n, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    r"""Wilson's score interval for a binomial proportion :math:`k/n`.

    .. math::

        \frac{\hat p + z^2/2n \pm z\sqrt{\hat p(1-\hat p)/n + z^2/4n^2}}{1 + z^2/n}

    with :math:`z` the normal quantile of ``level``; the ends are exactly 0 at :math:`k = 0`
    and 1 at :math:`k = n` (not a rounding off). ``k`` and ``n`` broadcast.
    """
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    z = z_value(level)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo = np.where(k == 0, 0.0, np.maximum(centre - half, 0.0))
    hi = np.where(k == n, 1.0, np.minimum(centre + half, 1.0))
    return lo, hi


def mean_interval(mean, var, n: int, ci: float = 0.95):
    r"""Return the normal (CLT) interval of a mean: :math:`\bar x \pm z\sqrt{s^2/n}`.

    Returns
    -------
    (lo, hi, se) : tuple of ndarray
    """
    se = np.sqrt(np.asarray(var, dtype=float) / n)
    z = z_value(ci)
    mean = np.asarray(mean, dtype=float)
    return mean - z * se, mean + z * se, se


def var_se(kurt, n: int):
    r"""Relative standard error of the unbiased sample variance of ``n`` draws.

    .. math::

        \frac{\operatorname{se}(s^2)}{\sigma^2} = \sqrt{\frac{\kappa - (n-3)/(n-1)}{n}},

    with :math:`\kappa = m_4 / m_2^2` the kurtosis (here: the sample kurtosis plugged
    in); clipped at 0.
    """
    kurt = np.asarray(kurt, dtype=float)
    return np.sqrt(np.maximum(kurt - (n - 3.0) / (n - 1.0), 0.0) / n)


def var_interval(var, kurt, n: int, ci: float = 0.95):
    r"""Interval for a variance from the sample variance and the sample kurtosis.

    The relative standard error :math:`\rho = ` :func:`var_se` ``(kurt, n)`` is turned
    into an interval on the log scale (delta method for :math:`\log s^2`):

    .. math::

        [\, s^2 e^{-z\rho},\; s^2 e^{z\rho} \,],

    which, unlike the normal interval :math:`s^2(1 \pm z\rho)`, never goes negative and
    follows the right skew of the sample variance. The standard error returned is
    :math:`s^2 \rho`. Like every moment-based interval it is only as good as the sample
    kurtosis: for heavy tails (large T for :math:`P_T`) both are erratic, usually far too
    small and low together (so the interval is short exactly when the estimate is off),
    sometimes far too large, which is why the estimates also carry a verdict from theory
    (:mod:`variance_lab.simulate.estimates`: "marginal" where the kurtosis estimate itself
    is not stable).

    Parameters
    ----------
    var : array_like
        Unbiased sample variance :math:`s^2 \ge 0`.
    kurt : array_like
        Sample kurtosis :math:`m_4/m_2^2` (NaN where :math:`m_2 = 0`).
    n : int
        Draws.
    ci : float
        Confidence level.

    Returns
    -------
    (lo, hi, se) : tuple of ndarray
    """
    var = np.asarray(var, dtype=float)
    rho = np.where(np.isnan(kurt), 0.0, var_se(np.nan_to_num(kurt), n))
    z = z_value(ci)
    return var * np.exp(-z * rho), var * np.exp(z * rho), var * rho
