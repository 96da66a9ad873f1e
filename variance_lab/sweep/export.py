"""Export a sweep store's tidy rows to CSV or Parquet, and read such a file back with the same dtypes."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from variance_lab._atomic import atomic_write
from variance_lab.sweep.store import FLOAT_COLUMNS, STR_COLUMNS, load_store, normalise_frame

__all__ = ["EXPORT_FORMATS", "check_table_path", "export", "load_table", "write_table"]


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


def check_table_path(path: str | os.PathLike, fmt: str | None = None) -> str:
    """Check an output of :func:`write_table` before any work; returns its format.

    Raises ``ValueError`` for a name with no known format, a directory, a missing folder or
    Parquet without pyarrow.
    """
    path = Path(path)
    fmt = _format_of(path, fmt)
    if path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a directory")
    if not path.parent.is_dir():
        raise ValueError(f"--out {str(path)!r}: folder {str(path.parent)!r} does not exist")
    if fmt == "parquet":
        _parquet_engine()
    return fmt


def write_table(frame: pd.DataFrame, path: str | os.PathLike, fmt: str | None = None) -> Path:
    """Write a store frame to CSV or Parquet atomically (format from the suffix by default)."""
    path = Path(path)
    fmt = check_table_path(path, fmt)
    if fmt == "csv":
        return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, na_rep="nan"))
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def export(store: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None) -> pd.DataFrame:
    """Write every result of ``store`` to ``out`` (``.csv`` or ``.parquet``); returns the frame.

    ``out`` is checked first and ``store`` is opened read-only (:func:`load_store`): a file that
    is not a store is a ``ValueError`` and is never written.
    """
    check_table_path(out, fmt)
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
        return normalise_frame(pd.read_parquet(path))
    na = {col: ["nan"] for col in (*FLOAT_COLUMNS, "seed")}
    dtypes = {c: str for c in STR_COLUMNS}
    # pandas >= 3 parses floats exactly by default (and deprecates the option)
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    raw = pd.read_csv(path, keep_default_na=False, na_values=na, dtype=dtypes, **exact)
    return normalise_frame(raw)
