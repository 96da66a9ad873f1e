"""Theory against an independent 120-digit mpmath reference written here.

The reference never calls the code under test: it takes E[r^s] from each family's textbook
closed form, raises it to the power T (E[P_T^k] = E[r^k]^T, E[G_T^k] = E[r^(k/T)]^T), and
forms variances and fourth central moments by plain subtraction at a precision that
survives the cancellation. Log-moments come from numerical differentiation of log E[r^s].
"""

import functools
import math

import mpmath as mp
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from variance_lab import theory
from variance_lab.families import FAMILIES, get_family

T_GRID = [1, 10, 100, 1000, 10**5, 10**6]
MUS = [0.5, 1.0, 2.0]
SIGMA2S = [0.0, 1e-4, 0.1, 10.0]
REL = 1e-9
REL_NEEDED = 1e-6
DPS = 120


def _raw_moment(name, mu, s2, s):
    """E[r^s] from textbook closed forms, at the current mpmath precision."""
    mu, s2, s = mp.mpf(mu), mp.mpf(s2), mp.mpf(s)
    if s2 == 0:
        return mu**s
    if name == "lognormal":
        v = mp.log(1 + s2 / mu**2)
        m = mp.log(mu) - v / 2
        return mp.exp(s * m + s * s * v / 2)
    if name == "gamma":
        k, theta = mu**2 / s2, s2 / mu
        return mp.gamma(k + s) / mp.gamma(k) * theta**s
    if name == "two-point":
        sd = mp.sqrt(s2)
        a, b = mu - sd, mu + sd  # q = 1/2
        return (a**s + b**s) / 2
    raise AssertionError(name)


def _ar1_var_sum(v, rho, T):
    """Var(sum of T AR(1) terms) = v [T + 2 sum_k (T-k) rho^k], the inner sum regrouped.

    The inner sum is regrouped as sum_{j<T} sum_{k<=j} rho^k; checked against the plain sum
    for small T in a test below.
    """
    inner = (rho * (T - 1) - rho**2 * (1 - rho ** (T - 1)) / (1 - rho)) / (1 - rho)
    return v * (T + 2 * inner)


def _ar1_moments(mu, s2, rho, T, scale):
    """E[X^k], k = 1..4, for X = exp(scale * S_T), S_T ~ N(T m, V_T)."""
    v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
    m = mp.log(mu) - v / 2
    V = _ar1_var_sum(v, mp.mpf(rho), T)
    return [mp.exp(k * scale * T * m + (k * scale) ** 2 * V / 2) for k in (1, 2, 3, 4)]


def test_ar1_variance_sum_regrouping():
    """The regrouped AR(1) variance sum equals the double sum to 1e-40, in mpmath."""
    with mp.workdps(50):
        for rho in (mp.mpf("0.5"), mp.mpf("-0.3"), mp.mpf("0.99")):
            for T in (1, 2, 7, 300):
                direct = T + 2 * sum((T - k) * rho**k for k in range(1, T))
                assert abs(_ar1_var_sum(1, rho, T) - direct) < mp.mpf(10) ** -40 * direct


def _rs_theta(mu, s2, alpha):
    """Find the random-scale theta as the root of E[r^2] = mu^2 + s2.

    The gamma MGF (1 - c theta)^(-alpha) at c = 1, by bisection in theta on (0, 1): the moment
    equation, not the closed form of the code. Cached per precision (the bisection is the
    reference's slow part).
    """
    return _rs_theta_at(float(mu), float(s2), float(alpha), mp.mp.prec)


@functools.lru_cache(maxsize=1024)
def _rs_theta_at(mu, s2, alpha, prec):
    target = 1 + mp.mpf(s2) / mp.mpf(mu) ** 2
    lo, hi = mp.mpf(0), mp.mpf(1)
    for _ in range(450):  # 2^-450 < 10^-135
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - mid) ** (-mp.mpf(alpha)) < target else (lo, mid)
    return (lo + hi) / 2


def _rs_moment(mu, s2, alpha, T, s):
    """Return E[P_T^s] for random-scale ratios.

    Given v, log P_T ~ N(T(log mu - v/2), T v), so E[P_T^s | v] = mu^(sT) exp(c v) with
    c = T s(s-1)/2, and v ~ Gamma(alpha, theta) has the moment generating function
    E[exp(c v)] = (1 - c theta)^(-alpha) for c < 1/theta, infinite beyond.
    """
    mu, s = mp.mpf(mu), mp.mpf(s)
    if s2 == 0:
        return mu ** (s * T)
    theta = _rs_theta(mu, s2, alpha)
    c = T * s * (s - 1) / 2
    if c * theta >= 1:
        return mp.inf
    return mu ** (s * T) / (1 - c * theta) ** mp.mpf(alpha)


def _mix_moment(components, s):
    """E[r^s] of a lognormal mixture: sum_j w_j E[exp(s N(m_j, v_j))], the weights renormalised."""
    comps = [[mp.mpf(float(x)) for x in c.split(":")] for c in components.split(",")]
    total = sum(c[0] for c in comps)
    return sum(w / total * mp.exp(s * m + s * s * v / 2) for w, m, v in comps)


def _moments(EX):
    """(mean, variance, m4 / variance^2) from raw moments E[X^k], k = 1..4 (inf where they are)."""
    e1, e2, e3, e4 = EX
    if mp.isinf(e2):
        return e1, mp.inf, mp.inf
    if mp.isinf(e4):
        return e1, e2 - e1**2, mp.inf
    var = e2 - e1**2
    m4 = e4 - 4 * e3 * e1 + 6 * e2 * e1**2 - 3 * e1**4
    if abs(var) <= mp.mpf(10) ** (-DPS // 2) * e1**2:  # sigma2 = 0: a constant, up to rounding
        return e1, mp.mpf(0), mp.nan
    return e1, var, m4 / var**2


def _n_needed(kurt, target):
    """Root of rse(n) = target by bisection on log n (rse is decreasing in n; no quadratic formula)."""
    if mp.isnan(kurt):
        return mp.mpf(2)
    if mp.isinf(kurt):  # no n gives a finite relative error
        return mp.inf
    g = lambda n: (kurt - (n - 3) / (n - 1)) / n - mp.mpf(target) ** 2  # noqa: E731
    lo, hi = mp.log(1 + mp.mpf(10) ** -30), mp.log(2 * (kurt + 1) / mp.mpf(target) ** 2 + 10)
    for _ in range(120):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if g(mp.exp(mid)) > 0 else (lo, mid)
    return mp.exp((lo + hi) / 2)


def reference(name, mu, s2, T, target=0.1, rho=None, alpha=None, components=None):
    """Return the mpmath reference moments of P_T and G_T and the log moments for one case."""
    with mp.workdps(DPS):
        if name == "lognormal-mixture":  # mu and sigma2 derived from the components
            mu = _mix_moment(components, 1)
            s2 = _mix_moment(components, 2) - mu**2
            raw = lambda s: _mix_moment(components, s)  # noqa: E731
            P = _moments([raw(k) ** T for k in (1, 2, 3, 4)])
            G = _moments([raw(mp.mpf(k) / T) ** T for k in (1, 2, 3, 4)])
            logmom = lambda s: mp.log(raw(s))  # noqa: E731
        elif name == "random-scale":  # not i.i.d.: E[P_T^s] averaged over the sequence's variance
            P = _moments([_rs_moment(mu, s2, alpha, T, k) for k in (1, 2, 3, 4)])
            G = _moments([_rs_moment(mu, s2, alpha, T, mp.mpf(k) / T) for k in (1, 2, 3, 4)])
            logmom = lambda s: mp.log(_rs_moment(mu, s2, alpha, 1, s))  # noqa: E731
        elif name == "ar1":  # not i.i.d.: log P_T is Gaussian with the AR(1) variance
            P = _moments(_ar1_moments(mu, s2, rho, T, 1))
            G = _moments(_ar1_moments(mu, s2, rho, T, mp.mpf(1) / T))
            name = "lognormal"  # the marginal, for mu_y and sigma_y^2 below
        else:
            P = _moments([_raw_moment(name, mu, s2, k) ** T for k in (1, 2, 3, 4)])
            G = _moments([_raw_moment(name, mu, s2, mp.mpf(k) / T) ** T for k in (1, 2, 3, 4)])
        if name not in ("lognormal-mixture", "random-scale"):
            logmom = lambda s: mp.log(_raw_moment(name, mu, s2, s))  # noqa: E731
        if s2 == 0:  # r = mu: G_T = mu exactly, the rounding residue of the powers dropped
            G = (mp.mpf(mu), mp.mpf(0), mp.nan)
            my, vy = mp.log(mu), mp.mpf(0)
        else:
            my, vy = mp.diff(logmom, 0, 1), mp.diff(logmom, 0, 2)
        x = vy / T
        out = {
            "mean_P": P[0],
            "var_P": P[1],
            "mean_G": G[0],
            "var_G": G[1],
            "bias_G": G[0] - mu,
            "mse_G": G[1] + (G[0] - mu) ** 2,
            "var_G_lognormal": (mp.exp(x) - 1) * mp.exp(2 * my + x),
            "var_G_delta": vy * mp.exp(2 * my) / T,
            "var_G_naive": mp.mpf(s2) / T,
            "ess_frac_P": P[0] ** 2 / (P[1] + P[0] ** 2),
            "kurtosis_P": P[2],
            "kurtosis_G": G[2],
            "n_needed_P": _n_needed(P[2], target),
            "n_needed_G": _n_needed(G[2], target),
        }
        if G[1] != 0:
            out["var_ratio"] = P[1] / G[1]
        if mp.isinf(P[1]):  # Var(P_T) infinite: so are its ratio and the draws needed; ESS 0
            out["ess_frac_P"] = mp.mpf(0)
        return out


def _cases():
    for name in FAMILIES:
        for mu in MUS:
            for s2 in SIGMA2S:
                if name == "two-point" and s2 >= mu**2:
                    continue
                if name == "ar1":
                    yield from ((name, mu, s2, {"rho": rho}) for rho in (0.5, -0.3))
                elif name == "random-scale":
                    yield from ((name, mu, s2, {"alpha": alpha}) for alpha in (0.5, 3.0))
                elif name == "lognormal-mixture":
                    continue  # parametrised by its components: MIXTURES below
                else:
                    yield name, mu, s2, {}


SMALLEST_NORMAL = 2.2250738585072014e-308


def _check_lin(q, got_lin, ref, rel):
    with mp.workdps(DPS):
        if mp.isnan(ref):
            assert math.isnan(got_lin), q
            return
        ref_lin = float(ref)
    if q == "bias_G":  # bias may be exactly 0: an absolute floor of 1e-15
        assert abs(got_lin - ref_lin) <= rel * abs(ref_lin) + 1e-15, (q, got_lin, ref_lin)
    elif ref_lin != 0 and math.isfinite(ref_lin):
        # below the normal range float64 spaces values 4.9e-324 apart: a few spacings more
        floor = 1e-322 if abs(ref_lin) < SMALLEST_NORMAL else 0.0
        assert abs(got_lin - ref_lin) <= rel * abs(ref_lin) + floor, (q, got_lin, ref_lin)
    else:  # beyond float range: the linear value saturates, never NaN
        assert got_lin == ref_lin, (q, got_lin, ref_lin)


def _check_log(q, got_log, ref, rel):
    with mp.workdps(DPS):
        if mp.isnan(ref):
            assert math.isnan(got_log), q
            return
        ref_log10 = float(mp.log10(abs(ref))) if ref != 0 else -math.inf
    if q == "bias_G" and abs(ref) < 1e-15:  # the mpmath residue of an exact 0 at T = 1
        return
    if math.isfinite(ref_log10):
        # |d log10| <= rel / ln 10 is a relative error <= rel of the linear value; float64
        # holds a log10 of size L only to about 1.1e-16 L, hence the second term
        assert abs(got_log - ref_log10) <= rel / math.log(10) + 4e-16 * abs(ref_log10), (
            q,
            got_log,
            ref_log10,
        )
    else:
        assert got_log == ref_log10


def _check(q, got_lin, got_log, ref, rel):
    _check_lin(q, got_lin, ref, rel)
    _check_log(q, got_log, ref, rel)


MIXTURES = [
    "0.98:0:1e-8,0.02:-0.005:0.01",  # the sparse heavy-tailed tokens
    "0.5:-0.1:0.05,0.3:0.05:0.2,0.2:0.2:0",  # three components, one of them a point mass
    "1:0.1:0.2",  # one component: a lognormal
    "0.999:0:0,0.001:-0.02:0.5",  # sparse, with a point mass at r = 1
]


def _all_cases():
    yield from _cases()
    yield from (("lognormal-mixture", None, None, {"components": c}) for c in MIXTURES)


@pytest.mark.parametrize(("name", "mu", "s2", "params"), list(_all_cases()))
def test_every_quantity_against_mpmath(name, mu, s2, params):
    """Every quantity, linear and log10, matches the mpmath reference at each T."""
    fam = get_family(name, mu, s2, **params)
    for T in T_GRID:
        ref = reference(name, mu, s2, T, **params)
        for q, r in ref.items():
            rel = REL_NEEDED if q.startswith("n_needed") else REL
            _check(q, theory.value(q, fam, T), theory.value(q, fam, T, log10=True), r, rel)


@pytest.mark.parametrize("name", ["lognormal", "gamma", "two-point"])
def test_rel_se_matches_definition(name):
    """The relative SE of the sample variances is sqrt((kurtosis - (n-3)/(n-1))/n)."""
    fam = get_family(name, 1.0, 0.1)
    for T in (1, 10, 100):
        ref = reference(name, 1.0, 0.1, T)
        for n in (10, 10**6):
            with mp.workdps(DPS):
                want_P = float(mp.sqrt((ref["kurtosis_P"] - mp.mpf(n - 3) / (n - 1)) / n))
                want_G = float(mp.sqrt((ref["kurtosis_G"] - mp.mpf(n - 3) / (n - 1)) / n))
            assert theory.rel_se_var_P(fam, T, n) == pytest.approx(want_P, rel=REL)
            assert theory.rel_se_var_G(fam, T, n) == pytest.approx(want_G, rel=REL)
            # at n_needed draws, the relative standard error is the target
        nP = theory.n_needed_P(fam, T, 0.05)
        assert theory.rel_se_var_P(fam, T, 10**6) <= 0.05 or nP > 10**6


def test_design_note_numbers():
    """The figures quoted in design.md for the derivation's parameters."""
    fam = get_family("lognormal", 1.0, 0.1)
    assert theory.var_P(fam, 10) == pytest.approx(1.1**10 - 1, rel=1e-12)
    assert theory.var_G(fam, [10, 100, 1000]) == pytest.approx([0.008789, 8.677e-4, 8.666e-5], rel=1e-3)
    need = theory.n_needed_P(fam, [10, 100, 1000], log10=True)
    assert need == pytest.approx([4.0, 18.6, 167.6], abs=0.05)  # ~1e4, 4e18, 4e167


def test_ar1_rho_zero_is_lognormal():
    """AR(1) with rho = 0 gives the lognormal family's values exactly."""
    a, b = get_family("ar1", 1.3, 0.4, rho=0.0), get_family("lognormal", 1.3, 0.4)
    for q in theory.QUANTITIES:
        np.testing.assert_array_equal(theory.value(q, a, [1, 10, 1000]), theory.value(q, b, [1, 10, 1000]))


def test_shapes_and_scalars():
    """A scalar T gives a float, an array T an array of its shape."""
    fam = get_family("gamma", 1.0, 0.1)
    assert isinstance(theory.var_G(fam, 10), float)
    out = theory.var_G(fam, np.array([[1, 10], [100, 1000]]))
    assert out.shape == (2, 2)
    assert out[0, 0] == pytest.approx(0.1, rel=1e-12)


def test_no_nan_beyond_float_range():
    """Beyond float range values are inf or 0, never NaN, and log10 values stay finite."""
    fam = get_family("gamma", 2.0, 10.0)
    T = [10**5, 10**6]
    for q in ("var_P", "mean_P", "ess_frac_P", "var_ratio", "n_needed_P", "kurtosis_P"):
        lin = theory.value(q, fam, T)
        lg = theory.value(q, fam, T, log10=True)
        assert not np.any(np.isnan(lin)), q
        assert np.all(np.isfinite(lg)), q
    assert np.all(np.isinf(theory.var_P(fam, T)))
    assert np.all(theory.ess_frac_P(fam, T) == 0.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda f: theory.var_P(f, 0), "T must be integers >= 1, got 0"),
        (lambda f: theory.var_P(f, [1, 2.5]), "got 2.5"),
        (lambda f: theory.var_P(f, -3), "got -3"),
        (lambda f: theory.var_P(f, float("nan")), "got nan"),
        (lambda f: theory.var_P(f, []), "T must not be empty"),
        (lambda f: theory.rel_se_var_P(f, 10, 1), "n must be an integer >= 2, got 1"),
        (lambda f: theory.n_needed_P(f, 10, 0.0), "target must be a finite number > 0, got 0.0"),
        (lambda f: theory.value("nope", f, 10), "unknown quantity 'nope'"),
        (lambda f: theory.var_P("lognormal", 10), "family must be a Family"),
    ],
)
def test_bad_input(call, match):
    """Bad T, n, target, quantity or family raise ValueError naming the bad value."""
    with pytest.raises(ValueError, match=match):
        call(get_family("lognormal", 1.0, 0.1))


@pytest.mark.parametrize(
    "call",
    [
        lambda f: theory.value("var_G_seed", f, 10),
        lambda f: theory.value("var_G_seed", f, [1, 10], log10=True, precise=True),
        lambda f: theory.tidy(f, [1, 10], quantities=["var_P", "var_G_seed"]),
        lambda f: theory.tidy_many([f, f], [1, 10], quantities=["var_G_seed"]),
    ],
    ids=["value", "value-precise", "tidy", "tidy_many"],
)
def test_old_quantity_name_says_its_new_name(call):
    """Asking for ``var_G_seed`` (the name before the rename) raises ValueError naming ``var_G_naive``."""
    with pytest.raises(ValueError, match=r"^'var_G_seed' was renamed 'var_G_naive'$"):
        call(get_family("lognormal", 1.0, 0.1))


def test_old_function_name_says_its_new_name():
    """``theory.var_G_seed`` (the function before the rename) raises AttributeError naming ``var_G_naive``."""
    with pytest.raises(
        AttributeError, match=r"^variance_lab.theory.var_G_seed was renamed variance_lab.theory.var_G_naive$"
    ):
        theory.var_G_seed  # noqa: B018
    with pytest.raises(AttributeError, match=r"has no attribute 'var_G_nope'"):
        theory.var_G_nope  # noqa: B018
    assert not hasattr(theory, "var_G_seed")


def test_naive_approximation_is_sigma2_over_T():
    """``var_G_naive`` is sigma^2 / T, listed under method ``naive``; tidy refuses a non-tidy name."""
    fam = get_family("gamma", 1.0, 0.3)
    T = [1, 7, 1000]
    np.testing.assert_allclose(theory.var_G_naive(fam, T), [0.3, 0.3 / 7, 0.3 / 1000], rtol=1e-15)
    assert "var_G_naive" in theory.QUANTITIES
    assert "var_G_seed" not in theory.QUANTITIES
    tidy = theory.tidy(fam, T, quantities=["var_G_naive"])
    assert set(zip(tidy["statistic"], tidy["method"], strict=True)) == {("var_G", "naive")}
    with pytest.raises(ValueError, match="unknown quantity 'kurtosis_P'"):
        theory.tidy(fam, T, quantities=["kurtosis_P"])  # a quantity with no tidy statistic


def test_summary_columns_and_tidy():
    """The summary has the table columns and its ratio; tidy holds the same exact values."""
    fam = get_family("lognormal", 1.0, 0.1)
    df = theory.summary(fam, [1, 10, 100, 1000])
    assert list(df.columns) == list(theory.TABLE_COLUMNS)
    assert df["ratio"].iloc[1] == pytest.approx(df["var_P"].iloc[1] / df["var_G"].iloc[1], rel=1e-12)
    tidy = theory.tidy(fam, [1, 10])
    exact_var_G = tidy.query("statistic == 'var_G' and method == 'exact'")["value"].to_numpy()
    np.testing.assert_array_equal(exact_var_G, df["var_G"].to_numpy()[:2])
    assert set(tidy["method"]) == {"exact", "lognormal", "delta", "naive"}


# ---------------------------------------------------------------- properties
FAMILY = st.sampled_from(["lognormal", "gamma", "two-point"])
MU = st.floats(0.5, 2.0)
S2 = st.floats(1e-4, 10.0)


def _family(name, mu, s2):
    if name == "two-point":
        s2 = min(s2, 0.9 * mu**2)
    return get_family(name, mu, s2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FAMILY, st.floats(1.0, 2.0), S2, st.integers(1, 5000))
def test_var_P_nonnegative_and_increasing_when_mu_at_least_one(name, mu, s2, T):
    """For mu >= 1, Var(P_T) is non-negative and increases with T (hypothesis)."""
    fam = _family(name, mu, s2)
    lo, hi = theory.var_P(fam, [T, T + 1], log10=True)
    assert theory.var_P(fam, T) >= 0
    assert hi > lo


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FAMILY, MU, S2)
def test_var_G_vanishes_like_one_over_T(name, mu, s2):
    """Var(G_T) decreases and T Var(G_T) approaches sigma_y^2 exp(2 mu_y) (hypothesis)."""
    fam = _family(name, mu, s2)
    T = np.array([10**4, 10**5, 10**6])
    v = theory.var_G(fam, T)
    assert np.all(np.diff(v) < 0)
    limit = fam.var_log * math.exp(2 * fam.mean_log)
    # T Var(G_T) -> sigma_y^2 exp(2 mu_y), with a correction of order 1/T
    assert abs(T[-1] * v[-1] / limit - 1) < abs(T[0] * v[0] / limit - 1) + 1e-9


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FAMILY, MU, S2)
def test_var_G_equals_var_P_at_T_one(name, mu, s2):
    """At T = 1, Var(G_T) = Var(P_T) = sigma^2 (hypothesis)."""
    fam = _family(name, mu, s2)
    assert theory.var_G(fam, 1) == pytest.approx(theory.var_P(fam, 1), rel=1e-12)
    assert theory.var_P(fam, 1) == pytest.approx(fam.sigma2, rel=1e-12)


# ---------------------------------------------------------------- the float path (theory.grid)
GRID_FAMILIES = [
    ("lognormal", {}),
    ("gamma", {}),
    ("two-point", {}),
    ("ar1", {"rho": 0.5}),
    ("ar1", {"rho": -0.3}),
]
_COLUMN_QUANTITY = {"ratio": "var_ratio"}


def _check_grid(name, shape, mus, s2s, Ts):
    """Check every column of theory.grid against the reference.

    Rows computed in float64 and with mpmath alike; returns the fraction of rows computed in
    float64.
    """
    floats = total = 0
    for mu in mus:
        reach = [s2 for s2 in s2s if name != "two-point" or s2 < mu**2]  # q = 1/2
        df = theory.grid(name, mu=mu, sigma2=reach, T=Ts, **shape)
        assert list(df.columns) == ["family", "mu", "sigma2", *shape, *theory.TABLE_COLUMNS, "precise"]
        _check_rows(df, name, shape)
        floats += int((~df["precise"]).sum())
        total += len(df)
    return floats / total


@pytest.mark.parametrize(("name", "shape"), GRID_FAMILIES)
def test_grid_against_mpmath(name, shape):
    """Check a few dozen points per family against the reference.

    mu in [0.5, 2], sigma^2 in [1e-3, 10], T up to 1e6, every column to 1e-9 (draws-needed
    columns included).
    """
    frac = _check_grid(name, shape, [0.5, 1.3, 2.0], [1e-3, 0.05, 2.5, 10.0], [1, 7, 1000, 10**6])
    assert frac >= 0.8  # the float path, not the fallback, computes most of them (T = 1e6 corners fall back)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "shape"), GRID_FAMILIES)
def test_grid_against_mpmath_full(name, shape):
    """The full (mu, sigma^2, T) grid agrees with mpmath, at least 80 % of it from the float path."""
    mus = list(np.linspace(0.5, 2.0, 7))
    s2s = list(np.logspace(-3, 1, 9))
    Ts = [1, 2, 3, 5, 10, 30, 100, 1000, 10**4, 10**5, 10**6]
    assert _check_grid(name, shape, mus, s2s, Ts) >= 0.8


def test_grid_layout_and_shape_axes():
    """The rows of ``grid`` follow its axes in order and equal summary for each point."""
    df = theory.grid("two-point", mu=[1.0, 2.0], sigma2=[0.1, 0.2, 0.3], q=[0.4, 0.5], T=[1, 10])
    assert len(df) == 2 * 3 * 2 * 2
    assert list(df.columns[:4]) == ["family", "mu", "sigma2", "q"]
    first = df.iloc[:2]
    assert list(first["T"]) == [1, 10]
    assert set(first["q"]) == {0.4}
    assert set(first["sigma2"]) == {0.1}
    assert list(df["mu"]) == [1.0] * 12 + [2.0] * 12
    one = get_family("two-point", 2.0, 0.3, q=0.5)
    row = df[(df["mu"] == 2.0) & (df["sigma2"] == 0.3) & (df["q"] == 0.5)]
    want = theory.summary(one, [1, 10])
    for col in theory.TABLE_COLUMNS:
        np.testing.assert_allclose(row[col].to_numpy(), want[col].to_numpy(), rtol=1e-13)
    default_q = theory.grid("two-point", mu=1.0, sigma2=0.1, T=10)  # the family's default q
    assert "q" not in default_q
    assert default_q["var_G"].iloc[0] == pytest.approx(
        theory.var_G(get_family("two-point", 1.0, 0.1), 10), rel=1e-13
    )


def test_grid_skips_unreachable_points_on_request():
    """``grid`` refuses unreachable points unless skip_unreachable, and still refuses bad input."""
    kwargs = {"mu": [0.5, 1.0], "sigma2": [0.1, 0.5], "T": [1, 10]}
    with pytest.raises(ValueError, match=r"two-point family cannot reach sigma2=0\.5 with mu=0\.5"):
        theory.grid("two-point", **kwargs)
    df = theory.grid("two-point", skip_unreachable=True, **kwargs)
    assert sorted(set(zip(df["mu"], df["sigma2"], strict=True))) == [(0.5, 0.1), (1.0, 0.1), (1.0, 0.5)]
    with pytest.raises(ValueError, match="no reachable point in the grid: two-point family cannot reach"):
        theory.grid("two-point", mu=0.5, sigma2=0.5, T=1, skip_unreachable=True)
    with pytest.raises(ValueError, match=r"sigma2 must be >= 0, got -1\.0"):  # bad input is not skipped
        theory.grid("two-point", mu=1.0, sigma2=[0.1, -1.0], T=1, skip_unreachable=True)


def test_grid_degenerate_ratio():
    """``grid`` at sigma^2 = 0 equals the precise summary without falling back."""
    df = theory.grid("gamma", mu=[0.5, 2.0], sigma2=0.0, T=[1, 1000])
    want = pd.concat(
        [theory.summary(get_family("gamma", m, 0.0), [1, 1000], precise=True) for m in (0.5, 2.0)]
    )
    for col in theory.TABLE_COLUMNS:
        np.testing.assert_allclose(df[col].to_numpy(), want[col].to_numpy(), rtol=1e-12)
    assert not df["precise"].any()


def test_fallback_to_mpmath_is_marked(monkeypatch):
    """Points that fail the float check fall back to mpmath and are marked precise."""
    from variance_lab.theory import fast

    fam = get_family("gamma", 0.7, 3.0)
    slow = theory.summary(fam, [1, 10, 1000], precise=True)
    monkeypatch.setattr(fast, "TOLERANCE", -1.0)  # nothing is certified: every point falls back
    monkeypatch.setattr(fast, "TOLERANCE_LOG", -1.0)
    df = theory.grid("gamma", mu=0.7, sigma2=3.0, T=[1, 10, 1000])
    assert df["precise"].all()
    for col in theory.TABLE_COLUMNS:
        np.testing.assert_array_equal(df[col].to_numpy(), slow[col].to_numpy())
    np.testing.assert_array_equal(theory.var_G(fam, [1, 10, 1000]), slow["var_G"].to_numpy())


def test_family_without_float_path_uses_mpmath(monkeypatch):
    """A family without a float path is computed by mpmath and marked precise."""
    from variance_lab.theory import fast

    monkeypatch.delitem(fast.FAST_FAMILIES, "lognormal")
    df = theory.grid("lognormal", mu=1.0, sigma2=0.1, T=[1, 100])
    assert df["precise"].all()
    want = theory.summary(get_family("lognormal", 1.0, 0.1), [1, 100], precise=True)
    np.testing.assert_array_equal(df["var_G"].to_numpy(), want["var_G"].to_numpy())


def test_precise_and_float_paths_agree():
    """The float and mpmath paths agree for the summary and every quantity."""
    fam = get_family("two-point", 1.3, 0.4, q=0.3)
    T = [1, 3, 100, 10**5]
    a, b = theory.summary(fam, T), theory.summary(fam, T, precise=True)
    for col in theory.TABLE_COLUMNS:
        np.testing.assert_allclose(a[col].to_numpy(), b[col].to_numpy(), rtol=1e-9, atol=1e-15)
    for q in theory.QUANTITIES:
        fast_v = theory.value(q, fam, T, n=1000, log10=True)
        slow_v = theory.value(q, fam, T, n=1000, log10=True, precise=True)
        np.testing.assert_allclose(fast_v, slow_v, rtol=0, atol=1e-9, err_msg=q)


def test_tidy_many_is_tidy_concatenated():
    """tidy_many equals tidy per family concatenated, and refuses no families."""
    fams = [
        get_family("lognormal", 1.0, 0.1),
        get_family("gamma", 2.0, 0.5),
        get_family("ar1", 1.0, 0.1, rho=0.5),
    ]
    many = theory.tidy_many(fams, [1, 10], quantities=["var_P", "var_G_naive", "n_needed_G"])
    one = pd.concat(
        [theory.tidy(f, [1, 10], quantities=["var_P", "var_G_naive", "n_needed_G"]) for f in fams],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(many, one)
    with pytest.raises(ValueError, match="families must not be empty"):
        theory.tidy_many([], [1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"family": "nope"}, "unknown family 'nope'"),
        ({"mu": -1.0}, "mu must be > 0, got -1.0"),
        ({"sigma2": [0.1, -2.0]}, "sigma2 must be >= 0, got -2.0"),
        ({"T": [1, 0]}, "T must be integers >= 1, got 0"),
        ({"mu": []}, "mu must not be empty"),
        ({"target": 0.0}, "target must be a finite number > 0, got 0.0"),
        ({"family": "two-point", "sigma2": 2.0}, "two-point family cannot reach sigma2=2.0"),
        ({"rho": 0.5}, "family 'lognormal' has no parameter 'rho'"),
        ({"family": "ar1", "rho": [0.5, 1.0]}, "ar1 rho must lie in"),
    ],
)
def test_grid_bad_input(kwargs, match):
    """``grid`` raises ValueError with the expected message on bad input."""
    args = {"family": "lognormal", "mu": 1.0, "sigma2": 0.1, "T": [1, 10], **kwargs}
    with pytest.raises(ValueError, match=match):
        theory.grid(args.pop("family"), **args)


# ---------------------------------------------------------------- random-scale
def test_random_scale_var_P_infinite_exactly_from_one_over_theta():
    """Random-scale Var(P_T) is infinite exactly from T = 1/theta on, the kurtosis from 6 T theta >= 1."""
    fam = get_family("random-scale", 1.0, 0.1, alpha=1.0)  # theta = 1 - 1.1^-1 = 1/11
    assert fam.critical_T == pytest.approx(11.0, rel=1e-12)
    T = [10, 11, 12, 1000]
    v = theory.var_P(fam, T)
    assert math.isfinite(v[0])
    assert np.all(np.isinf(v[1:]))
    assert np.all(np.isinf(theory.var_P(fam, T[1:], log10=True)))
    assert np.all(np.isinf(theory.n_needed_P(fam, T[1:])))
    assert np.all(theory.ess_frac_P(fam, T[1:]) == 0.0)
    # the fourth moment goes first: kurtosis and draws needed are infinite from 6 T theta >= 1 on
    assert math.isinf(theory.kurtosis_P(fam, 2))
    assert math.isfinite(theory.kurtosis_P(fam, 1))


@pytest.mark.parametrize(("mu", "s2", "alpha"), [(1.0, 0.1, 1.0), (0.8, 1e-3, 0.2), (1.5, 2.0, 5.0)])
def test_random_scale_var_G_levels_off(mu, s2, alpha):
    """Random-scale Var(G_T) approaches its mpmath limit, the gap falling like 1/T."""
    fam = get_family("random-scale", mu, s2, alpha=alpha)
    with mp.workdps(50):
        theta = _rs_theta(mu, s2, alpha)
        limit = float(mp.mpf(mu) ** 2 * ((1 + theta) ** -alpha - (1 + theta / 2) ** (-2 * alpha)))
    assert fam.var_G_limit() == pytest.approx(limit, rel=1e-12)
    v = theory.var_G(fam, [10**3, 10**4, 10**6])
    # Var(G_T) does not fall like 1/T: its gap to the limit does (a factor 100 from T = 10^4 to 10^6)
    gap = np.abs(v / limit - 1)
    assert gap[-1] < 1e-3
    assert 90 < gap[1] / gap[2] < 110
    assert v[-1] > 0.5 * v[0]


@pytest.mark.parametrize(("mu", "s2"), [(1.0, 0.1), (0.7, 1e-3), (2.0, 3.0)])
def test_random_scale_alpha_to_infinity_is_lognormal(mu, s2):
    """Var(v) = alpha theta^2 -> 0: every quantity tends to the lognormal one, the gap like 1/alpha."""
    ln = get_family("lognormal", mu, s2)
    T = [1, 10, 100]
    for q in ("var_P", "var_G", "mean_G", "kurtosis_P", "n_needed_G"):
        want = theory.value(q, ln, T)
        gaps = []
        for alpha in (1e6, 1e8, 1e10):
            got = theory.value(q, get_family("random-scale", mu, s2, alpha=alpha), T)
            gaps.append(np.max(np.abs(got / want - 1)))
        assert gaps[-1] < 1e-5, (q, gaps)
        assert gaps[1] < gaps[0] / 50, (q, gaps)  # about 1/alpha
        assert gaps[2] < gaps[1] / 50, (q, gaps)


# ---------------------------------------------------------------- float path: random-scale, mixtures
RS_ALPHAS = [0.1, 1.0, 10.0, 1e4]
GRID_MIXTURES = [
    "0.98:0:1e-8,0.02:-0.005:0.01",  # the sparse heavy-tailed tokens
    "0.5:-0.1:0.05,0.3:0.05:0.2,0.2:0.2:0",  # three components, one a point mass
    "0.6:-0.3:0.4,0.4:0.4:1",  # wide components (sigma^2 = 5.0)
]


def _check_rows(df, name, shape_keys):
    """Check every table column of ``df`` against the reference; return the share computed in float64."""
    for row in df.to_dict("records"):
        params = {k: row[k] for k in shape_keys}
        ref = reference(name, row["mu"], row["sigma2"], int(row["T"]), **params)
        for col in theory.TABLE_COLUMNS[1:]:
            base = col.removeprefix("log10_")
            q = _COLUMN_QUANTITY.get(base, base)
            if q not in ref:  # var_ratio when Var(G_T) = 0
                assert math.isnan(row[col]), (col, row)
            elif col.startswith("log10_"):
                _check_log(q, row[col], ref[q], REL)
            else:
                _check_lin(q, row[col], ref[q], REL)
    return 1.0 - float(df["precise"].mean())


def test_grid_random_scale_against_mpmath():
    """random-scale in float64: every column to 1e-9, alpha an axis, infinite moments as mpmath has them.

    mu in {0.5, 2}, sigma^2 in {1e-3, 10}, alpha from 0.1 (theta near 1) to 1e4 (near lognormal),
    T from 1 to 1e6, so Var(P_T) and the fourth moment are infinite on part of the grid.
    """
    df = theory.grid(
        "random-scale", mu=[0.5, 2.0], sigma2=[1e-3, 10.0], alpha=RS_ALPHAS, T=[1, 2, 10, 1000, 10**6]
    )
    assert list(df.columns) == ["family", "mu", "sigma2", "alpha", *theory.TABLE_COLUMNS, "precise"]
    assert np.isinf(df["var_P"]).sum() > 10  # beyond 1/theta
    assert _check_rows(df, "random-scale", ["alpha"]) >= 0.9


@pytest.mark.parametrize("components", GRID_MIXTURES)
def test_grid_mixture_against_mpmath(components):
    """lognormal-mixture in float64: every column to 1e-9 for T from 1 to 1e6, mu and sigma^2 derived."""
    df = theory.grid("lognormal-mixture", components=components, T=[1, 2, 10, 1000, 10**6])
    fam = get_family("lognormal-mixture", components=components)
    assert list(df.columns) == ["family", "mu", "sigma2", "components", *theory.TABLE_COLUMNS, "precise"]
    assert set(df["mu"]) == {fam.mu}
    assert set(df["sigma2"]) == {fam.sigma2}
    assert _check_rows(df, "lognormal-mixture", ["components"]) >= 0.8


def test_grid_alpha_axis_and_mixture_list():
    """Random-scale's alpha is an axis like q; a list of mixtures gives one block of rows each."""
    df = theory.grid("random-scale", mu=1.0, sigma2=0.1, T=[10, 1000], alpha=[0.5, 1, 2])
    assert list(df["alpha"]) == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    for alpha in (0.5, 1, 2):
        want = theory.summary(get_family("random-scale", 1.0, 0.1, alpha=alpha), [10, 1000])
        got = df[df["alpha"] == alpha]
        for col in theory.TABLE_COLUMNS:
            np.testing.assert_array_equal(got[col].to_numpy(), want[col].to_numpy())
    mix = theory.grid("lognormal-mixture", components=GRID_MIXTURES[:2], T=[1, 10])
    assert len(mix) == 4
    for comps, block in zip(GRID_MIXTURES[:2], (mix.iloc[:2], mix.iloc[2:]), strict=True):
        fam = get_family("lognormal-mixture", components=comps)
        assert set(block["components"]) == {fam.describe()["components"]}
        np.testing.assert_array_equal(block["var_G"].to_numpy(), theory.var_G(fam, [1, 10]))
    with pytest.raises(ValueError, match="lognormal-mixture derives mu and sigma2"):
        theory.grid("lognormal-mixture", mu=1.0, components=GRID_MIXTURES[0], T=1)
    with pytest.raises(ValueError, match="needs mu and sigma2"):
        theory.grid("random-scale", T=1, alpha=1.0)


def test_random_scale_boundary_falls_back_to_mpmath():
    """At theta T = 1 float64 cannot tell the sign of the bracket: that row falls back to mpmath.

    alpha = 1, mu = 1, sigma^2 = 0.1: theta = 1/11 up to rounding, so T = 11 is flagged precise
    and equals the mpmath path; its neighbours are computed in float64.
    """
    df = theory.grid("random-scale", mu=1.0, sigma2=0.1, alpha=1.0, T=[10, 11, 12])
    assert list(df["precise"]) == [False, True, False]
    want = theory.summary(get_family("random-scale", 1.0, 0.1, alpha=1.0), [10, 11, 12], precise=True)
    for col in theory.TABLE_COLUMNS:
        np.testing.assert_allclose(df[col].to_numpy(), want[col].to_numpy(), rtol=1e-9)
    assert np.isinf(df["var_P"].iloc[2])
    assert np.isfinite(df["var_P"].iloc[0])


@pytest.mark.slow
@pytest.mark.parametrize("alpha", RS_ALPHAS)
def test_grid_random_scale_against_mpmath_full(alpha):
    """The full (mu, sigma^2, T) grid of random-scale agrees with mpmath.

    sigma^2 avoids 1: with mu = alpha = 1, theta = 1/2 exactly and T = 2 sits on the bracket's
    zero, where E[P_2^2] is infinite but no finite-precision reference can tell.
    """
    mus = list(np.linspace(0.5, 2.0, 4))
    s2s = list(np.geomspace(1e-3, 10.0, 6))
    Ts = [1, 2, 3, 5, 10, 30, 100, 1000, 10**4, 10**5, 10**6]
    df = theory.grid("random-scale", mu=mus, sigma2=s2s, alpha=alpha, T=Ts)
    assert _check_rows(df, "random-scale", ["alpha"]) >= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("components", list(dict.fromkeys([*GRID_MIXTURES, *MIXTURES])))
def test_grid_mixture_against_mpmath_full(components):
    """Every T of the full grid for each mixture agrees with mpmath."""
    Ts = [1, 2, 3, 5, 10, 30, 100, 1000, 10**4, 10**5, 10**6]
    df = theory.grid("lognormal-mixture", components=components, T=Ts)
    assert _check_rows(df, "lognormal-mixture", ["components"]) >= 0.8
