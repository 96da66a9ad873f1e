r"""The theory of the probability-aware masks: a stated model of the token's probabilities, exact fractions.

A ratio family says nothing about the probability of the token, and ``dppo-tv``, ``dppo-kl`` and
``kpop`` (:mod:`variance_lab.corrections.probmask`) cannot be evaluated without it. The model here:

- the sampler's probability of the sampled token, :math:`q = \mu(y)`, has a stated law
  (:class:`TokenProbability`): :math:`q \sim \mathrm{Beta}(a, b)`, by default
  :data:`TOKEN_PROB_DEFAULT` = Beta(0.2, 0.6), rounded from the maximum-likelihood fit (0.206,
  0.585) to the 23,331 sampler probabilities of ``data/smollm2/smollm2_mismatch_bf16.jsonl.gz``
  (fp16: 0.210, 0.651; the stale run: 0.204, 0.591), or a fixed probability (``point``);
- the trained policy moves the token's log-odds against all other tokens by
  :math:`Y = \operatorname{logit}\pi(y) - \operatorname{logit}\mu(y)`, independent of :math:`q`, with the
  family's law of :math:`\log r` (lognormal: :math:`N(m, v)`; a lognormal mixture: its components).
  So :math:`\pi = \sigma(\operatorname{logit} q + Y)` stays a probability and the token's ratio is

  .. math::

      r = \frac{\pi}{q} = \frac{e^Y}{1 - q + q e^Y}, \qquad \log r \approx Y \ (q \to 0), \qquad
      \log r \approx (1 - q) Y \ (q \to 1):

  the family is the law of the log-ratio of rare tokens, and likely tokens' ratios are tamer.
  On the shipped SmolLM2 runs this is what the data do: the variance of the mismatch log-ratio
  falls from 5.1e-3 (q < 0.001) to 3.8e-7 (q > 0.99) in the bf16 run, while the variance of
  :math:`Y` stays between 5.0e-3 and 1.2e-2 (fp16: 8.6e-5 to 2.2e-4 against 8.6e-5 to 7.8e-9).

Given :math:`l = \operatorname{logit} q`, :math:`\pi` rises with :math:`Y`, so each mask keeps an
interval :math:`[y_\downarrow(l), y_\uparrow(l)]` of :math:`Y` (:func:`mask_bands`):

- TV: :math:`y_\uparrow = \operatorname{logit}(q + \delta) - l` when :math:`q + \delta < 1` (else
  :math:`\infty`), :math:`y_\downarrow = \operatorname{logit}(q - \delta) - l` when :math:`q > \delta`
  (else :math:`-\infty`);
- DPPO's KL: the two roots of :math:`D(q \| \sigma(l + Y)) = \delta` (both exist: the divergence is
  convex in :math:`Y`, 0 at 0, unbounded on both sides);
- KPop: the tighter of those and the roots of :math:`D(\sigma(l + Y) \| q) = \delta`, which exist
  only for :math:`\delta < -\log q` (above) and :math:`\delta < -\log(1 - q)` (below): for a rare
  token the forward divergence can never exceed :math:`-\log(1-q) \approx q`.

The roots are found by bisection on :math:`[0, \pm 10^3]` (100 halvings: :math:`8\cdot10^{-28}`
absolute); a root beyond :math:`10^3` is taken as :math:`\pm\infty` (the families allowed here put
no probability there in double precision). The masked fractions given :math:`l` are normal tails,
:math:`F_\uparrow(l) = P(Y > y_\uparrow)` and :math:`F_\downarrow(l) = P(Y < y_\downarrow)`
(:func:`mask_given_q`); DPPO masks :math:`F_\uparrow` when :math:`A > 0` and :math:`F_\downarrow`
otherwise, KPop both. The weight moments given :math:`l`, :math:`E[r^k 1\{\text{kept}\}]`, are
composite Gauss-Legendre sums (16 panels of 16 nodes) in :math:`z = (Y - m)/\sqrt v` over the kept
interval within :math:`[-12, 12 + 2\sqrt v]` (the normal mass outside is below :math:`4\cdot10^{-33}`,
and the tilt :math:`r^2 \le e^{2Y}` is covered). Every quantity is then integrated against the law
of :math:`l` (the Beta density in logit space, :math:`\sigma(l)^a \sigma(-l)^b / B(a, b)`) by
``scipy.integrate.cubature`` (Gauss-Kronrod 21, relative tolerance :math:`10^{-11}` on each
quantity), between the logits where the Beta law leaves :data:`TOKEN_PROB_TAIL` = 1e-20 out on each
side, split where a band's side appears (TV: :math:`q = \delta, 1 - \delta`; KPop's forward side:
:math:`\delta = -\log q`, :math:`-\log(1 - q)`) and where KPop's tighter divergence switches from one
direction to the other (found by Brent's method on the difference of the two roots). The mask
fractions are checked against an independent mpmath quadrature (``tests/corrections/test_tokenprob.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from variance_lab.corrections.probmask import binary_kl, fixed_sides
from variance_lab.corrections.specs import Correction

__all__ = [
    "TOKEN_PROB_DEFAULT",
    "TOKEN_PROB_TAIL",
    "TokenProbability",
    "band_kinks",
    "components_of",
    "integrate_logit",
    "mask_bands",
    "mask_given_q",
    "prob_log_moments",
]

#: Mass of the law of :math:`q` left out at each end of the integrals.
TOKEN_PROB_TAIL = 1e-20
_CAP = 1e3  # |Y| beyond which a root counts as infinite
_BISECT = 64
_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)
_PANELS = 16
_Z = 12.0  # half-width of the inner window in standard deviations
_RTOL = 1e-11


def _softplus(x):
    return np.logaddexp(0.0, x)


@dataclass(frozen=True)
class TokenProbability:
    r"""The law of :math:`q = \mu(y)`, the sampler's probability of the sampled token: Beta or fixed.

    Attributes
    ----------
    a, b : float
        :math:`q \sim \mathrm{Beta}(a, b)`, both > 0.
    point : float or None
        A fixed probability in (0, 1) instead of the Beta law (``a`` and ``b`` are then unused).
    """

    a: float = 0.2
    b: float = 0.6
    point: float | None = None

    def __post_init__(self):
        """Check the parameters; ``ValueError`` naming the bad one."""
        if self.point is not None:
            if not (isinstance(self.point, int | float) and 0.0 < self.point < 1.0):
                raise ValueError(f"the token's probability must lie in (0, 1), got {self.point!r}")
            return
        for name, v in (("a", self.a), ("b", self.b)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"Beta law of the token's probability: {name} must be > 0, got {v!r}")

    @classmethod
    def fixed(cls, q: float) -> TokenProbability:
        """Return the law that puts every token at probability ``q``."""
        return cls(point=q)

    def describe(self) -> dict:
        """Return the law's parameters for a sidecar or a frame's provenance."""
        if self.point is not None:
            return {"token_prob": "fixed", "q": self.point}
        return {"token_prob": "beta", "a": self.a, "b": self.b}

    def label(self) -> str:
        """Return the law in words, e.g. ``Beta(0.2, 0.6)`` or ``q = 0.3``."""
        return f"q = {self.point:g}" if self.point is not None else f"Beta({self.a:g}, {self.b:g})"

    def log_density(self, l) -> np.ndarray:
        r"""Return the log density of :math:`l = \operatorname{logit} q` under the Beta law.

        :math:`a\log\sigma(l) + b\log\sigma(-l) - \log B(a, b)`.
        """
        l = np.asarray(l, dtype=float)
        return -self.a * _softplus(-l) - self.b * _softplus(l) - special.betaln(self.a, self.b)

    def logit_range(self, tail: float = TOKEN_PROB_TAIL) -> tuple[float, float]:
        """Return the logits between which the Beta law leaves ``tail`` out on each side."""
        lo = special.betaincinv(self.a, self.b, tail)  # q
        hi = special.betaincinv(self.b, self.a, tail)  # 1 - q
        return float(special.logit(lo)), float(-special.logit(hi))

    def draw_logit(self, rng: np.random.Generator, size) -> np.ndarray:
        r"""Draw :math:`\operatorname{logit} q`: a fixed value, or :math:`\log G_a - \log G_b`.

        :math:`G_a, G_b` are independent standard gammas of shapes ``a`` and ``b``, so
        :math:`G_a / (G_a + G_b)` is Beta(a, b); the difference of logs never rounds to 0 or 1.
        """
        if self.point is not None:
            return np.full(size, float(special.logit(self.point)))
        tiny = np.finfo(float).tiny
        ga = np.maximum(rng.standard_gamma(self.a, size), tiny)
        gb = np.maximum(rng.standard_gamma(self.b, size), tiny)
        return np.log(ga) - np.log(gb)


#: The default law: Beta(0.2, 0.6), fitted to the SmolLM2 sampler's token probabilities (module docstring).
TOKEN_PROB_DEFAULT = TokenProbability(0.2, 0.6)


def components_of(family) -> tuple[tuple[float, float, float], ...]:
    """Return the normal components (weight, mean, variance) of the law of Y (lognormal or mixture)."""
    from variance_lab.families import LogNormal, LognormalMixture

    if type(family) is LogNormal:
        comps = ((1.0, float(family.mean_log), float(family.var_log)),)
    elif type(family) is LognormalMixture:
        comps = tuple((float(w), float(m), float(v)) for w, m, v in family.components)
    else:
        raise ValueError(
            f"the probability-aware masks' theory covers the lognormal and lognormal-mixture families, "
            f"not {family.name!r}; use simulate_corrections (Monte Carlo) for it"
        )
    for _, m, v in comps:
        if abs(m) + 40.0 * math.sqrt(v) >= _CAP:
            raise ValueError(
                f"the law of Y (mean {m:g}, variance {v:g}) reaches |Y| = {_CAP:g}, where the masks' roots "
                "are cut: out of the theory's range"
            )
    return comps


# --------------------------------------------------------------------------------------
# the kept band of Y given l = logit q
# --------------------------------------------------------------------------------------
def _logs(l, y):
    """(log q, log(1 - q), log pi, log(1 - pi)) from the log-odds l and the shift y."""
    return -_softplus(-l), -_softplus(l), -_softplus(-(l + y)), -_softplus(l + y)


def _reverse(l, y):
    """D(q || pi), DPPO-KL's divergence (the sampler first)."""
    lq, lq1, lp, lp1 = _logs(l, y)
    return binary_kl(lq, lq1, lp, lp1)


def _forward(l, y):
    """D(pi || q)."""
    lq, lq1, lp, lp1 = _logs(l, y)
    return binary_kl(lp, lp1, lq, lq1)


def _d_reverse(l, y):
    """d/dY D(q || sigma(l + Y)) = pi - q."""
    return special.expit(l + y) - special.expit(l)


def _d_forward(l, y):
    """d/dY D(sigma(l + Y) || q) = Y pi (1 - pi)."""
    return y * special.expit(l + y) * special.expit(-(l + y))


#: The ladder that brackets a root: |Y| = 2^k, k = -30..10 (a root below 2^-30 is taken there).
_LADDER = 2.0 ** np.arange(-30, 11)


def _root(div, ddiv, l: np.ndarray, delta: float, sign: float) -> np.ndarray:
    """Return the Y of sign ``sign`` where ``div(l, Y)`` reaches ``delta`` (``sign * inf`` past the cap).

    ``div`` is 0 at 0 and rises in :math:`|Y|`.

    Bracketed on :data:`_LADDER`, then safeguarded Newton: a step that leaves the bracket is a
    bisection, so the bracket at least halves every step and 64 steps reach 2^-64 of its width.
    """
    over = div(l[:, None], sign * _LADDER[None, :]) > delta
    never = ~over[:, -1]
    first = np.argmax(over, axis=1)
    hi = _LADDER[first]
    lo = np.where(first > 0, _LADDER[np.maximum(first - 1, 0)], 0.0)
    y = hi.copy()
    for _ in range(_BISECT):
        f = div(l, sign * y) - delta
        hi, lo = np.where(f > 0, y, hi), np.where(f > 0, lo, y)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = y - f / (sign * ddiv(l, sign * y))
        inside = np.isfinite(step) & (step > lo) & (step < hi)
        new = np.where(inside, step, 0.5 * (lo + hi))
        done = np.all(np.abs(new - y) <= 4e-16 * np.abs(y)) or np.all(hi - lo <= 4e-16 * hi)
        y = new
        if done:
            break
    return np.where(never, sign * math.inf, sign * y)


def mask_bands(c: Correction, logit_q) -> tuple[np.ndarray, np.ndarray]:
    r"""Return :math:`(y_\downarrow, y_\uparrow)`: the interval of the log-odds shift :math:`Y` a mask keeps.

    :math:`Y = \operatorname{logit}\pi - \operatorname{logit} q`.

    Parameters
    ----------
    c : Correction
        ``dppo-tv``, ``dppo-kl`` or ``kpop``.
    logit_q : array_like
        :math:`\operatorname{logit} q` of each token.

    Returns
    -------
    (y_down, y_up) : tuple of ndarray
        A side that never masks is :math:`\mp\infty`. DPPO masks :math:`Y > y_\uparrow` when
        :math:`A > 0`, :math:`Y < y_\downarrow` otherwise; KPop masks outside the interval.
    """
    fixed_sides(c)
    l = np.asarray(logit_q, dtype=float)
    delta = c.params[0]
    if c.kind == "dppo-tv":
        q, qc = special.expit(l), special.expit(-l)
        with np.errstate(invalid="ignore", divide="ignore"):
            up = np.where(qc > delta, np.log(q + delta) - np.log(qc - delta) - l, math.inf)
            down = np.where(q > delta, np.log(q - delta) - np.log(qc + delta) - l, -math.inf)
        return down, up
    flat = l.ravel()
    down, up = (_root(_reverse, _d_reverse, flat, delta, sign) for sign in (-1.0, 1.0))
    if c.kind == "kpop":
        down = np.maximum(down, _root(_forward, _d_forward, flat, delta, -1.0))
        up = np.minimum(up, _root(_forward, _d_forward, flat, delta, 1.0))
    return down.reshape(l.shape), up.reshape(l.shape)


def _tails(down, up, comps) -> tuple[np.ndarray, np.ndarray]:
    """(P(Y > up), P(Y < down)) under the normal mixture ``comps``."""
    f_up, f_down = np.zeros(np.shape(up)), np.zeros(np.shape(down))
    for w, m, v in comps:
        if v > 0:
            s = math.sqrt(v)
            f_up += w * special.ndtr((m - up) / s)
            f_down += w * special.ndtr((down - m) / s)
        else:  # a point mass: Y = m
            f_up += w * (m > up)
            f_down += w * (m < down)
    return f_up, f_down


def mask_given_q(c: Correction, family_or_components, logit_q) -> tuple[np.ndarray, np.ndarray]:
    r"""Return :math:`(F_\uparrow, F_\downarrow)`: the probabilities that a token is masked above and below.

    The token's sampler probability has log-odds ``logit_q``.

    DPPO's masked fraction is :math:`F_\uparrow` for :math:`A > 0` and :math:`F_\downarrow` for
    :math:`A \le 0`; KPop's is their sum.

    Parameters
    ----------
    c : Correction
    family_or_components : Family or tuple of (weight, mean, variance)
        The law of :math:`Y` (:func:`components_of`).
    logit_q : array_like
    """
    comps = (
        family_or_components
        if isinstance(family_or_components, tuple)
        else components_of(family_or_components)
    )
    down, up = mask_bands(c, logit_q)
    return _tails(down, up, comps)


# --------------------------------------------------------------------------------------
# weight moments given l, and the integrals over the law of l
# --------------------------------------------------------------------------------------
def _band_moments(l, down, up, comps, powers=(1.0, 2.0)) -> np.ndarray:
    """E[r^k 1{down <= Y <= up}] for each l (rows) and power k (columns): Gauss-Legendre in z."""
    out = np.zeros((l.size, len(powers)))
    t = ((np.arange(_PANELS)[:, None] + (_GL_X[None, :] + 1.0) / 2.0) / _PANELS).ravel()
    wt = np.tile(_GL_W / 2.0, _PANELS) / _PANELS
    for w, m, v in comps:
        if v <= 0:
            y = np.full(l.shape, m)
            logr = _softplus(-l) - _softplus(-(l + y))
            inside = (down <= m) & (m <= up)
            out += w * np.where(inside[:, None], np.exp(np.multiply.outer(logr, powers)), 0.0)
            continue
        s = math.sqrt(v)
        top = _Z + max(powers) * s
        zlo = np.clip((down - m) / s, -_Z, top)
        zhi = np.clip((up - m) / s, -_Z, top)
        width = np.maximum(zhi - zlo, 0.0)
        z = zlo[:, None] + width[:, None] * t[None, :]
        logr = _softplus(-l)[:, None] - _softplus(-(l[:, None] + m + s * z))
        base = (width[:, None] * wt[None, :]) * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
        for j, k in enumerate(powers):
            out[:, j] += w * np.sum(base * np.exp(k * logr), axis=1)
    return out


def _integrand(c: Correction, comps, l: np.ndarray) -> np.ndarray:
    """Columns: F_up, F_down, then E[r 1{kept}], E[r^2 1{kept}] per kept set, then E[r], E[r^2]."""
    down, up = mask_bands(c, l)
    f_up, f_down = _tails(down, up, comps)
    inf = np.full(l.shape, math.inf)
    if c.signed:  # A > 0 keeps Y <= up, A <= 0 keeps Y >= down
        kept = [_band_moments(l, -inf, up, comps), _band_moments(l, down, inf, comps)]
    else:
        kept = [_band_moments(l, down, up, comps)]
    base = _band_moments(l, -inf, inf, comps)
    return np.column_stack([f_up, f_down, *kept, base])


def _crossings(delta: float, sign: float) -> list[float]:
    """Logits of q where KPop's binding side switches between D(q || pi) and D(pi || q) (kinks)."""
    from scipy import optimize

    def gap(l):
        l = np.atleast_1d(np.asarray(l, dtype=float))
        rev = _root(_reverse, _d_reverse, l, delta, sign)
        fwd = _root(_forward, _d_forward, l, delta, sign)
        with np.errstate(invalid="ignore"):  # inf - inf where neither side binds
            return rev - fwd

    grid = np.linspace(-40.0, 40.0, 3201)
    g = gap(grid)
    ok = np.isfinite(g[:-1]) & np.isfinite(g[1:]) & (np.sign(g[:-1]) != np.sign(g[1:]))
    return [
        float(optimize.brentq(lambda x: float(gap(x)[0]), grid[i], grid[i + 1], xtol=1e-14, rtol=1e-15))
        for i in np.flatnonzero(ok)
    ]


@functools.lru_cache(maxsize=64)
def band_kinks(c: Correction) -> tuple[float, ...]:
    """Return the logits of q where a side of the band appears or vanishes, or switches divergence (kinks)."""
    d = c.params[0]
    if c.kind == "dppo-tv":
        return (math.log(d / (1 - d)), -math.log(d / (1 - d)))
    if c.kind == "kpop":  # delta = -log q, delta = -log(1 - q), and where the tighter divergence switches
        return (-math.log(math.expm1(d)), math.log(math.expm1(d)), *_crossings(d, 1.0), *_crossings(d, -1.0))
    return ()


_QX, _QW = np.polynomial.legendre.leggauss(10)
_PANEL0 = 0.5  # width of the first panels in logit q


def _adaptive(f, edges: list[float], rtol: float = _RTOL, max_panels: int = 200_000) -> np.ndarray:
    r"""Integrate the columns of ``f(l)`` (shape (n, C)) over ``[edges[0], edges[-1]]``, adaptively.

    The first panels are at most :data:`_PANEL0` = 0.5 wide (a feature of the integrand narrower than
    that in :math:`l` would need a normal law of :math:`Y` with :math:`\sqrt v \lesssim 10^{-2}`);
    each panel is summed by 10-point Gauss-Legendre whole and in two halves; the halves' sum is
    its value and their difference from the whole its error. Every panel whose error exceeds its
    share (by width) of ``rtol * |total|`` in some column is halved, all of them evaluated in one
    call of ``f``, until every column's summed error is within ``rtol`` of its total.
    """
    panels = np.array(
        [
            (a + (b - a) * k / n, a + (b - a) * (k + 1) / n)
            for a, b in itertools.pairwise(edges)
            for n in [max(4, math.ceil((b - a) / _PANEL0))]
            for k in range(n)
        ]
    )
    length = edges[-1] - edges[0]
    done_val = done_err = 0.0
    while True:
        a, b = panels[:, 0], panels[:, 1]
        mid = 0.5 * (a + b)
        parts = [(a, b), (a, mid), (mid, b)]
        nodes = np.concatenate(
            [(0.5 * (hi - lo))[:, None] * _QX[None, :] + (0.5 * (hi + lo))[:, None] for lo, hi in parts]
        )
        vals = f(nodes.ravel()).reshape(3, a.size, _QX.size, -1)
        sums = (
            np.einsum("pnqc,q->pnc", vals, _QW) * np.stack([0.5 * (hi - lo) for lo, hi in parts])[:, :, None]
        )
        value, err = sums[1] + sums[2], np.abs(sums[1] + sums[2] - sums[0])
        total = done_val + value.sum(axis=0)
        tol = rtol * np.abs(total)
        if np.all(done_err + err.sum(axis=0) <= tol):
            return total
        share = (b - a)[:, None] / length * tol[None, :]
        split = np.any(err > share, axis=1)
        done_val = done_val + value[~split].sum(axis=0)
        done_err = done_err + err[~split].sum(axis=0)
        if 2 * split.sum() > max_panels or not split.any():
            raise ValueError("the quadrature over the token's probability did not converge")
        panels = np.concatenate(
            [np.column_stack([a[split], mid[split]]), np.column_stack([mid[split], b[split]])]
        )


def integrate_logit(f, law: TokenProbability, kinks=()) -> np.ndarray:
    r"""Return :math:`\int f(l)\rho(l)\,dl`: each column of ``f`` against the law of logit q.

    ``f`` maps a 1-D array of logits to an array of shape ``(len(l), C)``. A fixed law evaluates ``f``
    at its logit; the Beta law is integrated between the logits where it leaves
    :data:`TOKEN_PROB_TAIL` out on each side, split at the ``kinks`` inside that range, by this
    module's batched adaptive Gauss-Legendre quadrature (relative tolerance :math:`10^{-11}` on each
    column; module docstring). ``ValueError`` when it does not converge.
    """
    if law.point is not None:
        return f(np.array([float(special.logit(law.point))]))[0]
    lo, hi = law.logit_range()
    edges = [lo, *sorted(p for p in kinks if lo < p < hi), hi]
    return _adaptive(lambda l: f(l) * np.exp(law.log_density(l))[:, None], edges)


@functools.lru_cache(maxsize=256)
def _integrals(c: Correction, comps: tuple, law: TokenProbability) -> np.ndarray:
    """Integrate the integrand's columns against the law of logit q (module docstring)."""
    try:
        return integrate_logit(lambda l: _integrand(c, comps, l), law, band_kinks(c))
    except ValueError as exc:
        raise ValueError(f"{c.spec!r}: {exc}") from None


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def prob_log_moments(c: Correction, family_or_components, law: TokenProbability = TOKEN_PROB_DEFAULT) -> dict:
    r"""Return, per row, (log E[w], log E[w^2], log frac_modified, log E[r]) of a probability-aware mask.

    The token weight is :math:`w = r` where kept and 0 where masked, under the model of the module
    docstring. Rows: ``"all"`` for ``kpop``; ``"all"``, ``"A>0"``, ``"A<=0"`` for DPPO (the sign
    independent of the tokens, :math:`P(A > 0) = p` of the spec, so :math:`E[w^j] = p E_+[w^j] +
    (1 - p) E_-[w^j]`); and ``"ratio"``: (log E[r], log E[r^2]) of the unmasked ratio, the
    baseline of the masks' variance.

    Parameters
    ----------
    c : Correction
        ``dppo-tv``, ``dppo-kl`` or ``kpop``.
    family_or_components : Family or tuple
        The law of :math:`Y` (:func:`components_of`).
    law : TokenProbability
        The law of :math:`q`.
    """
    comps = (
        family_or_components
        if isinstance(family_or_components, tuple)
        else components_of(family_or_components)
    )
    if not isinstance(law, TokenProbability):
        raise ValueError(f"token_prob must be a TokenProbability, got {law!r}")
    v = _integrals(c, comps, law)
    f_up, f_down, lbase = float(v[0]), float(v[1]), _log(float(v[-2]))
    ratio = (lbase, _log(float(v[-1])))
    if not c.signed:
        return {"all": (_log(v[2]), _log(v[3]), _log(min(f_up + f_down, 1.0)), lbase), "ratio": ratio}
    p = c.p_positive
    rows = {
        "A>0": (_log(v[2]), _log(v[3]), _log(min(f_up, 1.0)), lbase),
        "A<=0": (_log(v[4]), _log(v[5]), _log(min(f_down, 1.0)), lbase),
    }
    mix = [p * float(v[2]) + (1 - p) * float(v[4]), p * float(v[3]) + (1 - p) * float(v[5])]
    rows["all"] = (_log(mix[0]), _log(mix[1]), _log(min(p * f_up + (1 - p) * f_down, 1.0)), lbase)
    rows["ratio"] = ratio
    return rows
