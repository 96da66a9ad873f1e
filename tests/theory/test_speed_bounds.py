"""The bounds of "When Speed Kills Stability" beside the exact values: against mpmath and Monte Carlo.

The reference integrates |e^x - 1| against the normal density of log P_k with ``mpmath.quad`` at 40
digits (split at x = 0), sums it over the binomial law of a two-state mixture's counts, and writes
the bounds 2 T^2 Delta_max and (1 + chi2_max)^T - 1 out from the per-state divergences, with
Delta = (1/2) E|r - 1| and chi2 = E[r^2] - 1 integrated in mpmath too.
"""

import math

import mpmath as mp
import numpy as np
import pytest

from variance_lab import theory
from variance_lab.families import get_family
from variance_lab.theory import speed_bounds as sb

MIX = "0.98:-0.0005:0.001,0.02:-0.25:0.5"
REL = 1e-9


def _abs_dev(v):
    """E|X - 1| for log X ~ N(-v/2, v), by quadrature (0 for v = 0)."""
    if v == 0:
        return mp.mpf(0)
    m, s = -v / 2, mp.sqrt(v)
    f = lambda x: abs(mp.exp(x) - 1) * mp.npdf(x, m, s)  # noqa: E731
    return mp.quad(f, [m - 40 * s, 0, m + 40 * s])


def _ref_abs_dev(states, k):
    with mp.workdps(40):
        if len(states) == 1:
            return _abs_dev(k * mp.mpf(states[0][1]))
        (w1, v1), (_, v2) = ((mp.mpf(w), mp.mpf(v)) for w, v in states)
        return mp.fsum(
            mp.binomial(k, n) * w1**n * (1 - w1) ** (k - n) * _abs_dev(n * v1 + (k - n) * v2)
            for n in range(k + 1)
        )


def _states(spec):
    return [(1.0, math.log1p(spec))] if isinstance(spec, float) else [(0.98, 0.001), (0.02, 0.5)]


def _family(spec):
    if isinstance(spec, float):
        return get_family("lognormal", 1.0, spec)
    return get_family("lognormal-mixture", None, None, components=MIX)


@pytest.mark.parametrize("spec", [0.001, 0.1, 2.0, "mix"])
def test_prefix_abs_dev_against_mpmath(spec):
    """E|P_k - 1| to 1e-9 against quadrature (one state) and the binomial sum of quadratures (two)."""
    ks = [0, 1, 7, 40] if spec == "mix" else [0, 1, 10, 100, 1000]
    got = sb.prefix_abs_dev(_family(spec), ks)
    for k, g in zip(ks, got, strict=True):
        want = float(_ref_abs_dev(_states(spec), k))
        assert abs(g - want) <= REL * max(want, 1e-300), (spec, k, g, want)


def test_token_bias_is_the_sum_over_prefixes():
    """B_T = sum_{k<T} E|P_k - 1|, checked against the mpmath terms summed at 40 digits."""
    fam = _family(0.1)
    with mp.workdps(40):
        want = mp.fsum(_ref_abs_dev(_states(0.1), k) for k in range(25))
    assert sb.token_bias(fam, 25)[0] == pytest.approx(float(want), rel=REL)
    assert sb.token_bias(fam, [1])[0] == 0.0  # one token: the token-level ratio is the sequence's


@pytest.mark.parametrize("spec", [0.01, "mix"])
def test_bounds_against_mpmath(spec):
    """2 T^2 Delta_max and (1 + chi2_max)^T - 1 from the states' TV and chi^2, integrated in mpmath."""
    fam, T = _family(spec), [1, 10, 300]
    with mp.workdps(40):
        tv = max(_abs_dev(mp.mpf(v)) / 2 for _, v in _states(spec))
        chi2 = []
        for _, v in _states(spec):
            v = mp.mpf(v)
            f = lambda x, v=v: mp.exp(2 * x) * mp.npdf(x, -v / 2, mp.sqrt(v))  # noqa: E731
            chi2.append(mp.quad(f, [-v / 2 - 40 * mp.sqrt(v), -v / 2 + 40 * mp.sqrt(v)]) - 1)
        c = max(chi2)
        bias = [2 * t * t * tv for t in T]
        var = [(1 + c) ** t - 1 for t in T]
        log10_var = mp.log10((1 + c) ** 10**5 - 1)
    np.testing.assert_allclose(sb.token_bias_bound(fam, T), [float(b) for b in bias], rtol=REL)
    np.testing.assert_allclose(sb.seq_var_bound(fam, T), [float(x) for x in var], rtol=REL)
    assert sb.seq_var_bound(fam, 10**5, log10=True)[0] == pytest.approx(float(log10_var), rel=REL)


@pytest.mark.parametrize("spec", [0.001, 0.1, "mix"])
def test_the_bounds_hold_and_the_variance_bound_is_tight_for_one_state(spec):
    """B_T <= 2 T^2 Delta_max; Var(P_T) equals its bound for one state and lies far below it for two."""
    fam = _family(spec)
    frame = sb.bounds_frame(fam, [1, 2, 10, 100, 1000])
    assert list(frame.columns) == list(sb.BOUNDS_COLUMNS)
    assert (frame.token_bias <= frame.token_bias_bound).all()
    np.testing.assert_allclose(frame.var_P, theory.var_P(fam, frame["T"]), rtol=0)
    if spec == "mix":
        gap = frame.log10_var_P_bound - frame.log10_var_P
        assert gap.iloc[-1] > 200  # ((1 + chi2_max) / (1 + mean chi2))^1000
    else:
        np.testing.assert_allclose(frame.var_P, frame.var_P_bound, rtol=1e-12)


def test_mixture_abs_dev_against_monte_carlo():
    """E|P_k - 1| of the two-state mixture within 4 standard errors of direct draws."""
    rng = np.random.default_rng(11)
    k, n = 30, 200_000
    first = rng.random((n, k)) < 0.98
    v = np.where(first, 0.001, 0.5)
    log_p = (rng.standard_normal((n, k)) * np.sqrt(v) - v / 2).sum(axis=1)
    x = np.abs(np.exp(log_p) - 1)
    got = sb.prefix_abs_dev(_family("mix"), [k])[0]
    assert abs(x.mean() - got) <= 4 * x.std(ddof=1) / math.sqrt(n)


def test_crossover_is_where_the_noise_stays_above_the_bias():
    """At T* the sequence-level noise T sqrt(Var(P_T)/n) exceeds B_T from there on; at T* - 1 it does not."""
    fam = _family(0.01)
    out = sb.crossover(fam, [100, 1000], T_max=3000)
    t = np.arange(1, 3001)
    for key, noise, bias in (
        ("exact", t * np.sqrt(theory.var_P(fam, t)), sb.token_bias(fam, t)),
        ("bound", t * np.sqrt(sb.seq_var_bound(fam, t)), sb.token_bias_bound(fam, t)),
    ):
        for n, ts in zip(out["n"], out[key], strict=True):
            above = noise / math.sqrt(n) > bias
            k = int(ts)
            assert above[k - 1 :].all(), (key, n, k)
            assert not above[k - 2], (key, n, k)
    assert out["exact"][1] < out["bound"][1]  # one state: the loose bias bound delays the crossover
    mix = sb.crossover(_family("mix"), [1000], T_max=2000)
    assert mix["bound"][0] < mix["exact"][0]  # two states: the loose variance bound advances it


@pytest.mark.parametrize(
    "family",
    [
        get_family("lognormal", 1.1, 0.1),
        get_family("gamma", 1.0, 0.1),
        get_family("lognormal-mixture", None, None, components="0.9:0:0.02,0.1:-0.1:0.3"),
        get_family("lognormal-mixture", None, None, components="0.5:-0.005:0.01,0.3:-0.05:0.1,0.2:-0.1:0.2"),
    ],
)
def test_other_families_raise(family):
    """Mean-one lognormal states only (mu = 1; mixtures of at most two mean-one components)."""
    with pytest.raises(ValueError, match="mean-one"):
        sb.bounds_frame(family, [1, 10])
