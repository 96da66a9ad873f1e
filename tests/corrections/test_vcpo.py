"""VCPO's ESS-scaled step and baseline: limits against quadrature, finite batches against Monte Carlo."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from variance_lab.corrections import vcpo
from variance_lab.families import get_family

K = 4.0  # Monte Carlo tolerance: K standard errors


def _quad_moments(pdf) -> tuple[float, float]:
    """E[r] and E[r^2] by adaptive quadrature of the density."""
    m1 = integrate.quad(lambda r: r * pdf(r), 0, np.inf, epsabs=0, epsrel=1e-13, limit=500)[0]
    m2 = integrate.quad(lambda r: r * r * pdf(r), 0, np.inf, epsabs=0, epsrel=1e-13, limit=500)[0]
    return m1, m2


@pytest.mark.parametrize(
    ("name", "pdf"),
    [
        ("lognormal", None),
        ("gamma", lambda mu, s2: stats.gamma(a=mu * mu / s2, scale=s2 / mu).pdf),
    ],
)
def test_large_batch_limit_against_quadrature(name, pdf):
    """rho(T) = (E[r]^2 / E[r^2])^T for i.i.d. tokens, the moments by quadrature of the density, 1e-9."""
    mu, s2 = 0.98, 0.02
    if pdf is None:
        v = math.log1p(s2 / mu**2)
        density = stats.lognorm(s=math.sqrt(v), scale=mu * math.exp(-v / 2)).pdf
    else:
        density = pdf(mu, s2)
    m1, m2 = _quad_moments(density)
    T = np.array([1, 10, 100, 1000])
    want = (m1 * m1 / m2) ** T
    np.testing.assert_allclose(vcpo.ess_limit(get_family(name, mu, s2), T), want, rtol=1e-9)
    np.testing.assert_allclose(vcpo.ess_limit(get_family(name, mu, s2), T, lag=3), want**3, rtol=1e-9)


def test_finite_batch_ess_is_the_limit_plus_the_delta_method_bias():
    """E[rho_hat_N] = rho + b_1/N: Monte Carlo agrees within K SE; rho alone is rejected at T = 500."""
    fam, T, N = get_family("lognormal", 1.0, 0.001), [10, 100, 500], 512
    rho, bias = vcpo.ess_limit(fam, T), vcpo.ess_ratio_bias(fam, T, N)
    mc = vcpo.simulate_ess_ratio(fam, T, N, 4000, seed=1)
    assert np.all(np.abs(mc["mean"] - rho - bias) < K * mc["se"]), (mc["mean"] - rho - bias) / mc["se"]
    assert (mc["mean"][-1] - rho[-1]) > K * mc["se"][-1]  # the batch overstates the ESS
    assert np.all((mc["lo"] < mc["mean"]) & (mc["mean"] < mc["hi"]))


@pytest.mark.parametrize(
    ("name", "params", "lag"),
    [("ar1", {"rho": 0.5}, 1), ("random-scale", {"alpha": 4.0}, 1), ("two-point", {"q": 0.3}, 2)],
)
def test_limit_of_dependent_and_lagged_weights_by_monte_carlo(name, params, lag):
    """AR(1), random scale and a lag of two updates: the Monte Carlo mean is rho + b_1/N within K SE."""
    fam, T, N = get_family(name, 1.0, 0.002, **params), [20], 256
    want = vcpo.ess_limit(fam, T, lag=lag) + vcpo.ess_ratio_bias(fam, T, N, lag=lag)
    mc = vcpo.simulate_ess_ratio(fam, T, N, 300, lag=lag, seed=3)
    assert abs(mc["mean"][0] - want[0]) < K * mc["se"][0], (mc["mean"][0], want[0], mc["se"][0])


def test_same_seed_same_batches():
    """A seed fixes every batch's ESS ratio."""
    fam = get_family("lognormal", 1.0, 0.01)
    a = vcpo.simulate_ess_ratio(fam, [5, 50], 32, 20, seed=9)["values"]
    b = vcpo.simulate_ess_ratio(fam, [5, 50], 32, 20, seed=9)["values"]
    np.testing.assert_array_equal(a, b)


def test_ess_ratio_of_one_batch():
    """(sum w)^2 / (N sum w^2), written out with fsum; equal weights give 1, one dominant weight 1/N."""
    log_w = np.log([0.5, 1.0, 2.0, 4.0])
    w = np.exp(log_w)
    want = math.fsum(w) ** 2 / (4 * math.fsum(w * w))
    assert vcpo.ess_ratio(log_w) == pytest.approx(want, rel=1e-15)
    assert vcpo.ess_ratio(np.zeros(7)) == pytest.approx(1.0, rel=1e-15)
    assert vcpo.ess_ratio([0.0, -800.0, -800.0]) == pytest.approx(1 / 3, rel=1e-12)


def test_lr_scale_rules():
    """sqrt: min(1, ess/base)^(1/2); linear: min(1, ess/base); never above 1."""
    np.testing.assert_allclose(vcpo.lr_scale([0.25, 1.0]), [0.5, 1.0], rtol=1e-15)
    assert vcpo.lr_scale(0.25, rule="linear") == 0.25
    assert vcpo.lr_scale(0.3, base_ess_ratio=0.5, rule="linear") == pytest.approx(0.6, rel=1e-15)
    assert vcpo.lr_scale(0.9, base_ess_ratio=0.5) == 1.0


def test_opob_baseline_and_its_gain_by_hand():
    """One group, W = w^2 = 1 and 4, R = 1 and 0: b* = 0.2; gain (1.25 / 0.8) = 1.5625 over the mean 0.5."""
    log_w, r, g = np.log([1.0, 2.0]), [1.0, 0.0], [7, 7]
    np.testing.assert_allclose(vcpo.opob_baseline(r, log_w, g), [0.2, 0.2], rtol=1e-15)
    assert vcpo.baseline_gain(r, log_w, g) == pytest.approx(1.5625, rel=1e-14)
    assert vcpo.baseline_gain(r, np.zeros(2), g) == pytest.approx(1.0, rel=1e-15)  # equal weights
    assert math.isnan(vcpo.baseline_gain([1.0, 1.0], log_w, g))  # nothing to centre
    # grad_sq enters W: W = 1 * 4 and 4 * 1 make the two equal again
    assert vcpo.baseline_gain(r, log_w, g, grad_sq=[4.0, 1.0]) == pytest.approx(1.0, rel=1e-14)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: vcpo.lr_scale(0.5, rule="cube"), "'cube'"),
        (lambda: vcpo.lr_scale(0.5, base_ess_ratio=0.0), "0.0"),
        (
            lambda: vcpo.ess_limit(get_family("lognormal", 1.0, 0.01), 10, lag=0),
            "lag must be an integer >= 1, got 0",
        ),
        (
            lambda: vcpo.ess_ratio_bias(get_family("lognormal", 1.0, 0.01), 10, 1),
            "N must be an integer >= 2, got 1",
        ),
        (lambda: vcpo.ess_limit("lognormal", 10), "Family"),
        (lambda: vcpo.ess_ratio([0.0, math.inf]), "finite"),
        (lambda: vcpo.opob_baseline([1.0], [0.0, 1.0], [0]), "one value per reward"),
        (lambda: vcpo.baseline_gain([1.0, 0.0], [0.0, 1.0], [0]), "one label per unit (2)"),
    ],
)
def test_bad_input_names_the_value(call, message):
    """Bad input is a ValueError naming it."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()
