r"""Parameter sweeps over family x mu x sigma^2 x T (x n), kept in a resumable SQLite store.

Cells
-----
A sweep is cut into **cells**, the unit of work, of storage and of resumption:

* a **theory cell** is one ``(family, mu, sigma2)`` point over the sweep's whole T grid:
  exact values and the derivation's approximations (:func:`variance_lab.theory.tidy`);
* a **Monte Carlo cell** is one ``(family, mu, sigma2, n, seed)`` point over the whole
  T grid: :func:`variance_lab.simulate.simulate` runs one path of ``max(T)`` tokens per
  draw and reads it at every T of the grid, so its numbers at one T depend on the
  grid. Only its ``method == "monte_carlo"`` rows are kept (theory comes from the
  theory cell).

A cell's identity is the SHA-256 of the canonical JSON (sorted keys, no spaces) of
everything that determines its result: the kind, the family's
:meth:`~variance_lab.families.Family.describe` (name, mu, sigma2 and extra parameters
such as the two-point ``q``), the T grid, the store schema, the package version, a
fingerprint of the source files that compute the cell (:func:`code_fingerprint`: in a
development tree the version stays put while the code changes), and

* theory: the target relative error of the ``n_needed_*`` rows;
* Monte Carlo: ``n``, ``seed``, ``ci``, ``independent`` and, unless ``"token"``, ``sampler``.

``workers`` is not part of it: the engine is bit-identical for any number of workers.
Consequences: changing ``n``, ``seed`` or ``ci`` recomputes the Monte Carlo cells
only; changing one ``mu`` recomputes the cells at that ``mu`` only; changing the T grid
recomputes every cell (theory included, although its values per T would not change —
the price of one simple unit); upgrading the package, or editing the theory or the
engine, recomputes the cells they compute. A cell computed with other settings or
other code is never reused.

Extra family parameters (two-point ``q``, ar1 ``rho``) are swept with ``params=``
(``--param rho=0,0.5,0.9``); each grid applies to the families that have the parameter,
and the store's ``params`` column tells their rows apart.

Unreachable points
------------------
Some families cannot reach some ``(mu, sigma2)`` (two-point with ``q = 1/2`` needs
``sigma2 < mu^2``). Such points are *not* an error: they are left out of the plan and
reported in :attr:`SweepResult.unreachable` (the command line counts and lists them),
and nothing is stored for them. A grid with no reachable point at all is an error.
A cell whose computation raises ``ValueError`` or ``ArithmeticError`` is reported in
:attr:`SweepResult.failed`, not stored, and retried by the next run.

The store
---------
One SQLite file (standard library :mod:`sqlite3`, WAL journal, ``synchronous=FULL``).
Each finished cell is written in its own transaction (its ``cells`` row and all its
``results`` rows together), so a run killed at any moment — Ctrl-C, SIGKILL, power
loss — loses at most the cell in flight, and the same command run again skips the
finished cells. Two runs may share a store: a cell finished by both is kept once.

Tables: ``meta`` (schema version), ``cells`` (one row per finished cell: identity,
canonical key, version, creation time, run time, engine provenance as JSON) and
``results`` (tidy rows, keyed by cell, T, statistic and method).
:func:`load_store` returns the tidy rows of every cell with the provenance columns
:data:`STORE_EXTRA_COLUMNS`; :func:`export` writes them to CSV or Parquet and
:func:`load_table` reads such a file back with the same dtypes.


Modules
-------
``cells`` (cells, identities, :func:`plan`), ``store`` (the SQLite store, :func:`load_store`),
``export`` (CSV and Parquet), ``run`` (:func:`sweep`), ``grid`` (the command line's grid syntax).
The module holding the planning code is ``cells``, not ``plan``, so that the function
:func:`plan` re-exported here does not shadow a submodule of the same name. The names from ``run``
are imported on first use (PEP 562): ``run`` loads the Monte Carlo engine (numba), which the
command line's parser and the other modules here do not need.
"""

from variance_lab._lazy import lazy_exports
from variance_lab.sweep.cells import Cell, code_fingerprint, extra_parameters, plan
from variance_lab.sweep.export import EXPORT_FORMATS, check_table_path, export, load_table, write_table
from variance_lab.sweep.store import DEFAULT_STORE, STORE_COLUMNS, STORE_EXTRA_COLUMNS, Store, load_store

__all__ = [
    "DEFAULT_STORE",
    "EXPORT_FORMATS",
    "STORE_COLUMNS",
    "STORE_EXTRA_COLUMNS",
    "Cell",
    "Store",
    "SweepInterrupted",
    "SweepResult",
    "check_table_path",
    "code_fingerprint",
    "compute",
    "export",
    "extra_parameters",
    "load_store",
    "load_table",
    "plan",
    "sweep",
    "write_table",
]

#: Names re-exported from ``run``, imported on first use.
__getattr__, __dir__ = lazy_exports(
    __name__, dict.fromkeys(("SweepInterrupted", "SweepResult", "compute", "sweep"), "run")
)
