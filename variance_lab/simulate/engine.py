"""The engine: where chunk tasks run (threads or Dask) and how their paths are drawn.

One :class:`Engine` object carries every option that says *how* a Monte Carlo run is
carried out, as opposed to *what* it estimates: the executor (local threads, an
existing Dask cluster, or a ``LocalCluster`` started for it), the scheduler or client,
the number of workers, and the sampler (token or aggregate draws). :func:`simulate
<variance_lab.simulate.simulate>`, :func:`run_accumulators
<variance_lab.simulate.run_accumulators>`, :func:`variance_lab.sweep.sweep` and the
paper's figures take it as one ``engine=`` argument::

    from variance_lab.simulate import Engine, simulate

    with Engine("dask-local", workers=4, sampler="auto") as engine:
        for family in families:
            simulate(family, T, n, engine=engine)  # one cluster for every call

The executors (:mod:`variance_lab.simulate.executor`, :mod:`variance_lab.simulate.dask_executor`)
merge chunk results in chunk order, so the worker count and the executor never change a
bit of the result; the sampler changes the bits (not the law), and is part of a sweep
cell's identity.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

from variance_lab._validate import check_workers
from variance_lab.schema import EXECUTORS, check_sampler
from variance_lab.simulate.accumulators import Accumulator
from variance_lab.simulate.aggregate import resolve_sampler
from variance_lab.simulate.dask_executor import (
    check_scheduler,
    cluster_threads,
    connect,
    import_distributed,
    local_cluster,
    run_groups_dask,
    run_tasks_dask,
)
from variance_lab.simulate.executor import default_workers, run_tasks
from variance_lab.simulate.plan import estimate_seconds, path_draws

__all__ = ["Engine", "estimate_run_seconds", "using_engine"]


def estimate_run_seconds(
    family, T, n: int, *, sampler: str = "token", independent: bool = False, workers: int | None = None
) -> float:
    r"""Estimate the rough wall time of one Monte Carlo run of ``n`` paths of ``family`` over the grid ``T``.

    :math:`n \cdot d / (\text{WORK\_RATE} \cdot w)`: ``d`` the work units of one path
    (:func:`~variance_lab.simulate.plan.path_draws`, the units a chunk's size is capped by),
    :data:`~variance_lab.simulate.plan.WORK_RATE` the units per second measured on one core,
    ``w`` the workers (:func:`~variance_lab.simulate.plan.estimate_seconds`). What the command
    line shows, and asks about, before a long run.

    Parameters
    ----------
    family : Family
    T : array_like of int
        The T grid.
    n : int
        Paths.
    sampler : {"token", "aggregate", "auto"}
        Resolved for the family as the run resolves it (``ValueError`` for aggregate draws of a
        family without an exact aggregate).
    independent : bool
        Fresh paths for every T.
    workers : int, optional
        Cores; None: :func:`~variance_lab.simulate.executor.default_workers`.

    Returns
    -------
    float
        Seconds (rough).
    """
    code, _ = family.sampler_params()
    resolved = resolve_sampler(sampler, code, family.name)
    draws = path_draws(T, independent=independent, sampler=resolved, code=code)
    return estimate_seconds(n, draws, workers or default_workers())


def _is_client(obj) -> bool:
    """Whether ``obj`` is a ``distributed.Client`` (without importing distributed)."""
    client_class = getattr(sys.modules.get("distributed"), "Client", None)
    return client_class is not None and isinstance(obj, client_class)


def _bad_executor(executor) -> ValueError:
    return ValueError(f"executor must be one of {', '.join(EXECUTORS)} or a Dask client, got {executor!r}")


def _resolve(executor, scheduler, client, workers) -> tuple[str, object, object, int | None]:
    """Validate an executor choice: ``(name, scheduler, client, workers)``."""
    if executor is not None and not isinstance(executor, str):  # a Client passed as the executor
        if not _is_client(executor):
            raise _bad_executor(executor)
        if client is not None:
            raise ValueError("give the Dask client as executor= or as client=, not both")
        executor, client = "dask", executor
    if executor is None:
        executor = "threads" if client is None else "dask"
    if executor not in EXECUTORS:
        raise _bad_executor(executor)
    if executor == "threads":
        if scheduler is not None or client is not None:
            raise ValueError("a scheduler or a client needs executor='dask'")
        return executor, None, None, default_workers() if workers is None else check_workers(workers)
    import_distributed()
    if executor == "dask-local":
        if scheduler is not None or client is not None:
            raise ValueError("executor='dask-local' starts its own cluster; a scheduler needs 'dask'")
        return executor, None, None, default_workers() if workers is None else check_workers(workers)
    if workers is not None:
        raise ValueError("workers sets threads or dask-local processes; a Dask cluster has its own workers")
    if (scheduler is None) == (client is None):
        raise ValueError("executor='dask' needs one of: a scheduler address (tcp://HOST:PORT), a client")
    if client is not None and not _is_client(client):
        raise ValueError(f"client must be a distributed.Client, got {type(client).__name__}")
    return executor, None if scheduler is None else check_scheduler(scheduler), client, None


class _Connection:
    """The engine's Dask client, opened on first use and closed with the engine.

    Shared by an engine and its :meth:`Engine.with_sampler` copies, so that a copy
    reuses the cluster of the original (and never closes it).
    """

    def __init__(self, client) -> None:
        self.client = client
        self.stack = contextlib.ExitStack()


class Engine:
    r"""How Monte Carlo chunks run: executor, workers and sampler, validated at once.

    A cluster is started (``dask-local``) or reached (``dask``) on first use and kept for
    every later run on the engine, until :meth:`close` (or the end of a ``with`` block).

    Parameters
    ----------
    executor : {"threads", "dask", "dask-local"}, distributed.Client or None
        ``None``: ``"dask"`` if ``client`` is given, else ``"threads"``.
    scheduler : str, optional
        ``executor="dask"``: ``tcp://HOST:PORT`` or a scheduler JSON file.
    client : distributed.Client, optional
        ``executor="dask"``: a connected client (left open on exit).
    workers : int, optional
        Threads (``"threads"``) or worker processes (``"dask-local"``); default all cores
        this process may use. Never changes the result.
    sampler : {"token", "aggregate", "auto"}, default "token"
        ``"token"`` draws every token's ratio (the reference, every family);
        ``"aggregate"`` draws :math:`\log P_T` at the grid points from its exact law
        (:mod:`variance_lab.simulate.aggregate`; not for gamma); ``"auto"``: aggregate
        where it is exact, token elsewhere. The same law, other bits.

    Attributes
    ----------
    name : str
        The executor: ``"threads"``, ``"dask"`` or ``"dask-local"``.
    scheduler : str or None
    workers : int or None
        ``None`` on an existing Dask cluster (it has its own).
    sampler : str

    Raises
    ------
    ValueError
        A bad or contradictory choice; :class:`~variance_lab.simulate.dask_executor.DaskMissingError`
        (also an ``ImportError``) for a Dask executor without the ``distributed`` extra.
    """

    def __init__(self, executor=None, *, scheduler=None, client=None, workers=None, sampler: str = "token"):
        self.sampler = check_sampler(sampler)
        self.name, self.scheduler, client, self.workers = _resolve(executor, scheduler, client, workers)
        self._conn = _Connection(client)

    def __repr__(self) -> str:
        """Show the executor, its workers or scheduler, and the sampler."""
        where = f"workers={self.workers}" if self.workers is not None else f"scheduler={self.scheduler!r}"
        return f"Engine({self.name!r}, {where}, sampler={self.sampler!r})"

    def __enter__(self) -> Engine:
        """Return this engine; leaving the ``with`` block closes it."""
        return self

    def __exit__(self, *exc) -> None:
        """Close what this engine opened (:meth:`close`)."""
        self.close()

    def close(self) -> None:
        """Close a cluster or connection this engine opened (a client given to it stays open)."""
        self._conn.stack.close()

    def start(self) -> Engine:
        """Start or reach the cluster now (a no-op for threads); returns the engine."""
        self.client  # noqa: B018 - connects
        return self

    @property
    def client(self):
        """The Dask client (``None`` for threads), connecting on first use."""
        conn = self._conn
        if self.name == "threads" or conn.client is not None:
            return conn.client
        if self.name == "dask-local":
            conn.client = conn.stack.enter_context(local_cluster(self.workers))
        else:
            conn.client = conn.stack.enter_context(connect(self.scheduler))
        return conn.client

    def with_sampler(self, sampler: str) -> Engine:
        """Return this engine with another sampler.

        The same executor and the same cluster (shared, not copied).
        """
        sampler = check_sampler(sampler)
        if sampler == self.sampler:
            return self
        other = copy.copy(self)
        other.sampler = sampler
        return other

    def run(
        self, tasks: Sequence, *, progress=None, fn: Callable | None = None
    ) -> tuple[Accumulator, dict[str, object]]:
        """Run chunk tasks and merge their accumulators in chunk order.

        Parameters
        ----------
        tasks : sequence of ChunkTask
            In chunk order (:func:`variance_lab.simulate.prepare`); the tasks carry the
            resolved sampler.
        progress : None or bool
            See :func:`variance_lab.progress.progress_bar`.
        fn : callable, optional
            Task -> accumulator (default :func:`variance_lab.simulate.kernels.run_chunk`).

        Returns
        -------
        (Accumulator, dict)
            The merged accumulator and ``{"executor", "workers"}`` (threads or the
            cluster's worker threads) for the provenance.
        """
        extra = {} if fn is None else {"fn": fn}
        if self.name == "threads":
            acc = run_tasks(tasks, workers=self.workers, progress=progress, **extra)
            return acc, {"executor": "threads", "workers": self.workers}
        client = self.client
        threads = cluster_threads(client)
        acc = run_tasks_dask(tasks, client, progress=progress, **extra)
        return acc, {"executor": self.name, "workers": threads}

    def run_many(
        self, groups: Iterable[tuple[Hashable, Sequence | BaseException]], *, fn: Callable | None = None
    ) -> Iterator[tuple[Hashable, Accumulator | Exception, dict[str, object], float]]:
        """Run many runs' chunk tasks; yield each run's merged accumulator as it finishes.

        On a Dask cluster the chunks of many runs are in flight at once, in one bounded
        window (:func:`~variance_lab.simulate.dask_executor.run_groups_dask`), and runs come
        back in the order they finish; on threads they run one after another, each over
        every thread. Either way a run's accumulator has the bits :meth:`run` gives it.

        Parameters
        ----------
        groups : iterable of (key, tasks)
            Read lazily. ``tasks`` as for :meth:`run` (not empty), or an exception (a run
            that could not be prepared), yielded back in its turn.
        fn : callable, optional
            Task -> accumulator (default :func:`variance_lab.simulate.kernels.run_chunk`).

        Yields
        ------
        (key, result, ran_on, seconds)
            ``result``: the merged accumulator, or the exception its first failing task
            raised (the other runs go on); ``ran_on``: ``{"executor", "workers"}`` as from
            :meth:`run`; ``seconds``: from the run's first task submitted to its last merged.
        """
        extra = {} if fn is None else {"fn": fn}
        if self.name == "threads":
            ran_on = {"executor": "threads", "workers": self.workers}
            for key, tasks in groups:
                if isinstance(tasks, BaseException):
                    yield key, tasks, ran_on, 0.0
                    continue
                t0 = time.perf_counter()
                try:
                    acc = run_tasks(tasks, workers=self.workers, progress=False, **extra)
                except Exception as exc:  # this run fails; the others go on
                    yield key, exc, ran_on, time.perf_counter() - t0
                    continue
                yield key, acc, ran_on, time.perf_counter() - t0
            return
        client = self.client
        ran_on = {"executor": self.name, "workers": cluster_threads(client)}
        with contextlib.closing(run_groups_dask(groups, client, **extra)) as runs:
            for key, result, seconds in runs:
                yield key, result, ran_on, seconds


@contextlib.contextmanager
def using_engine(engine: Engine | None = None, workers: int | None = None) -> Iterator[Engine]:
    """Yield the engine a call runs on: ``engine``, or a threads engine of ``workers`` made (and closed) here.

    ``workers=`` is the short form of ``engine=Engine(workers=...)`` for the common call;
    giving both is an error.

    Raises
    ------
    ValueError
        ``engine`` is not an :class:`Engine`, or both ``engine`` and ``workers`` are given.
    """
    if engine is None:
        with Engine(workers=workers) as made:
            yield made
        return
    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a variance_lab.simulate.Engine, got {engine!r}")
    if workers is not None:
        raise ValueError(f"give workers to the Engine, not beside it: engine={engine!r}, workers={workers!r}")
    yield engine
