r"""M2PO's second-moment masks (``m2po:TAU[:B]``): the batch rule, the large-batch limit, Monte Carlo, data.

The batch rule is checked against a line-by-line transcription of AReaL's ``_get_m2po_loss_mask``
(suffix means of the descending sort, the first one strictly below tau); the large-batch cut
against ``mpmath.findroot`` of :math:`\int_{|y| \le s} (y^2 - \tau) f(y)\,dy = 0`, the
integral by ``mpmath.quad`` at 40 digits, never the closed tails under test.
"""

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate, optimize, stats

from variance_lab import corrections as co
from variance_lab.families import get_family


# ------------------------------------------------------------------------------- the batch rule
def _areal_mask(m2, tau):
    """AReaL's _get_m2po_loss_mask on plain Python floats: True = kept (its loss_mask)."""
    order = sorted(range(len(m2)), key=lambda i: -m2[i])
    sorted_m2 = [m2[i] for i in order]
    n = len(sorted_m2)
    suffix = [sum(sorted_m2[i:]) / (n - i) for i in range(n)]
    below = [i for i in range(n) if suffix[i] < tau]
    num_to_mask = below[0] if below else n - 1
    keep = [True] * n
    for i in range(num_to_mask):
        keep[order[i]] = False
    return keep


@pytest.mark.parametrize("seed", range(8))
def test_batch_mask_is_areals_rule(seed):
    """batch_mask masks exactly the tokens AReaL's rule masks (distinct values, random batches)."""
    rng = np.random.default_rng(seed)
    y = rng.standard_t(3, size=int(rng.integers(1, 60))) * rng.uniform(0.05, 0.5)
    tau = float(rng.uniform(0.001, 0.05))
    kept = _areal_mask([float(v * v) for v in y], tau)
    np.testing.assert_array_equal(co.batch_mask(y, tau), ~np.array(kept))


def test_batch_mask_edges_and_rows():
    """Nothing masked below tau; all but one when even the smallest is above; rows are separate batches."""
    assert not co.batch_mask(np.array([0.01, -0.02, 0.03]), 0.04).any()
    assert co.batch_mask(np.array([1.0, -2.0, 3.0]), 0.04).tolist() == [False, True, True]
    y = np.array([[0.1, 0.5, 0.01, 0.02], [0.0, 0.0, 0.0, 0.9]])
    rows = co.batch_mask(y, 0.01)
    np.testing.assert_array_equal(rows[0], co.batch_mask(y[0], 0.01))
    np.testing.assert_array_equal(rows[1], [False, False, False, True])


def test_batch_masks_cut_batches_of_sequences():
    """batch_masks pools B consecutive sequences (the last batch smaller) and masks each pool."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 9, size=11)
    off = np.concatenate([[0], np.cumsum(lengths)])
    y = rng.normal(0, 0.3, size=off[-1])
    got = co.batch_masks(y, off, 0.02, 4)
    for start in range(0, 11, 4):
        a, b = off[start], off[min(start + 4, 11)]
        np.testing.assert_array_equal(got[a:b], co.batch_mask(y[a:b], 0.02))


# ------------------------------------------------------------------------------- the large-batch limit
def _mp_cut(density, tau, second):
    """Return the root s > sqrt(tau) of int_{-s}^{s} (y^2 - tau) f(y) dy = 0, and P(|y| > s), at 40 digits."""
    with mp.workdps(40):
        tau = mp.mpf(tau)

        def g(s):
            return mp.quad(lambda y: (y * y - tau) * density(y), [-s, 0, s])

        hi = mp.sqrt(tau)
        while g(hi) < 0:
            hi *= 2
        s = mp.findroot(g, (mp.sqrt(tau) * (1 + mp.mpf(10) ** -30), hi), solver="anderson")
        kept = mp.quad(density, [-s, 0, s])
        return s, 1 - kept


def _normal_density(m, v):
    return lambda y: mp.npdf(y, m, mp.sqrt(v))


@pytest.mark.parametrize(
    ("mu", "s2", "tau"), [(1.0, 0.1, 0.04), (1.0, 0.1, 0.09), (1.1, 0.5, 0.2), (0.95, 0.02, 0.001)]
)
def test_lognormal_cut_and_fraction_against_mpmath(mu, s2, tau):
    """The cut and the masked fraction match mpmath's root to 1e-9; theory's frac_modified is it."""
    fam = get_family("lognormal", mu, s2)
    with mp.workdps(40):
        v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
        m = mp.log(mu) - v / 2
    s_ref, frac_ref = _mp_cut(_normal_density(m, v), tau, None)
    assert co.m2po_cut(fam, tau) == pytest.approx(float(s_ref), rel=1e-12)
    row = co.theory(fam, [1, 100], f"m2po:{tau}").iloc[1]
    assert row.frac_modified == pytest.approx(float(frac_ref), rel=1e-9)
    with mp.workdps(40):  # the bias it leaves: E[r 1{|log r| <= s}] - E[r]
        kept = mp.quad(lambda y: mp.exp(y) * mp.npdf(y, m, mp.sqrt(v)), [-s_ref, 0, s_ref])
    assert row.bias == pytest.approx(float(kept) - mu, rel=1e-9)
    assert row.frac_seq_any == pytest.approx(1 - (1 - float(frac_ref)) ** 100, rel=1e-9)


def test_no_mask_when_the_second_moment_is_below_tau():
    """E[(log r)^2] <= tau: the cut is infinite and nothing is masked, so the bias is 0."""
    fam = get_family("lognormal", 1.0, 0.01)  # E[y^2] ~ 0.01
    assert co.m2po_cut(fam, 0.04) == math.inf
    row = co.theory(fam, [10], "m2po:0.04").iloc[0]
    assert row.frac_modified == 0.0
    assert row.bias == 0.0


def test_mixture_cut_against_mpmath():
    """A lognormal mixture's cut solves the same equation under the mixture density (1e-9)."""
    comps = [(0.9, 0.0, 0.01), (0.1, -0.2, 0.5)]
    fam = get_family("lognormal-mixture", components=",".join(f"{w}:{m}:{v}" for w, m, v in comps))

    def dens(y):
        return mp.fsum(w * mp.npdf(y, m, mp.sqrt(v)) for w, m, v in comps)

    s_ref, frac_ref = _mp_cut(dens, 0.02, None)
    assert co.m2po_cut(fam, 0.02) == pytest.approx(float(s_ref), rel=1e-10)
    row = co.theory(fam, [10], "m2po:0.02").iloc[0]
    assert row.frac_modified == pytest.approx(float(frac_ref), rel=1e-9)


@pytest.mark.slow
def test_random_scale_cut_against_scipy():
    """Random-scale ratios: the cut of the marginal law, against scipy quadrature in (v, y) and brentq."""
    fam = get_family("random-scale", 1.0, 0.1, alpha=2.0)
    a, th, lam, tau = fam.alpha, fam.theta, 0.0, 0.04

    def inner(s, v):
        m, sd = lam - v / 2, math.sqrt(v)
        return integrate.quad(
            lambda y: (y * y - tau) * stats.norm.pdf(y, m, sd), -s, s, points=[m], epsabs=1e-14, epsrel=1e-10
        )[0]

    def g(s):  # the law of v: Gamma(alpha, theta), cut where less than 1e-16 of it is left
        top = stats.gamma.isf(1e-16, a, scale=th)
        return integrate.quad(
            lambda v: inner(s, v) * stats.gamma.pdf(v, a, scale=th),
            0,
            top,
            epsabs=1e-14,
            epsrel=1e-10,
            limit=200,
        )[0]

    s_ref = optimize.brentq(g, math.sqrt(tau) * 1.000001, 5.0, xtol=1e-13)
    assert co.m2po_cut(fam, tau) == pytest.approx(s_ref, rel=1e-6)


def test_find_T_uses_the_large_batch_mask():
    """find_T of m2po: the first T with 1 - (1 - p)^T >= threshold, p its large-batch fraction."""
    fam = get_family("lognormal", 1.0, 0.1)
    p = co.theory(fam, [1], "m2po:0.08").frac_modified.iloc[0]
    T = co.find_T(fam, "m2po:0.08", 0.9)
    assert 1 - (1 - p) ** (T - 1) < 0.9 <= 1 - (1 - p) ** T


def test_unresolved_m2po_has_no_band():
    """An m2po correction's band needs its ratio law; resolve_cut sets it."""
    c = co.parse("m2po:0.04")
    assert c.params == (0.04, 256.0)
    assert c.batch == 256
    with pytest.raises(ValueError, match="resolve"):
        c.log_bounds()
    r = co.resolve_cut(c, get_family("lognormal", 1.0, 0.1))
    assert r.log_bounds() == (-r.cut, r.cut)
    with pytest.raises(ValueError, match="'gamma'"):
        co.resolve_cut(c, get_family("gamma", 1.0, 0.1))


@pytest.mark.parametrize(
    "spec", ["m2po:0", "m2po:-1", "m2po:0.04:0", "m2po:0.04:2.5", "m2po:0.04:8:1", "ctpo:0:1", "ctpo"]
)
def test_bad_specs_name_themselves(spec):
    """A bad m2po or ctpo spec raises ValueError naming it."""
    with pytest.raises(ValueError, match=repr(spec)):
        co.parse(spec)


# ------------------------------------------------------------------------------- Monte Carlo
def test_monte_carlo_large_batch_within_4_se_of_the_limit():
    """With batches of 20,000 tokens the Monte Carlo fraction and mean lie within 4 SE of the limit."""
    fam = get_family("lognormal", 1.0, 0.1)
    th = co.theory(fam, [100], "m2po:0.04:200,m2po:0.08:200")
    mc = co.simulate_corrections(fam, [100], "m2po:0.04:200,m2po:0.08:200", 20_000, seed=2)
    z = stats.norm.ppf(0.975)
    for t, m in zip(th.itertuples(index=False), mc.itertuples(index=False), strict=True):
        se_f = (m.mc_frac_modified_hi - m.mc_frac_modified_lo) / (2 * z)
        se_w = (m.mc_mean_w_hi - m.mc_mean_w_lo) / (2 * z)
        assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se_f, t.correction
        assert abs(m.mc_mean_w - t.mean_w) <= 4 * se_w, t.correction


def test_small_batches_mask_more_than_the_limit():
    """A batch of 16 tokens masks significantly more than the large-batch fraction; one token, nothing."""
    fam = get_family("lognormal", 1.0, 0.1)
    limit = co.theory(fam, [1], "m2po:0.04").frac_modified.iloc[0]
    mc = co.simulate_corrections(fam, [1], "m2po:0.04:16,m2po:0.04:1", 32_000, seed=4)
    assert mc.mc_frac_modified_lo.iloc[0] > limit
    assert mc.mc_frac_modified.iloc[1] == 0.0  # a batch of one keeps its token


def test_monte_carlo_runs_for_every_family(every_family):
    """Every family simulates m2po with batch intervals that hold the estimate."""
    fam = every_family
    mc = co.simulate_corrections(fam, [10], "m2po:0.03:50", 2000, seed=1).iloc[0]
    ulp = (
        1e-12  # a constant per-batch fraction (two-point: all but one token masked) has a zero-width interval
    )
    assert mc.mc_frac_modified_lo - ulp <= mc.mc_frac_modified <= mc.mc_frac_modified_hi + ulp
    assert mc.mc_mean_w_lo - ulp <= mc.mc_mean_w <= mc.mc_mean_w_hi + ulp
    assert 0 < mc.mc_frac_modified < 1


def test_monte_carlo_needs_two_whole_batches():
    """Fewer sequences than two batches is refused, naming n and the batch."""
    with pytest.raises(ValueError, match="n = 300 is below two m2po batches of 256"):
        co.simulate_corrections(get_family("lognormal", 1.0, 0.1), [10], "m2po:0.04", 300)
    mc = co.simulate_corrections(get_family("lognormal", 1.0, 0.1), [10], "m2po:0.04", 512).iloc[0]
    assert mc.mc_frac_modified_lo < mc.mc_frac_modified < mc.mc_frac_modified_hi  # two batches: an interval


def test_random_scale_quadrature_within_4_se_of_monte_carlo():
    """Random-scale ratios: the quadrature of the large-batch limit against Monte Carlo with big batches."""
    fam = get_family("random-scale", 1.0, 0.1, alpha=2.0)
    t = co.theory(fam, [100], "m2po:0.04:200").iloc[0]
    m = co.simulate_corrections(fam, [100], "m2po:0.04:200", 20_000, seed=8).iloc[0]
    se = (m.mc_frac_modified_hi - m.mc_frac_modified_lo) / (2 * stats.norm.ppf(0.975))
    assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se


def _coverage(seeds):
    fam = get_family("lognormal", 1.0, 0.1)
    exact = co.theory(fam, [100], "m2po:0.04").frac_modified.iloc[0]
    hits = 0
    for s in seeds:
        m = co.simulate_corrections(fam, [100], "m2po:0.04:200", 20_000, seed=s).iloc[0]
        hits += m.mc_frac_modified_lo <= exact <= m.mc_frac_modified_hi
    return hits


def test_interval_coverage_small(assert_coverage):
    """Batch intervals of the masked fraction cover the limit at 95 % (binomial test, 30 seeds)."""
    assert_coverage([_coverage(range(30))], 30)


@pytest.mark.slow
def test_interval_coverage_full(assert_coverage):
    """Batch intervals of the masked fraction cover the limit at 95 % (binomial test, 400 seeds)."""
    assert_coverage([_coverage(range(1000, 1400))], 400)


# ------------------------------------------------------------------------------- data
def test_evaluate_masks_over_batches_of_the_file():
    """On data the mask is computed over batches of B sequences in file order, then bucketed."""
    rng = np.random.default_rng(9)
    lengths = rng.integers(1, 30, size=100)
    off = np.concatenate([[0], np.cumsum(lengths)])
    log_r = rng.normal(-0.01, 0.25, size=off[-1])
    df = co.evaluate(log_r, off, "m2po:0.03:16", buckets=[(1, 14), (15, 29)])
    masked = np.zeros(log_r.size, dtype=bool)
    for start in range(0, 100, 16):
        a, b = off[start], off[min(start + 16, 100)]
        y2 = [float(v * v) for v in log_r[a:b]]
        masked[a:b] = ~np.array(_areal_mask(y2, 0.03))
    for row, (lo, hi) in zip(df.itertuples(index=False), [(1, 14), (15, 29)], strict=True):
        sel = np.repeat((lengths >= lo) & (lengths <= hi), lengths)
        assert row.frac_modified == pytest.approx(masked[sel].mean(), rel=1e-12)
        assert row.mean_w == pytest.approx(np.where(masked, 0, np.exp(log_r))[sel].mean(), rel=1e-12)
