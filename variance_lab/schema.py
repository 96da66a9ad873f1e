"""The tidy long-format schema shared by theory and Monte Carlo.

One row per (family, parameters, T, statistic, method). Tables and figures read this
schema only, so they never care where a number came from.

=============  ======================================================================
column         meaning
=============  ======================================================================
family         family name (``lognormal``, ``gamma``, ``two-point``, ...)
mu, sigma2     mean and variance of the per-token ratio
T              sequence length
statistic      what is measured: ``var_P``, ``var_G``, ``mean_P``, ``mean_G``, ...
method         ``exact``, ``lognormal``, ``delta``, ``naive`` (the derivation's
               approximations; ``naive`` is the sigma^2/T its table prints) or ``monte_carlo``
value          the value (float64; ``inf``/``0.0`` beyond float range)
log10_value    log10 of ``|value|``, exact where ``value`` over- or underflows
lo, hi         confidence interval (NaN for exact values)
se             standard error (NaN for exact values)
reliable       bool; False flags an estimate whose interval or value cannot be trusted
reason         why an estimate is flagged ('' when reliable); it starts with the
               verdict level, ``"marginal: "`` or ``"unreliable: "`` (:data:`VERDICTS`,
               :func:`verdict_level`)
=============  ======================================================================
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "EXECUTORS",
    "METHODS",
    "RENAMED_METHODS",
    "SAMPLER_CHOICES",
    "TIDY_COLUMNS",
    "VERDICTS",
    "check_sampler",
    "json_safe",
    "verdict_level",
]

METHODS = ("exact", "lognormal", "delta", "naive", "monte_carlo")

#: Where the Monte Carlo engine runs its chunks (:class:`variance_lab.simulate.engine.Engine`); here,
#: light to import, so that the command line offers them without loading numba.
EXECUTORS = ("threads", "dask", "dask-local")
#: What the engine's ``sampler=`` accepts (:mod:`variance_lab.simulate.aggregate`): every token, log P_T
#: drawn at the grid points from its exact law, or the aggregate where it is exact.
SAMPLER_CHOICES = ("token", "aggregate", "auto")


def check_sampler(sampler) -> str:
    """``sampler`` if it is one of :data:`~variance_lab.schema.SAMPLER_CHOICES`.

    Raises
    ------
    ValueError
        Naming the bad sampler and the choices.
    """
    if not isinstance(sampler, str) or sampler not in SAMPLER_CHOICES:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLER_CHOICES)}, got {sampler!r}")
    return sampler


#: ``method`` names of earlier versions -> their names now: rows read back from a sweep store
#: written before the rename carry the current name (:func:`variance_lab.sweep.store.normalise_frame`).
RENAMED_METHODS = {"seed": "naive"}

TIDY_COLUMNS = (
    "family",
    "mu",
    "sigma2",
    "T",
    "statistic",
    "method",
    "value",
    "log10_value",
    "lo",
    "hi",
    "se",
    "reliable",
    "reason",
)

#: Verdict levels of a tidy row, best first (their meaning: :mod:`variance_lab.simulate.estimates`).
VERDICTS = ("reliable", "marginal", "unreliable")


def verdict_level(reason: str) -> str:
    """Return the verdict level of a tidy row from its ``reason``: one of :data:`VERDICTS`.

    >>> verdict_level(""), verdict_level("marginal: the interval may cover less than its level")
    ('reliable', 'marginal')

    Raises
    ------
    ValueError
        A non-empty reason that does not start with ``marginal:`` or ``unreliable:``.
    """
    if reason == "":
        return "reliable"
    level = str(reason).split(":", 1)[0]
    if level not in VERDICTS[1:]:
        raise ValueError(f"reason {reason!r} does not start with a verdict level (marginal, unreliable)")
    return level


def json_safe(value):
    """Return a value JSON can hold, recursively: the one converter every JSON writer uses.

    NumPy scalars become Python ones (``np.bool_`` to ``bool``), arrays become lists, tuples
    lists, dictionary keys strings, and NaN and infinities ``None`` (JSON has no such
    numbers: csv writes ``inf``, JSON ``null``, and the ``log10_`` twin stays exact).
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
