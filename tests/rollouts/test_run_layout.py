"""The steps of a run directory: the frameworks' layouts, step numbers from names, clear refusals."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import load_batch, save_batch
from variance_lab.rollouts.run_layout import find_steps, load_step

try:
    import torch

    HAS_TORCH = True
except ImportError:  # pragma: no cover - torch is in the dev extra
    HAS_TORCH = False


def _prime_record(trainer, inference, n_prompt=2, step=1, rank=0):
    """One prime-rl token-export line (schema 1, ``token_export.py`` at 559b4477): one sample."""
    n = n_prompt + len(trainer)
    return {
        "schema_version": 1,
        "step": step,
        "rank": rank,
        "micro_step": 0,
        "micro_sequence_idx": 0,
        "export_sequence_idx": 0,
        "env_name": "math",
        "token_ids": list(range(100, 100 + n)),
        "position_ids": list(range(n)),
        "loss_mask": [False] * n_prompt + [True] * len(trainer),
        "advantages": [0.0] * n,
        "inference_logprobs": [0.0] * n_prompt + list(inference),
        "trainer_logprobs": [0.0] * n_prompt + list(trainer),
        "entropy": [None] * n,
    }


def _prime_run(root, steps, ranks=2, stable=True, rng=None):
    """``root/token_exports/step_N/rank_R.jsonl`` as prime-rl writes them, 3 samples a rank."""
    rng = rng or np.random.default_rng(0)
    for step in steps:
        folder = root / "token_exports" / f"step_{step}"
        folder.mkdir(parents=True)
        for rank in range(ranks):
            lines = []
            for _ in range(3):
                trainer = -rng.exponential(0.5, int(rng.integers(2, 6)))
                inference = np.minimum(trainer + rng.normal(0, 0.05, trainer.size), 0.0)
                lines.append(
                    json.dumps(_prime_record(trainer.tolist(), inference.tolist(), step=step, rank=rank))
                )
            (folder / f"rank_{rank}.jsonl").write_text("\n".join(lines) + "\n")
        if stable is True or (stable and step in stable):
            (folder / "STABLE").touch()
    return root


def _batch(rng, n=6):
    lens = rng.integers(2, 9, n)
    old = [-rng.exponential(0.5, k) for k in lens]
    new = [np.minimum(o + rng.normal(0, 0.05, o.size), 0.0) for o in old]
    return TokenBatch.from_ragged(new, old)


def _files(folder, names, rng=None):
    rng = rng or np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        save_batch(_batch(rng), folder / name)
    return folder


# --------------------------------------------------------------------------------------
# prime-rl
# --------------------------------------------------------------------------------------
def test_prime_rl_output_directory_and_token_exports_give_the_same_steps(tmp_path):
    """A prime-rl output directory or its token_exports: steps in numeric order, every rank of a step."""
    _prime_run(tmp_path, [1, 2, 10])
    for where in (tmp_path, tmp_path / "token_exports"):
        layout = find_steps(where)
        assert layout.layout == "prime-rl"
        assert layout.preset == "prime-rl"
        assert [d.step for d in layout.steps] == [1, 2, 10]
        assert [d.name for d in layout.steps] == ["step_1", "step_2", "step_10"]
        assert [[p.name for p in d.paths] for d in layout.steps] == [["rank_0.jsonl", "rank_1.jsonl"]] * 3
        assert layout.notes == ()
    assert find_steps(tmp_path, preset="prime-rl").layout == "prime-rl"


def test_a_prime_rl_step_is_all_its_ranks(tmp_path):
    """The batch of a step holds each rank's sequences, in rank order, ids ``RANK:LINE:PIECE``."""
    _prime_run(tmp_path, [3], ranks=3)
    (dump,) = find_steps(tmp_path).steps
    batch = load_step(dump, preset="prime-rl")
    parts = [load_batch(p, preset="prime-rl") for p in dump.paths]
    assert batch.ids.tolist() == [f"{r}:{i}" for r, part in enumerate(parts) for i in part.ids.tolist()]
    for name in ("logp", "old_logp", "rollout_logp", "lengths"):
        np.testing.assert_array_equal(getattr(batch, name), np.concatenate([getattr(p, name) for p in parts]))
    assert batch.ids[3] == "1:1:0"


def test_prime_rl_steps_without_stable_are_left_out_with_a_note(tmp_path):
    """prime-rl marks a step STABLE once every rank flushed it: a folder without the marker is left out."""
    _prime_run(tmp_path, [1, 2, 3], stable={1, 2})
    layout = find_steps(tmp_path)
    assert [d.step for d in layout.steps] == [1, 2]
    (note,) = layout.notes
    assert "step_3" in note
    assert "STABLE" in note
    assert "left out" in note


def test_prime_rl_before_the_stable_marker_counts_every_step(tmp_path):
    """A run where no folder has STABLE (prime-rl before 2026-06) counts every folder, and says so."""
    _prime_run(tmp_path, [1, 2], stable=False)
    layout = find_steps(tmp_path)
    assert [d.step for d in layout.steps] == [1, 2]
    assert "no step folder has prime-rl's STABLE marker" in layout.notes[0]


def test_a_bad_rank_file_is_named_by_its_place_in_the_run(tmp_path):
    """A line that is not JSON names step folder, rank file and line; bad data names the rank file too."""
    _prime_run(tmp_path, [1, 2])
    bad = tmp_path / "token_exports" / "step_2" / "rank_1.jsonl"
    bad.write_text(bad.read_text() + "{not json\n")
    dumps = find_steps(tmp_path).steps
    load_step(dumps[0], preset="prime-rl")
    with pytest.raises(ValueError, match=r"^step_2/rank_1\.jsonl: line 4: invalid JSON"):
        load_step(dumps[1], preset="prime-rl")
    rec = _prime_record([-0.1, float("nan")], [-0.1, -0.2])
    bad.write_text(json.dumps(rec).replace("NaN", "null") + "\n")
    with pytest.raises(
        ValueError, match=r"^step_2: .*id='1:1:0'.*rank_1\.jsonl: line 1, piece 0: field 'trainer_logprobs'"
    ):
        load_step(dumps[1], preset="prime-rl")


# --------------------------------------------------------------------------------------
# NeMo-RL, slime, the package's own files
# --------------------------------------------------------------------------------------
def _nemo_line(i, rng):
    lp = (-rng.exponential(0.5, 4)).tolist()
    return json.dumps(
        {
            "idx": i,
            "prev_logprobs": [[0.0, *lp]],
            "generation_logprobs": [[0.0, *np.minimum(np.array(lp) + 0.01, 0.0).tolist()]],
            "token_loss_mask": [[0, 1, 1, 1, 1]],
        }
    )


def test_nemo_rl_train_dumps_in_step_order_validation_not_read(tmp_path):
    """train_data_stepN.jsonl are the steps (numeric order); val_data_stepN.jsonl beside them is not read."""
    rng = np.random.default_rng(2)
    for name in (
        "train_data_step1.jsonl",
        "train_data_step10.jsonl",
        "train_data_step2.jsonl",
        "val_data_step1.jsonl",
    ):
        (tmp_path / name).write_text("\n".join(_nemo_line(i, rng) for i in range(4)) + "\n")
    (tmp_path / "config.yaml").write_text("a: 1\n")
    layout = find_steps(tmp_path)
    assert (layout.layout, layout.preset) == ("nemo-rl", "nemo-rl")
    assert [(d.step, d.name) for d in layout.steps] == [
        (1, "train_data_step1.jsonl"),
        (2, "train_data_step2.jsonl"),
        (10, "train_data_step10.jsonl"),
    ]
    assert any("validation" in n and "not read" in n for n in layout.notes)
    assert any("1 other entry not read: config.yaml" in n for n in layout.notes)
    batch = load_step(layout.steps[0], preset=layout.preset)
    assert batch.has_rollout
    assert len(batch) == 4


@pytest.mark.skipif(not HAS_TORCH, reason="pip install torch")
def test_slime_dumps_step_from_the_rollout_id(tmp_path):
    """Slime's {rollout_id}.pt (and a template with the writer's rank): the number that varies is the step."""
    payload = {"format_version": 2, "samples": []}
    for name in ("0_rank0.pt", "1_rank0.pt", "12_rank0.pt"):
        torch.save(payload, tmp_path / name)
    layout = find_steps(tmp_path)
    assert (layout.layout, layout.preset) == ("slime", "slime")
    assert [d.step for d in layout.steps] == [0, 1, 12]


def test_files_step_numbers_from_their_names(tmp_path):
    """The package's own files: the number that varies in the names is the step; one file: its last number."""
    layout = find_steps(
        _files(tmp_path / "a", ["run7-step003.jsonl.gz", "run7-step1.jsonl.gz", "run7-step20.jsonl.gz"])
    )
    assert (layout.layout, layout.preset) == ("files", None)
    assert [d.step for d in layout.steps] == [1, 3, 20]
    assert [d.step for d in find_steps(_files(tmp_path / "b", ["v2_step_8.npz"])).steps] == [8]
    assert find_steps(tmp_path / "a", preset="nemo-rl").preset == "nemo-rl"  # JSONL read with a preset


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], r"no step dump found: .* \(it is empty\)"),
        (["notes.txt", "sub/"], r"no step dump found: .* \(it holds notes\.txt, sub/\)"),
        (["step_1.jsonl", "step_2.parquet"], r"mixed layouts: files of 2 formats \(jsonl, parquet"),
        (["step_1.parquet", "train_data_step2.jsonl"], r"mixed layouts: NeMo-RL .*; token log-prob files"),
        (
            ["step_1.parquet", "prime"],
            r"mixed layouts: prime-rl token exports .*: step_1; token log-prob files: step_1\.parquet",
        ),
        (["a_1.parquet", "b_2.parquet"], r"more than one name pattern \(a_<N>\.parquet, b_<N>\.parquet\)"),
        (["final.parquet"], r"cannot tell the step of 'final\.parquet' from its name"),
        (["r1_s1.parquet", "r2_s2.parquet"], r"more than one number varies"),
        (["step_1.parquet", "step_01.parquet"], r"two dumps of step 1: step_01\.parquet and step_1\.parquet"),
    ],
)
def test_refusals_name_what_was_found(tmp_path, names, message):
    """An empty directory, mixed layouts or formats, names that give no step: one ValueError each."""
    rng = np.random.default_rng(3)
    for name in names:
        if name == "prime":
            _prime_run(tmp_path, [1], ranks=1)
            tmp_path.joinpath("token_exports", "step_1").rename(tmp_path / "step_1")
            tmp_path.joinpath("token_exports").rmdir()
        elif name.endswith("/"):
            (tmp_path / name).mkdir()
        elif name.endswith(".txt"):
            (tmp_path / name).write_text("x")
        elif name.startswith("train_data"):
            (tmp_path / name).write_text(_nemo_line(0, rng) + "\n")
        else:
            save_batch(_batch(rng), tmp_path / name)
    with pytest.raises(ValueError, match=re.compile(rf"^{re.escape(str(tmp_path))}: .*{message}")):
        find_steps(tmp_path)


def test_not_a_directory_a_preset_of_another_layout_and_an_unknown_preset(tmp_path):
    """Each is one ValueError naming the directory or the preset."""
    _files(tmp_path / "f", ["step_1.parquet"])
    with pytest.raises(ValueError, match=r"not a directory"):
        find_steps(tmp_path / "f" / "step_1.parquet")
    with pytest.raises(ValueError, match=r"holds token log-prob files, not what preset 'slime' reads"):
        find_steps(tmp_path / "f", preset="slime")
    with pytest.raises(ValueError, match=r"unknown preset 'verl'"):
        find_steps(tmp_path / "f", preset="verl")


def test_a_file_that_does_not_parse_and_verls_generation_dumps(tmp_path):
    """A broken file names itself; verl's rollout_data_dir dumps (text and score) say what they lack."""
    _files(tmp_path / "f", ["step_1.parquet", "step_2.parquet"])
    (tmp_path / "f" / "step_2.parquet").write_bytes(b"PAR1 cut short")
    dumps = find_steps(tmp_path / "f").steps
    with pytest.raises(ValueError, match=r"^step_2\.parquet: not a readable Parquet file"):
        load_step(dumps[1])
    verl = tmp_path / "rollout_data"  # verl/trainer/ppo/ray_trainer.py _dump_generations at b178a3cd
    verl.mkdir()
    for step in (1, 2):
        rec = {"input": "2+2=", "output": "4", "gts": "4", "score": 1.0, "step": step}
        (verl / f"{step}.jsonl").write_text(json.dumps(rec) + "\n")
    dumps = find_steps(verl).steps
    with pytest.raises(
        ValueError, match=r"^1\.jsonl: verl's rollout_data_dir dump .*no token log-probs.*record_verl_batch"
    ):
        load_step(dumps[0])
