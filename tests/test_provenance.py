"""provenance: versions, fingerprints, sidecar files and PyTorch determinism, in one module."""

import json

import numpy as np
import pytest

from variance_lab import __version__
from variance_lab.provenance import (
    FIGURE_VERSIONS,
    TORCH_VERSIONS,
    cpu_model,
    file_sha256,
    numbers_sha256,
    read_json_object,
    sidecar_text,
    text_sha256,
    torch_generator,
    versions,
    write_sidecar,
)


def test_versions_follow_the_keys_in_order():
    """``versions`` gives the named keys in order; a figure's end with the processor's name."""
    got = versions()
    assert tuple(got) == FIGURE_VERSIONS
    assert got["numpy"] == np.__version__
    assert got["cpu"] == cpu_model()
    assert versions(("variance_lab", "python"))["variance_lab"] == __version__
    assert tuple(versions(("machine", "numpy"))) == ("machine", "numpy")


def test_torch_versions_name_the_kernels():
    """The PyTorch experiments' versions record the instruction set PyTorch dispatches to."""
    torch = pytest.importorskip("torch")
    got = versions(TORCH_VERSIONS)
    assert tuple(got) == TORCH_VERSIONS
    assert got["torch"] == torch.__version__
    assert got["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_text_and_file_fingerprints_agree(tmp_path):
    """The SHA-256 of a text is that of the file it is written to, read in any chunk size."""
    text = "T,value\n1,0.5\n10,2.25\n" * 100
    path = tmp_path / "x.csv"
    path.write_text(text)
    assert text_sha256(text) == file_sha256(path) == file_sha256(path, chunk=7)
    assert text_sha256(text) != text_sha256(text + "\n")


def test_numbers_fingerprint_reads_ids_and_log_probs_only():
    """numbers_sha256 changes with an id or a log-prob, not with other fields."""
    records = [{"id": "0-0", "logp": [-0.5, -0.25], "old_logp": [-0.5, -0.3], "reward": 1.0}]
    base = numbers_sha256(records)
    assert numbers_sha256([{**records[0], "reward": 0.0, "prompt": "x"}]) == base
    assert numbers_sha256([{**records[0], "logp": [-0.5, -0.2500001]}]) != base
    assert numbers_sha256([{**records[0], "id": "0-1"}]) != base


def test_sidecar_text_round_trips_in_order(tmp_path):
    """A sidecar is indented JSON with its keys in order and a final newline; it reads back equal."""
    sidecar = {"b": 1, "a": [1.5, None], "c": {"z": "x"}}
    assert sidecar_text(sidecar) == json.dumps(sidecar, indent=1) + "\n"
    path = write_sidecar(tmp_path / "s.json", sidecar)
    assert path.read_text() == sidecar_text(sidecar)
    assert list(read_json_object(path)) == ["b", "a", "c"]


def test_read_json_object_names_the_file(tmp_path):
    """Missing, malformed or non-object files are a ValueError naming the file."""
    with pytest.raises(ValueError, match=r"cannot read settings from .*missing\.json"):
        read_json_object(tmp_path / "missing.json", "settings")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read a sidecar from .*bad\.json"):
        read_json_object(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"bad\.json' does not hold a JSON object"):
        read_json_object(bad)


def test_torch_generator_depends_on_the_seed_sequence_alone():
    """Two generators from equal seed sequences draw the same numbers; another stream draws others."""
    torch = pytest.importorskip("torch")
    a, b, c = (np.random.SeedSequence(7).spawn(2)[i] for i in (0, 0, 1))
    draw = [torch.rand(4, generator=torch_generator(ss)) for ss in (a, b, c)]
    assert torch.equal(draw[0], draw[1])
    assert not torch.equal(draw[0], draw[2])


def test_importing_provenance_loads_no_torch():
    """Provenance is on the ground floor: PyTorch is imported inside its two torch functions only."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = "import sys, variance_lab.provenance as p; p.versions(); print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"
