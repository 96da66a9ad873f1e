"""Fixtures of the corrections tests: every family once, and the binomial check of coverage."""

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
