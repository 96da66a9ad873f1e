"""paper.sidecar_check: ``figures --check`` holds each committed data file to its recorded SHA-256."""

import json
import shutil
from pathlib import Path

import pytest

from variance_lab import cli
from variance_lab.paper.sidecar_check import fingerprint_problem, recorded_fingerprints
from variance_lab.provenance import file_sha256

FIGURES = Path(__file__).resolve().parents[2] / "figures"
WRONG = "0" * 64


def _copy(name: str, folder: Path) -> Path:
    """Copy a committed figure's sidecar and data files into ``folder``; return the sidecar."""
    side = json.loads((FIGURES / f"{name}.json").read_text())
    for file in side["files"].values():
        if file.endswith(".csv"):
            shutil.copyfile(FIGURES / file, folder / file)
    shutil.copyfile(FIGURES / f"{name}.json", folder / f"{name}.json")
    return folder / f"{name}.json"


def test_every_committed_data_file_matches_its_recorded_fingerprint():
    """Each committed figure's CSV files have the SHA-256 their sidecar records (one or one per file)."""
    sidecars = sorted(FIGURES.glob("*.json"))
    assert sidecars
    for side in sidecars:
        prints = recorded_fingerprints(json.loads(side.read_text()))
        assert prints, side.name
        for file, digest in prints.items():
            assert file.endswith(".csv")
            assert fingerprint_problem(FIGURES / file, digest) is None, file
            assert file_sha256(FIGURES / file) == digest
    experiment = recorded_fingerprints(json.loads((FIGURES / "experiment_variance.json").read_text()))
    assert sorted(experiment) == ["experiment_variance.csv", "experiment_variance_curves.csv"]


def test_fingerprint_problem_names_the_file_and_both_hashes(tmp_path):
    """A mismatch is one sentence naming the file, its SHA-256 and the recorded one; no record, no check."""
    path = tmp_path / "x.csv"
    path.write_text("a\n1\n")
    actual = file_sha256(path)
    assert fingerprint_problem(path, actual) is None
    assert fingerprint_problem(path, None) is None
    problem = fingerprint_problem(path, WRONG)
    assert str(path) in problem
    assert actual in problem
    assert WRONG in problem


def test_recorded_fingerprints_of_sidecars_without_one():
    """A sidecar without ``data_sha256`` (or without the file it names) records no fingerprint."""
    assert recorded_fingerprints({"files": {"data": "a.csv"}}) == {}
    assert recorded_fingerprints({"files": {}, "data_sha256": WRONG}) == {}
    assert recorded_fingerprints({"files": {"csv": "a.csv"}, "data_sha256": {"csv": WRONG, "x": WRONG}}) == {
        "a.csv": WRONG
    }


def test_check_fails_on_an_altered_fingerprint(tmp_path, capsys):
    """``figures --check``: an unaltered copy is identical (exit 0); an altered data_sha256 fails (exit 1).

    The failure is one stderr line naming the data file with both hashes, and the verdict counts it.
    """
    side = _copy("ratio_vs_T", tmp_path)
    argv = ["figures", "--check", "--from-sidecar", str(side), "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "ratio_vs_T.json: ratio_vs_T.csv: identical" in out
    assert out.strip().endswith(": OK")

    data = json.loads(side.read_text())
    right = data["data_sha256"]
    data["data_sha256"] = WRONG
    side.write_text(json.dumps(data, indent=1) + "\n")
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("ratio_vs_T.json: ratio_vs_T.csv: differs: ")
    assert str(tmp_path / "ratio_vs_T.csv") in line
    assert right in line
    assert WRONG in line
    assert "identical" not in captured.out
    assert captured.out.strip().endswith("1 differ")


@pytest.mark.parametrize("kind", ["csv", "curves"])
def test_experiment_figure_fingerprints_are_held_per_file(tmp_path, kind):
    """The experiment figure records one SHA-256 per CSV: altering either makes that file differ."""
    side = _copy("experiment_variance", tmp_path)
    data = json.loads(side.read_text())
    data["data_sha256"][kind] = WRONG
    prints = recorded_fingerprints(data)
    name = data["files"][kind]
    assert prints[name] == WRONG
    assert fingerprint_problem(tmp_path / name, prints[name]) is not None
    other = next(f for f in prints if f != name)
    assert fingerprint_problem(tmp_path / other, prints[other]) is None
