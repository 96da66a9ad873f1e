"""prime-rl's mirror against prime-rl's own loss functions (PrimeIntellect-ai/prime-rl 559b447).

prime-rl's trainer needs CUDA and its config package; ``default_loss_fn``, ``ipo_loss_fn``,
``ref_kl_loss_fn`` and ``compute_loss`` run with torch alone wrote
``tests/data/frameworks/prime_rl.*`` (``tools/prime_rl_fixtures.py``): float32 log-probs, bool
loss masks, ragged samples, probability differences exactly at the bounds in float32, fully
masked samples, rl and ref-KL weight streams with zeros. Hand-computed cases are in
``test_others.py``.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.frameworks import prime_rl

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
#: Two float32 roundings, relative.
F32_ROUNDING = 2 * 2.0**-23
FRACTIONS = (
    "is_masked",
    "is_masked_low",
    "is_masked_high",
    "masked_advantage_positive",
    "masked_advantage_negative",
)


def _settings():
    """One dict per (batch, setting) prime-rl ran: inputs (its dtypes), options and its outputs."""
    meta = json.loads((DATA / "prime_rl.json").read_text())
    with np.load(DATA / "prime_rl.npz") as z:
        a = {k: z[k] for k in z.files}
    out, pos, kpos, rpos = [], 0, 0, 0
    keys = ("trainer", "inference", "ref", "advantages", "mask", "rl_weights", "ref_kl_weights")
    for (B, T), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        arrays = {k: a[k][pos : pos + B * T].reshape(B, T) for k in keys}
        pos += B * T
        for setting in batch["settings"]:
            row = {
                **arrays,
                "loss": setting["loss"],
                "options": setting["options"],
                "has_rl_weights": batch["rl_weights"],
                "has_ref_kl_weights": batch["ref_kl_weights"],
                "m32": {k: a["m32"][o : o + n] for k, (o, n) in setting["metrics"].items()},
                "m64": {k: a["m64"][o : o + n] for k, (o, n) in setting["metrics"].items()},
                "rl_ran": a["rl_ran"][rpos : rpos + B],
            }
            for k in ("rl_keep32", "rl_keep64", "ref_keep32", "ref_keep64"):
                row[k] = a[k][kpos : kpos + B * T].reshape(B, T)
            kpos, rpos = kpos + B * T, rpos + B
            out.append(row)
    assert pos == a["mask"].size
    assert kpos == a["rl_keep32"].size
    return out


SETTINGS = _settings()


def _kl_scale(trainer, inference, component, ran) -> tuple[np.ndarray, np.ndarray]:
    r"""Return, per row, the largest term of e^y - y - 1 over ``component`` and its token count.

    The largest of :math:`e^y + |y| + 1` over the row's tokens (:math:`y = \log\pi_{trainer} -
    \log\pi_{inference}` in float64; 0 for a row without one) and how many tokens it has:
    :func:`_f64_tolerance`'s inputs, for the rows that ran (``ran``, bool per row).
    """
    y = np.where(component, trainer.astype(np.float64) - inference.astype(np.float64), 0.0)
    terms = np.where(component, np.exp(y) + np.abs(y) + 1.0, 0.0)
    return terms.max(axis=1)[ran], component.sum(axis=1)[ran]


def _f64_tolerance(v64, scale) -> np.ndarray:
    r"""Return a bound on the float64 rounding of a per-sample ``mismatch_kl`` mean, per row.

    prime-rl's float64 run and the mirror both take :math:`\mathrm{fl}(\mathrm{fl}(\mathrm{fl}(e^y)
    - y) - 1)` per token (``loss.py:103-105``), with another ``exp`` (torch's against NumPy's,
    each within an ulp) and another order of summation. Per token each side is within
    :math:`2\varepsilon m` of :math:`e^y - y - 1`, :math:`m = e^y + |y| + 1` (the exp's ulp and
    two roundings), :math:`\varepsilon = 2^{-52}`; a sum of :math:`k \le n` such terms adds at
    most :math:`\tfrac{k}{2}\varepsilon \cdot k \max m`, which the count :math:`k` divides, and the
    division :math:`\tfrac12\varepsilon|v|`, so the mean over the :math:`k` tokens is within
    :math:`(\tfrac{n}{2} + 2)\varepsilon(\max m + |v|)` on each side: they differ by at most
    :math:`(n + 4)\varepsilon(\max m + |v|)`. The value is about :math:`y^2/2`, so where
    :math:`|y| < 10^{-7}` this is the value's own size: prime-rl's float64 number there is
    rounding, and the mirror reproduces it only as closely as this.
    """
    m, n = scale
    return (n + 4) * 2.0**-52 * (m + np.abs(v64))


def _check(
    got: dict, want32: dict, want64: dict, same_masks: bool, rows=None, scale=None
) -> dict[str, float]:
    """Fractions exactly prime-rl's; values within its float32 rounding and its float64 run's.

    A fraction is ``_safe_mean`` of a bool tensor, an int64 count over an int64 count, which torch
    divides in float32 in prime-rl's float32 and float64 runs alike: the mirror's float64 value
    must be that float32 quotient, equal (``==``) to both runs' (the float64 run's where its
    masks are the float32 run's).

    ``rows`` (bool, one per metric row) leaves out the rows of samples whose mask differs; where
    the masks are prime-rl's float64 ones too, a mismatch KL is within :func:`_f64_tolerance`
    (``scale``: :func:`_kl_scale`, one per metric row) of prime-rl's float64 run, another value
    (``ref_kl``) 1e-9 relative.
    """
    assert set(got) == set(want32), set(got) ^ set(want32)
    worst = {}
    for k, v32 in want32.items():
        g, v64 = np.asarray(got[k]), want64[k]
        assert g.shape == v32.shape, (k, g.shape, v32.shape)
        sc = scale
        if rows is not None:
            g, v32, v64 = g[rows], v32[rows], v64[rows]
            sc = None if scale is None else (scale[0][rows], scale[1][rows])
        if k.removeprefix("ref_kl/") in FRACTIONS:
            np.testing.assert_array_equal(g, v32, err_msg=k)
            if same_masks:
                np.testing.assert_array_equal(g, v64, err_msg=k)
        else:
            # prime-rl's float32 rounding: its float64 run's distance, plus two roundings of
            # e^y - y - 1 (or log pi_ref - log pi_trainer) at the scale of its terms (~1), which
            # the float64 run cannot show where it masks a token float32 keeps
            tol = 2 * np.abs(v64 - v32) + F32_ROUNDING * (np.abs(v32) + 1.0)
            assert np.all(np.abs(g - v32) <= tol), (k, g, v32, v64)
            if same_masks and k.endswith("mismatch_kl"):
                assert np.all(np.abs(g - v64) <= _f64_tolerance(v64, sc)), (k, g, v64)
            elif same_masks:
                np.testing.assert_allclose(g, v64, rtol=1e-9, atol=1e-12, err_msg=k)
        size = np.maximum(np.abs(v32), 1e-300)
        worst[k] = float(np.max(np.abs(g - v32) / size, initial=0.0))
    return worst


def test_the_fixtures_cover_what_they_claim():
    """96 settings; bounds hit exactly; float64 decides otherwise somewhere; samples skipped by weights."""
    assert len(SETTINGS) == 96
    assert {r["loss"] for r in SETTINGS} == {"default", "ipo"}
    assert any(r["has_rl_weights"] for r in SETTINGS)
    assert any(not r["has_rl_weights"] for r in SETTINGS)
    assert any((r["rl_keep32"] != r["rl_keep64"]).any() for r in SETTINGS)
    assert any((r["rl_ran"] == 0).any() for r in SETTINGS)
    assert any((~r["mask"].any(axis=1)).any() for r in SETTINGS)


@pytest.mark.parametrize("loss", ["default", "ipo"])
def test_rl_masks_and_metrics_equal_prime_rls_own(loss):
    """default_loss_fn (DPPO) and ipo_loss_fn through compute_loss: keep masks and rows exactly.

    The mirror takes torch's float32 exp (``frameworks.batch.exp_float32``), as prime-rl does: with
    the correctly rounded one a token of the fixtures flipped (IPO at 0.3: prime-rl's d is
    0.30000007, the correctly rounded 0.3).
    """
    rows = [r for r in SETTINGS if r["loss"] == loss]
    for r in rows:
        o = r["options"]
        w = r["rl_weights"] if r["has_rl_weights"] else None
        if loss == "default":
            keep, got = prime_rl.dppo_mask(
                r["trainer"],
                r["inference"],
                r["advantages"],
                r["mask"],
                o["dppo_mask_low"],
                o["dppo_mask_high"],
                rl_weights=w,
                per_sample=True,
            )
        else:
            keep, got = prime_rl.ipo_mask(
                r["trainer"], r["inference"], r["mask"], o["ipo_threshold"], rl_weights=w, per_sample=True
            )
        differ = (keep > 0) != (r["rl_keep32"] > 0)
        assert not differ.any()
        want = [k for k in r["m32"] if not k.startswith("ref_kl")]
        same = bool((r["rl_keep32"] == r["rl_keep64"]).all())
        ran = r["rl_ran"] > 0
        rows = ~differ.any(axis=1)[ran]
        component = r["mask"] & ((r["rl_weights"] != 0) if r["has_rl_weights"] else True)
        scale = _kl_scale(r["trainer"], r["inference"], component, ran)
        _check(got, {k: r["m32"][k] for k in want}, {k: r["m64"][k] for k in want}, same, rows, scale)


def test_ref_kl_masks_and_metrics_equal_prime_rls_own():
    """ref_kl_loss_fn on ref_kl_weights != 0 (the loss mask not read), a sample of zeros skipped."""
    rows = [r for r in SETTINGS if r["has_ref_kl_weights"]]
    assert rows
    outside_loss_mask = 0
    for r in rows:
        keep, got = prime_rl.ref_kl_mask(
            r["trainer"], r["inference"], r["ref"], r["ref_kl_weights"], per_sample=True
        )
        np.testing.assert_array_equal(keep > 0, r["ref_keep32"] > 0)
        outside_loss_mask += int((keep > 0)[~r["mask"]].sum())
        want = [k for k in r["m32"] if k.startswith("ref_kl")]
        same = bool((r["ref_keep32"] == r["ref_keep64"]).all())
        lm = r["ref_kl_weights"] != 0
        scale = _kl_scale(r["trainer"], r["inference"], lm, lm.any(axis=1))
        _check(got, {k: r["m32"][k] for k in want}, {k: r["m64"][k] for k in want}, same, scale=scale)
    assert outside_loss_mask > 0  # teeth: tokens the loss mask excludes still run ref-KL


def test_the_mean_over_the_rows_that_ran():
    """Without per_sample each metric is the mean of prime-rl's rows; NaN when no sample ran."""
    r = next(x for x in SETTINGS if x["has_rl_weights"] and (x["rl_ran"] == 0).any() and x["loss"] == "ipo")
    _, got = prime_rl.ipo_mask(
        r["trainer"], r["inference"], r["mask"], r["options"]["ipo_threshold"], rl_weights=r["rl_weights"]
    )
    assert got["is_masked"] == pytest.approx(float(np.mean(r["m32"]["is_masked"])), rel=1e-6)
    _, none = prime_rl.ipo_mask(r["trainer"], r["inference"], r["mask"], rl_weights=np.zeros(r["mask"].shape))
    assert all(math.isnan(v) for v in none.values())


def test_rl_weights_drop_tokens_and_samples_by_hand():
    """Weight 0 leaves the mask and denominator; a sample of zero weights adds no row (loss.py:379-384)."""
    trainer = np.log(np.array([[0.5, 0.4, 0.4, 0.4], [0.4, 0.4, 0.4, 0.4]], dtype=np.float32))
    inference = np.log(np.array([[0.2, 0.4, 0.4, 0.4], [0.4, 0.4, 0.4, 0.4]], dtype=np.float32))
    mask = np.ones((2, 4), dtype=bool)
    _, rows = prime_rl.ipo_mask(trainer, inference, mask, per_sample=True)
    np.testing.assert_array_equal(rows["is_masked"], [0.25, 0.0])  # d = 0.3 > 0.1 on one token of 4
    weights = np.array([[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    keep, rows = prime_rl.ipo_mask(trainer, inference, mask, rl_weights=weights, per_sample=True)
    np.testing.assert_array_equal(rows["is_masked"], [0.5])  # 1 of the 2 weighted tokens; row 1 gone
    np.testing.assert_array_equal(keep, [[0, 1, 0, 0], [0, 0, 0, 0]])
    keep, rows = prime_rl.ref_kl_mask(trainer, inference, trainer, weights, per_sample=True)
    np.testing.assert_array_equal(rows["ref_kl/is_masked"], [0.0])  # d = +0.3: only d < -0.2 masks
    np.testing.assert_array_equal(rows["ref_kl"], [0.0])
    np.testing.assert_array_equal(prime_rl.mismatch_kl_mask(mask, weights), weights != 0)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda m: prime_rl.ipo_mask(m, m, m, -0.1), "-0.1"),
        (lambda m: prime_rl.ipo_mask(m, m, m, rl_weights=np.ones(3)), r"\(3,\)"),
        (lambda m: prime_rl.ref_kl_mask(m, m, m, np.full((2, 2), np.nan)), "ref_kl_weights"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """A negative threshold (prime-rl's ge=0), a weight stream of the wrong shape or not finite."""
    with pytest.raises(ValueError, match=needle):
        call(np.zeros((2, 2)))


# --------------------------------------------------------------------------------------
# IcePopLoss (PR #3526; tests/data/frameworks/prime_rl_icepop.*, tools/prime_rl_icepop_fixtures.py)
# --------------------------------------------------------------------------------------
def _icepop_settings():
    """One dict per (batch, band) IcePopLoss ran: float32 inputs, its keep masks, per-sample metrics."""
    meta = json.loads((DATA / "prime_rl_icepop.json").read_text())
    with np.load(DATA / "prime_rl_icepop.npz") as z:
        a = {k: z[k] for k in z.files}
    out, pos, kpos, mpos = [], 0, 0, 0
    for (B, T), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        row = {k: a[k][pos : pos + B * T].reshape(B, T).astype(np.float32) for k in ("trainer", "inference")}
        row["mask"] = a["mask"][pos : pos + B * T].reshape(B, T) > 0
        pos += B * T
        ran = B  # without rl_weights compute_loss runs the loss on every sample
        for band in batch["bands"]:
            keeps = {k: a[k][kpos : kpos + B * T].reshape(B, T) > 0 for k in ("keep32", "keep64")}
            metrics = {k: a[k][mpos : mpos + ran] for k in ("m32", "m64")}
            kpos, mpos = kpos + B * T, mpos + ran
            out.append({**row, **keeps, **metrics, "band": band})
    assert (kpos, mpos) == (a["keep32"].size, len(a["m32"]))
    return meta["metrics"], out


def test_icepop_mask_equals_prime_rls_own():
    """120 settings: every keep decision IcePopLoss's, log-ratios at the bounds included; metrics too.

    The float32 log-ratio against each bound's float32 log, kept at it; ``is_masked`` exactly,
    the mismatch KLs within twice prime-rl's own float32 rounding (its float64 run) plus two
    float32 roundings.
    """
    names, settings = _icepop_settings()
    assert len(settings) == 120
    at_bound = differs_in_float64 = compared64 = 0
    for s in settings:
        keep, per_sample = prime_rl.icepop_mask(
            s["trainer"], s["inference"], s["mask"], *s["band"], per_sample=True
        )
        np.testing.assert_array_equal(keep > 0, s["keep32"], err_msg=str(s["band"]))
        differs_in_float64 += int((s["keep64"] != s["keep32"]).sum())
        y32 = (s["trainer"] - s["inference"])[s["mask"]]
        logs = [np.float32(np.log(np.float64(np.float32(b)))) for b in s["band"]]
        at_bound += int(np.isin(y32, logs).sum())
        for j, k in enumerate(names):
            got, v32, v64 = per_sample[k], s["m32"][:, j], s["m64"][:, j]
            if k == "is_masked":  # the float32 quotient, in both of IcePopLoss's runs
                np.testing.assert_array_equal(got, v32)
                same = (s["keep32"] == s["keep64"]).all(axis=1)
                np.testing.assert_array_equal(got[same], v64[same])
            else:
                tol = 2 * np.abs(v64 - v32) + F32_ROUNDING * np.abs(v32) + 1e-12
                assert np.all(np.abs(got - v32) <= tol), k
                same = (s["keep32"] == s["keep64"]).all(axis=1)  # prime-rl's float64 run kept the same
                bound = _f64_tolerance(
                    v64, _kl_scale(s["trainer"], s["inference"], s["mask"], np.ones(len(v64), bool))
                )
                fine = np.abs(got - v64) <= bound
                assert np.all(fine[same]), (k, got[same], v64[same])
                compared64 += int(same.sum())
    assert at_bound > 100  # teeth: log-ratios exactly at a bound's float32 log, kept
    assert differs_in_float64 > 0  # prime-rl in float64 decides some of them otherwise
    assert compared64 > 200


@pytest.mark.parametrize(
    ("band", "needle"),
    [((0.0, 5.0), "ratio_low 0.0"), ((2.0, 1.0), "must not exceed"), ((0.2, True), "True")],
)
def test_icepop_band_is_checked_as_prime_rl_checks_it(band, needle):
    """IcePopLossConfig: both bounds > 0, ratio_low <= ratio_high."""
    with pytest.raises(ValueError, match=needle):
        prime_rl.icepop_mask(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), *band)
