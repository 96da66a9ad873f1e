"""Every notebook is stored without outputs and runs top to bottom in quick mode.

Quick mode (``VARIANCE_LAB_QUICK=1``, :mod:`variance_lab.paper.sizes`) keeps the six runs to
seconds each; a notebook writes its files to ``VARIANCE_LAB_NOTEBOOK_OUT`` (a temporary
folder here). Each notebook must show its figures as images, print no warnings, and end
with a conclusion rendered from its own numbers.
"""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    """The six notebooks 01 to 06 are there."""
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    """Notebooks are stored without outputs, counts or widget state, and open with a question."""
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs", []) == [], f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
        assert "execution" not in cell.get("metadata", {}), f"{path.name} cell {i} stores execution times"
    assert "widgets" not in nb.get("metadata", {}), f"{path.name} stores widget state"
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown"
    assert "question" in "".join(first["source"]).lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_reads_its_sizes_from_one_place(path):
    """Each notebook takes its sizes from ``paper.sizes`` and draws no randomness itself."""
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "from variance_lab.paper.sizes import" in source
    assert "sizes(QUICK)" in source
    assert "np.random.seed" not in source, "randomness only through the API"
    assert "default_rng" not in source, "randomness only through the API"


def _parameters_cell(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "one cell tagged 'parameters'"
    assert tagged[0] is code[0], "the parameters cell is the first code cell"
    return tagged[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_one_parameters_cell_drives_the_notebook(path):
    """The parameters cell holds only assignments, including QUICK, each used later and never reassigned."""
    nb = nbformat.read(path, as_version=4)
    cell = _parameters_cell(nb)
    tree = ast.parse(cell.source)
    assert all(isinstance(node, ast.Assign) for node in tree.body), "only assignments (papermill)"
    names = {t.id for node in tree.body for t in node.targets}
    assert "QUICK" in names
    later = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and c is not cell)
    for name in names:
        assert re.search(rf"\b{name}\b", later), f"parameter {name} is never used"
        assert not re.search(rf"^{name}\s*=", later, re.M), f"parameter {name} is reassigned later"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_names_the_source_documents_not_the_seed(path):
    """The notebook names the derivation and the perplexity-entropy paper, never the seed."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Where these numbers come from" in text
    assert "the derivation" in text
    assert "perplexity-entropy paper" in text
    assert not re.search(r"\bthe seed\b(?!s)", text, re.I), "say 'the derivation', not 'the seed'"
    labels = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "seed's" not in labels


def test_notebooks_are_ruff_clean():
    """``ruff check`` passes on the notebooks folder."""
    folder = NOTEBOOKS[0].parent
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(folder)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_executes_in_quick_mode(path, monkeypatch, tmp_path):
    """Each notebook runs in quick mode without errors or warnings, shows figures, concludes."""
    monkeypatch.setenv("VARIANCE_LAB_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("VARIANCE_LAB_NOTEBOOK_OUT", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute(env=dict(os.environ))
    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not [t for t in stderr if "Warning" in t], stderr
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure shown as an image"
    view = "application/vnd.jupyter.widget-view+json"
    widgets = [c.source[:80] for c in code for o in c.outputs if view in o.get("data", {})]
    # no progress bar widgets, and in quick mode no sliders (run headless they can stall nbclient, #312)
    assert not widgets, widgets
    for cell in [c for c in code if "widgets.interact" in c.source]:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), "the slider cell drew no panel"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len({o["data"]["image/png"] for o in images}) == len(images), "a figure is shown twice"
    markdown = [c for c in nb.cells if c.cell_type == "markdown"]
    assert markdown[-1].source.startswith("## Conclusion")
    assert any("text/markdown" in o.get("data", {}) for o in code[-1].outputs), "no computed conclusion"
    assert any(tmp_path.iterdir()), "wrote nothing to VARIANCE_LAB_NOTEBOOK_OUT"
