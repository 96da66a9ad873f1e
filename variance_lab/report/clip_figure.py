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
Markers are hollow and differ in shape, so the models stay apart in greyscale; they are drawn
largest first (:data:`MARKER_SIZES`), so that markers at the same place nest instead of hiding one
another, and a model whose predictions equal an earlier model's in a panel is drawn once and named
with it (``i.i.d. lognormal = autocorrelation-corrected``).

Each bucket is numbered 1, 2, ... in the table's order (by length); the numbers stand on each
panel's top edge over the bucket's observed fraction (a label that would come closer than
:data:`LABEL_GAP` of the panel's width to its neighbour goes one row up), and the figure's title
lists the length range of each number (:func:`bucket_key`), after the data set's name when
``title`` gives it.

Token-level fractions are small, so a panel is on log axes (:data:`LOG_KINDS`, or any kind
whose values all lie below :data:`LOG_BELOW`). Values below the panel's floor (a
prediction of :math:`10^{-31}`, an interval starting at 0) are drawn on its bottom or left
edge and listed in a note, with their values: in the panel's free corner, or, where a point
would lie beneath it, beside the panel (an empty slot of the grid) or under it.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.ticker
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
    "LABEL_CHAR",
    "LABEL_GAP",
    "LOG_BELOW",
    "LOG_KINDS",
    "MARKER_SIZES",
    "MODEL_MARKERS",
    "bucket_key",
    "clip_figure",
    "clip_kinds",
    "clip_models",
]

#: Colour, marker and label of each known model (the first three as in the analysis figure; the fitted
#: ones under the names the command line prints, ``mix``, ``hier``, ``comb``, and what they are).
MODEL_MARKERS = {
    "iid": {"color": MODEL_STYLE["iid"]["color"], "marker": "s", "label": "i.i.d. lognormal"},
    "emp": {"color": MODEL_STYLE["emp"]["color"], "marker": "v", "label": "i.i.d. empirical"},
    "corr": {"color": MODEL_STYLE["corr"]["color"], "marker": "^", "label": "autocorrelation-corrected"},
    "mix": {"color": _style.color(5), "marker": "D", "label": "mix (token mixture)"},
    "hier": {"color": _style.color(6), "marker": "o", "label": "hier (random scale)"},
    "comb": {"color": _style.color(0), "marker": "P", "label": "comb (combined)"},
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
#: Marker size of the figure's ``i``-th model (known models first): largest first, so coincident markers nest.
MARKER_SIZES = (6.2, 5.4, 4.7, 4.0, 3.4, 2.8)
#: Vertical padding around each panel of a figure made here (inches; constrained layout's ``h_pad``).
ROW_PAD = 0.1
#: Characters per line of a panel's notes (longer ones wrap, so the note stays inside the panel).
NOTE_WIDTH = 40
#: Space kept between two bucket labels in one row on a panel's top edge (a fraction of the
#: panel's width); a label that would come closer goes one row up.
LABEL_GAP = 0.015
#: Rough width of one character of a bucket label, as a fraction of a panel's width.
LABEL_CHAR = 0.022
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
    for i, m in enumerate(models):
        if m in MODEL_MARKERS:
            st = dict(MODEL_MARKERS[m])
        else:
            marker, colour = next(extras, EXTRA_MARKERS[-1])
            st = {"color": colour, "marker": marker, "label": m}
        if labels and m in labels:
            st["label"] = labels[m]
        st["ms"] = MARKER_SIZES[min(i, len(MARKER_SIZES) - 1)]
        st["zorder"] = 3 + 0.01 * i  # smaller markers on top of larger ones
        styles[m] = st
    return styles


def _same_as_earlier(preds: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """Group models whose predictions are equal (to 1e-12, relative) in this panel: first model -> group."""
    groups: dict[str, list[str]] = {}
    for m, y in preds.items():
        for first, members in groups.items():
            z = preds[first]
            same_nan = np.array_equal(np.isnan(y), np.isnan(z))
            if same_nan and np.allclose(y[~np.isnan(y)], z[~np.isnan(z)], rtol=1e-12, atol=0.0):
                members.append(m)
                break
        else:
            groups[m] = [m]
    return groups


def bucket_key(table: pd.DataFrame) -> str:
    """Two lines naming each bucket's number and length range, as in ``1: 8-15, 2: 16-31``.

    Buckets are numbered 1, 2, ... in the table's order; the range is ``T_lo``-``T_hi`` (or
    ``T_min``-``T_max``) where the table has them, else the mean length ``T_mean``; empty
    when the table has none of these.
    """
    for lo_col, hi_col in (("T_lo", "T_hi"), ("T_min", "T_max")):
        if {lo_col, hi_col} <= set(table.columns):
            ranges = [f"{int(a)}-{int(b)}" for a, b in zip(table[lo_col], table[hi_col], strict=True)]
            break
    else:
        if "T_mean" not in table:
            return ""
        ranges = [f"about {v:.0f}" for v in table["T_mean"]]
    items = ", ".join(f"{i}: {r}" for i, r in enumerate(ranges, start=1))
    return "length buckets, numbered on each panel's top edge, by length $T$:\n" + textwrap.fill(items, 90)


def _fraction(v: np.ndarray, scale: str, limits) -> np.ndarray:
    """Positions ``v`` as fractions of a panel's axis (linear or log) between ``limits``."""
    lo, hi = limits
    if scale == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    return (v - lo) / (hi - lo)


def _label_rows(pos: np.ndarray) -> dict[int, int]:
    """Row of each bucket label on the top edge: the lowest row where it keeps :data:`LABEL_GAP` clear.

    Labels are placed left to right; one that would come closer than its half width plus its
    neighbour's (:data:`LABEL_CHAR` per character) and :data:`LABEL_GAP` to the last label of a
    row goes one row up, so buckets at the same place stand one above the other.
    """
    last: list[tuple[float, float]] = []  # per row: (position, half width) of its last label
    rows = {}
    for i in sorted((i for i in range(pos.size) if np.isfinite(pos[i])), key=lambda i: (pos[i], i)):
        half = LABEL_CHAR * len(str(i + 1)) / 2
        row = next(
            (r for r, (p, h) in enumerate(last) if pos[i] - p >= h + half + LABEL_GAP),
            len(last),
        )
        if row == len(last):
            last.append((pos[i], half))
        last[row] = (pos[i], half)
        rows[i] = row
    return rows


def _bucket_labels(ax, x: np.ndarray, scale: str, limits) -> int:
    """Write each bucket's number on the panel's top edge over its observed fraction; return the rows used.

    The numbers are the tick labels of a secondary top axis (ticks at the observed fractions), so
    the title and constrained layout make room for them; labels that would touch stand in rows
    one above the other (:func:`_label_rows`; a row is a trailing line break of the label).
    """
    pos = _fraction(x, scale, limits)
    rows = _label_rows(pos)
    if not rows:
        return 0
    top = ax.secondary_xaxis("top")
    order = sorted(rows)
    top.set_xticks([float(x[i]) for i in order], [str(i + 1) + "\n" * rows[i] for i in order])
    top.xaxis.set_minor_locator(mpl.ticker.NullLocator())
    top.tick_params(axis="x", length=2.5, pad=1.5, labelsize=_style.small_font(), labelcolor="0.3")
    return max(rows.values()) + 1


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


#: Height of one line of a panel's note, as a fraction of the panel's height (for the free-corner test).
NOTE_LINE = 0.055


def _note(ax, text: str, scale: str, limits, points: list[np.ndarray], beside: bool = False) -> None:
    """Write a panel's note in its free corner, or, where a point would lie beneath it, beside or under it.

    The corner is the upper left on log panels (above the floor's points), the lower right on
    linear ones (below the diagonal); it counts as free when no drawn marker lies in the note's
    rough extent (:data:`NOTE_WIDTH` characters by :data:`NOTE_LINE` per line). Otherwise the
    note stands to the right of the panel when ``beside`` (the grid's slot there is empty; the
    note stays out of the layout), else under the panel below its x label, where constrained
    layout makes room for it.
    """
    at_top = scale == "log"
    height = 0.03 + NOTE_LINE * (text.count("\n") + 1)
    width = 0.03 + LABEL_CHAR * max(len(line) for line in text.splitlines())
    xy = np.concatenate(points) if points else np.empty((0, 2))
    fx, fy = _fraction(xy[:, 0], scale, limits), _fraction(xy[:, 1], scale, limits)
    covered = (fx < width) & (fy > 1.0 - height) if at_top else (fx > 1.0 - width) & (fy < height)
    common = {"fontsize": _style.small_font(), "color": "0.3", "annotation_clip": False}
    if height < 1.0 and not covered.any():
        ax.annotate(
            text,
            xy=(0.03 if at_top else 0.97, 0.97 if at_top else 0.03),
            xycoords="axes fraction",
            ha="left" if at_top else "right",
            va="top" if at_top else "bottom",
            **common,
        )
        return
    if beside:
        note = ax.annotate(
            text,
            xy=(1.0, 1.0),
            xycoords="axes fraction",
            xytext=(10.0, 0.0),
            textcoords="offset points",
            ha="left",
            va="top",
            **common,
        )
        note.set_in_layout(False)  # it fills the empty slot; the panels keep their size
        return
    ax.annotate(
        text,
        xy=(0.0, 0.0),
        xycoords=("axes fraction", ax.xaxis.label),
        xytext=(0.0, -3.0),
        textcoords="offset points",
        ha="left",
        va="top",
        **common,
    )


def _panel(
    ax, table: pd.DataFrame, kind: str, styles: dict, level, scale: str, kwargs: dict, beside: bool = False
) -> set[str]:
    """Draw one kind's panel; return the models drawn with their own marker here."""
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
    groups = _same_as_earlier({m: preds[m] for m in styles})
    drawn, merged, points = set(), [], []
    for m, members in groups.items():
        st, y = styles[m], preds[m]
        label = " = ".join(styles[k]["label"] for k in members)
        ok = np.isfinite(y) & np.isfinite(x)
        if not ok.any():
            missing.append(label)
            continue
        drawn.add(m)
        xs, ys, los, his = x[ok], y[ok], lo[ok], hi[ok]
        if len(members) > 1 and not (scale == "log" and (ys < floor).all()):
            merged.append(label)  # drawn inside the panel: say whose marker stands for both
        if scale == "log":
            below = ys < floor
            if below.any():
                vals = list(dict.fromkeys(_fmt(v) for v in sorted(ys[below])))  # as printed, once each
                text = ", ".join(vals) if len(vals) <= 2 else f"{vals[0]} to {vals[-1]}"
                edge_notes.append(f"{label}: {text}")
            ys = np.maximum(ys, floor)
            xs, los, his = np.maximum(xs, floor), np.maximum(los, floor), np.maximum(his, floor)
        kw = {
            "fmt": st["marker"],
            "color": st["color"],
            "mfc": "none",
            "mec": st["color"],
            "ms": st["ms"],
            "mew": 0.9,
            "elinewidth": 0.6,
            "capsize": 1.2,
            "zorder": st["zorder"],
            **kwargs,
        }
        ax.errorbar(xs, ys, xerr=[xs - los, his - xs], **kw)
        points.append(np.column_stack([xs, ys]))
    x_at = np.where(np.isfinite(x), np.maximum(x, floor), np.nan) if scale == "log" else x
    _bucket_labels(ax, x_at, scale, limits)
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    ax.set_box_aspect(1.0)  # square, with equal limits on both axes: the diagonal at 45 degrees
    ci = f"{100 * level:g} % interval" if level is not None else "interval"
    ax.set_xlabel(f"observed ({ci})")
    ax.set_ylabel("predicted")
    ax.set_title(KIND_TITLES.get(kind, f"{kind.upper()} clip fraction"))  # placed above the bucket numbers
    notes = []
    if scale == "log" and np.any(lo[np.isfinite(x)] < floor):
        edge_notes.append("an observed interval from 0")
    if edge_notes:
        lines = (
            textwrap.fill(n, NOTE_WIDTH, subsequent_indent="    ", break_on_hyphens=False) for n in edge_notes
        )
        notes.append(f"drawn on the edge, below {_fmt(floor)}:\n" + "\n".join(lines))
    if merged:
        notes.append(
            textwrap.fill(
                "one marker for equal predictions: " + "; ".join(merged), NOTE_WIDTH, break_on_hyphens=False
            )
        )
    if missing:
        notes.append(
            textwrap.fill(
                "no prediction in the table: " + ", ".join(missing), NOTE_WIDTH, break_on_hyphens=False
            )
        )
    if notes:
        _note(ax, "\n".join(notes), scale, limits, points, beside)
    return drawn


def _axes(fig, ax, n: int, figsize):
    if ax is not None:
        axes = list(np.ravel(ax)) if isinstance(ax, Sequence | np.ndarray) else [ax]
        if len(axes) != n:
            raise ValueError(f"ax must hold {n} axes, one per panel, got {len(axes)}")
        return axes[0].figure, axes
    if fig is None:
        import matplotlib.pyplot as plt

        rows = 1 if n <= 2 else math.ceil(n / 2)  # three panels or more: two per row
        size = (2 * _style.COLUMN_WIDTH, 3.7 * rows + 0.6) if figsize is None else figsize
        fig = plt.figure(figsize=size, layout="constrained")
        fig.get_layout_engine().set(h_pad=ROW_PAD)  # square panels: constrained layout needs the room
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
    title: str | None = None,
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
        Size of a new figure (default 6.8 in wide, two columns of a paper, and 3.7 in per row of panels
        plus 0.6 in for the title and legend).
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package's paper style
        (:func:`variance_lab.report.style.use`).
    title : str, optional
        First line of the figure's title (the data set); the second line is the bucket key
        (:func:`bucket_key`), which numbers the buckets labelled on each panel's top edge.
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
        spare = ax is None and len(kinds) > 2 and len(kinds) % 2 == 1  # the last row's right slot is empty
        for i, (axis, kind) in enumerate(zip(axes, kinds, strict=True)):
            here = {m: st for m, st in styles.items() if m in clip_models(table, kind)}
            scale = "log" if _is_log(table, kind, list(here)) else "linear"
            beside = spare and i == len(kinds) - 1
            drawn |= _panel(axis, table, kind, here, level, scale, kwargs, beside)
        if legend:
            handles = [
                Line2D(
                    [],
                    [],
                    ls="",
                    marker=st["marker"],
                    color=st["color"],
                    mfc="none",
                    ms=st["ms"],
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
        heading = "\n".join(t for t in (title, bucket_key(table)) if t)
        if heading:
            fig.suptitle(heading)
    return fig
