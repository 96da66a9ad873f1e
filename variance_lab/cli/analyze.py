"""The ``variance-lab analyze`` subcommand: token log-probs from a file, analysed per length bucket.

Kept apart from :mod:`variance_lab.cli` (which registers it) so that the parser there stays
small. Output: the per-bucket table (markdown by default, or CSV / JSON with stable column
names) on standard output or ``--out``; with ``--table-format csv`` the fit, dropped
sequences, clip fractions and verdict go to standard error as text (JSON holds them under
``"summary"``, markdown above the tables). ``--figure`` writes the figure (PDF, PNG or SVG).
Bad data: one line on standard error naming the sequence and its problem, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from variance_lab._atomic import atomic_write
from variance_lab.cli._common import CLIError, parse_int_list, write_output

__all__ = ["FIGURE_SUFFIXES", "add_command", "run"]

FIGURE_SUFFIXES = (".pdf", ".png", ".svg")


def _edges(text: str):
    """``auto`` (powers of two), ``exact`` (one bucket per length) or a comma list of integers."""
    if text == "auto":
        return None
    if text == "exact":
        return "exact"
    try:
        return parse_int_list(text)
    except CLIError as exc:
        raise argparse.ArgumentTypeError(f"expected auto, exact or {exc}") from None


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


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
    from variance_lab.rollouts.io import load_batch

    path = Path(args.file)
    if not path.is_file():
        raise CLIError(f"{args.file}: no such file")
    errors: tuple[type[BaseException], ...] = (OSError, zipfile.BadZipFile, EOFError)
    try:
        import pyarrow as pa

        errors += (pa.ArrowException,)
    except ImportError:  # pragma: no cover - pyarrow is in the dev extra
        pass
    fmt = None if args.format == "auto" else args.format
    try:
        return load_batch(path, format=fmt, on_bad=args.on_bad)
    except errors as exc:
        raise CLIError(
            f"{args.file}: cannot read it as {fmt or 'its extension says'}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def _save_figure(fig, target: str) -> None:
    """Write ``fig`` to ``target`` atomically (format from the suffix)."""
    path = Path(target)
    suffix = path.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        raise CLIError(f"--figure {target!r}: the name must end in {', '.join(FIGURE_SUFFIXES)}")
    if path.is_dir():
        raise CLIError(f"--figure {target!r} is a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise CLIError(f"--figure {target!r}: folder {str(folder)!r} does not exist")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=suffix[1:]))


def run(args: argparse.Namespace) -> int:
    """Analyze the token log-prob file, write the table (and figure), and return the exit status 0."""
    from variance_lab.report.analysis_table import render_analysis, summary_lines
    from variance_lab.rollouts.analysis import analyze

    if args.figure is not None and Path(args.figure).suffix.lower() not in FIGURE_SUFFIXES:
        raise CLIError(f"--figure {args.figure!r}: the name must end in {', '.join(FIGURE_SUFFIXES)}")
    batch = _load(args)
    result = analyze(batch, args.edges, n_boot=args.n_boot, level=args.level, seed=args.seed)
    summary = result.summary()
    title = (
        f"Analysis of {Path(args.file).name} (variance-lab analyze, n_boot={args.n_boot}, seed={args.seed})"
    )
    write_output(render_analysis(result.table, summary, args.table_format, title=title), args.out)
    if args.table_format == "csv":  # keep the CSV parseable: the summary goes to stderr
        print("\n".join(summary_lines(summary)), file=sys.stderr)
    if args.figure is not None:
        from variance_lab.report.analysis_figure import analysis_figure

        _save_figure(analysis_figure(result.table, result.curves(), level=args.level), args.figure)
    return 0


def add_command(sub) -> None:
    """Register ``analyze`` on the subparsers ``sub`` of ``variance-lab``."""
    from variance_lab.report.analysis_table import FORMATS as TABLE_FORMATS
    from variance_lab.rollouts.batch import ON_BAD
    from variance_lab.rollouts.io import FORMATS

    p = sub.add_parser(
        "analyze",
        help="analyse token log-probs of your own rollouts against the theory",
        description="Per bucket of sequence lengths: the sample variances of P_T and G_T with bootstrap "
        "intervals against three predictions from the pooled token log-ratios (i.i.d. lognormal fit, exact "
        "i.i.d. for their empirical distribution, autocorrelation-corrected), a verdict on which one the "
        "data support, and GSPO/PPO clip fractions observed and predicted. FILE holds one record per "
        "sequence with logp, old_logp and optional mask and id (JSONL, Parquet or NPZ).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="token log-probs: .jsonl[.gz], .parquet or .npz")
    p.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS), help="file format (auto: from the extension)"
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
    p.add_argument(
        "--n-boot",
        type=_nonneg_int,
        default=1000,
        help="bootstrap resamples per bucket (0: no intervals, no verdict)",
    )
    p.add_argument("--level", type=_level, default=0.95, help="confidence level of the intervals")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the bootstrap")
    p.add_argument("--table-format", default="markdown", choices=TABLE_FORMATS, help="output format")
    p.add_argument("--out", default=None, help="write the table to this file instead of standard output")
    p.add_argument("--figure", default=None, metavar="PATH", help="also write the figure (.pdf, .png, .svg)")
    p.set_defaults(func=run)
