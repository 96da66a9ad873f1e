r"""Pooled statistics of a set's token log-ratios held in one array, with no temporary of its size.

The pooled fit (:class:`~variance_lab.rollouts.statistics.LogRatioFit`), the autocorrelation and
the empirical CGF of :func:`~variance_lab.rollouts.analysis.analyze` are whole-array reductions:
NumPy's pairwise sums of :math:`y`, of :math:`(y - \mu)^2`, of their squared deviations, of the
powers :math:`u^k` of the CGF's series, and BLAS's dot product of the centred series. The streaming
analysis (:mod:`variance_lab.rollouts.summaries`) holds a set's :math:`y` in one float64 array
(8 bytes a token, the only memory that grows with the file) and computes them here:

- :func:`set_moments`: every pairwise sum, a chunk of :data:`CHUNK` values at a time through
  :class:`~variance_lab.rollouts.pairwise.PairwiseSums`, each the sum NumPy forms of the whole
  array, bit for bit (values that need ``expm1`` are NumPy's, on the chunk);
- :func:`pooled_fit`: the autocorrelations of :math:`y` and of :math:`(y - \mu)^2`
  (:func:`~variance_lab.rollouts.statistics.centred_autocorrelation`), each centred in place in
  the array, which a ``reload`` then fills with :math:`y` again, and the fit
  (:func:`~variance_lab.rollouts.statistics.fit_with_autocorrelation`'s numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from variance_lab.ratios import segment_split_scale
from variance_lab.rollouts.cgf import EmpiricalCGF
from variance_lab.rollouts.pairwise import PairwiseSums, tree_sums
from variance_lab.rollouts.statistics import (
    MIN_AUTOCORRELATION_PAIRS,
    Autocorrelation,
    LogRatioFit,
    TokenLayout,
    acf_or_reason,
    centred_autocorrelation,
)

__all__ = ["CHUNK", "SetMoments", "needs_reload", "pooled_fit", "set_moments", "y_autocorrelation"]

#: Values a chunk of the element-wise work (about 0.5 MB of float64).
CHUNK = 1 << 16
_SERIES_TERMS = 40  # EmpiricalCGF's series: coefficients c_1 .. c_40


def _chunks(m: int):
    for a in range(0, m, CHUNK):
        yield a, min(m, a + CHUNK)


@dataclass(frozen=True)
class SetMoments:
    r"""The pairwise sums of one set's log-ratios :math:`y` (:func:`set_moments`), as NumPy forms them.

    ``ybar`` is ``y.mean()``, ``mu`` the exact-split mean of
    :func:`~variance_lab.ratios.segment_sums` (the fit's and the CGF's), ``sigma2`` and
    ``mean_dev2`` the sum of :math:`(y - \mu)^2` over :math:`n - 1` and :math:`n`, ``var_dev2``
    ``np.var`` of those; ``dev2_constant`` whether every one of those is the same;
    ``zmax`` and ``zhi`` :math:`\max|y - \mu|` and :math:`\max(y - \mu)`; ``coef`` and ``direct``
    the CGF's series coefficients and its :math:`L(s)` where the series does not serve.
    """

    n: int
    ybar: float
    mu: float
    sigma2: float
    mean_dev2: float
    var_dev2: float
    dev2_constant: bool
    zmax: float
    zhi: float
    coef: np.ndarray
    direct: dict

    def cgf(self, values=None) -> EmpiricalCGF:
        """Return the empirical CGF of the set (:meth:`~variance_lab.rollouts.cgf.EmpiricalCGF.from_sums`)."""
        return EmpiricalCGF.from_sums(self.n, self.mu, self.zmax, self.coef, self.direct, values)


def set_moments(h: np.ndarray, max_abs: float, s_values=()) -> SetMoments:
    r"""Return the pairwise sums of the log-ratios ``h`` (:class:`SetMoments`), in three passes over it.

    Parameters
    ----------
    h : ndarray of float64
        The set's :math:`y`, at least two values; read, not changed.
    max_abs : float
        :math:`\max|y|` (from the sources' maxima), the scale of the exact-split mean.
    s_values : array_like of float
        Where the CGF's :math:`L(s)` will be asked: those the series does not serve are computed
        (``direct``).

    Returns
    -------
    SetMoments
    """
    m = h.size
    scale = 0.0 if max_abs == 0.0 else segment_split_scale(max_abs, m)
    ybar = float(np.add.reduce(h) / m)  # y.mean()
    mu = 0.0
    if (
        scale
    ):  # segment_sums of one segment: high parts' exact sum + (first low part + pairwise sum of the rest)
        hi0 = float(np.rint(h[0] * scale) / scale)
        lows, hi_rest = tree_sums(h[1:], 1, scale=scale)
        mu = float(((hi0 + hi_rest) + ((h[0] - hi0) + lows[0])) / m)
    dev2 = tree_sums(h, 2, mu=mu)[0]
    s2, lo2, hi2 = float(0.0 + dev2[0]), float(dev2[1]), float(dev2[2])  # dev2.sum(), min, max
    z_lo, z_hi = float(np.min(h)) - mu, float(np.max(h)) - mu  # min and max of y - mu: rounding is monotone
    zmax, zhi = max(abs(z_lo), abs(z_hi)), z_hi
    mean_dev2 = s2 / m
    terms = _SERIES_TERMS if zmax else 0
    totals = 0.0 + tree_sums(h, 3, mu=mu, zmax=zmax if zmax else 1.0, mean_dev2=mean_dev2, terms=terms)[0]
    coef = np.zeros(_SERIES_TERMS + 1)
    if zmax:
        fact = 1.0
        for k in range(1, _SERIES_TERMS + 1):
            fact *= k
            coef[k] = float(totals[k] / m) / fact
    direct = _direct_values(h, mu, zmax, zhi, s_values)
    return SetMoments(
        n=m,
        ybar=ybar,
        mu=mu,
        sigma2=float(s2 / (m - 1)),
        mean_dev2=mean_dev2,
        var_dev2=float(totals[0] / m),
        dev2_constant=lo2 == hi2,
        zmax=zmax,
        zhi=zhi,
        coef=coef,
        direct=direct,
    )


def y_autocorrelation(
    h: np.ndarray,
    layout: TokenLayout,
    moments: SetMoments,
    *,
    c: float,
    min_pairs: int = MIN_AUTOCORRELATION_PAIRS,
) -> tuple[Autocorrelation | None, str]:
    """Return the autocorrelation of the set whose :math:`y` is ``h``, or (None, why it is undefined).

    ``h`` is centred in place (``y - y.mean()``): it holds :math:`y` no more.
    """
    np.subtract(h, moments.ybar, out=h)
    return acf_or_reason(lambda: centred_autocorrelation(h, layout, c), min_pairs)


def needs_reload(layout: TokenLayout, moments: SetMoments) -> bool:
    r"""Whether :func:`pooled_fit` needs :math:`y` again (for the autocorrelation of :math:`(y - \mu)^2`)."""
    return not (int(layout.spans.max()) < 2 or moments.dev2_constant)


def _direct_values(h: np.ndarray, mu: float, zmax: float, zhi: float, s_values) -> dict:
    """Return the CGF's :math:`L(s)` where its series does not serve, as ``EmpiricalCGF`` computes it."""
    if not zmax:
        return {}
    direct_s = EmpiricalCGF.needs_direct(np.asarray(s_values, dtype=np.float64), zmax)
    if np.any(direct_s <= 0):
        raise ValueError("set_moments computes L(s) for s > 0 only")
    out = {}
    for s in direct_s.tolist():
        top = float(s * zhi)  # max(s z) = s max(z) for s > 0: rounding is monotone
        sums = PairwiseSums([h.size])
        for a, b in _chunks(h.size):
            arg = s * (h[a:b] - mu)
            sums.feed(0, np.expm1(arg) if top <= 700.0 else np.exp(arg - top))
        mean = float(sums.total()[0] / h.size)
        out[s] = math.log1p(mean) if top <= 700.0 else top + math.log(mean)
    return out


def pooled_fit(
    h: np.ndarray,
    layout: TokenLayout,
    moments: SetMoments,
    acf: Autocorrelation | None,
    *,
    c: float,
    y_constant: bool,
    min_pairs: int = MIN_AUTOCORRELATION_PAIRS,
) -> LogRatioFit:
    r"""Return :func:`~variance_lab.rollouts.statistics.fit_log_ratios` of the set whose :math:`y` is ``h``.

    ``acf`` is the set's :func:`y_autocorrelation`; ``h`` holds :math:`y` again where
    :func:`needs_reload` says so, and is left holding :math:`(y - \mu)^2` centred (whose
    autocorrelation enters the standard error of :math:`\hat\sigma^2_y`). ``y_constant``: every
    value of :math:`y` is the same.
    """
    n = h.size
    short = int(layout.spans.max()) < 2
    tau_y = 1.0 if short or y_constant else (1.0 if acf is None else max(acf.tau_int, 0.0))
    tau_sq = 1.0
    if needs_reload(layout, moments):
        np.subtract(h, moments.mu, out=h)
        np.square(h, out=h)
        np.subtract(h, moments.mean_dev2, out=h)
        acf_sq = acf_or_reason(lambda: centred_autocorrelation(h, layout, c), min_pairs)[0]
        tau_sq = 1.0 if acf_sq is None else max(acf_sq.tau_int, 0.0)
    sigma2 = moments.sigma2
    return LogRatioFit(
        n_tokens=n,
        mu_y=moments.mu,
        sigma2_y=sigma2,
        se_mu_y=math.sqrt(sigma2 * tau_y / n),
        se_sigma2_y=math.sqrt(moments.var_dev2 * tau_sq / n),
        tau_y=tau_y,
        tau_sq=tau_sq,
    )
