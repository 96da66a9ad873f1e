r"""slime's TIS, IcePop and policy-loss metrics, its MIS veto and its two means, in NumPy.

A mirror of ``vanilla_tis_function`` (``slime/backends/megatron_utils/loss.py:884-905``),
``icepop_function`` (``loss.py:908-931``) and the metrics of ``policy_loss_function``
(``loss.py:934-1173``: ``ois``, ``ppo_kl``, ``train_rollout_logprob_abs_diff``, GSPO's
sequence-level ``ppo_kl`` from ``compute_gspo_kl``, ``slime/utils/ppo_utils.py:95-121``); of the
reducers ``get_sum_of_sample_mean`` (``slime/backends/megatron_utils/cp_utils.py:47-124``) and
``reduce_train_step_metrics`` (``slime/observability/train_metric_utils.py:18-59``) with the
token count of ``loss_function`` (``loss.py:1317``) and the per-rollout denominators
``rollout_mask_sums`` (``slime/ray/rollout.py:685-700``); and of ``calculate_veto_mask``
(``examples/train_infer_mismatch_helper/mis.py:82-100``). THUDM/slime at ``624b824``
(2026-08-21). The rest of ``mis.py`` is :mod:`variance_lab.frameworks.slime_mis`. slime itself
is not installable here (it needs Megatron-LM and SGLang), but these functions need only torch:
``tools/slime_fixtures.py`` runs them from a checkout, and ``tests/frameworks/test_slime.py``
compares (every count exact, every value within slime's own float32 rounding), beside
hand-computed cases from the source.

slime's conventions, all kept:

- ``tis`` is the raw ratio :math:`e^{y}`, :math:`y = \log\pi_{old} - \log\pi_{rollout}`;
  ``tis_abs`` :math:`= |e^y - 1|`; the TIS weight clamps to ``[tis_clip_low, tis_clip]``
  (defaults ``--tis-clip 2``, ``--tis-clip-low 0``: the toolkit's ``tis:2``), IcePop zeroes
  ratios outside it (``icepop:LO:HI``); ``tis_clipfrac`` flags tokens whose weight differs from
  the ratio;
- ``ois`` :math:`= e^{-\text{ppo\_kl}}`: per token :math:`\pi_\theta/\pi_{old}`, with
  ``--advantage-estimator gspo`` the sequence's :math:`e^{\overline{\log\pi_\theta -
  \log\pi_{old}}}` (mean over its loss mask, count at least 1) on each of its tokens; with
  ``--use-rollout-logprobs`` the old policy is the rollout engine's;
- ``train_rollout_logprob_abs_diff`` :math:`= |\log\pi_{old} - \log\pi_{rollout}|` per token
  (:math:`\pi_\theta` instead of :math:`\pi_{old}` with ``--use-rollout-logprobs``);
- the logged mean (:func:`sample_mean`): by default (``calculate_per_token_loss=False``) each
  rollout's token mean, :math:`\sum m v / \max(\sum m, 1)` over the tokens of all its samples,
  then the mean over rollouts (:data:`SLIME_MEAN`): with one sample per rollout, as
  ``--n-samples-per-prompt`` makes them (each sample its own ``rollout_id``), long and short
  sequences weigh the same; a fully masked sample counts as a rollout with mean 0. With
  ``calculate_per_token_loss=True`` every token of the batch is pooled and the divisor is
  :math:`\sum_i \max(\sum_t m_{it}, 1)` (:data:`SLIME_TOKEN_MEAN`): a fully masked sample adds
  1 to the count; a fraction (``tis_clipfrac``, mis.py's ``*_fraction``) is slime's to the bit:
  each sample's count over its rollout's float32 count, summed in float32
  (:func:`_rollout_fraction`);
- metrics that ``policy_loss_function`` reduces after the TIS function (``ppo_kl``,
  ``train_rollout_logprob_abs_diff``) sum over the TIS function's ``modified_response_masks``
  (``keep_masks``: mis.py's rejections) and divide by the counts of the original loss masks;
  the mismatch metrics (``tis*``, ``ois``, ``mis_*``) use the original masks throughout;
- the veto rejects a whole sequence when one of its tokens has :math:`e^y <` the threshold;
  slime logs it (through mis.py) as ``mis_rs_catastrophic_token_fraction`` and
  ``mis_rs_catastrophic_seq_fraction``;
- slime computes in float32 (``rollout_log_probs`` are float32 tensors, ``rollout_data_utils.py:15``,
  and so are Megatron's log-probs), so every bound test here is made in float32: the float32
  log-ratio :math:`y_{32}` (the float32 difference of the float32 log-probs), its float32
  exponential (the correctly rounded one, :func:`~variance_lab.frameworks.batch.exp_float32`)
  against the bounds rounded to float32
  (:data:`ICEPOP_RULE`, both kept), and :math:`y_{32}` against the threshold's log taken in
  float32 as ``torch.log(torch.tensor(veto_threshold))`` does (:data:`VETO_RULE`, a token at the
  threshold kept). Values are computed in float64, except that a ratio whose float32
  exponential overflows (:math:`y > 88.72`) is ``inf``, as in slime (:func:`exp64`).

Not reproduced: slime multiplies a metric by the loss mask, so an ``inf`` ratio on a token
outside the loss mask (inside the response) makes its metric NaN; the mirror's padded layout
cannot tell such a token from padding and leaves it out. Settings that ``torch.clamp`` would run
but that mean nothing (``tis_clip_low > tis_clip``, a negative bound) are refused.
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import (
    SAMPLE_MEAN,
    MeanRule,
    as_mask,
    as_values,
    exp64,
    exp_float32,
    log_float32,
    torch_rule,
)
from variance_lab.stats import group_labels

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ICEPOP_RULE",
    "SLIME_MEAN",
    "SLIME_TOKEN_MEAN",
    "VETO_RULE",
    "policy_metrics",
    "sample_mean",
    "tis_metrics",
    "veto_mask",
]

#: slime's TIS clamp and IcePop: the float32 ratio against the bounds (as float32), both kept.
ICEPOP_RULE = torch_rule(np.float32)
#: slime's veto: the float32 log-ratio against the threshold's float32 log, a token at it kept.
VETO_RULE = torch_rule(np.float32, "log")
#: ``get_sum_of_sample_mean`` (``calculate_per_token_loss=False``): each rollout's mean (count
#: clamped to at least 1), then the mean over rollouts.
SLIME_MEAN = SAMPLE_MEAN
#: ``sum_of_token`` over ``num_tokens`` (``calculate_per_token_loss=True``): every token pooled,
#: divided by the sum of each sample's count clamped to at least 1 (``loss.py:1317``).
SLIME_TOKEN_MEAN = MeanRule("row_at_least_one", 0.0, "tokens")
#: ``--advantage-estimator`` values (``slime/utils/arguments.py:941-951``); only ``gspo`` changes
#: ``ppo_kl`` and ``ois`` (sequence-level).
ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")


def _rollout_groups(rollout_ids, rows: int):
    if rollout_ids is None:
        return None
    g = np.asarray(rollout_ids)
    if g.shape != (rows,) or g.dtype.kind not in "iu":
        raise ValueError(
            f"rollout_ids must be {rows} integers (one per sample), got {g.dtype} of shape {g.shape}"
        )
    return g


def sample_mean(
    values,
    loss_mask,
    *,
    calculate_per_token_loss: bool = False,
    rollout_ids=None,
    keep_mask=None,
) -> float:
    r"""Return a per-token metric as slime logs it: the mean over rollouts of each rollout's token mean.

    :math:`\frac1G\sum_g \sum_{i\in g}\sum_t k_{it} v_{it} / \max(\sum_{i\in g}\sum_t m_{it}, 1)`
    over the :math:`G` rollouts (one per sample unless ``rollout_ids`` groups them); with
    ``calculate_per_token_loss`` :math:`\sum_{it} k_{it} v_{it} / \sum_i \max(\sum_t m_{it}, 1)`.

    Parameters
    ----------
    values : array_like, shape (B, T) or broadcastable
    loss_mask : array_like, shape (B, T)
        0/1, bool or int (slime's are int32). Gives the counts.
    calculate_per_token_loss : bool
        slime's ``--calculate-per-token-loss``.
    rollout_ids : array_like of int, shape (B,), optional
        slime's ``rollout_ids``: samples with the same id are one rollout (the denominator
        ``rollout_mask_sums``, and one rollout in the step's count). Default: each sample its own
        (``--n-samples-per-prompt`` samples are distinct rollouts). Ignored with
        ``calculate_per_token_loss``.
    keep_mask : array_like, shape (B, T), optional
        The tokens summed (:math:`k`; default the loss mask): mis.py's ``modified_response_masks``
        for the metrics ``policy_loss_function`` reduces after the TIS function.

    Notes
    -----
    Bool or integer ``values`` are flags, and the result is then the fraction slime logs, bit for
    bit (:func:`_rollout_fraction`): slime's flags are ``.int()`` (mis.py) or ``.float()``
    (``tis_clipfrac``) tensors whose sums are exact counts, divided in float32. With
    ``calculate_per_token_loss`` the counts are summed (exact) and ``reduce_train_step_metrics``
    divides them by ``num_tokens`` in Python floats: the float64 quotient of the two counts.
    """
    m = as_mask(loss_mask, "loss_mask")
    inside = m > 0
    if keep_mask is not None:
        inside &= as_mask(keep_mask, "keep_mask", m.shape) > 0
    raw = np.asarray(values)
    groups = _rollout_groups(rollout_ids, m.shape[0])
    if raw.dtype.kind in "biu" and not calculate_per_token_loss:
        return _rollout_fraction(np.broadcast_to(raw != 0, m.shape) & inside, m, groups)
    v = np.where(inside, np.broadcast_to(raw.astype(np.float64), m.shape), 0.0)
    if calculate_per_token_loss:
        return float(SLIME_TOKEN_MEAN.mean(v, m))
    return float(SLIME_MEAN.mean(v, m, groups=groups))


def _rollout_fraction(flags: np.ndarray, m: np.ndarray, groups) -> float:
    r"""Return a fraction of flags as slime's per-rollout mean logs it, in its float32 arithmetic.

    ``get_sum_of_sample_mean`` (``cp_utils.py:73-81``) sums, in sample order, each sample's count
    :math:`k_i` over its rollout's count :math:`D_{g(i)}` clamped to at least 1: the count is
    int64 (or an exact float32 sum), ``rollout_mask_sums`` is float32
    (``slime/observability/rollout_data_utils.py:48-52``, ``actor.py:264-269``), so each quotient
    is :math:`\mathrm{fl}_{32}(k_i / \max(D_{g(i)}, 1))` (:data:`SLIME_MEAN`) and Python's
    ``sum`` of the 0-d tensors adds them one by one in float32;
    ``reduce_train_step_metrics`` (``train_metric_utils.py:51-59``) then divides that float32
    sum, as a Python float, by the number of rollouts :math:`G`.
    """
    rows = m.sum(axis=-1)
    if groups is None:
        denoms, n_rollouts = rows, rows.size
    else:
        index, n_rollouts = group_labels(groups, rows.size)
        denoms = np.bincount(index, weights=rows)[index]
    quotients = SLIME_MEAN.divide(flags.sum(axis=-1), denoms.astype(np.float32))
    total = np.cumsum(quotients, dtype=np.float32)[-1]  # sequential, as sum() of the tensors
    return float(total) / n_rollouts


def _bound(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
        raise ValueError(f"bad {name} {v!r}: must be a number >= 0")


def tis_metrics(
    old_log_probs,
    rollout_log_probs,
    loss_masks,
    log_probs=None,
    *,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    icepop: bool = False,
    advantage_estimator: str = "grpo",
    calculate_per_token_loss: bool = False,
    rollout_ids=None,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Return slime's token weights (TIS, or IcePop with ``icepop=True``) and what a ``--use-tis`` run logs.

    Parameters
    ----------
    old_log_probs, rollout_log_probs : array_like, shape (B, T)
        The trainer's (``log_probs``) and the rollout engine's (``rollout_log_probs``) token
        log-probabilities.
    loss_masks : array_like, shape (B, T)
        0/1, bool or int.
    log_probs : array_like, shape (B, T), optional
        The current policy's: adds ``ois`` and ``ppo_kl``.
    tis_clip, tis_clip_low : float
        ``--tis-clip`` and ``--tis-clip-low`` (defaults 2 and 0).
    icepop : bool
        ``icepop_function`` (``--custom-tis-function-path ...loss.icepop_function``) instead of
        ``vanilla_tis_function``.
    advantage_estimator : str
        ``--advantage-estimator`` (:data:`ADVANTAGE_ESTIMATORS`); ``"gspo"``: sequence-level
        ``ppo_kl`` and ``ois``.
    calculate_per_token_loss : bool
    rollout_ids : array_like of int, shape (B,), optional
        The logged mean's options (:func:`sample_mean`).

    Returns
    -------
    (weights, metrics)
        The weights (0 outside the mask); ``tis``, ``tis_clipfrac``, ``tis_abs``,
        ``train_rollout_logprob_abs_diff`` and, with ``log_probs``, ``ois`` and ``ppo_kl``.
    """
    m = as_mask(loss_masks, "loss_masks")
    old = as_values(old_log_probs, m, "old_log_probs")
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs")
    _bound("tis_clip", tis_clip)
    _bound("tis_clip_low", tis_clip_low)
    if not tis_clip_low <= tis_clip:
        raise ValueError(f"bad tis_clip_low {tis_clip_low!r}: must be <= tis_clip {tis_clip!r}")
    r32 = exp_float32(old.astype(np.float32) - rollout.astype(np.float32))
    r = exp64(old - rollout)
    out = ICEPOP_RULE.outside(r32, tis_clip_low, tis_clip)  # clamp(r) != r, and IcePop's drop
    w = np.where(out, 0.0, r) if icepop else np.where(out, np.clip(r, tis_clip_low, tis_clip), r)
    kw = {"calculate_per_token_loss": calculate_per_token_loss, "rollout_ids": rollout_ids}
    metrics = {
        "tis": sample_mean(r, m, **kw),
        "tis_clipfrac": sample_mean(out, m, **kw),  # (tis_weights != tis).float(): counted
        "tis_abs": sample_mean(np.abs(r - 1.0), m, **kw),
    }
    metrics.update(policy_metrics(old, rollout, m, log_probs, advantage_estimator=advantage_estimator, **kw))
    return np.where(m > 0, w, 0.0), metrics


def policy_metrics(
    old_log_probs,
    rollout_log_probs,
    loss_masks,
    log_probs=None,
    *,
    advantage_estimator: str = "grpo",
    use_rollout_logprobs: bool = False,
    keep_masks=None,
    calculate_per_token_loss: bool = False,
    rollout_ids=None,
) -> dict[str, float]:
    r"""Return ``ois``, ``ppo_kl``, ``train_rollout_logprob_abs_diff`` as ``policy_loss_function`` logs them.

    ``ppo_kl`` :math:`= \log\pi_{old} - \log\pi_\theta` per token (with ``gspo`` the sequence's
    mean over its loss mask, count at least 1, on each token; ``loss.py:1020-1033``), ``ois``
    :math:`= e^{-\text{ppo\_kl}}` (``loss.py:1063``), ``train_rollout_logprob_abs_diff``
    :math:`= |\log\pi_{old} - \log\pi_{rollout}|` (``loss.py:1136-1140``). ``ois`` is reduced
    over the loss masks, the other two over ``keep_masks`` (``loss.py:1086-1107``).

    Parameters
    ----------
    old_log_probs : array_like, shape (B, T), or None
        The trainer's recomputed log-probabilities (slime's ``batch["log_probs"]``). None: slime
        has none (it reuses the loss's forward pass) and takes ``log_probs`` (then ``ppo_kl`` is 0,
        ``ois`` 1); unused with ``use_rollout_logprobs``.
    rollout_log_probs : array_like, shape (B, T)
    loss_masks : array_like, shape (B, T)
    log_probs : array_like, shape (B, T), optional
        The current policy's; without it only ``train_rollout_logprob_abs_diff``.
    advantage_estimator : str
        :data:`ADVANTAGE_ESTIMATORS`; ``"gspo"`` makes ``ppo_kl`` and ``ois`` sequence-level.
    use_rollout_logprobs : bool
        ``--use-rollout-logprobs``: the old policy is the rollout engine's, and
        ``train_rollout_logprob_abs_diff`` compares :math:`\pi_\theta` (needs ``log_probs``).
    keep_masks : array_like, shape (B, T), optional
        The TIS function's ``modified_response_masks`` (mis.py's rejections; default the loss masks).
    calculate_per_token_loss : bool
    rollout_ids : array_like of int, shape (B,), optional
        The logged mean's options (:func:`sample_mean`).
    """
    if advantage_estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"bad advantage_estimator {advantage_estimator!r}; slime's are {ADVANTAGE_ESTIMATORS}"
        )
    m = as_mask(loss_masks, "loss_masks")
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs")
    if log_probs is None and (use_rollout_logprobs or old_log_probs is None):
        raise ValueError(
            "pass log_probs: use_rollout_logprobs or old_log_probs=None compare the current policy's"
        )
    new = None if log_probs is None else as_values(log_probs, m, "log_probs")
    if use_rollout_logprobs:
        old = rollout
    else:  # without recomputed log-probs slime takes the current ones (loss.py:985-986)
        old = new if old_log_probs is None else as_values(old_log_probs, m, "old_log_probs")
    kw = {"calculate_per_token_loss": calculate_per_token_loss, "rollout_ids": rollout_ids}
    compared = new if use_rollout_logprobs else old
    metrics = {
        "train_rollout_logprob_abs_diff": sample_mean(
            np.abs(compared - rollout), m, keep_mask=keep_masks, **kw
        )
    }
    if new is None:
        return metrics
    ppo_kl = old - new
    if advantage_estimator == "gspo":  # compute_gspo_kl: the sequence mean on every token
        ppo_kl = np.broadcast_to(SLIME_MEAN.mean(ppo_kl, m, axis=-1, keepdims=True), m.shape)
    metrics["ois"] = sample_mean(exp64(-ppo_kl), m, **kw)
    metrics["ppo_kl"] = sample_mean(ppo_kl, m, keep_mask=keep_masks, **kw)
    return metrics


def veto_mask(
    old_log_probs,
    rollout_log_probs,
    loss_masks,
    veto_threshold: float | None = 1e-4,
    *,
    calculate_per_token_loss: bool = False,
    rollout_ids=None,
):
    r"""Return slime's MIS veto: a (B, T) keep mask, 0 for a sequence with a token ratio below the threshold.

    ``calculate_veto_mask`` (``mis.py:82-100``): a token is catastrophic when it is in the loss
    mask and :math:`y_{32} < \log_{32}` ``veto_threshold`` (:data:`VETO_RULE`). Metrics, named as
    slime logs them (mis.py calls it with ``metric_prefix="rs_"``, ``compute_mis_weights_with_cp``
    prefixes ``mis_``): ``mis_rs_catastrophic_token_fraction`` and
    ``mis_rs_catastrophic_seq_fraction`` (:func:`sample_mean`). ``veto_threshold=None``: all kept,
    no metric (mis.yaml's default is ``1.0e-4``).
    """
    m = as_mask(loss_masks, "loss_masks")
    old = as_values(old_log_probs, m, "old_log_probs")
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs")
    if veto_threshold is None:
        return np.ones(m.shape), {}
    if (
        isinstance(veto_threshold, bool)
        or not isinstance(veto_threshold, int | float)
        or not veto_threshold > 0
    ):
        raise ValueError(f"bad veto_threshold {veto_threshold!r}: must be a number > 0")
    y32 = old.astype(np.float32) - rollout.astype(np.float32)
    bad = VETO_RULE.outside(y32, log_float32(veto_threshold), None) & (m > 0)
    seq_bad = np.broadcast_to(bad.any(axis=-1, keepdims=True), m.shape)
    kw = {"calculate_per_token_loss": calculate_per_token_loss, "rollout_ids": rollout_ids}
    metrics = {
        "mis_rs_catastrophic_token_fraction": sample_mean(bad, m, **kw),  # .int() flags: counted
        "mis_rs_catastrophic_seq_fraction": sample_mean(seq_bad, m, **kw),
    }
    return (~seq_bad).astype(np.float64), metrics
