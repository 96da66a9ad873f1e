r"""TRL's importance-ratio math in NumPy: off-policy sequence mask, VESPO's gamma weights, vLLM IS correction.

A mirror of ``trl/trainer/grpo_trainer.py`` of TRL 1.16.0, the PyPI release (file sha256
``1c3dc2253fb3...``; the huggingface/trl snapshot at ``f2cd577``, 2026-07-24, predates it: its
``get_off_policy_mask`` lacks 1.16.0's ``nan_to_num``), with TRL's names and shapes (advantages
``(B, 1)``; sequence-level results ``(B, 1)``):

- :func:`get_off_policy_mask` and :func:`get_gamma_weights` are ``GRPOTrainer``'s static methods,
  checked against TRL itself (``tools/framework_fixtures.py``, ``tests/frameworks/test_trl.py``,
  :math:`10^{-9}` relative);
- :func:`vllm_importance_sampling_correction` is the block of
  ``GRPOTrainer._generate_and_score_completions`` that builds ``importance_sampling_ratio`` and
  logs ``sampling/...`` (inline in TRL, so checked by hand-computed cases from its source).

TRL's conventions, all kept:

- the mismatch log-ratio is :math:`\log\pi_{old} - \log\pi_{vLLM}` per token, multiplied by the
  mask and with NaN (a token vLLM could not score) set to 0, so such a token has ratio 1;
  no :math:`\pm 20` clamp (a sequence sum above 709 overflows to ``inf``, which the caps handle);
- ``vllm_importance_sampling_mode`` (default ``"sequence_mask"``, cap
  ``vllm_importance_sampling_clip_max = 3``, ``clip_min`` None): ``token_*`` acts on each
  token's ratio, ``sequence_*`` on the **product** :math:`P_T` (not the geometric mean, which
  ``importance_sampling_level="sequence"`` uses for GSPO); ``*_truncate`` clamps to
  :math:`[C_{min}, C_{max}]`, ``*_mask`` sets ratios outside to 0. With the defaults these are the
  toolkit's ``seq-mask:3``, ``seq-tis:3``, ``tis:3`` and (``token_mask`` with a lower bound)
  ``icepop:LO:HI`` (:mod:`variance_lab.corrections`); the masks compare the ratio with the
  bounds in linear space and keep a ratio exactly at a bound (:data:`MASK_RULE`);
- ``sampling/importance_sampling_ratio/{min,mean,max}`` are taken **after** truncation or
  masking, over the valid tokens (token modes) or over every sequence of the batch (sequence
  modes): a masked token or sequence counts as 0, so ``min`` is 0 whenever anything was masked;
  ``sampling/sampling_logp_difference/{mean,max}`` are :math:`|\log\pi_{old} - \log\pi_{vLLM}|`
  over the valid tokens that vLLM scored. (With several processes TRL then averages the means
  and takes the min/max over processes; these are one process's values.)
- ``get_off_policy_mask`` keeps a sequence when its advantage is :math:`\ge 0` or its mean
  :math:`\log\pi_{vLLM} - \log\pi_\theta` over the mask (count clamped to at least 1) is
  :math:`\le \delta`;
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

from variance_lab.corrections import OPSM_RULE, apply_sequence, apply_tokens, opsm_keep, parse
from variance_lab.frameworks.batch import MeanRule, as_mask, as_values
from variance_lab.ratios import CLOSED, BoundRule

__all__ = [
    "MASK_RULE",
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

#: TRL's ``*_mask`` modes: the ratio :math:`e^x` against ``[clip_min, clip_max]`` in linear space,
#: a ratio exactly at a bound kept (set to 0 only when ``< clip_min`` or ``> clip_max``).
MASK_RULE = BoundRule(CLOSED, "linear", "float64")
#: ``get_off_policy_mask``: the mean log-ratio against the threshold as it is, a mean equal to
#: the threshold kept.
#: The corrections' own rule (:data:`variance_lab.corrections.OPSM_RULE`, ``opsm:DELTA``).
OFF_POLICY_RULE = OPSM_RULE
#: ``get_off_policy_mask``'s mean log-ratio per sequence: the count clamped to at least 1.
TRL_MEAN = MeanRule("at_least_one", 0.0, "tokens")


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


def get_off_policy_mask(
    advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold: float
) -> np.ndarray:
    r"""Return DeepSeek-V3.2's off-policy sequence mask as TRL computes it: (B, 1), 1.0 keep, 0.0 drop.

    Parameters
    ----------
    advantages : array_like, shape (B, 1)
    per_token_logps, sampling_per_token_logps : array_like, shape (B, T)
        The policy's and vLLM's token log-probabilities (NaN in the latter: not scored, counts 0).
    mask : array_like, shape (B, T)
    off_policy_threshold : float
        :math:`\delta`: a negative-advantage sequence is dropped when its mean
        :math:`\log\pi_{vLLM} - \log\pi_\theta` exceeds it.
    """
    m = as_mask(mask, "mask")
    new = as_values(per_token_logps, m, "per_token_logps")
    sampling = as_values(sampling_per_token_logps, m, "sampling_per_token_logps", allow_nan=True)
    adv = _advantages(advantages, m.shape[0])
    delta = _finite(off_policy_threshold, "off_policy_threshold")
    kl = np.nan_to_num(sampling - new, nan=0.0)
    avg = TRL_MEAN.mean(kl, m, axis=1, keepdims=True)
    return opsm_keep(adv, avg, delta).astype(np.float64)  # the rule of corrections' opsm:DELTA


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

    Parameters
    ----------
    advantages : array_like, shape (B, 1)
    log_ratio_per_token : array_like, shape (B, T)
        :math:`\log\pi_\theta - \log\pi_{old}`.
    mask : array_like, shape (B, T)
    importance_sampling_ratio : array_like, shape (B, T), optional
        TRL's token-level vLLM ratio (``token_truncate`` or ``token_mask``), >= 0; summed in log
        space over every position, padding included, as TRL does.
    k_pos, lambda_pos, k_neg, lambda_neg : float
        The shape and rate for non-negative and negative advantages.
    """
    m = as_mask(mask, "mask")
    lr = as_values(log_ratio_per_token, m, "log_ratio_per_token")
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
    seq = np.sum(np.clip(lr, -20.0, 20.0) * m, axis=-1, keepdims=True)
    if importance_sampling_ratio is not None:
        rho = np.asarray(importance_sampling_ratio, dtype=np.float64)
        if rho.shape != m.shape:
            raise ValueError(f"importance_sampling_ratio has shape {rho.shape}, expected {m.shape}")
        if not np.all(rho >= 0) or not np.all(np.isfinite(rho)):
            raise ValueError("importance_sampling_ratio must hold finite values >= 0")
        with np.errstate(divide="ignore"):
            seq = seq + np.sum(np.clip(np.log(rho), _LOG_MIN_W, 20.0), axis=-1, keepdims=True)
    log_w = np.clip(seq, _LOG_MIN_W, 20.0)
    pos = adv >= 0
    # TRL builds k and lambda with torch.where on Python floats: float32 tensors
    k = np.where(pos, np.float32(k_pos), np.float32(k_neg)).astype(np.float64)
    lam = np.maximum(np.where(pos, np.float32(lambda_pos), np.float32(lambda_neg)), np.float32(1e-4))
    lam = lam.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        phi = np.exp(lam + k * log_w - lam * np.exp(log_w))
    return np.where(np.isfinite(phi), phi, 0.0)


def _truncation(mode: str, lo: float | None, hi: float | None):
    """Return the toolkit's truncation (``tis:C``, ``seq-tis:C``) for a ``*_truncate`` mode, or None."""
    if lo is None and hi is not None:
        return parse(f"{'seq-tis' if mode.startswith('sequence') else 'tis'}:{hi!r}")
    return None


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

    Parameters
    ----------
    old_per_token_logps, sampling_per_token_logps : array_like, shape (B, T)
        The trainer's and vLLM's token log-probabilities (NaN in the latter: not scored).
    completion_mask : array_like, shape (B, T)
    vllm_importance_sampling_mode : str
        One of :data:`VLLM_IMPORTANCE_SAMPLING_MODES`.
    vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max : float or None
        The bounds :math:`C_{min}`, :math:`C_{max}` (None: no bound on that side).
    tool_mask : array_like, shape (B, T), optional
        Multiplies ``completion_mask`` (tool-output tokens excluded).

    Returns
    -------
    (importance_sampling_ratio, metrics)
        Shape (B, T) for ``token_*`` (1 on padding), (B, 1) for ``sequence_*``; metrics keyed
        ``sampling/importance_sampling_ratio/{min,mean,max}`` and
        ``sampling/sampling_logp_difference/{mean,max}``.
    """
    cm = as_mask(completion_mask, "completion_mask")
    m = cm if tool_mask is None else cm * as_mask(tool_mask, "tool_mask", cm.shape)
    old = as_values(old_per_token_logps, m, "old_per_token_logps")
    sampling = as_values(sampling_per_token_logps, m, "sampling_per_token_logps", allow_nan=True)
    mode = vllm_importance_sampling_mode
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        modes = ", ".join(VLLM_IMPORTANCE_SAMPLING_MODES)
        raise ValueError(f"bad vllm_importance_sampling_mode {mode!r}; modes are {modes}")
    lo, hi = vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max
    lo = None if lo is None else _finite(lo, "vllm_importance_sampling_clip_min")
    hi = None if hi is None else _finite(hi, "vllm_importance_sampling_clip_max")
    if hi is not None and hi <= 0:
        raise ValueError(f"bad vllm_importance_sampling_clip_max {hi!r}: must be > 0")
    diff = np.nan_to_num((old - sampling) * m, nan=0.0)
    sequence_level = mode.startswith("sequence")
    x = diff.sum(axis=-1, keepdims=True) if sequence_level else diff
    c = _truncation(mode, lo, hi) if mode.endswith("truncate") else None
    with np.errstate(over="ignore"):
        r = np.exp(x)
    if c is not None:
        ratio = (apply_sequence(c, x, 1) if sequence_level else apply_tokens(c, x))[0]
    elif mode.endswith("truncate"):
        ratio = np.clip(r, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    else:
        ratio = np.where(MASK_RULE.outside(x, lo, hi), 0.0, r)
    inside = m > 0
    delta = np.abs(old - sampling)[inside]
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
