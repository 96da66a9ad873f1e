"""The Parquet format of token log-probs: one file read whole, or in pieces of rows.

:func:`read_parquet` is :func:`~variance_lab.rollouts.io.load_batch`'s reader (the fields and
their rules are in :mod:`variance_lab.rollouts.io`); :func:`parquet_pieces` reads the same file a
number of rows at a time, for the streaming analysis (:mod:`variance_lab.rollouts.source`), and
every piece is the batch the whole read holds of its rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from variance_lab.rollouts.batch import TokenBatch, build_batch
from variance_lab.rollouts.prompts import prompt_id_problem
from variance_lab.rollouts.records import TOKEN_FIELDS, field_names, id_array

__all__ = ["REJECTED", "first_line", "import_pyarrow", "parquet_pieces", "read_parquet", "rejection_note"]

#: The recorder's column of the tokens a trainer's rejection kept (:mod:`variance_lab.integrations.recorder`):
#: not read into the batch, counted in a note.
REJECTED = "rs_mask"


def import_pyarrow():
    """Return ``(pyarrow, pyarrow.parquet)``; ImportError saying how to install it when absent."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is in the dev extra
        raise ImportError(
            "reading or writing Parquet needs pyarrow: pip install 'variance_lab[parquet]'"
        ) from exc
    return pa, pq


def _parquet_list_column(table, name: str):
    """(flat float64 values, lengths, row is null) of a list column."""
    pa, _ = import_pyarrow()
    col = table.column(name).combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise ValueError(f"column {name!r} must be a list of numbers, got {col.type}")
    vtype = col.type.value_type
    if not (pa.types.is_floating(vtype) or pa.types.is_integer(vtype) or pa.types.is_boolean(vtype)):
        raise ValueError(f"column {name!r} must be a list of numbers, got {col.type}")
    is_null = col.is_null().to_numpy(zero_copy_only=False)
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = col.flatten().cast(pa.float64()).to_numpy(zero_copy_only=False)  # null entries -> NaN
    return np.asarray(values, dtype=np.float64), lengths, is_null


def _null_mask_counts_all(values, lengths, is_null, logp_lengths):
    """Fill null masks (rows) with ones: a null mask means every token counts, as an absent one."""
    if not is_null.any():
        return values, lengths, is_null
    lengths = np.where(is_null, logp_lengths, lengths)
    out = np.ones(lengths.sum())
    out[np.repeat(~is_null, lengths)] = values
    return out, lengths, np.zeros_like(is_null)


@contextlib.contextmanager
def _system_memory_pool():
    """Let Arrow allocate from the C library's ``malloc`` while the block runs, not from its own pool.

    Arrow's default pool (mimalloc or jemalloc) kept what a read freed: reading a dump of 1.6e7
    tokens left about 0.75 GB held by it once the batch was built, beside the batch's 0.5 GB
    (measured on the 2-core AMD EPYC VM). From ``malloc`` it goes back to the heap NumPy allocates
    from. ``read_table`` and ``flatten`` take no pool of their own, hence the default's swap.
    """
    pa, _ = import_pyarrow()
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def _parquet_table(path: Path):
    """Return the file's Arrow table; a file that is not intact Parquet is a ValueError naming it."""
    pa, pq = import_pyarrow()
    try:
        return pq.read_table(path)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path.name}: not a readable Parquet file ({first_line(exc)})") from None


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message (its type's name when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def read_parquet(path: Path, names, on_bad) -> TokenBatch:
    """Read a whole Parquet file of token log-probs (``names``: the file's field names) as one batch."""
    with _system_memory_pool():
        return _parquet_batch(path, names, on_bad)


def _parquet_batch(path: Path, names, on_bad) -> TokenBatch:
    batch, rejected = _table_batch(path, _parquet_table(path), names, on_bad)
    notes = rejection_note(path.name, [rejected])
    return replace(batch, notes=notes) if notes else batch


def _table_batch(path: Path, table, names, on_bad, first: int = 0, piece: bool = False):
    """Return (the batch of an Arrow table's rows, what the trainer's rejection cut in them or None).

    ``first``: the file's index of the table's first row; ``piece``: the table is one piece of the
    file (:func:`parquet_pieces`), which may hold no valid sequence.
    """
    present = set(table.column_names)
    for f in ("logp", "old_logp"):
        if names[f] not in present:
            raise ValueError(f"{path.name}: no column {names[f]!r} (columns: {sorted(present)})")
    n = table.num_rows
    if names["id"] in present:
        ids = id_array(
            [first + i if v is None else v for i, v in enumerate(table.column(names["id"]).to_pylist())]
        )
    else:  # the row numbers (id_array of them)
        ids = np.arange(first, first + n, dtype=np.int64)
    prompts = None
    if names["prompt_id"] in present:
        prompts = table.column(names["prompt_id"]).to_pylist()
        for i, v in enumerate(prompts):
            problem = prompt_id_problem(v)
            if problem:
                shown = ids[i].item() if isinstance(ids[i], np.generic) else ids[i]
                raise ValueError(
                    f"{path.name}: row {first + i} (id={shown!r}): column {names['prompt_id']!r} {problem}"
                )
    fields = [f for f in TOKEN_FIELDS if names[f] in present]
    cols = {f: _parquet_list_column(table, names[f]) for f in fields}
    if "mask" in cols:
        cols["mask"] = _null_mask_counts_all(*cols["mask"], cols["logp"][1])
    rejected = _rejection_counts(table, cols.get("mask")) if REJECTED in present else None
    known = {}
    for f in ("rollout_logp", "old_logp", "logp"):  # the first field's problem wins
        if f in cols:
            known.update({i: f"field {names[f]!r} is null" for i in np.flatnonzero(cols[f][2]).tolist()})
    if known:  # a row with a null field enters with length 0 in every field: no mismatch reported
        bad_row = np.zeros(n, dtype=bool)
        bad_row[list(known)] = True
        cols = {
            f: (v[~np.repeat(bad_row, lens)], np.where(bad_row, 0, lens), null)
            for f, (v, lens, null) in cols.items()
        }
    mask, mask_lens = cols.get("mask", (None, None, None))[:2]
    roll, roll_lens = cols.get("rollout_logp", (None, None, None))[:2]
    batch = build_batch(
        cols["logp"][0],
        cols["old_logp"][0],
        cols["logp"][1],
        old_lengths=cols["old_logp"][1],
        mask=mask,
        mask_lengths=mask_lens,
        ids=ids,
        on_bad=on_bad,
        known=known,
        rollout_logp=roll,
        rollout_lengths=roll_lens,
        prompt_id=prompts,
        copy=False,  # the arrays are this reader's own
        first=first,
        allow_empty=piece,
    )
    return batch, rejected


def parquet_pieces(
    path, *, fields: Mapping[str, str] | None = None, rows: int = 128, tokens_only: bool = False
):
    """Read a Parquet file of token log-probs ``rows`` rows at a time: (piece, rejection counts) in order.

    Each piece is the batch :func:`load_batch` would hold of those rows, read with
    ``on_bad="drop"`` (its ``dropped`` name the file's row indices; a piece of bad rows only holds
    no sequence); the counts are what the trainer's rejection cut in them, for
    :func:`rejection_note` (None without the column). The streaming analysis reads a dump this
    way, once per pass, never holding all of it (:mod:`variance_lab.rollouts.source`).

    Parameters
    ----------
    path : str or Path
    fields : mapping, optional
        As :func:`load_batch`'s.
    rows : int
        Rows a piece.
    tokens_only : bool
        Read the token fields alone (a later pass over a file already read): the pieces' ids are
        then their row numbers, and they hold no prompts and no rejection counts.

    Yields
    ------
    (TokenBatch, tuple or None)
    """
    path = Path(path)
    names = field_names(fields)
    pa, pq = import_pyarrow()
    with _system_memory_pool():
        try:
            file = pq.ParquetFile(path)
            columns = None
            if tokens_only:
                columns = [c for c in file.schema_arrow.names if c in {names[f] for f in TOKEN_FIELDS}]
            first = 0
            for table in _row_group_tables(pa, file, int(rows), columns):
                yield _table_batch(path, table, names, "drop", first=first, piece=True)
                first += table.num_rows
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path.name}: not a readable Parquet file ({first_line(exc)})") from None


def _row_group_tables(pa, file, rows: int, columns=None):
    """Yield the file's rows as tables of ``rows`` rows or fewer: each row group read whole, then sliced.

    A row group read whole, a column at a time on one thread, holds least memory (reading batches
    across row groups buffered the whole file: 0.4 GB of a 0.2 GB dump of 1.6e7 tokens; its 14 row
    groups read whole, all columns at once, grew the process by 0.19 GB, a column at a time by
    0.07 GB, measured on the 2-core AMD EPYC VM); a row group of over ``8 * rows`` rows is read in
    batches of ``rows``.
    """
    names = file.schema_arrow.names if columns is None else columns
    for i in range(file.metadata.num_row_groups):
        if file.metadata.row_group(i).num_rows <= 8 * rows:  # a column at a time, one thread: least memory
            parts = {c: file.read_row_group(i, columns=[c], use_threads=False).column(0) for c in names}
            table = pa.table(parts)
            del parts
            for start in range(0, table.num_rows, rows):
                yield table.slice(start, rows)
        else:
            for record_batch in file.iter_batches(batch_size=rows, row_groups=[i], columns=columns):
                yield pa.Table.from_batches([record_batch])


def _rejection_counts(table, mask):
    """Return (tokens cut, counted tokens, sequences cut, rows) by the trainer's rejection.

    False when the rows do not line up with ``mask`` (the sequences' own checks report those).
    """
    kept, kept_lens, kept_null = _parquet_list_column(table, REJECTED)
    if mask is None or kept_null.any() or not np.array_equal(kept_lens, mask[1]):
        return False
    counted = mask[0] == 1
    cut = counted & (kept != 1)
    seqs = np.repeat(np.arange(kept_lens.size), kept_lens)
    return int(cut.sum()), int(counted.sum()), int(np.unique(seqs[cut]).size), int(kept_lens.size)


def rejection_note(name: str, counts) -> tuple[str, ...]:
    """Say what a trainer's rejection cut (the recorder's ``rs_mask`` against ``mask``), as one note.

    ``counts``: :func:`parquet_pieces`' counts of each piece of the file ``name`` (None: no such
    column). Nothing when a piece's rows do not line up, or nothing is counted.
    """
    counts = list(counts)
    if not counts or any(c is None for c in counts) or any(c is False for c in counts):
        return ()
    cut, counted, n_seq, rows = (sum(c[k] for c in counts) for k in range(4))
    if not counted:
        return ()
    return (
        f"{name}: the trainer's rejection (verl's rollout_rs; column {REJECTED}) cut "
        f"{cut:,} of {counted:,} counted tokens ({100 * (cut / counted):.3g} %) "
        f"in {n_seq:,} of {rows:,} sequences; every statistic here counts the tokens before the "
        "rejection (column mask)",
    )
