"""Dask executors against local threads: scaling, and the overhead of one task (the Dask page's table).

::

    .venv/bin/python benchmarks/bench_dask.py [--repeats 3] [--n 524288] [--json out.json]
    .venv/bin/python benchmarks/bench_dask.py --only sweep [--sweep-cells 200] [--sweep-n 100000]

Contenders: local threads (1 and 2), and a ``LocalCluster`` of 1 and of 2 one-thread
worker processes, each started once (start-up timed apart) and warmed by one run (the
workers import the package and load the kernels from numba's cache). Then, round-robin
for ``--repeats`` rounds so that a burst of load from other processes does not land on
one contender only:

* **scaling**: lognormal, the derivation's T grid (1, 10, 100, 1000), ``--n`` paths in chunks of
  the default plan (64 chunks of 8,192 paths at the default n): wall time, token draws per
  second, and speed-up over one thread;
* **overhead**: ``--tiny-tasks`` chunks of 256 paths at T = 1 (next to no compute): wall
  time per task; the overhead of a Dask task is its time per task minus that of one
  local thread running the same chunks.

Every result is checked bit for bit against the one-thread run. Load average is printed
before and after: on a busy machine the wall times move with it.

* **sweep** (``--only sweep``): ``--sweep-cells`` Monte Carlo cells of ``--sweep-n`` paths
  (lognormal, a grid of mu x sigma2, T = 1, 10, 100) on one ``LocalCluster`` of
  ``--sweep-workers`` one-thread processes, in cells per second: the sweep as it runs now
  (many cells in flight, :func:`variance_lab.sweep.sweep`) against one cell at a time
  (:func:`variance_lab.sweep.compute` and a commit per cell: what the sweep did before),
  alternated for ``--repeats`` rounds in the same session, and the share of the wall time
  the worker threads held a task (Dask's task stream: idle gaps between cells show here,
  CPU taken by other jobs does not). The theory cells are stored first and not timed; all
  stores are checked row for row, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from variance_lab import LogNormal
from variance_lab.simulate import Engine, prepare
from variance_lab.simulate.dask_executor import local_cluster
from variance_lab.sweep import Store, compute, plan, sweep

try:
    from distributed import get_task_stream
except ImportError:  # the scaling section says what to install
    get_task_stream = None

FAMILY = LogNormal(1.0, 0.1)
SEED_GRID = (1, 10, 100, 1000)
TINY_CHUNK = 256


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _same(a, b) -> bool:
    pairs = zip((a.shift, a.sums, a.tail), (b.shift, b.sums, b.tail), strict=True)
    return a.count == b.count and all(np.array_equal(x, y) for x, y in pairs)


def _timed(engine: Engine, tasks) -> tuple[float, object]:
    t0 = time.perf_counter()
    acc, _ = engine.run(tasks, progress=False)
    return time.perf_counter() - t0, acc


def _rounds(engines: dict, tasks, repeats: int) -> dict[str, list[float]]:
    """Wall times per contender, ``repeats`` round-robin rounds; every result checked against the first."""
    walls = {name: [] for name in engines}
    reference = None
    for _ in range(repeats):
        for name, engine in engines.items():
            wall, acc = _timed(engine, tasks)
            reference = acc if reference is None else reference
            if not _same(acc, reference):
                raise AssertionError(f"{name}: result differs from the first contender's")
            walls[name].append(wall)
    return walls


def _start_clusters(stack) -> tuple[dict, dict]:
    """Engines of every contender, and the start-up time of each cluster."""
    engines = {"threads, 1": Engine(workers=1), "threads, 2": Engine(workers=2)}
    startup = {}
    for procs in (1, 2):
        t0 = time.perf_counter()
        client = stack.enter_context(local_cluster(procs))
        startup[procs] = time.perf_counter() - t0
        engines[f"LocalCluster, {procs} process{'es' if procs > 1 else ''}"] = Engine(client=client)
    return engines, startup


def run(n: int, tiny_tasks: int, repeats: int) -> dict:
    """Measure both workloads; returns a JSON-able record."""
    import contextlib

    record = {"load_before": _load(), "python": platform.python_version(), "cores": os.cpu_count()}
    _, big = prepare(FAMILY, SEED_GRID, n, seed=0)
    _, tiny = prepare(FAMILY, [1], tiny_tasks * TINY_CHUNK, seed=0, chunk_size=TINY_CHUNK)
    with contextlib.ExitStack() as stack:
        engines, startup = _start_clusters(stack)
        for engine in engines.values():  # warm: imports and numba cache loads on the workers
            engine.run(big[:2], progress=False)
        scaling = _rounds(engines, big, repeats)
        overhead = _rounds(engines, tiny, repeats)
    record.update(load_after=_load(), startup_s=startup, n=n, chunks=len(big), tiny_tasks=len(tiny))
    base_wall = statistics.median(scaling["threads, 1"])
    base_task = statistics.median(overhead["threads, 1"]) / len(tiny)
    rows = []
    for name in engines:
        wall = statistics.median(scaling[name])
        per_task = statistics.median(overhead[name]) / len(tiny)
        rows.append(
            {
                "executor": name,
                "wall_s": wall,
                "draws_per_s": n * max(SEED_GRID) / wall,
                "speedup": base_wall / wall,
                "per_task_ms": 1e3 * per_task,
                "overhead_ms": 1e3 * (per_task - base_task),
            }
        )
    record["rows"] = rows
    return record


def render(record: dict) -> str:
    """Return a Markdown table of the record, with the machine's load."""
    lines = [
        f"n = {record['n']:,} paths x T up to {max(SEED_GRID)} ({record['chunks']} chunks); "
        f"{record['tiny_tasks']} tiny tasks of {TINY_CHUNK} paths at T = 1; "
        f"{record['cores']} cores, load average {record['load_before']} before, {record['load_after']} after",
        f"LocalCluster start-up: 1 process {record['startup_s'][1]:.1f} s, "
        f"2 processes {record['startup_s'][2]:.1f} s",
        "",
        "| executor | wall (s) | token draws/s | speed-up vs 1 thread | time per tiny task (ms) "
        "| overhead per task (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        lines.append(
            f"| {r['executor']} | {r['wall_s']:.2f} | {r['draws_per_s']:.2e} | {r['speedup']:.2f} "
            f"| {r['per_task_ms']:.2f} | {r['overhead_ms']:+.2f} |"
        )
    return "\n".join(lines)


#: T grid of the sweep workload: small cells, where idle workers between cells cost most.
SWEEP_T = (1, 10, 100)


def _sweep_grid(cells: int) -> dict:
    """Return a lognormal grid of ``cells`` (mu, sigma2) points: 10 mu x ``cells / 10`` sigma2 values."""
    n_mu = 10 if cells % 10 == 0 else 1
    mu = list(np.linspace(0.9, 1.1, n_mu)) if n_mu > 1 else [1.0]
    sigma2 = list(np.geomspace(0.01, 0.2, cells // n_mu))
    return {"families": "lognormal", "mu": mu, "sigma2": sigma2, "T": list(SWEEP_T)}


def _one_at_a_time(grid: dict, n: int, store: Path, engine: Engine) -> float:
    """Time the sweep's loop before cells went out together: compute a cell, commit it, next."""
    cells = [c for c in plan(**grid, n=n, seed=0).cells if c.kind == "monte_carlo"]
    t0 = time.perf_counter()
    with Store(store) as db:
        for cell in cells:
            start = time.perf_counter()
            frame, provenance = compute(cell, engine=engine)
            db.put(cell, frame, provenance, time.perf_counter() - start)
    return time.perf_counter() - t0


def _together(grid: dict, n: int, store: Path, engine: Engine) -> float:
    t0 = time.perf_counter()
    result = sweep(**grid, n=n, seed=0, store=store, engine=engine, progress=False)
    wall = time.perf_counter() - t0
    if result.failed or len(result.reused) != len(result.computed):  # theory reused, Monte Carlo computed
        raise AssertionError(result.summary())
    return wall


def run_sweep(cells: int, n: int, workers: int, repeats: int) -> dict:
    """Cells per second of a sweep on a LocalCluster: many cells at once against one at a time."""
    import tempfile

    grid = _sweep_grid(cells)
    record = {"load_before": _load(), "cells": cells, "n": n, "T": list(SWEEP_T), "workers": workers}
    walls = {"one at a time": [], "many at once": []}
    busy = {"one at a time": [], "many at once": []}
    with tempfile.TemporaryDirectory() as tmp, local_cluster(workers) as client:
        engine = Engine(client=client)
        engine.run(prepare(FAMILY, list(SWEEP_T), n, seed=0)[1][:4], progress=False)  # warm the workers
        stores = []
        for r in range(repeats):
            for name, fn in (("one at a time", _one_at_a_time), ("many at once", _together)):
                store = Path(tmp) / f"{name.replace(' ', '_')}-{r}.sqlite"
                sweep(**grid, n=0, store=store, progress=False)  # theory cells, not timed
                with get_task_stream(client=client) as stream:
                    walls[name].append(fn(grid, n, store, engine))
                busy[name].append(_busy(stream.data, walls[name][-1], workers))
                stores.append(store)
        frames = []
        for store in stores:
            with Store(store) as db:
                frames.append(db.frame().drop(columns="created"))
        if not all(f.equals(frames[0]) for f in frames):
            raise AssertionError("the stores differ")
    record.update(load_after=_load(), walls=walls, chunks_per_cell=len(prepare(FAMILY, SWEEP_T, n)[1]))
    record["cells_per_s"] = {k: cells / statistics.median(v) for k, v in walls.items()}
    record["busy"] = busy
    return record


def _busy(tasks: list[dict], wall: float, threads: int) -> float:
    """Fraction of the wall time the worker threads held a task (computing it, CPU or not)."""
    held = sum(s["stop"] - s["start"] for t in tasks for s in t["startstops"] if s["action"] == "compute")
    return held / (wall * threads)


def render_sweep(record: dict) -> str:
    """Return the sweep rows as a Markdown table, with the machine's load."""
    rate = record["cells_per_s"]
    lines = [
        f"{record['cells']} cells of n = {record['n']:,} (lognormal, T = {record['T']}, "
        f"{record['chunks_per_cell']} chunks each) on a LocalCluster of {record['workers']} processes; "
        f"load average {record['load_before']} before, {record['load_after']} after",
        "",
        "| sweep on the cluster | wall (s), each round | cells/s (median) | workers busy, each round |",
        "|---|---|---:|---|",
    ]
    for name, walls in record["walls"].items():
        busy = ", ".join(f"{100 * b:.0f} %" for b in record["busy"][name])
        lines.append(f"| {name} | {', '.join(f'{w:.1f}' for w in walls)} | {rate[name]:.2f} | {busy} |")
    lines.append(f"\nspeed-up: {rate['many at once'] / rate['one at a time']:.2f}x; every store identical")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, measure, print the table (and write JSON if asked)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2**19, help="paths of the scaling workload")
    parser.add_argument("--tiny-tasks", type=int, default=400, help="tasks of the overhead workload")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin rounds")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("--only", choices=("scaling", "sweep"), default="scaling", help="section to run")
    parser.add_argument("--sweep-cells", type=int, default=200, help="Monte Carlo cells of the sweep section")
    parser.add_argument("--sweep-n", type=int, default=100_000, help="paths per cell of the sweep section")
    parser.add_argument("--sweep-workers", type=int, default=2, help="LocalCluster processes of the sweep")
    args = parser.parse_args(argv)
    if args.only == "sweep":
        record = run_sweep(args.sweep_cells, args.sweep_n, args.sweep_workers, args.repeats)
        print(render_sweep(record))
    else:
        record = run(args.n, args.tiny_tasks, args.repeats)
        print(render(record))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
