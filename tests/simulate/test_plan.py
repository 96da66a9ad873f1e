"""The chunk plan depends on n (and the sampler) alone; one stream per chunk from SeedSequence(seed).spawn."""

import numpy as np
import pytest

from variance_lab.simulate.plan import (
    AGGREGATE_CHUNK,
    MAX_CHUNK,
    MIN_CHUNK,
    TAIL_MAX,
    check_seed,
    chunk_generator,
    chunk_tail_keep,
    make_plan,
    tail_size,
)


@pytest.mark.parametrize("n", [2, 3, 2047, 2048, 2049, 10**5, 10**6, 10**9 + 7])
def test_plan_covers_n(n):
    """Chunk sizes add up to n, all full but the last, within the size bounds."""
    plan = make_plan(n)
    sizes = plan.sizes()
    assert sizes.sum() == n
    assert sizes.size == plan.n_chunks
    assert np.all(sizes >= 1)
    assert np.all(sizes[:-1] == plan.chunk_size)
    assert plan.chunk_size <= MAX_CHUNK
    assert plan.chunk_size >= min(MIN_CHUNK, n)
    assert [plan.size(i) for i in range(plan.n_chunks)] == sizes.tolist()


def test_plan_depends_on_n_alone():
    """The plan depends on n alone: 1e6 paths always make 128 chunks."""
    assert make_plan(123_456) == make_plan(123_456)
    assert make_plan(10**6).n_chunks == 128


@pytest.mark.parametrize("n", [2, 5000, 10**6, 10**9 + 7])
def test_aggregate_plan_uses_large_chunks(n):
    """The aggregate sampler's paths are cheap: chunks of AGGREGATE_CHUNK paths, whatever n."""
    plan = make_plan(n, sampler="aggregate")
    assert plan.chunk_size == min(n, AGGREGATE_CHUNK)
    assert plan.sizes().sum() == n
    assert plan == make_plan(n, sampler="aggregate")
    assert make_plan(n, chunk_size=300, sampler="aggregate") == make_plan(n, chunk_size=300)


def test_plan_rejects_unknown_sampler():
    """A plan for an unresolved sampler name raises ValueError."""
    with pytest.raises(ValueError, match="sampler"):
        make_plan(1000, sampler="auto")


def test_explicit_chunk_size():
    """An explicit chunk size splits n into full chunks and a remainder."""
    plan = make_plan(1000, chunk_size=300)
    assert plan.sizes().tolist() == [300, 300, 300, 100]
    assert make_plan(10, chunk_size=100).sizes().tolist() == [10]


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "7"])
def test_bad_chunk_size(bad):
    """A chunk size that is not a positive integer raises ValueError."""
    with pytest.raises(ValueError, match="chunk_size"):
        make_plan(1000, chunk_size=bad)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, "10"])
def test_bad_n(bad):
    """An n below 2 or not an integer raises ValueError."""
    with pytest.raises(ValueError, match="n must be"):
        make_plan(bad)


def test_size_index_checked():
    """A chunk index out of range raises ValueError."""
    with pytest.raises(ValueError, match="chunk index"):
        make_plan(100).size(1)


def test_tail_size():
    """The tail size is min(n/5, 3 sqrt(n), TAIL_MAX) plus one."""
    assert tail_size(100) == 20 + 1  # n/5 below 3 sqrt(n) = 30
    assert tail_size(10**6) == 3000 + 1
    assert tail_size(10**10) == TAIL_MAX + 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, None, "3"])
def test_bad_seed(bad):
    """A seed that is not a non-negative integer raises ValueError."""
    with pytest.raises(ValueError, match="seed"):
        check_seed(bad)


def test_chunk_generator_is_the_spawned_stream():
    """Chunk i draws from the i-th child of SeedSequence(seed); chunks and seeds differ."""
    children = make_plan(10**5).seed_sequences(42)
    assert len(children) == make_plan(10**5).n_chunks
    for i in (0, 1, len(children) - 1):
        ref = np.random.Generator(np.random.PCG64(children[i])).standard_normal(5)
        np.testing.assert_array_equal(chunk_generator(42, i).standard_normal(5), ref)
    assert not np.array_equal(chunk_generator(42, 0).random(3), chunk_generator(42, 1).random(3))
    assert not np.array_equal(chunk_generator(42, 0).random(3), chunk_generator(43, 0).random(3))


def test_tasks_carry_sampler_and_tail_share():
    """Tasks carry their sampler and their chunk's share of the tail sample."""
    from variance_lab import LogNormal
    from variance_lab.simulate import AccumulatorSpec
    from variance_lab.simulate.plan import make_tasks

    plan = make_plan(10**6)
    spec = AccumulatorSpec.from_family(LogNormal(1.0, 0.1), [1, 10], plan.tail)
    tasks = make_tasks(plan, 1, [0.0, 0.3], spec, seed=1, independent=False, sampler="aggregate")
    assert {t.sampler for t in tasks} == {"aggregate"}
    assert [t.tail_keep for t in tasks] == [chunk_tail_keep(plan.n, s, plan.tail) for s in plan.sizes()]
    assert tasks[0].tail_keep < plan.tail  # a chunk keeps its share, not the whole tail
    with pytest.raises(ValueError, match="sampler"):
        make_tasks(plan, 1, [0.0, 0.3], spec, seed=1, independent=False, sampler="auto")


def test_chunk_tail_keep_small_runs_keep_everything():
    """One chunk keeps the whole tail, and no chunk more than its own paths."""
    assert chunk_tail_keep(100, 100, tail_size(100)) == tail_size(100)  # one chunk: the whole tail
    assert chunk_tail_keep(10, 3, 5) == 3  # never more than the chunk's paths


# --------------------------------------------------------------------------- work cap (issue #18)
def test_path_draws():
    """``path_draws`` counts the longest path's draws: family cost, independent paths, aggregate sampler."""
    from variance_lab.families.base import CODE_GAMMA, CODE_LOGNORMAL
    from variance_lab.simulate.plan import AGGREGATE_COST, TOKEN_COST, path_draws

    assert path_draws([1, 10, 1000]) == 1000
    assert path_draws([1, 10, 1000], independent=True) == 1011
    assert path_draws([1, 10, 1000], code=CODE_LOGNORMAL) == 1000
    assert path_draws([1, 10, 1000], code=CODE_GAMMA) == 1000 * TOKEN_COST[CODE_GAMMA]
    assert path_draws([1, 10, 1000], sampler="aggregate") == 3 * AGGREGATE_COST


@pytest.mark.parametrize("n", [2, 1000, 10**6, 10**9 + 7])
@pytest.mark.parametrize("draws", [1, 1000, 10**4, 10**6, 10**9])
def test_chunk_work_is_capped(n, draws):
    """Chunks cover n and stay under MAX_CHUNK_DRAWS unless one path per chunk."""
    from variance_lab.simulate.plan import MAX_CHUNK_DRAWS

    plan = make_plan(n, draws=draws)
    assert plan.chunk_size >= 1
    assert plan.sizes().sum() == n
    assert plan.chunk_size * draws <= MAX_CHUNK_DRAWS or plan.chunk_size == 1
    assert plan.chunk_size == min(make_plan(n).chunk_size, max(1, MAX_CHUNK_DRAWS // draws))


def test_work_cap_keeps_small_runs_unchanged():
    """The work cap leaves the plans of the README's runs unchanged."""
    # the README's table (n = 1e6, T <= 1000, lognormal) keeps its plan, and so its numbers
    assert make_plan(10**6, draws=1000) == make_plan(10**6)
    assert make_plan(10**5, draws=1000) == make_plan(10**5)


def test_capped_plan_is_bit_identical_for_any_workers():
    """At T = 2e5 the cap cuts 200 paths into chunks of 41: the same bits with 1 and 2 workers."""
    from variance_lab import LogNormal
    from variance_lab.simulate import prepare, run_accumulators

    fam, grid = LogNormal(1.0, 0.1), [1, 1000, 200_000]
    plan, _ = prepare(fam, grid, 200, seed=5)
    assert plan.chunk_size == 41
    assert plan.n_chunks == 5
    a = run_accumulators(fam, grid, 200, seed=5, workers=1, progress=False)
    b = run_accumulators(fam, grid, 200, seed=5, workers=2, progress=False)
    for x, y in ((a.shift, b.shift), (a.sums, b.sums), (a.tail, b.tail)):
        np.testing.assert_array_equal(x, y)


def test_sizes_are_lazy_and_match_the_array():
    """``sizes()`` builds no array: 1e9 one-path chunks take no memory; its array is the plan's chunking."""
    import tracemalloc

    tracemalloc.start()
    plan = make_plan(10**9 + 7, draws=10**9)
    sizes = plan.sizes()
    assert sizes.sum() == plan.n
    assert len(sizes) == plan.n_chunks == 10**9 + 7
    assert sizes[0] == 1
    assert sizes[-1] == 1
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10**6  # bytes; the array would take 8 GB
    plan = make_plan(1000, chunk_size=300)
    arr = np.asarray(plan.sizes())
    assert arr.dtype == np.int64
    assert arr.tolist() == [300, 300, 300, 100]
    assert plan.sizes()[1:].tolist() == [300, 300, 100]
    assert plan.sizes()[-1] == 100
    with pytest.raises(IndexError):
        plan.sizes()[4]
