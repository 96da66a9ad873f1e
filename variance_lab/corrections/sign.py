r"""Weights that depend on the sign of the advantage: TOPR and DeepSeek-V3.2's off-policy sequence mask.

Both act on the sequence ratio :math:`P_T = \prod_t r_t` and treat a sequence by the sign of its
advantage :math:`A` (positive: :math:`A \ge 0`, as both sources write it):

- ``topr[:P]`` (Tapered Off-Policy REINFORCE, Le Roux et al. 2025, arXiv 2503.14286, its update
  :math:`\nabla J = \sum_{R \ge 0} \mu R \nabla\log\pi + \sum_{R < 0} \mu\,[\pi/\mu]_0^1 R \nabla\log\pi`,
  the weight stop-gradiented): :math:`w = 1` when :math:`A \ge 0` (no importance ratio at all) and
  :math:`w = \min(P_T, 1)` when :math:`A < 0` (truncated at 1). Modified: a negative sequence
  with :math:`P_T > 1`; the positive side drops the ratio by design, which is not counted.
- ``opsm:DELTA[:P]`` (DeepSeek-V3.2's off-policy sequence masking; TRL 1.16.0's
  ``GRPOTrainer.get_off_policy_mask``, mirrored in :func:`variance_lab.frameworks.trl.get_off_policy_mask`):
  :math:`w = P_T\,M`, where the sequence is masked (:math:`M = 0`) when :math:`A < 0` and its mean
  :math:`\frac1T\sum_t \log(\mu_t/\pi_t) = -\log G_T` exceeds :math:`\delta`; a mean equal to
  :math:`\delta` is kept (:data:`OPSM_RULE`, :func:`opsm_keep`, the one rule both use).

``P`` is the model's :math:`p = P(A \ge 0)` (default
:data:`~variance_lab.corrections.specs.SIGN_P_DEFAULT`): the theory takes the sign independent
of the ratios, so every moment splits by sign,

.. math::

    E[w^j] = p\,E[w_+^j] + (1 - p)\,E[w_-^j], \qquad
    \operatorname{Var}(w) = E[w^2] - E[w]^2,

and each conditional moment is the truncated-lognormal closed form of
:mod:`variance_lab.corrections.gauss` for :math:`\log P_T \sim N(Tm, Tv)`:
TOPR's :math:`E[\min(P_T,1)^j] = e^{jM + j^2S^2/2}\Phi(-(M + jS^2)/S) + \bar\Phi(-M/S)`,
OPSM's :math:`E[P_T^j 1\{\log P_T \ge -T\delta\}] = e^{jM + j^2S^2/2}\bar\Phi((-T\delta - M - jS^2)/S)`
and masked fraction :math:`\Phi((-T\delta - M)/S)`. The bias is against the importance-sampling
target :math:`E[P_T] = e^{M + S^2/2}`, by sign and overall. On data the sign is each sequence's own
advantage (:func:`apply_signed`), and ``P`` is not used.

ASPO (arXiv 2510.06062: the token ratio of positive-advantage tokens flipped, with a soft dual
clip) is not here: its exact rule could not be confirmed from the paper's text in this work.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections.gauss import log_frac_out, log_moment
from variance_lab.corrections.specs import Correction
from variance_lab.ratios import CLOSED, BoundRule

__all__ = [
    "OPSM_RULE",
    "SIGNS",
    "TOPR_RULE",
    "apply_signed",
    "opsm_keep",
    "sign_label",
    "sign_log_moments",
]

_INF = math.inf

#: The rows of a sign-dependent spec: every sequence, the positive (A >= 0), the negative (A < 0).
SIGNS = ("all", "A>=0", "A<0")
#: DeepSeek-V3.2's off-policy mask as TRL applies it: the mean log-ratio against delta as it is, a
#: mean equal to delta kept.
OPSM_RULE = BoundRule(CLOSED, "value", "float64")
#: TOPR's truncation of a negative sequence's :math:`P_T` at 1: :math:`\log P_T` against 0, a
#: weight exactly at 1 kept (not counted as modified).
TOPR_RULE = BoundRule(CLOSED, "log", "float64")


def sign_label(c: Correction, sign: str) -> str:
    """Return the ``correction`` label of one sign's row: the spec itself for ``"all"``."""
    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {SIGNS}, got {sign!r}")
    return c.spec if sign == "all" else f"{c.spec} [{sign}]"


def opsm_keep(advantage, mean_log_ratio, delta: float, rule: BoundRule = OPSM_RULE) -> np.ndarray:
    r"""Return where DeepSeek-V3.2's off-policy mask keeps a sequence: A >= 0 or mean :math:`\le \delta`.

    Parameters
    ----------
    advantage : array_like
        Each sequence's advantage.
    mean_log_ratio : array_like
        Each sequence's mean :math:`\log(\pi_{sampler}/\pi_\theta)` over its tokens (TRL's
        ``sampling_per_token_logps - per_token_logps``); broadcast against ``advantage``.
    delta : float
    rule : BoundRule, default :data:`OPSM_RULE`
        The comparison of the mean with :math:`\delta` (a framework's convention: TRL on float32
        tensors compares in float32, :data:`variance_lab.frameworks.trl.OFF_POLICY_F32_RULE`).
    """
    adv = np.asarray(advantage, dtype=float)
    return (adv >= 0) | ~rule.outside(mean_log_ratio, None, delta)


def apply_signed(c: Correction, log_p, T, positive) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a sign-dependent correction's weights from :math:`\log P_T` and each sequence's sign.

    Parameters
    ----------
    c : Correction
        ``topr`` or ``opsm``.
    log_p : ndarray
        :math:`\log P_T` of each sequence.
    T : int or ndarray
        Each sequence's length (OPSM's mean log-ratio is :math:`-\log P_T / T`).
    positive : ndarray of bool
        True where the sequence's advantage is :math:`\ge 0`.

    Returns
    -------
    (w, modified) : tuple of ndarray
        TOPR: 1 (positive) or :math:`\min(P_T, 1)`, modified where a negative :math:`P_T > 1`;
        OPSM: :math:`P_T`, or 0 where masked (modified).
    """
    log_p = np.asarray(log_p, dtype=float)
    pos = np.broadcast_to(np.asarray(positive, dtype=bool), log_p.shape)
    if c.kind == "topr":
        over = ~pos & TOPR_RULE.outside(log_p, None, 0.0)
        return np.where(pos, 1.0, np.exp(np.minimum(log_p, 0.0))), over
    if c.kind == "opsm":
        T = np.asarray(T, dtype=float)
        masked = ~opsm_keep(np.where(pos, 0.0, -1.0), -log_p / T, c.params[0])
        return np.where(masked, 0.0, np.exp(np.where(masked, 0.0, log_p))), masked
    raise ValueError(f"{c.spec!r} does not depend on the advantage's sign")


def _side(c: Correction, T: float, positive: bool) -> tuple[list, float, float]:
    """Return the pieces ``(a, b, log c, p)`` of one sign's weight on log P_T, and its kept band."""
    if c.kind == "topr":
        if positive:
            return [(-_INF, _INF, 0.0, 0.0)], -_INF, _INF
        return [(-_INF, 0.0, 0.0, 1.0), (0.0, _INF, 0.0, 0.0)], -_INF, 0.0
    if positive:
        return [(-_INF, _INF, 0.0, 1.0)], -_INF, _INF
    lo = -T * c.params[0]  # masked when -log P_T / T > delta, i.e. log P_T < -T delta
    return [(lo, _INF, 0.0, 1.0)], lo, _INF


def sign_log_moments(c: Correction, m: float, v: float, T: float) -> dict:
    r"""Return, per sign of :data:`SIGNS`, (log E[w], log E[w^2], log frac_modified, log E[P_T]).

    Token log-ratios i.i.d. :math:`N(m, v)`, so :math:`\log P_T \sim N(Tm, Tv)`; the overall row
    mixes the two signs with :math:`p = P(A \ge 0)` of the spec (module docstring).
    """
    M, S = T * m, math.sqrt(T * v)
    lbase = M + 0.5 * S * S
    out = {}
    for sign, positive in (("A>=0", True), ("A<0", False)):
        pieces, a, b = _side(c, T, positive)
        out[sign] = (
            log_moment(pieces, M, S, 1.0),
            log_moment(pieces, M, S, 2.0),
            log_frac_out(a, b, M, S),
            lbase,
        )
    p = c.p_positive
    lw = np.array([math.log(p), math.log1p(-p)])
    mixed = [float(np.logaddexp(*(lw + np.array([out["A>=0"][i], out["A<0"][i]])))) for i in range(3)]
    out["all"] = (*mixed, lbase)
    return out
