"""Kernels: per-family draws of log r, and the chunk kernel against reference draws."""

import numpy as np
import pytest

from variance_lab import Gamma, LogNormal, TwoPoint
from variance_lab.families import AR1
from variance_lab.simulate import (
    AccumulatorSpec,
    accumulate_log_p,
    draw_log_r,
    prepare,
    run_accumulators,
    run_chunk,
)
from variance_lab.simulate.accumulators import LOG_P
from variance_lab.simulate.plan import chunk_generator
from variance_lab.stats import central_moments

FAMILIES = [
    LogNormal(1.0, 0.1),
    Gamma(1.0, 0.1),
    Gamma(1.0, 4.0),  # shape 0.25: the small-shape path
    TwoPoint(1.0, 0.1),
    TwoPoint(2.0, 0.5, q=0.3),
]


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f"{f.name}-{f.sigma2}")
def test_draws_have_the_family_log_moments(fam):
    """Each family's draws of log r have its mean, variance and mean of r within tolerance."""
    code, par = fam.sampler_params()
    n = 200_000
    y = draw_log_r(code, par, np.random.default_rng(5), n)
    assert np.all(np.isfinite(y))
    sd = np.sqrt(fam.var_log)
    assert abs(y.mean() - fam.mean_log) < 5 * sd / np.sqrt(n)
    assert abs(y.var() / fam.var_log - 1) < 0.05
    assert abs(np.exp(y).mean() / fam.mu - 1) < 5 * np.sqrt(fam.sigma2 / n) / fam.mu


def test_lognormal_draws_follow_numpy_stream():
    """Lognormal draws are m + s z with z NumPy's standard normals for the same seed."""
    fam = LogNormal(1.0, 0.3)
    code, (m, s) = fam.sampler_params()
    y = draw_log_r(code, np.array([m, s]), np.random.default_rng(9), 1000)
    z = np.random.default_rng(9).standard_normal(1000)
    np.testing.assert_allclose(y, m + s * z, rtol=1e-13, atol=1e-15)


def test_tiny_gamma_shape_never_underflows():
    """A gamma shape of 0.01 keeps log r finite below -746, where r itself underflows."""
    fam = Gamma(1.0, 100.0)  # shape 0.01: P(Gamma(0.01) < 1e-323) = P(U**100 < e**-745) ~ 6e-4
    code, par = fam.sampler_params()
    y = draw_log_r(code, par, np.random.default_rng(1), 100_000)
    assert np.all(np.isfinite(y))
    assert np.sum(y < -746) > 10  # values whose exp is 0.0 in float64, kept in log space
    assert abs(y.mean() - fam.mean_log) < 5 * np.sqrt(fam.var_log / y.size)


def test_two_point_values_and_frequency():
    """Two-point draws take only the two values, the first with frequency q."""
    fam = TwoPoint(1.0, 0.2, q=0.3)
    code, par = fam.sampler_params()
    y = draw_log_r(code, par, np.random.default_rng(2), 100_000)
    q, la, lb = par
    assert set(np.unique(y)) == {la, lb}
    assert abs(np.mean(y == la) - q) < 5 * np.sqrt(q * (1 - q) / y.size)


def test_degenerate_is_constant():
    """A degenerate family has sampler code 0 and draws log mu every time."""
    fam = LogNormal(1.5, 0.0)
    code, par = fam.sampler_params()
    assert code == 0
    np.testing.assert_array_equal(draw_log_r(code, par, np.random.default_rng(0), 10), np.log(1.5))


def _assert_same_accumulator(a, b, rtol=1e-11):
    assert a.count == b.count
    np.testing.assert_allclose(a.shift, b.shift, rtol=1e-13)
    np.testing.assert_allclose(a.sums, b.sums, rtol=rtol, atol=1e-9 * np.abs(b.sums).max())
    np.testing.assert_allclose(a.tail, b.tail, rtol=1e-13)


def _reference_log_p(rng, n_paths, grid, m, s, independent):
    """Return log P_T of the chunk's paths, drawn as the kernel draws them.

    Batches of 4 paths, token-major within a batch (paths 0, 1, 2, 3, 0, 1, ...), then the
    rest one by one.
    """
    rows = []
    for batch in [4] * (n_paths // 4) + [1] * (n_paths % 4):
        sums, prev, out = np.zeros(batch), 0, []
        for t in grid:
            seg = t if independent else t - prev
            z = rng.standard_normal(seg * batch).reshape(seg, batch).sum(axis=0)
            sums = z if independent else sums + z
            prev = t
            out.append(t * m + s * sums)
        rows.extend(np.array(out).T)
    return np.array(rows)


@pytest.mark.parametrize("independent", [False, True])
def test_chunk_kernel_matches_reference_draws(independent):
    """The kernel's log P_T equal m T + s (sum of the chunk stream's normals), path by path."""
    fam = LogNormal(1.0, 0.1)
    grid = np.array([1, 4, 9])
    _, tasks = prepare(fam, grid, 302, seed=3, independent=independent, chunk_size=302)
    task = tasks[0]
    m, s = task.params
    ref = _reference_log_p(chunk_generator(3, 0), task.n_paths, grid, m, s, independent)
    _assert_same_accumulator(run_chunk(task), accumulate_log_p(ref, task.spec))


def test_run_chunk_is_pure():
    """Running the same chunk twice gives identical accumulators."""
    _, tasks = prepare(Gamma(1.0, 0.5), [2, 30], 5000, seed=11)
    a, b = run_chunk(tasks[1]), run_chunk(tasks[1])
    for x, y in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
        np.testing.assert_array_equal(x, y)


def test_accumulate_log_p_checks_shape():
    """A log P array of the wrong width raises; an empty one gives a count of 0."""
    spec = AccumulatorSpec.from_family(LogNormal(1.0, 0.1), [1, 2], tail=5)
    with pytest.raises(ValueError, match="shape"):
        accumulate_log_p(np.zeros((3, 3)), spec)
    assert accumulate_log_p(np.zeros((0, 2)), spec).count == 0


def test_ar1_draws_are_a_stationary_ar1_path():
    """AR(1) draws have the family's mean, variance and lag-one correlation rho."""
    fam = AR1(1.0, 0.2, rho=0.6)
    code, par = fam.sampler_params()
    y = draw_log_r(code, par, np.random.default_rng(4), 200_000)
    d = y - y.mean()
    assert abs(y.mean() - fam.mean_log) < 0.02
    assert y.var() == pytest.approx(fam.var_log, rel=0.03)
    assert np.mean(d[1:] * d[:-1]) / d.var() == pytest.approx(0.6, abs=0.01)


@pytest.mark.parametrize("independent", [False, True])
def test_ar1_paths_have_the_variance_of_the_sum(independent):
    """AR(1) paths' sample Var(log P_T) is the family's variance of the sum."""
    fam = AR1(1.0, 0.1, rho=0.8)
    acc = run_accumulators(fam, [1, 5, 40], 20_000, seed=2, independent=independent, progress=False)
    _, m2, _, _ = central_moments(acc.sums[LOG_P], acc.count)
    for j, T in enumerate([1, 5, 40]):
        assert m2[j] == pytest.approx(float(fam.var_sum_mp(T)), rel=0.05)


def test_unknown_sampler_code():
    """An unknown sampler code raises ValueError naming it."""
    with pytest.raises(ValueError, match="unknown sampler code 9"):
        draw_log_r(9, np.zeros(3), np.random.default_rng(0), 3)
