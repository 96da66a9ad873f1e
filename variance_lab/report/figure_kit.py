r"""Drawing parts shared by the figure modules: labels, line styles, Monte Carlo points, new figures.

The figure functions of :mod:`variance_lab.report.figures` (quantities against :math:`T`,
with Monte Carlo points) and :mod:`variance_lab.report.theory_figures` (maps over
:math:`(\mu, \sigma^2)`, approximation errors, the Monte Carlo frontier) draw with these:
the labels and styles of the statistics and methods of :mod:`variance_lab.schema`'s tidy
frames, row selection from those frames, series labels that name only what varies, and the
Monte Carlo points with their verdict levels (filled reliable, half-filled marginal, hollow
unreliable) and legend entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style as sty
from variance_lab.schema import verdict_level

__all__ = [
    "MC_COLOR",
    "MC_LEVEL_LABELS",
    "METHOD_LABEL",
    "METHOD_STYLE",
    "STAT_LABEL",
    "T_LABEL",
    "axes_or_new",
    "centre_note",
    "common_text",
    "figure_or_new",
    "log_x_T",
    "mc_legend_handles",
    "mc_points",
    "n_text",
    "new_figure",
    "panel_axes",
    "params_text",
    "real_values",
    "rows_where",
    "series_keys",
    "series_label",
    "varying_params",
]

#: Axis label of each statistic of a tidy frame.
STAT_LABEL = {
    "var_P": r"$\mathrm{Var}(P_T)$",
    "var_G": r"$\mathrm{Var}(G_T)$",
    "var_ratio": r"$\mathrm{Var}(P_T)\,/\,\mathrm{Var}(G_T)$",
    "ess_frac_P": r"ESS fraction of $P_T$",
}
#: Legend label of each method of a tidy frame.
METHOD_LABEL = {
    "exact": "exact",
    "lognormal": "lognormal approx.",
    "delta": r"small-$x$ form $\sigma_y^2 e^{2\mu_y}/T$",
    "naive": r"$\sigma^2/T$ (naive)",
    "monte_carlo": "Monte Carlo",
}
#: Line style of each theory method (Okabe-Ito colours; markers tell them apart in greyscale).
METHOD_STYLE = {
    "exact": {"color": sty.OKABE_ITO[0], "ls": "-"},
    "lognormal": {"color": sty.OKABE_ITO[1], "ls": "--", "marker": "s", "markevery": 0.12, "ms": 3},
    "delta": {"color": sty.OKABE_ITO[4], "ls": "-.", "marker": "^", "markevery": 0.12, "ms": 3},
    "naive": {"color": sty.OKABE_ITO[5], "ls": ":", "marker": "D", "markevery": 0.12, "ms": 2.6},
}
#: Colour of the Monte Carlo points.
MC_COLOR = sty.OKABE_ITO[3]
#: Label of every sequence-length axis.
T_LABEL = "sequence length $T$ (tokens)"


# ----------------------------------------------------------------------------- helpers
def new_figure(figsize=None, default=(sty.COLUMN_WIDTH, 2.4)):
    """Make a new figure through :mod:`matplotlib.pyplot` (constrained layout), ``figsize`` or ``default``.

    Created with pyplot so that ``plt.gcf()``, ``plt.savefig`` and notebooks' inline display
    see it; close it with ``plt.close(fig)`` when done.
    """
    import matplotlib.pyplot as plt

    return plt.figure(figsize=default if figsize is None else figsize, layout="constrained")


def axes_or_new(ax, figsize, height: float = 2.4):
    """Return (figure, axes): the given axes and their figure, or a new one-column figure ``height`` high."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize, (sty.COLUMN_WIDTH, height))
    return fig, fig.add_subplot()


def figure_or_new(fig, figsize, height: float) -> Figure:
    """Return ``fig``, or a new one-column figure ``height`` in high (``figsize`` when given)."""
    return new_figure(figsize, (sty.COLUMN_WIDTH, height)) if fig is None else fig


def panel_axes(fig, ax, panels: Sequence, figsize, height: float):
    """Return (figure, axes, new?): one axes per panel, in a column sharing x.

    ``ax`` given: those axes (one per panel) and their figure; otherwise the panels in ``fig``, or
    in a new one-column figure ``height`` in high (``figsize`` when given, :func:`figure_or_new`).
    ``new`` tells whether the figure was made here.
    """
    if ax is not None:
        axes = [ax] if not isinstance(ax, Sequence | np.ndarray) else list(np.ravel(ax))
        if len(axes) != len(panels):
            raise ValueError(f"ax must hold {len(panels)} axes for panels {tuple(panels)}, got {len(axes)}")
        return axes[0].figure, axes, False
    new = fig is None
    fig = figure_or_new(fig, figsize, height)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes), new


def centre_note(ax, text: str, **kw) -> None:
    """Write ``text`` in the middle of ``ax``, small and grey (why a panel has nothing to draw).

    ``kw`` goes to :meth:`matplotlib.axes.Axes.text` (a ``bbox``, say).
    """
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=sty.small_font(),
        color="0.35",
        **kw,
    )


def rows_where(frame: pd.DataFrame, **equal) -> pd.DataFrame:
    """Return the rows of ``frame`` whose columns equal the values given (``statistic="var_P"``), by T."""
    mask = np.ones(len(frame), dtype=bool)
    for col, val in equal.items():
        mask &= (frame[col] == val).to_numpy()
    return frame[mask].sort_values("T")


def real_values(rows: pd.DataFrame) -> np.ndarray:
    """Real values of tidy rows: ``value`` where finite, else ``10**log10_value`` (inf beyond range)."""
    v = rows["value"].to_numpy(float)
    return np.where(np.isfinite(v), v, sty.power10(rows["log10_value"].to_numpy(float)))


def series_keys(frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    """Return the series of a tidy frame: its distinct ``(family, mu, sigma2)``, in order of appearance."""
    keys = frame[["family", "mu", "sigma2"]].drop_duplicates()
    return [(f, float(m), float(s)) for f, m, s in keys.itertuples(index=False)]


def series_label(key: tuple[str, float, float], varying: set[str]) -> str:
    """Return a series' legend label: the parameters in ``varying`` only (the family when none varies)."""
    family, mu, sigma2 = key
    parts = []
    if "family" in varying:
        parts.append(family)
    if "mu" in varying:
        parts.append(rf"$\mu={mu:g}$")
    if "sigma2" in varying:
        parts.append(rf"$\sigma^2={sigma2:g}$")
    return ", ".join(parts) or family


def varying_params(keys) -> set[str]:
    """Return which of ``family``, ``mu``, ``sigma2`` take more than one value over the series ``keys``."""
    names = ("family", "mu", "sigma2")
    return {name for i, name in enumerate(names) if len({k[i] for k in keys}) > 1}


def params_text(key: tuple[str, float, float]) -> str:
    """Return a series' full parameters as text: ``family, mu=.., sigma^2=..``."""
    family, mu, sigma2 = key
    return rf"{family}, $\mu={mu:g}$, $\sigma^2={sigma2:g}$"


def common_text(keys, varying: set[str]) -> str:
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


def n_text(n) -> str:
    """Return the number of draws as text (``n = 100,000``); empty for none."""
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


def mc_points(ax, rows: pd.DataFrame, color: str, x: str = "T", scale=None, marker: str = "o") -> set[str]:
    """Monte Carlo estimates with interval bars; the verdict levels drawn (:func:`mc_legend_handles`).

    Reliable points are filled, marginal ones half filled (:data:`~variance_lab.report.style.MARGINAL_FILL`),
    unreliable ones hollow. ``scale`` (array, one per row) divides values and bounds (a ratio
    to the exact value).
    """
    if rows.empty:
        return set()
    y = real_values(rows)
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


def mc_legend_handles(color: str, levels, level: str = "95 %") -> list[Line2D]:
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


def series_handle(st: dict, label, *, line, points: bool) -> Line2D:
    """Legend entry of one series in its style ``st`` (``color``, ``ls``, ``marker``).

    ``line`` is the line style to show (``True``: the style's own, a string: that one, ``False``:
    none); ``points`` shows the style's marker.
    """
    ls = st["ls"] if line is True else (line or "")
    return Line2D(
        [], [], color=st["color"], ls=ls, marker=st["marker"] if points else "", ms=3.2, label=str(label)
    )


def log_x_T(ax) -> None:
    """Put T on a log x axis with its label (:data:`T_LABEL`)."""
    ax.set_xscale("log")
    ax.set_xlabel(T_LABEL)
