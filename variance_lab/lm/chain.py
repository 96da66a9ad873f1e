r"""A policy that learns across updates: one AdamW optimizer whose moments persist.

A trainer does not build a new optimizer for each step. Adam's first step moves every weight
by about the learning rate times the sign of its gradient (the bias-corrected moments are
:math:`\hat m_1 = g_1`, :math:`\hat v_1 = g_1^2`, so the step is
:math:`-\eta\, g_1 / (|g_1| + \epsilon)`), the largest per-weight step it ever takes; from
the second step on the moments average the gradients,

.. math::

    m_k = \beta_1 m_{k-1} + (1 - \beta_1) g_k, \qquad v_k = \beta_2 v_{k-1} + (1 - \beta_2) g_k^2,

    \theta_k = \theta_{k-1} - \eta\, \frac{m_k / (1 - \beta_1^k)}{\sqrt{v_k / (1 - \beta_2^k)} + \epsilon},

and noisy gradients that change sign make :math:`|\hat m_k| / \sqrt{\hat v_k}` smaller than 1.
:class:`PolicyChain` holds the float32 trainer and one :class:`torch.optim.AdamW` (no weight
decay) across its updates; :meth:`PolicyChain.step` takes update :math:`k` on a batch with
the loss of :func:`~variance_lab.lm.losses.aggregated_loss`, and :meth:`PolicyChain.fork`
copies the trainer and the optimizer's state, so a learning rate can be tried on update
:math:`k` without touching the chain (the calibration, :mod:`variance_lab.lm.paired`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from variance_lab._validate import check_positive
from variance_lab.lm.losses import AGGREGATIONS, CLIP, aggregated_loss
from variance_lab.lm.scoring import response_log_probs

__all__ = ["PolicyChain"]


class PolicyChain:
    """The trainer and its persistent AdamW optimizer.

    Parameters
    ----------
    model : torch.nn.Module
        The float32 policy to start from (copied; left unchanged).
    aggregation : {"gspo", "token-mean", "seq-mean-token-mean"}
        The loss of every update.
    lr : float
        AdamW's learning rate (no weight decay, PyTorch's default betas and eps).
    score_batch : int, optional
        Sequences per forward and backward pass (the gradient is the whole batch's).

    Attributes
    ----------
    model : torch.nn.Module
        The current policy, in ``eval()`` mode between updates.
    updates : int
        Updates taken so far.
    """

    def __init__(self, model, *, aggregation: str, lr: float, score_batch: int = 8):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        check_positive("lr", lr)
        if isinstance(score_batch, bool) or not isinstance(score_batch, int) or score_batch < 1:
            raise ValueError(f"score_batch must be an integer >= 1, got {score_batch!r}")
        self.model = copy.deepcopy(model).eval()
        self.aggregation, self.score_batch = aggregation, score_batch
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.updates = 0

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of the next updates (the moments are kept)."""
        check_positive("lr", lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def describe(self) -> dict:
        """Return the sidecar's ``optimizer`` entry: name, persistence, updates so far, rate, settings.

        Returns
        -------
        dict
        """
        group = self.optimizer.param_groups[0]
        return {
            "name": "AdamW",
            "persistent": True,
            "update": self.updates,
            "lr": self.lr,
            "betas": list(group["betas"]),
            "eps": group["eps"],
            "weight_decay": group["weight_decay"],
        }

    def step(self, prompts, responses, old_logp, advantages) -> None:
        r"""Take the next update on a batch (in place): accumulate the batch's gradient, one AdamW step.

        Parameters
        ----------
        prompts, responses : list of list of int
        old_logp : list of numpy.ndarray
            The current policy's log-probs of the responses (the ratios' denominators).
        advantages : numpy.ndarray
            One per sequence.
        """
        if not len(prompts) == len(responses) == len(old_logp) == len(advantages):
            raise ValueError("prompts, responses, old_logp and advantages need one entry per sequence")
        model = self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(len(r) for r in responses)
        for lo in range(0, len(prompts), self.score_batch):
            sl = slice(lo, lo + self.score_batch)
            lp = response_log_probs(model, prompts[sl], responses[sl])
            old = [torch.from_numpy(np.asarray(o, dtype=float)) for o in old_logp[sl]]
            loss = aggregated_loss(
                self.aggregation,
                lp,
                old,
                np.asarray(advantages)[sl],
                n_sequences=len(prompts),
                n_tokens=n_tokens,
                clip=CLIP[self.aggregation],
            )
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.updates += 1

    def fork(self, lr: float | None = None) -> PolicyChain:
        """Return an independent copy (trainer and optimizer state), optionally with another learning rate.

        Parameters
        ----------
        lr : float, optional

        Returns
        -------
        PolicyChain
        """
        other = copy.copy(self)
        other.model = copy.deepcopy(self.model)
        other.optimizer = torch.optim.AdamW(other.model.parameters(), lr=self.lr, weight_decay=0.0)
        other.optimizer.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
        if lr is not None:
            other.set_lr(lr)
        return other
