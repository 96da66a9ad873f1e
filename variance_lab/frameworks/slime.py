r"""slime's TIS, IcePop and mismatch metrics (``tis``, ``ois``, ``tis_clipfrac``) and its MIS veto, in NumPy.

A mirror of ``vanilla_tis_function``, ``icepop_function`` and the ``ois`` metric of
``policy_loss_function`` in ``slime/backends/megatron_utils/loss.py``, of the per-sample
averaging of ``get_sum_of_sample_mean`` (``slime/backends/megatron_utils/cp_utils.py``), and of
``calculate_veto_mask`` in ``examples/train_infer_mismatch_helper/mis.py`` (THUDM/slime at
``624b824``, 2026-08-21; defaults ``--tis-clip 2``, ``--tis-clip-low 0``, veto ``1e-4`` in
``mis.yaml``). Checked by hand-computed cases from that source
(``tests/frameworks/test_others.py``); slime is not installed here.

slime's conventions, all kept:

- ``tis`` is the raw ratio :math:`e^{y}`, :math:`y = \log\pi_{old} - \log\pi_{rollout}`;
  ``tis_abs`` :math:`= |e^y - 1|`; the TIS weight clamps to ``[tis_clip_low, tis_clip]`` (with
  the default low bound 0 the toolkit's ``tis:2``), IcePop zeroes ratios outside it
  (``icepop:LO:HI``); ``tis_clipfrac`` flags tokens whose weight differs from the ratio;
- ``ois`` :math:`= e^{-\text{ppo\_kl}} = \pi_\theta/\pi_{old}` per token (the update ratio);
- every logged metric is averaged **per sample first** (the mean over the sample's
  ``loss_mask``, count clamped to at least 1), then over the samples (slime's default
  ``calculate_per_token_loss=False``): long and short sequences weigh the same;
- the veto rejects a whole sequence when any of its tokens has :math:`e^y <` the threshold
  (``catastrophic_token_fraction``, ``catastrophic_seq_fraction``);
- the bound rules: IcePop compares the ratio :math:`e^y` with ``[tis_clip_low, tis_clip]`` in
  linear space, a ratio at a bound kept (:data:`ICEPOP_RULE`); the veto compares :math:`y` with
  the threshold's log, a token exactly at the threshold kept (:data:`VETO_RULE`).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, BoundRule

__all__ = ["ICEPOP_RULE", "SLIME_MEAN", "VETO_RULE", "sample_mean", "tis_metrics", "veto_mask"]

#: slime's IcePop: the ratio against the bounds in linear space, both kept.
ICEPOP_RULE = BoundRule(CLOSED, "linear", "float64")
#: slime's veto: the log-ratio against the threshold's log, a token at the threshold kept.
VETO_RULE = BoundRule(CLOSED, "log", "float64")
#: ``get_sum_of_sample_mean``: each sample's mean (count clamped to at least 1), then over samples.
SLIME_MEAN = MeanRule("at_least_one", 0.0, "samples")


def sample_mean(values, loss_mask) -> float:
    r"""Return slime's aggregate of a per-token metric: the mean over samples of each sample's masked mean.

    :math:`\frac1B\sum_i \sum_t m_{it} v_{it} / \max(\sum_t m_{it}, 1)`.
    """
    m = as_mask(loss_mask, "loss_mask")
    v = np.where(m > 0, np.broadcast_to(np.asarray(values, dtype=np.float64), m.shape), 0.0)
    return float(SLIME_MEAN.mean(v, m))


def tis_metrics(
    old_log_probs,
    rollout_log_probs,
    loss_masks,
    log_probs=None,
    *,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    icepop: bool = False,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Return slime's token weights (TIS, or IcePop with ``icepop=True``) and its mismatch metrics.

    Parameters
    ----------
    old_log_probs, rollout_log_probs : array_like, shape (B, T)
        The trainer's and the rollout engine's token log-probabilities.
    loss_masks : array_like, shape (B, T)
    log_probs : array_like, shape (B, T), optional
        The current policy's: adds ``ois``.
    tis_clip, tis_clip_low : float
        The bounds (defaults 2 and 0).
    icepop : bool
        ``icepop_function`` instead of ``vanilla_tis_function``.

    Returns
    -------
    (weights, metrics)
        ``tis``, ``tis_clipfrac``, ``tis_abs`` (and ``ois``), each averaged per sample then over
        samples (:func:`sample_mean`).
    """
    m = as_mask(loss_masks, "loss_masks")
    old = as_values(old_log_probs, m, "old_log_probs")
    y = old - as_values(rollout_log_probs, m, "rollout_log_probs")
    for name, v in (("tis_clip", tis_clip), ("tis_clip_low", tis_clip_low)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
            raise ValueError(f"bad {name} {v!r}: must be a number >= 0")
    if not tis_clip_low <= tis_clip:
        raise ValueError(f"bad tis_clip_low {tis_clip_low!r}: must be <= tis_clip {tis_clip!r}")
    r = np.exp(y)
    w = (
        np.where(ICEPOP_RULE.outside(y, tis_clip_low, tis_clip), 0.0, r)
        if icepop
        else np.clip(r, tis_clip_low, tis_clip)
    )
    metrics = {
        "tis": sample_mean(r, m),
        "tis_clipfrac": sample_mean((w != r).astype(float), m),
        "tis_abs": sample_mean(np.abs(r - 1.0), m),
    }
    if log_probs is not None:
        metrics["ois"] = sample_mean(np.exp(as_values(log_probs, m, "log_probs") - old), m)
    return w * m, metrics


def veto_mask(old_log_probs, rollout_log_probs, loss_masks, veto_threshold: float = 1e-4):
    r"""Return slime's MIS veto: (B, T) keep mask, 0 for a sequence with a token ratio below the threshold.

    Metrics ``catastrophic_token_fraction`` (tokens with :math:`\log r < \log` threshold) and
    ``catastrophic_seq_fraction``, averaged per sample then over samples.
    """
    m = as_mask(loss_masks, "loss_masks")
    y = as_values(old_log_probs, m, "old_log_probs") - as_values(rollout_log_probs, m, "rollout_log_probs")
    if (
        isinstance(veto_threshold, bool)
        or not isinstance(veto_threshold, int | float)
        or not veto_threshold > 0
    ):
        raise ValueError(f"bad veto_threshold {veto_threshold!r}: must be a number > 0")
    bad = VETO_RULE.outside(y, float(np.log(veto_threshold)), None) & (m > 0)
    seq_bad = bad.any(axis=-1)
    metrics = {
        "catastrophic_token_fraction": sample_mean(bad.astype(float), m),
        "catastrophic_seq_fraction": sample_mean(np.broadcast_to(seq_bad[:, None], m.shape).astype(float), m),
    }
    return np.broadcast_to((~seq_bad)[:, None], m.shape).astype(np.float64), metrics
