"""Theory as data frames: the comparison table of one family, its tidy long form, and
:func:`grid`, the table over the Cartesian product of parameter arrays.

All three compute with the float64 path and recompute with mpmath only the points whose
error estimate is not within tolerance (see :mod:`variance_lab.theory.quantities`);
``precise=True`` uses mpmath throughout.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from variance_lab._validate import check_T
from variance_lab.families import FAMILIES, Family, get_family
from variance_lab.theory.exact import DEFAULT_TARGET, exact_value
from variance_lab.theory.fast import FAST_FAMILIES, Moments, moments, quantity
from variance_lab.theory.quantities import check_target, family_moments

__all__ = ["TABLE_COLUMNS", "TIDY_QUANTITIES", "summary", "tidy", "grid"]

#: Columns of the comparison table (csv/json names), in order.
TABLE_COLUMNS = (
    "T",
    "var_P",
    "log10_var_P",
    "var_G",
    "log10_var_G",
    "var_G_lognormal",
    "var_G_delta",
    "var_G_seed",
    "mean_G",
    "bias_G",
    "mse_G",
    "ratio",
    "ess_frac_P",
    "n_needed_P",
    "n_needed_G",
    "log10_ratio",
    "log10_n_needed_P",
    "log10_n_needed_G",
)

_COLUMN_SOURCE = {"ratio": "var_ratio"}

#: (statistic, method) of each theory quantity in the tidy schema (variance_lab.schema).
TIDY_QUANTITIES = {
    "mean_P": ("mean_P", "exact"),
    "var_P": ("var_P", "exact"),
    "mean_G": ("mean_G", "exact"),
    "var_G": ("var_G", "exact"),
    "bias_G": ("bias_G", "exact"),
    "mse_G": ("mse_G", "exact"),
    "var_G_lognormal": ("var_G", "lognormal"),
    "var_G_delta": ("var_G", "delta"),
    "var_G_seed": ("var_G", "seed"),
    "var_ratio": ("var_ratio", "exact"),
    "ess_frac_P": ("ess_frac_P", "exact"),
    "n_needed_P": ("n_needed_P", "exact"),
    "n_needed_G": ("n_needed_G", "exact"),
}


def _columns(m: Moments | None, families, T, names, target: float) -> tuple[dict, np.ndarray]:
    """``{(quantity, log10): values}`` over points (family ``families[i]`` at ``T[i]``), and
    the mask of points computed with mpmath. ``m`` holds the float path for all points (None:
    mpmath for all)."""
    size = len(T)
    precise = np.ones(size, dtype=bool) if m is None else ~np.broadcast_to(m.ok, (size,))
    out = {}
    for name in names:
        for log10 in (False, True):
            if m is None:
                col = np.empty(size)
            else:
                col = np.array(np.broadcast_to(quantity(m, name, log10=log10), (size,)), dtype=float)
            for i in np.flatnonzero(precise):
                col[i] = exact_value(name, families[i], T[i], log10=log10, target=target)
            out[name, log10] = col
    return out, precise


def _table(cols: dict, T) -> dict:
    table = {"T": T}
    for col in TABLE_COLUMNS[1:]:
        base = col.removeprefix("log10_")
        table[col] = cols[_COLUMN_SOURCE.get(base, base), col.startswith("log10_")]
    return table


def summary(family: Family, T, *, target: float = DEFAULT_TARGET, precise: bool = False) -> pd.DataFrame:
    """The exact comparison table: one row per T, columns :data:`TABLE_COLUMNS`.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
        Sequence lengths (kept in the given order).
    target : float
        Target relative error for the ``n_needed_*`` columns.
    precise : bool
        Compute every value with mpmath instead of float64.

    Returns
    -------
    pandas.DataFrame
    """
    if not isinstance(family, Family):
        raise ValueError(f"family must be a Family, got {family!r}")
    target = check_target(target)
    Ts = np.atleast_1d(check_T(T)).ravel()
    m = None if precise else family_moments(family, Ts, target=target)
    names = sorted(
        {_COLUMN_SOURCE.get(c.removeprefix("log10_"), c.removeprefix("log10_")) for c in TABLE_COLUMNS[1:]}
    )
    cols, _ = _columns(m, [family] * len(Ts), Ts, names, target)
    return pd.DataFrame(_table(cols, Ts))


def tidy(
    family: Family, T, *, target: float = DEFAULT_TARGET, quantities=None, precise: bool = False
) -> pd.DataFrame:
    """Theory in the tidy long schema (:mod:`variance_lab.schema`): one row per
    (T, statistic, method), exact values and the derivation's approximations.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    target : float
        Target relative error for the ``n_needed_*`` statistics.
    quantities : sequence of str, optional
        Only these quantities (names of :data:`TIDY_QUANTITIES`, e.g.
        ``["var_P", "var_G_seed"]``), in this order; all by default.
    precise : bool
        Compute every value with mpmath instead of float64.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.schema.TIDY_COLUMNS`.
    """
    from variance_lab.schema import TIDY_COLUMNS

    if not isinstance(family, Family):
        raise ValueError(f"family must be a Family, got {family!r}")
    target = check_target(target)
    Ts = np.atleast_1d(check_T(T)).ravel()
    names = list(TIDY_QUANTITIES) if quantities is None else list(quantities)
    unknown = [q for q in names if q not in TIDY_QUANTITIES]
    if unknown:
        raise ValueError(
            f"no tidy statistic for quantity {unknown[0]!r}; choose from {', '.join(TIDY_QUANTITIES)}"
        )
    m = None if precise else family_moments(family, Ts, target=target)
    cols, _ = _columns(m, [family] * len(Ts), Ts, names, target)
    k = len(Ts)
    out = pd.DataFrame(
        {
            "family": family.name,
            "mu": family.mu,
            "sigma2": family.sigma2,
            "T": np.tile(Ts, len(names)),
            "statistic": np.repeat([TIDY_QUANTITIES[q][0] for q in names], k),
            "method": np.repeat([TIDY_QUANTITIES[q][1] for q in names], k),
            "value": np.concatenate([cols[q, False] for q in names]) if names else np.empty(0),
            "log10_value": np.concatenate([cols[q, True] for q in names]) if names else np.empty(0),
            "lo": np.nan,
            "hi": np.nan,
            "se": np.nan,
            "reliable": True,
            "reason": "",
        }
    )
    return out[list(TIDY_COLUMNS)]


def _axis(name: str, values) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=object if np.ndim(values) == 0 else None)).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    return arr


def grid(
    family: str,
    *,
    mu,
    sigma2,
    T,
    target: float = DEFAULT_TARGET,
    precise: bool = False,
    **shape,
) -> pd.DataFrame:
    r"""The comparison table over the Cartesian product of parameter arrays, in float64.

    One row per (mu, sigma2, shape..., T), in that nesting order (T innermost), with every
    column of :func:`summary`. Values are computed in vectorised float64 and carry an error
    estimate; points where it is not within 1e-9 relative (1e-9 absolute on the log10
    columns) are recomputed with mpmath, and column ``precise`` says which.

    Parameters
    ----------
    family : str
        Family name (:data:`variance_lab.families.FAMILIES`).
    mu, sigma2 : float or array_like
        Means and variances of the per-token ratio.
    T : int or array_like of int
        Sequence lengths, integers >= 1.
    target : float
        Target relative error of the ``n_needed_*`` columns.
    precise : bool
        Compute every point with mpmath (slow: milliseconds per point).
    **shape : float or array_like
        The family's extra parameters (``q`` for two-point, ``rho`` for ar1), each an axis
        of the product; a family's default is used where one is not given.

    Returns
    -------
    pandas.DataFrame
        Columns ``family``, ``mu``, ``sigma2``, the shape parameters given, then
        :data:`TABLE_COLUMNS` and ``precise`` (True where mpmath computed the row).

    Raises
    ------
    ValueError
        For an unknown family or parameter, a bad value, or a point the family cannot
        reach (the family's message).

    Examples
    --------
    >>> from variance_lab import theory
    >>> df = theory.grid("lognormal", mu=[0.9, 1.0, 1.1], sigma2=np.logspace(-3, 1, 50), T=[10, 1000])
    >>> len(df)
    300
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    target = check_target(target)
    Ts = np.atleast_1d(check_T(T)).ravel()
    axes = {"mu": _axis("mu", mu), "sigma2": _axis("sigma2", sigma2)}
    axes.update({k: _axis(k, v) for k, v in shape.items()})
    combos = list(itertools.product(*axes.values()))
    fams = [get_family(family, c[0], c[1], **dict(zip(list(shape), c[2:], strict=True))) for c in combos]
    P, M = len(fams), len(Ts)
    m = None
    if not precise and family in FAST_FAMILIES:
        col = {k: np.array([getattr(f, k) for f in fams], dtype=float)[:, None] for k in ("mu", "sigma2")}
        extra = {
            k: np.array([getattr(f, k) for f in fams], dtype=float)[:, None] for k in FAST_FAMILIES[family][1]
        }
        m = moments(family, col["mu"], col["sigma2"], Ts[None, :].astype(float), extra, target=target)
        m.ok = np.broadcast_to(m.ok, (P, M)).ravel()
        for d in (m.ln, m.sign):
            for k in d:
                d[k] = np.broadcast_to(d[k], (P, M)).ravel()
    point_family = [f for f in fams for _ in range(M)]
    point_T = np.tile(Ts, P)
    names = sorted(
        {_COLUMN_SOURCE.get(c.removeprefix("log10_"), c.removeprefix("log10_")) for c in TABLE_COLUMNS[1:]}
    )
    cols, precise_rows = _columns(m, point_family, point_T, names, target)
    frame = {"family": family}
    for k in axes:
        frame[k] = np.repeat([getattr(f, k) for f in fams], M)
    frame.update(_table(cols, point_T))
    frame["precise"] = precise_rows
    return pd.DataFrame(frame)
