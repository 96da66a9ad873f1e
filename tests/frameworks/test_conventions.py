"""The conventions table is the mirrors' own rule objects, and each masked mean is what it says."""

import math

import numpy as np
import pytest

from variance_lab.frameworks import areal, batch, nemo_rl, openrlhf, prime_rl, slime, trl, verl
from variance_lab.frameworks.batch import MeanRule
from variance_lab.frameworks.conventions import CONVENTIONS, conventions_table
from variance_lab.frameworks.logfiles import FRAMEWORKS
from variance_lab.ratios import BoundRule

MIRRORS = {
    "verl": verl,
    "trl": trl,
    "nemo-rl": nemo_rl,
    "prime-rl": prime_rl,
    "slime": slime,
    "openrlhf": openrlhf,
    "areal": areal,
}


def test_one_row_per_framework_the_log_reader_knows():
    """The table has a row per mirror (the six frameworks `logged` reads, and AReaL), seven columns."""
    assert set(CONVENTIONS) == set(MIRRORS)
    assert set(FRAMEWORKS) == set(MIRRORS) - {"areal"}
    table = conventions_table().splitlines()
    assert len(table) == 2 + len(CONVENTIONS)
    assert all(line.count(" | ") == 6 for line in table[:1] + table[2:])  # no cell holds a "|"


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_every_rule_a_mirror_defines_is_in_its_row(name):
    """A rule constant of a mirror that the table leaves out would be a convention it hides.

    A shared convention a mirror imports (``batch.SAMPLE_MEAN``) and names as its own
    (``PRIME_RL_MEAN``) is one object: counted once.
    """
    module, row = MIRRORS[name], CONVENTIONS[name]
    rules = [v for k, v in vars(module).items() if k.isupper() and isinstance(v, BoundRule)]
    means = list(
        {id(v): v for k, v in vars(module).items() if k.isupper() and isinstance(v, MeanRule)}.values()
    )
    assert rules, name
    assert all(any(r is listed for listed in row.rules.values()) for r in rules), name
    listed = [row.mean, *row.option_means.values()]
    assert len(means) == len(listed), name
    assert all(any(m is r for r in listed) for m in means), name


def test_torch_rule_compares_in_the_tensors_dtype():
    """A tensor is compared with a Python bound in the tensor's dtype (torch's way), a value at it kept."""
    assert batch.torch_rule(np.float32) is batch.torch_rule("float32")  # one object: one convention
    assert batch.torch_rule(np.float32) == BoundRule((True, True), "value", "float32")
    assert batch.torch_rule(np.int64, "log") == BoundRule((True, True), "log", "float64")
    x32 = np.float32(1.1)  # 1.10000002...: above the float64 bound 1.1, equal to it in float32
    assert not batch.torch_rule(x32.dtype).outside(x32, None, 1.1)
    assert batch.torch_rule(np.float64).outside(np.float64(x32), None, 1.1)
    assert not batch.torch_rule(np.float64).outside(1.1, None, 1.1)
    assert not batch.torch_rule(np.float64).outside(0.5, 0.5, None)
    with pytest.raises(ValueError, match="'linear'"):
        batch.torch_rule(np.float32, "linear")


def test_slime_mis_rules_are_in_the_slime_row():
    """mis.py's bound rule lives in a second module; the slime row lists it too."""
    from variance_lab.frameworks import slime_mis

    assert any(r is slime_mis.MIS_RULE for r in CONVENTIONS["slime"].rules.values())
    assert CONVENTIONS["slime"].option_means == {"calculate_per_token_loss": slime.SLIME_TOKEN_MEAN}
    assert "calculate_per_token_loss: / sum of max(row count, 1), pooled over tokens" in conventions_table()


def _reference(rule: MeanRule, values, mask, per_sample: bool) -> float | list[float]:
    """Return the rule written out with math.fsum, one sample at a time."""

    def divide(total, count):
        if rule.count == "eps":
            return total / (count + rule.eps)
        if rule.count in ("at_least_one", "row_at_least_one"):
            return total / max(count, 1.0)
        return total / count if count else math.nan

    rows = [
        (math.fsum(v for v, m in zip(vr, mr, strict=True) if m), float(sum(mr)))
        for vr, mr in zip(values.tolist(), mask.tolist(), strict=True)
    ]
    if per_sample:
        return [divide(t, c) for t, c in rows]
    if rule.pooling == "samples":
        return math.fsum(divide(t, c) for t, c in rows) / len(rows)
    if rule.count == "row_at_least_one":  # each row's count clamped, then pooled
        return math.fsum(t for t, _ in rows) / math.fsum(max(c, 1.0) for _, c in rows)
    return divide(math.fsum(t for t, _ in rows), math.fsum(c for _, c in rows))


@pytest.mark.parametrize("count", batch.COUNTS)
@pytest.mark.parametrize("pooling", batch.POOLINGS)
def test_mean_rule_against_its_formula(count, pooling):
    """Each divisor and pooling equals its formula, per sample and pooled, padding never read."""
    rng = np.random.default_rng(7)
    lengths = np.array([1, 4, 0, 9, 2])  # an empty row included
    mask = (np.arange(9)[None, :] < lengths[:, None]).astype(np.float64)
    values = np.where(mask > 0, rng.normal(size=mask.shape), np.nan)  # padding is never read
    rule = MeanRule(count, 1e-8 if count == "eps" else 0.0, pooling)
    pooled = rule.mean(values, mask)
    per_sample = rule.mean(values, mask, axis=-1)
    want_per_sample = _reference(rule, values, mask, per_sample=True)
    np.testing.assert_allclose(per_sample, want_per_sample, rtol=1e-14, atol=0)  # NaN where exact and empty
    want = _reference(rule, values, mask, per_sample=False)
    if math.isnan(want):  # an exact mean of samples with an empty one
        assert math.isnan(pooled)
    else:
        assert pooled == pytest.approx(want, rel=1e-14, abs=0)
    kept = rule.mean(values, mask, axis=-1, keepdims=True)
    assert kept.shape == (5, 1)


def test_verl_masked_mean_is_the_eps_rule():
    """The eps rule is verl's ``masked_mean``, bit for bit on float64; NeMo-RL's is the same rule.

    NeMo-RL's ``masked_mean`` is verl's; its global counts are float32, so the count plus 1e-8 is
    the count (a float64 count would keep the 1e-8).
    """
    rng = np.random.default_rng(3)
    mask = (rng.random((6, 5)) < 0.6).astype(np.float64)
    values = rng.normal(size=mask.shape)
    assert batch.masked_mean(values, mask) == verl.VERL_MEAN.mean(values, mask)
    assert MeanRule("eps", 1e-8, "tokens", dtypes="torch") == verl.VERL_MEAN
    assert nemo_rl.NEMO_MEAN == verl.VERL_MEAN
    assert nemo_rl.NEMO_MEAN.divide(np.float64(0.5), np.float32(1)) == 0.5
    assert nemo_rl.NEMO_MEAN.divide(np.float64(0.5), np.float64(1)) == 0.5 / (1 + 1e-8)


@pytest.mark.parametrize(
    ("mask_dtype", "count_dtype"),
    [(np.bool_, np.float32), (np.int64, np.float32), (np.int32, np.float32), (np.float32, np.float32)],
)
@pytest.mark.parametrize("values_dtype", [np.float32, np.float64])
def test_torch_rule_forms_the_count_plus_eps_as_torch(values_dtype, mask_dtype, count_dtype):
    """Under dtypes="torch" the count + 1e-8 is float32 for these masks: it equals the count.

    Written out: total in the values' dtype over fl32(c + 1e-8) = c (c = 3, 1, 0 per row; an
    empty row divides 0 by fl32(1e-8)); a float64 mask keeps c + 1e-8.
    """
    assert batch.torch_dtypes(values_dtype, mask_dtype) == (np.dtype(values_dtype), np.dtype(count_dtype))
    mask = np.array([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]).astype(mask_dtype)
    values = np.array([[0.1, 0.2, 0.3, np.nan], [np.nan, 0.7, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0]]).astype(
        values_dtype
    )
    rule = MeanRule("eps", 1e-8, "tokens", dtypes="torch")
    per_row = rule.mean(values, mask, axis=-1)
    assert per_row.dtype == np.dtype(values_dtype)
    v = values_dtype
    want = [(v(0.1) + v(0.2)) + v(0.3), v(0.7), v(0.0)]
    np.testing.assert_array_equal(per_row, np.array(want, dtype=v) / np.array([3, 1, 1e-8], dtype=np.float32))
    pooled = rule.mean(values, mask)
    assert pooled.dtype == np.dtype(values_dtype)
    assert pooled == rule.sum(values, mask) / v(4.0)
    f64 = MeanRule("eps", 1e-8, "tokens", dtypes="torch").mean(values, mask.astype(np.float64), axis=-1)
    assert f64.dtype == np.float64
    assert f64[1] == np.float64(v(0.7)) / (1.0 + 1e-8) != np.float64(v(0.7))


@pytest.mark.parametrize("mask_dtype", [np.bool_, np.int64, np.int32])
@pytest.mark.parametrize("flags_dtype", [np.bool_, np.int32])
def test_torch_rule_divides_counts_of_flags_in_float32(flags_dtype, mask_dtype):
    """Flags over a bool/int mask: int64 counts, the float32 quotient (torch's int64 / int64).

    prime-rl's ``_safe_mean(is_masked, loss_mask)``: 1 of 3, 2 of 7, 0 of 0 (the count clamped to
    1) per row, each ``fl32(k) / fl32(max(n, 1))``, which is not the float64 k/n; a float64 mask
    keeps float64.
    """
    assert batch.torch_dtypes(flags_dtype, mask_dtype) == (np.dtype(np.int64), np.dtype(np.float32))
    mask = np.zeros((3, 7), dtype=mask_dtype)
    mask[0, :3] = mask[1, :] = 1
    flags = np.zeros((3, 7), dtype=flags_dtype)
    flags[0, 1] = flags[1, 2] = flags[1, 5] = flags[2, 0] = 1  # row 2's flag lies outside the mask
    got = batch.SAMPLE_MEAN.mean(flags, mask, axis=-1)
    assert got.dtype == np.float32
    want = np.array([np.float32(1) / np.float32(3), np.float32(2) / np.float32(7), np.float32(0)])
    np.testing.assert_array_equal(got, want)
    assert float(got[0]) != 1 / 3
    assert float(got[1]) != 2 / 7
    counts = batch.SAMPLE_MEAN.divide(np.array([1, 2]), np.array([3.0, 7.0], dtype=np.float32))
    np.testing.assert_array_equal(counts, want[:2])  # over a float32 count (slime's rollout_mask_sums)
    f64 = batch.SAMPLE_MEAN.mean(flags, mask.astype(np.float64), axis=-1)
    assert f64.dtype == np.float64
    assert f64[0] == 1 / 3


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [({"count": "sum"}, "'sum'"), ({"pooling": "rows"}, "'rows'"), ({"dtypes": "f16"}, "'f16'")],
)
def test_bad_rule_names_the_value(kwargs, bad):
    """An unknown divisor or pooling is a ValueError naming it."""
    with pytest.raises(ValueError, match=bad):
        MeanRule(**kwargs)


def test_row_at_least_one_counts_an_empty_row_as_one():
    """The per-token count of slime: rows of 2 and 0 tokens give (a + b) / 3, not / 2; per row / max(c, 1)."""
    mask = np.array([[1.0, 1.0], [0.0, 0.0]])
    values = np.array([[1.0, 2.0], [np.nan, np.nan]])
    rule = MeanRule("row_at_least_one", 0.0, "tokens")
    assert rule.mean(values, mask) == 3.0 / 3.0
    assert MeanRule("at_least_one", 0.0, "tokens").mean(values, mask) == 3.0 / 2.0
    np.testing.assert_array_equal(rule.mean(values, mask, axis=-1), [1.5, 0.0])
    with pytest.raises(ValueError, match="axis must be None or -1, got 0"):
        rule.mean(values, mask, axis=0)


def test_groups_pool_rows_into_one_sample():
    """Rows 0 and 1 one group (3 + 1 tokens), row 2 its own, row 3 empty: the mean of 3 group means."""
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float64)
    values = np.array([[1.0, 2.0, 3.0], [6.0, 9.0, 9.0], [4.0, 8.0, 9.0], [5.0, 5.0, 5.0]])
    rule = MeanRule("at_least_one", 0.0, "samples")
    got = rule.mean(values, mask, groups=np.array([7, 7, 2, 5]))
    assert got == pytest.approx(((1 + 2 + 3 + 6) / 4 + (4 + 8) / 2 + 0.0) / 3, rel=1e-15)
    assert rule.mean(values, mask, groups=np.arange(4)) == pytest.approx(rule.mean(values, mask), rel=1e-15)
    with pytest.raises(ValueError, match=r"groups has shape \(3,\), expected \(4,\)"):
        rule.mean(values, mask, groups=np.arange(3))
    with pytest.raises(ValueError, match="pooling='tokens'"):
        MeanRule("at_least_one", 0.0, "tokens").mean(values, mask, groups=np.arange(4))
