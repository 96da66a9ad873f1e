"""Draws of the random-scale and lognormal-mixture families, token by token and aggregate.

Sample moments of log P_T, P_T and G_T against the families' exact cumulant generating
function within K_SE predicted standard errors (theory's moments, not the sample's), at
T on both sides of random-scale's 1/theta; the two samplers against each other; the
random-scale path's shared variance across T; degenerate and extreme parameters;
bit-identical results for any number of workers. Every draw is seeded.
"""

import math
from functools import lru_cache

import mpmath
import numpy as np
import pytest
from scipy import stats

from variance_lab.families import LognormalMixture, RandomScale
from variance_lab.families.base import CODE_MIXTURE, CODE_RANDOM_SCALE
from variance_lab.simulate import Engine, run_accumulators, simulate
from variance_lab.simulate.draws import AGGREGATE_CODES, KNOWN_CODES, draw_log_r
from variance_lab.simulate.kernels import draw_log_p

K_SE = 4.0  # tolerance in predicted standard errors
ALPHA = 1e-3  # two-sample KS: reject "same law" below this p-value (fixed before running)
GRID = (1, 2, 7, 40, 150)
N = 20_000

RANDOM_SCALE = [
    RandomScale(1.0, 0.1, alpha=4.0),  # theta = 0.0236: Var(P_T) finite up to T = 42
    RandomScale(1.2, 0.05, alpha=0.3),  # theta = 0.107: Var(P_T) infinite from T = 10 on
]
MIXTURES = [
    LognormalMixture(None, None, components="0.98:0:1e-8,0.02:-0.005:0.01"),
    LognormalMixture(None, None, components="0.5:-0.1:0.02,0.3:0.05:0.01,0.2:0.2:0"),
]
FAMILIES = RANDOM_SCALE + MIXTURES


def _ids(f):
    return f"{f.name}-{getattr(f, 'alpha', '')}{len(getattr(f, 'components', ()))}"


@lru_cache(maxsize=64)
def _draws(fam, sampler, seed, n=N, grid=GRID, independent=False):
    """Draw log P_T as a chunk draws them, (n, len(grid)); cached (read-only) so tests share draws."""
    code, par = fam.sampler_params()
    x = draw_log_p(
        code, par, np.array(grid), np.random.default_rng(seed), n, sampler=sampler, independent=independent
    )
    x.setflags(write=False)
    return x


def _log_p_cumulants(fam, T):
    """First, second and fourth cumulants of log P_T: derivatives of the family's cgf at 0 (mpmath)."""
    with mpmath.workdps(40):
        k = [mpmath.diff(lambda s: fam.cgf_sum_mp(T, s), 0, i) for i in (1, 2, 4)]
    return [float(x) for x in k]


def _exp_moments(fam, T, s0):
    """(mean, variance, 4th central moment), X = P_T^s0 from E[X^k] = exp(cgf(T, k s0)); None if infinite."""
    with mpmath.workdps(60):
        raw = [mpmath.exp(fam.cgf_sum_mp(T, k * mpmath.mpf(s0))) for k in range(5)]
        if any(mpmath.isinf(r) for r in raw):
            return None
        m = raw[1]
        mu2 = raw[2] - m**2
        mu4 = raw[4] - 4 * m * raw[3] + 6 * m**2 * raw[2] - 3 * m**4
        return float(m), float(mu2), float(mu4)


def test_codes_are_known_and_aggregate():
    """Both families have sampler codes the kernels know and an exact aggregate sampler."""
    assert RANDOM_SCALE[0].sampler_params()[0] == CODE_RANDOM_SCALE
    assert MIXTURES[0].sampler_params()[0] == CODE_MIXTURE
    assert {CODE_RANDOM_SCALE, CODE_MIXTURE} <= AGGREGATE_CODES <= KNOWN_CODES


def test_parameter_layouts():
    """random-scale: [log mu, alpha, theta]; mixture: [K, cumulative w, means, sds, conditional p]."""
    fam = RANDOM_SCALE[1]
    _, par = fam.sampler_params()
    np.testing.assert_array_equal(par, [math.log(1.2), 0.3, fam.theta])
    _, par = MIXTURES[1].sampler_params()
    np.testing.assert_allclose(
        par,
        [3, 0.5, 0.8, 1.0, -0.1, 0.05, 0.2, math.sqrt(0.02), 0.1, 0.0, 0.5, 0.6, 1.0],
        rtol=1e-15,
    )


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
@pytest.mark.parametrize("fam", FAMILIES, ids=_ids)
def test_log_p_moments(fam, sampler):
    """Mean and variance of log P_T within K_SE predicted standard errors, at every T of the grid."""
    x = _draws(fam, sampler, 1)
    assert np.all(np.isfinite(x))
    for j, T in enumerate(GRID):
        k1, k2, k4 = _log_p_cumulants(fam, int(T))
        assert k1 == pytest.approx(T * fam.mean_log, rel=1e-9, abs=1e-15)
        assert abs(x[:, j].mean() - k1) < K_SE * math.sqrt(k2 / N), T
        assert abs(x[:, j].var(ddof=1) - k2) < K_SE * math.sqrt((k4 + 2 * k2 * k2) / N), T


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
@pytest.mark.parametrize("fam", FAMILIES, ids=_ids)
def test_p_and_g_moments_where_finite(fam, sampler):
    """Mean and variance of P_T and G_T within K_SE standard errors where theory's moments are finite.

    Only where the fourth central moment is finite and the predicted relative error of the
    sample variance is at most 10 % (theory's own verdict of a reliable estimate).
    """
    x = _draws(fam, sampler, 1)
    checked = {"P": 0, "G": 0}
    for j, T in enumerate(GRID):
        for name, s0 in (("P", 1.0), ("G", 1.0 / T)):
            mom = _exp_moments(fam, int(T), s0)
            if mom is None:
                continue
            mean, mu2, mu4 = mom
            if mu2 == 0 or math.sqrt((mu4 / mu2**2 - 1) / N) > 0.1:
                continue
            y = np.exp(x[:, j] * s0)
            assert abs(y.mean() - mean) < K_SE * math.sqrt(mu2 / N), (name, T)
            assert abs(y.var(ddof=1) - mu2) < K_SE * math.sqrt((mu4 - mu2 * mu2) / N), (name, T)
            checked[name] += 1
    assert checked["P"] >= 1
    assert checked["G"] >= 3


def test_random_scale_variance_of_p_is_infinite_beyond_one_over_theta():
    """The second family's theory has infinite Var(P_T) at T = 40 and 150 of the grid, finite below."""
    fam = RANDOM_SCALE[1]
    assert 7 < fam.critical_T < 40
    assert _exp_moments(fam, 7, 1.0) is None  # E[P_7^4] already infinite
    assert [_exp_moments(fam, T, 1.0 / T) is not None for T in (40, 150)] == [True, True]  # G_T finite


@pytest.mark.parametrize(
    ("fam", "independent"),
    [(f, False) for f in FAMILIES] + [(RANDOM_SCALE[1], True), (MIXTURES[1], True)],
    ids=[_ids(f) for f in FAMILIES] + ["random-scale-independent", "mixture-independent"],
)
def test_samplers_agree_two_sample(fam, independent):
    """Token and aggregate draws of log P_T: means and variances within K_SE, and a two-sample KS test."""
    n = N
    tok = _draws(fam, "token", 1, n, independent=independent)
    agg = _draws(fam, "aggregate", 2, n, independent=independent)
    for j, T in enumerate(GRID):
        _, k2, k4 = _log_p_cumulants(fam, int(T))
        assert abs(tok[:, j].mean() - agg[:, j].mean()) < K_SE * math.sqrt(2 * k2 / n), T
        se_var = math.sqrt(2 * (k4 + 2 * k2 * k2) / n)
        assert abs(tok[:, j].var(ddof=1) - agg[:, j].var(ddof=1)) < K_SE * se_var, T
        assert stats.ks_2samp(tok[:, j], agg[:, j]).pvalue > ALPHA, T


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_random_scale_path_keeps_its_variance_across_T(sampler):
    """Cov(log P_T1, log P_T2) = T1 E[v] + T1 T2 Var(v)/4 along a path; about 0 for independent draws."""
    fam = RANDOM_SCALE[1]
    grid = (3, 20)
    a, th = fam.alpha, fam.theta
    want = 3 * a * th + 3 * 20 * a * th * th / 4
    for independent, expected in ((False, want), (True, 0.0)):
        x = _draws(fam, sampler, 3, grid=grid, independent=independent)
        prod = (x[:, 0] - x[:, 0].mean()) * (x[:, 1] - x[:, 1].mean())
        assert abs(prod.mean() - expected) < K_SE * prod.std() / math.sqrt(N), independent
    assert want > 10 * K_SE * prod.std() / math.sqrt(N)  # the check can tell the two apart


def test_random_scale_draw_log_r_is_one_sequence():
    """draw_log_r gives the tokens of one sequence: N(log mu - v/2, v) for a single v."""
    fam = RANDOM_SCALE[1]
    code, par = fam.sampler_params()
    for seed in range(3):
        y = draw_log_r(code, par, np.random.default_rng(seed), 20_000)
        v = y.var()
        assert abs(y.mean() - (math.log(fam.mu) - v / 2)) < K_SE * math.sqrt(v / y.size)
        assert stats.kstest((y - y.mean()) / y.std(), "norm").pvalue > ALPHA  # Gaussian given v


def test_mixture_components_with_zero_variance():
    """Zero-variance components give exact values, each with its weight's frequency (token draws)."""
    fam = LognormalMixture(None, None, components="0.2:-0.3:0,0.5:0:0,0.3:0.4:0")
    code, par = fam.sampler_params()
    y = draw_log_r(code, par, np.random.default_rng(4), 50_000)
    assert set(np.unique(y)) == {-0.3, 0.0, 0.4}
    for value, w in ((-0.3, 0.2), (0.0, 0.5), (0.4, 0.3)):
        assert abs(np.mean(y == value) - w) < K_SE * math.sqrt(w * (1 - w) / y.size)


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_mixture_counts_are_multinomial(sampler):
    """Zero-variance components: log P_5 = -0.3 c1 + 0.4 c3; chi-square of (c1, c3) vs the multinomial."""
    fam = LognormalMixture(None, None, components="0.2:-0.3:0,0.5:0:0,0.3:0.4:0")
    x = _draws(fam, sampler, 5, n=20_000, grid=(5,))[:, 0]
    cells = [(c1, c3) for c1 in range(6) for c3 in range(6 - c1)]  # -3 c1 + 4 c3 tells them apart
    values = np.array([-0.3 * c1 + 0.4 * c3 for c1, c3 in cells])
    idx = np.abs(x[:, None] - values[None, :]).argmin(axis=1)
    assert np.abs(x - values[idx]).max() < 1e-12  # on the lattice
    prob = np.array(
        [
            math.factorial(5)
            / (math.factorial(c1) * math.factorial(5 - c1 - c3) * math.factorial(c3))
            * 0.2**c1
            * 0.5 ** (5 - c1 - c3)
            * 0.3**c3
            for c1, c3 in cells
        ]
    )
    assert prob.sum() == pytest.approx(1.0, rel=1e-12)
    observed = np.bincount(idx, minlength=len(cells))
    assert stats.chisquare(observed, prob * x.size).pvalue > ALPHA


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_tiny_alpha_never_nan(sampler):
    """With alpha = 0.005, v underflows to 0 on a few per cent of paths: log P_T = T log mu, never NaN."""
    fam = RandomScale(1.0, 0.1, alpha=0.005)
    x = _draws(fam, sampler, 6, n=20_000)
    assert np.all(np.isfinite(x))
    assert np.mean(x[:, -1] == 0.0) > 0.01  # v = 0 exactly: log mu = 0
    for j, T in enumerate(GRID):
        k1, k2, _ = _log_p_cumulants(fam, int(T))
        assert abs(x[:, j].mean() - k1) < K_SE * math.sqrt(k2 / x.shape[0]), T


@pytest.mark.parametrize(
    "fam",
    [RandomScale(1.3, 0.0, alpha=0.5), LognormalMixture(None, None, components="0.4:0.2:0,0.6:0.2:0")],
    ids=["random-scale", "mixture"],
)
@pytest.mark.parametrize("sampler", ["token", "aggregate"])
def test_degenerate_parameters(fam, sampler):
    """sigma^2 = 0 is the point mass at mu: zero variances, E[G_T] = mu."""
    assert fam.degenerate
    df = simulate(fam, [1, 10, 1000], 2000, engine=Engine(workers=1, sampler=sampler), progress=False)
    var = df[df["statistic"].isin(["var_P", "var_G", "var_logP"])]["value"]
    assert (var == 0.0).all()
    np.testing.assert_allclose(df[df["statistic"] == "mean_G"]["value"], fam.mu, rtol=1e-14)


def _same(a, b):
    assert a.count == b.count
    for x, y in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("sampler", ["token", "aggregate"])
@pytest.mark.parametrize("fam", [RANDOM_SCALE[1], MIXTURES[1]], ids=_ids)
def test_bit_identical_for_any_workers(fam, sampler):
    """1 and 2 workers: the same accumulators bit for bit; one seed the same draws, another seed others."""
    runs = [
        run_accumulators(
            fam,
            GRID,
            8000,
            seed=3,
            chunk_size=1000,
            engine=Engine(workers=w, sampler=sampler),
            progress=False,
        )
        for w in (1, 2)
    ]
    _same(*runs)
    other = run_accumulators(
        fam, GRID, 8000, seed=4, chunk_size=1000, engine=Engine(workers=2, sampler=sampler), progress=False
    )
    assert not np.array_equal(other.sums, runs[0].sums)
    np.testing.assert_array_equal(_draws(fam, sampler, 7, n=500), _draws(fam, sampler, 7, n=500))
