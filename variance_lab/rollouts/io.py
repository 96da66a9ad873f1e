"""Read and write batches of token log-probs: JSONL, Parquet and NPZ.

One record per sequence, with the fields

============  ========================================================================
field         meaning
============  ========================================================================
logp          token log-probs under the new (current) policy, a list of floats <= 0
old_logp      token log-probs under the old (sampling) policy, same length
mask          optional, same length; 1 = response token that counts, 0 = ignore it
              (prompt, padding, tool output). Values under a 0 are never checked.
id            optional string or integer; default the record's index (0-based)
prompt_id     optional string or integer: the prompt the response answers. GRPO-style
              rollouts come in groups of responses per prompt, which are not independent;
              with this field every interval over sequences resamples prompts (see the
              guide page on groups). All records have it or none; null, a list, a float
              or a bool is an error naming the record.
rollout_logp  optional, same length: the inference engine's log-probs (the sampler,
              e.g. vLLM), checked like the others. Files without it load as before; with
              it ``analyze`` splits the ratio into mismatch and update.
============  ========================================================================

Formats, chosen from the file name (``.jsonl``, ``.ndjson``, ``.jsonl.gz``, ``.ndjson.gz``,
``.parquet``, ``.pq``, ``.npz``) or by ``format=``:

- **JSONL**: one JSON object per line, blank lines skipped; gzip-compressed when the name
  ends in ``.gz``. Python's ``NaN``/``Infinity`` tokens and ``null`` entries are read (and
  then reported as bad data).
- **Parquet**: columns ``logp``, ``old_logp`` (and ``mask``) of type list of numbers, ``id``
  string or integer; a null ``logp``/``old_logp`` list or a null entry is bad data, a null
  ``mask`` means every token counts (as in JSONL). A column ``rs_mask`` (the capture of a
  trainer that rejects tokens, verl's ``rollout_rs``: the tokens of ``mask`` the rejection
  kept) is not read as the mask: ``mask``, the tokens before the rejection, is, and a note in
  :attr:`~variance_lab.rollouts.batch.TokenBatch.notes` counts the tokens the rejection cut.
  Needs ``pyarrow``.
- **NPZ**, padded layout (what :func:`save_batch` writes by default): 2-D ``logp``,
  ``old_logp`` of shape ``(n, L)``, 2-D ``mask`` of the same shape (without it every entry
  counts), optional 1-D ``id``. Flat layout: 1-D ``logp``, ``old_logp`` (and ``mask``), all
  sequences concatenated, with 1-D integer ``lengths`` (and optionally ``old_lengths``,
  ``mask_lengths`` where they differ). Read with ``allow_pickle=False``.

Field names can be mapped (``fields={"logp": "log_probs", "old_logp": "old_log_probs"}``)
for trainers that export under other names; a framework's own file is read with ``preset=``
(:data:`PRESET_NAMES`, :mod:`variance_lab.rollouts.presets`).

**NeMo-RL** (``preset="nemo-rl"``): the ``train_data_step{N}.jsonl`` files GRPO writes
(``nemo_rl/algorithms/grpo.py`` through ``Logger.log_batched_dict_as_jsonl``, checked
against NVIDIA-NeMo/RL at commit 7ea279ab). Each line is one sample sliced as a batch of
one, so every per-token field is a list holding one list: ``generation_logprobs`` (vLLM's,
here ``rollout_logp``), ``prev_logprobs`` (the trainer's pi_old, ``old_logp``),
``token_loss_mask`` (1 on the generated tokens, 0 on prompt and padding: ``mask``), and
``idx``, the line's index (the logger writes ``{**sample, "idx": i}``): the ``id``, never a
prompt. The groups are NeMo-RL's own: GRPO groups responses by their prompt's token ids, so
lines whose ``token_ids`` agree before the first token of ``token_loss_mask`` answer one prompt
(``prompt_id`` numbers them from 0); a dump without ``token_ids`` or ``token_loss_mask``
cannot say, and is read without groups (:attr:`~variance_lab.rollouts.batch.TokenBatch.notes`
says so). A sample with ``sample_loss_mask`` 0 trains no token in NeMo-RL's loss and is not
counted (the notes count it). The dump holds no log-probs of the updated policy; at the time
of the dump the trainer's weights are pi_old, so the preset reads ``prev_logprobs`` as
``logp`` as well: the update ratio is 1, and the file measures the mismatch pi_old /
mu_rollout. (With ``force_on_policy_ratio`` NeMo-RL writes zeros as ``prev_logprobs``; such
a file has no trainer log-probs.)

Bad data, checked per sequence: NaN, +inf, -inf (a token of probability 0 under a policy:
an error, since its log-ratio is undefined), a log-prob > 0 (no tolerance: rounding in a
trainer's log-softmax gives at most 0.0), a length mismatch between the arrays, no counted
token, a mask value other than 0/1, and (files only) a missing, null or non-numeric field.
``on_bad="raise"`` raises ``ValueError`` naming the file, the first bad sequence (id and
index) and its problem; ``on_bad="drop"`` leaves bad sequences out and lists them in
:attr:`~variance_lab.rollouts.batch.TokenBatch.dropped` (``n_dropped`` counts them). Nothing warns.

A malformed file is a ``ValueError`` naming it as well, whatever is wrong: a cut or corrupt
gzip stream, NPZ archive or Parquet file, an ``.npy`` named ``.npz``, JSON nested too deep for
the parser, an integer beyond the float64 range (a bad sequence) or an id beyond int64 (kept
exactly). NPZ arrays are read with ``allow_pickle=False``: nothing pickled is ever loaded.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from variance_lab._jsonl import iter_jsonl, open_text
from variance_lab.rollouts.batch import (
    TokenBatch,
    check_on_bad,
    segment_offsets,
)
from variance_lab.rollouts.parquet import REJECTED, first_line, import_pyarrow, read_parquet
from variance_lab.rollouts.presets import RUN_PRESETS, load_run
from variance_lab.rollouts.records import (
    FIELDS,
    batch_from_records,
    field_names,
    id_array,
)

__all__ = [
    "FIELDS",
    "PRESET_NAMES",
    "REJECTED",
    "ROLLOUT_FORMATS",
    "detect_format",
    "load_batch",
    "save_batch",
    "write_records",
]

ROLLOUT_FORMATS = ("jsonl", "parquet", "npz")

#: Every name ``preset=`` takes: the framework files that :mod:`variance_lab.rollouts.presets`
#: reads (NeMo-RL's ``train_data_step{N}.jsonl``, prime-rl's token exports, slime's ``.pt`` dumps).
PRESET_NAMES = tuple(sorted(RUN_PRESETS))
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}


def detect_format(path, format: str | None = None) -> str:
    """Return the file format: ``format`` if given, else from the file name's extension.

    Parameters
    ----------
    path : str or Path
    format : {"jsonl", "parquet", "npz"}, optional

    Returns
    -------
    str
    """
    if format is not None:
        if format not in ROLLOUT_FORMATS:
            raise ValueError(f"format must be one of {ROLLOUT_FORMATS}, got {format!r}")
        return format
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
        if suffixes and _SUFFIXES.get(suffixes[-1]) == "jsonl":
            return "jsonl"
        raise ValueError(f"{p.name}: only JSONL may be gzip-compressed (.jsonl.gz)")
    if suffixes and suffixes[-1] in _SUFFIXES:
        return _SUFFIXES[suffixes[-1]]
    raise ValueError(
        f"{p.name}: cannot tell the format from the extension; pass format= one of {ROLLOUT_FORMATS}"
    )


# --------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------
def _read_jsonl(path: Path, names, on_bad) -> TokenBatch:
    return batch_from_records((rec for _, rec in iter_jsonl(path)), names, on_bad)


def _npz_prompts(path: Path, data: dict, key: str):
    """Return the NPZ's 1-D prompt ids (strings or integers), None when absent; ValueError when bad."""
    if key not in data:
        return None
    arr = data[key]
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype.kind == "U"):
        raise ValueError(
            f"{path.name}: array {key!r} must be 1-D strings or integers, "
            f"got {arr.dtype} of shape {arr.shape}"
        )
    return arr


#: What :mod:`zipfile` and :mod:`zlib` raise for an archive that is cut short or corrupt: OSError for
#: a seek off the file, NotImplementedError for an unknown compression method, RuntimeError for
#: an "encrypted" flag.
_ZIP_ERRORS = (zipfile.BadZipFile, EOFError, zlib.error, OSError, NotImplementedError, RuntimeError)


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """Return the arrays of an NPZ archive, never unpickled; a broken archive is a ValueError."""
    with open(path, "rb") as fh:  # ours to close, even when NumPy fails half-way through the zip
        try:
            z = np.load(fh, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError(f"{path.name}: a single .npy array, not an .npz archive of named arrays")
            with z:
                return {k: z[k] for k in z.files}
        except _ZIP_ERRORS as exc:
            raise ValueError(f"{path.name}: not an intact .npz archive ({first_line(exc)})") from None
        except ValueError as exc:  # NumPy's refusal of a pickled array, or of a malformed header
            if str(exc).startswith(path.name):
                raise
            raise ValueError(f"{path.name}: {first_line(exc)}") from None


def _read_npz(path: Path, names, on_bad) -> TokenBatch:
    data = _npz_arrays(path)
    for f in ("logp", "old_logp"):
        if names[f] not in data:
            raise ValueError(f"{path.name}: no array {names[f]!r} (arrays: {sorted(data)})")
    logp, old = data[names["logp"]], data[names["old_logp"]]
    mask = data.get(names["mask"])
    ids = data.get(names["id"])
    roll = data.get(names["rollout_logp"])
    prompts = _npz_prompts(path, data, names["prompt_id"])
    if logp.ndim == 2:
        return TokenBatch.from_padded(
            logp, old, mask, ids, on_bad=on_bad, rollout_logp=roll, prompt_id=prompts
        )
    if logp.ndim == 1 and "lengths" in data:
        return TokenBatch.from_flat(
            logp,
            old,
            data["lengths"],
            old_lengths=data.get("old_lengths"),
            mask=mask,
            mask_lengths=data.get("mask_lengths"),
            ids=ids,
            on_bad=on_bad,
            rollout_logp=roll,
            rollout_lengths=data.get("rollout_lengths"),
            prompt_id=prompts,
        )
    raise ValueError(f"{path.name}: NPZ needs 2-D padded arrays, or 1-D flat arrays with 'lengths'")


_READERS = {"jsonl": _read_jsonl, "parquet": read_parquet, "npz": _read_npz}


def load_batch(
    path,
    *,
    format: str | None = None,
    on_bad: str = "raise",
    fields: Mapping[str, str] | None = None,
    preset: str | None = None,
) -> TokenBatch:
    """Load a batch of token log-probs from JSONL, Parquet or NPZ.

    Parameters
    ----------
    path : str or Path
        The file; its extension picks the format unless ``format`` is given.
    format : {"jsonl", "parquet", "npz"}, optional
        Override the format.
    on_bad : {"raise", "drop"}
        ``"raise"``: a bad sequence raises ``ValueError`` naming it (id and index) and its
        problem. ``"drop"``: bad sequences are left out and listed, with the reason, in the
        batch's ``dropped`` (``n_dropped`` counts them).
    fields : mapping, optional
        File names of the fields ``logp``, ``old_logp``, ``mask``, ``id``, ``rollout_logp``,
        ``prompt_id``, where they differ.
    preset : str, optional
        A framework's dump format, :data:`PRESET_NAMES`: ``"nemo-rl"`` (its
        ``train_data_step*.jsonl``), ``"prime-rl"`` (``token_exports/step_N/rank_R.jsonl``),
        ``"slime"`` (the ``.pt`` of ``--save-debug-train-data``); see
        :mod:`variance_lab.rollouts.presets`. A preset takes no ``fields`` or ``format``.

    Returns
    -------
    TokenBatch
        The counted tokens of the good sequences; with ``on_bad="drop"`` the bad ones are listed in
        its ``dropped``.

    Raises
    ------
    ValueError
        Bad data (with ``on_bad="raise"``), a malformed file, a missing required field or
        array, or no valid sequence; the message starts with the file's name.
    """
    on_bad = check_on_bad(on_bad)
    path = Path(path)
    if preset is not None:
        if preset not in RUN_PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESET_NAMES)}")
        if fields or format is not None:
            raise ValueError(f"preset {preset!r} reads its framework's own file: pass no fields= or format=")
        return load_run(path, preset, on_bad)
    fmt = detect_format(path, format)
    names = field_names(fields)
    try:
        return _READERS[fmt](path, names, on_bad)
    except ValueError as exc:  # bad data or a malformed file: the message names the file, once
        if str(exc).startswith(f"{path.name}: "):
            raise
        raise ValueError(f"{path.name}: {exc}") from None


# --------------------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------------------
def _batch_flat(batch: TokenBatch) -> tuple[dict, dict, np.ndarray]:
    """Flat fields of a batch in its original token positions: holes hold 0.0 under mask 0.

    Returns (arrays by field, lengths by field, ids); no ``mask`` when there are no holes.
    """
    spans = batch.positions[batch.offsets[1:] - 1] + 1
    where = np.repeat(segment_offsets(spans)[:-1], batch.lengths) + batch.positions
    flat = {"logp": np.zeros(spans.sum()), "old_logp": np.zeros(spans.sum())}
    flat["logp"][where], flat["old_logp"][where] = batch.logp, batch.old_logp
    if batch.rollout_logp is not None:
        flat["rollout_logp"] = np.zeros(spans.sum())
        flat["rollout_logp"][where] = batch.rollout_logp
    if np.any(spans != batch.lengths):
        flat["mask"] = np.zeros(spans.sum())
        flat["mask"][where] = 1.0
    return flat, dict.fromkeys(flat, spans), batch.ids


def _file_ids(ids: np.ndarray) -> np.ndarray:
    """Ids as a file can hold them: integers or strings (mixed ids become strings)."""
    return ids.astype(str) if ids.dtype == object else ids


def _mask_list(values: list) -> list:
    return [int(v) if v in (0, 1) else v for v in values]


def _write_jsonl_flat(path: Path, flat, lens, ids, prompts=None) -> None:
    parts = {f: np.split(flat[f], segment_offsets(lens[f])[1:-1]) for f in flat}
    prompts = None if prompts is None else prompts.tolist()
    with open_text(path, "w") as fh:
        for i, rid in enumerate(ids.tolist()):
            rec = {"id": rid, "logp": parts["logp"][i].tolist(), "old_logp": parts["old_logp"][i].tolist()}
            if prompts is not None:
                rec["prompt_id"] = prompts[i]
            if "mask" in parts:
                rec["mask"] = _mask_list(parts["mask"][i].tolist())
            if "rollout_logp" in parts:
                rec["rollout_logp"] = parts["rollout_logp"][i].tolist()
            fh.write(json.dumps(rec) + "\n")


def _write_parquet_flat(path: Path, flat, lens, ids, prompts=None) -> None:
    pa, pq = import_pyarrow()
    columns = {"id": pa.array(_file_ids(ids).tolist())}
    if prompts is not None:
        columns["prompt_id"] = pa.array(_file_ids(prompts).tolist())
    for f, values in flat.items():
        offsets = segment_offsets(lens[f])
        large = offsets[-1] >= 2**31
        cls = pa.LargeListArray if large else pa.ListArray
        off = pa.array(offsets, type=pa.int64() if large else pa.int32())
        columns[f] = cls.from_arrays(off, pa.array(values, type=pa.float64()))
    pq.write_table(pa.table(columns), path)


def _write_npz_flat(path: Path, flat, lens, ids, layout: str, prompts=None) -> None:
    out = {"id": _file_ids(ids)}
    if prompts is not None:
        out["prompt_id"] = _file_ids(prompts)
    if layout == "flat":
        out.update(flat)
        out["lengths"] = lens["logp"]
        for f, key in (
            ("old_logp", "old_lengths"),
            ("mask", "mask_lengths"),
            ("rollout_logp", "rollout_lengths"),
        ):
            if f in lens and not np.array_equal(lens[f], lens["logp"]):
                out[key] = lens[f]
        np.savez_compressed(path, **out)
        return
    if any(not np.array_equal(lens[f], lens["logp"]) for f in lens):
        raise ValueError("the padded NPZ layout cannot hold a length mismatch; use npz_layout='flat'")
    inside = np.arange(int(lens["logp"].max(initial=0))) < lens["logp"][:, None]
    for f in ("logp", "old_logp", "mask", "rollout_logp"):
        if f == "rollout_logp" and f not in flat:
            continue
        arr = np.zeros(inside.shape)
        arr[inside] = flat.get(f, 1.0)  # the mask marks the padding
        out[f] = arr.astype(np.int8) if f == "mask" and np.all((arr == 0) | (arr == 1)) else arr
    np.savez_compressed(path, **out)


def _target(path, format: str | None, npz_layout: str) -> tuple[Path, str]:
    """Check ``npz_layout`` and return the file to write and its format (from the extension by default)."""
    if npz_layout not in ("padded", "flat"):
        raise ValueError(f"npz_layout must be 'padded' or 'flat', got {npz_layout!r}")
    path = Path(path)
    return path, detect_format(path, format)


def save_batch(batch: TokenBatch, path, *, format: str | None = None, npz_layout: str = "padded") -> Path:
    """Write a batch so that :func:`load_batch` gives it back (same tokens, positions and ids).

    Tokens masked out at load time (holes) are written back as 0.0 under ``mask = 0``; a batch
    without holes is written without a mask (the padded NPZ layout always has one, for the
    padding). Mixed string and integer ids (and prompt ids) are written as strings to Parquet
    and NPZ. The batch's ``prompt_id``, when it has one, is written as the field ``prompt_id``.

    Parameters
    ----------
    batch : TokenBatch
    path : str or Path
    format : {"jsonl", "parquet", "npz"}, optional
        Default from the extension.
    npz_layout : {"padded", "flat"}
        NPZ only: padded 2-D arrays with a mask, or flat arrays with ``lengths``.

    Returns
    -------
    Path
    """
    path, fmt = _target(path, format, npz_layout)
    flat, lens, ids = _batch_flat(batch)
    if fmt == "jsonl":
        _write_jsonl_flat(path, flat, lens, ids, batch.prompt_id)
    elif fmt == "parquet":
        _write_parquet_flat(path, flat, lens, ids, batch.prompt_id)
    else:
        _write_npz_flat(path, flat, lens, ids, npz_layout, batch.prompt_id)
    return path


def _plain(value):
    """Return a record's field as JSON/Arrow can take it: arrays to lists, everything else as is."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def _write_jsonl_records(path: Path, records: list[dict]) -> None:
    with open_text(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps({k: _plain(v) for k, v in rec.items()}) + "\n")


def _write_parquet_records(path: Path, records: list[dict]) -> None:
    pa, pq = import_pyarrow()
    ids = _file_ids(id_array([rec.get("id", i) for i, rec in enumerate(records)]))
    columns = {"id": pa.array(ids.tolist())}
    if any("prompt_id" in rec for rec in records):
        columns["prompt_id"] = pa.array([_plain(rec.get("prompt_id")) for rec in records])
    for f in ("logp", "old_logp", "mask", "rollout_logp"):
        if f in ("mask", "rollout_logp") and all(rec.get(f) is None for rec in records):
            continue
        columns[f] = pa.array([_plain(rec.get(f)) for rec in records], type=pa.list_(pa.float64()))
    pq.write_table(pa.table(columns), path)


def _write_npz_records(path: Path, records: list[dict], layout: str) -> None:
    fields = ["logp", "old_logp"] + [
        f for f in ("mask", "rollout_logp") if any(rec.get(f) is not None for rec in records)
    ]
    cols: dict[str, list] = {f: [] for f in fields}
    for i, rec in enumerate(records):
        for f in fields:
            value = rec.get(f)
            if value is None and f == "mask":
                value = np.ones(len(rec["logp"]))
            if value is None:
                raise ValueError(f"record {i}: NPZ cannot hold a missing or null {f!r}")
            cols[f].append(np.asarray(value, dtype=np.float64).ravel())
    flat = {f: np.concatenate(arrs) for f, arrs in cols.items()}
    lens = {f: np.array([a.size for a in arrs], dtype=np.int64) for f, arrs in cols.items()}
    ids = id_array([rec.get("id", i) for i, rec in enumerate(records)])
    prompts = None
    if any("prompt_id" in rec for rec in records):
        prompts = _file_ids(id_array([rec.get("prompt_id") for rec in records]))
    _write_npz_flat(path, flat, lens, ids, layout, prompts)


def write_records(
    records: Iterable[Mapping], path, *, format: str | None = None, npz_layout: str = "padded"
) -> Path:
    """Write raw records (dicts with ``logp``, ``old_logp``, optional ``mask``, ``id``) unchecked.

    Unlike :func:`save_batch`, nothing is validated, which is what tests of the loaders'
    error handling need: NaN, infinities, positive log-probs, length mismatches, null and
    (JSONL) missing or non-numeric fields are written as given (NaN and infinities as JSON
    ``NaN``/``Infinity``). NPZ cannot hold a null field; its padded layout cannot hold a
    length mismatch.

    Parameters
    ----------
    records : iterable of mapping
    path : str or Path
    format : {"jsonl", "parquet", "npz"}, optional
    npz_layout : {"padded", "flat"}

    Returns
    -------
    Path
    """
    path, fmt = _target(path, format, npz_layout)
    records = [dict(rec) for rec in records]
    if fmt == "jsonl":
        _write_jsonl_records(path, records)
    elif fmt == "parquet":
        _write_parquet_records(path, records)
    else:
        _write_npz_records(path, records, npz_layout)
    return path
