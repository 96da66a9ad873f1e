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
from variance_lab.rollouts.pairwise import PairwiseSums
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
    plain = PairwiseSums([m])
    low = PairwiseSums([m], first_apart=True)
    hi_sum = 0.0
    for a, b in _chunks(m):
        chunk = h[a:b]
        plain.feed(0, chunk)
        if scale:
            hi = np.rint(chunk * scale) / scale
            hi_sum += float(np.sum(hi))  # exact in any order: multiples of 1/scale below 2^53/scale
            low.feed(0, chunk - hi)
    ybar = float(plain.total()[0] / m)
    mu = float((hi_sum + low.reduceat()[0]) / m) if scale else 0.0
    # (y - mu)^2: its sum, extremes, and those of z = y - mu
    second = PairwiseSums([m])
    lo2, hi2, zmax, zhi = math.inf, -math.inf, 0.0, -math.inf
    for a, b in _chunks(m):
        z = h[a:b] - mu
        dev2 = z * z
        second.feed(0, dev2)
        lo2, hi2 = min(lo2, float(dev2.min())), max(hi2, float(dev2.max()))
        zmax, zhi = max(zmax, float(np.max(np.abs(z)))), max(zhi, float(z.max()))
    s2 = float(second.total()[0])
    mean_dev2 = s2 / m
    direct_s = (
        EmpiricalCGF.needs_direct(np.asarray(s_values, dtype=np.float64), zmax) if zmax else np.zeros(0)
    )
    if np.any(direct_s <= 0):
        raise ValueError("set_moments computes L(s) for s > 0 only")
    tops = [float(s * zhi) for s in direct_s.tolist()]
    # squared deviations of dev2, the series' powers u^k, the direct L(s)
    third = PairwiseSums(np.full(1 + _SERIES_TERMS + direct_s.size, m))
    for a, b in _chunks(m):
        z = h[a:b] - mu
        dev2 = z * z
        third.feed(0, (dev2 - mean_dev2) * (dev2 - mean_dev2))
        if zmax:
            u = z / zmax
            power = u.copy()
            for k in range(1, _SERIES_TERMS + 1):
                third.feed(k, power)
                power *= u
        else:
            for k in range(1, _SERIES_TERMS + 1):
                third.feed(k, np.zeros(b - a))
        for j, (s, top) in enumerate(zip(direct_s.tolist(), tops, strict=True)):
            arg = s * z
            values = np.expm1(arg) if top <= 700.0 else np.exp(arg - top)
            third.feed(1 + _SERIES_TERMS + j, values)
    totals = third.total()
    coef = np.zeros(_SERIES_TERMS + 1)
    if zmax:
        fact = 1.0
        for k in range(1, _SERIES_TERMS + 1):
            fact *= k
            coef[k] = float(totals[k] / m) / fact
    direct = {}
    for j, (s, top) in enumerate(zip(direct_s.tolist(), tops, strict=True)):
        mean = float(totals[1 + _SERIES_TERMS + j] / m)
        direct[s] = math.log1p(mean) if top <= 700.0 else top + math.log(mean)
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
