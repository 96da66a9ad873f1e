"""Files of the experiment, without PyTorch: sidecar names, settings, fingerprints, comparison.

A data set is a data file in the toolkit's format (:mod:`variance_lab.rollouts.io`) plus a JSON
sidecar beside it (:func:`sidecar_path`) recording the seed, every setting and a
fingerprint of the numbers (:func:`numbers_sha256`). :func:`compare_files` checks that a
rerun reproduces a data set; :func:`version_differences` and :func:`version_warning` say,
before a rerun, when it cannot (other versions or another processor than the sidecar's).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np

from variance_lab.rollouts.io import load_batch

__all__ = [
    "REPRODUCTION_KEYS",
    "SIDECAR_KIND",
    "compare_files",
    "cpu_model",
    "numbers_sha256",
    "read_sidecar",
    "sidecar_path",
    "version_differences",
    "version_warning",
]

#: The ``kind`` field of a data set's sidecar.
SIDECAR_KIND = "variance_lab.experiment rollouts"
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


def numbers_sha256(records) -> str:
    """SHA-256 of the ids and log-probs of the records, as JSON text (an exact fingerprint).

    Parameters
    ----------
    records : iterable of dict

    Returns
    -------
    str
    """
    h = hashlib.sha256()
    for rec in records:
        h.update(json.dumps([rec["id"], list(rec["logp"]), list(rec["old_logp"])]).encode())
        h.update(b"\n")
    return h.hexdigest()


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
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read settings from {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object")
    if "kind" in data and data["kind"] != SIDECAR_KIND:
        raise ValueError(f"{str(path)!r} is a {data['kind']!r} file, not an experiment sidecar")
    return data if "settings" in data else {"settings": data}


def cpu_model() -> str:
    """Return the processor's model name (``/proc/cpuinfo`` on Linux, else the platform's).

    A sidecar's ``versions["cpu"]`` (:func:`variance_lab.experiment.collect.versions`); the
    benchmark suite prints it too.
    """
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


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
        This run's versions (:func:`variance_lab.experiment.collect.versions`).
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
