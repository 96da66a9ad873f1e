r"""Token-level masks on data, binned by a token variable: the sampler's probability or the entropy.

:func:`mask_by_bins` answers where a token-level correction binds on measured tokens: the
fraction of the tokens in each bin of ``by`` (the sampler's probability :math:`\mu(y)` of the
sampled token, ``"p"``, or the entropy of the next-token distribution, ``"entropy"``) that it
masks, clips or truncates, with a bootstrap interval over sequences (or prompts) and the model's
prediction beside it: for the probability-aware masks the log-odds model at each token's own
probability (:func:`~variance_lab.corrections.data.expected_masked`), for a ratio mask the
lognormal fitted to the log-ratios (:func:`~variance_lab.corrections.data.fit_lognormal`; the same
fraction in every bin, which is what an i.i.d. ratio model says).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from variance_lab._validate import check_seed
from variance_lab.corrections.closed_forms import has_theory, theory
from variance_lab.corrections.data import (
    check_advantages,
    check_log_mu,
    check_rollout_arrays,
    expected_masked,
    fit_lognormal,
    fraction_interval,
)
from variance_lab.corrections.probmask import apply_prob
from variance_lab.corrections.specs import parse_list
from variance_lab.corrections.weights import apply_tokens
from variance_lab.stats import z_value

__all__ = ["BINNED_BY", "BIN_COLUMNS", "ENTROPY_EDGES", "P_EDGES", "mask_by_bins"]

#: What :func:`mask_by_bins` bins by: the sampler's probability of the token, or the entropy (nats).
BINNED_BY = ("p", "entropy")
#: Default bin edges of the sampler's probability (the last bin is closed above).
P_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
#: Default bin edges of the entropy in nats.
ENTROPY_EDGES = (0.0, 0.05, 0.2, 0.5, 1.0, 2.0, math.inf)
#: Columns of :func:`mask_by_bins`.
BIN_COLUMNS = (
    "by",
    "bin_lo",
    "bin_hi",
    "correction",
    "n_tokens",
    "n_seq",
    "mean_value",
    "frac_modified",
    "frac_modified_lo",
    "frac_modified_hi",
    "pred_frac_modified",
    "pred_inside",
)


def _check_edges(edges) -> np.ndarray:
    e = np.asarray(edges, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.isnan(e)) or np.any(np.diff(e) <= 0):
        raise ValueError(f"bin edges must be at least two increasing numbers, got {list(np.ravel(e))!r}")
    return e


def _masked(c, log_r, off, log_mu, adv_tok) -> np.ndarray:
    """Each token's modified flag under ``c`` (the whole file at once: ctpo and m2po need the sequences)."""
    if c.prob:
        return apply_prob(c, log_r, log_mu, adv_tok, offsets=off)[1]
    return apply_tokens(c, log_r, off)[1]


def _expected(c, log_r, log_mu, adv_tok, ratio_model, shift_model) -> np.ndarray:
    """Each token's predicted probability of being modified (NaN where the model has none)."""
    if c.prob:
        return expected_masked(c, log_r, log_mu, adv_tok, shift_model)
    if c.kind in ("ctpo", "m2po", "gmpo") or not has_theory(ratio_model, c):
        return np.full(log_r.shape, math.nan)
    return np.full(log_r.shape, float(theory(ratio_model, [1], [c]).frac_modified.iloc[0]))


def mask_by_bins(
    log_r,
    offsets,
    corrections,
    values,
    edges=None,
    *,
    by: str = "p",
    log_mu=None,
    advantages=None,
    groups=None,
    ci: float = 0.95,
    seed: int = 0,
    ratio_model=None,
    shift_model=None,
) -> pd.DataFrame:
    r"""Fraction of tokens each token-level correction modifies, per bin of a token variable.

    Parameters
    ----------
    log_r : array_like of float
        Token log-ratios of all sequences, concatenated (as for
        :func:`~variance_lab.corrections.evaluate`).
    offsets : array_like of int
        Sequence boundaries.
    corrections : str or list
        Token-level specs; the probability-aware ones need ``log_mu`` (and DPPO ``advantages``).
    values : array_like of float
        The variable binned, one value per token: the sampler's probability :math:`\mu(y)` for
        ``by="p"``, the entropy for ``by="entropy"``.
    edges : array_like of float, optional
        Increasing bin edges (default :data:`P_EDGES` or :data:`ENTROPY_EDGES`); bins are
        ``[lo, hi)``, the last ``[lo, hi]``; tokens outside every bin are left out.
    by : {"p", "entropy"}
        The name of the variable (the ``by`` column).
    log_mu : array_like of float, optional
        The sampler's log-prob of each token.
    advantages : array_like of float, optional
        One per sequence (DPPO: positive when > 0).
    groups : array_like, optional
        The prompt of each sequence: the intervals resample prompts.
    ci : float
    seed : int
        Root seed of the bootstrap (bin ``i`` draws from ``SeedSequence(seed, spawn_key=(i,))``).
    ratio_model : Family, optional
        The ratio masks' model (default the lognormal fitted to ``log_r``).
    shift_model : LogNormal or LognormalMixture, optional
        The probability-aware masks' law of the log-odds shifts (default the lognormal fitted to them).

    Returns
    -------
    pandas.DataFrame
        One row per (bin, correction), columns :data:`BIN_COLUMNS`: the tokens and sequences with a
        token in the bin, the mean of ``values`` over its tokens, the modified fraction of its
        tokens with the interval of :func:`~variance_lab.corrections.data.fraction_interval` (a
        bootstrap over the sequences, each sequence's tokens in the bin kept together), the mean
        predicted probability and whether it lies inside the interval.
    """
    if by not in BINNED_BY:
        raise ValueError(f"by must be one of {BINNED_BY}, got {by!r}")
    log_r, off = check_rollout_arrays(log_r, offsets)
    cs = parse_list(corrections)
    seq_level = [c.spec for c in cs if c.level != "token"]
    if seq_level:
        raise ValueError(f"{seq_level[0]!r} is a sequence-level correction: no token to bin")
    z_value(ci)
    seed = check_seed(seed)
    lengths = np.diff(off)
    x = np.asarray(values, dtype=float)
    if x.shape != log_r.shape:
        raise ValueError(f"values must hold one number per token ({log_r.size}), got shape {x.shape}")
    e = _check_edges(P_EDGES if edges is None and by == "p" else ENTROPY_EDGES if edges is None else edges)
    adv = check_advantages(advantages, cs, lengths.size)
    lm = check_log_mu(log_mu, cs, log_r.size)
    g = None if groups is None else np.asarray(groups)
    seg = np.repeat(np.arange(lengths.size), lengths)
    ratio_model = fit_lognormal(log_r) if ratio_model is None else ratio_model
    flags, expect = {}, {}
    for c in cs:
        adv_tok = np.repeat(adv, lengths) if c.signed else None
        flags[c.spec] = _masked(c, log_r, off, lm, adv_tok)
        expect[c.spec] = _expected(c, log_r, lm, adv_tok, ratio_model, shift_model)
    rows = []
    for i, (lo, hi) in enumerate(itertools.pairwise(e)):
        inside = (x >= lo) & ((x <= hi) if i == len(e) - 2 else (x < hi))
        ntok = np.bincount(seg[inside], minlength=lengths.size).astype(float)
        has = ntok > 0
        if not has.any():
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(i,))))
        for c in cs:
            nmod = np.bincount(seg[inside], weights=flags[c.spec][inside], minlength=lengths.size)
            frac = float(nmod.sum() / ntok.sum())
            flo, fhi = fraction_interval(nmod[has], ntok[has], rng, ci, None if g is None else g[has])
            pred = float(np.mean(expect[c.spec][inside]))
            rows.append(
                {
                    "by": by,
                    "bin_lo": float(lo),
                    "bin_hi": float(hi),
                    "correction": c.spec,
                    "n_tokens": int(ntok.sum()),
                    "n_seq": int(has.sum()),
                    "mean_value": float(x[inside].mean()),
                    "frac_modified": frac,
                    "frac_modified_lo": float(flo),
                    "frac_modified_hi": float(fhi),
                    "pred_frac_modified": pred,
                    "pred_inside": bool(flo <= pred <= fhi) if math.isfinite(pred) else False,
                }
            )
    return pd.DataFrame(rows, columns=list(BIN_COLUMNS))
