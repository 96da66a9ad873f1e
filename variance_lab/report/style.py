"""House style of the figures: one-column paper size, Okabe-Ito colours, log10 axes.

:func:`paper` is a :func:`matplotlib.rc_context`; nothing here changes global state.
"""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
from matplotlib import ticker

__all__ = [
    "COLUMN_WIDTH",
    "OKABE_ITO",
    "RC",
    "SEQUENTIAL_CMAP",
    "clip_log10",
    "color",
    "log10_axis",
    "paper",
]

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

RC = {
    "font.size": 7.5,
    "axes.labelsize": 7.5,
    "axes.titlesize": 7.5,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "legend.frameon": False,
    "legend.handlelength": 1.8,
    "axes.prop_cycle": mpl.cycler(color=list(OKABE_ITO)),
    "figure.dpi": 100,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "pdf.fonttype": 42,
    "mathtext.fontset": "dejavusans",
    "svg.hashsalt": "variance_lab",
}


#: Marker style of every data point with error bars (figures, analysis and experiment panels).
ERRORBAR = {"fmt": "o", "ms": 3.2, "elinewidth": 0.7, "capsize": 1.5, "zorder": 3}


def paper():
    """Context manager applying :data:`RC` (``with style.paper(): ...``)."""
    return mpl.rc_context(RC)


def color(i: int) -> str:
    """Return the ``i``-th Okabe-Ito colour (cycling)."""
    return OKABE_ITO[i % len(OKABE_ITO)]


def _power_of_ten(value: float, _pos=None) -> str:
    if not math.isfinite(value) or abs(value - round(value)) > 1e-9:
        return ""
    return f"$10^{{{round(value)}}}$"


def log10_axis(ax, which: str = "y") -> None:
    """Label an axis that shows log10 values as powers of ten (``10^k`` at integer k).

    Plotting log10 values on a linear axis keeps quantities beyond float range, such as
    Var(P_T) at T = 10^5, drawable; the ticks read as a log axis.
    """
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(ticker.MaxNLocator(nbins=6, integer=True, steps=[1, 2, 5, 10]))
    axis.set_major_formatter(ticker.FuncFormatter(_power_of_ten))
    axis.set_minor_locator(ticker.NullLocator())


def clip_log10(values, floor: float = -300.0) -> np.ndarray:
    """log10 of non-negative values, with 0 and negatives mapped to ``floor``."""
    arr = np.asarray(values, dtype=float)
    out = np.full(arr.shape, floor)
    pos = arr > 0
    out[pos] = np.log10(arr[pos])
    return out
