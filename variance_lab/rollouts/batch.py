r"""Batches of token log-probs: :class:`TokenBatch` and its validation.

Batches of sequences of different lengths are held as a :class:`TokenBatch`: the counted
tokens of all sequences concatenated into flat float64 arrays plus ``offsets``, built from
padded 2-D arrays with a mask (:meth:`TokenBatch.from_padded`), from lists of ragged 1-D arrays
(:meth:`TokenBatch.from_ragged`) or from flat arrays with lengths (:meth:`TokenBatch.from_flat`).
Bad data (NaN, :math:`\pm\infty`, a log-probability :math:`> 0`, length mismatch, a sequence with
no counted token, a mask value other than 0/1) raises ``ValueError`` naming the sequence, or is
dropped with ``on_bad="drop"`` and reported in :attr:`TokenBatch.dropped`.

The loaders of :mod:`variance_lab.rollouts.io` build batches through :func:`build_batch`, the
one validating constructor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from variance_lab.rollouts.prompts import as_prompt_ids
from variance_lab.stats import exp_quiet

__all__ = [
    "ON_BAD",
    "DroppedSequence",
    "TokenBatch",
    "build_batch",
    "check_on_bad",
    "group_index",
    "report_problems",
    "segment_offsets",
]


#: Allowed values of the ``on_bad`` option.
ON_BAD = ("raise", "drop")


class DroppedSequence(NamedTuple):
    """A sequence left out of a batch by ``on_bad="drop"``: its input index, id and the problem."""

    index: int
    id: object
    reason: str


# --------------------------------------------------------------------------------------
# validation of raw input: vectorised per-token flags, reported per sequence
# --------------------------------------------------------------------------------------
def check_on_bad(on_bad: str) -> str:
    """Return ``on_bad`` if it is one of ON_BAD, else raise ValueError naming it."""
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    return on_bad


def segment_offsets(lengths: np.ndarray) -> np.ndarray:
    """Return the offsets [0, cumsum(lengths)] of consecutive segments of these lengths."""
    out = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _segment_of_tokens(lengths: np.ndarray) -> np.ndarray:
    """Index of the segment of every element, for segments of the given lengths."""
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)


def _first_per_segment(flags: np.ndarray, seg: np.ndarray, starts: np.ndarray):
    """(segments with a set flag, position within the segment of their first set flag)."""
    hits = np.flatnonzero(flags)
    segs, first = np.unique(seg[hits], return_index=True)
    return segs, hits[first] - starts[segs]


def _keep_segments(x: np.ndarray | None, lengths: np.ndarray, keep: np.ndarray):
    """Return the elements of flat ``x`` that belong to the kept segments (``x`` itself when all are)."""
    if x is None or keep.all():
        return x
    return x[np.repeat(keep, lengths)]


def _describe_value(name: str, pos: int, value: float, policy: str) -> str:
    if math.isnan(value):
        return f"{name}[{pos}] is NaN"
    if value == math.inf:
        return f"{name}[{pos}] is +inf"
    if value == -math.inf:
        return f"{name}[{pos}] is -inf (probability 0 under the {policy} policy)"
    return f"{name}[{pos}] = {value!r} is > 0 (a log-probability must be <= 0)"


def _bad_tokens(x: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Flag counted tokens whose log-prob is NaN, +-inf or > 0 (NaN compares False, hence ~(<= 0))."""
    with np.errstate(invalid="ignore"):
        ok = (x <= 0.0) & (x > -np.inf)
    return counted & ~ok


def _problems(logp, old_logp, mask, lengths, rollout_logp=None) -> dict[int, str]:
    """Per-sequence problems of same-length flat arrays: {sequence index: first problem}."""
    seg = _segment_of_tokens(lengths)
    starts = segment_offsets(lengths)[:-1]
    found: dict[int, str] = {}
    # lowest priority first: a later, more basic problem overwrites an earlier one
    counted = np.ones(logp.size, dtype=bool) if mask is None else mask == 1
    checks = [("old_logp", old_logp, "old"), ("logp", logp, "new")]
    if rollout_logp is not None:
        checks.insert(0, ("rollout_logp", rollout_logp, "rollout (inference engine)"))
    for name, x, policy in checks:
        segs, pos = _first_per_segment(_bad_tokens(x, counted), seg, starts)
        for s, p in zip(segs.tolist(), pos.tolist(), strict=True):
            found[s] = _describe_value(name, p, float(x[starts[s] + p]), policy)
    n_counted = np.bincount(seg if mask is None else seg[counted], minlength=lengths.size)
    for s in np.flatnonzero(n_counted == 0).tolist():
        found[s] = "empty sequence" if lengths[s] == 0 else "no counted token (mask is all 0)"
    if mask is not None:
        segs, pos = _first_per_segment((mask != 0) & (mask != 1), seg, starts)
        for s, p in zip(segs.tolist(), pos.tolist(), strict=True):
            found[s] = f"mask[{p}] = {float(mask[starts[s] + p])!r} is not 0 or 1"
    return found


def _mismatches(lengths, old_lengths, mask_lengths, rollout_lengths=None) -> dict[int, str]:
    bad = lengths != old_lengths
    for other in (mask_lengths, rollout_lengths):
        if other is not None:
            bad |= lengths != other
    found = {}
    for i in np.flatnonzero(bad).tolist():
        msg = f"length mismatch: logp has {lengths[i]} values, old_logp has {old_lengths[i]}"
        if mask_lengths is not None and mask_lengths[i] != lengths[i]:
            msg += f", mask has {mask_lengths[i]}"
        if rollout_lengths is not None and rollout_lengths[i] != lengths[i]:
            msg += f", rollout_logp has {rollout_lengths[i]}"
        found[i] = msg
    return found


def report_problems(
    problems: dict[int, str], ids: np.ndarray, on_bad: str, first: int = 0
) -> tuple[DroppedSequence, ...]:
    """Raise for the first bad sequence, or list them all (``ids[i]``: sequence ``first + i``)."""
    if not problems:
        return ()
    order = sorted(problems)
    if on_bad == "raise":
        i = order[0]
        more = f"; {len(order) - 1} more bad sequence(s)" if len(order) > 1 else ""
        raise ValueError(
            f"bad sequence id={_py(ids[i])!r} (index {first + i}): {problems[i]}{more}; "
            "pass on_bad='drop' to skip bad sequences"
        )
    return tuple(DroppedSequence(first + i, _py(ids[i]), problems[i]) for i in order)


def _py(x):
    """Return a NumPy scalar as the plain Python value (for messages and records)."""
    return x.item() if isinstance(x, np.generic) else x


def _as_ids(ids, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.int64)
    out = np.asarray(ids)
    if out.ndim != 1 or out.size != n:
        raise ValueError(f"ids must be a 1-D sequence of {n} ids, got shape {out.shape}")
    return out


def group_index(prompt_id: np.ndarray | None, n: int) -> np.ndarray:
    """Return each of ``n`` sequences' group, 0 .. n_groups - 1, in the order of the prompt ids as text.

    Without ``prompt_id`` every sequence is its own group (its index). The numbering keeps the
    order of the ids' text, so a subset's groups numbered alone come in the same order.
    """
    if prompt_id is None:
        return np.arange(n, dtype=np.int64)
    return np.unique(prompt_id.astype(str), return_inverse=True)[1].astype(np.int64).ravel()


def _as_float(name: str, x) -> np.ndarray:
    if getattr(x, "dtype", None) is not None and np.dtype(x.dtype).kind == "c":
        raise ValueError(f"{name} must hold real numbers, got {x.dtype}")
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must hold numbers: {exc}") from None


def _as_mask(x) -> np.ndarray:
    """Return a mask as float64, so that values other than 0/1 can be reported rather than coerced."""
    arr = np.asarray(x)
    if arr.dtype == bool:
        return arr.astype(np.float64)
    return _as_float("mask", arr)


def _readonly(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.setflags(write=False)


# --------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TokenBatch:
    """Counted response tokens of a batch of sequences, flat, with offsets.

    Build one with :meth:`from_padded`, :meth:`from_ragged` or :meth:`from_flat` (or the
    loaders of :mod:`variance_lab.rollouts.io`); they validate the data. Arrays are read-only.

    Attributes
    ----------
    logp, old_logp : ndarray of float64, shape ``(n_tokens,)``
        Log-probabilities of the counted tokens under the new and old policies, sequence
        after sequence; every value is finite and ``<= 0``.
    offsets : ndarray of int64, shape ``(n + 1,)``
        Sequence ``i`` is ``logp[offsets[i]:offsets[i+1]]``; every sequence has >= 1 token.
    positions : ndarray of int64, shape ``(n_tokens,)``
        Position of each counted token in its original (unmasked) sequence: a mask with
        holes leaves gaps here, which the autocorrelation analysis respects.
    ids : ndarray, shape ``(n,)``
        Sequence ids (the input index when none were given).
    dropped : tuple of DroppedSequence
        Sequences left out by ``on_bad="drop"``, with the reason; empty otherwise.
    rollout_logp : ndarray of float64, shape ``(n_tokens,)``, or None
        Optional third set: the log-probabilities the inference engine that sampled the
        tokens reported (e.g. vLLM's), log mu_rollout; validated like the others. With it
        the total ratio pi_theta / mu_rollout splits into the mismatch pi_old / mu_rollout
        (:attr:`mismatch_log_ratio`) and the update pi_theta / pi_old (:attr:`log_ratio`).
    notes : tuple of str
        What the loader said about the file, once each (a framework's dump that names no group,
        samples its loss leaves out, tokens its rejection cut); empty otherwise.
    """

    logp: np.ndarray
    old_logp: np.ndarray
    offsets: np.ndarray
    positions: np.ndarray
    ids: np.ndarray
    dropped: tuple[DroppedSequence, ...] = field(default=())
    rollout_logp: np.ndarray | None = None
    prompt_id: np.ndarray | None = None
    notes: tuple[str, ...] = ()

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_flat(
        cls,
        logp,
        old_logp,
        lengths,
        *,
        old_lengths=None,
        mask=None,
        mask_lengths=None,
        ids=None,
        on_bad: str = "raise",
        known: Mapping[int, str] | None = None,
        rollout_logp=None,
        rollout_lengths=None,
        prompt_id=None,
        copy: bool = True,
        first: int = 0,
        allow_empty: bool = False,
    ) -> TokenBatch:
        """Build from flat concatenated arrays and per-sequence lengths (the core constructor).

        Parameters
        ----------
        logp, old_logp : array_like of float, 1-D
            All sequences' token log-probs concatenated (new and old policy).
        lengths : array_like of int
            Number of tokens of each sequence in ``logp``.
        old_lengths, mask_lengths : array_like of int, optional
            Lengths of the sequences in ``old_logp`` and ``mask`` when they may differ from
            ``lengths`` (a mismatch is bad data); default ``lengths``.
        mask : array_like of {0, 1} or bool, 1-D, optional
            1 for a counted response token, 0 for a token to ignore (prompt, padding, tool
            output). Values at ignored tokens are not checked. Default: every token counts.
        ids : array_like, optional
            One id per sequence; default the index.
        on_bad : {"raise", "drop"}
            What to do with a bad sequence: raise ``ValueError`` naming it and its first
            problem, or leave it out and list it in :attr:`dropped`.
        known : mapping of int to str, optional
            Problems found upstream, by sequence index (a loader's missing or null fields;
            such sequences are passed with length 0); they take precedence.
        rollout_logp : array_like of float, 1-D, optional
            The inference engine's token log-probs (:attr:`rollout_logp`), checked like
            ``logp``; ``rollout_lengths`` where its lengths may differ (a mismatch is bad data).
        prompt_id : array_like, optional
            One prompt id (string or integer) per sequence: the groups (:attr:`prompt_id`).
        copy : bool
            False: where every token counts, keep the float64 arrays given (made read-only), no
            copies; for a caller whose arrays are its own (the Parquet loader).
        first, allow_empty : int, bool
            For a reader that builds a file's batch in pieces: the pieces' first sequence is the
            file's sequence ``first`` (the index problems are reported at), and a piece of bad
            sequences only gives None (``allow_empty``).

        Returns
        -------
        TokenBatch or None

        Raises
        ------
        ValueError
            Bad data with ``on_bad="raise"``; inconsistent array sizes; no sequence left; a
            ``prompt_id`` entry that is None, NaN, a float, a bool or a container (named).
        """
        on_bad = check_on_bad(on_bad)
        arrays = _checked_sizes(logp, old_logp, mask, lengths, old_lengths, mask_lengths)
        roll, roll_lens = _checked_rollout(rollout_logp, rollout_lengths, arrays[3])
        ids = _as_ids(ids, arrays[3].size)
        groups = None if prompt_id is None else as_prompt_ids(prompt_id, arrays[3].size)
        problems = _mismatches(*arrays[3:], roll_lens)
        logp, old_logp, mask, lengths, index = _without(problems, *arrays)
        if roll is not None:
            keep = np.ones(roll_lens.size, dtype=bool)
            keep[list(problems)] = False
            roll = _keep_segments(roll, roll_lens, keep)
        found = _problems(logp, old_logp, mask, lengths, roll)
        problems.update({int(index[k]): v for k, v in found.items()})
        problems.update(known or {})
        dropped = report_problems(problems, ids, on_bad, first)
        return cls._assemble(
            logp,
            old_logp,
            mask,
            lengths,
            ids[index],
            index,
            problems,
            dropped,
            rollout_logp=roll,
            prompt_id=None if groups is None else groups[index],
            copy=copy,
            allow_empty=allow_empty,
        )

    @classmethod
    def from_ragged(
        cls, logp, old_logp, mask=None, ids=None, *, on_bad: str = "raise", rollout_logp=None, prompt_id=None
    ) -> TokenBatch:
        """Build from lists of 1-D arrays, one per sequence (lengths may differ).

        Parameters
        ----------
        logp, old_logp : sequence of array_like of float
            Token log-probs of each sequence under the new and old policies.
        mask : sequence of array_like of {0, 1} or bool, optional
            Per sequence, 1 for a counted token; default every token counts.
        ids : array_like, optional
            One id per sequence; default the index.
        on_bad : {"raise", "drop"}
            See :meth:`from_flat`.
        rollout_logp : sequence of array_like of float, optional
            The inference engine's token log-probs of each sequence.
        prompt_id : array_like, optional
            One prompt id per sequence (:attr:`prompt_id`).

        Returns
        -------
        TokenBatch
        """
        n = len(logp)
        for name, seqs in (("old_logp", old_logp), ("mask", mask), ("rollout_logp", rollout_logp)):
            if seqs is not None and len(seqs) != n:
                raise ValueError(f"{name} has {len(seqs)} sequences, logp has {n}")
        parts = [_flatten(name, seqs) for name, seqs in (("logp", logp), ("old_logp", old_logp))]
        (flat, lens), (old_flat, old_lens) = parts
        optional = {}  # each given sequence list, flattened, with its own lengths
        if mask is not None:
            optional["mask"], optional["mask_lengths"] = _flatten("mask", mask, is_mask=True)
        if rollout_logp is not None:
            optional["rollout_logp"], optional["rollout_lengths"] = _flatten("rollout_logp", rollout_logp)
        return cls.from_flat(
            flat,
            old_flat,
            lens,
            old_lengths=old_lens,
            ids=ids,
            on_bad=on_bad,
            prompt_id=prompt_id,
            **optional,
        )

    @classmethod
    def from_padded(
        cls, logp, old_logp, mask=None, ids=None, *, on_bad: str = "raise", rollout_logp=None, prompt_id=None
    ) -> TokenBatch:
        """Build from padded 2-D arrays of shape ``(n, L)`` and a mask of the same shape.

        Parameters
        ----------
        logp, old_logp : array_like of float, shape ``(n, L)``
            Token log-probs under the new and old policies, one row per sequence.
        mask : array_like of {0, 1} or bool, shape ``(n, L)``, optional
            1 for a counted response token, 0 for padding, prompt or any other ignored token
            (holes inside a response are allowed). Values under a 0 are never checked.
            Default: every entry counts.
        ids : array_like, optional
            One id per row; default the row index.
        on_bad : {"raise", "drop"}
            See :meth:`from_flat`.
        rollout_logp : array_like of float, shape ``(n, L)``, optional
            The inference engine's token log-probs.
        prompt_id : array_like, optional
            One prompt id per row (:attr:`prompt_id`).

        Returns
        -------
        TokenBatch
        """
        logp, old_logp = _as_float("logp", logp), _as_float("old_logp", old_logp)
        if rollout_logp is not None:
            rollout_logp = _as_float("rollout_logp", rollout_logp)
            if rollout_logp.shape != logp.shape:
                raise ValueError(
                    f"rollout_logp must have the shape of logp {logp.shape}, got {rollout_logp.shape}"
                )
        if logp.ndim != 2 or logp.shape != old_logp.shape:
            raise ValueError(
                f"logp and old_logp must be 2-D of one shape, got {logp.shape} and {old_logp.shape}"
            )
        if mask is not None:
            mask = _as_mask(mask)
            if mask.shape != logp.shape:
                raise ValueError(f"mask must have the shape of logp {logp.shape}, got {mask.shape}")
        lengths = np.full(logp.shape[0], logp.shape[1], dtype=np.int64)
        roll = None if rollout_logp is None else rollout_logp.ravel()
        return cls.from_flat(
            logp.ravel(),
            old_logp.ravel(),
            lengths,
            mask=mask,
            ids=ids,
            on_bad=on_bad,
            rollout_logp=roll,
            prompt_id=prompt_id,
        )

    @classmethod
    def _assemble(
        cls, logp, old_logp, mask, lengths, ids, index, problems, dropped, rollout_logp=None, **options
    ) -> TokenBatch:
        """Keep the good sequences' tokens, positions (``options``: prompt_id, copy, allow_empty)."""
        prompt_id, copy = options.get("prompt_id"), options.get("copy", True)
        good = ~np.isin(index, np.fromiter(problems, dtype=np.int64, count=len(problems)))
        if not good.any() and not options.get("allow_empty"):
            raise ValueError(f"no valid sequence left ({len(dropped)} dropped)")
        counted = np.ones(logp.size, dtype=bool) if mask is None else mask == 1
        counted &= np.repeat(good, lengths)
        starts = segment_offsets(lengths)[:-1]
        positions = np.arange(logp.size, dtype=np.int64) - np.repeat(starts, lengths)
        if copy or not counted.all():  # else every token of every sequence: the arrays as given
            positions = positions[counted]
            logp, old_logp = logp[counted], old_logp[counted]
            rollout_logp = None if rollout_logp is None else rollout_logp[counted]
            lengths = np.bincount(_segment_of_tokens(lengths)[counted], minlength=lengths.size)[good]
        batch = cls(
            logp=np.ascontiguousarray(logp),
            old_logp=np.ascontiguousarray(old_logp),
            offsets=segment_offsets(lengths),
            positions=positions,
            ids=ids[good].copy(),
            dropped=dropped,
            rollout_logp=None if rollout_logp is None else np.ascontiguousarray(rollout_logp),
            prompt_id=None if prompt_id is None else prompt_id[good].copy(),
        )
        _readonly(*batch.arrays())
        return batch

    # -- views ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Return the number of sequences."""
        return self.offsets.size - 1

    @property
    def n_dropped(self) -> int:
        """Number of sequences left out by ``on_bad="drop"``."""
        return len(self.dropped)

    @property
    def lengths(self) -> np.ndarray:
        """Counted tokens per sequence, :math:`|y|`."""
        return np.diff(self.offsets)

    @property
    def n_tokens(self) -> int:
        """Total number of counted tokens."""
        return int(self.offsets[-1])

    @property
    def segment(self) -> np.ndarray:
        """Sequence index of every counted token."""
        return _segment_of_tokens(self.lengths)

    @property
    def log_ratio(self) -> np.ndarray:
        r"""Token log-ratios :math:`d_t = \log\pi_\theta(y_t) - \log\pi_{old}(y_t)`, flat."""
        return self.logp - self.old_logp

    @property
    def has_rollout(self) -> bool:
        """True when the batch carries the inference engine's log-probs (:attr:`rollout_logp`)."""
        return self.rollout_logp is not None

    @property
    def mismatch_log_ratio(self) -> np.ndarray:
        r"""Token log-ratios of the mismatch, :math:`\log\pi_{old}(y_t) - \log\mu_{rollout}(y_t)`.

        Raises
        ------
        ValueError
            When the batch has no ``rollout_logp``.
        """
        if self.rollout_logp is None:
            raise ValueError("the batch has no rollout_logp (the inference engine's log-probs)")
        return self.old_logp - self.rollout_logp

    @property
    def total_log_ratio(self) -> np.ndarray:
        r"""Token log-ratios :math:`\log\pi_\theta - \log\mu_{rollout}` = mismatch + update."""
        return self.mismatch_log_ratio + self.log_ratio

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Return the batch's arrays (``rollout_logp`` and ``prompt_id`` only where present)."""
        out = (self.logp, self.old_logp, self.offsets, self.positions, self.ids)
        out = out if self.rollout_logp is None else (*out, self.rollout_logp)
        return out if self.prompt_id is None else (*out, self.prompt_id)

    @property
    def has_groups(self) -> bool:
        """True when the batch carries :attr:`prompt_id` (the prompt of each sequence)."""
        return self.prompt_id is not None

    def n_identical(self) -> int:
        """Count sequences whose ``logp`` and ``old_logp`` repeat an earlier one's (identical responses)."""
        seen, count = set(), 0
        for i in range(len(self)):
            a, b = self.offsets[i], self.offsets[i + 1]
            key = (self.logp[a:b].tobytes(), self.old_logp[a:b].tobytes())
            count += key in seen
            seen.add(key)
        return count

    def group_index(self) -> np.ndarray:
        """Return the group of each sequence, 0 .. n_groups - 1 (without ``prompt_id``: one per sequence)."""
        return group_index(self.prompt_id, len(self))

    @property
    def ratio(self) -> np.ndarray:
        r"""Token ratios :math:`r_t = e^{d_t}`, flat (``inf`` beyond the float64 range)."""
        return exp_quiet(self.log_ratio)

    def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(logp, old_logp)`` of the counted tokens of sequence ``i``."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.logp[a:b], self.old_logp[a:b]

    def select(self, index) -> TokenBatch:
        """Return a new batch with the sequences ``index`` (integer indices or a boolean mask), in order."""
        index = np.arange(len(self))[np.asarray(index)]
        if index.size == 0:
            raise ValueError("select needs at least one sequence")
        lengths = self.lengths[index]
        starts = self.offsets[index]
        tok = np.arange(lengths.sum()) - np.repeat(segment_offsets(lengths)[:-1] - starts, lengths)
        batch = TokenBatch(
            self.logp[tok],
            self.old_logp[tok],
            segment_offsets(lengths),
            self.positions[tok],
            self.ids[index].copy(),
            self.dropped,
            None if self.rollout_logp is None else self.rollout_logp[tok],
            None if self.prompt_id is None else self.prompt_id[index].copy(),
            self.notes,
        )
        _readonly(*batch.arrays())
        return batch


def _as_lengths(name: str, lengths) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)) or np.any(arr < 0):
        raise ValueError(f"{name} must be a 1-D array of integers >= 0, got {lengths!r}")
    return arr.astype(np.int64)


def _flatten(name: str, seqs, *, is_mask: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-sequence 1-D arrays (a loop over sequences, not tokens)."""
    arrays = []
    for i, s in enumerate(seqs):
        a = _as_mask(s) if is_mask else _as_float(f"{name} of sequence {i}", s)
        if a.ndim != 1:
            raise ValueError(f"{name} of sequence {i} must be 1-D, got shape {a.shape}")
        arrays.append(a)
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return flat.astype(np.float64, copy=False), lengths


def _checked_sizes(logp, old_logp, mask, lengths, old_lengths, mask_lengths):
    """Arrays as float64 1-D and lengths as int64; ``ValueError`` if values and lengths disagree."""
    logp, old_logp = _as_float("logp", logp).ravel(), _as_float("old_logp", old_logp).ravel()
    mask = None if mask is None else _as_mask(mask).ravel()
    lengths = _as_lengths("lengths", lengths)
    old_lengths = lengths if old_lengths is None else _as_lengths("old_lengths", old_lengths)
    mask_lengths = None if mask is None else mask_lengths
    if mask is not None:
        mask_lengths = lengths if mask_lengths is None else _as_lengths("mask_lengths", mask_lengths)
    for name, arr, lens in (
        ("logp", logp, lengths),
        ("old_logp", old_logp, old_lengths),
        ("mask", mask, mask_lengths),
    ):
        if arr is not None and (lens.size != lengths.size or lens.sum() != arr.size):
            raise ValueError(f"{name}: {arr.size} values do not add up to the {name} lengths")
    return logp, old_logp, mask, lengths, old_lengths, mask_lengths


def _without(problems, logp, old_logp, mask, lengths, old_lengths, mask_lengths):
    """Leave out the sequences in ``problems`` (length mismatches): (logp, old_logp, mask, lengths, kept)."""
    keep = np.ones(lengths.size, dtype=bool)
    keep[list(problems)] = False
    return (
        _keep_segments(logp, lengths, keep),
        _keep_segments(old_logp, old_lengths, keep),
        _keep_segments(mask, mask_lengths, keep),
        lengths[keep],
        np.flatnonzero(keep),
    )


def _checked_rollout(rollout_logp, rollout_lengths, lengths):
    """``rollout_logp`` as float64 1-D and its lengths; ``ValueError`` if they disagree."""
    if rollout_logp is None:
        return None, None
    roll = _as_float("rollout_logp", rollout_logp).ravel()
    lens = lengths if rollout_lengths is None else _as_lengths("rollout_lengths", rollout_lengths)
    if lens.size != lengths.size or lens.sum() != roll.size:
        raise ValueError(f"rollout_logp: {roll.size} values do not add up to the rollout_logp lengths")
    return roll, lens


def build_batch(logp, old_logp, lengths, **options) -> TokenBatch:
    """:meth:`TokenBatch.from_flat` as a function: the loaders' entry point (they pass ``known``).

    See Also
    --------
    TokenBatch.from_flat : the arguments, ``known`` included.
    """
    return TokenBatch.from_flat(logp, old_logp, lengths, **options)
