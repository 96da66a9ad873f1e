r"""Pooled lag sums of a token series within sequences, by FFT: the core of the autocorrelation.

:func:`lag_sums` gives :math:`\sum_t x_t x_{t+k}` over all pairs of counted tokens :math:`k`
positions apart in the same sequence, and the number of such pairs, for :math:`k = 0..K`
(:func:`~variance_lab.rollouts.statistics.autocorrelation`'s numbers). Sequences, sorted by span,
go in groups of at most :data:`FFT_BUDGET` cells into zero-padded rows of width at least span +
:math:`K` (so circular correlation is linear there); the power spectra of the rows are summed and
transformed back. The groups, and so every rounding, are fixed by the spans alone. Kernels lay the
rows out straight from the series and add the rows' power spectra, one row after another as
NumPy's ``sum(axis=0)`` does: the same numbers, without the index arrays and squared copies a
group of 2^21 cells took (100 MB).
"""

from __future__ import annotations

import numpy as np
from scipy import fft

from variance_lab.simulate._jit import kernel

__all__ = ["FFT_BUDGET", "lag_sums"]

#: Cells (doubles) of one FFT group (16 MiB).
FFT_BUDGET = 1 << 21


@kernel
def _fill_rows(x, offsets, seqs, positions, grid):  # pragma: no cover - compiled
    """Row r of ``grid`` holds sequence ``seqs[r]``'s values at their positions (none given: 0, 1, ...)."""
    for r in range(seqs.size):
        a, b = offsets[seqs[r]], offsets[seqs[r] + 1]
        for t in range(a, b):
            p = t - a if positions.size == 0 else positions[t]
            grid[r, p] = x[t] if x.size else 1.0


@kernel
def _power_sum(spec, out):  # pragma: no cover - compiled
    """``out[k]`` = the rows' sum of ``|spec[r, k]|^2``, row after row (``(re**2 + im**2).sum(axis=0)``)."""
    for k in range(spec.shape[1]):
        v = spec[0, k]
        out[k] = v.real * v.real + v.imag * v.imag
    for r in range(1, spec.shape[0]):
        for k in range(spec.shape[1]):
            v = spec[r, k]
            out[k] += v.real * v.real + v.imag * v.imag


def lag_sums(x: np.ndarray, positions: np.ndarray | None, offsets: np.ndarray, max_lag: int, spans=None):
    r"""Return the pooled :math:`\sum x_t x_{t+k}` and pair counts for k = 0..max_lag, within sequences.

    The pair counts come from the transform of the indicator of counted tokens, which makes a
    mask's holes gaps; without holes (``positions`` None: each sequence's tokens one after another)
    they are :math:`\sum_i \max(T_i - k, 0)`, the integers that transform rounds to.

    Parameters
    ----------
    x : ndarray of float64
        The series, sequences one after another.
    positions : ndarray of int64 or None
        Each token's place in its sequence.
    offsets : ndarray of int64
        Sequence boundaries in ``x``.
    max_lag : int
    spans : ndarray of int64, optional
        Each sequence's span (last position + 1); default from ``positions``.

    Returns
    -------
    (ndarray of float64, ndarray of int64)
    """
    if spans is None:
        spans = positions[offsets[1:] - 1] + 1
    order = np.argsort(spans, kind="stable")
    sums, counts = np.zeros(max_lag + 1), np.zeros(max_lag + 1)
    if positions is None:  # sum_i max(T_i - k, 0) = (sum of the spans above k) - k (their number)
        hist = np.bincount(spans)
        k = np.arange(max_lag + 1)
        above = spans.size - np.cumsum(hist)[np.minimum(k, hist.size - 1)]
        above_sum = int(spans.sum()) - np.cumsum(hist * np.arange(hist.size))[np.minimum(k, hist.size - 1)]
        counts = (above_sum - k * above).astype(np.float64)
    no_positions = np.zeros(0, dtype=np.int64) if positions is None else positions
    start, n = 0, spans.size
    while start < n:
        width = fft.next_fast_len(int(spans[order[start]]) + max_lag, real=True)
        stop = min(n, start + max(1, FFT_BUDGET // width))
        width = fft.next_fast_len(int(spans[order[stop - 1]]) + max_lag, real=True)
        while stop - start > 1 and (stop - start) * width > FFT_BUDGET:
            stop = start + max(1, (stop - start) // 2)
            width = fft.next_fast_len(int(spans[order[stop - 1]]) + max_lag, real=True)
        seqs = order[start:stop]
        for values, acc in ((x, sums), (np.zeros(0), counts))[: 1 if positions is None else 2]:
            grid = np.zeros((stop - start, width))
            _fill_rows(values, offsets, seqs, no_positions, grid)
            spec = fft.rfft(grid, axis=1)
            del grid
            power = np.empty(spec.shape[1])
            _power_sum(spec, power)
            del spec
            acc += fft.irfft(power, n=width)[: max_lag + 1]
        start = stop
    return sums, np.rint(counts).astype(np.int64)
