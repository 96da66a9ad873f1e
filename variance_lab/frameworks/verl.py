r"""verl's rollout correction, in NumPy: weights, rejection masks and every metric it logs.

A mirror of ``verl/trainer/ppo/rollout_corr_helper.py`` (and ``masked_mean``/``masked_sum`` of
``verl/utils/torch_functional.py``) of verl 0.9.1, the PyPI release (file sha256 ``763158342551...``;
the volcengine/verl snapshot at ``b178a3c``, 2026-01-29, predates it and differs), with verl's
function and argument names, so that a run's ``rollout_corr/...`` logs can be recomputed from its
``old_log_probs``, ``rollout_log_probs`` and ``response_mask``. Checked against verl itself:
``tools/framework_fixtures.py`` runs verl's functions and ``tests/frameworks/test_verl.py``
compares to :math:`10^{-9}` relative.

verl's conventions, all kept:

- the log-ratio is :math:`y = \log\pi_{old} - \log\pi_{rollout}` (training over rollout);
  token weights and every k-statistic use :math:`\operatorname{clip}(y, -20, 20)`
  (``SAFETY_BOUND``); the sequence weight clamps the *sum* of unclamped :math:`y` to
  :math:`\pm 20`, so :math:`P_T \le e^{20} \approx 4.85\cdot10^8`;
- ``rollout_is_threshold``: a number :math:`C` truncates (TIS, :math:`\min(w, C)`), a string
  ``"LO_HI"`` masks weights outside :math:`[LO, HI]` (IcePop); the token weights are the
  toolkit's ``tis:C`` and ``icepop:LO:HI``, the sequence ones ``seq-tis:C`` and
  ``seq-mask:LO:HI`` (:mod:`variance_lab.corrections`);
- ``rollout_rs`` options bound a statistic of each token (``token_k*``), of the sum over a
  sequence (``seq_sum_k*``), its mean (``seq_mean_k*``) or its maximum (``seq_max_k2``,
  ``seq_max_k3``), with :math:`k_1 = -y`, :math:`k_2 = y^2/2`, :math:`k_3 = e^y - 1 - y`.
  **The k1 options compare** :math:`-y = \log(\pi_{rollout}/\pi_{old})` **with**
  :math:`[\log LO, \log HI]`: they keep :math:`r = e^y \in [1/HI, 1/LO]`, so asymmetric bounds
  act inverted (``"0.5_2"`` is symmetric and safe; ``"0.9_1.5"`` keeps
  :math:`r \in [0.667, 1.111]`, not :math:`[0.9, 1.5]`; verl PR #6377, closed unmerged).
  ``token_k1`` is the toolkit's ``icepop:1/HI:1/LO``, ``seq_sum_k1`` is ``seq-mask:1/HI:1/LO``
  and ``seq_mean_k1`` is ``geo-rs:1/HI:1/LO`` (on :math:`G_T` with verl's mean, whose
  denominator is the length plus :math:`10^{-8}`). A single k1 number :math:`U` means
  ``"1/U_U"``. Comma-separated options must all pass;
- means are ``masked_mean``: :math:`\sum m v / (\sum m + 10^{-8})`;
  ``rollout_is_eff_sample_size`` is Kong's ESS fraction **over tokens** (sequence weights are
  repeated on each of their tokens), of the weights clamped to :math:`[0, C]`;
- ``chi2_token`` :math:`= \overline{\rho^2} - 1` over tokens (:math:`\rho` clamped),
  ``chi2_seq`` :math:`= \operatorname{mean}_i e^{2\operatorname{clip}(\sum_t y_{it}, \pm 20)} - 1`
  over every row of the batch; ``kl`` :math:`= -\bar y`, ``k3_kl`` :math:`= \overline{e^y - 1 - y}`
  (unclamped);
- the bound rules: the weights and the k1 masks keep a value at a bound, in log space (the
  corrections' rule, :data:`variance_lab.corrections.BOUND_RULE`); flags, fractions and the
  k2/k3 rejections keep a value equal to the threshold, on the statistic's own scale
  (:data:`THRESHOLD_RULE`); a band with LO = HI keeps only a weight equal to it, in linear
  space (:data:`LINEAR_RULE`);
- the fractions verl takes as ``flags.float().mean()`` (the sequence-level ``fraction_high``
  and ``_low``, ``seq_fraction_*``, ``rollout_rs_seq_masked_fraction``) are float32 values
  (1/6 logs as 0.1666666716), the others float64; the mirror rounds the same ones.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab._validate import parse_float
from variance_lab.corrections import apply_sequence, apply_tokens, parse
from variance_lab.frameworks.batch import MeanRule, as_mask, as_values, masked_sum
from variance_lab.ratios import CLOSED, BoundRule

__all__ = [
    "LINEAR_RULE",
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "THRESHOLD_RULE",
    "VERL_MEAN",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
]

#: verl's clamp of log-ratios before exponentiating: :math:`e^{\pm 20}`.
SAFETY_BOUND = 20.0

#: verl's flags and metrics (``fraction_high``/``_low``, ``oob_ratio``, the k2/k3 rejections): a value
#: exactly at a threshold is within it, compared on the statistic's own scale (the weight, the
#: k-statistic, or the log-ratio against the threshold's log).
THRESHOLD_RULE = BoundRule(CLOSED, "value", "float64")
#: A band with LO = HI keeps only a weight equal to it, compared in linear space.
LINEAR_RULE = BoundRule(CLOSED, "linear", "float64")
#: verl's ``masked_mean``: the count plus :math:`10^{-8}`, every token of the batch pooled.
VERL_MEAN = MeanRule("eps", 1e-8, "tokens")


def _above(x, c: float) -> np.ndarray:
    """Where ``x > c`` under :data:`THRESHOLD_RULE`."""
    return THRESHOLD_RULE.outside(x, None, c)


def _below(x, c: float) -> np.ndarray:
    """Where ``x < c`` under :data:`THRESHOLD_RULE`."""
    return THRESHOLD_RULE.outside(x, c, None)


#: verl's rejection options (``rollout_rs``), comma-separable.
SUPPORTED_ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


# --------------------------------------------------------------------------------------
# thresholds
# --------------------------------------------------------------------------------------
def parse_is_threshold(threshold) -> tuple[float, float | None]:
    """Return (upper, lower or None) from ``rollout_is_threshold``: a number, or ``"LO_HI"`` (IcePop)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | str):
        raise ValueError(f"bad rollout_is_threshold {threshold!r}: expected a number or a 'LO_HI' string")
    if isinstance(threshold, str):
        spec = threshold.strip()
        if "_" in spec:
            lo_text, hi_text = spec.split("_", 1)
            upper = parse_float(hi_text, "rollout_is_threshold")
            lower = parse_float(lo_text, "rollout_is_threshold")
        else:
            upper, lower = parse_float(spec, "rollout_is_threshold"), None
    else:
        upper, lower = parse_float(str(float(threshold)), "rollout_is_threshold"), None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"bad rollout_is_threshold {threshold!r}: needs 0 < LO <= HI")
    return upper, lower


def parse_rs_options(rollout_rs) -> list[str]:
    """Return the distinct options of a ``rollout_rs`` in order; ``ValueError`` if unknown."""
    if not isinstance(rollout_rs, str) or not [o for o in rollout_rs.split(",") if o.strip()]:
        raise ValueError(f"bad rollout_rs {rollout_rs!r}: expected options such as 'token_k1,seq_mean_k3'")
    out = []
    for opt in (o.strip() for o in rollout_rs.split(",") if o.strip()):
        if opt not in SUPPORTED_ROLLOUT_RS_OPTIONS:
            raise ValueError(
                f"unknown rollout_rs option {opt!r}; options are {', '.join(SUPPORTED_ROLLOUT_RS_OPTIONS)}"
            )
        if opt not in out:
            out.append(opt)
    return out


def parse_rs_thresholds(options: list[str], threshold) -> dict[str, tuple[float | None, float]]:
    """Return option -> (lower or None, upper) from ``rollout_rs_threshold``: one entry, or one per option.

    A k1 option takes ``"LO_HI"`` or one number :math:`U` (meaning :math:`1/U` to :math:`U`);
    the others one upper bound.
    """
    if threshold is None:
        raise ValueError("rollout_rs_threshold must be given when rollout_rs is set")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | str):
        raise ValueError(f"bad rollout_rs_threshold {threshold!r}: expected a number or a string")
    specs = (
        [str(threshold)]
        if not isinstance(threshold, str)
        else [p.strip() for p in threshold.split(",") if p.strip()]
    )
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"bad rollout_rs_threshold {threshold!r}: "
            f"give one threshold or {len(options)} (one per rollout_rs option)"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    out = {}
    for opt, spec in zip(options, specs, strict=True):
        if opt.endswith("k1"):
            lo_text, hi_text = spec.split("_", 1) if "_" in spec else (None, spec)
            upper = parse_float(hi_text, f"{opt} threshold")
            lower = parse_float(lo_text, f"{opt} threshold") if lo_text is not None else None
            if upper <= 0 or (lower is not None and not 0 < lower <= upper):
                raise ValueError(f"bad {opt} threshold {spec!r}: needs 0 < LO <= HI")
            out[opt] = (1.0 / upper if lower is None else lower, upper)
        else:
            if "_" in spec:
                raise ValueError(f"bad {opt} threshold {spec!r}: takes one upper bound, without '_'")
            upper = parse_float(spec, f"{opt} threshold")
            if upper <= 0:
                raise ValueError(f"bad {opt} threshold {spec!r}: must be > 0")
            out[opt] = (None, upper)
    return out


# --------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------
def _band(kind: str, lo: float, hi: float):
    """Return the toolkit's correction that keeps a weight in [lo, hi] (``icepop`` or ``seq-mask``)."""
    return parse(f"{kind}:{lo!r}:{hi!r}") if lo < hi else None


def _token_weights(y: np.ndarray, mask: np.ndarray, upper: float, lower: float | None) -> np.ndarray:
    """TIS (``tis:C``) or IcePop (``icepop:LO:HI``) of the clamped token log-ratios, 0 on padding."""
    ys = np.clip(y, -SAFETY_BOUND, SAFETY_BOUND)
    if lower is None:
        w, _ = apply_tokens(parse(f"tis:{upper!r}"), ys)
    elif (c := _band("icepop", lower, upper)) is not None:
        w, _ = apply_tokens(c, ys)
    else:  # LO == HI: only a weight exactly equal to it is kept
        w = np.where(LINEAR_RULE.outside(ys, upper, upper), 0.0, upper)
    return w * mask


def _sequence_weights(log_p: np.ndarray, upper: float, lower: float | None) -> np.ndarray:
    """``seq-tis:C`` or ``seq-mask:LO:HI`` of the clamped sequence log-ratio sums."""
    x = np.clip(log_p, -SAFETY_BOUND, SAFETY_BOUND)
    if lower is None:
        w, _ = apply_sequence(parse(f"seq-tis:{upper!r}"), x, 1)
    elif (c := _band("seq-mask", lower, upper)) is not None:
        w, _ = apply_sequence(c, x, 1)
    else:
        w = np.where(LINEAR_RULE.outside(x, upper, upper), 0.0, upper)
    return w


def compute_rollout_correction_weights(
    log_ratio,
    response_mask,
    rollout_is: str = "token",
    rollout_is_threshold=2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute verl's importance weights and their ``rollout_is_*`` metrics (without the prefix).

    Parameters
    ----------
    log_ratio : array_like, shape (B, T)
        :math:`\log\pi_{old} - \log\pi_{rollout}` per token.
    response_mask : array_like, shape (B, T)
        1 for a response token, 0 for padding.
    rollout_is : {"token", "sequence"}
        Token ratios :math:`e^{y_t}`, or the product :math:`P_T = e^{\sum_t y_t}` on every token.
    rollout_is_threshold : float or str
        :math:`C` (truncate at :math:`C`) or ``"LO_HI"`` (zero the weights outside).
    rollout_is_batch_normalize : bool
        Divide by the weights' mean (over tokens; over sequences for ``"sequence"``).

    Returns
    -------
    (weights, metrics)
        Weights of shape (B, T), 0 on padding; metrics named as verl logs them, without
        ``rollout_corr/``.
    """
    mask = as_mask(response_mask)
    y = as_values(log_ratio, mask, "log_ratio")
    _check_any(mask)
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"bad rollout_is {rollout_is!r}: expected 'token' or 'sequence'")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        raw = np.exp(np.clip(y, -SAFETY_BOUND, SAFETY_BOUND)) * mask
        weights = _token_weights(y, mask, upper, lower)
        log_for_metrics = y
    else:
        log_p = masked_sum(y, mask, axis=-1)
        raw = np.exp(np.clip(log_p, -SAFETY_BOUND, SAFETY_BOUND))[:, None] * mask
        weights = _sequence_weights(log_p, upper, lower)[:, None] * mask
        log_for_metrics = log_p
    metrics = _is_metrics(weights, raw, log_for_metrics, mask, rollout_is, upper, lower, rollout_is_threshold)
    if lower is not None:
        oob = THRESHOLD_RULE.outside(raw, lower, upper)
        metrics["rollout_is_oob_ratio"] = float(VERL_MEAN.mean(oob.astype(float), mask))
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = float(VERL_MEAN.mean(weights, mask))
        else:
            seq_w = VERL_MEAN.mean(weights, mask, axis=-1)
            seq_mask = (mask.sum(axis=-1) > 0).astype(float)
            mean = float((seq_w * seq_mask).sum() / max(seq_mask.sum(), 1e-8))
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(weights, raw, log_for_metrics, mask, rollout_is, upper, lower, threshold) -> dict[str, float]:
    """Compute the metrics of verl's ``compute_is_metrics``."""
    m: dict[str, float] = {}
    lower_eff = 1.0 / upper if lower is None else lower
    inside = mask > 0
    if rollout_is == "sequence":
        m["rollout_is_max"] = math.exp(min(float(log_for_metrics.max()), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(float(log_for_metrics.min()))
        m["rollout_is_mean"] = float(VERL_MEAN.mean(weights, mask))
        m["rollout_is_ratio_fraction_high"] = _fraction32(_above(log_for_metrics, math.log(upper)))
        m["rollout_is_ratio_fraction_low"] = _fraction32(_below(log_for_metrics, math.log(lower_eff)))
    else:
        m["rollout_is_mean"] = float(VERL_MEAN.mean(weights, mask))
        m["rollout_is_ratio_fraction_high"] = float(VERL_MEAN.mean(_above(raw, upper).astype(float), mask))
        m["rollout_is_ratio_fraction_low"] = float(VERL_MEAN.mean(_below(raw, lower_eff).astype(float), mask))
        m["rollout_is_max"] = float(weights[inside].max())
        m["rollout_is_min"] = float(weights[inside].min())
    clamped = np.clip(weights, 0.0, upper)
    if mask.sum() > 1:
        mean = VERL_MEAN.mean(clamped, mask)
        var = VERL_MEAN.mean(clamped**2, mask) - mean * mean
        m["rollout_is_std"] = float(np.sqrt(max(float(var), 0.0)))
    else:
        m["rollout_is_std"] = 0.0
    normalized = clamped / (VERL_MEAN.mean(clamped, mask) + 1e-8)
    second = float(VERL_MEAN.mean(normalized**2, mask))
    if second == 0.0:
        raise ValueError(
            f"every importance weight is 0 with rollout_is_threshold {threshold!r}: verl 0.9.1 divides by "
            "zero there (rollout_is_eff_sample_size) and stops"
        )
    m["rollout_is_eff_sample_size"] = 1.0 / second
    seq_mean = VERL_MEAN.mean(weights, mask, axis=-1)
    m["rollout_is_seq_mean"] = float(seq_mean.mean())
    m["rollout_is_seq_std"] = float(seq_mean.std(ddof=1)) if seq_mean.size > 1 else 0.0
    m["rollout_is_seq_max"] = float(seq_mean.max())
    m["rollout_is_seq_min"] = float(seq_mean.min())
    m["rollout_is_seq_max_deviation"] = float(np.abs(seq_mean - 1.0).max())
    raw_seq_mean = VERL_MEAN.mean(raw, mask, axis=-1)
    m["rollout_is_seq_fraction_high"] = _fraction32(_above(raw_seq_mean, upper))
    m["rollout_is_seq_fraction_low"] = _fraction32(_below(raw_seq_mean, lower_eff))
    return m


# --------------------------------------------------------------------------------------
# rejection
# --------------------------------------------------------------------------------------
def _k1_keep(option: str, ys: np.ndarray, mask: np.ndarray, lower: float, upper: float) -> np.ndarray:
    r"""Return where a k1 option keeps: :math:`-y \in [\log LO, \log HI]`, or r in :math:`[1/HI, 1/LO]`."""
    lo, hi = 1.0 / upper, 1.0 / lower
    if option == "token_k1":
        c = _band("icepop", lo, hi)
        return (
            ~apply_tokens(c, ys)[1]
            if c is not None
            else ~THRESHOLD_RULE.outside(-ys, *(2 * [math.log(lower)]))
        )
    log_p = masked_sum(ys, mask, axis=-1)
    if option == "seq_sum_k1":
        c = _band("seq-mask", lo, hi)
        keep = (
            ~apply_sequence(c, log_p, 1)[1]
            if c is not None
            else ~THRESHOLD_RULE.outside(-log_p, *(2 * [math.log(lower)]))
        )
    else:  # seq_mean_k1: Geo-RS on verl's mean, whose denominator is the length + 1e-8
        length = mask.sum(axis=-1) + 1e-8
        keep = (
            ~apply_sequence(parse(f"geo-rs:{lo!r}:{hi!r}"), log_p, length)[1]
            if lo < hi
            else ~THRESHOLD_RULE.outside(-log_p / length, *(2 * [math.log(lower)]))
        )
    return np.broadcast_to(keep[:, None], mask.shape)


def compute_rollout_rejection_mask(
    log_ratio, response_mask, rollout_rs: str = "token_k1", rollout_rs_threshold=None
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute verl's rejection mask and its ``rollout_rs_*`` metrics (without the prefix).

    Parameters
    ----------
    log_ratio, response_mask : array_like, shape (B, T)
    rollout_rs : str
        Options of :data:`SUPPORTED_ROLLOUT_RS_OPTIONS`, comma-separated: a token or sequence is
        kept when every option keeps it.
    rollout_rs_threshold : float or str
        One threshold for every option, or one per option (comma-separated); ``"LO_HI"`` for k1.

    Returns
    -------
    (modified_response_mask, metrics)
    """
    mask = as_mask(response_mask)
    y = as_values(log_ratio, mask, "log_ratio")
    _check_any(mask)
    options = parse_rs_options(rollout_rs)
    thresholds = parse_rs_thresholds(options, rollout_rs_threshold)
    ys = np.clip(y, -SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -ys, "k2": 0.5 * ys**2, "k3": np.exp(ys) - 1.0 - ys}
    inside = mask > 0
    seq_valid = mask.sum(axis=-1) > 0
    combined = np.ones_like(mask)
    metrics: dict[str, float] = {}
    for opt in options:
        lower, upper = thresholds[opt]
        k = opt[-2:]
        is_k1 = k == "k1"
        per_seq = None
        if opt.startswith("token"):
            per_token = stats[k]
            keep = _k1_keep(opt, ys, mask, lower, upper) if is_k1 else ~_above(per_token, upper)
        else:
            if opt.startswith("seq_sum"):
                per_seq = masked_sum(stats[k], mask, axis=-1)
            elif opt.startswith("seq_mean"):
                per_seq = VERL_MEAN.mean(stats[k], mask, axis=-1)
            else:
                vals = np.where(inside, stats[k], -np.inf).max(axis=-1)
                per_seq = np.where(vals == -np.inf, 0.0, vals)
            keep = (
                _k1_keep(opt, ys, mask, lower, upper)
                if is_k1
                else np.broadcast_to(~_above(per_seq, upper)[:, None], mask.shape)
            )
            per_token = np.broadcast_to(per_seq[:, None], mask.shape)
        hi_stat = math.log(upper) if is_k1 else upper
        lo_stat = math.log(lower) if is_k1 else 0.0
        metrics.update(_rs_metrics(opt, per_token, mask, seq_valid, per_seq, hi_stat, lo_stat, is_k1))
        keep_f = keep.astype(float)
        combined = combined * keep_f
        seq_keep = (~(~keep & inside)).all(axis=-1)
        metrics[f"rollout_rs_{opt}_masked_fraction"] = float(VERL_MEAN.mean(1.0 - keep_f, mask))
        n_valid = float(seq_valid.sum())
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = (
            float(((1.0 - seq_keep) * seq_valid).sum() / n_valid) if n_valid > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(VERL_MEAN.mean(1.0 - combined, mask))
    final_keep = (combined > 0.5) & inside
    metrics["rollout_rs_seq_masked_fraction"] = _fraction32((~final_keep & inside).any(axis=-1))
    return mask * combined, metrics


def _rs_metrics(opt, stat, mask, seq_valid, per_seq, upper, lower, apply_lower) -> dict[str, float]:
    """Compute verl's ``compute_rs_metrics`` for one option (thresholds on the statistic's scale)."""
    m: dict[str, float] = {}
    p = f"rollout_rs_{opt}"
    inside = mask > 0
    seq_values = per_seq if per_seq is not None else VERL_MEAN.mean(stat, mask, axis=-1)
    valid = seq_values[seq_valid]
    m[f"{p}_mean"] = float(VERL_MEAN.mean(stat, mask))
    sequence_level = not opt.startswith("token")
    if sequence_level and valid.size:
        m[f"{p}_max"], m[f"{p}_min"] = float(valid.max()), float(valid.min())
        m[f"{p}_fraction_high"] = _fraction32(_above(valid, upper))
        m[f"{p}_fraction_low"] = _fraction32(_below(valid, lower)) if apply_lower else 0.0
    else:
        m[f"{p}_max"], m[f"{p}_min"] = float(stat[inside].max()), float(stat[inside].min())
        m[f"{p}_fraction_high"] = float(VERL_MEAN.mean(_above(stat, upper).astype(float), mask))
        m[f"{p}_fraction_low"] = (
            float(VERL_MEAN.mean(_below(stat, lower).astype(float), mask)) if apply_lower else 0.0
        )
    if mask.sum() > 1:
        s = np.clip(stat, lower if apply_lower else 0.0, upper)
        mean = VERL_MEAN.mean(s, mask)
        m[f"{p}_std"] = float(np.sqrt(max(float(VERL_MEAN.mean(s * s, mask) - mean * mean), 0.0)))
    else:
        m[f"{p}_std"] = 0.0
    if valid.size:
        m[f"{p}_seq_mean"] = float(valid.mean())
        m[f"{p}_seq_std"] = float(valid.std(ddof=1)) if valid.size > 1 else 0.0
        m[f"{p}_seq_max"] = float(valid.max())
        m[f"{p}_seq_min"] = float(valid.min())
        m[f"{p}_seq_max_deviation"] = float(np.abs(valid).max())
        m[f"{p}_seq_fraction_high"] = _fraction32(_above(valid, upper))
        if apply_lower:
            m[f"{p}_seq_fraction_low"] = _fraction32(_below(valid, lower))
    return m


# --------------------------------------------------------------------------------------
# off-policy metrics and the pipeline
# --------------------------------------------------------------------------------------
def compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask) -> dict[str, float]:
    r"""Compute verl's off-policy diagnostics (without the ``rollout_corr/`` prefix).

    ``training_ppl`` and ``rollout_ppl``: the batch mean of each sequence's
    :math:`e^{-\overline{\log\pi}}`; ``*_log_ppl`` the mean of :math:`-\overline{\log\pi}`;
    ``log_ppl_diff`` (and ``_abs_diff``, ``_max``, ``_min``): per sequence
    :math:`\overline{\log\pi_{rollout}} - \overline{\log\pi_{old}} = -\log G_T`, its mean
    etc.; ``ppl_ratio`` the mean of :math:`e^{\text{log\_ppl\_diff}} = 1/G_T`; ``kl``,
    ``k3_kl``, ``chi2_token``, ``chi2_seq`` as in the module's notes. Means over sequences run
    over every row of the batch (a row without tokens counts as 0 and ``e^0 = 1``).
    ``rollout_log_prob=None`` gives the two training-perplexity metrics only.
    """
    mask = as_mask(response_mask)
    old = as_values(old_log_prob, mask, "old_log_prob")
    _check_any(mask)
    m: dict[str, float] = {}
    mean_old = VERL_MEAN.mean(old, mask, axis=-1)
    m["training_ppl"] = float(np.exp(-mean_old).mean())
    m["training_log_ppl"] = float((-mean_old).mean())
    if rollout_log_prob is None:
        return m
    rollout = as_values(rollout_log_prob, mask, "rollout_log_prob")
    y = old - rollout
    m["kl"] = float(VERL_MEAN.mean(rollout - old, mask))
    m["k3_kl"] = float(VERL_MEAN.mean(np.exp(y) - y - 1.0, mask))
    mean_rollout = VERL_MEAN.mean(rollout, mask, axis=-1)
    m["rollout_ppl"] = float(np.exp(-mean_rollout).mean())
    m["rollout_log_ppl"] = float((-mean_rollout).mean())
    diff = mean_rollout - mean_old
    m["log_ppl_diff"] = float(diff.mean())
    m["log_ppl_abs_diff"] = float(np.abs(diff).mean())
    m["log_ppl_diff_max"] = float(diff.max())
    m["log_ppl_diff_min"] = float(diff.min())
    m["ppl_ratio"] = float(np.exp(diff).mean())
    rho = np.exp(np.clip(y, -SAFETY_BOUND, SAFETY_BOUND))
    m["chi2_token"] = float(VERL_MEAN.mean(rho * rho, mask) - 1.0)
    log_p = np.clip(masked_sum(y, mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = float(np.exp(2.0 * log_p).mean() - 1.0)
    return m


def compute_rollout_correction_and_rejection_mask(
    old_log_prob,
    rollout_log_prob,
    response_mask,
    rollout_is: str | None = None,
    rollout_is_threshold=2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold=None,
) -> tuple[np.ndarray | None, np.ndarray, dict[str, float]]:
    r"""Compute verl's rollout correction of a batch: weights, rejection mask, every ``rollout_corr/`` metric.

    Parameters
    ----------
    old_log_prob, rollout_log_prob : array_like, shape (B, T)
        The training policy's and the rollout engine's token log-probabilities.
    response_mask : array_like, shape (B, T)
        1 for a response token, 0 for padding; at least one 1.
    rollout_is : {None, "token", "sequence"}
        None: no weights. See :func:`compute_rollout_correction_weights`.
    rollout_is_threshold : float or str, default 2.0
    rollout_is_batch_normalize : bool
    rollout_rs : str, optional
        Rejection options (:func:`compute_rollout_rejection_mask`); None: no rejection.
    rollout_rs_threshold : float or str, optional
        Required with ``rollout_rs``.

    Returns
    -------
    (weights or None, modified_response_mask, metrics)
        ``weights`` where verl returns a DataProto holding ``rollout_is_weights``; the mask as
        float64 0/1; metrics keyed ``rollout_corr/<name>`` as verl logs them.
    """
    mask = as_mask(response_mask)
    old = as_values(old_log_prob, mask, "old_log_prob")
    rollout = as_values(rollout_log_prob, mask, "rollout_log_prob")
    _check_any(mask)
    y = old - rollout
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            y, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    modified = mask.copy()
    if rollout_rs is not None:
        modified, rs_metrics = compute_rollout_rejection_mask(y, mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old, rollout, mask))
    return weights, modified, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def _fraction32(flags: np.ndarray) -> float:
    """Return a fraction as verl computes it with ``flags.float().mean()``: in float32 (about 7 digits)."""
    return float(np.float32(np.count_nonzero(flags)) / np.float32(flags.size))


def _check_any(mask: np.ndarray) -> None:
    if not mask.any():
        raise ValueError("response_mask must hold at least one valid token (a 1)")
