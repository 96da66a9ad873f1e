"""Write the fixtures that pin variance_lab.frameworks.nemo_rl to NeMo-RL's own code.

NeMo-RL cannot be imported without Ray, Megatron and its distributed stack, but the loss needs
only torch. Run it with torch and a checkout of NVIDIA-NeMo/RL at 7ea279a::

    git clone https://github.com/NVIDIA-NeMo/RL /tmp/nemo-rl && git -C /tmp/nemo-rl checkout 7ea279a
    python tools/nemo_rl_fixtures.py /tmp/nemo-rl tests/data/frameworks

(The committed fixtures were written that way with torch 2.13.0+cpu, from the files of the
snapshot 7ea279abf; ``loss_functions.py`` last changed in ced083a. Their SHA-256 are in
``nemo_rl.json``.)

What runs, from the checkout, verbatim (each definition's own text, cut out of its module with
``ast`` and executed, since the modules import Ray-, Megatron- and transformers-bound code):

- ``masked_mean`` and ``calculate_kl`` (``nemo_rl/algorithms/utils.py``);
- ``LossType`` and ``MetricNormalizer`` (``nemo_rl/algorithms/loss/interfaces.py``);
- ``ClippedPGLossFn.__init__`` and ``ClippedPGLossFn.__call__`` whole
  (``nemo_rl/algorithms/loss/loss_functions.py``), as methods of a bare class (the real class
  derives only from the ``LossFunction`` protocol); its configuration is a namespace holding the
  defaults of ``ClippedPGLossConfig`` read from its class body (a pydantic model there), with
  the options of each setting set over them.

What is restated here: the global counts of ``get_microbatch_iterator``'s helper
(``nemo_rl/models/automodel/data.py:408-420``, ``torch.tensor([local_valid_seqs,
local_valid_toks])``, without the all-reduce over one rank), the micro-batch loop of the policy
worker (rows in order, ``train_micro_batch_size`` each; a micro-batch's metrics kept only if
``num_valid_samples > 0``, ``dtensor_policy_worker_v2.py:528-537``) and grpo's sum of each
metric over the kept micro-batches (``np.sum``, ``grpo.py:3491``).

Each of 24 random batches (1 to 8 rows, ragged lengths, float32 log-probs, int64 or bool token
masks with holes, int64/float32/bool sample masks with zeros, log-ratios exactly at float32
bounds, a few of 89 and 95, where NeMo-RL's float32 exponential overflows) runs 9 settings (no
truncation, tis with and without a minimum, icepop, seq-mask-tis, token- and sequence-level,
k1/k2/k3, a random micro-batch size), each in float32 (what NeMo-RL runs) and in float64 (the same
inputs cast up: NeMo-RL's own rounding is the difference). ``nemo_rl.npz`` holds the inputs (the
padded (B, T+1) arrays raveled and concatenated, ``shapes`` giving (B, T+1); column 0 is the
prompt's last token that NeMo-RL's ``[:, 1:]`` drops) and the logged metrics (``metrics32``,
``metrics64``: a row per setting over ``metric_names``, NaN where a setting logs no such
metric; a NaN NeMo-RL logs is kept in ``nan32``/``nan64``) and the per-token weights
``__call__`` holds as it returns (``actor_importance_weights``, after truncation or masking,
read with ``sys.setprofile``; ``weights32`` float32, ``weights64`` float64: each setting's
(B, T) array, or (B, 1) with sequence-level ratios, raveled, every position, padding included).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
from fixture_files import checkout_args, definitions, file_shas, write_fixtures

COMMIT = "7ea279abf"
FILES = {
    "utils": "nemo_rl/algorithms/utils.py",
    "interfaces": "nemo_rl/algorithms/loss/interfaces.py",
    "loss": "nemo_rl/algorithms/loss/loss_functions.py",
}
N_BATCHES = 24
METRICS = (
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "sampling_importance_ratio",
    "is_oob_ratio",
    "num_valid_samples",
)


def load_nemo(root: Path) -> tuple[type, Any, dict]:
    """Return (a class with ClippedPGLossFn's own methods, a config factory, each file's SHA-256)."""
    import enum

    import torch

    ns: dict = {"torch": torch, "Optional": Optional, "Any": Any, "enum": enum}
    text, found = definitions(root / FILES["utils"], {"masked_mean", "calculate_kl"})
    for node in found:
        exec(compile(ast.get_source_segment(text, node), FILES["utils"], "exec"), ns)
    text, found = definitions(root / FILES["interfaces"], {"LossType", "MetricNormalizer"}, ast.ClassDef)
    for node in found:
        exec(compile(ast.get_source_segment(text, node), FILES["interfaces"], "exec"), ns)
    text, (cls,) = definitions(root / FILES["loss"], {"ClippedPGLossFn"}, ast.ClassDef)
    _, (cfg,) = definitions(root / FILES["loss"], {"ClippedPGLossConfig"}, ast.ClassDef)
    defaults = {
        n.target.id: ast.literal_eval(n.value)
        for n in cfg.body
        if isinstance(n, ast.AnnAssign) and n.value is not None
    }
    ns.update(Tensor=torch.Tensor, BatchedDataDict=dict, ClippedPGLossDataDict=dict, ClippedPGLossConfig=Any)
    body = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("__init__", "__call__"):
            exec(compile(ast.get_source_segment(text, node), FILES["loss"], "exec"), ns, body)
    if set(body) != {"__init__", "__call__"}:
        raise SystemExit(f"{FILES['loss']}: ClippedPGLossFn without __init__/__call__")
    loss_cls = type("ClippedPGLossFn", (), {**body, "input_type": None})
    return loss_cls, lambda **kw: SimpleNamespace(**{**defaults, **kw}), file_shas(root, FILES.values())


def make_batch(rng: np.random.Generator) -> dict:
    """One batch as NeMo-RL's loss receives it: (B, T+1) float32 log-probs and the masks."""
    B = int(rng.integers(1, 9))
    T = int(rng.integers(2, 20))
    lengths = rng.integers(1, T + 1, size=B)
    if rng.random() < 0.3:
        lengths[:] = rng.choice([1, 2, 4])  # powers of two: exact float32 means at the bounds
        T = max(T, int(lengths.max()))
    gen = rng.normal(-1.5, 1.0, (B, T)).clip(max=0.0)
    y = rng.standard_t(3.0, (B, T)) * rng.choice([0.001, 0.02, 0.3, 1.5])
    at = rng.random((B, T)) < 0.08  # log-ratios whose float32 exp is at a bound
    bounds = [2.0, 0.5, 1.002, 0.999, 1.5, 5.0]
    y[at] = rng.choice([float(np.log(np.float32(b))) for b in bounds], at.sum())
    big = rng.random((B, T)) < (0.03 if rng.random() < 0.25 else 0.0)
    y[big] = rng.choice([89.0, 95.0, -89.0], big.sum())
    prev = (gen + y).astype(np.float32)
    tm = np.zeros((B, T), dtype=np.int64)
    for i, n in enumerate(lengths):
        tm[i, :n] = (rng.random(n) < 0.9).astype(np.int64)
    sm = (rng.random(B) < 0.8).astype(np.int64)
    if not sm.any():
        sm[int(rng.integers(B))] = 1  # NeMo-RL logs nothing for a step without a valid sample
    pad = np.zeros((B, 1))
    out = {
        "prev": np.hstack([pad, prev]).astype(np.float32),
        "gen": np.hstack([pad, gen]).astype(np.float32),
        "curr": np.hstack([pad, prev + rng.normal(0, 0.05, (B, T))]).astype(np.float32),
        "ref": np.hstack([pad, prev + rng.normal(0, 0.1, (B, T))]).astype(np.float32),
        "tm": np.hstack([pad.astype(np.int64), tm]),
        "sm": sm,
    }
    for k in ("prev", "gen", "curr", "ref"):
        out[k][out["tm"] == 0] *= rng.random() < 0.5  # padding 0, or the values left in
    out["tm_dtype"] = str(rng.choice(["int64", "bool"]))
    out["sm_dtype"] = str(rng.choice(["int64", "float32", "bool"]))
    return out


def settings(rng: np.random.Generator, B: int) -> list[dict]:
    """Return the 9 configurations run on one batch."""
    rows = [
        {},
        {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0},
        {
            "truncated_importance_sampling_type": "tis",
            "truncated_importance_sampling_ratio": 2.0,
            "truncated_importance_sampling_ratio_min": 0.5,
        },
        {
            "truncated_importance_sampling_type": "icepop",
            "truncated_importance_sampling_ratio": 5.0,
            "truncated_importance_sampling_ratio_min": 0.5,
        },
        {
            "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio": 1.002,
            "truncated_importance_sampling_ratio_min": 0.999,
        },
        {
            "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio": 1.5,
            "truncated_importance_sampling_ratio_min": float(rng.choice([0.0, 0.5])),
        },
        {"sequence_level_importance_ratios": True},
        {
            "sequence_level_importance_ratios": True,
            "truncated_importance_sampling_type": "tis",
            "truncated_importance_sampling_ratio": 2.0,
        },
        {
            "sequence_level_importance_ratios": True,
            "truncated_importance_sampling_type": "icepop",
            "truncated_importance_sampling_ratio": 5.0,
            "truncated_importance_sampling_ratio_min": 0.5,
        },
    ]
    for r in rows:
        r["use_importance_sampling_correction"] = True
        r["token_level_loss"] = not r.get("sequence_level_importance_ratios", False)
        r["reference_policy_kl_type"] = str(rng.choice(["k1", "k2", "k3"]))
        r["micro_batch_size"] = int(rng.integers(1, B + 1))
    return rows


def run(loss_cls, config, batch: dict, options: dict, dtype) -> tuple[dict, dict, np.ndarray]:
    """Run the policy worker's loop over micro-batches and grpo's sum.

    Returns (logged metrics, normalisations, weights): the weights are ``__call__``'s local
    ``actor_importance_weights`` as it returns (after truncation or masking), read with
    ``sys.setprofile``, of every micro-batch stacked: (B, T), or (B, 1) with sequence-level ratios.
    """
    import torch

    opts = dict(options)
    mbs = opts.pop("micro_batch_size")
    fn = loss_cls(config(**opts))
    t = {k: torch.from_numpy(batch[k]).to(dtype) for k in ("prev", "gen", "curr", "ref")}
    tm = torch.from_numpy(batch["tm"]).to(getattr(torch, batch["tm_dtype"]))
    sm = torch.from_numpy(batch["sm"]).to(getattr(torch, batch["sm_dtype"]))
    # automodel/data.py:408-420 over the whole global batch (one data-parallel rank)
    local_valid_seqs = torch.sum(sm)
    local_valid_toks = torch.sum(tm[:, 1:] * sm.unsqueeze(-1))
    to_reduce = torch.tensor([local_valid_seqs, local_valid_toks])
    global_valid_seqs, global_valid_toks = to_reduce[0], to_reduce[1]
    kept: dict[str, list] = {}
    weights: list[np.ndarray] = []

    def profile(frame, event, arg):  # ClippedPGLossFn.__call__'s weights as it returns
        if (
            event == "return"
            and frame.f_code.co_name == "__call__"
            and "actor_importance_weights" in frame.f_locals
        ):
            weights.append(frame.f_locals["actor_importance_weights"].detach().numpy().copy())

    for lo in range(0, tm.shape[0], mbs):
        s = slice(lo, lo + mbs)
        data = {
            "token_mask": tm[s],
            "sample_mask": sm[s],
            "advantages": torch.ones_like(t["prev"][s]),
            "prev_logprobs": t["prev"][s],
            "generation_logprobs": t["gen"][s],
            "reference_policy_logprobs": t["ref"][s],
        }
        sys.setprofile(profile)
        try:
            _loss, metrics = fn(t["curr"][s][:, 1:], data, global_valid_seqs, global_valid_toks)
        finally:
            sys.setprofile(None)
        if metrics["num_valid_samples"] > 0:
            for k, v in metrics.items():
                kept.setdefault(k, []).append(v)
    logged = {k: float(np.sum(v)) for k, v in kept.items() if k in METRICS}
    return logged, {k: v.value for k, v in fn.metric_normalizations.items()}, np.concatenate(weights)


def main(argv=None) -> int:
    """Write nemo_rl.npz and nemo_rl.json; print their sizes."""
    import torch

    args = checkout_args(__doc__, "nemo", "a checkout of NVIDIA-NeMo/RL at 7ea279a", argv)
    loss_cls, config, shas = load_nemo(args.nemo)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260822)))
    inputs: dict[str, list] = {k: [] for k in ("prev", "gen", "tm", "sm")}
    shapes, batches, logged, tables, weights = [], [], [], [], ([], [])
    for _ in range(N_BATCHES):
        batch = make_batch(rng)
        for k in inputs:
            inputs[k].append(batch[k].ravel())
        shapes.append(batch["tm"].shape)
        rows = []
        for options in settings(rng, batch["tm"].shape[0]):
            m32, norms, w32 = run(loss_cls, config, batch, options, torch.float32)
            m64, _, w64 = run(loss_cls, config, batch, options, torch.float64)
            assert set(m32) == set(m64)
            assert w32.shape == w64.shape
            weights[0].append(w32.ravel())
            weights[1].append(w64.ravel())
            if norms not in tables:
                tables.append(norms)
            rows.append({"options": options, "normalizations": tables.index(norms)})
            logged.append((m32, m64))
        batches.append({"tm_dtype": batch["tm_dtype"], "sm_dtype": batch["sm_dtype"], "settings": rows})
    names = sorted({k for m32, _ in logged for k in m32})
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    arrays["weights32"], arrays["weights64"] = (np.concatenate(w) for w in weights)
    for i, key in enumerate(("metrics32", "metrics64")):
        vals = np.array([[m[i].get(k, np.nan) for k in names] for m in logged])
        present = np.array([[k in m[i] for k in names] for m in logged])
        arrays[key] = np.where(present, vals, np.nan)
        arrays[key.replace("metrics", "nan")] = (present & np.isnan(vals)).astype(np.uint8)
    meta = {"metric_names": names, "metric_normalizations": tables, "batches": batches}
    write_fixtures(args.out, "nemo_rl", COMMIT, shas, arrays, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
