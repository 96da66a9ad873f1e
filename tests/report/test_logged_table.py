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


def test_not_judged_records_and_repeated_steps():
    """A record not judged is listed under Notes and marked in the table; CSV joins on the record."""
    from variance_lab.report.logged_table import render_logged

    rec = {"step": 5, "token_mult_prob_error": 1.024, "sampling_importance_ratio": 0.06}
    records = [rec, rec | {"token_mult_prob_error": "x"}, rec]  # step 5 twice: a restarted run
    laws, metrics = lg.analyze_logged(
        records, batch_size=8, quantiles=[100], ratio_level="sequence", n_batches=100, source="run.jsonl"
    )
    text = render_logged(laws, metrics, title="t")
    assert "## Notes (1 of 3 records not judged)" in text
    assert "- record 2 (step 5), not judged: run.jsonl: record 2: field 'token_mult_prob_error'" in text
    assert text.count("not judged (record 2: see Notes)") == 2  # one row per sequence metric
    csv = render_logged(laws, metrics, "csv", title="t").splitlines()
    assert len(csv) == 1 + 3 * 2  # one row per record and metric: no row doubled by the repeated step
    assert csv[0].endswith(",framework,m,s2,source,note")
    json_text = render_logged(laws, metrics, "json", title="t")
    assert '"verdict": "not judged"' in json_text
