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
    """parse_record with NeMo-RL's names reads a line: unwrapped arrays, idx as id and prompt, extras."""
    names = field_names(NEMO_RL_FIELDS)
    rec = _nemo_records()[1]
    parsed = parse_record(rec, 5, names, unwrap=True, extra=("advantages", "token_ids"))
    assert (parsed.id, parsed.prompt_id, parsed.problem) == (1, 1, None)
    np.testing.assert_array_equal(parsed.arrays["logp"], [0.0, -0.2, -0.2])
    np.testing.assert_array_equal(parsed.arrays["old_logp"], parsed.arrays["logp"])
    np.testing.assert_array_equal(parsed.arrays["rollout_logp"], [0.0, -0.1, -0.3])
    np.testing.assert_array_equal(parsed.arrays["mask"], [0, 1, 1])
    np.testing.assert_array_equal(parsed.arrays["advantages"], [0.0, 1.5, 1.5])
    assert parsed.arrays["token_ids"].tolist() == [7, 8, 9]
    bad = parse_record({**rec, "prev_logprobs": [-0.4]}, 5, names, unwrap=True)
    assert bad.problem == "field 'prev_logprobs' must be a list holding one list (a batch of one)"
    assert parse_record([1], 5, names, unwrap=True) == (5, {}, "record is not a JSON object", None)
    with pytest.raises(ValueError, match=r"record 5 \(id=1\): inconsistent prompt ids 'idx'=1 and"):
        parse_record({**rec, "prompt_id": 2}, 5, names, unwrap=True)


@pytest.mark.parametrize("drop", ["token_loss_mask", "generation_logprobs"])
def test_both_nemo_rl_paths_read_an_optional_field_alike(tmp_path, drop):
    """Both paths share the parser: no mask, every token counts; no vLLM log-probs, no rollout_logp.

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
    """A field that is not a batch of one is the same problem on both paths (read_run adds the line)."""
    recs = _nemo_records()
    recs[1]["generation_logprobs"] = [-0.1, -0.3]
    f = _write_jsonl(tmp_path / "train_data_step1.jsonl", recs)
    problem = "field 'generation_logprobs' must be a list holding one list (a batch of one)"
    assert read_run(f, "nemo-rl").problems == {1: f"line 2: {problem}"}
    dropped = load_batch(f, preset="nemo-rl", on_bad="drop").dropped
    assert [(d.index, d.reason) for d in dropped] == [(1, problem)]


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
