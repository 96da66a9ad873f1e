"""The JSON Lines plumbing every reader shares (variance_lab/_jsonl.py)."""

from __future__ import annotations

import gzip
import math

import pytest

from variance_lab._jsonl import iter_jsonl, open_text, read_jsonl
from variance_lab.cli import main
from variance_lab.lm.analysis import read_records
from variance_lab.rollouts.presets import read_run


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz", "R.NDJSON.GZ"])
def test_plain_and_gzip_alike(tmp_path, name):
    """A .gz name (any case) is gzip, else plain text; blank lines skipped, NaN read, line numbers kept."""
    path = tmp_path / name
    with open_text(path, "w") as fh:
        fh.write('{"a": 1}\n\n  \n{"b": NaN}\n[3]\n')
    if name.lower().endswith(".gz"):
        with gzip.open(path) as fh:
            assert fh.read().startswith(b'{"a"')
    else:
        assert path.read_text().startswith('{"a"')
    got = list(iter_jsonl(path))
    assert [n for n, _ in got] == [1, 4, 5]
    assert got[0][1] == {"a": 1}
    assert math.isnan(got[1][1]["b"])
    assert got[2][1] == [3]
    assert read_jsonl(path)[2] == [3]


def test_bad_json_names_the_file_and_line_and_streams(tmp_path):
    """Invalid JSON is a ValueError naming the file and line, raised only when that line is reached."""
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write('{"a": 1}\n\n{"a": \n')
    lines = iter_jsonl(path)
    assert next(lines) == (1, {"a": 1})
    with pytest.raises(ValueError, match=r"^bad\.jsonl\.gz: line 3: invalid JSON \(Expecting value\)$"):
        next(lines)
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz: line 3: invalid JSON"):
        read_records(path)


def test_not_utf8_names_the_file(tmp_path):
    """Bytes that are not UTF-8 are a ValueError naming the file (not a bare codec error)."""
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(ValueError, match=r"^bin\.jsonl: not UTF-8 text \(at or after line \d\)$"):
        read_jsonl(path)


def test_every_reader_names_the_line(tmp_path):
    """The framework reader and the analysis's record reader give the same one-line error."""
    path = tmp_path / "train_data_step1.jsonl"
    path.write_text('{"idx": 0}\n{oops\n')
    for read in (lambda p: read_run(p, "nemo-rl"), read_records):
        with pytest.raises(ValueError, match=r"^train_data_step1\.jsonl: line 2: invalid JSON"):
            read(path)


def test_cli_bad_json_is_one_line(tmp_path, capsys):
    """On the command line a line that is not JSON is one line on stderr, exit status 2."""
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write('{"logp": [-1.0], "old_logp": [-1.0]}\n{"logp": [-1.0\n')
    assert main(["analyze", str(path), "--n-boot", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "r.jsonl.gz: line 2: invalid JSON" in err
