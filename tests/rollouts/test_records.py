"""variance_lab.rollouts.records: per-sequence and per-token values of the records a batch kept."""

import pytest

from variance_lab.rollouts.batch import DroppedSequence
from variance_lab.rollouts.records import sequence_values


def test_sequence_values_skips_dropped_and_names_a_bad_record():
    """One value per kept sequence; a missing field names the record."""

    class Batch:
        dropped = (DroppedSequence(1, "b", "bad"),)

        def __len__(self):
            return 2

    recs = [{"id": "a", "advantage": 1.5}, {"id": "b"}, {"id": "c", "advantage": -2}]
    assert sequence_values(recs, "advantage", Batch()).tolist() == [1.5, -2.0]
    Batch.dropped = ()
    with pytest.raises(ValueError, match=r"id='b'.*missing"):
        sequence_values(recs, "advantage", Batch())


def test_token_values_keep_the_counted_tokens_and_name_a_bad_record():
    """One value per counted token (mask 1), dropped records skipped; a short field names the record."""
    from variance_lab.rollouts.batch import TokenBatch
    from variance_lab.rollouts.records import token_values

    recs = [
        {"id": "a", "logp": [-1.0, -2.0], "old_logp": [-1.0, -2.0], "entropy": [0.5, 1.5]},
        {
            "id": "b",
            "logp": [-1.0, -2.0, -3.0],
            "old_logp": [-1.0, -2.0, -3.0],
            "mask": [1, 0, 1],
            "entropy": [2.0, 9.0, 3.0],
        },
    ]
    batch = TokenBatch.from_ragged(
        [r["logp"] for r in recs], [r["old_logp"] for r in recs], mask=[[1, 1], [1, 0, 1]]
    )
    assert token_values(recs, "entropy", batch).tolist() == [0.5, 1.5, 2.0, 3.0]
    recs[1]["entropy"] = [2.0, 9.0]
    with pytest.raises(ValueError, match=r"id='b'.*2 values for 3 tokens"):
        token_values(recs, "entropy", batch)
    del recs[0]["entropy"]
    with pytest.raises(ValueError, match=r"id='a'.*missing"):
        token_values(recs, "entropy", batch)
