r"""Float64 series and finite differences for the families' float parts and :mod:`variance_lab.theory.fast`.

The float theory path needs the finite differences :math:`\Delta^n C(0; s)`, :math:`n = 2, 3, 4`,
of a family's log-moment function. Each family gives them either as plain differences of
values (:func:`forward_diffs`) or from the Taylor series of :math:`C`
(:func:`series_diffs`, with the Stirling numbers of the second kind: the :math:`n`-th difference
of :math:`s^j` at 0 with step 1 is :math:`n!\,S(j, n)`), each with an error estimate, and keeps
the better of the two (:func:`pick`). Everything here is a pure function of arrays; nothing
depends on a family.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.stats.special import UNIT_ROUNDOFF as U

__all__ = [
    "FACTORIALS",
    "SERIES_TERMS",
    "forward_diffs",
    "p_side_from_moments",
    "pick",
    "series_diffs",
    "series_tail",
]

#: Terms of every Taylor series (coefficients ``coef[0..SERIES_TERMS]``).
SERIES_TERMS = 24


def _stirling2_table(J: int) -> np.ndarray:
    """``A[j, n] = n! S(j, n)``, j = 0..J, n = 0..4 (the n-th difference of s^j at 0, step 1)."""
    S = np.zeros((J + 1, 5))
    S[0, 0] = 1.0
    for j in range(1, J + 1):
        for n in range(1, 5):
            S[j, n] = n * S[j - 1, n] + S[j - 1, n - 1]
    return S * np.array([1.0, 1.0, 2.0, 6.0, 24.0])


_A = _stirling2_table(SERIES_TERMS)
FACTORIALS = np.array([float(math.factorial(j)) for j in range(SERIES_TERMS + 1)])


def series_diffs(coef: list, x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Return a Taylor sum and an estimate of its error.

    The sum is :math:`\sum_{j=n}^{J} c_j A_{jn} x^j`; ``coef[j]`` are Taylor coefficients in
    ``x`` (``coef[0]`` unused).
    """
    acc = np.zeros(np.broadcast(x, coef[-1]).shape)
    mag = np.zeros_like(acc)
    for j in range(SERIES_TERMS, n - 1, -1):
        a = coef[j] * _A[j, n]
        acc = acc * x + a
        mag = mag * np.abs(x) + np.abs(a)
    xn = x**n
    value = acc * xn
    last = np.abs(coef[SERIES_TERMS] * _A[SERIES_TERMS, n] * x**SERIES_TERMS)
    return value, 4 * last + 8 * U * mag * np.abs(xn)


def series_tail(coef: list, x: np.ndarray, n: int) -> np.ndarray:
    """Return four times the last four terms of :func:`series_diffs`' sum: a truncation estimate.

    It stays large where the series does not converge (a lone small last term is not enough).
    """
    return 4 * sum(np.abs(coef[j] * _A[j, n] * x**j) for j in range(SERIES_TERMS - 3, SERIES_TERMS + 1))


def forward_diffs(values: list, errors: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-th forward difference at 0 of a function with ``values[j] = f(j s)``, f(0) = 0."""
    out, err = 0.0, 0.0
    for j in range(1, n + 1):
        c = math.comb(n, j) * (-1) ** (n - j)
        out = out + c * values[j]
        err = err + abs(c) * (errors[j] + 2 * U * np.abs(values[j]))
    return out, err


def pick(a: tuple, b: tuple) -> tuple:
    """Return the (value, error) pair with the smaller error, elementwise."""
    use_a = a[1] <= b[1]
    return np.where(use_a, a[0], b[0]), np.where(use_a, a[1], b[1])


def p_side_from_moments(T, l2, l3, l4, el):
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
