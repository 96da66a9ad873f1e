"""Fixtures of the corrections tests: every family once, the binomial check of coverage, a random file."""

import numpy as np
import pytest
from scipy import stats

from variance_lab.families import get_family

#: One member of each family: (name, extra parameters); the mixture sets its own mean and variance.
EVERY_FAMILY = (
    ("lognormal", {}),
    ("gamma", {}),
    ("two-point", {}),
    ("ar1", {"rho": 0.5}),
    ("random-scale", {"alpha": 2.0}),
    ("lognormal-mixture", {"components": "0.9:0:0.02,0.1:-0.1:0.3"}),
)


@pytest.fixture(params=EVERY_FAMILY, ids=[name for name, _ in EVERY_FAMILY])
def every_family(request):
    """Return each family in turn, at mu = 1, sigma^2 = 0.1 (the mixture: its components')."""
    name, extra = request.param
    mu, s2 = (None, None) if name == "lognormal-mixture" else (1.0, 0.1)
    return get_family(name, mu, s2, **extra)


@pytest.fixture
def assert_coverage():
    """Return a check that each count of intervals covering the truth is binomial at ``level``."""

    def check(hits, trials: int, level: float = 0.95) -> None:
        for h in hits:
            assert stats.binomtest(int(h), trials, level).pvalue > 1e-3, (h, trials)

    return check


@pytest.fixture
def token_file():
    """Return a maker of a random ragged file with the sampler's log-probs and one advantage a sequence.

    ``make(seed, n, longest, scale, sd, advantages)``: ``n`` sequences of 1 .. ``longest - 1`` tokens,
    the sampler's log-probs ``-Exponential(scale)``, the numerator's ``log mu + Normal(0, sd)`` capped
    at 0, advantages drawn from ``advantages``; returns ``(lengths, offsets, log_r, log_mu, adv)``.
    """

    def make(seed, n, longest, scale, sd, advantages):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(1, longest, size=n)
        off = np.concatenate([[0], np.cumsum(lengths)])
        log_mu = -rng.exponential(scale, size=off[-1])
        log_r = np.minimum(log_mu + rng.normal(0, sd, size=off[-1]), 0.0) - log_mu
        return lengths, off, log_r, log_mu, rng.choice(advantages, size=n)

    return make
