r"""Publication figures, drawn from tidy frames only.

Every function takes a tidy frame (:mod:`variance_lab.schema`; the histogram takes a
frame of histogram bins) and either ``ax=`` (one panel) or ``fig=`` (several panels). When
neither is given it creates a figure through :mod:`matplotlib.pyplot` (so ``plt.gcf()`` and
``plt.savefig`` see it), ``figsize`` wide and high (default one column, 3.4 in). It returns
the :class:`~matplotlib.figure.Figure`. Nothing here computes theory or runs Monte Carlo:
see :func:`variance_lab.paper.frames.figure_data` for the data behind each figure of the paper.

Modules. This module draws the quantities against :math:`T` with their Monte Carlo points
and writes images; the theory figures (maps over :math:`(\mu, \sigma^2)`, the
approximations' errors, the Monte Carlo frontier) are drawn in
:mod:`variance_lab.report.theory_figures` and importable from here too; the parts both
share (labels, line styles, Monte Carlo points) are in :mod:`variance_lab.report.figure_kit`.

Styling. The functions draw with the caller's rcParams, so :func:`matplotlib.pyplot.rc_context`
and style sheets apply; ``style="paper"`` applies the package's paper style sheet
(:data:`variance_lab.report.style.STYLE_FILE`) and any other ``style`` is a matplotlib
style name or file. Colours are the Okabe-Ito palette, and every series also differs in
line style or marker, so the figures read in greyscale. Extra ``**kwargs`` go to the main
artists (the exact lines, the heat map's mesh, the histogram steps).

Axes. Quantities are drawn as real values on true log axes (``set_yscale("log")``), so
one's own data can be overlaid as they are. Values beyond float range (Var(P_T) at
T = 10^4 and more) cannot be drawn that way; they are left out of the line (their
``log10_value`` stays in the data).

Names. Var(G_T) has three approximations: the lognormal approximation
:math:`(e^{\sigma_y^2/T} - 1)\,e^{2\mu_y + \sigma_y^2/T}` (exact for lognormal ratios),
its small-:math:`x` form :math:`\sigma_y^2 e^{2\mu_y}/T`, and the naive
:math:`\sigma^2/T` printed in the source derivation's table. Monte Carlo points carry their
interval as error bars and are drawn filled when reliable, half filled when flagged marginal
(a sound value whose interval may cover less than its level) and hollow when flagged
unreliable (too few draws to confirm the value, though it may lie on the exact line); the
legend says which is which.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab._atomic import atomic_write
from variance_lab.report import style as sty
from variance_lab.report.figure_kit import (  # T_LABEL, new_figure: public names of this module too
    MC_COLOR,
    METHOD_LABEL,
    METHOD_STYLE,
    STAT_LABEL,
    T_LABEL,
    axes_or_new,
    common_text,
    figure_or_new,
    log_x_T,
    mc_legend_handles,
    mc_points,
    n_text,
    new_figure,
    params_text,
    real_values,
    rows_where,
    series_keys,
    series_label,
    varying_params,
)
from variance_lab.report.theory_figures import (  # public names of this module, drawn there
    approx_error,
    decay_boundary,
    frontier_frame,
    heatmap,
    mc_frontier,
    relative_error_frame,
)

__all__ = [
    "T_LABEL",
    "approx_error",
    "approx_ratio",
    "decay_boundary",
    "ess_vs_T",
    "frontier_frame",
    "heatmap",
    "log_histograms",
    "mc_frontier",
    "new_figure",
    "ratio_vs_T",
    "relative_error_frame",
    "variance_panels",
    "variance_vs_T",
    "write_images",
]


def write_images(fig, out: str | Path, name: str, formats, dpi: int) -> list[Path]:
    """Write ``fig`` as ``out/NAME.EXT`` for each format, atomically and without dates; closes nothing."""
    out = Path(out)
    paths = []
    for ext in formats:
        path = out / f"{name}.{ext}"
        meta = {"CreationDate": None} if ext == "pdf" else ({"Date": None} if ext == "svg" else None)
        kwargs = {"metadata": meta} if meta else {}
        if ext == "png":
            kwargs["dpi"] = dpi
        atomic_write(path, lambda tmp, ext=ext, kwargs=kwargs: fig.savefig(tmp, format=ext, **kwargs))
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- variance
def variance_vs_T(
    frame: pd.DataFrame,
    statistic: str = "var_P",
    *,
    ax=None,
    legend: bool = True,
    approximations: bool = True,
    figsize=None,
    style=None,
    **kwargs,
) -> Figure:
    r"""Var(P_T) or Var(G_T) against T on log-log axes: exact line, approximations, Monte Carlo.

    Var(P_T) is exactly :math:`(\sigma^2+\mu^2)^T - \mu^{2T}`; Var(G_T) is drawn exact with,
    when ``approximations``, the lognormal approximation, its small-:math:`x` form and the
    naive :math:`\sigma^2/T` (they overlap the exact line within 15 %; :func:`approx_ratio`
    shows their ratio to it).

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows of one (family, mu, sigma2): ``exact`` and approximation rows of
        ``statistic`` over a T grid, and optionally ``monte_carlo`` rows.
    statistic : {"var_P", "var_G"}
    ax : matplotlib.axes.Axes, optional
    legend : bool
        Draw a legend.
    approximations : bool
        Draw the approximation rows (``lognormal``, ``delta``, ``naive``) as lines.
    figsize : (float, float), optional
        Size of a new figure (default 3.4 x 2.4 in).
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package style; else a matplotlib style.
    **kwargs
        Passed to the exact line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with sty.use(style):
        fig, ax = axes_or_new(ax, figsize)
        rows = frame[frame["statistic"] == statistic]
        methods = ["exact", *(["lognormal", "delta", "naive"] if approximations else [])]
        for method in methods:
            sub = rows_where(rows, method=method)
            if sub.empty:
                continue
            label = METHOD_LABEL[method]
            if method == "exact" and statistic == "var_P":
                label = r"exact $(\sigma^2+\mu^2)^T-\mu^{2T}$"
            kw = {**METHOD_STYLE[method], **(kwargs if method == "exact" else {})}
            ax.plot(sub["T"], real_values(sub), label=label, **kw)
        mc = rows_where(rows, method="monte_carlo")
        flagged = mc_points(ax, mc, MC_COLOR)
        ax.set_yscale("log")
        log_x_T(ax)
        ax.set_ylabel(STAT_LABEL[statistic])
        if legend:
            handles, _ = ax.get_legend_handles_labels()
            if not mc.empty:
                handles += mc_legend_handles(MC_COLOR, flagged)
            ax.legend(handles=handles, loc="upper left" if statistic == "var_P" else "lower left")
    return fig


def approx_ratio(frame: pd.DataFrame, *, ax=None, legend: bool = True, figsize=None, style=None, **kwargs):
    r"""Each Var(G_T) approximation, and Monte Carlo, as a ratio to the exact Var(G_T), against T.

    Where the approximations overlap the exact line on a log axis (within 15 %), their
    ratio to it shows the difference: the naive :math:`\sigma^2/T` of the source derivation
    stays 13-15 % off for lognormal ratios at :math:`\mu = 1`, :math:`\sigma^2 = 0.1`.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_G`` rows of one (family, mu, sigma2): ``exact``, approximations, optionally
        ``monte_carlo``.
    ax : matplotlib.axes.Axes, optional
    legend : bool
    figsize, style, **kwargs
        Size and style as in the module docstring; ``**kwargs`` go to every approximation line's
        :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
        The figure of ``ax`` (or a new one): one panel, each approximation over the exact value.
    """
    with sty.use(style):
        fig, ax = axes_or_new(ax, figsize, 2.0)
        rows = frame[frame["statistic"] == "var_G"]
        exact = rows_where(rows, method="exact")
        by_T = pd.Series(real_values(exact), index=exact["T"].to_numpy())
        ax.axhline(1.0, color="0.6", lw=0.6, zorder=0)
        for method in ("lognormal", "delta", "naive"):
            sub = rows_where(rows, method=method)
            sub = sub[sub["T"].isin(by_T.index)]
            if sub.empty:
                continue
            ratio = real_values(sub) / by_T.loc[sub["T"]].to_numpy()
            ax.plot(sub["T"], ratio, label=METHOD_LABEL[method], **{**METHOD_STYLE[method], **kwargs})
        mc = rows_where(rows, method="monte_carlo")
        mc = mc[mc["T"].isin(by_T.index)]
        flagged = mc_points(ax, mc, MC_COLOR, scale=by_T.loc[mc["T"]].to_numpy()) if len(mc) else set()
        log_x_T(ax)
        ax.set_ylabel(r"$\mathrm{Var}(G_T)$ / exact")
        if legend:
            handles, _ = ax.get_legend_handles_labels()
            if not mc.empty:
                handles += mc_legend_handles(MC_COLOR, flagged)
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncols=2)
    return fig


def variance_panels(frame: pd.DataFrame, *, fig=None, n=None, figsize=None, style=None, **kwargs) -> Figure:
    """Three stacked panels: Var(P_T), Var(G_T) (exact and Monte Carlo) and the approximations' ratio.

    Parameters
    ----------
    frame : pandas.DataFrame
        Rows of one (family, mu, sigma2) as for :func:`variance_vs_T`.
    fig : matplotlib.figure.Figure, optional
    n : int, optional
        Monte Carlo draws per point, shown in the title.
    figsize : (float, float), optional
        Size of a new figure (default 3.4 x 6.4 in).
    style : None, str or dict
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to the exact lines.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with sty.use(style):
        fig = figure_or_new(fig, figsize, 6.4)
        top, middle, bottom = fig.subplots(3, 1, sharex=True, height_ratios=[1.2, 1.0, 0.9])
        variance_vs_T(frame, "var_P", ax=top, **kwargs)
        variance_vs_T(frame, "var_G", ax=middle, approximations=False, **kwargs)
        approx_ratio(frame, ax=bottom)
        for ax in (top, middle):
            ax.set_xlabel("")
        for ax, letter in zip((top, middle, bottom), "abc", strict=True):
            ax.set_title(f"({letter})", loc="left", fontweight="bold")
        keys = series_keys(frame)
        if len(keys) == 1:
            mc = (frame["method"] == "monte_carlo").any()
            text = params_text(keys[0]) + (f"; Monte Carlo {n_text(n)} draws" if mc and n else "")
            fig.suptitle(text)
    return fig


def ratio_vs_T(
    frame: pd.DataFrame, *, fig=None, ax=None, zoom: int | None = 50, figsize=None, style=None, **kwargs
):
    """Exact Var(P_T)/Var(G_T) against T, one line per (family, mu, sigma2).

    With ``zoom`` (and no ``ax``) a second panel shows T <= ``zoom`` on its own scale, where
    the full range (over a hundred decades at T = 1000) would squash it flat.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``var_ratio`` / ``exact`` rows, typically for mu < 1, mu = 1 and mu > 1.
    fig : matplotlib.figure.Figure, optional
    ax : matplotlib.axes.Axes, optional
        One panel, full range only.
    zoom : int or None
        Largest T of the zoomed panel; None for one panel.
    figsize, style, **kwargs
        Size and style as in the module docstring; ``**kwargs`` go to every line's
        :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with sty.use(style):
        rows = rows_where(frame, statistic="var_ratio", method="exact")
        keys = sorted(series_keys(rows), key=lambda k: (k[0], k[1], k[2]))
        varying = varying_params(keys)
        if ax is not None or zoom is None or rows.empty or rows["T"].max() <= zoom:
            new = fig is None or ax is not None
            fig, ax = axes_or_new(ax, figsize, 2.4) if new else (fig, fig.add_subplot())
            axes = [ax]
        else:
            fig = figure_or_new(fig, figsize, 4.2)
            axes = list(fig.subplots(2, 1))
        for k, panel in enumerate(axes):
            sub_rows = rows if k == 0 else rows[rows["T"] <= zoom]
            for i, key in enumerate(keys):
                family, mu, sigma2 = key
                sub = rows_where(sub_rows, family=family, mu=mu, sigma2=sigma2)
                label = series_label(key, varying)
                if "mu" in varying and mu != 1:
                    label += rf" ($\mu {'<' if mu < 1 else '>'} 1$)"
                kw = {**sty.line_style(i), "markevery": 0.1, "ms": 3, **kwargs}
                panel.plot(sub["T"], real_values(sub), label=label, **kw)
            panel.axhline(1.0, color="0.6", lw=0.6, ls=":")
            panel.set_yscale("log")
            log_x_T(panel)
            panel.set_ylabel(STAT_LABEL["var_ratio"])
        if len(axes) == 2:
            axes[1].set_title(f"zoom: $T \\leq {zoom}$", loc="left")
        axes[0].legend(loc="best")
        if keys:
            common = common_text(keys, varying)
            axes[0].set_title(f"{common}, exact" if common else "exact")
    return fig


# ----------------------------------------------------------------------------- ESS
def ess_vs_T(
    frame: pd.DataFrame, *, ax=None, n: int | None = None, figsize=None, style=None, **kwargs
) -> Figure:
    r"""Kong's ESS fraction of the weights P_T against T: exact lines, Monte Carlo points.

    Exactly :math:`(E P_T)^2 / E[P_T^2] = e^{T(2K(1) - K(2))}`, which is
    :math:`(1 + \sigma^2/\mu^2)^{-T}` for every family.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``ess_frac_P`` rows, ``exact`` and optionally ``monte_carlo``, per (family, mu, sigma2).
    ax : matplotlib.axes.Axes, optional
    n : int, optional
        Draws of the Monte Carlo points: draws the floor 1/n (one draw holds all weight)
        and names n in the title.
    figsize, style, **kwargs
        Size and style as in the module docstring. The exact lines are drawn with
        :meth:`~matplotlib.axes.Axes.plot`, which takes ``**kwargs``.

    Returns
    -------
    matplotlib.figure.Figure
        Kong's ESS fraction of the weights against T, on ``ax``'s figure or a new one.
    """
    with sty.use(style):
        fig, ax = axes_or_new(ax, figsize, 2.9)
        rows = frame[frame["statistic"] == "ess_frac_P"]
        keys = series_keys(rows)
        varying = varying_params(keys)
        any_mc, flagged, series = False, set(), []
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = rows[(rows["family"] == family) & (rows["mu"] == mu) & (rows["sigma2"] == sigma2)]
            exact = rows_where(sub, method="exact")
            line = sty.line_style(i)
            marker = line.pop("marker")
            (drawn,) = ax.plot(exact["T"], real_values(exact), **{**line, **kwargs})
            mc = rows_where(sub, method="monte_carlo")
            any_mc |= not mc.empty
            flagged |= mc_points(ax, mc, line["color"], marker=marker)
            # the legend shows the series' marker with its line where it has Monte Carlo points
            kw = {"color": drawn.get_color(), "ls": drawn.get_linestyle(), "lw": drawn.get_linewidth()}
            shown = {"marker": marker, "mfc": drawn.get_color()} if not mc.empty else {}
            series.append(Line2D([], [], label=series_label(key, varying), **kw, **shown))
        if n:
            ax.axhline(
                1.0 / n, color="0.4", lw=0.7, ls=(0, (6, 2)), label=r"$1/n$ (one draw holds all weight)"
            )
            bottom = -max(12.0, 2 * math.log10(n))
            ax.set_ylim(max(ax.get_ylim()[0], 10.0**bottom), 3.0)
        ax.set_yscale("log")
        log_x_T(ax)
        ax.set_ylabel(rf"{STAT_LABEL['ess_frac_P']} (ESS$/n$)")
        handles = series + ax.get_legend_handles_labels()[0]
        if any_mc:
            handles += mc_legend_handles("0.3", flagged)
        common = common_text(keys, varying)
        title = ", ".join(t for t in (common, f"Monte Carlo {n_text(n)} draws" if any_mc and n else "") if t)
        if title:
            ax.set_title(title)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
    return fig


# ----------------------------------------------------------------------------- histograms
def log_histograms(
    frame: pd.DataFrame, *, fig=None, title: str | None = None, figsize=None, style=None, **kwargs
):
    """Histograms of log P_T (top) and log G_T = log P_T / T (bottom) at a few T.

    Parameters
    ----------
    frame : pandas.DataFrame
        Histogram bins: columns ``T``, ``quantity`` (``log_P`` or ``log_G``), ``lo``,
        ``hi`` (bin edges) and ``density`` (as :func:`variance_lab.paper.frames.histogram_frame`
        makes from draws).
    fig : matplotlib.figure.Figure, optional
    title : str, optional
        Figure title (the family, its parameters and the draws: the bins do not carry them).
    figsize, style, **kwargs
        Size and style as in the module docstring; ``**kwargs`` go to every
        :meth:`~matplotlib.axes.Axes.stairs`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    labels = {"log_P": r"$\log P_T$", "log_G": r"$\log G_T = \log P_T\,/\,T$"}
    with sty.use(style):
        fig = figure_or_new(fig, figsize, 4.4)
        axes = fig.subplots(2, 1)
        Ts = sorted(frame["T"].unique())
        for ax, quantity in zip(axes, ("log_P", "log_G"), strict=True):
            for i, T in enumerate(Ts):
                sub = frame[(frame["T"] == T) & (frame["quantity"] == quantity)].sort_values("lo")
                if sub.empty:
                    continue
                edges = np.append(sub["lo"].to_numpy(float), sub["hi"].to_numpy(float)[-1])
                line = sty.line_style(i)
                line.pop("marker")
                kw = {"color": line["color"], "ls": line["ls"], "lw": 1.1, **kwargs}
                ax.stairs(sub["density"].to_numpy(float), edges, label=f"$T={int(T)}$", **kw)
            ax.set_yscale("log")
            top = frame.loc[frame["quantity"] == quantity, "density"].max()
            if np.isfinite(top) and top > 0:
                ax.set_ylim(top * 1e-3, top * 2)
            ax.set_xlabel(f"{labels[quantity]} (nats)")
            ax.set_ylabel("density (per nat)")
        axes[0].legend(loc="upper left", handlelength=3.0)
        if title:
            fig.suptitle(title)
    return fig
