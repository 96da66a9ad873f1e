r"""Sequence weights from token log-probs: the product P, GSPO's geometric mean and its identities.

For one response :math:`y` of :math:`|y| = T` counted tokens with log-probabilities
:math:`\ell_t = \log\pi_\theta(y_t)` (new policy) and :math:`\ell^{old}_t` (old policy), the
token log-ratios are :math:`d_t = \ell_t - \ell^{old}_t` and

.. math::

    \log P = \sum_t d_t, \qquad
    s = G = P^{1/T} = \exp\Bigl(\tfrac{1}{T}\sum_t d_t\Bigr), \qquad
    \log\mathrm{PPL} = H = -\tfrac{1}{T}\sum_t \ell_t ,

so that (the perplexity-entropy paper) GSPO's weight is the inverse perplexity ratio and the exponential
change in per-token cross-entropy:

.. math::

    s = \frac{\mathrm{PPL}_{old}}{\mathrm{PPL}_{new}} = e^{\Delta H}, \qquad
    \Delta H = H_{old} - H_{new} = \tfrac{1}{T}\sum_t (\ell_t - \ell^{old}_t) = \log G .

Numerics. Every quantity is formed in log space from per-sequence sums computed by an
error-free split (:func:`segment_sums`): each value is cut into a high part on a grid coarse
enough that its sums are exact in float64 and an exact low remainder, so a sum is within about
one unit in the last place of the exact one for any length (tested against ``math.fsum`` at
:math:`T = 10^5` with :math:`|d_t| = 50`, i.e. :math:`|\log P| = 5\cdot 10^6`). The numerator
:math:`\sum_t (\ell_t - \ell^{old}_t)` is summed over the interleaved values
:math:`(\ell_1, -\ell^{old}_1, \ell_2, \dots)`, so the difference of the two cross-entropies
carries no cancellation error. :math:`P` itself is never exponentiated; linear perplexities
beyond the float64 range come back as ``inf`` (their ``log_`` twins stay finite), never NaN and
never with a warning.

The summation (:func:`~variance_lab.ratios.weights.segment_sums`), the clip bands and their
defaults live in :mod:`variance_lab.ratios`; the clip indicators follow :data:`CLIP_RULE`.

The sequences come as a :class:`~variance_lab.rollouts.batch.TokenBatch` (validated token
log-probs, flat with offsets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from variance_lab.ratios import (
    CLOSED,
    GMPO_RANGE,
    GSPO_RANGE,
    PPO_RANGE,
    BoundRule,
    log_clip_range,
    segment_sums,
)
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.stats import exp_quiet

__all__ = [
    "CLIP_RULE",
    "GMPO_RANGE",
    "GSPO_RANGE",
    "PPO_RANGE",
    "ClipFractions",
    "SequenceWeights",
    "gspo_token_weights",
    "log_clip_range",
    "segment_sums",
    "sequence_weights",
]

#: The bound rule of the clip indicators here (GSPO's ``clipped_gspo``, PPO's ``n_token_clipped``):
#: a value exactly at a bound is not clipped, compared in log space (log of the float64 ratio
#: band), in float64 (:mod:`variance_lab.ratios.bounds`). The bands' defaults are
#: :mod:`variance_lab.ratios.defaults`' (imported here, where they were first defined).
CLIP_RULE = BoundRule(CLOSED, "log", "float64")


# --------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ClipFractions:
    r"""A set of sequences by their log weights and clip indicators, and its batch clip fractions.

    What :func:`~variance_lab.rollouts.statistics.bucket_table` and the clip fractions read of a
    set: :class:`SequenceWeights` builds it from a batch's tokens, the streaming pass's
    :class:`~variance_lab.rollouts.summaries.EvalSummary` from per-sequence sums.

    Attributes
    ----------
    length : ndarray of int
        Counted tokens :math:`T` per sequence.
    log_P, log_G : ndarray
        :math:`\log P = \sum_t d_t` and :math:`\log G = \log P / T` per sequence.
    clipped_gspo : ndarray of bool
        :math:`s = G` outside GSPO's range (:data:`CLIP_RULE`).
    n_token_clipped : ndarray of int
        Tokens whose ratio lies outside the PPO range (:data:`CLIP_RULE`).
    gspo_range, ppo_range : tuple of float
        The clipping ranges used, as ratios ``(lo, hi)``.
    """

    length: np.ndarray
    log_P: np.ndarray
    log_G: np.ndarray
    clipped_gspo: np.ndarray
    n_token_clipped: np.ndarray
    gspo_range: tuple[float, float]
    ppo_range: tuple[float, float]

    @property
    def gspo_clip_frac(self) -> float:
        """Batch fraction of sequences whose s is outside GSPO's range."""
        return float(np.mean(self.clipped_gspo))

    @property
    def ppo_clip_frac(self) -> float:
        """Batch fraction of tokens outside the PPO range (token mean, as trainers log it)."""
        return float(self.n_token_clipped.sum() / self.length.sum())


@dataclass(frozen=True, eq=False)
class SequenceWeights(ClipFractions):
    r"""Per-sequence weights and perplexities of a :class:`TokenBatch`, all in log space.

    Linear values are properties (``inf`` or ``0.0`` beyond float64, never a warning).
    :meth:`to_frame` gives one row per sequence.

    Attributes
    ----------
    length, log_P, log_G, clipped_gspo, n_token_clipped, gspo_range, ppo_range
        As :class:`ClipFractions`: :math:`T = |y|`; :math:`\log P = \sum_t d_t`, exact to about
        1 ulp for any length; :math:`\log s = \log G = \tfrac1T \sum_t d_t = \Delta H` (the
        mean token log-ratio); :math:`s` outside GSPO's range (sequence-level clipping would
        act, for one sign of the advantage or the other); tokens outside the PPO range.
    ids : ndarray
        Sequence id.
    log_ppl_old, log_ppl_new : ndarray
        :math:`\log\mathrm{PPL} = H = -\tfrac1T\sum_t \ell_t`, the per-token cross-entropy.
    log_gmpo : ndarray
        :math:`\tfrac1T \sum_t \operatorname{clip}(d_t, \log a, \log b)` for GMPO's range
        :math:`(a, b)`: the log of GMPO's weight.
    gmpo_range : tuple of float
        GMPO's clipping range, as ratios ``(lo, hi)``.
    """

    ids: np.ndarray
    log_ppl_old: np.ndarray
    log_ppl_new: np.ndarray
    log_gmpo: np.ndarray
    gmpo_range: tuple[float, float]

    @property
    def s(self) -> np.ndarray:
        r"""GSPO's weight :math:`s = G = P^{1/|y|}`."""
        return exp_quiet(self.log_G)

    @property
    def delta_H(self) -> np.ndarray:
        r""":math:`\Delta H = H_{old} - H_{new}`, so that :math:`s = e^{\Delta H}`."""
        return self.log_G

    @property
    def log10_P(self) -> np.ndarray:
        r""":math:`\log_{10} P`."""
        return self.log_P / math.log(10.0)

    @property
    def ppl_old(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{old} = e^{H_{old}}`."""
        return exp_quiet(self.log_ppl_old)

    @property
    def ppl_new(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{new} = e^{H_{new}}`."""
        return exp_quiet(self.log_ppl_new)

    @property
    def ppl_ratio(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{old}/\mathrm{PPL}_{new}`, as :math:`e^{\Delta H}`.

        :math:`\Delta H` comes from the interleaved sum: finite even where both perplexities
        overflow.
        """
        return exp_quiet(self.log_G)

    @property
    def gmpo_weight(self) -> np.ndarray:
        """GMPO's weight: the geometric mean of the log-space-clipped token ratios."""
        return exp_quiet(self.log_gmpo)

    @property
    def token_clip_frac(self) -> np.ndarray:
        """Per sequence, the fraction of tokens outside the PPO range."""
        return self.n_token_clipped / self.length

    def to_frame(self) -> pd.DataFrame:
        """One row per sequence: id, length, log and linear weights, perplexities, clipping."""
        return pd.DataFrame(
            {
                "id": self.ids,
                "length": self.length,
                "log_P": self.log_P,
                "log10_P": self.log10_P,
                "log_G": self.log_G,
                "s": self.s,
                "log_ppl_old": self.log_ppl_old,
                "log_ppl_new": self.log_ppl_new,
                "ppl_old": self.ppl_old,
                "ppl_new": self.ppl_new,
                "ppl_ratio": self.ppl_ratio,
                "delta_H": self.delta_H,
                "log_gmpo": self.log_gmpo,
                "gmpo_weight": self.gmpo_weight,
                "clipped_gspo": self.clipped_gspo,
                "token_clip_frac": self.token_clip_frac,
            }
        )


def _interleave(a: np.ndarray, b: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_1, b_1, a_2, b_2, ...) with doubled offsets: sum(a - b) without a rounded difference."""
    out = np.empty(2 * a.size)
    out[0::2] = a
    out[1::2] = b
    return out, 2 * offsets


def sequence_weights(
    batch: TokenBatch, *, gspo_range=GSPO_RANGE, ppo_range=PPO_RANGE, gmpo_range=GMPO_RANGE
) -> SequenceWeights:
    r"""GSPO, GMPO and product weights, perplexities and clipping of every sequence in a batch.

    With :math:`d_t = \ell_t - \ell^{old}_t` over the :math:`T` counted tokens:

    .. math::

        \log P = \textstyle\sum_t d_t, \quad
        s = e^{\log P / T} = \mathrm{PPL}_{old}/\mathrm{PPL}_{new} = e^{\Delta H}, \quad
        w_{GMPO} = \exp\Bigl(\tfrac1T\textstyle\sum_t \operatorname{clip}(d_t, \log a, \log b)\Bigr).

    GMPO's clipping is shown two-sided and advantage-free (GMPO's trainer keeps only the side
    that the advantage's sign selects). GSPO clips :math:`s` at sequence level; PPO clips each
    token ratio. All sums use :func:`segment_sums`.

    Parameters
    ----------
    batch : TokenBatch
        Validated token log-probs.
    gspo_range : tuple of float
        GSPO's range of :math:`s`, default :data:`~variance_lab.ratios.GSPO_RANGE`.
    ppo_range : tuple of float
        Token-level PPO range of :math:`r_t`, default :data:`~variance_lab.ratios.PPO_RANGE`.
    gmpo_range : tuple of float
        GMPO's token range of :math:`r_t`, default :data:`~variance_lab.ratios.GMPO_RANGE`.

    Returns
    -------
    SequenceWeights
    """
    g_lo, g_hi = log_clip_range(gspo_range, "gspo_range")
    p_lo, p_hi = log_clip_range(ppo_range, "ppo_range")
    m_lo, m_hi = log_clip_range(gmpo_range, "gmpo_range")
    off, T = batch.offsets, batch.lengths
    log_P = segment_sums(*_interleave(batch.logp, -batch.old_logp, off))
    log_G = log_P / T
    d = batch.log_ratio
    log_gmpo = segment_sums(np.clip(d, m_lo, m_hi), off) / T
    token_out = CLIP_RULE.outside(d, p_lo, p_hi)
    return SequenceWeights(
        ids=batch.ids,
        length=T,
        log_P=log_P,
        log_G=log_G,
        log_ppl_old=-segment_sums(batch.old_logp, off) / T,
        log_ppl_new=-segment_sums(batch.logp, off) / T,
        log_gmpo=log_gmpo,
        clipped_gspo=CLIP_RULE.outside(log_G, g_lo, g_hi),
        n_token_clipped=np.add.reduceat(token_out.astype(np.int64), off[:-1]),
        gspo_range=tuple(float(v) for v in gspo_range),
        ppo_range=tuple(float(v) for v in ppo_range),
        gmpo_range=tuple(float(v) for v in gmpo_range),
    )


def gspo_token_weights(batch: TokenBatch) -> np.ndarray:
    r"""GSPO-token weights, one per counted token, flat.

    GSPO-token uses, for token :math:`t` of sequence :math:`y`,

    .. math::

        s_t = \operatorname{sg}[s]\,\frac{\pi_\theta(y_t)}{\operatorname{sg}[\pi_\theta(y_t)]},

    with :math:`\operatorname{sg}` the stop-gradient. Its *value* is exactly :math:`s` for
    every token of the sequence (the fraction is 1); only its gradient differs,
    :math:`\nabla s_t = s\,\nabla\log\pi_\theta(y_t)`, which lets a per-token advantage enter.
    So the weights here are :math:`s` repeated over each sequence's tokens.

    Parameters
    ----------
    batch : TokenBatch

    Returns
    -------
    ndarray of float64, shape ``(batch.n_tokens,)``
    """
    return np.repeat(sequence_weights(batch).s, batch.lengths)
