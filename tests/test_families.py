"""Families: K(s) against scipy numerical integration, log-moments, reach, bad input."""

import itertools
import math

import mpmath
import numpy as np
import pytest
from scipy import integrate, stats

from variance_lab.families import FAMILIES, Gamma, LogNormal, TwoPoint, get_family
from variance_lab.stats.special import lgamma_ratio

#: Families whose mu and sigma2 are free parameters (a mixture derives them from its components).
FREE = [name for name, cls in FAMILIES.items() if not cls.derived_moments]

S_GRID = np.array([-0.5, 1e-6, 0.01, 0.1, 0.5, 1.0, 2.0, 3.0, 4.0])
PARAMS = [(0.5, 0.05), (1.0, 0.1), (1.0, 0.9), (2.0, 1.0), (1.5, 1e-4)]


def _scipy_dist(family):
    """Return an independent scipy.stats distribution of r with the family's mu, sigma2."""
    mu, s2 = family.mu, family.sigma2
    if isinstance(family, LogNormal):
        v = math.log(1 + s2 / mu**2)
        return stats.lognorm(s=math.sqrt(v), scale=mu * math.exp(-v / 2))
    if isinstance(family, Gamma):
        return stats.gamma(a=mu**2 / s2, scale=s2 / mu)
    raise TypeError(family)


def _log_moment_by_quadrature(dist, s):
    """Return log E[r^s], the log of the integral over y = log r of exp(s y) f_r(e^y) e^y, by scipy quad."""
    centre = math.log(dist.median())
    f = lambda y: math.exp(s * y + y + dist.logpdf(math.exp(y)) - s * centre)  # noqa: E731
    kw = {"epsabs": 0, "epsrel": 1e-13, "limit": 500}
    # +-200 in log r covers every tail that matters here (r from e^-200 to e^200); the
    # peak, about dist.std()/dist.mean() wide in log r, gets its own pieces.
    w = min(1.0, dist.std() / dist.mean())
    edges = [centre - 200, centre - 40 * w, centre - w, centre, centre + w, centre + 40 * w, centre + 200]
    pieces = [integrate.quad(f, a, b, **kw) for a, b in itertools.pairwise(edges)]
    val = sum(p[0] for p in pieces)
    err = sum(p[1] for p in pieces)
    return math.log(val) + s * centre, err / val  # log-moment and quad's own error bound on it


@pytest.mark.parametrize("cls", [LogNormal, Gamma])
@pytest.mark.parametrize(("mu", "sigma2"), PARAMS)
def test_K_matches_quadrature(cls, mu, sigma2):
    """K(s) of lognormal and gamma matches scipy quadrature of the distribution's density."""
    fam = cls(mu, sigma2)
    dist = _scipy_dist(fam)
    # Moments of the scipy distribution itself are mu and sigma2: an independent check
    # that the parametrisation is right.
    assert dist.mean() == pytest.approx(mu, rel=1e-12)
    assert dist.var() == pytest.approx(sigma2, rel=1e-10)
    # normalised by the s = 0 integral, so that the pdf's own rounding cancels
    ref, err = np.array([_log_moment_by_quadrature(dist, s) for s in S_GRID]).T
    ref0, err0 = _log_moment_by_quadrature(dist, 0.0)
    ref, err = ref - ref0, err + err0
    got = fam.K(S_GRID)
    # 1e-10 relative, or quadrature's own error estimate where that is larger (times 10)
    assert np.all(np.abs(got - ref) <= np.maximum(1e-10 * np.abs(ref), 10 * err) + 1e-14)


@pytest.mark.parametrize(("mu", "sigma2", "q"), [(1.0, 0.1, 0.5), (2.0, 3.0, 0.5), (1.0, 0.5, 0.8)])
def test_two_point_K_matches_direct_sum(mu, sigma2, q):
    """The two-point K(s) equals log(q a^s + (1 - q) b^s), with mean mu and variance sigma^2."""
    fam = TwoPoint(mu, sigma2, q=q)
    _, (q_, la, lb) = fam.sampler_params()
    a, b = math.exp(la), math.exp(lb)
    assert q_ * a + (1 - q_) * b == pytest.approx(mu, rel=1e-14)
    assert q_ * a * a + (1 - q_) * b * b - mu**2 == pytest.approx(sigma2, rel=1e-12)
    ref = [math.log(q * a**s + (1 - q) * b**s) for s in S_GRID]
    np.testing.assert_allclose(fam.K(S_GRID), ref, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", FREE)
@pytest.mark.parametrize(("mu", "sigma2"), [(1.0, 0.1), (0.7, 0.2), (2.0, 1e-4)])
def test_K_and_K_mp_agree_and_log_moments(name, mu, sigma2):
    """K and K_mp agree; K(1), K(2), mean_log and var_log match mu, sigma^2 and mpmath derivatives."""
    fam = get_family(name, mu, sigma2)
    assert fam.K(0.0) == pytest.approx(0.0, abs=1e-15)
    assert fam.K(1.0) == pytest.approx(math.log(mu), rel=1e-12, abs=1e-14)
    assert fam.K(2.0) == pytest.approx(math.log(sigma2 + mu**2), rel=1e-12, abs=1e-14)
    with mpmath.workdps(40):
        for s in (0.3, 1.7):
            assert float(fam.K_mp(s)) == pytest.approx(fam.K(s), rel=1e-12, abs=1e-15)
        # mean_log = K'(0), var_log = K''(0), by numerical differentiation of K_mp
        d1 = mpmath.diff(fam.K_mp, 0, 1)
        d2 = mpmath.diff(fam.K_mp, 0, 2)
    assert fam.mean_log == pytest.approx(float(d1), rel=1e-12, abs=1e-15)
    assert fam.var_log == pytest.approx(float(d2), rel=1e-10)


@pytest.mark.parametrize("name", FREE)
def test_degenerate_sigma2_zero(name):
    """With sigma^2 = 0 each family is the point mass at mu, with sampler code 0."""
    fam = get_family(name, 1.3, 0.0)
    assert fam.degenerate
    np.testing.assert_allclose(fam.K([0.5, 2.0]), [0.5 * math.log(1.3), 2 * math.log(1.3)], rtol=1e-15)
    assert fam.var_log == 0.0
    code, params = fam.sampler_params()
    assert code == 0
    assert params[0] == pytest.approx(math.log(1.3))


def test_sampler_params_codes():
    """Each family's sampler code and gamma's shape and log scale."""
    assert LogNormal(1, 0.1).sampler_params()[0] == 1
    code, (k, log_scale) = Gamma(2.0, 0.5).sampler_params()
    assert code == 2
    assert k == pytest.approx(8.0)
    assert log_scale == pytest.approx(math.log(0.25))
    assert TwoPoint(1, 0.1).sampler_params()[0] == 3


def test_two_point_reach():
    """Two-point families beyond the reachable sigma^2 or with q outside (0, 1) raise ValueError."""
    with pytest.raises(ValueError, match=r"cannot reach sigma2=1\.0"):
        TwoPoint(1.0, 1.0)
    with pytest.raises(ValueError, match=r"sigma2=4\.01"):
        TwoPoint(1.0, 4.01, q=0.8)  # limit is mu**2 q / (1 - q) = 4
    TwoPoint(1.0, 3.99, q=0.8)
    with pytest.raises(ValueError, match="q must lie in"):
        TwoPoint(1.0, 0.1, q=1.0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("lognormal", 0.0, 0.1), "mu must be > 0, got 0.0"),
        (("gamma", -1.0, 0.1), r"mu must be > 0, got -1\.0"),
        (("lognormal", 1.0, -0.1), r"sigma2 must be >= 0, got -0\.1"),
        (("lognormal", float("nan"), 0.1), "mu must be finite, got nan"),
        (("gamma", 1.0, float("inf")), "sigma2 must be finite, got inf"),
        (("cauchy", 1.0, 0.1), "unknown family 'cauchy'"),
        (("lognormal", "1", 0.1), "mu must be a real number, got '1'"),
    ],
)
def test_bad_input(args, match):
    """Bad mu, sigma^2 or family name raises ValueError naming the bad value."""
    with pytest.raises(ValueError, match=match):
        get_family(*args)


def test_ar1_parameters():
    """The AR(1) family's sampler parameters and marginal moments; rho on other families raises."""
    fam = get_family("ar1", 1.0, 0.1, rho=0.5)
    code, (_, sd, rho) = fam.sampler_params()
    assert code == 4
    assert rho == 0.5
    assert sd == pytest.approx(math.sqrt(math.log(1.1)))
    assert fam.K(2.0) == pytest.approx(math.log(1.1), rel=1e-13)  # marginal moments
    with pytest.raises(ValueError, match=r"rho must lie in \(-1, 1\), got 1\.0"):
        get_family("ar1", 1.0, 0.1, rho=1.0)
    with pytest.raises(ValueError, match="family 'lognormal' has no parameter 'rho'; it takes no extra"):
        get_family("lognormal", 1.0, 0.1, rho=0.5)
    with pytest.raises(ValueError, match="family 'two-point' has no parameter 'rho'; it takes only q"):
        get_family("two-point", 1.0, 0.1, rho=0.5)


def test_families_are_hashable_values():
    """Families with equal parameters are equal and hash alike; different families differ."""
    assert LogNormal(1, 0.1) == LogNormal(1.0, 0.1)
    assert hash(Gamma(1, 0.1)) == hash(Gamma(1.0, 0.1))
    assert LogNormal(1, 0.1) != Gamma(1, 0.1)


# ---------------------------------------------------------------- random-scale, lognormal-mixture
def test_random_scale_moments_by_simulating_its_definition():
    """Check E[P_T^s] = mu^(sT) (1 - theta T s(s-1)/2)^(-alpha) against draws of the model.

    The model as defined: v ~ Gamma(alpha, theta), then log P_T | v ~ N(T (log mu - v/2), T v);
    within 4 standard errors.
    """
    fam = get_family("random-scale", 1.1, 0.05, alpha=0.7)
    rng = np.random.default_rng(np.random.SeedSequence(20261201))
    n = 400_000
    for T, s in ((1, 0.5), (5, 1.0 / 5), (20, 0.5), (3, -1.0)):
        v = rng.gamma(fam.alpha, fam.theta, n)
        logp = T * (math.log(fam.mu) - v / 2) + np.sqrt(T * v) * rng.standard_normal(n)
        x = np.exp(s * logp)
        with mpmath.workdps(30):
            want = float(mpmath.exp(fam.cgf_sum_mp(T, s)))
        assert abs(x.mean() - want) < 4 * x.std() / math.sqrt(n), (T, s, x.mean(), want)


def test_random_scale_parameters_and_errors():
    """Random-scale derives theta from alpha, describes itself, refuses alpha <= 0, and has a sampler."""
    fam = get_family("random-scale", 1.0, 0.1, alpha=2.0)
    assert fam.theta == pytest.approx(1 - 1.1**-0.5, rel=1e-14)
    assert fam.describe() == {"family": "random-scale", "mu": 1.0, "sigma2": 0.1, "alpha": 2.0}
    assert math.isinf(fam.K(4.0 + 1e-9 + math.sqrt(1 + 8 / fam.theta) / 2))  # bracket <= 0
    with pytest.raises(ValueError, match=r"alpha must be > 0, got -1\.0"):
        get_family("random-scale", 1.0, 0.1, alpha=-1.0)
    code, par = fam.sampler_params()
    assert code == 5
    np.testing.assert_array_equal(par, [0.0, 2.0, fam.theta])


def test_random_scale_var_sum_against_quadrature():
    """Var(log P_T) = T alpha theta + T^2 alpha theta^2 / 4 against quadrature over v of E[. | v]."""
    fam = get_family("random-scale", 1.3, 0.2, alpha=0.7)
    a, th = fam.alpha, fam.theta
    for T in (1, 10, 1000):
        m = T * math.log(1.3)

        def moment(k, T=T, m=m):
            # E[(log P_T)^k | v] for log P_T | v ~ N(m - T v / 2, T v), k = 1, 2
            def f(v):
                mean = m - T * v / 2
                return (mean if k == 1 else mean * mean + T * v) * stats.gamma.pdf(v, a, scale=th)

            return integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-12, limit=200)[0]

        var = moment(2) - moment(1) ** 2
        assert float(fam.var_sum_mp(T)) == pytest.approx(var, rel=1e-8)
    assert float(fam.var_sum_mp(1)) == pytest.approx(fam.var_log, rel=1e-14)


MIX = "0.98:0:1e-8,0.02:-0.005:0.01"


def test_mixture_K_against_numerical_integration():
    """K(s) = log E[r^s] against scipy quadrature of the mixture density of log r."""
    from scipy import integrate, stats

    fam = get_family("lognormal-mixture", components="0.6:-0.1:0.04,0.4:0.15:0.09")
    for s in (-1.0, 0.5, 1.0, 2.0, 3.0):

        def dens(y, s=s):
            return np.exp(s * y) * (0.6 * stats.norm.pdf(y, -0.1, 0.2) + 0.4 * stats.norm.pdf(y, 0.15, 0.3))

        val, _ = integrate.quad(dens, -6, 6, epsabs=0, epsrel=1e-12)
        assert fam.K(s) == pytest.approx(math.log(val), rel=1e-10, abs=1e-12)
    assert fam.mu == pytest.approx(math.exp(fam.K(1.0)), rel=1e-14)
    assert fam.sigma2 == pytest.approx(math.exp(fam.K(2.0)) - fam.mu**2, rel=1e-10)


def test_mixture_derives_mu_sigma2_and_describes_itself():
    """A lognormal mixture derives mu and the log moments from its components, in either spelling."""
    fam = get_family("lognormal-mixture", components=MIX)
    mu = 0.98 * math.exp(5e-9) + 0.02 * math.exp(-0.005 + 0.005)
    assert fam.mu == pytest.approx(mu, rel=1e-15)
    assert fam.describe()["components"] == "0.98:0.0:1e-08,0.02:-0.005:0.01"
    assert get_family("lognormal-mixture", fam.mu, fam.sigma2, components=MIX) == fam
    assert get_family("lognormal-mixture", components=[(0.98, 0, 1e-8), (0.02, -0.005, 0.01)]) == fam
    assert fam.mean_log == pytest.approx(-1e-4, rel=1e-12)
    assert fam.var_log == pytest.approx(0.98 * (1e-8 + 1e-8) + 0.02 * (0.01 + 0.0049**2), rel=1e-12)
    one = get_family("lognormal-mixture", components="1:0.2:0")
    assert one.degenerate
    assert one.mu == pytest.approx(math.exp(0.2), rel=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"components": "0.5:0:1e-8,0.4:0:0.01"}, "weights must sum to 1, got 0.9"),
        ({"components": "1:0"}, "component '1:0' must be weight:mean:variance"),
        ({"components": "1:x:0"}, "component '1:x:0' has a value that is not a number"),
        ({"components": "1.5:0:0,-0.5:0:0"}, r"component 1 weight must be > 0, got -0\.5"),
        ({"components": "1:0:-1"}, r"component 0 variance must be >= 0, got -1\.0"),
        ({"components": "1:nan:0"}, "component 0 mean must be finite, got nan"),
        ({"components": ""}, "component '' must be weight:mean:variance"),
        ({"components": MIX, "mu": 1.0}, "lognormal-mixture derives mu from its components"),
    ],
)
def test_mixture_bad_components(kwargs, match):
    """Bad mixture components raise ValueError with the expected message."""
    with pytest.raises(ValueError, match=match):
        get_family("lognormal-mixture", **kwargs)


def test_mixture_sampler_params():
    """The mixture's sampler vector: K, cumulative weights (last exactly 1), means, sds, conditional ones."""
    code, par = get_family(
        "lognormal-mixture", components="0.25:0.1:0.04,0.25:0:0,0.5:-0.2:0.09"
    ).sampler_params()
    assert code == 6
    np.testing.assert_allclose(
        par, [3, 0.25, 0.5, 1.0, 0.1, 0.0, -0.2, 0.2, 0.0, 0.3, 0.25, 1 / 3, 1.0], rtol=1e-15
    )
    assert par[3] == 1.0
    assert par[-1] == 1.0


def test_lgamma_ratio_both_branches_safe_against_mpmath():
    """Stirling branch for k, k + s >= 10, gammaln below; the unused branch raises no warning.

    np.where evaluates both branches: at s < -k the Stirling series took log1p(s / k) of a
    number below -1, a RuntimeWarning (an error in this suite) even though it was not used.
    """
    k, s = 11.0, np.array([-12.5, -3.0, 0.5, 40.0])
    got, _ = lgamma_ratio(k, s)
    with mpmath.workdps(40):
        want = [float(mpmath.log(abs(mpmath.gamma(k + x) / mpmath.gamma(k))) - x * mpmath.log(k)) for x in s]
    np.testing.assert_allclose(got, want, rtol=1e-12)
