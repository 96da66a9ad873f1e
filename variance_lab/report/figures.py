"""Publication figures, drawn from tidy frames only.

Every function takes a tidy frame (:mod:`variance_lab.schema`; the histogram takes a
frame of histogram bins) and either ``ax=`` (one panel) or ``fig=`` (several panels),
creates a :class:`matplotlib.figure.Figure` one column wide when none is given, and
returns the figure. Nothing here computes theory or runs Monte Carlo: see
:mod:`variance_lab.paper.figures` for the data behind each figure.

Conventions: quantities that can leave float range are drawn from their
``log10_value`` on a linear axis labelled in powers of ten (:func:`style.log10_axis`);
Monte Carlo points carry their interval as error bars and are drawn hollow when flagged
unreliable.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style

__all__ = [
    "approx_error",
    "ess_vs_T",
    "frontier_frame",
    "heatmap",
    "log_histograms",
    "mc_frontier",
    "ratio_vs_T",
    "relative_error_frame",
    "variance_panels",
    "variance_vs_T",
]

_STAT_LABEL = {
    "var_P": r"$\mathrm{Var}(P_T)$",
    "var_G": r"$\mathrm{Var}(G_T)$",
    "var_ratio": r"$\mathrm{Var}(P_T)\,/\,\mathrm{Var}(G_T)$",
    "ess_frac_P": r"ESS fraction of $P_T$",
}
_METHOD_LABEL = {
    "exact": "exact",
    "lognormal": "lognormal approx.",
    "delta": r"small-$x$ form $\sigma_y^2 e^{2\mu_y}/T$",
    "seed": r"seed's $\sigma^2/T$",
    "monte_carlo": "Monte Carlo",
}
_METHOD_STYLE = {
    "exact": {"color": style.color(0), "ls": "-", "lw": 1.2},
    "lognormal": {"color": style.color(1), "ls": "--"},
    "delta": {"color": style.color(4), "ls": "-."},
    "seed": {"color": style.color(5), "ls": ":", "lw": 1.4},
}
T_LABEL = "sequence length $T$ (tokens)"
#: Relative errors below this are drawn at this floor (float64 resolution).
REL_ERROR_FLOOR = 1e-16


# ----------------------------------------------------------------------------- helpers
def _axes(ax, height: float = 2.4):
    """(figure, axes): the given axes, or a new one-column figure with one panel."""
    if ax is not None:
        return ax.figure, ax
    with style.paper():  # axes take tick and font sizes from rcParams when created
        fig = Figure(figsize=(style.COLUMN_WIDTH, height), layout="constrained")
        return fig, fig.add_subplot()


def _figure(fig, height: float) -> Figure:
    if fig is None:
        with style.paper():
            fig = Figure(figsize=(style.COLUMN_WIDTH, height), layout="constrained")
    return fig


def _rows(frame: pd.DataFrame, **equal) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, val in equal.items():
        mask &= (frame[col] == val).to_numpy()
    return frame[mask].sort_values("T")


def _series(frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    keys = frame[["family", "mu", "sigma2"]].drop_duplicates()
    return [(f, float(m), float(s)) for f, m, s in keys.itertuples(index=False)]


def _series_label(key: tuple[str, float, float], varying: set[str]) -> str:
    family, mu, sigma2 = key
    parts = []
    if "family" in varying:
        parts.append(family)
    if "mu" in varying:
        parts.append(rf"$\mu={mu:g}$")
    if "sigma2" in varying:
        parts.append(rf"$\sigma^2={sigma2:g}$")
    return ", ".join(parts) or family


def _varying(keys) -> set[str]:
    names = ("family", "mu", "sigma2")
    return {name for i, name in enumerate(names) if len({k[i] for k in keys}) > 1}


def _params_text(key: tuple[str, float, float]) -> str:
    family, mu, sigma2 = key
    return rf"{family}, $\mu={mu:g}$, $\sigma^2={sigma2:g}$"


def _log10_bounds(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """log10 of interval ends, clipped to the point when an end is <= 0 or missing."""
    y = rows["log10_value"].to_numpy(float)
    lo = style.clip_log10(rows["lo"].to_numpy(float), floor=-np.inf)
    hi = style.clip_log10(rows["hi"].to_numpy(float), floor=-np.inf)
    lo = np.where(np.isfinite(lo), np.minimum(lo, y), y)
    hi = np.where(np.isfinite(hi), np.maximum(hi, y), y)
    return lo, hi


def _mc_points(ax, rows: pd.DataFrame, color: str, x: str = "T") -> None:
    """Monte Carlo estimates (log10) with interval bars; hollow when unreliable."""
    if rows.empty:
        return
    lo, hi = _log10_bounds(rows)
    y = rows["log10_value"].to_numpy(float)
    xs = rows[x].to_numpy(float)
    ok = rows["reliable"].to_numpy(bool)
    for mask, face in ((ok, color), (~ok, "white")):
        if not mask.any():
            continue
        ax.errorbar(
            xs[mask],
            y[mask],
            yerr=[y[mask] - lo[mask], hi[mask] - y[mask]],
            color=color,
            mfc=face,
            mec=color,
            **style.ERRORBAR,
        )


def _mc_legend_handles(color: str = "0.2") -> list[Line2D]:
    return [
        Line2D([], [], marker="o", ls="", color=color, mfc=color, label="Monte Carlo, reliable"),
        Line2D([], [], marker="o", ls="", color=color, mfc="white", label="Monte Carlo, flagged unreliable"),
    ]


# ----------------------------------------------------------------------------- variance
def variance_vs_T(frame: pd.DataFrame, statistic: str = "var_P", *, ax=None, legend: bool = True) -> Figure:
    """Var(P_T) or Var(G_T) against T: exact line, the seed's approximations, Monte Carlo.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows of one (family, mu, sigma2): ``exact`` and approximation rows of
        ``statistic`` over a T grid, and optionally ``monte_carlo`` rows.
    statistic : {"var_P", "var_G"}
    ax : matplotlib.axes.Axes, optional
    legend : bool
        Draw a legend.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = _axes(ax)
    with style.paper():
        ax.set_xscale("log")
        rows = frame[frame["statistic"] == statistic]
        for method, kw in _METHOD_STYLE.items():
            sub = _rows(rows, method=method)
            if sub.empty:
                continue
            label = _METHOD_LABEL[method]
            if method == "exact" and statistic == "var_P":
                label = r"exact $(\sigma^2+\mu^2)^T-\mu^{2T}$ (= seed)"
            ax.plot(sub["T"], sub["log10_value"], label=label, **kw)
        mc = _rows(rows, method="monte_carlo")
        _mc_points(ax, mc, style.color(3))
        style.log10_axis(ax, "y")
        ax.set_xlabel(T_LABEL)
        ax.set_ylabel(f"{_STAT_LABEL[statistic]} (dimensionless)")
        if legend:
            handles, _ = ax.get_legend_handles_labels()
            if not mc.empty:
                handles += _mc_legend_handles(style.color(3))
            ax.legend(handles=handles, loc="upper left" if statistic == "var_P" else "lower left")
    return fig


def variance_panels(frame: pd.DataFrame, *, fig=None) -> Figure:
    """Two stacked panels: :func:`variance_vs_T` for Var(P_T) (top) and Var(G_T) (bottom)."""
    fig = _figure(fig, 4.6)
    with style.paper():
        top, bottom = fig.subplots(2, 1, sharex=True)
        variance_vs_T(frame, "var_P", ax=top)
        variance_vs_T(frame, "var_G", ax=bottom)
        top.set_xlabel("")
        keys = _series(frame)
        if len(keys) == 1:
            top.set_title(_params_text(keys[0]))
    return fig


def ratio_vs_T(frame: pd.DataFrame, *, ax=None) -> Figure:
    """Exact Var(P_T)/Var(G_T) against T, one line per (family, mu, sigma2).

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_ratio`` / ``exact`` rows, typically for mu < 1, mu = 1 and mu > 1.
    ax : matplotlib.axes.Axes, optional
    """
    fig, ax = _axes(ax)
    with style.paper():
        rows = _rows(frame, statistic="var_ratio", method="exact")
        keys = _series(rows)
        varying = _varying(keys)
        for i, key in enumerate(sorted(keys, key=lambda k: (k[0], k[1], k[2]))):
            family, mu, sigma2 = key
            sub = _rows(rows, family=family, mu=mu, sigma2=sigma2)
            regime = "<" if mu < 1 else (">" if mu > 1 else "=")
            label = _series_label(key, varying)
            if "mu" in varying:
                label += rf" ($\mu {regime} 1$)"
            ax.plot(sub["T"], sub["log10_value"], color=style.color(i + 1), label=label)
        ax.axhline(0.0, color="0.6", lw=0.6, ls=":")
        ax.set_xscale("log")
        style.log10_axis(ax, "y")
        ax.set_xlabel(T_LABEL)
        ax.set_ylabel(_STAT_LABEL["var_ratio"])
        if len(keys) and "mu" in varying and len(varying) == 1:
            family, _, sigma2 = keys[0]
            ax.set_title(rf"{family}, $\sigma^2={sigma2:g}$, exact")
        ax.legend(loc="best")
    return fig


# ----------------------------------------------------------------------------- heatmap
def _edges(values: np.ndarray, log: bool) -> np.ndarray:
    v = np.log10(values) if log else values
    if len(v) == 1:
        mid = np.array([v[0] - 0.5, v[0] + 0.5])
    else:
        inner = (v[1:] + v[:-1]) / 2
        mid = np.concatenate([[2 * v[0] - inner[0]], inner, [2 * v[-1] - inner[-1]]])
    return 10**mid if log else mid


def heatmap(frame: pd.DataFrame, statistic: str = "var_P", *, T: int | None = None, ax=None) -> Figure:
    """log10 of an exact statistic over a mu x sigma^2 grid at one T, mu = 1 marked.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``exact`` rows of one family over a (mu, sigma2) grid. Missing grid points (a
        family that cannot reach them) are left blank (grey).
    statistic : str
        ``var_P``, ``var_G``, ``var_ratio``, ...
    T : int, optional
        The sequence length; required when the frame holds several.
    ax : matplotlib.axes.Axes, optional
    """
    rows = frame[(frame["statistic"] == statistic) & (frame["method"] == "exact")]
    Ts = sorted(rows["T"].unique())
    if T is None:
        if len(Ts) != 1:
            raise ValueError(f"the frame holds several T ({Ts}); pass T=")
        T = int(Ts[0])
    rows = rows[rows["T"] == T]
    if rows.empty:
        raise ValueError(f"no exact {statistic} rows at T = {T}")
    fig, ax = _axes(ax, 2.7)
    with style.paper():
        grid = rows.pivot_table(index="sigma2", columns="mu", values="log10_value", aggfunc="first")
        mus, s2s = grid.columns.to_numpy(float), grid.index.to_numpy(float)
        z = np.ma.masked_invalid(grid.to_numpy(float))
        log_y = bool(s2s.min() > 0 and s2s.max() / s2s.min() > 20)
        mesh = ax.pcolormesh(
            _edges(mus, False),
            _edges(s2s, log_y),
            z,
            cmap=style.SEQUENTIAL_CMAP,
            shading="flat",
            rasterized=True,
        )
        ax.set_facecolor("0.85")
        if log_y:
            ax.set_yscale("log")
        if mus.min() <= 1.0 <= mus.max():
            ax.axvline(1.0, color="black", lw=1.6)
            ax.axvline(1.0, color="white", lw=0.8, ls=(0, (3, 2)))
            ax.annotate(
                r"$\mu=1$",
                (1.0, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2, -8),
                textcoords="offset points",
                color="white",
                fontsize=6.5,
            )
        cbar = fig.colorbar(mesh, ax=ax)
        style.log10_axis(cbar.ax, "y")
        cbar.set_label(f"{_STAT_LABEL.get(statistic, statistic)} at $T={T}$")
        ax.set_xlabel(r"mean ratio $\mu = E[r]$")
        ax.set_ylabel(r"ratio variance $\sigma^2 = \mathrm{Var}(r)$")
        families = rows["family"].unique()
        if len(families) == 1:
            ax.set_title(f"{families[0]}, exact")
    return fig


# ----------------------------------------------------------------------------- approximations
def relative_error_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Relative error ``approx / exact - 1`` of every Var(G_T) approximation in ``frame``.

    Returns
    -------
    pandas.DataFrame
        Columns family, mu, sigma2, T, method, rel_error.
    """
    rows = frame[frame["statistic"] == "var_G"]
    keys = ["family", "mu", "sigma2", "T"]
    exact = rows[rows["method"] == "exact"][[*keys, "value", "log10_value"]]
    approx = rows[rows["method"].isin(["lognormal", "delta", "seed"])]
    approx = approx[[*keys, "method", "value", "log10_value"]]
    both = approx.merge(exact, on=keys, suffixes=("", "_exact"))
    a, e = both["value"].to_numpy(float), both["value_exact"].to_numpy(float)
    linear = np.isfinite(a) & np.isfinite(e) & (a > 0) & (e > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        from_log = np.expm1((both["log10_value"] - both["log10_value_exact"]).to_numpy(float) * math.log(10))
        rel = np.where(linear, a / e - 1.0, from_log)
    out = both[[*keys, "method"]].copy()
    out["rel_error"] = rel
    return out.sort_values([*keys, "method"]).reset_index(drop=True)


def approx_error(frame: pd.DataFrame, *, fig=None) -> Figure:
    """|approximation / exact - 1| of Var(G_T) against T, one panel per family.

    The seed's lognormal approximation, its small-x form and the seed table's
    sigma^2/T; errors below :data:`REL_ERROR_FLOOR` (float64 resolution: the
    approximation is exact, as the lognormal one is for the lognormal family) are drawn
    at the floor.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_G`` rows (``exact``, ``lognormal``, ``delta``, ``seed``) of one or more families.
    fig : matplotlib.figure.Figure, optional
    """
    err = relative_error_frame(frame)
    keys = _series(err)
    fig = _figure(fig, 0.5 + 1.45 * max(len(keys), 1))
    with style.paper():
        axes = np.atleast_1d(fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0])
        for ax, key in zip(axes, keys, strict=True):
            family, mu, sigma2 = key
            sub = _rows(err, family=family, mu=mu, sigma2=sigma2)
            for method in ("lognormal", "delta", "seed"):
                m = sub[sub["method"] == method]
                y = np.maximum(np.abs(m["rel_error"].to_numpy(float)), REL_ERROR_FLOOR)
                ax.plot(m["T"], y, label=_METHOD_LABEL[method], **_METHOD_STYLE[method])
                if len(y) > 1 and (y[-2:] <= REL_ERROR_FLOOR).all():
                    ax.annotate(
                        "exact",
                        (m["T"].iloc[-1], REL_ERROR_FLOOR),
                        xytext=(-2, 3),
                        textcoords="offset points",
                        ha="right",
                        va="bottom",
                        fontsize=6,
                        color=_METHOD_STYLE[method]["color"],
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(REL_ERROR_FLOOR / 3, None)
            ax.text(0.02, 0.04, _params_text(key), transform=ax.transAxes, fontsize=6.5)
            ax.set_ylabel("|approx./exact − 1|")  # noqa: RUF001 - typographic minus in the label
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=2)
        axes[-1].set_xlabel(T_LABEL)
    return fig


# ----------------------------------------------------------------------------- frontier
def frontier_frame(frame: pd.DataFrame, n) -> pd.DataFrame:
    """Largest T at which ``n`` draws estimate Var(P_T) to the target relative error.

    From the exact ``n_needed_P`` rows of each (family, mu, sigma2): T_max(n) is where
    log10 n_needed_P(T), interpolated linearly between grid lengths, reaches log10 n,
    rounded down. NaN when even the smallest T of the grid needs more than n draws;
    the largest grid T, with ``beyond_grid`` set, when the whole grid needs fewer.

    Returns
    -------
    pandas.DataFrame
        Columns family, mu, sigma2, n, T_max, beyond_grid.
    """
    n = np.asarray(n, dtype=float).ravel()
    rows = frame[(frame["statistic"] == "n_needed_P") & (frame["method"] == "exact")]
    parts = []
    for family, mu, sigma2 in _series(rows):
        sub = _rows(rows, family=family, mu=mu, sigma2=sigma2)
        Ts = sub["T"].to_numpy(float)
        need = np.maximum.accumulate(sub["log10_value"].to_numpy(float))
        log_n = np.log10(n)
        t_max = np.floor(np.interp(log_n, need, Ts) + 1e-9)
        t_max[log_n < need[0]] = np.nan
        beyond = log_n >= need[-1]
        parts.append(
            pd.DataFrame(
                {"family": family, "mu": mu, "sigma2": sigma2, "n": n, "T_max": t_max, "beyond_grid": beyond}
            )
        )
    return pd.concat(parts, ignore_index=True)


def mc_frontier(frame: pd.DataFrame, n=None, *, ax=None, target: float | None = 0.1) -> Figure:
    """Plot the Monte Carlo reliability frontier: largest T where n draws give Var(P_T) to 10 %.

    Parameters
    ----------
    frame : pandas.DataFrame
        Exact ``n_needed_P`` rows over a dense T grid, per (family, mu, sigma2).
    n : array_like, optional
        Draws (default 10^2 ... 10^12).
    ax : matplotlib.axes.Axes, optional
    target : float, optional
        The target relative error the rows were computed for (axis label only).
    """
    n = np.logspace(2, 12, 101) if n is None else np.asarray(n, dtype=float)
    front = frontier_frame(frame, n)
    keys = _series(front)
    varying = _varying(keys)
    fig, ax = _axes(ax, 2.5)
    styles = {"lognormal": "-", "gamma": "--", "two-point": ":"}
    with style.paper():
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = front[(front["family"] == family) & (front["mu"] == mu) & (front["sigma2"] == sigma2)]
            ax.plot(
                sub["n"],
                sub["T_max"],
                ls=styles.get(family, "-."),
                color=style.color(i + 1),
                label=_series_label(key, varying),
                drawstyle="steps-post",
            )
        for t in (10, 100, 1000):
            ax.axhline(t, color="0.75", lw=0.5, ls=":", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Monte Carlo draws $n$")
        pct = f"{100 * target:g} %" if target else "the target"
        ax.set_ylabel("largest $T$ (tokens)")
        title = rf"$n$ draws estimate Var$(P_T)$ to {pct}"
        if len(keys) and "mu" not in varying:
            title += rf" ($\mu={keys[0][1]:g}$)"
        ax.set_title(title)
        ax.legend(loc="upper left")
    return fig


# ----------------------------------------------------------------------------- ESS
def ess_vs_T(frame: pd.DataFrame, *, ax=None, n: int | None = None) -> Figure:
    """Kong's ESS fraction of the weights P_T against T: exact lines, Monte Carlo points.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``ess_frac_P`` rows, ``exact`` and optionally ``monte_carlo``, per (family, mu, sigma2).
    ax : matplotlib.axes.Axes, optional
    n : int, optional
        Draws of the Monte Carlo points: draws the floor 1/n (one draw holds all weight).
    """
    fig, ax = _axes(ax, 2.5)
    with style.paper():
        rows = frame[frame["statistic"] == "ess_frac_P"]
        keys = _series(rows)
        varying = _varying(keys)
        any_mc = False
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = rows[(rows["family"] == family) & (rows["mu"] == mu) & (rows["sigma2"] == sigma2)]
            exact = _rows(sub, method="exact")
            col = style.color(i + 1)
            ax.plot(exact["T"], exact["log10_value"], color=col, label=_series_label(key, varying))
            mc = _rows(sub, method="monte_carlo")
            any_mc |= not mc.empty
            _mc_points(ax, mc, col)
        if n:
            label = rf"$1/n$, $n={n:.0e}$".replace("+0", "")
            ax.axhline(-math.log10(n), color="0.4", lw=0.7, ls="--", label=label)
            bottom = -max(12.0, 2 * math.log10(n))
            ax.set_ylim(max(ax.get_ylim()[0], bottom), 0.5)
        ax.set_xscale("log")
        style.log10_axis(ax, "y")
        ax.set_xlabel(T_LABEL)
        ax.set_ylabel(rf"{_STAT_LABEL['ess_frac_P']} (ESS$/n$)")
        handles, _ = ax.get_legend_handles_labels()
        if any_mc:
            handles += _mc_legend_handles()
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    return fig


# ----------------------------------------------------------------------------- histograms
def log_histograms(frame: pd.DataFrame, *, fig=None) -> Figure:
    """Histograms of log P_T (top) and log G_T = log P_T / T (bottom) at a few T.

    Parameters
    ----------
    frame : pandas.DataFrame
        Histogram bins: columns ``T``, ``quantity`` (``log_P`` or ``log_G``), ``lo``,
        ``hi`` (bin edges) and ``density`` (as :func:`variance_lab.paper.figures.histogram_frame`
        makes from draws).
    fig : matplotlib.figure.Figure, optional
    """
    fig = _figure(fig, 4.2)
    labels = {"log_P": r"$\log P_T$", "log_G": r"$\log G_T = \log P_T\,/\,T$"}
    with style.paper():
        axes = fig.subplots(2, 1)
        Ts = sorted(frame["T"].unique())
        for ax, quantity in zip(axes, ("log_P", "log_G"), strict=True):
            for i, T in enumerate(Ts):
                sub = frame[(frame["T"] == T) & (frame["quantity"] == quantity)].sort_values("lo")
                if sub.empty:
                    continue
                edges = np.append(sub["lo"].to_numpy(float), sub["hi"].to_numpy(float)[-1])
                ax.stairs(
                    sub["density"].to_numpy(float),
                    edges,
                    color=style.color(i + 1),
                    lw=1.0,
                    label=f"$T={int(T)}$",
                )
            ax.set_yscale("log")
            top = frame.loc[frame["quantity"] == quantity, "density"].max()
            if np.isfinite(top) and top > 0:
                ax.set_ylim(top * 1e-3, top * 2)
            ax.set_xlabel(f"{labels[quantity]} (nats)")
            ax.set_ylabel("density (per nat)")
        axes[0].legend(loc="upper left")
    return fig
