"""Token sources: a Parquet file read in pieces holds what the whole read holds, sequence for sequence."""

import math

import numpy as np
import pytest

from variance_lab.rollouts.io import load_batch
from variance_lab.rollouts.source import MAXIMA, batch_source, open_rollouts, parquet_source


@pytest.mark.parametrize(
    "options", [{}, {"holes": True}, {"prompts": False}, {"bad": (4, 40), "holes": True}]
)
def test_parquet_source_holds_what_load_batch_holds(tmp_path, write_dump, options):
    """Lengths, spans, ids, prompts, maxima, dropped; the pieces one after another are the batch's tokens."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(0), **options)
    batch = load_batch(path, on_bad="drop")
    source = parquet_source(path, on_bad="drop", rows=7)
    assert source.lengths.tolist() == batch.lengths.tolist()
    assert source.spans.tolist() == (batch.positions[batch.offsets[1:] - 1] + 1).tolist()
    assert source.ids.tolist() == batch.ids.tolist()
    assert (source.prompt_id is None) == (batch.prompt_id is None)
    if batch.prompt_id is not None:
        assert source.prompt_id.dtype == batch.prompt_id.dtype
        assert source.prompt_id.tolist() == batch.prompt_id.tolist()
    assert source.dropped == batch.dropped
    assert source.maxima.tolist() == batch_source(batch).maxima.tolist()
    assert source.column("update_hi").tolist() == [
        float(np.max(batch.logp[a:b] - batch.old_logp[a:b]))
        for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]
    for _ in range(2):  # every pass gives the same pieces
        pieces = list(source.pieces())
        assert [first for first, _ in pieces] == np.cumsum([0] + [len(p) for _, p in pieces])[:-1].tolist()
        for name in ("logp", "old_logp", "rollout_logp", "positions"):
            joined = np.concatenate([getattr(p, name) for _, p in pieces])
            assert np.array_equal(joined, getattr(batch, name))


def test_parquet_source_raises_as_load_batch_does(tmp_path, write_dump):
    """A bad row: the same message (first bad sequence, how many more), once the file was read."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(1), bad=(20, 61))
    with pytest.raises(ValueError, match="bad sequence") as whole:
        load_batch(path)
    with pytest.raises(ValueError, match="bad sequence") as pieces:
        parquet_source(path, rows=8)
    assert str(pieces.value) == str(whole.value)
    assert "index 20" in str(whole.value)
    assert "1 more bad sequence" in str(whole.value)


def test_parquet_source_counts_the_trainers_rejection_once(tmp_path, write_dump):
    """The recorder's rs_mask column: one note over the whole file, as the whole read says it."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(2), rejected=True)
    assert parquet_source(path, rows=5).notes == load_batch(path).notes
    assert len(load_batch(path).notes) == 1


def test_batch_source_pieces_are_views_of_whole_sequences():
    """An in-memory batch in pieces of about ``piece_tokens`` tokens, never splitting a sequence."""
    batch = load_batch_of(np.random.default_rng(3))
    source = batch_source(batch, piece_tokens=100)
    pieces = list(source.pieces())
    assert len(pieces) > 3
    assert sum(len(p) for _, p in pieces) == len(batch)
    # a piece ends at the first sequence that takes it to 100 tokens
    assert all(p.n_tokens - int(p.lengths[-1]) < 100 <= p.n_tokens for _, p in pieces[:-1])
    assert np.shares_memory(pieces[1][1].logp, batch.logp)
    assert source.n_changed == int(np.sum(batch.logp != batch.old_logp))
    ratios = ("update", "mismatch", "total", "split_total")
    expected = ("logp", "old_logp", "rollout_logp", *(f"{r}_{e}" for r in ratios for e in ("lo", "hi")))
    assert expected == MAXIMA


def load_batch_of(rng):
    """Return a batch of 60 sequences of up to 39 tokens."""
    from variance_lab.rollouts.batch import TokenBatch

    lengths = rng.integers(1, 40, size=60)
    n = int(lengths.sum())
    old = -(rng.exponential(1.0, n) + 0.01)
    return TokenBatch.from_flat(np.minimum(old + rng.standard_normal(n) * 0.1, 0.0), old, lengths)


def test_open_rollouts_streams_parquet_and_loads_the_rest(tmp_path, write_dump):
    """Parquet opens as a source read in pieces; JSONL is loaded and given in pieces of the batch."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(4))
    assert open_rollouts(path).name == "d.parquet"
    from variance_lab.rollouts.io import save_batch

    jsonl = save_batch(load_batch(path), tmp_path / "d.jsonl")
    source = open_rollouts(jsonl)
    assert source.lengths.tolist() == load_batch(path).lengths.tolist()
    assert math.isclose(source.n_tokens, load_batch(path).n_tokens)
