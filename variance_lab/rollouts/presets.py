r"""Read the runs of RL frameworks: prime-rl's token exports, slime's train dumps, NeMo-RL's JSONL.

Each reader turns a framework's own file into a :class:`RunRecords`: one entry per sequence,
with the full (unmasked) per-token arrays the file holds, the framework's token ids and
advantages where it writes them, and the problems found while reading (a missing, null or
non-numeric field, a length mismatch). :meth:`RunRecords.to_batch` makes the validated
:class:`~variance_lab.rollouts.batch.TokenBatch` that the analysis reads;
:func:`variance_lab.rollouts.io.load_batch` with ``preset=`` does both steps.

Which log-probabilities go where. None of the three dumps holds the log-probabilities of the
*updated* policy pi_theta: each is written while the trainer's weights are still those the
batch is trained from, pi_old. So every preset reads the trainer's log-probs as ``logp`` and as
``old_logp`` (the update ratio pi_theta / pi_old is 1) and the inference engine's as
``rollout_logp``: the file measures the mismatch pi_old / mu_rollout, the ratio these
frameworks correct with their importance weights.

=============  ====================================  =========================================
preset         file                                  fields read (the framework's names)
=============  ====================================  =========================================
``prime-rl``   ``<run>/token_exports/step_N/         ``trainer_logprobs`` (``logp``,
               rank_R.jsonl``, written with          ``old_logp``), ``inference_logprobs``
               ``trainer.enable_token_export=true``  (``rollout_logp``), ``loss_mask``
                                                     (``mask``), ``position_ids``,
                                                     ``token_ids``, ``advantages``
``slime``      ``--save-debug-train-data`` (or       per sample of ``samples``: ``log_probs``,
               ``--dump-details DIR``:               ``rollout_log_probs``, ``loss_masks``,
               ``DIR/train_data/{rollout_id}.pt``)   ``response_lengths``, ``advantages``,
                                                     ``tokens``, ``rollout_position``
``nemo-rl``    ``train_data_step{N}.jsonl``          ``prev_logprobs``, ``generation_logprobs``,
                                                     ``token_loss_mask``, ``idx``,
                                                     ``sample_loss_mask``,
                                                     ``advantages``, ``token_ids``
=============  ====================================  =========================================

Sources, read for the field names: prime-rl ``src/prime_rl/trainer/rl/token_export.py`` at
commit 559b4477 (``SCHEMA_VERSION = 1``); slime ``slime/observability/train_data_utils.py``
(``_build_dump_payload``, ``format_version`` 2) and ``slime/ray/rollout.py`` at commit
624b824a; NeMo-RL ``nemo_rl/algorithms/grpo.py`` and ``nemo_rl/utils/logger.py``
(``log_batched_dict_as_jsonl``) at commit 7ea279ab.

**prime-rl**: one JSON object per line. prime-rl writes a non-finite float as ``null``; a
``null`` log-prob at a token of the loss mask is bad data (its problem says so), elsewhere it
is ignored like every value outside the mask. Packed lines are split where ``position_ids``
restart (a position not above the one before it); a piece with no token in the loss mask
(the padding of a packed micro-batch) is left out, as prime-rl's exporter leaves out such
sequences. Sequence ids are ``"LINE:PIECE"`` (1-based line, 0-based piece).

**NeMo-RL**: each line is parsed by :func:`variance_lab.rollouts.records.parse_record` with
:data:`~variance_lab.rollouts.records.NEMO_RL_FIELDS`: a line without ``token_loss_mask``
counts every token, one without ``generation_logprobs`` has no inference-engine log-probs, and
``idx`` (the line's index, as NeMo-RL's logger writes it) is the id. Groups are NeMo-RL's own:
lines whose ``token_ids`` agree before the first token of ``token_loss_mask`` answer one prompt
(GRPO's ``calculate_baseline_and_std_per_prompt`` groups by the prompt's token ids); a dump
that lacks them is read without groups, and a note says so. A sample with
``sample_loss_mask`` 0 trains nothing in NeMo-RL's loss and is left out, and a note counts it
(``_read_nemo_rl`` cites the lines).

**slime**: the file is loaded with ``torch.load(weights_only=True)``: a file that needs
arbitrary objects unpickled is refused, as the NPZ reader refuses pickles. Per-token fields
cover the response only (``response_lengths`` tokens); a sample without ``loss_masks`` counts
every response token. Sequence ids are ``rollout_position`` (the sample's place in the
rollout), else ``sample_index``, else the index in ``samples``. Needs ``torch``.

A problem found while reading names the file's field and the record; the error raised for it
(or the :class:`~variance_lab.rollouts.batch.DroppedSequence` listed with ``on_bad="drop"``)
names the file and the sequence id.
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from variance_lab._jsonl import iter_jsonl
from variance_lab.rollouts.batch import TokenBatch, build_batch, check_on_bad
from variance_lab.rollouts.records import (
    NEMO_RL_FIELDS,
    ParsedRecord,
    field_names,
    id_array,
    parse_record,
    record_array,
)

__all__ = ["RUN_PRESETS", "RunRecords", "load_run", "read_run"]

#: Presets whose files :func:`read_run` reads (``load_batch(..., preset=)`` takes the same names).
RUN_PRESETS = ("prime-rl", "slime", "nemo-rl")

_PRIME_SCHEMA = 1
_SLIME_FORMAT = 2
#: NeMo-RL's per-sample loss mask in its dump (the loss's ``sample_mask``; 0 = the sample trains nothing).
_NEMO_SAMPLE_MASK = "sample_loss_mask"


@dataclass(frozen=True, eq=False)
class RunRecords:
    """The sequences of one framework file, unvalidated, with the extra per-token fields.

    Attributes
    ----------
    path : Path
        The file read.
    preset : str
    ids : list
        One id per sequence.
    logp, old_logp : list of ndarray
        Per-token log-probs of each sequence (the trainer's), full length: prompt and
        padding included where the file holds them; ``null`` read as NaN.
    rollout_logp : list of ndarray, or None
        The inference engine's log-probs; None when the file has none.
    mask : list of ndarray
        1 = the token counts (the framework's loss mask), 0 = ignored.
    advantages, token_ids : list of ndarray or None
        Per token, aligned with ``logp``, where the file has them (an entry is None where one
        sequence lacks the field); None when no sequence has it.
    problems : dict of int to str
        Problems found while reading, by sequence index, naming the file's field; such a
        sequence is bad data for :meth:`to_batch`.
    prompt_id : list or None
        The prompt of each sequence where the format names it (NeMo-RL: the group of its prompt's
        token ids, numbered from 0); None where it does not (prime-rl's exports and slime's dumps
        carry no group, nor a NeMo-RL dump without ``token_ids``).
    notes : tuple of str
        What the reader says about the file once (NeMo-RL: samples its loss leaves out, a dump
        that cannot name the groups); :meth:`to_batch` passes them on to the batch.
    """

    path: Path
    preset: str
    ids: list
    logp: list
    old_logp: list
    rollout_logp: list | None
    mask: list
    advantages: list | None = None
    token_ids: list | None = None
    problems: dict = field(default_factory=dict)
    prompt_id: list | None = None
    notes: tuple = ()

    def __len__(self) -> int:
        """Return the number of sequences read (good and bad)."""
        return len(self.ids)

    def to_batch(self, on_bad: str = "raise") -> TokenBatch:
        """Return the validated :class:`TokenBatch` of these sequences (counted tokens only).

        Parameters
        ----------
        on_bad : {"raise", "drop"}
            As in :func:`variance_lab.rollouts.io.load_batch`.

        Returns
        -------
        TokenBatch
            The counted tokens of the good sequences (bad ones listed in its ``dropped`` with
            ``on_bad="drop"``); ``rollout_logp`` and ``prompt_id`` where the file has them.

        Raises
        ------
        ValueError
            A bad sequence (``on_bad="raise"``), or no valid sequence; the message starts with
            the file's name.
        """
        on_bad = check_on_bad(on_bad)
        if not self.ids:
            raise ValueError(f"{self.path.name}: no sequence with a token in the loss mask")
        bad = np.zeros(len(self.ids), dtype=bool)
        bad[list(self.problems)] = True

        def flat(arrays):
            return np.concatenate([np.zeros(0) if b else a for a, b in zip(arrays, bad, strict=True)])

        lengths = np.array([0 if b else a.size for a, b in zip(self.logp, bad, strict=True)], dtype=np.int64)
        ids = np.array([str(i) for i in self.ids]) if any(isinstance(i, str) for i in self.ids) else None
        groups = None
        if self.prompt_id is not None:  # a bad sequence's group is never read: its own id stands in
            groups = [rid if b else g for g, rid, b in zip(self.prompt_id, self.ids, bad, strict=True)]
        try:
            batch = build_batch(
                flat(self.logp),
                flat(self.old_logp),
                lengths,
                mask=flat(self.mask),
                ids=id_array(self.ids) if ids is None else ids,
                on_bad=on_bad,
                known=self.problems,
                rollout_logp=None if self.rollout_logp is None else flat(self.rollout_logp),
                prompt_id=groups,
            )
        except ValueError as exc:
            raise ValueError(f"{self.path.name}: {exc}") from None
        return replace(batch, notes=tuple(self.notes)) if self.notes else batch


# --------------------------------------------------------------------------------------
# checks shared by the readers: they name the file's fields
# --------------------------------------------------------------------------------------
def _value_problem(x: np.ndarray, mask: np.ndarray, name: str) -> str | None:
    """Describe the first counted token of ``x`` that is not a finite log-prob <= 0 (file field names)."""
    with np.errstate(invalid="ignore"):
        bad = (mask == 1) & ~((x <= 0.0) & (x > -np.inf))
    if not bad.any():
        return None
    p = int(np.flatnonzero(bad)[0])
    v = float(x[p])
    if math.isnan(v):
        return f"field {name!r}[{p}] is null or NaN (a non-finite value in the run)"
    if math.isinf(v):
        return f"field {name!r}[{p}] is {v!r}"
    return f"field {name!r}[{p}] = {v!r} is > 0 (a log-probability must be <= 0)"


def _sequence_problem(arrays: Mapping[str, np.ndarray], mask: np.ndarray, logprob_fields) -> str | None:
    """Length mismatch, mask values other than 0/1, then bad log-prob values, by file field name."""
    sizes = {name: a.size for name, a in arrays.items()}
    if len(set(sizes.values())) > 1:
        return "length mismatch: " + ", ".join(f"{k!r} has {v}" for k, v in sizes.items())
    if np.any((mask != 0) & (mask != 1)):
        return "the mask holds values other than 0 and 1"
    for name in logprob_fields:
        problem = _value_problem(arrays[name], mask, name)
        if problem:
            return problem
    return None


def _token_id_problem(x: np.ndarray | None, name: str) -> str | None:
    """Describe the first entry of ``x`` that is not a token id (an integer in [0, 2**63)), if any."""
    if x is None:
        return None
    with np.errstate(invalid="ignore"):
        bad = ~((x >= 0) & (x < 2.0**63) & (np.floor(x) == x))
    if not bad.any():
        return None
    p = int(np.flatnonzero(bad)[0])
    return f"field {name!r}[{p}] = {float(x[p])!r} is not a token id"


class _Collector:
    """Accumulates the sequences of one file; a sequence with a problem enters with empty arrays."""

    def __init__(self, path: Path, preset: str):
        self.path, self.preset = path, preset
        self.ids: list = []
        self.cols: dict[str, list] = {
            k: [] for k in ("logp", "rollout_logp", "mask", "advantages", "token_ids")
        }
        self.problems: dict[int, str] = {}
        self.prompt_id: list = []

    def add(self, rid, problem: str | None = None, prompt_id=None, **arrays) -> None:
        i = len(self.ids)
        self.ids.append(rid)
        self.prompt_id.append(prompt_id)
        if problem:
            self.problems[i] = problem
            arrays = {"logp": np.zeros(0), "mask": np.zeros(0)}
        for k, col in self.cols.items():
            col.append(arrays.get(k))

    def records(self) -> RunRecords:
        c = self.cols
        good = [i for i in range(len(self.ids)) if i not in self.problems]
        has_roll = [c["rollout_logp"][i] is not None for i in good]
        if any(has_roll) and not all(has_roll):
            first = good[has_roll.index(False)]
            self.problems[first] = "no inference-engine log-probs (other sequences have them)"
        roll = None
        if any(has_roll):
            roll = [np.zeros(0) if r is None else r for r in c["rollout_logp"]]
        extra = {k: (c[k] if any(v is not None for v in c[k]) else None) for k in ("advantages", "token_ids")}
        grouped = all(self.prompt_id[i] is not None for i in good) and bool(good)
        extra["prompt_id"] = self.prompt_id if grouped else None
        return RunRecords(
            path=self.path,
            preset=self.preset,
            ids=self.ids,
            logp=c["logp"],
            old_logp=c["logp"],
            rollout_logp=roll,
            mask=c["mask"],
            problems=self.problems,
            **extra,
        )


# --------------------------------------------------------------------------------------
# prime-rl
# --------------------------------------------------------------------------------------
_PRIME_FLOATS = ("trainer_logprobs", "inference_logprobs", "advantages")


def _prime_pieces(position_ids: np.ndarray) -> np.ndarray:
    """Start offsets of the packed samples: where a position is not above the one before it."""
    restarts = np.flatnonzero(position_ids[1:] <= position_ids[:-1]) + 1
    return np.concatenate([[0], restarts, [position_ids.size]])


def _prime_line(rec, lineno: int, out: _Collector) -> None:
    """Add the sequences (pieces) of one token-export line to ``out``."""
    rid = f"{lineno}:0"
    if not isinstance(rec, Mapping):
        return out.add(rid, f"line {lineno}: not a JSON object")
    version = rec.get("schema_version")
    if version != _PRIME_SCHEMA:
        raise ValueError(
            f"{out.path.name}: line {lineno}: schema_version {version!r}; "
            f"this reader knows version {_PRIME_SCHEMA}"
        )
    arrays = {}
    for name in ("position_ids", "loss_mask", *_PRIME_FLOATS, "token_ids"):
        arrays[name], problem = record_array(rec, name, required=name not in ("advantages", "token_ids"))
        problem = problem or (_token_id_problem(arrays[name], name) if name == "token_ids" else None)
        if problem:
            return out.add(rid, f"line {lineno}: {problem}")
    present = {k: v for k, v in arrays.items() if v is not None}
    sizes = {k: v.size for k, v in present.items()}
    if len(set(sizes.values())) > 1:
        return out.add(
            rid, f"line {lineno}: length mismatch: " + ", ".join(f"{k!r} has {v}" for k, v in sizes.items())
        )
    starts = _prime_pieces(present["position_ids"])
    for k, (a, b) in enumerate(itertools.pairwise(starts)):
        piece = {name: v[a:b] for name, v in present.items()}
        mask = piece["loss_mask"]
        if not np.any(mask != 0):
            continue  # padding of a packed micro-batch: prime-rl exports no such sequence
        problem = _sequence_problem(
            {n: piece[n] for n in ("trainer_logprobs", "inference_logprobs", "loss_mask")},
            mask,
            ("inference_logprobs", "trainer_logprobs"),
        )
        out.add(
            f"{lineno}:{k}",
            f"line {lineno}, piece {k}: {problem}" if problem else None,
            logp=piece["trainer_logprobs"],
            rollout_logp=piece["inference_logprobs"],
            mask=mask,
            advantages=piece.get("advantages"),
            token_ids=piece["token_ids"].astype(np.int64) if "token_ids" in piece else None,
        )
    return None


def _read_prime_rl(path: Path) -> RunRecords:
    out = _Collector(path, "prime-rl")
    for lineno, rec in iter_jsonl(path):
        _prime_line(rec, lineno, out)
    return out.records()


# --------------------------------------------------------------------------------------
# NeMo-RL
# --------------------------------------------------------------------------------------
def _nemo_sample_mask(rec) -> tuple[float | None, str | None]:
    """Return a line's ``sample_loss_mask`` (None when it has none), or the problem with it.

    NeMo-RL writes ``train_data["sample_mask"].tolist()`` sliced as a batch of one: a list holding one
    number (``grpo.py`` at 7ea279ab, line 3644).
    """
    value = rec.get(_NEMO_SAMPLE_MASK) if isinstance(rec, Mapping) else None
    if value is None:
        return None, None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    problem = f"field {_NEMO_SAMPLE_MASK!r} must be a list holding one finite number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, problem
    try:
        weight = float(value)
    except OverflowError:  # a JSON integer such as 10**400
        return None, problem
    return (weight, None) if math.isfinite(weight) else (None, problem)


def _nemo_prompt(arrays: Mapping[str, np.ndarray | None]) -> bytes | None:
    """Return the line's prompt as NeMo-RL groups by it: its token ids before the first loss-mask token.

    None when the line cannot say (no ``token_ids`` or no ``token_loss_mask``, or no token in the
    mask). See :func:`_read_nemo_rl`.
    """
    tokens, mask = arrays.get("token_ids"), arrays.get("mask")
    if tokens is None or mask is None or tokens.size != mask.size:
        return None
    counted = np.flatnonzero(mask == 1)
    return None if counted.size == 0 else tokens[: counted[0]].astype(np.int64).tobytes()


def _nemo_line(parsed: ParsedRecord, lineno: int, out: _Collector, prompts: dict) -> None:
    """Add one NeMo-RL line, parsed by :func:`~variance_lab.rollouts.records.parse_record`, to ``out``.

    ``prompts`` maps each prompt seen (:func:`_nemo_prompt`) to its group number, in order of first
    appearance; a line whose prompt cannot be told enters with prompt None.
    """
    if parsed.problem:
        return out.add(parsed.id, f"line {lineno}: {parsed.problem}")
    arrays = parsed.arrays
    mask = np.ones(arrays["logp"].size) if arrays["mask"] is None else arrays["mask"]
    names = {f: NEMO_RL_FIELDS[f] for f in ("logp", "rollout_logp", "mask") if arrays[f] is not None}
    token_ids = arrays["token_ids"]
    problem = _sequence_problem(
        {name: arrays[f] for f, name in names.items()},
        mask,
        [names[f] for f in ("rollout_logp", "logp") if f in names],
    ) or _token_id_problem(token_ids, "token_ids")
    key = None if problem else _nemo_prompt(arrays)
    out.add(
        parsed.id,
        f"line {lineno}: {problem}" if problem else None,
        prompt_id=None if key is None else prompts.setdefault(key, len(prompts)),
        logp=arrays["logp"],
        rollout_logp=arrays["rollout_logp"],
        mask=mask,
        advantages=arrays["advantages"],
        token_ids=None if token_ids is None or problem else token_ids.astype(np.int64),
    )
    return None


def _read_nemo_rl(path: Path) -> RunRecords:
    """Read a ``train_data_step{N}.jsonl``: NeMo-RL's groups and sample mask, as its GRPO means them.

    What names a group. ``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py`` at
    7ea279ab, lines 1071-1096) writes line ``i`` as ``{**sample, "idx": i}``: ``idx`` is the line's
    index, not a prompt (and it overwrites the ``idx`` a datum carries). GRPO groups a step's
    responses by their prompt's token ids: ``calculate_baseline_and_std_per_prompt`` takes
    ``torch.unique(prompts, dim=0)`` and a row's group is the rows with equal prompt tokens
    (``nemo_rl/algorithms/utils.py``, lines 104-147), called with the initial prompt messages'
    token ids (``grpo.py``, lines 3119-3128 and 3286-3300). The dump keeps ``token_ids`` (prompt and
    response) and ``token_loss_mask`` (1 on the generated tokens only, ``grpo.py`` lines
    1910-1942), so a line's prompt is its tokens before the first one of the mask; equal prompts
    are one group, numbered in order of first appearance. A dump without ``token_ids`` or
    ``token_loss_mask`` (NeMo-RL's first releases wrote neither) cannot say: it is read without
    groups, and a note says so.

    What counts. NeMo-RL's loss masks tokens by ``token_mask * sample_mask`` (``grpo.py`` lines
    3289-3292), and the dump writes ``sample_mask`` as ``sample_loss_mask`` (line 3644): a sample
    with 0 there (cut off at the length limit, flagged by its environment, over the sequence
    log-prob error threshold) trains no token, so it is left out here too, and a note counts it
    (any other value counts the sample; NeMo-RL would scale its loss by it, the analysis does not
    weight sequences).
    """
    out = _Collector(path, "nemo-rl")
    names = field_names(NEMO_RL_FIELDS)
    prompts: dict[bytes, int] = {}
    n_lines = left_out = 0
    for i, (lineno, rec) in enumerate(iter_jsonl(path)):
        n_lines += 1
        weight, problem = _nemo_sample_mask(rec)
        if weight == 0.0:
            left_out += 1
            continue
        parsed = parse_record(rec, i, names, unwrap=True, extra=("advantages", "token_ids"))
        if problem and not parsed.problem:
            parsed = parsed._replace(arrays={}, problem=problem)
        _nemo_line(parsed, lineno, out, prompts)
    if n_lines and left_out == n_lines:
        raise ValueError(
            f"{path.name}: every one of its {n_lines:,} samples has {_NEMO_SAMPLE_MASK} 0: "
            "NeMo-RL's loss counts none of them"
        )
    records = out.records()
    notes = []
    if left_out:
        notes.append(
            f"{path.name}: {left_out:,} of {n_lines:,} samples have {_NEMO_SAMPLE_MASK} 0 "
            "(NeMo-RL's loss leaves them out): not counted"
        )
    if records.prompt_id is None and len(records.problems) < len(records):
        notes.append(
            f"{path.name}: the dump cannot say which responses answer one prompt (NeMo-RL groups them "
            "by their prompt's token ids, and lines here lack token_ids or token_loss_mask; idx is the "
            "line's number): analysed without groups, every response taken as independent"
        )
    return replace(records, notes=tuple(notes))


# --------------------------------------------------------------------------------------
# slime
# --------------------------------------------------------------------------------------
#: What ``torch.load`` raises for a file that is not an intact ``torch.save`` archive: its zip
#: reader's RuntimeError, a seek off the file, and the errors of its unpickler on corrupt records.
_TORCH_LOAD_ERRORS = (
    RuntimeError,
    EOFError,
    OSError,
    AttributeError,
    KeyError,
    IndexError,
    TypeError,
    ValueError,
)


def _torch_load(path: Path):
    """``torch.load(path, weights_only=True)``; a pickled object or a non-torch file is a ValueError."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is in the dev extra
        raise ImportError("reading slime's .pt dumps needs torch: pip install torch") from exc
    with open(path, "rb") as fh:  # opened here: an OSError past this point is the file's content
        try:
            return torch.load(fh, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(
                f"{path.name}: refused: loading it needs arbitrary objects unpickled, which this reader "
                f"never does (torch.load(weights_only=True) says: {first})"
            ) from None
        except _TORCH_LOAD_ERRORS as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{path.name}: not a file torch.save wrote ({first})") from None


def _slime_int(value) -> int | None:
    """Return an integer field of a slime sample as an int; None when it holds no integer.

    An integer, an integral finite float or a one-element dense tensor of one is read; a bool, a
    list, a sparse tensor, inf or NaN is not.
    """
    if hasattr(value, "detach"):  # a torch tensor
        if str(value.layout) != "torch.strided" or value.numel() != 1 or value.dtype.is_complex:
            return None
        value = value.item()
    if isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        return None
    return int(value)


def _slime_sample(sample, index: int, out: _Collector) -> None:
    if not isinstance(sample, Mapping):
        return out.add(index, f"samples[{index}] is not a dict")
    rid = next((sample[k] for k in ("rollout_position", "sample_index") if sample.get(k) is not None), index)
    rid = _slime_int(rid)
    rid = index if rid is None else rid
    where = f"samples[{index}]"
    if sample.get("response_lengths") is None:
        return out.add(rid, f"{where}: missing field 'response_lengths'")
    n = _slime_int(sample["response_lengths"])
    if n is None or n < 0:
        return out.add(rid, f"{where}: field 'response_lengths' is not an integer >= 0")
    arrays = {}
    for name in ("log_probs", "rollout_log_probs", "loss_masks", "advantages"):
        arrays[name], problem = record_array(sample, name, required=name == "log_probs")
        if problem:
            return out.add(rid, f"{where}: {problem}")
    mask = arrays["loss_masks"] if arrays["loss_masks"] is not None else np.ones(arrays["log_probs"].size)
    checked = {"log_probs": arrays["log_probs"], "loss_masks": mask}
    if arrays["rollout_log_probs"] is not None:
        checked["rollout_log_probs"] = arrays["rollout_log_probs"]
    sizes = {k: v.size for k, v in checked.items()}
    if any(s != n for s in sizes.values()):
        return out.add(
            rid,
            f"{where}: length mismatch: response_lengths is {n}, "
            + ", ".join(f"{k!r} has {v}" for k, v in sizes.items()),
        )
    problem = _sequence_problem(
        checked, mask, [f for f in ("rollout_log_probs", "log_probs") if f in checked]
    )
    tokens, _ = record_array(sample, "tokens", required=False)
    problem = problem or _token_id_problem(tokens, "tokens")
    out.add(
        rid,
        f"{where}: {problem}" if problem else None,
        logp=arrays["log_probs"],
        rollout_logp=arrays["rollout_log_probs"],
        mask=mask,
        advantages=arrays["advantages"],
        token_ids=None
        if problem or tokens is None or tokens.size < n
        else tokens[tokens.size - n :].astype(np.int64),
    )
    return None


def _read_slime(path: Path) -> RunRecords:
    payload = _torch_load(path)
    if not isinstance(payload, Mapping) or not isinstance(payload.get("samples"), list | tuple):
        raise ValueError(
            f"{path.name}: not a slime train-data dump (a dict with a 'samples' list, "
            f"format_version {_SLIME_FORMAT}, as --save-debug-train-data writes it)"
        )
    version = payload.get("format_version")
    if version != _SLIME_FORMAT:
        raise ValueError(
            f"{path.name}: format_version {version!r}; this reader knows version {_SLIME_FORMAT}"
        )
    out = _Collector(path, "slime")
    for index, sample in enumerate(payload["samples"]):
        _slime_sample(sample, index, out)
    return out.records()


_RUN_READERS = {"prime-rl": _read_prime_rl, "slime": _read_slime, "nemo-rl": _read_nemo_rl}


def read_run(path, preset: str) -> RunRecords:
    """Read a framework's file into :class:`RunRecords` (all sequences, with advantages and token ids).

    Parameters
    ----------
    path : str or Path
    preset : {"prime-rl", "slime", "nemo-rl"}

    Returns
    -------
    RunRecords

    Raises
    ------
    ValueError
        Unknown preset, a malformed file (invalid JSON, an unknown schema or format version,
        a ``.pt`` that needs arbitrary objects unpickled); the message names the file.
    """
    if preset not in _RUN_READERS:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(RUN_PRESETS)}")
    path = Path(path)
    try:
        return _RUN_READERS[preset](path)
    except ValueError as exc:  # a malformed file (a bad prompt id, say): the message names the file, once
        if str(exc).startswith(f"{path.name}: "):
            raise
        raise ValueError(f"{path.name}: {exc}") from None


def load_run(path, preset: str, on_bad: str = "raise") -> TokenBatch:
    """:func:`read_run`, then :meth:`RunRecords.to_batch`: the batch of a framework's file.

    Parameters
    ----------
    path : str or Path
    preset : {"prime-rl", "slime", "nemo-rl"}
    on_bad : {"raise", "drop"}

    Returns
    -------
    TokenBatch
    """
    on_bad = check_on_bad(on_bad)
    return read_run(path, preset).to_batch(on_bad)
