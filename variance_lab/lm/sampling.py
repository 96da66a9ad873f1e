r"""Sampling responses with a key-value cache, recording the sampler's own log-probs.

At each step the model's last logits :math:`z \in \mathbb{R}^V` (cast to float32, as
inference engines do) are divided by the temperature :math:`\tau`, then processed as in
Hugging Face's ``generate`` (top-k first, then top-p):

- top-k keeps the :math:`k` largest logits;
- top-p keeps the smallest set of the most probable remaining tokens whose probability
  (under the top-k-processed distribution) reaches :math:`p`: sorted by decreasing
  probability :math:`q_{(1)} \ge q_{(2)} \ge \dots`, token :math:`(j)` is kept when
  :math:`\sum_{i<j} q_{(i)} < p` (the most probable token always is).

With :math:`\pi_\tau = \operatorname{softmax}(z / \tau)` and :math:`K` the kept set, the
processed distribution is :math:`\tilde\pi(v) = \pi_\tau(v) / S` on :math:`K`,
:math:`S = \sum_{v \in K} \pi_\tau(v)` the kept mass, so

.. math::

    \log \tilde\pi(v) = \log \pi_\tau(v) - \log S, \qquad v \in K.

The sampler draws from :math:`\tilde\pi` with a :class:`torch.Generator` and records
:math:`\log \tilde\pi(y_t)` (``rollout_logp``) and :math:`\log S` per token. Prompts are left
padded (attention mask and position ids make the padding invisible); a sequence stops at
an end token (which it keeps) or after ``max_new_tokens``; finished sequences leave the
batch (their key-value cache rows are dropped).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Samples", "cache_arg", "cache_of", "process_logits", "sample"]


@dataclass
class Samples:
    r"""Sampled responses and what the sampler saw.

    Attributes
    ----------
    tokens : list of list of int
        The response token ids (end token included when produced).
    logp : list of numpy.ndarray
        The sampler's log-probs of the sampled tokens under the processed distribution
        (float64 copies of float32 values).
    log_kept_mass : list of numpy.ndarray
        :math:`\log S` per token (0 without top-k/top-p).
    finished : list of bool
        Whether each response ended with an end token.
    """

    tokens: list[list[int]]
    logp: list[np.ndarray]
    log_kept_mass: list[np.ndarray]
    finished: list[bool]


def process_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Temperature, top-k and top-p: the processed log-probs and the log of the kept mass.

    Parameters
    ----------
    logits : torch.Tensor
        Shape ``(B, V)``, floating.
    temperature : float, optional
        > 0.
    top_k : int, optional
        0 keeps every token.
    top_p : float, optional
        In (0, 1]; 1 keeps every token.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Processed log-probs ``(B, V)`` (``-inf`` outside the kept set) and
        :math:`\log S` ``(B,)``, both in ``logits``' dtype.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k!r}")
    lp = (logits / temperature).log_softmax(-1)
    if top_k in (0, lp.shape[-1]) and top_p == 1:
        return lp, lp.new_zeros(lp.shape[:-1])
    keep = torch.ones_like(lp, dtype=torch.bool)
    if top_k < lp.shape[-1] and top_k > 0:
        kth = lp.topk(top_k, dim=-1).values[..., -1:]
        keep &= lp >= kth
    if top_p < 1:
        q = lp.masked_fill(~keep, -torch.inf).log_softmax(-1).exp()
        sorted_q, order = q.sort(dim=-1, descending=True)
        before = sorted_q.cumsum(-1) - sorted_q
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    log_kept = lp.masked_fill(~keep, -torch.inf).logsumexp(-1)
    processed = (lp - log_kept.unsqueeze(-1)).masked_fill(~keep, -torch.inf)
    return processed, log_kept


def sample(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    generator: torch.Generator,
    eos_ids,
    pad_id: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    batch_size: int = 16,
    progress=None,
) -> Samples:
    """Sample one response per prompt (repeat a prompt for a group), in batches.

    Parameters
    ----------
    model : transformers causal language model
        In any dtype (a 16-bit sampler is :func:`~variance_lab.lm.precision.low_precision_copy`).
    prompts : list of list of int
        Token ids, chat template applied.
    max_new_tokens : int
        >= 1.
    generator : torch.Generator
        The only source of randomness.
    eos_ids : iterable of int
        Tokens that end a response.
    pad_id : int, optional
    temperature, top_k, top_p : optional
        See :func:`process_logits`.
    batch_size : int, optional
        Prompts sampled together.
    progress : callable, optional
        Called with ``(sequences done, sequences)`` after each batch.

    Returns
    -------
    Samples
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    eos = torch.tensor(sorted(set(int(e) for e in eos_ids)), dtype=torch.long)
    out = Samples([], [], [], [])
    options = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    for lo in range(0, len(prompts), batch_size):
        part = _sample_batch(
            model, prompts[lo : lo + batch_size], max_new_tokens, generator, eos, pad_id, options
        )
        for field in ("tokens", "logp", "log_kept_mass", "finished"):
            getattr(out, field).extend(getattr(part, field))
        if progress is not None:
            progress(len(out.tokens), len(prompts))
    return out


def cache_of(result):
    """Return a forward pass's key-value cache (``cache`` in transformers 5, else ``past_key_values``).

    Parameters
    ----------
    result : transformers model output

    Returns
    -------
    transformers cache
    """
    cache = getattr(result, "cache", None)
    return cache if cache is not None else result.past_key_values


def cache_arg(model) -> str:
    """Return the name of ``model.forward``'s key-value cache argument (``cache`` or ``past_key_values``).

    Parameters
    ----------
    model : transformers causal language model

    Returns
    -------
    str
    """
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _sample_batch(model, prompts, max_new_tokens, generator, eos, pad_id, options) -> Samples:
    n = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens = [[] for _ in range(n)]
    logp = [[] for _ in range(n)]
    kept = [[] for _ in range(n)]
    finished = [False] * n
    alive = torch.arange(n)  # original row of each batch row
    with torch.no_grad():
        # the output layer at the last position only: the whole prompt's logits would take
        # rows x width x 49,152 floats (3.8 GB for 32 prompts of 600 tokens)
        result = model(
            input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=1
        )
        cache, last = cache_of(result), result.logits[:, -1, :]
        arg = cache_arg(model)
        position = position[:, -1:]
        for _ in range(max_new_tokens):
            processed, log_kept = process_logits(last.float(), **options)
            nxt = torch.multinomial(processed.exp(), 1, generator=generator).squeeze(-1)
            chosen = processed.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
            done = torch.isin(nxt, eos)
            for j, row in enumerate(alive.tolist()):
                tokens[row].append(int(nxt[j]))
                logp[row].append(float(chosen[j]))
                kept[row].append(float(log_kept[j]))
                finished[row] = bool(done[j])
            stay = (~done).nonzero().squeeze(-1)
            if stay.numel() == 0:
                break
            if stay.numel() < len(alive):
                alive, nxt, mask, position = alive[stay], nxt[stay], mask[stay], position[stay]
                cache.batch_select_indices(stay)
            mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=mask.dtype)], dim=1)
            position = position + 1
            result = model(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=mask,
                position_ids=position,
                use_cache=True,
                **{arg: cache},
            )
            cache, last = cache_of(result), result.logits[:, -1, :]
    return Samples(
        tokens,
        [np.minimum(np.array(v, dtype=float), 0.0) for v in logp],
        [np.array(v, dtype=float) for v in kept],
        finished,
    )
