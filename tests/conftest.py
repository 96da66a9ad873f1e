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
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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


def _write_dump(path, rng, n=90, *, prompts=True, bad=(), holes=False, row_group=16, rejected=False):
    """Write a Parquet dump: float32 log-probs, rollout log-probs, 3 answers a prompt, NaN in ``bad`` rows."""
    lengths = rng.integers(1, 60, size=n)
    cols = {"id": [f"s{i}" for i in range(n)]}
    if prompts:
        cols["prompt_id"] = (np.arange(n) // 3).tolist()
    logp, old, roll, mask, rs = [], [], [], [], []
    for i, L in enumerate(lengths.tolist()):
        o = -(rng.exponential(1.0, L) + 0.01)
        lp = np.minimum(o + rng.standard_normal(L) * 0.05, 0.0)
        if i in bad:
            lp[0] = np.nan
        logp.append(lp.astype(np.float32).tolist())
        old.append(o.astype(np.float32).tolist())
        roll.append(np.minimum(o + rng.standard_normal(L) * 0.02, 0.0).astype(np.float32).tolist())
        m = np.ones(L)
        if holes and L > 3:
            m[rng.random(L) < 0.2] = 0.0
            m[0] = 1.0
        mask.append(m.tolist())
        rs.append(np.where(rng.random(L) < 0.1, 0.0, m).tolist())
    cols |= {"logp": logp, "old_logp": old, "rollout_logp": roll}
    if holes:
        cols["mask"] = mask
    if rejected:
        cols["mask"], cols["rs_mask"] = mask, rs
    pq.write_table(pa.table(cols), path, row_group_size=row_group)
    return path


@pytest.fixture
def write_dump():
    """Return the writer of a small seeded Parquet dump of token log-probs (for the streaming analysis)."""
    return _write_dump
