"""Running chunk tasks on a Dask cluster (the engine's ``"dask"`` and ``"dask-local"`` executors).

Three executors (:class:`variance_lab.simulate.engine.Engine`) run the same chunk tasks
(:func:`variance_lab.simulate.prepare`) with the same pure function
(:func:`~variance_lab.simulate.kernels.run_chunk`) and merge their accumulators in chunk
order on the calling process, so the result is bit-identical whatever runs the chunks, in
whatever order they finish:

``"threads"``
    A pool of threads in this process (:mod:`variance_lab.simulate.executor`); ``workers``
    threads.
``"dask"``
    An existing Dask cluster: ``scheduler="tcp://HOST:PORT"`` (or the path of a scheduler
    JSON file written by ``dask scheduler --scheduler-file``), or a ``distributed.Client``
    passed as ``client=`` (or as ``executor=`` itself).
``"dask-local"``
    A ``distributed.LocalCluster`` of ``workers`` processes of one thread each, started
    for the run and closed after it: a way to try the cluster path on one machine.

Dask is an optional extra (``pip install 'variance_lab[distributed]'``); asking for it
without the extra raises :class:`DaskMissingError`, which is both an ``ImportError``
and a ``ValueError``, with what to install in its message.

On a cluster each chunk is one Dask task with its own key. At most a window of
:data:`WINDOW_PER_THREAD` tasks per worker thread (at least :data:`MIN_WINDOW`) is
submitted and not yet merged, which bounds the memory of results that finish out of
order. :func:`run_groups_dask` runs many simulations (a sweep's cells) in one such window:
the chunks of the next cells are submitted while the last chunks of earlier ones run, so
that small cells do not leave workers idle, and each cell comes back as soon as its own
chunks are merged. A worker that dies loses its tasks; the scheduler computes them again on other
workers (up to ``distributed.scheduler.allowed-failures`` deaths per task) and, the
tasks being pure, the result does not change. A task that raises is retried
:data:`DEFAULT_RETRIES` times. Progress comes from the futures as they complete, in the
same progress bar as a local run.

The numba kernels are compiled with ``cache=True``: a worker process loads the machine
code from the ``__pycache__`` folder of the installed package (or numba's user-wide
cache when that folder is read-only) instead of compiling it; the first worker to miss
the cache compiles and writes it, atomically, and others keep running.
:func:`kernel_cache_stats` reports a process's cache hits and misses (run it on the
workers with ``client.run``). Bits are identical across machines that share the
software stack (NumPy, numba, the C math library); a cluster built from one
environment does.
"""

from __future__ import annotations

import collections
import contextlib
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from variance_lab._validate import check_workers
from variance_lab.progress import progress_bar
from variance_lab.simulate.accumulators import Accumulator, merge_into

__all__ = [
    "KERNEL_MODULES",
    "DaskMissingError",
    "check_scheduler",
    "cluster_threads",
    "connect",
    "import_distributed",
    "kernel_cache_stats",
    "local_cluster",
    "run_groups_dask",
    "run_tasks_dask",
]

#: What to install for the Dask executors.
INSTALL_HINT = "pip install 'variance_lab[distributed]' (or: pip install 'dask[distributed]>=2024.1')"
#: Seconds to wait for an existing scheduler to answer.
CONNECT_TIMEOUT_S = 30
#: Times a task that raises is retried (worker deaths are handled by the scheduler).
DEFAULT_RETRIES = 2
#: Tasks submitted and not yet merged: per worker thread, and at least.
WINDOW_PER_THREAD = 4
MIN_WINDOW = 32
#: Seconds between two looks at the cluster's size (it may grow or shrink during a run).
WINDOW_REFRESH_S = 5.0
#: Address schemes of a Dask scheduler.
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
#: Every module of the package that defines compiled kernels (:func:`kernel_cache_stats`).
KERNEL_MODULES = (
    "variance_lab.simulate._vexp",
    "variance_lab.simulate.accumulators",
    "variance_lab.simulate.draws",
    "variance_lab.simulate.block",
    "variance_lab.simulate.aggregate",
    "variance_lab.simulate.kernels",
)


class DaskMissingError(ImportError, ValueError):
    """A Dask executor was asked for, but ``dask[distributed]`` is not installed."""


def import_distributed():
    """Import and return ``distributed``, or raise :class:`DaskMissingError` saying what to install."""
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError as exc:
        raise DaskMissingError(f"the Dask executor needs dask[distributed] ({exc}): {INSTALL_HINT}") from None
    return distributed


# --------------------------------------------------------------------------- validation
def check_scheduler(scheduler) -> str:
    """Validate a scheduler: ``SCHEME://HOST:PORT`` or an existing scheduler JSON file.

    Parameters
    ----------
    scheduler : str or PathLike

    Returns
    -------
    str
        The address or the file's path.

    Raises
    ------
    ValueError
        With what a valid scheduler looks like.
    """
    text = str(scheduler).strip() if isinstance(scheduler, str | Path) else None
    if not text:
        raise ValueError(f"scheduler must be an address such as tcp://HOST:8786, got {scheduler!r}")
    if text.endswith(".json"):
        if not Path(text).is_file():
            raise ValueError(f"scheduler file {text!r} does not exist")
        return text
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(
            f"scheduler must be SCHEME://HOST:PORT with SCHEME one of {', '.join(SCHEMES)} "
            f"(such as tcp://10.0.0.5:8786) or a scheduler .json file, got {text!r}"
        )
    return text


# --------------------------------------------------------------------------- clusters
@contextlib.contextmanager
def local_cluster(workers: int, **options):
    """Start a ``LocalCluster`` of ``workers`` one-thread processes and its client; closed on exit.

    Parameters
    ----------
    workers : int
        Worker processes.
    **options
        Passed to ``distributed.LocalCluster`` (``memory_limit``, ``dashboard_address``...;
        the dashboard, if bokeh is installed, gets a free port by default).

    Yields
    ------
    distributed.Client
    """
    distributed = import_distributed()
    kwargs = {"n_workers": check_workers(workers), "threads_per_worker": 1, "processes": True}
    # a free port: the scheduler's HTTP server starts even without a dashboard, on 8787 by
    # default, which a second cluster on the machine finds taken (a warning and a leaked socket)
    kwargs["dashboard_address"] = ":0"
    kwargs.update(options)
    with (
        distributed.LocalCluster(**kwargs) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,  # leave the user's default alone
    ):
        yield client


@contextlib.contextmanager
def connect(scheduler: str):
    """Open a client of the scheduler at an address or in a scheduler file; closed on exit.

    Parameters
    ----------
    scheduler : str
        ``SCHEME://HOST:PORT`` or a scheduler JSON file (:func:`check_scheduler`).

    Yields
    ------
    distributed.Client

    Raises
    ------
    ValueError
        When the scheduler cannot be reached within :data:`CONNECT_TIMEOUT_S`.
    """
    distributed = import_distributed()
    where = {"scheduler_file": scheduler} if scheduler.endswith(".json") else {"address": scheduler}
    try:
        client = distributed.Client(timeout=CONNECT_TIMEOUT_S, set_as_default=False, **where)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler {scheduler!r}: {exc}") from None
    with client:
        yield client


# --------------------------------------------------------------------------- running on Dask
def cluster_threads(client) -> int:
    """Worker threads of the cluster of ``client``, all workers together."""
    return int(sum(client.nthreads().values()))


class _Window:
    """Tasks allowed in flight: a multiple of the cluster's threads, looked up now and then."""

    def __init__(self, client) -> None:
        self._client, self._at, self._size = client, -float("inf"), MIN_WINDOW

    def size(self) -> int:
        now = time.monotonic()
        if now - self._at > WINDOW_REFRESH_S:
            self._size = max(MIN_WINDOW, WINDOW_PER_THREAD * cluster_threads(self._client))
            self._at = now
        return self._size


def run_tasks_dask(
    tasks: Sequence,
    client,
    *,
    progress=None,
    fn: Callable | None = None,
    retries: int = DEFAULT_RETRIES,
) -> Accumulator:
    """Run ``fn`` on every task on a Dask cluster; merge the results in task order.

    Parameters
    ----------
    tasks : sequence
        Chunk tasks in chunk order (opaque here: whatever ``fn`` takes); not empty.
    client : distributed.Client
        A connected, synchronous client.
    progress : None or bool
        See :func:`variance_lab.progress.progress_bar`.
    fn : callable, optional
        Task -> accumulator, importable on the workers (default
        :func:`~variance_lab.simulate.kernels.run_chunk`).
    retries : int
        Retries of a task that raises.

    Returns
    -------
    Accumulator
        The results merged in task order: the same bits as a local run.

    Raises
    ------
    Exception
        The error of a task that failed (after its retries); the other tasks are cancelled.
    """
    if not tasks:
        raise ValueError("run_tasks_dask needs at least one task")
    bar = progress_bar(progress, sum(t.n_paths for t in tasks), "simulating", unit="path", unit_scale=True)
    try:
        one = run_groups_dask([(0, tasks)], client, fn=fn, retries=retries, bar=bar)
        with contextlib.closing(one) as runs:
            for _, out, _ in runs:
                if isinstance(out, BaseException):
                    raise out
                return out
    finally:
        if bar is not None:
            bar.close()
    raise AssertionError("unreachable: one group gives one result")  # pragma: no cover


def run_groups_dask(
    groups: Iterable[tuple[Hashable, Sequence | BaseException]],
    client,
    *,
    fn: Callable | None = None,
    retries: int = DEFAULT_RETRIES,
    bar=None,
) -> Iterator[tuple[Hashable, Accumulator | BaseException, float]]:
    r"""Run many groups of tasks (one simulation each) on a cluster at once; yield each when merged.

    The tasks of every group are submitted in turn, group after group, as long as fewer
    than the window (:data:`WINDOW_PER_THREAD` per worker thread, at least
    :data:`MIN_WINDOW`) are submitted and not merged, across all groups: many small
    groups keep every worker busy, and the results held waiting for an earlier chunk
    stay bounded. Results are gathered as they complete, merged within their group
    strictly in task order (the same bits as :func:`run_tasks_dask` on that group
    alone), and a group is yielded as soon as its last task is merged: in any order.

    Parameters
    ----------
    groups : iterable of (key, tasks)
        Read lazily, as the window has room; each ``tasks`` in chunk order, not empty.
        ``tasks`` may be an exception instead (a group that could not be prepared): it
        is yielded back, as the group's result, when its turn comes. Keys are yielded
        back as given.
    client : distributed.Client
        A connected, synchronous client.
    fn : callable, optional
        Task -> accumulator, importable on the workers (default
        :func:`~variance_lab.simulate.kernels.run_chunk`).
    retries : int
        Retries of a task that raises.
    bar : tqdm progress bar, optional
        Moved by every task's ``n_paths`` as it finishes.

    Yields
    ------
    (key, result, seconds)
        ``result`` is the group's merged :class:`Accumulator`, or the exception of its
        first failed task (the group's other tasks are cancelled; the other groups go
        on); ``seconds`` runs from the group's first submitted task to its last merged one.

    Notes
    -----
    Closing the generator (or an error or Ctrl-C while it waits) cancels every task still
    on the cluster.
    """
    if fn is None:
        from variance_lab.simulate.kernels import run_chunk as fn
    run = _DaskRun(groups, client, fn, retries, bar)
    try:
        yield from run.loop()
    finally:
        run.cancel()


class _Group:
    """One group's tasks, how many are submitted and merged, and its merged result so far."""

    def __init__(self, number: int, key, tasks) -> None:
        self.number, self.key, self.tasks = number, key, tasks
        self.submitted = self.merged = 0
        self.done: dict = {}  # chunk index -> result, until it is merged
        self.acc = None
        self.start = time.perf_counter()


class _DaskRun:
    """Futures of many groups: submitted in one window, gathered as they complete, merged in order."""

    def __init__(self, groups, client, fn, retries: int, bar) -> None:
        from distributed import as_completed

        self.source = iter(groups)
        self.client, self.fn, self.retries, self.bar = client, fn, retries, bar
        self.prefix = f"variance_lab-chunk-{uuid.uuid4().hex[:12]}"
        self.pending: dict = {}  # future key -> (group, chunk index, future), until its result is in
        # results fetched on the loop; errors are read from their futures here, per group
        self.stream = as_completed(loop=client.loop, with_results=True, raise_errors=False)
        self.window = _Window(client)
        self.feeding: _Group | None = None  # the group whose tasks are being submitted
        self.ready: collections.deque = collections.deque()  # (key, result, seconds) to yield
        self.in_flight = 0  # tasks submitted and not yet merged, all groups
        self.groups = 0

    def _next_group(self) -> _Group | None:
        """Return the next group with tasks; groups given as exceptions go straight to ``ready``."""
        for key, tasks in self.source:
            if isinstance(tasks, BaseException):
                self.ready.append((key, tasks, 0.0))
            elif not len(tasks):
                self.ready.append((key, ValueError(f"group {key!r} has no task"), 0.0))
            else:
                self.groups += 1
                return _Group(self.groups, key, tasks)
        return None

    def _submit(self) -> None:
        """Submit tasks, group after group, until the window is full or every group is in."""
        room = self.window.size() - self.in_flight
        batch, keys, where = [], [], []
        while room > 0:
            g = self.feeding
            if g is None or g.submitted == len(g.tasks):
                g = self.feeding = self._next_group()
                if g is None:
                    break
            stop = min(len(g.tasks), g.submitted + room)
            for i in range(g.submitted, stop):
                batch.append(g.tasks[i])
                keys.append(f"{self.prefix}-{g.number}-{i}")
                where.append((g, i))
            room -= stop - g.submitted
            self.in_flight += stop - g.submitted
            g.submitted = stop
        if not batch:
            return
        futures = self.client.map(self.fn, batch, key=keys, retries=self.retries)  # one call for all
        for (g, i), fut in zip(where, futures, strict=True):
            self.pending[fut.key] = (g, i, fut)
        self.stream.update(futures)

    def _fail(self, g: _Group, exc: BaseException, failed) -> None:
        """Drop a group whose task ``failed``: cancel its tasks, free its room, report the error."""
        mine = [key for key, (h, _, _) in self.pending.items() if h is g]
        self.client.cancel([failed, *(self.pending.pop(key)[2] for key in mine)])  # forgotten on the cluster
        self.in_flight -= g.submitted - g.merged
        g.done.clear()
        g.submitted = g.merged = len(g.tasks)  # nothing more of it is submitted
        if self.feeding is g:
            self.feeding = None
        self.ready.append((g.key, exc, time.perf_counter() - g.start))

    def _take(self, fut, res) -> None:
        entry = self.pending.pop(fut.key, None)
        if entry is None:  # cancelled with its failed group
            return
        g, i, _ = entry
        if fut.status != "finished":  # an error (after its retries), or cancelled by the cluster
            try:
                fut.result()
            except Exception as exc:  # this group fails; the others go on
                self._fail(g, exc, fut)
                return
            self._fail(g, RuntimeError(f"task {fut.key!r} ended as {fut.status!r}"), fut)  # pragma: no cover
            return  # pragma: no cover
        fut.release()
        g.done[i] = res
        if self.bar is not None:
            self.bar.update(g.tasks[i].n_paths)
        while g.merged in g.done:  # merge strictly in chunk order
            res = g.done.pop(g.merged)
            g.acc = res if g.acc is None else merge_into(g.acc, res)  # in place: the same bits as merge
            g.merged += 1
            self.in_flight -= 1
        if g.merged == len(g.tasks):
            self.ready.append((g.key, g.acc, time.perf_counter() - g.start))
            g.acc = None

    def loop(self) -> Iterator:
        while True:
            self._submit()
            while self.ready:
                yield self.ready.popleft()
            if not self.pending:  # the window had room and no group is left
                return
            for fut, res in self.stream.next_batch(block=True):  # every result in so far
                self._take(fut, res)

    def cancel(self) -> None:
        """Cancel what is still on the cluster (after an error, Ctrl-C or close; nothing after success)."""
        if self.pending:
            self.client.cancel([fut for _, _, fut in self.pending.values()])
            self.pending.clear()
        self.stream.clear()


# --------------------------------------------------------------------------- numba on workers
def kernel_cache_stats() -> dict[str, dict[str, int]]:
    """Return numba's cache hits and misses of the engine's kernels in this process.

    Run it on every worker with ``client.run(kernel_cache_stats)``: a worker that loaded
    its kernels from the on-disk cache shows hits and no misses. Every module of
    :data:`KERNEL_MODULES` is imported and looked at; a kernel is listed under the module
    that defines it (not under those that import it) once it has been compiled or loaded
    in this process. A kernel called only from other kernels is compiled into its callers
    and loaded with them: it appears only where it was compiled on its own (a cold cache).

    Returns
    -------
    dict
        ``{"module.kernel": {"hits": int, "misses": int}}``.
    """
    import importlib

    from numba.core.dispatcher import Dispatcher

    out = {}
    for module_name in KERNEL_MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            if not isinstance(obj, Dispatcher) or obj.py_func.__module__ != module_name:
                continue
            if obj.signatures:
                hits, misses = obj.stats.cache_hits, obj.stats.cache_misses
                out[f"{module_name}.{name}"] = {"hits": sum(hits.values()), "misses": sum(misses.values())}
    return out
