r"""Which logged numbers to trust: each step of a run's log judged, one record never stopping the others.

A training framework logs, per step, a few token-level averages of the mismatch log-ratio (over
:math:`10^5` to :math:`10^7` tokens: precise) and a few sequence-level sample estimates of
exponential moments (over a few hundred sequences: maybe not). :func:`analyze_logged` takes the
records of a run's log (:func:`~variance_lab.frameworks.logfiles.read_metrics`), and per step

1. fits the per-token law :math:`y \sim N(m, s^2)` from the token metrics, under the framework's
   clamp where it has one (:mod:`~variance_lab.frameworks.tokenlaw`);
2. predicts each sequence metric at the run's lengths and batch size, with an interval, the
   expectation it estimates and a verdict (:mod:`~variance_lab.frameworks.seqmetrics`), all steps
   at once on one set of simulated batches.

A record that cannot be judged (a line that is not JSON, a field that is not a number, token
metrics that no law of the family gives) gets its own row with a ``note`` and the verdict
``not judged``; every other record is judged. Only a log in which no record can be judged
raises ``ValueError`` (the first record's reason).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from variance_lab.frameworks.logfiles import (
    DEFAULT_RATIO_LEVEL,
    FRAMEWORKS,
    SEQUENCE_METRICS,
    STEP_KEYS,
    TOKEN_CLAMP,
    TOKEN_METRICS,
    UnreadableRecord,
    detect_framework,
    field_number,
    find_metric,
    unwrap_record,
)
from variance_lab.frameworks.seqmetrics import agreement, length_sampler, predict_steps
from variance_lab.frameworks.tokenlaw import fit_law

__all__ = ["MAX_DRAWS", "METRIC_COLUMNS", "MIN_BATCHES", "analyze_logged"]

#: Simulated sequences per step at most (:func:`analyze_logged` uses fewer batches for large B) ...
MAX_DRAWS = 2_000_000
#: ... but never fewer batches than this.
MIN_BATCHES = 100

#: The columns of :func:`analyze_logged`'s ``metrics`` frame.
METRIC_COLUMNS = (
    "record",
    "step",
    "metric",
    "logged",
    "predicted",
    "lo",
    "hi",
    "agreement",
    "target",
    "log10_target",
    "n_needed",
    "log10_n_needed",
    "rel_se",
    "khat",
    "khat_limit",
    "verdict",
    "reason",
)


def _read_record(rec: dict, i: int, where: str, kinds, seq_metrics, law_from, clamps):
    """Return (step, law, fits, logged) of one record; ``ValueError`` naming ``where`` if not judged."""
    step_key = next((k for k in STEP_KEYS if k in rec), None)
    step = field_number(rec, step_key, where) if step_key else float(i)
    values = {}
    for name in kinds:
        key = find_metric(rec, name)
        if key is not None:
            values[name] = field_number(rec, key, where)
    logged = {}
    for metric in seq_metrics:
        key = find_metric(rec, metric.name)
        logged[metric.name] = field_number(rec, key, where) if key is not None else math.nan
    try:
        law, fits = fit_law(values, kinds, law_from, clamps)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return step, law, fits, logged


def _step_of(rec, i: int) -> float:
    """Return the step a record names if it can be read (NaN if not), for a record not judged."""
    if not isinstance(rec, dict):
        return math.nan
    key = next((k for k in STEP_KEYS if k in rec), None)
    try:
        return field_number(rec, key, "") if key else float(i)
    except ValueError:
        return math.nan


def analyze_logged(
    records: list,
    *,
    batch_size: int,
    lengths=None,
    quantiles=None,
    framework: str | None = None,
    threshold: float | None = None,
    ratio_level: str | None = None,
    law_from: str | None = None,
    level: float = 0.9,
    n_batches: int = 400,
    target_rel: float = 0.1,
    seed: int = 0,
    source: str = "records",
    micro_batch_size: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    r"""Per step: the token law from the token metrics, and each sequence metric predicted and judged.

    Parameters
    ----------
    records : list
        One per step, the run's logged scalars under the framework's names (a key may carry a
        prefix: ``train/sampling_importance_ratio``); ``step`` (or ``_step``, ``global_step``,
        ``Step``) names the step, else the record's index; verl's ``{"step": N, "data": {...}}``
        is unwrapped. A ``None`` value is a metric the step did not log; a record with none of
        the framework's metrics (an evaluation row) is skipped and counted in
        ``metrics.attrs["skipped"]``. An
        :class:`~variance_lab.frameworks.logfiles.UnreadableRecord` is reported, not judged.
    batch_size : int
        Sequences per step (B).
    lengths, quantiles : array_like
        The run's sequence lengths: a sample, or quantiles
        (:func:`~variance_lab.frameworks.seqmetrics.length_sampler`).
    framework : str, optional
        One of :data:`~variance_lab.frameworks.logfiles.FRAMEWORKS`; None: from the records' keys.
    threshold : float, optional
        The bound C of the truncated, masked and out-of-bound metrics (default: the framework's).
    ratio_level : {None, "token", "sequence"}
        Whether the run's importance ratios are per token or per sequence (verl
        ``rollout_is``, NeMo-RL ``sequence_level_importance_ratios``, TRL
        ``vllm_importance_sampling_mode``); None: the framework's default
        (:data:`~variance_lab.frameworks.logfiles.DEFAULT_RATIO_LEVEL`). With token-level ratios
        the IS metrics are token averages, precise and not judged here; only ``chi2_seq`` stays a
        sequence metric.
    law_from : str, optional
        The token metric that sets each step's law (:func:`~variance_lab.frameworks.tokenlaw.fit_law`).
    level : float
        Level of the prediction intervals.
    n_batches : int
        Simulated batches (the same draws for every step and metric); at most
        :data:`MAX_DRAWS` sequences in all, but at least :data:`MIN_BATCHES` batches.
    target_rel : float
        The relative standard error a batch must reach to "estimate" a metric.
    seed : int
    source : str
        The file's name, for messages.
    micro_batch_size : int
        NeMo-RL's ``train_micro_batch_size``. With sequence-level ratios NeMo-RL logs
        ``sampling_importance_ratio`` as about this many times the mean weight (a broadcast in
        its ``masked_mean``, :func:`~variance_lab.frameworks.nemo_rl.clipped_pg_importance_weights`),
        so its prediction, interval and target are scaled by it; other metrics and frameworks
        ignore it.

    Returns
    -------
    (laws, metrics) : tuple of DataFrame
        ``laws``, one row per record judged or not: record (1-based, in the log), step,
        framework, m, s2, source, ``s2_spread`` (the largest fitted :math:`s^2` over the smallest:
        1 for lognormal tokens, far above for heavy tails), ``note`` (why the record is not
        judged, or which token metrics no law gives; empty otherwise) and ``s2[<metric>]`` per
        token metric; ``metrics``: :data:`METRIC_COLUMNS`, one row per record and sequence-level
        metric: logged (NaN when the step does not log it), predicted, lo, hi, agreement
        (``inside``, ``below``, ``above``, ``not logged``, ``not judged``), target, log10_target,
        n_needed, log10_n_needed, rel_se, khat, khat_limit, verdict (``reliable``, ``marginal``,
        ``unreliable``, ``not judged``), reason.
    """
    if not records:
        raise ValueError(f"{source}: no records")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 2:
        raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    records = [unwrap_record(r) for r in records]
    if framework is None:
        framework = detect_framework(records)
    if framework not in TOKEN_METRICS:
        raise ValueError(f"unknown framework {framework!r}; frameworks are {', '.join(FRAMEWORKS)}")
    if (
        isinstance(micro_batch_size, bool)
        or not isinstance(micro_batch_size, int | np.integer)
        or micro_batch_size < 1
    ):
        raise ValueError(f"micro_batch_size must be an integer >= 1, got {micro_batch_size!r}")
    if threshold is not None and not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a number > 0, got {threshold!r}")
    ratio_level = DEFAULT_RATIO_LEVEL[framework] if ratio_level is None else ratio_level
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    kinds = TOKEN_METRICS[framework]
    if law_from is not None and law_from not in kinds:
        raise ValueError(f"law_from {law_from!r} is not a token metric here; they are {', '.join(kinds)}")
    seq_metrics = [
        mt for mt in SEQUENCE_METRICS[framework] if mt.ratio_level == "any" or ratio_level == "sequence"
    ]
    draw, grid = length_sampler(lengths, quantiles)
    n_batches = min(n_batches, max(MIN_BATCHES, MAX_DRAWS // batch_size))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    Z = rng.standard_normal((n_batches, batch_size))
    L = draw(rng, (n_batches, batch_size))
    clamps = TOKEN_CLAMP.get(framework, {})
    names = [*kinds, *(mt.name for mt in SEQUENCE_METRICS[framework])]
    rows: list[dict] = []  # one per record judged or not, in the log's order
    judged: list[tuple[int, dict]] = []  # (row index, logged sequence metrics)
    skipped = 0
    for i, rec in enumerate(records):
        where = f"{source}: record {i + 1}"
        if isinstance(rec, UnreadableRecord):
            rows.append({"record": i + 1, "step": math.nan, "note": f"{rec.where}: {rec.problem}"})
            continue
        if not isinstance(rec, dict):
            note = f"{where}: expected an object of metrics, got {type(rec).__name__}"
            rows.append({"record": i + 1, "step": math.nan, "note": note})
            continue
        if all(find_metric(rec, n) is None for n in names):  # an eval or timing row of the log
            skipped += 1
            continue
        try:
            step, law, fits, logged = _read_record(rec, i, where, kinds, seq_metrics, law_from, clamps)
        except ValueError as exc:
            rows.append({"record": i + 1, "step": _step_of(rec, i), "note": str(exc)})
            continue
        spread = max(fits.values()) / min(fits.values()) if min(fits.values()) > 0 else math.inf
        note = f"law from {law.source}: " + "; ".join(law.notes) if law.notes else ""
        judged.append((len(rows), logged))
        rows.append(
            {"record": i + 1, "step": step, "m": law.m, "s2": law.s2, "source": law.source}
            | {"s2_spread": spread, "note": note}
            | {f"s2[{k}]": v for k, v in fits.items()}
        )
    if not rows:
        raise ValueError(f"{source}: no record logs any of {', '.join(kinds)}")
    if not judged:
        raise ValueError(rows[0]["note"])
    laws = pd.DataFrame(rows)
    laws.insert(2, "framework", framework)
    fit_cols = [c for c in laws.columns if c.startswith("s2[")]
    for col in ("m", "s2", "source", "s2_spread"):
        if col not in laws:
            laws[col] = math.nan
    laws = laws[["record", "step", "framework", "m", "s2", "source", "s2_spread", "note", *fit_cols]]
    laws["source"] = laws["source"].fillna("")
    # NeMo-RL logs the sequence-level sampling_importance_ratio times its micro-batch size
    scales = {"sampling_importance_ratio": float(micro_batch_size)} if framework == "nemo-rl" else {}
    metrics = _metrics_frame(
        laws, judged, seq_metrics, batch_size, (Z, L), grid, threshold, level, target_rel, scales
    )
    metrics.attrs.update(
        skipped=skipped,
        not_judged=int((laws["s2"].isna()).sum()),
        n_batches=n_batches,
        level=level,
        batch_size=batch_size,
        framework=framework,
        target_rel=target_rel,
        ratio_level=ratio_level,
        micro_batch_size=micro_batch_size,
    )
    return laws, metrics


def _metrics_frame(laws, judged, seq_metrics, batch_size, draws, grid, threshold, level, target_rel, scales):
    """One row per record and sequence metric: the judged ones predicted at once, the others noted."""
    idx = np.array([j for j, _ in judged], dtype=int)
    preds = predict_steps(
        laws["m"].to_numpy(float)[idx],
        laws["s2"].to_numpy(float)[idx],
        seq_metrics,
        batch_size,
        draws,
        grid,
        bound=threshold,
        level=level,
        target_rel=target_rel,
    )
    not_judged = np.flatnonzero(laws["s2"].isna().to_numpy())
    parts = []
    for order, metric in enumerate(seq_metrics):
        logged = np.array([lg[metric.name] for _, lg in judged], dtype=float)
        part = pd.DataFrame(preds[metric.name])
        scale = scales.get(metric.name, 1.0)
        if scale != 1.0:  # a framework logs this multiple of what the metric estimates
            part[["predicted", "lo", "hi", "target"]] *= scale
            part["log10_target"] += math.log10(scale)
        part.insert(0, "logged", logged)
        part["agreement"] = agreement(logged, part["lo"], part["hi"])
        part["_row"], part["_order"] = idx, order
        parts.append(part)
        if not_judged.size:
            parts.append(
                pd.DataFrame(
                    {
                        "logged": math.nan,
                        "agreement": "not judged",
                        "verdict": "not judged",
                        "reason": laws["note"].to_numpy()[not_judged],
                        "_row": not_judged,
                        "_order": order,
                    }
                )
            )
    if not parts:
        return pd.DataFrame(columns=list(METRIC_COLUMNS))
    frame = pd.concat(parts, ignore_index=True).sort_values(["_row", "_order"], kind="stable")
    frame["record"] = laws["record"].to_numpy()[frame["_row"]]
    frame["step"] = laws["step"].to_numpy()[frame["_row"]]
    frame["metric"] = [seq_metrics[o].name for o in frame["_order"]]
    return frame.reindex(columns=list(METRIC_COLUMNS)).reset_index(drop=True)
