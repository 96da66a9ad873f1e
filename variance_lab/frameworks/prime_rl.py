r"""prime-rl's mismatch KL and DPPO trust-region mask, in NumPy.

A mirror of ``compute_importance_ratio_and_mismatch_kl`` and the mask and metrics of
``default_loss_fn`` in ``src/prime_rl/trainer/rl/loss.py`` (PrimeIntellect-ai/prime-rl at
``559b447``, 2026-08-21; defaults ``dppo_mask_low = dppo_mask_high = 0.2`` from
``packages/prime-rl-configs/src/prime_rl/configs/trainer.py``). Checked by hand-computed cases
from that source (``tests/frameworks/test_others.py``); prime-rl is not installed here.

prime-rl's conventions, all kept:

- :math:`y = \log\pi_{trainer} - \log\pi_{inference}`, ``importance_ratio`` :math:`= e^y`,
  ``mismatch_kl`` :math:`= e^y - y - 1` per token (verl's ``k3``; prime-rl's token exports
  write it per token);
- the DPPO mask acts on **probability** differences :math:`d = \pi_{trainer} - \pi_{inference}`
  (not on the ratio): with a positive advantage a token is masked when :math:`d >` ``dppo_mask_high``,
  otherwise (advantage :math:`\le 0`, zero included) when :math:`d < -`\ ``dppo_mask_low``;
  ``is_masked_high`` counts only positive-advantage tokens, ``is_masked_low`` only
  negative-advantage ones, so with zero advantages ``is_masked`` exceeds their sum;
- ``default_loss_fn`` runs on **one sample at a time** (``compute_loss`` splits the packed
  micro-batch by ``sequence_lengths``, ``loss.py:358``), so each metric is one value per sample:
  a mean over that sample's ``loss_mask`` with the count clamped to at least 1 (``_safe_mean``;
  0 for a sample with nothing to average): ``is_masked``, ``is_masked_low``, ``is_masked_high``,
  ``masked_mismatch_kl`` (over the masked tokens), ``unmasked_mismatch_kl`` (over the kept ones),
  ``masked_advantage_positive`` and ``_negative`` (the share of masked tokens with each
  advantage sign). The step logs ``<metric>/mean``, ``/median``, ``/std``, ``/min`` and ``/max``
  over the per-sample values of every micro-batch and rank (``Tensors.compute_stats``,
  ``trainer/utils.py:245``): :func:`tensor_stats`. A long and a short sample weigh the same; a
  token-pooled mean differed on 57 of 90 random batches (issue #35:
  ``masked_advantage_positive`` 1.0 pooled, 0.25 as logged).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, BoundRule

__all__ = [
    "PRIME_RL_MEAN",
    "PRIME_RL_RULE",
    "compute_importance_ratio_and_mismatch_kl",
    "dppo_mask",
    "tensor_stats",
]

#: prime-rl's DPPO bound rule: the probability difference against the bounds as it is (no log, no
#: exp), a difference exactly at a bound kept (``d > high`` and ``d < -low`` mask).
PRIME_RL_RULE = BoundRule(CLOSED, "value", "float64")
#: ``_safe_mean`` per sample (the count clamped to at least 1), then ``<metric>/mean`` over samples.
PRIME_RL_MEAN = MeanRule("at_least_one", 0.0, "samples")


def compute_importance_ratio_and_mismatch_kl(trainer_logprobs, inference_logprobs, loss_mask=None):
    r"""Return (log_importance_ratio, importance_ratio, mismatch_kl) per token, 0 where ``loss_mask`` is 0.

    :math:`y = \log\pi_{trainer} - \log\pi_{inference}`, :math:`e^y`, :math:`e^y - y - 1`.
    """
    t = np.asarray(trainer_logprobs, dtype=np.float64)
    m = as_mask(
        np.ones(t.shape) if loss_mask is None else loss_mask, "loss_mask", t.shape if t.ndim == 2 else None
    )
    y = as_values(trainer_logprobs, m, "trainer_logprobs") - as_values(
        inference_logprobs, m, "inference_logprobs"
    )
    r = np.exp(y)
    return y * m, r * m, (r - y - 1.0) * m


def tensor_stats(values) -> dict[str, float]:
    """Return prime-rl's logged statistics of one metric's per-sample values.

    ``Tensors.compute_stats``: ``mean``, ``median`` (torch's: the lower of the two middle values
    for an even count), ``std`` (with :math:`n - 1`), ``min``, ``max``; NaN for each when there are
    no values.

    Parameters
    ----------
    values : array_like, 1-D
        The values of every sample of the step.

    Returns
    -------
    dict of str to float
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return dict.fromkeys(("mean", "median", "std", "min", "max"), float("nan"))
    std = float(np.std(v, ddof=1)) if v.size > 1 else float("nan")
    lower_median = float(np.sort(v)[(v.size - 1) // 2])
    return {
        "mean": float(v.mean()),
        "median": lower_median,
        "std": std,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def dppo_mask(
    trainer_logprobs,
    inference_logprobs,
    advantages,
    loss_mask,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    *,
    per_sample: bool = False,
) -> tuple[np.ndarray, dict]:
    r"""Return prime-rl's DPPO keep mask (``loss_mask & ~is_masked``) and its metrics.

    Each row is one sample, as ``default_loss_fn`` sees it. A metric is what prime-rl logs as
    ``<metric>/mean``: the mean over the rows of each row's ``_safe_mean``
    (:data:`PRIME_RL_MEAN`); with ``per_sample=True`` it is the array of the per-row values, for
    :func:`tensor_stats` (the median, std, min and max prime-rl also logs).

    Parameters
    ----------
    trainer_logprobs, inference_logprobs : array_like, shape (B, T)
    advantages : array_like, shape (B, T) or (B, 1)
        Per token (prime-rl broadcasts a sequence's advantage onto its tokens).
    loss_mask : array_like, shape (B, T)
    dppo_mask_low, dppo_mask_high : float, default 0.2
        Bounds on :math:`\pi_{trainer} - \pi_{inference}`, >= 0.
    per_sample : bool
        Return each metric per row (shape ``(B,)``) instead of its mean over the rows.

    Returns
    -------
    keep : ndarray, shape (B, T)
    metrics : dict of str to float, or to ndarray of shape (B,)
    """
    m = as_mask(loss_mask, "loss_mask")
    t = as_values(trainer_logprobs, m, "trainer_logprobs")
    i = as_values(inference_logprobs, m, "inference_logprobs")
    a = np.asarray(advantages, dtype=np.float64)
    if a.shape not in (m.shape, (m.shape[0], 1)) or not np.all(np.isfinite(a)):
        raise ValueError(f"advantages must be finite, of shape {m.shape} or ({m.shape[0]}, 1), got {a.shape}")
    for name, v in (("dppo_mask_low", dppo_mask_low), ("dppo_mask_high", dppo_mask_high)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
            raise ValueError(f"bad {name} {v!r}: must be a number >= 0")
    a = np.broadcast_to(a, m.shape)
    y = t - i
    r = np.exp(y)
    kl = r - y - 1.0
    d = np.exp(t) - np.exp(i)
    high, low = PRIME_RL_RULE.outside(d, None, dppo_mask_high), PRIME_RL_RULE.outside(d, -dppo_mask_low, None)
    pos, neg = a > 0, a < 0
    masked = np.where(pos, high, low)
    lm = m > 0
    drop, keep = lm & masked, lm & ~masked
    parts = {
        "masked_mismatch_kl": (kl, drop),
        "unmasked_mismatch_kl": (kl, keep),
        "is_masked": (masked, lm),
        "is_masked_low": (neg & low, lm),
        "is_masked_high": (pos & high, lm),
        "masked_advantage_positive": (pos, drop),
        "masked_advantage_negative": (neg, drop),
    }
    rows = {
        k: PRIME_RL_MEAN.mean(v.astype(np.float64), w.astype(np.float64), axis=-1)
        for k, (v, w) in parts.items()
    }
    metrics = rows if per_sample else {k: float(np.mean(v)) for k, v in rows.items()}
    return keep.astype(np.float64), metrics
