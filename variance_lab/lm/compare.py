r"""Comparisons of the paired run: paired differences clustered by prompt, spread over seeds, lengths.

Two conditions scored on the same tokens (:mod:`variance_lab.lm.paired`) give two values
:math:`x_t, y_t` per token; their paired difference :math:`\bar\Delta = \sum_t (x_t - y_t) / N`
over the :math:`N` tokens is a ratio of per-sequence sums, and its interval resamples prompts
(a prompt's responses share it, so they are not independent):
:func:`~variance_lab.stats.bootstrap.cluster_ratio` with numerator :math:`\sum_{t \in i}(x_t - y_t)`
and denominator :math:`T_i` per sequence :math:`i`, clusters the prompt ids.

:func:`seed_spread` summarises one number measured on several seeds (mean, standard deviation
with ``ddof=1``, range); :func:`length_counts` counts the finished responses by length bucket
and those that hit the token budget apart, which never enter a bucket.
"""

from __future__ import annotations

import itertools

import numpy as np

from variance_lab.ratios import segment_sums
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.stats.bootstrap import cluster_ratio

__all__ = ["length_counts", "paired_difference", "seed_spread"]


def paired_difference(
    x, y, offsets, prompt_id, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> dict:
    r"""Return the mean per-token difference :math:`x_t - y_t` and its prompt-clustered interval.

    Parameters
    ----------
    x, y : array_like
        One value per token, the same tokens in the same order (flat, sequence after sequence).
    offsets : array_like of int
        Sequence boundaries: sequence :math:`i` holds tokens ``offsets[i]:offsets[i+1]``.
    prompt_id : array_like
        One per sequence.
    n_boot : int, optional
    level : float, optional
    seed : int, optional
        Seeds the bootstrap's :class:`numpy.random.Generator`.

    Returns
    -------
    dict
        ``mean``, ``lo``, ``hi``, ``n_tokens``, ``n_sequences``, ``n_prompts``.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    offsets = np.asarray(offsets, dtype=np.int64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(
            f"x and y must be flat arrays of the same tokens, got shapes {x.shape} and {y.shape}"
        )
    if (
        offsets.ndim != 1
        or offsets.size < 2
        or offsets[0] != 0
        or offsets[-1] != x.size
        or np.any(np.diff(offsets) < 1)
    ):
        raise ValueError(f"offsets must rise from 0 to {x.size} by at least 1, got {offsets.tolist()[:8]}...")
    groups = np.asarray(prompt_id)
    if groups.shape != (offsets.size - 1,):
        raise ValueError(f"prompt_id needs one entry per sequence ({offsets.size - 1}), got {groups.size}")
    num = segment_sums(x - y, offsets)
    den = np.diff(offsets).astype(float)
    r = cluster_ratio(num, den, groups, n_boot=n_boot, level=level, rng=np.random.default_rng(seed))
    return {
        "mean": float(num.sum() / den.sum()),
        "lo": r["lo"],
        "hi": r["hi"],
        "n_tokens": int(x.size),
        "n_sequences": int(den.size),
        "n_prompts": int(np.unique(groups).size),
    }


def seed_spread(values) -> dict:
    """Return the mean, the standard deviation (``ddof=1``) and the range of one number over seeds.

    Parameters
    ----------
    values : array_like
        One value per seed, at least two.

    Returns
    -------
    dict
        ``n_seeds``, ``mean``, ``sd``, ``min``, ``max``.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size < 2 or not np.all(np.isfinite(v)):
        raise ValueError(f"need at least two finite values, one per seed, got {v.tolist()!r}")
    return {
        "n_seeds": int(v.size),
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def length_counts(lengths, finished, edges=(8, 16, 32, 64, 128, 256)) -> dict:
    """Count finished responses by length bucket ``[edges[j], edges[j+1])``; unfinished ones apart.

    Parameters
    ----------
    lengths : array_like of int
        Tokens per response.
    finished : array_like of bool
        True when the response ended by itself (an end token), False when it hit the budget.
    edges : sequence of int, optional
        Increasing bucket edges (default 8-15, 16-31, ..., 128-255), as
        :func:`~variance_lab.rollouts.statistics.length_buckets` takes them.

    Returns
    -------
    dict
        ``{"8-15": n, ..., "128-255": n, "shorter": n, "longer": n, "unfinished": n}``: the
        finished responses of each bucket, those below and above the buckets, and the unfinished.
    """
    lengths, finished = np.asarray(lengths), np.asarray(finished)
    if lengths.shape != finished.shape or finished.dtype != bool:
        raise ValueError("lengths and finished need one entry per response, finished as booleans")
    bucket, edges = length_buckets(lengths, edges)
    counts = np.bincount(bucket[finished & (bucket >= 0)], minlength=edges.size - 1)
    out = {f"{a}-{b - 1}": int(n) for (a, b), n in zip(itertools.pairwise(edges), counts, strict=True)}
    out["shorter"] = int((finished & (lengths < edges[0])).sum())
    out["longer"] = int((finished & (lengths >= edges[-1])).sum())
    out["unfinished"] = int((~finished).sum())
    return out
