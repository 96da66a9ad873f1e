"""A run's log: what each framework logs under which name, and reading the file of one record per step.

The names (:data:`TOKEN_METRICS`, :data:`SEQUENCE_METRICS`, :data:`DEFAULT_RATIO_LEVEL`) are the
frameworks' own; :mod:`variance_lab.frameworks.logged` judges the numbers logged under them. A log
is one record per step: JSONL (one object per line) or CSV with a header (:func:`read_metrics`);
a length dump is numbers separated by commas or blanks (:func:`read_lengths`). Bad input raises
``ValueError`` naming the file, the record and the field.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from variance_lab._validate import NonFiniteError, parse_float

__all__ = [
    "DEFAULT_RATIO_LEVEL",
    "FRAMEWORKS",
    "SEQUENCE_METRICS",
    "TOKEN_METRICS",
    "SequenceMetric",
    "detect_framework",
    "field_number",
    "find_metric",
    "read_lengths",
    "read_metrics",
]

#: Frameworks and their token-level metrics: logged name -> kind (the kinds are the table of
#: :mod:`variance_lab.frameworks.logged`).
TOKEN_METRICS: dict[str, dict[str, str]] = {
    "verl": {"rollout_corr/kl": "kl", "rollout_corr/chi2_token": "chi2", "rollout_corr/k3_kl": "k3"},
    "trl": {"sampling/sampling_logp_difference/mean": "absdiff"},
    "nemo-rl": {"token_mult_prob_error": "mult", "gen_kl_error": "k3"},
    "prime-rl": {"mismatch_kl": "k3"},
    "slime": {"tis_abs": "tis_abs"},
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
    "slime": (),
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

#: Framework names accepted by :func:`variance_lab.frameworks.logged.analyze_logged`.
FRAMEWORKS = tuple(TOKEN_METRICS)


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
    best, count = None, 0
    for fw, kinds in TOKEN_METRICS.items():
        c = sum(find_metric(r, n) is not None for r in records[:20] for n in kinds)
        if c > count:
            best, count = fw, c
    if best is None:
        raise ValueError(
            "no known token-level metric in the records: expected e.g. rollout_corr/k3_kl (verl), "
            "token_mult_prob_error (nemo-rl), mismatch_kl (prime-rl); pass framework="
        )
    return best


def field_number(record: dict, key: str, where: str) -> float:
    """Return ``record[key]`` as a finite float (``ValueError`` naming ``where`` and the field if not).

    A number or its text, read by the one float rule (:func:`~variance_lab._validate.parse_float`);
    a bool is refused.
    """
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{where}: field {key!r}: expected a number, got {v!r}")
    try:
        return parse_float(v, key)
    except NonFiniteError:
        expected = "a finite number"
    except ValueError:
        expected = "a number"
    raise ValueError(f"{where}: field {key!r}: expected {expected}, got {v!r}") from None


# --------------------------------------------------------------------------------------
# the files
# --------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None


def read_metrics(file) -> list[dict]:
    """Read a metrics log: JSONL (one object per line; blank lines skipped) or CSV with a header.

    Parameters
    ----------
    file : str or path
        ``.csv`` is read as CSV (empty cells left out of the record), anything else as JSONL.

    Returns
    -------
    list of dict
        One record per step, keyed by the framework's names.

    Raises
    ------
    ValueError
        A missing or unreadable file, a line that is not a JSON object, a CSV row longer than
        its header, or no records; the message names the file and the record.
    """
    path = Path(file)
    text = _read_text(path)
    records = []
    if path.suffix.lower() == ".csv":
        for i, row in enumerate(csv.DictReader(text.splitlines())):
            if None in row:
                raise ValueError(f"{file}: record {i + 1}: more values than the header has names")
            records.append({k: v for k, v in row.items() if v not in ("", None)})
    else:
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            where = f"{file}: record {len(records) + 1} (line {i + 1})"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON: {exc.msg}") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected an object of metrics")
            records.append(rec)
    if not records:
        raise ValueError(f"{file}: no records")
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
