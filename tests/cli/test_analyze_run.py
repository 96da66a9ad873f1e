"""``variance-lab analyze RUN_DIR``: one row per step in every format, the figure, one-line errors, Dask."""

from __future__ import annotations

import importlib.util
import io
import json

import numpy as np
import pandas as pd
import pytest

from variance_lab.cli import main
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import save_batch
from variance_lab.simulate import dask_executor as dx

QUICK = ["--n-boot", "50", "--folds", "0", "--seed", "4"]


def _run_dir(folder, n_steps: int = 2, n_seq: int = 40, suffix: str = "parquet"):
    """``step_N.<suffix>`` of pi_old and the engine's log-probs (the mismatch grows with the step)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for step in range(1, n_steps + 1):
        lens = rng.integers(8, 120, n_seq)
        old = [-rng.exponential(0.5, n) for n in lens]
        roll = [np.minimum(o + rng.normal(0.0, 0.01 * step, o.size), 0.0) for o in old]
        batch = TokenBatch.from_ragged(old, old, rollout_logp=roll, prompt_id=np.arange(n_seq) // 4)
        save_batch(batch, folder / f"step_{step}.{suffix}")
    return folder


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("variance-lab: error: "), err
    assert err.count("\n") == 1, err
    return err


def test_markdown_one_row_per_step_and_the_figure(tmp_path, capsys):
    """The markdown has the run line, a row per step in each table, notes on stderr; the figure is written."""
    folder = _run_dir(tmp_path / "run")
    (folder / "notes.txt").write_text("x")
    out, fig = tmp_path / "run.md", tmp_path / "run.png"
    assert main(["analyze", str(folder), *QUICK, "--out", str(out), "--figure", str(fig)]) == 0
    text = out.read_text()
    assert text.startswith(f"Analysis of the run {folder} (variance-lab analyze, 2 steps, n_boot=50, seed=4)")
    assert f"Run: 2 steps (1-2) of token log-prob files in {folder}" in text
    assert "Ratio analysed: the mismatch ratio pi_old/mu_rollout (mismatch)" in text
    for title in ("Per step", "Var(G_T) per length bucket", "GSPO clip fraction", "Pareto k-hat of P_T"):
        block = text[text.index(title) :].split("\n\n")[1]  # the title, a blank line, the table
        rows = [ln for ln in block.splitlines() if ln.startswith("| ")][1:]
        assert [r.split("|")[1].strip() for r in rows] == ["1", "2"], title
    err = capsys.readouterr().err
    assert "note: 1 other entry not read: notes.txt" in err
    assert "note: steps 1-2: the step's dump carries no update ratio" in err
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_and_json_hold_what_the_file_alone_gives(tmp_path, capsys):
    """csv: one row per step with a column per bucket; json: each step's buckets are its file's analysis."""
    folder = _run_dir(tmp_path / "run", suffix="jsonl.gz")
    assert main(["analyze", str(folder), *QUICK, "--table-format", "csv"]) == 0
    wide = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert wide["step"].tolist() == [1, 2]
    assert wide["dump"].tolist() == ["step_1.jsonl.gz", "step_2.jsonl.gz"]
    assert {"khat_P", "mismatch_k3_kl", "var_G_T64-127", "gspo_clip_frac_T8-15", "n_seq_T16-31"} <= set(wide)
    assert (wide.filter(like="n_seq_T").sum(axis=1) == wide["n_sequences"]).all()
    assert main(["analyze", str(folder), *QUICK, "--table-format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["n_steps"] == 2
    assert doc["run"]["layout"] == "files"
    assert [s["step"] for s in doc["steps"]] == [1, 2]
    assert (
        main(
            [
                "analyze",
                str(folder / "step_2.jsonl.gz"),
                *QUICK,
                "--ratio",
                "mismatch",
                "--table-format",
                "json",
            ]
        )
        == 0
    )
    alone = json.loads(capsys.readouterr().out)
    step = doc["steps"][1]
    assert [{k: v for k, v in b.items() if k not in ("step", "khat_P")} for b in step["buckets"]] == alone[
        "buckets"
    ]
    assert step["summary"]["clip"] == alone["summary"]["clip"]
    assert step["gspo_clip_frac"] == alone["summary"]["clip"]["gspo_obs"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("empty", r"no step dump found: .*\(it is empty\)"),
        ("mixed", r"mixed layouts: files of 2 formats \(jsonl, parquet"),
        ("broken", r"step_2\.parquet: not a readable Parquet file"),
        ("bad data", r"step_2\.parquet: bad sequence id=0 \(index 0\): .*pass --on-bad drop"),
        ("other preset", r"holds token log-prob files, not what preset 'slime' reads"),
    ],
)
def test_bad_directories_are_one_line(tmp_path, capsys, make, message):
    """An empty directory, mixed layouts, a file that does not parse, bad data: one line, status 2."""
    import re

    folder = tmp_path / "run"
    folder.mkdir()
    argv = ["analyze", str(folder), *QUICK, "--out", str(tmp_path / "out.md")]
    if make != "empty":
        _run_dir(folder)
    if make == "mixed":
        save_batch(TokenBatch.from_ragged([np.array([-0.1])], [np.array([-0.2])]), folder / "step_3.jsonl")
    if make == "broken":
        (folder / "step_2.parquet").write_bytes(b"PAR1")
    if make == "bad data":
        from variance_lab.rollouts.io import write_records

        write_records([{"logp": [0.5], "old_logp": [-0.1]}], folder / "step_2.parquet")
    if make == "other preset":
        argv += ["--preset", "slime"]
    err = _one_line_error(capsys, argv)
    assert re.search(message, err), err
    assert not (tmp_path / "out.md").exists()


def test_scheduler_needs_a_directory_and_an_address(tmp_path, capsys):
    """--scheduler on a file, or with something that is not an address: one line, status 2."""
    folder = _run_dir(tmp_path / "run", n_steps=1, n_seq=10)
    err = _one_line_error(
        capsys, ["analyze", str(folder / "step_1.parquet"), "--scheduler", "tcp://127.0.0.1:1"]
    )
    assert "--scheduler spreads the steps of a run directory" in err
    err = _one_line_error(capsys, ["analyze", str(folder), "--scheduler", "nowhere"])
    assert "scheduler must be SCHEME://HOST:PORT" in err


@pytest.mark.slow  # 9-20 s on the 2-core VM: a cluster starts, every worker fits the models
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs the distributed extra")
def test_scheduler_gives_the_same_csv_as_a_local_run(tmp_path, capsys):
    """``--scheduler`` of a LocalCluster of 2 processes (1 thread each): the local run's csv, to the byte."""
    folder = _run_dir(tmp_path / "run", n_steps=2, n_seq=30)
    assert (
        main(["analyze", str(folder), *QUICK, "--table-format", "csv", "--out", str(tmp_path / "a.csv")]) == 0
    )
    with dx.local_cluster(2, memory_limit="1GiB") as client:
        argv = ["analyze", str(folder), *QUICK, "--table-format", "csv", "--out", str(tmp_path / "b.csv")]
        assert main([*argv, "--scheduler", client.scheduler.address]) == 0
    capsys.readouterr()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
