"""paper.compare: a rebuilt figure's data against the recorded data, number by number."""

import math

import numpy as np
import pandas as pd
import pytest

from variance_lab.paper.compare import FIT_RTOL, RTOL, Z, compare_frames, sampler_promise


def _tidy() -> pd.DataFrame:
    """Two exact rows and two Monte Carlo rows of the tidy schema."""
    return pd.DataFrame(
        {
            "family": ["lognormal"] * 4,
            "T": [10, 100, 10, 100],
            "method": ["exact", "exact", "monte_carlo", "monte_carlo"],
            "value": [1.5937424601, 13780.61233982, 1.62, 1619.0],
            "log10_value": [math.log10(1.5937424601), math.log10(13780.61233982), math.log10(1.62), 3.2092],
            "lo": [np.nan, np.nan, 1.55, 1100.0],
            "hi": [np.nan, np.nan, 1.69, 2100.0],
            "se": [np.nan, np.nan, 0.035, 250.0],
            "reliable": [True, True, True, False],
            "reason": ["", "", "", "unreliable: k-hat 0.80"],
        }
    )


def _changed(frame, column, row, value):
    out = frame.copy()
    out.loc[row, column] = value
    return out


def test_identical_and_last_bit_differences():
    """Equal frames are identical; a one-ulp change is equal within tolerance, with its size."""
    old = _tidy()
    assert compare_frames("a.csv", old, old.copy(), promise=True).status == "identical"
    bumped = _changed(old, "value", 1, np.nextafter(old.loc[1, "value"], np.inf))
    got = compare_frames("a.csv", old, bumped, promise=True)
    assert got.status == "equal within tolerance"
    assert 0 < got.max_rel < 2.3e-16
    assert "equal within tolerance (max relative difference" in got.line()


def test_theory_beyond_its_tolerance_differs():
    """An exact value off by 100 x RTOL differs, and the line names the column and row."""
    old = _tidy()
    got = compare_frames(
        "a.csv", old, _changed(old, "value", 0, old.loc[0, "value"] * (1 + 100 * RTOL)), promise=True
    )
    assert got.status == "differs"
    assert not got.ok
    assert "'value'" in got.line()
    assert "row 0" in got.line()


def test_text_and_shape_must_be_equal():
    """Text, flags, row count and columns must match exactly."""
    old = _tidy()
    assert (
        compare_frames("a.csv", old, _changed(old, "reason", 3, "marginal: x"), promise=True).status
        == "differs"
    )
    assert compare_frames("a.csv", old, _changed(old, "reliable", 3, True), promise=True).status == "differs"
    assert compare_frames("a.csv", old, old.iloc[:3], promise=True).status == "differs"
    assert compare_frames("a.csv", old, old.drop(columns="se"), promise=True).status == "differs"


def test_monte_carlo_bit_exact_under_the_promise_within_standard_errors_without():
    """Monte Carlo: RTOL under the sampler's promise, Z sqrt(2) se without it; exact rows never."""
    old = _tidy()
    se = old.loc[2, "se"]
    near = _changed(old, "value", 2, old.loc[2, "value"] + 0.9 * Z * math.sqrt(2) * se)
    far = _changed(old, "value", 2, old.loc[2, "value"] + 1.1 * Z * math.sqrt(2) * se)
    assert compare_frames("a.csv", old, near, promise=True).status == "differs"
    assert compare_frames("a.csv", old, near, promise=False).status == "equal within tolerance"
    assert compare_frames("a.csv", old, far, promise=False).status == "differs"
    # the same shift on an exact row is never excused by a standard error
    exact = _changed(old, "value", 0, old.loc[0, "value"] + 0.01)
    assert compare_frames("a.csv", old, exact, promise=False).status == "differs"


def test_log10_bound_follows_the_value_and_se_is_the_yardstick():
    """log10_value's bound is se / (value ln 10); se itself only needs to stay finite."""
    old = _tidy()
    bound = Z * math.sqrt(2) * old.loc[3, "se"] / (old.loc[3, "value"] * math.log(10))
    near = _changed(old, "log10_value", 3, old.loc[3, "log10_value"] + 0.9 * bound)
    far = _changed(old, "log10_value", 3, old.loc[3, "log10_value"] + 1.1 * bound)
    assert compare_frames("a.csv", old, near, promise=False).ok
    assert not compare_frames("a.csv", old, far, promise=False).ok
    assert compare_frames("a.csv", old, _changed(old, "se", 2, 0.05), promise=False).ok
    assert not compare_frames("a.csv", old, _changed(old, "se", 2, np.nan), promise=False).ok


def test_interval_half_width_stands_in_for_a_missing_se():
    """corrections_vs_T has lo/hi but no se: se = (hi - lo) / (2 z) at the recorded level."""
    old = pd.DataFrame({"method": ["monte_carlo"], "value": [0.5], "lo": [0.4], "hi": [0.6]})
    se = 0.2 / (2 * 1.959963984540054)
    near = _changed(old, "value", 0, 0.5 + 0.9 * Z * math.sqrt(2) * se)
    far = _changed(old, "value", 0, 0.5 + 1.1 * Z * math.sqrt(2) * se)
    assert compare_frames("c.csv", old, near, promise=False).ok
    assert not compare_frames("c.csv", old, far, promise=False).ok


def test_fitted_model_columns_have_the_optimiser_tolerance():
    """Columns of a fitted model's predictions (FITTED_MODELS suffixes) get FIT_RTOL, reported apart."""
    old = pd.DataFrame({"bucket": [3], "gspo_clip_pred_hier": [0.62], "gspo_clip_pred_iid": [0.94]})
    fit = _changed(old, "gspo_clip_pred_hier", 0, 0.62 * (1 + 0.5 * FIT_RTOL))
    got = compare_frames("clip.csv", old, fit, promise=True)
    assert got.status == "equal within tolerance"
    assert got.max_rel == 0
    assert got.max_rel_fitted == pytest.approx(0.5 * FIT_RTOL / (1 + 0.5 * FIT_RTOL), rel=1e-9)
    assert "in fitted-model columns" in got.line()
    assert not compare_frames("clip.csv", old, _changed(old, "gspo_clip_pred_hier", 0, 0.7), promise=True).ok
    # a closed-form prediction (iid) keeps the float tolerance
    assert not compare_frames(
        "clip.csv", old, _changed(old, "gspo_clip_pred_iid", 0, 0.94 * 1.001), promise=True
    ).ok


def test_nan_and_inf_must_match():
    """Infinities and NaN agree only with themselves."""
    old = pd.DataFrame({"method": ["exact"] * 3, "value": [np.inf, np.nan, 1.0]})
    assert compare_frames("x.csv", old, old.copy(), promise=True).status == "identical"
    assert not compare_frames("x.csv", old, _changed(old, "value", 0, 1e308), promise=True).ok
    assert not compare_frames("x.csv", old, _changed(old, "value", 1, 0.0), promise=True).ok


def test_sampler_promise_needs_every_key_recorded_and_equal():
    """The promise: same machine, Python, NumPy and numba (the CPU model may differ)."""
    now = {"machine": "x86_64", "python": "3.11.7", "numpy": "2.4.6", "numba": "0.68.1", "cpu": "AMD EPYC"}
    assert sampler_promise({**now, "cpu": "Intel Xeon"}, now)
    assert not sampler_promise({**now, "numba": "0.60.0"}, now)
    assert not sampler_promise({k: v for k, v in now.items() if k != "numba"}, now)
    assert not sampler_promise({**now, "machine": "aarch64"}, now)
