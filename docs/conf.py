"""Sphinx configuration of the variance_lab documentation site (``make docs``).

The notebooks are copied from ``notebooks/`` and executed at build time in quick mode
(``VARIANCE_LAB_QUICK=1``); the figures gallery is written from the committed
``figures/*.json`` sidecars; the API reference comes from the numpydoc docstrings.
"""

import json
import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VARIANCE_LAB_QUICK", "1")  # notebooks run small at build time
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import variance_lab  # noqa: E402

project = "variance_lab"
author = "variance_lab developers"
release = version = variance_lab.__version__
copyright = "variance_lab developers"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
# .rst first: autosummary writes its generated API pages with the first suffix
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
html_theme = "alabaster"
html_theme_options = {"page_width": "1100px", "sidebar_width": "230px"}
html_static_path = []

# MyST: $...$ and $$...$$ math as in the README and the notebooks
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
# links from the README to files of the repository (CITATION.cff, data/, ...) are not pages
suppress_warnings = ["myst.xref_missing", "myst.header"]

# notebooks: executed at build time, quick mode, an error fails the build
nb_execution_mode = os.environ.get("VARIANCE_LAB_DOCS_EXECUTE", "force")  # "off" for a fast draft
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# API reference from numpydoc docstrings
autosummary_generate = True
autosummary_imported_members = False
# each object documented once, in the module that defines it (packages re-export names in __all__)
autodoc_default_options = {"members": True, "ignore-module-all": True, "show-inheritance": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False


def _copy_notebooks() -> None:
    """Copy the notebooks (stored without outputs) where Sphinx reads them."""
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copyfile(path, target / path.name)


def _gallery() -> None:
    """``gallery.md``: every committed figure with its caption and parameters from its sidecar."""
    lines = [
        "# Figures gallery",
        "",
        "Every figure of `figures/`, as `variance-lab figures --out figures` regenerates it, with the",
        "caption and parameters stored in its JSON sidecar. `variance-lab figures --check` rebuilds",
        "them in a temporary folder and compares the data SHA-256 and library versions.",
        "",
    ]
    for side in sorted((ROOT / "figures").glob("*.json")):
        meta = json.loads(side.read_text())
        name = meta["figure"]
        params = ", ".join(f"{k} = {v}" for k, v in meta["params"].items() if not isinstance(v, list | dict))
        lines += [
            f"## {name}",
            "",
            f"```{{figure}} ../figures/{name}.png",
            ":width: 480px",
            "",
            meta["description"].replace("*", r"\*"),
            "```",
            "",
            f"Parameters: {params}." if params else "",
            f"Files: `figures/{name}.pdf`, `figures/{name}.png`, data `figures/{name}.csv`, "
            f"sidecar `{side.name}`.",
            "",
        ]
    (DOCS / "gallery.md").write_text("\n".join(lines) + "\n")


_copy_notebooks()
_gallery()


def setup(app):
    """JSON Lines code blocks of the guide highlight as JSON."""
    from pygments.lexers import JsonLexer

    app.add_lexer("jsonl", JsonLexer)
