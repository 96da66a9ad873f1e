r"""CPPO's theory under the token-probability model: what is exact, and what long sequences tend to.

CPPO (Mao et al. 2026, arXiv 2606.10968; the rule of :func:`variance_lab.corrections.cppo_mask`,
from the authors' UniRL code) masks token :math:`t` of a sequence of :math:`T` tokens when it moves
away from the sampler, :math:`A(r_t - 1) > 0`, and :math:`Z_t = w_t D_t > c_t`, with
:math:`D_t = |\pi_t - \mu_t|`, :math:`w_t = 1 - (1 - w_{\min})\frac{t-1}{\max(T-1, 1)}`,

.. math::

    c_t = \min\bigl(\delta,\ \delta + \beta W_{t-1} - S_{t-1}\bigr), \qquad
    S_{t-1} = \sum_{j<t} w_j D_j, \quad W_{t-1} = \sum_{j<t} w_j, \quad
    \beta = \operatorname{clamp}\bigl(P_{90}(D_1, \dots, D_T), \delta_b, 2\delta_b\bigr).

The model is :mod:`variance_lab.corrections.tokenprob`'s: the sampler's probability :math:`q_t` of
each token has the stated law (Beta or fixed), the shift :math:`Y_t = \operatorname{logit}\pi_t -
\operatorname{logit} q_t` the family's law, independent of :math:`q_t`, tokens i.i.d.; each
sequence's advantage is positive with probability :math:`p` (the spec's ``P``), independent of its
tokens. Then :math:`\pi > q \iff Y > 0`, so a token moves away with probability

.. math::

    a = p\,P(Y > 0) + (1 - p)\,P(Y < 0),

which does not depend on :math:`q`, and with :math:`F_\uparrow(\theta) = P(\pi - q > \theta)`,
:math:`F_\downarrow(\theta) = P(\pi - q < -\theta)` (DPPO-TV's two sides at the threshold
:math:`\theta`, :func:`tv_tails`) the fixed threshold :math:`\delta / w_t` alone masks with
probability

.. math::

    f(\theta) = p\,F_\uparrow(\theta) + (1 - p)\,F_\downarrow(\theta), \qquad \theta = \delta / w_t.

What is exact (:func:`cppo_positions`):

1. **Token 1.** :math:`S_0 = W_0 = 0` and :math:`w_1 = 1`, so :math:`c_1 = \delta` and the first token is
   masked with DPPO-TV's probability :math:`f(\delta)` (for every :math:`T` and :math:`\delta_b`).
2. **Bounds at every position.** :math:`c_t \le \delta`, so position :math:`t` is masked with a
   probability between :math:`f(\delta / w_t)` (the threshold alone) and :math:`a` (every token that
   moves away).
3. **An idle budget.** :math:`D \le 1`, so :math:`S_{t-1} \le W_{t-1}`; with :math:`\delta_b \ge 1`,
   :math:`\beta W_{t-1} - S_{t-1} \ge 0` and :math:`c_t = \delta` at every position: the masked
   fraction of a sequence of length :math:`T` is exactly :math:`\frac1T\sum_{t \le T} f(\delta / w_t)`.

Between the bounds the budget couples each token to its prefix and to the sequence's 0.9 quantile
(which reads the tokens after it too): no closed form is derived here, and the Monte Carlo of
:func:`~variance_lab.corrections.simulate_corrections` (the exact rule on exact draws of the model,
intervals from the spread of the sequences) is the reference.

**Long sequences** (:func:`cppo_limit`). As :math:`T \to \infty`, :math:`\beta \to \beta_\infty =
\operatorname{clamp}(q_{0.9}, \delta_b, 2\delta_b)`, :math:`q_{0.9}` the 0.9 quantile of the law of
:math:`D`, and :math:`(S_{t-1} - \beta W_{t-1}) / W_{t-1} \to E[D] - \beta_\infty` (the weights lie in
:math:`[w_{\min}, 1]`). If :math:`E[D] > \beta_\infty` the threshold falls below 0 after finitely many
tokens and every later token that moves away is masked: the masked fraction tends to :math:`a`. If
:math:`E[D] < \beta_\infty` the budget binds only finitely often, and the fraction tends to the threshold
alone averaged over the relative position :math:`u = (t - 1)/(T - 1)`,

.. math::

    \int_0^1 f\Bigl(\frac{\delta}{1 - (1 - w_{\min})u}\Bigr)\,du,

with :math:`E[D] = \int_0^1 P(D > x)\,dx` and :math:`P(D > x) = F_\uparrow(x) + F_\downarrow(x)`. Each
:math:`F` is the quadrature of :mod:`~variance_lab.corrections.tokenprob` (relative tolerance
:math:`10^{-11}` over the law of :math:`q`, split where a side of the band appears, :math:`q = \theta`
and :math:`1 - \theta`); the integrals over :math:`x` and :math:`u` are ``scipy.integrate.quad``
(relative tolerance :math:`10^{-10}`), :math:`q_{0.9}` Brent's root of :math:`P(D > x) = 0.1`.
``tests/corrections/test_cppo.py`` checks :math:`F`, :math:`E[D]` and :math:`q_{0.9}` against an
independent ``scipy.integrate.quad`` over :math:`q` (QAWS, the Beta density's end singularities as
its weight) to :math:`10^{-9}` relative, and the Monte Carlo against each exact statement.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import integrate, optimize, special

from variance_lab.corrections.probmask import position_weights
from variance_lab.corrections.specs import Correction, parse
from variance_lab.corrections.tokenprob import (
    TOKEN_PROB_DEFAULT,
    TokenProbability,
    band_kinks,
    components_of,
    integrate_logit,
    mask_given_q,
)

__all__ = ["CPPO_POSITION_COLUMNS", "cppo_limit", "cppo_positions", "tv_tails"]

#: Columns of :func:`cppo_positions`.
CPPO_POSITION_COLUMNS = (
    "t",
    "correction",
    "w",
    "threshold",
    "frac_threshold",
    "frac_threshold_pos",
    "frac_threshold_neg",
    "frac_away",
    "exact",
)

_QUAD_RTOL = 1e-10


def _check(correction, family, law) -> tuple[Correction, tuple, TokenProbability]:
    c = correction if isinstance(correction, Correction) else parse(correction)
    if c.kind != "cppo":
        raise ValueError(f"expected a cppo correction, got {c.spec!r}")
    comps = family if isinstance(family, tuple) else components_of(family)
    law = TOKEN_PROB_DEFAULT if law is None else law
    if not isinstance(law, TokenProbability):
        raise ValueError(f"token_prob must be a TokenProbability, got {law!r}")
    return c, comps, law


def tv_tails(theta: float, family, token_prob=None) -> tuple[float, float]:
    r"""Return DPPO-TV's sides :math:`F_\uparrow(\theta) = P(\pi - q > \theta)`, :math:`F_\downarrow(\theta)`.

    :math:`F_\downarrow(\theta) = P(\pi - q < -\theta)`: the two sides at the threshold :math:`\theta`
    under the token-probability model (:mod:`variance_lab.corrections.tokenprob`; the band of
    ``dppo-tv:theta``), integrated over the law of :math:`q`; both 0 for :math:`\theta \ge 1`
    (:math:`|\pi - q| < 1`).

    Parameters
    ----------
    theta : float
        > 0.
    family : LogNormal, LognormalMixture or tuple of (weight, mean, variance)
        The law of the shift :math:`Y` (:func:`~variance_lab.corrections.tokenprob.components_of`).
    token_prob : TokenProbability, optional
        The law of :math:`q` (default :data:`~variance_lab.corrections.tokenprob.TOKEN_PROB_DEFAULT`).
    """
    theta = float(theta)
    if not theta > 0:
        raise ValueError(f"the threshold theta must be > 0, got {theta!r}")
    comps = family if isinstance(family, tuple) else components_of(family)
    law = TOKEN_PROB_DEFAULT if token_prob is None else token_prob
    if theta >= 1.0:
        return 0.0, 0.0
    band = Correction("dppo-tv", (theta, 0.5), f"dppo-tv:{theta!r}")
    try:
        v = integrate_logit(lambda l: np.column_stack(mask_given_q(band, comps, l)), law, band_kinks(band))
    except ValueError as exc:
        raise ValueError(f"theta = {theta!r}: {exc}") from None
    return min(float(v[0]), 1.0), min(float(v[1]), 1.0)


def _away(comps, p: float) -> float:
    """Return the probability that a token moves away, p P(Y > 0) + (1 - p) P(Y < 0) (mixture ``comps``)."""
    up = sum(w * (float(special.ndtr(m / math.sqrt(v))) if v > 0 else float(m > 0)) for w, m, v in comps)
    down = sum(w * (float(special.ndtr(-m / math.sqrt(v))) if v > 0 else float(m < 0)) for w, m, v in comps)
    return p * up + (1.0 - p) * down


def cppo_positions(correction, family, T: int, *, token_prob=None) -> pd.DataFrame:
    r"""Return CPPO's exact bounds at each position t = 1..T of a sequence of length T, and where exact.

    Parameters
    ----------
    correction : str or Correction
        A ``cppo`` spec.
    family : LogNormal, LognormalMixture or tuple
        The law of the log-odds shift :math:`Y` (the theory of the probability-aware masks).
    T : int
        The sequence's length, >= 1 (the position weights depend on it).
    token_prob : TokenProbability, optional
        The law of the sampler's probability of each token.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`CPPO_POSITION_COLUMNS`: ``w`` :math:`w_t`, ``threshold`` :math:`\delta / w_t`,
        ``frac_threshold`` :math:`f(\delta / w_t)` (the threshold alone; its sign parts
        ``frac_threshold_pos`` :math:`F_\uparrow` for :math:`A > 0`, ``frac_threshold_neg``
        :math:`F_\downarrow` for :math:`A \le 0`), ``frac_away`` :math:`a`; CPPO's masked probability at
        :math:`t` lies between the two, and equals ``frac_threshold`` where ``exact`` (position 1, or
        every position when :math:`\delta_b \ge 1`; module docstring). The mean of ``frac_threshold``
        over the positions is the exact ``frac_modified`` at length ``T`` when :math:`\delta_b \ge 1`.
    """
    c, comps, law = _check(correction, family, token_prob)
    if isinstance(T, bool) or int(T) != T or T < 1:
        raise ValueError(f"T must be an integer >= 1, got {T!r}")
    delta, w_min, delta_b, p = c.params
    w = position_weights(int(T), w_min)
    theta = delta / w
    cache = {}
    for th in np.unique(theta):
        cache[float(th)] = tv_tails(float(th), comps, law)
    up = np.array([cache[float(th)][0] for th in theta])
    down = np.array([cache[float(th)][1] for th in theta])
    t = np.arange(1, int(T) + 1)
    return pd.DataFrame(
        {
            "t": t,
            "correction": c.spec,
            "w": w,
            "threshold": theta,
            "frac_threshold": p * up + (1.0 - p) * down,
            "frac_threshold_pos": up,
            "frac_threshold_neg": down,
            "frac_away": _away(comps, p),
            "exact": (t == 1) | (delta_b >= 1.0),
        },
        columns=list(CPPO_POSITION_COLUMNS),
    )


def _exceed(x: float, comps, law) -> float:
    """P(D > x) = F_up(x) + F_down(x)."""
    return sum(tv_tails(x, comps, law)) if x > 0 else 1.0


def cppo_limit(correction, family, *, token_prob=None) -> dict:
    r"""Return what CPPO's masked fraction tends to as the sequences grow long, and why.

    Parameters
    ----------
    correction : str or Correction
        A ``cppo`` spec.
    family : LogNormal, LognormalMixture or tuple
        The law of the log-odds shift :math:`Y`.
    token_prob : TokenProbability, optional
        The law of the sampler's probability of each token.

    Returns
    -------
    dict
        ``mean_d`` :math:`E[D] = E|\pi - q|`; ``q90`` the 0.9 quantile of :math:`D`; ``beta`` the
        long-sequence budget :math:`\beta_\infty = \operatorname{clamp}(q_{0.9}, \delta_b, 2\delta_b)`;
        ``binds`` whether :math:`E[D] > \beta_\infty` (the prefix overspends its budget);
        ``frac_away`` :math:`a`; ``frac_threshold`` the threshold alone averaged over the relative
        position (module docstring); ``frac_limit`` the limit of ``frac_modified``: ``frac_away`` when
        the budget binds, ``frac_threshold`` when not (no statement at :math:`E[D] = \beta_\infty`:
        NaN).
    """
    c, comps, law = _check(correction, family, token_prob)
    delta, w_min, delta_b, p = c.params
    mean_d, _ = integrate.quad(_exceed, 0.0, 1.0, args=(comps, law), epsabs=0.0, epsrel=_QUAD_RTOL, limit=500)
    hi = 1.0 - 1e-12
    q90 = (
        optimize.brentq(lambda x: _exceed(x, comps, law) - 0.1, 1e-300, hi, xtol=1e-300, rtol=1e-13)
        if _exceed(hi, comps, law) < 0.1
        else 1.0
    )
    beta = min(max(q90, delta_b), 2.0 * delta_b)

    def f(u):
        up, down = tv_tails(delta / (1.0 - (1.0 - w_min) * u), comps, law)
        return p * up + (1.0 - p) * down

    threshold, _ = (
        integrate.quad(f, 0.0, 1.0, epsabs=0.0, epsrel=_QUAD_RTOL, limit=200) if w_min < 1 else (f(0.0), 0)
    )
    away = _away(comps, p)
    binds = mean_d > beta
    limit = away if binds else threshold if mean_d < beta else math.nan
    return {
        "correction": c.spec,
        "mean_d": float(mean_d),
        "q90": float(q90),
        "beta": float(beta),
        "binds": bool(binds),
        "frac_away": float(away),
        "frac_threshold": float(threshold),
        "frac_limit": float(limit),
    }
