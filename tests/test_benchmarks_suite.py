"""The benchmark suite's report (``benchmarks/suite.py``): how targets are judged and printed."""

from __future__ import annotations

import pytest

from benchmarks.suite import Report


def test_full_run_judges_every_target(capsys):
    """A full run prints ok or MISSED for every row with a target."""
    rep = Report(quick=False)
    rep.add("dense", "dense / 4-point", 4.2, "x", "<= 3", False)
    rep.add("memory", "peak RSS", 250.0, "MB", "< 300", True, quick_ok=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("MISSED")
    assert out[1].endswith("ok")
    assert [r["ok"] for r in rep.rows] == [False, True]
    assert not any(r["not_judged"] for r in rep.rows)


@pytest.mark.parametrize("met", [True, False])
def test_quick_run_says_not_judged_for_size_bound_targets(capsys, met):
    """``--quick`` prints "not judged" (never MISSED or ok) for a target set for the full sizes."""
    rep = Report(quick=True)
    rep.add("aggregate", "aggregate / token speed", 40.0, "x", ">= 100", met)
    line = capsys.readouterr().out.strip()
    assert line.endswith("not judged (quick sizes)")
    assert "MISSED" not in line
    assert " ok" not in line
    assert rep.rows[0]["ok"] is None
    assert rep.rows[0]["not_judged"] is True


def test_quick_run_judges_targets_that_hold_at_any_size(capsys):
    """``quick_ok`` rows are judged in a quick run too; rows without a target say nothing."""
    rep = Report(quick=True)
    rep.add("memory", "peak RSS", 320.0, "MB", "< 300", False, quick_ok=True)
    rep.add("memory", "growth", 12.0, "MB")  # no target: nothing to judge
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("MISSED")
    assert "judged" not in out[1]
    assert out[1].rstrip().endswith("MB")
    assert [r["not_judged"] for r in rep.rows] == [False, False]
