r"""Capture verl's token log-probs into a Parquet file that ``load_batch`` reads.

verl keeps the batch's log-probabilities in memory only (a ``DataProto`` whose ``.batch`` is a
TensorDict). In ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py`` of verl 0.9.1, the
PyPI release, file sha256 ``eb41f99ccc66...``; the same names at commit b178a3cd, verl
0.8.0.dev), after the old log-probs and the advantages are computed, ``batch.batch`` holds

=======================  ==========  ===============================================
key                      shape       here
=======================  ==========  ===============================================
``old_log_probs``        ``(B, R)``  ``logp`` and ``old_logp`` (pi_old, the actor's)
``rollout_log_probs``    ``(B, R)``  ``rollout_logp`` (the rollout engine's; present when
                                     ``actor_rollout_ref.rollout.calculate_log_probs=True``)
``response_mask``        ``(B, R)``  ``rs_mask`` (after verl's rejection), see below
``advantages``           ``(B, R)``  ``advantages``
=======================  ==========  ===============================================

and ``batch.non_tensor_batch["uid"]`` names each response's prompt (GRPO groups by it): it
is written as ``prompt_id``, so the analysis resamples prompts, not responses.

The rejection cuts ``response_mask``. With ``algorithm.rollout_correction.rollout_rs`` set,
``compute_rollout_correction_and_add_to_batch`` (``verl/trainer/ppo/rollout_corr_helper.py`` of
verl 0.9.1, sha256 ``763158342551...``, lines 1013-1067) replaces the batch's mask by the
rejected one, ``batch.batch["response_mask"] = modified_response_mask`` (line 1061;
``modified_response_mask = response_mask * final_mask``, line 412). ``fit`` calls it in its
``adv`` block (``ray_trainer.py`` lines 1648-1660), just before ``compute_advantage`` (lines
1665-1673): from then on ``response_mask`` no longer holds the tokens the rejection dropped,
which are the tokens of the largest mismatch, and a capture of it understates the mismatch
(``token_k1`` at ``0.8_1.25`` on the batch of ``tests/integrations/test_integrations.py``, 48
sequences whose log-ratios are 15 times wider on 5 % of the tokens: 19 of 1,080 tokens rejected,
and the variance of log r falls from 4.79e-3 to 9.76e-4, 4.9 times too small). So take
the mask before the rejection, at the top of the ``adv`` block (``ray_trainer.py`` line 1631,
``with marked_timer("adv", ...)``; nothing else changes ``response_mask`` between line 1544, where
it is made, and line 1658), and record after ``compute_advantage``::

    from variance_lab.integrations.recorder import ParquetRecorder
    from variance_lab.integrations.verl import record_verl_batch

    recorder = ParquetRecorder("verl_logprobs.parquet")   # once, before the loop
    ...
    with marked_timer("adv", timing_raw, color="brown"):
        uncut_mask = batch.batch["response_mask"].clone()    # before rollout_rs cuts it
        ...                                                  # verl's code, unchanged
        batch = compute_advantage(batch, ...)
        record_verl_batch(recorder, batch, step=self.global_steps, uncut_mask=uncut_mask)
    ...
    recorder.close()                                       # after the loop

The file's ``mask`` column is then the uncut mask (what ``load_batch`` and ``analyze`` count)
and ``rs_mask`` verl's cut one. Without ``uncut_mask``, ``mask`` is the batch's
``response_mask`` as it is at the call, cut where ``rollout_rs`` is set. In bypass mode
(``rollout_correction.bypass_mode``) verl sets ``old_log_probs`` to the rollout's and rejects in
the actor's loss, not in ``response_mask``: the capture then holds no mismatch.
``batch`` may be the ``DataProto`` or any mapping of those keys (tensors or arrays).
"""

from __future__ import annotations

from collections.abc import Mapping

from variance_lab.integrations.recorder import ParquetRecorder

__all__ = ["record_verl_batch"]


def record_verl_batch(recorder: ParquetRecorder, batch, step: int, uncut_mask=None) -> int:
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
    uncut_mask : tensor or array_like, shape (B, R), optional
        ``response_mask`` before verl's rejection (``rollout_rs``) cut it, taken before
        ``compute_rollout_correction_and_add_to_batch`` (the module docstring names the line).
        Written as ``mask``, and the batch's ``response_mask`` as ``rs_mask``. Without it,
        ``mask`` is the batch's ``response_mask`` and there is no ``rs_mask``.

    Returns
    -------
    int
        As :meth:`ParquetRecorder.append`: the rows now in the file.

    Raises
    ------
    ValueError
        Neither a ``DataProto`` nor a mapping, a missing ``old_log_probs`` or ``response_mask``, a
        ``response_mask`` that keeps a token ``uncut_mask`` does not count, or the errors of
        :meth:`ParquetRecorder.append` (shapes that disagree); nothing is appended.
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
    cut = tensors["response_mask"]
    return recorder.append(
        old_logp=tensors["old_log_probs"],
        mask=cut if uncut_mask is None else uncut_mask,
        rs_mask=None if uncut_mask is None else cut,
        rollout_logp=tensors["rollout_log_probs"] if "rollout_log_probs" in keys else None,
        advantages=tensors["advantages"] if "advantages" in keys else None,
        step=step,
        prompt_id=uid,
    )
