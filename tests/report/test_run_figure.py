"""The figure of a run across steps: panels, what is left out, given axes, bad arguments."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from variance_lab.report.run_figure import PANEL_LABELS, PANELS, run_figure
from variance_lab.stats import KHAT_THRESHOLD


def _frames(mismatch=True):
    """Four steps; buckets 8-15 (never 20 sequences), 16-31 (too few in step 2), 32-63 (always enough)."""
    steps = pd.DataFrame(
        {
            "step": [1, 2, 3, 4],
            "gspo_clip_frac": [0.3, 0.4, 0.5, 0.6],
            "ppo_clip_frac": [1e-3, 2e-3, 3e-3, 4e-3],
            "khat_P": [0.2, 0.4, 0.6, 0.8],
            "mismatch_k3_kl": [1e-4, 2e-4, 4e-4, 8e-4] if mismatch else [np.nan] * 4,
        }
    )
    rows = []
    for s in (1, 2, 3, 4):
        for lo, hi, n in ((8, 15, 5), (16, 31, 10 if s == 2 else 30), (32, 63, 40)):
            rows.append(
                {"step": s, "T_lo": lo, "T_hi": hi, "n_seq": n, "var_G": 1e-5 * s, "var_G_lo": 0.8e-5 * s,
                 "var_G_hi": 1.2e-5 * s, "gspo_clip_frac": 0.1 * s + lo / 1000, "ppo_clip_frac": 1e-3 * s,
                 "khat_P": 0.1 * s + lo / 100}
            )  # fmt: skip
    return steps, pd.DataFrame(rows)


def _line(ax, label):
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return line


def test_five_panels_over_the_steps_with_their_scales():
    """A new figure: the five panels top to bottom, shared step axis, log Var(G_T) and mismatch."""
    fig = run_figure(*_frames())
    axes = fig.axes
    assert [a.get_ylabel() for a in axes] == [PANEL_LABELS[p] for p in PANELS]
    assert axes[-1].get_xlabel() == "training step"
    assert [a.get_yscale() for a in axes] == ["linear", "linear", "log", "linear", "log"]
    np.testing.assert_array_equal(_line(axes[0], "all lengths").get_ydata(), [0.3, 0.4, 0.5, 0.6])
    np.testing.assert_array_equal(_line(axes[4], "_mismatch").get_ydata(), [1e-4, 2e-4, 4e-4, 8e-4])
    limit = _line(axes[3], rf"$\hat k$ = {KHAT_THRESHOLD:g}")
    assert limit.get_ydata()[0] == KHAT_THRESHOLD
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["$T$ 16-31", "$T$ 32-63", "all lengths", rf"$\hat k$ = {KHAT_THRESHOLD:g}"]


def test_buckets_with_too_few_sequences_are_not_drawn():
    """A bucket value rests on min_seq sequences at least: a gap where fewer, no line where never."""
    fig = run_figure(*_frames())
    gspo = fig.axes[0]
    y = _line(gspo, "$T$ 16-31").get_ydata()
    assert np.isnan(y[1])
    np.testing.assert_allclose(np.asarray(y)[[0, 2, 3]], [0.116, 0.316, 0.416])
    assert not [ln for ln in gspo.get_lines() if ln.get_label() == "$T$ 8-15"]
    fig = run_figure(*_frames(), min_seq=5, panels=["khat"])
    assert _line(fig.axes[0], "$T$ 8-15").get_ydata().tolist() == pytest.approx([0.18, 0.28, 0.38, 0.48])


def test_no_mismatch_and_no_clip_say_so():
    """Dumps without the engine's log-probs: a note and no line; no token clipped anywhere: a note."""
    fig = run_figure(*_frames(mismatch=False), panels=["mismatch"])
    (ax,) = fig.axes
    assert not ax.get_lines()
    assert "no inference-engine log-probs" in ax.texts[0].get_text()
    steps, buckets = _frames()
    steps["ppo_clip_frac"], buckets["ppo_clip_frac"] = 0.0, 0.0
    fig = run_figure(steps, buckets, panels=["gspo", "ppo"])
    assert not fig.axes[0].texts
    assert fig.axes[1].texts[0].get_text() == "no token clipped in any step"


def test_draws_into_given_axes_and_refuses_bad_arguments():
    """ax= draws there (legend in the top panel); a wrong number of axes or panel, or no step: ValueError."""
    fig, axes = plt.subplots(2, 1)
    assert run_figure(*_frames(), ax=axes, panels=["gspo", "khat"]) is fig
    assert axes[0].get_legend() is not None
    with pytest.raises(ValueError, match="ax must hold 2 axes"):
        run_figure(*_frames(), ax=axes[0], panels=["gspo", "khat"])
    with pytest.raises(ValueError, match="panels must be a non-empty sequence"):
        run_figure(*_frames(), panels=["var_P"])
    steps, buckets = _frames()
    with pytest.raises(ValueError, match="steps is empty"):
        run_figure(steps.iloc[:0], buckets)
