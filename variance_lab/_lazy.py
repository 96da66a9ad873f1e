"""Lazy re-exports (PEP 562): a package's names imported from their modules on first use.

``variance_lab``, ``variance_lab.rollouts`` and ``variance_lab.sweep`` re-export names whose
modules are slow to import (pandas, scipy.optimize, numba); building the command line's parser
needs none of them. Each package hands its names to :func:`lazy_exports` and binds the
two functions it returns as its module-level ``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module

__all__ = ["lazy_exports"]


def lazy_exports(package: str, origins: Mapping[str, str | None]) -> tuple[Callable, Callable]:
    """Return a package's ``(__getattr__, __dir__)`` that import ``origins``' names on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    origins : mapping of str to str or None
        Each lazy name -> the submodule that holds it; ``None``: the name is a submodule of
        its own (``{"theory": None}``).

    Returns
    -------
    (__getattr__, __dir__) : tuple of callables
        ``__getattr__`` imports the name, binds it on the package (so that it is looked up
        once) and returns it; any other name raises ``AttributeError``. ``__dir__`` lists the
        package's names and its ``__all__``, the not yet imported ones included.
    """

    def __getattr__(name: str):
        if name not in origins:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = origins[name]
        module = import_module(f"{package}.{where or name}")
        value = module if where is None else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        module = sys.modules[package]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __getattr__, __dir__
