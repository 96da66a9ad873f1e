"""Empirical statistics on synthetic log-ratios drawn with NumPy: i.i.d. lognormal and Gaussian AR(1)."""

import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.cli import main
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import load_batch, save_batch
from variance_lab.rollouts.statistics import (
    BUCKET_COLUMNS,
    autocorrelation,
    bucket_variances,
    fit_log_ratios,
    length_buckets,
)
from variance_lab.stats import log_sample_var


def _ar1(rng, n, L, rho, sigma2, mu=0.0):
    """Return n stationary Gaussian AR(1) series of length L: mean mu, variance sigma2, lag-1 corr. rho."""
    sd = math.sqrt(sigma2)
    x = np.empty((n, L))
    x[:, 0] = rng.standard_normal(n) * sd
    innov = rng.standard_normal((n, L)) * sd * math.sqrt(1.0 - rho * rho)
    for t in range(1, L):
        x[:, t] = rho * x[:, t - 1] + innov[:, t]
    return x + mu


def _batch_from_log_ratios(rng, d, mask=None):
    """Token log-probs <= 0 with log-ratios d, as a padded batch."""
    base = rng.exponential(2.0, d.shape)
    return TokenBatch.from_padded(-base + np.minimum(d, 0), -base - np.maximum(d, 0), mask)


# --------------------------------------------------------------------------------------
# buckets
# --------------------------------------------------------------------------------------
def test_length_buckets_default_powers_of_two():
    """Default length buckets are powers of two, the last one covering the longest sequence."""
    bucket, edges = length_buckets([1, 2, 3, 4, 7, 8, 100])
    assert edges.tolist() == [1, 2, 4, 8, 16, 32, 64, 128]
    assert bucket.tolist() == [0, 1, 1, 2, 2, 3, 6]


def test_length_buckets_exact_and_custom():
    """``exact`` gives one bucket per length; custom edges leave lengths outside as -1."""
    bucket, edges = length_buckets([5, 3, 5, 9], "exact")
    assert edges.tolist() == [3, 5, 9, 10]
    assert bucket.tolist() == [1, 0, 1, 2]
    bucket, edges = length_buckets([1, 10, 20, 30], [10, 20, 30])
    assert bucket.tolist() == [-1, 0, 1, -1]


@pytest.mark.parametrize("edges", ["log", [3], [5, 5], [0, 4], [1.5, 3.0]])
def test_length_buckets_bad_edges(edges):
    """Bad edges (an unknown name, one edge, not increasing, 0, non-integers) raise ValueError."""
    with pytest.raises(ValueError, match="edges must be"):
        length_buckets([1, 2], edges)


def test_log_sample_var_matches_direct_and_shifts_exactly():
    """The log of the sample variance of exp(a) matches NumPy and shifts by 2c exactly."""
    rng = np.random.default_rng(21)
    a = rng.normal(0, 1, 500)
    assert log_sample_var(a) == pytest.approx(math.log(np.var(np.exp(a), ddof=1)), rel=1e-12)
    # a shift of log x by c multiplies the variance by exp(2c): never overflows
    assert log_sample_var(a + 5e6) == pytest.approx(log_sample_var(a) + 1e7, rel=1e-15)
    assert log_sample_var(np.zeros(3)) == -math.inf
    with pytest.raises(ValueError, match="at least two finite"):
        log_sample_var([1.0])


# --------------------------------------------------------------------------------------
# bucket variances
# --------------------------------------------------------------------------------------
def _lognormal_batch(rng, lengths, n_per, sigma2=0.05, mu=-0.01):
    rows = [rng.normal(mu, math.sqrt(sigma2), (n_per, L)) for L in lengths]
    width = max(lengths)
    d = np.zeros((n_per * len(lengths), width))
    mask = np.zeros(d.shape, dtype=bool)
    for k, (L, r) in enumerate(zip(lengths, rows, strict=True)):
        d[k * n_per : (k + 1) * n_per, :L] = r
        mask[k * n_per : (k + 1) * n_per, :L] = True
    return _batch_from_log_ratios(rng, d, mask), rows


def test_bucket_variances_against_direct_computation():
    """Bucket variances of P_T, G_T and log P_T match a direct computation; intervals hold them."""
    rng = np.random.default_rng(22)
    batch, rows = _lognormal_batch(rng, [4, 16, 64], 300)
    df = bucket_variances(batch, n_boot=300, seed=5)
    assert list(df.columns) == list(BUCKET_COLUMNS)
    assert df["T_lo"].tolist() == [4, 16, 64]
    assert df["n_seq"].tolist() == [300] * 3
    for (_, row), r in zip(df.iterrows(), rows, strict=True):
        log_P = np.array([math.fsum(x) for x in r])
        P, G = np.exp(log_P), np.exp(log_P / r.shape[1])
        assert row["var_P"] == pytest.approx(np.var(P, ddof=1), rel=1e-9)
        assert row["log10_var_P"] == pytest.approx(math.log10(np.var(P, ddof=1)), rel=1e-9)
        assert row["var_G"] == pytest.approx(np.var(G, ddof=1), rel=1e-9)
        assert row["var_log_P"] == pytest.approx(np.var(log_P, ddof=1), rel=1e-9)
        assert row["log10_var_P_lo"] <= row["log10_var_P"] <= row["log10_var_P_hi"]
        assert row["var_G_lo"] <= row["var_G"] <= row["var_G_hi"]
        assert 1.0 <= row["ess_P"] <= 300


def test_bucket_variances_reproducible_per_seed():
    """Bootstrap intervals repeat for a seed, change with it, and are NaN without bootstrap."""
    batch, _ = _lognormal_batch(np.random.default_rng(23), [8, 32], 50)
    a = bucket_variances(batch, n_boot=100, seed=1)
    b = bucket_variances(batch, n_boot=100, seed=1)
    c = bucket_variances(batch, n_boot=100, seed=2)
    assert a.equals(b)
    assert not np.array_equal(a["var_G_lo"], c["var_G_lo"])
    none = bucket_variances(batch, n_boot=0)
    assert none["var_G_lo"].isna().all()
    assert not none["var_G"].isna().any()


def test_bucket_with_one_sequence_and_huge_log_P():
    """One sequence gives NaN variances; log Var(P_T) near 1e7 stays exact and finite in log10."""
    d = np.full((3, 100_000), 50.0)
    d[1, :] = 49.0
    mask = np.ones(d.shape, dtype=bool)
    mask[2, 10:] = False
    df = bucket_variances(_batch_from_log_ratios(np.random.default_rng(24), d, mask), n_boot=50)
    big, small = df.iloc[1], df.iloc[0]
    assert small["n_seq"] == 1
    assert math.isnan(small["var_G"])
    # Var(P) of {e^5e6, e^4.9e6}: log = 2 * 5e6 + log(1/2), far beyond float64
    assert big["log_var_P"] == pytest.approx(1e7 + math.log(0.5), rel=1e-15)
    assert big["var_P"] == math.inf
    assert math.isfinite(big["log10_var_P"])


@pytest.mark.parametrize(("kwargs", "message"), [({"n_boot": -1}, "n_boot"), ({"level": 1.0}, "level")])
def test_bucket_variances_bad_options(kwargs, message):
    """A negative n_boot or a level of 1 raises ValueError naming it."""
    batch, _ = _lognormal_batch(np.random.default_rng(25), [4], 5)
    with pytest.raises(ValueError, match=message):
        bucket_variances(batch, **kwargs)


# --------------------------------------------------------------------------------------
# fit and autocorrelation: recover the generating parameters within 3 standard errors
# --------------------------------------------------------------------------------------
def test_fit_iid_lognormal_recovers_sigma2():
    """The fit recovers mu_y and sigma_y^2 of i.i.d. Gaussian log-ratios within k standard errors."""
    rng = np.random.default_rng(26)
    mu, sigma2 = -0.02, 0.09
    lengths = rng.integers(1, 400, 600)
    d = [rng.normal(mu, math.sqrt(sigma2), L) for L in lengths]
    base = [rng.exponential(2.0, L) for L in lengths]
    batch = TokenBatch.from_ragged(
        [-b + np.minimum(x, 0) for b, x in zip(base, d, strict=True)],
        [-b - np.maximum(x, 0) for b, x in zip(base, d, strict=True)],
    )
    fit = fit_log_ratios(batch)
    N = lengths.sum()
    se_sigma2 = sigma2 * math.sqrt(2.0 / N)  # Gaussian log-ratios: Var(s^2) = 2 sigma^4 / N
    se_mu = math.sqrt(sigma2 / N)
    assert abs(fit.sigma2_y - sigma2) < 3 * se_sigma2
    assert abs(fit.mu_y - mu) < 3 * se_mu
    assert fit.se_sigma2_y == pytest.approx(se_sigma2, rel=0.1)
    assert fit.se_mu_y == pytest.approx(se_mu, rel=0.1)
    ac = autocorrelation(batch)
    assert abs(ac.rho) < 3 / math.sqrt(ac.n_pairs[1])
    assert abs(ac.tau_int - 1.0) < 3 * ac.se_tau_int


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_ar1_recovers_rho_sigma2_and_tau(rho):
    """On AR(1) log-ratios rho, sigma_y^2 and tau_int are recovered within k standard errors."""
    rng = np.random.default_rng(27)
    sigma2, n, L = 0.04, 800, 200
    batch = _batch_from_log_ratios(rng, _ar1(rng, n, L, rho, sigma2, mu=-0.01))
    ac = autocorrelation(batch)
    fit = fit_log_ratios(batch)
    N, pairs = n * L, n * (L - 1)
    # AR(1) asymptotics: Var(rho_hat) = (1 - rho^2) / n_pairs,
    # Var(s^2) = 2 sigma^4 (1 + rho^2) / ((1 - rho^2) N)
    se_rho = math.sqrt((1 - rho**2) / pairs)
    se_sigma2 = sigma2 * math.sqrt(2 * (1 + rho**2) / ((1 - rho**2) * N))
    tau = (1 + rho) / (1 - rho)
    assert ac.n_pairs[1] == pairs
    assert abs(ac.rho - rho) < 3 * se_rho
    assert ac.se_rho == pytest.approx(se_rho, rel=0.05)
    assert abs(fit.sigma2_y - sigma2) < 3 * se_sigma2
    assert fit.se_sigma2_y == pytest.approx(se_sigma2, rel=0.15)
    assert abs(ac.tau_int - tau) < 3 * ac.se_tau_int
    assert fit.tau_y == ac.tau_int
    assert ac.window_found


def test_ar1_with_holes_uses_original_positions():
    """Masked tokens keep their positions: the lag-one correlation is rho, not a mix of lags."""
    rng = np.random.default_rng(28)
    rho, n, L = 0.6, 500, 120
    mask = rng.random((n, L)) < 0.7
    mask[:, 0] = True
    batch = _batch_from_log_ratios(rng, _ar1(rng, n, L, rho, 0.04), mask)
    ac = autocorrelation(batch)
    assert abs(ac.rho - rho) < 3 * math.sqrt((1 - rho**2) / ac.n_pairs[1])
    assert ac.acf[2] == pytest.approx(rho**2, abs=4 * math.sqrt(1 / ac.n_pairs[2]))
    # had the holes been closed, the lag-one correlation would mix lags 1, 2, 3, ...: about 0.5 here
    assert ac.n_pairs[1] < mask.sum() - n


def test_autocovariance_matches_brute_force_pairs():
    """The autocorrelation at each lag equals a brute-force mean over counted pairs."""
    rng = np.random.default_rng(29)
    lengths = [1, 2, 5, 9, 30]
    mask = [rng.random(m) < 0.75 for m in lengths]
    for m in mask:
        m[0] = True
    d = [rng.normal(0.1, 1.0, m) for m in lengths]
    batch = TokenBatch.from_ragged(
        [x - 5.0 for x in d], [np.full(m, -5.0) for m in lengths], [m.astype(int) for m in mask]
    )
    ac = autocorrelation(batch, max_lag=6, min_pairs=1)  # the arithmetic, below the reporting minimum
    counted = np.concatenate([x[m] for x, m in zip(d, mask, strict=True)])
    mean = counted.mean()
    gamma0 = np.mean((counted - mean) ** 2)
    for k in range(ac.acf.size):
        prods = [
            (x[t] - mean) * (x[t + k] - mean)
            for x, m in zip(d, mask, strict=True)
            for t in range(len(x) - k)
            if m[t] and m[t + k]
        ]
        assert ac.n_pairs[k] == len(prods)
        assert ac.acf[k] == pytest.approx(np.mean(prods) / gamma0, rel=1e-9, abs=1e-12)


def test_var_sum_predicts_var_log_P_under_ar1():
    """Var(log P_T) from the autocorrelations matches the AR(1) formula and the observed value."""
    rng = np.random.default_rng(30)
    rho, sigma2, n, L = 0.5, 0.04, 2000, 64
    batch = _batch_from_log_ratios(rng, _ar1(rng, n, L, rho, sigma2))
    ac = autocorrelation(batch)
    observed = bucket_variances(batch, n_boot=0)["var_log_P"].iloc[0]
    se = observed * math.sqrt(2.0 / (n - 1))  # log P_T is Gaussian
    exact = sigma2 * (L * (1 + rho) / (1 - rho) - 2 * rho * (1 - rho**L) / (1 - rho) ** 2)
    assert abs(ac.var_sum(L) - exact) < 3 * se
    assert abs(observed - ac.var_sum(L)) < 3 * se
    assert abs(observed - L * ac.gamma0) > 10 * se  # the i.i.d. prediction is far off
    brute = ac.gamma0 * (L + 2 * sum((L - k) * ac.acf[k] for k in range(1, min(ac.window, L - 1) + 1)))
    assert ac.var_sum([L])[0] == pytest.approx(brute, rel=1e-12)


def test_autocorrelation_errors():
    """Too few tokens, constant ratios, c <= 0 and max_lag < 1 raise ValueError."""
    single = TokenBatch.from_ragged([[-1.0], [-2.0]], [[-1.5], [-1.5]])
    with pytest.raises(ValueError, match="at least two tokens"):
        autocorrelation(single)
    assert fit_log_ratios(single).tau_y == 1.0  # independent sequences
    const = TokenBatch.from_ragged([[-1.0, -1.0]], [[-1.5, -1.5]])
    with pytest.raises(ValueError, match="constant"):
        autocorrelation(const)
    with pytest.raises(ValueError, match="c must be > 0"):
        autocorrelation(single, c=0)
    with pytest.raises(ValueError, match="max_lag"):
        autocorrelation(single, max_lag=0)


@pytest.mark.parametrize("name", ["s.jsonl", "s.parquet", "s.npz"])
def test_synthetic_ar1_through_each_file_format(tmp_path, name):
    """AR(1) data saved and loaded in each file format gives rho and sigma_y^2 within 3 SE."""
    pytest.importorskip("pyarrow")
    rng = np.random.default_rng(31)
    rho, sigma2, n, L = 0.5, 0.04, 300, 100
    mask = np.ones((n, L), dtype=bool)
    mask[:, 80:] = rng.random((n, 20)) < 0.5  # ragged ends with holes
    batch = load_batch(
        save_batch(_batch_from_log_ratios(rng, _ar1(rng, n, L, rho, sigma2), mask), tmp_path / name)
    )
    ac, fit = autocorrelation(batch), fit_log_ratios(batch)
    N = batch.n_tokens
    assert abs(ac.rho - rho) < 3 * math.sqrt((1 - rho**2) / ac.n_pairs[1])
    assert abs(fit.sigma2_y - sigma2) < 3 * sigma2 * math.sqrt(2 * (1 + rho**2) / ((1 - rho**2) * N))


# ---------------------------------------------------------------- the README's example (issue #34)
def _readme_example(tmp_path):
    """Write the README's two-line JSONL example (its ```jsonl block) and return its path."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    path = tmp_path / "rollouts.jsonl"
    path.write_text(text.split("```jsonl\n", 1)[1].split("```", 1)[0])
    return path


def test_readme_example_has_iid_standard_errors_not_zero(tmp_path, capsys):
    """Autocorrelation undefined (5 pairs): tau = 1, so the fit's SEs are the i.i.d. ones, not 0."""
    path = _readme_example(tmp_path)
    result = analyze(load_batch(path), seed=0)
    fit = result.fit
    assert result.acf is None
    assert result.acf_note.startswith("too few sequences")
    assert fit.n_tokens == 7
    assert (fit.tau_y, fit.tau_sq) == (1.0, 1.0)
    assert fit.se_mu_y == pytest.approx(math.sqrt(fit.sigma2_y / 7), rel=1e-12)
    assert fit.se_mu_y > 0.01
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mu_y = 0.03143 (SE 0.034)" in out
    assert "(SE 0)" not in out


def test_one_sequence_buckets_say_too_few_sequences(tmp_path, capsys):
    """The README's example: two buckets of one sequence each; their verdict and the overall one say why."""
    path = _readme_example(tmp_path)
    result = analyze(load_batch(path), seed=0)
    assert list(result.table["n_seq"]) == [1, 1]
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| 2-3 | 1 |", "| 4-7 | 1 |"))]
    verdicts = [row.rstrip(" |").rsplit("| ", 1)[1] for row in rows[:2]]  # the variance table's last cell
    assert verdicts == ["too few sequences", "too few sequences"]
    assert "Verdict: too few sequences: no length bucket holds 20 sequences" in out
