r"""Numba kernels: draw :math:`\log r` by family code, follow :math:`\log P_T`, update accumulators.

Each path draws tokens one at a time from the chunk's ``np.random.Generator`` and
keeps a running sum in a register; at every T of the sorted grid it writes
:math:`\log P_T` into its row of the block buffer (one path serves the whole grid through
its prefix sums), or, with ``independent=True``, draws a fresh path for every T. A full
block of paths is reduced into the accumulators at once
(:mod:`variance_lab.simulate.block`). No chunk ever holds an ``n x T`` matrix: memory is
constant in ``n``.

Paths are processed in batches of four whose running sums live in registers, drawn
token-major (paths 0, 1, 2, 3, 0, 1, ... in stream order): four independent additions
per generator round keep the CPU busy while the generator works, which brings the
kernel to the speed of a bare draw-and-sum loop. The last ``n % 4`` paths of a chunk
go one by one. Which draw feeds which path is fixed by the chunk alone (not by the T
grid or the block size). The lognormal draws are written out in the kernel itself: a
call per grid point would cost half a draw on a dense grid.

This module is the token sampler; :mod:`variance_lab.simulate.aggregate` draws
:math:`\log P_T` at the grid points directly where its law is exact.

The running sum is kept in each family's cheapest exact form, and turned into
:math:`\log P_t` only at the grid points:

============  ====================================  =====================================
code          summed per token                      :math:`\log P_t`
============  ====================================  =====================================
0 degenerate  nothing                               :math:`t \log\mu`
1 lognormal   :math:`Z \sim N(0, 1)`                :math:`t m + s \sum Z`
2 gamma       :math:`\log \Gamma_k`, :math:`\Gamma_k \sim \mathrm{Gamma}(k, 1)`
                                                    :math:`t \log\theta + \sum \log\Gamma_k`
3 two-point   :math:`1\{U < q\}`                    :math:`c \log a + (t - c)\log b`
4 ar1         :math:`e_t = \rho e_{t-1} + s\sqrt{1-\rho^2} Z_t`,
              :math:`e_1 = s Z_1` (stationary)        :math:`t m + \sum e`
============  ====================================  =====================================

The AR(1) family is the one whose tokens are not independent: each path carries its
last deviation :math:`e` from token to token (and across the T grid); its paths go one
by one, not in batches.

For a small gamma shape :math:`k < 1`, :math:`\Gamma_k` itself underflows to 0 (its
log to :math:`-\infty`) with non-negligible probability, so the kernel draws its log as
:math:`\log\Gamma_{k+1} + \log(U)/k` with :math:`U \in (0, 1]` (Marsaglia and Tsang's
boost), which is always finite.

The public drivers (:func:`run_chunk`, :func:`accumulate_log_p`) allocate the state
(:func:`variance_lab.simulate.block.new_state`), call a private kernel that fills it in
place, and wrap it into an :class:`~variance_lab.simulate.accumulators.Accumulator`.
"""

from __future__ import annotations

import numpy as np

from variance_lab.simulate._jit import kernel
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec
from variance_lab.simulate.block import new_state, reduce_block, to_accumulator
from variance_lab.simulate.plan import ChunkTask, chunk_generator

__all__ = ["KNOWN_CODES", "accumulate_log_p", "draw_log_p", "draw_log_r", "run_chunk", "task_keep"]

#: Sampler codes the kernels draw from (:meth:`variance_lab.families.Family.sampler_params`).
KNOWN_CODES = frozenset({0, 1, 2, 3, 4})


# --------------------------------------------------------------------------------------
# drawing
# --------------------------------------------------------------------------------------
@kernel
def _draw_raw(code, par, rng, m, e):  # pragma: no cover - compiled
    """Sum of ``m`` per-token draws in the family's raw form (see the module table).

    ``e`` is the AR(1) state, the deviation of the path's last token (NaN at the start of
    a path; ignored by the i.i.d. families). Returns ``(sum, state after the m tokens)``.
    """
    acc = 0.0
    if code == 1:
        for _ in range(m):
            acc += rng.standard_normal()
    elif code == 2:
        k = par[0]
        if k >= 1.0:
            for _ in range(m):
                acc += np.log(rng.standard_gamma(k))
        else:
            k1 = k + 1.0
            inv_k = 1.0 / k
            for _ in range(m):
                acc += np.log(rng.standard_gamma(k1)) + np.log1p(-rng.random()) * inv_k
    elif code == 3:
        q = par[0]
        for _ in range(m):
            if rng.random() < q:
                acc += 1.0
    elif code == 4 and m > 0:
        s, rho = par[1], par[2]
        c = s * np.sqrt(1.0 - rho * rho)
        first = 0
        if np.isnan(e):  # a path's first token: the stationary marginal N(0, s^2)
            e = s * rng.standard_normal()
            acc += e
            first = 1
        for _ in range(first, m):
            e = rho * e + c * rng.standard_normal()
            acc += e
    return acc, e


@kernel
def _log_p(code, par, t, raw):  # pragma: no cover - compiled
    r""":math:`\log P_t` from the raw running sum after ``t`` tokens."""
    if code == 0:
        return t * par[0]
    if code == 1:
        return t * par[0] + par[1] * raw
    if code == 2:
        return t * par[1] + raw
    if code == 3:
        return raw * par[1] + (t - raw) * par[2]
    return t * par[0] + raw


@kernel
def _token4(code, par, rng):  # pragma: no cover - compiled
    """One raw token draw for each of 4 paths, in path order (i.i.d. families only)."""
    if code == 1:
        return rng.standard_normal(), rng.standard_normal(), rng.standard_normal(), rng.standard_normal()
    return (
        _draw_raw(code, par, rng, 1, np.nan)[0],
        _draw_raw(code, par, rng, 1, np.nan)[0],
        _draw_raw(code, par, rng, 1, np.nan)[0],
        _draw_raw(code, par, rng, 1, np.nan)[0],
    )


@kernel
def _draw_raw4(code, par, rng, m):  # pragma: no cover - compiled
    """Raw sums of ``m`` tokens for a batch of 4 paths, token-major (4 running sums in registers).

    Interleaving four independent running sums lets the CPU overlap their additions with
    the generator's work; the draws go to paths 0, 1, 2, 3, 0, 1, ... in stream order.
    """
    a0 = a1 = a2 = a3 = 0.0
    if code == 1:
        for _ in range(m):
            a0 += rng.standard_normal()
            a1 += rng.standard_normal()
            a2 += rng.standard_normal()
            a3 += rng.standard_normal()
    elif code != 0:
        for _ in range(m):
            d0, d1, d2, d3 = _token4(code, par, rng)
            a0 += d0
            a1 += d1
            a2 += d2
            a3 += d3
    return a0, a1, a2, a3


@kernel
def _draw_log_r_kernel(code, par, rng, out):  # pragma: no cover - compiled
    e = np.nan
    for i in range(out.size):
        raw, e = _draw_raw(code, par, rng, 1, e)
        out[i] = _log_p(code, par, 1, raw)


def draw_log_r(code: int, params: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    r"""``size`` consecutive tokens' :math:`\log r` of one sequence from the family ``(code, params)``.

    i.i.d. draws for every family but AR(1), whose draws form one stationary AR(1) path.
    Drawn one token at a time, as the kernels draw a single path.

    Parameters
    ----------
    code : int
        Sampler code, :meth:`variance_lab.families.Family.sampler_params`.
    params : ndarray
        Sampler parameters (float64).
    rng : numpy.random.Generator
        The stream; advanced in place.
    size : int
        Number of tokens.

    Returns
    -------
    ndarray of float64
    """
    out = np.empty(int(size))
    _draw_log_r_kernel(_check_code(code), np.ascontiguousarray(params, dtype=np.float64), rng, out)
    return out


def _check_code(code) -> int:
    if int(code) not in KNOWN_CODES:
        raise ValueError(f"unknown sampler code {code!r}; the kernels know {sorted(KNOWN_CODES)}")
    return int(code)


# --------------------------------------------------------------------------------------
# accumulating
# --------------------------------------------------------------------------------------
@kernel
def _token_kernel(
    code,
    par,
    grid,
    independent,
    n_paths,
    rng,
    log_ref,
    ref_logp,
    P,
    keep,
    shift,
    cref,
    sums,
    tbuf,
    tlen,
    thr,
    X,
    lanes,
):  # pragma: no cover - compiled
    r"""Simulate ``n_paths`` paths token by token and reduce them into the state arrays.

    Paths go in batches of 4 (:func:`_draw_raw4`), the last ``n_paths % 4`` one by one
    (AR(1): all one by one); each path writes its :math:`\log P_T` at every T into its
    column of the block buffer ``X``, and a full block is reduced at once
    (:func:`variance_lab.simulate.block.reduce_block`).
    """
    nT = grid.size
    B = P.shape[0]
    fill = 0
    n_batches = n_paths // 4 if code != 4 else 0
    for _ in range(n_batches):
        r0 = r1 = r2 = r3 = 0.0
        prev = 0
        for j in range(nT):
            t = grid[j]
            if independent:
                r0 = r1 = r2 = r3 = 0.0
                prev = 0
            if code == 1:  # inline: a call per grid point would cost half a draw on dense grids
                for _ in range(t - prev):
                    r0 += rng.standard_normal()
                    r1 += rng.standard_normal()
                    r2 += rng.standard_normal()
                    r3 += rng.standard_normal()
            else:
                d0, d1, d2, d3 = _draw_raw4(code, par, rng, t - prev)
                r0 += d0
                r1 += d1
                r2 += d2
                r3 += d3
            prev = t
            P[fill, j] = _log_p(code, par, t, r0)
            P[fill + 1, j] = _log_p(code, par, t, r1)
            P[fill + 2, j] = _log_p(code, par, t, r2)
            P[fill + 3, j] = _log_p(code, par, t, r3)
        fill += 4
        if fill == B:
            reduce_block(P, B, grid, log_ref, ref_logp, keep, shift, cref, sums, tbuf, tlen, thr, X, lanes)
            fill = 0
    for _ in range(n_paths - 4 * n_batches):
        raw = 0.0
        prev = 0
        e = np.nan
        for j in range(nT):
            t = grid[j]
            if independent:
                raw, e = _draw_raw(code, par, rng, t, np.nan)
            else:
                d, e = _draw_raw(code, par, rng, t - prev, e)
                raw += d
                prev = t
            P[fill, j] = _log_p(code, par, t, raw)
        fill += 1
        if fill == B:
            reduce_block(P, B, grid, log_ref, ref_logp, keep, shift, cref, sums, tbuf, tlen, thr, X, lanes)
            fill = 0
    reduce_block(P, fill, grid, log_ref, ref_logp, keep, shift, cref, sums, tbuf, tlen, thr, X, lanes)


@kernel
def _values_kernel(
    log_p, grid, log_ref, ref_logp, keep, shift, cref, sums, tbuf, tlen, thr, X, lanes
):  # pragma: no cover
    r"""Accumulate given values ``log_p[i, j]`` of :math:`\log P_{T_j}`, a block of rows at a time."""
    B = X.shape[1]
    n = log_p.shape[0]
    for start in range(0, n, B):
        b = min(B, n - start)
        reduce_block(
            log_p[start : start + b],
            b,
            grid,
            log_ref,
            ref_logp,
            keep,
            shift,
            cref,
            sums,
            tbuf,
            tlen,
            thr,
            X,
            lanes,
        )


def task_keep(task: ChunkTask) -> int:
    """Tail values the chunk keeps per T: ``task.tail_keep``, at most ``min(spec.tail, n_paths)``."""
    full = max(1, min(task.spec.tail, task.n_paths))
    return full if task.tail_keep is None else max(1, min(full, int(task.tail_keep)))


def run_chunk(task: ChunkTask) -> Accumulator:
    """Simulate one chunk: a pure function of the task (sampler, spec, seed, chunk index, size).

    The chunk draws from ``chunk_generator(task.seed, task.index)`` only, so the same
    task gives the same bits on any worker, thread or machine; this is the unit of work
    of every executor (threads, Dask). ``task.sampler`` picks token-level draws or the
    exact aggregate draws of :mod:`variance_lab.simulate.aggregate`.

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
    st = new_state(spec, keep)
    code = _check_code(task.code)
    rng = chunk_generator(task.seed, task.index)
    if task.sampler == "aggregate":
        from variance_lab.simulate import aggregate

        aggregate.run_aggregate(task, rng, st)
    elif task.sampler == "token":
        _token_kernel(
            code,
            task.params,
            spec.T,
            bool(task.independent),
            int(task.n_paths),
            rng,
            spec.log_ref,
            spec.ref_logP,
            st.P,
            *st.args(),
        )
    else:
        raise ValueError(f"unknown sampler {task.sampler!r}; a task's sampler is 'token' or 'aggregate'")
    complete = keep >= min(spec.tail, task.n_paths)
    return to_accumulator(spec, task.n_paths, st, complete=complete)


def draw_log_p(code: int, params, T, rng: np.random.Generator, n: int, *, sampler="token", independent=False):
    r"""Draw :math:`\log P_T` as the chunk kernels draw it, returned as an ``(n, nT)`` matrix.

    ``n`` paths from the stream ``rng`` exactly as a chunk of ``n`` paths draws them with
    ``sampler`` (``"token"`` or ``"aggregate"``), in path order: what
    :func:`run_chunk` reduces into its accumulator. For tests and small ``n`` (it holds the
    matrix the engine never holds).

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
    """
    from variance_lab.simulate import aggregate

    code = _check_code(code)
    grid = np.ascontiguousarray(T, dtype=np.int64)
    par = np.ascontiguousarray(params, dtype=np.float64)
    spec = AccumulatorSpec(
        T=grid, log_ref=np.full((2, grid.size), -np.inf), ref_logP=np.zeros(grid.size), tail=1
    )
    st = new_state(spec, 1)
    B = st.P.shape[0]  # a multiple of 4: a run of B paths continues the stream as one long run would
    out = np.empty((int(n), grid.size))
    table = aggregate.aggregate_table(code, par, grid, independent) if sampler == "aggregate" else None
    for start in range(0, int(n), B):
        b = min(B, int(n) - start)
        if sampler == "aggregate":
            aggregate._aggregate_kernel(
                code,
                par,
                grid,
                table,
                bool(independent),
                b,
                rng,
                spec.log_ref,
                spec.ref_logP,
                st.P,
                *st.args(),
            )
        elif sampler == "token":
            _token_kernel(
                code, par, grid, bool(independent), b, rng, spec.log_ref, spec.ref_logP, st.P, *st.args()
            )
        else:
            raise ValueError(f"sampler must be 'token' or 'aggregate', got {sampler!r}")
        out[start : start + b] = st.P[:b]
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
    """
    arr = np.ascontiguousarray(log_p, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != spec.T.size:
        raise ValueError(f"log_p must have shape (n, {spec.T.size}), got {arr.shape!r}")
    if arr.shape[0] == 0:
        return spec.empty()
    st = new_state(spec, max(1, min(spec.tail, arr.shape[0])))
    _values_kernel(arr, spec.T, spec.log_ref, spec.ref_logP, *st.args())
    return to_accumulator(spec, arr.shape[0], st, complete=True)
