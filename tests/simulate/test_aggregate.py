"""Aggregate sampling: the exact laws it draws from, its agreement with token sampling, determinism.

Two-sample tests compare the samplers' log P_T at several T with fixed seeds and a
p-value threshold fixed in advance (ALPHA); moments are checked against the closed forms
within K_SE standard errors. Every draw is seeded, so each test passes or fails the same
way on every run.
"""

import pickle
import random

import mpmath
import numpy as np
import pytest
from scipy import stats

from variance_lab import Gamma, LogNormal, TwoPoint
from variance_lab.families import AR1
from variance_lab.simulate import Engine, merge_all, prepare, run_accumulators, run_chunk, simulate
from variance_lab.simulate.accumulators import LOG_P
from variance_lab.simulate.aggregate import aggregate_table, has_exact_aggregate, resolve_sampler
from variance_lab.simulate.kernels import accumulate_log_p, draw_log_p
from variance_lab.simulate.plan import chunk_generator
from variance_lab.stats import central_moments

#: The aggregate sampler on threads (all cores).
AGG = Engine(sampler="aggregate")

ALPHA = 1e-3  # two-sample tests: reject "same law" below this p-value (fixed before running them)
K_SE = 5.0  # moments: tolerance in standard errors

EXACT = [
    LogNormal(1.0, 0.1),
    TwoPoint(1.0, 0.1),
    TwoPoint(2.0, 0.5, q=0.3),
    AR1(1.0, 0.1, rho=0.8),
    AR1(1.0, 0.3, rho=-0.6),
]
GRID = np.array([1, 2, 7, 40, 300])


def _ids(f):
    return f"{f.name}-{f.sigma2}-{getattr(f, 'q', '')}{getattr(f, 'rho', '')}"


def _var_sum(fam, T):
    var_sum = getattr(fam, "var_sum_mp", None)
    return float(var_sum(T)) if var_sum is not None else T * fam.var_log


def _samples(fam, sampler, n, seed, independent=False, grid=GRID):
    code, par = fam.sampler_params()
    return draw_log_p(
        code, par, grid, np.random.default_rng(seed), n, sampler=sampler, independent=independent
    )


# ----------------------------------------------------------------------------- the AR(1) law
def _ar1_block_reference(s, rho, d, first):
    """(alpha, beta, cov of (S, L) given e) for a block of d tokens, by Gaussian conditioning.

    The stationary AR(1) deviations e_0..e_d have covariance s^2 rho^|i-j|; S = e_1 + .. + e_d,
    L = e_d. Given e_0 (``first=False``) the law is the Schur complement; from the stationary
    law (``first=True``) it is the marginal of (S, L).
    """
    idx = np.arange(d + 1)
    with mpmath.workdps(40):
        cov = mpmath.matrix(d + 1, d + 1)
        for i in idx:
            for j in idx:
                cov[int(i), int(j)] = mpmath.mpf(s) ** 2 * mpmath.mpf(rho) ** abs(int(i) - int(j))
        A = mpmath.matrix(2, d + 1)  # rows: S and L as combinations of e_0..e_d
        for k in range(1, d + 1):
            A[0, k] = 1
        A[1, d] = 1
        joint = A * cov * A.T  # Cov(S, L)
        if first:
            return 0.0, 0.0, np.array(joint.tolist(), dtype=float)
        c = A * cov[:, 0]  # Cov((S, L), e_0)
        v0 = cov[0, 0]
        coef = c / v0
        cond = joint - c * c.T / v0
        return float(coef[0]), float(coef[1]), np.array(cond.tolist(), dtype=float)


@pytest.mark.parametrize("rho", [0.0, 0.5, -0.7, 0.99, 0.999])
@pytest.mark.parametrize("steps", [[1, 1, 3], [4, 9, 1], [25, 2]])
def test_ar1_table_is_the_exact_conditional_law(rho, steps):
    """The AR(1) aggregate table gives the exact conditional mean factors and Cholesky covariance."""
    s = 0.37
    grid = np.cumsum(steps)
    table = aggregate_table(4, [0.0, s, rho], grid, False)
    for j, d in enumerate(steps):
        alpha, beta, cov = _ar1_block_reference(s, rho, d, first=(j == 0))
        a, b, l11, l21, l22 = table[j]
        chol = np.array([[l11, 0.0], [l21, l22]])
        assert a == pytest.approx(alpha, abs=1e-14)
        assert b == pytest.approx(beta, abs=1e-14)
        np.testing.assert_allclose(chol @ chol.T, cov, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rho", [0.0, 0.6, -0.5, 0.999])
def test_ar1_independent_table_is_the_sd_of_the_sum(rho):
    """The independent AR(1) table holds the sd of the sum of T tokens, against mpmath."""
    fam = AR1(1.0, 0.2, rho=rho)
    code, par = fam.sampler_params()
    table = aggregate_table(code, par, GRID, True)
    with mpmath.workdps(30):
        # the family's V_T, with the sampler's s (the sqrt of v rounded to float64)
        scale = par[1] ** 2 / fam.var_log
        expected = [np.sqrt(float(fam.var_sum_mp(int(T))) * scale) for T in GRID]
    np.testing.assert_allclose(table[:, 2], expected, rtol=1e-13)


def test_simple_tables():
    """Lognormal and two-point tables hold sqrt of step sizes, or step sizes; tables are read-only."""
    np.testing.assert_array_equal(
        aggregate_table(1, [0.1, 0.2], GRID, False)[:, 0], np.sqrt(np.diff(GRID, prepend=0))
    )
    np.testing.assert_array_equal(aggregate_table(1, [0.1, 0.2], GRID, True)[:, 0], np.sqrt(GRID))
    np.testing.assert_array_equal(
        aggregate_table(3, [0.3, -0.1, 0.2], GRID, False)[:, 0], np.diff(GRID, prepend=0)
    )
    assert not aggregate_table(0, [0.1], GRID, False).flags.writeable  # cached: read-only


def test_random_scale_and_mixture_tables():
    """Random-scale: step sizes and their square roots; mixture: step sizes (token counts per step)."""
    steps = np.diff(GRID, prepend=0)
    rs = aggregate_table(5, [0.0, 1.0, 0.1], GRID, False)
    np.testing.assert_array_equal(rs[:, 0], steps)
    np.testing.assert_array_equal(rs[:, 1], np.sqrt(steps))
    np.testing.assert_array_equal(
        aggregate_table(5, [0.0, 1.0, 0.1], GRID, True)[:, :2], np.c_[GRID, np.sqrt(GRID)]
    )
    mix = [2, 0.5, 1.0, 0.0, 0.1, 0.1, 0.2, 0.5, 1.0]
    np.testing.assert_array_equal(aggregate_table(6, mix, GRID, False)[:, 0], steps)
    np.testing.assert_array_equal(aggregate_table(6, mix, GRID, True)[:, 0], GRID)


# ----------------------------------------------------------------------------- two-point inversion
TWO_POINT_STEPS = (1, 9, 90, 900)


@pytest.mark.parametrize("q", [0.3, 0.5, 0.93])
def test_two_point_table_is_the_binomial_cdf(q):
    """Each step's table is the Binomial(Delta, q) CDF (40-digit mpmath sums) and a valid guide."""
    table = aggregate_table(3, [q, 0.1, -0.1], np.cumsum(TWO_POINT_STEPS), False)
    with mpmath.workdps(40):
        for j, d in enumerate(TWO_POINT_STEPS):
            assert table[j, 0] == d
            assert table[j, 1] == d + 1
            F = table[j, 2 : d + 3]
            guide = table[j, d + 3 : 2 * d + 4].astype(int)
            mq = mpmath.mpf(q)
            pmf = [mpmath.binomial(d, k) * mq**k * (1 - mq) ** (d - k) for k in range(d + 1)]
            exact = np.array([float(v) for v in np.cumsum(pmf)])
            assert np.max(np.abs(F - exact)) <= 1.2e-16, d  # correctly rounded: half an ulp
            assert F[-1] == 1.0
            assert np.all(np.diff(F) >= 0)
            for i, g in enumerate(guide):  # g = the first k with F(k) > i / (d + 1)
                assert F[g] > i / (d + 1)
                assert g == 0 or F[g - 1] <= i / (d + 1)


def test_two_point_long_steps_have_no_table():
    """Steps above the cap (or the memory budget) keep size 0: the kernel calls binomial there."""
    from variance_lab.simulate.aggregate import TWO_POINT_TABLE_MAX, TWO_POINT_TABLE_VALUES

    grid = np.array([5, 5 + TWO_POINT_TABLE_MAX + 1])
    table = aggregate_table(3, [0.5, 0.1, -0.1], grid, False)
    assert table[:, 1].tolist() == [6.0, 0.0]
    assert table.shape[1] == 2 + 2 * 6
    many = np.arange(1, 4001) * 64  # 4,000 steps of 64: the budget lowers the cap below 64
    wide = aggregate_table(3, [0.5, 0.1, -0.1], many, False)
    assert wide.size <= max(5 * many.size, TWO_POINT_TABLE_VALUES)
    assert np.all(wide[1:, 1] == 0.0)
    assert wide[0, 1] == 0.0


@pytest.mark.parametrize("q", [pytest.param(0.3, marks=pytest.mark.slow), 0.5])
def test_two_point_inversion_draws_the_binomial_law(q):
    """Counts K drawn through the table (and, past the cap, binomial): mean, variance, chi-square.

    Mean and variance within 4 predicted standard errors of Delta q and Delta q (1 - q); a
    chi-square goodness-of-fit test against ``scipy.stats.binom`` (cells of expected count
    below 5 pooled) at the fixed ALPHA.
    """
    n = 60_000
    fam = TwoPoint(1.0, 0.1 if q == 0.5 else 0.05, q=q)
    _, (q_, la, lb) = fam.sampler_params()
    for d in (*TWO_POINT_STEPS, 2000):
        x = _samples(fam, "aggregate", n, 30 + d, independent=True, grid=np.array([d]))[:, 0]
        counts = np.rint((x - d * lb) / (la - lb)).astype(int)
        mean, var = d * q_, d * q_ * (1 - q_)
        kappa = 3 + (1 - 6 * q_ * (1 - q_)) / var  # binomial kurtosis
        assert abs(counts.mean() - mean) < 4 * np.sqrt(var / n), d
        assert abs(counts.var(ddof=1) - var) < 4 * var * np.sqrt((kappa - (n - 3) / (n - 1)) / n), d
        lo, hi = stats.binom.ppf([1e-9, 1 - 1e-9], d, q_).astype(int)
        ks = np.arange(lo, hi + 1)
        expected = n * stats.binom.pmf(ks, d, q_)
        observed = np.array([np.sum(counts == k) for k in ks])
        observed[0] += np.sum(counts < lo)
        observed[-1] += np.sum(counts > hi)
        keep = expected >= 5
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], n - expected[keep].sum())
        if exp[-1] < 1e-9:
            obs, exp = obs[:-1], exp[:-1]
        exp = exp * n / exp.sum()
        assert stats.chisquare(obs, exp).pvalue > ALPHA, d


def test_two_point_aggregate_is_reproducible_for_any_workers():
    """Same seed, same accumulators bit for bit, 1 or 2 workers; the table path draws them."""
    fam = TwoPoint(1.0, 0.1, q=0.3)
    grid = [1, 10, 100, 1000]
    runs = [
        run_accumulators(fam, grid, 150_000, seed=8, engine=Engine(workers=w, sampler="aggregate"))
        for w in (1, 2, 1)
    ]
    for acc in runs[1:]:
        _same(acc, runs[0])


# ----------------------------------------------------------------------------- same law as token
@pytest.mark.parametrize("independent", [False, True])
@pytest.mark.parametrize("fam", [f for f in EXACT if f.name != "two-point"], ids=_ids)
def test_continuous_samplers_agree_two_sample(fam, independent):
    """Token and aggregate samplers pass a two-sample KS test at every T of the grid."""
    n = 6000
    tok = _samples(fam, "token", n, 11, independent)
    agg = _samples(fam, "aggregate", n, 12, independent)
    for j, T in enumerate(GRID):
        p = stats.ks_2samp(tok[:, j], agg[:, j]).pvalue
        assert p > ALPHA, (T, p)


@pytest.mark.parametrize("independent", [False, True])
@pytest.mark.parametrize("fam", [f for f in EXACT if f.name == "two-point"], ids=_ids)
def test_two_point_samplers_agree_two_sample(fam, independent):
    """Two-point log P_T = k log a + (T - k) log b: chi-square test of the counts k between samplers."""
    n = 6000
    _, (_, la, lb) = fam.sampler_params()
    tok = _samples(fam, "token", n, 21, independent)
    agg = _samples(fam, "aggregate", n, 22, independent)
    for j, T in enumerate(GRID):
        k_tok = np.rint((tok[:, j] - T * lb) / (la - lb)).astype(int)
        k_agg = np.rint((agg[:, j] - T * lb) / (la - lb)).astype(int)
        np.testing.assert_allclose(agg[:, j], k_agg * la + (T - k_agg) * lb, rtol=0, atol=1e-9 * T)
        assert k_agg.min() >= 0
        assert k_agg.max() <= T
        values = np.union1d(k_tok, k_agg)
        table = np.array([[np.sum(k_tok == v) for v in values], [np.sum(k_agg == v) for v in values]])
        keep = table.sum(axis=0) >= 10  # pool sparse counts into one cell
        table = np.column_stack([table[:, keep], table[:, ~keep].sum(axis=1)]) if (~keep).any() else table
        if table.shape[1] < 2:
            continue  # one value only (T = 1 has two, so this is never all of them)
        p = stats.chi2_contingency(table).pvalue
        assert p > ALPHA, (T, p)


@pytest.mark.parametrize("independent", [False, True])
@pytest.mark.parametrize("fam", EXACT, ids=_ids)
def test_aggregate_moments_of_log_p(fam, independent):
    """Mean and variance of log P_T within K_SE standard errors of T E[log r] and V_T."""
    n = 100_000
    acc = run_accumulators(fam, GRID, n, seed=5, independent=independent, engine=AGG, progress=False)
    d, m2, _, m4 = central_moments(acc.sums[LOG_P], n)
    mean = acc.spec.ref_logP + d
    for j, T in enumerate(GRID):
        V = _var_sum(fam, int(T))
        assert abs(mean[j] - T * fam.mean_log) < K_SE * np.sqrt(V / n), T
        se_var = np.sqrt((m4[j] - m2[j] ** 2) / n)
        assert abs(m2[j] - V) < K_SE * se_var, T


def test_prefix_paths_have_the_ar1_covariance_across_T():
    """Cov(log P_T1, log P_T2) for one path read at two T: the AR(1) sum's covariance."""
    fam = AR1(1.0, 0.2, rho=0.7)
    grid = np.array([3, 10])
    x = _samples(fam, "aggregate", 40_000, 3, grid=grid)
    rho, v = fam.rho, fam.var_log
    with mpmath.workdps(30):
        cov = sum(v * float(mpmath.mpf(rho) ** abs(i - j)) for i in range(3) for j in range(10))
    se = np.sqrt((np.var(x[:, 0]) * np.var(x[:, 1]) + cov**2) / x.shape[0])
    assert abs(np.cov(x.T)[0, 1] - cov) < K_SE * se


def test_independent_aggregate_values_are_uncorrelated_across_T():
    """Independent aggregate draws at different T have correlations within K_SE standard errors of 0."""
    x = _samples(LogNormal(1.0, 0.1), "aggregate", 20_000, 4, independent=True)
    r = np.corrcoef(x.T)[np.triu_indices(GRID.size, 1)]
    assert np.all(np.abs(r) < K_SE / np.sqrt(x.shape[0]))


def test_estimates_agree_with_closed_form():
    """Simulate on Engine(sampler='auto') gives the exact E[G_T], Var(G_T) within K_SE predicted errors."""
    from variance_lab import theory

    fam = LogNormal(1.0, 0.1)
    n = 200_000
    df = simulate(fam, [1, 10, 100, 1000], n, seed=8, engine=Engine(sampler="auto"), progress=False)
    assert df.attrs["provenance"]["sampler"] == "aggregate"
    for T in (1, 10, 100, 1000):
        for stat in ("mean_G", "var_G"):
            row = df[(df["T"] == T) & (df["statistic"] == stat)].iloc[0]
            exact = theory.value(stat, fam, T)
            var = theory.value("var_G", fam, T)
            se = var * theory.value("rel_se_var_G", fam, T, n=n) if stat == "var_G" else np.sqrt(var / n)
            assert abs(row["value"] - exact) < K_SE * se, (T, stat)


# ----------------------------------------------------------------------------- determinism
@pytest.fixture(scope="module")
def reference():
    """Accumulators of an AR(1) run drawn by the aggregate sampler with one worker."""
    return run_accumulators(
        AR1(1.0, 0.1, rho=0.5), GRID, 30_000, seed=3, engine=Engine(workers=1, sampler="aggregate")
    )


def _same(a, b):
    assert a.count == b.count
    for x, y in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("workers", [2, 3])
def test_bit_identical_for_any_workers(reference, workers):
    """The aggregate sampler's accumulators are identical to the one-worker run for any worker count."""
    acc = run_accumulators(
        AR1(1.0, 0.1, rho=0.5), GRID, 30_000, seed=3, engine=Engine(workers=workers, sampler="aggregate")
    )
    _same(acc, reference)


def test_bit_identical_for_any_order_and_after_pickling(reference):
    """Chunks run in shuffled order after a pickle round trip merge to the reference bit for bit."""
    _, tasks = prepare(AR1(1.0, 0.1, rho=0.5), GRID, 30_000, seed=3, sampler="aggregate")
    assert {t.sampler for t in tasks} == {"aggregate"}
    order = list(range(len(tasks)))
    random.Random(1).shuffle(order)
    results = {i: run_chunk(pickle.loads(pickle.dumps(tasks[i]))) for i in order}
    _same(merge_all(results[i] for i in range(len(tasks))), reference)


def test_seed_changes_the_draws(reference):
    """Another seed gives different accumulator sums."""
    other = run_accumulators(
        AR1(1.0, 0.1, rho=0.5), GRID, 30_000, seed=4, engine=Engine(workers=2, sampler="aggregate")
    )
    assert not np.array_equal(other.sums, reference.sums)


def test_chunk_is_what_draw_log_p_draws():
    """run_chunk reduces exactly the values draw_log_p returns for the chunk's stream."""
    fam = TwoPoint(1.0, 0.2, q=0.4)
    _, tasks = prepare(fam, GRID, 3000, seed=9, chunk_size=3000, sampler="aggregate")
    task = tasks[0]
    x = draw_log_p(task.code, task.params, GRID, chunk_generator(9, 0), 3000, sampler="aggregate")
    acc, ref = run_chunk(task), accumulate_log_p(x, task.spec)
    np.testing.assert_array_equal(acc.shift, ref.shift)
    np.testing.assert_array_equal(acc.sums, ref.sums)  # the same values, the same block reduction
    np.testing.assert_array_equal(acc.tail, ref.tail)


# ----------------------------------------------------------------------------- choosing
def test_resolution():
    """``auto`` picks the aggregate sampler where an exact one exists, else the token sampler."""
    assert resolve_sampler("auto", LogNormal(1.0, 0.1).sampler_params()[0]) == "aggregate"
    assert resolve_sampler("auto", Gamma(1.0, 0.1).sampler_params()[0]) == "token"
    assert resolve_sampler("auto", Gamma(1.0, 0.0).sampler_params()[0]) == "aggregate"  # degenerate
    assert resolve_sampler("token", 1) == "token"
    assert [has_exact_aggregate(c) for c in range(7)] == [True, True, False, True, True, True, True]


def test_gamma_has_no_aggregate_and_bad_names_fail():
    """The aggregate sampler for gamma and an unknown sampler name raise; ``auto`` falls back to tokens."""
    with pytest.raises(ValueError, match="gamma family has no exact aggregate"):
        simulate(Gamma(1.0, 0.1), [1, 2], 100, engine=AGG, progress=False)
    with pytest.raises(ValueError, match="sampler must be one of"):
        Engine(sampler="exact")
    df = simulate(Gamma(1.0, 0.1), [1, 2], 100, engine=Engine(sampler="auto"), progress=False)
    assert df.attrs["provenance"]["sampler"] == "token"


def test_degenerate_aggregate_is_exact():
    """With sigma^2 = 0 the aggregate sampler gives zero variances and mean_G = mu exactly."""
    fam = LogNormal(1.5, 0.0)
    df = simulate(fam, [1, 10, 1000], 5000, engine=AGG, progress=False)
    var = df[df["statistic"].isin(["var_P", "var_G", "var_logP"])]["value"]
    assert (var == 0.0).all()
    np.testing.assert_allclose(df[df["statistic"] == "mean_G"]["value"], 1.5, rtol=1e-15)


def test_the_two_sample_test_sees_a_wrong_law():
    """Power check: aggregate draws that ignored the AR(1) correlation would be rejected."""
    tok = _samples(AR1(1.0, 0.1, rho=0.3), "token", 6000, 11)
    wrong = _samples(LogNormal(1.0, 0.1), "aggregate", 6000, 12)  # the same marginal, rho = 0
    assert stats.ks_2samp(tok[:, 3], wrong[:, 3]).pvalue < ALPHA  # T = 40


def test_command_line_sampler(capsys, tmp_path):
    """``--sampler`` on ``table`` and ``sweep``: accepted, refused with exit 2, failed cells reported."""
    from variance_lab.cli import main

    assert main(["table", "--n", "20000", "--sampler", "auto", "--format", "csv", "--workers", "1"]) == 0
    assert "mc_" in capsys.readouterr().out
    assert main(["table", "--n", "2000", "--sampler", "exact"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["table", "--family", "gamma", "--n", "2000", "--sampler", "aggregate"]) == 2
    assert "no exact aggregate" in capsys.readouterr().err
    store = str(tmp_path / "s.sqlite")
    args = ["sweep", "--family", "lognormal,gamma", "--n", "3000", "--T", "1,50", "--store", store]
    assert main([*args, "--sampler", "aggregate", "--no-progress"]) == 1  # the gamma cell fails, is reported
    assert "no exact aggregate" in capsys.readouterr().err
    assert main([*args, "--sampler", "auto", "--no-progress"]) == 0
