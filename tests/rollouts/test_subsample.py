"""The stated sample of whole prompts the token-mixture fits see (``rollouts/subsample.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.mixture import fit_mixture
from variance_lab.rollouts.predictions import child_seed
from variance_lab.rollouts.subsample import FIT_SEQUENCES, FIT_TOKENS, fit_sample

#: The token law of the coverage test: 0.9 N(0, 0.01^2) + 0.1 N(0.02, 0.1^2), in log space.
WEIGHTS, MEANS, VARIANCES = np.array([0.9, 0.1]), np.array([0.0, 0.02]), np.array([1e-4, 1e-2])


def _batch(seed: int, n_prompts: int = 120, per_prompt: int = 4) -> TokenBatch:
    """Prompts of ``per_prompt`` responses of 10..300 tokens, log-ratios i.i.d. from the mixture."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 301, n_prompts * per_prompt)
    n = int(lengths.sum())
    comp = rng.random(n) < WEIGHTS[1]
    sd = np.sqrt(np.where(comp, VARIANCES[1], VARIANCES[0]))
    y = np.where(comp, MEANS[1], MEANS[0]) + rng.standard_normal(n) * sd
    old = np.full(n, -6.0)
    prompts = np.repeat(np.arange(n_prompts), per_prompt)
    return TokenBatch.from_flat(old + y, old, lengths, prompt_id=prompts)


def test_a_batch_within_the_budget_is_its_own_sample():
    """Nothing is drawn for a batch of at most the budget's tokens, or without a budget."""
    batch = _batch(0)
    sample = fit_sample(batch, batch.n_tokens, seed=1)
    assert sample.batch is batch
    assert not sample.subsampled
    assert sample.summary()["n_tokens"] == sample.summary()["of_tokens"] == batch.n_tokens
    assert fit_sample(batch, None).batch is batch
    assert fit_sample(batch, len(batch), by="sequences").batch is batch


def test_the_sample_is_whole_prompts_up_to_the_budget():
    """Whole prompts, in the batch's order, until the budget; the same seed draws the same ones."""
    batch = _batch(0)
    budget = batch.n_tokens // 10
    sample = fit_sample(batch, budget, seed=3)
    sub = sample.batch
    assert sample.subsampled
    assert sample.unit == "prompts"
    chosen = np.unique(sub.prompt_id)
    assert sample.n_groups == chosen.size
    # whole prompts: every response of a chosen prompt is in, in the batch's order
    keep = np.isin(batch.prompt_id, chosen)
    assert np.array_equal(sub.ids, batch.ids[keep])
    assert np.array_equal(sub.log_ratio, batch.select(keep).log_ratio)
    # the budget is reached, and not without the last prompt taken
    assert sub.n_tokens >= budget
    per_prompt = {p: int(sub.lengths[sub.prompt_id == p].sum()) for p in chosen.tolist()}
    assert sub.n_tokens - min(per_prompt.values()) < budget or len(per_prompt) == 1
    # seeded: the same seed draws the same prompts, another seed others
    assert np.array_equal(fit_sample(batch, budget, seed=3).batch.ids, sub.ids)
    assert not np.array_equal(fit_sample(batch, budget, seed=4).batch.ids, sub.ids)
    assert "random sample of" in sample.describe()
    assert f"{budget:,} tokens" in sample.describe()


def test_bad_budget_is_a_value_error_naming_it():
    """A budget below one token is refused, with the value in the message."""
    with pytest.raises(ValueError, match="budget must be an integer >= 1 or None, got 0"):
        fit_sample(_batch(0), 0)
    with pytest.raises(ValueError, match=r"by must be one of .*got 'prompts'"):
        fit_sample(_batch(0), 10, by="prompts")


def test_a_budget_of_sequences_takes_the_same_order_of_prompts():
    """By sequences: the same prompts' order, so the smaller sample is the start of the larger."""
    batch = _batch(1)
    by_tokens = fit_sample(batch, batch.n_tokens // 8, seed=9)
    by_seqs = fit_sample(batch, len(batch) // 2, by="sequences", seed=9)
    assert len(batch) // 2 <= by_seqs.n_sequences < len(batch) // 2 + 4  # whole prompts of 4
    assert set(by_tokens.batch.ids.tolist()) <= set(by_seqs.batch.ids.tolist())
    assert "the hier fit" in by_seqs.describe()


def _covered(seed: int, budget: int = 6000) -> np.ndarray:
    """Whether each 95 % interval (estimate +- 1.96 se) of the mix fit to a sample covers the truth."""
    sample = fit_sample(_batch(seed), budget, seed=seed)
    fit = fit_mixture(sample.batch, max_components=2)
    est = np.concatenate([fit.weights, fit.means, fit.variances])
    se = np.concatenate([fit.se_weights, fit.se_means, fit.se_variances])
    truth = np.concatenate([WEIGHTS, MEANS, VARIANCES])
    return np.abs(est - truth) <= stats.norm.ppf(0.975) * se


def _coverage_holds(seeds) -> None:
    hits = np.sum([_covered(s) for s in seeds], axis=0)
    for h in hits:  # weights (2), means (2), variances (2)
        assert stats.binomtest(int(h), len(seeds), 0.95).pvalue > 1e-3, (hits, len(seeds))


def test_mix_intervals_fitted_to_a_sample_cover_the_truth():
    """A fit to a sample of about 6,000 of about 75,000 tokens: its intervals are the sample's, and honest."""
    _coverage_holds(range(40))


@pytest.mark.slow
def test_mix_intervals_fitted_to_a_sample_cover_the_truth_full_power():
    """The same at 400 seeds."""
    _coverage_holds(range(1000, 1400))


def test_analyze_names_the_sample_of_its_fits():
    """The summary names the sample; the mix fit is the sample's (all tokens' within the budget)."""
    batch = _batch(5, n_prompts=30)
    stated = analyze(batch, n_boot=50, folds=0, fit_tokens=4000, seed=2).summary()
    sample = stated["fit_sample"]["tokens"]
    assert sample["subsampled"]
    assert sample["of_tokens"] == batch.n_tokens
    assert 4000 <= sample["n_tokens"] < batch.n_tokens
    assert sample["n_groups"] < sample["of_groups"] == 30
    mix = fit_mixture(fit_sample(batch, 4000, seed=child_seed(2, 70_000)).batch)
    assert not stated["fit_sample"]["sequences"]["subsampled"]  # 120 sequences, within FIT_SEQUENCES
    assert len(batch) < FIT_SEQUENCES
    assert stated["models"]["mix"]["weights"] == mix.weights.tolist()  # fitted to that sample
    assert batch.n_tokens < FIT_TOKENS  # the default fits every token of a batch this small
    whole = analyze(batch, n_boot=50, folds=0, seed=2).summary()
    assert not whole["fit_sample"]["tokens"]["subsampled"]
    assert whole["models"]["mix"]["weights"] == fit_mixture(batch).weights.tolist()
