r"""The steps of a run directory: which files hold which training step, in the frameworks' layouts.

:func:`find_steps` reads a directory's entries and returns its :class:`RunLayout`: the layout,
the reader's preset and one :class:`StepDump` per step, in step order; :func:`load_step` loads a
step's batch (every rank of a prime-rl step as one). :mod:`variance_lab.rollouts.steps` analyses
the steps.

Layouts (:data:`LAYOUTS`), recognised from the directory's entries:

============  =================================================  ==================================
layout        entries                                            the step is
============  =================================================  ==================================
``prime-rl``  ``step_N/rank_R.jsonl`` (in ``RUN`` or in          ``N``; the ranks of a step are one
              ``RUN/token_exports``), ``step_N/STABLE``          batch
``nemo-rl``   ``train_data_stepN.jsonl`` (``val_data_step*``     ``N``
              beside them is validation: not read)
``slime``     ``*.pt`` (``--dump-details DIR`` writes            the number in the name that
              ``DIR/train_data/{rollout_id}.pt``)                varies (``rollout_id``)
``files``     ``.jsonl[.gz]``, ``.ndjson[.gz]``, ``.parquet``,   the number in the name that
              ``.pq`` or ``.npz``, one format, one name pattern  varies
============  =================================================  ==================================

Sources. prime-rl (``src/prime_rl/trainer/rl/token_export.py`` at commit 559b4477):
``TokenExporter._export_dir`` is ``output_dir / "token_exports" / f"step_{step}"`` (line 88),
each rank writes ``rank_{rank}.jsonl`` there (line 100), and ``mark_stable`` touches
``STABLE`` in the folder once every rank has flushed the step (lines 81-85, called after a
barrier in ``trainer/rl/train.py`` lines 551-553). A step folder without ``STABLE`` where
others have one is still being written (or the run stopped in it): it is left out, and a note
says so; where no folder has one (prime-rl before PR #2641, 2026-06-11, wrote none) every
folder counts. NeMo-RL (``nemo_rl/algorithms/grpo.py`` at 7ea279ab, lines 3651-3652 and 4021):
``train_data_step{N}.jsonl`` and ``val_data_step{N}.jsonl`` in the log directory. slime
(``slime/utils/arguments.py`` at 624b824a, line 1892; ``observability/train_data_utils.py``
line 239): ``{rollout_id}`` (and optionally the single writer's ``{rank}``) in the template of
``--save-debug-train-data``, one file a step holding every data-parallel shard. verl's
``rollout_data_dir`` holds ``{global_steps}.jsonl`` (``verl/trainer/ppo/ray_trainer.py`` at
b178a3cd, line 399) with the decoded text and the score only, no token log-probs: such a
directory is refused with a line saying so (record the log-probs with
:mod:`variance_lab.integrations.verl`). The TRL and verl captures
(:mod:`variance_lab.integrations`) write every step into one Parquet file, with a ``step``
column: a file, not a directory of steps.

Entries that belong to no layout (hidden files, other extensions, other folders) are not read;
a note counts them. An empty directory, two layouts in one directory, names that do not give
one step each, and two dumps of one step are ``ValueError`` naming what was found; a dump that
does not parse is a ``ValueError`` naming its path within the run.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from variance_lab.rollouts.batch import TokenBatch, check_on_bad
from variance_lab.rollouts.io import PRESET_NAMES, detect_format, load_batch
from variance_lab.rollouts.presets import RunRecords, read_run

__all__ = ["LAYOUTS", "RunLayout", "StepDump", "find_steps", "load_step", "name_list"]

#: What each layout reads, for messages, in the order :func:`find_steps` looks for them.
_LAYOUT_TEXT = {
    "prime-rl": "prime-rl token exports (step_N/rank_R.jsonl)",
    "nemo-rl": "NeMo-RL train dumps (train_data_stepN.jsonl)",
    "slime": "slime train dumps (.pt)",
    "files": "token log-prob files",
}
#: The layouts :func:`find_steps` recognises (module docstring); ``files`` is the package's own formats.
LAYOUTS = tuple(_LAYOUT_TEXT)

_PRIME_STEP = re.compile(r"step_(\d+)")
_PRIME_RANK = re.compile(r"rank_(\d+)\.jsonl")
_PRIME_STABLE = "STABLE"
_NEMO_TRAIN = re.compile(r"train_data_step(\d+)\.jsonl")
_NEMO_VAL = re.compile(r"val_data_step(\d+)\.jsonl")
_DIGITS = re.compile(r"\d+")


# --------------------------------------------------------------------------------------
# finding the steps
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepDump:
    """The files of one training step.

    Attributes
    ----------
    step : int
        The step number, from the names.
    paths : tuple of Path
        The step's files, absolute: one, or prime-rl's ranks (in rank order).
    name : str
        The step within the run directory (``step_3``, ``train_data_step3.jsonl``), for messages.
    """

    step: int
    paths: tuple[Path, ...]
    name: str


@dataclass(frozen=True)
class RunLayout:
    """What :func:`find_steps` found: the layout, the steps in step order and what it says about them.

    Attributes
    ----------
    root : Path
        The folder holding the steps (``RUN/token_exports`` for a prime-rl output directory).
    layout : str
        One of :data:`LAYOUTS`.
    preset : str or None
        The reader's preset (:data:`~variance_lab.rollouts.io.PRESET_NAMES`); None for ``files``.
    steps : tuple of StepDump
    notes : tuple of str
        Entries not read, steps left out as incomplete.
    """

    root: Path
    layout: str
    preset: str | None
    steps: tuple[StepDump, ...]
    notes: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        """The layout in words, e.g. ``prime-rl token exports (step_N/rank_R.jsonl)``."""
        return _LAYOUT_TEXT[self.layout]


def name_list(names, limit: int = 3) -> str:
    """Return up to ``limit`` of ``names``, sorted, and how many there are in all when more."""
    names = sorted(names)
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _file_format(path: Path) -> str | None:
    """Return the package format a file's name gives, None where it gives none (a ``.pt`` is slime's)."""
    try:
        return detect_format(path)
    except ValueError:
        return None


def _numbered(names: list[str], what: str) -> list[int]:
    """Step numbers of file names of one pattern: the one number in the names that varies.

    One name: its last number. Raises ValueError when the names follow several patterns, when
    one has no number, or when more than one number varies.
    """
    patterns = {_DIGITS.sub("<N>", n) for n in names}
    if len(patterns) > 1:
        raise ValueError(
            f"the {what} follow more than one name pattern ({name_list(patterns)}): one dump per step is "
            "expected, named alike but for its step number"
        )
    numbers = [[int(d) for d in _DIGITS.findall(n)] for n in names]
    if not numbers[0]:
        raise ValueError(f"cannot tell the step of {names[0]!r} from its name: it holds no number")
    if len(names) == 1:
        return [numbers[0][-1]]
    varying = [j for j in range(len(numbers[0])) if len({row[j] for row in numbers}) > 1]
    if len(varying) > 1:
        raise ValueError(
            f"cannot tell the step from the names of the {what}: more than one number varies "
            f"({names[0]!r}, {names[-1]!r})"
        )
    at = varying[0] if varying else len(numbers[0]) - 1
    return [row[at] for row in numbers]


def _unique_steps(dumps: list[StepDump]) -> tuple[StepDump, ...]:
    """Sort by step; two dumps of one step are a ValueError naming both."""
    dumps = sorted(dumps, key=lambda d: d.step)
    for a, b in itertools.pairwise(dumps):
        if a.step == b.step:
            raise ValueError(f"two dumps of step {a.step}: {a.name} and {b.name}")
    return tuple(dumps)


def _prime_steps(root: Path, folders: list[Path]) -> tuple[list[StepDump], list[str]]:
    """Return the complete step folders (``STABLE``) of a prime-rl export, and notes on the others."""
    stable = [f for f in folders if (f / _PRIME_STABLE).is_file()]
    notes = []
    if stable and len(stable) < len(folders):
        left = [f.name for f in folders if f not in stable]
        notes.append(
            f"{len(left)} step folder(s) without prime-rl's STABLE marker ({name_list(left)}): still being "
            "written, or the run stopped in them; left out"
        )
    elif not stable:
        notes.append(
            "no step folder has prime-rl's STABLE marker (prime-rl writes one once every rank has flushed "
            "the step, since 2026-06): every folder is taken as complete"
        )
    dumps = []
    for f in stable or folders:
        ranks = sorted(
            (p for p in f.iterdir() if p.is_file() and _PRIME_RANK.fullmatch(p.name)),
            key=lambda p: int(_PRIME_RANK.fullmatch(p.name).group(1)),
        )
        dumps.append(StepDump(int(_PRIME_STEP.fullmatch(f.name).group(1)), tuple(ranks), f.name))
    return dumps, notes


def find_steps(path, *, preset: str | None = None) -> RunLayout:
    """Find the dumps of a run directory, one per training step, and its layout.

    Parameters
    ----------
    path : str or Path
        The run directory (a prime-rl output directory or its ``token_exports``, a NeMo-RL log
        directory, slime's ``train_data``, or a folder of the package's own files).
    preset : str, optional
        A reader preset (:data:`~variance_lab.rollouts.io.PRESET_NAMES`): check that the layout is
        that framework's, or read a folder of ``.jsonl`` files with it.

    Returns
    -------
    RunLayout

    Raises
    ------
    ValueError
        Not a directory, no dump in it, two layouts (or two formats) in it, names that do not
        give one step number each, two dumps of one step, or a layout other than ``preset``'s;
        the message names the directory and what it found.
    """
    root = Path(path)
    if preset is not None and preset not in PRESET_NAMES:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESET_NAMES)}")
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    if (root / "token_exports").is_dir():  # prime-rl's output directory
        root = root / "token_exports"
    folders, by_kind, other = [], {"nemo-rl": [], "slime": [], "files": []}, []
    validation = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if _PRIME_STEP.fullmatch(entry.name) and any(
                _PRIME_RANK.fullmatch(p.name) for p in entry.iterdir() if p.is_file()
            ):
                folders.append(entry)
            else:
                other.append(entry.name + "/")
        elif _NEMO_TRAIN.fullmatch(entry.name):
            by_kind["nemo-rl"].append(entry)
        elif _NEMO_VAL.fullmatch(entry.name):
            validation.append(entry.name)
        elif entry.suffix.lower() == ".pt":
            by_kind["slime"].append(entry)
        elif _file_format(entry) is not None:
            by_kind["files"].append(entry)
        else:
            other.append(entry.name)
    found = {"prime-rl": folders, **by_kind}
    present = [k for k in LAYOUTS if found[k]]
    if not present:
        raise ValueError(
            f"{root}: no step dump found: expected prime-rl's step_N/rank_R.jsonl, NeMo-RL's "
            "train_data_stepN.jsonl, slime's .pt dumps, or .jsonl[.gz], .parquet or .npz files, one per step"
            + (f" (it holds {name_list(other)})" if other else " (it is empty)")
        )
    if len(present) > 1:
        kinds = "; ".join(f"{_LAYOUT_TEXT[k]}: {name_list(p.name for p in found[k])}" for k in present)
        raise ValueError(f"{root}: mixed layouts: {kinds}; give a directory of one layout")
    layout = present[0]
    notes = []
    if layout == "prime-rl":
        dumps, notes = _prime_steps(root, folders)
    else:
        files = found[layout]
        if layout == "files":
            formats = {_file_format(p) for p in files}
            if len(formats) > 1:
                raise ValueError(
                    f"{root}: mixed layouts: files of {len(formats)} formats ({', '.join(sorted(formats))}: "
                    f"{name_list(p.name for p in files)}); give a directory of one format"
                )
        try:
            numbers = _numbered([p.name for p in files], _LAYOUT_TEXT[layout])
        except ValueError as exc:
            raise ValueError(f"{root}: {exc}") from None
        dumps = [StepDump(n, (p.resolve(),), p.name) for n, p in zip(numbers, files, strict=True)]
    if layout == "nemo-rl" and validation:
        notes.append(f"{len(validation)} NeMo-RL validation dump(s) (val_data_stepN.jsonl): not read")
    elif validation:
        other += validation
    if other:
        notes.append(
            f"{len(other)} other entr{'y' if len(other) == 1 else 'ies'} not read: {name_list(other)}"
        )
    dumps = [replace(d, paths=tuple(p.resolve() for p in d.paths)) for d in dumps]
    try:
        steps = _unique_steps(dumps)
    except ValueError as exc:
        raise ValueError(f"{root}: {exc}") from None
    if not steps:
        raise ValueError(f"{root}: no complete step")
    reader = None if layout == "files" else layout
    if preset is not None and preset != reader:
        if not (
            layout == "files" and preset in ("nemo-rl", "prime-rl") and _file_format(files[0]) == "jsonl"
        ):
            raise ValueError(f"{root}: holds {_LAYOUT_TEXT[layout]}, not what preset {preset!r} reads")
        reader = preset
    return RunLayout(root=root.resolve(), layout=layout, preset=reader, steps=steps, notes=tuple(notes))


# --------------------------------------------------------------------------------------
# one step
# --------------------------------------------------------------------------------------
def _merge_ranks(parts: list[RunRecords], folder: str) -> RunRecords:
    """prime-rl's rank files of one step as one :class:`RunRecords`: ids ``"R:LINE:PIECE"``.

    A problem keeps its rank file's name, so that an error names the file and line.
    """
    ids, problems, notes = [], {}, []
    cols = {k: [] for k in ("logp", "old_logp", "mask")}
    roll = [] if any(p.rollout_logp is not None for p in parts) else None
    extra = {k: [] for k in ("advantages", "token_ids")}
    for part in parts:
        rank = _PRIME_RANK.fullmatch(part.path.name).group(1)
        n = len(ids)
        ids += [f"{rank}:{i}" for i in part.ids]
        problems.update({n + i: f"{part.path.name}: {text}" for i, text in part.problems.items()})
        for k in cols:
            cols[k] += getattr(part, k)
        if roll is not None and part.rollout_logp is not None:
            roll += part.rollout_logp
        elif roll is not None:  # a rank file whose sequences are all bad has none: nothing to read there
            if len(part.problems) < len(part):
                raise ValueError(
                    f"{folder}/{part.path.name}: no inference_logprobs, which the step's other ranks have"
                )
            roll += [np.zeros(0)] * len(part)
        for k in extra:
            values = getattr(part, k)
            extra[k] += [None] * len(part) if values is None else values
        notes += part.notes
    extra = {k: (v if any(x is not None for x in v) else None) for k, v in extra.items()}
    return RunRecords(
        path=Path(folder),
        preset="prime-rl",
        ids=ids,
        rollout_logp=roll,
        problems=problems,
        notes=tuple(notes),
        **cols,
        **extra,
    )


def _named(exc: ValueError, path: Path, name: str) -> ValueError:
    """Return the error naming the file by its place in the run (``step_3/rank_0.jsonl``), once."""
    text = str(exc)
    text = text.removeprefix(f"{path.name}: ")
    return ValueError(f"{name}: {text}")


def load_step(
    dump: StepDump, *, preset: str | None = None, format: str | None = None, on_bad: str = "raise"
) -> TokenBatch:
    """Load the batch of one step: its file, or every rank file of a prime-rl step.

    Parameters
    ----------
    dump : StepDump
    preset : str, optional
        The reader (:attr:`RunLayout.preset`).
    format : str, optional
        The package format, for a layout of ``files``.
    on_bad : {"raise", "drop"}

    Returns
    -------
    TokenBatch

    Raises
    ------
    ValueError
        A dump that does not parse, or bad data (with ``on_bad="raise"``); the message starts with the
        file's place in the run (``step_3/rank_0.jsonl: line 4: ...``).
    """
    on_bad = check_on_bad(on_bad)
    if preset == "prime-rl" and len(dump.paths) > 1:
        parts = []
        for p in dump.paths:
            try:
                parts.append(read_run(p, "prime-rl"))
            except ValueError as exc:
                raise _named(exc, p, f"{dump.name}/{p.name}") from None
        return _merge_ranks(parts, dump.name).to_batch(on_bad)
    path = dump.paths[0]
    name = f"{dump.name}/{path.name}" if preset == "prime-rl" else dump.name
    try:
        return load_batch(path, preset=preset, format=format, on_bad=on_bad)
    except ValueError as exc:
        if preset is None and _is_verl_generations(path):
            raise ValueError(
                f"{name}: verl's rollout_data_dir dump (decoded text and score, no token log-probs); record "
                "the log-probs with variance_lab.integrations.verl (record_verl_batch)"
            ) from None
        raise _named(exc, path, name) from None


def _is_verl_generations(path: Path) -> bool:
    """Tell whether ``path`` is verl's ``_dump_generations`` JSONL (``input``, ``output``, ``score``)."""
    from variance_lab._jsonl import iter_jsonl

    if _file_format(path) != "jsonl":
        return False
    try:
        for _, rec in iter_jsonl(path):
            return (
                isinstance(rec, Mapping) and {"input", "output", "score"} <= rec.keys() and "logp" not in rec
            )
    except ValueError:
        return False
    return False
