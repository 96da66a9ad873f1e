"""Theory as data frames.

The comparison table of one family, its tidy long form, and :func:`grid`, the table over the
Cartesian product of parameter arrays.

All three compute with the float64 path and recompute with mpmath only the points whose
error estimate is not within tolerance (see :mod:`variance_lab.theory.quantities`);
``precise=True`` uses mpmath throughout.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from variance_lab._validate import check_positive, check_T
from variance_lab.families import FAMILIES, Family, get_family
from variance_lab.families.base import check_sigma2
from variance_lab.theory.exact import DEFAULT_TARGET, exact_value
from variance_lab.theory.fast import FAST_FAMILIES, moments, quantity
from variance_lab.theory.quantities import check_quantity, check_target

__all__ = ["TABLE_COLUMNS", "TIDY_QUANTITIES", "grid", "summary", "tidy", "tidy_many"]

#: Columns of the comparison table (csv/json names), in order.
TABLE_COLUMNS = (
    "T",
    "var_P",
    "log10_var_P",
    "var_G",
    "log10_var_G",
    "var_G_lognormal",
    "var_G_delta",
    "var_G_naive",
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
_TABLE_QUANTITIES = sorted(
    {_COLUMN_SOURCE.get(c.removeprefix("log10_"), c.removeprefix("log10_")) for c in TABLE_COLUMNS[1:]}
)

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
    "var_G_naive": ("var_G", "naive"),
    "var_ratio": ("var_ratio", "exact"),
    "ess_frac_P": ("ess_frac_P", "exact"),
    "n_needed_P": ("n_needed_P", "exact"),
    "n_needed_G": ("n_needed_G", "exact"),
}


def _evaluate(families: list, Ts: np.ndarray, names, target: float, precise: bool) -> tuple[dict, np.ndarray]:
    """``{(quantity, log10): array (families, T)}`` and the mask of values computed with mpmath.

    Families of one name with a float path are computed in one vectorised call; points it
    cannot certify, and families without a float path, with mpmath.
    """
    F, M = len(families), len(Ts)
    out = {(q, lg): np.empty((F, M)) for q in names for lg in (False, True)}
    slow = np.ones((F, M), dtype=bool)
    groups: dict[str, list[int]] = {}
    for i, f in enumerate(families):
        groups.setdefault(f.name, []).append(i)
    for name, idx in groups.items():
        if precise or name not in FAST_FAMILIES:
            continue
        fam = [families[i] for i in idx]
        params = {k: np.array([getattr(f, k) for f in fam], dtype=float)[:, None] for k in ("mu", "sigma2")}
        shape = FAMILIES[name].stack_parameters(fam)  # mixtures: (families, 1, J, 3), padded
        m = moments(name, params["mu"], params["sigma2"], Ts[None, :].astype(float), shape, target=target)
        slow[idx] = ~np.broadcast_to(m.ok, (len(idx), M))
        for q, lg in out:
            out[q, lg][idx] = np.broadcast_to(quantity(m, q, log10=lg), (len(idx), M))
    for i, j in zip(*np.nonzero(slow), strict=True):
        for q, lg in out:
            out[q, lg][i, j] = exact_value(q, families[i], Ts[j], log10=lg, target=target)
    return out, slow


def _table(cols: dict, T) -> dict:
    table = {"T": T}
    for col in TABLE_COLUMNS[1:]:
        base = col.removeprefix("log10_")
        table[col] = cols[_COLUMN_SOURCE.get(base, base), col.startswith("log10_")]
    return table


def summary(family: Family, T, *, target: float = DEFAULT_TARGET, precise: bool = False) -> pd.DataFrame:
    """Compute the exact comparison table: one row per T, columns :data:`TABLE_COLUMNS`.

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
    cols, _ = _evaluate([family], Ts, _TABLE_QUANTITIES, target, precise)
    return pd.DataFrame(_table({k: v[0] for k, v in cols.items()}, Ts))


def tidy(
    family: Family, T, *, target: float = DEFAULT_TARGET, quantities=None, precise: bool = False
) -> pd.DataFrame:
    """Compute theory in the tidy long schema (:mod:`variance_lab.schema`).

    One row per (T, statistic, method), exact values and the derivation's approximations.

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    target : float
        Target relative error for the ``n_needed_*`` statistics.
    quantities : sequence of str, optional
        Only these quantities (names of :data:`TIDY_QUANTITIES`, e.g.
        ``["var_P", "var_G_naive"]``), in this order; all by default.
    precise : bool
        Compute every value with mpmath instead of float64.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.schema.TIDY_COLUMNS`.
    """
    return tidy_many([family], T, target=target, quantities=quantities, precise=precise)


def tidy_many(
    families, T, *, target: float = DEFAULT_TARGET, quantities=None, precise: bool = False
) -> pd.DataFrame:
    """:func:`tidy` of several families at once, concatenated in their order.

    The same rows as ``pd.concat([tidy(f, T, ...) for f in families])`` with a fresh index,
    computed in one vectorised call per family name: the theory cells of a sweep and the
    heat maps of the figures use it.

    Parameters
    ----------
    families : sequence of Family
    T, target, quantities, precise
        As in :func:`tidy`.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`variance_lab.schema.TIDY_COLUMNS`.
    """
    from variance_lab.schema import TIDY_COLUMNS

    families = list(families)
    if not families:
        raise ValueError("families must not be empty")
    for family in families:
        if not isinstance(family, Family):
            raise ValueError(f"family must be a Family, got {family!r}")
    target = check_target(target)
    Ts = np.atleast_1d(check_T(T)).ravel()
    names = list(TIDY_QUANTITIES) if quantities is None else list(quantities)
    for q in names:
        check_quantity(q, TIDY_QUANTITIES)
    cols, _ = _evaluate(families, Ts, names, target, precise)
    F, Q, M = len(families), len(names), len(Ts)

    def stack(log10: bool) -> np.ndarray:  # (family, quantity, T), raveled
        if not names:
            return np.empty(0)
        return np.stack([cols[q, log10] for q in names], axis=1).ravel()

    per_family = Q * M
    out = pd.DataFrame(
        {
            "family": np.repeat([f.name for f in families], per_family),
            "mu": np.repeat([f.mu for f in families], per_family),
            "sigma2": np.repeat([f.sigma2 for f in families], per_family),
            "T": np.tile(Ts, F * Q),
            "statistic": np.tile(np.repeat([TIDY_QUANTITIES[q][0] for q in names], M), F),
            "method": np.tile(np.repeat([TIDY_QUANTITIES[q][1] for q in names], M), F),
            "value": stack(False),
            "log10_value": stack(True),
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
    mu=None,
    sigma2=None,
    T,
    target: float = DEFAULT_TARGET,
    precise: bool = False,
    skip_unreachable: bool = False,
    **shape,
) -> pd.DataFrame:
    r"""Compute the comparison table over the Cartesian product of parameter arrays, in float64.

    One row per (mu, sigma2, shape..., T), in that nesting order (T innermost), with every
    column of :func:`summary`. Values are computed in vectorised float64 and carry an error
    estimate; points where it is not within 1e-9 relative (1e-9 absolute on the log10
    columns) are recomputed with mpmath, and column ``precise`` says which.

    Parameters
    ----------
    family : str
        Family name (:data:`variance_lab.families.FAMILIES`).
    mu, sigma2 : float or array_like
        Means and variances of the per-token ratio. Unset for ``lognormal-mixture``, which
        derives both from its components (the ``mu`` and ``sigma2`` columns then hold them).
    T : int or array_like of int
        Sequence lengths, integers >= 1.
    target : float
        Target relative error of the ``n_needed_*`` columns.
    precise : bool
        Compute every point with mpmath (slow: milliseconds per point).
    skip_unreachable : bool
        Leave out the parameter points the family cannot reach (two-point with
        ``sigma2 >= mu**2 q / (1 - q)``) instead of raising.
    **shape : float or array_like
        The family's extra parameters (``q`` for two-point, ``rho`` for ar1, ``alpha`` for
        random-scale), each an axis of the product; a family's default is used where one is
        not given. ``components`` of ``lognormal-mixture`` is one mixture (``"w:m:v,..."`` or a
        sequence of triples) or a list of them; the float path computes them all in one
        vectorised call (components padded with weight 0).

    Returns
    -------
    pandas.DataFrame
        Columns ``family``, ``mu``, ``sigma2``, the shape parameters given, then
        :data:`TABLE_COLUMNS` and ``precise`` (True where mpmath computed the row).

    Raises
    ------
    ValueError
        For an unknown family or parameter, a bad value, or a point the family cannot
        reach (the family's message) unless ``skip_unreachable``, or when no point is left.

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
    if FAMILIES[family].derived_moments:
        return _grid_derived(family, Ts, target, precise, mu, sigma2, shape)
    if mu is None or sigma2 is None:
        raise ValueError(f"grid of the {family} family needs mu and sigma2")
    axes = {"mu": _axis("mu", mu), "sigma2": _axis("sigma2", sigma2)}
    axes.update({k: _axis(k, v) for k, v in shape.items()})
    combos = list(itertools.product(*axes.values()))
    # bad input is always an error; only a point the family cannot reach may be skipped
    for m in axes["mu"]:
        check_positive("mu", m)
    for s2 in axes["sigma2"]:
        check_sigma2(s2)
    for k in shape:
        for v in axes[k]:
            get_family(family, 1.0, 0.0, **{k: v})  # sigma2 = 0 is reachable for every family
    fams, first_error = [], None
    for c in combos:
        try:
            fams.append(get_family(family, c[0], c[1], **dict(zip(list(shape), c[2:], strict=True))))
        except ValueError as exc:
            if not skip_unreachable:
                raise
            first_error = first_error or exc
    if not fams:
        raise ValueError(f"no reachable point in the grid: {first_error}")
    cols, slow = _evaluate(fams, Ts, _TABLE_QUANTITIES, target, precise)
    M = len(Ts)
    frame = {"family": family}
    for k in axes:
        frame[k] = np.repeat([getattr(f, k) for f in fams], M)
    frame.update(_table({k: v.ravel() for k, v in cols.items()}, np.tile(Ts, len(fams))))
    frame["precise"] = slow.ravel()
    return pd.DataFrame(frame)


def _text_axis(name: str, values) -> list:
    """Return a text parameter's values: one spec (a string, or number triples) or a list of them."""
    if isinstance(values, str):
        return [values]
    values = list(values)
    if values and all(
        isinstance(c, list | tuple) and all(isinstance(x, int | float) for x in c) for c in values
    ):
        return [tuple(values)]  # one mixture given as triples
    if not values:
        raise ValueError(f"{name} must not be empty")
    return values


def _grid_derived(family: str, Ts, target, precise, mu, sigma2, shape) -> pd.DataFrame:
    """:func:`grid` of a family whose mu and sigma2 follow from its parameters (a mixture).

    One family per point of the product of the parameter axes; the float path computes them in
    one call (mixtures padded to the same number of components).
    """
    if mu is not None or sigma2 is not None:
        raise ValueError(f"{family} derives mu and sigma2 from its parameters: leave mu and sigma2 unset")
    text = FAMILIES[family].text_parameters
    axes = {k: _text_axis(k, v) if k in text else _axis(k, v) for k, v in shape.items()}
    fams = [get_family(family, **dict(zip(axes, c, strict=True))) for c in itertools.product(*axes.values())]
    cols, slow = _evaluate(fams, Ts, _TABLE_QUANTITIES, target, precise)
    M = len(Ts)
    frame = {"family": family}
    for k in ("mu", "sigma2", *axes):
        frame[k] = np.repeat([f.describe()[k] for f in fams], M)
    frame.update(_table({k: v.ravel() for k, v in cols.items()}, np.tile(Ts, len(fams))))
    frame["precise"] = slow.ravel()
    return pd.DataFrame(frame)
