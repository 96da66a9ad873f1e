r"""The paired run: one batch of responses, every comparison made on its own tokens.

A trainer's policy :math:`\theta` is a :class:`~variance_lab.lm.chain.PolicyChain` (one AdamW
optimizer whose moments persist). The run takes :math:`K - 1` updates on fresh on-policy
minibatches (``updates`` = :math:`K`), then samples the data batch :math:`D` from
:math:`\theta_{K-1}` in float32 and scores the same tokens

- under :math:`\theta_{K-1}` in float32 (``old_logp``, and the entropy of each position);
- under bfloat16 and float16 copies of :math:`\theta_{K-1}`
  (:func:`~variance_lab.lm.precision.low_precision_copy`), as their samplers compute
  (:func:`~variance_lab.lm.scoring.processed_log_probs`, log-softmax in float32): the precision
  mismatch, each token compared with itself;
- under the top-p / top-k sampler of :math:`\theta_{K-1}`: its kept mass :math:`\log S_t` at
  each token, and whether the token is in its kept set (a token outside it is one the top-p
  sampler never draws: masked, and counted apart);
- under :math:`\theta_K, \theta_{K+1}, \dots, \theta_{K+L}` (``lags`` = :math:`L`), each one
  update of the chain on a fresh on-policy minibatch after the one before.

Then :math:`\theta_{K-1+\ell} \to \theta_{K+\ell}` is the trainer's update at staleness
:math:`\ell`: the data were sampled :math:`\ell` updates before the trainer's old policy. The
files of one seed (:func:`paired_names`): ``onpolicy`` (``old_logp`` = :math:`\theta_{K-1}`,
``logp`` = :math:`\theta_K`), ``mismatch_<sampler>`` (the same, with the sampler's
``rollout_logp``), ``stale_lag<l>`` (``rollout_logp`` = :math:`\theta_{K-1}`, ``old_logp`` =
:math:`\theta_{K-1+\ell}`, ``logp`` = :math:`\theta_{K+\ell}`). They hold the same record ids
and tokens; each sidecar names the on-policy file (``paired_with``) and records the batch's
``tokens_sha256`` and the ``optimizer`` (:meth:`~variance_lab.lm.chain.PolicyChain.describe`).

The learning rate comes from :func:`calibrate_lr`: the rate at which update :math:`K`'s
clipped-token fraction (:func:`clipped_fraction`) meets a published target, for example the
GSPO paper's (:data:`PUBLISHED_CLIP_FRACTIONS`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from pathlib import Path

import numpy as np

from variance_lab.lm.chain import PolicyChain
from variance_lab.lm.losses import CLIP
from variance_lab.progress import seconds_since
from variance_lab.ratios.bounds import CLOSED, outside
from variance_lab.ratios.defaults import eps_range

__all__ = [
    "PAIRED_SAMPLERS",
    "PUBLISHED_CLIP_FRACTIONS",
    "PairedChain",
    "PairedRun",
    "calibrate",
    "calibrate_lr",
    "clipped_fraction",
    "paired_experiment",
    "paired_names",
    "paired_records",
    "record_fields",
    "reproduce_command",
    "run_paired",
    "tokens_sha256",
    "write_paired",
]

#: The paired samplers of a run: 16-bit copies and the top-p / top-k sampler, all of :math:`\theta_{K-1}`.
PAIRED_SAMPLERS = ("bf16", "fp16", "top-p")
#: The average fraction of clipped tokens over the RL training of the GSPO paper's runs
#: (Zheng et al., arXiv 2507.18071, the bar chart "fractions of clipped tokens": GSPO 0.15 with its
#: sequence band (3e-4, 4e-4); GRPO 0.0013 with token clipping), read off the figure; the toolkit's
#: ``token-mean`` loss is the token-level one.
PUBLISHED_CLIP_FRACTIONS = {"gspo": 0.15, "token-mean": 0.0013}


def clipped_fraction(aggregation: str, logp, old_logp) -> float:
    r"""Return the fraction of tokens whose weight lies outside the loss's clip band.

    GSPO clips a sequence when :math:`s_i = \exp(\frac{1}{T_i}\sum_t d_{it})` lies outside
    :math:`[1 - \varepsilon_l, 1 + \varepsilon_h]`, and then all :math:`T_i` of its tokens count;
    the token losses clip token :math:`t` when :math:`r_{it} = e^{d_{it}}` does. A weight exactly
    at a bound is inside (the losses' convention, :func:`~variance_lab.ratios.bounds.outside`
    with ``CLOSED``). Whether the clip binds also depends on the advantage's sign; this is the
    fraction of tokens the band reaches, whatever their advantage.

    Parameters
    ----------
    aggregation : {"gspo", "token-mean", "seq-mean-token-mean"}
    logp, old_logp : list of array_like
        Per sequence, the token log-probs after and before the update.

    Returns
    -------
    float
    """
    lo, hi = eps_range(*CLIP[aggregation])
    if len(logp) != len(old_logp) or not logp:
        raise ValueError(
            f"logp and old_logp need the same number of sequences, got {len(logp)}, {len(old_logp)}"
        )
    d = [np.asarray(a, dtype=float) - np.asarray(b, dtype=float) for a, b in zip(logp, old_logp, strict=True)]
    lengths = np.array([x.size for x in d])
    if aggregation == "gspo":
        mean = np.array([x.mean() for x in d])
        hit = outside(mean, lo, hi, inclusive=CLOSED, space="linear")
        return float((hit * lengths).sum() / lengths.sum())
    return float(outside(np.concatenate(d), lo, hi, inclusive=CLOSED, space="linear").mean())


def calibrate_lr(fraction_at, target: float, lrs) -> dict:
    r"""Find the learning rate whose clipped fraction meets ``target``, by interpolation in log-log.

    ``fraction_at(lr)`` takes the same update (the same chain state, minibatch and data) at each
    rate tried; the fraction grows with the rate. Between the two rates that bracket the target,
    :math:`\log f` is interpolated linearly in :math:`\log \eta`.

    Parameters
    ----------
    fraction_at : callable
        ``lr -> clipped fraction`` (:func:`clipped_fraction` of the forked update).
    target : float
        In (0, 1).
    lrs : sequence of float
        Rates to try, increasing.

    Returns
    -------
    dict
        ``{"target": ..., "tried": [[lr, fraction], ...], "lr": the chosen rate}``.

    Raises
    ------
    ValueError
        When no two rates tried bracket the target (naming the fractions found).
    """
    if not 0 < target < 1:
        raise ValueError(f"target must be in (0, 1), got {target!r}")
    lrs = [float(x) for x in lrs]
    if len(lrs) < 2 or any(b <= a for a, b in itertools.pairwise(lrs)) or lrs[0] <= 0:
        raise ValueError(f"lrs must be at least two increasing positive rates, got {lrs!r}")
    tried = []
    for lr in lrs:
        f = float(fraction_at(lr))
        tried.append([lr, f])
        if len(tried) > 1 and tried[-2][1] <= target <= f:
            (a, fa), (b, fb) = tried[-2], tried[-1]
            if fa <= 0 or fb == fa:
                lr_star = b if fb == target else a
            else:
                t = (math.log(target) - math.log(fa)) / (math.log(fb) - math.log(fa))
                lr_star = math.exp(math.log(a) + t * (math.log(b) - math.log(a)))
            return {"target": target, "tried": tried, "lr": lr_star}
    raise ValueError(f"no two learning rates bracket the target {target}: tried {tried}")


def tokens_sha256(responses) -> str:
    """Return the SHA-256 of a batch's response token ids (in order), the fingerprint paired files share.

    Parameters
    ----------
    responses : list of list of int

    Returns
    -------
    str
    """
    h = hashlib.sha256()
    for r in responses:
        h.update(np.asarray(r, dtype="<i8").tobytes())
        h.update(b"|")
    return h.hexdigest()


def paired_names(seed: int, aggregation: str, samplers=PAIRED_SAMPLERS, lags: int = 3) -> dict:
    """Return the file names of one seed's paired run, by role.

    Parameters
    ----------
    seed : int
    aggregation : str
    samplers : sequence of str
    lags : int

    Returns
    -------
    dict
        ``{"onpolicy": ..., "mismatch_<sampler>": ..., "stale_lag<l>": ...}`` (``.jsonl.gz``).
    """
    stem = f"smollm2_s{seed}"
    out = {"onpolicy": f"{stem}_onpolicy_{aggregation}.jsonl.gz"}
    out |= {f"mismatch_{s}": f"{stem}_mismatch_{s}.jsonl.gz" for s in samplers}
    out |= {f"stale_lag{k}": f"{stem}_stale_lag{k}_{aggregation}.jsonl.gz" for k in range(1, lags + 1)}
    return out


class PairedRun:
    r"""What one seed's paired run measured, before it becomes files.

    Attributes
    ----------
    batch : variance_lab.lm.runs._Batch
        The data batch :math:`D`, sampled in float32 from :math:`\theta_{K-1}`.
    scores : list of list of numpy.ndarray
        ``scores[j]``: :math:`D`'s float32 log-probs under :math:`\theta_{K-1+j}`, j = 0 .. L+1.
    entropy : list of numpy.ndarray
        :math:`\theta_{K-1}`'s entropy at each position.
    samplers : dict
        ``{"bf16": logp, "fp16": logp, "top-p": (logp, log_kept_mass)}``, each a list per sequence.
    optimizer : list of dict
        :meth:`PolicyChain.describe` after each of updates K .. K+L.
    timing_s : dict
    calibration : dict or None
        :func:`calibrate`'s result when update :math:`K`'s rate was calibrated.
    """

    def __init__(self, batch, scores, entropy, samplers, optimizer, timing_s, facts, calibration=None):
        self.batch, self.scores, self.entropy, self.samplers = batch, scores, entropy, samplers
        self.optimizer, self.timing_s, self.facts = optimizer, timing_s, facts
        self.calibration = calibration


class PairedChain:
    r"""The chain of one seed and its random streams (:func:`~variance_lab.lm.runs.random_streams`).

    Streams 3 and 4 draw every update's minibatch (prompts, then tokens), in order; 0 and 1 the
    data batch. :func:`calibrate` draws update :math:`K`'s minibatch from it, and
    :func:`run_paired` then takes update :math:`K` on that minibatch.

    Parameters
    ----------
    model : transformers causal language model, float32
        :math:`\theta_0`; the chain trains a copy, rounded to ``settings.paired_base``.
    tokenizer : its tokenizer
    settings : variance_lab.lm.settings.LMSettings
        ``run="paired"``: the loss, the learning rate, the sizes and the seed.
    """

    def __init__(self, model, tokenizer, settings):
        from variance_lab.lm.precision import round_weights
        from variance_lab.lm.runs import random_streams
        from variance_lab.provenance import torch_generator

        self.tokenizer, self.settings = tokenizer, settings
        self.chain = PolicyChain(
            model, aggregation=settings.aggregation, lr=settings.lr, score_batch=settings.score_batch
        )
        round_weights(self.chain.model, settings.paired_base)
        self.streams = random_streams(settings.seed)
        self.rng, self.gen = np.random.default_rng(self.streams[3]), torch_generator(self.streams[4])
        self.next_id = settings.n_prompts

    def score(self, batch, model=None, **options):
        """Score ``batch`` under ``model`` (default the chain's current policy)."""
        from variance_lab.lm.runs import score_batch

        model = self.chain.model if model is None else model
        return score_batch(model, batch, self.settings, self.tokenizer, **options)

    def minibatch(self):
        """Draw the next update's minibatch (prompt ids after the data batch's and the earlier ones')."""
        from variance_lab.lm.runs import draw_batch

        s = self.settings
        step = draw_batch(
            self.chain.model, self.tokenizer, s, self.rng, self.gen, s.train_prompts, self.next_id
        )
        self.next_id += s.train_prompts
        return step

    def update(self, step=None, step_old=None):
        """Take the chain's next update on ``step`` (default a fresh on-policy minibatch); return it.

        ``step_old`` is the current policy's scores of ``step`` when already computed.
        """
        step = self.minibatch() if step is None else step
        step_old = self.score(step) if step_old is None else step_old
        self.chain.step(step.ids, step.samples.tokens, step_old, step.advantage)
        return step

    def warm_up(self, say, what: str) -> None:
        """Take updates 1 .. K - 1."""
        for _ in range(self.settings.updates - 1):
            reward, k = self.update().reward.mean(), self.settings.updates - 1
            say(f"{what} {self.chain.updates} of {k}, minibatch mean reward {reward:.3f}")

    def data_batch(self, progress=None):
        """Sample the data batch from the current policy (streams 0 and 1)."""
        from variance_lab.lm.runs import draw_batch
        from variance_lab.provenance import torch_generator

        rng, gen = np.random.default_rng(self.streams[0]), torch_generator(self.streams[1])
        s = self.settings
        return draw_batch(self.chain.model, self.tokenizer, s, rng, gen, s.n_prompts, 0, progress=progress)


def run_paired(model, tokenizer, settings, *, lrs=None, target=None, progress=None) -> PairedRun:
    r"""Run one seed: warm the chain, sample :math:`D`, score it under every policy and sampler.

    Updates :math:`1 .. K-1` take ``settings.lr``. With ``lrs``, update :math:`K` and the later
    ones take the rate :func:`calibrate` finds on :math:`D` and update :math:`K`'s own minibatch
    (rounded to 3 significant digits); without, ``settings.update_lr`` (``settings.lr`` when 0).

    Parameters
    ----------
    model : transformers causal language model, float32
        :math:`\theta_0` (left unchanged).
    tokenizer : its tokenizer
    settings : variance_lab.lm.settings.LMSettings
        ``updates`` (:math:`K`), ``lags`` (:math:`L`), ``lr``, the task and sampler sizes, ``seed``.
    lrs : sequence of float, optional
        Increasing rates to calibrate update :math:`K` on.
    target : float, optional
        The clipped fraction to calibrate to; default :data:`PUBLISHED_CLIP_FRACTIONS` of
        ``settings.aggregation``.
    progress : callable, optional
        Called with one-line messages.

    Returns
    -------
    PairedRun
    """
    from variance_lab.lm.precision import low_precision_copy
    from variance_lab.progress import ticker

    if lrs is not None and settings.update_lr:
        raise ValueError(
            f"update_lr={settings.update_lr!r} and calibration rates {list(lrs)!r}: give one rate"
        )
    say = progress or (lambda message: None)
    t0 = time.perf_counter()
    c = PairedChain(model, tokenizer, settings)
    c.warm_up(say, "warm-up update")
    timing = {"warm_up": seconds_since(t0)}
    t1 = time.perf_counter()
    batch = c.data_batch(ticker(say, "sampling the data batch"))
    timing["sample"] = seconds_since(t1)
    t1 = time.perf_counter()
    old, entropy = c.score(batch, progress=ticker(say, "scoring (float32)"), entropy=True)
    samplers, arithmetic = {}, {}
    for name in settings.paired_samplers:
        if name == "top-p":
            view, how = c.chain.model, "native"
            options = {"top_k": settings.top_k, "top_p": settings.top_p}
        else:
            view, how = low_precision_copy(c.chain.model, name, settings.precision_mode)
            options = {"top_k": 0, "top_p": 1.0}
        lp, kept = c.score(batch, view, progress=ticker(say, f"scoring ({name})"), sampler=options)
        samplers[name] = lp if name != "top-p" else (lp, kept)
        arithmetic[name] = how
    timing["score_samplers"] = seconds_since(t1)
    scores, optimizer, found, pending = [old], [], None, {}
    if lrs is not None:
        t1 = time.perf_counter()
        found, pending["step"], pending["step_old"] = calibrate(
            c, batch, old, lrs=lrs, target=target, say=say
        )
        c.chain.set_lr(float(f"{found['lr']:.3g}"))
        say(f"calibrated learning rate {c.chain.lr:.3g} (target {found['target']})")
        timing["calibrate"] = seconds_since(t1)
    elif settings.update_lr:
        c.chain.set_lr(settings.update_lr)
    t1 = time.perf_counter()
    for _ in range(settings.lags + 1):
        c.update(**pending)
        pending = {}
        optimizer.append(c.chain.describe())
        scores.append(c.score(batch, progress=ticker(say, f"scoring after update {c.chain.updates}")))
        f = clipped_fraction(settings.aggregation, scores[-1], scores[-2])
        say(f"update {c.chain.updates}: clipped fraction on the data batch {f:.4f}")
    timing["updates_and_score"] = seconds_since(t1)
    facts = {"sampler_arithmetic": arithmetic}
    return PairedRun(batch, scores, entropy, samplers, optimizer, timing, facts, found)


def _slim(record: dict) -> dict:
    keep = ("id", "prompt_id", "sample", "task", "reward", "advantage", "finished")
    return {k: record[k] for k in keep}


def paired_records(run: PairedRun, settings) -> dict:
    """Return the records of every file of a paired run, by role (:func:`paired_names`' keys).

    The on-policy file carries the texts and the entropy; the others carry the ids, the
    rewards and the log-probs of their comparison (the same tokens, in the same order).

    Parameters
    ----------
    run : PairedRun
    settings : variance_lab.lm.settings.LMSettings

    Returns
    -------
    dict
        Role to list of records.
    """
    from variance_lab.lm.runs import batch_records, round_digits

    d = settings.digits
    base = batch_records(run.batch, run.scores[0], run.scores[1], run.entropy, settings)
    out = {"onpolicy": base}
    for name, view in run.samplers.items():
        rows = []
        for i, rec in enumerate(base):
            row = _slim(rec) | {"logp": rec["logp"], "old_logp": rec["old_logp"]}
            if name == "top-p":
                lp, kept_mass = view[0][i], view[1][i]
                kept = np.isfinite(lp)
                row["rollout_logp"] = round_digits(np.where(kept, lp, run.scores[0][i]), d)
                row["mask"] = [int(k) for k in kept]
                row["log_kept_mass"] = round_digits(kept_mass, d)
            else:
                row["rollout_logp"] = round_digits(view[i], d)
            rows.append(row)
        out[f"mismatch_{name}"] = rows
    for lag in range(1, len(run.scores) - 1):
        out[f"stale_lag{lag}"] = [
            _slim(rec)
            | {
                "logp": round_digits(run.scores[lag + 1][i], d),
                "old_logp": round_digits(run.scores[lag][i], d),
                "rollout_logp": rec["old_logp"],
                "policy_lag": lag,
            }
            for i, rec in enumerate(base)
        ]
    return out


def record_fields(role: str, settings) -> dict:
    """Return the sidecar's ``fields``: what each record field of a paired file of ``role`` holds."""
    k = settings.updates
    fields = {
        "logp": f"the trainer after update K = {k} of its persistent AdamW (theta_K)",
        "old_logp": "the trainer before it (theta_{K-1}), the policy that sampled every response in float32",
        "finished": "the response ended with an end token (false: it ran to max_new_tokens)",
    }
    if role.startswith("mismatch_"):
        name = role.removeprefix("mismatch_")
        fields["rollout_logp"] = (
            f"the {name} sampler's log-prob of the same tokens, teacher-forced (log-softmax in float32)"
            if name != "top-p"
            else f"the top-p {settings.top_p} / top-k {settings.top_k} sampler's log-prob of the same tokens "
            "(renormalised); a token outside its kept set has mask 0 and rollout_logp = old_logp"
        )
        if name == "top-p":
            fields["mask"] = "1 where the token is in the top-p sampler's kept set"
            fields["log_kept_mass"] = "log S_t, the kept mass of the top-p / top-k sampler at each position"
    if role.startswith("stale_lag"):
        lag = int(role.removeprefix("stale_lag"))
        fields["rollout_logp"] = "the behaviour policy theta_{K-1} that sampled the responses"
        fields["old_logp"] = f"the trainer theta_{{K-1+{lag}}}, {lag} updates after the behaviour policy"
        fields["logp"] = f"the trainer after its next update, theta_{{K+{lag}}}"
        fields["policy_lag"] = "updates between the behaviour policy and the trainer's old policy"
    if role == "onpolicy":
        fields["entropy"] = (
            "the entropy (nats) of theta_{K-1}'s next-token distribution at each response position"
        )
    return fields


def write_paired(
    run: PairedRun, settings, folder, *, model_info: dict, calibration: dict | None = None
) -> list[dict]:
    """Write every file of a paired run with its sidecar (atomically, one by one); return the sidecars.

    Parameters
    ----------
    run : PairedRun
    settings : variance_lab.lm.settings.LMSettings
    folder : str or Path
        Existing folder; names from :func:`paired_names`.
    model_info : dict
        What the sidecars record about the model (name, file, SHA-256).
    calibration : dict, optional
        :func:`calibrate_lr`'s result, recorded in every sidecar.

    Returns
    -------
    list of dict
        The sidecars, each with ``paths`` added.
    """
    from variance_lab.experiment.files import dataset_sidecar, write_dataset
    from variance_lab.lm.runs import LM_SIDECAR_KIND
    from variance_lab.provenance import torch_run_facts

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} does not exist")
    records = paired_records(run, settings)
    names = paired_names(settings.seed, settings.aggregation, list(run.samplers), len(run.scores) - 2)
    fingerprint = tokens_sha256(run.batch.samples.tokens)
    facts = torch_run_facts(settings.threads)
    out = []
    for role, recs in records.items():
        lag = int(role.removeprefix("stale_lag")) if role.startswith("stale_lag") else 0
        head = {
            "run": "paired",
            "role": role,
            "aggregation": settings.aggregation,
            "seed": settings.seed,
            "settings": settings.to_dict(),
            "model": model_info,
            "optimizer": run.optimizer[lag],
            "calibration": calibration,
            "paired_with": None if role == "onpolicy" else names["onpolicy"],
            "tokens_sha256": fingerprint,
            "fields": record_fields(role, settings),
            "sampler_arithmetic": run.facts["sampler_arithmetic"],
            **facts,
            "timing_s": run.timing_s,
        }
        path = folder / names[role]
        side = dataset_sidecar(
            LM_SIDECAR_KIND, path, recs, head, reproduce=reproduce_command(settings, calibration)
        )
        paths = write_dataset(recs, path, side)
        out.append({**side, "paths": [str(p) for p in paths]})
    return out


def reproduce_command(settings, calibration: dict | None = None) -> str:
    """Return the command that reproduces a paired run (or its length batch) into ``FOLDER``."""
    from variance_lab.lm.settings import LMSettings

    default = LMSettings(run="paired").to_dict()
    changed = {
        k: v
        for k, v in settings.to_dict().items()
        if default.get(k) != v and k not in ("run", "seed", "aggregation")
    }
    sets = "".join(f" --set {k}={v}" for k, v in changed.items())
    tried = (calibration or {}).get("tried", [])
    rates = " --calibrate " + ",".join(f"{lr:g}" for lr, _ in tried) if tried else ""
    return (
        "variance-lab experiment run --model smollm2 --run paired "
        f"--seed {settings.seed} --aggregation {settings.aggregation}{sets}{rates} --out-dir FOLDER"
    )


def calibrate(c: PairedChain, batch, old, *, lrs, target: float | None = None, say=None):
    r"""Calibrate the learning rate of update :math:`K` to a clipped-token fraction.

    On the chain at :math:`\theta_{K-1}` (after the warm-up), draws update :math:`K`'s
    minibatch, takes the update from copies of the chain (:meth:`PolicyChain.fork`) at each
    rate of ``lrs`` and measures :func:`clipped_fraction` on the data batch against ``old``
    (:func:`calibrate_lr`). The run then takes update :math:`K` on the same minibatch.

    Parameters
    ----------
    c : PairedChain
        At :math:`\theta_{K-1}`.
    batch : variance_lab.lm.runs._Batch
        The data batch :math:`D`.
    old : list of numpy.ndarray
        :math:`D`'s log-probs under :math:`\theta_{K-1}`.
    lrs : sequence of float
        Increasing rates to try.
    target : float, optional
        Default: :data:`PUBLISHED_CLIP_FRACTIONS` of the chain's loss.
    say : callable, optional

    Returns
    -------
    tuple
        (:func:`calibrate_lr`'s result with ``source``, ``warm_up_lr``, ``update``,
        ``definition`` and ``data_sequences`` added; the minibatch; its scores under
        :math:`\theta_{K-1}`).
    """
    say = say or (lambda message: None)
    aggregation = c.settings.aggregation
    if target is None:
        target = PUBLISHED_CLIP_FRACTIONS[aggregation]
    step = c.minibatch()
    step_old = c.score(step)

    def fraction_at(lr):
        fork = c.chain.fork(lr)
        fork.step(step.ids, step.samples.tokens, step_old, step.advantage)
        f = clipped_fraction(aggregation, c.score(batch, fork.model), old)
        say(f"calibration: lr {lr:.3g} clips {f:.4f} of the tokens (target {target})")
        return f

    found = calibrate_lr(fraction_at, target, lrs)
    found |= {
        "source": "Zheng et al. 2025, GSPO (arXiv 2507.18071), average fraction of clipped tokens",
        "definition": "tokens whose weight (GSPO: the sequence's) lies outside the loss's clip band",
        "warm_up_lr": c.chain.lr,
        "update": c.chain.updates + 1,
        "data_sequences": len(batch.prompts),
    }
    return found, step, step_old


def paired_experiment(settings, folder, *, loaded=None, lrs=None, progress=None) -> list[dict]:
    """Run one seed's paired run end to end and write its files: calibrate (optional), run, write.

    Parameters
    ----------
    settings : variance_lab.lm.settings.LMSettings
        ``run="paired"``.
    folder : str or Path
        An existing folder for the files (:func:`paired_names`).
    loaded : (model, tokenizer, dict), optional
        Default: SmolLM2-135M-Instruct (:func:`~variance_lab.lm.model.load_smollm2`).
    lrs : sequence of float, optional
        Calibrate update :math:`K`'s learning rate on these rates (:func:`run_paired`);
        default: every update takes ``settings.lr``.
    progress : callable, optional

    Returns
    -------
    list of dict
        The sidecars (:func:`write_paired`), each with ``wall_time_s``.
    """
    from variance_lab.lm.model import smollm2_loaded
    from variance_lab.provenance import deterministic_torch

    if settings.run != "paired":
        raise ValueError(f"settings.run must be 'paired', got {settings.run!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} does not exist")
    if settings.length_strata:
        raise ValueError(
            f"length_strata={settings.length_strata!r}: a length batch is "
            "variance_lab.lm.length.length_experiment's"
        )
    say = progress or (lambda message: None)
    t0 = time.perf_counter()
    with deterministic_torch(settings.threads):
        model, tokenizer, info = smollm2_loaded(loaded)
        run = run_paired(model, tokenizer, settings, lrs=lrs, progress=say)
    run.timing_s["wall"] = seconds_since(t0)
    return write_paired(run, settings, folder, model_info=info, calibration=run.calibration)
