r"""Exact mirrors of the training frameworks' importance-ratio math, in NumPy.

One module per framework, with the framework's own function and argument names, so that a run's
logged metrics can be recomputed from its token log-probabilities and diffed:

- :mod:`~variance_lab.frameworks.verl`: ``compute_rollout_correction_and_rejection_mask``
  (``rollout_is``, ``rollout_rs``, every ``rollout_corr/...`` metric) and
  ``compute_offpolicy_metrics``;
- :mod:`~variance_lab.frameworks.trl`: ``get_off_policy_mask``, ``get_gamma_weights`` and the
  vLLM importance-sampling correction with its ``sampling/...`` metrics;
- :mod:`~variance_lab.frameworks.nemo_rl`: the actor importance weights (``tis``, ``icepop``,
  ``seq-mask-tis``), ``token_mult_prob_error``, ``sampling_importance_ratio``, ``is_oob_ratio``;
- :mod:`~variance_lab.frameworks.prime_rl`: ``mismatch_kl`` and the DPPO mask (``is_masked``,
  ``is_masked_high``, ``is_masked_low``);
- :mod:`~variance_lab.frameworks.slime`: ``tis``, ``ois``, ``tis_clipfrac``, ``ppo_kl``,
  ``train_rollout_logprob_abs_diff``, the MIS veto and slime's two means (per rollout, or per
  token with ``calculate_per_token_loss``); :mod:`~variance_lab.frameworks.slime_mis`: the rest
  of slime's ``mis.py`` (``compute_mis_weights``);
- :mod:`~variance_lab.frameworks.openrlhf`: ``PolicyLoss``'s ``vllm_is_correction_type``
  ``tis``, ``icepop``, ``seq-mask-tis`` (bounds [0.5, 5] by default), the ``ppo`` and ``gspo``
  ratios, ``ppo_clip_ratio``, ``ppo_kl`` and ``vllm_kl``;
- :mod:`~variance_lab.frameworks.areal`: AReaL's M2PO mask (``actor.m2_threshold``) and the
  token counts and averages it changes.

verl and TRL are checked against their released code (``tools/framework_fixtures.py`` and
``tools/trl_fixtures.py`` write fixtures in a scratch environment with ``verl==0.9.1`` and
``trl==1.16.0``; the default tests compare to :math:`10^{-9}` relative, and also on float32
log-probs with int64 and bool masks, within the framework's own float32 rounding); slime,
prime-rl, NeMo-RL, OpenRLHF and AReaL against their own functions run with torch
(``tools/*_fixtures.py``: counts exact, values within the framework's float32 rounding). Each
module cites the file and the commit it mirrors.

Inputs are padded ``(B, T)`` arrays with a 0/1 mask (:mod:`~variance_lab.frameworks.batch`);
outputs are float64, except verl's, TRL's and OpenRLHF's, which follow the dtypes they are given
as the frameworks do. Where a
framework applies one of the toolkit's corrections, the mirror calls :mod:`variance_lab.corrections`
(each module says which), so every formula lives in one place.
"""
