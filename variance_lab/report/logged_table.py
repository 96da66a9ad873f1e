"""Text output of the logged-metrics judgment (``variance-lab logged``): markdown, CSV or JSON.

Built from the two tidy frames of :func:`variance_lab.frameworks.logged.analyze_logged` only
(``laws``: one row per step; ``metrics``: one row per step and sequence-level metric, with the
run's settings in ``metrics.attrs``); this module computes nothing.

- ``markdown``: the token law per step, a warning when the token metrics' fits disagree, the
  notes (records not judged, and why), a summary over steps per metric, the table of predictions
  and verdicts, and how to read it.
- ``csv``: one row per record and metric, the law's columns repeated, joined on the record (the
  laws alone when no sequence metric is judged).
- ``json``: ``{"laws": [...], "metrics": [...]}``, NaN and infinities as ``null``.
"""

from __future__ import annotations

import math

import pandas as pd

from variance_lab.report.table import format_number, format_pow10, json_text

__all__ = ["LOGGED_FORMATS", "render_logged"]

LOGGED_FORMATS = ("markdown", "csv", "json")


def _fmt(value, log10: float | None = None, digits: int = 4) -> str:
    return format_number(value, log10=log10, digits=digits)


def _notes(laws) -> list[str]:
    """One line per record with a note: not judged (and why), or judged with a law from a later metric."""
    lines = []
    for _, r in laws[laws["note"] != ""].iterrows():
        step = "" if math.isnan(r["step"]) else f" (step {_fmt(r['step'])})"
        state = "not judged" if math.isnan(r["s2"]) else "judged"
        lines.append(f"- record {r['record']}{step}, {state}: {r['note']}")
    return lines


def _markdown(laws, metrics, title: str) -> str:
    lines = [f"# {title}", "", "## Token law per step: log r ~ N(m, s2)", ""]
    fitted = laws[laws["s2"].notna()]
    fit_cols = [c for c in laws.columns if c.startswith("s2[")]
    header = ["step", "m", "s2", "from", *fit_cols, "spread"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in fitted.iterrows():
        cells = [_fmt(r["step"]), _fmt(r["m"]), _fmt(r["s2"]), r["source"], *(_fmt(r[c]) for c in fit_cols)]
        lines.append("| " + " | ".join([*cells, _fmt(r["s2_spread"])]) + " |")
    worst = float(fitted["s2_spread"].max())
    if worst > 2.0:
        lines += [
            "",
            f"Warning: the token metrics disagree (fitted s2 up to {_fmt(worst)} times apart): "
            "the tokens are not i.i.d. lognormal (rare large log-ratios, heavy tails), so every "
            "prediction below holds for the law of its 'from' column only; metrics that weigh the "
            "tail (k3, chi2) give the larger s2.",
        ]
    notes = _notes(laws)
    if notes:
        n_out = int(laws["s2"].isna().sum())
        lines += ["", f"## Notes ({n_out} of {len(laws)} records not judged)", "", *notes]
    if metrics.empty:
        lines += [
            "",
            f"No sequence-level sample estimate to judge ({metrics.attrs.get('framework')} with "
            f"{metrics.attrs.get('ratio_level')}-level ratios: its importance metrics are token averages).",
        ]
        return "\n".join(lines) + "\n"
    level = metrics.attrs.get("level", 0.9)
    lines += ["", "## Summary over steps", ""]
    for name, rows in metrics.groupby("metric", sort=False):
        logged = rows[~rows["agreement"].isin(["not logged", "not judged"])]
        outside = logged[logged["agreement"] != "inside"]
        counts = rows["verdict"].value_counts()
        verdicts = ", ".join(
            f"{v} at {counts[v]}" for v in ("reliable", "marginal", "unreliable", "not judged") if v in counts
        )
        first = f" (first: step {_fmt(outside['step'].iloc[0])})" if len(outside) else ""
        lines.append(
            f"- {name}: {verdicts} of {len(rows)} steps; logged at {len(logged)}, outside the predicted "
            f"interval at {len(outside)}{first}"
        )
    lines += [
        "",
        f"## Sequence-level metrics (B = {metrics.attrs.get('batch_size')}, {level:.0%} intervals)",
        "",
    ]
    header = [
        "step",
        "metric",
        "logged",
        "predicted [interval]",
        "agreement",
        "estimates",
        "draws needed",
        "k-hat",
        "verdict",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in metrics.itertuples(index=False):
        if r.verdict == "not judged":
            cells = [
                _fmt(r.step),
                r.metric,
                _fmt(r.logged),
                "-",
                r.agreement,
                "-",
                "-",
                "-",
                f"not judged (record {r.record}: see Notes)",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        khat = "n/a (bounded)" if math.isnan(r.khat) else f"{r.khat:.2f} (limit {r.khat_limit:.2f})"
        target = _fmt(r.target) if math.isfinite(r.target) else _fmt(r.target, r.log10_target)
        cells = [
            _fmt(r.step),
            r.metric,
            _fmt(r.logged),
            f"{_fmt(r.predicted)} [{_fmt(r.lo)}, {_fmt(r.hi)}]",
            r.agreement,
            target,
            format_pow10(r.log10_n_needed),
            khat,
            f"{r.verdict}: {r.reason}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "agreement: where the logged value falls against the interval predicted from the token law "
        "(outside: the i.i.d. lognormal law at that s2 does not describe the run). estimates: the "
        "expectation the metric is a sample estimate of. draws needed: sequences for a "
        f"{metrics.attrs.get('target_rel', 0.1):.0%} relative standard error.",
    ]
    return "\n".join(lines) + "\n"


def render_logged(laws: pd.DataFrame, metrics: pd.DataFrame, fmt: str = "markdown", *, title: str) -> str:
    """Format the two frames of :func:`~variance_lab.frameworks.logged.analyze_logged`.

    Parameters
    ----------
    laws, metrics : DataFrame
        The per-step token laws and the per-step, per-metric predictions and verdicts
        (``metrics.attrs``: ``level``, ``batch_size``, ``target_rel``, ``framework``,
        ``ratio_level``).
    fmt : {"markdown", "csv", "json"}
        :data:`LOGGED_FORMATS`.
    title : str
        The markdown heading.

    Returns
    -------
    str
    """
    if fmt not in LOGGED_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats are {', '.join(LOGGED_FORMATS)}")
    if fmt == "json":
        return json_text(
            {"laws": laws.to_dict(orient="records"), "metrics": metrics.to_dict(orient="records")}
        )
    if fmt == "csv":
        law_cols = ["record", "framework", "m", "s2", "source", "note"]
        merged = metrics.merge(laws[law_cols], on="record", how="left") if not metrics.empty else laws
        return merged.to_csv(index=False)
    return _markdown(laws, metrics, title)
