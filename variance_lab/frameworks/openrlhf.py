r"""OpenRLHF's policy-loss ratios in NumPy: the vLLM correction, GSPO's ratio, the logged metrics.

A mirror of ``PolicyLoss.forward`` in ``openrlhf/models/loss.py`` (lines 155-230) and
``masked_mean`` of ``openrlhf/models/utils.py`` (166-169), OpenRLHF/OpenRLHF at ``3c3be62``
(3c3be6234e0cb353e76bb8019947db9dfe99fca7, 2026-08-13). Defaults from
``openrlhf/cli/train_ppo_ray.py``: ``--algo.advantage.is_correction_type tis``,
``--algo.advantage.is_correction_threshold 0.5 5.0`` (257-270), ``--actor.eps_clip 0.2`` for both
ends (387-388, 594-595), ``--actor.policy_loss_type ppo`` (420). Checked against that
``PolicyLoss`` run verbatim (``tools/openrlhf_fixtures.py``, ``tests/data/frameworks/openrlhf.*``):
float32 and float64 log-probs, int64, bool, float32 and float64 masks, ratios exactly at the
bounds, fully masked rows.

OpenRLHF's conventions, all kept:

- :math:`y = \log\pi_{old} - \log\pi_{rollout}`; ``tis``: :math:`\operatorname{clip}(e^y,
  low, high)`, clamped **from below too** (``torch.clamp``: where ``low > high`` every weight is
  ``high``); ``icepop``: :math:`e^y 1\{low \le e^y \le high\}` (the toolkit's ``icepop``);
  ``seq-mask-tis``: a sequence is kept when its geometric mean :math:`e^{\bar y}` lies in the
  bounds (the toolkit's ``geo-rs``), and its tokens then get the raw ratio :math:`e^{y_t}`,
  **not truncated** (the source's comment says "still use TIS (token-level clamp)", its code
  multiplies by the unclamped ratio); a fully masked row's mean is :math:`0/0`, NaN, so it is
  dropped; a ratio that overflows (:math:`y > 88.72` on float32 tensors, 709.78 on float64) and
  is masked becomes ``inf * 0 = NaN``, not 0, in OpenRLHF (``vllm_is * mask``, lines 203-204 and
  213), which makes the whole loss NaN: the mirror returns that NaN (prime-rl's IcePop masks
  before exponentiating to avoid it);
- the bound rule: ``icepop`` and ``seq-mask-tis`` keep a ratio exactly at either bound (``>=
  low``, ``<= high``) and compare :math:`e^y` (resp. :math:`e^{\bar y}`), computed in the
  tensors' dtype, with the bounds cast to that dtype (torch compares a tensor with a Python
  number in the tensor's dtype): :data:`OPENRLHF_RULE` on float64 tensors,
  :data:`OPENRLHF_F32_RULE` on float32 ones (float32 log-probs: real runs, ``torch.tensor`` of
  vLLM's Python floats in ``samples_generator.py:271``). Any pair of thresholds is accepted, as
  OpenRLHF accepts it (a low bound of 0 masks nothing below);
- the ``ppo`` ratio is :math:`e^{\operatorname{clip}(\log\pi - \log\pi_{old}, -20, 20)}`; the
  ``gspo`` ratio is :math:`e^{\bar\ell}` per sequence, :math:`\bar\ell` the mean of
  :math:`\log\pi - \log\pi_{rollout}` with the vLLM correction on (the total ratio: update times
  mismatch, no separate vLLM weight and no ``vllm_kl``), of :math:`\log\pi - \log\pi_{old}`
  without it, over :math:`\max(\text{count}, 1)` (:data:`GSPO_MEAN`);
- the logged metrics (``ppo_actor.py:306-317``): ``ppo_clip_ratio``, the fraction of tokens where
  the clipped surrogate is the smaller, :math:`\operatorname{clip}(r, 1-\epsilon_l,
  1+\epsilon_h) A < r A` in the tensors' dtype; ``ppo_kl`` :math:`= \overline{\log\pi_{old} -
  \log\pi}`; ``vllm_kl`` :math:`= \overline{\log\pi_{rollout} - \log\pi_{old}}` (``ppo`` with the
  correction on only); each through ``masked_mean``, the count itself as divisor, no
  :math:`\varepsilon` (:data:`OPENRLHF_MEAN`: an empty mask gives NaN), in torch's dtypes
  (:func:`~variance_lab.frameworks.batch.torch_dtypes`).

The mirror computes in the log-probs' dtype (float32 stays float32, anything else is float64)
with the mask's dtype (:func:`~variance_lab.frameworks.batch.torch_mask`). Where it can still
differ from OpenRLHF: a float32 mean by the rounding of its order of summation, a weight by one
ulp where torch's float32 exp is not correctly rounded
(:func:`~variance_lab.frameworks.batch.exp_like`), so a ratio within one ulp of a bound can fall
on the other side. Not mirrored: the loss value (``aggregate_loss``, dual-clip), the averaging
of the metrics over micro-batches (``ppo_actor.py:246-258``).
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_values, exp_like, torch_dtypes, torch_mask, torch_rule
from variance_lab.ratios import ICEPOP_BAND, TRUNCATION_TYPES

__all__ = [
    "GSPO_MEAN",
    "OPENRLHF_F32_RULE",
    "OPENRLHF_MEAN",
    "OPENRLHF_RULE",
    "POLICY_LOSS_TYPES",
    "PPO_LOG_RATIO_CLAMP",
    "policy_loss_metrics",
    "vllm_is_correction",
]

#: OpenRLHF's bound rule on float64 tensors: :math:`e^y` (or :math:`e^{\bar y}`) against the
#: thresholds, a ratio at either bound kept.
OPENRLHF_RULE = torch_rule(np.float64)
#: The same on float32 tensors: the float32 ratio against the thresholds rounded to float32.
OPENRLHF_F32_RULE = torch_rule(np.float32)
#: OpenRLHF's ``masked_mean``: ``(tensor * mask).sum() / mask.sum()``, no :math:`\varepsilon` (an
#: empty mask gives NaN), in torch's dtypes.
OPENRLHF_MEAN = MeanRule("exact", 0.0, "tokens", dtypes="torch")
#: GSPO's per-sequence mean log-ratio: ``.sum(-1) / action_mask.sum(-1).clamp(min=1)``.
GSPO_MEAN = MeanRule("at_least_one", 0.0, "tokens", dtypes="torch")
#: ``--actor.policy_loss_type``.
POLICY_LOSS_TYPES = ("ppo", "gspo")
#: The ``ppo`` log-ratio's clamp before the exponential (``loss.py:175``).
PPO_LOG_RATIO_CLAMP = 20.0


def _threshold(threshold) -> tuple[float, float]:
    """Return ``(low, high)``; ``ValueError`` unless two numbers, neither NaN."""
    try:
        lo, hi = (float(v) for v in threshold)
    except (TypeError, ValueError):
        raise ValueError(
            f"bad vllm_is_truncated_threshold {threshold!r}: expected [low, high], two numbers"
        ) from None
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"bad vllm_is_truncated_threshold {threshold!r}: a bound is NaN")
    return lo, hi


def _masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` at the mask's tokens, 0 elsewhere, in the dtype ``values * mask`` has in torch."""
    dt, _ = torch_dtypes(values.dtype, mask.dtype)
    return np.where(mask != 0, values, 0).astype(dt)


def _zeroed(r: np.ndarray) -> np.ndarray:
    """Return ``r * False`` as torch forms it: 0, but NaN where ``r`` overflowed to inf (inf * 0)."""
    return np.where(np.isinf(r), r.dtype.type(np.nan), r.dtype.type(0.0))


def vllm_is_correction(
    old_log_probs,
    rollout_log_probs,
    action_mask,
    vllm_is_truncated_threshold=ICEPOP_BAND,
    vllm_is_correction_type: str = "tis",
) -> tuple[np.ndarray, float]:
    r"""Return OpenRLHF's per-token ``vllm_is`` coefficients (0 on padding) and ``vllm_kl``.

    The coefficient multiplies the token's PPO loss (``loss.py:196-218``): ``tis``
    :math:`\min(\max(e^{y_t}, low), high)`; ``icepop`` :math:`e^{y_t} 1\{low \le e^{y_t} \le
    high\}`; ``seq-mask-tis`` :math:`e^{y_t} 1\{low \le e^{\bar y} \le high\}` with :math:`\bar
    y = \sum_t m_t y_t / \sum_t m_t` (NaN, so 0, for an empty row); :math:`y_t = \log\pi_{old} -
    \log\pi_{rollout}`. ``vllm_kl`` :math:`= \sum m (\log\pi_{rollout} - \log\pi_{old}) / \sum
    m`.

    Parameters
    ----------
    old_log_probs, rollout_log_probs : array_like, shape (B, T)
        float32 (computed in float32, as OpenRLHF's tensors) or float64.
    action_mask : array_like, shape (B, T)
        0/1: bool, integer (OpenRLHF's ``torch.long``), float32 or float64.
    vllm_is_truncated_threshold : (float, float), default :data:`~variance_lab.ratios.ICEPOP_BAND`
        ``[low, high]``, any two numbers (OpenRLHF checks none).
    vllm_is_correction_type : {"tis", "icepop", "seq-mask-tis"}
        One of :data:`~variance_lab.ratios.TRUNCATION_TYPES`.

    Returns
    -------
    (ndarray, float)
        The coefficients, shape (B, T), in the log-probs' dtype (float64 with a float64 mask);
        ``vllm_kl`` (NaN for an empty mask).
    """
    kind = vllm_is_correction_type
    if kind not in TRUNCATION_TYPES:
        raise ValueError(f"bad vllm_is_correction_type {kind!r}; types are tis, icepop, seq-mask-tis")
    lo, hi = _threshold(vllm_is_truncated_threshold)
    m = torch_mask(action_mask, "action_mask")
    old = as_values(old_log_probs, m, "old_log_probs", keep_float32=True)
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs", keep_float32=True)
    y = old - rollout
    dt = y.dtype
    r = exp_like(y)
    if kind == "tis":
        w = np.minimum(np.maximum(r, dt.type(lo)), dt.type(hi))  # torch.clamp: high wins over low
    elif kind == "icepop":
        w = np.where(torch_rule(dt).outside(r, lo, hi), _zeroed(r), r)
    else:
        with np.errstate(invalid="ignore"):
            mean_y = OPENRLHF_MEAN.mean(y, m, axis=-1)  # 0/0 = NaN for an empty row: dropped
        keep = torch_rule(mean_y.dtype).inside(exp_like(mean_y), lo, hi)
        w = np.where(keep[:, None], r, _zeroed(r))
    vllm_kl = float(OPENRLHF_MEAN.mean(rollout - old, m))
    return _masked(w, m), vllm_kl


def policy_loss_metrics(
    log_probs,
    old_log_probs,
    advantages,
    action_mask,
    rollout_log_probs=None,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    policy_loss_type: str = "ppo",
    enable_vllm_is_correction: bool = False,
    vllm_is_truncated_threshold=ICEPOP_BAND,
    vllm_is_correction_type: str = "tis",
) -> dict:
    r"""Return the ratios and logged metrics of OpenRLHF's ``PolicyLoss`` on one micro-batch.

    ``ppo``: :math:`r_t = e^{\operatorname{clip}(\log\pi_t - \log\pi_{old,t}, -20, 20)}`;
    ``gspo``: :math:`r_t = e^{\bar\ell}` for every token of the sequence, :math:`\bar\ell =
    \sum_t m_t \ell_t / \max(\sum_t m_t, 1)`, :math:`\ell = \log\pi - \log\pi_{rollout}` with
    ``enable_vllm_is_correction`` and :math:`\log\pi - \log\pi_{old}` without. Then
    ``ppo_clip_ratio`` :math:`= \sum m\, 1\{\operatorname{clip}(r, 1-\epsilon_l, 1+\epsilon_h) A
    < r A\} / \sum m`, ``ppo_kl`` :math:`= \sum m (\log\pi_{old} - \log\pi) / \sum m`, and with
    ``ppo`` and the correction on, ``vllm_kl`` and the coefficients of
    :func:`vllm_is_correction`.

    Parameters
    ----------
    log_probs, old_log_probs, advantages : array_like, shape (B, T)
        The current policy's log-probs, the old (behaviour) policy's, the token advantages:
        float32 or float64.
    action_mask : array_like, shape (B, T)
        0/1: bool, integer, float32 or float64.
    rollout_log_probs : array_like, shape (B, T), optional
        vLLM's log-probs; needed with ``enable_vllm_is_correction``.
    clip_eps_low, clip_eps_high : float, default 0.2
        ``--actor.eps_clip_low_high``.
    policy_loss_type : {"ppo", "gspo"}
    enable_vllm_is_correction : bool, default False
    vllm_is_truncated_threshold, vllm_is_correction_type
        As :func:`vllm_is_correction` (checked even when the correction is off, as
        ``PolicyLoss.__init__`` checks the type).

    Returns
    -------
    dict
        ``ratio`` (B, T) (0 on padding), ``vllm_is`` (B, T) or None, and the logged floats
        ``ppo_clip_ratio``, ``ppo_kl`` and, with ``ppo`` and the correction on, ``vllm_kl``.
    """
    if vllm_is_correction_type not in TRUNCATION_TYPES:
        raise ValueError(
            f"bad vllm_is_correction_type {vllm_is_correction_type!r}; types are tis, icepop, seq-mask-tis"
        )
    if policy_loss_type not in POLICY_LOSS_TYPES:
        raise ValueError(f"bad policy_loss_type {policy_loss_type!r}; types are ppo, gspo")
    if enable_vllm_is_correction and rollout_log_probs is None:
        raise ValueError("enable_vllm_is_correction needs rollout_log_probs, got None")
    m = torch_mask(action_mask, "action_mask")
    new = as_values(log_probs, m, "log_probs", keep_float32=True)
    old = as_values(old_log_probs, m, "old_log_probs", keep_float32=True)
    adv = as_values(advantages, m, "advantages", keep_float32=True)
    raw = new - old
    if policy_loss_type == "ppo":
        clamp = raw.dtype.type(PPO_LOG_RATIO_CLAMP)
        ratio = exp_like(np.clip(raw, -clamp, clamp))
    else:
        if enable_vllm_is_correction:
            log_ratio = new - as_values(rollout_log_probs, m, "rollout_log_probs", keep_float32=True)
        else:
            log_ratio = raw
        mean = GSPO_MEAN.mean(log_ratio, m, axis=-1)
        ratio = _masked(np.broadcast_to(exp_like(mean)[:, None], m.shape), m)
    dt = ratio.dtype
    with np.errstate(invalid="ignore"):  # an inf ratio times a 0 advantage: NaN, never "clipped"
        surr1 = ratio * adv
        surr2 = np.clip(ratio, dt.type(1 - clip_eps_low), dt.type(1 + clip_eps_high)) * adv
    flags = (surr2 < surr1).astype(np.float32)
    with np.errstate(invalid="ignore"):
        out = {
            "ratio": _masked(ratio, m),
            "vllm_is": None,
            "ppo_clip_ratio": float(OPENRLHF_MEAN.mean(flags, m)),
            "ppo_kl": float(OPENRLHF_MEAN.mean(-raw, m)),
        }
    if enable_vllm_is_correction and policy_loss_type == "ppo":
        out["vllm_is"], out["vllm_kl"] = vllm_is_correction(
            old, rollout_log_probs, m, vllm_is_truncated_threshold, vllm_is_correction_type
        )
    return out
