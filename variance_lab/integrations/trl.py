r"""Capture TRL ``GRPOTrainer``'s token log-probs into a Parquet file that ``load_batch`` reads.

TRL keeps its per-token log-probabilities in memory only. Checked against TRL 1.16.0 (PyPI,
``trl/trainer/grpo_trainer.py``, sha256 ``1c3dc2253fb3...``; line numbers below are that file's).
``GRPOTrainer._generate_and_score_completions`` returns the batch the loss reads, with

=============================  ====================  ==============================================
key                            shape                 here
=============================  ====================  ==============================================
``old_per_token_logps``        ``(B, C)``, optional  ``logp`` and ``old_logp`` (pi_old, the trainer's)
``sampling_per_token_logps``   ``(B, C)``, optional  ``rollout_logp`` (vLLM's log-probs)
``completion_mask``            ``(B, C)``            ``mask`` (times ``tool_mask`` when present,
                                                     as TRL's loss does)
``advantages``                 ``(B,)``              ``advantages``, repeated over the tokens
=============================  ====================  ==============================================

**Groups.** TRL computes the advantages over the rewards of every process gathered in process
order, ``rewards.view(-1, num_generations)`` (line 2765): the ``num_generations`` completions of a
prompt are consecutive rows of that global batch, and each process keeps its own slice of it,
``process_index * B`` to ``(process_index + 1) * B`` (lines 2813-2818). So local row ``i`` of
process ``p`` answers the prompt ``(p B + i) // num_generations`` of its generation batch
(:func:`trl_prompt_ids`). The capture writes that as ``prompt_id`` (``"<generation>-<prompt>"``,
the generation batches counted from 0 over the trainer's life, the same on every process), so
``analyze`` resamples prompts, not completions. With one process the groups are consecutive rows
of the file; with several, a group may straddle two ranks' files, under the same ``prompt_id``.
The rows are recorded before TRL shuffles them (``shuffle_sequence_dict``, line 1543).

**pi_old.** TRL computes ``old_per_token_logps`` (lines 2642-2657) only when the batch is trained
over more than one optimizer step (``gradient_accumulation_steps`` not a multiple of
``steps_per_generation * num_iterations``) or with vLLM and
``vllm_importance_sampling_correction=True`` (its default with vLLM). Otherwise, TRL's defaults
without vLLM among them (``num_iterations=1``, ``steps_per_generation =
gradient_accumulation_steps``), the batch has none: the loss takes its own log-probs, detached,
as pi_old (``old_per_token_logps = per_token_logps.detach()``, line 3066), since the whole
generation batch is trained before the next optimizer step. :class:`CaptureLogProbs` then records
those, the log-probs ``_compute_loss`` computes for each row (line 3030), and writes the batch when
the loss has seen all its rows. Either way ``logp`` equals ``old_logp``: the update ratio is 1,
by construction in the second case (TRL's own ratio ``coef_1`` is 1 there too).

**What TRL does not have.** Without vLLM TRL samples with the trained model itself and computes
no sampling log-probs: there is no ``rollout_logp``, and the file measures no mismatch. Where the
batch has ``old_per_token_logps``, the loss's own log-probs pi_theta differ from them on the
passes after the first (``num_iterations > 1``) and on slices trained after an optimizer step
(``steps_per_generation > gradient_accumulation_steps``); they are not recorded, so the file has
no update ratio. The file's key-value metadata ``variance_lab.capture`` (JSON) says where
``old_logp`` came from, the update ratio, what is missing, ``num_generations`` and the TRL version
(``pyarrow.parquet.read_schema(path).metadata``).

**Steps.** The ``step`` column is the optimizer step that generated the batch, numbered as TRL's
log numbers it: ``state.global_step + 1`` while generating (the trainer increments
``global_step`` at the end of the step, then logs the step's metrics under it, ``reward`` and
``sampling/*`` of the batch included).

Use :class:`CaptureLogProbs` as a mixin before ``GRPOTrainer``::

    from trl import GRPOTrainer
    from variance_lab.integrations.trl import CaptureLogProbs

    class Trainer(CaptureLogProbs, GRPOTrainer):
        pass

    trainer = Trainer(model=..., reward_funcs=..., args=..., train_dataset=...,
                      capture_path="logprobs_rank0.parquet")
    trainer.train()   # the file is complete when train() returns

A second ``train()`` appends to the same file (:meth:`ParquetRecorder.reopen`); TRL's own step
count starts again at 1 unless it resumes from a checkpoint. Or call :func:`record_trl_batch`
on a batch that has ``old_per_token_logps`` yourself. Evaluation batches are not recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from variance_lab.integrations.recorder import ParquetRecorder, as_numpy

__all__ = ["CaptureLogProbs", "record_trl_batch", "trl_prompt_ids"]

#: The key the mixin adds to TRL's batch to find each row again after TRL shuffles and splits it.
ROW_KEY = "variance_lab_row"


def trl_prompt_ids(n_rows: int, num_generations: int, *, generation: int = 0, process_index: int = 0):
    r"""Return the prompt of each local row of a TRL generation batch, as ``"<generation>-<prompt>"``.

    TRL groups the gathered batch of all processes in consecutive runs of ``num_generations``
    rows, and process ``p`` holds rows ``p n`` to ``(p + 1) n - 1`` of it (module docstring), so
    local row ``i`` answers prompt :math:`\lfloor (p n + i) / G \rfloor` with
    :math:`G` = ``num_generations``.

    Parameters
    ----------
    n_rows : int
        ``n``, the rows of this process's batch.
    num_generations : int
        TRL's ``num_generations`` (``G``), at least 1.
    generation : int
        The generation batch's index (counted over the trainer's life), which makes the ids of
        different batches differ.
    process_index : int
        ``accelerator.process_index``.

    Returns
    -------
    ndarray of str, shape (n_rows,)

    Raises
    ------
    ValueError
        ``num_generations`` below 1, or a negative count or index.

    Examples
    --------
    >>> from variance_lab.integrations.trl import trl_prompt_ids
    >>> trl_prompt_ids(3, 2, generation=5, process_index=1).tolist()  # global rows 3, 4, 5
    ['5-1', '5-2', '5-2']
    """
    for name, value, low in (
        ("n_rows", n_rows, 0),
        ("num_generations", num_generations, 1),
        ("generation", generation, 0),
        ("process_index", process_index, 0),
    ):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    prompts = (int(process_index) * int(n_rows) + np.arange(int(n_rows))) // int(num_generations)
    return np.array([f"{int(generation)}-{k}" for k in prompts.tolist()], dtype=object)


def record_trl_batch(recorder: ParquetRecorder, batch: Mapping, step: int, prompt_id=None) -> int:
    """Append one GRPO batch (the dict ``_generate_and_score_completions`` returns) to ``recorder``.

    Parameters
    ----------
    recorder : ParquetRecorder
    batch : mapping
        With ``old_per_token_logps`` and ``completion_mask`` of shape ``(B, C)``, optional
        ``sampling_per_token_logps`` ``(B, C)``, ``tool_mask`` ``(B, C)``, ``advantages`` ``(B,)``;
        torch tensors or arrays.
    step : int
        The step TRL's log gives the batch: ``state.global_step + 1`` while it is generated.
    prompt_id : array_like, shape (B,), optional
        Each row's prompt, e.g. :func:`trl_prompt_ids`; written as ``prompt_id``.

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
                f"{where}: the TRL batch has no {key!r} (TRL computes old_per_token_logps only with vLLM "
                "importance-sampling correction, or when gradient_accumulation_steps is not a multiple of "
                "steps_per_generation * num_iterations; otherwise its loss uses its own log-probs as pi_old, "
                "which the CaptureLogProbs mixin records)"
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
        prompt_id=prompt_id,
    )


class _LossRows:
    """A generation batch without ``old_per_token_logps``, waiting for the loss's log-probs of its rows."""

    def __init__(self, batch: Mapping, step: int, prompt_id):
        keys = ("completion_mask", "tool_mask", "sampling_per_token_logps", "advantages")
        self.batch = {k: as_numpy(batch[k], k) for k in keys if batch.get(k) is not None}
        self.step = step
        self.prompt_id = prompt_id
        self.logp = np.full(self.batch["completion_mask"].shape, np.nan)
        self.seen = np.zeros(self.logp.shape[0], dtype=bool)

    def fill(self, rows, logps) -> None:
        """Keep the loss's log-probs of ``rows`` (the first time each row is seen)."""
        rows = as_numpy(rows, ROW_KEY).astype(np.int64)
        values = as_numpy(logps, "per_token_logps")
        new = ~self.seen[rows]
        self.logp[rows[new]] = values[new]
        self.seen[rows] = True

    def record(self, recorder: ParquetRecorder) -> None:
        """Append the rows seen so far (all of them, unless training stopped inside the batch)."""
        keep = self.seen
        if not keep.any():
            return
        batch = {k: v[keep] for k, v in self.batch.items()}
        batch["old_per_token_logps"] = self.logp[keep]
        record_trl_batch(recorder, batch, step=self.step, prompt_id=self.prompt_id[keep])


class CaptureLogProbs:
    """Mixin for ``GRPOTrainer``: record every training batch to ``capture_path`` (Parquet).

    Each generation batch becomes rows of the file, with ``prompt_id`` (TRL's groups of
    ``num_generations``) and ``step`` (TRL's logged step); with TRL's defaults, where the batch
    holds no ``old_per_token_logps``, the log-probs come from TRL's loss (module docstring).

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
        self._capture_generation = 0
        self._capture_pending = None
        self._capture_rows = None

    def _capture_metadata(self, has_old: bool, has_sampling: bool) -> dict:
        """Return the file's ``variance_lab.capture`` note: where the log-probs come from, what is missing."""
        try:
            from trl import __version__ as trl_version
        except ImportError:  # the tests' stand-in trainer
            trl_version = "unknown"
        missing = []
        if not has_sampling:
            missing.append(
                "rollout_logp: the batch has no sampling_per_token_logps (without vLLM TRL samples with "
                "the trained model and computes none): the file measures no mismatch"
            )
        if has_old:
            missing.append(
                "the loss's own log-probs pi_theta where they differ from pi_old (passes after the first "
                "over a batch with num_iterations > 1, slices trained after an optimizer step with "
                "steps_per_generation > gradient_accumulation_steps): the file has no update ratio"
            )
        note = {
            "framework": "trl",
            "trl_version": trl_version,
            "num_generations": int(self.num_generations),
            "old_logp": (
                "old_per_token_logps of the generation batch"
                if has_old
                else "the loss's per_token_logps, detached: TRL's pi_old when the batch has no "
                "old_per_token_logps (num_iterations * steps_per_generation divides "
                "gradient_accumulation_steps)"
            ),
            "update_ratio": "1: logp is old_logp"
            + ("" if has_old else " (1 by construction in TRL's loss too)"),
            "missing": missing,
            "step": "TRL's logged step: state.global_step + 1 while the batch was generated",
        }
        return {"variance_lab.capture": json.dumps(note)}

    def _generate_and_score_completions(self, inputs):
        """Call ``GRPOTrainer``'s, then record the batch it returns (training batches only)."""
        output = super()._generate_and_score_completions(inputs)
        model = getattr(self, "model", None)
        if not getattr(model, "training", True):
            return output
        self._capture_flush()
        n_rows = int(output["completion_mask"].shape[0])
        process_index = getattr(getattr(self, "accelerator", None), "process_index", 0)
        prompt_id = trl_prompt_ids(
            n_rows, self.num_generations, generation=self._capture_generation, process_index=process_index
        )
        self._capture_generation += 1
        step = self.state.global_step + 1
        has_old = output.get("old_per_token_logps") is not None
        if self.logprob_recorder.n_rows == 0 and not self.logprob_recorder.metadata:
            has_sampling = output.get("sampling_per_token_logps") is not None
            self.logprob_recorder.metadata = self._capture_metadata(has_old, has_sampling)
        if has_old:
            record_trl_batch(self.logprob_recorder, output, step=step, prompt_id=prompt_id)
            return output
        self._capture_pending = _LossRows(output, step, prompt_id)
        rows = np.arange(n_rows)
        mask = output["completion_mask"]
        if hasattr(mask, "detach"):  # a torch tensor: the row numbers go where the batch lives
            import torch

            rows = torch.arange(n_rows, device=mask.device)
        output[ROW_KEY] = rows  # shuffled and split with the batch's other rows (lines 1543-1544)
        return output

    def _compute_loss(self, model, inputs):
        """Call ``GRPOTrainer``'s; keep its log-probs of the rows still waiting for them."""
        if self._capture_pending is not None and inputs.get(ROW_KEY) is not None:
            self._capture_rows = inputs[ROW_KEY]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._capture_rows = None

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        """Call ``GRPOTrainer``'s; inside ``_compute_loss``, keep its first result for the capture."""
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        rows, self._capture_rows = self._capture_rows, None
        pending = self._capture_pending
        if rows is not None and pending is not None:
            pending.fill(rows, out[0])
            if pending.seen.all():
                self._capture_flush()
        return out

    def _capture_flush(self) -> None:
        """Write the batch waiting for the loss's log-probs (the rows seen so far), if any."""
        pending, self._capture_pending = self._capture_pending, None
        if pending is not None:
            pending.record(self.logprob_recorder)

    def train(self, *args, **kwargs):
        """Call ``GRPOTrainer.train``, then finish the Parquet file (also after an error).

        A second call appends to the file the first one finished.
        """
        self.logprob_recorder.reopen()
        try:
            return super().train(*args, **kwargs)
        finally:
            try:
                self._capture_flush()
            finally:
                self.logprob_recorder.close()
