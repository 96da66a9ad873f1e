"""The prob_masks figure's data: the corrections API's theory, Monte Carlo and binned data, row for row."""

import math

import numpy as np
import pandas as pd
import pytest

from variance_lab import corrections as co
from variance_lab.families import get_family
from variance_lab.paper import catalog
from variance_lab.paper.probmask_frame import cppo_rows, prob_mask_frame
from variance_lab.report.probmask_figure import PROB_MASK_COLUMNS, cppo_series
from variance_lab.stats import z_value

#: Monte Carlo tolerance: K standard errors.
K = 4.0
BETA = co.TokenProbability(0.2, 0.6)


def test_rows_are_the_corrections_api():
    """Theory at fixed q, Monte Carlo at mc_q, and mask_by_bins of the shipped file, DPPO by sign."""
    params = {
        **catalog.default_params("prob_masks", quick=True),
        "q": [0.1, 0.5],
        "mc_q": [0.5],
        "n": 300,
        "cppo_sigma2": [0.5],
        "cppo_T": [1, 3],
        "cppo_mc_T": [3],
        "cppo_tokens": 3000,
    }
    frame = prob_mask_frame(params)
    assert list(frame.columns) == list(PROB_MASK_COLUMNS)
    fam = get_family("lognormal", 1.0, 0.1)
    th = co.theory(fam, [1], params["specs"], token_prob=co.TokenProbability.fixed(0.5)).set_index(
        "correction"
    )
    exact = frame[(frame.panel == "q") & (frame.method == "exact") & (frame.x == 0.5)].set_index("series")
    assert set(exact.index) == {"dppo-tv [A>0]", "dppo-tv [A<=0]", "dppo-kl [A>0]", "dppo-kl [A<=0]", "kpop"}
    for label, row in exact.iterrows():
        assert row.value == th.frac_modified[label]
    mc = co.simulate_corrections(fam, [1], params["specs"], 300, token_prob=co.TokenProbability.fixed(0.5))
    got = frame[(frame.panel == "q") & (frame.method == "monte_carlo")].set_index("series").value
    assert got["kpop"] == mc.set_index("correction").mc_frac_modified["kpop"]
    data = frame[frame.panel == "p"]
    assert set(data.series) == set(params["data_specs"])
    assert (data.method == "observed").all()
    assert np.all((data.lo <= data.value) & (data.value <= data.hi))
    assert set(frame.panel) == {"q", "p", "entropy", "T"}
    cppo = frame[frame.panel == "T"].reset_index(drop=True)
    pd.testing.assert_frame_equal(cppo, pd.DataFrame(cppo_rows(params)))
    assert cppo_rows({k: v for k, v in params.items() if not k.startswith("cppo")}) == []  # an older sidecar


def _cppo(spec, sigma2, T, mc_T, tokens):
    params = {"family": "lognormal", "mu": 1.0, "seed": 0, "ci": 0.95, "cppo_spec": spec,
              "cppo_sigma2": sigma2, "cppo_token_prob": [0.2, 0.6], "cppo_T": T, "cppo_mc_T": mc_T,
              "cppo_tokens": tokens}  # fmt: skip
    return pd.DataFrame(cppo_rows(params))


def _series(frame, kind, sigma2):
    return frame[frame.series == cppo_series(kind, sigma2)].set_index("x")


@pytest.fixture(scope="module")
def cppo_frame():
    """Panel (d) at sigma^2 = 0.2 (the budget binds early only) and 0.5 (for good), default spec."""
    return _cppo("cppo", [0.2, 0.5], [1, 2, 10, 30], [1, 3, 10, 30], 20_000)


def test_cppo_lines_are_the_exact_references(cppo_frame):
    """The threshold alone is cppo_positions' mean, DPPO-TV's theory at T = 1; the limit is cppo_limit's."""
    for s2 in (0.2, 0.5):
        fam = get_family("lognormal", 1.0, s2)
        alone = _series(cppo_frame, "threshold alone", s2)
        for T in (1, 2, 10, 30):
            pos = co.cppo_positions("cppo", fam, T, token_prob=BETA)
            assert alone.value[T] == pos.frac_threshold.mean()
        dppo = _series(cppo_frame, "dppo-tv:0.2", s2)
        f = co.theory(fam, [1], "dppo-tv:0.2", token_prob=BETA).set_index("correction").frac_modified
        assert set(dppo.value) == {f["dppo-tv:0.2"]}
        # statement 1 through two code paths: DPPO's quadrature against tv_tails at delta
        assert alone.value[1] == pytest.approx(f["dppo-tv:0.2"], rel=1e-12)
        assert np.all(np.diff(alone.value.to_numpy()) < 0)  # delta / w_t > delta relaxes later tokens
        limit = _series(cppo_frame, "limit", s2)
        assert list(limit.index) == [1, 30]
        assert set(limit.method) == {"limit"}
        assert set(limit.value) == {co.cppo_limit("cppo", fam, token_prob=BETA)["frac_limit"]}
    assert _series(cppo_frame, "limit", 0.5).value.iloc[0] == 0.5  # E[D] > beta: every token moving away


def test_cppo_monte_carlo_within_its_exact_bounds(cppo_frame):
    """Token 1 is DPPO-TV's within K predicted SE; at every T between the threshold alone and a = 0.5."""
    z = z_value(0.95)
    for s2 in (0.2, 0.5):
        mc = _series(cppo_frame, "cppo", s2)
        assert list(mc.index) == [1, 3, 10, 30]
        assert mc.reliable.all()
        assert np.allclose(mc.hi - mc.value, mc.value - mc.lo)  # a normal interval: its half width is z SE
        f = _series(cppo_frame, "dppo-tv:0.2", s2).value.iloc[0]
        se = math.sqrt(f * (1 - f) / 20_000)  # T = 1: 20,000 one-token sequences
        assert abs(mc.value[1] - f) <= K * se
        fam = get_family("lognormal", 1.0, s2)
        for T in mc.index:
            se = (mc.hi[T] - mc.lo[T]) / (2 * z)
            alone = co.cppo_positions("cppo", fam, int(T), token_prob=BETA).frac_threshold.mean()
            assert mc.value[T] >= alone - K * se
            assert mc.value[T] <= 0.5 + K * se
    binds = _series(cppo_frame, "cppo", 0.5)
    alone = _series(cppo_frame, "threshold alone", 0.5)
    se = (binds.hi[30] - binds.lo[30]) / (2 * z)
    assert (
        binds.value[30] > alone.value[30] + 10 * se
    )  # the budget: 0.135 (SE 0.0068) against 0.0152 at T = 30


def test_cppo_idle_budget_matches_the_threshold_alone_at_every_T():
    """With delta_b = 1 the budget never binds: the Monte Carlo equals the exact line within K predicted SE.

    The predicted SE of the mean per-sequence fraction over n sequences of length T: given the sign A
    the tokens are independent, masked with F_A(delta / w_t), so Var = E_A[sum_t F(1 - F)] / T^2 +
    p (1 - p) (m_+ - m_-)^2, m_A the mean of F_A over the positions (p = 0.5).
    """
    spec = "cppo:0.2:0.8:1"
    frame = _cppo(spec, [0.5], [1, 3, 10, 30], [1, 3, 10, 30], 20_000)
    mc, alone = _series(frame, spec, 0.5), _series(frame, "threshold alone", 0.5)
    fam = get_family("lognormal", 1.0, 0.5)
    for T in (1, 3, 10, 30):
        pos = co.cppo_positions(spec, fam, T, token_prob=BETA)
        up, down = pos.frac_threshold_pos.to_numpy(), pos.frac_threshold_neg.to_numpy()
        within = 0.5 * (np.sum(up * (1 - up)) + np.sum(down * (1 - down))) / T**2
        var = within + 0.25 * (up.mean() - down.mean()) ** 2
        n = math.ceil(20_000 / T)
        assert abs(mc.value[T] - alone.value[T]) <= K * math.sqrt(var / n), T
