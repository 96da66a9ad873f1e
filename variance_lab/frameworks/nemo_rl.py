r"""NeMo-RL's off-policy importance weights and mismatch metrics, in NumPy.

A mirror of ``ClippedPGLossFn.__call__`` in ``nemo_rl/algorithms/loss/loss_functions.py``
(NVIDIA-NeMo/RL at ``ced083a``, the last commit touching it in the snapshot ``7ea279a``,
2026-08-22) and ``masked_mean`` of ``nemo_rl/algorithms/utils.py``, for one micro-batch (the
global token and sequence counts are the batch's own). Checked against ``ClippedPGLossFn`` run
verbatim in torch, its logged metrics and the per-token weights ``__call__`` holds as it returns
(``tools/nemo_rl_fixtures.py``, ``tests/frameworks/test_nemo_rl.py``), and by hand-computed cases
(``tests/frameworks/test_others.py``).

NeMo-RL's conventions, all kept:

- the mismatch log-ratio is :math:`\Delta = \log\pi_{prev} - \log\pi_{gen}`; the mask is
  ``token_mask * sample_mask``; ``masked_mean`` divides by the count plus :math:`10^{-8}`
  (``utils.py:224``), a count that is float32 (:data:`NEMO_MEAN`), so that the divisor is the
  count itself, :math:`\mathrm{fl}_{32}(c + 10^{-8}) = c`, in NeMo-RL's float32 and float64
  runs alike;
- ``token_mult_prob_error`` :math:`= \overline{e^{|\Delta|}}` over the tokens (at least 1; 1
  when the engines agree);
- weights :math:`e^{\Delta_t}` per token, or with ``sequence_level_importance_ratios``
  :math:`e^{\sum_t m_t\Delta_t}` per sequence; non-finite weights become **0**
  (``nan_to_num(posinf=0)``: a sequence whose log-ratio sum overflows gets weight 0, not a cap).
  NeMo-RL computes them in float32 (it casts the logits to float32), so a weight overflows, and
  becomes 0, above a log-ratio of :math:`\log(3.4\cdot10^{38}) = 88.72`; the mirror reproduces
  that threshold;
- the configurations ``ClippedPGLossFn`` refuses are refused with its reasons (a ratio without a
  type, a type without a positive ratio, a minimum above the ratio, ``icepop``/``seq-mask-tis``
  without a minimum, ``seq-mask-tis`` with sequence-level ratios); a minimum of 0 or below is
  accepted, as NeMo-RL accepts it, and cuts nothing from below;
- ``truncated_importance_sampling_type``: ``"tis"`` clamps to
  :math:`[\text{ratio\_min} \text{ or } 0, \text{ratio}]` (the toolkit's ``tis:C`` without a
  minimum, except that an overflowed weight stays 0); ``"icepop"`` zeroes weights outside
  :math:`[\text{min}, \text{max}]` (``icepop:LO:HI``); ``"seq-mask-tis"`` zeroes whole
  sequences whose **geometric mean** :math:`e^{\overline{\Delta}}` (mean over ``token_mask``)
  is outside the bounds, and keeps the raw, **untruncated** token weights of the others
  (``geo-rs:LO:HI``, reference bounds 0.999-1.002);
- the bound rules, in float32 as NeMo-RL decides: ``tis`` and ``icepop`` compare the float32
  weights (an overflowed weight is 0) with the bounds in float32, a weight at a bound kept
  (:data:`NEMO_WEIGHT_RULE`); ``seq-mask-tis`` compares the float32 geometric mean
  :math:`e^{\overline{\Delta}}` with them, a bound kept (:data:`SEQUENCE_RULE`);
- ``is_oob_ratio``: the fraction of tokens (``tis``, ``icepop``) or of sequences
  (``seq-mask-tis``) outside the bounds; ``sampling_importance_ratio``: the mean weight after
  truncation or masking, over tokens (over sequences with sequence-level ratios).
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import MeanRule, as_mask, as_values, exp64, exp_float32, torch_rule
from variance_lab.ratios import TRUNCATION_TYPES

__all__ = [
    "KL_TYPES",
    "NEMO_MEAN",
    "NEMO_WEIGHT_RULE",
    "SEQUENCE_RULE",
    "clipped_pg_importance_weights",
    "metric_normalizations",
]

#: ``calculate_kl``'s estimators (``utils.py:83-93``): k1 :math:`-r`, k2 :math:`r^2/2`, k3 :math:`e^r-1-r`.
KL_TYPES = ("k1", "k2", "k3")

#: NeMo-RL's token bound rule: the float32 weight (0 where it overflowed) against the bounds
#: (a Python float, which torch compares in the tensor's float32), both kept.
NEMO_WEIGHT_RULE = torch_rule(np.float32)
#: ``seq-mask-tis``'s rule: the float32 geometric mean :math:`e^{\overline{\Delta}}` against the
#: bounds in float32, both kept.
SEQUENCE_RULE = torch_rule(np.float32)
#: NeMo-RL's ``masked_mean``: the count plus :math:`10^{-8}`, every token of the batch pooled, in
#: torch's dtypes. The metrics' counts are ``global_valid_toks`` and ``global_valid_seqs``:
#: ``torch.tensor([local_valid_seqs, local_valid_toks])`` of the sums of ``sample_mask`` and of
#: ``token_mask[:, 1:] * sample_mask`` (``nemo_rl/models/automodel/data.py:409-420``;
#: ``megatron/data.py:817`` alike), and ``sample_mask`` is ``rl_collate_fn``'s ``loss_multiplier``,
#: ``torch.tensor`` of Python floats, float32 (``nemo_rl/data/collate_fn.py:33``; all at
#: 7ea279a). A float32 (or int64) count plus the Python float :math:`10^{-8}` is float32, where it
#: rounds to the count (:func:`~variance_lab.frameworks.batch.torch_dtypes`), and dividing a
#: float64 sum by it keeps float64: NeMo-RL divides by the count itself, in its float64 runs too.
#: The mirror passes its counts as float32 sums.
NEMO_MEAN = MeanRule("eps", 1e-8, "tokens", "torch")


def clipped_pg_importance_weights(
    prev_logprobs,
    generation_logprobs,
    token_mask,
    sample_mask=None,
    *,
    sequence_level_importance_ratios: bool = False,
    truncated_importance_sampling_type: str | None = None,
    truncated_importance_sampling_ratio: float | None = None,
    truncated_importance_sampling_ratio_min: float | None = None,
    reference_policy_kl_type: str = "k3",
    micro_batch_size: int | None = 1,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute NeMo-RL's actor importance weights and its mismatch metrics.

    The metrics: ``num_valid_samples``, ``token_mult_prob_error``, ``gen_kl_error``,
    ``policy_kl_error``, ``js_divergence_error``, ``sampling_importance_ratio`` and, with a
    truncation, ``is_oob_ratio``, each as grpo logs it. ``num_valid_samples`` is a raw count, the
    micro-batches' ``sample_mask.sum().item()`` (``loss_functions.py:783``) summed: the batch's
    valid samples. Every other metric is the sum over the micro-batches that hold a valid
    sample of the micro-batch's masked sum over the global count plus :math:`10^{-8}` in float32,
    which is the count (:data:`NEMO_MEAN`; :func:`metric_normalizations` says which count;
    ``is_oob_ratio`` a float32 quotient per micro-batch, as NeMo-RL's ``.float()`` mask gives). With
    :math:`r = \log\pi_{prev} - \log\pi_{gen}` and
    :math:`M = \log(\tfrac12 \pi_{prev} + \tfrac12 \pi_{gen})`, per token: ``gen_kl_error`` is
    ``calculate_kl`` of :math:`r` (k3: :math:`e^r - 1 - r`), ``policy_kl_error`` of :math:`-r`, and
    ``js_divergence_error`` :math:`\tfrac12 k_3(\log\pi_{prev} - M) + \tfrac12 k_3(\log\pi_{gen} - M)`
    with :math:`k_3(x) = e^x - x - 1` (``loss_functions.py:414-464`` at 7ea279a), each in NeMo-RL's
    order of operations. Values are computed in float64 where NeMo-RL's float32 ones are finite
    (equal to NeMo-RL's float64 run to float64 rounding); where NeMo-RL's float32 arithmetic gives
    ``inf`` (:math:`e^x` for :math:`x > 88.72`) or NaN (both probabilities below float32's
    smallest, :math:`\log\pi < -103.97`, so :math:`M = -\infty`) the mirror gives the same, and a
    non-finite value at a masked token makes the metric NaN as ``values * mask`` does.

    Parameters
    ----------
    prev_logprobs, generation_logprobs : array_like, shape (B, T)
        The trainer's and the generation engine's token log-probabilities (already aligned:
        NeMo-RL's ``[:, 1:]`` slices done).
    token_mask : array_like, shape (B, T)
    sample_mask : array_like, shape (B,), optional
        1 for a sequence that counts (default all).
    sequence_level_importance_ratios : bool
    truncated_importance_sampling_type : {None, "tis", "icepop", "seq-mask-tis"}
        One of :data:`~variance_lab.ratios.TRUNCATION_TYPES`, or None for no truncation.
    truncated_importance_sampling_ratio : float, optional
        The upper bound; None: no truncation.
    truncated_importance_sampling_ratio_min : float, optional
        The lower bound (required for ``icepop`` and ``seq-mask-tis``; ``tis`` defaults to 0).
    micro_batch_size : int, optional
        NeMo-RL's ``train_micro_batch_size``: the rows in order form micro-batches of this size
        (the last may be smaller). It changes only the sequence-level ``sampling_importance_ratio``,
        which NeMo-RL logs as the micro-batches' sum of
        :math:`S_{mb} \sum_{i \in mb} w_i / (S + 10^{-8})` (a broadcast in its ``masked_mean``;
        :math:`S` the valid samples): the mean weight for micro-batches of one (the default),
        about ``micro_batch_size`` times it otherwise. None: the batch is one micro-batch.
        The token-normalised metrics do not depend on it, except that a NaN or ``inf`` in a
        micro-batch with no valid sample is dropped with that micro-batch's metrics. Dynamic
        batching, sequence packing and several global batches per step are not mirrored.
    reference_policy_kl_type : {"k1", "k2", "k3"}
        The estimator of ``gen_kl_error`` and ``policy_kl_error`` (NeMo-RL's default k3).

    Returns
    -------
    (weights, metrics)
        Weights of shape (B, T), or (B, 1) with sequence-level ratios.
    """
    tm = as_mask(token_mask, "token_mask")
    sm = np.ones(tm.shape[0]) if sample_mask is None else np.asarray(sample_mask, dtype=np.float64)
    if sm.shape != (tm.shape[0],) or not np.all((sm == 0) | (sm == 1)):
        raise ValueError(f"sample_mask must be 0/1 of shape ({tm.shape[0]},), got shape {sm.shape}")
    mask = tm * sm[:, None]
    prev = as_values(prev_logprobs, tm, "prev_logprobs")
    gen = as_values(generation_logprobs, tm, "generation_logprobs")
    kind, hi, lo = (
        truncated_importance_sampling_type,
        truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min,
    )
    _check_truncation(kind, hi, lo, sequence_level_importance_ratios)
    if micro_batch_size is not None and (
        isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1
    ):
        raise ValueError(f"micro_batch_size must be an integer >= 1, got {micro_batch_size!r}")
    if reference_policy_kl_type not in KL_TYPES:
        raise ValueError(f"Invalid KL type: {reference_policy_kl_type!r}; types are k1, k2, k3")
    delta = prev - gen
    size = sm.size if micro_batch_size is None else micro_batch_size
    metrics = {
        "num_valid_samples": float(sm.sum()),
        "token_mult_prob_error": _logged_token_mean(exp64(np.abs(delta) * mask), mask, sm, size),
        "gen_kl_error": _logged_token_mean(_kl(delta, reference_policy_kl_type), mask, sm, size),
        "policy_kl_error": _logged_token_mean(_kl(-delta, reference_policy_kl_type), mask, sm, size),
        "js_divergence_error": _logged_token_mean(_js(prev, gen), mask, sm, size),
    }
    # the bound decisions on NeMo-RL's float32 values; the weights' values in float64
    d32 = prev.astype(np.float32) - gen.astype(np.float32)
    if sequence_level_importance_ratios:
        x, x32 = (delta * mask).sum(axis=-1, keepdims=True), (d32 * mask).sum(axis=-1, keepdims=True)
    else:
        x, x32 = delta, d32
    w32 = exp_float32(x32)  # inf above 88.72: 0 after nan_to_num, in float32 as in float64
    with np.errstate(over="ignore"):
        w = np.where(np.isinf(w32), 0.0, np.exp(x))
    w32 = np.where(np.isinf(w32), np.float32(0), w32)
    if hi is not None and kind is not None:
        if kind in ("tis", "icepop"):
            floor = 0.0 if lo is None else lo
            out = NEMO_WEIGHT_RULE.outside(w32, floor, hi)
            oob = np.broadcast_to(out, mask.shape)  # token_oob_mask.float(): float32
            metrics["is_oob_ratio"] = _logged_token_mean(oob, mask, sm, size, np.float32)
            # tis clamps (an overflowed weight, 0, is raised to the minimum); icepop zeroes
            w = np.clip(w, floor, hi) if kind == "tis" else np.where(out, 0.0, w)
        else:
            count = tm.sum(axis=-1).astype(np.float32) + np.float32(1e-8)
            mean32 = (d32 * tm).sum(axis=-1).astype(np.float32) / count
            out = SEQUENCE_RULE.outside(exp_float32(mean32), lo, hi)
            kept = (~out).astype(float)
            # masked_mean(1.0 - seq_kept_mask, sample_mask, global_valid_seqs): float32
            metrics["is_oob_ratio"] = _logged_token_mean(
                (1.0 - kept)[:, None], sm[:, None], sm, size, np.float32
            )
            w = w * kept[:, None]
    if sequence_level_importance_ratios:
        metrics["sampling_importance_ratio"] = _logged_sequence_ratio(w[:, 0], sm, micro_batch_size)
    else:
        metrics["sampling_importance_ratio"] = _logged_token_mean(w, mask, sm, size)
    return w, metrics


def metric_normalizations(
    *,
    token_level_loss: bool = True,
    sequence_level_importance_ratios: bool = False,
    truncated_importance_sampling_type: str | None = None,
) -> dict[str, str]:
    """Return ``ClippedPGLossFn.metric_normalizations``: each metric's global denominator.

    ``"tokens"`` (``global_valid_toks``), ``"sequences"`` (``global_valid_seqs``) or ``"none"``
    (a raw count, a local mean or an extremum), as built in ``ClippedPGLossFn.__init__``
    (``loss_functions.py:325-372`` at 7ea279a): ``loss`` and ``kl_penalty`` follow the loss type,
    ``sampling_importance_ratio`` ``sequence_level_importance_ratios``, ``is_oob_ratio`` (only
    with a truncation) the truncation type (sequences for ``seq-mask-tis``).
    """
    grad = "tokens" if token_level_loss else "sequences"
    table = {"loss": grad, "kl_penalty": grad}
    for k in ("probs_ratio", "probs_ratio_clamped", "token_mult_prob_error", "gen_kl_error"):
        table[k] = "tokens"
    for k in ("policy_kl_error", "js_divergence_error", "approx_entropy"):
        table[k] = "tokens"
    table["sampling_importance_ratio"] = "sequences" if sequence_level_importance_ratios else "tokens"
    for k in ("num_valid_samples", "positive_nll_loss", "probs_ratio_min", "probs_ratio_max"):
        table[k] = "none"
    table["probs_ratio_clamped_min"] = table["probs_ratio_clamped_max"] = "none"
    if truncated_importance_sampling_type is not None:
        seq = truncated_importance_sampling_type == "seq-mask-tis"
        table["is_oob_ratio"] = "sequences" if seq else "tokens"
    return table


def _kl(r: np.ndarray, kind: str) -> np.ndarray:
    r"""``calculate_kl`` without clamps on :math:`r` = reference minus log-probs (``utils.py:72-101``)."""
    if kind == "k1":
        return -r
    if kind == "k2":
        return r * r / 2
    return exp64(r) - 1 - r


def _js(prev: np.ndarray, gen: np.ndarray) -> np.ndarray:
    r"""NeMo-RL's per-token Jensen-Shannon term in its order of operations; NaN/``inf`` as its float32 one.

    :math:`M = \log(\tfrac12 e^{p} + \tfrac12 e^{g})` and :math:`\tfrac12 (e^{p - M} - (p - M) - 1)
    + \tfrac12 (e^{g - M} - (g - M) - 1)`, each step as ``loss_functions.py:443-466`` (7ea279a)
    takes it, in float64: for a small :math:`|p - g|` the term, about :math:`(p - g)^2/8`, is of
    the size of the rounding of :math:`e^{p - M}` near 1, which NeMo-RL's value keeps
    (``logaddexp`` and ``expm1`` gave values up to :math:`1.6\cdot10^{-10}` relative from NeMo-RL's
    float64 ones on the fixtures). In float32
    :math:`M = -\infty` when both halves underflow to 0 (then :math:`p - M = \infty` and
    :math:`e^\infty - \infty` is NaN), and :math:`M = \infty` when an exponential overflows
    (then the term is ``inf``); the mirror gives the same there.
    """
    p32, g32 = exp_float32(prev), exp_float32(gen)
    half = np.float32(0.5)
    mix32 = half * p32 + half * g32
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        m = np.log(0.5 * np.exp(prev) + 0.5 * np.exp(gen))
        a, b = prev - m, gen - m
        js = 0.5 * (np.exp(a) - a - 1) + 0.5 * (np.exp(b) - b - 1)
    return np.where(mix32 == 0, np.nan, np.where(np.isinf(mix32), np.inf, js))


def _logged_token_mean(v: np.ndarray, mask: np.ndarray, sm: np.ndarray, size: int, dtype=np.float64) -> float:
    r"""Return a metric as grpo logs it: :math:`\sum_{mb} \mathrm{fl}(\sum_{mb} m v / (N + 10^{-8}))`.

    ``masked_mean(v, mask, global_normalization_factor=N)`` per micro-batch, each a quotient in
    the values' ``dtype`` (float32 for a ``.float()`` mask such as ``is_oob_ratio``'s), summed in
    float64 over those with a valid sample (``dtensor_policy_worker_v2.py:528-537``,
    ``grpo.py:3491``); ``v * mask`` first, so a non-finite value at a masked token is NaN.
    :math:`N`, the global count of ``mask``, is float32, and :math:`N + 10^{-8}` in float32 is
    :math:`N` (:data:`NEMO_MEAN`); ``mask`` is float32 as NeMo-RL's ``token_mask * sample_mask``.
    """
    count, m32, parts = _count(mask), mask.astype(np.float32), []
    with np.errstate(invalid="ignore"):
        for lo in range(0, sm.size, size):
            if sm[lo : lo + size].sum() > 0:
                total = (v[lo : lo + size].astype(dtype) * m32[lo : lo + size]).sum(dtype=dtype)
                parts.append(float(NEMO_MEAN.divide(total, count)))
    return float(np.sum(parts))


def _logged_sequence_ratio(w: np.ndarray, sm: np.ndarray, micro_batch_size: int | None) -> float:
    r"""NeMo-RL's logged sequence-level ``sampling_importance_ratio``, a broadcast included.

    ``masked_mean(actor_importance_weights, sample_mask, global_valid_seqs)`` multiplies the
    ``(b, 1)`` weights of a micro-batch by its ``(b,)`` sample mask: a ``(b, b)`` product whose sum
    is :math:`\sum_{i \in mb} w_i \cdot \sum_{j \in mb} s_j`, every row's weight, masked rows
    included (``loss_functions.py:697-702`` at 7ea279a); the step sums the micro-batches
    (``grpo.py:3491``). So it logs :math:`\sum_{mb} S_{mb} \sum_{i \in mb} w_i / (S + 10^{-8})`,
    which is the mean it means, :math:`\sum_i s_i w_i / S`, only for micro-batches of one.
    """
    size = sm.size if micro_batch_size is None else micro_batch_size
    total = sum(w[lo : lo + size].sum() * sm[lo : lo + size].sum() for lo in range(0, sm.size, size))
    return float(NEMO_MEAN.divide(total, _count(sm)))


def _count(mask: np.ndarray) -> np.float32:
    """Return ``global_valid_toks`` or ``global_valid_seqs`` as NeMo-RL holds it: the sum in float32."""
    return np.float32(mask.sum())


def _check_truncation(kind, hi, lo, sequence_level: bool) -> None:
    """Refuse what ``ClippedPGLossFn`` refuses, with its reasons (``loss_functions.py:316-350``)."""
    if kind is not None and kind not in TRUNCATION_TYPES:
        raise ValueError(
            f"bad truncated_importance_sampling_type {kind!r}; types are tis, icepop, seq-mask-tis"
        )
    if kind is None and hi is not None:  # __call__ raises on the ratio with no type
        raise ValueError("Invalid truncated importance sampling type: None (a ratio needs a type)")
    if kind is not None and (hi is None or not hi > 0):
        raise ValueError(f"truncated_importance_sampling_ratio should be positive, got {hi!r}")
    if lo is not None and not lo <= hi:
        raise ValueError(
            f"truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio, "
            f"got {lo!r} > {hi!r}"
        )
    if kind in ("icepop", "seq-mask-tis") and lo is None:
        raise ValueError(f"truncated_importance_sampling_ratio_min should be set for {kind!r}")
    if kind == "seq-mask-tis" and sequence_level:
        raise ValueError("seq-mask-tis is incompatible with sequence_level_importance_ratios=True")
