r"""Token and sequence weights that need no batch type: exact segment sums and clip bands.

:func:`segment_sums` sums token log-ratios per sequence to about one unit in the last place
(:math:`\log P_T = \sum_t d_t`, and :math:`\log s = \log P_T / T`); :func:`log_clip_range`
validates a ratio band and gives its logs.
:mod:`variance_lab.rollouts.weights` builds the per-sequence weights of a
:class:`~variance_lab.rollouts.batch.TokenBatch` on these.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["log_clip_range", "segment_sums"]


def segment_sums(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    r"""Return the sums of ``x`` over the segments ``[offsets[i], offsets[i+1])``, accurate to about 1 ulp.

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


def log_clip_range(rng, name: str) -> tuple[float, float]:
    """Validate a ratio clipping range (lo, hi), 0 < lo <= 1 <= hi < inf, and return its logs."""
    try:
        lo, hi = (float(v) for v in rng)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (lo, hi) of ratios, got {rng!r}") from None
    if not (0.0 < lo <= 1.0 <= hi < math.inf):
        raise ValueError(f"{name} must satisfy 0 < lo <= 1 <= hi < inf, got {rng!r}")
    return math.log(lo), math.log(hi)
