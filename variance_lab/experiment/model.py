r"""A tiny causal transformer over the task's characters, with sampling and scoring.

:class:`TinyGPT` is a pre-norm decoder (learned embeddings of the token and of the token
before it, multi-head causal self-attention with rotary position embeddings, a GELU MLP).
The previous-token embedding (a "token shift", as in RWKV or smeared keys) lets one
attention layer find the term that follows a tag in the prompt, and rotary positions make
the other relative lookups (the previous running sum) easy: both are what a tiny model
otherwise fails to learn in a few minutes of CPU time.
The same code runs in float32 (training, sampling) and float64 (scoring); sampling uses a
preallocated key/value cache.

- :func:`token_log_probs`: teacher-forced log-probabilities of given tokens (one forward
  pass; the padding token is excluded from every distribution).
- :func:`generate`: sample continuations of a batch of prompts of different lengths, with a
  :class:`torch.Generator` as the only source of randomness (inverse-CDF sampling from the
  float64 probabilities, one uniform draw per row and step).

Requires PyTorch (``pip install 'variance_lab[experiment]'``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from variance_lab.experiment.task import EOS, PAD, VOCAB, encode

__all__ = [
    "ModelConfig",
    "TinyGPT",
    "generate",
    "length_chunks",
    "pad_batch",
    "sampler_log_probs",
    "score_responses",
    "token_log_probs",
]

_EOS_ID = encode(EOS)[0]


@dataclass(frozen=True)
class ModelConfig:
    """Size of a :class:`TinyGPT`.

    Attributes
    ----------
    d_model, n_layer, n_head, d_ff : int
        Width, depth, attention heads (dividing ``d_model``) and MLP width.
    max_len : int
        Longest sequence (prompt plus response) that :func:`generate` may produce.
    vocab : int
        Number of token ids (the task's vocabulary).
    """

    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 512
    vocab: int = len(VOCAB)

    def __post_init__(self):
        """Check that every size is >= 1 and that n_head divides d_model."""
        if min(self.d_model, self.n_layer, self.n_head, self.d_ff, self.max_len) < 1:
            raise ValueError(f"model sizes must be >= 1, got {self}")
        if self.d_model % self.n_head:
            raise ValueError(f"n_head={self.n_head} must divide d_model={self.d_model}")


def _rotate(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary position embedding of ``x`` (shape ``(B, H, t, d_head)``) at positions ``start ..``."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=x.dtype) / half)
    angle = torch.arange(start, start + x.shape[2], dtype=x.dtype).unsqueeze(1) * freq
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_head, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        b, t, d = x.shape
        start = 0 if cache is None else cache["len"]
        q, k, v = (self._heads(z) for z in self.qkv(x).split(d, dim=2))
        q, k = _rotate(q, start), _rotate(k, start)
        if cache is None:
            keys, values = k, v
        else:
            cache["k"][:, :, start : start + t] = k
            cache["v"][:, :, start : start + t] = v
            keys, values = cache["k"][:, :, : start + t], cache["v"][:, :, : start + t]
        if start == 0:
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        elif t == 1:
            y = F.scaled_dot_product_attention(q, keys, values)
        else:
            rows = torch.arange(start, start + t).unsqueeze(1)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=torch.arange(start + t) <= rows)
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.out(y)


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = _Attention(cfg)
        d, f = cfg.d_model, cfg.d_ff
        self.mlp = nn.Sequential(nn.Linear(d, f), nn.GELU(), nn.Linear(f, d))

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small pre-norm causal transformer language model over the task's characters.

    Parameters
    ----------
    cfg : ModelConfig
    generator : torch.Generator
        Source of the initial weights (normal, std 0.02; biases zero).
    """

    def __init__(self, cfg: ModelConfig, generator: torch.Generator):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.prev = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self._init_weights(generator)

    @torch.no_grad()
    def _init_weights(self, generator: torch.Generator) -> None:
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.02)

    def forward(self, idx: torch.Tensor, cache: list[dict] | None = None) -> torch.Tensor:
        """Log-probabilities of the next token at every position (padding excluded).

        Parameters
        ----------
        idx : LongTensor, shape ``(B, t)``
            Token ids at positions ``start .. start + t - 1`` (``start`` = the cache's length,
            0 without a cache); positions enter through rotary embeddings of queries and keys.
        cache : list of dict, optional
            Per-layer key/value cache from :meth:`new_cache`; advanced by ``t``.

        Returns
        -------
        Tensor, shape ``(B, t, vocab)``
        """
        before = torch.full((idx.shape[0], 1), PAD, dtype=idx.dtype) if cache is None else cache[0]["last"]
        x = self.tok(idx) + self.prev(torch.cat([before, idx[:, :-1]], dim=1))
        if cache is not None:
            cache[0]["last"] = idx[:, -1:].clone()
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        if cache is not None:
            for c in cache:
                c["len"] += idx.shape[1]
        logits = self.head(self.ln_f(x))
        is_pad = torch.arange(logits.shape[-1]) == PAD
        return logits.masked_fill(is_pad, float("-inf")).log_softmax(dim=-1)

    def new_cache(self, batch: int, length: int) -> list[dict]:
        """Return an empty key/value cache for ``batch`` rows and ``length`` positions.

        Parameters
        ----------
        batch, length : int

        Returns
        -------
        list of dict
        """
        cfg = self.cfg
        dtype = self.head.weight.dtype
        shape = (batch, cfg.n_head, length, cfg.d_model // cfg.n_head)
        cache = [
            {"k": torch.zeros(shape, dtype=dtype), "v": torch.zeros(shape, dtype=dtype), "len": 0}
            for _ in range(cfg.n_layer)
        ]
        cache[0]["last"] = torch.full((batch, 1), PAD, dtype=torch.long)
        return cache


def length_chunks(lengths, rows: int) -> list[list[int]]:
    """Return the indices sorted by length (stable), cut into chunks of at most ``rows``.

    Padding to the longest row of a chunk then wastes little, and attention (quadratic in
    the length) is paid mostly by the chunks of long rows.

    Parameters
    ----------
    lengths : sequence of int
    rows : int

    Returns
    -------
    list of list of int
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[k : k + rows] for k in range(0, len(order), rows)]


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    """Right-pad token id lists with :data:`~variance_lab.experiment.task.PAD` into a LongTensor.

    Parameters
    ----------
    seqs : list of list of int

    Returns
    -------
    LongTensor, shape ``(len(seqs), longest)``
    """
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def token_log_probs(model: TinyGPT, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    r"""Teacher-forced log-probabilities of each response token given its prompt.

    Parameters
    ----------
    model : TinyGPT
    prompts, responses : list of list of int
        Token ids; every response has at least one token.

    Returns
    -------
    Tensor, shape ``(B, longest response)``
        ``out[i, j]`` is :math:`\log\pi(y_j | x, y_{<j})` for ``j < len(responses[i])``, 0 after.
        Differentiable when gradients are enabled.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    idx = pad_batch(seqs)
    logp = model(idx[:, :-1]).gather(-1, idx[:, 1:].unsqueeze(-1)).squeeze(-1)
    width = max(len(r) for r in responses)
    gather = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        gather[i, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
        valid[i, : len(r)] = True
    picked = logp.gather(1, gather.clamp(max=logp.shape[1] - 1))
    return torch.where(valid, picked, torch.zeros((), dtype=picked.dtype))


@torch.no_grad()
def score_responses(
    model: TinyGPT, prompts: list[list[int]], responses: list[list[int]], *, rows: int = 32
) -> torch.Tensor:
    """:func:`token_log_probs` without gradients, in chunks of similar length.

    Parameters
    ----------
    model : TinyGPT
        Scored in its own dtype (cast a copy with ``.double()`` for float64 log-probs).
    prompts, responses : list of list of int
    rows : int
        Rows per forward pass.

    Returns
    -------
    Tensor, shape ``(B, longest response)``
        Log-probabilities of the response tokens, 0 after each response's end.
    """
    dtype = model.head.weight.dtype
    out = torch.zeros((len(responses), max(len(r) for r in responses)), dtype=dtype)
    for chunk in length_chunks([len(r) for r in responses], rows):
        logp = token_log_probs(model, [prompts[i] for i in chunk], [responses[i] for i in chunk])
        out[chunk, : logp.shape[1]] = logp
    return out


@torch.no_grad()
def sampler_log_probs(
    model: TinyGPT,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    temperature: float = 1.0,
    rows: int = 32,
) -> torch.Tensor:
    r"""Compute the log-probabilities of the sampler's own distribution, teacher-forced, in float64.

    :func:`generate` draws from :math:`\operatorname{softmax}(\ell / \tau)` with :math:`\ell` the
    model's log-probabilities in its own dtype (bfloat16 for a bfloat16 copy), turned to float64
    first; this returns :math:`\log\operatorname{softmax}(\ell/\tau)` of each response token in
    float64: what an inference engine reports for the tokens it sampled. The forward pass is
    the full sequence, where generation went token by token with the key-value cache; in
    bfloat16 the two can differ in the last bits.

    Returns
    -------
    Tensor of float64, shape ``(B, longest response)``, 0 after each response's end.
    """
    out = torch.zeros((len(responses), max(len(r) for r in responses)), dtype=torch.float64)
    for chunk in length_chunks([len(r) for r in responses], rows):
        ps, rs = [prompts[i] for i in chunk], [responses[i] for i in chunk]
        seqs = [p + r for p, r in zip(ps, rs, strict=True)]
        idx = pad_batch(seqs)
        logp = (model(idx[:, :-1]).double() / temperature).log_softmax(dim=-1)
        picked = logp.gather(-1, idx[:, 1:].unsqueeze(-1)).squeeze(-1)
        for row, (p, r) in zip(chunk, zip(ps, rs, strict=True), strict=True):
            out[row, : len(r)] = picked[chunk.index(row), len(p) - 1 : len(p) - 1 + len(r)]
    return out


def _sample(logp: torch.Tensor, generator: torch.Generator, temperature: float) -> torch.Tensor:
    """One token per row by inverse CDF from float64 probabilities (one uniform per row)."""
    p = (logp.double() / temperature).softmax(dim=-1)
    cdf = p.cumsum(dim=-1)
    u = torch.rand(p.shape[0], generator=generator, dtype=torch.float64) * cdf[:, -1]
    return torch.searchsorted(cdf, u.unsqueeze(1), right=True).squeeze(1).clamp(max=p.shape[1] - 1)


@torch.no_grad()
def generate(
    model: TinyGPT,
    prompts: list[list[int]],
    max_new: list[int],
    generator: torch.Generator,
    *,
    temperature: float = 1.0,
) -> list[list[int]]:
    """Sample a response for each prompt, up to the end token or ``max_new`` tokens.

    Rows are aligned by absolute position: generation starts after the shortest prompt, and
    a longer prompt's own tokens are fed until it ends (so a row's distribution never depends
    on the other rows). Every step draws one uniform per row from ``generator``, so the
    result depends only on the model, the prompts (in order) and the generator's state.

    Parameters
    ----------
    model : TinyGPT
    prompts : list of list of int
    max_new : list of int
        Token budget of each response.
    generator : torch.Generator
    temperature : float
        Sampling temperature (1: the model's own distribution).

    Returns
    -------
    list of list of int
        Each response's tokens, ending with the end token unless the budget ran out.
    """
    plen = torch.tensor([len(p) for p in prompts])
    stop = plen + torch.tensor(max_new)
    if int(stop.max()) > model.cfg.max_len:
        raise ValueError(f"prompt plus budget {int(stop.max())} exceeds max_len {model.cfg.max_len}")
    tokens = pad_batch(prompts)
    tokens = torch.cat([tokens, torch.full((len(prompts), int(stop.max()) - tokens.shape[1]), PAD)], dim=1)
    cache = model.new_cache(len(prompts), tokens.shape[1])
    t = int(plen.min())
    logp = model(tokens[:, :t], cache)[:, -1]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    while t < tokens.shape[1]:
        drawn = _sample(logp, generator, temperature)
        prompt_tok = t < plen
        nxt = torch.where(prompt_tok, tokens[:, t], torch.where(done | (t >= stop), PAD, drawn))
        tokens[:, t] = nxt
        done |= (~prompt_tok) & ((nxt == _EOS_ID) | (t + 1 >= stop))
        t += 1
        if bool(done.all()) or t >= tokens.shape[1]:
            break
        logp = model(tokens[:, t - 1 : t], cache)[:, -1]
    return [tokens[i, len(p) : t][tokens[i, len(p) : t] != PAD].tolist() for i, p in enumerate(prompts)]
