"""Paired differences clustered by prompt, spread over seeds, finished responses by length."""

import numpy as np
import pytest
from scipy import stats

from variance_lab.lm.compare import length_counts, paired_difference, seed_spread


def test_paired_difference_is_the_token_mean_and_its_interval_covers():
    """The point is sum(x - y) / N; over 200 seeds of a known mean the 90 % interval covers at its rate."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 20, size=60)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    prompt = np.repeat(np.arange(15), 4)
    x, y = rng.normal(size=offsets[-1]), rng.normal(size=offsets[-1])
    got = paired_difference(x, y, offsets, prompt, n_boot=200)
    assert got["mean"] == pytest.approx((x - y).mean(), rel=1e-12)
    assert (got["n_tokens"], got["n_sequences"], got["n_prompts"]) == (offsets[-1], 60, 15)
    # coverage: 40 prompts of 4 responses with a shared prompt effect, 200 seeds, a 90 % interval
    lengths = rng.integers(1, 20, size=160)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    prompt = np.repeat(np.arange(40), 4)
    hits, n = 0, 200
    for s in range(n):
        r = np.random.default_rng(1000 + s)
        effect = np.repeat(r.normal(0, 0.5, 40), 4)  # the tokens of one prompt move together
        per_token = np.repeat(effect, lengths) + r.normal(size=offsets[-1])
        zero = np.zeros_like(per_token)
        ci = paired_difference(per_token + 0.3, zero, offsets, prompt, n_boot=400, level=0.9, seed=s)
        hits += ci["lo"] <= 0.3 <= ci["hi"]
    assert stats.binomtest(hits, n, 0.9).pvalue > 1e-3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([1.0, 2.0], [1.0], [0, 2], [0]), "same tokens"),
        (([1.0, 2.0], [1.0, 2.0], [0, 1], [0]), "offsets must rise from 0 to 2"),
        (([1.0, 2.0], [1.0, 2.0], [0, 2], [0, 1]), "one entry per sequence"),
    ],
)
def test_paired_difference_names_bad_input(args, message):
    """Mismatched tokens, offsets, prompt ids."""
    with pytest.raises(ValueError, match=message):
        paired_difference(*args)


def test_seed_spread():
    """Mean, sd with ddof 1, range; one seed is refused."""
    assert seed_spread([1.0, 2.0, 4.0]) == {
        "n_seeds": 3,
        "mean": 7 / 3,
        "sd": pytest.approx(np.std([1, 2, 4], ddof=1)),
        "min": 1.0,
        "max": 4.0,
    }
    with pytest.raises(ValueError, match="at least two finite values"):
        seed_spread([1.0])


def test_length_counts_keep_unfinished_apart():
    """A 200-token response that hit the budget is unfinished, not in 128-255."""
    lengths = np.array([5, 8, 15, 16, 127, 128, 255, 256, 200])
    finished = np.array([True] * 8 + [False])
    assert length_counts(lengths, finished) == {
        "8-15": 2,
        "16-31": 1,
        "32-63": 0,
        "64-127": 1,
        "128-255": 2,
        "shorter": 1,
        "longer": 1,
        "unfinished": 1,
    }
    with pytest.raises(ValueError, match="booleans"):
        length_counts(lengths, finished.astype(int))
