r"""The lognormal mixture: heavy-tailed, sparse token ratios, i.i.d. from a mixture of lognormals.

Its components (weight, mean, variance of :math:`\log r`) are parsed and written once here
(:func:`parse_components`, :func:`format_components`, :func:`mixture_components` for many
mixtures at once). The class derives :math:`\mu, \sigma^2` from them and holds :math:`K(s)`
(float64 and mpmath), the log-ratio moments, the sampler parameters and the float64 theory
parts (:attr:`Family.float_parts`): the cumulants from the exact Taylor coefficients of the
moment generating function about :math:`E[\log r]`, many mixtures in one call, their
components padded with weight 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np
from scipy import special

from variance_lab._validate import check_finite
from variance_lab.families.base import CODE_MIXTURE, Family
from variance_lab.families.series import SERIES_TERMS, forward_diffs, pick, series_diffs, series_tail
from variance_lab.stats.special import UNIT_ROUNDOFF as U

__all__ = ["LognormalMixture", "format_components", "mixture_components", "parse_components"]


def parse_components(spec) -> tuple[tuple[float, float, float], ...]:
    """Components of a lognormal mixture as ``((weight, mean, variance), ...)`` in log space.

    Parameters
    ----------
    spec : str or sequence of (float, float, float)
        ``"w:m:v,w:m:v,..."`` (as on the command line, e.g. ``"0.98:0:1e-8,0.02:-0.005:0.01"``)
        or a sequence of triples. Weights must be > 0 and sum to 1 within 1e-9 (they
        are then normalised to sum to 1 exactly), means finite, variances >= 0.

    Returns
    -------
    tuple of (float, float, float)

    Raises
    ------
    ValueError
        Naming the bad component or value.
    """
    if isinstance(spec, str):
        triples = []
        for part in spec.split(","):
            fields_ = part.strip().split(":")
            if len(fields_) != 3:
                raise ValueError(f"component {part.strip()!r} must be weight:mean:variance, in {spec!r}")
            try:
                triples.append(tuple(float(x) for x in fields_))
            except ValueError:
                raise ValueError(f"component {part.strip()!r} has a value that is not a number") from None
    else:
        try:
            triples = [tuple(c) for c in spec]
        except TypeError:
            raise ValueError(
                f"components must be 'w:m:v,...' or a sequence of triples, got {spec!r}"
            ) from None
    if not triples:
        raise ValueError(
            "lognormal-mixture needs components: weight:mean:variance of log r, "
            "e.g. '0.98:0:1e-8,0.02:-0.005:0.01'"
        )
    out = []
    for i, c in enumerate(triples):
        if len(c) != 3:
            raise ValueError(f"component {i} must be (weight, mean, variance), got {c!r}")
        w = check_finite(f"component {i} weight", c[0])
        m = check_finite(f"component {i} mean", c[1])
        v = check_finite(f"component {i} variance", c[2])
        if w <= 0:
            raise ValueError(f"component {i} weight must be > 0, got {w!r}")
        if v < 0:
            raise ValueError(f"component {i} variance must be >= 0, got {v!r}")
        out.append((w, m, v))
    total = math.fsum(w for w, _, _ in out)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"component weights must sum to 1, got {total!r}")
    return tuple((w / total, m, v) for w, m, v in out)


def format_components(components) -> str:
    """Return the canonical ``"w:m:v,..."`` text of parsed components (shortest round-trip floats)."""
    return ",".join(":".join(repr(float(x)) for x in c) for c in components)


# ---------------------------------------------------------------------- float theory parts
def _mixture_cumulants(w, d, v):
    r"""Taylor coefficients :math:`h_n = \kappa_n/n!` of :math:`\log M(s)`, n = 0..24, and errors.

    :math:`M(s) = \sum_j w_j e^{s d_j + s^2 v_j/2}` (the moment generating function of
    :math:`\log r - c`; components on the last axis): its coefficients are finite sums per
    component, :math:`e_n = (d e_{n-1} + v e_{n-2})/n` (from :math:`f' = (d + vs) f`), and
    :math:`h` follows from :math:`M' = M (\log M)'` (with :math:`M(0) = 1`).
    """
    e_prev, e = np.zeros_like(d), np.ones_like(d)
    m_prev, mag_e = np.zeros_like(d), np.ones_like(d)
    one = np.ones(d.shape[:-1])
    a, amag = [one], [one]
    for n in range(1, SERIES_TERMS + 1):
        e_prev, e = e, (d * e + v * e_prev) / n
        m_prev, mag_e = mag_e, (np.abs(d) * mag_e + v * m_prev) / n
        a.append(np.sum(w * e, axis=-1))
        amag.append(np.sum(w * mag_e, axis=-1))
    h, eh = [0.0 * one], [0.0 * one]
    for n in range(1, SERIES_TERMS + 1):
        acc, mag, err = n * a[n], n * amag[n], 0.0 * one
        for m in range(1, n):
            acc = acc - m * h[m] * a[n - m]
            mag = mag + m * np.abs(h[m]) * amag[n - m]
            err = err + m * (eh[m] * amag[n - m] + np.abs(h[m]) * 4 * U * n * amag[n - m])
        h.append(acc / n)
        eh.append((err + 4 * U * n * mag) / n)
    return h, eh


def _mixture_logmgf(w, d, v, s):
    r""":math:`\log M(s)` (``_mixture_cumulants``) at ``s`` and its error: log1p or logsumexp form."""
    s = np.asarray(s, dtype=float)[..., None]
    b = s * d + s * s * v / 2
    eb = 3 * U * (np.abs(s * d) + s * s * v / 2)
    J = w.shape[-1]
    with np.errstate(all="ignore"):
        em1 = np.expm1(b)
        S = np.sum(w * em1, axis=-1)
        eS = np.sum(w * (4 * U * np.abs(em1) + np.exp(b) * eb), axis=-1) + J * U * np.sum(
            w * np.abs(em1), axis=-1
        )
        k1 = np.log1p(S)
        e1 = eS / (1 + S) + U * np.abs(k1)
        e1 = np.where(np.isfinite(k1) & np.isfinite(e1) & (S > -0.5), e1, np.inf)
        bmax = np.max(np.where(w > 0, b, -np.inf), axis=-1)  # padding (w = 0) never sets the shift
        t = w * np.exp(b - bmax[..., None])
        tot = np.sum(t, axis=-1)
        k2 = bmax + np.log(tot)
        e2 = U * (np.abs(bmax) + np.abs(k2)) + np.sum(t * (eb + (J + 2) * U), axis=-1) / tot
    return pick((k1, e1), (k2, e2))


def mixture_components(mixtures) -> np.ndarray:
    """Stack mixtures' components into one array, ``(len(mixtures), J, 3)``, J the most components.

    Shorter mixtures are padded with components of weight 0, which change nothing; the float
    path then computes many mixtures in one vectorised call.
    """
    parsed = [parse_components(c) for c in mixtures]
    out = np.zeros((len(parsed), max(len(c) for c in parsed), 3))
    for i, c in enumerate(parsed):
        out[i, : len(c)] = c
    return out


def _mixture_steps(w, d, v, h, eh, x, T, keys, out: dict) -> tuple[list, list]:
    r"""Mixture log MGF at :math:`s = kx`, :math:`k = 0..4`, and :math:`T\Delta^n`, :math:`n = 2, 3, 4`.

    Each difference is the plain one of the log MGF values or the cumulant series (``h``, with
    its coefficients' errors ``eh`` and truncation tail), whichever has the smaller error
    estimate; they go into ``out`` under ``keys`` (and ``"e" + key`` for the errors). Returns the
    values and errors of the log MGF, ``[0, K(x), ..., K(4x)]``.
    """
    K, eK = [0.0], [0.0]
    for k in (1, 2, 3, 4):
        val, err = _mixture_logmgf(w, d, v, k * x)
        K.append(val)
        eK.append(err)
    for n, key in zip((2, 3, 4), keys, strict=True):
        pv, pe = forward_diffs(K, eK, n)
        sv, se = series_diffs(h, x, n)
        sev, _ = series_diffs(eh, x, n)
        se = se + sev + series_tail(h, x, n)
        out[key], out[f"e{key}"] = pick((T * pv, T * pe), (T * sv, T * se))
    return K, eK


def _mixture_parts(mu, s2, T, shape):
    """Float theory parts of the lognormal mixture (:attr:`Family.float_parts`).

    ``shape["components"]`` is one mixture (a spec or parsed components) or an array of the
    parameters' shape + ``(J, 3)`` (:func:`mixture_components`).
    """
    comps = shape["components"]
    if not isinstance(comps, np.ndarray):  # one mixture: a spec or parsed components
        comps = np.asarray(parse_components(comps), dtype=float)
    w, m, v = comps[..., 0], comps[..., 1], comps[..., 2]  # parameter shape + (components,)
    w = w / np.sum(w, axis=-1, keepdims=True)
    c = np.sum(w * m, axis=-1)  # E[log r], rounded; the cumulants are those of log r - c
    d = np.where(w > 0, m - c[..., None], 0.0)
    h, eh = _mixture_cumulants(w, d, v)
    lmu = np.log(mu)
    k2 = np.sum(w * (v + d * d), axis=-1) - h[1] ** 2
    out = {"gap": c - lmu + h[1], "egap": 2 * U * (np.abs(c) + np.abs(lmu)) + eh[1]}
    out["k2"] = k2 + 0 * lmu
    out["ek2"] = 4 * U * k2 + 0 * lmu
    ones = np.ones(np.broadcast(T, c, lmu).shape)
    # P_T: plain differences of T log M(k), or the cumulant series at step 1
    K, eK = _mixture_steps(w, d, v, h, eh, ones, T, ("wP", "r3P", "uP"), out)
    out["lmP"] = T * (c + K[1])
    out["elmP"] = T * (eK[1] + U * np.abs(c)) + U * np.abs(out["lmP"])
    g_plain = (T * (K[4] - 2 * K[2]), T * (eK[4] + 2 * eK[2] + 2 * U * (np.abs(K[4]) + 2 * np.abs(K[2]))))
    g_parts = (
        4 * out["wP"] + 4 * out["r3P"] + out["uP"],
        4 * out["ewP"] + 4 * out["er3P"] + out["euP"] + 8 * U * np.abs(out["wP"]),
    )
    out["gP"], out["egP"] = pick(g_plain, g_parts)
    # G_T: step 1/T
    x = ones / T
    KG, eKG = _mixture_steps(w, d, v, h, eh, x, T, ("wG", "r3G", "uG"), out)
    b_plain = (c - lmu + T * KG[1], 2 * U * (np.abs(c) + np.abs(lmu)) + T * eKG[1] + U * np.abs(T * KG[1]))
    zero = 0.0 * h[1]
    h2 = [zero, zero, *h[2:]]
    tail, etail = series_diffs(h2, x, 1)
    tail_e, _ = series_diffs([zero, zero, *eh[2:]], x, 1)
    etail = etail + tail_e + series_tail(h2, x, 1)
    b_series = (out["gap"] + T * tail, out["egap"] + T * etail + 2 * U * np.abs(T * tail))
    out["bG"], out["ebG"] = pick(b_plain, b_series)
    return out


@dataclass(frozen=True)
class LognormalMixture(Family):
    r"""Heavy-tailed, sparse token ratios: a mixture of lognormals.

    Each token's log-ratio comes from component :math:`j`, :math:`N(m_j, v_j)`, with probability
    :math:`w_j`, independently.

    .. math::

        K(s) = \log \sum_j w_j \exp(s m_j + s^2 v_j / 2).

    The tokens stay i.i.d., so the theory is the i.i.d. one. The family is parametrised by
    its components in log space; :math:`\mu = e^{K(1)}` and
    :math:`\sigma^2 = e^{K(2)} - e^{2K(1)}` are derived (pass ``mu=None, sigma2=None``, or
    the derived values). :math:`E[\log r] = \sum_j w_j m_j`,
    :math:`\operatorname{Var}[\log r] = \sum_j w_j (v_j + (m_j - E[\log r])^2)`.

    Parameters
    ----------
    components : str or sequence of (weight, mean, variance)
        See :func:`parse_components`, e.g. ``"0.98:0:1e-8,0.02:-0.005:0.01"``.
    """

    components: tuple = ()
    name: ClassVar[str] = "lognormal-mixture"
    float_parts = staticmethod(_mixture_parts)
    derived_moments: ClassVar[bool] = True
    text_parameters: ClassVar[tuple[str, ...]] = ("components",)

    def __post_init__(self) -> None:
        """Parse the components and derive mu and sigma2 from them; a given mu or sigma2 must agree."""
        comps = parse_components(self.components)
        object.__setattr__(self, "components", comps)
        with mpmath.workdps(60):
            ws = self._mp()
            e1 = mpmath.fsum(w * mpmath.exp(m + v / 2) for w, m, v in ws)
            e2 = mpmath.fsum(w * mpmath.exp(2 * m + 2 * v) for w, m, v in ws)
            mu, sigma2 = float(e1), float(e2 - e1 * e1)
        if len({m for _, m, _ in comps}) == 1 and all(v == 0 for _, _, v in comps):
            sigma2 = 0.0
        for label, given, derived in (("mu", self.mu, mu), ("sigma2", self.sigma2, sigma2)):
            if given is not None and not (
                isinstance(given, int | float) and abs(given - derived) <= 1e-9 * abs(derived)
            ):
                raise ValueError(
                    f"lognormal-mixture derives {label} from its components ({label} = {derived!r}); "
                    f"got {label}={given!r}: leave it unset"
                )
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma2", sigma2)

    def _K(self, s):
        w, m, v = (np.array(x) for x in zip(*self.components, strict=True))
        terms = np.log(w) + np.multiply.outer(s, m) + np.multiply.outer(s * s, v) / 2
        return special.logsumexp(terms, axis=-1)

    def _K_mp(self, s):
        return mpmath.log(mpmath.fsum(w * mpmath.exp(s * m + s * s * v / 2) for w, m, v in self._mp()))

    def _mp(self):
        """Return the components as mpmath numbers, the weights normalised to sum to 1.

        Normalised at this precision: float weights sum to 1 only up to rounding, and T K(1/T) would
        carry T times the error.
        """
        total = mpmath.fsum(mpmath.mpf(w) for w, _, _ in self.components)
        return [(mpmath.mpf(w) / total, mpmath.mpf(m), mpmath.mpf(v)) for w, m, v in self.components]

    def _log_moments_mp(self):
        comps = self._mp()
        mean = mpmath.fsum(w * m for w, m, _ in comps)
        return mean, mpmath.fsum(w * (v + (m - mean) ** 2) for w, m, v in comps)

    def _sampler_params(self):
        w = [c[0] for c in self.components]
        k = len(w)
        cum = [math.fsum(w[: j + 1]) for j in range(k)]
        cum[-1] = 1.0  # a uniform U < 1 always finds a component
        cond = [w[j] / math.fsum(w[j:]) for j in range(k)]
        cond[-1] = 1.0
        means = [c[1] for c in self.components]
        sds = [math.sqrt(c[2]) for c in self.components]
        return CODE_MIXTURE, np.array([float(k), *cum, *means, *sds, *cond])

    @classmethod
    def stack_parameters(cls, families) -> dict:
        """Components of many mixtures as one array ``(len(families), 1, J, 3)``, padded with weight 0."""
        return {"components": mixture_components([f.components for f in families])[:, None]}

    def describe(self) -> dict:
        """Plain-dict description (family name, mu, sigma2 and canonical components), for provenance."""
        return {**super().describe(), "components": format_components(self.components)}
