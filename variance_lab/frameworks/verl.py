r"""verl's rollout correction, in NumPy: weights, rejection masks and every metric it logs.

A mirror of ``verl/trainer/ppo/rollout_corr_helper.py`` (and ``masked_mean``/``masked_sum`` of
``verl/utils/torch_functional.py``) of verl 0.9.1, the PyPI release (file sha256 ``763158342551...``;
the volcengine/verl snapshot at ``b178a3c``, 2026-01-29, predates it and differs), with verl's
function and argument names, so that a run's ``rollout_corr/...`` logs can be recomputed from its
``old_log_probs``, ``rollout_log_probs`` and ``response_mask``; line numbers below are of that
file. It computes in the dtypes verl does (next section). Checked against verl itself:
``tools/framework_fixtures.py`` runs verl's functions and ``tests/frameworks/test_verl.py``
compares, to :math:`10^{-9}` relative on float64 log-probs, within verl's own float32 rounding
on float32 ones, masks and fractions exactly.

verl's conventions, all kept:

- the log-ratio is :math:`y = \log\pi_{old} - \log\pi_{rollout}` (training over rollout);
  token weights and every k-statistic use :math:`\operatorname{clip}(y, -20, 20)`
  (``SAFETY_BOUND``); the sequence weight clamps the *sum* of unclamped :math:`y` to
  :math:`\pm 20`, so :math:`P_T \le e^{20} \approx 4.85\cdot10^8`;
- ``rollout_is_threshold``: a number :math:`C` truncates (TIS, :math:`\min(w, C)`), a string
  ``"LO_HI"`` masks weights outside :math:`[LO, HI]` (IcePop): in the toolkit's terms the token
  weights are ``tis:C`` and ``icepop:LO:HI``, the sequence ones ``seq-tis:C`` and
  ``seq-mask:LO:HI`` (:mod:`variance_lab.corrections`), but verl compares the *weight*
  :math:`e^y` with the bounds in the tensors' dtype, where the corrections compare :math:`y`
  with :math:`\log C` in float64, so the mirror computes them as verl does;
- ``rollout_rs`` options bound a statistic of each token (``token_k*``), of the sum over a
  sequence (``seq_sum_k*``), its mean (``seq_mean_k*``) or its maximum (``seq_max_k2``,
  ``seq_max_k3``), with :math:`k_1 = -y`, :math:`k_2 = y^2/2`, :math:`k_3 = e^y - 1 - y`.
  **The k1 options compare** :math:`-y = \log(\pi_{rollout}/\pi_{old})` **with**
  :math:`[\log LO, \log HI]`: they keep :math:`r = e^y \in [1/HI, 1/LO]`, so asymmetric bounds
  act inverted (``"0.5_2"`` is symmetric and safe; ``"0.9_1.5"`` keeps
  :math:`r \in [0.667, 1.111]`, not :math:`[0.9, 1.5]`; verl PR #6377, closed unmerged).
  ``token_k1`` is the toolkit's ``icepop:1/HI:1/LO``, ``seq_sum_k1`` is ``seq-mask:1/HI:1/LO``
  and ``seq_mean_k1`` is ``geo-rs:1/HI:1/LO`` (on :math:`G_T` with verl's mean). A single k1
  number :math:`U` means ``"1/U_U"``. Comma-separated options must all pass;
- means are ``masked_mean``: :math:`\sum m v / (\sum m + 10^{-8})` (:data:`VERL_MEAN`);
  ``rollout_is_eff_sample_size`` is Kong's ESS fraction **over tokens** (sequence weights are
  repeated on each of their tokens), of the weights clamped to :math:`[0, C]`;
- ``chi2_token`` :math:`= \overline{\rho^2} - 1` over tokens (:math:`\rho` clamped),
  ``chi2_seq`` :math:`= \operatorname{mean}_i e^{2\operatorname{clip}(\sum_t y_{it}, \pm 20)} - 1`
  over every row of the batch; ``kl`` :math:`= -\bar y`, ``k3_kl`` :math:`= \overline{e^y - 1 - y}`
  (unclamped);
- every bound test keeps a value equal to the bound and compares on the statistic's own scale
  (the weight, the k-statistic, :math:`\sum_t y_t` against :math:`\log C`) in the tensor's dtype
  (:data:`THRESHOLD_RULE`, :data:`F32_THRESHOLD_RULE`).

verl's dtypes, all kept (real batches carry float32 log-probs and an int64 ``response_mask``,
which ``compute_response_mask``, ``verl/trainer/ppo/ray_trainer.py:120-135``, slices from the
``attention_mask``; a bool mask behaves the same):

- everything is computed in the log-probs' dtype: float32 log-probs stay float32 (weights,
  k-statistics, sums, means), and an exponential overflows to ``inf`` above 88.72 (``k3_kl``,
  which verl does not clamp; the sequence-level ``rollout_is_min``; the perplexities), where
  float64 would stay finite up to 709.78. Anything but float32 is computed in float64;
- ``masked_mean`` divides by ``mask.sum() + 1e-8``, which for an int64, bool or float32 mask is
  a float32 and equals the count (:func:`~variance_lab.frameworks.batch.torch_dtypes`): with
  those masks a mean of equal values is exact and ``rollout_is_std`` of equal weights is 0,
  where a float64 mask gives :math:`w\cdot10^{-4}/\sqrt n`;
- the sequence-level ``rollout_is_ratio_fraction_high``/``_low`` compare :math:`\sum_t y_t`
  with ``torch.log(torch.tensor(C))``, a float32 :math:`\log C` (:func:`_log32`), for float64
  log-probs too; the k1 options take ``math.log`` (float64), then round it to the tensor's dtype;
- the fractions verl takes as ``flags.float().mean()`` (the sequence-level ``fraction_high``
  and ``_low``, ``seq_fraction_*``, ``rollout_rs_seq_masked_fraction``) are float32 values
  (1/6 logs as 0.1666666716); those it takes as ``masked_mean(flags.float(), mask)`` are float32
  unless the mask is float64; ``rollout_rs_*_seq_masked_fraction`` is in the log-probs' dtype;
- the weights come back in verl's dtype, the modified mask in the caller's.

Where the mirror can still differ from verl: a float32 sum or mean by the rounding of its order
of summation (torch's and NumPy's differ); a float32 weight by one ulp where torch's exp is not
correctly rounded (:func:`~variance_lab.frameworks.batch.exp_like`), so a weight within one ulp
of a threshold can be counted on the other side; a sequence whose log-ratio sum lies within one
float32 ulp of :math:`\log C` for the thresholds whose float32 log torch does not round
correctly (:func:`_log32`). verl itself moves by as much between a CPU and a GPU, or when its rows
are permuted; ``test_verl.py`` measures it.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab._validate import parse_float
from variance_lab.frameworks.batch import MeanRule, as_values, exp_like, torch_dtypes, torch_mask, torch_rule

__all__ = [
    "F32_THRESHOLD_RULE",
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

#: verl's every bound test on float64 tensors: the weights against :math:`C` or ``[LO, HI]``, the
#: k-statistics against their thresholds (:math:`-y` against :math:`[\log LO, \log HI]`), the
#: sequence log-ratio sums against :math:`\log C`. torch compares a tensor with a Python number
#: in the tensor's dtype, and every test keeps a value equal to the threshold
#: (``rollout_corr_helper.py:316-372, 599-600, 618-619, 715-716, 726-727``).
THRESHOLD_RULE = torch_rule(np.float64)
#: The same on float32 tensors (float32 log-probs): the threshold is rounded to float32 first.
F32_THRESHOLD_RULE = torch_rule(np.float32)
#: verl's ``masked_mean`` (``verl/utils/torch_functional.py:294-308``): the count plus
#: :math:`10^{-8}`, every token of the batch pooled, in torch's dtypes (for an int64 or bool mask
#: the count plus :math:`10^{-8}` is float32 and equals the count).
VERL_MEAN = MeanRule("eps", 1e-8, "tokens", dtypes="torch")


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
# dtypes, as torch holds them
# --------------------------------------------------------------------------------------
def _out_dtype(response_mask) -> np.dtype:
    """Return the dtype verl returns the modified mask in: the caller's (``.to(response_mask.dtype)``)."""
    d = np.asarray(response_mask).dtype
    return d if d.kind in "biu" or d in (np.float32, np.float64) else np.dtype(np.float64)


def _values(x, mask: np.ndarray, name: str) -> np.ndarray:
    """Check log-probs or log-ratios; float32 stays float32 (verl computes in it), else float64."""
    return as_values(x, mask, name, keep_float32=True)


def _times_mask(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values * response_mask`` in torch's dtype (:func:`~variance_lab.frameworks.batch.torch_dtypes`)."""
    dt, _ = torch_dtypes(values.dtype, mask.dtype)
    return values.astype(dt) * mask.astype(dt)


def _log32(c: float) -> float:
    r"""Return ``torch.log(torch.tensor(c))``: the log of float32 ``c`` in float32 (lines 700-701).

    ``torch.tensor`` of a Python float is float32 (torch's default dtype), so verl's sequence-level
    ``rollout_is_ratio_fraction_*`` compare :math:`\sum_t y_t` with a float32 :math:`\log C`, for
    float64 log-probs too. The mirror takes the correctly rounded float32 log; torch's CPU log
    is one ulp away from it for 6.6 % of thresholds in [0.01, 10] (1.5 is one: 0.40546513 against
    0.40546510), where a sequence whose log-ratio sum lies between the two is counted differently.
    """
    with np.errstate(over="ignore"):
        return float(np.float32(math.log(float(np.float32(c)))))


def _std(x: np.ndarray) -> np.ndarray:
    """Return ``x.std()`` as torch takes it (unbiased), in ``x``'s dtype."""
    return np.asarray(np.std(x.astype(np.float64), ddof=1)).astype(x.dtype)


def _fraction32(flags: np.ndarray) -> float:
    """Return ``flags.float().mean()``: a fraction in float32 (1/6 logs as 0.1666666716)."""
    return float(np.float32(np.count_nonzero(flags)) / np.float32(flags.size))


def _flag_mean(flags: np.ndarray, mask: np.ndarray) -> float:
    """Return ``masked_mean(flags.float(), mask)``: float32 flags, so float32 unless the mask is float64."""
    return float(VERL_MEAN.mean(flags.astype(np.float32), mask))


# --------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------
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
        :math:`\log\pi_{old} - \log\pi_{rollout}` per token; float32 is kept (verl's dtype).
    response_mask : array_like, shape (B, T)
        1 for a response token, 0 for padding; bool, integer, float32 or float64.
    rollout_is : {"token", "sequence"}
        Token ratios :math:`e^{y_t}`, or the product :math:`P_T = e^{\sum_t y_t}` on every token.
    rollout_is_threshold : float or str
        :math:`C` (truncate at :math:`C`) or ``"LO_HI"`` (zero the weights outside).
    rollout_is_batch_normalize : bool
        Divide by the weights' mean (over tokens; over sequences for ``"sequence"``).

    Returns
    -------
    (weights, metrics)
        Weights of shape (B, T), 0 on padding, in verl's dtype (float32 for float32 log-ratios
        unless the mask is float64); metrics named as verl logs them, without ``rollout_corr/``.
    """
    mask = torch_mask(response_mask)
    y = _values(log_ratio, mask, "log_ratio")
    _check_any(mask)
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"bad rollout_is {rollout_is!r}: expected 'token' or 'sequence'")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    # rollout_corr_helper.py:572-592: e^clamp(y) per token, or e^clamp(sum y) per sequence, times the mask
    if rollout_is == "token":
        log_for_metrics = y
        raw = _times_mask(exp_like(np.clip(y, -SAFETY_BOUND, SAFETY_BOUND)), mask)
    else:
        log_for_metrics = VERL_MEAN.sum(y, mask, axis=-1)[:, None]
        raw = _times_mask(exp_like(np.clip(log_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)), mask)
    dt = raw.dtype
    # :595-604: TIS clamps the weight at C; IcePop zeroes it outside [LO, HI], compared as a weight
    if lower is None:
        weights = np.minimum(raw, dt.type(upper))
    else:
        weights = np.where(torch_rule(dt).outside(raw, lower, upper), dt.type(0.0), raw)
    metrics = _is_metrics(weights, raw, log_for_metrics, mask, rollout_is, upper, lower, rollout_is_threshold)
    if lower is not None:  # :616-621
        metrics["rollout_is_oob_ratio"] = _flag_mean(torch_rule(dt).outside(raw, lower, upper), mask)
    if rollout_is_batch_normalize:  # :628-655
        if rollout_is == "token":
            mean = VERL_MEAN.mean(weights, mask)
        else:
            seq_w = VERL_MEAN.mean(weights, mask, axis=-1)
            seq_mask = (mask.sum(axis=-1) > 0).astype(dt)
            mean = (seq_w * seq_mask).sum(dtype=dt) / max(seq_mask.sum(dtype=dt), dt.type(1e-8))
        if mean > dt.type(1e-8):
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(weights, raw, log_for_metrics, mask, rollout_is, upper, lower, threshold) -> dict[str, float]:
    """Compute the metrics of verl's ``compute_is_metrics`` (``rollout_corr_helper.py:660-783``)."""
    m: dict[str, float] = {}
    dt = weights.dtype
    rule = torch_rule(dt)
    lower_eff = 1.0 / upper if lower is None else lower
    inside = mask != 0
    if rollout_is == "sequence":  # :704-718, the fractions against float32 logs, over every row
        m["rollout_is_max"] = float(exp_like(np.minimum(log_for_metrics.max(), dt.type(SAFETY_BOUND))))
        m["rollout_is_min"] = float(exp_like(log_for_metrics.min()))
        m["rollout_is_mean"] = float(VERL_MEAN.mean(weights, mask))
        m["rollout_is_ratio_fraction_high"] = _fraction32(rule.outside(log_for_metrics, None, _log32(upper)))
        m["rollout_is_ratio_fraction_low"] = _fraction32(
            rule.outside(log_for_metrics, _log32(lower_eff), None)
        )
    else:  # :720-738, the fractions from the raw weights
        m["rollout_is_mean"] = float(VERL_MEAN.mean(weights, mask))
        m["rollout_is_ratio_fraction_high"] = _flag_mean(rule.outside(raw, None, upper), mask)
        m["rollout_is_ratio_fraction_low"] = _flag_mean(rule.outside(raw, lower_eff, None), mask)
        m["rollout_is_max"] = float(weights[inside].max())
        m["rollout_is_min"] = float(weights[inside].min())
    clamped = np.clip(weights, dt.type(0.0), dt.type(upper))
    if mask.sum() > 1:  # :742-751
        mean = VERL_MEAN.mean(clamped, mask)
        var = VERL_MEAN.mean(clamped * clamped, mask) - mean * mean
        m["rollout_is_std"] = float(np.sqrt(np.maximum(var, dt.type(0.0))))
    else:
        m["rollout_is_std"] = 0.0
    normalized = clamped / (VERL_MEAN.mean(clamped, mask) + dt.type(1e-8))  # :754-759
    second = float(VERL_MEAN.mean(normalized * normalized, mask))
    if second == 0.0:
        raise ValueError(
            f"every importance weight is 0 with rollout_is_threshold {threshold!r}: verl 0.9.1 divides by "
            "zero there (rollout_is_eff_sample_size) and stops"
        )
    m["rollout_is_eff_sample_size"] = 1.0 / second
    seq_mean = VERL_MEAN.mean(weights, mask, axis=-1)  # :762-781
    m["rollout_is_seq_mean"] = float(seq_mean.mean())
    m["rollout_is_seq_std"] = float(_std(seq_mean)) if seq_mean.size > 1 else 0.0
    m["rollout_is_seq_max"] = float(seq_mean.max())
    m["rollout_is_seq_min"] = float(seq_mean.min())
    m["rollout_is_seq_max_deviation"] = float(np.abs(seq_mean - dt.type(1.0)).max())
    raw_seq_mean = VERL_MEAN.mean(raw, mask, axis=-1)
    m["rollout_is_seq_fraction_high"] = _fraction32(rule.outside(raw_seq_mean, None, upper))
    m["rollout_is_seq_fraction_low"] = _fraction32(rule.outside(raw_seq_mean, lower_eff, None))
    return m


# --------------------------------------------------------------------------------------
# rejection
# --------------------------------------------------------------------------------------
def compute_rollout_rejection_mask(
    log_ratio, response_mask, rollout_rs: str = "token_k1", rollout_rs_threshold=None
) -> tuple[np.ndarray, dict[str, float]]:
    r"""Compute verl's rejection mask and its ``rollout_rs_*`` metrics (without the prefix).

    Parameters
    ----------
    log_ratio, response_mask : array_like, shape (B, T)
        As in :func:`compute_rollout_correction_weights`.
    rollout_rs : str
        Options of :data:`SUPPORTED_ROLLOUT_RS_OPTIONS`, comma-separated: a token or sequence is
        kept when every option keeps it.
    rollout_rs_threshold : float or str
        One threshold for every option, or one per option (comma-separated); ``"LO_HI"`` for k1.

    Returns
    -------
    (modified_response_mask, metrics)
        The mask in the caller's dtype, as verl returns it.
    """
    mask = torch_mask(response_mask)
    y = _values(log_ratio, mask, "log_ratio")
    _check_any(mask)
    options = parse_rs_options(rollout_rs)
    thresholds = parse_rs_thresholds(options, rollout_rs_threshold)
    dt = y.dtype
    ys = np.clip(y, -SAFETY_BOUND, SAFETY_BOUND)  # :262-265, in the log-ratio's dtype
    stats = {"k1": -ys, "k2": dt.type(0.5) * ys**2, "k3": exp_like(ys) - dt.type(1.0) - ys}
    inside = mask != 0
    seq_valid = mask.sum(axis=-1) > 0
    combined = np.ones(mask.shape, dtype=dt)  # :270
    metrics: dict[str, float] = {}
    for opt in options:
        lower, upper = thresholds[opt]
        k = opt[-2:]
        is_k1 = k == "k1"
        # :295-301, :376-377: k1 compares -y with math.log of the bounds, the others k with U
        lo_b, hi_b = (math.log(lower), math.log(upper)) if is_k1 else (None, upper)
        per_seq = None
        if opt.startswith("token"):  # :312-322
            per_token = stats[k]
            keep = ~torch_rule(dt).outside(per_token, lo_b, hi_b)
        else:  # :323-372
            if opt.startswith("seq_sum"):
                per_seq = VERL_MEAN.sum(stats[k], mask, axis=-1)
            elif opt.startswith("seq_mean"):
                per_seq = VERL_MEAN.mean(stats[k], mask, axis=-1)
            else:
                vals = np.where(inside, stats[k], dt.type(-np.inf)).max(axis=-1)
                per_seq = np.where(vals == -np.inf, dt.type(0.0), vals)
            keep = np.broadcast_to(
                ~torch_rule(per_seq.dtype).outside(per_seq, lo_b, hi_b)[:, None], mask.shape
            )
            per_token = np.broadcast_to(per_seq[:, None], mask.shape)
        metrics.update(
            _rs_metrics(opt, per_token, mask, seq_valid, per_seq, hi_b, lo_b if is_k1 else 0.0, is_k1)
        )
        keep_f = keep.astype(dt)  # :379-404
        combined = combined * keep_f
        seq_keep = (~(~keep & inside)).all(axis=-1)
        metrics[f"rollout_rs_{opt}_masked_fraction"] = float(VERL_MEAN.mean(dt.type(1.0) - keep_f, mask))
        valid_f = seq_valid.astype(np.float32)
        n_valid = valid_f.sum()
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = (
            float(((dt.type(1.0) - seq_keep.astype(dt)) * valid_f).sum() / n_valid) if n_valid > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(VERL_MEAN.mean(dt.type(1.0) - combined, mask))  # :406-412
    final_keep = (combined > 0.5) & inside
    metrics["rollout_rs_seq_masked_fraction"] = _fraction32((~final_keep & inside).any(axis=-1))
    return (mask * combined).astype(_out_dtype(response_mask)), metrics


def _rs_metrics(opt, stat, mask, seq_valid, per_seq, upper, lower, apply_lower) -> dict[str, float]:
    """Compute verl's ``compute_rs_metrics`` for one option (``rollout_corr_helper.py:416-519``)."""
    m: dict[str, float] = {}
    p = f"rollout_rs_{opt}"
    inside = mask != 0
    seq_values = per_seq if per_seq is not None else VERL_MEAN.mean(stat, mask, axis=-1)
    valid = seq_values[seq_valid]
    rule, dt = torch_rule(stat.dtype), stat.dtype
    m[f"{p}_mean"] = float(VERL_MEAN.mean(stat, mask))
    sequence_level = not opt.startswith("token")
    if sequence_level and valid.size:
        m[f"{p}_max"], m[f"{p}_min"] = float(valid.max()), float(valid.min())
        m[f"{p}_fraction_high"] = _fraction32(rule.outside(valid, None, upper))
        m[f"{p}_fraction_low"] = _fraction32(rule.outside(valid, lower, None)) if apply_lower else 0.0
    else:
        m[f"{p}_max"], m[f"{p}_min"] = float(stat[inside].max()), float(stat[inside].min())
        m[f"{p}_fraction_high"] = _flag_mean(rule.outside(stat, None, upper), mask)
        m[f"{p}_fraction_low"] = _flag_mean(rule.outside(stat, lower, None), mask) if apply_lower else 0.0
    if mask.sum() > 1:
        s = np.clip(stat, dt.type(lower if apply_lower else 0.0), dt.type(upper))
        mean = VERL_MEAN.mean(s, mask)
        var = VERL_MEAN.mean(s * s, mask) - mean * mean
        m[f"{p}_std"] = float(np.sqrt(np.maximum(var, var.dtype.type(0.0))))
    else:
        m[f"{p}_std"] = 0.0
    if valid.size:
        m[f"{p}_seq_mean"] = float(valid.mean())
        m[f"{p}_seq_std"] = float(_std(valid)) if valid.size > 1 else 0.0
        m[f"{p}_seq_max"] = float(valid.max())
        m[f"{p}_seq_min"] = float(valid.min())
        m[f"{p}_seq_max_deviation"] = float(np.abs(valid).max())
        m[f"{p}_seq_fraction_high"] = _fraction32(rule.outside(valid, None, upper))
        if apply_lower:
            m[f"{p}_seq_fraction_low"] = _fraction32(rule.outside(valid, lower, None))
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
    ``rollout_log_prob=None`` gives the two training-perplexity metrics only. In float32 an
    exponential overflows to ``inf`` above 88.72, as in verl (``k3_kl`` is unclamped).
    """
    mask = torch_mask(response_mask)
    old = _values(old_log_prob, mask, "old_log_prob")
    _check_any(mask)
    m: dict[str, float] = {}
    mean_old = VERL_MEAN.mean(old, mask, axis=-1)  # rollout_corr_helper.py:947-952
    m["training_ppl"] = float(exp_like(-mean_old).mean())
    m["training_log_ppl"] = float((-mean_old).mean())
    if rollout_log_prob is None:
        return m
    rollout = _values(rollout_log_prob, mask, "rollout_log_prob")
    y = old - rollout  # :955-1008, in the log-probs' dtype
    m["kl"] = float(VERL_MEAN.mean(rollout - old, mask))
    m["k3_kl"] = float(VERL_MEAN.mean(exp_like(y) - y - y.dtype.type(1.0), mask))
    mean_rollout = VERL_MEAN.mean(rollout, mask, axis=-1)
    m["rollout_ppl"] = float(exp_like(-mean_rollout).mean())
    m["rollout_log_ppl"] = float((-mean_rollout).mean())
    diff = mean_rollout - mean_old
    m["log_ppl_diff"] = float(diff.mean())
    m["log_ppl_abs_diff"] = float(np.abs(diff).mean())
    m["log_ppl_diff_max"] = float(diff.max())
    m["log_ppl_diff_min"] = float(diff.min())
    m["ppl_ratio"] = float(exp_like(diff).mean())
    rho = exp_like(np.clip(y, -SAFETY_BOUND, SAFETY_BOUND))
    m["chi2_token"] = float(VERL_MEAN.mean(rho * rho, mask) - 1.0)
    log_p = VERL_MEAN.sum(y, mask, axis=-1)
    log_p = np.clip(log_p, -SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = float(exp_like(log_p.dtype.type(2.0) * log_p).mean() - 1.0)
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
        The training policy's and the rollout engine's token log-probabilities; float32 is kept
        and computed in, as verl does.
    response_mask : array_like, shape (B, T)
        1 for a response token, 0 for padding (bool, integer, float32 or float64); at least one 1.
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
        ``weights`` where verl returns a DataProto holding ``rollout_is_weights``; the mask in
        the caller's dtype; metrics keyed ``rollout_corr/<name>`` as verl logs them.
    """
    mask = torch_mask(response_mask)
    old = _values(old_log_prob, mask, "old_log_prob")
    rollout = _values(rollout_log_prob, mask, "rollout_log_prob")
    _check_any(mask)
    y = old - rollout  # rollout_corr_helper.py:849
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            y, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    modified = mask.astype(_out_dtype(response_mask))
    if rollout_rs is not None:
        modified, rs_metrics = compute_rollout_rejection_mask(y, mask, rollout_rs, rollout_rs_threshold)
        modified = modified.astype(_out_dtype(response_mask))
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old, rollout, mask))
    return weights, modified, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def _check_any(mask: np.ndarray) -> None:
    if not mask.any():
        raise ValueError("response_mask must hold at least one valid token (1)")
