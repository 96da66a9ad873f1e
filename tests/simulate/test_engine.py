"""The public driver: determinism across workers, seeds, provenance, progress, bad input."""

import random

import numpy as np
import pandas as pd
import pytest

from variance_lab import Gamma, LogNormal, TwoPoint
from variance_lab.simulate import merge_all, prepare, run_accumulators, run_chunk, simulate
from variance_lab.simulate.engine import Engine
from variance_lab.simulate.executor import run_tasks

FAM = LogNormal(1.0, 0.1)
GRID = [1, 7, 50]
N = 20_000  # 10 chunks with the default plan


def _arrays(acc):
    return acc.shift, acc.sums, acc.tail


def _assert_identical(a, b):
    assert a.count == b.count
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference():
    """Return the one-worker accumulator that the tests below compare against."""
    return run_accumulators(FAM, GRID, N, seed=7, workers=1, progress=False)


@pytest.mark.parametrize("workers", [2, 3])
def test_bit_identical_for_any_workers(reference, workers):
    """Results are bit-identical for 2 and 3 workers."""
    _assert_identical(run_accumulators(FAM, GRID, N, seed=7, workers=workers, progress=False), reference)


def test_bit_identical_for_any_assignment(reference):
    """Chunks computed in a shuffled order merge to the reference bit for bit."""
    _, tasks = prepare(FAM, GRID, N, seed=7)
    order = list(range(len(tasks)))
    random.Random(0).shuffle(order)
    results = {i: run_chunk(tasks[i]) for i in order}  # computed in a shuffled order
    _assert_identical(merge_all(results[i] for i in range(len(tasks))), reference)


def test_frames_identical_for_any_workers():
    """Tidy frames from 1 and 2 workers are identical."""
    one = simulate(Gamma(1.0, 0.3), GRID, N, seed=1, workers=1, progress=False)
    two = simulate(Gamma(1.0, 0.3), GRID, N, seed=1, workers=2, progress=False)
    pd.testing.assert_frame_equal(one, two, check_exact=True)


def test_same_seed_same_arrays_different_seed_differs(reference):
    """The same seed repeats the arrays; another seed changes sums and tail."""
    _assert_identical(run_accumulators(FAM, GRID, N, seed=7, workers=2, progress=False), reference)
    other = run_accumulators(FAM, GRID, N, seed=8, workers=2, progress=False)
    assert not np.array_equal(other.sums, reference.sums)
    assert not np.array_equal(other.tail, reference.tail)


def test_independent_paths_differ_from_prefix_paths(reference):
    """Independent paths draw other tokens than prefix paths, for the same count."""
    ind = run_accumulators(FAM, GRID, N, seed=7, workers=2, independent=True, progress=False)
    assert ind.count == reference.count
    for j in range(len(GRID)):  # every path after the first one draws other tokens
        assert not np.array_equal(ind.sums[:, j], reference.sums[:, j])


def test_provenance():
    """The frame's provenance records seed, n, workers, chunks, family, T, draws and version."""
    df = simulate(TwoPoint(1.0, 0.1, q=0.4), [3, 1], 5000, seed=12, workers=2, progress=False)
    prov = df.attrs["provenance"]
    assert prov["seed"] == 12
    assert prov["n"] == 5000
    assert prov["workers"] == 2
    assert prov["n_chunks"] * prov["chunk_size"] >= 5000
    assert prov["wall_time_s"] > 0
    assert prov["family"] == {"family": "two-point", "mu": 1.0, "sigma2": 0.1, "q": 0.4}
    assert prov["T"] == [1, 3]
    assert prov["draws"] == 5000 * 3
    assert isinstance(prov["version"], str)


def test_default_workers_is_all_cores():
    """Without ``workers`` the run uses at least one worker (all cores)."""
    df = simulate(FAM, [2], 100, progress=False)
    assert df.attrs["provenance"]["workers"] >= 1


def test_progress_bar(capsys):
    """The progress bar shows only when asked, or automatically for long runs."""
    simulate(FAM, [2], 3000, workers=1, progress=False)
    assert capsys.readouterr().err == ""
    simulate(FAM, [2], 3000, workers=1, progress=None)  # auto: too short to show
    assert capsys.readouterr().err == ""
    simulate(FAM, [2], 3000, workers=1, progress=True)
    assert "simulating" in capsys.readouterr().err


def test_run_tasks_rejects_nothing_to_do():
    """Running no tasks raises ValueError."""
    with pytest.raises(ValueError, match="at least one task"):
        run_tasks([], workers=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 1}, "n must be.*1"),
        ({"n": 0}, "n must be.*0"),
        ({"n": 2.5}, "n must be.*2.5"),
        ({"T": [0, 5]}, "T must be.*0"),
        ({"T": [-3]}, "T must be.*-3"),
        ({"T": [4, 4]}, "duplicate.*4"),
        ({"T": [1.5]}, "T must be.*1.5"),
        ({"T": []}, "T must not be empty"),
        ({"workers": 0}, "workers must be.*0"),
        ({"workers": 1.5}, "workers must be.*1.5"),
        ({"seed": -1}, "seed must be.*-1"),
        ({"ci": 1.5}, "ci must be.*1.5"),
        ({"family": "lognormal"}, "family must be"),
        ({"chunk_size": 0}, "chunk_size must be.*0"),
    ],
)
def test_bad_input(kwargs, match):
    """Each bad argument of ``simulate`` raises ValueError naming the bad value."""
    args = {"family": FAM, "T": [1, 2], "n": 100, **kwargs}
    with pytest.raises(ValueError, match=match):
        simulate(args.pop("family"), args.pop("T"), args.pop("n"), progress=False, **args)


def test_chunk_task_is_a_picklable_unit_of_work(reference):
    """What a Dask executor needs: tasks survive pickling and give the same accumulators."""
    import pickle

    _, tasks = prepare(FAM, GRID, N, seed=7)
    results = [run_chunk(pickle.loads(pickle.dumps(t))) for t in tasks]
    _assert_identical(merge_all(results), reference)


# --------------------------------------------------------------------------- large T (issue #18)
def _check_large_T_frame(df):
    """Every k-hat finite or NaN (never an exception), every variance inside its own log10 interval."""
    khat = df.loc[df["statistic"] == "khat_P", "value"].to_numpy(float)
    assert not np.any(np.isinf(khat))
    ends = df.attrs["log10_interval"]
    for stat in ("var_P", "var_G"):
        rows = df[df["statistic"] == stat].set_index("T")
        for t, lo, hi in zip(ends[stat]["T"], ends[stat]["lo"], ends[stat]["hi"], strict=True):
            value = rows.at[t, "log10_value"]
            if np.isfinite(value):
                assert lo <= value <= hi, (stat, t, lo, value, hi)


def _large_T_cases(slow: bool):
    from variance_lab import get_family

    extra = {"ar1": {"rho": 0.5}}
    for name in ("lognormal", "two-point", "ar1", "gamma"):
        fam = get_family(name, 1.0, 0.1, **extra.get(name, {}))
        if slow:  # 1e8 token draws per run (the n = 1000, seed 0 case is in test_faults)
            yield fam, [1, 1000, 10**6], "token", (100,), range(3)
        elif name == "gamma":  # no aggregate sampler: token draws, shorter sequences
            yield fam, [1, 100, 10**4], "token", (100,), range(5)
        else:
            yield fam, [1, 1000, 10**6], "aggregate", (100, 1000, 10_000), range(10)


def _run_large_T(slow: bool):
    for fam, grid, sampler, ns, seeds in _large_T_cases(slow):
        for n in ns:
            for seed in seeds:
                df = simulate(
                    fam, grid, n, seed=seed, engine=Engine(workers=2, sampler=sampler), progress=False
                )
                _check_large_T_frame(df)


def test_large_T_small_n_all_families():
    """T up to 1e6 at n = 100 .. 10^4 over many seeds: no exception, no warning.

    pytest turns warnings into errors; intervals are in log space around their estimates.
    """
    _run_large_T(slow=False)


@pytest.mark.slow
def test_large_T_small_n_all_families_token():
    """The same with token draws at T = 1e6 for every family (the issue's crash: seed 0, n = 1000)."""
    _run_large_T(slow=True)
