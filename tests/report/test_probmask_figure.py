"""The prob_masks figure: masked fractions against the token's probability (theory, data) and entropy."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.figure import Figure

from variance_lab.report.probmask_figure import (
    LOGIT_RANGE,
    PROB_MASK_COLUMNS,
    PROB_MASK_FLOOR,
    prob_mask_figure,
)


def _frame(panels=("q", "p", "entropy")):
    nan = float("nan")
    rows = []
    if "q" in panels:
        for q, v in ((0.1, 1e-3), (0.5, 2e-2), (0.9, 0.0)):
            rows.append(("q", "dppo-tv [A>0]", q, "exact", v, nan, nan, True))
            rows.append(("q", "dppo-tv [A<=0]", q, "exact", v / 2, nan, nan, True))
        rows.append(("q", "dppo-tv [A>0]", 0.5, "monte_carlo", 0.02, 0.015, 0.025, False))
    for panel in ("p", "entropy"):
        if panel in panels:
            for s in ("dppo-tv", "icepop"):
                rows += [(panel, s, x, "observed", 0.1 * x, 0.05 * x, 0.2 * x, True) for x in (0.1, 0.6)]
    return pd.DataFrame(rows, columns=list(PROB_MASK_COLUMNS))


def test_three_lettered_panels_and_one_style_per_spec():
    """Theory (log y, logit x), data by p (logit x), by entropy; a spec keeps its colour across panels."""
    fig = prob_mask_figure(_frame(), title="t", style="paper")
    assert isinstance(fig, Figure)
    a, b, c = fig.axes
    titles = ["(a) theory", "(b) data, by probability", "(c) data, by entropy"]
    assert [ax.get_title(loc="left") for ax in (a, b, c)] == titles
    assert (a.get_xscale(), a.get_yscale(), b.get_xscale(), c.get_xscale()) == (
        "logit",
        "log",
        "logit",
        "linear",
    )
    assert a.get_ylim() == pytest.approx((PROB_MASK_FLOOR, 1.0))
    assert b.get_xlim() == pytest.approx(LOGIT_RANGE)
    la = {
        t.get_text(): h
        for t, h in zip(a.get_legend().get_texts(), a.get_legend().legend_handles, strict=True)
    }
    lb = {
        t.get_text(): h
        for t, h in zip(b.get_legend().get_texts(), b.get_legend().legend_handles, strict=True)
    }
    assert la["dppo-tv [A>0]"].get_color() == la["dppo-tv [A<=0]"].get_color() == lb["dppo-tv"].get_color()
    assert (la["dppo-tv [A>0]"].get_linestyle(), la["dppo-tv [A<=0]"].get_linestyle()) == ("-", "--")
    assert lb["icepop"].get_color() != lb["dppo-tv"].get_color()
    assert "flagged unreliable" in la
    assert "observed, 95 % interval" in lb
    drawn = [ln for ln in a.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 1]
    assert [list(ln.get_xdata()) for ln in drawn] == [
        [0.1, 0.5]
    ]  # the 0 at q = 0.9 is below the floor: left out
    hollow = [ln for ln in a.get_lines() if ln.get_markerfacecolor() == "white" and ln.get_marker() != "None"]
    assert hollow
    plt.close("all")


def test_panels_without_rows_are_left_out_and_bad_frames_refused():
    """A theory-only frame draws one panel; fig= is drawn into; missing columns or panels are ValueErrors."""
    fig = prob_mask_figure(_frame(("q",)))
    assert len(fig.axes) == 1
    given = Figure()
    assert prob_mask_figure(_frame(), fig=given) is given
    with pytest.raises(ValueError, match="missing \\['reliable'\\]"):
        prob_mask_figure(_frame().drop(columns="reliable"))
    with pytest.raises(ValueError, match="no row of a panel"):
        prob_mask_figure(_frame().assign(panel="z"))
