"""NeMo-RL and prime-rl mirrors against cases computed by hand from their source."""

import math
import re

import numpy as np
import pytest

from variance_lab.frameworks import nemo_rl, prime_rl

# two sequences: 3 tokens and 2 tokens (the last position padding)
MASK = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
Y = np.array([[0.2, -0.8, 1.9], [0.01, -0.03, 0.0]])  # old - rollout (prev - generation)
ROLLOUT = np.array([[-1.0, -0.5, -2.5], [-0.2, -0.1, -9.0]])
OLD = np.where(MASK > 0, ROLLOUT + Y, 4.0)  # padding values that would show if read


# --------------------------------------------------------------------------------------
# NeMo-RL
# --------------------------------------------------------------------------------------
def test_nemo_token_mult_prob_error_and_tis():
    """token_mult_prob_error = mean e^|Delta| over 5 tokens; tis clamps to [0, 2]; is_oob_ratio 1/5.

    NeMo-RL divides by its float32 count plus 1e-8, which is the count: fl32(5 + 1e-8) = 5; the
    fraction is float32 (``token_oob_mask.float()``), 1/5 rounded to float32.
    """
    w, m = nemo_rl.clipped_pg_importance_weights(
        OLD, ROLLOUT, MASK, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0
    )
    y = Y[MASK > 0]
    assert m["token_mult_prob_error"] == pytest.approx(np.exp(np.abs(y)).sum() / 5, rel=1e-14)
    np.testing.assert_allclose(w[MASK > 0], np.minimum(np.exp(y), 2.0), rtol=1e-14)
    assert m["is_oob_ratio"] == float(np.float32(1) / np.float32(5)) != 1 / 5
    assert m["sampling_importance_ratio"] == pytest.approx(np.minimum(np.exp(y), 2.0).sum() / 5, rel=1e-14)


def test_nemo_seq_mask_tis_keeps_raw_token_weights():
    """seq-mask-tis [0.9, 1.1]: G = e^0.433 drops sequence 1, G = e^-0.01 keeps sequence 2 untruncated."""
    w, m = nemo_rl.clipped_pg_importance_weights(
        OLD,
        ROLLOUT,
        MASK,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=1.1,
        truncated_importance_sampling_ratio_min=0.9,
    )
    np.testing.assert_array_equal(w[0], 0.0)
    np.testing.assert_allclose(w[1, :2], np.exp(Y[1, :2]), rtol=1e-14)
    assert m["is_oob_ratio"] == 0.5


def test_nemo_sequence_level_overflow_gives_zero():
    """Sequence-level ratios: a log-ratio sum of 800 overflows, and NeMo-RL's nan_to_num makes it 0."""
    y = np.array([[400.0, 400.0], [0.1, 0.2]])
    w, m = nemo_rl.clipped_pg_importance_weights(
        y, np.zeros_like(y), np.ones_like(y), sequence_level_importance_ratios=True
    )
    np.testing.assert_allclose(w[:, 0], [0.0, math.exp(0.3)], rtol=1e-14)
    # micro-batches of one (the default): the mean weight, e^0.3 / 2 (fl32(2 + 1e-8) = 2)
    assert m["sampling_importance_ratio"] == pytest.approx(math.exp(0.3) / 2, rel=1e-14)


def test_nemo_sequence_level_ratio_as_nemo_logs_it():
    """Sequence-level sampling_importance_ratio: NeMo-RL's masked_mean broadcasts (b, 1) by (b,).

    Four rows of log-ratios 0.1, 0.2, 0.3, 0.4, the third masked (sample_mask 0, so its weight is
    e^0 = 1: NeMo-RL sums the log-ratios under token_mask * sample_mask), S = 3 valid.
    Each micro-batch logs sum_i w_i * S_mb / fl32(S + 1e-8) = ... / S, masked rows' weights included; the step
    sums them. Micro-batches of one give the mean NeMo-RL means, sum_i s_i w_i / S.
    """
    y = np.array([[0.1], [0.2], [0.3], [0.4]])
    w = np.exp([0.1, 0.2, 0.0, 0.4])
    s, S = np.array([1.0, 1.0, 0.0, 1.0]), 3

    def logged(size):
        _, m = nemo_rl.clipped_pg_importance_weights(
            y,
            np.zeros_like(y),
            np.ones_like(y),
            s,
            sequence_level_importance_ratios=True,
            micro_batch_size=size,
        )
        return m["sampling_importance_ratio"]

    assert logged(1) == pytest.approx((w[0] + w[1] + w[3]) / S, rel=1e-14)
    assert logged(2) == pytest.approx(((w[0] + w[1]) * 2 + (w[2] + w[3]) * 1) / S, rel=1e-14)
    assert logged(None) == logged(4) == pytest.approx(w.sum() * 3 / S, rel=1e-14)
    with pytest.raises(ValueError, match="micro_batch_size must be an integer >= 1, got 0"):
        logged(0)


def test_nemo_icepop_needs_a_minimum():
    """An icepop without truncated_importance_sampling_ratio_min: ValueError naming it."""
    with pytest.raises(ValueError, match="ratio_min"):
        nemo_rl.clipped_pg_importance_weights(
            OLD,
            ROLLOUT,
            MASK,
            truncated_importance_sampling_type="icepop",
            truncated_importance_sampling_ratio=5.0,
        )


def test_nemo_float32_weight_overflows_to_zero_above_88_7():
    """NeMo-RL's float32 exp overflows above log(float32 max) = 88.72; nan_to_num makes it 0."""
    y = np.array([[88.7, 88.75, 100.0]])
    w, _ = nemo_rl.clipped_pg_importance_weights(y, np.zeros_like(y), np.ones_like(y))
    np.testing.assert_array_equal(w[0, 1:], 0.0)
    assert w[0, 0] == pytest.approx(math.exp(88.7), rel=1e-14)
    seq = np.array([[44.0, 44.7], [44.0, 44.8]])  # sums 88.7 and 88.8
    w, _ = nemo_rl.clipped_pg_importance_weights(
        seq, np.zeros_like(seq), np.ones_like(seq), sequence_level_importance_ratios=True
    )
    assert w[0, 0] > 0
    assert w[1, 0] == 0.0


def test_nemo_seq_mask_tis_with_a_minimum_of_zero_or_below():
    """NeMo-RL accepts ratio_min <= 0 for seq-mask-tis: nothing is cut from below."""
    for low in (0.0, -1.0):
        w, _m = nemo_rl.clipped_pg_importance_weights(
            OLD,
            ROLLOUT,
            MASK,
            truncated_importance_sampling_type="seq-mask-tis",
            truncated_importance_sampling_ratio=1.1,
            truncated_importance_sampling_ratio_min=low,
        )
        np.testing.assert_array_equal(w[0], 0.0)  # G = e^0.433 > 1.1
        np.testing.assert_allclose(w[1, :2], np.exp(Y[1, :2]), rtol=1e-14)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"truncated_importance_sampling_ratio": 2.0}, "Invalid truncated importance sampling type: None"),
        ({"truncated_importance_sampling_type": "tis"}, "ratio should be positive, got None"),
        (
            {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 0.0},
            "ratio should be positive, got 0.0",
        ),
        (
            {
                "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_ratio_min": 3.0,
            },
            "ratio_min must be <= truncated_importance_sampling_ratio, got 3.0 > 2.0",
        ),
        (
            {
                "truncated_importance_sampling_type": "seq-mask-tis",
                "truncated_importance_sampling_ratio": 2.0,
                "truncated_importance_sampling_ratio_min": 0.5,
                "sequence_level_importance_ratios": True,
            },
            "incompatible with sequence_level_importance_ratios",
        ),
    ],
)
def test_nemo_refuses_what_nemo_refuses(options, reason):
    """Each configuration ClippedPGLossFn asserts against is a ValueError with NeMo-RL's reason."""
    with pytest.raises(ValueError, match=re.escape(reason)):
        nemo_rl.clipped_pg_importance_weights(OLD, ROLLOUT, MASK, **options)


# --------------------------------------------------------------------------------------
# prime-rl
# --------------------------------------------------------------------------------------
def test_prime_rl_mismatch_kl_is_k3():
    """mismatch_kl = e^y - y - 1 per token, 0 on padding."""
    _, r, kl = prime_rl.compute_importance_ratio_and_mismatch_kl(OLD, ROLLOUT, MASK)
    np.testing.assert_allclose(kl[MASK > 0], np.expm1(Y[MASK > 0]) - Y[MASK > 0], rtol=1e-9)
    assert kl[1, 2] == 0.0
    assert r[1, 2] == 0.0


def test_prime_rl_dppo_masks_on_probability_differences():
    """pi_t - pi_i = 0.30, 0.05, -0.25: positive advantage masks the first, non-positive the third."""
    trainer = np.log(np.array([[0.5, 0.9, 0.3]]))
    inference = np.log(np.array([[0.2, 0.85, 0.55]]))
    mask = np.ones((1, 3))
    keep, m = prime_rl.dppo_mask(trainer, inference, np.array([[1.0]]), mask)
    np.testing.assert_array_equal(keep, [[0.0, 1.0, 1.0]])
    third32 = float(np.float32(1) / np.float32(3))  # torch's int64 / int64 (loss.py:94-97): float32
    assert third32 != 1 / 3
    assert m["is_masked_high"] == third32
    assert m["is_masked_low"] == 0.0
    keep, m = prime_rl.dppo_mask(trainer, inference, np.array([[0.0]]), mask)  # zero advantage: the low side
    np.testing.assert_array_equal(keep, [[1.0, 1.0, 0.0]])
    assert m["is_masked"] == third32
    assert m["is_masked_low"] == 0.0  # neither sign: is_masked exceeds their sum
    assert m["is_masked_high"] == 0.0
    y = trainer[0, 2] - inference[0, 2]
    assert m["masked_mismatch_kl"] == pytest.approx(math.exp(y) - y - 1, rel=1e-12)


def test_prime_rl_metrics_are_means_over_samples():
    """default_loss_fn runs per sample: a 4-token and a 1-token sample weigh the same.

    Sample 0 (advantage +1): d = 0.30, 0, 0, 0, so one token masked; sample 1 (advantage +1): d = 0.
    Per sample is_masked = 1/4 and 0, logged mean 0.125 (pooled over tokens it would be 1/5);
    masked_advantage_positive = 1 and 0 (nothing masked in sample 1), logged mean 0.5 (pooled: 1).
    """
    p_t = np.array([[0.5, 0.4, 0.4, 0.4], [0.4, 0.0, 0.0, 0.0]])
    p_i = np.array([[0.2, 0.4, 0.4, 0.4], [0.4, 0.0, 0.0, 0.0]])
    mask = np.array([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    trainer = np.log(np.where(mask > 0, p_t, 1.0))
    inference = np.log(np.where(mask > 0, p_i, 1.0))
    _, m = prime_rl.dppo_mask(trainer, inference, np.array([[1.0], [1.0]]), mask)
    assert m["is_masked"] == 0.125
    assert m["masked_advantage_positive"] == 0.5
    _, rows = prime_rl.dppo_mask(trainer, inference, np.array([[1.0], [1.0]]), mask, per_sample=True)
    np.testing.assert_array_equal(rows["is_masked"], [0.25, 0.0])
    stats = prime_rl.tensor_stats(rows["is_masked"])
    assert stats == {
        "mean": 0.125,
        "median": 0.0,
        "std": pytest.approx(0.25 / math.sqrt(2)),
        "min": 0.0,
        "max": 0.25,
    }


def test_prime_rl_tensor_stats_as_torch_computes_them():
    """torch.median takes the lower middle value; torch.std divides by n - 1; no values: NaN."""
    stats = prime_rl.tensor_stats([4.0, 1.0, 3.0, 2.0])
    assert stats["median"] == 2.0
    assert stats["std"] == pytest.approx(math.sqrt(5 / 3), rel=1e-15)
    assert all(math.isnan(v) for v in prime_rl.tensor_stats([]).values())


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: prime_rl.dppo_mask(OLD, ROLLOUT, np.ones(2), MASK), r"\(2,\)"),
        (lambda: nemo_rl.clipped_pg_importance_weights(OLD, ROLLOUT, MASK * 2), "2.0"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """Bad bounds, types, shapes or masks: ValueError naming the value."""
    with pytest.raises(ValueError, match=needle):
        call()


def test_padded_round_trip():
    """padded() lays flat token values out as (B, T) with a mask, and refuses bad offsets."""
    from variance_lab.frameworks.batch import padded

    mask, a = padded([0, 2, 5, 6], np.arange(6.0))
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert a[mask > 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert a[mask == 0].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="offsets must be"):
        padded([1, 2], np.zeros(1))
    with pytest.raises(ValueError, match="expected"):
        padded([0, 2], np.zeros(3))
