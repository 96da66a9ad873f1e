r"""prime-rl's mismatch KL and its trust-region masks (DPPO, IPO, ref-KL), in NumPy.

A mirror of ``compute_importance_ratio_and_mismatch_kl``, the masks and metrics of
``default_loss_fn`` (DPPO), ``ipo_loss_fn`` and ``ref_kl_loss_fn``, and ``compute_loss``'s
per-token weight streams in ``src/prime_rl/trainer/rl/loss.py`` (PrimeIntellect-ai/prime-rl at
``559b447``, 2026-08-21; defaults ``dppo_mask_low = dppo_mask_high = 0.2``, ``ipo_threshold =
0.1``, all ``ge=0``, from ``packages/prime-rl-configs/src/prime_rl/configs/trainer.py``).
Checked against those functions run verbatim with torch on float32 log-probs and bool masks
(``tools/prime_rl_fixtures.py``, ``tests/data/frameworks/prime_rl.*``) and by hand-computed
cases. prime-rl's opt-in IcePop loss (PR #3526, merged 2026-09-10) is not in that commit, nor
in the newest snapshot of the repository fetched here (still ``559b447``, 2026-08-21; ``git
grep IcePop`` over its 4,639 refs, pull heads up to #3341, finds only ``refs/pull/2401/head``
``1da4a333``, 2026-05-02: the closed PR #2401, an earlier IcePop that replaced the default loss
and compared the linear ratio, not this one). The code index stores the ``loss.py`` that PR
#3526 produced without its commit (the one commit it names for that path, ``851c48f``, is an
early ``loss.py`` without IcePop), so no commit can be cited for ``IcePopLoss``: the fixtures
name PR #3526 and the SHA-256 of the text run. :func:`icepop_mask` follows that ``IcePopLoss``,
checked against it run verbatim (``tools/prime_rl_icepop_fixtures.py``,
``tests/data/frameworks/prime_rl_icepop.*``).

prime-rl's conventions, all kept:

- :math:`y = \log\pi_{trainer} - \log\pi_{inference}`, ``importance_ratio`` :math:`= e^y`,
  ``mismatch_kl`` :math:`= e^y - y - 1` per token (verl's ``k3``; prime-rl's token exports
  write it per token);
- every trust region acts on **probability** differences :math:`d = \pi_{trainer} -
  \pi_{inference}` (not on the ratio), taken as prime-rl takes them on its float32 log-probs:
  each probability the float32 :math:`e^x` (torch's, :func:`~variance_lab.frameworks.batch.exp_float32`;
  the correctly rounded one, without torch, flipped 1 of the fixtures' 6,752 decisions),
  their float32 difference, against the bound rounded to float32 (torch compares a float32
  tensor with a Python float in float32), a difference exactly at a bound kept
  (:data:`PRIME_RL_RULE`);
- DPPO (``default_loss_fn``): with a positive advantage a token is masked when :math:`d >`
  ``dppo_mask_high``, otherwise (advantage :math:`\le 0`, zero included) when :math:`d <
  -`\ ``dppo_mask_low``; ``is_masked_high`` counts only positive-advantage tokens,
  ``is_masked_low`` only negative-advantage ones, so with zero advantages ``is_masked`` exceeds
  their sum. IPO (``ipo_loss_fn``): masked when :math:`|d| >` ``ipo_threshold``. ref-KL
  (``ref_kl_loss_fn``, on-policy distillation): masked when :math:`d < -0.2` (fixed);
- the rl component runs on ``loss_mask & (rl_weights != 0)`` (all of ``loss_mask`` without
  ``rl_weights``), the ref-KL component on ``ref_kl_weights != 0`` alone (the loss mask is not
  read); a sample whose component mask is empty does not run that loss fn at all
  (``compute_loss``, ``loss.py:379-392``), so it adds no metric row;
- each loss fn runs on **one sample at a time**, so each metric is one value per sample that ran:
  a mean over that sample's component mask with the count clamped to at least 1
  (``_safe_mean``, ``loss.py:94-97``; 0 for a sample with nothing to average); a fraction
  (``is_masked``, ``masked_advantage_positive``, ...) is ``_safe_mean`` of a bool tensor, an
  int64 count over an int64 count, which torch divides in float32 (its default dtype), in
  prime-rl's float64 runs too: the mirror returns that float32 quotient (as float64). The step
  logs ``<metric>/mean``, ``/median``, ``/std``, ``/min`` and ``/max`` over the per-sample
  values of every micro-batch and rank (``Tensors.compute_stats``, ``trainer/utils.py:245``):
  :func:`tensor_stats` (in float64: prime-rl reduces the float32 values on the GPU, in an order
  of its own, so a step's mean can differ from the mirror's by float32 rounding). A long
  and a short sample weigh the same; a token-pooled mean differed on 57 of 90 random batches
  (issue #35: ``masked_advantage_positive`` 1.0 pooled, 0.25 as logged).

Values are computed in float64 from the log-probs given, in prime-rl's order of operations
(prime-rl computes them in float32: ``mismatch_kl`` of a tiny :math:`y` is mostly float32
rounding there; in float64 the mirror is prime-rl's float64 run to an ulp of its terms).
Against prime-rl's own functions on 24 random batches (4 settings each, 1,688 padded token
slots, 6,752 rl keep decisions): every keep decision but the one above and every per-sample
fraction exactly; every value within prime-rl's own float32 rounding (worst 1.3e-2 relative, an
``unmasked_mismatch_kl`` of 5.532e-6 that prime-rl's float64 run gives too and its float32 run
logs as 5.603e-6).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import (
    SAMPLE_MEAN,
    as_mask,
    as_values,
    exp_float32,
    log_float32,
    torch_rule,
)

__all__ = [
    "ICEPOP_LOSS_RULE",
    "PRIME_RL_MEAN",
    "PRIME_RL_RULE",
    "REF_KL_MASK_LOW",
    "compute_importance_ratio_and_mismatch_kl",
    "dppo_mask",
    "icepop_mask",
    "ipo_mask",
    "mismatch_kl_mask",
    "ref_kl_mask",
    "tensor_stats",
]

#: prime-rl's trust-region bound rule: the float32 probability difference against the bound as
#: float32 (no log, no exp), a difference exactly at a bound kept (``d > high``, ``d < -low`` mask).
PRIME_RL_RULE = torch_rule(np.float32)
#: ``IcePopLoss``'s band (PR #3526): the float32 log-ratio against the bounds' float32 logs, a
#: log-ratio at a bound kept (``is_masked = (y < log low) | (y > log high)``).
ICEPOP_LOSS_RULE = torch_rule(np.float32, "log")
#: ``_safe_mean`` per sample (the count clamped to at least 1), then ``<metric>/mean`` over samples;
#: in torch's dtypes, so that a fraction of flags is the float32 quotient prime-rl logs.
PRIME_RL_MEAN = SAMPLE_MEAN
#: ``ref_kl_loss_fn``'s fixed one-sided trust region: masked when :math:`d < -0.2` (``loss.py:221``).
REF_KL_MASK_LOW = 0.2


def compute_importance_ratio_and_mismatch_kl(trainer_logprobs, inference_logprobs, loss_mask=None):
    r"""Return (log_importance_ratio, importance_ratio, mismatch_kl) per token, 0 where ``loss_mask`` is 0.

    :math:`y = \log\pi_{trainer} - \log\pi_{inference}`, :math:`e^y`, :math:`e^y - y - 1`, the
    last in prime-rl's order (:func:`_k3`).
    """
    t = np.asarray(trainer_logprobs, dtype=np.float64)
    m = as_mask(
        np.ones(t.shape) if loss_mask is None else loss_mask, "loss_mask", t.shape if t.ndim == 2 else None
    )
    y = as_values(trainer_logprobs, m, "trainer_logprobs") - as_values(
        inference_logprobs, m, "inference_logprobs"
    )
    r, kl = _k3(y)
    return y * m, r * m, kl * m


def _k3(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Return :math:`e^y` and ``mismatch_kl`` :math:`e^y - y - 1`, in prime-rl's order of operations.

    ``importance_ratio - log_importance_ratio - 1`` (``loss.py:103-105`` at 559b447, unchanged in
    the post-#3526 ``loss.py``): for a small :math:`y` the value, about :math:`y^2/2`, is of the
    size of the rounding of :math:`e^y` near 1, which prime-rl's value keeps (its float64 run
    logged exactly :math:`2^{-51}` for a value that ``expm1(y) - y`` puts :math:`1.5\cdot10^{-8}`
    relative higher). Computed so, the mirror's float64 values are prime-rl's float64 ones but for
    NumPy's ``exp`` against torch's (an ulp each).
    """
    r = np.exp(y)
    return r, r - y - 1.0


def _weights(weights, shape, name):
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != shape or not np.all(np.isfinite(w)):
        raise ValueError(f"{name} must be finite, of shape {shape}, got shape {w.shape}")
    return w


def mismatch_kl_mask(loss_mask, rl_weights=None, ref_kl_weights=None) -> np.ndarray:
    """Return the tokens of ``mismatch_kl/all``: ``loss_mask & ((rl_weights != 0) | (ref_kl_weights != 0))``.

    The trainer (``trainer/rl/train.py:499-506``) pools ``mismatch_kl`` over the loss mask when
    neither weight stream is present, otherwise over the loss-mask tokens an rl or ref-KL
    component samples (a missing ``rl_weights`` stream reads as the loss mask itself).
    """
    m = as_mask(loss_mask, "loss_mask") > 0
    if rl_weights is None and ref_kl_weights is None:
        return m.astype(np.float64)
    sampled = m if rl_weights is None else _weights(rl_weights, m.shape, "rl_weights") != 0
    if ref_kl_weights is not None:
        sampled = sampled | (_weights(ref_kl_weights, m.shape, "ref_kl_weights") != 0)
    return (m & sampled).astype(np.float64)


def _inputs(trainer_logprobs, inference_logprobs, component, names):
    """Return (float64 y, float32 probability difference d) on the component mask."""
    t = as_values(trainer_logprobs, component, names[0], keep_float32=True)
    i = as_values(inference_logprobs, component, names[1], keep_float32=True)
    with np.errstate(over="ignore"):
        d = exp_float32(t) - exp_float32(i)
    return t.astype(np.float64) - i.astype(np.float64), d


def _bound(name, value, *, positive: bool = False):
    """Return ``value`` as a float: a number >= 0 (prime-rl's ``ge=0``), > 0 with ``positive`` (``gt=0``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value > 0 if positive else value >= 0)
    ):
        op, field = ("> 0", "gt=0") if positive else (">= 0", "ge=0")
        raise ValueError(f"bad {name} {value!r}: must be a number {op} (prime-rl's {field})")
    return float(value)


def _rows(parts: dict, ran: np.ndarray, per_sample: bool):
    r"""Each metric per sample that ran (``ran``, shape (B,)), or their mean over them (NaN if none ran).

    ``parts`` maps a name to (values, bool mask): float64 values give ``_safe_mean``'s float64
    quotient; bool flags (``is_masked``, ...) its float32 one, :math:`\mathrm{fl}_{32}(k / \max(n,
    1))`: ``values[mask].sum()`` of a bool tensor and ``torch.clamp_min(mask.sum(), 1)`` are int64,
    and torch divides int64 by int64 in float32 (``loss.py:94-97`` at 559b447), in prime-rl's
    float64 runs too. Returned as float64 (the float32 value exactly).
    """
    rows = {k: PRIME_RL_MEAN.mean(v, w, axis=-1).astype(np.float64)[ran] for k, (v, w) in parts.items()}
    if per_sample:
        return rows
    return {k: float(np.mean(v)) if v.size else float("nan") for k, v in rows.items()}


def _rl_component(loss_mask, rl_weights):
    m = as_mask(loss_mask, "loss_mask")
    if rl_weights is None:
        return m, np.ones(m.shape[0], dtype=bool)
    comp = m * (_weights(rl_weights, m.shape, "rl_weights") != 0)
    return comp, comp.any(axis=-1)


def _masked(y, masked, lm, ran, per_sample, *, prefix: str = "", extra=None):
    """Return the keep mask ``lm & ~masked`` and the three metrics every mask logs, then ``extra``.

    ``{prefix}masked_mismatch_kl`` and ``{prefix}unmasked_mismatch_kl`` (:math:`e^y - y - 1` over
    the masked and the kept tokens of ``lm``) and ``{prefix}is_masked`` (over ``lm``), then the
    ``extra`` metrics (name to (values, weights)), per row that ran (:func:`_rows`).
    """
    _, kl = _k3(y)
    keep = lm & ~masked
    parts = {
        f"{prefix}masked_mismatch_kl": (kl, lm & masked),
        f"{prefix}unmasked_mismatch_kl": (kl, keep),
        f"{prefix}is_masked": (masked, lm),
        **(extra or {}),
    }
    return keep.astype(np.float64), _rows(parts, ran, per_sample)


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
    rl_weights=None,
    per_sample: bool = False,
) -> tuple[np.ndarray, dict]:
    r"""Return prime-rl's DPPO keep mask (``loss_mask & ~is_masked``) and its metrics (``default_loss_fn``).

    Each row is one sample, as ``default_loss_fn`` sees it. A metric is what prime-rl logs as
    ``<metric>/mean``: the mean over the rows that ran of each row's ``_safe_mean``
    (:data:`PRIME_RL_MEAN`); with ``per_sample=True`` it is the array of the per-row values, for
    :func:`tensor_stats` (the median, std, min and max prime-rl also logs).

    Parameters
    ----------
    trainer_logprobs, inference_logprobs : array_like, shape (B, T)
        float32 as prime-rl holds them (float64 is rounded to float32 for the mask).
    advantages : array_like, shape (B, T) or (B, 1)
        Per token (prime-rl broadcasts a sequence's advantage onto its tokens).
    loss_mask : array_like, shape (B, T)
        0/1 or bool.
    dppo_mask_low, dppo_mask_high : float, default 0.2
        Bounds on :math:`d = \pi_{trainer} - \pi_{inference}`, >= 0.
    rl_weights : array_like, shape (B, T), optional
        ``compute_loss``'s rl weight stream: a token of weight 0 leaves the mask and every
        denominator; a row whose remaining mask is empty does not run (no metric row, keep 0).
    per_sample : bool
        Return each metric per row that ran (shape ``(n_ran,)``) instead of its mean over them.

    Returns
    -------
    keep : ndarray, shape (B, T)
    metrics : dict of str to float, or to ndarray
        ``is_masked``, ``is_masked_low``, ``is_masked_high``, ``masked_mismatch_kl``,
        ``unmasked_mismatch_kl``, ``masked_advantage_positive``, ``masked_advantage_negative``.
    """
    comp, ran = _rl_component(loss_mask, rl_weights)
    a = np.asarray(advantages, dtype=np.float64)
    if a.shape not in (comp.shape, (comp.shape[0], 1)) or not np.all(np.isfinite(a)):
        raise ValueError(
            f"advantages must be finite, of shape {comp.shape} or ({comp.shape[0]}, 1), got {a.shape}"
        )
    low, high = _bound("dppo_mask_low", dppo_mask_low), _bound("dppo_mask_high", dppo_mask_high)
    a = np.broadcast_to(a, comp.shape)
    y, d = _inputs(trainer_logprobs, inference_logprobs, comp, ("trainer_logprobs", "inference_logprobs"))
    masked_high, masked_low = PRIME_RL_RULE.outside(d, None, high), PRIME_RL_RULE.outside(d, -low, None)
    pos, neg = a > 0, a < 0
    masked = np.where(pos, masked_high, masked_low)
    lm = comp > 0
    drop = lm & masked
    extra = {
        "is_masked_low": (neg & masked_low, lm),
        "is_masked_high": (pos & masked_high, lm),
        "masked_advantage_positive": (pos, drop),
        "masked_advantage_negative": (neg, drop),
    }
    return _masked(y, masked, lm, ran, per_sample, extra=extra)


def ipo_mask(
    trainer_logprobs,
    inference_logprobs,
    loss_mask,
    ipo_threshold: float = 0.1,
    *,
    rl_weights=None,
    per_sample: bool = False,
) -> tuple[np.ndarray, dict]:
    r"""Return prime-rl's IPO keep mask and metrics (``ipo_loss_fn``, ``trainer.loss.type = "ipo"``).

    A token is masked when :math:`|d| >` ``ipo_threshold``, :math:`d = \pi_{trainer} -
    \pi_{inference}` in float32 (a difference exactly at :math:`\pm` the threshold kept); the
    advantages are not read. Metrics (per row that ran, as :func:`dppo_mask`): ``is_masked``,
    ``masked_mismatch_kl``, ``unmasked_mismatch_kl``.

    Parameters
    ----------
    trainer_logprobs, inference_logprobs, loss_mask, rl_weights, per_sample
        As :func:`dppo_mask`.
    ipo_threshold : float, default 0.1
        >= 0.

    Returns
    -------
    keep : ndarray, shape (B, T)
    metrics : dict of str to float, or to ndarray
    """
    comp, ran = _rl_component(loss_mask, rl_weights)
    thr = _bound("ipo_threshold", ipo_threshold)
    y, d = _inputs(trainer_logprobs, inference_logprobs, comp, ("trainer_logprobs", "inference_logprobs"))
    return _masked(y, PRIME_RL_RULE.outside(d, -thr, thr), comp > 0, ran, per_sample)


def icepop_mask(
    trainer_logprobs,
    inference_logprobs,
    loss_mask,
    ratio_low: float = 0.2,
    ratio_high: float = 5.0,
    *,
    rl_weights=None,
    per_sample: bool = False,
) -> tuple[np.ndarray, dict]:
    r"""Return prime-rl's IcePop keep mask and metrics (``IcePopLoss``, ``trainer.loss.type = "icepop"``).

    The opt-in loss of PR #3526 (merged 2026-09-10, after ``559b447``): a token is masked when
    its float32 log-ratio :math:`y_{32} = \log\pi_{trainer} - \log\pi_{inference}` lies
    outside :math:`[\log_{32}` ``ratio_low``, :math:`\log_{32}` ``ratio_high``:math:`]`, each
    bound's log taken in float32 as ``log_importance_ratio.new_tensor(bound).log()`` does, a
    log-ratio at a bound kept (:data:`ICEPOP_LOSS_RULE`: the toolkit's ``icepop:LO:HI`` in float32 log
    space). The advantages are not read. Metrics (per row that ran, as :func:`dppo_mask`):
    ``is_masked``, ``masked_mismatch_kl``, ``unmasked_mismatch_kl``.

    Parameters
    ----------
    trainer_logprobs, inference_logprobs, loss_mask, rl_weights, per_sample
        As :func:`dppo_mask`.
    ratio_low, ratio_high : float, default 0.2 and 5.0
        ``IcePopLossConfig``'s band: both > 0, ``ratio_low <= ratio_high``.

    Returns
    -------
    keep : ndarray, shape (B, T)
    metrics : dict of str to float, or to ndarray
    """
    low, high = _bound("ratio_low", ratio_low, positive=True), _bound("ratio_high", ratio_high, positive=True)
    if low > high:
        raise ValueError(f"ratio_low must not exceed ratio_high, got {ratio_low!r} > {ratio_high!r}")
    comp, ran = _rl_component(loss_mask, rl_weights)
    t = as_values(trainer_logprobs, comp, "trainer_logprobs", keep_float32=True).astype(np.float32)
    i = as_values(inference_logprobs, comp, "inference_logprobs", keep_float32=True).astype(np.float32)
    y32 = t - i
    y = t.astype(np.float64) - i.astype(np.float64)
    masked = ICEPOP_LOSS_RULE.outside(y32, log_float32(ratio_low), log_float32(ratio_high))
    return _masked(y, masked, comp > 0, ran, per_sample)


def ref_kl_mask(
    trainer_logprobs, inference_logprobs, ref_logprobs, ref_kl_weights, *, per_sample: bool = False
) -> tuple[np.ndarray, dict]:
    r"""Return prime-rl's ref-KL keep mask and metrics (``ref_kl_loss_fn``, the ``opd``/``opsd`` algorithms).

    The component's mask is ``ref_kl_weights != 0`` (``compute_loss`` does not intersect it with
    the loss mask); a token is masked when :math:`d < -0.2` (:data:`REF_KL_MASK_LOW`, fixed).
    Metrics, namespaced as prime-rl logs them: ``ref_kl/is_masked``,
    ``ref_kl/masked_mismatch_kl``, ``ref_kl/unmasked_mismatch_kl`` and ``ref_kl``, the mean of
    :math:`\log\pi_{ref} - \log\pi_{trainer}` over the mask.

    Parameters
    ----------
    trainer_logprobs, inference_logprobs, ref_logprobs : array_like, shape (B, T)
    ref_kl_weights : array_like, shape (B, T)
        The ref-KL weight stream; a row of zeros does not run (no metric row, keep 0).
    per_sample : bool
        As :func:`dppo_mask`.

    Returns
    -------
    keep : ndarray, shape (B, T)
    metrics : dict of str to float, or to ndarray
    """
    t = np.asarray(trainer_logprobs)
    if t.ndim != 2:
        raise ValueError(f"trainer_logprobs must be 2-D (batch, positions), got shape {t.shape}")
    lm = _weights(ref_kl_weights, t.shape, "ref_kl_weights") != 0
    comp = lm.astype(np.float64)
    y, d = _inputs(trainer_logprobs, inference_logprobs, comp, ("trainer_logprobs", "inference_logprobs"))
    ref = as_values(ref_logprobs, comp, "ref_logprobs") - as_values(
        trainer_logprobs, comp, "trainer_logprobs"
    )
    masked = PRIME_RL_RULE.outside(d, -REF_KL_MASK_LOW, None)
    return _masked(y, masked, lm, lm.any(axis=-1), per_sample, prefix="ref_kl/", extra={"ref_kl": (ref, lm)})
