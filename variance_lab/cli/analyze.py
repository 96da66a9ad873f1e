"""The ``variance-lab analyze`` subcommand: token log-probs from a file, analysed per length bucket.

Kept apart from :mod:`variance_lab.cli` (which registers it) so that the parser there stays
small. Output: the per-bucket table (markdown by default, or CSV / JSON with stable column
names) on standard output or ``--out``; with ``--table-format csv`` the fit, dropped
sequences, clip fractions and verdict go to standard error as text (JSON holds them under
``"summary"``, markdown above the tables). ``--figure`` writes the figure (PDF, PNG or SVG).
Bad data: one line on standard error naming the sequence and its problem, exit status 2.

A directory instead of a file is a run, one dump per training step
(:func:`variance_lab.rollouts.steps.analyze_run`): one row per step, ``--figure`` the statistics
across steps, ``--scheduler`` the steps spread over a Dask cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from variance_lab.cli._common import (
    CLIError,
    add_int_arg,
    add_output_args,
    add_ratio_arg,
    add_seed_arg,
    add_subcommand,
    arg_values,
    check_output,
    flush_notes,
    int_grid,
    load_rollouts,
    note,
    reuse_freed_memory,
    say_wrote,
    write_file,
    write_output,
)

__all__ = ["FIGURE_SUFFIXES", "add_command", "run"]

FIGURE_SUFFIXES = (".pdf", ".png", ".svg")


def _edges(text: str):
    """``auto`` (powers of two), ``exact`` (one bucket per length) or a comma list of integers."""
    if text == "auto":
        return None
    if text == "exact":
        return "exact"
    try:
        return int_grid(text, name="--edges", minimum=1)
    except CLIError as exc:
        raise argparse.ArgumentTypeError(
            f"expected auto, exact or integers >= 1: {str(exc).removeprefix('--edges: ')}"
        ) from None


def _level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _load(args: argparse.Namespace):
    """Load the batch of ``args.file``; a missing or unreadable file is a one-line error."""
    if Path(args.file).is_dir():
        raise CLIError(f"{args.file}: is a directory, not a file of token log-probs")
    return load_rollouts(
        args.file, format=_format(args), on_bad=args.on_bad, preset=args.preset, streamed=True
    )


def _format(args: argparse.Namespace) -> str | None:
    """``--format``: None for ``auto`` (from the extension)."""
    return None if args.format == "auto" else args.format


def _options(args: argparse.Namespace) -> dict:
    """Return the options of :func:`~variance_lab.rollouts.analysis.analyze`: a file, each step of a run."""
    caps = {"fit_tokens": args.fit_tokens or None, "fit_sequences": args.fit_sequences or None}  # 0: all
    return arg_values(args, ("edges", "n_boot", "level", "seed", "folds")) | caps


def _check_figure(target: str | None, source: str) -> None:
    """Check ``--figure`` before any work: a known suffix, a folder that exists and is writable."""
    if target is None:
        return
    if Path(target).suffix.lower() not in FIGURE_SUFFIXES:
        raise CLIError(f"--figure {target!r}: the name must end in {', '.join(FIGURE_SUFFIXES)}")
    check_output(target, "--figure", inputs=(source,))


def _save_figure(fig, target: str) -> None:
    """Write ``fig`` to ``target`` atomically (format from the suffix)."""
    suffix = Path(target).suffix.lower()
    write_file(target, lambda tmp: fig.savefig(tmp, format=suffix[1:]), "--figure")


def run(args: argparse.Namespace) -> int:
    """Run ``variance-lab analyze``: analyze the file and write its table, summary and figure."""
    if Path(args.file).is_dir():  # a run: one dump per step
        return _run_directory(args)
    if getattr(args, "scheduler", None) is not None:
        raise CLIError(
            f"--scheduler spreads the steps of a run directory over a cluster; {args.file} is a file"
        )
    from variance_lab.report.analysis_table import render_analysis, split_lines, summary_lines
    from variance_lab.rollouts.analysis import analyze
    from variance_lab.rollouts.split import choose_ratio

    reuse_freed_memory()  # a dump's temporaries are large: keep their memory rather than fault it in again
    check_output(args.out, inputs=(args.file,))  # every output path is checked before the analysis runs
    _check_figure(args.figure, args.file)
    batch = _load(args)
    ratio, ratio_note = choose_ratio(batch, args.ratio, name=Path(args.file).name)
    result = analyze(batch, ratio=ratio, **_options(args))
    summary = result.summary()
    summary["notes"] += [ratio_note] if ratio_note else []
    if args.table_format != "csv":  # csv: the summary, notes included, goes to stderr below
        for text in [*summary["notes"], summary["groups"].get("note")]:
            if text:
                note(text)  # printed once the table is written: a failure before that is one line
    title = (
        f"Analysis of {Path(args.file).name} (variance-lab analyze, n_boot={args.n_boot}, seed={args.seed})"
    )
    write_output(render_analysis(result.table, summary, args.table_format, title=title), args.out)
    flush_notes()
    if args.table_format == "csv":  # keep the CSV parseable: the summary goes to stderr
        print("\n".join(summary_lines(summary) + split_lines(summary.get("split"))), file=sys.stderr)
    say_wrote("the table", args.out)
    if args.figure is not None:
        from variance_lab.report import style
        from variance_lab.report.analysis_figure import analysis_figure

        with style.paper():  # one column at 7-8 pt; saved in the same style (tight box, 300 dpi)
            _save_figure(analysis_figure(result.table, result.curves(), level=args.level), args.figure)
        say_wrote("the figure", args.figure)
    return 0


def _run_directory(args: argparse.Namespace) -> int:
    """``analyze RUN_DIR``: every step of the run analysed, one row per step, the figure across steps."""
    from variance_lab.report.analysis_table import render_run, step_ranges
    from variance_lab.rollouts.steps import analyze_run

    reuse_freed_memory()
    check_output(args.out, inputs=(args.file,))
    _check_figure(args.figure, args.file)
    try:
        run = analyze_run(
            args.file,
            preset=args.preset,
            format=_format(args),
            on_bad=args.on_bad,
            ratio=args.ratio,
            scheduler=args.scheduler,
            **_options(args),
        )
    except ImportError as exc:  # pyarrow, torch or dask missing: the message names what to install
        raise CLIError(f"{args.file}: {str(exc).splitlines()[0]}") from None
    info = run.summary()
    for text in info["notes"]:
        note(text)
    for item in info["step_notes"]:
        note(f"steps {step_ranges(item['steps'])}: {item['text']}")
    title = (
        f"Analysis of the run {args.file} (variance-lab analyze, {info['n_steps']} steps, "
        f"n_boot={args.n_boot}, seed={args.seed})"
    )
    text = render_run(run.steps, run.buckets, info, args.table_format, summaries=run.summaries, title=title)
    write_output(text, args.out)
    say_wrote("the table", args.out)
    if args.figure is not None:
        from variance_lab.report import style
        from variance_lab.report.run_figure import run_figure

        with style.paper():
            _save_figure(run_figure(run.steps, run.buckets), args.figure)
        say_wrote("the figure", args.figure)
    return 0


def _add_run_args(p) -> None:
    """Add the option of a run directory: ``--scheduler``."""
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="RUN_DIR only: analyse the steps on this Dask cluster, one task a step (tcp://HOST:PORT or a "
        "scheduler .json file; the workers read the dumps at the same paths); the rows are the same as "
        "a local run. Needs: pip install 'variance_lab[distributed]'",
    )


def add_command(sub) -> None:
    """Register ``analyze`` on the subparsers ``sub`` of ``variance-lab``."""
    from variance_lab.report.analysis_table import ANALYSIS_FORMATS
    from variance_lab.rollouts.batch import ON_BAD
    from variance_lab.rollouts.io import PRESET_NAMES, ROLLOUT_FORMATS
    from variance_lab.rollouts.subsample import FIT_SEQUENCES, FIT_TOKENS

    p = add_subcommand(
        sub,
        "analyze",
        run,
        help="analyse token log-probs of your own rollouts against the theory",
        description="Per bucket of sequence lengths: the sample variances of P_T and G_T with bootstrap "
        "intervals against three predictions from the pooled token log-ratios (i.i.d. lognormal fit, exact "
        "i.i.d. for their empirical distribution, autocorrelation-corrected), a verdict on which one the "
        "data support, and GSPO/PPO clip fractions observed and predicted. FILE holds one record per "
        "sequence with logp, old_logp and optional mask, id, prompt_id and rollout_logp (JSONL, Parquet or "
        "NPZ); with prompt_id (the prompt a response answers) every interval resamples prompts, not "
        "sequences; with "
        "rollout_logp (the inference engine's log-probs) the total ratio is split into the mismatch "
        "pi_old/mu_rollout and the update pi_theta/pi_old, with a line saying which part dominates. "
        "A directory RUN_DIR of one dump per training step is a run: each step is analysed as its file "
        "alone would be, the output has one row per step (and per step and length bucket: Var(G_T), the "
        "clip fractions, Pareto k-hat of P_T), --figure draws them across steps, and --scheduler spreads "
        "the steps over a Dask cluster.",
    )
    p.add_argument(
        "file",
        metavar="FILE",
        help="token log-probs: .jsonl[.gz], .parquet or .npz; or RUN_DIR, a directory of one dump per "
        "training step (prime-rl's token_exports/step_N/, NeMo-RL's train_data_stepN.jsonl, slime's .pt, or "
        "the files above, the step number in their names): one row per step",
    )
    p.add_argument(
        "--format",
        default="auto",
        choices=("auto", *ROLLOUT_FORMATS),
        help="file format (auto: from the extension)",
    )
    p.add_argument(
        "--preset",
        default=None,
        choices=PRESET_NAMES,
        help="read a framework's dump: nemo-rl (train_data_step*.jsonl), prime-rl "
        "(token_exports/step_N/rank_R.jsonl), slime (the .pt of --save-debug-train-data); the "
        "inference engine's log-probs become rollout_logp. None: logp, old_logp, mask, id, rollout_logp",
    )
    p.add_argument(
        "--on-bad",
        default="raise",
        choices=ON_BAD,
        help="bad sequence: raise (stop with an error naming it) or drop it and count it",
    )
    p.add_argument(
        "--edges",
        type=_edges,
        default="auto",
        help="length buckets: auto (powers of two), exact (one per length) or increasing integers "
        "e.g. 16,32,64,128",
    )
    add_int_arg(
        p,
        "--n-boot",
        minimum=0,
        default=1000,
        help="bootstrap resamples per bucket (0: no intervals, no verdict)",
    )
    p.add_argument("--level", type=_level, default=0.95, help="confidence level of the intervals")
    add_int_arg(
        p,
        "--folds",
        minimum=0,
        default=2,
        help="K of the held-out judgment of the fitted models: prompts (or sequences, without prompt_id) "
        "split at random into K folds, each judged by models fitted on the others (0 or 1: in sample only)",
    )
    for option, cap, what in (
        (
            "--fit-tokens",
            FIT_TOKENS,
            "tokens the token-mixture fits (mix, comb) see at most, about: a larger file gives them a "
            "seeded random sample of whole prompts, named in the output",
        ),
        ("--fit-sequences", FIT_SEQUENCES, "sequences the hier fit sees at most, about, drawn the same way"),
    ):
        add_int_arg(p, option, minimum=0, default=cap, help=f"{what} (default {cap:,}; 0: all)")
    add_ratio_arg(p, "the ratio of the main table, the fits and the clip fractions")
    add_seed_arg(p, "seed of the bootstrap")
    add_output_args(
        p,
        ANALYSIS_FORMATS,
        option="--table-format",
        out_help="write the table to this file instead of standard output",
    )
    p.add_argument("--figure", default=None, metavar="PATH", help="also write the figure (.pdf, .png, .svg)")
    _add_run_args(p)
