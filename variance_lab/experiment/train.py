r"""Train the policy: supervised warm-up to partial competence, then a few GSPO steps.

1. **SFT.** Teacher-forced cross-entropy on correct responses (:func:`sft`), AdamW with a
   linear warm-up and a cosine decay, for a fixed number of steps: short enough that the
   model is only partly competent, so rewards vary within groups.
2. **GSPO.** Each iteration (:func:`pg_iteration`) draws prompts, samples a group of
   responses per prompt from the current policy (the old policy
   :math:`\pi_{old}` of that iteration), scores them with :func:`~variance_lab.experiment.task.arith_reward`,
   normalises rewards within each group (GRPO: :math:`A_i = (R_i - \bar R) / (s_R + 10^{-4})`,
   :func:`variance_lab.ratios.group_advantages` with :data:`ADVANTAGE_EPS`, :data:`ADVANTAGE_DDOF`)
   and takes one optimiser step per minibatch on the sequence-level GSPO objective
   (:func:`gspo_loss`)

   .. math::

       J = \frac{1}{N}\sum_i \min\bigl(s_i A_i,\
           \operatorname{clip}(s_i, 1 - \varepsilon_l, 1 + \varepsilon_h) A_i\bigr),
       \qquad s_i = \exp\Bigl(\frac{1}{|y_i|}\sum_t \log\frac{\pi_\theta(y_{i,t})}{\pi_{old}(y_{i,t})}\Bigr),

   GSPO's weight :math:`s = G`, the same quantity as
   :attr:`variance_lab.rollouts.weights.SequenceWeights.s` (a test checks the two on the same numbers;
   the iteration's logged clip fractions come from :func:`variance_lab.rollouts.weights.sequence_weights`).

:func:`train` runs both and returns the last iteration's old and new policies, which
:mod:`variance_lab.experiment.collect` compares on fresh samples. All randomness comes from
:class:`numpy.random.Generator` and :class:`torch.Generator` objects spawned from one
:class:`numpy.random.SeedSequence` (:func:`streams`, :func:`variance_lab.provenance.torch_generator`);
:func:`variance_lab.provenance.deterministic_torch` fixes the thread count and turns on PyTorch's
deterministic algorithms for the duration of a run.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from variance_lab.experiment.model import (
    ModelConfig,
    TinyGPT,
    generate,
    length_chunks,
    score_responses,
    token_log_probs,
)
from variance_lab.experiment.settings import RunSettings, check_choices, check_integers
from variance_lab.experiment.task import (
    SEP,
    TAGS,
    Problem,
    arith_rewards,
    decode,
    encode,
    make_problems,
    max_response_length,
)
from variance_lab.provenance import torch_generator
from variance_lab.ratios import GSPO_EPS, PPO_RANGE, compare, eps_range, group_advantages, log_bounds
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.weights import CLIP_RULE, sequence_weights

__all__ = [
    "ADVANTAGE_DDOF",
    "ADVANTAGE_EPS",
    "ARITH_FULL",
    "ARITH_QUICK",
    "STREAMS",
    "Settings",
    "TrainResult",
    "clipped_surrogate",
    "evaluate_policy",
    "gspo_clipped",
    "gspo_loss",
    "gspo_surrogate",
    "pg_iteration",
    "sample_responses",
    "sft",
    "streams",
    "train",
]


@dataclass(frozen=True)
class Settings(RunSettings):
    """Everything a run depends on (with the seed, the whole recipe of a data set).

    Attributes
    ----------
    seed : int
        Root of every random stream (:func:`streams`).
    n_min, n_max : int
        Range of the number of terms of a problem (log-uniform).
    d_model, n_layer, n_head, d_ff : int
        Model size (:class:`~variance_lab.experiment.model.ModelConfig`; its defaults are the
        full run's).
    sft_steps, sft_batch : int
        Supervised steps and problems per step.
    sft_lr : float
        Peak AdamW learning rate of the supervised phase.
    eval_prompts : int
        Problems sampled to measure accuracy after SFT and after GSPO (0: skip).
    pg_iters, pg_prompts, group_size, pg_minibatches : int
        GSPO iterations; prompts per iteration; responses per prompt (the GRPO group);
        optimiser steps per iteration (the groups are split evenly between them).
    pg_lr : float
        Adam learning rate of the GSPO phase.
    clip_low, clip_high : float
        GSPO's clipping range of s is ``(1 - clip_low, 1 + clip_high)``.
    temperature : float
        Sampling temperature, everywhere.
    data_prompts, data_samples : int
        Problems of the collected data set and responses sampled per problem.
    threads : int
        PyTorch intra-op threads during the run (results are reproducible for a fixed value).
    sampler_dtype : {"float32", "bfloat16"}
        The precision of the sampler of the collected data set. ``"float32"``: the old
        policy as trained (no mismatch, no ``rollout_logp``). ``"bfloat16"``: a bfloat16 copy
        of the old policy samples, the way an inference engine differs from the trainer, and
        each record carries ``rollout_logp``, the sampler's own log-probabilities
        (:func:`~variance_lab.experiment.model.sampler_log_probs`), beside ``old_logp`` and
        ``logp`` scored in float64 as before.
    """

    seed: int = 0
    n_min: int = 2
    n_max: int = 32
    d_model: int = ModelConfig.d_model
    n_layer: int = ModelConfig.n_layer
    n_head: int = ModelConfig.n_head
    d_ff: int = ModelConfig.d_ff
    sft_steps: int = 600
    sft_batch: int = 32
    sft_lr: float = 1e-2
    eval_prompts: int = 256
    pg_iters: int = 4
    pg_prompts: int = 16
    group_size: int = 8
    pg_minibatches: int = 4
    pg_lr: float = 1e-4
    clip_low: float = GSPO_EPS[0]
    clip_high: float = GSPO_EPS[1]
    temperature: float = 1.0
    data_prompts: int = 512
    data_samples: int = 4
    threads: int = 1
    sampler_dtype: str = "float32"

    def __post_init__(self):
        """Check that the settings are integers where they must be and in range."""
        counts = ("sft_batch", "pg_prompts", "group_size", "pg_minibatches", "data_prompts", "data_samples")
        steps = ("sft_steps", "pg_iters", "eval_prompts")
        minimum = {f.name: None for f in fields(self) if f.type in ("int", int)}  # any integer
        minimum |= dict.fromkeys((*counts, "threads"), 1) | dict.fromkeys(steps, 0)
        check_integers(self, minimum)
        if self.pg_minibatches > self.pg_prompts:
            raise ValueError("pg_minibatches must not exceed pg_prompts (each minibatch holds whole groups)")
        if not (
            0 < self.clip_low < 1
            and self.clip_high > 0
            and self.temperature > 0
            and self.sft_lr > 0
            and self.pg_lr > 0
        ):
            raise ValueError("need 0 < clip_low < 1, clip_high > 0, temperature > 0, learning rates > 0")
        check_choices(self, {"sampler_dtype": SAMPLER_DTYPES})
        self.model_config()  # validates the model size and n range

    def model_config(self) -> ModelConfig:
        """Return the model size, with room for the longest prompt plus its response budget.

        Returns
        -------
        ModelConfig
        """
        if not 2 <= self.n_min <= self.n_max <= len(TAGS):
            raise ValueError(f"need 2 <= n_min <= n_max <= {len(TAGS)}, got {self.n_min}, {self.n_max}")
        max_len = 2 * self.n_max + len(SEP) + max_response_length(self.n_max)
        return ModelConfig(
            d_model=self.d_model, n_layer=self.n_layer, n_head=self.n_head, d_ff=self.d_ff, max_len=max_len
        )


#: Precisions of the data set's sampler (:attr:`Settings.sampler_dtype`).
SAMPLER_DTYPES = ("float32", "bfloat16")

#: The full run (the shipped data set).
ARITH_FULL = Settings()
#: A run of a few seconds for tests and CI: tiny model, short problems, few steps.
ARITH_QUICK = replace(
    ARITH_FULL,
    n_max=5,
    d_model=32,
    n_layer=1,
    n_head=2,
    d_ff=64,
    sft_steps=80,
    sft_batch=16,
    eval_prompts=16,
    pg_iters=2,
    pg_prompts=8,
    group_size=4,
    pg_minibatches=2,
    data_prompts=24,
    data_samples=2,
)

#: Names of the independent random streams, in spawn order.
STREAMS = ("init", "sft", "eval", "pg_prompts", "pg_sample", "data_prompts", "data_sample")


def streams(seed: int) -> dict[str, np.random.SeedSequence]:
    """Independent seed sequences for each use, spawned from ``SeedSequence(seed)``.

    Parameters
    ----------
    seed : int

    Returns
    -------
    dict
        :data:`STREAMS` to :class:`numpy.random.SeedSequence`.
    """
    return dict(zip(STREAMS, np.random.SeedSequence(seed).spawn(len(STREAMS)), strict=True))


# --------------------------------------------------------------------------------------
# objective
# --------------------------------------------------------------------------------------
def _mask(lengths: list[int], width: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(dtype)


#: This experiment's :func:`variance_lab.ratios.group_advantages`: std with ``ddof=0``, plus 1e-4.
ADVANTAGE_EPS, ADVANTAGE_DDOF = 1e-4, 0


def clipped_surrogate(w: torch.Tensor, adv: torch.Tensor, eps: tuple[float, float]) -> torch.Tensor:
    r"""Return PPO's surrogate :math:`\min(wA, \operatorname{clip}(w, 1-\varepsilon_l, 1+\varepsilon_h)A)`.

    The gradient passes at a bound (``torch.clamp`` is closed): :data:`variance_lab.ratios.CLOSED`.
    """
    lo, hi = eps_range(*eps)
    return torch.minimum(w * adv, w.clamp(lo, hi) * adv)


def gspo_surrogate(log_s: torch.Tensor, adv: torch.Tensor, eps=GSPO_EPS) -> torch.Tensor:
    r"""Return GSPO's objective :func:`clipped_surrogate` of :math:`s = e^{\log s}`, both experiments' one."""
    return clipped_surrogate(log_s.exp(), adv, eps)


def gspo_clipped(log_s: torch.Tensor, eps=GSPO_EPS) -> torch.Tensor:
    """Return where :math:`s` is outside GSPO's band: :data:`variance_lab.rollouts.weights.CLIP_RULE`'s rule.

    Log space, the log of the float64 ratio band, a bound not clipped, in the tensor's dtype.
    """
    return compare(log_s, *log_bounds(*eps_range(*eps)), CLIP_RULE.inclusive)


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = GSPO_EPS[0],
    clip_high: float = GSPO_EPS[1],
) -> tuple[torch.Tensor, dict]:
    r"""GSPO's clipped sequence-level surrogate, negated (a loss), with its weights.

    Parameters
    ----------
    logp, old_logp : Tensor, shape ``(B, L)``
        Token log-probabilities under the current and old policies (``old_logp`` is treated
        as a constant); entries under ``mask == 0`` are ignored.
    mask : Tensor, shape ``(B, L)``
        1 for a response token, 0 for padding; every row has at least one 1.
    advantages : Tensor, shape ``(B,)``
    clip_low, clip_high : float
        The range of :math:`s` is :math:`(1 - \varepsilon_l, 1 + \varepsilon_h)`; ratios' GSPO_EPS.

    Returns
    -------
    loss : Tensor
        :math:`-J`, a scalar, differentiable in ``logp``.
    info : dict
        ``log_s`` (detached, shape ``(B,)``) and ``clipped`` (bool: :math:`s` outside the range,
        :func:`gspo_clipped`, the batch's GSPO clip indicator as
        :func:`variance_lab.rollouts.weights.sequence_weights` defines it).
    """
    d = (logp - old_logp.detach()) * mask
    log_s = d.sum(dim=1) / mask.sum(dim=1)
    objective = gspo_surrogate(log_s, advantages, (clip_low, clip_high))
    clipped = gspo_clipped(log_s.detach(), (clip_low, clip_high))
    return -objective.mean(), {"log_s": log_s.detach(), "clipped": clipped}


# --------------------------------------------------------------------------------------
# supervised warm-up
# --------------------------------------------------------------------------------------
def _lr_factor(step: int, steps: int, warmup: int = 20) -> float:
    """Linear warm-up, then cosine decay to 10 %."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))


def _encoded(problems: list[Problem]) -> tuple[list[list[int]], list[list[int]]]:
    return [encode(p.prompt) for p in problems], [encode(p.response) for p in problems]


#: Rows per forward pass; larger batches are cut by length (:func:`.model.length_chunks`).
MICRO_ROWS = 8


def _sft_chunk_loss(logp: torch.Tensor, rows: list[int], lengths: list[int]) -> torch.Tensor:
    """Return the summed negative log-likelihood of a chunk's response tokens."""
    return -(logp * _mask(lengths, logp.shape[1], logp.dtype)).sum()


def _accumulate(model, prompts, responses, chunk_loss, scale: float) -> float:
    """Backpropagate ``sum over chunks of chunk_loss / scale``; return that total.

    The rows are cut into chunks of similar length; each chunk's loss
    ``chunk_loss(logp, rows, lengths)`` is divided by ``scale`` and backpropagated, so the
    accumulated gradient is the gradient of the whole batch's loss.
    """
    total = 0.0
    for rows in length_chunks([len(r) for r in responses], MICRO_ROWS):
        r = [responses[i] for i in rows]
        logp = token_log_probs(model, [prompts[i] for i in rows], r)
        loss = chunk_loss(logp, rows, [len(x) for x in r]) / scale
        loss.backward()
        total += float(loss.detach())
    return total


def sft(
    model: TinyGPT, settings: Settings, rng: np.random.Generator, *, steps: int | None = None
) -> list[dict]:
    """Supervised training on correct responses (response tokens only).

    Parameters
    ----------
    model : TinyGPT
        Trained in place.
    settings : Settings
    rng : numpy.random.Generator
        Source of the training problems.
    steps : int, optional
        Stop after the first ``steps`` steps of the ``settings.sft_steps``-step schedule
        (the same steps and learning rates as the full run's first ones); default: all.

    Returns
    -------
    list of dict
        ``{"step", "loss"}`` (mean token cross-entropy) every 10 steps and at the last.

    Raises
    ------
    ValueError
        For ``steps`` not an integer from 1 to ``settings.sft_steps``.
    """
    if steps is not None and (
        isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= settings.sft_steps
    ):
        raise ValueError(f"steps must be an integer from 1 to {settings.sft_steps}, got {steps!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=settings.sft_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: _lr_factor(k, settings.sft_steps))
    log = []
    model.train()
    for step in range(settings.sft_steps if steps is None else steps):
        prompts, responses = _encoded(make_problems(rng, settings.sft_batch, settings.n_min, settings.n_max))
        opt.zero_grad()
        loss = _accumulate(model, prompts, responses, _sft_chunk_loss, sum(len(r) for r in responses))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0 or step == settings.sft_steps - 1:
            log.append({"step": step, "loss": loss})
    return log


# --------------------------------------------------------------------------------------
# sampling and evaluation
# --------------------------------------------------------------------------------------
def sample_responses(
    model: TinyGPT,
    problems: list[Problem],
    generator: torch.Generator,
    settings: Settings,
    *,
    chunk: int = 128,
) -> list[list[int]]:
    """Sample one response per problem, in chunks of similar length (order kept).

    Problems are sorted by their number of terms (stable), cut into chunks of ``chunk``,
    and each chunk is sampled in turn from ``generator``.

    Parameters
    ----------
    model : TinyGPT
    problems : list of Problem
    generator : torch.Generator
    settings : Settings
    chunk : int

    Returns
    -------
    list of list of int
        Response token ids, in the order of ``problems``.
    """
    order = sorted(range(len(problems)), key=lambda i: problems[i].n)
    out: list[list[int]] = [[] for _ in problems]
    model.eval()
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        prompts = [encode(problems[i].prompt) for i in idx]
        budgets = [max_response_length(problems[i].n) for i in idx]
        for i, resp in zip(
            idx, generate(model, prompts, budgets, generator, temperature=settings.temperature), strict=True
        ):
            out[i] = resp
    return out


def _decode_responses(responses: list[list[int]]) -> list[str]:
    return [decode(r) for r in responses]


def evaluate_policy(
    model: TinyGPT, problems: list[Problem], generator: torch.Generator, settings: Settings
) -> dict:
    """Accuracy of sampled responses, overall and by number of terms (buckets 2-3, 4-7, 8-15, ...).

    Parameters
    ----------
    model, problems, generator, settings
        The policy, the problems, the random stream and the run's settings, passed to
        :func:`sample_responses` (one response per problem, at ``settings.temperature``).

    Returns
    -------
    dict
        ``accuracy`` and ``by_terms`` (``{"2-3": accuracy, ...}``).
    """
    r = arith_rewards(problems, _decode_responses(sample_responses(model, problems, generator, settings)))
    n = np.array([p.n for p in problems])
    by = {}
    lo = 2
    while lo <= settings.n_max:
        sel = (n >= lo) & (n < 2 * lo)
        if sel.any():
            by[f"{lo}-{min(2 * lo - 1, settings.n_max)}"] = float(r[sel].mean())
        lo *= 2
    return {"accuracy": float(r.mean()), "by_terms": by}


# --------------------------------------------------------------------------------------
# GSPO
# --------------------------------------------------------------------------------------
def _batch_weights(logp: torch.Tensor, old_logp: torch.Tensor, lengths: list[int], settings: Settings):
    """Return the toolkit's sequence weights of a padded batch (float64 copies of the numbers)."""
    mask = _mask(lengths, logp.shape[1], torch.float64).numpy()
    batch = TokenBatch.from_padded(logp.detach().double().numpy(), old_logp.detach().double().numpy(), mask)
    return sequence_weights(
        batch, gspo_range=(1 - settings.clip_low, 1 + settings.clip_high), ppo_range=PPO_RANGE
    )


def _minibatches(n_groups: int, group_size: int, parts: int) -> list[np.ndarray]:
    """Row indices of ``parts`` minibatches of whole groups, in order."""
    return [
        np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in part])
        for part in np.array_split(np.arange(n_groups), parts)
    ]


def _update(model, opt, prompts, responses, old_logp, adv, rows, settings) -> dict:
    """One optimiser step on the GSPO loss of the rows ``rows``; the clip fraction it saw."""
    clipped: list[torch.Tensor] = []

    def chunk_loss(logp, chunk, lengths):
        idx = [rows[i] for i in chunk]
        loss, info = gspo_loss(
            logp,
            old_logp[idx, : logp.shape[1]],
            _mask(lengths, logp.shape[1], logp.dtype),
            torch.as_tensor(adv[idx], dtype=logp.dtype),
            settings.clip_low,
            settings.clip_high,
        )
        clipped.append(info["clipped"])
        return loss * len(chunk)

    opt.zero_grad()
    loss = _accumulate(model, [prompts[i] for i in rows], [responses[i] for i in rows], chunk_loss, len(rows))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {"loss": loss, "clip_frac": float(torch.cat(clipped).double().mean())}


def pg_iteration(
    model: TinyGPT,
    opt: torch.optim.Optimizer,
    problems: list[Problem],
    generator: torch.Generator,
    settings: Settings,
) -> tuple[TinyGPT, dict]:
    """One GSPO iteration: sample groups from the current policy, then one step per minibatch.

    Parameters
    ----------
    model : TinyGPT
        The policy, updated in place.
    opt : torch.optim.Optimizer
        Its optimiser.
    problems : list of Problem
        The iteration's prompts; each is sampled ``settings.group_size`` times.
    generator : torch.Generator
    settings : Settings

    Returns
    -------
    old : TinyGPT
        A frozen copy of the policy before the update (the sampling policy).
    stats : dict
        Mean reward, the minibatch losses and clip fractions seen by the optimiser, and,
        from :func:`variance_lab.rollouts.weights.sequence_weights` on the iteration's samples under the
        updated policy, the GSPO and PPO clip fractions and the spread of log s.
    """
    old = copy.deepcopy(model).eval()
    group = [p for p in problems for _ in range(settings.group_size)]
    prompts = [encode(p.prompt) for p in group]
    responses = sample_responses(old, group, generator, settings)
    r = arith_rewards(group, _decode_responses(responses))
    adv = group_advantages(
        r, np.arange(r.size) // settings.group_size, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF
    )
    with torch.no_grad():
        old_logp = score_responses(old, prompts, responses)
    model.train()
    steps = [
        _update(model, opt, prompts, responses, old_logp, adv, rows, settings)
        for rows in _minibatches(len(problems), settings.group_size, settings.pg_minibatches)
    ]
    with torch.no_grad():
        w = _batch_weights(
            score_responses(model, prompts, responses), old_logp, [len(x) for x in responses], settings
        )
    return old, {
        "mean_reward": float(r.mean()),
        "groups_with_signal": int(np.sum(np.ptp(r.reshape(-1, settings.group_size), axis=1) > 0)),
        "steps": steps,
        "after": {
            "gspo_clip_frac": w.gspo_clip_frac,
            "ppo_clip_frac": w.ppo_clip_frac,
            "std_log_s": float(np.std(w.log_G)),
            "mean_abs_log_s": float(np.mean(np.abs(w.log_G))),
        },
    }


# --------------------------------------------------------------------------------------
# the whole training run
# --------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What :func:`train` hands to the data collection.

    Attributes
    ----------
    old, new : TinyGPT
        The last GSPO iteration's sampling policy and the policy after its update (after SFT
        alone when ``pg_iters == 0``: then both are the SFT model).
    log : dict
        SFT losses, accuracies, per-iteration GSPO statistics and phase timings (seconds).
    """

    old: TinyGPT
    new: TinyGPT
    log: dict


def train(settings: Settings) -> TrainResult:
    """SFT, then ``settings.pg_iters`` GSPO iterations, deterministically from ``settings.seed``.

    Call inside :func:`~variance_lab.provenance.deterministic_torch` for reproducible results (the
    command line and :func:`variance_lab.experiment.collect.run_arith_experiment` do).

    Parameters
    ----------
    settings : Settings

    Returns
    -------
    TrainResult
    """
    ss = streams(settings.seed)
    rng = {k: np.random.default_rng(ss[k]) for k in ("sft", "eval", "pg_prompts")}
    gens = {k: torch_generator(ss[k]) for k in ("init", "eval", "pg_sample")}
    model = TinyGPT(settings.model_config(), gens["init"])
    log: dict = {"n_parameters": sum(p.numel() for p in model.parameters()), "timing_s": {}}
    eval_problems = make_problems(rng["eval"], settings.eval_prompts, settings.n_min, settings.n_max)
    t0 = time.perf_counter()
    log["sft"] = sft(model, settings, rng["sft"])
    log["timing_s"]["sft"] = time.perf_counter() - t0
    if eval_problems:
        log["eval_after_sft"] = evaluate_policy(model, eval_problems, gens["eval"], settings)
    t0 = time.perf_counter()
    old, log["pg"] = copy.deepcopy(model).eval(), []
    opt = torch.optim.Adam(model.parameters(), lr=settings.pg_lr)
    for it in range(settings.pg_iters):
        problems = make_problems(rng["pg_prompts"], settings.pg_prompts, settings.n_min, settings.n_max)
        old, stats = pg_iteration(model, opt, problems, gens["pg_sample"], settings)
        log["pg"].append({"iter": it, **stats})
    log["timing_s"]["pg"] = time.perf_counter() - t0
    if eval_problems:
        log["eval_after_pg"] = evaluate_policy(model, eval_problems, gens["eval"], settings)
    return TrainResult(old=old, new=copy.deepcopy(model).eval(), log=log)
