"""The variance comparison table of the derivation, built from a frame and rendered as text.

The frame comes from :func:`variance_lab.theory.summary` (and, with Monte Carlo, from
:mod:`variance_lab.simulate.estimates` through :func:`with_monte_carlo`); this module only formats it.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pandas as pd

from variance_lab.schema import json_safe, verdict_level

__all__ = [
    "MC_COLUMNS",
    "PRINTED",
    "PRINTED_FAMILY",
    "TABLE_FORMATS",
    "check_format",
    "csv_text",
    "errata",
    "infinite_variance_note",
    "json_text",
    "monte_carlo_notes",
    "render",
    "with_monte_carlo",
]

TABLE_FORMATS = ("markdown", "latex", "csv", "json")

#: The numbers the source derivation printed in its comparison table (mu = 1, sigma^2 = 0.1):
#: T -> (Var(P_T), Var(G_T), Var(P_T)/Var(G_T)). Its Var(G_T) is sigma^2 / T.
PRINTED = {
    1: (0.1, 0.1, 1.0),
    10: (1.59, 0.01, 159.0),
    100: (13780.0, 0.001, 1.378e7),
    1000: (2.5e41, 1e-4, 2.5e45),
}
PRINTED_MU, PRINTED_SIGMA2 = 1.0, 0.1
#: The family the derivation's table describes: i.i.d. lognormal token ratios (its Var(G_T) is the
#: lognormal approximation); the errata compare against this family's exact values only.
PRINTED_FAMILY = "lognormal"

# Markdown/LaTeX headers of the exact-theory columns, in display order.
_DISPLAY = {
    "T": "T",
    "var_P": "Var(P_T)",
    "var_G": "Var(G_T)",
    "var_G_lognormal": "lognormal approx.",
    "var_G_delta": "small-x approx.",
    "var_G_naive": "sigma^2/T (naive)",
    "mean_G": "E[G_T]",
    "bias_G": "bias",
    "mse_G": "MSE(G_T)",
    "ratio": "Var(P)/Var(G)",
    "ess_frac_P": "ESS frac. P_T",
    "n_needed_P": "draws for 10% (P)",
    "n_needed_G": "draws for 10% (G)",
}
# Columns whose linear value can leave float range: shown from their log10 twin.
_LOG_TWIN = {
    "var_P": "log10_var_P",
    "var_G": "log10_var_G",
    "ratio": "log10_ratio",
    "n_needed_P": "log10_n_needed_P",
    "n_needed_G": "log10_n_needed_G",
}


def format_number(value: float, log10: float | None = None, digits: int = 4) -> str:
    """Format a number in ``digits`` significant digits; beyond float range, from its log10.

    >>> format_number(float("inf"), 41392.685158)
    '4.843e+41392'
    """
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    value = float(value)
    # beyond float range: inf, an underflow to 0, or a subnormal that kept only a few digits
    overflowed = math.isinf(value) or (
        abs(value) < sys.float_info.min and log10 is not None and math.isfinite(log10)
    )
    if overflowed and log10 is not None and math.isfinite(log10):
        exponent = math.floor(log10)
        mantissa = 10 ** (log10 - exponent)
        if round(mantissa, digits - 1) >= 10:
            mantissa, exponent = mantissa / 10, exponent + 1
        return f"{mantissa:.{digits - 1}f}e{exponent:+03d}"
    if value == 0.0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}"
    return f"{value:.{digits - 1}e}"


def format_pow10(log10_value: float) -> str:
    """Format :math:`10^x` from ``x``: ``10^4.9``, or ``10^3.426e+10`` for an exponent past 10^4.

    >>> format_pow10(-34258225557.0)
    '10^-3.426e+10'
    """
    if math.isnan(log10_value):
        return "n/a"
    if math.isinf(log10_value):
        return "inf" if log10_value > 0 else "0"
    return f"10^{log10_value:.1f}" if abs(log10_value) < 1e4 else f"10^{log10_value:.4g}"


def _display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    cols = {}
    for col, header in _DISPLAY.items():
        if col not in frame:
            continue
        twin = frame[_LOG_TWIN[col]] if col in _LOG_TWIN else [None] * len(frame)
        if col == "T":
            cols[header] = [str(int(t)) for t in frame[col]]
        else:
            cols[header] = [format_number(v, lg) for v, lg in zip(frame[col], twin, strict=True)]
    extra = frame.attrs.get("display_columns", {})
    for header, values in extra.items():
        cols[header] = list(values)
    return pd.DataFrame(cols)


def _markdown(display: pd.DataFrame) -> str:
    header = "| " + " | ".join(display.columns) + " |"
    rule = "|" + "|".join("---:" for _ in display.columns) + "|"
    rows = ["| " + " | ".join(map(str, row)) + " |" for row in display.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _latex(display: pd.DataFrame) -> str:
    def esc(text: str) -> str:
        return text.replace("_", r"\_").replace("^", r"\^{}").replace("%", r"\%")

    lines = [
        r"\begin{tabular}{" + "r" * display.shape[1] + "}",
        r"\hline",
        " & ".join(esc(c) for c in display.columns) + r" \\",
        r"\hline",
    ]
    lines += [" & ".join(esc(str(v)) for v in row) + r" \\" for row in display.itertuples(index=False)]
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines)


def errata(frame: pd.DataFrame, mu: float, sigma2: float, family: str = PRINTED_FAMILY) -> str:
    """Compare the derivation's printed numbers with the exact ones, for its family and parameters.

    Returns an empty string unless ``family`` is the derivation's own (:data:`PRINTED_FAMILY`,
    i.i.d. lognormal ratios), ``(mu, sigma2) == (1, 0.1)`` and the frame holds at least one of
    the derivation's lengths (1, 10, 100, 1000). For another family the frame's exact values
    are not what the derivation's table describes (random-scale ratios have an infinite
    Var(P_T) from T = 1/theta on), so a comparison would charge the derivation with errors it
    did not make.
    """
    if family != PRINTED_FAMILY or (mu, sigma2) != (PRINTED_MU, PRINTED_SIGMA2):
        return ""
    rows = frame[frame["T"].isin(list(PRINTED))]
    if rows.empty:
        return ""

    def off(printed: float, exact: float) -> str:
        return f"{100 * (printed / exact - 1):+.1f} %"

    lines = [
        "Errata against the derivation's printed table (mu = 1, sigma^2 = 0.1):",
        "",
        "| T | printed Var(P_T) | exact | off by | printed Var(G_T) = sigma^2/T | exact | off by "
        "| printed ratio | exact | off by |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows.itertuples(index=False):
        p_var, p_g, p_ratio = PRINTED[int(r.T)]
        lines.append(
            f"| {int(r.T)} | {format_number(p_var)} | {format_number(r.var_P, r.log10_var_P)} "
            f"| {off(p_var, r.var_P)} | {format_number(p_g)} | {format_number(r.var_G, r.log10_var_G)} "
            f"| {off(p_g, r.var_G)} | {format_number(p_ratio)} | {format_number(r.ratio, r.log10_ratio)} "
            f"| {off(p_ratio, r.ratio)} |"
        )
    lines += [
        "",
        "The derivation's Var(P_T) column is the exact (sigma^2 + mu^2)^T - mu^(2T), rounded. Its Var(G_T)",
        "column is sigma^2 / T, the small-x form of the lognormal approximation with sigma_y^2 and",
        "mu_y replaced by sigma^2 and 0; the exact Var(G_T) depends on the family, so its ratio",
        "column inherits the error. 'off by' is printed / exact - 1.",
    ]
    return "\n".join(lines)


def infinite_variance_note(frame: pd.DataFrame, critical_T: float | None = None) -> str:
    r"""Return a note for the rows where :math:`\operatorname{Var}(P_T)` is infinite.

    ``""`` when there are none.

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns ``T``, ``var_P``, ``log10_var_P`` (:func:`variance_lab.theory.summary`).
    critical_T : float, optional
        The length from which :math:`E[P_T^2]` diverges, when the family has one
        (random-scale: :math:`1/\theta`).
    """
    inf_rows = frame[np.isinf(frame["log10_var_P"].to_numpy(dtype=float)) & (frame["log10_var_P"] > 0)]
    if inf_rows.empty:
        return ""
    Ts = ", ".join(str(int(t)) for t in inf_rows["T"])
    since = f" for every T >= 1/theta = {format_number(critical_T)}" if critical_T is not None else ""
    return (
        f"Var(P_T) is infinite at T = {Ts}: E[P_T^2] diverges{since}. There Var(P_T), its log10, the ratio "
        "and the draws needed for P_T are inf (no number of draws gives the sample variance a finite "
        "error), and the ESS fraction is 0; Var(G_T) stays finite."
    )


def check_format(fmt: str, formats) -> None:
    """Raise ValueError naming ``fmt`` unless it is one of ``formats`` (a table's output formats)."""
    if fmt not in formats:
        raise ValueError(f"unknown table format {fmt!r}; choose one of {', '.join(formats)}")


def csv_text(frame: pd.DataFrame) -> str:
    """Return ``frame`` as CSV without its index, every float to 17 significant digits (round-trips)."""
    return frame.to_csv(index=False, float_format="%.17g")


def json_text(doc) -> str:
    """Return ``doc`` as indented JSON text ending in a newline, NaN and infinities as ``null``."""
    return json.dumps(json_safe(doc), indent=1) + "\n"


def render(frame: pd.DataFrame, fmt: str = "markdown", *, title: str = "", notes: str = "") -> str:
    """Render a comparison frame as ``markdown``, ``latex``, ``csv`` or ``json``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns of :data:`variance_lab.theory.TABLE_COLUMNS` (and Monte Carlo columns).
    fmt : str
        One of :data:`TABLE_FORMATS`.
    title : str
        A line printed above the markdown table.
    notes : str
        Text printed below the markdown table (errata, verdicts).
    """
    check_format(fmt, TABLE_FORMATS)
    if fmt == "csv":
        return csv_text(frame)
    if fmt == "json":
        return json_text(frame.to_dict("records"))
    display = _display_frame(frame)
    if fmt == "latex":
        return _latex(display) + "\n"
    parts = [title, "", _markdown(display)] if title else [_markdown(display)]
    if notes:
        parts += ["", notes]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- Monte Carlo columns
#: Monte Carlo columns of the table (csv/json names): column -> (tidy statistic, tidy field).
#: ``mc_ess_P`` is Kong's ESS of the weights P_T as a fraction of n (compare ``ess_frac_P``);
#: ``mc_reliable_P`` / ``_G`` are the verdicts on the variance estimates (True only when
#: ``reliable``); ``mc_verdict_P`` / ``_G`` their level (reliable, marginal, unreliable) and
#: ``mc_reason_P`` / ``_G`` the reason ('' when reliable). ``mc_khat_limit_P`` / ``_G`` are
#: PSIS's threshold min(1 - 1/log10 n, 0.7), ``mc_khat_min_n_P`` / ``_G`` the sample size
#: 10^(1/(1 - k-hat)) PSIS asks for at the observed k-hat; ``mc_rel_se_var_P`` / ``_G`` theory's
#: relative standard error of the sample variance with these draws, ``mc_rel_se_m4_P`` / ``_G``
#: that of the sample fourth moment the interval's width rests on.
MC_COLUMNS = {
    "mc_var_P": ("var_P", "value"),
    "mc_var_P_lo": ("var_P", "lo"),
    "mc_var_P_hi": ("var_P", "hi"),
    "mc_var_G": ("var_G", "value"),
    "mc_var_G_lo": ("var_G", "lo"),
    "mc_var_G_hi": ("var_G", "hi"),
    "mc_mean_G": ("mean_G", "value"),
    "mc_ess_P": ("ess_frac_P", "value"),
    "mc_khat_P": ("khat_P", "value"),
    "mc_reliable_P": ("var_P", "reliable"),
    "mc_reliable_G": ("var_G", "reliable"),
    "mc_khat_G": ("khat_G", "value"),
    "mc_khat_limit_P": ("khat_limit", "value"),
    "mc_khat_limit_G": ("khat_limit", "value"),
    "mc_khat_min_n_P": ("khat_min_n_P", "value"),
    "mc_khat_min_n_G": ("khat_min_n_G", "value"),
    "mc_rel_se_var_P": ("rel_se_var_P", "value"),
    "mc_rel_se_var_G": ("rel_se_var_G", "value"),
    "mc_rel_se_m4_P": ("rel_se_m4_P", "value"),
    "mc_rel_se_m4_G": ("rel_se_m4_G", "value"),
    "mc_verdict_P": ("var_P", "verdict"),
    "mc_verdict_G": ("var_G", "verdict"),
    "mc_reason_P": ("var_P", "reason"),
    "mc_reason_G": ("var_G", "reason"),
}
_FIELD_DTYPES = {"reliable": bool, "verdict": object, "reason": object}


def _mc_field(mc: pd.DataFrame, T, stat: str, field: str):
    """One field of the Monte Carlo tidy rows, aligned with ``T``."""
    rows = mc[(mc["statistic"] == stat) & (mc["method"] == "monte_carlo")].set_index("T")
    if field == "verdict":
        return [verdict_level(rows.at[int(t), "reason"]) for t in T]
    return [rows.at[int(t), field] for t in T]


def _with_interval(values, lo, hi, log10, log10_lo=None, log10_hi=None) -> list[str]:
    """``value [lo, hi]``; each from its log10 where the linear number left float range."""
    n = len(values)
    log10_lo = [None] * n if log10_lo is None else log10_lo
    log10_hi = [None] * n if log10_hi is None else log10_hi
    return [
        f"{format_number(v, lg)} [{format_number(a, la)}, {format_number(b, lb)}]"
        for v, a, b, lg, la, lb in zip(values, lo, hi, log10, log10_lo, log10_hi, strict=True)
    ]


def _log10_ends(mc: pd.DataFrame, T, stat: str):
    """log10 interval ends of ``stat`` at ``T`` from ``mc.attrs["log10_interval"]``, or (None, None)."""
    ends = mc.attrs.get("log10_interval", {}).get(stat)
    if not ends:
        return None, None
    where = {int(t): i for i, t in enumerate(ends["T"])}
    if any(int(t) not in where for t in T):
        return None, None
    return [ends["lo"][where[int(t)]] for t in T], [ends["hi"][where[int(t)]] for t in T]


def _verdict(levels) -> list[str]:
    return [level.upper() if level == "unreliable" else level for level in levels]


def with_monte_carlo(frame: pd.DataFrame, mc: pd.DataFrame, *, ci: float = 0.95) -> pd.DataFrame:
    """Return the comparison frame with the Monte Carlo columns :data:`MC_COLUMNS` appended.

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`variance_lab.theory.summary`, one row per T.
    mc : pandas.DataFrame
        Tidy Monte Carlo rows of the same T (:func:`variance_lab.simulate.simulate`).
    ci : float
        Confidence level of ``mc``'s intervals, for the markdown headers.

    Returns
    -------
    pandas.DataFrame
        A copy of ``frame`` with the ``mc_*`` columns; its ``attrs["display_columns"]``
        give the markdown/LaTeX table the estimates with their intervals and the
        verdicts in words.
    """
    out = frame.copy()
    T = out["T"].tolist()
    for col, (stat, field) in MC_COLUMNS.items():
        values = _mc_field(mc, T, stat, field)
        out[col] = np.array(values, dtype=_FIELD_DTYPES.get(field, float))
    pct = f"{100 * ci:g}%"

    def log10(stat):
        return _mc_field(mc, T, stat, "log10_value")

    out.attrs["display_columns"] = {
        f"MC Var(P_T) [{pct} CI]": _with_interval(
            out["mc_var_P"],
            out["mc_var_P_lo"],
            out["mc_var_P_hi"],
            log10("var_P"),
            *_log10_ends(mc, T, "var_P"),
        ),
        "MC verdict Var(P_T)": _verdict(out["mc_verdict_P"]),
        f"MC Var(G_T) [{pct} CI]": _with_interval(
            out["mc_var_G"],
            out["mc_var_G_lo"],
            out["mc_var_G_hi"],
            log10("var_G"),
            *_log10_ends(mc, T, "var_G"),
        ),
        "MC verdict Var(G_T)": _verdict(out["mc_verdict_G"]),
        "MC E[G_T]": [format_number(v) for v in out["mc_mean_G"]],
        "MC ESS frac. P_T": [
            format_number(v, lg) for v, lg in zip(out["mc_ess_P"], log10("ess_frac_P"), strict=True)
        ],
        "MC k-hat P_T": [format_number(v) for v in out["mc_khat_P"]],
        "MC k-hat limit": [format_number(v) for v in out["mc_khat_limit_P"]],
    }
    return out


def monte_carlo_notes(mc: pd.DataFrame, n: int, seed: int, *, target: float = 0.1) -> str:
    """Plain-words verdicts below the markdown table: one line per flagged variance estimate."""
    lines = [
        f"Monte Carlo: n = {n:,} draws, seed {seed}; intervals from the sample kurtosis (log scale). "
        f"Verdicts: unreliable when theory needs more draws than n for a {100 * target:g} % relative "
        "error, or the Pareto k-hat exceeds min(1 - 1/log10 n, 0.7); marginal when precise enough but "
        "the interval's width rests on a fourth-moment estimate theory calls unstable (the interval "
        "may cover less than its level); reliable otherwise."
    ]
    flagged = mc[(mc["statistic"].isin(["var_P", "var_G"])) & ~mc["reliable"].astype(bool)]
    for r in flagged.itertuples(index=False):
        x = r.statistic[-1]
        level = verdict_level(r.reason)
        why = r.reason[len(level) + 2 :]
        lines.append(f"- T = {int(r.T)}: Monte Carlo Var({x}_T) is {_verdict([level])[0]}: {why}.")
    if flagged.empty:
        lines.append("- Every Monte Carlo variance estimate is reliable at these lengths.")
    return "\n".join(lines)
