"""Token log-probs of real rollouts: batches, sequence weights, files, statistics, analysis.

=================  ====================================================================
module             holds
=================  ====================================================================
``batch``          :class:`TokenBatch` and the validation of raw token log-probs
``weights``        sequence weights (P, GSPO's s, perplexities, GMPO), clip ranges, exact segment sums
``io``             JSONL, Parquet and NPZ loaders and savers
``statistics``     length buckets, bucket variances, the pooled fit, autocorrelation
``cgf``            the empirical cumulant generating function
``analysis``       observed per-bucket variances against i.i.d. and corrected predictions
``models``         fitted ratio models: token mixture (EM, BIC) and length-dependent random scale (likelihood)
=================  ====================================================================

The names most users need are re-exported here.
"""

from variance_lab.rollouts.analysis import AnalysisResult, analyze
from variance_lab.rollouts.batch import ON_BAD, DroppedSequence, TokenBatch
from variance_lab.rollouts.io import load_batch, save_batch
from variance_lab.rollouts.statistics import autocorrelation, bucket_variances, fit_log_ratios, length_buckets
from variance_lab.rollouts.weights import (
    GMPO_RANGE,
    GSPO_RANGE,
    PPO_RANGE,
    SequenceWeights,
    segment_sums,
    sequence_weights,
)

__all__ = [
    "GMPO_RANGE",
    "GSPO_RANGE",
    "ON_BAD",
    "PPO_RANGE",
    "AnalysisResult",
    "DroppedSequence",
    "SequenceWeights",
    "TokenBatch",
    "analyze",
    "autocorrelation",
    "bucket_variances",
    "fit_log_ratios",
    "length_buckets",
    "load_batch",
    "save_batch",
    "segment_sums",
    "sequence_weights",
]
