"""House style of the figures: an opt-in paper style sheet, Okabe-Ito colours, log-axis helpers.

Nothing here changes global state. Plot functions of :mod:`variance_lab.report` draw with
the caller's :data:`matplotlib.rcParams` (so :func:`matplotlib.pyplot.rc_context` and
:func:`matplotlib.pyplot.style.use` apply) unless they are given ``style=``: ``"paper"``
applies the shipped style sheet :data:`STYLE_FILE` (one column of a two-column paper,
text at least 7 pt at 3.4 in width), any other value is passed to
:func:`matplotlib.style.context` (a style name, a file or a dict of rcParams).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import matplotlib as mpl
import matplotlib.style
import numpy as np
from matplotlib import ticker

__all__ = [
    "COLUMN_WIDTH",
    "DIVERGING_CMAP",
    "ERRORBAR",
    "MARGINAL_FILL",
    "MIN_FONT_PT",
    "PNG_DPI",
    "RC",
    "SEQUENTIAL_CMAP",
    "STYLE_FILE",
    "color",
    "errorbar_points",
    "frame_points",
    "line_style",
    "log10_axis",
    "paper",
    "power10",
    "resolve",
    "small_font",
    "use",
]

#: Smallest text size of any figure, points (journals ask for 7-8 pt at print size).
MIN_FONT_PT = 7.0
#: PNG resolution (dots per inch) of the package's figures.
PNG_DPI = 200

#: Okabe & Ito (2008) colour-blind-safe palette, black first.
OKABE_ITO = (
    "#000000",  # black
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#009E73",  # bluish green
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#F0E442",  # yellow (last: poor contrast on white)
)
#: Width of one column of a two-column paper, inches.
COLUMN_WIDTH = 3.4
#: Perceptually uniform and colour-vision-deficiency friendly colour map for heatmaps.
SEQUENTIAL_CMAP = "cividis"
#: Diverging colour map (growth against decay), readable by colour-blind readers.
DIVERGING_CMAP = "PuOr_r"
#: The shipped paper style sheet (package data).
STYLE_FILE = Path(__file__).with_name("paper.mplstyle")
#: The rcParams of :data:`STYLE_FILE`, as a dict.
RC = dict(mpl.rc_params_from_file(STYLE_FILE, use_default_template=False))

#: Marker style of every data point with error bars (figures, analysis and experiment panels).
ERRORBAR = {"fmt": "o", "ms": 3.2, "elinewidth": 0.7, "capsize": 1.5, "zorder": 3}

#: Series styles that stay apart in greyscale: colour, line style and marker all differ.
_SERIES = (
    (OKABE_ITO[4], "-", "o"),
    (OKABE_ITO[5], "--", "s"),
    (OKABE_ITO[0], ":", "^"),
    (OKABE_ITO[3], "-.", "D"),
    (OKABE_ITO[6], (0, (5, 1, 1, 1, 1, 1)), "v"),
    (OKABE_ITO[1], (0, (1, 1)), "P"),
)


def resolve(style):
    """Return what :func:`matplotlib.style.context` takes for ``style`` (``"paper"``: :data:`STYLE_FILE`)."""
    if isinstance(style, str) and style == "paper":
        return str(STYLE_FILE)
    return style


def use(style=None):
    """Context manager applying ``style`` for the drawing inside it; ``None`` changes nothing.

    Parameters
    ----------
    style : None, str, path or dict
        ``None``: the caller's rcParams as they are; ``"paper"``: :data:`STYLE_FILE`; any
        other matplotlib style name, style file or dict of rcParams.
    """
    if style is None:
        return contextlib.nullcontext()
    return matplotlib.style.context(resolve(style))


def paper():
    """Context manager applying the paper style (``with style.paper(): ...``)."""
    return use("paper")


def line_style(i: int) -> dict:
    """Colour, line style and marker of the ``i``-th series: distinct in colour and in greyscale."""
    col, ls, marker = _SERIES[i % len(_SERIES)]
    return {"color": col, "ls": ls, "marker": marker}


def color(i: int) -> str:
    """Return the ``i``-th Okabe-Ito colour (cycling)."""
    return OKABE_ITO[i % len(OKABE_ITO)]


#: Fill style of points flagged "marginal" (precise, interval may under-cover): half filled.
MARGINAL_FILL = "left"


def errorbar_points(ax, x, y, lo, hi, reliable, color: str, marker: str | None = None, marginal=None) -> None:
    """Draw points ``y`` with interval bars ``[lo, hi]``: filled where ``reliable``, hollow elsewhere.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x, y, lo, hi : numpy.ndarray
        Positions, values and interval ends, one per point (``lo <= y <= hi``).
    reliable : numpy.ndarray of bool
        Points drawn filled; the others get a white face.
    color : str
        Colour of markers, edges and bars.
    marker : str, optional
        Marker (:data:`ERRORBAR`'s ``"o"`` by default).
    marginal : numpy.ndarray of bool, optional
        Of the points not ``reliable``, those drawn half filled (:data:`MARGINAL_FILL`): flagged
        "marginal" (a sound value whose interval may cover less than its level) rather than
        "unreliable" (hollow).
    """
    kw = ERRORBAR if marker is None else {**ERRORBAR, "fmt": marker}
    reliable = np.asarray(reliable, bool)
    half = np.zeros_like(reliable) if marginal is None else np.asarray(marginal, bool) & ~reliable
    for mask, face, fill in (
        (reliable, color, "full"),
        (half, color, MARGINAL_FILL),
        (~reliable & ~half, "white", "full"),
    ):
        if mask.any():
            ax.errorbar(
                x[mask],
                y[mask],
                yerr=[y[mask] - lo[mask], hi[mask] - y[mask]],
                color=color,
                mfc=face,
                mfcalt="white",
                fillstyle=fill,
                mec=color,
                **kw,
            )


def frame_points(ax, rows, color: str, marker: str | None = None) -> None:
    """Draw :func:`errorbar_points` of a panel frame's ``x``, ``value``, ``lo``, ``hi`` and ``reliable``.

    A missing interval end (NaN) draws the point alone on that side; ends are widened to hold
    the point.
    """
    x, y = rows["x"].to_numpy(float), rows["value"].to_numpy(float)
    lo, hi = rows["lo"].to_numpy(float), rows["hi"].to_numpy(float)
    lo, hi = np.where(np.isfinite(lo), np.minimum(lo, y), y), np.where(np.isfinite(hi), np.maximum(hi, y), y)
    errorbar_points(ax, x, y, lo, hi, rows["reliable"].to_numpy(bool), color, marker=marker)


def _power_of_ten(value: float, _pos=None) -> str:
    if not math.isfinite(value) or abs(value - round(value)) > 1e-9:
        return ""
    return f"$10^{{{round(value)}}}$"


def log10_axis(ax, which: str = "y") -> None:
    """Label an axis that shows log10 values as powers of ten (``10^k`` at integer k).

    For quantities beyond float range only (Var(P_T) at T = 10^5): the data on such an axis
    are log10 numbers, not values, so overlaying real values needs ``np.log10`` first.
    Everything in float range is drawn on a true log axis (``set_yscale("log")``) instead.
    """
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(ticker.MaxNLocator(nbins=6, integer=True, steps=[1, 2, 5, 10]))
    axis.set_major_formatter(ticker.FuncFormatter(_power_of_ten))
    axis.set_minor_locator(ticker.NullLocator())


def power10(log10_values) -> np.ndarray:
    """Real values from log10 values: ``10**x``, ``inf`` beyond float range (not drawn on a log axis)."""
    x = np.asarray(log10_values, dtype=float)
    with np.errstate(over="ignore"):
        return np.power(10.0, x)


def small_font() -> float:
    """Size of secondary text (contour labels, notes): 85 % of ``font.size``, at least :data:`MIN_FONT_PT`."""
    return max(MIN_FONT_PT, 0.85 * float(mpl.rcParams["font.size"]))
