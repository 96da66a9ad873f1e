"""The tiny random Llama of :mod:`variance_lab.lm.tiny` as a GGUF file: transformers' GGUF loader in seconds.

:func:`write_tiny_gguf` writes the model of :func:`~variance_lab.lm.tiny.write_tiny_llama` (same
seed, same weights) with ``gguf.GGUFWriter`` the way llama.cpp's converter writes SmolLM2:
float32 tensors under llama.cpp's names, the query and key rows in llama.cpp's rotary order,
the byte-level BPE tokenizer and the chat template as metadata. Loading it with
:func:`~variance_lab.lm.model.load_model` ``(folder, gguf_file=...)`` runs the code path that
loads SmolLM2-135M-Instruct's GGUF file (dequantization, the inverse permutation, the tokenizer
and chat template read from the file) without the 98 MB model; the tests compare it with the
folder :func:`~variance_lab.lm.tiny.write_tiny_llama` writes.

Needs ``gguf`` (``pip install 'variance_lab[lm]'``; also in the ``dev`` extra).
"""

from __future__ import annotations

from pathlib import Path

import torch

from variance_lab.lm.model import LM_EXTRA_HINT
from variance_lab.lm.tiny import SPECIAL_TOKENS, tiny_model

__all__ = ["GGUF_TENSOR_NAMES", "rope_permute", "write_tiny_gguf"]


#: llama.cpp's tensor names (``gguf.constants.TENSOR_NAMES``) for a Llama's parameters; ``{}`` the block.
GGUF_TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "blk.{}.attn_norm.weight",
    "self_attn.q_proj.weight": "blk.{}.attn_q.weight",
    "self_attn.k_proj.weight": "blk.{}.attn_k.weight",
    "self_attn.v_proj.weight": "blk.{}.attn_v.weight",
    "self_attn.o_proj.weight": "blk.{}.attn_output.weight",
    "post_attention_layernorm.weight": "blk.{}.ffn_norm.weight",
    "mlp.gate_proj.weight": "blk.{}.ffn_gate.weight",
    "mlp.up_proj.weight": "blk.{}.ffn_up.weight",
    "mlp.down_proj.weight": "blk.{}.ffn_down.weight",
}


def rope_permute(weight, heads: int):
    r"""Reorder a query or key projection's rows from Hugging Face's rotary layout to llama.cpp's.

    Hugging Face rotates the two halves of each head's :math:`d` rows (row :math:`i` pairs
    with row :math:`i + d/2`); llama.cpp rotates adjacent rows (:math:`2i` with :math:`2i+1`).
    Within each head, row :math:`h d + j d/2 + i` (:math:`j \in \{0, 1\}`, :math:`i < d/2`) moves
    to row :math:`h d + 2i + j`: llama.cpp's ``convert_hf_to_gguf.py`` ``LlamaModel.permute``,
    which transformers' GGUF loader undoes.

    Parameters
    ----------
    weight : numpy.ndarray
        ``(heads * d, in_features)``.
    heads : int
        Query heads for the query, key-value heads for the key.

    Returns
    -------
    numpy.ndarray
        Same shape.

    Raises
    ------
    ValueError
        When the rows do not split into ``heads`` heads of an even size.
    """
    rows = weight.shape[0]
    if heads < 1 or rows % (2 * heads):
        raise ValueError(f"{rows} rows do not split into heads={heads!r} heads of an even size")
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_gguf(
    folder,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    layers: int = 2,
    eos_scale: float = 3.0,
    name: str = "tiny-llama.gguf",
):
    """Write the Llama of :func:`~variance_lab.lm.tiny.write_tiny_llama` (same arguments and weights) as GGUF.

    The file holds what llama.cpp's converter writes for SmolLM2: ``llama`` architecture
    metadata, the tensors under :data:`GGUF_TENSOR_NAMES` (no ``output.weight``: the head is
    tied) with the query and key rows in llama.cpp's order (:func:`rope_permute`), and the
    ``gpt2`` (byte-level BPE) tokenizer: tokens, token types (the three chat tokens
    ``CONTROL``), the special token ids and the chat template. The tokenizer has no merges, and
    ``GGUFWriter`` drops an empty array, so the file holds zero scores instead: from those
    transformers derives the merges the vocabulary implies (none, all tokens but the chat
    tokens being single characters). The tensors are float32. Loading it with
    :func:`~variance_lab.lm.model.load_model` ``(folder, gguf_file=name)`` runs transformers'
    GGUF path (dequantization, un-permutation, tokenizer from metadata) as for SmolLM2.

    Parameters
    ----------
    folder : str or Path
        Created if missing.
    seed, hidden_size, layers, eos_scale
        As in :func:`~variance_lab.lm.tiny.write_tiny_llama`.
    name : str, optional
        The file's name inside ``folder``.

    Returns
    -------
    Path
        The GGUF file.

    Raises
    ------
    ImportError
        When the ``gguf`` package is missing.
    """
    try:
        import gguf
    except ImportError as exc:
        raise ImportError(f"write_tiny_gguf needs the gguf package: {LM_EXTRA_HINT}") from exc

    model, tokenizer = tiny_model(seed=seed, hidden_size=hidden_size, layers=layers, eos_scale=eos_scale)
    cfg = model.config
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    control = {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(
        [gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(tokenizer.chat_template)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().to(torch.float32).numpy()
        parts = key.split(".")
        if parts[:2] == ["model", "layers"]:
            block, key = parts[2], ".".join(parts[3:])
            if key == "self_attn.q_proj.weight":
                data = rope_permute(data, cfg.num_attention_heads)
            elif key == "self_attn.k_proj.weight":
                data = rope_permute(data, cfg.num_key_value_heads)
            w.add_tensor(GGUF_TENSOR_NAMES[key].format(block), data)
        else:
            w.add_tensor(GGUF_TENSOR_NAMES[key], data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
