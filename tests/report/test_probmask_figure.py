"""The prob_masks figure: masked fractions against the token's probability (theory, data), entropy and T."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.figure import Figure

from variance_lab.report.probmask_figure import (
    CPPO_KINDS,
    LOGIT_RANGE,
    PROB_MASK_COLUMNS,
    PROB_MASK_FLOOR,
    cppo_series,
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
    if "T" in panels:
        for s2, f in ((0.1, 5e-4), (0.5, 0.02)):
            for T in (1, 10, 1000):
                rows.append(("T", cppo_series("dppo-tv:0.2", s2), T, "exact", f, nan, nan, True))
                rows.append(
                    ("T", cppo_series("threshold alone", s2), T, "exact", f / (1 + (T > 1)), nan, nan, True)
                )
            rows += [("T", cppo_series("limit", s2), T, "limit", 0.5 if s2 == 0.5 else f / 2, nan, nan, True)
                     for T in (1, 1000)]  # fmt: skip
            for T, v, ok in ((1, f, True), (10, 3 * f, True), (100, 0.0, True), (1000, 10 * f, s2 == 0.5)):
                rows.append(("T", cppo_series("cppo", s2), T, "monte_carlo", v, 0.8 * v, 1.2 * v, ok))
    return pd.DataFrame(rows, columns=list(PROB_MASK_COLUMNS))


def test_three_lettered_panels_and_one_style_per_spec():
    """Theory (log y, logit x), data by p (logit x), by entropy; a spec keeps its colour across panels."""
    fig = prob_mask_figure(_frame(("q", "p", "entropy")), title="t", style="paper")
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


def test_cppo_panel_one_colour_per_sigma2_one_style_per_reference():
    """(d): log T and log y; colours per sigma^2 apart from the specs'; dashed, dotted, dash-dotted lines."""
    fig = prob_mask_figure(_frame(("q", "p", "T")), style="paper")
    a, b, d = fig.axes
    assert d.get_title(loc="left") == "(d) CPPO against the length"
    assert (d.get_xscale(), d.get_yscale()) == ("log", "log")
    assert d.get_ylim() == pytest.approx((1e-4, 1.0))  # the decade below the smallest value or interval end
    legend = {
        t.get_text(): h
        for t, h in zip(d.get_legend().get_texts(), d.get_legend().legend_handles, strict=True)
    }
    s1, s5 = legend[r"$\sigma^2 = 0.1$"], legend[r"$\sigma^2 = 0.5$"]
    spec_colours = {ln.get_color() for ax in (a, b) for ln in ax.get_lines()}
    assert s1.get_color() != s5.get_color()
    assert not {s1.get_color(), s5.get_color()} & spec_colours
    styles = {
        legend[label].get_linestyle() for label in ("dppo-tv:0.2", *(v[1] for v in CPPO_KINDS.values()))
    }
    assert styles == {"-.", "--", ":"}
    assert "cppo: Monte Carlo, 95 % interval" in legend
    assert "flagged unreliable" in legend
    lines = [ln for ln in d.get_lines() if len(ln.get_xdata()) > 1]
    by_style = {}
    for ln in lines:
        by_style.setdefault((ln.get_linestyle(), ln.get_color()), []).append(list(ln.get_xdata()))
    assert by_style[("--", s5.get_color())] == [[1, 10, 1000]]
    assert by_style[(":", s5.get_color())] == [[1, 1000]]
    mc = [x for (ls, c), xs in by_style.items() if ls == "-" and c == s1.get_color() for x in xs]
    assert mc == [[1, 10, 1000]]  # the zero at T = 100 is left out of the log axis
    hollow = [ln for ln in d.get_lines() if ln.get_markerfacecolor() == "white" and ln.get_marker() != "None"]
    assert [list(ln.get_xdata()) for ln in hollow] == [[1000]]  # sigma^2 = 0.1's flagged point
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
