"""NeMo-RL's mismatch metrics against ``ClippedPGLossFn`` run verbatim.

The fixtures ``tests/data/frameworks/nemo_rl.*`` are written by ``tools/nemo_rl_fixtures.py`` from
a NeMo-RL checkout (7ea279a): ``ClippedPGLossFn.__init__``/``__call__``, ``masked_mean`` and
``calculate_kl`` run in torch on float32 log-probs, int64/bool token masks, int64/float32/bool
sample masks with zeros, ragged rows, log-ratios at float32 bounds and past 88.72, micro-batches.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.frameworks import nemo_rl

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
#: Two float32 roundings, relative: a count divided in float32, a float32 weight.
F32_ROUNDING = 2 * 2.0**-23


def load_settings() -> list[dict]:
    """One dict per setting NeMo-RL ran: inputs, options, NeMo-RL's float32/float64 metrics."""
    meta = json.loads((DATA / "nemo_rl.json").read_text())
    with np.load(DATA / "nemo_rl.npz") as z:
        a = {k: z[k] for k in z.files}
    names, out, s, pos, row0 = meta["metric_names"], [], 0, 0, 0
    for (B, T1), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        arr = {k: a[k][pos : pos + B * T1].reshape(B, T1)[:, 1:] for k in ("prev", "gen", "tm")}
        sm = a["sm"][row0 : row0 + B]
        pos, row0 = pos + B * T1, row0 + B
        for st in batch["settings"]:
            row = {**arr, "sm": sm, "options": st["options"], "tables": meta["metric_normalizations"]}
            row["normalizations"] = meta["metric_normalizations"][st["normalizations"]]
            for key in ("metrics32", "metrics64"):
                vals, nans = a[key][s], a[key.replace("metrics", "nan")][s]
                row[key] = {k: v for k, v, n in zip(names, vals.tolist(), nans, strict=True) if v == v or n}
            out.append(row)
            s += 1
    assert s == len(a["metrics32"]) == 216
    return out


@pytest.fixture(scope="module")
def nemo_settings():
    """Return the settings (:func:`load_settings`), read once."""
    return load_settings()


def _mirror(row):
    o = dict(row["options"])
    mbs, token_level = o.pop("micro_batch_size"), o.pop("token_level_loss")
    assert o.pop("use_importance_sampling_correction")
    _, got = nemo_rl.clipped_pg_importance_weights(
        row["prev"], row["gen"], row["tm"], row["sm"], micro_batch_size=mbs, **o
    )
    table = nemo_rl.metric_normalizations(
        token_level_loss=token_level,
        sequence_level_importance_ratios=o.get("sequence_level_importance_ratios", False),
        truncated_importance_sampling_type=o.get("truncated_importance_sampling_type"),
    )
    return got, table


def test_metrics_equal_clipped_pg_loss_fn(nemo_settings):
    """216 settings: fractions exact, values within NeMo-RL's float32 rounding, inf/NaN where NeMo-RL's.

    NeMo-RL's rounding is its float32 run against its float64 run; where neither overflowed and
    both made the same bound decisions the mirror equals the float64 run to 1e-9 (plus the
    :math:`10^{-8}/N` NeMo-RL's float32 count drops).
    """
    worst, nonfinite, counts_differ = {}, 0, 0
    for row in nemo_settings:
        got, table = _mirror(row)
        assert table == row["normalizations"]
        want, want64 = row["metrics32"], row["metrics64"]
        assert set(got) == set(want) - {"num_valid_samples"}
        big = np.abs(row["prev"].astype(float) - row["gen"]).max() > 80
        same = "is_oob_ratio" not in want or want["is_oob_ratio"] == pytest.approx(want64["is_oob_ratio"])
        counts_differ += not same
        for k, v in want.items():
            if k == "num_valid_samples":
                assert v == row["sm"].sum()
                continue
            g = got[k]
            if not math.isfinite(v):
                nonfinite += 1
                assert g == v or (math.isnan(g) and math.isnan(v)), (k, g, v, row["options"])
                continue
            scale = 2 * F32_ROUNDING * abs(v)
            tol = scale if k == "is_oob_ratio" else 2 * abs(want64[k] - v) + scale
            assert abs(g - v) <= tol, (k, g, v, want64[k], row["options"])
            if same and not big and k != "is_oob_ratio":  # NeMo-RL's count + 1e-8 is float32:
                n = min((row["tm"] * row["sm"][:, None]).sum(), row["sm"].sum())  # 1e-8/N relative
                assert g == pytest.approx(want64[k], rel=1e-9 + 1e-8 / n, abs=1e-12), (k, g, want64[k])
            worst[k] = max(worst.get(k, 0.0), abs(g - v) / abs(v) if v else abs(g))
    assert nonfinite > 0  # teeth: float32 overflow and the JS mixture's underflow happen
    assert counts_differ > 0  # teeth: float32 weights at a bound, counted otherwise in float64
    assert set(worst) >= {"gen_kl_error", "policy_kl_error", "js_divergence_error", "is_oob_ratio"}


def test_kl_and_js_by_hand():
    """One token, p = log 0.5, g = log 0.25, r = log 2: k1/k2/k3 and the JS term written out."""
    p, g = np.log([[0.5]]), np.log([[0.25]])
    r = math.log(2.0)
    m = math.log(0.375)
    js = 0.5 * (math.exp(p[0, 0] - m) - (p[0, 0] - m) - 1) + 0.5 * (math.exp(g[0, 0] - m) - (g[0, 0] - m) - 1)
    for kind, gen_kl, pol_kl in (("k1", -r, r), ("k2", r * r / 2, r * r / 2), ("k3", 1 - r, 0.5 - 1 + r)):
        _, m_ = nemo_rl.clipped_pg_importance_weights(p, g, [[1]], reference_policy_kl_type=kind)
        assert m_["gen_kl_error"] == pytest.approx(gen_kl / (1 + 1e-8), rel=1e-12)
        assert m_["policy_kl_error"] == pytest.approx(pol_kl / (1 + 1e-8), rel=1e-12)
        assert m_["js_divergence_error"] == pytest.approx(js / (1 + 1e-8), rel=1e-12)
    with pytest.raises(ValueError, match="k4"):
        nemo_rl.clipped_pg_importance_weights(p, g, [[1]], reference_policy_kl_type="k4")


def test_js_is_nan_where_both_float32_probabilities_underflow():
    """Both log-probs below -103.97: NeMo-RL's float32 mixture is 0, its log -inf, the term NaN."""
    _, m = nemo_rl.clipped_pg_importance_weights([[-110.0, -1.0]], [[-120.0, -1.0]], [[1, 1]])
    assert math.isnan(m["js_divergence_error"])
    _, m = nemo_rl.clipped_pg_importance_weights([[-90.0, -1.0]], [[-91.0, -1.0]], [[1, 1]])
    assert math.isfinite(m["js_divergence_error"])


def test_a_nan_in_a_micro_batch_without_a_valid_sample_is_dropped():
    """Keep, as grpo does, a micro-batch's metrics only where it holds a valid sample."""
    prev, gen, tm = [[-110.0], [-1.0]], [[-120.0], [-1.2]], [[1], [1]]
    _, one = nemo_rl.clipped_pg_importance_weights(prev, gen, tm, [0, 1], micro_batch_size=1)
    _, both = nemo_rl.clipped_pg_importance_weights(prev, gen, tm, [0, 1], micro_batch_size=2)
    assert math.isfinite(one["js_divergence_error"])
    assert math.isnan(both["js_divergence_error"])
