"""Readers of frameworks' run files: prime-rl token exports, slime .pt train dumps, NeMo-RL JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from variance_lab.rollouts.io import load_batch
from variance_lab.rollouts.presets import read_run
from variance_lab.rollouts.records import NEMO_RL_FIELDS, field_names, parse_record

try:
    import torch

    HAS_TORCH = True
except ImportError:  # pragma: no cover - torch is in the dev extra
    HAS_TORCH = False

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="pip install torch")


# --------------------------------------------------------------------------------------
# prime-rl
# --------------------------------------------------------------------------------------
def _prime_line(pieces, **extra):
    """One token-export record (schema 1) packing ``pieces``: (prompt_len, trainer, inference)."""
    cols = {
        k: []
        for k in (
            "token_ids",
            "position_ids",
            "loss_mask",
            "advantages",
            "trainer_logprobs",
            "inference_logprobs",
        )
    }
    for n_prompt, trainer, inference in pieces:
        n = n_prompt + len(trainer)
        cols["token_ids"] += list(range(100, 100 + n))
        cols["position_ids"] += list(range(n))
        cols["loss_mask"] += [False] * n_prompt + [True] * len(trainer)
        cols["advantages"] += [0.0] * n_prompt + [0.5] * len(trainer)
        cols["trainer_logprobs"] += [0.0] * n_prompt + list(trainer)
        cols["inference_logprobs"] += [0.0] * n_prompt + list(inference)
    rec = {
        "schema_version": 1,
        "step": 3,
        "rank": 0,
        "micro_step": 0,
        "micro_sequence_idx": 0,
        "export_sequence_idx": 0,
        "env_name": "math",
        **cols,
        "entropy": [None] * len(cols["token_ids"]),
        "mismatch_kl": [None] * len(cols["token_ids"]),
    }
    rec.update(extra)
    return rec


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_prime_rl_splits_packed_lines_where_positions_restart(tmp_path):
    """Packed lines split where position_ids restart; trainer log-probs are logp and old_logp."""
    f = _write_jsonl(
        tmp_path / "rank_0.jsonl",
        [
            _prime_line([(2, [-0.1, -0.2], [-0.15, -0.25]), (1, [-0.3], [-0.2])]),
            _prime_line([(3, [-0.4, -0.5, -0.6], [-0.4, -0.5, -0.7])]),
        ],
    )
    batch = load_batch(f, preset="prime-rl")
    assert batch.ids.tolist() == ["1:0", "1:1", "2:0"]
    assert batch.lengths.tolist() == [2, 1, 3]
    np.testing.assert_array_equal(batch.logp, [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    np.testing.assert_array_equal(batch.old_logp, batch.logp)
    np.testing.assert_array_equal(batch.rollout_logp, [-0.15, -0.25, -0.2, -0.4, -0.5, -0.7])
    np.testing.assert_array_equal(batch.positions, [2, 3, 1, 3, 4, 5])
    run = read_run(f, "prime-rl")
    assert run.token_ids[1].tolist() == [100, 101]
    assert run.token_ids[0].tolist() == [100, 101, 102, 103]
    np.testing.assert_array_equal(run.advantages[2], [0, 0, 0, 0.5, 0.5, 0.5])


def test_prime_rl_padding_piece_is_left_out(tmp_path):
    """A packed micro-batch's padding (positions restarting at 0, no loss mask) is no sequence."""
    rec = _prime_line([(1, [-0.1], [-0.2])])
    for k, v in (
        ("token_ids", 1),
        ("position_ids", 0),
        ("loss_mask", False),
        ("advantages", 0.0),
        ("trainer_logprobs", 0.0),
        ("inference_logprobs", 0.0),
        ("entropy", None),
        ("mismatch_kl", None),
    ):
        rec[k] = rec[k] + [v] * 3  # three padding tokens, positions 0, 0, 0 restart every time
    batch = load_batch(_write_jsonl(tmp_path / "rank_1.jsonl", [rec]), preset="prime-rl")
    assert batch.ids.tolist() == ["1:0"]
    assert batch.lengths.tolist() == [1]


def test_prime_rl_null_in_the_mask_is_bad_outside_ignored(tmp_path):
    """A null log-prob (prime-rl's non-finite) in the loss mask is bad data; outside it is never read."""
    bad = _prime_line([(1, [-0.1, -0.2], [-0.1, -0.2])])
    bad["trainer_logprobs"][2] = None
    ok = _prime_line([(1, [-0.3], [-0.3])])
    ok["inference_logprobs"][0] = None  # a prompt token: never read
    f = _write_jsonl(tmp_path / "rank_0.jsonl", [ok, bad])
    with pytest.raises(ValueError, match=r"rank_0\.jsonl: .*id='2:0'.*'trainer_logprobs'\[2\] is null"):
        load_batch(f, preset="prime-rl")
    batch = load_batch(f, preset="prime-rl", on_bad="drop")
    assert batch.ids.tolist() == ["1:0"]
    assert batch.dropped[0].id == "2:0"
    assert "line 2, piece 0" in batch.dropped[0].reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("trainer_logprobs"), r"line 1: missing field 'trainer_logprobs'"),
        (lambda r: r["inference_logprobs"].pop(), r"line 1: length mismatch: .*'inference_logprobs' has 2"),
        (
            lambda r: r["trainer_logprobs"].__setitem__(1, 0.5),
            r"line 1, piece 0: field 'trainer_logprobs'\[1\] = 0.5 is > 0",
        ),
        (lambda r: r.__setitem__("advantages", "x"), r"field 'advantages' is not a list of numbers"),
    ],
)
def test_prime_rl_bad_records_name_field_and_line(tmp_path, change, message):
    """A bad record's error names the file, the line and the file's field."""
    rec = _prime_line([(1, [-0.1, -0.2], [-0.1, -0.2])])
    change(rec)
    with pytest.raises(ValueError, match=message):
        load_batch(_write_jsonl(tmp_path / "rank_0.jsonl", [rec]), preset="prime-rl")


def test_prime_rl_unknown_schema_and_bad_json(tmp_path):
    """An unknown schema_version, invalid JSON or fields= with the preset are one-line errors."""
    rec = _prime_line([(1, [-0.1], [-0.1])], schema_version=2)
    with pytest.raises(ValueError, match=r"rank_0\.jsonl: line 1: schema_version 2"):
        load_batch(_write_jsonl(tmp_path / "rank_0.jsonl", [rec]), preset="prime-rl")
    (tmp_path / "rank_1.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"rank_1\.jsonl: line 1: invalid JSON"):
        load_batch(tmp_path / "rank_1.jsonl", preset="prime-rl")
    with pytest.raises(ValueError, match="no fields= or format="):
        load_batch(tmp_path / "rank_1.jsonl", preset="prime-rl", fields={"logp": "x"})


# --------------------------------------------------------------------------------------
# NeMo-RL: advantages and token ids as well
# --------------------------------------------------------------------------------------
def test_nemo_rl_reads_advantages_and_token_ids(tmp_path):
    """Function read_run gives NeMo-RL's advantages and token ids; same batch as the mapping preset."""
    recs = [
        {
            "idx": i,
            "prev_logprobs": [[0.0, -0.1 * (i + 1), -0.2]],
            "generation_logprobs": [[0.0, -0.1, -0.3]],
            "token_loss_mask": [[0, 1, 1]],
            "advantages": [[0.0, 1.5 * i, 1.5 * i]],
            "token_ids": [[7, 8, 9]],
            "content": ["hi"],
            "rewards": [1.0],
        }
        for i in range(2)
    ]
    f = _write_jsonl(tmp_path / "train_data_step1.jsonl", recs)
    run = read_run(f, "nemo-rl")
    np.testing.assert_array_equal(run.advantages[1], [0.0, 1.5, 1.5])
    assert run.token_ids[0].tolist() == [7, 8, 9]
    a, b = run.to_batch(), load_batch(f, preset="nemo-rl")
    for x, y in zip(a.arrays(), b.arrays(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.ids.tolist() == b.ids.tolist() == [0, 1]


def _nemo_records():
    """Return the two NeMo-RL lines of the test above (a batch of one each)."""
    return [
        {
            "idx": i,
            "prev_logprobs": [[0.0, -0.1 * (i + 1), -0.2]],
            "generation_logprobs": [[0.0, -0.1, -0.3]],
            "token_loss_mask": [[0, 1, 1]],
            "advantages": [[0.0, 1.5 * i, 1.5 * i]],
            "token_ids": [[7, 8, 9]],
        }
        for i in range(2)
    ]


def test_the_one_nemo_rl_parser():
    """parse_record with NeMo-RL's names reads a line: unwrapped arrays, idx as the id (never a prompt)."""
    names = field_names(NEMO_RL_FIELDS)
    rec = _nemo_records()[1]
    parsed = parse_record(rec, 5, names, unwrap=True, extra=("advantages", "token_ids"))
    assert (parsed.id, parsed.prompt_id, parsed.problem) == (1, None, None)
    np.testing.assert_array_equal(parsed.arrays["logp"], [0.0, -0.2, -0.2])
    np.testing.assert_array_equal(parsed.arrays["old_logp"], parsed.arrays["logp"])
    np.testing.assert_array_equal(parsed.arrays["rollout_logp"], [0.0, -0.1, -0.3])
    np.testing.assert_array_equal(parsed.arrays["mask"], [0, 1, 1])
    np.testing.assert_array_equal(parsed.arrays["advantages"], [0.0, 1.5, 1.5])
    assert parsed.arrays["token_ids"].tolist() == [7, 8, 9]
    bad = parse_record({**rec, "prev_logprobs": [-0.4]}, 5, names, unwrap=True)
    assert bad.problem == "field 'prev_logprobs' must be a list holding one list (a batch of one)"
    assert parse_record([1], 5, names, unwrap=True) == (5, {}, "record is not a JSON object", None)


@pytest.mark.parametrize("drop", ["token_loss_mask", "generation_logprobs"])
def test_both_nemo_rl_paths_read_an_optional_field_alike(tmp_path, drop):
    """One reader for both calls: no mask, every token counts; no vLLM log-probs, no rollout_logp.

    Before the one parser, read_run called a missing ``token_loss_mask`` bad data.
    """
    recs = [{k: v for k, v in r.items() if k != drop} for r in _nemo_records()]
    f = _write_jsonl(tmp_path / "train_data_step1.jsonl", recs)
    run = read_run(f, "nemo-rl")
    assert run.problems == {}
    a, b = run.to_batch(), load_batch(f, preset="nemo-rl")
    assert a.lengths.tolist() == b.lengths.tolist() == ([3, 3] if drop == "token_loss_mask" else [2, 2])
    assert (a.rollout_logp is None) == (b.rollout_logp is None) == (drop == "generation_logprobs")
    for x, y in zip(a.arrays(), b.arrays(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_both_nemo_rl_paths_name_the_same_problem(tmp_path):
    """A field that is not a batch of one: read_run and load_batch (one reader) name it with its line."""
    recs = _nemo_records()
    recs[1]["generation_logprobs"] = [-0.1, -0.3]
    f = _write_jsonl(tmp_path / "train_data_step1.jsonl", recs)
    problem = "line 2: field 'generation_logprobs' must be a list holding one list (a batch of one)"
    assert read_run(f, "nemo-rl").problems == {1: problem}
    dropped = load_batch(f, preset="nemo-rl", on_bad="drop").dropped
    assert [(d.index, d.reason) for d in dropped] == [(1, problem)]


# --------------------------------------------------------------------------------------
# NeMo-RL's own logging code path: groups by prompt tokens, sample_loss_mask honoured
# --------------------------------------------------------------------------------------
#: NVIDIA-NeMo/RL commit whose logging the helpers below reproduce.
NEMO_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
NEMO_PAD = 0  # the tokenizer's pad_token_id (batched_message_log_to_flat_message pads with it)


def _nemo_log_batched_dict_as_jsonl(to_log: dict, filepath: Path) -> None:
    """NeMo-RL's ``Logger.log_batched_dict_as_jsonl``, its behaviour copied (not vendored).

    ``nemo_rl/utils/logger.py`` at :data:`NEMO_COMMIT`, lines 1071-1096: the dict becomes a
    ``BatchedDataDict``, ``make_microbatch_iterator(1)`` yields ``slice(i, i + 1)`` of every key
    (``nemo_rl/distributed/batched_data_dict.py``, lines 885-906 and 1006-1027: a list is sliced
    ``v[i:i + 1]``, a batch of one; its size is the first key's length), tensors and arrays become
    lists, and line ``i`` is ``json.dumps({**sample, "idx": i}, default=str)``.
    """
    size = len(next(iter(to_log.values())))
    with open(filepath, "w") as f:
        for i in range(size):
            sample = {k: v[i : i + 1] for k, v in to_log.items()}
            for key, value in sample.items():
                if isinstance(value, torch.Tensor | np.ndarray):
                    sample[key] = value.tolist()
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")


def _nemo_grpo_step(rng, prompts, n_gen, *, sample_mask=None, order=None):
    """One GRPO step's ``train_data`` as NeMo-RL builds it, and NeMo's own groups of its rows.

    ``nemo_rl/algorithms/grpo.py`` at :data:`NEMO_COMMIT`: the prompts repeated ``n_gen`` times
    each (``repeat_interleave``, lines 2846-2853); each row's message log flattened to prompt then
    response tokens, right-padded with the pad token (``batched_message_log_to_flat_message``);
    ``token_loss_mask`` 1 on the generated tokens only (lines 1910-1942); ``sample_mask`` the
    loss multiplier (line 3171). The groups are those of ``calculate_baseline_and_std_per_prompt``
    (``nemo_rl/algorithms/utils.py`` lines 132-147): rows whose padded prompt tokens are equal
    (``torch.unique(prompts, dim=0)``, then ``(prompts == unique[i]).all(1)``). ``order`` permutes
    the rows (the grouping never depends on their order).
    """
    rows = [p for p in prompts for _ in range(n_gen)]
    b = len(rows)
    resp_len = rng.integers(2, 9, size=b)
    width = max(len(p) + r for p, r in zip(rows, resp_len, strict=True))
    tok = torch.full((b, width), NEMO_PAD, dtype=torch.int64)
    mask = torch.zeros((b, width), dtype=torch.int64)
    gen = torch.zeros((b, width), dtype=torch.float32)
    prev = torch.zeros((b, width), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(rows, resp_len, strict=True)):
        n = len(p)
        tok[i, :n] = torch.tensor(p)
        tok[i, n : n + r] = torch.as_tensor(rng.integers(1, 50, size=r))
        mask[i, n : n + r] = 1
        lp = -rng.exponential(0.8, size=r)
        prev[i, n : n + r] = torch.as_tensor(lp, dtype=torch.float32)
        gen[i, n : n + r] = torch.as_tensor(np.minimum(lp + rng.normal(0, 0.05, r), 0.0), dtype=torch.float32)
    lengths = torch.as_tensor([len(p) + r for p, r in zip(rows, resp_len, strict=True)])
    smask = torch.ones(b) if sample_mask is None else torch.as_tensor(sample_mask, dtype=torch.float32)
    prompt_rows = torch.full((b, max(len(p) for p in rows)), NEMO_PAD, dtype=torch.int64)
    for i, p in enumerate(rows):
        prompt_rows[i, : len(p)] = torch.tensor(p)
    order = torch.arange(b) if order is None else torch.as_tensor(order)
    tok, mask, gen, prev, lengths, smask, prompt_rows = (
        x[order] for x in (tok, mask, gen, prev, lengths, smask, prompt_rows)
    )
    unique = torch.unique(prompt_rows, dim=0)
    groups = [frozenset(torch.nonzero((prompt_rows == u).all(1)).ravel().tolist()) for u in unique]
    train_data = {
        "input_ids": tok,
        "input_lengths": lengths,
        "generation_logprobs": gen,
        "token_mask": mask,
        "sample_mask": smask,
        "prev_logprobs": prev,
        "advantages": torch.zeros((b, width)),
    }
    return train_data, set(groups)


def _nemo_log_data(train_data: dict) -> dict:
    """Return the ``log_data`` of ``grpo_train`` (``grpo.py`` at :data:`NEMO_COMMIT`, lines 3633-3649)."""
    b = train_data["input_ids"].shape[0]
    return {
        "content": [[f"message {i}"] for i in range(b)],
        "rewards": torch.ones(b).tolist(),
        "input_lengths": train_data["input_lengths"].tolist(),
        "token_ids": train_data["input_ids"].tolist(),
        "token_loss_mask": train_data["token_mask"].tolist(),
        "sample_loss_mask": train_data["sample_mask"].tolist(),
        "advantages": train_data["advantages"].tolist(),
        "generation_logprobs": train_data["generation_logprobs"].tolist(),
        "prev_logprobs": train_data["prev_logprobs"].tolist(),
    }


def _partition(prompt_id, rows) -> set:
    """Return the groups of ``rows`` (file rows) that equal prompt ids make, as a set of frozensets."""
    by: dict = {}
    for row, g in zip(rows, prompt_id, strict=True):
        by.setdefault(g, set()).add(row)
    return {frozenset(v) for v in by.values()}


@needs_torch
@pytest.mark.parametrize("shuffled", [False, True])
def test_nemo_rl_groups_are_grpos_prompt_groups(tmp_path, shuffled):
    """Written through NeMo-RL's logging path, the dump is read with GRPO's own groups, not ``idx``.

    Five prompts of four generations; two prompts share their first tokens, one is a prefix of
    another (GRPO tells them apart: they differ once padded). ``idx`` is the line number, so
    reading it as the prompt made 20 groups of one.
    """
    rng = np.random.default_rng(11)
    prompts = [[5, 6, 7], [5, 6, 8], [5, 6], [9, 3, 3, 4], [12]]
    order = rng.permutation(20) if shuffled else None
    train_data, nemo_groups = _nemo_grpo_step(rng, prompts, 4, order=order)
    path = tmp_path / "train_data_step1.jsonl"
    _nemo_log_batched_dict_as_jsonl(_nemo_log_data(train_data), path)
    first = json.loads(path.read_text().splitlines()[0])
    assert first["idx"] == 0
    assert len(first["token_ids"]) == 1
    assert first["sample_loss_mask"] == [1.0]
    batch = load_batch(path, preset="nemo-rl")
    assert batch.ids.tolist() == list(range(20))  # idx: the line's index
    assert len(nemo_groups) == 5
    assert _partition(batch.prompt_id.tolist(), range(20)) == nemo_groups
    assert batch.notes == ()
    run = read_run(path, "nemo-rl")
    assert run.prompt_id == batch.prompt_id.tolist()


@needs_torch
def test_nemo_rl_sample_loss_mask_leaves_samples_out(tmp_path, capsys):
    """A sample with sample_loss_mask 0 trains nothing in NeMo-RL's loss: not counted, and a note says so.

    Its log-probs are left far off (a mismatch of 3 nats a token): counted, they would dominate
    the mismatch variance; the loaded batch's mismatch equals that of the kept samples alone.
    """
    from variance_lab.cli import main

    rng = np.random.default_rng(12)
    smask = [1.0] * 24
    smask[5] = smask[17] = 0.0
    train_data, nemo_groups = _nemo_grpo_step(rng, [[1, 2], [3, 4, 4], [7], [8, 9]], 6, sample_mask=smask)
    for row in (5, 17):
        counted = train_data["token_mask"][row] == 1
        train_data["generation_logprobs"][row][counted] = train_data["prev_logprobs"][row][counted] - 3.0
    path = tmp_path / "train_data_step2.jsonl"
    _nemo_log_batched_dict_as_jsonl(_nemo_log_data(train_data), path)
    batch = load_batch(path, preset="nemo-rl")
    kept = [i for i in range(24) if smask[i]]
    assert batch.ids.tolist() == kept
    assert batch.n_dropped == 0
    assert batch.notes == (
        "train_data_step2.jsonl: 2 of 24 samples have sample_loss_mask 0 (NeMo-RL's loss leaves them "
        "out): not counted",
    )
    assert _partition(batch.prompt_id.tolist(), kept) == {g - {5, 17} for g in nemo_groups}
    m = train_data["token_mask"][kept] == 1
    expect = (
        train_data["prev_logprobs"][kept][m].double() - train_data["generation_logprobs"][kept][m].double()
    )
    np.testing.assert_array_equal(batch.mismatch_log_ratio, expect.numpy())
    assert (
        np.max(np.abs(batch.mismatch_log_ratio)) < 1.0
    )  # the 3-nat tokens of samples 5 and 17 are not there
    assert main(["analyze", str(path), "--preset", "nemo-rl", "--n-boot", "0"]) == 0
    out, err = capsys.readouterr()
    assert "bootstrap over prompts (4 prompts" in out
    assert err.count("sample_loss_mask 0") == 1
    argv = [
        "corrections",
        "--data",
        str(path),
        "--preset",
        "nemo-rl",
        "--ratio",
        "mismatch",
        "--predict",
        "none",
    ]
    assert main(argv) == 0
    assert "2 of 24 samples have sample_loss_mask 0" in capsys.readouterr().out
    smask = [0.0] * 24
    train_data["sample_mask"] = torch.zeros(24)
    _nemo_log_batched_dict_as_jsonl(_nemo_log_data(train_data), path)
    with pytest.raises(ValueError, match="every one of its 24 samples has sample_loss_mask 0"):
        load_batch(path, preset="nemo-rl")
    assert main(["analyze", str(path), "--preset", "nemo-rl", "--n-boot", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@needs_torch
def test_a_nemo_rl_dump_without_token_ids_is_read_without_groups(tmp_path, capsys):
    """NeMo-RL's first dumps had no token_ids nor token_loss_mask: no group can be told; one note says so.

    The ``log_data`` of ``grpo.py`` at NeMo-RL commit 0fae6bc2 (2025-04-28), lines 568-573:
    content, rewards, generation_logprobs, prev_logprobs, input_lengths.
    """
    from variance_lab.cli import main

    rng = np.random.default_rng(13)
    train_data, _ = _nemo_grpo_step(rng, [[1, 2], [3]], 30)
    full = _nemo_log_data(train_data)
    old = {
        k: full[k] for k in ("content", "rewards", "generation_logprobs", "prev_logprobs", "input_lengths")
    }
    path = tmp_path / "train_data_step1.jsonl"
    _nemo_log_batched_dict_as_jsonl(old, path)
    batch = load_batch(path, preset="nemo-rl")
    assert not batch.has_groups
    (text,) = batch.notes
    assert "cannot say which responses answer one prompt" in text
    assert "idx is the line's number" in text
    assert main(["analyze", str(path), "--preset", "nemo-rl", "--n-boot", "0"]) == 0
    out, err = capsys.readouterr()
    assert "bootstrap over sequences" in out
    assert err.count("cannot say which responses answer one prompt") == 1
    assert "Traceback" not in err


def test_a_bad_sample_loss_mask_is_bad_data_naming_the_line(tmp_path):
    """A sample_loss_mask that is not one finite number makes its line bad data (not a crash)."""
    recs = _nemo_records()
    recs[0]["sample_loss_mask"] = [1.0]
    recs[1]["sample_loss_mask"] = ["yes"]
    f = _write_jsonl(tmp_path / "train_data_step1.jsonl", recs)
    problem = "field 'sample_loss_mask' must be a list holding one finite number"
    assert read_run(f, "nemo-rl").problems == {1: f"line 2: {problem}"}
    with pytest.raises(ValueError, match="sample_loss_mask"):
        load_batch(f, preset="nemo-rl")
    batch = load_batch(f, preset="nemo-rl", on_bad="drop")
    assert [(d.index, d.reason) for d in batch.dropped] == [(1, f"line 2: {problem}")]


# --------------------------------------------------------------------------------------
# slime
# --------------------------------------------------------------------------------------
def _slime_payload():
    samples = []
    for pos, (lp, roll, mask) in enumerate(
        [
            ([-0.1, -0.2, -0.3], [-0.1, -0.25, -0.3], [1, 1, 0]),
            ([-0.4, -0.5], [-0.45, -0.5], [1, 1]),
        ]
    ):
        n = len(lp)
        samples.append(
            {
                "data_parallel_rank": 0,
                "sample_index": 10 + pos,
                "rollout_position": pos,
                "tokens": torch.arange(4 + n),
                "response_lengths": n,
                "total_lengths": 4 + n,
                "log_probs": torch.tensor(lp, dtype=torch.float32),
                "rollout_log_probs": roll,
                "loss_masks": torch.tensor(mask),
                "advantages": torch.full((n,), 0.25),
                "rewards": 1.0,
            }
        )
    return {"format_version": 2, "rollout_id": 4, "rank": 0, "samples": samples, "dp_shards": [{"rank": 0}]}


@needs_torch
def test_slime_train_dump(tmp_path):
    """A slime train dump (format_version 2) loads, with token ids and advantages."""
    f = tmp_path / "4.pt"
    torch.save(_slime_payload(), f)
    batch = load_batch(f, preset="slime")
    assert batch.ids.tolist() == [0, 1]
    assert batch.lengths.tolist() == [2, 2]
    np.testing.assert_allclose(batch.logp, np.float32([-0.1, -0.2, -0.4, -0.5]))
    np.testing.assert_array_equal(batch.rollout_logp, [-0.1, -0.25, -0.45, -0.5])
    run = read_run(f, "slime")
    assert run.token_ids[0].tolist() == [4, 5, 6]
    assert run.advantages[1].tolist() == [0.25, 0.25]


@needs_torch
def test_slime_refuses_pickled_objects_and_names_bad_samples(tmp_path):
    """Pickled objects are refused; a bad sample's error names the file, sample and field."""
    payload = _slime_payload()
    payload["status"] = Path("x")  # an arbitrary object: needs unpickling
    f = tmp_path / "evil.pt"
    torch.save(payload, f)
    with pytest.raises(ValueError, match=r"evil\.pt: refused: .*unpickled"):
        load_batch(f, preset="slime")
    payload = _slime_payload()
    payload["samples"][1]["rollout_log_probs"] = [-0.1]
    torch.save(payload, tmp_path / "short.pt")
    with pytest.raises(
        ValueError, match=r"short\.pt: .*id=1 .*samples\[1\]: length mismatch: response_lengths is 2"
    ):
        load_batch(tmp_path / "short.pt", preset="slime")
    payload = _slime_payload()
    payload["samples"][0]["log_probs"] = torch.tensor([-0.1, float("nan"), -0.3])
    torch.save(payload, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match=r"samples\[0\]: field 'log_probs'\[1\] is null or NaN"):
        load_batch(tmp_path / "nan.pt", preset="slime")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"junk\.pt: "):
        load_batch(tmp_path / "junk.pt", preset="slime")
    torch.save({"format_version": 1, "samples": []}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"old\.pt: format_version 1"):
        load_batch(tmp_path / "old.pt", preset="slime")


@needs_torch
def test_cli_analyze_reads_slime_and_refuses_pickles_in_one_line(tmp_path, capsys):
    """The CLI: analyze --preset slime on a pickled file: one line on stderr, status 2, nothing written."""
    from variance_lab.cli import main

    f = tmp_path / "evil.pt"
    payload = _slime_payload()
    payload["status"] = Path("x")
    torch.save(payload, f)
    out = tmp_path / "table.csv"
    assert main(["analyze", str(f), "--preset", "slime", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "evil.pt: refused" in err
    assert not out.exists()


def test_cli_reads_prime_rl_with_the_mismatch_ratio(tmp_path, capsys):
    """The CLI: analyze and corrections --data --ratio mismatch read a prime-rl export through --preset."""
    from variance_lab.cli import main

    rng = np.random.default_rng(2)
    lines = []
    for _ in range(12):
        trainer = -rng.exponential(0.5, size=int(rng.integers(2, 9)))
        inference = np.minimum(trainer + rng.normal(0.0, 0.05, trainer.size), 0.0)
        lines.append(_prime_line([(2, trainer.tolist(), inference.tolist())]))
    f = _write_jsonl(tmp_path / "rank_0.jsonl", lines)
    batch = load_batch(f, preset="prime-rl")
    out = tmp_path / "table.md"
    assert main(["analyze", str(f), "--preset", "prime-rl", "--n-boot", "0", "--out", str(out)]) == 0
    assert "Sequences: 12" in out.read_text()
    capsys.readouterr()
    argv = ["corrections", "--data", str(f), "--preset", "prime-rl", "--ratio", "mismatch", "--format", "csv"]
    assert main(argv) == 0
    header, *rows = capsys.readouterr().out.strip().splitlines()
    cols = header.split(",")
    row = dict(zip(cols, rows[0].split(","), strict=True))
    assert int(row["n_seq"]) == len(batch) == 12
    assert float(row["var_w"]) > 0  # the mismatch ratio varies; the update ratio (pi_old/pi_old) would not


@pytest.mark.parametrize(
    ("module", "name", "preset"), [("torch", "x.pt", "slime"), ("pyarrow", "x.parquet", None)]
)
def test_cli_names_a_missing_reader_in_one_line(module, name, preset, tmp_path, monkeypatch, capsys):
    """Without torch (slime's .pt) or pyarrow (Parquet) the CLI says what to install, in one line."""
    import builtins

    from variance_lab.cli import main

    real_import = builtins.__import__

    def no_module(mod, *args, **kwargs):
        if mod == module or mod.startswith(module + "."):
            raise ImportError(f"No module named {module!r}")
        return real_import(mod, *args, **kwargs)

    f = tmp_path / name
    f.write_bytes(b"not read")
    monkeypatch.setattr(builtins, "__import__", no_module)
    argv = ["analyze", str(f), "--n-boot", "0", *(["--preset", preset] if preset else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert f"{name}: reading" in err
    assert ("pip install torch" if module == "torch" else "variance_lab[parquet]") in err
