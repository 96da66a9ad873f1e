"""Sign-dependent weights (TOPR, DeepSeek-V3.2's off-policy mask, ASPO): closed forms, Monte Carlo, data.

The reference writes each weight out from its definition as a function of log P_T (ASPO: of a
token's log r) and integrates it against the normal density with ``mpmath.quad`` at 40 digits,
split at its breakpoints; the overall row mixes the signs with P(A >= 0) = p by hand.
"""

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from variance_lab import corrections as co
from variance_lab.families import get_family
from variance_lab.frameworks import trl


# ------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("spec", "params"),
    [("topr", (0.5,)), ("topr:0.2", (0.2,)), ("opsm:0.1", (0.1, 0.5)), ("opsm:0.05:0.8", (0.05, 0.8))],
)
def test_parse(spec, params):
    """A sign spec parses to (DELTA, P) or (P), P = 0.5 by default."""
    c = co.parse(spec)
    assert c.params == params
    assert c.signed
    assert c.p_positive == params[-1]
    assert c.level == "sequence"


@pytest.mark.parametrize(
    ("spec", "params"),
    [
        ("aspo", (0.2, 0.2, 3.0, 0.5)),
        ("aspo:0.4", (0.4, 0.4, 3.0, 0.5)),
        ("aspo:0.2:0.28", (0.2, 0.28, 3.0, 0.5)),
        ("aspo:0.2:0.28:2", (0.2, 0.28, 2.0, 0.5)),
        ("aspo:0.1:0.3:5:0.7", (0.1, 0.3, 5.0, 0.7)),
    ],
)
def test_parse_aspo(spec, params):
    """ASPO's params are always (EL, EH, C, P), the defaults Archer2.0's 0.2, 0.2, 3 and P = 0.5."""
    c = co.parse(spec)
    assert c.params == params
    assert (c.signed, c.level, c.base, c.p_positive) == (True, "token", "r", params[-1])


@pytest.mark.parametrize(
    "spec",
    [
        "topr:0",
        "topr:1",
        "opsm:0.1:1.5",
        "opsm",
        "topr:0.5:0.5",
        "aspo:1",
        "aspo:0.2:0",
        "aspo:0.2:0.2:1",
        "aspo:0.2:0.2:3:1",
        "aspo:0.2:0.2:3:0.5:1",
    ],
)
def test_parse_rejects(spec):
    """P outside (0, 1), a missing DELTA or too many parameters: ValueError naming the kind."""
    with pytest.raises(ValueError, match=spec.split(":")[0]):
        co.parse(spec)


# ------------------------------------------------------------------------------- theory
def _weight(c, T, positive):
    """Return the weight as a function of x = log P_T (ASPO: log r), from the definitions (not the pieces)."""
    if c.kind == "aspo":
        el, eh, C = (mp.mpf(p) for p in c.params[:3])
        if positive:
            return lambda x: C if mp.exp(-x) > C else (mp.exp(-x) if mp.exp(x) <= 1 + eh else mp.mpf(0))
        return lambda x: mp.mpf(0) if mp.exp(x) < 1 - el else min(mp.exp(x), C)
    if c.kind == "topr":
        return (lambda x: mp.mpf(1)) if positive else (lambda x: mp.exp(min(x, 0)))
    if positive:
        return mp.exp
    delta = mp.mpf(c.params[0])
    return lambda x: mp.exp(x) if -x / T <= delta else mp.mpf(0)


def _breaks(c, T) -> tuple[set, dict]:
    """Return the weight's breakpoints in x, and each sign's kept band (lo, hi) of x (modified outside)."""
    if c.kind == "aspo":
        el, eh, C = (mp.mpf(p) for p in c.params[:3])
        pos, neg = (-mp.log(C), mp.log(1 + eh)), (mp.log(1 - el), mp.log(C))
        return {*pos, *neg}, {"A>=0": pos, "A<0": neg}
    if c.kind == "topr":
        return {mp.mpf(0)}, {"A>=0": (-mp.inf, mp.inf), "A<0": (-mp.inf, mp.mpf(0))}
    lo = -T * mp.mpf(c.params[0])
    return {lo}, {"A>=0": (-mp.inf, mp.inf), "A<0": (lo, mp.inf)}


def _reference(spec, mu, s2, T):
    """{sign: (mean, var, frac_modified, bias)} at 40 digits."""
    c = co.parse(spec)
    with mp.workdps(40):
        v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
        n = 1 if c.level == "token" else T  # ASPO's weights are per token
        M, S = n * (mp.log(mu) - v / 2), mp.sqrt(n * v)
        brk, band = _breaks(c, T)
        lo, hi = M - 40 * S, M + 40 * S
        pts = sorted({lo, hi} | {b for b in brk if lo < b < hi})

        def expect(f):
            return mp.fsum(
                mp.quad(lambda x: f(x) * mp.npdf(x, M, S), [a, b]) for a, b in itertools.pairwise(pts)
            )

        base = mp.exp(M + S * S / 2)
        side = {}
        for sign, positive in (("A>=0", True), ("A<0", False)):
            w = _weight(c, T, positive)
            e1, e2 = expect(w), expect(lambda x, w=w: w(x) ** 2)
            a, b = band[sign]
            fr = (mp.ncdf(a, M, S) if a > -mp.inf else 0) + (1 - mp.ncdf(b, M, S) if b < mp.inf else 0)
            side[sign] = (e1, e2, mp.mpf(fr))
        p = mp.mpf(c.p_positive)
        side["all"] = tuple(p * a + (1 - p) * b for a, b in zip(side["A>=0"], side["A<0"], strict=False))
        return {k: (e1, e2 - e1 * e1, fr, e1 - base) for k, (e1, e2, fr) in side.items()}


def _close(got, want, rel=1e-9):
    want = float(want)
    return abs(got - want) <= rel * max(abs(want), 1e-300) or (want == 0 and abs(got) < 1e-300)


@pytest.mark.parametrize(("mu", "s2"), [(1.0, 0.1), (0.98, 0.02), (1.05, 0.5)])
@pytest.mark.parametrize("T", [1, 10, 200])
def test_theory_against_mpmath(mu, s2, T):
    """Mean, variance, masked fraction and bias of every sign's row match mpmath to 1e-9."""
    specs = ["topr", "topr:0.3", "opsm:0.05", "opsm:0.01:0.8", "aspo", "aspo:0.1:0.4:2:0.3"]
    th = co.theory(get_family("lognormal", mu, s2), [T], specs).set_index("correction")
    for spec in specs:
        ref = _reference(spec, mu, s2, T)
        for sign in co.SIGNS:
            row = th.loc[co.sign_label(co.parse(spec), sign)]
            mean, var, frac, bias = ref[sign]
            assert _close(row.mean_w, mean), (spec, sign, "mean")
            assert _close(row.var_w, var), (spec, sign, "var")
            assert _close(row.frac_modified, frac), (spec, sign, "frac")
            assert abs(row.bias - float(bias)) <= 1e-9 * max(abs(float(bias)), float(mean)), (spec, sign)
        c = co.parse(spec)
        if c.level == "token":  # a sequence has one sign: P(any token modified) mixes the signs'
            with mp.workdps(40):
                f = {s: ref[s][2] for s in co.SIGNS[1:]}
                p = mp.mpf(c.p_positive)
                anys = {s: 1 - (1 - f[s]) ** T for s in f}
                anys["all"] = p * anys["A>=0"] + (1 - p) * anys["A<0"]
            for sign in co.SIGNS:
                assert _close(th.loc[co.sign_label(c, sign)].frac_seq_any, anys[sign]), (spec, sign, "any")


def test_theory_rows_and_other_families():
    """Three rows per sign spec, in order; other families have no closed form for it."""
    th = co.theory(get_family("lognormal", 1.0, 0.1), [10], "topr,seq-tis:3")
    assert th.correction.tolist() == ["topr", "topr [A>=0]", "topr [A<0]", "seq-tis:3"]
    assert not co.has_theory(get_family("random-scale", 1.0, 0.1, alpha=2.0), "topr")
    with pytest.raises(ValueError, match="lognormal"):
        co.theory(get_family("random-scale", 1.0, 0.1, alpha=2.0), [10], "opsm:0.1")


def test_find_T_on_the_masked_fraction():
    """find_T for opsm: the first T whose overall masked fraction (p = 0.5) reaches the threshold."""
    fam = get_family("lognormal", 1.0, 0.1)
    k = co.find_T(fam, "opsm:0.02", 0.4)  # the mean log r, -0.048, lies below -0.02: negatives -> masked
    f = co.theory(fam, [k - 1, k], "opsm:0.02").set_index(["correction", "T"]).frac_modified
    assert k > 1
    assert f[("opsm:0.02", k)] >= 0.4 > f[("opsm:0.02", k - 1)]
    assert co.find_T(fam, "opsm:0.2", 0.3) is None  # the mean lies above -0.2: the mask fades with T


def test_aspo_find_T_on_the_mixed_fraction():
    """find_T for aspo: the first T at which p (1 - (1 - f+)^T) + (1 - p) (1 - (1 - f-)^T) reaches it."""
    fam = get_family("lognormal", 1.0, 0.01)
    k = co.find_T(fam, "aspo", 0.5)
    f = co.theory(fam, [k - 1, k], "aspo").set_index(["correction", "T"]).frac_seq_any
    assert k > 1
    assert f[("aspo", k)] >= 0.5 > f[("aspo", k - 1)]


# ------------------------------------------------------------------------------- Monte Carlo
def test_aspo_monte_carlo_within_4_se_of_theory():
    """ASPO's Monte Carlo rows: means, per-token and any-token fractions within 4 SE of theory.

    Tokens are i.i.d. given the sign, so a sign's row has n_sign * T independent tokens; the overall
    row's tokens share their sequence's sign, and its SE uses one unit per sequence (the variance of a
    sequence's mean token weight is at most a token's).
    """
    fam = get_family("lognormal", 1.0, 0.1)
    n, T, spec = 20_000, 10, "aspo:0.2:0.2:3:0.3"
    th = co.theory(fam, [T], spec).set_index("correction")
    mc = co.simulate_corrections(fam, [T], spec, n, seed=5).set_index("correction")
    p = co.parse(spec).p_positive
    for sign, share in zip(co.SIGNS, (1.0, p, 1 - p), strict=True):
        label = co.sign_label(co.parse(spec), sign)
        t, m = th.loc[label], mc.loc[label]
        units = n * share * (T if sign != "all" else 1)
        assert abs(m.mc_mean_w - t.mean_w) <= 4 * math.sqrt(t.var_w / units), label
        se_f = math.sqrt(t.frac_modified * (1 - t.frac_modified) / units)
        assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se_f, label
        se_any = math.sqrt(t.frac_seq_any * (1 - t.frac_seq_any) / (n * share))
        assert abs(m.mc_frac_seq_any - t.frac_seq_any) <= 4 * se_any, label


def test_monte_carlo_within_4_se_of_theory():
    """Monte Carlo means and fractions of every sign's row lie within 4 predicted SE of theory."""
    fam = get_family("lognormal", 1.0, 0.1)
    n, specs = 20_000, "topr:0.3,opsm:0.05"
    th = co.theory(fam, [1, 10], specs)
    mc = co.simulate_corrections(fam, [1, 10], specs, n, seed=3)
    for t, m in zip(th.itertuples(index=False), mc.itertuples(index=False), strict=True):
        assert (t.T, t.correction) == (m.T, m.correction)
        c = co.parse(t.correction.split(" ")[0])
        p = c.p_positive
        units = n * {"A>=0": p, "A<0": 1 - p}.get(t.correction.partition("[")[2].rstrip("]"), 1.0)
        se = math.sqrt(t.var_w / units)
        assert abs(m.mc_mean_w - t.mean_w) <= 4 * se + 1e-12, (t.correction, t.T)
        se_f = math.sqrt(t.frac_modified * (1 - t.frac_modified) / units)
        assert abs(m.mc_frac_modified - t.frac_modified) <= 4 * se_f + 1e-12, (t.correction, t.T)


def test_monte_carlo_every_family(every_family):
    """Every family gives three rows per spec, the overall row between its two signs."""
    mc = co.simulate_corrections(every_family, [8], "topr,opsm:0.05,aspo", 400, seed=0)
    assert len(mc) == 9
    for spec in ("topr", "opsm:0.05", "aspo"):
        rows = mc.set_index("correction")
        c = co.parse(spec)
        a, pos, neg = (rows.loc[co.sign_label(c, s)] for s in co.SIGNS)
        assert min(pos.mc_mean_w, neg.mc_mean_w) <= a.mc_mean_w <= max(pos.mc_mean_w, neg.mc_mean_w)
        assert (pos.mc_frac_modified == 0.0) == (spec != "aspo")
        assert np.isfinite(a.mc_frac_seq_any)


def test_monte_carlo_leaves_other_specs_unchanged():
    """Adding a sign spec draws its uniforms after the tokens: the other rows are bit-identical."""
    fam = get_family("gamma", 1.0, 0.1)
    a = co.simulate_corrections(fam, [5], "seq-tis:2", 300, seed=4)
    b = co.simulate_corrections(fam, [5], "seq-tis:2,topr", 300, seed=4)
    assert a.iloc[0].equals(b.iloc[0])


# ------------------------------------------------------------------------------- the shared rule
def test_opsm_is_trls_off_policy_mask():
    """apply_signed's mask is exactly where TRL's mirror drops the sequence, a mean at delta kept."""
    rng = np.random.default_rng(0)
    B, T, delta = 64, 6, 0.05
    new = rng.normal(-1.0, 0.3, (B, T))
    sampling = new + rng.normal(0.0, 0.08, (B, T))
    sampling[0] = new[0] + delta  # a mean exactly at delta (in float64 the difference may round)
    adv = rng.choice([-1.0, 0.0, 1.0], size=(B, 1))
    keep = trl.get_off_policy_mask(adv, new, sampling, np.ones((B, T)), delta)[:, 0]
    log_p = (new - sampling).sum(axis=1)
    w, masked = co.apply_signed(co.parse(f"opsm:{delta}"), log_p, T, adv[:, 0] >= 0)
    mean = (sampling - new).mean(axis=1)
    assert np.array_equal(~masked, (adv[:, 0] >= 0) | (mean <= delta))
    assert masked.any()
    assert np.array_equal(keep == 1.0, co.opsm_keep(adv[:, 0], (sampling - new).sum(axis=1) / T, delta))
    assert np.allclose(w, np.where(masked, 0.0, np.exp(log_p)))


def test_topr_weights():
    """TOPR: 1 for A >= 0, min(P_T, 1) for A < 0, modified only where a negative P_T > 1."""
    w, mod = co.apply_signed(
        co.parse("topr"), np.array([-0.5, 0.5, 0.5, 0.0]), 3, [False, False, True, False]
    )
    assert np.allclose(w, [math.exp(-0.5), 1.0, 1.0, 1.0])
    assert mod.tolist() == [False, True, False, False]


def test_aspo_weights_at_their_bounds():
    """ASPO: 1/r kept on [1/C, 1 + EH] (C below, 0 above), r on [1 - EL, C] (0 below, C above)."""
    c = co.parse("aspo:0.2:0.25:3")
    l3, eps = math.log(3.0), 1e-12
    y = np.array([-l3 - eps, -l3, 0.0, math.log1p(0.25), math.log1p(0.25) + eps])
    w, mod = co.apply_signed(c, y, None, np.ones(y.size, dtype=bool))
    assert np.allclose(w, [3.0, 3.0, 1.0, 1 / 1.25, 0.0], rtol=1e-12)
    assert mod.tolist() == [True, False, False, False, True]
    y = np.array([math.log(0.8) - eps, math.log(0.8), 0.0, l3, l3 + eps])
    w, mod = co.apply_signed(c, y, None, np.zeros(y.size, dtype=bool))
    assert np.allclose(w, [0.0, 0.8, 1.0, 3.0, 3.0], rtol=1e-12)
    assert mod.tolist() == [True, False, False, False, True]
    rows, _ = co.apply_signed(c, np.array([[0.1, -0.1], [0.1, -0.1]]), None, [True, False])  # a sign per row
    assert np.allclose(rows, [[math.exp(-0.1), math.exp(0.1)], [math.exp(0.1), math.exp(-0.1)]])


def test_aspo_is_the_gradient_weight_of_its_loss():
    """ASPO's weight is -d(loss)/d(log pi) / A of its loss, by autograd.

    The loss as Archer2.0's ``compute_policy_loss_archer`` builds it
    (``verl/trainer/ppo/core_algos.py:555-580`` at ``b08d963``), one pair of widths for every token.
    """
    torch = pytest.importorskip("torch")
    el, eh, C = 0.2, 0.25, 3.0
    rng = np.random.default_rng(7)
    old = rng.normal(-1.0, 0.5, 4000)
    new = old + rng.normal(0.0, 0.8, old.size)
    adv = rng.choice([-1.5, -0.3, 0.4, 2.0], old.size)
    lp = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    A = torch.tensor(adv, dtype=torch.float64)
    ratio = torch.exp(torch.clamp(lp - torch.tensor(old, dtype=torch.float64), -20.0, 20.0))
    neg_c = torch.clamp(ratio, min=1 - el)
    pos_c = torch.clamp(ratio, max=1 + eh)
    neg_dual = torch.clamp(neg_c, max=C)
    pos_dual = torch.clamp(1 / pos_c, max=C)
    neg = torch.where(neg_c > neg_dual, -A * neg_dual.detach() * lp, -A * neg_c)
    pos = torch.where(
        1 / pos_c > pos_dual, -A * pos_dual.detach() * lp, -A * (pos_c / pos_c.detach()) / pos_c.detach()
    )
    torch.where(A < 0, neg, pos).sum().backward()
    weight = (-lp.grad / A).numpy()
    w, _ = co.apply_signed(co.parse(f"aspo:{el}:{eh}:{C}"), new - old, None, adv >= 0)
    assert np.allclose(w, weight, rtol=1e-12, atol=0.0)
    assert {0.0, C} <= set(np.round(w, 12))  # the draws reach both clips


# ------------------------------------------------------------------------------- data
def test_evaluate_by_sign_equals_a_plain_loop():
    """The rows of evaluate by sign equal the weights written out by hand; no advantages: ValueError."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 20, 300)
    off = np.concatenate([[0], np.cumsum(lengths)])
    log_r = rng.normal(0.0, 0.1, off[-1])
    adv = rng.normal(0.0, 1.0, 300)
    out = co.evaluate(log_r, off, "topr,opsm:0.02", advantages=adv).set_index("correction")
    log_p = np.add.reduceat(log_r, off[:-1])
    neg = adv < 0
    w = np.where(neg, np.minimum(np.exp(log_p), 1.0), 1.0)
    assert out.loc["topr"].mean_w == pytest.approx(w.mean(), rel=1e-12)
    assert out.loc["topr [A<0]"].mean_w == pytest.approx(w[neg].mean(), rel=1e-12)
    assert out.loc["topr [A<0]"].n_seq == neg.sum()
    masked = neg & (-log_p / lengths > 0.02)
    assert out.loc["opsm:0.02 [A<0]"].frac_modified == pytest.approx(masked[neg].mean(), rel=1e-12)
    assert out.loc["opsm:0.02"].bias == pytest.approx(
        np.where(masked, 0, np.exp(log_p)).mean() - np.exp(log_p).mean()
    )
    with pytest.raises(ValueError, match="advantage"):
        co.evaluate(log_r, off, "topr")
    with pytest.raises(ValueError, match="one value per sequence"):
        co.evaluate(log_r, off, "topr", advantages=adv[:-1])


def test_evaluate_predicts_by_sign():
    """On lognormal draws the prediction by sign is the theory's and lies inside every interval."""
    fam = get_family("lognormal", 1.0, 0.05)
    rng = np.random.default_rng(2)
    n, T = 4000, 8
    log_r = rng.normal(fam.mean_log, math.sqrt(fam.var_log), n * T)
    off = np.arange(0, n * T + 1, T)
    adv = rng.normal(0.0, 1.0, n)
    out = co.evaluate(log_r, off, "opsm:0.05", advantages=adv, predict=fam).set_index("correction")
    th = co.theory(fam, [T], "opsm:0.05").set_index("correction")
    assert out.loc["opsm:0.05 [A<0]"].pred_frac_modified == pytest.approx(
        th.loc["opsm:0.05 [A<0]"].frac_modified
    )
    assert out.pred_inside.all()


def test_evaluate_aspo_equals_a_plain_loop():
    """ASPO on data: each token takes its sequence's sign; the rows by sign equal a loop by hand."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 12, 200)
    off = np.concatenate([[0], np.cumsum(lengths)])
    log_r = rng.normal(-0.02, 0.3, off[-1])
    adv = rng.normal(0.0, 1.0, 200)
    out = co.evaluate(log_r, off, "aspo", advantages=adv).set_index("correction")
    pos = np.repeat(adv >= 0, lengths)
    r = np.exp(log_r)
    w = np.where(
        pos,
        np.where(r < 1 / 3, 3.0, np.where(r > 1.2, 0.0, 1 / r)),
        np.where(r < 0.8, 0.0, np.minimum(r, 3.0)),
    )
    mod = np.where(pos, (r < 1 / 3) | (r > 1.2), (r < 0.8) | (r > 3.0))
    assert out.loc["aspo"].mean_w == pytest.approx(w.mean(), rel=1e-12)
    assert out.loc["aspo [A<0]"].mean_w == pytest.approx(w[~pos].mean(), rel=1e-12)
    assert out.loc["aspo [A>=0]"].frac_modified == pytest.approx(mod[pos].mean(), rel=1e-12)
    assert out.loc["aspo [A<0]"].n_seq == (adv < 0).sum()
    assert out.loc["aspo"].bias == pytest.approx(w.mean() - r.mean(), rel=1e-12)
