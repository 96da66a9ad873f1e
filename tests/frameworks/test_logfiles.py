"""Tests of variance_lab.frameworks.logfiles: reading a run's log in the formats users keep it in."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from variance_lab.frameworks import logfiles


def test_read_metrics_skips_blank_lines(tmp_path):
    """Read records skips blank lines."""
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert logfiles.read_metrics(str(f)) == [{"a": 1}, {"a": 2}]


def test_read_metrics_csv_and_bad_lines(tmp_path):
    """CSV rows leave empty cells out; a line that is not an object is kept as an UnreadableRecord."""
    f = tmp_path / "r.csv"
    f.write_text("step,kl\n1,0.5\n2,\n3,0.1,9\n")
    records = logfiles.read_metrics(f)
    assert records[:2] == [{"step": "1", "kl": "0.5"}, {"step": "2"}]
    assert records[2] == logfiles.UnreadableRecord(
        f"{f}: record 3 (line 4)", "more values than the header has names"
    )
    f.write_text("step,kl\n1,0.5\n2," + "9" * 200_000 + "\n3,0.1\n")  # past csv's field size limit
    records = logfiles.read_metrics(f)
    assert records[0] == {"step": "1", "kl": "0.5"}
    assert records[1].problem.startswith("not CSV: field larger than field limit")
    assert records[2] == {"step": "3", "kl": "0.1"}
    g = tmp_path / "r.jsonl"
    g.write_text('{"a": 1}\n\n[1]\n{"a": 2\n{"a": 3}\n')
    assert logfiles.read_metrics(g) == [
        {"a": 1},
        logfiles.UnreadableRecord(f"{g}: record 2 (line 3)", "expected an object of metrics"),
        logfiles.UnreadableRecord(f"{g}: record 3 (line 4)", "not JSON: Expecting ',' delimiter"),
        {"a": 3},
    ]
    g.write_text("[1]\n")
    with pytest.raises(ValueError, match=r"record 1 \(line 1\): expected an object"):  # nothing readable
        logfiles.read_metrics(g)
    with pytest.raises(ValueError, match="no such file"):
        logfiles.read_metrics(tmp_path / "none.jsonl")


def test_read_lengths(tmp_path):
    """A length dump: numbers separated by commas or blanks; a bad one is named."""
    f = tmp_path / "l.txt"
    f.write_text("100 200, 300\n400\n")
    assert logfiles.read_lengths(f) == [100.0, 200.0, 300.0, 400.0]
    f.write_text("100 x\n")
    with pytest.raises(ValueError, match="length 2: expected a number, got 'x'"):
        logfiles.read_lengths(f)


VERL_STEP = {"rollout_corr/kl": 0.001, "rollout_corr/chi2_token": 0.004, "rollout_corr/chi2_seq": 1.5}


def _verl_file_logger(path, steps) -> None:
    r"""Write what verl 0.9.1's FileLogger.log writes (verl/utils/tracking.py lines 543-545).

    ``orjson.dumps({"step": step, "data": data}) + b"\\n"`` a call: compact JSON, NaN as null
    (orjson itself is not a dependency; json with compact separators writes the same bytes here).
    """
    with open(path, "wb") as fp:
        for step, data in steps:
            fp.write(json.dumps({"step": step, "data": data}, separators=(",", ":")).encode() + b"\n")


def test_verl_file_logger_output_is_read(tmp_path):
    """The lines {"step": N, "data": {...}} of verl are read as the step's metrics; validation records too."""
    f = tmp_path / "exp.jsonl"
    _verl_file_logger(
        f, [(1, VERL_STEP), (1, {"val-core/acc": 0.5}), (2, VERL_STEP | {"rollout_corr/k3_kl": None})]
    )
    records = logfiles.read_metrics(f)
    assert records == [
        {"step": 1, **VERL_STEP},
        {"step": 1, "val-core/acc": 0.5},
        {"step": 2, **VERL_STEP, "rollout_corr/k3_kl": None},
    ]
    assert logfiles.detect_framework(records) == "verl"


def test_unknown_keys_are_named(tmp_path):
    """A log with no known metric names the keys it does have."""
    with pytest.raises(
        ValueError, match=r"no known token-level metric in the records \(their keys: step, loss\)"
    ):
        logfiles.detect_framework([{"step": 1, "loss": 0.1}])


def test_tensorboard_event_files_are_read(tmp_path):
    """Scalars written as verl's tensorboard logger writes them (SummaryWriter.add_scalar per key)."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "tensorboard_log" / "proj" / "exp"
    writer = SummaryWriter(str(run))
    for step in (1, 2, 3):  # verl/utils/tracking.py _TensorboardAdapter.log
        data = {k: v * step for k, v in VERL_STEP.items()}
        for key in data:
            writer.add_scalar(key, data[key], step)
    writer.add_scalar("rollout_corr/k3_kl", 0.002, 2, new_style=True)  # a scalar stored as a tensor
    writer.close()
    for where in (run, next(run.glob("events.out.tfevents.*")), tmp_path / "tensorboard_log"):
        records = logfiles.read_metrics(where)
        assert [r["step"] for r in records] == [1, 2, 3]
        for r in records:  # TensorBoard keeps float32
            for key, value in VERL_STEP.items():
                assert r[key] == float(np.float32(value * r["step"]))
        assert records[1]["rollout_corr/k3_kl"] == float(np.float32(0.002))
    (tmp_path / "tensorboard_log" / "proj" / "other").mkdir()
    SummaryWriter(str(tmp_path / "tensorboard_log" / "proj" / "other")).close()
    with pytest.raises(ValueError, match="its runs are in proj/exp, proj/other: pass one of them"):
        logfiles.read_metrics(tmp_path / "tensorboard_log")
    garbage = tmp_path / "events.out.tfevents.0.garbage"
    garbage.write_bytes(bytes(range(256)) * 2)
    with pytest.raises(ValueError, match="no scalars in it"):
        logfiles.read_metrics(garbage)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no TensorBoard event file here \(no event file in it\)"):
        logfiles.read_metrics(tmp_path / "empty")


def test_missing_reader_library_names_the_extra(tmp_path, monkeypatch):
    """Without tensorboard (or pyarrow), one ValueError naming the extra to install."""
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")] + [
        "tensorboard"
    ]:
        monkeypatch.setitem(sys.modules, name, None)  # importing any of them raises ImportError
    f = tmp_path / "events.out.tfevents.1.host"
    f.write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"needs the tensorboard package: pip install 'variance_lab\[logs\]'"
    ):
        logfiles.read_metrics(f)
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")] + ["pyarrow"]:
        monkeypatch.setitem(sys.modules, name, None)
    g = tmp_path / "history.parquet"
    g.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"pip install 'variance_lab\[logs\]'"):
        logfiles.read_metrics(g)


def _history():
    """Return what W&B's run.history() returns: _step, _runtime, _timestamp, NaN where not logged."""
    return pd.DataFrame(
        {
            "_step": [0, 1, 2],
            "_runtime": [10.0, 20.0, 30.0],
            "_timestamp": [1.7e9, 1.7e9 + 10, 1.7e9 + 20],
            "rollout_corr/chi2_token": [0.004, np.nan, 0.005],
            "rollout_corr/chi2_seq": [1.5, np.nan, 1.25],
            "val-core/acc": [np.nan, 0.5, np.nan],
        }
    )


def test_wandb_history_exports_are_read(tmp_path):
    """run.history() saved as W&B's guide does (to_csv), as JSON (records or pandas' default), as Parquet."""
    hist = _history()
    want = [
        {"_step": 0, "rollout_corr/chi2_token": 0.004, "rollout_corr/chi2_seq": 1.5},
        {"_step": 1, "val-core/acc": 0.5},
        {"_step": 2, "rollout_corr/chi2_token": 0.005, "rollout_corr/chi2_seq": 1.25},
    ]

    def metrics(records):
        return [
            {
                k: float(v)
                for k, v in r.items()
                if k and v is not None and not k.startswith(("_runtime", "_time"))
            }
            for r in records
        ]

    hist.to_csv(tmp_path / "metrics.csv")  # W&B: "Export metrics from a single run to a CSV file"
    hist.to_json(tmp_path / "records.json", orient="records")
    hist.to_json(tmp_path / "columns.json")
    hist.to_parquet(tmp_path / "history.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1" + bytes(range(256)) + b"PAR1")
    with pytest.raises(ValueError, match=r"bad\.parquet: not a readable Parquet file"):
        logfiles.read_metrics(tmp_path / "bad.parquet")
    for name in ("metrics.csv", "records.json", "columns.json", "history.parquet"):
        assert metrics(logfiles.read_metrics(tmp_path / name)) == [
            {k: float(v) for k, v in r.items()} for r in want
        ], name


def test_wandb_panel_export_is_read(tmp_path):
    """The CSV the W&B UI exports from a line plot: Step, '<run> - <metric>' and its __MIN/__MAX columns."""
    f = tmp_path / "panel.csv"
    f.write_text(
        '"Step","brisk-pond-1 - rollout_corr/chi2_seq","brisk-pond-1 - rollout_corr/chi2_seq__MIN",'
        '"brisk-pond-1 - rollout_corr/chi2_seq__MAX"\n"3","1.5","1.5","1.5"\n"4","","",""\n'
    )
    assert logfiles.read_metrics(f) == [{"Step": "3", "rollout_corr/chi2_seq": "1.5"}, {"Step": "4"}]
    f.write_text(
        '"Step","a - x","a - x__MIN","a - x__MAX","b - x","b - x__MIN","b - x__MAX"\n1,2,2,2,3,3,3\n'
    )
    with pytest.raises(ValueError, match=r"a W&B panel export of 2 runs \(a, b\): export one run's history"):
        logfiles.read_metrics(f)


def test_field_number_refuses_what_is_not_a_finite_number():
    """A bool, a list, NaN text, an integer past the float range: a ValueError each, the value cut short."""
    rec = {"a": True, "b": [1, 2], "c": "nan", "d": 10**400, "e": " 2.5 "}
    for key, expected in (
        ("a", "a number"),
        ("b", "a number"),
        ("c", "a finite number"),
        ("d", "a finite number"),
    ):
        with pytest.raises(ValueError, match=f"r: field '{key}': expected {expected}, got ") as err:
            logfiles.field_number(rec, key, "r")
        assert len(str(err.value)) < 110
    assert logfiles.field_number(rec, "e", "r") == 2.5


def test_gzipped_jsonl_and_a_corrupt_one(tmp_path):
    """A .jsonl.gz is read through gzip; a corrupt one is one line naming the file."""
    import gzip

    f = tmp_path / "run.jsonl.gz"
    with gzip.open(f, "wt") as fh:
        fh.write('{"step": 1, "mismatch_kl": 0.001}\n')
    assert logfiles.read_metrics(f) == [{"step": 1, "mismatch_kl": 0.001}]
    data = f.read_bytes()
    f.write_bytes(data[:12] + bytes(len(data) - 12))
    with pytest.raises(ValueError, match=r"run\.jsonl\.gz: cannot read it"):
        logfiles.read_metrics(f)
