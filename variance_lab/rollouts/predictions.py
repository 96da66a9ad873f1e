r"""Per-bucket predictions of the fitted models (``mix``, ``hier``, ``comb``).

Clip-fraction intervals, and the choice of model on variances and clip fractions together.

Used by :func:`variance_lab.rollouts.analysis.analyze`; see :mod:`variance_lab.rollouts.models` for
the three models. For every length bucket this adds

- 95 % intervals of the observed clip fractions (GSPO's fraction of sequences clipped, with its
  interval and design effect, comes from :func:`~variance_lab.rollouts.statistics.bucket_variances`):
  a percentile bootstrap (:func:`~variance_lab.stats.bootstrap_ratio`) over sequences, or over prompts
  when the batch has ``prompt_id``, for the fractions
  of tokens clipped by PPO (:math:`r_t` outside its range) and by GMPO
  (:math:`|\log r_t| > \epsilon`, :math:`\epsilon` the ``gmpo`` correction's default 0.4 of
  :mod:`variance_lab.corrections`), whose tokens within a sequence are not independent
  (``gmpo_clip_frac`` with ``_lo``, ``_hi``);
- under ``mix``, ``hier`` and ``comb``: :math:`\operatorname{Var}(G_T)` and
  :math:`\log_{10}\operatorname{Var}(P_T)` (the expected sample variance of the bucket's
  sequences given their lengths, as for the other models), GSPO's clip fraction (averaged over
  the bucket's sequences) and the token clip fractions of PPO and GMPO (over its tokens).
  ``comb``'s GSPO clip is a seeded Monte Carlo, :data:`COMB_REPLICATES` draws per sequence
  of the bucket; ``gspo_clip_se_comb`` is its standard error;
- token and GSPO predictions of the older models under the new names: ``iid`` and ``corr`` token
  clip from the fitted normal, ``emp`` token clip the empirical fraction itself (no prediction),
  ``emp`` GSPO clip NaN (the law of a mean of :math:`T` empirical draws has no closed form).

Model choice (:func:`choose_model`). A bucket of fewer than :data:`MIN_BUCKET_SEQUENCES`
sequences is not judged (``best_model`` says :data:`TOO_FEW`, ``fits`` is empty). A model
*fits* a bucket when its :math:`\operatorname{Var}(G_T)` lies inside the bucket's bootstrap
interval (``|score| <= 1``) and its GSPO clip prediction inside its interval (Wilson, or
clustered by prompt; ``emp``, without a clip prediction, never fits). The chosen model fits
the most buckets; among models that fit as many, the simplest, in the order ``iid``, ``emp``,
``corr``, ``mix``, ``hier``, ``comb``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special

from variance_lab import corrections
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.models import (
    CombinedFit,
    MixtureFit,
    RandomScaleFit,
    fit_combined,
    fit_mixture,
    fit_random_scale,
    normal_outside,
)
from variance_lab.simulate.resample import resample_rng
from variance_lab.stats import bootstrap_ratio
from variance_lab.stats.special import LN10

__all__ = [
    "ALL_MODELS",
    "COMB_REPLICATES",
    "FITTED_MODELS",
    "GMPO_LOG_RANGE",
    "MIN_BUCKET_SEQUENCES",
    "PREDICTION_COLUMNS",
    "TOO_FEW",
    "child_seed",
    "choose_model",
    "expected_sample_var",
    "fitted_models",
    "interval_score",
    "prediction_columns",
]

#: Every model, in the order of parsimony.
ALL_MODELS = ("iid", "emp", "corr", "mix", "hier", "comb")

#: The models fitted here.
FITTED_MODELS = ("mix", "hier", "comb")

#: GMPO's per-token clip range of log r: the ``gmpo`` correction's default.
GMPO_LOG_RANGE = corrections.parse("gmpo").log_bounds()

#: Fewest sequences a length bucket needs to be judged (a verdict, a best model, a fit counted):
#: a bootstrap interval of a variance from fewer is too rough (it covers well below its level).
MIN_BUCKET_SEQUENCES = 20

#: Label of a bucket below :data:`MIN_BUCKET_SEQUENCES` (verdict and best model).
TOO_FEW = "too few sequences"

#: Monte Carlo draws per sequence of ``comb``'s GSPO clip prediction.
COMB_REPLICATES = 100

#: Columns added to the analysis table, in order.
PREDICTION_COLUMNS = (
    "ppo_clip_frac_lo",
    "ppo_clip_frac_hi",
    "gmpo_clip_frac",
    "gmpo_clip_frac_lo",
    "gmpo_clip_frac_hi",
    *(f"{stat}_{m}" for m in FITTED_MODELS for stat in ("var_G", "log10_var_G", "log10_var_P")),
    *(f"gspo_clip_pred_{m}" for m in ALL_MODELS if m != "iid"),
    "gspo_clip_se_comb",
    *(f"ppo_clip_pred_{m}" for m in ALL_MODELS),
    *(f"gmpo_clip_pred_{m}" for m in ALL_MODELS),
    *(f"score_{m}" for m in FITTED_MODELS),
    "fits",
    "best_model",
)


def child_seed(seed, key: int) -> np.random.SeedSequence:
    """Return the SeedSequence of ``seed`` with ``key`` appended to its spawn key.

    Independent of the streams analyze's bootstrap spawns from ``seed`` (keys 0, 1, ...). The keys
    in use: 10,000 + j, 20,000 + j and 30,000 + j (bucket j's clip intervals and ``comb``'s Monte
    Carlo), 50,000 + f (held-out fold f's bootstrap), 60,000 (the deal of the folds) and 70,000
    (the sample of the token-mixture fits).

    Parameters
    ----------
    seed : int or numpy.random.SeedSequence
    key : int

    Returns
    -------
    numpy.random.SeedSequence
    """
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, key))


def _child_rng(seed, j: int) -> np.random.Generator:
    """Return the Generator of bucket ``j``'s clip intervals (key 10,000 + j; GMPO's: 20,000 + j)."""
    return resample_rng(child_seed(seed, 10_000 + j))


def expected_sample_var(log_mean, log_var, counts) -> float:
    r"""Return ln E[sample variance] (ddof=1) of independent draws, ``counts[j]`` with ln mean, ln var [j].

    :math:`\tfrac1n\sum_j c_j v_j + \tfrac{1}{n-1}\sum_j c_j (m_j - \bar m)^2`, in log space;
    NaN for fewer than 2 draws or a NaN input, ``inf`` for an infinite variance.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    if n < 2 or np.any(np.isnan(log_var)) or np.any(np.isnan(log_mean)):
        return math.nan
    if np.any(np.isposinf(log_var)):
        return math.inf
    within = special.logsumexp(log_var, b=counts) - math.log(n)
    top = float(np.max(log_mean))
    e = np.exp(log_mean - top)
    spread = float(np.sum(counts * (e - np.sum(counts * e) / n) ** 2)) / (n - 1)
    between = 2.0 * top + math.log(spread) if spread > 0 else -math.inf
    return float(np.logaddexp(within, between))


def interval_score(ln_pred: float, point: float, lo: float, hi: float) -> float:
    r"""Return the signed distance of ``ln_pred`` from ``point`` in half-widths of the interval.

    All four are ln values. The score is :math:`(\ln p - x) / (h - x)` when the prediction
    lies above the point ``x`` (``h`` the upper end) and :math:`(\ln p - x) / (x - l)` when below
    (``l`` the lower end): :math:`|s| \le 1` means inside the interval. A zero-width side gives
    :math:`\pm\infty`, a non-finite interval or a NaN prediction NaN.
    """
    if not all(math.isfinite(v) for v in (point, lo, hi)) or math.isnan(ln_pred):
        return math.nan
    diff = ln_pred - point
    half = (hi - point) if diff >= 0 else (point - lo)
    if diff == 0:
        return 0.0
    return diff / half if half > 0 else math.copysign(math.inf, diff)


def fitted_models(
    batch: TokenBatch, tokens: TokenBatch | None = None, sequences: TokenBatch | None = None
) -> tuple[MixtureFit, RandomScaleFit, CombinedFit | None]:
    """Fit ``mix`` (pooled tokens, EM, BIC), ``hier`` (length-dependent random scale) and ``comb``.

    ``mix`` and ``comb`` are fitted to ``tokens``, ``hier`` to ``sequences``, both by default
    ``batch`` (``analyze`` passes stated samples of whole prompts,
    :func:`~variance_lab.rollouts.subsample.fit_sample`). ``comb`` (its own mixture of up to 5
    components) is None when BIC picks one component for ``mix`` (then comb's EM is not run) or
    for comb's own mixture.
    """
    tokens = batch if tokens is None else tokens
    sequences = batch if sequences is None else sequences
    mix = fit_mixture(tokens)
    comb = None
    if mix.n_components > 1:  # BIC sees more than one component among 3: try comb's up to 5
        try:
            comb = fit_combined(tokens)
        except ValueError:  # its own BIC picked one component: no sparse part
            comb = None
    return mix, fit_random_scale(sequences), comb


def prediction_columns(
    sequences,
    table: pd.DataFrame,
    bucket: np.ndarray,
    fits: tuple[MixtureFit, RandomScaleFit, CombinedFit | None],
    *,
    g_range,
    p_range,
    normal: tuple[float, float],
    n_boot: int,
    level: float,
    seed,
    fits_only: bool = False,
) -> pd.DataFrame:
    r"""Compute the :data:`PREDICTION_COLUMNS` of each row of the analysis ``table`` (module docstring).

    ``fits_only``: only what :func:`choose_model` reads (``fits``, ``best_model``, and the Var(G_T)
    and GSPO clip predictions they come from; the held-out judgment's folds): the PPO and GMPO
    clip intervals and predictions and the Var(P_T) predictions stay NaN, and what is computed is
    the same, bit for bit (the intervals left out draw from their own streams).

    ``normal`` is the pooled fit :math:`(\hat\mu_y, \hat\sigma_y^2)` of ``iid`` and ``corr``.
    ``sequences`` are the judged ones (:class:`~variance_lab.rollouts.summaries.EvalSummary`):
    their ``lengths``, ``groups`` (prompts, or None) and tokens outside PPO's range
    (:math:`y < \log a` or :math:`y > \log b`) and GMPO's per sequence, ``ppo_tokens`` and
    ``gmpo_tokens``.
    """
    lengths = sequences.lengths
    groups = sequences.groups
    p_seq, m_seq = sequences.ppo_tokens, sequences.gmpo_tokens
    emp = {"ppo": float(p_seq.sum() / lengths.sum()), "gmpo": float(m_seq.sum() / lengths.sum())}
    gauss = {
        k: float(normal_outside(normal[0], normal[1], r))
        for k, r in (("ppo", p_range), ("gmpo", GMPO_LOG_RANGE))
    }
    rows = []
    for j, base in enumerate(table.to_dict("records")):
        sel = bucket == base["bucket"]
        T, n = lengths[sel], int(sel.sum())
        uniq, counts = np.unique(T, return_counts=True)
        row: dict = {}
        g = None if groups is None else groups[sel]
        boot = {"n_boot": n_boot, "level": level, "groups": g}
        row["gmpo_clip_frac"] = float(m_seq[sel].sum() / T.sum())
        if not fits_only:
            row["ppo_clip_frac_lo"], row["ppo_clip_frac_hi"] = bootstrap_ratio(
                p_seq[sel], T, rng=_child_rng(seed, j), **boot
            )
            row["gmpo_clip_frac_lo"], row["gmpo_clip_frac_hi"] = bootstrap_ratio(
                m_seq[sel], T, rng=_child_rng(seed, 20_000 + j), **boot
            )
        obs_G = [base[k] * LN10 for k in ("log10_var_G", "log10_var_G_lo", "log10_var_G_hi")]
        row["gspo_clip_se_comb"] = math.nan
        ppo = None if fits_only else p_range
        for name, fit in zip(FITTED_MODELS, fits, strict=True):
            if fit is None:
                continue
            if name == "comb":
                pred = fit.predict(
                    uniq, g_range, ppo, n_rep=counts * COMB_REPLICATES, seed=child_seed(seed, 30_000 + j)
                )
                row["gspo_clip_se_comb"] = float(np.sqrt(np.sum((counts * pred["gspo_clip_se"]) ** 2)) / n)
            else:
                pred = fit.predict(uniq, g_range, ppo)
            ln_g = expected_sample_var(pred["mean_G"], pred["var_G"], counts)
            with np.errstate(over="ignore"):
                row[f"var_G_{name}"] = float(np.exp(ln_g))
            row[f"log10_var_G_{name}"] = ln_g / LN10
            row[f"gspo_clip_pred_{name}"] = float(np.sum(counts * pred["gspo_clip"]) / n)
            row[f"score_{name}"] = interval_score(ln_g, *obs_G)
            if not fits_only:
                row[f"log10_var_P_{name}"] = expected_sample_var(pred["mean_P"], pred["var_P"], counts) / LN10
                tokens = counts * uniq
                row[f"ppo_clip_pred_{name}"] = float(np.sum(tokens * pred["ppo_clip"]) / np.sum(tokens))
                gmpo = fit.token_clip(uniq, GMPO_LOG_RANGE)
                row[f"gmpo_clip_pred_{name}"] = float(np.sum(tokens * gmpo) / np.sum(tokens))
        row["gspo_clip_pred_emp"] = math.nan
        row["gspo_clip_pred_corr"] = base["gspo_clip_pred"]
        for kind in ("ppo", "gmpo"):
            row[f"{kind}_clip_pred_iid"] = row[f"{kind}_clip_pred_corr"] = gauss[kind]
            row[f"{kind}_clip_pred_emp"] = emp[kind]
        fitting = [m for m in ALL_MODELS if _fits({**base, **row}, m)]
        row["fits"] = ",".join(fitting)
        row["best_model"] = fitting[0] if fitting else "none"
        if n < MIN_BUCKET_SEQUENCES:  # too few to judge: no fits counted, no best model
            row["fits"], row["best_model"] = "", TOO_FEW
        rows.append(row)
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS), index=table.index)


def _gspo_pred(row: dict, model: str) -> float:
    return row["gspo_clip_pred_iid"] if model == "iid" else row[f"gspo_clip_pred_{model}"]


def _fits(row: dict, model: str) -> bool:
    """Var(G_T) inside its bootstrap interval and the GSPO clip prediction inside the Wilson interval."""
    score = row.get(f"score_{model}", math.nan)
    clip = _gspo_pred(row, model)
    if math.isnan(score):
        return False
    clip_ok = row["gspo_clip_frac_lo"] <= clip <= row["gspo_clip_frac_hi"]  # False for NaN
    return abs(score) <= 1.0 and clip_ok


def choose_model(table: pd.DataFrame) -> tuple[str, dict]:
    """Return the model that fits the most buckets (ties: the simplest).

    And each model's count of buckets fitted.

    Parameters
    ----------
    table : pandas.DataFrame
        The analysis table with :data:`PREDICTION_COLUMNS`.

    Returns
    -------
    (str, dict)
        ``"none"`` when no model fits any bucket.
    """
    counts = {m: int(sum(m in str(f).split(",") for f in table["fits"])) for m in ALL_MODELS}
    best = max(ALL_MODELS, key=lambda m: (counts[m], -ALL_MODELS.index(m)))
    return (best if counts[best] > 0 else "none"), counts
