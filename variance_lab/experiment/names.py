"""Names of the experiment's figure and data set, cheap to import (the command line's parser reads them).

:mod:`~variance_lab.experiment.figure` re-exports both; importing that one loads matplotlib.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_DATA", "FIGURE_NAME"]

#: Base name of the figure's files.
FIGURE_NAME = "experiment_variance"
#: The shipped data set (in the source tree, beside the package).
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "arith_rollouts.jsonl.gz"
