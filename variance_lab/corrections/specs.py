r"""The correction kinds and their spec strings: :class:`Correction`, :func:`parse`, :func:`parse_list`.

A spec names a kind of :data:`CORRECTION_KINDS` and its numeric parameters (``seq-tis:3``, ``icepop:5``,
``gspo``, ``ctpo:0.5:0.5``, ``m2po:0.04``, ``dppo-tv:0.15``, ``kpop:0.1``, ``cppo``); a
:class:`Correction` gives its level, its base weight and its weight as pieces ``(a, b, log c, p)`` on the
log of the base weight, from which every other module of the package computes. The probability-aware kinds
(:data:`PROB_KINDS`: ``dppo-tv``, ``dppo-kl``, ``kpop``, ``cppo``) have no band on the ratio at all: they
mask by the token's probabilities (:mod:`variance_lab.corrections.probmask`; ``cppo``'s threshold also
moves with the token's position and its sequence's prefix). Two kinds need more than
their parameters for their band:
``ctpo``'s bounds grow with the token's position t (:meth:`Correction.log_bounds` at ``T = t``),
and ``m2po``'s band depends on the whole batch, so in theory on the law of :math:`\log r`
(its large-batch cut, :attr:`Correction.cut`, set by
:func:`variance_lab.corrections.m2po.resolve_cut`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from variance_lab.ratios import (
    ASPO_DUAL_CLIP,
    ASPO_EPS,
    CPPO_DELTA,
    CPPO_DELTA_B,
    CPPO_W_MIN,
    DPPO_KL_DELTA,
    DPPO_TV_DELTA,
    GMPO_EPS,
    GSPO_EPS,
    ICEPOP_BAND,
    KPOP_DELTA,
    M2PO_TAU,
)

__all__ = [
    "ASPO_DEFAULT",
    "CORRECTION_KINDS",
    "CPPO_DEFAULT",
    "DPPO_KL_DEFAULT",
    "DPPO_TV_DEFAULT",
    "GMPO_DEFAULT",
    "GSPO_DEFAULT",
    "ICEPOP_DEFAULT",
    "KPOP_DEFAULT",
    "M2PO_BATCH",
    "M2PO_DEFAULT",
    "PROB_KINDS",
    "SIGNED_KINDS",
    "SIGN_P_DEFAULT",
    "Correction",
    "parse",
    "parse_list",
]

_INF = math.inf

#: Correction kinds: name -> (level, base weight, number of parameters allowed).
CORRECTION_KINDS = {
    "seq-tis": ("sequence", "P", (1,)),
    "seq-mask": ("sequence", "P", (1, 2)),
    "geo-rs": ("sequence", "P", (2,)),
    "gspo": ("sequence", "G", (0, 1, 2)),
    "tis": ("token", "r", (1,)),
    "icepop": ("token", "r", (0, 1, 2)),
    "cispo": ("token", "r", (1, 2)),
    "ppo": ("token", "r", (1, 2)),
    "gmpo": ("token", "G", (0, 1)),
    "ctpo": ("token", "prefix", (1, 2)),
    "m2po": ("token", "r", (0, 1, 2)),
    "topr": ("sequence", "P", (0, 1)),
    "opsm": ("sequence", "P", (1, 2)),
    "dppo-tv": ("token", "r", (0, 1, 2)),
    "dppo-kl": ("token", "r", (0, 1, 2)),
    "kpop": ("token", "r", (0, 1)),
    "aspo": ("token", "r", (0, 1, 2, 3, 4)),
    "cppo": ("token", "r", (0, 1, 2, 3, 4)),
}

#: Kinds whose weight depends on the sign of the sequence's advantage
#: (:mod:`variance_lab.corrections.sign`); their last parameter is the theory's P of a positive
#: sign (P(A >= 0) for ``topr``, ``opsm`` and ``aspo``, P(A > 0) for DPPO, which counts A = 0 negative).
SIGNED_KINDS = ("topr", "opsm", "aspo", "dppo-tv", "dppo-kl", "cppo")
#: Kinds that mask a token by its probabilities, not by its ratio alone
#: (:mod:`variance_lab.corrections.probmask`): they need the sampler's log-prob of each token.
PROB_KINDS = ("dppo-tv", "dppo-kl", "kpop", "cppo")
#: ``aspo``'s defaults :math:`(\varepsilon_l, \varepsilon_h, C)`: ASPO's clip widths and soft dual clip
#: (:data:`variance_lab.ratios.ASPO_EPS`, :data:`variance_lab.ratios.ASPO_DUAL_CLIP`).
ASPO_DEFAULT = (*ASPO_EPS, ASPO_DUAL_CLIP)
#: The default P(A >= 0) of the theory's sign model (``topr``, ``opsm:DELTA``).
SIGN_P_DEFAULT = 0.5

#: The defaults of ``gspo`` (GSPO's clip widths of s), ``gmpo`` (its log-space clip) and ``icepop``
#: (the band of the token ratio): the public names of :mod:`variance_lab.ratios.defaults`' values.
GSPO_DEFAULT = GSPO_EPS
GMPO_DEFAULT = GMPO_EPS
ICEPOP_DEFAULT = ICEPOP_BAND
#: The default threshold of ``m2po`` (M2PO's :math:`\tau`), :data:`variance_lab.ratios.M2PO_TAU`.
M2PO_DEFAULT = M2PO_TAU
#: The default thresholds of ``dppo-tv``, ``dppo-kl`` and ``kpop`` (:mod:`variance_lab.ratios.defaults`).
DPPO_TV_DEFAULT = DPPO_TV_DELTA
DPPO_KL_DEFAULT = DPPO_KL_DELTA
KPOP_DEFAULT = KPOP_DELTA
#: ``cppo``'s defaults :math:`(\delta, w_{\min}, \delta_b)`: CPPO's token-level Binary-TV threshold,
#: position-weight floor and prefix-budget floor (:data:`variance_lab.ratios.CPPO_DELTA`, ...).
CPPO_DEFAULT = (CPPO_DELTA, CPPO_W_MIN, CPPO_DELTA_B)
#: Sequences per batch over which ``m2po`` masks, when the spec does not say (``m2po:TAU:B``): the
#: toolkit's choice, not a framework's (a framework masks over whatever batch its loss sees).
M2PO_BATCH = 256


# --------------------------------------------------------------------------------------
# specs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Correction:
    r"""One correction: its kind (:data:`CORRECTION_KINDS`) and numeric parameters.

    Attributes
    ----------
    kind : str
    params : tuple of float
        As written in the spec (defaults filled in for ``gspo``, ``gmpo``, ``icepop``,
        ``m2po``, whose params are always ``(tau, batch)``, and the probability-aware kinds:
        ``dppo-tv``/``dppo-kl`` always ``(delta, p)``, ``kpop`` ``(delta,)``, ``cppo`` always
        ``(delta, w_min, delta_b, p)``; ``ctpo:E`` is
        ``(E, E)``; ``aspo``'s are always ``(EL, EH, C, P)``; ``topr``'s ``(P,)``, ``opsm``'s
        ``(DELTA, P)``).
    spec : str
        The spec string it was parsed from, as written.
    cut : float or None
        ``m2po`` only: the half-width :math:`\sqrt q` of the band of :math:`\log r` it keeps in
        the large-batch limit, once resolved against a ratio law
        (:func:`variance_lab.corrections.m2po.resolve_cut`); ``inf`` when nothing is masked.
    """

    kind: str
    params: tuple[float, ...]
    spec: str
    cut: float | None = None

    @property
    def level(self) -> str:
        """``"sequence"`` or ``"token"``: where the correction acts."""
        return CORRECTION_KINDS[self.kind][0]

    @property
    def base(self) -> str:
        """The uncorrected weight: ``"P"`` (P_T), ``"G"`` (G_T) or ``"r"`` (a token's ratio)."""
        return CORRECTION_KINDS[self.kind][1]

    @property
    def unit(self) -> str:
        """What one weight belongs to: ``"sequence"`` (incl. GMPO) or ``"token"``."""
        return "token" if self.base in ("r", "prefix") else "sequence"

    @property
    def signed(self) -> bool:
        """Whether the weight depends on the sign of the advantage (:data:`SIGNED_KINDS`)."""
        return self.kind in SIGNED_KINDS

    @property
    def prob(self) -> bool:
        """Whether the mask reads the token's probabilities, not its ratio alone (:data:`PROB_KINDS`)."""
        return self.kind in PROB_KINDS

    @property
    def p_positive(self) -> float:
        """Signed kinds: the theory's p of a positive sign, the last parameter (:data:`SIGNED_KINDS`)."""
        if not self.signed:
            raise ValueError(f"{self.spec!r} does not depend on the advantage's sign")
        return self.params[-1]

    @property
    def batch(self) -> int:
        """``m2po``: the sequences of one batch over which the mask is computed."""
        if self.kind != "m2po":
            raise ValueError(f"{self.spec!r} has no batch (only m2po masks over a batch)")
        return int(self.params[1])

    def log_bounds(self, T: int = 1) -> tuple[float, float]:
        r"""Return the interval of the base weight's log where ``w`` equals it unmodified.

        ``ctpo``: the bounds :math:`[-E_L\sqrt t, E_H\sqrt t]` of :math:`L_t` at position
        ``t = T``; ``m2po``: :math:`[-\sqrt q, \sqrt q]` once its :attr:`cut` is resolved.
        """
        p, k = self.params, self.kind
        if self.prob:
            raise ValueError(
                f"{self.spec!r} masks by the token's probabilities, not by a band of its ratio "
                "(variance_lab.corrections.probmask)"
            )
        if self.signed:
            raise ValueError(
                f"{self.spec!r}: the weight depends on the advantage's sign (variance_lab.corrections.sign)"
            )
        if k == "ctpo":
            root = math.sqrt(T)
            return -p[0] * root, p[1] * root
        if k == "m2po":
            if self.cut is None:
                raise ValueError(
                    f"{self.spec!r}: m2po's band depends on the law of log r; resolve its large-batch "
                    "cut first (variance_lab.corrections.resolve_cut)"
                )
            return -self.cut, self.cut
        if k in ("seq-tis", "tis"):
            return -_INF, math.log(p[0])
        if k == "seq-mask":
            lo, hi = (0.0, p[0]) if len(p) == 1 else p
            return (math.log(lo) if lo > 0 else -_INF), math.log(hi)
        if k == "geo-rs":
            return T * math.log(p[0]), T * math.log(p[1])
        if k == "icepop":
            return (-math.log(p[0]), math.log(p[0])) if len(p) == 1 else (math.log(p[0]), math.log(p[1]))
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
        averaged). Where no piece covers :math:`\log X`, :math:`w = 0` (masked). The pieces
        serve the closed forms, where a bound has probability 0; on data the ends follow
        :data:`variance_lab.corrections.weights.BOUND_RULE` (a value at a bound is kept).
        """
        a, b = self.log_bounds(T)
        if self.kind in ("seq-mask", "geo-rs", "icepop", "ctpo", "m2po"):
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
    if kind == "icepop" and not values:
        return ICEPOP_DEFAULT
    if kind == "ctpo":
        if min(values) <= 0:
            raise bad("the bounds EL, EH of the cumulative log-ratio must be > 0")
        return values if len(values) == 2 else (values[0], values[0])
    if kind == "cppo":
        return _check_cppo(values, bad)
    if kind in PROB_KINDS:
        default = {"dppo-tv": DPPO_TV_DEFAULT, "dppo-kl": DPPO_KL_DEFAULT, "kpop": KPOP_DEFAULT}[kind]
        delta = values[0] if values else default
        if not delta > 0 or (kind == "dppo-tv" and delta >= 1):
            what = "in (0, 1): a difference of probabilities" if kind == "dppo-tv" else "> 0"
            raise bad(f"the threshold DELTA must be {what}, got {delta!r}")
        if kind == "kpop":
            return (delta,)
        p = values[1] if len(values) > 1 else SIGN_P_DEFAULT
        if not 0.0 < p < 1.0:
            raise bad(f"the sign model's P = P(A > 0) must lie in (0, 1), got {p!r}")
        return delta, p
    if kind == "aspo":
        return _check_aspo(values, bad)
    if kind in SIGNED_KINDS:
        need = 1 if kind == "opsm" else 0
        p = values[need] if len(values) > need else SIGN_P_DEFAULT
        if not 0.0 < p < 1.0:
            raise bad(f"the sign model's P = P(A >= 0) must lie in (0, 1), got {p!r}")
        return (*values[:need], p)
    if kind == "m2po":
        tau, batch = (values + (M2PO_DEFAULT, float(M2PO_BATCH))[len(values) :])[:2]
        if tau <= 0:
            raise bad("the threshold TAU of the mean squared log-ratio must be > 0")
        if batch < 1 or batch != int(batch):
            raise bad("the batch B must be a whole number of sequences >= 1")
        return tau, batch
    if kind in ("seq-tis", "tis") and values[0] <= 0:
        raise bad("the cap C must be > 0")
    if kind == "seq-mask":
        if len(values) == 1 and values[0] <= 0:
            raise bad("the cap C must be > 0")
        if len(values) == 2 and not 0 <= values[0] < values[1]:
            raise bad("needs 0 <= LO < HI")
    if kind == "geo-rs" and not 0 < values[0] < values[1]:
        raise bad("needs 0 < LO < HI")
    if kind == "icepop" and len(values) == 1 and values[0] <= 1:
        raise bad("the band B must be > 1 (tokens outside [1/B, B] are masked)")
    if kind == "icepop" and len(values) == 2 and not 0 < values[0] < values[1]:
        raise bad("needs 0 < LO < HI (tokens outside [LO, HI] are masked)")
    if kind in ("gspo", "cispo", "ppo", "gmpo") and min(values) <= 0:
        raise bad("clip widths must be > 0")
    if kind in ("gspo", "ppo") and values[0] >= 1:
        raise bad("the lower clip width must be < 1 (the ratio is clipped below at 1 - EPS > 0)")
    if kind == "cispo" and len(values) == 2 and values[0] >= 1:
        raise bad("the lower clip width must be < 1")
    return values


def _check_aspo(values: tuple[float, ...], bad) -> tuple[float, float, float, float]:
    """``aspo[:E|:EL:EH[:C[:P]]]`` as ``(EL, EH, C, P)``, defaults from :data:`ASPO_DEFAULT`."""
    if len(values) == 1:
        values = (values[0], values[0])
    el, eh, c, p = (*values, *ASPO_DEFAULT[len(values) :], SIGN_P_DEFAULT)[:4]
    if not (0 < el < 1 and eh > 0):
        raise bad("the clip widths must satisfy 0 < EL < 1 and EH > 0")
    if c <= 1:
        raise bad(f"the dual clip C must be > 1, got {c!r}")
    if not 0.0 < p < 1.0:
        raise bad(f"the sign model's P = P(A >= 0) must lie in (0, 1), got {p!r}")
    return el, eh, c, p


def _check_cppo(values: tuple[float, ...], bad) -> tuple[float, float, float, float]:
    """``cppo[:D[:WMIN[:DB[:P]]]]`` as ``(D, WMIN, DB, P)``, defaults from :data:`CPPO_DEFAULT`.

    The ranges are UniRL's checks (``0 < w_min <= 1``, ``delta_b >= 0``) and a threshold ``D > 0``.
    """
    delta, w_min, delta_b, p = (*values, *CPPO_DEFAULT[len(values) :], SIGN_P_DEFAULT)[:4]
    if not delta > 0:
        raise bad(f"the threshold D of the weighted |pi - mu| must be > 0, got {delta!r}")
    if not 0.0 < w_min <= 1.0:
        raise bad(f"the position-weight floor WMIN must lie in (0, 1], got {w_min!r}")
    if not delta_b >= 0:
        raise bad(f"the prefix-budget floor DB must be >= 0, got {delta_b!r}")
    if not 0.0 < p < 1.0:
        raise bad(f"the sign model's P = P(A > 0) must lie in (0, 1), got {p!r}")
    return delta, w_min, delta_b, p


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
    if kind not in CORRECTION_KINDS:
        raise ValueError(f"unknown correction {spec!r}; kinds are {', '.join(CORRECTION_KINDS)}")
    allowed = CORRECTION_KINDS[kind][2]
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
