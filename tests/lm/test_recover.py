"""Recovering sampled token ids from text and log-probs, and adding entropy to a run after the fact."""

import gzip
import json

import numpy as np
import pytest

from variance_lab.lm.recover import search_tokens

#: A toy vocabulary with a merge ("ab") and two special tokens that decode to nothing.
PIECES = {0: "", 1: "a", 2: "b", 3: "ab", 4: "c", 5: ""}
END, SPECIAL = 0, 5


def _decode(ids):
    return "".join(PIECES[i] for i in ids)


def _encode(text):
    """Longest match first, as a tokenizer with the merge would split."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("ab", i):
            out.append(3)
            i += 2
        else:
            out.append({"a": 1, "b": 2, "c": 4}[text[i]])
            i += 1
    return out


class ToyModel:
    """Log-probs that depend on the whole prefix (a seeded draw per prefix); counts its passes."""

    def __init__(self):
        self.calls = 0

    def row(self, prefix):
        """Return the log-probs of the token after ``prefix``."""
        z = 2.0 * np.random.default_rng([*prefix, 99]).standard_normal(len(PIECES))
        return z - np.log(np.sum(np.exp(z)))

    def __call__(self, ids, start):
        """Return the rows after ``ids[:start]``, ..., ``ids`` (one teacher-forced pass)."""
        self.calls += 1
        return np.array([self.row(ids[:j]) for j in range(start, len(ids) + 1)])


def _sampled(model, tokens):
    return [model.row(tokens[:t])[tok] for t, tok in enumerate(tokens)]


def _search(model, text, old, finished, window=32):
    return search_tokens(model, _encode, _decode, text, old, finished=finished, end_ids=[END], window=window)


def test_search_finds_a_split_the_tokenizer_would_not_make():
    """Sampled a, b, <special>, c, <end> give 'abc', which encodes as ab, c: the search finds the sample."""
    model = ToyModel()
    tokens = [1, 2, SPECIAL, 4, END]
    assert _encode(_decode(tokens)) == [3, 4]
    old = _sampled(model, tokens)
    assert _search(model, "abc", old, True) == tokens
    # one teacher-forced pass per round: the first, then one per split the tokenizer would not make
    assert model.calls == 3


def test_a_canonical_response_takes_one_pass_per_window():
    """Ids the tokenizer would give back are confirmed in one pass per ``window`` ids."""
    model = ToyModel()
    tokens = [3, 1]
    assert _search(model, "aba", _sampled(model, tokens), False) == tokens
    assert model.calls == 1
    model = ToyModel()
    tokens = [3, 4, 3, 4, 1, END]
    assert _search(model, "abcabca", _sampled(model, tokens), True, window=2) == tokens
    assert model.calls == 3


def test_log_probs_that_match_no_token_give_none():
    """A log-prob 0.01 away from every candidate (beyond tol = 1e-4) leaves the response unrecovered."""
    model = ToyModel()
    tokens = [1, 2, SPECIAL, 4, END]
    old = _sampled(model, tokens)
    old[1] += 0.01
    assert _search(model, "abc", old, True) is None
    assert _search(model, "abcc", _sampled(model, tokens), True) is None  # text the ids cannot give


lm = pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")

from variance_lab.experiment.files import sidecar_path  # noqa: E402
from variance_lab.lm.model import load_model  # noqa: E402
from variance_lab.lm.recover import add_entropy  # noqa: E402
from variance_lab.lm.runs import default_name, run_lm_experiment  # noqa: E402
from variance_lab.lm.settings import LMSettings  # noqa: E402
from variance_lab.lm.tiny import write_tiny_llama  # noqa: E402

TINY = LMSettings(n_prompts=4, group_size=2, max_new_tokens=12, train_prompts=2, max_words=4, threads=1)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Return the tiny model, its tokenizer and its description."""
    model, tok = load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=3))
    return model, tok, {"name": "tiny random Llama"}


def _read(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def _write(path, records):
    with gzip.open(path, "wt") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


@pytest.mark.parametrize("changes", [{"run": "mismatch", "sampler": "bf16"}, {"run": "stale"}])
def test_added_entropy_equals_the_entropy_recorded_by_the_run(loaded, tmp_path, changes):
    """Strip a run's recorded entropy, add it back from the text: the same to the written digits."""
    settings = LMSettings(**{**TINY.to_dict(), **changes})
    out = tmp_path / default_name(settings)
    side = run_lm_experiment(settings, out, loaded=loaded)
    records = _read(out)
    recorded = [r.pop("entropy") for r in records]
    _write(out, records)
    new = add_entropy(out, loaded=loaded[:2])
    again = _read(out)
    for r, h, before in zip(again, recorded, records, strict=True):
        # 7 significant digits of numbers below log(259) = 5.6: two roundings differ by <= 1e-6
        np.testing.assert_allclose(r["entropy"], h, atol=1e-6, rtol=0)
        assert {k: v for k, v in r.items() if k != "entropy"} == before
    counts = new["entropy_recovery"]
    assert counts["not found"] == 0
    assert counts["encoded"] + counts["searched"] == len(records)
    # the random model samples special tokens and cut UTF-8 bytes that the text cannot give back
    assert counts["searched"] > 0
    assert new["numbers_sha256"] == side["numbers_sha256"]
    assert "entropy" in new["fields"]


def test_a_response_that_no_ids_give_keeps_no_entropy(loaded, tmp_path):
    """A record whose log-probs were changed is counted 'not found' and gets no entropy; the rest do."""
    settings = LMSettings(**{**TINY.to_dict(), "run": "mismatch"})
    out = tmp_path / default_name(settings)
    run_lm_experiment(settings, out, loaded=loaded)
    records = _read(out)
    for r in records:
        r.pop("entropy")
    records[0]["old_logp"][0] -= 0.5
    _write(out, records)
    side = json.loads(sidecar_path(out).read_text())
    side.pop("numbers_sha256")
    sidecar_path(out).write_text(json.dumps(side))
    new = add_entropy(out, loaded=loaded[:2])
    assert new["entropy_recovery"]["not found"] == 1
    again = _read(out)
    assert "entropy" not in again[0]
    assert all("entropy" in r for r in again[1:])


def test_bad_files_are_named_and_left_as_they_were(loaded, tmp_path):
    """No sidecar, another sidecar kind, prompts the settings do not give: a ValueError, nothing written."""
    settings = LMSettings(**{**TINY.to_dict(), "run": "mismatch"})
    out = tmp_path / default_name(settings)
    run_lm_experiment(settings, out, loaded=loaded)
    records = _read(out)
    records[2]["prompt"] = "something else"
    _write(out, records)
    before = out.read_bytes()
    with pytest.raises(ValueError, match="record 3's prompt is not its settings'"):
        add_entropy(out, loaded=loaded[:2])
    assert out.read_bytes() == before
    bare = tmp_path / "bare.jsonl.gz"
    _write(bare, records)
    with pytest.raises(ValueError, match=r"has no sidecar 'bare\.json'"):
        add_entropy(bare, loaded=loaded[:2])
    sidecar_path(bare).write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read the sidecar .*bare\.json"):
        add_entropy(bare, loaded=loaded[:2])
    sidecar_path(bare).write_text(json.dumps({"kind": "variance_lab experiment"}))
    with pytest.raises(ValueError, match="not a sidecar of a language-model run"):
        add_entropy(bare, loaded=loaded[:2])
    with pytest.raises(ValueError, match=r"tol must be a finite number > 0, got 0\.0"):
        add_entropy(out, loaded=loaded[:2], tol=0.0)


def test_the_cached_forward_equals_a_full_pass(loaded):
    """Log-probs from the cut-back key-value cache equal a fresh forward pass's, after a change of guess."""
    import torch

    from variance_lab.lm.recover import _Forward
    from variance_lab.lm.task import chat_prompts

    model, tok, _ = loaded
    prompt = chat_prompts(tok, ["Copy these words: apple river"])[0]
    g = torch.Generator().manual_seed(1)
    first, second = (torch.randint(3, len(tok), (9,), generator=g).tolist() for _ in range(2))
    second = first[:4] + second[4:]
    forward = _Forward(model, prompt)

    def full(ids, start):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].double()
        return logits.log_softmax(-1).numpy()[len(prompt) - 1 + start :]

    for ids, start in ((first, 0), (second, 4), (second[:6], 2), (second, 9)):
        np.testing.assert_allclose(forward(ids, start), full(ids, start), atol=1e-5)
