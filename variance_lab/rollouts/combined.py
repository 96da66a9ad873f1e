r"""The ``comb`` model: a per-sequence scale of a sparse token mixture whose rate grows with position.

The token components come from the ``mix`` fit (:mod:`variance_lab.rollouts.mixture`): its widest
components are the sparse part, the others the narrow part; the rate of sparse tokens and its
per-sequence spread are fitted by marginal likelihood (:func:`fit_combined`; the model and its
likelihood are in :class:`CombinedFit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.mixture import MixtureFit, fit_mixture_bic, normal_outside

__all__ = ["COMB_MAX_COMPONENTS", "SPARSE_SD", "CombinedFit", "fit_combined"]


# --------------------------------------------------------------------------------------
# the combined model: a sequence-level scale of a position-dependent sparse token rate
# --------------------------------------------------------------------------------------
#: Most components of ``comb``'s token mixture (BIC chooses up to this many).
COMB_MAX_COMPONENTS = 5

#: Components of ``comb``'s mixture with a standard deviation of log r above this are sparse: one
#: such token (one sd) moves a short sequence's mean log-ratio out of GSPO's range (1 - 3e-4, 1 + 4e-4).
SPARSE_SD = 3e-4

_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite.hermgauss(32)
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

    def predict(self, T, gspo_log_range, ppo_log_range=None, *, n_rep=400, seed=0) -> dict[str, np.ndarray]:
        r"""Ln E / ln Var of :math:`P_T` and :math:`G_T`, token and GSPO clip fractions, at lengths ``T``.

        The moments are exact: given :math:`z`, tokens are independent, so
        :math:`\ln E[e^{s\sum y}\mid z] = \sum_t \ln\bigl[(1-\pi_t) M_0(s) + \pi_t M_1(s)\bigr]`
        (:math:`M_0, M_1` the narrow and sparse moment generating functions, :math:`s = k`
        for :math:`P_T^k`, :math:`k/T` for :math:`G_T^k`), and :math:`z` is integrated by
        quadrature. GSPO's clip probability is a seeded Monte Carlo over :math:`z` and each
        token's component, ``n_rep`` draws per length, given which :math:`\bar y` is Gaussian
        (its probability outside the range is exact); ``gspo_clip_se`` is its standard error.
        Without ``ppo_log_range``, only what judges a fit (``mean_G``, ``var_G``, ``gspo_clip``
        and its standard error).
        """
        T = np.atleast_1d(np.asarray(T, dtype=np.int64))
        names = ("G",) if ppo_log_range is None else ("P", "G")
        out: dict[str, np.ndarray] = {f"{k}_{n}": np.empty(T.size) for n in names for k in ("mean", "var")}
        for i, t in enumerate(T):
            for name in names:
                s = 1.0 if name == "P" else 1.0 / t
                l1, l2 = self._log_moment(int(t), s), self._log_moment(int(t), 2 * s)
                out[f"mean_{name}"][i] = l1
                d = 2 * l1 - l2
                out[f"var_{name}"][i] = l2 + math.log(-math.expm1(d)) if d < 0 else -math.inf
        if ppo_log_range is not None:
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
        :func:`~variance_lab.rollouts.mixture.fit_mixture`); at least 2.
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
        mix = fit_mixture_bic(y, COMB_MAX_COMPONENTS, 1e-12 * float(np.var(y)))
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
