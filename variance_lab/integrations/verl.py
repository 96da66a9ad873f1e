r"""Capture verl's token log-probs into a Parquet file that ``load_batch`` reads.

verl keeps the batch's log-probabilities in memory only (a ``DataProto`` whose ``.batch`` is a
TensorDict). In ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py`` at commit b178a3cd,
verl 0.8.0.dev; the same names in verl 0.9.1, whose rollout correction
:mod:`variance_lab.frameworks.verl` mirrors), after the old log-probs and the advantages are
computed, ``batch.batch`` holds

=======================  ==========  ===============================================
key                      shape       here
=======================  ==========  ===============================================
``old_log_probs``        ``(B, R)``  ``logp`` and ``old_logp`` (pi_old, the actor's)
``rollout_log_probs``    ``(B, R)``  ``rollout_logp`` (the rollout engine's; present when
                                     ``actor_rollout_ref.rollout.calculate_log_probs=True``)
``response_mask``        ``(B, R)``  ``mask``
``advantages``           ``(B, R)``  ``advantages``
=======================  ==========  ===============================================

and ``batch.non_tensor_batch["uid"]`` names each response's prompt (GRPO groups by it): it
is written as ``prompt_id``, so the analysis resamples prompts, not responses.

Call :func:`record_verl_batch` from the trainer loop, right after
``batch = compute_advantage(batch, ...)`` in ``fit``::

    from variance_lab.integrations.recorder import ParquetRecorder
    from variance_lab.integrations.verl import record_verl_batch

    recorder = ParquetRecorder("verl_logprobs.parquet")   # once, before the loop
    ...
    record_verl_batch(recorder, batch, step=self.global_steps)   # in the loop
    ...
    recorder.close()                                       # after the loop

``batch`` may be the ``DataProto`` or any mapping of those keys (tensors or arrays).
"""

from __future__ import annotations

from collections.abc import Mapping

from variance_lab.integrations.recorder import ParquetRecorder

__all__ = ["record_verl_batch"]


def record_verl_batch(recorder: ParquetRecorder, batch, step: int) -> int:
    """Append one verl batch to ``recorder``.

    Parameters
    ----------
    recorder : ParquetRecorder
    batch : DataProto or mapping
        A ``DataProto`` (its ``.batch`` is read) or a mapping with ``old_log_probs`` and
        ``response_mask`` of shape ``(B, R)``, optional ``rollout_log_probs`` and
        ``advantages`` ``(B, R)``.
    step : int
        The trainer's ``global_steps``.

    Returns
    -------
    int
        As :meth:`ParquetRecorder.append`: the rows now in the file.

    Raises
    ------
    ValueError
        Neither a ``DataProto`` nor a mapping, a missing ``old_log_probs`` or ``response_mask``, or
        the errors of :meth:`ParquetRecorder.append` (shapes that disagree); nothing is appended.
    """
    tensors = getattr(batch, "batch", batch)
    if not isinstance(tensors, Mapping) and not hasattr(tensors, "keys"):
        raise ValueError(f"{recorder.path.name}: step {step}: expected a DataProto or a mapping of tensors")
    keys = set(tensors.keys())
    for key in ("old_log_probs", "response_mask"):
        if key not in keys:
            raise ValueError(
                f"{recorder.path.name}: step {step}: the verl batch has no {key!r} (keys: {sorted(keys)})"
            )
    non_tensor = getattr(batch, "non_tensor_batch", batch)
    uid = non_tensor.get("uid") if isinstance(non_tensor, Mapping) else None
    return recorder.append(
        old_logp=tensors["old_log_probs"],
        mask=tensors["response_mask"],
        rollout_logp=tensors["rollout_log_probs"] if "rollout_log_probs" in keys else None,
        advantages=tensors["advantages"] if "advantages" in keys else None,
        step=step,
        prompt_id=uid,
    )
