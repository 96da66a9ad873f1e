r"""Masks that read the token's probabilities: DPPO's total-variation and binary-KL masks, KPop's, CPPO's.

A ratio mask (IcePop, PPO's clip) looks at :math:`r = \pi(y)/\mu(y)` alone, and the ratio of a rare
token is volatile: :math:`\mu = 10^{-5} \to \pi = 10^{-3}` is a ratio of 100 for a negligible
change of the distribution, while :math:`0.99 \to 0.8` is a ratio of 0.81. These masks look at the
two probabilities of the sampled token :math:`y` instead, :math:`\pi = \pi(y)` (the policy trained,
the ratio's numerator) and :math:`\mu = \mu(y)` (the sampler, the denominator), through the
divergences of the two-event distributions "this token or any other" (the *binary* approximation,
:math:`D(a \| b) = a\log\frac ab + (1-a)\log\frac{1-a}{1-b}`):

======================  ==========================================================================
spec                    token masked (weight 0) when
======================  ==========================================================================
``dppo-tv[:D[:P]]``     :math:`A > 0` and :math:`\pi - \mu > D`, or :math:`A \le 0` and
                        :math:`\pi - \mu < -D` (DPPO-Binary-TV; default :math:`D = 0.15`)
``dppo-kl[:D[:P]]``     :math:`A > 0`, :math:`\pi > \mu` and :math:`D(\mu \| \pi) > D`, or :math:`A \le 0`,
                        :math:`\pi < \mu` and :math:`D(\mu \| \pi) > D` (DPPO-Binary-KL; default 0.05)
``kpop[:D]``            :math:`D(\pi \| \mu) > D` or :math:`D(\mu \| \pi) > D`, whatever the advantage
                        (KPop's symmetric binary-KL trust region; default 0.1)
``cppo[:D:WMIN:DB:P]``  :math:`A(r - 1) > 0` and :math:`w_t|\pi - \mu| > c_t`, a threshold that falls
                        with the token's position and with its prefix's spent budget (CPPO's
                        position-weighted, cumulative-prefix Binary-TV mask; each parameter optional
                        from the right, defaults 0.2, 0.8, 0.02, 0.5; :func:`cppo_mask`)
======================  ==========================================================================

:math:`A` is the advantage of the token's sequence. DPPO masks only the side that the update
pushes toward (a positive advantage raises :math:`\pi`), so its specs are sign-dependent
(:mod:`variance_lab.corrections.sign`, rows ``A>0`` and ``A<=0``; ``P`` is the theory's
:math:`P(A > 0)`, default 0.5); KPop masks both sides. Kept tokens keep the weight :math:`r`;
``frac_modified`` is the fraction of tokens masked.

Sources, read for this module (the rules above are theirs, word for word in the comparisons):

- DPPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv
  2602.04879): ``_compute_token_mask_for_policy_loss`` in ``verl/trainer/ppo/core_algos.py`` of the
  authors' sail-sg/Stable-RL (commit ``22ce6d3``; loss modes ``dppo_binary_tv``,
  ``dppo_binary_kl``, with :math:`\mu` the rollout policy), and verl's ``compute_policy_loss_dppo_tv``
  and ``compute_policy_loss_dppo_kl`` (verl-project/verl ``018f23b``, same file): ``valid_positive =
  (prob - old_prob) <= high``, ``valid_negative = (prob - old_prob) >= -low``, ``binary_kl =
  old_prob * (old_log_prob - log_prob) + (1 - old_prob) * log((1 - old_prob + 1e-8) / (1 - prob +
  1e-8))``, ``valid = where(advantages > 0, valid_positive, valid_negative)``; prime-rl's
  ``default_loss_fn`` (``src/prime_rl/trainer/rl/loss.py`` at ``559b447``) is the TV rule with
  0.2 on both sides (:func:`variance_lab.frameworks.prime_rl.dppo_mask`). The defaults 0.15 (TV)
  and 0.05 (KL) are those of verl's ``examples/dppo_trainer/run_qwen30b_dppo.sh`` (``8f11888``),
  written by the paper's authors; the paper's own text was not read here. Both codes allow
  different thresholds below and above; the specs take one for both sides.
- KPop: prime-rl PR #3283 (``refs/pull/3283/head`` = ``489621a``, "feat: add KPop loss type",
  ``kpop_loss_fn``): both probabilities clamped to :math:`[10^{-6}, 1 - 10^{-6}]`, then
  ``(forward_kl > kpop_threshold) | (reverse_kl > kpop_threshold)`` with ``forward_kl =
  binary_kl(trainer_probs, inference_probs)``; ``kpop_threshold`` 0.1 "as in the paper" (KPop's
  write-up, ringtech.notion.site/kpop, was not read here).

- CPPO (Mao et al. 2026, "Beyond Uniform Token-Level Trust Region in LLM Reinforcement Learning",
  arXiv 2606.10968): ``_cppo_mask`` in ``unirl/algorithms/cppo.py`` of the authors' Tencent-Hunyuan/UniRL
  (commit ``30899fc``; the rule of :func:`cppo_mask`, transcribed in ``tests/corrections/test_cppo.py``)
  and its ``CPPO/README.md`` (``097515b``), which places the effective threshold, the keep rule and the
  loss at the paper's Eq. 8-11 and the per-sequence budget :math:`\operatorname{clamp}(P_{90}(D),
  \delta_b, 2\delta_b)` at its Eq. 22 ("Base-model warm-up calibration"; the code applies it always).
  The paper's text past its abstract and introduction could not be read here, so the equation numbers
  are the README's. UniRL ships the Binary-TV divergence only; the paper's KL and Top-K variants (its
  ablations) are not covered.

Conventions (:func:`prob_sides`): the divergences in float64 from the log-probs given; a
difference or divergence exactly at the threshold is kept (:data:`PROB_RULE`, the frameworks' strict
``>``); on data the frameworks' guards are applied (:data:`DPPO_KL_EPS` added to both complements,
:data:`KPOP_CLAMP` on both probabilities); the theory and the Monte Carlo take the divergences
exactly (``exact=True``; the guards move a decision only where a probability is within
:math:`10^{-6}` of 0 or 1 and a divergence is at least :math:`\sim 10^{-6}\,|\log 10^{-6}|` from
:math:`D`). The frameworks compute in float32; these masks do not mirror that (the prime-rl mirror
does, for its TV mask).
"""

from __future__ import annotations

import numpy as np

from variance_lab.corrections.sign import is_positive
from variance_lab.corrections.specs import Correction
from variance_lab.ratios import CLOSED, BoundRule, compare

__all__ = [
    "DPPO_KL_EPS",
    "KPOP_CLAMP",
    "PROB_RULE",
    "apply_prob",
    "binary_kl",
    "cppo_mask",
    "fixed_sides",
    "logit_shift",
    "position_weights",
    "prob_difference",
    "prob_sides",
]

#: The masks' comparison: a difference or divergence against the threshold as it is, float64, a
#: value exactly at the threshold kept (the sources' strict ``>`` masks).
PROB_RULE = BoundRule(CLOSED, "value", "float64")
#: DPPO-Binary-KL's guard in verl and Stable-RL: ``1e-8`` added to both complements in the log.
DPPO_KL_EPS = 1e-8
#: KPop's guard in prime-rl PR #3283: both probabilities clamped to ``[1e-6, 1 - 1e-6]``.
KPOP_CLAMP = 1e-6


def _log1mexp(x: np.ndarray) -> np.ndarray:
    r"""Return :math:`\log(1 - e^x)` for ``x <= 0`` (``-inf`` at 0), accurate at both ends."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(x > -0.6931471805599453, np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def binary_kl(log_a, log1m_a, log_b, log1m_b) -> np.ndarray:
    r"""Return :math:`D(a \| b) = a\log\frac ab + (1-a)\log\frac{1-a}{1-b}` from logs of both and complements.

    A term whose weight (:math:`a` or :math:`1-a`) is 0 counts 0 (:math:`0\log 0 = 0`); a
    complement :math:`1 - b = 0` under :math:`1 - a > 0` gives ``inf``.
    """
    la, la1, lb, lb1 = (np.asarray(x, dtype=float) for x in (log_a, log1m_a, log_b, log1m_b))
    with np.errstate(invalid="ignore", over="ignore"):
        first = np.where(la == -np.inf, 0.0, np.exp(la) * (la - lb))
        second = np.where(la1 == -np.inf, 0.0, np.exp(la1) * (la1 - lb1))
    return first + second


def prob_difference(log_pi, log_mu) -> np.ndarray:
    r"""Return :math:`\pi - \mu` from the log-probs: DPPO-TV's statistic; CPPO's :math:`D = |\pi - \mu|`.

    ``prob - old_prob`` as the sources take it (float64 here), the binary total variation with its sign.
    """
    return np.exp(np.asarray(log_pi, dtype=float)) - np.exp(np.asarray(log_mu, dtype=float))


def logit_shift(log_pi, log_mu) -> np.ndarray:
    r"""Return :math:`\operatorname{logit}\pi - \operatorname{logit}\mu`, the shift of the token's log-odds.

    The variable the theory's token-probability model draws from the ratio family
    (:mod:`variance_lab.corrections.tokenprob`); ``nan`` where either probability is 0 or 1.
    """
    lp, lm = np.asarray(log_pi, dtype=float), np.asarray(log_mu, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = (lp - _log1mexp(lp)) - (lm - _log1mexp(lm))
    return np.where(np.isfinite(y), y, np.nan)


def _framework_logs(c: Correction, log_pi, log_mu):
    """(log pi, log(1 - pi), log mu, log(1 - mu)) as the source computes the divergence from log-probs."""
    lp, lm = np.asarray(log_pi, dtype=float), np.asarray(log_mu, dtype=float)
    if c.kind == "kpop":  # torch.exp(logprobs).clamp(min=eps, max=1 - eps)
        p = np.clip(np.exp(lp), KPOP_CLAMP, 1.0 - KPOP_CLAMP)
        m = np.clip(np.exp(lm), KPOP_CLAMP, 1.0 - KPOP_CLAMP)
        return np.log(p), np.log1p(-p), np.log(m), np.log1p(-m)
    if c.kind == "dppo-kl":  # log((1 - old_prob + 1e-8) / (1 - prob + 1e-8)), the logs as given
        return lp, np.log(-np.expm1(lp) + DPPO_KL_EPS), lm, np.log(-np.expm1(lm) + DPPO_KL_EPS)
    return lp, _log1mexp(lp), lm, _log1mexp(lm)


def fixed_sides(c: Correction) -> None:
    """Raise ``ValueError`` unless ``c`` masks a token by its probabilities on fixed sides (DPPO, KPop).

    Parameters
    ----------
    c : Correction
    """
    if not c.prob:
        raise ValueError(f"{c.spec!r} does not read the token's probabilities")
    if c.kind == "cppo":
        raise ValueError(
            f"{c.spec!r}: CPPO's threshold moves with the token's position and its prefix; it has no fixed "
            "sides (its rule: variance_lab.corrections.cppo_mask; its theory: variance_lab.corrections.cppo)"
        )


def prob_sides(c: Correction, log_pi, log_mu, *, exact: bool = False, log1m=None) -> tuple:
    r"""Return where a probability-aware mask binds on each side: ``(up, down)`` boolean arrays.

    ``up``: :math:`\pi` above :math:`\mu` beyond the threshold (the side DPPO masks when
    :math:`A > 0`); ``down``: below (:math:`A \le 0`). KPop masks ``up | down``.

    Parameters
    ----------
    c : Correction
        ``dppo-tv``, ``dppo-kl`` or ``kpop``.
    log_pi, log_mu : array_like
        :math:`\log\pi(y)` (numerator) and :math:`\log\mu(y)` (the sampler), broadcast together.
    exact : bool
        Take the divergences exactly (the theory's and the Monte Carlo's rule) instead of with the
        sources' guards (:data:`DPPO_KL_EPS`, :data:`KPOP_CLAMP`; the rule on data).
    log1m : (array_like, array_like), optional
        :math:`\log(1 - \pi)` and :math:`\log(1 - \mu)` when known more precisely than from the
        log-probs (the Monte Carlo's, from the log-odds); ``exact`` only.
    """
    fixed_sides(c)
    lp, lm = np.broadcast_arrays(np.asarray(log_pi, dtype=float), np.asarray(log_mu, dtype=float))
    delta = c.params[0]
    if c.kind == "dppo-tv":  # prob - rollout_prob, as the sources take it
        d = prob_difference(lp, lm)
        return PROB_RULE.outside(d, None, delta), PROB_RULE.outside(d, -delta, None)
    if exact:
        lp1, lm1 = (_log1mexp(lp), _log1mexp(lm)) if log1m is None else (np.asarray(x, float) for x in log1m)
    else:
        lp, lp1, lm, lm1 = _framework_logs(c, lp, lm)
    above, below = lp > lm, lp < lm
    over = PROB_RULE.outside(binary_kl(lm, lm1, lp, lp1), None, delta)  # D(mu || pi)
    if c.kind == "kpop":
        over = over | PROB_RULE.outside(binary_kl(lp, lp1, lm, lm1), None, delta)  # or D(pi || mu)
    return over & above, over & below


def position_weights(T: int, w_min: float) -> np.ndarray:
    r"""Return CPPO's position weights :math:`w_t = 1 - (1 - w_{\min})\frac{t - 1}{\max(T - 1, 1)}`, t = 1..T.

    They fall linearly from 1 at the first token to :math:`w_{\min}` at the last (UniRL's ``w_t``, the same
    expression, float64); a sequence of one token has :math:`w_1 = 1`.
    """
    t = np.arange(1, int(T) + 1, dtype=float)
    return 1.0 - (1.0 - w_min) * (t - 1) / max(int(T) - 1, 1)


def _budget_rows(c: Correction, d: np.ndarray, away: np.ndarray) -> np.ndarray:
    """CPPO's masked flags for sequences of one length, one a row: ``d`` and ``away`` of shape (n, T)."""
    delta, w_min, delta_b = c.params[:3]
    T = d.shape[1]
    w = position_weights(T, w_min)
    z = w * d
    s_prev = np.zeros_like(z)
    s_prev[:, 1:] = np.cumsum(z, axis=1)[:, :-1]  # S_{t-1}, 0 at t = 1
    w_prev = np.zeros(T)
    w_prev[1:] = np.cumsum(w)[:-1]  # W_{t-1}
    beta = np.clip(np.quantile(d, 0.9, axis=1), delta_b, 2.0 * delta_b)[:, None]  # Eq. 22, per sequence
    threshold = np.minimum(delta, delta + beta * w_prev - s_prev)  # c_t, Eq. 8
    return away & compare(z, None, threshold, PROB_RULE.inclusive)  # kept where Z_t <= c_t (Eq. 10)


def cppo_mask(c: Correction, divergence, away, offsets=None) -> np.ndarray:
    r"""Return where CPPO masks each token, from its divergence and whether it moves away from the sampler.

    For a sequence of :math:`T` tokens with divergences :math:`D_t = |\pi_t - \mu_t|` (the binary total
    variation, :func:`prob_difference`), position weights :math:`w_t` (:func:`position_weights`) and
    :math:`Z_t = w_t D_t`, the prefix sums :math:`S_{t-1} = \sum_{j<t} Z_j`, :math:`W_{t-1} = \sum_{j<t} w_j`
    (:math:`S_0 = W_0 = 0`) and the sequence's budget
    :math:`\beta = \operatorname{clamp}(P_{90}(D_1, \dots, D_T), \delta_b, 2\delta_b)` (its own 0.9
    quantile, linearly interpolated as ``torch.quantile`` and ``np.quantile`` take it), the effective
    threshold is

    .. math::

        c_t = \min\bigl(\delta,\ \delta + \beta W_{t-1} - S_{t-1}\bigr),

    and token :math:`t` is masked when it moves away from the sampler, :math:`A_t(r_t - 1) > 0`, and
    :math:`Z_t > c_t` (a value at the threshold is kept: :data:`PROB_RULE`). The prefix spends the budget
    whether its tokens were kept or not: :math:`S_{t-1}` sums every earlier :math:`Z_j`. While
    :math:`S_{t-1} \le \beta W_{t-1}` (the prefix's weighted mean divergence within the budget) the
    threshold is :math:`\delta` on :math:`Z_t`, i.e. :math:`D_t \le \delta / w_t`, stricter early;
    past it :math:`c_t` falls below :math:`\delta`, and below 0 every token moving away is masked.

    Parameters
    ----------
    c : Correction
        A ``cppo`` spec (its ``(delta, w_min, delta_b, p)``).
    divergence : array_like
        :math:`D_t \ge 0` of each token: one sequence per row of a 2-D array, or 1-D with ``offsets``
        (without them one sequence).
    away : array_like of bool
        :math:`A_t(r_t - 1) > 0`, the shape of ``divergence``.
    offsets : array_like of int, optional
        Sequence boundaries of a 1-D ``divergence``.

    Returns
    -------
    ndarray of bool
        True where the token is masked.
    """
    if c.kind != "cppo":
        raise ValueError(f"expected a cppo correction, got {c.spec!r}")
    d = np.asarray(divergence, dtype=float)
    away = np.asarray(away, dtype=bool)
    if away.shape != d.shape:
        raise ValueError(
            f"{c.spec!r}: away must have the shape of the divergences {d.shape}, got {away.shape}"
        )
    if d.ndim == 2:
        return _budget_rows(c, d, away)
    off = np.array([0, d.size]) if offsets is None else np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(off)
    if off.size < 2 or off[0] != 0 or off[-1] != d.size or np.any(lengths < 1):
        raise ValueError("offsets must rise from 0 to the number of tokens in steps >= 1 (one sequence each)")
    out = np.empty(d.shape, dtype=bool)
    for T in np.unique(lengths):  # the sequences of one length as the rows of a matrix
        tok = off[:-1][lengths == T][:, None] + np.arange(T)
        out[tok] = _budget_rows(c, d[tok], away[tok])
    return out


def apply_prob(
    c: Correction, log_r, log_mu, advantage=None, *, exact: bool = False, log1m=None, offsets=None
):
    r"""Compute a probability-aware mask's weights and masked flags from token log-ratios and log-probs.

    Parameters
    ----------
    c : Correction
        ``dppo-tv``, ``dppo-kl``, ``kpop`` or ``cppo``.
    log_r : array_like
        Token log-ratios :math:`\log(\pi/\mu)`: 1-D, or for ``cppo`` one sequence per row of a 2-D
        array.
    log_mu : array_like
        The sampler's log-prob :math:`\log\mu(y)` of each token (the ratio's denominator), the shape
        of ``log_r``.
    advantage : array_like, optional
        Each token's advantage (its sequence's, broadcast against ``log_r``); needed by DPPO, whose
        side is ``up`` where :math:`A > 0` and ``down`` elsewhere, and by CPPO, which masks only
        tokens with :math:`A(r - 1) > 0` (:math:`r - 1` as UniRL takes it, from the log-ratio clamped
        to :math:`\pm 20`; a zero advantage is never masked).
    exact, log1m
        As for :func:`prob_sides` (``cppo``'s :math:`|\pi - \mu|` is the same either way).
    offsets : array_like of int, optional
        ``cppo`` with a 1-D ``log_r``: the sequence boundaries (:func:`cppo_mask`).

    Returns
    -------
    (w, modified) : tuple of ndarray
        :math:`w = r` where kept, 0 where masked (modified).
    """
    log_r = np.asarray(log_r, dtype=float)
    log_mu = np.asarray(log_mu, dtype=float)
    if log_mu.shape != log_r.shape:
        raise ValueError(f"{c.spec!r}: log_mu must have the shape of log_r {log_r.shape}, got {log_mu.shape}")
    if c.kind == "cppo":
        if advantage is None:
            raise ValueError(f"{c.spec!r} needs each token's advantage (CPPO masks tokens that A(r - 1) > 0)")
        adv = np.broadcast_to(np.asarray(advantage, dtype=float), log_r.shape)
        away = adv * (np.exp(np.clip(log_r, -20.0, 20.0)) - 1.0) > 0.0  # ~toward_mu of the source
        d = np.abs(prob_difference(log_mu + log_r, log_mu))
        masked = cppo_mask(c, d, away, offsets)
    else:
        masked = _threshold_masked(c, log_r, log_mu, advantage, exact, log1m)
    return np.where(masked, 0.0, np.exp(np.where(masked, 0.0, log_r))), masked


def _threshold_masked(c: Correction, log_r, log_mu, advantage, exact, log1m) -> np.ndarray:
    """Return the masked flags of the fixed-threshold masks (DPPO's and KPop's) from :func:`prob_sides`."""
    up, down = prob_sides(c, log_mu + log_r, log_mu, exact=exact, log1m=log1m)
    if c.signed:
        if advantage is None:
            raise ValueError(f"{c.spec!r} needs each token's advantage (DPPO masks the side its sign pushes)")
        masked = np.where(np.broadcast_to(is_positive(c, advantage), log_r.shape), up, down)
    else:
        masked = up | down
    return masked
