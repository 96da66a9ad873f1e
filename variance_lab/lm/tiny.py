"""A tiny random Llama with a byte-level tokenizer and a chat template: the runs' code path in seconds.

:func:`write_tiny_llama` writes a model folder (``config.json``, weights, tokenizer with
SmolLM2's ``<|im_start|>``/``<|im_end|>`` chat format) that :func:`~variance_lab.lm.model.load_model`
loads exactly as it loads SmolLM2; the tests and ``variance-lab experiment run --model tiny``
use it to run everything without the 98 MB model (:mod:`variance_lab.lm.tiny_gguf` writes the
same model as a GGUF file). Its weights are random (drawn from a
:class:`torch.Generator`), so its answers are noise: the task's rewards are all 0 and
advantages 0 unless a response happens to match.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tiny_model", "write_tiny_llama"]

#: ChatML, as SmolLM2-Instruct's template (without its default system message).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: End of text (padding), start and end of a chat turn; ids 0, 1, 2.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *alphabet])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(*, seed: int = 0, hidden_size: int = 32, layers: int = 2, eos_scale: float = 3.0):
    """Build the tiny random Llama and its tokenizer in memory (:func:`write_tiny_llama` saves them).

    Parameters
    ----------
    seed, hidden_size, layers, eos_scale
        As in :func:`write_tiny_llama`.

    Returns
    -------
    (transformers.LlamaForCausalLM, transformers.PreTrainedTokenizerFast)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # construction draws from the global generator: restore it
        model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            elif "embed" in name:
                p.normal_(0.0, 0.5, generator=g)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=g)
        model.get_input_embeddings().weight[tokenizer.eos_token_id] *= eos_scale
    return model, tokenizer


def write_tiny_llama(
    folder, *, seed: int = 0, hidden_size: int = 32, layers: int = 2, eos_scale: float = 3.0
):
    r"""Write a tiny random Llama and its tokenizer to ``folder``; return the folder.

    Parameters
    ----------
    folder : str or Path
        Created if missing.
    seed : int, optional
        Seeds the :class:`torch.Generator` that draws the weights (normal, sd 0.5 for the
        embedding, :math:`1/\sqrt{\text{fan-in}}` for the other matrices; norms 1).
    hidden_size, layers : int, optional
    eos_scale : float, optional
        The end token's (tied) embedding is multiplied by this, so responses end at varied
        lengths.

    Returns
    -------
    Path
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, tokenizer = tiny_model(seed=seed, hidden_size=hidden_size, layers=layers, eos_scale=eos_scale)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
