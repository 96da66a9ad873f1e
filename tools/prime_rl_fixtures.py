"""Write the fixtures that pin variance_lab.frameworks.prime_rl to prime-rl's own code.

prime-rl's trainer needs CUDA, FSDP and its config package, but its loss functions need only
torch. Run it with torch and a checkout of PrimeIntellect-ai/prime-rl at commit 559b447::

    git clone https://github.com/PrimeIntellect-ai/prime-rl /tmp/prime-rl
    git -C /tmp/prime-rl checkout 559b44772e471d1538537b8805cc77f3824a5e64
    python tools/prime_rl_fixtures.py /tmp/prime-rl tests/data/frameworks

(The committed fixtures were written that way with torch 2.13.0+cpu, from the file of the
snapshot 559b44772e471d1538537b8805cc77f3824a5e64; its SHA-256 is in ``prime_rl.json``.)

What runs, from ``src/prime_rl/trainer/rl/loss.py``, verbatim (each definition's own text, cut
out of the module, which imports prime-rl's config package, and executed): ``LossInputs``,
``LossOutputs``, ``_safe_mean``, ``compute_importance_ratio_and_mismatch_kl``,
``default_loss_fn``, ``ipo_loss_fn``, ``ref_kl_loss_fn``, ``ce_loss_fn`` and ``compute_loss``.
jaxtyping's ``Float``/``Bool``/``Int`` annotations are replaced by ``Tensor`` (they only
annotate). The loss configs are namespaces with the fields of ``DefaultLossConfig`` and
``IPOLossConfig`` (``packages/prime-rl-configs/src/prime_rl/configs/trainer.py``; their
defaults are read from that file); ``setup_rl_loss_fn``'s two-line closures are restated.

What comes out: ``compute_loss``'s aggregated metrics (one value per sample that ran each loss
fn, as the trainer's ``Tensors`` collects them) and, per sample, each loss fn's own
``keep_mask`` local (read from its frame as it returns: prime-rl's mask, not one rebuilt here).

Each of 24 random batches (1 to 6 samples of 1 to 24 tokens, float32 log-probs, bool loss masks
with holes, some all False, per-token float32 advantages of both signs and zero, reference
log-probs, ``rl_weights`` and ``ref_kl_weights`` with zeros, some samples all zero, or absent)
runs 4 settings (``default`` at its defaults and at random bounds, ``ipo`` at its default and at
a random threshold), with probability differences placed exactly at each bound in float32, each
in float32 (what prime-rl runs) and in float64 (the same inputs cast up: prime-rl's own rounding
is the difference). ``prime_rl.npz`` holds the inputs (each batch's padded (B, T) arrays,
raveled and concatenated; ``shapes`` gives (B, T)), the metrics (``m32``, ``m64``, flat, cut by
``prime_rl.json``'s per-setting offsets) and the keep masks of each run (``rl_keep32``, ...,
flat over the batch's padded tokens, 0 where a sample did not run).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from fixture_files import checkout_args, exec_definitions, file_shas, padded, write_fixtures

COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
LOSS = "src/prime_rl/trainer/rl/loss.py"
CONFIGS = "packages/prime-rl-configs/src/prime_rl/configs/trainer.py"
WANTED = (
    "LossInputs",
    "LossOutputs",
    "_safe_mean",
    "compute_importance_ratio_and_mismatch_kl",
    "default_loss_fn",
    "ipo_loss_fn",
    "ref_kl_loss_fn",
    "ce_loss_fn",
    "compute_loss",
)
N_BATCHES = 24
PAD = 0.0  # padding of the (B, T) arrays; prime-rl never sees it (it splits by sequence length)


class _Annotation:
    """jaxtyping's ``Float[Tensor, "seq"]`` read as ``Tensor`` (annotations only)."""

    def __getitem__(self, item):
        import torch

        return torch.Tensor


def load_prime_rl(root: Path) -> tuple[dict, dict, dict]:
    """Return (the definitions cut out of loss.py, the loss configs' defaults, each file's SHA-256)."""
    from dataclasses import dataclass, field

    import torch

    ns: dict = {"torch": torch, "Tensor": torch.Tensor, "Any": Any, "dataclass": dataclass, "field": field}
    ns["Callable"] = __import__("typing").Callable
    ns.update(Float=_Annotation(), Bool=_Annotation(), Int=_Annotation())
    # with the decorators (the two dataclasses; the functions have none)
    exec_definitions(root / LOSS, WANTED, ns, ast.FunctionDef | ast.ClassDef)
    ns["LossFn"] = Any
    defaults = {}
    tree = ast.parse((root / CONFIGS).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("DefaultLossConfig", "IPOLossConfig"):
            fields = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.value, ast.Call):
                    fields[item.target.id] = ast.literal_eval(item.value.args[0])
            defaults[node.name] = fields
    return ns, defaults, file_shas(root, (LOSS, CONFIGS))


def _at_bound(rng, target: float) -> tuple[np.float32, np.float32]:
    """Return float32 (trainer, inference) log-probs whose float32 probabilities differ by fl32(target).

    Searched with the correctly rounded float32 exp (torch's differs from it by an ulp on about 1 %
    of inputs, so a few pairs may land an ulp off: the fixtures record what prime-rl decided).
    """
    t32 = np.float32(target)
    steps = np.arange(-64, 65, dtype=np.float32)
    for _ in range(5000):
        q = rng.uniform(0.001, 0.999)
        if not 0.0 < q + target < 1.0:
            continue
        i = np.float32(np.log(q))
        q32 = np.float32(np.exp(np.float64(i)))
        t0 = np.float32(np.log(np.float64(q32) + target))
        t = np.minimum(t0 + steps * np.spacing(t0), np.float32(0.0)).astype(np.float32)
        d = (np.exp(t.astype(np.float64)).astype(np.float32) - q32).astype(np.float32)
        hit = np.flatnonzero(d == t32)
        if hit.size:
            return t[hit[0]], i
    raise RuntimeError(f"no float32 pair at {target}")


def make_batch(rng: np.random.Generator, bounds: list[float]) -> dict:
    """One micro-batch of prime-rl samples (per-sample float32 arrays, bool loss masks)."""
    B = int(rng.integers(1, 7))
    rl_w = rng.random() < 0.6
    ref_w = rng.random() < 0.7
    samples = []
    for n in rng.integers(1, 25, size=B):
        inf = -rng.exponential(1.0, n)
        y = rng.standard_t(3.0, n) * rng.choice([0.05, 0.3, 1.0])
        train = np.minimum(inf + y, 0.0)
        t32, i32 = train.astype(np.float32), inf.astype(np.float32)
        for j in np.flatnonzero(rng.random(n) < 0.2):  # probability differences at a bound
            t32[j], i32[j] = _at_bound(rng, float(rng.choice(bounds)))
        mask = rng.random(n) < 0.85
        if rng.random() < 0.12:
            mask[:] = False
        adv = np.full(n, rng.choice([1.0, -1.0, 0.0, 0.5]))
        if rng.random() < 0.3:
            adv = rng.choice([1.0, -1.0, 0.0], n)
        w = rng.choice([0.0, 0.5, 1.0], n, p=[0.2, 0.3, 0.5])
        if rng.random() < 0.15:
            w[:] = 0.0
        kw = rng.choice([0.0, 1.0], n, p=[0.4, 0.6])
        if rng.random() < 0.15:
            kw[:] = 0.0
        samples.append(
            {
                "trainer": t32,
                "inference": i32,
                "ref": np.minimum(inf + rng.normal(0, 0.3, n), 0.0).astype(np.float32),
                "advantages": adv.astype(np.float32),
                "mask": mask,
                "rl_weights": w.astype(np.float32) if rl_w else None,
                "ref_kl_weights": kw.astype(np.float32) if ref_w else None,
            }
        )
    return {"samples": samples, "rl_weights": rl_w, "ref_kl_weights": ref_w}


class _Locals:
    """Record each loss fn's ``keep_mask`` local as it returns (sys.setprofile)."""

    NAMES = ("default_loss_fn", "ipo_loss_fn", "ref_kl_loss_fn")

    def __init__(self):
        self.calls: list[tuple[str, np.ndarray]] = []

    def __call__(self, frame, event, arg):
        if event == "return" and frame.f_code.co_name in self.NAMES and "keep_mask" in frame.f_locals:
            self.calls.append((frame.f_code.co_name, frame.f_locals["keep_mask"].numpy().copy()))


def run_setting(ns, batch: dict, kind: str, config: SimpleNamespace, dtype) -> tuple[dict, list]:
    """compute_loss on the batch in ``dtype``: (aggregated metrics as float64 arrays, loss-fn calls)."""
    import torch

    s = batch["samples"]

    def stream(key, cast=True):
        if s[0][key] is None:
            return None
        return [torch.from_numpy(x[key]).to(dtype) if cast else torch.from_numpy(x[key]) for x in s]

    fn = ns["default_loss_fn"] if kind == "default" else ns["ipo_loss_fn"]
    recorder = _Locals()
    sys.setprofile(recorder)
    try:
        _, metrics = ns["compute_loss"](
            trainer_logprobs=stream("trainer"),
            inference_logprobs=stream("inference"),
            ref_logprobs=stream("ref"),
            advantages=stream("advantages"),
            loss_mask=stream("mask", cast=False),
            rl_weights=stream("rl_weights"),
            ce_weights=None,
            ref_kl_weights=stream("ref_kl_weights"),
            rl_loss_fn=lambda inputs: fn(inputs, config),
            rl_scale=1,
            ce_scale=1,
            ref_kl_scale=1,
        )
    finally:
        sys.setprofile(None)
    return {k: v.double().numpy() for k, v in metrics.items()}, recorder.calls


def keep_masks(batch: dict, calls: list, T: int) -> dict[str, np.ndarray]:
    """Each component's keep mask as a (B, T) uint8 array (0 where its loss fn did not run) and who ran."""
    s = batch["samples"]
    B = len(s)
    out = {"rl_keep": np.zeros((B, T), np.uint8), "ref_keep": np.zeros((B, T), np.uint8)}
    ran = {"rl_ran": np.zeros(B, np.uint8), "ref_ran": np.zeros(B, np.uint8)}
    it = iter(calls)
    for b, x in enumerate(s):  # compute_loss's order: rl then ref_kl, for each sample
        n = len(x["trainer"])
        rl_mask = x["mask"] if x["rl_weights"] is None else x["mask"] & (x["rl_weights"] != 0)
        if x["rl_weights"] is None or rl_mask.any():
            name, keep = next(it)
            assert name != "ref_kl_loss_fn"
            out["rl_keep"][b, :n], ran["rl_ran"][b] = keep, 1
        if x["ref_kl_weights"] is not None and (x["ref_kl_weights"] != 0).any():
            name, keep = next(it)
            assert name == "ref_kl_loss_fn"
            out["ref_keep"][b, :n], ran["ref_ran"][b] = keep, 1
    assert next(it, None) is None
    return {**{k: v.ravel() for k, v in out.items()}, **ran}


def main(argv=None) -> int:
    """Write prime_rl.npz and prime_rl.json; print their sizes."""
    import torch

    args = checkout_args(__doc__, "prime_rl", "a checkout of PrimeIntellect-ai/prime-rl at 559b447", argv)
    ns, defaults, shas = load_prime_rl(args.prime_rl)
    d_def, i_def = defaults["DefaultLossConfig"], defaults["IPOLossConfig"]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(20260822)))
    keys = ("trainer", "inference", "ref", "advantages", "mask", "rl_weights", "ref_kl_weights")
    inputs: dict[str, list] = {k: [] for k in keys}
    out: dict[str, list] = {
        k: []
        for k in ("m32", "m64", "rl_keep32", "rl_keep64", "ref_keep32", "ref_keep64", "rl_ran", "ref_ran")
    }
    shapes, batches, offset = [], [], 0
    for _ in range(N_BATCHES):
        low, high = (float(rng.choice([0.0, 0.05, 0.1, 0.3])) for _ in range(2))
        threshold = float(rng.choice([0.0, 0.05, 0.2, 0.3]))
        settings = [
            ("default", {**d_def}),
            ("default", {**d_def, "dppo_mask_low": low, "dppo_mask_high": high}),
            ("ipo", {**i_def}),
            ("ipo", {**i_def, "ipo_threshold": threshold}),
        ]
        bounds = [d_def["dppo_mask_high"], -d_def["dppo_mask_low"], high, -low, -0.2]
        bounds += [i_def["ipo_threshold"], -i_def["ipo_threshold"], threshold, -threshold]
        batch = make_batch(rng, bounds)
        s = batch["samples"]
        T = max(len(x["trainer"]) for x in s)
        shapes.append((len(s), T))
        for k in keys:
            dt = np.bool_ if k == "mask" else np.float32
            inputs[k].append(padded(s, k, False if k == "mask" else PAD, dt, length_key="trainer").ravel())
        meta = []
        for kind, options in settings:
            config = SimpleNamespace(**options)
            m32, c32 = run_setting(ns, batch, kind, config, torch.float32)
            m64, c64 = run_setting(ns, batch, kind, config, torch.float64)
            k32, k64 = keep_masks(batch, c32, T), keep_masks(batch, c64, T)
            assert set(m32) == set(m64)
            np.testing.assert_array_equal(k32["rl_ran"], k64["rl_ran"])
            index = {}
            for name in sorted(m32):
                index[name] = [offset, len(m32[name])]
                offset += len(m32[name])
                out["m32"].append(m32[name])
                out["m64"].append(m64[name])
            for comp in ("rl_keep", "ref_keep"):
                out[f"{comp}32"].append(k32[comp])
                out[f"{comp}64"].append(k64[comp])
            out["rl_ran"].append(k32["rl_ran"])
            out["ref_ran"].append(k32["ref_ran"])
            meta.append({"loss": kind, "options": options, "metrics": index})
        batches.append(
            {"rl_weights": batch["rl_weights"], "ref_kl_weights": batch["ref_kl_weights"], "settings": meta}
        )
    arrays = {k: np.concatenate(v) for k, v in inputs.items()}
    arrays["shapes"] = np.array(shapes, dtype=np.int64)
    arrays.update({k: np.concatenate(v) for k, v in out.items()})
    meta = {"loss_config_defaults": defaults, "padding": PAD, "batches": batches}
    write_fixtures(args.out, "prime_rl", COMMIT, shas, arrays, meta, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
