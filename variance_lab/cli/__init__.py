"""The ``variance-lab`` command line: one module per subcommand, each parses, calls, formats, exits.

Bad input prints one line on stderr and exits with status 2, without a traceback. Nothing in the
package imports this one.
"""

from __future__ import annotations

import argparse
import sys

from variance_lab import __version__
from variance_lab.cli import analyze, corrections, experiment, export, figures, logged, sweep, table
from variance_lab.cli._common import PROG, CLIError, Parser, drop_notes, flush_notes, one_line, os_error_line

__all__ = ["build_parser", "main"]

#: Subcommand modules in the order ``--help`` lists them.
COMMANDS = (table, sweep, export, figures, analyze, corrections, experiment, logged)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``variance-lab`` and its subcommands."""
    parser = Parser(
        prog=PROG,
        description="Variance of sequence-level importance ratios: the product P_T against "
        "GSPO's geometric mean G_T = P_T^(1/T).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    for command in COMMANDS:
        command.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``variance-lab`` console script; returns the exit status."""
    parser = build_parser()
    drop_notes()
    try:
        args = parser.parse_args(argv)
        status = args.func(args)
    except (CLIError, ValueError, OSError, KeyboardInterrupt) as exc:
        drop_notes()  # a failure is one line: notes queued before it are not printed
        return _failure(exc)
    flush_notes()
    return status


def _failure(exc: BaseException) -> int:
    """Print the one line of a failed command on standard error; return its exit status."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, OSError):  # the file system refused (read-only, full, no permission, /proc)
        print(f"{PROG}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
    return 2
