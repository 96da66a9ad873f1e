"""The paper pipeline: every figure of ``figures/`` from one command, and the notebooks' sizes.

``figures`` (data, drawing and sidecars of each figure; :func:`~variance_lab.paper.figures.make_all`),
``sizes`` (the notebooks' grids and draws, quick or full), ``names`` (the figures' names, cheap to
import).
"""
