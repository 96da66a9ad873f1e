r"""Policy-gradient losses under three aggregations, and GRPO group advantages.

A batch holds :math:`G` sequences; sequence :math:`i` has :math:`T_i` response tokens, an
advantage :math:`A_i`, and per-token log-ratios
:math:`d_{it} = \log \pi_\theta(y_{it}) - \log \pi_{\text{old}}(y_{it})`, token ratios
:math:`r_{it} = e^{d_{it}}`. With the clipped surrogate
:math:`f(w, A) = \min\bigl(w A, \operatorname{clip}(w, 1 - \varepsilon_l, 1 + \varepsilon_h) A\bigr)`:

- **GSPO** (sequence level, its :math:`1/T` weight):
  :math:`s_i = \exp\bigl(\tfrac{1}{T_i} \sum_t d_{it}\bigr)`,

  .. math:: L = -\frac{1}{G} \sum_i f(s_i, A_i), \qquad
            \frac{\partial L}{\partial \log \pi_\theta(y_{it})} = -\frac{A_i s_i}{G T_i}
            \ \text{(unclipped)}.

- **token-mean** (DAPO): every token weighs the same,

  .. math:: L = -\frac{1}{\sum_i T_i} \sum_i \sum_t f(r_{it}, A_i), \qquad
            \frac{\partial L}{\partial \log \pi_\theta(y_{it})} = -\frac{A_i r_{it}}{\sum_j T_j}.

- **seq-mean-token-mean** (GRPO): the mean over a sequence's tokens, then over sequences,

  .. math:: L = -\frac{1}{G} \sum_i \frac{1}{T_i} \sum_t f(r_{it}, A_i), \qquad
            \frac{\partial L}{\partial \log \pi_\theta(y_{it})} = -\frac{A_i r_{it}}{G T_i}.

Where the clip is active (:math:`w A` above the clipped value), the gradient is 0. At
:math:`\theta = \theta_{\text{old}}` GSPO and seq-mean-token-mean give the same gradient.
The normalisers :math:`G` and :math:`\sum_i T_i` are those of the whole batch, passed in, so
a batch split into minibatches accumulates the full batch's gradient.

The GSPO objective and the clipped surrogate are the arithmetic experiment's
(:func:`variance_lab.experiment.train.gspo_surrogate`,
:func:`~variance_lab.experiment.train.clipped_surrogate`: a weight exactly at a bound is not
clipped); the clip widths are :mod:`variance_lab.ratios.defaults`'.

Advantages (:func:`variance_lab.ratios.group_advantages` with :data:`ADVANTAGE_EPS`,
:data:`ADVANTAGE_DDOF`): :math:`A_i = (R_i - \bar R_g) / (s_g + 10^{-6})`, :math:`\bar R_g` and
:math:`s_g` the mean and standard deviation (``ddof=1``, as ``torch.std``) of the rewards of
sequence :math:`i`'s group :math:`g` (the responses to one prompt); a group whose rewards are all
equal gets 0.
"""

from __future__ import annotations

import torch

from variance_lab.experiment.train import clipped_surrogate, gspo_surrogate
from variance_lab.ratios import DAPO_EPS, GSPO_EPS, PPO_EPS

__all__ = ["ADVANTAGE_DDOF", "ADVANTAGE_EPS", "AGGREGATIONS", "CLIP", "aggregated_loss"]

#: The loss aggregations by name.
AGGREGATIONS = ("gspo", "token-mean", "seq-mean-token-mean")
#: Default clip range (eps_low, eps_high) per aggregation: GSPO's paper values; DAPO's clip-higher
#: for token-mean; PPO's 0.2 for GRPO's seq-mean-token-mean.
CLIP = {"gspo": GSPO_EPS, "token-mean": DAPO_EPS, "seq-mean-token-mean": PPO_EPS}
#: The SmolLM2 experiment's group advantages (:func:`variance_lab.ratios.group_advantages`):
#: the standard deviation with ``ddof=1`` (as ``torch.std``), plus :math:`10^{-6}`.
ADVANTAGE_EPS = 1e-6
ADVANTAGE_DDOF = 1


def aggregated_loss(
    aggregation: str,
    logp: list[torch.Tensor],
    old_logp: list[torch.Tensor],
    advantages,
    *,
    n_sequences: int,
    n_tokens: int,
    clip: tuple[float, float] | None = None,
) -> torch.Tensor:
    r"""Return the loss of a minibatch, normalised by the whole batch's sizes (the module's formulas).

    Parameters
    ----------
    aggregation : {"gspo", "token-mean", "seq-mean-token-mean"}
    logp : list of torch.Tensor
        Per-sequence token log-probs under the current policy (with gradients).
    old_logp : list of torch.Tensor
        The same under the old policy (no gradients needed).
    advantages : array_like
        One per sequence.
    n_sequences : int
        :math:`G` of the whole batch.
    n_tokens : int
        :math:`\sum_i T_i` of the whole batch.
    clip : (float, float), optional
        :math:`(\varepsilon_l, \varepsilon_h)`; default :data:`CLIP`'s.

    Returns
    -------
    torch.Tensor
        A scalar; summing it over the minibatches of a batch gives the batch's :math:`L`.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if len(logp) != len(old_logp) or len(logp) != len(advantages):
        raise ValueError("logp, old_logp and advantages need one entry per sequence")
    if n_sequences < 1 or n_tokens < 1:
        raise ValueError(f"n_sequences and n_tokens must be >= 1, got {n_sequences}, {n_tokens}")
    eps = CLIP[aggregation] if clip is None else clip
    total = logp[0].new_zeros(())
    for lp, old, a in zip(logp, old_logp, advantages, strict=True):
        d = lp - old.to(lp.dtype)
        adv = torch.as_tensor(float(a), dtype=lp.dtype)
        if aggregation == "gspo":
            total = total - gspo_surrogate(d.mean(), adv, eps) / n_sequences
        elif aggregation == "token-mean":
            total = total - clipped_surrogate(d.exp(), adv, eps).sum() / n_tokens
        else:
            total = total - clipped_surrogate(d.exp(), adv, eps).mean() / n_sequences
    return total
