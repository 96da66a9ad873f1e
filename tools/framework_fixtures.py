"""Write the fixtures that pin variance_lab.frameworks to the frameworks' own code.

Run it in a scratch environment that has the released frameworks, outside the repository::

    python -m venv /tmp/fwenv
    /tmp/fwenv/bin/pip install torch==2.13.0 trl==1.16.0 verl==0.9.1   # CPU-only is enough
    /tmp/fwenv/bin/python tools/framework_fixtures.py tests/data/frameworks

(The committed fixtures were written that way, except that torch 2.13.0+cpu came from the
project's own environment through a ``.pth`` file; verl then installs ray, tensordict,
transformers 5.10 and the rest, about 0.7 GB beside torch, and imports without a GPU.)

It generates one padded batch (ragged lengths 4 to 800, holes in the mask, an empty row,
heavy-tailed token log-ratios with a few |log r| = 3 spikes, padding filled with values that
would change every result if they were read), runs verl's ``compute_rollout_correction_and_rejection_mask``
and ``compute_offpolicy_metrics`` and TRL's ``GRPOTrainer.get_off_policy_mask`` and
``GRPOTrainer.get_gamma_weights`` on it in float64 for a list of settings, and writes, per
framework, ``<name>.npz`` (inputs, outputs at the valid positions) and ``<name>.json`` (the
settings, the metrics, the versions). The default tests (``tests/frameworks/test_*.py``) compare the
NumPy mirrors with them to 1e-9 relative. Nothing of the frameworks is stored but their outputs.

``verl_dtypes.*`` (:func:`run_verl_dtypes`) runs verl on the dtypes its batches really carry:
float32 log-probs with an int64 or bool ``response_mask``, and float64 log-probs with an int64
mask, on the same batch plus rows exactly at the settings' bounds and one ulp either side and a
second empty row, and on a small batch whose log-ratios overflow float32's exp. It records
verl's files (sha256 of ``rollout_corr_helper.py`` and ``torch_functional.py`` of the installed
wheel), and for float32 verl's own rounding of every value (the largest change over
permutations of the rows and of the positions, and with another exp), from which the tests
take their tolerance. Written with ``--only verl_dtypes`` on the 2-core AMD EPYC machine (torch
2.13.0+cpu, AVX512, verl 0.9.1 from PyPI), in about 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

#: Sequence lengths of the batch (0: a row without tokens).
LENGTHS = (4, 5, 7, 0, 11, 16, 23, 32, 45, 64, 90, 128, 181, 256, 362, 512, 800, 6)
PAD_OLD, PAD_ROLLOUT = -7.5, 1.25  # padding values: read anywhere, they would move every result

#: verl settings: keyword arguments of compute_rollout_correction_and_rejection_mask.
VERL_CASES = {
    "is_token_tis": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    "is_token_tis_1.1": {"rollout_is": "token", "rollout_is_threshold": 1.1},
    "is_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5"},
    "is_token_icepop_narrow": {"rollout_is": "token", "rollout_is_threshold": "0.95_1.02"},
    "is_sequence_tis": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "is_sequence_icepop": {"rollout_is": "sequence", "rollout_is_threshold": "0.5_1.5"},
    "is_token_norm": {
        "rollout_is": "token",
        "rollout_is_threshold": 1.05,
        "rollout_is_batch_normalize": True,
    },
    "is_sequence_norm": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 3.0,
        "rollout_is_batch_normalize": True,
    },
    "rs_token_k1_asym": {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.9_1.5"},
    "rs_token_k1_single": {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.02},
    "rs_token_k2": {"rollout_rs": "token_k2", "rollout_rs_threshold": 1e-3},
    "rs_token_k3": {"rollout_rs": "token_k3", "rollout_rs_threshold": 1e-3},
    "rs_seq_sum_k1": {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.4_1.5"},
    "rs_seq_sum_k2": {"rollout_rs": "seq_sum_k2", "rollout_rs_threshold": 0.5},
    "rs_seq_sum_k3": {"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": 0.5},
    "rs_seq_mean_k1": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.02"},
    "rs_seq_mean_k2": {"rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 1e-3},
    "rs_seq_mean_k3": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 1e-3},
    "rs_seq_max_k2": {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 2.0},
    "rs_seq_max_k3": {"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 2.0},
    "rs_combined": {"rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.8_1.25,1e-3"},
    "rs_shared_threshold": {"rollout_rs": "seq_max_k2, seq_max_k3,seq_max_k2", "rollout_rs_threshold": "1.0"},
    "is_and_rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_sum_k1,token_k2",
        "rollout_rs_threshold": "0.5_2,0.02",
    },
    "metrics_only": {},
}

#: TRL settings.
TRL_OFF_POLICY_THRESHOLDS = (0.0, 1e-3, 0.01)
TRL_GAMMA_CASES = {
    "default": {},
    "custom": {"k_pos": 1.5, "lambda_pos": 2.0, "k_neg": 4.0, "lambda_neg": 0.5},
    "float32_rounding": {"k_pos": 0.3, "lambda_pos": 0.0, "k_neg": 2.7, "lambda_neg": 1.1},
}


def make_batch(seed: int = 20261202) -> dict[str, np.ndarray]:
    """Return the batch: log-probs (B, T), mask (B, T), advantages (B, 1), all float64."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    B, T = len(LENGTHS), max(LENGTHS)
    mask = np.zeros((B, T))
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    holes = (rng.random((B, T)) < 0.05) & (mask > 0)
    holes[:, 0] = False  # every non-empty row keeps a token
    mask[holes] = 0.0
    rollout = -rng.exponential(1.0, (B, T))
    y = 0.02 * rng.standard_t(3.0, (B, T))  # heavy-tailed mismatch
    spikes = rng.choice(np.flatnonzero(mask.ravel()), size=8, replace=False)
    y.ravel()[spikes] = 3.0 * rng.choice([-1.0, 1.0], size=8)
    old = rollout + y
    old[mask == 0], rollout[mask == 0] = PAD_OLD, PAD_ROLLOUT
    # round to float32 values (stored as such), so the fixtures stay small
    old, rollout = old.astype(np.float32).astype(np.float64), rollout.astype(np.float32).astype(np.float64)
    advantages = rng.standard_normal((B, 1))
    new_minus_old = 0.05 * rng.standard_t(3.0, (B, T))  # the update's log-ratio, for VESPO
    new_minus_old[mask == 0] = 0.7
    new_minus_old = new_minus_old.astype(np.float32).astype(np.float64)
    return {"old": old, "rollout": rollout, "mask": mask, "advantages": advantages, "update": new_minus_old}


def _versions(*names: str) -> dict[str, str]:
    from importlib.metadata import version

    return {n: version(n) for n in names}


def run_verl(batch: dict, out: Path) -> None:
    """Run verl's functions on the batch for every case; write verl.npz and verl.json."""
    import torch
    from verl.trainer.ppo import rollout_corr_helper as h

    t = {k: torch.tensor(batch[k], dtype=torch.float64) for k in ("old", "rollout", "mask")}
    valid = batch["mask"] > 0
    arrays, cases = {}, {}
    for name, kwargs in VERL_CASES.items():
        weights, modified, metrics = h.compute_rollout_correction_and_rejection_mask(
            t["old"], t["rollout"], t["mask"], **kwargs
        )
        cases[name] = {"kwargs": kwargs, "metrics": {k: float(v) for k, v in metrics.items()}}
        if weights is not None:
            arrays[f"{name}/weights"] = weights.batch["rollout_is_weights"].numpy()[valid]
        arrays[f"{name}/mask"] = np.packbits(modified.numpy()[valid] > 0.5)
    offpolicy = {k: float(v) for k, v in h.compute_offpolicy_metrics(t["old"], None, t["mask"]).items()}
    cases["offpolicy_no_rollout"] = {"kwargs": {}, "metrics": offpolicy}
    inputs = {k: batch[k].astype(np.float32) for k in ("old", "rollout")}
    np.savez_compressed(out / "verl.npz", **inputs, mask=batch["mask"].astype(np.uint8), **arrays)
    (out / "verl.json").write_text(
        json.dumps({"versions": _versions("verl", "torch"), "cases": cases}, indent=1, sort_keys=True) + "\n"
    )


#: The dtypes verl's batches really carry: float32 log-probs with an int64 or bool
#: ``response_mask`` (``compute_response_mask``, ``verl/trainer/ppo/ray_trainer.py:120-135``,
#: slices the tokenizer's int64 ``attention_mask``), and float64 log-probs with an int64 mask
#: (float64 arithmetic, the count + 1e-8 still float32).
VERL_DTYPE_COMBOS = (("float32", "int64"), ("float32", "bool"), ("float64", "int64"))
#: Extra cases whose bounds the extra rows of :func:`bound_rows` sit at.
VERL_BOUND_CASES = {
    "is_sequence_tis_1.1": {"rollout_is": "sequence", "rollout_is_threshold": 1.1},
    "is_token_icepop_bounds": {"rollout_is": "token", "rollout_is_threshold": "0.5_2"},
    "is_sequence_icepop_bounds": {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2"},
    "rs_k1_bounds": {"rollout_rs": "token_k1,seq_sum_k1,seq_mean_k1", "rollout_rs_threshold": "0.8_1.25"},
    "rs_k2_bounds": {
        "rollout_rs": "token_k2,seq_sum_k2,seq_mean_k2,seq_max_k2",
        "rollout_rs_threshold": "0.125,0.25,0.125,0.125",
    },
}
#: The overflow batch's cases (float32: exp overflows above 88.72).
VERL_OVERFLOW_CASES = ("metrics_only", "is_sequence_tis", "is_token_tis", "rs_seq_sum_k3")
#: Permutations of the rows and of the positions, and the other exp, that measure verl's own float32 rounding.
N_PERMUTATIONS = 3


def _torch_log32(c: float) -> float:
    """``torch.log(torch.tensor(c))``, as verl's ``compute_is_metrics`` takes it (float32)."""
    import torch

    return float(torch.log(torch.tensor(c)).item())


def _mirror_exp(x: np.ndarray) -> np.ndarray:
    """Return e^x as the mirror takes it: NumPy's in float64, the correctly rounded one in float32."""
    return np.exp(x) if x.dtype == np.float64 else np.exp(x.astype(np.float64)).astype(np.float32)


def bound_rows(dtype: str) -> np.ndarray:
    r"""Return log-ratios at verl's bounds and one ulp either side: (n, 2) of ``dtype``, NaN = no token.

    Log space (the sequence metrics' :math:`\log C`, the k1 bounds): :math:`y` at the bound as
    verl compares it and one ulp of ``dtype`` either side. For :math:`C` = 2 and 1.1 and their
    reciprocals, the bound is ``torch.log`` of a float32 tensor (``compute_is_metrics``) and, for
    the k1 options of ``"0.8_1.25"``, ``math.log`` (:math:`-y = \log 0.8, \log 1.25`); in float64
    also the midpoints between ``torch.log``'s float32 and ``math.log``'s float64 value. Linear
    space (the weights against :math:`C`): :math:`y = \log c` for :math:`c = C` and the
    neighbours of :math:`C` in ``dtype``, so that :math:`e^y` is :math:`C` or one ulp of it away.
    Then :math:`y = \pm 0.5` (:math:`k_2 = 0.125`) and one ulp beyond, 0, and the two-token row
    :math:`(0.5, -0.5)` (``seq_sum_k2`` 0.25, ``seq_mean_k2`` and ``seq_max_k2`` 0.125).

    A row whose :math:`e^y` differs between torch and the mirror's exp (:func:`_mirror_exp`) is
    left out: there the exp implementation decides which side of a bound a weight falls, and
    verl's own answer changes with it (torch's float32 exp is not correctly rounded on about
    1 % of inputs; on a GPU it is CUDA's). The rows left out are printed.
    """
    import torch

    dt = np.dtype(dtype)
    up, down = dt.type(np.inf), dt.type(-np.inf)
    centres = []
    for c in (2.0, 1.1):
        for b in (c, 1.0 / c):
            l32, l64 = _torch_log32(b), math.log(b)
            centres += [l32, l64]
            if dt == np.float64 and l32 != l64:
                centres.append(0.5 * (l32 + l64))
    for b in (0.8, 1.25):
        centres += [-math.log(b), -float(np.float32(math.log(b)))]
    centres += [0.5, -0.5]
    ys = set()
    for c in centres:
        v = dt.type(c)
        ys.update({float(v), float(np.nextafter(v, up)), float(np.nextafter(v, down))})
    for c in (2.0, 1.1, 0.5, 1.0 / 1.1):
        b = dt.type(c)
        ys.update(float(dt.type(math.log(float(v)))) for v in (b, np.nextafter(b, up), np.nextafter(b, down)))
    ys.add(0.0)
    y = np.array(sorted(ys), dtype=dt)
    ambiguous = torch.exp(torch.tensor(y)).numpy() != _mirror_exp(y)
    if ambiguous.any():
        print(
            f"bound rows left out ({dtype}: torch's exp differs from the mirror's): {y[ambiguous].tolist()}"
        )
    rows = [[v, np.nan] for v in y[~ambiguous]] + [[0.5, -0.5]]
    return np.array(rows, dtype=dt)


def assemble(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, bounds: np.ndarray):
    """Return (old, rollout, mask): the base rows, the bound rows padded to T, and one more empty row.

    A bound row's log-ratio ``y`` is ``old - rollout`` exactly: ``old = y, rollout = 0`` for
    ``y < 0`` and ``old = 0, rollout = -y`` otherwise. Padding holds ``PAD_OLD``/``PAD_ROLLOUT``.
    """
    dt = bounds.dtype
    T = old.shape[1]
    nb = bounds.shape[0] + 1
    b_old, b_roll = np.full((nb, T), PAD_OLD, dtype=dt), np.full((nb, T), PAD_ROLLOUT, dtype=dt)
    b_mask = np.zeros((nb, T), dtype=np.uint8)
    for i, row in enumerate(bounds):
        for j, y in enumerate(row):
            if not np.isnan(y):
                b_old[i, j], b_roll[i, j], b_mask[i, j] = (y, 0.0, 1) if y < 0 else (0.0, -y, 1)
    return (
        np.vstack([old.astype(dt), b_old]),
        np.vstack([rollout.astype(dt), b_roll]),
        np.vstack([mask.astype(np.uint8), b_mask]),
    )


def overflow_batch() -> dict[str, np.ndarray]:
    """Return a float32 batch whose log-ratios overflow float32's exp (above 88.72).

    ``k3_kl`` and the sequence ``rollout_is_min`` are inf in float32, finite in float64.
    """
    y = np.array(
        [[95.0, 0.1, -0.2, 0.0], [40.0, 45.0, 30.0, 0.0], [50.0, 60.0, 0.0, 0.0], [100.0, 1.0, 0.0, 0.0]]
    )
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=np.uint8)
    rollout = np.where(mask > 0, -y - 1.0, PAD_ROLLOUT).astype(np.float32)
    old = np.where(mask > 0, -1.0, PAD_OLD).astype(np.float32)
    return {"old": old, "rollout": rollout, "mask": mask}


def _verl_call(h, old, rollout, mask, kwargs):
    """Return (weights or None, mask, metrics) of verl on torch tensors, as NumPy and floats."""
    w, modified, metrics = h.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **kwargs)
    w = None if w is None else w.batch["rollout_is_weights"].numpy().copy()
    return w, modified.numpy().copy(), {k: float(v) for k, v in metrics.items()}


def _spread(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def _up(v: float) -> float:
    """Return ``v`` to 4 significant digits, rounded up (a tolerance, kept short)."""
    return v if not math.isfinite(v) else float(f"{v * 1.001:.4g}")


def _other_exp():
    """Return a context in which torch.exp of a float32 tensor is the correctly rounded one (via float64)."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def ctx():
        orig = torch.exp

        def exp(x, *args, **kw):
            return (
                orig(x.double(), *args, **kw).to(x.dtype)
                if x.dtype == torch.float32
                else orig(x, *args, **kw)
            )

        torch.exp = exp
        try:
            yield
        finally:
            torch.exp = orig

    return ctx()


def run_verl_case(h, old, rollout, mask, kwargs, perturb: bool) -> dict:
    """Run one case; with ``perturb``, also measure verl's own float32 rounding.

    The rounding of a metric is the largest absolute change over ``N_PERMUTATIONS`` permutations
    of the batch's rows, as many of its positions (the same for every row: each sequence's sum
    taken in another order), and one run with a correctly rounded float32 exp; that of the
    weights the largest relative change of a weight. None of these changes verl's answer in
    exact arithmetic.
    """
    w, modified, metrics = _verl_call(h, old, rollout, mask, kwargs)
    out = {"weights": w, "mask": modified, "metrics": metrics}
    if not perturb:
        return out
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20261207)))
    runs = []
    for axis in (0, 1):  # rows (the batch's order), positions (each sequence's order of summation)
        for _ in range(N_PERMUTATIONS):
            perm = rng.permutation(old.shape[axis])
            inv = np.argsort(perm)
            idx = (perm, slice(None)) if axis == 0 else (slice(None), perm)
            back = (inv, slice(None)) if axis == 0 else (slice(None), inv)
            pw, pm, pmet = _verl_call(h, old[idx], rollout[idx], mask[idx], kwargs)
            runs.append((None if pw is None else pw[back], pm[back], pmet))
    with _other_exp():
        runs.append(_verl_call(h, old, rollout, mask, kwargs))
    spreads = {k: max(_spread(v, r[2][k]) for r in runs) for k, v in metrics.items()}
    out["rounding"] = {k: _up(v) for k, v in spreads.items() if v > 0}  # absent: 0
    if w is not None:
        valid = mask.numpy() != 0
        rel = [np.max(np.abs(r[0][valid] - w[valid]) / np.maximum(np.abs(w[valid]), 1e-30)) for r in runs]
        out["weights_rounding"] = _up(float(max(rel)))
    return out


def run_verl_dtypes(batch: dict, out: Path) -> None:
    """Run verl on the dtypes real batches carry; write verl_dtypes.npz and verl_dtypes.json.

    For each (log-prob dtype, mask dtype) of ``VERL_DTYPE_COMBOS``: the batch of
    :func:`make_batch` plus :func:`bound_rows` and an empty row, every case of ``VERL_CASES`` and
    ``VERL_BOUND_CASES``; for float32 log-probs also the :func:`overflow_batch`. Stored: the metrics,
    the weights at the valid positions (in verl's dtype), the modified masks (bits) and, for
    float32, verl's own rounding (:func:`run_verl_case`).
    """
    import hashlib

    import torch
    import verl
    from verl.trainer.ppo import rollout_corr_helper as h

    root = Path(verl.__file__).parent
    files = ("trainer/ppo/rollout_corr_helper.py", "utils/torch_functional.py")
    source = {f"verl/{f}": hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}
    base = {k: batch[k].astype(np.float32) for k in ("old", "rollout")}
    arrays = {**{f"base/{k}": v for k, v in base.items()}, "base/mask": batch["mask"].astype(np.uint8)}
    ov = overflow_batch()
    arrays.update({f"overflow/{k}": v for k, v in ov.items()})
    combos = {}
    for lp, mk in VERL_DTYPE_COMBOS:
        tdt, tmk = getattr(torch, lp), getattr(torch, mk)
        bounds = bound_rows(lp)
        arrays[f"bounds/{lp}"] = bounds
        batches = {"main": assemble(base["old"], base["rollout"], batch["mask"], bounds)}
        if lp == "float32":
            batches["overflow"] = (ov["old"], ov["rollout"], ov["mask"])
        entry = {}
        for bname, (o, r, m) in batches.items():
            t_old, t_roll = torch.tensor(o, dtype=tdt), torch.tensor(r, dtype=tdt)
            t_mask = torch.tensor(m).to(tmk)
            valid = m != 0
            cases = (
                {**VERL_CASES, **VERL_BOUND_CASES}
                if bname == "main"
                else {c: VERL_CASES[c] for c in VERL_OVERFLOW_CASES}
            )
            for name, kwargs in cases.items():
                res = run_verl_case(h, t_old, t_roll, t_mask, kwargs, perturb=lp == "float32")
                key = f"{lp}/{mk}/{bname}/{name}"
                assert res["mask"].dtype == m.astype(mk).dtype, (key, res["mask"].dtype)
                if res["weights"] is not None:
                    arrays[f"{key}/weights"] = res["weights"][valid]
                arrays[f"{key}/mask"] = np.packbits(res["mask"][valid] != 0)
                entry[f"{bname}/{name}"] = {
                    "kwargs": kwargs,
                    "metrics": res["metrics"],
                    **({"rounding": res["rounding"]} if "rounding" in res else {}),
                    **({"weights_rounding": res["weights_rounding"]} if "weights_rounding" in res else {}),
                }
        combos[f"{lp}/{mk}"] = entry
    thresholds = sorted({2.0, 0.5, 1.1, 1.0 / 1.1, 1.05, 1.0 / 1.05, 3.0, 1.0 / 3.0, 1.5, 1.0 / 1.5})
    meta = {
        "versions": _versions("verl", "torch"),
        "source": source,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "log32": {repr(c): _torch_log32(c) for c in thresholds},
        "assembly": "rows: base (old, rollout float32, mask), then bounds/<dtype> (y; old = y, rollout = 0 "
        "for y < 0, else old = 0, rollout = -y; NaN: no token) padded with PAD_OLD/PAD_ROLLOUT, "
        "then one empty row",
        "pad": [PAD_OLD, PAD_ROLLOUT],
        "combos": combos,
    }
    np.savez_compressed(out / "verl_dtypes.npz", **arrays)
    (out / "verl_dtypes.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def run_trl(batch: dict, out: Path) -> None:
    """Run TRL's static methods on the batch; write trl.npz and trl.json."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    old, rollout, mask = (torch.tensor(batch[k], dtype=torch.float64) for k in ("old", "rollout", "mask"))
    adv = torch.tensor(batch["advantages"], dtype=torch.float64)
    update = torch.tensor(batch["update"], dtype=torch.float64)
    arrays, cases = {}, {}
    for thr in TRL_OFF_POLICY_THRESHOLDS:
        keep = GRPOTrainer.get_off_policy_mask(adv, old, rollout, mask, thr)
        arrays[f"off_policy_mask/{thr!r}"] = keep.numpy()
    # token-level TIS ratios as TRL builds them (token_truncate, cap 3), to feed VESPO
    is_ratio = torch.clamp(torch.exp((old - rollout) * mask), max=3.0)
    for name, kwargs in TRL_GAMMA_CASES.items():
        for with_is in (False, True):
            phi = GRPOTrainer.get_gamma_weights(adv, update, mask, is_ratio if with_is else None, **kwargs)
            arrays[f"gamma/{name}/{with_is}"] = phi.numpy()
        cases[name] = kwargs
    inputs = {k: batch[k].astype(np.float32) for k in ("old", "rollout", "update")}
    np.savez_compressed(
        out / "trl.npz",
        **inputs,
        mask=batch["mask"].astype(np.uint8),
        advantages=batch["advantages"],
        **arrays,
    )
    meta = {
        "versions": _versions("trl", "torch"),
        "off_policy_thresholds": list(TRL_OFF_POLICY_THRESHOLDS),
        "gamma_cases": cases,
        "is_ratio": "clamp(exp((old - rollout) * mask), max=3)",
    }
    (out / "trl.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    """Write the fixtures; print their sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the fixtures (tests/data/frameworks)")
    parser.add_argument("--only", choices=["verl", "verl_dtypes", "trl"], help="one fixture set only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batch = make_batch()
    if args.only in (None, "verl"):
        run_verl(batch, args.out)
    if args.only in (None, "verl_dtypes"):
        run_verl_dtypes(batch, args.out)
    if args.only in (None, "trl"):
        run_trl(batch, args.out)
    for path in sorted(args.out.iterdir()):
        print(f"{path}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
