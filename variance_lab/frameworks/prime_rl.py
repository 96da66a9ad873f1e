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
- metrics are means over ``loss_mask`` with the count clamped to at least 1 (``_safe_mean``):
  ``is_masked``, ``is_masked_low``, ``is_masked_high``, ``masked_mismatch_kl`` (over the masked
  tokens), ``unmasked_mismatch_kl`` (over the kept ones), ``masked_advantage_positive`` and
  ``_negative`` (the share of masked tokens with each advantage sign).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, BoundRule

__all__ = ["PRIME_RL_MEAN", "PRIME_RL_RULE", "compute_importance_ratio_and_mismatch_kl", "dppo_mask"]

#: prime-rl's DPPO bound rule: the probability difference against the bounds as it is (no log, no
#: exp), a difference exactly at a bound kept (``d > high`` and ``d < -low`` mask).
PRIME_RL_RULE = BoundRule(CLOSED, "value", "float64")
#: ``_safe_mean``: the count clamped to at least 1, every token of the batch pooled.
PRIME_RL_MEAN = MeanRule("at_least_one", 0.0, "tokens")


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


def _safe_mean(values: np.ndarray, mask: np.ndarray) -> float:
    return float(PRIME_RL_MEAN.mean(values, mask.astype(np.float64)))


def dppo_mask(
    trainer_logprobs,
    inference_logprobs,
    advantages,
    loss_mask,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Return prime-rl's DPPO keep mask (``loss_mask & ~is_masked``) and its metrics.

    Parameters
    ----------
    trainer_logprobs, inference_logprobs : array_like, shape (B, T)
    advantages : array_like, shape (B, T) or (B, 1)
        Per token (prime-rl broadcasts a sequence's advantage onto its tokens).
    loss_mask : array_like, shape (B, T)
    dppo_mask_low, dppo_mask_high : float, default 0.2
        Bounds on :math:`\pi_{trainer} - \pi_{inference}`, >= 0.
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
    metrics = {
        "masked_mismatch_kl": _safe_mean(kl, drop),
        "unmasked_mismatch_kl": _safe_mean(kl, keep),
        "is_masked": _safe_mean(masked.astype(float), lm),
        "is_masked_low": _safe_mean((neg & low).astype(float), lm),
        "is_masked_high": _safe_mean((pos & high).astype(float), lm),
        "masked_advantage_positive": _safe_mean(pos.astype(float), drop),
        "masked_advantage_negative": _safe_mean(neg.astype(float), drop),
    }
    return keep.astype(np.float64), metrics
