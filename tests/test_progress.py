"""The one progress helper: None (after a delay, where someone watches), True (at once), False (none)."""

from __future__ import annotations

import sys

import pytest

from variance_lab import progress as pg


def test_progress_falls_back_to_text_without_widgets(monkeypatch, capsys):
    """In a notebook without ipywidgets tqdm.auto cannot build its widget: a text bar instead."""
    import tqdm.auto

    def no_widgets(*args, **kwargs):
        raise ImportError("IProgress not found")

    monkeypatch.setattr(tqdm.auto, "tqdm", no_widgets)
    monkeypatch.setattr(pg, "_in_notebook", lambda: True)
    bar = pg.progress_bar(True, 10, "simulating")
    bar.update(10)
    bar.close()
    assert "simulating" in capsys.readouterr().err
    assert pg.progress_bar(False, 10, "x") is None


def test_none_means_after_a_delay_where_someone_watches(monkeypatch, capsys):
    """None: no bar where nobody watches (pytest's stderr is no terminal); on a terminal, one with a delay."""
    assert not pg.watched()
    assert pg.progress_bar(None, 10, "x") is None
    monkeypatch.setattr(pg, "watched", lambda: True)
    bar = pg.progress_bar(None, 10, "x")
    assert bar.delay == pg.DELAY_S
    bar.close()
    bar = pg.progress_bar(True, 10, "x")
    assert bar.delay == 0.0
    assert bar.fp is not None
    bar.close()
    assert capsys.readouterr().out == ""  # never on standard output


def test_steps_count_with_or_without_a_bar(capsys):
    """progress_steps yields an update that counts on a bar and does nothing without one."""
    with pg.progress_steps(True, 3, "fitting", unit="fit") as step:
        step(1)
        step(2)
    assert "fitting" in capsys.readouterr().err
    with pg.progress_steps(False, 3, "fitting") as step:
        step(3)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bad", [0, 1, "yes", 0.5])
def test_progress_must_be_none_true_or_false(bad):
    """Anything but None, True, False is refused with the value named."""
    with pytest.raises(ValueError, match="progress must be None"):
        pg.progress_bar(bad, 10, "x")


def test_a_closed_stderr_is_not_watched(monkeypatch):
    """A replaced or closed standard error counts as nobody watching, not as an error."""

    class Closed:
        def isatty(self):
            raise ValueError("I/O operation on closed file")

    monkeypatch.setattr(sys, "stderr", Closed())
    assert pg.watched() is False


def test_ticker_speaks_at_the_end_and_every_interval(monkeypatch):
    """The ticker says 'what: done/total sequences' at the last step and after ``every`` seconds."""
    now = [100.0]
    monkeypatch.setattr(pg.time, "perf_counter", lambda: now[0])
    said: list[str] = []
    tick = pg.ticker(said.append, "scoring", every=30.0)
    tick(1, 4)  # 0 s since the start: quiet
    now[0] += 29.0
    tick(2, 4)  # 29 s: quiet
    now[0] += 1.0
    tick(3, 4)  # 30 s: speaks, and the clock restarts
    now[0] += 1.0
    tick(4, 4)  # the end: speaks however soon
    assert said == ["scoring: 3/4 sequences", "scoring: 4/4 sequences"]


def test_seconds_since_rounds_to_a_tenth():
    """A reading 2.04 s back gives 2.0 (timings record tenths)."""
    import time

    from variance_lab.progress import seconds_since

    assert seconds_since(time.perf_counter() - 2.04) == 2.0
