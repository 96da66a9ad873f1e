r"""Ratio models fitted to real rollouts: what the i.i.d. lognormal fit misses.

Real token log-ratios :math:`y_t = \log r_t` have heavy tails, and sequences differ in scale.
Three models fit them, each in its own module; the names are importable from here too.

==========  ===========================================  ==========================================
model       module                                       what it is
==========  ===========================================  ==========================================
``mix``     :mod:`~variance_lab.rollouts.mixture`        tokens i.i.d. from a Gaussian mixture in
                                                         log space (EM, BIC): :func:`fit_mixture`
``hier``    :mod:`~variance_lab.rollouts.random_scale`   a sequence-level Gamma variance whose scale
                                                         grows with length (likelihood):
                                                         :func:`fit_random_scale`
``comb``    :mod:`~variance_lab.rollouts.combined`       a per-sequence scale of a sparse token
                                                         mixture whose rate grows with position:
                                                         :func:`fit_combined`
==========  ===========================================  ==========================================

Each fit predicts, at a length :math:`T`, ln E and ln Var of :math:`P_T` and :math:`G_T` and the
probabilities that GSPO clips a sequence and that PPO clips a token (its ``predict``).
"""

from __future__ import annotations

from variance_lab.rollouts.combined import COMB_MAX_COMPONENTS, SPARSE_SD, CombinedFit, fit_combined
from variance_lab.rollouts.mixture import MixtureFit, fit_mixture, normal_outside
from variance_lab.rollouts.random_scale import (
    RandomScaleFit,
    SequenceStats,
    fit_random_scale,
    random_scale_loglik,
)

__all__ = [
    "COMB_MAX_COMPONENTS",
    "SPARSE_SD",
    "CombinedFit",
    "MixtureFit",
    "RandomScaleFit",
    "SequenceStats",
    "fit_combined",
    "fit_mixture",
    "fit_random_scale",
    "normal_outside",
    "random_scale_loglik",
]
