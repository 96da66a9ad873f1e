"""Sweep plans: cells (the unit of work, storage and resumption), their identities, and the grid of a sweep.

See :mod:`variance_lab.sweep` for what a cell is and what its identity covers.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from variance_lab import __version__, theory
from variance_lab._validate import check_finite, check_positive, check_seed, check_T
from variance_lab.families import FAMILIES, Family, get_family
from variance_lab.families.base import check_sigma2
from variance_lab.schema import check_sampler

__all__ = ["RESULT_SOURCES", "SCHEMA_VERSION", "Cell", "Plan", "code_fingerprint", "extra_parameters", "plan"]


#: Version of the store layout; part of every cell identity.
SCHEMA_VERSION = 1


# --------------------------------------------------------------------------- cells
#: Source files whose code determines a cell's numbers, per kind (relative to the package).
RESULT_SOURCES = {
    "theory": ("families", "theory", "stats", "_validate.py", "schema.py"),
    "monte_carlo": (
        "families",
        "theory",
        "_validate.py",
        "schema.py",
        "stats",
        "simulate",
    ),
}


@functools.cache
def code_fingerprint(kind: str) -> str:
    """SHA-256 of the source files that compute a cell of this kind (:data:`RESULT_SOURCES`).

    Part of every cell identity, beside the package version: in a development tree the
    version does not change when the code does, and a store must not reuse numbers that
    older code computed. Read once per process.
    """
    root = Path(__file__).resolve().parents[1]  # the package
    digest = hashlib.sha256()
    for name in RESULT_SOURCES[kind]:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Cell:
    """One unit of work: theory or Monte Carlo for one family over one T grid.

    Parameters
    ----------
    kind : {"theory", "monte_carlo"}
    family : Family
    T : tuple of int
        The sorted T grid.
    n : int
        Draws (0 for theory).
    seed : int or None
        Root seed (None for theory, whose result does not depend on it).
    options : tuple of (str, value)
        Other settings that determine the result (``target``; ``ci``, ``independent``).
    """

    kind: str
    family: Family
    T: tuple[int, ...]
    n: int = 0
    seed: int | None = None
    options: tuple = ()

    def key(self) -> dict:
        """Everything that determines the cell's result, as a plain dict."""
        return {
            "kind": self.kind,
            "family": self.family.describe(),
            "T": list(self.T),
            "n": self.n,
            "seed": self.seed,
            **dict(self.options),
            "schema": SCHEMA_VERSION,
            "version": __version__,
            "code": code_fingerprint(self.kind),
        }

    def key_json(self) -> str:
        """Canonical JSON of :meth:`key`: sorted keys, no spaces, no NaN."""
        return json.dumps(self.key(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @property
    def id(self) -> str:
        """SHA-256 (hex) of :meth:`key_json`."""
        return hashlib.sha256(self.key_json().encode()).hexdigest()

    def family_params(self) -> str:
        """Canonical JSON of the family's extra parameters (``{"q":0.5}``; ``{}`` when none)."""
        extra = {k: v for k, v in self.family.describe().items() if k not in ("family", "mu", "sigma2")}
        return json.dumps(extra, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        """Short human-readable description."""
        fam = self.family
        extra = "".join(
            f" {k}={v:g}" if isinstance(v, float) else f" {k}={v}"
            for k, v in json.loads(self.family_params()).items()
        )
        mc = f" n={self.n} seed={self.seed}" if self.kind == "monte_carlo" else ""
        return f"{self.kind} {fam.name} mu={fam.mu:g} sigma2={fam.sigma2:g}{extra}{mc}"


@dataclass
class Plan:
    """The cells of a sweep grid and the points no family can reach.

    Attributes
    ----------
    cells : list of Cell
    unreachable : list of dict
        ``{"family", "mu", "sigma2", "reason"}`` per unreachable point.
    """

    cells: list[Cell]
    unreachable: list[dict]


def _as_list(values, name: str) -> list:
    if isinstance(values, str) or np.ndim(values) == 0:
        values = [values]
    out = list(np.asarray(values).ravel().tolist())
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


def _check_ns(n) -> list[int]:
    out = []
    for v in _as_list(n, "n"):
        if isinstance(v, bool) or not float(v).is_integer() or v < 0 or v == 1:
            raise ValueError(f"n must be 0 (theory only) or an integer >= 2, got {v!r}")
        out.append(int(v))
    return sorted(set(out))


def _check_unit_interval(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def extra_parameters(name: str) -> tuple[str, ...]:
    """Names of a family's parameters besides ``mu`` and ``sigma2`` (``q``, ``rho``, ...)."""
    return FAMILIES[name].extra_parameters()


def _check_extra(family: str, key: str, value):
    """Return a numeric extra parameter as a float; a text one (a mixture's components) in canonical form."""
    if key in FAMILIES[family].text_parameters:
        return get_family(family, **{key: value}).describe()[key]
    return check_finite(key, value)


def _extra_grids(names: list[str], params: Mapping[str, object] | None) -> dict[str, list[dict]]:
    """Per family, the list of extra-parameter dicts to sweep (``[{}]`` when none applies)."""
    params = dict(params or {})
    used = set()
    out = {}
    for name in names:
        keys = sorted(k for k in params if k in extra_parameters(name))
        used.update(keys)
        values = [sorted({_check_extra(name, k, v) for v in _as_list(params[k], k)}) for k in keys]
        out[name] = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    unused = sorted(set(params) - used)
    if unused:
        raise ValueError(f"parameter {unused[0]!r} applies to none of the families {', '.join(names)}")
    return out


def plan(
    families: str | Sequence[str] = "lognormal",
    mu=1.0,
    sigma2=0.1,
    T=(1, 10, 100, 1000),
    n=0,
    *,
    seed: int = 0,
    independent: bool = False,
    ci: float = 0.95,
    target: float = theory.DEFAULT_TARGET,
    params: Mapping[str, object] | None = None,
    sampler: str = "token",
) -> Plan:
    """Expand a grid into cells, validating every input.

    Parameters
    ----------
    families : str or sequence of str
        Family names (:data:`variance_lab.families.FAMILIES`).
    mu, sigma2 : float or sequence of float
        Means and variances of the per-token ratio.
    T : int or sequence of int
        Sequence lengths (integers >= 1, no duplicates).
    n : int or sequence of int
        Monte Carlo draws per cell; ``0`` means theory only. One Monte Carlo cell per
        ``n > 0`` and point; theory is computed once per point.
    seed : int
        Root seed of the Monte Carlo cells.
    independent : bool
        Passed to the engine: fresh draws at every T instead of one path per draw.
    ci : float
        Confidence level of the Monte Carlo intervals.
    target : float
        Target relative error of the theory's ``n_needed_*`` rows.
    params : mapping of str to float or sequence of float, optional
        Grids of extra family parameters (:func:`extra_parameters`), such as
        ``{"q": [0.3, 0.5]}`` for two-point or ``{"rho": [0, 0.5]}`` for ar1; each applies
        to the families that have it (an error if none has it).
    sampler : {"token", "aggregate", "auto"}
        How the Monte Carlo cells draw (part of their identity; a ``"token"`` cell's key leaves
        it out).

    Returns
    -------
    Plan

    Raises
    ------
    ValueError
        For bad input, or when no point of the grid is reachable.
    """
    names = list(dict.fromkeys(_as_list(families, "families")))
    for name in names:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}")
    Ts = tuple(int(t) for t in check_T(_as_list(T, "T"), grid=True))
    ns = _check_ns(n)
    seed = check_seed(seed)
    ci = _check_unit_interval("ci", ci)
    if not isinstance(target, int | float) or not 0 < target < math.inf:
        raise ValueError(f"target must be a finite number > 0, got {target!r}")
    sampler = check_sampler(sampler)
    mc_options = (("ci", ci), ("independent", bool(independent)))
    if sampler != "token":  # part of the identity; token cells keep their key
        mc_options += (("sampler", sampler),)
    mus = sorted({check_positive("mu", m) for m in _as_list(mu, "mu")})
    sigma2s = sorted({check_sigma2(s2) for s2 in _as_list(sigma2, "sigma2")})
    extras = _extra_grids(names, params)
    cells, unreachable = [], []
    for name in names:
        if FAMILIES[
            name
        ].derived_moments:  # mu and sigma2 follow from the extra parameters: no mu x sigma2 grid
            for extra in extras[name]:
                family = get_family(name, **extra)  # a bad parameter is an error
                cells.append(Cell("theory", family, Ts, options=(("target", float(target)),)))
                cells += [Cell("monte_carlo", family, Ts, k, seed, mc_options) for k in ns if k > 0]
            continue
        for extra in extras[name]:
            get_family(name, 1.0, 0.0, **extra)  # a bad extra parameter is an error, not unreachable
            for m in mus:
                for s2 in sigma2s:
                    try:
                        family = get_family(name, m, s2, **extra)
                    except ValueError as exc:  # valid inputs the family cannot reach
                        unreachable.append(
                            {"family": name, "mu": m, "sigma2": s2, **extra, "reason": str(exc)}
                        )
                        continue
                    cells.append(Cell("theory", family, Ts, options=(("target", float(target)),)))
                    cells += [Cell("monte_carlo", family, Ts, k, seed, mc_options) for k in ns if k > 0]
    if not cells:
        raise ValueError(f"no reachable point in the grid: {unreachable[0]['reason']}")
    return Plan(cells, unreachable)
