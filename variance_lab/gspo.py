r"""Sequence weights from token log-probs: the product P, GSPO's geometric mean and its identities.

For one response :math:`y` of :math:`|y| = T` counted tokens with log-probabilities
:math:`\ell_t = \log\pi_\theta(y_t)` (new policy) and :math:`\ell^{old}_t` (old policy), the
token log-ratios are :math:`d_t = \ell_t - \ell^{old}_t` and

.. math::

    \log P = \sum_t d_t, \qquad
    s = G = P^{1/T} = \exp\Bigl(\tfrac{1}{T}\sum_t d_t\Bigr), \qquad
    \log\mathrm{PPL} = H = -\tfrac{1}{T}\sum_t \ell_t ,

so that (seed ``004``) GSPO's weight is the inverse perplexity ratio and the exponential
change in per-token cross-entropy:

.. math::

    s = \frac{\mathrm{PPL}_{old}}{\mathrm{PPL}_{new}} = e^{\Delta H}, \qquad
    \Delta H = H_{old} - H_{new} = \tfrac{1}{T}\sum_t (\ell_t - \ell^{old}_t) = \log G .

Numerics. Every quantity is formed in log space from per-sequence sums computed by an
error-free split (:func:`segment_sums`): each value is cut into a high part on a grid coarse
enough that its sums are exact in float64 and an exact low remainder, so a sum is within about
one unit in the last place of the exact one for any length (tested against ``math.fsum`` at
:math:`T = 10^5` with :math:`|d_t| = 50`, i.e. :math:`|\log P| = 5\cdot 10^6`). The numerator
:math:`\sum_t (\ell_t - \ell^{old}_t)` is summed over the interleaved values
:math:`(\ell_1, -\ell^{old}_1, \ell_2, \dots)`, so the difference of the two cross-entropies
carries no cancellation error. :math:`P` itself is never exponentiated; linear perplexities
beyond the float64 range come back as ``inf`` (their ``log_`` twins stay finite), never NaN and
never with a warning.

Batches of sequences of different lengths are held as a :class:`TokenBatch`: the counted
tokens of all sequences concatenated into flat float64 arrays plus ``offsets``, built from
padded 2-D arrays with a mask (:meth:`TokenBatch.from_padded`), from lists of ragged 1-D arrays
(:meth:`TokenBatch.from_ragged`) or from flat arrays with lengths (:meth:`TokenBatch.from_flat`).
Bad data (NaN, :math:`\pm\infty`, a log-probability :math:`> 0`, length mismatch, a sequence with
no counted token, a mask value other than 0/1) raises ``ValueError`` naming the sequence, or is
dropped with ``on_bad="drop"`` and reported in :attr:`TokenBatch.dropped`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "GSPO_RANGE",
    "PPO_RANGE",
    "GMPO_RANGE",
    "ON_BAD",
    "DroppedSequence",
    "TokenBatch",
    "SequenceWeights",
    "segment_sums",
    "sequence_weights",
    "gspo_token_weights",
]

#: GSPO's sequence-level clipping range of s (Zheng et al. 2025): 1 - 3e-4, 1 + 4e-4.
GSPO_RANGE = (1.0 - 3e-4, 1.0 + 4e-4)
#: PPO/GRPO token-level clipping range of the ratio, epsilon = 0.2.
PPO_RANGE = (0.8, 1.2)
#: GMPO's token-level clipping range of the ratio, (e^-0.4, e^0.4) (Zhao et al. 2025, sec. 4).
GMPO_RANGE = (math.exp(-0.4), math.exp(0.4))
#: Allowed values of the ``on_bad`` option.
ON_BAD = ("raise", "drop")


class DroppedSequence(NamedTuple):
    """A sequence left out of a batch by ``on_bad="drop"``: its input index, id and the problem."""

    index: int
    id: object
    reason: str


# --------------------------------------------------------------------------------------
# summation
# --------------------------------------------------------------------------------------
def segment_sums(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    r"""Sums of ``x`` over the segments ``[offsets[i], offsets[i+1])``, accurate to about 1 ulp.

    Each value is split exactly as :math:`x = h + l`, with :math:`h` a multiple of
    :math:`2^g` and :math:`|l| \le 2^{g-1}`, where :math:`2^g` is chosen from
    :math:`\max|x|` and the longest segment so that every partial sum of the :math:`h` is an
    integer multiple of :math:`2^g` below :math:`2^{53+g}`: those sums are exact in any order.
    The small remainders are summed by NumPy (pairwise), their error is below
    :math:`\varepsilon^2`-order of :math:`\max|x|`, and the result :math:`\sum h + \sum l`
    is rounded once. Vectorised: two ``np.add.reduceat`` calls, no loop over tokens.

    Parameters
    ----------
    x : ndarray of float64
        Finite values, all segments concatenated.
    offsets : ndarray of int
        ``n + 1`` non-decreasing offsets into ``x``, ``offsets[0] == 0``,
        ``offsets[-1] == len(x)``; every segment must be non-empty.

    Returns
    -------
    ndarray of float64, shape ``(n,)``
    """
    x = np.asarray(x, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    if n <= 0:
        return np.zeros(0)
    lengths = np.diff(offsets)
    if np.any(lengths < 1) or offsets[0] != 0 or offsets[-1] != x.size:
        raise ValueError("segment_sums needs non-empty segments that cover x")
    m = float(np.max(np.abs(x)))
    if m == 0.0:
        return np.zeros(n)
    if not math.isfinite(m):
        raise ValueError("segment_sums needs finite values")
    _, e_m = math.frexp(m)  # m < 2**e_m
    e = e_m + int(lengths.max()).bit_length()  # every partial sum of |x| is < 2**e
    g = max(e - 52, -1000)
    scale = math.ldexp(1.0, -g)
    hi = np.rint(x * scale) / scale  # exact: scaling by a power of two, rounding to an integer
    lo = x - hi  # exact: |lo| <= 2**(g-1) and lo is a multiple of ulp(x)
    starts = offsets[:-1]
    return np.add.reduceat(hi, starts) + np.add.reduceat(lo, starts)


def _exp(x):
    """exp that returns inf/0 beyond the float64 range instead of warning."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x)


def _log_range(rng, name: str) -> tuple[float, float]:
    """Validate a ratio clipping range (lo, hi), 0 < lo <= 1 <= hi < inf, and return its logs."""
    try:
        lo, hi = (float(v) for v in rng)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lo, hi) of ratios, got {rng!r}") from None
    if not (0.0 < lo <= 1.0 <= hi < math.inf):
        raise ValueError(f"{name} must satisfy 0 < lo <= 1 <= hi < inf, got {rng!r}")
    return math.log(lo), math.log(hi)


# --------------------------------------------------------------------------------------
# validation of raw input: vectorised per-token flags, reported per sequence
# --------------------------------------------------------------------------------------
def _check_on_bad(on_bad: str) -> str:
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    return on_bad


def _offsets(lengths: np.ndarray) -> np.ndarray:
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
    """The elements of flat ``x`` that belong to the kept segments."""
    if x is None:
        return None
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
    """Counted tokens whose log-prob is NaN, +-inf or > 0 (NaN compares False, hence ~(<= 0))."""
    with np.errstate(invalid="ignore"):
        ok = (x <= 0.0) & (x > -np.inf)
    return counted & ~ok


def _problems(logp, old_logp, mask, lengths) -> dict[int, str]:
    """Per-sequence problems of same-length flat arrays: {sequence index: first problem}."""
    seg = _segment_of_tokens(lengths)
    starts = _offsets(lengths)[:-1]
    found: dict[int, str] = {}
    # lowest priority first: a later, more basic problem overwrites an earlier one
    counted = np.ones(logp.size, dtype=bool) if mask is None else mask == 1
    for name, x, policy in (("old_logp", old_logp, "old"), ("logp", logp, "new")):
        segs, pos = _first_per_segment(_bad_tokens(x, counted), seg, starts)
        for s, p in zip(segs.tolist(), pos.tolist(), strict=True):
            found[s] = _describe_value(name, p, float(x[starts[s] + p]), policy)
    n_counted = np.bincount(seg[counted], minlength=lengths.size)
    for s in np.flatnonzero(n_counted == 0).tolist():
        found[s] = "empty sequence" if lengths[s] == 0 else "no counted token (mask is all 0)"
    if mask is not None:
        segs, pos = _first_per_segment((mask != 0) & (mask != 1), seg, starts)
        for s, p in zip(segs.tolist(), pos.tolist(), strict=True):
            found[s] = f"mask[{p}] = {float(mask[starts[s] + p])!r} is not 0 or 1"
    return found


def _mismatches(lengths, old_lengths, mask_lengths) -> dict[int, str]:
    bad = lengths != old_lengths
    if mask_lengths is not None:
        bad |= lengths != mask_lengths
    found = {}
    for i in np.flatnonzero(bad).tolist():
        msg = f"length mismatch: logp has {lengths[i]} values, old_logp has {old_lengths[i]}"
        if mask_lengths is not None and mask_lengths[i] != lengths[i]:
            msg += f", mask has {mask_lengths[i]}"
        found[i] = msg
    return found


def _report(problems: dict[int, str], ids: np.ndarray, on_bad: str) -> tuple[DroppedSequence, ...]:
    """Raise for the first bad sequence, or list them all for dropping."""
    if not problems:
        return ()
    order = sorted(problems)
    if on_bad == "raise":
        i = order[0]
        more = f"; {len(order) - 1} more bad sequence(s)" if len(order) > 1 else ""
        raise ValueError(
            f"bad sequence id={_py(ids[i])!r} (index {i}): {problems[i]}{more}; "
            "pass on_bad='drop' to skip bad sequences"
        )
    return tuple(DroppedSequence(i, _py(ids[i]), problems[i]) for i in order)


def _py(x):
    """A NumPy scalar as the plain Python value (for messages and records)."""
    return x.item() if isinstance(x, np.generic) else x


def _as_ids(ids, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.int64)
    out = np.asarray(ids)
    if out.ndim != 1 or out.size != n:
        raise ValueError(f"ids must be a 1-D sequence of {n} ids, got shape {out.shape}")
    return out


def _as_float(name: str, x) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must hold numbers: {exc}") from None


def _as_mask(x) -> np.ndarray:
    """A mask as float64, so that values other than 0/1 can be reported rather than coerced."""
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
    loaders of :mod:`variance_lab.gspo_io`); they validate the data. Arrays are read-only.

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
    """

    logp: np.ndarray
    old_logp: np.ndarray
    offsets: np.ndarray
    positions: np.ndarray
    ids: np.ndarray
    dropped: tuple[DroppedSequence, ...] = field(default=())

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

        Returns
        -------
        TokenBatch

        Raises
        ------
        ValueError
            Bad data with ``on_bad="raise"``; inconsistent array sizes; no sequence left.
        """
        return _build_batch(
            logp,
            old_logp,
            lengths,
            old_lengths=old_lengths,
            mask=mask,
            mask_lengths=mask_lengths,
            ids=ids,
            on_bad=on_bad,
        )

    @classmethod
    def from_ragged(cls, logp, old_logp, mask=None, ids=None, *, on_bad: str = "raise") -> TokenBatch:
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

        Returns
        -------
        TokenBatch
        """
        n = len(logp)
        for name, seqs in (("old_logp", old_logp), ("mask", mask)):
            if seqs is not None and len(seqs) != n:
                raise ValueError(f"{name} has {len(seqs)} sequences, logp has {n}")
        parts = [_flatten(name, seqs) for name, seqs in (("logp", logp), ("old_logp", old_logp))]
        (flat, lens), (old_flat, old_lens) = parts
        mask_flat, mask_lens = (None, None) if mask is None else _flatten("mask", mask, is_mask=True)
        return cls.from_flat(
            flat,
            old_flat,
            lens,
            old_lengths=old_lens,
            mask=mask_flat,
            mask_lengths=mask_lens,
            ids=ids,
            on_bad=on_bad,
        )

    @classmethod
    def from_padded(cls, logp, old_logp, mask=None, ids=None, *, on_bad: str = "raise") -> TokenBatch:
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

        Returns
        -------
        TokenBatch
        """
        logp, old_logp = _as_float("logp", logp), _as_float("old_logp", old_logp)
        if logp.ndim != 2 or logp.shape != old_logp.shape:
            raise ValueError(
                f"logp and old_logp must be 2-D of one shape, got {logp.shape} and {old_logp.shape}"
            )
        if mask is not None:
            mask = _as_mask(mask)
            if mask.shape != logp.shape:
                raise ValueError(f"mask must have the shape of logp {logp.shape}, got {mask.shape}")
        lengths = np.full(logp.shape[0], logp.shape[1], dtype=np.int64)
        return cls.from_flat(logp.ravel(), old_logp.ravel(), lengths, mask=mask, ids=ids, on_bad=on_bad)

    @classmethod
    def _assemble(cls, logp, old_logp, mask, lengths, ids, index, problems, dropped) -> TokenBatch:
        """Keep the good sequences' counted tokens; record token positions."""
        good = ~np.isin(index, np.fromiter(problems, dtype=np.int64, count=len(problems)))
        if not good.any():
            raise ValueError(f"no valid sequence left ({len(dropped)} dropped)")
        counted = np.ones(logp.size, dtype=bool) if mask is None else mask == 1
        counted &= np.repeat(good, lengths)
        starts = _offsets(lengths)[:-1]
        positions = (np.arange(logp.size, dtype=np.int64) - np.repeat(starts, lengths))[counted]
        new_lengths = np.bincount(_segment_of_tokens(lengths)[counted], minlength=lengths.size)[good]
        batch = cls(
            logp=np.ascontiguousarray(logp[counted]),
            old_logp=np.ascontiguousarray(old_logp[counted]),
            offsets=_offsets(new_lengths),
            positions=positions,
            ids=ids[good].copy(),
            dropped=dropped,
        )
        _readonly(batch.logp, batch.old_logp, batch.offsets, batch.positions, batch.ids)
        return batch

    # -- views ----------------------------------------------------------------------------
    def __len__(self) -> int:
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
    def ratio(self) -> np.ndarray:
        r"""Token ratios :math:`r_t = e^{d_t}`, flat (``inf`` beyond the float64 range)."""
        return _exp(self.log_ratio)

    def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(logp, old_logp)`` of the counted tokens of sequence ``i``."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.logp[a:b], self.old_logp[a:b]

    def select(self, index) -> TokenBatch:
        """A new batch with the sequences ``index`` (integer indices or a boolean mask), in order."""
        index = np.arange(len(self))[np.asarray(index)]
        if index.size == 0:
            raise ValueError("select needs at least one sequence")
        lengths = self.lengths[index]
        starts = self.offsets[index]
        tok = np.arange(lengths.sum()) - np.repeat(_offsets(lengths)[:-1] - starts, lengths)
        batch = TokenBatch(
            self.logp[tok],
            self.old_logp[tok],
            _offsets(lengths),
            self.positions[tok],
            self.ids[index].copy(),
            self.dropped,
        )
        _readonly(batch.logp, batch.old_logp, batch.offsets, batch.positions, batch.ids)
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
    if mask is None:
        mask_lengths = None
    else:
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
    """Leave out the sequences in ``problems`` (length mismatches): one common layout remains.

    Returns (logp, old_logp, mask, lengths, index of the kept sequences).
    """
    keep = np.ones(lengths.size, dtype=bool)
    keep[list(problems)] = False
    return (
        _keep_segments(logp, lengths, keep),
        _keep_segments(old_logp, old_lengths, keep),
        _keep_segments(mask, mask_lengths, keep),
        lengths[keep],
        np.flatnonzero(keep),
    )


def _build_batch(
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
) -> TokenBatch:
    """:meth:`TokenBatch.from_flat`, plus ``known``: problems found upstream (a loader's missing or
    null fields), by sequence index; such sequences are passed with length 0 and take precedence."""
    on_bad = _check_on_bad(on_bad)
    arrays = _checked_sizes(logp, old_logp, mask, lengths, old_lengths, mask_lengths)
    ids = _as_ids(ids, arrays[3].size)
    problems = _mismatches(*arrays[3:])
    logp, old_logp, mask, lengths, index = _without(problems, *arrays)
    found = _problems(logp, old_logp, mask, lengths)
    problems.update({int(index[k]): v for k, v in found.items()})
    problems.update(known or {})
    dropped = _report(problems, ids, on_bad)
    return TokenBatch._assemble(logp, old_logp, mask, lengths, ids[index], index, problems, dropped)


# --------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SequenceWeights:
    r"""Per-sequence weights and perplexities of a :class:`TokenBatch`, all in log space.

    Linear values are properties (``inf`` or ``0.0`` beyond float64, never a warning).
    :meth:`to_frame` gives one row per sequence.

    Attributes
    ----------
    ids, length : ndarray
        Sequence id and number of counted tokens :math:`T = |y|`.
    log_P : ndarray
        :math:`\log P = \sum_t d_t`, exact to about 1 ulp for any length.
    log_G : ndarray
        :math:`\log s = \log G = \tfrac1T \sum_t d_t = \Delta H` (the mean token log-ratio).
    log_ppl_old, log_ppl_new : ndarray
        :math:`\log\mathrm{PPL} = H = -\tfrac1T\sum_t \ell_t`, the per-token cross-entropy.
    log_gmpo : ndarray
        :math:`\tfrac1T \sum_t \operatorname{clip}(d_t, \log a, \log b)` for GMPO's range
        :math:`(a, b)`: the log of GMPO's weight.
    clipped_gspo : ndarray of bool
        :math:`s` outside GSPO's range (sequence-level clipping would act, for one sign of
        the advantage or the other).
    n_token_clipped : ndarray of int
        Tokens whose ratio lies outside the PPO range.
    gspo_range, ppo_range, gmpo_range : tuple of float
        The clipping ranges used, as ratios ``(lo, hi)``.
    """

    ids: np.ndarray
    length: np.ndarray
    log_P: np.ndarray
    log_G: np.ndarray
    log_ppl_old: np.ndarray
    log_ppl_new: np.ndarray
    log_gmpo: np.ndarray
    clipped_gspo: np.ndarray
    n_token_clipped: np.ndarray
    gspo_range: tuple[float, float]
    ppo_range: tuple[float, float]
    gmpo_range: tuple[float, float]

    @property
    def s(self) -> np.ndarray:
        r"""GSPO's weight :math:`s = G = P^{1/|y|}`."""
        return _exp(self.log_G)

    @property
    def delta_H(self) -> np.ndarray:
        r""":math:`\Delta H = H_{old} - H_{new}`, so that :math:`s = e^{\Delta H}`."""
        return self.log_G

    @property
    def log10_P(self) -> np.ndarray:
        """:math:`\\log_{10} P`."""
        return self.log_P / math.log(10.0)

    @property
    def ppl_old(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{old} = e^{H_{old}}`."""
        return _exp(self.log_ppl_old)

    @property
    def ppl_new(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{new} = e^{H_{new}}`."""
        return _exp(self.log_ppl_new)

    @property
    def ppl_ratio(self) -> np.ndarray:
        r""":math:`\mathrm{PPL}_{old}/\mathrm{PPL}_{new}`, as :math:`e^{\Delta H}` with
        :math:`\Delta H` from the interleaved sum: finite even where both perplexities overflow."""
        return _exp(self.log_G)

    @property
    def gmpo_weight(self) -> np.ndarray:
        """GMPO's weight: the geometric mean of the log-space-clipped token ratios."""
        return _exp(self.log_gmpo)

    @property
    def token_clip_frac(self) -> np.ndarray:
        """Per sequence, the fraction of tokens outside the PPO range."""
        return self.n_token_clipped / self.length

    @property
    def gspo_clip_frac(self) -> float:
        """Batch fraction of sequences whose s is outside GSPO's range."""
        return float(np.mean(self.clipped_gspo))

    @property
    def ppo_clip_frac(self) -> float:
        """Batch fraction of tokens outside the PPO range (token mean, as trainers log it)."""
        return float(self.n_token_clipped.sum() / self.length.sum())

    def to_frame(self) -> pd.DataFrame:
        """One row per sequence: id, length, log and linear weights, perplexities, clipping."""
        return pd.DataFrame(
            {
                "id": self.ids,
                "length": self.length,
                "log_P": self.log_P,
                "log10_P": self.log10_P,
                "log_G": self.log_G,
                "s": self.s,
                "log_ppl_old": self.log_ppl_old,
                "log_ppl_new": self.log_ppl_new,
                "ppl_old": self.ppl_old,
                "ppl_new": self.ppl_new,
                "ppl_ratio": self.ppl_ratio,
                "delta_H": self.delta_H,
                "log_gmpo": self.log_gmpo,
                "gmpo_weight": self.gmpo_weight,
                "clipped_gspo": self.clipped_gspo,
                "token_clip_frac": self.token_clip_frac,
            }
        )


def _interleave(a: np.ndarray, b: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_1, b_1, a_2, b_2, ...) with doubled offsets: sum(a - b) without a rounded difference."""
    out = np.empty(2 * a.size)
    out[0::2] = a
    out[1::2] = b
    return out, 2 * offsets


def sequence_weights(
    batch: TokenBatch, *, gspo_range=GSPO_RANGE, ppo_range=PPO_RANGE, gmpo_range=GMPO_RANGE
) -> SequenceWeights:
    r"""GSPO, GMPO and product weights, perplexities and clipping of every sequence in a batch.

    With :math:`d_t = \ell_t - \ell^{old}_t` over the :math:`T` counted tokens:

    .. math::

        \log P = \textstyle\sum_t d_t, \quad
        s = e^{\log P / T} = \mathrm{PPL}_{old}/\mathrm{PPL}_{new} = e^{\Delta H}, \quad
        w_{GMPO} = \exp\Bigl(\tfrac1T\textstyle\sum_t \operatorname{clip}(d_t, \log a, \log b)\Bigr).

    GMPO's clipping is shown two-sided and advantage-free (GMPO's trainer keeps only the side
    that the advantage's sign selects). GSPO clips :math:`s` at sequence level; PPO clips each
    token ratio. All sums use :func:`segment_sums`.

    Parameters
    ----------
    batch : TokenBatch
        Validated token log-probs.
    gspo_range : tuple of float
        GSPO's range of :math:`s`, default :data:`GSPO_RANGE` ``(1 - 3e-4, 1 + 4e-4)``.
    ppo_range : tuple of float
        Token-level PPO range of :math:`r_t`, default :data:`PPO_RANGE` ``(0.8, 1.2)``.
    gmpo_range : tuple of float
        GMPO's token range of :math:`r_t`, default :data:`GMPO_RANGE` ``(e^-0.4, e^0.4)``.

    Returns
    -------
    SequenceWeights
    """
    g_lo, g_hi = _log_range(gspo_range, "gspo_range")
    p_lo, p_hi = _log_range(ppo_range, "ppo_range")
    m_lo, m_hi = _log_range(gmpo_range, "gmpo_range")
    off, T = batch.offsets, batch.lengths
    log_P = segment_sums(*_interleave(batch.logp, -batch.old_logp, off))
    log_G = log_P / T
    d = batch.log_ratio
    log_gmpo = segment_sums(np.clip(d, m_lo, m_hi), off) / T
    token_out = (d < p_lo) | (d > p_hi)
    return SequenceWeights(
        ids=batch.ids,
        length=T,
        log_P=log_P,
        log_G=log_G,
        log_ppl_old=-segment_sums(batch.old_logp, off) / T,
        log_ppl_new=-segment_sums(batch.logp, off) / T,
        log_gmpo=log_gmpo,
        clipped_gspo=(log_G < g_lo) | (log_G > g_hi),
        n_token_clipped=np.add.reduceat(token_out.astype(np.int64), off[:-1]),
        gspo_range=tuple(float(v) for v in gspo_range),
        ppo_range=tuple(float(v) for v in ppo_range),
        gmpo_range=tuple(float(v) for v in gmpo_range),
    )


def gspo_token_weights(batch: TokenBatch) -> np.ndarray:
    r"""GSPO-token weights, one per counted token, flat.

    GSPO-token uses, for token :math:`t` of sequence :math:`y`,

    .. math::

        s_t = \operatorname{sg}[s]\,\frac{\pi_\theta(y_t)}{\operatorname{sg}[\pi_\theta(y_t)]},

    with :math:`\operatorname{sg}` the stop-gradient. Its *value* is exactly :math:`s` for
    every token of the sequence (the fraction is 1); only its gradient differs,
    :math:`\nabla s_t = s\,\nabla\log\pi_\theta(y_t)`, which lets a per-token advantage enter.
    So the weights here are :math:`s` repeated over each sequence's tokens.

    Parameters
    ----------
    batch : TokenBatch

    Returns
    -------
    ndarray of float64, shape ``(batch.n_tokens,)``
    """
    return np.repeat(sequence_weights(batch).s, batch.lengths)
