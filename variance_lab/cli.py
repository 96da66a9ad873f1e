"""The ``variance-lab`` command line: parse, call one function, format, exit.

Bad input prints one line on stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from variance_lab import __version__, theory
from variance_lab._atomic import atomic_write
from variance_lab.families import FAMILIES, get_family
from variance_lab.report import table as table_report

__all__ = ["main", "build_parser", "parse_int_list"]

PROG = "variance-lab"


class CLIError(Exception):
    """Bad command-line input: reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise CLIError(f"{message} (see '{self.prog} --help')")


def parse_int_list(text: str) -> list[int]:
    """Parse a comma list of integers such as ``1,10,100,1000``."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            out.append(int(part))
        except ValueError:
            raise CLIError(f"expected integers separated by commas, got {part!r} in {text!r}") from None
    return out


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def write_output(text: str, out: str | None) -> None:
    """Print ``text``, or write it to ``out`` atomically (an existing file is only
    replaced once the new text is complete)."""
    if out is None:
        sys.stdout.write(text)
        return
    path = Path(out)
    if path.is_dir():
        raise CLIError(f"--out {out!r} is a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise CLIError(f"--out {out!r}: folder {str(folder)!r} does not exist")
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _add_family_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--family",
        default="lognormal",
        help=f"ratio family: {', '.join(FAMILIES)} (default: %(default)s)",
    )
    p.add_argument("--mu", type=_float, default=1.0, help="mean of the ratio r (default: %(default)s)")
    p.add_argument(
        "--sigma2", type=_float, default=0.1, help="variance of the ratio r (default: %(default)s)"
    )
    p.add_argument("--q", type=_float, default=None, help="two-point only: P(r = lower value); 0.5 if unset")
    p.add_argument(
        "--rho", type=_float, default=None, help="ar1 only: lag-one correlation of log r; 0 if unset"
    )


def family_from_args(args: argparse.Namespace):
    """The family named by ``--family --mu --sigma2`` and, where given, ``--q`` / ``--rho``."""
    extra = {k: getattr(args, k) for k in ("q", "rho") if getattr(args, k, None) is not None}
    return get_family(args.family, args.mu, args.sigma2, **extra)


def _cmd_table(args: argparse.Namespace) -> int:
    family = family_from_args(args)
    T = parse_int_list(args.T)
    frame = theory.summary(family, T, target=args.target)
    notes = table_report.errata(frame, family.mu, family.sigma2)
    source = "exact theory"
    if args.n != 0:  # Monte Carlo columns beside the theory
        from variance_lab.simulate import simulate

        mc = simulate(
            family,
            T,
            args.n,
            seed=args.seed,
            workers=args.workers,
            target=args.target,
            executor=args.executor,
            scheduler=args.scheduler,
            sampler=args.sampler,
        )
        frame = table_report.with_monte_carlo(frame, mc)
        mc_notes = table_report.monte_carlo_notes(mc, args.n, args.seed, target=args.target)
        notes = f"{mc_notes}\n\n{notes}" if notes else mc_notes
        source = f"exact theory and Monte Carlo (n = {args.n:,}, seed {args.seed})"
    title = (
        f"Variance of P_T and G_T: {family.name}, mu = {family.mu:g}, sigma^2 = {family.sigma2:g}; "
        f"{source} (variance_lab {__version__})"
    )
    text = table_report.render(frame, args.format, title=title, notes=notes)
    write_output(text, args.out)
    return 0


# --------------------------------------------------------------------------- sweep, export, figures
_GRID_EPILOG = (
    "Grid syntax (--mu, --sigma2, --T, --n): a comma list of numbers and ranges; a:b:N is N points "
    "spaced linearly from a to b, a:b:logN is N points spaced evenly in log from a to b (ends "
    "included). Values are sorted and deduplicated; --T and --n are rounded to integers. "
    "Examples: --mu 0.9:1.1:5, --sigma2 0.01:1:log7, --T 1:1000:log20, --T 1,10,100,1000."
)


def _grid_arg(name: str, *, integer: bool = False, minimum: int | None = None):
    """An argparse type parsing a grid (see variance_lab.grid); errors become one-line usage errors."""
    from variance_lab import grid

    def parse(text: str):
        try:
            if integer:
                return grid.parse_int_grid(text, name=name, minimum=minimum)
            return grid.parse_grid(text, name=name)
        except ValueError as exc:  # argparse names the option itself
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name}: ")) from None

    parse.__name__ = f"{name.lstrip('-')} grid"
    return parse


def _family_list(text: str) -> list[str]:
    from variance_lab import grid

    try:
        return grid.parse_name_list(text, name="--family", choices=list(FAMILIES))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--family: ")) from None


def _param_grid(text: str) -> tuple[str, object]:
    """``NAME=GRID`` for an extra family parameter (``rho=0:0.9:4``)."""
    from variance_lab import grid

    name, sep, values = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=GRID, got {text!r}")
    try:
        return name.strip(), grid.parse_grid(values, name=f"--param {name.strip()}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


#: Executors of the Monte Carlo engine (variance_lab.simulate.EXECUTORS; not imported here, it loads numba).
EXECUTORS = ("threads", "dask", "dask-local")


def _add_executor_args(p: argparse.ArgumentParser) -> None:
    """``--workers``, ``--executor`` and ``--scheduler``: where Monte Carlo chunks run."""
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="Monte Carlo threads, or worker processes with --executor dask-local; None: all cores "
        "(results do not depend on it)",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="threads",
        help="where Monte Carlo chunks run: local threads, an existing Dask cluster (--scheduler), or a "
        "Dask LocalCluster of --workers processes; dask needs: pip install 'variance_lab[distributed]'",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="--executor dask: the scheduler, tcp://HOST:PORT or a scheduler .json file",
    )


#: Monte Carlo samplers (variance_lab.simulate.SAMPLER_CHOICES; not imported here, it loads numba).
SAMPLERS = ("token", "aggregate", "auto")


def _add_sampler_arg(p: argparse.ArgumentParser) -> None:
    """``--sampler``: token-level draws, or exact aggregate draws of log P_T at the grid points."""
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="token",
        help="Monte Carlo sampling: every token (the reference, all families); log P_T drawn at the T "
        "grid points from its exact law (aggregate: lognormal, two-point, ar1; one or two draws per "
        "grid point instead of max(T) per path: the same law, other draws); auto: aggregate where "
        "exact, token for gamma",
    )


def _report_list(title: str, items: list[str], limit: int = 10) -> None:
    print(f"{PROG}: {title}: {len(items)}", file=sys.stderr)
    for item in items[:limit]:
        print(f"  {item}", file=sys.stderr)
    if len(items) > limit:
        print(f"  ... and {len(items) - limit} more", file=sys.stderr)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from variance_lab import sweep as sweep_mod

    try:
        result = sweep_mod.sweep(
            args.family,
            args.mu,
            args.sigma2,
            args.T,
            args.n,
            seed=args.seed,
            store=args.store,
            workers=args.workers,
            executor=args.executor,
            scheduler=args.scheduler,
            sampler=args.sampler,
            independent=args.independent,
            ci=args.ci,
            target=args.target,
            params=dict(args.param or []),
            progress=not args.no_progress,
        )
    except sweep_mod.SweepInterrupted as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 130
    if result.unreachable:
        _report_list(
            "unreachable (family, mu, sigma2) points skipped",
            [
                f"{u['family']} mu={u['mu']:g} sigma2={u['sigma2']:g}: {u['reason']}"
                for u in result.unreachable
            ],
        )
    if args.out is not None:
        sweep_mod.write_table(result.frame, args.out)
    print(result.summary())
    if result.failed:
        _report_list(
            "cells failed (not stored; rerun to retry)",
            [f"{f['label']}: {f['error']}" for f in result.failed],
        )
        return 1
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from variance_lab import sweep as sweep_mod

    frame = sweep_mod.export(args.store, args.out, args.format)
    print(f"wrote {len(frame)} rows to {args.out}")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    from variance_lab import figures as figures_mod

    if args.from_sidecar is not None:
        paths = figures_mod.from_sidecar(args.from_sidecar, args.out, workers=args.workers)
    else:
        only = None
        if args.only is not None:
            from variance_lab import grid

            only = grid.parse_name_list(args.only, name="--only", choices=list(figures_mod.ALL_FIGURES))
        paths = figures_mod.make_all(
            args.out or "figures",
            quick=args.quick,
            only=only,
            workers=args.workers,
            progress=not args.no_progress,
        )
    folders = sorted({str(p.parent) for p in paths})
    print(f"wrote {len(paths)} files to {', '.join(folders)}")
    return 0


def _add_sweep_commands(sub) -> None:
    """The ``sweep``, ``export`` and ``figures`` subcommands."""
    from variance_lab import figures as figures_mod
    from variance_lab import sweep as sweep_mod

    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser(
        "sweep",
        help="run a parameter grid into a resumable SQLite store",
        description="Theory and, where n > 0, Monte Carlo over family x mu x sigma2 x T (x n). Each cell "
        "(one family, mu, sigma2 and, for Monte Carlo, n and seed, over the whole T grid) is committed to "
        "the store in its own transaction; the same command run again skips finished cells. Points a "
        "family cannot reach (two-point with sigma2 >= mu^2) are listed and skipped. Ctrl-C stops "
        "cleanly, keeping finished cells.",
        epilog=_GRID_EPILOG,
        formatter_class=fmt,
    )
    p.add_argument(
        "--family", type=_family_list, default="lognormal", help=f"comma list of: {', '.join(FAMILIES)}"
    )
    p.add_argument("--mu", type=_grid_arg("--mu"), default="1", help="grid of ratio means mu > 0")
    p.add_argument("--sigma2", type=_grid_arg("--sigma2"), default="0.1", help="grid of ratio variances >= 0")
    p.add_argument(
        "--T",
        type=_grid_arg("--T", integer=True, minimum=1),
        default="1,10,100,1000",
        help="grid of sequence lengths (integers >= 1)",
    )
    p.add_argument(
        "--n",
        type=_grid_arg("--n", integer=True, minimum=0),
        default="0",
        help="grid of Monte Carlo draws per cell; 0 = theory only",
    )
    extras = sorted({f"{k} ({name})" for name in FAMILIES for k in sweep_mod.extra_parameters(name)})
    p.add_argument(
        "--param",
        type=_param_grid,
        action="append",
        metavar="NAME=GRID",
        help=f"grid of an extra family parameter, repeatable: {', '.join(extras)}",
    )
    p.add_argument("--seed", type=int, default=0, help="root seed of the Monte Carlo cells")
    p.add_argument("--ci", type=_float, default=0.95, help="confidence level of Monte Carlo intervals")
    p.add_argument(
        "--independent",
        action="store_true",
        help="fresh Monte Carlo draws at every T instead of one path read at every T",
    )
    p.add_argument("--target", type=_float, default=0.1, help="target relative error of the n_needed rows")
    _add_sampler_arg(p)
    _add_executor_args(p)
    p.add_argument("--store", default=sweep_mod.DEFAULT_STORE, help="SQLite store, created when missing")
    p.add_argument("--out", default=None, help="also write this sweep's rows to a .csv or .parquet file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)

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
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "figures",
        help="regenerate every figure (PDF, PNG, data CSV and JSON sidecar)",
        description="Regenerates figures from scratch: each as NAME.pdf, NAME.png, NAME.csv (the data "
        "drawn) and NAME.json (parameters, seed, n, versions). Figures: "
        + ", ".join(figures_mod.ALL_FIGURES)
        + ". --from-sidecar rebuilds one figure from its JSON sidecar.",
        formatter_class=fmt,
    )
    p.add_argument(
        "--out", default=None, help="output folder, None: figures/ (--from-sidecar: the sidecar's folder)"
    )
    p.add_argument("--quick", action="store_true", help="small grids and few draws (seconds; for tests)")
    p.add_argument("--only", default=None, help="comma list of figure names, None: all")
    p.add_argument("--from-sidecar", default=None, metavar="JSON", help="rebuild the figure of this sidecar")
    p.add_argument("--workers", type=_positive_int, default=None, help="Monte Carlo threads, None: all cores")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_figures)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``variance-lab`` and its subcommands."""
    parser = _Parser(
        prog=PROG,
        description="Variance of sequence-level importance ratios: the product P_T against "
        "GSPO's geometric mean G_T = P_T^(1/T).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "table",
        help="print the seed's variance comparison table",
        description="The variance comparison table of the seed: exact Var(P_T), exact Var(G_T), "
        "the seed's approximations, bias and MSE of G_T, ESS and the draws plain Monte Carlo needs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_family_args(p)
    p.add_argument("--T", default="1,10,100,1000", help="sequence lengths, a comma list of integers >= 1")
    p.add_argument(
        "--n",
        type=int,
        default=1_000_000,
        help="Monte Carlo draws (sequences); 0 = theory only. n >= 2 adds the mc_* columns: Monte Carlo "
        "Var(P_T), Var(G_T) with intervals, E[G_T], ESS fraction and Pareto k-hat of the weights P_T, "
        "and the verdicts",
    )
    p.add_argument("--seed", type=int, default=0, help="root seed of the Monte Carlo draws")
    _add_sampler_arg(p)
    _add_executor_args(p)
    p.add_argument(
        "--target", type=_float, default=0.1, help="target relative error for the draws-needed columns"
    )
    p.add_argument("--format", default="markdown", choices=table_report.FORMATS, help="output format")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.set_defaults(func=_cmd_table)
    _add_sweep_commands(sub)
    from variance_lab.analyze_cli import add_analyze_command  # imports this module: register it late

    add_analyze_command(sub)
    from variance_lab.experiment.command import add_experiment_command  # torch only when run

    add_experiment_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``variance-lab`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except (CLIError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
