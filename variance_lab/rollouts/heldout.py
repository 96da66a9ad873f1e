r"""Held-out judgment of the models: K-fold by prompt.

A model "fits" a length bucket when its prediction of :math:`\operatorname{Var}(G_T)` lies
inside the bucket's interval and its GSPO clip fraction inside the clip interval
(:func:`~variance_lab.rollouts.predictions.choose_model`). Judged on the data the model was
fitted to, that count flatters flexible models. Here the prompts (the sequences, when the batch
has no ``prompt_id``) are split at random into :math:`K` folds (:func:`prompt_folds`); for each
fold the models are fitted on the other folds and judged on the fold's own buckets and
intervals; the counts of buckets fitted are summed over folds. Responses to one prompt never
sit on both sides of a split, so a fold's identical copies cannot vouch for a fit made on their
twins. A (fold, bucket) of fewer than
:data:`~variance_lab.rollouts.predictions.MIN_BUCKET_SEQUENCES` sequences is not judged.

The best model is the one with the most held-out fits, ties to the simpler in the order of
:data:`~variance_lab.rollouts.predictions.ALL_MODELS`. With :math:`K = 2` each fit sees half the
prompts and each judgment the other half, whose intervals are wider than the full batch's: the
held-out count is a test of prediction, not a sharper one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.predictions import ALL_MODELS, TOO_FEW, child_seed

__all__ = ["group_folds", "heldout_judgment", "prompt_folds"]


def prompt_folds(batch: TokenBatch, k: int, seed) -> np.ndarray:
    """Fold (0 .. k-1) of each sequence: its prompts dealt at random into ``k`` folds of near-equal size.

    Parameters
    ----------
    batch : TokenBatch
        Its ``prompt_id`` groups the sequences; without it each sequence is its own group.
    k : int
        Number of folds, >= 2 and at most the number of groups.
    seed : int or numpy.random.SeedSequence
        The deal draws from the spawn key 60,000 of ``seed``.

    Returns
    -------
    ndarray of int64, shape ``(len(batch),)``
    """
    return group_folds(batch.group_index(), k, seed)


def group_folds(groups: np.ndarray, k: int, seed) -> np.ndarray:
    """Return :func:`prompt_folds` of sequences whose groups (0 .. G-1, as ``group_index``) are given."""
    n_groups = int(groups.max()) + 1
    if k < 2 or k > n_groups:
        raise ValueError(f"k must be in 2 .. {n_groups} (the number of prompts), got {k}")
    rng = np.random.default_rng(child_seed(seed, 60_000))
    fold_of_group = rng.permutation(n_groups) % k
    return fold_of_group[groups]


def heldout_judgment(
    batch: TokenBatch, judge: Callable[[TokenBatch, TokenBatch, int], object], *, k: int, seed, step=None
) -> dict | None:
    """Sum over ``k`` folds of the buckets each model fits, fitted on the other folds.

    Parameters
    ----------
    batch : TokenBatch
    judge : callable
        ``judge(eval_batch, fit_batch, fold)`` returns the analysis table of ``eval_batch``
        (with the ``fits`` and ``best_model`` columns) against models fitted on ``fit_batch``,
        or None when the models cannot be fitted.
    k : int
        Number of folds.
    seed : int or numpy.random.SeedSequence
        Seed of the deal (:func:`prompt_folds`).
    step : callable, optional
        Called with 1 after each fold (a progress bar's ``update``).

    Returns
    -------
    dict or None
        ``k``, ``unit`` ("prompts" or "sequences"), ``fits`` (model -> buckets fitted, summed),
        ``n_judged`` (fold-buckets judged), ``best_model`` and ``folds`` (per fold: the table's
        ``bucket``, ``n_seq``, ``fits``); None when some fold's models cannot be fitted or
        there are fewer groups than folds.
    """
    n_groups = int(batch.group_index().max()) + 1
    if n_groups < k:
        return None
    fold = prompt_folds(batch, k, seed)
    counts = dict.fromkeys(ALL_MODELS, 0)
    n_judged, per_fold = 0, []
    for f in range(k):
        inside = fold == f
        table = judge(batch.select(inside), batch.select(~inside), f)
        if step is not None:
            step(1)
        if table is None:
            return None
        judged = table[table["best_model"].astype(str) != TOO_FEW]
        n_judged += len(judged)
        for fits in judged["fits"]:
            for m in filter(None, str(fits).split(",")):
                counts[m] += 1
        per_fold.append(
            {
                "fold": f,
                "n_seq": int(inside.sum()),
                "buckets": table["bucket"].astype(int).tolist(),
                "fits": [str(x) for x in table["fits"]],
            }
        )
    best = max(ALL_MODELS, key=lambda m: (counts[m], -ALL_MODELS.index(m)))
    return {
        "k": k,
        "unit": "prompts" if batch.has_groups else "sequences",
        "fits": counts,
        "n_judged": n_judged,
        "best_model": best if counts[best] > 0 else "none",
        "folds": per_fold,
    }
