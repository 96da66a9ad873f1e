r"""Weights from log-ratios: each correction applied to measured or simulated values.

:func:`apply_sequence` acts on :math:`\log P_T` per sequence, :func:`apply_tokens` on each
token's :math:`\log r`; both return the weights and where they were truncated, clipped or
masked. Shared by the Monte Carlo (:mod:`variance_lab.corrections.monte_carlo`), the data
(:mod:`variance_lab.corrections.data`) and the frameworks' mirrors.

A value exactly at a bound is kept (:data:`BOUND_RULE`: :math:`1\{LO \le X \le HI\}`, as the
specs' table says), compared in log space in float64 with the bounds of
:meth:`~variance_lab.corrections.specs.Correction.log_bounds` (:mod:`variance_lab.ratios.bounds`).

Two token-level kinds need the sequences, not only the tokens: ``ctpo`` compares each token's
prefix sum :math:`L_t` with bounds at its position :math:`t`, and ``m2po`` masks over batches of
sequences (:func:`variance_lab.corrections.m2po.batch_mask`). :func:`apply_tokens` reads the
sequences from the rows of a 2-D array (one sequence per row, as the Monte Carlo draws them) or
from ``offsets`` into a 1-D array (as data come).
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections.m2po import batch_mask, batch_masks
from variance_lab.corrections.specs import Correction
from variance_lab.ratios import CLOSED, BoundRule, compare, segment_cumsums

__all__ = ["BOUND_RULE", "apply_sequence", "apply_tokens", "log_base_tokens"]

#: The corrections' convention on data: a value at a bound is kept, log space, float64.
BOUND_RULE = BoundRule(CLOSED, "log", "float64")


def apply_sequence(c: Correction, log_p: np.ndarray, T) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a sequence-level correction's weights from :math:`\log P_T` values.

    Parameters
    ----------
    c : Correction
        Of level ``"sequence"``.
    log_p : ndarray
        :math:`\log P_T` of each sequence.
    T : int or ndarray
        Each sequence's length (for :math:`G_T = P_T^{1/T}` and Geo-RS's bounds).

    Returns
    -------
    (w, modified) : tuple of ndarray
        The weights and a boolean array, True where the weight was truncated, clipped or masked.
    """
    if c.level != "sequence":
        raise ValueError(f"{c.spec!r} is a token-level correction")
    log_p = np.asarray(log_p, dtype=float)
    T = np.asarray(T, dtype=float)
    x = log_p / T if c.base == "G" else log_p
    if c.kind == "geo-rs":
        lo, hi = math.log(c.params[0]), math.log(c.params[1])
        out = BOUND_RULE.outside(log_p / T, lo, hi)
        return np.where(out, 0.0, np.exp(np.where(out, 0.0, log_p))), out
    return _apply_pieces(c, x)


def _apply_pieces(c: Correction, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights of the T-free pieces of ``c`` at base log-values ``x``; the ends by :data:`BOUND_RULE`."""
    a, b = c.log_bounds()
    out = BOUND_RULE.outside(x, a, b)
    w = np.zeros_like(x)
    for lo, hi, logc, p in c.pieces():
        if p == 1.0:
            w = np.where(out, w, np.exp(np.where(out, 0.0, x) + logc))
        else:
            w = np.where(out & (x > lo) & (x <= hi), math.exp(logc), w)
    return w, out


def _prefix(log_r: np.ndarray, offsets) -> tuple[np.ndarray, np.ndarray]:
    """Each token's prefix sum in its sequence and its position (rows, ``offsets`` or one sequence)."""
    if log_r.ndim == 2:
        t = np.broadcast_to(np.arange(1, log_r.shape[1] + 1, dtype=float), log_r.shape)
        return np.cumsum(log_r, axis=1), t
    off = np.array([0, log_r.size]) if offsets is None else offsets
    L, t = segment_cumsums(log_r, off)
    return L, t.astype(float)


def log_base_tokens(c: Correction, log_r: np.ndarray, offsets=None) -> np.ndarray:
    r"""Return the log of each token's uncorrected weight: :math:`\log r_t`, or :math:`L_t` for ``ctpo``."""
    log_r = np.asarray(log_r, dtype=float)
    return _prefix(log_r, offsets)[0] if c.base == "prefix" else log_r


def _m2po_mask(c: Correction, log_r: np.ndarray, offsets) -> np.ndarray:
    """M2PO's mask over batches of ``c.batch`` sequences (rows or ``offsets``; the last may be smaller)."""
    tau, B = c.params[0], c.batch
    if log_r.ndim == 1:
        off = np.array([0, log_r.size]) if offsets is None else np.asarray(offsets)
        return batch_masks(log_r, off, tau, B)
    n, t = log_r.shape
    full = n // B * B
    out = np.empty(log_r.shape, dtype=bool)
    out[:full] = batch_mask(log_r[:full].reshape(-1, B * t), tau).reshape(full, t)
    if full < n:
        out[full:] = batch_mask(log_r[full:].reshape(-1), tau).reshape(n - full, t)
    return out


def apply_tokens(c: Correction, log_r: np.ndarray, offsets=None) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a token-level correction's per-token weights and modified flags (GMPO: clipped log-ratios).

    Parameters
    ----------
    c : Correction
        Of level ``"token"``.
    log_r : ndarray
        Token log-ratios: 1-D (all sequences concatenated) or 2-D (one sequence per row).
    offsets : array_like of int, optional
        Sequence boundaries of a 1-D ``log_r`` (``ctpo`` and ``m2po`` only; without them a 1-D
        array is one sequence).

    Returns
    -------
    (w, modified) : tuple of ndarray
        For ``gmpo`` ``w`` is :math:`\operatorname{clip}(\log r, -\epsilon, \epsilon)`, whose
        mean over a sequence is the log of its weight; for ``ctpo`` :math:`w_t = P_t` where
        :math:`-E_L\sqrt t \le L_t \le E_H\sqrt t` and 0 elsewhere (modified); for ``m2po``
        :math:`w_t = r_t` where the batch keeps the token and 0 where it masks it.
    """
    if c.level != "token":
        raise ValueError(f"{c.spec!r} is a sequence-level correction")
    if c.prob:
        raise ValueError(
            f"{c.spec!r} masks by the token's probabilities: its weights need the sampler's log-probs "
            "(variance_lab.corrections.apply_prob)"
        )
    log_r = np.asarray(log_r, dtype=float)
    if c.kind == "gmpo":
        e = c.params[0]
        return np.clip(log_r, -e, e), BOUND_RULE.outside(log_r, -e, e)
    if c.kind == "ctpo":
        L, t = _prefix(log_r, offsets)
        root = np.sqrt(t)
        out = compare(L, -c.params[0] * root, c.params[1] * root, BOUND_RULE.inclusive)
        return np.where(out, 0.0, np.exp(np.where(out, 0.0, L))), out
    if c.kind == "m2po":
        out = _m2po_mask(c, log_r, offsets)
        return np.where(out, 0.0, np.exp(np.where(out, 0.0, log_r))), out
    return _apply_pieces(c, log_r)
