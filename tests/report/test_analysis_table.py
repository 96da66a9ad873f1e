"""Text output of a run of steps (render_run): one row per step, buckets spread into columns."""

import json

import numpy as np
import pandas as pd
import pytest

from variance_lab.report.analysis_table import render_run, run_wide, step_ranges


def _frames():
    """Two steps; step 2 has no sequence of length 8-15."""
    steps = pd.DataFrame(
        {
            "step": [1, 2],
            "dump": ["a_1.npz", "a_2.npz"],
            "n_sequences": [30, 25],
            "n_tokens": [1200, 1100],
            "mu_y": [1e-4, 2e-4],
            "sigma2_y": [3e-4, 4e-4],
            "gspo_clip_frac": [0.5, 0.6],
            "gspo_clip_pred": [0.55, 0.58],
            "ppo_clip_frac": [0.0, 1e-3],
            "ppo_clip_pred": [1e-9, 2e-3],
            "khat_P": [0.31, np.nan],
            "mismatch_k3_kl": [np.nan, np.nan],
            "mismatch_share": [np.nan, np.nan],
            "verdict": ["iid-lognormal", "none"],
        }
    )
    buckets = pd.DataFrame(
        {
            "step": [1, 1, 2],
            "T_lo": [8, 16, 16],
            "T_hi": [15, 31, 31],
            "n_seq": [10, 20, 25],
            "var_G": [2e-5, 1e-5, 1.5e-5],
            "gspo_clip_frac": [0.4, 0.55, 0.6],
            "ppo_clip_frac": [0.0, 0.0, 1e-3],
            "khat_P": [np.nan, 0.2, 0.25],
        }
    )
    run = {
        "root": "/runs/a",
        "n_steps": 2,
        "layout_description": "token log-prob files",
        "ratio": "update",
        "ratio_label": "the update ratio pi_theta/pi_old",
        "notes": ["1 other entry not read: x.txt"],
        "step_notes": [{"text": "the step's dump: a note", "steps": [1, 2]}],
    }
    return steps, buckets, run


def test_step_ranges():
    """Runs of consecutive steps are joined."""
    assert step_ranges([5, 1, 2, 3, 8, 9, 3]) == "1-3, 5, 8-9"
    assert step_ranges([4]) == "4"


def test_wide_has_a_column_per_statistic_and_bucket():
    """One row per step; a bucket a step lacks is NaN (0 sequences)."""
    steps, buckets, _ = _frames()
    wide = run_wide(steps, buckets)
    assert wide["step"].tolist() == [1, 2]
    assert wide["n_seq_T8-15"].tolist() == [10, 0]
    assert wide["var_G_T8-15"].iloc[0] == 2e-5
    assert np.isnan(wide["var_G_T8-15"].iloc[1])
    assert wide["khat_P_T16-31"].tolist() == [0.2, 0.25]
    assert list(wide.columns[: len(steps.columns)]) == list(steps.columns)


def test_markdown_csv_and_json():
    """Markdown: the run, its notes, a table per statistic; csv: the wide frame; json: steps with buckets."""
    steps, buckets, run = _frames()
    text = render_run(steps, buckets, run, title="# run")
    assert text.startswith("# run\n\nRun: 2 steps (1-2) of token log-prob files in /runs/a\n")
    assert "Note: 1 other entry not read: x.txt" in text
    assert "Note (steps 1-2): the step's dump: a note" in text
    assert "| 2 | n/a | 1.500e-05 |" in text  # Var(G_T): step 2 has no sequence of length 8-15
    assert "| 1 | 30 | 1,200 |" in text
    csv = render_run(steps, buckets, run, "csv")
    assert csv.splitlines()[0].split(",")[-2:] == ["khat_P_T8-15", "khat_P_T16-31"]
    doc = json.loads(render_run(steps, buckets, run, "json", summaries=[{"a": 1}, {"a": 2}]))
    assert [s["summary"]["a"] for s in doc["steps"]] == [1, 2]
    assert [len(s["buckets"]) for s in doc["steps"]] == [2, 1]
    assert doc["steps"][1]["khat_P"] is None
    with pytest.raises(ValueError, match="unknown table format 'latex'"):
        render_run(steps, buckets, run, "latex")
