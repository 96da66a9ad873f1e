r"""CTPO's cumulative prefix ratios (``ctpo:EL:EH``): closed forms, positions, variances, Monte Carlo, data.

The references never call the code under test: each position's clipped probability and the
moments of its masked prefix weight are mpmath integrals of the normal density of
:math:`L_t \sim N(tm, tv)` at 40 digits; the variances of the mean weights are plain double
sums of :math:`\operatorname{Cov}(P_s, P_t)` written from :math:`E[P_s P_t]`.
"""

import itertools
import math

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from variance_lab import corrections as co
from variance_lab.families import get_family

SPECS = ["ctpo:0.5:0.5", "ctpo:0.2:0.6", "ctpo:1"]


def _lognormal_mv(mu, s2):
    v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
    return mp.log(mu) - v / 2, v


def _reference(el, eh, mu, s2, T, moments=True):
    """(frac_modified, E[w], Var(w)) per token over positions 1..T, at 40 digits."""
    with mp.workdps(40):
        m, v = _lognormal_mv(mu, s2)
        el, eh = mp.mpf(el), mp.mpf(eh)
        frac = e1 = e2 = mp.mpf(0)
        for t in range(1, T + 1):
            M, S = t * m, mp.sqrt(t * v)
            a, b = -el * mp.sqrt(t), eh * mp.sqrt(t)
            frac += mp.ncdf(a, M, S) + mp.ncdf(2 * M - b, M, S)  # the upper tail, reflected
            if moments:
                lo, hi = max(a, M - 40 * S), min(b, M + 40 * S)
                if lo < hi:
                    e1 += mp.quad(
                        lambda x, M=M, S=S: mp.exp(x) * mp.npdf(x, M, S),
                        [lo, M, hi] if lo < M < hi else [lo, hi],
                    )
                    e2 += mp.quad(
                        lambda x, M=M, S=S: mp.exp(2 * x) * mp.npdf(x, M, S),
                        [lo, M, hi] if lo < M < hi else [lo, hi],
                    )
        frac, e1, e2 = frac / T, e1 / T, e2 / T
        return float(frac), float(e1), float(e2 - e1 * e1)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(
    ("mu", "s2", "T"),
    [(1.0, 0.1, 1), (1.0, 0.1, 30), pytest.param(1.05, 0.02, 50, marks=pytest.mark.slow), (0.9, 0.3, 20)],
)
def test_theory_against_mpmath(spec, mu, s2, T):
    """frac_modified, mean and variance of the masked prefix weights match mpmath to 1e-9."""
    c = co.parse(spec)
    row = co.theory(get_family("lognormal", mu, s2), [T], spec).iloc[0]
    frac, mean, var = _reference(*c.params, mu, s2, T)
    assert row.frac_modified == pytest.approx(frac, rel=1e-9)
    assert row.mean_w == pytest.approx(mean, rel=1e-9)
    assert row.var_w == pytest.approx(var, rel=1e-9)
    assert row.bias == pytest.approx(
        mean - float(np.mean([mu**t for t in range(1, T + 1)])), rel=1e-9, abs=1e-12
    )
    assert math.isnan(row.frac_seq_any)  # a boundary crossing of the walk: no closed form


@pytest.mark.parametrize("T", [100, 1000])
def test_frac_modified_against_mpmath_at_long_lengths(T):
    """The clipped fraction averaged over 1000 positions matches the 40-digit sum to 1e-9."""
    fam = get_family("lognormal", 1.0, 0.1)
    df = co.theory(fam, [T], "ctpo:0.5:0.5,ctpo:0.2:0.6")
    for row in df.itertuples(index=False):
        c = co.parse(row.correction)
        assert row.frac_modified == pytest.approx(
            _reference(*c.params, 1.0, 0.1, T, moments=False)[0], rel=1e-9
        )


def test_on_policy_symmetric_band_has_bias_minus_frac():
    """On-policy with a symmetric band, E[P_t 1{in}] = P(in) (the tilted law is the reflected one)."""
    row = co.theory(get_family("lognormal", 1.0, 0.1), [1], "ctpo:0.5:0.5").iloc[0]
    assert row.bias == pytest.approx(-row.frac_modified, rel=1e-12)


def test_positions_frame_against_mpmath_and_the_rows():
    """ctpo_positions gives each position's tails and moments; their average is the theory row."""
    fam = get_family("lognormal", 1.05, 0.02)
    pos = co.ctpo_positions(fam, "ctpo:0.2:0.6", 40)
    assert list(pos.columns) == list(co.POSITION_COLUMNS)
    with mp.workdps(40):
        m, v = _lognormal_mv(1.05, 0.02)
        t = 37
        M, S = t * m, mp.sqrt(t * v)
        low = mp.ncdf(-0.2 * mp.sqrt(t), M, S)
        high = 1 - mp.ncdf(0.6 * mp.sqrt(t), M, S)
    r = pos[pos.t == 37].iloc[0]
    assert r.frac_low == pytest.approx(float(low), rel=1e-9)
    assert r.frac_high == pytest.approx(float(high), rel=1e-9)
    assert r.mean_prefix == pytest.approx(1.05**37, rel=1e-12)
    row = co.theory(fam, [40], "ctpo:0.2:0.6").iloc[0]
    assert pos.frac_clipped.mean() == pytest.approx(row.frac_modified, rel=1e-12)
    assert pos.mean_w.mean() == pytest.approx(row.mean_w, rel=1e-12)
    with pytest.raises(ValueError, match="'gamma'"):
        co.ctpo_positions(get_family("gamma", 1.0, 0.1), "ctpo:0.5:0.5", 10)


def test_binding_position_is_where_the_drift_reaches_the_bound():
    """find_T of ctpo: the first t with p_t >= threshold; on-policy near (EL / |m|)^2, never when m = 0."""
    fam = get_family("lognormal", 1.0, 0.1)
    m = fam.mean_log
    T = co.find_T(fam, "ctpo:0.5:0.5", 0.5)
    p = co.clip_probability(co.parse("ctpo:0.5:0.5"), m, fam.var_log, [T - 1, T])
    assert p[0] < 0.5 <= p[1]
    assert abs(T - (0.5 / m) ** 2) < 2  # the lower tail alone is 1/2 at sqrt(t)|m| = EL
    zero_drift = get_family("lognormal", math.exp(0.05), math.exp(0.1) * math.expm1(0.1))  # m = 0, v = 0.1
    assert zero_drift.mean_log == pytest.approx(0.0, abs=1e-12)
    p0 = co.clip_probability(co.parse("ctpo:0.5:0.5"), 0.0, zero_drift.var_log, [1, 10, 1000])
    np.testing.assert_allclose(p0, 2 * stats.norm.cdf(-0.5 / math.sqrt(zero_drift.var_log)), rtol=1e-12)
    assert co.find_T(zero_drift, "ctpo:0.5:0.5", 0.5) is None


def _variance_reference(K, log_chi, T):
    """Var of (1/T) sum_t P_t from Cov(P_s, P_t) = E[P_s^2] E[P_(t-s)] - E[P_s] E[P_t], at 30 digits."""
    with mp.workdps(30):
        mu = mp.exp(K(1))
        total = mp.fsum(
            mu ** (s + t) * (mp.exp(log_chi(min(s, t))) - 1) for s in range(1, T + 1) for t in range(1, T + 1)
        )
        return total / T**2, mu**2 * (mp.exp(log_chi(1)) - 1) / T, mu ** (2 * T) * (mp.exp(log_chi(T)) - 1)


@pytest.mark.parametrize(
    ("name", "extra"),
    [("lognormal", {}), ("gamma", {}), ("two-point", {}), ("random-scale", {"alpha": 2.0})],
)
def test_prefix_variances_against_double_sums(name, extra):
    """Prefix-weight variance below the sequence weight's, each equal to the plain double sum."""
    fam = get_family(name, 1.02, 0.05, **extra)
    if name == "random-scale":
        th, a = mp.mpf(fam.theta), mp.mpf(fam.alpha)

        def log_chi(s):
            return -a * mp.log(1 - th * s)
    else:

        def log_chi(s):
            return s * (fam.K_mp(2) - 2 * fam.K_mp(1))

    df = co.prefix_variances(fam, [1, 7, 25])
    for row in df.itertuples(index=False):
        prefix, token, seq = (float(x) for x in _variance_reference(fam.K_mp, log_chi, row.T))
        assert row.var_prefix == pytest.approx(prefix, rel=1e-9)
        assert row.var_token == pytest.approx(token, rel=1e-9)
        assert row.var_sequence == pytest.approx(seq, rel=1e-9)
        assert row.var_prefix <= row.var_sequence * (1 + 1e-12)
    with pytest.raises(ValueError, match="ar1"):
        co.prefix_variances(get_family("ar1", 1.0, 0.1, rho=0.3), [10])


def test_prefix_variance_against_a_direct_simulation():
    """The sample variance of (1/T) sum_t P_t over 40 blocks of draws agrees with var_prefix within 4 SE."""
    fam = get_family("lognormal", 1.0, 0.1)
    T, blocks, per = 10, 40, 5000
    rng = np.random.default_rng(11)
    Y = rng.normal(fam.mean_log, math.sqrt(fam.var_log), size=(blocks, per, T))
    what = np.exp(np.cumsum(Y, axis=2)).mean(axis=2)
    sample = what.var(axis=1, ddof=1)  # one variance per block
    exact = co.prefix_variances(fam, [T]).var_prefix.iloc[0]
    assert abs(sample.mean() - exact) <= 4 * sample.std(ddof=1) / math.sqrt(blocks)


def test_prefix_variances_stay_finite_in_log_space():
    """At T = 10^4 the linear variances overflow and the log10 columns do not."""
    df = co.prefix_variances(get_family("lognormal", 1.0, 0.1), [10**4])
    r = df.iloc[0]
    assert math.isinf(r.var_sequence)
    assert math.isfinite(r.log10_var_sequence)
    assert r.log10_var_prefix < r.log10_var_sequence
    assert r.log10_var_token == pytest.approx(math.log10(0.1 / 10**4), rel=1e-12)


# ------------------------------------------------------------------------------- weights on data
def test_apply_tokens_rows_and_offsets_agree_with_a_plain_loop():
    """Masked prefix weights from 2-D rows, from offsets and from a per-token loop are equal."""
    rng = np.random.default_rng(2)
    c = co.parse("ctpo:0.3:0.4")
    Y = rng.normal(0.0, 0.3, size=(5, 12))
    w2, m2 = co.apply_tokens(c, Y)
    off = np.arange(0, 61, 12)
    w1, m1 = co.apply_tokens(c, Y.ravel(), off)
    np.testing.assert_array_equal(m1, m2.ravel())
    np.testing.assert_allclose(w1, w2.ravel(), rtol=1e-15)
    for i in range(5):
        L = 0.0
        for t in range(1, 13):
            L += Y[i, t - 1]
            out = not (-0.3 * math.sqrt(t) <= L <= 0.4 * math.sqrt(t))
            assert m2[i, t - 1] == out
            assert w2[i, t - 1] == pytest.approx(0.0 if out else math.exp(L), rel=1e-12)


def test_a_prefix_exactly_at_its_bound_is_kept():
    """The bound rule: L_t = -EL sqrt(t) exactly is kept (closed ends, as every mask)."""
    c = co.parse("ctpo:0.5:0.5")
    w, mod = co.apply_tokens(c, np.array([[-0.5, 0.0, 0.0, 0.0]]))  # L_1 = -0.5 = -0.5 sqrt(1)
    assert not mod.any()  # L_t = -0.5 >= -0.5 sqrt(t) at every t
    assert w[0, 0] == pytest.approx(math.exp(-0.5), rel=1e-15)


def test_evaluate_uses_the_prefix_as_base_and_predicts_by_position():
    """On data the base weight is the prefix product; the lognormal prediction sums p_t by position."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 40, size=300)
    off = np.concatenate([[0], np.cumsum(lengths)])
    log_r = rng.normal(-0.02, 0.2, size=off[-1])
    fam = co.fit_lognormal(log_r)
    df = co.evaluate(log_r, off, "ctpo:0.2:0.2", predict=fam)
    r = df.iloc[0]
    prefixes = np.concatenate([np.cumsum(log_r[a:b]) for a, b in itertools.pairwise(off)])
    t = np.concatenate([np.arange(1, n + 1) for n in lengths])
    out = (prefixes < -0.2 * np.sqrt(t)) | (prefixes > 0.2 * np.sqrt(t))
    assert r.frac_modified == pytest.approx(out.mean(), rel=1e-12)
    assert r.mean_base == pytest.approx(np.exp(prefixes).mean(), rel=1e-12)
    assert r.mean_w == pytest.approx(np.where(out, 0, np.exp(prefixes)).mean(), rel=1e-12)
    p = co.clip_probability(co.parse("ctpo:0.2:0.2"), fam.mean_log, fam.var_log, t)
    assert r.pred_frac_modified == pytest.approx(p.mean(), rel=1e-12)


# ------------------------------------------------------------------------------- Monte Carlo
@pytest.mark.parametrize(
    ("name", "extra"),
    [("lognormal", {}), ("random-scale", {"alpha": 2.0})],
)
def test_monte_carlo_within_4_se_of_theory(name, extra):
    """Monte Carlo fraction and mean weight lie within 4 of their own standard errors of the theory."""
    fam = get_family(name, 1.0, 0.1, **extra)
    specs = "ctpo:0.5:0.5,ctpo:0.2:0.6"
    th = co.theory(fam, [1, 10, 100], specs)
    mc = co.simulate_corrections(fam, [1, 10, 100], specs, 20_000, seed=5)
    z = stats.norm.ppf(0.975)
    for t, m in zip(th.itertuples(index=False), mc.itertuples(index=False), strict=True):
        assert m.mc_reliable, (t.correction, t.T, m.mc_reason)
        se_f = (m.mc_frac_modified_hi - m.mc_frac_modified_lo) / (2 * z)
        se_w = (m.mc_mean_w_hi - m.mc_mean_w_lo) / (2 * z)
        assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se_f, (t.correction, t.T)
        assert abs(m.mc_mean_w - t.mean_w) <= 4 * se_w, (t.correction, t.T)


def test_monte_carlo_runs_for_every_family(every_family):
    """Every family simulates ctpo, with intervals holding the estimate and per-position fractions."""
    fam = every_family
    mc = co.simulate_corrections(fam, [5, 50], "ctpo:0.5:0.5", 2000, seed=1)
    assert np.all(mc.mc_frac_modified_lo <= mc.mc_frac_modified)
    assert np.all(mc.mc_frac_modified <= mc.mc_frac_modified_hi)
    assert np.all(mc.mc_frac_modified_hi > mc.mc_frac_modified_lo)
    pos = co.simulate_positions(fam, "ctpo:0.5:0.5", 50, 2000, seed=1)
    assert pos.mc_frac_modified.mean() == pytest.approx(mc.mc_frac_modified.iloc[1], rel=1e-12)


def test_simulate_positions_covers_the_closed_form():
    """Per-position Monte Carlo fractions lie within 4 binomial SE of p_t."""
    fam = get_family("lognormal", 1.0, 0.1)
    n = 20_000
    pos = co.simulate_positions(fam, "ctpo:0.5:0.5", 60, n, seed=3)
    p = co.ctpo_positions(fam, "ctpo:0.5:0.5", 60).frac_clipped.to_numpy()
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(pos.mc_frac_modified.to_numpy() - p) <= 4 * se)
    with pytest.raises(ValueError, match="m2po"):
        co.simulate_positions(fam, "m2po:0.04", 10, 100)


def _coverage(seeds, n):
    fam = get_family("lognormal", 1.0, 0.1)
    th = co.theory(fam, [20], "ctpo:0.5:0.5").iloc[0]
    hits = np.zeros(2, dtype=int)
    for s in seeds:
        m = co.simulate_corrections(fam, [20], "ctpo:0.5:0.5", n, seed=s).iloc[0]
        hits += [
            m.mc_frac_modified_lo <= th.frac_modified <= m.mc_frac_modified_hi,
            m.mc_mean_w_lo <= th.mean_w <= m.mc_mean_w_hi,
        ]
    return hits


def test_interval_coverage_small(assert_coverage):
    """CTPO's Monte Carlo intervals cover the exact fraction and mean at 95 % (binomial test, 60 seeds)."""
    assert_coverage(_coverage(range(60), 2000), 60)


@pytest.mark.slow
def test_interval_coverage_full(assert_coverage):
    """CTPO's Monte Carlo intervals cover the exact fraction and mean at 95 % (binomial test, 600 seeds)."""
    assert_coverage(_coverage(range(1000, 1600), 2000), 600)


def test_mixture_has_no_theory_but_monte_carlo():
    """A lognormal mixture's ctpo has no closed form: theory refuses it, has_theory says so."""
    fam = get_family("lognormal-mixture", components="0.9:0:0.02,0.1:-0.1:0.3")
    assert not co.has_theory(fam, "ctpo:0.5:0.5")
    assert co.has_theory(fam, "m2po:0.04")
    with pytest.raises(ValueError, match="Monte Carlo"):
        co.theory(fam, [10], "ctpo:0.5:0.5")
