"""The corrections figure: relative bias and ESS fraction of each correction against T.

Drawn from a tidy frame only (columns ``T, correction, statistic, method, value, lo, hi,
reliable``; statistics ``rel_bias`` and ``ess_frac``; methods ``exact``, ``monte_carlo`` and
optionally ``experiment`` and ``experiment_fit``): closed-form lines, Monte Carlo points with
interval bars (hollow when flagged unreliable). With experiment rows a second row of panels shows
the measured points with their interval bars against the lines of the model fitted to the data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style as sty

__all__ = ["corrections_vs_T"]

_LABELS = {
    "rel_bias": r"relative bias $E[w]/E[b] - 1$",
    "ess_frac": r"ESS fraction $E[w]^2/E[w^2]$",
}


def _points(ax, rows: pd.DataFrame, color: str, marker: str) -> None:
    ok = rows["reliable"].to_numpy(bool)
    x, y = rows["T"].to_numpy(float), rows["value"].to_numpy(float)
    lo = np.where(np.isnan(rows["lo"]), y, rows["lo"])
    hi = np.where(np.isnan(rows["hi"]), y, rows["hi"])
    sty.errorbar_points(ax, x, y, lo, hi, ok, color, marker=marker)


def _panel(ax, rows: pd.DataFrame, corrections, line_method: str, point_method: str) -> None:
    """One panel: a line per correction from ``line_method`` rows, points from ``point_method`` rows."""
    for i, c in enumerate(corrections):
        series = sty.line_style(i)  # colour, line style and marker: apart in greyscale too
        col = series["color"]
        sub = rows[rows["correction"] == c].sort_values("T")
        lines = sub[sub["method"] == line_method]
        ax.plot(lines["T"], lines["value"], color=col, ls=series["ls"], label=c)
        _points(ax, sub[sub["method"] == point_method], col, series["marker"])


def corrections_vs_T(
    frame: pd.DataFrame,
    *,
    fig=None,
    title: str = "",
    style=None,
    experiment_title: str = "experiment, per length bucket: measured and lognormal fit",
) -> Figure:
    """Panels against T (log scale): relative bias and ESS fraction, one colour per correction.

    One row for the model (closed-form lines, Monte Carlo points); with ``experiment`` rows a
    second row: the measured points per length bucket against the fitted model's lines.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows (module docstring).
    fig : matplotlib.figure.Figure, optional
    title : str
        Figure title (the family and its parameters).
    style : None, str or dict
        As for :func:`variance_lab.report.style.use`: ``None`` draws with the caller's
        rcParams, ``"paper"`` with the package's paper style.
    experiment_title : str
        Title of the lower row (drawn only with experiment rows).

    Returns
    -------
    Figure
    """
    experiment = frame["method"].isin(["experiment", "experiment_fit"]).any()
    if fig is None:
        fig = Figure(figsize=(7.0, 5.4) if experiment else (7.0, 2.9))
    with sty.use(style):
        axes = fig.subplots(2 if experiment else 1, 2, squeeze=False)
        corrections = list(dict.fromkeys(frame["correction"]))
        rows = [("exact", "monte_carlo")] + ([("experiment_fit", "experiment")] if experiment else [])
        for ax_row, (line_method, point_method) in zip(axes, rows, strict=True):
            for ax, stat in zip(ax_row, ("rel_bias", "ess_frac"), strict=True):
                _panel(ax, frame[frame["statistic"] == stat], corrections, line_method, point_method)
                ax.set_xscale("log")
                ax.set_xlabel("sequence length $T$")
                ax.set_ylabel(_LABELS[stat])
            ax_row[1].set_ylim(-0.02, 1.02)
        if experiment:
            axes[0][0].set_title("lognormal ratios: closed form and Monte Carlo", loc="left")
            axes[1][0].set_title(experiment_title, loc="left")
        handles = [
            Line2D([], [], color=st["color"], ls=st["ls"], marker=st["marker"], ms=3.2, label=c)
            for c, st in ((c, sty.line_style(i)) for i, c in enumerate(corrections))
        ]
        handles += [
            Line2D([], [], marker="o", ls="", color="0.2", label="Monte Carlo"),
            Line2D([], [], marker="o", ls="", color="0.2", mfc="white", label="Monte Carlo, unreliable"),
        ]
        if experiment:
            handles.append(
                Line2D([], [], marker="o", ls="", color="0.2", label="experiment, 95% bootstrap (lower row)")
            )
        fig.legend(
            handles=handles, loc="lower center", ncols=4, bbox_to_anchor=(0.5, 0.0 if experiment else -0.02)
        )
        if title:
            fig.suptitle(title)
        if experiment:
            fig.subplots_adjust(bottom=0.22, wspace=0.3, hspace=0.45)
        else:
            fig.subplots_adjust(bottom=0.36, wspace=0.3)
    return fig
