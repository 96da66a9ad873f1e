"""Accumulators: merge equals all-at-once, log space stays finite, centring keeps the digits."""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from variance_lab import LogNormal, TwoPoint
from variance_lab.simulate import AccumulatorSpec, accumulate_log_p, merge, merge_all, run_accumulators
from variance_lab.simulate.accumulators import LOG_P, G, P
from variance_lab.stats import central_moments


def _spec(T=(1, 10, 100), tail=40, fam=None):
    return AccumulatorSpec.from_family(fam or LogNormal(1.0, 0.1), list(T), tail)


def _log_p(n, T, seed=0, fam=None):
    fam = fam or LogNormal(1.0, 0.1)
    rng = np.random.default_rng(seed)
    steps = fam.mean_log + np.sqrt(fam.var_log) * rng.standard_normal((n, max(T)))
    return np.cumsum(steps, axis=1)[:, np.array(T) - 1]


def _assert_close(a, b):
    assert a.count == b.count
    np.testing.assert_array_equal(a.shift, b.shift)
    np.testing.assert_allclose(a.sums, b.sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a.tail, b.tail)


@pytest.mark.parametrize("cuts", [[500], [1, 2, 3], [100, 400, 401, 999], list(range(50, 1000, 50))])
def test_merge_equals_all_at_once(cuts):
    """Accumulators merged from any split of the draws equal one accumulated all at once."""
    T = (1, 10, 100)
    x, spec = _log_p(1000, T), _spec(T)
    whole = accumulate_log_p(x, spec)
    parts = [accumulate_log_p(p, spec) for p in np.split(x, cuts)]
    _assert_close(merge_all(parts), whole)


def _rounding_bound(x, acc):
    r"""Return what merging promises: per power sum, the rounding of two summations of the same terms.

    Every term :math:`d_i^k` of a power sum (:math:`d_i = e^{y_i - h} - e^{\rho - h}` for
    :math:`P_T` and :math:`G_T`, :math:`y_i - T\mu_y` for :math:`\log P_T`) enters both the
    all-at-once sum and the merged one; summed in two orders (and rescaled by
    :math:`e^{k(h_c - h)}`, a few roundings per term), each is within
    :math:`\gamma_m \sum_i |d_i|^k` of the exact sum, :math:`\gamma_m \approx m\varepsilon`,
    :math:`m` the operations a term goes through (at most ``n`` additions and 16 more:
    lanes, the pairwise tree, the power, the rescaling). Shape of ``acc.sums``.
    """
    n = x.shape[0]
    T = acc.T.astype(float)
    bound = np.empty_like(acc.sums)
    for q, y in ((P, x), (G, x * (1.0 / T))):
        with np.errstate(over="ignore"):
            centre = np.where(
                np.isneginf(acc.spec.log_ref[q]), 0.0, np.exp(acc.spec.log_ref[q] - acc.shift[q])
            )
            d = np.abs(np.exp(y - acc.shift[q]) - centre)
        for k in range(4):
            bound[q, :, k] = (d ** (k + 1)).sum(axis=0)
    dev = np.abs(x - acc.spec.ref_logP)
    for k in range(4):
        bound[LOG_P, :, k] = (dev ** (k + 1)).sum(axis=0)
    return 2 * (n + 16) * np.finfo(float).eps * bound


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    sigma2=st.sampled_from([0.01, 0.1, 2.0]),  # 2.0: log P_T widely spread at T = 100, no centring
    T=st.sampled_from([(1,), (1, 10, 100), (3, 4, 5, 6, 7)]),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_merge_of_chunks_cut_anywhere_equals_all_at_once(n, sigma2, T, seed, data):
    """Cut the same paths into chunks any way and merge them in order.

    Empty chunks and single paths included: the same count, shifts and tail bits as all at
    once, and power sums within the rounding of two summations of the same terms.
    """
    fam = LogNormal(1.0, sigma2)
    x, spec = (
        _log_p(n, T, seed=seed, fam=fam),
        _spec(T, tail=data.draw(st.integers(1, 50), label="tail"), fam=fam),
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=12), label="cuts"))
    whole = accumulate_log_p(x, spec)
    merged = merge_all(accumulate_log_p(p, spec) for p in np.split(x, cuts))
    assert merged.count == whole.count == n
    np.testing.assert_array_equal(merged.shift, whole.shift)
    np.testing.assert_array_equal(merged.tail, whole.tail)
    assert merged.tail_complete().all()
    err = np.abs(merged.sums - whole.sums)
    bound = _rounding_bound(x, whole)
    assert (err <= bound).all(), (err - bound).max()


def test_merge_is_deterministic_and_order_sensitive_only_in_rounding():
    """Merging is bit-identical when repeated and equal to rounding in reverse order."""
    T = (1, 10, 100)
    spec = _spec(T)
    parts = [accumulate_log_p(p, spec) for p in np.split(_log_p(900, T, seed=4), 3)]
    a, b = merge_all(parts), merge_all(parts)
    for u, v in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
        np.testing.assert_array_equal(u, v)
    _assert_close(merge_all(parts[::-1]), a)  # another order: the same to rounding


def test_merge_with_empty_and_incompatible():
    """An empty accumulator is a merge identity; incompatible specs and no parts raise."""
    spec = _spec()
    acc = accumulate_log_p(_log_p(10, (1, 10, 100)), spec)
    _assert_close(merge(spec.empty(), acc), acc)
    _assert_close(merge(acc, spec.empty()), acc)
    with pytest.raises(ValueError, match="cannot merge"):
        merge(acc, _spec(tail=41).empty())
    with pytest.raises(ValueError, match="at least one"):
        merge_all([])


def test_tail_is_the_largest_values():
    """The merged tail sample holds exactly the largest values per T, in descending order."""
    T = (1, 10, 100)
    x, spec = _log_p(1000, T, seed=2), _spec(T, tail=37)
    acc = merge_all(accumulate_log_p(p, spec) for p in np.split(x, [10, 600]))
    np.testing.assert_array_equal(acc.tail, -np.sort(-x, axis=0)[:37].T)


def _moments(acc, q, T_index):
    """(mean, unbiased variance) of exp(quantity q) from an accumulator, in log10."""
    n = acc.count
    c = acc.centre()[q, T_index]
    d, m2, _, _ = central_moments(acc.sums[q, T_index], n)
    h = acc.shift[q, T_index]
    return (h + math.log(c + d)) / math.log(10), (2 * h + math.log(m2 * n / (n - 1))) / math.log(10)


def test_values_spanning_thousands_of_orders_of_magnitude():
    """Values of log P from -3000 to +3000 (P from 1e-1303 to 1e1303) give exact log10 moments."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-3000, 3000, size=(400, 1))
    spec = AccumulatorSpec(
        T=np.array([1]), log_ref=np.array([[-np.inf], [-np.inf]]), ref_logP=np.zeros(1), tail=10
    )
    acc = merge_all(accumulate_log_p(p, spec) for p in np.split(x, 4))
    lmean, lvar = _moments(acc, P, 0)
    with mpmath.workdps(50):
        w = [mpmath.exp(mpmath.mpf(v)) for v in x[:, 0]]
        mean = mpmath.fsum(w) / len(w)
        var = mpmath.fsum((v - mean) ** 2 for v in w) / (len(w) - 1)
        assert lmean == pytest.approx(float(mpmath.log10(mean)), rel=1e-12)
        assert lvar == pytest.approx(float(mpmath.log10(var)), rel=1e-12)


def test_centring_keeps_tiny_variance_of_G():
    """Var(G) ~ 1e-14 around 0.95: raw power sums would lose it all; centred sums keep it."""
    rng = np.random.default_rng(3)
    T = 1000
    g = 0.95 * np.exp(1e-7 * rng.standard_normal(5000))
    fam = LogNormal(0.95 * math.exp(0.5e-14), 0.95**2 * math.expm1(1e-14) * math.exp(1e-14))
    spec = AccumulatorSpec.from_family(fam, [T], tail=10)
    acc = accumulate_log_p((T * np.log(g))[:, None], spec)
    lmean, lvar = _moments(acc, G, 0)
    with mpmath.workdps(60):
        gm = [mpmath.mpf(v) for v in g]  # exact float64 values
        mean = mpmath.fsum(gm) / len(gm)
        var = mpmath.fsum((v - mean) ** 2 for v in gm) / (len(gm) - 1)
    assert 10**lvar == pytest.approx(float(var), rel=1e-6)
    assert 10**lmean == pytest.approx(float(mean), rel=1e-14)
    raw = np.mean(g**2) - np.mean(g) ** 2  # what uncentred sums give
    assert abs(raw / float(var) - 1) > 1e-2


def test_log_space_finite_at_T_1e5():
    """At T = 1e5 shift, sums, tail and log moments stay finite, and the mean of log P is right."""
    fam = LogNormal(1.0, 0.1)
    acc = run_accumulators(fam, [1, 100_000], 64, seed=1, workers=1, progress=False)
    assert np.all(np.isfinite(acc.shift))
    assert np.all(np.isfinite(acc.sums))
    assert np.all(np.isfinite(acc.tail))
    lmean, lvar = _moments(acc, P, 1)
    assert math.isfinite(lmean)
    assert math.isfinite(lvar)
    assert lmean < -1000  # a typical P_T at T = 1e5: exp(-4775), far below float64
    d, _, _, _ = central_moments(acc.sums[LOG_P, 1], acc.count)
    assert abs(acc.spec.ref_logP[1] + d - 1e5 * fam.mean_log) < 5 * math.sqrt(1e5 * fam.var_log / 64)


def test_two_point_log_p_is_exact_and_ties_in_tail():
    """Two-point log P_T values in the tail are exactly k log a + (T - k) log b."""
    fam = TwoPoint(1.0, 0.1)
    acc = run_accumulators(fam, [3], 2000, seed=0, workers=1, progress=False)
    _, (_, la, lb) = fam.sampler_params()
    values = {k * la + (3 - k) * lb for k in range(4)}
    assert set(np.unique(acc.tail)) <= values


def test_merge_into_grows_the_tail_in_one_array_without_a_second_copy():
    """A growing running tail lives in one ``nT x M`` array: same bits as ``merge``, peak near one tail.

    Before, every growing merge made a new tail while the old one was alive: twice the
    final tail at the end of the growth (48 MB at T = 1..1000, n = 10^6).
    """
    import tracemalloc

    from variance_lab.simulate.accumulators import _copy, merge_into

    T = np.arange(1, 201)
    spec = AccumulatorSpec.from_family(LogNormal(1.0, 0.1), T, tail=1001)
    rng = np.random.default_rng(11)
    parts = [accumulate_log_p(rng.standard_normal((90, T.size)), spec) for _ in range(14)]
    ref = _copy(parts[0])
    for part in parts[1:]:
        ref = merge(ref, part)
    run = _copy(parts[0])
    tail_bytes = T.size * spec.tail * 8
    tracemalloc.start()
    try:
        for part in parts[1:]:
            run = merge_into(run, part)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.tail.shape == (T.size, spec.tail)
    assert run.tail.tobytes() == ref.tail.tobytes()
    assert run.sums.tobytes() == ref.sums.tobytes()
    assert peak < 1.25 * tail_bytes  # the old growth held an old and a new tail: about 2 x
