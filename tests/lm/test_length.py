"""The length batch: count requests by stratum, sampled and scored on a paired run's own chain."""

import gzip
import json
from dataclasses import replace

import numpy as np
import pytest

from variance_lab.lm.task import count_strata, parse_strata


def test_strata_parse_and_name_a_bad_part():
    """``LO-HI:K`` parts parse; a bad part is named in the error."""
    assert parse_strata("2-3:11, 20-31:36") == [(2, 3, 11), (20, 31, 36)]
    for bad in ("1-3:2", "5-4:1", "2-3:0", "2-3", "a-b:c"):
        with pytest.raises(ValueError, match="strata must read LO-HI:K"):
            parse_strata(bad)


def test_each_stratum_draws_its_count_of_requests_within_its_range():
    """Each stratum gives its K count requests, of LO to HI numbers, in order."""
    rng = np.random.default_rng(0)
    prompts = count_strata(rng, [(2, 3, 5), (20, 31, 7)])
    sizes = [len(p.answer.split(", ")) for p in prompts]
    assert all(p.kind == "count" for p in prompts)
    assert all(2 <= n <= 3 for n in sizes[:5])
    assert all(20 <= n <= 31 for n in sizes[5:])
    assert len(sizes) == 12


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from variance_lab.lm import runs as runs_mod  # noqa: E402
from variance_lab.lm.length import LENGTH_FIRST_ID, length_experiment, length_name  # noqa: E402
from variance_lab.lm.model import load_model  # noqa: E402
from variance_lab.lm.paired import paired_experiment, paired_names  # noqa: E402
from variance_lab.lm.settings import LMSettings  # noqa: E402
from variance_lab.lm.tiny import write_tiny_llama  # noqa: E402

TINY = LMSettings(
    run="paired",
    n_prompts=3,
    group_size=2,
    max_new_tokens=10,
    train_prompts=2,
    max_words=4,
    threads=1,
    lr=1e-2,
    update_lr=3e-2,
    updates=2,
    lags=1,
    samplers="",
)


def _read(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def test_the_length_batch_comes_from_the_paired_runs_own_policies(tmp_path, monkeypatch):
    """Beside a paired run, the length run reproduces its on-policy file's log-probs to the written digit.

    The warm-up, update K's minibatch and its rate are the paired run's, so theta_{K-1} and theta_K
    score the on-policy file's first records exactly as written; the length batch's own records
    hold the strata's requests under prompt ids from LENGTH_FIRST_ID, each with ``finished``.
    """
    monkeypatch.setattr(runs_mod, "rewards", lambda prompts, texts, match: np.arange(len(texts)) % 2.0)
    model, tok = load_model(write_tiny_llama(tmp_path / "m", seed=2))
    folder = tmp_path / "out"
    folder.mkdir()
    paired_experiment(TINY, folder, loaded=(model, tok, {"name": "tiny"}))
    length = replace(TINY, length_strata="2-3:2,6-8:1")
    (side,) = length_experiment(length, folder, loaded=(model, tok, {"name": "tiny"}))
    assert side["role"] == "length"
    assert side["paths"][0].endswith(length_name(0, "gspo"))
    onpolicy = paired_names(0, "gspo", (), 0)["onpolicy"]
    assert side["same_policies_as"] == onpolicy
    check = side["policy_check"]
    assert check["old_logp"]["records"] >= 1
    for field in ("old_logp", "logp"):
        assert check[field]["equal"] == check[field]["tokens"] > 0
    assert side["optimizer"]["update"] == TINY.updates
    assert side["optimizer"]["lr"] == TINY.update_lr
    records = _read(side["paths"][0])
    assert [r["prompt_id"] for r in records] == [LENGTH_FIRST_ID + i // 2 for i in range(6)]
    assert [r["task"] for r in records] == ["count"] * 6
    assert all(isinstance(r["finished"], bool) and len(r["logp"]) == len(r["old_logp"]) for r in records)


def test_a_length_batch_belongs_to_paired_runs_and_its_own_entry_point(tmp_path):
    """The paired entry point refuses strata; the length entry point refuses settings without them."""
    with pytest.raises(ValueError, match=r"a length batch is variance_lab\.lm\.length\.length_experiment's"):
        paired_experiment(replace(TINY, length_strata="2-3:1"), tmp_path)
    with pytest.raises(ValueError, match="a length batch needs run 'paired' and length_strata"):
        length_experiment(TINY, tmp_path)
