r"""Capture TRL ``GRPOTrainer``'s token log-probs into a Parquet file that ``load_batch`` reads.

TRL keeps its per-token log-probabilities in memory only. ``GRPOTrainer._generate_and_score_completions``
returns the batch the loss reads (``trl/trainer/grpo_trainer.py`` at commit f2cd5771, TRL
1.10.0.dev0; the same names in TRL 1.16.0, whose loss :mod:`variance_lab.frameworks.trl`
mirrors), with

=============================  ====================  ==============================================
key                            shape                 here
=============================  ====================  ==============================================
``old_per_token_logps``        ``(B, C)``            ``logp`` and ``old_logp`` (pi_old, the trainer's)
``sampling_per_token_logps``   ``(B, C)``, optional  ``rollout_logp`` (vLLM's log-probs)
``completion_mask``            ``(B, C)``            ``mask`` (times ``tool_mask`` when present,
                                                     as TRL's loss does)
``advantages``                 ``(B,)``              ``advantages``, repeated over the tokens
=============================  ====================  ==============================================

TRL computes ``old_per_token_logps`` only when it needs them: with vLLM and
``vllm_importance_sampling_correction=True`` (the default with vLLM), or when
``gradient_accumulation_steps`` is not a multiple of ``steps_per_generation * num_iterations``.
Otherwise the batch has none, and recording it raises ``ValueError`` saying so.

Use :class:`CaptureLogProbs` as a mixin before ``GRPOTrainer``::

    from trl import GRPOTrainer
    from variance_lab.integrations.trl import CaptureLogProbs

    class Trainer(CaptureLogProbs, GRPOTrainer):
        pass

    trainer = Trainer(model=..., reward_funcs=..., args=..., train_dataset=...,
                      capture_path="logprobs_rank0.parquet")
    trainer.train()   # the file is complete when train() returns

or call :func:`record_trl_batch` on the batch yourself. Evaluation batches are not recorded.
"""

from __future__ import annotations

from collections.abc import Mapping

from variance_lab.integrations.recorder import ParquetRecorder, as_numpy

__all__ = ["CaptureLogProbs", "record_trl_batch"]


def record_trl_batch(recorder: ParquetRecorder, batch: Mapping, step: int) -> int:
    """Append one GRPO batch (the dict ``_generate_and_score_completions`` returns) to ``recorder``.

    Parameters
    ----------
    recorder : ParquetRecorder
    batch : mapping
        With ``old_per_token_logps`` and ``completion_mask`` of shape ``(B, C)``, optional
        ``sampling_per_token_logps`` ``(B, C)``, ``tool_mask`` ``(B, C)``, ``advantages`` ``(B,)``;
        torch tensors or arrays.
    step : int
        The trainer's ``state.global_step``.

    Returns
    -------
    int
        The rows now in the file, this batch's included (:meth:`ParquetRecorder.append`).

    Raises
    ------
    ValueError
        No ``old_per_token_logps`` or ``completion_mask``, or the errors of
        :meth:`ParquetRecorder.append` (shapes that disagree); nothing is appended.
    """
    where = f"{recorder.path.name}: step {step}"
    for key in ("old_per_token_logps", "completion_mask"):
        if batch.get(key) is None:
            raise ValueError(
                f"{where}: the TRL batch has no {key!r} (TRL computes old_per_token_logps only with "
                "vLLM importance-sampling correction, or when gradient_accumulation_steps is not a "
                "multiple of steps_per_generation * num_iterations)"
            )
    mask = as_numpy(batch["completion_mask"], "completion_mask")
    if batch.get("tool_mask") is not None:
        tool = as_numpy(batch["tool_mask"], "tool_mask")
        if tool.shape != mask.shape:
            raise ValueError(f"{where}: tool_mask has shape {tool.shape}, completion_mask has {mask.shape}")
        mask = mask * tool
    return recorder.append(
        old_logp=batch["old_per_token_logps"],
        mask=mask,
        rollout_logp=batch.get("sampling_per_token_logps"),
        advantages=batch.get("advantages"),
        step=step,
    )


class CaptureLogProbs:
    """Mixin for ``GRPOTrainer``: record every training batch to ``capture_path`` (Parquet).

    Parameters
    ----------
    *args, **kwargs
        ``GRPOTrainer``'s.
    capture_path : str or Path
        The Parquet file (keyword only). With several processes give each its own file, e.g.
        ``f"logprobs_rank{accelerator.process_index}.parquet"``.
    """

    def __init__(self, *args, capture_path, **kwargs):
        super().__init__(*args, **kwargs)
        self.logprob_recorder = ParquetRecorder(capture_path)

    def _generate_and_score_completions(self, inputs):
        """Call ``GRPOTrainer``'s, then record the batch it returns (training batches only)."""
        output = super()._generate_and_score_completions(inputs)
        model = getattr(self, "model", None)
        if getattr(model, "training", True):
            record_trl_batch(self.logprob_recorder, output, step=self.state.global_step)
        return output

    def train(self, *args, **kwargs):
        """Call ``GRPOTrainer.train``, then finish the Parquet file (also after an error)."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.logprob_recorder.close()
