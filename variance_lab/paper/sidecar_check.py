"""``variance-lab figures --check``: rebuild each figure from its sidecar and compare, writing nothing.

A sidecar vouches for its data files twice: by their SHA-256 (``data_sha256``, the committed
file's fingerprint, the same on every machine: a mismatch is a failure) and by the parameters
that rebuild them (:func:`variance_lab.paper.pipeline.from_sidecar`), whose numbers are compared
with the recorded ones within :mod:`variance_lab.paper.compare`'s tolerances.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from variance_lab.paper.compare import FileComparison, compare_frames, sampler_promise
from variance_lab.paper.pipeline import from_sidecar, read_figure_sidecar
from variance_lab.provenance import file_sha256
from variance_lab.simulate import Engine

__all__ = ["CHECK_DPI", "SidecarCheck", "check", "fingerprint_problem", "recorded_fingerprints"]


#: PNG resolution of the throw-away images :func:`check` draws (only the data are compared):
#: small, yet large enough for FreeType to size the smallest mathtext glyph (at 10 dpi a
#: subscript is under one pixel and matplotlib fails).
CHECK_DPI = 36


def check(path: str | os.PathLike, *, engine: Engine | None = None, only=None) -> list[SidecarCheck]:
    """Rebuild a sidecar's figure in a temporary folder and compare its data with the recorded data.

    Each recorded data file (CSV) must have the SHA-256 its sidecar records
    (:func:`recorded_fingerprints`; else it ``differs``, :func:`fingerprint_problem`); then it is
    compared with the rebuilt one number by number (:mod:`variance_lab.paper.compare`:
    ``identical``, ``equal within tolerance`` or ``differs``), and differing package, library or
    machine versions are reported as notes.
    Writes nothing where the sidecar lives. ``path`` is a sidecar or a folder of them (every
    ``*.json`` that is a figure sidecar; with ``only``, a collection of figure names, just
    those figures' sidecars).

    Returns
    -------
    list of SidecarCheck
        One per sidecar; its ``ok`` is False when a data file differs or does not match its
        recorded fingerprint.
    """
    path = Path(path)
    sidecars = _sidecars_in(path) if path.is_dir() else {path: read_figure_sidecar(path)}
    if only is not None and path.is_dir():
        wanted = set(only)
        sidecars = {p: old for p, old in sidecars.items() if old["figure"] in wanted}
    if not sidecars:
        raise ValueError(f"{str(path)!r} holds no figure sidecar")
    results = []
    for side, old in sidecars.items():
        with tempfile.TemporaryDirectory() as tmp:
            from_sidecar(side, tmp, engine=engine, formats=("png",), dpi=CHECK_DPI)
            new = json.loads((Path(tmp) / side.name).read_text())
            files = tuple(_compare_data(side.parent, Path(tmp), old, new))
        results.append(SidecarCheck(side.name, files, tuple(_version_notes(old, new))))
    return results


@dataclass(frozen=True)
class SidecarCheck:
    """What :func:`check` found for one sidecar: its data files' verdicts and version notes."""

    sidecar: str
    files: tuple[FileComparison, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True unless a data file differs."""
        return all(f.ok for f in self.files)


def _data_files(sidecar: dict) -> list[str]:
    return [name for name in sidecar.get("files", {}).values() if str(name).endswith(".csv")]


def recorded_fingerprints(sidecar: dict) -> dict[str, str]:
    """Return the SHA-256 a figure sidecar records for each of its data files, by file name.

    A figure's sidecar records one ``data_sha256`` (of ``files["data"]``); the experiment's
    figure one per data file, keyed like ``files`` (``{"csv": ..., "curves": ...}``).

    Parameters
    ----------
    sidecar : dict

    Returns
    -------
    dict
        ``{file name: hexadecimal SHA-256}``; empty when the sidecar records none.
    """
    files, recorded = sidecar.get("files", {}), sidecar.get("data_sha256")
    if isinstance(recorded, str):
        return {files["data"]: recorded} if "data" in files else {}
    if isinstance(recorded, dict):
        return {files[key]: value for key, value in recorded.items() if key in files}
    return {}


def fingerprint_problem(path: Path, recorded: str | None) -> str | None:
    """Say how the data file ``path`` differs from the SHA-256 its sidecar records, or None when it matches.

    The committed data file is the same file on every machine, so its fingerprint must match
    whatever the numbers of a rebuild are.

    Parameters
    ----------
    path : Path
        The recorded (committed) data file.
    recorded : str or None
        The sidecar's ``data_sha256`` of it (None: not recorded, nothing to check).

    Returns
    -------
    str or None
    """
    if recorded is None:
        return None
    actual = file_sha256(path)
    if actual == recorded:
        return None
    return f"{str(path)!r} has SHA-256 {actual}, but its sidecar records data_sha256 {recorded}"


def _compare_data(recorded: Path, rebuilt: Path, old: dict, new: dict):
    promise = sampler_promise(old.get("versions", {}), new.get("versions", {}))
    level = float(old.get("params", {}).get("ci", 0.95))
    fingerprints = recorded_fingerprints(old)
    for name in _data_files(old):
        if not (recorded / name).is_file():
            yield FileComparison(name, "differs", problems=(f"{str(recorded / name)!r} is missing",))
            continue
        problem = fingerprint_problem(recorded / name, fingerprints.get(name))
        if problem is not None:
            yield FileComparison(name, "differs", problems=(problem,))
            continue
        if (recorded / name).read_bytes() == (rebuilt / name).read_bytes():
            yield FileComparison(name, "identical")
            continue
        frames = pd.read_csv(recorded / name), pd.read_csv(rebuilt / name)
        yield compare_frames(name, *frames, promise=promise, level=level)


def _version_notes(old: dict, new: dict) -> list[str]:
    lines = []
    if old.get("version") != new.get("version"):
        lines.append(f"variance_lab version differs: sidecar {old.get('version')}, now {new.get('version')}")
    before, now = old.get("versions", {}), new.get("versions", {})
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            what = key if key in ("machine", "cpu") else f"{key} version"
            lines.append(f"{what} differs: sidecar {before.get(key, 'not recorded')}, now {now.get(key)}")
    return lines


def _sidecars_in(folder: Path) -> dict[Path, dict]:
    """Every figure sidecar among ``folder``'s ``*.json`` files, read once, by path (sorted)."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            found[path] = read_figure_sidecar(path)
        except ValueError:
            continue
    return found
