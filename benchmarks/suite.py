"""The benchmark suite: the engine held against the limits of the machine, as ratios from one run.

Run it with ``python -m benchmarks`` (or ``make bench``); ``--quick`` is a smoke run of a
minute or two with small sizes. Every section prints what it measured and, where the
issue sets one, the target and whether this run met it:

============  ==============================================================  ==============
section       measures                                                        target
============  ==============================================================  ==============
throughput    engine token draws/s (1 worker) against a bare numba            >= 0.8
              draw-and-sum kernel and NumPy's ``standard_normal`` fill
scaling       engine with all cores against 1 worker (and the bare kernel's   >= 0.9 x cores
              own scaling: what the machine allowed)
aggregate     exact aggregate against token sampling, the derivation's T      >= 100 x
              grid
dense         every T from 1 to 1000 against the derivation's 4-point grid,   <= 3 x slower
              same n
memory        peak memory at n = 10^8 (aggregate) and token runs at smaller   < 300 MB, flat
              n, and every T from 1 to 1000 (aggregate, n = 10^6), each in
              a fresh process (VmHWM; tracemalloc for the engine's own
              allocations)
table         ``variance-lab table`` at its defaults (n = 10^6), and with     (under a minute;
              ``--sampler auto``, as subprocesses                             about a second)
first-run     a first ``variance-lab table`` (empty ``NUMBA_CACHE_DIR``:      <= 15 s extra
              every kernel compiled) against the next one (same cache),       (not judged in
              extra seconds, wall and CPU                                     ``--quick``)
theory        ``theory.grid`` points/s per family against mpmath on the same  >= 1e5/s (CPU,
              points; share certified in float64; a notebook slider move      lognormal and
              (:mod:`benchmarks.bench_theory`)                                gamma); < 0.2 s
sweep         a 1,000-cell theory-only ``sweep``: compute (plan included)     < 1 s (CPU)
              apart from the store's writes
analyze       ``variance-lab analyze`` on Parquet dumps of 1e6 and 4e6 tokens  >= 1e6 tokens
              (``--analyze-big``: and 1.6e7) against reading the same file    per CPU s, peak
              into flat NumPy arrays with pyarrow: tokens per CPU second,      <= 1.5 GB and
              peak memory (:mod:`benchmarks.bench_analyze`)                   <= 1.5 x (1.6e7)
============  ==============================================================  ==============

Contenders of a section run round-robin for ``--repeats`` rounds, so that a burst of load
from other processes does not land on one contender only; rates are medians over the
rounds, ratios are medians of the ratios measured back to back in one round. Wall-clock
rates move with the machine's load (printed before and after), CPU-time rates much less;
on a shared machine read the CPU-time ratios, and rerun on a quiet one for the performance page.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import bench_analyze, bench_theory
from variance_lab.simulate._jit import kernel

SEED_GRID = (1, 10, 100, 1000)
DENSE_GRID = tuple(range(1, 1001))
ROOT = Path(__file__).resolve().parent.parent


@kernel
def _bare(rng, n):  # pragma: no cover - compiled
    """Measure the bare limit: draw ``n`` standard normals from a Generator and sum them in a register."""
    s = 0.0
    for _ in range(n):
        s += rng.standard_normal()
    return s


# ----------------------------------------------------------------------------- helpers
def cores() -> int:
    """Return the number of CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def round_robin(contenders: dict, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Time every contender once per round, ``repeats`` rounds; ``{name: [(wall, cpu), ...]}``."""
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            out[name].append(_timed(fn))
    return out


def ratio(times, num: str, den: str, which: int = 0) -> float:
    """Median over rounds of ``time[den] / time[num]`` (a speed ratio: > 1 when ``num`` is faster)."""
    return statistics.median(b[which] / a[which] for a, b in zip(times[num], times[den], strict=True))


def median(times, name: str, which: int = 0) -> float:
    """Return the median over rounds of the ``which``-th time (0 wall, 1 CPU) recorded for ``name``."""
    return statistics.median(t[which] for t in times[name])


class Report:
    """Collects rows ``(section, what, value, target, ok)`` and prints them as they come.

    With ``quick=True`` (``--quick``) the sizes are too small for most targets, which are
    set for the full sizes (per-run overheads dominate a short run): such a row prints
    "not judged" and records ``ok=None``, ``not_judged=True``, whatever its value. Only rows
    added with ``quick_ok=True`` (a target that holds at any size, such as a peak memory
    bound at the size measured) are judged in a quick run.
    """

    def __init__(self, quick: bool = False) -> None:
        self.quick = quick
        self.rows: list[dict] = []

    def add(
        self,
        section: str,
        what: str,
        value: float,
        unit: str = "",
        target: str = "",
        ok=None,
        *,
        quick_ok: bool = False,
    ) -> None:
        """Record one result row and print it, with its target and whether it was met (or "not judged")."""
        not_judged = ok is not None and self.quick and not quick_ok
        if not_judged:
            ok = None
        row = {"section": section, "what": what, "value": value, "unit": unit, "target": target, "ok": ok}
        row["not_judged"] = not_judged
        self.rows.append(row)
        flag = "" if ok is None else ("  ok" if ok else "  MISSED")
        flag = "  not judged (quick sizes)" if not_judged else flag
        tgt = f"  (target {target})" if target else ""
        print(f"  {what:58s} {_fmt(value):>11s} {unit:8s}{tgt}{flag}", flush=True)


def _fmt(v: float) -> str:
    if v != v:  # NaN
        return "nan"
    if abs(v) >= 1e5 or (0 < abs(v) < 1e-2):
        return f"{v:.3g}"
    return f"{v:.2f}"


def _run_acc(family, T, n, *, workers, sampler="token"):
    from variance_lab.simulate import Engine, run_accumulators

    engine = Engine(workers=workers, sampler=sampler)
    return lambda: run_accumulators(family, T, n, seed=1, engine=engine, progress=False)


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

    return run


def _numpy_fill(draws: int):
    rng = np.random.default_rng(1)
    buf = np.empty(1 << 20)
    k = max(1, draws // buf.size)
    return lambda: [rng.standard_normal(out=buf) for _ in range(k)]


def _lognormal():
    from variance_lab import LogNormal

    return LogNormal(1.0, 0.1)


# ----------------------------------------------------------------------------- sections
def throughput_and_scaling(rep: Report, n: int, repeats: int) -> None:
    """Engine token draws against the bare kernel and NumPy, 1 worker and all cores."""
    fam, W = _lognormal(), cores()
    draws = n * max(SEED_GRID)
    _run_acc(fam, SEED_GRID, 4096, workers=1)()  # compile / load the caches
    contenders = {
        "numpy fill, 1 thread": _numpy_fill(draws),
        "bare, 1 thread": _bare_threads(draws, 1),
        "engine, 1 worker": _run_acc(fam, SEED_GRID, n, workers=1),
        f"bare, {W} threads": _bare_threads(draws, W),
        f"engine, {W} workers": _run_acc(fam, SEED_GRID, n, workers=W),
    }
    t = round_robin(contenders, repeats)
    print(f"[throughput] token draws of log r, lognormal, T grid {SEED_GRID}: {draws:.3g} per run")
    for name in contenders:
        rep.add("throughput", f"draws/s, {name} (wall)", draws / median(t, name), "1/s")
    e1, b1 = "engine, 1 worker", "bare, 1 thread"
    rep.add(
        "throughput",
        "engine / bare kernel, 1 worker (wall)",
        ratio(t, e1, b1),
        "",
        ">= 0.8",
        ratio(t, e1, b1) >= 0.8,
    )
    rep.add(
        "throughput",
        "engine / bare kernel, 1 worker (CPU time)",
        ratio(t, e1, b1, 1),
        "",
        ">= 0.8",
        ratio(t, e1, b1, 1) >= 0.8,
    )
    rep.add(
        "throughput",
        "engine / numpy standard_normal fill, 1 worker (wall)",
        ratio(t, e1, "numpy fill, 1 thread"),
    )
    eW, bW = f"engine, {W} workers", f"bare, {W} threads"
    per_worker = ratio(t, eW, bW, 1)
    rep.add(
        "throughput",
        f"engine / bare kernel per worker, {W} workers (CPU time)",
        per_worker,
        "",
        ">= 0.8",
        per_worker >= 0.8,
    )
    print(f"[scaling] 1 -> {W} cores (wall clock)")
    s_eng, s_bare = ratio(t, eW, e1), ratio(t, bW, b1)
    rep.add("scaling", f"engine, {W} workers / 1 worker", s_eng, "x", f">= {0.9 * W:.1f}", s_eng >= 0.9 * W)
    rep.add("scaling", f"bare kernel, {W} threads / 1 thread (what the machine allowed)", s_bare, "x")
    rep.add(
        "scaling", "engine scaling / bare kernel scaling", s_eng / s_bare, "", ">= 0.9", s_eng / s_bare >= 0.9
    )


def aggregate_vs_token(rep: Report, n: int, repeats: int, n_big: int) -> None:
    """Time the token and aggregate samplers on the four-point grid with 1 and all workers."""
    fam, W = _lognormal(), cores()
    for s in ("token", "aggregate"):
        _run_acc(fam, SEED_GRID, 4096, workers=W, sampler=s)()
    contenders = {}
    for w in sorted({1, W}):
        for s in ("token", "aggregate"):
            contenders[f"{s}, {w}"] = _run_acc(fam, SEED_GRID, n, workers=w, sampler=s)
    t = round_robin(contenders, repeats)
    print(f"[aggregate] lognormal, T grid {SEED_GRID}, n = {n:.3g}, 1 and {W} workers")
    for w in sorted({1, W}):
        tok, agg = f"token, {w}", f"aggregate, {w}"
        rep.add("aggregate", f"token sampler, paths/s, {w} workers (wall)", n / median(t, tok), "1/s")
        rep.add("aggregate", f"aggregate sampler, paths/s, {w} workers (wall)", n / median(t, agg), "1/s")
        r = ratio(t, agg, tok)
        rep.add("aggregate", f"aggregate / token speed, {w} workers (wall)", r, "x", ">= 100", r >= 100)
        r = ratio(t, agg, tok, 1)
        rep.add("aggregate", f"aggregate / token speed, {w} workers (CPU time)", r, "x", ">= 100")
    big = round_robin({"a": _run_acc(fam, SEED_GRID, n_big, workers=W, sampler="aggregate")}, repeats)
    what = f"aggregate sampler, paths/s at n = {n_big:.0e}, {W} workers (wall)"
    rep.add("aggregate", what, n_big / median(big, "a"), "1/s")
    two_point_draws(rep, n, repeats)


def _two_point_draws(n: int, grid, *, table: bool):
    """Draw ``n`` two-point aggregate paths at ``grid`` (no reduction): by table, or all by ``binomial``."""
    from variance_lab import TwoPoint
    from variance_lab.simulate.aggregate import aggregate_table
    from variance_lab.simulate.draws import aggregate_paths

    code, par = TwoPoint(1.0, 0.1, q=0.3).sampler_params()
    grid = np.asarray(grid, dtype=np.int64)
    tab = aggregate_table(code, par, grid, False).copy()
    if not table:
        tab[:, 1] = 0.0  # no inversion table: every step through Generator.binomial, as before
    out = np.empty((grid.size, 1024))
    rng = np.random.default_rng(1)
    aggregate_paths(code, par, grid, tab, False, rng, out, 4)  # compile / load

    def run():
        for _ in range(n // out.shape[1]):
            aggregate_paths(code, par, grid, tab, False, rng, out, out.shape[1])

    return run


def two_point_draws(rep: Report, n: int, repeats: int) -> None:
    """Two-point aggregate draws per second: the inversion table against ``Generator.binomial``, 1 thread."""
    grids = {"4-point": SEED_GRID, "dense": DENSE_GRID}
    sizes = {"4-point": n, "dense": max(1024, n // 250)}
    contenders = {}
    for g, grid in grids.items():
        for how in ("table", "binomial"):
            contenders[f"{g}, {how}"] = _two_point_draws(sizes[g], grid, table=how == "table")
    t = round_robin(contenders, repeats)
    print("[aggregate] two-point (q = 0.3) aggregate draws, no reduction, 1 thread")
    for g, grid in grids.items():
        draws = sizes[g] // 1024 * 1024 * len(grid)
        for how in ("table", "binomial"):
            rep.add(
                "aggregate",
                f"two-point draws/s, {g} grid, {how} (CPU)",
                draws / median(t, f"{g}, {how}", 1),
                "1/s",
            )
        r = ratio(t, f"{g}, table", f"{g}, binomial", 1)
        rep.add("aggregate", f"  two-point, {g} grid: table / binomial speed (CPU)", r, "x")


def dense_vs_sparse(rep: Report, n: int, repeats: int) -> None:
    """Time a dense grid (every T in 1..1000) against the four-point grid and compare."""
    fam, W = _lognormal(), cores()
    _run_acc(fam, DENSE_GRID, 4096, workers=W)()
    t = round_robin(
        {"4-point": _run_acc(fam, SEED_GRID, n, workers=W), "dense": _run_acc(fam, DENSE_GRID, n, workers=W)},
        repeats,
    )
    print(
        f"[dense] token sampler, lognormal, every T in 1..1000 against {SEED_GRID}, n = {n:.3g}, {W} workers"
    )
    slow = 1.0 / ratio(t, "dense", "4-point")
    slow_cpu = 1.0 / ratio(t, "dense", "4-point", 1)
    rep.add("dense", "dense grid time / 4-point grid time (wall)", slow, "x", "<= 3", slow <= 3)
    rep.add("dense", "dense grid time / 4-point grid time (CPU time)", slow_cpu, "x", "<= 3")
    extra = (median(t, "dense", 1) - median(t, "4-point", 1)) / (n * (len(DENSE_GRID) - len(SEED_GRID)))
    rep.add("dense", "accumulator cost per path and grid point (CPU)", extra * 1e9, "ns")
    per_draw = median(t, "4-point", 1) / (n * max(SEED_GRID))
    rep.add("dense", "  against the cost of one token draw (CPU)", per_draw * 1e9, "ns")


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, time, tracemalloc
    from variance_lab import LogNormal
    from variance_lab.simulate import Engine, run_accumulators
    n, sampler, T = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    fam = LogNormal(1.0, 0.1)
    engine = Engine(sampler=sampler)
    run_accumulators(fam, T, 4096, engine=engine, progress=False)  # imports and kernels loaded
    def hwm_mb():  # this program's peak RSS: VmHWM (ru_maxrss would carry the forking parent's over exec)
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = hwm_mb()
    tracemalloc.start()
    t0 = time.perf_counter()
    run_accumulators(fam, T, n, engine=engine, progress=False)
    wall = time.perf_counter() - t0
    traced = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"rss_before_mb": before, "rss_peak_mb": hwm_mb(),
                      "traced_peak_mb": traced / 2**20, "wall_s": wall}))
    """
)


def _memory_run(n: int, sampler: str, T) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, str(n), sampler, json.dumps(list(T))],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(rep: Report, agg_ns, token_ns) -> None:
    """Measure the peak resident memory of fresh processes over n, both samplers and a dense grid."""
    print(f"[memory] peak resident memory of a fresh process (imports included), T grid {SEED_GRID}")
    peaks = []
    for sampler, ns in (("aggregate", agg_ns), ("token", token_ns)):
        for n in ns:
            r = _memory_run(n, sampler, SEED_GRID)
            peaks.append(r["rss_peak_mb"])
            rep.add(
                "memory",
                f"{sampler} n = {n:.0e}: peak RSS (engine's own: {r['traced_peak_mb']:.2f} MB)",
                r["rss_peak_mb"],
                "MB",
                "< 300",
                r["rss_peak_mb"] < 300,
                quick_ok=True,
            )
            rep.add(
                "memory",
                f"  growth during the run (RSS after imports: {r['rss_before_mb']:.0f} MB)",
                r["rss_peak_mb"] - r["rss_before_mb"],
                "MB",
            )
    spread = max(peaks) / min(peaks)
    rep.add(
        "memory", "largest / smallest peak RSS over all n (flat in n)", spread, "x", "<= 1.1", spread <= 1.1
    )
    r = _memory_run(agg_ns[0], "aggregate", DENSE_GRID)
    rep.add(
        "memory",
        f"dense grid (1..1000), aggregate n = {agg_ns[0]:.0e}: peak RSS "
        f"(engine's own: {r['traced_peak_mb']:.2f} MB)",
        r["rss_peak_mb"],
        "MB",
        "< 300",
        r["rss_peak_mb"] < 300,
        quick_ok=True,
    )


def table_cli(rep: Report, quick: bool) -> None:
    """Time ``variance-lab table`` as a subprocess, start-up included, with each sampler."""
    exe = shutil.which("variance-lab", path=str(Path(sys.executable).parent)) or shutil.which("variance-lab")
    base = [exe] if exe else [sys.executable, "-m", "variance_lab.cli"]
    extra = ["--n", "100000"] if quick else []
    shown = " ".join(["variance-lab table", *extra])
    print(f"[table] `{shown}` as a subprocess (start-up included)")
    subprocess.run([*base, "table", "--n", "2000"], check=True, capture_output=True)  # warm the caches
    for label, args in (("defaults (token sampler)", []), ("--sampler auto", ["--sampler", "auto"])):
        t0 = time.perf_counter()
        subprocess.run([*base, "table", *extra, *args], check=True, capture_output=True)
        wall = time.perf_counter() - t0
        target, ok = ("< 60 s", wall < 60) if not args else ("about 1 s", None)
        rep.add("table", f"variance-lab table, {label}", wall, "s", target, ok)
    t0 = time.perf_counter()
    subprocess.run([*base, "table", "--n", "0"], check=True, capture_output=True)
    rep.add(
        "table", "variance-lab table --n 0 (theory only: start-up and theory)", time.perf_counter() - t0, "s"
    )


def _timed_child(cmd, env) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + sys) of one subprocess run to the end."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def first_run(rep: Report, quick: bool, repeats: int) -> None:
    """Time a first ``variance-lab table`` (empty numba cache) against a warm one with the same cache."""
    print("[first-run] `variance-lab table` with an empty NUMBA_CACHE_DIR, then again (warm), subprocesses")
    if quick:
        print("  first table - warm table: skipped in --quick (a round compiles every kernel), not judged")
        return
    import tempfile

    exe = shutil.which("variance-lab", path=str(Path(sys.executable).parent)) or shutil.which("variance-lab")
    cmd = [exe, "table"] if exe else [sys.executable, "-m", "variance_lab.cli", "table"]
    times: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    for _ in range(repeats):  # a fresh empty cache per round
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            times["cold"].append(_timed_child(cmd, env))
            times["warm"].append(_timed_child(cmd, env))
    extra = [c[0] - w[0] for c, w in zip(times["cold"], times["warm"], strict=True)]
    extra_cpu = [c[1] - w[1] for c, w in zip(times["cold"], times["warm"], strict=True)]
    rep.add("first-run", "first variance-lab table, empty cache (wall)", median(times, "cold"), "s")
    rep.add("first-run", "next variance-lab table, warm cache (wall)", median(times, "warm"), "s")
    e = statistics.median(extra)
    rep.add("first-run", "first table - warm table (wall)", e, "s", "<= 15 s", e <= 15)
    rep.add("first-run", "first table - warm table (CPU time)", statistics.median(extra_cpu), "s", "<= 15 s")


# ----------------------------------------------------------------------------- main
SECTIONS = ("throughput", "aggregate", "dense", "memory", "table", "first-run", "theory", "sweep", "analyze")


def _machine() -> dict:
    import numba

    from variance_lab.provenance import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": cores(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "load_average": os.getloadavg(),
    }


def main(argv=None) -> int:
    """Run the selected benchmark sections, print each result and count the targets met and missed."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, 1 round")
    ap.add_argument("--only", default=None, help=f"comma list of sections: {', '.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=None, help="rounds per timed section (default 3; quick 1)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results to this JSON file")
    ap.add_argument(
        "--analyze-big", action="store_true", help="analyze section: also the 1.6e7-token dump (minutes)"
    )
    args = ap.parse_args(argv)
    only = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(","))
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    q = args.quick
    repeats = args.repeats or (1 if q else 3)
    machine = _machine()
    print(
        f"variance_lab benchmarks{' (quick)' if q else ''}: {machine['cpu']}, {machine['cores']} cores, "
        f"python {machine['python']}, numpy {machine['numpy']}, numba {machine['numba']}"
    )
    print(f"load average before: {machine['load_average']}")
    rep = Report(quick=q)
    t0 = time.perf_counter()
    if "throughput" in only:
        throughput_and_scaling(rep, 20_000 if q else 200_000, repeats)
    if "aggregate" in only:
        aggregate_vs_token(rep, 100_000 if q else 1_000_000, repeats, 10**6 if q else 10**7)
    if "dense" in only:
        dense_vs_sparse(rep, 20_000 if q else 500_000, repeats)
    if "memory" in only:
        memory(rep, (10**6, 10**7) if q else (10**6, 10**8), (10**4, 10**5) if q else (10**5, 10**6))
    if "table" in only:
        table_cli(rep, q)
    if "first-run" in only:
        first_run(rep, q, repeats)
    if "theory" in only:
        bench_theory.grid_speed(rep, q, repeats)
        bench_theory.slider(rep, repeats)
    if "sweep" in only:
        bench_theory.theory_sweep(rep, 100 if q else 1000)
    if "analyze" in only:
        bench_analyze.analyze_section(rep, q, repeats, args.analyze_big)
    after = os.getloadavg()
    print(f"load average after: {after}; suite took {time.perf_counter() - t0:.0f} s")
    missed = [r for r in rep.rows if r["ok"] is False]
    unjudged = sum(r["not_judged"] for r in rep.rows)
    print(
        f"targets met: {sum(r['ok'] is True for r in rep.rows)}, missed: {len(missed)}"
        + (f", not judged (quick sizes): {unjudged}" if unjudged else "")
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": machine, "load_average_after": after, "quick": q, "rows": rep.rows}, indent=1
            )
        )
    return 0
