"""Run chunk tasks on a pool of threads and merge their accumulators in chunk order.

The kernels release the GIL (``nogil=True``), so plain threads run them in parallel
with no pickling and no process start-up. Results are merged strictly in chunk order,
whatever order they finish in (in place, :func:`~variance_lab.simulate.accumulators.merge_into`:
the same bits as ``merge``), so the merged accumulator is bit-identical for any
number of workers; at most ``2 * workers`` chunks are in flight, which bounds memory.

**First run.** Before a run with a progress bar, :func:`compile_kernels` runs a tiny copy
of the first chunk (one grid point, a few paths, a tail of one) in the calling thread:
it loads the kernels of the run's sampler from numba's cache, or, on a first run,
compiles them under a "compiling kernels (first run only)" bar that counts them, before
the "simulating" bar starts. Only the kernels of the run's sampler are compiled (the
token and the aggregate samplers have their own), and nothing of the run's result depends
on it: the copy draws from its own stream and is thrown away.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np

from variance_lab._validate import check_workers
from variance_lab.progress import progress_bar
from variance_lab.simulate._jit import compile_progress, kernels_reached
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec, merge, merge_into
from variance_lab.simulate.kernels import SAMPLER_RUNNERS, run_chunk
from variance_lab.simulate.plan import ChunkTask

__all__ = ["COMPILING", "compile_kernels", "default_workers", "run_tasks"]

#: What the bar of a first run's compiling says.
COMPILING = "compiling kernels (first run only)"


def default_workers() -> int:
    """Cores this process may run on (all of them by default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def compile_kernels(task: ChunkTask, progress=None) -> int:
    """Load or compile the kernels a run of ``task`` needs; on a first run, show it.

    Runs a tiny copy of ``task`` (its family, sampler and ``independent``; the first
    grid point only, 1 path, a tail of 2) twice, and merges the two results every way
    (:func:`~variance_lab.simulate.accumulators.merge`, and
    :func:`~variance_lab.simulate.accumulators.merge_into` into a full tail and into one
    with room to grow): every kernel of the run is
    then compiled for the very argument types of the run, or loaded from numba's cache.
    Compiling (a cache miss) shows a bar :data:`COMPILING` counting the kernels of
    :func:`~variance_lab.simulate._jit.kernels_reached` from the sampler's runner, the
    chunk and the merges; loading shows nothing.

    Parameters
    ----------
    task : ChunkTask
        A task of the run (its sampler, code and parameters pick the kernels).
    progress : None or bool
        As in :func:`variance_lab.progress.progress_bar`, for the bar of a kernel compiling:
        ``None`` shows it where someone watches once the compiling has taken
        :data:`~variance_lab.progress.DELAY_S` (a first run takes seconds), ``True`` at once,
        ``False`` never.

    Returns
    -------
    int
        Kernels compiled (0 when all were loaded from the cache or compiled before in
        this process).
    """
    spec = task.spec
    tiny_spec = AccumulatorSpec(
        T=np.ascontiguousarray(spec.T[:1]),
        log_ref=np.ascontiguousarray(spec.log_ref[:, :1]),
        ref_logP=np.ascontiguousarray(spec.ref_logP[:1]),
        tail=2,
    )
    tiny = dataclasses.replace(task, spec=tiny_spec, n_paths=1, tail_keep=None)
    roots = (SAMPLER_RUNNERS[task.sampler], run_chunk, merge, merge_into)
    with compile_progress(
        kernels_reached(*roots), lambda total: progress_bar(progress, total, COMPILING, unit="kernel")
    ) as counter:
        a, b = run_chunk(tiny), run_chunk(tiny)  # one path each: tails one value wide
        c = merge(a, b)  # two wide: full
        merge_into(c, b)  # a full tail: merged in place
        merge_into(a, b)  # a tail with room: grown
    return len(counter.done)


def run_tasks(
    tasks: Sequence[ChunkTask],
    *,
    workers: int = 1,
    progress=None,
    fn: Callable[[ChunkTask], Accumulator] = run_chunk,
) -> Accumulator:
    """Run ``fn`` on every task with ``workers`` threads; merge the results in task order.

    Parameters
    ----------
    tasks : sequence of ChunkTask
        In chunk order; not empty.
    workers : int
        Threads, >= 1 (1 runs in the calling thread).
    progress : None, bool
        :func:`variance_lab.progress.progress_bar`'s meaning (None: a bar after a second where
        someone watches; True: at once; False: none). Unless ``False``, the kernels are loaded or compiled
        first (:func:`compile_kernels`, with the default ``fn``), a first run's compiling
        shown in a bar of its own.
    fn : callable
        Task -> accumulator (default :func:`run_chunk`).

    Returns
    -------
    Accumulator
        ``merge(...merge(fn(tasks[0]), fn(tasks[1]))..., fn(tasks[-1]))``.
    """
    workers = check_workers(workers)
    if not tasks:
        raise ValueError("run_tasks needs at least one task")
    if progress is not False and fn is run_chunk:
        compile_kernels(tasks[0], progress)
    bar = progress_bar(progress, sum(t.n_paths for t in tasks), "simulating", unit="path", unit_scale=True)
    try:
        if workers == 1:
            return _serial(tasks, fn, bar)
        return _threaded(tasks, fn, workers, bar)
    finally:
        if bar is not None:
            bar.close()


def _serial(tasks, fn, bar) -> Accumulator:
    acc = None
    for task in tasks:
        res = fn(task)
        acc = res if acc is None else merge_into(acc, res)
        if bar is not None:
            bar.update(task.n_paths)
    return acc


def _threaded(tasks, fn, workers: int, bar) -> Accumulator:
    acc = None
    done: dict[int, Accumulator] = {}
    pending: dict = {}
    nxt_submit = nxt_merge = 0
    window = 2 * workers
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="variance_lab")
    try:
        while nxt_merge < len(tasks):
            while nxt_submit < len(tasks) and len(pending) + len(done) < window:
                pending[pool.submit(fn, tasks[nxt_submit])] = nxt_submit
                nxt_submit += 1
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = pending.pop(fut)
                done[i] = fut.result()
                if bar is not None:
                    bar.update(tasks[i].n_paths)
            while nxt_merge in done:  # merge strictly in chunk order
                res = done.pop(nxt_merge)
                acc = res if acc is None else merge_into(acc, res)
                nxt_merge += 1
    finally:  # on Ctrl-C or an error, queued chunks are dropped; only running ones finish
        pool.shutdown(wait=True, cancel_futures=True)
    return acc
