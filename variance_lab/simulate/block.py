r"""Block reduction: many paths' :math:`\log P_T` reduced into the accumulators in bulk.

The kernels do not hand each value of :math:`\log P_T` to the accumulators one at a
time (two scalar exponentials, a dozen power-sum updates and a tail comparison per
value cost two to four times the draw itself). Each path writes its values at every T of
the grid into its column of a fill buffer ``X`` of shape ``(nT, B)``, and
:func:`reduce_columns` reduces a full block of ``B`` paths row by row, each row ``X[j]``
(the block's values at ``T = grid[j]``) contiguous, in passes that vectorise
(:func:`reduce_block` takes values from elsewhere, path by row, and transposes them
into ``X`` first):

1. the power sums of :math:`\log P_T - T\mu_y` and the row's maximum and minimum
   (:func:`_lanes_log`);
2. where the maximum :math:`y_{\max}` exceeds the shift :math:`h` of :math:`P_T` (or
   :math:`y_{\max}/T` that of :math:`G_T`), the sums are rescaled once,
   :math:`S_k \mapsto e^{k(h - y_{\max})} S_k`, and :math:`h` moves up
   (:func:`_shift_up`);
3. the deviations of :math:`P_T` and :math:`G_T` (:math:`\log G_T` computed as
   :math:`\log P_T \cdot (1/T)`) with the vectorised exponential of
   :mod:`variance_lab.simulate._vexp`, and their power sums, in one pass
   (:func:`_lanes_exp`); the clamp of the exponential's argument is skipped when the
   row's range shows it cannot bite;
4. the tail sample, only when the row's maximum exceeds its threshold (below).

Every power sum is accumulated in :data:`LANES` interleaved partial sums (lane
``i mod 16`` of the row), an elementwise loop that LLVM vectorises without reordering any
addition; the lanes are folded by a fixed pairwise tree and added to the running sums.
The order of every floating-point operation depends on the block size and the grid
alone, never on the worker, the CPU or its vector width, so the results stay
bit-identical for any number of workers. The block size (:func:`block_size`) is a
function of the number of grid points only: about :data:`BLOCK_VALUES` values per block.

**Tail sample.** Each row keeps the largest ``keep`` values in a buffer of
``cap = keep + max(keep, 64)``: a value enters only if it exceeds the row's threshold
(a branch-free append); a full buffer is cut back to its ``keep`` largest by an in-place
quickselect (:func:`_compact`, linear time), and the threshold becomes the smallest
value kept (every later value at or below it cannot be among the ``keep`` largest). At
the end the ``keep`` largest of every row are selected and sorted, descending, by NumPy
(:func:`finish_tails`). ``keep`` is the chunk's share of the tail
(:func:`variance_lab.simulate.plan.chunk_tail_keep`), about a hundred values, so the
threshold rises fast and the tail costs about one comparison per value.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from variance_lab.simulate._jit import kernel
from variance_lab.simulate._vexp import W_MAX, W_MIN, exp_minus, exp_minus_clamped
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec

__all__ = ["BLOCK_VALUES", "MAX_BLOCK", "BlockState", "block_size", "new_state"]
__all__ += ["reduce_block", "reduce_columns", "to_accumulator"]  # the reduction

#: Values of log P per block (all paths and T together): 2**17 float64 = 1 MiB per buffer.
BLOCK_VALUES = 1 << 17
#: Largest block (paths); a multiple of LANES (and so of the token kernel's batch of 4).
MAX_BLOCK = 1024
#: Slack of the tail buffer beyond ``keep`` (at least this many values per compaction).
TAIL_SLACK = 64
#: Interleaved partial sums per power sum (a multiple of the SIMD width).
LANES = 16


def block_size(n_grid: int) -> int:
    """Paths per block for ``n_grid`` grid points, at most :data:`MAX_BLOCK`.

    A multiple of :data:`LANES` where about :data:`BLOCK_VALUES` values allow it, else
    (grids of more than 8192 points) a multiple of 4, at least 4: the buffers stay near
    :data:`BLOCK_VALUES` values whatever the grid.
    """
    b = BLOCK_VALUES // max(1, int(n_grid))
    b = b // LANES * LANES if b >= LANES else b // 4 * 4
    return int(min(MAX_BLOCK, max(4, b)))


@kernel
def _acc_log(lanes, l, v, offset):  # pragma: no cover - compiled
    """Lane ``l`` takes ``v``: powers of ``v - offset`` into rows 0..3, maximum row 8, minimum row 9."""
    d = v - offset
    d2 = d * d
    lanes[0, l] += d
    lanes[1, l] += d2
    lanes[2, l] += d2 * d
    lanes[3, l] += d2 * d2
    lanes[8, l] = v if v > lanes[8, l] else lanes[8, l]
    lanes[9, l] = v if v < lanes[9, l] else lanes[9, l]


@kernel
def _acc_exp(lanes, l, d, g):  # pragma: no cover - compiled
    """Lane ``l`` takes the deviations ``d`` (P, rows 0..3) and ``g`` (G, rows 4..7): their powers 1..4."""
    d2 = d * d
    g2 = g * g
    lanes[0, l] += d
    lanes[1, l] += d2
    lanes[2, l] += d2 * d
    lanes[3, l] += d2 * d2
    lanes[4, l] += g
    lanes[5, l] += g2
    lanes[6, l] += g2 * g
    lanes[7, l] += g2 * g2


@kernel
def _lanes_log(X, j, b, offset, lanes):  # pragma: no cover - compiled
    r"""Lane sums of :math:`(x_i - \text{offset})^k`, :math:`k = 1..4`, lane maxima, minima of ``X[j, :b]``.

    ``lanes[k-1, l]`` (``lanes[8, l]``, ``lanes[9, l]``: maximum, minimum) over the values
    ``i`` of lane ``l``: ``i = i0 + l`` for each full group ``i0`` of :data:`LANES`, then the
    last ``b mod LANES`` values as lanes ``0, 1, ...``. An elementwise loop over the lanes:
    vectorised. (The helpers index the full arrays: an array view in a hot loop costs two
    atomic reference-count updates.)
    """
    for l in range(LANES):
        lanes[0, l] = 0.0
        lanes[1, l] = 0.0
        lanes[2, l] = 0.0
        lanes[3, l] = 0.0
        lanes[8, l] = -np.inf
        lanes[9, l] = np.inf
    m = b - b % LANES
    for i0 in range(0, m, LANES):
        for l in range(LANES):
            _acc_log(lanes, l, X[j, i0 + l], offset)
    for i in range(m, b):
        _acc_log(lanes, i - m, X[j, i], offset)


@kernel
def _lanes_exp(X, j, b, inv, op, mp, sp, og, mg, sg, clamp, lanes):  # pragma: no cover - compiled
    r"""Lane sums of :math:`d_i^k` (``lanes[0..3]``) and :math:`g_i^k` (``lanes[4..7]``), row ``X[j, :b]``.

    :math:`d_i = s_p (e^{x_i - o_p} - m_p)` (:math:`P_T`) and
    :math:`g_i = s_g (e^{x_i \cdot \text{inv} - o_g} - m_g)` (:math:`G_T`,
    :math:`\text{inv} = 1/T`), lanes as in :func:`_lanes_log`; the exponentials
    (:func:`~variance_lab.simulate._vexp.exp_minus`, clamped only when ``clamp``: the caller
    knows the block's range) are inlined, so the loop vectorises whole, both quantities in
    one pass over the row.
    """
    for l in range(LANES):
        for k in range(8):
            lanes[k, l] = 0.0
    m = b - b % LANES
    if clamp:
        for i0 in range(0, m, LANES):
            for l in range(LANES):
                x = X[j, i0 + l]
                _acc_exp(
                    lanes, l, sp * exp_minus_clamped(x - op, mp), sg * exp_minus_clamped(x * inv - og, mg)
                )
    else:
        for i0 in range(0, m, LANES):
            for l in range(LANES):
                x = X[j, i0 + l]
                _acc_exp(lanes, l, sp * exp_minus(x - op, mp), sg * exp_minus(x * inv - og, mg))
    for i in range(m, b):
        x = X[j, i]
        _acc_exp(lanes, i - m, sp * exp_minus_clamped(x - op, mp), sg * exp_minus_clamped(x * inv - og, mg))


@kernel
def _add_lanes(lanes, r, sums, q, j):  # pragma: no cover - compiled
    """``sums[q, j, k] +=`` the 16 lanes ``lanes[r + k, :]`` summed as a fixed pairwise tree."""
    for k in range(4):
        a = r + k
        s0 = (lanes[a, 0] + lanes[a, 1]) + (lanes[a, 2] + lanes[a, 3])
        s1 = (lanes[a, 4] + lanes[a, 5]) + (lanes[a, 6] + lanes[a, 7])
        s2 = (lanes[a, 8] + lanes[a, 9]) + (lanes[a, 10] + lanes[a, 11])
        s3 = (lanes[a, 12] + lanes[a, 13]) + (lanes[a, 14] + lanes[a, 15])
        sums[q, j, k] += (s0 + s1) + (s2 + s3)


@kernel
def _shift_up(q, j, ymax, log_ref, shift, cref, sums):  # pragma: no cover - compiled
    r"""Move the shift of quantity ``q`` at T index ``j`` up to ``ymax`` if that is larger.

    The power sums are rescaled by :math:`f^k`, :math:`f = e^{h - y_{\max}}`. Returns the
    deviation's ``(offset, minus, scale)`` for :func:`_lanes_exp`:
    :math:`d = e^{y - h}` (``(h, 0, 1)``) without a reference, else
    :math:`d = c\,\operatorname{expm1}(y - \rho)` (``(rho, 1, c)``), and whether the vector
    path applies (``False`` only when :math:`y - \rho` may exceed
    :data:`~variance_lab.simulate._vexp.W_MAX`).
    """
    h = shift[q, j]
    if ymax > h:
        f = np.exp(h - ymax)
        f2 = f * f
        sums[q, j, 0] *= f
        sums[q, j, 1] *= f2
        sums[q, j, 2] *= f2 * f
        sums[q, j, 3] *= f2 * f2
        h = ymax
        shift[q, j] = h
        cref[q, j] = np.exp(log_ref[q, j] - h)
    r = log_ref[q, j]
    if r == -np.inf:
        return h, 0.0, 1.0, True
    return r, 1.0, cref[q, j], ymax - r <= W_MAX


@kernel
def _exp_libm(q, j, X, b, inv, log_ref, cref, sums, lanes):  # pragma: no cover - foreign data only
    """Centred deviations with libm's ``expm1``, for values beyond e^709 times the reference."""
    d = np.empty((1, b))
    for i in range(b):
        d[0, i] = cref[q, j] * np.expm1(X[j, i] * inv - log_ref[q, j])
    _lanes_log(d, 0, b, 0.0, lanes)
    _add_lanes(lanes, 0, sums, q, j)


@kernel
def _compact(tbuf, j, n, keep):  # pragma: no cover - compiled
    """Move the ``keep`` largest of ``tbuf[j, :n]`` to ``tbuf[j, :keep]`` (any order); return the least kept.

    In-place quickselect (Hoare partition, median-of-three pivot) for descending order:
    linear expected time, no allocation, deterministic.
    """
    lo = 0
    hi = n - 1
    k = keep - 1  # the position of the keep-th largest once rearranged
    while lo < hi:
        mid = (lo + hi) // 2
        a, b, c = tbuf[j, lo], tbuf[j, mid], tbuf[j, hi]
        if a < b:
            a, b = b, a
        if b < c:
            b, c = c, b
            if a < b:
                a, b = b, a
        pivot = b  # median of three
        i = lo
        m = hi
        while i <= m:
            while tbuf[j, i] > pivot:
                i += 1
            while tbuf[j, m] < pivot:
                m -= 1
            if i <= m:
                tmp = tbuf[j, i]
                tbuf[j, i] = tbuf[j, m]
                tbuf[j, m] = tmp
                i += 1
                m -= 1
        if k <= m:
            hi = m
        elif k >= i:
            lo = i
        else:
            break
    smallest = tbuf[j, 0]
    for q in range(1, keep):
        v = tbuf[j, q]
        smallest = v if v < smallest else smallest
    return smallest


@kernel
def _tail_part(j, X, b, keep, tbuf, tlen, thr):  # pragma: no cover - compiled
    """Offer row ``X[j, :b]`` to the tail buffer of T index ``j``."""
    t = thr[j]
    n = tlen[j]
    cap = tbuf.shape[1]
    for i in range(b):  # branch-free append: every value is written, the count moves only for a keeper
        v = X[j, i]
        tbuf[j, n] = v
        n += 1 if v > t else 0
        if n == cap:
            t = _compact(tbuf, j, n, keep)
            n = keep
    tlen[j] = n
    thr[j] = t


@kernel
def reduce_block(P, b, st):  # pragma: no cover - compiled
    """Reduce the first ``b`` rows of ``P`` (``(B, nT)``: row ``i``, path ``i``) into the state ``st``.

    ``P`` is transposed into ``st.X`` (``(nT, B)``) first, so that each T's values are
    contiguous (:func:`reduce_columns`).
    """
    X = st.X
    for j in range(X.shape[0]):
        for i in range(b):
            X[j, i] = P[i, j]
    reduce_columns(b, st)


@kernel
def reduce_columns(b, st):  # pragma: no cover - compiled
    """Reduce the first ``b`` columns of the fill buffer ``st.X`` (column ``i``: path ``i``) into ``st``."""
    if b == 0:
        return
    grid, X, lanes, sums = st.grid, st.X, st.lanes, st.sums
    log_ref, shift, cref = st.log_ref, st.shift, st.cref
    nT = grid.size
    for j in range(nT):
        inv = 1.0 / grid[j]  # log G_T = log P_T * (1/T), as the spec's reference of a degenerate G
        _lanes_log(X, j, b, st.ref_logp[j], lanes)
        _add_lanes(lanes, 0, sums, 2, j)
        ymax = lanes[8, 0]
        ymin = lanes[9, 0]
        for l in range(1, LANES):
            ymax = lanes[8, l] if lanes[8, l] > ymax else ymax
            ymin = lanes[9, l] if lanes[9, l] < ymin else ymin
        op, mp, sp, okp = _shift_up(0, j, ymax, log_ref, shift, cref, sums)
        og, mg, sg, okg = _shift_up(1, j, ymax * inv, log_ref, shift, cref, sums)
        clamp = not (
            ymin - op >= W_MIN
            and ymax - op <= W_MAX
            and ymin * inv - og >= W_MIN
            and ymax * inv - og <= W_MAX
        )
        _lanes_exp(X, j, b, inv, op, mp, sp, og, mg, sg, clamp, lanes)
        if okp:
            _add_lanes(lanes, 0, sums, 0, j)
        else:  # pragma: no cover - foreign data only
            _exp_libm(0, j, X, b, 1.0, log_ref, cref, sums, lanes)
        if okg:
            _add_lanes(lanes, 4, sums, 1, j)
        else:  # pragma: no cover - foreign data only
            _exp_libm(1, j, X, b, inv, log_ref, cref, sums, lanes)
        if ymax > st.thr[j]:
            _tail_part(j, X, b, st.keep, st.tbuf, st.tlen, st.thr)


def finish_tails(tbuf, tlen, keep: int, out) -> None:
    r"""``out[j]``: the ``keep`` largest values of each row's buffer, descending.

    By NumPy, all rows at once: the unused end of each row is set to :math:`-\infty`
    (a row that holds fewer than ``keep`` values, which only values of :math:`-\infty`
    can cause, is completed by them), ``np.partition`` moves the ``keep`` largest of every
    row to its end, and they are sorted. The kept values, and so ``out``, are the same
    whichever algorithm selects and sorts them; no kernel to compile on a first run.
    """
    cap = tbuf.shape[1]
    tbuf[np.arange(cap)[None, :] >= np.asarray(tlen)[:, None]] = -np.inf
    top = np.partition(tbuf, cap - keep, axis=1)[:, cap - keep :]
    out[:] = np.sort(top, axis=1)[:, ::-1]


class BlockState(NamedTuple):
    r"""The arrays a kernel fills for one chunk, passed to the kernels as one argument.

    A NamedTuple of arrays (and one int): numba passes it to a compiled function as one
    typed value, and its fields are read like attributes. The grid and the references
    come from the run's :class:`~variance_lab.simulate.accumulators.AccumulatorSpec`
    (read only); the rest is the chunk's own (see :func:`new_state`).

    Attributes
    ----------
    grid : ndarray of int64, shape (nT,)
        Sorted T grid.
    log_ref : ndarray, shape (2, nT)
        References :math:`\rho` of :math:`P_T`, :math:`G_T` (``-inf``: none).
    ref_logp : ndarray, shape (nT,)
        Centre of :math:`\log P_T`.
    X : ndarray, shape (nT, B)
        Fill buffer: column ``i`` holds path ``i``'s :math:`\log P_T` at every T of the grid.
    shift, cref : ndarray, shape (2, nT)
        Shift :math:`h` and :math:`e^{\rho - h}` of :math:`P_T`, :math:`G_T`.
    sums : ndarray, shape (3, nT, 4)
        Power sums.
    tbuf : ndarray, shape (nT, cap)
        Tail buffers; ``tlen`` values used per row, threshold ``thr``.
    tlen : ndarray of int64, shape (nT,)
    thr : ndarray, shape (nT,)
    keep : int
        Tail values kept per row.
    lanes : ndarray, shape (10, LANES)
        Scratch: lane partial sums, maxima and minima of one row.
    """

    grid: np.ndarray
    log_ref: np.ndarray
    ref_logp: np.ndarray
    X: np.ndarray
    shift: np.ndarray
    cref: np.ndarray
    sums: np.ndarray
    tbuf: np.ndarray
    tlen: np.ndarray
    thr: np.ndarray
    keep: int
    lanes: np.ndarray


def new_state(spec: AccumulatorSpec, keep: int) -> BlockState:
    """Fresh state for one chunk whose tail keeps ``keep`` values per T (``keep >= 1``)."""
    nT = spec.T.size
    B = block_size(nT)
    keep = int(keep)
    cap = keep + max(keep, TAIL_SLACK)
    return BlockState(
        grid=np.ascontiguousarray(spec.T, dtype=np.int64),
        log_ref=np.ascontiguousarray(spec.log_ref, dtype=np.float64),
        ref_logp=np.ascontiguousarray(spec.ref_logP, dtype=np.float64),
        X=np.empty((nT, B)),
        shift=spec.log_ref.copy(),
        cref=np.where(np.isneginf(spec.log_ref), 0.0, 1.0),
        sums=np.zeros((3, nT, 4)),
        tbuf=np.empty((nT, cap)),
        tlen=np.zeros(nT, dtype=np.int64),
        thr=np.full(nT, -np.inf),
        keep=keep,
        lanes=np.empty((10, LANES)),
    )


def to_accumulator(spec: AccumulatorSpec, n_paths: int, st: BlockState, *, complete: bool) -> Accumulator:
    """Return the chunk's accumulator from its filled state.

    ``complete=False`` marks a tail cut to fewer than ``min(spec.tail, n_paths)`` values:
    its floor (the smallest value kept per T) goes into ``tail_floor``.
    """
    keep = min(st.keep, n_paths)
    tail = np.empty((spec.T.size, keep))
    finish_tails(st.tbuf, st.tlen, keep, tail)
    floor = None if complete else tail[:, -1].copy()
    return Accumulator(spec=spec, count=n_paths, shift=st.shift, sums=st.sums, tail=tail, tail_floor=floor)
