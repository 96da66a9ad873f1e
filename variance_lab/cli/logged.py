"""The ``variance-lab logged`` subcommand: which of a run's logged numbers a batch can estimate.

Kept apart from :mod:`variance_lab.cli` (which registers it) so that the parser there stays
small: the work is :func:`variance_lab.frameworks.logged.analyze_logged`, imported when the
command runs. METRICS_FILE holds one record per step, keyed by the framework's names, in any
format :func:`variance_lab.frameworks.logfiles.read_metrics` reads: JSONL (verl's ``file`` logger
included), CSV (W&B's history or panel export), JSON, Parquet (W&B's history artifact), or a
TensorBoard event file or folder (the ``logs`` extra). Output: per step the token law, then per
sequence-level metric the logged value, its prediction with an interval, the expectation it
estimates and the verdict, as a markdown table, CSV (one row per record and metric, the law's
columns repeated) or JSON (``{"laws": [...], "metrics": [...]}``). A record that cannot be judged
is a row of its own (``not judged``, with why) and one line on standard error says how many; a
log in which no record can be judged, or bad options: one line on standard error naming the
file, the record and the field; exit status 2; nothing written.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

from variance_lab.cli._common import (
    CLIError,
    add_int_arg,
    add_output_args,
    add_seed_arg,
    add_subcommand,
    arg_values,
    check_output,
    float_arg,
    load_rollouts,
    one_line,
    output_table,
)
from variance_lab.frameworks.logfiles import FRAMEWORKS, read_lengths, read_metrics
from variance_lab.report.logged_table import LOGGED_FORMATS

__all__ = ["add_command", "run"]

#: Length dumps read as rollout files (their sequences' lengths); anything else holds numbers.
_ROLLOUT_SUFFIXES = (".jsonl", ".gz", ".parquet", ".npz")


def _lengths(file: str) -> list[float]:
    """Return the lengths of ``--lengths-file``: a rollout file's sequences, or the numbers in it."""
    if Path(file).suffix.lower() in _ROLLOUT_SUFFIXES:
        return [float(x) for x in load_rollouts(file).lengths]
    return read_lengths(file)


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


def run(args: argparse.Namespace) -> int:
    """Run ``variance-lab logged``: read the log and the lengths, predict, write the table."""
    from variance_lab.frameworks.logged import analyze_logged  # loads scipy: only when the command runs
    from variance_lab.report.logged_table import render_logged

    check_output(args.out, inputs=(args.file,) + ((args.lengths_file,) if args.lengths_file else ()))
    if (args.lengths is None) == (args.lengths_file is None):
        raise CLIError("give the run's lengths: --lengths QUANTILES or --lengths-file FILE (one of them)")
    records = read_metrics(args.file)
    lengths = _lengths(args.lengths_file) if args.lengths_file else None
    passed = ("batch_size", "framework", "threshold", "ratio_level", "law_from", "level", "n_batches", "seed")
    passed += ("micro_batch_size",)
    laws, metrics = analyze_logged(
        records, lengths=lengths, quantiles=args.lengths, source=args.file, **arg_values(args, passed)
    )
    title = f"Logged metrics of {Path(args.file).name} ({laws['framework'].iloc[0]}, variance-lab logged)"
    warnings = []
    if metrics.attrs.get("skipped"):
        warnings.append(
            f"skipped {metrics.attrs['skipped']} record(s) without any of the framework's metrics"
        )
    if metrics.attrs.get("not_judged"):
        first = laws.loc[laws["s2"].isna(), "note"].iloc[0]
        warnings.append(
            f"{metrics.attrs['not_judged']} record(s) not judged (each has a row saying why; "
            f"first: {one_line(ValueError(first))})"
        )
    return output_table(render_logged(laws, metrics, args.table_format, title=title), args.out, warnings)


def add_command(sub) -> None:
    """Register ``logged`` on the subparsers ``sub`` of ``variance-lab``."""
    p = add_subcommand(
        sub,
        "logged",
        run,
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
    )
    p.add_argument(
        "file",
        metavar="METRICS_FILE",
        help="one record per step: .jsonl (objects; verl's file logger), .csv (W&B history or panel "
        "export), .json, .parquet (W&B history), or a TensorBoard event file or folder",
    )
    add_int_arg(
        p,
        "--batch-size",
        minimum=2,
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
        choices=FRAMEWORKS,
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
    add_int_arg(
        p,
        "--micro-batch-size",
        minimum=1,
        default=1,
        metavar="N",
        help="NeMo-RL's train_micro_batch_size: with sequence-level ratios NeMo-RL logs "
        "sampling_importance_ratio as about N times the mean weight (a broadcast in its masked_mean), "
        "and it is judged so",
    )
    p.add_argument(
        "--law-from",
        default=None,
        metavar="METRIC",
        help="the token metric that sets the law, e.g. token_mult_prob_error (None: chi2, then k3, mult, "
        "absdiff, tis_abs, kl, whichever the log has first)",
    )
    p.add_argument("--level", type=_level, default=0.9, help="level of the prediction intervals")
    add_int_arg(
        p,
        "--n-batches",
        minimum=20,
        default=400,
        help="simulated batches per step for the intervals",
    )
    add_seed_arg(p, "seed of the simulation")
    add_output_args(
        p,
        LOGGED_FORMATS,
        option="--table-format",
        out_help="write the table to this file instead of standard output",
    )
