"""Theory against an independent 120-digit mpmath reference written here.

The reference never calls the code under test: it takes E[r^s] from each family's textbook
closed form, raises it to the power T (E[P_T^k] = E[r^k]^T, E[G_T^k] = E[r^(k/T)]^T), and
forms variances and fourth central moments by plain subtraction at a precision that
survives the cancellation. Log-moments come from numerical differentiation of log E[r^s].
"""

import math

import mpmath as mp
import numpy as np
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


def _moments(EX):
    """(mean, variance, m4 / variance^2) from raw moments E[X^k], k = 1..4."""
    e1, e2, e3, e4 = EX
    var = e2 - e1**2
    m4 = e4 - 4 * e3 * e1 + 6 * e2 * e1**2 - 3 * e1**4
    if abs(var) <= mp.mpf(10) ** (-DPS // 2) * e1**2:  # sigma2 = 0: a constant, up to rounding
        return e1, mp.mpf(0), mp.nan
    return e1, var, m4 / var**2


def _n_needed(kurt, target):
    """Root of rse(n) = target by bisection on log n (rse is decreasing in n; no quadratic formula)."""
    if mp.isnan(kurt):
        return mp.mpf(2)
    g = lambda n: (kurt - (n - 3) / (n - 1)) / n - mp.mpf(target) ** 2  # noqa: E731
    lo, hi = mp.log(1 + mp.mpf(10) ** -30), mp.log(2 * (kurt + 1) / mp.mpf(target) ** 2 + 10)
    for _ in range(120):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if g(mp.exp(mid)) > 0 else (lo, mid)
    return mp.exp((lo + hi) / 2)


def reference(name, mu, s2, T, target=0.1, rho=None):
    """Return every quantity of ``name`` at length T from raw moments in mpmath at DPS digits."""
    with mp.workdps(DPS):
        if name == "ar1":  # not i.i.d.: log P_T is Gaussian with the AR(1) variance
            P = _moments(_ar1_moments(mu, s2, rho, T, 1))
            G = _moments(_ar1_moments(mu, s2, rho, T, mp.mpf(1) / T))
            name = "lognormal"  # the marginal, for mu_y and sigma_y^2 below
        else:
            P = _moments([_raw_moment(name, mu, s2, k) ** T for k in (1, 2, 3, 4)])
            G = _moments([_raw_moment(name, mu, s2, mp.mpf(k) / T) ** T for k in (1, 2, 3, 4)])
        if s2 == 0:  # r = mu: G_T = mu exactly, the rounding residue of the powers dropped
            G = (mp.mpf(mu), mp.mpf(0), mp.nan)
            my, vy = mp.log(mu), mp.mpf(0)
        else:
            logmom = lambda s: mp.log(_raw_moment(name, mu, s2, s))  # noqa: E731
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
            "var_G_seed": mp.mpf(s2) / T,
            "ess_frac_P": P[0] ** 2 / (P[1] + P[0] ** 2),
            "kurtosis_P": P[2],
            "kurtosis_G": G[2],
            "n_needed_P": _n_needed(P[2], target),
            "n_needed_G": _n_needed(G[2], target),
        }
        if G[1] != 0:
            out["var_ratio"] = P[1] / G[1]
        return out


def _cases():
    for name in FAMILIES:
        for mu in MUS:
            for s2 in SIGMA2S:
                if name == "two-point" and s2 >= mu**2:
                    continue
                if name == "ar1":
                    yield from ((name, mu, s2, {"rho": rho}) for rho in (0.5, -0.3))
                else:
                    yield name, mu, s2, {}


def _check(q, got_lin, got_log, ref, rel):
    with mp.workdps(DPS):
        if mp.isnan(ref):
            assert math.isnan(got_lin), q
            return
        ref_log10 = float(mp.log10(abs(ref))) if ref != 0 else -math.inf
        ref_lin = float(ref)
    if q == "bias_G":  # bias may be exactly 0: an absolute floor of 1e-15
        assert abs(got_lin - ref_lin) <= rel * abs(ref_lin) + 1e-15, (q, got_lin, ref_lin)
        return
    if ref_lin != 0 and math.isfinite(ref_lin):
        assert abs(got_lin - ref_lin) <= rel * abs(ref_lin), (q, got_lin, ref_lin)
    else:  # beyond float range: the linear value saturates, never NaN
        assert got_lin == ref_lin, (q, got_lin, ref_lin)
    if math.isfinite(ref_log10):
        # |d log10| <= rel / ln 10 is a relative error <= rel of the linear value
        assert abs(got_log - ref_log10) <= rel / math.log(10) + 4e-16 * abs(ref_log10), (
            q,
            got_log,
            ref_log10,
        )
    else:
        assert got_log == ref_log10


@pytest.mark.parametrize(("name", "mu", "s2", "params"), list(_cases()))
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
    """The figures quoted in design.md for the seed's parameters."""
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


def test_summary_columns_and_tidy():
    """The summary has the table columns and its ratio; tidy holds the same exact values."""
    fam = get_family("lognormal", 1.0, 0.1)
    df = theory.summary(fam, [1, 10, 100, 1000])
    assert list(df.columns) == list(theory.TABLE_COLUMNS)
    assert df["ratio"].iloc[1] == pytest.approx(df["var_P"].iloc[1] / df["var_G"].iloc[1], rel=1e-12)
    tidy = theory.tidy(fam, [1, 10])
    exact_var_G = tidy.query("statistic == 'var_G' and method == 'exact'")["value"].to_numpy()
    np.testing.assert_array_equal(exact_var_G, df["var_G"].to_numpy()[:2])
    assert set(tidy["method"]) == {"exact", "lognormal", "delta", "seed"}


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
