r"""Corrections without Monte Carlo: truncated-lognormal closed forms, quadrature and exact sums.

:func:`theory` gives each correction's effect at each T for the lognormal family (closed forms),
random-scale ratios (quadrature over the sequence's variance) and lognormal mixtures (sums over
the components or the multinomial law of the counts); :func:`find_T` the length from which a
correction modifies most sequences. The truncated-lognormal moments they are built from are
:mod:`variance_lab.corrections.gauss`'; the math is in :mod:`variance_lab.corrections`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import integrate, optimize, special

from variance_lab._validate import check_T
from variance_lab.corrections.gauss import (
    log_frac_out,
    log_frac_out_array,
    log_moment,
    log_moment_array,
    logsumexp_rows,
)
from variance_lab.corrections.m2po import resolve_cut
from variance_lab.corrections.prefix import clip_probability, ctpo_log_moments
from variance_lab.corrections.sign import SIGNS, sign_label, sign_log_moments, signs
from variance_lab.corrections.specs import Correction, parse, parse_list
from variance_lab.corrections.tokenprob import TOKEN_PROB_DEFAULT, prob_log_moments
from variance_lab.families import Family, LogNormal, LognormalMixture, RandomScale
from variance_lab.stats.special import log1mexp

__all__ = [
    "COLUMNS",
    "MAX_COUNT_TERMS",
    "MIXTURE_TAIL_MASS",
    "TAIL_MASS",
    "WEIGHT_COLUMNS",
    "find_T",
    "has_theory",
    "theory",
]

_INF = math.inf

#: Statistics of the corrected weights w shared by :data:`COLUMNS` and :data:`DATA_COLUMNS`.
WEIGHT_COLUMNS = ("bias", "var_w", "ess_frac", "frac_modified", "frac_seq_any", "mean_base")

#: Columns of :func:`theory` (and the first columns of every corrections frame).
COLUMNS = (
    "T",
    "correction",
    "level",
    "mean_w",
    *WEIGHT_COLUMNS,
    "log10_mean_w",
    "log10_var_w",
    "method",
)


def _gauss(m: float, v: float, base: str, T: float) -> tuple[float, float]:
    """(M, S) of the log of the base weight when the token log-ratios are i.i.d. N(m, v)."""
    if base == "P":
        return T * m, math.sqrt(T * v)
    if base == "G":
        return m, math.sqrt(v / T)
    return m, math.sqrt(v)


def _check_lognormal(family) -> Family:
    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    if type(family) is not LogNormal:
        raise ValueError(
            f"closed forms of the corrections exist for the lognormal family only, not {family.name!r}; "
            "use simulate_corrections (Monte Carlo) for it"
        )
    return family


def _log_moments_at(c: Correction, family: Family, T: float) -> tuple[float, float, float, float]:
    """(log E[w], log E[w^2], log frac_modified, log E[base]) of one correction at length T."""
    return _log_moments_gauss(c, family.mean_log, family.var_log, T)


def _log_moments_gauss(c: Correction, m: float, v: float, T: float) -> tuple[float, float, float, float]:
    """:func:`_log_moments_at` for i.i.d. token log-ratios N(m, v)."""
    if c.kind == "ctpo":
        return ctpo_log_moments(c, m, v, T)
    if c.signed:  # every sequence, the signs mixed with the spec's P(A >= 0)
        return sign_log_moments(c, m, v, T)["all"]
    if c.kind == "gmpo":
        M, S = m, math.sqrt(v)
        pieces = c.pieces()
        l1 = T * log_moment(pieces, M, S, 1.0 / T)
        l2 = T * log_moment(pieces, M, S, 2.0 / T)
        a, b = c.log_bounds()
        return l1, l2, log_frac_out(a, b, M, S), m + v / (2 * T)
    M, S = _gauss(m, v, c.base, T)
    return (*_log_moments_MS(c, M, S, T), M + 0.5 * S * S)


def _log_moments_MS(c: Correction, M: float, S: float, T: float) -> tuple[float, float, float]:
    """(log E[w], log E[w^2], log frac_modified) when the log of the base weight is N(M, S^2)."""
    pieces = c.pieces(T)
    a, b = c.log_bounds(T)
    return (
        log_moment(pieces, M, S, 1.0),
        log_moment(pieces, M, S, 2.0),
        log_frac_out(a, b, M, S),
    )


def _frac_seq_any(c: Correction, log_frac: float, T: float) -> float:
    """Fraction of sequences with at least one modified token: 1 - (1 - p)^T (i.i.d. tokens).

    NaN for ``ctpo``: whether any prefix leaves its band by T is a boundary-crossing probability
    of the random walk :math:`L_t`, with no closed form (the Monte Carlo column gives it).
    """
    if c.kind == "ctpo":
        return math.nan
    if c.level == "sequence":
        return math.exp(log_frac)
    p = math.exp(log_frac)
    return 1.0 if p >= 1.0 else -math.expm1(T * math.log1p(-p))


def _row(c: Correction, family: Family, T: int) -> dict:
    l1, l2, lf, lbase = _log_moments_at(c, family, T)
    return _row_from_logs(c, T, (l1, l2, lf, lbase), _frac_seq_any(c, lf, T), "closed form")


def _sign_any(c: Correction, logs: dict, T: float) -> dict:
    """``frac_seq_any`` of each row; a signed spec's overall row mixes its signs' (one sign a sequence)."""
    if not c.signed:
        return {"all": _frac_seq_any(c, logs["all"][2], T)}
    pos, neg = signs(c)[1:]
    out = {s: _frac_seq_any(c, logs[s][2], T) for s in (pos, neg)}
    p = c.p_positive
    return {"all": p * out[pos] + (1 - p) * out[neg], **out}


def _prob_rows(c: Correction, family: Family, T: int, law) -> list[dict]:
    """Rows of a probability-aware mask (:mod:`~variance_lab.corrections.tokenprob`): by sign for DPPO."""
    logs = prob_log_moments(c, family, law)
    anys = _sign_any(c, logs, T)
    rows = signs(c) if c.signed else ("all",)
    return [_row_from_logs(c, T, logs[s], anys[s], "quadrature", label=sign_label(c, s)) for s in rows]


def _sign_rows(c: Correction, family: Family, T: int) -> list[dict]:
    """Return the rows of a sign-dependent spec: every sequence, then A >= 0, then A < 0 (by label)."""
    logs = sign_log_moments(c, family.mean_log, family.var_log, T)
    anys = _sign_any(c, logs, T)
    return [_row_from_logs(c, T, logs[s], anys[s], "closed form", label=sign_label(c, s)) for s in SIGNS]


def _row_from_logs(c: Correction, T: int, logs, frac_seq_any: float, method: str, label=None) -> dict:
    """Build a :func:`theory` row from (log E[w], log E[w^2], log frac_modified, log E[base]).

    Fractions are probabilities: a log above 0 (a mixture's weights summing to 1 + 1e-16 give
    1 + 2e-13) is rounding and is read as 0.
    """
    l1, l2, lf, lbase = logs
    lf, frac_seq_any = min(lf, 0.0), min(frac_seq_any, 1.0)
    mean_w, mean_base = math.exp(l1) if l1 < 709 else _INF, math.exp(lbase) if lbase < 709 else _INF
    if l1 == -_INF:
        var_w, log10_var, ess = 0.0, -_INF, math.nan
    else:
        d = l2 - 2 * l1  # log(E[w^2] / E[w]^2) >= 0
        log_var = l2 + math.log(-math.expm1(-d)) if d > 0 else -_INF
        var_w = math.exp(log_var) if log_var < 709 else _INF
        log10_var, ess = log_var / math.log(10), math.exp(-d)
    return {
        "T": int(T),
        "correction": c.spec if label is None else label,
        "level": c.level,
        "mean_w": mean_w,
        "bias": mean_w - mean_base,
        "var_w": var_w,
        "ess_frac": ess,
        "frac_modified": math.exp(lf),
        "frac_seq_any": frac_seq_any,
        "mean_base": mean_base,
        "log10_mean_w": l1 / math.log(10),
        "log10_var_w": log10_var,
        "method": method,
    }


# --------------------------------------------------------------------------------------
# random-scale and lognormal-mixture ratios: quadrature and multinomial sums
# --------------------------------------------------------------------------------------
#: Probability mass left out of the numerical integrals and sums (each side of the gamma law of v;
#: in all of the multinomial count distribution).
TAIL_MASS = 1e-20
MIXTURE_TAIL_MASS = 1e-14
#: Most multinomial count vectors a lognormal-mixture row may sum over.
MAX_COUNT_TERMS = 200_000


def _log_any(c: Correction, lf: float, T: float) -> float:
    """Log of the probability that a sequence has a modified weight, given i.i.d. tokens (ctpo: unused)."""
    if c.level == "sequence" or c.kind == "ctpo":
        return lf
    return log1mexp(T * math.log1p(-math.exp(lf))) if lf < 0 else 0.0


def _scale_logs(c: Correction, log_mu: float, v: float, T: float) -> np.ndarray:
    """(log E[w|v], log E[w^2|v], log frac|v, log any|v) for random-scale ratios given the variance v."""
    l1, l2, lf, _ = _log_moments_gauss(c, log_mu - 0.5 * v, v, T)
    return np.array([l1, l2, lf, _log_any(c, lf, T)])


def _random_scale_row(c: Correction, family, T: int) -> dict:
    r"""One row for random-scale ratios by quadrature over the sequence's variance v.

    Given :math:`v` the tokens are i.i.d. :math:`N(\log\mu - v/2, v)`, so every conditional
    moment is the lognormal closed form; the four quantities are integrated against
    :math:`v \sim \mathrm{Gamma}(\alpha, \theta)` in :math:`t = \log v` (smooth, no
    endpoint singularity for :math:`\alpha < 1`) by ``scipy.integrate.quad_vec``
    (Gauss-Kronrod 21, relative tolerance 1e-12), each scaled by its largest value on a
    65-point grid so nothing under- or overflows.
    """
    log_mu = math.log(family.mu)
    if family.degenerate:
        logs = _scale_logs(c, log_mu, 0.0, T)
    else:
        a, th = family.alpha, family.theta
        const = -special.gammaln(a) - a * math.log(th)
        t_lo = math.log(th) + (math.log(TAIL_MASS) + special.gammaln(a + 1)) / a
        t_hi = math.log(th * special.gammainccinv(a, TAIL_MASS))

        def f(t):
            return _scale_logs(c, log_mu, math.exp(t), T) + (a * t - math.exp(t) / th + const)

        grid = np.linspace(t_lo, t_hi, 65)
        vals = np.array([f(t) for t in grid])
        shift = np.where(np.isfinite(vals).any(axis=0), np.max(vals, axis=0), 0.0)
        # a weight growing with v (E[P_T^2 | v] = mu^(2T) e^(Tv)) can outweigh the gamma tail: widen
        # the range until the scaled integrand is below 1e-18 at both ends
        for _ in range(60):
            if np.all(f(t_hi) - shift < -41.4):
                break
            t_hi += 0.5
        for _ in range(60):
            if np.all(f(t_lo) - shift < -41.4):
                break
            t_lo -= 1.0
        res, _ = integrate.quad_vec(
            lambda t: np.exp(f(t) - shift), t_lo, t_hi, epsabs=0.0, epsrel=1e-12, norm="max", limit=2000
        )
        with np.errstate(divide="ignore"):
            logs = shift + np.log(res)
    l1, l2, lf, lany = (float(x) for x in logs)
    # E[b]: E[P_T^s] = mu^(sT) (1 - theta T s (s - 1) / 2)^(-alpha) at s = 1 (P_T, r) and s = 1/T (G_T)
    if c.base == "P":
        lbase = T * log_mu
    elif c.base == "prefix":  # E[P_t] = mu^t, averaged over t <= T
        lbase = float(special.logsumexp(np.arange(1, T + 1) * log_mu)) - math.log(T)
    elif c.base == "G":
        lbase = log_mu - family.alpha * math.log1p(family.theta * (1.0 - 1.0 / T) / 2.0)
    else:
        lbase = log_mu
    any_ = math.nan if c.kind == "ctpo" else math.exp(lany)
    return _row_from_logs(c, T, (l1, l2, lf, lbase), any_, "quadrature")


def _count_terms(weights, T: int, tilts=()) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial count vectors of T tokens over the components, and their log-probabilities.

    Counts are enumerated component by component from their conditional binomial laws, each cut
    to the central range that leaves at most ``MIXTURE_TAIL_MASS / (2J)`` on either side under
    the law itself and under each tilted law (component weights times ``exp(tilt_j)``: the laws
    under which E[P_T] and E[P_T^2] are sums), so at most :data:`MIXTURE_TAIL_MASS` of the mass
    of each of them is left out.
    """
    from scipy import stats

    w = np.asarray(weights, dtype=float)
    J = w.size
    eps = MIXTURE_TAIL_MASS / (2 * J)
    laws = [np.log(w)] + [np.log(w) + np.asarray(t, dtype=float) for t in tilts]
    counts = np.zeros((1, 0), dtype=np.int64)
    logp = np.zeros(1)
    left = np.full(1, T, dtype=np.int64)
    for j in range(J - 1):
        lo, hi = left.copy(), np.zeros_like(left)
        for lw in laws:
            qt = float(np.exp(lw[j] - special.logsumexp(lw[j:])))
            lo = np.minimum(lo, stats.binom.ppf(eps, left, qt).astype(np.int64))
            hi = np.maximum(hi, stats.binom.isf(eps, left, qt).astype(np.int64))
        lo, hi = np.maximum(lo - 1, 0), np.minimum(hi + 1, left)
        sizes = hi - lo + 1
        if int(sizes.sum()) > MAX_COUNT_TERMS:
            raise ValueError(
                f"lognormal-mixture at T = {T}: more than {MAX_COUNT_TERMS:,} count vectors to sum; "
                "use simulate_corrections (Monte Carlo) there"
            )
        q = min(1.0, float(w[j]) / float(w[j:].sum()))
        rep = np.repeat(np.arange(left.size), sizes)
        k = np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi, strict=True)])
        logp = logp[rep] + stats.binom.logpmf(k, left[rep], q)
        counts = np.column_stack([counts[rep], k])
        left = left[rep] - k
    return np.column_stack([counts, left]), logp


def _mixture_row(c: Correction, family, T: int) -> dict:
    """One row for lognormal-mixture ratios: exact sums over components or over the count vectors."""
    if c.kind == "ctpo":
        raise ValueError(
            f"{c.spec!r} with lognormal-mixture ratios: the prefix L_t mixes over the component counts "
            "at every position, which has no closed form here; use simulate_corrections (Monte Carlo)"
        )
    w, m, v = (np.array(x, dtype=float) for x in zip(*family.components, strict=True))
    logw = np.log(w)
    if c.level == "token" or c.kind == "gmpo":
        per = np.array(
            [_log_moments_gauss(c, mj, vj, 1 if c.kind != "gmpo" else T) for mj, vj in zip(m, v, strict=True)]
        )
        if c.kind == "gmpo":  # E[w^k] = (sum_j w_j E_j[exp(k/T clip(log r))])^T
            pieces = c.pieces()
            l1, l2 = (
                T
                * float(
                    special.logsumexp(
                        [
                            lw + log_moment(pieces, mj, math.sqrt(vj), k / T)
                            for lw, mj, vj in zip(logw, m, v, strict=True)
                        ]
                    )
                )
                for k in (1.0, 2.0)
            )
            lbase = T * float(family.K(1.0 / T))
        else:
            l1, l2 = (float(special.logsumexp(logw + per[:, i])) for i in (0, 1))
            lbase = float(family.K(1.0))
        lf = float(special.logsumexp(logw + per[:, 2]))
        return _row_from_logs(c, T, (l1, l2, lf, lbase), _frac_seq_any(c, lf, T), "closed form")
    tilts = [] if c.base == "G" else [k * m + 0.5 * k * k * v for k in (1.0, 2.0)]  # E[P_T^k] laws
    counts, logp = _count_terms(w, T, tilts)
    M, V = counts @ m, counts @ v
    if c.base == "G":
        M, V = M / T, V / (T * T)
    S = np.sqrt(V)
    pieces, (a, b) = c.pieces(T), c.log_bounds(T)
    logs = (
        log_moment_array(pieces, M, S, 1.0),
        log_moment_array(pieces, M, S, 2.0),
        log_frac_out_array(a, b, M, S),
    )
    l1, l2, lf = (float(logsumexp_rows((logp + x)[:, None])[0]) for x in logs)
    lbase = T * float(family.K(1.0)) if c.base == "P" else T * float(family.K(1.0 / T))
    return _row_from_logs(c, T, (l1, l2, lf, lbase), math.exp(lf), "multinomial sum")


def theory(family: Family, T, corrections, *, token_prob=None) -> pd.DataFrame:
    r"""Effect of each correction at each T without Monte Carlo: closed forms, quadrature or exact sums.

    - ``lognormal``: truncated-lognormal closed forms (``method`` "closed form").
    - ``random-scale``: given the sequence's variance :math:`v`, :math:`\log P_T \sim
      N(T(\log\mu - v/2), Tv)` and every token is :math:`N(\log\mu - v/2, v)`, so each
      conditional moment is the closed form; it is integrated over :math:`v \sim
      \mathrm{Gamma}(\alpha, \theta)` numerically (``method`` "quadrature": adaptive
      Gauss-Kronrod in :math:`\log v`, relative tolerance 1e-12, the law of :math:`v` cut
      where :data:`TAIL_MASS` = 1e-20 is left on each side, so the absolute error is at most
      about :math:`2\cdot10^{-20}\sup w^j` beyond the quadrature's own). ``frac_seq_any``
      integrates :math:`1 - (1 - p(v))^T` (tokens are dependent through :math:`v`).
    - ``lognormal-mixture``: token-level corrections (and GMPO) are exact finite sums over the
      components (``method`` "closed form"); for sequence-level ones, given the counts
      :math:`n_j` of tokens from each component :math:`\log P_T \sim N(\sum_j n_j m_j,
      \sum_j n_j v_j)`, and the closed forms are summed over the multinomial law of the counts
      (``method`` "multinomial sum"), cut where the mass left out is below
      :data:`MIXTURE_TAIL_MASS` = 1e-14 (at most :data:`MAX_COUNT_TERMS` count vectors, else
      ``ValueError``: use :func:`simulate_corrections`).

    Parameters
    ----------
    family : LogNormal, RandomScale or LognormalMixture
        The per-token ratio; other families raise ``ValueError`` (use
        :func:`simulate_corrections`).
    T : int or array_like of int
        Sequence lengths >= 1.
    corrections : str or list
        Specs (a comma list or a list), see :func:`parse`. A sign-dependent spec (``topr``,
        ``opsm:DELTA``, ``aspo``; lognormal family only) gives three rows, labelled by
        :func:`~variance_lab.corrections.sign.sign_label`: every sequence (the two signs mixed
        with the spec's :math:`P(A \ge 0)`), then :math:`A \ge 0`, then :math:`A < 0`, each with
        its bias against :math:`E[P_T]` (:math:`E[r]` for the token-level ``aspo``;
        :mod:`variance_lab.corrections.sign`). A probability-aware mask (``dppo-tv``,
        ``dppo-kl``, ``kpop``; lognormal and lognormal-mixture families; not ``cppo``, whose rows
        raise ``ValueError``: see :mod:`variance_lab.corrections.cppo`) is integrated over the
        law of the token's probability (``method`` "quadrature",
        :mod:`variance_lab.corrections.tokenprob`): the family is then the law of the shift of the
        token's log-odds; DPPO gives rows ``all``, ``A>0``, ``A<=0``.
    token_prob : TokenProbability, optional
        The law of the sampler's probability of each token, for the probability-aware masks
        (default :data:`~variance_lab.corrections.tokenprob.TOKEN_PROB_DEFAULT`, Beta(0.2, 0.6)).

    Returns
    -------
    pandas.DataFrame
        One row per (T, correction) in that order (three for a sign-dependent spec), columns
        :data:`COLUMNS` (``method`` last).
    """
    row = _row_function(family)
    grid = check_T(T, grid=True)
    cs = [resolve_cut(c, family) for c in parse_list(corrections)]
    law = TOKEN_PROB_DEFAULT if token_prob is None else token_prob
    no_theory = [c.spec for c in cs if c.kind == "cppo"]
    if no_theory:
        raise ValueError(_CPPO_NO_THEORY.format(spec=no_theory[0]))
    rows = []
    for t in grid:
        for c in cs:
            if c.prob:
                rows += _prob_rows(c, family, int(t), law)
            elif c.signed:
                rows += _sign_rows(c, _check_lognormal(family), int(t))
            else:
                rows.append(row(c, family, int(t)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


#: Why ``cppo`` has no :func:`theory` rows (the message of the ``ValueError``).
_CPPO_NO_THEORY = (
    "{spec!r}: CPPO's budget couples every token of a sequence to its prefix and to the sequence's 0.9 "
    "quantile of |pi - mu|: no closed form; use simulate_corrections (Monte Carlo), or "
    "variance_lab.corrections.cppo for its exact parts (position 1, the threshold alone, long sequences)"
)


def _row_function(family):
    """Return the row builder of a family with a non-Monte Carlo theory; ``ValueError`` otherwise."""
    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    builders = {LogNormal: _row, RandomScale: _random_scale_row, LognormalMixture: _mixture_row}
    if type(family) not in builders:
        raise ValueError(
            f"the corrections' theory covers the lognormal, random-scale and lognormal-mixture families, "
            f"not {family.name!r}; use simulate_corrections (Monte Carlo) for it"
        )
    return builders[type(family)]


def has_theory(family: Family, correction) -> bool:
    """Whether :func:`theory` has rows for ``correction`` with ``family`` (else: Monte Carlo only)."""
    c = correction if isinstance(correction, Correction) else parse(correction)
    builders = (LogNormal, RandomScale, LognormalMixture)
    if c.kind == "cppo":  # exact only in parts (variance_lab.corrections.cppo): Monte Carlo
        return False
    if c.prob:  # the law of the log-odds shift must be normal or a normal mixture
        return type(family) in (LogNormal, LognormalMixture)
    if c.signed:  # the sign model's closed form is the lognormal's
        return type(family) is LogNormal
    return type(family) in builders and not (c.kind == "ctpo" and type(family) is LognormalMixture)


def _find_target(c: Correction, family: Family, T: float, law=TOKEN_PROB_DEFAULT) -> float:
    """Return the quantity :func:`find_T` watches: per-sequence for sequence level, any-token otherwise.

    ``ctpo``: the probability that the token at position T is clipped (where clipping binds).
    """
    if c.kind == "ctpo":
        return float(clip_probability(c, family.mean_log, family.var_log, T))
    if c.prob:  # one sign per sequence for DPPO
        return _sign_any(c, prob_log_moments(c, family, law), T)["all"]
    if c.signed:  # a sequence has one sign: the signs' fractions mixed, not 1 - (1 - p)^T of the mix
        return _sign_any(c, sign_log_moments(c, family.mean_log, family.var_log, T), T)["all"]
    _, _, lf, _ = _log_moments_at(c, family, T)
    return _frac_seq_any(c, lf, T)


def find_T(
    family: Family, correction, threshold: float = 0.5, *, T_max: int = 10**7, token_prob=None
) -> int | None:
    r"""Find the smallest length T at which a correction modifies at least ``threshold`` of the sequences.

    "Modifies" is ``frac_modified`` for a sequence-level correction (the fraction of
    sequences truncated or masked) and ``frac_seq_any`` for a token-level one (the fraction
    of sequences with at least one truncated, clipped or masked token). For ``ctpo`` it is the
    position where clipping binds: the first T at which the token at position T is clipped
    with probability at least ``threshold`` (:func:`variance_lab.corrections.prefix.clip_probability`);
    for ``m2po`` its large-batch limit (an i.i.d. mask of each token). The closed form is
    evaluated at real T on a grid of 64 points per decade from 1 to ``T_max``; the first
    bracket where it crosses ``threshold`` is refined with Brent's method and the answer
    is the smallest integer at or above the root that reaches the threshold.

    Parameters
    ----------
    family : LogNormal
    correction : str or Correction
    threshold : float in (0, 1], default 0.5
        "Most of the data".
    T_max : int, default 10**7
    token_prob : TokenProbability, optional
        The probability-aware masks' law of the token's probability (as for :func:`theory`).

    Returns
    -------
    int or None
        None when the fraction stays below ``threshold`` for every T <= ``T_max`` (for
        example an upper cap under on-policy ratios, mu = 1: :math:`P_T \to 0` and the
        fraction above the cap vanishes as T grows).
    """
    family = _check_lognormal(family)
    c = resolve_cut(correction if isinstance(correction, Correction) else parse(correction), family)
    if c.kind == "cppo":
        raise ValueError(_CPPO_NO_THEORY.format(spec=c.spec))
    if not 0.0 < threshold <= 1.0 or isinstance(threshold, bool):
        raise ValueError(f"threshold must lie in (0, 1], got {threshold!r}")

    law = TOKEN_PROB_DEFAULT if token_prob is None else token_prob

    def f(t):
        return _find_target(c, family, t, law) - threshold

    if f(1.0) >= 0:
        return 1
    grid = np.logspace(0.0, math.log10(T_max), 64 * max(1, round(math.log10(T_max))) + 1)
    prev = 1.0
    for t in grid[1:]:
        if f(t) >= 0:
            root = optimize.brentq(f, prev, t, xtol=1e-9, rtol=1e-12)
            k = max(1, math.ceil(root - 1e-9))
            while f(float(k)) < 0:
                k += 1
            return int(k)
        prev = t
    return None
