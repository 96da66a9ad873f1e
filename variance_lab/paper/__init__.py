"""The paper pipeline: every figure of ``figures/`` from one command, and the notebooks' sizes.

``catalog`` (each figure's name, parameters and caption), ``frames`` (the tidy data behind each
figure), ``pipeline`` (drawing and writing each figure with its sidecar;
:func:`~variance_lab.paper.pipeline.make_all`), ``sidecar_check`` (``figures --check``: fingerprints
and a rebuild against the sidecars), ``compare`` (a rebuilt figure's numbers against the recorded
ones), ``sizes`` (the notebooks' grids and draws, quick or full), ``names`` (the figures' names,
cheap to import).
"""
