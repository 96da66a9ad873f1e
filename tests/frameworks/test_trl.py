"""variance_lab.frameworks.trl against TRL 1.16.0's own outputs, and its vLLM IS correction by hand.

The fixtures (``tests/data/frameworks/trl.*``) were written by ``tools/framework_fixtures.py``
running ``GRPOTrainer.get_off_policy_mask`` and ``GRPOTrainer.get_gamma_weights`` in float64 on
the batch the verl fixtures use. The vLLM correction is inline in TRL's trainer, so its cases are
computed by hand from TRL's source.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.frameworks import trl

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
META = json.loads((DATA / "trl.json").read_text())
RTOL = 1e-9


@pytest.fixture(scope="module")
def batch():
    """Return the fixture's arrays, inputs as float64."""
    with np.load(DATA / "trl.npz") as z:
        out = {k: z[k] for k in z.files}
    for k in ("old", "rollout", "update", "mask"):
        out[k] = out[k].astype(np.float64)
    return out


def test_fixtures_come_from_the_pinned_release():
    """The fixtures were written by TRL 1.16.0."""
    assert META["versions"]["trl"] == "1.16.0"


@pytest.mark.parametrize("threshold", META["off_policy_thresholds"])
def test_off_policy_mask_equals_trl(batch, threshold):
    """get_off_policy_mask equals TRL's (B, 1) mask exactly, and some sequences are dropped."""
    got = trl.get_off_policy_mask(
        batch["advantages"], batch["old"], batch["rollout"], batch["mask"], threshold
    )
    want = batch[f"off_policy_mask/{threshold!r}"]
    assert got.shape == want.shape == (batch["mask"].shape[0], 1)
    np.testing.assert_array_equal(got, want)
    if threshold == 0.0:
        assert 0 < want.sum() < want.size


@pytest.mark.parametrize("name", sorted(META["gamma_cases"]))
@pytest.mark.parametrize("with_is", [False, True])
def test_gamma_weights_equal_trl(batch, name, with_is):
    """get_gamma_weights equals TRL's VESPO weights to 1e-9 relative, with and without the IS ratio."""
    kwargs = META["gamma_cases"][name]
    rho = None
    if with_is:  # as the fixture script built it: token_truncate with TRL's cap 3
        rho = np.minimum(np.exp((batch["old"] - batch["rollout"]) * batch["mask"]), 3.0)
    got = trl.get_gamma_weights(batch["advantages"], batch["update"], batch["mask"], rho, **kwargs)
    want = batch[f"gamma/{name}/{with_is}"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-300)
    assert np.ptp(want) > 0.1


# --------------------------------------------------------------------------------------
# the vLLM importance-sampling correction, by hand from TRL's source
# --------------------------------------------------------------------------------------
OLD = np.array([[-1.0, -2.0, -0.5, 9.0], [-1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
MASK = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
Y = np.array([[0.5, 1.5, -2.0, 0.0], [0.1, 0.3, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # old - sampling
SAMPLING = np.where(MASK > 0, OLD - Y, -3.0)


def _run(mode, lo=None, hi=3.0):
    return trl.vllm_importance_sampling_correction(OLD, SAMPLING, MASK, mode, lo, hi)


def test_sequence_mask_is_the_default_and_uses_the_product():
    """sequence_mask, cap 3: P = e^0, e^0.4, e^0 (empty row); none above 3; metrics over the 3 rows."""
    ratio, m = trl.vllm_importance_sampling_correction(OLD, SAMPLING, MASK)
    np.testing.assert_allclose(ratio[:, 0], [1.0, math.exp(0.4), 1.0], rtol=1e-12)
    assert ratio.shape == (3, 1)
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx((2 + math.exp(0.4)) / 3, rel=1e-12)
    ratio, m = _run("sequence_mask", hi=1.2)  # e^0.4 = 1.49 > 1.2: masked to 0
    np.testing.assert_allclose(ratio[:, 0], [1.0, 0.0, 1.0])
    assert m["sampling/importance_sampling_ratio/min"] == 0.0


def test_token_modes_count_masked_tokens_as_zero():
    """token_mask zeroes e^1.5 and e^-2 (bounds [0.5, 3]); the metrics run over the 5 valid tokens."""
    ratio, m = _run("token_mask", lo=0.5, hi=3.0)
    kept = [math.exp(0.5), 0.0, 0.0, math.exp(0.1), math.exp(0.3)]
    np.testing.assert_allclose(ratio[MASK > 0], kept, rtol=1e-12)
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(sum(kept) / 5, rel=1e-12)
    assert m["sampling/importance_sampling_ratio/min"] == 0.0
    assert np.all(ratio[MASK == 0] == 1.0)  # padding: log-ratio 0, ratio 1
    ratio, _ = _run("token_truncate")
    np.testing.assert_allclose(ratio[0, :3], [math.exp(0.5), 3.0, math.exp(-2.0)], rtol=1e-12)
    ratio, _ = _run("token_truncate", lo=0.5, hi=None)
    np.testing.assert_allclose(ratio[0, :3], [math.exp(0.5), math.exp(1.5), 0.5], rtol=1e-12)
    ratio, _ = _run("sequence_truncate", hi=1.2)
    np.testing.assert_allclose(ratio[:, 0], [1.0, 1.2, 1.0], rtol=1e-12)


def test_logp_difference_skips_unscored_tokens():
    """A NaN sampling log-prob: ratio 1 for that token, left out of sampling_logp_difference."""
    sampling = SAMPLING.copy()
    sampling[0, 1] = np.nan
    ratio, m = trl.vllm_importance_sampling_correction(OLD, sampling, MASK, "token_truncate")
    assert ratio[0, 1] == 1.0
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(2.0)
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 2.0 + 0.1 + 0.3) / 4)


def test_gamma_weight_at_one_is_one_and_masked_tokens_cost_1e_minus_8():
    """phi(1) = 1; a token masked to 0 in the IS ratio multiplies w by 1e-8 (TRL's log clamp)."""
    adv = np.array([[1.0], [-1.0]])
    lr, mask = np.zeros((2, 3)), np.ones((2, 3))
    np.testing.assert_allclose(trl.get_gamma_weights(adv, lr, mask), [[1.0], [1.0]], rtol=1e-15)
    rho = np.ones((2, 3))
    rho[0, 2] = 0.0
    phi = trl.get_gamma_weights(adv, lr, mask, rho)
    w = 1e-8
    assert phi[0, 0] == pytest.approx(math.exp(3.0 + 2.0 * math.log(w) - 3.0 * w), rel=1e-12)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: _run("sequence"), "'sequence'"),
        (lambda: _run("token_mask", hi=-1.0), "-1.0"),
        (lambda: trl.get_off_policy_mask(np.zeros(3), OLD, SAMPLING, MASK, 0.1), r"\(3,\)"),
        (lambda: trl.get_off_policy_mask(np.zeros((3, 1)), OLD, SAMPLING, MASK, float("nan")), "nan"),
        (lambda: trl.get_gamma_weights(np.zeros((3, 1)), OLD, MASK, -np.ones((3, 4))), ">= 0"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """Bad modes, bounds and shapes: ValueError naming the value."""
    with pytest.raises(ValueError, match=needle):
        call()
