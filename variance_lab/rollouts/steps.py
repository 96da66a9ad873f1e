r"""A run, not a file: a directory of one dump per training step, analysed step by step.

:func:`analyze_run` finds the steps of a run directory
(:func:`~variance_lab.rollouts.run_layout.find_steps`, whose module lists the layouts: prime-rl's
step folders, NeMo-RL's and slime's dumps, the package's own files), analyses each with the one
per-file analysis, :func:`~variance_lab.rollouts.analysis.analyze` (so a step's numbers
are those ``variance-lab analyze`` prints for its file alone, with the same options and seed),
and gathers one row per step (:data:`STEP_COLUMNS`) and one row per step and length bucket
(the analysis table with ``step`` and ``khat_P``). Locally the steps run one after the other;
with ``scheduler=`` (or ``client=``) they run on a Dask cluster through the engine's Dask
executor (:func:`variance_lab.simulate.dask_executor.run_groups_dask`), one task per step, and
the rows are the same bits (each step is a pure function of its files and the options).

k-hat. ``khat_P`` is the Pareto :math:`\hat k` (:func:`variance_lab.stats.pareto_khat`) of the
step's sequence weights :math:`P_T = \prod_t r_t` of the ratio analysed, fitted to the
:math:`M + 1` largest :math:`\log P_T` with PSIS's
:math:`M = \lceil\min(n/5, 3\sqrt n)\rceil` (:func:`variance_lab.simulate.plan.tail_size`), over
all the step's sequences and per length bucket: above 0.7 an importance-weighted average over the
step's sequences is not to be trusted (Vehtari et al. 2024). NaN where fewer than 5 distinct
exceedances exist (a bucket of fewer than about 25 sequences).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from variance_lab._memory import reuse_freed_memory
from variance_lab.progress import progress_steps
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import check_on_bad
from variance_lab.rollouts.run_layout import RunLayout, StepDump, find_steps, load_step, name_list
from variance_lab.rollouts.split import choose_ratio, ratio_batch
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.rollouts.weights import sequence_weights
from variance_lab.simulate.plan import tail_size
from variance_lab.stats import pareto_khat

__all__ = [
    "STEP_COLUMNS",
    "RunAnalysis",
    "StepResult",
    "StepTask",
    "analyze_run",
    "analyze_step",
]

#: Columns of :attr:`RunAnalysis.steps`, one row per step, in order.
STEP_COLUMNS = (
    "step",
    "dump",
    "n_sequences",
    "n_tokens",
    "n_dropped",
    "length_min",
    "length_max",
    "ratio",
    "mu_y",
    "sigma2_y",
    "gspo_clip_frac",
    "gspo_clip_pred",
    "gspo_clip_pred_iid",
    "ppo_clip_frac",
    "ppo_clip_pred",
    "khat_P",
    "mismatch_var_log_r",
    "mismatch_k3_kl",
    "mismatch_chi2_token",
    "mismatch_share",
    "dominant",
    "verdict",
    "best_model",
)


def _khat(log_w: np.ndarray) -> float:
    """Pareto k-hat of weights from their logs: the ``tail_size(n)`` largest (module docstring)."""
    n = log_w.size
    if n < 2:
        return math.nan
    m = tail_size(n)
    return pareto_khat(np.partition(log_w, n - m)[n - m :])


@dataclass(frozen=True)
class StepTask:
    """What one step's analysis needs, picklable for a Dask worker (:func:`analyze_step`).

    Attributes
    ----------
    dump : StepDump
    preset, format : str or None
        As in :func:`load_step`.
    on_bad : str
    ratio : str or None
        As :func:`~variance_lab.rollouts.split.choose_ratio` takes it.
    options : dict
        Keyword arguments of :func:`~variance_lab.rollouts.analysis.analyze` (``edges``, ``n_boot``,
        ``seed``...).
    on_worker : bool
        Set on the tasks of a run on a Dask cluster: the worker keeps freed memory for the next array
        (:func:`variance_lab._memory.reuse_freed_memory`: Dask's nanny starts workers with
        ``MALLOC_TRIM_THRESHOLD_=65536``, with which a step of 52,000 tokens spent 2.7 of its 5.4 CPU
        seconds in the kernel). The analysis runs BLAS on one thread wherever it runs
        (:func:`~variance_lab.provenance.one_blas_thread`), so a worker's numbers are a local run's.
    """

    dump: StepDump
    preset: str | None = None
    format: str | None = None
    on_bad: str = "raise"
    ratio: str | None = None
    options: dict = field(default_factory=dict)
    on_worker: bool = False


@dataclass(frozen=True, eq=False)
class StepResult:
    """One step analysed: its row (:data:`STEP_COLUMNS`), its bucket table and its full summary.

    Attributes
    ----------
    step : int
    row : dict
    table : pandas.DataFrame
        The analysis table (:data:`~variance_lab.rollouts.judgment.ANALYSIS_COLUMNS`) with ``step``
        first and ``khat_P`` last.
    summary : dict
        :meth:`~variance_lab.rollouts.analysis.AnalysisResult.summary`, the ratio's note among its notes.
    """

    step: int
    row: dict
    table: pd.DataFrame
    summary: dict


def _mismatch(summary: dict) -> dict:
    """Return the pooled statistics of the mismatch pi_old/mu_rollout (NaN without rollout_logp)."""
    split = summary.get("split")
    keys = ("var_log_r", "k3_kl", "chi2_token")
    if not split:
        return {**{f"mismatch_{k}": math.nan for k in keys}, "mismatch_share": math.nan, "dominant": ""}
    pooled = next(r for r in split["rows"] if r["part"] == "mismatch" and r["bucket"] == -1)
    return {
        **{f"mismatch_{k}": float(pooled[k]) for k in keys},
        "mismatch_share": float(split["shares"]["mismatch"]),
        "dominant": split["dominant"],
    }


def analyze_step(task: StepTask) -> StepResult:
    """Load one step and analyse it with :func:`~variance_lab.rollouts.analysis.analyze`: a pure function.

    The ratio is chosen as for one file (:func:`~variance_lab.rollouts.split.choose_ratio`), the
    analysis runs without a progress bar, and ``khat_P`` is added (module docstring).

    Parameters
    ----------
    task : StepTask

    Returns
    -------
    StepResult
    """
    if task.on_worker:
        reuse_freed_memory()
    dump = task.dump
    batch = load_step(dump, preset=task.preset, format=task.format, on_bad=task.on_bad)
    try:
        ratio, ratio_note = choose_ratio(batch, task.ratio, name=dump.name)
    except ValueError as exc:
        raise ValueError(f"step {dump.step}: {exc}") from None
    result = analyze(batch, ratio=ratio, progress=False, **task.options)
    summary = result.summary()
    summary["notes"] += [ratio_note] if ratio_note else []
    log_p = sequence_weights(ratio_batch(batch, ratio)).log_P
    del batch
    table = result.table.copy()
    bucket, _ = length_buckets(result.lengths, task.options.get("edges"))
    table["khat_P"] = [_khat(log_p[bucket == j]) for j in table["bucket"].tolist()]
    table.insert(0, "step", dump.step)
    f, c = summary["fit"], summary["clip"]
    row = {
        "step": dump.step,
        "dump": dump.name,
        **{k: summary[k] for k in ("n_sequences", "n_tokens", "n_dropped", "length_min", "length_max")},
        "ratio": ratio,
        "mu_y": f["mu_y"],
        "sigma2_y": f["sigma2_y"],
        "gspo_clip_frac": c["gspo_obs"],
        "gspo_clip_pred": c["gspo_pred"],
        "gspo_clip_pred_iid": c["gspo_pred_iid"],
        "ppo_clip_frac": c["ppo_obs"],
        "ppo_clip_pred": c["ppo_pred"],
        "khat_P": _khat(log_p),
        **_mismatch(summary),
        "verdict": summary["verdict"],
        "best_model": summary["best_model"] or "",
    }
    return StepResult(dump.step, row, table, summary)


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RunAnalysis:
    """What :func:`analyze_run` found: one row per step, one per step and length bucket.

    Attributes
    ----------
    layout : RunLayout
    steps : pandas.DataFrame
        One row per step, in step order, columns :data:`STEP_COLUMNS`.
    buckets : pandas.DataFrame
        One row per step and non-empty length bucket: ``step``, the analysis table's columns
        (:data:`~variance_lab.rollouts.judgment.ANALYSIS_COLUMNS`) and ``khat_P``.
    summaries : tuple of dict
        Each step's :meth:`~variance_lab.rollouts.analysis.AnalysisResult.summary`, in step order.
    options : dict
        The analysis options every step was analysed with.
    """

    layout: RunLayout
    steps: pd.DataFrame
    buckets: pd.DataFrame
    summaries: tuple[dict, ...]
    options: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """Return the run as JSON-ready values: where, which layout, how many steps, the notes, the ratio.

        Keys ``root``, ``layout``, ``layout_description``, ``preset``, ``n_steps``, ``first_step``,
        ``last_step``, ``notes`` (the layout's), ``step_notes`` (:meth:`step_notes`, as
        ``{"text", "steps"}``), ``ratio``, ``ratio_label``, ``level``, ``n_boot``, ``seed`` and
        ``options`` (the analysis options).
        """
        first = self.summaries[0]
        return {
            "root": str(self.layout.root),
            "layout": self.layout.layout,
            "layout_description": self.layout.description,
            "preset": self.layout.preset,
            "n_steps": len(self.steps),
            "first_step": int(self.steps["step"].iloc[0]),
            "last_step": int(self.steps["step"].iloc[-1]),
            "notes": list(self.layout.notes),
            "step_notes": [{"text": text, "steps": steps} for text, steps in self.step_notes()],
            "ratio": first["ratio"],
            "ratio_label": first["ratio_label"],
            "level": first["level"],
            "n_boot": first["n_boot"],
            "seed": self.options.get("seed", 0),
            "options": dict(self.options),
        }

    def step_notes(self) -> list[tuple[str, list[int]]]:
        """Return the steps' notes, each text once with the steps it applies to (in order of appearance).

        A step's file name in a note is written "the step's dump", so that the same note of every step
        is one.
        """
        seen: dict[str, list[int]] = {}
        for (step, name), summary in zip(
            self.steps[["step", "dump"]].itertuples(index=False), self.summaries, strict=True
        ):
            for text in summary.get("notes") or ():
                seen.setdefault(text.replace(name, "the step's dump"), []).append(int(step))
        return list(seen.items())


def _one_ratio(results: list[StepResult]) -> None:
    """Every step analysed by one ratio, or a ValueError saying which steps took which."""
    by_ratio: dict[str, list[int]] = {}
    for r in results:
        by_ratio.setdefault(r.row["ratio"], []).append(r.step)
    if len(by_ratio) > 1:
        parts = "; ".join(f"{k} in steps {name_list(map(str, v))}" for k, v in by_ratio.items())
        raise ValueError(
            f"the steps hold different ratios ({parts}): pass ratio= to analyse one in every step"
        )


def _run_local(tasks: list[StepTask], update) -> list[StepResult]:
    out = []
    for task in tasks:
        out.append(analyze_step(task))
        update(1)
    return out


def _run_dask(tasks: list[StepTask], client, update) -> list[StepResult]:
    """One Dask task per step through the engine's executor; results back in step order."""
    from variance_lab.simulate.dask_executor import run_groups_dask

    tasks = [replace(t, on_worker=True) for t in tasks]
    results: dict[int, StepResult] = {}
    runs = run_groups_dask(((i, [t]) for i, t in enumerate(tasks)), client, fn=analyze_step)
    with contextlib.closing(runs):  # an error closes it: the other steps are cancelled on the cluster
        for i, result, _seconds in runs:
            if isinstance(result, BaseException):
                raise result
            results[i] = result
            update(1)
    return [results[i] for i in range(len(tasks))]


@contextlib.contextmanager
def _client(scheduler, client):
    """Yield the client to run on: ``client``, one connected to ``scheduler``, or None (run here)."""
    if client is not None and scheduler is not None:
        raise ValueError("pass scheduler= or client=, not both")
    if client is not None or scheduler is None:
        yield client
        return
    from variance_lab.simulate.dask_executor import check_scheduler, connect

    with connect(check_scheduler(scheduler)) as c:
        yield c


def analyze_run(
    path,
    *,
    preset: str | None = None,
    format: str | None = None,
    on_bad: str = "raise",
    ratio: str | None = None,
    scheduler=None,
    client=None,
    progress: bool | None = None,
    **options,
) -> RunAnalysis:
    """Analyse every step of a run directory: one row per step (module docstring).

    Parameters
    ----------
    path : str or Path
        The run directory (:func:`find_steps`).
    preset : str, optional
        The framework's reader, checked against the layout (:func:`find_steps`).
    format : {"jsonl", "parquet", "npz"}, optional
        The files' format, for a folder of the package's own files (default from the extensions).
    on_bad : {"raise", "drop"}
        As in :func:`~variance_lab.rollouts.io.load_batch`, in every step.
    ratio : {"update", "mismatch", "total"}, optional
        The ratio analysed in every step; None chooses per step as for one file
        (:func:`~variance_lab.rollouts.split.choose_ratio`), and steps that would take different
        ratios are an error.
    scheduler : str, optional
        A Dask scheduler, ``tcp://HOST:PORT`` or a scheduler JSON file: the steps run there, one
        task each, through :func:`~variance_lab.simulate.dask_executor.run_groups_dask`. The
        workers read the files at the paths found here (a shared file system).
    client : distributed.Client, optional
        A connected client instead of ``scheduler``.
    progress : None, True or False
        A bar over the steps (:func:`variance_lab.progress.progress_bar`).
    **options
        Passed to :func:`~variance_lab.rollouts.analysis.analyze` for every step (``edges``,
        ``n_boot``, ``level``, ``seed``, ``folds``, ``fit_tokens``, ``fit_sequences``...); every
        step uses the same ``seed``, so a step's row is what the file alone gives.

    Returns
    -------
    RunAnalysis
        The same bits wherever the steps ran.

    Raises
    ------
    ValueError
        From :func:`find_steps`, a step that does not parse (naming its file) or holds bad data,
        steps of different ratios, or an unreachable scheduler.
    """
    on_bad = check_on_bad(on_bad)
    if "progress" in options or "ratio" in options:  # pragma: no cover - both are named parameters
        raise TypeError("progress and ratio are parameters of analyze_run itself")
    layout = find_steps(path, preset=preset)
    tasks = [StepTask(d, layout.preset, format, on_bad, ratio, dict(options)) for d in layout.steps]
    with (
        _client(scheduler, client) as c,
        progress_steps(progress, len(tasks), "analyze: steps", unit="step") as update,
    ):
        results = _run_local(tasks, update) if c is None else _run_dask(tasks, c, update)
    _one_ratio(results)
    steps = pd.DataFrame([r.row for r in results], columns=list(STEP_COLUMNS))
    buckets = pd.concat([r.table for r in results], ignore_index=True)
    return RunAnalysis(layout, steps, buckets, tuple(r.summary for r in results), dict(options))
