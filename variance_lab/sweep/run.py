"""Run a sweep: plan it, skip the cells the store has, compute the rest, commit each as it finishes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from variance_lab import theory
from variance_lab.progress import progress_bar
from variance_lab.simulate import Engine, resolve_sampler, simulate, simulate_many, using_engine
from variance_lab.simulate.plan import path_draws
from variance_lab.sweep.cells import Cell, plan
from variance_lab.sweep.store import DEFAULT_STORE, Store

__all__ = ["SweepInterrupted", "SweepResult", "cell_work", "compute", "compute_theory", "sweep"]


# --------------------------------------------------------------------------- compute
def compute(cell: Cell, *, engine: Engine | None = None) -> tuple[pd.DataFrame, dict]:
    """Compute one cell: its tidy rows and its provenance (a JSON-able dict).

    ``engine`` says where Monte Carlo chunks run (default: threads on all cores); the
    cell's own sampler (part of its identity) is used, on the engine's executor.
    """
    if cell.kind == "theory":
        options = dict(cell.options)
        frame = theory.tidy(cell.family, list(cell.T), target=options["target"])
        return frame, {"engine": "theory"}
    job = _job(cell)
    sampler = job.pop("sampler")
    with using_engine(engine) as eng:
        frame = simulate(**job, engine=eng.with_sampler(sampler), progress=False)
    return _rows(frame)


def _job(cell: Cell) -> dict:
    """Return the arguments of :func:`~variance_lab.simulate.simulate` for a Monte Carlo cell."""
    options = dict(cell.options)
    return {
        "family": cell.family,
        "T": list(cell.T),
        "n": cell.n,
        "seed": cell.seed,
        "independent": options["independent"],
        "ci": options["ci"],
        "sampler": options.get("sampler", "token"),
    }


def _rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Return a simulation's Monte Carlo rows and its provenance."""
    provenance = frame.attrs.get("provenance", {})
    return frame[frame["method"] == "monte_carlo"], provenance


def compute_theory(cells: Sequence[Cell]) -> dict[str, pd.DataFrame]:
    """Compute the tidy rows of many theory cells at once, ``{cell id: frame}``.

    One vectorised :func:`variance_lab.theory.tidy_many` call per (T grid, target) instead
    of one call per cell; each frame equals ``compute(cell)[0]`` (up to its index).
    """
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell.kind != "theory":
            raise ValueError(f"not a theory cell: {cell.label()}")
        groups.setdefault((tuple(cell.T), dict(cell.options)["target"]), []).append(cell)
    out = {}
    for (T, target), group in groups.items():
        frame = theory.tidy_many([c.family for c in group], list(T), target=target)
        rows = len(frame) // len(group)
        for i, cell in enumerate(group):
            out[cell.id] = frame.iloc[i * rows : (i + 1) * rows].reset_index(drop=True)
    return out


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


def cell_work(cell: Cell) -> int:
    """Work units of one cell, the unit of the sweep's progress bar.

    A Monte Carlo cell costs its paths times the work units of one path
    (:func:`variance_lab.simulate.plan.path_draws`, the units the command line's time
    estimate counts at :data:`~variance_lab.simulate.plan.WORK_RATE`); a theory cell, a
    vectorised batch that takes milliseconds, costs nothing; a cell whose sampler the
    family does not have (it fails at once) costs nothing.
    """
    if cell.kind != "monte_carlo":
        return 0
    options = dict(cell.options)
    code, _ = cell.family.sampler_params()
    try:
        sampler = resolve_sampler(options.get("sampler", "token"), code, cell.family.name)
    except ValueError:
        return 0
    return int(cell.n) * path_draws(cell.T, independent=options["independent"], sampler=sampler, code=code)


class _Progress:
    """The sweep's progress bar: it advances by each cell's work (:func:`cell_work`), not by cells.

    Counting cells made the remaining time wrong: the theory cells, and the cells the store
    already had, finish in milliseconds, so a rate measured over them (``[00:04<00:21]``)
    promised a 24-minute sweep in half a minute. Measured in work units the rate is that of
    Monte Carlo work alone, and cells the store already has start the bar where it stands
    (tqdm's ``initial``, left out of the rate). A sweep without Monte Carlo counts cells.
    """

    def __init__(self, cells: Sequence[Cell], finished: set, progress: bool | None):
        work = {c.id: cell_work(c) for c in cells}
        self.by_work = sum(work.values()) > 0
        self.weight = work if self.by_work else {c.id: 1 for c in cells}
        self.cells, self.done = len(cells), sum(1 for c in cells if c.id in finished)
        initial = sum(self.weight[c.id] for c in cells if c.id in finished)
        self.total, self.n = sum(self.weight.values()), initial  # as tqdm's, kept without a bar
        self.bar = progress_bar(
            progress,
            self.total,
            "sweep",
            unit=" draws" if self.by_work else " cells",
            unit_scale=self.by_work,
            initial=initial,
            dynamic_ncols=True,
            leave=True,  # the sweep's last line stays: cells done, failed
        )
        self._label = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False

    def set_postfix_str(self, label: str, refresh: bool = False) -> None:
        self._label = label
        self._show(refresh)

    def _show(self, refresh: bool = False, work: int = 0) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=refresh)
            if work:
                self.bar.update(work)

    def _postfix(self) -> str:
        return f"{self.done}/{self.cells} cells" + (f": {self._label}" if self._label else "")

    def update(self, cid: str) -> None:
        """Count cell ``cid`` as done."""
        self.done += 1
        self.n += self.weight.get(cid, 0)
        self._show(work=self.weight.get(cid, 0))

    def skip(self, cid: str) -> None:
        """Count a cell the store already had: already in ``initial``, so only the count moves."""
        self._show()


def _progress_bar(cells: Sequence[Cell], finished: set, enabled: bool | None) -> _Progress:
    return _Progress(cells, finished, enabled)


def sweep(
    *grid,
    store: str | os.PathLike = DEFAULT_STORE,
    engine: Engine | None = None,
    workers: int | None = None,
    progress: bool | None = True,
    **options,
) -> SweepResult:
    """Run a grid of theory and Monte Carlo cells, resuming from ``store``.

    Parameters
    ----------
    *grid, **options
        The grid and the cells' options, as :func:`~variance_lab.sweep.cells.plan` takes them
        (its defaults too): ``families``, ``mu``, ``sigma2``, ``T``, ``n`` (positional or by
        name) and the keywords ``seed``, ``independent``, ``ci``, ``target`` and ``params``. The
        Monte Carlo cells' ``sampler`` is the engine's.
    store : str or Path
        SQLite store; created when missing. Finished cells found there are reused.
    engine : Engine, optional
        Where Monte Carlo chunks run and how they are drawn
        (:class:`variance_lab.simulate.Engine`): local threads (default), an existing Dask
        cluster, or a ``LocalCluster``; one cluster serves every cell, started or reached
        when the first Monte Carlo cell needs it. On threads cells run one after another,
        each over every thread; on a cluster the chunks of many cells are in flight at
        once (a window of a few tasks per worker thread), cells come back in any order,
        and the store stays here: a cell is committed once all its chunks are merged.
        The executor and workers do not change results; the engine's ``sampler``
        (``"token"``, ``"aggregate"``, ``"auto"``) is part of a Monte Carlo cell's identity
        (``"aggregate"`` fails the gamma cells: no exact aggregate).
        An engine given here is left open.
    workers : int, optional
        Short for ``engine=Engine(workers=workers)``: threads; not with ``engine``.
    progress : bool or None
        A progress bar over the cells' work on standard error, as
        :func:`variance_lab.progress.progress_bar` means it (True: at once; None: after a second
        where someone watches; False: none).

    Returns
    -------
    SweepResult

    Raises
    ------
    ValueError
        Bad input, no reachable point, an ``engine`` that is not an Engine (or given with
        ``workers``).
    SweepInterrupted
        On Ctrl-C; finished cells stay in the store.
    """
    if engine is not None and not isinstance(engine, Engine):
        raise ValueError(f"engine must be a variance_lab.simulate.Engine, got {engine!r}")
    the_plan = plan(*grid, sampler="token" if engine is None else engine.sampler, **options)
    result = SweepResult(
        pd.DataFrame(), Path(store), [c.id for c in the_plan.cells], unreachable=the_plan.unreachable
    )
    with using_engine(engine, workers) as eng, Store(store) as db:  # a cluster connects on first use
        finished = db.finished()
        if any(c.kind == "monte_carlo" and c.id not in finished for c in the_plan.cells):
            eng.start()  # a cluster that cannot be reached stops the sweep here, not each cell
        with _progress_bar(the_plan.cells, finished, progress) as bar:
            try:
                _run_cells(the_plan.cells, db, finished, result, bar, eng)
            except KeyboardInterrupt:
                # what the store holds: an interrupt may land after a cell's commit and
                # before it is counted (theory cells spend most of their time committing)
                done = len(db.finished() & set(result.cells))
                raise SweepInterrupted(done, len(the_plan.cells), Path(store)) from None
        result.frame = db.frame(result.cells)
    return result


def _theory_batch(cells, finished: set) -> tuple[dict, float]:
    """Pending theory cells computed in one batch, and the seconds per cell it took."""
    pending = [c for c in cells if c.kind == "theory" and c.id not in finished]
    start = time.perf_counter()
    try:
        frames = compute_theory(pending)
    except (ValueError, ArithmeticError):  # let each cell fail on its own below
        return {}, 0.0
    return frames, (time.perf_counter() - start) / max(len(pending), 1)


def _run_cells(cells, db: Store, finished: set, result: SweepResult, bar, engine) -> None:
    batch, per_cell = _theory_batch(cells, finished)
    together = [] if engine.name != "threads" else None  # a cluster takes many cells at once
    for cell in cells:
        cid = cell.id
        if cid in finished:
            result.reused.append(cid)
            bar.skip(cid)
            continue
        bar.set_postfix_str(cell.label(), refresh=False)
        if cid in batch:
            stored = db.put(cell, batch.pop(cid), {"engine": "theory"}, per_cell)
            (result.computed if stored else result.reused).append(cid)
            finished.add(cid)
            bar.update(cid)
            continue
        if together is not None:
            together.append(cell)
            continue
        start = time.perf_counter()
        try:
            frame, provenance = compute(cell, engine=engine)
        except (ValueError, ArithmeticError) as exc:
            result.failed.append({"cell": cid, "label": cell.label(), "error": str(exc)})
            bar.update(cid)
            continue
        stored = db.put(cell, frame, provenance, time.perf_counter() - start)
        (result.computed if stored else result.reused).append(cid)
        finished.add(cid)
        bar.update(cid)
    if together:
        _run_together(together, db, finished, result, bar, engine)


def _run_together(cells, db: Store, finished: set, result: SweepResult, bar, engine) -> None:
    """Monte Carlo cells on a cluster: many in flight at once, each committed as soon as it is back.

    :func:`variance_lab.simulate.simulate_many` keeps the chunks of the next cells in one
    bounded window while the last chunks of earlier ones run; cells come back in any
    order, each with the bits ``compute`` gives it, and each is committed in its own
    transaction at once. An interrupt cancels what is on the cluster: the cells in flight
    are lost, the committed ones stay, and the next run computes the rest.
    """
    by_id = {cell.id: cell for cell in cells}
    jobs = ((cell.id, _job(cell)) for cell in cells)
    with contextlib.closing(simulate_many(jobs, engine=engine)) as done:
        for cid, out in done:
            cell = by_id[cid]
            bar.set_postfix_str(cell.label(), refresh=False)
            if isinstance(out, ValueError | ArithmeticError):  # as compute's errors: this cell fails
                result.failed.append({"cell": cid, "label": cell.label(), "error": str(out)})
                bar.update(cid)
                continue
            if isinstance(out, BaseException):  # anything else stops the sweep, as one cell at a time
                raise out
            frame, provenance = _rows(out)
            # the cell's wall time on the cluster, from its first chunk submitted to its last merged
            stored = db.put(cell, frame, provenance, provenance.get("wall_time_s", 0.0))
            (result.computed if stored else result.reused).append(cid)
            finished.add(cid)
            bar.update(cid)
