"""Sizes of the notebooks' computations, in one place: small for CI, full for a user.

Every notebook in ``notebooks/`` starts with ``S = sizes()`` and reads its grids, draws
and seeds from ``S`` only, so that one switch decides how much it computes:

* ``VARIANCE_LAB_QUICK=1`` (CI, ``make test``): :data:`QUICK`, seconds per notebook;
* unset or ``0``: :data:`FULL`, at most a few minutes per notebook on 2 cores.

Grids are written in the command line's grid syntax (:mod:`variance_lab.sweep.grid`), so
``variance-lab sweep --mu 0.8:1.2:21 ...`` reproduces a notebook's grid. Figures that
``variance-lab figures`` also draws take their parameters from
:func:`variance_lab.paper.catalog.default_params` with ``quick=S.quick``, not from here, so
that a notebook's figure and the command's figure are the same figure.

``VARIANCE_LAB_NOTEBOOK_OUT`` names a folder where notebooks may write files (tables,
figures, sweep stores); :func:`output_dir` returns it, or ``None`` (write nothing) when
it is unset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from variance_lab.sweep.grid import parse_grid

__all__ = ["FULL", "OUT_ENV", "QUICK", "QUICK_ENV", "Sizes", "is_quick", "output_dir", "sizes"]

QUICK_ENV = "VARIANCE_LAB_QUICK"
OUT_ENV = "VARIANCE_LAB_NOTEBOOK_OUT"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Sizes:
    """How much a notebook computes.

    Attributes
    ----------
    quick : bool
        The quick (CI) sizes; pass it on as ``default_params(name, quick=S.quick)``.
    n_table : int
        Monte Carlo draws of the comparison table (``variance-lab table``'s default
        10^6 in full mode).
    n_per_seed : int
        Monte Carlo draws per independent run, where a notebook repeats a run over seeds.
    seeds : tuple of int
        Root seeds of the repeated runs (one independent run each).
    T_mc : tuple of int
        Sequence lengths of the repeated Monte Carlo runs.
    T_line : tuple of int
        Dense grid of lengths for theory lines.
    mu : tuple of float
        Grid of mean ratios for the mu sweeps (straddling mu = 1).
    sigma2 : tuple of float
        Grid of ratio variances for the sigma^2 sweeps.
    T_sweep : tuple of int
        Sequence lengths of the mu x sigma^2 sweeps.
    panels_sigma2 : tuple of float
        Ratio variances of the static grid of panels (one column each).
    progress : bool or None
        ``progress=`` of :func:`variance_lab.simulate.simulate`: ``False`` in both modes, so
        that an executed notebook keeps no frozen progress widget in its output.
    """

    quick: bool
    n_table: int
    n_per_seed: int
    seeds: tuple[int, ...]
    T_mc: tuple[int, ...]
    T_line: tuple[int, ...]
    mu: tuple[float, ...]
    sigma2: tuple[float, ...]
    T_sweep: tuple[int, ...]
    panels_sigma2: tuple[float, ...]
    progress: bool | None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in parse_grid(text, integer=True))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in parse_grid(text))


QUICK = Sizes(
    quick=True,
    n_table=2_000,
    n_per_seed=2_000,
    seeds=(0, 1, 2, 3),
    T_mc=_ints("1,3,10,30,100,300,1000"),
    T_line=_ints("1:1000:log13"),
    mu=_floats("0.8:1.2:5"),
    sigma2=_floats("0.01:1:log5"),
    T_sweep=_ints("1,10,100,1000"),
    panels_sigma2=(0.01, 0.1),
    progress=False,
)

FULL = Sizes(
    quick=False,
    n_table=1_000_000,
    n_per_seed=100_000,
    seeds=tuple(range(12)),
    T_mc=_ints("1,2,3,5,7,10,15,20,30,50,70,100,150,200,300,500,700,1000"),
    T_line=_ints("1:1000:log61"),
    mu=_floats("0.8:1.2:21"),
    sigma2=_floats("0.01:1:log21"),
    T_sweep=_ints("1,10,100,1000"),
    panels_sigma2=(0.01, 0.1, 0.5),
    progress=False,
)


def is_quick(environ=None) -> bool:
    """Return True when ``VARIANCE_LAB_QUICK`` asks for quick sizes (``1``, ``true``, ``yes``, ``on``).

    Raises
    ------
    ValueError
        For any other value than those and ``0``, ``false``, ``no``, ``off`` or empty.
    """
    env = os.environ if environ is None else environ
    value = str(env.get(QUICK_ENV, "")).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{QUICK_ENV} must be 1 or 0 (or true/false), got {env.get(QUICK_ENV)!r}")


def sizes(quick: bool | None = None) -> Sizes:
    """Return the notebook sizes: :data:`QUICK` or :data:`FULL`.

    Parameters
    ----------
    quick : bool, optional
        Force one set; by default read ``VARIANCE_LAB_QUICK`` (:func:`is_quick`).
    """
    if quick is None:
        quick = is_quick()
    return QUICK if quick else FULL


def output_dir(environ=None) -> Path | None:
    """Return the folder named by ``VARIANCE_LAB_NOTEBOOK_OUT`` (created), or ``None`` when unset or empty."""
    env = os.environ if environ is None else environ
    value = env.get(OUT_ENV, "")
    if not value:
        return None
    path = Path(value).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
