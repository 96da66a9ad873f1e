"""Figures: plot functions on tidy frames, the figures command, sidecars that reproduce them."""

import hashlib
import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from variance_lab import __version__, cli, theory
from variance_lab.experiment.names import DATA_DIR
from variance_lab.families import get_family
from variance_lab.paper import catalog, frames, names, pipeline, sidecar_check
from variance_lab.report import figures as plots
from variance_lab.report import style


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``variance-lab figures --quick`` run once for the module."""
    out = tmp_path_factory.mktemp("figures")
    assert cli.main(["figures", "--quick", "--out", str(out), "--no-progress"]) == 0
    return out


# ----------------------------------------------------------------------------- the command
def test_quick_writes_every_figure(quick):
    """The quick run writes every figure as PDF, PNG, CSV and a complete sidecar, nothing else."""
    for name in catalog.FIGURES:
        pdf, png = (quick / f"{name}.pdf").read_bytes(), (quick / f"{name}.png").read_bytes()
        assert pdf.startswith(b"%PDF-"), name
        assert len(pdf) > 5000, name
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), name
        assert len(png) > 5000, name
        sidecar = json.loads((quick / f"{name}.json").read_text())
        assert sidecar["figure"] == name
        assert sidecar["version"] == __version__
        assert sidecar["quick"] is True
        assert sidecar["description"]
        for key in ("params", "seed", "n", "versions", "png_dpi", "reproduce"):
            assert key in sidecar, (name, key)
        data = (quick / f"{name}.csv").read_bytes()
        assert hashlib.sha256(data).hexdigest() == sidecar["data_sha256"]
    expected = {f"{n}.{ext}" for n in catalog.ALL_FIGURES for ext in ("pdf", "png", "csv", "json")}
    expected.add(f"{catalog.EXPERIMENT_FIGURE}_curves.csv")  # the experiment figure's prediction curves
    assert {p.name for p in quick.iterdir()} == expected  # and no temporary files left
    exp = json.loads((quick / f"{catalog.EXPERIMENT_FIGURE}.json").read_text())
    assert exp["version"] == __version__


def test_sidecar_params_reproduce_the_data(quick):
    """Each sidecar's parameters regenerate data with the recorded SHA-256."""
    for name in catalog.FIGURES:
        sidecar = json.loads((quick / f"{name}.json").read_text())
        data = frames.figure_data(name, sidecar["params"])
        assert hashlib.sha256(data.to_csv(index=False).encode()).hexdigest() == sidecar["data_sha256"], name


#: clip_fractions analyses the shipped data set again (about 27 s): in the slow run; the other
#: three (Monte Carlo, a heat map, a contour plot) rebuild by default.
@pytest.mark.parametrize(
    "name",
    [
        "variance_vs_T",
        "heatmap_var_P",
        "decay_boundary",
        pytest.param("clip_fractions", marks=pytest.mark.slow),
    ],
)
def test_from_sidecar_reproduces_the_files_byte_for_byte(quick, tmp_path, capsys, name):
    """``figures --from-sidecar`` rewrites a figure's four files byte for byte."""
    assert cli.main(["figures", "--from-sidecar", str(quick / f"{name}.json"), "--out", str(tmp_path)]) == 0
    assert "wrote 4 files" in capsys.readouterr().out
    for ext in ("png", "pdf", "csv", "json"):
        assert (tmp_path / f"{name}.{ext}").read_bytes() == (quick / f"{name}.{ext}").read_bytes(), ext


def test_monte_carlo_points_are_in_the_figures(quick):
    """The variance figure's data holds the Monte Carlo points, Var(P_1000) flagged unreliable."""
    data = pd.read_csv(quick / "variance_vs_T.csv", keep_default_na=False)
    mc = data[data["method"] == "monte_carlo"]
    assert set(mc["statistic"]) == {"var_P", "var_G"}
    assert len(mc) == 8
    big = mc[(mc["statistic"] == "var_P") & (mc["T"] == 1000)]
    assert not big["reliable"].astype(str).eq("True").any()  # 2000 draws cannot see Var(P_1000)


def test_only_and_bad_names(tmp_path, capsys):
    """``--only`` writes just that figure; unknown names and bad sidecars are errors."""
    assert (
        cli.main(["figures", "--quick", "--only", "ratio_vs_T", "--out", str(tmp_path), "--no-progress"]) == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"ratio_vs_T.{e}" for e in ("csv", "json", "pdf", "png")
    ]
    with pytest.raises(ValueError, match="unknown figure"):
        catalog.default_params("nope")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["figures", "--from-sidecar", str(bad)]) == 2
    assert "is not a figure sidecar" in capsys.readouterr().err


@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_figures_leave_no_partial_folder(tmp_path, monkeypatch, existing):
    """Ctrl-C on the second figure leaves no trace.

    A new folder is not created, an existing one is untouched, and the temporary build folder
    is gone.
    """
    out = tmp_path / "figs"
    if existing:
        out.mkdir()
        (out / "ratio_vs_T.pdf").write_bytes(b"an earlier figure")
    real, calls = pipeline.make_figure, []

    def interrupt_second(name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.setattr(pipeline, "make_figure", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        pipeline.make_all(out, quick=True, only=["ratio_vs_T", "heatmap_var_P"], progress=False)
    assert calls == ["ratio_vs_T", "heatmap_var_P"]
    assert [p.name for p in tmp_path.iterdir()] == (["figs"] if existing else [])
    if existing:
        assert [p.name for p in out.iterdir()] == ["ratio_vs_T.pdf"]
        assert (out / "ratio_vs_T.pdf").read_bytes() == b"an earlier figure"


@pytest.mark.parametrize("progress", [True, False])
def test_make_all_counts_figures_on_the_progress_helper(tmp_path, monkeypatch, capsys, progress):
    """progress=True: a bar over the figures on stderr, kept at the end (2/2); False: none; stdout empty."""

    def fake_build(name, build, params, **options):
        path = build / f"{name}.csv"
        path.write_text("x\n")
        return [path]

    monkeypatch.setattr(pipeline, "_build", fake_build)
    paths = pipeline.make_all(
        tmp_path / "figs", quick=True, only=["ratio_vs_T", "heatmap_var_P"], progress=progress
    )
    assert sorted(p.name for p in paths) == ["heatmap_var_P.csv", "ratio_vs_T.csv"]
    captured = capsys.readouterr()
    assert captured.out == ""
    if progress:
        assert "figures" in captured.err
        assert "2/2" in captured.err
    else:
        assert captured.err == ""


# ----------------------------------------------------------------------------- plot functions
def _theory(family, T, names):
    return frames._theory(family, T, names)


@pytest.fixture(scope="module")
def var_frame():
    """Return exact curves and four Monte Carlo rows (one unreliable) for lognormal(1, 0.1)."""
    fam = get_family("lognormal", 1.0, 0.1)
    frame = _theory(
        fam, [1, 10, 100, 1000], ["var_P", "var_G", "var_G_lognormal", "var_G_delta", "var_G_naive"]
    )
    mc = pd.DataFrame(
        {
            "family": "lognormal",
            "mu": 1.0,
            "sigma2": 0.1,
            "T": [10, 100, 10, 100],
            "statistic": ["var_P", "var_P", "var_G", "var_G"],
            "method": "monte_carlo",
            "value": [1.5, 20.0, 0.0087, 0.00087],
            "lo": [1.2, 5.0, 0.008, 0.0008],
            "hi": [2.0, 80.0, 0.0095, 0.00095],
            "se": 0.1,
            "reliable": [True, False, True, True],
            "reason": ["", "too few draws", "", ""],
        }
    )
    mc["log10_value"] = np.log10(mc["value"])
    return pd.concat([frame, mc[frame.columns]], ignore_index=True)


def _hollow_markers(ax) -> int:
    return sum(
        1 for line in ax.get_lines() if line.get_marker() == "o" and line.get_markerfacecolor() == "white"
    )


def test_variance_vs_T_draws_unreliable_points_hollow(var_frame):
    """Unreliable Monte Carlo points are hollow; axes and legend carry the expected labels."""
    fig = Figure()
    ax = fig.add_subplot()
    assert plots.variance_vs_T(var_frame, "var_P", ax=ax) is fig
    assert _hollow_markers(ax) >= 1
    labels = ax.get_legend_handles_labels()[1]
    assert any("exact" in label for label in labels)
    assert "sequence length" in ax.get_xlabel()
    assert "Var" in ax.get_ylabel()
    assert ax.get_xscale() == "log"
    fig2 = Figure()
    ax2 = fig2.add_subplot()
    plots.variance_vs_T(var_frame, "var_G", ax=ax2)
    assert _hollow_markers(ax2) == 0
    assert {"lognormal approx.", "$\\sigma^2/T$ (naive)"} <= set(ax2.get_legend_handles_labels()[1])
    assert ax2.get_yscale() == "log"


def test_every_plot_function_takes_ax_or_fig_and_returns_the_figure(var_frame):
    """Every plot function draws into a given ``ax`` or ``fig`` and returns its figure."""
    fam = get_family("lognormal", 1.0, 0.1)
    ratio = pd.concat(
        [_theory(get_family("lognormal", m, 0.1), [1, 10, 100], ["var_ratio"]) for m in (0.9, 1.1)]
    )
    heat = pd.concat(
        [
            _theory(get_family("lognormal", m, s2), [50], ["var_P"])
            for m in (0.9, 1.0, 1.1)
            for s2 in (0.01, 0.1, 1)
        ]
    )
    ess = _theory(fam, [1, 10, 100], ["ess_frac_P"])
    need = _theory(fam, list(range(1, 40)), ["n_needed_P"])
    rng = np.random.default_rng(0)
    hist = frames.histogram_frame(rng.normal(size=(500, 2)), [1, 10], bins=10)
    for draw, frame, kwargs in [
        (plots.ratio_vs_T, ratio, {}),
        (plots.heatmap, heat, {"statistic": "var_P"}),
        (plots.mc_frontier, need, {}),
        (plots.ess_vs_T, ess, {"n": 1000}),
    ]:
        fig = Figure()
        ax = fig.add_subplot()
        assert draw(frame, ax=ax, **kwargs) is fig
        assert isinstance(draw(frame, **kwargs), Figure)
        assert ax.get_xlabel()
        assert ax.get_ylabel()
    for draw, frame, panels in [
        (plots.variance_panels, var_frame, 3),
        (plots.approx_error, var_frame, 1),  # one panel per family
        (plots.log_histograms, hist, 2),
    ]:
        fig = Figure()
        assert draw(frame, fig=fig) is fig
        assert len(fig.axes) == panels
        fresh = draw(frame)
        assert fresh.get_figwidth() == pytest.approx(style.COLUMN_WIDTH)


def test_heatmap_marks_mu_1_and_leaves_unreachable_points_blank():
    """The heatmap draws a line at mu = 1, masks unreachable cells and refuses several T."""
    frames = []
    for m in (0.8, 1.0, 1.2):
        for s2 in (0.1, 0.7, 1.2):
            try:
                fam = get_family("two-point", m, s2)
            except ValueError:
                continue  # unreachable: no row
            frames.append(_theory(fam, [20], ["var_G"]))
    fig = plots.heatmap(pd.concat(frames), "var_G")
    ax = fig.axes[0]
    verticals = [line for line in ax.get_lines() if list(line.get_xdata()) == [1.0, 1.0]]
    assert verticals, "mu = 1 line"
    mesh = ax.collections[0]
    assert np.ma.count_masked(mesh.get_array()) == 3  # (0.8, 0.7), (0.8, 1.2), (1.0, 1.2): sigma2 >= mu^2
    with pytest.raises(ValueError, match="several T"):
        plots.heatmap(pd.concat([_theory(get_family("lognormal", 1, 0.1), [1, 2], ["var_G"])]), "var_G")


def test_relative_error_frame_knows_where_approximations_are_exact():
    """Relative errors vanish where an approximation is exact and shrink with T for gamma."""
    names = ["var_G", "var_G_lognormal", "var_G_delta", "var_G_naive"]
    frames = [_theory(get_family(f, 1.0, 0.1), [1, 10, 100], names) for f in ("lognormal", "gamma")]
    err = plots.relative_error_frame(pd.concat(frames))
    logn = err[(err["family"] == "lognormal") & (err["method"] == "lognormal")]
    assert (logn["rel_error"].abs() < 1e-14).all()  # exact for the lognormal family
    naive_T1 = err[(err["method"] == "naive") & (err["T"] == 1)]
    assert (naive_T1["rel_error"].abs() < 1e-14).all()  # G_1 = r: Var = sigma^2 exactly
    gamma = err[(err["family"] == "gamma") & (err["method"] == "lognormal")].sort_values("T")
    assert (np.diff(np.abs(gamma["rel_error"].to_numpy())) < 0).all()  # the approximation improves with T


def test_frontier_matches_theory_n_needed():
    """The frontier's largest T per budget n agrees with theory.n_needed_P."""
    fam = get_family("lognormal", 1.0, 0.1)
    Ts = list(range(1, 61))
    front = plots.frontier_frame(_theory(fam, Ts, ["n_needed_P"]), [10.0, 1e4, 1e8, 1e30])
    need = theory.n_needed_P(fam, Ts)
    for n, t_max, beyond in front[["n", "T_max", "beyond_grid"]].itertuples(index=False):
        ok = [t for t, k in zip(Ts, need, strict=True) if k <= n]
        if not ok:
            assert np.isnan(t_max)
        else:
            assert t_max == max(ok)
            assert beyond == (max(ok) == Ts[-1])
    # about 1e4 draws at T = 10 (design notes)
    assert front.loc[front["n"] == 1e4, "T_max"].item() in (9, 10, 11)


# ----------------------------------------------------------------------------- raw draws
def test_sample_log_P_moments_and_determinism():
    """Sampled log P_T has the right mean and variance, and depends on the seed, not grid order."""
    fam = get_family("gamma", 1.0, 0.2)
    a = frames.sample_log_P(fam, [1, 5, 20], 20000, seed=3)
    b = frames.sample_log_P(fam, [20, 1, 5], 20000, seed=3)
    assert a.shape == (20000, 3)
    np.testing.assert_array_equal(a[:, 0], b[:, 1])
    np.testing.assert_array_equal(a[:, 2], b[:, 0])
    for j, T in enumerate([1, 5, 20]):
        se = np.sqrt(T * fam.var_log / 20000)
        assert abs(a[:, j].mean() - T * fam.mean_log) < 5 * se
        assert a[:, j].var() == pytest.approx(T * fam.var_log, rel=0.1)
    assert not np.array_equal(a, frames.sample_log_P(fam, [1, 5, 20], 20000, seed=4))


SAMPLE_FAMILIES = [
    get_family("lognormal", 1.0, 0.1),
    get_family("gamma", 1.0, 0.1),
    get_family("gamma", 1.0, 4.0),  # shape 1/4 < 1: the boosted draw
    get_family("two-point", 1.0, 0.1, q=0.3),
    get_family("ar1", 1.0, 0.1, rho=0.5),  # correlated tokens: what the old NumPy sampler could not draw
    get_family("ar1", 0.9, 0.2, rho=-0.3),
    get_family("lognormal", 1.2, 0.0),  # degenerate
]


@pytest.mark.parametrize(
    "fam",
    SAMPLE_FAMILIES,
    ids=["lognormal", "gamma", "gamma-small-shape", "two-point", "ar1", "ar1-neg", "degenerate"],
)
def test_sample_log_P_every_family_draws_like_the_engine(fam):
    """Every family: the engine's own draws match theory.

    The paths a chunk draws from the same stream, with E[log P_T] and Var(log P_T) of theory
    within 5 standard errors.
    """
    from variance_lab.simulate import draw_log_p

    T, n = [1, 5, 20], 20_000
    x = frames.sample_log_P(fam, T, n, seed=3)
    code, par = fam.sampler_params()
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(3)))
    np.testing.assert_array_equal(x, draw_log_p(code, par, T, rng, n))
    assert np.isfinite(x).all()
    for j, t in enumerate(T):
        var = float(fam.var_sum_mp(t)) if hasattr(fam, "var_sum_mp") else t * fam.var_log
        mean_err = abs(x[:, j].mean() - t * fam.mean_log)
        if var == 0.0:  # every path: exactly the kernel's t * log(mu)
            np.testing.assert_array_equal(x[:, j], t * par[0])
            continue
        d = x[:, j] - x[:, j].mean()
        se_var = np.sqrt((np.mean(d**4) - np.mean(d**2) ** 2) / n)  # plug-in SE of the sample variance
        assert mean_err < 5 * np.sqrt(var / n), (t, mean_err)
        assert abs(d.var() - var) < 5 * se_var, (t, d.var(), var)


def test_sample_log_P_aggregate_sampler():
    """The aggregate sampler's AR(1) log P_T variance is within 5 SE of the exact one; gamma is refused."""
    fam = get_family("ar1", 1.0, 0.1, rho=0.5)
    x = frames.sample_log_P(fam, [1, 10], 50_000, seed=1, sampler="aggregate")
    var = float(fam.var_sum_mp(10))
    d = x[:, 1] - x[:, 1].mean()
    assert abs(d.var() - var) < 5 * np.sqrt((np.mean(d**4) - np.mean(d**2) ** 2) / 50_000)
    with pytest.raises(ValueError, match="gamma family has no exact aggregate"):
        frames.sample_log_P(get_family("gamma", 1.0, 0.1), [1], 10, sampler="aggregate")


def test_sample_log_P_other_families():
    """Two-point samples take the two values; degenerate ones are T log mu; T = 0 raises."""
    two = get_family("two-point", 1.0, 0.1)
    _, (_, la, lb) = two.sampler_params()
    x = frames.sample_log_P(two, [1], 1000, seed=0)[:, 0]
    assert set(np.round(x, 12)) == {round(la, 12), round(lb, 12)}
    flat = frames.sample_log_P(get_family("lognormal", 1.2, 0.0), [3], 10)
    np.testing.assert_allclose(flat, 3 * np.log(1.2))
    with pytest.raises(ValueError, match="T must be"):
        frames.sample_log_P(two, [0], 10)


# ----------------------------------------------------------------------------- composing with matplotlib
def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.fixture(scope="module")
def small_frames(var_frame):
    """One small theory frame per plot function (no Monte Carlo beyond var_frame's fixed rows)."""
    ratio = pd.concat(
        [
            _theory(get_family("lognormal", m, 0.1), [1, 3, 10, 30, 100], ["var_ratio"])
            for m in (0.9, 1.0, 1.1)
        ]
    )
    grid = [(m, s2) for m in (0.7, 0.85, 1.0, 1.15) for s2 in (0.01, 0.05, 0.2, 0.6)]
    heat = pd.concat([_theory(get_family("lognormal", m, s2), [10, 100], ["var_P"]) for m, s2 in grid])
    ess = pd.concat(
        [_theory(get_family("lognormal", 1.0, s2), [1, 10, 100], ["ess_frac_P"]) for s2 in (0.1, 0.5)]
    )
    need = _theory(get_family("lognormal", 1.0, 0.1), list(range(1, 40)), ["n_needed_P"])
    hist = frames.histogram_frame(np.linspace(-3, 3, 2000).reshape(1000, 2), [1, 10], bins=10)
    return {
        "variance_panels": (plots.variance_panels, var_frame, {"n": 1000}),
        "ratio_vs_T": (plots.ratio_vs_T, ratio, {"zoom": 10}),
        "heatmap": (plots.heatmap, heat, {"statistic": "var_P", "T": 100}),
        "decay_boundary": (plots.decay_boundary, heat, {}),
        "approx_error": (plots.approx_error, var_frame, {}),
        "mc_frontier": (plots.mc_frontier, need, {}),
        "ess_vs_T": (plots.ess_vs_T, ess, {"n": 1000}),
        "log_histograms": (plots.log_histograms, hist, {"title": "normal draws"}),
    }


def test_paper_style_text_is_at_least_7_pt_and_never_says_seed(small_frames):
    """Paper style is one column wide, its text at least 7 pt and free of the word seed."""
    for name, (draw, frame, kwargs) in small_frames.items():
        fig = draw(frame, style="paper", **kwargs)
        assert fig.get_figwidth() == pytest.approx(style.COLUMN_WIDTH), name
        for text in _texts(fig):
            assert text.get_fontsize() >= style.MIN_FONT_PT, (name, text.get_text(), text.get_fontsize())
            assert "seed" not in text.get_text().lower(), (name, text.get_text())
        for ax in fig.axes:
            for label in ax.get_xticklabels() + ax.get_yticklabels():
                assert label.get_fontsize() >= style.MIN_FONT_PT, name


def test_plot_functions_respect_the_callers_rcparams(small_frames):
    """Plot functions follow the caller's rcParams and leave the global ones unchanged."""
    before = dict(matplotlib.rcParams)
    for name, (draw, frame, kwargs) in small_frames.items():
        with plt.rc_context({"font.size": 13, "axes.labelsize": 13, "lines.linewidth": 2.7}):
            fig = draw(frame, **kwargs)
            ax = fig.axes[0]
            assert ax.xaxis.label.get_fontsize() == 13, name
        paper = draw(frame, style="paper", **kwargs)
        assert paper.axes[0].xaxis.label.get_fontsize() == style.RC["axes.labelsize"], name
    assert dict(matplotlib.rcParams) == before, "a plot function changed global rcParams"
    fig = plots.ratio_vs_T(small_frames["ratio_vs_T"][1], zoom=None)
    with plt.rc_context({"lines.linewidth": 2.7}):
        fig = plots.ratio_vs_T(small_frames["ratio_vs_T"][1], zoom=None)
    assert {line.get_linewidth() for line in fig.axes[0].get_lines()[:3]} == {2.7}


def test_style_names_and_files_apply(small_frames, tmp_path):
    """A style name or a style file passed as style= is applied."""
    draw, frame, kwargs = small_frames["ess_vs_T"]
    assert draw(frame, style="ggplot", **kwargs).axes[0].get_facecolor()[:3] != (1.0, 1.0, 1.0)
    sheet = tmp_path / "big.mplstyle"
    sheet.write_text("axes.labelsize: 17\n")
    assert draw(frame, style=str(sheet), **kwargs).axes[0].xaxis.label.get_fontsize() == 17
    assert style.STYLE_FILE.is_file()
    assert style.RC["font.size"] >= style.MIN_FONT_PT


def test_true_log_axes_with_real_values(var_frame, small_frames):
    """Axes are log-scaled and carry the real values, so one's own data overlay in the same units."""
    fig = plots.variance_vs_T(var_frame, "var_P")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_xscale() == "log"
    exact = var_frame[(var_frame["statistic"] == "var_P") & (var_frame["method"] == "exact")].sort_values("T")
    line = next(li for li in ax.get_lines() if li.get_label().startswith("exact"))
    np.testing.assert_allclose(line.get_ydata(), theory.var_P(get_family("lognormal", 1.0, 0.1), exact["T"]))
    ax.plot([10], [1.6], "x")  # one's own data overlay in the same units
    draw, frame, kwargs = small_frames["ess_vs_T"]
    ax = draw(frame, **kwargs).axes[0]
    assert ax.get_yscale() == "log"
    assert max(np.max(li.get_ydata()) for li in ax.get_lines() if len(li.get_ydata()) > 2) <= 1.0


def test_kwargs_figsize_and_pyplot(var_frame, small_frames):
    """Line keywords, figsize and cmap pass through and the figure is pyplot's current one."""
    fig = plots.variance_vs_T(var_frame, "var_G", lw=3.3, figsize=(5, 3))
    assert plt.gcf() is fig
    assert tuple(fig.get_size_inches()) == (5, 3)
    exact = next(li for li in fig.axes[0].get_lines() if li.get_label() == "exact")
    assert exact.get_linewidth() == 3.3
    draw, frame, kwargs = small_frames["heatmap"]
    fig = draw(frame, cmap="viridis", **kwargs)
    assert fig.axes[0].collections[0].get_cmap().name == "viridis"


def test_series_differ_in_greyscale(small_frames):
    """Every series differs in line style or marker, so figures read in greyscale."""
    for name in ("ratio_vs_T", "ess_vs_T", "mc_frontier"):
        draw, frame, kwargs = small_frames[name]
        lines = [
            li
            for li in draw(frame, **kwargs).axes[0].get_lines()
            if not li.get_label().startswith(("_", "$1/n$"))  # series, not reference lines
        ]
        styles = [
            (str(li.get_linestyle()), li.get_marker()) for li in lines if li.get_label()[0] != "$" or True
        ]
        assert len(set(styles)) == len(styles), (name, styles)


def test_variance_panels_show_approximations_as_ratios(var_frame):
    """The ratio panel shows approximations over the exact Var(G_T); only Var(P_T) has a flagged point."""
    fig = plots.variance_panels(var_frame, n=1000)
    ratio_ax = fig.axes[2]
    naive = next(li for li in ratio_ax.get_lines() if li.get_label() == "$\\sigma^2/T$ (naive)")
    fam = get_family("lognormal", 1.0, 0.1)
    T = np.asarray(naive.get_xdata(), float)
    np.testing.assert_allclose(naive.get_ydata(), 0.1 / T / theory.var_G(fam, T), rtol=1e-12)
    assert "1{,}000" in fig._suptitle.get_text()
    # only the Var(P_T) panel has a flagged point, so only its legend names it
    assert any("flagged" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert not any("flagged" in t.get_text() for t in fig.axes[1].get_legend().get_texts())


def test_decay_boundary_colours_growth_and_decay_as_the_closed_form():
    """decay_boundary's colours are log10 of the variance ratio from mpmath, signed by sigma^2 + mu^2 > 1."""
    import mpmath

    mus, s2s = (0.6, 0.8, 0.9, 1.0, 1.1), (0.01, 0.1, 0.3, 0.6)
    frame = pd.concat(
        [_theory(get_family("lognormal", m, s2), [10, 100], ["var_P"]) for m in mus for s2 in s2s]
    )
    fig = plots.decay_boundary(frame, (10, 100))
    z = fig.axes[0].collections[0].get_array().reshape(len(s2s), len(mus))
    mpmath.mp.dps = 50
    for i, s2 in enumerate(s2s):
        for j, m in enumerate(mus):
            m_, s_ = mpmath.mpf(m), mpmath.mpf(s2)
            var = [(s_ + m_**2) ** t - m_ ** (2 * t) for t in (10, 100)]
            assert float(z[i, j]) == pytest.approx(float(mpmath.log10(var[1] / var[0])), abs=1e-9)
            if abs(s2 + m * m - 1) > 0.05:
                assert (z[i, j] > 0) == (s2 + m * m > 1), (m, s2)
    with pytest.raises(ValueError, match="two lengths"):
        plots.decay_boundary(frame, (100, 10))


# ----------------------------------------------------------------------------- the command's options
def test_formats_dpi_and_style_options(tmp_path, capsys):
    """``figures`` writes the asked formats at the asked dpi and style, and refuses unknown ones."""
    out = tmp_path / "f"
    args = ["figures", "--quick", "--only", "ratio_vs_T", "--out", str(out), "--no-progress"]
    assert cli.main([*args, "--format", "svg,eps,png", "--dpi", "50", "--style", "ggplot"]) == 0
    assert sorted(p.suffix for p in out.iterdir()) == [".csv", ".eps", ".json", ".png", ".svg"]
    sidecar = json.loads((out / "ratio_vs_T.json").read_text())
    assert sidecar["png_dpi"] == 50
    assert sidecar["style"] == "ggplot"
    assert (out / "ratio_vs_T.svg").read_text().lstrip().startswith("<?xml")
    assert (out / "ratio_vs_T.eps").read_bytes().startswith(b"%!PS")
    from PIL import Image

    with Image.open(out / "ratio_vs_T.png") as image:
        assert image.info["dpi"][0] == pytest.approx(50, abs=1)
    assert cli.main([*args, "--format", "gif"]) == 2
    assert "--format" in capsys.readouterr().err
    assert cli.main([*args, "--style", "no-such-style"]) == 2
    assert "--style" in capsys.readouterr().err


def test_check_passes_on_a_rebuild_and_fails_on_a_mismatch(tmp_path, capsys):
    """--check passes on a rebuild, reports changed data and versions, and writes no files."""
    out = tmp_path / "f"
    args = ["figures", "--quick", "--only", "ratio_vs_T,heatmap_var_G", "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli.main(["figures", "--check", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ratio_vs_T.json: ratio_vs_T.csv: identical" in text
    assert text.strip().endswith("2 data files (2 identical): OK")
    side = out / "ratio_vs_T.json"
    meta = json.loads(side.read_text())
    meta["versions"]["numpy"] = "0.0"
    meta["params"]["sigma2"] = 0.2  # the rebuilt data no longer match the recorded CSV
    side.write_text(json.dumps(meta))
    assert cli.main(["figures", "--check", "--from-sidecar", str(side)]) == 1
    captured = capsys.readouterr()
    assert (
        "ratio_vs_T.csv: differs: column 'sigma2': 36 values differ (first: row 0, 0.1 vs 0.2)"
        in captured.err
    )
    assert "note: numpy version differs: sidecar 0.0" in captured.out
    assert captured.out.strip().endswith("1 data file (1 differs): 1 differ")
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before if k != "ratio_vs_T.json"), "--check wrote files"


def test_rebuilding_the_default_folder_needs_out_or_force(tmp_path, monkeypatch, capsys):
    """Overwriting figures/ or rebuilding from a sidecar in place needs --force."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "ratio_vs_T.json").write_text("{}")
    args = ["figures", "--quick", "--only", "ratio_vs_T", "--no-progress"]
    assert cli.main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "figures" / "ratio_vs_T.json").read_text() == "{}"
    assert cli.main([*args, "--force"]) == 0
    side = tmp_path / "figures" / "ratio_vs_T.json"
    assert json.loads(side.read_text())["figure"] == "ratio_vs_T"
    assert cli.main(["figures", "--from-sidecar", str(side)]) == 2
    assert cli.main(["figures", "--from-sidecar", str(side), "--force"]) == 0


def test_every_figure_is_in_help_and_reads_its_sidecar(quick, capsys):
    """Every figure is in --help, and each quick sidecar reads back as its figure's."""
    with pytest.raises(SystemExit):
        cli.main(["figures", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    for name in catalog.ALL_FIGURES:
        assert name in helptext
        assert pipeline.read_figure_sidecar(quick / f"{name}.json")["figure"] == name


@pytest.mark.slow
def test_experiment_figure_rebuilds_byte_for_byte_from_its_sidecar(quick, tmp_path):
    """The experiment figure rebuilds byte for byte from its sidecar.

    One more analysis of the shipped data (about 58 s), so in the slow run.
    """
    side = quick / f"{catalog.EXPERIMENT_FIGURE}.json"
    assert cli.main(["figures", "--from-sidecar", str(side), "--out", str(tmp_path)]) == 0
    for ext in ("csv", "png", "pdf"):
        rebuilt = (tmp_path / f"{catalog.EXPERIMENT_FIGURE}.{ext}").read_bytes()
        assert rebuilt == (quick / f"{catalog.EXPERIMENT_FIGURE}.{ext}").read_bytes(), ext


def test_the_readme_figures_example_runs(tmp_path):
    """The guide's figures example (docs/guide/figures.md) runs and writes a PDF."""
    import os
    import subprocess
    import sys

    section = (Path(__file__).parents[2] / "docs" / "guide" / "figures.md").read_text()
    code = section[
        section.index("```python") + len("```python") : section.index("```", section.index("```python") + 9)
    ]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "variance.pdf").read_bytes().startswith(b"%PDF-")


def test_corrections_figure_is_readable_and_greyscale_safe():
    """corrections_vs_T in the paper style: text at least 7 pt, one line style per correction."""
    from variance_lab.report import corrections_figure

    params = {**catalog.default_params("corrections_vs_T", quick=True), "n": 0}
    frame = frames.figure_data("corrections_vs_T", params)
    fig = corrections_figure.corrections_vs_T(frame, title="lognormal", style="paper")
    fig.canvas.draw()
    texts = [t for t in fig.findobj(Text) if t.get_text().strip()]
    assert texts
    assert min(t.get_fontsize() for t in texts) >= style.MIN_FONT_PT
    legend = next(leg for part in (fig, *fig.subfigs) for leg in part.legends)  # under the panels
    handles = [h for h in legend.legend_handles if h.get_label() in params["corrections"]]
    assert len(handles) == len(params["corrections"])
    assert len({h.get_marker() for h in handles}) == len(handles)  # apart without colour


def test_corrections_figure_experiment_rows():
    """corrections_vs_T's lower row: the bf16 file's bucket bootstrap and the lognormal fitted to it."""
    from variance_lab import corrections
    from variance_lab.rollouts.io import load_batch

    params = {**catalog.default_params("corrections_vs_T", quick=True), "n": 0, "n_boot": 50}
    frame = frames.figure_data("corrections_vs_T", params)
    batch = load_batch(DATA_DIR / params["data"])
    log_r = batch.mismatch_log_ratio
    boot = corrections.bucket_bootstrap(
        log_r, batch.offsets, params["corrections"], [(8, 15), (256, 346)], n_boot=50
    )  # bucket 0 and the last one (its seed index differs: values only)
    meas = frame[(frame.method == "experiment") & (frame.statistic == "ess_frac")]
    assert len(meas) == 6 * len(params["corrections"])
    for r in boot.itertuples(index=False):
        got = meas[(meas.correction == r.correction) & (meas["T"] == int(np.floor(r.T + 0.5)))]
        assert got.value.iloc[0] == pytest.approx(r.ess_frac, rel=1e-12, nan_ok=True)
    fit = corrections.theory(corrections.fit_lognormal(log_r), params["data_T"], params["corrections"])
    lines = frame[(frame.method == "experiment_fit") & (frame.statistic == "rel_bias")]
    np.testing.assert_allclose(lines.value, fit.bias / fit.mean_base, rtol=1e-12)
    fig = pipeline.draw("corrections_vs_T", frame, params, style="paper")
    assert len(fig.axes) == 4
    none = frames.figure_data("corrections_vs_T", {**params, "data": None})
    assert not none.method.str.startswith("experiment").any()
    assert len(pipeline.draw("corrections_vs_T", none, params).axes) == 2


def test_clip_fractions_is_the_analysis_of_the_shipped_data(quick):
    """clip_fractions: analyze's clip columns of the shipped data, every model; a missing file is named."""
    from variance_lab.rollouts.predictions import ALL_MODELS

    sidecar = json.loads((quick / "clip_fractions.json").read_text())
    assert sidecar["params"]["data"] == "arith_rollouts.jsonl.gz"
    data = pd.read_csv(quick / "clip_fractions.csv")
    for kind in ("gspo", "ppo"):
        for col in (f"{kind}_clip_frac", f"{kind}_clip_frac_lo", f"{kind}_clip_frac_hi"):
            assert col in data
        for m in ALL_MODELS:
            assert f"{kind}_clip_pred_{m}" in data
    assert (data["gspo_clip_frac_lo"] <= data["gspo_clip_frac"]).all()
    assert (data["gspo_clip_frac"] <= data["gspo_clip_frac_hi"]).all()
    assert data["n_seq"].sum() == 2048  # every sequence of the data set lies in a bucket
    # the i.i.d. empirical GSPO prediction is the one experiment_variance draws (issue #25, item 4)
    committed = pd.read_csv(Path(__file__).resolve().parents[2] / "figures" / "experiment_variance.csv")
    np.testing.assert_allclose(data["gspo_clip_pred_emp"], committed["gspo_clip_resampled"], rtol=1e-12)
    fig = pipeline.draw("clip_fractions", data, sidecar["params"], style="paper")
    notes = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "no prediction" not in notes
    assert fig.get_suptitle().startswith("arith_rollouts.jsonl.gz: ")
    assert "1: 8-15" in fig.get_suptitle()
    params = {**sidecar["params"], "data": "no_such_rollouts.jsonl.gz"}
    with pytest.raises(ValueError, match="no_such_rollouts"):
        frames.figure_data("clip_fractions", params)


def test_check_of_a_committed_figure_with_mathtext(capsys):
    """--check rebuilds a committed figure whose labels hold subscripts, and its data agree.

    The rebuild draws throw-away PNGs at ``CHECK_DPI``; at 10 dpi FreeType refused the
    subscripts of ``approx_error`` (a traceback instead of a verdict).
    """
    committed = Path(__file__).resolve().parents[2] / "figures"
    assert sidecar_check.CHECK_DPI >= 24
    args = ["figures", "--check", "--out", str(committed), "--only", "approx_error", "--no-progress"]
    assert cli.main(args) == 0
    assert capsys.readouterr().out.strip().endswith(": OK")


def _other_code_paths() -> dict:
    """Environment that runs NumPy and numba on another code path than this processor's best.

    NumPy: its top dispatched SIMD features off (AVX-512 -> AVX2, as on an AMD EPYC without
    AVX-512; on an AVX2-only processor, AVX2 -> the SSE4.2 baseline); numba: generic x86-64
    code. The figures' last bits then differ as they do between processors.
    """
    import os

    found = np.show_config(mode="dicts")["SIMD Extensions"]["found"]
    top = [f for f in found if f != "X86_V3"] or list(found)
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "PYTHONWARNINGS": "error::RuntimeWarning"}
    if top:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(top)
    return env


def _check_elsewhere(tmp_path, *only) -> str:
    import subprocess
    import sys

    committed = Path(__file__).resolve().parents[2] / "figures"
    argv = ["figures", "--check", "--out", str(committed), "--no-progress"]
    argv += ["--only", ",".join(only)] if only else []
    env = {**_other_code_paths(), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run(
        [sys.executable, "-m", "variance_lab.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_check_on_other_code_paths_is_equal_within_tolerance(tmp_path):
    """A committed exact-theory figure checked on NumPy's other SIMD path: its numbers agree.

    On an AMD EPYC without AVX-512 the SHA-256 of approx_error.csv differed from the Intel-built
    one (13 values in the last bit) and --check said it did not reproduce.
    """
    out = _check_elsewhere(tmp_path, "approx_error")
    line = next(x for x in out.splitlines() if x.startswith("approx_error.json: approx_error.csv"))
    assert line.split(": ", 2)[2].startswith(("identical", "equal within tolerance (max relative difference"))
    assert out.strip().endswith(": OK")


@pytest.mark.slow
def test_every_committed_figure_reproduces_on_other_code_paths(tmp_path):
    """--check over all of figures/ with NumPy's and numba's other code paths (about 4 min on 2 cores)."""
    out = _check_elsewhere(tmp_path)
    verdicts = [x.split(": ", 2)[2] for x in out.splitlines() if ".csv: " in x]
    assert len(verdicts) >= 13
    assert all(v.startswith(("identical", "equal within tolerance")) for v in verdicts), out


@pytest.mark.slow
def test_every_committed_figure_reproduces_from_its_sidecar(capsys):
    """--check over the whole committed figures/ folder: every figure's data and versions agree.

    experiment_variance's CSV once lagged behind the analysis (new model columns) unseen,
    because no test rebuilt the committed folder; about 90 s on 2 cores.
    """
    committed = Path(__file__).resolve().parents[2] / "figures"
    assert cli.main(["figures", "--check", "--out", str(committed), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().endswith(": OK")


def test_light_figure_names_match_the_figures():
    """paper.names.ALL_FIGURES (read by the command line's parser) is paper.catalog.ALL_FIGURES."""
    assert names.ALL_FIGURES == catalog.ALL_FIGURES
    assert (*catalog.FIGURES, catalog.EXPERIMENT_FIGURE) == names.ALL_FIGURES
    assert names.ALL_FIGURES[-1] == catalog.EXPERIMENT_FIGURE


def test_quick_help_does_not_promise_seconds():
    """``figures --quick`` takes minutes (149 s measured for every figure, issue #25 item 5), not seconds."""
    import argparse

    from variance_lab.cli import figures as figures_cli

    parser = argparse.ArgumentParser()
    figures_cli.add_command(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["figures"]
    text = next(a.help for a in sub._actions if "--quick" in a.option_strings)
    assert "seconds" not in text
    assert "minutes" in text


def _corrections_frame(experiment: bool = True) -> pd.DataFrame:
    """Return closed forms, Monte Carlo points (some flagged) and, optionally, measured points on a fit."""
    from variance_lab import corrections as co

    specs = "seq-tis:3,tis:2,gmpo"
    rows = []

    def add(frame, method, reliable=True):
        for r in frame.itertuples(index=False):
            for stat, v in (("rel_bias", r.bias / r.mean_base), ("ess_frac", r.ess_frac)):
                lo, hi = (v - 0.05, v) if method in ("experiment", "monte_carlo") else (np.nan, np.nan)
                rows.append(
                    {"T": r.T, "correction": r.correction, "statistic": stat, "method": method,
                     "value": v, "lo": lo, "hi": hi, "reliable": reliable and r.T < 100}
                )  # fmt: skip

    add(co.theory(get_family("lognormal", 1.0, 0.1), [1, 10, 100, 1000], specs), "exact")
    add(co.theory(get_family("lognormal", 1.0, 0.1), [1, 10, 100], specs), "monte_carlo")
    if experiment:
        fit = get_family("lognormal", 1.0, 0.02)
        add(co.theory(fit, [8, 64, 346], specs), "experiment_fit")
        add(co.theory(fit, [11, 90, 283], specs), "experiment")
    return pd.DataFrame(rows)


def _strings(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text().strip()]


def test_corrections_figure_titles_letters_and_b(tmp_path):
    """Each row has its own title, the panels the letters (a)-(d), and the figure says what w and b are.

    Issue #25, item 4: the model's parameters stand over the model's row only, not over the bf16 row;
    the caption cites panels (a)-(d).
    """
    from variance_lab.report import corrections_figure

    fig = corrections_figure.corrections_vs_T(
        _corrections_frame(),
        title="lognormal ratios, mu = 1",
        experiment_title="bf16 experiment",
        style="paper",
    )
    fig.savefig(tmp_path / "c.png", dpi=40)  # lays out and draws without error
    assert fig.get_suptitle() == ""  # no figure title standing over both rows
    rows = [sub.get_suptitle() for sub in fig.subfigs[:2]]
    assert rows == ["(a, b) lognormal ratios, mu = 1", "(c, d) bf16 experiment"]
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["(a)", "(b)", "(c)", "(d)"]
    assert sum(ax in fig.subfigs[0].axes for ax in fig.axes) == 2  # (a), (b) belong to the model's row
    assert corrections_figure.B_NOTE in _strings(fig)
    assert "$b$: the uncorrected weight" in corrections_figure.B_NOTE
    one = corrections_figure.corrections_vs_T(_corrections_frame(False), title="lognormal", style="paper")
    assert one.get_suptitle() == "lognormal"  # one row: the figure's title is the row's
    assert [ax.get_title(loc="left") for ax in one.axes] == ["(a)", "(b)"]


def test_corrections_figure_tells_monte_carlo_from_measured_points():
    """Monte Carlo and the measured points differ in the panels and in the legend (issue #25, item 4)."""
    from variance_lab.report import corrections_figure

    fig = corrections_figure.corrections_vs_T(_corrections_frame(), title="lognormal", style="paper")
    legend = next(leg for part in (fig, *fig.subfigs) for leg in part.legends)
    points = {h.get_label(): h for h in legend.legend_handles if h.get_linestyle() in ("None", "")}
    mc = next(h for lab, h in points.items() if lab.startswith("Monte Carlo (a, b)"))
    measured = next(h for lab, h in points.items() if lab.startswith("measured per length bucket (c, d)"))
    unreliable = next(h for lab, h in points.items() if "unreliable" in lab)
    looks = {(h.get_fillstyle(), str(h.get_markerfacecolor())) for h in (mc, measured, unreliable)}
    assert len(looks) == 3  # three kinds of points, three looks
    top, bottom = fig.axes[0], fig.axes[2]

    def fills(ax):  # markers of the points (not the bars' caps)
        return {
            line.get_fillstyle()
            for line in ax.get_lines()
            if line.get_linestyle() == "None" and line.get_marker() not in ("_", "|", "None")
        }

    mc_fill, data_fill = fills(top), fills(bottom)
    assert mc_fill == {"full"}
    assert data_fill == {measured.get_fillstyle()} != {"full"}


def test_variance_vs_T_explains_its_flagged_points():
    """Issue #25, item 4: the figure says why points on the exact line are flagged.

    The committed figure's data flag T = 5, 10 marginal (the interval rests on an unstable fourth
    moment) and T = 20, 50 unreliable (theory needs more draws than n), all four on the exact
    line: marginal points are half filled, unreliable ones hollow, and the legend names both.
    """
    data = pd.read_csv(Path(__file__).parents[2] / "figures" / "variance_vs_T.csv", keep_default_na=False)
    data = data.replace("", np.nan).astype({"reliable": bool})
    data["reason"] = data["reason"].fillna("")
    mc = data[(data.method == "monte_carlo") & (data.statistic == "var_P")]
    assert set(mc[mc.reason.str.startswith("marginal")]["T"]) >= {5, 10}
    assert set(mc[mc.reason.str.startswith("unreliable")]["T"]) >= {20, 50}
    fig = plots.variance_panels(data, n=100_000)
    top = fig.axes[0]
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert any(lab.startswith("flagged marginal: its interval\nmay cover less than") for lab in labels)
    assert any(
        lab.startswith("flagged unreliable: too few draws") and "may lie on the line" in lab for lab in labels
    )
    points = [line for line in top.get_lines() if line.get_marker() == "o" and line.get_linestyle() == "None"]
    by_look = {}
    for line in points:
        look = (
            "half"
            if line.get_fillstyle() != "full"
            else ("hollow" if line.get_markerfacecolor() == "white" else "filled")
        )
        by_look.setdefault(look, set()).update(int(t) for t in line.get_xdata())
    assert by_look["half"] == set(mc[mc.reason.str.startswith("marginal")]["T"])
    assert by_look["hollow"] == set(mc[mc.reason.str.startswith("unreliable")]["T"])
    assert by_look["filled"] == set(mc[mc.reliable]["T"])


def test_with_resampled_gspo_fills_only_a_missing_prediction():
    """The i.i.d. empirical GSPO column is filled from resampled tokens only where the analysis has none."""
    from variance_lab.experiment.figure import DEFAULT_DATA, load_data, resampled_clip

    params = catalog.default_params("clip_fractions")
    has = pd.DataFrame({"bucket": [3], "gspo_clip_pred_emp": [0.3]})
    out = frames.with_resampled_gspo(has, {**params, "data": "no_such_file.jsonl"})  # nothing loaded
    pd.testing.assert_frame_equal(out, has)
    assert out is not has
    expected = resampled_clip(load_data(DEFAULT_DATA)[0], seed=params["seed"])
    missing = pd.DataFrame({"bucket": range(len(expected)), "gspo_clip_pred_emp": np.nan})
    filled = frames.with_resampled_gspo(missing, params)
    np.testing.assert_array_equal(filled["gspo_clip_pred_emp"], expected)
    assert missing["gspo_clip_pred_emp"].isna().all()  # the caller's frame is left as it was
    with pytest.raises(ValueError, match=f"cover {len(expected)} buckets, the table 2"):
        frames.with_resampled_gspo(missing.head(2), params)


def test_ess_legend_shows_each_series_marker():
    """Each series' legend entry carries the marker of its Monte Carlo points (circle, square, triangle)."""
    exact = pd.concat(
        [_theory(get_family("lognormal", 1.0, s2), [1, 10, 100], ["ess_frac_P"]) for s2 in (0.01, 0.1, 0.5)]
    )
    mc = exact.assign(method="monte_carlo", lo=exact["value"] * 0.9, hi=exact["value"] * 1.1)
    mc = mc.assign(reliable=True, reason="")
    fig = plots.ess_vs_T(pd.concat([exact, mc], ignore_index=True), n=1000)
    legend = fig.axes[0].get_legend()
    markers = {
        t.get_text(): h.get_marker() for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }
    drawn = {li.get_marker() for li in fig.axes[0].get_lines()} - {"None", ""}
    series = [markers[rf"$\sigma^2={s2:g}$"] for s2 in (0.01, 0.1, 0.5)]
    assert series == ["o", "s", "^"]
    assert set(series) <= drawn  # the markers the points are drawn with
    theory_only = plots.ess_vs_T(exact, n=1000).axes[0].get_legend()
    assert {h.get_marker() for h in theory_only.legend_handles[:3]} == {"None"}  # no points, no marker


def test_shipped_captions_say_what_the_code_does():
    """The sidecars' captions: approx_error's floor is the code's, the fitted models carry the CLI's names.

    Issue #34: the caption said 1e-16 while the floor is 1e-12; clip_fractions named the models
    "random scale / token mixture / combined" while ``analyze`` prints ``hier/mix/comb``;
    experiment_variance said "bootstrap over sequences" while its intervals resample prompts.
    """
    from variance_lab.report.clip_figure import MODEL_MARKERS
    from variance_lab.report.theory_figures import REL_ERROR_FLOOR

    committed = Path(__file__).resolve().parents[2] / "figures"

    def caption(name):
        return json.loads((committed / f"{name}.json").read_text())["description"]

    floor = f"{REL_ERROR_FLOOR:g}"
    assert f"values below {floor} drawn at {floor}" in caption("approx_error")
    clips = caption("clip_fractions")
    for key in ("mix", "hier", "comb"):
        assert MODEL_MARKERS[key]["label"].startswith(f"{key} (")
        assert f"{key} (" in clips
    experiment = json.loads((committed / "experiment_variance.json").read_text())
    assert experiment["analysis"]["groups"]["n_prompts"] > 1
    assert "bootstrap over prompts" in experiment["description"]
    assert "bootstrap over sequences" not in experiment["description"]


def test_threshold_frame_is_the_corrections_api():
    """The thresholds figure's rows: ctpo_positions, simulate_positions, find_T, m2po's theory and MC."""
    from variance_lab import corrections as co

    params = {**catalog.default_params("thresholds", quick=True), "n": 300, "m2po_n": 512}
    params["ctpo"] = ["ctpo:0.5:0.5"]
    frame = frames.threshold_frame(params)
    fam = get_family("lognormal", 1.0, 0.1)
    exact = frame[(frame.panel == "ctpo") & (frame.method == "exact")]
    pos = co.ctpo_positions(fam, "ctpo:0.5:0.5", 1000).set_index("t").frac_clipped
    assert exact.value.tolist() == [pos[int(t)] for t in exact.x]
    mc = frame[(frame.panel == "ctpo") & (frame.method == "monte_carlo")]
    sim = co.simulate_positions(fam, "ctpo:0.5:0.5", 1000, 300, seed=0).set_index("t")
    assert mc.value.tolist() == [sim.mc_frac_modified[int(t)] for t in mc.x]
    assert frame[frame.method == "binding"].x.tolist() == [co.find_T(fam, "ctpo:0.5:0.5", 0.5)]
    m2 = frame[frame.panel == "m2po"]
    assert len(m2[m2.method == "exact"]) == len(params["tau"])
    assert len(m2[m2.method == "monte_carlo"]) == len(params["mc_tau"]) * len(params["batches"])
    assert set(m2.series) == {
        "large-batch limit, $\\sigma^2 = 0.1$",
        "batch of 16 tokens",
        "batch of 256 tokens",
    }
