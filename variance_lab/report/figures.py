r"""Publication figures, drawn from tidy frames only.

Every function takes a tidy frame (:mod:`variance_lab.schema`; the histogram takes a
frame of histogram bins) and either ``ax=`` (one panel) or ``fig=`` (several panels). When
neither is given it creates a figure through :mod:`matplotlib.pyplot` (so ``plt.gcf()`` and
``plt.savefig`` see it), ``figsize`` wide and high (default one column, 3.4 in). It returns
the :class:`~matplotlib.figure.Figure`. Nothing here computes theory or runs Monte Carlo:
see :mod:`variance_lab.paper.figures` for the data behind each figure.

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
from variance_lab.schema import verdict_level

__all__ = [
    "approx_error",
    "approx_ratio",
    "decay_boundary",
    "ess_vs_T",
    "frontier_frame",
    "heatmap",
    "log_histograms",
    "new_figure",
    "ratio_vs_T",
    "variance_panels",
    "variance_vs_T",
    "write_images",
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
    "naive": r"$\sigma^2/T$ (naive)",
    "monte_carlo": "Monte Carlo",
}
_METHOD_STYLE = {
    "exact": {"color": sty.OKABE_ITO[0], "ls": "-"},
    "lognormal": {"color": sty.OKABE_ITO[1], "ls": "--", "marker": "s", "markevery": 0.12, "ms": 3},
    "delta": {"color": sty.OKABE_ITO[4], "ls": "-.", "marker": "^", "markevery": 0.12, "ms": 3},
    "naive": {"color": sty.OKABE_ITO[5], "ls": ":", "marker": "D", "markevery": 0.12, "ms": 2.6},
}
_MC_COLOR = sty.OKABE_ITO[3]
T_LABEL = "sequence length $T$ (tokens)"
#: Relative errors below this are drawn at this floor and marked "exact": it sits above the
#: rounding of the theory values themselves (float64 path and mpmath agree to about 1e-13), so
#: an approximation that is exact draws at the floor whichever path computed it.
REL_ERROR_FLOOR = 1e-12


# ----------------------------------------------------------------------------- helpers
def new_figure(figsize=None, default=(sty.COLUMN_WIDTH, 2.4)):
    """Make a new figure through :mod:`matplotlib.pyplot` (constrained layout), ``figsize`` or ``default``.

    Created with pyplot so that ``plt.gcf()``, ``plt.savefig`` and notebooks' inline display
    see it; close it with ``plt.close(fig)`` when done.
    """
    import matplotlib.pyplot as plt

    return plt.figure(figsize=default if figsize is None else figsize, layout="constrained")


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


def _axes(ax, figsize, height: float = 2.4):
    """(figure, axes): the given axes, or a new figure with one panel."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize, (sty.COLUMN_WIDTH, height))
    return fig, fig.add_subplot()


def _figure(fig, figsize, height: float) -> Figure:
    return new_figure(figsize, (sty.COLUMN_WIDTH, height)) if fig is None else fig


def _rows(frame: pd.DataFrame, **equal) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, val in equal.items():
        mask &= (frame[col] == val).to_numpy()
    return frame[mask].sort_values("T")


def _values(rows: pd.DataFrame) -> np.ndarray:
    """Real values of tidy rows: ``value`` where finite, else ``10**log10_value`` (inf beyond range)."""
    v = rows["value"].to_numpy(float)
    return np.where(np.isfinite(v), v, sty.power10(rows["log10_value"].to_numpy(float)))


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


def _common_text(keys, varying: set[str]) -> str:
    """Return the parameters all series share, e.g. ``lognormal, mu=1`` when only sigma^2 varies."""
    if not keys:
        return ""
    family, mu, sigma2 = keys[0]
    parts = []
    if "family" not in varying:
        parts.append(family)
    if "mu" not in varying:
        parts.append(rf"$\mu={mu:g}$")
    if "sigma2" not in varying:
        parts.append(rf"$\sigma^2={sigma2:g}$")
    return ", ".join(parts)


def _n_text(n) -> str:
    return f"$n = {int(n):,}$".replace(",", "{,}") if n else ""


def _bounds(rows: pd.DataFrame, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interval ends, clipped to the point when an end is <= 0 or missing."""
    lo, hi = rows["lo"].to_numpy(float), rows["hi"].to_numpy(float)
    lo = np.where(np.isfinite(lo) & (lo > 0), np.minimum(lo, y), y)
    hi = np.where(np.isfinite(hi), np.maximum(hi, y), y)
    return lo, hi


def _levels(rows: pd.DataFrame) -> np.ndarray:
    """Verdict level of each row: ``reliable``, ``marginal`` or ``unreliable`` (read from ``reason``).

    A row not ``reliable`` whose frame has no ``reason`` counts as unreliable.
    """
    ok = rows["reliable"].astype(str).isin(["True", "true", "1"]).to_numpy()
    if "reason" not in rows:
        return np.where(ok, "reliable", "unreliable")
    reasons = rows["reason"].fillna("").astype(str).to_numpy()
    levels = np.array([_level(r) for r in reasons], dtype=object)
    return np.where(ok, "reliable", np.where(levels == "marginal", "marginal", "unreliable"))


def _level(reason: str) -> str:
    """Verdict level of a flagged row's reason; one without a level (a hand-made frame's) is unreliable."""
    try:
        return verdict_level(reason) if reason else "unreliable"
    except ValueError:
        return "unreliable"


def _mc_points(ax, rows: pd.DataFrame, color: str, x: str = "T", scale=None, marker: str = "o") -> set[str]:
    """Monte Carlo estimates with interval bars; the verdict levels drawn (:func:`_mc_legend_handles`).

    Reliable points are filled, marginal ones half filled (:data:`~variance_lab.report.style.MARGINAL_FILL`),
    unreliable ones hollow. ``scale`` (array, one per row) divides values and bounds (a ratio
    to the exact value).
    """
    if rows.empty:
        return set()
    y = _values(rows)
    lo, hi = _bounds(rows, y)
    if scale is not None:
        y, lo, hi = y / scale, lo / scale, hi / scale
    xs = rows[x].to_numpy(float)
    levels = _levels(rows)
    sty.errorbar_points(ax, xs, y, lo, hi, levels == "reliable", color, marker, marginal=levels == "marginal")
    return set(levels.tolist())


#: Legend labels of the Monte Carlo points, by verdict level (:mod:`variance_lab.simulate.estimates`).
MC_LEVEL_LABELS = {
    "reliable": "Monte Carlo ({level} CI)",
    "marginal": "flagged marginal: its interval\nmay cover less than {level}",
    "unreliable": "flagged unreliable: too few draws\nto confirm it (may lie on the line)",
}


def _mc_legend_handles(color: str, levels, level: str = "95 %") -> list[Line2D]:
    """Legend entries of the Monte Carlo points: filled always, then each flagged level drawn."""
    faces = {
        "reliable": {"mfc": color},
        "marginal": {"mfc": color, "mfcalt": "white", "fillstyle": sty.MARGINAL_FILL},
        "unreliable": {"mfc": "white"},
    }
    return [
        Line2D(
            [], [], marker="o", ls="", color=color, label=MC_LEVEL_LABELS[v].format(level=level), **faces[v]
        )
        for v in ("reliable", "marginal", "unreliable")
        if v == "reliable" or v in levels
    ]


def _log_x_T(ax) -> None:
    ax.set_xscale("log")
    ax.set_xlabel(T_LABEL)


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
        fig, ax = _axes(ax, figsize)
        rows = frame[frame["statistic"] == statistic]
        methods = ["exact", *(["lognormal", "delta", "naive"] if approximations else [])]
        for method in methods:
            sub = _rows(rows, method=method)
            if sub.empty:
                continue
            label = _METHOD_LABEL[method]
            if method == "exact" and statistic == "var_P":
                label = r"exact $(\sigma^2+\mu^2)^T-\mu^{2T}$"
            kw = {**_METHOD_STYLE[method], **(kwargs if method == "exact" else {})}
            ax.plot(sub["T"], _values(sub), label=label, **kw)
        mc = _rows(rows, method="monte_carlo")
        flagged = _mc_points(ax, mc, _MC_COLOR)
        ax.set_yscale("log")
        _log_x_T(ax)
        ax.set_ylabel(_STAT_LABEL[statistic])
        if legend:
            handles, _ = ax.get_legend_handles_labels()
            if not mc.empty:
                handles += _mc_legend_handles(_MC_COLOR, flagged)
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every approximation line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
        The figure of ``ax`` (or a new one): one panel, each approximation over the exact value.
    """
    with sty.use(style):
        fig, ax = _axes(ax, figsize, 2.0)
        rows = frame[frame["statistic"] == "var_G"]
        exact = _rows(rows, method="exact")
        by_T = pd.Series(_values(exact), index=exact["T"].to_numpy())
        ax.axhline(1.0, color="0.6", lw=0.6, zorder=0)
        for method in ("lognormal", "delta", "naive"):
            sub = _rows(rows, method=method)
            sub = sub[sub["T"].isin(by_T.index)]
            if sub.empty:
                continue
            ratio = _values(sub) / by_T.loc[sub["T"]].to_numpy()
            ax.plot(sub["T"], ratio, label=_METHOD_LABEL[method], **{**_METHOD_STYLE[method], **kwargs})
        mc = _rows(rows, method="monte_carlo")
        mc = mc[mc["T"].isin(by_T.index)]
        flagged = _mc_points(ax, mc, _MC_COLOR, scale=by_T.loc[mc["T"]].to_numpy()) if len(mc) else set()
        _log_x_T(ax)
        ax.set_ylabel(r"$\mathrm{Var}(G_T)$ / exact")
        if legend:
            handles, _ = ax.get_legend_handles_labels()
            if not mc.empty:
                handles += _mc_legend_handles(_MC_COLOR, flagged)
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
        fig = _figure(fig, figsize, 6.4)
        top, middle, bottom = fig.subplots(3, 1, sharex=True, height_ratios=[1.2, 1.0, 0.9])
        variance_vs_T(frame, "var_P", ax=top, **kwargs)
        variance_vs_T(frame, "var_G", ax=middle, approximations=False, **kwargs)
        approx_ratio(frame, ax=bottom)
        for ax in (top, middle):
            ax.set_xlabel("")
        for ax, letter in zip((top, middle, bottom), "abc", strict=True):
            ax.set_title(f"({letter})", loc="left", fontweight="bold")
        keys = _series(frame)
        if len(keys) == 1:
            mc = (frame["method"] == "monte_carlo").any()
            text = _params_text(keys[0]) + (f"; Monte Carlo {_n_text(n)} draws" if mc and n else "")
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with sty.use(style):
        rows = _rows(frame, statistic="var_ratio", method="exact")
        keys = sorted(_series(rows), key=lambda k: (k[0], k[1], k[2]))
        varying = _varying(keys)
        if ax is not None or zoom is None or rows.empty or rows["T"].max() <= zoom:
            fig, ax = _axes(ax, figsize, 2.4) if fig is None or ax is not None else (fig, fig.add_subplot())
            axes = [ax]
        else:
            fig = _figure(fig, figsize, 4.2)
            axes = list(fig.subplots(2, 1))
        for k, panel in enumerate(axes):
            sub_rows = rows if k == 0 else rows[rows["T"] <= zoom]
            for i, key in enumerate(keys):
                family, mu, sigma2 = key
                sub = _rows(sub_rows, family=family, mu=mu, sigma2=sigma2)
                label = _series_label(key, varying)
                if "mu" in varying and mu != 1:
                    label += rf" ($\mu {'<' if mu < 1 else '>'} 1$)"
                kw = {**sty.line_style(i), "markevery": 0.1, "ms": 3, **kwargs}
                panel.plot(sub["T"], _values(sub), label=label, **kw)
            panel.axhline(1.0, color="0.6", lw=0.6, ls=":")
            panel.set_yscale("log")
            _log_x_T(panel)
            panel.set_ylabel(_STAT_LABEL["var_ratio"])
        if len(axes) == 2:
            axes[1].set_title(f"zoom: $T \\leq {zoom}$", loc="left")
        axes[0].legend(loc="best")
        if keys:
            common = _common_text(keys, varying)
            axes[0].set_title(f"{common}, exact" if common else "exact")
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to :meth:`~matplotlib.axes.Axes.pcolormesh` (``cmap``, ``vmin``, ``vmax``, ...).

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
        fig, ax = _axes(ax, figsize, 2.8)
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
        cbar.set_label(f"{_STAT_LABEL.get(statistic, statistic)} at $T={T}$")
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to :meth:`~matplotlib.axes.Axes.pcolormesh`.

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
        fig, ax = _axes(ax, figsize, 2.8)
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
    keys = _series(err)
    with sty.use(style):
        fig = _figure(fig, figsize, 0.7 + 1.5 * max(len(keys), 1))
        axes = np.atleast_1d(fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0])
        for ax, key in zip(axes, keys, strict=True):
            family, mu, sigma2 = key
            sub = _rows(err, family=family, mu=mu, sigma2=sigma2)
            for method in ("lognormal", "delta", "naive"):
                m = sub[sub["method"] == method]
                y = np.maximum(np.abs(m["rel_error"].to_numpy(float)), REL_ERROR_FLOOR)
                ax.plot(m["T"], y, label=_METHOD_LABEL[method], **{**_METHOD_STYLE[method], **kwargs})
                if len(y) > 1 and (y[-2:] <= REL_ERROR_FLOOR).all():
                    ax.annotate(
                        "exact",
                        (m["T"].iloc[-1], REL_ERROR_FLOOR),
                        xytext=(-2, 3),
                        textcoords="offset points",
                        ha="right",
                        va="bottom",
                        fontsize=sty.small_font(),
                        color=_METHOD_STYLE[method]["color"],
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(REL_ERROR_FLOOR / 3, None)
            ax.set_title(_params_text(key), loc="left")
            ax.set_ylabel("rel. error")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=2)
        fig.supylabel(r"$|\mathrm{approx.}/\mathrm{exact} - 1|$ of $\mathrm{Var}(G_T)$")
        for ax in axes:
            ax.set_ylabel("")
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every frontier line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    n = np.logspace(2, 12, 101) if n is None else np.asarray(n, dtype=float)
    front = frontier_frame(frame, n)
    keys = _series(front)
    varying = _varying(keys)
    with sty.use(style):
        fig, ax = _axes(ax, figsize, 3.0)
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = front[(front["family"] == family) & (front["mu"] == mu) & (front["sigma2"] == sigma2)]
            kw = {**sty.line_style(i), "markevery": 0.1, "ms": 3, "drawstyle": "steps-post", **kwargs}
            ax.plot(sub["n"], sub["T_max"], label=_series_label(key, varying), **kw)
        for t in (10, 100, 1000):
            ax.axhline(t, color="0.75", lw=0.5, ls=":", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Monte Carlo draws $n$")
        pct = f"{100 * target:g} %" if target else "the target"
        ax.set_ylabel("largest $T$ (tokens)")
        title = rf"largest $T$ where $n$ draws give Var$(P_T)$ to {pct}"
        common = _common_text(keys, varying)
        ax.set_title(title + (f"\n{common}" if common else ""))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
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
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every exact line's :meth:`~matplotlib.axes.Axes.plot`.

    Returns
    -------
    matplotlib.figure.Figure
        The figure of ``ax`` (or a new one) with Kong's ESS fraction of the weights against T.
    """
    with sty.use(style):
        fig, ax = _axes(ax, figsize, 2.9)
        rows = frame[frame["statistic"] == "ess_frac_P"]
        keys = _series(rows)
        varying = _varying(keys)
        any_mc, flagged = False, set()
        for i, key in enumerate(keys):
            family, mu, sigma2 = key
            sub = rows[(rows["family"] == family) & (rows["mu"] == mu) & (rows["sigma2"] == sigma2)]
            exact = _rows(sub, method="exact")
            line = sty.line_style(i)
            marker = line.pop("marker")
            ax.plot(exact["T"], _values(exact), label=_series_label(key, varying), **{**line, **kwargs})
            mc = _rows(sub, method="monte_carlo")
            any_mc |= not mc.empty
            flagged |= _mc_points(ax, mc, line["color"], marker=marker)
        if n:
            ax.axhline(
                1.0 / n, color="0.4", lw=0.7, ls=(0, (6, 2)), label=r"$1/n$ (one draw holds all weight)"
            )
            bottom = -max(12.0, 2 * math.log10(n))
            ax.set_ylim(max(ax.get_ylim()[0], 10.0**bottom), 3.0)
        ax.set_yscale("log")
        _log_x_T(ax)
        ax.set_ylabel(rf"{_STAT_LABEL['ess_frac_P']} (ESS$/n$)")
        handles, _ = ax.get_legend_handles_labels()
        if any_mc:
            handles += _mc_legend_handles("0.3", flagged)
        common = _common_text(keys, varying)
        title = ", ".join(t for t in (common, f"Monte Carlo {_n_text(n)} draws" if any_mc and n else "") if t)
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
        ``hi`` (bin edges) and ``density`` (as :func:`variance_lab.paper.figures.histogram_frame`
        makes from draws).
    fig : matplotlib.figure.Figure, optional
    title : str, optional
        Figure title (the family, its parameters and the draws: the bins do not carry them).
    figsize, style
        As for :func:`variance_vs_T`.
    **kwargs
        Passed to every :meth:`~matplotlib.axes.Axes.stairs`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    labels = {"log_P": r"$\log P_T$", "log_G": r"$\log G_T = \log P_T\,/\,T$"}
    with sty.use(style):
        fig = _figure(fig, figsize, 4.4)
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
