"""Record verl batches with variance_lab, then analyse the file (runs without verl: a stand-in batch).

In a real run, ``batch`` is the ``DataProto`` of ``RayPPOTrainer.fit`` right after
``compute_advantage``, and ``uncut_mask`` its ``response_mask`` taken at the top of the ``adv``
block, before verl's ``rollout_rs`` rejection cuts it; here a dict of NumPy arrays of the same keys
and shapes stands in for the batch, and the toolkit's mirror of verl's rejection for verl's.
Run: ``python docs/examples/capture_verl.py OUT_DIR``.
"""

import sys
from pathlib import Path

import numpy as np

from variance_lab.frameworks import verl
from variance_lab.integrations.recorder import ParquetRecorder
from variance_lab.integrations.verl import record_verl_batch
from variance_lab.rollouts.io import load_batch

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rng = np.random.default_rng(0)
B, R = 8, 32  # batch size, response length (padded)

recorder = ParquetRecorder(out / "verl_logprobs.parquet")  # once, before the training loop
for step in range(1, 4):  # the training loop
    old_log_probs = -rng.exponential(0.7, size=(B, R))  # the actor's pi_old
    rollout_log_probs = np.minimum(old_log_probs + rng.normal(0.0, 0.05, size=(B, R)), 0.0)  # vLLM's
    response_mask = (np.arange(R) < rng.integers(4, R + 1, size=B)[:, None]).astype(np.int64)
    batch = {
        "old_log_probs": old_log_probs,
        "rollout_log_probs": rollout_log_probs,
        "response_mask": response_mask,
        "advantages": rng.normal(size=(B, R)),
    }
    uncut_mask = batch["response_mask"].copy()  # in verl: .clone(), before the rollout correction
    _, batch["response_mask"], _ = verl.compute_rollout_correction_and_rejection_mask(  # verl's rollout_rs
        old_log_probs, rollout_log_probs, uncut_mask, rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"
    )
    record_verl_batch(recorder, batch, step=step, uncut_mask=uncut_mask)
recorder.close()  # after the loop: the file is complete

tokens = load_batch(out / "verl_logprobs.parquet")
print(f"{len(tokens)} sequences, {tokens.n_tokens} tokens")
print(f"mean mismatch log-ratio log(pi_old / mu_rollout): {tokens.mismatch_log_ratio.mean():+.4f}")
