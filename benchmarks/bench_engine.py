"""Throughput of the Monte Carlo engine against two bars measured in the same run.

Not a test: prints draws per second (token draws of log r) of

* NumPy's ``Generator.standard_normal(out=buf)`` filling a buffer (1 thread),
* a bare numba kernel that only draws standard normals from a Generator and sums them
  (1 thread, and 2 threads with one Generator each),
* the engine (``run_accumulators``: lognormal, mu = 1, sigma^2 = 0.1, the seed's T grid
  1, 10, 100, 1000, prefix sums: 1000 draws per path) with 1 and 2 workers,

and the ratios the issue sets targets for: engine / bare per worker >= 0.8, and
2 workers >= 1.8 x 1 worker. Contenders run round-robin for ``--repeats`` rounds; rates are
medians, ratios are medians of the per-round ratios. On a shared machine the rates move
with the load; the ratios, measured back to back, move less, and the bare kernel's own
2-thread scaling shows what the machine allowed at the time. Rates per CPU second (process
CPU time) are nearly free of other processes' load: they compare the work per draw.

Usage::

    .venv/bin/python benchmarks/bench_engine.py [--n 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from variance_lab import LogNormal
from variance_lab.simulate import run_accumulators
from variance_lab.simulate._jit import kernel

GRID = (1, 10, 100, 1000)


@kernel
def _bare(rng, n):  # pragma: no cover - compiled
    s = 0.0
    for _ in range(n):
        s += rng.standard_normal()
    return s


def _rate(fn, draws: int) -> tuple[float, float]:
    """(draws per wall-clock second, draws per CPU second of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return draws / (time.perf_counter() - t0), draws / (time.process_time() - c0)


def _numpy_fill(draws: int):
    rng = np.random.default_rng(1)
    buf = np.empty(1 << 20)
    k = max(1, draws // buf.size)
    return (lambda: [rng.standard_normal(out=buf) for _ in range(k)]), k * buf.size


def _bare_threads(draws: int, threads: int):
    rngs = [np.random.default_rng(i) for i in range(threads)]
    _bare(rngs[0], 10)
    per = draws // threads

    def run():
        ts = [threading.Thread(target=_bare, args=(r, per)) for r in rngs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return run, per * threads


def _engine(n: int, workers: int):
    fam = LogNormal(1.0, 0.1)
    run_accumulators(fam, GRID, 4096, workers=workers, progress=False)  # compile / load the cache
    return (lambda: run_accumulators(fam, GRID, n, seed=1, workers=workers, progress=False)), n * max(GRID)


def measure(n: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Draws per second of each contender, measured round-robin ``repeats`` times.

    Round-robin (rather than all repeats of one contender, then the next) keeps a burst
    of load from other processes from landing on one contender only.
    """
    draws = n * max(GRID)
    contenders = {
        "numpy fill, 1 thread": _numpy_fill(draws),
        "bare numba, 1 thread": _bare_threads(draws, 1),
        "engine, 1 worker": _engine(n, 1),
        "bare numba, 2 threads": _bare_threads(draws, 2),
        "engine, 2 workers": _engine(n, 2),
    }
    rates: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    for _ in range(repeats):
        for k, (fn, d) in contenders.items():
            rates[k].append(_rate(fn, d))
    return rates


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="paths per engine run (1000 draws each)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"cores available: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()}")
    print(f"draws per run: {args.n * max(GRID):.3g} (n = {args.n}, T grid {GRID}), {args.repeats} rounds")
    rates = measure(args.n, args.repeats)
    wall = {k: [w for w, _ in v] for k, v in rates.items()}
    cpu = {k: [c for _, c in v] for k, v in rates.items()}
    print("draws per second: wall clock (median, min, max) | per CPU second (median)")
    for k in rates:
        w = wall[k]
        print(
            f"  {k:24s} {statistics.median(w):10.3e} ({min(w):.2e}, {max(w):.2e}) "
            f"| {statistics.median(cpu[k]):10.3e}"
        )

    def ratio(r, num, den, scale=1.0):  # median over rounds of the ratio measured back to back
        return statistics.median(a / b / scale for a, b in zip(r[num], r[den], strict=True))

    e1, e2, b1, b2 = "engine, 1 worker", "engine, 2 workers", "bare numba, 1 thread", "bare numba, 2 threads"
    print("ratios (median over rounds of ratios measured back to back):")
    print(f"  engine / numpy fill, 1 worker, wall        {ratio(wall, e1, 'numpy fill, 1 thread'):.2f}")
    print(f"  engine / bare numba, 1 worker, wall        {ratio(wall, e1, b1):.2f}   (target >= 0.80)")
    print(f"  engine / bare numba, 1 worker, CPU time    {ratio(cpu, e1, b1):.2f}   (target >= 0.80)")
    print(f"  engine / bare numba, 2 workers, CPU time   {ratio(cpu, e2, b2):.2f}   (per worker; >= 0.80)")
    print(f"  engine scaling, 2 workers / 1, wall        {ratio(wall, e2, e1):.2f}   (target >= 1.80)")
    print(f"  bare numba scaling, 2 threads / 1, wall    {ratio(wall, b2, b1):.2f}   (machine allowed)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
