"""Estimates: Monte Carlo against the closed forms, verdicts, interval coverage."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from variance_lab import Gamma, LogNormal, TwoPoint, theory
from variance_lab.families import AR1
from variance_lab.schema import TIDY_COLUMNS
from variance_lab.simulate import run_accumulators, simulate
from variance_lab.simulate.estimates import STATISTICS, estimate

FAMILIES = [
    LogNormal(1.0, 0.1),
    Gamma(1.0, 0.1),
    Gamma(1.0, 2.0),
    TwoPoint(1.0, 0.1),
    TwoPoint(2.0, 0.5, q=0.3),
    LogNormal(1.5, 0.0),
    AR1(1.0, 0.1, rho=0.5),
]


def _get(df, T, stat):
    rows = df[(df["T"] == T) & (df["statistic"] == stat)]
    assert len(rows) == 1
    return rows.iloc[0]


def _predicted_se(fam, T, stat, n):
    """Theory's standard error of the Monte Carlo estimate ``stat`` from n draws."""
    x = stat[-1]
    var = theory.value(f"var_{x}", fam, T)
    if stat.startswith("var"):
        return var * theory.value(f"rel_se_var_{x}", fam, T, n=n)
    return math.sqrt(var / n)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f"{f.name}-{f.mu}-{f.sigma2}")
def test_agrees_with_closed_form_where_reliable(fam):
    """Estimates flagged reliable are within 4 predicted standard errors of the closed form."""
    n, grid = 20_000, [1, 3, 10, 30]
    df = simulate(fam, grid, n, seed=2024, workers=1, progress=False)
    checked = 0
    for T in grid:
        for stat in ("mean_P", "var_P", "mean_G", "var_G"):
            row = _get(df, T, stat)
            if not row["reliable"]:
                continue
            exact = theory.value(stat, fam, T)
            se = _predicted_se(fam, T, stat, n)
            tol = max(4 * se, 1e-12 * max(abs(exact), 1.0))
            assert abs(row["value"] - exact) <= tol, (T, stat, row["value"], exact, se)
            checked += 1
    assert checked >= 10  # G everywhere, P at small T


def test_schema_and_statistics():
    """Monte Carlo rows follow the tidy schema, intervals hold the values, ESS and SE match theory."""
    fam = LogNormal(1.0, 0.1)
    df = simulate(fam, [10, 1], 5000, seed=1, workers=1, progress=False)
    assert tuple(df.columns) == TIDY_COLUMNS
    assert (df["method"] == "monte_carlo").all()
    assert (df["family"] == "lognormal").all()
    assert df["T"].tolist() == [1] * len(STATISTICS) + [10] * len(STATISTICS)
    assert df["statistic"].tolist()[: len(STATISTICS)] == list(STATISTICS)
    for stat in ("mean_P", "var_P", "mean_G", "var_G"):
        row = _get(df, 10, stat)
        assert row["lo"] < row["value"] < row["hi"]
        assert row["se"] > 0
        assert row["log10_value"] == pytest.approx(math.log10(abs(row["value"])))
    assert df["reliable"].dtype == bool
    assert ((df["reason"] == "") == df["reliable"]).all()
    assert _get(df, 1, "ess_frac_P")["value"] == pytest.approx(theory.ess_frac_P(fam, 1), rel=0.05)
    assert _get(df, 1, "rel_se_var_P")["value"] == pytest.approx(theory.rel_se_var_P(fam, 1, 5000))


def test_verdict_var_P_unreliable_at_T100():
    """Seed's lognormal, T = 100, 1e5 draws: Var(P_T) is flagged, and comes out too small."""
    fam = LogNormal(1.0, 0.1)
    n = 10**5
    df = simulate(fam, [10, 100], n, seed=3, workers=2, progress=False)
    row = _get(df, 100, "var_P")
    assert not row["reliable"]
    assert "draws" in row["reason"]
    assert "cannot confirm" in row["reason"]
    assert theory.n_needed_P(fam, 100) > n
    assert row["value"] < theory.var_P(fam, 100)
    assert np.isfinite(row["value"])
    assert row["lo"] < row["value"] < row["hi"]  # shown, flagged
    khat = _get(df, 100, "khat_P")
    assert khat["value"] > 0.7
    assert not khat["reliable"]
    assert "k-hat" in khat["reason"]
    assert _get(df, 100, "var_G")["reliable"]
    assert _get(df, 10, "var_P")["reliable"]


def test_unreliable_rows_at_T1000_stay_finite_in_log10():
    """At T = 1000 the P_T rows are flagged unreliable and their log10 values stay finite."""
    df = simulate(LogNormal(1.0, 0.1), [1000], 4000, seed=5, workers=1, progress=False)
    assert np.isfinite(df["log10_value"]).all()
    assert not _get(df, 1000, "var_P")["reliable"]
    assert not _get(df, 1000, "mean_P")["reliable"]


def test_estimate_needs_two_paths():
    """An accumulator of one path raises ValueError."""
    acc = run_accumulators(LogNormal(1.0, 0.1), [1], 2, workers=1, progress=False)
    acc.count = 1
    with pytest.raises(ValueError, match="at least 2"):
        estimate(acc, LogNormal(1.0, 0.1))


def _coverage(fam, T, stat, n, seeds):
    hits = 0
    exact = theory.value(stat, fam, T)
    for seed in seeds:
        acc = run_accumulators(fam, [T], n, seed=seed, workers=1, progress=False)
        row = _get(estimate(acc, fam), T, stat)
        hits += row["lo"] <= exact <= row["hi"]
    return hits


COVERAGE_CASES = [
    (LogNormal(1.0, 0.1), 10, "var_G"),
    (LogNormal(1.0, 0.1), 100, "var_G"),
    (LogNormal(1.0, 0.1), 1, "var_P"),
    pytest.param(
        Gamma(1.0, 0.5),
        3,
        "var_P",
        marks=pytest.mark.xfail(
            reason="known limitation: the log-scale interval from the sample kurtosis undercovers "
            "for this heavy-tailed P_3 (366 of 400 at n = 20000, binomial p = 0.003); a better "
            "interval (bootstrap-t or from theory's kurtosis) is future work",
            strict=True,
        ),
    ),
    (TwoPoint(1.0, 0.1), 10, "var_G"),
]


@pytest.mark.parametrize(("fam", "T", "stat"), COVERAGE_CASES[:3])
def test_interval_coverage_small(fam, T, stat):
    """Intervals cover the exact value at 95 %: binomial test over 200 seeds."""
    seeds = range(200)
    hits = _coverage(fam, T, stat, 2000, seeds)
    assert binomtest(hits, len(seeds), 0.95).pvalue > 0.01, hits


@pytest.mark.slow
@pytest.mark.parametrize(("fam", "T", "stat"), COVERAGE_CASES)
def test_interval_coverage(fam, T, stat):
    """Intervals cover the exact value at 95 %: binomial test over 400 seeds at n = 20000."""
    seeds = range(1000, 1400)
    hits = _coverage(fam, T, stat, 20_000, seeds)
    assert binomtest(hits, len(seeds), 0.95).pvalue > 0.01, hits


def test_frames_concatenate_with_theory():
    """Monte Carlo and theory frames concatenate into one tidy frame."""
    fam = TwoPoint(1.0, 0.1)
    both = pd.concat([theory.tidy(fam, [1, 5]), simulate(fam, [1, 5], 1000, progress=False)])
    assert set(both["method"]) >= {"exact", "monte_carlo"}
