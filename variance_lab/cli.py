"""The ``variance-lab`` command line: parse, call one function, format, exit.

Bad input prints one line on stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from variance_lab import __version__, theory
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
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    if args.n != 0:
        raise CLIError("--n: Monte Carlo columns are not available in this version; use --n 0")
    frame = theory.summary(family, T, target=args.target)
    title = (
        f"Variance of P_T and G_T: {family.name}, mu = {family.mu:g}, sigma^2 = {family.sigma2:g}; "
        f"exact theory (variance_lab {__version__})"
    )
    text = table_report.render(
        frame, args.format, title=title, notes=table_report.errata(frame, family.mu, family.sigma2)
    )
    write_output(text, args.out)
    return 0


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
        "--n", type=int, default=0, help="Monte Carlo draws; 0 = theory only (the only value in this version)"
    )
    p.add_argument(
        "--target", type=_float, default=0.1, help="target relative error for the draws-needed columns"
    )
    p.add_argument("--format", default="markdown", choices=table_report.FORMATS, help="output format")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.set_defaults(func=_cmd_table)
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
