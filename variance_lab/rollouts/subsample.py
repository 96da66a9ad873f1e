r"""The stated subsamples the model fits of :func:`~variance_lab.rollouts.analysis.analyze` see.

The ``mix`` model (EM on the pooled token log-ratios, :mod:`~variance_lab.rollouts.mixture`) and
``comb``'s token mixture (:mod:`~variance_lab.rollouts.combined`) cost a few passes over every
token per EM step, and the ``hier`` likelihood (:mod:`~variance_lab.rollouts.random_scale`) a
quadrature per sequence per step: on a framework's dump of :math:`10^7` tokens they were nearly
all of ``analyze``'s time (issue #36). :func:`fit_sample` gives them random samples of whole
prompts (of sequences, without ``prompt_id``) instead: about :data:`FIT_TOKENS` tokens for the
token mixtures, about :data:`FIT_SEQUENCES` sequences for ``hier``. Every other number of
``analyze`` (the buckets and their intervals, the pooled fit, the autocorrelation, the empirical
CGF, the clip fractions) still uses every sequence.

How a sample is drawn. The prompts are put in a random order (a permutation from the seed)
and taken in that order, with all their responses, up to and including the first prompt that
brings the total (tokens, or sequences) to the budget; the chosen sequences keep their order in
the batch. Both samples take the same order, so the smaller is the start of the larger. The
stopping rule looks at lengths only, never at the log-ratios, so a sample is a random sample of
prompts for every statistic of the tokens given their lengths, and a fit to it is an ordinary
fit to :math:`n` prompts: its standard errors (the scores' outer product of ``mix``, the inverse
Hessian of ``hier``) are those of the sample, wider than a fit to everything would have, by
about :math:`\sqrt{N_{all} / N_{sample}}`. ``tests/rollouts/test_subsample.py`` checks the
coverage of the ``mix`` intervals fitted to such samples with a binomial test over seeds.

A batch within a budget is its own sample: nothing is drawn, and the fit is that of all of it
(the data files shipped with the project, at most 171,000 tokens and 2,048 sequences, all are).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from variance_lab.rollouts.batch import TokenBatch

__all__ = ["FIT_SEQUENCES", "FIT_TOKENS", "SAMPLE_BY", "FitSample", "fit_sample", "sample_mask"]

#: Tokens the token-mixture fits of ``analyze`` see at most (about; whole prompts): 2^18.
FIT_TOKENS = 1 << 18

#: Sequences the ``hier`` fit of ``analyze`` sees at most (about; whole prompts): 2^11.
FIT_SEQUENCES = 1 << 11

#: What a budget counts, and the fits each sample is for.
SAMPLE_BY = {"tokens": "the token-mixture fits (mix, comb)", "sequences": "the hier fit"}


@dataclass(frozen=True, eq=False)
class FitSample:
    """The sequences a fit sees (:func:`fit_sample`), and what they are a sample of.

    Attributes
    ----------
    batch : TokenBatch
        The sample (the batch itself when nothing was drawn); for the ``hier`` sample of the
        streaming analysis its :class:`~variance_lab.rollouts.random_scale.SequenceStats`.
    n_sequences, n_tokens, n_groups : int
        Its sequences, tokens and prompts (sequences, without ``prompt_id``).
    of_sequences, of_tokens, of_groups : int
        The same counts of the batch it was drawn from.
    unit : str
        ``"prompts"`` or ``"sequences"``: what was sampled.
    budget : int or None
        The budget (None: no budget, everything).
    by : str
        What the budget counts, a key of :data:`SAMPLE_BY`.
    """

    batch: TokenBatch
    n_sequences: int
    n_tokens: int
    n_groups: int
    of_sequences: int
    of_tokens: int
    of_groups: int
    unit: str
    budget: int | None
    by: str = "tokens"

    def with_sample(self, batch, unit: str) -> FitSample:
        """Return these counts with the sample itself (a batch, or what a fit takes instead) and the unit."""
        return replace(self, batch=batch, unit=unit)

    @property
    def subsampled(self) -> bool:
        """True when the fit sees fewer sequences than the batch holds."""
        return self.n_sequences < self.of_sequences

    def describe(self) -> str:
        """Return one sentence naming the sample: its size and how it was drawn."""
        fits = SAMPLE_BY[self.by]
        if not self.subsampled:
            return f"{fits} use all {self.of_sequences:,} sequences ({self.of_tokens:,} tokens)"
        return (
            f"{fits} use a random sample of {self.n_groups:,} of {self.of_groups:,} {self.unit} "
            f"({self.n_sequences:,} of {self.of_sequences:,} sequences, {self.n_tokens:,} of "
            f"{self.of_tokens:,} tokens): {self.unit} in a seeded random order, whole, until "
            f"{self.budget:,} {self.by}; standard errors are the sample's"
        )

    def summary(self) -> dict:
        """Return the sample's counts and description as JSON-ready values."""
        return {
            "subsampled": self.subsampled,
            "unit": self.unit,
            "n_sequences": self.n_sequences,
            "n_tokens": self.n_tokens,
            "n_groups": self.n_groups,
            "of_sequences": self.of_sequences,
            "of_tokens": self.of_tokens,
            "of_groups": self.of_groups,
            "budget": self.budget,
            "by": self.by,
            "drawn": self.describe(),
        }


def fit_sample(
    batch: TokenBatch, budget: int | None = FIT_TOKENS, *, by: str = "tokens", seed=0
) -> FitSample:
    """Return a random sample of whole prompts of ``batch`` of about ``budget`` tokens or sequences.

    The module docstring says how it is drawn.

    Parameters
    ----------
    batch : TokenBatch
    budget : int or None
        The budget, >= 1; None, or a batch within it: the batch itself.
    by : {"tokens", "sequences"}
        What ``budget`` counts.
    seed : int or numpy.random.SeedSequence
        Seed of the prompts' random order.

    Returns
    -------
    FitSample
    """
    unit = "prompts" if batch.has_groups else "sequences"
    chosen, drawn = sample_mask(batch.group_index(), batch.lengths, budget, by=by, seed=seed)
    sample = batch if chosen is None else batch.select(chosen)
    return drawn.with_sample(sample, unit)


def sample_mask(groups, lengths, budget: int | None, *, by: str = "tokens", seed=0):
    """Return which sequences :func:`fit_sample` draws (None: all) and the sample's counts, without the batch.

    ``groups`` numbers the sequences' prompts 0 .. G-1 (as
    :meth:`~variance_lab.rollouts.batch.TokenBatch.group_index`),
    ``lengths`` their tokens: what the draw looks at. The counts come as a :class:`FitSample` without
    its batch (:meth:`FitSample.with_sample` sets it); the streaming analysis reads the chosen
    sequences itself.

    Returns
    -------
    (ndarray of bool or None, FitSample)
    """
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 1
    ):
        raise ValueError(f"budget must be an integer >= 1 or None, got {budget!r}")
    if by not in SAMPLE_BY:
        raise ValueError(f"by must be one of {tuple(SAMPLE_BY)}, got {by!r}")
    lengths = np.asarray(lengths, dtype=np.int64)
    n_groups = int(groups.max()) + 1
    whole = (lengths.size, int(lengths.sum()), n_groups)
    size = whole[1] if by == "tokens" else whole[0]
    if budget is None or size <= budget:
        return None, FitSample(None, *whole, *whole, "", None if budget is None else int(budget), by)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_groups)
    weights = lengths if by == "tokens" else None
    counts = np.bincount(groups, weights=weights, minlength=n_groups)[order]
    taken = order[: int(np.searchsorted(np.cumsum(counts), budget)) + 1]
    chosen = np.zeros(n_groups, dtype=bool)
    chosen[taken] = True
    mask = chosen[groups]
    drawn = (int(mask.sum()), int(lengths[mask].sum()), int(taken.size))
    return mask, FitSample(None, *drawn, *whole, "", int(budget), by)
