"""The clip-fraction figure (variance_lab.report.clip_figure), drawn under the Agg backend."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style
from variance_lab.report.clip_figure import (
    MARKER_SIZES,
    MODEL_MARKERS,
    bucket_key,
    clip_figure,
    clip_kinds,
    clip_models,
)
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.predictions import ALL_MODELS


def _table(extra_models=(), gmpo=False) -> pd.DataFrame:
    """Three buckets with observed fractions, intervals and predictions of the five models (+ extra)."""
    t = {
        "bucket": [3, 4, 5],
        "T_mean": [10.0, 20.0, 40.0],
        "gspo_clip_frac": [0.1, 0.35, 0.6],
        "gspo_clip_frac_lo": [0.07, 0.3, 0.55],
        "gspo_clip_frac_hi": [0.14, 0.4, 0.65],
        "gspo_clip_pred": [0.9, 0.8, 0.7],  # unsuffixed copy of corr: not a model
        "gspo_clip_pred_iid": [0.91, 0.81, 0.71],
        "gspo_clip_pred_emp": [np.nan, np.nan, np.nan],
        "gspo_clip_pred_corr": [0.9, 0.8, 0.7],
        "gspo_clip_pred_mix": [0.5, 0.7, 0.65],
        "gspo_clip_pred_hier": [0.3, 0.4, 0.5],
        "ppo_clip_frac": [1e-3, 2e-3, 0.0],
        "ppo_clip_frac_lo": [0.0, 1e-3, 0.0],
        "ppo_clip_frac_hi": [2e-3, 3e-3, 5e-4],
        "ppo_clip_pred": [1e-31] * 3,
        "ppo_clip_pred_iid": [1e-31] * 3,
        "ppo_clip_pred_emp": [1e-3] * 3,
        "ppo_clip_pred_corr": [1e-31] * 3,
        "ppo_clip_pred_mix": [5e-5] * 3,
        "ppo_clip_pred_hier": [5e-4, 4e-4, 3e-4],
    }
    for k, m in enumerate(extra_models):  # each its own values: equal predictions share one marker
        t[f"gspo_clip_pred_{m}"] = [0.12 + 0.02 * k, 0.33, 0.61]
        t[f"ppo_clip_pred_{m}"] = [9e-4, 2e-3, 2e-4 * (k + 1)]
    if gmpo:
        t |= {
            "gmpo_clip_frac": [0.01, 0.02, 0.03],
            "gmpo_clip_frac_lo": [0.005, 0.015, 0.02],
            "gmpo_clip_frac_hi": [0.02, 0.03, 0.04],
            "gmpo_clip_pred_iid": [0.001, 0.002, 0.003],
        }
    return pd.DataFrame(t)


def _markers(ax) -> dict[str, np.ndarray]:
    """Marker lines of a panel, by marker shape: (x, y) points as drawn."""
    out = {}
    for line in ax.get_lines():
        marker = line.get_marker()
        if marker not in (None, "None", "", " ", "|", "_") and line.get_linestyle() in (
            "None",
            "",
            " ",
        ):  # caps: | _
            out[marker] = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
    return out


def _legend_labels(fig) -> list[str]:
    legend = fig.legends[0] if fig.legends else fig.axes[-1].get_legend()
    return [t.get_text() for t in legend.get_texts()]


def test_models_and_kinds_come_from_the_columns():
    """Models are the suffixes of the prediction columns (known ones first), kinds those with predictions."""
    table = _table(extra_models=("comb",), gmpo=True)
    assert clip_models(table, "gspo") == ["iid", "emp", "corr", "mix", "hier", "comb"]
    assert clip_models(table, "gmpo") == ["iid"]
    assert clip_kinds(table) == ["gspo", "ppo", "gmpo"]
    assert clip_kinds(table.drop(columns=["gmpo_clip_pred_iid"])) == ["gspo", "ppo"]


def test_points_are_observed_against_predicted_with_the_diagonal():
    """Each model's markers sit at (observed, predicted) per bucket; the diagonal y = x is drawn."""
    table = _table()
    fig = clip_figure(table)
    assert isinstance(fig, Figure)
    gspo, ppo = fig.axes
    assert gspo.get_xscale() == gspo.get_yscale() == "linear"
    assert ppo.get_xscale() == ppo.get_yscale() == "log"
    drawn = _markers(gspo)
    for m in ("iid", "corr", "mix", "hier"):
        xy = drawn[MODEL_MARKERS[m]["marker"]]
        np.testing.assert_allclose(xy[:, 0], table["gspo_clip_frac"])
        np.testing.assert_allclose(xy[:, 1], table[f"gspo_clip_pred_{m}"])
    assert MODEL_MARKERS["emp"]["marker"] not in drawn  # no GSPO prediction: not drawn, noted
    assert any(
        "no prediction in the table: i.i.d. empirical" in " ".join(t.get_text().split()) for t in gspo.texts
    )
    diagonal = [
        ln for ln in gspo.get_lines() if ln.get_linestyle() == "-" and ln.get_marker() in ("None", "")
    ]
    assert diagonal
    x, y = (np.asarray(v, float) for v in diagonal[0].get_data())
    np.testing.assert_array_equal(x, y)
    # the horizontal bars span the observed interval
    bars = [c for c in gspo.collections if len(c.get_segments()) == len(table)]
    spans = {tuple(np.round([s[0][0], s[1][0]], 12)) for c in bars for s in c.get_segments()}
    assert (0.07, 0.14) in spans
    assert (0.55, 0.65) in spans


def test_log_panel_puts_tiny_values_on_the_edge_and_says_so():
    """PPO's 1e-31 predictions and intervals from 0 are drawn at the panel's floor and listed in a note."""
    fig = clip_figure(_table())
    ppo = fig.axes[1]
    floor = 1e-4  # a decade below the smallest positive observed value or interval end (1e-3)
    lo, hi = ppo.get_ylim()
    assert lo < floor < hi
    assert ppo.get_xlim() == (lo, hi)
    square = _markers(ppo)[MODEL_MARKERS["iid"]["marker"]]
    np.testing.assert_allclose(square[:, 1], floor)
    np.testing.assert_allclose(square[:, 0], [1e-3, 2e-3, floor])  # an observed 0 on the left edge
    note = "\n".join(t.get_text() for t in ppo.texts)
    assert "below 0.0001" in note
    flat = " ".join(note.split())  # lines wrap to keep the note narrow
    assert "i.i.d. lognormal = autocorrelation-corrected: 1e-31" in flat  # equal predictions: one entry
    assert "an observed interval from 0" in note
    hier = _markers(ppo)[MODEL_MARKERS["hier"]["marker"]]
    np.testing.assert_allclose(hier[:, 1], [5e-4, 4e-4, 3e-4])  # inside the panel: drawn as they are
    assert "random scale" not in note


def test_a_new_model_and_a_new_kind_appear_without_code_change():
    """An unknown model gets its own marker and its suffix as label; a new kind of clip its own panel."""
    fig = clip_figure(_table(extra_models=("next",), gmpo=True))
    assert len(fig.axes) == 4  # three panels, two per row: the fourth slot stays empty
    assert not fig.axes[3].axison
    gmpo = fig.axes[2]
    assert "GMPO" in gmpo.get_title()
    assert gmpo.get_xscale() == "log"  # every value below LOG_BELOW
    labels = _legend_labels(fig)
    assert "next" in labels
    comb = _markers(fig.axes[0])
    known = {st["marker"] for st in MODEL_MARKERS.values()}
    (new,) = set(comb) - known
    np.testing.assert_allclose(comb[new][:, 1], [0.12, 0.33, 0.61])
    fig = clip_figure(_table(extra_models=("next",)), labels={"next": "next model"})
    assert "next model" in _legend_labels(fig)


def test_markers_differ_in_shape_for_every_model():
    """Greyscale-safe: one distinct, hollow marker shape per model, also for added models."""
    table = _table(extra_models=("comb", "other"))
    fig = clip_figure(table)
    legend = fig.legends[0]
    handles = [
        h for h in legend.legend_handles if isinstance(h, Line2D) and h.get_marker() not in ("None", "")
    ]
    shapes = [h.get_marker() for h in handles]
    assert len(shapes) == len(set(shapes)) == 7  # the five models (emp: PPO only) and the two new ones
    assert all(h.get_markerfacecolor() == "none" for h in handles)


def test_layout_options_and_return_value():
    """ax=, fig=, figsize=, kinds=, models=, style= and **kwargs; the figure is returned."""
    fig, axes = plt.subplots(1, 2)
    assert clip_figure(_table(), ax=axes, legend=True) is fig
    assert axes[-1].get_legend() is not None  # the caller's axes: legend in the last panel
    fig = clip_figure(_table(), kinds=["ppo"], models=["hier"], figsize=(3.0, 3.0), ms=7.0)
    assert len(fig.axes) == 1
    assert tuple(fig.get_size_inches()) == (3.0, 3.0)
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == MODEL_MARKERS["hier"]["marker"]]
    assert line.get_markersize() == 7.0
    assert _legend_labels(fig)[0] == "hier (random scale)"  # the command line's name and what it is
    fig = Figure()
    assert clip_figure(_table(), fig=fig) is fig
    assert len(fig.axes) == 2
    with plt.rc_context({"font.size": 13.0}):
        fig = clip_figure(_table())
    assert fig.axes[0].title.get_fontsize() >= 13.0
    fig = clip_figure(_table(), style="paper")
    sizes = [t.get_fontsize() for ax in fig.axes for t in (ax.title, ax.xaxis.label, *ax.texts)]
    assert min(sizes) >= style.MIN_FONT_PT


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kinds": ["gmpo"]}, "kind 'gmpo' is not in the table"),
        ({"models": ["comb"]}, "model 'comb' is not in the table"),
        ({"ax": [None]}, "ax must hold 2 axes"),
    ],
)
def test_bad_requests_name_the_bad_value(kwargs, match):
    """An unknown kind or model, or the wrong number of axes, is a ValueError naming it."""
    if "ax" in kwargs:
        kwargs = {"ax": [plt.figure().add_subplot()]}
    with pytest.raises(ValueError, match=match):
        clip_figure(_table(), **kwargs)


def test_a_table_without_clip_predictions_is_refused():
    """A table without K_clip_frac and K_clip_pred_<model> columns is a ValueError."""
    with pytest.raises(ValueError, match="no clip fractions with predictions"):
        clip_figure(pd.DataFrame({"bucket": [1], "gspo_clip_frac": [0.1]}))


def test_draws_the_analysis_table_as_analyze_makes_it():
    """On analyze's own table: GSPO, PPO and GMPO panels, every model of the analysis in the legend."""
    rng = np.random.default_rng(5)
    n, width = 240, 64
    lengths = rng.integers(8, width + 1, n)
    y = rng.standard_normal((n, width)) * 0.02 * rng.gamma(1.0, 1.0, (n, 1))  # random scale per sequence
    base = rng.exponential(2.0, (n, width))
    mask = np.arange(width)[None, :] < lengths[:, None]
    result = analyze(
        TokenBatch.from_padded(-base + np.minimum(y, 0), -base - np.maximum(y, 0), mask), n_boot=50, seed=0
    )
    table = result.table
    assert clip_kinds(table) == ["gspo", "ppo", "gmpo"]
    assert clip_models(table, "gspo") == list(ALL_MODELS)
    fig = clip_figure(table)
    gspo = _markers(fig.axes[0])
    xy = gspo[MODEL_MARKERS["hier"]["marker"]]
    np.testing.assert_allclose(xy[:, 1], table["gspo_clip_pred_hier"])
    labels = _legend_labels(fig)
    for m in ALL_MODELS:  # comb is fitted (finite) only where the mixture has more than one component
        preds = table[[f"{k}_clip_pred_{m}" for k in clip_kinds(table)]].to_numpy(float)
        assert (MODEL_MARKERS[m]["label"] in labels) == bool(np.isfinite(preds).any()), m


# ---------------------------------------------------------------------- issue #25, item 4
def _bucket_numbers(ax) -> dict[int, tuple[float, int]]:
    """Bucket numbers on a panel's top edge: number -> (x of its tick, row above the edge)."""
    (top,) = ax.child_axes  # the secondary top axis holding the numbers
    out = {}
    for x, label in zip(top.get_xticks(), top.get_xticklabels(), strict=True):
        text = label.get_text()
        out[int(text.strip())] = (float(x), text.count("\n"))
    return out


def test_each_bucket_is_numbered_over_its_observed_fraction_and_keyed_in_the_title():
    """Every point's bucket can be read: its number over its observed fraction, its range in the title."""
    table = _table().assign(T_lo=[8, 16, 32], T_hi=[15, 31, 63])
    fig = clip_figure(table, title="arith_rollouts.jsonl.gz")
    gspo, ppo = fig.axes[:2]
    numbers = _bucket_numbers(gspo)
    assert sorted(numbers) == [1, 2, 3]
    np.testing.assert_allclose([numbers[i][0] for i in (1, 2, 3)], table["gspo_clip_frac"])
    ppo_numbers = _bucket_numbers(ppo)
    np.testing.assert_allclose([ppo_numbers[i][0] for i in (1, 2)], [1e-3, 2e-3])
    assert ppo_numbers[3][0] == pytest.approx(1e-4)  # an observed 0: at the panel's floor, as its points
    title = fig.get_suptitle()
    assert title.startswith("arith_rollouts.jsonl.gz\n")
    assert "1: 8-15, 2: 16-31, 3: 32-63" in title
    assert bucket_key(table.drop(columns=["T_lo", "T_hi"])).endswith("1: about 10, 2: about 20, 3: about 40")


def test_buckets_at_the_same_place_get_numbers_one_above_the_other():
    """Close observed fractions do not print their numbers over one another: they stand in rows."""
    table = _table()
    table["gspo_clip_frac"] = [
        0.41,
        0.406,
        0.7,
    ]  # buckets 1 and 2 at one place, as 4 and 5 of the shipped data
    numbers = _bucket_numbers(clip_figure(table).axes[0])
    assert {numbers[1][1], numbers[2][1]} == {0, 1}
    assert numbers[3][1] == 0


def test_equal_predictions_share_one_marker_and_coincident_markers_nest():
    """Equal predictions are one marker named after both; markers shrink in model order, so they nest."""
    table = _table()
    table["gspo_clip_pred_corr"] = table["gspo_clip_pred_iid"]  # as PPO's and GMPO's always are
    fig = clip_figure(table)
    gspo = fig.axes[0]
    drawn = _markers(gspo)
    assert MODEL_MARKERS["corr"]["marker"] not in drawn
    assert MODEL_MARKERS["iid"]["marker"] in drawn
    notes = " ".join(" ".join(t.get_text().split()) for t in gspo.texts)
    assert "one marker for equal predictions: i.i.d. lognormal = autocorrelation-corrected" in notes
    sizes = {
        line.get_marker(): line.get_markersize() for line in gspo.get_lines() if line.get_marker() in drawn
    }
    order = [MODEL_MARKERS[m]["marker"] for m in ("iid", "mix", "hier")]
    assert sizes[order[0]] > sizes[order[1]] > sizes[order[2]]
    assert list(MARKER_SIZES) == sorted(MARKER_SIZES, reverse=True)
    legend = {h.get_label(): h.get_markersize() for h in fig.legends[0].legend_handles}
    assert legend[MODEL_MARKERS["iid"]["label"]] == sizes[order[0]]  # the legend shows the drawn size


def test_a_note_stays_off_the_points():
    """A note goes to the panel's free corner, or beside or under the panel when points lie there."""
    table = _table(gmpo=True)
    fig = clip_figure(table)
    ppo = fig.axes[1]
    (note,) = [t for t in ppo.texts if "drawn on the edge" in t.get_text()]
    assert note.xycoords == "axes fraction"  # the upper left is free (the points lie lower)
    assert note.xy == (0.03, 0.97)
    busy = table.assign(ppo_clip_pred_emp=[0.01, 0.01, 0.01])  # predictions in the note's corner
    ppo = clip_figure(busy).axes[1]
    (note,) = [t for t in ppo.texts if "drawn on the edge" in t.get_text()]
    assert note.xy == (0.0, 0.0)  # under the panel, below its x label
