"""Dask executors: bit-identical to local threads, worker deaths, the missing extra, the CLI.

One ``LocalCluster`` of 2 one-thread worker processes serves the module (starting one
costs seconds). Warnings that distributed emits on a slow or busy machine are filtered
here by message, not blanket.
"""

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from variance_lab import LogNormal, TwoPoint, cli
from variance_lab.cli import _common as cli_common
from variance_lab.progress import progress_bar
from variance_lab.simulate import DaskMissingError, Engine, prepare, run_accumulators, simulate, simulate_many
from variance_lab.simulate import dask_executor as dx
from variance_lab.sweep import Store, SweepInterrupted, compute, load_store, load_table, plan, sweep

pytestmark = pytest.mark.filterwarnings(
    "ignore:Creating scratch directories is taking a surprisingly long time:UserWarning"
)

FAM = LogNormal(1.0, 0.1)
GRID = [1, 7, 50]
N = 20_000  # 10 chunks with the default plan


def _has_distributed() -> bool:
    try:
        dx.import_distributed()
    except ImportError:
        return False
    return True


needs_dask = pytest.mark.skipif(not _has_distributed(), reason="needs the distributed extra")


def _assert_identical(a, b):
    assert a.count == b.count
    for x, y in zip((a.shift, a.sums, a.tail), (b.shift, b.sums, b.tail), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def client():
    """Yield a LocalCluster of 2 worker processes (1 thread, 1 GiB each) and its client."""
    if not _has_distributed():
        pytest.skip("needs the distributed extra")
    import dask

    # the scheduler reads this when it starts: a task may see several workers die under it
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 10}),
        dx.local_cluster(2, memory_limit="1GiB") as c,
    ):
        yield c


# ----------------------------------------------------------------------------- identical results
def test_simulation_is_bit_identical_to_threads(client):
    """A simulation on the Dask cluster equals the threaded one bit for bit, with its provenance."""
    local = simulate(FAM, GRID, N, seed=7, workers=2, progress=False)
    on_dask = simulate(FAM, GRID, N, seed=7, engine=Engine(client=client), progress=False)
    pd.testing.assert_frame_equal(local, on_dask, check_exact=True)
    prov = on_dask.attrs["provenance"]
    assert prov["executor"] == "dask"
    assert prov["workers"] == 2
    assert local.attrs["provenance"]["executor"] == "threads"
    as_executor = run_accumulators(TwoPoint(1.0, 0.2, q=0.3), [3, 9], 9000, seed=2, engine=Engine(client))
    local = run_accumulators(TwoPoint(1.0, 0.2, q=0.3), [3, 9], 9000, seed=2, workers=1)
    _assert_identical(as_executor, local)


def test_windowed_submission_merges_in_chunk_order(client, monkeypatch):
    """Two tasks in flight at a time, finishing in any order: still the same bits."""
    monkeypatch.setattr(dx, "MIN_WINDOW", 1)
    monkeypatch.setattr(dx, "WINDOW_PER_THREAD", 1)
    args = (FAM, GRID, 12_000)
    ref = run_accumulators(*args, seed=3, chunk_size=1000, workers=1, progress=False)
    _assert_identical(
        run_accumulators(*args, seed=3, chunk_size=1000, engine=Engine(client=client), progress=False), ref
    )
    deadline = time.monotonic() + 10
    while client.who_has() and time.monotonic() < deadline:  # releases reach the scheduler soon after
        time.sleep(0.05)
    assert not client.who_has()  # every future was released


def test_a_failing_task_raises_here_and_leaves_nothing_on_the_cluster(client):
    """A failing chunk raises its error here and the remaining tasks are cancelled."""
    _, tasks = prepare(FAM, [2], 8000, seed=0, chunk_size=1000)
    bad = [*tasks[:4], dataclasses.replace(tasks[4], code=999), *tasks[5:]]
    with pytest.raises(ValueError, match="unknown sampler code 999"):
        dx.run_tasks_dask(bad, client, progress=False, retries=0)
    deadline = time.monotonic() + 10
    while any(client.processing().values()) and time.monotonic() < deadline:  # the rest was cancelled
        time.sleep(0.05)
    assert not any(client.processing().values())


def test_scheduler_address_and_scheduler_file(client, tmp_path):
    """A scheduler address and a scheduler file both reach the cluster; no default client is left."""
    import distributed

    ref = run_accumulators(FAM, [4], 5000, seed=1, workers=1, progress=False)
    address = client.scheduler.address
    _assert_identical(run_accumulators(FAM, [4], 5000, seed=1, engine=Engine("dask", scheduler=address)), ref)
    # what `dask scheduler --scheduler-file` writes, reduced to what a client reads (this
    # version's Client.write_scheduler_file fails on tuple keys in the worker metrics)
    (tmp_path / "scheduler.json").write_text(json.dumps({"type": "Scheduler", "address": address}))
    by_file = run_accumulators(
        FAM, [4], 5000, seed=1, engine=Engine("dask", scheduler=tmp_path / "scheduler.json")
    )
    _assert_identical(by_file, ref)
    with pytest.raises(ValueError, match="No clients found"):  # ours never became the default client
        distributed.default_client()


def test_progress_bar_from_the_task_stream(client, capsys, monkeypatch):
    """The local progress bar moves by every chunk finished on the cluster."""
    bars = []

    def recording(*args, **options):
        bars.append(progress_bar(*args, **options))
        return bars[-1]

    monkeypatch.setattr(dx, "progress_bar", recording)
    simulate(FAM, [2], 6000, engine=Engine(client=client), progress=True)
    assert "simulating" in capsys.readouterr().err  # the bar of local runs
    assert bars[0].n == bars[0].total == 6000  # moved by every finished chunk


def test_workers_load_kernels_from_the_disk_cache(client):
    """Workers load the compiled kernels from numba's disk cache: hits, no misses."""
    simulate(FAM, [2], 3000, workers=1, progress=False)  # this process compiles or loads, and caches
    simulate(FAM, [2], 3000, engine=Engine(client=client), progress=False)
    stats = client.run(dx.kernel_cache_stats)  # {worker: {kernel: {"hits", "misses"}}}
    kernels = [k for per_worker in stats.values() for k in per_worker.values()]
    assert kernels, stats
    assert all(k["hits"] >= 1 and k["misses"] == 0 for k in kernels), stats


def test_sweep_is_bit_identical_to_threads(client, tmp_path):
    """A sweep on the cluster equals the threaded one bit for bit and records its executor."""
    grid = {"families": ["lognormal", "gamma"], "mu": [0.9, 1.0], "sigma2": 0.1, "T": [1, 10], "n": [0, 3000]}
    local = sweep(**grid, seed=4, store=tmp_path / "local.sqlite", workers=2, progress=False)
    on_dask = sweep(
        **grid, seed=4, store=tmp_path / "dask.sqlite", engine=Engine(client=client), progress=False
    )
    assert on_dask.cells == local.cells
    assert len(on_dask.computed) == 8
    pd.testing.assert_frame_equal(
        local.frame.drop(columns="created"), on_dask.frame.drop(columns="created"), check_exact=True
    )
    with Store(tmp_path / "dask.sqlite") as db:
        executors = {json.loads(p).get("executor") for p in db.cells()["provenance"]}
    assert executors == {"dask", None}  # Monte Carlo cells ran on Dask; theory cells have no executor


def _spy_map(client, monkeypatch) -> list[list[str]]:
    """Record the keys of every ``client.map`` call (the tasks submitted at once)."""
    calls, real = [], client.map

    def spy(fn, *iterables, key=None, **kwargs):
        calls.append(list(key))
        return real(fn, *iterables, key=key, **kwargs)

    monkeypatch.setattr(client, "map", spy)
    return calls


def _group_of(key: str) -> str:
    """Return the group number of a chunk key ``variance_lab-chunk-RUN-GROUP-CHUNK``."""
    return key.rsplit("-", 2)[1]


@pytest.mark.parametrize("window", [None, 2])
def test_groups_run_together_merge_in_order_and_fail_alone(client, monkeypatch, window):
    """Many groups share one window: each merges in chunk order; a failing group fails alone.

    With the default window (32) the chunks of all five groups go out in one call; with a
    window of 2 no call submits more than 2. Every good group equals its one-thread run.
    """
    if window is not None:
        monkeypatch.setattr(dx, "MIN_WINDOW", window)
        monkeypatch.setattr(dx, "WINDOW_PER_THREAD", 1)
    runs = {k: prepare(FAM, [1, 9], 4000, seed=k, chunk_size=1000)[1] for k in range(4)}  # 4 chunks each
    bad = [*runs[1][:2], dataclasses.replace(runs[1][2], code=999), runs[1][3]]
    calls = _spy_map(client, monkeypatch)
    groups = [(0, runs[0]), ("bad", bad), ("early", ValueError("not prepared")), (2, runs[2]), (3, runs[3])]
    out = {key: (res, s) for key, res, s in dx.run_groups_dask(groups, client, retries=0)}
    assert set(out) == {0, 2, 3, "bad", "early"}
    assert isinstance(out["early"][0], ValueError)
    assert str(out["early"][0]) == "not prepared"
    assert isinstance(out["bad"][0], ValueError)
    assert "unknown sampler code 999" in str(out["bad"][0])
    for k in (0, 2, 3):
        _assert_identical(out[k][0], run_accumulators(FAM, [1, 9], 4000, seed=k, chunk_size=1000, workers=1))
        assert out[k][1] > 0
    if window is None:
        assert len({_group_of(k) for k in calls[0]}) == 4  # every group's chunks in the first call
    else:
        assert max(len(c) for c in calls) <= 2
        assert len({_group_of(k) for c in calls for k in c}) == 4
    deadline = time.monotonic() + 10
    while (client.who_has() or any(client.processing().values())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.who_has()
    assert not any(client.processing().values())


SMALL_SWEEP = {"families": "lognormal", "mu": [0.8, 0.9, 1.0, 1.1], "sigma2": [0.05, 0.2], "T": [1, 30]}


def test_sweep_on_a_cluster_equals_one_cell_at_a_time(client, tmp_path, monkeypatch):
    """The cells of a sweep go out together and equal today's path: ``compute`` cell by cell."""
    engine = Engine(client=client)
    calls = _spy_map(client, monkeypatch)
    together = sweep(
        **SMALL_SWEEP, n=3000, seed=2, store=tmp_path / "t.sqlite", engine=engine, progress=False
    )
    assert len(together.computed) == 16
    assert len({_group_of(k) for k in calls[0]}) == 8  # 8 Monte Carlo cells of 2 chunks, one call
    with Store(tmp_path / "one.sqlite") as db:  # one cell at a time on the cluster, as before
        for cell in plan(**SMALL_SWEEP, n=3000, seed=2).cells:
            frame, prov = compute(cell, engine=engine)
            db.put(cell, frame, prov, 0.0)
        one = db.frame(together.cells)
    pd.testing.assert_frame_equal(
        one.drop(columns="created"), together.frame.drop(columns="created"), check_exact=True
    )


def test_interrupted_sweep_on_a_cluster_keeps_committed_cells_and_resumes(client, tmp_path, monkeypatch):
    """Ctrl-C while cells are in flight: committed cells stay, the cluster is emptied, a rerun ends it."""
    store, puts = tmp_path / "s.sqlite", []
    real_put = Store.put

    def put(self, cell, *args):
        if cell.kind == "monte_carlo":
            puts.append(cell.id)
            if len(puts) == 3:
                raise KeyboardInterrupt
        return real_put(self, cell, *args)

    monkeypatch.setattr(Store, "put", put)
    engine = Engine(client=client)
    with pytest.raises(SweepInterrupted, match=r"10 of 16 cells finished"):  # 8 theory + 2 Monte Carlo
        sweep(**SMALL_SWEEP, n=6000, seed=3, store=store, engine=engine, progress=False)
    deadline = time.monotonic() + 10
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(client.processing().values())  # the cells in flight were cancelled
    monkeypatch.setattr(Store, "put", real_put)
    resumed = sweep(**SMALL_SWEEP, n=6000, seed=3, store=store, engine=engine, progress=False)
    assert (len(resumed.computed), len(resumed.reused)) == (6, 10)
    clean = sweep(**SMALL_SWEEP, n=6000, seed=3, store=tmp_path / "clean.sqlite", workers=2, progress=False)
    pd.testing.assert_frame_equal(
        resumed.frame.drop(columns="created"), clean.frame.drop(columns="created"), check_exact=True
    )


def test_sweep_failures_on_a_cluster_are_per_cell(client, tmp_path):
    """The aggregate sampler fails the gamma cells alone, on a cluster as on threads."""
    grid = {"families": ["lognormal", "gamma"], "mu": 1.0, "sigma2": 0.1, "T": [1, 10], "n": 3000}
    engines = {
        "dask": Engine(client=client, sampler="aggregate"),
        "threads": Engine(workers=2, sampler="aggregate"),
    }
    results = {
        name: sweep(**grid, seed=1, store=tmp_path / f"{name}.sqlite", engine=eng, progress=False)
        for name, eng in engines.items()
    }
    for result in results.values():
        assert [f["label"] for f in result.failed] == ["monte_carlo gamma mu=1 sigma2=0.1 n=3000 seed=1"]
        assert "no exact aggregate sampler" in result.failed[0]["error"]
        assert len(result.computed) == 3
    a, b = (results[k].frame.drop(columns="created") for k in ("dask", "threads"))
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_simulate_many_yields_simulate_frames_and_errors(client):
    """simulate_many gives each job simulate's frame (any engine) and a bad job's error by its key."""
    jobs = [
        ("a", {"family": FAM, "T": [1, 5], "n": 5000, "seed": 1}),
        ("b", {"family": TwoPoint(1.0, 0.2, q=0.3), "T": [3], "n": 3000, "ci": 0.9, "sampler": "aggregate"}),
        ("c", {"family": FAM, "T": [0], "n": 5000}),
        ("d", {"family": FAM, "T": [2], "n": 5000, "colour": "red"}),
    ]
    ref = {
        "a": simulate(FAM, [1, 5], 5000, seed=1, workers=1, progress=False),
        "b": simulate(
            TwoPoint(1.0, 0.2, q=0.3),
            [3],
            3000,
            ci=0.9,
            engine=Engine(workers=1, sampler="aggregate"),
            progress=False,
        ),
    }
    for engine in (Engine(client=client), Engine(workers=2)):
        out = dict(simulate_many(jobs, engine=engine))
        for key, frame in ref.items():
            pd.testing.assert_frame_equal(out[key], frame, check_exact=True)
            assert out[key].attrs["provenance"]["executor"] == engine.name
        assert isinstance(out["c"], ValueError)
        assert "T" in str(out["c"])
        assert isinstance(out["d"], ValueError)
        assert "colour" in str(out["d"])


def test_figures_on_a_cluster_are_byte_identical(client, tmp_path):
    """``figures --executor dask --scheduler ADDRESS`` writes the same bytes as threads."""
    argv = [
        "figures",
        "--quick",
        "--only",
        "variance_vs_T",
        "--format",
        "png",
        "--dpi",
        "20",
        "--no-progress",
    ]
    assert cli.main([*argv, "--out", str(tmp_path / "threads"), "--workers", "2"]) == 0
    dask_argv = ["--executor", "dask", "--scheduler", client.scheduler.address]
    assert cli.main([*argv, *dask_argv, "--out", str(tmp_path / "dask")]) == 0
    names = sorted(p.name for p in (tmp_path / "threads").iterdir())
    assert names == ["variance_vs_T.csv", "variance_vs_T.json", "variance_vs_T.png"]
    for name in names:
        assert (tmp_path / "threads" / name).read_bytes() == (tmp_path / "dask" / name).read_bytes(), name


@pytest.mark.slow
@needs_dask
def test_cold_kernel_cache_compiles_on_the_workers_then_loads(tmp_path):
    """Workers with an empty numba cache compile at their first task, both at once.

    They give the same bits; restarted workers then load what they wrote.
    """
    ref = run_accumulators(FAM, GRID, N, seed=7, workers=1, progress=False)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    with dx.local_cluster(2, memory_limit="2GiB", env=env) as c:
        _assert_identical(
            run_accumulators(FAM, GRID, N, seed=7, engine=Engine(client=c), progress=False), ref
        )
        cold = [k for w in c.run(dx.kernel_cache_stats).values() for k in w.values()]
        c.restart()
        _assert_identical(
            run_accumulators(FAM, GRID, N, seed=7, engine=Engine(client=c), progress=False), ref
        )
        warm = [k for w in c.run(dx.kernel_cache_stats).values() for k in w.values()]
    assert sum(k["misses"] for k in cold) >= 1, cold  # compiled (a worker may load what the other wrote)
    assert warm, warm
    assert all(k["hits"] >= 1 and k["misses"] == 0 for k in warm), warm


# ----------------------------------------------------------------------------- faults
def _busy_worker(client, prefix: str, timeout: float = 30.0) -> str:
    """Address of a worker processing a task whose key starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker, keys in client.processing().items():
            if any(str(k).startswith(prefix) for k in keys):
                return worker
        time.sleep(0.01)
    raise AssertionError("no task started")


def test_killed_worker_is_recomputed_with_the_same_result(client):
    """A worker killed mid-run has its chunks recomputed, and the result is unchanged."""
    args = (FAM, [1, 10, 2000], 16 * 4096)  # 16 chunks of a few tenths of a second
    ref = run_accumulators(*args, seed=11, chunk_size=4096, workers=2, progress=False)
    box = {}

    def run():
        try:
            box["acc"] = run_accumulators(
                *args, seed=11, chunk_size=4096, engine=Engine(client=client), progress=False
            )
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    victim = _busy_worker(client, "variance_lab-chunk-")
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    killed_mid_run = thread.is_alive()
    thread.join(timeout=120)
    assert not thread.is_alive(), box
    assert "error" not in box, box
    assert killed_mid_run
    _assert_identical(box["acc"], ref)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the worker for the next tests
    assert pid not in client.run(os.getpid).values()


# ----------------------------------------------------------------------------- choices and errors
@pytest.fixture
def no_dask(monkeypatch):
    """Hide dask and distributed, as if the extra were not installed."""
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.setitem(sys.modules, "dask", None)


@pytest.mark.parametrize(
    "choice", [{"executor": "dask-local"}, {"executor": "dask", "scheduler": "tcp://h:1"}]
)
def test_missing_extra_says_what_to_install(no_dask, choice):
    """Without Dask, a Dask executor raises DaskMissingError naming the extra; threads still run."""
    with pytest.raises(DaskMissingError, match=r"pip install 'variance_lab\[distributed\]'") as info:
        Engine(**choice)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, ValueError)
    simulate(FAM, [2], 100, progress=False, engine=Engine("threads"))  # threads need nothing more


def test_missing_extra_on_the_command_line(no_dask, tmp_path, capsys):
    """Without Dask, ``--executor dask-local`` is one stderr line naming the extra."""
    argv = ["sweep", "--executor", "dask-local", "--store", str(tmp_path / "s.sqlite"), "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "variance_lab[distributed]" in err, err


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        ({"executor": "gpu"}, "executor must be one of threads, dask, dask-local"),
        ({"executor": 5}, "executor must be one of .* or a Dask client, got 5"),
        ({"executor": "threads", "scheduler": "tcp://h:1"}, "needs executor='dask'"),
        ({"executor": "dask-local", "scheduler": "tcp://h:1"}, "starts its own cluster"),
        ({"executor": "dask"}, "needs one of: a scheduler address"),
        ({"executor": "dask", "scheduler": "h:8786"}, "SCHEME://HOST:PORT"),
        ({"executor": "dask", "scheduler": "tcp://h"}, "SCHEME://HOST:PORT"),
        ({"executor": "dask", "scheduler": "tcp://h:99999"}, "SCHEME://HOST:PORT"),
        ({"executor": "dask", "scheduler": "missing.json"}, "scheduler file 'missing.json' does not exist"),
        ({"executor": "dask", "scheduler": "tcp://h:1", "workers": 2}, "has its own workers"),
        ({"executor": "dask", "client": object()}, "client must be a distributed.Client"),
        ({"executor": "dask-local", "workers": 0}, "workers must be an integer >= 1"),
    ],
)
@needs_dask
def test_bad_choice(choice, match):
    """Each invalid executor, scheduler, client or worker combination raises its ValueError."""
    with pytest.raises(ValueError, match=match):
        Engine(**choice)


@needs_dask
def test_unreachable_scheduler(monkeypatch):
    """An unreachable scheduler address raises ValueError naming it, after the connect timeout."""
    monkeypatch.setattr(dx, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(ValueError, match=r"cannot reach the Dask scheduler 'tcp://127\.0\.0\.1:9'"):
        simulate(FAM, [2], 100, progress=False, engine=Engine("dask", scheduler="tcp://127.0.0.1:9"))


def test_cli_executors_match_the_engine():
    """The command line offers exactly the engine's executors (one tuple, in the schema)."""
    import argparse

    from variance_lab.schema import EXECUTORS

    parser = argparse.ArgumentParser(exit_on_error=False)
    cli_common.add_executor_args(parser)
    assert [parser.parse_args(["--executor", name]).executor for name in EXECUTORS] == list(EXECUTORS)
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser.parse_args(["--executor", "processes"])
    with pytest.raises(ValueError, match="executor must be one of threads, dask, dask-local"):
        Engine("processes")


@pytest.mark.parametrize(
    "extra",
    [
        ["--executor", "gpu"],
        ["--executor", "dask"],
        ["--executor", "dask", "--scheduler", "nonsense"],
        ["--scheduler", "tcp://127.0.0.1:9"],
        ["--executor", "dask", "--scheduler", "tcp://127.0.0.1:9", "--n", "3000"],  # nobody there
    ],
)
@needs_dask
def test_cli_bad_executor_is_one_line_and_exit_2(extra, tmp_path, capsys, monkeypatch):
    """A bad executor or scheduler on the command line is exit 2 with one stderr line."""
    monkeypatch.setattr(dx, "CONNECT_TIMEOUT_S", 1)
    argv = ["sweep", "--T", "1,10", "--store", str(tmp_path / "s.sqlite"), "--no-progress", *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("variance-lab: error: "), err
    assert err.count("\n") == 1, err


@needs_dask
def test_cli_sweep_on_a_local_cluster(tmp_path, capsys):
    """``sweep --executor dask-local`` exports the same rows as the threaded sweep."""
    argv = ["sweep", "--mu", "0.9,1", "--T", "1,10", "--n", "3000", "--seed", "5", "--no-progress"]
    assert cli.main([*argv, "--store", str(tmp_path / "a.sqlite"), "--out", str(tmp_path / "a.csv")]) == 0
    dask_argv = ["--executor", "dask-local", "--workers", "2", "--store", str(tmp_path / "b.sqlite")]
    assert cli.main([*argv, *dask_argv, "--out", str(tmp_path / "b.csv")]) == 0
    assert "4 cells: 4 computed" in capsys.readouterr().out
    a, b = (load_table(tmp_path / f"{x}.csv").drop(columns="created") for x in "ab")
    pd.testing.assert_frame_equal(a, b, check_exact=True)


# ----------------------------------------------------------------------------- the client killed
def _cells(store) -> int:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
@needs_dask
def test_client_killed_mid_sweep_loses_only_cells_in_flight(tmp_path):
    """SIGKILL the client (and its LocalCluster), run again: the same rows as one clean run."""
    argv = ["sweep", "--mu", "0.8,0.9,1,1.1", "--sigma2", "0.05,0.2", "--T", "1,100,2000", "--n", "100000"]
    argv += ["--seed", "3", "--no-progress", "--executor", "dask-local", "--workers", "2"]
    store = tmp_path / "killed.sqlite"
    cmd = [sys.executable, "-m", "variance_lab.cli", *argv, "--store", str(store)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _cells(store) < 10 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the client and its worker processes
        proc.communicate()
    done = _cells(store)
    assert 10 <= done < 16
    assert cli.main([*argv, "--store", str(store)]) == 0
    assert cli.main([*argv[:-4], "--workers", "2", "--store", str(tmp_path / "clean.sqlite")]) == 0
    killed, clean = (load_store(p).drop(columns="created") for p in (store, tmp_path / "clean.sqlite"))
    pd.testing.assert_frame_equal(killed, clean, check_exact=True)
