"""AReaL's M2PO mirror against AReaL's own functions (inclusionAI/AReaL 4aef98d) and cases by hand.

AReaL needs its training stack; ``_apply_m2po_masking`` and ``_get_m2po_loss_mask`` run with
torch alone wrote ``tests/data/frameworks/areal.*`` (``tools/areal_fixtures.py``): float32 and
float64 log-probs, bool, int64 and float32 loss masks, dyadic log-ratios whose squares tie,
thresholds equal to a running mean as AReaL computes it.
"""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from variance_lab.corrections import M2PO_RULE, batch_mask
from variance_lab.frameworks import areal

DATA = Path(__file__).resolve().parents[1] / "data" / "frameworks"


def _settings():
    """One dict per (batch, threshold) AReaL ran: inputs in its dtypes and the mask it returned."""
    meta = json.loads((DATA / "areal.json").read_text())
    with np.load(DATA / "areal.npz") as z:
        a = {k: z[k] for k in z.files}
    out, pos, kpos = [], 0, 0
    for (B, T), b in zip(a["shapes"].tolist(), meta["batches"], strict=True):
        dt = np.dtype(b["dtype"])
        row = {k: a[k][pos : pos + B * T].reshape(B, T).astype(dt) for k in ("old", "prox")}
        row["mask"] = a["mask"][pos : pos + B * T].reshape(B, T).astype(b["mask_dtype"])
        pos += B * T
        for tau in b["thresholds"]:
            kept = a["kept"][kpos : kpos + B * T].reshape(B, T) > 0
            kpos += B * T
            out.append({**row, "dtype": dt, "tau": tau, "kept": kept})
    assert kpos == a["kept"].size
    return out


SETTINGS = _settings()


def _masked_per_value(kept, row) -> dict[float, int]:
    """How many loss-mask tokens of each y^2 value are masked."""
    inside = np.asarray(row["mask"]) != 0
    y = row["old"] - row["prox"]
    y2 = (y * y)[inside & ~kept]
    values, counts = np.unique(y2, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist(), strict=True))


def test_m2po_mask_equals_areals_own():
    """240 settings: the tokens masked are AReaL's, exactly, ties at the cut included.

    AReaL orders the squares by ``torch.sort(descending=True)``, which keeps ties in order of
    appearance on a CPU only up to 16 values; the mirror takes torch's own order
    (``frameworks.batch.sort_descending``). Without torch it keeps the order of appearance: then
    only the number masked of each y^2 value is AReaL's where squares tie.
    """
    assert len(SETTINGS) == 240
    with_torch = importlib.util.find_spec("torch") is not None
    masked = tied = 0
    for row in SETTINGS:
        got, stats = areal.m2po_loss_mask(row["old"], row["prox"], row["mask"], row["tau"])
        inside = np.asarray(row["mask"]) != 0
        y = (row["old"] - row["prox"])[inside]
        assert stats["n_valid_tokens"] == row["kept"].sum()
        assert _masked_per_value(got, row) == _masked_per_value(row["kept"], row)
        if with_torch or np.unique(y * y).size == y.size:
            np.testing.assert_array_equal(got, row["kept"])
        rule = areal.M2PO_F32_RULE if row["dtype"] == np.float32 else M2PO_RULE
        appearance = ~batch_mask(y, row["tau"], rule)  # ties in order of appearance
        tied += int((appearance != row["kept"][inside]).any())
        masked += int((inside & ~row["kept"]).sum())
    assert masked > 1000
    assert tied > 0  # teeth: ties at the cut where torch's order is not the order of appearance


def test_float32_running_means_decide_as_areal():
    """Teeth: at thresholds equal to a float32 running mean the float64 rule keeps other counts than AReaL."""
    differs = 0
    for row in SETTINGS:
        if row["dtype"] != np.float32:
            continue
        inside = np.asarray(row["mask"]) != 0
        y = (row["old"] - row["prox"])[inside].astype(np.float64)
        if not y.size:
            continue
        keep64 = ~batch_mask(y, row["tau"], M2PO_RULE)
        differs += int(keep64.sum() != row["kept"].sum())
    assert differs > 0


def test_m2po_by_hand():
    """Squares 1/16, 1/4, 1, 1/64: running means 1/64, 5/128, 7/64, 85/256; tau = 7/64 keeps two."""
    old = np.array([[0.25, 0.5, -1.0, 0.125, 9.0]])
    prox = np.zeros_like(old)
    mask = np.array([[1, 1, 1, 1, 0]])
    kept, stats = areal.m2po_loss_mask(old, prox, mask, 7 / 64)  # 7/64 is not < 7/64
    assert kept.tolist() == [[True, False, False, True, False]]
    assert stats["n_valid_tokens"] == 2.0
    assert stats["m2po_masked"] == 2.0
    assert stats["old_logp/avg"] == 0.1875
    assert stats["m2"] == 5 / 128
    kept, _ = areal.m2po_loss_mask(old, prox, mask, math.nextafter(7 / 64, 1))  # now below: three kept
    assert kept.sum() == 3
    kept, _ = areal.m2po_loss_mask(old.astype(np.float32), prox.astype(np.float32), mask, 7 / 64)
    assert kept.sum() == 2  # the same in float32 (all exact)
    kept, _ = areal.m2po_loss_mask(old, prox, mask, 0.0)  # nothing below: the smallest alone
    assert kept.tolist() == [[False, False, False, True, False]]
    kept, stats = areal.m2po_loss_mask(old, prox, np.zeros_like(mask), 0.1)  # no loss token: unchanged
    assert not kept.any()
    assert math.isnan(stats["old_logp/avg"])


@pytest.mark.parametrize(("tau", "needle"), [(math.nan, "nan"), ("0.1", "'0.1'"), (True, "True")])
def test_bad_threshold_names_the_value(tau, needle):
    """A threshold that is not a number: ValueError naming it."""
    with pytest.raises(ValueError, match=needle):
        areal.m2po_loss_mask(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), tau)
