r"""The bounds of "When Speed Kills Stability" beside the exact values of the toolkit's ratio models.

Liu, Li et al. (2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch", part 2, read from its source
``szrlee/szrlee.github.io/content/post/rl-collapse-part2/index.md`` at ``9a0a58c``) bound the two
failure modes of an off-policy gradient estimator that samples from :math:`\mu` and optimises
:math:`\pi`:

- **token-level IS is biased**: its expectation is taken over the sampler's prefixes, so
  (section "Analysis 2", derivation "The :math:`O(T^2\Delta_{\max})` bias")
  :math:`\lVert\mathrm{Bias}\rVert \le 2\,\sup_y\lVert f(y)\rVert\,D_{TV}(\mu\Vert\pi)`,
  :math:`\sup\lVert f\rVert \le T` (per-token score and reward bounded by 1) and
  :math:`D_{TV}(\mu\Vert\pi) \le T\Delta_{\max}` (the simulation lemma), so
  :math:`\lVert\mathrm{Bias}\rVert \le 2T^2\Delta_{\max}` with
  :math:`\Delta_{\max} = \max_{t, s_t} D_{TV}(\pi(\cdot|s_t)\Vert\mu(\cdot|s_t))`;
- **sequence-level IS has exploding variance** (section "Analysis 1"):
  :math:`E_\mu[\rho^2] \le (1 + \bar\chi^2_{\max})^T` with
  :math:`\bar\chi^2_{\max} = \max_{t, s_t}\chi^2(\pi(\cdot|s_t)\Vert\mu(\cdot|s_t))`, so for the
  estimator :math:`\rho\,f` with :math:`f \equiv T` (every token's term 1) the variance is at
  most :math:`T^2((1 + \bar\chi^2_{\max})^T - 1)`.

Those are the constants used here: the source writes them out (2, the :math:`T` of
:math:`\sup\lVert f\rVert` and the :math:`T` of the simulation lemma; the variance's second
moment with constant 1), with the per-token score and reward bounds set to 1.

**The exact values**, for the toolkit's mean-one ratio models read as states: each token's state
:math:`s` fixes the law of its ratio :math:`r = \pi/\mu` given the state, and :math:`E[r|s] = 1`
(both policies normalised). A ``lognormal`` family with :math:`\mu = 1` has one state,
:math:`\log r \sim N(-v/2, v)`; a ``lognormal-mixture`` with mean-one components
(:math:`m_j = -v_j/2`) has one state per component, drawn with probability :math:`w_j` at every
position. Then :math:`D_{TV}` of a state is :math:`\frac12E|r - 1| = \operatorname{erf}(\sqrt{v}/(2\sqrt2))`,
its :math:`\chi^2 = e^{v} - 1`, and the prefix ratio :math:`P_k = \prod_{t \le k} r_t` is the
likelihood ratio of the first :math:`k` tokens:

- the largest bias of the token-level estimator of :math:`\sum_t E_\pi[g_t]` over per-token
  terms :math:`|g_t| \le 1` is exactly
  :math:`B_T = \sum_{k=0}^{T-1} E_\mu|P_k - 1| = 2\sum_{k<T} D_{TV}(\text{prefixes of } k \text{ tokens})`
  (the term of token :math:`t` is :math:`E_\mu[(1 - P_{t-1})\,G_t]` with
  :math:`G_t = E_\pi[g_t | s_t]`, largest for :math:`G_t = \operatorname{sign}(1 - P_{t-1})`),
  with :math:`E|P_k - 1| = 2\operatorname{erf}(\sqrt{kv}/(2\sqrt2))` for one state and its
  average over the binomial law of the component counts for two;
- the sequence-level estimator's variance for :math:`g \equiv 1` is exactly
  :math:`T^2\operatorname{Var}(P_T)`, :math:`\operatorname{Var}(P_T) = E[r^2]^T - 1`
  (:func:`variance_lab.theory.var_P`): equal to the bound for one state (the bound is tight),
  below it by :math:`((1 + \chi^2_{\max})/(1 + \bar\chi^2))^T` when the states differ.

:func:`bounds_frame` tabulates both against T, :func:`crossover` the length from which the
sequence-level estimator's standard error over :math:`n` sequences,
:math:`T\sqrt{\operatorname{Var}(P_T)/n}`, stays above the token-level estimator's largest bias
:math:`B_T` (exact, and as the two bounds say).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special, stats

from variance_lab._validate import check_T
from variance_lab.families import Family, LogNormal, LognormalMixture
from variance_lab.theory.quantities import var_P

__all__ = [
    "BOUNDS_COLUMNS",
    "BOUND_SOURCE",
    "MAX_T_MIXTURE",
    "bounds_frame",
    "crossover",
    "prefix_abs_dev",
    "seq_var_bound",
    "states",
    "token_bias",
    "token_bias_bound",
]

#: Where the bounds and their constants are read from (file and commit of the blog's source).
BOUND_SOURCE = "szrlee/szrlee.github.io content/post/rl-collapse-part2/index.md at 9a0a58c"
#: Largest T of a two-state mixture's exact bias (its cost grows like T^2: a binomial law per prefix).
MAX_T_MIXTURE = 20_000
#: Columns of :func:`bounds_frame`.
BOUNDS_COLUMNS = (
    "T",
    "token_bias",
    "token_bias_bound",
    "var_P",
    "var_P_bound",
    "log10_var_P",
    "log10_var_P_bound",
)

_SQRT8 = math.sqrt(8.0)


def states(family: Family) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the states' probabilities :math:`w_j` and log-ratio variances :math:`v_j` of a mean-one family.

    Raises
    ------
    ValueError
        For a family other than ``lognormal`` with :math:`\mu = 1` or a ``lognormal-mixture`` of
        at most two mean-one components (:math:`m_j = -v_j/2`): the bounds need
        :math:`E[r | s] = 1` in every state.
    """
    if type(family) is LogNormal:
        if family.mu != 1.0:
            raise ValueError(
                "the bounds need mean-one ratios (E[r | s] = 1: both policies normalised), "
                f"got mu = {family.mu!r}"
            )
        return np.ones(1), np.array([float(family.var_log)])
    if type(family) is LognormalMixture:
        w, m, v = (np.array(x, dtype=float) for x in zip(*family.components, strict=True))
        bad = np.abs(m + v / 2) > 1e-12 * np.maximum(1.0, v)
        if bad.any() or w.size > 2:
            raise ValueError(
                "the bounds need a lognormal-mixture of at most two mean-one components (m_j = -v_j/2), got "
                f"{family.components!r}"
            )
        return w, v
    raise ValueError(
        "the bounds' exact values cover the mean-one lognormal and lognormal-mixture families, "
        f"not {family.name!r}"
    )


def _check_T(T) -> np.ndarray:
    return np.atleast_1d(check_T(T)).ravel()


def prefix_abs_dev(family: Family, k) -> np.ndarray:
    r"""Return :math:`E|P_k - 1|` (twice the total variation between the prefix laws of :math:`k` tokens).

    One state: :math:`2\operatorname{erf}(\sqrt{kv}/(2\sqrt2))`; two states: that averaged over
    the binomial law of the number of tokens in the first state. :math:`k = 0` gives 0.
    """
    w, v = states(family)
    k = np.atleast_1d(np.asarray(k, dtype=np.int64))
    if np.any(k < 0):
        raise ValueError(f"k must be integers >= 0, got {k!r}")
    if w.size == 1:
        return 2.0 * special.erf(np.sqrt(k * v[0]) / _SQRT8)
    if k.max() > MAX_T_MIXTURE:
        raise ValueError(f"a two-state mixture's exact values stop at k = {MAX_T_MIXTURE}, got {k.max()}")
    out = np.empty(k.size)
    for i, kk in enumerate(k):
        n = np.arange(kk + 1)
        out[i] = 2.0 * float(
            np.dot(stats.binom.pmf(n, kk, w[0]), special.erf(np.sqrt(n * v[0] + (kk - n) * v[1]) / _SQRT8))
        )
    return out


def token_bias(family: Family, T) -> np.ndarray:
    r"""Return :math:`B_T = \sum_{k=0}^{T-1} E|P_k - 1|`, the largest token-level IS bias.

    Each token's term is bounded by 1 (:math:`|g_t| \le 1`).
    """
    t = _check_T(T)
    cum = np.concatenate([[0.0], np.cumsum(prefix_abs_dev(family, np.arange(int(t.max()))))])
    return cum[t]


def _maxima(family: Family) -> tuple[float, float]:
    """(Delta_max, log1p(chi2_max)) over the states: the largest per-token TV and log(1 + chi^2)."""
    _, v = states(family)
    return float(special.erf(math.sqrt(v.max()) / _SQRT8)), float(v.max())


def token_bias_bound(family: Family, T) -> np.ndarray:
    r"""Return the source's bound :math:`2T^2\Delta_{\max}` of token-level IS's bias (module docstring)."""
    t = _check_T(T).astype(float)
    return 2.0 * t * t * _maxima(family)[0]


def seq_var_bound(family: Family, T, *, log10: bool = False) -> np.ndarray:
    r"""Return the source's bound :math:`(1 + \chi^2_{\max})^T - 1` of :math:`\operatorname{Var}(P_T)`.

    :math:`\log(1 + \chi^2_{\max}) = v_{\max}` for mean-one lognormal states; ``log10=True`` gives
    its base-10 log (finite where the value overflows).
    """
    t = _check_T(T).astype(float)
    x = t * _maxima(family)[1]  # T log(1 + chi2_max)
    if log10:
        return (x + np.log(-np.expm1(-x))) / math.log(10.0)
    with np.errstate(over="ignore"):
        return np.expm1(x)


def bounds_frame(family: Family, T) -> pd.DataFrame:
    """Tabulate token-level IS's bias and sequence-level IS's variance, exact and as bounded, per T.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`BOUNDS_COLUMNS`, one row per T.
    """
    t = _check_T(T)
    return pd.DataFrame(
        {
            "T": t,
            "token_bias": token_bias(family, t),
            "token_bias_bound": token_bias_bound(family, t),
            "var_P": var_P(family, t),
            "var_P_bound": seq_var_bound(family, t),
            "log10_var_P": var_P(family, t, log10=True),
            "log10_var_P_bound": seq_var_bound(family, t, log10=True),
        },
        columns=list(BOUNDS_COLUMNS),
    )


def crossover(family: Family, n, *, T_max: int = 20_000) -> dict[str, np.ndarray]:
    r"""Return, per batch size :math:`n`, the length from which sequence-level IS's noise exceeds the bias.

    The first :math:`T \le` ``T_max`` from which on :math:`T\sqrt{\operatorname{Var}(P_T)/n} > B_T`
    for every larger length up to ``T_max`` (``"exact"``), and the same with both bounds,
    :math:`T\sqrt{((1 + \chi^2_{\max})^T - 1)/n} > 2T^2\Delta_{\max}` (``"bound"``); NaN when the
    noise is still below the bias at ``T_max``. Below it the sequence-level estimator has the
    smaller error over :math:`n` sequences (token-level IS's own variance aside), above it the
    token-level one.

    Returns
    -------
    dict
        ``"n"``, ``"exact"`` and ``"bound"``: arrays, one value per ``n``.
    """
    n = np.atleast_1d(np.asarray(n, dtype=float))
    if np.any(~(n >= 1)):
        raise ValueError(f"n must be >= 1, got {n!r}")
    t = np.arange(1, int(T_max) + 1)
    # compared in log space: log T + (log Var(P_T) - log n) / 2 against log B_T
    log_noise = {
        "exact": np.log(t) + 0.5 * var_P(family, t, log10=True) * math.log(10.0),
        "bound": np.log(t) + 0.5 * seq_var_bound(family, t, log10=True) * math.log(10.0),
    }
    with np.errstate(divide="ignore"):
        log_bias = {"exact": np.log(token_bias(family, t)), "bound": np.log(token_bias_bound(family, t))}
    out = {"n": n}
    for key in ("exact", "bound"):
        below = log_noise[key][None, :] - 0.5 * np.log(n)[:, None] <= log_bias[key][None, :]
        last = np.where(below.any(axis=1), t.size - 1 - np.argmax(below[:, ::-1], axis=1), -1)
        out[key] = np.where(below[:, -1], np.nan, t[np.clip(last + 1, 0, t.size - 1)].astype(float))
    return out
