"""``variance-lab analyze`` on the shipped data files: every number as before the work on scale (issue #36).

The reference (``tests/data/rollouts/shipped_analysis.json.gz``) is the JSON output of
``variance-lab analyze FILE --table-format json`` at its defaults, written by
``tools/shipped_analysis.py`` from commit 6e37269 (the start of that work) with BLAS on one
thread, as ``analyze`` now runs it (:func:`variance_lab.provenance.one_blas_thread`). Every value it holds
must come out the same, bit for bit: numbers as floats equal (NaN where NaN), strings and
integers equal, lists of the same length. The output may hold keys the reference does not
(:data:`NEW_KEYS`, named here); none of the reference's may go. The files are small (at most
171,000 tokens and 2,048 sequences), so no fit samples them
(:mod:`variance_lab.rollouts.subsample`): nothing may change.

One file runs by default (about 10 s); all nine under ``-m slow``.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from variance_lab.cli import main
from variance_lab.provenance import versions

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "rollouts" / "shipped_analysis.json.gz"

#: The processor the reference was written and checked on, bit for bit (``provenance.cpu_model``):
#: there the numbers must be identical; on another processor (other SIMD paths) floats may differ
#: in their last bits, so there they are held to
#: :data:`CROSS_MACHINE_REL` (the house rule: no byte-for-byte float comparison across machines).
REFERENCE_CPU = "AMD EPYC"
CROSS_MACHINE_REL = 1e-9


def _cpu_flags() -> set:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.partition(":")[2].split())


#: The reference's machine: an AMD EPYC with AVX-512 (Zen 4); BLAS on one thread, as ``analyze``
#: pins it, so the number of cores does not matter.
SAME_MACHINE = versions(("cpu",))["cpu"] == REFERENCE_CPU and "avx512f" in _cpu_flags()

#: Keys of the summary added since the reference was written.
NEW_KEYS = {"fit_sample"}

#: The file checked by default: the quickest, with rollout log-probs (the three-policy split).
QUICK = "data/smollm2/smollm2_mismatch_top-p.jsonl.gz"


def _reference() -> dict:
    with gzip.open(REFERENCE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def differences(ref, new, path: str = "", rel: float = 0.0) -> list[str]:
    """Where ``new`` differs from ``ref``: every value of ``ref`` must be in ``new``, equal.

    ``rel``: floats may differ by this much relative (0: bit for bit).
    """
    if isinstance(ref, dict):
        if not isinstance(new, dict):
            return [f"{path}: a {type(new).__name__}, not an object"]
        out = [f"{path}/{k}: missing" for k in ref if k not in new]
        return out + [d for k in ref if k in new for d in differences(ref[k], new[k], f"{path}/{k}", rel)]
    if isinstance(ref, list):
        if not isinstance(new, list) or len(new) != len(ref):
            return [f"{path}: not a list of {len(ref)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(ref, new, strict=True))
            for d in differences(a, b, f"{path}[{i}]", rel)
        ]
    if isinstance(ref, float) and isinstance(new, float) and math.isnan(ref) and math.isnan(new):
        return []
    if rel and isinstance(ref, float) and isinstance(new, float) and math.isclose(ref, new, rel_tol=rel):
        return []
    if type(ref) is not type(new) or ref != new:
        return [f"{path}: {ref!r} before, {new!r} now"]
    return []


def _analyze(name: str, tmp_path: Path) -> dict:
    out = tmp_path / "out.json"
    assert main(["analyze", str(ROOT / name), "--table-format", "json", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_reference_names_its_commit_and_every_file():
    """The reference says where it came from, and holds the nine shipped files."""
    ref = _reference()
    assert ref["commit"].startswith("6e37269")
    assert ref["blas_threads"] == 1
    assert len(ref["files"]) == 9
    assert all((ROOT / name).is_file() for name in ref["files"])


def test_the_comparison_sees_a_changed_number_a_nan_and_a_lost_key():
    """The checker itself: one ulp, a NaN for a number and a missing key are all differences."""
    ref = {"a": [1.0, float("nan")], "b": {"c": 0.1, "d": "x"}}
    assert differences(ref, json.loads(json.dumps(ref))) == []
    assert differences(ref, {"a": [math.nextafter(1.0, 2.0), float("nan")], "b": {"c": 0.1, "d": "x"}})
    assert differences(ref, {"a": [1.0, 1.0], "b": {"c": 0.1, "d": "x"}})
    assert differences(ref, {"a": [1.0, float("nan")], "b": {"c": 0.1}}) == ["/b/d: missing"]
    assert differences(ref, {"a": [1.0, float("nan")], "b": {"c": 0.1, "d": "x"}, "e": 1}) == []
    near = {"a": [1.0 + 1e-12, float("nan")], "b": {"c": 0.1, "d": "x"}}
    assert differences(ref, near)
    assert differences(ref, near, rel=1e-9) == []
    assert differences(ref, {"a": [1.0 + 1e-6, float("nan")], "b": {"c": 0.1, "d": "x"}}, rel=1e-9)


def _check(name: str, tmp_path: Path) -> None:
    ref = _reference()["files"][name]
    new = _analyze(name, tmp_path)
    assert differences(ref, new, rel=0.0 if SAME_MACHINE else CROSS_MACHINE_REL) == []
    assert set(new["summary"]) - set(ref["summary"]) == NEW_KEYS
    assert new["summary"]["fit_sample"]["tokens"]["subsampled"] is False
    assert new["summary"]["fit_sample"]["sequences"]["subsampled"] is False


def test_analyze_of_a_shipped_file_is_unchanged(tmp_path):
    """The quickest shipped file, with rollout log-probs: every number as at 6e37269."""
    _check(QUICK, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in json.loads(gzip.decompress(REFERENCE.read_bytes()))["files"]])
def test_analyze_of_every_shipped_file_is_unchanged(name, tmp_path):
    """All nine shipped files (about 2 CPU minutes)."""
    _check(name, tmp_path)
