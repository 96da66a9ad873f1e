"""What the tools that pin a framework mirror to the framework's own code share.

``tools/prime_rl_fixtures.py``, ``tools/slime_fixtures.py``, ``tools/nemo_rl_fixtures.py``,
``tools/areal_fixtures.py`` and ``tools/openrlhf_fixtures.py`` each take a checkout of the
framework at a pinned commit and a folder (:func:`checkout_args`), cut definitions out of the
framework's modules (:func:`definitions`; :func:`exec_definitions` runs them into a namespace),
run them on random batches padded to (B, T) arrays (:func:`padded`) and write ``<name>.npz`` and
``<name>.json`` (:func:`write_fixtures`, which records the commit, the SHA-256 of the files read
(:func:`file_shas`) and the torch and NumPy versions). Run as ``python tools/<tool>.py``, a tool
finds this module beside it (the script's folder is the first entry of ``sys.path``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["checkout_args", "definitions", "exec_definitions", "file_shas", "padded", "write_fixtures"]


def checkout_args(doc: str, checkout: str, about: str, argv=None) -> argparse.Namespace:
    """Parse a tool's command line: ``CHECKOUT OUT``.

    Parameters
    ----------
    doc : str
        The tool's module docstring; its first line describes the command.
    checkout : str
        The name of the first argument (and of its attribute on the result), a checkout of the
        framework.
    about : str
        Its help text (which repository, at which commit).
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        ``checkout`` and ``out`` (the folder for the fixtures), both :class:`pathlib.Path`.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(checkout, type=Path, help=about)
    parser.add_argument("out", type=Path, help="folder for the fixtures (tests/data/frameworks)")
    return parser.parse_args(argv)


def definitions(path: Path, names: set[str], kind=ast.FunctionDef) -> tuple[str, list]:
    """Return a module's text and its top-level definitions of the given names, in file order.

    Parameters
    ----------
    path : pathlib.Path
        The module's file.
    names : set of str
        The definitions wanted; each must be there.
    kind : type or tuple of types, optional
        The :mod:`ast` node class(es) of the definitions (default: functions).

    Returns
    -------
    text : str
        The file's text (cut a definition out with :func:`ast.get_source_segment`).
    found : list of ast.AST
        The definitions' nodes.

    Raises
    ------
    SystemExit
        Naming the file, the names wanted and the names found, where they differ.
    """
    text = path.read_text()
    found = [n for n in ast.parse(text).body if isinstance(n, kind) and n.name in names]
    if {n.name for n in found} != names:
        raise SystemExit(f"{path}: expected {sorted(names)}, found {[n.name for n in found]}")
    return text, found


def exec_definitions(path: Path, names, ns: dict, kind=ast.FunctionDef) -> None:
    """Execute a module's top-level definitions of ``names`` into ``ns``, in the order of ``names``.

    Each definition's own text, from its first decorator to its end (:func:`definitions`), is
    compiled with the file name ``path:line`` (so a traceback names the framework's line) and run
    in ``ns``, which must already hold what the definitions read at definition time.

    Parameters
    ----------
    path : pathlib.Path
        The module's file.
    names : sequence of str
        The definitions, each one that must be there.
    ns : dict
        The namespace, updated in place.
    kind : type or tuple of types, optional
        As for :func:`definitions`.
    """
    text, found = definitions(path, set(names), kind)
    nodes = {n.name: n for n in found}
    lines = text.splitlines(keepends=True)
    for name in names:
        node = nodes[name]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        exec(compile("".join(lines[first - 1 : node.end_lineno]), f"{path}:{first}", "exec"), ns)


def file_shas(root: Path, files: Iterable[str]) -> dict[str, str]:
    """Return each file's SHA-256 (hex), keyed by its path relative to the checkout ``root``.

    Parameters
    ----------
    root : pathlib.Path
    files : iterable of str

    Returns
    -------
    dict
    """
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in files}


def padded(samples, key: str, pad, dtype, length_key: str | None = None) -> np.ndarray:
    """Return the samples' per-token values as a (B, T) array, ``pad`` after each sample's end.

    Parameters
    ----------
    samples : sequence of dict
        One dict a sample, ``key`` giving its per-token values (or None: the row is all ``pad``).
    key : str
    pad : scalar
        The value after a sample's end.
    dtype : numpy dtype
    length_key : str, optional
        The per-token entry whose longest length is T (default: ``key``).

    Returns
    -------
    numpy.ndarray
        Shape ``(len(samples), T)``; row ``i`` holds ``samples[i][key]`` from position 0.
    """
    T = max(len(s[length_key or key]) for s in samples)
    out = np.full((len(samples), T), pad, dtype=dtype)
    for i, s in enumerate(samples):
        if s[key] is not None:
            out[i, : len(s[key])] = s[key]
    return out


def write_fixtures(
    out: Path,
    name: str,
    commit: str | None,
    shas: dict | None,
    arrays: dict,
    meta: dict,
    indent: int | None = None,
    *,
    versions: dict | None = None,
) -> None:
    """Write ``out/<name>.npz`` and ``out/<name>.json``; print their sizes.

    The JSON holds ``meta`` and, beside it, ``<name>_commit``, ``files_sha256`` and ``versions``
    (torch's and NumPy's, and ``versions``), its keys sorted.

    Parameters
    ----------
    out : pathlib.Path
        The folder (made if missing).
    name : str
        The files' stem, the framework's name (``prime_rl``, ``slime``, ``nemo_rl``).
    commit : str or None
        The framework's commit the checkout was at (None: no ``<name>_commit``, for code that
        is not read from a commit).
    shas : dict or None
        The SHA-256 of the files read (:func:`file_shas`; None: no ``files_sha256``).
    arrays : dict
        Name to array, for :func:`numpy.savez_compressed`.
    meta : dict
        The rest of the JSON.
    indent : int, optional
        The JSON's indent (default: all on one line).
    versions : dict, optional
        More package versions (TRL's, for code read from the installed package).
    """
    import torch

    head = {"versions": {**(versions or {}), "torch": torch.__version__, "numpy": np.__version__}}
    if commit is not None:
        head[f"{name}_commit"] = commit
    if shas is not None:
        head["files_sha256"] = shas
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / f"{name}.npz", **arrays)
    (out / f"{name}.json").write_text(json.dumps(head | meta, indent=indent, sort_keys=True) + "\n")
    for path in (out / f"{name}.npz", out / f"{name}.json"):
        print(f"{path}: {path.stat().st_size:,} bytes")
