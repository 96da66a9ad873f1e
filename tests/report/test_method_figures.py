"""The figures of the 2025-26 methods: sign-dependent weights, VCPO's ESS step, the bounds of the mismatch."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from variance_lab.report.method_figures import RATIO_TOP, bounds_figure, sign_figure, vcpo_figure
from variance_lab.report.threshold_figure import THRESHOLD_COLUMNS

NAN = float("nan")


def _frame(rows):
    return pd.DataFrame(rows, columns=list(THRESHOLD_COLUMNS))


def _sign_rows():
    rows = []
    for series, b in (
        ("topr [A>=0]", 0.0),
        ("topr [A<0]", -0.4),
        ("aspo [A>=0]", -0.06),
        ("aspo [A<0]", -0.19),
    ):
        for t in (1, 10, 100):
            rows.append(("bias", series, t, "exact", b, NAN, NAN, True))
            rows.append(
                ("var", series, t, "exact", 0.0 if series == "topr [A>=0]" else 0.1 * t, NAN, NAN, True)
            )
    rows.append(("bias", "topr [A<0]", 10, "monte_carlo", -0.38, -0.4, -0.36, True))
    rows.append(("bias", "topr [A<0]", 100, "monte_carlo", -0.5, -0.9, -0.1, False))
    rows.append(("var", "topr [A>=0]", 10, "monte_carlo", 0.0, NAN, NAN, True))  # zero: off the log axis
    for k, series in enumerate(("topr [A>=0]", "topr [A<0]", "aspo [A<0]")):
        rows.append(("data", series, k, "data", -0.01 * k, -0.01 * k - 0.005, -0.01 * k + 0.005, True))
    return _frame(rows)


def test_sign_figure_panels_signs_and_data():
    """(a) bias and (b) variance by sign on log-T axes, A < 0 solid, A >= 0 dashed; (c) the data by name."""
    fig = sign_figure(_sign_rows(), title="lognormal", data_title="stale_gspo, update ratio", style="paper")
    a, b, c = fig.axes
    assert [ax.get_title(loc="left") for ax in (a, b, c)] == [
        "(a) bias by sign",
        "(b) variance by sign",
        "(c) stale_gspo, update ratio",
    ]
    assert a.get_xscale() == b.get_xscale() == b.get_yscale() == "log"
    styles = {ln.get_linestyle() for ln in a.get_lines() if len(ln.get_xdata()) == 3}
    assert styles == {"-", "--"}
    labels = [t.get_text() for t in b.get_legend().get_texts()]
    assert labels[:2] == ["topr", "aspo"]
    assert "flagged unreliable" in labels
    assert [t.get_text() for t in c.get_xticklabels()] == ["topr [A>=0]", "topr [A<0]", "aspo [A<0]"]
    topr_pos_var = [ln for ln in b.get_lines() if ln.get_linestyle() == "--" and ln.get_color() == "#000000"]
    assert all(len(ln.get_xdata()) == 0 for ln in topr_pos_var)  # zero variance is left out of the log axis
    hollow = [ln for ln in a.get_lines() if ln.get_markerfacecolor() == "white" and ln.get_marker() != "None"]
    assert hollow  # the flagged Monte Carlo point
    plt.close("all")


def _vcpo_rows():
    rows = []
    for lag in (1, 4):
        for t in (1, 10, 100, 1000):
            rows.append(("lag", f"lag {lag}", t, "exact", np.exp(-lag * t * 1e-3), NAN, NAN, True))
    rows.append(("lag", "lag 1", 1000, "monte_carlo", 0.44, 0.43, 0.45, True))
    for t in (1, 100, 1000):
        rows.append(("family", "gamma", t, "exact", np.exp(-t * 1e-3), NAN, NAN, True))
    rows += [("baseline", "onpolicy_gspo", 0, "data", 1.04, NAN, NAN, True)]
    return _frame(rows)


def test_vcpo_figure_panels():
    """(a) by lag with minibatch points, (b) by family, (c) the baseline's gain per run on a line at 1."""
    fig = vcpo_figure(_vcpo_rows(), style="paper")
    a, b, c = fig.axes
    assert a.get_title(loc="left") == "(a) by staleness"
    assert b.get_title(loc="left") == "(b) by ratio law, lag 1"
    assert [t.get_text() for t in a.get_legend().get_texts()] == [
        "lag 1",
        "lag 4",
        "minibatch $\\hat\\rho_N$",
    ]
    assert [t.get_text() for t in b.get_legend().get_texts()] == ["gamma"]
    assert a.get_ylim() == b.get_ylim() == (-0.02, 1.02)
    assert [t.get_text() for t in c.get_xticklabels()] == ["onpolicy_gspo"]
    assert any(list(ln.get_ydata()) == [1.0, 1.0] for ln in c.get_lines())
    plt.close("all")


def _bounds_rows():
    rows = []
    for label, v in (("one", 0.01), ("two: states", 0.5)):
        for t in (1, 10, 100):
            rows += [
                ("bias", label, t, "exact", 0.1 * t**1.5, NAN, NAN, True),
                ("bias", label, t, "bound", 0.2 * t * t, NAN, NAN, True),
                ("var", label, t, "exact", np.expm1(0.01 * t), NAN, NAN, True),
                ("var", label, t, "bound", np.expm1(v * t), NAN, NAN, True),
                ("ratio", f"{label}: bias", t, "exact", 2 * t**0.5, NAN, NAN, True),
                (
                    "ratio",
                    f"{label}: variance",
                    t,
                    "exact",
                    np.expm1(v * t) / np.expm1(0.01 * t),
                    NAN,
                    NAN,
                    True,
                ),
            ]
        rows += [
            ("crossover", label, n, m, t, NAN, NAN, True)
            for n in (10, 1000)
            for m, t in (("exact", 50), ("bound", 90))
        ]
    return _frame(rows)


def test_bounds_figure_panels_and_colours():
    """Four log-log panels; exact solid, bound dashed; a label with ': ' keeps its colour in (c)."""
    fig = bounds_figure(_bounds_rows(), style="paper")
    axes = fig.axes
    assert [ax.get_title(loc="left")[:3] for ax in axes] == ["(a)", "(b)", "(c)", "(d)"]
    assert all(ax.get_xscale() == ax.get_yscale() == "log" for ax in axes)
    legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert legend[:2] == ["one", "two: states"]
    assert axes[2].get_ylim()[1] == RATIO_TOP
    colours_c = {ln.get_color() for ln in axes[2].get_lines() if len(ln.get_xdata())}
    colours_a = {ln.get_color() for ln in axes[0].get_lines() if len(ln.get_xdata())}
    assert colours_c == colours_a  # "two: states: bias" is split at its last ': '
    assert {ln.get_linestyle() for ln in axes[3].get_lines() if len(ln.get_xdata())} == {"-", "--"}
    plt.close("all")


@pytest.mark.parametrize(
    ("draw", "rows"), [(sign_figure, _sign_rows), (vcpo_figure, _vcpo_rows), (bounds_figure, _bounds_rows)]
)
def test_draws_into_a_given_figure_and_refuses_a_frame_without_its_columns(draw, rows):
    """fig= is drawn into and returned; a frame without the tidy columns raises ValueError naming them."""
    fig = Figure()
    assert draw(rows(), fig=fig) is fig
    with pytest.raises(ValueError, match="missing \\['reliable'\\]"):
        draw(rows().drop(columns="reliable"))
