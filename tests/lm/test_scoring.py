"""Teacher-forced scoring and 16-bit copies on a tiny random Llama (the SmolLM2 code path)."""

import numpy as np
import pytest

pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")
import torch

from variance_lab.lm.model import load_model
from variance_lab.lm.precision import low_precision_copy, native_support
from variance_lab.lm.scoring import response_log_probs, score
from variance_lab.lm.task import chat_prompts
from variance_lab.lm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Return the tiny model, its tokenizer, three chat prompts and random responses."""
    model, tok = load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny")))
    prompts = chat_prompts(tok, ["What is 2 + 3?", "Copy these words: apple river", "hi"])
    g = torch.Generator().manual_seed(5)
    responses = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in (7, 1, 12)]
    return model, tok, prompts, responses


def _reference(model, prompt, response, temperature=1.0):
    """Sequence log-prob from the full model's logits, one sequence, float64 log-softmax."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    lp = logits.log_softmax(-1)
    return sum(float(lp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(response))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_log_probs_sum_to_the_sequence_log_prob(tiny, temperature):
    """Token log probs sum to the sequence log prob."""
    model, _, prompts, responses = tiny
    got = score(model, prompts, responses, batch_size=2, temperature=temperature)
    for lp, p, r in zip(got, prompts, responses, strict=True):
        assert lp.shape == (len(r),)
        assert np.all(lp <= 0)
        np.testing.assert_allclose(lp.sum(), _reference(model, p, r, temperature), rtol=1e-6)


def test_entropy_matches_scipy_on_the_full_logits(tiny):
    """H_t from score(entropy=True) is scipy's entropy of the softmax of the full model's logits."""
    from scipy.stats import entropy

    model, _, prompts, responses = tiny
    lp, h = score(model, prompts, responses, batch_size=2, entropy=True)
    plain = score(model, prompts, responses, batch_size=2)
    for lpi, hi, pi, p, r in zip(lp, h, plain, prompts, responses, strict=True):
        np.testing.assert_array_equal(lpi, pi)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0].double().numpy()
        rows = logits[len(p) - 1 : len(p) + len(r) - 1]
        probs = np.exp(rows - rows.max(-1, keepdims=True))
        expected = entropy(probs / probs.sum(-1, keepdims=True), axis=-1)
        np.testing.assert_allclose(hi, expected, rtol=1e-5)
        assert np.all((hi > 0) & (hi <= np.log(logits.shape[-1]) + 1e-9))


def test_batching_does_not_change_scores(tiny):
    """Batching does not change scores."""
    model, _, prompts, responses = tiny
    one = score(model, prompts, responses, batch_size=1)
    three = score(model, prompts, responses, batch_size=3)
    for a, b in zip(one, three, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scores_are_differentiable(tiny):
    """Scores are differentiable."""
    model, _, prompts, responses = tiny
    lp = response_log_probs(model, prompts[:1], responses[:1])
    lp[0].sum().backward()
    grad = model.get_input_embeddings().weight.grad
    assert grad is not None
    assert torch.count_nonzero(grad) > 0
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("mode", ["native", "emulated"])
def test_16_bit_scores_differ_a_little(tiny, precision, mode):
    """16-bit scores differ a little."""
    model, _, prompts, responses = tiny
    low, how = low_precision_copy(model, precision, mode)
    assert how == mode
    assert next(model.parameters()).dtype == torch.float32  # the original is untouched
    ref = np.concatenate(score(model, prompts, responses))
    got = np.concatenate(score(low, prompts, responses, softmax_dtype=torch.float32))
    diff = np.abs(got - ref)
    # bf16 keeps 8 significant bits (relative step 2^-8), fp16 11: differences of that order
    # of the logits' size, never zero across 20 tokens
    scale = 2.0**-8 if precision == "bf16" else 2.0**-11
    assert diff.max() > 0
    assert diff.max() < 50 * scale * (1 + np.abs(ref).max())


def test_bf16_differs_more_than_fp16(tiny):
    """Bf16 differs more than fp16."""
    model, _, prompts, responses = tiny
    ref = np.concatenate(score(model, prompts, responses))
    err = {}
    for precision in ("bf16", "fp16"):
        low, _ = low_precision_copy(model, precision, "native")
        err[precision] = np.abs(np.concatenate(score(low, prompts, responses)) - ref).mean()
    assert err["bf16"] > err["fp16"]


def test_auto_mode_follows_native_support(tiny):
    """Auto mode follows native support."""
    model = tiny[0]
    for precision in ("bf16", "fp16"):
        _, how = low_precision_copy(model, precision)
        assert how == ("native" if native_support(precision) else "emulated")
    assert low_precision_copy(model, "fp32")[1] == "native"


def test_bad_input_is_named(tiny):
    """Bad input is named."""
    model, _, prompts, responses = tiny
    with pytest.raises(ValueError, match="precision"):
        low_precision_copy(model, "int8")
    with pytest.raises(ValueError, match="mode"):
        low_precision_copy(model, "bf16", "fast")
    with pytest.raises(ValueError, match="2 prompts but 3"):
        score(model, prompts[:2], responses)
    with pytest.raises(ValueError, match="at least one token"):
        score(model, prompts[:1], [[]])
    with pytest.raises(ValueError, match="temperature"):
        score(model, prompts, responses, temperature=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        score(model, prompts, responses, batch_size=0)
