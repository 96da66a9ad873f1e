"""The analysis figure (variance_lab.report.analysis_figure), drawn under the Agg backend."""

import io
import math

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from variance_lab.report import style
from variance_lab.report.analysis_figure import COINCIDE, MODEL_STYLE, analysis_figure
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch


@pytest.fixture(scope="module")
def result():
    """Return a small AR(1) data set (rho = 0.5), lengths 8..255, analysed."""
    rng = np.random.default_rng(40)
    n, width, rho, sd = 300, 255, 0.5, 0.1
    lengths = rng.integers(8, width + 1, n)
    x = np.empty((n, width))
    x[:, 0] = rng.standard_normal(n) * sd
    innov = rng.standard_normal((n, width)) * sd * math.sqrt(1 - rho**2)
    for t in range(1, width):
        x[:, t] = rho * x[:, t - 1] + innov[:, t]
    base = rng.exponential(2.0, x.shape)
    mask = np.arange(width)[None, :] < lengths[:, None]
    batch = TokenBatch.from_padded(-base + np.minimum(x, 0), -base - np.maximum(x, 0), mask)
    return analyze(batch, n_boot=100, seed=0)


def test_two_panels_one_column_with_labels_and_log_axes(result):
    """The default figure: two panels one column wide, labelled log axes, Okabe-Ito lines, legend."""
    fig = analysis_figure(result.table, result.curves())
    assert isinstance(fig, Figure)
    top, bottom = fig.axes
    assert fig.get_size_inches()[0] == pytest.approx(style.COLUMN_WIDTH)
    assert "P_T" in top.get_ylabel()
    assert "G_T" in bottom.get_ylabel()
    assert "T" in bottom.get_xlabel()
    assert top.get_xscale() == bottom.get_xscale() == "log"
    # three prediction lines per panel in Okabe-Ito colours, or one line where they coincide
    curves = result.curves()
    for ax, col in ((top, "log10_var_P"), (bottom, "log10_var_G")):
        wide = curves.pivot_table(index="T", columns="model", values=col)
        spread = 10 ** (wide.max(axis=1) - wide.min(axis=1)).max() - 1
        labels = {line.get_label() for line in ax.get_lines()}
        if spread < COINCIDE:
            assert any(label.startswith("all three predictions") for label in labels)
            continue
        colours = {
            to_hex(line.get_color()).upper()
            for line in ax.get_lines()
            if line.get_label() in {kw["label"] for kw in MODEL_STYLE.values()}
        }
        assert colours == {to_hex(kw["color"]).upper() for kw in MODEL_STYLE.values()}
        assert colours <= {c.upper() for c in style.OKABE_ITO}
    assert top.get_legend() is None
    labels = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert "autocorrelation-corrected" in labels
    assert any("95% bootstrap" in lab for lab in labels)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"


def test_points_sit_at_the_observed_values(result):
    """The plotted points are the buckets' observed log10 Var(G_T)."""
    fig = analysis_figure(result.table, result.curves(), panels=("G",), legend=False)
    (ax,) = fig.axes
    t = result.table.dropna(subset=["log10_var_G"])
    ys = np.concatenate([line.get_ydata() for line in ax.get_lines() if line.get_marker() == "o"])
    np.testing.assert_allclose(np.sort(ys), np.sort(10 ** t["log10_var_G"].to_numpy()))  # real values
    assert ax.get_yscale() == "log"
    assert ax.get_legend() is None


def test_unreliable_var_P_points_are_hollow(result):
    """Points whose ESS of P_T is too small are drawn hollow and the legend explains it."""
    table = result.table.copy()
    table["ess_P"] = np.where(np.arange(len(table)) % 2 == 0, 1.0, table["n_seq"])
    fig = analysis_figure(table, result.curves(), panels=("P",), legend=False)
    faces = [line.get_markerfacecolor() for line in fig.axes[0].get_lines() if line.get_marker() == "o"]
    assert "white" in faces
    assert len(set(map(str, faces))) == 2
    legend = analysis_figure(table, result.curves(), panels=("P",)).axes[0].get_legend()
    assert any("ESS" in t.get_text() for t in legend.get_texts())


def test_draws_into_given_axes_or_figure(result):
    """Given ``ax=`` or ``fig=``, the figure draws there and returns that figure."""
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert analysis_figure(result.table, result.curves(), ax=[ax1, ax2]) is fig
    assert ax1.get_lines()
    assert ax2.get_lines()
    fig2 = Figure()
    assert analysis_figure(result.table, result.curves(), fig=fig2, panels=("G",)) is fig2
    assert len(fig2.axes) == 1
    single = Figure().add_subplot()
    assert analysis_figure(result.table, result.curves(), ax=single, panels=("P",)) is single.figure


def test_bad_arguments(result):
    """An unknown panel or the wrong number of axes raises ValueError."""
    with pytest.raises(ValueError, match="panels"):
        analysis_figure(result.table, result.curves(), panels=("Q",))
    with pytest.raises(ValueError, match="ax must hold 2 axes"):
        analysis_figure(result.table, result.curves(), ax=Figure().add_subplot())


@pytest.fixture(scope="module")
def two_lines():
    """Return the README's two-line example, analysed: one sequence per bucket, no autocorrelation."""
    ratios = [
        ([-0.11, -2.31, -0.05, -0.72], [-0.12, -2.25, -0.05, -0.80]),
        ([-0.40, -0.02, -1.10], [-0.38, -0.02, -1.31]),
    ]
    width = max(len(new) for new, _ in ratios)
    new, old = np.zeros((2, width)), np.zeros((2, width))
    for i, (a, b) in enumerate(ratios):
        new[i, : len(a)], old[i, : len(b)] = a, b
    mask = np.arange(width)[None, :] < np.array([[4], [3]])
    return analyze(TokenBatch.from_padded(new, old, mask), n_boot=100, seed=0)


def test_empty_panels_say_why_and_draw_the_predictions_there_are(two_lines):
    """No bucket has two sequences: each panel says so; the coinciding predictions are drawn all the same."""
    curves = two_lines.curves()
    assert "corr" not in set(curves["model"])  # no autocorrelation from 7 tokens
    fig = analysis_figure(two_lines.table, curves, style="paper")
    top, bottom = fig.axes
    for ax in (top, bottom):
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "no observed" in texts
        assert "2 sequences" in texts
        assert any(line.get_xydata().size for line in ax.get_lines())  # a drawn line, not an empty one
    labels = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert labels[0].startswith("both predictions, one line")
    assert not any(lab.startswith("observed") for lab in labels)  # no point to explain


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("rc", [{}, "paper"], ids=["matplotlib-defaults", "paper"])
def test_new_figure_layout_fits(result, rc):
    """A new figure holds its legend, below the x label; T labels and notes overlap nothing."""
    with style.use(rc or None):
        fig = analysis_figure(result.table, result.curves())
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        page = fig.bbox
        top, bottom = fig.axes
        legend = bottom.get_legend().get_window_extent(renderer)
        assert page.x0 - 1 <= legend.x0
        assert legend.x1 <= page.x1 + 1
        assert page.y0 - 1 <= legend.y0
        assert legend.y1 <= bottom.xaxis.label.get_window_extent(renderer).y0
        ticks = [t.get_window_extent(renderer) for t in bottom.get_xticklabels() if t.get_text()]
        assert len(ticks) >= 2
        assert not any(_overlap(a, b) for i, a in enumerate(ticks) for b in ticks[i + 1 :])
        for ax in (top, bottom):
            ylabels = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()]
            for note in ax.texts:
                box = note.get_window_extent(renderer)
                assert not any(_overlap(box, y) for y in ylabels)
