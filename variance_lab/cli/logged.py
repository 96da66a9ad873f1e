"""The ``variance-lab logged`` subcommand: which of a run's logged numbers a batch can estimate.

Kept apart from :mod:`variance_lab.cli` (which registers it) so that the parser there stays
small: the work is :func:`variance_lab.frameworks.logged.analyze_logged`, imported when the
command runs. METRICS_FILE holds one record per step (JSONL, or CSV with a header), keyed by the
framework's names. Output: per step the token law, then per sequence-level metric the logged
value, its prediction with an interval, the expectation it estimates and the verdict, as a
markdown table, CSV (one row per step and metric, the law's columns repeated) or JSON
(``{"laws": [...], "metrics": [...]}``). Bad input: one line on standard error naming the file,
the record and the field; exit status 2; nothing written.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import sys
from pathlib import Path

from variance_lab.cli._common import PROG, CLIError, check_output, float_arg, int_arg, say_wrote, write_output

__all__ = ["FRAMEWORK_CHOICES", "TABLE_FORMATS", "add_command", "read_lengths", "read_records", "run"]

#: The frameworks (variance_lab.frameworks.logged.FRAMEWORKS; not imported here, it loads scipy).
FRAMEWORK_CHOICES = ("verl", "trl", "nemo-rl", "prime-rl", "slime", "openrlhf")
TABLE_FORMATS = ("markdown", "csv", "json")
_ROLLOUT_SUFFIXES = (".jsonl", ".gz", ".parquet", ".npz")


def _open_text(path: Path):
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None


def read_records(file: str) -> list[dict]:
    """Read METRICS_FILE: JSONL (one object per line) or CSV with a header; a bad line is a one-line error."""
    path = Path(file)
    text = _open_text(path)
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        records = []
        for i, row in enumerate(rows):
            if None in row:
                raise CLIError(f"{file}: record {i + 1}: more values than the header has names")
            records.append({k: v for k, v in row.items() if v not in ("", None)})
    else:
        records = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CLIError(
                    f"{file}: record {len(records) + 1} (line {i + 1}): not JSON: {exc.msg}"
                ) from None
            if not isinstance(rec, dict):
                raise CLIError(
                    f"{file}: record {len(records) + 1} (line {i + 1}): expected an object of metrics"
                )
            records.append(rec)
    if not records:
        raise CLIError(f"{file}: no records")
    return records


def read_lengths(file: str) -> list[float]:
    """Read a length dump: a rollout file (its sequences' lengths) or numbers (commas or blanks)."""
    path = Path(file)
    if path.suffix.lower() in _ROLLOUT_SUFFIXES:
        from variance_lab.cli._common import load_rollouts

        return [float(x) for x in load_rollouts(file).lengths]
    values = []
    for i, tok in enumerate(_open_text(path).replace(",", " ").split()):
        try:
            values.append(float(tok))
        except ValueError:
            raise CLIError(f"{file}: length {i + 1}: expected a number, got {tok!r}") from None
    if not values:
        raise CLIError(f"{file}: no lengths")
    return values


def _quantiles(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lengths separated by commas, got {text!r}") from None
    if not values or any(not (math.isfinite(v) and v >= 1) for v in values):
        raise argparse.ArgumentTypeError(f"expected lengths >= 1, got {text!r}")
    if any(b < a for a, b in itertools.pairwise(values)):
        raise argparse.ArgumentTypeError(f"quantiles must not decrease, got {text!r}")
    return values


def _level(text: str) -> float:
    value = float_arg(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _fmt(value, digits: int = 4) -> str:
    from variance_lab.report.table import format_number

    return format_number(value, digits=digits)


def _markdown(laws, metrics, title: str) -> str:
    lines = [f"# {title}", "", "## Token law per step: log r ~ N(m, s2)", ""]
    fit_cols = [c for c in laws.columns if c.startswith("s2[")]
    header = ["step", "m", "s2", "from", *fit_cols, "spread"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in laws.iterrows():
        cells = [_fmt(r["step"]), _fmt(r["m"]), _fmt(r["s2"]), r["source"], *(_fmt(r[c]) for c in fit_cols)]
        lines.append("| " + " | ".join([*cells, _fmt(r["s2_spread"])]) + " |")
    worst = float(laws["s2_spread"].max())
    if worst > 2.0:
        lines += [
            "",
            f"Warning: the token metrics disagree (fitted s2 up to {_fmt(worst)} times apart): "
            "the tokens are not i.i.d. lognormal (rare large log-ratios, heavy tails), so every "
            "prediction below holds for the law of its 'from' column only; metrics that weigh the "
            "tail (k3, chi2) give the larger s2.",
        ]
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
        logged = rows[rows["agreement"] != "not logged"]
        outside = logged[logged["agreement"] != "inside"]
        counts = rows["verdict"].value_counts()
        verdicts = ", ".join(
            f"{v} at {counts[v]}" for v in ("reliable", "marginal", "unreliable") if v in counts
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
    for _, r in metrics.iterrows():
        khat = "n/a (bounded)" if math.isnan(r["khat"]) else f"{r['khat']:.2f} (limit {r['khat_limit']:.2f})"
        needed = f"10^{r['log10_n_needed']:.1f}" if math.isfinite(r["log10_n_needed"]) else "inf"
        target = _fmt(r["target"]) if math.isfinite(r["target"]) else f"10^{r['log10_target']:.1f}"
        cells = [
            _fmt(r["step"]),
            r["metric"],
            _fmt(r["logged"]),
            f"{_fmt(r['predicted'])} [{_fmt(r['lo'])}, {_fmt(r['hi'])}]",
            r["agreement"],
            target,
            needed,
            khat,
            f"{r['verdict']}: {r['reason']}",
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


def render(laws, metrics, fmt: str, title: str) -> str:
    """Format the two frames of :func:`~variance_lab.frameworks.logged.analyze_logged`."""
    from variance_lab.schema import json_safe

    if fmt == "json":
        return (
            json.dumps(
                json_safe(
                    {"laws": laws.to_dict(orient="records"), "metrics": metrics.to_dict(orient="records")}
                ),
                indent=1,
            )
            + "\n"
        )
    if fmt == "csv":
        law_cols = ["step", "framework", "m", "s2", "source"]
        merged = metrics.merge(laws[law_cols], on="step", how="left") if not metrics.empty else laws
        return merged.to_csv(index=False)
    return _markdown(laws, metrics, title)


def run(args: argparse.Namespace) -> int:
    """Run ``variance-lab logged``: read the log and the lengths, predict, write the table."""
    from variance_lab.frameworks.logged import analyze_logged

    check_output(args.out, inputs=(args.file,) + ((args.lengths_file,) if args.lengths_file else ()))
    if (args.lengths is None) == (args.lengths_file is None):
        raise CLIError("give the run's lengths: --lengths QUANTILES or --lengths-file FILE (one of them)")
    records = read_records(args.file)
    lengths = read_lengths(args.lengths_file) if args.lengths_file else None
    laws, metrics = analyze_logged(
        records,
        batch_size=args.batch_size,
        lengths=lengths,
        quantiles=args.lengths,
        framework=args.framework,
        threshold=args.threshold,
        ratio_level=args.ratio_level,
        law_from=args.law_from,
        level=args.level,
        n_batches=args.n_batches,
        seed=args.seed,
        source=args.file,
    )
    title = f"Logged metrics of {Path(args.file).name} ({laws['framework'].iloc[0]}, variance-lab logged)"
    write_output(render(laws, metrics, args.table_format, title), args.out)
    if metrics.attrs.get("skipped"):
        print(
            f"{PROG}: skipped {metrics.attrs['skipped']} record(s) without any of the framework's metrics",
            file=sys.stderr,
        )
    say_wrote("the table", args.out)
    return 0


def add_command(sub) -> None:
    """Register ``logged`` on the subparsers ``sub`` of ``variance-lab``."""
    p = sub.add_parser(
        "logged",
        help="which of a run's logged ratio metrics a batch can estimate",
        description="Per step of a training run's log: the per-token law of the mismatch log-ratio fitted "
        "from its token-level metrics (verl k3_kl, chi2_token, kl; NeMo-RL token_mult_prob_error, "
        "gen_kl_error; prime-rl mismatch_kl; TRL sampling_logp_difference/mean; slime tis_abs), the "
        "sequence-level metrics predicted at the run's lengths and batch size with intervals (verl "
        "chi2_seq, and with rollout_is=sequence rollout_is_mean, rollout_is_eff_sample_size, "
        "rollout_is_ratio_fraction_high; NeMo-RL sampling_importance_ratio and is_oob_ratio with "
        "sequence-level ratios; TRL importance_sampling_ratio/mean in sequence_mask mode), and for each a "
        "verdict: can a batch of "
        "this size estimate it at all (draws needed, Pareto k-hat).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "file", metavar="METRICS_FILE", help="one record per step: .jsonl (objects) or .csv (header)"
    )
    p.add_argument(
        "--batch-size",
        type=int_arg("--batch-size", minimum=2),
        required=True,
        help="sequences per step (prompts x samples)",
    )
    p.add_argument(
        "--lengths",
        type=_quantiles,
        default=None,
        metavar="Q0,...,Q1",
        help="length quantiles at evenly spaced probabilities from 0 to 1 (one value: every "
        "sequence has that length; 8000,10000: uniform between)",
    )
    p.add_argument(
        "--lengths-file",
        default=None,
        metavar="FILE",
        help="a length dump: a rollout file (.jsonl[.gz], .parquet, .npz) or numbers",
    )
    p.add_argument(
        "--framework",
        default=None,
        choices=FRAMEWORK_CHOICES,
        help="whose names the log uses (None: from its keys)",
    )
    p.add_argument(
        "--threshold",
        type=float_arg,
        default=None,
        help="the bound C of truncated, masked and out-of-bound metrics (None: the framework's "
        "default: TRL 3, NeMo-RL 2)",
    )
    p.add_argument(
        "--ratio-level",
        default=None,
        choices=("token", "sequence"),
        help="the run's importance ratios: per token or per sequence (verl rollout_is, NeMo-RL "
        "sequence_level_importance_ratios, TRL vllm_importance_sampling_mode); None: the framework's "
        "default (TRL sequence, the others token)",
    )
    p.add_argument(
        "--law-from",
        default=None,
        metavar="METRIC",
        help="the token metric that sets the law, e.g. token_mult_prob_error (None: chi2, then k3, mult, "
        "absdiff, tis_abs, kl, whichever the log has first)",
    )
    p.add_argument("--level", type=_level, default=0.9, help="level of the prediction intervals")
    p.add_argument(
        "--n-batches",
        type=int_arg("--n-batches", minimum=20),
        default=400,
        help="simulated batches per step for the intervals",
    )
    p.add_argument("--seed", type=int_arg("--seed", minimum=0), default=0, help="seed of the simulation")
    p.add_argument("--table-format", default="markdown", choices=TABLE_FORMATS, help="output format")
    p.add_argument("--out", default=None, help="write the table to this file instead of standard output")
    p.set_defaults(func=run)
