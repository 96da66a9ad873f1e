r"""Theory in vectorised float64, with an error estimate per point.

Everything follows from four numbers per side :math:`X \in \{P_T, G_T\}`, with
:math:`C(s) = \log E[e^{s \log P_T}]` (:math:`= T K(s)` for i.i.d. ratios) and the step
:math:`s = 1` for :math:`P_T`, :math:`s = 1/T` for :math:`G_T`:

.. math::

    \ell = C(s) = \log E[X], \quad
    w = \Delta^2 C = C(2s) - 2C(s), \quad
    r_3 = \Delta^3 C, \quad
    u = \Delta^4 C,

finite differences of step :math:`s` at 0 (:math:`C(0) = 0`). With :math:`f_k = C(ks) - kC(s)`,
:math:`f_2 = w`, :math:`f_3 = 3w + r_3`, :math:`f_4 = 6w + 4r_3 + u`, so

.. math::

    \operatorname{Var} X = e^{2\ell}\operatorname{expm1}(w), \qquad
    \frac{m_4}{E[X]^4} = A + B + C, \\
    A = \operatorname{expm1}(w)^2 (e^{4w} + 2e^{3w} + 3e^{2w} - 3), \quad
    B = e^{6w + 4r_3}\operatorname{expm1}(u), \\
    C = 4e^{3w}\bigl(\operatorname{expm1}(3w)\operatorname{expm1}(4r_3)/4 + \varphi(r_3)\bigr),
    \quad \varphi(x) = \operatorname{expm1}(4x)/4 - \operatorname{expm1}(x).

:math:`A` is the lognormal part (exact when :math:`\log X` is Gaussian, :math:`r_3 = u = 0`)
and has no cancellation; the form :math:`e^{f_4} - 4e^{f_3} + 6e^{f_2} - 3` would lose
every digit at :math:`w \approx 10^{-9}` (:math:`G_T` at :math:`T = 10^6`). For large
:math:`w` the log of that plain form is used, whichever of the two has the smaller error
estimate.

The differences :math:`\Delta^n` cancel: :math:`\Delta^4 C \approx \kappa_4 s^4 T` while the
terms are of order :math:`s T`. Each family therefore gives them either from the series

.. math::

    \Delta^n K(0; s) = \sum_{j \ge n} \frac{\kappa_j}{j!}\, n!\, S(j, n)\, s^j

(cumulants :math:`\kappa_j` of :math:`\log r`, Stirling numbers of the second kind
:math:`S`) for small steps, or from plain differences of :math:`K` where the step is large
enough for them to keep their digits, with a rounding and truncation estimate either way.
:math:`P_T`'s differences come from the standardised moments of :math:`r` through
``log1p`` (:math:`f_k = T \log E[(r/\mu)^k]`).

Every quantity carries an estimate of the error of its natural log (a first-order
propagation of a few units of roundoff per operation, of the libraries' accuracy and of
series truncation; an estimate, not a proof, which the tests hold against a 120-digit
reference over the whole domain of the issue); a point whose estimate
exceeds :data:`TOLERANCE` (the relative error allowed, plus a slack proportional to
the log's size for values far beyond float range) is reported as not certified, and
:mod:`variance_lab.theory` recomputes it with mpmath.

Two families are not of that i.i.d. form. ``random-scale`` has, exactly,
:math:`C(s) = sT\log\mu - \alpha\log(1 - \theta T s(s-1)/2)` (the tokens of a sequence share
its variance), infinite where the bracket is not positive: its differences come from exact
:math:`\log(1 + x)` series (integer coefficients for :math:`P_T`, rational ones in :math:`T`
for :math:`G_T`), and a moment that diverges gives ``inf`` (``0`` for the ESS fraction) as in
the mpmath path; where float64 cannot tell the bracket's sign the point is not certified.
``lognormal-mixture`` takes its cumulants from the exact Taylor coefficients of its moment
generating function about :math:`E[\log r]`; many mixtures are computed in one call, their
components padded with weight 0 (:func:`mixture_components`).

Families with a float path are those of :data:`FAST_FAMILIES`; any other family is
computed with mpmath throughout.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from variance_lab.families import FAMILIES, parse_components

__all__ = [
    "FAST_FAMILIES",
    "LOG_SLACK",
    "TOLERANCE",
    "TOLERANCE_LOG",
    "Moments",
    "mixture_components",
    "moments",
    "quantity",
    "within_tolerance",
]

U = np.finfo(float).eps / 2  # unit roundoff
#: Allowed error estimate of a quantity's natural log (a relative error) where the linear
#: value is within float range, and where it is not (only its log10 twin then matters;
#: 1e-9 in log10 is 2.3e-9 in the natural log).
TOLERANCE = 2e-10
TOLERANCE_LOG = 1.5e-9
#: Extra allowance per unit of the log's magnitude: float64 holds a log of size L to about 1.1e-16 L.
LOG_SLACK = 4e-16
_FLOAT_RANGE = 745.0  # |ln value| beyond which the linear value is inf or 0.0
_J = 24  # series terms


def _stirling2_table(J: int) -> np.ndarray:
    """``A[j, n] = n! S(j, n)``, j = 0..J, n = 0..4 (the n-th difference of s^j at 0, step 1)."""
    S = np.zeros((J + 1, 5))
    S[0, 0] = 1.0
    for j in range(1, J + 1):
        for n in range(1, 5):
            S[j, n] = n * S[j - 1, n] + S[j - 1, n - 1]
    return S * np.array([1.0, 1.0, 2.0, 6.0, 24.0])


_A = _stirling2_table(_J)
_FACT = np.array([float(math.factorial(j)) for j in range(_J + 1)])


def _series_diffs(coef: list, x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Return a Taylor sum and an estimate of its error.

    The sum is :math:`\sum_{j=n}^{J} c_j A_{jn} x^j`; ``coef[j]`` are Taylor coefficients in
    ``x`` (``coef[0]`` unused).
    """
    acc = np.zeros(np.broadcast(x, coef[-1]).shape)
    mag = np.zeros_like(acc)
    for j in range(_J, n - 1, -1):
        a = coef[j] * _A[j, n]
        acc = acc * x + a
        mag = mag * np.abs(x) + np.abs(a)
    xn = x**n
    value = acc * xn
    last = np.abs(coef[_J] * _A[_J, n] * x**_J)
    return value, 4 * last + 8 * U * mag * np.abs(xn)


def _series_tail(coef: list, x: np.ndarray, n: int) -> np.ndarray:
    """Return four times the last four terms of :func:`_series_diffs`' sum: a truncation estimate.

    It stays large where the series does not converge (a lone small last term is not enough).
    """
    return 4 * sum(np.abs(coef[j] * _A[j, n] * x**j) for j in range(_J - 3, _J + 1))


def _diffs(values: list, errors: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-th forward difference at 0 of a function with ``values[j] = f(j s)``, f(0) = 0."""
    out, err = 0.0, 0.0
    for j in range(1, n + 1):
        c = math.comb(n, j) * (-1) ** (n - j)
        out = out + c * values[j]
        err = err + abs(c) * (errors[j] + 2 * U * np.abs(values[j]))
    return out, err


def _pick(a: tuple, b: tuple) -> tuple:
    """Return the (value, error) pair with the smaller error, elementwise."""
    use_a = a[1] <= b[1]
    return np.where(use_a, a[0], b[0]), np.where(use_a, a[1], b[1])


# ------------------------------------------------------------------------------ families
# Each returns a dict of arrays broadcastable to (parameters, T):
#   lmP, wP, r3P, uP (P_T side), bG (log E[G_T] - log mu), wG, r3G, uG (G_T side),
#   gap, k2 (E[log r] - log mu, Var[log r]), each with an absolute error estimate "e" + key.
def _lognormal(mu, s2, T, shape):
    v = np.log1p(s2 / (mu * mu))
    lmu = np.log(mu)
    zero = np.zeros_like(v)
    out = {
        "lmP": T * lmu,
        "wP": T * v,
        "bG": -0.5 * v + 0.5 * (v / T),  # gap + w_G / 2, the form var_G_lognormal takes
        "wG": v / T,
        "gap": -0.5 * v,
        "k2": v,
    }
    for key in ("r3P", "uP", "r3G", "uG"):
        out[key] = zero
    err = {f"e{k}": 2 * U * np.abs(x) for k, x in out.items()}
    return {**out, **err}


def _ar1_sum(rho, T):
    r"""(:math:`S_T = \sum_{k<T} (T-k)\rho^k`, its error estimate); :math:`V_T = v(T + 2S_T)`."""
    one = 1 - rho
    pw = np.power(rho, T)
    inner = T * one - (1 - pw)
    S = rho * inner / (one * one)
    eS = (2 * U * (T * one + 1 + np.abs(pw)) + U * T * np.abs(pw)) * np.abs(rho) / (one * one)
    return S, eS + 2 * U * np.abs(S)


def _ar1(mu, s2, T, shape):
    """Compute AR(1) log-ratios: the lognormal parts plus the correlation terms.

    Exactly the lognormal's numbers at rho = 0.
    """
    out = _lognormal(mu, s2, T, shape)
    v = out["k2"]
    S, eS = _ar1_sum(np.asarray(shape["rho"], dtype=float), T)
    add = {
        "lmP": v * S,  # log E[P_T] = T log mu + v S
        "wP": 2 * v * S,  # V_T = v T + 2 v S
        "bG": v * S / (T * T),
        "wG": 2 * v * S / (T * T),
    }
    for key, x in add.items():
        ex = np.abs(x) * (eS / np.maximum(np.abs(S), 1e-300) + 2 * U)
        out[key] = out[key] + x
        out[f"e{key}"] = out[f"e{key}"] + ex + U * np.abs(out[key])
    return out


def _log1p_series(c, coef_of_n, n0: int):
    r""":math:`\sum_{n \ge n_0} (-1)^{n+1} a_n c^n / n`, a_n = ``coef_of_n(n)``."""
    acc = np.zeros_like(c)
    for n in range(_J + 6, n0 - 1, -1):
        acc = acc * c + (-1) ** (n + 1) * coef_of_n(n) / n
    return acc * c**n0


def _p_side_from_moments(T, l2, l3, l4, el):
    r"""Compute (w, r3, u, g) and error estimates from the log moments.

    From :math:`l_k = \log E[(r/\mu)^k]` with absolute errors ``el``;
    :math:`g = f_4 - 2f_2 = T(l_4 - 2l_2)`.
    """
    w = T * l2
    r3 = T * (l3 - 3 * l2)
    u = T * (l4 - 4 * l3 + 6 * l2)
    g = T * (l4 - 2 * l2)
    eg = T * (el[2] + 2 * el[0] + U * (np.abs(l4) + 2 * np.abs(l2))) + U * np.abs(g)
    ew = T * el[0] + U * np.abs(w)
    er3 = T * (el[1] + 3 * el[0] + 4 * U * (np.abs(l3) + 3 * np.abs(l2))) + 2 * U * np.abs(r3)
    eu = T * (el[2] + 4 * el[1] + 6 * el[0] + 4 * U * (np.abs(l4) + 4 * np.abs(l3) + 6 * np.abs(l2)))
    return w, r3, u, ew, er3, eu + 2 * U * np.abs(u), g, eg


def _gamma_p_side(c2, T):
    r""":math:`E[(r/\mu)^k] = \prod_{i<k}(1 + i c^2)`: w, r3, u (series in :math:`c^2` when small)."""
    l1, l2, l3 = np.log1p(c2), np.log1p(2 * c2), np.log1p(3 * c2)
    el = [U * l1, 2 * U * (l1 + l2), 3 * U * (l1 + l2 + l3)]
    w, r3, u, ew, er3, eu, g, eg = _p_side_from_moments(T, l1, l1 + l2, l1 + l2 + l3, el)
    small = c2 < 0.05
    cs = np.where(small, c2, 0.0)
    s3 = _log1p_series(cs, lambda n: 2.0**n - 2, 2)
    s4 = _log1p_series(cs, lambda n: 3.0**n - 3 * 2.0**n + 3, 3)
    r3 = np.where(small, T * s3, r3)
    u = np.where(small, T * s4, u)
    er3 = np.where(small, 16 * U * np.abs(r3) + 1e-300, er3)
    eu = np.where(small, 16 * U * np.abs(u) + 1e-300, eu)
    g = T * (l2 + l3 - l1)  # f4 - 2 f2 = T log((1 + 2c^2)(1 + 3c^2)/(1 + c^2))
    eg = T * U * (l1 + l2 + l3) + 2 * U * np.abs(g)
    return w, r3, u, ew, er3, eu, g, eg


def _stirling_tail(x):
    """sum_j B_2j / (2j (2j-1) x^(2j-1)), x >= 10."""
    c = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400)
    inv2 = 1.0 / (x * x)
    out = np.zeros_like(x)
    for a in reversed(c):
        out = out * inv2 + a
    return out / x


def _lgamma_shift(k, x):
    r"""(:math:`\log\Gamma(k+x) - \log\Gamma(k) - x\log k`, error estimate), x >= 0."""
    big = k >= 10
    kb = np.where(big, k, 10.0)
    lp = np.log1p(x / kb)
    a = (kb + x - 0.5) * lp
    tail = _stirling_tail(kb + x) - _stirling_tail(kb)
    stir = a - x + tail
    e_stir = 4 * U * (np.abs(a) + x + np.abs(tail)) + 1e-16 / (kb * kb) * x / kb
    ks = np.where(big, 1.0, k)
    g1, g0 = special.gammaln(ks + x), special.gammaln(ks)
    xl = x * np.log(ks)
    plain = g1 - g0 - xl
    e_plain = 4 * U * (np.abs(g1) + np.abs(g0) + np.abs(xl) + 1)
    return np.where(big, stir, plain), np.where(big, e_stir, e_plain)


def _log_gap(k):
    r""":math:`\log k - \psi(k)` (the Jensen gap of the gamma family) and its error estimate."""
    big = k >= 10
    kb = np.where(big, k, 10.0)
    inv2 = 1 / (kb * kb)
    # B_2n / (2n), n = 1..10
    b = (
        1 / 12,
        -1 / 120,
        1 / 252,
        -1 / 240,
        1 / 132,
        -691 / 32760,
        1 / 12,
        -3617 / 8160,
        43867 / 14364,
        -174611 / 6600,
    )
    acc = np.zeros_like(kb)
    for c in reversed(b):
        acc = acc * inv2 + c
    asym = 0.5 / kb + acc * inv2
    ks = np.where(big, 1.0, k)
    lk, dg = np.log(ks), special.digamma(ks)
    return np.where(big, asym, lk - dg), np.where(big, 4 * U * asym, 4 * U * (np.abs(lk) + np.abs(dg) + 1))


def _gamma(mu, s2, T, shape):
    k = mu * mu / s2
    c2 = s2 / (mu * mu)
    lmu = np.log(mu)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    keys = ("wP", "r3P", "uP", "ewP", "er3P", "euP", "gP", "egP")
    out.update(zip(keys, _gamma_p_side(c2, T), strict=True))
    out["k2"] = special.polygamma(1, k)
    out["ek2"] = 8 * U * out["k2"]
    s = 1.0 / T
    # plain differences of R(k, js) = lgamma(k + js) - lgamma(k) - js log k
    R, eR = [0.0], [0.0]
    for j in range(1, 5):
        r, e = _lgamma_shift(k, j * s)
        R.append(r)
        eR.append(e)
    plain = {n: _diffs(R, eR, n) for n in (2, 3, 4)}
    gap, egap = _log_gap(k)
    out["gap"], out["egap"] = -gap, egap
    bG_plain = (T * R[1], T * eR[1] + 2 * U * np.abs(T * R[1]))
    # series: Taylor coefficients kappa_j / j! with kappa_j = psi^(j-1)(k), in x = s
    coef = [None, None] + [special.polygamma(j - 1, k) / _FACT[j] for j in range(2, _J + 1)]
    coef[1] = np.zeros_like(k)
    ok = 4 * s < 0.5 * k  # inside the radius of convergence (k) with room
    sx = np.where(ok, s, 0.0) + np.zeros_like(k)
    for n, key in ((2, "wG"), (3, "r3G"), (4, "uG")):
        val, err = _series_diffs(coef, sx, n)
        err = np.where(ok, err, np.inf)
        out[key], out[f"e{key}"] = _pick((T * plain[n][0], T * plain[n][1]), (T * val, T * err))
    tail, etail = _series_diffs(coef, sx, 1)  # sum_{j>=2} kappa_j s^j / j! (coef[1] = 0)
    b_series = -gap + T * tail
    e_series = np.where(ok, egap + T * etail + 2 * U * (np.abs(gap) + np.abs(T * tail)), np.inf)
    out["bG"], out["ebG"] = _pick(bG_plain, (b_series, e_series))
    return out


def _bernoulli_cgf_coef(q):
    r"""Taylor coefficients :math:`h_j` of :math:`\log(1 + q\,\operatorname{expm1}(x))`, j = 0.._J."""
    g = [q / _FACT[n] if n else 0.0 * q for n in range(_J + 1)]
    h = [0.0 * q, q]
    for n in range(2, _J + 1):
        acc = n * g[n]
        for m in range(1, n):
            acc = acc - m * h[m] * g[n - m]
        h.append(acc / n)
    return h


def _two_point(mu, s2, T, shape):
    q = np.asarray(shape["q"], dtype=float)
    c2 = s2 / (mu * mu)
    c = np.sqrt(c2)
    al, be = c * np.sqrt((1 - q) / q), c * np.sqrt(q / (1 - q))
    lmu = np.log(mu)
    la1, lb1 = np.log1p(-al), np.log1p(be)  # log(a / mu), log(b / mu)
    e_la1 = 4 * U * (al / (1 - al) + np.abs(la1))
    e_lb1 = 4 * U * (be / (1 + be) + np.abs(lb1))
    d = la1 - lb1
    ed = e_la1 + e_lb1 + U * np.abs(d)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    gap = q * la1 + (1 - q) * lb1  # E[log r] - log mu
    egap = q * e_la1 + (1 - q) * e_lb1 + 2 * U * (q * np.abs(la1) + (1 - q) * np.abs(lb1))
    out["gap"], out["egap"] = gap, egap
    out["k2"] = q * (1 - q) * d * d
    out["ek2"] = out["k2"] * (2 * ed / np.abs(d) + 6 * U)
    # P_T: standardised central moments of r / mu
    m3 = (1 - q) * be**3 - q * al**3
    m4 = (1 - q) * be**4 + q * al**4
    em = 12 * U * ((1 - q) * be**3 + q * al**3) + 16 * U * m4
    l2, l3, l4 = np.log1p(c2), np.log1p(3 * c2 + m3), np.log1p(6 * c2 + 4 * m3 + m4)
    el = [1.5 * U * l2, 2 * U * np.abs(l3) + em, 2 * U * np.abs(l4) + 4 * em]
    keys = ("wP", "r3P", "uP", "ewP", "er3P", "euP", "gP", "egP")
    out.update(zip(keys, _p_side_from_moments(T, l2, l3, l4, el), strict=True))
    # G_T: K(s) = s log b + L(s d), L(x) = log1p(q expm1(x)); differences of order >= 2 drop s log b
    s = 1.0 / T
    Lv, eL = [0.0], [0.0]
    for j in range(1, 5):
        x = j * s * d
        em1 = np.expm1(x)
        val = np.log1p(q * em1)
        Lv.append(val)
        eL.append(4 * U * (np.abs(val) + q * np.abs(em1) / (1 + q * em1)) + j * s * ed)
    plain = {n: _diffs(Lv, eL, n) for n in (2, 3, 4)}
    bG_plain = (lb1 + T * Lv[1], e_lb1 + T * eL[1] + 2 * U * (np.abs(lb1) + np.abs(T * Lv[1])))
    h = _bernoulli_cgf_coef(q)
    x = s * d
    ok = 4 * np.abs(x) < 0.4  # radius of convergence >= pi
    xs = np.where(ok, x, 0.0)
    for n, key in ((2, "wG"), (3, "r3G"), (4, "uG")):
        val, err = _series_diffs(h, xs, n)
        err = np.where(ok, T * (err + n * np.abs(val) * ed / np.abs(d)), np.inf)
        out[key], out[f"e{key}"] = _pick((T * plain[n][0], T * plain[n][1]), (T * val, err))
    h2 = [0.0 * q, 0.0 * q, *h[2:]]
    tail, etail = _series_diffs(h2, xs, 1)  # sum_{j >= 2} h_j x^j
    b_series = gap + T * tail
    e_series = (
        egap + T * (etail + 2 * np.abs(tail) * ed / np.abs(d)) + 2 * U * (np.abs(gap) + np.abs(T * tail))
    )
    out["bG"], out["ebG"] = _pick(bG_plain, (b_series, np.where(ok, e_series, np.inf)))
    return out


# -------------------------------------------------------------------- random-scale
# C(s) = sT log mu + D(s), D(s) = -alpha log1p(-theta T s(s-1)/2): not T K(s), the tokens of a
# sequence share its variance. P_T (s = k): D = -alpha log1p(-c_k theta T), c_k = k(k-1)/2;
# G_T (s = k/T): D = -alpha log1p(theta g_k), g_k = k(T-k)/(2T). Both are log1p series in theta.
_RS_TERMS = 40  # series terms, P side (6 theta T <= 1/2)
_RS_TERMS_G = 40  # series terms, G side (theta <= 0.2, |g_k| <= 2)
_RS_C = (0, 0, 1, 3, 6)


def _rs_p_coef() -> dict:
    r"""Exact :math:`\Delta^m[c_k^n]` at 0 (step 1), n = 1.._RS_TERMS, and ``g``: :math:`c_4^n - 2c_2^n`."""
    out = {}
    for m in (2, 3, 4):
        out[m] = np.array(
            [
                float(sum(math.comb(m, j) * (-1) ** (m - j) * _RS_C[j] ** n for j in range(m + 1)))
                for n in range(1, _RS_TERMS + 1)
            ]
        )
    out["g"] = np.array([float(6**n - 2) for n in range(1, _RS_TERMS + 1)])
    return out


_RS_P = _rs_p_coef()


@functools.lru_cache(maxsize=4096)
def _rs_g_coef(T: int) -> np.ndarray:
    r"""Exact :math:`\Delta^m[g_k^n]` (m = 2, 3, 4; n = 1.._RS_TERMS_G), rounded once to float64.

    :math:`g_k = k(T-k)/(2T)`: integer numerators over :math:`(2T)^n`, so the differences, which
    cancel to order :math:`1/T` and beyond, carry no rounding error (Python's int division
    rounds correctly).
    """
    gk = [k * (T - k) for k in range(5)]
    out = np.empty((3, _RS_TERMS_G))
    for i, m in enumerate((2, 3, 4)):
        for n in range(1, _RS_TERMS_G + 1):
            num = sum(math.comb(m, j) * (-1) ** (m - j) * gk[j] ** n for j in range(1, m + 1))
            out[i, n - 1] = num / (2 * T) ** n
    return out


def _log1p_sum(coef, y, alpha, erel):
    r"""``alpha * sum_n coef[n-1] y^n / n`` with an error estimate (``erel``: relative error of y)."""
    acc = np.zeros_like(y)
    mag = np.zeros_like(y)
    dmag = np.zeros_like(y)
    ay = np.abs(y)
    for n in range(len(coef), 0, -1):
        acc = acc * y + coef[n - 1] / n
        mag = mag * ay + abs(coef[n - 1]) / n
        dmag = dmag * ay + abs(coef[n - 1])  # sum n |term|
    last = abs(coef[-1]) / len(coef) * ay ** len(coef)
    value = alpha * acc * y
    err = alpha * (4 * last + ay * (6 * U * mag + erel * dmag)) + 2 * U * np.abs(value)
    return value, err


def _rs_logs(z, e_ind, e_cor, alpha):
    r""":math:`D = -\alpha\log(1 + z)`, its error, ``inf`` flags and :math:`\partial D/\partial\log z`.

    ``e_ind`` is the relative error of ``z`` that is independent between the points of one
    difference, ``e_cor`` the one they share (that of :math:`\theta`): its effect on a difference
    is that difference of the derivatives :math:`E = -\alpha z/(1+z)`, which cancel as the
    values do. Where :math:`1 + z \le 0` certainly, the flag is set; where its sign is within
    rounding of 0, the error is ``inf``. Both get the placeholder value 0.
    """
    b = 1 + z
    ez = np.abs(z) * e_ind
    sure = np.abs(z) * (e_ind + e_cor) + 2 * U
    finite = b > sure
    inf = b < -sure
    bs = np.where(finite, b, 1.0)
    lg = np.log1p(np.where(finite, z, 0.0))
    D = -alpha * lg
    eD = alpha * (ez / bs + U * np.abs(lg)) + U * np.abs(D)
    E = np.where(finite, -alpha * z / bs, 0.0)
    return np.where(finite, D, 0.0), np.where(finite, eD, np.where(inf, 0.0, np.inf)), inf, E


def _rs_diffs(D, eD, E, e_cor, n):
    """n-th difference of D (``_diffs``) with the shared error ``e_cor`` propagated through E."""
    val, err = _diffs(D, eD, n)
    dE, _ = _diffs(E, [0.0] * len(E), n)
    return val, err + e_cor * np.abs(dE)


def _random_scale(mu, s2, T, shape):
    alpha = np.asarray(shape["alpha"], dtype=float)
    L = np.log1p(s2 / (mu * mu))  # -alpha log(1 - theta) = L
    theta = -np.expm1(-L / alpha)
    eth = 8 * U  # relative error of theta
    lmu = np.log(mu)
    out = {"lmP": T * lmu, "elmP": 1.5 * U * np.abs(T * lmu)}
    out["gap"] = -alpha * theta / 2
    out["egap"] = 10 * U * np.abs(out["gap"])
    out["k2"] = alpha * theta * (1 + theta / 4)
    out["ek2"] = 12 * U * out["k2"]
    # P_T: D_k = -alpha log1p(-c_k y), y = theta T
    y = theta * T
    ey = eth + U
    D, eD, E, inf = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], {}
    for k in (2, 3, 4):
        d, e, inf[k], dd = _rs_logs(-_RS_C[k] * y, U, ey, alpha)
        D.append(d)
        eD.append(e)
        E.append(dd)
    D[2] = np.where(T == 1, L, D[2])  # 1 - theta = (1 + sigma^2/mu^2)^(-1/alpha): no cancellation
    eD[2] = np.where(T == 1, 2 * U * L, eD[2])
    E[2] = np.where(T == 1, 0.0, E[2])
    plain = {n: _rs_diffs(D[: n + 1], eD[: n + 1], E[: n + 1], ey, n) for n in (3, 4)}
    plain["w"] = (D[2], eD[2] + ey * np.abs(E[2]))
    plain["g"] = (
        D[4] - 2 * D[2],
        eD[4] + 2 * eD[2] + 2 * U * (np.abs(D[4]) + 2 * np.abs(D[2])) + ey * np.abs(E[4] - 2 * E[2]),
    )
    plain["r3"], plain["u"] = plain.pop(3), plain.pop(4)
    ok = 6 * y <= 0.5
    ys = np.where(ok, y, 0.0)
    for key, coef in (("w", _RS_P[2]), ("r3", _RS_P[3]), ("u", _RS_P[4]), ("g", _RS_P["g"])):
        val, err = _log1p_sum(coef, ys, alpha, ey)
        out[f"{key}P"], out[f"e{key}P"] = _pick(plain[key], (val, np.where(ok, err, np.inf)))
    out["inf2P"] = inf[2]
    out["inf4P"] = inf[4] | inf[3] | inf[2]
    # G_T: D_k = -alpha log1p(theta g_k), g_k = k (T - k) / (2T)
    DG, eDG, EG, infG = [0.0], [0.0], [0.0], {}
    for k in (1, 2, 3, 4):
        g = k * (T - k) / (2 * T)
        d, e, infG[k], dd = _rs_logs(theta * g, 4 * U, eth, alpha)
        DG.append(d)
        eDG.append(e)
        EG.append(dd)
    out["bG"], out["ebG"] = DG[1], eDG[1] + eth * np.abs(EG[1])
    okG = theta <= 0.2
    Ts = np.broadcast_to(T, np.broadcast(T, theta).shape)
    if np.any(okG & (Ts > 1)):
        uniq, inv = np.unique(Ts, return_inverse=True)
        coefs = np.stack([_rs_g_coef(int(t)) for t in uniq])[inv.reshape(Ts.shape)]  # (..., 3, n)
    else:
        coefs = None
    th = np.broadcast_to(np.where(okG, theta, 0.0), Ts.shape)
    for i, (n, key) in enumerate(((2, "wG"), (3, "r3G"), (4, "uG"))):
        pl = _rs_diffs(DG[: n + 1], eDG[: n + 1], EG[: n + 1], eth, n)
        if coefs is None:
            out[key], out[f"e{key}"] = pl
            continue
        # alpha sum_n (-theta)^n Delta^m[g^n] / n
        val, err = _log1p_sum(np.moveaxis(coefs[..., i, :], -1, 0), -th, alpha, eth)
        out[key], out[f"e{key}"] = _pick(pl, (val, np.where(okG, err, np.inf)))
    out["inf4G"] = np.where(T == 1, out["inf4P"], infG[4])
    return out


# ------------------------------------------------------------------ lognormal mixture
def _mixture_cumulants(w, d, v):
    r"""Taylor coefficients :math:`h_n = \kappa_n/n!` of :math:`\log M(s)`, n = 0.._J, and errors.

    :math:`M(s) = \sum_j w_j e^{s d_j + s^2 v_j/2}` (the moment generating function of
    :math:`\log r - c`; components on the last axis): its coefficients are finite sums per
    component, :math:`e_n = (d e_{n-1} + v e_{n-2})/n` (from :math:`f' = (d + vs) f`), and
    :math:`h` follows from :math:`M' = M (\log M)'` (with :math:`M(0) = 1`).
    """
    e_prev, e = np.zeros_like(d), np.ones_like(d)
    m_prev, mag_e = np.zeros_like(d), np.ones_like(d)
    one = np.ones(d.shape[:-1])
    a, amag = [one], [one]
    for n in range(1, _J + 1):
        e_prev, e = e, (d * e + v * e_prev) / n
        m_prev, mag_e = mag_e, (np.abs(d) * mag_e + v * m_prev) / n
        a.append(np.sum(w * e, axis=-1))
        amag.append(np.sum(w * mag_e, axis=-1))
    h, eh = [0.0 * one], [0.0 * one]
    for n in range(1, _J + 1):
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
    return _pick((k1, e1), (k2, e2))


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
        pv, pe = _diffs(K, eK, n)
        sv, se = _series_diffs(h, x, n)
        sev, _ = _series_diffs(eh, x, n)
        se = se + sev + _series_tail(h, x, n)
        out[key], out[f"e{key}"] = _pick((T * pv, T * pe), (T * sv, T * se))
    return K, eK


def _mixture(mu, s2, T, shape):
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
    out["gP"], out["egP"] = _pick(g_plain, g_parts)
    # G_T: step 1/T
    x = ones / T
    KG, eKG = _mixture_steps(w, d, v, h, eh, x, T, ("wG", "r3G", "uG"), out)
    b_plain = (c - lmu + T * KG[1], 2 * U * (np.abs(c) + np.abs(lmu)) + T * eKG[1] + U * np.abs(T * KG[1]))
    zero = 0.0 * h[1]
    h2 = [zero, zero, *h[2:]]
    tail, etail = _series_diffs(h2, x, 1)
    tail_e, _ = _series_diffs([zero, zero, *eh[2:]], x, 1)
    etail = etail + tail_e + _series_tail(h2, x, 1)
    b_series = (out["gap"] + T * tail, out["egap"] + T * etail + 2 * U * np.abs(T * tail))
    out["bG"], out["ebG"] = _pick(b_plain, b_series)
    return out


#: Families with a float path, and their extra parameters.
FAST_FAMILIES = {
    "lognormal": (_lognormal, ()),
    "gamma": (_gamma, ()),
    "two-point": (_two_point, ("q",)),
    "ar1": (_ar1, ("rho",)),
    "random-scale": (_random_scale, ("alpha",)),
    "lognormal-mixture": (_mixture, ("components",)),
}


# ------------------------------------------------------------------------------ one side
def _log_expm1(w):
    """log(expm1(w)) for w > 0, without overflow."""
    with np.errstate(all="ignore"):
        return np.where(w > 30, w + np.log1p(-np.exp(-w)), np.log(np.expm1(np.minimum(w, 30))))


def _phi(x):
    r""":math:`\operatorname{expm1}(4x)/4 - \operatorname{expm1}(x)`, a series for small x."""
    small = np.abs(x) < 0.05
    xs = np.where(small, x, 0.0)
    acc = np.zeros_like(xs)
    for n in range(14, 1, -1):
        acc = acc * xs + (4.0 ** (n - 1) - 1) / _FACT[n]
    series = acc * xs * xs
    with np.errstate(all="ignore"):
        plain = np.expm1(4 * x) / 4 - np.expm1(x)
    return np.where(small, series, plain)


def _log_kurtosis(w, r3, u, ew, er3, eu, g=None, eg=None):
    r"""(:math:`\log(m_4/v^2)`, error estimate): the better of the split form and the plain form.

    ``g`` is :math:`f_4 - 2f_2 = 4w + 4r_3 + u` where a family computes it directly (with
    error ``eg``); the plain form :math:`\log m_4 = f_4 + \log(1 - 4e^{f_3-f_4} + 6e^{f_2-f_4}
    - 3e^{-f_4})` then keeps the digits of :math:`T \log E[(r/\mu)^4]` at large T.
    """
    if g is None:
        g, eg = 4 * w + 4 * r3 + u, 4 * ew + 4 * er3 + eu
    with np.errstate(all="ignore"):
        f2, f3, f4 = w, 3 * w + r3, g + 2 * w
        ef3, ef4 = 3 * ew + er3, eg + 2 * ew
        t3, t2, t0 = 4 * np.exp(f3 - f4), 6 * np.exp(f2 - f4), 3 * np.exp(-f4)
        Q = 1 - t3 + t2 - t0
        em = -np.expm1(-w)  # expm1(w) = e^w em
        plain = g + np.log(Q) - 2 * np.log(em)
        e_q = (2 * U * (1 + t3 + t2 + t0) + t3 * (ef3 + ef4) + t2 * (ew + ef4) + t0 * ef4) / Q
        e_plain = np.where(Q > 0, eg + e_q + 2 * ew * np.exp(-w) / em + 4 * U, np.inf)
        # split: m4 / E^4 = A + B + C
        wc = np.minimum(w, 2.0)
        e1 = np.expm1(wc)
        E2, E3, E4 = np.exp(2 * wc), np.exp(3 * wc), np.exp(4 * wc)
        L = E4 + 2 * E3 + 3 * E2 - 3
        A = e1 * e1 * L
        B = np.exp(6 * wc + 4 * r3) * np.expm1(u)
        em4 = np.expm1(4 * r3)
        C = 4 * E3 * (np.expm1(3 * wc) * em4 / 4 + _phi(r3))
        m4 = A + B + C
        # d(m4 / e1^2)/dw, relative: from A's L'/L - and B, C against e1^2
        dw = (4 * E4 + 6 * E3 + 6 * E2) / L + (6 * np.abs(B) + 3 * np.abs(C) + 3 * E3 * E3 * np.abs(em4)) / m4
        dw = dw + 2 * np.exp(wc) * (np.abs(B + C) / m4) / e1
        dr3 = 4 * np.abs(B) + 4 * E3 * (
            np.expm1(3 * wc) * np.exp(4 * r3) + np.abs(em4 - np.expm1(r3)) + 2 * U
        )
        du = np.exp(6 * wc + 4 * r3 + u)
        err = 6 * U * (np.abs(A) + np.abs(B) + np.abs(C)) / m4 + dw * ew + (dr3 * er3 + du * eu) / m4
        split = np.log(m4) - 2 * np.log(e1)
        e_split = np.where((w <= 2.0) & (m4 > 0), err + 4 * U, np.inf)
    return _pick((plain, e_plain), (split, e_split))


def within_tolerance(ln, err) -> np.ndarray:
    """Tell whether an error estimate ``err`` of a natural log ``ln`` is within tolerance.

    Within :data:`TOLERANCE` (:data:`TOLERANCE_LOG` beyond float range) plus :data:`LOG_SLACK`
    per unit of ``|ln|``.
    """
    size = np.abs(ln)
    with np.errstate(invalid="ignore"):
        allowed = np.where(size < _FLOAT_RANGE, TOLERANCE, TOLERANCE_LOG) + LOG_SLACK * size
        return (err <= allowed) & ~np.isnan(ln) & ~np.isnan(err)


class Moments:
    """Log-space results of :func:`moments` for every point.

    ``ln[name]`` (natural log of ``|value|``), ``sign[name]``, ``err[name]`` (estimated error of
    ``ln``), per quantity; ``ok`` marks the points whose every estimate is within tolerance;
    ``linear[name]``, where given, holds linear values known exactly (NaN elsewhere), which
    ``exp(ln)`` would round.
    """

    def __init__(self, ln: dict, sign: dict, err: dict, ok: np.ndarray, linear: dict | None = None) -> None:
        self.ln, self.sign, self.err, self.ok = ln, sign, err, ok
        self.linear = linear or {}


def _side(p: dict, x: str, lm, elm):
    """(log var, error, log kurtosis, error) of side ``x`` ("P" or "G") from a family's parts."""
    w, ew = p[f"w{x}"], p[f"ew{x}"]
    lv = 2 * lm + _log_expm1(w)
    with np.errstate(all="ignore"):
        dlog = np.where(w > 30, 1.0, np.exp(np.minimum(w, 30)) / np.expm1(np.minimum(w, 30)))
    elv = 2 * elm + ew * dlog + U * np.abs(lv)
    lk, elk = _log_kurtosis(
        w, p[f"r3{x}"], p[f"u{x}"], ew, p[f"er3{x}"], p[f"eu{x}"], p.get(f"g{x}"), p.get(f"eg{x}")
    )
    return lv, elv, lk, elk


def _rel_se(lk, elk, n: int):
    """Log of sqrt((kurt - (n-3)/(n-1)) / n) and its error estimate."""
    rn = (n - 3) / (n - 1)
    with np.errstate(all="ignore"):
        kurt = np.exp(np.minimum(lk, 700))
        lx = np.where(lk > 40, lk + np.log1p(-rn * np.exp(-lk)), np.log(kurt - rn))
        ex = elk * np.where(lk > 40, 1.0, kurt / (kurt - rn)) + 4 * U
    return 0.5 * (lx - math.log(n)), 0.5 * ex


def _n_needed(lk, elk, target: float):
    """Log of the root n of rse(n) = target, and its error estimate."""
    e2 = target * target
    with np.errstate(all="ignore"):
        y = np.exp(-lk)  # 1 / kurtosis
        b_over_k = 1 + (e2 - 1) * y
        one_minus_t = ((1 - (1 + e2) * y) ** 2 + 8 * e2 * y * y) / (b_over_k * b_over_k)
        ln = lk + np.log(b_over_k) + np.log1p(np.sqrt(one_minus_t)) - math.log(2 * e2)
        # d log n / d log kurtosis <= kurtosis / (e2 n), which tends to 1
        gain = np.exp(np.minimum(lk - ln - math.log(e2), 700))
    return ln, elk * np.maximum(gain, 1.0) + 8 * U


def moments(name: str, mu, sigma2, T, shape: dict, *, n: int = 2, target: float = 0.1) -> Moments:
    r"""Every quantity of :data:`variance_lab.theory.QUANTITIES` at every point, in log space.

    Parameters
    ----------
    name : str
        A family of :data:`FAST_FAMILIES`.
    mu, sigma2, T : array_like
        Broadcastable arrays; ``sigma2 > 0`` (the degenerate ratio is not handled here).
    shape : dict
        Extra family parameters as broadcastable arrays (``q``, ``rho``, ``alpha``);
        ``components`` is one mixture, or an array of the parameters' shape + ``(J, 3)``
        (:func:`mixture_components`).
    n, target : int, float
        Draws (``rel_se_*``) and target relative error (``n_needed_*``).

    Returns
    -------
    Moments
    """
    kernel, _ = FAST_FAMILIES[name]
    mu, s2, T = (np.asarray(a, dtype=float) for a in (mu, sigma2, T))
    degenerate = s2 == 0
    with np.errstate(all="ignore"):
        p = kernel(mu, np.where(degenerate, 1.0, s2), T, shape)
        first = T == 1  # G_1 = r = P_1: the P side's numbers, and no bias
        if "gP" in p:
            p["gG"], p["egG"] = (
                np.where(first, p["gP"], 4 * p["wG"] + 4 * p["r3G"] + p["uG"]),
                np.where(first, p["egP"], 4 * p["ewG"] + 4 * p["er3G"] + p["euG"]),
            )
        for key in ("w", "r3", "u"):
            p[f"{key}G"] = np.where(first, p[f"{key}P"], p[f"{key}G"])
            p[f"e{key}G"] = np.where(first, p[f"e{key}P"], p[f"e{key}G"])
        p["bG"], p["ebG"] = np.where(first, 0.0, p["bG"]), np.where(first, 0.0, p["ebG"])
        lmu = np.log(mu)
        lnP, elP, lkP, ekP = _side(p, "P", p["lmP"], p["elmP"])
        lmG = lmu + p["bG"]
        lnG, elG, lkG, ekG = _side(p, "G", lmG, p["ebG"])
        ln, sign, err = {}, {}, {}

        def put(key, value, error, sgn=1.0):
            ln[key], err[key], sign[key] = value, error, sgn

        put("mean_P", p["lmP"], p["elmP"])
        put("var_P", lnP, elP)
        put("mean_G", lmG, p["ebG"] + 2 * U * np.abs(lmu))
        put("var_G", lnG, elG)
        em1 = np.expm1(p["bG"])
        lbias = lmu + np.log(np.abs(em1))
        ebias = p["ebG"] * np.exp(p["bG"]) / np.abs(em1) + 2 * U * np.abs(lmu)
        put("bias_G", lbias, np.where(em1 == 0, 0.0, ebias), np.sign(em1))
        put("mse_G", np.logaddexp(lnG, 2 * lbias), np.maximum(elG, 2 * np.where(em1 == 0, 0.0, ebias)))
        x = p["k2"] / T
        ex = p["ek2"] / T
        # 2 mu_y + x = 2 (log mu + gap + x/2): bit for bit var_G's form for lognormal ratios
        ln_L = 2 * (lmu + (p["gap"] + x / 2)) + _log_expm1(x)
        ek1 = p["egap"] + 2 * U * np.abs(lmu)
        put("var_G_lognormal", ln_L, 2 * ek1 + ex * (1 / x + 1) + 4 * U * (1 + np.abs(ln_L)))
        put(
            "var_G_delta",
            np.log(p["k2"]) + 2 * (lmu + p["gap"]) - np.log(T),
            p["ek2"] / p["k2"] + 2 * ek1 + 4 * U,
        )
        put("var_G_naive", np.log(s2 / T), 2 * U + 0 * T)
        put("var_ratio", lnP - lnG, elP + elG)
        put("ess_frac_P", -p["wP"], p["ewP"])
        put("kurtosis_P", lkP, ekP)
        put("kurtosis_G", lkG, ekG)
        for x_ in ("P", "G"):
            lk, ek = (lkP, ekP) if x_ == "P" else (lkG, ekG)
            put(f"rel_se_var_{x_}", *_rel_se(lk, ek, n))
            put(f"n_needed_{x_}", *_n_needed(lk, ek, target))
        per_call = FAMILIES[name].text_parameters  # components: parameter shape + (J, 3), not broadcast
        shape_all = np.broadcast(mu, s2, T, *(v for k, v in shape.items() if k not in per_call)).shape
        _infinite(ln, sign, err, p, shape_all)
        if np.any(degenerate):
            _degenerate(ln, sign, err, np.broadcast_to(degenerate, shape_all), T * lmu, lmu)
        ok = np.ones(shape_all, dtype=bool)
        nan_ok = np.broadcast_to(degenerate, shape_all)  # the degenerate ratio's NaN kurtosis
        for key in ln:
            good = within_tolerance(ln[key], err[key])
            if key in ("kurtosis_P", "kurtosis_G", "var_ratio"):
                good = good | nan_ok
            ok &= np.broadcast_to(good, shape_all)
    return Moments(ln, sign, err, ok, _exact_linear(mu, s2, T))


def _infinite(ln: dict, sign: dict, err: dict, p: dict, shape) -> None:
    r"""Set the quantities that an infinite moment makes infinite, exactly as the mpmath path does.

    A family kernel flags ``inf2P`` (:math:`E[P_T^2] = \infty`) and ``inf4P``, ``inf4G``
    (fourth moment infinite; random-scale beyond :math:`1/(6\theta T)`). Then the kurtosis, the
    relative standard error and the draws needed are ``inf``; with ``inf2P`` also
    :math:`\operatorname{Var}(P_T)` and the variance ratio (``inf``) and the ESS fraction (0).
    """
    flags = {x: np.broadcast_to(p.get(f"inf4{x}", False), shape) for x in ("P", "G")}
    inf2 = np.broadcast_to(p.get("inf2P", False), shape)
    if not (inf2.any() or flags["P"].any() or flags["G"].any()):
        return
    todo = [
        (f"{q}_{x}", flags[x], math.inf) for x in ("P", "G") for q in ("kurtosis", "rel_se_var", "n_needed")
    ]
    todo += [("var_P", inf2, math.inf), ("var_ratio", inf2, math.inf), ("ess_frac_P", inf2, -math.inf)]
    for key, where, value in todo:
        ln[key] = np.where(where, value, np.broadcast_to(ln[key], shape))
        sign[key] = np.where(where, 1.0, np.broadcast_to(sign[key], shape))
        err[key] = np.where(where, 0.0, np.broadcast_to(err[key], shape))


def _exact_linear(mu, s2, T) -> dict:
    """Return the linear values with a closed form in the inputs.

    sigma^2 / T, and at T = 1 (where P_1 = G_1 = r) the mean mu, the variances sigma^2 and their
    ratio 1.
    """
    first = T == 1
    nan = np.full(np.broadcast(mu, s2, T).shape, np.nan)
    at_one = {
        "mean_P": mu,
        "mean_G": mu,
        "var_P": s2,
        "var_G": s2,
        "mse_G": s2,
        "var_ratio": np.where(s2 > 0, 1.0, np.nan),
    }
    out = {k: np.where(first, v, nan) for k, v in at_one.items()}
    out["var_G_naive"] = np.broadcast_to(s2 / T, nan.shape)
    return out


def _degenerate(ln: dict, sign: dict, err: dict, where, lmP, lmu) -> None:
    """Overwrite the points of the degenerate ratio r = mu (sigma2 = 0) with their closed forms."""
    shape = where.shape
    exact = {
        "mean_P": lmP,
        "mean_G": lmu,
        "ess_frac_P": 0.0,  # 1
        "n_needed_P": math.log(2),
        "n_needed_G": math.log(2),
        "kurtosis_P": math.nan,
        "kurtosis_G": math.nan,
        "var_ratio": math.nan,
    }
    for key in ln:
        new = np.broadcast_to(exact.get(key, -math.inf), shape)  # every other value is 0
        ln[key] = np.where(where, new, np.broadcast_to(ln[key], shape))
        sign[key] = np.where(where, 1.0, np.broadcast_to(sign[key], shape))
        err[key] = np.where(where, 0.0, np.broadcast_to(err[key], shape))


def quantity(m: Moments, key: str, *, log10: bool = False) -> np.ndarray:
    """One quantity of ``m``: linear (``inf``/``0.0`` beyond float range) or log10 of ``|value|``."""
    with np.errstate(all="ignore"):
        if log10:
            return m.ln[key] / math.log(10)
        out = m.sign[key] * np.exp(m.ln[key])
        if key in m.linear:
            out = np.where(np.isnan(m.linear[key]), out, m.linear[key])
        return out
