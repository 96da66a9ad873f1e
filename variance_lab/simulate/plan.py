r"""The chunk plan: how ``n`` paths are cut into chunks, and each chunk's random stream.

The plan depends on ``n`` alone (and on an explicit ``chunk_size`` if one is given),
never on the number of workers or the machine. Chunk ``i`` draws from its own
``np.random.Generator(PCG64(SeedSequence(seed).spawn(n_chunks)[i]))``, so a chunk's
result is a function of ``(seed, i)`` only; merging chunk results in chunk order then
gives bit-identical answers for any number of workers and any executor.

A chunk is the unit of work: :class:`ChunkTask` holds everything a worker needs (the
sampler, the T grid and references of the accumulators, the seed and the chunk index)
and :func:`variance_lab.simulate.kernels.run_chunk` turns it into an accumulator.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from variance_lab._validate import check_n
from variance_lab.simulate.accumulators import AccumulatorSpec

__all__ = [
    "MIN_CHUNK",
    "MAX_CHUNK",
    "TARGET_CHUNKS",
    "TAIL_MAX",
    "ChunkPlan",
    "ChunkTask",
    "make_plan",
    "make_tasks",
    "tail_size",
    "check_seed",
    "chunk_generator",
]

#: Bounds of the default chunk size (paths per chunk) and the number of chunks aimed at.
MIN_CHUNK = 2048
MAX_CHUNK = 65536
TARGET_CHUNKS = 128

#: Upper bound on the tail sample kept per T for the Pareto k-hat.
TAIL_MAX = 4096


def check_seed(seed) -> int:
    """Validate a seed: an integer >= 0 (``SeedSequence`` entropy)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


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


@dataclass(frozen=True)
class ChunkPlan:
    """``n`` paths cut into ``n_chunks`` chunks of ``chunk_size`` (the last one may be smaller).

    Attributes
    ----------
    n : int
        Total paths.
    chunk_size : int
        Paths per chunk.
    n_chunks : int
        :math:`\\lceil n / \\text{chunk\\_size} \\rceil`.
    tail : int
        Tail values of :math:`\\log P_T` kept per T (:func:`tail_size`).
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

    def sizes(self) -> np.ndarray:
        """Paths of every chunk, in chunk order (they sum to ``n``)."""
        out = np.full(self.n_chunks, self.chunk_size, dtype=np.int64)
        out[-1] = self.n - (self.n_chunks - 1) * self.chunk_size
        return out

    def seed_sequences(self, seed: int) -> list[np.random.SeedSequence]:
        """``SeedSequence(seed).spawn(n_chunks)``: one independent stream per chunk."""
        return np.random.SeedSequence(check_seed(seed)).spawn(self.n_chunks)


def make_plan(n, chunk_size=None) -> ChunkPlan:
    r"""The chunk plan of ``n`` paths.

    Parameters
    ----------
    n : int
        Paths, ``n >= 2``.
    chunk_size : int, optional
        Paths per chunk. By default
        :math:`\min(\text{MAX\_CHUNK}, \max(\text{MIN\_CHUNK}, \lceil n/\text{TARGET\_CHUNKS}\rceil))`,
        a function of ``n`` alone. Results depend on the chunk size (it decides which
        stream draws which path), so pass the same one to reproduce a run.

    Returns
    -------
    ChunkPlan
    """
    n = check_n(n)
    if chunk_size is None:
        chunk_size = min(MAX_CHUNK, max(MIN_CHUNK, -(-n // TARGET_CHUNKS)))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    chunk_size = int(min(chunk_size, n))
    return ChunkPlan(n=n, chunk_size=chunk_size, n_chunks=-(-n // chunk_size), tail=tail_size(n))


def chunk_generator(seed: int, index: int) -> np.random.Generator:
    """The Generator of chunk ``index``: ``PCG64(SeedSequence(seed).spawn(...)[index])``.

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
    """

    code: int
    params: np.ndarray
    spec: AccumulatorSpec
    independent: bool
    seed: int
    index: int
    n_paths: int


def make_tasks(plan: ChunkPlan, code: int, params, spec: AccumulatorSpec, *, seed: int, independent: bool):
    """The plan's chunk tasks, in chunk order."""
    seed = check_seed(seed)
    params = np.ascontiguousarray(params, dtype=np.float64)
    return [
        ChunkTask(int(code), params, spec, bool(independent), seed, i, int(size))
        for i, size in enumerate(plan.sizes())
    ]
