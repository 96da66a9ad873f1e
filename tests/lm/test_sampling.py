"""Sampling: top-k/top-p processing, the sampler's own log-probs, determinism."""

import numpy as np
import pytest

pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")
import torch

from variance_lab.lm.model import load_model
from variance_lab.lm.sampling import process_logits, sample
from variance_lab.lm.scoring import score
from variance_lab.lm.task import chat_prompts
from variance_lab.lm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Return the tiny model, its tokenizer and nine chat prompts."""
    model, tok = load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=1))
    prompts = chat_prompts(tok, ["What is 2 + 3?", "Copy these words: apple river", "hi"]) * 3
    return model, tok, prompts


def _logits(seed=0, n=4, v=60):
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (10, 1.0), (10, 0.6), (0, 1.0)])
def test_processed_log_probs_renormalise_over_the_kept_set(top_k, top_p):
    """Processed log probs renormalise over the kept set."""
    z = _logits()
    lp = z.log_softmax(-1)
    processed, log_kept = process_logits(z, top_k=top_k, top_p=top_p)
    kept = torch.isfinite(processed)
    # sum to 1 over the kept set
    np.testing.assert_allclose(processed.logsumexp(-1).numpy(), 0.0, atol=1e-12)
    # equal logp - log(kept mass) there, with the kept mass summed independently
    mass = torch.where(kept, lp.exp(), 0.0).sum(-1)
    np.testing.assert_allclose(log_kept.numpy(), mass.log().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        processed[kept].numpy(), (lp - mass.log().unsqueeze(-1))[kept].numpy(), rtol=1e-12
    )
    if top_k:
        assert (kept.sum(-1) <= top_k).all()
    if top_p < 1 or top_k:
        assert (log_kept < 0).all()
    else:
        assert kept.all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    """Top p keeps the smallest set reaching p."""
    z = _logits(seed=2)
    processed, _ = process_logits(z, top_p=0.8)
    q = z.softmax(-1)
    for row in range(z.shape[0]):
        order = q[row].argsort(descending=True)
        cum = q[row][order].cumsum(0)
        need = int((cum < 0.8).sum()) + 1  # first index where the cumulative mass reaches 0.8
        kept = torch.isfinite(processed[row])
        assert int(kept.sum()) == need
        assert kept[order[:need]].all()


def test_temperature_scales_the_logits():
    """Temperature scales the logits."""
    z = _logits(seed=3)
    processed, log_kept = process_logits(z, temperature=0.5)
    np.testing.assert_allclose(processed.numpy(), (2 * z).log_softmax(-1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(log_kept.numpy(), 0.0, atol=1e-12)


def test_sampler_log_probs_match_teacher_forced_scores(tiny):
    """Sampler log probs match teacher forced scores."""
    model, tok, prompts = tiny
    s = sample(
        model,
        prompts,
        max_new_tokens=24,
        generator=torch.Generator().manual_seed(0),
        eos_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id,
        batch_size=4,
    )
    lengths = [len(t) for t in s.tokens]
    assert min(lengths) < 24
    assert max(lengths) == 24
    for t, f in zip(s.tokens, s.finished, strict=True):
        assert f == (t[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in t[:-1]
    teacher = score(model, prompts, s.tokens)
    for a, b in zip(s.logp, teacher, strict=True):
        # the sampler's float32 log-softmax with a key-value cache against float64 teacher forcing
        np.testing.assert_allclose(a, b, atol=2e-5)
    for k in s.log_kept_mass:
        np.testing.assert_array_equal(k, 0.0)


def test_top_p_sampler_records_the_renormalised_log_probs(tiny):
    """Top p sampler records the renormalised log probs."""
    model, tok, prompts = tiny
    s = sample(
        model,
        prompts,
        max_new_tokens=16,
        generator=torch.Generator().manual_seed(1),
        eos_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id,
        top_p=0.9,
        top_k=50,
    )
    teacher = score(model, prompts, s.tokens)
    for roll, kept, full in zip(s.logp, s.log_kept_mass, teacher, strict=True):
        assert np.all(kept < 0)
        np.testing.assert_allclose(roll, full - kept, atol=2e-5)


def test_sampling_is_deterministic_and_batch_independent_in_length(tiny):
    """Sampling is deterministic and batch independent in length."""
    model, tok, prompts = tiny

    def run(bs):
        return sample(
            model,
            prompts,
            max_new_tokens=10,
            generator=torch.Generator().manual_seed(7),
            eos_ids=[tok.eos_token_id],
            pad_id=tok.pad_token_id,
            batch_size=bs,
        )

    a, b = run(4), run(4)
    assert a.tokens == b.tokens
    assert len(run(9).tokens) == len(prompts)


def test_bad_options_are_named(tiny):
    """Bad options are named."""
    model, _tok, prompts = tiny
    with pytest.raises(ValueError, match="top_p"):
        process_logits(_logits(), top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        process_logits(_logits(), top_k=-1)
    with pytest.raises(ValueError, match="temperature"):
        process_logits(_logits(), temperature=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sample(model, prompts, max_new_tokens=0, generator=torch.Generator(), eos_ids=[2])
