"""Data sets of the two experiments, without PyTorch: sidecars, summaries, writing, comparison.

A data set (of the arithmetic experiment, :mod:`variance_lab.experiment`, or the SmolLM2
experiment, :mod:`variance_lab.lm`) is a data file in the toolkit's format
(:mod:`variance_lab.rollouts.io`) plus a JSON sidecar beside it (:func:`sidecar_path`) recording
the seed, every setting, the versions and a fingerprint of the numbers
(:func:`variance_lab.provenance.numbers_sha256`): both experiments build it with
:func:`dataset_sidecar` and write both files with :func:`write_dataset`. :func:`compare_files` checks that a
rerun reproduces a data set; :func:`version_differences` and :func:`version_warning` say,
before a rerun, when it cannot (other versions or another processor than the sidecar's).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from variance_lab.provenance import numbers_sha256, read_json_object, sidecar_text
from variance_lab.rollouts.io import detect_format, load_batch, write_records

__all__ = [
    "ARITH_SIDECAR_KIND",
    "REPRODUCTION_KEYS",
    "compare_files",
    "dataset_sidecar",
    "output_path",
    "read_sidecar",
    "sidecar_path",
    "summarize",
    "version_differences",
    "version_warning",
    "write_dataset",
]

#: The ``kind`` field of a data set's sidecar.
ARITH_SIDECAR_KIND = "variance_lab.experiment rollouts"
#: The keys of a sidecar's ``versions`` that decide a run's float32 numbers. Not
#: ``variance_lab``: its version string says nothing about whether the training code changed
#: (it stays put across commits, and a release need not touch training), and the slow tests
#: rerun the shipped sidecars with the current code, so a change that alters the numbers
#: fails there, not in a user's run.
REPRODUCTION_KEYS = ("torch", "numpy", "python", "machine", "cpu", "cpu_capability")
_NOT_RECORDED = "not recorded"
_DATA_SUFFIXES = (".jsonl.gz", ".ndjson.gz", ".jsonl", ".ndjson", ".parquet", ".pq", ".npz")


def sidecar_path(path) -> Path:
    """Return the sidecar of a data file: its name without the data suffix, plus ``.json``.

    Parameters
    ----------
    path : str or Path
        ``data/arith_rollouts.jsonl.gz`` gives ``data/arith_rollouts.json``.

    Returns
    -------
    Path
    """
    path = Path(path)
    name = path.name
    for suffix in _DATA_SUFFIXES:
        if name.lower().endswith(suffix):
            return path.with_name(name[: -len(suffix)] + ".json")
    return path.with_name(name + ".json")


def read_sidecar(path) -> dict:
    """Read a data set's sidecar (or a plain settings dict) and check its kind.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        The sidecar; a plain dict of settings comes back as ``{"settings": ...}``.
    """
    path = Path(path)
    data = read_json_object(path, "settings")
    if "kind" in data and data["kind"] != ARITH_SIDECAR_KIND:
        raise ValueError(f"{str(path)!r} is a {data['kind']!r} file, not an experiment sidecar")
    return data if "settings" in data else {"settings": data}


def _shown(value, missing: str) -> str:
    if value is None:
        return missing
    text = str(value)
    return text if text.strip() else repr(text)


def version_differences(recorded: dict, current: dict, keys=REPRODUCTION_KEYS) -> list[str]:
    """List the keys of ``keys`` whose version differs between a sidecar and this run.

    Parameters
    ----------
    recorded : dict
        The sidecar's ``versions``. A key it lacks (sidecars older than ``cpu`` and
        ``cpu_capability``) differs as ``not recorded``, since the sidecar then cannot vouch
        that this run computes the same float32 numbers.
    current : dict
        This run's versions (:func:`variance_lab.provenance.versions` of
        :data:`~variance_lab.provenance.TORCH_VERSIONS`).
    keys : sequence of str, optional
        The keys to compare; default :data:`REPRODUCTION_KEYS`.

    Returns
    -------
    list of str
        One ``"key: sidecar value -> this run's value"`` per differing key, in the order of
        ``keys``; empty when all agree. A key neither dict holds is skipped.
    """
    for name, value in (("recorded", recorded), ("current", current)):
        if not isinstance(value, dict):
            raise ValueError(f"{name} versions must be a dict, got {value!r}")
    out = []
    for key in keys:
        there, here = recorded.get(key), current.get(key)
        if there == here:  # equal, or neither recorded
            continue
        out.append(f"{key}: {_shown(there, _NOT_RECORDED)} -> {_shown(here, 'unknown')}")
    return out


def version_warning(recorded: dict, current: dict, source) -> str | None:
    """Return the one-line warning that a rerun of ``source`` will not reproduce its data set, or None.

    Parameters
    ----------
    recorded : dict
        The sidecar's ``versions``.
    current : dict
        This run's versions.
    source : str or Path
        The sidecar, named in the warning.

    Returns
    -------
    str or None
        None when :func:`version_differences` finds nothing. The data set "will likely
        differ" when a recorded value differs (a change that leaves the float32 kernels alone,
        a Python patch release say, may still reproduce it), and "may differ" when the only
        differences are keys the sidecar does not record.
    """
    differences = version_differences(recorded, current)
    if not differences:
        return None
    if any(recorded.get(key) not in (None, current.get(key)) for key in REPRODUCTION_KEYS):
        what, outcome = "was written with other versions or another processor than this run", "will likely"
    else:
        what, outcome = "does not record all that this run's float32 numbers depend on", "may"
    return (
        f"warning: {source} {what} ({'; '.join(differences)}); float32 training reproduces a data set "
        f"bit for bit only with the same versions on the same kind of processor, so this data set "
        f"{outcome} differ from the sidecar's"
    )


def compare_files(a, b) -> dict:
    """Compare two data files sequence by sequence.

    Parameters
    ----------
    a, b : str or Path
        Data files (any format :func:`~variance_lab.rollouts.io.load_batch` reads).

    Returns
    -------
    dict
        ``same_ids``, ``same_lengths`` (bool); ``max_abs_diff`` (largest absolute difference
        of any log-prob, ``inf`` when the layouts differ) and ``max_rel_diff`` (relative to
        the larger magnitude).
    """
    x, y = load_batch(a), load_batch(b)
    same_ids = x.ids.tolist() == y.ids.tolist()
    same_lengths = len(x) == len(y) and bool(np.array_equal(x.lengths, y.lengths))
    if not same_lengths:
        return {"same_ids": same_ids, "same_lengths": False, "max_abs_diff": np.inf, "max_rel_diff": np.inf}
    u = np.concatenate([x.logp, x.old_logp])
    v = np.concatenate([y.logp, y.old_logp])
    diff = np.abs(u - v)
    scale = np.maximum(np.maximum(np.abs(u), np.abs(v)), np.finfo(float).tiny)
    return {
        "same_ids": same_ids,
        "same_lengths": True,
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float((diff / scale).max()),
    }


def summarize(records: list[dict]) -> dict:
    """Size, lengths, rewards and pooled log-ratio moments of a data set.

    Parameters
    ----------
    records : list of dict

    Returns
    -------
    dict
    """
    lengths = np.array([len(r["logp"]) for r in records])
    d = np.concatenate([np.subtract(r["logp"], r["old_logp"]) for r in records])
    out = {
        "n_sequences": len(records),
        "n_tokens": int(lengths.sum()),
        "length_min": int(lengths.min()),
        "length_median": float(np.median(lengths)),
        "length_max": int(lengths.max()),
        "mean_log_ratio": float(d.mean()),
        "var_log_ratio": float(d.var(ddof=1)),
    }
    if all("rollout_logp" in r for r in records):
        m = np.concatenate([np.subtract(r["old_logp"], r["rollout_logp"]) for r in records])
        out["mean_mismatch_log_ratio"] = float(m.mean())
        out["var_mismatch_log_ratio"] = float(m.var(ddof=1))
    if all("reward" in r for r in records):
        out["mean_reward"] = float(np.mean([r["reward"] for r in records]))
    return out


def dataset_sidecar(
    kind: str, path, records: list[dict], facts: dict, *, after: dict | None = None, reproduce: str
) -> dict:
    """Build a data set's sidecar: the layout both experiments share.

    Keys, in order: ``kind``, ``sidecar_version`` (1), ``data_file`` (the name of ``path``), the
    experiment's own ``facts`` (seed, settings, versions, ...), ``numbers_sha256``
    (:func:`variance_lab.provenance.numbers_sha256`), ``summary`` (:func:`summarize`), ``after``
    and ``reproduce``.

    Parameters
    ----------
    kind : str
        What wrote it (:data:`ARITH_SIDECAR_KIND`, or :data:`variance_lab.lm.runs.LM_SIDECAR_KIND`).
    path : str or Path
        The data file.
    records : list of dict
    facts : dict
        The experiment's fields before the fingerprint.
    after : dict, optional
        Fields after the summary (the arithmetic experiment's training log).
    reproduce : str
        The command that writes the data set again.

    Returns
    -------
    dict
    """
    return {
        "kind": kind,
        "sidecar_version": 1,
        "data_file": Path(path).name,
        **facts,
        "numbers_sha256": numbers_sha256(records),
        "summary": summarize(records),
        **(after or {}),
        "reproduce": reproduce,
    }


def output_path(path) -> Path:
    """Return a data set's file name as a Path, checked before a run spends time on it.

    Parameters
    ----------
    path : str or Path
        A name :func:`~variance_lab.rollouts.io.detect_format` knows, in a folder that exists.

    Returns
    -------
    Path
        ``path`` itself, whose extension names a rollout format and whose folder exists.

    Raises
    ------
    ValueError
        For an unknown format or a missing folder (naming it).
    """
    path = Path(path)
    detect_format(path)
    if not path.parent.is_dir():
        raise ValueError(f"folder {str(path.parent)!r} does not exist")
    return path


def write_dataset(records: list[dict], path, sidecar: dict) -> tuple[Path, Path]:
    """Write the records (format from the name) and the sidecar, each atomically.

    Parameters
    ----------
    records : list of dict
    path : str or Path
        ``.jsonl``, ``.jsonl.gz``, ``.parquet`` or ``.npz`` (Parquet and NPZ keep only ``id``,
        ``logp`` and ``old_logp``).
    sidecar : dict
        Written (:func:`variance_lab.provenance.sidecar_text`) to :func:`sidecar_path` of ``path``.

    Returns
    -------
    (Path, Path)
        The data file and the sidecar.
    """
    path = output_path(path)
    side = sidecar_path(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".experiment-"))
    try:
        write_records(records, tmp / path.name)
        (tmp / side.name).write_text(sidecar_text(sidecar))
        os.replace(tmp / path.name, path)
        os.replace(tmp / side.name, side)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path, side
