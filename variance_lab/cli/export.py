"""``variance-lab export``: a sweep store to CSV or Parquet."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Export the sweep store to ``--out``, say how many rows were written, and return 0."""
    from variance_lab import sweep as sweep_mod

    frame = sweep_mod.export(args.store, args.out, args.format)
    print(f"wrote {len(frame)} rows to {args.out}")
    return 0


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab import sweep as sweep_mod

    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser(
        "export",
        help="write a sweep store to CSV or Parquet",
        description="Every row of a sweep store (tidy columns plus n, seed, cell, version, created) "
        "to one CSV or Parquet file, written atomically.",
        formatter_class=fmt,
    )
    p.add_argument("store", help="the SQLite store")
    p.add_argument("--out", required=True, help="output file, .csv or .parquet")
    p.add_argument(
        "--format",
        default=None,
        choices=sweep_mod.EXPORT_FORMATS,
        help="output format, None: from the --out suffix",
    )
    p.set_defaults(func=run)
