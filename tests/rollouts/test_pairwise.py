"""NumPy's sums reproduced in kernels over values fed in pieces: bit for bit against NumPy itself."""

import itertools

import numpy as np
import pytest

from variance_lab.ratios import segment_split_scale, segment_sums
from variance_lab.rollouts.pairwise import (
    INTERLEAVED,
    PLAIN,
    SQUARED_DEVIATION,
    PairwiseSums,
    pairwise_plan,
    pairwise_sum,
    segment_totals,
    split_sums,
    tree_sums,
)

SIZES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 130, 255, 256, 1000, 4097, 65_537, 300_001]


def _values(rng, n):
    """Values over many magnitudes and both signs: a sum that depends on its order."""
    return rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 4)


@pytest.mark.parametrize("n", SIZES)
def test_pairwise_sum_is_numpys(n):
    """``pairwise_sum`` equals ``np.add.reduce`` bit for bit (a naive sum does not, at these sizes)."""
    x = _values(np.random.default_rng(n), n)
    assert pairwise_sum(x) == np.add.reduce(x)


def test_the_comparison_can_fail():
    """Another order of the same additions gives other bits here: the tests above can fail."""
    x = _values(np.random.default_rng(300_001), 300_001)
    assert sum(x.tolist()) != np.add.reduce(x)  # one after another, not pairwise
    assert pairwise_sum(x[::-1]) != pairwise_sum(x)


@pytest.mark.parametrize("n", SIZES)
def test_plan_covers_every_value_once(n):
    """The tree's leaves cover the n values; each is a NumPy leaf (<= 128); the additions leave one sum."""
    sizes, adds = pairwise_plan(n)
    assert sizes.sum() == n
    assert np.all(sizes <= 128)
    assert adds.sum() == max(sizes.size - 1, 0)


def test_sums_fed_in_random_pieces_equal_numpy():
    """Sums fed interleaved, in pieces of random sizes: each the whole array's np.add.reduce (or reduceat)."""
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(1, 50_000 if trial % 2 else 300))
        a, b = _values(rng, n), _values(rng, n)
        sums = PairwiseSums([n, n])
        first = PairwiseSums([n], first_apart=True)
        cuts = np.unique(rng.integers(0, n + 1, size=int(rng.integers(0, 12))))
        edges = np.r_[0, cuts, n]
        for lo, hi in itertools.pairwise(edges):
            both = np.concatenate([a[lo:hi], b[lo:hi]])
            sums.feed_runs(both, [0, hi - lo], [hi - lo, hi - lo], [0, 1])
            first.feed(0, b[lo:hi])
        assert sums.total().tolist() == [np.add.reduce(a), np.add.reduce(b)]
        assert first.reduceat()[0] == np.add.reduceat(b, [0])[0]


def test_sums_refuse_too_many_or_too_few_values():
    """A sum fed past its size, or asked before it is full, is a ValueError."""
    sums = PairwiseSums([3])
    sums.feed(0, [1.0, 2.0])
    with pytest.raises(ValueError, match="fewer"):
        sums.total()
    with pytest.raises(ValueError, match="more"):
        sums.feed(0, [1.0, 2.0])


def test_segment_totals_are_each_segments_np_sum():
    """Each segment's np.sum, bit for bit (``np.add.reduceat`` differs: first value + the rest's sum)."""
    rng = np.random.default_rng(2)
    x = _values(rng, 20_000)
    offsets = np.r_[0, np.sort(rng.integers(0, x.size, 30)), x.size]
    want = [np.add.reduce(x[a:b]) for a, b in itertools.pairwise(offsets)]
    assert segment_totals(x, offsets).tolist() == want


def _segments(rng):
    lengths = rng.integers(1, 3000, size=int(rng.integers(1, 40)))
    return np.r_[0, np.cumsum(lengths)], lengths


@pytest.mark.parametrize("seed", range(12))
def test_split_sums_equal_segment_sums(seed):
    """Per sequence, at the whole set's scale: ``segment_sums`` of the values, interleaved values, squares."""
    rng = np.random.default_rng(seed)
    off, lengths = _segments(rng)
    x = rng.standard_normal(off[-1]) * rng.choice([1e-3, 1.0, 50.0], size=off[-1])
    y = -np.abs(rng.standard_normal(off[-1]))
    seqs = np.arange(lengths.size)
    scale = segment_split_scale(float(np.max(np.abs(x))), int(lengths.max()))
    assert split_sums(x, None, off, seqs, scale, mode=PLAIN).tolist() == segment_sums(x, off).tolist()
    inter = np.empty(2 * x.size)
    inter[0::2], inter[1::2] = x, -y
    scale = segment_split_scale(float(np.max(np.abs(inter))), 2 * int(lengths.max()))
    got = split_sums(x, y, off, seqs, scale, mode=INTERLEAVED)
    assert got.tolist() == segment_sums(inter, 2 * off).tolist()
    c = rng.standard_normal(lengths.size)
    sq = (x - np.repeat(c, lengths)) ** 2
    scale = segment_split_scale(float(np.max(sq)), int(lengths.max()))
    got = split_sums(x, None, off, seqs, scale, mode=SQUARED_DEVIATION, centres=c)
    assert got.tolist() == segment_sums(sq, off).tolist()
    half = seqs[::2]  # a subset of the sequences: their sums alone, at the set's scale
    assert split_sums(x, None, off, half, scale, mode=SQUARED_DEVIATION, centres=c[half]).tolist() == (
        segment_sums(sq, off)[half].tolist()
    )


@pytest.mark.parametrize("n", [1, 7, 8, 13, 16, 129, 100_003])
def test_tree_sums_equal_numpys_arrays(n):
    """The sums of values made on the fly equal NumPy's sums of the arrays made first, bit for bit."""
    rng = np.random.default_rng(n)
    h = rng.standard_normal(n) * 0.3
    mu, zmax, md = 0.01, float(np.max(np.abs(h - 0.01))) or 1.0, 0.07
    scale = segment_split_scale(float(np.max(np.abs(h))), n)
    lows, hi = tree_sums(h, 1, scale=scale)
    hi_part = np.rint(h * scale) / scale
    assert 0.0 + lows[0] == np.add.reduce(h - hi_part)
    assert hi == float(np.sum(hi_part))
    dev2 = (h - mu) ** 2
    sums = tree_sums(h, 2, mu=mu)[0]
    assert [0.0 + sums[0], sums[1], sums[2]] == [np.add.reduce(dev2), dev2.min(), dev2.max()]
    got = 0.0 + tree_sums(h, 3, mu=mu, zmax=zmax, mean_dev2=md, terms=40)[0]
    u = (h - mu) / zmax
    power = u.copy()
    want = [np.add.reduce((dev2 - md) * (dev2 - md))]
    for _ in range(40):
        want.append(np.add.reduce(power))
        power *= u
    assert got.tolist() == want
