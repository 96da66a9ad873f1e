r"""Collect the data set: sample from the old policy, score under old and new, save.

After :func:`~variance_lab.experiment.train.train`, fresh problems are drawn, each is
answered ``data_samples`` times by the last GSPO iteration's old (sampling) policy, and
every response token is scored, teacher-forced in float64, under the old policy and under
the policy after that iteration's update. The result is written in the toolkit's own
format (:func:`variance_lab.rollouts.io.write_records`; one record per response with ``logp``
= new policy, ``old_logp`` = old policy, ``id``), so :func:`variance_lab.rollouts.io.load_batch`
and ``variance-lab analyze`` read it directly. JSONL records also carry ``prompt_id``,
``sample``, ``n_terms``, ``reward``, ``prompt`` and ``response`` (loaders ignore extra fields).

Beside the data file a JSON sidecar (:func:`sidecar_path`: ``NAME.json`` for
``NAME.jsonl.gz``) records the seed and every setting, the versions, the training log
(losses, accuracies, per-iteration rewards and clip fractions), phase timings, a summary
of the data, and the SHA-256 of the numbers (:func:`numbers_sha256`). :func:`run` does it
all; ``variance-lab experiment run --settings SIDECAR`` reruns a sidecar's recipe.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from variance_lab import __version__
from variance_lab.experiment.files import SIDECAR_KIND, cpu_model, numbers_sha256, sidecar_path
from variance_lab.experiment.model import sampler_log_probs, score
from variance_lab.experiment.task import Problem, decode, encode, make_problems, rewards
from variance_lab.experiment.train import (
    QUICK,
    Settings,
    TrainResult,
    deterministic_torch,
    sample_responses,
    streams,
    torch_generator,
    train,
)
from variance_lab.rollouts.io import detect_format, write_records

__all__ = ["collect", "run", "summarize", "versions", "write_dataset"]

SIDECAR_VERSION = 1


def _problem_rows(settings: Settings) -> list[Problem]:
    """Return the data set's problems, each repeated ``data_samples`` times (a group per problem)."""
    rng = np.random.default_rng(streams(settings.seed)["data_prompts"])
    problems = make_problems(rng, settings.data_prompts, settings.n_min, settings.n_max)
    return [p for p in problems for _ in range(settings.data_samples)]


def collect(result: TrainResult, settings: Settings) -> list[dict]:
    """Sample the data set from ``result.old`` and score it under ``result.old`` and ``result.new``.

    Parameters
    ----------
    result : TrainResult
    settings : Settings
        The settings ``result`` was trained with.

    Returns
    -------
    list of dict
        One record per response, problem after problem (``id`` is ``"PROMPT-SAMPLE"``), with
        ``logp`` (new policy) and ``old_logp`` (old policy) as float64 lists over the
        response tokens (the end token included when produced).
    """
    rows = _problem_rows(settings)
    generator = torch_generator(streams(settings.seed)["data_sample"])
    mismatch = settings.sampler_dtype == "bfloat16"
    sampler = copy.deepcopy(result.old).to(torch.bfloat16) if mismatch else result.old
    responses = sample_responses(sampler, rows, generator, settings)
    prompts = [encode(p.prompt) for p in rows]
    old_lp = score(copy.deepcopy(result.old).double(), prompts, responses).numpy()
    new_lp = score(copy.deepcopy(result.new).double(), prompts, responses).numpy()
    roll_lp = (
        sampler_log_probs(sampler, prompts, responses, temperature=settings.temperature).numpy()
        if mismatch
        else None
    )
    texts = [decode(r) for r in responses]
    reward = rewards(rows, texts)
    k = settings.data_samples
    records = [
        {
            "id": f"{i // k}-{i % k}",
            "prompt_id": i // k,
            "sample": i % k,
            "n_terms": p.n,
            "reward": float(reward[i]),
            "prompt": p.prompt,
            "response": texts[i],
            "logp": new_lp[i, : len(r)].tolist(),
            "old_logp": old_lp[i, : len(r)].tolist(),
        }
        for i, (p, r) in enumerate(zip(rows, responses, strict=True))
    ]
    if roll_lp is not None:
        for rec, r, lp in zip(records, responses, roll_lp, strict=True):
            rec["rollout_logp"] = lp[: len(r)].tolist()
    return records


def summarize(records: list[dict]) -> dict:
    """Size, lengths, rewards and pooled log-ratio moments of a data set.

    Parameters
    ----------
    records : list of dict

    Returns
    -------
    dict
    """
    lengths = np.array([len(r["logp"]) for r in records])
    d = np.concatenate([np.subtract(r["logp"], r["old_logp"]) for r in records])
    out = {
        "n_sequences": len(records),
        "n_tokens": int(lengths.sum()),
        "length_min": int(lengths.min()),
        "length_median": float(np.median(lengths)),
        "length_max": int(lengths.max()),
        "mean_log_ratio": float(d.mean()),
        "var_log_ratio": float(d.var(ddof=1)),
    }
    if all("rollout_logp" in r for r in records):
        m = np.concatenate([np.subtract(r["old_logp"], r["rollout_logp"]) for r in records])
        out["mean_mismatch_log_ratio"] = float(m.mean())
        out["var_mismatch_log_ratio"] = float(m.var(ddof=1))
    if all("reward" in r for r in records):
        out["mean_reward"] = float(np.mean([r["reward"] for r in records]))
    return out


def write_dataset(records: list[dict], path, sidecar: dict) -> tuple[Path, Path]:
    """Write the records (format from the name) and the sidecar, each atomically.

    Parameters
    ----------
    records : list of dict
    path : str or Path
        ``.jsonl``, ``.jsonl.gz``, ``.parquet`` or ``.npz`` (Parquet and NPZ keep only ``id``,
        ``logp`` and ``old_logp``).
    sidecar : dict
        Written as JSON to :func:`sidecar_path` of ``path``.

    Returns
    -------
    (Path, Path)
        The data file and the sidecar.
    """
    path = Path(path)
    detect_format(path)
    if not path.parent.is_dir():
        raise ValueError(f"folder {str(path.parent)!r} does not exist")
    side = sidecar_path(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".experiment-"))
    try:
        write_records(records, tmp / path.name)
        (tmp / side.name).write_text(json.dumps(sidecar, indent=1) + "\n")
        os.replace(tmp / path.name, path)
        os.replace(tmp / side.name, side)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path, side


def versions() -> dict:
    """Return the software and hardware a run's float32 numbers depend on (the sidecar's ``versions``).

    Besides the package versions: ``cpu`` (the processor's model name) and ``cpu_capability``
    (the instruction set PyTorch dispatches its kernels to, :func:`torch.backends.cpu.get_cpu_capability`).
    Training is chaotic: a difference in the last bit of a float32 sum (another processor,
    another kernel path) grows until other tokens are sampled, so a data set reproduces
    exactly only with the same versions on the same kind of processor, with
    ``settings.threads`` threads.

    Returns
    -------
    dict
    """
    return {
        "variance_lab": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _sidecar(settings: Settings, path: Path, records: list[dict], log: dict) -> dict:
    return {
        "kind": SIDECAR_KIND,
        "sidecar_version": SIDECAR_VERSION,
        "data_file": path.name,
        "seed": settings.seed,
        "quick": settings == replace(QUICK, seed=settings.seed),
        "settings": settings.to_dict(),
        "fields": {
            "logp": "new policy (after the last GSPO iteration's update)",
            "old_logp": "old policy (the last GSPO iteration's sampling policy)",
            **(
                {"rollout_logp": "the bfloat16 sampler's own log-probs (sampler_log_probs), float64"}
                if settings.sampler_dtype == "bfloat16"
                else {}
            ),
        },
        "versions": versions(),
        "numbers_sha256": numbers_sha256(records),
        "summary": summarize(records),
        "training": log,
        "reproduce": f"variance-lab experiment run --settings {sidecar_path(path).name} --out {path.name}",
    }


def run(settings: Settings, out, *, progress=None) -> dict:
    """Train, collect and write a data set with its sidecar; deterministic for given settings.

    Runs under :func:`~variance_lab.experiment.train.deterministic_torch` with
    ``settings.threads`` threads.

    Parameters
    ----------
    settings : Settings
    out : str or Path
        The data file (see :func:`write_dataset`); the sidecar goes beside it.
    progress : callable, optional
        Called with a one-line message after each phase.

    Returns
    -------
    dict
        The sidecar, with ``paths`` (data file and sidecar) added.
    """
    out = Path(out)
    detect_format(out)
    say = progress or (lambda message: None)
    t0 = time.perf_counter()
    with deterministic_torch(settings.threads):
        result = train(settings)
        say(f"trained in {time.perf_counter() - t0:.1f} s")
        t1 = time.perf_counter()
        records = collect(result, settings)
    log = result.log
    log["timing_s"]["collect"] = time.perf_counter() - t1
    log["timing_s"]["total"] = time.perf_counter() - t0
    sidecar = _sidecar(settings, out, records, log)
    paths = write_dataset(records, out, sidecar)
    say(f"collected {len(records)} sequences in {log['timing_s']['collect']:.1f} s")
    return {**sidecar, "paths": [str(p) for p in paths]}
