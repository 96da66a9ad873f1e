r"""The data of the ``prob_masks`` figure (:mod:`variance_lab.report.probmask_figure`).

(a) theory: each probability-aware mask's masked fraction at a fixed sampler probability
:math:`q` of the token (:func:`variance_lab.corrections.theory` with
:meth:`~variance_lab.corrections.TokenProbability.fixed`), DPPO by sign, and Monte Carlo at a few
:math:`q` (:func:`variance_lab.corrections.simulate_corrections`, one-token sequences); (b) and (c)
data: the masked fractions of a shipped SmolLM2 rollout file per bin of the sampler's probability
and of the entropy (:func:`variance_lab.corrections.mask_by_bins`, the file's advantages and
prompts), ratio masks beside them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import corrections
from variance_lab._jsonl import read_jsonl
from variance_lab.experiment.names import DATA_DIR
from variance_lab.families import get_family
from variance_lab.paper.panel_rows import panel_row

__all__ = ["prob_mask_frame"]


def _data_path(name: str) -> Path:
    """Return the data file's path: a relative name is in the shipped data folder."""
    path = Path(name)
    return path if path.is_absolute() else DATA_DIR / path


def _theory_rows(p: dict) -> list[dict]:
    family = get_family(p["family"], p["mu"], p["sigma2"])
    rows = []
    for q in p["q"]:
        th = corrections.theory(family, [1], p["specs"], token_prob=corrections.TokenProbability.fixed(q))
        rows += [
            panel_row("q", r.correction, q, "exact", r.frac_modified)
            for r in th.itertuples()
            if _shown(r.correction)
        ]
    if p.get("n"):
        for q in p["mc_q"]:
            law = corrections.TokenProbability.fixed(q)
            mc = corrections.simulate_corrections(
                family, [1], p["specs"], int(p["n"]), seed=int(p["seed"]), ci=float(p["ci"]), token_prob=law
            )
            rows += [
                panel_row(
                    "q",
                    r.correction,
                    q,
                    "monte_carlo",
                    r.mc_frac_modified,
                    r.mc_frac_modified_lo,
                    r.mc_frac_modified_hi,
                    r.mc_reliable,
                )
                for r in mc.itertuples()
                if _shown(r.correction)
            ]
    return rows


def _shown(label: str) -> bool:
    """DPPO is drawn by sign (its two sides), KPop as a whole."""
    return not label.startswith("dppo") or label.endswith("]")


def _data_rows(p: dict) -> list[dict]:
    from variance_lab.rollouts import load_batch
    from variance_lab.rollouts.records import sequence_values, token_values
    from variance_lab.rollouts.split import ratio_batch

    path = _data_path(p["data"])
    batch = load_batch(path)
    rb = ratio_batch(batch, p["ratio"])
    records = read_jsonl(path)
    adv = sequence_values(records, "advantage", batch)
    groups = batch.group_index() if batch.has_groups else None
    rows = []
    for by, values in (("p", np.exp(rb.old_logp)), ("entropy", token_values(records, "entropy", batch))):
        frame = corrections.mask_by_bins(
            rb.log_ratio,
            batch.offsets,
            p["data_specs"],
            values,
            p["p_edges"] if by == "p" else p["entropy_edges"],
            by=by,
            log_mu=rb.old_logp,
            advantages=adv,
            groups=groups,
            ci=float(p["ci"]),
            seed=int(p["seed"]),
        )
        rows += [
            panel_row(
                by,
                r.correction,
                r.mean_value,
                "observed",
                r.frac_modified,
                r.frac_modified_lo,
                r.frac_modified_hi,
            )
            for r in frame.itertuples()
        ]
    return rows


def prob_mask_frame(params: dict) -> pd.DataFrame:
    """Tidy rows of the ``prob_masks`` figure (module docstring).

    Parameters
    ----------
    params : dict
        ``family``, ``mu``, ``sigma2`` (the law of the log-odds shift), ``specs`` and the grid ``q``
        of the theory panel; ``n``, ``mc_q``, ``seed``, ``ci`` of its Monte Carlo points (``n`` 0:
        none); ``data`` (a file of the shipped data folder, or a path), ``ratio``, ``data_specs``,
        ``p_edges`` and ``entropy_edges`` of the data panels.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.report.probmask_figure.PROB_MASK_COLUMNS`.
    """
    return pd.DataFrame(_theory_rows(params) + _data_rows(params))
