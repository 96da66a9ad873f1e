"""Text output of the empirical analysis (``variance-lab analyze``): markdown, CSV or JSON.

Built from the analysis's tidy per-bucket frame and its summary dictionary only
(:attr:`variance_lab.rollouts.analysis.AnalysisResult.table` and
:meth:`~variance_lab.rollouts.analysis.AnalysisResult.summary`); this module computes nothing.

- ``markdown``: the fit, the dropped sequences, the clip fractions and the overall verdict,
  then two tables per bucket (variances with the three predictions and the verdict; clip
  fractions observed and predicted), then a note on how to read the verdict.
- ``csv``: the per-bucket frame, every column under its stable name (the summary is not
  part of it: :func:`summary_lines` gives it as text).
- ``json``: one object ``{"summary": {...}, "buckets": [{...}, ...]}``, NaN and infinities
  as ``null``.

A run of steps (``variance-lab analyze RUN_DIR``, :func:`render_run`): a table of one row per step,
then a row per step and a column per length bucket for each statistic of :data:`RUN_BUCKET_STATS`
(markdown); the same spread into one CSV row per step (:func:`run_wide`); or every step's row,
summary and buckets in JSON.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from variance_lab.report.table import check_format, csv_text, format_number, json_text

__all__ = [
    "ANALYSIS_FORMATS",
    "MIN_JUDGED",
    "RUN_BUCKET_STATS",
    "VERDICT_NOTE",
    "bucket_verdict",
    "group_lines",
    "model_lines",
    "render_analysis",
    "render_run",
    "run_wide",
    "split_lines",
    "step_ranges",
    "summary_lines",
]

ANALYSIS_FORMATS = ("markdown", "csv", "json")

#: Fewest sequences a length bucket needs to be judged: the analysis's ``MIN_BUCKET_SEQUENCES``
#: (:mod:`variance_lab.rollouts.predictions`, a floor above this one; a test keeps the two equal).
MIN_JUDGED = 20

#: A bucket's verdict (and the overall one) where it holds fewer than :data:`MIN_JUDGED` sequences.
_TOO_FEW = "too few sequences"

VERDICT_NOTE = (
    "How to read the verdict: score = distance of a prediction of Var(G_T) from the observed one, in "
    "units of the bootstrap interval's half-width on that side (|score| <= 1: inside the interval). "
    "The verdict is the first of iid-lognormal, iid-empirical, corrected that lies inside and is at "
    "least twice as close as each one before it; none: no prediction qualifies; n/a: no interval; "
    f"too few sequences: a bucket of fewer than {MIN_JUDGED} sequences, shown but not judged (no verdict, no "
    "best model). The buckets' vote (ties go to i.i.d.) judges the three simple predictions on "
    "Var(G_T) alone; with the fitted models the verdict is the model that fits the most buckets on "
    "Var(G_T) and the GSPO clip fraction together, judged on prompts it was not fitted to. design "
    "effect: the clustered variance of the GSPO clip fraction over the i.i.d. one (responses to one "
    "prompt are not independent). Var(P_T) is shown but not judged: once T sigma_y^2 exceeds a few "
    "its sample variance is erratic, usually far below the truth and sometimes far above it (see "
    "ESS(P))."
)


def _fmt(value, digits: int = 4) -> str:
    return format_number(float(value), digits=digits) if value is not None else "n/a"


def _se(value, se) -> str:
    return f"{_fmt(value)} (SE {_fmt(se, 2)})"


def summary_lines(summary: dict) -> list[str]:
    """Return the fit, autocorrelation, dropped sequences, clip fractions and verdict as text lines."""
    f, a, c = summary["fit"], summary["autocorrelation"], summary["clip"]
    lines = [
        f"Sequences: {summary['n_sequences']:,} ({summary['n_tokens']:,} tokens, lengths "
        f"{summary['length_min']}..{summary['length_max']}); dropped: {summary['n_dropped']}",
    ]
    for d in summary["dropped"][:5]:
        lines.append(f"  dropped id={d['id']!r} (index {d['index']}): {d['problem']}")
    if summary["n_dropped"] > 5:
        lines.append(f"  ... and {summary['n_dropped'] - 5} more")
    lines += [f"Note: {text}" for text in summary.get("notes") or ()]
    if summary.get("ratio_label"):
        lines.append(f"Ratio analysed: {summary['ratio_label']} ({summary['ratio']})")
    lines.append(
        f"Fit of the pooled token log-ratios y = log r: mu_y = {_se(f['mu_y'], f['se_mu_y'])}, "
        f"sigma_y^2 = {_se(f['sigma2_y'], f['se_sigma2_y'])}"
    )
    if a is None:
        note = (
            summary.get("autocorrelation_note") or "no two counted tokens one position apart, or constant y"
        )
        lines.append(f"Autocorrelation: undefined ({note})")
    else:
        bound = "" if a["window_found"] else ", window rule not met: a lower bound"
        lines.append(
            f"Autocorrelation within sequences: rho = {_se(a['rho'], a['se_rho'])}, "
            f"tau_int = {_se(a['tau_int'], a['se_tau_int'])} (Sokal window {a['window']}{bound})"
        )
    g_lo, g_hi = c["gspo_range"]
    p_lo, p_hi = c["ppo_range"]
    lines += [
        f"GSPO clip fraction (s outside ({g_lo:g}, {g_hi:g})): observed {_fmt(c['gspo_obs'])}, predicted "
        f"{_fmt(c['gspo_pred'])} (corrected), {_fmt(c['gspo_pred_iid'])} (i.i.d.)",
        f"PPO clip fraction (token r outside ({p_lo:g}, {p_hi:g})): observed {_fmt(c['ppo_obs'])}, "
        f"predicted {_fmt(c['ppo_pred'])} (fitted normal)",
    ]
    lines += group_lines(summary.get("groups"))
    vote = (
        f"the buckets' vote among iid-lognormal, iid-empirical and corrected on Var(G_T) alone: "
        f"{summary['verdict']} (RMS scores: "
        + ", ".join(f"{k} {_fmt(v, 3)}" for k, v in summary["rms_scores"].items())
        + ")"
    )
    if summary["verdict"] == _TOO_FEW:  # no bucket holds enough sequences to judge by
        return [
            *lines,
            f"Verdict: {_TOO_FEW}: no length bucket holds {MIN_JUDGED} sequences, so no prediction or model "
            "is judged.",
        ]
    k = summary.get("n_buckets_judgeable")
    if summary["verdict"] == "n/a" and summary.get("n_boot") and k:  # enough sequences, no interval
        return [
            *lines,
            f"Verdict: n/a: {k} length bucket{'s hold' if k > 1 else ' holds'} {MIN_JUDGED} or more "
            "sequences, but no bucket's Var(G_T) has an interval to judge by (its log-ratios are "
            "constant, or its bootstrap-t interval failed), so no prediction or model is judged.",
        ]
    if not summary.get("models"):
        return [*lines, "Verdict: " + vote]
    return lines + model_lines(summary, vote)


def group_lines(groups: dict | None) -> list[str]:
    """Return how the intervals treat responses grouped by prompt, and the note on identical responses."""
    if not groups:
        return []
    lines = [f"Intervals over sequences: {groups['interval_method']}"]
    if groups.get("note"):
        lines.append("Note: " + groups["note"])
    return lines


def _comb_text(comb: dict) -> str:
    """Return the comb model's fitted parameters with standard errors, one line."""
    sd = ", ".join(
        f"{w:.3g} x sd {v**0.5:.3g}"
        for w, v in zip(comb["sparse_weights"], comb["sparse_variances"], strict=True)
    )
    note = "" if comb["converged"] else " (optimiser did not report convergence)"
    return (
        f"a = {_se(comb['a'], comb['se_a'])}, b = {_se(comb['b'], comb['se_b'])}, "
        f"tau = {_se(comb['tau'], comb['se_tau'])}; sparse tokens {sd}{note}"
    )


def _hier_text(hier: dict) -> str:
    """Return the hier model's fitted parameters with standard errors, one line."""
    return (
        f"alpha = {_se(hier['alpha'], hier['se_alpha'])}, theta0 = {_se(hier['theta0'], hier['se_theta0'])}, "
        f"beta = {_se(hier['beta'], hier['se_beta'])}, c = {_se(hier['c'], hier['se_c'])}"
    )


def _verdict_line(summary: dict, vote: str, params: str = "") -> str:
    """Return the one verdict: the best model, held out when judged so, and the variance vote beside it."""
    best, fits = summary["best_model"], summary["model_fits"]
    held = summary.get("heldout")
    counts = ", ".join(f"{k} {v}" for k, v in fits.items())
    in_sample = ", ".join(f"{k} {v}" for k, v in (summary.get("model_fits_in_sample") or fits).items())
    if held:
        how = (
            f"{held['k']}-fold by {held['unit'][:-1]}: each fold's buckets judged by models fitted on the "
            f"other folds; buckets fitted, summed over folds, of {held['n_judged']} judged: {counts}; "
            f"in sample, for comparison: {in_sample} (best {summary.get('best_model_in_sample')})"
        )
    else:
        how = f"judged in sample, no held-out folds: buckets fitted: {counts}"
    return (
        f"Verdict: {best}, the model whose Var(G_T) and GSPO clip fraction fall inside the most buckets' "
        f"intervals ({how}){params}. Beside it, {vote}."
    )


def model_lines(summary: dict, vote: str = "") -> list[str]:
    """List the fitted models mix, hier and comb with standard errors.

    And the verdict: the model chosen on variances and clips (held out), with its fitted parameters.
    """
    models = summary.get("models")
    if not models:
        return []
    mix, hier, comb = models["mix"], models["hier"], models.get("comb")
    comps = "; ".join(
        f"w {_se(w, sw)}, m {_se(m, sm)}, v {_se(v, sv)}"
        for w, sw, m, sm, v, sv in zip(
            mix["weights"],
            mix["se_weights"],
            mix["means"],
            mix["se_means"],
            mix["variances"],
            mix["se_variances"],
            strict=True,
        )
    )
    best = summary["best_model"]
    params = {"mix": comps, "hier": _hier_text(hier), "comb": _comb_text(comb) if comb else "not fitted"}
    samples = (summary.get("fit_sample") or {}).values()
    stated = [f"Fit sample: {s['drawn']}" for s in samples if s.get("subsampled")]
    return [
        *stated,
        f"Model mix (token log-ratios a Gaussian mixture, {len(mix['weights'])} components by BIC): {comps}",
        f"Model hier (per-sequence variance v ~ Gamma(alpha, theta0 (T/{hier['T0']:g})^beta), tokens "
        f"N(c - v/2, v)): {_hier_text(hier)}",
        "Model comb (a Gaussian mixture of up to 5 components; those with sd > 3e-4 sparse, at rate "
        "expit(a + b log(1 + position) + tau z), z ~ N(0, 1) per sequence): "
        + (_comb_text(comb) if comb else "not fitted (a one-component mixture)"),
        _verdict_line(
            summary,
            vote or f"the variance vote: {summary['verdict']}",
            f"; {best}: {params[best]}" if best in params else "",
        ),
    ]


def split_lines(split: dict | None) -> list[str]:
    """Return the three-policy split (mismatch, update, total) as text lines.

    The pooled rows and the verdict line.
    """
    if not split:
        return []
    lines = [
        "Three policies: total pi_theta/mu_rollout = mismatch pi_old/mu_rollout x update pi_theta/pi_old"
    ]
    extra = [k for k in split["rows"][0] if k.startswith("frac:")]
    header = ["part", "mean log r", "Var log r", "chi2 token", "k3 KL", "ESS token", "Var log P", "chi2 seq"]
    header += ["ESS seq", "PPO clip", "GSPO clip", *extra]
    keys = ["mean_log_r", "var_log_r", "chi2_token", "k3_kl", "ess_token", "var_log_P", "chi2_seq", "ess_seq"]
    keys += ["ppo_clip_frac", "gspo_clip_frac", *extra]
    rows = [[r["part"], *(_fmt(r[k]) for k in keys)] for r in split["rows"] if r["bucket"] == -1]
    lines += ["", _markdown_table(header, rows), "", split["line"]]
    by_bucket = [r for r in split["rows"] if r["bucket"] >= 0]
    if by_bucket:
        head = ["part", "T", "n", "Var log P", "chi2 seq", "ESS seq", "GSPO clip", *extra]
        body = [
            [r["part"], f"{r['T_lo']}-{r['T_hi']}", str(r["n_seq"])]
            + [_fmt(r[k]) for k in ("var_log_P", "chi2_seq", "ess_seq", "gspo_clip_frac", *extra)]
            for r in by_bucket
        ]
        lines += ["", "Per length bucket:", "", _markdown_table(head, body)]
    return lines


def _fixed(value) -> str:
    """Format a log10 value with 3 decimals."""
    return f"{value:.3f}" if math.isfinite(value) else "n/a"


def _sci(value) -> str:
    """Format a variance in scientific notation, 4 significant digits."""
    return f"{value:.3e}" if math.isfinite(value) else "n/a"


def _score(value) -> str:
    return f"{value:+.2f}" if math.isfinite(value) else ("n/a" if math.isnan(value) else f"{value:+}")


def _interval(point, lo, hi, fmt) -> str:
    if not math.isfinite(point):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return fmt(point)
    return f"{fmt(point)} [{fmt(lo)}, {fmt(hi)}]"


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _bucket_rows(table: pd.DataFrame, cells) -> list[list[str]]:
    """Return one row per length bucket: ``T_lo-T_hi``, the sequence count, then ``cells(row)``."""
    return [[f"{r.T_lo}-{r.T_hi}", str(r.n_seq), *cells(r)] for r in table.itertuples(index=False)]


def _failed(r, name: str) -> bool:
    return name in str(getattr(r, "interval_failed", "") or "").split(",")


def _checked_interval(r, name: str, point, lo, hi, fmt) -> str:
    """Format the interval, or the point and "interval failed" where the bootstrap-t broke down."""
    if _failed(r, name) and math.isfinite(point):
        return f"{fmt(point)} (interval failed: bootstrap-t unstable)"
    return _interval(point, lo, hi, fmt)


def bucket_verdict(r, n_boot: int) -> str:
    """Return the verdict shown for bucket ``r`` (a row of the analysis table), with its reason.

    The table's verdict as it is (a bucket of fewer than :data:`MIN_JUDGED` sequences already
    reads "too few sequences" where the bootstrap ran), but for a bucket of enough sequences that
    all answer one prompt and so have no interval (nothing to resample between): "n/a (one
    prompt)".
    """
    verdict = str(r.verdict)
    if verdict == "n/a" and n_boot > 0 and r.n_seq >= MIN_JUDGED and r.n_prompts == 1:
        return "n/a (one prompt)"
    return verdict


def _variance_cells(r, n_boot: int = 0) -> list[str]:
    """Return the variance table's cells of bucket ``r``: Var(P_T), Var(G_T), scores and verdict."""
    return [
        _checked_interval(r, "var_P", r.log10_var_P, r.log10_var_P_lo, r.log10_var_P_hi, _fixed),
        *(_fixed(v) for v in (r.log10_var_P_iid, r.log10_var_P_emp, r.log10_var_P_corr)),
        _fmt(r.ess_P, 3),
        _checked_interval(r, "var_G", r.var_G, r.var_G_lo, r.var_G_hi, _sci),
        *(_sci(v) for v in (r.var_G_iid, r.var_G_emp, r.var_G_corr)),
        " / ".join(_score(v) for v in (r.score_iid, r.score_emp, r.score_corr)),
        bucket_verdict(r, n_boot),
    ]


def _clip_cells(r) -> list[str]:
    """Return the clip table's cells of bucket ``r``: GSPO and PPO clip fractions, observed and predicted."""
    return [
        _interval(r.gspo_clip_frac, r.gspo_clip_frac_lo, r.gspo_clip_frac_hi, _fmt),
        _fmt(r.n_prompts, 4) if math.isfinite(r.n_prompts) else "n/a",
        _fmt(r.design_effect, 3) if math.isfinite(r.design_effect) else "n/a",
        *(_fmt(v) for v in (r.gspo_clip_pred, r.gspo_clip_pred_iid, r.ppo_clip_frac, r.ppo_clip_pred)),
    ]


def _model_clip_cells(r) -> list[str]:
    """Return the model table's cells of bucket ``r``: clip fractions per model, Var(G_T), best model."""
    return [
        _interval(r.gspo_clip_frac, r.gspo_clip_frac_lo, r.gspo_clip_frac_hi, _fmt),
        *(_fmt(getattr(r, f"gspo_clip_pred_{m}")) for m in ("iid", "corr", "mix", "hier", "comb")),
        _interval(r.ppo_clip_frac, r.ppo_clip_frac_lo, r.ppo_clip_frac_hi, _fmt),
        *(_fmt(getattr(r, f"ppo_clip_pred_{m}")) for m in ("iid", "mix", "hier", "comb")),
        _interval(r.gmpo_clip_frac, r.gmpo_clip_frac_lo, r.gmpo_clip_frac_hi, _fmt),
        *(_fmt(getattr(r, f"gmpo_clip_pred_{m}")) for m in ("iid", "mix", "hier", "comb")),
        *(_sci(getattr(r, f"var_G_{m}")) for m in ("mix", "hier", "comb")),
        str(r.best_model),
    ]


def _markdown(table: pd.DataFrame, summary: dict, title: str) -> str:
    pct = f"{100 * summary['level']:g}%"
    var_header = [
        "T",
        "n",
        f"log10 Var(P_T) [{pct}]",
        "iid",
        "emp",
        "corr",
        "ESS(P)",
        f"Var(G_T) [{pct}]",
        "iid",
        "emp",
        "corr",
        "scores iid / emp / corr",
        "verdict",
    ]
    clip_header = ["T", "n", f"GSPO clip [{pct}]", "prompts", "design effect", "pred. corr", "pred. iid"]
    clip_header += ["PPO clip", "pred."]
    n_boot = int(summary.get("n_boot") or 0)
    parts = [title, ""] if title else []
    parts += [
        *summary_lines(summary),
        "",
        _markdown_table(var_header, _bucket_rows(table, lambda r: _variance_cells(r, n_boot))),
        "",
        _markdown_table(clip_header, _bucket_rows(table, _clip_cells)),
        "",
    ]
    if summary.get("models"):
        pct = f"{100 * summary['level']:g}%"
        header = ["T", "n", f"GSPO clip [{pct}]", "iid", "corr", "mix", "hier", "comb", f"PPO clip [{pct}]"]
        header += ["iid", "mix", "hier", "comb", f"GMPO clip [{pct}]", "iid", "mix", "hier", "comb"]
        header += ["Var(G) mix", "Var(G) hier", "Var(G) comb", "best model"]
        parts += [_markdown_table(header, _bucket_rows(table, _model_clip_cells)), ""]
    parts += [
        VERDICT_NOTE,
    ]
    if summary.get("split"):
        parts += ["", *split_lines(summary["split"])]
    return "\n".join(parts) + "\n"


def render_analysis(table: pd.DataFrame, summary: dict, fmt: str = "markdown", *, title: str = "") -> str:
    """Render an analysis as ``markdown``, ``csv`` or ``json`` (see the module docstring).

    Parameters
    ----------
    table : pandas.DataFrame
        Per-bucket frame, columns :data:`variance_lab.rollouts.analysis.ANALYSIS_COLUMNS`.
    summary : dict
        :meth:`variance_lab.rollouts.analysis.AnalysisResult.summary`.
    fmt : {"markdown", "csv", "json"}
    title : str
        First line of the markdown output.

    Returns
    -------
    str
    """
    return _render(
        fmt,
        lambda: table,
        lambda: {"summary": summary, "buckets": table.to_dict("records")},
        lambda: _markdown(table, summary, title),
    )


def _render(fmt: str, frame, doc, markdown) -> str:
    """Return ``frame()`` as CSV, ``doc()`` as JSON or ``markdown()``, by ``fmt`` (an analysis's formats)."""
    check_format(fmt, ANALYSIS_FORMATS)
    if fmt == "csv":
        return csv_text(frame())
    if fmt == "json":
        return json_text(doc())
    return markdown()


# --------------------------------------------------------------------------------------
# a run of steps (variance-lab analyze RUN_DIR)
# --------------------------------------------------------------------------------------
#: Per-bucket statistics of a run shown (markdown) and spread into columns (csv), with their titles.
RUN_BUCKET_STATS = {
    "n_seq": "Sequences",
    "var_G": "Var(G_T)",
    "gspo_clip_frac": "GSPO clip fraction (sequences)",
    "ppo_clip_frac": "PPO clip fraction (tokens)",
    "khat_P": "Pareto k-hat of P_T",
}


def step_ranges(steps) -> str:
    """Return step numbers as text, runs of consecutive ones joined: ``1-3, 5, 8-9``."""
    steps = sorted({int(s) for s in steps})
    parts, start = [], None
    for i, s in enumerate(steps):
        start = s if start is None else start
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            parts.append(str(s) if s == start else f"{start}-{s}")
            start = None
    return ", ".join(parts)


def _bucket_label(lo, hi) -> str:
    return f"{int(lo)}-{int(hi)}"


def run_wide(steps: pd.DataFrame, buckets: pd.DataFrame) -> pd.DataFrame:
    """Return one row per step: the step columns, then each of :data:`RUN_BUCKET_STATS` per length bucket.

    A bucket's column is ``<statistic>_T<lo>-<hi>`` (``var_G_T16-31``), buckets in order of length; NaN
    (``n_seq`` 0) where a step has no sequence in the bucket.
    """
    keys = buckets[["T_lo", "T_hi"]].drop_duplicates().sort_values(["T_lo", "T_hi"])
    wide = steps.reset_index(drop=True).copy()
    at = buckets.set_index(["step", "T_lo", "T_hi"])
    index = [(int(s), lo, hi) for s in wide["step"] for lo, hi in keys.itertuples(index=False)]
    n = len(keys)
    for stat in RUN_BUCKET_STATS:
        values = at[stat].reindex(index).to_numpy().reshape(len(wide), n)
        if stat == "n_seq":
            values = np.nan_to_num(values.astype(float), nan=0.0).astype(np.int64)
        for j, (lo, hi) in enumerate(keys.itertuples(index=False)):
            wide[f"{stat}_T{_bucket_label(lo, hi)}"] = values[:, j]
    return wide


def _step_cells(r) -> list[str]:
    return [
        str(r.step),
        f"{r.n_sequences:,}",
        f"{r.n_tokens:,}",
        _fmt(r.mu_y),
        _fmt(r.sigma2_y),
        _fmt(r.gspo_clip_frac),
        _fmt(r.gspo_clip_pred),
        _fmt(r.ppo_clip_frac),
        _fmt(r.ppo_clip_pred),
        _fmt(r.khat_P, 3),
        _fmt(r.mismatch_k3_kl, 3),
        _fmt(r.mismatch_share, 3),
        str(r.verdict),
    ]


def _run_markdown(steps: pd.DataFrame, buckets: pd.DataFrame, run: dict, title: str) -> str:
    lines = [title, ""] if title else []
    lines.append(
        f"Run: {run['n_steps']} steps ({step_ranges(steps['step'])}) of {run['layout_description']} in "
        f"{run['root']}"
    )
    lines.append(f"Ratio analysed: {run['ratio_label']} ({run['ratio']})")
    lines += [f"Note: {text}" for text in run.get("notes") or ()]
    for note in run.get("step_notes") or ():
        which = "step" if len(note["steps"]) == 1 else "steps"
        lines.append(f"Note ({which} {step_ranges(note['steps'])}): {note['text']}")
    header = ["step", "sequences", "tokens", "mu_y", "sigma_y^2", "GSPO clip", "pred. corr", "PPO clip"]
    header += ["pred.", "k-hat(P_T)", "mismatch k3 KL", "mismatch share", "verdict"]
    lines += [
        "",
        "Per step (pooled over its sequences; k-hat of the sequence weights P_T above 0.7: importance "
        "weights not to be trusted; the mismatch pi_old/mu_rollout: its k3 KL and its share of the "
        "variance of the total token log-ratio):",
        "",
        _markdown_table(header, [_step_cells(r) for r in steps.itertuples(index=False)]),
    ]
    wide = run_wide(steps, buckets)
    keys = buckets[["T_lo", "T_hi"]].drop_duplicates().sort_values(["T_lo", "T_hi"])
    labels = [_bucket_label(lo, hi) for lo, hi in keys.itertuples(index=False)]
    fmt = {"n_seq": lambda v: f"{int(v):,}", "var_G": _sci, "khat_P": lambda v: _fmt(v, 3)}
    for stat, what in RUN_BUCKET_STATS.items():
        show = fmt.get(stat, _fmt)
        rows = [[str(r["step"]), *(show(r[f"{stat}_T{b}"]) for b in labels)] for r in wide.to_dict("records")]
        lines += ["", f"{what} per length bucket (columns: T):", "", _markdown_table(["step", *labels], rows)]
    return "\n".join(lines) + "\n"


def render_run(
    steps: pd.DataFrame,
    buckets: pd.DataFrame,
    run: dict,
    fmt: str = "markdown",
    *,
    summaries=(),
    title: str = "",
) -> str:
    """Render the analysis of a run of steps as ``markdown``, ``csv`` or ``json``.

    - ``markdown``: the run (layout, steps, ratio, notes), a table of one row per step, then one
      table per statistic of :data:`RUN_BUCKET_STATS`, a row per step and a column per length bucket.
    - ``csv``: :func:`run_wide`, one row per step.
    - ``json``: ``{"run": {...}, "steps": [{<step row>, "summary": {...}, "buckets": [...]}, ...]}``,
      NaN and infinities as ``null``.

    Parameters
    ----------
    steps : pandas.DataFrame
        One row per step (:data:`variance_lab.rollouts.steps.STEP_COLUMNS`).
    buckets : pandas.DataFrame
        One row per step and length bucket (:attr:`variance_lab.rollouts.steps.RunAnalysis.buckets`).
    run : dict
        :meth:`variance_lab.rollouts.steps.RunAnalysis.summary`.
    summaries : sequence of dict
        Each step's analysis summary, in step order (json only).
    fmt, title
        As :func:`render_analysis`.

    Returns
    -------
    str
    """
    return _render(
        fmt,
        lambda: run_wide(steps, buckets),
        lambda: _run_doc(steps, buckets, run, list(summaries) or [None] * len(steps)),
        lambda: _run_markdown(steps, buckets, run, title),
    )


def _run_doc(steps: pd.DataFrame, buckets: pd.DataFrame, run: dict, summaries: list) -> dict:
    """Return the JSON document of a run: ``{"run": ..., "steps": [{<step row>, "summary", "buckets"}]}``."""
    docs = []
    for row, summary in zip(steps.to_dict("records"), summaries, strict=True):
        rows = buckets[buckets["step"] == row["step"]].to_dict("records")
        docs.append({**row, "summary": summary, "buckets": rows})
    return {"run": run, "steps": docs}
