r"""Where the probability-aware masks bind: the masked fraction against the token's probability, entropy, T.

Drawn from a tidy frame only (columns :data:`PROB_MASK_COLUMNS`: ``panel, series, x, method, value,
lo, hi, reliable``):

- ``panel == "q"`` (theory): :math:`x` is the sampler's probability :math:`q` of the token,
  ``value`` the fraction of tokens a mask masks there (one ``series`` per spec and sign);
  ``method`` ``"exact"`` (lines: :func:`variance_lab.corrections.theory` at a fixed :math:`q`) or
  ``"monte_carlo"`` (points with intervals: :func:`variance_lab.corrections.simulate_corrections`);
  log y axis (values at or below 0 are left out: a line there is at the axis' floor).
- ``panel == "p"`` and ``panel == "entropy"`` (data): :math:`x` is the mean probability or entropy of
  a bin's tokens, ``value`` the observed fraction of them masked with its interval
  (``method == "observed"``, :func:`variance_lab.corrections.mask_by_bins`); linear y axis.

- ``panel == "T"`` (CPPO against the sequence length): :math:`x` is :math:`T` (log axis), ``value``
  a masked fraction (log axis), one colour per :math:`\sigma^2` of the log-odds shift; ``series``
  ``"<kind> [sigma2=<v>]"`` (:func:`cppo_series`): CPPO's Monte Carlo (``method ==
  "monte_carlo"``, points with intervals, joined by a thin line), ``"threshold alone"`` (its exact
  lower bound, DPPO-TV's value at :math:`T = 1`; dashed), ``"limit"`` (``method == "limit"``: the
  fraction as :math:`T \to \infty`; dotted) and a DPPO spec (DPPO-TV at CPPO's threshold;
  dash-dotted).

The :math:`q` and :math:`p` axes are on the logit scale, from :math:`5\cdot10^{-4}` to :math:`1 -
5\cdot10^{-4}` (a bin whose mean lies beyond, such as tokens at probability 1 after top-p, is drawn
at the edge). Monte Carlo points are filled when reliable
and hollow when flagged, as in every figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style as sty
from variance_lab.report.figure_kit import log_x_T, series_handle

__all__ = [
    "CPPO_KINDS",
    "LOGIT_RANGE",
    "PROB_MASK_COLUMNS",
    "PROB_MASK_FLOOR",
    "cppo_series",
    "prob_mask_figure",
]

#: Columns of the tidy frame :func:`prob_mask_figure` draws.
PROB_MASK_COLUMNS = ("panel", "series", "x", "method", "value", "lo", "hi", "reliable")
#: The lowest masked fraction the theory panel shows (its log axis' floor).
PROB_MASK_FLOOR = 1e-6
#: The probability axes' range (logit scale): decades of q and of 1 - q.
LOGIT_RANGE = (5e-4, 1 - 5e-4)

#: Panel (d)'s exact references (the ``series`` before `` [sigma2=...]``): line style and legend text;
#: a DPPO spec is dash-dotted, CPPO's Monte Carlo drawn as points.
CPPO_KINDS = {
    "threshold alone": ("--", r"threshold $\delta/w_t$ alone: lower bound, DPPO's at $T = 1$"),
    "limit": (":", r"limit as $T \to \infty$"),
}
_SIGMA2_TAG = " [sigma2="

_PANELS = {
    "q": ("(a) theory", r"sampler's probability $q$ of the token", "fraction of tokens masked"),
    "p": ("(b) data, by probability", r"sampler's probability $p$ (bin mean)", "fraction of tokens masked"),
    "entropy": (
        "(c) data, by entropy",
        "entropy of the next token (nats, bin mean)",
        "fraction of tokens masked",
    ),
    "T": ("(d) CPPO against the length", None, "fraction of tokens masked"),
}


def cppo_series(kind: str, sigma2: float) -> str:
    """Return a series name of panel (d), ``"<kind> [sigma2=<v>]"`` (a spec or a :data:`CPPO_KINDS` key)."""
    return f"{kind}{_SIGMA2_TAG}{float(sigma2):g}]"


def _split(series: str) -> tuple[str, str]:
    """Return (kind, sigma^2 as written) of a panel (d) series."""
    kind, _, rest = str(series).partition(_SIGMA2_TAG)
    return kind, rest.rstrip("]")


def _styles(series) -> dict:
    """One colour and marker per spec across the panels; DPPO's A <= 0 side dashed, its A > 0 side solid."""
    specs = list(dict.fromkeys(str(s).split(" [")[0] for s in series))
    out = {}
    for s in dict.fromkeys(series):
        st = dict(sty.line_style(specs.index(str(s).split(" [")[0])))
        st["ls"] = "--" if str(s).endswith("[A<=0]") else "-"
        out[s] = st
    return out


def _draw(ax, rows: pd.DataFrame, styles: dict, logit: bool) -> list[Line2D]:
    """Draw one panel's series: lines (exact), points with intervals (Monte Carlo, observed)."""
    handles = []
    if logit:  # a bin of tokens at probability 1 exactly has its mean off the axis: drawn at its edge
        rows = rows.assign(x=rows["x"].clip(*LOGIT_RANGE))
    for series in dict.fromkeys(rows["series"]):
        st = styles[series]
        sub = rows[rows["series"] == series].sort_values("x")
        exact = sub[(sub["method"] == "exact") & (sub["value"] > 0)]
        points = sub[sub["method"].isin(("monte_carlo", "observed"))]
        if len(exact):
            ax.plot(exact["x"], exact["value"], color=st["color"], ls=st["ls"])
        if len(points):
            sty.frame_points(ax, points, st["color"], st["marker"])
            if not len(exact):  # observed points: joined by a thin line to read the trend
                ax.plot(points["x"], points["value"], color=st["color"], ls=":", lw=0.8)
        handles.append(series_handle(st, series, line=bool(len(exact)) or ":", points=bool(len(points))))
    return handles


def _draw_cppo(ax, rows: pd.DataFrame, first: int) -> list[Line2D]:
    """Draw panel (d) and return its legend entries: one colour per sigma^2 (from style ``first`` on).

    CPPO's Monte Carlo as points joined by a thin line, DPPO dash-dotted, :data:`CPPO_KINDS` in their
    styles; values at or below 0 are left out (log axes).
    """
    colours = {
        s2: sty.line_style(first + i)
        for i, s2 in enumerate(dict.fromkeys(_split(s)[1] for s in rows["series"]))
    }
    kinds = {}  # kind -> (line style, legend text, points)
    for series in dict.fromkeys(rows["series"]):
        kind, s2 = _split(series)
        st = colours[s2]
        sub = rows[(rows["series"] == series) & (rows["value"] > 0)].sort_values("x")
        if (sub["method"] == "monte_carlo").any():
            sty.frame_points(ax, sub, st["color"], st["marker"])
            ax.plot(sub["x"], sub["value"], color=st["color"], ls="-", lw=0.8)
            kinds.setdefault(kind, ("-", f"{kind}: Monte Carlo, 95 % interval", True))
        else:
            ls, label = CPPO_KINDS.get(kind, ("-.", kind))
            ax.plot(sub["x"], sub["value"], color=st["color"], ls=ls)
            kinds.setdefault(kind, (ls, label, False))
    handles = [
        Line2D([], [], color=st["color"], marker=st["marker"], ls="-", ms=3.2, label=rf"$\sigma^2 = {s2}$")
        for s2, st in colours.items()
    ]
    # Monte Carlo first, then DPPO, then the references in CPPO_KINDS' order
    order = sorted(
        kinds, key=lambda k: (not kinds[k][2], list(CPPO_KINDS).index(k) + 1 if k in CPPO_KINDS else 0)
    )
    for k in order:
        ls, label, points = kinds[k]
        handles.append(Line2D([], [], color="0.2", ls=ls, marker="o" if points else "", ms=3.2, label=label))
    values = rows[["value", "lo"]].to_numpy(float).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    floor = 10.0 ** np.floor(np.log10(values.min())) if values.size else PROB_MASK_FLOOR
    log_x_T(ax)
    ax.set_yscale("log")
    ax.set_ylim(max(floor, PROB_MASK_FLOOR), 1.0)
    return handles


#: Where the legends of the theory panels go: below the panel (their curves fill its middle).
_BELOW = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.22)}


def _mc_handles(rows: pd.DataFrame) -> list[Line2D]:
    """Legend entries of Monte Carlo points (filled, and hollow: flagged) when a panel has any."""
    if not (rows["method"] == "monte_carlo").any():
        return []
    return [
        Line2D([], [], marker="o", ls="", color="0.2", label="Monte Carlo, 95 % interval"),
        Line2D([], [], marker="o", ls="", color="0.2", mfc="white", label="flagged unreliable"),
    ]


def prob_mask_figure(frame: pd.DataFrame, *, fig=None, title: str = "", style=None) -> Figure:
    """Draw the masked fraction against the token's probability (theory, data) and entropy (data).

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows, columns :data:`PROB_MASK_COLUMNS` (module docstring); panels without rows are
        not drawn.
    fig : matplotlib.figure.Figure, optional
        Drawn into (one axis per panel, side by side); a new figure otherwise, 3.4 in wide per panel
        and 3.9 in high.
    title : str
        The figure's title.
    style : None, str or dict
        As for :func:`variance_lab.report.style.use`.

    Returns
    -------
    Figure
    """
    missing = [c for c in PROB_MASK_COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"prob_mask_figure needs the columns {list(PROB_MASK_COLUMNS)}; missing {missing}")
    panels = [p for p in _PANELS if (frame["panel"] == p).any()]
    if not panels:
        raise ValueError(f"prob_mask_figure: no row of a panel {list(_PANELS)}")
    if fig is None:
        fig = Figure(figsize=(3.4 * len(panels), 3.9), layout="constrained")
    styles = _styles(frame.loc[frame["panel"] != "T", "series"])
    first = len({str(s).split(" [")[0] for s in styles})  # panel (d)'s colours after the specs'
    with sty.use(style):
        axes = np.atleast_1d(fig.subplots(1, len(panels)))
        for ax, panel in zip(axes, panels, strict=True):
            rows = frame[frame["panel"] == panel]
            name, xlabel, ylabel = _PANELS[panel]
            if panel == "T":
                handles = _draw_cppo(ax, rows, first)
                ax.set_ylabel(ylabel)
                ax.set_title(name, loc="left", fontweight="bold")
                handles += _mc_handles(rows)[1:]  # CPPO's own entry shows the filled points
                ax.legend(handles=handles, fontsize=sty.small_font(), frameon=False, **_BELOW)
                continue
            handles = _draw(ax, rows, styles, panel in ("q", "p"))
            if panel in ("q", "p"):
                ax.set_xscale("logit")
                ax.set_xlim(LOGIT_RANGE)
            if panel == "q":
                ax.set_yscale("log")
                ax.set_ylim(PROB_MASK_FLOOR, 1.0)
            else:
                ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(name, loc="left", fontweight="bold")
            handles += _mc_handles(rows)
            if (rows["method"] == "observed").any():
                handles.append(
                    Line2D([], [], marker="o", ls="", color="0.2", label="observed, 95 % interval")
                )
            where = {  # the theory's curves fill the middle of its panel: its legend goes below it
                "q": {**_BELOW, "ncols": 2},
                "p": {"loc": "upper left"},
                "entropy": {"loc": "upper right"},
            }[panel]
            ax.legend(handles=handles, fontsize=sty.small_font(), frameon=False, **where)
        if title:
            fig.suptitle(title)
    return fig
