r"""Ratio models fitted to real rollouts: a sparse token mixture and a length-dependent random scale.

Two models for what the i.i.d. lognormal fit misses in real token log-ratios
:math:`y_t = \log r_t` (heavy tails, and sequences that differ in scale):

``mix`` (:func:`fit_mixture`)
    Tokens i.i.d. from a mixture of :math:`K \le 3` Gaussians in log space,
    :math:`y \sim \sum_j w_j N(m_j, v_j)`: the ``lognormal-mixture`` family. Fitted by EM on
    the pooled log-ratios; :math:`K` is the one with the smallest BIC,
    :math:`-2\log L + (3K - 1)\log N`. Standard errors from the outer product of the
    per-token scores (they treat tokens as independent, so they are too small where tokens
    within a sequence are correlated).

``hier`` (:func:`fit_random_scale`)
    Sequence :math:`i` of length :math:`T_i` draws a variance
    :math:`v_i \sim \mathrm{Gamma}(\alpha, \theta(T_i))`,
    :math:`\theta(T) = \theta_0 (T/T_0)^\beta` (:math:`T_0` the median length; :math:`\beta = 0`
    is the ``random-scale`` family), and given :math:`v_i` its tokens are i.i.d.
    :math:`N(c - v_i/2, v_i)`, :math:`c = \log\mu`. Fitted by maximum likelihood with
    :math:`v_i` integrated out: with :math:`Q_i = \sum_t (y_t - c)^2`,
    :math:`D_i = \sum_t (y_t - c)`, :math:`b_i = 1/\theta(T_i) + T_i/8`,

    .. math::

        \log L_i = -\tfrac{T_i}{2}\log 2\pi - \tfrac{D_i}{2} - \log\Gamma(\alpha)
                   - \alpha\log\theta(T_i)
                   + \log\int_{-\infty}^{\infty} e^{(\alpha - T_i/2)u - b_i e^u - (Q_i/2) e^{-u}}\,du,

    the integral (over :math:`u = \log v`) by Gauss-Hermite quadrature around its mode
    :math:`e^{u^*} = (p + \sqrt{p^2 + 2 b_i Q_i}) / (2 b_i)`, :math:`p = \alpha - T_i/2`.
    Standard errors from the inverse of the numerical Hessian of :math:`-\log L`.

Predictions of both at a length :math:`T` (:meth:`MixtureFit.predict`,
:meth:`RandomScaleFit.predict`): ln E and ln Var of :math:`P_T` and :math:`G_T`, and the
probabilities that GSPO clips a sequence and that PPO clips a token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from variance_lab import theory
from variance_lab.families import LognormalMixture, RandomScale
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.weights import segment_sums

__all__ = [
    "COMB_MAX_COMPONENTS",
    "SPARSE_SD",
    "CombinedFit",
    "MixtureFit",
    "RandomScaleFit",
    "fit_combined",
    "fit_mixture",
    "fit_random_scale",
    "normal_outside",
    "random_scale_loglik",
]

_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite.hermgauss(32)


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

    def predict(self, T, gspo_log_range, ppo_log_range) -> dict[str, np.ndarray]:
        """Ln E / ln Var of P_T and G_T (exact theory of the family) and clip probabilities at ``T``."""
        T = np.atleast_1d(np.asarray(T, dtype=np.int64))
        fam = self.family()
        out = {}
        for stat in ("mean_P", "var_P", "mean_G", "var_G"):
            out[stat] = theory.value(stat, fam, T, log10=True) * math.log(10.0)
        out["gspo_clip"] = np.array([self._gspo_clip(int(t), gspo_log_range) for t in T])
        out["ppo_clip"] = self.token_clip(T, ppo_log_range)
        return out

    def token_clip(self, T, log_range) -> np.ndarray:
        r"""Return :math:`\sum_j w_j P(N(m_j, v_j) \notin` ``log_range``:math:`)`, the same at every ``T``."""
        p = float(np.sum(self.weights * normal_outside(self.means, self.variances, log_range)))
        return np.full(np.atleast_1d(np.asarray(T)).shape, p)

    def _gspo_clip(self, T: int, log_range) -> float:
        r"""Return the clip probability of the mean of :math:`T` tokens.

        :math:`P(\bar y \notin (\log a, \log b))`, exact over the component counts
        :math:`n \sim \mathrm{Multinomial}(T, w)`, given which
        :math:`\bar y \sim N(\sum n_j m_j / T, \sum n_j v_j / T^2)`.
        """
        w, m, v = self.weights, self.means, self.variances
        counts = _compositions(T, w.size)
        logp = special.gammaln(T + 1) + np.sum(counts * np.log(w) - special.gammaln(counts + 1), axis=1)
        keep = logp > np.max(logp) - 40.0  # drops terms below e^-40 of the largest
        c, p = counts[keep], np.exp(logp[keep])
        prob = normal_outside(c @ m / T, c @ v / T**2, log_range)
        return float(np.sum(p * prob) / np.sum(p))


def _compositions(T: int, K: int) -> np.ndarray:
    """Every (n_1..n_K) of non-negative integers summing to T, as rows."""
    if K == 1:
        return np.array([[T]])
    if K == 2:
        n = np.arange(T + 1)
        return np.column_stack([n, T - n])
    i, j = np.triu_indices(T + 1)
    return np.column_stack([i, j - i, T - j])


def _em(y: np.ndarray, w, m, v, floor: float, max_iter: int = 300, tol: float = 1e-3):
    """Run EM for a 1-D Gaussian mixture from (w, m, v).

    Until the log-likelihood gains less than ``tol`` (or ``max_iter`` steps); returns
    (w, m, v, loglik).
    """
    ll_old = -math.inf
    y2 = y[:, None]
    for _ in range(max_iter):
        logd = (np.log(w) - 0.5 * np.log(2 * math.pi * v)) - (y2 - m) ** 2 * (0.5 / v)
        top = logd.max(axis=1, keepdims=True)
        g = np.exp(logd - top)
        tot = g.sum(axis=1, keepdims=True)
        ll = float(np.sum(top) + np.sum(np.log(tot)))
        g /= tot
        nk = g.sum(axis=0) + 1e-300
        w = nk / y.size
        m = (g * y2).sum(axis=0) / nk
        v = np.maximum((g * (y2 - m) ** 2).sum(axis=0) / nk, floor)
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
    return _fit_bic(y, max_components, floor)


def _fit_bic(y: np.ndarray, max_components: int, floor: float) -> MixtureFit:
    """EM fits of 1 to ``max_components`` components; the one with the smallest BIC, with standard errors."""
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


# --------------------------------------------------------------------------------------
# the length-dependent random scale
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RandomScaleFit:
    r"""A random-scale model with a length-dependent scale, fitted by likelihood (module docstring).

    Attributes
    ----------
    c : float
        :math:`\log\mu`, the mean of :math:`y + v/2`.
    alpha, theta0, beta : float
        Gamma shape, scale at :math:`T_0` and length exponent: :math:`\theta(T) = \theta_0 (T/T_0)^\beta`.
    T0 : float
        Reference length (the median length of the batch).
    se_c, se_alpha, se_theta0, se_beta : float
        Standard errors (inverse Hessian; delta method for alpha and theta0).
    cov : ndarray
        Covariance of :math:`(c, \log\alpha, \log\theta_0, \beta)`.
    loglik : float
    n_sequences : int
    length_dependent : bool
        False when :math:`\beta` was held at 0.
    """

    c: float
    alpha: float
    theta0: float
    beta: float
    T0: float
    se_c: float
    se_alpha: float
    se_theta0: float
    se_beta: float
    cov: np.ndarray
    loglik: float
    n_sequences: int
    length_dependent: bool

    def theta(self, T) -> np.ndarray:
        r""":math:`\theta(T) = \theta_0 (T/T_0)^\beta`."""
        return self.theta0 * (np.asarray(T, dtype=np.float64) / self.T0) ** self.beta

    def family(self, T: int) -> RandomScale:
        """Return the ``random-scale`` family of sequences of length ``T`` (needs theta(T) < 1)."""
        th = float(self.theta(T))
        if not th < 1:
            raise ValueError(f"theta(T={T}) = {th!r} >= 1: E[r^2] is infinite, no random-scale family")
        mu = math.exp(self.c)
        return RandomScale(mu, mu * mu * math.expm1(-self.alpha * math.log1p(-th)), alpha=self.alpha)

    def predict(self, T, gspo_log_range, ppo_log_range, n_grid: int = 2000) -> dict[str, np.ndarray]:
        r"""Ln E / ln Var of :math:`P_T` and :math:`G_T`, and clip probabilities, at lengths ``T``.

        :math:`\log E[P_T^s] = sTc - \alpha\log(1 - \theta(T) T s(s-1)/2)` (``inf`` where the
        bracket is not positive); the clip probabilities integrate the Gaussian ones given
        :math:`v` over the gamma law of :math:`v` on ``n_grid`` quantile midpoints.
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.float64))
        th = self.theta(T)

        def cgf(s):
            z = th * T * s * (s - 1) / 2
            with np.errstate(divide="ignore", invalid="ignore"):
                val = s * T * self.c - self.alpha * np.log1p(-z)
            return np.where(z < 1, val, np.inf)

        out = {}
        for name, s in (("P", np.ones_like(T)), ("G", 1.0 / T)):
            c1, c2 = cgf(s), cgf(2 * s)
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # f2 = 0: variance 0
                f2 = c2 - 2 * c1
                out[f"mean_{name}"] = c1
                out[f"var_{name}"] = np.where(np.isinf(c2), np.inf, 2 * c1 + np.log(np.expm1(f2)))
        q = (np.arange(n_grid) + 0.5) / n_grid
        v = stats.gamma.ppf(q[None, :], self.alpha, scale=th[:, None])  # (len(T), n_grid)
        mean = self.c - v / 2
        out["gspo_clip"] = normal_outside(mean, v / T[:, None], gspo_log_range).mean(axis=1)
        out["ppo_clip"] = self.token_clip(T, ppo_log_range, n_grid)
        return out

    def token_clip(self, T, log_range, n_grid: int = 2000) -> np.ndarray:
        r"""Return :math:`E_v[P(N(c - v/2, v) \notin` ``log_range``:math:`)]` at each length ``T``.

        :math:`v \sim \mathrm{Gamma}(\alpha, \theta(T))`, on ``n_grid`` quantile midpoints of the
        gamma law.
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.float64))
        q = (np.arange(n_grid) + 0.5) / n_grid
        v = stats.gamma.ppf(q[None, :], self.alpha, scale=self.theta(T)[:, None])
        return normal_outside(self.c - v / 2, v, log_range).mean(axis=1)


def _sequence_stats(batch: TokenBatch):
    """(T_i, sum y, sum y^2 about the sequence mean) per sequence."""
    y, off = batch.log_ratio, batch.offsets
    T = np.diff(off).astype(np.float64)
    s1 = segment_sums(y, off)
    ybar = s1 / T
    S = segment_sums((y - np.repeat(ybar, np.diff(off))) ** 2, off)
    return T, ybar, S


def _log_integral(p, a, b):
    r""":math:`\log\int e^{pu - b e^u - a e^{-u}} du` by Gauss-Hermite around the mode (vectorised).

    ``a >= 0``, ``b > 0``. The mode is :math:`u_0 = \log x`, :math:`x` the positive root of
    :math:`b x^2 - p x - a = 0`, taken in the form without cancellation for each sign of
    :math:`p`. Where :math:`a = 0` and :math:`p \le 0` there is no positive root and the
    integral diverges (:math:`e^{pu}` at :math:`u \to -\infty`): ``inf`` there. Both branches
    of each ``np.where`` are evaluated, so the unused one is fed a safe value (a warning
    from it fails under ``-W error`` on some processors, whose optimiser lands on ``a = 0``).
    """
    disc = np.sqrt(p * p + 4 * a * b)
    pos = p >= 0
    x = np.where(pos, (p + disc) / (2 * b), 2 * a / np.where(pos, 1.0, disc - p))
    diverges = ~(x > 0)
    x = np.where(diverges, 1.0, x)
    u0 = np.log(x)
    sd = 1.0 / np.sqrt(b * x + a / x)
    u = u0[:, None] + math.sqrt(2.0) * sd[:, None] * _GH_NODES[None, :]
    f = p[:, None] * u - b[:, None] * np.exp(u) - a[:, None] * np.exp(-u) + _GH_NODES[None, :] ** 2
    value = np.log(math.sqrt(2.0) * sd) + special.logsumexp(f, b=_GH_WEIGHTS[None, :], axis=1)
    return np.where(diverges, np.inf, value)


def _neg_loglik(x, T, ybar, S, T0, length_dependent: bool) -> float:
    c, log_alpha, log_theta0 = x[0], x[1], x[2]
    beta = x[3] if length_dependent else 0.0
    alpha = math.exp(log_alpha)
    log_theta = log_theta0 + beta * np.log(T / T0)
    Q = S + T * (ybar - c) ** 2
    D = T * (ybar - c)
    b = np.exp(-log_theta) + T / 8
    ll = (
        -T / 2 * math.log(2 * math.pi)
        - D / 2
        - special.gammaln(alpha)
        - alpha * log_theta
        + _log_integral(alpha - T / 2, Q / 2, b)
    )
    total = float(np.sum(ll))
    return -total if math.isfinite(total) else 1e300


def random_scale_loglik(batch: TokenBatch, c: float, alpha: float, theta0: float, beta: float = 0.0, T0=None):
    r"""Log-likelihood of each sequence under the random-scale model, :math:`v` integrated out.

    Parameters
    ----------
    batch : TokenBatch
    c, alpha, theta0, beta : float
        :math:`\log\mu`, gamma shape, scale at ``T0`` and length exponent (module docstring).
    T0 : float, optional
        Reference length (default: the median length).

    Returns
    -------
    float
        :math:`\sum_i \log L_i`.
    """
    T, ybar, S = _sequence_stats(batch)
    T0 = float(np.median(T)) if T0 is None else float(T0)
    x = np.array([c, math.log(alpha), math.log(theta0), beta])
    return -_neg_loglik(x, T, ybar, S, T0, True)


def _hessian(f, x: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """Central-difference Hessian of ``f`` at ``x``."""
    n = x.size
    H = np.empty((n, n))
    E = np.eye(n) * h
    for i in range(n):
        for j in range(i, n):
            H[i, j] = H[j, i] = (
                f(x + E[i] + E[j]) - f(x + E[i] - E[j]) - f(x - E[i] + E[j]) + f(x - E[i] - E[j])
            ) / (4 * h * h)
    return H


def fit_random_scale(batch: TokenBatch, *, length_dependent: bool = True) -> RandomScaleFit:
    r"""Fit the random-scale model, with :math:`\theta(T) = \theta_0 (T/T_0)^\beta`, by likelihood.

    Parameters
    ----------
    batch : TokenBatch
        At least 10 sequences.
    length_dependent : bool
        Fit :math:`\beta`; False holds :math:`\beta = 0` (the ``random-scale`` family for every length).

    Returns
    -------
    RandomScaleFit
    """
    if not isinstance(batch, TokenBatch):
        raise ValueError(f"fit_random_scale needs a TokenBatch, got {type(batch).__name__}")
    if len(batch) < 10:
        raise ValueError(f"fit_random_scale needs at least 10 sequences, got {len(batch)}")
    T, ybar, S = _sequence_stats(batch)
    T0 = float(np.median(T))
    ms = np.maximum((S + T * (ybar - np.mean(ybar)) ** 2) / T, 1e-300)
    slope = float(np.polyfit(np.log(T / T0), np.log(ms), 1)[0]) if length_dependent and np.ptp(T) > 0 else 0.0
    x0 = [float(np.average(ybar, weights=T)), math.log(0.5), math.log(2 * float(np.median(ms))), slope]
    n = 4 if length_dependent else 3

    # optimise in well-scaled coordinates z = (x - x0) / scale: c moves on the scale of its standard error
    scale = np.array([math.sqrt(float(np.mean(ms)) / float(T.sum())), 1.0, 1.0, 1.0])[:n]
    x0 = np.array(x0[:n])

    def f(z):
        return _neg_loglik(x0 + scale * z, T, ybar, S, T0, length_dependent)

    res = optimize.minimize(f, np.zeros(n), method="BFGS", options={"gtol": 1e-6})
    x = x0 + scale * res.x
    cov_z = np.linalg.pinv(_hessian(f, res.x))
    cov = cov_z * np.outer(scale, scale)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    alpha, theta0 = math.exp(x[1]), math.exp(x[2])
    return RandomScaleFit(
        c=float(x[0]),
        alpha=alpha,
        theta0=theta0,
        beta=float(x[3]) if length_dependent else 0.0,
        T0=T0,
        se_c=float(se[0]),
        se_alpha=alpha * float(se[1]),
        se_theta0=theta0 * float(se[2]),
        se_beta=float(se[3]) if length_dependent else 0.0,
        cov=cov,
        loglik=-float(res.fun),
        n_sequences=len(batch),
        length_dependent=length_dependent,
    )


# --------------------------------------------------------------------------------------
# the combined model: a sequence-level scale of a position-dependent sparse token rate
# --------------------------------------------------------------------------------------
#: Most components of ``comb``'s token mixture (BIC chooses up to this many).
COMB_MAX_COMPONENTS = 5

#: Components of ``comb``'s mixture with a standard deviation of log r above this are sparse: one
#: such token (one sd) moves a short sequence's mean log-ratio out of GSPO's range (1 - 3e-4, 1 + 4e-4).
SPARSE_SD = 3e-4

_GH_Z = math.sqrt(2.0) * _GH_NODES  # nodes and log weights of E[f(z)], z ~ N(0, 1)
_GH_LOGW = np.log(_GH_WEIGHTS / math.sqrt(math.pi))


def _log_expit(x):
    """Return log(1 / (1 + e^-x)) without overflow."""
    return -np.logaddexp(0.0, -x)


@dataclass(frozen=True)
class CombinedFit:
    r"""The ``comb`` model: a per-sequence scale of a sparse token mixture whose rate grows with position.

    Token :math:`t` (position :math:`p_t`, counted from 0) of sequence :math:`i` is *sparse*
    with probability

    .. math::

        \pi_{it} = \operatorname{expit}\bigl(a + b\log(1 + p_t) + \tau z_i\bigr), \qquad z_i \sim N(0, 1),

    so the odds of a sparse token are scaled per sequence by the lognormal factor
    :math:`e^{\tau z_i}`; a sparse token is :math:`N(m, v)`, any other token is drawn from the
    narrow mixture :math:`\sum_j w_j N(m_j, v_j)`: the sparse component is the ``mix`` fit's
    widest, the narrow mixture its others with their weights renormalised, all held fixed.
    :math:`(a, b, \log\tau)` maximise the likelihood with :math:`z_i` integrated out by
    32-point Gauss-Hermite quadrature:

    .. math::

        \log L = \sum_i \log \int \prod_t \bigl[(1 - \pi_{it}) f_0(y_t) + \pi_{it} \phi(y_t; m, v)\bigr]
        \, \phi(z_i)\, dz_i .

    Attributes
    ----------
    narrow_weights, narrow_means, narrow_variances : ndarray
        :math:`w_j, m_j, v_j` of the narrow mixture (weights sum to 1).
    sparse_weights, sparse_means, sparse_variances : ndarray
        The sparse mixture (one component, the widest, unless ``n_sparse`` says more).
    a, b, tau : float
        Rate intercept, slope in :math:`\log(1 + p)`, and the spread of the per-sequence factor.
    se_a, se_b, se_tau : float
        Standard errors (inverse Hessian of :math:`-\log L`; delta method for :math:`\tau`),
        conditional on the components.
    cov : ndarray
        Covariance of :math:`(a, b, \log\tau)`.
    loglik : float
    n_sequences, n_tokens : int
    converged : bool
        Whether the optimiser reported convergence.
    """

    narrow_weights: np.ndarray
    narrow_means: np.ndarray
    narrow_variances: np.ndarray
    sparse_weights: np.ndarray
    sparse_means: np.ndarray
    sparse_variances: np.ndarray
    a: float
    b: float
    tau: float
    se_a: float
    se_b: float
    se_tau: float
    cov: np.ndarray
    loglik: float
    n_sequences: int
    n_tokens: int
    converged: bool = True

    def rate(self, position, z=0.0) -> np.ndarray:
        r"""Return :math:`\pi = \operatorname{expit}(a + b\log(1 + p) + \tau z)` (broadcast)."""
        return np.exp(_log_expit(self.a + self.b * np.log1p(np.asarray(position, float)) + self.tau * z))

    def _rates(self, T: int) -> np.ndarray:
        """Sparse rate of positions 0..T-1 at each quadrature node, shape (T, nodes)."""
        return self.rate(np.arange(T)[:, None], _GH_Z[None, :])

    def _log_mgf(self, s: float) -> tuple[float, float]:
        """Ln E[e^{s y}] of a narrow token and of a sparse token."""
        narrow = special.logsumexp(
            s * self.narrow_means + 0.5 * s * s * self.narrow_variances, b=self.narrow_weights
        )
        sparse = special.logsumexp(
            s * self.sparse_means + 0.5 * s * s * self.sparse_variances, b=self.sparse_weights
        )
        return float(narrow), float(sparse)

    def _log_moment(self, T: int, s: float) -> float:
        r"""Return :math:`\ln E[e^{s\sum_t y_t}]` of a sequence of length ``T`` (exact, z by quadrature)."""
        eta = self.a + self.b * np.log1p(np.arange(T))[:, None] + self.tau * _GH_Z[None, :]
        l0, l1 = self._log_mgf(s)
        per_node = np.sum(np.logaddexp(_log_expit(-eta) + l0, _log_expit(eta) + l1), axis=0)
        return float(special.logsumexp(per_node + _GH_LOGW))

    def token_clip(self, T, log_range) -> np.ndarray:
        """Return the expected fraction of the ``T`` tokens of a sequence outside ``log_range``, per T."""
        out0 = float(
            np.sum(self.narrow_weights * normal_outside(self.narrow_means, self.narrow_variances, log_range))
        )
        out1 = float(
            np.sum(self.sparse_weights * normal_outside(self.sparse_means, self.sparse_variances, log_range))
        )
        res = []
        for t in np.atleast_1d(np.asarray(T, dtype=np.int64)):
            pi = self._rates(int(t))
            res.append(float(np.exp(_GH_LOGW) @ ((1 - pi) * out0 + pi * out1).mean(axis=0)))
        return np.array(res)

    def predict(self, T, gspo_log_range, ppo_log_range, *, n_rep=400, seed=0) -> dict[str, np.ndarray]:
        r"""Ln E / ln Var of :math:`P_T` and :math:`G_T`, token and GSPO clip fractions, at lengths ``T``.

        The moments are exact: given :math:`z`, tokens are independent, so
        :math:`\ln E[e^{s\sum y}\mid z] = \sum_t \ln\bigl[(1-\pi_t) M_0(s) + \pi_t M_1(s)\bigr]`
        (:math:`M_0, M_1` the narrow and sparse moment generating functions, :math:`s = k`
        for :math:`P_T^k`, :math:`k/T` for :math:`G_T^k`), and :math:`z` is integrated by
        quadrature. GSPO's clip probability is a seeded Monte Carlo over :math:`z` and each
        token's component, ``n_rep`` draws per length, given which :math:`\bar y` is Gaussian
        (its probability outside the range is exact); ``gspo_clip_se`` is its standard error.
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.int64))
        out: dict[str, np.ndarray] = {k: np.empty(T.size) for k in ("mean_P", "var_P", "mean_G", "var_G")}
        for i, t in enumerate(T):
            for name, s in (("P", 1.0), ("G", 1.0 / t)):
                l1, l2 = self._log_moment(int(t), s), self._log_moment(int(t), 2 * s)
                out[f"mean_{name}"][i] = l1
                d = 2 * l1 - l2
                out[f"var_{name}"][i] = l2 + math.log(-math.expm1(d)) if d < 0 else -math.inf
        out["ppo_clip"] = self.token_clip(T, ppo_log_range)
        out["gspo_clip"], out["gspo_clip_se"] = self.gspo_clip(T, gspo_log_range, n_rep=n_rep, seed=seed)
        return out

    def gspo_clip(self, T, log_range, *, n_rep=400, seed=0) -> tuple[np.ndarray, np.ndarray]:
        r"""Return Monte Carlo :math:`P(\bar y_T \notin` ``log_range``:math:`)` and its standard error, per T.

        ``n_rep`` draws per length (an int, or one per entry of ``T``), from ``seed``.

        Rao-Blackwellised: each draw picks :math:`z` and every token's component, and adds the
        exact Gaussian probability of :math:`\bar y` given them.
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.int64))
        reps = np.broadcast_to(np.asarray(n_rep, dtype=np.int64), T.shape)
        rng = np.random.default_rng(
            seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        )
        cw0, cw1 = np.cumsum(self.narrow_weights), np.cumsum(self.sparse_weights)
        k0 = cw0.size
        m_all = np.append(self.narrow_means, self.sparse_means)
        v_all = np.append(self.narrow_variances, self.sparse_variances)
        p, se = np.empty(T.size), np.empty(T.size)
        for i, t in enumerate(T):
            t, n_rep = int(t), int(reps[i])
            z = rng.standard_normal((n_rep, 1))
            sparse = rng.random((n_rep, t)) < self.rate(np.arange(t)[None, :], z)
            u = rng.random((n_rep, t))
            c0 = np.minimum(np.searchsorted(cw0, u * cw0[-1], side="right"), k0 - 1)
            c1 = k0 + np.minimum(np.searchsorted(cw1, u * cw1[-1], side="right"), cw1.size - 1)
            comp = np.where(sparse, c1, c0)
            q = normal_outside(m_all[comp].sum(axis=1) / t, v_all[comp].sum(axis=1) / t**2, log_range)
            p[i], se[i] = q.mean(), q.std(ddof=1) / math.sqrt(n_rep) if n_rep > 1 else math.nan
        return p, se


_AGH_X, _AGH_W = np.polynomial.hermite.hermgauss(12)  # adaptive nodes of the comb likelihood
_CGH_X, _CGH_W = np.polynomial.hermite.hermgauss(16)  # the first pass, on N(0, 1)
_CGH_Z, _CGH_LOGW = math.sqrt(2.0) * _CGH_X, np.log(_CGH_W / math.sqrt(math.pi))


def _comb_node_logs(z, a, b, tau, lf0, lf1, lp, counts):
    """Per token and node: log density and (log pi, log posterior sparse), z per sequence and node."""
    eta = (a + b * lp)[:, None] + tau * np.repeat(z, counts, axis=0)
    l_sp = _log_expit(eta) + lf1[:, None]
    lt = np.logaddexp(_log_expit(-eta) + lf0[:, None], l_sp)
    return eta, l_sp, lt


def _comb_loglik(x, lf0, lf1, lp, starts, grad: bool = False):
    r"""Log-likelihood of the combined model at ``x = (a, b, log tau)`` and, with ``grad``, its gradient.

    Adaptive Gauss-Hermite over each :math:`z_i`: a 16-node pass on :math:`N(0, 1)` finds the
    posterior mean :math:`\mu_i` and sd :math:`\sigma_i` of :math:`z_i` (refined once on 12 nodes
    around them), then 12 nodes
    :math:`z = \mu_i + \sqrt2\sigma_i x_k` with weights
    :math:`w_k e^{x_k^2} \sigma_i\sqrt2\,\phi(z)` integrate the likelihood.
    With :math:`\ell_{it} = \log[(1-\pi)f_0 + \pi f_1]`, :math:`\partial\ell/\partial\eta = r - \pi`
    (:math:`r` the posterior probability that the token is sparse); the gradient holds the
    nodes fixed.
    """
    a, b, log_tau = x
    tau = math.exp(log_tau)
    counts = np.diff(np.append(starts, lf0.size))
    n = starts.size
    z = np.broadcast_to(_CGH_Z, (n, _CGH_Z.size))
    logw = np.broadcast_to(_CGH_LOGW, (n, _CGH_Z.size))
    for _ in range(2):  # locate each posterior (twice: the first pass may straddle it), then integrate
        eta, l_sp, lt = _comb_node_logs(z, a, b, tau, lf0, lf1, lp, counts)
        per_seq = np.add.reduceat(lt, starts, axis=0) + logw
        q = np.exp(per_seq - special.logsumexp(per_seq, axis=1)[:, None])
        mu = np.sum(q * z, axis=1)
        sd = np.sqrt(np.maximum(np.sum(q * (z - mu[:, None]) ** 2, axis=1), 1e-4))
        z = mu[:, None] + math.sqrt(2.0) * sd[:, None] * _AGH_X[None, :]
        logw = np.log(_AGH_W)[None, :] + _AGH_X[None, :] ** 2 + np.log(sd)[:, None] - 0.5 * z * z
        logw = logw - 0.5 * math.log(math.pi)
    eta, l_sp, lt = _comb_node_logs(z, a, b, tau, lf0, lf1, lp, counts)
    per_seq = np.add.reduceat(lt, starts, axis=0) + logw
    li = special.logsumexp(per_seq, axis=1)
    total = float(np.sum(li))
    if not grad:
        return total
    q = np.exp(per_seq - li[:, None])  # weight of each node in the sequence's likelihood
    dq = (np.exp(l_sp - lt) - np.exp(_log_expit(eta))) * np.repeat(q, counts, axis=0)  # (r - pi) q
    g = np.array(
        [dq.sum(), float(lp @ dq.sum(axis=1)), tau * float(np.sum(dq * np.repeat(z, counts, axis=0)))]
    )
    return total, g


def fit_combined(
    batch: TokenBatch, mix: MixtureFit | None = None, *, n_sparse: int | None = None, max_tokens: int = 30_000
) -> CombinedFit:
    r"""Fit the ``comb`` model (:class:`CombinedFit`) by marginal likelihood.

    The token components are held fixed; :math:`(a, b, \log\tau)` maximise the likelihood
    (L-BFGS-B with the analytic gradient, within :math:`a \in [-20, 10]`, :math:`b \in [-5, 5]`,
    :math:`\tau \in [10^{-3}, 10]`; standard errors from the inverse of the gradient's numerical
    Jacobian, conditional on the components).

    Parameters
    ----------
    batch : TokenBatch
        At least 10 sequences; its token positions enter the sparse rate.
    mix : MixtureFit, optional
        The token components (default: a Gaussian mixture of up to :data:`COMB_MAX_COMPONENTS`
        components fitted by EM to the pooled log-ratios, the number by BIC as in
        :func:`fit_mixture`); at least 2.
    n_sparse : int, optional
        How many of the widest components form the sparse part (fewer than the components);
        default: those with a standard deviation above :data:`SPARSE_SD`, at least the widest.
    max_tokens : int
        Cost cap: with more tokens, the rate parameters are fitted on every k-th sequence
        (:math:`k = \lceil n_{tokens} / max\_tokens \rceil`; deterministic), the components on
        all; ``n_sequences`` and ``n_tokens`` say how many entered, and the standard errors are
        those of that subsample.

    Returns
    -------
    CombinedFit
    """
    if not isinstance(batch, TokenBatch):
        raise ValueError(f"fit_combined needs a TokenBatch, got {type(batch).__name__}")
    if len(batch) < 10:
        raise ValueError(f"fit_combined needs at least 10 sequences, got {len(batch)}")
    if mix is None:
        y = np.asarray(batch.log_ratio, dtype=np.float64)
        if y.size < 10 or np.var(y) == 0:
            raise ValueError(
                f"fit_combined needs at least 10 log-ratios that are not all equal, got {y.size}"
            )
        mix = _fit_bic(y, COMB_MAX_COMPONENTS, 1e-12 * float(np.var(y)))
    if n_sparse is None:
        n_sparse = max(1, int(np.sum(np.sqrt(mix.variances) > SPARSE_SD)))
    if not isinstance(n_sparse, int) or not 1 <= n_sparse < mix.n_components:
        raise ValueError(
            f"fit_combined needs 1 <= n_sparse < the mixture's {mix.n_components} components, "
            f"got n_sparse={n_sparse!r}: no narrow or no sparse part"
        )
    step = max(1, math.ceil(batch.n_tokens / max_tokens))
    sub = batch if step == 1 else batch.select(np.arange(0, len(batch), step))
    y = np.asarray(sub.log_ratio, dtype=np.float64)
    lp = np.log1p(sub.positions.astype(np.float64))
    starts = sub.offsets[:-1]
    k = mix.n_components - n_sparse
    w0, m0, v0 = mix.weights[:k] / mix.weights[:k].sum(), mix.means[:k], mix.variances[:k]
    w1, m1, v1 = mix.weights[k:] / mix.weights[k:].sum(), mix.means[k:], mix.variances[k:]

    def log_density(w, m, v):
        return special.logsumexp(
            np.log(w) - 0.5 * np.log(2 * math.pi * v) - (y[:, None] - m) ** 2 / (2 * v), axis=1
        )

    lf0, lf1 = log_density(w0, m0, v0), log_density(w1, m1, v1)
    wk = float(mix.weights[k:].sum())
    x0 = np.array([math.log(wk / (1 - wk)), 0.0, math.log(0.5)])

    def f(x):
        val, g = _comb_loglik(x, lf0, lf1, lp, starts, grad=True)
        return -val, -g

    # bounds keep a degenerate fit (every token sparse, or an unbounded spread) finite and quick
    bounds = [(-20.0, 10.0), (-5.0, 5.0), (math.log(1e-3), math.log(10.0))]
    x0 = np.clip(x0, [lo for lo, _ in bounds], [hi for _, hi in bounds])
    res = optimize.minimize(f, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 40})
    x = res.x
    h = 1e-5
    H = np.empty((3, 3))
    for j in range(3):
        e = np.zeros(3)
        e[j] = h
        H[:, j] = (f(x + e)[1] - f(x - e)[1]) / (2 * h)
    cov = np.linalg.pinv(0.5 * (H + H.T))
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    tau = math.exp(x[2])
    return CombinedFit(
        narrow_weights=w0,
        narrow_means=m0,
        narrow_variances=v0,
        sparse_weights=w1,
        sparse_means=m1,
        sparse_variances=v1,
        a=float(x[0]),
        b=float(x[1]),
        tau=tau,
        se_a=float(se[0]),
        se_b=float(se[1]),
        se_tau=tau * float(se[2]),
        cov=cov,
        loglik=-float(res.fun),
        n_sequences=len(sub),
        n_tokens=int(y.size),
        converged=bool(res.success),
    )
