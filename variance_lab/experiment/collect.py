r"""Collect the data set: sample from the old policy, score under old and new, save.

After :func:`~variance_lab.experiment.train.train`, fresh problems are drawn, each is
answered ``data_samples`` times by the last GSPO iteration's old (sampling) policy, and
every response token is scored, teacher-forced in float64, under the old policy and under
the policy after that iteration's update. The result is written in the toolkit's own
format (:func:`variance_lab.rollouts.io.write_records`; one record per response with ``logp``
= new policy, ``old_logp`` = old policy, ``id``), so :func:`variance_lab.rollouts.io.load_batch`
and ``variance-lab analyze`` read it directly. JSONL records also carry ``prompt_id``,
``sample``, ``n_terms``, ``reward``, ``prompt`` and ``response`` (loaders ignore extra fields).

Beside the data file a JSON sidecar (:func:`~variance_lab.experiment.files.sidecar_path`:
``NAME.json`` for ``NAME.jsonl.gz``; :func:`~variance_lab.experiment.files.dataset_sidecar`)
records the seed and every setting, the versions
(:data:`~variance_lab.provenance.TORCH_VERSIONS`), the training log (losses, accuracies,
per-iteration rewards and clip fractions), phase timings, a summary of the data, and the SHA-256
of the numbers (:func:`~variance_lab.provenance.numbers_sha256`). :func:`run_arith_experiment` does it
all; ``variance-lab experiment run --settings SIDECAR`` reruns a sidecar's recipe.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from variance_lab.experiment.files import (
    ARITH_SIDECAR_KIND,
    dataset_sidecar,
    output_path,
    sidecar_path,
    write_dataset,
)
from variance_lab.experiment.model import sampler_log_probs, score_responses
from variance_lab.experiment.task import Problem, arith_rewards, decode, encode, make_problems
from variance_lab.experiment.train import (
    ARITH_QUICK,
    Settings,
    TrainResult,
    sample_responses,
    streams,
    train,
)
from variance_lab.provenance import TORCH_VERSIONS, deterministic_torch, torch_generator, versions

__all__ = ["collect", "run_arith_experiment"]


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
    old_lp = score_responses(copy.deepcopy(result.old).double(), prompts, responses).numpy()
    new_lp = score_responses(copy.deepcopy(result.new).double(), prompts, responses).numpy()
    roll_lp = (
        sampler_log_probs(sampler, prompts, responses, temperature=settings.temperature).numpy()
        if mismatch
        else None
    )
    texts = [decode(r) for r in responses]
    reward = arith_rewards(rows, texts)
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


def _sidecar(settings: Settings, path: Path, records: list[dict], log: dict) -> dict:
    facts = {
        "seed": settings.seed,
        "quick": settings == replace(ARITH_QUICK, seed=settings.seed),
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
        "versions": versions(TORCH_VERSIONS),
    }
    reproduce = f"variance-lab experiment run --settings {sidecar_path(path).name} --out {path.name}"
    return dataset_sidecar(
        ARITH_SIDECAR_KIND, path, records, facts, after={"training": log}, reproduce=reproduce
    )


def run_arith_experiment(settings: Settings, out, *, progress=None) -> dict:
    """Train, collect and write a data set with its sidecar; deterministic for given settings.

    Runs under :func:`~variance_lab.provenance.deterministic_torch` with
    ``settings.threads`` threads.

    Parameters
    ----------
    settings : Settings
    out : str or Path
        The data file (see :func:`~variance_lab.experiment.files.write_dataset`); the sidecar goes
        beside it.
    progress : callable, optional
        Called with a one-line message after each phase.

    Returns
    -------
    dict
        The sidecar, with ``paths`` (data file and sidecar) added.
    """
    out = output_path(out)
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
