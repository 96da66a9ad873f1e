"""The corrections figure: relative bias and ESS fraction of each correction against T.

Drawn from a tidy frame only (columns ``T, correction, statistic, method, value, lo, hi,
reliable``; statistics ``rel_bias`` and ``ess_frac``; methods ``exact``, ``monte_carlo`` and
optionally ``experiment``): closed-form lines, Monte Carlo points with interval bars (hollow when
flagged unreliable), measured points as crosses.
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


def corrections_vs_T(frame: pd.DataFrame, *, fig=None, title: str = "", style=None) -> Figure:
    """Two panels against T (log scale): relative bias and ESS fraction, one colour per correction.

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

    Returns
    -------
    Figure
    """
    if fig is None:
        fig = Figure(figsize=(7.0, 2.9))
    with sty.use(style):
        axes = fig.subplots(1, 2)
        corrections = list(dict.fromkeys(frame["correction"]))
        for ax, stat in zip(axes, ("rel_bias", "ess_frac"), strict=True):
            rows = frame[frame["statistic"] == stat]
            for i, c in enumerate(corrections):
                series = sty.line_style(i)  # colour, line style and marker: apart in greyscale too
                col = series["color"]
                sub = rows[rows["correction"] == c].sort_values("T")
                exact = sub[sub["method"] == "exact"]
                ax.plot(exact["T"], exact["value"], color=col, ls=series["ls"], label=c)
                _points(ax, sub[sub["method"] == "monte_carlo"], col, series["marker"])
                meas = sub[sub["method"] == "experiment"]
                if not meas.empty:
                    ax.plot(meas["T"], meas["value"], ls="", marker="x", color=col, ms=4)
            ax.set_xscale("log")
            ax.set_xlabel("sequence length $T$")
            ax.set_ylabel(_LABELS[stat])
        axes[1].set_ylim(-0.02, 1.02)
        handles = [
            Line2D([], [], color=st["color"], ls=st["ls"], marker=st["marker"], ms=3.2, label=c)
            for c, st in ((c, sty.line_style(i)) for i, c in enumerate(corrections))
        ]
        handles += [
            Line2D([], [], marker="o", ls="", color="0.2", label="Monte Carlo"),
            Line2D([], [], marker="o", ls="", color="0.2", mfc="white", label="Monte Carlo, unreliable"),
        ]
        if (frame["method"] == "experiment").any():
            handles.append(Line2D([], [], marker="x", ls="", color="0.2", label="experiment"))
        fig.legend(handles=handles, loc="lower center", ncols=4, bbox_to_anchor=(0.5, -0.02))
        if title:
            fig.suptitle(title)
        fig.subplots_adjust(bottom=0.36, wspace=0.3)
    return fig
