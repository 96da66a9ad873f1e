"""Tests of variance_lab.frameworks.logged: a run's log judged step by step, one bad record alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from variance_lab.frameworks import logged as lg
from variance_lab.frameworks import verl
from variance_lab.frameworks.logfiles import UnreadableRecord
from variance_lab.frameworks.tokenlaw import fit_law


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


def test_bad_record_names_file_record_field():
    """A bad field makes its record a row of its own naming file, record and field; the others are judged."""
    recs = [{"mismatch_kl": 0.001}, {"mismatch_kl": "abc"}, {"mismatch_kl": 0.002}]
    laws, _ = lg.analyze_logged(recs, batch_size=8, quantiles=[10], source="run.jsonl")
    assert laws["record"].tolist() == [1, 2, 3]
    assert laws["s2"].notna().tolist() == [True, False, True]
    assert laws["note"][1] == "run.jsonl: record 2: field 'mismatch_kl': expected a number, got 'abc'"
    assert laws["note"][0] == laws["note"][2] == ""
    with pytest.raises(ValueError, match=r"run\.jsonl: record 1: field 'mismatch_kl': expected a number"):
        lg.analyze_logged(recs[1:2], batch_size=8, quantiles=[10], source="run.jsonl")  # nothing to judge
    with pytest.raises(ValueError, match="record 1: no token-level metric"):
        lg.analyze_logged(
            [{"sampling_importance_ratio": 1}], batch_size=8, quantiles=[10], framework="nemo-rl", source="f"
        )


def test_one_bad_record_never_stops_the_others():
    """Unreadable lines, wrong types, impossible values: a 'not judged' row each, saying why; others judged.

    Each of them used to stop the whole file.
    """
    good = {"rollout_corr/chi2_token": 0.002, "rollout_corr/chi2_seq": 0.5}
    recs = [
        good | {"step": 0},
        UnreadableRecord("run.jsonl: record 2 (line 2)", "not JSON: Expecting value"),
        good | {"step": 2, "rollout_corr/chi2_seq": [1, 2]},
        {"step": 3, "rollout_corr/chi2_token": -2.0, "rollout_corr/chi2_seq": 0.5},  # below -1: no law
        ["not", "an", "object"],
        good | {"step": 5},
    ]
    laws, out = lg.analyze_logged(recs, batch_size=64, quantiles=[100], source="run.jsonl", n_batches=100)
    assert laws["record"].tolist() == [1, 2, 3, 4, 5, 6]
    assert laws["step"].tolist()[:1] + laws["step"].tolist()[2:4] + laws["step"].tolist()[5:] == [0, 2, 3, 5]
    assert math.isnan(laws["step"][1])
    judged = laws["s2"].notna().tolist()
    assert judged == [True, False, False, False, False, True]
    notes = laws["note"].tolist()
    assert notes[1] == "run.jsonl: record 2 (line 2): not JSON: Expecting value"
    assert "record 3: field 'rollout_corr/chi2_seq': expected a number" in notes[2]
    assert "record 4: rollout_corr/chi2_token = -2.0: no token law" in notes[3]
    assert "record 5: expected an object of metrics, got list" in notes[4]
    assert out["record"].tolist() == [1, 2, 3, 4, 5, 6]
    assert out["verdict"].tolist()[1:5] == ["not judged"] * 4
    assert out["agreement"].tolist()[1:5] == ["not judged"] * 4
    assert out["reason"].tolist()[1:5] == notes[1:5]
    assert out.attrs["not_judged"] == 4
    assert set(out["verdict"][[0, 5]]) <= {"reliable", "marginal", "unreliable"}


def test_verl_file_logger_records_are_unwrapped():
    """The file logger of verl writes {"step": N, "data": {...}} (tracking.py FileLogger.log): the data."""
    data = {
        "rollout_corr/kl": 0.0,
        "rollout_corr/chi2_token": math.expm1(0.02),
        "rollout_corr/chi2_seq": 6.9e7,
    }
    laws, out = lg.analyze_logged(
        [{"step": 7, "data": data}], batch_size=20000, quantiles=[1000], n_batches=40
    )
    assert laws["framework"][0] == "verl"
    assert laws["step"][0] == 7.0
    assert out["logged"][0] == 6.9e7


def test_extreme_step_judged_under_verls_clamp():
    """Most log-ratios past verl's clamp of 20 (chi2_token ~ 2.2e17): the step is judged under the clamp.

    Tokens y ~ N(20.5, 0.3^2) run through the verl mirror's compute_offpolicy_metrics (the clamp at
    +-SAFETY_BOUND, as verl 0.9.1): the law fitted from its kl and chi2_token recovers s^2 = 0.09
    within 4 standard errors (delta method on the two token means, their covariance included), and
    a normal step after it is judged as well.
    """
    rng = np.random.default_rng(np.random.SeedSequence(23))
    m, s = 20.5, 0.3
    y = m + s * rng.standard_normal((128, 100))
    met = verl.compute_offpolicy_metrics(y - 30.0, np.full_like(y, -30.0), np.ones_like(y))
    assert 1e17 < met["chi2_token"] < math.expm1(40.0)
    extreme = {f"rollout_corr/{k}": met[k] for k in ("kl", "chi2_token")} | {
        "rollout_corr/chi2_seq": met["chi2_seq"]
    }
    normal = {
        "rollout_corr/kl": 0.001,
        "rollout_corr/chi2_token": math.expm1(0.004),
        "rollout_corr/chi2_seq": 1.5,
    }
    laws, out = lg.analyze_logged([extreme, normal], batch_size=128, quantiles=[100], n_batches=100)
    assert laws["s2"].notna().all()
    assert laws["m"][0] == pytest.approx(m, abs=4 * s / math.sqrt(y.size))
    g = np.exp(2 * np.clip(y, -20, 20)).ravel()
    cov = np.cov(np.vstack([g, y.ravel()])) / y.size

    def fitted(gm, mm):
        return fit_law({"k": -mm, "c": gm - 1.0}, {"k": "kl", "c": "chi2"}, clamps={"c": verl.SAFETY_BOUND})[
            0
        ].s2

    g0, m0 = g.mean(), y.mean()
    jac = np.array(
        [
            (fitted(g0 * (1 + 1e-6), m0) - fitted(g0 * (1 - 1e-6), m0)) / (2e-6 * g0),
            (fitted(g0, m0 + 1e-6) - fitted(g0, m0 - 1e-6)) / 2e-6,
        ]
    )
    se = math.sqrt(jac @ cov @ jac)
    assert abs(laws["s2"][0] - s * s) < 4 * se
    assert out["verdict"].tolist()[1] in ("reliable", "marginal", "unreliable")


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
    assert frac["verdict"] == "reliable"  # no sequence can exceed C: every batch logs 0, the exact value
    assert frac["reason"].startswith("no sequence can exceed C = 2 under this law")


def test_fraction_of_zero_says_what_it_bounds():
    """A logged fraction of 0, P(P > C) tiny: the expected count and the rule-of-three bound.

    It used to read "unreliable: 10% needs 10^34258225557.0".
    """
    rec = {
        "rollout_corr/chi2_token": math.expm1(1e-12),
        "rollout_corr/rollout_is_ratio_fraction_high": 0.0,
        "rollout_corr/chi2_seq": 0.01,
    }
    _, out = lg.analyze_logged([rec], batch_size=256, quantiles=[100], ratio_level="sequence", n_batches=100)
    frac = out.set_index("metric").loc["rollout_corr/rollout_is_ratio_fraction_high"]
    assert frac["log10_target"] < -1e8  # log P ~ N(-5e-11, 1e-10): P > 2 is 69,000 SD out
    assert frac["verdict"] == "unreliable"
    assert "a batch of 256 expects" in frac["reason"]
    assert (
        "100% of batches log 0 of 256, which bounds the fraction below 0.0117 (95 %, rule of three)"
        in frac["reason"]
    )
    assert "needs 10^" not in frac["reason"]
    assert frac["agreement"] == "inside"


def test_ess_of_one_at_the_interval_of_one_is_inside():
    """An ESS logged as 1 (float32) against a predicted [1, 1] (0.99999... in float64) is inside."""
    rec = {"rollout_corr/chi2_token": 1e-12, "rollout_corr/rollout_is_eff_sample_size": 1.0}
    _, out = lg.analyze_logged([rec], batch_size=64, quantiles=[100], ratio_level="sequence", n_batches=100)
    ess = out.set_index("metric").loc["rollout_corr/rollout_is_eff_sample_size"]
    assert ess["hi"] < 1.0  # 0.99999999993: a strict comparison called the logged 1 "above"
    assert ess["lo"] > 1.0 - 1e-6
    assert ess["agreement"] == "inside"


def test_nemo_sequence_ratio_judged_at_the_runs_micro_batch_size():
    """NeMo-RL logs the sequence-level sampling_importance_ratio about micro-batch-size times the mean.

    40 batches (B = 48, lengths 10-60, tokens N(-0.01, 0.02)) through the NeMo-RL mirror with
    micro-batches of 4: judged with micro_batch_size=4 the logged values fall in the 90 % interval
    at its rate (binomial test), judged as micro-batches of one they are all above it.
    """
    from scipy import stats

    from variance_lab.frameworks import nemo_rl

    rng = np.random.default_rng(np.random.SeedSequence(23))
    B, T, m, s2 = 48, 60, -0.01, 0.02
    records = []
    for step in range(40):
        L = rng.integers(10, 61, size=B)
        mask = (np.arange(T)[None, :] < L[:, None]).astype(float)
        y = m + math.sqrt(s2) * rng.standard_normal((B, T))
        _, met = nemo_rl.clipped_pg_importance_weights(
            y - 1.0,
            np.full((B, T), -1.0),
            mask,
            sequence_level_importance_ratios=True,
            truncated_importance_sampling_type="tis",
            truncated_importance_sampling_ratio=2.0,
            micro_batch_size=4,
        )
        records.append({"step": step, "gen_kl_error": math.expm1(m + s2 / 2) - m, **met})  # k3 of the law
    judged = {}
    for size in (4, 1):
        _, out = lg.analyze_logged(
            records, batch_size=B, lengths=np.arange(10, 61), ratio_level="sequence", micro_batch_size=size
        )
        judged[size] = out[out["metric"] == "sampling_importance_ratio"]
    inside = int((judged[4]["agreement"] == "inside").sum())
    assert stats.binomtest(inside, 40, 0.9, alternative="less").pvalue > 1e-3, inside
    assert (judged[1]["agreement"] == "above").all()
    np.testing.assert_allclose(judged[4]["predicted"], 4 * judged[1]["predicted"].to_numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="micro_batch_size must be an integer >= 1, got 0"):
        lg.analyze_logged(records, batch_size=B, lengths=[30], micro_batch_size=0)


def test_slime_mis_and_prime_rl_logs_are_read_and_judged():
    """Slime's mis.py metrics and prime-rl's pooled mismatch KL are read and judged.

    A slime mis.py step (mis_k3_kl, mis_chi2_token, mis_chi2_seq) through the slime mirror is
    detected as slime and its chi2_seq judged under the law of its k3; a prime-rl step that logs
    only mismatch_kl/all/mean is detected as prime-rl.
    """
    from variance_lab.frameworks import slime_mis

    rng = np.random.default_rng(np.random.SeedSequence(31))
    B, T, m, s2 = 256, 20, -0.0025, 0.005
    records = []
    for step in range(20):
        y = m + math.sqrt(s2) * rng.standard_normal((B, T))
        _, _, met = slime_mis.compute_mis_weights(y - 1.0, np.full((B, T), -1.0), np.ones((B, T)))
        records.append({"step": step, **{k: float(v) for k, v in met.items()}})
    laws, out = lg.analyze_logged(records, batch_size=B, quantiles=[T], law_from="mis_k3_kl")
    assert laws["framework"][0] == "slime"
    assert laws["s2"].to_numpy() == pytest.approx(s2, rel=0.2)  # one batch's k3 estimate of the law
    chi2 = out[out["metric"] == "mis_chi2_seq"]
    assert len(chi2) == 20
    assert (chi2["agreement"] == "inside").sum() >= 14  # 90 % intervals: P(<14 of 20) < 1e-3
    prime = [{"step": 1, "mismatch_kl/all/mean": 0.05, "loss/mean": 0.1}]
    laws, out = lg.analyze_logged(prime, batch_size=64, quantiles=[100])
    assert laws["framework"][0] == "prime-rl"
    assert laws["s2"][0] == pytest.approx(0.1, rel=1e-12)  # k3 = s^2 / 2 for mean-one ratios
    assert out.empty  # prime-rl logs no sequence-level weight
