r"""Figure of the empirical analysis: observed Var(P_T), Var(G_T) per length bucket against the predictions.

Drawn from tidy frames only: the per-bucket table
(:data:`variance_lab.rollouts.analysis.ANALYSIS_COLUMNS`) and the prediction curves
(:meth:`~variance_lab.rollouts.analysis.AnalysisResult.curves`,
:data:`~variance_lab.rollouts.analysis.CURVE_COLUMNS`).

Each bucket is a point at its mean length with its bootstrap interval as a vertical bar and
its range of lengths as a horizontal bar; the three predictions are lines over :math:`T`
(single-length predictions; a bucket's own prediction in the table averages over its
lengths); where the three agree within :data:`COINCIDE` (relative) over the whole panel they
are one line with one legend entry. Variances are real values on a true log axis (values
beyond float range are left out); :math:`T` is on a log axis. A
:math:`\operatorname{Var}(P_T)` point is hollow when Kong's effective sample size of the bucket's
:math:`P_T` is under :data:`ESS_RELIABLE` of its sequences: its sample variance
then rests on a few sequences and is erratic: usually far below the truth, sometimes
far above it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib import ticker, transforms
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D

from variance_lab.report import style
from variance_lab.report import style as _style
from variance_lab.report.figure_kit import T_LABEL, centre_note, panel_axes

__all__ = ["COINCIDE", "ESS_RELIABLE", "LEGEND_HEIGHT", "MODEL_STYLE", "analysis_figure"]

#: Predictions that differ by less than this (relative) everywhere in a panel are drawn as one line.
COINCIDE = 0.1

#: A Var(P_T) point is drawn hollow when ess_P < ESS_RELIABLE * n_seq.
ESS_RELIABLE = 0.1

#: Line style and legend label of each prediction (Okabe-Ito colours).
MODEL_STYLE = {
    "iid": {
        "color": style.color(1),
        "ls": "--",
        "marker": "s",
        "markevery": 0.2,
        "label": "i.i.d. lognormal fit",
    },
    "emp": {"color": style.color(4), "ls": ":", "marker": "v", "markevery": 0.2, "label": "i.i.d. empirical"},
    "corr": {
        "color": style.color(3),
        "ls": "-",
        "marker": "^",
        "markevery": 0.2,
        "label": "autocorrelation-corrected",
    },
}
_DATA_COLOR = style.color(0)
_PANEL = {
    "P": ("log10_var_P", "log10_var_P_lo", "log10_var_P_hi", r"$\mathrm{Var}(P_T)$"),
    "G": ("log10_var_G", "log10_var_G_lo", "log10_var_G_hi", r"$\mathrm{Var}(G_T)$"),
}
#: Order in which the predictions stand in for all of them when they coincide (one line).
_MERGED_ORDER = ("corr", "iid", "emp")
#: Height a legend below the panels adds to a new figure, inches.
LEGEND_HEIGHT = 1.3


def _panel_axes(fig, ax, panels: Sequence[str], figsize=None, legend: bool = False):
    """(figure, list of axes, one per panel, new figure?): a new one-column figure when neither is given.

    A new figure makes room for the legend below its panels (:data:`LEGEND_HEIGHT`).
    """
    height = 0.4 + 1.9 * len(panels) + (LEGEND_HEIGHT if legend else 0.0)
    return panel_axes(fig, ax, panels, figsize, height)


def _t_range(table: pd.DataFrame, curves: pd.DataFrame) -> tuple[float, float]:
    """Smallest and largest T drawn: the buckets' ranges and the curves' grid."""
    values = np.concatenate(
        [table[c].to_numpy(float) for c in ("T_min", "T_max") if c in table] + [curves["T"].to_numpy(float)]
    )
    values = values[np.isfinite(values) & (values > 0)]
    return (float(values.min()), float(values.max())) if values.size else (1.0, 10.0)


def _t_axis(axis, t_min: float, t_max: float) -> None:
    """Log T axis whose labels never run together: fewer labelled ticks per decade the more decades.

    Over 2.5 decades: powers of ten; over one: 1, 2, 5 per decade; over half a decade: 1, 2, 3,
    5; within half a decade every integer step (T = 3..4 gets 3 and 4).
    """
    decades = math.log10(t_max / t_min) if t_max > t_min else 0.0
    if decades > 2.5:
        subs = (1.0,)
    elif decades > 1.0:
        subs = (1.0, 2.0, 5.0)
    elif decades > 0.5:
        subs = (1.0, 2.0, 3.0, 5.0)
    else:
        subs = tuple(float(k) for k in range(1, 10))
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(ticker.LogLocator(base=10.0, subs=subs))
    axis.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.xaxis.set_minor_formatter(ticker.NullFormatter())


def _data_points(ax, table: pd.DataFrame, panel: str) -> None:
    y_col, lo_col, hi_col, _ = _PANEL[panel]
    rows = table[np.isfinite(table[y_col].to_numpy(float))]
    if rows.empty:
        _no_data_note(ax, table, panel)
        return
    x, y = rows["T_mean"].to_numpy(float), style.power10(rows[y_col])
    lo, hi = style.power10(rows[lo_col]), style.power10(rows[hi_col])
    lo, hi = np.where(np.isfinite(lo), np.minimum(lo, y), y), np.where(np.isfinite(hi), np.maximum(hi, y), y)
    xerr = np.vstack([x - rows["T_min"].to_numpy(float), rows["T_max"].to_numpy(float) - x])
    ok = np.ones(x.size, dtype=bool)
    if panel == "P":
        ok = rows["ess_P"].to_numpy(float) >= ESS_RELIABLE * rows["n_seq"].to_numpy(float)
    for sel, face in ((ok, _DATA_COLOR), (~ok, "white")):
        if sel.any():
            ax.errorbar(
                x[sel],
                y[sel],
                yerr=[y[sel] - lo[sel], hi[sel] - y[sel]],
                xerr=xerr[:, sel],
                color=_DATA_COLOR,
                mfc=face,
                mec=_DATA_COLOR,
                **style.ERRORBAR,
            )


def _no_data_note(ax, table: pd.DataFrame, panel: str) -> None:
    """Say on an empty panel why it holds no observed point (and no line, where none either)."""
    quantity = _PANEL[panel][3]
    n_seq = table["n_seq"].to_numpy(float) if "n_seq" in table else np.array([])
    if n_seq.size and np.all(n_seq < 2):
        why = f"no observed {quantity}:\na sample variance needs at least\n2 sequences in a bucket"
    else:
        why = f"no observed {quantity}:\nno bucket has a finite one"
    if not ax.get_lines():
        why += "\n(and no prediction to draw)"
    centre_note(ax, why, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def _spread(curves: pd.DataFrame, y_col: str) -> float:
    """Largest relative difference between the predictions at any T (inf when fewer than two)."""
    wide = curves.pivot_table(index="T", columns="model", values=y_col).dropna()
    if wide.shape[1] < 2 or wide.empty:
        return math.inf
    return float(10 ** (wide.max(axis=1) - wide.min(axis=1)).max() - 1)


def _prediction_lines(ax, curves: pd.DataFrame, panel: str) -> None:
    y_col = _PANEL[panel][0]
    spread = _spread(curves[curves["model"].isin(list(MODEL_STYLE))], y_col)
    if spread < COINCIDE:
        present = [m for m in _MERGED_ORDER if np.isfinite(curves.loc[curves["model"] == m, y_col]).any()]
        rows = curves[curves["model"] == present[0]].sort_values("T")
        many, count = ("all three", "three") if len(present) == 3 else ("both", "two")
        label = f"{many} predictions, one line\n(their spread is given in each panel)"
        ax.plot(rows["T"], style.power10(rows[y_col]), color="0.35", ls="-", lw=1.6, label=label)
        ax.text(
            0.98,
            0.04 if panel == "P" else 0.96,
            f"the {count} predictions differ by at most {100 * spread:.1f} %",
            transform=ax.transAxes,
            ha="right",
            va="bottom" if panel == "P" else "top",
            fontsize=style.small_font(),
            color="0.35",
        )
        return
    for model, kw in MODEL_STYLE.items():
        rows = curves[curves["model"] == model].sort_values("T")
        if not rows.empty:
            ax.plot(rows["T"], style.power10(rows[y_col]), **kw)


def _has_hollow(table: pd.DataFrame) -> bool:
    rows = table[np.isfinite(table["log10_var_P"].to_numpy(float))]
    return bool(np.any(rows["ess_P"].to_numpy(float) < ESS_RELIABLE * rows["n_seq"].to_numpy(float)))


def _below_x_label(ax) -> float:
    """Points from the bottom of ``ax`` to below its x tick labels and x label (rcParams)."""

    def pts(key):
        return FontProperties(size=mpl.rcParams[key]).get_size_in_points()

    ticks = mpl.rcParams["xtick.major.size"] + mpl.rcParams["xtick.major.pad"] + 1.2 * pts("xtick.labelsize")
    return ticks + mpl.rcParams["axes.labelpad"] + 1.2 * pts("axes.labelsize") + 4.0


def _legend(
    ax, level: float | None, hollow: bool, loc: str, axes=(), below: bool = False, observed: bool = True
) -> None:
    handles, seen = [], set()
    for axis in axes or [ax]:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label not in seen and not label.startswith("_"):
                seen.add(label)
                handles.append(handle)
    ci = f"{100 * level:g}% bootstrap" if level is not None else "bootstrap"
    if observed:  # no entry for points that no panel has
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=_DATA_COLOR,
                label=f"observed per bucket ({ci} CI;\nhorizontal bar: range of $T$)",
            )
        )
    if hollow:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=_DATA_COLOR,
                mfc="white",
                label=f"observed, ESS of $P_T$ < {ESS_RELIABLE:g} n",
            )
        )
    if not below:
        ax.legend(handles=handles, loc=loc)
        return
    # under the x label, centred on the figure (its full width): constrained layout makes room
    under = transforms.offset_copy(ax.transAxes, fig=ax.figure, y=-_below_x_label(ax), units="points")
    at = transforms.blended_transform_factory(ax.figure.transFigure, under)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=at)


def analysis_figure(
    table: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    fig=None,
    ax=None,
    panels: Sequence[str] = ("P", "G"),
    level: float | None = 0.95,
    legend: bool = True,
    figsize=None,
    style=None,
) -> Figure:
    r"""Observed Var(P_T) and Var(G_T) per length bucket with intervals, against the three predictions.

    Parameters
    ----------
    table : pandas.DataFrame
        Per-bucket frame (:data:`variance_lab.rollouts.analysis.ANALYSIS_COLUMNS`; uses ``T_min``,
        ``T_mean``, ``T_max``, ``n_seq``, ``ess_P`` and the ``log10_var_*`` columns).
    curves : pandas.DataFrame
        Prediction curves (:data:`variance_lab.rollouts.analysis.CURVE_COLUMNS`).
    fig : matplotlib.figure.Figure, optional
        Draw the panels into this figure (stacked, shared :math:`T` axis).
    ax : matplotlib.axes.Axes or sequence of Axes, optional
        Draw into these axes instead, one per panel.
    panels : sequence of {"P", "G"}
        Which variances to draw, top to bottom.
    level : float or None
        Confidence level of the intervals, for the legend.
    legend : bool
        Draw a legend: in a new figure below the panels (the lowest panel's legend, under its
        x label); in a given ``fig`` or ``ax`` in the Var(G_T) panel, lower left, where there is one.
    figsize : (float, float), optional
        Size of a new figure (default 3.4 in wide, 1.9 in per panel and :data:`LEGEND_HEIGHT`
        for the legend).
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package's paper style
        (:func:`variance_lab.report.style.use`).

    Returns
    -------
    matplotlib.figure.Figure
    """
    panels = list(panels)
    if not panels or any(p not in _PANEL for p in panels):
        raise ValueError(f"panels must be a non-empty sequence of 'P' and 'G', got {panels!r}")
    with _style.use(style):
        fig, axes, new = _panel_axes(fig, ax, panels, figsize, legend)
        t_min, t_max = _t_range(table, curves)
        for axis, panel in zip(axes, panels, strict=True):
            _t_axis(axis, t_min, t_max)
            _prediction_lines(axis, curves, panel)
            _data_points(axis, table, panel)
            axis.set_yscale("log")
            axis.set_ylabel(f"{_PANEL[panel][3]} (dimensionless)")
        axes[-1].set_xlabel(T_LABEL)
        hollow = "P" in panels and _has_hollow(table)
        observed = any(np.isfinite(table[_PANEL[p][0]].to_numpy(float)).any() for p in panels)
        if legend and new:  # below the panels, under the lowest one's x label
            _legend(axes[-1], level, hollow, "upper center", axes, below=True, observed=observed)
        elif legend:  # Var(G_T) falls with T: its lower left is free
            at = panels.index("G") if "G" in panels else 0
            loc = "lower left" if panels[at] == "G" else "upper left"
            _legend(axes[at], level, hollow, loc, axes, observed=observed)
    return fig
