r"""AReaL's M2PO mask (``actor.m2_threshold``) in NumPy, over the corrections' M2PO rule.

A mirror of ``_apply_m2po_masking`` and ``_get_m2po_loss_mask`` in
``areal/trainer/ppo/actor.py`` (lines 769-850) and of what ``grpo_loss_fn`` (408-560) logs over
the mask they return, inclusionAI/AReaL at ``4aef98d`` (4aef98d8d818af55b43621aaadba047ae10f4e77,
2026-05-21; ``m2_threshold: float | None = None`` in ``areal/api/cli_args.py:1412``, no check).
Checked against those two functions run verbatim with torch (``tools/areal_fixtures.py``,
``tests/data/frameworks/areal.*``) on float32 and float64 log-probs with bool, int64 and float32
loss masks.

AReaL's conventions, all kept:

- :math:`y = \log\pi_{behave} - \log\pi_{prox}` (``old_logp - prox_logp``; the proximal policy
  is the recomputed one, or its approximation), :math:`y^2` per token;
- the rule pools **every loss-mask token of the micro-batch** (``loss_mask.view(-1)``), sorts
  :math:`y^2` in descending order and masks the largest until the mean of the rest is
  **strictly** below :math:`\tau` (:func:`variance_lab.corrections.m2po.batch_mask`, the
  toolkit's ``m2po:TAU``); when no mean is below :math:`\tau` every token but the one with the
  smallest :math:`y^2` is masked; a micro-batch without loss-mask tokens is left as it is;
- computed in the log-probs' dtype (float32 in AReaL): :math:`y^2`, the running sums from the
  smallest up (its ``flip().cumsum().flip()``), the counts and the means, compared with
  :math:`\tau` cast to that dtype (:data:`M2PO_RULE`, :data:`M2PO_F32_RULE`);
- the mask it returns replaces the loss mask: ``n_valid_tokens`` (logged as a sum) counts the
  tokens kept, and every ``stats_tracker.stat`` with that denominator (``old_logp``,
  ``importance_weight``, ``clip_ratio``, ...) averages over them: :math:`\sum_{kept} x /
  n_{kept}`, no :math:`\varepsilon`, pooled over the step's micro-batches, dropped when empty
  (``stats_tracker._avg_of``: :data:`AREAL_MEAN`).

Among tokens of exactly equal :math:`y^2` at the cut, which are masked is the order of AReaL's
``torch.sort(m2_selected, descending=True)`` (``actor.py:798``), which keeps equal values in
order of appearance on a CPU only up to 16 of them: the mirror sorts with torch's own sort where
torch is installed (:func:`~variance_lab.frameworks.batch.sort_descending`), so its mask is
AReaL's CPU run's, ties included (all 9,172 loss-mask tokens of the fixtures; 92 of them, at
ties, differ under the order of appearance). On a GPU torch orders ties otherwise again, and
without torch the mirror keeps the order of appearance; the number masked of each :math:`y^2`
is the same in every case.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections.m2po import M2PO_RULE, batch_mask
from variance_lab.frameworks.batch import MeanRule, as_values, sort_descending, torch_mask
from variance_lab.ratios import RIGHT_OPEN, BoundRule

__all__ = ["AREAL_MEAN", "M2PO_F32_RULE", "M2PO_RULE", "m2po_loss_mask"]

#: The float32 test of a running mean of :math:`y^2` against ``m2_threshold``: strictly below, in
#: float32 (AReaL's float32 log-probs; :data:`M2PO_RULE`, the corrections' own, on float64).
M2PO_F32_RULE = BoundRule(RIGHT_OPEN, "value", "float32")
#: ``stats_tracker``'s average of a token statistic over its denominator mask: the sum over the
#: mask's tokens divided by their number, no :math:`\varepsilon`, pooled over tokens.
AREAL_MEAN = MeanRule("exact", 0.0, "tokens", dtypes="torch")


def m2po_loss_mask(
    old_logp, prox_logp, loss_mask, m2_threshold: float
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Return AReaL's loss mask after M2PO, and the logged statistics it changes.

    Parameters
    ----------
    old_logp, prox_logp : array_like, shape (B, T)
        The behaviour policy's log-probs (``input_data["logprobs"]``) and the proximal policy's;
        float32 (computed in float32, as AReaL) or float64. A packed micro-batch is one row.
    loss_mask : array_like, shape (B, T)
        0/1: bool, integer or float (AReaL reads it as ``.bool()``).
    m2_threshold : float
        :math:`\tau`, the bound of the mean :math:`y^2` over the tokens kept (any number but NaN:
        AReaL checks none; :math:`\tau \le 0` keeps one token).

    Returns
    -------
    mask : ndarray of bool, shape (B, T)
        The loss mask with the M2PO-masked tokens removed.
    stats : dict of str to float
        ``n_valid_tokens`` (the tokens kept), ``m2po_masked`` (the tokens M2PO removed),
        ``old_logp/avg``, ``old_logp/min``, ``old_logp/max`` over the kept tokens (NaN when
        none), and ``m2`` the mean :math:`y^2` over them (below :math:`\tau` unless only one is
        kept).
    """
    if (
        isinstance(m2_threshold, bool)
        or not isinstance(m2_threshold, int | float)
        or math.isnan(m2_threshold)
    ):
        raise ValueError(f"bad m2_threshold {m2_threshold!r}: expected a number")
    m = torch_mask(loss_mask, "loss_mask") != 0
    old = as_values(old_logp, m, "old_logp", keep_float32=True)
    prox = as_values(prox_logp, m, "prox_logp", keep_float32=True)
    y = old - prox
    rule = M2PO_F32_RULE if y.dtype == np.float32 else M2PO_RULE
    keep = m.copy()
    selected = y[m]  # row-major: AReaL's m2.view(-1)[mask_flat]
    if selected.size:
        # AReaL's torch.sort(m2_selected, descending=True) (actor.py:798): batch_mask sorts the
        # tokens so ordered into the same order (a stable sort of a sorted array), ties included
        order = sort_descending(selected * selected)
        masked = np.empty(selected.shape, dtype=bool)
        masked[order] = batch_mask(selected[order], float(m2_threshold), rule)
        keep[m] = ~masked
    n = int(keep.sum())
    with np.errstate(invalid="ignore"):
        stats = {
            "n_valid_tokens": float(n),
            "m2po_masked": float(m.sum() - n),
            "old_logp/avg": float(AREAL_MEAN.mean(old, keep)),
            "old_logp/min": float(old[keep].min()) if n else math.nan,
            "old_logp/max": float(old[keep].max()) if n else math.nan,
            "m2": float(AREAL_MEAN.mean(y * y, keep)),
        }
    return keep, stats
