"""variance_lab.frameworks.verl against verl 0.9.1's own outputs, and its conventions by hand.

The fixtures (``tests/data/frameworks/verl.*``) were written by ``tools/framework_fixtures.py``
running verl's ``rollout_corr_helper`` in float64 on one ragged batch (lengths 4 to 800, holes in
the mask, an empty row, heavy-tailed log-ratios with |log r| = 3 spikes, padding filled with
values that would change every result if read).
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from variance_lab.frameworks import verl

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
META = json.loads((DATA / "verl.json").read_text())
RTOL, ATOL = 1e-9, 1e-12


@pytest.fixture(scope="module")
def batch():
    """Return the fixture's arrays."""
    with np.load(DATA / "verl.npz") as z:
        return {k: z[k] for k in z.files}


def _inputs(batch):
    return (
        batch["old"].astype(np.float64),
        batch["rollout"].astype(np.float64),
        batch["mask"].astype(np.float64),
    )


def test_fixtures_come_from_the_pinned_release():
    """The fixtures were written by verl 0.9.1, and they are small."""
    assert META["versions"]["verl"] == "0.9.1"
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 1_000_000


@pytest.mark.parametrize("case", sorted(c for c in META["cases"] if c != "offpolicy_no_rollout"))
def test_mirror_equals_verl(batch, case):
    """Weights, modified mask and every rollout_corr/ metric equal verl's to 1e-9 relative."""
    kwargs = META["cases"][case]["kwargs"]
    old, rollout, mask = _inputs(batch)
    weights, modified, metrics = verl.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, **kwargs
    )
    want = META["cases"][case]["metrics"]
    assert sorted(metrics) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(metrics[key], value, rtol=RTOL, atol=ATOL, err_msg=key)
    valid = mask > 0
    if f"{case}/weights" in batch:
        np.testing.assert_allclose(weights[valid], batch[f"{case}/weights"], rtol=RTOL, atol=ATOL)
        assert np.all(weights[~valid] == 0.0)
    else:
        assert weights is None
    want_mask = np.unpackbits(batch[f"{case}/mask"], count=int(valid.sum())).astype(bool)
    np.testing.assert_array_equal(modified[valid] > 0.5, want_mask)
    assert np.all(modified[~valid] == 0.0)


def test_offpolicy_metrics_without_rollout_log_probs(batch):
    """compute_offpolicy_metrics(old, None, mask) gives verl's two training-perplexity metrics."""
    old, _, mask = _inputs(batch)
    got = verl.compute_offpolicy_metrics(old, None, mask)
    want = META["cases"]["offpolicy_no_rollout"]["metrics"]
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, err_msg=key)


def test_the_fixtures_exercise_the_thresholds():
    """Every rejection option masks some but not all tokens, so the comparisons are not vacuous."""
    for case, entry in META["cases"].items():
        opts = entry["kwargs"].get("rollout_rs")
        if opts:
            frac = entry["metrics"]["rollout_corr/rollout_rs_masked_fraction"]
            assert 0.0 < frac < 1.0, case
    assert META["cases"]["is_token_tis"]["metrics"]["rollout_corr/rollout_is_ratio_fraction_high"] > 0


# --------------------------------------------------------------------------------------
# conventions, by hand
# --------------------------------------------------------------------------------------
def _one(y, lengths=None):
    y = np.atleast_2d(np.asarray(y, dtype=float))
    mask = np.ones_like(y)
    if lengths is not None:
        for i, n in enumerate(lengths):
            mask[i, n:] = 0.0
    return y, mask


def test_k1_bounds_act_inverted():
    """token_k1 with "0.9_1.5" keeps r in [1/1.5, 1/0.9], not [0.9, 1.5] (verl PR #6377)."""
    r = np.array([0.6, 0.7, 0.95, 1.05, 1.2, 1.4])
    y, mask = _one(np.log(r))
    kept, _ = verl.compute_rollout_rejection_mask(y, mask, "token_k1", "0.9_1.5")
    np.testing.assert_array_equal(kept[0], [0, 1, 1, 1, 0, 0])  # [0.667, 1.111]


def test_seq_k1_options_are_the_toolkits_sequence_masks():
    """seq_sum_k1 keeps P_T in [1/HI, 1/LO]; seq_mean_k1 keeps G_T there (Geo-RS)."""
    y, mask = _one(
        [[0.3, 0.3, 0.3, 0.0], [-0.2, -0.2, 0.0, 0.0], [0.05, 0.05, 0.05, 0.05]], lengths=[3, 2, 4]
    )
    # P = e^0.9 = 2.46, e^-0.4 = 0.67, e^0.2 = 1.22; G = e^0.3, e^-0.2, e^0.05
    kept, m = verl.compute_rollout_rejection_mask(y, mask, "seq_sum_k1", "0.5_1.25")  # P in [0.8, 2]
    np.testing.assert_array_equal(kept.max(axis=1), [0, 0, 1])
    assert m["rollout_rs_seq_sum_k1_seq_masked_fraction"] == pytest.approx(2 / 3)
    kept, _ = verl.compute_rollout_rejection_mask(y, mask, "seq_mean_k1", "0.9_1.25")  # G in [0.8, 1.111]
    np.testing.assert_array_equal(kept.max(axis=1), [0, 1, 1])


def test_safety_bound_caps_the_sequence_weight():
    """A sequence log-ratio sum of 30 gives the weight e^20 before truncation; rollout_is_max = e^20."""
    y, mask = _one([[15.0, 15.0], [0.0, 0.0]])
    w, m = verl.compute_rollout_correction_weights(y, mask, "sequence", 1e12)
    assert w[0, 0] == pytest.approx(math.exp(20.0), rel=1e-12)
    assert m["rollout_is_max"] == pytest.approx(math.exp(20.0), rel=1e-12)
    off = verl.compute_offpolicy_metrics(y, np.zeros_like(y), mask)
    assert off["chi2_seq"] == pytest.approx((math.exp(40.0) + 1.0) / 2 - 1.0, rel=1e-12)


def test_ess_is_over_tokens():
    """Sequence weights (2, 1) on sequences of 3 and 1 tokens: ESS over 4 tokens, not 2 sequences."""
    y, mask = _one([[math.log(2.0), 0.0, 0.0], [0.0, 0.0, 0.0]], lengths=[3, 1])
    _, m = verl.compute_rollout_correction_weights(y, mask, "sequence", 10.0)
    w = np.array([2.0, 2.0, 2.0, 1.0])
    mean = w.sum() / (4 + 1e-8)
    norm = w / (mean + 1e-8)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.0 / (np.sum(norm**2) / (4 + 1e-8)), rel=1e-12)
    assert m["rollout_is_eff_sample_size"] != pytest.approx(w[[0, 3]].mean() ** 2 / np.mean(w[[0, 3]] ** 2))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rollout_is": "geometric"}, "'geometric'"),
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, "'2_1'"),
        ({"rollout_is": "token", "rollout_is_threshold": "x"}, "'x'"),
        ({"rollout_rs": "sequence", "rollout_rs_threshold": 2.0}, "'sequence'"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}, "'0.5_2'"),
        ({"rollout_rs": "token_k2"}, "rollout_rs_threshold"),
        ({"rollout_rs": "token_k2,seq_max_k3", "rollout_rs_threshold": "1,2,3"}, re.escape("'1,2,3'")),
        ({"rollout_is": "token", "rollout_is_threshold": "3_4"}, "every importance weight is 0 .* '3_4'"),
    ],
)
def test_bad_settings_name_the_value(kwargs, needle):
    """Bad settings: a ValueError naming the bad value (verl's pre-#4544 names included)."""
    y, mask = _one([[0.1, -0.1]])
    with pytest.raises(ValueError, match=needle):
        verl.compute_rollout_correction_and_rejection_mask(y, np.zeros_like(y), mask, **kwargs)


def test_bad_arrays_name_the_value():
    """Mismatched shapes, a non-0/1 mask, NaN inside the mask or no valid token: ValueError."""
    y, mask = _one([[0.1, -0.1]])
    with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
        verl.compute_offpolicy_metrics(np.zeros((1, 3)), None, mask)
    with pytest.raises(ValueError, match=r"0\.5"):
        verl.compute_offpolicy_metrics(y, None, mask * 0.5)
    with pytest.raises(ValueError, match="nan"):
        verl.compute_offpolicy_metrics(np.array([[np.nan, 0.0]]), None, mask)
    with pytest.raises(ValueError, match="at least one valid token"):
        verl.compute_offpolicy_metrics(y, None, mask * 0)
    padded = np.array([[0.1, np.nan]])
    assert verl.compute_offpolicy_metrics(padded, None, np.array([[1.0, 0.0]]))[
        "training_log_ppl"
    ] == pytest.approx(-0.1 / (1 + 1e-8))
