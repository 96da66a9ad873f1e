"""The corrections figure: relative bias and ESS fraction of each correction against T.

Drawn from a tidy frame only (columns ``T, correction, statistic, method, value, lo, hi,
reliable``; statistics ``rel_bias`` and ``ess_frac``; methods ``exact``, ``monte_carlo`` and
optionally ``experiment`` and ``experiment_fit``): closed-form lines, Monte Carlo points with
interval bars (filled; hollow when flagged unreliable). With experiment rows a second row of
panels shows the measured points (half filled, :data:`MEASURED_FILL`) with their interval bars
against the lines of the model fitted to the data. Panels are lettered (a), (b), (c), (d); each
row has its own title; a note under the legend says what :math:`w` and :math:`b` of
:math:`E[w]/E[b] - 1` are (:data:`B_NOTE`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation

from variance_lab.report import style as sty

__all__ = ["B_NOTE", "MEASURED_FILL", "corrections_vs_T"]

_LABELS = {
    "rel_bias": r"relative bias $E[w]/E[b] - 1$",
    "ess_frac": r"ESS fraction $E[w]^2/E[w^2]$",
}


#: What ``w`` and ``b`` of the relative bias are, printed under the legend.
B_NOTE = (
    "$w$: a correction's weight; $b$: the uncorrected weight it acts on ($P_T$; $G_T$ for GSPO and GMPO; "
    "$r_t$ for the token-level TIS and IcePop)"
)


#: Fill style of the measured (experiment) points: half filled, apart from Monte Carlo's full and hollow.
MEASURED_FILL = "left"


def _points(ax, rows: pd.DataFrame, color: str, marker: str, measured: bool) -> None:
    """Points with interval bars: Monte Carlo filled (hollow when unreliable), measured half-filled."""
    ok = rows["reliable"].to_numpy(bool)
    x, y = rows["T"].to_numpy(float), rows["value"].to_numpy(float)
    lo = np.where(np.isnan(rows["lo"]), y, rows["lo"])
    hi = np.where(np.isnan(rows["hi"]), y, rows["hi"])
    if not measured:
        sty.errorbar_points(ax, x, y, lo, hi, ok, color, marker=marker)
        return
    if len(x):
        ax.errorbar(
            x,
            y,
            yerr=[y - lo, hi - y],
            color=color,
            mec=color,
            mfc=color,
            mfcalt="white",
            fillstyle=MEASURED_FILL,
            **{**sty.ERRORBAR, "fmt": marker},
        )


def _panel(ax, rows: pd.DataFrame, corrections, line_method: str, point_method: str) -> None:
    """One panel: a line per correction from ``line_method`` rows, points from ``point_method`` rows."""
    for i, c in enumerate(corrections):
        series = sty.line_style(i)  # colour, line style and marker: apart in greyscale too
        col = series["color"]
        sub = rows[rows["correction"] == c].sort_values("T")
        lines = sub[sub["method"] == line_method]
        ax.plot(lines["T"], lines["value"], color=col, ls=series["ls"], label=c)
        measured = point_method == "experiment"
        _points(ax, sub[sub["method"] == point_method], col, series["marker"], measured)


def _handles(corrections, experiment: bool, level: str) -> list[Line2D]:
    """Legend: one entry per correction, then the kinds of points, each drawn as in the panels."""
    handles = [
        Line2D([], [], color=st["color"], ls=st["ls"], marker=st["marker"], ms=3.2, label=c)
        for c, st in ((c, sty.line_style(i)) for i, c in enumerate(corrections))
    ]
    mc = f"Monte Carlo (a, b), {level} interval" if experiment else f"Monte Carlo, {level} interval"
    handles += [
        Line2D([], [], marker="o", ls="", color="0.2", label=mc),
        Line2D([], [], marker="o", ls="", color="0.2", mfc="white", label="Monte Carlo, flagged unreliable"),
    ]
    if experiment:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color="0.2",
                mfc="0.2",
                mfcalt="white",
                fillstyle=MEASURED_FILL,
                label=f"measured per length bucket (c, d), {level} bootstrap interval",
            )
        )
    return handles


def corrections_vs_T(
    frame: pd.DataFrame,
    *,
    fig=None,
    title: str = "",
    style=None,
    experiment_title: str = "experiment, per length bucket: measured and lognormal fit",
    level: float = 0.95,
) -> Figure:
    """Panels against T (log scale): relative bias and ESS fraction, one colour per correction.

    One row for the model (closed-form lines, Monte Carlo points); with ``experiment`` rows a
    second row: the measured points per length bucket against the fitted model's lines. Panels
    are lettered (a), (b) (and (c), (d) below); each row has its own title, so that the
    model's parameters stand over the model's row only. Under the legend a note says what
    :math:`w` and :math:`b` of :math:`E[w]/E[b] - 1` are.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows (module docstring).
    fig : matplotlib.figure.Figure, optional
    title : str
        Title of the model's row (the family and its parameters); the figure's title when
        there is no experiment row.
    style : None, str or dict
        As for :func:`variance_lab.report.style.use`: ``None`` draws with the caller's
        rcParams, ``"paper"`` with the package's paper style.
    experiment_title : str
        Title of the lower row (drawn only with experiment rows).
    level : float
        Confidence level of the intervals, for the legend.

    Returns
    -------
    Figure
    """
    experiment = frame["method"].isin(["experiment", "experiment_fit"]).any()
    if fig is None:
        fig = Figure(figsize=(7.0, 6.0) if experiment else (7.0, 3.3), layout="constrained")
    with sty.use(style):
        n_rows = 2 if experiment else 1
        parts = fig.subfigures(n_rows + 1, 1, height_ratios=[1.0] * n_rows + [0.4 if experiment else 0.5])
        corrections = list(dict.fromkeys(frame["correction"]))
        rows = [("exact", "monte_carlo")] + ([("experiment_fit", "experiment")] if experiment else [])
        titles = [title or "lognormal ratios: closed form and Monte Carlo", experiment_title]
        for i, (part, (line_method, point_method), row_title) in enumerate(
            zip(parts, rows, titles, strict=False)
        ):
            letters = "abcd"[2 * i : 2 * i + 2]
            ax_row = part.subplots(1, 2)
            for ax, stat, letter in zip(ax_row, ("rel_bias", "ess_frac"), letters, strict=True):
                _panel(ax, frame[frame["statistic"] == stat], corrections, line_method, point_method)
                ax.set_xscale("log")
                ax.set_xlabel("sequence length $T$")
                ax.set_ylabel(_LABELS[stat])
                ax.set_title(f"({letter})", loc="left", fontweight="bold")
            ax_row[1].set_ylim(-0.02, 1.02)
            if experiment:
                part.suptitle(f"({letters[0]}, {letters[1]}) {row_title}")
        ci = f"{100 * level:g} %"
        legend_part = parts[-1]
        legend = legend_part.legend(
            handles=_handles(corrections, experiment, ci), loc="upper center", ncols=3, frameon=False
        )
        note = Annotation(
            B_NOTE,
            xy=(0.5, 0.0),
            xycoords=legend,
            xytext=(0.0, -2.0),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=sty.small_font(),
        )
        legend_part.add_artist(note)  # just under the legend, wherever the legend ends
        if title and not experiment:
            fig.suptitle(title)
    return fig
