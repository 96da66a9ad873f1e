"""Tests of variance_lab.report.logged_table: the logged-metrics judgment as markdown, CSV and JSON."""

from __future__ import annotations

import pytest

from variance_lab.frameworks import logged as lg


def test_render_logged_formats():
    """The report renders the two frames; an unknown format is refused."""
    from variance_lab.report.logged_table import render_logged

    laws, metrics = lg.analyze_logged(
        [{"token_mult_prob_error": 1.024, "sampling_importance_ratio": 0.06}],
        batch_size=8,
        quantiles=[100],
        framework="nemo-rl",
        ratio_level="sequence",
        n_batches=100,
    )
    text = render_logged(laws, metrics, title="t")
    assert text.startswith("# t\n")
    assert "sampling_importance_ratio" in text
    assert render_logged(laws, metrics, "csv", title="t").startswith("record,step,metric,logged")
    with pytest.raises(ValueError, match="unknown format 'html'"):
        render_logged(laws, metrics, "html", title="t")
