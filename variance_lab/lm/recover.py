r"""Recover a shipped run's sampled token ids from its text and log-probs, and add per-token entropy.

A run's records keep each response as text (decoded with special tokens skipped) and its
per-token log-probs, not the token ids. Encoding the text again gives the sampled ids for
most responses, but a sampler may draw a split that the tokenizer would not make (``" 1"``,
``"7"`` for ``" 17"``) or a special token that the text drops. :func:`search_tokens` finds
those: at position :math:`t` it takes, among the tokens :math:`v` whose decoded text keeps
the response's prefix and whose log-prob is within ``tol`` of the record's
:math:`\ell_t` (``old_logp``), the nearest,

.. math::

    y_t = \arg\min_{v} \left| \log \pi_{\text{old}}(v \mid x, y_{<t}) - \ell_t \right|.

Every candidate sequence is then scored again, teacher forced
(:func:`~variance_lab.lm.scoring.score`), and kept only when it reproduces ``old_logp`` within
``tol`` at every token. That check is what makes the ids the sampled ones.
:func:`add_entropy` writes the entropy :math:`H_t` of :math:`\pi_{\text{old}}` at every
response position (``entropy``, nats) into the records of a run made before runs recorded
it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from variance_lab.experiment.files import sidecar_path, write_dataset
from variance_lab.lm.analysis import read_records
from variance_lab.lm.runs import ENTROPY_FIELD, LM_SIDECAR_KIND, random_streams, round_digits
from variance_lab.lm.sampling import cache_arg, cache_of
from variance_lab.lm.scoring import score
from variance_lab.lm.settings import LMSettings
from variance_lab.lm.task import chat_prompts, make_prompts, messages, stop_ids
from variance_lab.progress import ticker
from variance_lab.provenance import deterministic_torch, numbers_sha256, read_json_object

__all__ = ["HOW", "Recovered", "add_entropy", "encoded_response", "prompt_list", "recover", "search_tokens"]

#: How a sequence's ids were found: by encoding its text, by :func:`search_tokens`, or not.
HOW = ("encoded", "searched", "not found")


@dataclass
class Recovered:
    r"""What :func:`recover` found, one entry per record.

    Attributes
    ----------
    tokens : list of (list of int or None)
    logp, entropy : list of (numpy.ndarray or None)
        The teacher-forced log-probs and entropies of the recovered ids.
    how : list of str
        One of :data:`HOW`.
    max_abs_diff : float
        The largest :math:`|\log \pi_{\text{old}} - \ell_t|` over the recovered sequences.
    """

    tokens: list
    logp: list
    entropy: list
    how: list
    max_abs_diff: float

    def counts(self) -> dict:
        """Return ``{how: number of sequences}`` for every entry of :data:`HOW`."""
        return {h: self.how.count(h) for h in HOW}


def search_tokens(
    log_probs,
    encode,
    decode,
    text: str,
    old_logp,
    *,
    finished: bool,
    end_ids,
    tol: float = 1e-4,
    window: int = 32,
) -> list[int] | None:
    r"""Find the token ids of one response from its text and log-probs (see the module).

    Each round encodes the text not yet covered, scores its first ``window`` ids after the ids
    found so far, keeps them up to the first whose log-prob differs from :math:`\ell_t` by more
    than ``tol``, and there takes the nearest token that keeps the text's prefix. A response
    the tokenizer would have split the same way takes one round per ``window`` tokens; each
    split it would not have made adds one.

    Parameters
    ----------
    log_probs : callable
        ``log_probs(ids, start)`` returns float64 log-probs of shape
        ``(len(ids) - start + 1, V)``: row :math:`j` is the distribution of the token after
        ``ids[:start + j]``.
    encode, decode : callable
        Text to ids (no special tokens added) and ids to text (special tokens skipped).
    text : str
        The response.
    old_logp : sequence of float
        :math:`\ell_t`, one per token.
    finished : bool
        The last token is one of ``end_ids``.
    end_ids : sequence of int
    tol : float, optional
        The largest :math:`|\log \pi - \ell_t|` taken as equal.
    window : int, optional
        The most ids guessed per round.

    Returns
    -------
    list of int or None
        None when some position has no candidate or the ids do not decode to ``text``.
    """
    n = len(old_logp)
    target = np.asarray(old_logp, dtype=float)
    tokens: list[int] = []
    while len(tokens) < n:
        t = len(tokens)
        covered = decode(tokens)
        guess = encode(text[len(covered) :]) if text.startswith(covered) else []
        guess = [*guess, end_ids[0]] if finished else guess
        ids = tokens + guess[: min(window, n - t)]
        lp = log_probs(ids, t)
        k = t
        while k < len(ids) and abs(lp[k - t, ids[k]] - target[k]) <= tol:
            if not _keeps_prefix(decode(ids[: k + 1]), text):
                break
            k += 1
        tokens = ids[:k]
        if k == n or (k == len(ids) and k > t):
            continue
        only = end_ids if finished and k == n - 1 else None
        pick = _nearest(lp[k - t], target[k], tokens, decode, text, tol, only)
        if pick is None:
            return None
        tokens.append(pick)
    ok = decode(tokens) == text and (not finished or tokens[-1] in end_ids)
    return tokens if ok else None


def _nearest(lp, target, tokens, decode, text, tol, only) -> int | None:
    """Return the token nearest ``target`` in log-prob (within ``tol``; among ``only``) keeping the prefix."""
    near = np.flatnonzero(np.abs(lp - target) <= tol)
    if only is not None:
        near = [v for v in near if v in only]
    for v in sorted(near, key=lambda v: abs(lp[v] - target)):
        if _keeps_prefix(decode([*tokens, int(v)]), text):
            return int(v)
    return None


def _keeps_prefix(piece: str, text: str) -> bool:
    """``piece`` starts ``text``, allowing a last character cut inside its UTF-8 bytes."""
    return text.startswith(piece) or (piece.endswith("\ufffd") and text.startswith(piece.rstrip("\ufffd")))


class _Forward:
    """``log_probs(ids, start)`` for one prompt, with a key-value cache kept between calls.

    A call feeds only what differs from the previous call's sequence (the cache is cut back to
    their common prefix), so a round of :func:`search_tokens` costs its guessed ids, not the
    whole prompt and response again.
    """

    def __init__(self, model, prompt, temperature: float = 1.0):
        self.model, self.prompt, self.temperature = model, list(prompt), temperature
        self.cache, self.seq = None, []
        self.arg = cache_arg(model)

    def __call__(self, ids: list[int], start: int) -> np.ndarray:
        seq = self.prompt + list(ids)
        need = len(self.prompt) + start - 1  # the position whose output predicts ids[start]
        keep = min(_common_prefix(self.seq, seq), need)
        extra = {}
        if self.cache is not None and keep > 0:
            if len(self.seq) > keep:
                self.cache.crop(keep - len(self.seq))  # a negative count removes that many
            extra = {self.arg: self.cache}
        else:
            keep = 0
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([seq[keep:]]), use_cache=True, **extra)
        self.cache, self.seq = cache_of(out), seq
        logits = out.logits[0, need - keep :].double() / self.temperature
        return logits.log_softmax(-1).numpy()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def encoded_response(tokenizer, record: dict, end_ids) -> list[int] | None:
    """Encode a record's response text again (with the end token when ``finished``).

    Returns ``None`` unless it gives as many ids as the record has log-probs (the check that
    the ids can be the sampled ones; a score against ``old_logp`` settles it).
    """
    ids = tokenizer.encode(record["response"], add_special_tokens=False)
    ids = [*ids, end_ids[0]] if record["finished"] else ids
    return ids if len(ids) == len(record["old_logp"]) and ids else None


def _check(model, prompts, candidates, records, rows, *, tol, **score_options):
    """Score the candidate ids of ``rows``; return {row: (logp, entropy, max diff)} for those within tol.

    ``score_options`` go to :func:`~variance_lab.lm.scoring.score` (batch size, temperature,
    padding id, progress).
    """
    rows = [i for i in rows if candidates[i] is not None]
    if not rows:
        return {}
    chosen = [prompts[i] for i in rows], [candidates[i] for i in rows]
    lp, h = score(model, *chosen, entropy=True, **score_options)
    out = {}
    for i, lpi, hi in zip(rows, lp, h, strict=True):
        diff = float(np.max(np.abs(lpi - np.asarray(records[i]["old_logp"]))))
        if diff <= tol:
            out[i] = (lpi, hi, diff)
    return out


def recover(
    model,
    tokenizer,
    prompts,
    records,
    *,
    tol: float = 1e-4,
    temperature: float = 1.0,
    batch_size: int = 8,
    say=None,
) -> Recovered:
    """Recover every record's token ids and score them with entropies (see the module).

    Parameters
    ----------
    model : transformers causal language model
        The float32 policy that scored ``old_logp``.
    tokenizer : its tokenizer
    prompts : list of list of int
        The prompt ids of each record, chat template applied.
    records : list of dict
        With ``response``, ``finished`` and ``old_logp``.
    tol : float, optional
        > 0; the largest difference from ``old_logp`` taken as equal.
    temperature : float, optional
        The temperature ``old_logp`` was scored at.
    batch_size : int, optional
        Sequences per scoring pass.
    say : callable, optional
        Called with one-line progress messages.

    Returns
    -------
    Recovered
    """
    _check_tol(tol)
    if len(prompts) != len(records):
        raise ValueError(f"{len(prompts)} prompts but {len(records)} records")
    say = say or (lambda message: None)
    ends = stop_ids(tokenizer)
    pad = tokenizer.pad_token_id
    options = {"tol": tol, "batch_size": batch_size, "temperature": temperature, "pad_id": pad}
    n = len(records)
    candidates = [encoded_response(tokenizer, r, ends) for r in records]
    tick = ticker(say, "scoring the re-encoded responses")
    found = _check(model, prompts, candidates, records, range(n), **options, progress=tick)
    how = ["encoded" if i in found else "not found" for i in range(n)]
    rest = [i for i in range(n) if i not in found]
    say(f"{len(found)} of {n} responses re-encode to their sampled ids; searching {len(rest)}")

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    tick = ticker(say, "searching the others")
    for k, i in enumerate(rest, start=1):
        r = records[i]
        candidates[i] = search_tokens(
            _Forward(model, prompts[i], temperature),
            encode,
            decode,
            r["response"],
            r["old_logp"],
            finished=r["finished"],
            end_ids=ends,
            tol=tol,
        )
        tick(k, len(rest))
    searched = _check(model, prompts, candidates, records, rest, **options)
    for i in searched:
        how[i] = "searched"
    found |= searched
    return Recovered(
        tokens=[candidates[i] if i in found else None for i in range(n)],
        logp=[found[i][0] if i in found else None for i in range(n)],
        entropy=[found[i][1] if i in found else None for i in range(n)],
        how=how,
        max_abs_diff=max((d for _, _, d in found.values()), default=float("nan")),
    )


def prompt_list(settings: LMSettings, tokenizer) -> tuple[list, list[list[int]]]:
    """Rebuild a run's data-batch prompt ids from its settings, in record order.

    The run drew them from its first random stream (for ``stale``, interleaved with the
    chain steps' prompts, which are drawn and dropped here).

    Parameters
    ----------
    settings : LMSettings
    tokenizer : the model's tokenizer

    Returns
    -------
    (list of Prompt, list of list of int)
        The prompts and their ids, one per sequence (each prompt ``group_size`` times).
    """
    rng = np.random.default_rng(random_streams(settings.seed)[0])
    sizes = settings.task_options()
    if settings.run == "stale":
        per_lag = settings.n_prompts // (settings.lags + 1)
        drawn = []
        for k in range(settings.lags + 1):
            drawn += make_prompts(rng, per_lag, **sizes)
            if k < settings.lags:
                make_prompts(rng, settings.train_prompts, **sizes)
    else:
        drawn = make_prompts(rng, settings.n_prompts, **sizes)
    rows = [p for p in drawn for _ in range(settings.group_size)]
    return rows, chat_prompts(tokenizer, [messages(p, settings.shots, system=settings.system) for p in rows])


def add_entropy(path, *, loaded=None, tol: float = 1e-4, say=None) -> dict:
    """Add ``entropy`` (the old policy's next-token entropy, nats, per token) to a run's records.

    The data file and its sidecar are rewritten atomically; every other field is kept as it
    was (the sidecar's ``numbers_sha256`` is checked unchanged). A record whose ids cannot be
    recovered keeps no ``entropy``; the sidecar's ``entropy_recovery`` counts them.

    Parameters
    ----------
    path : str or Path
        A ``.jsonl.gz`` or ``.jsonl`` written by :func:`variance_lab.lm.runs.run_lm_experiment`, with
        its sidecar.
    loaded : (model, tokenizer, dict), optional
        A loaded float32 model (default SmolLM2-135M-Instruct, :func:`~variance_lab.lm.model.load_smollm2`).
    tol : float, optional
        See :func:`recover`.
    say : callable, optional
        Called with one-line progress messages.

    Returns
    -------
    dict
        The new sidecar.
    """
    _check_tol(tol)
    path = Path(path)
    side = sidecar_path(path)
    if not side.is_file():
        raise ValueError(f"{str(path)!r} has no sidecar {side.name!r}")
    sidecar = read_json_object(side, "the sidecar")
    if sidecar.get("kind") != LM_SIDECAR_KIND:
        kind = sidecar.get("kind")
        raise ValueError(f"{str(side)!r} is not a sidecar of a language-model run (kind {kind!r})")
    settings = LMSettings.from_dict(sidecar["settings"])
    records = read_records(path)
    t0 = time.perf_counter()
    with deterministic_torch(settings.threads):
        if loaded is None:
            from variance_lab.lm.model import load_smollm2

            loaded = load_smollm2()[:2]
        model, tokenizer = loaded[0], loaded[1]
        rows, prompts = prompt_list(settings, tokenizer)
        _check_prompts(rows, records, path)
        found = recover(
            model, tokenizer, prompts, records, tol=tol, temperature=settings.temperature, say=say
        )
    for record, h in zip(records, found.entropy, strict=True):
        record.pop("entropy", None)
        if h is not None:
            record["entropy"] = round_digits(h, settings.digits)
    if numbers_sha256(records) != sidecar.get("numbers_sha256", numbers_sha256(records)):
        raise ValueError(f"{str(path)!r}: the ids and log-probs changed while adding entropy (not written)")
    sidecar["fields"]["entropy"] = (
        f"{ENTROPY_FIELD} (added later from the recovered token ids: variance_lab.lm.recover)"
    )
    sidecar["entropy_recovery"] = {
        **found.counts(),
        "tol": tol,
        "max_abs_logp_diff": found.max_abs_diff,
        "wall_time_s": time.perf_counter() - t0,
    }
    write_dataset(records, path, sidecar)
    return sidecar


def _check_tol(tol) -> None:
    if not (tol > 0 and np.isfinite(tol)):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")


def _check_prompts(rows, records, path) -> None:
    if len(rows) != len(records):
        raise ValueError(f"{str(path)!r}: {len(records)} records but its settings give {len(rows)} sequences")
    for number, (p, r) in enumerate(zip(rows, records, strict=True), start=1):
        if p.text != r.get("prompt"):
            raise ValueError(f"{str(path)!r}: record {number}'s prompt is not its settings' {p.text!r}")
