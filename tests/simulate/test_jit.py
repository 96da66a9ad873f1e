"""The jit helper: one build per kernel, the kernels a call reaches, and compile progress."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
from numba import types
from numba.core.caching import FunctionCache

import variance_lab
from variance_lab.simulate._jit import JIT_OPTIONS, compile_progress, kernel, kernels_reached, sources_digest
from variance_lab.simulate.accumulators import merge, merge_into
from variance_lab.simulate.kernels import SAMPLER_RUNNERS, run_chunk


@kernel
def _scaled(x, k):  # pragma: no cover - compiled
    return x * k


@kernel
def _calls_with_constants(x):  # pragma: no cover - compiled
    return _scaled(x, 2) + _scaled(x, 3) + _scaled(x, int(x))


def _plain_scaled(x, k):  # pragma: no cover - compiled
    return x * k


_plain = numba.njit(_plain_scaled)


@numba.njit
def _plain_calls_with_constants(x):  # pragma: no cover - compiled
    return _plain(x, 2) + _plain(x, 3)


def _python_caller(x):
    return _calls_with_constants(x)


def test_a_kernel_called_with_constants_is_built_once():
    """Constants 2 and 3 in a call: one int64 build, where plain numba builds one per constant.

    (Asked the way a compiling caller asks, ``get_call_template``: a caller loaded from the
    cache never compiles its callees.)
    """
    assert _calls_with_constants(1.5) == 1.5 * 2 + 1.5 * 3 + 1.5 * 1
    for k in (2, 3):
        _scaled.get_call_template((types.float64, types.IntegerLiteral(k)), {})
        _plain.get_call_template((types.float64, types.IntegerLiteral(k)), {})
    assert _scaled.signatures == [(types.float64, types.int64)]
    assert _plain.signatures == [
        (types.float64, types.IntegerLiteral(2)),
        (types.float64, types.IntegerLiteral(3)),
    ]
    assert _plain_calls_with_constants(1.5) == 1.5 * 5


def test_kernel_keeps_the_options():
    """Options nogil and cache, as JIT_OPTIONS says, on a lazy numba dispatcher."""
    assert JIT_OPTIONS == {"nogil": True, "cache": True}
    assert _scaled.targetoptions["nogil"] is True
    assert isinstance(_scaled._cache, FunctionCache)  # cache=True; NullCache otherwise
    assert isinstance(_scaled, numba.core.dispatcher.Dispatcher)


def test_kernels_reached_follows_functions_and_kernels():
    """From a Python function through a kernel to its callee; nothing unrelated."""
    assert kernels_reached(_python_caller) == {_calls_with_constants, _scaled}
    assert kernels_reached(_scaled) == {_scaled}
    assert kernels_reached(np.sum, len) == frozenset()


def test_kernels_reached_by_each_sampler():
    """Each sampler's run reaches its own kernel and not the other's; both share the reduction."""
    names = {
        s: {k.py_func.__name__ for k in kernels_reached(SAMPLER_RUNNERS[s], run_chunk, merge, merge_into)}
        for s in ("token", "aggregate")
    }
    assert {"_token_kernel", "draw_raw4", "reduce_columns", "_merge_tails", "_compact"} <= names["token"]
    assert "_aggregate_kernel" not in names["token"]
    assert {"_aggregate_kernel", "aggregate_paths", "reduce_columns", "_merge_tails_inplace"} <= names[
        "aggregate"
    ]
    assert "_token_kernel" not in names["aggregate"]
    assert "draw_raw4" not in names["aggregate"]


class _Bar:
    """Records what compile_progress does with its bar."""

    def __init__(self, total):
        self.total, self.n, self.closed, self.postfix = total, 0, False, []

    def update(self, k):
        self.n += k

    def set_postfix_str(self, text, refresh=True):
        self.postfix.append(text)

    def close(self):
        self.closed = True


def _fresh_pair():
    """Two uncached numba functions, the first calling the second: both compile on the first call."""

    def inner(x):  # pragma: no cover - compiled
        return x + 1.0

    inner_d = numba.njit(inner)

    def outer(x):  # pragma: no cover - compiled
        return inner_d(x) * 2.0

    return numba.njit(outer), inner_d


def test_compile_progress_counts_compiles_and_stays_silent_when_compiled():
    """A bar opens at the first compile and counts both functions; a second call opens none."""
    outer, inner = _fresh_pair()
    bars = []

    def open_bar(total):
        bars.append(_Bar(total))
        return bars[-1]

    with compile_progress({outer, inner}, open_bar) as counter:
        assert outer(1.0) == 4.0
    assert len(bars) == 1
    assert bars[0].total == 2
    assert bars[0].n == 2
    assert bars[0].closed
    assert counter.done == {outer, inner}
    assert bars[0].postfix[0] == "outer"
    with compile_progress({outer, inner}, open_bar) as counter:
        assert outer(2.0) == 6.0
    assert len(bars) == 1
    assert counter.done == set()
    assert counter.bar is None


def test_compile_progress_ignores_other_functions():
    """Compiling a function outside the set opens no bar."""
    outer, _inner = _fresh_pair()
    opened = []
    with compile_progress({_scaled}, opened.append):
        outer(1.0)
    assert opened == []


_LANES_EXP = """
import numpy as np
from variance_lab.simulate import block
X = np.full((1, 16), 0.5)
lanes = np.zeros((10, 16))
block._lanes_exp(X, 0, 16, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, False, lanes)
s = block._lanes_exp.stats
print(lanes[0, 0], sum(s.cache_hits.values()), sum(s.cache_misses.values()))
"""


def _lanes_exp_in(pkg: Path, cache: Path) -> tuple[float, int, int]:
    """In a new process on the package copy ``pkg``: ``block._lanes_exp`` at 0.5, cache hits, misses."""
    env = {**os.environ, "PYTHONPATH": str(pkg), "NUMBA_CACHE_DIR": str(cache)}
    out = subprocess.run(  # run from pkg's folder: "-c" puts the working directory first on the path
        [sys.executable, "-c", _LANES_EXP], cwd=pkg, env=env, capture_output=True, text=True, check=True
    )
    value, hits, misses = out.stdout.split()
    return float(value), int(hits), int(misses)


def test_an_edit_to_an_inlined_kernel_in_another_file_compiles_the_caller_again(tmp_path):
    """A kernel inlining an edited kernel of another file compiles again: the key holds the sources digest.

    ``block._lanes_exp`` inlines ``_vexp.exp_minus``. After ``exp_minus`` is edited to
    return twice its value, the next process compiles ``_lanes_exp`` again and sees the
    edit (numba alone keys a cached kernel by its own file, and would load the old
    machine code: the old value, a cache hit); the process after it loads the new build.
    """
    pkg = tmp_path / "pkg"
    shutil.copytree(
        Path(variance_lab.__file__).parent, pkg / "variance_lab", ignore=shutil.ignore_patterns("__pycache__")
    )
    cache = tmp_path / "numba_cache"
    value, hits, misses = _lanes_exp_in(pkg, cache)
    assert value == np.exp(0.5)  # exp_minus is exact to the last bit at 0.5
    assert (hits, misses) == (0, 1)
    assert _lanes_exp_in(pkg, cache) == (value, 1, 0)  # loaded from the cache

    vexp = pkg / "variance_lab" / "simulate" / "_vexp.py"
    text = vexp.read_text()
    assert text.count("    return e * p + (e - minus)\n") == 1
    vexp.write_text(
        text.replace("    return e * p + (e - minus)\n", "    return 2.0 * (e * p + (e - minus))\n")
    )
    assert _lanes_exp_in(pkg, cache) == (2 * value, 0, 1)  # compiled again, with the edit
    assert _lanes_exp_in(pkg, cache) == (2 * value, 1, 0)


def test_sources_digest_covers_the_simulate_sources_and_families(tmp_path, monkeypatch):
    """A SHA-256 (hex) read once per process, that moves with ``simulate/*.py`` and ``families/*.py`` only."""
    digest = sources_digest()
    assert len(digest) == 64
    assert set(digest) <= set("0123456789abcdef")
    assert sources_digest() is digest  # read once per process

    pkg = tmp_path / "variance_lab"
    shutil.copytree(Path(variance_lab.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr("variance_lab.simulate._jit._PACKAGE", pkg)
    read = sources_digest.__wrapped__  # not the per-process cache

    def after_editing(path: Path) -> str:
        path.write_text(path.read_text() + "\n# edited\n")
        return read()

    assert read() == digest  # the same sources, elsewhere
    assert after_editing(pkg / "cli" / "table.py") == digest  # no kernel compiles it in
    with_families = after_editing(pkg / "families" / "base.py")
    assert with_families != digest
    assert after_editing(pkg / "simulate" / "draws.py") != with_families
