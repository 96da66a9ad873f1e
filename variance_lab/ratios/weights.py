r"""Token and sequence weights that need no batch type: exact segment sums, prefix sums and clip bands.

:func:`segment_sums` sums token log-ratios per sequence to about one unit in the last place
(:math:`\log P_T = \sum_t d_t`, and :math:`\log s = \log P_T / T`); :func:`segment_cumsums`
gives each token's prefix sum within its sequence (:math:`\log P_t = \sum_{s \le t} d_s`, the
log of CTPO's cumulative ratio) and its position :math:`t`; :func:`log_clip_range`
validates a ratio band and gives its logs.
:mod:`variance_lab.rollouts.weights` builds the per-sequence weights of a
:class:`~variance_lab.rollouts.batch.TokenBatch` on these.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["log_clip_range", "segment_cumsums", "segment_split_scale", "segment_sums"]


def segment_sums(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    r"""Return the sums of ``x`` over the segments ``[offsets[i], offsets[i+1])``, accurate to about 1 ulp.

    Each value is split exactly as :math:`x = h + l`, with :math:`h` a multiple of
    :math:`2^g` and :math:`|l| \le 2^{g-1}`, where :math:`2^g` is chosen from
    :math:`\max|x|` and the longest segment so that every partial sum of the :math:`h` is an
    integer multiple of :math:`2^g` below :math:`2^{53+g}`: those sums are exact in any order.
    The small remainders (each below :math:`2^{g-1}`) are summed by NumPy in whatever order
    it takes, with an error of at most :math:`n^2 \varepsilon\, 2^{g-1}` for a segment of
    :math:`n` values (:math:`\varepsilon^2`-order of :math:`\max|x|` times :math:`n^2` and the
    longest segment), and the result :math:`\sum h + \sum l` is rounded once.
    Vectorised: two ``np.add.reduceat`` calls, no loop over tokens.

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
    scale = segment_split_scale(m, int(lengths.max()))
    hi = np.rint(x * scale) / scale  # exact: scaling by a power of two, rounding to an integer
    lo = x - hi  # exact: |lo| <= 2**(g-1) and lo is a multiple of ulp(x)
    starts = offsets[:-1]
    return np.add.reduceat(hi, starts) + np.add.reduceat(lo, starts)


def segment_split_scale(max_abs: float, longest: int) -> float:
    r"""Return :math:`2^{-g}`, the scale of :func:`segment_sums`' exact split, for values up to ``max_abs``.

    :math:`g = \max(e_m + \lceil\log_2(L + 1)\rceil - 52, -1000)` with :math:`\max|x| < 2^{e_m}` and
    :math:`L` the longest segment: every partial sum of the high parts is then a multiple of
    :math:`2^g` below :math:`2^{53 + g}`, exact in any order. A sum computed in pieces (the
    streaming pass of :mod:`variance_lab.rollouts.summaries`) takes the scale of the whole set.

    Parameters
    ----------
    max_abs : float
        :math:`\max|x|` over the set, finite and > 0.
    longest : int
        The longest segment's number of values.

    Returns
    -------
    float
    """
    _, e_m = math.frexp(max_abs)  # max_abs < 2**e_m
    e = e_m + int(longest).bit_length()  # every partial sum of |x| is < 2**e
    return math.ldexp(1.0, -max(e - 52, -1000))


#: Most cells (sequences x longest length) :func:`segment_cumsums` pads at once.
_PAD_CELLS = 1 << 22


def segment_cumsums(x: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Return each value's prefix sum within its segment, and its 1-based position there.

    Segment ``i`` is ``x[offsets[i]:offsets[i+1]]``; its prefix sums are those of
    ``np.cumsum`` on the segment alone (the rounding of a per-sequence cumsum, as the Monte
    Carlo's ``np.cumsum(Y, axis=1)``), not a difference of one running sum over all segments,
    which would carry the rounding of every earlier segment. Segments are padded into rows of
    at most about 4 million cells at a time, so memory stays bounded.

    Parameters
    ----------
    x : ndarray of float64
        All segments concatenated.
    offsets : ndarray of int
        ``n + 1`` rising offsets from 0 to ``len(x)``, every segment non-empty.

    Returns
    -------
    (prefix, position) : tuple of ndarray
        ``prefix[k]`` :math:`= \sum_{j \le k} x_j` over the segment of ``k``;
        ``position[k]`` its place in the segment, from 1.
    """
    x = np.asarray(x, dtype=np.float64)
    off = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(off)
    if off.size < 2 or off[0] != 0 or off[-1] != x.size or np.any(lengths < 1):
        raise ValueError("segment_cumsums needs non-empty segments that cover x")
    position = np.arange(x.size, dtype=np.int64) - np.repeat(off[:-1], lengths) + 1
    prefix = np.empty_like(x)
    start = 0
    n = lengths.size
    while start < n:
        width, stop = int(lengths[start]), start + 1
        while stop < n and (stop - start + 1) * max(width, int(lengths[stop])) <= _PAD_CELLS:
            width, stop = max(width, int(lengths[stop])), stop + 1
        block = np.zeros((stop - start, width))
        mask = np.arange(width) < lengths[start:stop, None]
        block[mask] = x[off[start] : off[stop]]
        prefix[off[start] : off[stop]] = np.cumsum(block, axis=1)[mask]
        start = stop
    return prefix, position


def log_clip_range(rng, name: str) -> tuple[float, float]:
    """Validate a ratio clipping range (lo, hi), 0 < lo <= 1 <= hi < inf, and return its logs."""
    try:
        lo, hi = (float(v) for v in rng)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lo, hi) of ratios, got {rng!r}") from None
    if not (0.0 < lo <= 1.0 <= hi < math.inf):
        raise ValueError(f"{name} must satisfy 0 < lo <= 1 <= hi < inf, got {rng!r}")
    return math.log(lo), math.log(hi)
