r"""Moments on arrays: central moments from power sums, sample variances of values given by their logs.

Nothing here knows about families, theory or the engine; every function takes plain numbers or
arrays.
"""

from __future__ import annotations

import numpy as np

__all__ = ["central_moments", "exp_quiet", "log_sample_var", "scaled_exp"]


def exp_quiet(x):
    """``exp(x)`` that returns ``inf`` or ``0`` beyond the float64 range instead of warning."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x)


def scaled_exp(log_x) -> tuple[float, np.ndarray]:
    r"""Return :math:`(c, w)` with :math:`c = \max a` and :math:`w = e^{a - c} \le 1`, ``a = log_x``.

    The sample variance of :math:`x = e^{a}` is :math:`e^{2c}` times that of :math:`w`, and no
    :math:`w` overflows for any :math:`a` (e.g. :math:`\log P_T = 5\cdot 10^6`).
    """
    a = np.asarray(log_x, dtype=np.float64)
    c = float(np.max(a))
    return c, np.exp(a - c)


def log_sample_var(log_x) -> float:
    r"""Natural log of the unbiased sample variance of :math:`x = e^{a}`, from the :math:`a = \log x`.

    With :math:`c = \max a` and :math:`w = e^{a - c} \le 1` (:func:`scaled_exp`),
    :math:`\widehat{\operatorname{Var}}(x) = e^{2c}\,\widehat{\operatorname{Var}}(w)`, so
    nothing overflows for any :math:`a` (e.g. :math:`\log P = 5\cdot 10^6`).

    Parameters
    ----------
    log_x : array_like of float
        At least two finite values.

    Returns
    -------
    float
        ``-inf`` when the sample variance is 0.
    """
    a = np.asarray(log_x, dtype=np.float64)
    if a.ndim != 1 or a.size < 2 or not np.all(np.isfinite(a)):
        raise ValueError("log_sample_var needs at least two finite values")
    c, w = scaled_exp(a)
    with np.errstate(divide="ignore"):
        return float(2 * c + np.log(np.var(w, ddof=1)))


def central_moments(sums, n):
    r"""Mean deviation and biased central moments from power sums about a reference.

    With :math:`a_k = S_k / n`, :math:`S_k = \sum_i d_i^k` the power sums of the
    deviations :math:`d_i = x_i - c` from a fixed reference :math:`c`:

    .. math::

        \bar d = a_1, \quad m_2 = a_2 - \bar d^2, \quad
        m_3 = a_3 - 3\bar d a_2 + 2\bar d^3, \quad
        m_4 = a_4 - 4\bar d a_3 + 6\bar d^2 a_2 - 3\bar d^4.

    Accurate when :math:`|c - \bar x|` is at most a few standard deviations.
    :math:`m_2` and :math:`m_4` are clipped at 0 against rounding.

    Parameters
    ----------
    sums : array_like, shape (..., 4)
        :math:`S_1 .. S_4`.
    n : int
        Number of values, >= 1.

    Returns
    -------
    (dbar, m2, m3, m4) : tuple of ndarray, each of shape ``sums.shape[:-1]``
    """
    a = np.asarray(sums, dtype=float) / n
    a1, a2, a3, a4 = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    d2 = a1 * a1
    m2 = np.maximum(a2 - d2, 0.0)
    m3 = a3 - 3.0 * a1 * a2 + 2.0 * d2 * a1
    m4 = np.maximum(a4 - 4.0 * a1 * a3 + 6.0 * d2 * a2 - 3.0 * d2 * d2, 0.0)
    return a1, m2, m3, m4
