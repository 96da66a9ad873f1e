r"""Exact and approximate moments of :math:`P_T` and :math:`G_T`, for any family and any T.

For i.i.d. ratios with log-moment function :math:`K(s) = \log E[r^s]`, the moments
:math:`E[P_T^k] = e^{T K(k)}` and :math:`E[G_T^k] = e^{T K(k/T)}` give the exact variances
of :math:`P_T` and :math:`G_T`, the derivation's approximations, bias, MSE, Kong's ESS,
kurtosis and the draws plain Monte Carlo needs (:mod:`variance_lab.theory.exact` writes
the formulas out).

Two paths compute them:

- :mod:`variance_lab.theory.fast`: vectorised float64 with series expansions for the
  cancelling differences and an error estimate per point (the default; about 1e5 to 1e6
  points per second);
- :mod:`variance_lab.theory.exact`: mpmath at a precision that grows with T (``precise=True``,
  milliseconds per point), used automatically for the points the float path cannot
  certify to 1e-9 and for families without a float path.

:func:`grid` gives the whole table over a Cartesian product of parameter arrays.
"""

from variance_lab.theory.exact import DEFAULT_TARGET, QUANTITIES, RENAMED_QUANTITIES
from variance_lab.theory.frames import TABLE_COLUMNS, TIDY_QUANTITIES, grid, summary, tidy, tidy_many
from variance_lab.theory.quantities import (
    bias_G,
    ess_frac_P,
    kurtosis_G,
    kurtosis_P,
    mean_G,
    mean_P,
    mse_G,
    n_needed_G,
    n_needed_P,
    rel_se_var_G,
    rel_se_var_P,
    value,
    var_G,
    var_G_delta,
    var_G_lognormal,
    var_G_naive,
    var_P,
    var_ratio,
)

__all__ = [
    "DEFAULT_TARGET",
    "QUANTITIES",
    "TABLE_COLUMNS",
    "TIDY_QUANTITIES",
    "bias_G",
    "ess_frac_P",
    "grid",
    "kurtosis_G",
    "kurtosis_P",
    "mean_G",
    "mean_P",
    "mse_G",
    "n_needed_G",
    "n_needed_P",
    "rel_se_var_G",
    "rel_se_var_P",
    "summary",
    "tidy",
    "tidy_many",
    "value",
    "var_G",
    "var_G_delta",
    "var_G_lognormal",
    "var_G_naive",
    "var_P",
    "var_ratio",
]


def __getattr__(name: str):
    """Name the current function when code asks for one renamed away (``theory.var_G_seed``)."""
    if name in RENAMED_QUANTITIES:
        raise AttributeError(
            f"variance_lab.theory.{name} was renamed variance_lab.theory.{RENAMED_QUANTITIES[name]}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
