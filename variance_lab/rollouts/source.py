r"""Token sources: a batch's sequences in pieces, read again for each pass of the streaming analysis.

:func:`~variance_lab.rollouts.analysis.analyze` never needs a file's token columns at once: each
pass of :mod:`variance_lab.rollouts.summaries` reduces them, a piece at a time, to per-sequence and
pooled sums (and one array of the ratio's log-ratios). A :class:`TokenSource` gives the pieces in
order, as often as asked; opening one is its first pass, which checks every sequence (``on_bad``
as :func:`~variance_lab.rollouts.io.load_batch` says) and keeps what the later passes plan by:
each sequence's length, span, id and prompt, and the largest magnitudes of its log-probs and
log-ratios (:data:`MAXIMA`), from which the exact sums of :func:`~variance_lab.ratios.segment_sums`
take their scale.

- :func:`batch_source`: a batch in memory, in pieces of about :data:`PIECE_TOKENS` tokens (views,
  no copies);
- :func:`parquet_source`: a Parquet file, :data:`PIECE_ROWS` rows a piece
  (:func:`~variance_lab.rollouts.parquet.parquet_pieces`): what it holds at once is one piece.
- :func:`open_rollouts`: a file as :func:`~variance_lab.rollouts.io.load_batch` reads it, Parquet
  streamed and the other formats loaded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from variance_lab.rollouts.batch import (
    DroppedSequence,
    TokenBatch,
    check_on_bad,
    group_index,
    report_problems,
    segment_offsets,
)
from variance_lab.rollouts.io import detect_format, load_batch
from variance_lab.rollouts.parquet import parquet_pieces, rejection_note
from variance_lab.rollouts.prompts import as_prompt_ids
from variance_lab.rollouts.records import id_array
from variance_lab.simulate._jit import kernel

__all__ = [
    "MAXIMA",
    "PIECE_ROWS",
    "PIECE_TOKENS",
    "TokenSource",
    "batch_source",
    "open_rollouts",
    "parquet_source",
]

#: Rows of a Parquet file a piece (about 1.5e5 tokens of a dump with lengths up to 8192).
PIECE_ROWS = 128
#: Tokens of an in-memory batch a piece, about (whole sequences).
PIECE_TOKENS = 1 << 18
#: Columns of :attr:`TokenSource.maxima`, per sequence: the largest :math:`|x|` of ``logp``,
#: ``old_logp`` and ``rollout_logp``, and the least and largest value (``_lo``, ``_hi``) of each
#: log-ratio: ``update`` = logp - old_logp, ``mismatch`` = old_logp - rollout_logp, ``total`` =
#: logp - rollout_logp (the ``total`` ratio's), ``split_total`` = mismatch + update (the
#: three-policy split's).
MAXIMA = (
    "logp",
    "old_logp",
    "rollout_logp",
    "update_lo",
    "update_hi",
    "mismatch_lo",
    "mismatch_hi",
    "total_lo",
    "total_hi",
    "split_total_lo",
    "split_total_hi",
)


@kernel
def _piece_maxima(logp, old, roll, offsets, out, changed):  # pragma: no cover - compiled
    """Per sequence of a piece, the :data:`MAXIMA` (rows of ``out``) and its tokens with logp != old_logp."""
    has_roll = roll.size > 0
    for s in range(offsets.size - 1):
        a, b = offsets[s], offsets[s + 1]
        for k in range(3):
            out[s, k] = 0.0
        for k in range(3, 11, 2):
            out[s, k] = np.inf
            out[s, k + 1] = -np.inf
        n = 0
        for t in range(a, b):
            lp, ol = logp[t], old[t]
            out[s, 0] = max(out[s, 0], abs(lp))
            out[s, 1] = max(out[s, 1], abs(ol))
            upd = lp - ol
            out[s, 3] = min(out[s, 3], upd)
            out[s, 4] = max(out[s, 4], upd)
            n += lp != ol
            if has_roll:
                ro = roll[t]
                out[s, 2] = max(out[s, 2], abs(ro))
                mis = ol - ro
                tot = lp - ro
                both = mis + upd
                out[s, 5] = min(out[s, 5], mis)
                out[s, 6] = max(out[s, 6], mis)
                out[s, 7] = min(out[s, 7], tot)
                out[s, 8] = max(out[s, 8], tot)
                out[s, 9] = min(out[s, 9], both)
                out[s, 10] = max(out[s, 10], both)
        changed[s] = n


@dataclass(frozen=True, eq=False)
class TokenSource:
    """The checked sequences of a batch or a file, in pieces (:meth:`pieces`), and what the first pass kept.

    Attributes
    ----------
    name : str
        What the source is (a file's name).
    lengths, spans : ndarray of int64
        Each sequence's counted tokens and its span (last counted position + 1; larger than the
        length where a mask leaves holes).
    ids : ndarray
        Sequence ids.
    prompt_id : ndarray or None
        Each sequence's prompt, as :attr:`~variance_lab.rollouts.batch.TokenBatch.prompt_id`.
    maxima : ndarray of float64, shape ``(n, 11)``
        Per sequence, the :data:`MAXIMA`.
    n_changed : int
        Tokens whose ``logp`` differs from their ``old_logp``.
    has_rollout : bool
        Whether the sequences carry ``rollout_logp``.
    dropped, notes : tuple
        As a loaded batch's :attr:`~variance_lab.rollouts.batch.TokenBatch.dropped` and ``notes``.
    """

    name: str
    lengths: np.ndarray
    spans: np.ndarray
    ids: np.ndarray
    prompt_id: np.ndarray | None
    maxima: np.ndarray
    n_changed: int
    has_rollout: bool
    dropped: tuple[DroppedSequence, ...] = ()
    notes: tuple[str, ...] = ()
    _pieces: Callable[[], Iterator[TokenBatch]] = field(default=None, repr=False)

    def __len__(self) -> int:
        """Return the number of sequences."""
        return self.lengths.size

    @property
    def n_tokens(self) -> int:
        """Counted tokens in all."""
        return int(self.lengths.sum())

    @property
    def offsets(self) -> np.ndarray:
        """Where each sequence starts in the concatenation of every piece's tokens."""
        return segment_offsets(self.lengths)

    @property
    def has_groups(self) -> bool:
        """True when the sequences carry ``prompt_id``."""
        return self.prompt_id is not None

    @property
    def has_holes(self) -> bool:
        """True when some sequence's counted tokens do not lie one after another (a mask with holes)."""
        return bool(np.any(self.spans != self.lengths))

    def group_index(self) -> np.ndarray:
        """Return each sequence's group, as :meth:`~variance_lab.rollouts.batch.TokenBatch.group_index`."""
        return group_index(self.prompt_id, len(self))

    def column(self, name: str) -> np.ndarray:
        """Return one of the :data:`MAXIMA` of every sequence."""
        return self.maxima[:, MAXIMA.index(name)]

    def pieces(self) -> Iterator[tuple[int, TokenBatch]]:
        """Yield (index of the first sequence, the piece) in order: every sequence once, with its tokens."""
        first = 0
        for piece in self._pieces():
            if len(piece):
                yield first, piece
                first += len(piece)
        if first != len(self):
            raise ValueError(f"{self.name}: the source gave {first} sequences, {len(self)} when opened")


def _gather(pieces: Iterator[TokenBatch]) -> dict | None:
    """Return the first pass: each piece's sequences' lengths, spans, ids, prompts, maxima (None: none)."""
    lengths, spans, ids, prompts, maxima, changed = [], [], [], [], [], 0
    has_rollout = None
    for piece in pieces:
        has_rollout = piece.has_rollout if has_rollout is None else has_rollout
        if not len(piece):
            continue
        off = piece.offsets
        lengths.append(np.diff(off))
        spans.append(piece.positions[off[1:] - 1] + 1)
        ids.extend(piece.ids.tolist())
        if piece.prompt_id is not None:
            prompts.extend(piece.prompt_id.tolist())
        out = np.empty((len(piece), len(MAXIMA)))
        n_changed = np.empty(len(piece), dtype=np.int64)
        roll = piece.rollout_logp if piece.has_rollout else np.zeros(0)
        _piece_maxima(piece.logp, piece.old_logp, roll, off, out, n_changed)
        maxima.append(out)
        changed += int(n_changed.sum())
    if not lengths:
        return None
    n = sum(x.size for x in lengths)
    return {
        "lengths": np.concatenate(lengths),
        "spans": np.concatenate(spans),
        "ids": id_array(ids),
        "prompt_id": as_prompt_ids(prompts, n) if prompts else None,
        "maxima": np.concatenate(maxima),
        "n_changed": changed,
        "has_rollout": bool(has_rollout),
    }


def batch_source(
    batch: TokenBatch, *, name: str = "the batch", piece_tokens: int = PIECE_TOKENS
) -> TokenSource:
    """Return a batch in memory as a source: pieces of whole sequences, about ``piece_tokens`` tokens, views.

    Parameters
    ----------
    batch : TokenBatch
    name : str
        What to call it in messages.
    piece_tokens : int
        Tokens a piece, about (a longer sequence is a piece of its own).

    Returns
    -------
    TokenSource
    """
    off = batch.offsets
    cuts = [0]
    while cuts[-1] < len(batch):  # each piece ends at the first sequence that brings it past the budget
        stop = int(np.searchsorted(off, off[cuts[-1]] + piece_tokens, side="left"))
        cuts.append(min(len(batch), max(stop, cuts[-1] + 1)))

    def pieces() -> Iterator[TokenBatch]:
        for a, b in itertools.pairwise(cuts):
            t0, t1 = off[a], off[b]
            yield TokenBatch(
                logp=batch.logp[t0:t1],
                old_logp=batch.old_logp[t0:t1],
                offsets=off[a : b + 1] - t0,
                positions=batch.positions[t0:t1],
                ids=batch.ids[a:b],
                rollout_logp=None if batch.rollout_logp is None else batch.rollout_logp[t0:t1],
                prompt_id=None if batch.prompt_id is None else batch.prompt_id[a:b],
            )

    info = _gather(pieces()) | {"ids": batch.ids, "prompt_id": batch.prompt_id}  # the batch's own arrays
    return TokenSource(name=name, dropped=batch.dropped, notes=tuple(batch.notes), _pieces=pieces, **info)


def parquet_source(
    path, *, on_bad: str = "raise", fields: Mapping[str, str] | None = None, rows: int = PIECE_ROWS
) -> TokenSource:
    """Open a Parquet file of token log-probs as a source (read by :func:`.parquet.parquet_pieces`).

    The first pass reads every piece and checks every sequence: with ``on_bad="raise"`` a bad one
    raises ``ValueError`` once the whole file was read (the message of
    :func:`~variance_lab.rollouts.io.load_batch`: the first bad sequence and how many more), with
    ``"drop"`` it is listed in ``dropped``. Each later pass reads the file again.

    Parameters
    ----------
    path : str or Path
    on_bad : {"raise", "drop"}
    fields : mapping, optional
        File names of the fields, as :func:`~variance_lab.rollouts.io.load_batch` takes them.
    rows : int
        Rows a piece.

    Returns
    -------
    TokenSource
    """
    on_bad = check_on_bad(on_bad)
    path = Path(path)
    dropped: list[DroppedSequence] = []
    rejected: list = []

    def first_pass() -> Iterator[TokenBatch]:
        for piece, counts in parquet_pieces(path, fields=fields, rows=rows):
            dropped.extend(piece.dropped)
            rejected.append(counts)
            yield piece

    def pieces() -> Iterator[TokenBatch]:
        for piece, _ in parquet_pieces(path, fields=fields, rows=rows, tokens_only=True):
            yield piece

    try:
        info = _gather(first_pass())
        if dropped and on_bad == "raise":
            ids = np.empty(dropped[-1].index + 1, dtype=object)
            for d in dropped:
                ids[d.index] = d.id
            report_problems({d.index: d.reason for d in dropped}, ids, "raise")
        if info is None:
            raise ValueError(f"no valid sequence left ({len(dropped)} dropped)")
    except ValueError as exc:  # bad data or a malformed file: the message names the file, once
        if str(exc).startswith(f"{path.name}: "):
            raise
        raise ValueError(f"{path.name}: {exc}") from None
    notes = rejection_note(path.name, rejected)
    return TokenSource(name=path.name, dropped=tuple(dropped), notes=notes, _pieces=pieces, **info)


def open_rollouts(
    path,
    *,
    format: str | None = None,
    on_bad: str = "raise",
    fields: Mapping[str, str] | None = None,
    preset: str | None = None,
) -> TokenSource:
    """Open a file of token log-probs as a source: Parquet streamed (:func:`parquet_source`), the rest loaded.

    The arguments are :func:`~variance_lab.rollouts.io.load_batch`'s; a JSONL, NPZ or framework
    file is loaded whole and given in pieces (:func:`batch_source`).

    Returns
    -------
    TokenSource
    """
    if preset is None and detect_format(path, format) == "parquet":
        return parquet_source(path, on_bad=on_bad, fields=fields)
    batch = load_batch(path, format=format, on_bad=on_bad, fields=fields, preset=preset)
    return batch_source(batch, name=Path(path).name)
