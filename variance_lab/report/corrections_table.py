"""The corrections table (``variance-lab corrections``), built from a frame and rendered as text.

The frame comes from :func:`variance_lab.corrections.theory` (with the Monte Carlo columns of
:func:`variance_lab.corrections.simulate_corrections` merged in) or from
:func:`variance_lab.corrections.evaluate` on data; this module only formats it, through the
renderers of :mod:`variance_lab.report.table` (markdown, LaTeX, csv, json).
"""

from __future__ import annotations

import math

import pandas as pd

from variance_lab.report.table import TABLE_FORMATS, format_number
from variance_lab.report.table import render as render_table

__all__ = [
    "TABLE_FORMATS",
    "corrections_mc_notes",
    "display_columns",
    "find_T_line",
    "render_bins",
    "render_corrections",
]

# Theory / data columns shown in markdown and LaTeX: column -> header (T is shown by report.table).
_HEADERS = {
    "T_min": "T range",
    "correction": "correction",
    "level": "level",
    "n_seq": "sequences",
    "mean_w": "E[w]",
    "bias": "bias",
    "var_w": "Var(w)",
    "ess_frac": "ESS frac.",
    "frac_modified": "frac. modified",
    "frac_seq_any": "frac. seq. touched",
    "find_T": "T at which >= threshold modified",
    "method": "method",
}
_LOG_TWIN = {"mean_w": "log10_mean_w", "var_w": "log10_var_w"}


def _fmt(frame: pd.DataFrame, col: str) -> list[str]:
    if col in ("correction", "level", "method"):
        return [str(v) for v in frame[col]]
    if col == "T_min":
        return [f"{int(a)}-{int(b)}" for a, b in zip(frame["T_min"], frame["T_max"], strict=True)]
    if col in ("n_seq", "find_T"):
        return [
            "never" if v is None or (isinstance(v, float) and math.isnan(v)) else str(int(v))
            for v in frame[col]
        ]
    twin = frame[_LOG_TWIN[col]] if _LOG_TWIN.get(col) in frame else [None] * len(frame)
    return [format_number(v, lg) for v, lg in zip(frame[col], twin, strict=True)]


def _interval(frame, col, pct) -> tuple[str, list[str]]:
    values = [
        f"{format_number(v)} [{format_number(a)}, {format_number(b)}]"
        for v, a, b in zip(frame[col], frame[f"{col}_lo"], frame[f"{col}_hi"], strict=True)
    ]
    return f"{col.removeprefix('mc_')} [{pct} CI]", values


def display_columns(frame: pd.DataFrame, *, ci: float = 0.95) -> dict[str, list[str]]:
    """Format the columns for markdown/LaTeX: header -> strings (every column but ``T``)."""
    pct = f"{100 * ci:g}%"
    out = {h: _fmt(frame, c) for c, h in _HEADERS.items() if c in frame}
    if "find_T" in frame and "find_T_threshold" in frame:  # the header names the threshold
        threshold = float(frame["find_T_threshold"].iloc[0])
        out = {
            (f"first T with >= {100 * threshold:g} % modified" if k == _HEADERS["find_T"] else k): v
            for k, v in out.items()
            if k != _HEADERS.get("find_T_threshold")
        }
    if "mean_w_lo" in frame and "mc_mean_w" not in frame:  # data rows
        header, values = _interval(frame, "mean_w", pct)
        out["E[w]"] = values
        out = {(f"E[w] [{pct} CI]" if k == "E[w]" else k): v for k, v in out.items()}
    if "frac_modified_lo" in frame and "mc_mean_w" not in frame:  # data rows: observed interval
        _, values = _interval(frame, "frac_modified", pct)
        out = {(f"frac. modified [{pct} CI]" if k == "frac. modified" else k): v for k, v in out.items()}
        out[f"frac. modified [{pct} CI]"] = values
    if "pred_frac_modified" in frame:
        out["predicted frac. modified"] = [format_number(v) for v in frame["pred_frac_modified"]]
        out["prediction inside"] = [
            "n/a" if not math.isfinite(p) else "yes" if ok else "NO"  # n/a: the model has no prediction
            for p, ok in zip(frame["pred_frac_modified"], frame["pred_inside"], strict=True)
        ]
    if "mc_mean_w" in frame:
        for col in ("mc_mean_w", "mc_frac_modified"):
            header, values = _interval(frame, col, pct)
            out[f"MC {header}"] = values
        out["MC ESS frac."] = [format_number(v) for v in frame["mc_ess_frac"]]
        out["MC frac. seq. touched"] = [format_number(v) for v in frame["mc_frac_seq_any"]]
        out["MC k-hat"] = [format_number(v) for v in frame["mc_khat"]]
        out["MC verdict"] = ["reliable" if ok else "UNRELIABLE" for ok in frame["mc_reliable"]]
    return out


def find_T_line(correction: str, level: str, T, threshold: float, family_text: str, what=None) -> str:
    """Return the one-line answer: from which length a correction modifies ``threshold`` of the sequences.

    ``what`` replaces the words after the share (default: by ``level``, "of sequences truncated
    or masked" or "of sequences with a modified token").
    """
    if what is None:
        what = (
            "of sequences truncated or masked"
            if level == "sequence"
            else "of sequences with a modified token"
        )
    share = f"{100 * threshold:g} %"
    if T is None:
        return f"- {correction}: never reaches {share} {what} for T <= 10^7 ({family_text})."
    return f"- {correction}: {share} {what} from T = {int(T):,} on ({family_text})."


def corrections_mc_notes(frame: pd.DataFrame, n: int, seed: int) -> str:
    """Plain-words verdicts: one line per unreliable Monte Carlo row."""
    lines = [
        f"Monte Carlo: n = {n:,} sequences, seed {seed}; a row is unreliable when its effective number "
        "of weights (weights x ESS fraction) is below 100 or the Pareto k-hat of its weights exceeds 0.7."
    ]
    bad = frame[~frame["mc_reliable"].astype(bool)]
    for r in bad.itertuples(index=False):
        lines.append(f"- T = {int(r.T)}, {r.correction}: Monte Carlo is UNRELIABLE: {r.mc_reason}.")
    if bad.empty:
        lines.append("- Every Monte Carlo row is reliable.")
    return "\n".join(lines)


def render_corrections(
    frame: pd.DataFrame, fmt: str = "markdown", *, title: str = "", notes: str = "", ci=0.95
) -> str:
    """Render a corrections frame as ``markdown``, ``latex``, ``csv`` or ``json``.

    csv and json hold the frame's own columns (stable names); markdown and LaTeX show
    :func:`display_columns` beside ``T``, with ``title`` above and ``notes`` below (markdown).
    """
    frame = frame.copy()
    frame.attrs["display_columns"] = display_columns(frame, ci=ci)
    return render_table(frame, fmt, title=title, notes=notes)


def render_bins(
    frame: pd.DataFrame, fmt: str = "markdown", *, title: str = "", notes: str = "", ci=0.95
) -> str:
    """Render a frame of masked fractions per bin (:func:`variance_lab.corrections.mask_by_bins`).

    csv and json hold the frame's own columns; markdown and LaTeX show the bin, the correction,
    the tokens, the fraction with its interval and the prediction.
    """
    pct = f"{100 * ci:g}%"
    frame = frame.copy()
    frame.attrs["display_columns"] = {
        frame["by"].iloc[0] if len(frame) else "bin": [
            f"[{format_number(a)}, {format_number(b)}]"
            for a, b in zip(frame["bin_lo"], frame["bin_hi"], strict=True)
        ],
        "correction": [str(v) for v in frame["correction"]],
        "tokens": [str(int(v)) for v in frame["n_tokens"]],
        "sequences": [str(int(v)) for v in frame["n_seq"]],
        f"frac. modified [{pct} CI]": _interval(frame, "frac_modified", pct)[1],
        "predicted frac. modified": [format_number(v) for v in frame["pred_frac_modified"]],
        "prediction inside": [
            "n/a" if not math.isfinite(p) else "yes" if ok else "NO"
            for p, ok in zip(frame["pred_frac_modified"], frame["pred_inside"], strict=True)
        ],
    }
    return render_table(frame, fmt, title=title, notes=notes)
