"""One row of a figure's tidy panel data: the schema ``panel, series, x, method, value, lo, hi, reliable``.

The frames of the ``thresholds`` (:func:`variance_lab.paper.frames.threshold_frame`), ``prob_masks``
(:mod:`variance_lab.paper.probmask_frame`) and the 2025-26 methods' figures
(:mod:`variance_lab.paper.method_frames`) share it; their figures read it as
:data:`variance_lab.report.threshold_figure.THRESHOLD_COLUMNS`.
"""

from __future__ import annotations

import math

__all__ = ["panel_row"]


def panel_row(panel, series, x, method, value, lo=math.nan, hi=math.nan, reliable=True) -> dict:
    """Return one tidy row: ``x``, ``value``, ``lo``, ``hi`` as floats, ``series`` as a string.

    ``lo``/``hi`` (NaN by default) bound ``value`` where it is estimated; ``reliable`` is the
    Monte Carlo verdict (True for exact values and data).
    """
    return {
        "panel": panel,
        "series": str(series),
        "x": float(x),
        "method": method,
        "value": float(value),
        "lo": float(lo),
        "hi": float(hi),
        "reliable": bool(reliable),
    }
