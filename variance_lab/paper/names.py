"""The names of the figures ``variance-lab figures`` writes, cheap to import (the parser lists them).

:mod:`variance_lab.paper.catalog` holds each figure's parameters (importing it loads the sweep
grids and the theory); a test checks that its figures, then the experiment's, are these.
"""

from __future__ import annotations

from variance_lab.experiment.names import FIGURE_NAME

__all__ = ["ALL_FIGURES"]

#: Every figure ``variance-lab figures`` writes, in its order (the last is the experiment's).
ALL_FIGURES = (
    "variance_vs_T",
    "ratio_vs_T",
    "heatmap_var_P",
    "heatmap_var_G",
    "decay_boundary",
    "approx_error",
    "mc_frontier",
    "ess_vs_T",
    "log_histograms",
    "corrections_vs_T",
    "clip_fractions",
    "thresholds",
    "prob_masks",
    "sign_weights",
    "vcpo_ess",
    "speed_bounds",
    FIGURE_NAME,
)
