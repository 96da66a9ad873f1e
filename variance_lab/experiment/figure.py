r"""The experiment's figure: its data through :func:`~variance_lab.rollouts.analysis.analyze`, drawn.

Three panels over the sequence length :math:`T`: observed :math:`\operatorname{Var}(P_T)` and
:math:`\operatorname{Var}(G_T)` per length bucket against the i.i.d. and
autocorrelation-corrected predictions (:func:`variance_lab.report.analysis_figure.analysis_figure`),
and GSPO's clip fraction per bucket against the fraction those predictions imply
(:func:`clip_panel`). :func:`save_experiment_figure` writes ``experiment_variance.pdf``,
``.png``, ``.csv`` (the per-bucket table), ``_curves.csv`` (the prediction curves) and a
JSON sidecar with every parameter, the analysis summary and the data set's fingerprint; it
is the function the ``figures`` command calls for this figure. No PyTorch needed.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from variance_lab import __version__
from variance_lab._atomic import atomic_write
from variance_lab.experiment.names import DEFAULT_DATA, FIGURE_NAME
from variance_lab.experiment.task import TAGS
from variance_lab.provenance import read_json_object, text_sha256, versions, write_sidecar
from variance_lab.report import style as _style
from variance_lab.report.analysis_figure import COINCIDE, MODEL_STYLE
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.rollouts.weights import GSPO_RANGE, log_clip_range, sequence_weights
from variance_lab.schema import json_safe

__all__ = [
    "DEFAULT_DATA",
    "DEFAULT_TITLE",
    "FIGURE_NAME",
    "TOKEN_CLASSES",
    "analyze_data",
    "clip_panel",
    "experiment_figure",
    "experiment_title",
    "load_data",
    "observed_label",
    "resampled_clip",
    "save_experiment_figure",
    "token_findings",
]

#: Line of each predicted clip fraction: the style of its model in the analysis figure, no sparse markers.
_CLIP_STYLE = {
    col: {k: v for k, v in MODEL_STYLE[model].items() if k != "markevery"}
    for col, model in (
        ("gspo_clip_pred_iid", "iid"),
        ("gspo_clip_pred", "corr"),
        ("gspo_clip_resampled", "emp"),
    )
}
#: Token classes of a response, by character (see :func:`token_findings`).
TOKEN_CLASSES = {"digit": "0123456789", "tag": TAGS, "plus": "+", "equals": "=", "comma": ",", "end": "."}


def clip_panel(ax, table: pd.DataFrame, *, legend: bool = True, level: float | None = 0.95, style=None):
    """GSPO's clip fraction per length bucket: observed (points with intervals) against predicted (lines).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    table : pandas.DataFrame
        Per-bucket frame of :func:`variance_lab.rollouts.analysis.analyze` (``T_mean``, ``T_min``,
        ``T_max``, ``gspo_clip_frac``, ``gspo_clip_pred``, ``gspo_clip_pred_iid``), with
        ``gspo_clip_resampled`` (:func:`resampled_clip`) drawn where present. The observed
        fraction's interval (``gspo_clip_frac_lo``, ``gspo_clip_frac_hi``, as the analysis
        computes it) is its vertical bar where the table has it.
    legend : bool
        Draw a legend (lower right).
    level : float or None
        Confidence level of the intervals, for the legend.
    style : None, str or dict
        ``None``: the caller's rcParams; ``"paper"``: the package's paper style.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with _style.use(style):
        x = table["T_mean"].to_numpy(float)
        for col, kw in _CLIP_STYLE.items():
            if col in table:
                ax.plot(x, table[col].to_numpy(float), ms=2.5, **kw)
        xerr = np.vstack([x - table["T_min"].to_numpy(float), table["T_max"].to_numpy(float) - x])
        y = table["gspo_clip_frac"].to_numpy(float)
        yerr = None
        if {"gspo_clip_frac_lo", "gspo_clip_frac_hi"} <= set(table.columns):
            lo, hi = table["gspo_clip_frac_lo"].to_numpy(float), table["gspo_clip_frac_hi"].to_numpy(float)
            yerr = np.vstack([np.clip(y - lo, 0.0, None), np.clip(hi - y, 0.0, None)])
            yerr = np.where(np.isfinite(yerr), yerr, 0.0)
        ax.errorbar(
            x,
            y,
            yerr=yerr,
            xerr=xerr,
            color=_style.color(0),
            label=observed_label(level),
            **_style.ERRORBAR,
        )
        if ax.get_xscale() != "log":  # a shared axis keeps its ticks
            ax.set_xscale("log")
        ax.set_ylim(0.0, 1.0)
        ax.set_ylabel("GSPO clip fraction")
        if legend:
            ax.legend(loc="lower right")
    return ax.figure


def observed_label(level: float | None) -> str:
    """Legend label of the observed points of every panel (each panel's vertical bar is its own interval)."""
    ci = f"{100 * level:g} % interval" if level is not None else "interval"
    return f"observed per bucket with its {ci}\n(horizontal bar: range of $T$)"


#: Title of the figure when the data set's settings are not known (see :func:`experiment_title`).
DEFAULT_TITLE = "arithmetic-task experiment: tiny transformer, old vs new policy of its last GSPO step"


def experiment_title(settings: dict | None) -> str:
    """Title naming the GSPO iteration the ratios come from: the last of the data set's ``pg_iters``.

    The data set's ratios are those of the last GSPO iteration's sampling policy against the
    policy after that iteration's update (:func:`variance_lab.experiment.train.train`); the
    shipped data set ran four iterations.
    """
    iters = (settings or {}).get("pg_iters")
    if not isinstance(iters, int) or iters < 1:
        return DEFAULT_TITLE
    which = "its one GSPO iteration" if iters == 1 else f"the last of {iters} GSPO iterations"
    return f"arithmetic-task experiment: tiny transformer,\nold vs new policy of {which}"


def experiment_figure(
    table: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    fig=None,
    level: float = 0.95,
    figsize=None,
    style=None,
    title: str = DEFAULT_TITLE,
) -> Figure:
    """Draw the three panels: Var(P_T), Var(G_T) and GSPO's clip fraction against T.

    Parameters
    ----------
    table, curves : pandas.DataFrame
        :attr:`variance_lab.rollouts.analysis.AnalysisResult.table` and its ``curves()``.
    fig : matplotlib.figure.Figure, optional
        Draw into this figure (a new one-column figure by default).
    level : float
        Confidence level of the intervals, for the legend.
    figsize : (float, float), optional
        Size of a new figure (default 3.4 x 7.0 in).
    style : None, str or dict
        As for :func:`clip_panel`.
    title : str
        Title over the panels (:func:`experiment_title` of the data set's settings).

    Returns
    -------
    matplotlib.figure.Figure
    """
    from variance_lab.report.analysis_figure import analysis_figure
    from variance_lab.report.figure_kit import T_LABEL

    with _style.use(style):
        if fig is None:
            import matplotlib.pyplot as plt

            fig = plt.figure(figsize=figsize or (_style.COLUMN_WIDTH, 7.0), layout="constrained")
        axes = fig.subplots(3, 1, sharex=True)
        analysis_figure(table, curves, ax=list(axes[:2]), level=level, legend=False)
        clip_panel(axes[2], table, legend=False, level=level)
        _figure_legend(fig, axes, level)
        axes[1].set_xlabel("")
        axes[2].set_xlabel(T_LABEL)
        fig.suptitle(title)
    return fig


def _figure_legend(fig, axes, level: float | None) -> None:
    """One legend below the panels: every labelled line once, observed points last.

    The observed points' entry is the clip panel's errorbar (vertical and horizontal bars):
    every panel draws its observed points with their interval as the vertical bar.
    """
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if observed_label(level) not in labels:  # no clip panel drew them: a plain marker
        handles.append(Line2D([], [], marker="o", ls="", color=_style.color(0)))
        labels.append(observed_label(level))
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("observed"))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center", ncols=1)


def load_data(data=None) -> tuple[TokenBatch, list[dict] | None]:
    """Load the batch of a data set (default the shipped one) and, for JSONL, its raw records.

    Parameters
    ----------
    data : str or Path, optional
        Default :data:`DEFAULT_DATA`.

    Returns
    -------
    (TokenBatch, list of dict or None)
    """
    from variance_lab.rollouts.io import detect_format, load_batch

    path = Path(DEFAULT_DATA if data is None else data)
    if not path.is_file():
        raise ValueError(
            f"{str(path)!r}: no such data file (the shipped data set lives in data/ of the "
            "source tree; 'variance-lab experiment run' makes a new one)"
        )
    records = None
    if detect_format(path) == "jsonl":
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    return load_batch(path), records


def analyze_data(data=None, *, n_boot: int = 1000, seed: int = 0):
    """Load a data set (default the shipped one) and run :func:`variance_lab.rollouts.analysis.analyze` on it.

    Parameters
    ----------
    data : str or Path, optional
        Default :data:`DEFAULT_DATA`.
    n_boot, seed : int
        Bootstrap resamples per bucket and their seed.

    Returns
    -------
    variance_lab.rollouts.analysis.AnalysisResult
    """
    from variance_lab.rollouts.analysis import analyze

    return analyze(load_data(data)[0], n_boot=n_boot, seed=seed, folds=0)  # the figure needs no held-out fits


def resampled_clip(
    batch: TokenBatch, *, n_rep: int = 100, seed: int = 0, gspo_range=GSPO_RANGE, edges=None
) -> np.ndarray:
    r"""GSPO's clip fraction per length bucket if tokens were i.i.d. from their pooled empirical law.

    For each sequence of length :math:`T`, ``n_rep`` sequences of :math:`T` tokens are drawn
    with replacement from the pooled log-ratios and the fraction whose mean lies outside
    ``log(gspo_range)`` is recorded; a bucket's value averages its sequences. This keeps the
    tails of the real token distribution (which the Gaussian predictions of
    :func:`~variance_lab.rollouts.analysis.analyze` drop) but not how tokens group into sequences,
    so the gap to the observed fraction measures that grouping.

    Parameters
    ----------
    batch : TokenBatch
    n_rep : int
        Resampled sequences per observed sequence.
    seed : int
        Seed of a :class:`numpy.random.Generator` (the only randomness).
    gspo_range : tuple of float
    edges : None, "exact" or array_like of int
        Buckets, as for :func:`~variance_lab.rollouts.statistics.length_buckets`.

    Returns
    -------
    ndarray
        One value per non-empty bucket, in bucket order.
    """
    lo, hi = log_clip_range(gspo_range, "gspo_range")
    rng = np.random.default_rng(seed)
    d, lengths = batch.log_ratio, batch.lengths
    bucket, _ = length_buckets(lengths, edges)
    out = []
    for k in np.unique(bucket[bucket >= 0]):
        fractions = []
        for T in lengths[bucket == k]:
            mean = d[rng.integers(0, d.size, size=(n_rep, int(T)))].mean(axis=1)
            fractions.append(np.mean((mean < lo) | (mean > hi)))
        out.append(float(np.mean(fractions)))
    return np.array(out)


def _share(x2: np.ndarray, sel: np.ndarray) -> float:
    return float(x2[sel].sum() / x2.sum())


def token_findings(batch: TokenBatch, records: list[dict] | None = None) -> dict:
    r"""Where the variance of the token log-ratios sits: tails, sequences, token classes, rewards.

    Parameters
    ----------
    batch : TokenBatch
        The data set (no masks: tokens in response order).
    records : list of dict, optional
        Its JSONL records; with ``response`` texts and ``reward`` the breakdown by token class
        (:data:`TOKEN_CLASSES`) and by reward is added.

    Returns
    -------
    dict
        ``kurtosis`` of :math:`y = \log r` (3 for a Gaussian); ``tail_tokens``: fraction of
        tokens with :math:`|y| > 0.01` and their share of :math:`\sum (y - \bar y)^2`;
        ``top_sequences``: share of that sum held by the top 1 %, 5 %, 10 % of sequences;
        ``by_class`` and ``by_reward`` where the records allow.
    """
    d = batch.log_ratio
    z2 = (d - d.mean()) ** 2
    per_seq = np.sort(np.bincount(batch.segment, weights=z2))[::-1]
    n = per_seq.size
    out = {
        "kurtosis": float(np.mean(z2 * z2) / np.mean(z2) ** 2),
        "median_abs_log_ratio": float(np.median(np.abs(d))),
        "tail_tokens": {
            "threshold": 0.01,
            "fraction": float(np.mean(np.abs(d) > 0.01)),
            "share_of_sum_sq": _share(z2, np.abs(d) > 0.01),
        },
        "top_sequences": {
            f"{p}%": float(per_seq[: max(1, n * p // 100)].sum() / per_seq.sum()) for p in (1, 5, 10)
        },
    }
    if records and all("response" in r for r in records):
        chars = np.array(list("".join(r["response"] for r in records)))
        if chars.size == d.size:
            out["by_class"] = {
                name: {
                    "fraction": float(np.mean(sel)),
                    "share_of_sum_sq": _share(z2, sel),
                    "median_abs": float(np.median(np.abs(d[sel]))) if sel.any() else None,
                }
                for name, members in TOKEN_CLASSES.items()
                for sel in [np.isin(chars, list(members))]
            }
    if records and all("reward" in r for r in records):
        out["by_reward"] = _by_reward(batch, np.array([r["reward"] for r in records]))
    return out


def _by_reward(batch: TokenBatch, reward: np.ndarray) -> dict:
    """Sequences, mean length, token log-ratio variance and GSPO clip fraction per reward value."""
    clipped = sequence_weights(batch).clipped_gspo
    out = {}
    for v in np.unique(reward):
        sel = reward == v
        out[f"{v:g}"] = {
            "n_sequences": int(sel.sum()),
            "mean_length": float(batch.lengths[sel].mean()),
            "var_log_ratio": float(batch.log_ratio[np.repeat(sel, batch.lengths)].var()),
            "gspo_clip_frac": float(clipped[sel].mean()),
        }
    return out


def _data_fingerprint(path: Path) -> dict:
    """Return the data set's own sidecar fields that identify it (seed, settings, numbers' SHA-256)."""
    from variance_lab.experiment.files import sidecar_path

    side = sidecar_path(path)
    if not side.is_file():
        return {}
    meta = read_json_object(side, "the data set's sidecar")
    return {k: meta.get(k) for k in ("seed", "settings", "numbers_sha256", "quick")}


def save_experiment_figure(
    out="figures",
    *,
    data=None,
    n_boot: int = 1000,
    seed: int = 0,
    formats=("pdf", "png"),
    dpi: int | None = None,
    style="paper",
    quick: bool = False,
) -> list[Path]:
    """Analyse the data set and write the figure, its data and its sidecar into ``out``.

    Files: ``experiment_variance.pdf``, ``.png``, ``.csv`` (the per-bucket table of
    :func:`~variance_lab.rollouts.analysis.analyze` plus ``gspo_clip_resampled``, :func:`resampled_clip`),
    ``experiment_variance_curves.csv`` (prediction curves) and ``experiment_variance.json``
    (parameters, analysis summary, :func:`token_findings`, the data set's seed, settings and
    fingerprint, versions, SHA-256 of the two CSV files). Each is written atomically; the PDF carries no date.

    Parameters
    ----------
    out : str or Path
        Output folder (created when missing).
    data : str or Path, optional
        The data set; default the shipped :data:`DEFAULT_DATA`.
    n_boot, seed : int
        Bootstrap resamples per bucket and their seed.
    formats : sequence of str
        Image formats (``pdf``, ``png``, ``svg``, ``eps``).
    dpi : int, optional
        PNG resolution (default 200).
    style : None, str or path
        Matplotlib style to draw with (default the package's paper style).
    quick : bool
        Recorded in the sidecar (the figures command's ``--quick``).

    Returns
    -------
    list of Path
    """
    import matplotlib.pyplot as plt

    from variance_lab.report.figures import write_images
    from variance_lab.rollouts.analysis import analyze

    path = Path(DEFAULT_DATA if data is None else data)
    batch, records = load_data(path)
    result = analyze(batch, n_boot=n_boot, seed=seed)
    table = result.table.assign(gspo_clip_resampled=resampled_clip(batch, seed=seed))
    curves = result.curves()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = {ext: out / f"{FIGURE_NAME}.{ext}" for ext in ("csv", *formats, "json")}
    names["curves"] = out / f"{FIGURE_NAME}_curves.csv"
    texts = {"csv": table.to_csv(index=False), "curves": curves.to_csv(index=False)}
    for key, text in texts.items():
        atomic_write(names[key], lambda tmp, text=text: tmp.write_text(text))
    dpi = int(dpi) if dpi else _style.PNG_DPI
    with _style.use(style):
        settings = _data_fingerprint(path).get("settings")
        fig = experiment_figure(table, curves, level=result.level, title=experiment_title(settings))
        try:
            write_images(fig, out, FIGURE_NAME, formats, dpi)
        finally:
            plt.close(fig)
    sidecar = {
        "figure": FIGURE_NAME,
        "description": "Arithmetic-task experiment: Var(P_T), Var(G_T) and GSPO clip fraction per length "
        "bucket of real token log-ratios (the last GSPO iteration's sampling policy against the policy "
        f"after its update, a tiny transformer), with {100 * result.level:g} % intervals "
        f"(variances: {result.summary()['groups']['interval_method']}; clip fraction: the analysis's "
        "interval), against the "
        "i.i.d. lognormal, i.i.d. empirical "
        "(resampled tokens) and autocorrelation-corrected predictions; where the three variance "
        f"predictions differ by less than {100 * COINCIDE:g} % they are one line and each panel gives their "
        "largest difference.",
        "params": {"data": path.name, "n_boot": n_boot, "seed": seed, "level": result.level, "edges": "auto"},
        "data_set": _data_fingerprint(path),
        "analysis": json_safe(result.summary()),
        "findings": json_safe(token_findings(batch, records)),
        "quick": quick,
        "style": None if style is None else str(style),
        "version": __version__,
        "versions": versions(),
        "files": {k: p.name for k, p in names.items() if k != "json"},
        "png_dpi": dpi,
        "data_sha256": {k: text_sha256(t) for k, t in texts.items()},
        "reproduce": f"variance-lab experiment figure --data {path.name} --out DIR",
    }
    write_sidecar(names["json"], sidecar)
    return [names[k] for k in (*formats, "csv", "curves", "json")]
