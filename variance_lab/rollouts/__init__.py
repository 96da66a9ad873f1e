"""Token log-probs of real rollouts: batches, sequence weights, files, statistics, analysis.

=================  ====================================================================
module             holds
=================  ====================================================================
``batch``          :class:`TokenBatch` and the validation of raw token log-probs
``prompts``        what may name a response's prompt (``prompt_id``), and its array form
``weights``        sequence weights (P, GSPO's s, perplexities, GMPO), clip ranges, exact segment sums
``records``        the one parser of a record's fields: JSONL records, NeMo-RL's batch-of-one lines
``presets``        readers of frameworks' run files (prime-rl token exports, slime ``.pt``, NeMo-RL)
``io``             JSONL, Parquet and NPZ loaders and savers
``parquet``        the Parquet format, read whole or a number of rows at a time
``source``         token sources: a batch or a file in pieces, read once per pass, and the first pass
``statistics``     length buckets, bucket variances, the pooled fit, autocorrelation
``lags``           the pooled lag sums within sequences, by FFT (the autocorrelation's core)
``cgf``            the empirical cumulant generating function
``split``          the total ratio split into the rollout mismatch and the policy update
``mixture``        the ``mix`` model: a Gaussian token mixture in log space (EM, BIC); ``normal_outside``
``random_scale``   the ``hier`` model: a length-dependent random scale (likelihood)
``combined``       the ``comb`` model: a per-sequence scale of a sparse token mixture
``models``         the three fitted models' names in one place, and their overview
``predictions``    per-bucket predictions of the fitted models, clip intervals, the choice of model
``heldout``        held-out judgment of the models: K-fold by prompt
``subsample``      the stated random sample of whole prompts the token-mixture fits see
``pairwise``       NumPy's pairwise and exact segment sums, bit for bit, over values fed in pieces
``pooled``         the pooled fit, autocorrelation and CGF of a set's log-ratios held in one array
``summaries``      the streaming analysis: every token sum the judgment needs, by set, in passes
``analysis``       observed per-bucket variances against i.i.d. and corrected predictions
``judgment``       the per-bucket judgment of ``analysis``: predictions, scores, verdicts, held-out folds
``run_layout``     the steps of a run directory in the frameworks' layouts (prime-rl step folders...)
``steps``          a run of many steps analysed step by step, locally or on a Dask cluster
=================  ====================================================================

The names most users need are re-exported here, each imported when first used.
"""

from variance_lab._lazy import lazy_exports

#: Where each re-exported name lives; imported on first use (PEP 562), so that importing one
#: submodule (``rollouts.batch`` for its constants, say) does not load scipy through ``models``.
_LAZY = {
    "AnalysisResult": "analysis",
    "analyze": "analysis",
    "RunAnalysis": "steps",
    "analyze_run": "steps",
    "ON_BAD": "batch",
    "DroppedSequence": "batch",
    "TokenBatch": "batch",
    "load_batch": "io",
    "open_rollouts": "source",
    "save_batch": "io",
    "autocorrelation": "statistics",
    "bucket_variances": "statistics",
    "fit_log_ratios": "statistics",
    "length_buckets": "statistics",
    "GMPO_RANGE": "weights",
    "GSPO_RANGE": "weights",
    "PPO_RANGE": "weights",
    "SequenceWeights": "weights",
    "segment_sums": "weights",
    "sequence_weights": "weights",
}

__all__ = [
    "GMPO_RANGE",
    "GSPO_RANGE",
    "ON_BAD",
    "PPO_RANGE",
    "AnalysisResult",
    "DroppedSequence",
    "RunAnalysis",
    "SequenceWeights",
    "TokenBatch",
    "analyze",
    "analyze_run",
    "autocorrelation",
    "bucket_variances",
    "fit_log_ratios",
    "length_buckets",
    "load_batch",
    "open_rollouts",
    "save_batch",
    "segment_sums",
    "sequence_weights",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
