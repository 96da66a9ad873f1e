"""Tests of variance_lab.frameworks.logged: token law, predicted sequence metrics, verdicts, coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from variance_lab.frameworks import logfiles, nemo_rl, trl, verl
from variance_lab.frameworks import logged as lg

KINDS = ("k3", "chi2", "mult", "absdiff", "tis_abs")


def _reference(kind: str, m: float, s: float) -> float:
    """E[g(y)], y ~ N(m, s^2), by quadrature (independent of the closed forms)."""
    g = {
        "k3": lambda y: math.expm1(y) - y,
        "chi2": lambda y: math.expm1(2 * y),
        "mult": lambda y: math.exp(abs(y)),
        "absdiff": abs,
        "tis_abs": lambda y: abs(math.expm1(y)),
    }[kind]
    f = lambda z: g(m + s * z) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    return (
        integrate.quad(f, -12, 0, epsabs=1e-14, epsrel=1e-12)[0]
        + integrate.quad(f, 0, 12, epsabs=1e-14, epsrel=1e-12)[0]
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("m", "s"), [(-0.005, 0.1), (0.02, 0.05), (-0.5, 1.0)])
def test_token_metric_matches_quadrature(kind, m, s):
    """Token metric matches quadrature."""
    assert lg.token_metric(kind, m, s * s) == pytest.approx(_reference(kind, m, s), rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("kind", KINDS)
def test_fit_inverts_each_metric(kind):
    """Fit inverts each metric."""
    s2 = 0.0123
    value = lg.token_metric(kind, -s2 / 2, s2)
    law, _fits = lg.fit_law({"x": value}, {"x": kind})
    assert law.s2 == pytest.approx(s2, rel=1e-8)
    assert law.m == pytest.approx(-s2 / 2, rel=1e-8)
    # with a kl metric the mean is the logged one
    law2, _ = lg.fit_law({"x": lg.token_metric(kind, 0.01, s2), "kl": -0.01}, {"x": kind, "kl": "kl"})
    assert law2.m == 0.01
    assert law2.s2 == pytest.approx(s2, rel=1e-8)


def test_fit_from_verl_mirror_within_se():
    """The law fitted from verl's logged chi2_token of lognormal tokens is the true one, within 4 SE."""
    rng = np.random.default_rng(np.random.SeedSequence(11))
    m, s = 0.0, 0.1
    y = m + s * rng.standard_normal((256, 512))
    mask = np.ones_like(y)
    metrics = verl.compute_offpolicy_metrics(y - 1.0, np.full_like(y, -1.0), mask)
    law, _fits = lg.fit_law(
        {k: metrics[k] for k in ("kl", "chi2_token", "k3_kl")},
        {"kl": "kl", "chi2_token": "chi2", "k3_kl": "k3"},
    )
    # s2 = log1p(chi2)/2 - m: its SE from that of the sample mean of e^{2y}, by the delta method
    e2, e4 = math.exp(2 * m + 2 * s * s), math.exp(4 * m + 8 * s * s)
    se = math.sqrt((e4 - e2 * e2) / y.size) / e2 / 2
    assert abs(law.s2 - s * s) < 4 * se + 4 * abs(metrics["kl"] + m)  # m is fitted too
    assert law.source == "chi2_token"


def test_law_from_picks_the_metric():
    """law_from= sets the law from the named metric, and names a bad one."""
    kinds = {"a": "mult", "b": "k3"}
    values = {"a": 1.024, "b": 0.0027}
    assert lg.fit_law(values, kinds)[0].source == "b"
    assert lg.fit_law(values, kinds, law_from="a")[0].source == "a"
    with pytest.raises(ValueError, match="law_from 'c' is not a token metric"):
        lg.fit_law(values, kinds, law_from="c")
    with pytest.raises(ValueError, match="does not log it"):
        lg.fit_law({"b": 0.0027}, kinds, law_from="a")


def test_fit_rejects_impossible_values():
    """Fit rejects impossible values."""
    with pytest.raises(ValueError, match=r"token_mult_prob_error = 0\.9 is impossible"):
        lg.fit_law({"token_mult_prob_error": 0.9}, {"token_mult_prob_error": "mult"})
    with pytest.raises(ValueError, match="no token-level metric"):
        lg.fit_law({}, {"token_mult_prob_error": "mult"})


def test_targets_match_quadrature():
    """E[min(P, C)], E[P 1{P <= C}], P(P > C) and their n_needed at one length, against quadrature."""
    law = lg.TokenLaw(-0.002, 0.004)
    L = 500
    M, S = law.sequence(L)
    draw, grid = lg.length_sampler(quantiles=[L])
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
        out = lg.predict(law, metric, 64, draw, grid, n_batches=50)
        assert out["target"] == pytest.approx(e1, rel=1e-7)
        assert out["n_needed"] == pytest.approx((e2 - e1 * e1) / (0.1 * e1) ** 2, rel=1e-6)


def test_verl_chi2_seq_example():
    """Verl's chi2_seq at T = 1000, m = 0, sigma = 0.1, 20,000 sequences: e^20 - 1, needs 10^19.4."""
    rec = {
        "rollout_corr/kl": 0.0,
        "rollout_corr/chi2_token": math.expm1(0.02),
        "rollout_corr/chi2_seq": 6.9e7,
    }
    laws, out = lg.analyze_logged([rec], batch_size=20000, quantiles=[1000], n_batches=40)
    assert laws["framework"][0] == "verl"
    assert laws["s2"][0] == pytest.approx(0.01, rel=1e-12)
    row = out.iloc[0]
    assert row["target"] == pytest.approx(math.expm1(20.0), rel=1e-9)
    assert row["log10_n_needed"] == pytest.approx(math.log10(math.expm1(40.0) / 0.01), rel=1e-9)
    assert row["verdict"] == "unreliable"
    assert row["agreement"] == "inside"
    assert row["predicted"] < row["target"] / 10  # the median batch sees far less than the truth


def test_nemo_2269_bracketed_by_its_token_metrics():
    """NeMo-RL #2269 (B = 256, 8-10k tokens, TIS 2): the two token metrics' laws bracket the logged value."""
    rec = {
        "train/token_mult_prob_error": 1.024,
        "train/gen_kl_error": 0.0027,
        "train/sampling_importance_ratio": 0.0596,
        "train/is_oob_ratio": 0.011,
    }
    kw = {"batch_size": 256, "quantiles": [8000, 10000], "n_batches": 200, "ratio_level": "sequence"}
    _, wide = lg.analyze_logged([rec], **kw)
    _, narrow = lg.analyze_logged([rec], law_from="token_mult_prob_error", **kw)
    assert list(wide["agreement"]) == ["above", "above"]
    assert list(narrow["agreement"]) == ["below", "below"]


def test_length_sampler_quantiles_and_sample():
    """Length sampler quantiles and sample."""
    rng = np.random.default_rng(np.random.SeedSequence(3))
    draw, _ = lg.length_sampler(quantiles=[8000, 10000])
    x = draw(rng, 20000)
    assert x.min() >= 8000
    assert x.max() <= 10000
    assert abs(x.mean() - 9000) < 4 * (2000 / math.sqrt(12)) / math.sqrt(x.size)
    draw, _grid = lg.length_sampler(lengths=[3, 5, 7])
    assert set(np.unique(draw(rng, 100))) <= {3.0, 5.0, 7.0}
    with pytest.raises(ValueError, match="must not decrease"):
        lg.length_sampler(quantiles=[10, 5])
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        lg.length_sampler(lengths=[0, 5])


def test_bad_record_names_file_record_field():
    """Bad record names file record field."""
    recs = [{"mismatch_kl": 0.001}, {"mismatch_kl": "abc"}]
    with pytest.raises(ValueError, match=r"run\.jsonl: record 2: field 'mismatch_kl': expected a number"):
        lg.analyze_logged(recs, batch_size=8, quantiles=[10], source="run.jsonl")
    with pytest.raises(ValueError, match="record 1: no token-level metric"):
        lg.analyze_logged(
            [{"sampling_importance_ratio": 1}], batch_size=8, quantiles=[10], framework="nemo-rl", source="f"
        )


# --------------------------------------------------------------------------------------
# coverage of the prediction intervals, through the frameworks' mirrors
# --------------------------------------------------------------------------------------
def _mirror_values(rng, law: lg.TokenLaw, B: int, qs) -> dict[str, float]:
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
    law, B, qs, level = lg.TokenLaw(-0.01, 0.02), 48, [10, 60], 0.9
    draw, grid = lg.length_sampler(quantiles=qs)
    metrics = [m for fw in ("nemo-rl", "trl", "verl") for m in logfiles.SEQUENCE_METRICS[fw]]
    rng = np.random.default_rng(np.random.SeedSequence(5))
    Z = rng.standard_normal((1000, B))
    Ls = draw(rng, (1000, B))
    intervals = {m.name: lg.predict(law, m, B, draw, grid, level=level, _draws=(Z, Ls)) for m in metrics}
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


@pytest.mark.slow
def test_nemo_2269_sparse_law_reproduces():
    """45 % of tokens N(-v/2, v), the rest exact: token_mult_prob_error 1.024 and the logged values inside."""
    q = 0.45
    v = optimize.brentq(lambda v: (1 - q) + q * lg.token_metric("mult", -v / 2, v) - 1.024, 1e-8, 1.0)
    rng = np.random.default_rng(np.random.SeedSequence(1))
    sir, oob, mult = [], [], []
    for _ in range(40):
        B, T = 256, 10000
        L = rng.integers(8000, 10001, size=B)
        mask = (np.arange(T)[None, :] < L[:, None]).astype(float)
        hit = rng.random((B, T)) < q
        y = np.where(hit, -v / 2 + math.sqrt(v) * rng.standard_normal((B, T)), 0.0)
        gen = np.full((B, T), -1.0)
        _, met = nemo_rl.clipped_pg_importance_weights(
            gen + y,
            gen,
            mask,
            sequence_level_importance_ratios=True,
            truncated_importance_sampling_type="tis",
            truncated_importance_sampling_ratio=2.0,
        )
        sir.append(met["sampling_importance_ratio"])
        oob.append(met["is_oob_ratio"])
        mult.append(met["token_mult_prob_error"])
    assert np.quantile(sir, 0.05) <= 0.0596 <= np.quantile(sir, 0.95)
    assert np.quantile(oob, 0.05) <= 0.011 <= np.quantile(oob, 0.95)
    assert abs(np.mean(mult) - 1.024) < 4 * np.std(mult, ddof=1) / math.sqrt(len(mult)) + 1e-6


def test_rows_without_metrics_are_skipped_and_null_is_missing():
    """An evaluation row is skipped and counted; a null metric is one the step did not log."""
    recs = [
        {"step": 0, "mismatch_kl": 0.001},
        {"step": 1, "eval/reward": 0.5},
        {"step": 2, "mismatch_kl": 0.002, "other/mismatch_kl": None},
    ]
    laws, out = lg.analyze_logged(recs, batch_size=8, quantiles=[10], framework="prime-rl")
    assert laws["step"].tolist() == [0.0, 2.0]
    assert out.attrs["skipped"] == 1
    nemo = [{"token_mult_prob_error": 1.01, "sampling_importance_ratio": None}]
    _, out = lg.analyze_logged(nemo, batch_size=8, quantiles=[10], ratio_level="sequence")
    assert out["agreement"].tolist() == ["not logged", "not logged"]
    with pytest.raises(ValueError, match="no record logs any of"):
        lg.analyze_logged([{"x": 1}], batch_size=8, quantiles=[10], framework="prime-rl")


def test_degenerate_laws_give_finite_verdicts():
    """s2 = 0 (engines agree) and a law that makes a fraction impossible: no warning, clear verdicts."""
    recs = [{"rollout_corr/chi2_token": 0.0, "rollout_corr/chi2_seq": 0.0}]
    laws, out = lg.analyze_logged(recs, batch_size=64, quantiles=[100], ratio_level="sequence")
    assert laws["s2"][0] == 0.0
    row = out.set_index("metric").loc["rollout_corr/chi2_seq"]
    assert row["target"] == 0.0
    assert row["verdict"] == "reliable"
    frac = out.set_index("metric").loc["rollout_corr/rollout_is_ratio_fraction_high"]
    assert frac["target"] == 0.0
    assert frac["verdict"] == "unreliable"


def test_read_metrics_skips_blank_lines(tmp_path):
    """Read records skips blank lines."""
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert logfiles.read_metrics(str(f)) == [{"a": 1}, {"a": 2}]


def test_read_metrics_csv_and_bad_lines(tmp_path):
    """CSV rows leave empty cells out; a line that is not an object names its record and line."""
    f = tmp_path / "r.csv"
    f.write_text("step,kl\n1,0.5\n2,\n")
    assert logfiles.read_metrics(f) == [{"step": "1", "kl": "0.5"}, {"step": "2"}]
    g = tmp_path / "r.jsonl"
    g.write_text('{"a": 1}\n\n[1]\n')
    with pytest.raises(ValueError, match=r"record 2 \(line 3\): expected an object"):
        logfiles.read_metrics(g)
    with pytest.raises(ValueError, match="no such file"):
        logfiles.read_metrics(tmp_path / "none.jsonl")


def test_read_lengths(tmp_path):
    """A length dump: numbers separated by commas or blanks; a bad one is named."""
    f = tmp_path / "l.txt"
    f.write_text("100 200, 300\n400\n")
    assert logfiles.read_lengths(f) == [100.0, 200.0, 300.0, 400.0]
    f.write_text("100 x\n")
    with pytest.raises(ValueError, match="length 2: expected a number, got 'x'"):
        logfiles.read_lengths(f)


def test_render_logged_formats():
    """The report renders the two frames; an unknown format is refused."""
    from variance_lab.report.logged_table import render_logged

    laws, metrics = lg.analyze_logged(
        [{"token_mult_prob_error": 1.024, "sampling_importance_ratio": 0.06}],
        batch_size=8,
        quantiles=[100],
        framework="nemo-rl",
        ratio_level="sequence",
        n_batches=100,
    )
    text = render_logged(laws, metrics, title="t")
    assert text.startswith("# t\n")
    assert "sampling_importance_ratio" in text
    assert render_logged(laws, metrics, "csv", title="t").startswith("step,metric,logged")
    with pytest.raises(ValueError, match="unknown format 'html'"):
        render_logged(laws, metrics, "html", title="t")
