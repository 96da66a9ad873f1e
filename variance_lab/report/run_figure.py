r"""Figure of a run: the analysis statistics of each training step, across steps.

Drawn from the two tidy frames of :func:`variance_lab.rollouts.steps.analyze_run` only: one row
per step (:data:`~variance_lab.rollouts.steps.STEP_COLUMNS`) and one row per step and length
bucket (the analysis table with ``step`` and ``khat_P``). Panels (:data:`PANELS`), stacked over
a shared training-step axis:

``gspo``
    GSPO's clip fraction: the fraction of sequences whose :math:`G_T = P_T^{1/T}` lies outside its
    range, per length bucket, and over all lengths (black).
``ppo``
    PPO's clip fraction: the fraction of tokens whose ratio :math:`r_t` lies outside its range.
``var_G``
    The sample :math:`\operatorname{Var}(G_T)` per length bucket with its bootstrap interval, on
    a log axis (no pooled value: the variance falls with :math:`T`, a pool over lengths mixes them).
``khat``
    The Pareto :math:`\hat k` of the sequence weights :math:`P_T`, per bucket and over all
    lengths, with PSIS's limit 0.7 (:data:`variance_lab.stats.KHAT_THRESHOLD`) dashed: above it an
    importance-weighted average over the step's sequences is not to be trusted.
``mismatch``
    The mismatch :math:`\pi_{old}/\mu_{rollout}`: its k3 KL estimate
    :math:`\overline{\rho - \log\rho - 1}` over the step's tokens (log axis); a note where the
    dumps hold no inference-engine log-probs.

A bucket's value is drawn where the step has at least ``min_seq`` sequences in it (default
:data:`MIN_SEQ`, the analysis's smallest bucket it judges); a bucket never that full is left
out of the figure. Buckets are told apart by colour (light to dark with length, the
:data:`~variance_lab.report.style.SEQUENTIAL_CMAP` colour map) and by marker.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from variance_lab.report import style as _style
from variance_lab.report.figure_kit import centre_note, panel_axes
from variance_lab.stats import KHAT_THRESHOLD

__all__ = ["MIN_SEQ", "PANELS", "PANEL_LABELS", "run_figure"]

#: The panels :func:`run_figure` can draw, in their default order.
PANELS = ("gspo", "ppo", "var_G", "khat", "mismatch")
#: The y label of each panel.
PANEL_LABELS = {
    "gspo": "GSPO clip fraction\n(sequences)",
    "ppo": "PPO clip fraction\n(tokens)",
    "var_G": r"$\mathrm{Var}(G_T)$",
    "khat": r"Pareto $\hat k$ of $P_T$",
    "mismatch": "mismatch k3 KL\n" + r"of $\pi_{old}/\mu_{rollout}$",
}
#: Fewest sequences of a bucket in a step for its value to be drawn (the analysis's MIN_BUCKET_SEQUENCES).
MIN_SEQ = 20
#: Bucket value per panel (column of the bucket frame), and the pooled value (column of the step frame).
_COLUMNS = {
    "gspo": ("gspo_clip_frac", "gspo_clip_frac"),
    "ppo": ("ppo_clip_frac", "ppo_clip_frac"),
    "var_G": ("var_G", None),
    "khat": ("khat_P", "khat_P"),
    "mismatch": (None, "mismatch_k3_kl"),
}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_POOLED = {"color": "black", "ls": "-", "lw": 1.4, "marker": ".", "label": "all lengths"}


def _axes(fig, ax, panels, figsize, legend: bool):
    """(figure, axes, new?): the given axes, panels in ``fig``, or a new one-column figure."""
    return panel_axes(fig, ax, panels, figsize, 0.5 + 1.45 * len(panels) + (0.7 if legend else 0.0))


def _bucket_styles(buckets: pd.DataFrame, min_seq: int) -> dict:
    """Colour, marker and label of each bucket ``(T_lo, T_hi)`` drawn somewhere (enough sequences)."""
    full = buckets[buckets["n_seq"] >= min_seq]
    keys = sorted({(int(lo), int(hi)) for lo, hi in full[["T_lo", "T_hi"]].itertuples(index=False)})
    cmap = mpl.colormaps[_style.SEQUENTIAL_CMAP]
    at = np.linspace(0.82, 0.0, len(keys)) if len(keys) > 1 else [0.0]
    return {
        key: {
            "color": cmap(float(a)),
            "marker": _MARKERS[i % len(_MARKERS)],
            "label": f"$T$ {key[0]}-{key[1]}",
        }
        for i, (key, a) in enumerate(zip(keys, at, strict=True))
    }


def _bucket_lines(ax, panel: str, buckets: pd.DataFrame, styles: dict, min_seq: int) -> None:
    col = _COLUMNS[panel][0]
    for (lo, hi), kw in styles.items():
        rows = buckets[(buckets["T_lo"] == lo) & (buckets["T_hi"] == hi)].sort_values("step")
        x = rows["step"].to_numpy(float)
        y = np.where(rows["n_seq"].to_numpy() >= min_seq, rows[col].to_numpy(float), np.nan)
        if panel == "var_G":
            lo_, hi_ = rows["var_G_lo"].to_numpy(float), rows["var_G_hi"].to_numpy(float)
            ok = np.isfinite(y) & np.isfinite(lo_) & np.isfinite(hi_)
            ax.errorbar(
                x[ok],
                y[ok],
                yerr=[y[ok] - lo_[ok], hi_[ok] - y[ok]],
                fmt="none",
                ecolor=kw["color"],
                elinewidth=0.6,
            )
        ax.plot(x, y, ms=3.0, lw=0.9, **kw)


def _panel(ax, panel: str, steps: pd.DataFrame, buckets: pd.DataFrame, styles: dict, min_seq: int) -> None:
    bucket_col, step_col = _COLUMNS[panel]
    if bucket_col is not None:
        _bucket_lines(ax, panel, buckets, styles, min_seq)
    if step_col is not None:
        x, y = steps["step"].to_numpy(float), steps[step_col].to_numpy(float)
        if panel == "mismatch" and not np.isfinite(y).any():
            centre_note(ax, "no inference-engine log-probs (rollout_logp):\nno mismatch to show")
        else:
            ax.plot(x, y, **{**_POOLED, "label": _POOLED["label"] if panel != "mismatch" else "_mismatch"})
    if panel in ("var_G", "mismatch") and ax.has_data():
        ax.set_yscale("log")
    if panel == "khat":
        ax.axhline(KHAT_THRESHOLD, color="0.4", ls="--", lw=0.8, label=rf"$\hat k$ = {KHAT_THRESHOLD:g}")
    if panel in ("gspo", "ppo"):
        ax.set_ylim(bottom=0.0)
        drawn = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in ax.get_lines()] or [np.zeros(0)])
        if drawn.size and np.all(drawn[np.isfinite(drawn)] == 0.0):
            centre_note(ax, f"no {'sequence' if panel == 'gspo' else 'token'} clipped in any step")
    ax.set_ylabel(PANEL_LABELS[panel])


def _legend_handles(axes) -> list:
    handles, seen = [], set()
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            if label not in seen and not label.startswith("_"):
                seen.add(label)
                handles.append(handle)
    return handles


def run_figure(
    steps: pd.DataFrame,
    buckets: pd.DataFrame,
    *,
    fig=None,
    ax=None,
    panels: Sequence[str] = PANELS,
    min_seq: int = MIN_SEQ,
    legend: bool = True,
    figsize=None,
    style=None,
) -> Figure:
    r"""Draw the statistics of a run across its training steps (module docstring), one panel each.

    Parameters
    ----------
    steps : pandas.DataFrame
        One row per step (:data:`variance_lab.rollouts.steps.STEP_COLUMNS`; uses ``step``,
        ``gspo_clip_frac``, ``ppo_clip_frac``, ``khat_P``, ``mismatch_k3_kl``).
    buckets : pandas.DataFrame
        One row per step and length bucket (:attr:`variance_lab.rollouts.steps.RunAnalysis.buckets`;
        uses ``step``, ``T_lo``, ``T_hi``, ``n_seq`` and the panels' columns).
    fig : matplotlib.figure.Figure, optional
        Draw the panels into this figure (stacked, shared step axis).
    ax : matplotlib.axes.Axes or sequence of Axes, optional
        Draw into these axes instead, one per panel.
    panels : sequence of str
        Which of :data:`PANELS` to draw, top to bottom.
    min_seq : int
        Fewest sequences of a bucket in a step for its value to be drawn.
    legend : bool
        Draw a legend (the buckets, all lengths, the k-hat limit): below the panels of a new
        figure, in the top panel otherwise.
    figsize : (float, float), optional
        Size of a new figure (default 3.4 in wide, 1.45 in a panel).
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package's paper style.

    Returns
    -------
    matplotlib.figure.Figure
    """
    panels = list(panels)
    if not panels or any(p not in PANELS for p in panels):
        raise ValueError(f"panels must be a non-empty sequence of {PANELS}, got {panels!r}")
    if steps.empty:
        raise ValueError("steps is empty: no step to draw")
    with _style.use(style):
        fig, axes, new = _axes(fig, ax, panels, figsize, legend)
        styles = _bucket_styles(buckets, min_seq)
        for axis, panel in zip(axes, panels, strict=True):
            _panel(axis, panel, steps, buckets, styles, min_seq)
        axes[-1].set_xlabel("training step")
        axes[-1].xaxis.get_major_locator().set_params(integer=True)
        handles = _legend_handles(axes)
        if legend and handles:
            if new:
                fig.legend(handles=handles, loc="outside lower center", ncol=2)
            else:
                axes[0].legend(handles=handles, loc="best", ncol=2)
    return fig
