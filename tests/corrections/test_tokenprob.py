r"""The probability-aware masks' theory: the token-probability model, exact fractions, Monte Carlo.

The masked fractions are checked against an independent mpmath quadrature: the bands by
``mpmath.findroot`` on the binary KL written from log-odds at 16 digits (or the TV formula), the
normal tails by ``mpmath.ncdf`` and the integral over the Beta law of the token's probability by
``mpmath.quad`` (tanh-sinh), split at the same kinks, each found by mpmath itself. The weight
moments are checked against ``scipy.integrate.quad`` of :math:`r^k\varphi` over the kept band.
"""

import itertools
import math

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate, special, stats

from variance_lab import corrections as co
from variance_lab.families import get_family

LOGNORMAL = get_family("lognormal", 1.0, 0.1)


# ------------------------------------------------------------------------------- an mpmath reference
def _sig(x):
    return 1 / (1 + mp.exp(-x))


def _lsig(x):
    return -mp.log1p(mp.exp(-x))


def _kl(lx, ly):
    """D(sig(lx) || sig(ly)) from log-odds."""
    return _sig(lx) * (_lsig(lx) - _lsig(ly)) + _sig(-lx) * (_lsig(-lx) - _lsig(-ly))


def _mp_root(f, delta, sign):
    """Return the y of sign ``sign`` with f(y) = delta (f rises in |y| from 0), or None below |y| = 1000."""
    hi = mp.mpf(1)
    while f(sign * hi) <= delta:
        hi *= 2
        if hi > 1000:
            return None
    lo = hi / 2 if f(sign * hi / 2) <= delta else mp.mpf(0)
    return sign * mp.findroot(lambda y: f(sign * y) - delta, (lo, hi), solver="illinois", verify=False)


def _mp_bands(kind, delta, l):
    """(down, up) of the kept band of Y at log-odds l; None for a side that never masks."""
    q = _sig(l)
    if kind == "dppo-tv":
        up = mp.log((q + delta) / (1 - q - delta)) - l if q + delta < 1 else None
        down = mp.log((q - delta) / (1 - q + delta)) - l if q > delta else None
        return down, up
    down, up = _mp_root(lambda y: _kl(l, l + y), delta, -1), _mp_root(lambda y: _kl(l, l + y), delta, 1)
    if kind == "kpop":
        fu = _mp_root(lambda y: _kl(l + y, l), delta, 1) if delta < -mp.log(q) else None
        fd = _mp_root(lambda y: _kl(l + y, l), delta, -1) if delta < -mp.log(1 - q) else None
        up = fu if up is None else up if fu is None else min(up, fu)
        down = fd if down is None else down if fd is None else max(down, fd)
    return down, up


def _mp_kinks(kind, delta, guesses):
    """Return the log-odds where a band's side appears or KPop's binding divergence switches, by mpmath."""
    if kind == "dppo-tv":
        return [mp.log(delta / (1 - delta)), -mp.log(delta / (1 - delta))]
    if kind != "kpop":
        return []
    out = [-mp.log(mp.expm1(delta)), mp.log(mp.expm1(delta))]
    for g, sign in guesses:  # a bracket of width 0.2 around the float kink; mpmath finds the root in it

        def gap(l, sign=sign):
            return _mp_root(lambda y: _kl(l, l + y), delta, sign) - _mp_root(
                lambda y: _kl(l + y, l), delta, sign
            )

        out.append(
            mp.findroot(gap, (mp.mpf(g) - mp.mpf("0.1"), mp.mpf(g) + mp.mpf("0.1")), solver="illinois")
        )
    return out


def _mp_fractions(kind, delta, comps, a, b, guesses=(), dps=16):
    """(P(masked above), P(masked below)) over q ~ Beta(a, b), integrated in logit space by mpmath."""
    with mp.workdps(dps):
        delta = mp.mpf(delta)
        log_beta = mp.log(mp.beta(a, b))
        memo = {}  # both sides' quadratures visit the same nodes

        def tails(l, side):
            if l not in memo:
                down, up = _mp_bands(kind, delta, l)
                dens = mp.exp(a * _lsig(l) + b * _lsig(-l) - log_beta)
                cdf = [
                    None if e is None else mp.fsum(w * mp.ncdf(e, m, mp.sqrt(v)) for w, m, v in comps)
                    for e in (up, down)
                ]
                memo[l] = (
                    mp.mpf(0) if up is None else dens * (1 - cdf[0]),
                    mp.mpf(0) if down is None else dens * cdf[1],
                )
            return memo[l][0 if side > 0 else 1]

        pts = sorted([-300, -60, -15, -4, 0, 4, 15, 60, 120, *_mp_kinks(kind, delta, guesses)])
        return [mp.quad(lambda l, s=s: tails(l, s), pts) for s in (1, -1)]


def _guesses(spec):
    """Return the float kinks of kpop (both sides), to bracket mpmath's own search."""
    ks = co.band_kinks(co.parse(spec))[2:]
    return [(k, 1 if k < 0 else -1) for k in ks]


def _comps(fam):
    return [(1, fam.mean_log, fam.var_log)] if fam.name == "lognormal" else list(fam.components)


@pytest.mark.parametrize("spec", ["dppo-tv", "dppo-kl", "kpop"])
def test_fractions_against_mpmath(spec):
    """Each side's masked fraction over Beta(0.2, 0.6) matches the mpmath quadrature to 1e-9."""
    c = co.parse(spec)
    up, down = _mp_fractions(
        c.kind, c.params[0], _comps(LOGNORMAL), 0.2, 0.6, _guesses(spec) if c.kind == "kpop" else ()
    )
    th = co.theory(LOGNORMAL, [1], spec).set_index("correction").frac_modified
    if c.signed:
        assert th[f"{spec} [A>0]"] == pytest.approx(float(up), rel=1e-9)
        assert th[f"{spec} [A<=0]"] == pytest.approx(float(down), rel=1e-9)
        assert th[spec] == pytest.approx(float(0.5 * up + 0.5 * down), rel=1e-9)
    else:
        assert th[spec] == pytest.approx(float(up + down), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "fam", "law"),
    [
        ("dppo-tv:0.05:0.3", get_family("lognormal", 1.0, 0.5), (1.5, 0.7)),
        ("dppo-kl:0.01", get_family("lognormal-mixture", components="0.9:0:0.02,0.1:-0.1:0.3"), (0.2, 0.6)),
        ("kpop:0.02", get_family("lognormal", 0.98, 0.02), (0.6, 0.9)),
        ("kpop:0.5", get_family("lognormal-mixture", components="0.7:0:0.01,0.3:0.05:0.4"), (0.3, 0.3)),
    ],
)
def test_more_fractions_against_mpmath(spec, fam, law):
    """Other thresholds, laws of q and a mixture law of Y: 1e-9 against mpmath."""
    c = co.parse(spec)
    up, down = _mp_fractions(
        c.kind, c.params[0], _comps(fam), *law, _guesses(spec) if c.kind == "kpop" else ()
    )
    th = co.theory(fam, [1], spec, token_prob=co.TokenProbability(*law)).set_index("correction").frac_modified
    if c.signed:
        assert th[f"{spec} [A>0]"] == pytest.approx(float(up), rel=1e-9)
        assert th[f"{spec} [A<=0]"] == pytest.approx(float(down), rel=1e-9)
    else:
        assert th[spec] == pytest.approx(float(up + down), rel=1e-9)


@pytest.mark.parametrize("spec", ["dppo-kl:0.03", "kpop:0.2"])
@pytest.mark.parametrize("l", [-30.0, -3.0, 0.2, 2.5, 25.0])
def test_bands_against_mpmath_roots(spec, l):
    """The kept band at one log-odds: mpmath's roots of the binary KL, to 1e-12."""
    c = co.parse(spec)
    down, up = co.mask_bands(c, np.array([l]))
    with mp.workdps(30):
        ref = _mp_bands(c.kind, mp.mpf(c.params[0]), mp.mpf(l))
    for got, want in zip((down[0], up[0]), ref, strict=True):
        if want is None:
            assert math.isinf(got)
        else:
            assert got == pytest.approx(float(want), rel=1e-12)


# ------------------------------------------------------------------------------- weight moments
def _r(q, y):
    return 1.0 / ((1 - q) * math.exp(-y) + q) if y > -700 else 0.0


@pytest.mark.parametrize("q", [0.02, 0.3, 0.85])
@pytest.mark.parametrize("spec", ["dppo-tv:0.1", "kpop:0.05"])
def test_moments_at_a_fixed_probability_against_scipy(q, spec):
    """E[w], Var(w) and E[r] at a fixed q: scipy.quad of r^k phi over the kept band, to 1e-10."""
    fam = get_family("lognormal", 1.0, 0.3)
    m, s = fam.mean_log, math.sqrt(fam.var_log)
    c = co.parse(spec)
    down, up = (float(x[0]) for x in co.mask_bands(c, np.array([special.logit(q)])))
    lo, hi = (m - 40 * s, m + 40 * s)

    def moment(k, a, b):
        return integrate.quad(
            lambda y: _r(q, y) ** k * stats.norm.pdf(y, m, s), a, b, epsabs=0, epsrel=1e-13, limit=200
        )[0]

    if c.signed:  # the A > 0 row keeps Y <= up
        a, b = lo, min(up, hi)
    else:
        a, b = max(down, lo), min(up, hi)
    row = co.theory(fam, [1], spec, token_prob=co.TokenProbability.fixed(q)).iloc[1 if c.signed else 0]
    e1, e2 = moment(1, a, b), moment(2, a, b)
    assert row.mean_w == pytest.approx(e1, rel=1e-10)
    assert row.var_w == pytest.approx(e2 - e1 * e1, rel=1e-9)
    assert row.mean_base == pytest.approx(moment(1, lo, hi), rel=1e-10)
    ratio = co.prob_log_moments(c, fam, co.TokenProbability.fixed(q))["ratio"]  # the unmasked r
    assert math.exp(ratio[1]) == pytest.approx(moment(2, lo, hi), rel=1e-10)


@pytest.mark.slow
def test_moments_over_the_beta_law_against_scipy():
    """E[w] and E[w^2] of kpop over Beta(0.2, 0.6): nested scipy.quad, to 1e-8."""
    fam = LOGNORMAL
    m, s = fam.mean_log, math.sqrt(fam.var_log)
    c = co.parse("kpop")
    law = co.TOKEN_PROB_DEFAULT

    def inner(l, k):
        q = special.expit(l)
        down, up = (float(x[0]) for x in co.mask_bands(c, np.array([l])))
        a, b = max(down, m - 40 * s), min(up, m + 40 * s)
        val = integrate.quad(lambda y: _r(q, y) ** k * stats.norm.pdf(y, m, s), a, b, epsabs=0, epsrel=1e-12)[
            0
        ]
        return val * math.exp(float(law.log_density(np.array([l]))[0]))

    lo, hi = law.logit_range()
    edges = sorted([lo, hi, *np.arange(-20.0, 20.5, 0.5), *co.band_kinks(c)])
    e1, e2 = (
        sum(
            integrate.quad(inner, a, b, args=(k,), epsabs=0, epsrel=1e-11)[0]
            for a, b in itertools.pairwise(edges)
        )
        for k in (1, 2)
    )
    row = co.theory(fam, [1], "kpop").iloc[0]
    assert row.mean_w == pytest.approx(e1, rel=1e-8)
    assert row.var_w == pytest.approx(e2 - e1 * e1, rel=1e-8)


# ------------------------------------------------------------------------------- rows, find_T, the law
def test_dppo_rows_mix_the_signs_and_sequences_share_one():
    """The all row mixes the sign rows with P(A > 0); frac_seq_any counts one sign per sequence."""
    th = co.theory(LOGNORMAL, [50], "dppo-kl:0.02:0.3").set_index("correction")
    pos, neg, both = (
        th.loc["dppo-kl:0.02:0.3 [A>0]"],
        th.loc["dppo-kl:0.02:0.3 [A<=0]"],
        th.loc["dppo-kl:0.02:0.3"],
    )
    assert both.frac_modified == pytest.approx(0.3 * pos.frac_modified + 0.7 * neg.frac_modified, rel=1e-13)
    assert both.mean_w == pytest.approx(0.3 * pos.mean_w + 0.7 * neg.mean_w, rel=1e-13)
    for row in (pos, neg):
        assert row.frac_seq_any == pytest.approx(1 - (1 - row.frac_modified) ** 50, rel=1e-12)
    assert both.frac_seq_any == pytest.approx(0.3 * pos.frac_seq_any + 0.7 * neg.frac_seq_any, rel=1e-13)
    assert (th.method == "quadrature").all()


def test_find_T_is_the_first_length_with_a_masked_token():
    """find_T of kpop: the smallest T with 1 - (1 - f)^T >= threshold."""
    f = co.theory(LOGNORMAL, [1], "kpop").frac_modified.iloc[0]
    want = math.ceil(math.log(0.5) / math.log1p(-f))
    assert co.find_T(LOGNORMAL, "kpop", 0.5) == want
    law = co.TokenProbability.fixed(0.5)
    f = co.theory(LOGNORMAL, [1], "kpop", token_prob=law).frac_modified.iloc[0]
    assert co.find_T(LOGNORMAL, "kpop", 0.5, token_prob=law) == math.ceil(math.log(0.5) / math.log1p(-f))


def test_theory_covers_lognormal_and_mixtures_only():
    """Random-scale and the other families have no theory for these masks (Monte Carlo only)."""
    mix = get_family("lognormal-mixture", components="0.9:0:0.02,0.1:-0.1:0.3")
    assert co.has_theory(LOGNORMAL, "kpop")
    assert co.has_theory(mix, "dppo-tv")
    for fam in (get_family("random-scale", 1.0, 0.1, alpha=2.0), get_family("gamma", 1.0, 0.1)):
        assert not co.has_theory(fam, "kpop")
    with pytest.raises(ValueError, match="random-scale"):
        co.theory(get_family("random-scale", 1.0, 0.1, alpha=2.0), [1], "kpop")


def test_token_probability_law():
    """Bad parameters name themselves; draws follow Beta(a, b); the density integrates to 1."""
    with pytest.raises(ValueError, match="a must be > 0"):
        co.TokenProbability(0.0, 1.0)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        co.TokenProbability.fixed(1.0)
    law = co.TokenProbability(0.3, 0.8)
    q = special.expit(law.draw_logit(np.random.default_rng(0), 200_000))
    assert stats.kstest(q, stats.beta(0.3, 0.8).cdf).pvalue > 1e-3
    lo, hi = law.logit_range()
    mass = integrate.quad(lambda l: math.exp(float(law.log_density(np.array([l]))[0])), lo, hi, limit=400)[0]
    assert mass == pytest.approx(1.0, abs=1e-10)
    assert co.TokenProbability.fixed(0.25).label() == "q = 0.25"


# ------------------------------------------------------------------------------- Monte Carlo
def _se(row):
    return (row.mc_frac_modified_hi - row.mc_frac_modified_lo) / (2 * stats.norm.ppf(0.975))


def test_monte_carlo_within_4_se_of_theory():
    """Fractions and mean weights of every row within 4 standard errors of the quadrature."""
    specs = "dppo-tv:0.1,dppo-kl:0.03,kpop:0.05"
    for fam in (LOGNORMAL, get_family("lognormal-mixture", components="0.9:0:0.02,0.1:-0.1:0.3")):
        th = co.theory(fam, [20], specs).set_index("correction")
        mc = co.simulate_corrections(fam, [20], specs, 4000, seed=4).set_index("correction")
        assert list(mc.index) == list(th.index)
        for label, row in mc.iterrows():
            assert abs(row.mc_frac_modified - th.frac_modified[label]) <= 4 * _se(row), label
            se_w = (row.mc_mean_w_hi - row.mc_mean_w_lo) / (2 * stats.norm.ppf(0.975))
            assert abs(row.mc_mean_w - th.mean_w[label]) <= 4 * se_w, label


def test_monte_carlo_runs_for_every_family(every_family):
    """Every family draws the log-odds shifts; the fractions are probabilities and the runs repeat."""
    a = co.simulate_corrections(every_family, [5], "dppo-tv:0.05,kpop:0.02", 300, seed=2)
    b = co.simulate_corrections(every_family, [5], "dppo-tv:0.05,kpop:0.02", 300, seed=2)
    assert a.equals(b)
    assert ((a.mc_frac_modified >= 0) & (a.mc_frac_modified <= 1)).all()
    assert a.attrs["provenance"]["token_prob"] == {"token_prob": "beta", "a": 0.2, "b": 0.6}


def test_other_specs_draw_the_same_without_a_probability_aware_one():
    """Adding kpop draws the token probabilities after everything else: icepop's rows are unchanged."""
    fam = LOGNORMAL
    alone = co.simulate_corrections(fam, [10], "icepop,opsm:0.01", 500, seed=9)
    both = co.simulate_corrections(fam, [10], "icepop,opsm:0.01,kpop", 500, seed=9)
    assert alone.equals(both[~both.correction.str.startswith("kpop")].reset_index(drop=True))


def _coverage(seeds):
    """Count, per row, the seeds whose 95 % interval of the masked fraction covers the quadrature."""
    specs = "dppo-tv:0.1,kpop:0.05"
    th = co.theory(LOGNORMAL, [10], specs).set_index("correction").frac_modified
    hits = dict.fromkeys(th.index, 0)
    for s in seeds:
        mc = co.simulate_corrections(LOGNORMAL, [10], specs, 300, seed=s)
        for r in mc.itertuples(index=False):
            hits[r.correction] += r.mc_frac_modified_lo <= th[r.correction] <= r.mc_frac_modified_hi
    return list(hits.values())


def test_interval_coverage_small(assert_coverage):
    """The Monte Carlo intervals of the masked fractions cover the quadrature at 95 % (40 seeds)."""
    assert_coverage(_coverage(range(40)), 40)


@pytest.mark.slow
def test_interval_coverage_full(assert_coverage):
    """The Monte Carlo intervals of the masked fractions cover the quadrature at 95 % (400 seeds)."""
    assert_coverage(_coverage(range(1000, 1400)), 400)
