"""The tiny Llama as a GGUF file: transformers' GGUF loader gives back the model-folder twin."""

import sys

import numpy as np
import pytest

pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")
pytest.importorskip("gguf", reason="pip install 'variance_lab[lm]'")

import torch

from variance_lab.lm import tiny_gguf
from variance_lab.lm.model import load_model
from variance_lab.lm.scoring import score
from variance_lab.lm.tiny import write_tiny_llama
from variance_lab.lm.tiny_gguf import rope_permute, write_tiny_gguf

SEED = 3
TEXTS = ["Hello world", " 12 + 7 = 19\n", "<|im_start|>user\nhé ü 日本 👍<|im_end|>", "a  b\t\tc"]
CONVERSATION = [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 4 + 4?"},
]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Write the model folder and the GGUF file from one seed; load each with load_model."""
    folder = write_tiny_llama(tmp_path_factory.mktemp("hf"), seed=SEED)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf"), seed=SEED)
    return load_model(folder), load_model(path.parent, gguf_file=path.name)


def _sequences(tok):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def _logits(model, seqs):
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).logits[0].numpy() for s in seqs]


def test_write_returns_the_file(tmp_path):
    """The file is where the function says, named as asked, and starts with GGUF's magic."""
    path = write_tiny_gguf(tmp_path / "new", name="x.gguf")
    assert path == tmp_path / "new" / "x.gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_rope_permute_moves_rows_to_llama_cpp_order():
    """Within each head of d rows, row j*d/2 + i moves to row 2i + j (halves -> adjacent pairs)."""
    heads, d = 3, 6
    w = np.arange(heads * d, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    out = rope_permute(w, heads)
    for h in range(heads):
        for j in range(2):
            for i in range(d // 2):
                assert out[h * d + 2 * i + j, 0] == h * d + j * d // 2 + i
    assert np.array_equal(out[:, 0], out[:, 1])


def test_rope_permute_refuses_odd_heads():
    """Rows that do not split into heads of an even size are an error naming the head count."""
    with pytest.raises(ValueError, match="heads=4"):
        rope_permute(np.zeros((12, 2), np.float32), 4)


def test_tensor_names_are_gguf_constants():
    """The name table agrees with gguf's own list of llama.cpp tensor names."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    ours = {
        k: v.removesuffix(".weight").replace("{}", "{bid}") for k, v in tiny_gguf.GGUF_TENSOR_NAMES.items()
    }
    assert ours == {
        "model.embed_tokens.weight": TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD],
        "model.norm.weight": TENSOR_NAMES[MODEL_TENSOR.OUTPUT_NORM],
        "lm_head.weight": TENSOR_NAMES[MODEL_TENSOR.OUTPUT],
        "input_layernorm.weight": TENSOR_NAMES[MODEL_TENSOR.ATTN_NORM],
        "self_attn.q_proj.weight": TENSOR_NAMES[MODEL_TENSOR.ATTN_Q],
        "self_attn.k_proj.weight": TENSOR_NAMES[MODEL_TENSOR.ATTN_K],
        "self_attn.v_proj.weight": TENSOR_NAMES[MODEL_TENSOR.ATTN_V],
        "self_attn.o_proj.weight": TENSOR_NAMES[MODEL_TENSOR.ATTN_OUT],
        "post_attention_layernorm.weight": TENSOR_NAMES[MODEL_TENSOR.FFN_NORM],
        "mlp.gate_proj.weight": TENSOR_NAMES[MODEL_TENSOR.FFN_GATE],
        "mlp.up_proj.weight": TENSOR_NAMES[MODEL_TENSOR.FFN_UP],
        "mlp.down_proj.weight": TENSOR_NAMES[MODEL_TENSOR.FFN_DOWN],
    }


def test_missing_gguf_names_the_install(tmp_path, monkeypatch):
    """Without the gguf package the error says what to install, and no file is written."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match=r"pip install 'variance_lab\[lm\]'"):
        write_tiny_gguf(tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_config_matches(twins):
    """Sizes, special ids, tying and RoPE read from the file's metadata equal the folder's config.json."""
    (hf, _), (gg, _) = twins
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(gg.config, key) == getattr(hf.config, key), key
    assert gg.config.rope_parameters["rope_theta"] == hf.config.rope_parameters["rope_theta"]
    # GGUF stores the epsilon as float32: 1e-6 comes back as 9.99999997e-7
    assert gg.config.rms_norm_eps == pytest.approx(hf.config.rms_norm_eps, rel=1e-7)
    assert gg.lm_head.weight.data_ptr() == gg.model.embed_tokens.weight.data_ptr()  # tied


def test_weights_come_back_unpermuted(twins):
    """float32 tensors under llama.cpp's names, q/k permuted and un-permuted: the same parameters."""
    (hf, _), (gg, _) = twins
    a, b = hf.state_dict(), gg.state_dict()
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_tokenizer_and_chat_template_match(twins):
    """The tokenizer rebuilt from the file tokenizes and applies the chat template as the folder's."""
    (_, th), (_, tg) = twins
    assert (tg.bos_token, tg.eos_token, tg.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert tg.chat_template == th.chat_template
    for text in TEXTS:
        ids = th(text, add_special_tokens=False)["input_ids"]
        assert tg(text, add_special_tokens=False)["input_ids"] == ids, text
        assert tg(text)["input_ids"] == th(text)["input_ids"] == ids, text  # neither adds a BOS
        assert tg.decode(ids) == text
    kw = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    prompt = th.apply_chat_template(CONVERSATION, **kw)
    assert tg.apply_chat_template(CONVERSATION, **kw) == prompt
    assert prompt[0] == th.convert_tokens_to_ids("<|im_start|>")
    assert th.decode(prompt).endswith("<|im_start|>assistant\n")


def test_logits_and_scores_match(twins):
    """Logits and teacher-forced log-probs of the two loads agree to float32 rounding.

    The weights come back bit for bit (test above); the one difference is the RMS-norm epsilon,
    stored as float32 (relative change 3e-9), which may move the float32 logits (|z| up to 31
    here, where a float32 step is 4e-6) by a few steps; measured 0 for logits and log-probs.
    1e-5 allows that and is far below what a wrong row order gives (9.1 with no permutation,
    20.4 with the key permuted as the query).
    """
    (hf, th), (gg, _) = twins
    seqs = _sequences(th)
    for a, b in zip(_logits(hf, seqs), _logits(gg, seqs), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    prompt = th.apply_chat_template(
        CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    prompts, responses = [prompt] * len(seqs), seqs
    lp_hf = score(hf, prompts, responses, batch_size=2)
    lp_gg = score(gg, prompts, responses, batch_size=2)
    for a, b in zip(lp_hf, lp_gg, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_unpermuted_file_gives_other_logits(twins, tmp_path, monkeypatch):
    """Without llama.cpp's row order the loader scrambles q and k: the comparison above has power."""
    (hf, th), _ = twins
    monkeypatch.setattr(tiny_gguf, "rope_permute", lambda w, heads: w)
    path = write_tiny_gguf(tmp_path, seed=SEED)
    wrong, _ = load_model(path.parent, gguf_file=path.name)
    seqs = _sequences(th)
    diff = max(np.abs(a - b).max() for a, b in zip(_logits(hf, seqs), _logits(wrong, seqs), strict=True))
    assert diff > 1e-2
