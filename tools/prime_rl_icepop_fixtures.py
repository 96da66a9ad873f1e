"""Write the fixtures that pin variance_lab.frameworks.prime_rl.icepop_mask to prime-rl's ``IcePopLoss``.

prime-rl's opt-in IcePop loss came with PR #3526 (merged 2026-09-10), after the commit the other
prime-rl fixtures use (``559b447``, still the newest snapshot this project could fetch). Run it
with torch and a ``src/prime_rl/trainer/rl/loss.py`` that has ``IcePopLoss``::

    python tools/prime_rl_icepop_fixtures.py PATH/TO/loss.py tests/data/frameworks

What runs, verbatim: ``LossInputs``, ``LossOutputs``, ``_safe_mean``,
``compute_importance_ratio_and_mismatch_kl`` and ``IcePopLoss``, each definition's own text cut
out of that file and executed (the file's other imports are not needed); the keep mask is
``IcePopLoss.loss``'s local ``keep_mask``, read as it returns (``sys.setprofile``). The committed fixtures
were written with torch 2.13.0+cpu from those five definitions as the code index stores the
post-#3526 ``loss.py`` (its commit is not recorded there), copied into a scratch file; its
SHA-256 is in ``prime_rl_icepop.json``.

``IcePopLoss.loss`` runs on one sample at a time, as ``compute_loss`` calls it. Each of 40
random batches (1 to 6 samples of 1 to 24 tokens, float32 log-probs, bool loss masks, some
empty) runs at 3 bands (the default [0.2, 5], a random one, a narrow one) in float32 and in
float64 (the same inputs cast up: prime-rl's own rounding); about one token in six has a float32
log-ratio exactly at a bound's float32 log. ``prime_rl_icepop.npz`` holds the inputs (padded
(B, T) arrays raveled and concatenated; ``shapes`` gives (B, T)), per setting the keep mask of
every sample ((B, T) raveled) and the three metrics of each sample (``compute_loss`` without
``rl_weights`` runs the loss on every sample, an empty one included: its metrics are 0).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from fixture_files import exec_definitions, file_shas, write_fixtures

WANTED = ("LossInputs", "LossOutputs", "_safe_mean", "compute_importance_ratio_and_mismatch_kl", "IcePopLoss")
METRICS = ("is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl")
N_BATCHES = 40
PAD = 7.0


class _Annotation:
    """``Float[Tensor, "seq"]`` and friends: annotations only."""

    def __getitem__(self, item):
        return Any


def load(path: Path) -> tuple[dict, str]:
    """Return the five definitions executed from the file's text, and the file's SHA-256."""
    import torch

    ns: dict = {"torch": torch, "Tensor": torch.Tensor, "dataclass": dataclass, "field": field, "Any": Any}
    ns.update(Float=_Annotation(), Bool=_Annotation(), IcePopLossConfig=Any)
    exec_definitions(path, WANTED, ns, ast.FunctionDef | ast.ClassDef)
    return ns, file_shas(path.parent, (path.name,))[path.name]


def _at_log_bound(rng, bound: float) -> tuple[np.float32, np.float32]:
    """Return float32 (trainer, inference) whose float32 difference is log(bound) taken in float32."""
    target = np.float32(np.log(np.float64(np.float32(bound))))
    for _ in range(1000):
        i = np.float32(-rng.uniform(0.01, 3.0))
        t0 = np.float32(np.float64(i) + np.float64(target))
        for k in range(-32, 33):
            t = np.float32(t0 + np.float32(k) * np.spacing(t0)) if k else t0
            if np.float32(t - i) == target:
                return t, i
    raise RuntimeError(f"no float32 pair at log({bound})")


def make_batch(rng, bands) -> dict:
    """One batch of samples: (B, T) float32 trainer and inference log-probs, a bool loss mask."""
    B = int(rng.integers(1, 7))
    lengths = rng.integers(1, 25, size=B)
    T = int(lengths.max())
    mask = (np.arange(T)[None, :] < lengths[:, None]) & (rng.random((B, T)) < 0.9)
    mask[rng.random(B) < 0.1] = False
    inference = -rng.exponential(1.0, (B, T))
    y = rng.standard_t(3.0, (B, T)) * rng.choice([0.1, 0.5, 1.5])
    trainer = (inference + y).astype(np.float32)
    inference = inference.astype(np.float32)
    bounds = [b for band in bands for b in band]
    for i, j in zip(*np.nonzero(rng.random((B, T)) < 0.17), strict=True):
        trainer[i, j], inference[i, j] = _at_log_bound(rng, float(rng.choice(bounds)))
    pad = ~(np.arange(T)[None, :] < lengths[:, None])
    trainer[pad], inference[pad] = PAD, -PAD
    return {"trainer": trainer, "inference": inference, "mask": mask, "lengths": lengths}


def run(ns, batch, band, dtype) -> tuple[np.ndarray, list[list[float]]]:
    """IcePopLoss(band).loss on every sample in ``dtype``: (B, T) keep masks, each sample's metrics."""
    import torch

    config = SimpleNamespace(ratio_low=band[0], ratio_high=band[1], adv_tau=1.0)
    loss_fn = ns["IcePopLoss"](config)
    keeps, metrics = [], []
    for b in range(batch["mask"].shape[0]):
        n = int(batch["lengths"][b])
        t = torch.from_numpy(batch["trainer"][b, :n]).to(dtype)
        i = torch.from_numpy(batch["inference"][b, :n]).to(dtype)
        m = torch.from_numpy(batch["mask"][b, :n])
        inputs = ns["LossInputs"](t, i, None, torch.ones_like(t), m)
        seen: dict = {}

        def profile(frame, event, arg, seen=seen):  # IcePopLoss.loss's keep_mask as it returns
            if event == "return" and frame.f_code.co_name == "loss" and "keep_mask" in frame.f_locals:
                seen["keep"] = frame.f_locals["keep_mask"].numpy().copy()

        sys.setprofile(profile)
        try:
            out = loss_fn.loss(inputs)
        finally:
            sys.setprofile(None)
        keep = np.zeros(batch["mask"].shape[1], np.uint8)
        keep[:n] = seen["keep"]
        keeps.append(keep)
        metrics.append([float(out.metrics[k]) for k in METRICS])  # without rl_weights every sample runs
    return np.concatenate(keeps), metrics


def main(argv=None) -> int:
    """Write prime_rl_icepop.npz and prime_rl_icepop.json; print their sizes."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "loss_py", type=Path, help="prime-rl's src/prime_rl/trainer/rl/loss.py with IcePopLoss"
    )
    parser.add_argument("out", type=Path, help="folder for the fixtures (tests/data/frameworks)")
    args = parser.parse_args(argv)
    ns, sha = load(args.loss_py)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260910)))
    inputs: dict[str, list] = {"trainer": [], "inference": [], "mask": []}
    out: dict[str, list] = {"keep32": [], "keep64": [], "m32": [], "m64": []}
    shapes, batches = [], []
    for _ in range(N_BATCHES):
        lo = float(rng.choice([0.1, 0.5, 0.8]))
        bands = [(0.2, 5.0), (lo, float(rng.choice([1.25, 2.0, 10.0]))), (0.95, 1.05)]
        batch = make_batch(rng, bands)
        shapes.append(batch["mask"].shape)
        for k in inputs:
            inputs[k].append(batch[k].astype(np.float64 if k != "mask" else np.uint8).ravel())
        for band in bands:
            k32, m32 = run(ns, batch, band, torch.float32)
            k64, m64 = run(ns, batch, band, torch.float64)
            out["keep32"].append(k32)
            out["keep64"].append(k64)
            out["m32"].extend(m32)
            out["m64"].extend(m64)
        batches.append({"bands": [list(b) for b in bands]})
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    arrays.update({k: np.concatenate(out[k]) for k in ("keep32", "keep64")})
    arrays.update({k: np.array(out[k], dtype=np.float64) for k in ("m32", "m64")})
    meta = {
        "source": "src/prime_rl/trainer/rl/loss.py after PrimeIntellect-ai/prime-rl PR #3526 (code index)",
        "file_sha256": sha,
        "metrics": list(METRICS),
        "padding": PAD,
        "batches": batches,
    }
    write_fixtures(args.out, "prime_rl_icepop", None, None, arrays, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
