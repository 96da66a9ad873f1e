r"""The per-bucket judgment of :func:`~variance_lab.rollouts.analysis.analyze`: predictions, scores, verdicts.

One batch's observed per-bucket variances and clip fractions
(:func:`~variance_lab.rollouts.statistics.bucket_variances`) are set beside the three predictions
``iid``, ``emp`` and ``corr`` (:class:`PredictionModels`, fitted on the same batch or, for the
held-out judgment, on the other folds: :func:`judge`, :func:`heldout`), each scored in units of
the observed interval's half-width, and each bucket given the :func:`verdict` of the simplest
prediction its data support; :func:`overall_verdict` is the buckets' vote. The math is in
:mod:`variance_lab.rollouts.analysis`'s docstring; :func:`group_summary` says how the sequences
are grouped (by prompt, or taken as independent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.cgf import EmpiricalCGF, gauss_log_moments
from variance_lab.rollouts.heldout import heldout_judgment
from variance_lab.rollouts.models import normal_outside
from variance_lab.rollouts.predictions import (
    MIN_BUCKET_SEQUENCES,
    PREDICTION_COLUMNS,
    TOO_FEW,
    child_seed,
    choose_model,
    expected_sample_var,
    fitted_models,
    interval_score,
    prediction_columns,
)
from variance_lab.rollouts.statistics import Autocorrelation, LogRatioFit, bucket_table, length_buckets
from variance_lab.rollouts.summaries import Summaries
from variance_lab.stats.special import LN10

__all__ = [
    "ANALYSIS_COLUMNS",
    "BUCKET_VERDICTS",
    "MODELS",
    "MODEL_LABELS",
    "Judged",
    "PredictionModels",
    "group_summary",
    "heldout",
    "judge",
    "overall_verdict",
    "verdict",
]


#: The three predictions, in table order.
MODELS = ("iid", "emp", "corr")


#: Verdict label of each prediction.
MODEL_LABELS = {"iid": "iid-lognormal", "emp": "iid-empirical", "corr": "corrected"}


#: Every verdict a bucket can get.
BUCKET_VERDICTS = ("iid-lognormal", "iid-empirical", "corrected", "none", "n/a", TOO_FEW)


#: Columns of :attr:`~variance_lab.rollouts.analysis.AnalysisResult.table`, in order.
ANALYSIS_COLUMNS = (
    "bucket",
    "T_lo",
    "T_hi",
    "n_seq",
    "n_prompts",
    "T_min",
    "T_median",
    "T_mean",
    "T_max",
    "n_tokens",
    "var_log_P",
    "var_log_P_iid",
    "var_log_P_corr",
    "log10_var_P",
    "log10_var_P_lo",
    "log10_var_P_hi",
    "ess_P",
    "log10_var_P_iid",
    "log10_var_P_emp",
    "log10_var_P_corr",
    "var_G",
    "var_G_lo",
    "var_G_hi",
    "log10_var_G",
    "log10_var_G_lo",
    "log10_var_G_hi",
    "var_G_iid",
    "var_G_emp",
    "var_G_corr",
    "log10_var_G_iid",
    "log10_var_G_emp",
    "log10_var_G_corr",
    "score_iid",
    "score_emp",
    "score_corr",
    "verdict",
    "gspo_clip_frac",
    "gspo_clip_frac_lo",
    "gspo_clip_frac_hi",
    "design_effect",
    "gspo_clip_pred",
    "gspo_clip_pred_iid",
    "ppo_clip_frac",
    "ppo_clip_pred",
    "interval_failed",
    *PREDICTION_COLUMNS,  # the fitted models mix and hier, clip intervals, model choice (predictions.py)
)


# --------------------------------------------------------------------------------------
# the three predictions
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PredictionModels:
    """The fitted inputs of the three predictions (:data:`MODELS`): the pooled fit, autocorrelation, CGF.

    ``acf`` is None where the autocorrelation is undefined (the ``corr`` prediction is then NaN).
    """

    fit: LogRatioFit
    acf: Autocorrelation | None
    cgf: EmpiricalCGF

    def var_log_P(self, model: str, T: np.ndarray) -> np.ndarray:
        """Var(log P_T) under ``iid`` or ``corr`` (NaN for ``corr`` without an autocorrelation)."""
        T = np.asarray(T, dtype=np.float64)
        if model == "iid":
            return T * self.fit.sigma2_y
        if self.acf is None:
            return np.full(T.shape, np.nan)
        return np.maximum(self.acf.var_sum(T) * (self.fit.sigma2_y / self.acf.gamma0), 0.0)

    def log_moments(self, model: str, T) -> dict[str, np.ndarray]:
        """Return ln E and ln Var of P_T and of G_T at each length T under ``model``."""
        T = np.asarray(T, dtype=np.float64)
        if model == "emp":
            mP, vP = self.cgf.log_moments(T, 1.0)
            mG, vG = self.cgf.log_moments(T, 1.0 / T)
        else:
            V, m = self.var_log_P(model, T), T * self.fit.mu_y
            mP, vP = gauss_log_moments(m, V, 1.0)
            mG, vG = gauss_log_moments(m, V, 1.0 / T)
        return {"mean_P": mP, "var_P": vP, "mean_G": mG, "var_G": vG}

    def gspo_clip(self, model: str, T, log_range: tuple[float, float]) -> np.ndarray:
        r""":math:`P(\log G_T \notin (\log a, \log b))` with :math:`\log G_T \sim N(\mu_y, V_T/T^2)`."""
        T = np.asarray(T, dtype=np.float64)
        return normal_outside(self.fit.mu_y, self.var_log_P(model, T) / T**2, log_range)


def _expected_sample_var_linear(mean, var, counts) -> float:
    """E[sample variance] (ddof=1) from linear means and variances (``expected_sample_var`` in log space)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    if n < 2:
        return math.nan
    spread = np.sum(counts * (mean - np.sum(counts * mean) / n) ** 2) / (n - 1)
    return float(np.sum(counts * var) / n + spread)


# --------------------------------------------------------------------------------------
# scores and verdicts
# --------------------------------------------------------------------------------------
def verdict(
    score_iid: float, score_emp: float, score_corr: float, *, tol: float = 1.0, margin: float = 2.0
) -> str:
    """Return the prediction one bucket's data support, from the three scores.

    The predictions are taken in the order of parsimony ``iid`` (i.i.d. lognormal), ``emp``
    (i.i.d. from the empirical distribution), ``corr`` (autocorrelation-corrected). The
    verdict is the first whose ``|score| <= tol`` (inside the interval) and whose
    ``margin * |score|`` is at most the ``|score|`` of every simpler one with a score.

    Parameters
    ----------
    score_iid, score_emp, score_corr : float
        Scores (NaN: not available).
    tol : float
        Largest ``|score|`` counted as supported (1: the interval's edge).
    margin : float
        How many times closer than every simpler prediction a later one must be.

    Returns
    -------
    str
        ``"iid-lognormal"``, ``"iid-empirical"``, ``"corrected"``, ``"none"`` (no prediction
        qualifies) or ``"n/a"`` (no score).
    """
    scores = [abs(float(v)) for v in (score_iid, score_emp, score_corr)]
    if all(math.isnan(v) for v in scores):
        return "n/a"
    simpler: list[float] = []
    for model, score in zip(MODELS, scores, strict=True):
        if score <= tol and all(margin * score <= other for other in simpler):  # False for NaN
            return MODEL_LABELS[model]
        if not math.isnan(score):
            simpler.append(score)
    return "none"


def overall_verdict(verdicts) -> str:
    """Return the buckets' vote: i.i.d. (either kind), corrected or none; ties to i.i.d., then corrected.

    Parameters
    ----------
    verdicts : iterable of str
        Per-bucket verdicts; ``"n/a"`` and :data:`TOO_FEW` ones do not vote.

    Returns
    -------
    str
        One of :data:`BUCKET_VERDICTS`: :data:`TOO_FEW` when every bucket had too few sequences,
        ``"n/a"`` when no bucket votes otherwise (a bucket of enough sequences without an interval:
        ``n_boot=0``, constant log-ratios, a failed bootstrap-t).
    """
    verdicts = list(verdicts)
    votes = [v for v in verdicts if v not in ("n/a", TOO_FEW)]
    if not votes:
        return TOO_FEW if verdicts and all(v == TOO_FEW for v in verdicts) else "n/a"
    n_log, n_emp = votes.count("iid-lognormal"), votes.count("iid-empirical")
    iid = "iid-lognormal" if n_log >= n_emp else "iid-empirical"
    tally = [(n_log + n_emp, iid), (votes.count("corrected"), "corrected"), (votes.count("none"), "none")]
    return max(tally, key=lambda t: t[0])[1]  # max keeps the first of equal counts


# --------------------------------------------------------------------------------------
# judging a batch
# --------------------------------------------------------------------------------------
def _bucket_predictions(
    models: PredictionModels, T: np.ndarray, g_range, base: dict, *, bootstrapped: bool
) -> dict:
    """Prediction columns of one bucket with lengths ``T`` (observed columns in ``base``)."""
    uniq, counts = np.unique(T, return_counts=True)
    row = {}
    for model in MODELS:
        mom = models.log_moments(model, uniq)
        row[f"log10_var_P_{model}"] = expected_sample_var(mom["mean_P"], mom["var_P"], counts) / LN10
        ln_g = expected_sample_var(mom["mean_G"], mom["var_G"], counts)
        with np.errstate(over="ignore"):  # inf beyond float64; the log10 twin stays finite
            row[f"var_G_{model}"], row[f"log10_var_G_{model}"] = float(np.exp(ln_g)), ln_g / LN10
        row[f"score_{model}"] = interval_score(
            ln_g, *(base[k] * LN10 for k in ("log10_var_G", "log10_var_G_lo", "log10_var_G_hi"))
        )
    for model in ("iid", "corr"):
        row[f"var_log_P_{model}"] = _expected_sample_var_linear(
            uniq * models.fit.mu_y, models.var_log_P(model, uniq), counts
        )
    n = counts.sum()
    row["gspo_clip_pred"] = float(np.sum(counts * models.gspo_clip("corr", uniq, g_range)) / n)
    row["gspo_clip_pred_iid"] = float(np.sum(counts * models.gspo_clip("iid", uniq, g_range)) / n)
    row["verdict"] = verdict(row["score_iid"], row["score_emp"], row["score_corr"])
    if n < MIN_BUCKET_SEQUENCES and bootstrapped:  # judged, but from too few (one sequence: no interval)
        row |= {f"score_{model}": math.nan for model in MODELS}
        row["verdict"] = TOO_FEW
    return row


def _observed_rows(sequences, edges, boot: dict) -> pd.DataFrame:
    """bucket_table (bootstrap settings ``boot``) plus log10 interval ends of Var(G)."""
    obs = bucket_table(sequences, sequences.groups, edges, **boot)
    with np.errstate(divide="ignore"):
        obs["log10_var_G_lo"] = np.log10(obs["var_G_lo"].to_numpy(float))
        obs["log10_var_G_hi"] = np.log10(obs["var_G_hi"].to_numpy(float))
    return obs


class _Folds:
    """What :func:`~variance_lab.rollouts.heldout.heldout_judgment` asks of a batch, of the summaries'."""

    def __init__(self, summaries: Summaries) -> None:
        self.summaries = summaries
        self.has_groups = summaries.source.has_groups

    def group_index(self) -> np.ndarray:
        return self.summaries.groups

    def select(self, mask) -> np.ndarray:
        return np.flatnonzero(mask)


def heldout(summaries: Summaries, edges, boot: dict, ranges: dict, *, k: int, seed, step=None) -> dict | None:
    """Run the held-out judgment (:func:`~variance_lab.rollouts.heldout.heldout_judgment`) with :func:`judge`.

    Fold ``f``'s bootstrap draws from the spawn key 50,000 + f of ``seed``; its models are fitted to
    the other folds (the summaries' set ``("rest", f)``, their samples drawn as :func:`judge` says).
    """
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)

    def judge_fold(eval_index, fit_index, f):
        if not np.array_equal(eval_index, summaries.eval_index[("fold", f)]):
            raise AssertionError("the held-out folds differ from the summaries' plan")
        fold_boot = boot | {"seed": child_seed(ss, 50_000 + f)}
        sets = summaries.eval_set(("fold", f)), summaries.fit_set(("rest", f))
        judged = judge(*sets, edges, fold_boot, ranges, fit_models=True, fits_only=True)
        return judged.table if judged.fitted else None

    return heldout_judgment(_Folds(summaries), judge_fold, k=k, seed=ss, step=step)


def group_summary(batch: TokenBatch | Summaries) -> dict:
    """How the sequences are grouped: prompts, the interval method, identical responses and a note.

    Without ``prompt_id``, sequences with the same token log-probs (identical responses, as
    GRPO groups often hold) are counted, and the note suggests the field.
    """
    if batch.has_groups:
        n_prompts = int(batch.group_index().max()) + 1
        return {
            "n_prompts": n_prompts,
            "interval_method": f"bootstrap over prompts ({n_prompts:,} prompts; responses to one prompt "
            "resampled together)",
            "n_identical": None,
            "note": "",
        }
    n_identical = batch.n_identical()
    note = ""
    if n_identical:
        note = (
            f"{n_identical:,} sequences repeat the token log-probs of another (identical responses, as in "
            "GRPO groups) and no prompt_id says which go together: the intervals treat them as independent "
            "and are too narrow. Add a prompt_id field to each record (see the guide page on groups)."
        )
    return {
        "n_prompts": None,
        "interval_method": "bootstrap over sequences (no prompt_id: sequences taken as independent)",
        "n_identical": n_identical,
        "note": note,
    }


@dataclass(frozen=True, eq=False)
class Judged:
    """The analysis table of one batch judged by models fitted on another (or the same)."""

    table: pd.DataFrame
    models: PredictionModels
    fitted: dict
    acf_note: str


def judge(
    eval_set, fit_set, edges, boot: dict, ranges: dict, *, fit_models: bool, fits_only: bool = False
) -> Judged:
    """Judge the sequences ``eval_set`` (observed values, intervals) by models fitted to ``fit_set``.

    The two are a :class:`~variance_lab.rollouts.summaries.Summaries`' sets: ``eval_set`` an
    :class:`~variance_lab.rollouts.summaries.EvalSummary`, ``fit_set`` a
    :class:`~variance_lab.rollouts.summaries.FitSummary` (the pooled fit, the autocorrelation, the
    CGF and the fit samples: the token-mixture fits ``mix``, ``comb`` see a sample of about
    ``fit_tokens`` tokens, ``hier`` one of about ``fit_sequences`` sequences,
    :func:`~variance_lab.rollouts.subsample.fit_sample`, prompts in the order of the spawn key
    70,000 of the bootstrap's seed; None: all; named in ``fitted["samples"]``). ``boot``:
    ``n_boot``, ``level``, ``seed``; ``ranges``: ``gspo_range``, ``ppo_range`` (ratios) and
    ``g_range``, ``p_range`` (their logs). ``analyze`` judges the whole batch by itself (in
    sample); the held-out judgment (:mod:`variance_lab.rollouts.heldout`) a fold by the other folds,
    with ``fits_only`` (:func:`~variance_lab.rollouts.predictions.prediction_columns`: only what the
    model choice reads is computed).
    """
    g_range, p_range = ranges["g_range"], ranges["p_range"]
    obs = _observed_rows(eval_set, edges, boot)
    fit, acf, acf_note = fit_set.fit, fit_set.acf, fit_set.acf_note
    models = PredictionModels(fit, acf, fit_set.cgf)
    lengths = eval_set.lengths
    bucket, _ = length_buckets(lengths, edges)
    ppo_pred = float(normal_outside(fit.mu_y, fit.sigma2_y, p_range))
    rows = []
    for base in obs.to_dict("records"):
        T = lengths[bucket == base["bucket"]]
        row = base | _bucket_predictions(models, T, g_range, base, bootstrapped=boot["n_boot"] > 0)
        row |= {
            "T_min": int(T.min()),
            "T_median": float(np.median(T)),
            "T_max": int(T.max()),
            "ppo_clip_pred": ppo_pred,
        }
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(ANALYSIS_COLUMNS))
    fitted = {}
    if fit_models:  # mix and hier predictions, clip intervals and the model choice (predictions.py)
        samples = fit_set.samples
        try:
            fits = fitted_models(None, samples["tokens"].batch, samples["sequences"].batch)
            fitted = dict(zip(("mix", "hier", "comb"), fits, strict=True))
            fitted["samples"] = samples
        except ValueError:  # too few sequences or tokens, or constant log-ratios: columns stay NaN
            fit_models = False
    if fit_models:
        extra = prediction_columns(
            eval_set,
            table,
            bucket,
            (fitted["mix"], fitted["hier"], fitted["comb"]),
            g_range=g_range,
            p_range=p_range,
            normal=(fit.mu_y, fit.sigma2_y),
            fits_only=fits_only,
            **boot,
        )
        table[list(PREDICTION_COLUMNS)] = extra
        fitted["best_model"], fitted["fits"] = choose_model(table)
    return Judged(table, models, fitted, acf_note)
