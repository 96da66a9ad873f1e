"""The README's comparison table is what `variance-lab table` prints (its exact columns)."""

import re
from pathlib import Path

from variance_lab import theory
from variance_lab.families import get_family
from variance_lab.report.table import render

README = Path(__file__).parent.parent / "README.md"
N_THEORY_COLUMNS = 13  # T .. draws for 10% (G): the columns that do not depend on Monte Carlo


def _rows(markdown: str) -> list[list[str]]:
    rows = [ln for ln in markdown.splitlines() if re.match(r"\| \d+ \|", ln)]
    return [[c.strip() for c in ln.strip("|").split("|")][:N_THEORY_COLUMNS] for ln in rows]


def test_readme_table_matches_theory():
    """The README's comparison table equals the table rendered from theory now."""
    text = README.read_text()
    block = text[text.index("<!-- table:start -->") : text.index("<!-- table:end -->")]
    main_table = block[: block.index("Errata")]
    fresh = render(theory.summary(get_family("lognormal", 1.0, 0.1), [1, 10, 100, 1000]))
    assert _rows(main_table) == _rows(fresh)
    assert len(_rows(main_table)) == 4
