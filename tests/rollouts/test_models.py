"""Fitted ratio models (rollouts/mixture.py, random_scale.py, combined.py; models.py names them all).

Recovery of known parameters within k standard errors, the marginal likelihood against
quadrature, and predictions against the families' exact theory.
"""

import dataclasses
import math

import numpy as np
import pytest
from scipy import integrate, special

from variance_lab import theory
from variance_lab.families import get_family
from variance_lab.rollouts import TokenBatch
from variance_lab.rollouts.combined import CombinedFit, fit_combined
from variance_lab.rollouts.mixture import MixtureFit, fit_mixture, normal_outside
from variance_lab.rollouts.random_scale import _log_integral, fit_random_scale, random_scale_loglik
from variance_lab.rollouts.weights import log_clip_range

K_SE = 4.0  # every estimate within 4 standard errors of the truth
G_RANGE = log_clip_range((1 - 3e-4, 1 + 4e-4), "gspo_range")
P_RANGE = log_clip_range((0.8, 1.2), "ppo_range")


def random_scale_batch(seed, n=600, alpha=0.4, theta0=4e-4, beta=0.5, c=-1e-5, T0=40.0):
    """Sequences of lengths 8..300 (log-uniform) drawn from the random-scale model with theta(T)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    L = np.rint(np.exp(rng.uniform(math.log(8), math.log(300), n))).astype(int)
    v = rng.gamma(alpha, theta0 * (L / T0) ** beta)
    old = [np.full(t, -1.0) for t in L]
    new = [
        o + c - vi / 2 + math.sqrt(vi) * rng.standard_normal(t) for o, vi, t in zip(old, v, L, strict=True)
    ]
    return TokenBatch.from_ragged(new, old), L


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_scale_recovered_within_its_standard_errors(seed):
    """The random-scale fit recovers each true parameter within 4 of its standard errors."""
    batch, L = random_scale_batch(seed)
    fit = fit_random_scale(batch)
    T0 = float(np.median(L))
    truth = {"c": -1e-5, "alpha": 0.4, "theta0": 4e-4 * (T0 / 40.0) ** 0.5, "beta": 0.5}
    for name, want in truth.items():
        got, se = getattr(fit, name), getattr(fit, f"se_{name}")
        assert se > 0, (name, got, want, se)
        assert abs(got - want) < K_SE * se, (name, got, want, se)


def test_random_scale_without_length_recovers_the_family():
    """Without length dependence beta is 0 and the fitted family carries the fitted alpha and theta."""
    batch, _ = random_scale_batch(7, beta=0.0)
    fit = fit_random_scale(batch, length_dependent=False)
    assert fit.beta == 0.0
    assert fit.se_beta == 0.0
    assert abs(fit.alpha - 0.4) < K_SE * fit.se_alpha
    fam = fit.family(100)
    assert fam.alpha == fit.alpha
    assert fam.theta == pytest.approx(fit.theta0, rel=1e-10)


def _log_joint(u, y, c, alpha, theta):
    """Log of Gamma(alpha, theta) density of v = e^u times v (du = dv / v) times prod N(y; c - v/2, v)."""
    v = math.exp(u)
    log_gamma = alpha * u - v / theta - math.lgamma(alpha) - alpha * math.log(theta)
    return log_gamma - 0.5 * float(np.sum(np.log(2 * math.pi * v) + (y - c + v / 2) ** 2 / v))


def test_marginal_likelihood_against_quadrature():
    """One sequence's likelihood with v integrated out, against scipy quadrature over log v."""
    rng = np.random.default_rng(5)
    c = 1e-6
    for T, alpha, theta in ((8, 0.3, 1e-4), (120, 2.0, 5e-3), (300, 0.7, 1e-6)):
        y = -2e-5 + math.sqrt(theta) * rng.standard_normal(T)
        batch = TokenBatch.from_ragged([y - 1.0], [np.full(T, -1.0)])
        got = random_scale_loglik(batch, c, alpha, theta)
        grid = np.linspace(-40, 5, 4001)
        vals = np.array([_log_joint(u, y, c, alpha, theta) for u in grid])
        shift, peak = float(vals.max()), float(grid[np.argmax(vals)])
        val, _ = integrate.quad(
            lambda u, y=y, a=alpha, t=theta, s=shift: math.exp(_log_joint(u, y, c, a, t) - s),
            -40,
            5,
            points=[peak],
            limit=400,
            epsrel=1e-10,
        )
        assert got == pytest.approx(math.log(val) + shift, abs=1e-7), (T, alpha, theta)


def test_log_integral_at_a_zero_against_the_gamma_function():
    """At a = 0 (a one-token sequence at the fitted c), int e^(pu - b e^u) du = Gamma(p) / b^p.

    Both branches of the root's ``np.where`` are evaluated: at a = 0 (or a so small that
    disc - p rounds to 0) the unused one divided by zero, a warning that fails the suite.
    Where p <= 0 the integral diverges: inf, with no warning (warnings are errors here).
    """
    p = np.array([5.0, 12.0, 40.0, 8.0, -0.2, 0.0])
    a = np.array([0.0, 0.0, 0.0, 1e-300, 0.0, 0.0])
    b = np.array([1e4, 3.0, 0.5, 2.0, 1.0, 1.0])
    got = _log_integral(p, a, b)
    want = special.gammaln(p[:4]) - p[:4] * np.log(b[:4])
    # 32-point Gauss-Hermite about the mode: the integrand in u is skewed, exact to ~1e-9 from p = 5
    np.testing.assert_allclose(got[:4], want, rtol=0, atol=1e-8)
    assert np.all(np.isposinf(got[4:]))


def test_random_scale_predictions_match_the_family_theory():
    """Random-scale predictions equal the theory of the fitted family, infinite where it is."""
    batch, _ = random_scale_batch(4, beta=0.0)
    fit = fit_random_scale(batch, length_dependent=False)
    T = np.array([1, 10, 100, 1000])
    pred = fit.predict(T, G_RANGE, P_RANGE)
    fam = fit.family(50)
    for stat in ("mean_P", "var_P", "mean_G", "var_G"):
        want = theory.value(stat, fam, T, log10=True) * math.log(10)
        finite = np.isfinite(want)
        np.testing.assert_allclose(pred[stat][finite], want[finite], rtol=1e-6, atol=1e-9)
        assert np.array_equal(np.isinf(pred[stat]), ~finite), stat


def test_random_scale_prediction_with_almost_no_spread_is_a_tiny_variance():
    """A theta of 1e-20 (f2 rounds to 0) gives log Var below -30 or -inf, never NaN, and no warning."""
    batch, _ = random_scale_batch(4, beta=0.0)
    fit = dataclasses.replace(fit_random_scale(batch, length_dependent=False), theta0=1e-20)
    T = np.array([1, 10, 100])
    pred = fit.predict(T, G_RANGE, P_RANGE)
    for stat in ("var_P", "var_G"):
        assert not np.any(np.isnan(pred[stat])), stat
        assert np.all(pred[stat] < -30), (stat, pred[stat])
    np.testing.assert_allclose(pred["mean_P"], fit.c * T, rtol=1e-9)


def test_random_scale_clip_prediction_against_simulation():
    """GSPO clip probability at T = 50 against 200,000 draws of the model (4 binomial SE)."""
    batch, _ = random_scale_batch(4, beta=0.0)
    fit = fit_random_scale(batch, length_dependent=False)
    p = float(fit.predict([50], G_RANGE, P_RANGE)["gspo_clip"][0])
    rng = np.random.default_rng(np.random.SeedSequence(11))
    n = 200_000
    v = rng.gamma(fit.alpha, fit.theta0, n)
    ybar = fit.c - v / 2 + np.sqrt(v / 50) * rng.standard_normal(n)
    obs = np.mean((ybar < G_RANGE[0]) | (ybar > G_RANGE[1]))
    assert abs(obs - p) < 4 * math.sqrt(p * (1 - p) / n), (obs, p)


MIX_TRUE = (np.array([0.9, 0.08, 0.02]), np.array([0.0, -1e-3, -0.01]), np.array([1e-8, 1e-5, 4e-3]))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mixture_recovered_within_its_standard_errors(seed):
    """The mixture fit picks 3 components and recovers weights, means and variances within 4 SE."""
    w, m, v = MIX_TRUE
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    n = 30_000
    comp = rng.choice(3, size=n, p=w)
    y = m[comp] + np.sqrt(v[comp]) * rng.standard_normal(n)
    fit = fit_mixture(y)
    assert fit.n_components == 3
    assert min(fit.bic, key=fit.bic.get) == 3
    for est, se, want, name in (
        (fit.weights, fit.se_weights, w, "w"),
        (fit.means, fit.se_means, m, "m"),
        (fit.variances, fit.se_variances, v, "v"),
    ):
        assert np.all(se > 0), (name, est, want, se)
        assert np.all(np.abs(est - want) < K_SE * se), (name, est, want, se)


def test_mixture_bic_picks_one_component_for_gaussian_tokens():
    """BIC picks one component for Gaussian log-ratios, recovered within 4 SE."""
    y = np.random.default_rng(np.random.SeedSequence(3)).normal(-1e-4, 0.01, 20_000)
    fit = fit_mixture(y)
    assert fit.n_components == 1
    assert abs(fit.means[0] + 1e-4) < K_SE * fit.se_means[0]
    assert abs(fit.variances[0] - 1e-4) < K_SE * fit.se_variances[0]


def test_mixture_predictions():
    """Mixture predictions match the family theory and a simulated GSPO clip fraction within 4 binomial SE."""
    w, m, v = MIX_TRUE
    y = np.random.default_rng(np.random.SeedSequence(8)).normal(0, 0.01, 100)
    fit = fit_mixture(y, max_components=1)
    fam = get_family(
        "lognormal-mixture", components=",".join(f"{a}:{b}:{c}" for a, b, c in zip(w, m, v, strict=True))
    )
    fit = type(fit)(w, m, v, w, w, w, 0.0, {}, 0)  # the true mixture, for its predictions
    assert fit.family() == fam
    T = np.array([1, 7, 60])
    pred = fit.predict(T, G_RANGE, P_RANGE)
    np.testing.assert_allclose(pred["var_G"], theory.var_G(fam, T, log10=True) * math.log(10), rtol=1e-12)
    ppo = float(np.sum(w * normal_outside(m, v, P_RANGE)))
    assert pred["ppo_clip"][0] == pytest.approx(ppo, rel=1e-12)
    assert pred["gspo_clip"][0] == pytest.approx(float(np.sum(w * normal_outside(m, v, G_RANGE))), rel=1e-12)
    # T = 7: against 400,000 simulated means of 7 tokens (4 binomial SE)
    rng = np.random.default_rng(np.random.SeedSequence(9))
    comp = rng.choice(3, size=(400_000, 7), p=w)
    ybar = (m[comp] + np.sqrt(v[comp]) * rng.standard_normal(comp.shape)).mean(axis=1)
    obs = np.mean((ybar < G_RANGE[0]) | (ybar > G_RANGE[1]))
    p = pred["gspo_clip"][1]
    assert abs(obs - p) < 4 * math.sqrt(p * (1 - p) / 400_000), (obs, p)


# --------------------------------------------------------------------------------------
# the combined model
# --------------------------------------------------------------------------------------
COMB_W = np.array([0.7, 0.25, 0.04, 0.01])  # pooled weights: two narrow, two sparse components
COMB_M = np.array([0.0, -1e-5, -2e-4, -1e-3])
COMB_V = np.array([1e-10, 1e-8, 4e-6, 1e-2])
COMB_TRUE = {"a": -4.0, "b": 0.6, "tau": 0.8}


def comb_batch(seed, n=200, a=-4.0, b=0.6, tau=0.8):
    """Sequences of lengths 8..200 (log-uniform) drawn from the combined model with COMB_* components."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    L = np.rint(np.exp(rng.uniform(math.log(8), math.log(200), n))).astype(int)
    w0, w1 = COMB_W[:2] / COMB_W[:2].sum(), COMB_W[2:] / COMB_W[2:].sum()
    new = []
    for t in L:
        pos = np.arange(t)
        pi = 1.0 / (1.0 + np.exp(-(a + b * np.log1p(pos) + tau * rng.standard_normal())))
        sparse = rng.random(t) < pi
        comp = np.where(sparse, 2 + rng.choice(2, size=t, p=w1), rng.choice(2, size=t, p=w0))
        new.append(-1.0 + COMB_M[comp] + np.sqrt(COMB_V[comp]) * rng.standard_normal(t))
    return TokenBatch.from_ragged(new, [np.full(t, -1.0) for t in L])


def _true_components() -> MixtureFit:
    z = np.zeros(4)
    return MixtureFit(COMB_W, COMB_M, COMB_V, z, z, z, 0.0, {}, 0)


def _comb(a, b, tau) -> CombinedFit:
    w0, w1 = COMB_W[:2] / COMB_W[:2].sum(), COMB_W[2:] / COMB_W[2:].sum()
    return CombinedFit(
        w0, COMB_M[:2], COMB_V[:2], w1, COMB_M[2:], COMB_V[2:], a, b, tau, 0, 0, 0, None, 0, 0, 0
    )


def _comb_recovered(seed) -> dict:
    fit = fit_combined(comb_batch(seed), _true_components(), n_sparse=2)
    return {k: (getattr(fit, k), getattr(fit, f"se_{k}"), want) for k, want in COMB_TRUE.items()}


@pytest.mark.parametrize("seed", [1, 2])
def test_combined_recovered_within_its_standard_errors(seed):
    """The combined fit recovers a, b and tau within 4 of their standard errors (components known)."""
    for name, (got, se, want) in _comb_recovered(seed).items():
        assert se > 0, (name, got, want, se)
        assert abs(got - want) < K_SE * se, (name, got, want, se)


@pytest.mark.slow
def test_combined_recovery_coverage_over_seeds():
    """Over 20 seeds, at least 52 of the 60 estimates lie within 2 SE (95.4 % each: 57.3 expected, sd 1.6)."""
    inside = sum(
        abs(g - w) < 2 * se for seed in range(100, 120) for g, se, w in _comb_recovered(seed).values()
    )
    assert inside >= 52, inside


@pytest.mark.slow
def test_combined_fit_finds_its_own_components():
    """Without components given, the fit's BIC mixture puts the two wide components in the sparse part."""
    fit = fit_combined(comb_batch(5, n=400))
    assert fit.sparse_variances.size == 2
    assert fit.sparse_variances[-1] == pytest.approx(1e-2, rel=0.2)
    assert abs(fit.b - 0.6) < K_SE * fit.se_b


def test_combined_loglik_against_quadrature():
    """The marginal log-likelihood (adaptive Gauss-Hermite) against scipy quad over z, per sequence."""
    from variance_lab.rollouts import combined

    batch = comb_batch(9, n=12)
    fit = _comb(-3.0, 0.5, 1.2)
    y, lp = batch.log_ratio, np.log1p(batch.positions.astype(float))

    def log_dens(w, m, v):
        return special.logsumexp(
            np.log(w) - (y[:, None] - m) ** 2 / (2 * v) - 0.5 * np.log(2 * math.pi * v), axis=1
        )

    l0 = log_dens(fit.narrow_weights, fit.narrow_means, fit.narrow_variances)
    l1 = log_dens(fit.sparse_weights, fit.sparse_means, fit.sparse_variances)
    want = 0.0
    for i in range(len(batch)):
        s = slice(batch.offsets[i], batch.offsets[i + 1])
        top = float(np.sum(np.maximum(l0[s], l1[s])))

        def g(z, s=s, top=top):
            pi = 1 / (1 + np.exp(-(-3.0 + 0.5 * lp[s] + 1.2 * z)))
            ll = float(np.sum(np.logaddexp(np.log1p(-pi) + l0[s], np.log(pi) + l1[s])))
            return math.exp(ll - top - z * z / 2)

        want += top + math.log(
            integrate.quad(g, -12, 12, epsabs=0, epsrel=1e-12, limit=200)[0] / math.sqrt(2 * math.pi)
        )
    got = combined._comb_loglik(np.array([-3.0, 0.5, math.log(1.2)]), l0, l1, lp, batch.offsets[:-1])
    assert got == pytest.approx(want, abs=1e-3)  # 12 adaptive nodes: within 1e-4 per sequence


def test_combined_without_scale_or_position_is_the_mixture_family():
    """With b = 0 and tau -> 0, i.i.d. tokens from one mixture; moments equal its family's theory.

    Token clips equal the mixture's; the Monte Carlo GSPO clip at T = 1 is within 4 SE of the exact one.
    """
    fit = _comb(-3.0, 0.0, 1e-9)
    pi = 1 / (1 + math.exp(3.0))
    w = np.concatenate([(1 - pi) * fit.narrow_weights, pi * fit.sparse_weights])
    mix = MixtureFit(w, COMB_M, COMB_V, w, w, w, 0.0, {}, 0)
    T = np.array([1, 7, 60])
    pred = fit.predict(T, G_RANGE, P_RANGE, n_rep=20_000, seed=3)
    for stat in ("mean_P", "var_P", "mean_G", "var_G"):
        want = theory.value(stat, mix.family(), T, log10=True) * math.log(10)
        np.testing.assert_allclose(pred[stat], want, rtol=1e-9, err_msg=stat)
    np.testing.assert_allclose(pred["ppo_clip"], mix.token_clip(T, P_RANGE), rtol=1e-9)
    exact = float(np.sum(w * normal_outside(COMB_M, COMB_V, G_RANGE)))
    assert abs(pred["gspo_clip"][0] - exact) < K_SE * pred["gspo_clip_se"][0], (pred, exact)
    assert np.all(pred["gspo_clip_se"] > 0)


def test_combined_clip_prediction_against_simulation():
    """GSPO clip at T = 40 (rate by position and sequence) against 100,000 simulated sequences."""
    fit = _comb(*COMB_TRUE.values())
    pred = fit.predict([40], G_RANGE, P_RANGE, n_rep=50_000, seed=4)
    rng = np.random.default_rng(np.random.SeedSequence(14))
    n, t = 100_000, 40
    pi = 1 / (1 + np.exp(-(-4.0 + 0.6 * np.log1p(np.arange(t))[None, :] + 0.8 * rng.standard_normal((n, 1)))))
    sparse = rng.random((n, t)) < pi
    comp = np.where(sparse, 2 + (rng.random((n, t)) < 0.2), (rng.random((n, t)) < 0.25 / 0.95).astype(int))
    ybar = (COMB_M[comp] + np.sqrt(COMB_V[comp]) * rng.standard_normal((n, t))).mean(axis=1)
    obs = float(np.mean((ybar < G_RANGE[0]) | (ybar > G_RANGE[1])))
    p, se = float(pred["gspo_clip"][0]), float(pred["gspo_clip_se"][0])
    assert abs(obs - p) < K_SE * math.sqrt(p * (1 - p) / n + se * se), (obs, p, se)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fit_combined(np.zeros(5)), "needs a TokenBatch"),
        (lambda: fit_combined(comb_batch(1, n=20), _true_components(), n_sparse=4), "n_sparse=4"),
        (lambda: fit_mixture(np.zeros(50)), "constant"),
        (lambda: fit_mixture(np.ones(5)), "at least 10"),
        (lambda: fit_mixture(np.arange(20.0), max_components=4), "max_components must be 1, 2 or 3, got 4"),
        (lambda: fit_random_scale(np.zeros(5)), "needs a TokenBatch"),
    ],
)
def test_bad_input(call, match):
    """Bad input to the fits raises ValueError with the expected message."""
    with pytest.raises(ValueError, match=match):
        call()


def test_models_names_every_fitted_model():
    """rollouts.models, the models' overview, gives each public name of the three model modules."""
    from variance_lab.rollouts import combined, mixture, models, random_scale

    homes = {name: mod for mod in (mixture, random_scale, combined) for name in mod.__all__}
    assert set(models.__all__) == set(homes) - {"fit_mixture_bic"}
    for name in models.__all__:
        assert getattr(models, name) is getattr(homes[name], name)


# --------------------------------------------------------------------------------------
# the mixture's clip sums near the mode, the hier likelihood's log-sum-exp
# --------------------------------------------------------------------------------------
def _clip_by_every_composition(fit: MixtureFit, T: int, log_range) -> float:
    """Return the sum over every composition of T (T^2/2 rows of three components), as written first."""
    w, m, v = fit.weights, fit.means, fit.variances
    if w.size == 2:
        counts = np.column_stack([np.arange(T + 1), T - np.arange(T + 1)])
    else:
        i, j = np.triu_indices(T + 1)
        counts = np.column_stack([i, j - i, T - j])
    logp = special.gammaln(T + 1) + np.sum(counts * np.log(w) - special.gammaln(counts + 1), axis=1)
    keep = logp > np.max(logp) - 40.0
    c, p = counts[keep], np.exp(logp[keep])
    return float(np.sum(p * normal_outside(c @ m / T, c @ v / T**2, log_range)) / np.sum(p))


@pytest.mark.parametrize("K", [2, 3])
def test_mixture_clip_near_the_mode_is_every_compositions(K):
    """The window around the mode keeps every composition the full sum keeps: the same number, bit for bit."""
    rng = np.random.default_rng(K)
    w = rng.dirichlet(np.full(K, 0.7))
    fit = MixtureFit(
        w, rng.standard_normal(K) * 0.01, np.exp(rng.standard_normal(K) * 2) * 1e-4, w, w, w, 0.0, {}, 9
    )
    T = np.array([1, 2, 7, 60, 255, 256, 400, 1500] if K == 3 else [1, 9, 300, 5000, 40_000])
    got = fit.gspo_clips(T, G_RANGE)
    want = [_clip_by_every_composition(fit, int(t), G_RANGE) for t in T]
    assert got.tolist() == want
    assert len(set(want)) >= 3  # the comparison sees different numbers


def test_hier_log_sum_exp_is_scipys():
    """The hier likelihood's log-sum-exp, written out, equals scipy.special.logsumexp bit for bit."""
    from variance_lab.rollouts.random_scale import _GH_WEIGHTS, _logsumexp_rows

    rng = np.random.default_rng(0)
    a = rng.standard_normal((500, _GH_WEIGHTS.size)) * 50
    a[3] = -np.inf
    a[4, 2] = np.inf
    a[:, 5] = a[:, 6]  # ties at the largest
    with np.errstate(all="ignore"):
        want = special.logsumexp(a, b=_GH_WEIGHTS[None, :], axis=1)
        got = _logsumexp_rows(a, _GH_WEIGHTS)
    assert np.array_equal(got, want, equal_nan=True)
