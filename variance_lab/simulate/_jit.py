"""The one place that fixes numba's options for every kernel of the engine.

Every kernel is compiled with ``nogil=True`` (so that worker threads run in parallel)
and ``cache=True`` (so that a new process loads the machine code instead of compiling
it again). Decorate each Python function **once**, with :func:`kernel`: numba's cache
does not tell apart two builds of one function with different options (numba issue
#6845), so a second decoration with other options can silently load the wrong build
(a plain build without ``nogil``, and two workers then run at one worker's speed).

**One build per kernel.** Called from another kernel with a constant argument
(``_add_lanes(lanes, 0, sums, 2, j)``), a plain numba function is compiled again for
that constant's literal type (``Literal[int](0)``), once per distinct constant: the block
reduction was built in 2 versions and its helpers in up to 4, about 7 s of a cold start
on a 2-core machine. A :func:`kernel` types every argument of such a call by its plain
type (``int64``, ``float64``), so that each kernel is compiled once and shared by all its
callers. LLVM still inlines the callee and folds the constant into the caller's machine
code, and nothing changes the order or the rounding of a floating-point operation: the
results are bit-identical.
"""

from __future__ import annotations

from numba import types
from numba.core.registry import CPUDispatcher

__all__ = ["JIT_OPTIONS", "kernel"]

#: Options of every kernel of :mod:`variance_lab.simulate`.
JIT_OPTIONS = {"nogil": True, "cache": True}


class _Kernel(CPUDispatcher):
    """A CPU dispatcher that types calls from other kernels by the arguments' plain types."""

    def get_call_template(self, args, kws):
        """Resolve a call from compiled code with every literal argument type made plain."""
        args = tuple(types.unliteral(a) for a in args)
        kws = {k: types.unliteral(v) for k, v in kws.items()}
        return super().get_call_template(args, kws)


def kernel(fn):
    """Compile ``fn`` with :data:`JIT_OPTIONS`; use as a decorator, once per function.

    What ``numba.njit(nogil=True, cache=True)`` builds, as a :class:`_Kernel`: compiled
    lazily, on its first call, for the plain types of its arguments.
    """
    options = {k: v for k, v in JIT_OPTIONS.items() if k != "cache"}
    disp = _Kernel(py_func=fn, locals={}, targetoptions={"nopython": True, "boundscheck": None, **options})
    if JIT_OPTIONS["cache"]:
        disp.enable_caching()
    return disp
