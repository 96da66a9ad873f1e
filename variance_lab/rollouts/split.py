r"""Three policies: the total ratio split into the rollout mismatch and the policy update.

With the inference engine's log-probs :math:`\log\mu_{rollout}` beside :math:`\log\pi_{old}`
and :math:`\log\pi_\theta` (``TokenBatch.rollout_logp``), every token's total log-ratio is a sum

.. math::

    \underbrace{\log\frac{\pi_\theta}{\mu_{rollout}}}_{\text{total}}
    = \underbrace{\log\frac{\pi_{old}}{\mu_{rollout}}}_{\text{mismatch}}
    + \underbrace{\log\frac{\pi_\theta}{\pi_{old}}}_{\text{update}},

and :func:`split_ratios` reports, for each part, pooled and per length bucket, the statistics
frameworks log (computed here before any truncation): with :math:`\rho = e^d` the token ratio,

- ``mean_log_r``, ``var_log_r``: mean and variance of the token log-ratios :math:`d`;
- ``chi2_token`` :math:`= \overline{\rho^2} - 1`; ``k3_kl`` :math:`= \overline{\rho - \log\rho - 1}`
  (Schulman's k3 estimator of :math:`KL(\text{behaviour} \| \text{target})`);
- ``ess_token`` :math:`= \bar\rho^2 / \overline{\rho^2}`;
- ``var_log_P``: variance of the sequence sums :math:`\log P_T = \sum_t d_t`; ``chi2_seq``
  :math:`= \overline{P_T^2} - 1`; ``ess_seq`` :math:`= \bar P^2 / \overline{P^2}` (log space);
- ``ppo_clip_frac`` (tokens with :math:`\rho` outside the PPO range), ``gspo_clip_frac``
  (sequences with :math:`G_T` outside GSPO's range), and ``frac:<spec>`` for each correction of
  :mod:`variance_lab.corrections` given (by default ``tis:2``, ``icepop:5``, ``seq-mask:3``):
  the fraction of tokens (token level) or sequences (sequence level) it truncates or masks.

Which part dominates is decided on the variance of the token log-ratios:
:math:`\operatorname{Var}(d_{tot}) = \operatorname{Var}(d_{mis}) + \operatorname{Var}(d_{upd})
+ 2\operatorname{Cov}`; each part's share is its variance over the total's
(:func:`variance_lab.ratios.variance_split`, ``ddof=0``). The clip fractions follow
:data:`variance_lab.rollouts.weights.CLIP_RULE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import special

from variance_lab import corrections
from variance_lab.ratios import GSPO_RANGE, PPO_RANGE, log_clip_range, segment_sums, variance_split
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.rollouts.weights import CLIP_RULE
from variance_lab.stats import exp_quiet

__all__ = [
    "DEFAULT_CHECKS",
    "PARTS",
    "RATIOS",
    "RATIO_LABELS",
    "SPLIT_COLUMNS",
    "SplitResult",
    "choose_ratio",
    "has_update_ratio",
    "ratio_batch",
    "split_ratios",
]

#: The three parts, in the order of the frame.
PARTS = ("mismatch", "update", "total")
#: The ratios a batch can be analysed by (:func:`ratio_batch`): the update :math:`\pi_\theta/\pi_{old}`
#: (``logp - old_logp``), the mismatch :math:`\pi_{old}/\mu_{rollout}` and the total
#: :math:`\pi_\theta/\mu_{rollout}` (both need ``rollout_logp``).
RATIOS = ("update", "mismatch", "total")
#: How output names each ratio.
RATIO_LABELS = {
    "update": "the update ratio pi_theta/pi_old",
    "mismatch": "the mismatch ratio pi_old/mu_rollout",
    "total": "the total ratio pi_theta/mu_rollout",
}
#: Corrections whose truncated/masked fraction is reported per part.
DEFAULT_CHECKS = ("tis:2", "icepop:5", "seq-mask:3")
SPLIT_COLUMNS = (
    "part",
    "bucket",
    "T_lo",
    "T_hi",
    "n_seq",
    "n_tokens",
    "mean_log_r",
    "var_log_r",
    "chi2_token",
    "k3_kl",
    "ess_token",
    "var_log_P",
    "chi2_seq",
    "ess_seq",
    "ppo_clip_frac",
    "gspo_clip_frac",
)


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split_ratios` found.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per (part, bucket): :data:`SPLIT_COLUMNS` and ``frac:<spec>`` per check;
        ``bucket = -1`` (``T_lo``..``T_hi`` the whole length range) is the pooled row.
    shares : dict
        ``mismatch``, ``update``, ``covariance``: shares of the total token log-ratio variance.
    dominant : str
        ``"mismatch"``, ``"update"`` or ``"neither"`` (both ratios are 1 everywhere).
    line : str
        One sentence saying which part dominates, with the shares.
    """

    table: pd.DataFrame
    shares: dict
    dominant: str
    line: str


def _log_mean_exp(x: np.ndarray, k: float = 1.0) -> float:
    return float(special.logsumexp(k * x) - math.log(x.size))


def _part_row(d, sums, seq_sel, tok_sel, lengths, ranges, checks) -> dict:
    """Statistics of one part over the selected sequences (``seq_sel``) and their tokens (``tok_sel``).

    ``sums`` holds every sequence's sum of ``d`` (:func:`segment_sums`), computed once per part;
    ``tok_sel`` None selects every token.
    """
    dt = d if tok_sel is None else d[tok_sel]
    L = lengths[seq_sel]
    log_p = sums[seq_sel]
    rho = exp_quiet(dt)
    with np.errstate(over="ignore"):  # a log-ratio beyond ~709 makes k3 and chi2 inf, quietly (as exp_quiet)
        k3, chi2_seq = np.mean(np.expm1(dt) - dt), np.expm1(_log_mean_exp(log_p, 2.0))
    row = {
        "n_seq": int(L.size),
        "n_tokens": int(dt.size),
        "mean_log_r": float(dt.mean()),
        "var_log_r": float(dt.var(ddof=1)) if dt.size > 1 else math.nan,
        "chi2_token": float(np.mean(rho * rho) - 1.0),
        "k3_kl": float(k3),
        "ess_token": math.exp(2 * _log_mean_exp(dt) - _log_mean_exp(dt, 2.0)),
        "var_log_P": float(log_p.var(ddof=1)) if L.size > 1 else math.nan,
        "chi2_seq": float(chi2_seq),
        "ess_seq": math.exp(2 * _log_mean_exp(log_p) - _log_mean_exp(log_p, 2.0)),
        "ppo_clip_frac": float(np.mean(CLIP_RULE.outside(dt, *ranges["ppo"]))),
        "gspo_clip_frac": float(np.mean(CLIP_RULE.outside(log_p / L, *ranges["gspo"]))),
    }
    for c in checks:
        if c.level == "sequence":
            _, mod = corrections.apply_sequence(c, log_p, L)
        else:
            _, mod = corrections.apply_tokens(c, dt)
        row[f"frac:{c.spec}"] = float(np.mean(mod))
    return row


def _shares(mis: np.ndarray, upd: np.ndarray) -> tuple[dict, str, str]:
    """Shares of the token log-ratio variance (:func:`variance_lab.ratios.variance_split`, ``ddof=0``)."""
    v = variance_split(mis, upd, ddof=0)
    v_mis, v_upd, total = v.var_a, v.var_b, v.total
    if total <= 0.0 or not math.isfinite(total):
        return (
            {"mismatch": math.nan, "update": math.nan, "covariance": math.nan},
            "neither",
            ("Neither part dominates: the token log-ratios of both parts are constant."),
        )
    shares = {"mismatch": v.share_a, "update": v.share_b, "covariance": v.share_cross}
    dominant = "mismatch" if v_mis >= v_upd else "update"
    other = "update" if dominant == "mismatch" else "mismatch"
    what = {"mismatch": "the mismatch pi_old/mu_rollout", "update": "the update pi_theta/pi_old"}
    line = (
        f"{what[dominant][0].upper()}{what[dominant][1:]} dominates: {100 * shares[dominant]:.3g} % of "
        "the variance of the total token log-ratio log(pi_theta/mu_rollout), against "
        f"{100 * shares[other]:.3g} % for {what[other]} and {100 * shares['covariance']:.3g} % from their "
        "covariance."
    )
    return shares, dominant, line


def split_ratios(
    batch: TokenBatch,
    edges=None,
    *,
    gspo_range=GSPO_RANGE,
    ppo_range=PPO_RANGE,
    checks=DEFAULT_CHECKS,
) -> SplitResult:
    """Split the total ratio into mismatch and update and describe each part (module docstring).

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp`` (``ValueError`` otherwise).
    edges : None, "exact" or array_like of int
        Length buckets (:func:`~variance_lab.rollouts.statistics.length_buckets`).
    gspo_range, ppo_range : tuple of float
        Clipping ranges (ratios) for the clip fractions.
    checks : sequence of str
        Correction specs (:func:`variance_lab.corrections.parse`) whose modified fraction is reported.

    Returns
    -------
    SplitResult
    """
    if not batch.has_rollout:
        raise ValueError("split_ratios needs rollout_logp (the inference engine's log-probs)")
    ranges = {"gspo": log_clip_range(gspo_range, "gspo_range"), "ppo": log_clip_range(ppo_range, "ppo_range")}
    cs = corrections.parse_list(list(checks)) if checks else []
    lengths = batch.lengths
    bucket, used = length_buckets(lengths, edges)
    groups = [(-1, int(lengths.min()), int(lengths.max()), np.ones(lengths.size, dtype=bool))]
    for j in np.unique(bucket[bucket >= 0]).tolist():
        groups.append((j, int(used[j]), int(used[j + 1]) - 1, bucket == j))
    shares, dominant, line = _shares(batch.mismatch_log_ratio, batch.log_ratio)
    parts = {  # one part's log-ratios in memory at a time: at 1.6e7 tokens each is 128 MB
        "mismatch": lambda: batch.mismatch_log_ratio,
        "update": lambda: batch.log_ratio,
        "total": lambda: batch.total_log_ratio,
    }
    rows = []
    for name, part in parts.items():
        d = part()
        sums = segment_sums(d, batch.offsets)
        for j, lo, hi, sel in groups:
            tok_sel = None if j == -1 else np.repeat(sel, lengths)  # None: every token (no copy)
            row = _part_row(d, sums, sel, tok_sel, lengths, ranges, cs)
            rows.append({"part": name, "bucket": j, "T_lo": lo, "T_hi": hi, **row})
        del d
    cols = [*SPLIT_COLUMNS, *(f"frac:{c.spec}" for c in cs)]
    return SplitResult(pd.DataFrame(rows, columns=cols), shares, dominant, line)


# --------------------------------------------------------------------------------------
# one ratio of the three, as a batch
# --------------------------------------------------------------------------------------
def ratio_batch(batch: TokenBatch, ratio: str = "total") -> TokenBatch:
    r"""Return a batch whose ``log_ratio`` is one of :data:`RATIOS`; everything else kept.

    So :func:`~variance_lab.rollouts.analysis.analyze` and the length profile can judge the
    ratio a trainer with a mismatched or stale sampler weighs by,
    :math:`\log \pi_\theta - \log \mu` (``"total"``), or its mismatch part
    :math:`\log \pi_{\text{old}} - \log \mu` (``"mismatch"``).

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp`` (:math:`\log \mu`) unless ``ratio="update"``.
    ratio : {"update", "mismatch", "total"}, optional

    Returns
    -------
    TokenBatch
        ``logp`` and ``old_logp`` are the ratio's numerator and denominator; no ``rollout_logp``;
        the ids, prompts, token positions, dropped sequences and notes of ``batch``.
    """
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    if ratio == "update":
        return batch
    if not batch.has_rollout:
        raise ValueError(f"ratio {ratio!r} needs rollout_logp (the sampler's log-probs)")
    top = batch.logp if ratio == "total" else batch.old_logp
    return replace(batch, logp=top, old_logp=batch.rollout_logp, rollout_logp=None)


def has_update_ratio(batch: TokenBatch) -> bool:
    """Return False when ``logp`` equals ``old_logp`` at every counted token (every update ratio is 1).

    The captures and the frameworks' dumps hold no log-probs of the updated policy: they write
    pi_old as both, and only the mismatch (``rollout_logp``) varies.
    """
    return not np.array_equal(batch.logp, batch.old_logp)


def choose_ratio(batch: TokenBatch, ratio: str | None = None, *, name: str = "the batch") -> tuple[str, str]:
    """Return the ratio to analyse and a note on the choice ('' when there is nothing to say).

    ``ratio=None`` chooses: the update ratio, unless the batch carries none
    (:func:`has_update_ratio`) and has ``rollout_logp``, then the mismatch, with a note saying
    why.

    Parameters
    ----------
    batch : TokenBatch
    ratio : {"update", "mismatch", "total"} or None
    name : str
        What to call the batch in the note and the errors (a file's name).

    Returns
    -------
    (str, str)

    Raises
    ------
    ValueError
        An unknown ratio; ``"mismatch"`` or ``"total"`` without ``rollout_logp``; the update ratio
        (asked for, or chosen) where the batch carries none: every update ratio is 1.
    """
    if ratio is not None and ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    if ratio in ("mismatch", "total") and not batch.has_rollout:
        raise ValueError(f"--ratio {ratio}: {name} has no rollout_logp (the inference engine's log-probs)")
    if ratio not in (None, "update") or has_update_ratio(batch):
        return ratio or "update", ""
    none = f"{name} carries no update ratio: logp equals old_logp at every counted token"
    if not batch.has_rollout:
        raise ValueError(f"{none} and it has no rollout_logp, so every ratio it holds is 1")
    if ratio == "update":
        raise ValueError(f"--ratio update: {none}; --ratio mismatch analyses pi_old/mu_rollout")
    return "mismatch", (
        f"{none} (a capture holds pi_old and mu_rollout only), so the main table shows "
        f"{RATIO_LABELS['mismatch']} (--ratio mismatch; --ratio total for pi_theta/mu_rollout)"
    )
