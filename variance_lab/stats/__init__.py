r"""Pure statistics on arrays: moments, intervals, the bootstrap, tails and special functions.

Nothing here knows about families, theory, the engine or token batches; every function takes
plain numbers or arrays. One home each:

- :mod:`~variance_lab.stats.moments`: central moments from power sums, sample variances from logs;
- :mod:`~variance_lab.stats.intervals`: the normal quantile, Wilson's interval, mean and variance
  intervals;
- :mod:`~variance_lab.stats.bootstrap`: one bootstrap (clusters of one = i.i.d.): ratios,
  proportions, the bootstrap-t of a log variance, design effects;
- :mod:`~variance_lab.stats.tails`: GPD fits, Pareto k-hat, Kong's effective sample size;
- :mod:`~variance_lab.stats.special`: special functions shared by theory, families and rollouts.

The public names of the first four are importable from :mod:`variance_lab.stats` itself.
"""

from __future__ import annotations

from variance_lab.stats.bootstrap import (
    CLUSTER_METHOD,
    Resamples,
    bootstrap_ratio,
    cluster_counts,
    cluster_ratio,
    design_effect,
    group_labels,
    log_var_interval,
    proportion_interval,
    resample,
)
from variance_lab.stats.intervals import mean_interval, var_interval, var_se, wilson_interval, z_value
from variance_lab.stats.moments import central_moments, exp_quiet, log_sample_var, scaled_exp
from variance_lab.stats.tails import (
    KHAT_THRESHOLD,
    ess_fraction,
    gpd_fit,
    gpd_fit_log,
    kong_ess,
    pareto_khat,
    pareto_khat_rows,
)

__all__ = [
    "CLUSTER_METHOD",
    "KHAT_THRESHOLD",
    "Resamples",
    "bootstrap_ratio",
    "central_moments",
    "cluster_counts",
    "cluster_ratio",
    "design_effect",
    "ess_fraction",
    "exp_quiet",
    "gpd_fit",
    "gpd_fit_log",
    "group_labels",
    "kong_ess",
    "log_sample_var",
    "log_var_interval",
    "mean_interval",
    "pareto_khat",
    "pareto_khat_rows",
    "proportion_interval",
    "resample",
    "scaled_exp",
    "var_interval",
    "var_se",
    "wilson_interval",
    "z_value",
]
