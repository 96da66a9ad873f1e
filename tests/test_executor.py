"""The threads executor's first-run step: kernels loaded or compiled before the run, never changing it."""

import pytest

from variance_lab import LogNormal, TwoPoint
from variance_lab.simulate import executor as ex
from variance_lab.simulate import prepare

GRID = [1, 10, 100]


def _tasks(fam, sampler, n=5000):
    return prepare(fam, GRID, n, seed=3, sampler=sampler, chunk_size=1024)[1]


def _bits(acc):
    return [acc.count, acc.sums.tobytes(), acc.shift.tobytes(), acc.tail.tobytes()]


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_compiled_kernels_load_silently_and_do_not_change_the_run(sampler, capfd):
    """Once compiled, compile_kernels compiles and shows nothing; the run's bits are as without it."""
    tasks = _tasks(TwoPoint(1.0, 0.2, q=0.3), sampler)
    quiet = ex.run_tasks(tasks, workers=2, progress=False)  # compiles or loads every kernel
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

    def fake_make_progress(progress, total, desc, unit="path"):
        opened.append((progress, total, desc, unit))
        return None

    monkeypatch.setattr(ex, "make_progress", fake_make_progress)

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
