"""Records to batches: the one parser of a record's fields, for JSONL files and NeMo-RL's dumps.

A record is one mapping per sequence, as a line of a JSON Lines file holds it (the fields are
listed in :mod:`variance_lab.rollouts.io`). :func:`parse_record` reads one record: its id, its
prompt id and its per-token arrays, or the first problem that makes it bad data (a missing,
null or non-numeric field); :func:`batch_from_records` builds the validated
:class:`~variance_lab.rollouts.batch.TokenBatch` of many.

NeMo-RL writes each sample as a batch of one, so every per-token field is a list holding one
list; ``unwrap=True`` reads such fields, and :data:`NEMO_RL_FIELDS` names NeMo-RL's fields. The
NeMo-RL reader, :func:`variance_lab.rollouts.presets.read_run` (``load_batch(...,
preset="nemo-rl")`` goes through it), parses its lines here, and adds what a record alone cannot
say: the groups (equal prompt token ids) and the samples NeMo-RL's loss leaves out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from variance_lab.rollouts.batch import TokenBatch, build_batch
from variance_lab.rollouts.prompts import prompt_id_problem

__all__ = [
    "FIELDS",
    "NEMO_RL_FIELDS",
    "TOKEN_FIELDS",
    "ParsedRecord",
    "batch_from_records",
    "field_names",
    "float_array",
    "id_array",
    "parse_record",
    "record_array",
    "sequence_values",
    "token_values",
]

#: Canonical field names; ``fields=`` maps them to a file's own names.
FIELDS = ("logp", "old_logp", "mask", "id", "rollout_logp", "prompt_id")
#: Token fields, in the order problems are looked for; ``rollout_logp`` and ``mask`` are optional.
TOKEN_FIELDS = ("logp", "old_logp", "mask", "rollout_logp")
#: NeMo-RL's names of the fields (``train_data_step{N}.jsonl``; per-token fields are a batch of
#: one, read with ``unwrap=True``). The dump holds no log-probs of the updated policy, so the
#: trainer's ``prev_logprobs`` are read as ``logp`` and ``old_logp``. ``idx`` is the line's index
#: (NeMo-RL's logger writes ``{**sample, "idx": i}``), the id and never a prompt: the reader of
#: :mod:`variance_lab.rollouts.presets` groups lines by their prompt's token ids, as GRPO does.
NEMO_RL_FIELDS = {
    "logp": "prev_logprobs",
    "old_logp": "prev_logprobs",
    "rollout_logp": "generation_logprobs",
    "mask": "token_loss_mask",
    "id": "idx",
}

_EMPTY = np.zeros(0)
_INT64 = np.iinfo(np.int64)


class ParsedRecord(NamedTuple):
    """One record, parsed (:func:`parse_record`).

    Attributes
    ----------
    id : object
        The record's id field, else its index.
    arrays : dict
        ``logp``, ``old_logp``, ``mask``, ``rollout_logp`` (and the extra fields asked for, by
        the file's name): a 1-D float64 array each, None for an optional field the record lacks.
        Empty when the record has a problem.
    problem : str or None
        The first problem of the record (it is bad data), naming the file's field.
    prompt_id : object
        The prompt (a string or an integer), None when the record names none.
    """

    id: object
    arrays: dict
    problem: str | None
    prompt_id: object


def field_names(fields: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the file's name of each canonical field (:data:`FIELDS`): the field itself unless mapped.

    Parameters
    ----------
    fields : mapping, optional
        Canonical name -> the file's name, for the fields whose names differ.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        A key that is not a canonical field.
    """
    names = {f: f for f in FIELDS}
    for key, value in (fields or {}).items():
        if key not in names:
            raise ValueError(f"fields: unknown field {key!r}; the fields are {FIELDS}")
        names[key] = str(value)
    return names


def id_array(ids: list) -> np.ndarray:
    """Return ids as an int64 array (all integers), a str array (all strings), else an object array.

    Integers beyond the int64 range (a 64-bit hash, say) are kept exactly, in an object array.

    Parameters
    ----------
    ids : list

    Returns
    -------
    numpy.ndarray
    """
    if all(isinstance(i, int | np.integer) and not isinstance(i, bool) for i in ids):
        if all(_INT64.min <= i <= _INT64.max for i in ids):
            return np.array(ids, dtype=np.int64)
    elif all(isinstance(i, str) for i in ids):
        return np.array(ids, dtype=str)
    out = np.empty(len(ids), dtype=object)
    out[:] = ids
    return out


def float_array(value, name: str) -> tuple[np.ndarray | None, str | None]:
    """Return ``(1-D float64 array, None)``, or ``(None, problem)`` naming the field ``name``.

    ``null`` entries of a list become NaN (bad data where the token counts); a torch tensor is
    converted without importing torch.

    Parameters
    ----------
    value : list, array or tensor, or None
    name : str
        The file's name of the field, for the problem.

    Returns
    -------
    (ndarray or None, str or None)
    """
    if value is None:
        return None, f"field {name!r} is null"
    if hasattr(value, "detach"):  # a torch tensor (slime): dense and real, as slime writes them
        if str(getattr(value, "layout", "")) != "torch.strided" or value.dtype.is_complex:
            return None, f"field {name!r} is a {value.layout} {value.dtype} tensor, not a dense real one"
        value = value.detach().cpu().double().numpy()
    elif isinstance(value, list):
        value = [math.nan if v is None else v for v in value]
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None, f"field {name!r} is not a list of numbers"
    except OverflowError:  # a JSON integer such as 10**400
        return None, f"field {name!r} holds an integer beyond the float64 range"
    if arr.ndim != 1:
        return None, f"field {name!r} must be a flat list, got shape {arr.shape}"
    return arr, None


def record_array(
    rec: Mapping, key: str, *, required: bool = True, unwrap: bool = False
) -> tuple[np.ndarray | None, str | None]:
    """Return one field of a record as ``(1-D float64 array, None)`` or ``(None, problem)``.

    Parameters
    ----------
    rec : mapping
    key : str
        The file's name of the field.
    required : bool
        A missing or null field is a problem; else it gives ``(None, None)``.
    unwrap : bool
        The field is a list holding one list (a batch of one, as NeMo-RL writes it).

    Returns
    -------
    (ndarray or None, str or None)
    """
    if rec.get(key) is None:
        if not required:
            return None, None
        return None, (f"missing field {key!r}" if key not in rec else f"field {key!r} is null")
    value = rec[key]
    if unwrap:
        if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], list):
            return None, f"field {key!r} must be a list holding one list (a batch of one)"
        value = value[0]
    return float_array(value, key)


def _record_prompt(rec: Mapping, i: int, names: dict[str, str], unwrap: bool):
    """Return record ``i``'s prompt id (None when none); ValueError naming the record when bad.

    ``unwrap``: a one-element list is unwrapped (NeMo-RL's batch of one). When the file names
    the prompt under a preset's field and also has a ``prompt_id`` field, the two must agree.
    """
    keys = [k for k in dict.fromkeys((names["prompt_id"], "prompt_id")) if k in rec]
    values = []
    for key in keys:
        value = rec[key]
        if unwrap and isinstance(value, list) and len(value) == 1:
            value = value[0]
        problem = prompt_id_problem(value)
        if problem:
            raise ValueError(f"record {i} (id={rec.get(names['id'], i)!r}): field {key!r} {problem}")
        values.append(value)
    if len(values) == 2 and values[0] != values[1]:
        raise ValueError(
            f"record {i} (id={rec.get(names['id'], i)!r}): inconsistent prompt ids "
            f"{keys[0]!r}={values[0]!r} and {keys[1]!r}={values[1]!r}"
        )
    return values[0] if values else None


def parse_record(
    rec, i: int, names: Mapping[str, str], *, unwrap: bool = False, extra: Iterable[str] = ()
) -> ParsedRecord:
    """Parse record ``i``: its id, prompt id and token arrays, or its first problem.

    Parameters
    ----------
    rec : object
        The record (a problem unless it is a mapping).
    i : int
        Its index among the records (the default id).
    names : mapping
        The file's name of each canonical field (:func:`field_names`).
    unwrap : bool
        Per-token fields are a list holding one list (NeMo-RL).
    extra : iterable of str
        Further optional per-token fields to read, by the file's name (NeMo-RL's
        ``advantages``, ``token_ids``).

    Returns
    -------
    ParsedRecord

    Raises
    ------
    ValueError
        A prompt id that is null, a float, a bool or a container, or two that disagree (a
        malformed file rather than a bad sequence), naming the record.
    """
    if not isinstance(rec, Mapping):
        return ParsedRecord(i, {}, "record is not a JSON object", None)
    rid = rec.get(names["id"])
    prompt = _record_prompt(rec, i, names, unwrap)
    arrays = {}
    for f, key in [(f, names[f]) for f in TOKEN_FIELDS] + [(k, k) for k in extra]:
        required = f in ("logp", "old_logp")
        arrays[f], problem = record_array(rec, key, required=required, unwrap=unwrap)
        if problem:
            return ParsedRecord(i if rid is None else rid, {}, problem, prompt)
    return ParsedRecord(i if rid is None else rid, arrays, None, prompt)


def _prompt_column(prompts: list) -> list | None:
    """Return the prompt ids of every record, None when none has one; ValueError when only some have."""
    have = [p is not None for p in prompts]
    if not any(have):
        return None
    if not all(have):
        i = have.index(False)
        raise ValueError(f"record {i}: no prompt_id, though other records have one (all or none must)")
    return prompts


def batch_from_records(
    records: Iterable, names: Mapping[str, str], on_bad: str = "raise", *, unwrap: bool = False
) -> TokenBatch:
    """Build the validated batch of parsed records (:func:`parse_record`).

    A record with a problem enters with length 0 and its problem (bad data). ``rollout_logp``
    is optional for the file, but once one record has it, every record must; the same for
    ``prompt_id``, whose bad values are errors (not bad sequences).

    Parameters
    ----------
    records : iterable
        The records (mappings), in order.
    names : mapping
        The file's name of each canonical field (:func:`field_names`).
    on_bad : {"raise", "drop"}
        As in :func:`variance_lab.rollouts.io.load_batch`.
    unwrap : bool
        Per-token fields are a list holding one list (NeMo-RL).

    Returns
    -------
    TokenBatch
        The counted tokens of the good records; with ``on_bad="drop"`` the bad ones are listed
        in its ``dropped``.

    Raises
    ------
    ValueError
        No record, bad data (``on_bad="raise"``), or a bad prompt id.
    """
    cols: dict[str, list] = {f: [] for f in TOKEN_FIELDS}
    ids, known, has_mask, with_rollout, prompts = [], {}, False, [], []
    for i, rec in enumerate(records):
        parsed = parse_record(rec, i, names, unwrap=unwrap)
        ids.append(parsed.id)
        prompts.append(parsed.prompt_id)
        arrays = parsed.arrays
        if parsed.problem:
            known[i] = parsed.problem
            arrays = {"logp": _EMPTY, "old_logp": _EMPTY, "mask": None, "rollout_logp": _EMPTY}
        has_mask |= arrays["mask"] is not None
        with_rollout.append(arrays["rollout_logp"] is not None)
        for f in cols:
            fill = np.ones(arrays["logp"].size) if f == "mask" else _EMPTY
            cols[f].append(arrays[f] if arrays[f] is not None else fill)
    if not ids:
        raise ValueError("no records")
    has_rollout = any(with_rollout[i] for i in range(len(ids)) if i not in known)
    if has_rollout:
        for i in np.flatnonzero(~np.array(with_rollout)).tolist():
            known.setdefault(i, f"missing field {names['rollout_logp']!r} (other records have it)")
    lens = {f: np.array([a.size for a in arrs], dtype=np.int64) for f, arrs in cols.items()}
    for i in known:  # a record with a problem enters with length 0 in every field
        for f in cols:
            cols[f][i], lens[f][i] = _EMPTY, 0
    return build_batch(
        np.concatenate(cols["logp"]),
        np.concatenate(cols["old_logp"]),
        lens["logp"],
        old_lengths=lens["old_logp"],
        mask=np.concatenate(cols["mask"]) if has_mask else None,
        mask_lengths=lens["mask"] if has_mask else None,
        ids=id_array(ids),
        on_bad=on_bad,
        known=known,
        rollout_logp=np.concatenate(cols["rollout_logp"]) if has_rollout else None,
        rollout_lengths=lens["rollout_logp"] if has_rollout else None,
        prompt_id=_prompt_column(prompts),
    )


def sequence_values(records: Iterable[Mapping], name: str, batch: TokenBatch) -> np.ndarray:
    """Return one number per sequence of ``batch`` from each record's field ``name`` (e.g. ``advantage``).

    Parameters
    ----------
    records : iterable of mapping
        The records the batch was read from, in the same order (a sequence the batch dropped with
        ``on_bad="drop"`` is skipped by its index).
    name : str
        A field holding one finite number per record.
    batch : TokenBatch

    Raises
    ------
    ValueError
        Naming the record (index and id) whose field is missing or not a finite number, or when
        the records are fewer than the batch's.
    """
    dropped = {d.index for d in batch.dropped}
    out = []
    for i, rec in enumerate(records):
        if i in dropped:
            continue
        value = rec.get(name) if isinstance(rec, Mapping) else None
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            rid = rec.get("id", i) if isinstance(rec, Mapping) else i
            why = "is missing" if value is None else f"is {value!r}, not a finite number"
            raise ValueError(f"record {i} (id={rid!r}): field {name!r} {why}")
        out.append(float(value))
    if len(out) != len(batch):
        raise ValueError(f"{len(out)} records with {name!r} for {len(batch)} sequences")
    return np.asarray(out)


def token_values(records: Iterable[Mapping], name: str, batch: TokenBatch) -> np.ndarray:
    """Return one number per counted token of ``batch`` from the records' per-token field ``name``.

    Parameters
    ----------
    records : iterable of mapping
        The records the batch was read from, in the same order (a sequence the batch dropped is
        skipped by its index).
    name : str
        A per-token field, as long as the record's ``logp``; where the record has a ``mask``, the
        tokens with mask 1 are kept, as the batch keeps them.
    batch : TokenBatch

    Raises
    ------
    ValueError
        Naming the record (index and id) whose field is missing, of the wrong length or not
        finite, or when the records are fewer than the batch's sequences.
    """
    dropped = {d.index for d in batch.dropped}
    names = field_names()
    out = []
    for i, rec in enumerate(records):
        if i in dropped:
            continue
        rid = rec.get("id", i) if isinstance(rec, Mapping) else i
        arr, problem = record_array(rec, name) if isinstance(rec, Mapping) else (None, "not a JSON object")
        if problem is None:
            mask, problem = record_array(rec, names["mask"], required=False)
            n = len(rec.get(names["logp"]) or ())
            if problem is None and arr.size != n:
                problem = f"field {name!r} has {arr.size} values for {n} tokens"
            elif problem is None and not np.all(np.isfinite(arr)):
                problem = f"field {name!r} holds a non-finite value"
            elif problem is None and mask is not None:
                arr = arr[mask == 1]
        if problem is not None:
            raise ValueError(f"record {i} (id={rid!r}): {problem}")
        out.append(arr)
    if len(out) != len(batch):
        raise ValueError(f"{len(out)} records with {name!r} for {len(batch)} sequences")
    values = np.concatenate(out) if out else np.zeros(0)
    if values.size != batch.n_tokens:
        raise ValueError(f"{values.size} values of {name!r} for the batch's {batch.n_tokens} tokens")
    return values
