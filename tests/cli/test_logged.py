"""The ``variance-lab logged`` subcommand: reading a run's log, output formats, bad input as one line."""

from __future__ import annotations

import json
import math

import pytest

from variance_lab.cli import main

NEMO = {
    "step": 1,
    "train/token_mult_prob_error": 1.024,
    "train/sampling_importance_ratio": 0.0596,
    "train/is_oob_ratio": 0.011,
}


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_markdown_json_csv(tmp_path, capsys):
    """Markdown json csv."""
    f = _write_jsonl(tmp_path / "run.jsonl", [NEMO, NEMO | {"step": 2}])
    args = [
        f,
        "--batch-size",
        "256",
        "--lengths",
        "8000,10000",
        "--n-batches",
        "100",
        "--ratio-level",
        "sequence",
    ]
    assert main(["logged", *args]) == 0
    out = capsys.readouterr().out
    assert "sampling_importance_ratio" in out
    assert "marginal" in out
    assert "below" in out
    assert main(["logged", *args, "--table-format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in doc["laws"]] == [1.0, 2.0]
    assert {r["metric"] for r in doc["metrics"]} == {"sampling_importance_ratio", "is_oob_ratio"}
    assert main(["logged", *args, "--table-format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("record,step,metric,logged,predicted,lo,hi")
    assert len(lines) == 5


def test_csv_input_and_lengths_file(tmp_path, capsys):
    """Csv input and lengths file."""
    f = tmp_path / "run.csv"
    f.write_text("step,mismatch_kl\n1,0.001\n2,0.002\n")
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100 200, 300\n400\n")
    assert main(["logged", str(f), "--batch-size", "64", "--lengths-file", str(lengths)]) == 0
    out = capsys.readouterr().out
    assert "prime-rl" in out
    assert "mismatch_kl" in out
    assert "No sequence-level sample estimate" in out


def test_lengths_from_rollout_file(tmp_path, capsys):
    """Lengths from rollout file."""
    f = _write_jsonl(
        tmp_path / "run.jsonl", [{"rollout_corr/chi2_token": 0.001, "rollout_corr/chi2_seq": 0.02}]
    )
    rc = main(
        [
            "logged",
            f,
            "--batch-size",
            "64",
            "--lengths-file",
            "data/arith_rollouts_bf16.jsonl.gz",
            "--table-format",
            "json",
            "--n-batches",
            "50",
        ]
    )
    assert rc == 0
    row = json.loads(capsys.readouterr().out)["metrics"][0]
    assert row["metric"] == "rollout_corr/chi2_seq"
    assert math.isfinite(row["target"])


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ('{"mismatch_kl": "abc"}\n', ".jsonl", "record 1: field 'mismatch_kl': expected a number"),
        ("{oops\n", ".jsonl", "record 1 (line 1): not JSON"),
        (
            "step,mismatch_kl\n2,nan\n",
            ".csv",
            "record 1: field 'mismatch_kl': expected a finite number",
        ),
        ('{"token_mult_prob_error": 0.5}\n', ".jsonl", "record 1: token_mult_prob_error = 0.5 is impossible"),
        ("", ".jsonl", "no records"),
    ],
)
def test_bad_input_one_line_nothing_written(tmp_path, capsys, content, suffix, message):
    """A log with no record to judge: one line naming file, record and field; nothing written."""
    f = tmp_path / f"run{suffix}"
    f.write_text(content)
    out = tmp_path / "out.md"
    out.write_text("keep me")
    rc = main(["logged", str(f), "--batch-size", "8", "--lengths", "10", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err
    assert message in err
    assert str(f) in err
    assert out.read_text() == "keep me"


def test_needs_lengths(tmp_path, capsys):
    """Needs lengths."""
    f = _write_jsonl(tmp_path / "run.jsonl", [NEMO])
    assert main(["logged", f, "--batch-size", "8"]) == 2
    assert "--lengths" in capsys.readouterr().err
    assert main(["logged", f, "--batch-size", "8", "--lengths", "10,5"]) == 2
    assert "must not decrease" in capsys.readouterr().err


def test_unknown_keys_name_the_option(tmp_path, capsys):
    """A log without any known metric says to pass --framework, and --law-from errors name the option."""
    f = _write_jsonl(tmp_path / "run.jsonl", [{"loss": 0.1}])
    assert main(["logged", f, "--batch-size", "8", "--lengths", "10"]) == 2
    assert "pass --framework" in capsys.readouterr().err
    g = _write_jsonl(tmp_path / "run2.jsonl", [NEMO])
    assert main(["logged", g, "--batch-size", "8", "--lengths", "10", "--law-from", "gen_kl_error"]) == 2
    assert "--law-from 'gen_kl_error'" in capsys.readouterr().err


def test_summary_and_skipped_rows(tmp_path, capsys):
    """Markdown sums the steps up per metric; an evaluation row is skipped and said so on stderr."""
    recs = [NEMO, {"step": 2, "train/token_mult_prob_error": 1.01, "train/sampling_importance_ratio": 0.5}]
    f = _write_jsonl(tmp_path / "run.jsonl", [*recs, {"step": 3, "eval/acc": 0.3}])
    args = ["logged", f, "--batch-size", "256", "--lengths", "8000,10000", "--ratio-level", "sequence"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "- is_oob_ratio: marginal at 2 of 2 steps; logged at 1" in captured.out
    assert "skipped 1 record(s)" in captured.err


def test_bad_records_are_rows_of_their_own(tmp_path, capsys):
    """Good records are judged, each bad one is a 'not judged' row saying why; stderr counts them."""
    lines = ['{"mismatch_kl": 0.001}', '{"mismatch_kl": "abc"}', "{oops", '{"mismatch_kl": 0.002}']
    f = tmp_path / "run.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert main(["logged", str(f), "--batch-size", "8", "--lengths", "10"]) == 0
    captured = capsys.readouterr()
    assert "## Notes (2 of 4 records not judged)" in captured.out
    bad_field = f"{f}: record 2: field 'mismatch_kl': expected a number, got 'abc'"
    assert f"- record 2 (step 1), not judged: {bad_field}" in captured.out
    assert f"- record 3, not judged: {f}: record 3 (line 3): not JSON" in captured.out
    err = [line for line in captured.err.splitlines() if "not judged" in line]
    assert len(err) == 1
    assert err[0].startswith("variance-lab: 2 record(s) not judged (each has a row saying why; first: ")


def test_reads_verl_file_logger_output(tmp_path, capsys):
    """The file logger of verl ({"step": N, "data": {...}} a line) is read (it used to be refused)."""
    data = {"rollout_corr/kl": 0.0, "rollout_corr/chi2_token": 0.0202013, "rollout_corr/chi2_seq": 6.9e7}
    f = _write_jsonl(
        tmp_path / "exp.jsonl", [{"step": 1, "data": data}, {"step": 1, "data": {"val-core/acc": 0.5}}]
    )
    rc = main(
        [
            "logged",
            f,
            "--batch-size",
            "20000",
            "--lengths",
            "1000",
            "--n-batches",
            "40",
            "--table-format",
            "json",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    doc = json.loads(captured.out)
    assert doc["laws"][0]["framework"] == "verl"
    assert doc["metrics"][0]["verdict"] == "unreliable"
    assert "skipped 1 record(s)" in captured.err


def test_reads_a_tensorboard_folder(tmp_path, capsys):
    """A TensorBoard run folder written by SummaryWriter.add_scalar, as verl's tensorboard logger does."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step in (1, 2):
        for key, value in {"mismatch_kl": 0.001 * step}.items():
            writer.add_scalar(key, value, step)
    writer.close()
    rc = main(
        ["logged", str(tmp_path / "run"), "--batch-size", "64", "--lengths", "100", "--table-format", "csv"]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out.splitlines()[0].startswith("record,step,framework,m,s2")
    assert len(captured.out.splitlines()) == 3
