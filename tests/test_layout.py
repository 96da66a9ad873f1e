"""The package's layout rules, checked on its source.

No import cycle, no private name taken across modules, few modules at the top, nothing
that imports the command line, no module over MAX_LINES lines, and one module defining each
public name. ``docs/guide/development.md`` shows the rooms table that :func:`rooms_table`
renders from ``ROOMS`` (``docs/conf.py`` writes it at build time), so the page cannot drift.

Imports are read from the syntax tree, function-level imports included; importing ``a.b.c``
also runs the ``__init__`` of the subpackage ``a.b``, so that edge counts too (the root
package's ``__init__`` only re-exports and is left out). A package's lazy re-exports
(``variance_lab._lazy.lazy_exports``, PEP 562) name their modules in strings, which the
syntax tree does not show as imports: they are read from the package's ``__getattr__``.
"""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "variance_lab"
ROOT = PACKAGE.name
MAX_TOP_LEVEL_MODULES = 8
MAX_LINES = 700

#: Public names that several modules define on purpose. Only the command line's subcommand
#: protocol: each ``cli/<subcommand>.py`` defines ``add_command`` (its parser) and ``run``.
SHARED_NAMES = {
    "add_command": "cli: every subcommand module's parser hook",
    "run": "cli: every subcommand module's entry point",
}

#: The floor of each room (a top-level module or package): a room imports only rooms on its floor
#: or below (the design notes' "Rooms, from the ground up"). A new room must be given a floor here.
FLOORS = {
    "_atomic": 1,
    "_jsonl": 1,  # JSON Lines input (plain or gzip) shared by every reader
    "_lazy": 1,
    "_memory": 1,  # glibc's malloc keeps freed memory for reuse (the command line, Dask workers)
    "_validate": 1,
    "progress": 1,  # the one progress helper (progress=None/True/False)
    "schema": 1,
    "families": 1,
    "provenance": 1,  # versions, fingerprints, sidecars, PyTorch determinism (torch imported in functions)
    "stats": 1,
    "ratios": 1,  # the shared core for token log-ratios: defaults, the bound rule, weights, advantages
    "report": 1,
    "theory": 2,
    "simulate": 2,
    "corrections": 2,
    "frameworks": 2.5,  # above corrections (it maps the frameworks' names onto them), below rollouts
    "rollouts": 3,
    "integrations": 4,  # capture helpers for TRL and verl (write the rollouts Parquet format)
    "experiment": 4,
    "lm": 4,  # the pretrained-model experiment (imports experiment's sidecar and torch helpers)
    "sweep": 4,
    "paper": 4,
    "cli": 5,
}

#: What each room holds: the development page's rooms table is rendered from this and FLOORS.
ROOMS = {
    "_atomic": "atomic file writes (nothing half-written is ever left)",
    "_lazy": "lazy re-exports (PEP 562) of `variance_lab`, `rollouts`, `sweep`",
    "_jsonl": "JSON Lines input, plain or gzip, shared by every reader (a bad line names file and line)",
    "_memory": "the C library's memory policy: freed memory kept for the next array (glibc's mallopt)",
    "_validate": "input checks shared by every public function (T grids, n, seeds, paths)",
    "progress": "the one progress helper: `progress=None` a bar after a delay where someone watches, "
    "True at once, False none; the 30 s ticker of long runs",
    "provenance": "versions, fingerprints (SHA-256 of text, files, numbers), sidecars, PyTorch determinism",
    "schema": "the tidy columns shared by theory and Monte Carlo; the engine's executor and sampler names; "
    "`json_safe`, the one JSON converter",
    "families": "ratio families: K(s), log-moments, sampler codes and parameters",
    "ratios": "the shared core for token log-ratios: every clip and band default, the one bound rule with "
    "its convention (inclusive ends, log/linear/value space, float32/float64), segment sums, "
    "group advantages, the variance split",
    "stats": "statistics on arrays: intervals, one bootstrap, tails (GPD, k-hat, ESS), special functions",
    "report": "tables and figures from tidy frames only",
    "theory": "exact and approximate moments of P_T and G_T, any T: float64 and mpmath paths, frames, grid",
    "simulate": "draws, kernels, accumulators, the chunk plan, the `Engine` (threads or Dask), estimates",
    "corrections": "TIS, masks, Geo-RS, clips: weight transformations, closed forms, Monte Carlo, data",
    "frameworks": "each framework's conventions and metric names over the shared core; logged metrics",
    "rollouts": "token log-probs: batch, readers, weights, statistics, models, predictions, analysis",
    "integrations": "capture helpers for TRL and verl (write the rollouts Parquet format)",
    "experiment": "the controlled arithmetic experiment (PyTorch, optional) and what both experiments share: "
    "settings, data files and their sidecars, the torch GSPO objective",
    "lm": "the pretrained-model experiment (SmolLM2-135M; transformers, optional)",
    "sweep": "sweeps: plan and identities, SQLite store, export, run, grid syntax",
    "paper": "the figures pipeline, the notebooks' sizes and the figure names",
    "cli": "the `variance-lab` command line: parses, calls one function, formats, exits",
}


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    return mods


MODULES = _modules()


def _owner(name: str) -> str | None:
    """Return the longest known module that ``name`` (a dotted path) lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _base(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".") if is_pkg else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(module: str) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules imported, [(module, private name)] taken from another module)."""
    path, is_pkg = MODULES[module]
    edges, private = set(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == ROOT]
            edges.update(t for t in map(_owner, targets) if t)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_pkg, node)
            if base.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    edges.add(full)
                    continue
                owner = _owner(base)
                edges.add(owner)
                if alias.name.startswith("_") and not alias.name.startswith("__") and owner != module:
                    private.append((owner, alias.name))
    edges.discard(module)
    for target in list(edges):  # a.b.c runs a.b's __init__ first
        parts = target.split(".")
        for k in range(2, len(parts)):
            parent = ".".join(parts[:k])
            if parent in MODULES and not (module == parent or module.startswith(parent + ".")):
                edges.add(parent)
    return edges, private


def _lazy_imports(module: str) -> set[str]:
    """Modules that a package's lazy ``__getattr__`` (:func:`variance_lab._lazy.lazy_exports`) imports."""
    path, is_pkg = MODULES[module]
    if not is_pkg or "lazy_exports(" not in path.read_text():
        return set()
    getattr_ = importlib.import_module(module).__getattr__
    origins = inspect.getclosurevars(getattr_).nonlocals["origins"]
    return {f"{module}.{where or name}" for name, where in origins.items()}


def _graph() -> dict[str, tuple[set[str], list[tuple[str, str]]]]:
    graph = {m: _imports(m) for m in MODULES}
    for m in graph:
        graph[m][0].update(_lazy_imports(m))
    return graph


GRAPH = _graph()


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """No cycle in the package's import graph, function-level imports included."""
    assert _cycles() == []


def test_no_private_name_taken_from_another_module():
    """No module imports a private ``_name`` from another module."""
    taken = {m: GRAPH[m][1] for m in GRAPH if GRAPH[m][1]}
    assert taken == {}


def test_the_checker_sees_the_lazy_re_exports():
    """The edges of the three lazy packages are in the graph: each package imports those modules."""
    assert f"{ROOT}.theory" in GRAPH[ROOT][0]
    assert f"{ROOT}.sweep.run" in GRAPH[f"{ROOT}.sweep"][0]
    assert f"{ROOT}.rollouts.analysis" in GRAPH[f"{ROOT}.rollouts"][0]
    lazy = {m for m in MODULES if _lazy_imports(m)}
    assert lazy == {ROOT, f"{ROOT}.sweep", f"{ROOT}.rollouts"}


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_room_has_a_floor():
    """Each top-level module and package of the source has a floor in FLOORS."""
    rooms = {_room(m) for m in MODULES if m != ROOT}
    assert sorted(rooms - set(FLOORS)) == []


def test_imports_point_down_the_floors():
    """No room imports a room on a higher floor (the root package only re-exports and is left out)."""
    up = sorted(
        (m, t)
        for m in GRAPH
        if m != ROOT
        for t in GRAPH[m][0]
        if t != ROOT and FLOORS.get(_room(t), 0) > FLOORS.get(_room(m), 0)
    )
    assert up == []


def test_few_modules_at_the_top():
    """The package has at most MAX_TOP_LEVEL_MODULES top-level modules."""
    top = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    assert len(top) <= MAX_TOP_LEVEL_MODULES, sorted(top)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith(f"{ROOT}.cli")))
def test_nothing_imports_the_command_line(module):
    """No module outside ``cli`` imports the command line."""
    assert not any(t == f"{ROOT}.cli" or t.startswith(f"{ROOT}.cli.") for t in GRAPH[module][0])


def test_the_checker_sees_a_cycle_and_a_private_import(tmp_path, monkeypatch):
    """The checker itself: a planted cycle and a planted private import are found."""
    pkg = tmp_path / ROOT
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(f"from {ROOT}.sub.b import _hidden\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(f"def f():\n    from {ROOT} import a\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", pkg)
    monkeypatch.setattr(f"{__name__}.MODULES", _modules())
    monkeypatch.setattr(f"{__name__}.GRAPH", {m: _imports(m) for m in _modules()})
    assert _cycles() == [[f"{ROOT}.a", f"{ROOT}.sub.b"]]
    assert GRAPH[f"{ROOT}.a"][1] == [(f"{ROOT}.sub.b", "_hidden")]


def test_the_rollouts_table_names_every_module():
    """The module table in ``rollouts/__init__.py``'s docstring lists each module of the package, once."""
    doc = importlib.import_module(f"{ROOT}.rollouts").__doc__
    listed = [line.split()[0].strip("`") for line in doc.splitlines() if line.startswith("``")]
    modules = sorted(p.stem for p in (PACKAGE / "rollouts").glob("*.py") if p.stem != "__init__")
    assert sorted(listed) == modules


def _public_definitions() -> dict[str, list[str]]:
    """Map each public top-level name (function, class, assigned constant) to the modules defining it."""
    defined: dict[str, list[str]] = {}
    for module, (path, _) in sorted(MODULES.items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    defined.setdefault(name, []).append(module)
    return defined


def test_one_module_defines_each_public_name():
    """A public name is defined in one module (the others import it), but for ``SHARED_NAMES``."""
    twice = {
        name: mods
        for name, mods in _public_definitions().items()
        if len(mods) > 1 and not (name in SHARED_NAMES and all(m.startswith(f"{ROOT}.cli.") for m in mods))
    }
    assert twice == {}


def test_the_checker_sees_a_name_defined_twice(tmp_path, monkeypatch):
    """The checker itself: a function and a constant defined in two modules are found."""
    pkg = tmp_path / ROOT
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("LIMIT = 1\n\ndef f():\n    pass\n")
    (pkg / "b.py").write_text("LIMIT: int = 2\n\nclass f:\n    pass\n\n_private = 3\n")
    monkeypatch.setattr(
        f"{__name__}.MODULES", {f"{ROOT}.a": (pkg / "a.py", False), f"{ROOT}.b": (pkg / "b.py", False)}
    )
    assert _public_definitions() == {"LIMIT": [f"{ROOT}.a", f"{ROOT}.b"], "f": [f"{ROOT}.a", f"{ROOT}.b"]}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_too_long(module):
    """No module passes MAX_LINES lines: a longer one holds more than one concept."""
    lines = len(MODULES[module][0].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def rooms_table() -> str:
    """Render the rooms table of ``docs/guide/development.md`` from ``FLOORS`` and ``ROOMS``."""
    rows = ["| floor | room | holds |", "|---|---|---|"]
    for room in sorted(FLOORS, key=lambda r: (FLOORS[r], r.lstrip("_"))):
        path = PACKAGE / room
        shown = f"`{ROOT}/{room}/`" if path.is_dir() else f"`{ROOT}/{room}.py`"
        rows.append(f"| {FLOORS[room]:g} | {shown} | {ROOMS[room]} |")
    return "\n".join(rows) + "\n"


def test_every_room_is_described():
    """Each room of FLOORS has a line in ROOMS (the development page's table) and exists."""
    assert sorted(FLOORS) == sorted(ROOMS)
    missing = [r for r in FLOORS if not (PACKAGE / r).is_dir() and not (PACKAGE / f"{r}.py").is_file()]
    assert missing == []


def test_the_development_page_includes_the_rooms_table():
    """The development page includes the generated table rather than a hand-kept copy."""
    page = (PACKAGE.parent / "docs" / "guide" / "development.md").read_text()
    assert "_generated/rooms.md" in page
    assert "| floor | room | holds |" not in page


def test_tests_mirror_the_packages():
    """Each folder of ``tests/`` is named for a source package (``tests/<package>/test_<module>.py``)."""
    tests = PACKAGE.parent / "tests"
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders, "tests/ has no package folders"
    assert [f for f in folders if f not in packages] == []
