"""A controlled experiment: real per-token ratios from a small policy trained on arithmetic.

Modules, from the ground up:

- :mod:`~variance_lab.experiment.task`: the task (add tagged digits, running sums written
  out), deterministic from a :class:`numpy.random.Generator`, and its reward. No PyTorch.
- :mod:`~variance_lab.experiment.model`: a tiny causal transformer, sampling and scoring.
- :mod:`~variance_lab.experiment.settings`: how both experiments' settings are checked and
  stored (the SmolLM2 experiment's too). No PyTorch.
- :mod:`~variance_lab.experiment.train`: settings, SFT, GSPO iterations (GRPO-style groups).
- :mod:`~variance_lab.experiment.collect`: sample from the old policy, score under old and
  new, save in the toolkit's format with a JSON sidecar (``variance-lab experiment run``).
- :mod:`~variance_lab.experiment.files`: a data set's files, for both experiments: sidecar
  names, the sidecar (:func:`~variance_lab.experiment.files.dataset_sidecar`), summary,
  writing, comparison. No PyTorch; versions, fingerprints and PyTorch determinism are
  :mod:`variance_lab.provenance`'s.
- :mod:`~variance_lab.experiment.names`: the figure's name and the shipped data set's path,
  cheap to import.
- :mod:`~variance_lab.experiment.figure`: the analysis of a data set and its figure
  (``variance-lab experiment figure``). No PyTorch.

``model``, ``train`` and ``collect`` need ``pip install 'variance_lab[experiment]'``; nothing
here imports them at package import.
"""
