r"""VCPO's variance control: a learning rate scaled by the effective sample size, and its baseline.

VCPO (Huang et al., arXiv 2602.17616; the code at ``mit-han-lab/vcpo``, commit ``c7f030f``) finds
that asynchronous RL collapses when the effective sample size of the sequence weights collapses.
Per minibatch of :math:`N` sequences with sequence weights :math:`w_i = P_T^{(i)}` (the product of
the token ratios; ``min(w_i, C)`` with ``ess_scaling.use_clipped``), it computes
(``recipe/fully_async_policy/staleness_utils.py``, ``compute_ess_info``)

.. math::

    \hat\rho_N = \frac{(\sum_i w_i)^2}{N \sum_i w_i^2}

(VCPO adds :math:`10^{-8}` to :math:`\sum w_i^2`, which changes nothing here) and multiplies the
learning rate by :math:`\min(1, \hat\rho_N/\rho_0)^{1/2}` (``scaling_rule="sqrt"``, the default,
:math:`\rho_0` = ``base_ess_ratio`` = 1) or by :math:`\min(1, \hat\rho_N/\rho_0)` (``"linear"``)
(``verl/workers/actor/megatron_actor.py:881-889``). Its baseline per prompt group
(``compute_opob_baseline``, ``scope="group"``) is the weighted mean

.. math::

    b^* = \frac{\sum_i W_i R_i}{\sum_i W_i}, \qquad W_i = \lVert g_i\rVert^2 w_i^2,

the constant that minimises :math:`\sum_i W_i (R_i - b)^2`, the part of the second moment of the
gradient estimate :math:`\frac1N\sum_i w_i (R_i - b) g_i` that the baseline controls.

The theory here:

- as :math:`N \to \infty`, :math:`\hat\rho_N \to \rho(T) = E[P_T]^2 / E[P_T^2]` (Kong's ESS
  fraction, :func:`variance_lab.theory.ess_frac_P`; :math:`(1 + \sigma^2/\mu^2)^{-T}` for i.i.d.
  tokens);
- staleness, in a stated model: a lag of :math:`k` updates multiplies :math:`k` independent copies
  of the sequence weight, so :math:`\rho_k(T) = \rho(T)^k` (for lognormal tokens, :math:`k` times
  the log-ratio variance);
- for finite :math:`N` (the delta method on the ratio of the two means),
  :math:`E[\hat\rho_N] = \rho + b_1/N + O(N^{-2})` with
  :math:`b_1 = 1 - 2 m_1 m_3/m_2^2 + m_1^2 m_4/m_2^3`, :math:`m_j = E[P_T^j]`: the batch
  overstates the ESS, by much more than :math:`1/N` once :math:`m_4` explodes, which is when the
  expansion stops holding (:func:`ess_ratio_bias` says so).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

from variance_lab._validate import check_n, check_seed, check_T
from variance_lab.families import Family
from variance_lab.stats import group_labels, kong_ess, mean_interval

__all__ = [
    "SCALING_RULES",
    "baseline_gain",
    "ess_limit",
    "ess_ratio",
    "ess_ratio_bias",
    "lr_scale",
    "opob_baseline",
    "simulate_ess_ratio",
]

#: VCPO's ``ess_scaling.scaling_rule`` values: the power 1/2 or 1 of the capped ESS ratio.
SCALING_RULES = ("sqrt", "linear")


def ess_ratio(log_w) -> float:
    r"""Return VCPO's :math:`\hat\rho_N = (\sum w)^2 / (N \sum w^2)` of one minibatch's weights.

    Parameters
    ----------
    log_w : array_like
        The sequence weights' logs (:math:`\log P_T` per sequence), finite.

    Returns
    -------
    float
        In :math:`[1/N, 1]`.
    """
    log_w = np.asarray(log_w, dtype=np.float64).ravel()
    if log_w.size == 0 or not np.all(np.isfinite(log_w)):
        raise ValueError(f"log_w must be non-empty and finite, got {log_w.size} values")
    return kong_ess(log_w) / log_w.size


def lr_scale(ess, *, rule: str = "sqrt", base_ess_ratio: float = 1.0):
    r"""Return VCPO's learning-rate factor :math:`\min(1, \hat\rho/\rho_0)^{p}`, :math:`p = 1/2` or 1.

    Parameters
    ----------
    ess : float or array_like
        ESS ratios in :math:`[0, 1]`.
    rule : {"sqrt", "linear"}
    base_ess_ratio : float
        :math:`\rho_0 > 0` (VCPO's default 1: any ESS below 1 slows the step).

    Returns
    -------
    float or ndarray
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"rule must be one of {SCALING_RULES}, got {rule!r}")
    if not (isinstance(base_ess_ratio, int | float) and 0 < base_ess_ratio <= 1):
        raise ValueError(f"base_ess_ratio must be in (0, 1], got {base_ess_ratio!r}")
    x = np.asarray(ess, dtype=np.float64)
    if np.any(~(x >= 0)):
        raise ValueError("ess ratios must be >= 0")
    scale = np.minimum(1.0, x / base_ess_ratio) ** (0.5 if rule == "sqrt" else 1.0)
    return float(scale) if scale.ndim == 0 else scale


def _log_moments(family: Family, T: int, lag: int, orders) -> list:
    r""":math:`\log E[w^j]` of the lagged weight (``lag`` independent copies of :math:`P_T`), in mpmath."""
    with mpmath.workdps(40):
        return [lag * family.cgf_sum_mp(T, j) for j in orders]


def _check(family, T, lag) -> tuple[list[int], int]:
    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    if isinstance(lag, bool) or not isinstance(lag, int | np.integer) or lag < 1:
        raise ValueError(f"lag must be an integer >= 1, got {lag!r}")
    return [int(t) for t in check_T(T, grid=True)], int(lag)


def ess_limit(family: Family, T, *, lag: int = 1) -> np.ndarray:
    r"""Return the large-batch ESS ratio :math:`\rho_k(T) = (E[P_T]^2/E[P_T^2])^k` per T.

    Exact for every family (AR(1), random scale and mixtures included), from the family's
    cumulant function of :math:`\log P_T` in mpmath.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    lag : int
        :math:`k \ge 1` independent updates of staleness (1: one step off-policy, or the
        mismatch of one sampler).

    Returns
    -------
    ndarray of float64, one per T
    """
    grid, lag = _check(family, T, lag)
    out = []
    for t in grid:
        k1, k2 = _log_moments(family, t, lag, (1, 2))
        out.append(float(mpmath.exp(2 * k1 - k2)))
    return np.array(out)


def ess_ratio_bias(family: Family, T, N: int, *, lag: int = 1) -> np.ndarray:
    r"""Return the delta method's :math:`b_1/N`: :math:`E[\hat\rho_N] - \rho \approx b_1/N` per T.

    :math:`b_1 = 1 - 2 m_1 m_3/m_2^2 + m_1^2 m_4/m_2^3` with :math:`m_j = E[w^j]`. The expansion
    holds while :math:`b_1/N` is small against :math:`\rho`; where it is not (heavy tails:
    :math:`m_4` grows like :math:`e^{6Tv}` for lognormal tokens), the batch ESS is biased upward
    by an amount only Monte Carlo gives (:func:`simulate_ess_ratio`).

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    N : int
        Sequences in the minibatch, >= 2.
    lag : int

    Returns
    -------
    ndarray of float64, one per T
    """
    grid, lag = _check(family, T, lag)
    n = _count(N, "N")
    out = []
    for t in grid:
        k1, k2, k3, k4 = _log_moments(family, t, lag, (1, 2, 3, 4))
        b1 = 1 - 2 * mpmath.exp(k1 + k3 - 2 * k2) + mpmath.exp(2 * k1 + k4 - 3 * k2)
        out.append(float(b1 / n))
    return np.array(out)


def simulate_ess_ratio(
    family: Family, T, N: int, batches: int, *, lag: int = 1, seed: int = 0, level: float = 0.95
) -> dict[str, np.ndarray]:
    r"""Draw ``batches`` minibatches of ``N`` sequence weights and return :math:`\hat\rho_N`'s mean.

    Each lagged weight is the product of ``lag`` independent draws of :math:`P_T` (the staleness
    model of :func:`ess_limit`); the draws are the engine's (:func:`variance_lab.simulate.draw_log_p`,
    with the sampler ``"auto"`` resolves to for the family: exact aggregate draws of the sum where the
    family has them), one stream per call from ``seed``.

    Returns
    -------
    dict of str to ndarray, one value per T
        ``mean``, ``lo``, ``hi`` (the normal interval at ``level``), ``se``, and ``values`` of
        shape ``(batches, nT)``.
    """
    from variance_lab.simulate import draw_log_p, resolve_sampler

    grid, lag = _check(family, T, lag)
    n, b = _count(N, "N"), _count(batches, "batches")
    rng = np.random.default_rng(check_seed(seed))
    code, params = family.sampler_params()
    sampler = resolve_sampler("auto", code, family.name)
    log_w = sum(draw_log_p(code, params, grid, rng, n * b, sampler=sampler) for _ in range(lag))
    values = np.stack([[ess_ratio(col) for col in chunk.T] for chunk in log_w.reshape(b, n, len(grid))])
    mean, var = values.mean(axis=0), values.var(axis=0, ddof=1)
    lo, hi, se = mean_interval(mean, var, b, level)
    return {"mean": mean, "lo": lo, "hi": hi, "se": se, "values": values}


def _count(value, name: str) -> int:
    try:
        return check_n(value, minimum=2)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 2, got {value!r}") from None


def _log_weights(log_w, grad_sq, n: int) -> np.ndarray:
    log_w = np.asarray(log_w, dtype=np.float64)
    g = np.ones(n) if grad_sq is None else np.asarray(grad_sq, dtype=np.float64)
    if log_w.shape != (n,) or g.shape != (n,):
        raise ValueError(
            f"log_w and grad_sq must have one value per reward ({n}), got {log_w.shape}, {g.shape}"
        )
    if not np.all(np.isfinite(log_w)) or not np.all(g > 0):
        raise ValueError("log_w must be finite and grad_sq > 0")
    lw = 2.0 * log_w + np.log(g)
    return np.exp(lw - lw.max())  # W_i = ||g_i||^2 w_i^2, one common scale (it cancels)


def opob_baseline(rewards, log_w, groups, *, grad_sq=None) -> np.ndarray:
    r"""Return VCPO's baseline per sequence: its group's :math:`\sum W R / \sum W`.

    :math:`W = \lVert g\rVert^2 w^2` (``compute_opob_baseline`` with ``scope="group"``).

    Parameters
    ----------
    rewards : array_like, shape (n,)
    log_w : array_like, shape (n,)
        Each sequence's :math:`\log P_T`.
    groups : array_like, shape (n,)
        The prompt of each sequence.
    grad_sq : array_like, shape (n,), optional
        :math:`\lVert g_i\rVert^2` (default 1: the data rarely carry gradient norms; VCPO computes
        them per sequence).

    Returns
    -------
    ndarray, shape (n,)
    """
    r = np.asarray(rewards, dtype=np.float64)
    W = _log_weights(log_w, grad_sq, r.size)
    index, k = group_labels(groups, r.size)
    num, den = np.bincount(index, W * r, k), np.bincount(index, W, k)
    return (num / den)[index]


def baseline_gain(rewards, log_w, groups, *, grad_sq=None) -> float:
    r"""Return the gain of VCPO's baseline over the group mean of the rewards.

    .. math::

        \frac{\sum_i W_i (R_i - \bar R_{g(i)})^2}{\sum_i W_i (R_i - b^*_{g(i)})^2},

    the ratio of the baseline-dependent part of the gradient estimate's second moment with the
    group mean of the rewards (GRPO's baseline) to that with :math:`b^*` (:func:`opob_baseline`);
    >= 1 by construction, 1 when the weights :math:`W` are equal within each group. NaN when
    every group's rewards are equal (no baseline matters).
    """
    r = np.asarray(rewards, dtype=np.float64)
    W = _log_weights(log_w, grad_sq, r.size)
    index, k = group_labels(groups, r.size)
    mean = (np.bincount(index, r, k) / np.bincount(index, minlength=k))[index]
    best = opob_baseline(r, log_w, groups, grad_sq=grad_sq)
    den = float(np.sum(W * (r - best) ** 2))
    return float(np.sum(W * (r - mean) ** 2)) / den if den > 0 else math.nan
