r"""Pure statistics on arrays: moments from power sums, intervals, ESS, Pareto k-hat.

Nothing here knows about families, theory or the engine; every function takes plain
numbers or arrays and is vectorised where that is natural.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from scipy import special as _special

__all__ = [
    "CLUSTER_METHOD",
    "KHAT_THRESHOLD",
    "central_moments",
    "cluster_counts",
    "cluster_ratio",
    "design_effect",
    "ess_fraction",
    "gpd_fit",
    "gpd_fit_log",
    "pareto_khat",
    "var_interval",
    "var_se",
    "wilson_interval",
    "z_value",
]

#: How :func:`cluster_ratio` forms its interval, as printed beside it.
CLUSTER_METHOD = "bootstrap over prompts (Wilson score interval at the effective size n / design effect)"

#: Pareto k-hat above which importance-sampling estimates are unreliable (Vehtari et al.).
KHAT_THRESHOLD = 0.7


def exp_quiet(x):
    """``exp(x)`` that returns ``inf`` or ``0`` beyond the float64 range instead of warning."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x)


def central_moments(sums, n):
    r"""Mean deviation and biased central moments from power sums about a reference.

    With :math:`a_k = S_k / n`, :math:`S_k = \sum_i d_i^k` the power sums of the
    deviations :math:`d_i = x_i - c` from a fixed reference :math:`c`:

    .. math::

        \bar d = a_1, \quad m_2 = a_2 - \bar d^2, \quad
        m_3 = a_3 - 3\bar d a_2 + 2\bar d^3, \quad
        m_4 = a_4 - 4\bar d a_3 + 6\bar d^2 a_2 - 3\bar d^4.

    Accurate when :math:`|c - \bar x|` is at most a few standard deviations.
    :math:`m_2` and :math:`m_4` are clipped at 0 against rounding.

    Parameters
    ----------
    sums : array_like, shape (..., 4)
        :math:`S_1 .. S_4`.
    n : int
        Number of values, >= 1.

    Returns
    -------
    (dbar, m2, m3, m4) : tuple of ndarray, each of shape ``sums.shape[:-1]``
    """
    a = np.asarray(sums, dtype=float) / n
    a1, a2, a3, a4 = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    d2 = a1 * a1
    m2 = np.maximum(a2 - d2, 0.0)
    m3 = a3 - 3.0 * a1 * a2 + 2.0 * d2 * a1
    m4 = np.maximum(a4 - 4.0 * a1 * a3 + 6.0 * d2 * a2 - 3.0 * d2 * d2, 0.0)
    return a1, m2, m3, m4


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


def ess_fraction(mean, second_moment):
    r"""Kong's effective sample size over :math:`n`, from moments of the weights.

    :math:`(\sum w)^2 / (n \sum w^2) = \bar w^2 / \overline{w^2}`.

    Both arguments may be in any common unit (a shifted log scale cancels).
    """
    mean = np.asarray(mean, dtype=float)
    return mean * mean / np.asarray(second_moment, dtype=float)


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


# --------------------------------------------------------------------------------------
# clustered data (responses grouped by prompt)
# --------------------------------------------------------------------------------------
def _as_groups(groups, n: int) -> tuple[np.ndarray, int]:
    """Relabel any cluster labels 0 .. G-1: return (labels, G)."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.size != n:
        raise ValueError(f"groups must be 1-D with one label per unit ({n}), got shape {g.shape}")
    _, inv = np.unique(g, return_inverse=True)
    inv = inv.ravel().astype(np.int64)
    return inv, int(inv.max(initial=-1)) + 1


def cluster_counts(groups, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    r"""Weights of a bootstrap over clusters: how often each unit enters each resample.

    Each resample draws :math:`G` clusters (prompts) with replacement from the :math:`G`
    clusters present and keeps every unit (response) of a drawn cluster, so a unit's weight
    is its cluster's count :math:`c_g`, :math:`(c_1..c_G) \sim \mathrm{Multinomial}(G, 1/G)`.
    Units given one cluster each reproduce the ordinary bootstrap.

    Parameters
    ----------
    groups : array_like, shape ``(n,)``
        Cluster label of each unit (any labels numpy can sort).
    n_boot : int
        Number of resamples.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of int64, shape ``(n_boot, n)``
    """
    inv, G = _as_groups(groups, np.size(groups))
    if G == 0:
        return np.zeros((n_boot, 0), dtype=np.int64)
    counts = rng.multinomial(G, np.full(G, 1.0 / G), size=n_boot)
    return counts[:, inv]


def design_effect(num, den, groups) -> float:
    r"""Design effect of the ratio :math:`\hat p = \sum_i y_i / \sum_i x_i` under clustering.

    The linearized (sandwich) variance of the ratio with residuals :math:`e_i = y_i - \hat p x_i`
    is :math:`\frac{G}{G-1}\sum_g (\sum_{i \in g} e_i)^2 / (\sum_i x_i)^2` over the :math:`G`
    clusters; the design effect is that over the same with every unit its own cluster
    (:math:`\frac{n}{n-1}\sum_i e_i^2 / (\sum_i x_i)^2`). For a fraction of sequences
    (:math:`x_i = 1`, :math:`y_i \in \{0, 1\}`) the latter is :math:`\hat p(1-\hat p)/(n-1)`.
    1 for independent units; :math:`1 + (m-1)\rho` for clusters of :math:`m` with
    intra-cluster correlation :math:`\rho`; :math:`m` when clusters are copies of one unit.

    Returns
    -------
    float
        NaN with fewer than two clusters or no spread (every :math:`e_i = 0`).
    """
    y, x = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    inv, G = _as_groups(groups, y.size)
    if G < 2 or y.size < 2:
        return math.nan
    e = y - (y.sum() / x.sum()) * x
    iid = e.size / (e.size - 1.0) * float(np.sum(e * e))
    if not iid > 0:
        return math.nan
    clustered = G / (G - 1.0) * float(np.sum(np.bincount(inv, weights=e, minlength=G) ** 2))
    return clustered / iid


def _wilson_eff(y: np.ndarray, deff: float, level: float, n_clusters: int) -> dict:
    """Wilson's interval of the fraction ``mean(y)`` at the effective size ``n / deff``.

    Without a design effect (every unit 0, or every unit 1: no spread to measure the clustering
    by) the effective size is the number of clusters, as if each cluster were one unit.
    """
    n = float(y.size)
    n_eff = n / max(deff, 1.0 / n) if math.isfinite(deff) else float(n_clusters)
    lo, hi = wilson_interval(float(y.mean()) * n_eff, n_eff, level)
    return {"lo": float(lo), "hi": float(hi)}


def cluster_ratio(num, den, groups, *, n_boot: int, level: float, rng, proportion: bool = False) -> dict:
    r"""Clustered interval of a ratio :math:`\sum_i y_i / \sum_i x_i` (a clip fraction), prompts resampled.

    The resamples (:func:`cluster_counts`) give the bootstrap variance :math:`v^*` of the ratio.
    A proportion of sequences (``proportion=True``: :math:`x_i = 1`, :math:`y_i \in \{0,1\}`)
    gets Wilson's score interval at Kish's effective size
    :math:`n_{eff} = \hat p(1-\hat p)/v^*` (``n / design effect``), which keeps the ends inside
    :math:`[0, 1]`; its coverage is tested in ``tests/test_groups.py`` (true fractions 0.12 to
    0.50, 95.0 % nominal, 94.4 % measured over 2,000 intervals). When every unit is 0 (or every
    one 1) there is no spread to measure the clustering by, and the effective size is the number
    of clusters, as if each were one unit. A ratio of token counts gets the percentile interval
    of the resamples.

    Parameters
    ----------
    num, den : array_like, shape ``(n,)``
        Per unit numerator (clipped count) and denominator (1, or the unit's tokens).
    groups : array_like, shape ``(n,)``
        Cluster (prompt) of each unit.
    n_boot : int
        Resamples (0: NaN ends for a ratio; a proportion then takes the linearized
        :func:`design_effect`).
    level : float
    rng : numpy.random.Generator
    proportion : bool

    Returns
    -------
    dict
        ``lo``, ``hi``, ``design_effect`` (bootstrap variance over the i.i.d. binomial one for a
        proportion; the linearized :func:`design_effect` for a ratio of counts) and
        ``n_clusters``.
    """
    y, x = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    inv, G = _as_groups(groups, y.size)
    out = {"lo": math.nan, "hi": math.nan, "design_effect": design_effect(y, x, inv), "n_clusters": G}
    if proportion and (n_boot < 1 or G < 2):  # no resamples: the linearized design effect
        return out | _wilson_eff(y, out["design_effect"], level, G)
    if n_boot < 1 or G < 2:
        return out
    W = cluster_counts(inv, n_boot, rng).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (W @ y) / (W @ x)
    r = r[np.isfinite(r)]
    if proportion:
        n, p = float(y.size), float(y.sum() / y.size)
        v = float(np.var(r, ddof=1)) * G / (G - 1.0) if r.size > 1 else math.nan
        iid = p * (1.0 - p) / n
        deff = v / iid if iid > 0 else math.nan
        if math.isfinite(deff) and deff > 0:
            out["design_effect"] = deff
        return out | _wilson_eff(y, out["design_effect"], level, G)
    a = (1 - level) / 2
    out["lo"], out["hi"] = (float(q) for q in np.quantile(r, [a, 1 - a]))
    return out
