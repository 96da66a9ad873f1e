"""The thresholds figure: CTPO's clipped fraction by position and M2PO's masked fraction against tau."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.figure import Figure

from variance_lab import corrections as co
from variance_lab.families import get_family
from variance_lab.report.threshold_figure import THRESHOLD_COLUMNS, threshold_figure


def _frame():
    fam = get_family("lognormal", 1.0, 0.1)
    rows = []
    pos = co.ctpo_positions(fam, "ctpo:0.5:0.5", 200).set_index("t").frac_clipped
    for t in (1, 10, 100, 200):
        rows.append(("ctpo", "ctpo:0.5:0.5", t, "exact", pos[t], float("nan"), float("nan"), True))
    rows.append(("ctpo", "ctpo:0.5:0.5", 10, "monte_carlo", 0.15, 0.13, 0.17, True))
    rows.append(("ctpo", "ctpo:0.5:0.5", 100, "monte_carlo", 0.5, 0.4, 0.6, False))
    rows.append(
        (
            "ctpo",
            "ctpo:0.5:0.5",
            co.find_T(fam, "ctpo:0.5:0.5"),
            "binding",
            0.5,
            float("nan"),
            float("nan"),
            True,
        )
    )
    for tau in (0.01, 0.04, 0.2):
        f = co.theory(fam, [1], f"m2po:{tau}").frac_modified.iloc[0]
        rows.append(("m2po", "limit", tau, "exact", f, float("nan"), float("nan"), True))
        rows.append(("m2po", "batch of 16 tokens", tau, "monte_carlo", f + 0.02, f, f + 0.04, True))
    return pd.DataFrame(rows, columns=list(THRESHOLD_COLUMNS))


def test_two_lettered_log_panels_with_their_series():
    """Two log-x panels, (a) CTPO and (b) M2PO, each legend naming its series and the point kinds."""
    fig = threshold_figure(_frame(), title="lognormal", style="paper")
    assert isinstance(fig, Figure)
    a, b = fig.axes
    assert a.get_title(loc="left") == "(a) CTPO"
    assert b.get_title(loc="left") == "(b) M2PO"
    assert a.get_xscale() == b.get_xscale() == "log"
    labels_a = [t.get_text() for t in a.get_legend().get_texts()]
    assert labels_a[0] == "ctpo:0.5:0.5"
    assert any("p_t" in label for label in labels_a)  # the binding cross is explained
    assert "flagged unreliable" in labels_a
    labels_b = [t.get_text() for t in b.get_legend().get_texts()]
    assert labels_b[:2] == ["limit", "batch of 16 tokens"]
    crosses = [ln for ln in a.get_lines() if ln.get_marker() == "x"]
    assert len(crosses) == 1
    assert crosses[0].get_xdata()[0] == co.find_T(get_family("lognormal", 1.0, 0.1), "ctpo:0.5:0.5")
    hollow = [ln for ln in a.get_lines() if ln.get_markerfacecolor() == "white" and ln.get_marker() != "None"]
    assert hollow  # the unreliable Monte Carlo point
    plt.close("all")


def test_draws_into_a_given_figure_and_refuses_a_frame_without_its_columns():
    """fig= is drawn into and returned; a frame without the tidy columns raises ValueError naming them."""
    fig = Figure()
    assert threshold_figure(_frame(), fig=fig) is fig
    with pytest.raises(ValueError, match="missing \\['reliable'\\]"):
        threshold_figure(_frame().drop(columns="reliable"))
