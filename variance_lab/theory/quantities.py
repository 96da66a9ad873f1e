r"""Named theory quantities at the lengths T of one family: float64 first, mpmath where needed.

:func:`value` computes every point with the vectorised float64 path of
:mod:`variance_lab.theory.fast`; points whose error estimate is not within the tolerance
(1e-9 relative, 1e-9 absolute on log10 columns), and every point of a family without a
float path, are recomputed with the mpmath path of :mod:`variance_lab.theory.exact`.
``precise=True`` uses mpmath throughout.
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab._validate import check_n, check_T
from variance_lab.families import Family
from variance_lab.theory.exact import DEFAULT_TARGET, QUANTITIES, RENAMED_QUANTITIES, exact_value
from variance_lab.theory.fast import FAST_FAMILIES, Moments, moments, quantity

#: One function per name of :data:`QUANTITIES` (defined below), and the helpers.
__all__ = [
    "DEFAULT_TARGET",
    "QUANTITIES",
    "check_quantity",
    "check_target",
    "family_moments",
    "value",
    *QUANTITIES,
]


def check_target(target) -> float:
    """Validate a target relative error: a finite number > 0."""
    if isinstance(target, bool) or not (isinstance(target, int | float) and 0 < target < math.inf):
        raise ValueError(f"target must be a finite number > 0, got {target!r}")
    return float(target)


def check_quantity(name, choices=QUANTITIES) -> str:
    """Validate a quantity name: one of ``choices``; a renamed one says its new name.

    Parameters
    ----------
    name : str
        The name asked for.
    choices : collection of str
        The names accepted: :data:`QUANTITIES` by default.

    Returns
    -------
    str
        ``name``.

    Raises
    ------
    ValueError
        For a name of :data:`~variance_lab.theory.exact.RENAMED_QUANTITIES` (the message says
        ``'var_G_seed' was renamed 'var_G_naive'``) or any other name not in ``choices``.
    """
    if isinstance(name, str) and name in RENAMED_QUANTITIES:
        raise ValueError(f"{name!r} was renamed {RENAMED_QUANTITIES[name]!r}")
    if not isinstance(name, str) or name not in choices:
        raise ValueError(f"unknown quantity {name!r}; choose one of {', '.join(choices)}")
    return name


def family_moments(
    family: Family, T: np.ndarray, *, n: int = 2, target: float = DEFAULT_TARGET
) -> Moments | None:
    """Return the float path's :class:`~variance_lab.theory.fast.Moments`.

    Those of ``family`` at ``T`` (1-D), or None for a family without a float path.
    """
    if family.name not in FAST_FAMILIES:
        return None
    shape = {k: getattr(family, k) for k in FAST_FAMILIES[family.name][1]}
    return moments(family.name, family.mu, family.sigma2, T, shape, n=n, target=target)


def value(
    name: str,
    family: Family,
    T,
    *,
    log10: bool = False,
    n: int = 2,
    target: float = DEFAULT_TARGET,
    precise: bool = False,
):
    r"""Any quantity of :data:`QUANTITIES` at the lengths ``T``.

    Parameters
    ----------
    name : str
        One of :data:`QUANTITIES`.
    family : Family
        The ratio distribution.
    T : int or array_like of int
        Sequence lengths, integers >= 1.
    log10 : bool
        Return :math:`\log_{10}` of the absolute value instead (exact where the linear
        value over- or underflows float64).
    n : int
        Draws, for the ``rel_se_*`` quantities.
    target : float
        Target relative error, for the ``n_needed_*`` quantities.
    precise : bool
        Compute every point with mpmath (the reference path) instead of float64.

    Returns
    -------
    float or ndarray
        Same shape as ``T``. Kurtosis is NaN where the variance is 0; every other value
        is finite, ``inf`` or ``0.0``, never NaN.
    """
    check_quantity(name)
    if not isinstance(family, Family):
        raise ValueError(f"family must be a Family, got {family!r}")
    n = check_n(n)
    target = check_target(target)
    Ts = check_T(T)
    flat = Ts.ravel()
    m = None if precise else family_moments(family, flat, n=n, target=target)
    if m is None:
        out = np.array([exact_value(name, family, t, log10=log10, n=n, target=target) for t in flat])
    else:
        out = np.array(quantity(m, name, log10=log10), dtype=float).ravel()
        for i in np.flatnonzero(~m.ok):
            out[i] = exact_value(name, family, flat[i], log10=log10, n=n, target=target)
    out = out.reshape(Ts.shape)
    return float(out) if out.ndim == 0 else out


def _doc_fn(name: str, doc: str):
    def fn(family: Family, T, *, log10: bool = False, precise: bool = False):
        return value(name, family, T, log10=log10, precise=precise)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"{doc}\n\nParameters\n----------\nfamily : Family\nT : int or array_like of int\n"
        "log10 : bool\n    Return log10 of the absolute value instead.\n"
        "precise : bool\n    Use mpmath for every point.\n\n"
        "Returns\n-------\nfloat or ndarray, the shape of ``T``.\n"
    )
    return fn


var_P = _doc_fn("var_P", r"Exact :math:`\operatorname{Var}(P_T) = (\sigma^2+\mu^2)^T - \mu^{2T}`.")
mean_P = _doc_fn("mean_P", r"Exact :math:`E[P_T] = \mu^T`.")
var_G = _doc_fn(
    "var_G", r"Exact :math:`\operatorname{Var}(G_T) = e^{2TK(1/T)}\operatorname{expm1}(TK(2/T) - 2TK(1/T))`."
)
mean_G = _doc_fn(
    "mean_G", r"Exact :math:`E[G_T] = e^{T K(1/T)}`, which tends to :math:`e^{\mu_y}`, not :math:`\mu`."
)
bias_G = _doc_fn("bias_G", r"Bias :math:`E[G_T] - \mu \le 0` (``log10`` gives :math:`\log_{10}|\cdot|`).")
mse_G = _doc_fn(
    "mse_G", r"Mean squared error :math:`E[(G_T - \mu)^2] = \operatorname{Var}(G_T) + \text{bias}^2`."
)
var_G_lognormal = _doc_fn(
    "var_G_lognormal", r"The derivation's lognormal form :math:`(e^{\sigma_y^2/T}-1)e^{2\mu_y+\sigma_y^2/T}`."
)
var_G_delta = _doc_fn("var_G_delta", r"The derivation's small-x form :math:`\sigma_y^2 e^{2\mu_y}/T`.")
var_G_naive = _doc_fn("var_G_naive", r"The naive :math:`\sigma^2/T` of the derivation's table.")
var_ratio = _doc_fn(
    "var_ratio", r":math:`\operatorname{Var}(P_T)/\operatorname{Var}(G_T)` (NaN when both are 0)."
)
ess_frac_P = _doc_fn(
    "ess_frac_P",
    r"Kong's ESS fraction of the weights :math:`P_T`: :math:`e^{T(2K(1)-K(2))} = (1+\sigma^2/\mu^2)^{-T}`.",
)
kurtosis_P = _doc_fn("kurtosis_P", r":math:`m_4/v^2` of :math:`P_T` (NaN when :math:`\sigma^2 = 0`).")
kurtosis_G = _doc_fn("kurtosis_G", r":math:`m_4/v^2` of :math:`G_T` (NaN when :math:`\sigma^2 = 0`).")


def rel_se_var_P(family: Family, T, n: int, *, log10: bool = False, precise: bool = False):
    r"""Compute the relative standard error of the sample variance of ``n`` draws of :math:`P_T`.

    :math:`\sqrt{(\kappa - (n-3)/(n-1))/n}`, :math:`\kappa = m_4/v^2` (0 when
    :math:`\sigma^2 = 0`).
    """
    return value("rel_se_var_P", family, T, n=n, log10=log10, precise=precise)


def rel_se_var_G(family: Family, T, n: int, *, log10: bool = False, precise: bool = False):
    r"""Relative standard error of the sample variance of ``n`` draws of :math:`G_T`."""
    return value("rel_se_var_G", family, T, n=n, log10=log10, precise=precise)


def n_needed_P(
    family: Family, T, target: float = DEFAULT_TARGET, *, log10: bool = False, precise: bool = False
):
    r"""Compute the draws needed for a relative standard error ``target``.

    Those of the sample variance of :math:`P_T`: about :math:`(\kappa - 1)/\text{target}^2`;
    2 when :math:`\sigma^2 = 0`.
    """
    return value("n_needed_P", family, T, target=target, log10=log10, precise=precise)


def n_needed_G(
    family: Family, T, target: float = DEFAULT_TARGET, *, log10: bool = False, precise: bool = False
):
    r"""Draws for which the sample variance of :math:`G_T` has relative standard error ``target``."""
    return value("n_needed_G", family, T, target=target, log10=log10, precise=precise)
