"""Record TRL GRPO batches with variance_lab, then analyse the file (runs without TRL: a stand-in batch).

In a real run, the ``CaptureLogProbs`` mixin records the dict that
``GRPOTrainer._generate_and_score_completions`` returns; here a dict of NumPy arrays of the
same keys and shapes stands in for it, passed to ``record_trl_batch`` with what the mixin adds:
each row's prompt (TRL's groups of ``num_generations`` consecutive rows) and the step TRL logs.
Run: ``python docs/examples/capture_trl.py OUT_DIR``.
"""

import sys
from pathlib import Path

import numpy as np

from variance_lab.integrations.recorder import ParquetRecorder
from variance_lab.integrations.trl import record_trl_batch, trl_prompt_ids
from variance_lab.rollouts.io import load_batch

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rng = np.random.default_rng(0)
B, C, G = 8, 24, 4  # completions per batch, completion length (padded), num_generations

with ParquetRecorder(out / "trl_logprobs.parquet") as recorder:
    for global_step in range(3):
        old = -rng.exponential(0.7, size=(B, C))  # old_per_token_logps: the trainer's pi_old
        batch = {
            "completion_mask": (np.arange(C) < rng.integers(2, C + 1, size=B)[:, None]).astype(np.int64),
            "advantages": rng.normal(size=B),  # one per completion
            "old_per_token_logps": old,
            "sampling_per_token_logps": np.minimum(old + rng.normal(0.0, 0.05, size=(B, C)), 0.0),  # vLLM's
        }
        prompts = trl_prompt_ids(B, G, generation=global_step)  # "0-0" x 4, "0-1" x 4, ...
        record_trl_batch(recorder, batch, step=global_step + 1, prompt_id=prompts)  # as TRL logs it

tokens = load_batch(out / "trl_logprobs.parquet")
print(f"{len(tokens)} sequences, {tokens.n_tokens} tokens")  # 6 prompts of 4 completions
print(f"mean mismatch log-ratio log(pi_old / mu_rollout): {tokens.mismatch_log_ratio.mean():+.4f}")
