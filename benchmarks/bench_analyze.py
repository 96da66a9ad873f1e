"""``variance-lab analyze FILE`` on framework-sized Parquet dumps: the suite's ``analyze`` section (#36).

For each size (tokens: 1e6 and 4e6 by default, 2.5e5 and 1e6 with ``--quick``, and 1.6e7 with
``--analyze-big``) a seeded Parquet dump is written to a temporary folder (:func:`write_dump`:
lengths log-uniform on 8..8192, 8 responses a prompt, float32 ``logp``, ``old_logp`` and
``rollout_logp`` as a trainer writes them, row groups of 1,024 sequences), then two child
processes run on it, round-robin for ``--repeats`` rounds:

* **analyze**: ``variance-lab analyze FILE --table-format json`` at its defaults, start-up
  included;
* **limit**: the same file read into flat float64 NumPy arrays (values and lengths of the three
  token columns) with pyarrow and nothing else: what reading the tokens costs on this machine.

Each child's CPU seconds (user + system) come from ``os.wait4`` (that child's own ``rusage``), its
peak resident memory from its ``VmHWM`` as it exits: ``ru_maxrss`` (of the child, or of
``RUSAGE_CHILDREN``, the largest of all children so far) carries the peak of the forking parent
over ``exec``, and this parent holds the dumps it wrote. Printed per size: tokens per CPU second
of each, their ratio (analyze / limit, at most 1), peak memory of each, and, across sizes, the
largest analyze peak over the one at the smallest size (flat in the file's size: target <= 1.5)
and, for 1.6e7 tokens, the issue's targets (>= 1e6 tokens per CPU second, <= 1.5 GB).

The dump on its own, for trying things by hand::

    python -m benchmarks.bench_analyze --write dump.parquet --tokens 1.6e7
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

#: Sizes (tokens) of the default run, of ``--quick`` and the one ``--analyze-big`` adds.
SIZES = (1_000_000, 4_000_000)
QUICK_SIZES = (250_000, 1_000_000)
BIG_SIZE = 16_000_000
#: Sequences per Parquet row group of :func:`write_dump` (about 1.2e6 tokens).
ROW_GROUP = 1024

#: Written by each child to the file named by its first argument when it exits: its peak resident
#: memory, ``VmHWM`` (reset at ``exec``; ``ru_maxrss`` would carry the forking parent's peak over it).
_PEAK = textwrap.dedent(
    """
    import atexit, sys
    def _peak(path=sys.argv.pop(1)):
        with open("/proc/self/status") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
        with open(path, "w") as out:
            out.write(str(kb))
    atexit.register(_peak)
    """
)

#: The limit: the dump's three token columns into flat float64 NumPy arrays and int64 lengths.
_LIMIT_SCRIPT = _PEAK + textwrap.dedent(
    """
    import numpy as np
    import pyarrow.parquet as pq
    table = pq.read_table(sys.argv[1], columns=["logp", "old_logp", "rollout_logp"])
    out = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        out.append(np.asarray(col.flatten().to_numpy(), dtype=np.float64))
        out.append(col.value_lengths().to_numpy().astype(np.int64))
    print(sum(a.size for a in out[::2]) // 3)
    """
)

#: ``variance-lab analyze ...`` (the arguments after the peak file's name), as its entry point runs it.
_ANALYZE_SCRIPT = _PEAK + textwrap.dedent(
    """
    from variance_lab.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def write_dump(path, n_tokens: float, *, seed: int = 0, lo: int = 8, hi: int = 8192, per_prompt: int = 8):
    """Write a seeded Parquet dump of at least ``n_tokens`` tokens; return (sequences, tokens).

    Lengths log-uniform on ``lo..hi``; ``per_prompt`` consecutive sequences share a
    ``prompt_id``. Per token: ``old_logp = -(Exp(1) + 0.01)``; the update log-ratio is
    N(0, 0.01^2), with 3 % of tokens N(0, 0.05^2); the mismatch N(0, 0.005^2), with 2 % of
    tokens N(0, 0.1^2); log-probs capped at 0, all stored as float32 lists, one row group per
    :data:`ROW_GROUP` sequences.
    """
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < n_tokens:
        lengths = np.exp(rng.uniform(math.log(lo), math.log(hi + 1), 4096)).astype(np.int64)
        lengths = np.clip(lengths, lo, hi)
        cum = total + np.cumsum(lengths)
        k = min(int(np.searchsorted(cum, n_tokens)) + 1, lengths.size)
        parts.append(lengths[:k])
        total = int(cum[k - 1])
    lengths = np.concatenate(parts)
    writer = None
    try:
        for start in range(0, lengths.size, ROW_GROUP):
            table = _row_group(rng, lengths[start : start + ROW_GROUP], start, per_prompt)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    return int(lengths.size), int(lengths.sum())


def _row_group(rng, lengths, start: int, per_prompt: int):
    import pyarrow as pa

    m = int(lengths.sum())
    old = -(rng.exponential(1.0, m) + 0.01)
    update = rng.standard_normal(m) * np.where(rng.random(m) < 0.03, 0.05, 0.01)
    mismatch = rng.standard_normal(m) * np.where(rng.random(m) < 0.02, 0.1, 0.005)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ids = np.arange(start, start + lengths.size)
    columns = {"id": pa.array(ids), "prompt_id": pa.array(ids // per_prompt)}
    for name, values in (
        ("logp", np.minimum(old + update, 0.0)),
        ("old_logp", old),
        ("rollout_logp", np.minimum(old - mismatch, 0.0)),
    ):
        columns[name] = pa.ListArray.from_arrays(offsets, pa.array(values.astype(np.float32)))
    return pa.table(columns)


def run_child(script: str, args: list[str]) -> dict:
    """Run ``python -c script PEAKFILE *args`` to the end; wall and CPU seconds (``wait4``), peak memory (MB).

    The CPU seconds (user + system) are the child's own ``rusage``; its peak resident memory is
    the ``VmHWM`` it wrote when it exited (:data:`_PEAK`).
    """
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory() as tmp,
    ):
        peak_file = Path(tmp) / "peak"
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(peak_file), *args], stdout=out, stderr=err, cwd=_ROOT
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {stderr[-2000:]}")
        peak_kb = int(peak_file.read_text())
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "peak_mb": peak_kb / 1024,
        "stdout": stdout,
    }


_ROOT = Path(__file__).resolve().parent.parent


def _analyze_args(path: Path, out: Path) -> list[str]:
    return ["analyze", str(path), "--table-format", "json", "--out", str(out)]


def measure(sizes, repeats: int, folder: Path) -> list[dict]:
    """Write a dump per size and time analyze and the limit on it, round-robin; one record per size."""
    records = []
    for n in sizes:
        path = folder / f"dump-{n:.0e}.parquet"
        n_seq, n_tok = write_dump(path, n)
        records.append(
            {"size": n, "path": path, "sequences": n_seq, "tokens": n_tok, "analyze": [], "limit": []}
        )
    run_child(_ANALYZE_SCRIPT, _analyze_args(records[0]["path"], folder / "warm.json"))
    for _ in range(repeats):  # warm above: numba's cache and the imports' files
        for rec in records:
            rec["analyze"].append(run_child(_ANALYZE_SCRIPT, _analyze_args(rec["path"], folder / "out.json")))
            rec["limit"].append(run_child(_LIMIT_SCRIPT, [str(rec["path"])]))
            if int(rec["limit"][-1]["stdout"].strip()) != rec["tokens"]:
                raise AssertionError("the limit read another number of tokens than the dump holds")
    return records


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(rep, records: list[dict]) -> None:
    """Add the rows of :func:`measure`'s records to the suite's report ``rep``."""
    for rec in records:
        n, a, lim = rec["tokens"], rec["analyze"], rec["limit"]
        print(
            f"[analyze] Parquet dump, {n:,} tokens, {rec['sequences']:,} sequences (lengths 8..8192 "
            f"log-uniform, 8 a prompt): analyze CPU {_med(a, 'cpu_s'):.1f} s (user {_med(a, 'user_s'):.1f}, "
            f"system {_med(a, 'sys_s'):.1f}), wall {_med(a, 'wall_s'):.1f} s"
        )
        rate = statistics.median(n / r["cpu_s"] for r in a)
        rate_lim = statistics.median(n / r["cpu_s"] for r in lim)
        ratios = [n / x["cpu_s"] / (n / y["cpu_s"]) for x, y in zip(a, lim, strict=True)]
        big = rec["size"] >= BIG_SIZE
        tag = f"{rec['size']:.1e} tokens"
        rep.add(
            "analyze",
            f"{tag}: analyze tokens per CPU second",
            rate,
            "1/s",
            ">= 1e6" if big else "",
            rate >= 1e6 if big else None,
        )
        rep.add("analyze", f"{tag}: limit (pyarrow to flat NumPy) tokens per CPU s", rate_lim, "1/s")
        rep.add("analyze", f"{tag}: analyze / limit speed (CPU time)", statistics.median(ratios), "")
        peak = _med(a, "peak_mb")
        rep.add(
            "analyze",
            f"{tag}: analyze peak memory",
            peak,
            "MB",
            "<= 1536" if big else "",
            peak <= 1536 if big else None,
        )
        rep.add("analyze", f"{tag}: limit peak memory", _med(lim, "peak_mb"), "MB")
        rep.add("analyze", f"{tag}: analyze / limit peak memory", peak / _med(lim, "peak_mb"), "x")
    if len(records) > 1:
        first, last = records[0], records[-1]
        growth = _med(last["analyze"], "peak_mb") / _med(first["analyze"], "peak_mb")
        what = f"analyze peak memory, {last['size']:.1e} / {first['size']:.1e} tokens (flat in size)"
        rep.add("analyze", what, growth, "x", "<= 1.5", growth <= 1.5)


def analyze_section(rep, quick: bool, repeats: int, big: bool) -> list[dict]:
    """Run the suite's ``analyze`` section: sizes by ``quick`` and ``big``, in a temporary folder."""
    sizes = (QUICK_SIZES if quick else SIZES) + ((BIG_SIZE,) if big else ())
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as tmp:
        records = measure(sizes, repeats, Path(tmp))
    report(rep, records)
    for rec in records:
        rec["path"] = str(rec["path"])
        for run in rec["analyze"] + rec["limit"]:
            run.pop("stdout", None)
    return records


def main(argv=None) -> int:
    """Write one dump (``--write PATH --tokens N``); the benchmark runs from ``python -m benchmarks``."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_analyze", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--write", required=True, metavar="PATH", help="write a dump here")
    ap.add_argument("--tokens", type=float, default=1e6, help="tokens of the dump (at least)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n_seq, n_tok = write_dump(args.write, args.tokens, seed=args.seed)
    print(json.dumps({"path": args.write, "sequences": n_seq, "tokens": n_tok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
