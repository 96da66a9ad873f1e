"""Tests of variance_lab.frameworks.tokenlaw: token metrics under N(m, s^2), their fits, a clamp."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, optimize

from variance_lab.frameworks import logfiles, nemo_rl, verl
from variance_lab.frameworks import tokenlaw as tl

KINDS = ("k3", "chi2", "mult", "absdiff", "tis_abs")


def _reference(kind: str, m: float, s: float) -> float:
    """E[g(y)], y ~ N(m, s^2), by quadrature (independent of the closed forms)."""
    g = {
        "k3": lambda y: math.expm1(y) - y,
        "chi2": lambda y: math.expm1(2 * y),
        "mult": lambda y: math.exp(abs(y)),
        "absdiff": abs,
        "tis_abs": lambda y: abs(math.expm1(y)),
    }[kind]
    f = lambda z: g(m + s * z) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    return (
        integrate.quad(f, -12, 0, epsabs=1e-14, epsrel=1e-12)[0]
        + integrate.quad(f, 0, 12, epsabs=1e-14, epsrel=1e-12)[0]
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("m", "s"), [(-0.005, 0.1), (0.02, 0.05), (-0.5, 1.0)])
def test_token_metric_matches_quadrature(kind, m, s):
    """Token metric matches quadrature."""
    assert tl.token_metric(kind, m, s * s) == pytest.approx(_reference(kind, m, s), rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("kind", KINDS)
def test_fit_inverts_each_metric(kind):
    """Fit inverts each metric."""
    s2 = 0.0123
    value = tl.token_metric(kind, -s2 / 2, s2)
    law, _fits = tl.fit_law({"x": value}, {"x": kind})
    assert law.s2 == pytest.approx(s2, rel=1e-8)
    assert law.m == pytest.approx(-s2 / 2, rel=1e-8)
    # with a kl metric the mean is the logged one
    law2, _ = tl.fit_law({"x": tl.token_metric(kind, 0.01, s2), "kl": -0.01}, {"x": kind, "kl": "kl"})
    assert law2.m == 0.01
    assert law2.s2 == pytest.approx(s2, rel=1e-8)


def test_fit_from_verl_mirror_within_se():
    """The law fitted from verl's logged chi2_token of lognormal tokens is the true one, within 4 SE."""
    rng = np.random.default_rng(np.random.SeedSequence(11))
    m, s = 0.0, 0.1
    y = m + s * rng.standard_normal((256, 512))
    mask = np.ones_like(y)
    metrics = verl.compute_offpolicy_metrics(y - 1.0, np.full_like(y, -1.0), mask)
    law, _fits = tl.fit_law(
        {k: metrics[k] for k in ("kl", "chi2_token", "k3_kl")},
        {"kl": "kl", "chi2_token": "chi2", "k3_kl": "k3"},
    )
    # s2 = log1p(chi2)/2 - m: its SE from that of the sample mean of e^{2y}, by the delta method
    e2, e4 = math.exp(2 * m + 2 * s * s), math.exp(4 * m + 8 * s * s)
    se = math.sqrt((e4 - e2 * e2) / y.size) / e2 / 2
    assert abs(law.s2 - s * s) < 4 * se + 4 * abs(metrics["kl"] + m)  # m is fitted too
    assert law.source == "chi2_token"


def test_law_from_picks_the_metric():
    """law_from= sets the law from the named metric, and names a bad one."""
    kinds = {"a": "mult", "b": "k3"}
    values = {"a": 1.024, "b": 0.0027}
    assert tl.fit_law(values, kinds)[0].source == "b"
    assert tl.fit_law(values, kinds, law_from="a")[0].source == "a"
    with pytest.raises(ValueError, match="law_from 'c' is not a token metric"):
        tl.fit_law(values, kinds, law_from="c")
    with pytest.raises(ValueError, match="does not log it"):
        tl.fit_law({"b": 0.0027}, kinds, law_from="a")


def test_fit_rejects_impossible_values():
    """Fit rejects impossible values."""
    with pytest.raises(ValueError, match=r"token_mult_prob_error = 0\.9 is impossible"):
        tl.fit_law({"token_mult_prob_error": 0.9}, {"token_mult_prob_error": "mult"})
    with pytest.raises(ValueError, match="no token-level metric"):
        tl.fit_law({}, {"token_mult_prob_error": "mult"})


@pytest.mark.slow
def test_nemo_2269_sparse_law_reproduces():
    """45 % of tokens N(-v/2, v), the rest exact: token_mult_prob_error 1.024 and the logged values inside."""
    q = 0.45
    v = optimize.brentq(lambda v: (1 - q) + q * tl.token_metric("mult", -v / 2, v) - 1.024, 1e-8, 1.0)
    rng = np.random.default_rng(np.random.SeedSequence(1))
    sir, oob, mult = [], [], []
    for _ in range(40):
        B, T = 256, 10000
        L = rng.integers(8000, 10001, size=B)
        mask = (np.arange(T)[None, :] < L[:, None]).astype(float)
        hit = rng.random((B, T)) < q
        y = np.where(hit, -v / 2 + math.sqrt(v) * rng.standard_normal((B, T)), 0.0)
        gen = np.full((B, T), -1.0)
        _, met = nemo_rl.clipped_pg_importance_weights(
            gen + y,
            gen,
            mask,
            sequence_level_importance_ratios=True,
            truncated_importance_sampling_type="tis",
            truncated_importance_sampling_ratio=2.0,
            micro_batch_size=1,  # NeMo-RL logs the mean weight only for micro-batches of one
        )
        sir.append(met["sampling_importance_ratio"])
        oob.append(met["is_oob_ratio"])
        mult.append(met["token_mult_prob_error"])
    assert np.quantile(sir, 0.05) <= 0.0596 <= np.quantile(sir, 0.95)
    assert np.quantile(oob, 0.05) <= 0.011 <= np.quantile(oob, 0.95)
    assert abs(np.mean(mult) - 1.024) < 4 * np.std(mult, ddof=1) / math.sqrt(len(mult)) + 1e-6


def _clamped_reference(m: float, s: float, c: float) -> float:
    """E[e^(2 clip(y, -c, c))] - 1, y ~ N(m, s^2), by quadrature in pieces split at the clamp."""

    def f(y):
        return (
            math.exp(2 * min(max(y, -c), c))
            * math.exp(-((y - m) ** 2) / (2 * s * s))
            / (s * math.sqrt(2 * math.pi))
        )

    lo, hi = m - 40 * s, m + 40 * s
    cuts = [lo, *sorted(p for p in {-c, c, m, m + 2 * s * s} if lo < p < hi), hi]
    total = sum(
        integrate.quad(f, a, b, epsabs=0, epsrel=1e-13, limit=200)[0] for a, b in itertools.pairwise(cuts)
    )
    return total - 1.0


@pytest.mark.parametrize(
    ("m", "s2"),
    [(-0.005, 0.01), (-10.0, 20.0), (20.5, 0.11), (0.0, 40.0), (-20.0, 40.0), (25.0, 4.0), (19.0, 0.0)],
)
def test_clamped_chi2_matches_quadrature(m, s2):
    """chi2_token of verl under its clamp at +-20, against quadrature: bites or not, either side, s = 0."""
    got = tl.token_metric("chi2", m, s2, clamp=verl.SAFETY_BOUND)
    want = math.expm1(2 * min(max(m, -20.0), 20.0)) if s2 == 0 else _clamped_reference(m, math.sqrt(s2), 20.0)
    assert got == pytest.approx(want, rel=1e-10)
    assert got <= math.expm1(40.0) * (1 + 1e-15)


def test_clamped_fit_inverts_and_matches_the_unclamped_where_the_clamp_does_not_bite():
    """Small laws: the clamped fit is the plain one; far laws: the fit inverts the clamped metric."""
    kinds, clamps = {"c": "chi2", "k": "kl"}, {"c": verl.SAFETY_BOUND}
    law, _ = tl.fit_law({"c": math.expm1(0.02)}, {"c": "chi2"}, clamps=clamps)
    assert law.s2 == tl.fit_law({"c": math.expm1(0.02)}, {"c": "chi2"})[0].s2
    for m, s2 in ((20.5, 0.11), (-3.0, 5.0), (2.0, 8.0)):
        value = tl.token_metric("chi2", m, s2, clamp=20.0)
        law, _ = tl.fit_law({"c": value, "k": -m}, kinds, clamps=clamps)
        assert law.m == m
        assert law.s2 == pytest.approx(s2, rel=1e-8)


def test_extreme_chi2_falls_back_to_the_next_metric_with_a_note():
    """chi2_token = 2.2e17 without kl: no law N(-s^2/2, s^2) under the clamp gives it; k3 sets the law."""
    kinds = logfiles.TOKEN_METRICS["verl"]
    clamps = logfiles.TOKEN_CLAMP["verl"]
    values = {"rollout_corr/chi2_token": 2.2e17, "rollout_corr/k3_kl": 0.004}
    law, fits = tl.fit_law(values, kinds, clamps=clamps)
    assert law.source == "rollout_corr/k3_kl"
    assert list(fits) == ["rollout_corr/k3_kl"]
    (note,) = law.notes
    assert note.startswith("rollout_corr/chi2_token = 2.2e+17: no token law N(-s^2/2, s^2) with s^2 <= 1e4")
    assert "under the framework's clamp of log-ratios at +-20" in note
    assert "e^40 - 1 = 2.354e+17" in note
    with pytest.raises(ValueError, match="no token law N"):
        tl.fit_law({"rollout_corr/chi2_token": 2.2e17}, kinds, clamps=clamps)
    above = {"rollout_corr/chi2_token": 2.4e17, "rollout_corr/kl": 21.0}  # above the ceiling: no law at all
    law, _ = tl.fit_law(above, kinds, clamps=clamps)
    assert law.source == "rollout_corr/kl"
    assert law.notes[0].startswith("rollout_corr/chi2_token = 2.4e+17: no token law N(-21, s^2)")
