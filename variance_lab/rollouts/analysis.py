r"""Empirical analysis of real token log-ratios: observed variances per length bucket against predictions.

:func:`analyze` takes a :class:`~variance_lab.rollouts.batch.TokenBatch` (token log-probs of real
rollouts) and returns, per bucket of sequence lengths, the sample variances of
:math:`P_T = \prod_t r_t` and of GSPO's :math:`G_T = P_T^{1/T}` with bootstrap intervals
(:func:`~variance_lab.rollouts.statistics.bucket_variances`) beside three predictions built from the
pooled token log-ratios :math:`y_t = \log r_t`:

``iid`` (i.i.d. lognormal)
    :math:`y_t` i.i.d. :math:`N(\hat\mu_y, \hat\sigma_y^2)`, fitted to the pooled tokens, so
    :math:`\log P_T \sim N(T\hat\mu_y, T\hat\sigma_y^2)`. This is the lognormal family with
    :math:`\mu = e^{\mu_y + \sigma_y^2/2}`, :math:`\sigma^2 = \mu^2(e^{\sigma_y^2} - 1)`.
``emp`` (exact i.i.d. for the empirical distribution)
    :math:`y_t` i.i.d. from the empirical distribution of the pooled :math:`y_i`, whose
    cumulant generating function is :math:`K(s) = \log \tfrac1N\sum_i e^{s y_i}`
    (:class:`EmpiricalCGF`). Then exactly

    .. math::

        \operatorname{Var}(P_T) = e^{2TK(1)}\operatorname{expm1}\bigl(T(K(2) - 2K(1))\bigr), \qquad
        \operatorname{Var}(G_T) = e^{2TK(1/T)}\operatorname{expm1}\bigl(TK(2/T) - 2TK(1/T)\bigr).

    It keeps the skewness and tails of real log-ratios that the lognormal fit drops.
``corr`` (autocorrelation-corrected)
    :math:`\log P_T \sim N(T\hat\mu_y, V_T)` with the variance of a sum of :math:`T`
    correlated tokens, :math:`V_T = \hat\sigma_y^2\bigl[T + 2\sum_{k=1}^{\min(M,T-1)}(T-k)\hat\rho_k\bigr]`
    (:meth:`~variance_lab.rollouts.statistics.Autocorrelation.var_sum`, rescaled from the pooled
    :math:`\hat\gamma_0` to the unbiased :math:`\hat\sigma_y^2` so that ``corr`` equals
    ``iid`` exactly when every :math:`\hat\rho_k` is 0). For a Gaussian AR(1) this is the
    exact law of :math:`\log P_T` (the ``ar1`` family), about
    :math:`T\hat\sigma_y^2\hat\tau_{int}` for :math:`T \gg M`.

For a Gaussian :math:`\log P_T \sim N(m, V)` and :math:`X = P_T^a` (:math:`a = 1` for
:math:`P_T`, :math:`a = 1/T` for :math:`G_T`):
:math:`\log E[X] = am + a^2V/2` and
:math:`\operatorname{Var}(X) = e^{2am + a^2V}\operatorname{expm1}(a^2V)`.

What a bucket's prediction means. A bucket mixes lengths. Its prediction is the *expected
sample variance* of its sequences given their lengths :math:`T_1..T_n` (independent
sequences, each of its own length):

.. math::

    E[s^2] = \frac1n\sum_i \operatorname{Var}(X_{T_i}) + \frac{1}{n-1}\sum_i (m_{T_i} - \bar m)^2,
    \qquad m_T = E[X_T],\ \bar m = \tfrac1n\textstyle\sum_i m_{T_i},

computed in log space over the distinct lengths. This is exactly what the bucket's sample
variance estimates, so no representative length has to be chosen (a bucket's
:math:`\operatorname{Var}(P_T)` is dominated by its longest sequences, its
:math:`\operatorname{Var}(G_T)` by its shortest). The curves over :math:`T`
(:meth:`AnalysisResult.curves`) are the single-length predictions.

Verdict (per bucket, on :math:`\operatorname{Var}(G_T)` only: the sample variance of
:math:`P_T` is unreliable for all but small :math:`T\sigma_y^2`, see ``ess_P``). The score of
a prediction is its signed distance from the estimate in log space in units of the
interval's half-width on that side,

.. math::

    z = \frac{\log \hat v_{pred} - \log \hat v}{\log \hat v_{hi} - \log \hat v}\ (\hat v_{pred} \ge \hat v),
    \qquad
    z = \frac{\log \hat v_{pred} - \log \hat v}{\log \hat v - \log \hat v_{lo}}\ (\hat v_{pred} < \hat v),

so :math:`|z| \le 1` means inside the bootstrap interval. The predictions are taken in the
order of parsimony ``iid``, ``emp``, ``corr``; the verdict is the first that lies inside
the interval *and* is at least twice as close (``margin=2``) as every simpler one:
``"iid-lognormal"``, ``"iid-empirical"`` or ``"corrected"``; ``"none"`` if no prediction
qualifies. A simpler prediction inside the interval wins even when a later one is closer,
and a later one never wins on noise alone: for uncorrelated tokens ``corr`` and ``iid``
differ only by the noise in :math:`\hat\rho_k`, so where ``iid`` falls just outside,
``corr`` does too or is not twice as close, and the bucket says ``"none"``, never
``"corrected"``. A bucket without an interval (one sequence, or ``n_boot=0``) gets
``"n/a"``, and a bucket of fewer than :data:`MIN_BUCKET_SEQUENCES` (20) sequences gets
``"too few sequences"``: its bootstrap interval of a variance is too rough to judge by (its
numbers are still shown), and it does not vote.

The overall verdict is a vote of the buckets that have one (``"too few sequences"`` when
every bucket that could vote is too small): i.i.d. (either kind), corrected
or none, whichever most buckets say, ties going to i.i.d., then corrected (the i.i.d. label
is the more frequent of the two kinds, lognormal on ties). A vote rather than a pooled score,
since one bucket in twenty falls outside its 95 % interval anyway. The intervals are
studentized bootstraps (:func:`~variance_lab.rollouts.statistics.bucket_variances`); their
coverage is checked on synthetic batches with known answers (``tests/rollouts/test_analysis.py``,
i.i.d. lognormal and AR(1) tokens: 1,000 batches each in the slow tests).
The root mean square of each prediction's scores is reported beside it. The intervals carry
the sampling error of the bucket's sequences, not that of the fitted parameters (pooled
over all tokens, hence far smaller).

Clip fractions. Observed: GSPO's fraction of sequences with :math:`G_T` outside its range
and PPO's fraction of tokens with :math:`r_t` outside its range. Predicted, GSPO: under
``corr``, :math:`\log G_T \sim N(\hat\mu_y, V_T/T^2)`, so
:math:`P(G_T \notin (a, b)) = \Phi\bigl(\tfrac{\log a - \hat\mu_y}{\sqrt{V_T}/T}\bigr)
+ \Phi\bigl(\tfrac{\hat\mu_y - \log b}{\sqrt{V_T}/T}\bigr)`, averaged over the bucket's
sequences (``gspo_clip_pred``; ``gspo_clip_pred_iid`` with :math:`V_T = T\hat\sigma_y^2`).
Predicted, PPO: the same for one token under the fitted :math:`N(\hat\mu_y, \hat\sigma_y^2)`
(``ppo_clip_pred``, one pooled value).

Responses grouped by prompt. When the batch carries ``prompt_id`` (GRPO samples several
responses per prompt, often identical), every interval over sequences resamples prompts, a
prompt's responses together (:func:`~variance_lab.stats.cluster_counts`): the bootstrap-t
intervals of the variances (standard errors clustered by prompt), the GSPO clip fraction's
(Wilson's interval at the effective size ``n / design_effect``) and the token clip fractions'.
Each bucket reports ``n_prompts`` (prompts with a response in it: a prompt whose responses
differ in length counts in each of their buckets, the resampling unit is the prompt, the
statistic the bucket's) and ``design_effect``, the clustered variance of its GSPO clip fraction
over the i.i.d. one. Without ``prompt_id`` nothing changes, and :func:`group_summary` counts
identical responses and suggests the field. The summary's ``groups`` names the method.

Held-out judgment. With the fitted models, whether a model "fits" a bucket is judged on
prompts it was not fitted to: :math:`K`-fold by prompt (``folds``, 2 by default;
:mod:`variance_lab.rollouts.heldout`), the buckets fitted summed over folds. The best model and
the verdict printed follow that count; the in-sample count stands beside it
(``model_fits_in_sample``). A failed bootstrap-t interval (one side more than 10 times the
other, or wider than 6 decades) is not printed: its ends are NaN and ``interval_failed`` names it.

Three policies. When the batch carries the inference engine's log-probs (``rollout_logp``),
:attr:`AnalysisResult.split` holds :func:`variance_lab.rollouts.split.split_ratios`: the total
ratio pi_theta/mu_rollout split into the mismatch pi_old/mu_rollout and the update
pi_theta/pi_old, each part's statistics pooled and per bucket, and the line saying which part
dominates. Everything above describes the ratio ``ratio`` selects
(:data:`~variance_lab.rollouts.split.RATIOS`, :func:`~variance_lab.rollouts.split.ratio_batch`):
the update ratio pi_theta/pi_old by default, or the mismatch pi_old/mu_rollout or the total
pi_theta/mu_rollout (a capture of a trainer holds pi_old as both ``logp`` and ``old_logp``, so
only its mismatch varies; :func:`~variance_lab.rollouts.split.choose_ratio` picks it then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from variance_lab.progress import progress_steps
from variance_lab.provenance import one_blas_thread
from variance_lab.rollouts.batch import DroppedSequence, TokenBatch
from variance_lab.rollouts.cgf import EmpiricalCGF
from variance_lab.rollouts.judgment import (
    LN10,
    MODELS,
    PredictionModels,
    group_summary,
    heldout,
    judge,
    overall_verdict,
)
from variance_lab.rollouts.models import normal_outside
from variance_lab.rollouts.predictions import MIN_BUCKET_SEQUENCES
from variance_lab.rollouts.source import TokenSource, batch_source
from variance_lab.rollouts.split import RATIO_LABELS, SplitResult, check_ratio, ratio_batch
from variance_lab.rollouts.statistics import Autocorrelation, LogRatioFit
from variance_lab.rollouts.subsample import FIT_SEQUENCES, FIT_TOKENS
from variance_lab.rollouts.summaries import ALL, Summaries
from variance_lab.rollouts.weights import GSPO_RANGE, PPO_RANGE, log_clip_range

__all__ = ["CURVE_COLUMNS", "AnalysisResult", "analyze"]


#: Columns of :meth:`AnalysisResult.curves` (one row per T and model).
CURVE_COLUMNS = ("T", "model", "log10_var_P", "var_G", "log10_var_G")


# --------------------------------------------------------------------------------------
# the analysis
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AnalysisResult:
    r"""What :func:`analyze` found: the per-bucket table, the fit, the clip fractions, the verdict.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per non-empty length bucket, columns
        :data:`~variance_lab.rollouts.judgment.ANALYSIS_COLUMNS` (see :func:`analyze`).
    fit : LogRatioFit
        Pooled :math:`\hat\mu_y`, :math:`\hat\sigma_y^2` with standard errors.
    acf : Autocorrelation or None
        Pooled within-sequence autocorrelation (:math:`\hat\rho`, :math:`\hat\tau_{int}`);
        None when fewer than :data:`~variance_lab.rollouts.statistics.MIN_AUTOCORRELATION_PAIRS`
        pairs of counted tokens lie one position apart, or the log-ratios are constant (the
        ``corr`` columns are then NaN); ``acf_note`` says which.
    cgf : EmpiricalCGF
        The empirical distribution of the pooled token log-ratios.
    n_sequences, n_tokens : int
        Sequences and counted tokens analysed.
    dropped : tuple of DroppedSequence
        Sequences left out by the loader (``on_bad="drop"``).
    clip : dict
        Pooled clip fractions: ``gspo_obs``, ``gspo_pred`` (``corr``), ``gspo_pred_iid``,
        ``ppo_obs``, ``ppo_pred``, and the ranges ``gspo_range``, ``ppo_range``.
    verdict : str
        Overall verdict (:func:`overall_verdict`, the vote of the buckets).
    rms_scores : dict
        Root mean square score of each model over the buckets with an interval.
    level, n_boot, seed
        Bootstrap settings used.
    acf_note : str
        Why ``acf`` is None ('' when it is not).
    """

    table: pd.DataFrame
    fit: LogRatioFit
    acf: Autocorrelation | None
    cgf: EmpiricalCGF
    n_sequences: int
    n_tokens: int
    dropped: tuple[DroppedSequence, ...]
    clip: dict
    verdict: str
    rms_scores: dict
    level: float
    n_boot: int
    seed: object
    lengths: np.ndarray = field(repr=False)
    _models: PredictionModels = field(repr=False)
    acf_note: str = ""
    split: SplitResult | None = field(default=None, repr=False)
    #: The fitted models (rollouts.predictions): "mix" (MixtureFit), "hier" (RandomScaleFit), "comb"
    #: (CombinedFit, or None when the mixture has one component), the
    #: chosen model ("best_model") and each model's count of buckets fitted ("fits"), both held out
    #: when ``heldout`` is not None (then "fits_in_sample" and "best_model_in_sample" beside them);
    #: empty when not fitted.
    fitted: dict = field(default_factory=dict, repr=False)
    #: How the sequences are grouped (:func:`group_summary`).
    groups: dict = field(default_factory=dict, repr=False)
    #: The ratio the table and fits describe (:data:`~variance_lab.rollouts.split.RATIOS`).
    ratio: str = "update"
    #: What the loader said about the file (:attr:`~variance_lab.rollouts.batch.TokenBatch.notes`).
    notes: tuple = ()

    @property
    def n_dropped(self) -> int:
        """Sequences dropped by the loader."""
        return len(self.dropped)

    def curves(self, T=None) -> pd.DataFrame:
        """Single-length predictions of the three models over ``T``, tidy (:data:`CURVE_COLUMNS`).

        Parameters
        ----------
        T : array_like of int, optional
            Default: up to 64 integers spaced evenly in log from the shortest to the longest
            sequence.

        Returns
        -------
        pandas.DataFrame
            One row per (T, model), model in :data:`~variance_lab.rollouts.judgment.MODELS`
            (``corr`` omitted without an autocorrelation).
        """
        if T is None:
            T = _curve_grid(self.lengths)
        T = np.asarray(T, dtype=np.int64)
        if T.ndim != 1 or T.size == 0 or np.any(T < 1):
            raise ValueError("T must be a non-empty 1-D array of integers >= 1")
        frames = []
        for model in MODELS:
            if model == "corr" and self.acf is None:
                continue
            mom = self._models.log_moments(model, T)
            with np.errstate(over="ignore"):  # inf beyond float64; the log10 twin stays finite
                var_G = np.exp(mom["var_G"])
            frames.append(
                pd.DataFrame(
                    {
                        "T": T,
                        "model": model,
                        "log10_var_P": mom["var_P"] / LN10,
                        "var_G": var_G,
                        "log10_var_G": mom["var_G"] / LN10,
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)[list(CURVE_COLUMNS)]

    def summary(self) -> dict:
        """Fit, autocorrelation, clip fractions, dropped sequences and verdict as plain JSON-ready values."""
        f, a = self.fit, self.acf
        acf = (
            None
            if a is None
            else {
                "rho": a.rho,
                "se_rho": a.se_rho,
                "tau_int": a.tau_int,
                "se_tau_int": a.se_tau_int,
                "window": a.window,
                "window_found": a.window_found,
            }
        )
        return {
            "n_sequences": self.n_sequences,
            "n_tokens": self.n_tokens,
            "n_dropped": self.n_dropped,
            "dropped": [{"index": d.index, "id": d.id, "problem": d.reason} for d in self.dropped],
            "length_min": int(self.lengths.min()),
            "length_max": int(self.lengths.max()),
            "fit": {
                "mu_y": f.mu_y,
                "se_mu_y": f.se_mu_y,
                "sigma2_y": f.sigma2_y,
                "se_sigma2_y": f.se_sigma2_y,
                "tau_y": f.tau_y,
            },
            "autocorrelation": acf,
            "autocorrelation_note": self.acf_note,
            "clip": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.clip.items()},
            "verdict": self.verdict,
            "rms_scores": dict(self.rms_scores),
            "level": self.level,
            "n_boot": self.n_boot,
            "split": _split_summary(self.split),
            "groups": dict(self.groups),
            "ratio": self.ratio,
            "ratio_label": RATIO_LABELS[self.ratio],
            "n_buckets_judgeable": int((self.table["n_seq"] >= MIN_BUCKET_SEQUENCES).sum()),
            "notes": list(self.notes),
            **_fitted_summary(self.fitted),
        }


def _split_summary(split: SplitResult | None) -> dict | None:
    """Return the three-policy split as JSON-ready values (None without ``rollout_logp``)."""
    if split is None:
        return None
    return {
        "dominant": split.dominant,
        "line": split.line,
        "shares": dict(split.shares),
        "rows": split.table.to_dict("records"),
    }


def _rms(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.sqrt(np.mean(v * v))) if v.size else math.nan


def analyze(
    batch: TokenBatch,
    edges=None,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed=0,
    c: float = 5.0,
    gspo_range=GSPO_RANGE,
    ppo_range=PPO_RANGE,
    fit_models: bool = True,
    folds: int = 2,
    progress: bool | None = None,
    ratio: str = "update",
    fit_tokens: int | None = FIT_TOKENS,
    fit_sequences: int | None = FIT_SEQUENCES,
) -> AnalysisResult:
    r"""Per length bucket, observed Var(P_T), Var(G_T) and clip fractions against three predictions.

    See the module docstring for the three predictions (``iid``, ``emp``, ``corr``), how a
    bucket's prediction is formed (the expected sample variance given its lengths) and the
    verdict rule. The fit and the autocorrelation pool every sequence, including those
    outside the buckets' ``edges``.

    Parameters
    ----------
    batch : TokenBatch or TokenSource
        Validated token log-probs (e.g. from :func:`~variance_lab.rollouts.io.load_batch`), or a
        source read in pieces, never whole (:func:`~variance_lab.rollouts.source.open_rollouts`:
        a Parquet file); the numbers are the same.
    edges : None, "exact" or array_like of int
        Length buckets (:func:`~variance_lab.rollouts.statistics.length_buckets`; default powers of two).
    n_boot : int
        Bootstrap resamples per bucket for the intervals; 0 gives no interval and verdict ``"n/a"``.
    level : float
        Confidence level of the intervals.
    seed : int or numpy.random.SeedSequence
        Seed of the bootstrap (bucket ``j`` draws from ``SeedSequence(seed).spawn(n)[j]``).
    c : float
        Sokal's window constant of the autocorrelation times.
    gspo_range, ppo_range : tuple of float
        Clipping ranges (ratios) for the observed and predicted clip fractions.
    fit_models : bool
        Fit the ``mix``, ``hier`` and ``comb`` models (:mod:`variance_lab.rollouts.models`) and add their
        columns, the clip-fraction intervals and the model choice
        (:mod:`variance_lab.rollouts.predictions`); False leaves those columns NaN.
    folds : int
        K of the held-out judgment of the models (:mod:`variance_lab.rollouts.heldout`): prompts
        (sequences without ``prompt_id``) split at random into K folds, each fold judged by
        models fitted on the others; the best model follows it. 0 or 1: in sample only.
    progress : bool or None
        A progress bar over the fits on standard error, as :func:`variance_lab.progress.progress_bar`
        means it: None a bar after a second where someone watches (a terminal, a notebook),
        True at once, False none.
    fit_tokens, fit_sequences : int or None
        Tokens the token-mixture fits (``mix``, ``comb``) see at most, about, and sequences the
        ``hier`` fit sees: a batch with more gives them a random sample of whole prompts
        (:func:`~variance_lab.rollouts.subsample.fit_sample`, seeded from ``seed``; each held-out
        fold draws its own from the other folds), named in the summary's ``fit_sample``. Defaults
        :data:`~variance_lab.rollouts.subsample.FIT_TOKENS` (2^18) and
        :data:`~variance_lab.rollouts.subsample.FIT_SEQUENCES` (2^11); None: all.
    ratio : {"update", "mismatch", "total"}
        The ratio the table, the fits and the clip fractions describe
        (:func:`~variance_lab.rollouts.split.ratio_batch`): pi_theta/pi_old, pi_old/mu_rollout or
        pi_theta/mu_rollout (the last two need ``rollout_logp``). The three-policy split is of
        ``batch`` whichever is chosen.

    Returns
    -------
    AnalysisResult
        Its ``table`` has the columns :data:`~variance_lab.rollouts.judgment.ANALYSIS_COLUMNS`:

        ===================================  ======================================================
        bucket, T_lo, T_hi                   bucket number and its length range (inclusive)
        n_seq, T_min, T_median, T_mean,      sequences and their lengths; counted tokens
        T_max, n_tokens
        var_log_P, var_log_P_iid, _corr      sample Var(log P_T); expected under ``iid``, ``corr``
        log10_var_P, _lo, _hi, ess_P         log10 sample Var(P_T), bootstrap interval, Kong's ESS
        log10_var_P_iid, _emp, _corr         the three predictions of Var(P_T), log10
        var_G, var_G_lo, var_G_hi            sample Var(G_T) and its bootstrap interval
        log10_var_G, _lo, _hi                the same, log10
        var_G_iid, _emp, _corr (+ log10)     the three predictions of Var(G_T)
        score_iid, score_emp, score_corr     signed distance in interval half-widths (module doc)
        verdict                              one of :data:`~variance_lab.rollouts.judgment.BUCKET_VERDICTS`
        gspo_clip_frac, gspo_clip_pred,      GSPO: observed fraction of sequences clipped;
        gspo_clip_pred_iid                   predicted under ``corr`` and under ``iid``
        ppo_clip_frac, ppo_clip_pred         PPO: observed fraction of tokens clipped; predicted
        ===================================  ======================================================
    """
    g_range = log_clip_range(gspo_range, "gspo_range")
    p_range = log_clip_range(ppo_range, "ppo_range")
    if isinstance(batch, TokenSource):
        source, values = batch, None
        check_ratio(ratio, source.has_rollout)
    else:
        one = ratio_batch(batch, ratio)
        source, values = batch_source(batch), (lambda: one.log_ratio)
    if isinstance(folds, bool) or not isinstance(folds, int | np.integer) or folds < 0:
        raise ValueError(f"folds must be an integer >= 0, got {folds!r}")
    boot = {"n_boot": n_boot, "level": level, "seed": seed}  # one bootstrap for observed and predicted
    ranges = {"gspo_range": gspo_range, "ppo_range": ppo_range, "g_range": g_range, "p_range": p_range}
    n_steps = 1 + (folds if fit_models and folds > 1 else 0)
    lengths = source.lengths
    bar = progress_steps(progress, n_steps, "analyze: fitting models", unit="fit")
    with bar as step, one_blas_thread():  # the same bits on any number of cores
        summaries = Summaries(
            source,
            ratio=ratio,
            edges=edges,
            gspo_range=gspo_range,
            ppo_range=ppo_range,
            c=c,
            seed=seed,
            folds=folds,
            fit_models=fit_models,
            fit_tokens=fit_tokens,
            fit_sequences=fit_sequences,
            split=source.has_rollout,
            s_values=_curve_s(lengths),
            cgf_values=values,
        )
        everything = summaries.eval_set(ALL)
        judged = judge(everything, summaries.fit_set(ALL), edges, boot, ranges, fit_models=fit_models)
        step(1)
        table, models, fitted, fit = judged.table, judged.models, judged.fitted, judged.models.fit
        if fitted:
            fitted["fits_in_sample"] = dict(fitted["fits"])
            fitted["best_model_in_sample"] = fitted["best_model"]
            fitted["heldout"] = None
            if folds > 1:
                held = heldout(summaries, edges, boot, ranges, k=int(folds), seed=seed, step=step)
                if held is not None:
                    fitted["heldout"] = held
                    fitted["fits"], fitted["best_model"] = dict(held["fits"]), held["best_model"]
    rms = {m: _rms(table[f"score_{m}"]) for m in MODELS}
    pooled_gspo = {m: float(np.mean(models.gspo_clip(m, lengths, g_range))) for m in ("corr", "iid")}
    clip = {
        "gspo_obs": everything.gspo_clip_frac,
        "gspo_pred": pooled_gspo["corr"],
        "gspo_pred_iid": pooled_gspo["iid"],
        "ppo_obs": everything.ppo_clip_frac,
        "ppo_pred": float(normal_outside(fit.mu_y, fit.sigma2_y, p_range)),
        "gspo_range": everything.gspo_range,
        "ppo_range": everything.ppo_range,
    }
    return AnalysisResult(
        table=table,
        fit=fit,
        acf=models.acf,
        cgf=models.cgf,
        n_sequences=len(source),
        n_tokens=source.n_tokens,
        dropped=source.dropped,
        clip=clip,
        verdict=overall_verdict(table["verdict"]),
        rms_scores=rms,
        level=float(level),
        n_boot=int(n_boot),
        seed=seed,
        lengths=np.asarray(lengths),
        _models=models,
        acf_note=judged.acf_note,
        split=None if summaries.split is None else summaries.split.result(),
        fitted=fitted,
        groups=group_summary(summaries),
        ratio=ratio,
        notes=tuple(source.notes),
    )


def _curve_grid(lengths) -> np.ndarray:
    """Return :meth:`AnalysisResult.curves`' lengths by default: 64 or fewer, even in log, short to long."""
    lo, hi = int(np.min(lengths)), int(np.max(lengths))
    return np.unique(np.rint(np.geomspace(lo, hi, 64)).astype(np.int64))


def _curve_s(lengths) -> np.ndarray:
    """Where the curves ask the empirical CGF: s = 1, 2 (P_T) and 1/T, 2/T (G_T) at the default lengths."""
    a = 1.0 / _curve_grid(lengths).astype(np.float64)
    return np.concatenate([[1.0, 2.0], a, 2.0 * a])


# --------------------------------------------------------------------------------------
# the fitted models mix and hier in the summary (see rollouts.predictions)
# --------------------------------------------------------------------------------------
def _fitted_summary(fitted: dict) -> dict:
    """``models`` (fitted parameters with standard errors) and ``best_model`` for the summary."""
    if not fitted:
        return {
            "models": None,
            "best_model": None,
            "model_fits": None,
            "best_model_in_sample": None,
            "model_fits_in_sample": None,
            "heldout": None,
            "fit_sample": None,
        }
    mix, hier, comb = fitted["mix"], fitted["hier"], fitted["comb"]
    return {
        "models": {
            "mix": {
                "components": mix.components,
                "weights": mix.weights.tolist(),
                "se_weights": mix.se_weights.tolist(),
                "means": mix.means.tolist(),
                "se_means": mix.se_means.tolist(),
                "variances": mix.variances.tolist(),
                "se_variances": mix.se_variances.tolist(),
                "bic": {str(k): v for k, v in mix.bic.items()},
            },
            "hier": {
                name: getattr(hier, name)
                for name in ("c", "se_c", "alpha", "se_alpha", "theta0", "se_theta0", "beta", "se_beta", "T0")
            },
            "comb": None
            if comb is None
            else {
                **{
                    name: getattr(comb, name)
                    for name in ("a", "se_a", "b", "se_b", "tau", "se_tau", "converged")
                },
                **{
                    f"{part}_{k}": getattr(comb, f"{part}_{k}").tolist()
                    for part in ("narrow", "sparse")
                    for k in ("weights", "means", "variances")
                },
            },
        },
        "best_model": fitted["best_model"],
        "model_fits": dict(fitted["fits"]),
        "best_model_in_sample": fitted.get("best_model_in_sample", fitted["best_model"]),
        "model_fits_in_sample": dict(fitted.get("fits_in_sample", fitted["fits"])),
        "heldout": None
        if not fitted.get("heldout")
        else {k: v for k, v in fitted["heldout"].items() if k != "folds"}
        | {"folds": fitted["heldout"]["folds"]},
        "fit_sample": {by: s.summary() for by, s in fitted["samples"].items()}
        if "samples" in fitted
        else None,
    }
