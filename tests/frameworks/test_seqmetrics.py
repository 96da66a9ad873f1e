"""Tests of variance_lab.frameworks.seqmetrics: predicted sequence metrics, targets, intervals, verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from variance_lab.frameworks import logfiles, nemo_rl, trl, verl
from variance_lab.frameworks import seqmetrics as sm
from variance_lab.frameworks.tokenlaw import TokenLaw


def test_targets_match_quadrature():
    """E[min(P, C)], E[P 1{P <= C}], P(P > C) and their n_needed at one length, against quadrature."""
    law = TokenLaw(-0.002, 0.004)
    L = 500
    M, S = law.sequence(L)
    draw, grid = sm.length_sampler(quantiles=[L])
    for kind, g in (
        ("trunc_mean", lambda x: min(math.exp(x), 2.0)),
        ("masked_mean", lambda x: math.exp(x) if x <= math.log(2) else 0.0),
        ("frac_above", lambda x: float(x > math.log(2))),
    ):
        dens = stats.norm(M, S).pdf
        pts = [math.log(2)]
        e1 = integrate.quad(lambda x, g=g, dens=dens: g(x) * dens(x), M - 12 * S, M + 12 * S, points=pts)[0]
        e2 = integrate.quad(
            lambda x, g=g, dens=dens: g(x) ** 2 * dens(x), M - 12 * S, M + 12 * S, points=pts
        )[0]
        metric = logfiles.SequenceMetric("x", kind, "seq", 2.0)
        out = sm.predict(law, metric, 64, draw, grid, n_batches=50)
        assert out["target"] == pytest.approx(e1, rel=1e-7)
        assert out["n_needed"] == pytest.approx((e2 - e1 * e1) / (0.1 * e1) ** 2, rel=1e-6)


def test_length_sampler_quantiles_and_sample():
    """Length sampler quantiles and sample."""
    rng = np.random.default_rng(np.random.SeedSequence(3))
    draw, _ = sm.length_sampler(quantiles=[8000, 10000])
    x = draw(rng, 20000)
    assert x.min() >= 8000
    assert x.max() <= 10000
    assert abs(x.mean() - 9000) < 4 * (2000 / math.sqrt(12)) / math.sqrt(x.size)
    draw, _grid = sm.length_sampler(lengths=[3, 5, 7])
    assert set(np.unique(draw(rng, 100))) <= {3.0, 5.0, 7.0}
    with pytest.raises(ValueError, match="must not decrease"):
        sm.length_sampler(quantiles=[10, 5])
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        sm.length_sampler(lengths=[0, 5])


def _mirror_values(rng, law: TokenLaw, B: int, qs) -> dict[str, float]:
    """One batch of token log-ratios from the law, run through the mirrors: their logged values."""
    u = rng.random(B)
    L = np.round(np.interp(u, np.linspace(0, 1, len(qs)), qs)).astype(int)
    T = int(L.max())
    mask = (np.arange(T)[None, :] < L[:, None]).astype(float)
    y = law.m + math.sqrt(law.s2) * rng.standard_normal((B, T))
    gen = np.full((B, T), -2.0)
    _, nm = nemo_rl.clipped_pg_importance_weights(
        gen + y,
        gen,
        mask,
        sequence_level_importance_ratios=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
        micro_batch_size=1,  # NeMo-RL logs the mean weight only for micro-batches of one
    )
    _, tm = trl.vllm_importance_sampling_correction(gen + y, gen, mask)
    _, _, vm = verl.compute_rollout_correction_and_rejection_mask(
        gen + y, gen, mask, rollout_is="sequence", rollout_is_threshold=2.0
    )
    vm = {k.removeprefix("rollout_corr/"): v for k, v in vm.items()}
    return {
        "rollout_corr/rollout_is_mean": vm["rollout_is_mean"],
        "rollout_corr/rollout_is_eff_sample_size": vm["rollout_is_eff_sample_size"],
        "rollout_corr/rollout_is_ratio_fraction_high": vm["rollout_is_ratio_fraction_high"],
        "sampling_importance_ratio": nm["sampling_importance_ratio"],
        "is_oob_ratio": nm["is_oob_ratio"],
        "sampling/importance_sampling_ratio/mean": tm["sampling/importance_sampling_ratio/mean"],
        "rollout_corr/chi2_seq": vm["chi2_seq"],
    }


def _coverage(n_seeds: int) -> dict[str, int]:
    law, B, qs, level = TokenLaw(-0.01, 0.02), 48, [10, 60], 0.9
    draw, grid = sm.length_sampler(quantiles=qs)
    metrics = [m for fw in ("nemo-rl", "trl", "verl") for m in logfiles.SEQUENCE_METRICS[fw]]
    rng = np.random.default_rng(np.random.SeedSequence(5))
    Z = rng.standard_normal((1000, B))
    Ls = draw(rng, (1000, B))
    intervals = {m.name: sm.predict(law, m, B, draw, grid, level=level, _draws=(Z, Ls)) for m in metrics}
    hits = dict.fromkeys(intervals, 0)
    for seed in range(n_seeds):
        values = _mirror_values(np.random.default_rng(np.random.SeedSequence([17, seed])), law, B, qs)
        for name, out in intervals.items():
            hits[name] += out["lo"] <= values[name] <= out["hi"]
    return hits


def _check_coverage(hits: dict[str, int], n: int, level: float = 0.9) -> None:
    for name, k in hits.items():
        p = stats.binomtest(k, n, level, alternative="less").pvalue
        assert p > 1e-3, f"{name}: {k}/{n} inside the {level:.0%} interval (p = {p:.2g})"


def test_interval_coverage_small():
    """Interval coverage small."""
    hits = _coverage(60)
    _check_coverage(hits, 60)


@pytest.mark.slow
def test_interval_coverage_full():
    """Interval coverage full."""
    hits = _coverage(1000)
    _check_coverage(hits, 1000)
    for name, k in hits.items():  # not far above either: the interval is not needlessly wide
        assert stats.binomtest(k, 1000, 0.9, alternative="greater").pvalue > 1e-3, name


def test_predict_steps_is_predict_at_each_step():
    """The vectorised predictions of many steps equal predict() law by law (the same draws), every metric."""
    rng = np.random.default_rng(np.random.SeedSequence(8))
    B, draw_n = 48, 120
    draw, grid = sm.length_sampler(quantiles=[10, 400])
    Z = rng.standard_normal((draw_n, B))
    L = draw(rng, (draw_n, B))
    metrics = [mt for fw in ("verl", "trl", "nemo-rl") for mt in logfiles.SEQUENCE_METRICS[fw]]
    m = np.array([-0.002, 0.0, -0.02, 0.01, -1e-6])
    s2 = np.array([0.004, 0.0, 0.04, 0.002, 2e-6])
    many = sm.predict_steps(m, s2, metrics, B, (Z, L), grid)
    for k in range(m.size):
        for mt in metrics:
            one = sm.predict(TokenLaw(m[k], s2[k]), mt, B, draw, grid, _draws=(Z, L))
            for key, value in one.items():
                got = many[mt.name][key][k]
                if isinstance(value, str):
                    assert got == value, (mt.name, k, key)
                else:
                    assert got == pytest.approx(value, rel=1e-12, nan_ok=True), (mt.name, k, key)


def test_agreement_includes_the_ends_within_float32_rounding():
    """Exactly at an end is inside; within LOGGED_RTOL of it (a float32 rounding) too; beyond, outside."""
    lo, hi = 0.25, 1.0
    got = sm.agreement([0.25, 1.0, 1.0 + 1e-7, 0.25 * (1 - 1e-7), 1.0 + 2e-6, 0.25 - 1e-6, math.nan], lo, hi)
    assert got.tolist() == ["inside", "inside", "inside", "inside", "above", "below", "not logged"]
    one = float(np.float32(0.99999999))  # what a float32 framework logs for an ESS of 0.99999999
    assert sm.agreement(one, 0.99999999, 0.99999999).tolist() == "inside"


def test_fraction_reasons():
    """P(P > C) = 0: reliable, logged exactly; B p < 1: the expected count, the rule of three; else the SE."""
    frac = logfiles.SEQUENCE_METRICS["verl"][3]
    assert frac.kind == "frac_above"
    draw, grid = sm.length_sampler(quantiles=[200])
    zero = sm.predict(TokenLaw(0.0, 0.0), frac, 100, draw, grid, n_batches=50)
    assert (zero["verdict"], zero["target"]) == ("reliable", 0.0)
    rare = sm.predict(TokenLaw(-5e-5, 1e-4), frac, 100, draw, grid, n_batches=50)
    assert rare["target"] * 100 < 1
    assert rare["reason"].startswith(
        "a batch of 100 expects 3.3e-05 sequences above C = 2 (P(P > C) = 3.3e-07)"
    )
    assert "bounds the fraction below 0.03 (95 %, rule of three)" in rare["reason"]
    common = sm.predict(TokenLaw(-0.005, 0.01), frac, 100, draw, grid, n_batches=50)
    assert common["target"] * 100 > 1
    assert common["reason"].startswith("relative standard error")
