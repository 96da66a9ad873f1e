"""The ``figures`` command: every figure of the paper, regenerated from scratch.

Each figure ``NAME`` is written as ``NAME.pdf`` (vector), ``NAME.png`` and
``NAME.csv`` (the tidy data drawn), with a JSON sidecar ``NAME.json`` holding every
parameter (grids, family, seed, n), the package and library versions, and the SHA-256
of the data file. :func:`from_sidecar` (``variance-lab figures --from-sidecar NAME.json``)
rebuilds the figure from its sidecar alone.

Figures (:data:`FIGURES`):

``variance_vs_T``
    Var(P_T) and Var(G_T) against T: exact, the seed's approximations, Monte Carlo.
``ratio_vs_T``
    Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1.
``heatmap_var_P``, ``heatmap_var_G``
    log10 Var(P_T) and log10 Var(G_T) over mu x sigma^2 at one T, mu = 1 marked.
``approx_error``
    Relative error of the Var(G_T) approximations, per family, against T.
``mc_frontier``
    Largest T at which n draws estimate Var(P_T) to 10 %, against n (theory).
``ess_vs_T``
    Kong's ESS fraction of P_T against T: exact and Monte Carlo.
``log_histograms``
    Histograms of log P_T and log G_T at a few T, from raw draws (:func:`sample_log_P`).

The data come from :mod:`variance_lab.theory` and, where the engine is available,
:func:`variance_lab.simulate.simulate`; the drawing from :mod:`variance_lab.report.figures`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from variance_lab import __version__, theory
from variance_lab._atomic import atomic_write
from variance_lab.families import Family, get_family
from variance_lab.report import figures as plots
from variance_lab.simulate import simulate
from variance_lab.sweep import plan
from variance_lab.sweep.grid import parse_grid

__all__ = [
    "FIGURES",
    "default_params",
    "draw",
    "figure_data",
    "from_sidecar",
    "histogram_frame",
    "make_all",
    "make_figure",
    "sample_log_P",
    "save_figure",
]

#: PNG resolution (dots per inch); ``--quick`` uses :data:`QUICK_PNG_DPI`.
PNG_DPI = 200
QUICK_PNG_DPI = 100
SIDECAR_VERSION = 1


def _ints(text: str) -> list[int]:
    return [int(t) for t in parse_grid(text, integer=True)]


def _floats(text: str) -> list[float]:
    return [float(v) for v in parse_grid(text)]


# --------------------------------------------------------------------------- parameters
def _defaults(quick: bool) -> dict[str, dict]:
    T_line = _ints("1:1000:log12" if quick else "1:1000:log40")
    n_mc = 2000 if quick else 100_000
    base = {"family": "lognormal", "mu": 1.0, "sigma2": 0.1}
    return {
        "variance_vs_T": {
            **base,
            "T": T_line,
            "n": n_mc,
            "seed": 0,
            "ci": 0.95,
            "mc_T": [1, 10, 100, 1000] if quick else [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
        },
        "ratio_vs_T": {"family": "lognormal", "mu": [0.9, 1.0, 1.1], "sigma2": 0.1, "T": T_line},
        "heatmap_var_P": {
            "family": "lognormal",
            "statistic": "var_P",
            "T": 100,
            "mu": _floats("0.8:1.2:9" if quick else "0.8:1.2:41"),
            "sigma2": _floats("0.01:1:log7" if quick else "0.01:1:log31"),
        },
        "heatmap_var_G": {
            "family": "lognormal",
            "statistic": "var_G",
            "T": 100,
            "mu": _floats("0.8:1.2:9" if quick else "0.8:1.2:41"),
            "sigma2": _floats("0.01:1:log7" if quick else "0.01:1:log31"),
        },
        "approx_error": {
            "families": ["lognormal", "gamma", "two-point"],
            "mu": 1.0,
            "sigma2": 0.1,
            "T": _ints("1:1000:log8" if quick else "1:10000:log40"),
        },
        "mc_frontier": {
            "series": [
                ["lognormal", 1.0, 0.01],
                ["lognormal", 1.0, 0.1],
                ["lognormal", 1.0, 0.5],
                ["gamma", 1.0, 0.1],
                ["two-point", 1.0, 0.1],
            ],
            "T": _ints("1:2000:log25" if quick else "1:2000:log90"),
            "n": [float(v) for v in np.logspace(2, 12, 21 if quick else 101)],
            "target": 0.1,
        },
        "ess_vs_T": {
            "family": "lognormal",
            "mu": 1.0,
            "sigma2": [0.01, 0.1, 0.5],
            "T": T_line,
            "mc_T": [1, 10, 100, 1000] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": n_mc,
            "seed": 0,
            "ci": 0.95,
        },
        "log_histograms": {
            **base,
            "T": [1, 10, 100, 1000],
            "n": 2000 if quick else 20_000,
            "seed": 0,
            "bins": 60,
        },
    }


FIGURES = tuple(_defaults(True))


def default_params(name: str, *, quick: bool = False) -> dict:
    """Return the parameters of figure ``name`` (``quick``: small grids and few draws)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    params = _defaults(quick)[name]
    return params


# --------------------------------------------------------------------------- raw draws
def sample_log_P(family: Family, T: Sequence[int], n: int, *, seed: int = 0) -> np.ndarray:
    """Draws of log P_T: ``n`` paths of ``max(T)`` i.i.d. log-ratios, read at each T.

    A small NumPy sampler for histograms (modest ``n``), separate from the Monte Carlo
    engine: one :class:`numpy.random.Generator` from ``SeedSequence(seed)``, tokens drawn
    one step at a time for all paths, so memory is O(n).

    Parameters
    ----------
    family : Family
    T : sequence of int
        Sorted-or-not lengths >= 1.
    n : int
        Paths.
    seed : int

    Returns
    -------
    ndarray, shape (n, len(T))
        Column ``j`` holds log P_{T[j]} of every path.
    """
    Ts = [int(t) for t in T]
    if not Ts or min(Ts) < 1:
        raise ValueError(f"T must be integers >= 1, got {T!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    code, p = family.sampler_params()
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    draw = _token_sampler(code, p, rng, n)
    where = {t: j for j, t in enumerate(Ts)}
    out = np.empty((n, len(Ts)))
    total = np.zeros(n)
    for t in range(1, max(Ts) + 1):
        total += draw()
        if t in where:
            out[:, where[t]] = total
    return out


def _token_sampler(code: int, p: np.ndarray, rng: np.random.Generator, n: int) -> Callable[[], np.ndarray]:
    """Return a function drawing ``n`` i.i.d. log-ratios per call (codes of ``Family.sampler_params``)."""
    if code == 0:
        return lambda: np.full(n, p[0])
    if code == 1:
        return lambda: p[0] + p[1] * rng.standard_normal(n)
    if code == 2:

        def gamma() -> np.ndarray:
            with np.errstate(divide="ignore"):
                return np.log(rng.standard_gamma(p[0], n)) + p[1]

        return gamma
    if code == 3:
        return lambda: np.where(rng.random(n) < p[0], p[1], p[2])
    raise ValueError(f"unknown sampler code {code!r}")


def histogram_frame(log_P: np.ndarray, T: Sequence[int], bins: int = 60) -> pd.DataFrame:
    """Histogram bins (density) of log P_T and log G_T = log P_T / T, per T.

    Returns
    -------
    pandas.DataFrame
        Columns T, quantity (``log_P`` / ``log_G``), lo, hi, density.
    """
    parts = []
    for j, t in enumerate(T):
        for quantity, x in (("log_P", log_P[:, j]), ("log_G", log_P[:, j] / t)):
            x = x[np.isfinite(x)]
            density, edges = np.histogram(x, bins=bins, density=True)
            parts.append(
                pd.DataFrame(
                    {"T": int(t), "quantity": quantity, "lo": edges[:-1], "hi": edges[1:], "density": density}
                )
            )
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------- data
def _theory(family: Family, T, quantities: Sequence[str], target: float = theory.DEFAULT_TARGET):
    """Tidy theory rows of a few quantities."""
    return theory.tidy(family, T, target=target, quantities=quantities)


def _monte_carlo(family: Family, params: dict, workers) -> pd.DataFrame:
    if not params.get("n"):
        return pd.DataFrame()
    frame = simulate(
        family,
        list(params["mc_T"]),
        int(params["n"]),
        seed=int(params["seed"]),
        workers=workers,
        ci=float(params["ci"]),
        progress=False,
    )
    return frame[frame["method"] == "monte_carlo"]


def _concat(frames) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True)


def _keep(frame: pd.DataFrame, statistics) -> pd.DataFrame:
    return frame[frame["statistic"].isin(list(statistics))].reset_index(drop=True)


def figure_data(name: str, params: dict, *, workers: int | None = None) -> pd.DataFrame:
    """Return the tidy data behind figure ``name`` with ``params`` (see :func:`default_params`)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    p = params
    var_G = ["var_G", "var_G_lognormal", "var_G_delta", "var_G_seed"]
    if name == "variance_vs_T":
        family = get_family(p["family"], p["mu"], p["sigma2"])
        frames = [_theory(family, p["T"], ["var_P", *var_G]), _monte_carlo(family, p, workers)]
        return _keep(_concat(frames), ["var_P", "var_G"])
    if name == "ratio_vs_T":
        families = [get_family(p["family"], m, p["sigma2"]) for m in p["mu"]]
        return _concat([_theory(f, p["T"], ["var_ratio"]) for f in families])
    if name.startswith("heatmap_"):
        cells = plan(p["family"], p["mu"], p["sigma2"], [p["T"]]).cells
        return _concat([_theory(c.family, c.T, [p["statistic"]]) for c in cells])
    if name == "approx_error":
        return _concat([_theory(get_family(f, p["mu"], p["sigma2"]), p["T"], var_G) for f in p["families"]])
    if name == "mc_frontier":
        return _concat(
            [_theory(get_family(f, m, s2), p["T"], ["n_needed_P"], p["target"]) for f, m, s2 in p["series"]]
        )
    if name == "ess_vs_T":
        frames = []
        for s2 in p["sigma2"]:
            family = get_family(p["family"], p["mu"], s2)
            frames += [_theory(family, p["T"], ["ess_frac_P"]), _monte_carlo(family, p, workers)]
        return _keep(_concat(frames), ["ess_frac_P"])
    family = get_family(p["family"], p["mu"], p["sigma2"])
    return histogram_frame(sample_log_P(family, p["T"], int(p["n"]), seed=int(p["seed"])), p["T"], p["bins"])


def draw(name: str, data: pd.DataFrame, params: dict):
    """Draw figure ``name`` from its data; returns the :class:`~matplotlib.figure.Figure`."""
    if name == "variance_vs_T":
        return plots.variance_panels(data)
    if name == "ratio_vs_T":
        return plots.ratio_vs_T(data)
    if name.startswith("heatmap_"):
        return plots.heatmap(data, params["statistic"], T=params["T"])
    if name == "approx_error":
        return plots.approx_error(data)
    if name == "mc_frontier":
        return plots.mc_frontier(data, params["n"], target=params["target"])
    if name == "ess_vs_T":
        return plots.ess_vs_T(data, n=params.get("n") or None)
    if name == "log_histograms":
        return plots.log_histograms(data)
    raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")


def make_figure(name: str, params: dict | None = None, *, quick: bool = False, workers: int | None = None):
    """Compute and draw one figure.

    Parameters
    ----------
    name : str
        One of :data:`FIGURES`.
    params : dict, optional
        Parameters (default: :func:`default_params`); a sidecar's ``params`` reproduce its figure.
    quick : bool
        Use the quick defaults (when ``params`` is not given).
    workers : int, optional
        Engine worker threads (does not change results).

    Returns
    -------
    (Figure, DataFrame, dict)
        The figure, its data and the parameters used.
    """
    params = default_params(name, quick=quick) if params is None else dict(params)
    data = figure_data(name, params, workers=workers)
    return draw(name, data, params), data, params


# --------------------------------------------------------------------------- files
def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _sidecar(name: str, params: dict, data_text: str, quick: bool, dpi: int) -> dict:
    return {
        "sidecar_version": SIDECAR_VERSION,
        "figure": name,
        "description": getattr(_DOCS, name),
        "params": params,
        "seed": params.get("seed"),
        "n": params.get("n", 0),
        "monte_carlo": bool(params.get("n")) and "mc_T" in params,
        "quick": quick,
        "version": __version__,
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "pandas": pd.__version__,
            "matplotlib": matplotlib.__version__,
        },
        "files": {"pdf": f"{name}.pdf", "png": f"{name}.png", "data": f"{name}.csv"},
        "png_dpi": dpi,
        "data_sha256": hashlib.sha256(data_text.encode()).hexdigest(),
        "reproduce": f"variance-lab figures --from-sidecar {name}.json --out DIR",
    }


class _DOCS:
    """One-line captions, stored in each sidecar."""

    variance_vs_T = (
        "Var(P_T) (top) and Var(G_T) (bottom) against T: exact lines, the seed's approximations, Monte "
        "Carlo estimates with confidence intervals (hollow: flagged unreliable)."
    )
    ratio_vs_T = "Exact Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1."
    heatmap_var_P = "log10 of the exact Var(P_T) over mu x sigma^2 at one T; dashed line: mu = 1."
    heatmap_var_G = "log10 of the exact Var(G_T) over mu x sigma^2 at one T; dashed line: mu = 1."
    approx_error = (
        "|approximation/exact - 1| of Var(G_T): the seed's lognormal approximation, its small-x form and "
        "the seed table's sigma^2/T, per family; values below 1e-16 drawn at 1e-16 (exact)."
    )
    mc_frontier = (
        "Largest T at which n plain Monte Carlo draws estimate Var(P_T) to the target relative error "
        "(theory: n_needed_P, interpolated in log10 between grid lengths)."
    )
    ess_vs_T = (
        "Kong's ESS fraction of the weights P_T against T: exact lines and Monte Carlo estimates "
        "(hollow: flagged unreliable); dashed: 1/n, one draw holding all the weight."
    )
    log_histograms = "Histograms of log P_T and log G_T = log P_T / T at a few T, from raw draws."


def save_figure(
    name: str, fig, data: pd.DataFrame, params: dict, out: str | os.PathLike, *, quick: bool = False
) -> list[Path]:
    """Write ``NAME.pdf``, ``NAME.png``, ``NAME.csv`` and the sidecar ``NAME.json`` to ``out``.

    Files are written atomically and reproducibly (no creation dates).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data_text = data.to_csv(index=False)
    paths = [out / f"{name}.{ext}" for ext in ("csv", "pdf", "png", "json")]
    _write_text(paths[0], data_text)
    atomic_write(paths[1], lambda tmp: fig.savefig(tmp, format="pdf", metadata={"CreationDate": None}))
    dpi = QUICK_PNG_DPI if quick else PNG_DPI
    atomic_write(paths[2], lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
    sidecar = _sidecar(name, params, data_text, quick, dpi)
    _write_text(paths[3], json.dumps(sidecar, indent=1) + "\n")
    return paths


#: The analysis of the shipped experiment data (variance_lab.experiment.figure), which has
#: its own data set and sidecar format.
EXPERIMENT_FIGURE = "experiment_variance"
#: Every figure ``variance-lab figures`` writes.
ALL_FIGURES = (*FIGURES, EXPERIMENT_FIGURE)


def make_all(
    out: str | os.PathLike,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[Path]:
    """Regenerate figures from scratch into ``out``; returns the files written.

    Parameters
    ----------
    out : str or Path
        Output folder (created when missing).
    quick : bool
        Small grids and few draws (seconds; for tests and previews).
    only : sequence of str, optional
        A subset of :data:`ALL_FIGURES`.
    workers : int, optional
        Engine worker threads.
    progress : bool
        Progress bar over figures.
    """
    from tqdm.auto import tqdm

    names = list(ALL_FIGURES if only is None else only)
    for name in names:
        if name != EXPERIMENT_FIGURE:
            default_params(name)  # validates the name
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is not a folder")
    written: list[Path] = []
    for name in tqdm(names, disable=not progress, unit="figure", desc="figures"):
        if name == EXPERIMENT_FIGURE:  # drawn from the shipped data set (variance_lab.experiment)
            from variance_lab.experiment.figure import save_experiment_figure

            written += save_experiment_figure(out, n_boot=200 if quick else 1000)
            continue
        fig, data, params = make_figure(name, quick=quick, workers=workers)
        written += save_figure(name, fig, data, params, out, quick=quick)
    return written


def from_sidecar(
    path: str | os.PathLike, out: str | os.PathLike | None = None, *, workers: int | None = None
) -> list[Path]:
    """Rebuild the figure described by a sidecar JSON into ``out`` (default: its folder)."""
    path = Path(path)
    try:
        sidecar = json.loads(path.read_text())
        name, params = sidecar["figure"], sidecar["params"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is not a figure sidecar: {exc}") from None
    fig, data, params = make_figure(name, params, workers=workers)
    return save_figure(
        name, fig, data, params, path.parent if out is None else out, quick=bool(sidecar.get("quick", False))
    )
