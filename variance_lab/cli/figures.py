"""``variance-lab figures``: regenerate every figure with its data and sidecar."""

from __future__ import annotations

import argparse

from variance_lab.cli._common import positive_int


def run(args: argparse.Namespace) -> int:
    """Write all or the chosen figures, or one again from its sidecar, and return 0."""
    from variance_lab.paper import figures as figures_mod

    if args.from_sidecar is not None:
        paths = figures_mod.from_sidecar(args.from_sidecar, args.out, workers=args.workers)
    else:
        only = None
        if args.only is not None:
            from variance_lab.sweep import grid

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


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab.paper import figures as figures_mod

    fmt = argparse.ArgumentDefaultsHelpFormatter
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
    p.add_argument("--workers", type=positive_int, default=None, help="Monte Carlo threads, None: all cores")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
