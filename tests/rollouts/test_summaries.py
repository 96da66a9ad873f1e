"""The streaming analysis: a file read in pieces gives every number the loaded batch gives, bit for bit."""

import json
import math

import numpy as np
import pytest

from variance_lab.rollouts.analysis import analyze
from variance_lab.rollouts.io import load_batch
from variance_lab.rollouts.source import batch_source, parquet_source
from variance_lab.rollouts.summaries import ALL, Summaries


def _same(a, b, path=""):
    """Where two JSON-ready values differ: floats bit for bit (NaN where NaN), the rest equal."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float), path
        assert math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _numbers(result) -> dict:
    out = {"summary": result.summary(), "table": result.table.to_dict("records")}
    return json.loads(json.dumps(out, default=str))


@pytest.mark.parametrize(
    ("options", "ratio"),
    [
        ({"n": 160}, "update"),
        ({"n": 160, "holes": True, "bad": (7,)}, "update"),
        ({"n": 150, "prompts": False}, "mismatch"),
        ({"n": 120}, "total"),
    ],
)
def test_a_file_read_in_pieces_analyses_as_the_loaded_batch(tmp_path, write_dump, options, ratio):
    """The Parquet source's analysis (pieces of 9 rows) is load_batch's, every number bit for bit."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(11), row_group=13, **options)
    kwargs = {"n_boot": 60, "seed": 3, "ratio": ratio, "fit_tokens": 1500, "fit_sequences": 70}
    whole = analyze(load_batch(path, on_bad="drop"), **kwargs)
    pieces = analyze(parquet_source(path, on_bad="drop", rows=9), **kwargs)
    _same(_numbers(whole), _numbers(pieces))
    assert whole.summary()["fit_sample"]["tokens"]["subsampled"]  # the samples were drawn, in pieces too
    assert pieces.fitted["heldout"] is not None


def test_the_comparison_sees_another_seed(tmp_path, write_dump):
    """The check above can fail: another bootstrap seed changes the intervals."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(12), n=90)
    a = analyze(load_batch(path), n_boot=40, seed=1, fit_models=False)
    b = analyze(parquet_source(path, rows=9), n_boot=40, seed=2, fit_models=False)
    with pytest.raises(AssertionError):
        _same(_numbers(a), _numbers(b))


def test_summaries_hold_every_set_judged(tmp_path, write_dump):
    """The whole batch and each fold, to judge and to fit: sets of the source's sequences."""
    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(13), n=120)
    summaries = Summaries(parquet_source(path, rows=10), folds=2, seed=0)
    every = summaries.eval_set(ALL)
    assert every.index.tolist() == list(range(120))
    folds = [summaries.eval_set(("fold", f)).index for f in range(2)]
    assert sorted(np.concatenate(folds).tolist()) == list(range(120))
    for f in range(2):
        rest = summaries.fit_set(("rest", f))
        assert rest.fit.n_tokens == int(summaries.T[folds[1 - f]].sum())
        assert rest.samples["sequences"].batch.T.size <= 120


def test_without_prompts_identical_responses_are_counted(tmp_path, write_dump):
    """No prompt_id: the responses that repeat another's log-probs are counted, as TokenBatch.n_identical."""
    from variance_lab.rollouts.batch import TokenBatch

    rng = np.random.default_rng(14)
    seqs = [-(rng.exponential(1.0, int(L)) + 0.01) for L in rng.integers(2, 30, size=40)]
    seqs += seqs[:7]  # seven copies
    batch = TokenBatch.from_ragged([np.minimum(s + 0.01, 0) for s in seqs], seqs)
    summaries = Summaries(batch_source(batch, piece_tokens=50), fit_models=False)
    assert summaries.n_identical() == batch.n_identical() == 7
