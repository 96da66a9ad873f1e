"""The sweep, export and figures commands: help, bad input, and a sweep killed part-way."""

import argparse
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest

from variance_lab import cli
from variance_lab.sweep import STORE_COLUMNS, load_store, load_table, plan, sweep


# ----------------------------------------------------------------------------- help
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("command", ["sweep", "export", "figures"])
def test_help_lists_every_option_with_its_default(command, capsys):
    """``--help`` of sweep, export and figures lists every option with its default."""
    parser = _subparsers(cli.build_parser())[command]
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.option_strings[-1] in text
        formatted = parser.formatter_class(command)._expand_help(action)
        assert "(default: " in formatted, action.dest
    if command == "sweep":
        assert "a:b:logN" in text
        assert "a:b:N" in text  # the grid syntax is documented


def test_top_level_help_lists_the_commands(capsys):
    """The top-level ``--help`` names the sweep, export and figures commands."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("sweep", "export", "figures"):
        assert command in out


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--mu", "0.9:x:3"],
        ["sweep", "--T", "1:10:log0"],
        ["sweep", "--T", "0,1"],
        ["sweep", "--n", "1"],
        ["sweep", "--family", "normal"],
        ["sweep", "--sigma2", "-1"],
        ["sweep", "--param", "rho"],
        ["sweep", "--param", "rho=0.5"],  # lognormal has no rho
        ["sweep", "--family", "two-point", "--sigma2", "2"],  # nothing reachable
        ["sweep", "--workers", "0"],
        ["sweep", "--store", "no/such/folder/s.sqlite"],
        ["export", "missing.sqlite", "--out", "x.csv"],
        ["export", "s.sqlite"],  # --out is required
        ["figures", "--only", "nope"],
        ["figures", "--from-sidecar", "missing.json"],
        ["sweep", "--bogus"],
        ["sweep", "--family", "lognormal-mixture", "--param", "components=0.5:0:1"],  # weights sum to 0.5
        ["sweep", "--family", "lognormal-mixture"],  # no components
        ["sweep", "--family", "random-scale", "--param", "alpha=-1,1"],
        ["sweep", "--param", "components="],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, capsys, tmp_path, monkeypatch):
    """Each bad argument gives exit status 2 and one stderr line, no traceback."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("variance-lab: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err


def test_export_bad_suffix_and_junk_store(tmp_path, capsys, monkeypatch):
    """A file that is not a store and an unknown output suffix are one-line errors."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.sqlite").write_text("junk" * 1000)
    assert cli.main(["export", "junk.sqlite", "--out", "x.csv"]) == 2
    assert cli.main(["sweep", "--T", "1", "--no-progress"]) == 0
    assert cli.main(["export", "variance_lab.sqlite", "--out", "x.txt"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "not a variance_lab store" in err[0]
    assert ".csv or .parquet" in err[1]


# ----------------------------------------------------------------------------- sweep and export
def test_sweep_command_reports_and_exports(tmp_path, capsys, monkeypatch):
    """``sweep`` reports computed, reused and unreachable cells; its export round-trips."""
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--family", "lognormal,two-point", "--mu", "0.5,1", "--sigma2", "0.1,0.5"]
    argv += ["--T", "1:100:log3", "--no-progress", "--out", "rows.csv"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "7 cells: 7 computed, 0 reused from 'variance_lab.sqlite'; 1 unreachable" in out
    assert "unreachable (family, mu, sigma2) points skipped: 1" in err
    assert "two-point mu=0.5 sigma2=0.5" in err
    assert cli.main(argv) == 0
    assert "7 cells: 0 computed, 7 reused" in capsys.readouterr().out
    assert cli.main(["export", "variance_lab.sqlite", "--out", "all.parquet"]) == 0
    frame = load_store(tmp_path / "variance_lab.sqlite")
    pd.testing.assert_frame_equal(load_table(tmp_path / "all.parquet"), frame)
    pd.testing.assert_frame_equal(load_table(tmp_path / "rows.csv"), frame)
    assert sorted(frame["T"].unique()) == [1, 10, 100]


# ----------------------------------------------------------------------------- killed and resumed
def _sweep_argv(store, *, mc: bool, mu: str = "0.9,1.1") -> tuple[list[str], dict]:
    """Return the argv of a sweep of a second or two.

    8 theory cells, and 8 Monte Carlo cells when the engine exists.
    """
    grid = {"families": "lognormal,gamma", "mu": mu, "sigma2": "0.05,0.2", "T": "1:1000:log6"}
    grid["n"] = "0,2000" if mc else "0"
    argv = ["sweep", "--seed", "7", "--workers", "1", "--store", str(store), "--no-progress"]
    for key, value in grid.items():
        argv += ["--family" if key == "families" else f"--{key}", value]
    from variance_lab.sweep.grid import parse_grid

    kwargs = {
        "families": grid["families"].split(","),
        "mu": parse_grid(grid["mu"]),
        "sigma2": parse_grid(grid["sigma2"]),
        "T": parse_grid(grid["T"], integer=True),
        "n": parse_grid(grid["n"], integer=True),
        "seed": 7,
    }
    return argv, kwargs


def _finished(store) -> int:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.Error:
        return 0


def _start(argv, cwd, preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "variance_lab.cli", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


def _wait_for_cells(proc, store, count: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = _finished(store)
        if done >= count:
            return done
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended early: {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("sweep made no progress")


def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path, capsys):
    """A sweep killed with SIGKILL and rerun equals an uninterrupted run, one row set per cell."""
    store = tmp_path / "killed.sqlite"
    argv, kwargs = _sweep_argv(store, mc=True)
    total = len(plan(**kwargs).cells)

    proc = _start(argv, tmp_path)
    _wait_for_cells(proc, store, 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    at_kill = _finished(store)
    assert 3 <= at_kill < total, (at_kill, total)
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        orphans = conn.execute("SELECT COUNT(*) FROM results WHERE cell NOT IN (SELECT cell FROM cells)")
        assert orphans.fetchone()[0] == 0

    assert cli.main(argv) == 0  # the same command again (in this process, to save a start-up)
    assert f"{total} cells: {total - at_kill} computed, {at_kill} reused" in capsys.readouterr().out

    reference = sweep(**kwargs, store=tmp_path / "reference.sqlite", progress=False, workers=2)
    assert len(reference.computed) == total
    resumed = load_store(store)
    cols = [c for c in STORE_COLUMNS if c != "created"]
    pd.testing.assert_frame_equal(resumed[cols], reference.frame[cols], check_exact=True)
    # exactly one row set per cell
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == total
    per_cell = resumed.groupby("cell").size()
    assert len(per_cell) == total
    assert not resumed.duplicated(["cell", "T", "statistic", "method"]).any()
    assert (resumed["method"] == "monte_carlo").any()


def test_ctrl_c_stops_cleanly_and_keeps_finished_cells(tmp_path, sigint_default):
    """Ctrl-C exits 130 with one line saying how many cells were kept, no traceback."""
    store = tmp_path / "s.sqlite"
    # theory cells are computed in one batch in milliseconds: 400 of them, so that the store's
    # writes (one commit per cell) are still under way when the interrupt comes
    argv, _ = _sweep_argv(store, mc=False, mu="0.5:2:100")
    proc = _start(argv, tmp_path, sigint_default)
    _wait_for_cells(proc, store, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"exit {proc.returncode}: {err}"
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("variance-lab: interrupted: ")
    assert "run the same command again" in last
    kept = int(last.split("interrupted: ")[1].split(" of ")[0])
    assert kept == _finished(store) >= 2
