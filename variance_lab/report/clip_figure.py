r"""Observed against predicted clip fractions, per length bucket, one marker per model.

Drawn from the per-bucket table of :func:`variance_lab.rollouts.analysis.analyze` only. For each
kind of clip ``K`` found in the table (``gspo``: the fraction of sequences whose
:math:`G_T = P_T^{1/T}` lies outside GSPO's range; ``ppo``: the fraction of tokens whose
:math:`r_t` lies outside PPO's range; any other ``K`` with the same columns, e.g. ``gmpo``) one
panel shows, for every bucket, the observed fraction ``K_clip_frac`` with its interval
(``K_clip_frac_lo``, ``K_clip_frac_hi``) on :math:`x` against each model's prediction
``K_clip_pred_<m>`` on :math:`y`, with the diagonal :math:`y = x`: a calibrated model puts its
markers on the diagonal, within their horizontal bars.

The models are read from the column names (:func:`clip_models`): every suffix ``<m>`` of a
``K_clip_pred_<m>`` column, so a model added to the analysis appears without a change here.
Known models keep their colour, marker and label (:data:`MODEL_MARKERS`); others get the next
free marker of :data:`EXTRA_MARKERS` (none a known model uses) and their suffix as label.
Markers are hollow and differ in shape, so the models stay apart in greyscale and where they overlap.

Token-level fractions are small, so a panel is on log axes (:data:`LOG_KINDS`, or any kind
whose values all lie below :data:`LOG_BELOW`). Values below the panel's floor (a
prediction of :math:`10^{-31}`, an interval starting at 0) are drawn on its bottom or left
edge and listed in a note in the panel, with their values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D

from variance_lab.report import style as _style
from variance_lab.report.analysis_figure import MODEL_STYLE

__all__ = [
    "EXTRA_MARKERS",
    "KIND_TITLES",
    "LOG_BELOW",
    "LOG_KINDS",
    "MODEL_MARKERS",
    "clip_figure",
    "clip_kinds",
    "clip_models",
]

#: Colour, marker and label of each known model (the first three as in the analysis figure).
MODEL_MARKERS = {
    "iid": {"color": MODEL_STYLE["iid"]["color"], "marker": "s", "label": "i.i.d. lognormal"},
    "emp": {"color": MODEL_STYLE["emp"]["color"], "marker": "v", "label": "i.i.d. empirical"},
    "corr": {"color": MODEL_STYLE["corr"]["color"], "marker": "^", "label": "autocorrelation-corrected"},
    "mix": {"color": _style.color(5), "marker": "D", "label": "token mixture"},
    "hier": {"color": _style.color(6), "marker": "o", "label": "random scale"},
    "comb": {"color": _style.color(0), "marker": "P", "label": "combined (sparse rate by position)"},
}
#: (marker, colour) of models not in :data:`MODEL_MARKERS`, in the order they are found.
EXTRA_MARKERS = (
    ("P", _style.color(0)),
    ("X", _style.color(2)),
    ("*", _style.color(7)),
    ("h", _style.color(0)),
    ("<", _style.color(2)),
    (">", _style.color(7)),
    ("p", _style.color(0)),
    ("d", _style.color(2)),
)
#: Title of each known kind of clip; others get ``"<KIND> clip fraction"``.
KIND_TITLES = {"gspo": "GSPO: fraction of sequences clipped", "ppo": "PPO: fraction of tokens clipped"}
#: Kinds always drawn on log axes (token-level fractions).
LOG_KINDS = ("ppo",)
#: A kind not in :data:`LOG_KINDS` and not ``gspo`` is drawn on log axes when all its values are below this.
LOG_BELOW = 0.1
_FIRST = ("gspo", "ppo")
_KIND_RE = re.compile(r"^([A-Za-z0-9]+)_clip_frac$")


def clip_kinds(table: pd.DataFrame) -> list[str]:
    """Return the kinds of clip the table has: ``K`` with ``K_clip_frac`` and a ``K_clip_pred_<m>`` column.

    ``gspo`` and ``ppo`` first, then the others in column order.

    Parameters
    ----------
    table : pandas.DataFrame
        Per-bucket table of :func:`variance_lab.rollouts.analysis.analyze`.

    Returns
    -------
    list of str
    """
    found = [m.group(1) for c in table.columns if (m := _KIND_RE.match(str(c)))]
    found = [k for k in found if clip_models(table, k)]
    return [k for k in _FIRST if k in found] + [k for k in found if k not in _FIRST]


def clip_models(table: pd.DataFrame, kind: str) -> list[str]:
    """Return the model suffixes ``<m>`` of the ``KIND_clip_pred_<m>`` columns of ``table``.

    Known models (:data:`MODEL_MARKERS`) first, in its order, then the others in column order.
    The unsuffixed ``KIND_clip_pred`` (a copy of one model's column) is not a model.

    Parameters
    ----------
    table : pandas.DataFrame
    kind : str
        ``"gspo"``, ``"ppo"``, ...

    Returns
    -------
    list of str
    """
    prefix = f"{kind}_clip_pred_"
    found = [
        str(c)[len(prefix) :]
        for c in table.columns
        if str(c).startswith(prefix) and len(str(c)) > len(prefix)
    ]
    return [m for m in MODEL_MARKERS if m in found] + [m for m in found if m not in MODEL_MARKERS]


def _model_styles(models: Sequence[str], labels: dict | None) -> dict[str, dict]:
    styles = {}
    known = {st["marker"] for st in MODEL_MARKERS.values()}
    extras = iter([e for e in EXTRA_MARKERS if e[0] not in known] or EXTRA_MARKERS)
    for m in models:
        if m in MODEL_MARKERS:
            st = dict(MODEL_MARKERS[m])
        else:
            marker, colour = next(extras, EXTRA_MARKERS[-1])
            st = {"color": colour, "marker": marker, "label": m}
        if labels and m in labels:
            st["label"] = labels[m]
        styles[m] = st
    return styles


def _is_log(table: pd.DataFrame, kind: str, models: Sequence[str]) -> bool:
    if kind in LOG_KINDS:
        return True
    if kind == "gspo":
        return False
    cols = [f"{kind}_clip_frac", *(f"{kind}_clip_pred_{m}" for m in models)]
    values = table[cols].to_numpy(float)
    values = values[np.isfinite(values)]
    return bool(values.size) and float(values.max()) < LOG_BELOW


def _fmt(v: float) -> str:
    return f"{v:.2g}" if v != 0 else "0"


def _log_floor(values: np.ndarray) -> float:
    """Return a decade below the smallest positive observed value (observed fractions, interval ends)."""
    pos = values[np.isfinite(values) & (values > 0)]
    if not pos.size:
        return 1e-6
    return 10.0 ** (math.floor(math.log10(float(pos.min()))) - 1)


def _panel(ax, table: pd.DataFrame, kind: str, styles: dict, level, scale: str, kwargs: dict) -> list[str]:
    """Draw one kind's panel; return the labels of models without a finite prediction here."""
    x = table[f"{kind}_clip_frac"].to_numpy(float)
    lo_col, hi_col = f"{kind}_clip_frac_lo", f"{kind}_clip_frac_hi"
    lo = table[lo_col].to_numpy(float) if lo_col in table else np.full(x.shape, np.nan)
    hi = table[hi_col].to_numpy(float) if hi_col in table else np.full(x.shape, np.nan)
    lo, hi = np.where(np.isfinite(lo), np.minimum(lo, x), x), np.where(np.isfinite(hi), np.maximum(hi, x), x)
    preds = {m: table[f"{kind}_clip_pred_{m}"].to_numpy(float) for m in styles}
    if scale == "log":
        floor = _log_floor(np.concatenate([x, lo]))
        values = np.concatenate([hi, *preds.values()])
        values = values[np.isfinite(values) & (values > 0)]
        top = 10.0 ** math.ceil(math.log10(float(values.max()))) if values.size else 1.0
        top = max(min(top, 1.0), 10 * floor)
        ax.set_xscale("log")
        ax.set_yscale("log")
        limits = (floor / 1.5, min(top * 1.5, 1.2))
    else:
        floor, limits = 0.0, (-0.02, 1.02)
    edge_notes, missing = [], []
    ax.plot(
        [max(limits[0], 1e-300), limits[1]],
        [max(limits[0], 1e-300), limits[1]],
        color="0.55",
        lw=0.8,
        zorder=1,
    )
    for m, st in styles.items():
        y = preds[m]
        ok = np.isfinite(y) & np.isfinite(x)
        if not ok.any():
            missing.append(st["label"])
            continue
        xs, ys, los, his = x[ok], y[ok], lo[ok], hi[ok]
        if scale == "log":
            below = ys < floor
            if below.any():
                vals = list(dict.fromkeys(_fmt(v) for v in sorted(ys[below])))  # as printed, once each
                text = ", ".join(vals) if len(vals) <= 2 else f"{vals[0]} to {vals[-1]}"
                edge_notes.append(f"{st['label']}: {text}")
            ys = np.maximum(ys, floor)
            xs, los, his = np.maximum(xs, floor), np.maximum(los, floor), np.maximum(his, floor)
        kw = {
            "fmt": st["marker"],
            "color": st["color"],
            "mfc": "none",
            "mec": st["color"],
            "ms": 4.0,
            "mew": 0.9,
            "elinewidth": 0.6,
            "capsize": 1.2,
            "zorder": 3,
            **kwargs,
        }
        ax.errorbar(xs, ys, xerr=[xs - los, his - xs], **kw)
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    ax.set_aspect("equal", adjustable="box")
    ci = f"{100 * level:g} % interval" if level is not None else "interval"
    ax.set_xlabel(f"observed ({ci})")
    ax.set_ylabel("predicted")
    ax.set_title(KIND_TITLES.get(kind, f"{kind.upper()} clip fraction"))
    notes = []
    if scale == "log" and np.any(lo[np.isfinite(x)] < floor):
        edge_notes.append("an observed interval from 0")
    if edge_notes:
        notes.append(f"drawn on the edge, below {_fmt(floor)}:\n" + "\n".join(edge_notes))
    if missing:
        notes.append("no prediction: " + ", ".join(missing))
    if notes:
        at_top = scale == "log"  # log panels: the corner above the points; linear: below the diagonal
        ax.text(
            0.03 if at_top else 0.97,
            0.97 if at_top else 0.03,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="left" if at_top else "right",
            va="top" if at_top else "bottom",
            fontsize=_style.small_font(),
            color="0.3",
        )
    return missing


def _axes(fig, ax, n: int, figsize):
    if ax is not None:
        axes = list(np.ravel(ax)) if isinstance(ax, Sequence | np.ndarray) else [ax]
        if len(axes) != n:
            raise ValueError(f"ax must hold {n} axes, one per panel, got {len(axes)}")
        return axes[0].figure, axes
    if fig is None:
        import matplotlib.pyplot as plt

        rows = 1 if n <= 2 else math.ceil(n / 2)  # three panels or more: two per row
        size = (2 * _style.COLUMN_WIDTH, 3.3 * rows) if figsize is None else figsize
        fig = plt.figure(figsize=size, layout="constrained")
    if n <= 2:
        return fig, list(fig.subplots(1, n, squeeze=False)[0])
    grid = fig.subplots(math.ceil(n / 2), 2, squeeze=False).ravel()
    for spare in grid[n:]:
        spare.set_axis_off()
    return fig, list(grid[:n])


def clip_figure(
    table: pd.DataFrame,
    *,
    fig=None,
    ax=None,
    kinds: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    labels: dict | None = None,
    level: float | None = 0.95,
    legend: bool = True,
    figsize=None,
    style=None,
    **kwargs,
) -> Figure:
    r"""Observed clip fraction per bucket (with its interval) against each model's prediction.

    One panel per kind of clip (GSPO's fraction of sequences with :math:`G_T \notin (a, b)`,
    PPO's fraction of tokens with :math:`r_t \notin (1 - \epsilon, 1 + \epsilon)`, and any other
    kind the table has), observed on :math:`x`, predicted on :math:`y`, the diagonal
    :math:`y = x`; one hollow marker shape per model (module docstring).

    Parameters
    ----------
    table : pandas.DataFrame
        Per-bucket table of :func:`variance_lab.rollouts.analysis.analyze` (or a subset of its
        columns): ``K_clip_frac``, ``K_clip_frac_lo``, ``K_clip_frac_hi`` and
        ``K_clip_pred_<m>`` for each kind ``K`` and model ``m``.
    fig : matplotlib.figure.Figure, optional
        Draw the panels into this figure, side by side.
    ax : matplotlib.axes.Axes or sequence of Axes, optional
        Draw into these axes instead, one per panel.
    kinds : sequence of str, optional
        Which kinds of clip to draw, left to right (default :func:`clip_kinds`: every kind found,
        ``gspo`` and ``ppo`` first).
    models : sequence of str, optional
        Which models to draw (default: every suffix found, :func:`clip_models`).
    labels : dict, optional
        Legend labels by model suffix, replacing the defaults (an unknown model's label is its suffix).
    level : float or None
        Confidence level of the observed intervals, for the axis label.
    legend : bool
        Draw one legend for all panels (below them in a figure made here, else in the last panel).
    figsize : (float, float), optional
        Size of a new figure (default 6.8 x 3.3 in, two columns of a paper).
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package's paper style
        (:func:`variance_lab.report.style.use`).
    **kwargs
        Passed to :meth:`matplotlib.axes.Axes.errorbar` of every model's markers (``ms``,
        ``alpha``, ...), over the defaults.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        When the table has no clip fractions with predictions, a requested kind or model is not
        in it, or ``ax`` holds the wrong number of axes.
    """
    found = clip_kinds(table)
    kinds = found if kinds is None else list(kinds)
    if not kinds:
        raise ValueError(
            "the table has no clip fractions with predictions (columns K_clip_frac and K_clip_pred_<model>)"
        )
    for k in kinds:
        if k not in found:
            raise ValueError(f"kind {k!r} is not in the table; it has {', '.join(found) or 'none'}")
    all_models = list(dict.fromkeys(m for k in kinds for m in clip_models(table, k)))
    chosen = all_models if models is None else list(models)
    for m in chosen:
        if m not in all_models:
            raise ValueError(f"model {m!r} is not in the table; it has {', '.join(all_models)}")
    styles = _model_styles([m for m in all_models if m in chosen], labels)
    with _style.use(style):
        fig, axes = _axes(fig, ax, len(kinds), figsize)
        drawn: set[str] = set()
        for axis, kind in zip(axes, kinds, strict=True):
            here = {m: st for m, st in styles.items() if m in clip_models(table, kind)}
            scale = "log" if _is_log(table, kind, list(here)) else "linear"
            missing = _panel(axis, table, kind, here, level, scale, kwargs)
            drawn |= {m for m, st in here.items() if st["label"] not in missing}
        if legend:
            handles = [
                Line2D(
                    [],
                    [],
                    ls="",
                    marker=st["marker"],
                    color=st["color"],
                    mfc="none",
                    ms=4.0,
                    label=st["label"],
                )
                for m, st in styles.items()
                if m in drawn
            ]
            handles.append(Line2D([], [], color="0.55", lw=0.8, label="predicted = observed"))
            if ax is None and isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
                fig.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)))
            else:
                axes[-1].legend(handles=handles, loc="upper left")
    return fig
