r"""Corrections practitioners apply to importance weights, and what they do as functions of T.

Every correction is a transformation of a weight. Sequence-level corrections act on the
sequence ratio :math:`P_T = \prod_{t \le T} r_t` (or GSPO's :math:`s = G_T = P_T^{1/T}`),
token-level ones on each token's ratio :math:`r_t`. In a training framework :math:`r_t` is
whichever ratio the correction is applied to: the rollout mismatch
:math:`\pi_{old}/\mu_{rollout}` (TIS, IcePop, sequence masks, Geo-RS) or the update
:math:`\pi_\theta/\pi_{old}` (PPO, CISPO, GSPO, GMPO). The spec strings:

==================  ========  ===========================================================
spec                level     weight :math:`w` (modified: what counts as truncated/masked)
==================  ========  ===========================================================
``seq-tis:C``       sequence  :math:`\min(P_T, C)`; modified when :math:`P_T > C`
                              (sequence-level truncated IS: verl ``rollout_is=sequence``)
``seq-mask:C``      sequence  :math:`P_T 1\{P_T \le C\}`; modified when :math:`P_T > C`
                              (TRL's sequence mask, cap 3 by default; verl
                              ``rollout_rs=sequence``)
``seq-mask:LO:HI``  sequence  :math:`P_T 1\{LO \le P_T \le HI\}`
``geo-rs:LO:HI``    sequence  :math:`P_T 1\{LO \le G_T \le HI\}`: the sequence is rejected when
                              its geometric mean is outside :math:`[LO, HI]` (Geo-RS /
                              Geo-Mask; verl ``rollout_rs=geometric``)
``gspo[:E|:EL:EH]`` sequence  :math:`\operatorname{clip}(G_T, 1 - EL, 1 + EH)`, GSPO's clip of
                              :math:`s`; default :math:`3\cdot10^{-4}, 4\cdot10^{-4}`
``tis:C``           token     :math:`\min(r_t, C)` (token-level TIS: verl ``rollout_is=token``,
                              NeMo-RL/OpenRLHF truncated importance sampling)
``icepop:B``        token     :math:`r_t 1\{1/B \le r_t \le B\}`: tokens outside
                              :math:`[1/B, B]` masked (IcePop, Ring-1T)
``cispo:EPS``       token     :math:`\min(r_t, 1 + EPS)`, or ``cispo:EL:EH``:
                              :math:`\operatorname{clip}(r_t, 1-EL, 1+EH)`; the weight is
                              clipped and stop-gradiented, the token keeps its gradient
                              (CISPO, MiniMax-M1)
``ppo:EPS``         token     :math:`\operatorname{clip}(r_t, 1-EPS, 1+EPS)` (or
                              ``ppo:EL:EH``): PPO's clipped ratio
``gmpo[:EPS]``      token     :math:`\exp(\frac1T\sum_t \operatorname{clip}(\log r_t, -EPS, EPS))`:
                              GMPO's sequence weight, log-ratios clipped at 0.4 by default
==================  ========  ===========================================================

PPO and CISPO have the same weight value; they differ in the gradient: PPO's clipped
tokens lose their gradient (for the sign of advantage that makes the clip bind), CISPO's
keep it. ``frac_modified`` counts tokens outside the clip range on both sides, an upper
bound of the ``clipfrac`` PPO implementations log (which count only the binding side).

Quantities, for each correction and T (:func:`theory`):

- ``mean_w`` :math:`= E[w]`; ``bias`` :math:`= E[w] - E[b]`, with :math:`b` the
  uncorrected weight the correction acts on (:math:`P_T`, :math:`G_T` for ``gspo`` and
  ``gmpo``, :math:`r` for the token corrections); ``mean_base`` :math:`= E[b]`.
- ``var_w`` :math:`= \operatorname{Var}(w)`; ``ess_frac`` :math:`= E[w]^2 / E[w^2]`
  (Kong's effective sample size over the number of weights).
- ``frac_modified``: the probability that a weight is truncated, clipped or masked (per
  sequence for the sequence level, per token for the token level);
  ``frac_seq_any``: the fraction of sequences with at least one modified token
  (:math:`1 - (1 - p)^T` for i.i.d. tokens; equal to ``frac_modified`` at sequence level).
  For the token level ``mean_w``, ``var_w`` and ``ess_frac`` are per token (GMPO: per
  sequence, its weight is one per sequence).

**Closed forms** (lognormal family). :math:`\log X \sim N(M, S^2)` for each base
variable: :math:`\log P_T \sim N(Tm, Tv)`, :math:`\log G_T \sim N(m, v/T)`,
:math:`\log r \sim N(m, v)`. Each weight is piecewise :math:`c_i X^{p_i}` on intervals
:math:`(a_i, b_i]` of :math:`\log X` (:math:`p_i \in \{0, 1\}`), so the truncated-lognormal
moments

.. math::

    E[X^k 1\{a < \log X \le b\}] = e^{kM + k^2 S^2/2}
        \Bigl[\Phi\Bigl(\frac{b - M - kS^2}{S}\Bigr) - \Phi\Bigl(\frac{a - M - kS^2}{S}\Bigr)\Bigr]

give :math:`E[w^j] = \sum_i c_i^j E[X^{p_i j} 1\{a_i < \log X \le b_i\}]`. For example
:math:`E[\min(P_T, C)] = e^{M + S^2/2}\Phi((\ln C - M - S^2)/S) + C(1 - \Phi((\ln C - M)/S))`;
the mask drops the second term. Everything is computed in log space: :math:`\log\Phi`
(``scipy.special.log_ndtr``) for tails, Gauss-Legendre quadrature of :math:`\varphi` for
intervals narrower than one standard deviation (where a difference of :math:`\Phi` values
would cancel), and ``logsumexp`` over the pieces, so nothing overflows at
:math:`T = 10^6`. GMPO: :math:`E[w^k] = (E[e^{(k/T) \operatorname{clip}(\log r, -\epsilon,
\epsilon)}])^T`, the same pieces with a fractional power.

**Random-scale and lognormal-mixture ratios** (:func:`theory`, no Monte Carlo): given a
sequence's variance :math:`v` (random scale) or its component counts (mixture) the log-ratios
are Gaussian, so the closed forms above hold conditionally; they are integrated over
:math:`v \sim \mathrm{Gamma}(\alpha, \theta)` by adaptive quadrature or summed over the
multinomial law of the counts (cut where less than :data:`MIXTURE_TAIL_MASS` is left). Each
row's ``method`` says which.

**Monte Carlo** (:func:`simulate_corrections`, every family) draws token log-ratios with the
engine's kernels (:func:`variance_lab.simulate.kernels.draw_log_r`), one
``np.random.Generator`` per chunk from ``SeedSequence(seed)``, and gives intervals and a
verdict. **Data** (:func:`evaluate`) applies the same transformations to measured token
log-ratios, with intervals of the modified fractions and, optionally, a fitted model's
predictions beside them; :func:`bucket_bootstrap` gives the relative bias and ESS fraction per
length bucket with bootstrap intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import integrate, optimize, special

from variance_lab._validate import check_n, check_seed, check_T
from variance_lab.families import (
    CODE_AR1,
    CODE_RANDOM_SCALE,
    Family,
    LogNormal,
    LognormalMixture,
    RandomScale,
)
from variance_lab.stats import (
    KHAT_THRESHOLD,
    cluster_counts,
    cluster_ratio,
    mean_interval,
    pareto_khat,
    wilson_interval,
    z_value,
)

__all__ = [
    "BOOTSTRAP_COLUMNS",
    "COLUMNS",
    "DATA_COLUMNS",
    "KINDS",
    "MAX_COUNT_TERMS",
    "MC_COLUMNS",
    "MIN_ESS",
    "MIXTURE_TAIL_MASS",
    "N_BOOT",
    "PREDICTION_COLUMNS",
    "TAIL_MASS",
    "WEIGHT_COLUMNS",
    "Correction",
    "apply_sequence",
    "apply_tokens",
    "bucket_bootstrap",
    "evaluate",
    "find_T",
    "fit_lognormal",
    "log_phi_diff",
    "parse",
    "parse_list",
    "simulate_corrections",
    "theory",
]

_INF = math.inf
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_GL_X, _GL_W = np.polynomial.legendre.leggauss(32)

#: Correction kinds: name -> (level, base weight, number of parameters allowed).
KINDS = {
    "seq-tis": ("sequence", "P", (1,)),
    "seq-mask": ("sequence", "P", (1, 2)),
    "geo-rs": ("sequence", "P", (2,)),
    "gspo": ("sequence", "G", (0, 1, 2)),
    "tis": ("token", "r", (1,)),
    "icepop": ("token", "r", (1,)),
    "cispo": ("token", "r", (1, 2)),
    "ppo": ("token", "r", (1, 2)),
    "gmpo": ("token", "G", (0, 1)),
}

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

#: Monte Carlo columns added by :func:`simulate_corrections`.
MC_COLUMNS = (
    "mc_mean_w",
    "mc_mean_w_lo",
    "mc_mean_w_hi",
    "mc_var_w",
    "mc_ess_frac",
    "mc_frac_modified",
    "mc_frac_modified_lo",
    "mc_frac_modified_hi",
    "mc_frac_seq_any",
    "mc_khat",
    "mc_reliable",
    "mc_reason",
)

#: Columns of :func:`evaluate` (corrections on measured token log-ratios).
DATA_COLUMNS = (
    "T",
    "correction",
    "level",
    "n_seq",
    "mean_w",
    "mean_w_lo",
    "mean_w_hi",
    *WEIGHT_COLUMNS,
    "frac_modified_lo",
    "frac_modified_hi",
)

#: Columns :func:`evaluate` adds with ``predict=``: the model's modified fraction and whether it
#: lies inside the observed interval.
PREDICTION_COLUMNS = ("pred_frac_modified", "pred_inside")

#: Bootstrap replicates of the token-level modified fraction's interval (:func:`evaluate`).
N_BOOT = 2000

#: GSPO's default clip range of s (Zheng et al. 2025) and GMPO's log-space clip.
GSPO_DEFAULT = (3e-4, 4e-4)
GMPO_DEFAULT = 0.4


# --------------------------------------------------------------------------------------
# specs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Correction:
    """One correction: its kind (:data:`KINDS`) and numeric parameters.

    Attributes
    ----------
    kind : str
    params : tuple of float
        As written in the spec (defaults filled in for ``gspo`` and ``gmpo``).
    spec : str
        The spec string it was parsed from, as written.
    """

    kind: str
    params: tuple[float, ...]
    spec: str

    @property
    def level(self) -> str:
        """``"sequence"`` or ``"token"``: where the correction acts."""
        return KINDS[self.kind][0]

    @property
    def base(self) -> str:
        """The uncorrected weight: ``"P"`` (P_T), ``"G"`` (G_T) or ``"r"`` (a token's ratio)."""
        return KINDS[self.kind][1]

    @property
    def unit(self) -> str:
        """What one weight belongs to: ``"sequence"`` (incl. GMPO) or ``"token"``."""
        return "token" if self.base == "r" else "sequence"

    def log_bounds(self, T: int = 1) -> tuple[float, float]:
        """Return the interval of the base weight's log where ``w`` equals it unmodified."""
        p, k = self.params, self.kind
        if k in ("seq-tis", "tis"):
            return -_INF, math.log(p[0])
        if k == "seq-mask":
            lo, hi = (0.0, p[0]) if len(p) == 1 else p
            return (math.log(lo) if lo > 0 else -_INF), math.log(hi)
        if k == "geo-rs":
            return T * math.log(p[0]), T * math.log(p[1])
        if k == "icepop":
            return -math.log(p[0]), math.log(p[0])
        if k == "gmpo":
            return -p[0], p[0]
        # gspo, cispo, ppo: a clip of the base weight to [1 - el, 1 + eh]
        el, eh = self._clip_eps()
        return (math.log1p(-el) if el < 1 else -_INF), math.log1p(eh)

    def _clip_eps(self) -> tuple[float, float]:
        p = self.params
        if self.kind == "cispo" and len(p) == 1:
            return 1.0, p[0]  # upper clip only
        if len(p) == 1:
            return p[0], p[0]
        return p[0], p[1]

    def pieces(self, T: int = 1) -> list[tuple[float, float, float, float]]:
        r"""Return the weight as pieces ``(a, b, log c, p)``: :math:`w = c X^p` for :math:`a < \log X \le b`.

        ``X`` is the base weight (for ``gmpo``: one token's ratio, whose clipped log is
        averaged). Where no piece covers :math:`\log X`, :math:`w = 0` (masked).
        """
        a, b = self.log_bounds(T)
        if self.kind in ("seq-mask", "geo-rs", "icepop"):
            return [(a, b, 0.0, 1.0)]
        if self.kind in ("seq-tis", "tis"):
            return [(a, b, 0.0, 1.0), (b, _INF, b, 0.0)]
        out = [(a, b, 0.0, 1.0), (b, _INF, b, 0.0)]
        if a > -_INF:
            out.insert(0, (-_INF, a, a, 0.0))
        return out


def _check_params(kind: str, spec: str, values: tuple[float, ...]) -> tuple[float, ...]:
    """Validate a kind's parameters; ``ValueError`` naming the spec."""

    def bad(why: str):
        return ValueError(f"bad correction {spec!r}: {why}")

    if not all(math.isfinite(v) for v in values):
        raise bad("parameters must be finite numbers")
    if kind == "gspo" and not values:
        return GSPO_DEFAULT
    if kind == "gmpo" and not values:
        return (GMPO_DEFAULT,)
    if kind in ("seq-tis", "tis") and values[0] <= 0:
        raise bad("the cap C must be > 0")
    if kind == "seq-mask":
        if len(values) == 1 and values[0] <= 0:
            raise bad("the cap C must be > 0")
        if len(values) == 2 and not 0 <= values[0] < values[1]:
            raise bad("needs 0 <= LO < HI")
    if kind == "geo-rs" and not 0 < values[0] < values[1]:
        raise bad("needs 0 < LO < HI")
    if kind == "icepop" and values[0] <= 1:
        raise bad("the band B must be > 1 (tokens outside [1/B, B] are masked)")
    if kind in ("gspo", "cispo", "ppo", "gmpo") and min(values) <= 0:
        raise bad("clip widths must be > 0")
    if kind in ("gspo", "ppo") and values[0] >= 1:
        raise bad("the lower clip width must be < 1 (the ratio is clipped below at 1 - EPS > 0)")
    if kind == "cispo" and len(values) == 2 and values[0] >= 1:
        raise bad("the lower clip width must be < 1")
    return values


def parse(spec: str) -> Correction:
    """Parse one spec such as ``seq-tis:3``, ``seq-mask:0.5:2``, ``icepop:5`` or ``gspo``.

    Raises
    ------
    ValueError
        Naming the spec: unknown kind, wrong number of parameters, or a bad value.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"bad correction {spec!r}: expected KIND[:PARAM...], e.g. seq-tis:3")
    text = spec.strip()
    kind, *raw = text.split(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown correction {spec!r}; kinds are {', '.join(KINDS)}")
    allowed = KINDS[kind][2]
    if len(raw) not in allowed:
        counts = " or ".join(str(c) for c in allowed)
        raise ValueError(f"bad correction {spec!r}: {kind} takes {counts} parameter(s), got {len(raw)}")
    try:
        values = tuple(float(v) for v in raw)
    except ValueError:
        raise ValueError(f"bad correction {spec!r}: parameters must be numbers") from None
    return Correction(kind, _check_params(kind, text, values), text)


def parse_list(text) -> list[Correction]:
    """Parse a comma list of specs (or a list of specs / Corrections); duplicates rejected."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = [c if isinstance(c, Correction) else parse(c) for c in items]
    if not out:
        raise ValueError("no correction given")
    specs = [c.spec for c in out]
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise ValueError(f"correction {dup[0]!r} given twice")
    return out


# --------------------------------------------------------------------------------------
# truncated-lognormal moments in log space
# --------------------------------------------------------------------------------------
def _log_phi_quad(a: float, b: float) -> float:
    """Log of the integral of the standard normal density over [a, b] (b - a <= 1): Gauss-Legendre."""
    half = 0.5 * (b - a)
    x = 0.5 * (a + b) + half * _GL_X
    return math.log(half) + float(special.logsumexp(-0.5 * x * x, b=_GL_W)) - _LOG_SQRT_2PI


def log_phi_diff(a: float, b: float) -> float:
    r""":math:`\log(\Phi(b) - \Phi(a))` for :math:`a \le b`, accurate everywhere.

    Tails by ``log_ndtr`` (the side of zero where :math:`\Phi` is small), an interval
    containing 0 by :math:`(\operatorname{erf}(b/\sqrt2) + \operatorname{erf}(-a/\sqrt2))/2`
    (two positive terms), and a narrow interval (:math:`b - a \le 1`) by 32-point
    Gauss-Legendre quadrature of :math:`\varphi`, where the difference would cancel.
    Returns :math:`-\infty` for an empty interval.
    """
    if not a < b:
        return -_INF
    if b - a <= 1.0:
        return _log_phi_quad(a, b)
    if b <= 0:
        la, lb = special.log_ndtr(a), special.log_ndtr(b)
        return float(lb + np.log(-np.expm1(la - lb)))
    if a >= 0:
        la, lb = special.log_ndtr(-a), special.log_ndtr(-b)
        return float(la + np.log(-np.expm1(lb - la)))
    return math.log(0.5 * (special.erf(b / math.sqrt(2)) + special.erf(-a / math.sqrt(2))))


def _log_tail_out(a: float, b: float) -> float:
    r""":math:`\log(\Phi(a) + 1 - \Phi(b))`: the mass outside :math:`(a, b]`."""
    return float(np.logaddexp(special.log_ndtr(a), special.log_ndtr(-b)))


def _log_moment(pieces, M: float, S: float, j: float) -> float:
    r""":math:`\log E[w^j]` for :math:`\log X \sim N(M, S^2)` and a piecewise weight."""
    terms = []
    for a, b, logc, p in pieces:
        k = p * j
        if S == 0.0:
            if a < M <= b:
                terms.append(j * logc + k * M)
            continue
        shift = M + k * S * S
        mass = log_phi_diff((a - shift) / S, (b - shift) / S)
        terms.append(j * logc + k * M + 0.5 * k * k * S * S + mass)
    terms = [t for t in terms if t > -_INF]
    return float(special.logsumexp(terms)) if terms else -_INF


def _log_frac_out(a: float, b: float, M: float, S: float) -> float:
    """Log P(log X outside (a, b]) for log X ~ N(M, S^2)."""
    if S == 0.0:
        return 0.0 if not a < M <= b else -_INF
    return _log_tail_out((a - M) / S, (b - M) / S)


def _log_phi_diff_vec(a, b) -> np.ndarray:
    """:func:`log_phi_diff` elementwise over arrays, by the same branches."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    out = np.full(a.shape, -_INF)
    ok = a < b
    narrow = ok & (b - a <= 1.0)
    left = ok & ~narrow & (b <= 0)
    right = ok & ~narrow & ~left & (a >= 0)
    mid = ok & ~narrow & ~left & ~right
    if narrow.any():
        aa, bb = a[narrow], b[narrow]
        half = 0.5 * (bb - aa)
        x = (0.5 * (aa + bb))[:, None] + half[:, None] * _GL_X
        out[narrow] = np.log(half) + special.logsumexp(-0.5 * x * x, b=_GL_W, axis=1) - _LOG_SQRT_2PI
    with np.errstate(divide="ignore", invalid="ignore"):
        if left.any():
            la, lb = special.log_ndtr(a[left]), special.log_ndtr(b[left])
            out[left] = lb + np.log(-np.expm1(la - lb))
        if right.any():
            la, lb = special.log_ndtr(-a[right]), special.log_ndtr(-b[right])
            out[right] = la + np.log(-np.expm1(lb - la))
    if mid.any():
        r2 = math.sqrt(2)
        out[mid] = np.log(0.5 * (special.erf(b[mid] / r2) + special.erf(-a[mid] / r2)))
    return out


def _logsumexp_rows(terms: np.ndarray) -> np.ndarray:
    """Log-sum-exp over the first axis, -inf where every term is -inf."""
    mx = terms.max(axis=0)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(divide="ignore"):
        return np.where(np.isfinite(mx), safe + np.log(np.exp(terms - safe).sum(axis=0)), -_INF)


def _log_moment_vec(pieces, M: np.ndarray, S: np.ndarray, j: float) -> np.ndarray:
    """:func:`_log_moment` elementwise over arrays of (M, S)."""
    terms = []
    pos = S > 0
    Ss = np.where(pos, S, 1.0)
    for a, b, logc, p in pieces:
        k = p * j
        shift = M + k * Ss * Ss
        mass = _log_phi_diff_vec((a - shift) / Ss, (b - shift) / Ss)
        t = j * logc + k * M + 0.5 * k * k * Ss * Ss + mass
        degenerate = np.where((a < M) & (b >= M), j * logc + k * M, -_INF)
        terms.append(np.where(pos, t, degenerate))
    return _logsumexp_rows(np.array(terms))


def _log_frac_out_vec(a: float, b: float, M: np.ndarray, S: np.ndarray) -> np.ndarray:
    """:func:`_log_frac_out` elementwise over arrays of (M, S)."""
    pos = S > 0
    Ss = np.where(pos, S, 1.0)
    tail = np.logaddexp(special.log_ndtr((a - M) / Ss), special.log_ndtr(-(b - M) / Ss))
    return np.where(pos, tail, np.where((a < M) & (b >= M), -_INF, 0.0))


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
    if c.kind == "gmpo":
        M, S = m, math.sqrt(v)
        pieces = c.pieces()
        l1 = T * _log_moment(pieces, M, S, 1.0 / T)
        l2 = T * _log_moment(pieces, M, S, 2.0 / T)
        a, b = c.log_bounds()
        return l1, l2, _log_frac_out(a, b, M, S), m + v / (2 * T)
    M, S = _gauss(m, v, c.base, T)
    return (*_log_moments_MS(c, M, S, T), M + 0.5 * S * S)


def _log_moments_MS(c: Correction, M: float, S: float, T: float) -> tuple[float, float, float]:
    """(log E[w], log E[w^2], log frac_modified) when the log of the base weight is N(M, S^2)."""
    pieces = c.pieces(T)
    a, b = c.log_bounds(T)
    return (
        _log_moment(pieces, M, S, 1.0),
        _log_moment(pieces, M, S, 2.0),
        _log_frac_out(a, b, M, S),
    )


def _frac_seq_any(c: Correction, log_frac: float, T: float) -> float:
    """Fraction of sequences with at least one modified token: 1 - (1 - p)^T (i.i.d. tokens)."""
    if c.level == "sequence":
        return math.exp(log_frac)
    p = math.exp(log_frac)
    return 1.0 if p >= 1.0 else -math.expm1(T * math.log1p(-p))


def _row(c: Correction, family: Family, T: int) -> dict:
    l1, l2, lf, lbase = _log_moments_at(c, family, T)
    return _row_from_logs(c, T, (l1, l2, lf, lbase), _frac_seq_any(c, lf, T), "closed form")


def _row_from_logs(c: Correction, T: int, logs, frac_seq_any: float, method: str) -> dict:
    """Build a :func:`theory` row from (log E[w], log E[w^2], log frac_modified, log E[base])."""
    l1, l2, lf, lbase = logs
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
        "correction": c.spec,
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


def _log1mexp(x: float) -> float:
    r""":math:`\log(1 - e^x)` for :math:`x \le 0`, accurate on both sides of :math:`-\log 2`."""
    if x == 0.0:
        return -_INF
    if x == -_INF:
        return 0.0
    return math.log(-math.expm1(x)) if x > -0.6931471805599453 else math.log1p(-math.exp(x))


def _log_any(c: Correction, lf: float, T: float) -> float:
    """Log of the probability that a sequence has a modified weight, given i.i.d. tokens."""
    if c.level == "sequence":
        return lf
    return _log1mexp(T * math.log1p(-math.exp(lf))) if lf < 0 else 0.0


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
    elif c.base == "G":
        lbase = log_mu - family.alpha * math.log1p(family.theta * (1.0 - 1.0 / T) / 2.0)
    else:
        lbase = log_mu
    return _row_from_logs(c, T, (l1, l2, lf, lbase), math.exp(lany), "quadrature")


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
                            lw + _log_moment(pieces, mj, math.sqrt(vj), k / T)
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
        _log_moment_vec(pieces, M, S, 1.0),
        _log_moment_vec(pieces, M, S, 2.0),
        _log_frac_out_vec(a, b, M, S),
    )
    l1, l2, lf = (float(_logsumexp_rows((logp + x)[:, None])[0]) for x in logs)
    lbase = T * float(family.K(1.0)) if c.base == "P" else T * float(family.K(1.0 / T))
    return _row_from_logs(c, T, (l1, l2, lf, lbase), math.exp(lf), "multinomial sum")


def theory(family: Family, T, corrections) -> pd.DataFrame:
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
        Specs (a comma list or a list), see :func:`parse`.

    Returns
    -------
    pandas.DataFrame
        One row per (T, correction) in that order, columns :data:`COLUMNS` (``method`` last).
    """
    row = _row_function(family)
    grid = check_T(T, grid=True)
    cs = parse_list(corrections)
    rows = [row(c, family, int(t)) for t in grid for c in cs]
    return pd.DataFrame(rows, columns=list(COLUMNS))


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


def _find_target(c: Correction, family: Family, T: float) -> float:
    """Return the quantity :func:`find_T` watches: per-sequence for sequence level, any-token otherwise."""
    _, _, lf, _ = _log_moments_at(c, family, T)
    return _frac_seq_any(c, lf, T)


def find_T(family: Family, correction, threshold: float = 0.5, *, T_max: int = 10**7) -> int | None:
    r"""Find the smallest length T at which a correction modifies at least ``threshold`` of the sequences.

    "Modifies" is ``frac_modified`` for a sequence-level correction (the fraction of
    sequences truncated or masked) and ``frac_seq_any`` for a token-level one (the fraction
    of sequences with at least one truncated, clipped or masked token). The closed form is
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

    Returns
    -------
    int or None
        None when the fraction stays below ``threshold`` for every T <= ``T_max`` (for
        example an upper cap under on-policy ratios, mu = 1: :math:`P_T \to 0` and the
        fraction above the cap vanishes as T grows).
    """
    family = _check_lognormal(family)
    c = correction if isinstance(correction, Correction) else parse(correction)
    if not 0.0 < threshold <= 1.0 or isinstance(threshold, bool):
        raise ValueError(f"threshold must lie in (0, 1], got {threshold!r}")

    def f(t):
        return _find_target(c, family, t) - threshold

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


# --------------------------------------------------------------------------------------
# weights from log-ratios (shared by Monte Carlo and data)
# --------------------------------------------------------------------------------------
def apply_sequence(c: Correction, log_p: np.ndarray, T) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a sequence-level correction's weights from :math:`\log P_T` values.

    Parameters
    ----------
    c : Correction
        Of level ``"sequence"``.
    log_p : ndarray
        :math:`\log P_T` of each sequence.
    T : int or ndarray
        Each sequence's length (for :math:`G_T = P_T^{1/T}` and Geo-RS's bounds).

    Returns
    -------
    (w, modified) : tuple of ndarray
        The weights and a boolean array, True where the weight was truncated, clipped or masked.
    """
    if c.level != "sequence":
        raise ValueError(f"{c.spec!r} is a token-level correction")
    log_p = np.asarray(log_p, dtype=float)
    T = np.asarray(T, dtype=float)
    x = log_p / T if c.base == "G" else log_p
    if c.kind == "geo-rs":
        lo, hi = math.log(c.params[0]), math.log(c.params[1])
        g = log_p / T
        keep = (g >= lo) & (g <= hi)
        return np.where(keep, np.exp(np.where(keep, log_p, 0.0)), 0.0), ~keep
    return _apply_pieces(c, x)


def _apply_pieces(c: Correction, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights of the T-free pieces of ``c`` at base log-values ``x``."""
    a, b = c.log_bounds()
    keep = (x > a) & (x <= b) if a > -_INF else x <= b
    w = np.zeros_like(x)
    for lo, hi, logc, p in c.pieces():
        inside = (x > lo) & (x <= hi)
        if p == 1.0:
            w = np.where(inside, np.exp(np.where(inside, x, 0.0) + logc), w)
        else:
            w = np.where(inside, math.exp(logc), w)
    return w, ~keep


def apply_tokens(c: Correction, log_r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Compute a token-level correction's per-token weights and modified flags (GMPO: clipped log-ratios).

    Returns
    -------
    (w, modified) : tuple of ndarray
        For ``gmpo`` ``w`` is :math:`\operatorname{clip}(\log r, -\epsilon, \epsilon)`, whose
        mean over a sequence is the log of its weight.
    """
    if c.level != "token":
        raise ValueError(f"{c.spec!r} is a sequence-level correction")
    log_r = np.asarray(log_r, dtype=float)
    if c.kind == "gmpo":
        e = c.params[0]
        return np.clip(log_r, -e, e), np.abs(log_r) > e
    return _apply_pieces(c, log_r)


# --------------------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------------------
#: Effective draws below which a Monte Carlo row is flagged unreliable.
MIN_ESS = 100


class _Sums:
    """Mergeable sums of one (T, correction) cell: weights, modified flags and the log-weight tail."""

    def __init__(self, tail: int):
        self.tail = tail
        self.n = 0  # sequences
        self.units = 0  # weights (sequences or tokens)
        self.w1 = self.w2 = 0.0  # sums of weights and squared weights over units
        self.m1 = self.m2 = 0.0  # sums over sequences of the per-sequence mean weight (token level)
        self.f1 = self.f2 = 0.0  # sums over sequences of the per-sequence modified fraction
        self.any = 0  # sequences with a modified weight
        self.log_top = np.empty(0)

    def add(self, w: np.ndarray, modified: np.ndarray) -> None:
        """Add a chunk: ``w`` and ``modified`` of shape (sequences,) or (sequences, tokens)."""
        w2 = w if w.ndim == 2 else w[:, None]
        mod2 = modified if modified.ndim == 2 else modified[:, None]
        pm, pf = w2.mean(axis=1), mod2.mean(axis=1)
        self.n += w2.shape[0]
        self.units += w2.size
        self.w1 += float(w2.sum())
        self.w2 += float(np.square(w2).sum())
        self.m1 += float(pm.sum())
        self.m2 += float(np.square(pm).sum())
        self.f1 += float(pf.sum())
        self.f2 += float(np.square(pf).sum())
        self.any += int(mod2.any(axis=1).sum())
        with np.errstate(divide="ignore"):
            logs = np.concatenate([self.log_top, np.log(w2.ravel())])
        k = min(self.tail, logs.size)
        self.log_top = np.partition(logs, logs.size - k)[logs.size - k :]

    def estimates(self, ci: float) -> dict:
        n, units = self.n, self.units
        mean, m2 = self.w1 / units, self.w2 / units
        var_w = max(m2 - mean * mean, 0.0) * units / max(units - 1, 1)
        # the interval of the mean: between-sequence variance of per-sequence means (any dependence)
        pm = self.m1 / n
        lo, hi, _ = mean_interval(pm, max(self.m2 / n - pm * pm, 0.0) * n / (n - 1), n, ci)
        fm = self.f1 / n
        flo, fhi, _ = mean_interval(fm, max(self.f2 / n - fm * fm, 0.0) * n / (n - 1), n, ci)
        ess = mean * mean / m2 if m2 > 0 else math.nan
        m = int(min(units / 5, 3 * math.sqrt(units)))
        top = np.sort(self.log_top)[-(m + 1) :] if m >= 5 else np.empty(0)
        khat = pareto_khat(top) if top.size else math.nan
        reasons = []
        if not ess > 0:
            reasons.append("every sampled weight is 0 (all masked)")
        elif units * ess < MIN_ESS:
            reasons.append(f"effective sample size {units * ess:.3g} < {MIN_ESS}")
        if khat > KHAT_THRESHOLD:
            reasons.append(f"Pareto k-hat {khat:.2f} > {KHAT_THRESHOLD}: weights too heavy-tailed")
        return {
            "mc_mean_w": mean,
            "mc_mean_w_lo": float(lo),
            "mc_mean_w_hi": float(hi),
            "mc_var_w": var_w,
            "mc_ess_frac": ess,
            "mc_frac_modified": fm,
            "mc_frac_modified_lo": float(max(flo, 0.0)),
            "mc_frac_modified_hi": float(min(fhi, 1.0)),
            "mc_frac_seq_any": self.any / n,
            "mc_khat": khat,
            "mc_reliable": not reasons,
            "mc_reason": "; ".join(reasons),
        }


def _draw_tokens(code: int, params: np.ndarray, rng: np.random.Generator, n: int, T: int) -> np.ndarray:
    """(n, T) token log-ratios: one call for i.i.d. families, one path per row for AR(1) and random-scale."""
    from variance_lab.simulate.kernels import draw_log_r

    if code in (CODE_AR1, CODE_RANDOM_SCALE):  # each row its own path (its own state, or its own v)
        return np.stack([draw_log_r(code, params, rng, T) for _ in range(n)])
    return draw_log_r(code, params, rng, n * T).reshape(n, T)


def _chunk_cells(cs, grid, Y: np.ndarray, cells: dict) -> None:
    """Add one chunk of token log-ratios ``Y`` (paths x max T) to every (T, correction) cell."""
    cum = np.cumsum(Y, axis=1)
    for t in grid:
        log_p = cum[:, t - 1]
        for c in cs:
            if c.level == "sequence":
                w, mod = apply_sequence(c, log_p, t)
                cells[(t, c.spec)].add(w, mod)
                continue
            wt, mod = apply_tokens(c, Y[:, :t])
            if c.kind == "gmpo":  # one weight per sequence, modified flags per token
                w = np.exp(wt.mean(axis=1))
                cell = cells[(t, c.spec)]
                cell.add(w, np.zeros(w.shape, dtype=bool))
                cell.f1 += float(mod.mean(axis=1).sum())
                cell.f2 += float(np.square(mod.mean(axis=1)).sum())
                cell.any += int(mod.any(axis=1).sum())
            else:
                cells[(t, c.spec)].add(wt, mod)


def simulate_corrections(
    family: Family, T, corrections, n, *, seed=0, ci: float = 0.95, chunk_size=None
) -> pd.DataFrame:
    r"""Monte Carlo effect of each correction at each T, for any family, with intervals and a verdict.

    Draws ``n`` sequences of ``max(T)`` token log-ratios with the engine's kernel
    (:func:`variance_lab.simulate.kernels.draw_log_r`), chunk ``i`` from the generator
    ``PCG64(SeedSequence(seed, spawn_key=(i,)))``; every T reads the prefix of the same
    paths. Per (T, correction) it estimates the columns of :func:`theory` with ``ci``
    intervals for the mean weight (from the between-sequence variance of each sequence's
    mean weight, valid for dependent tokens too) and for the modified fraction, the Pareto
    :math:`\hat k` of the weights, and a verdict: a row is unreliable when the effective
    number of weights (units x ESS fraction) is below :data:`MIN_ESS` or :math:`\hat k > 0.7`.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    corrections : str or list
    n : int
        Sequences, >= 2.
    seed : int
    ci : float
    chunk_size : int, optional
        Sequences per chunk; default ``max(4, min(4096, 2**21 // max(T)))``. With ``n`` and
        ``seed`` it fixes every bit of the result.

    Returns
    -------
    pandas.DataFrame
        One row per (T, correction): ``T, correction, level`` and :data:`MC_COLUMNS`.
    """
    from variance_lab.simulate.plan import chunk_generator

    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    grid = [int(t) for t in check_T(T, grid=True)]
    cs = parse_list(corrections)
    n = check_n(n)
    seed = check_seed(seed)
    z_value(ci)
    t_max = grid[-1]
    size = max(4, min(4096, 2**21 // t_max)) if chunk_size is None else check_n(chunk_size, minimum=1)
    code, params = family.sampler_params()
    tail = int(3 * math.sqrt(n * t_max)) + 2
    cells = {(t, c.spec): _Sums(tail) for t in grid for c in cs}
    for index, start in enumerate(range(0, n, size)):
        rng = chunk_generator(seed, index)
        Y = _draw_tokens(code, params, rng, min(size, n - start), t_max)
        _chunk_cells(cs, grid, Y, cells)
    rows = [
        {"T": t, "correction": c.spec, "level": c.level, **cells[(t, c.spec)].estimates(ci)}
        for t in grid
        for c in cs
    ]
    out = pd.DataFrame(rows, columns=["T", "correction", "level", *MC_COLUMNS])
    out.attrs["provenance"] = {
        "family": family.describe(),
        "n": n,
        "seed": seed,
        "chunk_size": size,
        "ci": ci,
    }
    return out


# --------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------
def fit_lognormal(log_r) -> LogNormal:
    r"""Fit the lognormal family to measured token log-ratios: their pooled mean and unbiased variance.

    :math:`\log r \sim N(\bar y, s_y^2)`: :math:`\mu = e^{\bar y + s_y^2/2}`,
    :math:`\sigma^2 = \mu^2(e^{s_y^2} - 1)`.
    """
    y = np.asarray(log_r, dtype=float).ravel()
    if y.size < 2 or not np.all(np.isfinite(y)):
        raise ValueError(f"fit_lognormal needs >= 2 finite log-ratios, got {y.size}")
    m, v = float(y.mean()), float(y.var(ddof=1))
    mu = math.exp(m + v / 2)
    return LogNormal(mu, mu * mu * math.expm1(v))


def _rollout_arrays(log_r, offsets) -> tuple[np.ndarray, np.ndarray]:
    """``log_r`` as finite floats and ``offsets`` as rising int64 bounds, or ``ValueError``."""
    log_r = np.asarray(log_r, dtype=float)
    off = np.asarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or off[-1] != log_r.size or np.any(np.diff(off) < 1):
        raise ValueError("offsets must rise from 0 to len(log_r) in steps >= 1 (one sequence each)")
    if not np.all(np.isfinite(log_r)):
        raise ValueError("log_r holds non-finite values")
    return log_r, off


def evaluate(
    log_r, offsets, corrections, *, buckets=None, ci: float = 0.95, predict=None, seed: int = 0, groups=None
) -> pd.DataFrame:
    r"""Apply the corrections to measured token log-ratios, per length bucket.

    Parameters
    ----------
    log_r : array_like of float
        Token log-ratios of all sequences, concatenated (for example
        ``old_logp - rollout_logp`` for the mismatch, ``logp - old_logp`` for the update).
    offsets : array_like of int
        Sequence boundaries: sequence ``i`` is ``log_r[offsets[i]:offsets[i+1]]`` (length >= 1).
    corrections : str or list
    buckets : list of (int, int), optional
        Inclusive length ranges; default one bucket with every sequence.
    ci : float
    predict : Family, optional
        A model with a :func:`theory` (for example :func:`fit_lognormal` of the same log-ratios):
        adds :data:`PREDICTION_COLUMNS`, its ``frac_modified`` for the bucket (sequence level:
        the mean over the bucket's sequences of the prediction at each one's length; token
        level and GMPO: per token, which for these models does not depend on T) and whether it
        lies inside ``[frac_modified_lo, frac_modified_hi]``.
    seed : int
        Root seed of the bootstrap (token-level intervals).
    groups : array_like, optional
        The prompt of each sequence (responses to one prompt are not independent): every
        interval then resamples prompts, keeping a prompt's responses together
        (:func:`variance_lab.stats.cluster_ratio`).

    Returns
    -------
    pandas.DataFrame
        One row per (bucket, correction), columns :data:`DATA_COLUMNS` plus ``T_min``,
        ``T_max`` (the bucket's lengths; ``T`` is its median length). Sequence-level weights
        are per sequence; token-level ones per token (a ratio estimator over the per-sequence
        sums); GMPO per sequence. ``mean_w_lo``/``_hi``: a percentile bootstrap interval of the
        mean weight (:data:`N_BOOT` resamples of the sequences, or of the prompts with
        ``groups``), which stays within the weights' range, so never below 0. ``frac_modified_lo``/``_hi``:
        a ``ci`` interval of the modified fraction: for a sequence-level correction Wilson's
        score interval (without ``groups``) or Wilson's at the effective size ``n / design
        effect`` from a bootstrap over prompts; a percentile bootstrap over sequences (or
        prompts; tokens of one sequence kept together) for a token-level one and GMPO.
    """
    log_r, off = _rollout_arrays(log_r, offsets)
    cs = parse_list(corrections)
    z = z_value(ci)
    seed = check_seed(seed)
    lengths = np.diff(off)
    if buckets is None:
        buckets = [(int(lengths.min()), int(lengths.max()))]
    log_p = np.add.reduceat(log_r, off[:-1])
    pred = _predictions(predict, cs, lengths) if predict is not None else None
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != lengths.shape:
            raise ValueError(
                f"groups must hold one prompt per sequence ({lengths.size}), got shape {groups.shape}"
            )
    rows = []
    for index, (lo, hi) in enumerate(buckets):
        sel = (lengths >= lo) & (lengths <= hi)
        if not sel.any():
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))
        for c in cs:
            row = _data_row(c, log_r, off, lengths, log_p, sel, z, rng, ci, groups)
            if pred is not None:
                p = float(np.mean(pred[c.spec][sel])) if c.level == "sequence" else float(pred[c.spec])
                row["pred_frac_modified"] = p
                row["pred_inside"] = bool(row["frac_modified_lo"] <= p <= row["frac_modified_hi"])
            rows.append({**row, "T_min": lo, "T_max": hi})
    extra = list(PREDICTION_COLUMNS) if pred is not None else []
    return pd.DataFrame(rows, columns=[*DATA_COLUMNS, "T_min", "T_max", *extra])


#: Columns of :func:`bucket_bootstrap`.
BOOTSTRAP_COLUMNS = (
    "T",
    "T_min",
    "T_max",
    "correction",
    "n_seq",
    "rel_bias",
    "rel_bias_lo",
    "rel_bias_hi",
    "ess_frac",
    "ess_frac_lo",
    "ess_frac_hi",
)


def bucket_bootstrap(
    log_r, offsets, corrections, buckets, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None
) -> pd.DataFrame:
    r"""Relative bias and ESS fraction of each correction per length bucket, with bootstrap intervals.

    In a bucket, with :math:`w` the corrected and :math:`b` the uncorrected weights (per
    sequence for sequence-level corrections and GMPO, per token for token-level ones, as in
    :func:`evaluate`): ``rel_bias`` :math:`= \sum w / \sum b - 1` and ``ess_frac``
    :math:`= (\sum w)^2 / (N \sum w^2)` over its :math:`N` weights. The ``ci`` intervals are
    percentile bootstraps over sequences (``n_boot`` resamples of the bucket's sequences, the
    tokens of one sequence kept together), from ``SeedSequence(seed, spawn_key=(bucket,))``.

    Parameters
    ----------
    log_r, offsets, corrections
        As for :func:`evaluate`.
    buckets : list of (int, int)
        Inclusive length ranges; empty buckets are left out.
    n_boot : int
    ci : float
    seed : int
    groups : array_like, optional
        The prompt of each sequence: the resamples then draw the bucket's prompts, each with
        all of its responses in the bucket (:func:`variance_lab.stats.cluster_counts`).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`BOOTSTRAP_COLUMNS`; ``T`` is the bucket's median length.
    """
    log_r, off = _rollout_arrays(log_r, offsets)
    cs = parse_list(corrections)
    n_boot = check_n(n_boot, minimum=1)
    seed = check_seed(seed)
    z_value(ci)
    lengths = np.diff(off)
    log_p = np.add.reduceat(log_r, off[:-1])
    sums = {}
    for c in cs:  # per sequence: (sum w, sum w^2, sum b, number of weights)
        if c.level == "sequence" or c.kind == "gmpo":
            if c.level == "sequence":
                w, _ = apply_sequence(c, log_p, lengths)
            else:
                zt, _ = apply_tokens(c, log_r)
                w = np.exp(np.add.reduceat(zt, off[:-1]) / lengths)
            b = np.exp(log_p / lengths) if c.base == "G" else np.exp(log_p)
            sums[c.spec] = (w, w * w, b, np.ones_like(w))
        else:
            wt, _ = apply_tokens(c, log_r)
            red = [np.add.reduceat(x, off[:-1]) for x in (wt, wt * wt, np.exp(log_r))]
            sums[c.spec] = (*red, lengths.astype(float))
    rows = []
    q = [(1 - ci) / 2, (1 + ci) / 2]
    for index, (lo, hi) in enumerate(buckets):
        sel = np.flatnonzero((lengths >= lo) & (lengths <= hi))
        if not sel.size:
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index,))))
        if groups is None:
            idx = sel[rng.integers(0, sel.size, size=(n_boot, sel.size))]

            def resum(x, idx=idx):
                return x[idx].sum(axis=1)
        else:
            W = cluster_counts(np.asarray(groups)[sel], n_boot, rng).astype(float)

            def resum(x, W=W, sel=sel):
                return W @ x[sel]

        for c in cs:
            w1, w2, b, k = sums[c.spec]
            with np.errstate(divide="ignore", invalid="ignore"):
                rb = w1[sel].sum() / b[sel].sum() - 1
                ess = w1[sel].sum() ** 2 / (k[sel].sum() * w2[sel].sum())
                rb_boot = resum(w1) / resum(b) - 1
                ess_boot = resum(w1) ** 2 / (resum(k) * resum(w2))
            rb_lo, rb_hi = np.nanquantile(rb_boot, q) if np.isfinite(rb_boot).any() else (math.nan,) * 2
            e_lo, e_hi = np.nanquantile(ess_boot, q) if np.isfinite(ess_boot).any() else (math.nan,) * 2
            rows.append(
                {
                    "T": float(np.median(lengths[sel])),
                    "T_min": int(lo),
                    "T_max": int(hi),
                    "correction": c.spec,
                    "n_seq": int(sel.size),
                    "rel_bias": float(rb),
                    "rel_bias_lo": float(rb_lo),
                    "rel_bias_hi": float(rb_hi),
                    "ess_frac": float(ess),
                    "ess_frac_lo": float(e_lo),
                    "ess_frac_hi": float(e_hi),
                }
            )
    return pd.DataFrame(rows, columns=list(BOOTSTRAP_COLUMNS))


def _predictions(family, cs, lengths) -> dict:
    """Predicted frac_modified: per sequence (at its length) for sequence level, one number per token."""
    out = {}
    seq = [c for c in cs if c.level == "sequence"]
    if seq:
        grid = np.unique(lengths)
        th = theory(family, grid, seq)
        for c in seq:
            f = th[th.correction == c.spec].set_index("T").frac_modified
            out[c.spec] = f.reindex(lengths).to_numpy(float)
    tok = [c for c in cs if c.level == "token"]
    if tok:
        th = theory(family, [1], tok)
        out.update(dict(zip(th.correction, th.frac_modified.astype(float), strict=True)))
    return out


def _boot_ratio(num: np.ndarray, den: np.ndarray, rng, ci: float, groups=None) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(num) / sum(den), resampling sequences (or their prompts)."""
    if groups is not None:
        r = cluster_ratio(num, den, groups, n_boot=N_BOOT, level=ci, rng=rng)
        return r["lo"], r["hi"]
    n = num.size
    idx = rng.integers(0, n, size=(N_BOOT, n))
    ratio = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    lo, hi = np.quantile(ratio, [(1 - ci) / 2, (1 + ci) / 2])
    return float(lo), float(hi)


def _data_row(c, log_r, off, lengths, log_p, sel, z, rng, ci, groups=None) -> dict:
    L = lengths[sel]
    seq_idx = np.flatnonzero(sel)
    g = None if groups is None else groups[sel]
    if c.level == "sequence" or c.kind == "gmpo":
        if c.level == "sequence":
            w, mod = apply_sequence(c, log_p[sel], L)
            frac = float(mod.mean())
            any_ = frac
            if g is None:
                frac_ci = tuple(float(e) for e in wilson_interval(float(mod.sum()), mod.size, ci))
            else:
                r = cluster_ratio(
                    mod.astype(float), np.ones(mod.size), g, n_boot=N_BOOT, level=ci, rng=rng, proportion=True
                )
                frac_ci = (r["lo"], r["hi"])
        else:
            zt, modt = apply_tokens(c, log_r)
            w = np.exp(np.add.reduceat(zt, off[:-1])[sel] / L)
            nmod = np.add.reduceat(modt.astype(float), off[:-1])[sel]
            frac, any_ = float(nmod.sum() / L.sum()), float((nmod > 0).mean())
            frac_ci = _boot_ratio(nmod, L.astype(float), rng, ci, g)
        mean_ci = _boot_ratio(w, np.ones(w.size), rng, ci, g)
        base = np.exp(log_p[sel] / L) if c.base == "G" else np.exp(log_p[sel])
        n = w.size
        mean = float(w.mean())
        var = float(w.var(ddof=1)) if n > 1 else math.nan
        se = math.sqrt(var / n) if n > 1 else math.nan
        ess = mean * mean / float(np.mean(w * w)) if np.any(w > 0) else math.nan
        base_mean = float(base.mean())
    else:
        wt, modt = apply_tokens(c, log_r)
        ws = np.add.reduceat(wt, off[:-1])[sel]
        nmod = np.add.reduceat(modt.astype(float), off[:-1])[sel]
        ntok = L.sum()
        mean = float(ws.sum() / ntok)
        tok = np.concatenate([np.arange(off[i], off[i + 1]) for i in seq_idx])
        var = float(wt[tok].var(ddof=1)) if tok.size > 1 else math.nan
        resid = ws - mean * L  # ratio estimator: se of sum(w) / sum(L)
        se = math.sqrt(float(np.sum(resid * resid))) / ntok if L.size > 1 else math.nan
        ess = mean * mean / float(np.mean(wt[tok] ** 2)) if np.any(wt[tok] > 0) else math.nan
        frac, any_ = float(nmod.sum() / ntok), float((nmod > 0).mean())
        frac_ci = _boot_ratio(nmod, L.astype(float), rng, ci, g)
        mean_ci = _boot_ratio(ws, L.astype(float), rng, ci, g)
        base_mean = float(np.exp(log_r[tok]).mean())
        n = L.size
    return {
        "T": float(np.median(L)),
        "correction": c.spec,
        "level": c.level,
        "n_seq": int(n),
        "mean_w": mean,
        "mean_w_lo": min(mean_ci[0], mean) if math.isfinite(se) else math.nan,
        "mean_w_hi": max(mean_ci[1], mean) if math.isfinite(se) else math.nan,
        "bias": mean - base_mean,
        "var_w": var,
        "ess_frac": ess,
        "frac_modified": frac,
        "frac_seq_any": any_,
        "mean_base": base_mean,
        "frac_modified_lo": frac_ci[0],
        "frac_modified_hi": frac_ci[1],
    }
