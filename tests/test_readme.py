"""The README is a first page: short, its table what `variance-lab table` prints, its numbers current.

The comparison table of the README holds eight columns of the table; the guide's page
(``docs/guide/table.md``) holds the whole of it. Both are compared with the table rendered
from theory now, column by column under the same header. Measured numbers in the README are
the texts of ``docs/measurements.json`` (``docs/measurements.py`` rewrites them).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from variance_lab import theory
from variance_lab.families import get_family
from variance_lab.report.table import render

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
TABLE_PAGE = ROOT / "docs" / "guide" / "table.md"
README_MAX_BYTES = 16_000
N_THEORY_COLUMNS = 13  # T .. draws for 10% (G): the columns that do not depend on Monte Carlo


def _measurements():
    spec = importlib.util.spec_from_file_location("measurements", ROOT / "docs" / "measurements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _columns(markdown: str) -> dict[str, list[str]]:
    """Return the first pipe table of ``markdown`` as {header: cells of its numbered rows}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines if re.match(r"\| \d+ \|", ln)]
    return {name: [row[i] for row in rows] for i, name in enumerate(header)}


def _block(text: str) -> str:
    return text[text.index("<!-- table:start -->") : text.index("<!-- table:end -->")]


def _fresh() -> dict[str, list[str]]:
    return _columns(render(theory.summary(get_family("lognormal", 1.0, 0.1), [1, 10, 100, 1000])))


def test_readme_table_matches_theory():
    """Every column of the README's short table equals the same column rendered from theory now."""
    short = _columns(_block(README.read_text()))
    fresh = _fresh()
    assert len(short) >= 6
    assert set(short) <= set(fresh), set(short) - set(fresh)
    for name, cells in short.items():
        assert cells == fresh[name], name
    assert short["T"] == ["1", "10", "100", "1000"]


def test_guide_table_matches_theory():
    """The guide's full table: its theory columns equal the table rendered from theory now."""
    block = _block(TABLE_PAGE.read_text())
    page = _columns(block[: block.index("Errata")])
    fresh = _fresh()
    theory_columns = list(fresh)[:N_THEORY_COLUMNS]
    assert theory_columns[-1] == "draws for 10% (G)"
    for name in theory_columns:
        assert page[name] == fresh[name], name
    assert len(page) == 21  # and the eight Monte Carlo columns


def test_readme_is_a_first_page():
    """At most 16 kB, the command line before 400 words, no history, the guide's pages linked and present."""
    text = README.read_text()
    assert len(text.encode()) <= README_MAX_BYTES
    assert len(text[: text.index("$ make table")].split()) < 400
    for stale in ("used to take", "before this release", "python -m variance_lab.cli", "/work/"):
        assert stale not in text, stale
    links = re.findall(r"\]\(((?:docs/|CHANGELOG|CITATION|LICENSE)[^)#]*)\)", text)
    assert any(link.startswith("docs/guide/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_readme_numbers_are_current():
    """The README's measured numbers are the texts of docs/measurements.json, and name the machine."""
    m = _measurements()
    numbers = m.texts()
    text = README.read_text()
    keys = [match["key"] for match in m.MARK.finditer(text)]
    assert {"make_table", "make_test", "tour"} <= set(keys)
    assert m.stale_keys(text, numbers) == [], "run python docs/measurements.py"
    data = json.loads(m.MEASUREMENTS.read_text())
    for key in ("make_table", "make_test", "tour"):  # each names the machine it was measured on
        machine = data["numbers"][key]["values"].get("machine", data["machine"])
        assert machine in numbers[key]
        assert any(cpu in machine for cpu in ("Xeon", "EPYC")), machine


def test_measurements_refresh_rewrites_a_stale_span():
    """refresh() replaces the text of a stale span and refuses a key the JSON lacks."""
    m = _measurements()
    numbers = {"a": "new text"}
    stale = "x <!-- n:a -->old<!-- /n --> y"
    assert m.stale_keys(stale, numbers) == ["a"]
    assert m.refresh(stale, numbers) == "x <!-- n:a -->new text<!-- /n --> y"
    with pytest.raises(KeyError, match="'b'"):
        m.refresh("<!-- n:b -->?<!-- /n -->", numbers)
