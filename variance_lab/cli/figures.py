"""``variance-lab figures``: regenerate every figure with its data and sidecar, or check them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from variance_lab.cli._common import (
    CLIError,
    add_executor_args,
    add_progress_arg,
    add_subcommand,
    engine_from_args,
    positive_int,
    show_progress,
)

#: The committed figures' folder: rebuilding into it needs --out or --force.
DEFAULT_OUT = "figures"


def _formats(text: str) -> list[str]:
    from variance_lab.paper.pipeline import FORMATS
    from variance_lab.sweep import grid

    return grid.parse_name_list(text, name="--format", choices=list(FORMATS))


def _style(text: str):
    """Parse a matplotlib style name or a style file.

    ``paper`` is the package's style, ``none`` matplotlib's rcParams.
    """
    import matplotlib.style

    if text == "none":
        return None
    if text == "paper" or text in matplotlib.style.available or text == "default":
        return text
    if Path(text).is_file():
        return str(Path(text).resolve())
    raise CLIError(
        f"--style {text!r}: not a matplotlib style name (paper, none, "
        f"{', '.join(matplotlib.style.available[:4])}, ...) nor a style file"
    )


def _guard(out, force: bool, target: Path) -> None:
    """Refuse to rebuild over committed figures unless --out or --force says so."""
    if out is None and not force and any(target.glob("*.json")):
        raise CLIError(
            f"{str(target)!r} already holds figures; pass --out DIR to write elsewhere "
            "or --force to replace them"
        )


def _check(args) -> int:
    target = args.from_sidecar or args.out or DEFAULT_OUT
    only = _only(args) if args.only is not None else None
    from variance_lab.paper.compare import STATUSES
    from variance_lab.paper.sidecar_check import check

    with engine_from_args(args) as engine:
        results = check(target, engine=engine, only=only)
    for result in results:
        for file in result.files:
            print(f"{result.sidecar}: {file.line()}", file=sys.stdout if file.ok else sys.stderr)
        for note in result.notes:
            print(f"{result.sidecar}: note: {note}")
    files = [f for r in results for f in r.files]
    counts = ", ".join(f"{n} {s}" for s in STATUSES if (n := sum(f.status == s for f in files)))
    differs = sum(not f.ok for f in files)
    verdict = f"{differs} differ" if differs else "OK"
    print(f"checked {target}: {len(files)} data file{'s' * (len(files) != 1)} ({counts}): {verdict}")
    return 1 if differs else 0


def _only(args):
    from variance_lab.paper.catalog import ALL_FIGURES
    from variance_lab.sweep import grid

    return grid.parse_name_list(args.only, name="--only", choices=list(ALL_FIGURES))


def run(args: argparse.Namespace) -> int:
    """Write all or the chosen figures, or one again from its sidecar, and return 0."""
    if args.check:
        return _check(args)
    from variance_lab.paper import pipeline

    style = _style(args.style) if args.style is not None else None
    formats = args.format
    if args.from_sidecar is not None:
        side = Path(args.from_sidecar)
        pipeline.read_figure_sidecar(side)  # a bad file is reported before anything else
        _guard(args.out, args.force, side.parent)
        with engine_from_args(args) as engine:
            paths = pipeline.from_sidecar(
                side, args.out, engine=engine, formats=formats, dpi=args.dpi, style=style
            )
    else:
        only = None if args.only is None else _only(args)
        _guard(args.out, args.force, Path(DEFAULT_OUT))
        with engine_from_args(args) as engine:
            paths = pipeline.make_all(
                args.out or DEFAULT_OUT,
                quick=args.quick,
                only=only,
                engine=engine,
                progress=show_progress(args),
                formats=formats,
                dpi=args.dpi,
                style=pipeline.DEFAULT_STYLE if args.style is None else style,
            )
    folders = sorted({str(p.parent) for p in paths})
    print(f"wrote {len(paths)} files to {', '.join(folders)}")
    return 0


def add_command(sub) -> None:
    """Register the subcommand on ``sub`` (an argparse subparsers object)."""
    from variance_lab.paper.names import ALL_FIGURES  # not paper.catalog: it imports the sweep grids

    p = add_subcommand(
        sub,
        "figures",
        run,
        help="regenerate every figure (images, data CSV and JSON sidecar), or check them",
        description="Regenerates figures from scratch: each as NAME.pdf and NAME.png (or --format), "
        "NAME.csv (the data drawn) and NAME.json (parameters, seed, n, style, versions). Figures: "
        + ", ".join(ALL_FIGURES)
        + ". --from-sidecar rebuilds any of them from its JSON sidecar; --check rebuilds in a temporary "
        "folder and compares the data number by number and versions with the sidecars, writing nothing "
        "(exit 1 when a data file differs or its SHA-256 is not the one its sidecar records). Writing "
        "into the committed figures/ folder needs --out figures or --force.",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder, None: figures/ (--from-sidecar: the sidecar's folder; "
        "--check: the folder checked)",
    )
    p.add_argument("--force", action="store_true", help="replace the figures in the default folder")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small grids and few draws (minutes for every figure; for previews and tests)",
    )
    p.add_argument("--only", default=None, help="comma list of figure names, None: all")
    p.add_argument(
        "--format",
        type=_formats,
        default=None,
        help="comma list of image formats from pdf,png,svg,eps; None: pdf,png "
        "(--from-sidecar: the sidecar's)",
    )
    p.add_argument("--dpi", type=positive_int, default=None, help="PNG resolution, None: 200 (--quick: 100)")
    p.add_argument(
        "--style",
        default=None,
        help="matplotlib style name or file to draw with; 'paper' (the default) is the package's style "
        "sheet, 'none' keeps matplotlib's rcParams",
    )
    p.add_argument("--from-sidecar", default=None, metavar="JSON", help="rebuild the figure of this sidecar")
    p.add_argument(
        "--check",
        action="store_true",
        help="rebuild in a temporary folder and compare with the sidecars in --out (or --from-sidecar)",
    )
    add_executor_args(p)
    add_progress_arg(p)
