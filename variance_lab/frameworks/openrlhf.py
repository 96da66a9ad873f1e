r"""OpenRLHF's vLLM importance-sampling correction (``tis``, ``icepop``, ``seq-mask-tis``), in NumPy.

A mirror of the ``enable_vllm_is_correction`` block of ``PolicyLoss.forward`` in
``openrlhf/models/loss.py`` and ``masked_mean`` of ``openrlhf/models/utils.py``
(OpenRLHF/OpenRLHF at ``3c3be62``, 2026-08-13; defaults ``--algo.advantage.is_correction_type
tis`` and ``--algo.advantage.is_correction_threshold 0.5 5.0`` in
``openrlhf/cli/train_ppo_ray.py``). Checked by hand-computed cases from that source
(``tests/frameworks/test_others.py``); OpenRLHF is not installed here.

OpenRLHF's conventions, all kept:

- :math:`y = \log\pi_{old} - \log\pi_{rollout}`, bounds :math:`[0.5, 5]` by default (Ring-1T's
  IcePop band, the toolkit's ``icepop`` default);
- ``tis``: :math:`\operatorname{clip}(e^y, 0.5, 5)`, clamped **from below too**;
  ``icepop``: :math:`e^y 1\{0.5 \le e^y \le 5\}` (the toolkit's ``icepop:0.5:5``);
  ``seq-mask-tis``: a sequence is kept when its geometric mean :math:`e^{\bar y}` lies in the
  bounds (the toolkit's ``geo-rs:0.5:5``), and its tokens then get the raw ratio
  :math:`e^{y_t}`, **not truncated** (the source's comment says "still use TIS (token-level
  clamp)", its code multiplies by the unclamped ratio);
- the bound rule (:data:`OPENRLHF_RULE`): ``icepop`` and ``seq-mask-tis`` keep a ratio exactly at
  either bound (``>= low``, ``<= high``) and compare :math:`e^y` (resp. :math:`e^{\bar y}`) with
  the bounds in **linear** space; a low bound of 0 is accepted (it masks nothing below);
- ``vllm_kl`` :math:`= \overline{\log\pi_{rollout} - \log\pi_{old}}` over the action mask
  (``masked_mean`` divides by the count with no :math:`\varepsilon`).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, ICEPOP_BAND, TRUNCATION_TYPES, BoundRule

__all__ = ["OPENRLHF_MEAN", "OPENRLHF_RULE", "vllm_is_correction"]

#: OpenRLHF's bound rule: a ratio at either bound is kept, compared in linear space (float64 here).
OPENRLHF_RULE = BoundRule(CLOSED, "linear", "float64")
#: OpenRLHF's ``masked_mean``: the count itself, no :math:`\varepsilon` (an empty mask gives NaN).
OPENRLHF_MEAN = MeanRule("exact", 0.0, "tokens")


def vllm_is_correction(
    old_log_probs,
    rollout_log_probs,
    action_mask,
    vllm_is_truncated_threshold=ICEPOP_BAND,
    vllm_is_correction_type: str = "tis",
) -> tuple[np.ndarray, float]:
    r"""Return OpenRLHF's per-token ``vllm_is`` coefficients (0 on padding) and ``vllm_kl``.

    Parameters
    ----------
    old_log_probs, rollout_log_probs : array_like, shape (B, T)
    action_mask : array_like, shape (B, T)
    vllm_is_truncated_threshold : (float, float), default :data:`~variance_lab.ratios.ICEPOP_BAND`
        ``[low, high]``, 0 <= low < high.
    vllm_is_correction_type : {"tis", "icepop", "seq-mask-tis"}
        One of :data:`~variance_lab.ratios.TRUNCATION_TYPES`.
    """
    m = as_mask(action_mask, "action_mask")
    old = as_values(old_log_probs, m, "old_log_probs")
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs")
    kind = vllm_is_correction_type
    if kind not in TRUNCATION_TYPES:
        raise ValueError(f"bad vllm_is_correction_type {kind!r}; types are tis, icepop, seq-mask-tis")
    try:
        lo, hi = (float(v) for v in vllm_is_truncated_threshold)
    except (TypeError, ValueError):
        raise ValueError(
            f"bad vllm_is_truncated_threshold {vllm_is_truncated_threshold!r}: expected [low, high]"
        ) from None
    if not 0 <= lo < hi < np.inf:
        raise ValueError(
            f"bad vllm_is_truncated_threshold {vllm_is_truncated_threshold!r}: needs 0 <= low < high"
        )
    y = old - rollout
    if kind == "tis":
        w = np.clip(np.exp(y), lo, hi)
    elif kind == "icepop":
        w = np.where(OPENRLHF_RULE.outside(y, lo, hi), 0.0, np.exp(y))
    else:
        length = m.sum(axis=-1)
        mean_y = (y * m).sum(axis=-1) / np.where(length > 0, length, 1.0)
        out = OPENRLHF_RULE.outside(mean_y, lo, hi)
        w = np.exp(y) * (~out & (length > 0))[:, None]
    vllm_kl = float(OPENRLHF_MEAN.mean(rollout - old, m))
    return w * m, vllm_kl
