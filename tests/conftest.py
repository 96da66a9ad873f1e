"""Test-wide settings and fixtures: hypothesis runs derandomized, so every run tests the same examples.

Markers (``pyproject.toml``) that a test need not set by hand, given here from where it lives:
``cli`` for the tests under ``tests/cli/``, ``notebook`` for ``tests/test_notebooks.py``, and
``torch`` for every test of a module that imports PyTorch (``pytest -m "not torch"`` runs the
suite without the experiments). ``slow`` is set by hand.
"""

import re
import signal
import sys
from functools import cache
from pathlib import Path

import matplotlib
import pytest
from hypothesis import settings

matplotlib.use("Agg")  # every test draws under Agg, whatever the machine's default backend

settings.register_profile("variance_lab", derandomize=True, database=None, deadline=None)
settings.load_profile("variance_lab")


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the pyplot figures a test leaves open (plot functions given no axes make them)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sigint_default():
    """Return a ``preexec_fn`` for a child that a test interrupts: Ctrl-C as at a terminal.

    A test run started in the background by a shell without job control (``make test &``,
    ``nohup``) ignores SIGINT; children inherit that, Python then installs no
    KeyboardInterrupt handler, and a child sent SIGINT runs on to its end.
    """
    return _default_sigint


_TORCH = re.compile(r"^\s*(import torch|from torch\b)|importorskip\(\"torch\"\)", re.MULTILINE)


@cache
def _imports_torch(path: Path) -> bool:
    return bool(_TORCH.search(path.read_text()))


def pytest_collection_modifyitems(config, items):
    """Mark each test ``cli``, ``notebook`` or ``torch`` from its module's place and imports."""
    for item in items:
        path = Path(item.path)
        if path.parent.name == "cli":
            item.add_marker(pytest.mark.cli)
        if path.name == "test_notebooks.py":
            item.add_marker(pytest.mark.notebook)
        if _imports_torch(path):
            item.add_marker(pytest.mark.torch)
