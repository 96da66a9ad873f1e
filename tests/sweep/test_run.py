"""Sweeps, the SQLite store, cell identity, resumption and export (variance_lab.sweep)."""

import json
import sqlite3
import sys

import numpy as np
import pandas as pd
import pytest

from variance_lab import __version__, theory
from variance_lab.families import get_family
from variance_lab.schema import TIDY_COLUMNS
from variance_lab.sweep import (
    STORE_COLUMNS,
    Cell,
    Store,
    compute,
    export,
    extra_parameters,
    load_store,
    load_table,
    plan,
    sweep,
)

T_GRID = [1, 10, 100]


# ----------------------------------------------------------------------------- cells and plans
def test_cell_identity_is_sha256_of_canonical_key():
    """A cell's id is the SHA-256 of its canonical JSON key: version, family, T and code."""
    family = get_family("lognormal", 1.0, 0.1)
    cell = Cell("theory", family, (1, 10), options=(("target", 0.1),))
    key = cell.key()
    assert key["version"] == __version__
    assert key["family"] == {"family": "lognormal", "mu": 1.0, "sigma2": 0.1}
    assert key["T"] == [1, 10]
    assert len(key["code"]) == 64  # fingerprint of the code that computes it
    import hashlib

    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"))
    assert cell.id == hashlib.sha256(canonical.encode()).hexdigest()


def test_cell_identity_changes_with_everything_that_matters():
    """Changing n, seed, T, a parameter, the family, an option or the method changes the id."""
    fam = get_family("lognormal", 1.0, 0.1)
    mc = (("ci", 0.95), ("independent", False))
    base = Cell("monte_carlo", fam, (1, 10), 1000, 0, mc)
    variants = [
        Cell("monte_carlo", fam, (1, 10), 1001, 0, mc),  # n
        Cell("monte_carlo", fam, (1, 10), 1000, 1, mc),  # seed
        Cell("monte_carlo", fam, (1, 10, 100), 1000, 0, mc),  # the T grid
        Cell("monte_carlo", get_family("lognormal", 1.0, 0.2), (1, 10), 1000, 0, mc),  # a parameter
        Cell("monte_carlo", get_family("gamma", 1.0, 0.1), (1, 10), 1000, 0, mc),  # the family
        Cell("monte_carlo", fam, (1, 10), 1000, 0, (("ci", 0.9), ("independent", False))),
        Cell("monte_carlo", fam, (1, 10), 1000, 0, (("ci", 0.95), ("independent", True))),
        Cell("theory", fam, (1, 10), options=(("target", 0.1),)),  # the method
    ]
    ids = {base.id, *(v.id for v in variants)}
    assert len(ids) == len(variants) + 1
    assert Cell("monte_carlo", fam, (1, 10), 1000, 0, mc).id == base.id  # deterministic
    two_point = [get_family("two-point", 1.0, 0.1, q=q) for q in (0.5, 0.4)]
    assert len({Cell("theory", f, (1,)).id for f in two_point}) == 2  # extra parameters too


def test_other_code_is_another_cell(monkeypatch):
    """A changed code fingerprint gives another cell id."""
    import variance_lab.sweep.cells as sweep_mod

    cell = Cell("theory", get_family("lognormal", 1.0, 0.1), (1, 10))
    before = cell.id
    assert sweep_mod.code_fingerprint("theory") != sweep_mod.code_fingerprint("monte_carlo")
    monkeypatch.setattr(sweep_mod, "code_fingerprint", lambda kind: "edited")
    assert cell.id != before


def test_plan_cells_and_unreachable_points():
    """The plan holds one theory and one Monte Carlo cell per reachable point, lists the rest."""
    p = plan(["lognormal", "two-point"], [1.0, 0.5], [0.1, 0.5], T_GRID, [0, 1000], seed=3)
    # two-point (q = 1/2) needs sigma2 < mu^2: mu = 0.5, sigma2 = 0.5 is out of reach.
    assert [(u["family"], u["mu"], u["sigma2"]) for u in p.unreachable] == [("two-point", 0.5, 0.5)]
    assert "cannot reach" in p.unreachable[0]["reason"]
    kinds = [c.kind for c in p.cells]
    assert kinds.count("theory") == 7
    assert kinds.count("monte_carlo") == 7
    assert {c.n for c in p.cells if c.kind == "monte_carlo"} == {1000}
    assert {c.seed for c in p.cells if c.kind == "theory"} == {None}
    assert all(c.T == (1, 10, 100) for c in p.cells)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"families": "normal"}, "unknown family 'normal'"),
        ({"mu": [1.0, -1.0]}, "mu must be > 0"),
        ({"sigma2": -0.1}, "sigma2 must be >= 0"),
        ({"sigma2": float("nan")}, "sigma2 must be finite"),
        ({"T": [0, 1]}, "T must be integers >= 1"),
        ({"T": [1, 1]}, "duplicate"),
        ({"n": 1}, "n must be 0 .theory only. or an integer >= 2"),
        ({"n": [0, 2.5]}, "n must be 0"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"ci": 1.5}, "ci must lie in"),
        ({"target": 0}, "target must be"),
        ({"families": "two-point", "mu": 1.0, "sigma2": [1.0, 2.0]}, "no reachable point"),
        ({"params": {"rho": [0.5]}}, "'rho' applies to none of the families lognormal"),
        ({"families": "ar1", "params": {"rho": [2.0]}}, "rho must lie in"),
    ],
)
def test_plan_bad_input(kwargs, message):
    """Each bad sweep argument raises ValueError naming it."""
    with pytest.raises(ValueError, match=message):
        plan(**{"T": T_GRID, **kwargs})


def test_extra_parameters_are_swept_per_family():
    """Extra parameters (two-point's q) are swept only for the families that take them."""
    assert extra_parameters("two-point") == ("q",)
    assert extra_parameters("lognormal") == ()
    p = plan(["lognormal", "two-point"], 1.0, 0.1, T_GRID, params={"q": [0.3, 0.5]})
    labels = sorted(c.label() for c in p.cells)
    assert labels == [
        "theory lognormal mu=1 sigma2=0.1",
        "theory two-point mu=1 sigma2=0.1 q=0.3",
        "theory two-point mu=1 sigma2=0.1 q=0.5",
    ]


# ----------------------------------------------------------------------------- store
def _rows_per_cell(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT cell, COUNT(*) FROM results GROUP BY cell").fetchall())


def test_theory_sweep_stores_tidy_rows_with_provenance(tmp_path):
    """A theory sweep stores theory.tidy's rows once per cell, with provenance, in a WAL store."""
    store = tmp_path / "s.sqlite"
    result = sweep(["lognormal", "two-point"], [0.9, 1.0], [0.1, 1.0], T_GRID, store=store, progress=False)
    assert len(result.cells) == 6
    assert len(result.computed) == 6
    assert not result.reused
    assert len(result.unreachable) == 2
    assert not result.failed
    frame = result.frame
    assert tuple(frame.columns) == STORE_COLUMNS
    assert set(frame["method"]) == {"exact", "lognormal", "delta", "naive"}
    assert (frame["n"] == 0).all()
    assert frame["seed"].isna().all()
    assert (frame["version"] == __version__).all()
    assert frame["created"].str.match(r"\d{4}-\d\d-\d\dT").all()
    # one row per (family, mu, sigma2, T, statistic, method)
    assert not frame.duplicated(["family", "mu", "sigma2", "params", "T", "statistic", "method"]).any()
    # the rows are theory.tidy's, unchanged
    fam = get_family("lognormal", 0.9, 1.0)
    mine = frame[(frame["family"] == "lognormal") & (frame["mu"] == 0.9) & (frame["sigma2"] == 1.0)]
    ref = theory.tidy(fam, T_GRID).sort_values(["T", "statistic", "method"]).reset_index(drop=True)
    mine = mine[list(TIDY_COLUMNS)].sort_values(["T", "statistic", "method"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, ref, check_dtype=False)
    assert set(_rows_per_cell(store).values()) == {len(ref)}
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_written_before_the_rename_reads_seed_rows_as_naive(tmp_path):
    """Rows stored as ``method = 'seed'`` (before the rename) load as ``naive``; the store is not changed."""
    store = tmp_path / "s.sqlite"
    sweep("lognormal", 1.0, 0.1, T_GRID, store=store, progress=False)
    fresh = load_store(store)
    with sqlite3.connect(store) as conn:
        old = conn.execute("UPDATE results SET method = 'seed' WHERE method = 'naive'").rowcount
    assert old == len(T_GRID)
    pd.testing.assert_frame_equal(load_store(store), fresh)
    with sqlite3.connect(store) as conn:  # read, not rewritten
        assert conn.execute("SELECT COUNT(*) FROM results WHERE method = 'seed'").fetchone()[0] == old


def test_rerun_reuses_finished_cells(tmp_path):
    """A rerun reuses finished cells and computes only new points and new T grids."""
    store = tmp_path / "s.sqlite"
    first = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=store, progress=False)
    again = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=store, progress=False)
    assert not again.computed
    assert sorted(again.reused) == sorted(first.cells)
    pd.testing.assert_frame_equal(first.frame, again.frame)
    bigger = sweep("lognormal", [0.9, 1.0, 1.1], 0.1, T_GRID, store=store, progress=False)
    assert len(bigger.computed) == 1
    assert len(bigger.reused) == 2
    assert sorted(bigger.frame["mu"].unique()) == [0.9, 1.0, 1.1]
    new_T = sweep("lognormal", [0.9, 1.0], 0.1, [1, 10], store=store, progress=False)
    assert len(new_T.computed) == 2  # a new T grid is a new cell
    assert len(load_store(store)["cell"].unique()) == 5


def test_put_is_one_transaction_and_never_duplicates(tmp_path):
    """Storing a cell is one transaction: a repeat is refused, a duplicate row aborts the cell."""
    cell = plan("lognormal", 1.0, 0.1, T_GRID).cells[0]
    frame, prov = compute(cell)
    with Store(tmp_path / "s.sqlite") as db:
        assert db.put(cell, frame, prov, 0.1) is True
        assert db.put(cell, frame, prov, 0.1) is False  # e.g. a concurrent run finished it first
        assert db.finished() == {cell.id}
        broken = frame.copy()
        broken.loc[broken.index[1], ["T", "statistic", "method"]] = broken.loc[
            broken.index[0], ["T", "statistic", "method"]
        ].to_numpy()
        other = plan("lognormal", 1.0, 0.2, T_GRID).cells[0]
        with pytest.raises(sqlite3.IntegrityError):
            db.put(other, broken, prov, 0.1)  # a duplicate row aborts the whole cell
        assert db.finished() == {cell.id}
        cells = db.cells()
    assert len(cells) == 1
    assert json.loads(cells["key"][0])["T"] == T_GRID
    assert json.loads(cells["provenance"][0]) == {"engine": "theory"}


def test_theory_cells_in_one_batch_equal_one_at_a_time(tmp_path, monkeypatch):
    """Theory cells computed in one batch equal one at a time, also when the batch fails and falls back."""
    import variance_lab.sweep.run as sweep_mod

    the_plan = plan(["lognormal", "two-point"], [0.9, 1.0], [0.01, 0.1], T_GRID, params={"q": [0.3, 0.5]})
    batch = sweep_mod.compute_theory(the_plan.cells)
    assert set(batch) == {c.id for c in the_plan.cells}
    for cell in the_plan.cells:
        pd.testing.assert_frame_equal(batch[cell.id], compute(cell)[0].reset_index(drop=True))
    with pytest.raises(ValueError, match="not a theory cell"):
        sweep_mod.compute_theory([Cell("monte_carlo", get_family("lognormal", 1.0, 0.1), (1,), 10, 0)])
    # a batch that fails falls back to one cell at a time, with the same rows in the store
    batched = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=tmp_path / "a.sqlite", progress=False)

    def broken(cells):
        raise ValueError("batch")

    monkeypatch.setattr(sweep_mod, "compute_theory", broken)
    single = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=tmp_path / "b.sqlite", progress=False)
    assert len(single.computed) == 2
    assert not single.failed
    cols = [c for c in STORE_COLUMNS if c != "created"]  # the commit time differs
    pd.testing.assert_frame_equal(batched.frame[cols], single.frame[cols])


def test_failed_cells_are_reported_not_stored(tmp_path, monkeypatch):
    """A failing cell is reported, not stored, and computed on the next run."""
    import variance_lab.sweep.run as sweep_mod

    real = sweep_mod.compute

    def flaky(cell, engine=None):
        if cell.family.mu == 0.9:
            raise ValueError("boom")
        return real(cell, engine=engine)

    monkeypatch.setattr(sweep_mod, "compute", flaky)
    monkeypatch.setattr(sweep_mod, "compute_theory", lambda cells: {})  # one cell at a time
    result = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=tmp_path / "s.sqlite", progress=False)
    assert len(result.failed) == 1
    assert result.failed[0]["error"] == "boom"
    assert "mu=0.9" in result.failed[0]["label"]
    assert "1 failed" in result.summary()
    assert set(result.frame["mu"]) == {1.0}
    monkeypatch.setattr(sweep_mod, "compute", real)
    retry = sweep("lognormal", [0.9, 1.0], 0.1, T_GRID, store=tmp_path / "s.sqlite", progress=False)
    assert len(retry.computed) == 1
    assert not retry.failed


def test_interrupt_keeps_finished_cells(tmp_path, monkeypatch):
    """Ctrl-C raises SweepInterrupted saying how many cells finished; those stay stored."""
    import variance_lab.sweep.run as sweep_mod

    real, calls = sweep_mod.compute, []

    def interrupted(cell, engine=None):
        calls.append(cell)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(cell, engine=engine)

    monkeypatch.setattr(sweep_mod, "compute", interrupted)
    monkeypatch.setattr(sweep_mod, "compute_theory", lambda cells: {})  # one cell at a time
    store = tmp_path / "s.sqlite"
    with pytest.raises(
        sweep_mod.SweepInterrupted, match=r"2 of 4 cells finished .* run the same command again"
    ):
        sweep("lognormal", [0.8, 0.9, 1.0, 1.1], 0.1, T_GRID, store=store, progress=False)
    assert len(load_store(store)["cell"].unique()) == 2


def test_store_errors(tmp_path):
    """A missing or junk store, a folder as store and a missing folder raise ValueError."""
    with pytest.raises(ValueError, match="does not exist"):
        load_store(tmp_path / "missing.sqlite")
    (tmp_path / "junk.sqlite").write_text("not a database, not at all" * 100)
    with pytest.raises(ValueError, match="not a variance_lab store"):
        load_store(tmp_path / "junk.sqlite")
    with pytest.raises(ValueError, match="is a directory"):
        sweep(store=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"folder .* does not exist"):
        sweep(store=tmp_path / "no" / "s.sqlite", progress=False)


def test_other_schema_version_is_refused(tmp_path):
    """A store of another schema version is refused."""
    store = tmp_path / "s.sqlite"
    sweep("lognormal", 1.0, 0.1, [1], store=store, progress=False)
    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(ValueError, match="schema version 99"):
        load_store(store)


# ----------------------------------------------------------------------------- export
def _check_round_trip(store, tmp_path):
    frame = load_store(store)
    for suffix in ("csv", "parquet"):
        out = tmp_path / f"out.{suffix}"
        written = export(store, out)
        pd.testing.assert_frame_equal(written, frame)
        pd.testing.assert_frame_equal(load_table(out), frame, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out.parquet"), frame, check_exact=True)
    return frame


def test_export_round_trips_theory(tmp_path):
    """Theory rows round-trip through export, infinities and missing intervals included."""
    store = tmp_path / "s.sqlite"
    sweep(["lognormal", "gamma"], [0.9, 1.1], [0.1], [1, 10, 1000, 100000], store=store, progress=False)
    frame = _check_round_trip(store, tmp_path)
    assert np.isinf(frame["log10_value"]).any()  # bias_G = 0 at T = 1: log10 is -inf
    assert frame["lo"].isna().all()
    assert np.isinf(frame["value"]).any()  # Var(P_T) at T = 1e5 leaves float range; log10 stays finite
    assert np.isfinite(frame.loc[np.isinf(frame["value"]), "log10_value"]).all()


def test_export_errors(tmp_path):
    """An unknown suffix or a missing folder raises, leaving no temporary file."""
    store = tmp_path / "s.sqlite"
    sweep("lognormal", 1.0, 0.1, [1], store=store, progress=False)
    with pytest.raises(ValueError, match=r"use a \.csv or \.parquet name"):
        export(store, tmp_path / "x.txt")
    with pytest.raises(ValueError, match=r"folder .* does not exist"):
        export(store, tmp_path / "no" / "x.csv")
    assert not list(tmp_path.glob(".*tmp"))


# ----------------------------------------------------------------------------- Monte Carlo cells
def test_changes_recompute_only_affected_cells(tmp_path):
    """A new seed, n or mu recomputes only the cells it affects; results are bit-identical."""
    store = tmp_path / "s.sqlite"
    kw = {"T": [1, 10, 50], "store": store, "progress": False, "workers": 1}
    base = sweep("lognormal", [0.9, 1.0], 0.1, n=[0, 500], seed=1, **kw)
    kinds = {c.id: c.kind for c in plan("lognormal", [0.9, 1.0], 0.1, [1, 10, 50], [0, 500], seed=1).cells}
    assert len(base.computed) == 4
    assert {kinds[c] for c in base.computed} == {"theory", "monte_carlo"}
    mc = base.frame[base.frame["method"] == "monte_carlo"]
    assert set(mc["n"]) == {500}
    assert set(mc["seed"]) == {1}
    assert mc["lo"].notna().any()

    same = sweep("lognormal", [0.9, 1.0], 0.1, n=[0, 500], seed=1, **kw)
    assert not same.computed
    assert len(same.reused) == 4

    new_seed = sweep("lognormal", [0.9, 1.0], 0.1, n=[0, 500], seed=2, **kw)
    assert len(new_seed.computed) == 2
    assert len(new_seed.reused) == 2  # Monte Carlo only
    new_n = sweep("lognormal", [0.9, 1.0], 0.1, n=[0, 600], seed=1, **kw)
    assert len(new_n.computed) == 2
    assert len(new_n.reused) == 2
    new_mu = sweep("lognormal", [0.9, 1.05], 0.1, n=[0, 500], seed=1, **kw)
    assert len(new_mu.computed) == 2
    assert len(new_mu.reused) == 2  # the cells at mu = 1.05 only
    assert set(load_store(store)["mu"]) == {0.9, 1.0, 1.05}

    # Same seed and n in another store: bit-identical numbers (workers do not matter).
    other = sweep("lognormal", [0.9, 1.0], 0.1, n=[0, 500], seed=1, **{**kw, "store": tmp_path / "o.sqlite"})
    cols = [c for c in STORE_COLUMNS if c != "created"]
    pd.testing.assert_frame_equal(other.frame[cols], base.frame[cols], check_exact=True)
    _check_round_trip(store, tmp_path)


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    """The sweep's progress bar goes to stderr, nothing to stdout."""
    sweep("lognormal", [0.9, 1.0], 0.1, [1, 2], store=tmp_path / "s.sqlite", progress=True)
    captured = capsys.readouterr()
    assert "sweep" in captured.err
    assert "2/2" in captured.err
    assert captured.out == ""


def test_random_scale_alpha_and_mixture_components_are_grid_axes(tmp_path):
    """The alpha and components parameters are grid axes; a mixture gives one cell per components."""
    assert extra_parameters("random-scale") == ("alpha",)
    assert extra_parameters("lognormal-mixture") == ("components",)
    mixes = ["0.98:0:1e-8,0.02:-0.005:0.01", "1:0:0.1"]
    p = plan(
        ["random-scale", "lognormal-mixture"],
        [0.9, 1.0],
        0.1,
        T_GRID,
        params={"alpha": [0.5, 2], "components": mixes},
    )
    labels = sorted(c.label() for c in p.cells)
    # the mixture derives mu and sigma2 from its components: one cell per components, whatever the mu grid
    assert labels == [
        "theory lognormal-mixture mu=1 sigma2=0.000201013 components=0.98:0.0:1e-08,0.02:-0.005:0.01",
        "theory lognormal-mixture mu=1.05127 sigma2=0.116232 components=1.0:0.0:0.1",
        "theory random-scale mu=0.9 sigma2=0.1 alpha=0.5",
        "theory random-scale mu=0.9 sigma2=0.1 alpha=2",
        "theory random-scale mu=1 sigma2=0.1 alpha=0.5",
        "theory random-scale mu=1 sigma2=0.1 alpha=2",
    ]
    result = sweep(
        ["random-scale", "lognormal-mixture"],
        1.0,
        0.1,
        [1, 100],
        store=tmp_path / "s.sqlite",
        params={"alpha": [0.05], "components": mixes[:1]},
        progress=False,
    )
    frame = result.frame.query("statistic == 'var_P' and method == 'exact'")
    rs = frame[frame["family"] == "random-scale"].sort_values("T")
    assert json.loads(rs["params"].iloc[0]) == {"alpha": 0.05}
    assert np.isinf(rs["value"].iloc[1])
    assert np.isinf(rs["log10_value"].iloc[1])
    mix = frame[frame["family"] == "lognormal-mixture"].sort_values("T")
    want = theory.var_P(get_family("lognormal-mixture", components=mixes[0]), [1, 100])
    np.testing.assert_array_equal(mix["value"].to_numpy(), want)


def test_random_scale_and_mixture_monte_carlo_cells(tmp_path):
    """With n > 0 both new families get Monte Carlo cells; random-scale's infinite Var(P_T) is flagged."""
    result = sweep(
        ["random-scale", "lognormal-mixture"],
        1.0,
        0.1,
        [1, 100],
        2000,
        store=tmp_path / "s.sqlite",
        params={"alpha": [1.0], "components": ["0.98:0:1e-8,0.02:-0.005:0.01"]},
        workers=1,
        progress=False,
    )
    mc = result.frame.query("method == 'monte_carlo' and statistic == 'var_P'")
    assert sorted(set(mc["family"])) == ["lognormal-mixture", "random-scale"]
    rs = mc[mc["family"] == "random-scale"].set_index("T")
    assert rs.loc[100, "reason"].startswith("unreliable: Var(P_T) is infinite")
    assert np.isnan(rs.loc[100, "lo"])
    mix = mc[mc["family"] == "lognormal-mixture"].set_index("T")
    exact = theory.var_P(get_family("lognormal-mixture", components="0.98:0:1e-8,0.02:-0.005:0.01"), 100)
    assert mix.loc[100, "lo"] < exact < mix.loc[100, "hi"]


def test_progress_counts_monte_carlo_work_as_the_estimate_does(tmp_path):
    """The bar advances by work units, so its rate and remaining time are those of the Monte Carlo work.

    Issue #25, item 5: counted in cells, the theory cells (milliseconds each) set the rate and the
    bar showed ``[00:04<00:21]`` on a sweep the command line had estimated at 24 minutes. Now a
    theory cell weighs nothing, a Monte Carlo cell its paths times the work units of one path, the
    same units the command line's estimate (``estimate_run_seconds``) divides by the work rate, and
    cells the store already has start the bar where it stands (``initial``, out of the rate).
    """
    from variance_lab.simulate.engine import estimate_run_seconds
    from variance_lab.simulate.plan import WORK_RATE
    from variance_lab.sweep.run import _progress_bar, cell_work

    p = plan("lognormal", [0.9, 1.0], 0.1, [1, 10, 50], n=[0, 400, 1000])
    theory_cells = [c for c in p.cells if c.kind == "theory"]
    mc_cells = [c for c in p.cells if c.kind == "monte_carlo"]
    assert len(theory_cells) == 2
    assert len(mc_cells) == 4
    assert all(cell_work(c) == 0 for c in theory_cells)
    for c in mc_cells:
        seconds = estimate_run_seconds(c.family, c.T, c.n, sampler="token", workers=1)
        assert cell_work(c) / WORK_RATE == pytest.approx(seconds, rel=1e-12)
    assert cell_work(mc_cells[0]) != cell_work(mc_cells[1])  # n = 400 and 1000 weigh differently

    total = sum(cell_work(c) for c in mc_cells)
    with _progress_bar(p.cells, set(), enabled=False) as bar:
        assert (bar.total, bar.n) == (total, 0)
        for c in theory_cells:
            bar.update(c.id)
        assert bar.n == 0  # the theory cells did not move the bar: no rate measured on them
        bar.update(mc_cells[0].id)
        assert bar.n == cell_work(mc_cells[0])
        assert bar._postfix() == "3/6 cells"
    stored = {theory_cells[0].id, mc_cells[1].id}
    with _progress_bar(p.cells, stored, enabled=False) as bar:
        assert bar.n == cell_work(mc_cells[1])
        assert bar._postfix() == "2/6 cells"
    with _progress_bar(theory_cells, set(), enabled=False) as bar:  # no Monte Carlo: cells
        assert (bar.total, bar.by_work) == (2, False)


def test_progress_bar_of_a_monte_carlo_sweep_ends_at_its_work(tmp_path, capsys):
    """The bar on stderr ends at 100 % of the Monte Carlo work and names the cells done."""
    sweep(
        "lognormal",
        [0.9, 1.0],
        0.1,
        [1, 2],
        n=[0, 200],
        store=tmp_path / "s.sqlite",
        progress=True,
        workers=1,
    )
    err = capsys.readouterr().err
    assert "100%" in err
    assert "draws" in err
    assert "4/4 cells" in err


def test_storing_a_cell_runs_no_string_exec(tmp_path):
    """A cell's commit builds no class from a string (pandas' named rows do, through ``exec``).

    A Ctrl-C that lands inside a string ``exec`` sets CPython's unhandled-interrupt flag even
    when the interrupt is caught, and ``python -m variance_lab.cli`` then exits by SIGINT instead
    of the clean 130 (a rare CI failure of the Ctrl-C test before this was fixed).
    """
    cell = plan("lognormal", 1.0, 0.1, T_GRID).cells[0]
    frame, prov = compute(cell)
    seen, watching = [], [False]
    sys.addaudithook(lambda event, _: seen.append(event) if watching[0] and event == "exec" else None)
    with Store(tmp_path / "s.sqlite") as db:
        watching[0] = True
        try:
            assert db.put(cell, frame, prov, 0.1) is True
        finally:
            watching[0] = False
    assert seen == []
