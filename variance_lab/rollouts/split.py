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
from variance_lab.ratios import GSPO_RANGE, PPO_RANGE, VarianceSplit, log_clip_range, segment_split_scale
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.pairwise import PairwiseSums, split_sums
from variance_lab.rollouts.source import TokenSource, batch_source
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
    "SplitSums",
    "check_ratio",
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


def _log_mean_exp_from(top: float, n_top: int, rest: float, n: int) -> float:
    """Return ``_log_mean_exp`` of ``n`` values from their sums: scipy's ``logsumexp`` arithmetic.

    ``top`` is the largest value, held ``n_top`` times; ``rest`` the sum of ``exp(a - top)`` over the
    values, 0 for each largest (``scipy.special.logsumexp`` sets them apart); the arithmetic is its
    own, on shape-(1,) arrays.
    """
    a_max, m, s = np.array([top]), np.array([float(n_top)]), np.array([rest])
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(s == 0, s, s / m)
        sgn = np.sign(s + 1) * np.sign(m)
        s = np.where(s < -1, -s - 2, s)
        out = np.log1p(s) + np.log(np.abs(m)) + a_max
    out[sgn < 0] = np.nan
    return float(out[0] - math.log(n))


#: The part's log-ratios of a piece: (logp, old_logp, rollout_logp) -> d, as the batch's properties form them.
_PART_VALUES = {
    "mismatch": lambda lp, ol, ro: ol - ro,
    "update": lambda lp, ol, ro: lp - ol,
    "total": lambda lp, ol, ro: (ol - ro) + (lp - ol),
}
#: Each part's columns of the source's maxima (least and largest log-ratio of each sequence).
_PART_MAXIMA = {"mismatch": "mismatch", "update": "update", "total": "split_total"}
#: Token sums a (part, group) needs in the first pass: mean, mean rho^2, k3, and the two log-sum-exps.
_FIRST = ("d", "rho2", "k3", "lse1", "lse2")


class SplitSums:
    """The three-policy split of a source (:func:`split_ratios`), its token sums fed a piece at a time.

    Every sum is NumPy's of the part's whole array (:class:`~variance_lab.rollouts.pairwise.PairwiseSums`),
    so the table is the one the arrays' statistics give, bit for bit. :meth:`first` takes each piece
    for the sequences' sums and the means, :meth:`second` for the variances; :meth:`result` gives
    the :class:`SplitResult`.
    """

    def __init__(
        self, source, edges=None, *, gspo_range=GSPO_RANGE, ppo_range=PPO_RANGE, checks=DEFAULT_CHECKS
    ):
        if not source.has_rollout:
            raise ValueError("split_ratios needs rollout_logp (the inference engine's log-probs)")
        self.ranges = {
            "gspo": log_clip_range(gspo_range, "gspo_range"),
            "ppo": log_clip_range(ppo_range, "ppo_range"),
        }
        self.checks = corrections.parse_list(list(checks)) if checks else []
        for c in self.checks:
            if c.level == "token" and c.kind in ("ctpo", "m2po"):
                raise ValueError(f"split_ratios reports token checks of each token alone, not {c.spec!r}")
        self.lengths = lengths = source.lengths
        bucket, used = length_buckets(lengths, edges)
        present = np.unique(bucket[bucket >= 0])
        self.groups = [(-1, int(lengths.min()), int(lengths.max()))]
        self.groups += [(int(j), int(used[j]), int(used[j + 1]) - 1) for j in present.tolist()]
        G = len(self.groups)
        self.group_of = np.full(lengths.size, -1, dtype=np.int64)  # bucket group (1..G-1) of each sequence
        for g, (j, _, _) in enumerate(self.groups[1:], start=1):
            self.group_of[bucket == j] = g
        self.seq_in = [np.ones(lengths.size, dtype=bool)] + [self.group_of == g for g in range(1, G)]
        self.n_tokens = np.array([int(lengths[sel].sum()) for sel in self.seq_in])
        self.scale, self.top = {}, {}
        for part, col in _PART_MAXIMA.items():
            lo, hi = source.column(f"{col}_lo"), source.column(f"{col}_hi")
            m = float(max(np.max(-lo), np.max(hi)))
            self.scale[part] = 0.0 if m == 0.0 else segment_split_scale(m, int(lengths.max()))
            self.top[part] = np.array([float(hi[sel].max()) for sel in self.seq_in])
        self.sums = {part: np.empty(lengths.size) for part in PARTS}
        sizes = np.tile(self.n_tokens, len(PARTS) * len(_FIRST))
        self._first = PairwiseSums(sizes)
        self._second = PairwiseSums(np.concatenate([np.tile(self.n_tokens, len(PARTS)), [self.n_tokens[0]]]))
        self.counts = {part: np.zeros((G, 2 + len(self.checks)), dtype=np.int64) for part in PARTS}

    def _index(self, part: str, stat: int) -> int:
        return (PARTS.index(part) * len(_FIRST) + stat) * len(self.groups)

    def _feed(self, sums: PairwiseSums, base: int, values, off, group) -> None:
        """Feed a piece's values to the pooled sum ``base`` and its sequences' runs to their buckets' sums."""
        sums.feed(base, values)
        inside = np.flatnonzero(group > 0)
        if inside.size:
            starts, lens = off[:-1][inside], np.diff(off)[inside]
            sums.feed_runs(values, starts, lens, base + group[inside])

    def first(self, first: int, piece) -> None:
        """Take a piece (its first sequence's index ``first``) in the first pass."""
        off, lp, ol, ro = piece.offsets, piece.logp, piece.old_logp, piece.rollout_logp
        n_seq = len(piece)
        group = self.group_of[first : first + n_seq]
        rep = np.repeat(group, np.diff(off))
        for part in PARTS:
            d = _PART_VALUES[part](lp, ol, ro)
            self.sums[part][first : first + n_seq] = split_sums(
                d, None, off, np.arange(n_seq), self.scale[part]
            )
            rho = exp_quiet(d)
            with np.errstate(over="ignore"):  # a log-ratio beyond ~709: k3 inf, quietly (as exp_quiet)
                k3 = np.expm1(d) - d
            top_tok = np.where(rep > 0, self.top[part][np.maximum(rep, 0)], 0.0)
            for stat, values in ((0, d), (1, rho * rho), (2, k3)):
                self._feed(self._first, self._index(part, stat), values, off, group)
            for stat, k in ((3, 1.0), (4, 2.0)):
                a = k * d
                pooled = k * self.top[part][0]
                self._first.feed(self._index(part, stat), np.where(a == pooled, 0.0, np.exp(a - pooled)))
                mine = k * top_tok
                by_bucket = np.where(a == mine, 0.0, np.exp(a - mine))
                inside = np.flatnonzero(group > 0)
                if inside.size:
                    self._first.feed_runs(
                        by_bucket,
                        off[:-1][inside],
                        np.diff(off)[inside],
                        self._index(part, stat) + group[inside],
                    )
            starts, inside = off[:-1], group > 0
            at_top = [np.add.reduceat((d == self.top[part][0]).astype(np.int64), starts)]
            at_top.append(np.add.reduceat((d == top_tok).astype(np.int64), starts))
            flags = [CLIP_RULE.outside(d, *self.ranges["ppo"])]
            flags += [corrections.apply_tokens(c, d)[1] for c in self.checks if c.level == "token"]
            counts = self.counts[part]
            counts[0, 0] += int(at_top[0].sum())
            np.add.at(counts[:, 0], group[inside], at_top[1][inside])
            for j, f in enumerate(flags, start=1):
                per_seq = np.add.reduceat(f.astype(np.int64), starts)
                counts[0, j] += int(per_seq.sum())
                np.add.at(counts[:, j], group[inside], per_seq[inside])

    def second(self, first: int, piece) -> None:
        """Take a piece in the second pass (after :meth:`first` saw every piece)."""
        off, lp, ol, ro = piece.offsets, piece.logp, piece.old_logp, piece.rollout_logp
        group = self.group_of[first : first + len(piece)]
        rep = np.repeat(group, np.diff(off))
        means = self._means()
        inside = np.flatnonzero(group > 0)
        for p, part in enumerate(PARTS):
            d = _PART_VALUES[part](lp, ol, ro)
            base = p * len(self.groups)
            dev = d - means[part][0]
            self._second.feed(base, dev * dev)
            if part == "mismatch":
                mis_dev = dev
            elif part == "update":
                self._second.feed(len(PARTS) * len(self.groups), mis_dev * dev)
            if inside.size:
                dev = d - means[part][np.maximum(rep, 0)]
                self._second.feed_runs(
                    dev * dev, off[:-1][inside], np.diff(off)[inside], base + group[inside]
                )

    def _means(self) -> dict:
        """Each part's token mean in each group (``np.mean``'s), pooled first."""
        if not hasattr(self, "_mean_cache"):
            totals = self._first.total()
            self._mean_cache = {
                part: totals[self._index(part, 0) : self._index(part, 0) + len(self.groups)] / self.n_tokens
                for part in PARTS
            }
        return self._mean_cache

    def result(self) -> SplitResult:
        """Return the split, once both passes saw every piece."""
        first, second = self._first.total(), self._second.total()
        G, rows = len(self.groups), []
        for p, part in enumerate(PARTS):
            sums = self.sums[part]
            for g, (j, lo, hi) in enumerate(self.groups):
                sel, n = self.seq_in[g], int(self.n_tokens[g])
                L, log_p = self.lengths[sel], sums[sel]
                total = {stat: first[self._index(part, k) + g] for k, stat in enumerate(_FIRST)}
                n_top = int(self.counts[part][g, 0])
                top = float(self.top[part][g])
                lme1 = _log_mean_exp_from(top, n_top, total["lse1"], n)
                lme2 = _log_mean_exp_from(2.0 * top, n_top, total["lse2"], n)
                with np.errstate(over="ignore"):  # a log-ratio beyond ~709 makes chi2 inf, quietly
                    chi2_seq = np.expm1(_log_mean_exp(log_p, 2.0))
                row = {
                    "n_seq": int(L.size),
                    "n_tokens": n,
                    "mean_log_r": float(total["d"] / n),
                    "var_log_r": float(second[p * G + g] / (n - 1)) if n > 1 else math.nan,
                    "chi2_token": float(total["rho2"] / n - 1.0),
                    "k3_kl": float(total["k3"] / n),
                    "ess_token": math.exp(2 * lme1 - lme2),
                    "var_log_P": float(log_p.var(ddof=1)) if L.size > 1 else math.nan,
                    "chi2_seq": float(chi2_seq),
                    "ess_seq": math.exp(2 * _log_mean_exp(log_p) - _log_mean_exp(log_p, 2.0)),
                    "ppo_clip_frac": float(self.counts[part][g, 1] / n),
                    "gspo_clip_frac": float(np.mean(CLIP_RULE.outside(log_p / L, *self.ranges["gspo"]))),
                }
                k = 2
                for c in self.checks:
                    if c.level == "sequence":
                        row[f"frac:{c.spec}"] = float(np.mean(corrections.apply_sequence(c, log_p, L)[1]))
                    else:
                        row[f"frac:{c.spec}"] = float(self.counts[part][g, k] / n)
                        k += 1
                rows.append({"part": part, "bucket": j, "T_lo": lo, "T_hi": hi, **row})
        n = int(self.n_tokens[0])
        va, vb = float(second[0] / n), float(second[G] / n)
        split = VarianceSplit.of(va, vb, float(second[len(PARTS) * G] / n))
        shares, dominant, line = _shares(split)
        cols = [*SPLIT_COLUMNS, *(f"frac:{c.spec}" for c in self.checks)]
        return SplitResult(pd.DataFrame(rows, columns=cols), shares, dominant, line)


def _shares(v: VarianceSplit) -> tuple[dict, str, str]:
    """Shares of the token log-ratio variance (:func:`variance_lab.ratios.variance_split`, ``ddof=0``)."""
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
    batch : TokenBatch or TokenSource
        With ``rollout_logp`` (``ValueError`` otherwise); a source
        (:mod:`variance_lab.rollouts.source`) is read twice, a piece at a time.
    edges : None, "exact" or array_like of int
        Length buckets (:func:`~variance_lab.rollouts.statistics.length_buckets`).
    gspo_range, ppo_range : tuple of float
        Clipping ranges (ratios) for the clip fractions.
    checks : sequence of str
        Correction specs (:func:`variance_lab.corrections.parse`) whose modified fraction is reported
        (token-level ones judged token by token: not ``ctpo`` or ``m2po``).

    Returns
    -------
    SplitResult
    """
    if isinstance(batch, TokenBatch) and not batch.has_rollout:
        raise ValueError("split_ratios needs rollout_logp (the inference engine's log-probs)")
    source = batch_source(batch) if isinstance(batch, TokenBatch) else batch
    acc = SplitSums(source, edges, gspo_range=gspo_range, ppo_range=ppo_range, checks=checks)
    for first, piece in source.pieces():
        acc.first(first, piece)
    for first, piece in source.pieces():
        acc.second(first, piece)
    return acc.result()


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
    if check_ratio(ratio, batch.has_rollout) == "update":
        return batch
    top = batch.logp if ratio == "total" else batch.old_logp
    return replace(batch, logp=top, old_logp=batch.rollout_logp, rollout_logp=None)


def check_ratio(ratio: str, has_rollout: bool) -> str:
    """Return ``ratio`` if it is one of :data:`RATIOS` and the data hold it; ValueError naming it otherwise.

    ``has_rollout``: the data carry ``rollout_logp``, which the mismatch and total ratios need.
    """
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    if ratio != "update" and not has_rollout:
        raise ValueError(f"ratio {ratio!r} needs rollout_logp (the sampler's log-probs)")
    return ratio


def has_update_ratio(batch: TokenBatch | TokenSource) -> bool:
    """Return False when ``logp`` equals ``old_logp`` at every counted token (every update ratio is 1).

    The captures and the frameworks' dumps hold no log-probs of the updated policy: they write
    pi_old as both, and only the mismatch (``rollout_logp``) varies.
    """
    if isinstance(batch, TokenSource):
        return batch.n_changed > 0
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
