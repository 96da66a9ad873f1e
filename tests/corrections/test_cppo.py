r"""CPPO's theory (:mod:`variance_lab.corrections.cppo`) against independent integrals and the Monte Carlo.

The references integrate over the token's probability :math:`q` itself (not its logit), with
``scipy.integrate.quad``'s QAWS rule taking the Beta density's end singularities as its weight, and
their own bands (:math:`y_\uparrow = \operatorname{logit}(q + \theta) - \operatorname{logit} q`) and
:math:`E|\pi - q|` by an inner quadrature over the shift. The Monte Carlo applies the rule (UniRL's,
``tests/corrections/test_probmask.py``) to exact draws of the model, with tolerances of 4 standard
errors from the spread of the sequences.
"""

import math

import numpy as np
import pytest
from scipy import integrate, special

from variance_lab import corrections as co
from variance_lab.families import get_family

#: (family, law of q): shifts lognormal at two variances and a mixture; the default Beta law and another.
MODELS = [
    (("lognormal", 1.0, 0.1, {}), (0.2, 0.6)),
    (("lognormal", 1.0, 0.5, {}), (0.2, 0.6)),
    (("lognormal-mixture", None, None, {"components": "0.9:0:0.02,0.1:-0.1:0.3"}), (1.5, 0.7)),
]


def _model(spec):
    (name, mu, s2, extra), (a, b) = spec
    return get_family(name, mu, s2, **extra), co.TokenProbability(a, b)


def _ref_tails(theta, comps, a, b):
    """P(pi - q > theta) and P(pi - q < -theta) by QAWS over q (each side where it exists)."""
    norm = special.beta(a, b)

    def up(q):
        if q <= 0 or q >= 1 - theta:
            return 0.0
        y = math.log((q + theta) / (1 - q - theta)) - math.log(q / (1 - q))
        return sum(w * special.ndtr((m - y) / math.sqrt(v)) for w, m, v in comps) * (1 - q) ** (b - 1) / norm

    def down(q):
        if q <= theta or q >= 1:
            return 0.0
        y = math.log((q - theta) / (1 - q + theta)) - math.log(q / (1 - q))
        return sum(w * special.ndtr((y - m) / math.sqrt(v)) for w, m, v in comps) * q ** (a - 1) / norm

    kw = {"epsabs": 0.0, "epsrel": 1e-13, "limit": 1000}
    fu = integrate.quad(up, 0.0, 1.0 - theta, weight="alg", wvar=(a - 1, 0.0), **kw)[0]
    fd = integrate.quad(down, theta, 1.0, weight="alg", wvar=(0.0, b - 1), **kw)[0]
    return fu, fd


def _ref_mean_d(comps, a, b):
    """E|pi - q|: over q by QAWS, over the shift by quad on each side of Y = 0."""
    norm = special.beta(a, b)

    def inner(q):
        if q <= 0 or q >= 1:
            return 0.0
        l = math.log(q / (1 - q))
        total = 0.0
        for w, m, v in comps:
            s = math.sqrt(v)

            def g(y, s=s, m=m):
                return (
                    (special.expit(l + y) - q)
                    * math.exp(-0.5 * ((y - m) / s) ** 2)
                    / (s * math.sqrt(2 * math.pi))
                )

            above = integrate.quad(g, 0.0, np.inf, epsabs=0.0, epsrel=1e-13, limit=200)[0]
            below = integrate.quad(g, -np.inf, 0.0, epsabs=0.0, epsrel=1e-13, limit=200)[0]
            total += w * (above - below)
        return total / norm

    return integrate.quad(
        inner, 0.0, 1.0, weight="alg", wvar=(a - 1, b - 1), epsabs=0.0, epsrel=1e-12, limit=1000
    )[0]


# ------------------------------------------------------------------------------- exact parts
@pytest.mark.parametrize("model", MODELS, ids=["lognormal-0.1", "lognormal-0.5", "mixture"])
@pytest.mark.parametrize("theta", [0.05, 0.2, 0.25])
def test_tv_tails_against_qaws(model, theta):
    """Both sides of the fixed TV threshold agree with the QAWS integrals over q to 1e-9 relative."""
    family, law = _model(model)
    got = co.tv_tails(theta, family, law)
    ref = _ref_tails(theta, co.components_of(family), law.a, law.b)
    assert min(ref) > 1e-12
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=0)


def test_tv_tails_edges():
    """A threshold of 1 or more is never reached (|pi - q| < 1); a fixed q is one evaluation."""
    fam = get_family("lognormal", 1.0, 0.5)
    assert co.tv_tails(1.0, fam) == (0.0, 0.0)
    q, theta = 0.3, 0.2
    up, down = co.tv_tails(theta, fam, co.TokenProbability.fixed(q))
    m, s = fam.mean_log, math.sqrt(fam.var_log)
    y_up = special.logit(q + theta) - special.logit(q)
    y_down = special.logit(q - theta) - special.logit(q)
    assert up == pytest.approx(special.ndtr((m - y_up) / s), rel=1e-14)
    assert down == pytest.approx(special.ndtr((y_down - m) / s), rel=1e-14)
    with pytest.raises(ValueError, match="theta"):
        co.tv_tails(0.0, fam)


@pytest.mark.parametrize("model", MODELS, ids=["lognormal-0.1", "lognormal-0.5", "mixture"])
def test_positions_are_the_threshold_alone(model):
    """Each position's threshold is delta / w_t, its fractions the QAWS tails there; token 1 is DPPO-TV's."""
    family, law = _model(model)
    pos = co.cppo_positions("cppo:0.2:0.8:0.02:0.3", family, 6, token_prob=law)
    assert pos.columns.tolist() == list(co.CPPO_POSITION_COLUMNS)
    np.testing.assert_allclose(pos.threshold, 0.2 / co.position_weights(6, 0.8), rtol=1e-15)
    comps = co.components_of(family)
    for row in pos.iloc[[0, 3, 5]].itertuples(index=False):
        up, down = _ref_tails(row.threshold, comps, law.a, law.b)
        assert row.frac_threshold_pos == pytest.approx(up, rel=1e-9)
        assert row.frac_threshold_neg == pytest.approx(down, rel=1e-9)
        assert row.frac_threshold == pytest.approx(0.3 * up + 0.7 * down, rel=1e-9)
    th = co.theory(family, [1], "dppo-tv:0.2:0.3", token_prob=law).set_index("correction").frac_modified
    assert pos.frac_threshold.iloc[0] == pytest.approx(th["dppo-tv:0.2:0.3"], rel=1e-12)
    assert pos.exact.tolist() == [True] + [False] * 5
    assert co.cppo_positions("cppo:0.2:0.8:1", family, 3, token_prob=law).exact.all()
    p_up = sum(w * special.ndtr(m / math.sqrt(v)) for w, m, v in comps)
    assert pos.frac_away.iloc[0] == pytest.approx(0.3 * p_up + 0.7 * (1 - p_up), rel=1e-14)
    assert (pos.frac_threshold < pos.frac_away).all()


@pytest.mark.parametrize("model", MODELS, ids=["lognormal-0.1", "lognormal-0.5", "mixture"])
def test_limit_against_qaws(model):
    """E|pi - q|, the 0.9 quantile of |pi - q| and the threshold averaged over the position, to 1e-9."""
    family, law = _model(model)
    comps = co.components_of(family)
    spec = "cppo:0.2:0.8:0.02:0.3"
    lim = co.cppo_limit(spec, family, token_prob=law)
    assert lim["mean_d"] == pytest.approx(_ref_mean_d(comps, law.a, law.b), rel=1e-9)
    assert sum(_ref_tails(lim["q90"], comps, law.a, law.b)) == pytest.approx(0.1, rel=1e-9)
    assert lim["beta"] == min(max(lim["q90"], 0.02), 0.04)
    assert lim["binds"] == (lim["mean_d"] > lim["beta"])

    def f(u):
        up, down = _ref_tails(0.2 / (1 - 0.2 * u), comps, law.a, law.b)
        return 0.3 * up + 0.7 * down

    ref = integrate.quad(f, 0.0, 1.0, epsabs=0.0, epsrel=1e-12)[0]
    assert lim["frac_threshold"] == pytest.approx(ref, rel=1e-9)
    assert lim["frac_limit"] == (lim["frac_away"] if lim["binds"] else lim["frac_threshold"])


def test_limit_binds_with_a_small_budget_floor():
    """At sigma^2 = 0.5 E|pi - q| = 0.043 overspends the default budget (beta = 0.04); at 0.1 it does not."""
    lim = co.cppo_limit("cppo", get_family("lognormal", 1.0, 0.5))
    assert lim["binds"]
    assert lim["frac_limit"] == lim["frac_away"] == pytest.approx(0.5, rel=1e-14)
    lim = co.cppo_limit("cppo", get_family("lognormal", 1.0, 0.1))
    assert not lim["binds"]
    assert lim["frac_limit"] == lim["frac_threshold"] < 1e-3


def test_no_closed_form_rows():
    """Theory and find_T refuse cppo (Monte Carlo); has_theory says so; cppo_positions wants a cppo spec."""
    fam = get_family("lognormal", 1.0, 0.1)
    assert not co.has_theory(fam, "cppo")
    with pytest.raises(ValueError, match="Monte Carlo"):
        co.theory(fam, [1], "icepop,cppo")
    with pytest.raises(ValueError, match="Monte Carlo"):
        co.find_T(fam, "cppo")
    with pytest.raises(ValueError, match="cppo"):
        co.cppo_positions("dppo-tv", fam, 3)
    with pytest.raises(ValueError, match="T must"):
        co.cppo_positions("cppo", fam, 0)
    with pytest.raises(ValueError, match="gamma"):
        co.cppo_limit("cppo", get_family("gamma", 1.0, 0.1))


# ------------------------------------------------------------------------------- Monte Carlo
def _se(row) -> float:
    """Return the standard error behind a Monte Carlo row's 95 % interval of the modified fraction."""
    return (row.mc_frac_modified_hi - row.mc_frac_modified_lo) / (2 * 1.959963984540054)


@pytest.mark.parametrize("model", MODELS[1:], ids=["lognormal-0.5", "mixture"])
def test_monte_carlo_of_the_first_token_is_dppo_tv(model):
    """T = 1: every row (all, A > 0, A <= 0) within 4 standard errors of DPPO-TV's quadrature."""
    family, law = _model(model)
    mc = co.simulate_corrections(family, [1], "cppo:0.2:0.8:0.02:0.4", 6000, seed=3, token_prob=law)
    th = co.theory(family, [1], "dppo-tv:0.2:0.4", token_prob=law).frac_modified.to_numpy()
    for row, exact in zip(mc.itertuples(index=False), th, strict=True):
        assert abs(row.mc_frac_modified - exact) <= 4 * _se(row), (
            row.correction,
            row.mc_frac_modified,
            exact,
        )
    assert mc.mc_frac_modified.iloc[0] > 0


@pytest.mark.parametrize("model", MODELS[1:], ids=["lognormal-0.5", "mixture"])
def test_monte_carlo_with_an_idle_budget_is_the_threshold_alone(model):
    """delta_b >= 1: frac_modified at T is the mean over positions of the threshold alone, within 4 SE."""
    family, law = _model(model)
    spec = "cppo:0.15:0.6:1"
    mc = co.simulate_corrections(family, [5, 40], spec, 4000, seed=5, token_prob=law)
    for T in (5, 40):
        pos = co.cppo_positions(spec, family, T, token_prob=law)
        exact = {
            spec: pos.frac_threshold.mean(),
            f"{spec} [A>0]": pos.frac_threshold_pos.mean(),
            f"{spec} [A<=0]": pos.frac_threshold_neg.mean(),
        }
        for row in mc[mc["T"] == T].itertuples(index=False):
            assert abs(row.mc_frac_modified - exact[row.correction]) <= 4 * _se(row), (T, row.correction)


def _late_fraction(spec, family, law, p, n, T, seed):
    """Per sequence, the masked fraction of positions T/2..T of T-token sequences drawn from the model."""
    rng = np.random.default_rng(seed)
    ((_, m, v),) = co.components_of(family)
    y = rng.normal(m, math.sqrt(v), size=(n, T))
    lq = law.draw_logit(rng, (n, T))
    adv = np.where(rng.random(n) < p, 1.0, -1.0)[:, None]
    log_mu = -np.logaddexp(0.0, -lq)
    log_r = -np.logaddexp(0.0, -(lq + y)) - log_mu
    masked = co.apply_prob(co.parse(spec), log_r, log_mu, adv)[1]
    return masked[:, T // 2 :].mean(axis=1)


def test_late_tokens_once_the_budget_binds():
    """E|pi - q| well above the budget: late tokens are masked exactly when they move away (4 SE).

    ``cppo:0.2:0.8:0.005:0.3`` at sigma^2 = 0.5: E|pi - q| = 0.043 against beta = 0.01, so the prefix
    passes delta + beta W_{t-1} after about 8 tokens; at t >= 200 the chance it has not is below 1e-6.
    """
    family, law = get_family("lognormal", 1.0, 0.5), co.TOKEN_PROB_DEFAULT
    spec = "cppo:0.2:0.8:0.005:0.3"
    lim = co.cppo_limit(spec, family, token_prob=law)
    assert lim["binds"]
    assert lim["mean_d"] > 4 * lim["beta"]
    frac = _late_fraction(spec, family, law, 0.3, 2000, 400, seed=11)
    se = frac.std(ddof=1) / math.sqrt(frac.size)
    assert abs(frac.mean() - lim["frac_away"]) <= 4 * se, (frac.mean(), lim["frac_away"], se)


def test_late_tokens_while_the_budget_is_idle():
    """E|pi - q| well below the budget: late tokens are masked by the threshold delta / w_t alone (4 SE)."""
    family, law = get_family("lognormal", 1.0, 0.5), co.TOKEN_PROB_DEFAULT
    spec = "cppo:0.2:0.8:0.5:0.3"  # beta = 0.5 against E|pi - q| = 0.043
    assert not co.cppo_limit(spec, family, token_prob=law)["binds"]
    frac = _late_fraction(spec, family, law, 0.3, 2000, 400, seed=12)
    exact = co.cppo_positions(spec, family, 400, token_prob=law).frac_threshold.iloc[200:].mean()
    se = frac.std(ddof=1) / math.sqrt(frac.size)
    assert abs(frac.mean() - exact) <= 4 * se, (frac.mean(), exact, se)


def test_every_family_runs_and_the_budget_only_adds(every_family):
    """Every family: fractions in [0, 1], and the budget never masks fewer tokens than the threshold alone."""
    mc = co.simulate_corrections(every_family, [1, 8, 30], "cppo:0.1:0.8:0.01,cppo:0.1:0.8:1", 300, seed=2)
    frac = mc.set_index(["T", "correction"]).mc_frac_modified
    assert ((frac >= 0) & (frac <= 1)).all()
    for T in (1, 8, 30):
        for sign in ("", " [A>0]", " [A<=0]"):
            assert frac[(T, f"cppo:0.1:0.8:0.01{sign}")] >= frac[(T, f"cppo:0.1:0.8:1{sign}")]
    assert frac[(1, "cppo:0.1:0.8:0.01")] == frac[(1, "cppo:0.1:0.8:1")]  # token 1: the budget is not read


@pytest.mark.parametrize(
    "seeds", [range(20), pytest.param(range(200), marks=pytest.mark.slow)], ids=["20", "200"]
)
def test_interval_coverage_with_an_idle_budget(seeds, assert_coverage):
    """The Monte Carlo's 95 % intervals cover the exact fraction at the binomial rate (idle budget)."""
    family = get_family("lognormal", 1.0, 0.5)
    spec = "cppo:0.1:0.6:1"
    exact = co.cppo_positions(spec, family, 10).frac_threshold.mean()
    hits = 0
    for seed in seeds:
        row = co.simulate_corrections(family, [10], spec, 400, seed=seed).iloc[0]
        hits += row.mc_frac_modified_lo <= exact <= row.mc_frac_modified_hi
    assert_coverage([hits], len(seeds))
