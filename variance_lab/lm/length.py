r"""The length batch: on-policy responses of chosen lengths from a paired run's own chain.

A paired run's data batch :math:`D` (:mod:`variance_lab.lm.paired`) mixes its task's kinds, so
few of its finished responses are long. The length batch :math:`B` fills the length buckets:
the same seed's chain (the same warm-up, so the same :math:`\theta_{K-1}`) samples ``count``
requests drawn by stratum (:func:`~variance_lab.lm.task.count_strata`; a stratum of
:math:`n` numbers aims at responses of about :math:`5n` tokens) in float32 from its own random
streams (5 and 6, :func:`~variance_lab.lm.runs.random_streams`), scores them under
:math:`\theta_{K-1}` (``old_logp``, with the entropy) and, after update :math:`K` at
``update_lr`` on the minibatch the paired run drew, under :math:`\theta_K` (``logp``). The
batch does not enter any update, so :math:`\theta_K` is the paired run's.

That claim is checked, not assumed: :func:`policy_check` scores the first records of the
seed's on-policy file (prompts rebuilt from the settings, response ids recovered by
:func:`~variance_lab.lm.recover.recover`) under the chain's :math:`\theta_{K-1}` and
:math:`\theta_K` and counts the tokens whose log-probs, rounded as written, equal the file's.
The result goes into the sidecar (``policy_check``). Prompt ids start at
:data:`LENGTH_FIRST_ID`, apart from :math:`D`'s and the minibatches'.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = [
    "LENGTH_FIRST_ID",
    "LengthRun",
    "length_experiment",
    "length_name",
    "policy_check",
    "run_length",
    "write_length",
]

#: The first prompt id of a length batch (the data batch's start at 0, the minibatches' after).
LENGTH_FIRST_ID = 1000
#: How many of the on-policy file's first records :func:`policy_check` scores.
CHECK_RECORDS = 8


def length_name(seed: int, aggregation: str) -> str:
    """Return the file name of a seed's length batch (beside :func:`~variance_lab.lm.paired.paired_names`).

    Parameters
    ----------
    seed : int
    aggregation : str

    Returns
    -------
    str
    """
    return f"smollm2_s{seed}_length_{aggregation}.jsonl.gz"


class LengthRun:
    r"""What a length run measured: the batch, its scores, the update and the policy check.

    Attributes
    ----------
    batch : variance_lab.lm.runs._Batch
    old, new, entropy : list of numpy.ndarray
        Log-probs under :math:`\theta_{K-1}` and :math:`\theta_K`, and :math:`\theta_{K-1}`'s entropy.
    optimizer : dict
        :meth:`~variance_lab.lm.chain.PolicyChain.describe` after update :math:`K`.
    check : dict or None
        :func:`policy_check`'s result.
    timing_s : dict
    """

    def __init__(self, batch, old, new, entropy, optimizer, check, timing_s):
        self.batch, self.old, self.new, self.entropy = batch, old, new, entropy
        self.optimizer, self.check, self.timing_s = optimizer, check, timing_s


def _check_rows(chain, settings, records):
    """Return the on-policy file's first records as (index, prompt ids, response ids recovered)."""
    from variance_lab.lm.recover import prompt_list, recover

    n = min(CHECK_RECORDS, len(records))
    _, prompt_ids = prompt_list(settings, chain.tokenizer)
    found = recover(
        chain.chain.model,
        chain.tokenizer,
        prompt_ids[:n],
        records[:n],
        temperature=settings.temperature,
        batch_size=settings.score_batch,
    )
    return [(i, prompt_ids[i], t) for i, t in enumerate(found.tokens) if t is not None]


def policy_check(chain, rows, records, field: str) -> dict:
    """Count the tokens whose log-probs under ``chain``'s policy, rounded as written, equal ``field``'s.

    Parameters
    ----------
    chain : variance_lab.lm.paired.PairedChain
        Its settings give the scoring's batch size, temperature and the digits written.
    rows : list of (int, list of int, list of int)
        Record index, prompt ids and response ids (recovered by :func:`~variance_lab.lm.recover.recover`).
    records : list of dict
        The on-policy file's records.
    field : {"old_logp", "logp"}

    Returns
    -------
    dict
        ``{"records": n, "tokens": m, "equal": k, "max_abs_diff": d}``.
    """
    from variance_lab.lm.runs import round_digits
    from variance_lab.lm.scoring import score

    s = chain.settings
    if not rows:
        return {"records": 0, "tokens": 0, "equal": 0, "max_abs_diff": None}
    scored = score(
        chain.chain.model,
        [r[1] for r in rows],
        [r[2] for r in rows],
        batch_size=s.score_batch,
        temperature=s.temperature,
        pad_id=chain.tokenizer.pad_token_id,
    )
    equal = tokens = 0
    diff = 0.0
    for (i, _, _), lp in zip(rows, scored, strict=True):
        written = np.asarray(records[i][field])
        equal += int(np.sum(np.asarray(round_digits(lp, s.digits)) == written))
        tokens += written.size
        diff = max(diff, float(np.max(np.abs(lp - written))))
    return {"records": len(rows), "tokens": tokens, "equal": equal, "max_abs_diff": diff}


def run_length(model, tokenizer, settings, *, reference=None, progress=None) -> LengthRun:
    r"""Run a seed's chain to :math:`\theta_K`, sampling and scoring the length batch on the way.

    Parameters
    ----------
    model : transformers causal language model, float32
        :math:`\theta_0` (left unchanged).
    tokenizer : its tokenizer
    settings : variance_lab.lm.settings.LMSettings
        ``run="paired"`` with ``length_strata``; ``update_lr`` the rate of update :math:`K`
        (the paired run's calibrated one; 0: ``lr``).
    reference : list of dict, optional
        That seed's on-policy records, for :func:`policy_check`.
    progress : callable, optional

    Returns
    -------
    LengthRun
    """
    from variance_lab.lm.paired import PairedChain, clipped_fraction
    from variance_lab.lm.runs import draw_batch
    from variance_lab.lm.task import count_strata, parse_strata
    from variance_lab.progress import seconds_since, ticker
    from variance_lab.provenance import torch_generator

    if not settings.length_strata:
        raise ValueError("settings.length_strata is empty: name the strata (LO-HI:K,...)")
    say = progress or (lambda message: None)
    t0 = time.perf_counter()
    c = PairedChain(model, tokenizer, settings)
    c.warm_up(say, "warm-up update")
    timing = {"warm_up": seconds_since(t0)}
    rows = _check_rows(c, settings, reference) if reference else []
    check = {"old_logp": policy_check(c, rows, reference, "old_logp")} if rows else None
    if check:
        say(f"policy check at theta_K-1: {check['old_logp']}")
    t1 = time.perf_counter()
    rng, gen = np.random.default_rng(c.streams[5]), torch_generator(c.streams[6])
    prompts = count_strata(rng, parse_strata(settings.length_strata))
    batch = draw_batch(
        c.chain.model,
        tokenizer,
        settings,
        rng,
        gen,
        len(prompts),
        LENGTH_FIRST_ID,
        prompts=prompts,
        progress=ticker(say, "sampling the length batch"),
    )
    timing["sample"] = seconds_since(t1)
    t1 = time.perf_counter()
    old, entropy = c.score(batch, progress=ticker(say, "scoring (float32)"), entropy=True)
    timing["score_old"] = seconds_since(t1)
    t1 = time.perf_counter()
    if settings.update_lr:
        c.chain.set_lr(settings.update_lr)
    c.update()
    new = c.score(batch, progress=ticker(say, f"scoring after update {c.chain.updates}"))
    if rows:
        check["logp"] = policy_check(c, rows, reference, "logp")
        say(f"policy check: {check}")
    f = clipped_fraction(settings.aggregation, new, old)
    say(f"update {c.chain.updates}: clipped fraction on the length batch {f:.4f}")
    timing["update_and_score"] = seconds_since(t1)
    return LengthRun(batch, old, new, entropy, c.chain.describe(), check, timing)


def write_length(run: LengthRun, settings, folder, *, model_info: dict) -> dict:
    """Write a length run's file and sidecar (atomically); return the sidecar with ``paths``.

    Parameters
    ----------
    run : LengthRun
    settings : variance_lab.lm.settings.LMSettings
    folder : str or Path
        An existing folder; the name is :func:`length_name`'s.
    model_info : dict

    Returns
    -------
    dict
    """
    from variance_lab.experiment.files import dataset_sidecar, write_dataset
    from variance_lab.lm.paired import paired_names, record_fields, reproduce_command, tokens_sha256
    from variance_lab.lm.runs import LM_SIDECAR_KIND, batch_records
    from variance_lab.lm.task import parse_strata
    from variance_lab.provenance import torch_run_facts

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} does not exist")
    records = batch_records(run.batch, run.old, run.new, run.entropy, settings)
    head = {
        "run": "paired",
        "role": "length",
        "aggregation": settings.aggregation,
        "seed": settings.seed,
        "settings": settings.to_dict(),
        "model": model_info,
        "optimizer": run.optimizer,
        "length_strata": [list(s) for s in parse_strata(settings.length_strata)],
        "paired_with": None,
        "same_policies_as": paired_names(settings.seed, settings.aggregation, (), 0)["onpolicy"],
        "policy_check": run.check,
        "tokens_sha256": tokens_sha256(run.batch.samples.tokens),
        "fields": record_fields("onpolicy", settings),
        **torch_run_facts(settings.threads),
        "timing_s": run.timing_s,
    }
    path = folder / length_name(settings.seed, settings.aggregation)
    side = dataset_sidecar(LM_SIDECAR_KIND, path, records, head, reproduce=reproduce_command(settings))
    paths = write_dataset(records, path, side)
    return {**side, "paths": [str(p) for p in paths]}


def length_experiment(settings, folder, *, loaded=None, progress=None) -> list[dict]:
    """Run a seed's length batch end to end and write its file (:func:`run_length`, :func:`write_length`).

    With that seed's on-policy file in ``folder`` (:func:`~variance_lab.lm.paired.paired_names`),
    the run checks its policies against it (:func:`policy_check`).

    Parameters
    ----------
    settings : variance_lab.lm.settings.LMSettings
        ``run="paired"`` with ``length_strata``; the paired run's settings otherwise, with its
        calibrated rate as ``update_lr``.
    folder : str or Path
        An existing folder.
    loaded : (model, tokenizer, dict), optional
        Default: SmolLM2-135M-Instruct (:func:`~variance_lab.lm.model.smollm2_loaded`).
    progress : callable, optional

    Returns
    -------
    list of dict
        The one sidecar, with ``paths``.
    """
    from variance_lab.lm.analysis import read_records
    from variance_lab.lm.model import smollm2_loaded
    from variance_lab.lm.paired import paired_names
    from variance_lab.progress import seconds_since
    from variance_lab.provenance import deterministic_torch

    if settings.run != "paired" or not settings.length_strata:
        raise ValueError(
            f"a length batch needs run 'paired' and length_strata, got run {settings.run!r}, "
            f"length_strata {settings.length_strata!r}"
        )
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} does not exist")
    onpolicy = folder / paired_names(settings.seed, settings.aggregation, (), 0)["onpolicy"]
    reference = read_records(onpolicy) if onpolicy.exists() else None
    t0 = time.perf_counter()
    with deterministic_torch(settings.threads):
        model, tokenizer, info = smollm2_loaded(loaded)
        run = run_length(model, tokenizer, settings, reference=reference, progress=progress)
    run.timing_s["wall"] = seconds_since(t0)
    return [write_length(run, settings, folder, model_info=info)]
