r"""slime's ``mis.py``: TIS and rejection at three levels, veto, batch normalisation, ppl/k3/chi2 metrics.

A mirror of ``compute_mis_weights`` and ``add_ppl_metrics`` in
``examples/train_infer_mismatch_helper/mis.py`` (THUDM/slime at ``624b824``, 2026-08-21; lines
cited below), as a run with ``--custom-tis-function-path
examples/train_infer_mismatch_helper/mis.py:compute_mis_weights_with_cp`` and
``--custom-config-path mis.yaml`` logs it: every metric prefixed ``mis_``
(``compute_mis_weights_with_cp``, ``mis.py:375-378``) and reduced by ``policy_loss_function``
over the original loss masks (:func:`variance_lab.frameworks.slime.sample_mean`,
``loss.py:1156-1163``). The veto is :func:`variance_lab.frameworks.slime.veto_mask`. Checked
against mis.py itself, run with torch by ``tools/slime_fixtures.py`` on 120 random settings
(``tests/frameworks/test_slime_mis.py``: rejection masks and counts exact, values within slime's
own float32 rounding), and by hand-computed cases; slime itself is not installable here.

The options, with slime's names and mis.yaml's values as defaults (mis.py has no defaults of
its own: ``--custom-config-path`` sets them, ``slime/utils/arguments.py:2013-2019``):

- ``use_tis`` (true): without it only the ppl metrics (``mis.py:207-209``; no rejection
  either, whatever ``use_rs`` says); ``use_rs`` (true);
- ``tis_level`` / ``rs_level`` (``"token"``): the log-ratio :math:`y = \log\pi_{old} -
  \log\pi_{rollout}` per token, its sum over the sequence (``"sequence"``) or its mean
  (``"geometric"``, count at least 1), clamped to :math:`\pm 20` before :math:`e^y`
  (``mis.py:188-223``);
- ``tis_mode`` (``"truncate"``): ``truncate`` caps the weight at ``tis_upper_bound`` (metric
  ``tis_truncate_fraction``), ``clip`` clamps it to ``[tis_lower_bound, tis_upper_bound]``
  (``tis_clip_fraction_low``/``_high``), ``mask`` keeps the weight and rejects the token
  (``tis_mask_fraction_low``/``_high``; ``mis.py:103-147``, ``226-237``);
- ``tis_lower_bound`` (0.5; None: ``1 / tis_upper_bound``), ``tis_upper_bound`` (2.0),
  ``rs_lower_bound`` / ``rs_upper_bound`` (None: the TIS bounds; ``mis.py:174-176``);
- rejection sampling (``mis.py:243-263``): a token whose ``rs_level`` weight is outside the RS
  bounds leaves the mask (``rs_mask_fraction_low``/``_high``), then the veto
  (``rs_veto_threshold`` 1e-4; None: off) drops whole sequences;
- ``tis_batch_normalize`` (true): the weights divided by their mean over the micro-batch's
  tokens (``tis_level`` token) or over its sequences (sequence); with ``geometric`` slime raises
  ``Unsupported tis_level: geometric`` (so does the mirror), and a mean of at most
  :math:`10^{-8}` leaves the weights as they are (``mis.py:272-297``). slime calls the function
  once per micro-batch: ``micro_batch_indices`` gives them;
- the ppl metrics (``mis.py:383-451``), for every sample: ``training_log_ppl`` (minus the
  sample's mean log-prob), ``training_ppl``, ``rollout_log_ppl``, ``rollout_ppl``, ``kl``
  (:math:`-y` per token), ``k3_kl`` (:math:`e^y - y - 1`, unclamped), ``log_ppl_diff``,
  ``log_ppl_abs_diff``, ``ppl_ratio``, ``chi2_token`` (the sample's mean of
  :math:`e^{2\,\mathrm{clamp}(y)}` minus 1), ``chi2_seq`` (:math:`e^{2\,\mathrm{clamp}(\sum y)} - 1`);
- weights: ``tis_weight_before_bound``, ``tis_weight_after_bound``, ``is_ratio_mean_after_tis_rs``
  (before normalisation), ``batch_norm_factor``, ``is_ratio_mean_final``, ``is_ratio_min_final``,
  ``is_ratio_max_final`` (the sample's mean, min and max weight; 0 for an empty sample).

slime computes in float32: every bound test compares the float32 weight
:math:`e^{\mathrm{clamp}(y_{32})}` (:func:`~variance_lab.frameworks.batch.exp_float32`) with the
bound rounded to float32, both ends kept (:data:`MIS_RULE`); a sequence-level :math:`y_{32}` is
the float64 sum rounded once, where slime sums in float32 (a ratio within float32 summation
rounding of a bound can fall on the other side). Values are float64.
"""

from __future__ import annotations

import numpy as np

from variance_lab.frameworks.batch import as_mask, as_values, exp64, exp_float32, masked_sum, torch_rule
from variance_lab.frameworks.slime import SLIME_MEAN, sample_mean, veto_mask

__all__ = ["MIS_LEVELS", "MIS_RULE", "TIS_MODES", "compute_mis_weights", "ppl_metrics"]

#: mis.py's bound tests (``truncate``, ``clip``, ``mask``, the batch mean against 1e-8): the
#: float32 weight against the bound rounded to float32, a weight at a bound kept.
MIS_RULE = torch_rule(np.float32)
#: ``tis_level`` and ``rs_level`` values (``compute_log_ratio``, ``mis.py:192-200``).
MIS_LEVELS = ("token", "sequence", "geometric")
#: ``tis_mode`` values (``mis.py:226-237``).
TIS_MODES = ("truncate", "clip", "mask")
#: ``SAFETY_BOUND`` (``mis.py:188``, ``435``): log-ratios clamped to +-20 before the exponential.
_SAFETY_BOUND = 20.0


def _row_mean(x, m):
    """``masked_mean(x, loss_mask, expand=True)`` of each sample (count clamped to 1), as (B, 1)."""
    return SLIME_MEAN.mean(x, m, axis=-1, keepdims=True)


def ppl_metrics(train, rollout, m) -> dict[str, np.ndarray]:
    r"""Return ``add_ppl_metrics``' per-token arrays (``mis.py:383-451``) for (B, T) float64 inputs.

    Sequence-level values are broadcast over the sample's tokens, as slime expands them.
    """
    mean_train, mean_rollout = _row_mean(train, m), _row_mean(rollout, m)
    y = train - rollout
    y_sum = masked_sum(y, m, -1, keepdims=True)
    out = {
        "training_log_ppl": -mean_train,
        "training_ppl": exp64(-mean_train),
        "rollout_log_ppl": -mean_rollout,
        "rollout_ppl": exp64(-mean_rollout),
        "kl": rollout - train,
        "k3_kl": exp64(y) - y - 1.0,
        "log_ppl_diff": mean_rollout - mean_train,
        "log_ppl_abs_diff": np.abs(mean_rollout - mean_train),
        "ppl_ratio": exp64(mean_rollout - mean_train),
        "chi2_token": _row_mean(np.exp(2.0 * np.clip(y, -_SAFETY_BOUND, _SAFETY_BOUND)), m) - 1.0,
        "chi2_seq": np.exp(2.0 * np.clip(y_sum, -_SAFETY_BOUND, _SAFETY_BOUND)) - 1.0,
    }
    return {k: np.broadcast_to(v, m.shape) for k, v in out.items()}


def _number(name: str, v, low: float, *, strict: bool) -> float:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and (v > low if strict else v >= low)
    if not ok:
        raise ValueError(f"bad {name} {v!r}: must be a number {'>' if strict else '>='} {low}")
    return float(v)


def _level(name: str, level: str) -> str:
    if level not in MIS_LEVELS:  # compute_log_ratio's ValueError
        raise ValueError(f"Invalid level: {level!r} ({name}; slime's are {MIS_LEVELS})")
    return level


def _log_ratio(y64, y32, m, level):
    """``compute_log_ratio`` then the +-20 clamp: (float64, float32) log-ratios of ``level``."""
    if level == "token":
        pair = (y64, y32)
    elif level == "sequence":
        s = masked_sum(y64, m, -1, keepdims=True)
        pair = (s, s.astype(np.float32))
    else:
        g = _row_mean(y64, m)
        pair = (g, g.astype(np.float32))
    return tuple(np.broadcast_to(np.clip(v, -_SAFETY_BOUND, _SAFETY_BOUND), m.shape) for v in pair)


def _band(w32, lo, hi, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``clip``/``mask``'s flags (weight < lo, weight > hi) after their assertion lo < hi."""
    if not lo < hi:
        raise ValueError(
            f"bad bounds for {name}: slime asserts lower_bound < upper_bound, got {lo!r}, {hi!r}"
        )
    return MIS_RULE.outside(w32, lo, None), MIS_RULE.outside(w32, None, hi)


def _micro_batches(micro_batch_indices, rows: int) -> list[np.ndarray]:
    if micro_batch_indices is None:
        return [np.arange(rows)]
    mbs = [np.asarray(ix, dtype=np.int64).reshape(-1) for ix in micro_batch_indices]
    flat = np.sort(np.concatenate(mbs)) if mbs else np.array([], dtype=np.int64)
    if flat.shape != (rows,) or np.any(flat != np.arange(rows)):
        raise ValueError(
            f"micro_batch_indices must hold each of the {rows} rows once, got {[ix.tolist() for ix in mbs]!r}"
        )
    return mbs


def _batch_normalize(weights, m, tis_level, mbs) -> tuple[np.ndarray, np.ndarray]:
    """``mis.py:272-297`` per micro-batch: the weights over their mean, and ``batch_norm_factor``."""
    if tis_level == "geometric":
        raise ValueError(
            "Unsupported tis_level: geometric (slime's tis_batch_normalize takes token or sequence)"
        )
    weights, factor = weights.copy(), np.ones(m.shape)
    for ix in mbs:
        w, mm = weights[ix], m[ix]
        if tis_level == "token":
            mean = masked_sum(w, mm) / max(mm.sum(), 1.0)
        else:
            mean = float(np.mean(_row_mean(w, mm))) if ix.size else 0.0
        if MIS_RULE.outside(mean, None, 1e-8):  # `if weights_mean > 1e-8`
            weights[ix] = w / mean
            factor[ix] = mean
    return weights, factor


def compute_mis_weights(
    train_log_probs,
    rollout_log_probs,
    loss_masks,
    *,
    use_tis: bool = True,
    use_rs: bool = True,
    tis_level: str = "token",
    rs_level: str = "token",
    tis_mode: str = "truncate",
    tis_lower_bound: float | None = 0.5,
    tis_upper_bound: float = 2.0,
    rs_lower_bound: float | None = None,
    rs_upper_bound: float | None = None,
    rs_veto_threshold: float | None = 1e-4,
    tis_batch_normalize: bool = True,
    micro_batch_indices=None,
    calculate_per_token_loss: bool = False,
    rollout_ids=None,
) -> tuple[np.ndarray | None, np.ndarray, dict[str, float]]:
    r"""Return mis.py's importance weights, its rejection mask and the ``mis_*`` metrics slime logs.

    Parameters
    ----------
    train_log_probs, rollout_log_probs : array_like, shape (B, T)
        :math:`\log\pi_{old}` (the trainer's) and :math:`\log\pi_{rollout}` per token.
    loss_masks : array_like, shape (B, T)
        0/1, bool or int.
    use_tis, use_rs : bool
    tis_level, rs_level : {"token", "sequence", "geometric"}
    tis_mode : {"truncate", "clip", "mask"}
    tis_lower_bound, tis_upper_bound, rs_lower_bound, rs_upper_bound, rs_veto_threshold : float or None
    tis_batch_normalize : bool
        mis.yaml's options, its values as defaults (the module docstring).
    micro_batch_indices : sequence of sequences of int, optional
        The rows of each micro-batch (slime normalises per call, one call per micro-batch); they
        must cover every row once. Default: one micro-batch. Matters only to batch normalisation.
    calculate_per_token_loss : bool
    rollout_ids : array_like of int, shape (B,), optional
        The logged mean's options (:func:`~variance_lab.frameworks.slime.sample_mean`).

    Returns
    -------
    (weights, modified_masks, metrics)
        The (B, T) weights (0 outside the loss mask; None without ``use_tis``), the loss mask with
        the rejections (``mask`` mode, RS, veto) applied, and the metrics named as slime logs them
        (``mis_training_ppl``, ``mis_tis_truncate_fraction``, ``mis_rs_catastrophic_seq_fraction``, ...).
    """
    m = as_mask(loss_masks, "loss_masks")
    train = as_values(train_log_probs, m, "train_log_probs")
    rollout = as_values(rollout_log_probs, m, "rollout_log_probs")
    kw = {"calculate_per_token_loss": calculate_per_token_loss, "rollout_ids": rollout_ids}
    token = ppl_metrics(train, rollout, m)
    if not use_tis:
        return None, m.copy(), {f"mis_{k}": sample_mean(v, m, **kw) for k, v in token.items()}
    if tis_mode not in TIS_MODES:
        raise ValueError(f"Unsupported tis_mode: {tis_mode!r} (slime's are {TIS_MODES})")
    hi = _number("tis_upper_bound", tis_upper_bound, 0.0, strict=True)
    lo = (
        1.0 / hi
        if tis_lower_bound is None
        else _number("tis_lower_bound", tis_lower_bound, 0.0, strict=False)
    )
    mbs = _micro_batches(micro_batch_indices, m.shape[0])
    y64 = train - rollout
    y32 = train.astype(np.float32) - rollout.astype(np.float32)
    t64, t32 = _log_ratio(y64, y32, m, _level("tis_level", tis_level))
    w, w32 = np.exp(t64), exp_float32(t32)
    token["tis_weight_before_bound"] = w
    keep = m.copy()
    if tis_mode == "truncate":
        high = MIS_RULE.outside(w32, None, hi)
        token["tis_truncate_fraction"] = high  # .int() flags: counted
        w = np.where(high, hi, w) * m
    else:
        low, high = _band(w32, lo, hi, "tis_mode " + tis_mode)
        token[f"tis_{tis_mode}_fraction_low"] = low
        token[f"tis_{tis_mode}_fraction_high"] = high
        if tis_mode == "clip":
            w = np.where(low, lo, np.where(high, hi, w)) * m
        else:
            keep = keep * ~(low | high)
            w = w * m
    token["tis_weight_after_bound"] = w
    veto = {}
    if use_rs:
        rs_lo = lo if rs_lower_bound is None else _number("rs_lower_bound", rs_lower_bound, 0.0, strict=False)
        rs_hi = hi if rs_upper_bound is None else _number("rs_upper_bound", rs_upper_bound, 0.0, strict=True)
        _, r32 = (
            (t64, t32) if rs_level == tis_level else _log_ratio(y64, y32, m, _level("rs_level", rs_level))
        )
        low, high = _band(exp_float32(r32), rs_lo, rs_hi, "rejection sampling")
        token["rs_mask_fraction_low"] = low
        token["rs_mask_fraction_high"] = high
        keep = keep * ~(low | high)
        if rs_veto_threshold is not None:
            vetoed, veto = veto_mask(train, rollout, m, rs_veto_threshold, **kw)
            keep = keep * vetoed
    token["is_ratio_mean_after_tis_rs"] = w
    if tis_batch_normalize:
        w, token["batch_norm_factor"] = _batch_normalize(w, m, tis_level, mbs)
    inside = m > 0
    token["is_ratio_mean_final"] = _row_mean(w, m)
    token["is_ratio_min_final"] = np.where(inside.any(-1), np.where(inside, w, np.inf).min(-1), 0.0)[:, None]
    token["is_ratio_max_final"] = np.where(inside.any(-1), np.where(inside, w, -np.inf).max(-1), 0.0)[:, None]
    metrics = {f"mis_{k}": sample_mean(v, m, **kw) for k, v in token.items()}
    metrics.update(veto)
    return w, keep, metrics
