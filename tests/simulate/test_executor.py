"""The threads executor's first-run step: kernels loaded or compiled before the run, never changing it.

The slow test runs ``variance-lab table`` on a terminal with an empty numba cache.
"""

import subprocess
import sys

import pytest

from variance_lab import LogNormal, TwoPoint
from variance_lab.simulate import executor as ex
from variance_lab.simulate import prepare
from variance_lab.simulate._jit import kernels_reached
from variance_lab.simulate.accumulators import merge, merge_into
from variance_lab.simulate.kernels import SAMPLER_RUNNERS

GRID = [1, 10, 100]


def _tasks(fam, sampler, n=5000):
    return prepare(fam, GRID, n, seed=3, sampler=sampler, chunk_size=1024)[1]


def _bits(acc):
    return [acc.count, acc.sums.tobytes(), acc.shift.tobytes(), acc.tail.tobytes()]


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_compiled_kernels_load_silently_and_do_not_change_the_run(sampler, capfd):
    """Once compiled, compile_kernels compiles and shows nothing; the run's bits are as without it."""
    tasks = _tasks(TwoPoint(1.0, 0.2, q=0.3), sampler)
    quiet = ex.run_tasks(tasks, workers=2, progress=False)  # compiles or loads the run's kernels
    ex.compile_kernels(tasks[0], progress=False)  # and the in-place merge, which this run may not need
    capfd.readouterr()
    assert ex.compile_kernels(tasks[0], progress=True) == 0
    shown = ex.run_tasks(tasks, workers=2, progress=True)
    err = capfd.readouterr().err
    assert ex.COMPILING not in err
    assert "simulating" in err
    assert _bits(shown) == _bits(quiet)


def test_run_tasks_compiles_first_only_with_progress(monkeypatch):
    """progress=False skips the step (as before); None and True run it on the first task, before the run."""
    calls = []
    monkeypatch.setattr(ex, "compile_kernels", lambda task, progress: calls.append((task.index, progress)))
    tasks = _tasks(LogNormal(1.0, 0.1), "token", n=3000)
    ex.run_tasks(tasks, workers=1, progress=False)
    assert calls == []
    ex.run_tasks(tasks, workers=1, progress=None)
    ex.run_tasks(tasks, workers=1, progress=True)
    assert calls == [(0, None), (0, True)]
    ex.run_tasks(tasks, workers=1, progress=True, fn=lambda t: ex.run_chunk(t))
    assert len(calls) == 2  # another chunk function: its kernels are not ours to guess


def test_compile_progress_bar_says_first_run(monkeypatch):
    """The bar a compile opens: the first-run words, a count of kernels, shown at once with progress=True."""
    opened = []

    def fake_progress_bar(progress, total, desc, *, unit="it", **options):
        opened.append((progress, total, desc, unit))
        return None

    monkeypatch.setattr(ex, "progress_bar", fake_progress_bar)

    def fake_compile_progress(kernels, open_bar):
        open_bar(len(kernels))
        return _Null()

    monkeypatch.setattr(ex, "compile_progress", fake_compile_progress)
    ex.compile_kernels(_tasks(LogNormal(1.0, 0.1), "token")[0], progress=True)
    ((progress, total, desc, unit),) = opened
    assert (progress, desc, unit) == (True, "compiling kernels (first run only)", "kernel")
    assert 15 <= total <= 40  # the token run's kernels (20 when this was written)


class _Null:
    def __init__(self):
        self.done = set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _table_on_a_terminal(cache_dir, *argv) -> tuple[str, str]:
    """Run ``variance-lab table ARGV`` as a subprocess whose stderr is a terminal: (stdout, stderr)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(root)}
    master, slave = pty.openpty()
    size = struct.pack("HHHH", 24, 120, 0, 0)  # rows, columns: with 0 columns a bar prints nothing
    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    proc = subprocess.Popen(
        [sys.executable, "-m", "variance_lab.cli", "table", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
        cwd=root,
    )
    os.close(slave)
    err = b""
    while True:  # read the terminal until the program closes it (EIO), at most 10 minutes
        ready, _, _ = select.select([master], [], [], 600)
        if not ready:
            proc.kill()
            raise AssertionError(f"no end after 10 minutes; stderr so far: {err[-2000:]!r}")
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        err += data
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0, err[-2000:]
    return out, err.decode(errors="replace")


@pytest.mark.slow
def test_first_run_says_it_compiles_on_a_terminal_only_when_cold(tmp_path):
    """An empty numba cache: the compiling bar counts every kernel; then warm: no such bar, same table.

    With ``--no-progress`` on an empty cache it compiles without a word. (Two cold starts:
    about 40 s of CPU on a 2-core machine.)
    """
    total = len(kernels_reached(SAMPLER_RUNNERS["token"], ex.run_chunk, merge, merge_into))
    argv = ("--n", "2000", "--format", "csv")
    out_cold, err_cold = _table_on_a_terminal(tmp_path / "a", *argv)
    assert ex.COMPILING in err_cold
    assert f"{total}/{total}" in err_cold
    out_warm, err_warm = _table_on_a_terminal(tmp_path / "a", *argv)
    assert ex.COMPILING not in err_warm
    assert "kernel" not in err_warm
    assert out_warm == out_cold
    out_quiet, err_quiet = _table_on_a_terminal(tmp_path / "b", *argv, "--no-progress")
    assert ex.COMPILING not in err_quiet
    assert "simulating" not in err_quiet
    assert out_quiet == out_cold
