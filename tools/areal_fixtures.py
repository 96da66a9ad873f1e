"""Write the fixtures that pin variance_lab.frameworks.areal to AReaL's own M2PO functions.

AReaL needs its training stack to install, but its M2PO mask needs only torch. Run it with torch
and a checkout of inclusionAI/AReaL at commit 4aef98d::

    git clone https://github.com/inclusionAI/AReaL /tmp/areal && git -C /tmp/areal checkout 4aef98d
    python tools/areal_fixtures.py /tmp/areal tests/data/frameworks

(The committed fixtures were written that way with torch 2.13.0+cpu, from the file of the
snapshot 4aef98d8d818af55b43621aaadba047ae10f4e77; its SHA-256 is in ``areal.json``.)

What runs, verbatim: ``_apply_m2po_masking`` and ``_get_m2po_loss_mask`` of
``areal/trainer/ppo/actor.py``, their own text cut out of the module (it imports AReaL's
engine) and executed, called as ``grpo_loss_fn`` calls them (``loss_mask.bool()``, line 440).

Each of 60 random micro-batches (1 to 6 rows of 1 to 30 tokens, loss masks with holes and empty
rows, bool, int64 or float32 in turn; float32 log-probs, float64 every third batch; one in four
of dyadic log-ratios, whose squares tie and sum exactly) runs at 4 thresholds: a random one, 0,
one that no token's square exceeds, and one equal to a running mean of the batch's squares as
AReaL computes it in its dtype (the strict "<" at work). ``areal.npz`` holds the inputs (padded
(B, T) arrays raveled and concatenated; ``shapes`` gives (B, T)) and AReaL's mask after M2PO per
setting (uint8, (B, T) raveled, in the order of ``areal.json``'s thresholds).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_files import checkout_args, exec_definitions, file_shas, write_fixtures

COMMIT = "4aef98d8d818af55b43621aaadba047ae10f4e77"
ACTOR = "areal/trainer/ppo/actor.py"
WANTED = ("_apply_m2po_masking", "_get_m2po_loss_mask")
N_BATCHES = 60
MASK_DTYPES = ("bool", "int64", "float32")


def load_areal(root: Path) -> tuple[dict, str]:
    """Return AReaL's two functions executed from the checkout's text, and the file's SHA-256."""
    import torch

    ns: dict = {"torch": torch}
    exec_definitions(root / ACTOR, WANTED, ns)
    return ns, file_shas(root, (ACTOR,))[ACTOR]


def make_batch(rng, dtype) -> dict:
    """One micro-batch: (B, T) old and proximal log-probs in ``dtype``, a bool 0/1 mask."""
    B = int(rng.integers(1, 7))
    lengths = rng.integers(1, 31, size=B)
    T = int(lengths.max())
    mask = (np.arange(T)[None, :] < lengths[:, None]) & (rng.random((B, T)) < 0.9)
    mask[rng.random(B) < 0.1] = False
    prox = -rng.exponential(1.0, (B, T))
    if rng.random() < 0.25:  # dyadic log-ratios: squares tie and sum exactly
        y = rng.choice([0.0, 0.125, -0.125, 0.25, -0.25, 0.5, -0.5, 1.0], (B, T))
        prox = np.round(prox * 64) / 64
    else:
        y = rng.standard_t(3.0, (B, T)) * rng.choice([0.02, 0.1, 0.3])
    old = (prox + y).astype(dtype)
    prox = prox.astype(dtype)
    old[~mask], prox[~mask] = dtype(5.0), dtype(-5.0)  # padding that would show if read
    return {"old": old, "prox": prox, "mask": mask}


def thresholds(rng, batch, dtype) -> list[float]:
    """Return a random threshold, 0, one above every square, one equal to a running mean as AReaL takes it."""
    y = (batch["old"] - batch["prox"])[batch["mask"]]
    m2 = np.sort(y * y)  # ascending, in dtype
    out = [float(rng.choice([0.001, 0.01, 0.05])), 0.0, float(m2.max()) * 2 + 1.0 if m2.size else 1.0]
    if m2.size:
        # torch's CPU cumsum: float64 accumulation, each running sum rounded to the dtype
        means = np.cumsum(m2, dtype=np.float64).astype(dtype) / np.arange(1, m2.size + 1, dtype=dtype)
        out.append(float(means[int(rng.integers(m2.size))]))
    else:
        out.append(0.01)
    return out


def main(argv=None) -> int:
    """Write areal.npz and areal.json; print their sizes."""
    import torch

    args = checkout_args(__doc__, "areal", "a checkout of inclusionAI/AReaL at 4aef98d", argv)
    ns, sha = load_areal(args.areal)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260905)))
    inputs: dict[str, list] = {"old": [], "prox": [], "mask": []}
    kept, shapes, batches = [], [], []
    for b in range(N_BATCHES):
        dtype = np.float64 if b % 3 == 2 else np.float32
        mask_dtype = MASK_DTYPES[b % len(MASK_DTYPES)]
        batch = make_batch(rng, dtype)
        taus = thresholds(rng, batch, dtype)
        shapes.append(batch["mask"].shape)
        for k in ("old", "prox"):
            inputs[k].append(batch[k].astype(np.float64).ravel())
        inputs["mask"].append(batch["mask"].astype(np.uint8).ravel())
        tdt = torch.float32 if dtype is np.float32 else torch.float64
        old, prox = (torch.from_numpy(batch[k]).to(tdt) for k in ("old", "prox"))
        loss_mask = torch.from_numpy(batch["mask"]).to(getattr(torch, mask_dtype)).bool()
        for tau in taus:
            out = ns["_apply_m2po_masking"](old, prox, loss_mask, tau)
            kept.append(out.numpy().astype(np.uint8).ravel())
        batches.append({"dtype": np.dtype(dtype).name, "mask_dtype": mask_dtype, "thresholds": taus})
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    arrays["kept"] = np.concatenate(kept)
    write_fixtures(args.out, "areal", COMMIT, {ACTOR: sha}, arrays, {"batches": batches})
    return 0


if __name__ == "__main__":
    sys.exit(main())
