"""``variance-lab table``: the variance comparison table of the derivation, exact and Monte Carlo."""

from __future__ import annotations

import argparse

from variance_lab import __version__
from variance_lab.cli._common import (
    add_engine_args,
    add_family_args,
    add_int_arg,
    add_long_run_args,
    add_output_args,
    add_seed_arg,
    add_subcommand,
    check_output,
    confirm_long_run,
    engine_from_args,
    family_extras,
    family_from_args,
    float_arg,
    grid_arg,
    output_table,
    show_progress,
)
from variance_lab.report import table as table_report


def run(args: argparse.Namespace) -> int:
    """Run ``variance-lab table``: exact theory, with Monte Carlo columns when n > 0."""
    from variance_lab import theory  # here, not at import: building the parser need not load it

    check_output(args.out)
    family = family_from_args(args)
    T = [int(t) for t in args.T]
    frame = theory.summary(family, T, target=args.target)
    notes = table_report.errata(frame, family.mu, family.sigma2, family.name)
    inf_note = table_report.infinite_variance_note(frame, getattr(family, "critical_T", None))
    notes = "\n\n".join(part for part in (inf_note, notes) if part)
    source = "exact theory"
    if args.n != 0:  # Monte Carlo columns beside the theory
        from variance_lab.simulate import simulate
        from variance_lab.simulate.engine import estimate_run_seconds

        if args.n >= 2:  # n = 1 is refused by simulate with the reason
            seconds = estimate_run_seconds(family, T, args.n, sampler=args.sampler, workers=args.workers)
            confirm_long_run(seconds, f"table up to T = {max(T):,} with n = {args.n:,}", args)

        with engine_from_args(args) as engine:
            mc = simulate(
                family,
                T,
                args.n,
                seed=args.seed,
                engine=engine,
                target=args.target,
                progress=None if show_progress(args) else False,
            )
        frame = table_report.with_monte_carlo(frame, mc)
        mc_notes = table_report.monte_carlo_notes(mc, args.n, args.seed, target=args.target)
        notes = f"{mc_notes}\n\n{notes}" if notes else mc_notes
        source = f"exact theory and Monte Carlo (n = {args.n:,}, seed {args.seed})"
    extra = "".join(
        f", {k} = {v:g}" if isinstance(v, float) else f", {k} = {v}" for k, v in family_extras(family)
    )
    title = (
        f"Variance of P_T and G_T: {family.name}, mu = {family.mu:g}, sigma^2 = {family.sigma2:g}{extra}; "
        f"{source} (variance_lab {__version__})"
    )
    text = table_report.render(frame, args.format, title=title, notes=notes)
    return output_table(text, args.out)


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    p = add_subcommand(
        sub,
        "table",
        run,
        help="print the derivation's variance comparison table",
        description="The variance comparison table of the source derivation: exact Var(P_T), exact "
        "Var(G_T), the derivation's approximations, bias and MSE of G_T, ESS and the draws plain Monte "
        "Carlo needs.",
    )
    add_family_args(p)
    p.add_argument(
        "--T",
        type=grid_arg("--T", integer=True, minimum=1),
        default="1,10,100,1000",
        help="sequence lengths, integers >= 1: a comma list or ranges as in sweep (1:1000:log4); sorted, "
        "a length given twice is computed once; 1e6 is accepted, 1.5 refused",
    )
    add_int_arg(
        p,
        "--n",
        minimum=0,
        default=1_000_000,
        help="Monte Carlo draws (sequences); 0 = theory only. n >= 2 adds the mc_* columns: Monte Carlo "
        "Var(P_T), Var(G_T) with intervals, E[G_T], ESS fraction and Pareto k-hat of the weights P_T, "
        "and the verdicts",
    )
    add_seed_arg(p, "root seed of the Monte Carlo draws")
    add_engine_args(p)
    p.add_argument(
        "--target", type=float_arg, default=0.1, help="target relative error for the draws-needed columns"
    )
    add_output_args(p, table_report.TABLE_FORMATS)
    add_long_run_args(p)
