r"""The streaming analysis: what :func:`~variance_lab.rollouts.analysis.analyze` takes of every token.

A :class:`Summaries` reads a :class:`~variance_lab.rollouts.source.TokenSource` a piece at a time
and reduces its tokens to what the judgment needs (:mod:`variance_lab.rollouts.judgment`), for the
whole batch and for each held-out fold:

- per sequence (:class:`EvalSummary`, a set of sequences to judge): :math:`\log P_T` by the exact
  split of :func:`~variance_lab.ratios.segment_sums` at the set's scale, the clip counts of PPO and
  GMPO; every bootstrap resamples these, never tokens;
- per set the models are fitted to (:class:`FitSummary`): the pooled fit, the autocorrelation and
  the empirical CGF (:mod:`variance_lab.rollouts.pooled`, from the set's :math:`y` held in one array
  of 8 bytes a token, the only memory that grows with the file), and the fit samples
  (:func:`~variance_lab.rollouts.subsample.sample_mask`): the token sample's tokens, the ``hier``
  sample's :class:`~variance_lab.rollouts.random_scale.SequenceStats`;
- the three-policy split (:class:`~variance_lab.rollouts.split.SplitSums`).

Every number is the one the batch's whole arrays gave (the sums are NumPy's own, reproduced in
pieces: :mod:`variance_lab.rollouts.pairwise`), so the analysis of a file read in pieces equals that
of the file loaded whole, bit for bit. The passes: the source's opening (checks, lengths, maxima),
then the sequences' sums, the split's means and the set's :math:`y` (loaded into the array), then
the variances and :math:`y` again (:func:`~variance_lab.rollouts.pooled.pooled_fit` centres it in
place twice); the folds' sets load the same way when the judgment first asks for them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from variance_lab import corrections
from variance_lab.ratios import GSPO_RANGE, PPO_RANGE, log_clip_range, segment_split_scale
from variance_lab.rollouts.batch import TokenBatch, segment_offsets
from variance_lab.rollouts.heldout import group_folds
from variance_lab.rollouts.pairwise import INTERLEAVED, SQUARED_DEVIATION, split_sums
from variance_lab.rollouts.pooled import needs_reload, pooled_fit, set_moments, y_autocorrelation
from variance_lab.rollouts.predictions import child_seed
from variance_lab.rollouts.random_scale import SequenceStats
from variance_lab.rollouts.source import TokenSource
from variance_lab.rollouts.split import SplitSums
from variance_lab.rollouts.statistics import TokenLayout
from variance_lab.rollouts.subsample import FIT_SEQUENCES, FIT_TOKENS, sample_mask
from variance_lab.rollouts.weights import CLIP_RULE, ClipFractions

__all__ = ["ALL", "RATIO_COLUMNS", "EvalSummary", "FitSummary", "Summaries"]

#: The key of the whole batch among the sets (the folds' are ``("fold", f)`` to judge and
#: ``("rest", f)`` to fit).
ALL = "all"
#: The numerator and denominator of each ratio (:data:`~variance_lab.rollouts.split.RATIOS`).
RATIO_COLUMNS = {
    "update": ("logp", "old_logp"),
    "mismatch": ("old_logp", "rollout_logp"),
    "total": ("logp", "rollout_logp"),
}
_GMPO = corrections.parse("gmpo")


def _scale(max_abs: float, longest: int) -> float:
    return 0.0 if max_abs == 0.0 else segment_split_scale(max_abs, longest)


def _relabel(groups: np.ndarray) -> np.ndarray:
    """Return a subset's groups numbered 0 .. G-1 in their order (the subset's own group_index)."""
    return np.unique(groups, return_inverse=True)[1].astype(np.int64).ravel()


@dataclass(frozen=True, eq=False)
class EvalSummary(ClipFractions):
    """A set of sequences to judge, by what the judgment takes of them.

    The fields of :class:`~variance_lab.rollouts.weights.ClipFractions` (``length``, ``log_P``,
    ``log_G``, ``clipped_gspo``, ``n_token_clipped`` and the ranges), and ``index``: the
    sequences (of the source), in order; ``groups``: their prompts numbered in the order of the
    ids' text (:meth:`~variance_lab.rollouts.batch.TokenBatch.group_index` of the set, or of any
    set they belong to: only the order counts), None without ``prompt_id``; ``ppo_tokens`` and
    ``gmpo_tokens``: tokens outside PPO's range and GMPO's, per sequence (as floats).
    """

    index: np.ndarray
    groups: np.ndarray | None
    ppo_tokens: np.ndarray
    gmpo_tokens: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """Counted tokens per sequence."""
        return self.length


@dataclass(frozen=True, eq=False)
class FitSummary:
    """A set the models are fitted to: pooled fit, autocorrelation (or why none), CGF, fit samples."""

    fit: object
    acf: object
    acf_note: str
    cgf: object
    samples: dict = field(default_factory=dict)


class Summaries:
    """Every token sum the judgment of a source needs (module docstring), by set.

    Parameters
    ----------
    source : TokenSource
    ratio : str
        The ratio judged (:data:`RATIO_COLUMNS`).
    edges, gspo_range, ppo_range, c, seed, folds, fit_models, fit_tokens, fit_sequences
        As :func:`~variance_lab.rollouts.analysis.analyze` takes them: the folds are planned where
        ``fit_models`` and ``folds > 1`` and there are as many prompts.
    split : bool
        Also the three-policy split (the source must carry ``rollout_logp``).
    s_values : array_like of float
        Where the whole batch's CGF will be asked besides the judgment's lengths (the curves').
    cgf_values : callable, optional
        Gives the whole batch's log-ratios where they are in memory: its CGF can then be asked
        anywhere (:meth:`~variance_lab.rollouts.cgf.EmpiricalCGF.from_sums`).
    """

    def __init__(
        self,
        source: TokenSource,
        *,
        ratio: str = "update",
        edges=None,
        gspo_range=GSPO_RANGE,
        ppo_range=PPO_RANGE,
        c: float = 5.0,
        seed=0,
        folds: int = 2,
        fit_models: bool = True,
        fit_tokens: int | None = FIT_TOKENS,
        fit_sequences: int | None = FIT_SEQUENCES,
        split: bool = False,
        s_values=(),
        cgf_values=None,
    ) -> None:
        if not (isinstance(c, int | float) and c > 0):
            raise ValueError(f"c must be > 0, got {c!r}")
        self.source, self.c, self.cgf_values = source, float(c), cgf_values
        self.num, self.den = RATIO_COLUMNS[ratio]
        self.gspo_range, self.ppo_range = gspo_range, ppo_range
        self.g_range = log_clip_range(gspo_range, "gspo_range")
        self.p_range = log_clip_range(ppo_range, "ppo_range")
        T = self.T = source.lengths
        n = T.size
        self.offsets = segment_offsets(T)
        self.groups = source.group_index()
        y_col = "total" if ratio == "total" else ratio
        self.y_lo, self.y_hi = source.column(f"{y_col}_lo"), source.column(f"{y_col}_hi")
        self.y_abs = np.maximum(-self.y_lo, self.y_hi)
        self.pair_abs = np.maximum(source.column(self.num), source.column(self.den))
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        # the sets: ALL, and the folds' where the held-out judgment will run
        self.eval_index = {ALL: np.arange(n)}
        self.fit_index = {ALL: np.arange(n)}
        self.fit_seed = {ALL: child_seed(seed, 70_000)}
        n_groups = int(self.groups.max()) + 1
        self.fold = None
        if fit_models and folds > 1 and n_groups >= folds:
            self.fold = group_folds(self.groups, int(folds), ss)
            for f in range(int(folds)):
                self.eval_index[("fold", f)] = np.flatnonzero(self.fold == f)
                self.fit_index[("rest", f)] = np.flatnonzero(self.fold != f)
                self.fit_seed[("rest", f)] = child_seed(child_seed(ss, 50_000 + f), 70_000)
        self._plan_samples(fit_models, fit_tokens, fit_sequences)
        self._plan_cgf(s_values)
        self.split = SplitSums(source, edges, gspo_range=gspo_range, ppo_range=ppo_range) if split else None
        self._fits: dict = {}
        self._pass_sequences()
        self._pass_second()

    # -- planning --------------------------------------------------------------------------
    def _plan_samples(self, fit_models: bool, fit_tokens, fit_sequences) -> None:
        """Which sequences each fit set's token sample and hier sample hold (masks over the source)."""
        self.samples: dict = {}
        self.token_members: dict = {}
        self.hier: dict = {}
        if not fit_models:
            return
        unit = "prompts" if self.source.has_groups else "sequences"
        for key, index in self.fit_index.items():
            groups = _relabel(self.groups[index])
            drawn = {}
            for by, budget in (("tokens", fit_tokens), ("sequences", fit_sequences)):
                mask, counts = sample_mask(groups, self.T[index], budget, by=by, seed=self.fit_seed[key])
                members = index if mask is None else index[mask]
                drawn[by] = (members, counts.with_sample(None, unit))
            self.samples[key] = drawn
            members = drawn["tokens"][0]
            self.token_members[key] = {"index": members, "parts": []}
            q = drawn["sequences"][0]
            self.hier[key] = {
                "index": q,
                "scale": _scale(float(self.y_abs[q].max()), int(self.T[q].max())),
                "ybar": np.empty(q.size),
                "dmax": np.empty(q.size),
                "S": np.empty(q.size),
            }

    def _plan_cgf(self, s_values) -> None:
        """Where each fit set's CGF will be asked: the lengths judged by it (and ``s_values`` for ALL)."""
        self.s_values = {}
        for key in self.fit_index:
            judged = ALL if key == ALL else ("fold", key[1])
            a = 1.0 / np.unique(self.T[self.eval_index[judged]]).astype(np.float64)
            extra = np.asarray(s_values, dtype=np.float64) if key == ALL else np.zeros(0)
            self.s_values[key] = np.concatenate([[1.0, 2.0], a, 2.0 * a, extra])

    def _positions(self, index: np.ndarray) -> np.ndarray:
        """Each sequence of ``index``'s place in the set (-1 for the source's other sequences)."""
        out = np.full(self.T.size, -1, dtype=np.int64)
        out[index] = np.arange(index.size)
        return out

    # -- the passes ------------------------------------------------------------------------
    def _pass_sequences(self) -> None:
        """Pass 1: per-sequence sums and counts, the split's means, the samples, the whole batch's y."""
        n = self.T.size
        self.counts = {k: np.empty(n) for k in ("ppo_rule", "ppo", "gmpo")}
        self.log_P = {key: np.empty(index.size) for key, index in self.eval_index.items()}
        eval_at = {key: self._positions(index) for key, index in self.eval_index.items()}
        eval_scale = {
            key: _scale(float(self.pair_abs[index].max()), 2 * int(self.T[index].max()))
            for key, index in self.eval_index.items()
        }
        hier_at = {key: self._positions(h["index"]) for key, h in self.hier.items()}
        token_in = {key: np.isin(np.arange(n), t["index"]) for key, t in self.token_members.items()}
        self.digests = [] if not self.source.has_groups else None
        self.h = np.empty(int(self.offsets[-1]))
        self.p = np.empty(self.h.size, dtype=np.int64) if self.source.has_holes else None
        for first, piece in self.source.pieces():
            k = len(piece)
            off = piece.offsets
            num, den = getattr(piece, self.num), getattr(piece, self.den)
            y = num - den
            span = slice(int(self.offsets[first]), int(self.offsets[first + k]))
            self.h[span] = y
            if self.p is not None:
                self.p[span] = piece.positions
            for key, at in eval_at.items():
                local = np.flatnonzero(at[first : first + k] >= 0)
                if local.size:
                    sums = split_sums(num, den, off, local, eval_scale[key], mode=INTERLEAVED)
                    self.log_P[key][at[first + local]] = sums
            starts = off[:-1]
            ppo_rule = CLIP_RULE.outside(y, *self.p_range)
            ppo = (y < self.p_range[0]) | (y > self.p_range[1])
            gmpo = corrections.apply_tokens(_GMPO, y)[1]
            for name, flags in (("ppo_rule", ppo_rule), ("ppo", ppo), ("gmpo", gmpo)):
                self.counts[name][first : first + k] = np.add.reduceat(flags.astype(np.int64), starts)
            for key, h in self.hier.items():
                local = np.flatnonzero(hier_at[key][first : first + k] >= 0)
                if local.size:
                    ybar = split_sums(y, None, off, local, h["scale"]) / np.diff(off)[local].astype(
                        np.float64
                    )
                    h["ybar"][hier_at[key][first + local]] = ybar
                    centre = np.zeros(k)
                    centre[local] = ybar
                    dev2 = (y - np.repeat(centre, np.diff(off))) ** 2
                    h["dmax"][hier_at[key][first + local]] = np.maximum.reduceat(dev2, starts)[local]
            for key, t in self.token_members.items():
                local = np.flatnonzero(token_in[key][first : first + k])
                if local.size:
                    t["parts"].append(_sample_part(piece, num, den, local))
            if self.digests is not None:
                self.digests.extend(_digests(num, den, off))
            if self.split is not None:
                self.split.first(first, piece)
        for h in self.hier.values():
            h["scale2"] = _scale(float(h["dmax"].max()), int(self.T[h["index"]].max()))

    def _pass_second(self) -> None:
        """Pass 2: the split's variances, the hier samples' sums of squares, and the whole batch's fit."""
        key = ALL
        index = self.fit_index[key]
        moments = (
            set_moments(self.h, float(self.y_abs.max()), self.s_values[key]) if self.h.size >= 2 else None
        )
        layout = TokenLayout(self.offsets, self.source.spans, self.p)
        acf, note = (None, "")
        if moments is not None:
            acf, note = y_autocorrelation(self.h, layout, moments, c=self.c)
        hier_at = {k: self._positions(h["index"]) for k, h in self.hier.items()}
        reload = moments is not None and needs_reload(layout, moments)
        if self.split is not None or self.hier or reload:
            for first, piece in self.source.pieces():
                k = len(piece)
                off = piece.offsets
                num, den = getattr(piece, self.num), getattr(piece, self.den)
                y = num - den
                if reload:
                    self.h[int(self.offsets[first]) : int(self.offsets[first + k])] = y
                for hk, h in self.hier.items():
                    local = np.flatnonzero(hier_at[hk][first : first + k] >= 0)
                    if local.size:
                        at = hier_at[hk][first + local]
                        h["S"][at] = split_sums(
                            y, None, off, local, h["scale2"], mode=SQUARED_DEVIATION, centres=h["ybar"][at]
                        )
                if self.split is not None:
                    self.split.second(first, piece)
        self._fits[key] = self._finish(key, index, self.h, layout, moments, acf, note)
        if self.fold is None:
            self.h = self.p = None  # else the folds load their sets into the same arrays

    def _finish(self, key, index, h, layout, moments, acf, note) -> FitSummary:
        if moments is None:
            raise ValueError("fit_log_ratios needs at least two tokens")
        y_constant = float(self.y_lo[index].min()) == float(self.y_hi[index].max())
        fit = pooled_fit(h, layout, moments, acf, c=self.c, y_constant=y_constant)
        cgf = moments.cgf(self.cgf_values if key == ALL else None)
        samples = {}
        if key in self.samples:
            members, tokens = self.samples[key]["tokens"]
            batch = _sample_batch(self.token_members[key]["parts"], self.source, members)
            samples["tokens"] = tokens.with_sample(batch, tokens.unit)
            _, seqs = self.samples[key]["sequences"]
            hq = self.hier[key]
            stats = SequenceStats(self.T[hq["index"]].astype(np.float64), hq["ybar"], hq["S"])
            samples["sequences"] = seqs.with_sample(stats, seqs.unit)
        return FitSummary(fit, acf, note, cgf, samples)

    def _load_rest(self) -> None:
        """Fit the folds' sets (each the other folds): y loaded, fitted, loaded again (module docstring)."""
        keys = [k for k in self.fit_index if k != ALL]
        sizes = [int(self.T[self.fit_index[k]].sum()) for k in keys]
        loads = [keys] if len(keys) == 2 else [[k] for k in keys]  # two folds: the two sets share the array
        for load in loads:
            at = {k: self._positions(self.fit_index[k]) for k in load}
            base, total = {}, 0
            for k in load:
                base[k] = total
                total += sizes[keys.index(k)]
            h = self.h[:total]  # the whole batch's array, done with: every fit set is smaller or as big
            p = None if self.p is None else self.p[:total]
            offs = {k: segment_offsets(self.T[self.fit_index[k]]) + base[k] for k in load}
            self._fill(load, at, offs, h, p)
            state = {}
            for k in load:
                index = self.fit_index[k]
                part = h[base[k] : base[k] + sizes[keys.index(k)]]
                lay = TokenLayout(
                    offs[k] - base[k],
                    self.source.spans[index],
                    None if p is None else p[base[k] : base[k] + sizes[keys.index(k)]],
                )
                moments = (
                    set_moments(part, float(self.y_abs[index].max()), self.s_values[k])
                    if part.size >= 2
                    else None
                )
                acf, note = (None, "") if moments is None else y_autocorrelation(part, lay, moments, c=self.c)
                state[k] = (part, lay, moments, acf, note)
            if any(m is not None and needs_reload(lay, m) for _, lay, m, _, _ in state.values()):
                self._fill(load, at, offs, h, None)
            for k in load:
                part, lay, moments, acf, note = state[k]
                self._fits[k] = self._finish(k, self.fit_index[k], part, lay, moments, acf, note)
        self.h = self.p = None

    def _fill(self, load, at, offs, h, p) -> None:
        """Read the source once, putting each set's y (and positions) in its place in ``h``."""
        for first, piece in self.source.pieces():
            k = len(piece)
            y = getattr(piece, self.num) - getattr(piece, self.den)
            off = piece.offsets
            for key in load:
                local = np.flatnonzero(at[key][first : first + k] >= 0)
                if not local.size:
                    continue
                pos = at[key][first + local]
                for i, j in zip(local.tolist(), pos.tolist(), strict=True):
                    h[offs[key][j] : offs[key][j + 1]] = y[off[i] : off[i + 1]]
                    if p is not None:
                        p[offs[key][j] : offs[key][j + 1]] = piece.positions[off[i] : off[i + 1]]

    # -- the results -----------------------------------------------------------------------
    def eval_set(self, key) -> EvalSummary:
        """Return the set ``key`` (:data:`ALL` or ``("fold", f)``) as the judgment takes it."""
        index = self.eval_index[key]
        T = self.T[index]
        log_P = self.log_P[key]
        log_G = log_P / T
        return EvalSummary(
            index=index,
            length=T,
            groups=self.groups[index] if self.source.has_groups else None,
            log_P=log_P,
            log_G=log_G,
            clipped_gspo=CLIP_RULE.outside(log_G, *self.g_range),
            n_token_clipped=self.counts["ppo_rule"][index].astype(np.int64),
            ppo_tokens=self.counts["ppo"][index],
            gmpo_tokens=self.counts["gmpo"][index],
            gspo_range=tuple(float(v) for v in self.gspo_range),
            ppo_range=tuple(float(v) for v in self.ppo_range),
        )

    def fit_set(self, key) -> FitSummary:
        """Return the set ``key`` (:data:`ALL` or ``("rest", f)``) the models are fitted to."""
        if key not in self._fits:
            self._load_rest()
        return self._fits[key]

    @property
    def has_groups(self) -> bool:
        """True when the sequences carry ``prompt_id``."""
        return self.source.has_groups

    def group_index(self) -> np.ndarray:
        """Return each sequence's group (:meth:`~variance_lab.rollouts.batch.TokenBatch.group_index`)."""
        return self.groups

    def n_identical(self) -> int | None:
        """Count sequences repeating an earlier one's log-probs (as TokenBatch.n_identical; None: grouped)."""
        if self.digests is None:
            return None
        seen, count = set(), 0
        for d in self.digests:
            count += d in seen
            seen.add(d)
        return count


def _digests(num: np.ndarray, den: np.ndarray, off: np.ndarray) -> list[bytes]:
    """Per sequence, a digest of its two arrays' bytes (equal sequences, equal digests)."""
    out = []
    for a, b in zip(off[:-1].tolist(), off[1:].tolist(), strict=True):
        h = hashlib.blake2b(digest_size=20)
        h.update(num[a:b].tobytes())
        h.update(den[a:b].tobytes())
        out.append(h.digest())
    return out


def _sample_part(piece: TokenBatch, num, den, local: np.ndarray) -> tuple:
    """Return the sequences ``local`` of a piece as the ratio's batch holds them (and their lengths)."""
    off = piece.offsets
    lens = np.diff(off)[local]
    tok = np.concatenate([np.arange(off[i], off[i + 1]) for i in local.tolist()])
    return num[tok], den[tok], piece.positions[tok], lens


def _sample_batch(parts: list, source: TokenSource, members: np.ndarray) -> TokenBatch:
    """Return the token sample's batch (the sequences ``members``): the ratio's batch, selected."""
    num, den, positions, lens = (np.concatenate([p[k] for p in parts]) for k in range(4))
    batch = TokenBatch(
        logp=num,
        old_logp=den,
        offsets=segment_offsets(lens),
        positions=positions,
        ids=source.ids[members].copy(),
        dropped=source.dropped,
        prompt_id=None if source.prompt_id is None else source.prompt_id[members].copy(),
        notes=source.notes,
    )
    for a in batch.arrays():
        a.setflags(write=False)
    return batch
