"""Sphinx configuration of the variance_lab documentation site (``make docs``).

The notebooks are copied from ``notebooks/`` and executed at build time in quick mode
(``VARIANCE_LAB_QUICK=1``); the figures gallery is written from the committed
``figures/*.json`` sidecars; the API reference comes from the numpydoc docstrings.
MathJax is copied from the ``django-static-mathjax`` package (PyPI; the official MathJax
distribution, no Django needed) into the build, so the pages show formulas offline.
Measured numbers quoted in the guide come from ``docs/measurements.json`` as MyST
substitutions (``{{ name }}``), the same file ``docs/measurements.py`` writes into the README.
"""

import importlib.resources
import importlib.util
import json
import os
import shutil
import struct
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
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "guide/_generated"]
# .rst first: autosummary writes its generated API pages with the first suffix
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
html_theme = "alabaster"
html_theme_options = {"page_width": "1100px", "sidebar_width": "230px"}
# _static: the site's style sheet; _build/mathjax_static: MathJax, copied at build time (below)
MATHJAX_STATIC = DOCS / "_build" / "mathjax_static"
html_static_path = ["_static", str(MATHJAX_STATIC)]
html_css_files = ["variance_lab.css"]
# MathJax from this build, not a CDN: relative to _static (SVG output needs no web fonts)
mathjax_path = "mathjax/tex-svg.js"

# MyST: $...$ and $$...$$ math as in the notebooks; {{ name }} substitutions from measurements.json
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "substitution"]
myst_heading_anchors = 3
# a link to a missing page or anchor is a warning, and -W makes it an error (make docs)
_spec = importlib.util.spec_from_file_location("measurements", DOCS / "measurements.py")
_measurements = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_measurements)
myst_substitutions = _measurements.texts()

# notebooks: executed at build time, quick mode, an error fails the build
nb_execution_mode = os.environ.get("VARIANCE_LAB_DOCS_EXECUTE", "force")  # "off" for a fast draft
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# display(Markdown(...)) outputs: parsed as MyST, so their pipe tables are tables and $...$ is math
nb_render_markdown_format = "myst"

# API reference from numpydoc docstrings
autosummary_generate = True
autosummary_imported_members = False
# each object documented once, in the module that defines it (packages re-export names in __all__)
autodoc_default_options = {"members": True, "ignore-module-all": True, "show-inheritance": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False


def _write_rooms_table() -> None:
    """Write the development page's rooms table from the layout test's ``FLOORS`` and ``ROOMS``.

    The layout test is the one place that says which room sits on which floor; the page
    includes the table written here, so it shows what the test enforces.
    """
    spec = importlib.util.spec_from_file_location("layout_rules", ROOT / "tests" / "test_layout.py")
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    target = DOCS / "guide" / "_generated"
    target.mkdir(exist_ok=True)
    (target / "rooms.md").write_text(layout.rooms_table())


def _write_conventions_table() -> None:
    """Write the frameworks page's conventions table from the mirrors' own rule objects."""
    from variance_lab.frameworks.conventions import conventions_table

    target = DOCS / "guide" / "_generated"
    target.mkdir(exist_ok=True)
    (target / "conventions.md").write_text(conventions_table())


def _copy_notebooks() -> None:
    """Copy the notebooks (stored without outputs) where Sphinx reads them."""
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copyfile(path, target / path.name)


def _mathjax() -> None:
    """Copy MathJax 3 (its ``es5`` build, ``tex-svg.js`` and the parts it loads) into the build.

    The files come from the ``django-static-mathjax`` package of the ``docs`` extra; the
    other combined bundles and the CHTML fonts are left out (the SVG output draws glyphs
    as paths).
    """
    es5 = Path(str(importlib.resources.files("mathjax") / "static" / "mathjax" / "es5"))
    if not (es5 / "tex-svg.js").is_file():
        raise RuntimeError(f"MathJax not found at {es5}: pip install -e '.[docs]'")
    target = MATHJAX_STATIC / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copyfile(es5 / "tex-svg.js", target / "tex-svg.js")
    for part in ("input", "ui", "a11y", "sre", "adaptors"):
        shutil.copytree(es5 / part, target / part)
    shutil.copytree(es5 / "output", target / "output", ignore=shutil.ignore_patterns("chtml*"))


def _png_width(path: Path) -> int:
    """Width in pixels of a PNG image, read from its header."""
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


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
        # one-column figures at about 0.72 of their pixels (the old 480 px); two-column ones
        # (about 7 in wide) across the page, so their panels are as large as one column's
        png = _png_width(ROOT / "figures" / f"{name}.png")
        width = "100%" if png > 1000 else f"{round(0.72 * png)}px"
        params = ", ".join(f"{k} = {v}" for k, v in meta["params"].items() if not isinstance(v, list | dict))
        lines += [
            f"## {name}",
            "",
            f"```{{figure}} ../figures/{name}.png",
            f":width: {width}",
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


_write_rooms_table()
_write_conventions_table()
_copy_notebooks()
_mathjax()
_gallery()


def setup(app):
    """JSON Lines code blocks of the guide highlight as JSON."""
    from pygments.lexers import JsonLexer

    app.add_lexer("jsonl", JsonLexer)
