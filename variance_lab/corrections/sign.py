r"""Weights that depend on the sign of the advantage: TOPR, DeepSeek-V3.2's off-policy mask, ASPO.

Each treats a sequence (and its tokens, which share its advantage) by the sign of its advantage
:math:`A` (positive: :math:`A \ge 0`, as the sources write it):

- ``topr[:P]`` (Tapered Off-Policy REINFORCE, Le Roux et al. 2025, arXiv 2503.14286, its update
  :math:`\nabla J = \sum_{R \ge 0} \mu R \nabla\log\pi + \sum_{R < 0} \mu\,[\pi/\mu]_0^1 R \nabla\log\pi`,
  the weight stop-gradiented), sequence level: :math:`w = 1` when :math:`A \ge 0` (no importance
  ratio at all) and :math:`w = \min(P_T, 1)` when :math:`A < 0` (truncated at 1). Modified: a
  negative sequence with :math:`P_T > 1`; the positive side drops the ratio by design, which is
  not counted.
- ``opsm:DELTA[:P]`` (DeepSeek-V3.2's off-policy sequence masking; TRL 1.16.0's
  ``GRPOTrainer.get_off_policy_mask``, mirrored in :func:`variance_lab.frameworks.trl.get_off_policy_mask`),
  sequence level: :math:`w = P_T\,M`, where the sequence is masked (:math:`M = 0`) when
  :math:`A < 0` and its mean :math:`\frac1T\sum_t \log(\mu_t/\pi_t) = -\log G_T` exceeds
  :math:`\delta`; a mean equal to :math:`\delta` is kept (:data:`OPSM_RULE`, :func:`opsm_keep`,
  the one rule both use).
- ``aspo[:E|:EL:EH[:C[:P]]]`` (Asymmetric Importance Sampling Policy Optimization, Wang et al. 2025,
  arXiv 2510.06062), token level: the weight each token's :math:`\nabla\log\pi` gets in the
  gradient of ASPO's loss, read from the authors' code (``compute_policy_loss_archer`` in
  ``verl/trainer/ppo/core_algos.py:537-583`` of ``wizard-III/Archer2.0`` at ``b08d963``):

  .. math::

      w_+(r) = \begin{cases} C & r < 1/C \\ 1/r & 1/C \le r \le 1 + \varepsilon_h \\
               0 & r > 1 + \varepsilon_h \end{cases}, \qquad
      w_-(r) = \begin{cases} 0 & r < 1 - \varepsilon_l \\ r & 1 - \varepsilon_l \le r \le C \\
               C & r > C \end{cases}

  for :math:`A \ge 0` and :math:`A < 0`. The positive side's loss
  :math:`-A\,(c/\mathrm{sg}(c))/\mathrm{sg}(c)` with :math:`c = \min(r, 1 + \varepsilon_h)` has
  the gradient :math:`-A\,\nabla\log\pi / r`: the flipped ratio (PPO's is :math:`r`); past the
  clip :math:`c` is constant and the token has no gradient (weight 0, as PPO's); where
  :math:`1/c > C` the loss is :math:`-A\,C\,\log\pi`, the soft dual clip, which keeps the
  gradient with weight :math:`C`. The negative side is PPO's with a dual clip that keeps the
  gradient (:math:`-A\,C\,\log\pi` where :math:`\max(r, 1 - \varepsilon_l) > C`). Modified: a
  token outside the band where its weight is :math:`1/r` (positive) or :math:`r` (negative), so a
  weight zeroed or dual-clipped; the flip itself is by design and not counted. ``E`` sets both
  widths; defaults :data:`~variance_lab.corrections.specs.ASPO_DEFAULT` (0.2, 0.2, 3). Archer2.0
  gives the 20 % highest-entropy tokens of each response the widths 0.4 and the others 0.2
  (``verl/workers/actor/dp_actor.py:404-424``): the spec takes one pair for every token, so
  ``aspo:0.2`` and ``aspo:0.4`` bracket it. Ends of the band as PyTorch's ``clamp`` passes the
  gradient (closed) and the dual clip's strict ``>``: :data:`ASPO_RULE`.

``P`` is the model's :math:`p = P(A \ge 0)` (default
:data:`~variance_lab.corrections.specs.SIGN_P_DEFAULT`): the theory takes the sign independent
of the ratios, so every moment splits by sign,

.. math::

    E[w^j] = p\,E[w_+^j] + (1 - p)\,E[w_-^j], \qquad
    \operatorname{Var}(w) = E[w^2] - E[w]^2,

and each conditional moment is the truncated-lognormal closed form of
:mod:`variance_lab.corrections.gauss` for :math:`\log X \sim N(M, S^2)`, with
:math:`X = P_T` (:math:`M = Tm`, :math:`S^2 = Tv`) at sequence level and :math:`X = r`
(:math:`M = m`, :math:`S^2 = v`) for ASPO:
TOPR's :math:`E[\min(P_T,1)^j] = e^{jM + j^2S^2/2}\Phi(-(M + jS^2)/S) + \bar\Phi(-M/S)`,
OPSM's :math:`E[P_T^j 1\{\log P_T \ge -T\delta\}] = e^{jM + j^2S^2/2}\bar\Phi((-T\delta - M - jS^2)/S)`
and masked fraction :math:`\Phi((-T\delta - M)/S)`; ASPO's positive side
:math:`E[w_+^j] = C^j\Phi((-\ln C - M)/S) + e^{-jM + j^2S^2/2}[\Phi((\ln(1+\varepsilon_h) - M + jS^2)/S)
- \Phi((-\ln C - M + jS^2)/S)]`, its negative side the same pieces with :math:`+j`. The bias is
against the importance-sampling target :math:`E[X] = e^{M + S^2/2}` (:math:`E[P_T]`, or
:math:`E[r]` for ASPO), by sign and overall. On data the sign is each sequence's own advantage
(:func:`apply_signed`; every token of a sequence takes its sign), and ``P`` is not used.

DPPO's masks (``dppo-tv``, ``dppo-kl``; :mod:`variance_lab.corrections.probmask`) depend on the
sign too, token by token through the sequence's advantage, but split it the other way: verl's,
Stable-RL's and prime-rl's ``torch.where(advantages > 0, ...)`` count :math:`A = 0` negative, so their
rows are :data:`DPPO_SIGNS` and :func:`is_positive` reads :math:`A > 0` for them.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.corrections.gauss import log_frac_out, log_moment
from variance_lab.corrections.specs import Correction
from variance_lab.ratios import CLOSED, BoundRule

__all__ = [
    "ASPO_RULE",
    "DPPO_SIGNS",
    "OPSM_RULE",
    "SIGNS",
    "TOPR_RULE",
    "apply_signed",
    "is_positive",
    "opsm_keep",
    "sign_label",
    "sign_log_moments",
    "signs",
]

_INF = math.inf

#: The rows of a sign-dependent spec: every sequence, the positive (A >= 0), the negative (A < 0).
SIGNS = ("all", "A>=0", "A<0")
#: DPPO's rows (``dppo-tv``, ``dppo-kl``): every sequence, A > 0 (the upper side masked), A <= 0 (the lower).
DPPO_SIGNS = ("all", "A>0", "A<=0")
#: DeepSeek-V3.2's off-policy mask as TRL applies it: the mean log-ratio against delta as it is, a
#: mean equal to delta kept.
OPSM_RULE = BoundRule(CLOSED, "value", "float64")
#: TOPR's truncation of a negative sequence's :math:`P_T` at 1: :math:`\log P_T` against 0, a
#: weight exactly at 1 kept (not counted as modified).
TOPR_RULE = BoundRule(CLOSED, "log", "float64")
#: ASPO's band of the token ratio where the weight is :math:`1/r` (positive) or :math:`r`
#: (negative): closed, as ``torch.clamp`` passes the gradient at its ends and the dual clip compares
#: with a strict ``>``; compared in log space in float64 (Archer2.0 compares ratios in the policy's
#: dtype).
ASPO_RULE = BoundRule(CLOSED, "log", "float64")


def signs(c: Correction) -> tuple[str, str, str]:
    """Return the rows of a sign-dependent spec: :data:`DPPO_SIGNS` for DPPO, :data:`SIGNS` otherwise."""
    return DPPO_SIGNS if c.prob else SIGNS


def is_positive(c: Correction, advantage) -> np.ndarray:
    """Return where an advantage counts as positive for ``c``: A > 0 for DPPO, A >= 0 for the others."""
    adv = np.asarray(advantage, dtype=float)
    return adv > 0 if c.prob else adv >= 0


def sign_label(c: Correction, sign: str) -> str:
    """Return the ``correction`` label of one sign's row: the spec itself for ``"all"``."""
    if sign not in signs(c):
        raise ValueError(f"sign must be one of {signs(c)}, got {sign!r}")
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


def apply_signed(c: Correction, log_x, T, positive) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a sign-dependent correction's weights from the base log-values and each sign.

    Parameters
    ----------
    c : Correction
        ``topr``, ``opsm`` or ``aspo``.
    log_x : ndarray
        :math:`\log P_T` of each sequence (``topr``, ``opsm``), or each token's :math:`\log r`
        (``aspo``: any shape; a 2-D array holds one sequence per row).
    T : int or ndarray
        Each sequence's length (OPSM's mean log-ratio is :math:`-\log P_T / T`; unused by ``aspo``).
    positive : array_like of bool
        True where the advantage is :math:`\ge 0`: one per value of ``log_x``, or for a 2-D
        ``log_x`` one per row.

    Returns
    -------
    (w, modified) : tuple of ndarray
        TOPR: 1 (positive) or :math:`\min(P_T, 1)`, modified where a negative :math:`P_T > 1`;
        OPSM: :math:`P_T`, or 0 where masked (modified); ASPO: :math:`w_\pm(r)` of the module
        docstring, modified where zeroed or dual-clipped.
    """
    log_x = np.asarray(log_x, dtype=float)
    pos = np.asarray(positive, dtype=bool)
    if log_x.ndim == 2 and pos.ndim == 1:
        pos = pos[:, None]
    pos = np.broadcast_to(pos, log_x.shape)
    if c.kind == "topr":
        over = ~pos & TOPR_RULE.outside(log_x, None, 0.0)
        return np.where(pos, 1.0, np.exp(np.minimum(log_x, 0.0))), over
    if c.kind == "opsm":
        T = np.asarray(T, dtype=float)
        masked = ~opsm_keep(np.where(pos, 0.0, -1.0), -log_x / T, c.params[0])
        return np.where(masked, 0.0, np.exp(np.where(masked, 0.0, log_x))), masked
    if c.kind == "aspo":
        return _aspo(c, log_x, pos)
    raise ValueError(f"{c.spec!r} does not depend on the advantage's sign")


def _aspo(c: Correction, y: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ASPO's token weights: 1/r, C or 0 where A >= 0; r, C or 0 where A < 0 (:data:`ASPO_RULE`)."""
    el, eh, C = c.params[:3]
    lc = math.log(C)
    out_pos = ASPO_RULE.outside(y, -lc, math.log1p(eh))  # 1/r kept on [1/C, 1 + eh]
    out_neg = ASPO_RULE.outside(y, math.log1p(-el), lc)  # r kept on [1 - el, C]
    out = np.where(pos, out_pos, out_neg)
    below = y < 0.0  # outside the band, the side: below 1 (1/C, 1 - el) or above (1 + eh, C)
    w_pos = np.where(out_pos, np.where(below, C, 0.0), np.exp(-np.where(out_pos, 0.0, y)))
    w_neg = np.where(out_neg, np.where(below, 0.0, C), np.exp(np.where(out_neg, 0.0, y)))
    return np.where(pos, w_pos, w_neg), out


def _side(c: Correction, T: float, positive: bool) -> tuple[list, float, float]:
    """Return the pieces ``(a, b, log c, p)`` of one sign's weight on log X, and its kept band."""
    if c.kind == "aspo":
        el, eh, C = c.params[:3]
        lc = math.log(C)
        if positive:  # C below 1/C, 1/r up to 1 + eh, 0 above
            return [(-_INF, -lc, lc, 0.0), (-lc, math.log1p(eh), 0.0, -1.0)], -lc, math.log1p(eh)
        return [(math.log1p(-el), lc, 0.0, 1.0), (lc, _INF, lc, 0.0)], math.log1p(-el), lc
    if c.kind == "topr":
        if positive:
            return [(-_INF, _INF, 0.0, 0.0)], -_INF, _INF
        return [(-_INF, 0.0, 0.0, 1.0), (0.0, _INF, 0.0, 0.0)], -_INF, 0.0
    if positive:
        return [(-_INF, _INF, 0.0, 1.0)], -_INF, _INF
    lo = -T * c.params[0]  # masked when -log P_T / T > delta, i.e. log P_T < -T delta
    return [(lo, _INF, 0.0, 1.0)], lo, _INF


def sign_log_moments(c: Correction, m: float, v: float, T: float) -> dict:
    r"""Return, per sign of :data:`SIGNS`, (log E[w], log E[w^2], log frac_modified, log E[X]).

    Token log-ratios i.i.d. :math:`N(m, v)`, so :math:`\log P_T \sim N(Tm, Tv)` (``topr``,
    ``opsm``: :math:`X = P_T`); ``aspo`` is per token (:math:`X = r`, its moments do not depend
    on ``T``). The overall row mixes the two signs with :math:`p = P(A \ge 0)` of the spec
    (module docstring); for ``aspo`` its ``frac_modified`` is per token.
    """
    M, S = (T * m, math.sqrt(T * v)) if c.level == "sequence" else (m, math.sqrt(v))
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
