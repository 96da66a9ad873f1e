"""variance_lab.frameworks.trl against TRL 1.16.0's own outputs, and its vLLM IS correction by hand.

``tests/data/frameworks/trl.*`` were written by ``tools/framework_fixtures.py`` running
``GRPOTrainer.get_off_policy_mask`` and ``GRPOTrainer.get_gamma_weights`` in float64 on the batch
the verl fixtures use; ``trl_dtypes.*`` by ``tools/trl_fixtures.py`` running those and the inline
vLLM importance-sampling blocks of ``_generate_and_score_completions`` on TRL's own dtypes
(float32 log-probs, int64, bool and float32 masks, values at the bounds, float32 overflow).
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


def load_batch() -> dict:
    """Return the fixture's arrays, inputs as float64."""
    with np.load(DATA / "trl.npz") as z:
        out = {k: z[k] for k in z.files}
    for k in ("old", "rollout", "update", "mask"):
        out[k] = out[k].astype(np.float64)
    return out


@pytest.fixture(scope="module")
def batch():
    """Return the fixture's arrays (:func:`load_batch`), read once."""
    return load_batch()


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
        (lambda: _run("token_mask", lo=2.0, hi=1.0), r"\(2\.0\) must be less than"),
        (lambda: _run("token_truncate", lo=None, hi=None), "At least one of"),
        (lambda: trl.get_off_policy_mask(np.zeros(3), OLD, SAMPLING, MASK, 0.1), r"\(3,\)"),
        (lambda: trl.get_off_policy_mask(np.zeros((3, 1)), OLD, SAMPLING, MASK, float("nan")), "nan"),
        (lambda: trl.get_gamma_weights(np.zeros((3, 1)), OLD, MASK, -np.ones((3, 4))), ">= 0"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    """Bad modes, bounds and shapes: ValueError naming the value."""
    with pytest.raises(ValueError, match=needle):
        call()


# --------------------------------------------------------------------------------------
# on TRL's dtypes (tests/data/frameworks/trl_dtypes.*, tools/trl_fixtures.py)
# --------------------------------------------------------------------------------------
def _dtype_batches():
    """One dict per batch TRL ran: inputs in its dtypes, and each run's outputs (own, f64, perm)."""
    meta = json.loads((DATA / "trl_dtypes.json").read_text())
    with np.load(DATA / "trl_dtypes.npz") as z:
        a = {k: z[k] for k in z.files}
    out, pos, apos = [], 0, 0
    at = dict.fromkeys(("is_ratio", "off_policy", "gamma", "is_metrics"), 0)
    for (B, T), b in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        dt = np.dtype(b["dtype"])
        row = {k: a[k][pos : pos + B * T].reshape(B, T).astype(dt) for k in ("old", "sampling", "new")}
        row["mask"] = a["mask"][pos : pos + B * T].reshape(B, T).astype(b["mask_dtype"])
        tool = a["tool"][pos : pos + B * T].reshape(B, T).astype(b["mask_dtype"])
        row["tool"] = tool if b["tool_mask"] else None
        row["adv"] = a["adv"][apos : apos + B].reshape(B, 1).astype(dt)
        row.update(dtype=dt, perm=np.array(b["perm"]), thresholds=b["thresholds"])
        pos, apos = pos + B * T, apos + B
        sizes = {
            "is_ratio": [B if mode.startswith("sequence") else B * T for mode, _, _ in meta["is_settings"]],
            "off_policy": [B] * len(b["thresholds"]),
            "gamma": [B] * (len(meta["gamma_cases"]) * len(meta["gamma_rho"])),
        }
        for k, ns in sizes.items():
            for run in ("own", "f64", "perm"):
                flat = a[f"{run}/{k}"][at[k] : at[k] + sum(ns)]
                row[f"{run}/{k}"] = np.split(flat, np.cumsum(ns)[:-1])
            at[k] += sum(ns)
        n = len(meta["is_settings"])
        for run in ("own", "f64", "perm"):
            row[f"{run}/is_metrics"] = a[f"{run}/is_metrics"][at["is_metrics"] : at["is_metrics"] + n]
        at["is_metrics"] += n
        out.append(row)
    assert pos == a["mask"].size
    return meta, out


DTYPE_META, DTYPE_BATCHES = _dtype_batches()


def _unpermute(values: np.ndarray, row: dict, token_level: bool) -> np.ndarray:
    """Return the permuted-columns run's (B, T) values in the original column order."""
    if not token_level:
        return values
    v = values.reshape(row["mask"].shape)
    out = np.empty_like(v)
    out[:, row["perm"]] = v
    return out.ravel()


def _within_own_rounding(got, own, f64, perm, dtype, what) -> float:
    """Assert got is within twice TRL's own rounding (f64 run, permuted run) plus two ulps; return worst ulps.

    On float64 inputs TRL's own runs agree bit for bit, so there the bound is 1e-12 relative.
    """
    got, own = np.asarray(got, dtype=np.float64).ravel(), np.asarray(own, dtype=np.float64)
    same = (got == own) | (np.isnan(got) & np.isnan(own))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(own), err_msg=what)
    fin = ~same & np.isfinite(own)
    ulp = np.spacing(np.abs(own[fin]).astype(dtype)).astype(np.float64)
    spread = np.maximum(np.abs(np.asarray(f64)[fin] - own[fin]), np.abs(np.asarray(perm)[fin] - own[fin]))
    tol = 2 * spread + 2 * ulp
    if np.dtype(dtype) == np.float64:
        tol = np.maximum(tol, 1e-12 * np.abs(own[fin]))
    assert np.all(np.abs(got[fin] - own[fin]) <= tol), what
    assert np.all(same | fin), what  # nothing left: NaN or inf where TRL has neither
    return float(np.max(np.abs(got[fin] - own[fin]) / ulp, initial=0.0))


def test_vllm_correction_equals_trls_own_on_its_dtypes():
    """8 modes and bounds, 24 batches: every zeroed, clamped or inf ratio TRL's, values in its rounding.

    The ratios and the five ``sampling/...`` metrics within twice TRL's own float32 rounding (its
    float64 run, its run with the positions permuted) plus two ulps; on float64 batches that
    rounding is TRL against itself, so the values agree to about 1e-15.
    """
    worst = {np.dtype(np.float32): 0.0, np.dtype(np.float64): 0.0}
    masked = overflow = 0
    for row in DTYPE_BATCHES:
        for i, (mode, lo, hi) in enumerate(DTYPE_META["is_settings"]):
            ratio, metrics = trl.vllm_importance_sampling_correction(
                row["old"], row["sampling"], row["mask"], mode, lo, hi, tool_mask=row["tool"]
            )
            token = mode.startswith("token")
            own = row["own/is_ratio"][i]
            wide = row["dtype"] == np.float64 or row["mask"].dtype == np.float64
            assert ratio.dtype == (np.float64 if wide else np.float32)
            np.testing.assert_array_equal(ratio.ravel() == 0, own == 0, err_msg=mode)
            perm = _unpermute(row["perm/is_ratio"][i], row, token)
            w = _within_own_rounding(ratio, own, row["f64/is_ratio"][i], perm, row["dtype"], mode)
            worst[row["dtype"]] = max(worst[row["dtype"]], w)
            got = [metrics[k] for k in DTYPE_META["metrics"]]
            _within_own_rounding(
                got,
                row["own/is_metrics"][i],
                row["f64/is_metrics"][i],
                row["perm/is_metrics"][i],
                row["dtype"],
                mode,
            )
            masked += int(np.sum(own == 0))
            overflow += int(np.sum(np.isinf(own)))
    assert masked > 50  # teeth: masked ratios, some at a bound
    assert overflow > 0  # float32 exp overflowing where float64's would not (sequence_truncate, no cap)
    assert worst[np.dtype(np.float64)] <= 2.0, worst


def test_off_policy_mask_equals_trls_own_on_its_dtypes():
    """get_off_policy_mask: every keep/drop decision TRL's, means exactly at float32 thresholds included."""
    n = kept_at_float32_threshold = 0
    for row in DTYPE_BATCHES:
        loss_mask = row["mask"] if row["tool"] is None else row["mask"] * row["tool"]
        for i, thr in enumerate(row["thresholds"]):
            keep = trl.get_off_policy_mask(row["adv"], row["new"], row["sampling"], loss_mask, thr)
            assert keep.dtype == loss_mask.dtype
            np.testing.assert_array_equal(keep.ravel(), row["own/off_policy"][i])
            n += keep.size
            if row["dtype"] == np.float32:
                d = np.nan_to_num(row["sampling"] - row["new"]).astype(np.float64) * (
                    np.asarray(loss_mask) != 0
                )
                mean64 = d.sum(axis=1) / np.maximum((np.asarray(loss_mask) != 0).sum(axis=1), 1)
                at = (mean64 > thr) & (row["adv"][:, 0] < 0) & (row["own/off_policy"][i] == 1)
                kept_at_float32_threshold += int(at.sum())
    assert n == 255
    assert kept_at_float32_threshold > 0  # teeth: above delta in float64, at fl32(delta) in float32: kept


def _gamma_bound(row: dict, loss_mask, rho, kwargs: dict) -> np.ndarray:
    """Return, per sequence, how far a float32 evaluation of phi may lie from the exact one (relative).

    Forward error analysis of TRL's formula in float32 (unit roundoff u = 2^-24): the sum
    log w of n terms errs by at most gamma_n S, S the sum of the terms' magnitudes (gamma_n = n u
    / (1 - n u)); log phi = lambda + k log w - lambda w then errs by |k - lambda w| times that
    plus a few roundings of each term, and phi by as much relative. TRL's own float32 run and the
    mirror must both lie within it of TRL's float64 run.
    """
    u = 2.0**-24
    m = np.asarray(loss_mask) != 0
    lr = np.clip((row["new"] - row["old"]).astype(np.float64), -20, 20)
    S = np.where(m, np.abs(lr), 0.0).sum(axis=1)
    n = np.full(S.shape, row["mask"].shape[1], dtype=np.float64)
    log_w = np.where(m, lr, 0.0).sum(axis=1)
    if rho is not None:
        with np.errstate(divide="ignore"):
            log_rho = np.clip(np.log(rho.astype(np.float64)), math.log(1e-8), 20)
        S, n, log_w = S + np.abs(log_rho).sum(axis=1), 2 * n + 1, log_w + log_rho.sum(axis=1)
    log_w = np.clip(log_w, math.log(1e-8), 20)
    pos = row["adv"][:, 0] >= 0
    k = np.where(pos, kwargs.get("k_pos", 2.0), kwargs.get("k_neg", 3.0))
    lam = np.where(pos, kwargs.get("lambda_pos", 3.0), kwargs.get("lambda_neg", 2.0))
    w = np.exp(log_w)
    gamma_n = n * u / (1 - n * u)
    return np.abs(k - lam * w) * gamma_n * S + 4 * u * (np.abs(lam) + np.abs(k * log_w) + lam * w + 1)


def test_gamma_weights_equal_trls_own_on_its_dtypes():
    """get_gamma_weights on float32 log-ratios and TRL's float32 token ratios, within float32 rounding.

    Without a token ratio, TRL's float32 run and the mirror both lie within the forward error
    bound of a float32 evaluation (:func:`_gamma_bound`) of TRL's float64 run; with TRL's float32
    token ratio (its float64 run had its own, which can mask other tokens at a bound) the mirror
    lies within twice that bound of TRL's float32 run. On float64 inputs: 1e-12 relative.
    """
    rho_at = {None: None, ("token_truncate", None, 3.0): 4, ("token_mask", 0.5, 2.0): 6}
    assert [tuple(r) if r else None for r in DTYPE_META["gamma_rho"]] == list(rho_at)
    worst = 0.0
    for row in DTYPE_BATCHES:
        loss_mask = row["mask"] if row["tool"] is None else row["mask"] * row["tool"]
        j = 0
        for _, kwargs in DTYPE_META["gamma_cases"]:
            for setting in rho_at.values():
                rho = None
                if setting is not None:
                    rho = row["own/is_ratio"][setting].reshape(row["mask"].shape).astype(row["dtype"])
                phi = trl.get_gamma_weights(row["adv"], row["new"] - row["old"], loss_mask, rho, **kwargs)
                assert phi.dtype == np.result_type(row["dtype"], np.float32)
                got, own, f64 = phi.ravel().astype(np.float64), row["own/gamma"][j], row["f64/gamma"][j]
                if row["dtype"] == np.float64:
                    np.testing.assert_allclose(got, own, rtol=1e-12, atol=0)
                else:
                    bound = _gamma_bound(row, loss_mask, rho, kwargs)
                    if rho is None:
                        tol = bound * np.abs(f64) + 1e-44  # 1e-44: float32 subnormals
                        assert np.all(np.abs(own - f64) <= tol), kwargs  # the bound holds for TRL itself
                        assert np.all(np.abs(got - f64) <= tol), kwargs
                    else:
                        assert np.all(np.abs(got - own) <= 2 * bound * np.abs(own) + 1e-44), kwargs
                    nz = f64 > 1e-30
                    worst = max(worst, float(np.max(np.abs(got - own)[nz] / own[nz], initial=0.0)))
                j += 1
    assert worst > 0  # float32 rounding seen (the mirror is not TRL's float32 run bit for bit)
