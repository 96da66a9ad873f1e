r"""Append padded batches of token log-probs to a Parquet file that :func:`load_batch` reads.

A :class:`ParquetRecorder` writes one Parquet row group per :meth:`ParquetRecorder.append`
call, one row per sequence, in the columns of
:func:`variance_lab.rollouts.io.load_batch`'s Parquet format: ``id`` (a running integer),
``logp``, ``old_logp``, ``mask``, ``rollout_logp`` (lists of float64), plus ``step``
(int64) and ``advantages`` (list of float64, one value per token), which the loader ignores.
A row holds the tokens up to the sequence's last counted one (trailing padding is cut).

The trainers record log-probabilities of the sampling step only: pi_old (the trainer's, before
the update) and mu_rollout (the inference engine's). So ``logp`` and ``old_logp`` both hold
pi_old's, and ``rollout_logp`` the engine's: the file measures the mismatch
pi_old / mu_rollout that the frameworks' importance weights correct (the update ratio is 1).

Values are written as the trainer had them: a NaN or infinite log-prob is kept, and the
loader reports it (or drops the sequence with ``on_bad="drop"``). Shapes are checked before
anything is written: a bad call raises ``ValueError`` naming the file, the field and the
call (``step``) and appends nothing. The file is complete once :meth:`close` has run (use
the recorder as a context manager); a file left open by a crash has no Parquet footer.
:meth:`ParquetRecorder.reopen` continues a closed file (a trainer's second ``train()``): later
batches follow its rows, written to a new file beside it that replaces it at the next
:meth:`~ParquetRecorder.close`, so the finished file stays whole until then. ``metadata``
(text keys and values, e.g. what the trainer did not have) goes into the file's Parquet
key-value metadata, read with ``pyarrow.parquet.read_schema(path).metadata``.

A trainer that rejects tokens before its loss (verl's ``rollout_rs``) is recorded before the
rejection: ``mask`` holds every response token the trainer sampled, and the optional ``rs_mask``
column (list of float64) the tokens its rejection kept, a subset of ``mask``. The loader reads
``mask``, so the mismatch statistics count every token the engine sampled; ``rs_mask`` is
counted in a note (:mod:`variance_lab.rollouts.io`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["ParquetRecorder", "as_numpy"]


def as_numpy(value, name: str) -> np.ndarray:
    """Return a tensor (torch, without importing it) or array-like as a float64 NumPy array.

    Parameters
    ----------
    value : torch.Tensor or array_like
        A tensor is read through ``.detach().double().cpu().numpy()`` (bfloat16 included),
        exactly: every float32, float16 and bfloat16 value is a float64 value.
    name : str
        The field, for the error message.

    Returns
    -------
    ndarray of float64
    """
    if hasattr(value, "detach"):
        value = value.detach().double().cpu().numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold numbers, got {type(value).__name__}") from None


class ParquetRecorder:
    """Append padded ``(B, T)`` batches of one training run to a Parquet file.

    Parameters
    ----------
    path : str or Path
        The file to write (replaced when the first batch is appended). One file per process.
    metadata : mapping of str to str, optional
        Written into the file's key-value metadata (the schema's), e.g. a note on where the
        log-probs come from; the loader does not read it.

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib
    >>> from variance_lab.integrations.recorder import ParquetRecorder
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.parquet"
    >>> with ParquetRecorder(path) as rec:
    ...     n_rows = rec.append(old_logp=np.full((2, 3), -0.5), mask=np.ones((2, 3)), step=1)
    >>> from variance_lab.rollouts.io import load_batch
    >>> load_batch(path).lengths.tolist()
    [3, 3]
    """

    def __init__(self, path, metadata=None):
        self.path = Path(path)
        self.n_rows = 0
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
        self._writer = None
        self._schema = None
        self._closed = False
        self._tmp = None

    def __enter__(self) -> ParquetRecorder:
        """Return the recorder; leaving the ``with`` block closes it."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the file (also after an error)."""
        self.close()

    def _checked(self, step, old_logp, mask, rollout_logp, advantages, rs_mask=None):
        """Return the batch as float64 (B, T) arrays (advantages (B,) broadcast); raise naming the field."""
        where = f"{self.path.name}: step {step}"
        old = as_numpy(old_logp, "old_logp")
        if old.ndim != 2:
            raise ValueError(f"{where}: old_logp must be a (B, T) array, got shape {old.shape}")
        out = {"old_logp": old}
        fields = (
            ("mask", mask),
            ("rollout_logp", rollout_logp),
            ("advantages", advantages),
            ("rs_mask", rs_mask),
        )
        for name, value in fields:
            if value is None:
                continue
            arr = as_numpy(value, name)
            if name == "advantages" and arr.shape == old.shape[:1]:
                arr = np.broadcast_to(arr[:, None], old.shape)
            if arr.shape != old.shape:
                raise ValueError(f"{where}: {name} has shape {arr.shape}, old_logp has {old.shape}")
            out[name] = arr
        for name in ("mask", "rs_mask"):
            m = out.get(name)
            bad = np.zeros(0) if m is None else np.flatnonzero(((m != 0) & (m != 1)).any(axis=1))
            if bad.size:
                raise ValueError(f"{where}: {name} of sequence {int(bad[0])} holds values other than 0 and 1")
        out.setdefault("mask", np.ones(old.shape))
        if "rs_mask" in out:
            bad = np.flatnonzero(((out["rs_mask"] == 1) & (out["mask"] == 0)).any(axis=1))
            if bad.size:
                raise ValueError(
                    f"{where}: rs_mask of sequence {int(bad[0])} keeps a token that mask does not count "
                    "(rs_mask is what the rejection kept of mask)"
                )
        return out

    def append(
        self,
        *,
        old_logp,
        mask=None,
        rollout_logp=None,
        advantages=None,
        step: int = 0,
        prompt_id=None,
        rs_mask=None,
    ) -> int:
        """Append one padded batch; return the number of rows now in the file.

        Parameters
        ----------
        old_logp : array_like or tensor, shape (B, T)
            The trainer's token log-probs pi_old (written as ``logp`` and ``old_logp``).
        mask : array_like or tensor of {0, 1}, shape (B, T), optional
            1 = response token that counts; default every token.
        rollout_logp : array_like or tensor, shape (B, T), optional
            The inference engine's token log-probs mu_rollout.
        advantages : array_like or tensor, shape (B, T) or (B,), optional
            Per token, or per sequence (repeated over its tokens).
        step : int
            The training step, written in the ``step`` column.
        prompt_id : array_like, shape (B,), optional
            The prompt of each sequence (verl's ``uid``), written as text in the ``prompt_id``
            column: responses to one prompt are not independent, and ``analyze`` then
            resamples prompts. Give it on every call or on none.
        rs_mask : array_like or tensor of {0, 1}, shape (B, T), optional
            The tokens of ``mask`` a rejection kept (verl's ``response_mask`` after
            ``rollout_rs``), written in the ``rs_mask`` column; ``mask`` is then the mask before
            the rejection. Give it on every call or on none.

        Returns
        -------
        int
            The rows now in the file, this batch's included (what the integrations return).

        Raises
        ------
        ValueError
            A shape that is not (B, T) or disagrees with ``old_logp``'s, a mask value other
            than 0/1, an ``rs_mask`` that keeps a token ``mask`` does not count, or a closed
            recorder; nothing is appended.
        """
        if self._closed:
            raise ValueError(f"{self.path.name}: the recorder is closed; open a new one for another file")
        arrays = self._checked(int(step), old_logp, mask, rollout_logp, advantages, rs_mask)
        if prompt_id is not None:
            groups = np.asarray(prompt_id, dtype=object).reshape(-1)
            if groups.size != arrays["old_logp"].shape[0] or any(g is None for g in groups):
                raise ValueError(
                    f"{self.path.name}: step {step}: prompt_id must hold one id per sequence "
                    f"({arrays['old_logp'].shape[0]}), got {groups.size}"
                )
            arrays["prompt_id"] = groups
        table = self._table(arrays, int(step))
        if self._writer is None:
            import pyarrow.parquet as pq

            self._schema = table.schema
            self._writer = pq.ParquetWriter(self.path, self._schema.with_metadata(self.metadata or None))
        elif table.schema != self._schema:
            raise ValueError(
                f"{self.path.name}: step {step}: the batch's fields {table.schema.names} differ from "
                f"the file's {self._schema.names}"
            )
        self._writer.write_table(table)
        self.n_rows += table.num_rows
        return self.n_rows

    def _table(self, arrays: dict, step: int):
        """Build the Arrow table of one batch: rows cut after the last counted token."""
        import pyarrow as pa

        mask = arrays["mask"]
        b, t = mask.shape
        counted = mask == 1
        last = np.where(counted.any(axis=1), t - np.argmax(counted[:, ::-1], axis=1), t)
        keep = np.arange(t) < last[:, None]
        offsets = np.concatenate([[0], np.cumsum(last)]).astype(np.int64)

        def lists(x):
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(x[keep], type=pa.float64()))

        columns = {
            "id": pa.array(np.arange(self.n_rows, self.n_rows + b, dtype=np.int64)),
            "step": pa.array(np.full(b, step, dtype=np.int64)),
            "logp": lists(arrays["old_logp"]),
            "old_logp": lists(arrays["old_logp"]),
            "mask": lists(mask),
        }
        for name in ("rollout_logp", "advantages", "rs_mask"):
            if name in arrays:
                columns[name] = lists(arrays[name])
        if "prompt_id" in arrays:
            columns["prompt_id"] = pa.array([str(g) for g in arrays["prompt_id"]], type=pa.string())
        return pa.table(columns)

    def close(self) -> None:
        """Finish the file (write its footer); appending afterwards is an error until :meth:`reopen`."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._tmp is not None:
            os.replace(self._tmp, self.path)
            self._tmp = None

    def reopen(self) -> None:
        """Continue a closed file: the next batches follow the rows it holds, ``id`` counting on.

        The rows are copied into a new file beside ``path`` (a hidden ``.tmp`` name), which
        replaces ``path`` at the next :meth:`close`: until then ``path`` stays the complete file it
        was. Nothing happens to an open recorder, or to one that never wrote a row.

        Raises
        ------
        ValueError
            ``path`` no longer holds the rows this recorder wrote (removed or replaced).
        """
        if not self._closed:
            return
        self._closed = False
        if self._schema is None:
            return
        import pyarrow.parquet as pq

        try:
            old = pq.ParquetFile(self.path)
            n_old = old.metadata.num_rows
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            self._closed = True
            raise ValueError(f"{self.path.name}: cannot reopen the file ({exc})") from None
        if n_old != self.n_rows or old.schema_arrow.remove_metadata() != self._schema:
            self._closed = True
            raise ValueError(
                f"{self.path.name}: the file holds {n_old} rows of columns {old.schema_arrow.names}, not the "
                f"{self.n_rows} rows this recorder wrote: it was replaced since"
            )
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._writer = pq.ParquetWriter(self._tmp, self._schema.with_metadata(self.metadata or None))
        for i in range(old.num_row_groups):
            self._writer.write_table(old.read_row_group(i))
