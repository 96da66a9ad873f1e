r"""Parameter sweeps over family x mu x sigma^2 x T (x n), kept in a resumable SQLite store.

Cells
-----
A sweep is cut into **cells**, the unit of work, of storage and of resumption:

* a **theory cell** is one ``(family, mu, sigma2)`` point over the sweep's whole T grid:
  exact values and the seed's approximations (:func:`variance_lab.theory.tidy`);
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
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import __version__, theory
from variance_lab._atomic import atomic_write
from variance_lab._validate import check_finite, check_positive, check_T
from variance_lab.families import FAMILIES, Family, get_family
from variance_lab.schema import TIDY_COLUMNS

__all__ = [
    "DEFAULT_STORE",
    "STORE_EXTRA_COLUMNS",
    "STORE_COLUMNS",
    "Cell",
    "Store",
    "SweepInterrupted",
    "SweepResult",
    "plan",
    "sweep",
    "load_store",
    "load_table",
    "export",
]

#: Store path used when none is given, relative to the working directory.
DEFAULT_STORE = "variance_lab.sqlite"
#: Version of the store layout; part of every cell identity.
SCHEMA_VERSION = 1
#: Columns added to the tidy schema by the store: the family's extra parameters as
#: canonical JSON (``{"q":0.5}`` for two-point, ``{}`` for lognormal), draws (0 for
#: theory), seed (missing for theory), cell identity, package version and creation time
#: (ISO 8601, UTC).
STORE_EXTRA_COLUMNS = ("params", "n", "seed", "cell", "version", "created")
STORE_COLUMNS = TIDY_COLUMNS + STORE_EXTRA_COLUMNS

_FLOAT_COLUMNS = ("mu", "sigma2", "value", "log10_value", "lo", "hi", "se")
_STR_COLUMNS = ("family", "statistic", "method", "reason", "params", "cell", "version", "created")
_SORT = ["family", "mu", "sigma2", "params", "n", "seed", "cell", "T", "statistic", "method"]

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    cell TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    family TEXT NOT NULL,
    mu REAL NOT NULL,
    sigma2 REAL NOT NULL,
    params TEXT NOT NULL,
    n INTEGER NOT NULL,
    seed INTEGER,
    key TEXT NOT NULL,
    version TEXT NOT NULL,
    created TEXT NOT NULL,
    elapsed_s REAL NOT NULL,
    provenance TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    cell TEXT NOT NULL REFERENCES cells(cell),
    T INTEGER NOT NULL,
    statistic TEXT NOT NULL,
    method TEXT NOT NULL,
    value REAL,
    log10_value REAL,
    lo REAL,
    hi REAL,
    se REAL,
    reliable INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (cell, T, statistic, method)
) WITHOUT ROWID;
"""


# --------------------------------------------------------------------------- cells
#: Source files whose code determines a cell's numbers, per kind (relative to the package).
RESULT_SOURCES = {
    "theory": ("families.py", "theory.py", "_validate.py", "schema.py"),
    "monte_carlo": (
        "families.py",
        "theory.py",
        "_validate.py",
        "schema.py",
        "stats.py",
        "estimates.py",
        "simulate",
    ),
}


@functools.cache
def code_fingerprint(kind: str) -> str:
    """SHA-256 of the source files that compute a cell of this kind (:data:`RESULT_SOURCES`).

    Part of every cell identity, beside the package version: in a development tree the
    version does not change when the code does, and a store must not reuse numbers that
    older code computed. Read once per process.
    """
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in RESULT_SOURCES[kind]:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Cell:
    """One unit of work: theory or Monte Carlo for one family over one T grid.

    Parameters
    ----------
    kind : {"theory", "monte_carlo"}
    family : Family
    T : tuple of int
        The sorted T grid.
    n : int
        Draws (0 for theory).
    seed : int or None
        Root seed (None for theory, whose result does not depend on it).
    options : tuple of (str, value)
        Other settings that determine the result (``target``; ``ci``, ``independent``).
    """

    kind: str
    family: Family
    T: tuple[int, ...]
    n: int = 0
    seed: int | None = None
    options: tuple = ()

    def key(self) -> dict:
        """Everything that determines the cell's result, as a plain dict."""
        return {
            "kind": self.kind,
            "family": self.family.describe(),
            "T": list(self.T),
            "n": self.n,
            "seed": self.seed,
            **dict(self.options),
            "schema": SCHEMA_VERSION,
            "version": __version__,
            "code": code_fingerprint(self.kind),
        }

    def key_json(self) -> str:
        """Canonical JSON of :meth:`key`: sorted keys, no spaces, no NaN."""
        return json.dumps(self.key(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @property
    def id(self) -> str:
        """SHA-256 (hex) of :meth:`key_json`."""
        return hashlib.sha256(self.key_json().encode()).hexdigest()

    def family_params(self) -> str:
        """Canonical JSON of the family's extra parameters (``{"q":0.5}``; ``{}`` when none)."""
        extra = {k: v for k, v in self.family.describe().items() if k not in ("family", "mu", "sigma2")}
        return json.dumps(extra, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        """Short human-readable description."""
        fam = self.family
        extra = "".join(f" {k}={v:g}" for k, v in json.loads(self.family_params()).items())
        mc = f" n={self.n} seed={self.seed}" if self.kind == "monte_carlo" else ""
        return f"{self.kind} {fam.name} mu={fam.mu:g} sigma2={fam.sigma2:g}{extra}{mc}"


@dataclass
class Plan:
    """The cells of a sweep grid and the points no family can reach.

    Attributes
    ----------
    cells : list of Cell
    unreachable : list of dict
        ``{"family", "mu", "sigma2", "reason"}`` per unreachable point.
    """

    cells: list[Cell]
    unreachable: list[dict]


def _as_list(values, name: str) -> list:
    if isinstance(values, str) or np.ndim(values) == 0:
        values = [values]
    out = list(np.asarray(values).ravel().tolist())
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


def _check_ns(n) -> list[int]:
    out = []
    for v in _as_list(n, "n"):
        if isinstance(v, bool) or not float(v).is_integer() or v < 0 or v == 1:
            raise ValueError(f"n must be 0 (theory only) or an integer >= 2, got {v!r}")
        out.append(int(v))
    return sorted(set(out))


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _check_variance(value) -> float:
    value = check_finite("sigma2", value)
    if value < 0:
        raise ValueError(f"sigma2 must be >= 0, got {value!r}")
    return value


def _check_unit_interval(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def extra_parameters(name: str) -> tuple[str, ...]:
    """Names of a family's parameters besides ``mu`` and ``sigma2`` (``q``, ``rho``, ...)."""
    return tuple(f.name for f in dataclasses.fields(FAMILIES[name]) if f.name not in ("mu", "sigma2"))


def _extra_grids(names: list[str], params: Mapping[str, object] | None) -> dict[str, list[dict]]:
    """Per family, the list of extra-parameter dicts to sweep (``[{}]`` when none applies)."""
    params = dict(params or {})
    used = set()
    out = {}
    for name in names:
        keys = sorted(k for k in params if k in extra_parameters(name))
        used.update(keys)
        values = [sorted({check_finite(k, v) for v in _as_list(params[k], k)}) for k in keys]
        out[name] = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    unused = sorted(set(params) - used)
    if unused:
        raise ValueError(f"parameter {unused[0]!r} applies to none of the families {', '.join(names)}")
    return out


def plan(
    families: str | Sequence[str] = "lognormal",
    mu=1.0,
    sigma2=0.1,
    T=(1, 10, 100, 1000),
    n=0,
    *,
    seed: int = 0,
    independent: bool = False,
    ci: float = 0.95,
    target: float = theory.DEFAULT_TARGET,
    params: Mapping[str, object] | None = None,
    sampler: str = "token",
) -> Plan:
    """Expand a grid into cells, validating every input.

    Parameters are those of :func:`sweep`. Returns a :class:`Plan`; raises
    ``ValueError`` for bad input or when no point of the grid is reachable.
    """
    names = list(dict.fromkeys(_as_list(families, "families")))
    for name in names:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}")
    Ts = tuple(int(t) for t in check_T(_as_list(T, "T"), grid=True))
    ns = _check_ns(n)
    seed = _check_seed(seed)
    ci = _check_unit_interval("ci", ci)
    if not isinstance(target, int | float) or not 0 < target < math.inf:
        raise ValueError(f"target must be a finite number > 0, got {target!r}")
    if sampler not in ("token", "aggregate", "auto"):
        raise ValueError(f"sampler must be one of token, aggregate, auto, got {sampler!r}")
    mc_options = (("ci", ci), ("independent", bool(independent)))
    if sampler != "token":  # part of the identity; token cells keep their key
        mc_options += (("sampler", sampler),)
    mus = sorted({check_positive("mu", m) for m in _as_list(mu, "mu")})
    sigma2s = sorted({_check_variance(s2) for s2 in _as_list(sigma2, "sigma2")})
    extras = _extra_grids(names, params)
    cells, unreachable = [], []
    for name in names:
        for extra in extras[name]:
            get_family(name, 1.0, 0.0, **extra)  # a bad extra parameter is an error, not unreachable
            for m in mus:
                for s2 in sigma2s:
                    try:
                        family = get_family(name, m, s2, **extra)
                    except ValueError as exc:  # valid inputs the family cannot reach
                        unreachable.append(
                            {"family": name, "mu": m, "sigma2": s2, **extra, "reason": str(exc)}
                        )
                        continue
                    cells.append(Cell("theory", family, Ts, options=(("target", float(target)),)))
                    cells += [Cell("monte_carlo", family, Ts, k, seed, mc_options) for k in ns if k > 0]
    if not cells:
        raise ValueError(f"no reachable point in the grid: {unreachable[0]['reason']}")
    return Plan(cells, unreachable)


# --------------------------------------------------------------------------- compute
def _simulate():
    """The engine's ``simulate``, or ``None`` when this build has no Monte Carlo engine."""
    try:
        from variance_lab.simulate import simulate
    except ImportError:
        return None
    return simulate


def compute(cell: Cell, *, workers: int | None = None, client=None) -> tuple[pd.DataFrame, dict]:
    """Compute one cell: its tidy rows and its provenance (a JSON-able dict).

    ``workers`` (threads) or ``client`` (a Dask client) say where Monte Carlo chunks run.
    """
    if cell.kind == "theory":
        options = dict(cell.options)
        frame = theory.tidy(cell.family, list(cell.T), target=options["target"])
        return frame, {"engine": "theory"}
    simulate = _simulate()
    if simulate is None:
        raise RuntimeError("Monte Carlo engine variance_lab.simulate is not available")
    options = dict(cell.options)
    frame = simulate(
        cell.family,
        list(cell.T),
        cell.n,
        seed=cell.seed,
        workers=workers,
        independent=options["independent"],
        ci=options["ci"],
        progress=False,
        client=client,
        sampler=options.get("sampler", "token"),
    )
    provenance = frame.attrs.get("provenance", {})
    frame = frame[frame["method"] == "monte_carlo"]
    return frame, provenance


# --------------------------------------------------------------------------- store
def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def _db_float(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


class Store:
    """A sweep store: one SQLite file. Use as a context manager.

    Parameters
    ----------
    path : str or Path
        The SQLite file; created (with its tables) when missing.
    create : bool
        If false, a missing file is an error instead of being created.
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = True) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"store {str(self.path)!r} is a directory")
        if not self.path.exists():
            if not create:
                raise ValueError(f"store {str(self.path)!r} does not exist")
            if not self.path.parent.is_dir():
                raise ValueError(f"store {str(self.path)!r}: folder {str(self.path.parent)!r} does not exist")
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=60)
        except sqlite3.Error as exc:
            raise ValueError(f"store {str(self.path)!r} cannot be opened: {exc}") from None
        try:
            self._setup()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise ValueError(f"store {str(self.path)!r} is not a variance_lab store: {exc}") from None

    def _setup(self) -> None:
        c = self._conn
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("PRAGMA foreign_keys=ON")
        c.executescript(_DDL)
        row = c.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            c.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {row[0]}, this version reads {SCHEMA_VERSION}")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._conn.close()

    def finished(self) -> set[str]:
        """Identities of every finished cell."""
        return {r[0] for r in self._conn.execute("SELECT cell FROM cells")}

    def put(self, cell: Cell, frame: pd.DataFrame, provenance: dict, elapsed_s: float) -> bool:
        """Store a finished cell and its rows in one transaction.

        Returns False (and writes nothing) if the cell is already stored, for example
        by a concurrent run.
        """
        fam = cell.family
        prov = json.dumps(provenance, default=_json_default, sort_keys=True)
        cell_row = (
            cell.id,
            cell.kind,
            fam.name,
            fam.mu,
            fam.sigma2,
            cell.family_params(),
            cell.n,
            cell.seed,
            cell.key_json(),
            __version__,
            _now(),
            float(elapsed_s),
            prov,
        )
        rows = [
            (
                cell.id,
                int(r.T),
                r.statistic,
                r.method,
                _db_float(r.value),
                _db_float(r.log10_value),
                _db_float(r.lo),
                _db_float(r.hi),
                _db_float(r.se),
                int(bool(r.reliable)),
                str(r.reason),
            )
            for r in frame.itertuples(index=False)
        ]
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            cur = c.execute("INSERT OR IGNORE INTO cells VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", cell_row)
            if cur.rowcount == 0:
                c.execute("ROLLBACK")
                return False
            c.executemany("INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        return True

    def frame(self, cells: Iterable[str] | None = None) -> pd.DataFrame:
        """Tidy rows with provenance columns (:data:`STORE_COLUMNS`), sorted by content.

        Parameters
        ----------
        cells : iterable of str, optional
            Only these cell identities (default: every cell).
        """
        sql = (
            "SELECT c.family, c.mu, c.sigma2, r.T, r.statistic, r.method, r.value, r.log10_value, r.lo, "
            "r.hi, r.se, r.reliable, r.reason, c.params, c.n, c.seed, c.cell, c.version, c.created "
            "FROM results r JOIN cells c ON c.cell = r.cell"
        )
        records = self._conn.execute(sql).fetchall()
        frame = pd.DataFrame.from_records(records, columns=list(STORE_COLUMNS))
        if cells is not None:
            frame = frame[frame["cell"].isin(set(cells))]
        return _normalise(frame)

    def cells(self) -> pd.DataFrame:
        """One row per finished cell: identity, kind, parameters, key, timing, provenance."""
        cur = self._conn.execute("SELECT * FROM cells ORDER BY created, cell")
        return pd.DataFrame.from_records(cur.fetchall(), columns=[d[0] for d in cur.description])


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Fixed dtypes and a content order, so that equal stores give equal frames."""
    out = pd.DataFrame(index=range(len(frame)))
    src = frame.reset_index(drop=True)
    for col in STORE_COLUMNS:
        values = src[col] if col in src else pd.Series([None] * len(src))
        if col in _FLOAT_COLUMNS:
            out[col] = pd.to_numeric(values, errors="raise").astype("float64")
        elif col in ("T", "n"):
            out[col] = values.astype("int64")
        elif col == "seed":
            out[col] = pd.array([None if pd.isna(v) else int(v) for v in values], dtype="Int64")
        elif col == "reliable":
            out[col] = values.map(lambda v: str(v) in ("1", "True", "true")).astype(bool)
        else:
            out[col] = values.map(_text).astype(str)
    if len(out):
        out = out.sort_values(_SORT, kind="mergesort", na_position="first").reset_index(drop=True)
    return out


def load_store(path: str | os.PathLike) -> pd.DataFrame:
    """Every result in a store as one tidy DataFrame (:data:`STORE_COLUMNS`).

    Parameters
    ----------
    path : str or Path
        An existing store.

    Returns
    -------
    pandas.DataFrame
        Tidy rows plus ``params`` (extra family parameters, JSON), ``n``, ``seed``
        (missing for theory), ``cell``, ``version`` and ``created``, sorted by content.
        Rows of two cells may share (family, mu, sigma2, T, statistic, method) when the
        store holds several sweeps (other n, seed or T grid); the extra columns tell
        them apart.
    """
    with Store(path, create=False) as store:
        return store.frame()


# --------------------------------------------------------------------------- export
EXPORT_FORMATS = ("csv", "parquet")


def _format_of(path: Path, fmt: str | None) -> str:
    fmt = fmt or path.suffix.lower().lstrip(".")
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"cannot tell the format of {str(path)!r}: use a .csv or .parquet name")
    return fmt


def _parquet_engine() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("Parquet needs pyarrow: pip install pyarrow") from None


def write_table(frame: pd.DataFrame, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Write a store frame to CSV or Parquet atomically (format from the suffix by default)."""
    path = Path(path)
    fmt = _format_of(path, fmt)
    if path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a directory")
    if not path.parent.is_dir():
        raise ValueError(f"--out {str(path)!r}: folder {str(path.parent)!r} does not exist")
    if fmt == "parquet":
        _parquet_engine()
    if fmt == "csv":
        return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, na_rep="nan"))
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def export(store: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None) -> pd.DataFrame:
    """Write every result of ``store`` to ``out`` (``.csv`` or ``.parquet``); returns the frame."""
    frame = load_store(store)
    write_table(frame, out, fmt)
    return frame


def load_table(path: str | os.PathLike, fmt: str | None = None) -> pd.DataFrame:
    """Read a file written by :func:`export` back, with the store's dtypes and order."""
    path = Path(path)
    fmt = _format_of(path, fmt)
    if not path.is_file():
        raise ValueError(f"{str(path)!r} does not exist")
    if fmt == "parquet":
        _parquet_engine()
        return _normalise(pd.read_parquet(path))
    na = {col: ["nan"] for col in (*_FLOAT_COLUMNS, "seed")}
    dtypes = {c: str for c in _STR_COLUMNS}
    # pandas >= 3 parses floats exactly by default (and deprecates the option)
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    raw = pd.read_csv(path, keep_default_na=False, na_values=na, dtype=dtypes, **exact)
    return _normalise(raw)


# --------------------------------------------------------------------------- sweep
class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: the finished cells are kept in the store.

    Attributes
    ----------
    done, total : int
        Cells finished (computed now or before) and cells planned.
    store : Path
    """

    def __init__(self, done: int, total: int, store: Path) -> None:
        super().__init__(
            f"interrupted: {done} of {total} cells finished and kept in {str(store)!r}; "
            "run the same command again to resume"
        )
        self.done, self.total, self.store = done, total, store


@dataclass
class SweepResult:
    """What :func:`sweep` did.

    Attributes
    ----------
    frame : pandas.DataFrame
        Tidy rows of this grid's finished cells (:data:`STORE_COLUMNS`).
    store : Path
    cells : list of str
        Identities of the planned cells.
    computed, reused : list of str
        Cells computed by this run, and cells found finished in the store.
    unreachable : list of dict
        Points no family of the grid can reach (see the module docstring).
    failed : list of dict
        ``{"cell", "label", "error"}`` per cell whose computation raised.
    """

    frame: pd.DataFrame
    store: Path
    cells: list[str]
    computed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    unreachable: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)

    def summary(self) -> str:
        """One line: cells computed, reused, unreachable and failed."""
        parts = [
            f"{len(self.cells)} cells: {len(self.computed)} computed, {len(self.reused)} reused "
            f"from {str(self.store)!r}"
        ]
        if self.unreachable:
            parts.append(f"{len(self.unreachable)} unreachable points skipped")
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        return "; ".join(parts)


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, unit="cell", desc="sweep", dynamic_ncols=True)


def sweep(
    families: str | Sequence[str] = "lognormal",
    mu=1.0,
    sigma2=0.1,
    T=(1, 10, 100, 1000),
    n=0,
    *,
    seed: int = 0,
    store: str | os.PathLike = DEFAULT_STORE,
    workers: int | None = None,
    independent: bool = False,
    ci: float = 0.95,
    target: float = theory.DEFAULT_TARGET,
    params: Mapping[str, object] | None = None,
    progress: bool = True,
    executor=None,
    scheduler=None,
    client=None,
    sampler: str = "token",
) -> SweepResult:
    """Run a grid of theory and Monte Carlo cells, resuming from ``store``.

    Parameters
    ----------
    families : str or sequence of str
        Family names (:data:`variance_lab.families.FAMILIES`).
    mu, sigma2 : float or sequence of float
        Means and variances of the per-token ratio.
    T : int or sequence of int
        Sequence lengths (integers >= 1, no duplicates).
    n : int or sequence of int
        Monte Carlo draws per cell; ``0`` means theory only. One Monte Carlo cell per
        ``n > 0`` and point; theory is computed once per point.
    seed : int
        Root seed of the Monte Carlo cells.
    store : str or Path
        SQLite store; created when missing. Finished cells found there are reused.
    workers : int, optional
        Worker threads of the engine, or worker processes with ``executor="dask-local"``
        (does not change results).
    independent : bool
        Passed to the engine: fresh draws at every T instead of one path per draw.
    ci : float
        Confidence level of the Monte Carlo intervals.
    target : float
        Target relative error of the theory's ``n_needed_*`` rows.
    params : mapping of str to float or sequence of float, optional
        Grids of extra family parameters (:func:`extra_parameters`), such as
        ``{"q": [0.3, 0.5]}`` for two-point or ``{"rho": [0, 0.5]}`` for ar1; each applies
        to the families that have it (an error if none has it).
    progress : bool
        Show a progress bar over cells (tqdm, on standard error).
    sampler : {"token", "aggregate", "auto"}
        Monte Carlo sampling, as in :func:`variance_lab.simulate.simulate`; part of a Monte
        Carlo cell's identity (``"aggregate"`` fails the gamma cells: no exact aggregate).
    executor, scheduler, client
        Where Monte Carlo chunks run, as in :func:`variance_lab.simulate.simulate`: local
        threads (default), ``"dask"`` with ``scheduler="tcp://HOST:PORT"`` or a
        ``client``, or ``"dask-local"`` (a ``LocalCluster`` of ``workers`` processes). One
        cluster serves every cell, started or reached when the first Monte Carlo cell
        needs it; cells run one after another, each cut into chunks over the cluster,
        and the store stays here: a cell is committed once all its chunks are merged.
        Results do not depend on it.

    Returns
    -------
    SweepResult

    Raises
    ------
    ValueError
        Bad input, no reachable point, Monte Carlo requested without an engine, a bad
        executor choice (also an ``ImportError`` when Dask is missing).
    SweepInterrupted
        On Ctrl-C; finished cells stay in the store.
    """
    the_plan = plan(
        families,
        mu,
        sigma2,
        T,
        n,
        seed=seed,
        independent=independent,
        ci=ci,
        target=target,
        params=params,
        sampler=sampler,
    )
    if any(c.kind == "monte_carlo" for c in the_plan.cells) and _simulate() is None:
        raise ValueError("Monte Carlo (n > 0) needs the engine variance_lab.simulate, missing in this build")
    from variance_lab.simulate.dask_executor import Engine

    engine = Engine(executor, scheduler=scheduler, client=client, workers=workers)  # connects on first use
    result = SweepResult(
        pd.DataFrame(), Path(store), [c.id for c in the_plan.cells], unreachable=the_plan.unreachable
    )
    with Store(store) as db, engine:
        finished = db.finished()
        if any(c.kind == "monte_carlo" and c.id not in finished for c in the_plan.cells):
            engine.start()  # a cluster that cannot be reached stops the sweep here, not each cell
        with _progress_bar(len(the_plan.cells), progress) as bar:
            try:
                _run_cells(the_plan.cells, db, finished, result, bar, engine)
            except KeyboardInterrupt:
                done = len(result.computed) + len(result.reused)
                raise SweepInterrupted(done, len(the_plan.cells), Path(store)) from None
        result.frame = db.frame(result.cells)
    return result


def _run_cells(cells, db: Store, finished: set, result: SweepResult, bar, engine) -> None:
    for cell in cells:
        cid = cell.id
        if cid in finished:
            result.reused.append(cid)
            bar.update(1)
            continue
        bar.set_postfix_str(cell.label(), refresh=False)
        start = time.perf_counter()
        try:
            frame, provenance = compute(cell, **(engine.options() if cell.kind == "monte_carlo" else {}))
        except (ValueError, ArithmeticError) as exc:
            result.failed.append({"cell": cid, "label": cell.label(), "error": str(exc)})
            bar.update(1)
            continue
        stored = db.put(cell, frame, provenance, time.perf_counter() - start)
        (result.computed if stored else result.reused).append(cid)
        finished.add(cid)
        bar.update(1)
