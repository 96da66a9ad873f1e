r"""Where CTPO's and M2PO's thresholds bind: clipped fraction by position, masked fraction against tau.

Drawn from a tidy frame only (columns ``panel, series, x, method, value, lo, hi, reliable``):

- ``panel == "ctpo"``: :math:`x` is the token's position :math:`t`, ``value`` the fraction of
  tokens clipped there (:math:`p_t`), one ``series`` per spec; ``method`` ``"exact"`` (lines,
  :func:`variance_lab.corrections.ctpo_positions`) or ``"monte_carlo"`` (points with Wilson
  intervals, :func:`variance_lab.corrections.simulate_positions`); rows with ``method ==
  "binding"`` mark the position where :math:`p_t` first reaches one half (a cross on the line).
- ``panel == "m2po"``: :math:`x` is :math:`\tau`, ``value`` the masked fraction; ``"exact"``
  rows are the large-batch limit (one line per ratio law), ``"monte_carlo"`` rows the
  finite-batch fraction (points with batch intervals, one ``series`` per batch size).

Monte Carlo points are filled when reliable and hollow when flagged, as in every figure.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style as sty
from variance_lab.report.figure_kit import series_handle

__all__ = ["THRESHOLD_COLUMNS", "threshold_figure"]

#: Columns of the tidy frame :func:`threshold_figure` draws.
THRESHOLD_COLUMNS = ("panel", "series", "x", "method", "value", "lo", "hi", "reliable")

_LABELS = {
    "ctpo": ("token position $t$", "fraction of tokens clipped at $t$"),
    "m2po": (r"threshold $\tau$ of the mean $(\log r)^2$ left", "fraction of tokens masked"),
}


def _panel(ax, rows: pd.DataFrame, start: int) -> list[Line2D]:
    """Draw exact lines and Monte Carlo points, one style per series; return the legend handles."""
    handles = []
    for i, series in enumerate(dict.fromkeys(rows["series"])):
        st = sty.line_style(start + i)
        sub = rows[rows["series"] == series].sort_values("x")
        exact, mc = sub[sub["method"] == "exact"], sub[sub["method"] == "monte_carlo"]
        if len(exact):
            ax.plot(exact["x"], exact["value"], color=st["color"], ls=st["ls"])
        if len(mc):
            sty.frame_points(ax, mc, st["color"], st["marker"])
        bind = sub[sub["method"] == "binding"]
        if len(bind):
            ax.plot(bind["x"], bind["value"], ls="", marker="x", ms=6, mew=1.2, color=st["color"], zorder=4)
        handles.append(series_handle(st, series, line=bool(len(exact)), points=bool(len(mc))))
    return handles


def threshold_figure(frame: pd.DataFrame, *, fig=None, title: str = "", style=None) -> Figure:
    """Two panels: (a) CTPO's clipped fraction against the position, (b) M2PO's masked fraction against tau.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows, columns :data:`THRESHOLD_COLUMNS` (module docstring).
    fig : matplotlib.figure.Figure, optional
        Drawn into (two axes side by side); a new 7 x 3.1 in figure otherwise.
    title : str
        The figure's title (the ratio law).
    style : None, str or dict
        As for :func:`variance_lab.report.style.use`.

    Returns
    -------
    Figure
    """
    missing = [c for c in THRESHOLD_COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"threshold_figure needs the columns {list(THRESHOLD_COLUMNS)}; missing {missing}")
    if fig is None:
        fig = Figure(figsize=(7.0, 3.1), layout="constrained")
    with sty.use(style):
        axes = fig.subplots(1, 2)
        start = 0
        for ax, panel, letter in zip(axes, ("ctpo", "m2po"), "ab", strict=True):
            rows = frame[frame["panel"] == panel]
            handles = _panel(ax, rows, start)
            start += len(handles)
            ax.set_xscale("log")
            ax.set_ylim(-0.02, 1.02)
            xlabel, ylabel = _LABELS[panel]
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(f"({letter}) {'CTPO' if panel == 'ctpo' else 'M2PO'}", loc="left", fontweight="bold")
            if (rows["method"] == "binding").any():
                handles.append(
                    Line2D(
                        [],
                        [],
                        ls="",
                        marker="x",
                        ms=6,
                        mew=1.2,
                        color="0.2",
                        label=r"first $t$ with $p_t \geq 1/2$",
                    )
                )
            if (rows["method"] == "monte_carlo").any():
                handles += [
                    Line2D([], [], marker="o", ls="", color="0.2", label="Monte Carlo, 95 % interval"),
                    Line2D([], [], marker="o", ls="", color="0.2", mfc="white", label="flagged unreliable"),
                ]
            ax.legend(handles=handles, loc="best", fontsize=sty.small_font(), frameon=False)
        if title:
            fig.suptitle(title)
    return fig
