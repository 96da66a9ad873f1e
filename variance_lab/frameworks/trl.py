r"""TRL's importance-ratio math in NumPy: off-policy sequence mask, VESPO's gamma weights, vLLM IS correction.

A mirror of ``trl/trainer/grpo_trainer.py`` of TRL 1.16.0, the PyPI release (file sha256
``1c3dc2253fb3...``; the huggingface/trl snapshot at ``f2cd577``, 2026-07-24, predates it: its
``get_off_policy_mask`` lacks 1.16.0's ``nan_to_num``), with TRL's names and shapes (advantages
``(B, 1)``; sequence-level results ``(B, 1)``):

- :func:`get_off_policy_mask` and :func:`get_gamma_weights` are ``GRPOTrainer``'s static methods;
- :func:`vllm_importance_sampling_correction` is the block of
  ``GRPOTrainer._generate_and_score_completions`` that builds ``importance_sampling_ratio`` and
  logs ``sampling/...`` (lines 2660-2707 and 2860-2896).

All three are checked against TRL itself: in float64 (``tools/framework_fixtures.py``, the two
static methods, :math:`10^{-9}` relative) and on the dtypes a ``GRPOTrainer`` holds
(``tools/trl_fixtures.py`` runs the static methods and the inline blocks' own text on float32
and float64 log-probs with int64, bool and float32 masks: every mask and decision exactly, values
within TRL's own float32 rounding). Like TRL, the mirror computes in the log-probs' dtype (float32
stays float32, anything else is float64) with the mask's dtype
(:func:`~variance_lab.frameworks.batch.torch_mask`): sums and means as torch forms them
(:data:`TRL_MEAN`), :math:`e^x` in the dtype (:func:`~variance_lab.frameworks.batch.exp_like`;
float32 overflows to ``inf`` above 88.72), every bound cast to the dtype before the comparison.
It can still differ from TRL by a float32 sum's order of summation and where torch's float32 exp
is one ulp off the correctly rounded value.

TRL's conventions, all kept:

- the mismatch log-ratio is :math:`\log\pi_{old} - \log\pi_{vLLM}` per token, multiplied by the
  mask and with NaN (a token vLLM could not score) set to 0, so such a token has ratio 1;
  no :math:`\pm 20` clamp (a sequence sum above 88.72 in float32, 709.78 in float64, overflows to
  ``inf``, which the caps handle);
- ``vllm_importance_sampling_mode`` (default ``"sequence_mask"``, cap
  ``vllm_importance_sampling_clip_max = 3``, ``clip_min`` None): ``token_*`` acts on each
  token's ratio, ``sequence_*`` on the **product** :math:`P_T` (not the geometric mean, which
  ``importance_sampling_level="sequence"`` uses for GSPO); ``*_truncate`` clamps to
  :math:`[C_{min}, C_{max}]`, ``*_mask`` sets ratios outside to 0. With the defaults these are the
  toolkit's ``seq-mask:3``, ``seq-tis:3``, ``tis:3`` and (``token_mask`` with a lower bound)
  ``icepop:LO:HI`` (:mod:`variance_lab.corrections`), but TRL clamps and compares the ratio
  itself in its dtype, not the log-ratio: the masks keep a ratio exactly at a bound
  (:data:`MASK_RULE`, :data:`MASK_F32_RULE`); ``GRPOConfig`` refuses :math:`C_{min} \ge C_{max}`
  and a ``*_truncate`` mode without a bound, and accepts the rest;
- ``sampling/importance_sampling_ratio/{min,mean,max}`` are taken **after** truncation or
  masking, over the valid tokens (token modes) or over every sequence of the batch (sequence
  modes): a masked token or sequence counts as 0, so ``min`` is 0 whenever anything was masked;
  ``sampling/sampling_logp_difference/{mean,max}`` are :math:`|\log\pi_{old} - \log\pi_{vLLM}|`
  over the valid tokens that vLLM scored. (With several processes TRL then averages the means
  and takes the min/max over processes; these are one process's values.)
- ``get_off_policy_mask`` keeps a sequence when its advantage is :math:`\ge 0` or its mean
  :math:`\log\pi_{vLLM} - \log\pi_\theta` over the mask (count clamped to at least 1) is
  :math:`\le \delta`, :math:`\delta` cast to the mean's dtype (:data:`OFF_POLICY_F32_RULE`);
- ``get_gamma_weights``: :math:`\log w = \sum_t m_t \operatorname{clip}(\log r_t, \pm 20)`
  plus, when given, :math:`\sum_t \operatorname{clip}(\log \rho_t, \log 10^{-8}, 20)` over **all**
  positions of the importance-sampling ratio :math:`\rho` (a token masked to 0 by ``token_mask``
  adds :math:`\log 10^{-8}`), clamped to :math:`[\log 10^{-8}, 20]`; then
  :math:`\phi(w) = e^{\lambda + k\log w - \lambda w}` with :math:`(k, \lambda)` by the sign of the
  advantage (:math:`\lambda \ge 10^{-4}`), both rounded to float32 as TRL's ``torch.where`` on
  Python numbers makes them (so ``lambda_pos=0.1`` acts as 0.10000000149), non-finite values set
  to 0.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections import OPSM_RULE, opsm_keep
from variance_lab.frameworks.batch import MeanRule, as_values, exp_like, torch_dtypes, torch_mask, torch_rule

__all__ = [
    "MASK_F32_RULE",
    "MASK_RULE",
    "OFF_POLICY_F32_RULE",
    "OFF_POLICY_RULE",
    "TRL_MEAN",
    "VLLM_IMPORTANCE_SAMPLING_MODES",
    "get_gamma_weights",
    "get_off_policy_mask",
    "vllm_importance_sampling_correction",
]

#: TRL's ``vllm_importance_sampling_mode`` values.
VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

_LOG_MIN_W = math.log(1e-8)

#: TRL's ``*_mask`` modes on float64 tensors: the ratio :math:`e^x` against ``[clip_min,
#: clip_max]``, a ratio exactly at a bound kept (set to 0 only when ``< clip_min`` or ``>
#: clip_max``, ``grpo_trainer.py:2698-2700``).
MASK_RULE = torch_rule(np.float64)
#: The same on float32 tensors: the float32 ratio against the bounds rounded to float32.
MASK_F32_RULE = torch_rule(np.float32)
#: ``get_off_policy_mask`` on float64 tensors: the mean log-ratio against the threshold as it
#: is, a mean equal to the threshold kept: the corrections' own rule
#: (:data:`variance_lab.corrections.OPSM_RULE`, ``opsm:DELTA``).
OFF_POLICY_RULE = OPSM_RULE
#: The same on float32 tensors: the float32 mean against the threshold rounded to float32.
OFF_POLICY_F32_RULE = torch_rule(np.float32)
#: TRL's masked sums and ``get_off_policy_mask``'s mean log-ratio per sequence (the count clamped
#: to at least 1), in torch's dtypes.
TRL_MEAN = MeanRule("at_least_one", 0.0, "tokens", dtypes="torch")


def _advantages(advantages, B: int) -> np.ndarray:
    a = np.asarray(advantages, dtype=np.float64)
    if a.shape != (B, 1):
        raise ValueError(f"advantages has shape {a.shape}, expected ({B}, 1) as TRL's")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"advantages holds a non-finite value: {a[~np.isfinite(a)][0]!r}")
    return a


def _finite(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"bad {name} {value!r}: expected a finite number")
    return float(value)


def _mask_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ``a * b`` of two 0/1 masks in torch's dtype (bool and bool: bool; int and float: the float)."""
    if a.dtype == np.bool_ and b.dtype == np.bool_:
        return a & b
    floats = [m.dtype for m in (a, b) if m.dtype.kind == "f"]
    dt = np.result_type(*floats) if floats else np.dtype(np.int64)
    return a.astype(dt) * b.astype(dt)


def get_off_policy_mask(
    advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold: float
) -> np.ndarray:
    r"""Return DeepSeek-V3.2's off-policy sequence mask as TRL computes it: (B, 1), 1 keep, 0 drop.

    The mean :math:`\bar d = \sum_t m_t d_t / \max(\sum_t m_t, 1)` of :math:`d =
    \log\pi_{vLLM} - \log\pi_\theta` (NaN read as 0) is taken in the log-probs' dtype and
    compared with :math:`\delta` cast to it (:data:`OFF_POLICY_RULE`, :data:`OFF_POLICY_F32_RULE`).

    Parameters
    ----------
    advantages : array_like, shape (B, 1)
    per_token_logps, sampling_per_token_logps : array_like, shape (B, T)
        The policy's and vLLM's token log-probabilities (NaN in the latter: not scored, counts 0);
        float32 (computed in float32, as TRL) or float64.
    mask : array_like, shape (B, T)
        0/1: bool, integer (TRL's ``torch.long``), float32 or float64.
    off_policy_threshold : float
        :math:`\delta`: a negative-advantage sequence is dropped when its mean
        :math:`\log\pi_{vLLM} - \log\pi_\theta` exceeds it.

    Returns
    -------
    ndarray, shape (B, 1)
        In the mask's dtype, as TRL's ``.to(dtype=mask.dtype)``.
    """
    m = torch_mask(mask, "mask")
    new = as_values(per_token_logps, m, "per_token_logps", keep_float32=True)
    sampling = as_values(
        sampling_per_token_logps, m, "sampling_per_token_logps", allow_nan=True, keep_float32=True
    )
    adv = _advantages(advantages, m.shape[0])
    delta = _finite(off_policy_threshold, "off_policy_threshold")
    kl = np.nan_to_num(sampling - new, nan=0.0)
    avg = TRL_MEAN.mean(kl, m, axis=1, keepdims=True)
    rule = OFF_POLICY_F32_RULE if avg.dtype == np.float32 else OFF_POLICY_RULE
    return opsm_keep(adv, avg, delta, rule).astype(m.dtype)  # the rule of corrections' opsm:DELTA


def get_gamma_weights(
    advantages,
    log_ratio_per_token,
    mask,
    importance_sampling_ratio=None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> np.ndarray:
    r"""Return VESPO's gamma weights :math:`\phi(w) = e^{\lambda} w^k e^{-\lambda w}` per sequence, (B, 1).

    Computed in the log-ratios' dtype, as TRL (:math:`k` and :math:`\lambda` float32 always).

    Parameters
    ----------
    advantages : array_like, shape (B, 1)
    log_ratio_per_token : array_like, shape (B, T)
        :math:`\log\pi_\theta - \log\pi_{old}`: float32 or float64.
    mask : array_like, shape (B, T)
        0/1: bool, integer, float32 or float64.
    importance_sampling_ratio : array_like, shape (B, T), optional
        TRL's token-level vLLM ratio (``token_truncate`` or ``token_mask``), >= 0; summed in log
        space over every position, padding included, as TRL does.
    k_pos, lambda_pos, k_neg, lambda_neg : float
        The shape and rate for non-negative and negative advantages.
    """
    m = torch_mask(mask, "mask")
    lr = as_values(log_ratio_per_token, m, "log_ratio_per_token", keep_float32=True)
    adv = _advantages(advantages, m.shape[0])
    k_pos, lambda_pos, k_neg, lambda_neg = (
        _finite(v, n)
        for v, n in (
            (k_pos, "k_pos"),
            (lambda_pos, "lambda_pos"),
            (k_neg, "k_neg"),
            (lambda_neg, "lambda_neg"),
        )
    )
    dt = lr.dtype
    seq = TRL_MEAN.sum(np.clip(lr, dt.type(-20.0), dt.type(20.0)), m, axis=-1, keepdims=True)
    if importance_sampling_ratio is not None:
        rho = np.asarray(importance_sampling_ratio)
        rho = rho if rho.dtype == np.float32 else rho.astype(np.float64)
        if rho.shape != m.shape:
            raise ValueError(f"importance_sampling_ratio has shape {rho.shape}, expected {m.shape}")
        if not np.all(rho >= 0) or not np.all(np.isfinite(rho)):
            raise ValueError("importance_sampling_ratio must hold finite values >= 0")
        rt = rho.dtype.type
        with np.errstate(divide="ignore"):  # torch's log, correctly rounded in rho's dtype
            log_rho = np.log(rho.astype(np.float64)).astype(rho.dtype)
        seq = seq + np.clip(log_rho, rt(_LOG_MIN_W), rt(20.0)).sum(axis=-1, keepdims=True, dtype=rho.dtype)
        seq = seq.astype(np.result_type(seq.dtype, TRL_MEAN.sum(lr, m, axis=-1).dtype))  # in-place +=
    st = seq.dtype.type
    log_w = np.clip(seq, st(_LOG_MIN_W), st(20.0))
    pos = adv >= 0
    # TRL builds k and lambda with torch.where on Python floats: float32 tensors
    k = np.where(pos, np.float32(k_pos), np.float32(k_neg))
    lam = np.maximum(np.where(pos, np.float32(lambda_pos), np.float32(lambda_neg)), np.float32(1e-4))
    with np.errstate(over="ignore", invalid="ignore"):
        phi = exp_like(lam + k * log_w - lam * exp_like(log_w))
    return np.where(np.isfinite(phi), phi, 0.0).astype(phi.dtype)


def vllm_importance_sampling_correction(
    old_per_token_logps,
    sampling_per_token_logps,
    completion_mask,
    vllm_importance_sampling_mode: str = "sequence_mask",
    vllm_importance_sampling_clip_min: float | None = None,
    vllm_importance_sampling_clip_max: float | None = 3.0,
    tool_mask=None,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute TRL's ``importance_sampling_ratio`` and the ``sampling/...`` metrics it logs.

    In the log-probs' dtype, as TRL (``grpo_trainer.py:2660-2707, 2860-2896``): :math:`d =
    (\log\pi_{old} - \log\pi_{vLLM}) m` with NaN read as 0; :math:`x = d` (``token_*``) or
    :math:`\sum_t d_t` (``sequence_*``); :math:`r = e^x` (``inf`` above 88.72 in float32);
    ``*_truncate`` clamps :math:`r` to :math:`[C_{min}, C_{max}]`, ``*_mask`` sets it to 0
    outside (:data:`MASK_RULE`, :data:`MASK_F32_RULE`), each bound cast to the dtype.

    Parameters
    ----------
    old_per_token_logps, sampling_per_token_logps : array_like, shape (B, T)
        The trainer's and vLLM's token log-probabilities (NaN in the latter: not scored); float32
        (TRL's ``sampling_per_token_logps`` are) or float64.
    completion_mask : array_like, shape (B, T)
        0/1: bool, integer (TRL's ``torch.long``), float32 or float64.
    vllm_importance_sampling_mode : str
        One of :data:`VLLM_IMPORTANCE_SAMPLING_MODES`.
    vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max : float or None
        The bounds :math:`C_{min}`, :math:`C_{max}` (None: no bound on that side). As
        ``GRPOConfig`` checks them: both given needs :math:`C_{min} < C_{max}`, and a
        ``*_truncate`` mode needs one.
    tool_mask : array_like, shape (B, T), optional
        Multiplies ``completion_mask`` (tool-output tokens excluded).

    Returns
    -------
    (importance_sampling_ratio, metrics)
        Shape (B, T) for ``token_*`` (1 on padding), (B, 1) for ``sequence_*``, in the dtype of
        :math:`d`; metrics keyed ``sampling/importance_sampling_ratio/{min,mean,max}`` and
        ``sampling/sampling_logp_difference/{mean,max}``.
    """
    cm = torch_mask(completion_mask, "completion_mask")
    m = cm if tool_mask is None else _mask_product(cm, torch_mask(tool_mask, "tool_mask"))
    if m.shape != cm.shape:
        raise ValueError(f"tool_mask has shape {np.shape(tool_mask)}, expected {cm.shape}")
    old = as_values(old_per_token_logps, m, "old_per_token_logps", keep_float32=True)
    sampling = as_values(
        sampling_per_token_logps, m, "sampling_per_token_logps", allow_nan=True, keep_float32=True
    )
    mode = vllm_importance_sampling_mode
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        modes = ", ".join(VLLM_IMPORTANCE_SAMPLING_MODES)
        raise ValueError(f"bad vllm_importance_sampling_mode {mode!r}; modes are {modes}")
    lo, hi = vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max
    lo = None if lo is None else _finite(lo, "vllm_importance_sampling_clip_min")
    hi = None if hi is None else _finite(hi, "vllm_importance_sampling_clip_max")
    if lo is not None and hi is not None and lo >= hi:  # GRPOConfig.__post_init__'s check
        raise ValueError(
            f"vllm_importance_sampling_clip_min ({lo}) must be less than "
            f"vllm_importance_sampling_clip_max ({hi})."
        )
    if mode.endswith("truncate") and lo is None and hi is None:
        raise ValueError(
            "At least one of `vllm_importance_sampling_clip_min` or `vllm_importance_sampling_clip_max` "
            "must be set when `vllm_importance_sampling_mode` is a `*_truncate` mode."
        )
    y = old - sampling
    dt, _ = torch_dtypes(y.dtype, m.dtype)
    diff = np.nan_to_num(y.astype(dt) * m.astype(dt), nan=0.0)
    sequence_level = mode.startswith("sequence")
    x = diff.sum(axis=-1, keepdims=True, dtype=dt) if sequence_level else diff
    r = exp_like(x)
    if mode.endswith("truncate"):
        ratio = r if lo is None else np.maximum(r, dt.type(lo))
        ratio = ratio if hi is None else np.minimum(ratio, dt.type(hi))
    else:
        ratio = np.where(torch_rule(dt).outside(r, lo, hi), dt.type(0.0), r)
    inside = m != 0
    delta = np.abs(y)[inside]
    delta = delta[~np.isnan(delta)]
    flat = ratio.ravel() if sequence_level else ratio[inside]
    metrics = {
        "sampling/sampling_logp_difference/mean": float(delta.mean()) if delta.size else 0.0,
        "sampling/sampling_logp_difference/max": float(delta.max()) if delta.size else 0.0,
        "sampling/importance_sampling_ratio/min": float(flat.min()) if flat.size else 0.0,
        "sampling/importance_sampling_ratio/mean": float(flat.mean()) if flat.size else 0.0,
        "sampling/importance_sampling_ratio/max": float(flat.max()) if flat.size else 0.0,
    }
    return ratio, metrics
