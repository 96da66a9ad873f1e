r"""Corrections on measured token log-ratios: observed fractions, intervals and bootstraps.

:func:`evaluate` applies the corrections per length bucket with intervals of the modified
fractions (and a fitted model's predictions beside them), :func:`bucket_bootstrap` the relative
bias and ESS fraction per bucket with bootstrap intervals, :func:`fit_lognormal` the lognormal
family fitted to the log-ratios.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from variance_lab._validate import check_n, check_seed
from variance_lab.corrections.closed_forms import WEIGHT_COLUMNS, theory
from variance_lab.corrections.prefix import clip_probability
from variance_lab.corrections.probmask import apply_prob, logit_shift
from variance_lab.corrections.sign import apply_signed, is_positive, sign_label, signs
from variance_lab.corrections.specs import parse_list
from variance_lab.corrections.tokenprob import mask_given_q
from variance_lab.corrections.weights import apply_sequence, apply_tokens, log_base_tokens
from variance_lab.families import LogNormal
from variance_lab.stats import (
    bootstrap_ratio,
    ess_fraction,
    proportion_interval,
    resample,
    wilson_interval,
    z_value,
)

__all__ = [
    "BOOTSTRAP_COLUMNS",
    "CORRECTIONS_PREDICTION_COLUMNS",
    "DATA_COLUMNS",
    "N_BOOT",
    "bucket_bootstrap",
    "check_advantages",
    "check_log_mu",
    "check_rollout_arrays",
    "evaluate",
    "expected_masked",
    "fit_lognormal",
    "fraction_interval",
]

#: Columns of :func:`evaluate` (corrections on measured token log-ratios).
DATA_COLUMNS = (
    "T",
    "correction",
    "level",
    "n_seq",
    "mean_w",
    "mean_w_lo",
    "mean_w_hi",
    *WEIGHT_COLUMNS,
    "frac_modified_lo",
    "frac_modified_hi",
)

#: Columns :func:`evaluate` adds with ``predict=``: the model's modified fraction and whether it
#: lies inside the observed interval.
CORRECTIONS_PREDICTION_COLUMNS = ("pred_frac_modified", "pred_inside")

#: Bootstrap replicates of the token-level modified fraction's interval (:func:`evaluate`).
N_BOOT = 2000


def fit_lognormal(log_r) -> LogNormal:
    r"""Fit the lognormal family to measured token log-ratios: their pooled mean and unbiased variance.

    :math:`\log r \sim N(\bar y, s_y^2)`: :math:`\mu = e^{\bar y + s_y^2/2}`,
    :math:`\sigma^2 = \mu^2(e^{s_y^2} - 1)`.
    """
    y = np.asarray(log_r, dtype=float).ravel()
    if y.size < 2 or not np.all(np.isfinite(y)):
        raise ValueError(f"fit_lognormal needs >= 2 finite log-ratios, got {y.size}")
    m, v = float(y.mean()), float(y.var(ddof=1))
    mu = math.exp(m + v / 2)
    return LogNormal(mu, mu * mu * math.expm1(v))


def check_rollout_arrays(log_r, offsets) -> tuple[np.ndarray, np.ndarray]:
    """``log_r`` as finite floats and ``offsets`` as rising int64 bounds, or ``ValueError``."""
    log_r = np.asarray(log_r, dtype=float)
    off = np.asarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or off[-1] != log_r.size or np.any(np.diff(off) < 1):
        raise ValueError("offsets must rise from 0 to len(log_r) in steps >= 1 (one sequence each)")
    if not np.all(np.isfinite(log_r)):
        raise ValueError("log_r holds non-finite values")
    return log_r, off


def check_advantages(advantages, cs, n: int):
    """Each sequence's advantage as floats (None when no spec needs it), or ``ValueError``."""
    signed = [c.spec for c in cs if c.signed]
    if advantages is None:
        if signed:
            raise ValueError(f"{signed[0]!r} needs each sequence's advantage: pass advantages=")
        return None
    adv = np.asarray(advantages, dtype=float)
    if adv.shape != (n,):
        raise ValueError(f"advantages must hold one value per sequence ({n}), got shape {adv.shape}")
    if not np.all(np.isfinite(adv)):
        raise ValueError(f"advantages holds a non-finite value: {adv[~np.isfinite(adv)][0]!r}")
    return adv


def check_log_mu(log_mu, cs, n_tokens: int):
    """Return the sampler's token log-probs as floats (None when no spec reads them), or ``ValueError``."""
    prob = [c.spec for c in cs if c.prob]
    if log_mu is None:
        if prob:
            raise ValueError(
                f"{prob[0]!r} masks by the token's probabilities: pass log_mu= (the sampler's log-probs)"
            )
        return None
    lm = np.asarray(log_mu, dtype=float)
    if lm.shape != (n_tokens,):
        raise ValueError(f"log_mu must hold one log-prob per token ({n_tokens}), got shape {lm.shape}")
    bad = ~(np.isfinite(lm) & (lm <= 0))
    if bad.any():
        raise ValueError(f"log_mu holds a value that is not a finite log-prob <= 0: {lm[bad][0]!r}")
    return lm


def evaluate(
    log_r,
    offsets,
    corrections,
    *,
    buckets=None,
    ci: float = 0.95,
    predict=None,
    seed: int = 0,
    groups=None,
    advantages=None,
    log_mu=None,
    shift_model=None,
) -> pd.DataFrame:
    r"""Apply the corrections to measured token log-ratios, per length bucket.

    Parameters
    ----------
    log_r : array_like of float
        Token log-ratios of all sequences, concatenated (for example
        ``old_logp - rollout_logp`` for the mismatch, ``logp - old_logp`` for the update).
    offsets : array_like of int
        Sequence boundaries: sequence ``i`` is ``log_r[offsets[i]:offsets[i+1]]`` (length >= 1).
    corrections : str or list
        ``ctpo`` compares each token's prefix sum within its sequence with its position's
        bounds (the base weight is the prefix product); ``m2po`` masks over batches of ``B``
        consecutive sequences of the file (its spec's batch; the last may be smaller), before
        the sequences are bucketed.
    buckets : list of (int, int), optional
        Inclusive length ranges; default one bucket with every sequence.
    ci : float
    predict : Family, optional
        A model with a :func:`theory` (for example :func:`fit_lognormal` of the same log-ratios):
        adds :data:`CORRECTIONS_PREDICTION_COLUMNS`, its ``frac_modified`` for the bucket (sequence level:
        the mean over the bucket's sequences of the prediction at each one's length; token
        level and GMPO: per token, which for these models does not depend on T, except for
        ``ctpo``, whose predicted clipped tokens :math:`\sum_{t \le L} p_t` are summed over the
        bucket's sequences and divided by its tokens; NaN where the model has no theory for a
        spec) and whether it lies inside ``[frac_modified_lo, frac_modified_hi]``.
    seed : int
        Root seed of the bootstrap (token-level intervals).
    groups : array_like, optional
        The prompt of each sequence (responses to one prompt are not independent): every
        interval then resamples prompts, keeping a prompt's responses together
        (:func:`variance_lab.stats.cluster_ratio`).
    advantages : array_like of float, optional
        Each sequence's advantage; needed by the sign-dependent specs (``topr``, ``opsm``,
        ``aspo``: each token takes its sequence's sign), which then give three rows per bucket
        (every sequence, :math:`A \ge 0`, :math:`A < 0`, labelled by
        :func:`~variance_lab.corrections.sign.sign_label`; a sign with no sequence in the bucket
        has no row), the sign of each sequence its own. Their prediction is the model's by sign at
        each sequence's length and sign. DPPO (``dppo-tv``, ``dppo-kl``) is sign-dependent too,
        token by token, with rows ``A>0`` and ``A<=0`` (a zero advantage counts negative).
    log_mu : array_like of float, optional
        The sampler's log-prob of each token (the log-ratio's denominator, e.g. ``rollout_logp`` for
        the mismatch); needed by the probability-aware masks (``dppo-tv``, ``dppo-kl``, ``kpop``,
        :mod:`variance_lab.corrections.probmask`, with the sources' guards). Their prediction (with
        ``predict``) is not ``predict``'s: it is the model of :mod:`~variance_lab.corrections.tokenprob`
        with the lognormal fitted to the tokens' log-odds shifts :math:`\operatorname{logit}\pi -
        \operatorname{logit}\mu` (:func:`fit_lognormal`; tokens with a probability of exactly 1
        left out of the fit, and predicted never masked), at each token's own probability and sign.
        ``cppo`` (CPPO's position-weighted, cumulative-prefix mask) reads each sequence's tokens in
        order and needs the advantages; it has no prediction (NaN).
    shift_model : LogNormal or LognormalMixture, optional
        That model's law of the log-odds shifts instead of the fitted lognormal (the command line
        fits a mixture to them with ``--predict mixture``).

    Returns
    -------
    pandas.DataFrame
        One row per (bucket, correction), columns :data:`DATA_COLUMNS` plus ``T_min``,
        ``T_max`` (the bucket's lengths; ``T`` is its median length). Sequence-level weights
        are per sequence; token-level ones per token (a ratio estimator over the per-sequence
        sums); GMPO per sequence. ``mean_w_lo``/``_hi``: a percentile bootstrap interval of the
        mean weight (:data:`N_BOOT` resamples of the sequences, or of the prompts with
        ``groups``), which stays within the weights' range, so never below 0. ``frac_modified_lo``/``_hi``:
        a ``ci`` interval of the modified fraction: for a sequence-level correction Wilson's
        score interval (without ``groups``) or Wilson's at the effective size ``n / design
        effect`` from a bootstrap over prompts; a percentile bootstrap over sequences (or
        prompts; tokens of one sequence kept together) for a token-level one and GMPO, except
        that a bucket with no modified token gets Wilson's ``[0, z^2 / (n + z^2)]``, ``n`` its
        prompts (sequences without ``groups``), not the bootstrap's ``[0, 0]``.
    """
    log_r, off = check_rollout_arrays(log_r, offsets)
    cs = parse_list(corrections)
    z = z_value(ci)
    seed = check_seed(seed)
    lengths = np.diff(off)
    if buckets is None:
        buckets = [(int(lengths.min()), int(lengths.max()))]
    log_p = np.add.reduceat(log_r, off[:-1])
    adv = check_advantages(advantages, cs, lengths.size)
    lm = check_log_mu(log_mu, cs, log_r.size)
    prob = {c.spec: _prob_tokens(c, log_r, lm, adv, off) for c in cs if c.prob}
    pred = (
        _predictions(predict, cs, lengths, adv, prob, off, log_r, shift_model)
        if predict is not None
        else None
    )
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != lengths.shape:
            raise ValueError(
                f"groups must hold one prompt per sequence ({lengths.size}), got shape {groups.shape}"
            )
    rows = []
    for index, (lo, hi) in enumerate(buckets):
        sel = (lengths >= lo) & (lengths <= hi)
        if not sel.any():
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))
        for c, label, part in _parts(cs, sel, adv):
            row = _data_row(c, log_r, off, lengths, log_p, part, z, rng, ci, groups, adv, prob.get(c.spec))
            row["correction"] = label
            if pred is not None:  # expected modified sequences (sequence level) or tokens, per sequence
                e = pred[label][part]
                p = float(np.mean(e)) if c.level == "sequence" else float(e.sum() / lengths[part].sum())
                row["pred_frac_modified"] = p
                row["pred_inside"] = bool(row["frac_modified_lo"] <= p <= row["frac_modified_hi"])
            rows.append({**row, "T_min": lo, "T_max": hi})
    extra = list(CORRECTIONS_PREDICTION_COLUMNS) if pred is not None else []
    return pd.DataFrame(rows, columns=[*DATA_COLUMNS, "T_min", "T_max", *extra])


#: Columns of :func:`bucket_bootstrap`.
BOOTSTRAP_COLUMNS = (
    "T",
    "T_min",
    "T_max",
    "correction",
    "n_seq",
    "rel_bias",
    "rel_bias_lo",
    "rel_bias_hi",
    "ess_frac",
    "ess_frac_lo",
    "ess_frac_hi",
)


def bucket_bootstrap(
    log_r, offsets, corrections, buckets, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None
) -> pd.DataFrame:
    r"""Relative bias and ESS fraction of each correction per length bucket, with bootstrap intervals.

    In a bucket, with :math:`w` the corrected and :math:`b` the uncorrected weights (per
    sequence for sequence-level corrections and GMPO, per token for token-level ones, as in
    :func:`evaluate`): ``rel_bias`` :math:`= \sum w / \sum b - 1` and ``ess_frac``
    :math:`= (\sum w)^2 / (N \sum w^2)` over its :math:`N` weights. The ``ci`` intervals are
    percentile bootstraps over sequences (``n_boot`` resamples of the bucket's sequences, the
    tokens of one sequence kept together), from ``SeedSequence(seed, spawn_key=(bucket,))``.

    Parameters
    ----------
    log_r, offsets, corrections
        As for :func:`evaluate`.
    buckets : list of (int, int)
        Inclusive length ranges; empty buckets are left out.
    n_boot : int
    ci : float
    seed : int
    groups : array_like, optional
        The prompt of each sequence: the resamples then draw the bucket's prompts, each with
        all of its responses in the bucket (:func:`variance_lab.stats.cluster_counts`).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`BOOTSTRAP_COLUMNS`; ``T`` is the bucket's median length.
    """
    log_r, off = check_rollout_arrays(log_r, offsets)
    cs = parse_list(corrections)
    prob = [c.spec for c in cs if c.prob]
    if prob:
        raise ValueError(f"bucket_bootstrap has no token probabilities: {prob[0]!r} needs evaluate(log_mu=)")
    n_boot = check_n(n_boot, minimum=1)
    seed = check_seed(seed)
    z_value(ci)
    lengths = np.diff(off)
    log_p = np.add.reduceat(log_r, off[:-1])
    sums = {}
    for c in cs:  # per sequence: (sum w, sum w^2, sum b, number of weights)
        if c.level == "sequence" or c.kind == "gmpo":
            if c.level == "sequence":
                w, _ = apply_sequence(c, log_p, lengths)
            else:
                zt, _ = apply_tokens(c, log_r)
                w = np.exp(np.add.reduceat(zt, off[:-1]) / lengths)
            b = np.exp(log_p / lengths) if c.base == "G" else np.exp(log_p)
            sums[c.spec] = (w, w * w, b, np.ones_like(w))
        else:
            wt, _ = apply_tokens(c, log_r, off)
            base = np.exp(log_base_tokens(c, log_r, off))
            red = [np.add.reduceat(x, off[:-1]) for x in (wt, wt * wt, base)]
            sums[c.spec] = (*red, lengths.astype(float))
    rows = []
    q = [(1 - ci) / 2, (1 + ci) / 2]
    for index, (lo, hi) in enumerate(buckets):
        sel = np.flatnonzero((lengths >= lo) & (lengths <= hi))
        if not sel.size:
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))
        res = resample(sel.size, n_boot, rng, None if groups is None else np.asarray(groups)[sel])

        def resum(x, res=res, sel=sel):
            return res.sums(x[sel])

        for c in cs:
            w1, w2, b, k = sums[c.spec]
            with np.errstate(divide="ignore", invalid="ignore"):
                rb = w1[sel].sum() / b[sel].sum() - 1
                ess = w1[sel].sum() ** 2 / (k[sel].sum() * w2[sel].sum())
                rb_boot = resum(w1) / resum(b) - 1
                ess_boot = resum(w1) ** 2 / (resum(k) * resum(w2))
            rb_lo, rb_hi = np.nanquantile(rb_boot, q) if np.isfinite(rb_boot).any() else (math.nan,) * 2
            e_lo, e_hi = np.nanquantile(ess_boot, q) if np.isfinite(ess_boot).any() else (math.nan,) * 2
            rows.append(
                {
                    "T": float(np.median(lengths[sel])),
                    "T_min": int(lo),
                    "T_max": int(hi),
                    "correction": c.spec,
                    "n_seq": int(sel.size),
                    "rel_bias": float(rb),
                    "rel_bias_lo": float(rb_lo),
                    "rel_bias_hi": float(rb_hi),
                    "ess_frac": float(ess),
                    "ess_frac_lo": float(e_lo),
                    "ess_frac_hi": float(e_hi),
                }
            )
    return pd.DataFrame(rows, columns=list(BOOTSTRAP_COLUMNS))


def _parts(cs, sel, adv):
    """Yield (correction, row label, sequences) of a bucket: by sign for a sign-dependent spec."""
    for c in cs:
        if not c.signed:
            yield c, c.spec, sel
            continue
        pos = is_positive(c, adv)
        for sign, part in zip(signs(c), (sel, sel & pos, sel & ~pos), strict=True):
            if part.any():
                yield c, sign_label(c, sign), part


def _prob_tokens(c, log_r, log_mu, adv, off):
    """Apply a probability-aware mask to every token: (w, masked, per-token advantage or None, log_mu)."""
    adv_tok = np.repeat(adv, np.diff(off)) if c.signed else None
    w, mod = apply_prob(c, log_r, log_mu, adv_tok, offsets=off)
    return w, mod, adv_tok, log_mu


def expected_masked(c, log_r, log_mu, advantage=None, shift_model=None) -> np.ndarray:
    r"""Return each token's probability of being masked by ``c`` under the model fitted to these tokens.

    The model of :mod:`variance_lab.corrections.tokenprob` with the lognormal fitted
    (:func:`fit_lognormal`) to the tokens' log-odds shifts :math:`Y = \operatorname{logit}\pi -
    \operatorname{logit}\mu`, at each token's own probability :math:`\mu` (and, for DPPO, its own
    sign: ``advantage`` per token, positive when > 0). A token whose :math:`\mu` or :math:`\pi` is
    exactly 1 has no finite shift: it is left out of the fit and predicted never masked (the model
    moves no probability there). NaN everywhere with fewer than two finite shifts, and for ``cppo``,
    whose budget couples a token to its sequence (no per-token model: :mod:`variance_lab.corrections.cppo`).

    Parameters
    ----------
    c : Correction
        ``dppo-tv``, ``dppo-kl`` or ``kpop``.
    log_r, log_mu : ndarray
        Token log-ratios and the sampler's token log-probs.
    advantage : ndarray, optional
        Each token's advantage (DPPO).
    shift_model : LogNormal or LognormalMixture, optional
        The law of the shifts to use instead of the fitted lognormal (e.g. a mixture fitted to them).
    """
    adv_tok = advantage
    y = logit_shift(log_mu + log_r, log_mu)
    ok = np.isfinite(y)
    if ok.sum() < 2 or c.kind == "cppo":
        return np.full(log_r.shape, math.nan)
    shift = fit_lognormal(y[ok]) if shift_model is None else shift_model
    with np.errstate(divide="ignore"):
        lq = log_mu[ok] - np.log(-np.expm1(log_mu[ok]))
    f_up, f_down = mask_given_q(c, shift, lq)
    out = np.zeros(log_r.shape)
    if c.signed:
        out[ok] = np.where(is_positive(c, adv_tok[ok]), f_up, f_down)
    else:
        out[ok] = f_up + f_down
    return out


def _predictions(family, cs, lengths, adv=None, prob=None, off=None, log_r=None, shift_model=None) -> dict:
    r"""Per sequence, the model's expected modified count: the probability (sequence level) or tokens.

    Token level: :math:`pL` for a fraction :math:`p` per token that does not depend on the
    position, :math:`\sum_{t \le L} p_t` for ``ctpo`` (lognormal models; NaN for others); the
    probability-aware masks: the sum over the sequence's tokens of each one's masked probability.
    """
    out = {}
    for c in (c for c in cs if c.prob):  # the same expected count per sequence for every row
        _, _, adv_tok, log_mu = prob[c.spec]
        e = np.add.reduceat(expected_masked(c, log_r, log_mu, adv_tok, shift_model), off[:-1])
        labels = [sign_label(c, s) for s in signs(c)] if c.signed else [c.spec]
        out.update({label: e for label in labels})
    seq = [c for c in cs if c.level == "sequence" and not c.signed]
    if seq:
        grid = np.unique(lengths)
        th = theory(family, grid, seq)
        for c in seq:
            f = th[th.correction == c.spec].set_index("T").frac_modified
            out[c.spec] = f.reindex(lengths).to_numpy(float)
    for c in (c for c in cs if c.signed and not c.prob):  # by sign, at each sequence's length and sign
        labels = [sign_label(c, s) for s in signs(c)]
        if type(family) is not LogNormal:
            out.update({label: np.full(lengths.shape, math.nan) for label in labels})
            continue
        th = theory(family, np.unique(lengths), [c]).set_index(["correction", "T"]).frac_modified
        f_pos, f_neg = (th.loc[label].reindex(lengths).to_numpy(float) for label in labels[1:])
        if c.level == "token":  # aspo: a fraction per token, the expected count of a sequence's
            f_pos, f_neg = f_pos * lengths, f_neg * lengths
        out.update(zip(labels, (np.where(is_positive(c, adv), f_pos, f_neg), f_pos, f_neg), strict=True))
    tok = [c for c in cs if c.level == "token" and c.kind != "ctpo" and not c.prob]
    if tok:
        th = theory(family, [1], tok)
        out.update(
            {c: p * lengths for c, p in zip(th.correction, th.frac_modified.astype(float), strict=True)}
        )
    for c in cs:
        if c.kind != "ctpo":
            continue
        if type(family) is not LogNormal:  # its clipped fraction by position is the lognormal's closed form
            out[c.spec] = np.full(lengths.shape, math.nan)
            continue
        p = clip_probability(c, family.mean_log, family.var_log, np.arange(1, int(lengths.max()) + 1))
        out[c.spec] = np.concatenate([[0.0], np.cumsum(p)])[lengths]
    return out


def fraction_interval(
    nmod: np.ndarray, tokens: np.ndarray, rng, ci: float, groups=None
) -> tuple[float, float]:
    """Interval of a token-level modified fraction ``sum(nmod) / sum(tokens)``.

    The percentile bootstrap of :func:`~variance_lab.stats.bootstrap_ratio`, except when no token
    was modified: every resample is then 0, and ``[0, 0]`` would claim a fraction known to be exactly 0. The
    interval is then Wilson's at no events with one unit per prompt (per sequence without
    ``groups``), ``[0, z^2 / (n + z^2)]``, the convention of the clustered proportions
    (:func:`variance_lab.stats.cluster_ratio`). The bootstrap still runs, so the random streams
    of the other intervals do not depend on it.
    """
    lo, hi = bootstrap_ratio(nmod, tokens, n_boot=N_BOOT, level=ci, rng=rng, groups=groups)
    if np.any(nmod):
        return lo, hi
    n = nmod.size if groups is None else np.unique(groups).size
    return tuple(float(e) for e in wilson_interval(0.0, n, ci))


def _data_row(c, log_r, off, lengths, log_p, sel, z, rng, ci, groups=None, adv=None, prob=None) -> dict:
    L = lengths[sel]
    seq_idx = np.flatnonzero(sel)
    g = None if groups is None else groups[sel]
    if c.level == "sequence" or c.kind == "gmpo":
        if c.level == "sequence":
            if c.signed:
                w, mod = apply_signed(c, log_p[sel], L, is_positive(c, adv[sel]))
            else:
                w, mod = apply_sequence(c, log_p[sel], L)
            frac = float(mod.mean())
            any_ = frac
            r = proportion_interval(mod, n_boot=N_BOOT, level=ci, rng=rng, groups=g)
            frac_ci = (r["lo"], r["hi"])
        else:
            zt, modt = apply_tokens(c, log_r)
            w = np.exp(np.add.reduceat(zt, off[:-1])[sel] / L)
            nmod = np.add.reduceat(modt.astype(float), off[:-1])[sel]
            frac, any_ = float(nmod.sum() / L.sum()), float((nmod > 0).mean())
            frac_ci = fraction_interval(nmod, L.astype(float), rng, ci, g)
        mean_ci = bootstrap_ratio(w, np.ones(w.size), n_boot=N_BOOT, level=ci, rng=rng, groups=g)
        base = np.exp(log_p[sel] / L) if c.base == "G" else np.exp(log_p[sel])
        n = w.size
        mean = float(w.mean())
        var = float(w.var(ddof=1)) if n > 1 else math.nan
        se = math.sqrt(var / n) if n > 1 else math.nan
        ess = float(ess_fraction(mean, np.mean(w * w))) if np.any(w > 0) else math.nan
        base_mean = float(base.mean())
    else:
        if c.prob:
            wt, modt = prob[:2]
        elif c.signed:  # aspo: each token takes its sequence's sign
            wt, modt = apply_signed(c, log_r, None, np.repeat(is_positive(c, adv), lengths))
        else:
            wt, modt = apply_tokens(c, log_r, off)
        ws = np.add.reduceat(wt, off[:-1])[sel]
        nmod = np.add.reduceat(modt.astype(float), off[:-1])[sel]
        ntok = L.sum()
        mean = float(ws.sum() / ntok)
        tok = np.concatenate([np.arange(off[i], off[i + 1]) for i in seq_idx])
        var = float(wt[tok].var(ddof=1)) if tok.size > 1 else math.nan
        resid = ws - mean * L  # ratio estimator: se of sum(w) / sum(L)
        se = math.sqrt(float(np.sum(resid * resid))) / ntok if L.size > 1 else math.nan
        ess = float(ess_fraction(mean, np.mean(wt[tok] ** 2))) if np.any(wt[tok] > 0) else math.nan
        frac, any_ = float(nmod.sum() / ntok), float((nmod > 0).mean())
        frac_ci = fraction_interval(nmod, L.astype(float), rng, ci, g)
        mean_ci = bootstrap_ratio(ws, L, n_boot=N_BOOT, level=ci, rng=rng, groups=g)
        base_mean = float(np.exp(log_base_tokens(c, log_r, off)[tok]).mean())
        n = L.size
    return {
        "T": float(np.median(L)),
        "correction": c.spec,
        "level": c.level,
        "n_seq": int(n),
        "mean_w": mean,
        "mean_w_lo": min(mean_ci[0], mean) if math.isfinite(se) else math.nan,
        "mean_w_hi": max(mean_ci[1], mean) if math.isfinite(se) else math.nan,
        "bias": mean - base_mean,
        "var_w": var,
        "ess_frac": ess,
        "frac_modified": frac,
        "frac_seq_any": any_,
        "mean_base": base_mean,
        "frac_modified_lo": frac_ci[0],
        "frac_modified_hi": frac_ci[1],
    }
