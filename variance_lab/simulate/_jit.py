"""The one place that fixes numba's options for every kernel of the engine.

Every kernel is compiled with ``nogil=True`` (so that worker threads run in parallel)
and ``cache=True`` (so that a new process loads the machine code instead of compiling
it again). Decorate each Python function **once**, with :func:`kernel`: numba's cache
does not tell apart two builds of one function with different options (numba issue
#6845), so a second decoration with other options can silently load the wrong build
(a plain build without ``nogil``, and two workers then run at one worker's speed).
"""

from __future__ import annotations

from numba import njit

__all__ = ["JIT_OPTIONS", "kernel"]

#: Options of every kernel of :mod:`variance_lab.simulate`.
JIT_OPTIONS = {"nogil": True, "cache": True}


def kernel(fn):
    """Compile ``fn`` with :data:`JIT_OPTIONS`; use as a decorator, once per function."""
    return njit(**JIT_OPTIONS)(fn)
