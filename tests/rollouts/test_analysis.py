"""Empirical analysis (rollouts.analysis, `variance-lab analyze`) on synthetic data with a known answer.

Sequences of log-ratios are drawn (fixed seeds) from the lognormal family (i.i.d., rho = 0) and
from the Gaussian AR(1) family with rho = 0.5, both with mu = 1, sigma^2 = 0.01 and lengths
spread log-uniformly over 16..511, written to JSONL, Parquet and NPZ, loaded, and analysed
through the API and the command line.
"""

import json
import math
import os
import stat
import threading

import mpmath
import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from variance_lab import theory
from variance_lab.cli import main
from variance_lab.families import get_family
from variance_lab.rollouts.analysis import CURVE_COLUMNS, analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.cgf import EmpiricalCGF
from variance_lab.rollouts.io import load_batch, save_batch
from variance_lab.rollouts.judgment import ANALYSIS_COLUMNS, overall_verdict, verdict
from variance_lab.rollouts.predictions import MIN_BUCKET_SEQUENCES, expected_sample_var, interval_score
from variance_lab.rollouts.statistics import bucket_variances

SIGMA2, N_SEQ = 0.01, 1000
FORMATS = ("jsonl", "parquet", "npz")


def _family(rho: float):
    return get_family("lognormal", 1.0, SIGMA2) if rho == 0 else get_family("ar1", 1.0, SIGMA2, rho=rho)


def _log_ratios(rng, lengths, family, rho):
    """Return padded (n, max L) stationary Gaussian AR(1) log-ratios of the family's marginal; the mask."""
    n, width = lengths.size, int(lengths.max())
    sd = math.sqrt(family.var_log)
    x = np.empty((n, width))
    x[:, 0] = rng.standard_normal(n) * sd
    innov = rng.standard_normal((n, width)) * (sd * math.sqrt(1.0 - rho * rho))
    for t in range(1, width):
        x[:, t] = rho * x[:, t - 1] + innov[:, t]
    return x + family.mean_log, np.arange(width)[None, :] < lengths[:, None]


def _batch(rng, d, mask) -> TokenBatch:
    """Token log-probs <= 0 whose differences are the log-ratios d."""
    base = rng.exponential(2.0, d.shape)
    return TokenBatch.from_padded(-base + np.minimum(d, 0), -base - np.maximum(d, 0), mask)


def _synthetic(rho: float, seed: int, n: int = N_SEQ) -> TokenBatch:
    rng = np.random.default_rng(seed)
    lengths = np.floor(np.exp(rng.uniform(math.log(16), math.log(512), n))).astype(np.int64)
    return _batch(rng, *_log_ratios(rng, lengths, _family(rho), rho))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{(rho, format): path} of the two synthetic data sets in each file format."""
    pytest.importorskip("pyarrow")
    folder = tmp_path_factory.mktemp("rollouts")
    out = {}
    for rho, seed in ((0.0, 101), (0.5, 102)):
        batch = _synthetic(rho, seed)
        for fmt in FORMATS:
            out[rho, fmt] = save_batch(batch, folder / f"rho{rho}.{fmt}")
    return out


def _check_recovery(fit, acf, rho):
    """Check that the fit recovers sigma_y^2, rho and tau_int within 3 standard errors."""
    fam = _family(rho)
    assert abs(fit.sigma2_y - fam.var_log) < 3 * fit.se_sigma2_y
    assert abs(fit.mu_y - fam.mean_log) < 3 * fit.se_mu_y
    assert abs(acf["rho"] - rho) < 3 * acf["se_rho"]
    assert abs(acf["tau_int"] - (1 + rho) / (1 - rho)) < 3 * acf["se_tau_int"]
    # the standard error of sigma_y^2 is the AR(1) one: sigma^4 2 (1 + rho^2) / ((1 - rho^2) N)
    se = fam.var_log * math.sqrt(2 * (1 + rho**2) / ((1 - rho**2) * fit.n_tokens))
    assert fit.se_sigma2_y == pytest.approx(se, rel=0.2)


def _check_verdicts(verdicts: list[str], overall: str, rho: float):
    """Overall and most buckets: i.i.d. for rho = 0, corrected for rho = 0.5; never the other one."""
    assert len(verdicts) == 5
    if rho == 0:
        assert overall == "iid-lognormal"
        assert sum(v.startswith("iid") for v in verdicts) >= 3
        assert "corrected" not in verdicts
    else:
        assert overall == "corrected"
        assert verdicts.count("corrected") >= 3
        assert not any(v.startswith("iid") for v in verdicts)


# --------------------------------------------------------------------------------------
# through the API, from each file format
# --------------------------------------------------------------------------------------
#: (rho, format) pairs: each rho and each format once by default (the readers agree bit for bit,
#: test_every_format_reads_the_same_batch); every pair in the slow run.
RHO_FORMATS = [
    (0.0, "jsonl"),
    (0.5, "npz"),
    pytest.param(0.0, "parquet", marks=pytest.mark.slow),
    pytest.param(0.0, "npz", marks=pytest.mark.slow),
    pytest.param(0.5, "jsonl", marks=pytest.mark.slow),
    pytest.param(0.5, "parquet", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("rho", "fmt"), RHO_FORMATS)
def test_analysis_recovers_parameters_and_picks_the_right_prediction(files, rho, fmt):
    """Synthetic AR(1) data: the fit recovers the parameters and the verdicts pick the right model."""
    result = analyze(load_batch(files[rho, fmt]), n_boot=300, seed=1)
    table = result.table
    assert list(table.columns) == list(ANALYSIS_COLUMNS)
    assert table["T_lo"].tolist() == [16, 32, 64, 128, 256]
    assert result.n_sequences == N_SEQ
    assert result.n_dropped == 0
    _check_recovery(result.fit, result.summary()["autocorrelation"], rho)
    _check_verdicts(table["verdict"].tolist(), result.verdict, rho)
    # the observed Var(log P_T) matches the corrected prediction (exact law of log P_T here)
    se = table["var_log_P"] * np.sqrt(2.0 / (table["n_seq"] - 1))
    assert np.all(np.abs(table["var_log_P"] - table["var_log_P_corr"]) < 3.5 * se)
    if rho == 0.5:  # ... and not the i.i.d. one, which is about three times too small
        assert np.all(table["var_log_P_corr"] / table["var_log_P_iid"] > 2.5)


def test_every_format_reads_the_same_batch(files):
    """The same data from every file format reads back as the same batch, bit for bit.

    ``analyze`` is a function of the batch (and its seed), so the tables agree too; the slow
    run analyses every (rho, format) pair (RHO_FORMATS).
    """
    batches = [load_batch(files[0.5, fmt]) for fmt in FORMATS]
    for other in batches[1:]:
        for name in ("logp", "old_logp", "offsets", "positions", "ids"):
            a, b = getattr(batches[0], name), getattr(other, name)
            assert a.dtype == b.dtype, name
            assert a.tobytes() == b.tobytes(), name


# --------------------------------------------------------------------------------------
# the predictions against the exact theory
# --------------------------------------------------------------------------------------
def test_iid_curve_is_the_lognormal_family_theory():
    """The i.i.d. curve equals the lognormal family's theory for the fitted mu_y, sigma_y^2."""
    result = analyze(_synthetic(0.0, 7, n=200), n_boot=0)
    f = result.fit
    mu = math.exp(f.mu_y + f.sigma2_y / 2)
    fam = get_family("lognormal", mu, mu * mu * math.expm1(f.sigma2_y))
    T = np.array([1, 16, 300, 10_000])
    curves = result.curves(T)
    assert list(curves.columns) == list(CURVE_COLUMNS)
    iid = curves[curves["model"] == "iid"]
    np.testing.assert_allclose(iid["log10_var_P"], theory.var_P(fam, T, log10=True), rtol=1e-10)
    np.testing.assert_allclose(iid["var_G"], theory.var_G(fam, T), rtol=1e-9)


def test_corrected_curve_approaches_the_ar1_theory():
    """The autocorrelation-corrected Var(G_T) is within 6 % of the AR(1) theory."""
    rho = 0.5
    result = analyze(_synthetic(rho, 8, n=600), n_boot=0)
    T = np.array([16, 64, 256, 4096])
    corr = result.curves(T).query("model == 'corr'")
    exact = theory.var_G(_family(rho), T)
    # estimated sigma_y^2 and autocorrelations: a few per cent
    np.testing.assert_allclose(corr["var_G"], exact, rtol=0.06)
    iid = result.curves(T).query("model == 'iid'")
    assert np.all(exact / iid["var_G"].to_numpy() > 2.5)


def test_bucket_prediction_is_the_expected_sample_variance():
    """A bucket's prediction is the expected sample variance of its mixed lengths."""
    # draws X_j with means exp(b_j) and variances exp(v_j), c_j of each
    b, v, c = np.array([0.1, -0.3, 0.0]), np.array([-2.0, -1.0, -3.0]), np.array([3, 1, 2])
    m, var = np.exp(b), np.exp(v)
    n = c.sum()
    mbar = np.sum(c * m) / n
    direct = np.sum(c * var) / n + np.sum(c * (m - mbar) ** 2) / (n - 1)
    assert math.exp(expected_sample_var(b, v, c)) == pytest.approx(direct, rel=1e-13)
    assert math.isnan(expected_sample_var(b[:1], v[:1], [1]))
    # a bucket of one length: its prediction is the curve at that length
    batch = TokenBatch.from_padded(*_two_policies(np.random.default_rng(9), np.full((40, 50), 0.1)))
    result = analyze(batch, n_boot=0)
    row, curve = result.table.iloc[0], result.curves([50])
    for model in ("iid", "emp", "corr"):
        assert row[f"var_G_{model}"] == pytest.approx(
            curve.query(f"model == '{model}'")["var_G"].iloc[0], rel=1e-12
        )


def _two_policies(rng, scale):
    """Return padded (logp, old_logp) with random log-ratios of the given scale."""
    d = rng.standard_normal(scale.shape) * scale
    base = rng.exponential(2.0, d.shape)
    return -base + np.minimum(d, 0), -base - np.maximum(d, 0)


# --------------------------------------------------------------------------------------
# (b): the exact i.i.d. prediction for the empirical distribution, against mpmath
# --------------------------------------------------------------------------------------
def _reference(y, T: int, dps: int = 80):
    """Return ln E[X], ln Var(X) of X = P_T, G_T of i.i.d. draws from the sample y, in mpmath."""
    with mpmath.workdps(dps):
        ys = [mpmath.mpf(float(v)) for v in y]

        def K(s):
            return mpmath.log(mpmath.fsum(mpmath.exp(s * v) for v in ys) / len(ys))

        out = []
        for a in (mpmath.mpf(1), mpmath.mpf(1) / T):
            k1, k2 = K(a), K(2 * a)
            out += [float(T * k1), float(2 * T * k1 + mpmath.log(mpmath.expm1(T * (k2 - 2 * k1))))]
        return out


_SAMPLES = {
    "gaussian": lambda rng: rng.normal(-0.005, 0.1, 60),
    "tiny variance": lambda rng: rng.normal(0.3, 1e-6, 60),
    "heavy tails": lambda rng: np.concatenate([rng.normal(0.0, 0.05, 57), [12.0, -30.0, 45.0]]),
    "skewed": lambda rng: rng.exponential(0.2, 60) - 0.2,
}


@pytest.mark.parametrize("name", list(_SAMPLES))
def test_empirical_prediction_matches_mpmath_up_to_T_1e5(name):
    """Empirical-CGF log moments of P_T and G_T match mpmath at 80 digits up to T = 1e5."""
    y = _SAMPLES[name](np.random.default_rng(10))
    cgf = EmpiricalCGF(y)
    for T in (1, 2, 3, 10, 100, 1000, 10_000, 100_000):
        got = [*cgf.log_moments([T], 1.0), *cgf.log_moments([T], 1.0 / T)]
        got = [float(g[0]) for g in got]
        # natural logs: 1e-9 absolute is 1e-9 relative on E and Var; ln Var(P_T) reaches 1e7 here
        assert got == pytest.approx(_reference(y, T), abs=1e-9, rel=1e-14), f"T = {T}"


def test_empirical_cgf_is_continuous_where_the_method_switches():
    """The empirical CGF is continuous where series and direct sum meet; NaN input raises."""
    y = np.random.default_rng(11).normal(0.0, 0.3, 500)
    cgf = EmpiricalCGF(y)
    edge = 2.0 / cgf.zmax  # the series is used up to s * zmax = 2
    below, above = cgf.L([edge * (1 - 1e-12), edge * (1 + 1e-12)])
    assert below == pytest.approx(above, rel=1e-12)
    assert cgf.K(0.0) == 0.0
    assert cgf.L(1e-4) == pytest.approx(0.5e-8 * np.var(y), rel=1e-3)
    with pytest.raises(ValueError, match="finite"):
        EmpiricalCGF([0.1, math.nan])


# --------------------------------------------------------------------------------------
# verdict, scores, clip fractions, edge cases
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ((0.2, 0.1, 0.0), "iid-lognormal"),  # i.i.d. inside: wins although the others are closer
        ((1.5, -0.6, 0.0), "iid-empirical"),  # inside and at least twice as close as iid-lognormal
        ((1.5, -0.9, 0.0), "corrected"),  # empirical inside but not twice as close: on to corrected
        ((-3.0, -3.1, 0.4), "corrected"),
        ((1.2, 1.1, 0.9), "none"),  # corrected inside, but not clearly better than i.i.d.: a tie
        ((-3.0, -3.1, 1.2), "none"),
        ((math.nan, math.nan, math.nan), "n/a"),
        ((math.nan, 0.5, 0.1), "iid-empirical"),
        ((-4.0, -4.0, math.nan), "none"),
    ],
)
def test_verdict_rule(scores, expected):
    """The per-bucket verdict follows the documented rule for each score triple."""
    assert verdict(*scores) == expected


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        (["iid-lognormal", "none", "none", "iid-empirical", "iid-lognormal"], "iid-lognormal"),
        (["corrected", "corrected", "none", "n/a"], "corrected"),
        (["corrected", "iid-empirical", "n/a"], "iid-empirical"),  # ties go to i.i.d.
        (["none", "none", "corrected"], "none"),
        (["n/a", "n/a"], "n/a"),
        (["too few sequences", "too few sequences", "corrected"], "corrected"),  # small buckets do not vote
        (["too few sequences", "too few sequences"], "too few sequences"),  # no vote, and the reason why
        (["too few sequences", "n/a"], "n/a"),  # a bucket of enough sequences had no interval
    ],
)
def test_overall_verdict_is_the_vote_of_the_buckets(votes, expected):
    """The overall verdict is the buckets' majority, ties to i.i.d., n/a ignored."""
    assert overall_verdict(votes) == expected


def test_score_in_interval_half_widths():
    """The score is the log distance to the observation in interval half-widths, NaN without one."""
    assert interval_score(math.log(3.0), math.log(2.0), math.log(1.0), math.log(4.0)) == pytest.approx(
        math.log(1.5) / math.log(2.0)
    )
    assert interval_score(0.0, 1.0, 0.5, 3.0) == pytest.approx(-2.0)
    assert math.isnan(interval_score(0.0, 1.0, math.nan, math.nan))


def test_clip_fractions_observed_against_predicted():
    """Observed GSPO and PPO clip fractions are within 3.5 standard errors of the predictions."""
    batch = _synthetic(0.5, 12, n=1500)
    result = analyze(batch, n_boot=0, gspo_range=(0.99, 1.01))
    t = result.table
    p, n = t["gspo_clip_pred"].to_numpy(), t["n_seq"].to_numpy()
    assert np.all(np.abs(t["gspo_clip_frac"] - p) < 3.5 * np.sqrt(p * (1 - p) / n) + 1e-12)
    assert np.all(t["gspo_clip_pred"] > t["gspo_clip_pred_iid"])  # correlation widens log G_T
    c = result.clip
    se = math.sqrt(c["gspo_pred"] * (1 - c["gspo_pred"]) / len(batch))
    assert abs(c["gspo_obs"] - c["gspo_pred"]) < 3.5 * se
    assert c["gspo_obs"] - c["gspo_pred_iid"] > 5 * se
    # PPO: tokens; their clip indicators are correlated, so allow tau_int ~ 3 in the error
    se_tok = math.sqrt(c["ppo_pred"] * (1 - c["ppo_pred"]) * 3.0 / batch.n_tokens)
    assert abs(c["ppo_obs"] - c["ppo_pred"]) < 3.5 * se_tok
    assert c["ppo_range"] == (0.8, 1.2)
    assert c["gspo_range"] == (0.99, 1.01)


def test_small_buckets_say_too_few_sequences():
    """Buckets under MIN_BUCKET_SEQUENCES sequences get no verdict and no scores, and do not vote."""
    assert MIN_BUCKET_SEQUENCES == 20
    rng = np.random.default_rng(14)
    fam = _family(0.0)
    parts = []
    for T, n in ((16, 300), (40, MIN_BUCKET_SEQUENCES - 1), (70, MIN_BUCKET_SEQUENCES), (150, 3)):
        parts.append(_log_ratios(rng, np.full(n, T, dtype=np.int64), fam, 0.0)[0])
    width = max(x.shape[1] for x in parts)
    d = np.vstack([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in parts])
    mask = (
        np.arange(width)[None, :] < np.concatenate([np.full(x.shape[0], x.shape[1]) for x in parts])[:, None]
    )
    result = analyze(_batch(rng, d, mask), n_boot=200)
    t = result.table.set_index("n_seq")
    for n in (MIN_BUCKET_SEQUENCES - 1, 3):
        assert t.at[n, "verdict"] == "too few sequences"
        assert all(math.isnan(t.at[n, f"score_{m}"]) for m in ("iid", "emp", "corr"))
        assert math.isfinite(t.at[n, "var_G"])
        # an interval from so few is shown, unless the bootstrap-t failed, which the table then says
        assert math.isfinite(t.at[n, "var_G_lo"]) or "var_G" in t.at[n, "interval_failed"].split(",")
    for n in (300, MIN_BUCKET_SEQUENCES):
        assert t.at[n, "verdict"] not in ("too few sequences", "n/a")
    assert result.verdict == overall_verdict(t.loc[[300, MIN_BUCKET_SEQUENCES], "verdict"])


# ------------------------------------------------------------------ bootstrap interval coverage
def _fixed_length_batch(fam, rho: float, seed: int, n: int, T: int) -> TokenBatch:
    rng = np.random.default_rng(seed)
    return _batch(rng, *_log_ratios(rng, np.full(n, T, dtype=np.int64), fam, rho))


#: Token families of the coverage checks: Var(log P_16) = 0.080 (i.i.d.) and 0.079 (AR(1), rho = 0.5).
#: (At 0.16 the interval of log10 Var(P_T) from 400 sequences covered 931 of 1,000: too heavy a tail.)
BOOT_FAMILIES = {0.0: get_family("lognormal", 1.0, 0.005), 0.5: get_family("ar1", 1.0, 0.0018, rho=0.5)}


def _bootstrap_hits(rho: float, seeds, n: int, T: int, n_boot: int):
    """Count the runs whose bootstrap interval covers the exact values.

    Those of Var(G_T) and of log10 Var(P_T), each of the family.
    """
    fam = BOOT_FAMILIES[rho]
    var_G = theory.value("var_G", fam, T)
    log10_var_P = theory.value("var_P", fam, T, log10=True)
    hits_G = hits_P = 0
    for seed in seeds:
        row = bucket_variances(
            _fixed_length_batch(fam, rho, seed, n, T), [T, T + 1], n_boot=n_boot, seed=seed
        ).iloc[0]
        hits_G += row["var_G_lo"] <= var_G <= row["var_G_hi"]
        hits_P += row["log10_var_P_lo"] <= log10_var_P <= row["log10_var_P_hi"]
    return hits_G, hits_P


def test_bootstrap_interval_coverage_small():
    """i.i.d. lognormal, 400 sequences of T = 16 (T sigma_y^2 = 0.08): both intervals cover at 95 %."""
    seeds = range(100)
    hits_G, hits_P = _bootstrap_hits(0.0, seeds, 400, 16, 500)
    assert binomtest(hits_G, len(seeds), 0.95).pvalue > 0.01, hits_G
    assert binomtest(hits_P, len(seeds), 0.95).pvalue > 0.01, hits_P


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_bootstrap_interval_coverage(rho):
    """1,000 synthetic batches (400 sequences of T = 16) per case: i.i.d. lognormal and AR(1)."""
    seeds = range(1000, 2000)
    hits_G, hits_P = _bootstrap_hits(rho, seeds, 400, 16, 1000)
    assert binomtest(hits_G, len(seeds), 0.95).pvalue > 0.01, hits_G
    assert binomtest(hits_P, len(seeds), 0.95).pvalue > 0.01, hits_P


def test_without_bootstrap_every_verdict_is_na():
    """Without bootstrap there are no intervals and every verdict is n/a."""
    result = analyze(_synthetic(0.0, 13, n=200), n_boot=0)
    assert set(result.table["verdict"]) == {"n/a"}
    assert result.verdict == "n/a"
    assert result.table["var_G_lo"].isna().all()


def test_single_token_sequences_have_no_autocorrelation():
    """One-token sequences give no autocorrelation, no corrected curve and an i.i.d. verdict."""
    rng = np.random.default_rng(14)
    batch = TokenBatch.from_padded(*_two_policies(rng, np.full((300, 1), 0.1)))
    result = analyze(batch, n_boot=100)
    assert result.acf is None
    assert result.summary()["autocorrelation"] is None
    assert result.table["var_G_corr"].isna().all()
    assert result.table["verdict"].iloc[0].startswith("iid")
    assert set(result.curves()["model"]) == {"iid", "emp"}


def test_bad_options_raise():
    """A bad GSPO range, a negative n_boot and T = 0 raise ValueError naming the option."""
    batch = _synthetic(0.0, 15, n=50)
    with pytest.raises(ValueError, match="gspo_range"):
        analyze(batch, gspo_range=(1.1, 1.2))
    with pytest.raises(ValueError, match="n_boot"):
        analyze(batch, n_boot=-1)
    with pytest.raises(ValueError, match="T must be"):
        analyze(batch, n_boot=0).curves([0])


# --------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rho", "fmt"),
    [
        (0.0, "parquet"),
        (0.5, "jsonl"),
        *(
            pytest.param(r, f, marks=pytest.mark.slow)
            for r, f in [(0.0, "jsonl"), (0.0, "npz"), (0.5, "npz")]
        ),
        pytest.param(0.5, "parquet", marks=pytest.mark.slow),
    ],
)
def test_cli_json_recovers_parameters_and_verdict(files, rho, fmt, capsys):
    """``analyze --table-format json`` recovers the parameters and verdict of the synthetic data."""
    assert (
        main(["analyze", str(files[rho, fmt]), "--n-boot", "300", "--seed", "1", "--table-format", "json"])
        == 0
    )
    captured = capsys.readouterr()
    assert captured.err == ""
    doc = json.loads(captured.out)
    s = doc["summary"]
    assert s["n_sequences"] == N_SEQ
    assert s["n_dropped"] == 0
    fit = s["fit"]
    _check_recovery(_FitView(fit, s["n_tokens"]), s["autocorrelation"], rho)
    _check_verdicts([b["verdict"] for b in doc["buckets"]], s["verdict"], rho)
    assert list(doc["buckets"][0]) == list(ANALYSIS_COLUMNS)


class _FitView:
    """The fit of a JSON summary with the attributes of LogRatioFit that the checks use."""

    def __init__(self, fit: dict, n_tokens: int):
        self.sigma2_y, self.se_sigma2_y = fit["sigma2_y"], fit["se_sigma2_y"]
        self.mu_y, self.se_mu_y = fit["mu_y"], fit["se_mu_y"]
        self.n_tokens = n_tokens


def test_cli_markdown_csv_out_and_figure(files, tmp_path, capsys):
    """The markdown report, ``--out`` CSV and ``--figure`` of ``analyze`` hold what they should."""
    path = str(files[0.5, "npz"])
    assert main(["analyze", path, "--n-boot", "100", "--figure", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    for text in (
        "mu_y = ",
        "sigma_y^2 = ",
        "rho = ",
        "tau_int = ",
        "dropped: 0",
        "GSPO clip fraction",
        "PPO clip fraction",
        "Verdict: ",
        "on Var(G_T) alone: corrected",
        "| 16-31 |",
        "How to read",
    ):
        assert text in out
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        main(
            [
                "analyze",
                path,
                "--n-boot",
                "100",
                "--table-format",
                "csv",
                "--out",
                str(tmp_path / "a.csv"),
                "--edges",
                "16,64,512",
                "--figure",
                str(tmp_path / "a.pdf"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Verdict: " in captured.err
    frame = pd.read_csv(tmp_path / "a.csv")
    assert list(frame.columns) == list(ANALYSIS_COLUMNS)
    assert frame["T_lo"].tolist() == [16, 64]
    assert (tmp_path / "a.pdf").read_bytes()[:5] == b"%PDF-"


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


_GOOD = {"logp": [-0.5, -1.0, -0.2], "old_logp": [-0.6, -0.9, -0.25]}
_BAD = {
    "NaN": ({"logp": [-0.5, float("nan"), -0.2], "old_logp": [-0.6, -0.9, -0.25]}, "nan"),
    "+inf": ({"logp": [-0.5, -1.0, -0.2], "old_logp": [-0.6, float("inf"), -0.25]}, "inf"),
    "positive log-prob": ({"logp": [-0.5, 0.3, -0.2], "old_logp": [-0.6, -0.9, -0.25]}, "> 0"),
    "length mismatch": ({"logp": [-0.5, -1.0, -0.2], "old_logp": [-0.6, -0.9]}, "length mismatch"),
    "empty sequence": ({"logp": [], "old_logp": []}, "empty sequence"),
}


@pytest.mark.parametrize("kind", list(_BAD))
def test_cli_bad_data_is_one_line_naming_the_sequence(kind, tmp_path, capsys):
    """A bad sequence is one stderr line naming its id and index, or dropped with ``--on-bad drop``."""
    record, problem = _BAD[kind]
    records = [dict(_GOOD, id=f"ok-{i}") for i in range(3)]
    records.insert(2, dict(record, id="bad-7"))
    path = _write_jsonl(tmp_path / "bad.jsonl", records)
    assert main(["analyze", path, "--n-boot", "10"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("variance-lab: error: ")
    assert "bad-7" in lines[0]
    assert "index 2" in lines[0]
    assert problem in lines[0].lower()
    # dropped instead, and counted
    assert main(["analyze", path, "--n-boot", "10", "--on-bad", "drop"]) == 0
    out = capsys.readouterr().out
    assert "dropped: 1" in out
    assert "bad-7" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "missing.jsonl"], "no such file"),
        (["analyze", "{good}", "--edges", "16,x"], "--edges"),
        (["analyze", "{good}", "--n-boot", "-3"], "--n-boot"),
        (["analyze", "{good}", "--level", "1.5"], "--level"),
        (["analyze", "{good}", "--figure", "a.gif"], "--figure"),
        (
            ["analyze", "{good}", "--edges", "16"],
            "--edges must be increasing integers >= 1, at least two, got [16]",
        ),
        (["analyze", "{good}", "--edges", "16,32.5"], "'32.5' is not an integer"),
        (["analyze", "{notjson}"], "invalid json"),
    ],
)
def test_cli_bad_input_is_one_line(argv, message, tmp_path, capsys):
    """Bad files and options give exit status 2 and one stderr line naming the problem."""
    good = _write_jsonl(tmp_path / "good.jsonl", [_GOOD] * 4)
    notjson = tmp_path / "x.jsonl"
    notjson.write_text("{oops\n")
    argv = [a.format(good=good, notjson=notjson) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0].lower(), err


def test_cli_help_lists_every_option(capsys):
    """``analyze --help`` exits 0 and lists every option."""
    with pytest.raises(SystemExit) as info:
        main(["analyze", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--format",
        "--on-bad",
        "--edges",
        "--n-boot",
        "--level",
        "--seed",
        "--table-format",
        "--out",
        "--figure",
    ):
        assert option in text


def test_out_into_a_pipe_writes_through_it_and_keeps_it(tmp_path, capsys):
    """``--out`` into a named pipe writes through it and leaves the pipe in place."""
    good = _write_jsonl(tmp_path / "good.jsonl", [_GOOD] * 4)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = {}

    def read():
        with open(pipe) as fh:
            received["text"] = fh.read()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert main(["analyze", good, "--n-boot", "10", "--out", str(pipe)]) == 0
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)  # written through, not replaced by a file
    assert "Verdict: " in received["text"]


def test_huge_log_ratios_and_long_sequences_never_overflow():
    """Huge log-ratios and 1e5-token sequences give finite log10 columns, never overflow."""
    rng = np.random.default_rng(16)
    seqs = [rng.normal(0, 1, L) * 40 for L in (1, 1, 3, 3, 100_000, 100_000)]
    batch = TokenBatch.from_ragged(
        [np.minimum(x, 0) - 60 for x in seqs], [-np.maximum(x, 0) - 60 for x in seqs]
    )
    result = analyze(batch, edges="exact", n_boot=20)
    table, curves = result.table, result.curves([1, 10, 100_000])
    for col in ("log10_var_P", "log10_var_P_iid", "log10_var_P_emp", "log10_var_G_iid", "log10_var_G_emp"):
        assert np.all(np.isfinite(table[col])), col
    assert table["log10_var_P_iid"].iloc[-1] > 1e7  # Var(P_T) far beyond float64, in log10
    assert np.all(np.isfinite(curves["log10_var_G"]))
    assert np.isinf(curves["var_G"]).any()


# --------------------------------------------------------------------------- small samples (issue #18)
def test_small_buckets_say_too_few_and_do_not_vote():
    """A bucket under 20 sequences is marked too few and does not enter the overall verdict."""
    from variance_lab.rollouts.predictions import TOO_FEW

    assert MIN_BUCKET_SEQUENCES == 20
    assert overall_verdict([TOO_FEW, TOO_FEW]) == TOO_FEW
    assert overall_verdict([TOO_FEW, TOO_FEW, "n/a"]) == "n/a"  # the n/a bucket holds enough sequences
    assert overall_verdict([TOO_FEW, "corrected", TOO_FEW, TOO_FEW]) == "corrected"
    assert overall_verdict(["n/a"]) == "n/a"
    rng = np.random.default_rng(3)
    lengths = [4] * 30 + [40] * (MIN_BUCKET_SEQUENCES - 1)
    lps = [-rng.random(n) for n in lengths]
    olps = [lp + 0.01 * rng.standard_normal(lp.size) for lp in lps]
    result = analyze(TokenBatch.from_ragged(lps, [np.minimum(o, 0.0) for o in olps]), n_boot=200, seed=0)
    by_n = dict(zip(result.table["n_seq"], result.table["verdict"], strict=True))
    assert by_n[MIN_BUCKET_SEQUENCES - 1] == TOO_FEW
    assert by_n[30] != TOO_FEW
    assert result.verdict == by_n[30]


def test_autocorrelation_needs_enough_pairs():
    """The autocorrelation refuses 11 pairs, works at the minimum, and analyze notes why it is undefined."""
    from variance_lab.rollouts.statistics import MIN_AUTOCORRELATION_PAIRS, autocorrelation

    rng = np.random.default_rng(0)
    few = TokenBatch.from_ragged([-rng.random(12)], [-rng.random(12)])  # 11 pairs
    with pytest.raises(ValueError, match=r"too few sequences for the autocorrelation: 11 pairs"):
        autocorrelation(few)
    n = MIN_AUTOCORRELATION_PAIRS + 1  # exactly the minimum of pairs
    enough = TokenBatch.from_ragged([-rng.random(n)], [-rng.random(n)])
    assert autocorrelation(enough).n_pairs[1] == MIN_AUTOCORRELATION_PAIRS
    result = analyze(few, n_boot=0)
    assert result.acf is None
    assert result.acf_note.startswith("too few sequences")
    assert result.summary()["autocorrelation_note"] == result.acf_note


_EDGES = [1, 8, 16, 32, 64, 128]


def _sized_buckets(sizes, rng, *, constant=False):
    """Return a batch whose length buckets (edges :data:`_EDGES`) hold ``sizes`` sequences."""
    bounds = [(1, 7), (8, 15), (16, 31), (32, 63), (64, 127)]
    lens = np.concatenate(
        [rng.integers(lo, hi + 1, size=k) for (lo, hi), k in zip(bounds, sizes, strict=False)]
    )
    old = [-0.5 - rng.exponential(1.0, size=int(k)) for k in lens]
    new = old if constant else [o + rng.normal(0.0, 0.05, size=o.size) for o in old]
    return TokenBatch.from_ragged(new, old)


@pytest.mark.parametrize(
    ("sizes", "constant", "headline"),
    [
        ([19, 19], False, "Verdict: too few sequences: no length bucket holds 20 sequences"),
        (
            [19, 20],
            True,
            "Verdict: n/a: 1 length bucket holds 20 or more sequences, but no bucket's Var(G_T)",
        ),
        ([5, 21, 39, 29], True, "Verdict: n/a: 3 length buckets hold 20 or more sequences"),
    ],
)
def test_headline_counts_the_buckets_at_the_boundary(sizes, constant, headline):
    """The too-few headline only when no bucket holds 20 sequences (MIN_BUCKET_SEQUENCES); at 20 one does.

    It once read "no length bucket holds 20 sequences" over buckets of 21, 39 and 29 whose
    log-ratios were constant (no interval, verdict n/a) beside one small bucket.
    """
    from variance_lab.report.analysis_table import summary_lines

    assert MIN_BUCKET_SEQUENCES == 20
    batch = _sized_buckets(sizes, np.random.default_rng(len(sizes)), constant=constant)
    res = analyze(batch, _EDGES, n_boot=40, fit_models=False, folds=0)
    assert res.table["n_seq"].tolist() == sizes
    text = "\n".join(summary_lines(res.summary()))
    assert headline in text
    if max(sizes) >= 20:
        assert "no length bucket holds" not in text
        assert res.verdict == "n/a"


def test_a_bucket_of_20_sequences_is_judged():
    """At the boundary: 19 sequences are too few, 20 are judged (a verdict other than too few / n/a)."""
    res = analyze(
        _sized_buckets([19, 20], np.random.default_rng(7)), _EDGES, n_boot=100, fit_models=False, folds=0
    )
    assert res.table["verdict"].tolist()[0] == "too few sequences"
    assert res.table["verdict"].tolist()[1] not in ("too few sequences", "n/a")
    assert res.verdict not in ("too few sequences", "n/a")
