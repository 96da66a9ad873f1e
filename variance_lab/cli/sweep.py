"""``variance-lab sweep``: a parameter grid into a resumable SQLite store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from variance_lab.cli._common import (
    GRID_EPILOG,
    PROG,
    CLIError,
    add_engine_args,
    add_long_run_args,
    add_seed_arg,
    add_subcommand,
    arg_values,
    check_output,
    confirm_long_run,
    engine_from_args,
    family_list,
    float_arg,
    grid_arg,
    one_line,
    param_grid,
    report_list,
    show_progress,
)
from variance_lab.families import FAMILIES


def run(args: argparse.Namespace) -> int:
    """Run the sweep, report skipped points and failed cells, and return 0, 1 (a failure) or 130."""
    from variance_lab import sweep as sweep_mod

    check_output(args.out)
    if args.out is not None:
        sweep_mod.check_table_path(args.out)
    _confirm(args, sweep_mod)
    try:
        with engine_from_args(args) as engine:
            result = sweep_mod.sweep(
                *_grid(args),
                store=args.store,
                engine=engine,
                progress=show_progress(args),
                **_cell_options(args),
            )
    except sweep_mod.SweepInterrupted as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 130
    if result.unreachable:
        report_list(
            "unreachable (family, mu, sigma2) points skipped",
            [
                f"{u['family']} mu={u['mu']:g} sigma2={u['sigma2']:g}: {u['reason']}"
                for u in result.unreachable
            ],
        )
    if args.out is not None:
        try:
            sweep_mod.write_table(result.frame, args.out)
        except OSError as exc:
            raise CLIError(f"--out {args.out!r}: cannot write it: {exc.strerror or one_line(exc)}") from None
        print(f"{PROG}: wrote {len(result.frame)} rows to {args.out}", file=sys.stderr)
    print(result.summary())
    if result.failed:
        report_list(
            "cells failed (not stored; rerun to retry)",
            [f"{f['label']}: {f['error']}" for f in result.failed],
        )
        return 1
    return 0


def _grid(args: argparse.Namespace) -> tuple:
    """Return the grid axes of :func:`variance_lab.sweep.plan` and ``sweep``: families, mu, sigma2, T, n."""
    return args.family, args.mu, args.sigma2, args.T, args.n


def _cell_options(args: argparse.Namespace) -> dict:
    """Return the keywords that ``plan`` and ``sweep`` share: seed, independent, ci, target, params."""
    return arg_values(args, ("seed", "independent", "ci", "target")) | {"params": dict(args.param or [])}


def _finished(store: str) -> set[str]:
    """Cells already in ``store`` (read-only; none when it is missing or not a store yet)."""
    from variance_lab.sweep import Store

    if not Path(store).is_file():
        return set()
    try:
        with Store(store, readonly=True) as db:
            return db.finished()
    except ValueError:  # not a store: the sweep itself reports it
        return set()


def _confirm(args: argparse.Namespace, sweep_mod) -> None:
    """Estimate the Monte Carlo cells still to run; a long sweep needs ``--yes`` (confirm_long_run)."""
    from variance_lab.simulate.engine import estimate_run_seconds  # loads numba: only for a Monte Carlo sweep

    the_plan = sweep_mod.plan(*_grid(args), sampler=args.sampler, **_cell_options(args))
    todo = [c for c in the_plan.cells if c.kind == "monte_carlo"]
    if not todo:
        return
    finished = _finished(args.store)
    todo = [c for c in todo if c.id not in finished]
    seconds = 0.0
    for cell in todo:
        try:
            seconds += estimate_run_seconds(
                cell.family,
                cell.T,
                cell.n,
                sampler=args.sampler,
                independent=args.independent,
                workers=args.workers,
            )
        except ValueError:  # a cell that will fail (aggregate for gamma) costs nothing
            continue
    confirm_long_run(
        seconds, f"sweep of {len(the_plan.cells)} cells, {len(todo)} Monte Carlo cells to compute", args
    )


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab import sweep as sweep_mod

    p = add_subcommand(
        sub,
        "sweep",
        run,
        help="run a parameter grid into a resumable SQLite store",
        description="Theory and, where n > 0, Monte Carlo over family x mu x sigma2 x T (x n). Each cell "
        "(one family, mu, sigma2 and, for Monte Carlo, n and seed, over the whole T grid) is committed to "
        "the store in its own transaction; the same command run again skips finished cells. Points a "
        "family cannot reach (two-point with sigma2 >= mu^2) are listed and skipped. Ctrl-C stops "
        "cleanly, keeping finished cells.",
        epilog=GRID_EPILOG,
    )
    p.add_argument(
        "--family", type=family_list, default="lognormal", help=f"comma list of: {', '.join(FAMILIES)}"
    )
    p.add_argument("--mu", type=grid_arg("--mu"), default="1", help="grid of ratio means mu > 0")
    p.add_argument("--sigma2", type=grid_arg("--sigma2"), default="0.1", help="grid of ratio variances >= 0")
    p.add_argument(
        "--T",
        type=grid_arg("--T", integer=True, minimum=1),
        default="1,10,100,1000",
        help="grid of sequence lengths (integers >= 1)",
    )
    p.add_argument(
        "--n",
        type=grid_arg("--n", integer=True, minimum=0),
        default="0",
        help="grid of Monte Carlo draws per cell; 0 = theory only",
    )
    extras = sorted({f"{k} ({name})" for name in FAMILIES for k in sweep_mod.extra_parameters(name)})
    p.add_argument(
        "--param",
        type=param_grid,
        action="append",
        metavar="NAME=GRID",
        help=f"grid of an extra family parameter, repeatable: {', '.join(extras)}",
    )
    add_seed_arg(p, "root seed of the Monte Carlo cells")
    p.add_argument("--ci", type=float_arg, default=0.95, help="confidence level of Monte Carlo intervals")
    p.add_argument(
        "--independent",
        action="store_true",
        help="fresh Monte Carlo draws at every T instead of one path read at every T",
    )
    p.add_argument("--target", type=float_arg, default=0.1, help="target relative error of the n_needed rows")
    add_engine_args(p)
    p.add_argument("--store", default=sweep_mod.DEFAULT_STORE, help="SQLite store, created when missing")
    p.add_argument("--out", default=None, help="also write this sweep's rows to a .csv or .parquet file")
    add_long_run_args(p)
