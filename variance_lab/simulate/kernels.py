r"""Numba kernels: follow :math:`\log P_T` path by path and reduce it into accumulators.

Each path draws tokens one at a time from the chunk's ``np.random.Generator`` (the draw
code of every family is in :mod:`variance_lab.simulate.draws`) and keeps a running sum in
a register; at every T of the sorted grid it writes :math:`\log P_T` into its row of the
block buffer (one path serves the whole grid through its prefix sums), or, with
``independent=True``, draws a fresh path for every T. A full block of paths is reduced
into the accumulators at once (:mod:`variance_lab.simulate.block`). No chunk ever holds
an ``n x T`` matrix: memory is constant in ``n``.

Paths are processed in batches of four whose running sums live in registers, drawn
token-major (paths 0, 1, 2, 3, 0, 1, ... in stream order): four independent additions
per generator round keep the CPU busy while the generator works, which brings the
kernel to the speed of a bare draw-and-sum loop. The last ``n % 4`` paths of a chunk
go one by one, and so do all AR(1) and random-scale paths (their tokens are not independent). Which draw
feeds which path is fixed by the chunk alone (not by the T grid or the block size). The
lognormal batch draws are written out in the kernel itself: a call per grid point would
cost half a draw on a dense grid.

A chunk is drawn by one of two samplers, picked through :data:`SAMPLER_RUNNERS`: this
module's token sampler, or the exact aggregate draws of
:mod:`variance_lab.simulate.aggregate`. Both fill the chunk's
:class:`~variance_lab.simulate.block.BlockState` (one argument: the grid, references,
buffers and running sums) in place; :func:`run_chunk` wraps it into an
:class:`~variance_lab.simulate.accumulators.Accumulator`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from variance_lab.families.base import CODE_LOGNORMAL
from variance_lab.simulate._jit import kernel
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec
from variance_lab.simulate.aggregate import run_aggregate
from variance_lab.simulate.block import BlockState, new_state, reduce_block, reduce_columns, to_accumulator
from variance_lab.simulate.draws import (
    KNOWN_CODES,
    check_code,
    draw_log_r,
    draw_raw,
    draw_raw4,
    log_p,
    path_state,
)
from variance_lab.simulate.plan import ChunkTask, chunk_generator

__all__ = [
    "KNOWN_CODES",
    "SAMPLER_RUNNERS",
    "accumulate_log_p",
    "draw_log_p",
    "draw_log_r",
    "run_chunk",
    "run_token",
    "task_keep",
]


@kernel
def _token_kernel(code, par, independent, n_paths, rng, st):  # pragma: no cover - compiled
    r"""Simulate ``n_paths`` paths token by token and reduce them into the state ``st``.

    Paths go in batches of 4 (:func:`~variance_lab.simulate.draws.draw_raw4`), the last
    ``n_paths % 4`` one by one (AR(1), random-scale: all one by one); each path writes its
    :math:`\log P_T` at every T into its column of the block buffer ``st.X``, and a full block
    is reduced at once (:func:`variance_lab.simulate.block.reduce_columns`).
    """
    grid = st.grid
    X = st.X
    nT = grid.size
    B = X.shape[1]
    fill = 0
    n_batches = n_paths // 4 if not path_state(code) else 0
    for _ in range(n_batches):
        r0 = r1 = r2 = r3 = 0.0
        prev = 0
        for j in range(nT):
            t = grid[j]
            if independent:
                r0 = r1 = r2 = r3 = 0.0
                prev = 0
            if code == CODE_LOGNORMAL:  # inline: a call per grid point would cost half a draw on dense grids
                for _ in range(t - prev):
                    r0 += rng.standard_normal()
                    r1 += rng.standard_normal()
                    r2 += rng.standard_normal()
                    r3 += rng.standard_normal()
            else:
                d0, d1, d2, d3 = draw_raw4(code, par, rng, t - prev)
                r0 += d0
                r1 += d1
                r2 += d2
                r3 += d3
            prev = t
            X[j, fill] = log_p(code, par, t, r0)
            X[j, fill + 1] = log_p(code, par, t, r1)
            X[j, fill + 2] = log_p(code, par, t, r2)
            X[j, fill + 3] = log_p(code, par, t, r3)
        fill += 4
        if fill == B:
            reduce_columns(B, st)
            fill = 0
    for _ in range(n_paths - 4 * n_batches):
        raw = 0.0
        prev = 0
        e = np.nan
        for j in range(nT):
            t = grid[j]
            if independent:
                raw, e = draw_raw(code, par, rng, t, np.nan)
            else:
                d, e = draw_raw(code, par, rng, t - prev, e)
                raw += d
                prev = t
            X[j, fill] = log_p(code, par, t, raw)
        fill += 1
        if fill == B:
            reduce_columns(B, st)
            fill = 0
    reduce_columns(fill, st)


@kernel
def _values_kernel(log_p_values, st):  # pragma: no cover - compiled
    r"""Accumulate given values ``log_p_values[i, j]`` of :math:`\log P_{T_j}`, a block of rows at a time."""
    B = st.X.shape[1]
    n = log_p_values.shape[0]
    for start in range(0, n, B):
        b = min(B, n - start)
        reduce_block(log_p_values[start : start + b], b, st)


def run_token(code: int, params, independent: bool, n_paths: int, rng: np.random.Generator, st: BlockState):
    """Fill the chunk state ``st`` with ``n_paths`` paths drawn token by token (every family).

    Parameters are those of :func:`variance_lab.simulate.aggregate.run_aggregate`.
    """
    _token_kernel(check_code(code), params, bool(independent), int(n_paths), rng, st)


#: Sampler name -> runner ``(code, params, independent, n_paths, rng, state) -> None``
#: that fills a chunk's :class:`~variance_lab.simulate.block.BlockState` in place.
SAMPLER_RUNNERS: dict[str, Callable[..., None]] = {"token": run_token, "aggregate": run_aggregate}


def _runner(sampler) -> Callable[..., None]:
    try:
        return SAMPLER_RUNNERS[sampler]
    except (KeyError, TypeError):
        raise ValueError(f"unknown sampler {sampler!r}; choose from {', '.join(SAMPLER_RUNNERS)}") from None


def task_keep(task: ChunkTask) -> int:
    """Tail values the chunk keeps per T: ``task.tail_keep``, at most ``min(spec.tail, n_paths)``."""
    full = max(1, min(task.spec.tail, task.n_paths))
    return full if task.tail_keep is None else max(1, min(full, int(task.tail_keep)))


def run_chunk(task: ChunkTask) -> Accumulator:
    """Simulate one chunk: a pure function of the task (sampler, spec, seed, chunk index, size).

    The chunk draws from ``chunk_generator(task.seed, task.index)`` only, so the same
    task gives the same bits on any worker, thread or machine; this is the unit of work
    of every executor (threads, Dask). ``task.sampler`` picks the runner in
    :data:`SAMPLER_RUNNERS`: token-level draws or the exact aggregate draws of
    :mod:`variance_lab.simulate.aggregate`.

    Parameters
    ----------
    task : ChunkTask

    Returns
    -------
    Accumulator
        Its tail holds ``task_keep(task)`` values per T; when that is fewer than
        ``min(spec.tail, n_paths)``, ``tail_floor`` records the smallest kept.
    """
    spec = task.spec
    keep = task_keep(task)
    run = _runner(task.sampler)
    code = check_code(task.code)
    st = new_state(spec, keep)
    run(code, task.params, task.independent, task.n_paths, chunk_generator(task.seed, task.index), st)
    complete = keep >= min(spec.tail, task.n_paths)
    return to_accumulator(spec, task.n_paths, st, complete=complete)


def draw_log_p(code: int, params, T, rng: np.random.Generator, n: int, *, sampler="token", independent=False):
    r"""Draw :math:`\log P_T` as the chunk kernels draw it, returned as an ``(n, nT)`` matrix.

    ``n`` paths from the stream ``rng`` exactly as a chunk of ``n`` paths draws them with
    ``sampler`` (``"token"`` or ``"aggregate"``), in path order: what
    :func:`run_chunk` reduces into its accumulator. For tests, histograms and small ``n``
    (it holds the matrix the engine never holds).

    Parameters
    ----------
    code : int
        Sampler code, :meth:`variance_lab.families.Family.sampler_params`.
    params : array_like
        Sampler parameters.
    T : array_like of int
        Sorted T grid.
    rng : numpy.random.Generator
        The stream; advanced in place.
    n : int
        Paths.
    sampler : {"token", "aggregate"}
    independent : bool

    Returns
    -------
    ndarray, shape (n, nT)

    Raises
    ------
    ValueError
        For an unknown code or sampler, or the aggregate sampler of a family without one.
    """
    run = _runner(sampler)
    code = check_code(code)
    grid = np.ascontiguousarray(T, dtype=np.int64)
    par = np.ascontiguousarray(params, dtype=np.float64)
    spec = AccumulatorSpec(
        T=grid, log_ref=np.full((2, grid.size), -np.inf), ref_logP=np.zeros(grid.size), tail=1
    )
    st = new_state(spec, 1)
    B = st.X.shape[1]  # a multiple of 4: a run of B paths continues the stream as one long run would
    out = np.empty((int(n), grid.size))
    for start in range(0, int(n), B):
        b = min(B, int(n) - start)
        run(code, par, independent, b, rng, st)
        out[start : start + b] = st.X[:, :b].T
    return out


def accumulate_log_p(log_p, spec: AccumulatorSpec) -> Accumulator:
    r"""Accumulate given values of :math:`\log P_T` (rows: paths, columns: ``spec.T``).

    The same reduction the simulation kernels use, for values from elsewhere (token
    log-probs of a training run, or a test's reference draws).

    Parameters
    ----------
    log_p : array_like, shape (n, nT)
    spec : AccumulatorSpec

    Returns
    -------
    Accumulator

    Raises
    ------
    ValueError
        For values of the wrong shape.
    """
    arr = np.ascontiguousarray(log_p, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != spec.T.size:
        raise ValueError(f"log_p must have shape (n, {spec.T.size}), got {arr.shape!r}")
    if arr.shape[0] == 0:
        return spec.empty()
    st = new_state(spec, max(1, min(spec.tail, arr.shape[0])))
    _values_kernel(arr, st)
    return to_accumulator(spec, arr.shape[0], st, complete=True)
