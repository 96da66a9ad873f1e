"""variance_lab.rollouts.records: per-sequence values of the records a batch kept."""

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
