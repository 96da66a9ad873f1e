r"""Which logged numbers to trust: a per-token law from a run's token metrics, its sequence metrics predicted.

A training framework logs, per step, a few token-level averages of the mismatch log-ratio
:math:`y = \log\pi_{train} - \log\pi_{engine}` (verl's ``rollout_corr/k3_kl``, ``chi2_token``
and ``kl``; NeMo-RL's ``token_mult_prob_error`` and ``gen_kl_error``; prime-rl's
``mismatch_kl``; TRL's ``sampling/sampling_logp_difference/mean``; slime's ``tis_abs``;
OpenRLHF's ``vllm_kl``) and a few sequence-level sample estimates (verl's ``chi2_seq`` and,
with ``rollout_is="sequence"``, ``rollout_is_mean``, ``rollout_is_eff_sample_size`` and
``rollout_is_ratio_fraction_high``; NeMo-RL's ``sampling_importance_ratio`` and
``is_oob_ratio`` with sequence-level ratios; TRL's ``sampling/importance_sampling_ratio/mean``
in its default ``sequence_mask`` mode). Token
averages over :math:`10^5` to :math:`10^7` tokens are precise; sequence averages of exponential
moments over a few hundred sequences may not be.

**The per-token law.** :math:`y \sim N(m, s^2)` i.i.d. (the lognormal family). Each token
metric is a known function of :math:`(m, s)` and is solved for :math:`s^2`
(:func:`fit_law`):

=====================  ========================================================================
kind                   value under :math:`N(m, s^2)`
=====================  ========================================================================
``kl``                 :math:`-m` (sets :math:`m`; verl ``kl``, OpenRLHF ``vllm_kl``)
``k3``                 :math:`E[e^y - y - 1] = e^{m + s^2/2} - m - 1`
``chi2``               :math:`E[e^{2y}] - 1 = e^{2m + 2s^2} - 1`
``mult``               :math:`E[e^{|y|}] = e^{m+s^2/2}\Phi(m/s + s) + e^{-m+s^2/2}\Phi(s - m/s)`
``absdiff``            :math:`E|y| = s\sqrt{2/\pi}\,e^{-m^2/2s^2} + m(1 - 2\Phi(-m/s))`
``tis_abs``            :math:`E|e^y - 1| = e^{m+s^2/2} - 1 + 2(\Phi(-m/s) - e^{m+s^2/2}\Phi(-m/s - s))`
=====================  ========================================================================

Without a ``kl`` metric, :math:`m = -s^2/2`: the engine samples the tokens, so
:math:`E[e^y] = 1` exactly for every token (a ``kl`` metric alone gives
:math:`s^2 = 2\,\mathrm{kl}`). The law of the step is the fit of the first
available metric in :data:`LAW_PRIORITY` (``chi2`` first: it is the second moment the sequence
metrics rest on); the fits of the others are reported beside it, and their spread is the first
warning sign: for an i.i.d. lognormal law they agree, for heavy-tailed tokens (rare large
:math:`|y|`) the metrics that weigh the tail (``k3``, ``chi2``) give a larger :math:`s^2` than
those that do not (``mult``, ``absdiff``).

**The sequence metrics.** At length :math:`L`, :math:`\log P_L \sim N(mL, s^2L)`. Each
framework's sequence metric is a batch average of :math:`f(\log P)` (over sequences, or
weighted by length over tokens, as the framework does;
:data:`~variance_lab.frameworks.logfiles.SEQUENCE_METRICS`):
``chi2_seq`` (:math:`f = e^{2\operatorname{clip}(\log P, \pm 20)}`, minus 1), a truncated mean
(:math:`\min(P, C)`, non-finite weights 0 as NeMo-RL), a masked mean (:math:`P\,1\{P \le C\}`,
TRL's ``sequence_mask``), the fraction above :math:`C`, and verl's token-weighted Kong ESS of
:math:`\min(P, C)`, :math:`(\sum_i L_i w_i)^2 / (\sum_i L_i \sum_i L_i w_i^2)` (its draws
needed from the simulated batches' spread). :func:`predict` draws ``n_batches``
batches of B sequences (lengths resampled from the run's length distribution, :math:`\log P`
drawn exactly), and reports the median and the central ``level`` interval of the logged number:
where a logged value falls outside it, the law (i.i.d. lognormal at the fitted :math:`s^2`) does
not describe the run.

**The verdict: can a batch of B sequences estimate it at all.** The quantity a metric
estimates is its expectation (``target``; for ``chi2_seq`` the untruncated
:math:`E[P^2] - 1 = \overline{e^{L(2m + 2s^2)}} - 1`, what verl's name promises). The draws
needed for a relative standard error ``target_rel`` are
:math:`n = \operatorname{Var}(f)/(\text{target\_rel}\cdot E f)^2` (for ``chi2_seq``:
:math:`(E[P^4]/E[P^2]^2 - 1)/\text{target\_rel}^2`, all from closed forms mixed over the lengths;
length-weighted metrics by the delta method). The verdict is ``reliable`` when :math:`n \le B`,
``marginal`` when the relative standard error :math:`\text{target\_rel}\sqrt{n/B}` lies between
``target_rel`` and 1, ``unreliable`` above 1 or when, for an unbounded summand, the Pareto
:math:`\hat k` its B summands show (the median over simulated batches,
:func:`variance_lab.stats.pareto_khat`) exceeds PSIS's limit
:math:`\min(1 - 1/\log_{10} B, 0.7)` (:func:`variance_lab.simulate.estimates.khat_limit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, special

from variance_lab import stats
from variance_lab.frameworks.logfiles import (
    DEFAULT_RATIO_LEVEL,
    FRAMEWORKS,
    SEQUENCE_METRICS,
    TOKEN_METRICS,
    SequenceMetric,
    detect_framework,
    field_number,
    find_metric,
)
from variance_lab.frameworks.verl import SAFETY_BOUND
from variance_lab.simulate.estimates import khat_limit

__all__ = [
    "LAW_PRIORITY",
    "TokenLaw",
    "analyze_logged",
    "fit_law",
    "length_sampler",
    "predict",
    "token_metric",
]

#: Which spread metric sets the law when several are logged, first first.
LAW_PRIORITY = ("chi2", "k3", "mult", "absdiff", "tis_abs")


#: Simulated sequences per step at most (:func:`analyze_logged` uses fewer batches for large B) ...
MAX_DRAWS = 2_000_000
#: ... but never fewer batches than this.
MIN_BATCHES = 100


# --------------------------------------------------------------------------------------
# the per-token law
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenLaw:
    r"""Token log-ratios :math:`y \sim N(m, s^2)`, i.i.d.; ``source``: the metric it was fitted from."""

    m: float
    s2: float
    source: str = ""

    def sequence(self, L) -> tuple[np.ndarray, np.ndarray]:
        r"""Return (M, S) of :math:`\log P_L \sim N(M, S^2)`: :math:`M = mL`, :math:`S = s\sqrt L`."""
        L = np.asarray(L, dtype=float)
        return self.m * L, np.sqrt(self.s2 * L)


def token_metric(kind: str, m: float, s2: float) -> float:
    r"""Return a token metric's value under :math:`y \sim N(m, s^2)` (the module docstring's table)."""
    s = math.sqrt(s2)
    if kind == "kl":
        return -m
    if kind == "k3":
        return math.expm1(m + s2 / 2) - m
    if kind == "chi2":
        return math.expm1(2 * m + 2 * s2)
    if s == 0.0:
        return {"mult": 1.0, "absdiff": abs(m), "tis_abs": abs(math.expm1(m))}[kind]
    z = m / s
    if kind == "mult":
        return math.exp(m + s2 / 2) * special.ndtr(z + s) + math.exp(-m + s2 / 2) * special.ndtr(s - z)
    if kind == "absdiff":
        return s * math.sqrt(2 / math.pi) * math.exp(-z * z / 2) + m * (1 - 2 * special.ndtr(-z))
    if kind == "tis_abs":
        e = math.exp(m + s2 / 2)
        return e - 1 + 2 * (special.ndtr(-z) - e * special.ndtr(-z - s))
    raise ValueError(f"unknown token metric kind {kind!r}; kinds are kl, {', '.join(LAW_PRIORITY)}")


def _solve_s2(kind: str, value: float, m: float | None) -> float:
    """Return :math:`s^2` with ``token_metric(kind, m, s2) == value`` (m None: :math:`m = -s^2/2`)."""

    def gap(s2: float) -> float:
        return token_metric(kind, -s2 / 2 if m is None else m, s2) - value

    if gap(0.0) >= 0.0:
        return 0.0
    hi = 1e-6
    while gap(hi) < 0.0:
        hi *= 4.0
        if hi > 1e4:
            raise ValueError(f"{kind} metric {value!r}: no token law N(m, s^2) with s^2 <= 1e4 gives it")
    return optimize.brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-12)


def fit_law(
    values: dict[str, float], kinds: dict[str, str], law_from: str | None = None
) -> tuple[TokenLaw, dict[str, float]]:
    r"""Fit :math:`N(m, s^2)` to one step's token metrics.

    Parameters
    ----------
    values : dict
        Logged name -> value, for the names of ``kinds`` present.
    kinds : dict
        Logged name -> kind (one of :data:`~variance_lab.frameworks.logfiles.TOKEN_METRICS`'s dictionaries).
    law_from : str, optional
        The metric that sets the law (default: the first of :data:`LAW_PRIORITY` present).

    Returns
    -------
    (law, fits)
        The law from the first kind of :data:`LAW_PRIORITY` present; ``fits`` maps every spread
        metric's name to the :math:`s^2` it gives alone. ``ValueError`` when no spread metric is
        present or a value is impossible (a negative ``k3``, a ``mult`` below 1).
    """
    m = None
    for name, kind in kinds.items():
        if kind == "kl" and name in values:
            m = -float(values[name])
    fits: dict[str, float] = {}
    for name, kind in kinds.items():
        if kind == "kl" and name in values:  # with E[e^y] = 1, KL = -m = s^2/2 (> 0)
            if values[name] > 0:
                fits[name] = 2.0 * float(values[name])
            continue
        if name not in values:
            continue
        v = float(values[name])
        floor = token_metric(kind, 0.0 if m is None else m, 0.0)
        if not math.isfinite(v) or v < floor - 1e-12:
            raise ValueError(f"{name} = {v!r} is impossible for any token law (it is at least {floor:.6g})")
        fits[name] = _solve_s2(kind, v, m)
    if law_from is not None:
        if law_from not in kinds:
            raise ValueError(f"law_from {law_from!r} is not a token metric here; they are {', '.join(kinds)}")
        if law_from not in fits:
            raise ValueError(f"law_from {law_from!r}: the record does not log it (or logs kl <= 0)")
        s2 = fits[law_from]
        return TokenLaw(-s2 / 2 if m is None else m, s2, law_from), fits
    for kind in (*LAW_PRIORITY, "kl"):
        for name, k in kinds.items():
            if k == kind and name in fits:
                return TokenLaw(-fits[name] / 2 if m is None else m, fits[name], name), fits
    names = ", ".join(kinds)
    raise ValueError(f"no token-level metric to fit a law from: expected one of {names}")


# --------------------------------------------------------------------------------------
# lengths
# --------------------------------------------------------------------------------------
def length_sampler(lengths=None, quantiles=None):
    r"""Return ``draw(rng, shape) -> lengths`` and the lengths' representative grid.

    ``lengths``: a sample of sequence lengths (a dump), drawn from with replacement.
    ``quantiles``: lengths at evenly spaced probabilities from 0 to 1 (one value: every
    sequence has it; ``8000,10000``: uniform between them), interpolated linearly.

    Returns
    -------
    (draw, grid)
        ``grid`` is 256 or fewer lengths, equally likely, standing for the distribution in the
        closed forms.
    """
    if (lengths is None) == (quantiles is None):
        raise ValueError("give either lengths (a sample) or quantiles")
    src = np.asarray(lengths if lengths is not None else quantiles, dtype=float).ravel()
    if src.size == 0 or not np.all(np.isfinite(src)) or np.any(src < 1):
        bad = src[~(np.isfinite(src) & (src >= 1))]
        raise ValueError(f"lengths must be >= 1, got {bad[0] if bad.size else 'none'!r}")
    if lengths is not None:
        sample = np.sort(src)

        def draw(rng, shape):
            return sample[rng.integers(0, sample.size, size=shape)]

        grid = sample if sample.size <= 256 else np.quantile(sample, (np.arange(256) + 0.5) / 256)
        return draw, grid
    q = np.asarray(src, dtype=float)
    if np.any(np.diff(q) < 0):
        raise ValueError(f"length quantiles must not decrease, got {q.tolist()!r}")
    probs = np.linspace(0.0, 1.0, q.size) if q.size > 1 else np.array([0.0])

    def qf(u):
        return np.interp(u, probs, q) if q.size > 1 else np.full(np.shape(u), q[0])

    def draw(rng, shape):
        return np.round(qf(rng.random(shape)))

    return draw, np.round(qf((np.arange(256) + 0.5) / 256))


# --------------------------------------------------------------------------------------
# sequence metrics: summands, closed forms, simulation
# --------------------------------------------------------------------------------------
def _summand(kind: str, x: np.ndarray, bound: float | None) -> np.ndarray:
    """f(log P) of a sequence metric, elementwise."""
    if kind == "chi2_seq":
        return np.exp(2.0 * np.clip(x, -SAFETY_BOUND, SAFETY_BOUND))
    lc = math.log(bound)
    if kind in ("trunc_mean", "ess_trunc"):
        return np.where(x > lc, bound, np.exp(np.minimum(x, lc)))
    if kind == "masked_mean":
        return np.where(x > lc, 0.0, np.exp(np.minimum(x, lc)))
    return (x > lc).astype(float)  # frac_above


def _log_pm(k: float, M, S, a: float, b: float) -> np.ndarray:
    r""":math:`\log E[e^{kX} 1\{a < X < b\}]`, :math:`X \sim N(M, S^2)`, elementwise in (M, S).

    :math:`= kM + k^2S^2/2 + \log(\Phi(\beta) - \Phi(\alpha))` with
    :math:`\alpha, \beta = (a, b) - M - kS^2` over :math:`S`; the normal mass is taken on the
    side of 0 where it does not cancel (:math:`\Phi(-\alpha) - \Phi(-\beta)` when
    :math:`\alpha > 0`), from ``log_ndtr``.
    """
    M, S = np.broadcast_arrays(np.asarray(M, float), np.asarray(S, float))
    shift = M + k * S * S
    with np.errstate(divide="ignore", invalid="ignore"):  # S = 0: a point mass, the bounds +-inf
        lo, hi = (a - shift) / S, (b - shift) / S
    flip = lo > 0
    lo, hi = np.where(flip, -hi, lo), np.where(flip, -lo, hi)
    l_hi, l_lo = special.log_ndtr(hi), special.log_ndtr(lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mass = l_hi + np.log(-np.expm1(np.minimum(l_lo - l_hi, 0.0)))
    log_mass = np.where(np.isneginf(l_hi) | (hi <= lo), -np.inf, log_mass)
    return k * M + 0.5 * k * k * S * S + log_mass


def _log_moments(kind: str, M, S, bound: float | None, j: int) -> np.ndarray:
    r"""Log :math:`E[f^j]` per length (the target's f: for ``chi2_seq`` :math:`P^2`, unclamped)."""
    inf = math.inf
    if kind == "chi2_seq":
        return 2.0 * j * np.asarray(M) + 0.5 * (2.0 * j) ** 2 * np.asarray(S) ** 2
    lc = math.log(bound)
    below = _log_pm(float(j), M, S, -inf, lc)
    above = _log_pm(0.0, M, S, lc, inf)
    if kind in ("trunc_mean", "ess_trunc"):
        return np.logaddexp(below, j * lc + above)
    if kind == "masked_mean":
        return below
    return above


def _mix(log_values: np.ndarray, log_w: np.ndarray) -> float:
    """Log of the mean over the length grid of exp(log_values), weighted by exp(log_w)."""
    return float(special.logsumexp(log_values + log_w) - special.logsumexp(log_w))


def _target_and_needed(metric: SequenceMetric, law: TokenLaw, grid, bound, B: int, target_rel: float):
    """Return (target, log10 target, log10 draws needed) from closed forms mixed over the lengths."""
    M, S = law.sequence(grid)
    lw = np.log(grid) if metric.weighting == "token" else np.zeros(grid.size)
    l1 = _log_moments(metric.kind, M, S, bound, 1)
    l2 = _log_moments(metric.kind, M, S, bound, 2)
    log_mean = _mix(l1, lw)  # E[L f] / E[L] (or E f)
    if metric.kind == "ess_trunc":  # (E[L w])^2 / (E[L] E[L w^2]); draws needed: from the simulation
        log_ess = 2 * log_mean - _mix(l2, lw)
        return math.exp(log_ess), log_ess / math.log(10), math.nan
    if metric.weighting == "token":  # delta method: Var(L (f - mu)) / (E L)^2
        mu = math.exp(log_mean)
        el = np.exp(l1)
        var_terms = grid**2 * (np.exp(l2) - 2 * mu * el + mu * mu)
        var = float(var_terms.mean() / grid.mean() ** 2)
        log_var = math.log(var) if var > 0 else -math.inf
    else:
        log_second = _mix(l2, lw)
        gap = 2 * log_mean - log_second  # log(E f)^2 - log E f^2 <= 0
        log_var = log_second + math.log(-math.expm1(min(gap, 0.0))) if gap < 0 else -math.inf
    log10_needed = (
        (log_var - 2 * log_mean - 2 * math.log(target_rel)) / math.log(10)
        if log_mean > -math.inf
        else math.inf
    )
    if metric.kind == "chi2_seq":
        target = math.expm1(log_mean) if log_mean < 700 else math.inf
        if log_mean > 1:
            log10_target = log_mean / math.log(10)
        else:
            log10_target = math.log10(target) if target > 0 else math.nan
    else:
        target = math.exp(log_mean)
        log10_target = log_mean / math.log(10)
    return target, log10_target, log10_needed


def _batch_values(metric: SequenceMetric, x: np.ndarray, L: np.ndarray, bound) -> np.ndarray:
    """Return the logged value of each simulated batch (rows of the log-weights x, lengths L)."""
    f = _summand(metric.kind, x, bound)
    if metric.kind == "ess_trunc":  # Kong's ESS over tokens: (sum L w)^2 / (sum L * sum L w^2)
        value = (L * f).sum(axis=1) ** 2 / (L.sum(axis=1) * (L * f * f).sum(axis=1))
    elif metric.weighting == "token":
        value = (L * f).sum(axis=1) / L.sum(axis=1)
    else:
        value = f.mean(axis=1)
    if metric.kind == "chi2_seq":
        value = value - 1.0
    return value


def _median_khat(x: np.ndarray, kind: str, n_khat: int) -> float:
    """Median over the first batches of the Pareto k-hat of the summands (unbounded kinds only)."""
    if kind != "chi2_seq":
        return math.nan
    B = x.shape[1]
    tail = math.ceil(min(0.2 * B, 3.0 * math.sqrt(B))) + 1
    if tail < 6:
        return math.nan
    ks = []
    for row in x[:n_khat]:
        top = np.partition(2.0 * np.clip(row, -SAFETY_BOUND, SAFETY_BOUND), B - tail)[B - tail :]
        ks.append(stats.pareto_khat(top))
    ks = [k for k in ks if math.isfinite(k)]
    return float(np.median(ks)) if ks else math.nan


def predict(
    law: TokenLaw,
    metric: SequenceMetric,
    batch_size: int,
    draw_lengths,
    grid,
    *,
    bound: float | None = None,
    level: float = 0.9,
    n_batches: int = 400,
    target_rel: float = 0.1,
    seed: int = 0,
    _draws: tuple[np.ndarray, ...] | None = None,
) -> dict:
    r"""Predict one logged sequence metric of a batch of ``batch_size`` sequences under ``law``.

    Returns
    -------
    dict
        ``predicted`` (median over ``n_batches`` simulated batches), ``lo``, ``hi`` (their central
        ``level`` interval), ``target`` (the expectation the metric estimates) and
        ``log10_target``, ``n_needed`` (draws for a relative standard error ``target_rel``) and
        ``log10_n_needed``, ``rel_se`` (the relative standard error of one batch's estimate),
        ``khat`` (the summands' median Pareto :math:`\hat k`; NaN for a bounded summand),
        ``khat_limit``, ``verdict`` (``reliable``: ``n_needed`` at most B; ``marginal``: a
        relative standard error between ``target_rel`` and 1; ``unreliable``: above 1, or
        :math:`\hat k` above the limit) and ``reason``.
    """
    bound = metric.bound if bound is None else bound
    if metric.kind != "chi2_seq" and (bound is None or not bound > 0):
        raise ValueError(f"{metric.name}: needs a bound C > 0, got {bound!r}")
    if _draws is None:
        rng = np.random.default_rng(np.random.SeedSequence(seed))
        Z = rng.standard_normal((n_batches, batch_size))
        L = draw_lengths(rng, (n_batches, batch_size))
    else:
        Z, L = _draws[:2]
    if _draws is not None and len(_draws) > 2:
        x = _draws[2]
    else:
        M, S = law.sequence(L)
        x = M + S * Z
    values = _batch_values(metric, x, L, bound)
    alpha = (1.0 - level) / 2.0
    lo, med, hi = np.quantile(values, [alpha, 0.5, 1.0 - alpha])
    target, log10_target, log10_needed = _target_and_needed(
        metric, law, np.asarray(grid, float), bound, batch_size, target_rel
    )
    if math.isnan(log10_needed):  # a ratio of batch sums: its spread over the simulated batches
        sd = float(np.std(values, ddof=1))
        log10_needed = (
            math.log10(batch_size) + 2 * math.log10(sd / (target_rel * abs(target)))
            if sd > 0 and target != 0
            else (-math.inf if sd == 0 else math.inf)
        )
    khat = _median_khat(x, metric.kind, 40)
    limit = float(khat_limit(batch_size)) if batch_size > 1 else math.nan
    log10_rel_se = math.log10(target_rel) + 0.5 * (log10_needed - math.log10(batch_size))
    rel_se = 10.0**log10_rel_se if log10_rel_se < 300 else math.inf
    heavy = math.isfinite(khat) and khat > limit
    if heavy or log10_rel_se > 0.0:
        verdict = "unreliable"
    elif log10_needed > math.log10(batch_size):
        verdict = "marginal"
    else:
        verdict = "reliable"
    words = (
        f"relative standard error {rel_se:.2g} with {batch_size} sequences"
        if log10_rel_se < 3
        else f"relative standard error 10^{log10_rel_se:.1f} with {batch_size} sequences"
    )
    reason = f"{words}; {target_rel:.0%} needs 10^{log10_needed:.1f}"
    if heavy:
        reason += f"; Pareto k-hat of its summands {khat:.2f} > {limit:.2f}"
    return {
        "predicted": float(med),
        "lo": float(lo),
        "hi": float(hi),
        "target": target,
        "log10_target": log10_target,
        "n_needed": 10.0**log10_needed if log10_needed < 300 else math.inf,
        "log10_n_needed": log10_needed,
        "rel_se": rel_se,
        "khat": khat,
        "khat_limit": limit,
        "verdict": verdict,
        "reason": reason,
    }


# --------------------------------------------------------------------------------------
# a run's log
# --------------------------------------------------------------------------------------
def analyze_logged(
    records: list[dict],
    *,
    batch_size: int,
    lengths=None,
    quantiles=None,
    framework: str | None = None,
    threshold: float | None = None,
    ratio_level: str | None = None,
    law_from: str | None = None,
    level: float = 0.9,
    n_batches: int = 400,
    target_rel: float = 0.1,
    seed: int = 0,
    source: str = "records",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    r"""Per step: the token law from the token metrics, and each sequence metric predicted and judged.

    Parameters
    ----------
    records : list of dict
        One per step, the run's logged scalars under the framework's names (a key may carry a
        prefix: ``train/sampling_importance_ratio``); ``step`` (or ``_step``, ``global_step``)
        names the step, else the record's index. A ``None`` value is a metric the step did not
        log; a record with none of the framework's metrics (an evaluation row) is skipped and
        counted in ``metrics.attrs["skipped"]``.
    batch_size : int
        Sequences per step (B).
    lengths, quantiles : array_like
        The run's sequence lengths: a sample, or quantiles (:func:`length_sampler`).
    framework : str, optional
        One of :data:`~variance_lab.frameworks.logfiles.FRAMEWORKS`; None: from the records' keys.
    threshold : float, optional
        The bound C of the truncated, masked and out-of-bound metrics (default: the framework's).
    ratio_level : {None, "token", "sequence"}
        Whether the run's importance ratios are per token or per sequence (verl
        ``rollout_is``, NeMo-RL ``sequence_level_importance_ratios``, TRL
        ``vllm_importance_sampling_mode``); None: the framework's default
        (:data:`~variance_lab.frameworks.logfiles.DEFAULT_RATIO_LEVEL`). With token-level ratios
        the IS metrics are token averages, precise and not judged here; only ``chi2_seq`` stays a
        sequence metric.
    law_from : str, optional
        The token metric that sets each step's law (:func:`fit_law`).
    level : float
        Level of the prediction intervals.
    n_batches : int
        Simulated batches per step (the same draws for every step and metric); at most
        :data:`MAX_DRAWS` sequences in all, but at least :data:`MIN_BATCHES` batches.
    target_rel : float
        The relative standard error a batch must reach to "estimate" a metric.
    seed : int
    source : str
        The file's name, for error messages.

    Returns
    -------
    (laws, metrics) : tuple of DataFrame
        ``laws``: step, framework, m, s2, source, ``s2_spread`` (the largest fitted
        :math:`s^2` over the smallest: 1 for lognormal tokens, far above for heavy tails) and
        ``s2[<metric>]`` per token metric;
        ``metrics``: step, metric, logged (NaN when the step does not log it), predicted, lo, hi,
        agreement (``inside``, ``below``, ``above``, ``not logged``), target, log10_target,
        n_needed, log10_n_needed, rel_se, khat, khat_limit, verdict, reason.
    """
    if not records:
        raise ValueError(f"{source}: no records")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 2:
        raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if framework is None:
        framework = detect_framework(records)
    if framework not in TOKEN_METRICS:
        raise ValueError(f"unknown framework {framework!r}; frameworks are {', '.join(FRAMEWORKS)}")
    if threshold is not None and not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a number > 0, got {threshold!r}")
    ratio_level = DEFAULT_RATIO_LEVEL[framework] if ratio_level is None else ratio_level
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    seq_metrics = [
        mt for mt in SEQUENCE_METRICS[framework] if mt.ratio_level == "any" or ratio_level == "sequence"
    ]
    draw, grid = length_sampler(lengths, quantiles)
    n_batches = min(n_batches, max(MIN_BATCHES, MAX_DRAWS // batch_size))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    Z = rng.standard_normal((n_batches, batch_size))
    L = draw(rng, (n_batches, batch_size))
    kinds = TOKEN_METRICS[framework]
    law_rows, metric_rows = [], []
    skipped = 0
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ValueError(
                f"{source}: record {i + 1}: expected an object of metrics, got {type(rec).__name__}"
            )
        where = f"{source}: record {i + 1}"
        names = [*kinds, *(mt.name for mt in SEQUENCE_METRICS[framework])]
        if all(find_metric(rec, n) is None for n in names):  # an eval or timing row of the log
            skipped += 1
            continue
        step_key = next((k for k in ("step", "_step", "global_step") if k in rec), None)
        step = field_number(rec, step_key, where) if step_key else float(i)
        values = {}
        for name in kinds:
            key = find_metric(rec, name)
            if key is not None:
                values[name] = field_number(rec, key, where)
        try:
            law, fits = fit_law(values, kinds, law_from)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        spread = max(fits.values()) / min(fits.values()) if min(fits.values()) > 0 else math.inf
        law_rows.append(
            {
                "step": step,
                "framework": framework,
                "m": law.m,
                "s2": law.s2,
                "source": law.source,
                "s2_spread": spread,
            }
            | {f"s2[{k}]": v for k, v in fits.items()}
        )
        if seq_metrics:  # log P_L of every simulated sequence, shared by the step's metrics
            M, S = law.sequence(L)
            x = M + S * Z
        for metric in seq_metrics:
            key = find_metric(rec, metric.name)
            logged = field_number(rec, key, where) if key is not None else math.nan
            out = predict(
                law,
                metric,
                batch_size,
                draw,
                grid,
                bound=threshold,
                level=level,
                target_rel=target_rel,
                _draws=(Z, L, x),
            )
            if math.isnan(logged):
                agreement = "not logged"
            else:
                agreement = "below" if logged < out["lo"] else "above" if logged > out["hi"] else "inside"
            metric_rows.append(
                {"step": step, "metric": metric.name, "logged": logged} | out | {"agreement": agreement}
            )
    columns = [
        "step",
        "metric",
        "logged",
        "predicted",
        "lo",
        "hi",
        "agreement",
        "target",
        "log10_target",
        "n_needed",
        "log10_n_needed",
        "rel_se",
        "khat",
        "khat_limit",
        "verdict",
        "reason",
    ]
    metrics = pd.DataFrame(metric_rows, columns=columns)
    if not law_rows:
        raise ValueError(f"{source}: no record logs any of {', '.join(kinds)}")
    metrics.attrs.update(
        skipped=skipped,
        n_batches=n_batches,
        level=level,
        batch_size=batch_size,
        framework=framework,
        target_rel=target_rel,
        ratio_level=ratio_level,
    )
    return pd.DataFrame(law_rows), metrics
