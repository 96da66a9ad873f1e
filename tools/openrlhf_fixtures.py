"""Write the fixtures that pin variance_lab.frameworks.openrlhf to OpenRLHF's own ``PolicyLoss``.

OpenRLHF needs DeepSpeed, vLLM and Ray to install, but its policy loss needs only torch. Run it
with torch and a checkout of OpenRLHF/OpenRLHF at commit 3c3be62::

    git clone https://github.com/OpenRLHF/OpenRLHF /tmp/openrlhf && git -C /tmp/openrlhf checkout 3c3be62
    python tools/openrlhf_fixtures.py /tmp/openrlhf tests/data/frameworks

(The committed fixtures were written that way with torch 2.13.0+cpu, from the files of the
snapshot 3c3be6234e0cb353e76bb8019947db9dfe99fca7; their SHA-256 are in ``openrlhf.json``.)

What runs, verbatim: ``aggregate_loss`` and the class ``PolicyLoss`` of
``openrlhf/models/loss.py`` and ``masked_mean`` of ``openrlhf/models/utils.py``, each one's own
text cut out of its module (``utils.py`` imports DeepSpeed) and executed. ``PolicyLoss.forward``
returns ``(loss, clip_ratio, ppo_kl, vllm_kl)``; its locals ``ratio``, ``vllm_is`` and
``seq_mask`` are read as it returns (``sys.setprofile``), and the per-token coefficient is
``vllm_is`` (``icepop``: already times its mask) or ``vllm_is * seq_mask`` (``seq-mask-tis``, as
the loss line 213 multiplies them).

Each of 36 random batches (1 to 6 rows of 1 to 24 tokens, padding garbage, fully masked rows,
rows of 1 or 2 identical tokens so that a geometric mean lies exactly at a bound, tokens whose
ratio is exactly a threshold or a clip bound in the batch's dtype) takes an action-mask dtype in
turn (int64, as ``samples_generator.py:260-267`` builds it, bool, float32, float64) and a
log-prob dtype: float32 (two batches in three, as ``samples_generator.py:271`` builds the
rollout log-probs) or float64. Each runs 8 settings (the three correction types at the default
[0.5, 5], one at a random threshold, ``gspo`` with and without the correction, ``ppo`` without
it, ``ppo`` with asymmetric clips). A float32 batch runs again in float64 (the same inputs cast
up) and in float32 with its rows permuted: OpenRLHF's own rounding. ``openrlhf.npz`` holds the
inputs (raveled, concatenated; ``shapes`` gives (B, T)), per setting the coefficients and ratios
at the mask's tokens, and the three scalars of each run (NaN where ``vllm_kl`` is None).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Optional

import numpy as np
from fixture_files import checkout_args, exec_definitions, file_shas, write_fixtures

COMMIT = "3c3be6234e0cb353e76bb8019947db9dfe99fca7"
LOSS, UTILS = "openrlhf/models/loss.py", "openrlhf/models/utils.py"
N_BATCHES = 36
PAD_OLD, PAD_ROLLOUT, PAD_NEW = 3.0, -40.0, 1.5  # finite, as OpenRLHF's padding is, but far off
MASK_DTYPES = ("int64", "bool", "float32", "float64")
THRESHOLDS = ((0.0, 2.0), (0.9, 1.1), (0.8, 1.25), (1.0, 1.0), (2.0, 0.5), (0.5, 5.0))
SCALARS = ("clip_ratio", "ppo_kl", "vllm_kl")


def load_openrlhf(root: Path) -> tuple[dict, dict]:
    """Return OpenRLHF's functions executed from the checkout's text, and the files' SHA-256."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    ns: dict = {"torch": torch, "dist": dist, "nn": nn, "F": F, "Optional": Optional, "Tuple": tuple}
    exec_definitions(root / UTILS, ("masked_mean",), ns)
    exec_definitions(root / LOSS, ("aggregate_loss", "PolicyLoss"), ns, ast.FunctionDef | ast.ClassDef)
    shas = file_shas(root, (LOSS, UTILS))
    return ns, shas


def _exp(x, dtype) -> float:
    """e^x in ``dtype`` (float32: the correctly rounded value, as torch's exp almost always is)."""
    return float(dtype(np.exp(np.float64(x)))) if dtype is np.float32 else float(np.exp(x))


def at_bound(rng, bound: float, dtype) -> tuple:
    """Return (a, b) in ``dtype`` with e^(a - b) == bound in ``dtype`` (a - b taken in ``dtype``).

    Where no difference of two ``dtype`` numbers has that exponential (float64 above 1: the grid
    of x is coarser than that of e^x), the pair whose exponential is nearest.
    """
    target, best, gap = dtype(bound), None, np.inf
    for _ in range(50):
        b = dtype(-rng.uniform(0.01, 3.0))
        a0 = dtype(np.float64(b) + np.log(bound))
        for k in range(-64, 65):
            a = dtype(a0 + dtype(k) * np.spacing(a0)) if k else a0
            g = abs(_exp(dtype(a - b), dtype) - float(target))
            if g == 0:
                return a, b
            if g < gap:
                best, gap = (a, b), g
    return best


def make_batch(rng: np.random.Generator, dtype, bounds: list[float]) -> dict:
    """One micro-batch: (B, T) rollout, old and new log-probs, advantages in ``dtype``; a 0/1 mask."""
    B = int(rng.integers(1, 7))
    lengths = rng.integers(1, 25, size=B)
    for i in np.flatnonzero(rng.random(B) < 0.3):  # rows of 1 or 2 identical tokens
        lengths[i] = rng.integers(1, 3)
    T = int(lengths.max())
    shape = (B, T)
    mask = np.arange(T)[None, :] < lengths[:, None]
    mask &= (rng.random(shape) < 0.9) | (np.arange(T)[None, :] == 0)
    for i in np.flatnonzero(rng.random(B) < 0.12):
        mask[i] = False
    scale = rng.choice([0.02, 0.3, 1.0])
    rollout = -rng.exponential(1.0, shape)
    old = rollout + rng.standard_t(3.0, shape) * scale
    new = old + rng.normal(0.0, 0.1, shape) * rng.choice([0.1, 1.0, 3.0])
    rollout, old, new = (x.astype(dtype) for x in (rollout, old, new))
    for i, j in zip(*np.nonzero(rng.random(shape) < 0.15), strict=True):  # ratios exactly at a bound
        a, b = at_bound(rng, float(rng.choice(bounds)), dtype)
        which = rng.integers(3)
        if which == 0:  # old / rollout: the vLLM correction's ratio
            old[i, j], rollout[i, j] = a, b
        elif which == 1:  # new / old: the PPO ratio
            new[i, j], old[i, j] = a, b
        else:  # new / rollout: GSPO's ratio with the correction
            new[i, j], rollout[i, j] = a, b
    for i in np.flatnonzero(lengths <= 2):  # identical tokens: the mean log-ratio is the token's
        for x in (rollout, old, new):
            x[i, 1:] = x[i, 0]
    adv = np.repeat(rng.choice([1.0, -1.0, 0.0, 0.5, -0.37], B)[:, None], T, axis=1)
    if rng.random() < 0.3:
        adv = rng.choice([1.0, -1.0, 0.0, 0.25], shape)
    pad = ~(np.arange(T)[None, :] < lengths[:, None])
    rollout[pad], old[pad], new[pad] = PAD_ROLLOUT, PAD_OLD, PAD_NEW
    return {"rollout": rollout, "old": old, "new": new, "adv": adv.astype(dtype), "mask": mask}


def run_setting(ns, batch: dict, setting: dict, torch_dtype, mask_dtype, perm=None) -> dict:
    """PolicyLoss(**options).forward on the batch in ``torch_dtype``: its scalars and locals."""
    import torch

    rows = slice(None) if perm is None else perm

    def t(key):
        return torch.from_numpy(np.ascontiguousarray(batch[key][rows])).to(torch_dtype)

    mask = torch.from_numpy(np.ascontiguousarray(batch["mask"][rows])).to(getattr(torch, mask_dtype))
    locals_: dict = {}

    def profile(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "forward" and "advantages" in frame.f_locals:
            locals_.update({k: frame.f_locals.get(k) for k in ("ratio", "vllm_is", "seq_mask")})

    loss_fn = ns["PolicyLoss"](**setting)
    sys.setprofile(profile)
    try:
        with torch.no_grad():
            _, clip_ratio, ppo_kl, vllm_kl = loss_fn(
                t("new"), t("old"), t("adv"), action_mask=mask, rollout_log_probs=t("rollout")
            )
    finally:
        sys.setprofile(None)
    scalars = [float(clip_ratio), float(ppo_kl), float("nan") if vllm_kl is None else float(vllm_kl)]
    inside = batch["mask"][rows]
    coef = locals_["vllm_is"]
    if coef is not None and locals_["seq_mask"] is not None:
        coef = locals_["seq_mask"].unsqueeze(-1) * coef
    ratio = torch.broadcast_to(locals_["ratio"], inside.shape)
    return {
        "scalars": scalars,
        "ratio": ratio.double().numpy()[inside],
        "coef": None if coef is None else coef.double().numpy()[inside],
    }


def settings_for(rng) -> list[dict]:
    """Return the batch's 8 PolicyLoss settings."""
    on = {"enable_vllm_is_correction": True}
    lo_hi = THRESHOLDS[int(rng.integers(len(THRESHOLDS)))]
    kind = str(rng.choice(["tis", "icepop", "seq-mask-tis"]))
    gspo_eps = {"clip_eps_low": 3e-4, "clip_eps_high": 4e-4}
    return [
        {**on, "vllm_is_truncated_threshold": [0.5, 5.0], "vllm_is_correction_type": "tis"},
        {**on, "vllm_is_truncated_threshold": [0.5, 5.0], "vllm_is_correction_type": "icepop"},
        {**on, "vllm_is_truncated_threshold": [0.5, 5.0], "vllm_is_correction_type": "seq-mask-tis"},
        {**on, "vllm_is_truncated_threshold": list(lo_hi), "vllm_is_correction_type": kind},
        {**on, **gspo_eps, "policy_loss_type": "gspo", "vllm_is_truncated_threshold": [0.5, 5.0]},
        {**gspo_eps, "policy_loss_type": "gspo"},
        {},
        {"clip_eps_low": 0.2, "clip_eps_high": 0.28},
    ]


def main(argv=None) -> int:
    """Write openrlhf.npz and openrlhf.json; print their sizes."""
    import torch

    args = checkout_args(__doc__, "openrlhf", "a checkout of OpenRLHF/OpenRLHF at 3c3be62", argv)
    ns, shas = load_openrlhf(args.openrlhf)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260901)))
    inputs: dict[str, list] = {k: [] for k in ("rollout", "old", "new", "adv", "mask")}
    out: dict[str, list] = {k: [] for k in ("coef", "ratio", "scalars", "scalars64", "scalars_perm")}
    shapes, batches, coef_at, ratio_at = [], [], 0, 0
    for b in range(N_BATCHES):
        dtype = np.float64 if b % 3 == 2 else np.float32
        mask_dtype = MASK_DTYPES[b % len(MASK_DTYPES)]
        settings = settings_for(rng)
        bounds = [0.5, 5.0, 0.8, 1.2, 1.28, 1 - 3e-4, 1 + 4e-4]
        bounds += [x for s in settings for x in s.get("vllm_is_truncated_threshold", ()) if x > 0]
        batch = make_batch(rng, dtype, bounds)
        shapes.append(batch["mask"].shape)
        for k in inputs:
            inputs[k].append(batch[k].astype(np.float64 if k != "mask" else np.uint8).ravel())
        perm = rng.permutation(batch["mask"].shape[0])
        tdt = torch.float32 if dtype is np.float32 else torch.float64
        meta = []
        for setting in settings:
            got = run_setting(ns, batch, setting, tdt, mask_dtype)
            got64 = run_setting(ns, batch, setting, torch.float64, mask_dtype)
            perm_run = run_setting(ns, batch, setting, tdt, mask_dtype, perm)
            out["scalars"].append(got["scalars"])
            out["scalars64"].append(got64["scalars"])
            out["scalars_perm"].append(perm_run["scalars"])
            out["ratio"].append(got["ratio"])
            ratio_at += got["ratio"].size
            if got["coef"] is not None:
                out["coef"].append(got["coef"])
                coef_at += got["coef"].size
            meta.append({"options": setting, "coef": got["coef"] is not None})
        batches.append({"dtype": np.dtype(dtype).name, "mask_dtype": mask_dtype, "settings": meta})
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    arrays.update({k: np.concatenate(out[k]) for k in ("coef", "ratio")})
    arrays.update({k: np.array(out[k], dtype=np.float64) for k in ("scalars", "scalars64", "scalars_perm")})
    meta = {
        "padding": {"old": PAD_OLD, "rollout": PAD_ROLLOUT, "new": PAD_NEW},
        "scalars": list(SCALARS),
        "batches": batches,
    }
    write_fixtures(args.out, "openrlhf", COMMIT, shas, arrays, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
