"""The third log-prob set: ``rollout_logp`` (the inference engine's).

In TokenBatch and the loaders, and the NeMo-RL preset on a file written the way NeMo-RL
writes ``train_data_step{N}.jsonl``.
"""

import json

import numpy as np
import pytest

from variance_lab.rollouts import TokenBatch, load_batch, save_batch
from variance_lab.rollouts.io import write_records


def _batch(rng, n=20, holes=False):
    lens = rng.integers(3, 15, size=n)
    new = [-rng.exponential(1.0, size=k) for k in lens]
    old = [np.minimum(x + rng.normal(0, 0.05, size=x.size), 0.0) for x in new]
    roll = [np.minimum(x + rng.normal(0, 0.02, size=x.size), 0.0) for x in old]
    mask = [(rng.random(k) > 0.2).astype(int) if holes else None for k in lens]
    mask = [np.where(np.arange(k) == 0, 1, m) for k, m in zip(lens, mask, strict=True)] if holes else None
    return TokenBatch.from_ragged(new, old, mask, rollout_logp=roll)


@pytest.mark.parametrize(
    ("suffix", "layout"),
    [
        (".jsonl", "padded"),
        (".parquet", "padded"),
        (".npz", "padded"),
        (".npz", "flat"),
        (".jsonl.gz", "padded"),
    ],
)
def test_round_trip_keeps_rollout_logp(tmp_path, suffix, layout):
    """Saving and loading keeps rollout_logp and the derived log-ratios."""
    batch = _batch(np.random.default_rng(1), holes=True)
    path = save_batch(batch, tmp_path / f"b{suffix}", npz_layout=layout)
    back = load_batch(path)
    assert back.has_rollout
    np.testing.assert_array_equal(back.rollout_logp, batch.rollout_logp)
    np.testing.assert_array_equal(back.offsets, batch.offsets)
    np.testing.assert_allclose(back.mismatch_log_ratio, batch.old_logp - batch.rollout_logp)
    np.testing.assert_allclose(back.total_log_ratio, batch.logp - batch.rollout_logp)


def test_files_without_it_work_as_before(tmp_path):
    """A file without rollout_logp loads, and asking for the mismatch raises."""
    batch = TokenBatch.from_ragged([np.array([-1.0, -0.5])], [np.array([-1.2, -0.5])])
    back = load_batch(save_batch(batch, tmp_path / "b.jsonl"))
    assert not back.has_rollout
    assert back.rollout_logp is None
    with pytest.raises(ValueError, match="no rollout_logp"):
        back.mismatch_log_ratio  # noqa: B018


@pytest.mark.parametrize(
    ("rollout", "problem"),
    [
        ([-0.1, float("nan")], "rollout_logp[1] is NaN"),
        ([-0.1, 0.5], "rollout_logp[1] = 0.5 is > 0"),
        ([-0.1], "rollout_logp has 1"),
    ],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_validated_like_the_others(tmp_path, rollout, problem, suffix):
    """A bad rollout_logp is refused naming the record, or dropped with on_bad='drop'."""
    recs = [
        {"id": "a", "logp": [-1.0, -2.0], "old_logp": [-1.0, -2.0], "rollout_logp": rollout},
        {"id": "b", "logp": [-1.0], "old_logp": [-1.0], "rollout_logp": [-1.0]},
    ]
    path = write_records(recs, tmp_path / f"r{suffix}")
    with pytest.raises(ValueError, match="id='a'") as info:
        load_batch(path)
    assert problem in str(info.value)
    kept = load_batch(path, on_bad="drop")
    assert kept.ids.tolist() == ["b"]
    assert problem in kept.dropped[0].reason


def test_a_record_missing_it_when_others_have_it(tmp_path):
    """A record without rollout_logp among records with it is refused, naming its index."""
    recs = [
        {"logp": [-1.0], "old_logp": [-1.0], "rollout_logp": [-1.0]},
        {"logp": [-1.0], "old_logp": [-1.0]},
    ]
    with pytest.raises(ValueError, match=r"index 1.*missing field 'rollout_logp'"):
        load_batch(write_records(recs, tmp_path / "r.jsonl"))


def _nemo_rl_line(idx, gen, prev, mask, total):
    """One line as NeMo-RL's Logger.log_batched_dict_as_jsonl writes it: a batch of one, padded to total."""
    pad = total - len(gen)
    return {
        "content": ["<prompt and response text>"],
        "rewards": [1.0],
        "input_lengths": [len(gen)],
        "token_ids": [[7] * total],
        "token_loss_mask": [mask + [0] * pad],
        "sample_loss_mask": [1.0],
        "advantages": [[0.5] * total],
        "generation_logprobs": [gen + [0.0] * pad],
        "prev_logprobs": [prev + [0.0] * pad],
        "idx": idx,
    }


def test_nemo_rl_preset(tmp_path):
    """The nemo-rl preset drops masked prompt tokens and reads the rollout and trainer log-probs."""
    # prompt tokens (mask 0) carry logprob 0 in both sets; response tokens are scored
    lines = [
        _nemo_rl_line(0, [0.0, 0.0, -0.5, -1.0], [0.0, 0.0, -0.4, -1.1], [0, 0, 1, 1], 6),
        _nemo_rl_line(
            1,
            [0.0, -0.2, -0.3, -0.1, -2.0, -0.7],
            [0.0, -0.25, -0.3, -0.1, -1.9, -0.7],
            [0, 1, 1, 1, 1, 1],
            6,
        ),
    ]
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    batch = load_batch(path, preset="nemo-rl")
    assert batch.ids.tolist() == [0, 1]
    assert batch.lengths.tolist() == [2, 5]
    np.testing.assert_allclose(batch.rollout_logp, [-0.5, -1.0, -0.2, -0.3, -0.1, -2.0, -0.7])
    np.testing.assert_allclose(batch.mismatch_log_ratio, [0.1, -0.1, -0.05, 0.0, 0.0, 0.1, 0.0], atol=1e-15)
    np.testing.assert_array_equal(batch.log_ratio, 0.0)  # the dump's trainer log-probs are pi_old
    with pytest.raises(ValueError, match="unknown preset 'verl2'"):
        load_batch(path, preset="verl2")


def test_nemo_rl_preset_rejects_an_unwrapped_field(tmp_path):
    """The nemo-rl preset refuses a field that is not a list holding one list."""
    line = _nemo_rl_line(0, [-0.5], [-0.4], [1], 1)
    line["prev_logprobs"] = [-0.4]
    path = tmp_path / "train_data_step1.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="must be a list holding one list"):
        load_batch(path, preset="nemo-rl")
