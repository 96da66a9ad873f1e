"""``variance-lab table``: the variance comparison table of the derivation, exact and Monte Carlo."""

from __future__ import annotations

import argparse

from variance_lab import __version__, theory
from variance_lab.cli._common import (
    add_executor_args,
    add_family_args,
    add_sampler_arg,
    family_from_args,
    float_arg,
    parse_int_list,
    write_output,
)
from variance_lab.report import table as table_report


def run(args: argparse.Namespace) -> int:
    """Print or write the comparison table (theory, and Monte Carlo unless ``--n 0``); return 0."""
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


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "table",
        help="print the seed's variance comparison table",
        description="The variance comparison table of the seed: exact Var(P_T), exact Var(G_T), "
        "the seed's approximations, bias and MSE of G_T, ESS and the draws plain Monte Carlo needs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_family_args(p)
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
    add_sampler_arg(p)
    add_executor_args(p)
    p.add_argument(
        "--target", type=float_arg, default=0.1, help="target relative error for the draws-needed columns"
    )
    p.add_argument("--format", default="markdown", choices=table_report.FORMATS, help="output format")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.set_defaults(func=run)
