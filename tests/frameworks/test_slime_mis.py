"""slime's mis.py mirror against mis.py itself and against cases computed by hand (THUDM/slime 624b824).

slime is not installable here (Megatron-LM, SGLang); mis.py needs only torch, and
``tools/slime_fixtures.py`` ran it to write ``tests/data/frameworks/slime.*``. The other expected
values are written out from the cited lines of ``examples/train_infer_mismatch_helper/mis.py``.
"""

import math

import numpy as np
import pytest

from variance_lab.frameworks import slime_mis

F32 = np.float32
E = math.exp

# two samples: 4 tokens, and 2 tokens then padding; y = log pi_train - log pi_rollout, all dyadic
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
TRAIN = np.array([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, 5.0, 5.0]])  # 5.0: padding, never read
Y = np.array([[0.5, -0.25, 1.0, -1.5], [0.125, 0.0, 0.0, 0.0]])
ROLLOUT = TRAIN - Y


def _mis(**kw):
    return slime_mis.compute_mis_weights(TRAIN, ROLLOUT, MASK, **kw)


def _mean2(a, b):
    return (a + b) / 2


def test_ppl_metrics_per_sample():
    """add_ppl_metrics (mis.py:383-451) on both samples, averaged per sample first."""
    _, keep, m = _mis(use_tis=False)
    mt, mr = (-1.625, -0.875), (-1.5625, -0.9375)  # the samples' mean log-probs: train, rollout
    assert m["mis_training_log_ppl"] == pytest.approx(_mean2(1.625, 0.875), rel=1e-15)
    assert m["mis_training_ppl"] == pytest.approx(_mean2(E(1.625), E(0.875)), rel=1e-15)
    assert m["mis_rollout_log_ppl"] == pytest.approx(_mean2(1.5625, 0.9375), rel=1e-15)
    assert m["mis_rollout_ppl"] == pytest.approx(_mean2(E(1.5625), E(0.9375)), rel=1e-15)
    assert m["mis_kl"] == pytest.approx(_mean2(0.0625, -0.0625), abs=1e-16)
    assert m["mis_log_ppl_diff"] == pytest.approx(_mean2(mr[0] - mt[0], mr[1] - mt[1]), abs=1e-16)
    assert m["mis_log_ppl_abs_diff"] == pytest.approx(0.0625, rel=1e-15)
    assert m["mis_ppl_ratio"] == pytest.approx(_mean2(E(0.0625), E(-0.0625)), rel=1e-15)
    k3 = [[E(y) - y - 1 for y in Y[0]], [E(y) - y - 1 for y in Y[1, :2]]]
    assert m["mis_k3_kl"] == pytest.approx(_mean2(sum(k3[0]) / 4, sum(k3[1]) / 2), rel=1e-14)
    chi2 = [sum(E(2 * y) for y in Y[0]) / 4 - 1, (E(0.25) + 1) / 2 - 1]
    assert m["mis_chi2_token"] == pytest.approx(_mean2(*chi2), rel=1e-14)
    assert m["mis_chi2_seq"] == pytest.approx(_mean2(E(-0.5) - 1, E(0.25) - 1), rel=1e-14)
    assert len(m) == 11  # without use_tis only these (mis.py:207-209), and no rejection
    np.testing.assert_array_equal(keep, MASK)
    assert _mis(use_tis=False, use_rs=True)[0] is None


def test_mis_yaml_defaults():
    """Truncate at 2, RS [0.5, 2] on tokens, veto 1e-4, batch normalisation over the tokens."""
    w, keep, m = _mis()
    before = [[E(y) for y in Y[0]], [E(0.125), 1.0]]
    after = [[E(0.5), E(-0.25), 2.0, E(-1.5)], [E(0.125), 1.0]]
    assert m["mis_tis_weight_before_bound"] == pytest.approx(_mean2(sum(before[0]) / 4, sum(before[1]) / 2))
    assert m["mis_tis_truncate_fraction"] == pytest.approx(_mean2(1 / 4, 0), rel=1e-15)
    after_mean = _mean2(sum(after[0]) / 4, sum(after[1]) / 2)
    assert m["mis_tis_weight_after_bound"] == pytest.approx(after_mean, rel=1e-15)
    assert m["mis_is_ratio_mean_after_tis_rs"] == pytest.approx(after_mean, rel=1e-15)
    # RS: e^1 > 2 and e^-1.5 < 0.5 leave the mask, reduced over the original masks
    assert m["mis_rs_mask_fraction_low"] == m["mis_rs_mask_fraction_high"] == pytest.approx(1 / 8, rel=1e-15)
    np.testing.assert_array_equal(keep, [[1, 1, 0, 0], [1, 1, 0, 0]])
    assert m["mis_rs_catastrophic_token_fraction"] == m["mis_rs_catastrophic_seq_fraction"] == 0.0
    # tis_batch_normalize at the token level: the mean over the 6 tokens of the bounded weights
    norm = (sum(after[0]) + sum(after[1])) / 6
    assert m["mis_batch_norm_factor"] == pytest.approx(norm, rel=1e-15)
    np.testing.assert_allclose(
        w, [[v / norm for v in after[0]], [after[1][0] / norm, 1 / norm, 0, 0]], rtol=1e-15
    )
    assert m["mis_is_ratio_mean_final"] == pytest.approx(after_mean / norm, rel=1e-14)
    assert m["mis_is_ratio_min_final"] == pytest.approx(_mean2(E(-1.5), 1.0) / norm, rel=1e-14)
    assert m["mis_is_ratio_max_final"] == pytest.approx(_mean2(2.0, E(0.125)) / norm, rel=1e-14)


def test_clip_mode_and_the_default_lower_bound():
    """Clip mode (mis.py:116-128) to [1/upper, upper] when tis_lower_bound is None; fractions low and high."""
    w, keep, m = _mis(
        tis_mode="clip", tis_lower_bound=None, tis_upper_bound=2.5, use_rs=False, tis_batch_normalize=False
    )
    np.testing.assert_allclose(w, [[E(0.5), E(-0.25), 2.5, 0.4], [E(0.125), 1.0, 0, 0]], rtol=1e-15)
    assert m["mis_tis_clip_fraction_low"] == pytest.approx(1 / 8, rel=1e-15)  # e^-1.5 = 0.22 < 0.4
    assert m["mis_tis_clip_fraction_high"] == pytest.approx(1 / 8, rel=1e-15)  # e^1 = 2.72 > 2.5
    np.testing.assert_array_equal(keep, MASK)


def test_mask_mode_keeps_the_weights_and_rejects_the_tokens():
    """Mask mode (mis.py:131-147): weights only zeroed at padding; the mask loses tokens outside [lo, hi]."""
    w, keep, m = _mis(tis_mode="mask", use_rs=False, tis_batch_normalize=False)
    np.testing.assert_allclose(w, [[E(y) for y in Y[0]], [E(0.125), 1.0, 0, 0]], rtol=1e-15)
    np.testing.assert_array_equal(keep, [[1, 1, 0, 0], [1, 1, 0, 0]])
    assert (
        m["mis_tis_mask_fraction_low"] == m["mis_tis_mask_fraction_high"] == pytest.approx(1 / 8, rel=1e-15)
    )
    assert "mis_tis_truncate_fraction" not in m
    assert "mis_batch_norm_factor" not in m


@pytest.mark.parametrize("tis_mode", ["truncate", "clip", "mask"])
def test_bounds_compare_the_float32_weight_both_kept(tis_mode):
    """A float32 log-ratio whose float32 e^y is exactly 2 (0.5) is kept; one float32 ulp beyond is not."""

    def exp32(x):
        return float(F32(math.exp(float(F32(x)))))

    at_hi = float(F32(math.log(2.0)))
    above_hi = float(np.nextafter(F32(at_hi), F32(1)))
    while exp32(above_hi) == 2.0:
        at_hi, above_hi = above_hi, float(np.nextafter(F32(above_hi), F32(1)))
    at_lo = float(F32(math.log(0.5)))
    below_lo = float(np.nextafter(F32(at_lo), F32(-1)))
    while exp32(below_lo) == 0.5:
        at_lo, below_lo = below_lo, float(np.nextafter(F32(below_lo), F32(-1)))
    assert exp32(at_hi) == 2.0
    assert exp32(at_lo) == 0.5
    assert E(at_hi) > 2.0
    assert E(at_lo) < 0.5
    y = np.array([[at_hi, above_hi, at_lo, below_lo]])
    w, keep, m = slime_mis.compute_mis_weights(
        y, np.zeros_like(y), np.ones_like(y), tis_mode=tis_mode, use_rs=False, tis_batch_normalize=False
    )
    if tis_mode == "truncate":
        assert m["mis_tis_truncate_fraction"] == 1 / 4  # only above_hi: > 2
        np.testing.assert_allclose(w[0], [E(at_hi), 2.0, E(at_lo), E(below_lo)], rtol=1e-15)
    else:
        assert m[f"mis_tis_{tis_mode}_fraction_high"] == m[f"mis_tis_{tis_mode}_fraction_low"] == 1 / 4
        clipped = [E(at_hi), 2.0, E(at_lo), 0.5] if tis_mode == "clip" else list(np.exp(y[0]))
        np.testing.assert_allclose(w[0], clipped, rtol=1e-15)
        np.testing.assert_array_equal(keep[0], [1, 1, 1, 1] if tis_mode == "clip" else [1, 0, 1, 0])


def test_sequence_and_geometric_levels_with_the_safety_bound():
    """sequence: e^(sum y) clamped to +-20 (mis.py:188-223): a sum of 25 gives e^20, truncated to 2."""
    y = np.array([[0.5, -0.25, 1.0, -1.5], [12.5, 12.5, 0.0, 0.0]])
    kw = {"use_rs": False, "tis_batch_normalize": False}
    w, _, m = slime_mis.compute_mis_weights(TRAIN, TRAIN - y, MASK, tis_level="sequence", **kw)
    np.testing.assert_allclose(w, [[E(-0.25)] * 4, [2.0, 2.0, 0, 0]], rtol=1e-15)
    assert m["mis_tis_weight_before_bound"] == pytest.approx(_mean2(E(-0.25), E(20.0)), rel=1e-15)
    assert m["mis_tis_truncate_fraction"] == pytest.approx(0.5, rel=1e-15)
    assert m["mis_chi2_seq"] == pytest.approx(_mean2(E(-0.5) - 1, E(40.0) - 1), rel=1e-15)
    w, _, _ = slime_mis.compute_mis_weights(TRAIN, TRAIN - y, MASK, tis_level="geometric", **kw)
    np.testing.assert_allclose(w, [[E(-0.0625)] * 4, [2.0, 2.0, 0, 0]], rtol=1e-15)  # e^12.5 truncated


def test_rejection_at_another_level():
    """rs_level sequence under token TIS: weights e^-0.25 = 0.78 and e^0.125 = 1.13 against the RS band."""
    _, keep, m = _mis(rs_level="sequence", rs_lower_bound=0.75, tis_batch_normalize=False)
    np.testing.assert_array_equal(keep, MASK)  # token weights e^1, e^-1.5 are outside [0.75, 2]: not tested
    _, keep, m = _mis(rs_level="sequence", rs_lower_bound=0.8, tis_batch_normalize=False)
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0], [1, 1, 0, 0]])
    _, keep, m = _mis(rs_level="sequence", rs_lower_bound=0.9, rs_upper_bound=1.1, tis_batch_normalize=False)
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0], [0, 0, 0, 0]])
    assert m["mis_rs_mask_fraction_low"] == pytest.approx(0.5, rel=1e-15)  # e^-0.25 = 0.78 < 0.9
    assert m["mis_rs_mask_fraction_high"] == pytest.approx(0.5, rel=1e-15)  # e^0.125 = 1.13 > 1.1


def test_veto_drops_the_whole_sequence_inside_rejection_sampling():
    """rs_veto_threshold (mis.py:259-263): e^-1.5 = 0.22 < 0.3 vetoes sample 1 (mis_rs_catastrophic_*)."""
    _, keep, m = _mis(rs_veto_threshold=0.3, rs_lower_bound=0.1, rs_upper_bound=3.0)
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0], [1, 1, 0, 0]])
    assert m["mis_rs_catastrophic_token_fraction"] == pytest.approx(_mean2(1 / 4, 0), rel=1e-15)
    assert m["mis_rs_catastrophic_seq_fraction"] == pytest.approx(0.5, rel=1e-15)
    _, _, m = _mis(rs_veto_threshold=None)
    assert not any("catastrophic" in k for k in m)


def test_batch_normalisation_per_sequence_per_micro_batch_and_below_1e_8():
    """Sequence level: the mean of the samples' means, per micro-batch; a mean <= 1e-8 changes nothing."""
    kw = {"use_rs": False, "tis_level": "sequence"}
    w, _, m = _mis(**kw)
    norm = _mean2(E(-0.25), E(0.125))
    np.testing.assert_allclose(w[:, 0], [E(-0.25) / norm, E(0.125) / norm], rtol=1e-15)
    assert m["mis_batch_norm_factor"] == pytest.approx(norm, rel=1e-15)
    w, _, m = _mis(micro_batch_indices=[[1], [0]], **kw)
    np.testing.assert_allclose(w[:, 0], [1.0, 1.0], rtol=1e-15)
    assert m["mis_batch_norm_factor"] == pytest.approx(_mean2(E(-0.25), E(0.125)), rel=1e-15)
    y = np.full((1, 2), -30.0)  # clamped to -20: e^-20 = 2.1e-9 <= 1e-8
    w, _, m = slime_mis.compute_mis_weights(y, np.zeros_like(y), np.ones_like(y), use_rs=False)
    np.testing.assert_allclose(w[0], [E(-20.0)] * 2, rtol=1e-15)
    assert m["mis_batch_norm_factor"] == 1.0
    with pytest.raises(ValueError, match="Unsupported tis_level: geometric"):
        _mis(tis_level="geometric")


@pytest.mark.parametrize("dtype", [np.int32, bool])
def test_a_fully_masked_sample_and_the_per_token_mean(dtype):
    """An all-zero loss mask: its metrics add 0 over one more sample; per token it adds 1 to the count."""
    mask = np.array([[1, 1, 1, 1], [0, 0, 0, 0]]).astype(dtype)
    w, _keep, m = slime_mis.compute_mis_weights(TRAIN, ROLLOUT, mask, use_rs=False, tis_batch_normalize=False)
    assert m["mis_kl"] == pytest.approx(0.0625 / 2, rel=1e-15)
    assert m["mis_is_ratio_min_final"] == pytest.approx(E(-1.5) / 2, rel=1e-15)
    np.testing.assert_array_equal(w[1], 0.0)
    _, _, m = slime_mis.compute_mis_weights(
        TRAIN, ROLLOUT, mask, use_rs=False, tis_batch_normalize=False, calculate_per_token_loss=True
    )
    assert m["mis_kl"] == pytest.approx(0.25 / 5, rel=1e-15)
    assert m["mis_tis_truncate_fraction"] == pytest.approx(1 / 5, rel=1e-15)
    _, _, m = _mis(rollout_ids=np.array([3, 3]), use_rs=False, tis_batch_normalize=False)
    assert m["mis_kl"] == pytest.approx((0.25 - 0.125) / 6, rel=1e-15)  # one rollout of 6 tokens


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"tis_mode": "cap"}, "Unsupported tis_mode: 'cap'"),
        ({"tis_level": "seq"}, "Invalid level: 'seq'"),
        ({"rs_level": "sum"}, "Invalid level: 'sum'"),
        (
            {"tis_mode": "clip", "tis_lower_bound": 2.0},
            "slime asserts lower_bound < upper_bound, got 2.0, 2.0",
        ),
        ({"rs_lower_bound": 3.0}, "got 3.0, 2.0"),
        ({"tis_upper_bound": 0.0}, "bad tis_upper_bound 0.0"),
        ({"tis_upper_bound": None}, "bad tis_upper_bound None"),
        ({"rs_veto_threshold": -1.0}, "-1.0"),
        ({"micro_batch_indices": [[0]]}, r"\[\[0\]\]"),
        ({"rollout_ids": [1, 2, 3]}, r"\(3,\)"),
    ],
)
def test_refuses_what_slime_refuses(kw, needle):
    """The ValueErrors and assertions of slime, as ValueErrors naming the value."""
    with pytest.raises(ValueError, match=needle):
        _mis(**kw)


# --------------------------------------------------------------------------------------
# against slime's own mis.py (tests/data/frameworks/slime.*, tools/slime_fixtures.py)
# --------------------------------------------------------------------------------------
def test_compute_mis_weights_equals_slimes_own(slime_settings, slime_check):
    """120 random mis.yaml settings run by mis.py itself: metrics, weights and rejection masks."""
    rows = [r for r in slime_settings if r["kind"] == "mis"]
    assert len(rows) == 120
    seen = set()
    for r in rows:
        o = r["options"]
        w, keep, got = slime_mis.compute_mis_weights(
            r["old"],
            r["rollout"],
            r["mask"],
            **o,
            calculate_per_token_loss=r["per_token"],
            rollout_ids=r["rollout_ids"],
        )
        assert (w is None) == (r["weights32"] is None)
        slime_check(got, r, weights=w, keep=keep)
        seen |= {o["tis_level"], o["rs_level"], o["tis_mode"]} if o["use_tis"] else set()
        seen |= {"veto"} if o["use_rs"] and o["rs_veto_threshold"] is not None and o["use_tis"] else set()
        seen |= {"norm"} if o["tis_batch_normalize"] and o["use_tis"] else set()
    assert seen >= {"token", "sequence", "geometric", "truncate", "clip", "mask", "veto", "norm"}
