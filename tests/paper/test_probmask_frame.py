"""The prob_masks figure's data: the corrections API's theory, Monte Carlo and binned data, row for row."""

import numpy as np

from variance_lab import corrections as co
from variance_lab.families import get_family
from variance_lab.paper import catalog
from variance_lab.paper.probmask_frame import prob_mask_frame
from variance_lab.report.probmask_figure import PROB_MASK_COLUMNS


def test_rows_are_the_corrections_api():
    """Theory at fixed q, Monte Carlo at mc_q, and mask_by_bins of the shipped file, DPPO by sign."""
    params = {**catalog.default_params("prob_masks", quick=True), "q": [0.1, 0.5], "mc_q": [0.5], "n": 300}
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
    assert set(frame.panel) == {"q", "p", "entropy"}
