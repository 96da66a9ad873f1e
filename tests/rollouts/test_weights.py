"""GSPO weights: identities against math.fsum / mpmath references, clipping, batch building, bad data."""

import math
import re

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.weights import (
    GMPO_RANGE,
    GSPO_RANGE,
    gspo_token_weights,
    segment_sums,
    sequence_weights,
)

REL = 1e-12


def _pair(d, rng, scale=3.0):
    """Return new and old log-probs (both <= 0) with the given token log-ratios d = new - old."""
    base = rng.exponential(scale, d.size)
    new = -base + np.minimum(d, 0.0)
    old = -base - np.maximum(d, 0.0)
    return new, old


def _split_bound(n: int, batch_max: float, longest: int) -> float:
    """Worst error of summing n remainders of segment_sums' split (each below 2**(g-1)) in any order.

    g is the split's granularity, set by the batch's largest |value| and its longest segment (as the
    code sets it); n remainders summed one by one err by at most n * eps * (n * 2**(g-1)).
    """
    g = math.frexp(batch_max)[1] + int(longest).bit_length() - 52
    return n * n * 2.0**-53 * 2.0 ** (g - 1)


def _reference(new, old, batch_max=None, longest=None):
    """Exact sums by math.fsum; s and the perplexities by mpmath from them (independent of the code).

    ``batch_max`` and ``longest``: the batch's largest |log-prob| and longest segment (2T values,
    interleaved), which set segment_sums' split; default this sequence's own.
    """
    T = len(new)
    log_P = math.fsum(list(new) + [-v for v in old])  # exact sum of the 2T values, rounded once
    s_new, s_old = math.fsum(new), math.fsum(old)
    with mpmath.workdps(40):
        s = mpmath.exp(mpmath.mpf(log_P) / T)
        ppl_old = mpmath.exp(-mpmath.mpf(s_old) / T)
        ppl_new = mpmath.exp(-mpmath.mpf(s_new) / T)
        dH = -mpmath.mpf(s_old) / T + mpmath.mpf(s_new) / T  # H_old - H_new
    own = max(max(abs(v) for v in new), max(abs(v) for v in old))
    eps2_bound = _split_bound(
        2 * T, own if batch_max is None else batch_max, 2 * T if longest is None else longest
    )
    return {
        "log_P": log_P,
        "s": s,
        "ppl_old": ppl_old,
        "ppl_new": ppl_new,
        "delta_H": dH,
        "eps2_bound": eps2_bound,
    }


def _rel(a, b):
    a, b = mpmath.mpf(float(a)), mpmath.mpf(b)
    return float(abs(a - b) / abs(b))


def _check_identities(w, i, ref):
    # segment_sums' bound: one rounding of the result plus the remainders' error (_split_bound);
    # the second term matters only when the terms cancel to (nearly) zero.
    assert abs(w.log_P[i] - ref["log_P"]) <= 4 * math.ulp(ref["log_P"]) + ref["eps2_bound"] + 1e-300
    assert _rel(w.s[i], ref["s"]) < REL
    assert _rel(w.ppl_ratio[i], ref["s"]) < REL
    assert _rel(math.exp(w.delta_H[i]), ref["s"]) < REL
    assert abs(w.delta_H[i] - float(ref["delta_H"])) < REL * max(1.0, abs(float(ref["delta_H"])))
    if ref["ppl_old"] < 1e300 and ref["ppl_new"] < 1e300:
        assert _rel(w.ppl_old[i], ref["ppl_old"]) < REL
        assert _rel(w.ppl_new[i], ref["ppl_new"]) < REL
        assert _rel(w.ppl_old[i] / w.ppl_new[i], ref["s"]) < REL


# --------------------------------------------------------------------------------------
# identities
# --------------------------------------------------------------------------------------
def test_identities_random_ragged_batch():
    """On a random ragged batch every weight satisfies its identities against an fsum reference."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 400, size=60)
    d = [rng.normal(0.0, 0.5, n) for n in lengths]
    pairs = [_pair(x, rng) for x in d]
    batch = TokenBatch.from_ragged([p[0] for p in pairs], [p[1] for p in pairs])
    w = sequence_weights(batch)
    for i, (new, old) in enumerate(pairs):
        _check_identities(w, i, _reference(new, old))


_token = st.tuples(st.floats(-50, 50), st.floats(0, 200))  # (log-ratio, extra depth below 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_token, min_size=1, max_size=40), min_size=1, max_size=6))
def test_identities_property(seqs):
    """For any small ragged batch every weight satisfies its identities (hypothesis)."""
    new = [np.array([-b + min(d, 0.0) for d, b in seq]) for seq in seqs]
    old = [np.array([-b - max(d, 0.0) for d, b in seq]) for seq in seqs]
    w = sequence_weights(TokenBatch.from_ragged(new, old))
    batch_max = max(float(np.max(np.abs(np.concatenate([a, b])))) for a, b in zip(new, old, strict=True))
    longest = 2 * max(len(a) for a in new)
    for i in range(len(seqs)):
        _check_identities(w, i, _reference(new[i], old[i], batch_max, longest))


def _adversarial(rng):
    """Sequences of length 1 to 1e5 with token log-ratios up to +-50 and heavy cancellation."""
    n = 100_000
    yield rng.uniform(-50, 50, n)  # |log P| of order 1e4, s far from 1
    yield np.full(n, 50.0)  # log P = 5e6
    yield np.full(n, -50.0)  # log P = -5e6
    alt = np.where(np.arange(n) % 2 == 0, 50.0, -50.0) + rng.normal(0, 1e-9, n)
    yield alt  # log P near 0 from +-50 terms: cancellation
    yield np.concatenate([np.full(n // 2, 50.0), np.full(n // 2, -50.0 + 1e-13)])
    for m in (1, 2, 3, 7, 1000):
        yield rng.uniform(-50, 50, m)


def test_identities_adversarial_lengths_and_ratios():
    """Extreme lengths and log-ratios keep log P_T finite and every identity exact."""
    rng = np.random.default_rng(2)
    seqs = list(_adversarial(rng))
    pairs = [_pair(x, rng, scale=20.0) for x in seqs]
    w = sequence_weights(TokenBatch.from_ragged([p[0] for p in pairs], [p[1] for p in pairs]))
    assert np.all(np.isfinite(w.log_P))
    assert w.log_P[1] == pytest.approx(5e6, rel=1e-15)
    for i, (new, old) in enumerate(pairs):
        _check_identities(w, i, _reference(new, old))


def test_identities_padded_with_holes():
    """Padded sequences with holes read only masked-in tokens; identities and lengths hold."""
    rng = np.random.default_rng(3)
    n, L = 6, 3000
    d = rng.uniform(-50, 50, (n, L))
    new, old = _pair(d.ravel(), rng, scale=10.0)
    new, old = new.reshape(n, L), old.reshape(n, L)
    mask = rng.random((n, L)) < 0.6
    mask[:, 0] = True
    mask[0, 1:] = False  # a one-token sequence
    mask[1, 100:2000] = False  # a long hole
    new[~mask] = np.nan  # garbage under the mask is never read
    w = sequence_weights(TokenBatch.from_padded(new, old, mask))
    for i in range(n):
        _check_identities(w, i, _reference(new[i][mask[i]], old[i][mask[i]]))
    assert w.length.tolist() == mask.sum(axis=1).tolist()


def test_huge_perplexities_overflow_to_inf_without_warning():
    """Perplexities beyond float64 are inf without a warning; their ratio s stays exact."""
    new = np.full(10, -800.0)
    old = np.full(10, -790.0)
    w = sequence_weights(TokenBatch.from_ragged([new], [old]))
    assert w.log_ppl_old[0] == pytest.approx(790.0)
    assert w.ppl_old[0] == math.inf
    assert w.ppl_new[0] == math.inf
    assert w.ppl_ratio[0] == pytest.approx(math.exp(-10.0), rel=1e-14)
    assert w.s[0] == pytest.approx(math.exp(-10.0), rel=1e-14)


def test_segment_sums_match_fsum_under_cancellation():
    """Segment sums are within 2 ulp of fsum even under heavy cancellation."""
    rng = np.random.default_rng(4)
    lengths = np.array([1, 2, 5, 1000, 50_000])
    x = rng.normal(0, 1, lengths.sum()) * 10.0 ** rng.integers(-8, 9, lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    got = segment_sums(x, offsets)
    for i in range(lengths.size):
        seg = x[offsets[i] : offsets[i + 1]]
        ref = math.fsum(seg)
        assert abs(got[i] - ref) <= 2 * math.ulp(ref) + 1e-15 * math.ulp(np.max(np.abs(seg)))
    # exact cancellation: 1e16 + 1 - 1e16 is 1, which a naive float sum loses
    assert segment_sums(np.array([1e16, 1.0, -1e16]), np.array([0, 3]))[0] == 1.0


_summand = st.floats(-1e6, 1e6, allow_nan=False).flatmap(
    lambda v: st.sampled_from([v, -v, v * 1e-9, v * 1e9])
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(_summand, min_size=1, max_size=30), min_size=1, max_size=8))
def test_segment_sums_property_arbitrary_cuts(segments):
    """Cut anywhere, with cancellation across 18 decades: every sum is fsum's within the bound.

    The bound is the docstring's: one rounding of the result plus the error of the pairwise
    sum of the low parts, each below 2^(g-1) with 2^g ~ max|x| L 2^-52 (L the longest segment).
    """
    x = np.array([v for seg in segments for v in seg])
    lengths = np.array([len(seg) for seg in segments])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    got = segment_sums(x, offsets)
    big, longest = float(np.max(np.abs(x))), int(lengths.max())
    for i, seg in enumerate(segments):
        ref = math.fsum(seg)
        assert abs(got[i] - ref) <= 2 * math.ulp(ref) + 4 * longest**3 * 2.0**-104 * big


def test_segment_sums_rejects_empty_segments():
    """An empty segment raises ValueError."""
    with pytest.raises(ValueError, match="non-empty"):
        segment_sums(np.array([1.0]), np.array([0, 0, 1]))


# --------------------------------------------------------------------------------------
# GSPO-token, GMPO, clipping
# --------------------------------------------------------------------------------------
def test_gspo_token_weight_value_is_s_on_every_token():
    """GSPO's token weight is the sequence's s on every one of its tokens."""
    rng = np.random.default_rng(5)
    pairs = [_pair(rng.normal(0, 0.3, n), rng) for n in (1, 4, 9)]
    batch = TokenBatch.from_ragged([p[0] for p in pairs], [p[1] for p in pairs])
    tok = gspo_token_weights(batch)
    s = sequence_weights(batch).s
    assert tok.tolist() == np.repeat(s, [1, 4, 9]).tolist()


def test_gmpo_weight_against_reference():
    """GMPO's weight is exp of the mean clipped log-ratio; without clipping it is GSPO's s."""
    rng = np.random.default_rng(6)
    d = rng.normal(0, 1.0, 500)
    new, old = _pair(d, rng)
    w = sequence_weights(TokenBatch.from_ragged([new], [old]))
    lo, hi = math.log(GMPO_RANGE[0]), math.log(GMPO_RANGE[1])
    clipped = [min(max(a - b, lo), hi) for a, b in zip(new, old, strict=True)]
    assert w.gmpo_weight[0] == pytest.approx(math.exp(math.fsum(clipped) / 500), rel=1e-13)
    # without clipping it is GSPO's s
    w_wide = sequence_weights(TokenBatch.from_ragged([new], [old]), gmpo_range=(1e-300, 1e300))
    assert w_wide.gmpo_weight[0] == pytest.approx(w_wide.s[0], rel=1e-13)


def test_clip_fractions_by_hand():
    """PPO and GSPO clip counts and fractions on a hand-made batch, for two sets of ranges."""
    # ratios 1, 1.3 (out), 0.7 (out), 1.15 (in): s = 1.0465**(1/4) = 1.011 (out) / 1.0002 three times (in)
    d1 = np.log([1.0, 1.3, 0.7, 1.15])
    d2 = np.full(3, math.log(1.0002))
    batch = TokenBatch.from_ragged([d1 - 1.0, d2 - 1.0], [np.full(4, -1.0), np.full(3, -1.0)])
    w = sequence_weights(batch)
    assert w.n_token_clipped.tolist() == [2, 0]
    assert w.token_clip_frac.tolist() == [0.5, 0.0]
    assert w.ppo_clip_frac == pytest.approx(2 / 7)
    assert math.exp(math.fsum(d1) / 4) > GSPO_RANGE[1]
    assert w.clipped_gspo.tolist() == [True, False]
    assert w.gspo_clip_frac == pytest.approx(0.5)
    narrow = sequence_weights(batch, gspo_range=(0.9999, 1.0001), ppo_range=(0.5, 2.0))
    assert narrow.clipped_gspo.tolist() == [True, True]
    assert narrow.ppo_clip_frac == 0.0


@pytest.mark.parametrize("bad", [(1.1, 1.2), (0.0, 1.2), (0.8, 0.9), (0.8,), "ab", (0.8, math.inf)])
def test_clip_range_validation(bad):
    """A PPO clip range that is not two finite numbers with 0 < low < 1 < high raises ValueError."""
    batch = TokenBatch.from_ragged([[-1.0]], [[-1.0]])
    with pytest.raises(ValueError, match="ppo_range"):
        sequence_weights(batch, ppo_range=bad)


def test_to_frame_columns_and_values():
    """``to_frame`` has the documented columns and the values of a hand-made sequence."""
    batch = TokenBatch.from_ragged([[-1.0, -2.0]], [[-1.5, -1.5]], ids=["only"])
    df = sequence_weights(batch).to_frame()
    assert list(df.columns) == [
        "id",
        "length",
        "log_P",
        "log10_P",
        "log_G",
        "s",
        "log_ppl_old",
        "log_ppl_new",
        "ppl_old",
        "ppl_new",
        "ppl_ratio",
        "delta_H",
        "log_gmpo",
        "gmpo_weight",
        "clipped_gspo",
        "token_clip_frac",
    ]
    row = df.iloc[0]
    assert row["id"] == "only"
    assert row["length"] == 2
    assert row["log_P"] == 0.0
    assert row["s"] == 1.0
    assert row["ppl_old"] == pytest.approx(math.exp(1.5))
    assert row["ppl_new"] == pytest.approx(math.exp(1.5))


# --------------------------------------------------------------------------------------
# building batches
# --------------------------------------------------------------------------------------
def test_padded_ragged_and_flat_agree():
    """Padded, ragged and flat constructors give the same batch, positions included."""
    rng = np.random.default_rng(7)
    new, old = _pair(rng.normal(0, 0.2, 20), rng)
    new, old = new.reshape(4, 5), old.reshape(4, 5)
    mask = np.array([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=bool)
    a = TokenBatch.from_padded(new, old, mask, ids=list("abcd"))
    b = TokenBatch.from_ragged(list(new), list(old), list(mask.astype(int)), ids=list("abcd"))
    c = TokenBatch.from_flat(new.ravel(), old.ravel(), [5] * 4, mask=mask.ravel(), ids=list("abcd"))
    for other in (b, c):
        for name in ("logp", "old_logp", "offsets", "positions", "ids"):
            assert np.array_equal(getattr(a, name), getattr(other, name)), name
    assert a.lengths.tolist() == [3, 1, 5, 2]
    assert a.positions.tolist() == [0, 1, 3, 0, 0, 1, 2, 3, 4, 1, 2]
    assert len(a) == 4
    assert a.n_tokens == 11
    assert a.n_dropped == 0
    np.testing.assert_array_equal(a.sequence(3)[0], new[3, 1:3])


def test_batch_is_read_only_and_select_keeps_order():
    """Batch arrays are read-only, and ``select`` keeps the order of the indices it is given."""
    batch = TokenBatch.from_ragged([[-1.0], [-2.0, -3.0], [-4.0]], [[-1.0], [-2.0, -2.0], [-4.0]])
    with pytest.raises(ValueError, match="read-only"):
        batch.logp[0] = 0.0
    sub = batch.select([2, 1])
    assert sub.ids.tolist() == [2, 1]
    assert sub.logp.tolist() == [-4.0, -2.0, -3.0]
    assert sub.select(np.array([False, True])).ids.tolist() == [1]


def test_zero_log_prob_is_allowed():
    """A log-probability of exactly 0 (or -0) is accepted."""
    batch = TokenBatch.from_ragged([[0.0, -1.0]], [[-0.0, 0.0]])
    assert sequence_weights(batch).log_P[0] == -1.0


# --------------------------------------------------------------------------------------
# bad data: one test per kind, each error names the sequence and the problem
# --------------------------------------------------------------------------------------
GOOD = ([-1.0, -2.0], [-1.5, -1.5])
BAD_CASES = {
    "nan_logp": (([-1.0, math.nan], [-1.0, -1.0]), None, r"logp\[1\] is NaN"),
    "nan_old": (([-1.0, -1.0], [math.nan, -1.0]), None, r"old_logp\[0\] is NaN"),
    "posinf": (([-1.0, math.inf], [-1.0, -1.0]), None, r"logp\[1\] is \+inf"),
    "neginf": (
        ([-1.0, -1.0], [-math.inf, -1.0]),
        None,
        r"old_logp\[0\] is -inf \(probability 0 under the old",
    ),
    "positive": (([-1.0, 1e-300], [-1.0, -1.0]), None, r"logp\[1\] = 1e-300 is > 0"),
    "mismatch": (
        ([-1.0, -1.0, -1.0], [-1.0, -1.0]),
        None,
        "length mismatch: logp has 3 values, old_logp has 2",
    ),
    "mask_mismatch": (([-1.0, -1.0], [-1.0, -1.0]), [1, 1, 1], "length mismatch.*mask has 3"),
    "empty": (([], []), None, "empty sequence"),
    "all_masked": (([-1.0, -1.0], [-1.0, -1.0]), [0, 0], r"no counted token \(mask is all 0\)"),
    "mask_value": (([-1.0, -1.0], [-1.0, -1.0]), [1, 2], r"mask\[1\] = 2.0 is not 0 or 1"),
}


@pytest.mark.parametrize("kind", list(BAD_CASES))
def test_bad_sequence_raises_naming_it(kind):
    """Each kind of bad sequence raises ValueError naming its id and index."""
    (new, old), mask, message = BAD_CASES[kind]
    masks = None if mask is None else [[1, 1], mask, [1, 1]]
    with pytest.raises(ValueError, match=rf"bad sequence id='b' \(index 1\): {message}"):
        TokenBatch.from_ragged([GOOD[0], new, GOOD[1]], [GOOD[1], old, GOOD[1]], masks, ids=["a", "b", "c"])


@pytest.mark.parametrize("kind", list(BAD_CASES))
def test_bad_sequence_dropped_and_reported(kind):
    """With ``on_bad='drop'`` each kind of bad sequence is dropped and reported with its reason."""
    (new, old), mask, message = BAD_CASES[kind]
    masks = None if mask is None else [[1, 1], mask, [1, 1]]
    batch = TokenBatch.from_ragged(
        [GOOD[0], new, GOOD[1]], [GOOD[1], old, GOOD[1]], masks, ids=["a", "b", "c"], on_bad="drop"
    )
    assert batch.ids.tolist() == ["a", "c"]
    assert batch.n_dropped == 1
    (dropped,) = batch.dropped
    assert dropped.index == 1
    assert dropped.id == "b"
    assert re.search(message, dropped.reason)


def test_bad_values_under_mask_zero_are_ignored():
    """NaN and infinite values under a zero mask are never read."""
    batch = TokenBatch.from_padded([[-1.0, math.nan, 5.0]], [[-1.0, -math.inf, math.inf]], [[1, 0, 0]])
    assert batch.logp.tolist() == [-1.0]


def test_first_bad_sequence_reported_with_count_of_the_rest():
    """The error names the first bad sequence and counts the others."""
    with pytest.raises(ValueError, match=r"index 0\): logp\[0\] is NaN; 2 more bad sequence\(s\)"):
        TokenBatch.from_ragged([[math.nan], [1.0], [-1.0], []], [[-1.0], [-1.0], [-1.0], []])


def test_everything_dropped_is_an_error():
    """Dropping every sequence raises ValueError."""
    with pytest.raises(ValueError, match=r"no valid sequence left \(2 dropped\)"):
        TokenBatch.from_ragged([[math.nan], [1.0]], [[-1.0], [-1.0]], on_bad="drop")


def test_several_problems_in_one_sequence_report_the_most_basic():
    """A sequence with several problems is reported for the first: logp before old_logp."""
    batch = TokenBatch.from_ragged([[math.nan, 1.0], [-1.0]], [[-1.0, math.nan], [-1.0]], on_bad="drop")
    assert batch.dropped[0].reason == "logp[0] is NaN"  # logp before old_logp, first token first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_bad": "skip"}, "on_bad must be one of"),
        ({"ids": ["a"]}, "ids must be a 1-D sequence of 2 ids"),
    ],
)
def test_batch_level_errors(kwargs, message):
    """An unknown on_bad and ids of the wrong length raise ValueError."""
    with pytest.raises(ValueError, match=message):
        TokenBatch.from_ragged([[-1.0], [-1.0]], [[-1.0], [-1.0]], **kwargs)


def test_padded_shape_errors():
    """Mismatched shapes, counts and non-numeric values raise ValueError naming the problem."""
    with pytest.raises(ValueError, match="2-D of one shape"):
        TokenBatch.from_padded(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="mask must have the shape"):
        TokenBatch.from_padded(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="old_logp has 1 sequences"):
        TokenBatch.from_ragged([[-1.0], [-1.0]], [[-1.0]])
    with pytest.raises(ValueError, match="must hold numbers"):
        TokenBatch.from_ragged([["x"]], [[-1.0]])
