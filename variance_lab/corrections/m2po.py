r"""Second-moment masks (M2PO): the batch rule, and its large-batch limit for a ratio law.

M2PO (Zheng et al. 2025, arXiv 2510.01161; AReaL's ``actor.m2_threshold``) sorts a batch's
tokens by :math:`y^2 = (\log r)^2` and masks the largest until the mean of :math:`y^2` over the
tokens left is below :math:`\tau`. :func:`batch_mask` is that rule on one batch, as AReaL writes
it (``_get_m2po_loss_mask`` in ``areal/trainer/ppo/actor.py``, inclusionAI/AReaL commit
00ed92443a5a): the suffix means of the values sorted in descending order, the first index
``k`` where the mean of the rest is strictly below :math:`\tau`, the ``k`` largest masked; when no
suffix mean is below :math:`\tau` every token but one is masked. :func:`batch_masks` applies it to
consecutive batches of ``B`` sequences.

In the large-batch limit the mask keeps exactly the tokens with :math:`y^2 \le q`, where
:math:`q` solves

.. math::

    E[y^2 \mid y^2 \le q] = \tau
    \quad\Longleftrightarrow\quad
    U(\sqrt q) := E[(y^2 - \tau)\,1\{|y| > \sqrt q\}] = E[y^2] - \tau =: D,

and nothing is masked when :math:`E[y^2] \le \tau` (:math:`q = \infty`). :math:`U` falls from
:math:`U(\sqrt\tau) \ge D` to 0 on :math:`(\sqrt\tau, \infty)` (its derivative is
:math:`-(s^2 - \tau) f_{|y|}(s)`), so the root is unique; :func:`m2po_cut` finds it by Brent's
method on :math:`\log U(s) - \log D`, which keeps its relative precision however small the masked
fraction. For :math:`y \sim N(m, v)`, :math:`\sigma = \sqrt v`, the two tails are closed:

.. math::

    E[(y^2 - \tau) 1\{y > s\}] = (m^2 + v - \tau)\,\bar\Phi(\alpha) + \sigma\varphi(\alpha)(s + m),
    \quad \alpha = (s - m)/\sigma,

and the lower tail is the same with :math:`m \to -m`. A lognormal mixture sums its components;
random-scale ratios (:math:`y \mid v \sim N(\log\mu - v/2, v)`, :math:`v \sim
\mathrm{Gamma}(\alpha, \theta)`) integrate them over :math:`v` by adaptive quadrature. In the
limit M2PO is the symmetric mask :math:`r\,1\{|\log r| \le \sqrt q\}`, so every closed form of
the masks applies to it (:func:`resolve_cut` sets :attr:`~variance_lab.corrections.specs.Correction.cut`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import integrate, optimize, special

from variance_lab.corrections.specs import Correction
from variance_lab.families import Family, LogNormal, LognormalMixture, RandomScale
from variance_lab.ratios import RIGHT_OPEN, BoundRule

__all__ = ["M2PO_RULE", "batch_mask", "batch_masks", "m2po_cut", "resolve_cut"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: M2PO's test of a running mean of :math:`y^2` against :math:`\tau`: below when strictly below
#: (a mean equal to :math:`\tau` is not), in float64.
M2PO_RULE = BoundRule(RIGHT_OPEN, "value", "float64")


# --------------------------------------------------------------------------------------
# the rule on a batch
# --------------------------------------------------------------------------------------
def batch_mask(y: np.ndarray, tau: float, rule: BoundRule = M2PO_RULE) -> np.ndarray:
    r"""Return where M2PO masks the tokens of a batch (the last axis; leading axes are separate batches).

    Sorted ascending, the mean of the :math:`j` smallest :math:`y^2` rises with :math:`j`; the
    tokens kept are the largest :math:`j` whose mean is strictly below :math:`\tau` (at least
    one: AReaL keeps one token when even the smallest is not below it). Computed as AReaL does
    on a CPU: :math:`y^2` in ``rule.dtype``, the running sums from the smallest up (its suffix
    sums of the descending sort) accumulated in float64 and rounded to ``rule.dtype`` (torch's
    CPU ``cumsum``; on a GPU it accumulates float32 in float32), each divided by its count in
    ``rule.dtype`` and compared with :math:`\tau` by the rule. Ties at the cut are masked in
    order of appearance, as ``torch.sort(descending=True)`` orders up to 16 values on a CPU;
    beyond that torch's order among equal values is unspecified: the number of each value
    masked is the same, which of the tied tokens may differ.

    Parameters
    ----------
    y : ndarray
        Token log-ratios, shape ``(..., N)``.
    tau : float
        The threshold of the mean of :math:`y^2` over the kept tokens.
    rule : BoundRule, default :data:`M2PO_RULE`
        The comparison of a running mean with :math:`\tau` (a mean is below when the rule keeps
        it) and the dtype of the whole computation: float64 here, float32 for AReaL's float32
        log-probabilities (:data:`variance_lab.frameworks.areal.M2PO_F32_RULE`).

    Returns
    -------
    ndarray of bool
        True where the token is masked; the shape of ``y``.
    """
    dt = np.dtype(rule.dtype)
    y = np.asarray(y, dtype=dt)
    if y.shape[-1] == 0:
        return np.zeros(y.shape, dtype=bool)
    y2 = y * y
    n = y.shape[-1]
    order = np.argsort(-y2, axis=-1, kind="stable")  # descending, ties by appearance
    ascending = np.take_along_axis(y2, order, axis=-1)[..., ::-1]
    # torch's CPU cumsum accumulates float32 in float64 and rounds each running sum to float32
    sums = np.cumsum(ascending, axis=-1, dtype=np.float64).astype(dt)
    means = sums / np.arange(1, n + 1, dtype=dt)
    below = rule.inside(means, None, tau)
    last = n - np.argmax(below[..., ::-1], axis=-1)  # the largest j with mean_j < tau
    keep = np.where(below.any(axis=-1), last, 1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n), order.shape), axis=-1)
    return rank < (n - keep)[..., None]


def batch_masks(
    log_r: np.ndarray, offsets, tau: float, batch: int, rule: BoundRule = M2PO_RULE
) -> np.ndarray:
    """Apply :func:`batch_mask` to consecutive batches of ``batch`` sequences (the last may be smaller).

    ``log_r`` holds every sequence's tokens concatenated, sequence ``i`` being
    ``log_r[offsets[i]:offsets[i+1]]``; a batch pools the tokens of its sequences.
    """
    log_r = np.asarray(log_r, dtype=float)
    off = np.asarray(offsets, dtype=np.int64)
    out = np.zeros(log_r.shape, dtype=bool)
    n = off.size - 1
    for start in range(0, n, batch):
        lo, hi = off[start], off[min(start + batch, n)]
        out[lo:hi] = batch_mask(log_r[lo:hi], tau, rule)
    return out


# --------------------------------------------------------------------------------------
# the large-batch limit
# --------------------------------------------------------------------------------------
def _log_tail_terms(s: float, tau: float, m, v) -> tuple[np.ndarray, np.ndarray]:
    r"""Log-magnitudes and signs of the four terms of :math:`U_j(s)` for normal components (m, v)."""
    m, v = np.asarray(m, dtype=float), np.asarray(v, dtype=float)
    sd = np.sqrt(v)
    c = m * m + v - tau
    logs, signs = [], []
    for mm in (m, -m):  # upper tail of y, then of -y (a zero coefficient: log 0 = -inf, sign 0)
        alpha = (s - mm) / sd
        with np.errstate(divide="ignore"):
            logs.append(np.log(np.abs(c)) + special.log_ndtr(-alpha))
            logs.append(np.log(sd) - 0.5 * alpha * alpha - _LOG_SQRT_2PI + np.log(np.abs(s + mm)))
        signs += [np.sign(c), np.sign(s + mm)]
    return np.array(logs), np.array(signs)


def _log_U_normal(s: float, tau: float, w, m, v) -> float:
    r""":math:`\log U(s)` for a mixture of normals with weights ``w`` (one component: ``w = [1]``)."""
    logs, signs = _log_tail_terms(s, tau, m, v)
    logs = logs + np.log(np.asarray(w, dtype=float))
    val, sign = special.logsumexp(logs.ravel(), b=signs.ravel(), return_sign=True)
    return float(val) if sign > 0 else -math.inf


def _law(family: Family):
    """Return ``(D, log U)`` of the family's marginal law of log r; ``ValueError`` for other families."""
    if isinstance(family, LogNormal) and type(family) is LogNormal:
        comps = [(1.0, family.mean_log, family.var_log)]
    elif isinstance(family, LognormalMixture):
        comps = [(w, m, v) for w, m, v in family.components if w > 0]
    elif isinstance(family, RandomScale):
        return _random_scale_law(family)
    else:
        raise ValueError(
            f"m2po's large-batch limit is computed for the lognormal, lognormal-mixture and random-scale "
            f"families, not {family.name!r}; use simulate_corrections (Monte Carlo) for it"
        )
    w, m, v = (np.array(x, dtype=float) for x in zip(*comps, strict=True))
    second = float(np.sum(w * (m * m + v)))
    if np.any(v == 0):
        return second, _point_mass_log_U(w, m, v)
    return second, lambda s, tau: _log_U_normal(s, tau, w, m, v)


def _point_mass_log_U(w, m, v):
    """Return log U for components some of which are point masses (v = 0): their tail is a step."""

    def log_u(s, tau):
        pos = v > 0
        terms = []
        if pos.any():
            terms.append(_log_U_normal(s, tau, w[pos], m[pos], v[pos]))
        out = np.abs(m[~pos]) > s
        total = math.exp(terms[0]) if terms and terms[0] > -math.inf else 0.0
        total += float(np.sum(w[~pos][out] * (m[~pos][out] ** 2 - tau)))
        return math.log(total) if total > 0 else -math.inf

    return log_u


def _random_scale_law(family: RandomScale):
    r""":math:`E[y^2]` and :math:`\log U` for random-scale ratios: quadrature over the variance."""
    lam = math.log(family.mu)
    if family.degenerate:
        return lam * lam, lambda s, tau: math.log(max(lam * lam - tau, 0.0)) if abs(lam) > s else -math.inf
    a, th = family.alpha, family.theta
    ev, ev2 = a * th, a * (a + 1) * th * th
    second = lam * lam - lam * ev + ev2 / 4 + ev
    const = -special.gammaln(a) - a * math.log(th)
    t_lo = math.log(th) + (math.log(1e-20) + special.gammaln(a + 1)) / a
    t_hi = math.log(th * special.gammainccinv(a, 1e-20))

    def log_u(s, tau):
        def f(t):
            v = math.exp(t)
            lu = _log_U_normal(s, tau, [1.0], [lam - v / 2], [v])
            return math.exp(lu + a * t - v / th + const) if lu > -math.inf else 0.0

        grid = np.linspace(t_lo, t_hi, 33)
        val, _ = integrate.quad(f, t_lo, t_hi, points=grid[1:-1], epsabs=0.0, epsrel=1e-12, limit=500)
        return math.log(val) if val > 0 else -math.inf

    return second, log_u


def m2po_cut(family: Family, tau: float) -> float:
    r"""Return :math:`\sqrt q`, the half-width of the band of :math:`\log r` M2PO keeps in a large batch.

    The root of :math:`U(s) = D` (module docstring) by Brent's method on
    :math:`\log U(s) - \log D`, bracketed from :math:`\sqrt\tau` up; ``inf`` when
    :math:`E[(\log r)^2] \le \tau` (nothing masked). The masked fraction is then
    :math:`P(|\log r| > \sqrt q)`.

    Parameters
    ----------
    family : LogNormal, LognormalMixture or RandomScale
    tau : float
        The threshold, > 0.

    Raises
    ------
    ValueError
        For another family or a bad ``tau``.
    """
    tau = float(tau)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    second, log_u = _law(family)
    D = second - tau
    if not D > 0:
        return math.inf
    log_d = math.log(D)
    lo = math.sqrt(tau)
    if not log_u(lo, tau) >= log_d:  # every value is at +-s0 with s0 <= sqrt(tau): all but them kept
        return lo
    hi = 2.0 * max(lo, math.sqrt(second))
    while log_u(hi, tau) >= log_d:
        hi *= 2.0
    return optimize.brentq(lambda s: log_u(s, tau) - log_d, lo, hi, xtol=1e-300, rtol=1e-15, maxiter=500)


def resolve_cut(c: Correction, family: Family) -> Correction:
    """Return ``c`` with its large-batch cut set against ``family`` (``m2po``); any other ``c`` unchanged."""
    if c.kind != "m2po" or c.cut is not None:
        return c
    return dataclasses.replace(c, cut=m2po_cut(family, c.params[0]))
