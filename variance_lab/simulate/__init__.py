r"""The Monte Carlo engine: deterministic, parallel simulation of :math:`P_T` and :math:`G_T`.

Data flow::

    family, T grid ──► AccumulatorSpec (references, tail size)
    n, seed ─────────► ChunkPlan (n and sampler alone) ──► ChunkTask per chunk
    ChunkTask ──► run_chunk (nogil numba kernel, own Generator) ──► Accumulator
    Accumulators ──► merged in chunk order (Engine: threads or Dask) ──► estimates ──► tidy DataFrame

:func:`simulate` is the one call most users need; :func:`run_accumulators` stops at the
merged accumulators, and :func:`~variance_lab.simulate.kernels.run_chunk` on the tasks of
:func:`~variance_lab.simulate.plan.make_tasks` is the unit of work for other executors
(merge their results with :func:`~variance_lab.simulate.accumulators.merge_all`, in chunk
order).

Where chunks run and how paths are drawn is one :class:`Engine`
(:mod:`~variance_lab.simulate.engine`), passed as ``engine=``: the executor (threads,
Dask), the workers, and the sampler: token by token (``sampler="token"``, the default and
the reference), or :math:`\log P_T` drawn at the grid points from its exact law given the
previous grid point (``"aggregate"``, :mod:`~variance_lab.simulate.aggregate`: lognormal,
two-point, AR(1)); ``"auto"`` takes the aggregate where it is exact. Every family's draw
code is in :mod:`~variance_lab.simulate.draws`. Paths are reduced into the accumulators a
block at a time (:mod:`~variance_lab.simulate.block`), so that a dense T grid costs little
more than its draws. Outside the engine, :mod:`~variance_lab.simulate.resample` draws the
bootstraps' cluster resamples (NumPy's multinomial draws, bit for bit) in a kernel.

Reproducibility: ``(seed, n)`` (and ``chunk_size``, ``independent``, the engine's
``sampler``) fix every bit of the result, for any number of workers, any executor and any
machine with the same NumPy bit generators.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping

import numpy as np
import pandas as pd

from variance_lab._validate import check_n, check_T
from variance_lab.families import Family
from variance_lab.schema import EXECUTORS, SAMPLER_CHOICES
from variance_lab.simulate.accumulators import Accumulator, AccumulatorSpec, merge, merge_all
from variance_lab.simulate.aggregate import resolve_sampler
from variance_lab.simulate.dask_executor import DaskMissingError
from variance_lab.simulate.draws import draw_log_r
from variance_lab.simulate.engine import Engine, using_engine
from variance_lab.simulate.kernels import accumulate_log_p, draw_log_p, run_chunk
from variance_lab.simulate.plan import ChunkPlan, ChunkTask, check_seed, make_plan, make_tasks, path_draws

__all__ = [
    "EXECUTORS",
    "SAMPLER_CHOICES",
    "Accumulator",
    "AccumulatorSpec",
    "ChunkPlan",
    "ChunkTask",
    "DaskMissingError",
    "Engine",
    "accumulate_log_p",
    "draw_log_p",
    "draw_log_r",
    "make_plan",
    "make_tasks",
    "merge",
    "merge_all",
    "prepare",
    "resolve_sampler",
    "run_accumulators",
    "run_chunk",
    "simulate",
    "simulate_many",
    "using_engine",
]


def _check_family(family) -> Family:
    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    return family


def prepare(
    family: Family, T, n, *, seed=0, independent: bool = False, chunk_size=None, sampler: str = "token"
):
    """Validate a run and build its plan and chunk tasks (nothing is simulated).

    Parameters
    ----------
    family : Family
    T : int or array_like of int
        T grid: distinct integers >= 1 (sorted here).
    n : int
        Paths, >= 2.
    seed : int
        Root seed, >= 0.
    independent : bool
        Draw independent paths for each T instead of reading one path at every T.
    chunk_size : int, optional
        Paths per chunk (default: a function of n and the resolved sampler alone,
        :func:`make_plan`).
    sampler : {"token", "aggregate", "auto"}
        See :func:`simulate`; the tasks carry the resolved ``"token"`` or ``"aggregate"``.

    Returns
    -------
    (plan, tasks) : tuple of ChunkPlan and list of ChunkTask
    """
    family = _check_family(family)
    grid = check_T(T, grid=True)
    n = check_n(n)
    seed = check_seed(seed)
    code, params = family.sampler_params()
    sampler = resolve_sampler(sampler, code, family.name)
    plan = make_plan(
        n, chunk_size, sampler, draws=path_draws(grid, independent=independent, sampler=sampler, code=code)
    )
    spec = AccumulatorSpec.from_family(family, grid, plan.tail)
    return plan, make_tasks(plan, code, params, spec, seed=seed, independent=independent, sampler=sampler)


def run_accumulators(
    family: Family,
    T,
    n,
    *,
    seed=0,
    engine: Engine | None = None,
    workers=None,
    independent: bool = False,
    progress=None,
    chunk_size=None,
) -> Accumulator:
    """Simulate and return the merged accumulators (no estimates).

    Parameters are those of :func:`simulate`.

    Returns
    -------
    Accumulator
        All ``n`` paths, every T of the sorted grid.
    """
    with using_engine(engine, workers) as eng:
        _, tasks = prepare(
            family, T, n, seed=seed, independent=independent, chunk_size=chunk_size, sampler=eng.sampler
        )
        return eng.run(tasks, progress=progress)[0]


def simulate(
    family: Family,
    T,
    n,
    *,
    seed=0,
    engine: Engine | None = None,
    workers=None,
    independent: bool = False,
    ci: float = 0.95,
    progress=None,
    chunk_size=None,
    target: float = 0.1,
) -> pd.DataFrame:
    r"""Monte Carlo estimates of :math:`P_T` and :math:`G_T` with intervals and verdicts.

    Draws ``n`` sequences of i.i.d. per-token ratios from ``family``; for every T of the
    grid, estimates the mean and variance of :math:`P_T = \prod_{t \le T} r_t` and of
    :math:`G_T = P_T^{1/T}` with ``ci`` intervals, the ESS, largest weight share and
    Pareto :math:`\hat k` of the weights :math:`P_T`, and theory's predicted relative
    error; estimates theory says ``n`` draws cannot pin down (or with
    :math:`\hat k > 0.7`) are flagged unreliable, with the reason
    (:mod:`variance_lab.simulate.estimates`).

    Parameters
    ----------
    family : Family
        Per-token ratio distribution.
    T : int or array_like of int
        Sequence lengths: distinct integers >= 1 (any order; the output is sorted).
    n : int
        Sequences (paths), >= 2.
    seed : int, default 0
        Root seed; with ``n`` (and ``chunk_size``) it fixes every bit of the result.
    engine : Engine, optional
        Where the chunks run and how paths are drawn (:class:`Engine`): the executor
        (local threads, an existing Dask cluster, a ``LocalCluster``), its workers, and
        the sampler (``"token"``, the reference; ``"aggregate"``: :math:`\log P_T` drawn
        at the grid points from its exact law, one or two draws per grid point instead of
        ``max(T)`` per path, the same law, other bits, ``ValueError`` for gamma; ``"auto"``).
        Default: threads on all cores, token sampler. An engine given here is left open.
    workers : int, optional
        Short for ``engine=Engine(workers=workers)``: threads; not with ``engine``. Does
        not change the result.
    independent : bool, default False
        By default one path of length ``max(T)`` is read at every T (prefix sums), so
        estimates at different T are correlated; ``True`` draws fresh paths for each T
        (costs ``sum(T)`` instead of ``max(T)`` draws per path).
    ci : float, default 0.95
        Confidence level of the intervals.
    progress : None or bool
        :func:`variance_lab.progress.progress_bar`'s meaning: ``None``: a progress bar (tqdm,
        notebook-aware) where someone watches (a terminal, a notebook), for runs longer than
        about 1 s; ``True``: always; ``False``: never.
    chunk_size : int, optional
        Paths per chunk; default a function of ``n`` and the resolved sampler alone
        (aggregate runs use larger chunks, :func:`~variance_lab.simulate.plan.make_plan`).
    target : float, default 0.1
        Relative error the verdicts ask for (theory's ``n_needed_*`` at this target).

    Returns
    -------
    pandas.DataFrame
        Tidy rows (:data:`variance_lab.schema.TIDY_COLUMNS`), ``method="monte_carlo"``,
        statistics :data:`variance_lab.simulate.estimates.STATISTICS`; ``df.attrs["provenance"]``
        holds the package version, seed, n, chunk plan, workers, wall time and family.

    Raises
    ------
    ValueError
        For a bad family, T grid (zero, negative, duplicate or non-integer entries),
        ``n < 2``, ``workers < 1``, a negative seed, a bad ``ci``, an ``engine`` that is
        not an :class:`Engine` (or given with ``workers``), or the aggregate sampler for a
        family without one.

    Examples
    --------
    >>> from variance_lab import LogNormal
    >>> df = simulate(LogNormal(1.0, 0.1), [1, 10, 100], 10_000, seed=1, progress=False)
    >>> df.query("statistic == 'var_P'")[["T", "value", "reliable"]]  # doctest: +SKIP
    """
    from variance_lab.stats import z_value

    z_value(ci)
    with using_engine(engine, workers) as eng:
        plan, tasks = prepare(
            family, T, n, seed=seed, independent=independent, chunk_size=chunk_size, sampler=eng.sampler
        )
        t0 = time.perf_counter()
        acc, ran_on = eng.run(tasks, progress=progress)
        wall = time.perf_counter() - t0
    return _frame(acc, family, plan, tasks, ran_on, wall, independent=independent, ci=ci, target=target)


def _frame(acc, family, plan, tasks, ran_on, wall, *, independent, ci, target) -> pd.DataFrame:
    """Return the tidy estimates of a merged run with their provenance (what :func:`simulate` returns)."""
    from variance_lab import __version__
    from variance_lab.simulate import estimates

    df = estimates.estimate(acc, family, ci=ci, target=target)
    draws_per_path = int(acc.T.sum()) if independent else int(acc.T.max())
    df.attrs["provenance"] = {
        "package": "variance_lab",
        "version": __version__,
        "method": "monte_carlo",
        "family": family.describe(),
        "T": [int(t) for t in acc.T],
        "seed": tasks[0].seed,
        "n": plan.n,
        "n_chunks": plan.n_chunks,
        "chunk_size": plan.chunk_size,
        "tail_size": plan.tail,
        "independent": bool(independent),
        "sampler": tasks[0].sampler,
        "executor": ran_on["executor"],
        "workers": ran_on["workers"],
        "ci": ci,
        "target": target,
        "draws": plan.n * draws_per_path,
        "wall_time_s": wall,
        "numpy": np.__version__,
        "bit_generator": "PCG64",
    }
    return df


#: Keywords of a :func:`simulate_many` job besides family, T and n, with their defaults.
JOB_DEFAULTS = {
    "seed": 0,
    "independent": False,
    "ci": 0.95,
    "target": 0.1,
    "chunk_size": None,
    "sampler": None,
}


def simulate_many(
    jobs: Iterable[tuple[Hashable, Mapping]], *, engine: Engine | None = None
) -> Iterator[tuple[Hashable, pd.DataFrame | Exception]]:
    """Many simulations on one engine at once; yield each one's frame as soon as it is done.

    On a Dask engine the chunks of many simulations are in flight together, in one window
    bounded by the cluster's threads (:meth:`Engine.run_many`): small simulations keep the
    workers busy, and the frames come back in the order they finish, while the cluster
    works on the next ones. On threads they run one after another. Each frame has the bits
    of :func:`simulate` with the same arguments, whatever the engine.

    Parameters
    ----------
    jobs : iterable of (key, mapping)
        Read lazily, as the engine has room. The mapping holds :func:`simulate`'s
        ``family``, ``T``, ``n`` and optionally ``seed``, ``independent``, ``ci``,
        ``target``, ``chunk_size`` (defaults :data:`JOB_DEFAULTS`) and ``sampler``
        (default: the engine's). Keys are hashable, distinct among the jobs not yet
        yielded, and yielded back as given.
    engine : Engine, optional
        Default: threads on all cores. An engine given here is left open.

    Yields
    ------
    (key, frame or exception)
        The frame of :func:`simulate` (``progress=False``), or the exception the job
        raised (bad arguments, a failed chunk): the other jobs go on; the caller decides.
        Closing the generator (or Ctrl-C) cancels the chunks still running on a cluster.
    """
    from variance_lab.stats import z_value

    with using_engine(engine) as eng:
        runs: dict = {}

        def groups():
            for key, job in jobs:
                try:
                    extra = set(job) - {"family", "T", "n", *JOB_DEFAULTS}
                    if extra:
                        raise ValueError(f"unknown simulate_many job keys {sorted(extra)}")
                    if key in runs:
                        raise ValueError(f"job key {key!r} is already running")
                    opts = {**JOB_DEFAULTS, **job}
                    opts["sampler"] = eng.sampler if opts["sampler"] is None else opts["sampler"]
                    z_value(opts["ci"])
                    family = _check_family(job["family"])
                    plan, tasks = prepare(
                        family,
                        job["T"],
                        job["n"],
                        **{k: opts[k] for k in ("seed", "independent", "chunk_size", "sampler")},
                    )
                except Exception as exc:  # this job fails; the others go on
                    yield key, exc
                    continue
                runs[key] = (family, plan, tasks, opts)
                yield key, tasks

        with contextlib.closing(eng.run_many(groups())) as results:
            for key, acc, ran_on, wall in results:
                if isinstance(acc, BaseException):
                    runs.pop(key, None)
                    yield key, acc
                    continue
                family, plan, tasks, opts = runs.pop(key)
                try:
                    frame = _frame(
                        acc,
                        family,
                        plan,
                        tasks,
                        ran_on,
                        wall,
                        **{k: opts[k] for k in ("independent", "ci", "target")},
                    )
                except Exception as exc:  # handed to the caller with its key
                    yield key, exc
                    continue
                yield key, frame
