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

**First run.** A kernel is compiled on its first call, or loaded from numba's on-disk
cache when an earlier process compiled it; only a cache miss compiles, and only a
compile fires numba's ``"numba:compile"`` event. :func:`compile_progress` listens to
it, so that a caller can say "compiling kernels (first run only)" with a count, and say
nothing when the kernels load from the cache; :func:`kernels_reached` counts the kernels
a call can compile (those it calls, and theirs).

**A stale cache.** numba keys a cached kernel by the file that defines it: a kernel of
``kernels.py`` that inlines a draw of ``draws.py`` would load its old machine code after
``draws.py`` changed (numba's documented limitation; numba PR #8396 would lift it). The
cache of a :func:`kernel` is keyed also by :func:`sources_digest`, the SHA-256 of every
source a kernel can compile in (``variance_lab/simulate/*.py`` and ``families/*.py``): an
edit to any of them compiles every kernel again once, on its next call, and an unchanged
package loads from the cache as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FunctionType

from numba import types
from numba.core import event
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher
from numba.core.registry import CPUDispatcher

__all__ = ["JIT_OPTIONS", "compile_progress", "kernel", "kernels_reached", "sources_digest"]

#: Options of every kernel of :mod:`variance_lab.simulate`.
JIT_OPTIONS = {"nogil": True, "cache": True}


#: The package's folder: the sources of :func:`sources_digest` are found from it.
_PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def sources_digest() -> str:
    """Return the SHA-256 of every source a kernel can compile in: ``simulate/*.py`` and ``families/*.py``.

    Read once per process. A kernel inlines the kernels it calls, from any of these files,
    and folds their module constants (``families.base.CODE_*``) into its machine code.
    """
    h = hashlib.sha256()
    paths = [path for folder in ("simulate", "families") for path in sorted((_PACKAGE / folder).glob("*.py"))]
    for path in paths:
        for part in (path.name.encode(), path.read_bytes()):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.hexdigest()


class _SourcesCache(FunctionCache):
    """numba's on-disk cache of one kernel, with :func:`sources_digest` in each entry's key."""

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), sources_digest())


class _Kernel(CPUDispatcher):
    """A CPU dispatcher that types calls from other kernels by the arguments' plain types."""

    def get_call_template(self, args, kws):
        """Resolve a call from compiled code with every literal argument type made plain."""
        args = tuple(types.unliteral(a) for a in args)
        kws = {k: types.unliteral(v) for k, v in kws.items()}
        return super().get_call_template(args, kws)

    def enable_caching(self):
        """Cache on disk as numba does, keyed also by the sources the kernel can inline."""
        self._cache = _SourcesCache(self.py_func)


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


def _names(code: CodeType) -> Iterator[str]:
    """Global names a code object and the code objects nested in it refer to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _names(const)


def kernels_reached(*roots) -> frozenset:
    """Return the kernels that calling ``roots`` can compile: those they name, and theirs.

    Follows the global names of the roots, of kernels and of the package's Python
    functions, transitively (not into containers such as a dict of runners: pass the one
    a run takes as a root). An over-count is possible for a kernel named but never called.

    Parameters
    ----------
    *roots : callable
        Python functions or kernels.

    Returns
    -------
    frozenset of numba dispatchers
    """
    found: set = set()
    seen: set[int] = set()
    package = __name__.split(".")[0]
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Dispatcher):
            found.add(obj)
            fn = obj.py_func
        elif isinstance(obj, FunctionType) and (
            any(obj is r for r in roots) or (obj.__module__ or "").split(".")[0] == package
        ):
            fn = obj
        else:
            continue
        todo.extend(fn.__globals__[n] for n in _names(fn.__code__) if n in fn.__globals__)
    return frozenset(found)


class _CompileCounter(event.Listener):
    """Counts the first compile of each of a set of kernels; opens a bar on the first one."""

    def __init__(self, kernels, open_bar: Callable[[int], object]) -> None:
        self.kernels = kernels
        self.open_bar = open_bar
        self.bar = None
        self.done: set = set()
        self.lock = threading.Lock()

    def on_start(self, ev) -> None:
        disp = ev.data["dispatcher"]
        with self.lock:
            if disp in self.kernels and self.bar is None:
                self.bar = self.open_bar(len(self.kernels))
            if disp in self.kernels and self.bar is not None:
                self.bar.set_postfix_str(disp.py_func.__name__, refresh=True)

    def on_end(self, ev) -> None:
        disp = ev.data["dispatcher"]
        with self.lock:
            if disp in self.kernels and disp not in self.done:
                self.done.add(disp)
                if self.bar is not None:
                    self.bar.update(1)


@contextlib.contextmanager
def compile_progress(kernels, open_bar: Callable[[int], object]) -> Iterator[_CompileCounter]:
    """Show the compiling of ``kernels`` while the block runs, if any of them compiles.

    On the first compile (a cache miss) of one of ``kernels``, ``open_bar(len(kernels))``
    is called for a progress bar (a ``tqdm``-like object: ``update``, ``set_postfix_str``,
    ``close``; or ``None`` for none); it then advances by one per kernel compiled, and is
    closed when the block ends. Kernels loaded from the cache open nothing, and so does
    a block that compiles none of ``kernels``; those loaded from the cache while others
    compile are not counted (after a change to one file the bar closes short of its
    total).

    Yields
    ------
    object
        The counter: ``.done`` holds the kernels compiled in the block, ``.bar`` the bar or ``None``.
    """
    counter = _CompileCounter(frozenset(kernels), open_bar)
    try:
        with event.install_listener("numba:compile", counter):
            yield counter
    finally:
        if counter.bar is not None:
            counter.bar.close()
