"""The README and the guide keep their commands runnable and their links alive.

Every ``$ `` line of a ``console`` block in README.md and docs/guide/*.md is checked:
``make TARGET`` names a target of the Makefile, and ``variance-lab ...`` parses with the
command line's own parser. The quick ones (theory only: ``table --n 0``, ``corrections``
without Monte Carlo or data, ``--help``) also run, in a temporary folder. The analysis
tables of the experiment page are what ``variance-lab analyze`` prints (slow: 40 s).
``docs/check_links.py`` (run by ``make docs``) is tested on a small site. The frameworks page's
coverage cells are what ``tools/framework_coverage.py`` measures on the fixtures.
"""

import contextlib
import copy
import importlib.util
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from variance_lab.cli import build_parser, main

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md")), ROOT / "docs" / "index.md"]
FENCE = re.compile(r"^```console\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _commands() -> list[tuple[str, str]]:
    """(page, command) for every ``$ `` line of every console block."""
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for line in block.splitlines():
                if line.startswith("$ "):
                    found.append((page.relative_to(ROOT).as_posix(), line[2:].strip()))
    return found


COMMANDS = _commands()


def _is_quick(argv: list[str]) -> bool:
    """Theory only: runs in about a second in-process."""
    if "--help" in argv:
        return True
    if argv[0] == "table":
        return "--n" in argv and argv[argv.index("--n") + 1] == "0"
    if argv[0] == "corrections":
        return "--n" not in argv and "--data" not in argv
    return False


def test_console_blocks_are_found():
    """The README's set-up and tour and the guide's pages have console blocks (so the checks below bite)."""
    pages = {page for page, _ in COMMANDS}
    assert "README.md" in pages
    assert "docs/guide/python.md" in pages
    assert ("README.md", "make table") in COMMANDS
    assert ("README.md", "make test") in COMMANDS
    assert sum(cmd.startswith("variance-lab ") for _, cmd in COMMANDS) >= 10


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:40]}" for p, c in COMMANDS])
def test_console_command_parses(page, command):
    """Each command is a Makefile target or a variance-lab command line that parses."""
    words = shlex.split(command)
    if words[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        target = re.search(rf"^{re.escape(words[1])}:", makefile, re.MULTILINE)
        assert target, f"{page}: no make target {words[1]}"
        return
    assert words[0] == "variance-lab", f"{page}: write commands as `variance-lab ...`: {command}"
    args = build_parser().parse_args(words[1:])
    assert callable(args.func)


QUICK = [(p, c) for p, c in COMMANDS if c.startswith("variance-lab ") and _is_quick(shlex.split(c)[1:])]


def test_some_commands_are_quick():
    """At least the tour's theory-only table and the corrections question run below."""
    assert len(QUICK) >= 2


@pytest.mark.parametrize(("page", "command"), QUICK, ids=[f"{p}:{c[:40]}" for p, c in QUICK])
def test_quick_console_command_runs(page, command, tmp_path, monkeypatch):
    """A theory-only command of the docs exits 0 and prints a table."""
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(shlex.split(command)[1:])
        except SystemExit as exc:  # --help
            status = exc.code
    assert status == 0, f"{page}: {command}: {err.getvalue()}"
    assert "|" in out.getvalue() or "usage" in out.getvalue()


def test_no_module_invocation_in_docs():
    """One spelling of the command line: `variance-lab`, never `python -m variance_lab.cli`."""
    for page in PAGES:
        assert "python -m variance_lab.cli" not in page.read_text(), page.name


def _analysis_tables(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("|")]


@pytest.mark.slow
def test_experiment_page_tables_are_what_analyze_prints(tmp_path, monkeypatch):
    """The experiment page's two tables are the first two tables `variance-lab analyze` prints."""
    page = (ROOT / "docs" / "guide" / "experiment.md").read_text()
    block = page[page.index("<!-- analyze:start -->") : page.index("<!-- analyze:end -->")]
    shown = _analysis_tables(block)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(["analyze", str(ROOT / "data" / "arith_rollouts.jsonl.gz")])
    assert status == 0
    printed = _analysis_tables(out.getvalue())
    assert len(shown) == 16
    assert shown == printed[:16]


def _check_links():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs" / "check_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_links_finds_dead_files_and_anchors(tmp_path):
    """A missing page and a missing #anchor are reported; good links and absolute URLs are not."""
    (tmp_path / "guide").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="guide/a.html#part">ok</a><a href="guide/a.html#gone">dead anchor</a>'
        '<a href="guide/missing.html">dead page</a><a href="https://example.org/x#y">web</a>'
        '<a href="#top">self</a><a href="#nowhere">dead self</a><img src="img.png">'
    )
    page_a = '<section id="part"><a href="../index.html#top">up</a></section>'
    (tmp_path / "guide" / "a.html").write_text(page_a)
    (tmp_path / "img.png").write_bytes(b"")
    dead = _check_links().dead_links(tmp_path)
    assert sorted(dead) == sorted(
        [
            "index.html: guide/a.html#gone (no #gone in a.html)",
            "index.html: guide/missing.html (no such file)",
            "index.html: #nowhere (no #nowhere in index.html)",
        ]
    )
    assert _check_links().main([str(tmp_path)]) == 1
    assert _check_links().main([str(tmp_path / "guide")]) == 0


def test_guide_substitutions_are_measured_numbers():
    """Every ``{{ KEY }}`` of the guide names a measurement of docs/measurements.json, and some are used."""
    spec = importlib.util.spec_from_file_location("measurements", ROOT / "docs" / "measurements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = set(module.texts())
    used = {key for page in PAGES[1:] for key in re.findall(r"\{\{ *([a-z0-9_]+) *\}\}", page.read_text())}
    assert {"make_table", "make_test", "analyze_arith", "float_rates_heavy"} <= used
    assert used <= known, used - known


def _framework_coverage(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "framework_coverage", ROOT / "tools" / "framework_coverage.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_framework_coverage_numbers_are_what_the_fixtures_give(monkeypatch):
    """The frameworks page's coverage cells are tools/framework_coverage.py's measurement of the fixtures now.

    Each mirror runs on its framework's fixtures again; the decision counts and the families must
    be docs/measurements.json's, each worst difference within a factor of 2 of it (or both below
    1e-12, float64 rounding). The page quotes every coverage_* measurement.
    """
    fc = _framework_coverage(monkeypatch)
    measured = fc.measurements(fc.measure())
    documented = json.loads((ROOT / "docs" / "measurements.json").read_text())["numbers"]
    assert fc.drift(measured, documented) == [], "run python tools/framework_coverage.py --write"
    assert len(measured) == 14
    page = (ROOT / "docs" / "guide" / "frameworks.md").read_text()
    assert [k for k in measured if "{{ " + k + " }}" not in page] == []
    # teeth: one decision more, a worst difference 10 times smaller, a family gone, a key gone
    key = "coverage_prime_rl_float32"
    for field, value in (("ipo_loss_fn_mask_differ", "2"), ("metrics_rel", "1.3e-03")):
        changed = copy.deepcopy(documented)
        changed[key]["values"][field] = value
        assert fc.drift(measured, changed) == [key], field
    changed = copy.deepcopy(documented)
    changed[key]["template"] = changed[key]["template"].replace("fractions and counts: exact; ", "")
    assert fc.drift(measured, changed) == [key]
    del changed["coverage_areal_float32"]
    assert fc.drift(measured, changed) == [key, "coverage_areal_float32"]
    changed = copy.deepcopy(documented)
    changed[key]["values"]["metrics_where"] = "elsewhere"  # where the worst lies may move
    assert fc.drift(measured, changed) == []
