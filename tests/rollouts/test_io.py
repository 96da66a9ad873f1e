"""Loaders and writers: round trips in every format, format detection, bad data through files."""

import gzip
import json
import math

import numpy as np
import pytest

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import detect_format, load_batch, save_batch, write_records

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FILES = [
    ("x.jsonl", "padded"),
    ("x.jsonl.gz", "padded"),
    ("x.ndjson", "padded"),
    ("x.parquet", "padded"),
    ("x.npz", "padded"),
    ("x.npz", "flat"),
]


def _batch(rng, ids=None, holes=True):
    n = 7
    lengths = rng.integers(1, 40, n)
    new = [-rng.exponential(2.0, m) for m in lengths]
    old = [-rng.exponential(2.0, m) for m in lengths]
    mask = None
    if holes:
        mask = [(rng.random(m) < 0.7).astype(int) for m in lengths]
        for m in mask:
            m[-1] = 1  # keep at least one counted token
    return TokenBatch.from_ragged(new, old, mask, ids=ids)


def _same(a, b):
    for name in ("logp", "old_logp", "offsets", "positions"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.ids.tolist() == b.ids.tolist()


@pytest.mark.parametrize(("name", "layout"), FILES)
@pytest.mark.parametrize("ids", [None, "str"])
@pytest.mark.parametrize("holes", [True, False])
def test_round_trip(tmp_path, name, layout, ids, holes):
    """Every file format and layout round-trips a batch, with or without ids and holes."""
    rng = np.random.default_rng(11)
    batch = _batch(rng, ids=[f"seq-{i}" for i in range(7)] if ids else None, holes=holes)
    path = save_batch(batch, tmp_path / name, npz_layout=layout)
    _same(batch, load_batch(path))


def test_round_trip_mixed_ids_jsonl_keeps_types(tmp_path):
    """JSONL keeps mixed int and string ids; Parquet turns them into strings."""
    rng = np.random.default_rng(12)
    batch = _batch(rng, ids=np.array([1, "b", 3, "d", 5, "f", 7], dtype=object))
    _same(batch, load_batch(save_batch(batch, tmp_path / "m.jsonl")))
    back = load_batch(save_batch(batch, tmp_path / "m.parquet"))
    assert back.ids.tolist() == ["1", "b", "3", "d", "5", "f", "7"]  # Parquet/NPZ: strings


def test_format_override_and_detection(tmp_path):
    """The format is detected from the suffix or given; unknown suffixes and formats raise."""
    batch = _batch(np.random.default_rng(13))
    path = save_batch(batch, tmp_path / "rollouts.txt", format="jsonl")
    _same(batch, load_batch(path, format="jsonl"))
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_batch(path)
    with pytest.raises(ValueError, match="only JSONL may be gzip"):
        detect_format("a.parquet.gz")
    with pytest.raises(ValueError, match="format must be one of"):
        detect_format("a.jsonl", "csv")
    assert [detect_format(p) for p in ("a.JSONL", "b.pq", "c.npz", "d.ndjson.gz")] == [
        "jsonl",
        "parquet",
        "npz",
        "jsonl",
    ]


def test_jsonl_layout_is_plain_and_skips_blank_lines(tmp_path):
    """JSONL records are plain objects; blank lines are skipped and ids default to the index."""
    path = tmp_path / "b.jsonl"
    path.write_text(
        '{"id": "a", "logp": [-0.5, -1.0], "old_logp": [-0.6, -0.9]}\n\n'
        '{"logp": [-2.0], "old_logp": [-2.0], "mask": [1]}\n'
    )
    batch = load_batch(path)
    assert batch.ids.dtype == object
    assert batch.ids.tolist() == ["a", 1]
    assert batch.logp.tolist() == [-0.5, -1.0, -2.0]


def test_gzip_jsonl_is_compressed(tmp_path):
    """A ``.jsonl.gz`` file is written gzip-compressed."""
    path = save_batch(_batch(np.random.default_rng(14)), tmp_path / "b.jsonl.gz")
    with gzip.open(path, "rt") as fh:
        assert json.loads(fh.readline())["id"] == 0


def test_field_names_can_be_mapped(tmp_path):
    """Other field names (verl's) load through ``fields``; an unknown key raises."""
    path = tmp_path / "verl.jsonl"
    path.write_text(
        json.dumps(
            {"uid": "u1", "log_probs": [-1.0, -2.0], "old_log_probs": [-1.0, -1.0], "response_mask": [1, 0]}
        )
        + "\n"
    )
    fields = {"logp": "log_probs", "old_logp": "old_log_probs", "mask": "response_mask", "id": "uid"}
    batch = load_batch(path, fields=fields)
    assert batch.ids.tolist() == ["u1"]
    assert batch.logp.tolist() == [-1.0]
    with pytest.raises(ValueError, match="unknown field 'logprob'"):
        load_batch(path, fields={"logprob": "x"})


# --------------------------------------------------------------------------------------
# bad data through files
# --------------------------------------------------------------------------------------
OK = {"logp": [-1.0, -2.0], "old_logp": [-1.5, -1.5]}
BAD = {
    "nan": ({"logp": [-1.0, math.nan], "old_logp": [-1.0, -1.0]}, r"logp\[1\] is NaN"),
    "posinf": ({"logp": [-1.0, -1.0], "old_logp": [-1.0, math.inf]}, r"old_logp\[1\] is \+inf"),
    "neginf": ({"logp": [-math.inf, -1.0], "old_logp": [-1.0, -1.0]}, r"logp\[0\] is -inf"),
    "positive": ({"logp": [-1.0, 0.25], "old_logp": [-1.0, -1.0]}, r"logp\[1\] = 0.25 is > 0"),
    "mismatch": ({"logp": [-1.0], "old_logp": [-1.0, -1.0]}, "length mismatch"),
    "empty": ({"logp": [], "old_logp": []}, "empty sequence"),
    "masked_out": ({"logp": [-1.0], "old_logp": [-1.0], "mask": [0]}, "no counted token"),
}


def _records(bad):
    return [{"id": "r0", **OK}, {"id": "r1", **bad}, {"id": "r2", **OK}]


@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.parametrize(("name", "layout"), [("b.jsonl", "padded"), ("b.parquet", ""), ("b.npz", "flat")])
def test_bad_data_in_files(tmp_path, kind, name, layout):
    """Bad data in each format raises naming the sequence, or is dropped with ``on_bad='drop'``."""
    bad, message = BAD[kind]
    path = write_records(_records(bad), tmp_path / name, npz_layout=layout or "padded")
    with pytest.raises(ValueError, match=rf"bad sequence id='r1' \(index 1\): {message}"):
        load_batch(path)
    batch = load_batch(path, on_bad="drop")
    assert batch.ids.tolist() == ["r0", "r2"]
    assert batch.n_dropped == 1
    assert batch.dropped[0].index == 1
    assert batch.dropped[0].id == "r1"


def test_jsonl_writes_nan_and_infinity_tokens(tmp_path):
    """JSONL writes a NaN log-probability as the bare token NaN."""
    path = write_records(_records(BAD["nan"][0]), tmp_path / "b.jsonl")
    assert "NaN" in path.read_text()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"logp": [-1.0]}, "missing field 'old_logp'"),
        ({"logp": None, "old_logp": [-1.0]}, "field 'logp' is null"),
        ({"logp": ["a"], "old_logp": [-1.0]}, "field 'logp' is not a list of numbers"),
        ({"logp": [[-1.0]], "old_logp": [[-1.0]]}, "field 'logp' must be a flat list"),
        ({"logp": [-1.0, None], "old_logp": [-1.0, -1.0]}, r"logp\[1\] is NaN"),
    ],
)
def test_bad_records_in_jsonl(tmp_path, record, message):
    """Missing, null, non-numeric and nested fields raise naming the record, or are dropped."""
    path = write_records([{"id": "r0", **OK}, {"id": "r1", **record}], tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match=rf"id='r1' \(index 1\): {message}"):
        load_batch(path)
    assert load_batch(path, on_bad="drop").dropped[0].reason.startswith(message.split("\\")[0])


def test_record_that_is_not_an_object(tmp_path):
    """A JSONL line that is not an object raises naming its index."""
    path = tmp_path / "b.jsonl"
    path.write_text('[1, 2]\n{"logp": [-1.0], "old_logp": [-1.0]}\n')
    with pytest.raises(ValueError, match=r"index 0\): record is not a JSON object"):
        load_batch(path)


def test_malformed_json_names_the_line(tmp_path):
    """Malformed JSON raises naming the file and line, even with ``on_bad='drop'``."""
    path = tmp_path / "b.jsonl"
    path.write_text('{"logp": [-1.0], "old_logp": [-1.0]}\n\n{"logp": [-1.0\n')
    with pytest.raises(ValueError, match=r"b\.jsonl: line 3: invalid JSON"):
        load_batch(path, on_bad="drop")


def test_parquet_null_rows_and_entries(tmp_path):
    """Null Parquet fields and entries raise or drop with their reason; a null mask counts all."""
    records = [
        {"id": "r0", **OK, "mask": None},
        {"id": "r1", "logp": [-1.0], "old_logp": None},
        {"id": "r2", "logp": [-1.0, None], "old_logp": [-1.0, -1.0], "mask": [1, 1]},
    ]
    path = write_records(records, tmp_path / "n.parquet")
    with pytest.raises(ValueError, match=r"id='r1' \(index 1\): field 'old_logp' is null; 1 more"):
        load_batch(path)
    batch = load_batch(path, on_bad="drop")
    assert [d.reason for d in batch.dropped] == ["field 'old_logp' is null", "logp[1] is NaN"]
    assert batch.ids.tolist() == ["r0"]
    assert batch.lengths.tolist() == [2]  # null mask: all count


def test_parquet_wrong_column_type(tmp_path):
    """A Parquet column of the wrong type or a missing column raises ValueError."""
    pq.write_table(pa.table({"logp": [1.0], "old_logp": [[-1.0]]}), tmp_path / "w.parquet")
    with pytest.raises(ValueError, match="column 'logp' must be a list of numbers"):
        load_batch(tmp_path / "w.parquet")
    pq.write_table(pa.table({"logp": [[-1.0]]}), tmp_path / "m.parquet")
    with pytest.raises(ValueError, match="no column 'old_logp'"):
        load_batch(tmp_path / "m.parquet")


def test_npz_padded_layout_and_errors(tmp_path):
    """The padded NPZ layout loads; flat arrays without lengths and missing arrays raise."""
    np.savez(
        tmp_path / "p.npz",
        logp=np.array([[-1.0, -2.0], [-3.0, 0.0]]),
        old_logp=np.array([[-1.0, -1.0], [-1.0, 0.0]]),
        mask=np.array([[1, 1], [1, 0]]),
        id=np.array(["a", "b"]),
    )
    batch = load_batch(tmp_path / "p.npz")
    assert batch.lengths.tolist() == [2, 1]
    assert batch.ids.tolist() == ["a", "b"]
    np.savez(tmp_path / "q.npz", logp=np.zeros(3), old_logp=np.zeros(3))
    with pytest.raises(ValueError, match="1-D flat arrays with 'lengths'"):
        load_batch(tmp_path / "q.npz")
    np.savez(tmp_path / "r.npz", logp=np.zeros((1, 1)))
    with pytest.raises(ValueError, match="no array 'old_logp'"):
        load_batch(tmp_path / "r.npz")
    with pytest.raises(ValueError, match="padded NPZ layout cannot hold a length mismatch"):
        write_records(_records(BAD["mismatch"][0]), tmp_path / "s.npz")


def test_load_rejects_bad_options(tmp_path):
    """Unknown on_bad and npz_layout values and a file without records raise ValueError."""
    path = save_batch(_batch(np.random.default_rng(15)), tmp_path / "o.jsonl")
    with pytest.raises(ValueError, match="on_bad must be one of"):
        load_batch(path, on_bad="ignore")
    with pytest.raises(ValueError, match="npz_layout"):
        save_batch(_batch(np.random.default_rng(15)), tmp_path / "o.npz", npz_layout="ragged")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_batch(tmp_path / "e.jsonl")


def test_parquet_batch_keeps_the_readers_arrays_and_the_same_values(tmp_path):
    """The Parquet reader builds its batch without copying its arrays (``copy=False``), same values.

    ``from_flat`` keeps arrays it is given only with ``copy=False`` and only where nothing is left
    out; by default, or with a sequence dropped or a token masked, the batch holds copies.
    """
    rng = np.random.default_rng(3)
    lengths = np.array([3, 5, 2, 7])
    logp = -rng.exponential(1.0, lengths.sum())
    old = -rng.exponential(1.0, lengths.sum())
    kept = TokenBatch.from_flat(logp, old, lengths, copy=False)
    assert np.shares_memory(kept.logp, logp)
    assert not kept.logp.flags.writeable
    copied = TokenBatch.from_flat(logp.copy(), old.copy(), lengths)
    assert not np.shares_memory(copied.logp, logp)
    for a, b in zip(kept.arrays(), copied.arrays(), strict=True):
        assert np.array_equal(a, b)
    bad = logp.copy()
    bad[4] = np.nan  # sequence 1 is dropped: the rest is a copy
    dropped = TokenBatch.from_flat(bad, old, lengths, copy=False, on_bad="drop")
    assert len(dropped) == 3
    assert not np.shares_memory(dropped.logp, bad)
    path = tmp_path / "b.parquet"
    save_batch(copied, path)
    loaded = load_batch(path)
    for a, b in zip(loaded.arrays(), copied.arrays(), strict=True):
        assert np.array_equal(a, b)
