r"""The data of the ``prob_masks`` figure (:mod:`variance_lab.report.probmask_figure`).

(a) theory: each probability-aware mask's masked fraction at a fixed sampler probability
:math:`q` of the token (:func:`variance_lab.corrections.theory` with
:meth:`~variance_lab.corrections.TokenProbability.fixed`), DPPO by sign, and Monte Carlo at a few
:math:`q` (:func:`variance_lab.corrections.simulate_corrections`, one-token sequences); (b) and (c)
data: the masked fractions of a shipped SmolLM2 rollout file per bin of the sampler's probability
and of the entropy (:func:`variance_lab.corrections.mask_by_bins`, the file's advantages and
prompts), ratio masks beside them; (d) CPPO against the sequence length :math:`T` under a Beta law
of the token's probability at a few :math:`\sigma^2` (:func:`cppo_rows`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import corrections
from variance_lab._jsonl import read_jsonl
from variance_lab.experiment.names import DATA_DIR
from variance_lab.families import get_family
from variance_lab.paper.panel_rows import panel_row
from variance_lab.report.probmask_figure import cppo_series

__all__ = ["cppo_rows", "prob_mask_frame"]


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


def _num(x: float) -> str:
    """Return a spec's number as it reads back (``0.2``, not ``0.2000``)."""
    return f"{x:.15g}"


def cppo_rows(p: dict) -> list[dict]:
    r"""Return the rows of panel (d): the fraction of tokens CPPO masks against :math:`T`, and its references.

    For each :math:`\sigma^2` of ``cppo_sigma2`` (the shift :math:`Y` of the tokens' log-odds from
    ``family`` at ``mu`` and that :math:`\sigma^2`; the sampler's probability :math:`q \sim
    \mathrm{Beta}(a, b)`, ``cppo_token_prob``), series ``"<kind> [sigma2=<v>]"``
    (:func:`~variance_lab.report.probmask_figure.cppo_series`), :math:`x = T`:

    - ``cppo_spec`` (``method`` ``"monte_carlo"``): CPPO's masked fraction at each :math:`T` of
      ``cppo_mc_T``, from :math:`\lceil N / T\rceil` sequences of length :math:`T` (:math:`N` =
      ``cppo_tokens``, so every point rests on about as many tokens), seed ``seed``, a ``ci``
      interval (:func:`variance_lab.corrections.simulate_corrections`);
    - ``"threshold alone"`` (``"exact"``, each :math:`T` of ``cppo_T``): :math:`\frac1T\sum_{t \le T}
      f(\delta / w_t)`, the mean of :func:`~variance_lab.corrections.cppo_positions`' ``frac_threshold``:
      a lower bound of CPPO's fraction at length :math:`T`, equal to it at :math:`T = 1` (and the
      exact fraction of the same spec with an idle budget, :math:`\delta_b \ge 1`);
    - ``"limit"`` (``"limit"``, at the ends of ``cppo_T``): :func:`~variance_lab.corrections.cppo_limit`'s
      ``frac_limit``, the fraction as :math:`T \to \infty` (left out where it makes no statement);
    - ``dppo-tv:D[:P]`` at CPPO's :math:`\delta` and :math:`p` (``"exact"``, each :math:`T` of
      ``cppo_T``): DPPO-TV's fraction (:func:`variance_lab.corrections.theory`), :math:`f(\delta)` at
      every :math:`T`.

    No ``cppo_spec`` in ``p`` (a sidecar written before the panel): no rows.
    """
    if not p.get("cppo_spec"):
        return []
    c = corrections.parse(p["cppo_spec"])
    delta, _, _, prob = c.params
    dppo = f"dppo-tv:{_num(delta)}" + ("" if prob == 0.5 else f":{_num(prob)}")
    law = corrections.TokenProbability(*(float(v) for v in p["cppo_token_prob"]))
    grid = [int(t) for t in p["cppo_T"]]
    rows = []
    for s2 in p["cppo_sigma2"]:
        family = get_family(p["family"], p["mu"], float(s2))
        th = corrections.theory(family, grid, dppo, token_prob=law)
        rows += [
            panel_row("T", cppo_series(dppo, s2), r.T, "exact", r.frac_modified)
            for r in th.itertuples()
            if r.correction == dppo
        ]
        for T in grid:
            pos = corrections.cppo_positions(c, family, T, token_prob=law)
            rows.append(
                panel_row("T", cppo_series("threshold alone", s2), T, "exact", pos["frac_threshold"].mean())
            )
        limit = corrections.cppo_limit(c, family, token_prob=law)["frac_limit"]
        if not math.isnan(limit):
            rows += [
                panel_row("T", cppo_series("limit", s2), T, "limit", limit) for T in (min(grid), max(grid))
            ]
        for T in p["cppo_mc_T"]:
            n = math.ceil(int(p["cppo_tokens"]) / int(T))
            mc = corrections.simulate_corrections(
                family, [int(T)], [c], n, seed=int(p["seed"]), ci=float(p["ci"]), token_prob=law
            )
            r = mc[mc["correction"] == c.spec].iloc[0]
            rows.append(
                panel_row(
                    "T",
                    cppo_series(c.spec, s2),
                    T,
                    "monte_carlo",
                    r.mc_frac_modified,
                    r.mc_frac_modified_lo,
                    r.mc_frac_modified_hi,
                    r.mc_reliable,
                )
            )
    return rows


def prob_mask_frame(params: dict) -> pd.DataFrame:
    """Tidy rows of the ``prob_masks`` figure (module docstring).

    Parameters
    ----------
    params : dict
        ``family``, ``mu``, ``sigma2`` (the law of the log-odds shift), ``specs`` and the grid ``q``
        of the theory panel; ``n``, ``mc_q``, ``seed``, ``ci`` of its Monte Carlo points (``n`` 0:
        none); ``data`` (a file of the shipped data folder, or a path), ``ratio``, ``data_specs``,
        ``p_edges`` and ``entropy_edges`` of the data panels; ``cppo_spec``, ``cppo_sigma2``,
        ``cppo_token_prob``, ``cppo_T``, ``cppo_mc_T`` and ``cppo_tokens`` of the CPPO panel
        (:func:`cppo_rows`; none: no CPPO panel).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.report.probmask_figure.PROB_MASK_COLUMNS`.
    """
    return pd.DataFrame(_theory_rows(params) + _data_rows(params) + cppo_rows(params))
