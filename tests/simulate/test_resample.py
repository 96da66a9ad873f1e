"""The bootstraps' multinomial draws in a kernel: NumPy's counts and generator state, bit for bit."""

import numpy as np
import pytest

from variance_lab.simulate.resample import ResampleGenerator, resample_rng, uniform_multinomial
from variance_lab.stats import cluster_counts, log_var_interval, proportion_interval


@pytest.mark.parametrize("G", [1, 2, 3, 5, 31, 32, 61, 100, 999, 1700, 5000])
def test_uniform_multinomial_is_numpys(G):
    """Counts equal ``Generator.multinomial``'s, and the generator is left where NumPy leaves it."""
    for seed in range(3):
        ss = np.random.SeedSequence(seed).spawn(3)[2]
        a, b = np.random.default_rng(ss), np.random.default_rng(ss)
        want = a.multinomial(G, np.full(G, 1.0 / G), size=300)
        got = uniform_multinomial(b, G, 300)
        assert np.array_equal(got, want)
        assert a.random() == b.random()


def test_the_kernel_is_not_an_other_seeds_draw():
    """The comparison can fail: another stream gives other counts."""
    a, b = np.random.default_rng(1), np.random.default_rng(2)
    assert not np.array_equal(a.multinomial(50, np.full(50, 0.02), size=10), uniform_multinomial(b, 50, 10))


def test_resample_generator_draws_every_bootstrap_as_numpy():
    """Through the bootstraps of ``stats``: the same counts and intervals, clustered or not."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(900)
    groups = rng.integers(0, 300, size=900)
    for seed in range(3):
        a, b = np.random.default_rng(seed), resample_rng(seed)
        assert np.array_equal(cluster_counts(groups, 200, a), cluster_counts(groups, 200, b))
        assert log_var_interval(x, n_boot=200, level=0.9, rng=a, groups=groups) == log_var_interval(
            x, n_boot=200, level=0.9, rng=b, groups=groups
        )
        flags = (x > 1).astype(float)
        assert proportion_interval(flags, n_boot=200, level=0.9, rng=a, groups=groups) == proportion_interval(
            flags, n_boot=200, level=0.9, rng=b, groups=groups
        )
        assert a.random() == b.random()


def test_other_multinomials_are_numpys_own():
    """Unequal cells, a different number of draws, no size: the base class draws them."""
    a, b = np.random.default_rng(3), ResampleGenerator(np.random.PCG64(3))
    for args in (
        ((10, [0.5, 0.3, 0.2]), {"size": 4}),
        ((7, np.full(4, 0.25)), {"size": 2}),
        ((4, np.full(4, 0.25)), {}),
    ):
        assert np.array_equal(a.multinomial(*args[0], **args[1]), b.multinomial(*args[0], **args[1]))
