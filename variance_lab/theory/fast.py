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
components padded with weight 0 (:func:`variance_lab.families.mixture.mixture_components`).

Each family's parts (the four numbers per side, their error estimates, and the flags of
infinite moments) are computed in its own module of :mod:`variance_lab.families`
(:attr:`variance_lab.families.base.Family.float_parts`); this module combines them into the
quantities. Families with a float path are those of :data:`FAST_FAMILIES`; any other family
is computed with mpmath throughout.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.families import FAMILIES
from variance_lab.families.series import FACTORIALS, pick
from variance_lab.stats.special import UNIT_ROUNDOFF as U
from variance_lab.stats.special import log_expm1

__all__ = [
    "FAST_FAMILIES",
    "LOG_SLACK",
    "TOLERANCE",
    "TOLERANCE_LOG",
    "Moments",
    "moments",
    "quantity",
    "within_tolerance",
]

#: Allowed error estimate of a quantity's natural log (a relative error) where the linear
#: value is within float range, and where it is not (only its log10 twin then matters;
#: 1e-9 in log10 is 2.3e-9 in the natural log).
TOLERANCE = 2e-10
TOLERANCE_LOG = 1.5e-9
#: Extra allowance per unit of the log's magnitude: float64 holds a log of size L to about 1.1e-16 L.
LOG_SLACK = 4e-16
_FLOAT_RANGE = 745.0  # |ln value| beyond which the linear value is inf or 0.0


#: Families with a float path (:attr:`variance_lab.families.base.Family.float_parts`), and their
#: extra parameters.
FAST_FAMILIES = {
    name: (cls.float_parts, cls.extra_parameters())
    for name, cls in FAMILIES.items()
    if cls.float_parts is not None
}


# ------------------------------------------------------------------------------ one side
def _phi(x):
    r""":math:`\operatorname{expm1}(4x)/4 - \operatorname{expm1}(x)`, a series for small x."""
    small = np.abs(x) < 0.05
    xs = np.where(small, x, 0.0)
    acc = np.zeros_like(xs)
    for n in range(14, 1, -1):
        acc = acc * xs + (4.0 ** (n - 1) - 1) / FACTORIALS[n]
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
    return pick((plain, e_plain), (split, e_split))


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
    lv = 2 * lm + log_expm1(w)
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
        ln_L = 2 * (lmu + (p["gap"] + x / 2)) + log_expm1(x)
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
