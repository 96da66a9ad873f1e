"""Dense T grids: the block reduction, the vectorised exponential, the tail sample and its chunk share."""

import math

import numpy as np
import pytest
from scipy import stats

from variance_lab import Gamma, LogNormal, TwoPoint
from variance_lab.families import AR1
from variance_lab.simulate import (
    AccumulatorSpec,
    Engine,
    accumulate_log_p,
    merge_all,
    prepare,
    run_accumulators,
    run_chunk,
)
from variance_lab.simulate._vexp import W_MAX, W_MIN, exp_minus, exp_minus_clamped
from variance_lab.simulate.accumulators import LOG_P, Accumulator, G, P
from variance_lab.simulate.block import LANES, _compact, block_size, finish_tails
from variance_lab.simulate.estimates import estimate
from variance_lab.simulate.kernels import draw_log_p
from variance_lab.simulate.plan import TAIL_LOG_RISK, chunk_generator, chunk_tail_keep, make_plan, tail_size

DENSE = np.arange(1, 201)


# ----------------------------------------------------------------------------- exponential
@pytest.fixture(scope="module")
def vexp():
    """Return a jitted loop over the vectorised exp and expm1 helpers, clamped or not."""
    from numba import njit

    @njit
    def run(w, minus, clamp, out):
        for i in range(w.size):
            out[i] = exp_minus_clamped(w[i], minus) if clamp else exp_minus(w[i], minus)

    return run


@pytest.mark.parametrize("scale", [1e-12, 1e-4, 0.3, 5.0, 200.0])
def test_exp_and_expm1_within_2_ulp(vexp, scale):
    """The kernel exp and expm1 are within 2 ulp of NumPy's across scales."""
    w = np.random.default_rng(1).standard_normal(200_000) * scale
    w = w[(w > W_MIN) & (w < W_MAX)]
    out = np.empty_like(w)
    for minus, ref in ((0.0, np.exp(w)), (1.0, np.expm1(w))):
        vexp(w, minus, False, out)
        assert np.max(np.abs(out - ref) / np.spacing(np.abs(ref))) <= 2.0


def test_exp_clamps_only_outside_its_range(vexp):
    """The clamped exp and expm1 hold arguments to [-708, 709] and are exact inside."""
    w = np.array([-1e300, -800.0, -708.0, 0.0, 709.0, 800.0])
    out = np.empty_like(w)
    vexp(w, 0.0, True, out)
    assert out[0] == out[1] == out[2] == pytest.approx(math.exp(-708), rel=1e-15)
    assert out[3] == 1.0
    assert out[4] == out[5] == pytest.approx(math.exp(709), rel=1e-15)
    vexp(w, 1.0, True, out)
    assert out[0] == -1.0
    assert out[3] == 0.0


# ----------------------------------------------------------------------------- block reduction
def _reference_sums(x, spec):
    """Power sums of the deviations, value by value in float64 from the final shift (numpy)."""
    h = np.maximum(spec.log_ref, np.stack([x.max(axis=0), (x * (1.0 / spec.T)).max(axis=0)]))
    sums = np.zeros((3, spec.T.size, 4))
    for q, y in ((P, x), (G, x * (1.0 / spec.T))):
        r = spec.log_ref[q]
        with np.errstate(invalid="ignore"):
            d = np.where(np.isneginf(r), np.exp(y - h[q]), np.exp(r - h[q]) * np.expm1(y - r))
        sums[q] = np.stack([np.sum(d**k, axis=0) for k in range(1, 5)], axis=1)
    d = x - spec.ref_logP
    sums[LOG_P] = np.stack([np.sum(d**k, axis=0) for k in range(1, 5)], axis=1)
    return h, sums


@pytest.mark.parametrize("n", [1, 15, 17, 1024, 3001])  # partial lanes, partial and several blocks
@pytest.mark.parametrize("fam", [LogNormal(1.0, 0.1), LogNormal(0.9, 3.0)], ids=["centred", "wide"])
def test_block_reduction_matches_value_by_value_sums(n, fam):
    """Block reduction gives the same shift, sums (to rounding) and tail as value-by-value sums."""
    grid = np.array([1, 3, 10, 30, 100, 300])
    rng = np.random.default_rng(n)
    x = grid * fam.mean_log + np.sqrt(grid * fam.var_log) * rng.standard_normal((n, grid.size))
    spec = AccumulatorSpec.from_family(fam, grid, tail=7)
    acc = accumulate_log_p(x, spec)
    h, sums = _reference_sums(x, spec)
    np.testing.assert_array_equal(acc.shift, h)
    np.testing.assert_allclose(acc.sums, sums, rtol=1e-12, atol=1e-13 * np.abs(sums).max())
    np.testing.assert_array_equal(acc.tail, -np.sort(-x, axis=0)[: min(7, n)].T)


def test_block_size():
    """Block sizes are whole batches of 4, lane multiples, and shrink as the grid grows."""
    assert block_size(4) == 1024
    assert block_size(1000) % LANES == 0
    assert block_size(10**6) == 4
    for nT in (1, 3, 200, 1000, 5000):
        assert block_size(nT) % 4 == 0  # whole batches of the token kernel


def test_dense_and_sparse_grids_read_the_same_paths():
    """Token paths do not depend on the grid.

    A dense grid's accumulators at the sparse grid's T equal the sparse run's (the same
    values; sums up to the block's rounding).
    """
    fam = LogNormal(1.0, 0.2)
    sparse = [1, 10, 100, 200]
    a = run_accumulators(fam, DENSE, 20_000, seed=4, workers=2, progress=False)
    b = run_accumulators(fam, sparse, 20_000, seed=4, workers=2, progress=False)
    idx = np.searchsorted(DENSE, sparse)
    np.testing.assert_array_equal(a.shift[:, idx], b.shift)
    np.testing.assert_array_equal(a.tail[idx], b.tail)
    np.testing.assert_allclose(a.sums[:, idx], b.sums, rtol=1e-11, atol=1e-12 * np.abs(b.sums).max())


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_dense_grid_bit_identical_for_any_workers(sampler):
    """On a dense grid both samplers give bit-identical accumulators for 1 and 2 workers."""
    fam = AR1(1.0, 0.1, rho=0.4)
    one = run_accumulators(
        fam, DENSE, 9000, seed=2, engine=Engine(workers=1, sampler=sampler), progress=False
    )
    two = run_accumulators(
        fam, DENSE, 9000, seed=2, engine=Engine(workers=2, sampler=sampler), progress=False
    )
    for u, v in ((one.shift, two.shift), (one.sums, two.sums), (one.tail, two.tail)):
        np.testing.assert_array_equal(u, v)


def test_dense_grid_estimates_follow_the_closed_form():
    """Var(log P_T) at every T of the dense grid within 5 standard errors of T var(log r)."""
    fam = Gamma(1.0, 0.2)
    n = 20_000
    acc = run_accumulators(fam, DENSE, n, seed=6, progress=False)
    from variance_lab.stats import central_moments

    _, m2, _, m4 = central_moments(acc.sums[LOG_P], n)
    z = (m2 - DENSE * fam.var_log) / np.sqrt((m4 - m2**2) / n)
    assert np.all(np.abs(z) < 5.0)


def test_degenerate_dense_grid_has_zero_variance():
    """With sigma^2 = 0 every variance on a dense grid is exactly zero."""
    df = estimate(run_accumulators(LogNormal(2.0, 0.0), DENSE, 5000, progress=False), LogNormal(2.0, 0.0))
    assert (df[df["statistic"].isin(["var_P", "var_G", "var_logP"])]["value"] == 0.0).all()


# ----------------------------------------------------------------------------- the tail sample
@pytest.mark.parametrize("kind", ["normal", "ties", "sorted", "reversed"])
def test_compact_keeps_the_largest(kind):
    """Compacting a tail buffer keeps its ``keep`` largest values and permutes the rest."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 400))
        keep = int(rng.integers(1, n + 1))
        x = {
            "normal": rng.standard_normal(n),
            "ties": rng.integers(0, 3, n).astype(float),
            "sorted": np.sort(rng.standard_normal(n)),
            "reversed": -np.sort(rng.standard_normal(n)),
        }[kind]
        buf = np.full((2, n + 3), np.nan)
        buf[1, :n] = x
        least = _compact(buf, 1, n, keep)
        top = np.sort(x)[::-1][:keep]
        np.testing.assert_array_equal(np.sort(buf[1, :keep])[::-1], top)
        assert least == top[-1]
        np.testing.assert_array_equal(np.sort(buf[1, :n]), np.sort(x))  # a permutation
        assert np.isnan(buf[0]).all()
        assert np.isnan(buf[1, n:]).all()  # nothing else touched


def test_merged_tail_is_the_largest_of_all_paths():
    """Chunks keep only their share of the tail; merged, it is the exact top of all n paths."""
    fam, grid, n = TwoPoint(1.0, 0.3, q=0.3), np.array([1, 5, 60]), 50_000  # many ties
    plan, tasks = prepare(fam, grid, n, seed=5)
    assert all(t.tail_keep < min(plan.tail, t.n_paths) for t in tasks)
    acc = merge_all(run_chunk(t) for t in tasks)
    assert acc.tail_complete().all()
    x = np.concatenate(
        [draw_log_p(t.code, t.params, grid, chunk_generator(5, t.index), t.n_paths) for t in tasks]
    )
    np.testing.assert_array_equal(acc.tail, -np.sort(-x, axis=0)[: plan.tail].T)


@pytest.mark.parametrize("n", [100, 5000, 10**5, 10**6, 10**8, 10**10])
def test_chunk_tail_keep_bound(n):
    """P(a chunk holds more than k of the M largest) < 1e-30: hypergeometric tail, exactly."""
    plan = make_plan(n)
    for i in sorted({0, plan.n_chunks - 1}):
        c, M = plan.size(i), plan.tail
        k = chunk_tail_keep(n, c, M)
        assert 1 <= k <= min(M, c)
        assert k == plan.tail_keep(i)
        if k < min(M, c):
            assert k >= M * c / n
            assert stats.hypergeom(n, M, c).logsf(k) < -TAIL_LOG_RISK
    assert tail_size(n) == plan.tail


def test_incomplete_tail_is_detected_not_used():
    """A merged tail that reaches below a part's floor is reported incomplete and refused."""
    fam = LogNormal(1.0, 0.1)
    spec = AccumulatorSpec.from_family(fam, [1, 2], tail=10)
    x = np.random.default_rng(0).standard_normal((40, 2))
    good = accumulate_log_p(x, spec)
    assert good.tail_complete().all()
    cut = Accumulator(spec, 40, good.shift, good.sums, good.tail[:, :4], tail_floor=good.tail[:, 3].copy())
    other = accumulate_log_p(x[:5] - 10.0, spec)  # 5 small values: the merged tail reaches below the floor
    merged = merge_all([cut, other])
    assert merged.tail.shape[1] == 9
    assert not merged.tail_complete().any()
    with pytest.raises(ValueError, match="tail sample of log P_T is incomplete at T = \\[1, 2\\]"):
        estimate(merged, fam)
    lucky = merge_all([cut, accumulate_log_p(x[:6] + 10.0, spec)])  # six above the floor: complete
    assert lucky.tail_complete().all()


def test_tail_is_finite_and_ordered_on_a_dense_grid():
    """On a dense grid the tail sample is complete, finite and in descending order."""
    acc = run_accumulators(LogNormal(1.0, 0.5), DENSE, 30_000, seed=1, progress=False)
    assert acc.tail.shape == (DENSE.size, tail_size(30_000))
    assert np.all(np.diff(acc.tail, axis=1) <= 0)
    assert np.all(np.isfinite(acc.tail))
    assert acc.tail_complete().all()


@pytest.mark.slow
def test_benchmark_suite_runs_in_quick_mode(tmp_path):
    """The suite's smoke run (about a minute): every section runs and reports its rows."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench.json"
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--json", str(out)], check=True, cwd=root)
    rows = json.loads(out.read_text())["rows"]
    assert {r["section"] for r in rows} == {
        "throughput",
        "scaling",
        "aggregate",
        "dense",
        "memory",
        "table",
        "theory",
        "sweep",
    }
    assert all(r["value"] > 0 for r in rows if r["section"] != "memory")


@pytest.mark.parametrize("ties", [False, True])
def test_merge_into_gives_the_bits_of_merge(ties):
    """The executors merge in place: the same bits as merge, tails of every width, ties included."""
    from variance_lab.simulate import merge
    from variance_lab.simulate.accumulators import _copy, merge_into

    spec = AccumulatorSpec.from_family(LogNormal(1.0, 0.1), [1, 3, 10], tail=25)
    rng = np.random.default_rng(3)
    parts = []
    for _ in range(12):
        x = rng.standard_normal((int(rng.integers(1, 40)), 3))
        parts.append(accumulate_log_p(np.round(x) if ties else x, spec))
    a, b = _copy(parts[0]), _copy(parts[0])
    for part in parts[1:]:
        a = merge(a, part)
        b = merge_into(b, part)
        for u, v in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
            np.testing.assert_array_equal(u, v)
        assert a.count == b.count


def test_finish_tails_takes_each_rows_largest_in_descending_order():
    """finish_tails: per row, the ``keep`` largest of the ``tlen`` values used, descending."""
    rng = np.random.default_rng(3)
    keep, cap = 5, 12
    tlen = np.array([12, 5, 9, 3])  # the last row holds fewer than keep (only -inf values do that)
    tbuf = rng.standard_normal((4, cap))
    used = [tbuf[j, : tlen[j]].copy() for j in range(4)]
    out = np.empty((4, keep))
    finish_tails(tbuf, tlen, keep, out)
    for j in range(3):
        np.testing.assert_array_equal(out[j], np.sort(used[j])[::-1][:keep])
    np.testing.assert_array_equal(out[3], np.concatenate([np.sort(used[3])[::-1], [-np.inf, -np.inf]]))
