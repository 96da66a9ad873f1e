"""OpenRLHF's mirror against its own ``PolicyLoss`` and cases computed by hand (OpenRLHF 3c3be62).

OpenRLHF needs DeepSpeed, vLLM and Ray; its ``PolicyLoss``, ``aggregate_loss`` and
``masked_mean`` run with torch alone wrote ``tests/data/frameworks/openrlhf.*``
(``tools/openrlhf_fixtures.py``): float32 and float64 log-probs, int64, bool, float32 and float64
action masks, ratios and geometric means exactly at the bounds, fully masked rows.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.frameworks import openrlhf
from variance_lab.frameworks.batch import exp_float32

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
F32 = np.float32
# two sequences: 3 tokens and 2 tokens (the last position padding)
MASK = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
Y = np.array([[0.2, -0.8, 1.9], [0.01, -0.03, 0.0]])  # old - rollout
ROLLOUT = np.array([[-1.0, -0.5, -2.5], [-0.2, -0.1, -9.0]])
OLD = np.where(MASK > 0, ROLLOUT + Y, 4.0)  # padding values that would show if read


def _settings():
    """One dict per (batch, setting) OpenRLHF ran: inputs in its dtypes, options and its outputs."""
    meta = json.loads((DATA / "openrlhf.json").read_text())
    with np.load(DATA / "openrlhf.npz") as z:
        a = {k: z[k] for k in z.files}
    out, pos, s, cpos, rpos = [], 0, 0, 0, 0
    for (B, T), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        dt = np.dtype(batch["dtype"])
        raw = {k: a[k][pos : pos + B * T].reshape(B, T) for k in ("rollout", "old", "new", "adv", "mask")}
        pos += B * T
        inside = raw["mask"] > 0
        n = int(inside.sum())
        arrays = {k: raw[k].astype(dt) for k in ("rollout", "old", "new", "adv")}
        arrays["mask"] = raw["mask"].astype(batch["mask_dtype"])
        for setting in batch["settings"]:
            row = {**arrays, "dtype": dt, "inside": inside, "options": setting["options"]}
            row["ratio"], rpos = a["ratio"][rpos : rpos + n], rpos + n
            row["coef"] = None
            if setting["coef"]:
                row["coef"], cpos = a["coef"][cpos : cpos + n], cpos + n
            for k in ("scalars", "scalars64", "scalars_perm"):
                row[k] = dict(zip(("ppo_clip_ratio", "ppo_kl", "vllm_kl"), a[k][s].tolist(), strict=True))
            s += 1
            out.append(row)
    assert (pos, rpos, cpos, s) == (a["mask"].size, a["ratio"].size, a["coef"].size, len(a["scalars"]))
    return out


SETTINGS = _settings()


def _kwargs(options: dict) -> dict:
    """PolicyLoss's keyword arguments with OpenRLHF's defaults filled in."""
    return {
        "clip_eps_low": options.get("clip_eps_low", 0.2),
        "clip_eps_high": options.get("clip_eps_high", 0.2),
        "policy_loss_type": options.get("policy_loss_type", "ppo"),
        "enable_vllm_is_correction": options.get("enable_vllm_is_correction", False),
        "vllm_is_truncated_threshold": options.get("vllm_is_truncated_threshold", (0.5, 5.0)),
        "vllm_is_correction_type": options.get("vllm_is_correction_type", "tis"),
    }


def _logs_vllm_kl(kwargs: dict) -> bool:
    """Return whether PolicyLoss returns a vllm_kl (``ppo`` with the correction on; None otherwise)."""
    return kwargs["enable_vllm_is_correction"] and kwargs["policy_loss_type"] == "ppo"


def _ulps(got, want, dtype) -> float:
    """Return the largest |got - want| in ulps of ``want`` in ``dtype`` (inf matching inf counts 0)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    same = got == want
    ulp = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    return float(np.max(np.where(same, 0.0, np.abs(got - want) / ulp), initial=0.0))


# --------------------------------------------------------------------------------------
# cases computed by hand from loss.py:196-218
# --------------------------------------------------------------------------------------
def test_three_types_with_default_bounds():
    """[0.5, 5]: tis clamps both sides; icepop zeroes e^-0.8 and e^1.9; seq-mask-tis keeps raw ratios."""
    w, kl = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK)
    np.testing.assert_allclose(w[0], [math.exp(0.2), 0.5, 5.0], rtol=1e-14)
    assert kl == pytest.approx(-Y[MASK > 0].mean(), rel=1e-12)
    w, _ = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, vllm_is_correction_type="icepop")
    np.testing.assert_allclose(w[0], [math.exp(0.2), 0.0, 0.0], rtol=1e-14)
    w, _ = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, (0.9, 1.2), "seq-mask-tis")
    np.testing.assert_array_equal(w[0], 0.0)  # G = e^0.433 = 1.54 > 1.2
    np.testing.assert_allclose(w[1, :2], np.exp(Y[1, :2]), rtol=1e-14)  # untruncated
    assert w[1, 2] == 0.0


def test_any_threshold_openrlhf_accepts():
    """OpenRLHF checks no threshold: low 0 masks nothing; low > high: clamp gives high, masks drop all."""
    w, _ = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, (0.0, 2.0), "icepop")
    np.testing.assert_allclose(w[MASK > 0], np.where(np.exp(Y) <= 2.0, np.exp(Y), 0.0)[MASK > 0], rtol=1e-15)
    w, _ = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, (5.0, 0.5), "tis")
    np.testing.assert_array_equal(w, 0.5 * MASK)
    for kind in ("icepop", "seq-mask-tis"):
        w, _ = openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, (5.0, 0.5), kind)
        np.testing.assert_array_equal(w, 0.0)


def test_float32_ratio_at_the_low_bound_is_kept():
    """A float32 log-ratio whose float32 e^y is 0.5 exactly, though e^y < 0.5 in float64: OpenRLHF keeps it.

    torch compares the float32 ratio with 0.5 cast to float32 (``vllm_is >= low_threshold``);
    comparing in float64 would drop it (the mirror did before it computed in the tensors' dtype).
    """
    y = F32(math.log(0.5))
    while not (exp_float32(y) == F32(0.5) and math.exp(float(y)) < 0.5):
        y = np.nextafter(y, F32(-1))
    assert exp_float32(y) == F32(0.5)
    assert math.exp(float(y)) < 0.5
    old = np.array([[y, F32(0.0)]], dtype=F32)
    zero = np.zeros((1, 2), dtype=F32)
    mask = np.array([[1, 1]], dtype=np.int64)
    for kind in ("icepop", "tis"):
        w, _ = openrlhf.vllm_is_correction(old, zero, mask, vllm_is_correction_type=kind)
        assert w.dtype == F32
        assert w[0, 0] == F32(0.5)
    w, _ = openrlhf.vllm_is_correction(old.astype(np.float64), zero, mask, vllm_is_correction_type="icepop")
    assert w[0, 0] == 0.0  # the same value in float64 lies below the bound
    one = np.array([[1]], dtype=bool)
    w, _ = openrlhf.vllm_is_correction(old[:, :1], zero[:, :1], one, vllm_is_correction_type="seq-mask-tis")
    assert w[0, 0] == F32(0.5)  # a one-token geometric mean at the bound is kept too


def test_an_overflowing_masked_ratio_is_nan_as_in_openrlhf():
    """A float32 log-ratio of 100: e^y = inf, masked, ``vllm_is * mask`` is inf * 0 = NaN in OpenRLHF."""
    old = np.array([[100.0, 0.1]], dtype=F32)
    zero = np.zeros_like(old)
    mask = np.ones((1, 2), dtype=np.int64)
    w, _ = openrlhf.vllm_is_correction(old, zero, mask, vllm_is_correction_type="icepop")
    assert math.isnan(w[0, 0])
    assert w[0, 1] == exp_float32(F32(0.1))
    w, _ = openrlhf.vllm_is_correction(old, zero, mask, vllm_is_correction_type="seq-mask-tis")
    assert math.isnan(w[0, 0])  # the sequence's mean 50.05 is masked; its inf token times 0
    assert w[0, 1] == 0.0
    w, _ = openrlhf.vllm_is_correction(old, zero, mask, vllm_is_correction_type="tis")
    assert w[0, 0] == F32(5.0)  # clamp(inf, max=5)
    w, _ = openrlhf.vllm_is_correction(old.astype(np.float64), zero, mask, vllm_is_correction_type="icepop")
    assert w[0, 0] == 0.0  # e^100 is finite in float64: masked to 0


def test_gspo_ratio_is_the_sequence_geometric_mean_against_the_rollout_policy():
    """GSPO with the correction: e^{mean(log pi - log pi_rollout)} per token, no vllm_kl; without: vs old."""
    new = OLD + np.array([[0.1, 0.0, -0.1], [0.3, 0.1, 0.0]])
    adv = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    got = openrlhf.policy_loss_metrics(
        new,
        OLD,
        adv,
        MASK,
        ROLLOUT,
        policy_loss_type="gspo",
        enable_vllm_is_correction=True,
        clip_eps_low=3e-4,
        clip_eps_high=4e-4,
    )
    g = [np.exp((new - ROLLOUT)[0].mean()), np.exp((new - ROLLOUT)[1, :2].mean())]
    np.testing.assert_allclose(got["ratio"], [[g[0]] * 3, [g[1], g[1], 0.0]], rtol=1e-14)
    assert "vllm_kl" not in got
    assert got["vllm_is"] is None
    # e^0.433 with A = 1 clipped; e^0.19 with A = -1 not: min(r A, clip(r) A) takes r A
    assert got["ppo_clip_ratio"] == pytest.approx(3 / 5, rel=1e-15)
    assert got["ppo_kl"] == pytest.approx(-np.mean([0.1, 0.0, -0.1, 0.3, 0.1]), rel=1e-14)
    got = openrlhf.policy_loss_metrics(new, OLD, adv, MASK, policy_loss_type="gspo")
    np.testing.assert_allclose(got["ratio"][0], np.exp(0.0), rtol=1e-14)
    assert got["ppo_clip_ratio"] == 0.0  # row 1: e^0.2 = 1.221 > 1.2 but A = -1, so not clipped


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, (math.nan, 2.0)), "NaN"),
        (lambda: openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, 0.5), "0.5"),
        (lambda: openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK, vllm_is_correction_type="mis"), "'mis'"),
        (lambda: openrlhf.policy_loss_metrics(OLD, OLD, OLD, MASK, policy_loss_type="cispo"), "'cispo'"),
        (lambda: openrlhf.policy_loss_metrics(OLD, OLD, OLD, MASK, enable_vllm_is_correction=True), "None"),
        (lambda: openrlhf.vllm_is_correction(OLD, ROLLOUT, MASK * 2), "2.0"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """Bad bounds, types, a missing rollout or a bad mask: ValueError naming the value."""
    with pytest.raises(ValueError, match=needle):
        call()


# --------------------------------------------------------------------------------------
# against OpenRLHF's own PolicyLoss (tests/data/frameworks/openrlhf.*)
# --------------------------------------------------------------------------------------
def _own_rounding(row: dict, key: str) -> float:
    """OpenRLHF's own float32 rounding of a scalar: its float64 run and its run on permuted rows."""
    v = row["scalars"][key]
    return max(abs(row["scalars64"][key] - v), abs(row["scalars_perm"][key] - v))


def test_policy_loss_equals_openrlhfs_own():
    """288 settings: masks and fractions exactly, ratios to one ulp, means within OpenRLHF's own rounding.

    Decisions (a coefficient zeroed or not, ``ppo_clip_ratio``) must be OpenRLHF's exactly; a
    coefficient or ratio within one ulp of its dtype (torch's float32 exp is one ulp off the
    correctly rounded value on about 1 % of inputs); ``ppo_kl`` and ``vllm_kl`` on float64 inputs
    to 1e-12 relative, on float32 within twice OpenRLHF's own rounding (its float64 run, its run
    with the rows permuted) plus two float32 ulps.
    """
    assert len(SETTINGS) == 288
    worst = {"coef_ulps": 0.0, "ratio_ulps": 0.0, "f32_kl": 0.0, "f64_kl": 0.0}
    kinds = set()
    for row in SETTINGS:
        dt, inside = row["dtype"], row["inside"]
        kw = _kwargs(row["options"])
        got = openrlhf.policy_loss_metrics(
            row["new"], row["old"], row["adv"], row["mask"], row["rollout"], **kw
        )
        wide = dt == np.float64 or row["mask"].dtype == np.float64  # torch promotes ratio * mask
        assert got["ratio"].dtype == (np.float64 if wide else F32)
        worst["ratio_ulps"] = max(worst["ratio_ulps"], _ulps(got["ratio"][inside], row["ratio"], dt))
        assert (row["coef"] is None) == (got["vllm_is"] is None)
        if row["coef"] is not None:
            c = got["vllm_is"][inside]
            np.testing.assert_array_equal(c == 0, row["coef"] == 0, err_msg=str(row["options"]))
            worst["coef_ulps"] = max(worst["coef_ulps"], _ulps(c, row["coef"], dt))
            kinds.add(kw["vllm_is_correction_type"])
        want = {k: v for k, v in row["scalars"].items() if k != "vllm_kl" or _logs_vllm_kl(kw)}
        assert set(got) - {"ratio", "vllm_is"} == set(want), row["options"]
        for k, v in want.items():
            if k == "ppo_clip_ratio" or (math.isnan(v) and row["inside"].sum() == 0):
                assert got[k] == v or (math.isnan(v) and math.isnan(got[k])), (k, got[k], v, row["options"])
                continue
            rel = abs(got[k] - v) / abs(v) if v else abs(got[k])
            if dt == np.float64:
                assert rel <= 1e-12, (k, got[k], v)
                worst["f64_kl"] = max(worst["f64_kl"], rel)
            else:
                tol = 2 * _own_rounding(row, k) + 2 * float(np.spacing(F32(abs(v))))
                assert abs(got[k] - v) <= tol, (k, got[k], v, row["options"])
                worst["f32_kl"] = max(worst["f32_kl"], rel)
    assert kinds == {"tis", "icepop", "seq-mask-tis"}
    assert worst["coef_ulps"] <= 1.0, worst
    assert worst["ratio_ulps"] <= 1.0, worst


def test_float64_runs_of_float32_batches_match_to_1e12():
    """The float32 inputs cast up: the mirror in float64 is OpenRLHF's float64 run (fractions exactly)."""
    n = 0
    for row in SETTINGS:
        if row["dtype"] != F32:
            continue
        cast = {k: row[k].astype(np.float64) for k in ("new", "old", "adv", "rollout")}
        got = openrlhf.policy_loss_metrics(
            cast["new"], cast["old"], cast["adv"], row["mask"], cast["rollout"], **_kwargs(row["options"])
        )
        for k, v in row["scalars64"].items():
            if k == "vllm_kl" and not _logs_vllm_kl(_kwargs(row["options"])):
                assert k not in got
            elif math.isnan(v):  # a fully masked micro-batch: 0/0
                assert math.isnan(got[k])
            elif k == "ppo_clip_ratio":
                assert got[k] == v, row["options"]
            else:
                assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-300), (k, row["options"])
        n += 1
    assert n == 192


def test_fixtures_reach_the_bounds():
    """Teeth: float32 ratios exactly at a threshold that OpenRLHF keeps, some of which float64 would drop."""
    at_bound = drops_in_float64 = empty_rows = 0
    for row in SETTINGS:
        o = row["options"]
        if row["coef"] is None or o.get("vllm_is_correction_type") != "icepop" or row["dtype"] != F32:
            continue
        lo, hi = o["vllm_is_truncated_threshold"]
        y = (row["old"] - row["rollout"])[row["inside"]]
        kept = row["coef"] != 0
        at = kept & ((row["coef"] == F32(lo)) | (row["coef"] == F32(hi)))
        at_bound += int(at.sum())
        drops_in_float64 += int(
            (at & ((np.exp(y.astype(np.float64)) < lo) | (np.exp(y.astype(np.float64)) > hi))).sum()
        )
    for row in SETTINGS:
        empty_rows += int(((row["inside"].sum(axis=1) == 0) & (np.asarray(row["mask"]).shape[1] > 0)).sum())
    assert at_bound >= 10, at_bound
    assert drops_in_float64 >= 1, drops_in_float64
    assert empty_rows >= 8, empty_rows
