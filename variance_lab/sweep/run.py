"""Run a sweep: plan it, skip the cells the store has, compute the rest, commit each as it finishes."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from variance_lab import theory
from variance_lab.simulate import Engine, simulate
from variance_lab.sweep.cells import Cell, plan
from variance_lab.sweep.store import DEFAULT_STORE, Store

__all__ = ["SweepInterrupted", "SweepResult", "compute", "sweep"]


# --------------------------------------------------------------------------- compute
def compute(cell: Cell, *, workers: int | None = None, client=None) -> tuple[pd.DataFrame, dict]:
    """Compute one cell: its tidy rows and its provenance (a JSON-able dict).

    ``workers`` (threads) or ``client`` (a Dask client) say where Monte Carlo chunks run.
    """
    if cell.kind == "theory":
        options = dict(cell.options)
        frame = theory.tidy(cell.family, list(cell.T), target=options["target"])
        return frame, {"engine": "theory"}
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
