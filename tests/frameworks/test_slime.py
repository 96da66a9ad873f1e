"""slime's loss-side mirror against slime's own functions and cases computed by hand (THUDM/slime 624b824).

slime is not installable here (Megatron-LM, SGLang). Its functions run with torch alone wrote
``tests/data/frameworks/slime.*`` (``tools/slime_fixtures.py``); the other expected values are
written out from the cited lines, with float32 where slime computes in float32.
"""

import math

import numpy as np
import pytest

from variance_lab.frameworks import batch, slime

F32 = np.float32

# mis.py:54-64, metrics_append's docstring: token values of three samples of lengths 2, 5, 1
DOC_VALUES = np.array([[0.1, 0.2, 9, 9, 9], [0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 9, 9, 9, 9]])
DOC_MASK = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])


def _f32_step(x, direction):
    """Return the next float32 after ``x`` towards ``direction``, as a Python float."""
    return float(np.nextafter(F32(x), F32(direction)))


def _exp32(x):
    """e^x of a float32 input, rounded to float32 (torch's float32 exp, correctly rounded)."""
    return float(F32(math.exp(float(F32(x)))))


def _float32_band(bound):
    """Return the float32 log-ratios whose float32 e^x is ``bound``: (below, lowest, highest, above)."""
    lo = hi = float(F32(math.log(bound)))
    while _exp32(_f32_step(hi, 1)) == bound:
        hi = _f32_step(hi, 1)
    while _exp32(_f32_step(lo, -1)) == bound:
        lo = _f32_step(lo, -1)
    assert _exp32(lo) == _exp32(hi) == bound
    return _f32_step(lo, -1), lo, hi, _f32_step(hi, 1)


def test_float32_helpers():
    """log(1e-4) in float32 as torch takes it; e^x overflows float32 between 88.72283 and 88.72284."""
    assert batch.log_float32(1e-4) == F32(-9.21034049987793)
    assert batch.exp_float32(88.72283) < math.inf
    assert batch.exp_float32(88.72284) == math.inf
    np.testing.assert_array_equal(batch.exp64([88.72284, 1.0]), [math.inf, math.e])


# --------------------------------------------------------------------------------------
# the logged mean: per sample (rollout) or per token
# --------------------------------------------------------------------------------------
def test_the_mean_of_slimes_own_docstring_example():
    """mis.py:61-74: 0.35 per sample first, 0.3 with calculate_per_token_loss; 8/3 for sequence values."""
    assert slime.sample_mean(DOC_VALUES, DOC_MASK) == pytest.approx(0.35, rel=1e-15)
    per_token = slime.sample_mean(DOC_VALUES, DOC_MASK, calculate_per_token_loss=True)
    assert per_token == pytest.approx(2.4 / 8, rel=1e-15)
    seq = np.array([[2, 2, 0, 0, 0], [5, 5, 5, 5, 5], [1, 1, 0, 0, 0]], dtype=float)  # mis.py:66-74
    mask = (seq > 0).astype(int)
    assert slime.sample_mean(seq, mask) == pytest.approx(8 / 3, rel=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, bool])
def test_a_fully_masked_sample_counts_one_rollout_and_one_token(dtype):
    """A removed sample (loss mask all 0): a rollout with mean 0; + 1 to num_tokens (loss.py:1317)."""
    values = np.array([[0.1, 0.2, np.nan], [9.0, 9.0, 9.0]])
    mask = np.array([[1, 1, 0], [0, 0, 0]]).astype(dtype)
    assert slime.sample_mean(values, mask) == pytest.approx((0.15 + 0.0) / 2, rel=1e-15)
    assert slime.sample_mean(values, mask, calculate_per_token_loss=True) == pytest.approx(0.3 / 3, rel=1e-15)


def test_rollout_ids_pool_the_samples_of_one_rollout():
    """rollout_mask_sums (rollout.py:695-700): samples 0 and 1 one rollout of 7 tokens, over 2 rollouts."""
    ids = np.array([4, 4, 1])
    want = ((0.3 + 1.5) / 7 + 0.6) / 2
    assert slime.sample_mean(DOC_VALUES, DOC_MASK, rollout_ids=ids) == pytest.approx(want, rel=1e-15)
    # --n-samples-per-prompt samples are distinct rollouts: distinct ids give the per-sample mean
    assert slime.sample_mean(DOC_VALUES, DOC_MASK, rollout_ids=np.array([0, 1, 2])) == pytest.approx(
        0.35, rel=1e-15
    )
    # sum_of_token ignores the rollout denominators
    got = slime.sample_mean(DOC_VALUES, DOC_MASK, rollout_ids=ids, calculate_per_token_loss=True)
    assert got == pytest.approx(0.3, rel=1e-15)
    # a rollout whose samples are all masked still counts in the step's rollout count
    mask = DOC_MASK.copy()
    mask[2] = 0
    assert slime.sample_mean(DOC_VALUES, mask, rollout_ids=ids) == pytest.approx(
        (1.8 / 7 + 0.0) / 2, rel=1e-15
    )


def test_a_fraction_of_flags_is_slimes_float32_sum_of_quotients():
    """Flags (bool/int, as slime's ``.int()``): fl32 count / fl32 rollout count per sample, summed in float32.

    Samples of 3, 7 and 11 loss-mask tokens with 1, 1 and 1 flags (a flag outside the mask not
    counted): slime's logged fraction is ``float(fl32(fl32(q0 + q1) + q2)) / 3``, ``q_i`` the float32
    quotients (``cp_utils.py:73-81`` over float32 ``rollout_mask_sums``), not the float64 mean of
    1/3, 1/7, 1/11; with samples 0 and 1 one rollout (10 tokens) the quotients are over 10.
    """
    lengths = np.array([3, 7, 11])
    mask = (np.arange(12)[None, :] < lengths[:, None]).astype(np.int32)
    flags = np.zeros(mask.shape, dtype=bool)
    flags[0, 0] = flags[1, 6] = flags[2, 10] = flags[0, 11] = True  # [0, 11] lies outside the mask
    q = [F32(1) / F32(n) for n in (3, 7, 11)]
    want = float(F32(F32(q[0] + q[1]) + q[2])) / 3
    assert want != (1 / 3 + 1 / 7 + 1 / 11) / 3
    assert slime.sample_mean(flags, mask) == want
    assert slime.sample_mean(flags.astype(np.int32), mask) == want
    assert slime.sample_mean(flags.astype(float), mask) == pytest.approx(want, rel=1e-7)  # values: float64
    grouped = float(F32(F32(F32(1) / F32(10)) * 2 + q[2])) / 2
    assert slime.sample_mean(flags, mask, rollout_ids=np.array([5, 5, 9])) == grouped
    # by token: the two exact counts divided in Python floats
    assert slime.sample_mean(flags, mask, calculate_per_token_loss=True) == 3 / 21


def test_keep_mask_sums_kept_tokens_over_the_original_counts():
    """loss.py:1086-1092: the rebuilt reducer sums modified_response_masks' tokens, over rollout_mask_sums."""
    keep = DOC_MASK.copy()
    keep[1, 4] = 0  # 0.5 rejected
    got = slime.sample_mean(DOC_VALUES, DOC_MASK, keep_mask=keep)
    assert got == pytest.approx((0.15 + 1.0 / 5 + 0.6) / 3, rel=1e-15)
    got = slime.sample_mean(DOC_VALUES, DOC_MASK, keep_mask=keep, calculate_per_token_loss=True)
    assert got == pytest.approx(1.9 / 8, rel=1e-15)


# --------------------------------------------------------------------------------------
# vanilla_tis_function and icepop_function (loss.py:884-931)
# --------------------------------------------------------------------------------------
def test_tis_metrics_per_sample_and_per_token():
    """tis, tis_abs, tis_clipfrac (e^1.5 > 2 clamped) by sample then by token; the weights clamp to [0, 2]."""
    y = np.array([[0.5, -0.25, 1.5], [0.125, 0.0, 0.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    old = y - 1.0
    w, m = slime.tis_metrics(old, np.full_like(y, -1.0), mask)
    r = np.exp(y)
    assert m["tis"] == pytest.approx((r[0].mean() + r[1, 0]) / 2, rel=1e-14)
    assert m["tis_abs"] == pytest.approx((np.abs(r[0] - 1).mean() + abs(r[1, 0] - 1)) / 2, rel=1e-14)
    # each sample's count over its count in float32 (rollout_mask_sums is float32), summed in
    # float32, then over the 2 rollouts in Python: not the float64 (1/3 + 0) / 2
    third32 = float(np.float32(1) / np.float32(3))
    assert third32 != 1 / 3
    assert m["tis_clipfrac"] == third32 / 2
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx((0.75 + 0.125) / 2, rel=1e-15)
    np.testing.assert_allclose(w, [[r[0, 0], r[0, 1], 2.0], [r[1, 0], 0.0, 0.0]], rtol=1e-15)
    _, m = slime.tis_metrics(old, np.full_like(y, -1.0), mask, calculate_per_token_loss=True)
    assert m["tis"] == pytest.approx((r[0].sum() + r[1, 0]) / 4, rel=1e-14)
    assert m["tis_clipfrac"] == 1 / 4  # by token: the float64 quotient of two counts


@pytest.mark.parametrize("icepop", [False, True])
def test_tis_and_icepop_bounds_compare_the_float32_ratio(icepop):
    """[0.5, 2] in float32, both kept: a log-ratio whose float32 e^y is 2.0 (0.5) is kept, the next is not.

    The highest log-ratio at 2 has a float64 e^y above 2, the lowest at 0.5 one below 0.5: a float64
    comparison would clip them.
    """
    _, _, at_hi, above_hi = _float32_band(2.0)
    below_lo, at_lo, _, _ = _float32_band(0.5)
    assert math.exp(at_hi) > 2.0
    assert math.exp(at_lo) < 0.5
    assert _exp32(above_hi) > 2.0
    assert _exp32(below_lo) < 0.5
    y = np.array([[at_hi, above_hi, at_lo, below_lo]])
    w, m = slime.tis_metrics(y, np.zeros_like(y), np.ones_like(y), tis_clip_low=0.5, icepop=icepop)
    if icepop:
        np.testing.assert_allclose(w[0], [math.exp(at_hi), 0.0, math.exp(at_lo), 0.0], rtol=1e-15)
    else:
        np.testing.assert_allclose(w[0], [math.exp(at_hi), 2.0, math.exp(at_lo), 0.5], rtol=1e-15)
    assert m["tis_clipfrac"] == 0.5


def test_a_float32_ratio_overflows_to_inf():
    """e^89 overflows float32 (max 3.4e38, log 88.72): slime logs tis = inf; the TIS weight is the clip."""
    y = np.array([[89.0, 88.0]])
    w, m = slime.tis_metrics(y, np.zeros_like(y), np.ones_like(y))
    assert m["tis"] == math.inf
    assert m["tis_abs"] == math.inf
    assert m["tis_clipfrac"] == 1.0
    np.testing.assert_array_equal(w[0], [2.0, 2.0])
    _, m = slime.tis_metrics(y[:, 1:], np.zeros((1, 1)), np.ones((1, 1)))
    assert m["tis"] == pytest.approx(math.exp(88.0), rel=1e-15)  # 1.65e38: finite in float32


# --------------------------------------------------------------------------------------
# policy_loss_function's ois, ppo_kl, train_rollout_logprob_abs_diff
# --------------------------------------------------------------------------------------
OLD = np.array([[-1.0, -2.0, -3.0], [-0.5, -4.0, -4.0]])
NEW = OLD + np.array([[0.1, 0.5, 7.0], [0.2, 7.0, 7.0]])  # 7.0: masked, never read
ROLL = OLD - np.array([[0.25, -0.5, 0.0], [1.0, 0.0, 0.0]])
PMASK = np.array([[1, 1, 0], [1, 0, 0]])


def test_ois_per_token_and_gspo():
    """The ois metric is e^(-ppo_kl) (loss.py:1063); gspo's ppo_kl is the sequence mean (ppo_utils.py:114)."""
    m = slime.policy_metrics(OLD, ROLL, PMASK, NEW)
    assert m["ois"] == pytest.approx(((math.exp(0.1) + math.exp(0.5)) / 2 + math.exp(0.2)) / 2, rel=1e-14)
    assert m["ppo_kl"] == pytest.approx((-0.3 - 0.2) / 2, rel=1e-14)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx((0.375 + 1.0) / 2, rel=1e-15)
    g = slime.policy_metrics(OLD, ROLL, PMASK, NEW, advantage_estimator="gspo")
    assert g["ois"] == pytest.approx((math.exp(0.3) + math.exp(0.2)) / 2, rel=1e-14)
    assert g["ppo_kl"] == pytest.approx((-0.3 - 0.2) / 2, rel=1e-14)
    g = slime.policy_metrics(OLD, ROLL, PMASK, NEW, advantage_estimator="gspo", calculate_per_token_loss=True)
    assert g["ois"] == pytest.approx((2 * math.exp(0.3) + math.exp(0.2)) / 3, rel=1e-14)
    assert g["ppo_kl"] == pytest.approx((-0.6 - 0.2) / 3, rel=1e-14)
    _, t = slime.tis_metrics(
        OLD, ROLL, PMASK, NEW, advantage_estimator="gspo"
    )  # a --use-tis run logs the same
    assert t["ois"] == pytest.approx((math.exp(0.3) + math.exp(0.2)) / 2, rel=1e-14)


def test_gspo_with_a_fully_masked_sample():
    """compute_gspo_kl clamps the count to 1: ppo_kl 0 there, and the sample adds 0 over one more rollout."""
    mask = PMASK.copy()
    mask[1] = 0
    g = slime.policy_metrics(OLD, ROLL, mask, NEW, advantage_estimator="gspo")
    assert g["ois"] == pytest.approx(math.exp(0.3) / 2, rel=1e-14)
    assert g["ppo_kl"] == pytest.approx(-0.3 / 2, rel=1e-14)


def test_use_rollout_logprobs_and_reused_log_probs():
    """--use-rollout-logprobs: the old policy is the rollout's (loss.py:965, 1139); none: current (985)."""
    m = slime.policy_metrics(None, ROLL, PMASK, NEW, use_rollout_logprobs=True)
    d = (NEW - ROLL)[PMASK > 0]  # 0.35, 0.0; 1.2
    assert m["ois"] == pytest.approx(((math.exp(d[0]) + math.exp(d[1])) / 2 + math.exp(d[2])) / 2, rel=1e-14)
    assert m["ppo_kl"] == pytest.approx(-((d[0] + d[1]) / 2 + d[2]) / 2, rel=1e-14)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx(
        ((abs(d[0]) + abs(d[1])) / 2 + d[2]) / 2, rel=1e-14
    )
    m = slime.policy_metrics(None, ROLL, PMASK, NEW)
    assert (m["ois"], m["ppo_kl"]) == (1.0, 0.0)
    with pytest.raises(ValueError, match="pass log_probs"):
        slime.policy_metrics(OLD, ROLL, PMASK, use_rollout_logprobs=True)


def test_ppo_kl_and_abs_diff_sum_over_the_kept_tokens():
    """After mis.py's rejections: kept tokens summed, original counts divide; ois keeps the original masks."""
    keep = PMASK.copy()
    keep[0, 1] = 0
    m = slime.policy_metrics(OLD, ROLL, PMASK, NEW, keep_masks=keep)
    assert m["ppo_kl"] == pytest.approx((-0.1 / 2 - 0.2) / 2, rel=1e-14)
    assert m["train_rollout_logprob_abs_diff"] == pytest.approx((0.25 / 2 + 1.0) / 2, rel=1e-15)
    assert m["ois"] == slime.policy_metrics(OLD, ROLL, PMASK, NEW)["ois"]


# --------------------------------------------------------------------------------------
# calculate_veto_mask (mis.py:82-100)
# --------------------------------------------------------------------------------------
def test_veto_threshold_log_in_float32():
    """log(1e-4) in float32 (-9.2103405) lies below float64's (-9.2103404): a log-ratio at it is kept."""
    log32 = float(F32(math.log(float(F32(1e-4)))))
    assert log32 < math.log(1e-4)
    below = _f32_step(log32, -10)
    y = np.array([[log32, 0.0], [below, 0.0], [-30.0, 0.0]])
    mask = np.array([[1, 1], [1, 1], [0, 1]])  # row 3: the catastrophic token is outside the loss mask
    keep, m = slime.veto_mask(y, np.zeros_like(y), mask)
    np.testing.assert_array_equal(keep, [[1, 1], [0, 0], [1, 1]])
    assert set(m) == {"mis_rs_catastrophic_token_fraction", "mis_rs_catastrophic_seq_fraction"}
    assert m["mis_rs_catastrophic_token_fraction"] == (0 + 0.5 + 0) / 3
    assert m["mis_rs_catastrophic_seq_fraction"] == 1 / 3
    _, m = slime.veto_mask(y, np.zeros_like(y), mask, calculate_per_token_loss=True)
    assert m["mis_rs_catastrophic_token_fraction"] == pytest.approx(1 / 5, rel=1e-15)
    assert m["mis_rs_catastrophic_seq_fraction"] == pytest.approx(2 / 5, rel=1e-15)
    keep, m = slime.veto_mask(y, np.zeros_like(y), mask, None)
    assert m == {}
    assert keep.tolist() == [[1, 1]] * 3


# --------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: slime.tis_metrics(OLD, ROLL, PMASK, tis_clip=-1.0), "-1.0"),
        (lambda: slime.tis_metrics(OLD, ROLL, PMASK, tis_clip_low=3.0), "3.0"),
        (lambda: slime.policy_metrics(OLD, ROLL, PMASK, NEW, advantage_estimator="grpo2"), "'grpo2'"),
        (lambda: slime.sample_mean(OLD, PMASK, rollout_ids=np.array([0.5, 1.0])), "float64"),
        (lambda: slime.sample_mean(OLD, PMASK, rollout_ids=np.array([1, 2, 3])), r"\(3,\)"),
        (lambda: slime.sample_mean(OLD, PMASK, keep_mask=np.ones((2, 2))), r"\(2, 2\)"),
        (lambda: slime.veto_mask(OLD, ROLL, PMASK, 0.0), "0.0"),
        (lambda: slime.tis_metrics(OLD, ROLL, PMASK * 2), "2"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """Bad bounds, options, ids or masks: ValueError naming the value."""
    with pytest.raises(ValueError, match=needle):
        call()


# --------------------------------------------------------------------------------------
# against slime's own functions (tests/data/frameworks/slime.*, tools/slime_fixtures.py)
# --------------------------------------------------------------------------------------
def test_tis_and_policy_metrics_equal_slimes_own(slime_settings, slime_check):
    """80 settings run by slime's vanilla_tis_function / icepop_function, compute_gspo_kl and reducers.

    Inputs as slime holds them (float32 log-probs, int32 loss masks, grouped rollout ids, both
    means); every logged metric within slime's own float32 rounding, every fraction exact.
    """
    rows = [r for r in slime_settings if r["kind"] == "tis"]
    assert len(rows) == 80
    assert any(r["per_token"] for r in rows)
    assert any(not r["per_token"] for r in rows)
    assert any(len(set(r["rollout_ids"].tolist())) < len(r["rollout_ids"]) for r in rows)
    float64_counts_differ = 0
    for r in rows:
        o = r["options"]
        w, got = slime.tis_metrics(
            r["old"],
            r["rollout"],
            r["mask"],
            r["new"],
            tis_clip=o["tis_clip"],
            tis_clip_low=o["tis_clip_low"],
            icepop=o["icepop"],
            advantage_estimator=o["advantage_estimator"],
            calculate_per_token_loss=r["per_token"],
            rollout_ids=r["rollout_ids"],
        )
        slime_check(got, r, weights=w)
        float64_counts_differ += r["metrics64"]["tis_clipfrac"] != pytest.approx(
            r["metrics32"]["tis_clipfrac"]
        )
    assert (
        float64_counts_differ > 0
    )  # teeth: float32 ratios at a bound, which slime in float64 counts otherwise
