"""The pretrained-model runs' analysis: profiles, the one-line model, variance shares, staleness."""

import gzip
import json

import numpy as np
import pytest

from variance_lab.lm.analysis import (
    EDGES,
    RATIOS,
    STALE_CORRECTIONS,
    fit_lag_law,
    kept_mass_table,
    length_profile,
    mismatch_by_entropy,
    mismatch_by_probability,
    ratio_batch,
    read_lm_run,
    read_token_field,
    staleness_table,
    update_scale,
    variance_shares,
)
from variance_lab.rollouts import TokenBatch


def _batch(rng, n=400, *, scale=0.05, mismatch=0.0, lag=None):
    """Sequences of 1-256 tokens, old probabilities from Beta(2, 1), d_t = scale (1 - p_t) z_t."""
    lengths = rng.integers(1, 257, size=n)
    total = int(lengths.sum())
    p = rng.beta(2.0, 1.0, size=total).clip(1e-6, 1.0)
    old = np.log(p)
    z = rng.standard_normal(total)
    new = np.minimum(old + scale * (1.0 - p) * z, 0.0)
    extra = {}
    if mismatch or lag is not None:
        m = mismatch * rng.standard_normal(total)
        if lag is not None:
            m = m * np.repeat(np.sqrt(lag), lengths)
        extra["rollout_logp"] = np.minimum(old - m, 0.0)
    prompt = np.repeat(np.arange(n // 4), 4)
    return TokenBatch.from_flat(new, old, lengths, prompt_id=prompt, **extra)


def test_update_scale_recovers_the_generating_scale():
    """d_t = c (1 - p_t) z_t: the fitted c is within 3 standard errors of c (delta method on E z^2)."""
    rng = np.random.default_rng(0)
    batch = _batch(rng, scale=0.05)
    q = 1.0 - np.exp(batch.old_logp)
    c = update_scale(batch)
    # c^2 = sum(q^2 z^2) / sum(q^2): its sd is c^2 sqrt(2 sum q^4) / sum q^2, so sd(c) about half that / c
    sd_c = 0.05 * np.sqrt(2.0 * np.sum(q**4)) / np.sum(q**2) / 2.0
    assert abs(c - 0.05) < 3.0 * sd_c


def _relative_se(batch):
    """Per bucket, the standard error of obs/pred: half the relative SE of the mean of d_t^2."""
    from variance_lab.rollouts.statistics import length_buckets

    bucket, _ = length_buckets(batch.lengths, np.asarray(EDGES))
    tok = np.repeat(bucket, batch.lengths)
    d2 = batch.log_ratio**2
    out = []
    for j in np.unique(tok):
        sel = tok == j
        out.append(0.5 * np.std(d2[sel]) / np.sqrt(sel.sum()) / np.mean(d2[sel]))
    return np.array(out)


def test_length_profile_matches_the_model_and_counts_every_token():
    """Each bucket's observed RMS is within 4 SE of the one-line prediction; counts add up."""
    batch = _batch(np.random.default_rng(1), n=800)
    prof = length_profile(batch)
    assert prof["n_tokens"].sum() == batch.n_tokens
    assert prof["n_sequences"].sum() == len(batch)
    assert list(prof["T_min"]) == list(EDGES[:-1])
    se = _relative_se(batch)
    assert np.all(np.abs(prof["obs_over_pred"] - 1.0) < 4.0 * se)
    assert np.all((prof["share_large"] >= 0) & (prof["share_large"] <= 1))


def test_length_profile_sees_a_length_effect():
    """A run whose long sequences move half as much is off the one-line model in those buckets."""
    rng = np.random.default_rng(2)
    batch = _batch(rng, n=800)
    d = batch.log_ratio.copy()
    long = np.repeat(batch.lengths >= 128, batch.lengths)
    d[long] *= 0.5
    halved = TokenBatch.from_flat(
        np.minimum(batch.old_logp + d, 0.0), batch.old_logp, batch.lengths, prompt_id=batch.prompt_id
    )
    prof = length_profile(halved).set_index("T_min")
    se = dict(zip(prof.index, _relative_se(halved), strict=True))
    ratio = prof.loc[128, "obs_over_pred"] / prof.loc[64, "obs_over_pred"]
    assert abs(ratio - 0.5) < 4.0 * 0.5 * np.hypot(se[128], se[64])
    assert abs(prof.loc[64, "obs_over_pred"] / prof.loc[32, "obs_over_pred"] - 1.0) < 4.0 * np.hypot(
        se[64], se[32]
    )


def test_variance_shares_add_to_one_and_find_the_bigger_part():
    """Shares add to one; a mismatch ten times the update takes nearly all the variance."""
    batch = _batch(np.random.default_rng(3), mismatch=0.2)
    shares = variance_shares(batch)
    parts = shares[["share_update", "share_mismatch", "share_cross"]].sum(axis=1)
    np.testing.assert_allclose(parts, 1.0, rtol=1e-12)
    assert set(shares["scale"]) == {"sum", "mean"}
    big = shares[shares["n_sequences"] >= 50]
    assert np.all(big["share_mismatch"] > 0.9)


def test_mismatch_by_probability_partitions_the_tokens():
    """Bins hold every token once; their squared-mismatch shares add to one."""
    batch = _batch(np.random.default_rng(4), mismatch=0.02)
    table = mismatch_by_probability(batch)
    assert table["n_tokens"].sum() == batch.n_tokens
    np.testing.assert_allclose(table["share_sq"].sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(table["share_tokens"].sum(), 1.0, rtol=1e-12)


def test_mismatch_by_entropy_recovers_a_mismatch_that_grows_with_entropy():
    """m_t = 0.01 H_t z_t: per bin, the mean of m^2 is 1e-4 mean(H^2) within 4 standard errors."""
    rng = np.random.default_rng(8)
    batch = _batch(rng, mismatch=0.0)
    h = rng.uniform(0.0, 8.0, size=batch.n_tokens)
    m = 0.01 * h * rng.standard_normal(batch.n_tokens)
    old = batch.old_logp - 1.0  # |m| would need 12 sd to push rollout_logp above 0
    batch = TokenBatch.from_flat(batch.logp - 1.0, old, batch.lengths, rollout_logp=old - m)
    table = mismatch_by_entropy(batch, h)
    assert table["n_tokens"].sum() == batch.n_tokens
    np.testing.assert_allclose(table["share_sq"].sum(), 1.0, rtol=1e-12)
    assert list(table["h_lo"]) == [0.0, 0.5, 1.0, 2.0, 4.0, 6.0]
    for row in table.itertuples():
        sel = (h >= row.h_lo) & (h < row.h_hi)
        # given H, m^2 has mean 1e-4 H^2 and variance 2e-8 H^4
        expected = 1e-4 * np.mean(h[sel] ** 2)
        se = np.sqrt(2e-8 * np.sum(h[sel] ** 4)) / sel.sum()
        assert abs(row.rms**2 - expected) < 4.0 * se
    assert np.all(np.diff(table["rms"]) > 0)


def test_mismatch_by_entropy_names_bad_input():
    """The entropy must match the tokens and be finite and >= 0; bins start at 0."""
    batch = _batch(np.random.default_rng(9), n=20, mismatch=0.01)
    h = np.ones(batch.n_tokens)
    with pytest.raises(ValueError, match="entropy has shape"):
        mismatch_by_entropy(batch, h[:-1])
    with pytest.raises(ValueError, match=r"finite and >= 0, got -1\.0"):
        mismatch_by_entropy(batch, np.r_[h[:-1], -1.0])
    with pytest.raises(ValueError, match="edges from 0"):
        mismatch_by_entropy(batch, h, bins=(0.5, 1.0))
    plain = TokenBatch.from_flat(batch.logp, batch.old_logp, batch.lengths)
    with pytest.raises(ValueError, match="needs rollout_logp"):
        mismatch_by_entropy(plain, h)


def test_staleness_grows_with_the_lag_and_the_law_fits_it():
    """Mismatch variance proportional to the lag: var_token rises linearly, R^2 near 1, ESS falls."""
    rng = np.random.default_rng(5)
    n = 800
    lag = np.repeat(np.arange(4), n // 4)
    batch = _batch(rng, n=n, mismatch=0.05, lag=lag)
    table = staleness_table(batch, lag)
    assert list(table["lag"]) == [0, 1, 2, 3]
    assert table["n_sequences"].tolist() == [200] * 4
    assert np.all(np.diff(table["var_token"]) > 0)
    assert np.all(np.diff(table["ess_frac_gspo"]) < 0)
    for c in STALE_CORRECTIONS:
        assert f"{c.split(':')[0]}_modified" in table
    assert table["tis_modified"].iloc[0] <= table["tis_modified"].iloc[-1]
    law = fit_lag_law(table["lag"], table["var_token"])
    assert law["r2"] > 0.99
    # slope: each lag adds 0.05^2 of mismatch variance per token
    assert law["coef"][1] == pytest.approx(0.05**2, rel=0.1)
    quad = fit_lag_law(table["lag"], table["var_token"], degree=2)
    assert quad["r2"] >= law["r2"]


def test_fit_lag_law_is_exact_on_a_line():
    """A quadratic law recovers an exact quadratic."""
    lag = np.arange(5.0)
    law = fit_lag_law(lag, 1.0 + 2.0 * lag + 0.5 * lag**2, degree=2)
    np.testing.assert_allclose(law["coef"], [1.0, 2.0, 0.5], atol=1e-10)
    assert law["r2"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda b: variance_shares(b), "needs rollout_logp"),
        (lambda b: mismatch_by_probability(b), "needs rollout_logp"),
        (lambda b: staleness_table(b, np.zeros(len(b), int)), "needs rollout_logp"),
        (lambda b: fit_lag_law([0, 1], [1, 2]), "length > 2"),
        (lambda b: fit_lag_law([0, 1, 2, 3], [1, 2, 3, 4], degree=3), "degree"),
    ],
)
def test_bad_input_is_named(call, match):
    """Bad input is named."""
    batch = _batch(np.random.default_rng(6), n=20)
    with pytest.raises(ValueError, match=match):
        call(batch)


def test_bad_lags_and_bins_are_named():
    """A lag per sequence and increasing bins in [0, 1] are required."""
    batch = _batch(np.random.default_rng(7), n=20, mismatch=0.01)
    with pytest.raises(ValueError, match="lag must hold"):
        staleness_table(batch, np.zeros(3, int))
    with pytest.raises(ValueError, match="bins must"):
        mismatch_by_probability(batch, bins=(0.5, 0.2))


def test_read_run_returns_the_sequence_fields(tmp_path):
    """read_lm_run gives the batch, the per-sequence fields with lengths, and the sidecar."""
    path = tmp_path / "run.jsonl.gz"
    records = [
        {"id": f"{i}", "prompt_id": i // 2, "task": "copy", "reward": float(i % 2), "policy_lag": i % 3}
        | {"logp": [-0.5] * (i + 1), "old_logp": [-0.4] * (i + 1), "rollout_logp": [-0.3] * (i + 1)}
        for i in range(6)
    ]
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    (tmp_path / "run.json").write_text(json.dumps({"run": "stale"}))
    batch, frame, side = read_lm_run(path)
    assert side == {"run": "stale"}
    assert frame["length"].tolist() == list(range(1, 7))
    assert frame["policy_lag"].tolist() == [0, 1, 2, 0, 1, 2]
    assert batch.has_rollout
    table = staleness_table(batch, frame["policy_lag"].to_numpy())
    assert table["n_sequences"].tolist() == [2, 2, 2]


def test_ratio_batch_gives_each_ratio_and_keeps_the_prompts():
    """The total and mismatch batches' log-ratios are the parts of the original's; prompts stay."""
    batch = _batch(np.random.default_rng(8), n=40, mismatch=0.02)
    assert ratio_batch(batch, "update") is batch
    total, mis = ratio_batch(batch, "total"), ratio_batch(batch, "mismatch")
    np.testing.assert_array_equal(total.log_ratio, batch.logp - batch.rollout_logp)
    np.testing.assert_array_equal(mis.log_ratio, batch.old_logp - batch.rollout_logp)
    np.testing.assert_allclose(total.log_ratio, mis.log_ratio + batch.log_ratio, atol=1e-15)
    for b in (total, mis):
        np.testing.assert_array_equal(b.prompt_id, batch.prompt_id)
        np.testing.assert_array_equal(b.lengths, batch.lengths)
        assert not b.has_rollout
    assert RATIOS == ("update", "mismatch", "total")


def test_ratio_batch_names_bad_input():
    """An unknown ratio, or a mismatch without rollout_logp, is named."""
    batch = _batch(np.random.default_rng(9), n=20)
    with pytest.raises(ValueError, match="'sum'"):
        ratio_batch(batch, "sum")
    with pytest.raises(ValueError, match="'mismatch' needs rollout_logp"):
        ratio_batch(batch, "mismatch")


def _top_p_batch(rng, n=200):
    """Draw a top-p sampler's batch: log mu = log pi - log S, S < 1 on about a third of the tokens."""
    lengths = rng.integers(1, 257, size=n)
    total = int(lengths.sum())
    old = np.log(rng.beta(2.0, 1.0, size=total).clip(1e-6, 1.0))
    log_s = np.where(rng.random(total) < 0.3, np.log(rng.uniform(0.8, 1.0, size=total)), 0.0)
    new = np.minimum(old + 0.01 * rng.standard_normal(total), 0.0)
    prompt = np.repeat(np.arange(n // 4), 4)
    rollout = np.minimum(old - log_s, 0.0)
    batch = TokenBatch.from_flat(new, old, lengths, prompt_id=prompt, rollout_logp=rollout)
    return batch, log_s, old - rollout


def test_kept_mass_table_finds_the_mismatch_equal_to_the_log_kept_mass():
    """m_t = log S_t where mu = pi / S, so the means agree and the counts add up."""
    batch, log_s, m = _top_p_batch(np.random.default_rng(10))
    table = kept_mass_table(batch, log_s)
    whole = table.iloc[0]
    assert (whole["T_min"], whole["T_max"], whole["n_tokens"]) == (0, 0, batch.n_tokens)
    assert whole["mean_mismatch"] == pytest.approx(m.mean(), rel=1e-12)
    # rollout = min(old - log S, 0) differs from old - log S only where that exceeds 0
    exact = np.isclose(m, log_s, rtol=0, atol=1e-12)
    assert whole["max_abs_diff"] == pytest.approx(np.max(np.abs(m - log_s)))
    assert exact.mean() > 0.9
    assert whole["share_processed"] == pytest.approx(np.mean(log_s < 0))
    assert table["n_tokens"].iloc[1:].sum() == batch.n_tokens
    assert table["n_sequences"].iloc[1:].sum() == len(batch)


def test_kept_mass_table_names_bad_input():
    """The per-token array must match the batch, which must have rollout_logp."""
    batch, log_s, _ = _top_p_batch(np.random.default_rng(11), n=20)
    with pytest.raises(ValueError, match="one value per token"):
        kept_mass_table(batch, log_s[:-1])
    with pytest.raises(ValueError, match="needs rollout_logp"):
        kept_mass_table(_batch(np.random.default_rng(12), n=20), log_s)


def test_read_token_field_concatenates_and_names_a_missing_field(tmp_path):
    """A per-token field comes back flat in record order; a record without it is named."""
    path = tmp_path / "run.jsonl.gz"
    records = [{"log_kept_mass": [-0.1 * i] * (i + 1)} for i in range(3)]
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    np.testing.assert_allclose(read_token_field(path, "log_kept_mass"), [0, -0.1, -0.1, -0.2, -0.2, -0.2])
    with pytest.raises(ValueError, match="record 1 has no field 'entropy'"):
        read_token_field(path, "entropy")
