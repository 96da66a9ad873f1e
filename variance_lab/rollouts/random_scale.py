r"""The ``hier`` model: a length-dependent random scale, fitted by maximum likelihood.

Sequence :math:`i` of length :math:`T_i` draws a variance
:math:`v_i \sim \mathrm{Gamma}(\alpha, \theta(T_i))`,
:math:`\theta(T) = \theta_0 (T/T_0)^\beta` (:math:`T_0` the median length; :math:`\beta = 0`
is the ``random-scale`` family), and given :math:`v_i` its tokens are i.i.d.
:math:`N(c - v_i/2, v_i)`, :math:`c = \log\mu`. Fitted by maximum likelihood
(:func:`fit_random_scale`) with :math:`v_i` integrated out: with :math:`Q_i = \sum_t (y_t - c)^2`,
:math:`D_i = \sum_t (y_t - c)`, :math:`b_i = 1/\theta(T_i) + T_i/8`,

.. math::

    \log L_i = -\tfrac{T_i}{2}\log 2\pi - \tfrac{D_i}{2} - \log\Gamma(\alpha)
               - \alpha\log\theta(T_i)
               + \log\int_{-\infty}^{\infty} e^{(\alpha - T_i/2)u - b_i e^u - (Q_i/2) e^{-u}}\,du,

the integral (over :math:`u = \log v`) by Gauss-Hermite quadrature around its mode
:math:`e^{u^*} = (p + \sqrt{p^2 + 2 b_i Q_i}) / (2 b_i)`, :math:`p = \alpha - T_i/2`.
Standard errors from the inverse of the numerical Hessian of :math:`-\log L`.
:meth:`RandomScaleFit.predict` gives ln E and ln Var of :math:`P_T` and :math:`G_T` and the
clip probabilities at a length :math:`T`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from variance_lab.families import RandomScale
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.mixture import normal_outside
from variance_lab.rollouts.weights import segment_sums

__all__ = ["RandomScaleFit", "SequenceStats", "fit_random_scale", "random_scale_loglik"]

_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite.hermgauss(32)


@functools.lru_cache(maxsize=64)
def _unit_gamma_quantiles(alpha: float, n_grid: int) -> np.ndarray:
    r"""Quantiles of :math:`\mathrm{Gamma}(\alpha, 1)` at the midpoints :math:`(j + 1/2)/n`, read-only.

    ``scipy.stats.gamma.ppf(q, alpha, scale=theta)`` is ``gammaincinv(alpha, q) * theta + 0``
    for every ``theta > 0``, so :func:`_gamma_grid` scales these once-computed values instead
    of inverting the incomplete gamma function again for every length (same floats, bit for bit).
    """
    q = (np.arange(n_grid) + 0.5) / n_grid
    out = special.gammaincinv(alpha, q)
    out.setflags(write=False)
    return out


def _gamma_grid(alpha: float, theta, n_grid: int) -> np.ndarray:
    r"""Return ``n_grid`` quantile midpoints of :math:`\mathrm{Gamma}(\alpha, \theta)`, a row per ``theta``.

    As ``scipy.stats.gamma.ppf(q[None, :], alpha, scale=theta[:, None])``: NaN where
    :math:`\theta` is not positive.
    """
    theta = np.asarray(theta, dtype=np.float64)[:, None]
    with np.errstate(invalid="ignore"):
        v = _unit_gamma_quantiles(float(alpha), int(n_grid))[None, :] * theta + 0.0
    return np.where(theta > 0, v, np.nan)


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

    def predict(self, T, gspo_log_range, ppo_log_range=None, n_grid: int = 2000) -> dict[str, np.ndarray]:
        r"""Ln E / ln Var of :math:`P_T` and :math:`G_T`, and clip probabilities, at lengths ``T``.

        :math:`\log E[P_T^s] = sTc - \alpha\log(1 - \theta(T) T s(s-1)/2)` (``inf`` where the
        bracket is not positive); the clip probabilities integrate the Gaussian ones given
        :math:`v` over the gamma law of :math:`v` on ``n_grid`` quantile midpoints. Without
        ``ppo_log_range``, only what judges a fit (``mean_G``, ``var_G``, ``gspo_clip``).
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
            if name == "P" and ppo_log_range is None:
                continue
            c1, c2 = cgf(s), cgf(2 * s)
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # f2 = 0: variance 0
                f2 = c2 - 2 * c1
                out[f"mean_{name}"] = c1
                out[f"var_{name}"] = np.where(np.isinf(c2), np.inf, 2 * c1 + np.log(np.expm1(f2)))
        out["gspo_clip"] = np.empty(T.size)
        for rows in _row_blocks(T.size, n_grid):  # each length's row alone: blocks bound the memory
            v = _gamma_grid(self.alpha, th[rows], n_grid)  # (lengths, n_grid)
            mean = self.c - v / 2
            out["gspo_clip"][rows] = normal_outside(mean, v / T[rows, None], gspo_log_range).mean(axis=1)
        if ppo_log_range is not None:
            out["ppo_clip"] = self.token_clip(T, ppo_log_range, n_grid)
        return out

    def token_clip(self, T, log_range, n_grid: int = 2000) -> np.ndarray:
        r"""Return :math:`E_v[P(N(c - v/2, v) \notin` ``log_range``:math:`)]` at each length ``T``.

        :math:`v \sim \mathrm{Gamma}(\alpha, \theta(T))`, on ``n_grid`` quantile midpoints of the
        gamma law.
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.float64))
        out = np.empty(T.size)
        for rows in _row_blocks(T.size, n_grid):
            v = _gamma_grid(self.alpha, self.theta(T[rows]), n_grid)
            out[rows] = normal_outside(self.c - v / 2, v, log_range).mean(axis=1)
        return out


@dataclass(frozen=True, eq=False)
class SequenceStats:
    r"""What the ``hier`` likelihood needs of each sequence: :math:`T_i`, :math:`\bar y_i` and :math:`S_i`.

    :math:`S_i = \sum_t (y_t - \bar y_i)^2`, both sums by :func:`~variance_lab.ratios.segment_sums`
    over the batch (:meth:`of`), or the same numbers from the streaming analysis
    (:mod:`variance_lab.rollouts.summaries`), which never holds the batch.
    """

    T: np.ndarray
    ybar: np.ndarray
    S: np.ndarray

    def __len__(self) -> int:
        """Return the number of sequences."""
        return self.T.size

    @classmethod
    def of(cls, batch: TokenBatch) -> SequenceStats:
        """Return the statistics of a batch's sequences."""
        y, off = batch.log_ratio, batch.offsets
        T = np.diff(off).astype(np.float64)
        s1 = segment_sums(y, off)
        ybar = s1 / T
        S = segment_sums((y - np.repeat(ybar, np.diff(off))) ** 2, off)
        return cls(T, ybar, S)


#: Values of a block of rows of the clip integrals (2 MB of float64 an array).
_BLOCK_VALUES = 1 << 18


def _row_blocks(n_rows: int, width: int):
    """Yield slices of at most ``_BLOCK_VALUES // width`` rows (at least one) covering ``n_rows``."""
    step = max(1, _BLOCK_VALUES // width)
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


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
    value = np.log(math.sqrt(2.0) * sd) + _logsumexp_rows(f, _GH_WEIGHTS)
    return np.where(diverges, np.inf, value)


def _logsumexp_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ``scipy.special.logsumexp(a, b=b[None, :], axis=1)`` of a 2-D ``a`` step by step.

    SciPy's (1.17, ``scipy/special/_logsumexp.py``) sets each row's largest values apart, adds
    the others' weighted ``exp`` and takes ``log1p``; where that is not finite, the log of the
    plain weighted sum. The same NumPy operations on the same arrays, without the array-API layers
    that were most of the ``hier`` likelihood's time, give the same numbers (``b`` has no zero).
    """
    b = np.broadcast_to(b[None, :], a.shape)
    given = a
    with np.errstate(divide="ignore", invalid="ignore"):
        a_max = np.max(a, axis=1, keepdims=True)
        top = a == a_max
        a = np.where(top, -np.inf, a)
        m = np.sum(b * top.astype(a.dtype), axis=1, keepdims=True, dtype=a.dtype)
        s = np.sum(b * np.exp(a - a_max), axis=1, keepdims=True, dtype=a.dtype)
        s = np.where(s == 0, s, s / m)
        sgn = np.sign(s + 1) * np.sign(m)
        s = np.where(s < -1, -s - 2, s)
        out = np.log1p(s) + np.log(np.abs(m)) + a_max
    out[sgn < 0] = np.nan
    bad = ~np.isfinite(out[:, 0])
    if bad.any():  # scipy's fallback: the log of the weighted sum itself
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out[bad] = np.log(np.sum(b[bad] * np.exp(given[bad]), axis=1, keepdims=True))
    return out[:, 0]


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
    stats = SequenceStats.of(batch)
    T, ybar, S = stats.T, stats.ybar, stats.S
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


def fit_random_scale(batch: TokenBatch | SequenceStats, *, length_dependent: bool = True) -> RandomScaleFit:
    r"""Fit the random-scale model, with :math:`\theta(T) = \theta_0 (T/T_0)^\beta`, by likelihood.

    Parameters
    ----------
    batch : TokenBatch or SequenceStats
        At least 10 sequences (or their statistics).
    length_dependent : bool
        Fit :math:`\beta`; False holds :math:`\beta = 0` (the ``random-scale`` family for every length).

    Returns
    -------
    RandomScaleFit
    """
    if not isinstance(batch, TokenBatch | SequenceStats):
        raise ValueError(f"fit_random_scale needs a TokenBatch, got {type(batch).__name__}")
    if len(batch) < 10:
        raise ValueError(f"fit_random_scale needs at least 10 sequences, got {len(batch)}")
    stats = batch if isinstance(batch, SequenceStats) else SequenceStats.of(batch)
    T, ybar, S = stats.T, stats.ybar, stats.S
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
