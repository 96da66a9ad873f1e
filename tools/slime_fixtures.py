"""Write the fixtures that pin variance_lab.frameworks.slime and slime_mis to slime's own code.

slime cannot be installed without Megatron-LM and SGLang, but the functions the mirrors follow
need only torch. Run it with torch and a checkout of THUDM/slime at commit 624b824::

    git clone https://github.com/THUDM/slime /tmp/slime && git -C /tmp/slime checkout 624b824
    python tools/slime_fixtures.py /tmp/slime tests/data/frameworks

(The committed fixtures were written that way with torch 2.13.0+cpu, from the files of the
snapshot 624b824a898ab0ec1fcb4d373004c7f3852bf515; their SHA-256 are in ``slime.json``.)

What runs, from the checkout, verbatim:

- ``examples/train_infer_mismatch_helper/mis.py``, imported as a module (it needs only torch):
  ``compute_mis_weights`` with its ``add_ppl_metrics``, ``calculate_veto_mask``, ``truncate``,
  ``clip`` and ``mask``;
- the source of ``vanilla_tis_function`` and ``icepop_function``
  (``slime/backends/megatron_utils/loss.py``), ``get_sum_of_sample_mean``
  (``slime/backends/megatron_utils/cp_utils.py``, with a context-parallel size of 1),
  ``compute_gspo_kl`` (``slime/utils/ppo_utils.py``) and ``reduce_train_step_metrics``
  (``slime/observability/train_metric_utils.py``, with ``all_reduce`` over one rank): each
  function's own text, cut out of its module (the modules import Megatron) and executed.

What is restated here, from ``loss.py`` at that commit: the metric lines of
``policy_loss_function`` (``ppo_kl`` and ``ois = (-ppo_kl).exp()``, 1020-1033 and 1063; the
reducer rebuilt over ``modified_response_masks`` with the ``rollout_mask_sums`` denominators,
1086-1092; ``train_rollout_logprob_abs_diff``, 1136-1140), ``loss_function``'s log vector
(``num_tokens``, 1317 and 1363-1382), ``compute_mis_weights_with_cp``'s ``mis_`` prefix (375-378),
and the ``rollout_mask_sums`` of ``slime/ray/rollout.py`` (695-700).

Each of 20 random batches (1 to 8 samples of 1 to 29 tokens, float32 log-probs, int32 loss masks
with holes, some all 0, rollout ids that sometimes group samples, log-ratios exactly at float32
bounds and at the veto threshold) runs 4 TIS settings and 6 random mis.yaml settings, each in
float32 (what slime runs) and in float64 (the same inputs cast up: slime's own rounding is the
difference). ``slime.npz`` holds the inputs (each batch's padded (B, T) arrays, raveled and
concatenated; ``shapes`` gives (B, T)), and per setting, in the order of ``slime.json``'s
settings: the logged metrics (``metrics32``, ``metrics64``: a row over ``metric_names``, NaN where
the setting logs no such metric), and at the loss-mask tokens the float32 weights, how far the
float64 run's weights lie from them, and the rejection mask (flat, cut by ``*_offsets``).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fixture_files import checkout_args, definitions, file_shas, padded, write_fixtures

COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
FILES = {
    "mis": "examples/train_infer_mismatch_helper/mis.py",
    "loss": "slime/backends/megatron_utils/loss.py",
    "cp_utils": "slime/backends/megatron_utils/cp_utils.py",
    "ppo_utils": "slime/utils/ppo_utils.py",
    "train_metric_utils": "slime/observability/train_metric_utils.py",
}
N_BATCHES = 20
PAD_OLD, PAD_ROLLOUT = 3.0, -40.0  # padding: read anywhere, it would move every result
#: (tis_clip_low, tis_clip) of the TIS settings, in turn.
TIS_BOUNDS = ((0.0, 2.0), (0.5, 2.0), (0.5, 5.0))


class _OneRank:
    """``mpu`` and ``torch.distributed`` for one rank without context parallelism."""

    @staticmethod
    def get_context_parallel_world_size():
        return 1

    @staticmethod
    def all_reduce(*args, **kwargs):
        return None


def load_slime(root: Path) -> tuple[dict, Any, dict]:
    """Return (the functions cut out of slime's modules, the mis.py module, each file's SHA-256)."""
    import torch

    ns: dict = {"torch": torch, "Any": Any, "Callable": Callable, "mpu": _OneRank, "dist": _OneRank}
    wanted = {
        "loss": {"vanilla_tis_function", "icepop_function"},
        "cp_utils": {"get_sum_of_sample_mean"},
        "ppo_utils": {"compute_gspo_kl"},
        "train_metric_utils": {"reduce_train_step_metrics"},
    }
    for key, names in wanted.items():
        path = root / FILES[key]
        text, found = definitions(path, names)
        for node in found:  # the def without its decorators (none of these has one)
            exec(compile(ast.get_source_segment(text, node), str(path), "exec"), ns)
    spec = importlib.util.spec_from_file_location("slime_mis_example", root / FILES["mis"])
    mis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mis)
    return ns, mis, file_shas(root, FILES.values())


def make_batch(rng: np.random.Generator) -> dict:
    """One batch of slime samples: per-sample float32 log-probs, int32 loss masks, rollout ids."""
    B = int(rng.integers(1, 9))
    lengths = rng.integers(1, 30, size=B)
    samples = []
    for n in lengths:
        train = rng.normal(-1.5, 1.0, n)
        y = rng.standard_t(3.0, n) * rng.choice([0.02, 0.3, 1.5])
        spikes = rng.random(n) < 0.05
        y[spikes] = rng.choice([-12.0, -9.2103404, 3.0, 25.0], spikes.sum())
        at = rng.random(n) < 0.06  # float32 log-ratios at 2 and 0.5 (float32 and float64 logs)
        y[at] = rng.choice(
            [np.log(2.0), np.log(0.5), float(np.float32(np.log(2.0))), float(np.float32(np.log(0.5)))],
            at.sum(),
        )
        mask = (rng.random(n) < 0.85).astype(np.int32)
        if rng.random() < 0.1:
            mask[:] = 0  # a removed sample
        new = train + rng.normal(0.0, 0.05, n)
        samples.append(
            {
                "old": train.astype(np.float32),
                "rollout": (train - y).astype(np.float32),
                "new": new.astype(np.float32),
                "mask": mask,
            }
        )
    grouped = rng.random() < 0.3
    ids = rng.integers(0, max(1, B // 2), size=B) if grouped else np.arange(B)
    return {"samples": samples, "rollout_ids": ids.astype(np.int64), "per_token": bool(rng.random() < 0.5)}


def _reducer(ns, samples, masks, ids, per_token):
    """get_sum_of_sample_mean with slime's per-rollout denominators (rollout.py:695-700)."""
    import torch

    lengths = [len(s["old"]) for s in samples]
    sums: dict[int, int] = {}
    for rid, m in zip(ids.tolist(), masks, strict=True):
        sums[rid] = sums.get(rid, 0) + int(m.sum())
    denoms = torch.tensor([sums[r] for r in ids.tolist()], dtype=torch.float32)
    masks_t = [torch.as_tensor(np.asarray(m), dtype=torch.int) for m in masks]
    return ns["get_sum_of_sample_mean"](lengths, lengths, masks_t, denoms, per_token)


def _logged(ns, values: dict, samples, ids, per_token) -> dict[str, float]:
    """loss_function's log vector (loss.py:1317, 1363-1382), reduced by reduce_train_step_metrics."""
    import torch

    num_tokens = sum(torch.clamp_min(torch.as_tensor(s["mask"]).sum(), 1) for s in samples)
    keys = list(values)
    vals = torch.tensor([num_tokens if per_token else 0] + [values[k] for k in keys])
    out = ns["reduce_train_step_metrics"](
        [{"keys": keys, "values": vals}],
        calculate_per_token_loss=per_token,
        step_global_batch_size=len(set(ids.tolist())),
        cp_size=1,
        dp_with_cp_group=None,
    )
    return {k: float(v) for k, v in out.items()}


def run_tis(ns, batch, icepop: bool, estimator: str, bounds, dtype) -> tuple[dict, np.ndarray, np.ndarray]:
    """policy_loss_function's metrics with vanilla_tis_function or icepop_function (--use-tis)."""
    import torch

    samples, ids, per_token = batch["samples"], batch["rollout_ids"], batch["per_token"]
    tr, ro, nw = ([torch.from_numpy(s[k]).to(dtype) for s in samples] for k in ("old", "rollout", "new"))
    ma = [torch.as_tensor(s["mask"], dtype=torch.int) for s in samples]
    fn = ns["icepop_function"] if icepop else ns["vanilla_tis_function"]
    args = Namespace(tis_clip_low=bounds[0], tis_clip=bounds[1])
    ones = torch.ones(sum(len(t) for t in tr), dtype=dtype)
    weights, modified, metrics = fn(
        args, pg_loss=ones, train_log_probs=tr, rollout_log_probs=ro, loss_masks=ma
    )
    sosm = _reducer(ns, samples, [s["mask"] for s in samples], ids, per_token)
    old, new = torch.cat(tr), torch.cat(nw)
    ppo_kl = ns["compute_gspo_kl"](nw, tr, nw, ma) if estimator == "gspo" else old - new
    values = {"ois": sosm((-ppo_kl).exp())}
    values.update({k: sosm(v) for k, v in metrics.items()})
    rebuilt = _reducer(ns, samples, [m.numpy() for m in modified], ids, per_token)
    values["ppo_kl"] = rebuilt(ppo_kl)
    values["train_rollout_logprob_abs_diff"] = rebuilt((old - torch.cat(ro)).abs())
    keep = torch.cat(modified).numpy()
    return _logged(ns, values, samples, ids, per_token), weights.double().numpy(), keep


def run_mis(ns, mis, batch, options: dict, dtype) -> tuple[dict, np.ndarray | None, np.ndarray]:
    """compute_mis_weights as compute_mis_weights_with_cp and policy_loss_function log it."""
    import torch

    samples, ids, per_token = batch["samples"], batch["rollout_ids"], batch["per_token"]
    tr, ro = ([torch.from_numpy(s[k]).to(dtype) for s in samples] for k in ("old", "rollout"))
    ma = [torch.as_tensor(s["mask"], dtype=torch.int) for s in samples]
    weights, modified, metrics = mis.compute_mis_weights(
        Namespace(**options), train_log_probs=tr, rollout_log_probs=ro, loss_masks=ma
    )
    sosm = _reducer(ns, samples, [s["mask"] for s in samples], ids, per_token)
    values = {f"mis_{k}": sosm(torch.cat(v)) for k, v in metrics.items()}
    w = None if weights is None else torch.cat(weights).double().numpy()
    return _logged(ns, values, samples, ids, per_token), w, torch.cat(modified).double().numpy()


def run_setting(ns, mis, batch, kind: str, options: dict, dtype):
    """Run one setting (``kind`` "tis" or "mis") on the batch in ``dtype``: (metrics, weights, keep)."""
    if kind == "tis":
        bounds = (options["tis_clip_low"], options["tis_clip"])
        return run_tis(ns, batch, options["icepop"], options["advantage_estimator"], bounds, dtype)
    return run_mis(ns, mis, batch, options, dtype)


def mis_options(rng: np.random.Generator) -> dict:
    """Return a random mis.yaml (geometric with batch normalisation raises in slime: not drawn)."""
    opts = {
        "use_tis": bool(rng.random() < 0.9),
        "use_rs": bool(rng.random() < 0.7),
        "tis_level": str(rng.choice(["token", "sequence", "geometric"])),
        "rs_level": str(rng.choice(["token", "sequence", "geometric"])),
        "tis_mode": str(rng.choice(["truncate", "clip", "mask"])),
        "tis_lower_bound": [None, 0.5, 0.9][int(rng.integers(3))],
        "tis_upper_bound": [2.0, 1.1, 5.0][int(rng.integers(3))],
        "rs_lower_bound": [None, 0.25][int(rng.integers(2))],
        "rs_upper_bound": [None, 4.0][int(rng.integers(2))],
        "rs_veto_threshold": [None, 1e-4, 0.01][int(rng.integers(3))],
        "tis_batch_normalize": bool(rng.random() < 0.5),
    }
    if opts["tis_batch_normalize"] and opts["tis_level"] == "geometric":
        opts["tis_level"] = "token"
    return opts


def main(argv=None) -> int:
    """Write slime.npz and slime.json; print their sizes."""
    import torch

    args = checkout_args(__doc__, "slime", "a checkout of THUDM/slime at 624b824", argv)
    ns, mis, shas = load_slime(args.slime)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260821)))
    inputs: dict[str, list] = {k: [] for k in ("old", "rollout", "new", "mask", "rollout_ids")}
    shapes, batches, logged = [], [], []
    per_setting: dict[str, list] = {"weights32": [], "weights_rounding": [], "keep": []}
    for b in range(N_BATCHES):
        batch = make_batch(rng)
        s = batch["samples"]
        for key, pad, dt in (("old", PAD_OLD, np.float32), ("rollout", PAD_ROLLOUT, np.float32)):
            inputs[key].append(padded(s, key, pad, dt).ravel())
        inputs["new"].append(padded(s, "new", PAD_OLD, np.float32).ravel())
        inputs["mask"].append(padded(s, "mask", 0, np.int32).ravel())
        inputs["rollout_ids"].append(batch["rollout_ids"])
        shapes.append((len(s), max(len(x["old"]) for x in s)))
        inside = np.concatenate([x["mask"] for x in s]) > 0
        settings = []
        for c in range(4 + 6):
            kind = "tis" if c < 4 else "mis"
            if kind == "tis":
                low, clip = TIS_BOUNDS[(b + c) % 3]
                options = {
                    "icepop": c % 2 == 1,
                    "advantage_estimator": "gspo" if c >= 2 else "grpo",
                    "tis_clip_low": low,
                    "tis_clip": clip,
                }
            else:
                options = mis_options(rng)
            m32, w32, k32 = run_setting(ns, mis, batch, kind, options, torch.float32)
            m64, w64, _ = run_setting(ns, mis, batch, kind, options, torch.float64)
            settings.append({"kind": kind, "options": options, "weights": w32 is not None})
            logged.append((m32, m64))
            none = np.zeros(0, dtype=np.float32)
            per_setting["weights32"].append(none if w32 is None else w32[inside].astype(np.float32))
            per_setting["weights_rounding"].append(
                none if w32 is None else np.abs(w64 - w32)[inside].astype(np.float32)
            )
            per_setting["keep"].append((k32[inside] > 0).astype(np.uint8))
        batches.append({"per_token": batch["per_token"], "settings": settings})
    names = sorted({k for m32, _ in logged for k in m32})
    for m32, m64 in logged:
        assert set(m32) == set(m64)
        assert not any(np.isnan(v) for v in [*m32.values(), *m64.values()])
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    for key in ("metrics32", "metrics64"):
        arrays[key] = np.array([[m[key == "metrics64"].get(k, np.nan) for k in names] for m in logged])
    for key, parts in per_setting.items():
        arrays[key] = np.concatenate(parts)
        arrays[f"{key}_offsets"] = np.cumsum([0] + [len(x) for x in parts])
    meta = {"padding": {"old": PAD_OLD, "rollout": PAD_ROLLOUT}, "metric_names": names, "batches": batches}
    write_fixtures(args.out, "slime", COMMIT, shas, arrays, meta, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
