"""Figures: plot functions on tidy frames, the figures command, sidecars that reproduce them."""

import hashlib
import json

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from variance_lab import __version__, cli, theory
from variance_lab.families import get_family
from variance_lab.paper import figures as figs
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
    for name in figs.FIGURES:
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
    expected = {f"{n}.{ext}" for n in figs.ALL_FIGURES for ext in ("pdf", "png", "csv", "json")}
    expected.add(f"{figs.EXPERIMENT_FIGURE}_curves.csv")  # the experiment figure's prediction curves
    assert {p.name for p in quick.iterdir()} == expected  # and no temporary files left
    exp = json.loads((quick / f"{figs.EXPERIMENT_FIGURE}.json").read_text())
    assert exp["version"] == __version__


def test_sidecar_params_reproduce_the_data(quick):
    """Each sidecar's parameters regenerate data with the recorded SHA-256."""
    for name in figs.FIGURES:
        sidecar = json.loads((quick / f"{name}.json").read_text())
        data = figs.figure_data(name, sidecar["params"])
        assert hashlib.sha256(data.to_csv(index=False).encode()).hexdigest() == sidecar["data_sha256"], name


@pytest.mark.parametrize("name", ["variance_vs_T", "heatmap_var_P"])
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
        figs.default_params("nope")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["figures", "--from-sidecar", str(bad)]) == 2
    assert "is not a figure sidecar" in capsys.readouterr().err


# ----------------------------------------------------------------------------- plot functions
def _theory(family, T, names):
    return figs._theory(family, T, names)


@pytest.fixture(scope="module")
def var_frame():
    """Return exact curves and four Monte Carlo rows (one unreliable) for lognormal(1, 0.1)."""
    fam = get_family("lognormal", 1.0, 0.1)
    frame = _theory(
        fam, [1, 10, 100, 1000], ["var_P", "var_G", "var_G_lognormal", "var_G_delta", "var_G_seed"]
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
    assert {"lognormal approx.", "seed's $\\sigma^2/T$"} <= set(ax2.get_legend_handles_labels()[1])


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
    hist = figs.histogram_frame(rng.normal(size=(500, 2)), [1, 10], bins=10)
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
        (plots.variance_panels, var_frame, 2),
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
    names = ["var_G", "var_G_lognormal", "var_G_delta", "var_G_seed"]
    frames = [_theory(get_family(f, 1.0, 0.1), [1, 10, 100], names) for f in ("lognormal", "gamma")]
    err = plots.relative_error_frame(pd.concat(frames))
    logn = err[(err["family"] == "lognormal") & (err["method"] == "lognormal")]
    assert (logn["rel_error"].abs() < 1e-14).all()  # exact for the lognormal family
    seed_T1 = err[(err["method"] == "seed") & (err["T"] == 1)]
    assert (seed_T1["rel_error"].abs() < 1e-14).all()  # G_1 = r: Var = sigma^2 exactly
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
    a = figs.sample_log_P(fam, [1, 5, 20], 20000, seed=3)
    b = figs.sample_log_P(fam, [20, 1, 5], 20000, seed=3)
    assert a.shape == (20000, 3)
    np.testing.assert_array_equal(a[:, 0], b[:, 1])
    np.testing.assert_array_equal(a[:, 2], b[:, 0])
    for j, T in enumerate([1, 5, 20]):
        se = np.sqrt(T * fam.var_log / 20000)
        assert abs(a[:, j].mean() - T * fam.mean_log) < 5 * se
        assert a[:, j].var() == pytest.approx(T * fam.var_log, rel=0.1)
    assert not np.array_equal(a, figs.sample_log_P(fam, [1, 5, 20], 20000, seed=4))


def test_sample_log_P_other_families():
    """Two-point samples take the two values; degenerate ones are T log mu; T = 0 raises."""
    two = get_family("two-point", 1.0, 0.1)
    _, (_, la, lb) = two.sampler_params()
    x = figs.sample_log_P(two, [1], 1000, seed=0)[:, 0]
    assert set(np.round(x, 12)) == {round(la, 12), round(lb, 12)}
    flat = figs.sample_log_P(get_family("lognormal", 1.2, 0.0), [3], 10)
    np.testing.assert_allclose(flat, 3 * np.log(1.2))
    with pytest.raises(ValueError, match="T must be"):
        figs.sample_log_P(two, [0], 10)
