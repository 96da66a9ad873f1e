"""A run of steps: each step's row is its file's analysis, k-hat, the mismatch, Dask gives the same bits.

The Dask tests share one ``LocalCluster`` of 2 worker processes (``processes=True``, 1 thread
each), started for the module (a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import math
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from variance_lab.report.analysis_table import render_run
from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import load_batch, save_batch
from variance_lab.rollouts.run_layout import find_steps
from variance_lab.rollouts.split import split_ratios
from variance_lab.rollouts.steps import STEP_COLUMNS, StepTask, analyze_run, analyze_step
from variance_lab.simulate import dask_executor as dx

FAST = {"n_boot": 50, "fit_models": False, "seed": 3}  # the statistics of the run, not the model fits


def _step_batch(rng, n_seq: int, shift: float, rollout: bool = True, update: bool = False) -> TokenBatch:
    """Return a GRPO-like step: groups of 4 responses, lengths 8..199, mismatch noise growing with ``shift``.

    As the frameworks' dumps: pi_old as ``logp`` and ``old_logp`` (no update ratio), unless ``update``.
    """
    lens = rng.integers(8, 200, n_seq)
    old = [-rng.exponential(0.5, n) for n in lens]
    roll = [np.minimum(o + rng.normal(0.0, 0.01 * (1 + shift), o.size), 0.0) for o in old]
    new = [np.minimum(o + rng.normal(0.0, 0.01, o.size), 0.0) for o in old] if update else old
    return TokenBatch.from_ragged(
        new, old, rollout_logp=roll if rollout else None, prompt_id=np.arange(n_seq) // 4
    )


def _run_dir(folder, n_steps: int = 3, n_seq: int = 60, seed: int = 0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for step in range(1, n_steps + 1):
        save_batch(_step_batch(rng, n_seq, step), folder / f"step_{step}.parquet")
    return folder


def _assert_same_run(a, b) -> None:
    """Two run analyses hold the same bits: rows, buckets and every summary."""
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.buckets, b.buckets, check_exact=True)
    assert render_run(a.steps, a.buckets, a.summary(), "json", summaries=a.summaries) == render_run(
        b.steps, b.buckets, b.summary(), "json", summaries=b.summaries
    )


# --------------------------------------------------------------------------------------
# one step is its file's analysis
# --------------------------------------------------------------------------------------
def test_each_row_is_the_analysis_of_its_file_alone(tmp_path):
    """A step's bucket table and summary are exactly what analyze gives its file, with the same options."""
    folder = _run_dir(tmp_path / "run")
    run = analyze_run(folder, progress=False, **FAST)
    assert list(run.steps.columns) == list(STEP_COLUMNS)
    assert run.steps["step"].tolist() == [1, 2, 3]
    assert run.steps["dump"].tolist() == ["step_1.parquet", "step_2.parquet", "step_3.parquet"]
    assert set(run.steps["ratio"]) == {"mismatch"}  # pi_old as logp and old_logp: the mismatch is analysed
    for i, step in enumerate((1, 2, 3)):
        alone = analyze(load_batch(folder / f"step_{step}.parquet"), ratio="mismatch", progress=False, **FAST)
        table = (
            run.buckets[run.buckets["step"] == step].drop(columns=["step", "khat_P"]).reset_index(drop=True)
        )
        pd.testing.assert_frame_equal(table, alone.table, check_exact=True)
        summary = alone.summary()
        row = run.steps.iloc[i]
        assert row["n_sequences"] == summary["n_sequences"] == 60
        assert row["n_tokens"] == summary["n_tokens"]
        assert row["gspo_clip_frac"] == summary["clip"]["gspo_obs"]
        assert row["ppo_clip_pred"] == summary["clip"]["ppo_pred"]
        assert row["sigma2_y"] == summary["fit"]["sigma2_y"]
        assert row["verdict"] == summary["verdict"]
        assert json.dumps(run.summaries[i]["fit"]) == json.dumps(summary["fit"])


def test_a_prime_rl_run_end_to_end(tmp_path):
    """A prime-rl output directory: complete steps only, every rank of a step in its row, the mismatch."""
    rng = np.random.default_rng(4)
    for step in (1, 2, 3):
        folder = tmp_path / "token_exports" / f"step_{step}"
        folder.mkdir(parents=True)
        for rank in (0, 1):
            lines = []
            for _ in range(15):  # token_export.py at 559b4477: one sample a line, schema 1
                trainer = -rng.exponential(0.5, int(rng.integers(4, 40)))
                inference = np.minimum(trainer + rng.normal(0, 0.03, trainer.size), 0.0)
                n = trainer.size + 3
                rec = {
                    "schema_version": 1, "step": step, "rank": rank, "token_ids": list(range(n)),
                    "position_ids": list(range(n)), "loss_mask": [False] * 3 + [True] * trainer.size,
                    "trainer_logprobs": [0.0] * 3 + trainer.tolist(),
                    "inference_logprobs": [0.0] * 3 + inference.tolist(),
                }  # fmt: skip
                lines.append(json.dumps(rec))
            (folder / f"rank_{rank}.jsonl").write_text("\n".join(lines) + "\n")
        if step < 3:
            (folder / "STABLE").touch()
    run = analyze_run(tmp_path, progress=False, **FAST)
    assert run.steps["step"].tolist() == [1, 2]
    assert run.steps["dump"].tolist() == ["step_1", "step_2"]
    assert run.steps["n_sequences"].tolist() == [30, 30]
    assert set(run.steps["ratio"]) == {"mismatch"}
    assert set(run.steps["dominant"]) == {"mismatch"}
    assert "step_3" in run.summary()["notes"][0]
    assert run.summary()["layout"] == "prime-rl"


def test_the_mismatch_columns_are_the_splits_pooled_mismatch(tmp_path):
    """mismatch_* are the split's pooled mismatch row; NaN (and no dominant part) without rollout_logp."""
    folder = _run_dir(tmp_path / "run", n_steps=2)
    run = analyze_run(folder, progress=False, **FAST)
    for i, step in enumerate((1, 2)):
        split = split_ratios(load_batch(folder / f"step_{step}.parquet"))
        pooled = split.table[(split.table["part"] == "mismatch") & (split.table["bucket"] == -1)].iloc[0]
        row = run.steps.iloc[i]
        assert row["mismatch_var_log_r"] == pooled["var_log_r"]
        assert row["mismatch_k3_kl"] == pooled["k3_kl"]
        assert row["mismatch_chi2_token"] == pooled["chi2_token"]
        assert row["mismatch_share"] == split.shares["mismatch"]
        assert row["dominant"] == "mismatch"
    assert run.steps["mismatch_k3_kl"].iloc[1] > run.steps["mismatch_k3_kl"].iloc[0]  # the noise grows
    rng = np.random.default_rng(5)
    bare = tmp_path / "bare"
    bare.mkdir()
    for step in (1, 2):
        save_batch(_step_batch(rng, 40, step, rollout=False, update=True), bare / f"s{step}.npz")
    plain = analyze_run(bare, progress=False, **FAST)
    assert set(plain.steps["ratio"]) == {"update"}
    assert plain.steps[["mismatch_var_log_r", "mismatch_k3_kl", "mismatch_share"]].isna().all().all()
    assert set(plain.steps["dominant"]) == {""}


@pytest.mark.parametrize("k", [0.25, 0.75])
def test_khat_finds_the_tail_index_of_pareto_weights(tmp_path, k):
    """One-token sequences with log P ~ Exponential(scale k): P is Pareto with tail index 1/k, k-hat ~ k.

    n = 8000 sequences: PSIS's M = 3 sqrt(n) = 269 exceedances, k-hat's standard error about
    (1 + k) / sqrt(M) (0.076 at k = 0.25, 0.107 at 0.75); within 3 of them. The two k lie 5 apart.
    """
    rng = np.random.default_rng(11)
    n = 8000
    y = rng.exponential(k, n)
    old = -1.0 - y  # logp = -1, old_logp = -1 - y: the log-ratio is y
    new = np.full(n, -1.0)
    save_batch(TokenBatch.from_ragged(list(new[:, None]), list(old[:, None])), tmp_path / "step_1.npz")
    run = analyze_run(tmp_path, progress=False, n_boot=0, fit_models=False)
    se = (1 + k) / math.sqrt(3 * math.sqrt(n))
    khat = run.steps["khat_P"].iloc[0]
    assert abs(khat - k) < 3 * se, (khat, k, se)
    assert run.buckets["khat_P"].tolist() == [khat]  # one bucket (T = 1): the same sequences


def test_steps_of_different_ratios_are_an_error(tmp_path):
    """A step with an update ratio beside steps without one: the error names the steps of each ratio."""
    folder = _run_dir(tmp_path / "run", n_steps=2, n_seq=30)
    save_batch(_step_batch(np.random.default_rng(9), 30, 1, update=True), folder / "step_3.parquet")
    with pytest.raises(ValueError, match=r"different ratios \(mismatch in steps 1, 2; update in steps 3\)"):
        analyze_run(folder, progress=False, n_boot=0, fit_models=False)
    run = analyze_run(folder, ratio="mismatch", progress=False, n_boot=0, fit_models=False)
    assert set(run.steps["ratio"]) == {"mismatch"}


def test_notes_of_every_step_are_one_and_the_bar_counts_steps(tmp_path, capsys):
    """The ratio's note of each step is one note over all steps; progress=True shows a bar of the steps."""
    folder = _run_dir(tmp_path / "run", n_steps=2, n_seq=30)
    (folder / "README.txt").write_text("run notes")
    run = analyze_run(folder, progress=True, n_boot=0, fit_models=False)
    ((text, steps),) = run.step_notes()
    assert steps == [1, 2]
    assert text.startswith("the step's dump carries no update ratio")
    info = run.summary()
    assert info["notes"] == ["1 other entry not read: README.txt"]
    assert (info["n_steps"], info["first_step"], info["last_step"], info["layout"]) == (2, 1, 2, "files")
    assert "analyze: steps" in capsys.readouterr().err


def test_a_bad_step_names_its_file(tmp_path):
    """A step that does not parse stops the run with an error naming the file within the run."""
    folder = _run_dir(tmp_path / "run", n_steps=2, n_seq=20)
    (folder / "step_2.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"^step_2\.parquet: not a readable Parquet file"):
        analyze_run(folder, progress=False, n_boot=0, fit_models=False)


# --------------------------------------------------------------------------------------
# on a Dask cluster
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    """Yield a LocalCluster of 2 worker processes (processes=True, 1 thread each) and its client."""
    pytest.importorskip("distributed", reason="needs the distributed extra")
    with dx.local_cluster(2, memory_limit="1GiB") as c:
        yield c


def test_a_run_on_a_local_cluster_is_bit_identical(client, tmp_path):
    """Four steps on 2 worker processes: the rows, buckets and summaries of the local run, bit for bit."""
    folder = _run_dir(tmp_path / "run", n_steps=4, n_seq=40)
    local = analyze_run(folder, progress=False, **FAST)
    on_dask = analyze_run(folder, client=client, progress=False, **FAST)
    _assert_same_run(local, on_dask)
    assert len(client.nthreads()) == 2  # two worker processes
    by_address = analyze_run(folder, scheduler=client.scheduler.address, progress=False, **FAST)
    _assert_same_run(local, by_address)


def _long_steps(folder, keep=(11, 14)):
    """Write steps ``keep`` of 20 of 256 sequences (lengths log-uniform 8..1024, 52,000 tokens each), seed 0.

    In these two the sums of the token log-ratios through BLAS (the autocorrelation's gamma_0)
    come out one unit in the last place apart with 1 BLAS thread and with 2 on the 2-core VM.
    """
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for step in range(1, 21):
        lens = np.exp(rng.uniform(np.log(8), np.log(1024), 256)).astype(int)
        old = [-rng.exponential(0.5, k) for k in lens]
        roll = [np.minimum(o + rng.normal(0, 0.02, o.size), 0.0) for o in old]
        if step in keep:
            batch = TokenBatch.from_ragged(old, old, rollout_logp=roll, prompt_id=np.arange(256) // 4)
            save_batch(batch, folder / f"step_{step}.parquet")
    return folder


def test_the_steps_run_on_the_cluster_as_here_though_the_threads_differ(client, tmp_path):
    """Workers start with one BLAS thread, this process with its cores' number: the rows are equal.

    The nanny sets OPENBLAS_NUM_THREADS=1; the analysis runs BLAS on one thread in both. Where
    this process has more than one thread, a step analysed without that pinning differs in its
    last bits: the pinning is what makes the rows equal.
    """
    from threadpoolctl import threadpool_info, threadpool_limits

    folder = _long_steps(tmp_path / "run")
    opts = {"n_boot": 0, "fit_models": False}
    local = analyze_run(folder, progress=False, **opts)
    on_dask = analyze_run(folder, client=client, progress=False, **opts)
    _assert_same_run(local, on_dask)

    def threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    assert set().union(*client.run(threads).values()) == {1}
    if max(threads(), default=1) > 1:
        with mock.patch("variance_lab.rollouts.analysis.one_blas_thread", contextlib.nullcontext):
            free = [analyze_step(StepTask(d, options=opts)).row for d in find_steps(folder).steps]
        assert [r["gspo_clip_pred"] for r in free] != local.steps["gspo_clip_pred"].tolist()
    with threadpool_limits(limits=1, user_api="blas"):
        assert analyze_run(folder, progress=False, **opts).steps.equals(local.steps)


def test_a_bad_step_on_the_cluster_raises_here(client, tmp_path):
    """A step that fails on a worker raises its error here, naming the file; the others are cancelled."""
    folder = _run_dir(tmp_path / "run", n_steps=3, n_seq=20)
    (folder / "step_3.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"^step_3\.parquet: not a readable Parquet file"):
        analyze_run(folder, client=client, progress=False, n_boot=0, fit_models=False)


def test_a_step_task_is_a_pure_function_of_its_files(tmp_path):
    """analyze_step twice on one task: the same row (what lets Dask recompute a lost step)."""
    folder = _run_dir(tmp_path / "run", n_steps=1, n_seq=30)
    (dump,) = find_steps(folder).steps
    task = StepTask(dump, options={"n_boot": 20, "fit_models": False})
    a, b = analyze_step(task), analyze_step(task)
    pd.testing.assert_series_equal(pd.Series(a.row), pd.Series(b.row), check_exact=True)
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)


def test_scheduler_and_client_together_or_a_bad_address(tmp_path):
    """scheduler= and client= together, or an address that is none, is a ValueError before any work."""
    folder = _run_dir(tmp_path / "run", n_steps=1, n_seq=10)
    with pytest.raises(ValueError, match="pass scheduler= or client=, not both"):
        analyze_run(folder, scheduler="tcp://127.0.0.1:1", client=object(), progress=False)
    with pytest.raises(ValueError, match="scheduler must be SCHEME://HOST:PORT"):
        analyze_run(folder, scheduler="localhost", progress=False)


@pytest.mark.slow
def test_ten_steps_at_the_defaults_on_a_local_cluster(client, tmp_path):
    """10 steps of 64 sequences at analyze's defaults (fits, held-out folds, 1,000 resamples): as local."""
    folder = _run_dir(tmp_path / "run", n_steps=10, n_seq=64)
    local = analyze_run(folder, progress=False)
    on_dask = analyze_run(folder, client=client, progress=False)
    _assert_same_run(local, on_dask)
    assert on_dask.steps["best_model"].ne("").all()
