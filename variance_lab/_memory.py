"""The C library's memory policy: keep freed memory for the next array (glibc's ``mallopt``).

One setting, used where large temporaries come and go: ``variance-lab analyze`` sets it for its
process, and :func:`variance_lab.rollouts.steps.analyze_run` on a Dask cluster for each worker,
whose nanny starts it with ``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``):
with it every array over 128 KiB was a fresh ``mmap``, and a step of 52,000 tokens spent 2.7 of
its 5.4 CPU seconds in the kernel, 0.0 with this setting (measured on the 2-core AMD EPYC VM).
"""

from __future__ import annotations

__all__ = ["reuse_freed_memory"]


#: glibc's ``mallopt`` parameters :func:`reuse_freed_memory` sets, and the size it sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _KEEP_BYTES = -1, -3, 1 << 30


def reuse_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep freed memory for the next array instead of returning it at once.

    A large NumPy array is by default its own ``mmap``, unmapped when freed, so that every
    temporary of that size faults its pages in again, zeroed by the kernel: on a dump of 4e6
    tokens ``variance-lab analyze`` spent 2.3 s of its 15 CPU seconds in the kernel, 0.4 s with
    arrays up to 1 GiB taken from (and returned to) the heap, at the same peak memory (measured on
    the 2-core AMD EPYC VM). A no-op, returning False, where the C library is not glibc.

    Returns
    -------
    bool
        True when both settings were taken.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) == 1, mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1])
