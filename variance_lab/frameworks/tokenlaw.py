r"""The per-token law behind a run's logged token metrics: :math:`y \sim N(m, s^2)`, fitted from each.

A training framework logs, per step, token-level averages of the mismatch log-ratio
:math:`y = \log\pi_{train} - \log\pi_{engine}` (verl's ``rollout_corr/k3_kl``, ``chi2_token``
and ``kl``; NeMo-RL's ``token_mult_prob_error`` and ``gen_kl_error``; prime-rl's
``mismatch_kl``; TRL's ``sampling/sampling_logp_difference/mean``; slime's ``tis_abs``;
OpenRLHF's ``vllm_kl``). Under :math:`y \sim N(m, s^2)` i.i.d. (the lognormal family) each is a
known function of :math:`(m, s)`, solved here for :math:`s^2` (:func:`fit_law`):

=====================  ========================================================================
kind                   value under :math:`N(m, s^2)`
=====================  ========================================================================
``kl``                 :math:`-m` (sets :math:`m`; verl ``kl``, OpenRLHF ``vllm_kl``)
``k3``                 :math:`E[e^y - y - 1] = e^{m + s^2/2} - m - 1`
``chi2``               :math:`E[e^{2y}] - 1 = e^{2m + 2s^2} - 1`
``mult``               :math:`E[e^{|y|}] = e^{m+s^2/2}\Phi(m/s + s) + e^{-m+s^2/2}\Phi(s - m/s)`
``absdiff``            :math:`E|y| = s\sqrt{2/\pi}\,e^{-m^2/2s^2} + m(1 - 2\Phi(-m/s))`
``tis_abs``            :math:`E|e^y - 1| = e^{m+s^2/2} - 1 + 2(\Phi(-m/s) - e^{m+s^2/2}\Phi(-m/s - s))`
=====================  ========================================================================

**A framework's clamp.** Where the framework clamps the log-ratio before averaging
(:data:`~variance_lab.frameworks.logfiles.TOKEN_CLAMP`: verl's ``chi2_token`` takes
:math:`\operatorname{clip}(y, -20, 20)`), the metric is solved under the clamp:

.. math::

    E[e^{2\operatorname{clip}(y,-c,c)}] - 1 = e^{-2c}\Phi\Bigl(\frac{-c-m}{s}\Bigr)
    + E[e^{2y} 1\{|y| < c\}] + e^{2c}\Phi\Bigl(\frac{m-c}{s}\Bigr) - 1,

at most :math:`e^{2c} - 1` (:math:`2.35\cdot 10^{17}` for verl), and not monotone in :math:`s^2`:
the smallest :math:`s^2` that gives the logged value is taken, and a value no law of the family
reaches is named with the range the family does reach.

Without a ``kl`` metric, :math:`m = -s^2/2`: the engine samples the tokens, so
:math:`E[e^y] = 1` exactly for every token (a ``kl`` metric alone gives
:math:`s^2 = 2\,\mathrm{kl}`). The law of a step is the fit of the first available metric in
:data:`LAW_PRIORITY` whose value some law gives (``chi2`` first: it is the second moment the
sequence metrics rest on); a metric that no law gives is named in the law's ``notes``, and the
next one sets the law. The fits of the others are reported beside it, and their spread is the
first warning sign: for an i.i.d. lognormal law they agree, for heavy-tailed tokens (rare large
:math:`|y|`) the metrics that weigh the tail (``k3``, ``chi2``) give a larger :math:`s^2` than
those that do not (``mult``, ``absdiff``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

__all__ = ["LAW_PRIORITY", "TokenLaw", "fit_law", "log_partial_moment", "token_metric"]

#: Which spread metric sets the law when several are logged, first first.
LAW_PRIORITY = ("chi2", "k3", "mult", "absdiff", "tis_abs")

#: The largest :math:`s^2` a fit looks for.
_S2_MAX = 1e4


@dataclass(frozen=True)
class TokenLaw:
    r"""Token log-ratios :math:`y \sim N(m, s^2)`, i.i.d.

    ``source``: the metric it was fitted from; ``notes``: the metrics of the step that no law
    of the family gives, each with why.
    """

    m: float
    s2: float
    source: str = ""
    notes: tuple[str, ...] = ()

    def sequence(self, L) -> tuple[np.ndarray, np.ndarray]:
        r"""Return (M, S) of :math:`\log P_L \sim N(M, S^2)`: :math:`M = mL`, :math:`S = s\sqrt L`."""
        L = np.asarray(L, dtype=float)
        return self.m * L, np.sqrt(self.s2 * L)


def log_partial_moment(k: float, M, S, a: float, b: float) -> np.ndarray:
    r""":math:`\log E[e^{kX} 1\{a < X < b\}]`, :math:`X \sim N(M, S^2)`, elementwise in (M, S).

    :math:`= kM + k^2S^2/2 + \log(\Phi(\beta) - \Phi(\alpha))` with
    :math:`\alpha, \beta = (a, b) - M - kS^2` over :math:`S`; the normal mass is taken on the
    side of 0 where it does not cancel (:math:`\Phi(-\alpha) - \Phi(-\beta)` when
    :math:`\alpha > 0`), from ``log_ndtr``. :math:`S = 0` is the point mass at :math:`M`.
    """
    M, S = np.broadcast_arrays(np.asarray(M, float), np.asarray(S, float))
    shift = M + k * S * S
    with np.errstate(divide="ignore", invalid="ignore"):  # S = 0: a point mass, the bounds +-inf
        lo, hi = (a - shift) / S, (b - shift) / S
    lo = np.where(S == 0, np.where(shift > a, -np.inf, np.inf), lo)
    hi = np.where(S == 0, np.where(shift < b, np.inf, -np.inf), hi)
    flip = lo > 0
    lo, hi = np.where(flip, -hi, lo), np.where(flip, -lo, hi)
    l_hi, l_lo = special.log_ndtr(hi), special.log_ndtr(lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mass = l_hi + np.log(-np.expm1(np.minimum(l_lo - l_hi, 0.0)))
    log_mass = np.where(np.isneginf(l_hi) | (hi <= lo), -np.inf, log_mass)
    return k * M + 0.5 * k * k * S * S + log_mass


def _clamped_chi2(m, s2, c: float) -> np.ndarray:
    r""":math:`E[e^{2\operatorname{clip}(y, -c, c)}] - 1`, :math:`y \sim N(m, s^2)`, elementwise."""
    m, s2 = np.broadcast_arrays(np.asarray(m, float), np.asarray(s2, float))
    s = np.sqrt(s2)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_lo, z_hi = (-c - m) / s, (m - c) / s
    z_lo = np.where(s == 0, np.where(m < -c, np.inf, -np.inf), z_lo)
    z_hi = np.where(s == 0, np.where(m > c, np.inf, -np.inf), z_hi)
    parts = np.stack(
        [
            -2.0 * c + special.log_ndtr(z_lo),
            log_partial_moment(2.0, m, s, -c, c),
            2.0 * c + special.log_ndtr(z_hi),
        ]
    )
    return np.expm1(special.logsumexp(parts, axis=0))


def token_metric(kind: str, m: float, s2: float, clamp: float | None = None) -> float:
    r"""Return a token metric's value under :math:`y \sim N(m, s^2)` (the module docstring's table).

    ``clamp``: the framework clamps :math:`y` to :math:`[-c, c]` before averaging (``chi2`` only).
    """
    s = math.sqrt(s2)
    if clamp is not None:
        if kind != "chi2":
            raise ValueError(f"a clamp is known for the chi2 kind only, got kind {kind!r}")
        if s == 0.0:
            return math.expm1(2 * min(max(m, -clamp), clamp))
        if abs(m) < clamp:  # where the clamp changes the value by less than 1e-17, skip it
            z_hi, z_lo = (clamp - m - 2 * s2) / s, (-clamp - m - 2 * s2) / s
            if z_hi > 9.0 and z_lo < -9.0 and ((-clamp - m) / s < -38.0 or clamp + m + s2 > 18.5):
                return math.expm1(2 * m + 2 * s2)
        return float(_clamped_chi2(m, s2, clamp))
    if kind == "kl":
        return -m
    if kind == "k3":
        return math.expm1(m + s2 / 2) - m
    if kind == "chi2":
        return math.expm1(2 * m + 2 * s2)
    if s == 0.0:
        return {"mult": 1.0, "absdiff": abs(m), "tis_abs": abs(math.expm1(m))}[kind]
    z = m / s
    if kind == "mult":
        return math.exp(m + s2 / 2) * special.ndtr(z + s) + math.exp(-m + s2 / 2) * special.ndtr(s - z)
    if kind == "absdiff":
        return s * math.sqrt(2 / math.pi) * math.exp(-z * z / 2) + m * (1 - 2 * special.ndtr(-z))
    if kind == "tis_abs":
        e = math.exp(m + s2 / 2)
        return e - 1 + 2 * (special.ndtr(-z) - e * special.ndtr(-z - s))
    raise ValueError(f"unknown token metric kind {kind!r}; kinds are kl, {', '.join(LAW_PRIORITY)}")


def _family(m: float | None) -> str:
    return "N(-s^2/2, s^2)" if m is None else f"N({m:.6g}, s^2)"


def _solve_s2(kind: str, value: float, m: float | None, clamp: float | None = None) -> float:
    """Return :math:`s^2` with ``token_metric(kind, m, s2, clamp) == value`` (m None: :math:`m = -s^2/2`)."""

    def gap(s2: float) -> float:
        return token_metric(kind, -s2 / 2 if m is None else m, s2, clamp) - value

    if clamp is not None:
        return _solve_clamped(gap, kind, value, m, clamp)
    if gap(0.0) >= 0.0:
        return 0.0
    hi = 1e-6
    while gap(hi) < 0.0:
        hi *= 4.0
        if hi > _S2_MAX:
            raise ValueError(f"{kind} metric {value!r}: no token law N(m, s^2) with s^2 <= 1e4 gives it")
    return optimize.brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-12)


def _solve_clamped(gap, kind: str, value: float, m: float | None, clamp: float) -> float:
    """Return the smallest root of ``gap`` in [0, 1e4] (the unclamped one where the clamp does not bite)."""
    g0 = gap(0.0)
    if g0 == 0.0:
        return 0.0
    try:  # where the clamp changes nothing near the root, the unclamped root is the root
        s2 = _solve_s2(kind, value, m)
        if abs(gap(s2)) <= 1e-11 * (1.0 + abs(value)):
            return s2
    except ValueError:
        pass
    grid = np.concatenate([[0.0], np.geomspace(1e-12, _S2_MAX, 400)])
    mm = -grid / 2 if m is None else np.full(grid.size, m)
    g = _clamped_chi2(mm, grid, clamp) - value
    cross = np.flatnonzero(np.sign(g[1:]) != np.sign(g0))
    if cross.size == 0:
        reach = _clamped_chi2(mm, grid, clamp)
        raise ValueError(
            f"{value!r}: no token law {_family(m)} with s^2 <= 1e4 gives it under the framework's clamp of "
            f"log-ratios at +-{clamp:g} (such laws give {reach.min():.4g} to about {reach.max():.4g}; the "
            f"ceiling of the clamped metric, every token at the clamp, is e^{2 * clamp:g} - 1 = "
            f"{math.expm1(2 * clamp):.4g})"
        )
    i = int(cross[0]) + 1
    return optimize.brentq(gap, grid[i - 1], grid[i], xtol=1e-15, rtol=1e-12)


def fit_law(
    values: dict[str, float],
    kinds: dict[str, str],
    law_from: str | None = None,
    clamps: dict[str, float] | None = None,
) -> tuple[TokenLaw, dict[str, float]]:
    r"""Fit :math:`N(m, s^2)` to one step's token metrics.

    Parameters
    ----------
    values : dict
        Logged name -> value, for the names of ``kinds`` present.
    kinds : dict
        Logged name -> kind (one of :data:`~variance_lab.frameworks.logfiles.TOKEN_METRICS`'s dictionaries).
    law_from : str, optional
        The metric that sets the law (default: the first of :data:`LAW_PRIORITY` that some law gives).
    clamps : dict, optional
        Logged name -> the clamp :math:`c` of the framework's log-ratios for that metric
        (:data:`~variance_lab.frameworks.logfiles.TOKEN_CLAMP`).

    Returns
    -------
    (law, fits)
        The law from the first kind of :data:`LAW_PRIORITY` whose value a law gives; ``fits``
        maps every spread metric that a law gives to the :math:`s^2` it gives alone; the law's
        ``notes`` name the others and why. ``ValueError`` when no spread metric is present or
        none can be fitted (the message names each metric and why), or when ``law_from``'s
        value cannot.
    """
    clamps = clamps or {}
    m = None
    for name, kind in kinds.items():
        if kind == "kl" and name in values:
            m = -float(values[name])
    fits: dict[str, float] = {}
    problems: dict[str, str] = {}
    for name, kind in kinds.items():
        if kind == "kl" and name in values:  # with E[e^y] = 1, KL = -m = s^2/2 (> 0)
            if values[name] > 0:
                fits[name] = 2.0 * float(values[name])
            continue
        if name not in values:
            continue
        v = float(values[name])
        clamp = clamps.get(name)
        if clamp is None:
            floor = token_metric(kind, 0.0 if m is None else m, 0.0)
            if not math.isfinite(v) or v < floor - 1e-12:
                problems[name] = (
                    f"{name} = {v!r} is impossible for any token law (it is at least {floor:.6g})"
                )
                continue
        try:
            fits[name] = _solve_s2(kind, v, m, clamp)
        except ValueError as exc:
            problems[name] = f"{name} = {exc}" if clamp is not None else f"{name}: {exc}"
    if law_from is not None:
        if law_from not in kinds:
            raise ValueError(f"law_from {law_from!r} is not a token metric here; they are {', '.join(kinds)}")
        if law_from in problems:
            raise ValueError(problems[law_from])
        if law_from not in fits:
            raise ValueError(f"law_from {law_from!r}: the record does not log it (or logs kl <= 0)")
        s2 = fits[law_from]
        return TokenLaw(-s2 / 2 if m is None else m, s2, law_from, tuple(problems.values())), fits
    for kind in (*LAW_PRIORITY, "kl"):
        for name, k in kinds.items():
            if k == kind and name in fits:
                law = TokenLaw(
                    -fits[name] / 2 if m is None else m, fits[name], name, tuple(problems.values())
                )
                return law, fits
    if problems:
        raise ValueError("; ".join(problems.values()))
    names = ", ".join(kinds)
    raise ValueError(f"no token-level metric to fit a law from: expected one of {names}")
