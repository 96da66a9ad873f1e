r"""NeMo-RL's off-policy importance weights and mismatch metrics, in NumPy.

A mirror of ``ClippedPGLossFn.__call__`` in ``nemo_rl/algorithms/loss/loss_functions.py``
(NVIDIA-NeMo/RL at ``ced083a``, the last commit touching it in the snapshot ``7ea279a``,
2026-08-22) and ``masked_mean`` of ``nemo_rl/algorithms/utils.py``, for one micro-batch (the
global token and sequence counts are the batch's own). Checked by hand-computed cases from that
source (``tests/frameworks/test_others.py``); NeMo-RL is not installed here.

NeMo-RL's conventions, all kept:

- the mismatch log-ratio is :math:`\Delta = \log\pi_{prev} - \log\pi_{gen}`; the mask is
  ``token_mask * sample_mask``; ``masked_mean`` divides by the count plus :math:`10^{-8}`
  (verl's too: :func:`variance_lab.frameworks.batch.masked_mean`);
- ``token_mult_prob_error`` :math:`= \overline{e^{|\Delta|}}` over the tokens (at least 1; 1
  when the engines agree);
- weights :math:`e^{\Delta_t}` per token, or with ``sequence_level_importance_ratios``
  :math:`e^{\sum_t m_t\Delta_t}` per sequence; non-finite weights become **0**
  (``nan_to_num(posinf=0)``: a sequence whose log-ratio sum overflows gets weight 0, not a cap).
  NeMo-RL computes them in float32 (it casts the logits to float32), so a weight overflows, and
  becomes 0, above a log-ratio of :math:`\log(3.4\cdot10^{38}) = 88.72`; the mirror reproduces
  that threshold;
- the configurations ``ClippedPGLossFn`` refuses are refused with its reasons (a ratio without a
  type, a type without a positive ratio, a minimum above the ratio, ``icepop``/``seq-mask-tis``
  without a minimum, ``seq-mask-tis`` with sequence-level ratios); a minimum of 0 or below is
  accepted, as NeMo-RL accepts it, and cuts nothing from below;
- ``truncated_importance_sampling_type``: ``"tis"`` clamps to
  :math:`[\text{ratio\_min} \text{ or } 0, \text{ratio}]` (the toolkit's ``tis:C`` without a
  minimum, except that an overflowed weight stays 0); ``"icepop"`` zeroes weights outside
  :math:`[\text{min}, \text{max}]` (``icepop:LO:HI``); ``"seq-mask-tis"`` zeroes whole
  sequences whose **geometric mean** :math:`e^{\overline{\Delta}}` (mean over ``token_mask``)
  is outside the bounds, and keeps the raw, **untruncated** token weights of the others
  (``geo-rs:LO:HI``, reference bounds 0.999-1.002);
- the bound rules: ``tis`` and ``icepop`` compare the weights themselves (an overflowed weight
  is 0) with the bounds, a weight at a bound kept (:data:`NEMO_WEIGHT_RULE`); ``seq-mask-tis``
  compares the mean log-ratio with the logs of the bounds, a bound kept (:data:`SEQUENCE_RULE`;
  with min = max, :math:`e^{\overline{\Delta}}` in linear space, kept only at the bound);
- ``is_oob_ratio``: the fraction of tokens (``tis``, ``icepop``) or of sequences
  (``seq-mask-tis``) outside the bounds; ``sampling_importance_ratio``: the mean weight after
  truncation or masking, over tokens (over sequences with sequence-level ratios).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, TRUNCATION_TYPES, BoundRule, log_bounds

__all__ = [
    "NEMO_MEAN",
    "NEMO_WEIGHT_RULE",
    "POINT_BAND_RULE",
    "SEQUENCE_RULE",
    "clipped_pg_importance_weights",
]

#: NeMo-RL's token bound rule: the weight (0 where it overflowed) against the bounds, both kept.
NEMO_WEIGHT_RULE = BoundRule(CLOSED, "value", "float64")
#: ``seq-mask-tis``'s rule: the mean log-ratio against the bounds' logs, both kept.
SEQUENCE_RULE = BoundRule(CLOSED, "log", "float64")
#: ``seq-mask-tis`` with min = max: :math:`e^{\overline{\Delta}}` against the bound in linear space.
POINT_BAND_RULE = BoundRule(CLOSED, "linear", "float64")
#: NeMo-RL's ``masked_mean``: the count plus :math:`10^{-8}`, every token of the batch pooled.
NEMO_MEAN = MeanRule("eps", 1e-8, "tokens")


def clipped_pg_importance_weights(
    prev_logprobs,
    generation_logprobs,
    token_mask,
    sample_mask=None,
    *,
    sequence_level_importance_ratios: bool = False,
    truncated_importance_sampling_type: str | None = None,
    truncated_importance_sampling_ratio: float | None = None,
    truncated_importance_sampling_ratio_min: float | None = None,
    micro_batch_size: int | None = 1,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute NeMo-RL's actor importance weights and its mismatch metrics.

    The metrics: ``token_mult_prob_error``, ``sampling_importance_ratio`` and, with a truncation,
    ``is_oob_ratio``.

    Parameters
    ----------
    prev_logprobs, generation_logprobs : array_like, shape (B, T)
        The trainer's and the generation engine's token log-probabilities (already aligned:
        NeMo-RL's ``[:, 1:]`` slices done).
    token_mask : array_like, shape (B, T)
    sample_mask : array_like, shape (B,), optional
        1 for a sequence that counts (default all).
    sequence_level_importance_ratios : bool
    truncated_importance_sampling_type : {None, "tis", "icepop", "seq-mask-tis"}
        One of :data:`~variance_lab.ratios.TRUNCATION_TYPES`, or None for no truncation.
    truncated_importance_sampling_ratio : float, optional
        The upper bound; None: no truncation.
    truncated_importance_sampling_ratio_min : float, optional
        The lower bound (required for ``icepop`` and ``seq-mask-tis``; ``tis`` defaults to 0).
    micro_batch_size : int, optional
        NeMo-RL's ``train_micro_batch_size``: the rows in order form micro-batches of this size
        (the last may be smaller). It changes only the sequence-level ``sampling_importance_ratio``,
        which NeMo-RL logs as the micro-batches' sum of
        :math:`S_{mb} \sum_{i \in mb} w_i / (S + 10^{-8})` (a broadcast in its ``masked_mean``;
        :math:`S` the valid samples): the mean weight for micro-batches of one (the default),
        about ``micro_batch_size`` times it otherwise. None: the batch is one micro-batch.
        Dynamic batching and sequence packing are not mirrored.

    Returns
    -------
    (weights, metrics)
        Weights of shape (B, T), or (B, 1) with sequence-level ratios.
    """
    tm = as_mask(token_mask, "token_mask")
    sm = np.ones(tm.shape[0]) if sample_mask is None else np.asarray(sample_mask, dtype=np.float64)
    if sm.shape != (tm.shape[0],) or not np.all((sm == 0) | (sm == 1)):
        raise ValueError(f"sample_mask must be 0/1 of shape ({tm.shape[0]},), got shape {sm.shape}")
    mask = tm * sm[:, None]
    prev = as_values(prev_logprobs, tm, "prev_logprobs")
    gen = as_values(generation_logprobs, tm, "generation_logprobs")
    kind, hi, lo = (
        truncated_importance_sampling_type,
        truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min,
    )
    _check_truncation(kind, hi, lo, sequence_level_importance_ratios)
    if micro_batch_size is not None and (
        isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1
    ):
        raise ValueError(f"micro_batch_size must be an integer >= 1, got {micro_batch_size!r}")
    delta = prev - gen
    metrics = {"token_mult_prob_error": float(NEMO_MEAN.mean(np.exp(np.abs(delta) * mask), mask))}
    with np.errstate(over="ignore"):
        x = (delta * mask).sum(axis=-1, keepdims=True) if sequence_level_importance_ratios else delta
        w = np.exp(x)
        # NeMo-RL's float32 weight is inf, then 0 (nan_to_num), above log(float32 max) = 88.72
        overflow = ~np.isfinite(np.exp(x.astype(np.float32)))
    w = np.where(np.isfinite(w) & ~overflow, w, 0.0)
    if hi is not None and kind is not None:
        if kind == "tis":
            floor = 0.0 if lo is None else lo
            metrics["is_oob_ratio"] = float(
                NEMO_MEAN.mean(np.broadcast_to(NEMO_WEIGHT_RULE.outside(w, floor, hi), mask.shape), mask)
            )
            w = np.clip(w, floor, hi)  # an overflowed weight, set to 0 above, stays 0
        elif kind == "icepop":
            out = NEMO_WEIGHT_RULE.outside(w, lo, hi)
            metrics["is_oob_ratio"] = float(NEMO_MEAN.mean(np.broadcast_to(out, mask.shape), mask))
            w = np.where(out, 0.0, w)
        else:
            mean_delta = NEMO_MEAN.mean(delta, tm, axis=-1)
            if lo < hi:  # a minimum <= 0 (NeMo-RL accepts one) bounds nothing from below
                out = SEQUENCE_RULE.outside(mean_delta, *log_bounds(max(lo, 0.0), hi))
            else:
                out = POINT_BAND_RULE.outside(mean_delta, lo, hi)
            kept = (~out).astype(float)
            metrics["is_oob_ratio"] = float(NEMO_MEAN.mean(1.0 - kept, sm))
            w = w * kept[:, None]
    if sequence_level_importance_ratios:
        metrics["sampling_importance_ratio"] = _logged_sequence_ratio(w[:, 0], sm, micro_batch_size)
    else:
        metrics["sampling_importance_ratio"] = float(NEMO_MEAN.mean(w, mask))
    return w, metrics


def _logged_sequence_ratio(w: np.ndarray, sm: np.ndarray, micro_batch_size: int | None) -> float:
    r"""NeMo-RL's logged sequence-level ``sampling_importance_ratio``, a broadcast included.

    ``masked_mean(actor_importance_weights, sample_mask, global_valid_seqs)`` multiplies the
    ``(b, 1)`` weights of a micro-batch by its ``(b,)`` sample mask: a ``(b, b)`` product whose sum
    is :math:`\sum_{i \in mb} w_i \cdot \sum_{j \in mb} s_j`, every row's weight, masked rows
    included (``loss_functions.py:697-702`` at 7ea279a); the step sums the micro-batches
    (``grpo.py:3491``). So it logs :math:`\sum_{mb} S_{mb} \sum_{i \in mb} w_i / (S + 10^{-8})`,
    which is the mean it means, :math:`\sum_i s_i w_i / S`, only for micro-batches of one.
    """
    size = sm.size if micro_batch_size is None else micro_batch_size
    total = sum(w[lo : lo + size].sum() * sm[lo : lo + size].sum() for lo in range(0, sm.size, size))
    return float(NEMO_MEAN.divide(total, sm.sum()))


def _check_truncation(kind, hi, lo, sequence_level: bool) -> None:
    """Refuse what ``ClippedPGLossFn`` refuses, with its reasons (``loss_functions.py:316-350``)."""
    if kind is not None and kind not in TRUNCATION_TYPES:
        raise ValueError(
            f"bad truncated_importance_sampling_type {kind!r}; types are tis, icepop, seq-mask-tis"
        )
    if kind is None and hi is not None:  # __call__ raises on the ratio with no type
        raise ValueError("Invalid truncated importance sampling type: None (a ratio needs a type)")
    if kind is not None and (hi is None or not hi > 0):
        raise ValueError(f"truncated_importance_sampling_ratio should be positive, got {hi!r}")
    if lo is not None and not lo <= hi:
        raise ValueError(
            f"truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio, "
            f"got {lo!r} > {hi!r}"
        )
    if kind in ("icepop", "seq-mask-tis") and lo is None:
        raise ValueError(f"truncated_importance_sampling_ratio_min should be set for {kind!r}")
    if kind == "seq-mask-tis" and sequence_level:
        raise ValueError("seq-mask-tis is incompatible with sequence_level_importance_ratios=True")
