"""The catalog of the paper's figures: their names, parameters and captions.

Figures (:data:`FIGURES`):

``variance_vs_T``
    Var(P_T) and Var(G_T) against T: exact and Monte Carlo, and the Var(G_T)
    approximations of the derivation as ratios to the exact value.
``ratio_vs_T``
    Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1.
``heatmap_var_P``, ``heatmap_var_G``
    Var(P_T) and Var(G_T) over mu x sigma^2 at one T, contours, mu = 1 and sigma^2 = 1 - mu^2 marked.
``decay_boundary``
    Var(P_100)/Var(P_10) over mu x sigma^2: where Var(P_T) grows or decays (sigma^2 = 1 - mu^2).
``approx_error``
    Relative error of the Var(G_T) approximations, per family, against T.
``mc_frontier``
    Largest T at which n draws estimate Var(P_T) to 10 %, against n (theory).
``ess_vs_T``
    Kong's ESS fraction of P_T against T: exact and Monte Carlo.
``log_histograms``
    Histograms of log P_T and log G_T at a few T, from raw draws (:func:`sample_log_P`).

``corrections_vs_T``
    Relative bias and ESS fraction of TIS, masks and clips against T: lognormal closed
    forms (:func:`variance_lab.corrections.theory`) and Monte Carlo
    (:func:`variance_lab.corrections.simulate_corrections`); below, the bfloat16 experiment's
    measured points per length bucket (``data``, with bootstrap intervals) against the
    lognormal fitted to its log-ratios.
``clip_fractions``
    Observed against predicted GSPO, PPO and GMPO clip fractions per length bucket of the shipped
    data set (``data/arith_rollouts.jsonl.gz``), one marker per model of
    :func:`variance_lab.rollouts.analysis.analyze` (:func:`clip_frame`,

``thresholds``
    Where CTPO's and M2PO's thresholds bind (lognormal ratios): (a) the fraction of tokens
    ``ctpo:EL:EH`` clips at each position, closed form (:func:`variance_lab.corrections.ctpo_positions`)
    and Monte Carlo (:func:`variance_lab.corrections.simulate_positions`); (b) the fraction
    ``m2po`` masks against its threshold, the large-batch limit and Monte Carlo per batch size.
``prob_masks``
    Where the probability-aware masks bind (:func:`variance_lab.paper.probmask_frame.prob_mask_frame`):
    (a) DPPO's and KPop's masked fraction at a fixed sampler probability of the token, quadrature and
    Monte Carlo; (b, c) a shipped SmolLM2 file's masked fractions per bin of that probability and
    of the entropy, ratio masks beside them; (d) CPPO's masked fraction against T (Monte Carlo)
    beside its exact references (:func:`variance_lab.paper.probmask_frame.cppo_rows`).

``sign_weights``, ``vcpo_ess``, ``speed_bounds``
    The 2025-26 methods (:mod:`variance_lab.paper.method_frames`): bias and variance of TOPR, OPSM
    and ASPO by the advantage's sign; VCPO's ESS ratio by staleness and family, and its baseline's
    gain on the shipped runs; the bounds of "When Speed Kills Stability" beside the exact values.

``experiment_variance`` (:data:`EXPERIMENT_FIGURE`) is the analysis of the shipped experiment
data (:mod:`variance_lab.experiment.figure`), with its own data set and sidecar format;
:data:`ALL_FIGURES` (from :mod:`variance_lab.paper.names`, light to import) is every figure
``variance-lab figures`` writes: :data:`FIGURES`, then :data:`EXPERIMENT_FIGURE`. The data of each figure
come from :mod:`variance_lab.paper.frames`; :mod:`variance_lab.paper.pipeline` draws and writes them.
"""

from __future__ import annotations

import numpy as np

from variance_lab.experiment.names import FIGURE_NAME
from variance_lab.paper.names import ALL_FIGURES
from variance_lab.sweep.grid import parse_grid

__all__ = ["ALL_FIGURES", "EXPERIMENT_FIGURE", "FIGURES", "caption", "default_params"]


def _ints(text: str) -> list[int]:
    return [int(t) for t in parse_grid(text, integer=True)]


def _floats(text: str) -> list[float]:
    return [float(v) for v in parse_grid(text)]


# --------------------------------------------------------------------------- parameters
def _defaults(quick: bool) -> dict[str, dict]:
    T_line = _ints("1:1000:log12" if quick else "1:1000:log40")
    n_mc = 2000 if quick else 100_000
    base = {"family": "lognormal", "mu": 1.0, "sigma2": 0.1}
    return {
        "variance_vs_T": {
            **base,
            "T": T_line,
            "n": n_mc,
            "seed": 0,
            "ci": 0.95,
            "mc_T": [1, 10, 100, 1000] if quick else [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
        },
        "ratio_vs_T": {"family": "lognormal", "mu": [0.9, 1.0, 1.1], "sigma2": 0.1, "T": T_line},
        "heatmap_var_P": {
            "family": "lognormal",
            "statistic": "var_P",
            "T": 100,
            "mu": _floats("0.8:1.2:9" if quick else "0.8:1.2:41"),
            "sigma2": _floats("0.01:1:log7" if quick else "0.01:1:log31"),
        },
        "heatmap_var_G": {
            "family": "lognormal",
            "statistic": "var_G",
            "T": 100,
            "mu": _floats("0.8:1.2:9" if quick else "0.8:1.2:41"),
            "sigma2": _floats("0.01:1:log7" if quick else "0.01:1:log31"),
        },
        "decay_boundary": {
            "family": "lognormal",
            "T": [10, 100],
            "mu": _floats("0.5:1.2:8" if quick else "0.5:1.2:36"),
            "sigma2": _floats("0.01:1:log7" if quick else "0.01:1:log31"),
        },
        "approx_error": {
            "families": ["lognormal", "gamma", "two-point"],
            "mu": 1.0,
            "sigma2": 0.1,
            "T": _ints("1:1000:log8" if quick else "1:10000:log40"),
        },
        "mc_frontier": {
            "series": [
                ["lognormal", 1.0, 0.01],
                ["lognormal", 1.0, 0.1],
                ["lognormal", 1.0, 0.5],
                ["gamma", 1.0, 0.1],
                ["two-point", 1.0, 0.1],
            ],
            "T": _ints("1:2000:log25" if quick else "1:2000:log90"),
            "n": [float(v) for v in np.logspace(2, 12, 21 if quick else 101)],
            "target": 0.1,
        },
        "ess_vs_T": {
            "family": "lognormal",
            "mu": 1.0,
            "sigma2": [0.01, 0.1, 0.5],
            "T": T_line,
            "mc_T": [1, 10, 100, 1000] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": n_mc,
            "seed": 0,
            "ci": 0.95,
        },
        "log_histograms": {
            **base,
            "T": [1, 10, 100, 1000],
            "n": 2000 if quick else 20_000,
            "seed": 0,
            "bins": 60,
        },
        "corrections_vs_T": {
            **base,
            "corrections": ["seq-tis:3", "seq-mask:3", "geo-rs:0.9:1.1", "tis:2", "icepop:2", "gmpo"],
            "T": _ints("1:1000:log12" if quick else "1:1000:log40"),
            "mc_T": [1, 10, 100] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": 2000 if quick else 100_000,
            "seed": 0,
            "ci": 0.95,
            "data": "arith_rollouts_bf16.jsonl.gz",
            "ratio": "mismatch",
            "buckets": [8, 16, 32, 64, 128, 256],
            "data_T": _ints("8:346:log12" if quick else "8:346:log40"),
            "n_boot": 200 if quick else 2000,
        },
        "clip_fractions": {
            "data": "arith_rollouts.jsonl.gz",  # in data/ of the source tree (clip_frame)
            "n_boot": 200 if quick else 1000,
            "seed": 0,
            "level": 0.95,
        },
        "thresholds": {
            **base,
            "ctpo": ["ctpo:0.5:0.5", "ctpo:1:1", "ctpo:0.25:1"],
            "t": _ints("1:1000:log12" if quick else "1:1000:log40"),
            "mc_t": [1, 10, 100, 1000] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": 2000 if quick else 20_000,
            "tau": _floats("0.003:0.2:log9" if quick else "0.003:0.2:log41"),
            "mc_tau": [0.005, 0.02, 0.08] if quick else [0.005, 0.01, 0.02, 0.04, 0.08],
            "batches": [16, 256],
            "m2po_n": 4096 if quick else 65536,
            "seed": 0,
            "ci": 0.95,
        },
        "prob_masks": {
            **base,
            "specs": ["dppo-tv", "dppo-kl", "kpop"],
            "q": [float(v) for v in 1 / (1 + np.exp(-np.linspace(-6.9, 6.9, 25 if quick else 81)))],
            "mc_q": [0.02, 0.2, 0.5, 0.8, 0.98],
            "n": 4000 if quick else 40_000,
            "seed": 0,
            "ci": 0.95,
            "data": "smollm2/smollm2_mismatch_top-p.jsonl.gz",  # in data/ of the source tree
            "ratio": "total",
            "data_specs": ["dppo-tv", "dppo-kl", "kpop", "icepop"],
            "p_edges": [0.0, 0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0],
            "entropy_edges": [0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0, 12.0],
            "cppo_spec": "cppo",
            "cppo_sigma2": [0.1, 0.5],
            "cppo_token_prob": [0.2, 0.6],  # Beta(a, b), the token-probability model's default
            "cppo_T": [1, 2, 3, 5, 10, 30, 100] if quick else [1, 2, 3, 5, 10, 30, 100, 1000],
            "cppo_mc_T": [1, 10, 100] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "cppo_tokens": 20_000 if quick else 400_000,  # per Monte Carlo point: ceil(N / T) sequences
        },
        **_method_defaults(quick, T_line),
    }


def _method_defaults(quick: bool, T_line: list[int]) -> dict[str, dict]:
    """Parameters of the 2025-26 methods' figures (:mod:`variance_lab.paper.method_frames`)."""
    mix = {"components": "0.98:-0.0005:0.001,0.02:-0.25:0.5"}  # mean-one states: 2 % of tokens v = 0.5
    return {
        "sign_weights": {
            "family": "lognormal",
            "mu": 1.0,
            "sigma2": 0.1,
            "specs": ["topr", "opsm:0.05", "aspo"],
            "T": T_line,
            "mc_T": [1, 10, 100] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": 2000 if quick else 20_000,
            "seed": 0,
            "ci": 0.95,
            "data": "smollm2_stale_gspo.jsonl.gz",  # in data/smollm2/ of the source tree
            "ratio": "update",
        },
        "vcpo_ess": {
            "family": "lognormal",
            "mu": 1.0,
            "sigma2": 1e-3,
            "lags": [1, 2, 4, 8],
            "T": T_line,
            "mc_T": [100, 1000] if quick else [10, 100, 300, 1000],
            "N": 64,
            "batches": 200 if quick else 2000,
            "seed": 1,
            "ci": 0.95,
            "families": [
                ["lognormal", 1.0, 1e-3],
                ["gamma", 1.0, 1e-3],
                ["two-point", 1.0, 1e-3],
                ["ar1", 1.0, 1e-3, {"rho": 0.5}],
                ["random-scale", 1.0, 1e-3, {"alpha": 2.0}],
                ["lognormal-mixture", None, None, {"components": "0.99:-0.0002:0.0004,0.01:-0.03:0.06"}],
            ],
            "data": [
                f"smollm2_{run}.jsonl.gz"
                for run in ("onpolicy_gspo", "mismatch_bf16", "mismatch_fp16", "mismatch_top-p")
            ],
        },
        "speed_bounds": {
            "families": [
                ["lognormal", 1.0, 1e-3],
                ["lognormal", 1.0, 1e-2],
                ["lognormal", 1.0, 0.1],
                ["lognormal-mixture", None, None, mix],
            ],
            "T": T_line,
            "n": [float(v) for v in np.logspace(1, 6, 6 if quick else 26)],
            "T_max": 3000 if quick else 10_000,
        },
    }


FIGURES = tuple(_defaults(True))


def default_params(name: str, *, quick: bool = False) -> dict:
    """Return the parameters of figure ``name`` (``quick``: small grids and few draws)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    params = _defaults(quick)[name]
    return params


#: The analysis of the shipped experiment data (variance_lab.experiment.figure), which has
#: its own data set and sidecar format.
EXPERIMENT_FIGURE = FIGURE_NAME


def caption(name: str) -> str:
    """Return the one-line caption of figure ``name`` (one of :data:`FIGURES`), as its sidecar records it."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    return getattr(_Captions, name)


class _Captions:
    """One-line captions, stored in each sidecar (:func:`caption`)."""

    variance_vs_T = (
        "(a) Var(P_T) and (b) Var(G_T) against T: exact lines and Monte Carlo estimates with 95 % "
        "confidence intervals (filled: reliable; half filled: flagged marginal, a sound value whose "
        "interval may cover less than 95 %; hollow: flagged unreliable, fewer draws than a 10 % relative "
        "error needs, so even a point on the line does not confirm it); (c) the Var(G_T) approximations "
        "of the derivation (lognormal, its small-x form, the naive sigma^2/T of its table) and Monte "
        "Carlo as ratios to the exact Var(G_T)."
    )
    ratio_vs_T = "Exact Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1; lower panel: T <= 50."
    heatmap_var_P = (
        "Exact Var(P_T) over mu x sigma^2 at one T, colour in decades with labelled contours; dashed: "
        "mu = 1; red: sigma^2 = 1 - mu^2, below which (mu < 1) Var(P_T) decays."
    )
    heatmap_var_G = (
        "Exact Var(G_T) over mu x sigma^2 at one T, colour in decades with labelled contours (its own "
        "colour bar); dashed: mu = 1; red: sigma^2 = 1 - mu^2."
    )
    decay_boundary = (
        "Var(P_T2)/Var(P_T1) over mu x sigma^2 (exact): growth (orange) or decay (purple) of Var(P_T); "
        "black contour: no change; red: sigma^2 = 1 - mu^2, the exact boundary, not mu = 1."
    )
    approx_error = (
        "|approximation/exact - 1| of Var(G_T): the lognormal approximation, its small-x form and "
        "the naive sigma^2/T of the derivation's table, per family; values below 1e-12 drawn at 1e-12 "
        "(exact)."
    )
    mc_frontier = (
        "Largest T at which n plain Monte Carlo draws estimate Var(P_T) to the target relative error "
        "(theory: n_needed_P, interpolated in log10 between grid lengths)."
    )
    ess_vs_T = (
        "Kong's ESS fraction of the weights P_T against T: exact lines and Monte Carlo estimates "
        "(hollow: flagged unreliable); dashed: 1/n, one draw holding all the weight."
    )
    log_histograms = "Histograms of log P_T and log G_T = log P_T / T at a few T, from raw draws."
    corrections_vs_T = (
        "Relative bias E[w]/E[b] - 1 (w: a correction's weight; b: the uncorrected weight it acts on, P_T, "
        "or G_T for GMPO, or r_t for the token-level TIS and IcePop) and ESS fraction E[w]^2/E[w^2] of "
        "sequence- and token-level corrections (TIS, masks, Geo-RS, IcePop, GMPO) against T: (a, b) "
        "lognormal closed forms (lines) and Monte Carlo (filled points with 95 % intervals; hollow: "
        "flagged unreliable); (c, d) the bfloat16 experiment's mismatch ratio per length bucket "
        "(half-filled points at the median length, 95 % bootstrap intervals over prompts, a prompt's "
        "responses resampled together) against the "
        "lognormal fitted to its pooled token log-ratios (lines)."
    )
    clip_fractions = (
        "Observed against predicted clip fractions per length bucket of the shipped arithmetic-task "
        "rollouts (data/arith_rollouts.jsonl.gz), one panel per kind of clip: GSPO's fraction of sequences "
        "with G_T outside its range (linear axes), PPO's fraction of tokens outside its range and GMPO's "
        "fraction of tokens whose log-ratio lies outside its clip (log axes); horizontal bars: the "
        "observed fraction's 95 % interval as the analysis computes it (clustered by prompt: for GSPO "
        "Wilson's at the effective size n / design effect, for PPO and GMPO a bootstrap over prompts). "
        "Buckets are numbered on each "
        "panel's top edge over their observed fraction, and the title gives each number's range of "
        "lengths. One hollow marker per model of the analysis (i.i.d. lognormal, i.i.d. empirical, "
        "autocorrelation-corrected, mix (token mixture), hier (random scale), comb (combined), and any other "
        "it has), "
        "largest first so that coincident markers nest; equal predictions share one marker. The i.i.d. "
        "empirical GSPO prediction resamples tokens from their pooled law, as experiment_variance draws "
        "it. Values below a log panel's floor are drawn on its edge and listed in a note; grey: "
        "predicted = observed."
    )
    sign_weights = (
        "Weights that depend on the sign of the sequence's advantage A: TOPR (topr: 1 when A >= 0, "
        "min(P_T, 1) when A < 0), DeepSeek-V3.2's off-policy mask (opsm:0.05: P_T, 0 when A < 0 and the "
        "mean of -log r exceeds 0.05) and ASPO (aspo, per token: 1/r on [1/3, 1.2] when A >= 0, r on "
        "[0.8, 3] when A < 0, 3 beyond 1/3 or 3, 0 beyond the clip); solid: A < 0, dashed: A >= 0. "
        "(a) bias E[w] - E[X] (X = P_T, or r for ASPO) and (b) Var(w) against T for lognormal token "
        "ratios: closed forms (lines; a weight with zero variance is left out of the log axis) and Monte "
        "Carlo (points with 95 % intervals; hollow: flagged unreliable); (c) the bias by sign on the "
        "update ratio pi_theta/pi_old of the shipped stale-GSPO SmolLM2 run with each record's group "
        "advantage (A = 0 counted positive); bars: the 95 % bootstrap interval of E[w] over prompts, less "
        "the observed mean of X (which has no interval of its own here)."
    )
    vcpo_ess = (
        "VCPO's effective-sample-size ratio rho_k(T) = (E[P_T]^2/E[P_T^2])^k, whose square root scales "
        "its learning rate: (a) lognormal token ratios by staleness k (k independent copies of the "
        "sequence weight), exact lines and the mean of the minibatch ratio over minibatches of N = 64 "
        "sequences (points with 95 % intervals: a minibatch overstates the ESS); (b) by ratio law at "
        "lag 1, every family at mu = 1, sigma^2 = 1e-3 (the mixture's components mean-one); (c) the gain "
        "of VCPO's minimum-variance baseline over the group mean of the rewards on four shipped SmolLM2 "
        "runs (update weights, ||g||^2 = 1)."
    )
    speed_bounds = (
        "The bounds of 'When Speed Kills Stability' (part 2, its source at 9a0a58c; the constants its "
        "derivations write out, per-token score and reward bounded by 1) beside the exact values, for "
        "mean-one lognormal states and a two-state mixture (2 % of tokens with log-ratio variance 0.5): "
        "(a) token-level IS's largest bias B_T = sum_{k<T} E|P_k - 1| (solid) against 2 T^2 Delta_max "
        "(dashed); (b) Var(P_T) against (1 + chi2_max)^T - 1 (equal for one state); (c) bound / exact of "
        "both; (d) the length from which sequence-level IS's standard error over n sequences, "
        "T sqrt(Var(P_T)/n), stays above B_T, exact (solid) and as the two bounds say (dashed)."
    )
    thresholds = (
        "Where CTPO's and M2PO's thresholds bind, lognormal token ratios: (a) the fraction of tokens "
        "ctpo:EL:EH clips at position t (its cumulative log-ratio L_t outside [-EL sqrt t, EH sqrt t]): "
        "closed-form lines and Monte Carlo points with 95 % Wilson intervals; crosses: the first t at which "
        "half the tokens are clipped there; (b) the fraction of tokens M2PO masks against its threshold "
        "tau: the large-batch limit P(y^2 > q), E[y^2 | y^2 <= q] = tau (line), and Monte Carlo per batch "
        "of B one-token sequences with 95 % intervals over batches (filled: reliable; hollow: flagged)."
    )
    prob_masks = (
        "Where DPPO's, KPop's and CPPO's probability-aware masks bind: (a) the fraction of tokens masked "
        "at a fixed sampler probability q of the token (log-odds shift logit pi - logit q ~ the "
        "lognormal family's log-ratio, independent of q): quadrature lines, DPPO by the sign of the "
        "advantage (A > 0 masks pi - q, or the binary KL, above the threshold; A <= 0 below), and Monte "
        "Carlo points with 95 % intervals (filled: reliable; hollow: flagged); (b) the fraction of a "
        "shipped SmolLM2 file's tokens masked per bin of the sampler's probability p and (c) per bin of "
        "the entropy, each point the bin's mean with a 95 % bootstrap interval over prompts, DPPO with "
        "each sequence's own advantage, and IcePop's ratio mask [0.5, 5] beside them; (d) the fraction "
        "of tokens CPPO masks against the sequence length T, the shift at a few sigma^2 and the "
        "sampler's probability q ~ Beta(a, b): Monte Carlo points with 95 % intervals over the sequences "
        "(each point ceil(N / T) sequences of length T), its exact references as lines (dashed: the "
        "threshold delta / w_t alone, a lower bound at every T and equal to CPPO at T = 1; dotted: the "
        "limit as T grows, every token that moves away when the budget binds for good, the threshold "
        "alone otherwise) and DPPO-TV at the same delta (dash-dotted)."
    )
