"""The one tidy panel row of the figures' frames."""

import math

from variance_lab.paper.panel_rows import panel_row
from variance_lab.report.threshold_figure import THRESHOLD_COLUMNS


def test_row_has_the_figures_columns_and_types():
    """Keys in THRESHOLD_COLUMNS' order, numbers as floats, the series a string, NaN bounds by default."""
    row = panel_row("q", 3, 1, "exact", 2)
    assert tuple(row) == THRESHOLD_COLUMNS
    assert row["series"] == "3"
    assert all(type(row[k]) is float for k in ("x", "value", "lo", "hi"))
    assert math.isnan(row["lo"])
    assert math.isnan(row["hi"])
    assert row["reliable"] is True
    assert panel_row("q", "a", 0.5, "monte_carlo", 0.1, 0.05, 0.2, 0)["reliable"] is False
