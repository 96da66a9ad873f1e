"""Capture helpers for trainers that write no per-token log-probs to disk: TRL and verl.

=============  ========================================================================
module         holds
=============  ========================================================================
``recorder``   :class:`~variance_lab.integrations.recorder.ParquetRecorder`: appends padded
               ``(B, T)`` batches to a Parquet file that ``load_batch`` reads
``trl``        a ``GRPOTrainer`` mixin, :func:`~variance_lab.integrations.trl.record_trl_batch` and
               :func:`~variance_lab.integrations.trl.trl_prompt_ids` (TRL's groups)
``verl``       :func:`~variance_lab.integrations.verl.record_verl_batch`, to call from the trainer loop
=============  ========================================================================

Neither module imports its framework (the TRL mixin imports ``torch`` only to number the rows
of a batch of torch tensors): they read the batch's tensors through ``.detach()``, ``.double()``,
``.cpu()``, ``.numpy()`` (or take NumPy arrays), so they are tested on fake batches of the
framework's shapes, and the TRL mixin on a real ``GRPOTrainer`` where TRL is installed. Needs
``pyarrow``.
"""
