"""The data of the 2025-26 methods' figures: the corrections, VCPO and the bounds' own numbers, row by row."""

import math

import numpy as np
import pytest

from variance_lab import corrections as co
from variance_lab.corrections import vcpo
from variance_lab.families import get_family
from variance_lab.paper import catalog, frames, method_frames
from variance_lab.report.threshold_figure import THRESHOLD_COLUMNS
from variance_lab.theory import speed_bounds


def test_the_registry_names_the_three_figures():
    """Each figure has quick parameters, a caption and a frame function; its frame has the panel schema."""
    for name in ("sign_weights", "vcpo_ess", "speed_bounds"):
        assert name in catalog.FIGURES
        assert catalog.caption(name)
        assert name in frames.METHOD_FRAMES


def test_sign_frame_is_the_corrections_api():
    """Exact rows are theory's, Monte Carlo rows simulate_corrections' less E[X], data rows evaluate's."""
    params = {**catalog.default_params("sign_weights", quick=True), "n": 400, "mc_T": [1, 10]}
    frame = method_frames.sign_frame(params)
    assert list(frame.columns) == list(THRESHOLD_COLUMNS)
    fam = get_family("lognormal", 1.0, 0.1)
    th = co.theory(fam, params["T"], params["specs"]).set_index(["correction", "T"])
    exact = frame[frame.method == "exact"]
    assert set(exact.series) == {f"{s} [{g}]" for s in params["specs"] for g in ("A>=0", "A<0")}
    for r in exact.itertuples(index=False):
        col = "bias" if r.panel == "bias" else "var_w"
        assert r.value == th.loc[(r.series, int(r.x)), col]
    mc = co.simulate_corrections(fam, [1, 10], params["specs"], 400, seed=0).set_index(["correction", "T"])
    base = co.theory(fam, [1, 10], params["specs"]).set_index(["correction", "T"]).mean_base
    for r in frame[(frame.method == "monte_carlo") & (frame.panel == "bias")].itertuples(index=False):
        m = mc.loc[(r.series, int(r.x))]
        assert r.value == pytest.approx(m.mc_mean_w - base[(r.series, int(r.x))], rel=1e-12)
        assert r.reliable == m.mc_reliable
    data = frame[frame.panel == "data"]
    assert data.x.tolist() == list(range(6))
    assert data.series.tolist()[:2] == ["topr [A>=0]", "topr [A<0]"]
    assert (data.lo <= data.value).all()
    assert (data.value <= data.hi).all()


def test_vcpo_frame_is_the_vcpo_api():
    """rho_k(T) from ess_limit, minibatch means from simulate_ess_ratio, gains from baseline_gain."""
    params = {
        **catalog.default_params("vcpo_ess", quick=True),
        "T": [10, 100],
        "lags": [1, 3],
        "mc_T": [100],
        "batches": 30,
        "data": ["smollm2_mismatch_fp16.jsonl.gz"],
    }
    params["families"] = params["families"][:2]
    frame = method_frames.vcpo_frame(params)
    fam = get_family("lognormal", 1.0, 1e-3)
    lag3 = frame[(frame.series == "lag 3") & (frame.method == "exact")]
    np.testing.assert_array_equal(lag3.value, vcpo.ess_limit(fam, [10, 100], lag=3))
    mc = frame[(frame.series == "lag 3") & (frame.method == "monte_carlo")]
    assert mc.value.iloc[0] == vcpo.simulate_ess_ratio(fam, [100], 64, 30, lag=3, seed=1)["mean"][0]
    assert set(frame[frame.panel == "family"].series) == {"lognormal", "gamma"}
    gain = frame[frame.panel == "baseline"]
    assert gain.series.tolist() == ["mismatch_fp16"]
    assert gain.value.iloc[0] > 1.0  # >= 1 by construction; the shipped file's weights differ within groups


def test_bounds_frame_is_the_speed_bounds_api():
    """Bias, variance and crossover rows are theory.speed_bounds'; the ratio rows are bound / exact."""
    params = {**catalog.default_params("speed_bounds", quick=True), "T": [1, 10, 100], "T_max": 600}
    params["families"] = [params["families"][1], params["families"][3]]
    frame = method_frames.speed_bounds_frame(params)
    for spec in params["families"]:
        fam, label = method_frames._family(spec), method_frames.family_label(spec)
        want = speed_bounds.bounds_frame(fam, [1, 10, 100])
        rows = frame[frame.series == label]
        np.testing.assert_array_equal(
            rows[(rows.panel == "bias") & (rows.method == "exact")].value, want.token_bias
        )
        np.testing.assert_array_equal(
            rows[(rows.panel == "var") & (rows.method == "bound")].value, want.var_P_bound
        )
        ratio = frame[frame.series == f"{label}: bias"]
        assert ratio.x.tolist() == [10.0, 100.0]  # T = 1 has no bias to divide by
        np.testing.assert_allclose(ratio.value, (want.token_bias_bound / want.token_bias)[1:], rtol=1e-15)
        cross = speed_bounds.crossover(fam, params["n"], T_max=600)
        got = rows[(rows.panel == "crossover") & (rows.method == "exact")]
        assert got.value.tolist() == [t for t in cross["exact"] if math.isfinite(t)]


def test_family_labels_and_files():
    """Labels name sigma^2 and shape parameters, a mixture its minority states; bare names: shipped files."""
    assert method_frames.family_label(["lognormal", 1.0, 0.01]) == "lognormal, $\\sigma^2$ 0.01"
    assert method_frames.family_label(["ar1", 1.0, 1e-3, {"rho": 0.5}], sigma2=False) == "ar1, rho 0.5"
    mix = ["lognormal-mixture", None, None, {"components": "0.98:-0.0005:0.001,0.02:-0.25:0.5"}]
    assert method_frames.family_label(mix) == "mixture: 2 % at $v$ = 0.5"
    assert method_frames.rollout_file("smollm2_stale_gspo.jsonl.gz").is_file()
