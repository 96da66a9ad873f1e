r"""The chunk plan: how ``n`` paths are cut into chunks, and each chunk's random stream.

The plan depends on ``n`` and the sampling method alone (and on an explicit
``chunk_size`` if one is given), never on the number of workers or the machine: the
aggregate sampler, whose paths cost a few draws each, cuts them into chunks of
:data:`AGGREGATE_CHUNK` paths, so that a chunk's fixed cost (its stream's
``SeedSequence``, its state, the merge) stays small beside its draws. Chunk ``i`` draws from its own
``np.random.Generator(PCG64(SeedSequence(seed).spawn(n_chunks)[i]))``, so a chunk's
result is a function of ``(seed, i)`` only; merging chunk results in chunk order then
gives bit-identical answers for any number of workers and any executor.

A chunk is the unit of work: :class:`ChunkTask` holds everything a worker needs (the
family's sampler and the sampling method, the T grid and references of the
accumulators, the seed, the chunk index and the chunk's share of the tail sample) and
:func:`variance_lab.simulate.kernels.run_chunk` turns it into an accumulator.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from variance_lab._validate import check_n, check_seed
from variance_lab.simulate.accumulators import AccumulatorSpec

__all__ = [
    "AGGREGATE_CHUNK",
    "AGGREGATE_COST",
    "MAX_CHUNK",
    "MAX_CHUNK_DRAWS",
    "MIN_CHUNK",
    "SAMPLERS",
    "TAIL_LOG_RISK",
    "TAIL_MAX",
    "TARGET_CHUNKS",
    "TOKEN_COST",
    "WORK_RATE",
    "ChunkPlan",
    "ChunkSizes",
    "ChunkTask",
    "check_seed",
    "chunk_generator",
    "chunk_tail_keep",
    "estimate_seconds",
    "make_plan",
    "make_tasks",
    "path_draws",
    "tail_size",
]

#: Bounds of the default chunk size (paths per chunk) and the number of chunks aimed at.
MIN_CHUNK = 2048
MAX_CHUNK = 65536
TARGET_CHUNKS = 128
#: Default chunk size of the aggregate sampler, whatever ``n``: a path costs a draw or two
#: per grid point instead of one per token, and chunks of the token plan's size left the
#: fixed cost per chunk (about 0.1 ms of Python: stream set-up, state, merge) at a tenth of
#: an aggregate run.
AGGREGATE_CHUNK = MAX_CHUNK

#: Upper bound on the work of one chunk, in work units (one unit: one lognormal token draw
#: with its accumulator updates, :func:`path_draws`). A chunk is the unit a worker cannot
#: leave, so this bounds how long Ctrl-C waits, at any T: 2^23 units took about 0.2 s of one
#: core on the shared 2-core machine. A function of the run's parameters alone, like the rest
#: of the plan, so results stay bit-identical for any number of workers.
MAX_CHUNK_DRAWS = 2**23

#: Work units per token draw of each sampler code (1 for lognormal and anything not listed):
#: measured token rates on one core of the loaded 2-core machine (``simulate`` at T = 10^4,
#: n = 2048) were 3.8e7/s lognormal, 1.1e7/s ar1, 2.0e6/s two-point, 1.8e6/s gamma; later,
#: alike (load average 10), 6.2e7/s lognormal, 7.9e7/s random-scale, 5.1e6/s mixture
#: (2 components), 5.8e6/s two-point.
TOKEN_COST = {2: 16, 3: 16, 4: 4, 6: 16}  # gamma, two-point, ar1, mixture (variance_lab.families.base.CODE_*)

#: Work units per grid point and path of the aggregate sampler (two bridge draws and the
#: accumulator updates: 2.4e6 draws/s for lognormal, 1.5e6 for two-point, measured alike).
AGGREGATE_COST = 32

#: Work units one core gets through per second (lognormal token draws, measured as above):
#: the rate behind :func:`estimate_seconds`.
WORK_RATE = 3.8e7

#: Upper bound on the tail sample kept per T for the Pareto k-hat.
TAIL_MAX = 4096

#: :math:`L = \ln 10^{30}`: a chunk's tail share fails with probability below :math:`e^{-L}`.
TAIL_LOG_RISK = 30 * math.log(10.0)

#: Sampling methods a task can name (``"auto"`` is resolved before tasks are made).
SAMPLERS = ("token", "aggregate")


def tail_size(n: int) -> int:
    r"""Size of the tail sample of :math:`\log P_T` kept per T, for the Pareto k-hat.

    As in Pareto-smoothed importance sampling, the generalised Pareto fit uses the
    :math:`M = \lceil\min(n/5, 3\sqrt{n})\rceil` largest weights, bounded by
    :data:`TAIL_MAX`; one more value is kept, the threshold the exceedances are measured
    from. Depends on ``n`` alone.
    """
    n = check_n(n)
    m = math.ceil(min(0.2 * n, 3.0 * math.sqrt(n)))
    return min(m, TAIL_MAX) + 1


def chunk_tail_keep(n: int, chunk: int, tail: int) -> int:
    r"""Tail values a chunk of ``chunk`` paths keeps per T, out of ``tail`` for all ``n`` paths.

    The paths are i.i.d., so how many of the ``tail`` largest values of all ``n`` fall
    in one chunk is hypergeometric, :math:`X \sim \mathrm{Hyp}(n, M, c)` with mean
    :math:`\mu = Mc/n`; its moment generating function is at most that of the binomial
    (Hoeffding 1963), so Bernstein's inequality gives
    :math:`P(X \ge \mu + t) \le \exp(-t^2 / (2(\mu + t/3)))`. The chunk keeps

    .. math::

        k = \min\Bigl(M, c, \bigl\lceil \mu + L/3 + \sqrt{L^2/9 + 2L\mu} \bigr\rceil\Bigr),
        \qquad L = \ln 10^{30},

    for which :math:`P(X > k) < 10^{-30}`: instead of :math:`\min(M, c)` values (38 % of a
    chunk at :math:`n = 10^6`) about a hundred, so that the tail costs one comparison per
    value and a chunk's accumulator stays small on dense T grids. Whether the merged
    tail is exact is not assumed but checked
    (:meth:`~variance_lab.simulate.accumulators.Accumulator.tail_complete`). A function
    of ``(n, chunk, tail)`` alone, like the rest of the plan.
    """
    mu = tail * chunk / n
    lr = TAIL_LOG_RISK
    k = math.ceil(mu + lr / 3 + math.sqrt(lr * lr / 9 + 2 * lr * mu))
    return int(min(tail, chunk, k))


class ChunkSizes(Sequence, np.lib.mixins.NDArrayOperatorsMixin):
    r"""The chunk sizes of a plan, computed on demand: ``n`` paths in chunks of ``chunk_size``.

    Chunk :math:`i` holds :math:`\min(c, n - ic)` paths, :math:`c` = ``chunk_size``: all
    full but the last. A read-only sequence of ints that behaves as the int64 array of
    those sizes (``len``, indexing, iteration, ``sum``, ``size``, ``tolist``, NumPy
    operators and ``np.asarray``) without holding it: a plan of :math:`10^9` one-path
    chunks costs nothing until an array of it is asked for. ``sum`` is ``n`` by
    construction.
    """

    def __init__(self, n: int, chunk_size: int, n_chunks: int):
        self.n, self.chunk_size, self.n_chunks = int(n), int(chunk_size), int(n_chunks)

    def __len__(self) -> int:
        """Return the number of chunks."""
        return self.n_chunks

    @property
    def size(self) -> int:
        """Number of chunks (as ``ndarray.size``)."""
        return self.n_chunks

    def _at(self, i):
        return np.minimum(self.chunk_size, self.n - i * self.chunk_size)

    def __getitem__(self, key):
        """Paths of chunk ``key`` (negative counts from the end), or an int64 array for a slice."""
        if isinstance(key, slice):
            return self._at(np.arange(self.n_chunks, dtype=np.int64)[key])
        i = int(key) + self.n_chunks if int(key) < 0 else int(key)
        if not 0 <= i < self.n_chunks:
            raise IndexError(f"chunk index {key!r} out of range for {self.n_chunks} chunks")
        return min(self.chunk_size, self.n - i * self.chunk_size)

    def __iter__(self):
        """Iterate over the sizes, in chunk order."""
        c, n = self.chunk_size, self.n
        return (min(c, n - i * c) for i in range(self.n_chunks))

    def sum(self) -> int:
        """Total paths, ``n``, without building the array."""
        return self.n

    def tolist(self) -> list[int]:
        """Return the sizes as a list of ints."""
        return list(self)

    def __array__(self, dtype=None, copy=None):
        """Build the int64 array of the sizes (``np.asarray``)."""
        return self._at(np.arange(self.n_chunks, dtype=np.int64)).astype(dtype or np.int64, copy=False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """Apply a NumPy ufunc to the array of the sizes (``sizes >= 1``, ``sizes == c``)."""
        args = [np.asarray(x) if isinstance(x, ChunkSizes) else x for x in inputs]
        return getattr(ufunc, method)(*args, **kwargs)

    def __repr__(self) -> str:
        """Show the plan's numbers, not the sizes."""
        return f"ChunkSizes(n={self.n}, chunk_size={self.chunk_size}, n_chunks={self.n_chunks})"


@dataclass(frozen=True)
class ChunkPlan:
    r"""``n`` paths cut into ``n_chunks`` chunks of ``chunk_size`` (the last one may be smaller).

    Attributes
    ----------
    n : int
        Total paths.
    chunk_size : int
        Paths per chunk.
    n_chunks : int
        :math:`\lceil n / \text{chunk\_size} \rceil`.
    tail : int
        Tail values of :math:`\log P_T` kept per T (:func:`tail_size`).
    """

    n: int
    chunk_size: int
    n_chunks: int
    tail: int

    def size(self, i: int) -> int:
        """Paths in chunk ``i``."""
        if not 0 <= i < self.n_chunks:
            raise ValueError(f"chunk index must lie in [0, {self.n_chunks}), got {i!r}")
        return min(self.chunk_size, self.n - i * self.chunk_size)

    def sizes(self) -> ChunkSizes:
        """Paths of every chunk, in chunk order (they sum to ``n``): a lazy :class:`ChunkSizes`."""
        return ChunkSizes(self.n, self.chunk_size, self.n_chunks)

    def tail_keep(self, i: int) -> int:
        """Tail values chunk ``i`` keeps per T (:func:`chunk_tail_keep`)."""
        return chunk_tail_keep(self.n, self.size(i), self.tail)

    def seed_sequences(self, seed: int) -> list[np.random.SeedSequence]:
        """``SeedSequence(seed).spawn(n_chunks)``: one independent stream per chunk."""
        return np.random.SeedSequence(check_seed(seed)).spawn(self.n_chunks)


def path_draws(T, *, independent: bool = False, sampler: str = "token", code: int | None = None) -> int:
    r"""Work units one path costs (:data:`MAX_CHUNK_DRAWS`): what a chunk's size is capped by.

    Token sampler: :math:`\max T` draws (one path read at every T) or :math:`\sum T`
    (``independent``), times :data:`TOKEN_COST` of the family's sampler ``code``; aggregate
    sampler: :data:`AGGREGATE_COST` per grid point.

    Parameters
    ----------
    T : array_like of int
        The T grid.
    independent : bool
        Fresh paths for every T.
    sampler : {"token", "aggregate"}
    code : int, optional
        The family's sampler code (:meth:`variance_lab.families.Family.sampler_params`).

    Returns
    -------
    int
        At least 1.
    """
    grid = np.asarray(T, dtype=np.int64).ravel()
    if grid.size == 0:
        return 1
    if sampler == "aggregate":
        return AGGREGATE_COST * int(grid.size)
    draws = int(grid.sum()) if independent else int(grid.max())
    return max(1, draws * TOKEN_COST.get(code, 1))


def estimate_seconds(n: int, draws: int, workers: int = 1) -> float:
    """Estimate the rough wall time of ``n`` paths of ``draws`` work units each.

    On ``workers`` cores at :data:`WORK_RATE`: what the command line shows before a long run.
    """
    return float(n) * float(draws) / (WORK_RATE * max(1, int(workers)))


def make_plan(n, chunk_size=None, sampler: str = "token", *, draws: int = 1) -> ChunkPlan:
    r"""Make the chunk plan of ``n`` paths.

    Parameters
    ----------
    n : int
        Paths, ``n >= 2``.
    chunk_size : int, optional
        Paths per chunk. By default
        :math:`\min(\text{MAX\_CHUNK}, \max(\text{MIN\_CHUNK}, \lceil n/\text{TARGET\_CHUNKS}\rceil))`,
        a function of ``n`` alone; for ``sampler="aggregate"``,
        :math:`\min(n, \text{AGGREGATE\_CHUNK})`. Results depend on the chunk size (it
        decides which stream draws which path), so pass the same one to reproduce a run.
    sampler : {"token", "aggregate"}
        The resolved sampling method (part of a run's identity, like ``n``).
    draws : int
        Draws per path (:func:`path_draws`). The default chunk size is capped at
        :math:`\max(1, \lfloor \text{MAX\_CHUNK\_DRAWS} / \text{draws} \rfloor)` paths so
        that no chunk runs for long at any T (Ctrl-C is honoured between chunks); at
        :math:`T = 10^6` a lognormal chunk holds 8 paths. Like ``n`` it is part of a run's identity,
        never the machine's. An explicit ``chunk_size`` is used as given.

    Returns
    -------
    ChunkPlan
    """
    n = check_n(n)
    if sampler not in SAMPLERS:
        raise ValueError(f"a plan's sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if isinstance(draws, bool) or not isinstance(draws, numbers.Integral) or draws < 1:
        raise ValueError(f"draws per path must be an integer >= 1, got {draws!r}")
    if chunk_size is None:
        if sampler == "aggregate":
            chunk_size = AGGREGATE_CHUNK
        else:
            chunk_size = min(MAX_CHUNK, max(MIN_CHUNK, -(-n // TARGET_CHUNKS)))
        chunk_size = min(chunk_size, max(1, MAX_CHUNK_DRAWS // int(draws)))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    chunk_size = int(min(chunk_size, n))
    return ChunkPlan(n=n, chunk_size=chunk_size, n_chunks=-(-n // chunk_size), tail=tail_size(n))


def chunk_generator(seed: int, index: int) -> np.random.Generator:
    """Return the Generator of chunk ``index``: ``PCG64(SeedSequence(seed).spawn(...)[index])``.

    ``SeedSequence(seed).spawn(k)[i]`` is ``SeedSequence(seed, spawn_key=(i,))`` for every
    ``k > i``, so a worker builds its chunk's stream from ``(seed, index)`` alone.
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))


@dataclass(frozen=True, eq=False)
class ChunkTask:
    """Everything a worker needs to simulate one chunk; picklable (numbers and arrays).

    Attributes
    ----------
    code : int
        Family sampler code (:meth:`variance_lab.families.Family.sampler_params`).
    params : ndarray
        Family sampler parameters (float64).
    spec : AccumulatorSpec
        T grid, references and tail size shared by every chunk of the run.
    independent : bool
        Independent paths per T instead of one path read at every T.
    seed : int
        Root seed.
    index : int
        Chunk index (its stream is :func:`chunk_generator` ``(seed, index)``).
    n_paths : int
        Paths in this chunk.
    sampler : {"token", "aggregate"}
        Token by token, or log P_T drawn directly at the grid points
        (:mod:`variance_lab.simulate.aggregate`; families with an exact aggregate only).
    tail_keep : int or None
        Tail values kept per T (:func:`chunk_tail_keep`); ``None``: all of
        ``min(spec.tail, n_paths)``.
    """

    code: int
    params: np.ndarray
    spec: AccumulatorSpec
    independent: bool
    seed: int
    index: int
    n_paths: int
    sampler: str = "token"
    tail_keep: int | None = None


def make_tasks(
    plan: ChunkPlan,
    code: int,
    params,
    spec: AccumulatorSpec,
    *,
    seed: int,
    independent: bool,
    sampler: str = "token",
):
    """Return the plan's chunk tasks, in chunk order (``sampler``: ``"token"`` or ``"aggregate"``)."""
    seed = check_seed(seed)
    if sampler not in SAMPLERS:
        raise ValueError(f"a task's sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    params = np.ascontiguousarray(params, dtype=np.float64)
    return [
        ChunkTask(int(code), params, spec, bool(independent), seed, i, size, sampler, plan.tail_keep(i))
        for i, size in enumerate(plan.sizes())
    ]
