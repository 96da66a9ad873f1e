r"""Monte Carlo estimates with intervals and verdicts: accumulators + theory + stats -> tidy rows.

For every T of an accumulator this module reports, in the tidy schema of
:mod:`variance_lab.schema` (method ``"monte_carlo"``):

================================  ================================================================
statistic                         estimate, interval, standard error
================================  ================================================================
``mean_P``, ``mean_G``            sample mean; normal interval :math:`\bar x \pm z\sqrt{s^2/n}`
``var_P``, ``var_G``              unbiased sample variance :math:`s^2`; log-scale interval
                                  :math:`s^2 e^{\pm z\rho}`,
                                  :math:`\rho = \sqrt{(\hat\kappa - (n-3)/(n-1))/n}`
                                  with the sample kurtosis :math:`\hat\kappa = m_4/m_2^2`
                                  (:func:`variance_lab.stats.var_interval`); se :math:`s^2\rho`
``mean_logP``, ``var_logP``       the same for :math:`\log P_T`
``ess_frac_P``                    Kong's ESS of the weights :math:`P_T` over n,
                                  :math:`(\sum w)^2 / (n\sum w^2)`, from the log-space sums
``max_weight_share_P``            :math:`\max_i w_i / \sum_i w_i`
``khat_P``                        Pareto :math:`\hat k` of the weights (generalised Pareto fit
                                  to the tail sample, :func:`variance_lab.stats.pareto_khat`)
``rel_se_var_P``, ``rel_se_var_G``  theory's predicted relative standard error of the sample
                                  variance with these n draws (from the exact kurtosis)
================================  ================================================================

**Verdicts.** Moment-based intervals are only as good as the sample kurtosis, which
heavy tails make far too small; so every estimate also gets a verdict from theory
(and, for the weights, from :math:`\hat k`). An estimate is marked unreliable, and
still shown, with the reason, when

* ``var_P`` / ``var_G``: theory's draws needed for a relative error of ``target``
  (:func:`variance_lab.theory.n_needed_P` / ``_G``) exceed n;
* ``mean_P`` / ``mean_G``: theory's relative standard error of the mean,
  :math:`\sqrt{\operatorname{Var}(X)/(n E[X]^2)}`, exceeds ``target``;
* anything about the weights :math:`P_T` (``mean_P``, ``var_P``, ``ess_frac_P``,
  ``max_weight_share_P``, ``khat_P``): :math:`\hat k > 0.7`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from variance_lab import stats, theory
from variance_lab.families import Family
from variance_lab.schema import TIDY_COLUMNS
from variance_lab.simulate.accumulators import LOG_P, Accumulator, G, P

__all__ = ["STATISTICS", "estimate"]

#: Statistics reported per T, in row order.
STATISTICS = (
    "mean_P",
    "var_P",
    "mean_G",
    "var_G",
    "mean_logP",
    "var_logP",
    "ess_frac_P",
    "max_weight_share_P",
    "khat_P",
    "rel_se_var_P",
    "rel_se_var_G",
)

_LN10 = math.log(10.0)


def _log10_scaled(x, log_scale):
    r""":math:`\log_{10}|x e^{h}|`, exact whatever the size of :math:`h`."""
    with np.errstate(divide="ignore"):
        return (np.log(np.abs(x)) + log_scale) / _LN10


def _scaled(x, log_scale):
    r""":math:`x e^{h}` in float64 (``inf`` or ``0.0`` beyond its range)."""
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        return np.sign(x) * np.exp(np.log(np.abs(x)) + log_scale)


def _row(stat, value, log10_value, lo=np.nan, hi=np.nan, se=np.nan):
    return {
        "statistic": stat,
        "value": value,
        "log10_value": log10_value,
        "lo": lo,
        "hi": hi,
        "se": se,
    }


def _exp_part(acc: Accumulator, q: int, name: str, ci: float) -> list[dict]:
    """Return the mean and var rows (arrays over T) of P_T (q = P) or G_T (q = G), in log space."""
    n = acc.count
    h = acc.shift[q]
    c = acc.centre()[q]
    d, m2, _, m4 = stats.central_moments(acc.sums[q], n)
    mean = c + d  # in units of e^h
    var = m2 * n / (n - 1.0)  # in units of e^(2h)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = np.where(m2 > 0, m4 / (m2 * m2), np.nan)
    mlo, mhi, mse = stats.mean_interval(mean, var, n, ci)
    vlo, vhi, vse = stats.var_interval(var, kurt, n, ci)
    return [
        _row(
            f"mean_{name}",
            _scaled(mean, h),
            _log10_scaled(mean, h),
            _scaled(mlo, h),
            _scaled(mhi, h),
            _scaled(mse, h),
        ),
        _row(
            f"var_{name}",
            _scaled(var, 2 * h),
            _log10_scaled(var, 2 * h),
            _scaled(vlo, 2 * h),
            _scaled(vhi, 2 * h),
            _scaled(vse, 2 * h),
        ),
    ]


def _log_part(acc: Accumulator, ci: float) -> list[dict]:
    n = acc.count
    d, m2, _, m4 = stats.central_moments(acc.sums[LOG_P], n)
    mean = acc.spec.ref_logP + d
    var = m2 * n / (n - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = np.where(m2 > 0, m4 / (m2 * m2), np.nan)
        mlo, mhi, mse = stats.mean_interval(mean, var, n, ci)
        vlo, vhi, vse = stats.var_interval(var, kurt, n, ci)
        return [
            _row("mean_logP", mean, np.log10(np.abs(mean)), mlo, mhi, mse),
            _row("var_logP", var, np.log10(var), vlo, vhi, vse),
        ]


def _weights_part(acc: Accumulator) -> list[dict]:
    """ESS fraction, largest weight share and Pareto k-hat of the weights P_T."""
    n = acc.count
    c = acc.centre()[P]
    d, m2, _, _ = stats.central_moments(acc.sums[P], n)
    mean = c + d
    ess = stats.ess_fraction(mean, m2 + mean * mean)
    with np.errstate(divide="ignore", over="ignore"):
        share = np.exp(acc.tail[:, 0] - acc.shift[P]) / (n * mean)
        khat = np.array([stats.pareto_khat(row) for row in acc.tail])
        return [
            _row("ess_frac_P", ess, np.log10(ess)),
            _row("max_weight_share_P", share, np.log10(share)),
            _row("khat_P", khat, np.log10(np.abs(khat))),
        ]


def _theory_part(acc: Accumulator, family: Family) -> list[dict]:
    T, n = acc.T, acc.count
    rows = []
    for stat in ("rel_se_var_P", "rel_se_var_G"):
        lin = np.atleast_1d(theory.value(stat, family, T, n=n))
        lg = np.atleast_1d(theory.value(stat, family, T, n=n, log10=True))
        rows.append(_row(stat, lin, lg))
    return rows


def _log10_rel_se_mean(family: Family, T: np.ndarray, n: int, which: str) -> np.ndarray:
    r"""log10 of theory's relative standard error of the mean of ``n`` draws of P_T or G_T."""
    if which == "P":  # Var/E^2 = 1/ess - 1 = -expm1(log ess) / ess
        l_ess = np.atleast_1d(theory.value("ess_frac_P", family, T, log10=True)) * _LN10
        with np.errstate(divide="ignore"):
            log_rel_var = np.log(-np.expm1(l_ess)) - l_ess
    else:
        lv = np.atleast_1d(theory.value("var_G", family, T, log10=True)) * _LN10
        lm = np.atleast_1d(theory.value("mean_G", family, T, log10=True)) * _LN10
        log_rel_var = lv - 2 * lm
    return (0.5 * (log_rel_var - math.log(n))) / _LN10


def _verdicts(acc: Accumulator, family: Family, khat: np.ndarray, target: float) -> dict[str, list[str]]:
    """Reasons (per T; '' when reliable) for every statistic that can be flagged."""
    T, n = acc.T, acc.count
    nT = T.size
    reasons: dict[str, list[list[str]]] = {s: [[] for _ in range(nT)] for s in STATISTICS}
    for x in ("P", "G"):
        need = np.atleast_1d(theory.value(f"n_needed_{x}", family, T, target=target))
        lneed = np.atleast_1d(theory.value(f"n_needed_{x}", family, T, target=target, log10=True))
        lrse = _log10_rel_se_mean(family, T, n, x)
        for j in range(nT):
            if need[j] > n:
                reasons[f"var_{x}"][j].append(
                    f"theory needs ~1e{lneed[j]:.1f} draws for a {target:.0%} relative error of "
                    f"Var({x}_T), more than the n = {n} used: the sample variance cannot confirm "
                    "the closed form with that many draws"
                )
            if lrse[j] > math.log10(target):
                reasons[f"mean_{x}"][j].append(
                    f"theory's relative standard error of the mean is ~1e{lrse[j]:.1f} > {target:g}"
                )
    for j in range(nT):
        if khat[j] > stats.KHAT_THRESHOLD:
            for s in ("mean_P", "var_P", "ess_frac_P", "max_weight_share_P", "khat_P"):
                reasons[s][j].append(
                    f"Pareto k-hat {khat[j]:.2f} > {stats.KHAT_THRESHOLD}: weights P_T too heavy-tailed"
                )
    return {s: ["; ".join(r) for r in per_T] for s, per_T in reasons.items()}


def estimate(
    acc: Accumulator, family: Family, *, ci: float = 0.95, target: float = theory.DEFAULT_TARGET
) -> pd.DataFrame:
    """Tidy Monte Carlo rows from merged accumulators (see the module docstring).

    Parameters
    ----------
    acc : Accumulator
        Merged accumulators of the run, ``acc.count >= 2``.
    family : Family
        The family simulated (for theory's predictions and verdicts).
    ci : float
        Confidence level of the intervals.
    target : float
        Relative error the verdicts ask for (theory's default 0.1).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.schema.TIDY_COLUMNS`, one row per (T, statistic),
        ordered by T then :data:`STATISTICS`.

    Raises
    ------
    ValueError
        Fewer than 2 paths, a bad ``ci``, or a tail sample that is not the exact largest
        values of all paths (:meth:`~variance_lab.simulate.accumulators.Accumulator.tail_complete`).
    """
    if acc.count < 2:
        raise ValueError(f"estimates need at least 2 paths, got {acc.count!r}")
    stats.z_value(ci)
    incomplete = ~acc.tail_complete()
    if incomplete.any():  # a < 1e-30 event per chunk and T for i.i.d. paths: never papered over
        raise ValueError(
            f"the tail sample of log P_T is incomplete at T = {acc.T[incomplete].tolist()}: a chunk kept "
            "fewer of its largest values than the merged tail needs (plan.chunk_tail_keep); "
            "rerun with another chunk_size"
        )
    rows = _exp_part(acc, P, "P", ci) + _exp_part(acc, G, "G", ci) + _log_part(acc, ci)
    rows += _weights_part(acc) + _theory_part(acc, family)
    khat = next(r["value"] for r in rows if r["statistic"] == "khat_P")
    reasons = _verdicts(acc, family, khat, target)
    assert [r["statistic"] for r in rows] == list(STATISTICS)
    T, nT, nS = acc.T, acc.T.size, len(STATISTICS)

    def column(key):  # (statistic, T) -> T-major flat column
        return np.stack([np.broadcast_to(np.asarray(r[key], dtype=float), (nT,)) for r in rows]).T.ravel()

    reason = np.array([reasons[s] for s in STATISTICS], dtype=object).T.ravel()
    return pd.DataFrame(
        {
            "family": family.name,
            "mu": family.mu,
            "sigma2": family.sigma2,
            "T": np.repeat(T, nS),
            "statistic": np.tile(np.array(STATISTICS, dtype=object), nT),
            "method": "monte_carlo",
            **{k: column(k) for k in ("value", "log10_value", "lo", "hi", "se")},
            "reliable": reason == "",
            "reason": reason,
        },
        columns=list(TIDY_COLUMNS),
    )
