"""Corrections: spec parsing, closed forms, Monte Carlo, coverage and data.

Closed forms against an independent mpmath reference, Monte Carlo against theory within 4
predicted standard errors, coverage of its intervals, and data.

The reference never calls the pieces under test: each weight is written out from its
definition as a function of the base weight's log, and its moments are integrated against
the normal density with ``mpmath.quad`` at 40 digits, split at the weight's breakpoints.
"""

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from variance_lab import corrections as co
from variance_lab.families import get_family

ALL = (
    "seq-tis:3,seq-mask:3,seq-mask:0.5:2,geo-rs:0.9:1.1,gspo,"
    "tis:2,icepop:2,cispo:0.2,ppo:0.2,ppo:0.2:0.28,gmpo"
)


# ------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("spec", "kind", "params"),
    [
        ("seq-tis:3", "seq-tis", (3.0,)),
        ("seq-mask:0.5:2", "seq-mask", (0.5, 2.0)),
        ("gspo", "gspo", (3e-4, 4e-4)),
        ("gmpo", "gmpo", (0.4,)),
        ("ICEPOP:5", "icepop", (5.0,)),
        ("cispo:0.2", "cispo", (0.2,)),
    ],
)
def test_parse(spec, kind, params):
    """``parse`` reads a correction spec into its kind and parameters."""
    c = co.parse(spec)
    assert (c.kind, c.params) == (kind, params)


@pytest.mark.parametrize(
    "spec",
    ["seq-tis", "seq-tis:-1", "seq-tis:x", "mask:3", "icepop:0.5", "geo-rs:2:1", "ppo:1.5", "", "tis:nan"],
)
def test_parse_bad_spec_names_it(spec):
    """A bad correction spec raises ValueError naming the spec."""
    with pytest.raises(ValueError, match=repr(spec.strip()) if spec else "bad correction"):
        co.parse(spec)


def test_parse_list_rejects_duplicates():
    """parse_list refuses a correction given twice."""
    with pytest.raises(ValueError, match="'tis:2' given twice"):
        co.parse_list("tis:2,icepop:5,tis:2")


# ------------------------------------------------------------------------------- log Phi difference
@pytest.mark.parametrize(
    ("a", "b"),
    [
        (-40.0, -39.0),
        (-40.0, -30.0),
        (3.0, 3.0 + 1e-9),
        (0.3, 0.3000001),
        (-1e-10, 1e-10),
        (-2.0, 5.0),
        (5.0, 40.0),
        (-np.inf, -38.0),
        (1.0, np.inf),
        (-np.inf, np.inf),
        (-0.5, 0.7),
    ],
)
def test_log_phi_diff_against_mpmath(a, b):
    """log_phi_diff(a, b) matches log(Phi(b) - Phi(a)) at 50 digits."""
    with mp.workdps(50):
        ref = mp.log(mp.ncdf(b) - mp.ncdf(a))
    assert co.log_phi_diff(a, b) == pytest.approx(float(ref), rel=1e-12, abs=1e-14)


# ------------------------------------------------------------------------------- independent reference
def _weight_fn(c, T):
    """W as a function of x = log of the base weight, from the definitions in the issue."""
    p = c.params
    k = c.kind
    if k in ("seq-tis", "tis"):
        return lambda x: mp.exp(x) if x <= mp.log(p[0]) else mp.mpf(p[0])
    if k == "seq-mask":
        lo, hi = (0, p[0]) if len(p) == 1 else p
        return lambda x: mp.exp(x) if lo <= mp.exp(x) <= hi else mp.mpf(0)
    if k == "geo-rs":  # x = log P_T; rejected when G_T = exp(x / T) is outside [LO, HI]
        return lambda x: mp.exp(x) if p[0] <= mp.exp(x / T) <= p[1] else mp.mpf(0)
    if k == "icepop":
        return lambda x: mp.exp(x) if 1 / mp.mpf(p[0]) <= mp.exp(x) <= p[0] else mp.mpf(0)
    if k == "cispo" and len(p) == 1:
        return lambda x: min(mp.exp(x), 1 + mp.mpf(p[0]))
    el, eh = (p[0], p[0]) if len(p) == 1 else p
    return lambda x: min(max(mp.exp(x), 1 - mp.mpf(el)), 1 + mp.mpf(eh))  # gspo, ppo, cispo:EL:EH


def _breaks(c, T):
    p = c.params
    if c.kind == "geo-rs":
        return [T * mp.log(p[0]), T * mp.log(p[1])]
    if c.kind == "icepop":
        return [-mp.log(p[0]), mp.log(p[0])]
    if c.kind in ("seq-tis", "tis") or (c.kind == "cispo" and len(p) == 1):
        return [mp.log(p[-1])] if c.kind != "cispo" else [mp.log(1 + mp.mpf(p[0]))]
    if c.kind == "seq-mask":
        return [mp.log(v) for v in ((p[0],) if len(p) == 1 else p) if v > 0]
    el, eh = (p[0], p[0]) if len(p) == 1 else p
    return [mp.log(1 - mp.mpf(el)), mp.log(1 + mp.mpf(eh))]


def _gauss_expect(f, M, S, breaks):
    """E[f(X)], X ~ N(M, S^2), by mpmath.quad split at the breakpoints (and at M +- 40 S)."""
    pts = sorted({mp.mpf(b) for b in breaks if M - 40 * S < b < M + 40 * S} | {M - 40 * S, M + 40 * S})
    dens = lambda x: f(x) * mp.npdf(x, M, S)  # noqa: E731
    return mp.fsum(mp.quad(dens, [pts[i], pts[i + 1]]) for i in range(len(pts) - 1))


def _reference(c, mu, s2, T):
    """(mean, var, ess, frac_modified) of one correction, independently, at 40 digits."""
    with mp.workdps(40):
        v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
        m = mp.log(mu) - v / 2
        if c.kind == "gmpo":
            e = mp.mpf(c.params[0])

            def tok(j):
                return _gauss_expect(lambda y: mp.exp(j / T * min(max(y, -e), e)), m, mp.sqrt(v), [-e, e])

            e1, e2 = tok(1) ** T, tok(2) ** T
            frac = mp.ncdf(-e, m, mp.sqrt(v)) + mp.ncdf(2 * m - e, m, mp.sqrt(v))  # upper tail by symmetry
        else:
            M, S = {"P": (T * m, mp.sqrt(T * v)), "G": (m, mp.sqrt(v / T)), "r": (m, mp.sqrt(v))}[c.base]
            w, br = _weight_fn(c, T), _breaks(c, T)
            e1 = _gauss_expect(w, M, S, br)
            e2 = _gauss_expect(lambda x: w(x) ** 2, M, S, br)
            a, b = sorted(br) if len(br) == 2 else (-mp.inf, br[0])
            if c.kind == "seq-mask" and len(c.params) == 2 and c.params[0] == 0:
                a = -mp.inf
            frac = mp.ncdf(a, M, S) + mp.ncdf(2 * M - b, M, S)
        return e1, e2 - e1**2, e1**2 / e2, frac


_FAST = {(1.0, 0.1, 10), (1.05, 0.01, 1000), (0.9, 0.3, 100)}
REFERENCE_CASES = [
    pytest.param(mu, s2, T, marks=() if (mu, s2, T) in _FAST else pytest.mark.slow)
    for mu, s2 in [(1.0, 0.1), (1.05, 0.01), (0.9, 0.3)]
    for T in [1, 10, 100, 1000]
]


@pytest.mark.parametrize(("mu", "s2", "T"), REFERENCE_CASES)
def test_theory_against_mpmath_reference(mu, s2, T):
    """Closed-form mean, variance, ESS and modified fraction match the mpmath reference to 1e-9."""
    fam = get_family("lognormal", mu, s2)
    df = co.theory(fam, [T], ALL)
    for row in df.itertuples(index=False):
        c = co.parse(row.correction)
        mean, var, ess, frac = _reference(c, mu, s2, T)
        for got, ref, name in (
            (row.mean_w, mean, "mean"),
            (row.var_w, var, "var"),
            (row.ess_frac, ess, "ess"),
            (row.frac_modified, frac, "frac"),
        ):
            ref = float(ref)
            if ref < 1e-300:
                assert got < 1e-290, (row.correction, name)
                continue
            assert got == pytest.approx(ref, rel=1e-9), (row.correction, name, T)


def test_seq_tis_matches_the_printed_formula():
    """design.md: E[min(P_T, C)] = e^(M + S^2/2) Phi((ln C - M - S^2)/S) + C (1 - Phi((ln C - M)/S))."""
    fam = get_family("lognormal", 1.02, 0.05)
    for T in (5, 50, 500):
        with mp.workdps(40):
            v = mp.log(1 + mp.mpf(0.05) / mp.mpf(1.02) ** 2)
            M, S = T * (mp.log(1.02) - v / 2), mp.sqrt(T * v)
            lc = mp.log(3)
            ref = mp.exp(M + S * S / 2) * mp.ncdf((lc - M - S * S) / S) + 3 * (1 - mp.ncdf((lc - M) / S))
            ref_mask = mp.exp(M + S * S / 2) * mp.ncdf((lc - M - S * S) / S)
        df = co.theory(fam, [T], "seq-tis:3,seq-mask:3")
        assert df.mean_w.iloc[0] == pytest.approx(float(ref), rel=1e-9)
        assert df.mean_w.iloc[1] == pytest.approx(float(ref_mask), rel=1e-9)


def test_theory_large_T_stays_finite_in_log_space():
    """At T = 10^6 log10 means stay finite; an overflowing variance is inf in linear units only."""
    fam = get_family("lognormal", 1.0, 0.1)
    df = co.theory(fam, [10**6], "seq-tis:3,geo-rs:0.9:1.1,icepop:5")
    assert np.all(np.isfinite(df.log10_mean_w))
    geo = df[df.correction == "geo-rs:0.9:1.1"].iloc[0]
    assert math.isinf(geo.var_w)
    assert geo.log10_var_w > 300


def test_degenerate_ratio():
    """With sigma^2 = 0 each correction acts on the constant weight exactly."""
    df = co.theory(get_family("lognormal", 1.2, 0.0), [10], "seq-tis:3,seq-mask:3,tis:2")
    assert df.mean_w.tolist() == pytest.approx([3.0, 0.0, 1.2])
    assert df.frac_modified.tolist() == [1.0, 1.0, 0.0]


def test_theory_rejects_other_families():
    """The closed forms refuse a non-lognormal family, naming it."""
    with pytest.raises(ValueError, match="'gamma'"):
        co.theory(get_family("gamma", 1.0, 0.1), [10], "tis:2")


# ------------------------------------------------------------------------------- find_T
def test_find_T_is_the_first_length_reaching_the_threshold():
    """find_T returns the first length whose modified fraction reaches the threshold."""
    fam = get_family("lognormal", math.exp(0.012), 0.01)  # off-policy: a mean log-ratio > 0
    T = co.find_T(fam, "seq-mask:3", 0.5)
    df = co.theory(fam, [T - 1, T], "seq-mask:3")
    assert df.frac_modified.iloc[0] < 0.5 <= df.frac_modified.iloc[1]
    t_tok = co.find_T(fam, "icepop:1.2")
    df = co.theory(fam, [t_tok - 1, t_tok], "icepop:1.2")
    assert df.frac_seq_any.iloc[0] < 0.5 <= df.frac_seq_any.iloc[1]


def test_find_T_none_on_policy_upper_cap():
    """On-policy (mu = 1) an upper sequence cap never modifies half the sequences: find_T is None."""
    # mu = 1: P_T -> 0 almost surely, the fraction above an upper cap peaks and vanishes
    assert co.find_T(get_family("lognormal", 1.0, 0.1), "seq-mask:3") is None


# ------------------------------------------------------------------------------- Monte Carlo
MC_SPECS = "seq-tis:3,seq-mask:3,seq-mask:0.5:2,geo-rs:0.9:1.1,tis:2,icepop:2,ppo:0.2,gmpo"


def test_monte_carlo_within_4_se_of_theory():
    """Reliable Monte Carlo means and fractions are within 4 SE of theory; geo-rs at T = 100 is flagged."""
    fam = get_family("lognormal", 1.0, 0.1)
    n = 20_000
    th = co.theory(fam, [1, 10, 100], MC_SPECS)
    mc = co.simulate_corrections(fam, [1, 10, 100], MC_SPECS, n, seed=7)
    checked = 0
    for t, m in zip(th.itertuples(index=False), mc.itertuples(index=False), strict=True):
        assert (t.T, t.correction) == (m.T, m.correction)
        if not m.mc_reliable:
            continue
        c = co.parse(t.correction)
        units = n * t.T if c.unit == "token" else n
        se = math.sqrt(t.var_w / units)
        assert abs(m.mc_mean_w - t.mean_w) <= 4 * se, (t.correction, t.T)
        tok = c.level == "token"
        f_units = n * t.T if tok else n
        se_f = math.sqrt(t.frac_modified * (1 - t.frac_modified) / f_units)
        assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se_f + 1e-12, (t.correction, t.T)
        checked += 1
    assert checked >= 20
    geo = mc[(mc.correction == "geo-rs:0.9:1.1") & (mc["T"] == 100)].iloc[0]
    assert not geo.mc_reliable
    assert "effective sample size" in geo.mc_reason


def test_monte_carlo_gamma_token_tis_against_incomplete_gamma():
    """Gamma ratios: E[min(r, C)] = mu P(Gamma(k+1, th) <= C) + C P(Gamma(k, th) > C) (scipy)."""
    mu, s2, C, n = 1.0, 0.2, 1.5, 5000
    k, th = mu**2 / s2, s2 / mu
    exact = mu * stats.gamma.cdf(C, k + 1, scale=th) + C * stats.gamma.sf(C, k, scale=th)
    second = mu * (mu + th) * stats.gamma.cdf(C, k + 2, scale=th) + C**2 * stats.gamma.sf(C, k, scale=th)
    mc = co.simulate_corrections(get_family("gamma", mu, s2), [20], "tis:1.5", n, seed=3).iloc[0]
    se = math.sqrt((second - exact**2) / (20 * n))
    assert abs(mc.mc_mean_w - exact) <= 4 * se
    p = stats.gamma.sf(C, k, scale=th)
    assert abs(mc.mc_frac_modified - p) <= 4 * math.sqrt(p * (1 - p) / (20 * n))


def test_monte_carlo_is_deterministic():
    """Two Monte Carlo runs with one seed give equal frames."""
    fam = get_family("two-point", 1.0, 0.1)
    a = co.simulate_corrections(fam, [5, 50], "seq-tis:2,icepop:3", 1000, seed=11)
    b = co.simulate_corrections(fam, [5, 50], "seq-tis:2,icepop:3", 1000, seed=11)
    assert a.equals(b)


def _coverage(seeds, n):
    fam = get_family("lognormal", 1.0, 0.1)
    th = co.theory(fam, [10], "seq-tis:3,tis:2").mean_w.to_numpy()
    hits = np.zeros(2, dtype=int)
    for s in seeds:
        mc = co.simulate_corrections(fam, [10], "seq-tis:3,tis:2", n, seed=s)
        hits += (mc.mc_mean_w_lo.to_numpy() <= th) & (th <= mc.mc_mean_w_hi.to_numpy())
    return hits


def _assert_coverage(hits, trials):
    for h in hits:
        assert stats.binomtest(int(h), trials, 0.95).pvalue > 1e-3, (h, trials)


def test_interval_coverage_small():
    """Monte Carlo intervals cover the closed-form mean at 95 % (binomial test, 60 seeds)."""
    _assert_coverage(_coverage(range(60), 2000), 60)


@pytest.mark.slow
def test_interval_coverage_full():
    """Monte Carlo intervals cover the closed-form mean at 95 % (binomial test, 600 seeds)."""
    _assert_coverage(_coverage(range(1000, 1600), 2000), 600)


# ------------------------------------------------------------------------------- data
def test_evaluate_matches_a_plain_loop():
    """The seq-mask, icepop and gmpo rows per bucket equal a plain Python loop."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, size=200)
    off = np.concatenate([[0], np.cumsum(lengths)])
    log_r = rng.normal(0.01, 0.3, size=off[-1])
    df = co.evaluate(log_r, off, "seq-mask:3,icepop:2,gmpo", buckets=[(1, 14), (15, 29)])
    seqs = [log_r[off[i] : off[i + 1]] for i in range(200)]
    for (lo, hi), name in [((1, 14), "seq-mask:3"), ((15, 29), "seq-mask:3")]:
        sel = [s for s in seqs if lo <= s.size <= hi]
        w = [math.exp(s.sum()) if math.exp(s.sum()) <= 3 else 0.0 for s in sel]
        row = df[(df.T_min == lo) & (df.correction == name)].iloc[0]
        assert row.mean_w == pytest.approx(np.mean(w), rel=1e-12)
        assert row.frac_modified == pytest.approx(np.mean([x == 0.0 for x in w]))
    toks = np.concatenate([s for s in seqs if s.size <= 14])
    r = np.exp(toks)
    w = np.where((r >= 0.5) & (r <= 2), r, 0.0)
    row = df[(df.T_min == 1) & (df.correction == "icepop:2")].iloc[0]
    assert row.mean_w == pytest.approx(w.mean(), rel=1e-12)
    assert row.frac_modified == pytest.approx(np.mean(w == 0.0))
    gm = [math.exp(np.clip(s, -0.4, 0.4).mean()) for s in seqs if s.size >= 15]
    row = df[(df.T_min == 15) & (df.correction == "gmpo")].iloc[0]
    assert row.mean_w == pytest.approx(np.mean(gm), rel=1e-12)


def test_evaluate_rejects_bad_offsets():
    """``evaluate`` refuses offsets with an empty sequence."""
    with pytest.raises(ValueError, match="offsets"):
        co.evaluate(np.zeros(5), [0, 3, 3, 5], "tis:2")


def test_monte_carlo_random_scale_draws_one_variance_per_sequence():
    """Random-scale, one v per sequence: masked fraction E_v[Phi((T(log mu - v/2) - log C) / sqrt(T v))]."""
    from scipy import integrate

    fam = get_family("random-scale", 1.0, 0.1, alpha=0.5)
    T, C, n = 20, 2.0, 4000

    def f(v):
        return stats.norm.sf((math.log(C) + T * v / 2) / math.sqrt(T * v)) * stats.gamma.pdf(
            v, fam.alpha, scale=fam.theta
        )

    p = integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-10, limit=200)[0]
    mc = co.simulate_corrections(fam, [T], "seq-mask:2", n, seed=5).iloc[0]
    assert abs(mc.mc_frac_modified - p) <= 4 * math.sqrt(p * (1 - p) / n)
