r"""The probability-aware masks' rules (``dppo-tv``, ``dppo-kl``, ``kpop``) on log-probs, and on data.

The rules are checked against line-by-line transcriptions of the sources on plain Python floats:
Stable-RL's and verl's ``dppo_binary_tv`` / ``dppo_binary_kl`` masks (``valid = where(A > 0,
valid_positive, valid_negative)``, the KL with ``1e-8`` in both complements) and prime-rl PR
#3283's ``kpop_loss_fn`` (both probabilities clamped to ``[1e-6, 1 - 1e-6]``, either direction of
the binary KL above the threshold masks), and the TV rule against the prime-rl mirror.
"""

import itertools
import math

import numpy as np
import pytest

from variance_lab import corrections as co
from variance_lab.frameworks import prime_rl


# ------------------------------------------------------------------------------- the sources
def _verl_dppo_valid(loss_mode, log_prob, rollout_log_prob, advantage, low, high):
    """Stable-RL's _compute_token_mask_for_policy_loss (and verl's dppo_tv/dppo_kl) for one token."""
    prob, rollout_prob = math.exp(log_prob), math.exp(rollout_log_prob)
    if loss_mode == "dppo_binary_kl":
        kl = rollout_prob * (rollout_log_prob - log_prob) + (1 - rollout_prob) * math.log(
            (1.0 - rollout_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        invalid_positive = (kl > high) and (prob > rollout_prob)
        invalid_negative = (kl > low) and (prob < rollout_prob)
    else:  # dppo_binary_tv
        invalid_positive = (prob - rollout_prob) > high
        invalid_negative = (prob - rollout_prob) < -low
    return not (invalid_positive if advantage > 0 else invalid_negative)


def _kpop_masked(trainer_logprob, inference_logprob, threshold):
    """prime-rl PR #3283's kpop_loss_fn mask for one token."""
    eps = 1e-6
    p = min(max(math.exp(trainer_logprob), eps), 1 - eps)
    q = min(max(math.exp(inference_logprob), eps), 1 - eps)

    def binary_kl(a, b):
        return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))

    return binary_kl(p, q) > threshold or binary_kl(q, p) > threshold


def _random_tokens(seed, n=4000):
    """Log-probs of the sampler and of the policy: every scale of probability, large and small moves."""
    rng = np.random.default_rng(seed)
    log_mu = -rng.exponential(rng.choice([0.05, 1.0, 5.0], size=n))
    log_mu[:20] = 0.0  # probability 1 exactly (top-p)
    y = rng.normal(0, rng.choice([0.01, 0.3, 2.0], size=n))
    log_pi = np.minimum(log_mu + y, 0.0)
    adv = rng.choice([-1.0, 0.0, 0.5], size=n)
    return log_pi, log_mu, adv


def _row_selection(row, lengths, adv):
    """Return the sequences and the tokens a table row covers: its length bucket and its advantage sign."""
    sel = (lengths >= row.T_min) & (lengths <= row.T_max)
    if row.correction.endswith("[A>0]"):
        sel &= adv > 0
    elif row.correction.endswith("[A<=0]"):
        sel &= adv <= 0
    return sel, np.repeat(sel, lengths)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("spec", "mode", "delta"),
    [
        ("dppo-tv", "dppo_binary_tv", 0.15),
        ("dppo-tv:0.02", "dppo_binary_tv", 0.02),
        ("dppo-kl", "dppo_binary_kl", 0.05),
        ("dppo-kl:0.003", "dppo_binary_kl", 0.003),
    ],
)
def test_dppo_is_the_sources_rule(seed, spec, mode, delta):
    """Every keep decision of dppo-tv / dppo-kl equals Stable-RL's and verl's, zero advantage negative."""
    log_pi, log_mu, adv = _random_tokens(seed)
    c = co.parse(spec)
    w, masked = co.apply_prob(c, log_pi - log_mu, log_mu, adv)
    ref = [
        not _verl_dppo_valid(mode, a, b, s, delta, delta) for a, b, s in zip(log_pi, log_mu, adv, strict=True)
    ]
    assert masked.tolist() == ref
    assert 0 < masked.sum() < masked.size  # both kinds of decision were made
    np.testing.assert_array_equal(w, np.where(masked, 0.0, np.exp(log_pi - log_mu)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("delta", [0.1, 0.01, 1.0])
def test_kpop_is_prime_rls_rule(seed, delta):
    """Every kpop decision equals prime-rl PR #3283's kpop_loss_fn (clamps included), whatever the sign."""
    log_pi, log_mu, adv = _random_tokens(seed)
    _, masked = co.apply_prob(co.parse(f"kpop:{delta}"), log_pi - log_mu, log_mu, adv)
    assert masked.tolist() == [_kpop_masked(a, b, delta) for a, b in zip(log_pi, log_mu, strict=True)]
    assert 0 < masked.sum() < masked.size


def test_dppo_tv_is_the_prime_rl_mirrors_mask():
    """dppo-tv:0.2 masks what prime-rl's default_loss_fn masks (its mirror), away from float32 ties."""
    log_pi, log_mu, adv = _random_tokens(7, n=3000)
    keep, _ = prime_rl.dppo_mask(log_pi[None, :], log_mu[None, :], adv[None, :], np.ones((1, log_pi.size)))
    _, masked = co.apply_prob(co.parse("dppo-tv:0.2"), log_pi - log_mu, log_mu, adv)
    d = np.exp(log_pi) - np.exp(log_mu)
    clear = np.abs(np.abs(d) - 0.2) > 1e-6
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(masked[clear], keep[0][clear] == 0)


def test_a_value_at_the_threshold_is_kept():
    """A difference or divergence exactly at the threshold is kept (the strict >); past it, masked."""
    lp, lm = math.log(0.8), math.log(0.55)
    d = math.exp(lp) - math.exp(lm)  # the difference exactly as the rule takes it
    below = float(np.nextafter(d, 0))
    assert co.prob_sides(co.parse(f"dppo-tv:{d!r}"), lp, lm)[0].tolist() is False
    assert co.prob_sides(co.parse(f"dppo-tv:{below!r}"), lp, lm)[0].tolist() is True
    log1m = (math.log1p(-0.8), math.log1p(-0.55))
    kl = float(co.binary_kl(lm, log1m[1], lp, log1m[0]))  # D(mu || pi), the exact rule's
    below = float(np.nextafter(kl, 0))
    assert co.prob_sides(co.parse(f"dppo-kl:{kl!r}"), lp, lm, exact=True, log1m=log1m)[0].tolist() is False
    assert co.prob_sides(co.parse(f"dppo-kl:{below!r}"), lp, lm, exact=True, log1m=log1m)[0].tolist() is True


def test_binary_kl_against_the_formula():
    """binary_kl from logs equals a log(a/b) + (1-a) log((1-a)/(1-b)); 0 log 0 counts 0."""
    a, b = np.array([0.3, 1e-9, 0.999]), np.array([0.1, 0.2, 0.5])
    got = co.binary_kl(np.log(a), np.log1p(-a), np.log(b), np.log1p(-b))
    ref = a * np.log(a / b) + (1 - a) * np.log((1 - a) / (1 - b))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert co.binary_kl(0.0, -np.inf, np.log(0.4), np.log(0.6)) == pytest.approx(-math.log(0.4), rel=1e-15)
    assert co.binary_kl(np.log(0.5), np.log(0.5), 0.0, -np.inf) == np.inf


def test_logit_shift():
    """The shift is logit pi - logit mu, NaN where a probability is 1."""
    got = co.logit_shift(np.log([0.6, 0.2, 1.0]), np.log([0.5, 0.1, 0.9]))
    assert got[0] == pytest.approx(math.log(1.5), rel=1e-14)
    assert got[1] == pytest.approx(math.log(0.25 / (0.1 / 0.9)), rel=1e-14)
    assert math.isnan(got[2])


def test_exact_and_guarded_rules_differ_only_near_0_and_1():
    """The theory's exact divergences and the sources' guards decide alike away from the edges."""
    log_pi, log_mu, adv = _random_tokens(11)
    inner = (
        (np.exp(log_mu) > 1e-4)
        & (np.exp(log_mu) < 1 - 1e-4)
        & (np.exp(log_pi) > 1e-4)
        & (np.exp(log_pi) < 1 - 1e-4)
    )
    for spec in ("dppo-kl", "kpop"):
        c = co.parse(spec)
        _, guarded = co.apply_prob(c, log_pi - log_mu, log_mu, adv)
        _, exact = co.apply_prob(c, log_pi - log_mu, log_mu, adv, exact=True)
        np.testing.assert_array_equal(guarded[inner], exact[inner])


def test_apply_prob_bad_input_names_it():
    """DPPO without advantages, a shape mismatch and a ratio spec are ValueErrors naming what is wrong."""
    with pytest.raises(ValueError, match="advantage"):
        co.apply_prob(co.parse("dppo-tv"), np.zeros(3), np.log(np.full(3, 0.5)))
    with pytest.raises(ValueError, match="shape"):
        co.apply_prob(co.parse("kpop"), np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="icepop"):
        co.prob_sides(co.parse("icepop"), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="apply_prob"):
        co.apply_tokens(co.parse("kpop"), np.zeros(3))


@pytest.mark.parametrize(
    ("spec", "params"),
    [
        ("dppo-tv", (0.15, 0.5)),
        ("dppo-tv:0.2", (0.2, 0.5)),
        ("dppo-kl:0.01:0.3", (0.01, 0.3)),
        ("kpop", (0.1,)),
        ("kpop:0.5", (0.5,)),
    ],
)
def test_parse(spec, params):
    """Defaults: DPPO's 0.15 (TV) and 0.05 (KL) with P(A > 0) = 0.5, KPop's 0.1."""
    c = co.parse(spec)
    assert c.params == pytest.approx(params)
    assert c.prob
    assert c.level == "token"
    assert c.signed == c.kind.startswith("dppo")
    assert co.parse("dppo-kl").params == (0.05, 0.5)


@pytest.mark.parametrize(
    "spec", ["dppo-tv:1", "dppo-tv:0", "dppo-kl:-1", "kpop:0", "dppo-tv:0.1:1", "kpop:0.1:0.5"]
)
def test_bad_specs_name_themselves(spec):
    """A TV threshold outside (0, 1), a KL threshold <= 0, P outside (0, 1), too many parameters."""
    with pytest.raises(ValueError, match=spec.split(":")[0]):
        co.parse(spec)
    with pytest.raises(ValueError, match="probabilities"):
        co.parse("kpop").log_bounds()


# ------------------------------------------------------------------------------- data
#: This module's random file: longest, scale, sd, advantages (the ``token_file`` fixture's arguments).
FILE = (25, 1.0, 0.6, (-1.0, 0.0, 1.0))


def test_evaluate_dppo_rows_by_sign_match_a_plain_loop(token_file):
    """On data DPPO's rows split by A > 0 (zero advantages negative) and each fraction is a plain count."""
    lengths, off, log_r, log_mu, adv = token_file(3, 60, *FILE)
    df = co.evaluate(
        log_r, off, "dppo-tv:0.1,kpop:0.05", advantages=adv, log_mu=log_mu, buckets=[(1, 10), (11, 24)]
    )
    assert df.correction.tolist()[:4] == [
        "dppo-tv:0.1",
        "dppo-tv:0.1 [A>0]",
        "dppo-tv:0.1 [A<=0]",
        "kpop:0.05",
    ]
    seq_adv = np.repeat(adv, lengths)
    d = np.exp(log_mu + log_r) - np.exp(log_mu)
    masked = np.where(seq_adv > 0, d > 0.1, d < -0.1)
    for row in df[df.correction.str.startswith("dppo")].itertuples(index=False):
        sel, tok = _row_selection(row, lengths, adv)
        assert row.n_seq == sel.sum()
        assert row.frac_modified == pytest.approx(masked[tok].mean(), rel=1e-12)
        assert row.mean_w == pytest.approx(np.where(masked, 0, np.exp(log_r))[tok].mean(), rel=1e-12)


def test_evaluate_prediction_is_the_mean_expected_mask(token_file):
    """With predict=, a probability-aware row's prediction is the mean of expected_masked over its tokens."""
    lengths, off, log_r, log_mu, adv = token_file(5, 60, *FILE)
    df = co.evaluate(
        log_r, off, "kpop:0.05,dppo-kl:0.02", advantages=adv, log_mu=log_mu, predict=co.fit_lognormal(log_r)
    )
    e = co.expected_masked(co.parse("kpop:0.05"), log_r, log_mu)
    assert df.set_index("correction").pred_frac_modified["kpop:0.05"] == pytest.approx(e.mean(), rel=1e-12)
    e = co.expected_masked(co.parse("dppo-kl:0.02"), log_r, log_mu, np.repeat(adv, lengths))
    pos = np.repeat(adv > 0, lengths)
    got = df.set_index("correction").pred_frac_modified
    assert got["dppo-kl:0.02"] == pytest.approx(e.mean(), rel=1e-12)
    assert got["dppo-kl:0.02 [A>0]"] == pytest.approx(e[pos].mean(), rel=1e-12)


def test_expected_masked_is_the_fitted_models_conditional_fraction():
    """The prediction per token: mask_given_q under the lognormal fitted to the finite log-odds shifts."""
    log_mu = np.log(np.array([0.3, 0.6, 1.0, 0.05, 0.9]))
    log_r = np.array([0.2, -0.4, -0.1, 1.5, -0.02])
    y = co.logit_shift(log_mu + log_r, log_mu)
    fit = co.fit_lognormal(y[np.isfinite(y)])
    c = co.parse("kpop:0.05")
    up, down = co.mask_given_q(c, fit, log_mu[[0, 1, 3, 4]] - np.log1p(-np.exp(log_mu[[0, 1, 3, 4]])))
    got = co.expected_masked(c, log_r, log_mu)
    np.testing.assert_allclose(got[[0, 1, 3, 4]], up + down, rtol=1e-12)
    assert got[2] == 0.0  # probability 1: no finite shift, never masked in the model


def test_evaluate_needs_the_log_probs(token_file):
    """A probability-aware spec without log_mu, or with a bad one, is a ValueError naming it."""
    _, off, log_r, log_mu, _ = token_file(3, 60, *FILE)
    with pytest.raises(ValueError, match="log_mu"):
        co.evaluate(log_r, off, "kpop")
    with pytest.raises(ValueError, match="log_mu"):
        co.evaluate(log_r, off, "kpop", log_mu=log_mu[:-1])
    with pytest.raises(ValueError, match="log-prob"):
        co.evaluate(log_r, off, "kpop", log_mu=-log_mu)
    with pytest.raises(ValueError, match="advantage"):
        co.evaluate(log_r, off, "dppo-tv", log_mu=log_mu)
    with pytest.raises(ValueError, match="log_mu"):
        co.bucket_bootstrap(log_r, off, "kpop", [(1, 30)])


# ------------------------------------------------------------------------------- CPPO's rule
def _torch_quantile(values, q):
    """torch.quantile's default (linear) on a list: sorted, rank q (n - 1), torch.lerp's two formulas."""
    s = sorted(values)
    rank = q * (len(s) - 1)
    k = math.floor(rank)
    if k + 1 >= len(s):
        return s[k]
    a, b, t = s[k], s[k + 1], rank - k
    return a + t * (b - a) if t < 0.5 else b - (b - a) * (1 - t)


def _unirl_cppo_keep(new_logp, old_logp, adv, lengths, delta, w_min, delta_b):
    """UniRL's _cppo_mask (unirl/algorithms/cppo.py at 30899fc) on Python floats, one sequence at a time.

    ``D_t = |exp(new) - exp(old)|``, ``ratio = exp(clamp(new - old, -20, 20))``, ``toward_mu = A (ratio - 1)
    <= 0``, ``w_t = 1 - (1 - w_min)(t - 1) / max(T - 1, 1)``, ``Z_t = w_t D_t``, right-shifted prefix sums,
    ``delta_b_seq = quantile(D, 0.9).clamp(delta_b, 2 delta_b)``, ``c_t = min(delta, delta + delta_b_seq
    W_prev - S_prev)``, ``keep = toward_mu | (Z_t <= c_t)``.
    """
    keep, start = [], 0
    for T in lengths:
        new, old, a = new_logp[start : start + T], old_logp[start : start + T], adv[start : start + T]
        start += T
        d = [abs(math.exp(x) - math.exp(y)) for x, y in zip(new, old, strict=True)]
        ratio = [math.exp(min(max(x - y, -20.0), 20.0)) for x, y in zip(new, old, strict=True)]
        w = [1.0 - (1.0 - w_min) * (t - 1) / max(T - 1, 1) for t in range(1, T + 1)]
        beta = min(max(_torch_quantile(d, 0.9), delta_b), 2.0 * delta_b)
        s_prev = w_prev = 0.0
        for t in range(T):
            z = w[t] * d[t]
            keep.append(a[t] * (ratio[t] - 1.0) <= 0.0 or z <= min(delta, delta + beta * w_prev - s_prev))
            s_prev += z
            w_prev += w[t]
    return keep


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("spec", "params", "sd"),
    [
        ("cppo", (0.2, 0.8, 0.02), 0.6),
        ("cppo:0.05:0.5:0.01", (0.05, 0.5, 0.01), 0.6),
        ("cppo:0.1:1:0", (0.1, 1.0, 0.0), 0.6),
        ("cppo:0.15:0.8:1", (0.15, 0.8, 1.0), 0.6),
        ("cppo:0.03:0.8:0.02", (0.03, 0.8, 0.02), 0.05),  # small shifts: the 0.9 quantile inside the clamp
    ],
)
def test_cppo_is_unirls_rule(token_file, seed, spec, params, sd):
    """Every keep decision of cppo equals UniRL's _cppo_mask, sequence by sequence, zero advantages kept."""
    lengths, off, log_r, log_mu, adv = token_file(seed, 120, 60, 1.0, sd, (-1.0, 0.0, 0.5))
    c = co.parse(spec)
    adv_tok = np.repeat(adv, lengths)
    w, masked = co.apply_prob(c, log_r, log_mu, adv_tok, offsets=off)
    ref = _unirl_cppo_keep((log_mu + log_r).tolist(), log_mu.tolist(), adv_tok, lengths, *params)
    assert masked.tolist() == [not k for k in ref]
    assert 0 < masked.sum() < masked.size
    assert not masked[adv_tok == 0].any()
    np.testing.assert_array_equal(w, np.where(masked, 0.0, np.exp(log_r)))
    delta, w_min, delta_b = params
    if delta_b < 1:  # the budget binds: tokens within the threshold delta / w_t are masked too
        lone = co.apply_prob(co.parse(f"cppo:{delta}:{w_min}:1"), log_r, log_mu, adv_tok, offsets=off)[1]
        assert (masked & ~lone).any()
        assert not (lone & ~masked).any()  # the budget only lowers the threshold
    if sd < 0.1:  # the case that reads the quantile: inside (delta_b, 2 delta_b) for a fifth of the sequences
        d = np.abs(np.exp(log_mu + log_r) - np.exp(log_mu))
        p90 = np.array([np.quantile(d[a:b], 0.9) for a, b in itertools.pairwise(off)])
        assert np.mean((p90 > delta_b) & (p90 < 2 * delta_b)) > 0.2


def test_cppo_on_rows_equals_cppo_on_offsets(token_file):
    """One sequence a row (the Monte Carlo's layout) decides as the ragged file with offsets."""
    _, _, log_r, log_mu, _ = token_file(4, 200, 2, 1.0, 0.8, (1.0,))  # one token each, then reshaped
    log_r, log_mu = log_r[:180].reshape(12, 15), log_mu[:180].reshape(12, 15)
    adv = np.repeat([[1.0], [-1.0]], 6, axis=0)
    c = co.parse("cppo:0.1:0.6:0.01")
    rows = co.apply_prob(c, log_r, log_mu, adv)[1]
    flat = co.apply_prob(
        c, log_r.ravel(), log_mu.ravel(), np.repeat(adv.ravel(), 15), offsets=np.arange(0, 181, 15)
    )[1]
    np.testing.assert_array_equal(rows.ravel(), flat)
    assert rows.any()


def test_cppo_of_one_token_is_dppo_tv():
    """A sequence of one token: w_1 = 1 and c_1 = delta, so cppo:D masks what dppo-tv:D masks (A != 0)."""
    log_pi, log_mu, adv = _random_tokens(5)
    adv = np.where(adv == 0, 1.0, adv)
    off = np.arange(log_pi.size + 1)
    _, cppo = co.apply_prob(co.parse("cppo:0.15"), log_pi - log_mu, log_mu, adv, offsets=off)
    _, dppo = co.apply_prob(co.parse("dppo-tv:0.15"), log_pi - log_mu, log_mu, adv)
    np.testing.assert_array_equal(cppo, dppo)
    assert cppo.any()


def test_cppo_position_weights():
    """w_t falls linearly from 1 to w_min; one token has weight 1."""
    np.testing.assert_allclose(co.position_weights(5, 0.8), [1.0, 0.95, 0.9, 0.85, 0.8], rtol=1e-15)
    assert co.position_weights(1, 0.3).tolist() == [1.0]
    assert co.position_weights(3, 1.0).tolist() == [1.0, 1.0, 1.0]


def test_cppo_budget_at_its_boundaries():
    """Exact binary fractions: a weighted divergence equal to its threshold is kept, one ulp above masked.

    ``cppo:0.25:0.5:0.125``, three tokens: w = 1, 0.75, 0.5; every D >= 0.25, so the budget is clamped
    to 2 delta_b = 0.25. Token 1: Z = 0.375 > 0.25 (the threshold). Token 2: Z = 0.1875 <= 0.25, but the
    prefix spent 0.375 of a budget 0.25, so c_2 = 0.125 (the budget). Token 3: c_3 = 0.25 + 0.25 * 1.75 -
    0.5625 = 0.125, and Z_3 = 0.5 D_3.
    """
    c = co.parse("cppo:0.25:0.5:0.125")
    away = np.ones(3, dtype=bool)
    at = np.array([0.375, 0.25, 0.25])
    assert co.cppo_mask(c, at, away).tolist() == [True, True, False]
    above = at.copy()
    above[2] = np.nextafter(0.25, 1.0)
    assert co.cppo_mask(c, above, away).tolist() == [True, True, True]
    assert co.cppo_mask(co.parse("cppo:0.25:0.5:1"), at, away).tolist() == [True, False, False]  # idle budget
    assert not co.cppo_mask(c, above, ~away).any()  # tokens moving toward the sampler are always kept


def test_cppo_budget_spent_exactly():
    """A prefix that spent exactly its budget (S_1 = beta W_1) keeps c_2 = delta; one ulp more lowers it."""
    c = co.parse("cppo:0.25:0.5:0.125")  # T = 2: w = 1, 0.5; both D >= 0.25, so beta = 0.25
    away = np.ones(2, dtype=bool)
    assert co.cppo_mask(c, np.array([0.25, 0.5]), away).tolist() == [False, False]  # Z_2 = 0.25 = c_2
    assert co.cppo_mask(c, np.array([0.25, np.nextafter(0.5, 1.0)]), away).tolist() == [False, True]
    assert co.cppo_mask(c, np.array([np.nextafter(0.25, 1.0), 0.5]), away).tolist() == [True, True]


def test_cppo_zero_budget_masks_once_the_prefix_passes_delta():
    """delta_b = 0: c_t = delta - S_{t-1}, so a token moving away is masked once S_t exceeds delta."""
    c = co.parse("cppo:0.25:1:0")
    got = co.cppo_mask(c, np.full(4, 0.125), np.ones(4, dtype=bool))
    assert got.tolist() == [False, False, True, True]  # S_2 = 0.25 = delta is kept, S_3 = 0.375 is not


def test_cppo_bad_input_names_it():
    """No advantages, a wrong spec, mismatched shapes, bad offsets; bad specs name themselves."""
    with pytest.raises(ValueError, match="advantage"):
        co.apply_prob(co.parse("cppo"), np.zeros(3), np.log(np.full(3, 0.5)))
    with pytest.raises(ValueError, match="cppo"):
        co.cppo_mask(co.parse("dppo-tv"), np.zeros(3), np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="shape"):
        co.cppo_mask(co.parse("cppo"), np.zeros(3), np.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="offsets"):
        co.cppo_mask(co.parse("cppo"), np.zeros(3), np.ones(3, dtype=bool), offsets=[0, 2])
    with pytest.raises(ValueError, match="sides"):
        co.prob_sides(co.parse("cppo"), np.zeros(2), np.zeros(2))
    for spec, what in [
        ("cppo:0", "D"),
        ("cppo:0.2:0", "WMIN"),
        ("cppo:0.2:1.5", "WMIN"),
        ("cppo:0.2:0.8:-0.1", "DB"),
        ("cppo:0.2:0.8:0.02:1", "P"),
        ("cppo:0.2:0.8:0.02:0.5:1", "takes"),
    ]:
        with pytest.raises(ValueError, match=what):
            co.parse(spec)
    assert co.parse("cppo").params == (0.2, 0.8, 0.02, 0.5)
    assert co.parse("cppo:0.15:0.9").params == (0.15, 0.9, 0.02, 0.5)
    assert co.parse("cppo").signed
    assert co.parse("cppo").prob


def test_evaluate_cppo_rows_match_the_rule(token_file):
    """On data cppo's rows split by A > 0; each fraction is the rule's count; no prediction (NaN)."""
    lengths, off, log_r, log_mu, adv = token_file(6, 80, *FILE)
    c = co.parse("cppo:0.05:0.8:0.01")
    df = co.evaluate(
        log_r,
        off,
        [c],
        advantages=adv,
        log_mu=log_mu,
        buckets=[(1, 12), (13, 24)],
        predict=co.fit_lognormal(log_r),
    )
    masked = co.apply_prob(c, log_r, log_mu, np.repeat(adv, lengths), offsets=off)[1]
    assert masked.any()
    for row in df.itertuples(index=False):
        _, tok = _row_selection(row, lengths, adv)
        assert row.frac_modified == pytest.approx(masked[tok].mean(), rel=1e-12, abs=0)
        assert row.mean_w == pytest.approx(np.where(masked, 0, np.exp(log_r))[tok].mean(), rel=1e-12)
        assert math.isnan(row.pred_frac_modified)
        assert not row.pred_inside
    assert df.correction.tolist()[:3] == [c.spec, f"{c.spec} [A>0]", f"{c.spec} [A<=0]"]
