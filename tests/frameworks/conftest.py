"""The slime fixtures (``tests/data/frameworks/slime.*``, by ``tools/slime_fixtures.py``), read once."""

import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"
#: Two float32 roundings, relative: a float32 weight's or value's, beyond slime's own rounding.
F32_ROUNDING = 2 * 2.0**-23


def load_slime_settings() -> list[dict]:
    """Return one dict per setting slime ran: its inputs (as slime's dtypes), options and outputs.

    Keys: ``kind`` ("tis" or "mis"), ``options``, ``per_token``, ``old``, ``rollout``, ``new``
    (float32, (B, T)), ``mask`` (int32), ``rollout_ids``, ``inside`` (the loss-mask tokens),
    ``metrics32``/``metrics64`` (what slime logs run in float32 / float64), ``weights32``,
    ``weights_rounding`` and ``keep`` at the loss-mask tokens (``weights32`` None without weights).
    """
    meta = json.loads((DATA / "slime.json").read_text())
    with np.load(DATA / "slime.npz") as z:
        a = {k: z[k] for k in z.files}
    names, out, s, pos, row0 = meta["metric_names"], [], 0, 0, 0
    for (B, T), batch in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        arrays = {k: a[k][pos : pos + B * T].reshape(B, T) for k in ("old", "rollout", "new", "mask")}
        ids = a["rollout_ids"][row0 : row0 + B]
        pos, row0 = pos + B * T, row0 + B
        for setting in batch["settings"]:

            def cut(key, s=s):
                lo, hi = a[f"{key}_offsets"][s : s + 2]
                return a[key][lo:hi]

            row = {
                "kind": setting["kind"],
                "options": setting["options"],
                "per_token": batch["per_token"],
                **arrays,
                "rollout_ids": ids,
                "inside": arrays["mask"] > 0,
                "metrics32": {k: v for k, v in zip(names, a["metrics32"][s].tolist(), strict=True) if v == v},
                "metrics64": {k: v for k, v in zip(names, a["metrics64"][s].tolist(), strict=True) if v == v},
                "keep": cut("keep"),
                "weights32": cut("weights32") if setting["weights"] else None,
                "weights_rounding": cut("weights_rounding"),
            }
            out.append(row)
            s += 1
    assert s == len(a["metrics32"])
    return out


@pytest.fixture(scope="session")
def slime_settings():
    """Return the slime settings (:func:`load_slime_settings`), read once."""
    return load_slime_settings()


@pytest.fixture(scope="session")
def slime_check():
    """Return :func:`check_against_slime`."""
    return check_against_slime


def fraction_names(metrics) -> list[str]:
    """Return the names of the fractions (counts over counts) among slime's logged ``metrics``."""
    return [k for k in metrics if "fraction" in k or k == "tis_clipfrac"]


def check_against_slime(got: dict, row: dict, weights=None, keep=None) -> dict[str, float]:
    """Assert the mirror's output is slime's: fractions exact, values within slime's own float32 rounding.

    A fraction (``*fraction*``, ``tis_clipfrac``) is a count over a count: it must equal slime's
    (``==``), which divides its counts in float32 whatever the inputs (``rollout_mask_sums`` is
    float32, the flags ``.int()`` or ``.float()``), in its float32 run and, where that run made
    the same bound decisions (the same counts), in its float64 run. Any other value must lie
    within twice slime's own rounding (its float64 run against its float32 run) plus two float32
    roundings, and, where slime's float64 run made the same decisions, equal it to 1e-9; so must
    the (B, T) ``weights`` at the loss-mask tokens, and ``keep`` (the rejection mask) must be
    slime's exactly. Returns each metric's relative difference from slime's float32 value.
    """
    inside = row["inside"]
    if keep is not None:
        np.testing.assert_array_equal(keep[inside] > 0, row["keep"] > 0)
    if weights is not None:
        w32 = row["weights32"].astype(np.float64)
        tol = 2 * row["weights_rounding"].astype(np.float64) + F32_ROUNDING * np.abs(w32)
        assert np.all(np.abs(weights[inside] - w32) <= tol), row["options"]
    want, want64 = row["metrics32"], row["metrics64"]
    assert set(got) == set(want), set(got) ^ set(want)
    fractions = fraction_names(want)
    same_counts = all(want64[k] == want[k] for k in fractions)
    diffs = {}
    for k, v in want.items():
        if k in fractions:
            assert got[k] == v, (k, got[k], v, row["options"])
            if same_counts:
                assert got[k] == want64[k], (k, got[k], want64[k], row["options"])
        else:
            tol = 2 * abs(want64[k] - v) + F32_ROUNDING * abs(v)
            assert abs(got[k] - v) <= tol, (k, got[k], v, want64[k], row["options"])
        if same_counts and k not in fractions:  # slime in float64 made the same bound decisions
            assert got[k] == pytest.approx(want64[k], rel=1e-9, abs=1e-12), (k, row["options"])
        diffs[k] = abs(got[k] - v) / abs(v) if v else abs(got[k])
    return diffs
