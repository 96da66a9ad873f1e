"""The one bootstrap of variance_lab.stats: resamples, ratios, proportions, bootstrap-t of a log variance."""

import math

import numpy as np
import pytest

from variance_lab.corrections import evaluate
from variance_lab.stats import (
    bootstrap_ratio,
    cluster_counts,
    log_sample_var,
    log_var_interval,
    proportion_interval,
    resample,
    wilson_interval,
)


def test_resample_draws_indices_or_cluster_counts():
    """Without groups: the rng's integers; with groups: cluster_counts' counts (same stream, same numbers)."""
    x = np.arange(6.0)
    res = resample(6, 50, np.random.default_rng(1))
    idx = np.random.default_rng(1).integers(0, 6, size=(50, 6))
    assert np.array_equal(res.index, idx)
    assert res.counts is None
    assert np.array_equal(res.sums(x), x[idx].sum(axis=1))
    g = np.repeat([3, 1, 2], 2)
    res = resample(6, 50, np.random.default_rng(2), g)
    W = cluster_counts(g, 50, np.random.default_rng(2))
    assert np.array_equal(res.counts, W)
    assert res.index is None
    assert np.array_equal(res.sums(x), W @ x)
    assert np.all(res.counts.sum(axis=1) == 6)  # every resample draws 3 clusters of 2


def test_bootstrap_ratio_percentiles_and_one_unit():
    """The i.i.d. interval is the percentile interval of the resampled ratios; one unit or cluster: NaN."""
    rng = np.random.default_rng(3)
    num, den = rng.poisson(3.0, 40).astype(float), rng.integers(5, 20, 40).astype(float)
    lo, hi = bootstrap_ratio(num, den, n_boot=400, level=0.9, rng=np.random.default_rng(4))
    idx = np.random.default_rng(4).integers(0, 40, size=(400, 40))
    r = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    assert (lo, hi) == (np.quantile(r, 0.05), np.quantile(r, 0.95))
    assert lo < num.sum() / den.sum() < hi
    for groups in (None, np.zeros(1)):
        assert all(
            math.isnan(e)
            for e in bootstrap_ratio(num[:1], den[:1], n_boot=9, level=0.9, rng=rng, groups=groups)
        )
    one_prompt = np.zeros(40)
    assert all(
        math.isnan(e) for e in bootstrap_ratio(num, den, n_boot=9, level=0.9, rng=rng, groups=one_prompt)
    )
    assert all(math.isnan(e) for e in bootstrap_ratio(num, den, n_boot=0, level=0.9, rng=rng))


def test_proportion_interval_is_wilson_without_groups():
    """No groups: Wilson's interval, no draw; groups: the clustered interval and design effect."""
    y = np.r_[np.ones(7), np.zeros(33)]
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    r = proportion_interval(y, n_boot=100, level=0.95, rng=rng)
    assert rng.bit_generator.state == state
    assert (r["lo"], r["hi"]) == tuple(float(e) for e in wilson_interval(7, 40, 0.95))
    assert math.isnan(r["design_effect"])
    copies = np.repeat(np.arange(20), 2)  # every prompt's two responses agree: design effect about 2
    y2 = np.repeat(np.r_[np.ones(4), np.zeros(16)], 2)
    rc = proportion_interval(y2, n_boot=2000, level=0.95, rng=rng, groups=copies)
    assert 1.5 < rc["design_effect"] < 2.6
    iid_lo, iid_hi = wilson_interval(8, 40, 0.95)
    assert rc["hi"] - rc["lo"] > iid_hi - iid_lo  # 20 independent prompts, not 40 responses


def test_log_var_interval_point_and_coverage_of_its_own_point():
    """The point is log_sample_var; the interval holds it; groups of one unit give a close interval."""
    a = np.random.default_rng(6).normal(0.0, 0.4, 300)
    point, lo, hi, failed = log_var_interval(a, n_boot=500, level=0.95, rng=np.random.default_rng(7))
    assert point == pytest.approx(log_sample_var(a), rel=1e-13)
    assert lo < point < hi
    assert not failed
    p1, lo1, hi1, _ = log_var_interval(
        a, n_boot=500, level=0.95, rng=np.random.default_rng(7), groups=np.arange(300)
    )
    assert p1 == pytest.approx(point, rel=1e-12)
    assert lo1 == pytest.approx(lo, abs=0.1)  # log scale; half-widths about 0.17
    assert hi1 == pytest.approx(hi, abs=0.1)


def test_log_var_interval_one_cluster_is_undefined():
    """Every unit in one cluster: the point, NaN ends and no error (was a ZeroDivisionError)."""
    a = np.random.default_rng(8).normal(0.0, 0.3, 12)
    point, lo, hi, failed = log_var_interval(
        a, n_boot=100, level=0.95, rng=np.random.default_rng(0), groups=np.zeros(12)
    )
    assert point == pytest.approx(log_sample_var(a), rel=1e-12)
    assert math.isnan(lo)
    assert math.isnan(hi)
    assert not failed


def test_log_var_interval_without_spread_or_resamples():
    """A constant sample gives the point (-inf) at both ends without drawing; n_boot = 0 gives NaN ends."""
    rng = np.random.default_rng(9)
    state = rng.bit_generator.state
    for groups in (None, np.repeat([0, 1], 3)):
        assert log_var_interval(np.full(6, 2.0), n_boot=50, level=0.9, rng=rng, groups=groups) == (
            -math.inf,
            -math.inf,
            -math.inf,
            False,
        )
    assert rng.bit_generator.state == state
    point, lo, hi, _ = log_var_interval(np.arange(5.0), n_boot=0, level=0.9, rng=rng)
    assert math.isfinite(point)
    assert math.isnan(lo)
    assert math.isnan(hi)


@pytest.mark.parametrize("groups", [None, [7]])
def test_one_sequence_bucket_has_no_bootstrap_interval(groups):
    """One sequence (or one prompt) has nothing to resample: the token-level interval is NaN, not [f, f]."""
    df = evaluate([0.0, 1.0, 0.1, -0.2], [0, 4], "tis:2", groups=groups)
    row = df.iloc[0]
    assert row["frac_modified"] == 0.25
    assert math.isnan(row["frac_modified_lo"])
    assert math.isnan(row["frac_modified_hi"])
