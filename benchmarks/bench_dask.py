"""Dask executors against local threads: scaling, and the overhead of one task (README table).

::

    .venv/bin/python benchmarks/bench_dask.py [--repeats 3] [--n 524288] [--json out.json]

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


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, measure, print the table (and write JSON if asked)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2**19, help="paths of the scaling workload")
    parser.add_argument("--tiny-tasks", type=int, default=400, help="tasks of the overhead workload")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin rounds")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    args = parser.parse_args(argv)
    record = run(args.n, args.tiny_tasks, args.repeats)
    print(render(record))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
