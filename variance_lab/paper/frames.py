"""The tidy data behind each figure of :mod:`variance_lab.paper.catalog`, computed from scratch.

The data come from :mod:`variance_lab.theory` and the Monte Carlo engine
(:func:`variance_lab.simulate.simulate`; raw draws through the engine's own samplers,
:func:`variance_lab.simulate.draw_log_p`, :func:`sample_log_P`), the corrections
(:mod:`variance_lab.corrections`) and the analysis of the shipped data sets
(:func:`clip_analysis`). An :class:`~variance_lab.simulate.Engine` passed as ``engine=`` says
where Monte Carlo chunks run; the sampler of a figure is part of its parameters (``"sampler"``,
default ``"token"``), so that its sidecar reproduces it whatever engine runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import corrections, theory
from variance_lab.experiment.names import DATA_DIR
from variance_lab.families import Family, get_family
from variance_lab.paper.catalog import FIGURES
from variance_lab.paper.method_frames import panel_row, sign_frame, speed_bounds_frame, vcpo_frame
from variance_lab.simulate import Engine, draw_log_p, resolve_sampler, simulate, using_engine
from variance_lab.sweep import plan

__all__ = [
    "METHOD_FRAMES",
    "clip_analysis",
    "clip_columns",
    "clip_frame",
    "corrections_frame",
    "figure_data",
    "histogram_frame",
    "sample_log_P",
    "threshold_frame",
    "with_resampled_gspo",
]


#: The frames of the 2025-26 methods' figures (:mod:`variance_lab.paper.method_frames`), by figure.
METHOD_FRAMES = {"sign_weights": sign_frame, "vcpo_ess": vcpo_frame, "speed_bounds": speed_bounds_frame}


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
    if name == "thresholds":
        return threshold_frame(p)
    if name in METHOD_FRAMES:
        return METHOD_FRAMES[name](p)
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
    from variance_lab.rollouts.split import ratio_batch

    path = Path(p["data"])
    if not path.is_file():
        path = DATA_DIR / p["data"]
    batch = load_batch(path)
    log_r = ratio_batch(batch, p.get("ratio", "mismatch")).log_ratio
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


def clip_analysis(params: dict, *, progress: bool | None = False):
    """Run :func:`variance_lab.rollouts.analysis.analyze` on the data set of the ``clip_fractions`` figure.

    ``params["data"]`` is a file name in the source tree's ``data/`` folder (the shipped
    ``arith_rollouts.jsonl.gz``) or a path; ``n_boot``, ``level`` and ``seed`` are the
    bootstrap's. ``progress`` is :func:`~variance_lab.rollouts.analysis.analyze`'s
    (:mod:`variance_lab.progress`); no bar by default: the figures pipeline shows its own, and an
    executed notebook keeps no progress widget.

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
        batch,
        n_boot=int(params["n_boot"]),
        level=float(params["level"]),
        seed=int(params["seed"]),
        folds=0,
        progress=progress,
    )


def _clip_data_path(params: dict) -> Path:
    """Return the data file of the ``clip_fractions`` figure (a bare name: in the shipped data folder)."""
    path = Path(params["data"])
    if not path.is_absolute() and path.parent == Path():
        path = DATA_DIR / path
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


def threshold_frame(params: dict) -> pd.DataFrame:
    """Tidy rows of the ``thresholds`` figure (:mod:`variance_lab.report.threshold_figure`).

    CTPO: :func:`variance_lab.corrections.ctpo_positions` at the positions ``t`` (exact),
    :func:`variance_lab.corrections.simulate_positions` at ``mc_t`` (``n`` sequences), and
    :func:`variance_lab.corrections.find_T` at one half (``binding``). M2PO: the large-batch
    ``frac_modified`` of :func:`variance_lab.corrections.theory` at each ``tau``, and
    :func:`variance_lab.corrections.simulate_corrections` of ``m2po:TAU:B`` on ``m2po_n``
    one-token sequences (a batch of ``B`` tokens) at each ``mc_tau`` and ``B`` of ``batches``.
    """
    p = params
    family = get_family(p["family"], p["mu"], p["sigma2"])
    seed, ci = int(p["seed"]), float(p["ci"])
    rows = []
    t_max = max(p["t"])
    for spec in p["ctpo"]:
        exact = corrections.ctpo_positions(family, spec, t_max).set_index("t")
        rows += [panel_row("ctpo", spec, t, "exact", exact.frac_clipped[t]) for t in p["t"]]
        if p.get("n"):
            mc = corrections.simulate_positions(family, spec, max(p["mc_t"]), int(p["n"]), seed=seed, ci=ci)
            mc = mc.set_index("t")
            rows += [
                panel_row(
                    "ctpo",
                    spec,
                    t,
                    "monte_carlo",
                    *mc.loc[t, ["mc_frac_modified", "mc_frac_modified_lo", "mc_frac_modified_hi"]],
                )
                for t in p["mc_t"]
            ]
        bind = corrections.find_T(family, spec, 0.5)
        if bind is not None:
            rows.append(panel_row("ctpo", spec, bind, "binding", 0.5))
    limit = f"large-batch limit, $\\sigma^2 = {p['sigma2']:g}$"
    th = corrections.theory(family, [1], [f"m2po:{tau!r}" for tau in p["tau"]])
    rows += [
        panel_row("m2po", limit, tau, "exact", f) for tau, f in zip(p["tau"], th.frac_modified, strict=True)
    ]
    if p.get("m2po_n"):
        specs = [f"m2po:{tau!r}:{int(b)}" for b in p["batches"] for tau in p["mc_tau"]]
        mc = corrections.simulate_corrections(family, [1], specs, int(p["m2po_n"]), seed=seed, ci=ci)
        for r, (b, tau) in zip(
            mc.itertuples(index=False), [(b, tau) for b in p["batches"] for tau in p["mc_tau"]], strict=True
        ):
            rows.append(
                panel_row(
                    "m2po",
                    f"batch of {int(b)} tokens",
                    tau,
                    "monte_carlo",
                    r.mc_frac_modified,
                    r.mc_frac_modified_lo,
                    r.mc_frac_modified_hi,
                    r.mc_reliable,
                )
            )
    return pd.DataFrame(rows)
