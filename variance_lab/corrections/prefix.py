r"""Cumulative prefix ratios (CTPO): clipped fractions by position, moments, and the variance comparison.

CTPO (Zhang et al. 2026, arXiv 2605.07331) weights token :math:`t` of a sequence by the prefix
product :math:`P_t = \prod_{s \le t} r_s`, with log-space bounds that grow like :math:`\sqrt t`.
The spec ``ctpo:EL:EH`` masks token :math:`t` (weight 0, counted as modified) when
:math:`L_t = \log P_t = \sum_{s \le t} \log r_s` lies outside
:math:`[-E_L\sqrt t, E_H\sqrt t]`, and gives it the weight :math:`P_t` otherwise.

For i.i.d. log-ratios :math:`N(m, v)` (the lognormal family), :math:`L_t \sim N(tm, tv)`, so
with :math:`\sigma = \sqrt v` the probability that token :math:`t` is clipped is

.. math::

    p_t = \Phi\Bigl(\frac{-E_L - \sqrt t\,m}{\sigma}\Bigr)
        + \Phi\Bigl(\frac{-E_H + \sqrt t\,m}{\sigma}\Bigr),

which does not depend on :math:`t` when :math:`m = 0`: the bounds grow exactly as the spread of
:math:`L_t`. With a drift it tends to 1; on-policy (:math:`\mu = 1`, :math:`m = -v/2`) the
lower bound binds (:math:`p_t \ge 1/2`) from :math:`t \approx (E_L/|m|)^2 = 4E_L^2/v^2` on, where
:math:`\sqrt t\,|m| = E_L`.
Over a sequence of length :math:`T` the fraction of tokens clipped is
:math:`\frac1T\sum_{t \le T} p_t`, and the moments of the weights are the truncated-lognormal
ones of each position (:mod:`variance_lab.corrections.gauss`), averaged:
:math:`E[w^j] = \frac1T\sum_t E[P_t^j 1\{L_t \in B_t\}]`.

The variance of a per-sequence mean :math:`\hat W = \frac1T\sum_t w_t` under token weights
(:math:`w_t = r_t`), prefix weights (:math:`w_t = P_t`, unclipped) and sequence weights
(:math:`w_t = P_T`) follows from :math:`E[P_t] = \mu^t` and, for :math:`s \le t`,
:math:`E[P_s P_t] = E[P_s^2]\,\mu^{t-s}` (the tokens after :math:`s` are independent of
:math:`P_s` given the sequence's law):

.. math::

    \operatorname{Cov}(P_s, P_t) = \mu^{s+t}\bigl(e^{c(s)} - 1\bigr), \qquad
    c(s) = \log\frac{E[P_s^2]}{E[P_s]^2},

with :math:`c(s) = s(K(2) - 2K(1))` for i.i.d. ratios and :math:`-\alpha\log(1 - \theta s)` for
random-scale ones. So :math:`\operatorname{Var}(\hat W_{prefix}) = T^{-2}\sum_{s,t}
\operatorname{Cov}(P_s, P_t)`, which lies below :math:`\operatorname{Var}(P_T)` because every
:math:`\operatorname{Cov}(P_s, P_t) \le \operatorname{Var}(P_T)` (:func:`prefix_variances`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special

from variance_lab._validate import check_T
from variance_lab.corrections.gauss import log_frac_out_array, log_moment_array
from variance_lab.corrections.specs import Correction, parse
from variance_lab.families import AR1, Family, LogNormal, RandomScale
from variance_lab.stats.special import LN10, log_expm1

__all__ = [
    "POSITION_COLUMNS",
    "PREFIX_VARIANCE_COLUMNS",
    "clip_probability",
    "ctpo_log_moments",
    "ctpo_positions",
    "prefix_variances",
]

#: Positions evaluated at once (the quadrature of a narrow interval holds 32 values per position).
_BLOCK = 1 << 15

#: Columns of :func:`ctpo_positions`.
POSITION_COLUMNS = (
    "t",
    "correction",
    "frac_low",
    "frac_high",
    "frac_clipped",
    "mean_w",
    "var_w",
    "mean_prefix",
)

#: Columns of :func:`prefix_variances`.
PREFIX_VARIANCE_COLUMNS = (
    "T",
    "var_token",
    "var_prefix",
    "var_sequence",
    "log10_var_token",
    "log10_var_prefix",
    "log10_var_sequence",
)


def _check_ctpo(correction) -> Correction:
    c = correction if isinstance(correction, Correction) else parse(correction)
    if c.kind != "ctpo":
        raise ValueError(f"expected a ctpo correction, got {c.spec!r}")
    return c


def _position_logs(c: Correction, m: float, v: float, t: np.ndarray) -> tuple[np.ndarray, ...]:
    r"""Per position: log E[w_t], log E[w_t^2], log P(L_t below its band), log P(L_t above it)."""
    t = np.asarray(t, dtype=float)
    el, eh = c.params
    root = np.sqrt(t)
    a, b = -el * root, eh * root
    M, S = t * m, np.sqrt(t * v)
    pieces = [(a, b, 0.0, 1.0)]
    l1 = log_moment_array(pieces, M, S, 1.0)
    l2 = log_moment_array(pieces, M, S, 2.0)
    pos = S > 0
    Ss = np.where(pos, S, 1.0)
    low = np.where(pos, special.log_ndtr((a - M) / Ss), np.where(a > M, 0.0, -math.inf))
    high = np.where(pos, special.log_ndtr(-(b - M) / Ss), np.where(b < M, 0.0, -math.inf))
    return l1, l2, low, high


def clip_probability(c: Correction, m: float, v: float, t) -> np.ndarray:
    r"""Return :math:`p_t`, the probability that token ``t`` is clipped, for i.i.d. N(m, v) log-ratios.

    ``t`` may be real (:func:`~variance_lab.corrections.find_T` searches over it).

    Returns an array of the shape of ``t``.
    """
    c = _check_ctpo(c)
    t = np.asarray(t, dtype=float)
    root = np.sqrt(t)
    return np.exp(log_frac_out_array(-c.params[0] * root, c.params[1] * root, t * m, np.sqrt(t * v)))


def ctpo_log_moments(c: Correction, m: float, v: float, T: int) -> tuple[float, float, float, float]:
    r"""(log E[w], log E[w^2], log frac_modified, log E[b]) per token over positions 1..T.

    For i.i.d. :math:`N(m, v)` log-ratios: each is the average over :math:`t \le T` of the
    position's closed form (module docstring), summed in log space block by block; the base
    weight :math:`b` is the unclipped prefix product, :math:`E[P_t] = e^{t(m + v/2)}`.
    """
    c = _check_ctpo(c)
    T = int(T)
    acc = np.full(4, -math.inf)
    for start in range(1, T + 1, _BLOCK):
        t = np.arange(start, min(start + _BLOCK, T + 1), dtype=float)
        l1, l2, low, high = _position_logs(c, m, v, t)
        lf = np.logaddexp(low, high)
        lb = t * (m + v / 2)
        blocks = [special.logsumexp(x) if np.isfinite(x).any() else -math.inf for x in (l1, l2, lf, lb)]
        acc = np.logaddexp(acc, np.array(blocks))
    return tuple(float(x) - math.log(T) for x in acc)


def ctpo_positions(family: Family, correction, T: int) -> pd.DataFrame:
    r"""Return CTPO's clipped fraction and its weights' moments at each position ``t = 1..T`` (lognormal).

    Parameters
    ----------
    family : LogNormal
        The closed forms need :math:`L_t \sim N(tm, tv)`; for other families use
        :func:`variance_lab.corrections.simulate_positions` (Monte Carlo).
    correction : str or Correction
        A ``ctpo`` spec.
    T : int
        The last position, >= 1.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`POSITION_COLUMNS`: ``frac_low`` :math:`P(L_t < -E_L\sqrt t)`,
        ``frac_high`` :math:`P(L_t > E_H\sqrt t)`, ``frac_clipped`` their sum :math:`p_t`,
        ``mean_w`` :math:`E[w_t]`, ``var_w`` :math:`\operatorname{Var}(w_t)`, ``mean_prefix``
        :math:`E[P_t]`.
    """
    c = _check_ctpo(correction)
    if type(family) is not LogNormal:
        name = getattr(family, "name", repr(family))
        raise ValueError(
            f"ctpo's positions have a closed form for the lognormal family only, not {name!r}; "
            "use simulate_positions (Monte Carlo)"
        )
    if isinstance(T, bool) or int(T) != T or T < 1:
        raise ValueError(f"T must be an integer >= 1, got {T!r}")
    m, v = family.mean_log, family.var_log
    t = np.arange(1, int(T) + 1, dtype=float)
    l1, l2, low, high = _position_logs(c, m, v, t)
    with np.errstate(over="ignore"):
        mean_w, second = np.exp(l1), np.exp(l2)
        var_w = np.where(np.isfinite(l1), second * -np.expm1(np.minimum(2 * l1 - l2, 0.0)), 0.0)
        mean_prefix = np.exp(t * (m + v / 2))
    return pd.DataFrame(
        {
            "t": t.astype(np.int64),
            "correction": c.spec,
            "frac_low": np.exp(low),
            "frac_high": np.exp(high),
            "frac_clipped": np.exp(np.logaddexp(low, high)),
            "mean_w": mean_w,
            "var_w": var_w,
            "mean_prefix": mean_prefix,
        },
        columns=list(POSITION_COLUMNS),
    )


def _log_chi(family: Family, s: np.ndarray) -> np.ndarray:
    r""":math:`c(s) = \log E[P_s^2] - 2\log E[P_s]` (``inf`` where :math:`E[P_s^2]` is infinite)."""
    if isinstance(family, AR1):
        raise ValueError(
            "prefix_variances needs ratios that are i.i.d. given the sequence's law; ar1 tokens are "
            "correlated: use simulate_corrections (Monte Carlo)"
        )
    if family.degenerate:
        return np.zeros_like(s)
    if isinstance(family, RandomScale):
        z = family.theta * s
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(z < 1, -family.alpha * np.log1p(-np.minimum(z, 1.0)), math.inf)
    return s * (float(family.K(2.0)) - 2.0 * float(family.K(1.0)))


def _log_geometric(k1: float, n: np.ndarray) -> np.ndarray:
    r""":math:`\log\sum_{k=0}^{n} e^{k k_1}`, elementwise in ``n``."""
    n1 = n + 1.0
    if k1 == 0.0:
        return np.log(n1)
    if k1 > 0:
        return log_expm1(n1 * k1) - math.log(math.expm1(k1))
    return np.log(-np.expm1(n1 * k1)) - math.log(-math.expm1(k1))


def prefix_variances(family: Family, T) -> pd.DataFrame:
    r"""Return the variance of the mean weight :math:`\frac1T\sum_t w_t` for token, prefix, sequence weights.

    ``var_token`` :math:`= \operatorname{Var}(r)/T` (tokens uncorrelated: :math:`E[r \mid
    \cdot] = \mu`), ``var_prefix`` :math:`= T^{-2}\sum_{s,t}\operatorname{Cov}(P_s, P_t)` and
    ``var_sequence`` :math:`= \operatorname{Var}(P_T)`, exactly (module docstring), in log
    space: the ``log10_*`` columns stay finite where the linear ones overflow.

    Parameters
    ----------
    family : Family
        Any family whose ratios are i.i.d. (lognormal, gamma, two-point, lognormal-mixture) or
        i.i.d. given the sequence (random-scale); ``ar1`` raises ``ValueError``.
    T : int or array_like of int

    Returns
    -------
    pandas.DataFrame
        Columns :data:`PREFIX_VARIANCE_COLUMNS`.
    """
    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    grid = [int(t) for t in check_T(T, grid=True)]
    k1 = math.log(family.mu)
    rows = []
    for n in grid:
        s = np.arange(1, n + 1, dtype=float)
        chi = _log_chi(family, s)
        with np.errstate(invalid="ignore"):
            log_var = 2 * s * k1 + log_expm1(chi)  # log Var(P_s)
        if family.degenerate:
            rows.append((n, -math.inf, -math.inf, -math.inf))
            continue
        log_row = log_var + _log_geometric(k1, n - s)  # log sum_{t >= s} Cov(P_s, P_t)
        a, b = special.logsumexp(log_row), special.logsumexp(log_var)
        log_prefix = a + math.log(2.0 - math.exp(b - a)) - 2 * math.log(n) if math.isfinite(a) else math.inf
        log_token = float(log_var[0]) - math.log(n)
        rows.append((n, log_token, float(log_prefix), float(log_var[-1])))
    out = pd.DataFrame(rows, columns=["T", "lt", "lp", "ls"])
    with np.errstate(over="ignore"):
        for name, col in (("token", "lt"), ("prefix", "lp"), ("sequence", "ls")):
            out[f"var_{name}"] = np.exp(out[col].to_numpy(float))
            out[f"log10_var_{name}"] = out[col] / LN10
    return out[list(PREFIX_VARIANCE_COLUMNS)]
