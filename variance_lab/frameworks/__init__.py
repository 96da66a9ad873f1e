r"""Exact mirrors of the training frameworks' importance-ratio math, in NumPy.

One module per framework, with the framework's own function and argument names, so that a run's
logged metrics can be recomputed from its token log-probabilities and diffed:

- :mod:`~variance_lab.frameworks.verl`: ``compute_rollout_correction_and_rejection_mask``
  (``rollout_is``, ``rollout_rs``, every ``rollout_corr/...`` metric) and
  ``compute_offpolicy_metrics``;
- :mod:`~variance_lab.frameworks.trl`: ``get_off_policy_mask``, ``get_gamma_weights`` and the
  vLLM importance-sampling correction with its ``sampling/...`` metrics;
- :mod:`~variance_lab.frameworks.others`: NeMo-RL, prime-rl, slime and OpenRLHF.

Inputs are padded ``(B, T)`` arrays with a 0/1 mask (:mod:`~variance_lab.frameworks.batch`);
outputs are float64. Where a framework applies one of the toolkit's corrections, the mirror calls
:mod:`variance_lab.corrections` (each module says which), so every formula lives in one place.
"""
