"""Names of the experiment's figure and data sets, cheap to import (the command line's parser reads them).

:mod:`~variance_lab.experiment.figure` re-exports both; importing that one loads matplotlib.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "DEFAULT_DATA", "FIGURE_NAME"]

#: Base name of the figure's files.
FIGURE_NAME = "experiment_variance"
#: Where the experiments' shipped data sets live (in the source tree, beside the package).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
#: The shipped data set of the arithmetic experiment.
DEFAULT_DATA = DATA_DIR / "arith_rollouts.jsonl.gz"
