"""Pooled lag sums within sequences, by FFT: against the sums taken pair by pair."""

import itertools
import math

import numpy as np
import pytest

from variance_lab.rollouts.lags import lag_sums


def _direct(x, positions, offsets, K):
    """Sum of x_t x_s over pairs in one sequence with positions s - t = k, and their count, pair by pair."""
    sums, counts = [0.0] * (K + 1), [0] * (K + 1)
    for a, b in itertools.pairwise(offsets):
        where = {int(p): float(v) for p, v in zip(positions[a:b], x[a:b], strict=True)}
        for p, v in where.items():
            for k in range(K + 1):
                if p + k in where:
                    sums[k] += v * where[p + k]
                    counts[k] += 1
    return np.array(sums), np.array(counts)


@pytest.mark.parametrize("holes", [False, True])
def test_lag_sums_are_the_pairs_sums(holes):
    """Sums within 1e-12 of the pair-by-pair sums (of the lag-0 sum), counts exact; holes are gaps."""
    rng = np.random.default_rng(int(holes))
    lengths = rng.integers(1, 200, size=60)
    offsets = np.r_[0, np.cumsum(lengths)]
    x = rng.standard_normal(offsets[-1])
    positions = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    if holes:
        positions = 2 * positions + (rng.random(offsets[-1]) < 0.5)
    sums, counts = lag_sums(x, positions, offsets, 12)
    want_sums, want_counts = _direct(x, positions, offsets, 12)
    assert counts.tolist() == want_counts.tolist()
    assert np.max(np.abs(sums - want_sums)) <= 1e-12 * want_sums[0]
    assert not math.isclose(sums[1], want_sums[2])  # the lags are told apart


def test_without_holes_the_counts_need_no_transform():
    """Contiguous sequences (positions None): the same sums, bit for bit, and the closed-form counts."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 3000, size=400)
    offsets = np.r_[0, np.cumsum(lengths)]
    x = rng.standard_normal(offsets[-1])
    positions = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    with_positions = lag_sums(x, positions, offsets, 70)
    without = lag_sums(x, None, offsets, 70, lengths)
    assert np.array_equal(with_positions[0], without[0])
    assert np.array_equal(with_positions[1], without[1])
    assert without[1][0] == offsets[-1]
