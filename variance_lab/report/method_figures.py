r"""Figures of the 2025-26 methods: sign-dependent weights, VCPO's ESS step, the bounds of the mismatch.

Each draws a tidy frame with the panel schema of :data:`THRESHOLD_COLUMNS` (``panel, series, x,
method, value, lo, hi, reliable``) and nothing else:

- :func:`sign_figure`: panels ``bias`` and ``var`` (x = T) and ``data`` (categorical: one series
  per ``SPEC [SIGN]``, x its position); one colour per spec, solid for :math:`A < 0`, dashed for
  :math:`A \ge 0`; ``exact`` rows are lines, ``monte_carlo`` and ``data`` rows points with their
  intervals (hollow when flagged).
- :func:`vcpo_figure`: panels ``lag`` and ``family`` (x = T) and ``baseline`` (categorical).
- :func:`bounds_figure` (the bounds of "When Speed Kills Stability"): panels ``bias``, ``var``,
  ``ratio`` (x = T) and ``crossover`` (x = the batch size n); ``exact`` rows solid, ``bound`` rows
  dashed, one colour per series.

Each takes ``fig=`` (or makes a 7 in wide figure) and returns the figure.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab.report import style as sty
from variance_lab.report.threshold_figure import THRESHOLD_COLUMNS

__all__ = ["RATIO_TOP", "bounds_figure", "sign_figure", "vcpo_figure"]

_T = "sequence length $T$ (tokens)"
#: Top of the bound / exact panel of :func:`bounds_figure`: a ratio above it runs off the panel.
RATIO_TOP = 1e6


def _figure(frame: pd.DataFrame, who: str, fig, size: tuple[float, float]) -> Figure:
    """Check that ``frame`` has the panel schema; return ``fig``, or a new figure of ``size`` in."""
    missing = [c for c in THRESHOLD_COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"{who} needs the columns {list(THRESHOLD_COLUMNS)}; missing {missing}")
    return Figure(figsize=size, layout="constrained") if fig is None else fig


def _lines(ax, rows: pd.DataFrame, color: str, ls: str, positive: bool = False) -> None:
    rows = rows.sort_values("x")
    if positive:  # a log axis: zeros (a weight with no variance) are left out
        rows = rows[rows["value"] > 0]
    ax.plot(rows["x"], rows["value"], color=color, ls=ls)


def _handles(entries) -> list[Line2D]:
    return [Line2D([], [], label=label, **kw) for label, kw in entries]


def _mc_handles() -> list[Line2D]:
    return _handles(
        [
            ("Monte Carlo, 95 %", {"marker": "o", "ls": "", "color": "0.2", "ms": 3.2}),
            ("flagged unreliable", {"marker": "o", "ls": "", "color": "0.2", "mfc": "white", "ms": 3.2}),
        ]
    )


def _legend(ax, handles, **kw) -> None:
    ax.legend(handles=handles, fontsize=sty.small_font(), frameon=False, **kw)


def _letter(ax, letter: str, text: str) -> None:
    ax.set_title(f"({letter}) {text}", loc="left", fontweight="bold")


def _categorical(ax, rows: pd.DataFrame, colors: dict, markers: dict) -> None:
    """One point per series at its x, coloured by its spec and marked by its sign; the names as ticks."""
    rows = rows.sort_values("x")
    for r in rows.itertuples(index=False):
        spec, sign = _split(r.series)
        sty.frame_points(ax, pd.DataFrame([r._asdict()]), colors.get(spec, "0.2"), markers.get(sign, "o"))
    ax.set_xticks(rows["x"], list(rows["series"]), fontsize=sty.small_font(), rotation=35, ha="right")
    ax.set_xlim(rows["x"].min() - 0.6, rows["x"].max() + 0.6)


def _data_panel(
    ax, rows: pd.DataFrame, colors: dict, markers: dict, ref: float, ylabel: str, text: str
) -> None:
    """Panel (c): the rows on data (:func:`_categorical`) about a grey line at ``ref``, when there are any."""
    if len(rows):
        _categorical(ax, rows, colors, markers)
        ax.axhline(ref, color="0.6", lw=0.6, zorder=0)
        ax.set_ylabel(ylabel)
    _letter(ax, "c", text)


def _split(series: str) -> tuple[str, str]:
    """``"topr [A<0]"`` -> ``("topr", "A<0")``; a series without a sign -> ``(series, "")``."""
    spec, _, sign = series.partition(" [")
    return spec, sign.rstrip("]")


# --------------------------------------------------------------------------------------------- sign
def sign_figure(
    frame: pd.DataFrame, *, fig=None, title: str = "", data_title: str = "", style=None
) -> Figure:
    r"""Three panels: bias (a) and variance (b) of sign-dependent weights by sign against T, (c) bias on data.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows (module docstring), series ``SPEC [A>=0]`` and ``SPEC [A<0]``.
    fig : matplotlib.figure.Figure, optional
        Drawn into (three axes in a row); a new 7 x 2.7 in figure otherwise.
    title, data_title : str
        The figure's title (the ratio law) and panel (c)'s (the data file).
    style : None, str or dict
        As for :func:`variance_lab.report.style.use`.

    Returns
    -------
    Figure
    """
    fig = _figure(frame, "sign_figure", fig, (7.0, 2.7))
    with sty.use(style):
        axes = fig.subplots(1, 3)
        specs = list(dict.fromkeys(_split(s)[0] for s in frame["series"]))
        colors = {s: sty.color(i) for i, s in enumerate(specs)}
        dash = {"A<0": "-", "A>=0": "--"}
        markers = {"A<0": "o", "A>=0": "s"}
        for ax, panel, letter, ylabel in (
            (axes[0], "bias", "a", r"bias $E[w] - E[X]$"),
            (axes[1], "var", "b", r"variance $\operatorname{Var}(w)$"),
        ):
            rows = frame[frame["panel"] == panel]
            for series in dict.fromkeys(rows["series"]):
                spec, sign = _split(series)
                sub = rows[rows["series"] == series]
                _lines(
                    ax,
                    sub[sub["method"] == "exact"],
                    colors[spec],
                    dash.get(sign, "-"),
                    positive=panel == "var",
                )
                mc = sub[sub["method"] == "monte_carlo"]
                if panel == "var":
                    mc = mc[mc["value"] > 0]
                if len(mc):
                    sty.frame_points(ax, mc, colors[spec], markers.get(sign, "o"))
            ax.set_xscale("log")
            if panel == "var":
                ax.set_yscale("log")
            ax.set_xlabel(_T)
            ax.set_ylabel(ylabel)
            _letter(ax, letter, "bias by sign" if panel == "bias" else "variance by sign")
        handles = _handles([(s, {"color": colors[s], "ls": "-"}) for s in specs])
        handles += _handles(
            [(r"$A < 0$", {"color": "0.2", "ls": "-"}), (r"$A \geq 0$", {"color": "0.2", "ls": "--"})]
        )
        if (frame["method"] == "monte_carlo").any():
            handles += _mc_handles()
        _legend(axes[1], handles, loc="upper left")
        data = frame[frame["panel"] == "data"]
        ylabel = r"bias $E[w] - E[X]$, 95 % interval"
        _data_panel(axes[2], data, colors, markers, 0.0, ylabel, data_title or "on data")
        if title:
            fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------- vcpo
def vcpo_figure(frame: pd.DataFrame, *, fig=None, title: str = "", style=None) -> Figure:
    r"""Three panels: VCPO's ESS ratio against T (a) by lag, (b) by family; (c) its baseline's gain on data.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows (module docstring): panels ``lag``, ``family`` and ``baseline``.
    fig : matplotlib.figure.Figure, optional
        Drawn into (three axes in a row); a new 7 x 2.7 in figure otherwise.
    title : str
    style : None, str or dict

    Returns
    -------
    Figure
    """
    fig = _figure(frame, "vcpo_figure", fig, (7.0, 2.7))
    with sty.use(style):
        axes = fig.subplots(1, 3)
        for ax, panel, letter, text in (
            (axes[0], "lag", "a", "by staleness"),
            (axes[1], "family", "b", "by ratio law, lag 1"),
        ):
            rows = frame[frame["panel"] == panel]
            handles = []
            for i, series in enumerate(dict.fromkeys(rows["series"])):
                st = sty.line_style(i)
                sub = rows[rows["series"] == series]
                _lines(ax, sub[sub["method"] == "exact"], st["color"], st["ls"])
                mc = sub[sub["method"] == "monte_carlo"]
                if len(mc):
                    sty.frame_points(ax, mc, st["color"], st["marker"])
                handles += _handles([(series, {"color": st["color"], "ls": st["ls"]})])
            if panel == "lag" and (rows["method"] == "monte_carlo").any():
                handles += _handles(
                    [
                        (
                            "minibatch $\\hat\\rho_N$",
                            {"marker": "o", "ls": "", "color": "0.2", "ms": 3.2},
                        )
                    ]
                )
            ax.set_xscale("log")
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(_T)
            ax.set_ylabel(r"ESS ratio $\rho_k(T)$; step $\times\sqrt{\rho}$")
            _letter(ax, letter, text)
            _legend(ax, handles, loc="lower left", handlelength=1.6)
        data = frame[frame["panel"] == "baseline"]
        _data_panel(axes[2], data, {}, {}, 1.0, "baseline gain over the group mean", "baseline gain")
        if title:
            fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------- bounds
def bounds_figure(frame: pd.DataFrame, *, fig=None, title: str = "", style=None) -> Figure:
    r"""Four panels: the bounds of "When Speed Kills Stability" against the exact values.

    (a) token-level IS's largest bias and :math:`2T^2\Delta_{\max}`; (b) :math:`\operatorname{Var}(P_T)`
    and :math:`(1 + \chi^2_{\max})^T - 1`; (c) bound / exact of both; (d) the length from which
    sequence-level IS's noise over n sequences exceeds token-level IS's bias, exact and as bounded.

    Parameters
    ----------
    frame : pandas.DataFrame
        Tidy rows (module docstring): panels ``bias``, ``var``, ``ratio`` and ``crossover``.
    fig : matplotlib.figure.Figure, optional
        Drawn into (a 2 x 2 grid); a new 7 x 5.2 in figure otherwise.
    title : str
    style : None, str or dict

    Returns
    -------
    Figure
    """
    fig = _figure(frame, "bounds_figure", fig, (7.0, 5.2))
    with sty.use(style):
        axes = fig.subplots(2, 2).ravel()
        labels = list(dict.fromkeys(frame.loc[frame["panel"] == "bias", "series"]))
        colors = {s: sty.color(i) for i, s in enumerate(labels)}
        panels = (
            ("bias", "a", "token-level IS: bias", "largest bias $B_T$ ($|g_t| \\leq 1$)", _T),
            ("var", "b", "sequence-level IS: variance", r"$\operatorname{Var}(P_T)$", _T),
            ("ratio", "c", "how loose: bound / exact", "bound / exact", _T),
            ("crossover", "d", "where each dominates", "$T$ from which seq.-IS noise > tok.-IS bias",
             "sequences per estimate $n$"),
        )  # fmt: skip
        for ax, (panel, letter, text, ylabel, xlabel) in zip(axes, panels, strict=True):
            rows = frame[frame["panel"] == panel]
            for series in dict.fromkeys(rows["series"]):
                base, part = series.rpartition(": ")[::2] if panel == "ratio" else (series, "")
                sub = rows[rows["series"] == series]
                color = colors.get(base, "0.2")
                if panel == "ratio":
                    _lines(ax, sub, color, "-" if part == "bias" else ":", positive=True)
                    ax.set_ylim(0.5, RATIO_TOP)
                    continue
                _lines(ax, sub[sub["method"] == "exact"], color, "-", positive=True)
                _lines(ax, sub[sub["method"] == "bound"], color, "--", positive=True)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            _letter(ax, letter, text)
        handles = _handles([(s, {"color": colors[s], "ls": "-"}) for s in labels])
        handles += _handles(
            [
                ("exact", {"color": "0.2", "ls": "-"}),
                ("bound (the source's constants)", {"color": "0.2", "ls": "--"}),
            ]
        )
        _legend(axes[1], handles, loc="upper left")
        _legend(
            axes[2],
            _handles(
                [
                    ("bias bound / exact", {"color": "0.2", "ls": "-"}),
                    ("variance bound / exact", {"color": "0.2", "ls": ":"}),
                ]
            ),
            loc="upper left",
        )
        if title:
            fig.suptitle(title)
    return fig
