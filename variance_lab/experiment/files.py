"""Files of the experiment, without PyTorch: sidecar names, settings, fingerprints, comparison.

A data set is a data file in the toolkit's format (:mod:`variance_lab.rollouts.io`) plus a JSON
sidecar beside it (:func:`sidecar_path`) recording the seed, every setting and a
fingerprint of the numbers (:func:`numbers_sha256`). :func:`compare_files` checks that a
rerun reproduces a data set.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from variance_lab.rollouts.io import load_batch

__all__ = ["SIDECAR_KIND", "compare_files", "numbers_sha256", "read_sidecar", "sidecar_path"]

#: The ``kind`` field of a data set's sidecar.
SIDECAR_KIND = "variance_lab.experiment rollouts"
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
