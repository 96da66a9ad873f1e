"""Provenance, written once: versions, fingerprints, sidecars and PyTorch determinism.

Every file the toolkit ships with its numbers (a figure's data, an experiment's data set)
has a JSON *sidecar* beside it that says how to make it again and how to tell that it is
the same:

- **versions** (:func:`versions`): the software and machine the numbers depend on, by key
  (:data:`FIGURE_VERSIONS` for the figures, :data:`TORCH_VERSIONS` for the PyTorch
  experiments);
- **fingerprints**: the SHA-256 of a text (:func:`text_sha256`, a figure's data CSV), of a
  file (:func:`file_sha256`) or of a data set's ids and log-probs (:func:`numbers_sha256`);
- **sidecars**: written as indented JSON (:func:`sidecar_text`, :func:`write_sidecar`) and
  read back as a JSON object or a ``ValueError`` naming the file (:func:`read_json_object`);
- **determinism** of the PyTorch experiments: a :class:`torch.Generator` from a
  :class:`numpy.random.SeedSequence` (:func:`torch_generator`) and a fixed thread count with
  deterministic algorithms (:func:`deterministic_torch`). PyTorch is imported inside these
  two functions only, so this module needs NumPy alone;
- **one BLAS thread** for the rollout analysis (:func:`one_blas_thread`), whose numbers would
  otherwise depend on the machine's core count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from variance_lab._atomic import atomic_write

__all__ = [
    "FIGURE_VERSIONS",
    "TORCH_VERSIONS",
    "cpu_model",
    "deterministic_torch",
    "file_sha256",
    "numbers_sha256",
    "read_json_object",
    "sidecar_text",
    "text_sha256",
    "torch_generator",
    "torch_run_facts",
    "versions",
    "write_sidecar",
]

#: The ``versions`` of a figure's sidecar, in order: the Monte Carlo draws are promised
#: identical for the same architecture, Python, NumPy and numba
#: (:func:`variance_lab.paper.compare.sampler_promise`).
FIGURE_VERSIONS = ("python", "numpy", "scipy", "numba", "pandas", "matplotlib", "machine", "cpu")
#: The ``versions`` of a PyTorch experiment's sidecar, in order. Training is chaotic: a difference
#: in the last bit of a float32 sum (another processor, another kernel path) grows until other
#: tokens are sampled, so a data set reproduces exactly only with the same versions on the same
#: kind of processor.
TORCH_VERSIONS = ("variance_lab", "torch", "numpy", "python", "machine", "cpu", "cpu_capability")


def cpu_model() -> str:
    """Return the processor's model name (``/proc/cpuinfo`` on Linux, else the platform's).

    A sidecar's ``versions["cpu"]``; the benchmark suite prints it too.
    """
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def _version(key: str) -> str:
    if key == "variance_lab":
        from variance_lab import __version__

        return __version__
    if key == "python":
        return platform.python_version()
    if key == "machine":
        return platform.machine()
    if key == "cpu":
        return cpu_model()
    if key == "cpu_capability":
        import torch

        return torch.backends.cpu.get_cpu_capability()
    return metadata.version(key)


def versions(keys: Sequence[str] = FIGURE_VERSIONS) -> dict:
    """Return the versions and machine facts named by ``keys``, in that order.

    Parameters
    ----------
    keys : sequence of str, optional
        Any of ``variance_lab`` (this package's version), ``python``, ``machine`` (the
        processor architecture, :func:`platform.machine`), ``cpu`` (the processor's model name,
        :func:`cpu_model`), ``cpu_capability`` (the instruction set PyTorch dispatches its
        kernels to, :func:`torch.backends.cpu.get_cpu_capability`) and the name of any installed
        distribution (its version, :func:`importlib.metadata.version`). Default
        :data:`FIGURE_VERSIONS`; the PyTorch experiments record :data:`TORCH_VERSIONS`.

    Returns
    -------
    dict
        ``{key: str}``.
    """
    return {key: _version(key) for key in keys}


def torch_run_facts(threads: int) -> dict:
    """Return a PyTorch run's ``versions`` (:data:`TORCH_VERSIONS`, transformers, threads) and ``machine``.

    Parameters
    ----------
    threads : int
        PyTorch's intra-op threads of the run.

    Returns
    -------
    dict
        ``{"versions": {...}, "machine": {"platform": ..., "processor": ..., "threads": ...}}``.
    """
    ver = versions((*TORCH_VERSIONS, "transformers")) | {"torch_threads": threads}
    return {
        "versions": ver,
        "machine": {"platform": platform.platform(), "processor": ver["cpu"], "threads": threads},
    }


def text_sha256(text: str) -> str:
    """SHA-256 (hexadecimal) of a text encoded as UTF-8: a data file's fingerprint as it is written.

    Parameters
    ----------
    text : str
        The file's text, before it is written (:func:`file_sha256` of the file gives the same).

    Returns
    -------
    str
        64 hexadecimal digits.
    """
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path, chunk: int = 1 << 20) -> str:
    """SHA-256 (hexadecimal) of a file's bytes, read in chunks.

    Parameters
    ----------
    path : str or Path
    chunk : int, optional
        Bytes per read.

    Returns
    -------
    str
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def numbers_sha256(records: Iterable[dict]) -> str:
    """SHA-256 of the ids and log-probs of the records, as JSON text (an exact fingerprint).

    Each record gives the line ``json.dumps([id, logp, old_logp])`` and a newline; other
    fields (prompts, rewards, ``rollout_logp``) do not count.

    Parameters
    ----------
    records : iterable of dict
        With ``id``, ``logp`` and ``old_logp``.

    Returns
    -------
    str
    """
    h = hashlib.sha256()
    for rec in records:
        h.update(json.dumps([rec["id"], list(rec["logp"]), list(rec["old_logp"])]).encode())
        h.update(b"\n")
    return h.hexdigest()


def sidecar_text(sidecar: dict) -> str:
    """Return the text of a sidecar file: JSON indented by one space, keys in order, a final newline.

    Parameters
    ----------
    sidecar : dict

    Returns
    -------
    str
    """
    return json.dumps(sidecar, indent=1) + "\n"


def write_sidecar(path, sidecar: dict) -> Path:
    """Write :func:`sidecar_text` of ``sidecar`` to ``path`` atomically.

    Parameters
    ----------
    path : str or Path
    sidecar : dict

    Returns
    -------
    Path
    """
    path = Path(path)
    text = sidecar_text(sidecar)
    atomic_write(path, lambda tmp: tmp.write_text(text))
    return path


def read_json_object(path: str | os.PathLike, what: str = "a sidecar") -> dict:
    """Read a JSON file that must hold an object (a sidecar); ``ValueError`` naming the file otherwise.

    Parameters
    ----------
    path : str or Path
    what : str, optional
        What the file should hold, for the message (``"cannot read {what} from {path!r}: {reason}"``).

    Returns
    -------
    dict
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {what} from {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object")
    return data


def torch_generator(ss: np.random.SeedSequence):
    """Return a CPU :class:`torch.Generator` seeded from a seed sequence.

    The seed is the first 64-bit word of ``ss.generate_state`` shifted right by one (PyTorch
    takes seeds below 2^63).

    Parameters
    ----------
    ss : numpy.random.SeedSequence

    Returns
    -------
    torch.Generator
    """
    import torch

    seed = int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def deterministic_torch(threads: int):
    """Run with ``threads`` intra-op threads and PyTorch's deterministic algorithms; restore both after.

    Parameters
    ----------
    threads : int

    Yields
    ------
    None
    """
    import torch

    saved = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])


@contextlib.contextmanager
def one_blas_thread():
    r"""Run the BLAS library (OpenBLAS, MKL: all that ``threadpoolctl`` finds) on one thread; restore after.

    Some sums of :func:`~variance_lab.rollouts.analysis.analyze` go through BLAS (the
    autocorrelation's :math:`\gamma_0` is a dot product of the token log-ratios, the mixtures'
    EM and information matrices matrix products). OpenBLAS splits a long dot product between its
    threads, so the last bits of the sum depend on their number, that is on the machine's cores
    (on the 2-core VM, 1 thread against 2 moved the ``comb`` fit of the shipped files by up to
    18 %: its EM amplifies the last bits); and its idle threads spin between calls (``analyze`` of
    1.6e7 tokens took 23.9 CPU seconds with 2 threads, 18.6 with one, in the same wall time).
    With one thread the numbers are the same on any number of cores, and a Dask worker's (its
    nanny starts it with ``OPENBLAS_NUM_THREADS=1``) are this process's.

    Yields
    ------
    None
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
