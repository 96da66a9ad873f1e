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
settings, the metrics, the versions). The default tests (``tests/test_frameworks_*.py``) compare the
NumPy mirrors with them to 1e-9 relative. Nothing of the frameworks is stored but their outputs.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--only", choices=["verl", "trl"], help="one framework only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batch = make_batch()
    if args.only in (None, "verl"):
        run_verl(batch, args.out)
    if args.only in (None, "trl"):
        run_trl(batch, args.out)
    for path in sorted(args.out.iterdir()):
        print(f"{path}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
