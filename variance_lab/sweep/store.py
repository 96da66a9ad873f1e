"""The sweep store: one SQLite file, one transaction per finished cell.

See :mod:`variance_lab.sweep` for the layout and the guarantees.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from variance_lab import __version__
from variance_lab.schema import RENAMED_METHODS, TIDY_COLUMNS, json_safe
from variance_lab.sweep.cells import SCHEMA_VERSION, Cell

__all__ = ["DEFAULT_STORE", "STORE_COLUMNS", "STORE_EXTRA_COLUMNS", "Store", "load_store"]


#: Store path used when none is given, relative to the working directory.
DEFAULT_STORE = "variance_lab.sqlite"


#: Columns added to the tidy schema by the store: the family's extra parameters as
#: canonical JSON (``{"q":0.5}`` for two-point, ``{}`` for lognormal), draws (0 for
#: theory), seed (missing for theory), cell identity, package version and creation time
#: (ISO 8601, UTC).
STORE_EXTRA_COLUMNS = ("params", "n", "seed", "cell", "version", "created")


STORE_COLUMNS = TIDY_COLUMNS + STORE_EXTRA_COLUMNS


FLOAT_COLUMNS = ("mu", "sigma2", "value", "log10_value", "lo", "hi", "se")


STR_COLUMNS = ("family", "statistic", "method", "reason", "params", "cell", "version", "created")


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


# --------------------------------------------------------------------------- store
def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _db_float(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def _readonly_uri(path: Path) -> str:
    """SQLite URI that reads ``path`` without writing anything beside it.

    ``mode=ro`` on a store in WAL mode still creates ``-wal`` and ``-shm`` files next to it
    and leaves them there; when neither exists (no connection is open: the last one
    checkpointed and removed them), the file is complete as it is and is read with
    ``immutable=1``, which creates nothing. With a writer at work they exist, and the
    ordinary read-only mode shares them.
    """
    wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    extra = "&immutable=1" if not wal.exists() and not shm.exists() else ""
    return f"{path.resolve().as_uri()}?mode=ro{extra}"


class Store:
    """A sweep store: one SQLite file. Use as a context manager.

    Parameters
    ----------
    path : str or Path
        The SQLite file; created (with its tables) when missing.
    create : bool
        If false, a missing file is an error instead of being created.
    readonly : bool
        Open the file read-only (export, loading): nothing is ever written to it, not even
        the tables of a new store; a file that is not a store (an empty file, any other
        SQLite database or file) is a ``ValueError``. Implies ``create=False``.
    """

    def __init__(self, path: str | os.PathLike, *, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = bool(readonly)
        create = create and not self.readonly
        if self.path.is_dir():
            raise ValueError(f"store {str(self.path)!r} is a directory")
        if not self.path.exists():
            if not create:
                raise ValueError(f"store {str(self.path)!r} does not exist")
            if not self.path.parent.is_dir():
                raise ValueError(f"store {str(self.path)!r}: folder {str(self.path.parent)!r} does not exist")
        try:
            if self.readonly:
                self._conn = sqlite3.connect(
                    _readonly_uri(self.path), uri=True, isolation_level=None, timeout=60
                )
            else:
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
        if self.readonly:
            row = c.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                raise sqlite3.DatabaseError("it has no schema version")
            if row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {row[0]}, this version reads {SCHEMA_VERSION}")
            c.execute("SELECT 1 FROM cells JOIN results USING (cell) LIMIT 1").fetchall()
            return
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
        """Return the store, for use in a ``with`` block."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the store's connection on leaving the ``with`` block."""
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
        prov = json.dumps(json_safe(provenance), default=str, sort_keys=True)
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
        # plain tuples: pandas' named rows build a class with a string exec, and a Ctrl-C that
        # lands inside one makes ``python -m`` exit by SIGINT after the clean 130 (CPython flags it)
        columns = ["T", "statistic", "method", "value", "log10_value", "lo", "hi", "se", "reliable", "reason"]
        rows = [
            (cell.id, int(T), stat, method, *map(_db_float, nums), int(bool(reliable)), str(reason))
            for T, stat, method, *nums, reliable, reason in frame[columns].itertuples(index=False, name=None)
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
        return normalise_frame(frame)

    def cells(self) -> pd.DataFrame:
        """One row per finished cell: identity, kind, parameters, key, timing, provenance."""
        cur = self._conn.execute("SELECT * FROM cells ORDER BY created, cell")
        return pd.DataFrame.from_records(cur.fetchall(), columns=[d[0] for d in cur.description])


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def normalise_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Give the frame fixed dtypes and a content order, so that equal stores give equal frames.

    A ``method`` of an earlier version is read as its current name
    (:data:`~variance_lab.schema.RENAMED_METHODS`: ``"seed"`` rows of a store written before
    the rename come back as ``"naive"``); the store itself is not changed.
    """
    out = pd.DataFrame(index=range(len(frame)))
    src = frame.reset_index(drop=True)
    for col in STORE_COLUMNS:
        values = src[col] if col in src else pd.Series([None] * len(src))
        if col in FLOAT_COLUMNS:
            out[col] = pd.to_numeric(values, errors="raise").astype("float64")
        elif col in ("T", "n"):
            out[col] = values.astype("int64")
        elif col == "seed":
            out[col] = pd.array([None if pd.isna(v) else int(v) for v in values], dtype="Int64")
        elif col == "reliable":
            out[col] = values.map(lambda v: str(v) in ("1", "True", "true")).astype(bool)
        else:
            out[col] = values.map(_text).astype(str)
    out["method"] = out["method"].replace(RENAMED_METHODS)
    if len(out):
        out = out.sort_values(_SORT, kind="mergesort", na_position="first").reset_index(drop=True)
    return out


def load_store(path: str | os.PathLike) -> pd.DataFrame:
    """Every result in a store as one tidy DataFrame (:data:`STORE_COLUMNS`).

    Parameters
    ----------
    path : str or Path
        An existing store, opened read-only (never written, not even its tables).

    Returns
    -------
    pandas.DataFrame
        Tidy rows plus ``params`` (extra family parameters, JSON), ``n``, ``seed``
        (missing for theory), ``cell``, ``version`` and ``created``, sorted by content.
        Rows of two cells may share (family, mu, sigma2, T, statistic, method) when the
        store holds several sweeps (other n, seed or T grid); the extra columns tell
        them apart.
    """
    with Store(path, readonly=True) as store:
        return store.frame()
