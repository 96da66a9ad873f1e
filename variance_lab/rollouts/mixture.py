r"""The ``mix`` model: tokens i.i.d. from a Gaussian mixture in log space, fitted by EM with BIC.

Tokens i.i.d. from a mixture of :math:`K \le 3` Gaussians in log space,
:math:`y = \log r \sim \sum_j w_j N(m_j, v_j)`: the ``lognormal-mixture`` family. Fitted by EM on
the pooled log-ratios (:func:`fit_mixture`); :math:`K` is the one with the smallest BIC,
:math:`-2\log L + (3K - 1)\log N`. Standard errors from the outer product of the per-token
scores (they treat tokens as independent, so they are too small where tokens within a sequence
are correlated). :meth:`MixtureFit.predict` gives ln E and ln Var of :math:`P_T` and :math:`G_T`
(the family's exact theory) and the probabilities that GSPO clips a sequence and that PPO clips a
token, from :func:`normal_outside`, which the other fitted models use as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from variance_lab import theory
from variance_lab.families import LognormalMixture
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.pairwise import segment_totals
from variance_lab.simulate._jit import kernel

__all__ = ["MixtureFit", "fit_mixture", "fit_mixture_bic", "normal_outside"]


def normal_outside(mean, var, log_range) -> np.ndarray:
    r"""Return :math:`P(N(m, v) \notin (lo, hi))`, elementwise.

    :math:`\Phi((lo - m)/\sqrt v) + \Phi((m - hi)/\sqrt v)`. A point mass where ``var == 0``;
    NaN where ``var`` or ``mean`` is NaN.
    """
    lo, hi = log_range
    mean, var = np.broadcast_arrays(np.asarray(mean, float), np.asarray(var, float))
    sd = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = special.ndtr((lo - mean) / sd) + special.ndtr((mean - hi) / sd)
    point = np.where(np.isnan(mean), np.nan, ((mean < lo) | (mean > hi)).astype(float))
    return np.where(sd > 0, p, np.where(np.isnan(sd), np.nan, point))


# --------------------------------------------------------------------------------------
# the token mixture
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixtureFit:
    r"""A Gaussian mixture fitted to pooled token log-ratios (see the module docstring).

    Attributes
    ----------
    weights, means, variances : ndarray
        :math:`w_j, m_j, v_j`, ordered by variance.
    se_weights, se_means, se_variances : ndarray
        Standard errors (outer product of scores).
    loglik : float
    bic : dict
        BIC of each number of components tried.
    n_tokens : int
    """

    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray
    se_weights: np.ndarray
    se_means: np.ndarray
    se_variances: np.ndarray
    loglik: float
    bic: dict
    n_tokens: int

    @property
    def n_components(self) -> int:
        """Return the number of fitted components."""
        return int(self.weights.size)

    @property
    def components(self) -> str:
        """The ``weight:mean:variance`` text of the fitted components (``--components``)."""
        return ",".join(
            f"{w:.17g}:{m:.17g}:{v:.17g}"
            for w, m, v in zip(self.weights, self.means, self.variances, strict=True)
        )

    def family(self) -> LognormalMixture:
        """Return the fitted ``lognormal-mixture`` family."""
        return LognormalMixture(
            None, None, components=tuple(zip(self.weights, self.means, self.variances, strict=True))
        )

    def predict(self, T, gspo_log_range, ppo_log_range=None) -> dict[str, np.ndarray]:
        """Ln E / ln Var of P_T and G_T (exact theory of the family) and clip probabilities at ``T``.

        Without ``ppo_log_range``, only what judges a fit (``mean_G``, ``var_G``, ``gspo_clip``).
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.int64))
        fam = self.family()
        out = {}
        for stat in ("mean_P", "var_P", "mean_G", "var_G"):
            if stat.endswith("_P") and ppo_log_range is None:
                continue
            out[stat] = theory.value(stat, fam, T, log10=True) * math.log(10.0)
        out["gspo_clip"] = self.gspo_clips(T, gspo_log_range)
        if ppo_log_range is not None:
            out["ppo_clip"] = self.token_clip(T, ppo_log_range)
        return out

    def token_clip(self, T, log_range) -> np.ndarray:
        r"""Return :math:`\sum_j w_j P(N(m_j, v_j) \notin` ``log_range``:math:`)`, the same at every ``T``."""
        p = float(np.sum(self.weights * normal_outside(self.means, self.variances, log_range)))
        return np.full(np.atleast_1d(np.asarray(T)).shape, p)

    def gspo_clips(self, T, log_range) -> np.ndarray:
        r"""Return the clip probability of the mean of :math:`T` tokens, at each ``T``.

        :math:`P(\bar y \notin (\log a, \log b))`, exact over the component counts
        :math:`n \sim \mathrm{Multinomial}(T, w)`, given which
        :math:`\bar y \sim N(\sum n_j m_j / T, \sum n_j v_j / T^2)`, summed over the counts whose
        probability is above :math:`e^{-40}` of the largest (:func:`_likely_counts`: a window around
        the mode, not the :math:`T^2/2` compositions of three components at :math:`T = 8192`).
        """
        w, m, v = self.weights, self.means, self.variances
        log_w = np.log(w)
        means, variances, probs, ends = [], [], [], [0]
        for t in np.atleast_1d(np.asarray(T, dtype=np.int64)).tolist():
            c, p = _likely_counts(t, log_w)
            means.append(c @ m / t)
            variances.append(c @ v / t**2)
            probs.append(p)
            ends.append(ends[-1] + p.size)
        p = np.concatenate(probs)
        prob = normal_outside(np.concatenate(means), np.concatenate(variances), log_range)
        return segment_totals(p * prob, ends) / segment_totals(p, ends)


#: Compositions of a length counted in full up to this many; beyond, in a window around the mode.
_FULL_COMPOSITIONS = 1 << 15


def _composition_log_probs(counts: np.ndarray, T: int, log_w: np.ndarray) -> np.ndarray:
    """Log of the multinomial probability of each row of counts (of ``T`` draws, log weights ``log_w``)."""
    return special.gammaln(T + 1) + np.sum(counts * log_w - special.gammaln(counts + 1), axis=1)


def _likely_counts(T: int, log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the compositions of ``T`` whose probability is above :math:`e^{-40}` of the largest, and those.

    In the order of :func:`_compositions`. Where they are many (two components past
    :data:`_FULL_COMPOSITIONS`, three past its square root), only a box around the mode is
    searched, a few standard deviations of the counts wide, and widened until every composition on
    its edges lies 45 nats below the largest: the log-probability is concave in the counts, so
    nothing outside the box comes within 40 (tested against every composition).
    """
    K = log_w.size
    if (
        K == 1
        or (K == 2 and T < _FULL_COMPOSITIONS)
        or (K == 3 and (T + 1) * (T + 2) // 2 <= _FULL_COMPOSITIONS)
        or K > 3
    ):
        counts = _compositions(T, K)
        logp = _composition_log_probs(counts, T, log_w)
        keep = logp > np.max(logp) - 40.0  # drops terms below e^-40 of the largest
        return counts[keep], np.exp(logp[keep])
    w = np.exp(log_w)
    widen = 1.0
    while True:
        if K == 2:
            n = _span(T, w[0], widen)
            counts = np.column_stack([n, T - n])
            logp = _composition_log_probs(counts, T, log_w)
            edge = ((n == n[0]) & (n[0] > 0)) | ((n == n[-1]) & (n[-1] < T))
        else:
            i, j = _span(T, w[0], widen), _span(T, w[0] + w[1], widen)
            ii, jj = np.repeat(i, j.size), np.tile(j, i.size)
            keep_ij = jj >= ii
            ii, jj = ii[keep_ij], jj[keep_ij]
            counts = np.column_stack([ii, jj - ii, T - jj])
            logp = _composition_log_probs(counts, T, log_w)
            edge = ((ii == i[0]) & (i[0] > 0)) | ((ii == i[-1]) & (i[-1] < T))
            edge |= ((jj == j[0]) & (j[0] > 0) & (jj > ii)) | ((jj == j[-1]) & (j[-1] < T))
        top = np.max(logp)
        if not np.any(edge & (logp > top - 45.0)):
            keep = logp > top - 40.0
            return counts[keep], np.exp(logp[keep])
        widen *= 2.0


def _span(T: int, p: float, widen: float) -> np.ndarray:
    """Return the counts of ``T`` draws of probability ``p`` within ``widen`` x (12 sd + 32) of the mean."""
    half = int(widen * (12.0 * math.sqrt(T * p * (1.0 - p)) + 32.0))
    mid = round(T * p)
    return np.arange(max(0, mid - half), min(T, mid + half) + 1)


def _compositions(T: int, K: int) -> np.ndarray:
    """Every (n_1..n_K) of non-negative integers summing to T, as rows."""
    if K == 1:
        return np.array([[T]])
    if K == 2:
        n = np.arange(T + 1)
        return np.column_stack([n, T - n])
    i, j = np.triu_indices(T + 1)
    return np.column_stack([i, j - i, T - j])


def _rows_max(a: np.ndarray) -> np.ndarray:
    """Return the maximum over the rows of ``a`` (shape ``(K, N)``), elementwise: ``a.max(axis=0)``."""
    out = a[0].copy()
    for row in a[1:]:
        np.maximum(out, row, out=out)
    return out


def _rows_sum(a: np.ndarray) -> np.ndarray:
    """Return ``a[0] + a[1] + ...`` over the ``K < 8`` rows of ``a``, in that order.

    NumPy sums fewer than 8 values in order, so this is ``a.T.sum(axis=1)`` of the ``(N, K)``
    layout bit for bit, without NumPy's slow reduction over a short axis.
    """
    out = a[0].copy()
    for row in a[1:]:
        out += row
    return out


def _row_totals(a: np.ndarray) -> np.ndarray:
    """Return each row's total, summed as NumPy sums the columns of the ``(N, K)`` layout (``axis=0``).

    For ``K >= 2`` NumPy adds a column's values one after another (:func:`_sequential_totals`);
    a single column is a contiguous sum (pairwise).
    """
    if a.shape[0] == 1:
        return a.sum(axis=1)
    out = np.empty(a.shape[0])
    _sequential_totals(np.ascontiguousarray(a), out)
    return out


@kernel
def _sequential_totals(a, out):  # pragma: no cover - compiled
    """Set ``out[k] = a[k, 0] + a[k, 1] + ...``, added in that order (no reassociation: bit for bit)."""
    for k in range(a.shape[0]):
        s = a[k, 0]
        for i in range(1, a.shape[1]):
            s += a[k, i]
        out[k] = s


def _em(y: np.ndarray, w, m, v, floor: float, max_iter: int = 300, tol: float = 1e-3):
    """Run EM for a 1-D Gaussian mixture from (w, m, v).

    Until the log-likelihood gains less than ``tol`` (or ``max_iter`` steps); returns
    (w, m, v, loglik). Components are rows (shape ``(K, N)``): the sums over components are
    short sums along contiguous memory, and every value is the one of the ``(N, K)`` layout with
    NumPy's reductions, bit for bit (:func:`_rows_sum`, :func:`_row_totals`).
    """
    ll_old = -math.inf
    y = np.ascontiguousarray(y)
    for _ in range(max_iter):
        logd = (np.log(w) - 0.5 * np.log(2 * math.pi * v))[:, None] - (y - m[:, None]) ** 2 * (0.5 / v)[
            :, None
        ]
        top = _rows_max(logd)
        g = np.exp(logd - top)
        tot = _rows_sum(g)
        ll = float(np.sum(top) + np.sum(np.log(tot)))
        g /= tot
        nk = _row_totals(g) + 1e-300
        w = nk / y.size
        m = _row_totals(g * y) / nk
        v = np.maximum(_row_totals(g * (y - m[:, None]) ** 2) / nk, floor)
        if ll - ll_old <= tol:
            break
        ll_old = ll
    return w, m, v, ll


def _mixture_start(y: np.ndarray, K: int, floor: float, variant: int):
    """Deterministic starting points: components that differ in scale (variant 0) or in location (1)."""
    med = float(np.median(y))
    if variant == 0:
        dev2 = (y - med) ** 2
        qs = np.linspace(0.3, 0.999, K) if K > 1 else np.array([0.5])
        v = np.maximum(np.quantile(dev2, qs), floor)
        return np.full(K, 1.0 / K), np.full(K, med), v
    qs = (np.arange(K) + 0.5) / K
    return np.full(K, 1.0 / K), np.quantile(y, qs), np.full(K, max(float(np.var(y)), floor))


def _mixture_se(y, w, m, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute the standard errors of (w, m, v) from the outer product of per-token scores.

    The scores are taken in the well-scaled parameters (w_1..w_{K-1}, m_j / sd_j, log v_j), with
    w_K = 1 - sum of the rest, and mapped back: se(m_j) = sd_j se(m_j / sd_j), se(v_j) = v_j se(log v_j).
    """
    K = w.size
    sd = np.sqrt(v)
    logd = np.log(w) - 0.5 * np.log(2 * math.pi * v) - 0.5 * (y[:, None] - m) ** 2 / v
    g = np.exp(logd - special.logsumexp(logd, axis=1)[:, None])
    z = (y[:, None] - m) / sd
    scores = [g[:, j] / w[j] - g[:, -1] / w[-1] for j in range(K - 1)]
    scores += [g[:, j] * z[:, j] for j in range(K)]
    scores += [g[:, j] * (z[:, j] ** 2 - 1) / 2 for j in range(K)]
    S = np.column_stack(scores)
    cov = np.linalg.inv(S.T @ S)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    se_w = np.zeros(K)
    if K > 1:
        ones = np.ones(K - 1)
        se_w[: K - 1] = se[: K - 1]
        se_w[-1] = math.sqrt(max(float(ones @ cov[: K - 1, : K - 1] @ ones), 0.0))
    return se_w, sd * se[K - 1 : 2 * K - 1], v * se[2 * K - 1 :]


def fit_mixture(data, *, max_components: int = 3, floor: float | None = None) -> MixtureFit:
    r"""Fit a Gaussian mixture of 1 to ``max_components`` components to pooled log-ratios by EM.

    Parameters
    ----------
    data : TokenBatch or array_like
        A batch (its pooled :math:`y = \log r`) or the log-ratios themselves.
    max_components : int
        1 to 3; the number of components is the one with the smallest BIC
        :math:`-2\log L + (3K - 1)\log N`.
    floor : float, optional
        Smallest component variance (default :math:`10^{-12}` times the pooled variance),
        against EM collapsing a component onto one value.

    Returns
    -------
    MixtureFit
    """
    y = np.asarray(data.log_ratio if isinstance(data, TokenBatch) else data, dtype=np.float64).ravel()
    if not isinstance(max_components, int) or not 1 <= max_components <= 3:
        raise ValueError(f"max_components must be 1, 2 or 3, got {max_components!r}")
    if y.size < 10 or not np.all(np.isfinite(y)):
        raise ValueError(f"fit_mixture needs at least 10 finite log-ratios, got {y.size}")
    var = float(np.var(y))
    if var == 0:
        raise ValueError("fit_mixture: the log-ratios are constant")
    floor = 1e-12 * var if floor is None else float(floor)
    return fit_mixture_bic(y, max_components, floor)


def fit_mixture_bic(y: np.ndarray, max_components: int, floor: float) -> MixtureFit:
    """Return the EM fit of 1 to ``max_components`` components with the smallest BIC, with standard errors.

    The kernel of :func:`fit_mixture`, without its checks: any number of components
    (:func:`~variance_lab.rollouts.combined.fit_combined` asks for up to
    :data:`~variance_lab.rollouts.combined.COMB_MAX_COMPONENTS`).

    Parameters
    ----------
    y : ndarray
        Finite pooled log-ratios, not all equal.
    max_components : int
    floor : float
        Smallest component variance.

    Returns
    -------
    MixtureFit
    """
    best, bic = {}, {}
    for K in range(1, max_components + 1):
        # converge on every step-th token (deterministic), then polish on all of them
        step = max(1, y.size // 10_000)
        fits = [_em(y[::step], *_mixture_start(y, K, floor, variant), floor) for variant in (0, 1)]
        w, m, v, ll = _em(y, *max(fits, key=lambda f: f[3])[:3], floor, max_iter=3)
        bic[K] = -2 * ll + (3 * K - 1) * math.log(y.size)
        best[K] = (w, m, v)
    K = min(bic, key=bic.get)
    w, m, v, ll = _em(y, *best[K], floor, max_iter=20)  # polish the chosen one on every token
    bic[K] = -2 * ll + (3 * K - 1) * math.log(y.size)
    order = np.argsort(v)
    w, m, v = w[order], m[order], v[order]
    se_w, se_m, se_v = _mixture_se(y, w, m, v)
    return MixtureFit(w, m, v, se_w, se_m, se_v, ll, bic, int(y.size))
