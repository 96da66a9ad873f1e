r"""Tails and effective sample sizes of importance weights: GPD fits, Pareto k-hat, Kong's ESS.

Nothing here knows about families, theory or the engine; every function takes plain numbers or
arrays.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special as _special

__all__ = [
    "KHAT_THRESHOLD",
    "ess_fraction",
    "gpd_fit",
    "gpd_fit_log",
    "kong_ess",
    "pareto_khat",
    "pareto_khat_rows",
]

#: Pareto k-hat above which importance-sampling estimates are unreliable (Vehtari et al.).
KHAT_THRESHOLD = 0.7


def ess_fraction(mean, second_moment):
    r"""Kong's effective sample size over :math:`n`, from moments of the weights.

    :math:`(\sum w)^2 / (n \sum w^2) = \bar w^2 / \overline{w^2}`.

    Both arguments may be in any common unit (a shifted log scale cancels).
    """
    mean = np.asarray(mean, dtype=float)
    return mean * mean / np.asarray(second_moment, dtype=float)


def kong_ess(log_w) -> float:
    r"""Kong's effective sample size :math:`(\sum w)^2 / \sum w^2` of weights given in log space.

    The weights are scaled by :math:`e^{-\max \log w}` first (the scale cancels), so none
    overflows. :func:`ess_fraction` is the same over :math:`n`, from the weights' moments.

    Parameters
    ----------
    log_w : array_like
        Log weights, finite.

    Returns
    -------
    float
        Between 1 and ``log_w.size``.
    """
    log_w = np.asarray(log_w)
    w = np.exp(log_w - np.max(log_w))
    return float(w.sum() ** 2 / np.sum(w * w))


def gpd_fit(x, *, prior: bool = True) -> tuple[float, float]:
    r"""Generalised Pareto fit of exceedances ``x > 0``: Zhang and Stephens' estimator.

    The empirical Bayes estimator of Zhang and Stephens (2009, *Technometrics* 51,
    316-325), as used by Pareto-smoothed importance sampling (Vehtari, Simpson, Gelman,
    Yao and Gabry, 2024, *JMLR* 25): with :math:`x_{(1)} \le \dots \le x_{(M)}` and
    :math:`m = 30 + \lfloor\sqrt M\rfloor` grid points

    .. math::

        \theta_j = \frac{1}{x_{(M)}} + \frac{1 - \sqrt{m / (j - 1/2)}}{3\,x_{(\lfloor M/4 + 1/2 \rfloor)}},
        \qquad
        k(\theta) = \frac1M\sum_i \log(1 - \theta x_i),

    profile log-likelihood :math:`\ell(\theta) = M(\log(-\theta/k(\theta)) - k(\theta) - 1)`,
    posterior-mean :math:`\hat\theta = \sum_j \theta_j w_j`, :math:`w_j \propto e^{\ell(\theta_j)}`,
    then :math:`\hat k = k(\hat\theta)` (positive: heavy tail, here the shape
    :math:`\xi`), :math:`\hat\sigma = -\hat k/\hat\theta`, and, with ``prior``, PSIS's
    weakly informative shrinkage :math:`\hat k \leftarrow (M\hat k + 5)/(M + 10)`.

    Parameters
    ----------
    x : array_like
        Exceedances over the threshold, all > 0 (at least 5 of them).
    prior : bool
        Apply the shrinkage towards 0.5.

    Returns
    -------
    (k, sigma) : tuple of float
        ``(nan, nan)`` when the fit cannot be made (:func:`gpd_fit_log`, which does the work
        on :math:`\log x`).
    """
    x = np.asarray(x, dtype=float).ravel()
    if x.size < 5 or not np.all(np.isfinite(x)) or np.min(x) <= 0:
        raise ValueError(f"gpd_fit needs at least 5 finite exceedances > 0, got {x.size}")
    k_hat, log_sigma = gpd_fit_log(np.log(x), prior=prior)
    return k_hat, math.exp(log_sigma) if math.isfinite(log_sigma) else math.nan


def _log1m_scaled(theta, d):
    r""":math:`\log(1 - \theta e^{d})` without overflow, elementwise (broadcast).

    For :math:`\theta < 0` it is :math:`\operatorname{logaddexp}(0, \log(-\theta) + d)`; for
    :math:`\theta > 0`, :math:`\log1p(-e^{\log\theta + d})` (the fit keeps
    :math:`\theta e^{d} \le 1`); 0 for :math:`\theta = 0`.
    """
    theta, d = np.broadcast_arrays(np.asarray(theta, dtype=float), np.asarray(d, dtype=float))
    out = np.zeros(theta.shape)
    neg, pos = theta < 0, theta > 0
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        out[neg] = np.logaddexp(0.0, np.log(-theta[neg]) + d[neg])
        out[pos] = np.log1p(-np.exp(np.log(theta[pos]) + d[pos]))
    return out


def gpd_fit_log(log_x, *, prior: bool = True) -> tuple[float, float]:
    r"""Generalised Pareto fit of exceedances given by their logarithms (no value underflows).

    The estimator of :func:`gpd_fit`, computed on :math:`\ell_i = \log x_i` so that
    exceedances spread over more than the float64 range (weights :math:`P_T` at
    :math:`T = 10^6`) keep every digit. Everything is measured in units of the quartile
    exceedance :math:`x_q = x_{(\lfloor M/4 + 1/2\rfloor)}`: with :math:`d_i = \ell_i - \ell_q`,

    .. math::

        \theta_j x_q = e^{\ell_q - \ell_{(M)}} + \frac{1 - \sqrt{m/(j - 1/2)}}{3},
        \qquad
        k(\theta) = \frac1M \sum_i \log\bigl(1 - (\theta x_q)\, e^{d_i}\bigr),

    each logarithm formed as :math:`\operatorname{logaddexp}(0, \log(-\theta x_q) + d_i)`
    for :math:`\theta < 0` and :math:`\log1p(-e^{\log(\theta x_q) + d_i})` for
    :math:`\theta > 0`. The profile log-likelihood
    :math:`M(\log(-\theta/k) - k - 1)` changes by the constant :math:`-M\ell_q`, which
    cancels in the posterior weights, so :math:`\hat k` is the same as :func:`gpd_fit`'s.

    Parameters
    ----------
    log_x : array_like
        Logarithms of the exceedances, all finite (at least 5 of them).
    prior : bool
        Apply PSIS's shrinkage :math:`\hat k \leftarrow (M\hat k + 5)/(M + 10)`.

    Returns
    -------
    (k, log_sigma) : tuple of float
        Shape and the log of the scale; ``(nan, nan)`` when the fit cannot be made (every
        grid point's likelihood undefined, or :math:`\hat\theta = 0`).

    Raises
    ------
    ValueError
        Fewer than 5 values, or a value that is not finite.
    """
    lx = np.sort(np.asarray(log_x, dtype=float).ravel())
    M = lx.size
    if M < 5 or not np.all(np.isfinite(lx)):
        raise ValueError(f"gpd_fit needs at least 5 finite exceedances > 0, got {M}")
    m = 30 + int(math.sqrt(M))
    j = np.arange(1, m + 1, dtype=float)
    lq = lx[int(M / 4.0 + 0.5) - 1]
    d = lx - lq
    with np.errstate(under="ignore"):
        theta = math.exp(min(lq - lx[-1], 0.0)) + (1.0 - np.sqrt(m / (j - 0.5))) / 3.0
    k = _log1m_scaled(theta[:, None], d[None, :]).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ell = M * (np.log(-theta / k) - k - 1.0)
    ok = np.isfinite(ell)
    if not ok.any():
        return math.nan, math.nan
    theta, ell = theta[ok], ell[ok]
    w = np.exp(ell - _special.logsumexp(ell))
    keep = w >= 10 * np.finfo(float).eps
    w, theta = w[keep] / w[keep].sum(), theta[keep]
    theta_hat = float(np.sum(theta * w))
    k_hat = float(_log1m_scaled(theta_hat, d).mean())
    if theta_hat == 0.0 or not math.isfinite(k_hat):
        return math.nan, math.nan
    ratio = -k_hat / theta_hat  # sigma / x_q, > 0
    log_sigma = math.log(ratio) + lq if ratio > 0 else math.nan
    if prior:
        k_hat = (M * k_hat + 10 * 0.5) / (M + 10)
    return k_hat, log_sigma


def pareto_khat(log_tail) -> float:
    r"""Pareto :math:`\hat k` of importance weights from the log of their largest values.

    Parameters
    ----------
    log_tail : array_like
        The :math:`M + 1` largest :math:`\log w` of the sample, any order. The smallest of
        them is the threshold :math:`u`; the :math:`M` exceedances
        :math:`e^{\log w - \max} - e^{u - \max}` (the scale cancels in :math:`\hat k`)
        go to :func:`gpd_fit_log` as their logarithms
        :math:`(\log w - \max) + \log(-\operatorname{expm1}(u - \log w))`, so that none
        underflows however far the weights spread (:math:`T = 10^6`), as in PSIS
        (:math:`M = \min(n/5, 3\sqrt n)`).

    Returns
    -------
    float
        :math:`\hat k`; NaN with fewer than 5 distinct exceedances (k-hat cannot be
        estimated: a degenerate or discrete weight distribution with too few values
        above the threshold) or when the fit cannot be made; never raises. Above
        :data:`KHAT_THRESHOLD` = 0.7 the weights are too
        heavy-tailed for importance-sampling estimates to be trusted.
    """
    lt = np.sort(np.asarray(log_tail, dtype=float))
    if lt.size < 6 or not np.all(np.isfinite(lt)):
        return math.nan
    gap = lt[1:] - lt[0]
    above = gap > 0
    if np.count_nonzero(above) < 5 or np.unique(gap[above]).size < 2:
        return math.nan
    # log(e^l - e^u) - top = (l - top) + log(-expm1(u - l)): no exceedance underflows
    log_x = (lt[1:][above] - lt[-1]) + np.log(-np.expm1(-gap[above]))
    k_hat = gpd_fit_log(log_x)[0]
    return k_hat if math.isfinite(k_hat) else math.nan


def _khat_fit_rows(d: np.ndarray) -> np.ndarray:
    r"""Return the k-hat of :func:`gpd_fit_log` per row of :math:`d_i = \log(x_i / x_q)`."""
    M = d.shape[1]
    m = 30 + int(math.sqrt(M))
    j = np.arange(1, m + 1, dtype=float)
    with np.errstate(under="ignore"):
        theta = np.exp(np.minimum(-d[:, -1], 0.0))[:, None] + (1.0 - np.sqrt(m / (j - 0.5))) / 3.0
    ratio = np.exp(d)  # x_i / x_q
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.log1p(-theta[:, :, None] * ratio[:, None, :]).mean(axis=2)
        ell = M * (np.log(-theta / k) - k - 1.0)
    ok = np.isfinite(ell)
    ell = np.where(ok, ell, -np.inf)
    any_ok = ok.any(axis=1)
    top = np.where(any_ok, ell.max(axis=1, initial=-np.inf), 0.0)
    with np.errstate(under="ignore"):
        w = np.exp(ell - top[:, None])
    w /= np.where(any_ok, w.sum(axis=1), 1.0)[:, None]
    w = np.where(w >= 10 * np.finfo(float).eps, w, 0.0)
    w /= np.where(any_ok, w.sum(axis=1), 1.0)[:, None]
    theta_hat = (theta * w).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        k_hat = np.log1p(-theta_hat[:, None] * ratio).mean(axis=1)
    good = any_ok & (theta_hat != 0.0) & np.isfinite(k_hat)
    return np.where(good, (M * k_hat + 10 * 0.5) / (M + 10), math.nan)


def pareto_khat_rows(log_tails) -> np.ndarray:
    r"""Return :func:`pareto_khat` of each row of a 2-D array, vectorised over the rows.

    The same estimator, on many tail samples of one size at once (a batch of simulated
    importance weights per row). A row whose :math:`M + 1` values are finite and distinct from
    its threshold, and whose exceedances span less than :math:`e^{700}` (so that
    :math:`x_i / x_q = e^{d_i}` is a float), is fitted here, a few hundred rows per pass:
    with :math:`t_{ij} = \theta_j x_q e^{d_i}`, :math:`k(\theta_j) = \frac1M\sum_i \log(1 - t_{ij})`,
    the same grid, profile likelihood, weights and prior as :func:`gpd_fit_log`, whose log-space
    forms :math:`\operatorname{logaddexp}(0, \log(-\theta x_q) + d_i)` and
    :math:`\log1p(-e^{\log(\theta x_q) + d_i})` are the same numbers for such rows (agreement to
    :math:`10^{-12}` is tested). Every other row goes through :func:`pareto_khat` itself.

    Parameters
    ----------
    log_tails : array_like, shape (R, M + 1)
        Each row: the :math:`M + 1` largest :math:`\log w` of one sample, any order.

    Returns
    -------
    ndarray, shape (R,)
        :math:`\hat k` per row; NaN where :func:`pareto_khat` gives NaN.
    """
    lt = np.sort(np.asarray(log_tails, dtype=float), axis=-1)
    if lt.ndim != 2:
        raise ValueError(f"pareto_khat_rows needs a 2-D array of rows, got shape {lt.shape}")
    R, n = lt.shape
    out = np.full(R, math.nan)
    if R == 0 or n < 6:
        return out
    M = n - 1
    q = int(M / 4.0 + 0.5) - 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gap = lt[:, 1:] - lt[:, :1]
        log_x = (lt[:, 1:] - lt[:, -1:]) + np.log(-np.expm1(-gap))
        d = log_x - log_x[:, q : q + 1]
        fast = (
            np.isfinite(lt).all(axis=1)
            & (gap > 0).all(axis=1)
            & (gap[:, -1] > gap[:, 0])  # at least two distinct exceedances
            & np.isfinite(d).all(axis=1)
            & (d[:, -1] < 700.0)
        )
    for r in np.flatnonzero(~fast):
        out[r] = pareto_khat(lt[r])
    rows = np.flatnonzero(fast)
    per_pass = max(1, 2**18 // ((30 + int(math.sqrt(M))) * M))  # a pass's arrays stay in cache
    for i in range(0, rows.size, per_pass):
        out[rows[i : i + per_pass]] = _khat_fit_rows(d[rows[i : i + per_pass]])
    return out
