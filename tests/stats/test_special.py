"""The shared special functions of ``variance_lab.stats.special`` against mpmath at 50 digits."""

import math
import warnings

import mpmath
import numpy as np
import pytest

from variance_lab.stats.special import (
    STIRLING_COEFFICIENTS,
    UNIT_ROUNDOFF,
    lgamma_ratio,
    log1mexp,
    log_expm1,
    stirling_tail,
)


def _ref(fn, xs):
    with mpmath.workdps(50):
        return np.array([float(fn(mpmath.mpf(float(x)))) for x in xs])


def test_log_expm1_against_mpmath_on_both_sides_of_the_switch():
    """log(e^x - 1) to a few ulps from 1e-300 to 1e300, across the switch at x = 30."""
    x = np.concatenate(
        [np.geomspace(1e-300, 1e-5, 40), np.linspace(1e-3, 60, 301), np.geomspace(60, 1e300, 40)]
    )
    want = _ref(lambda t: mpmath.log(mpmath.expm1(t)), x)
    got = log_expm1(x)
    np.testing.assert_allclose(got, want, rtol=8 * UNIT_ROUNDOFF, atol=1e-300)
    assert np.all(np.isfinite(got))


def test_log_expm1_edges_without_warnings():
    """0 gives -inf, inf gives inf, a negative or NaN input NaN; no floating-point warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = log_expm1([0.0, math.inf, -1.0, math.nan, 30.0, 30.000000000000004])
    assert got[0] == -math.inf
    assert got[1] == math.inf
    assert np.isnan(got[2])
    assert np.isnan(got[3])
    assert got[4] == pytest.approx(30.0 + math.log1p(-math.exp(-30.0)), rel=1e-15)
    assert np.ndim(log_expm1(2.0)) == 0


def test_stirling_tail_against_mpmath():
    """The series' remainder matches log Gamma(x) - (x - 1/2) log x + x - log(2 pi)/2 for x >= 10."""
    x = np.concatenate([np.linspace(10.0, 50.0, 81), np.geomspace(50.0, 1e12, 40)])

    def tail(t):
        return (
            mpmath.loggamma(t) - (t - mpmath.mpf(1) / 2) * mpmath.log(t) + t - mpmath.log(2 * mpmath.pi) / 2
        )

    np.testing.assert_allclose(stirling_tail(x), _ref(tail, x), rtol=4 * UNIT_ROUNDOFF, atol=0)


def test_stirling_coefficients_are_the_bernoulli_terms():
    """B_2j / (2j (2j - 1)) for j = 1..8, as mpmath's Bernoulli numbers give them."""
    want = [float(mpmath.bernoulli(2 * j) / (2 * j * (2 * j - 1))) for j in range(1, 9)]
    assert list(STIRLING_COEFFICIENTS) == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("k", [0.3, 2.5, 9.999, 10.0, 37.0, 1e4, 1e9])
def test_lgamma_ratio_against_mpmath_with_its_error_estimate(k):
    """The log-gamma ratio matches mpmath within its own error estimate (plus a few ulps)."""
    s = np.array([-0.5 * k, -1e-3, 1e-12, 1e-6, 1e-3, 0.25, 1.0, 2.0, 4.0, 17.0])
    got, err = lgamma_ratio(k, s)
    with mpmath.workdps(60):
        mk = mpmath.mpf(k)
        want = np.array(
            [
                float(
                    mpmath.loggamma(mk + mpmath.mpf(float(x)))
                    - mpmath.loggamma(mk)
                    - mpmath.mpf(float(x)) * mpmath.log(mk)
                )
                for x in s
            ]
        )
    assert np.all(err >= 0)
    assert np.all(np.abs(got - want) <= err + 4 * UNIT_ROUNDOFF * np.abs(want)), (got - want, err)
    if k >= 1e4:  # Stirling's branch: errors of order U |s|, not U k log k (gammaln's difference)
        assert np.all(np.abs(got - want) <= 4 * UNIT_ROUNDOFF * (1 + np.abs(s)))


def test_lgamma_ratio_broadcasts_and_raises_no_warning():
    """Arguments broadcast; the branch np.where discards is never a warning (s < -k, poles excluded)."""
    k = np.array([[11.0], [1e3]])
    s = np.array([-12.5, -3.0, 0.5, 40.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, err = lgamma_ratio(k, s)
    assert got.shape == err.shape == (2, 4)
    assert np.all(np.isfinite(got))


def test_log1mexp_against_mpmath_on_both_sides_of_log_2():
    """log(1 - e^x) to a few ulps from -1e-300 to -700, across the switch at -log 2, and its ends."""
    x = -np.concatenate(
        [np.geomspace(1e-300, 0.5, 60), np.linspace(0.6, 0.8, 41), np.geomspace(0.8, 700, 60)]
    )
    # at 50 digits 1 - e^x rounds to 1 for |x| < 1e-50 and log1p(-e^x) loses nothing for x <= -1
    want = _ref(lambda t: mpmath.log(-mpmath.expm1(t)) if t > -1 else mpmath.log1p(-mpmath.exp(t)), x)
    got = np.array([log1mexp(float(t)) for t in x])
    np.testing.assert_allclose(got, want, rtol=8 * UNIT_ROUNDOFF, atol=1e-300)
    assert log1mexp(0.0) == -math.inf
    assert log1mexp(-math.inf) == 0.0
