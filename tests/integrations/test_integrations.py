"""The recorder and verl's capture, on fake batches of verl's shapes (no framework imported)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from variance_lab.integrations.recorder import ParquetRecorder
from variance_lab.integrations.verl import record_verl_batch
from variance_lab.rollouts.io import load_batch


def _fake_logps(rng, b, t):
    """Trainer (pi_old) and engine log-probs of shape (b, t), and a right-padded mask."""
    old = -rng.exponential(0.5, size=(b, t))
    roll = old + rng.normal(0, 0.05, size=(b, t))
    roll = np.minimum(roll, 0.0)
    lengths = rng.integers(1, t + 1, size=b)
    mask = (np.arange(t) < lengths[:, None]).astype(np.int64)
    return old, roll, mask, lengths


def _read_parquet(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()


def test_verl_batch_round_trips_through_load_batch(tmp_path):
    """Two verl steps: load_batch gives each sequence's counted tokens, in order, with the step column."""
    rng = np.random.default_rng(3)
    path = tmp_path / "verl.parquet"
    batches = [_fake_logps(rng, 4, 6) for _ in range(2)]
    with ParquetRecorder(path) as rec:
        for step, (old, roll, mask, _) in enumerate(batches, start=1):
            adv = rng.normal(size=old.shape)
            record_verl_batch(
                rec,
                {"old_log_probs": old, "rollout_log_probs": roll, "response_mask": mask, "advantages": adv},
                step=step,
            )
    batch = load_batch(path)
    assert batch.ids.tolist() == list(range(8))
    expected_lengths = np.concatenate([b[3] for b in batches])
    np.testing.assert_array_equal(batch.lengths, expected_lengths)
    old_all = np.concatenate([b[0] for b in batches])
    roll_all = np.concatenate([b[1] for b in batches])
    keep = np.arange(6) < expected_lengths[:, None]
    np.testing.assert_array_equal(batch.logp, old_all[keep])
    np.testing.assert_array_equal(batch.old_logp, old_all[keep])
    np.testing.assert_array_equal(batch.rollout_logp, roll_all[keep])
    table = _read_parquet(path)
    assert table["step"] == [1] * 4 + [2] * 4
    assert [len(a) for a in table["advantages"]] == expected_lengths.tolist()


def test_verl_uid_becomes_the_prompt_id(tmp_path):
    """A DataProto-like batch with non_tensor_batch['uid']: load_batch groups responses by it."""
    rng = np.random.default_rng(5)
    path = tmp_path / "verl.parquet"
    old, _, mask, _ = _fake_logps(rng, 4, 5)
    uid = np.array(["u-a", "u-a", "u-b", "u-b"], dtype=object)
    proto = SimpleNamespace(
        batch={"old_log_probs": old, "response_mask": mask}, non_tensor_batch={"uid": uid}
    )
    with ParquetRecorder(path) as rec:
        record_verl_batch(rec, proto, step=1)
        with pytest.raises(ValueError, match="prompt_id must hold one id per sequence"):
            rec.append(old_logp=old, mask=mask, step=2, prompt_id=uid[:3])
    batch = load_batch(path)
    assert batch.has_groups
    assert batch.prompt_id.tolist() == ["u-a", "u-a", "u-b", "u-b"]


def test_verl_masked_holes_are_kept_as_holes(tmp_path):
    """A hole in response_mask (tool output) stays a hole: positions skip it, values there never read."""
    old = np.array([[-0.1, np.nan, -0.3, 0.0]])  # NaN under mask 0: never read
    mask = np.array([[1, 0, 1, 0]])
    path = tmp_path / "holes.parquet"
    with ParquetRecorder(path) as rec:
        record_verl_batch(rec, SimpleNamespace(batch={"old_log_probs": old, "response_mask": mask}), step=5)
    batch = load_batch(path)
    np.testing.assert_array_equal(batch.positions, [0, 2])
    np.testing.assert_array_equal(batch.logp, [-0.1, -0.3])
    assert batch.rollout_logp is None


def test_verl_bad_batches_name_file_field_and_step_and_append_nothing(tmp_path):
    """A missing key or a shape mismatch raises naming the file, field and step; the file keeps its rows."""
    path = tmp_path / "v.parquet"
    good = {"old_log_probs": np.full((2, 3), -0.2), "response_mask": np.ones((2, 3))}
    with ParquetRecorder(path) as rec:
        record_verl_batch(rec, good, step=1)
        with pytest.raises(ValueError, match=r"v\.parquet: step 2: the verl batch has no 'response_mask'"):
            record_verl_batch(rec, {"old_log_probs": np.zeros((2, 3))}, step=2)
        with pytest.raises(ValueError, match=r"v\.parquet: step 3: rollout_logp has shape \(2, 4\)"):
            record_verl_batch(rec, {**good, "rollout_log_probs": np.zeros((2, 4))}, step=3)
        with pytest.raises(ValueError, match=r"step 4: mask of sequence 1 holds values other than 0 and 1"):
            record_verl_batch(rec, {**good, "response_mask": np.array([[1, 1, 0], [1, 2, 0]])}, step=4)
        assert rec.n_rows == 2
    assert len(load_batch(path)) == 2
    with pytest.raises(ValueError, match="closed"):
        rec.append(old_logp=np.zeros((1, 1)), step=9)


def test_recorded_nan_is_reported_by_the_loader(tmp_path):
    """A NaN the trainer produced at a counted token is written as is; the loader names the sequence."""
    path = tmp_path / "nan.parquet"
    with ParquetRecorder(path) as rec:
        rec.append(old_logp=np.array([[-0.1, -0.2], [-0.3, np.nan]]), step=0)
    with pytest.raises(ValueError, match=r"id=1 .*logp\[1\] is NaN"):
        load_batch(path)
    assert load_batch(path, on_bad="drop").ids.tolist() == [0]


def test_reopen_continues_the_file_and_keeps_it_whole_until_close(tmp_path):
    """reopen() after close(): the finished file stays as it was until the next close adds the new rows."""
    import pyarrow.parquet as pq

    path = tmp_path / "r.parquet"
    rec = ParquetRecorder(path, metadata={"note": "from the test"})
    rec.append(old_logp=np.full((2, 3), -0.5), step=1, prompt_id=["a", "a"])
    rec.close()
    rec.reopen()
    assert rec.append(old_logp=np.full((1, 2), -0.25), step=1, prompt_id=["b"]) == 3
    assert _read_parquet(path)["id"] == [0, 1]  # still the first file, complete
    rec.close()
    table = _read_parquet(path)
    assert table["id"] == [0, 1, 2]
    assert table["logp"] == [[-0.5] * 3, [-0.5] * 3, [-0.25] * 2]
    assert table["prompt_id"] == ["a", "a", "b"]
    assert pq.read_schema(path).metadata[b"note"] == b"from the test"
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]
    rec.reopen()
    with pytest.raises(ValueError, match=r"step 2: the batch's fields .* differ from the file's"):
        rec.append(old_logp=np.full((1, 2), -0.25), step=2)  # no prompt_id: the file's columns differ
    rec.close()
    assert len(load_batch(path)) == 3


def test_reopen_refuses_a_file_replaced_since(tmp_path):
    """The file was removed or rewritten since: reopen raises naming it, and the recorder stays closed."""
    path = tmp_path / "r.parquet"
    with ParquetRecorder(path) as rec:
        rec.append(old_logp=np.full((2, 3), -0.5), step=1)
    with ParquetRecorder(path) as other:
        other.append(old_logp=np.full((5, 3), -0.5), step=1)
    with pytest.raises(
        ValueError, match=r"r\.parquet: the file holds 5 rows .* not the 2 rows this recorder wrote"
    ):
        rec.reopen()
    path.unlink()
    with pytest.raises(ValueError, match=r"r\.parquet: cannot reopen the file"):
        rec.reopen()
    with pytest.raises(ValueError, match="closed"):
        rec.append(old_logp=np.zeros((1, 1)), step=9)
    fresh = ParquetRecorder(tmp_path / "never.parquet")
    fresh.close()
    fresh.reopen()  # nothing was written: it simply opens again
    assert fresh.append(old_logp=np.zeros((1, 1)), step=1) == 1
    fresh.close()


@pytest.mark.parametrize("name", ["capture_verl", "capture_trl"])
def test_guide_examples_run_and_print_what_the_page_says(name, tmp_path):
    """docs/examples/capture_*.py run without the framework; the guide quotes what they print."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "docs" / "examples" / f"{name}.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    counts, mean_line = proc.stdout.strip().splitlines()
    page = (root / "docs" / "guide" / "reading_runs.md").read_text()
    pattern = (
        rf"`python docs/examples/{name}\.py /tmp` printed `([^`]+)` and a mean\s+"
        r"mismatch log-ratio of ([+-]\d+\.\d+)"
    )
    quoted = re.search(pattern, page)
    assert quoted is not None
    assert counts == quoted.group(1)
    assert float(mean_line.rsplit(" ", 1)[1]) == pytest.approx(float(quoted.group(2)), abs=1e-4)


def _verl_rejected_batch(rng, b=48, r=40):
    """Return a verl batch (float32 log-probs, an int64 mask, as verl holds them) and verl's rejection of it.

    The mismatch log-ratio is heavy-tailed (5 % of tokens 15 times wider), as measured ones are, so
    ``rollout_rs="token_k1"`` at ``0.8_1.25`` rejects the tokens of the largest mismatch. The
    rejection is verl 0.9.1's (its mirror :mod:`variance_lab.frameworks.verl`, equal to verl's
    masks exactly): ``compute_rollout_correction_and_add_to_batch`` replaces ``response_mask`` by it.
    """
    from variance_lab.frameworks import verl

    old = (-rng.exponential(0.7, size=(b, r))).astype(np.float32)
    wide = rng.random((b, r)) < 0.05
    y = rng.normal(0.0, np.where(wide, 0.3, 0.02))
    roll = np.minimum(old.astype(np.float64) - y, 0.0).astype(np.float32)
    lengths = rng.integers(4, r + 1, size=b)
    uncut = (np.arange(r) < lengths[:, None]).astype(np.int64)
    _, cut, metrics = verl.compute_rollout_correction_and_rejection_mask(
        old, roll, uncut, rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"
    )
    batch = {"old_log_probs": old, "rollout_log_probs": roll, "response_mask": cut.astype(np.int64)}
    return batch, uncut, metrics


def test_verl_capture_keeps_the_tokens_rollout_rs_rejects(tmp_path):
    """With uncut_mask, the file's mask is the mask before verl's rollout_rs and rs_mask verl's cut one.

    The loaded batch (and analyze's three-policy table) count every token the engine sampled;
    the batch's cut response_mask alone (the capture before this change) understates the variance
    of the mismatch log-ratio several times over, since the rejection drops its largest tokens.
    """
    import pyarrow.parquet as pq

    from variance_lab.rollouts.analysis import analyze

    rng = np.random.default_rng(17)
    batch, uncut, metrics = _verl_rejected_batch(rng)
    cut = batch["response_mask"]
    assert 0 < (uncut - cut).sum() < uncut.sum()  # the rejection masks some tokens, not all
    full, old_way = tmp_path / "uncut.parquet", tmp_path / "cut.parquet"
    with ParquetRecorder(full) as rec, ParquetRecorder(old_way) as rec_cut:
        record_verl_batch(rec, batch, step=1, uncut_mask=uncut)
        record_verl_batch(rec_cut, batch, step=1)
    loaded, understated = load_batch(full), load_batch(old_way)
    y = batch["old_log_probs"].astype(np.float64) - batch["rollout_log_probs"].astype(np.float64)
    np.testing.assert_array_equal(loaded.mismatch_log_ratio, y[uncut == 1])
    np.testing.assert_array_equal(understated.mismatch_log_ratio, y[cut == 1])
    table = pq.read_table(full).to_pydict()
    keep = np.arange(uncut.shape[1]) < uncut.sum(axis=1)[:, None]
    np.testing.assert_array_equal(np.concatenate(table["rs_mask"]), cut[keep])
    np.testing.assert_array_equal(np.concatenate(table["mask"]), uncut[keep])
    (note,) = loaded.notes
    n_cut, n_all = int((uncut - cut).sum()), int(uncut.sum())
    assert f"cut {n_cut:,} of {n_all:,} counted tokens" in note
    frac = metrics["rollout_corr/rollout_rs_masked_fraction"]  # what verl logs for the same batch
    assert n_cut / n_all == pytest.approx(frac, rel=1e-6)
    assert understated.notes == ()
    var_full, var_cut = np.var(loaded.mismatch_log_ratio), np.var(understated.mismatch_log_ratio)
    assert var_full > 3 * var_cut
    split = analyze(loaded, n_boot=0, fit_models=False, folds=0).split.table
    row = split[(split["part"] == "mismatch") & (split["bucket"] == -1)].iloc[0]
    assert row["var_log_r"] == pytest.approx(np.var(loaded.mismatch_log_ratio, ddof=1), rel=1e-12)
    assert row["n_tokens"] == n_all


def test_verl_uncut_mask_must_hold_the_cut_one(tmp_path):
    """An uncut_mask that misses a token the batch's response_mask keeps is refused; nothing is appended."""
    rng = np.random.default_rng(18)
    batch, uncut, _ = _verl_rejected_batch(rng, b=4, r=6)
    wrong = uncut.copy()
    wrong[2, 0] = 0
    path = tmp_path / "v.parquet"
    with ParquetRecorder(path) as rec:
        with pytest.raises(ValueError, match=r"v\.parquet: step 3: rs_mask of sequence 2 keeps a token"):
            record_verl_batch(rec, batch, step=3, uncut_mask=wrong)
        assert rec.n_rows == 0
        assert record_verl_batch(rec, batch, step=3, uncut_mask=uncut) == 4
