"""Pure statistics: moments from power sums, intervals, ESS, Pareto k-hat."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from variance_lab import stats


def test_central_moments_from_power_sums():
    """Central moments from power sums about any reference match direct ones."""
    rng = np.random.default_rng(0)
    x = 3.0 + rng.gamma(2.0, size=10_000)
    c = 4.7  # any fixed reference near the mean
    sums = np.array([np.sum((x - c) ** k) for k in range(1, 5)])
    d, m2, m3, m4 = stats.central_moments(sums, x.size)
    xc = x - x.mean()
    assert c + d == pytest.approx(x.mean(), rel=1e-13)
    assert m2 == pytest.approx(np.mean(xc**2), rel=1e-11)
    assert m3 == pytest.approx(np.mean(xc**3), rel=1e-9)
    assert m4 == pytest.approx(np.mean(xc**4), rel=1e-9)


def test_central_moments_vectorised_and_clipped():
    """Central moments work on stacked sums, and zero data give zero moments."""
    sums = np.zeros((2, 3, 4))
    d, m2, _, m4 = stats.central_moments(sums, 5)
    assert d.shape == m2.shape == (2, 3)
    assert np.all(m2 == 0)
    assert np.all(m4 == 0)


def test_z_value():
    """The normal quantile for a 95 % level; levels outside (0, 1) or non-numbers raise."""
    assert stats.z_value(0.95) == pytest.approx(1.959963984540054)
    for bad in (0, 1, 1.5, -0.1, True, "0.95"):
        with pytest.raises(ValueError, match="ci"):
            stats.z_value(bad)


def test_var_interval():
    """The variance interval is log-symmetric with the kurtosis-based standard error; zero stays zero."""
    v, kurt, n = 2.0, 3.0, 1000
    lo, hi, se = stats.var_interval(v, kurt, n)
    rho = math.sqrt((kurt - (n - 3) / (n - 1)) / n)
    assert se == pytest.approx(v * rho)
    assert lo == pytest.approx(v * math.exp(-1.959963984540054 * rho))
    assert hi == pytest.approx(v * math.exp(1.959963984540054 * rho))
    assert 0 < lo < v < hi
    lo, hi, se = stats.var_interval(0.0, np.nan, n)  # zero variance: zero-width interval
    assert lo == hi == se == 0.0


def test_var_se_normal_data():
    """For normal data (kurtosis 3) the relative SE is sqrt(2/n); a kurtosis below (n-3)/(n-1) gives 0."""
    assert stats.var_se(3.0, 10**6) == pytest.approx(math.sqrt(2 / 10**6), rel=1e-5)
    assert stats.var_se(0.5, 100) == 0.0  # clipped, never NaN


def test_mean_interval():
    """The mean interval is symmetric, with the SE sqrt(var/n) and the normal quantile."""
    lo, hi, se = stats.mean_interval(1.0, 4.0, 100, 0.9)
    assert se == pytest.approx(0.2)
    assert hi - 1.0 == pytest.approx(1.0 - lo) == pytest.approx(0.2 * 1.6448536269514722)


def test_ess_fraction():
    """Kong's ESS fraction is 1 for equal weights and 1/n for one dominant weight."""
    w = np.ones(10)
    assert stats.ess_fraction(w.mean(), np.mean(w**2)) == pytest.approx(1.0)
    w = np.array([1e6] + [1.0] * 99)
    assert stats.ess_fraction(w.mean(), np.mean(w**2)) == pytest.approx(1 / 100, rel=1e-3)


@pytest.mark.parametrize("k", [-0.2, 0.0, 0.5, 0.9])
def test_gpd_fit_agrees_with_scipy(k):
    """The generalised Pareto fit agrees with the true k and scipy's maximum likelihood fit."""
    x = sps.genpareto.rvs(k, scale=2.0, size=3000, random_state=np.random.default_rng(1))
    k_hat, sigma = stats.gpd_fit(x, prior=False)
    k_mle, _, s_mle = sps.genpareto.fit(x, floc=0)
    assert k_hat == pytest.approx(k, abs=0.1)
    assert k_hat == pytest.approx(k_mle, abs=0.03)
    assert sigma == pytest.approx(s_mle, rel=0.1)


def test_gpd_fit_needs_data():
    """Too few exceedances raise ValueError."""
    with pytest.raises(ValueError, match="exceedances"):
        stats.gpd_fit([1.0, 2.0])
    with pytest.raises(ValueError, match="exceedances"):
        stats.gpd_fit([0.0, 1, 2, 3, 4, 5])


def _psis_tail(logw):
    n = logw.size
    m = math.ceil(min(0.2 * n, 3 * math.sqrt(n)))
    return np.sort(logw)[-(m + 1) :]


def test_pareto_khat_orders_tails():
    """k-hat is small for light tails, large for heavy ones, and 0.8 for a Pareto(1/0.8) tail."""
    rng = np.random.default_rng(4)
    light = stats.pareto_khat(_psis_tail(0.3 * rng.standard_normal(10**5)))
    heavy = stats.pareto_khat(_psis_tail(3.0 * rng.standard_normal(10**5)))
    pareto = stats.pareto_khat(_psis_tail(np.log(sps.pareto.rvs(1 / 0.8, size=10**5, random_state=rng))))
    assert light < 0.3
    assert heavy > stats.KHAT_THRESHOLD
    assert pareto == pytest.approx(0.8, abs=0.1)  # Pareto with tail index 1/0.8: k = 0.8


def test_pareto_khat_undefined_cases():
    """k-hat is NaN for too few, tied or non-finite tail values."""
    assert math.isnan(stats.pareto_khat([1.0, 2.0, 3.0]))
    assert math.isnan(stats.pareto_khat(np.zeros(50)))  # all tied: no exceedances
    assert math.isnan(stats.pareto_khat([0.0] * 40 + [1.0] * 10))  # one distinct exceedance
    assert math.isnan(stats.pareto_khat([0.0, 1, 2, 3, np.inf, 5, 6]))


def test_pareto_khat_rows_is_pareto_khat_row_by_row():
    """The vectorised fit equals pareto_khat on every row (1e-12), its NaN cases and fallbacks included."""
    rng = np.random.default_rng(np.random.SeedSequence(31))
    tails = rng.standard_normal((600, 49)) * rng.uniform(0.01, 6.0, (600, 1))
    tails[:100] = np.sort(0.05 * rng.standard_normal((100, 256)), axis=1)[:, -49:]  # near-lognormal batches
    tails[100, :5] = tails[100, 5]  # ties at the threshold: through pareto_khat itself
    tails[101] = 1.0  # all tied: NaN
    tails[102, 3] = np.inf  # not finite: NaN
    tails[103] *= 1e3  # exceedances beyond e^700: the log-space path
    tails[104] = np.log(sps.pareto.rvs(1 / 0.8, size=49, random_state=rng))
    rows = stats.pareto_khat_rows(tails)
    one = np.array([stats.pareto_khat(t) for t in tails])
    assert np.array_equal(np.isnan(rows), np.isnan(one))
    assert np.isnan(one[[101, 102]]).all()
    assert np.allclose(rows, one, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert stats.pareto_khat_rows(np.zeros((0, 49))).shape == (0,)
    with pytest.raises(ValueError, match="2-D"):
        stats.pareto_khat_rows(np.zeros(49))


def _zhang_stephens_mp(log_x, dps=60):
    """Zhang and Stephens' estimator (no prior) in mpmath, from log exceedances.

    An independent high-precision reference whose exponentials never underflow.
    """
    import mpmath as mp

    with mp.workdps(dps):
        x = sorted(mp.e ** mp.mpf(float(v)) for v in log_x)
        M = len(x)
        m = 30 + int(math.sqrt(M))
        xq = x[int(M / 4.0 + 0.5) - 1]
        thetas = [
            1 / x[-1] + (1 - mp.sqrt(mp.mpf(m) / (j - mp.mpf(0.5)))) / (3 * xq) for j in range(1, m + 1)
        ]
        ks = [mp.fsum(mp.log(1 - t * xi) for xi in x) / M for t in thetas]
        ells = [M * (mp.log(-t / k) - k - 1) for t, k in zip(thetas, ks, strict=True)]
        top = max(ells)
        w = [mp.e ** (ell - top) for ell in ells]
        theta_hat = mp.fsum(t * wi for t, wi in zip(thetas, w, strict=True)) / mp.fsum(w)
        return float(mp.fsum(mp.log(1 - theta_hat * xi) for xi in x) / M)


@pytest.mark.parametrize("spread", [1.0, 30.0, 300.0, 3000.0])
def test_gpd_fit_log_matches_high_precision_reference(spread):
    """gpd_fit_log stays finite and matches the mpmath Zhang-Stephens fit over wide log spreads."""
    # log exceedances spread over `spread` nats: beyond 745 every linear weight but the top
    # underflows to 0 (the T = 1e6 crash: 57 values from 2.5e-323 to 1)
    rng = np.random.default_rng(int(spread))
    log_x = -spread * rng.random(40)
    k_hat, log_sigma = stats.gpd_fit_log(log_x, prior=False)
    assert math.isfinite(k_hat)
    assert math.isfinite(log_sigma)
    # the grid posterior drops weights below 10 eps, the reference keeps them: agreement to 1e-9
    assert k_hat == pytest.approx(_zhang_stephens_mp(log_x), rel=1e-9, abs=1e-12)


def test_gpd_fit_is_the_log_fit():
    """gpd_fit equals gpd_fit_log on the logs."""
    x = sps.genpareto.rvs(0.3, scale=2.0, size=500, random_state=np.random.default_rng(2))
    k, sigma = stats.gpd_fit(x)
    k_log, log_sigma = stats.gpd_fit_log(np.log(x))
    assert k == k_log
    assert sigma == pytest.approx(math.exp(log_sigma), rel=1e-15)


def test_pareto_khat_never_raises_on_spread_tails():
    """Tails of log P_T with the spread of T = 1e6 (sd ~ 300 nats): finite, no exception, no warning."""
    from variance_lab.simulate.plan import tail_size

    for n in (100, 1000, 10_000):
        for seed in range(20):
            logw = 309.0 * np.random.default_rng(seed).standard_normal(n)
            khat = stats.pareto_khat(np.sort(logw)[-tail_size(n) :])
            assert math.isfinite(khat)
            assert khat > stats.KHAT_THRESHOLD
