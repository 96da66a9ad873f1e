r"""Teacher-forced token log-probs of responses under a model: the trainer's view.

For a prompt :math:`x` (token ids, chat template applied) and a response
:math:`y_1, \dots, y_T`, the model's logits :math:`z_t \in \mathbb{R}^V` at the position
before :math:`y_t` give

.. math::

    \log \pi(y_t \mid x, y_{<t}) = z_{t, y_t} / \tau - \log \sum_{v=1}^{V} \exp(z_{t, v} / \tau),

:math:`\tau` the temperature (1 for the trainer), and the sequence log-prob is their sum.
Sequences are right-padded within a minibatch (a causal model's outputs at a position do
not depend on later positions, so no attention mask is needed); the output layer runs only
at the positions that predict a response token, which keeps a 49,152-word vocabulary
within memory. The log-softmax runs in float64 (``softmax_dtype``) on the network's float32
logits, so that log-ratios of tokens with probability near 1 (log-prob near :math:`-10^{-6}`)
are not lost to float32 rounding; a 16-bit sampler's own log-probs use float32, as
inference engines do.

With ``entropy=True`` each position also gives the entropy of the model's next-token
distribution, in nats,

.. math::

    H_t = -\sum_{v=1}^{V} \pi(v \mid x, y_{<t}) \log \pi(v \mid x, y_{<t}),

computed from the same float64 log-softmax.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["processed_log_probs", "response_log_probs", "score"]


def _decoder_and_head(model):
    return model.get_decoder(), model.get_output_embeddings()


def _response_logits(model, prompts, responses, pad_id):
    """Return the network's logits at the positions that predict each response token, and those tokens."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    rows, cols, targets = [], [], []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        pos = torch.arange(len(p) - 1, len(p) + len(r) - 1)
        rows.append(torch.full_like(pos, i))
        cols.append(pos)
        targets.append(torch.tensor(r))
    rows, cols, targets = torch.cat(rows), torch.cat(cols), torch.cat(targets)
    decoder, head = _decoder_and_head(model)
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
    return head(hidden[rows, cols]), targets


def response_log_probs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    temperature: float = 1.0,
    softmax_dtype: torch.dtype = torch.float64,
    pad_id: int = 0,
    entropy: bool = False,
) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
    r"""Log-probs of each response token given the prompt and the response before it, one minibatch.

    Differentiable when gradients are enabled (the trainer's loss uses it).

    Parameters
    ----------
    model : transformers causal language model
    prompts, responses : list of list of int
        Token ids, same number of each; every response non-empty.
    temperature : float, optional
        :math:`\tau > 0`.
    softmax_dtype : torch.dtype, optional
        The dtype of the log-softmax.
    pad_id : int, optional
        Filler after short sequences (never read).
    entropy : bool, optional
        Also return :math:`H_t` at every response position.

    Returns
    -------
    list of torch.Tensor, or (list of torch.Tensor, list of torch.Tensor)
        One 1-D tensor of length ``len(responses[i])`` per sequence; with ``entropy``, the
        log-probs and the entropies.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if any(len(r) == 0 for r in responses) or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt and every response needs at least one token")
    logits, targets = _response_logits(model, prompts, responses, pad_id)
    logits = logits.to(softmax_dtype)
    if temperature != 1.0:
        logits = logits / temperature
    full = logits.log_softmax(-1)
    lp = full.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    sizes = [len(r) for r in responses]
    if not entropy:
        return list(lp.split(sizes))
    h = -(full.exp() * full).sum(-1)
    return list(lp.split(sizes)), list(h.split(sizes))


def processed_log_probs(
    model,
    prompts,
    responses,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    pad_id: int = 0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    r"""Return the sampler's view of given responses: its log-probs and kept mass, teacher-forced.

    The network's logits :math:`z_t` (cast to float32) go through
    :func:`~variance_lab.lm.sampling.process_logits` exactly as the sampler's do, so each token
    gets :math:`\log \tilde\pi(y_t) = \log \pi_\tau(y_t) - \log S_t` when it is in the kept set
    :math:`K_t` and :math:`-\infty` when it is not (a top-p sampler never draws it), with
    :math:`\log S_t` the kept mass (0 without top-k/top-p). With ``top_k=0, top_p=1`` on a
    16-bit copy of the model (:func:`~variance_lab.lm.precision.low_precision_copy`) this is
    that sampler's log-prob of tokens another sampler drew: the paired mismatch.

    Parameters
    ----------
    model : transformers causal language model
    prompts, responses : list of list of int
    temperature : float, optional
    top_k : int, optional
    top_p : float, optional
    pad_id : int, optional

    Returns
    -------
    (list of torch.Tensor, list of torch.Tensor)
        Per response, the float32 log-probs (``-inf`` outside the kept set) and :math:`\log S_t`.
    """
    from variance_lab.lm.sampling import process_logits

    logits, targets = _response_logits(model, prompts, responses, pad_id)
    processed, log_kept = process_logits(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p)
    lp = processed.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    sizes = [len(r) for r in responses]
    return list(lp.split(sizes)), list(log_kept.split(sizes))


def score(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    batch_size: int = 4,
    temperature: float = 1.0,
    softmax_dtype: torch.dtype = torch.float64,
    pad_id: int = 0,
    progress=None,
    entropy: bool = False,
    sampler: dict | None = None,
) -> list[np.ndarray] | tuple[list[np.ndarray], list[np.ndarray]]:
    r"""Teacher-forced log-probs of every response, in minibatches of similar lengths, without gradients.

    Parameters
    ----------
    model : transformers causal language model
    prompts, responses : list of list of int
    batch_size : int, optional
        Sequences per forward pass.
    temperature : float, optional
    softmax_dtype : torch.dtype, optional
    pad_id : int, optional
    progress : callable, optional
        Called with ``(sequences done, sequences)`` after each minibatch.
    entropy : bool, optional
        Also return the entropy :math:`H_t` (nats, >= 0) of every response position (see the module).
    sampler : dict, optional
        ``{"top_k": k, "top_p": p}``: score as that sampler does (:func:`processed_log_probs`) and
        return its log-probs (``-inf`` outside its kept set) and :math:`\log S_t` instead of the
        trainer's log-probs (``softmax_dtype`` and ``entropy`` do not apply).

    Returns
    -------
    list of numpy.ndarray, or (list of numpy.ndarray, list of numpy.ndarray)
        float64 log-probs, one array per response, each entry <= 0; with ``entropy``, the
        log-probs and the entropies.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    # minibatches of similar lengths pad less; the results go back in the callers' order
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    out: list[np.ndarray | None] = [None] * len(prompts)
    ent: list[np.ndarray | None] = [None] * len(prompts)
    with torch.no_grad():
        for lo in range(0, len(order), batch_size):
            rows = order[lo : lo + batch_size]
            part_p, part_r = [prompts[i] for i in rows], [responses[i] for i in rows]
            if sampler is not None:
                parts, h = processed_log_probs(
                    model, part_p, part_r, temperature=temperature, pad_id=pad_id, **sampler
                )
            else:
                parts = response_log_probs(
                    model,
                    part_p,
                    part_r,
                    temperature=temperature,
                    softmax_dtype=softmax_dtype,
                    pad_id=pad_id,
                    entropy=entropy,
                )
                parts, h = parts if entropy else (parts, [None] * len(rows))
            for i, p, hi in zip(rows, parts, h, strict=True):
                out[i] = np.minimum(p.double().numpy(), 0.0)
                ent[i] = None if hi is None else hi.double().numpy()
                if sampler is None and hi is not None:
                    ent[i] = np.maximum(ent[i], 0.0)
            if progress is not None:
                progress(min(lo + batch_size, len(order)), len(order))
    return (out, ent) if entropy or sampler is not None else out
