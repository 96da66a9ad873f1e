"""``variance-lab export``: a sweep store to CSV or Parquet."""

from __future__ import annotations

import argparse

from variance_lab.cli._common import CLIError, add_subcommand, check_output, one_line


def run(args: argparse.Namespace) -> int:
    """Export the sweep store to ``--out``, say how many rows were written, and return 0."""
    from variance_lab import sweep as sweep_mod

    check_output(args.out, inputs=(args.store,))
    try:
        frame = sweep_mod.export(args.store, args.out, args.format)
    except OSError as exc:
        raise CLIError(f"--out {args.out!r}: cannot write it: {exc.strerror or one_line(exc)}") from None
    print(f"wrote {len(frame)} rows to {args.out}")
    return 0


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab import sweep as sweep_mod

    p = add_subcommand(
        sub,
        "export",
        run,
        help="write a sweep store to CSV or Parquet",
        description="Every row of a sweep store (tidy columns plus n, seed, cell, version, created) "
        "to one CSV or Parquet file, written atomically. The store is opened read-only: it is never "
        "written, and a file that is not a store is an error.",
    )
    p.add_argument("store", help="the SQLite store")
    p.add_argument("--out", required=True, help="output file, .csv or .parquet")
    p.add_argument(
        "--format",
        default=None,
        choices=sweep_mod.EXPORT_FORMATS,
        help="output format, None: from the --out suffix",
    )
