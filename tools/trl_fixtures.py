"""Write the fixtures that pin variance_lab.frameworks.trl to TRL's own code on TRL's dtypes.

Run it in a scratch environment with TRL 1.16.0 from PyPI (CPU-only torch is enough)::

    python -m venv /tmp/trlenv && /tmp/trlenv/bin/pip install torch==2.13.0 trl==1.16.0
    /tmp/trlenv/bin/python tools/trl_fixtures.py tests/data/frameworks

(The committed fixtures were written that way, torch 2.13.0+cpu, on the 2-core AMD EPYC
machine; ``trl_dtypes.json`` records the versions and the SHA-256 of ``grpo_trainer.py``.)

``tools/framework_fixtures.py`` ran TRL's two static methods in float64. A real ``GRPOTrainer``
holds float32 log-probs (``sampling_per_token_logps`` is ``torch.tensor`` of vLLM's Python
floats, ``grpo_trainer.py:2467-2476``) and int64 masks (``completion_mask``, ``torch.long``,
2453-2462; ``tool_mask``, 2480-2483). What runs here, from the installed TRL, verbatim:

- ``GRPOTrainer.get_off_policy_mask`` and ``GRPOTrainer.get_gamma_weights`` (static methods);
- the vLLM importance-sampling block of ``_generate_and_score_completions`` (lines 2660-2707,
  which builds ``importance_sampling_ratio``) and its metric block (2860-2896, the
  ``sampling/...`` metrics), their own text cut out of the file (checked by its SHA-256) and
  executed as one function, ``self`` holding the mode and bounds and an ``accelerator.gather`` of
  one process.

Each of 24 random batches (1 to 8 rows of 0 to 40 tokens, float32 log-probs or float64 every
third batch; int64, bool or float32 masks in turn; a tool mask with holes in some; NaN sampling
log-probs; rows whose only non-zero log-ratio lies exactly at a bound, in the batch's dtype; rows
whose sum overflows float32's exp) runs every mode at several bounds, the off-policy mask at
thresholds some rows' mean equals exactly, and the gamma weights with and without TRL's own
token-level ratio. A float32 batch runs again in float64 (its inputs cast up) and in float32 with
its positions permuted (the same permutation of the columns for every row): TRL's own rounding.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from fixture_files import write_fixtures

SHA256 = "1c3dc2253fb3653269c11dfce4f946f74201a4cb63e0887a37e8e3bb4a3f5503"  # trl 1.16.0's grpo_trainer.py
#: The two blocks of ``_generate_and_score_completions``: first and last line, 1-based.
IS_BLOCK, METRIC_BLOCK = (2660, 2707), (2860, 2896)
N_BATCHES = 24
MASK_DTYPES = ("int64", "bool", "float32")
#: (mode, clip_min, clip_max) of each IS setting.
IS_SETTINGS = (
    ("sequence_mask", None, 3.0),
    ("sequence_mask", 0.5, 1.1),
    ("sequence_truncate", None, 3.0),
    ("sequence_truncate", 0.8, None),
    ("token_truncate", None, 3.0),
    ("token_truncate", 0.5, 1.1),
    ("token_mask", 0.5, 2.0),
    ("token_mask", None, 1.2),
)
GAMMA_CASES = {"default": {}, "custom": {"k_pos": 1.5, "lambda_pos": 2.0, "k_neg": 4.0, "lambda_neg": 0.5}}
METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


def load_is_block():
    """Return TRL's two inline blocks as one function of (self, old, sampling, masks, device, mode)."""
    import torch
    import trl.trainer.grpo_trainer as g
    from trl.trainer.utils import nanmax, nanmin

    path = Path(g.__file__)
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise SystemExit(f"{path} is not TRL 1.16.0's grpo_trainer.py")
    lines = data.decode().splitlines(keepends=True)
    body = "".join(
        textwrap.indent(textwrap.dedent("".join(lines[a - 1 : b])), "    ")
        for a, b in (IS_BLOCK, METRIC_BLOCK)
    )
    source = (
        "def trl_is_block(self, old_per_token_logps, sampling_per_token_logps, completion_mask, tool_mask,"
        " device, mode):\n" + body + "    return vllm_importance_sampling_ratio\n"
    )
    ns = {"torch": torch, "math": math, "nanmin": nanmin, "nanmax": nanmax}
    exec(compile(source, f"{path}:{IS_BLOCK[0]}", "exec"), ns)
    return ns["trl_is_block"], {"grpo_trainer.py": SHA256}


def _pair(rng, target: float, dtype, fn) -> tuple:
    """Return (a, b) in ``dtype`` with fn(a - b) == fn(target) in ``dtype`` (the nearest where none is)."""
    want, best, gap = fn(dtype(target)), None, np.inf
    for _ in range(50):
        b = dtype(-rng.uniform(0.01, 3.0))
        a0 = dtype(np.float64(b) + np.float64(target))
        for k in range(-64, 65):
            a = dtype(a0 + dtype(k) * np.spacing(a0)) if k else a0
            g = abs(float(fn(dtype(a - b))) - float(want))
            if g == 0:
                return a, b
            if g < gap:
                best, gap = (a, b), g
    return best


def _exp_in(dtype):
    return lambda x: dtype(np.exp(np.float64(x)))


def make_batch(rng, dtype, thresholds) -> dict:
    """One batch: (B, T) old, sampling and current log-probs in ``dtype``, masks, (B, 1) advantages."""
    B = int(rng.integers(1, 9))
    lengths = rng.integers(0, 41, size=B)
    lengths[rng.random(B) < 0.25] = 1
    T = max(int(lengths.max()), 1)
    shape = (B, T)
    mask = np.arange(T)[None, :] < lengths[:, None]
    tool = None
    if rng.random() < 0.4:
        tool = ~((rng.random(shape) < 0.15) & mask)  # tool-output tokens: 0
    sampling = -rng.exponential(1.0, shape)
    y = rng.standard_t(3.0, shape) * rng.choice([0.01, 0.1, 0.5])
    old = sampling + y
    new = old + rng.normal(0.0, 0.05, shape)
    old, sampling, new = (x.astype(dtype) for x in (old, sampling, new))
    bounds = [3.0, 0.5, 1.1, 0.8, 2.0, 1.2]
    for i in range(B):
        r = rng.random()
        if r < 0.3 and lengths[i]:  # one log-ratio at a bound, the others exactly 0
            old[i] = sampling[i]
            j = int(rng.integers(lengths[i]))
            old[i, j], sampling[i, j] = _pair(rng, math.log(float(rng.choice(bounds))), dtype, _exp_in(dtype))
        elif r < 0.4 and lengths[i] >= 4:  # a sum beyond float32's exp (88.72)
            old[i, :4] = sampling[i, :4] + dtype(25.0)
        elif r < 0.6 and 1 <= lengths[i] <= 2:  # a mean of sampling - new exactly at a threshold
            a, b = _pair(rng, float(rng.choice(thresholds)), dtype, lambda x: x)
            sampling[i], new[i] = a, b
    for i, j in zip(*np.nonzero((rng.random(shape) < 0.08) & mask), strict=True):
        if rng.random() < 0.5:
            sampling[i, j] = np.nan  # a token vLLM could not score
        else:  # a token at a bound on its own
            old[i, j], sampling[i, j] = _pair(rng, math.log(float(rng.choice(bounds))), dtype, _exp_in(dtype))
    pad = ~mask
    old[pad], sampling[pad], new[pad] = dtype(-2.5), dtype(0.0), dtype(0.7)  # TRL pads vLLM's with 0.0
    adv = rng.choice([1.0, -1.0, 0.0, -0.5, 0.3], size=(B, 1)).astype(dtype)
    return {"old": old, "sampling": sampling, "new": new, "mask": mask, "tool": tool, "adv": adv}


def _tensors(batch, dtype, mask_dtype, perm):
    import torch

    cols = slice(None) if perm is None else perm

    def t(x, dt):
        return torch.from_numpy(np.ascontiguousarray(x[:, cols])).to(dt)

    fdt = {np.float32: torch.float32, np.float64: torch.float64}[dtype]
    mdt = getattr(torch, mask_dtype)
    out = {k: t(batch[k], fdt) for k in ("old", "sampling", "new")}
    out["mask"] = t(batch["mask"], mdt)
    out["tool"] = None if batch["tool"] is None else t(batch["tool"], mdt)
    out["adv"] = torch.from_numpy(batch["adv"]).to(fdt)
    return out


def run_batch(block, batch, dtype, mask_dtype, thresholds, perm=None) -> dict:
    """Every setting on the batch in ``dtype`` (columns permuted by ``perm``): TRL's outputs as float64."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    t = _tensors(batch, dtype, mask_dtype, perm)
    out = {"is_ratio": [], "is_metrics": [], "off_policy": [], "gamma": []}
    token_ratios = {}
    for mode, lo, hi in IS_SETTINGS:
        self = SimpleNamespace(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_min=lo,
            vllm_importance_sampling_clip_max=hi,
            accelerator=SimpleNamespace(gather=lambda x: x.reshape(-1)),
            _metrics=defaultdict(lambda: defaultdict(list)),
        )
        ratio = block(self, t["old"], t["sampling"], t["mask"], t["tool"], "cpu", "train")
        out["is_ratio"].append(ratio.double().numpy().ravel())
        out["is_metrics"].append([self._metrics["train"][k][0] for k in METRICS])
        if mode.startswith("token"):
            token_ratios[(mode, lo, hi)] = ratio
    loss_mask = t["mask"] if t["tool"] is None else t["mask"] * t["tool"]
    for thr in thresholds:
        keep = GRPOTrainer.get_off_policy_mask(t["adv"], t["new"], t["sampling"], loss_mask, thr)
        out["off_policy"].append(keep.double().numpy().ravel())
    rhos = [None, token_ratios[("token_truncate", None, 3.0)], token_ratios[("token_mask", 0.5, 2.0)]]
    for kwargs in GAMMA_CASES.values():
        for rho in rhos:
            phi = GRPOTrainer.get_gamma_weights(t["adv"], t["new"] - t["old"], loss_mask, rho, **kwargs)
            out["gamma"].append(phi.double().numpy().ravel())
    return {k: [np.asarray(v, dtype=np.float64) for v in vs] for k, vs in out.items()}


def main(argv=None) -> int:
    """Write trl_dtypes.npz and trl_dtypes.json; print their sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the fixtures (tests/data/frameworks)")
    args = parser.parse_args(argv)
    block, shas = load_is_block()
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260903)))
    inputs: dict[str, list] = {k: [] for k in ("old", "sampling", "new", "mask", "tool", "adv")}
    runs: dict[str, dict[str, list]] = {r: defaultdict(list) for r in ("own", "f64", "perm")}
    batches, shapes = [], []
    for b in range(N_BATCHES):
        dtype = np.float64 if b % 3 == 2 else np.float32
        mask_dtype = MASK_DTYPES[b % len(MASK_DTYPES)]
        thresholds = [0.0, 0.1, float(rng.choice([0.01, 0.05, 0.3]))]
        batch = make_batch(rng, dtype, thresholds)
        B, T = batch["mask"].shape
        shapes.append((B, T))
        for k in ("old", "sampling", "new"):
            inputs[k].append(batch[k].astype(np.float64).ravel())
        inputs["mask"].append(batch["mask"].astype(np.uint8).ravel())
        tool = np.ones((B, T), bool) if batch["tool"] is None else batch["tool"]
        inputs["tool"].append(tool.astype(np.uint8).ravel())
        inputs["adv"].append(batch["adv"].astype(np.float64).ravel())
        perm = rng.permutation(T)
        for name, (dt, p) in {"own": (dtype, None), "f64": (np.float64, None), "perm": (dtype, perm)}.items():
            got = run_batch(block, batch, dt, mask_dtype, thresholds, p)
            for k, v in got.items():
                runs[name][k].extend(v)
        batches.append(
            {
                "dtype": np.dtype(dtype).name,
                "mask_dtype": mask_dtype,
                "tool_mask": batch["tool"] is not None,
                "thresholds": thresholds,
                "perm": perm.tolist(),
            }
        )
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    for name, got in runs.items():
        for k in ("is_ratio", "off_policy", "gamma"):
            arrays[f"{name}/{k}"] = np.concatenate(got[k])
        arrays[f"{name}/is_metrics"] = np.array(got["is_metrics"], dtype=np.float64)
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    from importlib.metadata import version

    meta = {
        "is_settings": [list(s) for s in IS_SETTINGS],
        "gamma_cases": [[name, kwargs] for name, kwargs in GAMMA_CASES.items()],
        "gamma_rho": [None, ["token_truncate", None, 3.0], ["token_mask", 0.5, 2.0]],
        "metrics": list(METRICS),
        "batches": batches,
    }
    write_fixtures(args.out, "trl_dtypes", None, shas, arrays, meta, versions={"trl": version("trl")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
