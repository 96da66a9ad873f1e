"""The ``figures`` command: every figure of the paper, regenerated from scratch.

Each figure ``NAME`` is written in the chosen formats (default ``NAME.pdf``, vector, and
``NAME.png``; also ``svg`` and ``eps``) with ``NAME.csv`` (the tidy data drawn) and a JSON
sidecar ``NAME.json`` holding every parameter (grids, family, seed, n), the style, the
package and library versions, and the SHA-256 of the data file. :func:`from_sidecar`
(``variance-lab figures --from-sidecar NAME.json``) rebuilds a figure from its sidecar
alone; :func:`check` (``--check``) rebuilds into a temporary folder and compares the data
number by number (:mod:`variance_lab.paper.compare`), writing nothing.

Figures (:data:`FIGURES`):

``variance_vs_T``
    Var(P_T) and Var(G_T) against T: exact and Monte Carlo, and the Var(G_T)
    approximations of the derivation as ratios to the exact value.
``ratio_vs_T``
    Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1.
``heatmap_var_P``, ``heatmap_var_G``
    Var(P_T) and Var(G_T) over mu x sigma^2 at one T, contours, mu = 1 and sigma^2 = 1 - mu^2 marked.
``decay_boundary``
    Var(P_100)/Var(P_10) over mu x sigma^2: where Var(P_T) grows or decays (sigma^2 = 1 - mu^2).
``approx_error``
    Relative error of the Var(G_T) approximations, per family, against T.
``mc_frontier``
    Largest T at which n draws estimate Var(P_T) to 10 %, against n (theory).
``ess_vs_T``
    Kong's ESS fraction of P_T against T: exact and Monte Carlo.
``log_histograms``
    Histograms of log P_T and log G_T at a few T, from raw draws (:func:`sample_log_P`).

``corrections_vs_T``
    Relative bias and ESS fraction of TIS, masks and clips against T: lognormal closed
    forms (:func:`variance_lab.corrections.theory`) and Monte Carlo
    (:func:`variance_lab.corrections.simulate_corrections`); below, the bfloat16 experiment's
    measured points per length bucket (``data``, with bootstrap intervals) against the
    lognormal fitted to its log-ratios.
``clip_fractions``
    Observed against predicted GSPO, PPO and GMPO clip fractions per length bucket of the shipped
    data set (``data/arith_rollouts.jsonl.gz``), one marker per model of
    :func:`variance_lab.rollouts.analysis.analyze` (:func:`clip_frame`,
    :func:`variance_lab.report.clip_figure.clip_figure`).

The data come from :mod:`variance_lab.theory` and the Monte Carlo engine
(:func:`variance_lab.simulate.simulate`; raw draws through the engine's own samplers,
:func:`variance_lab.simulate.draw_log_p`); the drawing from :mod:`variance_lab.report.figures`.
An :class:`~variance_lab.simulate.Engine` passed as ``engine=`` says where Monte Carlo
chunks run; the sampler of a figure is part of its parameters (``"sampler"``, default
``"token"``), so that its sidecar reproduces it whatever engine runs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import __version__, corrections, theory
from variance_lab._atomic import atomic_write
from variance_lab.experiment.files import cpu_model
from variance_lab.experiment.names import FIGURE_NAME
from variance_lab.families import Family, get_family
from variance_lab.paper import compare
from variance_lab.report import clip_figure, corrections_figure
from variance_lab.report import figures as plots
from variance_lab.report import style as report_style
from variance_lab.simulate import Engine, draw_log_p, resolve_sampler, simulate, using_engine
from variance_lab.sweep import plan
from variance_lab.sweep.grid import parse_grid

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_STYLE",
    "FIGURES",
    "FORMATS",
    "SidecarCheck",
    "check",
    "clip_analysis",
    "clip_columns",
    "clip_frame",
    "corrections_frame",
    "default_params",
    "draw",
    "figure_data",
    "from_sidecar",
    "histogram_frame",
    "make_all",
    "make_figure",
    "sample_log_P",
    "save_figure",
    "with_resampled_gspo",
]

#: PNG resolution (dots per inch); ``--quick`` uses :data:`QUICK_PNG_DPI`.
PNG_DPI = 200
QUICK_PNG_DPI = 100
SIDECAR_VERSION = 2
#: Formats ``save_figure`` can write; the default is vector PDF and PNG.
FORMATS = ("pdf", "png", "svg", "eps")
DEFAULT_FORMATS = ("pdf", "png")
#: Style of the command's figures (:func:`variance_lab.report.style.use`).
DEFAULT_STYLE = "paper"


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
        "decay_boundary": {
            "family": "lognormal",
            "T": [10, 100],
            "mu": _floats("0.5:1.2:8" if quick else "0.5:1.2:36"),
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
        "corrections_vs_T": {
            **base,
            "corrections": ["seq-tis:3", "seq-mask:3", "geo-rs:0.9:1.1", "tis:2", "icepop:2", "gmpo"],
            "T": _ints("1:1000:log12" if quick else "1:1000:log40"),
            "mc_T": [1, 10, 100] if quick else [1, 3, 10, 30, 100, 300, 1000],
            "n": 2000 if quick else 100_000,
            "seed": 0,
            "ci": 0.95,
            "data": "arith_rollouts_bf16.jsonl.gz",
            "ratio": "mismatch",
            "buckets": [8, 16, 32, 64, 128, 256],
            "data_T": _ints("8:346:log12" if quick else "8:346:log40"),
            "n_boot": 200 if quick else 2000,
        },
        "clip_fractions": {
            "data": "arith_rollouts.jsonl.gz",  # in data/ of the source tree (clip_frame)
            "n_boot": 200 if quick else 1000,
            "seed": 0,
            "level": 0.95,
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
def sample_log_P(
    family: Family, T: Sequence[int], n: int, *, seed: int = 0, sampler: str = "token"
) -> np.ndarray:
    """Draws of log P_T: ``n`` paths read at each T, drawn by the Monte Carlo engine's sampler.

    The paths are those a chunk of ``n`` paths draws
    (:func:`variance_lab.simulate.draw_log_p`, every family, AR(1) included), from one
    :class:`numpy.random.Generator` made from ``SeedSequence(seed)``. Holds the
    ``n x len(T)`` result (for histograms: modest ``n``).

    Parameters
    ----------
    family : Family
    T : sequence of int
        Lengths >= 1, in any order (repeats allowed).
    n : int
        Paths, >= 1.
    seed : int
    sampler : {"token", "aggregate", "auto"}
        Token by token (the reference, every family) or aggregate draws at the T points
        (:mod:`variance_lab.simulate.aggregate`).

    Returns
    -------
    ndarray, shape (n, len(T))
        Column ``j`` holds log P_{T[j]} of every path.

    Raises
    ------
    ValueError
        For T below 1, ``n < 1`` or a sampler the family does not have.
    """
    Ts = [int(t) for t in T]
    if not Ts or min(Ts) < 1:
        raise ValueError(f"T must be integers >= 1, got {T!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    code, p = family.sampler_params()
    grid = np.unique(Ts)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    draws = draw_log_p(code, p, grid, rng, int(n), sampler=resolve_sampler(sampler, code, family.name))
    return draws[:, np.searchsorted(grid, Ts)]


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


def _monte_carlo(family: Family, params: dict, engine: Engine) -> pd.DataFrame:
    if not params.get("n"):
        return pd.DataFrame()
    frame = simulate(
        family,
        list(params["mc_T"]),
        int(params["n"]),
        seed=int(params["seed"]),
        engine=engine.with_sampler(params.get("sampler", "token")),
        ci=float(params["ci"]),
        progress=False,
    )
    return frame[frame["method"] == "monte_carlo"]


def _concat(frames) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True)


def _keep(frame: pd.DataFrame, statistics) -> pd.DataFrame:
    return frame[frame["statistic"].isin(list(statistics))].reset_index(drop=True)


def figure_data(name: str, params: dict, *, engine: Engine | None = None) -> pd.DataFrame:
    """Compute the tidy data behind figure ``name`` with ``params`` (see :func:`default_params`).

    ``engine`` runs the Monte Carlo parts (default: threads on all cores); results do not
    depend on it.
    """
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    with using_engine(engine) as eng:
        return _figure_data(name, params, eng)


def _figure_data(name: str, params: dict, engine: Engine) -> pd.DataFrame:
    p = params
    var_G = ["var_G", "var_G_lognormal", "var_G_delta", "var_G_naive"]
    if name == "variance_vs_T":
        family = get_family(p["family"], p["mu"], p["sigma2"])
        frames = [_theory(family, p["T"], ["var_P", *var_G]), _monte_carlo(family, p, engine)]
        return _keep(_concat(frames), ["var_P", "var_G"])
    if name == "ratio_vs_T":
        families = [get_family(p["family"], m, p["sigma2"]) for m in p["mu"]]
        return _concat([_theory(f, p["T"], ["var_ratio"]) for f in families])
    if name.startswith("heatmap_"):
        cells = plan(p["family"], p["mu"], p["sigma2"], [p["T"]]).cells
        return theory.tidy_many([c.family for c in cells], [p["T"]], quantities=[p["statistic"]])
    if name == "decay_boundary":
        cells = plan(p["family"], p["mu"], p["sigma2"], list(p["T"])).cells
        return theory.tidy_many([c.family for c in cells], list(p["T"]), quantities=["var_P"])
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
            frames += [_theory(family, p["T"], ["ess_frac_P"]), _monte_carlo(family, p, engine)]
        return _keep(_concat(frames), ["ess_frac_P"])
    if name == "corrections_vs_T":
        return corrections_frame(p)
    if name == "clip_fractions":
        return clip_frame(p)
    family = get_family(p["family"], p["mu"], p["sigma2"])
    draws = sample_log_P(family, p["T"], int(p["n"]), seed=int(p["seed"]), sampler=p.get("sampler", "token"))
    return histogram_frame(draws, p["T"], p["bins"])


def _theory_rows(frame: pd.DataFrame, method: str) -> list[dict]:
    """Long rows (relative bias and ESS fraction) of a :func:`variance_lab.corrections.theory` frame."""
    return [
        {
            "T": r.T,
            "correction": r.correction,
            "statistic": stat,
            "method": method,
            "value": value,
            "lo": np.nan,
            "hi": np.nan,
            "reliable": True,
        }
        for r in frame.itertuples(index=False)
        for stat, value in (("rel_bias", r.bias / r.mean_base), ("ess_frac", r.ess_frac))
    ]


def corrections_frame(params: dict) -> pd.DataFrame:
    """Tidy rows of the corrections figure: relative bias and ESS fraction, exact and Monte Carlo.

    ``rel_bias`` is :math:`E[w]/E[b] - 1` (``bias / mean_base``), with the Monte Carlo interval
    of :math:`E[w]` divided by the exact :math:`E[b]`; ``ess_frac`` as in
    :func:`variance_lab.corrections.theory`. Monte Carlo rows carry the verdict in ``reliable``.
    """
    p = params
    family = get_family(p["family"], p["mu"], p["sigma2"])
    th = corrections.theory(family, p["T"], p["corrections"])
    rows = []
    rows.extend(_theory_rows(th, "exact"))
    if p.get("n"):
        mc = corrections.simulate_corrections(
            family, p["mc_T"], p["corrections"], int(p["n"]), seed=int(p["seed"]), ci=float(p["ci"])
        )
        base = corrections.theory(family, p["mc_T"], p["corrections"]).mean_base.to_numpy()
        for r, b in zip(mc.itertuples(index=False), base, strict=True):
            common = {
                "T": r.T,
                "correction": r.correction,
                "method": "monte_carlo",
                "reliable": r.mc_reliable,
            }
            rows.append(
                {
                    **common,
                    "statistic": "rel_bias",
                    "value": r.mc_mean_w / b - 1,
                    "lo": r.mc_mean_w_lo / b - 1,
                    "hi": r.mc_mean_w_hi / b - 1,
                }
            )
            rows.append(
                {**common, "statistic": "ess_frac", "value": r.mc_ess_frac, "lo": np.nan, "hi": np.nan}
            )
    if p.get("data"):
        rows += _experiment_rows(p)
    return pd.DataFrame(rows)


#: Where the experiments' data files live (a ``data`` name that is not a path to a file is looked up here).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def _experiment_rows(p: dict) -> list[dict]:
    """Compute the experiment's measured points per length bucket and the lognormal fitted to its log-ratios.

    ``method="experiment"``: relative bias and ESS fraction of each correction on the file's
    token log-ratios (``ratio``: ``mismatch``, ``update`` or ``total``) per bucket, at the
    bucket's median length, with percentile-bootstrap intervals over prompts (over sequences
    when the file has no ``prompt_id``; :func:`variance_lab.corrections.bucket_bootstrap`);
    ``method="experiment_fit"``: the closed forms of
    :func:`variance_lab.corrections.fit_lognormal` of the same pooled log-ratios at the lengths
    ``data_T``.
    """
    from variance_lab.rollouts.io import load_batch

    path = Path(p["data"])
    if not path.is_file():
        path = DATA_DIR / p["data"]
    batch = load_batch(path)
    log_r = {
        "mismatch": batch.mismatch_log_ratio,
        "update": batch.log_ratio,
        "total": batch.total_log_ratio,
    }[p.get("ratio", "mismatch")]
    edges = [int(e) for e in p["buckets"]]
    top = max(int(batch.lengths.max()), edges[-1])
    buckets = [(a, edges[i + 1] - 1) for i, a in enumerate(edges[:-1])] + [(edges[-1], top)]
    boot = corrections.bucket_bootstrap(
        log_r,
        batch.offsets,
        p["corrections"],
        buckets,
        n_boot=int(p["n_boot"]),
        ci=float(p["ci"]),
        seed=0,
        groups=batch.group_index() if batch.has_groups else None,  # resample prompts, not responses
    )
    rows = []
    for r in boot.itertuples(index=False):
        for stat in ("rel_bias", "ess_frac"):
            value, lo, hi = getattr(r, stat), getattr(r, f"{stat}_lo"), getattr(r, f"{stat}_hi")
            rows.append(
                {
                    "T": int(np.floor(r.T + 0.5)),  # the bucket's median length, an integer like the others
                    "correction": r.correction,
                    "statistic": stat,
                    "method": "experiment",
                    "value": value,
                    "lo": min(lo, value),
                    "hi": max(hi, value),
                    "reliable": True,
                }
            )
    fit = corrections.theory(corrections.fit_lognormal(log_r), p["data_T"], p["corrections"])
    rows.extend(_theory_rows(fit, "experiment_fit"))
    return rows


def clip_analysis(params: dict):
    """Run :func:`variance_lab.rollouts.analysis.analyze` on the data set of the ``clip_fractions`` figure.

    ``params["data"]`` is a file name in the source tree's ``data/`` folder (the shipped
    ``arith_rollouts.jsonl.gz``) or a path; ``n_boot``, ``level`` and ``seed`` are the
    bootstrap's.

    Returns
    -------
    variance_lab.rollouts.analysis.AnalysisResult

    Raises
    ------
    ValueError
        When the data file is missing or not a rollouts file (naming it).
    """
    from variance_lab.experiment.figure import load_data
    from variance_lab.rollouts.analysis import analyze

    batch, _ = load_data(_clip_data_path(params))
    return analyze(  # the figure draws the table, not the held-out model judgment: folds=0
        batch, n_boot=int(params["n_boot"]), level=float(params["level"]), seed=int(params["seed"]), folds=0
    )


def _clip_data_path(params: dict) -> Path:
    """Return the data file of the ``clip_fractions`` figure (a bare name: in the shipped data folder)."""
    from variance_lab.experiment.figure import DEFAULT_DATA

    path = Path(params["data"])
    if not path.is_absolute() and path.parent == Path():
        path = DEFAULT_DATA.parent / path
    return path


def clip_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Keep the bucket columns and every ``*_clip_frac*`` and ``*_clip_pred*`` column of an analysis table.

    So a model or a kind of clip added to the analysis is carried without a change here.

    Returns
    -------
    pandas.DataFrame
        Columns ``bucket``, ``T_lo``, ``T_hi``, ``n_seq``, ``T_mean``, then the clip columns in
        the table's order.
    """
    keep = ["bucket", "T_lo", "T_hi", "n_seq", "T_mean"]
    keep += [c for c in table.columns if "_clip_frac" in c or "_clip_pred" in c]
    return table[keep].reset_index(drop=True)


def clip_frame(params: dict) -> pd.DataFrame:
    """Compute the data of the ``clip_fractions`` figure: :func:`clip_columns` of :func:`clip_analysis`.

    With the i.i.d. empirical GSPO prediction filled in by :func:`with_resampled_gspo`.
    """
    return with_resampled_gspo(clip_columns(clip_analysis(params).table), params)


def with_resampled_gspo(frame: pd.DataFrame, params: dict) -> pd.DataFrame:
    """Fill in the i.i.d. empirical model's GSPO clip prediction, as ``experiment_variance`` draws it.

    The analysis has no closed-form GSPO prediction of the i.i.d. empirical model
    (``gspo_clip_pred_emp`` is NaN); where it has none, the column gets the fraction of
    sequences clipped when tokens are resampled i.i.d. from their pooled empirical law
    (:func:`variance_lab.experiment.figure.resampled_clip` on the data set of ``params``, with
    its ``seed``), the line the ``experiment_variance`` figure draws for that model, so the two
    figures show the same prediction.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`clip_columns` of the analysis of ``params["data"]`` (one row per bucket).
    params : dict
        The figure's parameters (``data``, ``seed``).

    Returns
    -------
    pandas.DataFrame
        A copy of ``frame``; ``frame`` itself is not changed.

    Raises
    ------
    ValueError
        When the resampled fractions do not cover the frame's buckets.
    """
    frame = frame.copy()
    if "gspo_clip_pred_emp" in frame and frame["gspo_clip_pred_emp"].notna().any():
        return frame
    from variance_lab.experiment.figure import load_data, resampled_clip

    values = resampled_clip(load_data(_clip_data_path(params))[0], seed=int(params["seed"]))
    if len(values) != len(frame):
        raise ValueError(f"resampled clip fractions cover {len(values)} buckets, the table {len(frame)}")
    frame["gspo_clip_pred_emp"] = values
    return frame


def _histogram_title(params: dict) -> str:
    n = f"{int(params['n']):,}".replace(",", "{,}")
    return f"{params['family']}, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$; $n = {n}$ draws"


def draw(name: str, data: pd.DataFrame, params: dict, *, style=None):
    """Draw figure ``name`` from its data; returns the :class:`~matplotlib.figure.Figure`.

    ``style`` as for :func:`variance_lab.report.style.use` (``None``: the caller's rcParams;
    the command draws with :data:`DEFAULT_STYLE`).
    """
    if name == "variance_vs_T":
        return plots.variance_panels(data, n=params.get("n"), style=style)
    if name == "ratio_vs_T":
        return plots.ratio_vs_T(data, style=style)
    if name.startswith("heatmap_"):
        return plots.heatmap(data, params["statistic"], T=params["T"], style=style)
    if name == "decay_boundary":
        return plots.decay_boundary(data, tuple(params["T"]), style=style)
    if name == "approx_error":
        return plots.approx_error(data, style=style)
    if name == "mc_frontier":
        return plots.mc_frontier(data, params["n"], target=params["target"], style=style)
    if name == "ess_vs_T":
        return plots.ess_vs_T(data, n=params.get("n") or None, style=style)
    if name == "log_histograms":
        return plots.log_histograms(data, title=_histogram_title(params), style=style)
    if name == "corrections_vs_T":
        title = f"{params['family']} ratios, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$"
        title += ": closed form"
        if params.get("n"):
            title += f" and Monte Carlo ($n = {int(params['n']):,}$ draws)".replace(",", "{,}")
        return corrections_figure.corrections_vs_T(
            data,
            title=title,
            style=style,
            experiment_title="bf16 experiment, per length bucket: measured and lognormal fit",
            level=float(params.get("ci", 0.95)),
        )
    if name == "clip_fractions":
        title = f"{Path(params['data']).name}: observed against predicted clip fractions per length bucket"
        return clip_figure.clip_figure(data, level=float(params["level"]), style=style, title=title)
    raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")


def make_figure(
    name: str, params: dict | None = None, *, quick: bool = False, engine: Engine | None = None, style=None
):
    """Compute and draw one figure.

    Parameters
    ----------
    name : str
        One of :data:`FIGURES`.
    params : dict, optional
        Parameters (default: :func:`default_params`); a sidecar's ``params`` reproduce its figure.
    quick : bool
        Use the quick defaults (when ``params`` is not given).
    engine : Engine, optional
        Runs the Monte Carlo parts (default: threads on all cores; does not change results).
    style : None, str or dict
        As for :func:`draw`.

    Returns
    -------
    (Figure, DataFrame, dict)
        The figure, its data and the parameters used.
    """
    params = default_params(name, quick=quick) if params is None else dict(params)
    data = figure_data(name, params, engine=engine)
    return draw(name, data, params, style=style), data, params


# --------------------------------------------------------------------------- files
def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _style_name(style) -> str | None:
    """How the sidecar records ``style``: its name, or the path of a style file."""
    if style is None or isinstance(style, str | os.PathLike):
        return None if style is None else str(style)
    raise ValueError(f"style must be a style name or file, got {style!r}")


def _sidecar(name: str, params: dict, data_text: str, quick: bool, dpi: int, formats, style) -> dict:
    files = {ext: f"{name}.{ext}" for ext in formats}
    return {
        "sidecar_version": SIDECAR_VERSION,
        "figure": name,
        "description": getattr(_DOCS, name),
        "params": params,
        "seed": params.get("seed"),
        "n": params.get("n", 0),
        "monte_carlo": bool(params.get("n")) and "mc_T" in params,
        "quick": quick,
        "style": _style_name(style),
        "version": __version__,
        "versions": {**plots.versions(), "cpu": cpu_model()},
        "files": {**files, "data": f"{name}.csv"},
        "png_dpi": dpi,
        "data_sha256": hashlib.sha256(data_text.encode()).hexdigest(),
        "reproduce": f"variance-lab figures --from-sidecar {name}.json --out DIR",
    }


class _DOCS:
    """One-line captions, stored in each sidecar."""

    variance_vs_T = (
        "(a) Var(P_T) and (b) Var(G_T) against T: exact lines and Monte Carlo estimates with 95 % "
        "confidence intervals (filled: reliable; half filled: flagged marginal, a sound value whose "
        "interval may cover less than 95 %; hollow: flagged unreliable, fewer draws than a 10 % relative "
        "error needs, so even a point on the line does not confirm it); (c) the Var(G_T) approximations "
        "of the derivation (lognormal, its small-x form, the naive sigma^2/T of its table) and Monte "
        "Carlo as ratios to the exact Var(G_T)."
    )
    ratio_vs_T = "Exact Var(P_T)/Var(G_T) against T for mu < 1, mu = 1 and mu > 1; lower panel: T <= 50."
    heatmap_var_P = (
        "Exact Var(P_T) over mu x sigma^2 at one T, colour in decades with labelled contours; dashed: "
        "mu = 1; red: sigma^2 = 1 - mu^2, below which (mu < 1) Var(P_T) decays."
    )
    heatmap_var_G = (
        "Exact Var(G_T) over mu x sigma^2 at one T, colour in decades with labelled contours (its own "
        "colour bar); dashed: mu = 1; red: sigma^2 = 1 - mu^2."
    )
    decay_boundary = (
        "Var(P_T2)/Var(P_T1) over mu x sigma^2 (exact): growth (orange) or decay (purple) of Var(P_T); "
        "black contour: no change; red: sigma^2 = 1 - mu^2, the exact boundary, not mu = 1."
    )
    approx_error = (
        "|approximation/exact - 1| of Var(G_T): the lognormal approximation, its small-x form and "
        "the naive sigma^2/T of the derivation's table, per family; values below 1e-12 drawn at 1e-12 "
        "(exact)."
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
    corrections_vs_T = (
        "Relative bias E[w]/E[b] - 1 (w: a correction's weight; b: the uncorrected weight it acts on, P_T, "
        "or G_T for GMPO, or r_t for the token-level TIS and IcePop) and ESS fraction E[w]^2/E[w^2] of "
        "sequence- and token-level corrections (TIS, masks, Geo-RS, IcePop, GMPO) against T: (a, b) "
        "lognormal closed forms (lines) and Monte Carlo (filled points with 95 % intervals; hollow: "
        "flagged unreliable); (c, d) the bfloat16 experiment's mismatch ratio per length bucket "
        "(half-filled points at the median length, 95 % bootstrap intervals over prompts, a prompt's "
        "responses resampled together) against the "
        "lognormal fitted to its pooled token log-ratios (lines)."
    )
    clip_fractions = (
        "Observed against predicted clip fractions per length bucket of the shipped arithmetic-task "
        "rollouts (data/arith_rollouts.jsonl.gz), one panel per kind of clip: GSPO's fraction of sequences "
        "with G_T outside its range (linear axes), PPO's fraction of tokens outside its range and GMPO's "
        "fraction of tokens whose log-ratio lies outside its clip (log axes); horizontal bars: the "
        "observed fraction's 95 % interval as the analysis computes it (clustered by prompt: for GSPO "
        "Wilson's at the effective size n / design effect, for PPO and GMPO a bootstrap over prompts). "
        "Buckets are numbered on each "
        "panel's top edge over their observed fraction, and the title gives each number's range of "
        "lengths. One hollow marker per model of the analysis (i.i.d. lognormal, i.i.d. empirical, "
        "autocorrelation-corrected, mix (token mixture), hier (random scale), comb (combined), and any other "
        "it has), "
        "largest first so that coincident markers nest; equal predictions share one marker. The i.i.d. "
        "empirical GSPO prediction resamples tokens from their pooled law, as experiment_variance draws "
        "it. Values below a log panel's floor are drawn on its edge and listed in a note; grey: "
        "predicted = observed."
    )


def _check_formats(formats) -> tuple[str, ...]:
    formats = tuple(DEFAULT_FORMATS if formats is None else formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"formats must be a non-empty subset of {', '.join(FORMATS)}, got {list(formats)!r}")
    return formats


def save_figure(
    name: str,
    fig,
    data: pd.DataFrame,
    params: dict,
    out: str | os.PathLike,
    *,
    quick: bool = False,
    formats=None,
    dpi: int | None = None,
    style=DEFAULT_STYLE,
) -> list[Path]:
    """Write ``NAME.csv``, the images in ``formats`` and the sidecar ``NAME.json`` to ``out``.

    Files are written atomically and reproducibly (no creation dates). ``dpi`` is the PNG
    resolution (default :data:`PNG_DPI`, :data:`QUICK_PNG_DPI` when ``quick``); ``style`` is
    recorded in the sidecar (the style the figure was drawn with).
    """
    formats = _check_formats(formats)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data_text = data.to_csv(index=False)
    csv = out / f"{name}.csv"
    _write_text(csv, data_text)
    dpi = int(dpi) if dpi else (QUICK_PNG_DPI if quick else PNG_DPI)
    images = plots.write_images(fig, out, name, formats, dpi)
    sidecar = _sidecar(name, params, data_text, quick, dpi, formats, style)
    side = out / f"{name}.json"
    _write_text(side, json.dumps(sidecar, indent=1) + "\n")
    return [csv, *images, side]


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


#: The analysis of the shipped experiment data (variance_lab.experiment.figure), which has
#: its own data set and sidecar format.
EXPERIMENT_FIGURE = FIGURE_NAME
#: Every figure ``variance-lab figures`` writes.
ALL_FIGURES = (*FIGURES, EXPERIMENT_FIGURE)


def _build(name: str, out: Path, params: dict | None, *, quick, engine, formats, dpi, style) -> list[Path]:
    """Compute, draw, save and close one figure (``params``: a sidecar's, or the defaults)."""
    if name == EXPERIMENT_FIGURE:  # drawn from the shipped data set (variance_lab.experiment)
        from variance_lab.experiment.figure import save_experiment_figure

        p = params or {"n_boot": 200 if quick else 1000, "seed": 0}
        return save_experiment_figure(
            out,
            n_boot=int(p["n_boot"]),
            seed=int(p["seed"]),
            formats=formats,
            dpi=dpi,
            style=style,
            quick=quick,
        )
    with report_style.use(style):
        fig, data, used = make_figure(name, params, quick=quick, engine=engine, style=None)
        try:
            return save_figure(name, fig, data, used, out, quick=quick, formats=formats, dpi=dpi, style=style)
        finally:
            _close(fig)


def make_all(
    out: str | os.PathLike,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    engine: Engine | None = None,
    progress: bool = True,
    formats=None,
    dpi: int | None = None,
    style=DEFAULT_STYLE,
) -> list[Path]:
    """Regenerate figures from scratch into ``out``; returns the files written.

    Parameters
    ----------
    out : str or Path
        Output folder (created when missing; its parent must exist). Every figure is built
        in a temporary folder beside it and moved into ``out`` only once all are done
        (:func:`publish`): an interrupted or failed run leaves ``out`` as it was.
    quick : bool
        Small grids and few draws (minutes for every figure; for previews and tests).
    only : sequence of str, optional
        A subset of :data:`ALL_FIGURES`.
    engine : Engine, optional
        Runs the Monte Carlo parts (default: threads on all cores; one engine for every figure).
    progress : bool
        Text progress over figures (one line each, on stderr).
    formats : sequence of str, optional
        Image formats, a subset of :data:`FORMATS` (default :data:`DEFAULT_FORMATS`).
    dpi : int, optional
        PNG resolution (default :data:`PNG_DPI`; :data:`QUICK_PNG_DPI` when ``quick``).
    style : None, str or path
        Matplotlib style to draw with (default :data:`DEFAULT_STYLE`, the package's paper style).
    """
    from tqdm import tqdm

    formats = _check_formats(formats)
    _style_name(style)
    names = list(ALL_FIGURES if only is None else only)
    for name in names:
        if name != EXPERIMENT_FIGURE:
            default_params(name)  # validates the name
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is not a folder")
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    build = out.parent / f".{out.name}.building.{os.getpid()}.{secrets.token_hex(4)}"
    build.mkdir()  # the usual permissions (0777 & ~umask), kept when renamed to out
    try:
        written: list[Path] = []
        with using_engine(engine) as eng:
            for name in tqdm(names, disable=not progress, unit="figure", desc="figures"):
                written += _build(
                    name, build, None, quick=quick, engine=eng, formats=formats, dpi=dpi, style=style
                )
        return publish(build, out, written)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def publish(build: Path, out: Path, written: Sequence[Path]) -> list[Path]:
    """Move the files ``written`` into ``build`` to ``out``: the last step of :func:`make_all`.

    A new ``out`` is the renamed ``build`` folder (one atomic step); into an existing
    ``out`` each file is moved with :func:`os.replace` (atomic per file), after every
    figure was built, so an interrupted run never leaves a partial folder or half a figure.
    """
    rel = [Path(p).relative_to(build) for p in written]
    if not out.exists():
        os.replace(build, out)
    else:
        for r in rel:
            (out / r).parent.mkdir(parents=True, exist_ok=True)
            os.replace(build / r, out / r)
    return [out / r for r in rel]


def read_sidecar(path: str | os.PathLike) -> dict:
    """Read a figure sidecar's contents; ``ValueError`` naming the file when it is not one."""
    path = Path(path)
    try:
        sidecar = json.loads(path.read_text())
        name, _ = sidecar["figure"], sidecar["params"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is not a figure sidecar: {exc}") from None
    if name not in ALL_FIGURES:
        raise ValueError(f"{str(path)!r}: unknown figure {name!r}; choose from {', '.join(ALL_FIGURES)}")
    return sidecar


def _sidecar_formats(sidecar: dict) -> tuple[str, ...]:
    files = sidecar.get("files", {})
    return tuple(ext for ext in FORMATS if ext in files) or DEFAULT_FORMATS


def from_sidecar(
    path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    engine: Engine | None = None,
    formats=None,
    dpi: int | None = None,
    style=None,
) -> list[Path]:
    """Rebuild the figure described by a sidecar JSON into ``out`` (default: its folder).

    Formats, PNG resolution and style default to the sidecar's own (older sidecars without
    a style: :data:`DEFAULT_STYLE`); every figure of :data:`ALL_FIGURES` can be rebuilt.
    """
    path = Path(path)
    sidecar = read_sidecar(path)
    name, params = sidecar["figure"], sidecar["params"]
    style = sidecar.get("style", DEFAULT_STYLE) if style is None else style
    return _build(
        name,
        path.parent if out is None else Path(out),
        params,
        quick=bool(sidecar.get("quick", False)),
        engine=engine,
        formats=_sidecar_formats(sidecar) if formats is None else formats,
        dpi=dpi or sidecar.get("png_dpi"),
        style=style,
    )


#: PNG resolution of the throw-away images :func:`check` draws (only the data are compared):
#: small, yet large enough for FreeType to size the smallest mathtext glyph (at 10 dpi a
#: subscript is under one pixel and matplotlib fails).
CHECK_DPI = 36


def check(path: str | os.PathLike, *, engine: Engine | None = None, only=None) -> list[SidecarCheck]:
    """Rebuild a sidecar's figure in a temporary folder and compare its data with the recorded data.

    Each data file (CSV) is compared number by number (:mod:`variance_lab.paper.compare`:
    ``identical``, ``equal within tolerance`` or ``differs``); the data SHA-256 stays a
    fingerprint, and differing package, library or machine versions are reported as notes.
    Writes nothing where the sidecar lives. ``path`` is a sidecar or a folder of them (every
    ``*.json`` that is a figure sidecar; with ``only``, a collection of figure names, just
    those figures' sidecars).

    Returns
    -------
    list of SidecarCheck
        One per sidecar; its ``ok`` is False when a data file differs.
    """
    import tempfile

    path = Path(path)
    sidecars = _sidecars_in(path) if path.is_dir() else {path: read_sidecar(path)}
    if only is not None and path.is_dir():
        wanted = set(only)
        sidecars = {p: old for p, old in sidecars.items() if old["figure"] in wanted}
    if not sidecars:
        raise ValueError(f"{str(path)!r} holds no figure sidecar")
    results = []
    for side, old in sidecars.items():
        with tempfile.TemporaryDirectory() as tmp:
            from_sidecar(side, tmp, engine=engine, formats=("png",), dpi=CHECK_DPI)
            new = json.loads((Path(tmp) / side.name).read_text())
            files = tuple(_compare_data(side.parent, Path(tmp), old, new))
        results.append(SidecarCheck(side.name, files, tuple(_version_notes(old, new))))
    return results


@dataclass(frozen=True)
class SidecarCheck:
    """What :func:`check` found for one sidecar: its data files' verdicts and version notes."""

    sidecar: str
    files: tuple[compare.FileComparison, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True unless a data file differs."""
        return all(f.ok for f in self.files)


def _data_files(sidecar: dict) -> list[str]:
    return [name for name in sidecar.get("files", {}).values() if str(name).endswith(".csv")]


def _compare_data(recorded: Path, rebuilt: Path, old: dict, new: dict):
    promise = compare.sampler_promise(old.get("versions", {}), new.get("versions", {}))
    level = float(old.get("params", {}).get("ci", 0.95))
    for name in _data_files(old):
        if not (recorded / name).is_file():
            yield compare.FileComparison(name, "differs", problems=(f"{str(recorded / name)!r} is missing",))
            continue
        if (recorded / name).read_bytes() == (rebuilt / name).read_bytes():
            yield compare.FileComparison(name, "identical")
            continue
        frames = pd.read_csv(recorded / name), pd.read_csv(rebuilt / name)
        yield compare.compare_frames(name, *frames, promise=promise, level=level)


def _version_notes(old: dict, new: dict) -> list[str]:
    lines = []
    if old.get("version") != new.get("version"):
        lines.append(f"variance_lab version differs: sidecar {old.get('version')}, now {new.get('version')}")
    before, now = old.get("versions", {}), new.get("versions", {})
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            what = key if key in ("machine", "cpu") else f"{key} version"
            lines.append(f"{what} differs: sidecar {before.get(key, 'not recorded')}, now {now.get(key)}")
    return lines


def _sidecars_in(folder: Path) -> dict[Path, dict]:
    """Every figure sidecar among ``folder``'s ``*.json`` files, read once, by path (sorted)."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            found[path] = read_sidecar(path)
        except ValueError:
            continue
    return found
