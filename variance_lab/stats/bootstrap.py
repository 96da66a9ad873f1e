r"""One bootstrap: units resampled one by one (i.i.d.) or by cluster (responses to one prompt together).

A unit is a sequence; a cluster is the prompt it answers. Without clusters every unit is its own
cluster, and resampling :math:`n` clusters of one is the ordinary bootstrap: :func:`resample` draws
it as :math:`n` indices (the same law as counts :math:`\mathrm{Multinomial}(n, 1/n)`), with
clusters as per-unit counts (:func:`cluster_counts`). On top of the resamples:

- :func:`bootstrap_ratio`: the percentile interval of a ratio :math:`\sum y / \sum x` (a token
  clip fraction, a mean weight);
- :func:`proportion_interval`: the interval of a fraction of units, Wilson's score interval for
  independent units, :func:`cluster_ratio`'s Wilson interval at the effective size
  :math:`n / \text{design effect}` for clustered ones;
- :func:`log_var_interval`: the studentized (bootstrap-t) interval of :math:`\log s^2`, the sample
  variance of :math:`e^a` from the :math:`a` (standard errors from the kurtosis, clustered when
  the units are);
- :func:`design_effect` and :func:`cluster_ratio`: the clustered ratio and its design effect.

Every function draws from the ``numpy.random.Generator`` it is given, and from nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from variance_lab.stats.intervals import var_se, wilson_interval
from variance_lab.stats.moments import scaled_exp

__all__ = [
    "CLUSTER_METHOD",
    "Resamples",
    "bootstrap_ratio",
    "cluster_counts",
    "cluster_ratio",
    "design_effect",
    "group_labels",
    "log_var_interval",
    "proportion_interval",
    "resample",
]

#: How :func:`cluster_ratio` forms its interval, as printed beside it.
CLUSTER_METHOD = "bootstrap over prompts (Wilson score interval at the effective size n / design effect)"

#: Doubles per block of resamples (16 MiB): :func:`log_var_interval` draws its resamples in blocks.
_BLOCK_BUDGET = 1 << 21


def group_labels(groups, n: int) -> tuple[np.ndarray, int]:
    """Relabel any cluster (prompt) labels 0 .. G-1: return (labels, G); ValueError unless 1-D of ``n``."""
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
    inv, G = group_labels(groups, np.size(groups))
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
    inv, G = group_labels(groups, y.size)
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
    :math:`[0, 1]`; its coverage is tested in ``tests/rollouts/test_groups.py`` (true fractions 0.12 to
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
    inv, G = group_labels(groups, y.size)
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


# --------------------------------------------------------------------------------------
# resamples, ratios and proportions
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Resamples:
    r"""``n_boot`` bootstrap resamples of ``n`` units, from :func:`resample`.

    Attributes
    ----------
    index : ndarray of int64, shape ``(n_boot, n)``, or None
        Without clusters: the units drawn, with replacement.
    counts : ndarray of float, shape ``(n_boot, n)``, or None
        With clusters: how often each unit enters each resample (its cluster's count,
        :func:`cluster_counts`).
    """

    index: np.ndarray | None = None
    counts: np.ndarray | None = None

    def sums(self, x) -> np.ndarray:
        r"""Return :math:`\sum_i x_i` over each resample, shape ``(n_boot,)`` (``x``: one value per unit)."""
        x = np.asarray(x)
        return x[self.index].sum(axis=1) if self.index is not None else self.counts @ x


def resample(n: int, n_boot: int, rng: np.random.Generator, groups=None) -> Resamples:
    r"""Draw ``n_boot`` bootstrap resamples of ``n`` units, one by one or by cluster.

    Without ``groups`` each resample draws ``n`` units with replacement
    (``rng.integers(0, n, size=(n_boot, n))``); with ``groups`` it draws the clusters
    (:func:`cluster_counts`), every unit of a drawn cluster with it.

    Parameters
    ----------
    n : int
        Units.
    n_boot : int
        Resamples.
    rng : numpy.random.Generator
    groups : array_like, shape ``(n,)``, optional
        Cluster label of each unit.

    Returns
    -------
    Resamples
    """
    if groups is None:
        return Resamples(index=rng.integers(0, n, size=(n_boot, n)))
    return Resamples(counts=cluster_counts(groups, n_boot, rng).astype(float))


def bootstrap_ratio(num, den, *, n_boot: int, level: float, rng, groups=None) -> tuple[float, float]:
    r"""Percentile bootstrap interval of the ratio :math:`\sum_i y_i / \sum_i x_i` over units.

    Resamples units (:func:`resample`), or with ``groups`` their clusters (:func:`cluster_ratio`,
    which drops resamples whose ratio is not finite), and takes the ``(1 - level)/2`` and
    ``(1 + level)/2`` quantiles of the resampled ratios.

    Parameters
    ----------
    num, den : array_like, shape ``(n,)``
        Per unit numerator (a count of clipped tokens, a weight) and denominator (its tokens, 1).
    n_boot : int
    level : float
    rng : numpy.random.Generator
    groups : array_like, shape ``(n,)``, optional
        Cluster (prompt) of each unit.

    Returns
    -------
    (lo, hi) : tuple of float
        NaN with ``n_boot < 1``, fewer than two units or (with ``groups``) fewer than two clusters:
        one unit has nothing to resample.
    """
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if n_boot < 1 or num.size < 2:
        return math.nan, math.nan
    if groups is not None:
        r = cluster_ratio(num, den, groups, n_boot=n_boot, level=level, rng=rng)
        return r["lo"], r["hi"]
    res = resample(num.size, n_boot, rng)
    ratios = res.sums(num) / res.sums(den)
    a = (1 - level) / 2
    lo, hi = np.quantile(ratios, [a, 1 - a])
    return float(lo), float(hi)


def proportion_interval(y, *, n_boot: int, level: float, rng, groups=None) -> dict:
    r"""Interval of the fraction of units with :math:`y_i = 1`: Wilson's, or clustered by prompt.

    Without ``groups``: Wilson's score interval (:func:`~variance_lab.stats.wilson_interval`) of
    :math:`\sum y_i` in :math:`n`, no resample drawn. With ``groups``: :func:`cluster_ratio`
    (``proportion=True``), Wilson's interval at the effective size :math:`n / \text{design effect}`
    from a bootstrap over the clusters.

    Parameters
    ----------
    y : array_like of 0 and 1, shape ``(n,)``
    n_boot : int
    level : float
    rng : numpy.random.Generator
    groups : array_like, shape ``(n,)``, optional

    Returns
    -------
    dict
        ``lo``, ``hi`` and ``design_effect`` (NaN without ``groups``).
    """
    y = np.asarray(y, dtype=float)
    if groups is None:
        lo, hi = wilson_interval(y.sum(), y.size, level)
        return {"lo": float(lo), "hi": float(hi), "design_effect": math.nan}
    r = cluster_ratio(y, np.ones(y.size), groups, n_boot=n_boot, level=level, rng=rng, proportion=True)
    return {"lo": r["lo"], "hi": r["hi"], "design_effect": r["design_effect"]}


# --------------------------------------------------------------------------------------
# bootstrap-t of a log variance
# --------------------------------------------------------------------------------------
def _log_var_and_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Row-wise :math:`\log s^2` (ddof=1) and its delta-method standard error, units independent.

    The standard error of :math:`\log s^2` is :func:`~variance_lab.stats.var_se`
    :math:`= \sqrt{(\hat\kappa - (n-3)/(n-1))/n}`, :math:`\hat\kappa = m_4/m_2^2` the sample kurtosis.
    """
    n = x.shape[-1]
    d = x - x.mean(axis=-1, keepdims=True)
    d2 = d * d
    m2 = d2.mean(axis=-1)
    m4 = (d2 * d2).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = m4 / (m2 * m2)
        return np.log(m2 * (n / (n - 1.0))), var_se(kurt, n)


def _cluster_log_var_t(
    x: np.ndarray, W: np.ndarray, starts: np.ndarray, G: int
) -> tuple[np.ndarray, np.ndarray]:
    r"""Row-wise weighted :math:`\log s^2` and its cluster-robust standard error.

    ``x`` is sorted by cluster, ``starts`` the first unit of each of the ``G`` clusters; row
    ``b`` of ``W`` holds each unit's weight (its cluster's count in resample ``b``). With
    :math:`n^* = \sum_i w_i`, the weighted mean and :math:`m_2`, the influence of unit
    :math:`i` on :math:`\log m_2` is :math:`\psi_i = d_i^2/m_2 - 1`, and the standard error
    sums it over each cluster first:
    :math:`\operatorname{se}^2 = \frac{G}{G-1}\sum_g c_g (\sum_{i \in g}\psi_i)^2 / n^{*2}`
    (:math:`c_g` the cluster's count). With one unit per cluster this is the i.i.d.
    :math:`\sqrt{(m_4/m_2^2 - 1)/n}`. One cluster (``G = 1``) has no standard error: NaN.
    """
    n_star = W.sum(axis=1)
    mean = (W @ x) / n_star
    d2 = (x[None, :] - mean[:, None]) ** 2
    m2 = np.einsum("bi,bi->b", W, d2) / n_star
    factor = G / (G - 1.0) if G > 1 else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        psi = d2 / m2[:, None] - 1.0
        S = np.add.reduceat(psi, starts, axis=1)
        counts = W[:, starts]
        se = np.sqrt(factor * np.einsum("bg,bg->b", counts, S * S)) / n_star
        return np.log(m2 * n_star / (n_star - 1.0)), se


def _studentized(statistic, point, n_units: int, n_boot: int, rng) -> np.ndarray:
    r"""Return the finite :math:`t^* = (\hat\theta^* - \hat\theta)/\operatorname{se}^*` of the resamples.

    ``statistic(m, rng)`` draws ``m`` resamples and returns their :math:`\hat\theta^*` and
    :math:`\operatorname{se}^*`; they are drawn in blocks of at most :data:`_BLOCK_BUDGET` doubles.
    Resamples whose :math:`t^*` is not finite (a constant resample) are dropped.
    """
    block = max(1, _BLOCK_BUDGET // n_units)
    t = np.empty(n_boot)
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        theta, se = statistic(stop - start, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            t[start:stop] = (theta - point) / se
    return t[np.isfinite(t)]


#: A log-scale interval whose one side is more than this many times the other, or wider than
#: :data:`_FAIL_HALF` (ln) on a side, is a failed bootstrap-t (resamples with a near-zero
#: standard error blow the studentized quantiles up): :func:`log_var_interval` gives NaN ends.
_FAIL_RATIO = 10.0
_FAIL_HALF = math.log(1e6)


def _failed(point: float, lo: float, hi: float) -> bool:
    """Whether a finite interval is a failed bootstrap-t (:data:`_FAIL_RATIO`, :data:`_FAIL_HALF`)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    up, down = hi - point, point - lo
    big, small = max(up, down), min(up, down)
    return big > _FAIL_HALF or (small > 0 and big > _FAIL_RATIO * small) or (small <= 0 < big)


def log_var_interval(
    log_x, *, n_boot: int, level: float, rng, groups=None
) -> tuple[float, float, float, bool]:
    r"""Log of the sample variance of :math:`x = e^{a}` and its studentized (bootstrap-t) interval.

    With :math:`\hat\theta = \log s^2` (ddof 1, formed as in
    :func:`~variance_lab.stats.log_sample_var`), its standard error :math:`\hat s` and the
    quantiles :math:`t^*_q` of the studentized resamples
    :math:`t^* = (\hat\theta^* - \hat\theta)/\hat s^*`, the interval at level :math:`\ell` is

    .. math::

        [\hat\theta - t^*_{(1+\ell)/2}\,\hat s,\ \hat\theta - t^*_{(1-\ell)/2}\,\hat s].

    Independent units (no ``groups``): ``n_boot`` resamples of the units, :math:`\hat s` from the
    sample kurtosis (:func:`~variance_lab.stats.var_se`). Clustered units: resamples of the
    clusters (:func:`cluster_counts`), :math:`\hat s` cluster-robust (each unit's influence
    :math:`d_i^2/m_2 - 1` on :math:`\log m_2` summed over its cluster first, times
    :math:`G/(G-1)`).

    Parameters
    ----------
    log_x : array_like of float, shape ``(n,)``
        :math:`a = \log x`, finite, :math:`n \ge 2`.
    n_boot : int
        Resamples; 0 gives no interval.
    level : float
        Confidence level, in (0, 1).
    rng : numpy.random.Generator
    groups : array_like, shape ``(n,)``, optional
        Cluster (prompt) of each unit; ``None``: every unit its own cluster.

    Returns
    -------
    (log_var, lo, hi, failed) : tuple
        :math:`\hat\theta` and the interval's ends (natural log). NaN ends with ``n_boot = 0``,
        a single cluster (nothing to resample between) or no finite :math:`t^*`; both ends
        :math:`\hat\theta` for a sample without spread (nothing drawn then). ``failed``: the
        interval came out lopsided, one side over 10 times the other or wider than 6 decades
        (resamples with a near-zero standard error blow the quantiles up); its ends are then NaN.
    """
    c, w = scaled_exp(log_x)
    if groups is None:
        G = w.size
        point, se = _log_var_and_se(w)

        def statistic(m, rng):
            return _log_var_and_se(w[rng.integers(0, w.size, size=(m, w.size))])
    else:
        order = np.argsort(groups, kind="stable")
        w, g = w[order], np.asarray(groups)[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        G = starts.size
        point, se = (float(v[0]) for v in _cluster_log_var_t(w, np.ones((1, w.size)), starts, G))

        def statistic(m, rng):
            return _cluster_log_var_t(w, cluster_counts(g, m, rng).astype(np.float64), starts, G)

    theta = float(2 * c + point)
    if n_boot == 0 or G < 2:
        return theta, math.nan, math.nan, False
    if not (np.isfinite(point) and se > 0):
        return theta, theta, theta, False
    t = _studentized(statistic, point, w.size, n_boot, rng)
    if not t.size:
        return theta, math.nan, math.nan, False
    t_lo, t_hi = np.quantile(t, [(1 - level) / 2, (1 + level) / 2])
    lo, hi = float(2 * c + point - t_hi * se), float(2 * c + point - t_lo * se)
    if _failed(theta, lo, hi):
        return theta, math.nan, math.nan, True
    return theta, lo, hi, False
