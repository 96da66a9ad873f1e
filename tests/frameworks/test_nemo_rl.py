"""NeMo-RL's mismatch metrics against ``ClippedPGLossFn`` run verbatim.

The fixtures ``tests/data/frameworks/nemo_rl.*`` are written by ``tools/nemo_rl_fixtures.py`` from
a NeMo-RL checkout (7ea279a): ``ClippedPGLossFn.__init__``/``__call__``, ``masked_mean`` and
``calculate_kl`` run in torch on float32 log-probs, int64/bool token masks, int64/float32/bool
sample masks with zeros, ragged rows, log-ratios at float32 bounds and past 88.72, micro-batches;
they hold the logged metrics and the per-token weights ``__call__`` holds as it returns.
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
    names, out, s, pos, row0, wpos = meta["metric_names"], [], 0, 0, 0, 0
    for (B, T1), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        arr = {k: a[k][pos : pos + B * T1].reshape(B, T1)[:, 1:] for k in ("prev", "gen", "tm")}
        sm = a["sm"][row0 : row0 + B]
        pos, row0 = pos + B * T1, row0 + B
        for st in batch["settings"]:
            row = {**arr, "sm": sm, "options": st["options"], "tables": meta["metric_normalizations"]}
            row["normalizations"] = meta["metric_normalizations"][st["normalizations"]]
            shape = (B, 1) if st["options"].get("sequence_level_importance_ratios") else (B, T1 - 1)
            n = shape[0] * shape[1]
            for key in ("weights32", "weights64"):  # actor_importance_weights, every position
                row[key] = a[key][wpos : wpos + n].reshape(shape)
            wpos += n
            for key in ("metrics32", "metrics64"):
                vals, nans = a[key][s], a[key.replace("metrics", "nan")][s]
                row[key] = {k: v for k, v, n in zip(names, vals.tolist(), nans, strict=True) if v == v or n}
            out.append(row)
            s += 1
    assert s == len(a["metrics32"]) == 216
    assert wpos == a["weights32"].size == a["weights64"].size
    return out


@pytest.fixture(scope="module")
def nemo_settings():
    """Return the settings (:func:`load_settings`), read once."""
    return load_settings()


def _mirror(row):
    o = dict(row["options"])
    mbs, token_level = o.pop("micro_batch_size"), o.pop("token_level_loss")
    assert o.pop("use_importance_sampling_correction")
    w, got = nemo_rl.clipped_pg_importance_weights(
        row["prev"], row["gen"], row["tm"], row["sm"], micro_batch_size=mbs, **o
    )
    table = nemo_rl.metric_normalizations(
        token_level_loss=token_level,
        sequence_level_importance_ratios=o.get("sequence_level_importance_ratios", False),
        truncated_importance_sampling_type=o.get("truncated_importance_sampling_type"),
    )
    return w, got, table


def _f64_tolerance(row, k: str, v: float, n: int) -> float:
    r"""Return a bound on the float64 rounding of a metric the mirror computes in NeMo-RL's order.

    The mirror and NeMo-RL's float64 run take the same steps in float64, only another ``exp``
    (NumPy's against torch's, each within an ulp) and another order of summation. Each per-token
    value is a few roundings of terms of size at most :math:`m_t = e^{|\Delta_t|} + |\Delta_t| + 1`
    (k1/k2/k3 of :math:`\pm\Delta`, the JS terms, whose :math:`|\log\pi - M| \le |\Delta| +
    \log 2` and :math:`e^{\log\pi - M} \le 2`, :math:`e^{|\Delta|}` and a weight), so it is off
    by at most :math:`3\varepsilon m_t`; a sum of :math:`n` of them adds at most
    :math:`n\varepsilon \sum_t m_t`. A metric is such a sum over the global count: each side is
    within :math:`(n + 3)\varepsilon (\lvert v\rvert + \bar m)` of the exact value, so they
    differ by at most twice that. A sequence-level weight :math:`e^{\sum_t \Delta_t}` adds the
    rounding of its sum, :math:`n\varepsilon \sum_t |\Delta_t|` relative: :math:`\lvert v\rvert
    \max_i \sum_t |\Delta_{it}|` is added to :math:`\bar m`.
    """
    d = np.abs(row["prev"].astype(np.float64) - row["gen"])
    mask = (row["tm"] * row["sm"][:, None]) > 0
    m_bar = float(np.mean((np.exp(d) + d + 1.0)[mask])) if mask.any() else 0.0
    if k == "sampling_importance_ratio" and row["options"].get("sequence_level_importance_ratios"):
        m_bar += abs(v) * float(np.max((d * mask).sum(axis=-1)))
    return 2 * (n + 3) * 2.0**-52 * (abs(v) + m_bar)


def test_metrics_equal_clipped_pg_loss_fn(nemo_settings):
    """216 settings: fractions exact, values within NeMo-RL's float32 rounding, inf/NaN where NeMo-RL's.

    ``is_oob_ratio`` is NeMo-RL's float32 value to the bit (each micro-batch's float32 quotient,
    summed). NeMo-RL's rounding is its float32 run against its float64 run; where neither
    overflowed and both made the same bound decisions the mirror equals the float64 run to
    float64 rounding (:func:`_f64_tolerance`): it divides by the count as NeMo-RL does
    (``fl32(N + 1e-8) = N``) and takes the JS term in NeMo-RL's order.
    """
    worst, nonfinite, counts_differ, compared64 = {}, 0, 0, 0
    for row in nemo_settings:
        _, got, table = _mirror(row)
        assert table == row["normalizations"]
        want, want64 = row["metrics32"], row["metrics64"]
        assert set(got) == set(want)
        big = np.abs(row["prev"].astype(float) - row["gen"]).max() > 80
        same = "is_oob_ratio" not in want or want["is_oob_ratio"] == pytest.approx(want64["is_oob_ratio"])
        counts_differ += not same
        n = int((row["tm"] * row["sm"][:, None]).sum())
        for k, v in want.items():
            g = got[k]
            if k == "num_valid_samples":  # a count: the batch's valid samples, in both runs
                assert g == v == want64[k] == row["sm"].sum()
                continue
            if not math.isfinite(v):
                nonfinite += 1
                assert g == v or (math.isnan(g) and math.isnan(v)), (k, g, v, row["options"])
                continue
            if k == "is_oob_ratio":
                assert g == v, (g, v, row["options"])
                continue
            tol = 2 * abs(want64[k] - v) + 2 * F32_ROUNDING * abs(v)
            assert abs(g - v) <= tol, (k, g, v, want64[k], row["options"])
            if same and not big:
                compared64 += 1
                assert abs(g - want64[k]) <= _f64_tolerance(row, k, want64[k], n), (k, g, want64[k])
            worst[k] = max(worst.get(k, 0.0), abs(g - v) / abs(v) if v else abs(g))
    assert nonfinite > 0  # teeth: float32 overflow and the JS mixture's underflow happen
    assert counts_differ > 0  # teeth: float32 weights at a bound, counted otherwise in float64
    assert compared64 > 700
    assert set(worst) >= {"gen_kl_error", "policy_kl_error", "js_divergence_error"}


def test_weights_equal_clipped_pg_loss_fn(nemo_settings):
    r"""The weights ``__call__`` holds as it returns: zeros where NeMo-RL's, values within its rounding.

    At every unmasked token (every row with sequence-level ratios): the mirror's weight is 0
    exactly where NeMo-RL's float32 weight is (an overflow past 88.72, an ``icepop`` drop, a
    sequence ``seq-mask-tis`` drops), and otherwise within the rounding of NeMo-RL's float32 run:
    :math:`\Delta` (or its sum over a sequence of :math:`T` tokens) rounded in float32, at most
    :math:`\gamma_{T+1} \sum_t |\Delta_t|` off, :math:`\gamma_n = nu/(1 - nu)`, :math:`u =
    2^{-24}`, then its exp, an ulp (:math:`2u`) off; a ``tis`` clamp keeps the bound exactly.
    Where NeMo-RL's float64 run lies within that bound of its float32 run (it made the same
    decisions: no overflow past 88.72, the same drops and clamps), the mirror equals it to the
    same bound in float64 (:math:`u = 2^{-53}`).
    """

    def gamma(n, u):
        return n * u / (1 - n * u)

    zeros = clamped = compared64 = 0
    for row in nemo_settings:
        w, _, _ = _mirror(row)
        w32, w64 = row["weights32"].astype(np.float64), row["weights64"]
        assert w.shape == w32.shape
        d = np.abs(row["prev"].astype(np.float64) - row["gen"])
        if row["options"].get("sequence_level_importance_ratios"):
            inside = np.ones(w.shape, dtype=bool)
            mask = (row["tm"] * row["sm"][:, None]) > 0
            terms = (d * mask).sum(axis=-1, keepdims=True)
            n = int(mask.sum(axis=-1).max()) + 1
        else:
            inside, terms, n = row["tm"] > 0, d, 2
        np.testing.assert_array_equal(w[inside] == 0, w32[inside] == 0, err_msg=str(row["options"]))
        zeros += int((w32[inside] == 0).sum())
        hi = row["options"].get("truncated_importance_sampling_ratio")
        clamped += (
            int((w[inside] == hi).sum())
            if row["options"].get("truncated_importance_sampling_type") == "tis"
            else 0
        )
        tol32, tol64 = (w * (gamma(n, u) * terms + 2 * u) for u in (2.0**-24, 2.0**-53))
        assert np.all(np.abs(w - w32)[inside] <= tol32[inside]), row["options"]
        same = inside & (np.abs(w64 - w32) <= tol32)  # NeMo-RL's float64 run decided the same
        assert np.all(np.abs(w - w64)[same] <= tol64[same]), row["options"]
        compared64 += int(same.sum())
    assert zeros > 0  # teeth: overflowed and dropped weights are compared
    assert clamped > 0  # and clamped ones
    assert compared64 > 3000


def test_kl_and_js_by_hand():
    """One token, p = log 0.5, g = log 0.25, r = log 2: k1/k2/k3 and the JS term written out.

    Divided by the count itself: NeMo-RL's ``global_valid_toks + 1e-8`` is float32, 1 (not 1 + 1e-8).
    """
    p, g = np.log([[0.5]]), np.log([[0.25]])
    r = math.log(2.0)
    m = math.log(0.375)
    js = 0.5 * (math.exp(p[0, 0] - m) - (p[0, 0] - m) - 1) + 0.5 * (math.exp(g[0, 0] - m) - (g[0, 0] - m) - 1)
    for kind, gen_kl, pol_kl in (("k1", -r, r), ("k2", r * r / 2, r * r / 2), ("k3", 1 - r, 0.5 - 1 + r)):
        _, m_ = nemo_rl.clipped_pg_importance_weights(p, g, [[1]], reference_policy_kl_type=kind)
        assert m_["gen_kl_error"] == pytest.approx(gen_kl, rel=1e-12)
        assert m_["policy_kl_error"] == pytest.approx(pol_kl, rel=1e-12)
        assert m_["js_divergence_error"] == pytest.approx(js, rel=1e-12)
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
