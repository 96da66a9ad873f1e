r"""Theory figures: maps over :math:`(\mu, \sigma^2)`, the approximations' errors, the Monte Carlo frontier.

Drawn from tidy theory frames only (:mod:`variance_lab.schema`), with the conventions of
:mod:`variance_lab.report.figures` (``ax=`` or ``fig=``, ``figsize``, ``style``, real values
on true log axes). :func:`heatmap` and :func:`decay_boundary` map a statistic over the
:math:`(\mu, \sigma^2)` grid; :func:`approx_error` draws the relative error of Var(G_T)'s
three approximations; :func:`mc_frontier` the largest :math:`T` a Monte Carlo budget of
``n`` draws can estimate Var(P_T) at.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import figure_kit as kit
from variance_lab.report import style as sty

__all__ = [
    "REL_ERROR_FLOOR",
    "approx_error",
    "decay_boundary",
    "frontier_frame",
    "heatmap",
    "mc_frontier",
    "relative_error_frame",
]

#: Relative errors below this are drawn at this floor and marked "exact": it sits above the
#: rounding of the theory values themselves (float64 path and mpmath agree to about 1e-13), so
#: an approximation that is exact draws at the floor whichever path computed it.
REL_ERROR_FLOOR = 1e-12


# ----------------------------------------------------------------------------- heatmap
def _edges(values: np.ndarray, log: bool) -> np.ndarray:
    v = np.log10(values) if log else values
    if len(v) == 1:
        mid = np.array([v[0] - 0.5, v[0] + 0.5])
    else:
        inner = (v[1:] + v[:-1]) / 2
        mid = np.concatenate([[2 * v[0] - inner[0]], inner, [2 * v[-1] - inner[-1]]])
    return 10**mid if log else mid


def _grid(rows: pd.DataFrame, values: str = "log10_value"):
    """(mu, sigma2, masked z, log sigma2 axis?) of rows over a (mu, sigma2) grid."""
    grid = rows.pivot_table(index="sigma2", columns="mu", values=values, aggfunc="first")
    mus, s2s = grid.columns.to_numpy(float), grid.index.to_numpy(float)
    z = np.ma.masked_invalid(grid.to_numpy(float))
    log_y = bool(s2s.min() > 0 and s2s.max() / s2s.min() > 20)
    return mus, s2s, z, log_y


def _decade_levels(z, most: int = 7) -> np.ndarray:
    """Contour levels (log10) at whole decades, at most ``most``; 1-2-5 steps when few decades."""
    if z.count() == 0:
        return np.array([])
    zmin, zmax = float(z.min()), float(z.max())
    lo, hi = math.ceil(zmin), math.floor(zmax)
    if hi - lo + 1 < 3:  # a range of a decade or two: 1, 2, 5 x 10^k
        k = np.arange(math.floor(zmin), math.ceil(zmax) + 1)
        levels = np.log10(np.outer(10.0**k, [1.0, 2.0, 5.0]).ravel())
        return levels[(levels > zmin) & (levels < zmax)]
    step = max(1, math.ceil((hi - lo + 1) / most))
    return np.arange(lo, hi + 1, step, dtype=float)


def _decade_label(level: float) -> str:
    k = math.floor(level + 1e-9)
    mantissa = round(10 ** (level - k))
    return f"$10^{{{k}}}$" if mantissa == 1 else f"${mantissa}\\times10^{{{k}}}$"


def _mark_mu_1(ax, mus) -> None:
    if mus.min() <= 1.0 <= mus.max():
        ax.axvline(1.0, color="black", lw=0.9, ls=(0, (4, 2)))
        ax.annotate(
            r"$\mu=1$",
            (1.0, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -3),
            textcoords="offset points",
            va="top",
            color="black",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
        )


def _boundary(ax, mus, s2s) -> None:
    """Draw the curve sigma^2 = 1 - mu^2 (below it, with mu < 1, Var(P_T) decays)."""
    mu_line = np.linspace(max(mus.min(), 0.0), min(mus.max(), 1.0), 200)
    s2_line = 1 - mu_line**2
    keep = (s2_line >= s2s.min()) & (s2_line <= s2s.max())
    if keep.sum() > 1:
        ax.plot(mu_line[keep], s2_line[keep], color="white", lw=2.6, zorder=4)
        ax.plot(
            mu_line[keep],
            s2_line[keep],
            color=sty.OKABE_ITO[5],
            lw=1.3,
            zorder=5,
            label=r"$\sigma^2 = 1-\mu^2$",
        )
        ax.legend(loc="lower left", framealpha=0.85, frameon=True, edgecolor="none")


def _heat_axes(ax, mus, s2s, log_y, title):
    ax.set_facecolor("0.85")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(r"mean ratio $\mu = E[r]$")
    ax.set_ylabel(r"ratio variance $\sigma^2 = \mathrm{Var}(r)$")
    if title:
        ax.set_title(title)


def heatmap(
    frame: pd.DataFrame,
    statistic: str = "var_P",
    *,
    T: int | None = None,
    ax=None,
    contours: bool = True,
    boundary: bool = True,
    figsize=None,
    style=None,
    **kwargs,
) -> Figure:
    r"""Plot an exact statistic over a mu x sigma^2 grid at one T: colour in decades, contours, mu = 1.

    The colour is :math:`\log_{10}` of the statistic (so a colour bar can span 60 decades);
    the colour bar is labelled in powers of ten (:func:`~variance_lab.report.style.log10_axis`).
    Contours at whole decades are labelled; the dashed line marks :math:`\mu = 1` and, with
    ``boundary``, the curve :math:`\sigma^2 = 1 - \mu^2` marks where Var(P_T) turns from decay
    (below it, with :math:`\mu < 1`) to growth. Pass ``vmin``/``vmax`` (log10) to share
    one colour scale between heat maps.

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
    contours : bool
        Labelled contours at whole decades.
    boundary : bool
        Draw :math:`\sigma^2 = 1 - \mu^2`.
    figsize, style, **kwargs
        Size and style as in :mod:`~variance_lab.report.figures`; ``**kwargs`` go to
        :meth:`~matplotlib.axes.Axes.pcolormesh` (``cmap``, ``vmin``, ``vmax``, ...).

    Returns
    -------
    matplotlib.figure.Figure
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
    with sty.use(style):
        fig, ax = kit.axes_or_new(ax, figsize, 2.8)
        mus, s2s, z, log_y = _grid(rows)
        mesh = ax.pcolormesh(
            _edges(mus, False),
            _edges(s2s, log_y),
            z,
            **{"cmap": sty.SEQUENTIAL_CMAP, "shading": "flat", **kwargs},
        )
        if contours and len(mus) > 1 and len(s2s) > 1:
            levels = _decade_levels(z)
            if len(levels):
                cs = ax.contour(mus, s2s, z, levels=levels, colors="white", linewidths=0.6)
                ax.clabel(cs, fmt=_decade_label, fontsize=sty.small_font(), inline_spacing=2)
        _mark_mu_1(ax, mus)
        if boundary:
            _boundary(ax, mus, s2s)
        cbar = fig.colorbar(mesh, ax=ax)
        sty.log10_axis(cbar.ax, "y")
        cbar.set_label(f"{kit.STAT_LABEL.get(statistic, statistic)} at $T={T}$")
        families = rows["family"].unique()
        _heat_axes(ax, mus, s2s, log_y, f"{families[0]} ratios, exact" if len(families) == 1 else "")
    return fig


def decay_boundary(
    frame: pd.DataFrame, T: tuple[int, int] | None = None, *, ax=None, figsize=None, style=None, **kwargs
) -> Figure:
    r"""Where Var(P_T) grows and where it decays: Var(P_{T2}) / Var(P_{T1}) over mu x sigma^2.

    Exactly, :math:`\mathrm{Var}(P_T) = (\sigma^2+\mu^2)^T - \mu^{2T}` decays in :math:`T`
    only when :math:`\sigma^2 + \mu^2 < 1`: the boundary is the curve
    :math:`\sigma^2 = 1 - \mu^2`, not the line :math:`\mu = 1`. The colour (diverging, centred
    on no change) is :math:`\log_{10}` of the ratio between two lengths; the black contour
    is where it equals 1, the red curve is :math:`\sigma^2 = 1 - \mu^2`.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_P`` / ``exact`` rows over a (mu, sigma2) grid at two lengths.
    T : (int, int), optional
        The two lengths (default: the frame's smallest and largest).
    ax : matplotlib.axes.Axes, optional
    figsize, style, **kwargs
        Size and style as in :mod:`~variance_lab.report.figures`; ``**kwargs`` go to
        :meth:`~matplotlib.axes.Axes.pcolormesh`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.colors import TwoSlopeNorm

    rows = frame[(frame["statistic"] == "var_P") & (frame["method"] == "exact")]
    Ts = sorted(int(t) for t in rows["T"].unique())
    if T is None:
        if len(Ts) < 2:
            raise ValueError(f"decay_boundary needs var_P rows at two lengths, got T = {Ts}")
        T = (Ts[0], Ts[-1])
    t1, t2 = (int(t) for t in T)
    if t1 not in Ts or t2 not in Ts or t1 >= t2:
        raise ValueError(f"T must be two lengths of the frame, smaller first; got {T!r}, frame has {Ts}")
    with sty.use(style):
        fig, ax = kit.axes_or_new(ax, figsize, 2.8)
        mus, s2s, z1, log_y = _grid(rows[rows["T"] == t1])
        z2 = _grid(rows[rows["T"] == t2])[2]
        z = z2 - z1
        span = max(float(np.abs(z).max()), 1e-12) if z.count() else 1.0
        kw = {"cmap": sty.DIVERGING_CMAP, "norm": TwoSlopeNorm(0.0, -span, span), "shading": "flat", **kwargs}
        mesh = ax.pcolormesh(_edges(mus, False), _edges(s2s, log_y), z, **kw)
        if len(mus) > 1 and len(s2s) > 1 and float(z.min()) < 0 < float(z.max()):
            ax.contour(mus, s2s, z, levels=[0.0], colors="black", linewidths=1.0, linestyles="--", zorder=6)
        _mark_mu_1(ax, mus)
        _boundary(ax, mus, s2s)
        handles, _labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="black", lw=1.0, ls="--", label="no change (contour)"))
        ax.legend(handles=handles, loc="lower left", framealpha=0.85, frameon=True, edgecolor="none")
        cbar = fig.colorbar(mesh, ax=ax)
        sty.log10_axis(cbar.ax, "y")
        cbar.set_label(rf"$\mathrm{{Var}}(P_{{{t2}}})\,/\,\mathrm{{Var}}(P_{{{t1}}})$")
        families = rows["family"].unique()
        title = f"{families[0]} ratios, exact: growth or decay" if len(families) == 1 else ""
        _heat_axes(ax, mus, s2s, log_y, title)
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
    approx = rows[rows["method"].isin(["lognormal", "delta", "naive"])]
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


def approx_error(frame: pd.DataFrame, *, fig=None, figsize=None, style=None, **kwargs) -> Figure:
    r"""Relative error :math:`|\mathrm{approx.}/\mathrm{exact} - 1|` of Var(G_T) against T, per family.

    The lognormal approximation, its small-:math:`x` form and the naive
    :math:`\sigma^2/T`; errors below :data:`REL_ERROR_FLOOR` (above the rounding of the theory values: the
    approximation is exact, as the lognormal one is for the lognormal family) are drawn
    at the floor and marked "exact".

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_G`` rows (``exact``, ``lognormal``, ``delta``, ``naive``) of one or more families.
    fig : matplotlib.figure.Figure, optional
    figsize : (float, float), optional
        Size of a new figure (default 3.4 in wide, 1.5 in per family).
    style : None, str or dict
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    err = relative_error_frame(frame)
    keys = kit.series_keys(err)
    with sty.use(style):
        fig = kit.figure_or_new(fig, figsize, 0.7 + 1.5 * max(len(keys), 1))
        axes = np.atleast_1d(fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0])
        for ax, key in zip(axes, keys, strict=True):
            family, mu, sigma2 = key
            sub = kit.rows_where(err, family=family, mu=mu, sigma2=sigma2)
            for method in ("lognormal", "delta", "naive"):
                m = sub[sub["method"] == method]
                y = np.maximum(np.abs(m["rel_error"].to_numpy(float)), REL_ERROR_FLOOR)
                ax.plot(m["T"], y, label=kit.METHOD_LABEL[method], **{**kit.METHOD_STYLE[method], **kwargs})
                if len(y) > 1 and (y[-2:] <= REL_ERROR_FLOOR).all():
                    ax.annotate(
                        "exact",
                        (m["T"].iloc[-1], REL_ERROR_FLOOR),
                        xytext=(-2, 3),
                        textcoords="offset points",
                        ha="right",
                        va="bottom",
                        fontsize=sty.small_font(),
                        color=kit.METHOD_STYLE[method]["color"],
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(REL_ERROR_FLOOR / 3, None)
            ax.set_title(kit.params_text(key), loc="left")
            ax.set_ylabel("rel. error")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=2)
        fig.supylabel(r"$|\mathrm{approx.}/\mathrm{exact} - 1|$ of $\mathrm{Var}(G_T)$")
        for ax in axes:
            ax.set_ylabel("")
        axes[-1].set_xlabel(kit.T_LABEL)
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
    for family, mu, sigma2 in kit.series_keys(rows):
        sub = kit.rows_where(rows, family=family, mu=mu, sigma2=sigma2)
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


def mc_frontier(
    frame: pd.DataFrame, n=None, *, ax=None, target: float | None = 0.1, figsize=None, style=None, **kwargs
) -> Figure:
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
    figsize, style, **kwargs
        Size and style as in :mod:`~variance_lab.report.figures`; ``**kwargs`` go to every frontier
        line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    n = np.logspace(2, 12, 101) if n is None else np.asarray(n, dtype=float)
    front = frontier_frame(frame, n)
    keys = kit.series_keys(front)
    varying = kit.varying_params(keys)
    with sty.use(style):
        fig, ax = kit.axes_or_new(ax, figsize, 3.0)
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = front[(front["family"] == family) & (front["mu"] == mu) & (front["sigma2"] == sigma2)]
            kw = {**sty.line_style(i), "markevery": 0.1, "ms": 3, "drawstyle": "steps-post", **kwargs}
            ax.plot(sub["n"], sub["T_max"], label=kit.series_label(key, varying), **kw)
        for t in (10, 100, 1000):
            ax.axhline(t, color="0.75", lw=0.5, ls=":", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Monte Carlo draws $n$")
        pct = f"{100 * target:g} %" if target else "the target"
        ax.set_ylabel("largest $T$ (tokens)")
        title = rf"largest $T$ where $n$ draws give Var$(P_T)$ to {pct}"
        common = kit.common_text(keys, varying)
        ax.set_title(title + (f"\n{common}" if common else ""))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
    return fig
