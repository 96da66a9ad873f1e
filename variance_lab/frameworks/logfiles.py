"""A run's log: what each framework logs under which name, and reading the file of one record per step.

The names (:data:`TOKEN_METRICS`, :data:`SEQUENCE_METRICS`, :data:`DEFAULT_RATIO_LEVEL`,
:data:`TOKEN_CLAMP`) are the frameworks' own; :mod:`variance_lab.frameworks.logged` judges the
numbers logged under them. A log is one record per step, in the formats users keep (:func:`read_metrics`):

- JSON Lines, one object per line (``.gz`` read through gzip), verl's ``file`` logger included:
  verl 0.9.1 writes ``{"step": N, "data": {...}}`` a line (``FileLogger.log``,
  ``verl/utils/tracking.py`` lines 543-545 of the PyPI release, file sha256 ``b237109346c1...``;
  orjson writes NaN and infinities as ``null``), unwrapped by :func:`unwrap_record`;
- CSV with a header: ``run.history().to_csv(...)`` of the W&B public API (W&B's guide "Export
  metrics from a single run to a CSV file": an unnamed index column, ``_step``, ``_runtime``,
  ``_timestamp``, NaN as an empty cell), and the CSV the W&B web UI exports from a line-plot panel
  (``Step``, then ``<run> - <metric>``, ``<run> - <metric>__MIN``, ``<run> - <metric>__MAX``: the
  columns of such exports found in public repositories; W&B's docs do not spell them out);
- JSON (``.json``): a list of objects (``json.dump(run.history(pandas=False))``,
  ``DataFrame.to_json(orient="records")``) or pandas' default ``to_json()`` (one object per column);
- Parquet (``.parquet``): the full history W&B keeps as the run's ``wandb-history`` artifact
  (W&B's support note "why are steps missing from a CSV metric export": the CSV export and
  ``run.history`` may be sampled, the artifact is not), read with pandas and pyarrow;
- TensorBoard: an event file (``events.out.tfevents.*``) or the folder that holds them, read with
  TensorBoard's own ``EventAccumulator`` (``pip install 'variance_lab[logs]'``); verl's
  ``tensorboard`` logger writes each metric with ``SummaryWriter.add_scalar(key, value, step)``,
  which stores a float32.

A length dump is numbers separated by commas or blanks (:func:`read_lengths`). One bad record
never stops the others: a line that is not a JSON object or a CSV row longer than its header is
kept as an :class:`UnreadableRecord`, which :func:`~variance_lab.frameworks.logged.analyze_logged`
reports on its own line. A file that cannot be read at all raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

from variance_lab._jsonl import open_text
from variance_lab._validate import NonFiniteError, parse_float
from variance_lab.frameworks.verl import SAFETY_BOUND

__all__ = [
    "DEFAULT_RATIO_LEVEL",
    "FRAMEWORKS",
    "LOGS_EXTRA_HINT",
    "SEQUENCE_METRICS",
    "STEP_KEYS",
    "TOKEN_CLAMP",
    "TOKEN_METRICS",
    "SequenceMetric",
    "UnreadableRecord",
    "detect_framework",
    "field_number",
    "find_metric",
    "read_lengths",
    "read_metrics",
    "unwrap_record",
]

#: How to install the readers of TensorBoard event files and W&B's Parquet history.
LOGS_EXTRA_HINT = "pip install 'variance_lab[logs]'"

#: Frameworks and their token-level metrics: logged name -> kind (the kinds are the table of
#: :mod:`variance_lab.frameworks.logged`).
TOKEN_METRICS: dict[str, dict[str, str]] = {
    "verl": {"rollout_corr/kl": "kl", "rollout_corr/chi2_token": "chi2", "rollout_corr/k3_kl": "k3"},
    "trl": {"sampling/sampling_logp_difference/mean": "absdiff"},
    "nemo-rl": {"token_mult_prob_error": "mult", "gen_kl_error": "k3"},
    # prime-rl logs Tensors.compute_stats of the step's tokens: mismatch_kl/all/mean pools them
    "prime-rl": {"mismatch_kl/all/mean": "k3", "mismatch_kl": "k3"},
    # slime: --use-tis runs log tis_abs; mis.py runs (mis_*) log the kl, k3 and chi2 per sample
    "slime": {"tis_abs": "tis_abs", "mis_k3_kl": "k3", "mis_kl": "kl", "mis_chi2_token": "chi2"},
    "openrlhf": {"vllm_kl": "kl"},
}


@dataclass(frozen=True)
class SequenceMetric:
    """A logged sequence-level batch estimate: its summand, its aggregation, its default bound."""

    name: str
    kind: str  # chi2_seq | trunc_mean | masked_mean | frac_above | ess_trunc
    weighting: str  # "seq": mean over sequences; "token": weighted by length
    bound: float | None = None  # C (the framework's default; threshold= overrides)
    #: "sequence": a sequence metric only when the run uses sequence-level ratios (verl
    #: rollout_is="sequence", NeMo-RL sequence_level_importance_ratios, TRL sequence_* modes);
    #: "any": always (verl's chi2_seq).
    ratio_level: str = "sequence"


#: Frameworks' sequence-level estimates, as they compute them with sequence-level ratios.
SEQUENCE_METRICS: dict[str, tuple[SequenceMetric, ...]] = {
    "verl": (
        SequenceMetric("rollout_corr/chi2_seq", "chi2_seq", "seq", ratio_level="any"),
        SequenceMetric("rollout_corr/rollout_is_mean", "trunc_mean", "token", 2.0),
        SequenceMetric("rollout_corr/rollout_is_eff_sample_size", "ess_trunc", "token", 2.0),
        SequenceMetric("rollout_corr/rollout_is_ratio_fraction_high", "frac_above", "seq", 2.0),
    ),
    "trl": (SequenceMetric("sampling/importance_sampling_ratio/mean", "masked_mean", "seq", 3.0),),
    "nemo-rl": (
        SequenceMetric("sampling_importance_ratio", "trunc_mean", "seq", 2.0),
        SequenceMetric("is_oob_ratio", "frac_above", "token", 2.0),
    ),
    "prime-rl": (),
    # mis.py: each sample's e^(2 clamp(sum y, +-20)) - 1, averaged over samples (as verl's chi2_seq)
    "slime": (SequenceMetric("mis_chi2_seq", "chi2_seq", "seq", ratio_level="any"),),
    "openrlhf": (),
}

#: Each framework's ratio level by default: verl's ``rollout_is`` and NeMo-RL's
#: ``sequence_level_importance_ratios`` default to tokens, TRL's ``vllm_importance_sampling_mode``
#: to ``sequence_mask``.
DEFAULT_RATIO_LEVEL = {
    "verl": "token",
    "trl": "sequence",
    "nemo-rl": "token",
    "prime-rl": "token",
    "slime": "token",
    "openrlhf": "token",
}

#: Token metrics a framework computes from clamped log-ratios: logged name -> the clamp c, the
#: metric is then an average of g(clip(y, -c, c)). verl 0.9.1's ``chi2_token``
#: is the masked mean of ``exp(clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) ** 2`` minus 1
#: (``rollout_corr_helper.py`` lines 997-1000, ``SAFETY_BOUND = 20.0`` at line 75); its ``kl``
#: and ``k3_kl`` take the raw log-ratio (lines 959-965).
TOKEN_CLAMP: dict[str, dict[str, float]] = {
    "verl": {"rollout_corr/chi2_token": SAFETY_BOUND},
    "slime": {"mis_chi2_token": SAFETY_BOUND},  # mis.py clamps y to +-20 before exp (slime_mis)
}

#: Keys that name a record's step, first first: JSONL and verl's file logger ``step``, W&B
#: ``_step`` (its panel export ``Step``), TRL/transformers ``global_step``.
STEP_KEYS = ("step", "_step", "global_step", "Step")

#: Framework names accepted by :func:`variance_lab.frameworks.logged.analyze_logged`.
FRAMEWORKS = tuple(TOKEN_METRICS)


@dataclass(frozen=True)
class UnreadableRecord:
    """A record of a log that could not be read (``where``: file, record and line; ``problem``: why)."""

    where: str
    problem: str


# --------------------------------------------------------------------------------------
# a record
# --------------------------------------------------------------------------------------
def find_metric(record: dict, name: str):
    """Return the record's key for a metric name: the name itself or a key ending in '/' + name.

    A key whose value is ``None`` (JSON ``null``: the step did not log it) does not count.
    """
    if record.get(name) is not None:
        return name
    for key, value in record.items():
        if isinstance(key, str) and key.endswith("/" + name) and value is not None:
            return key
    return None


def detect_framework(records: list[dict]) -> str:
    """Return the framework whose token metrics the records hold most of (ValueError if none)."""
    dicts = [r for r in records if isinstance(r, dict)]
    best, count = None, 0
    for fw, kinds in TOKEN_METRICS.items():
        c = sum(find_metric(r, n) is not None for r in dicts[:200] for n in kinds)
        if c > count:
            best, count = fw, c
    if best is None:
        keys = list(dict.fromkeys(str(k) for r in dicts[:20] for k in r))
        seen = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
        raise ValueError(
            "no known token-level metric in the records (their keys: "
            f"{seen or 'none'}): expected e.g. rollout_corr/k3_kl (verl), token_mult_prob_error "
            "(nemo-rl), mismatch_kl (prime-rl); pass framework="
        )
    return best


def unwrap_record(record):
    """Return a record with verl's ``file`` logger envelope removed: ``{"step": N, **data}``.

    verl 0.9.1's ``FileLogger.log`` writes ``{"step": step, "data": data}`` (``verl/utils/tracking.py``
    lines 543-545); any other record comes back as it is.
    """
    if (
        isinstance(record, dict)
        and len(record) == 2
        and "step" in record
        and isinstance(record.get("data"), dict)
    ):
        return {"step": record["step"], **record["data"]}
    return record


def field_number(record: dict, key: str, where: str) -> float:
    """Return ``record[key]`` as a finite float (``ValueError`` naming ``where`` and the field if not).

    A number or its text, read by the one float rule (:func:`~variance_lab._validate.parse_float`);
    a bool is refused.
    """
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{where}: field {key!r}: expected a number, got {_short(v)}")
    try:
        return parse_float(v, key)
    except (NonFiniteError, OverflowError):  # OverflowError: a JSON integer past the float range
        expected = "a finite number"
    except ValueError:
        expected = "a number"
    raise ValueError(f"{where}: field {key!r}: expected {expected}, got {_short(v)}") from None


def _short(value) -> str:
    """``repr`` of a bad value, cut to 60 characters (a 400-digit integer, a long list)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------------------
# the files
# --------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        with open_text(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:  # a .gz cut short or corrupt
        raise ValueError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None


def _jsonl(path: Path, text: str) -> list:
    records: list = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{path}: record {len(records) + 1} (line {i + 1})"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            records.append(UnreadableRecord(where, f"not JSON: {exc.msg}"))
            continue
        except RecursionError:
            records.append(UnreadableRecord(where, "not JSON: nested too deep"))
            continue
        if not isinstance(rec, dict):
            records.append(UnreadableRecord(where, "expected an object of metrics"))
            continue
        records.append(unwrap_record(rec))
    return records


def _json(path: Path, text: str) -> list:
    """Read a JSON document: a list of objects, or pandas' ``to_json()`` (one object per column)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # one value per line: JSON Lines named .json
            return _jsonl(path, text)
        raise ValueError(f"{path}: not JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: not JSON: nested too deep") from None
    if isinstance(doc, dict) and doc and all(isinstance(v, dict) for v in doc.values()):
        rows: dict = {}
        for col, cells in doc.items():  # pandas' orient="columns": {column: {index: value}}
            for idx, value in cells.items():
                rows.setdefault(idx, {})[col] = value
        doc = list(rows.values())
    if not isinstance(doc, list):
        raise ValueError(
            f"{path}: expected a list of objects (one per step), got a JSON {type(doc).__name__}"
        )
    return [
        unwrap_record(r)
        if isinstance(r, dict)
        else UnreadableRecord(f"{path}: record {i + 1}", "expected an object")
        for i, r in enumerate(doc)
    ]


def _csv(path: Path, text: str) -> list:
    """Read CSV with a header; W&B's panel export (``<run> - <metric>``, ``__MIN``/``__MAX``) unwrapped."""
    reader = csv.reader(text.splitlines())
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise ValueError(f"{path}: the CSV header cannot be read: {exc}") from None
    if header is None:
        return []
    names: list[str | None] = list(header)
    if any(" - " in h and h.endswith(("__MIN", "__MAX")) for h in header):  # W&B line-plot export
        runs = sorted({h.split(" - ", 1)[0] for h in header if " - " in h})
        if len(runs) > 1:
            raise ValueError(
                f"{path}: a W&B panel export of {len(runs)} runs ({', '.join(runs)}): export one run's "
                "history (run.history().to_csv)"
            )
        names = [
            None if h.endswith(("__MIN", "__MAX")) else h.split(" - ", 1)[1] if " - " in h else h
            for h in header
        ]
    records: list = []
    for i in itertools.count():
        try:
            row = next(reader, None)
        except csv.Error as exc:  # a field past csv's size limit, a NUL byte in old Pythons
            records.append(
                UnreadableRecord(f"{path}: record {len(records) + 1} (line {i + 2})", f"not CSV: {exc}")
            )
            continue
        if row is None:
            break
        if not row:
            continue
        if len(row) > len(names):
            where = f"{path}: record {len(records) + 1} (line {i + 2})"
            records.append(UnreadableRecord(where, "more values than the header has names"))
            continue
        records.append({k: v for k, v in zip(names, row, strict=False) if k is not None and v != ""})
    return records


def _parquet(path: Path) -> list:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow: {LOGS_EXTRA_HINT}") from None
    except Exception as exc:  # pyarrow's errors for a corrupt file share no narrower base (ArrowException)
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a readable Parquet file: {reason}") from None
    return [
        {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        for row in frame.to_dict(orient="records")
    ]


def _tensorboard(path: Path) -> list:
    """Scalars of TensorBoard event files, one record per step, through TensorBoard's EventAccumulator."""
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise ValueError(
            f"{path}: reading TensorBoard event files needs the tensorboard package: {LOGS_EXTRA_HINT}"
        ) from None
    if path.is_dir() and not any(path.glob("*tfevents*")):
        runs = sorted({str(f.parent.relative_to(path)) for f in path.rglob("*tfevents*")})
        if len(runs) != 1:
            what = f"its runs are in {', '.join(runs)}: pass one of them" if runs else "no event file in it"
            raise ValueError(f"{path}: no TensorBoard event file here ({what})")
        path = path / runs[0]
    guidance = {event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    acc = event_accumulator.EventAccumulator(str(path), size_guidance=guidance)
    try:
        acc.Reload()
    except Exception as exc:  # TensorBoard's errors for a corrupt file share no narrower base
        raise ValueError(
            f"{path}: not a readable TensorBoard event file: {type(exc).__name__}: {exc}"
        ) from None
    steps: dict[int, dict] = {}
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            steps.setdefault(int(ev.step), {})[tag] = float(ev.value)
    for tag in tags.get("tensors", []):  # add_scalar(..., new_style=True): a scalar tensor
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        for ev in acc.Tensors(tag):
            value = tensor_util.make_ndarray(ev.tensor_proto)
            if value.size == 1:
                steps.setdefault(int(ev.step), {})[tag] = float(value.reshape(-1)[0])
    return [{"step": step, **steps[step]} for step in sorted(steps)]


def read_metrics(file) -> list:
    """Read a metrics log, one record per step (the formats of the module docstring).

    Parameters
    ----------
    file : str or path
        A TensorBoard event file (``*tfevents*``) or folder, ``.csv``, ``.json``, ``.parquet``, or
        JSON Lines (any other name; ``.gz`` through gzip).

    Returns
    -------
    list
        One record per step, a dict keyed by the framework's names, or an
        :class:`UnreadableRecord` where a line or row could not be read.

    Raises
    ------
    ValueError
        A missing or unreadable file, a reader library that is not installed (naming the extra to
        install), or no readable record; the message names the file.
    """
    path = Path(file)
    name = path.name.lower()
    if path.is_dir() or "tfevents" in name:
        if not path.exists():
            raise ValueError(f"{file}: no such file")
        records = _tensorboard(path)
        if not records:
            raise ValueError(
                f"{file}: no scalars in it (not a TensorBoard event file, or one without add_scalar)"
            )
    elif name.endswith(".parquet"):
        if not path.is_file():
            raise ValueError(f"{file}: no such file")
        records = _parquet(path)
    else:
        text = _read_text(path)
        suffix = Path(name.removesuffix(".gz")).suffix
        records = (
            _csv(path, text)
            if suffix == ".csv"
            else _json(path, text)
            if suffix == ".json"
            else _jsonl(path, text)
        )
    readable = [r for r in records if isinstance(r, dict)]
    if not readable:
        bad = next((r for r in records if isinstance(r, UnreadableRecord)), None)
        raise ValueError(f"{bad.where}: {bad.problem}" if bad else f"{file}: no records")
    return records


def read_lengths(file) -> list[float]:
    """Read a length dump: numbers separated by commas or blanks (``ValueError`` naming a bad one)."""
    values = []
    for i, tok in enumerate(_read_text(Path(file)).replace(",", " ").split()):
        try:
            values.append(float(tok))
        except ValueError:
            raise ValueError(f"{file}: length {i + 1}: expected a number, got {tok!r}") from None
    if not values:
        raise ValueError(f"{file}: no lengths")
    return values
