r"""Numba kernels: draw :math:`\log r` by family code, follow :math:`\log P_T`, update accumulators.

Each path draws tokens one at a time from the chunk's ``np.random.Generator`` and
keeps a running sum in a register; at every T of the sorted grid it hands
:math:`\log P_T` to that T's accumulator (one path serves the whole grid through its
prefix sums), or, with ``independent=True``, draws a fresh path for every T. No chunk
ever holds an ``n x T`` matrix: memory is constant in ``n``.

Paths are processed in batches of four whose running sums live in registers, drawn
token-major (paths 0, 1, 2, 3, 0, 1, ... in stream order): four independent additions
per generator round keep the CPU busy while the generator works, which brings the
kernel to the speed of a bare draw-and-sum loop. The last ``n % 4`` paths of a chunk
go one by one. Which draw feeds which path is fixed by the chunk alone.

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

The public drivers (:func:`run_chunk`, :func:`accumulate_log_p`) allocate the state,
call a private kernel that fills it in place, and wrap it into an
:class:`~variance_lab.simulate.accumulators.Accumulator`.
"""

from __future__ import annotations

import numpy as np

from variance_lab.simulate._jit import kernel
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec
from variance_lab.simulate.plan import ChunkTask, chunk_generator

__all__ = ["run_chunk", "accumulate_log_p", "draw_log_r", "KNOWN_CODES"]

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
def _add_powers(sums, q, j, d):  # pragma: no cover - compiled
    d2 = d * d
    sums[q, j, 0] += d
    sums[q, j, 1] += d2
    sums[q, j, 2] += d2 * d
    sums[q, j, 3] += d2 * d2


@kernel
def _add_exp(q, j, y, log_ref, shift, cref, sums):  # pragma: no cover - compiled
    """Add :math:`X = e^y` to the shifted, centred power sums of quantity ``q`` at T index ``j``."""
    if y > shift[q, j]:  # new maximum: move the shift up, rescale the sums by f**k
        f = np.exp(shift[q, j] - y)
        f2 = f * f
        sums[q, j, 0] *= f
        sums[q, j, 1] *= f2
        sums[q, j, 2] *= f2 * f
        sums[q, j, 3] *= f2 * f2
        shift[q, j] = y
        cref[q, j] = np.exp(log_ref[q, j] - y)
    r = log_ref[q, j]
    if r == -np.inf:
        d = np.exp(y - shift[q, j])
    else:
        d = cref[q, j] * np.expm1(y - r)
    _add_powers(sums, q, j, d)


@kernel
def _add_tail(j, x, tail, tail_len, thr):  # pragma: no cover - compiled
    """Keep the largest values of ``x`` in a buffer of twice the tail size, compacting when full."""
    if x > thr[j]:
        n = tail_len[j]
        tail[j, n] = x
        n += 1
        size = tail.shape[1]
        if n == size:
            keep = size // 2
            srt = np.sort(tail[j, :n])
            tail[j, :keep] = srt[n - keep :]
            thr[j] = srt[n - keep]  # every later value <= thr cannot enter the top `keep`
            n = keep
        tail_len[j] = n


@kernel
def _update(j, x, t, log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr):  # pragma: no cover
    """Hand :math:`x = \\log P_t` to the accumulators of T index ``j``."""
    _add_exp(0, j, x, log_ref, shift, cref, sums)
    _add_exp(1, j, x / t, log_ref, shift, cref, sums)
    _add_powers(sums, 2, j, x - ref_logp[j])
    _add_tail(j, x, tail, tail_len, thr)


@kernel
def _chunk_kernel(
    code, par, grid, independent, n_paths, rng, log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr
):  # pragma: no cover - compiled
    """Simulate ``n_paths`` paths and fill the state arrays (``shift`` .. ``thr``) in place.

    Paths go in batches of 4 (:func:`_draw_raw4`), the last ``n_paths % 4`` one by one
    (AR(1): all one by one); at each T the batch's values are handed to the accumulators
    in path order.
    """
    nT = grid.size
    n_batches = n_paths // 4 if code != 4 else 0
    for _ in range(n_batches):
        r0 = r1 = r2 = r3 = 0.0
        prev = 0
        for j in range(nT):
            t = grid[j]
            if independent:
                r0, r1, r2, r3 = _draw_raw4(code, par, rng, t)
            else:
                d0, d1, d2, d3 = _draw_raw4(code, par, rng, t - prev)
                r0 += d0
                r1 += d1
                r2 += d2
                r3 += d3
                prev = t
            for raw in (r0, r1, r2, r3):
                x = _log_p(code, par, t, raw)
                _update(j, x, t, log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr)
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
            x = _log_p(code, par, t, raw)
            _update(j, x, t, log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr)


@kernel
def _values_kernel(
    log_p, grid, log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr
):  # pragma: no cover - compiled
    """Accumulate given values ``log_p[i, j]`` of :math:`\\log P_{T_j}` in row order."""
    for i in range(log_p.shape[0]):
        for j in range(grid.size):
            _update(j, log_p[i, j], grid[j], log_ref, ref_logp, shift, cref, sums, tail, tail_len, thr)


def _state(spec: AccumulatorSpec, n_paths: int):
    """Fresh kernel state: (shift, cref, sums, tail buffer, tail_len, thr)."""
    nT = spec.T.size
    shift = spec.log_ref.copy()
    cref = np.where(np.isneginf(spec.log_ref), 0.0, 1.0)
    keep = max(1, min(spec.tail, n_paths))
    return (
        shift,
        cref,
        np.zeros((3, nT, 4)),
        np.empty((nT, 2 * keep)),
        np.zeros(nT, dtype=np.int64),
        np.full(nT, -np.inf),
    )


def _accumulator(spec: AccumulatorSpec, n_paths: int, state) -> Accumulator:
    shift, _, sums, buf, tail_len, _ = state
    keep = min(spec.tail, n_paths)
    tail = np.empty((spec.T.size, keep))
    for j in range(spec.T.size):
        tail[j] = np.sort(buf[j, : tail_len[j]])[::-1][:keep]
    return Accumulator(spec=spec, count=n_paths, shift=shift, sums=sums, tail=tail)


def run_chunk(task: ChunkTask) -> Accumulator:
    """Simulate one chunk: a pure function of the task (sampler, spec, seed, chunk index, size).

    The chunk draws from ``chunk_generator(task.seed, task.index)`` only, so the same
    task gives the same bits on any worker, thread or machine; this is the unit of work
    of every executor (threads here, Dask later).

    Parameters
    ----------
    task : ChunkTask

    Returns
    -------
    Accumulator
    """
    spec = task.spec
    state = _state(spec, task.n_paths)
    _chunk_kernel(
        _check_code(task.code),
        task.params,
        spec.T,
        bool(task.independent),
        int(task.n_paths),
        chunk_generator(task.seed, task.index),
        spec.log_ref,
        spec.ref_logP,
        *state,
    )
    return _accumulator(spec, task.n_paths, state)


def accumulate_log_p(log_p, spec: AccumulatorSpec) -> Accumulator:
    r"""Accumulate given values of :math:`\log P_T` (rows: paths, columns: ``spec.T``).

    The same update the simulation kernels use, for values from elsewhere (token
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
    state = _state(spec, arr.shape[0])
    _values_kernel(arr, spec.T, spec.log_ref, spec.ref_logP, *state)
    return _accumulator(spec, arr.shape[0], state)
