"""What every subcommand shares: the error type, argument types, family and engine options, output.

Bad input raises :class:`CLIError` (or ``ValueError``); :func:`variance_lab.cli.main` prints it as one
line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from variance_lab._atomic import atomic_write
from variance_lab.families import FAMILIES, get_family

PROG = "variance-lab"


class CLIError(Exception):
    """Bad command-line input: reported as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str):
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


def float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def write_output(text: str, out: str | None) -> None:
    """Print ``text``, or write it to ``out`` atomically.

    An existing file is only replaced once the new text is complete.
    """
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


def add_family_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--family",
        default="lognormal",
        help=f"ratio family: {', '.join(FAMILIES)} (default: %(default)s)",
    )
    p.add_argument("--mu", type=float_arg, default=1.0, help="mean of the ratio r (default: %(default)s)")
    p.add_argument(
        "--sigma2", type=float_arg, default=0.1, help="variance of the ratio r (default: %(default)s)"
    )
    p.add_argument(
        "--q", type=float_arg, default=None, help="two-point only: P(r = lower value); 0.5 if unset"
    )
    p.add_argument(
        "--rho", type=float_arg, default=None, help="ar1 only: lag-one correlation of log r; 0 if unset"
    )


def family_from_args(args: argparse.Namespace):
    """Return the family named by ``--family --mu --sigma2`` and, where given, ``--q`` / ``--rho``."""
    extra = {k: getattr(args, k) for k in ("q", "rho") if getattr(args, k, None) is not None}
    return get_family(args.family, args.mu, args.sigma2, **extra)


GRID_EPILOG = (
    "Grid syntax (--mu, --sigma2, --T, --n): a comma list of numbers and ranges; a:b:N is N points "
    "spaced linearly from a to b, a:b:logN is N points spaced evenly in log from a to b (ends "
    "included). Values are sorted and deduplicated; --T and --n are rounded to integers. "
    "Examples: --mu 0.9:1.1:5, --sigma2 0.01:1:log7, --T 1:1000:log20, --T 1,10,100,1000."
)


def grid_arg(name: str, *, integer: bool = False, minimum: int | None = None):
    """Return an argparse type parsing a grid (see variance_lab.sweep.grid).

    Errors become one-line usage errors.
    """
    from variance_lab.sweep import grid

    def parse(text: str):
        try:
            if integer:
                return grid.parse_int_grid(text, name=name, minimum=minimum)
            return grid.parse_grid(text, name=name)
        except ValueError as exc:  # argparse names the option itself
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name}: ")) from None

    parse.__name__ = f"{name.lstrip('-')} grid"
    return parse


def family_list(text: str) -> list[str]:
    from variance_lab.sweep import grid

    try:
        return grid.parse_name_list(text, name="--family", choices=list(FAMILIES))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--family: ")) from None


def param_grid(text: str) -> tuple[str, object]:
    """``NAME=GRID`` for an extra family parameter (``rho=0:0.9:4``)."""
    from variance_lab.sweep import grid

    name, sep, values = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=GRID, got {text!r}")
    try:
        return name.strip(), grid.parse_grid(values, name=f"--param {name.strip()}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


#: Executors of the Monte Carlo engine (variance_lab.simulate.EXECUTORS; not imported here, it loads numba).
EXECUTORS = ("threads", "dask", "dask-local")


def add_executor_args(p: argparse.ArgumentParser) -> None:
    """``--workers``, ``--executor`` and ``--scheduler``: where Monte Carlo chunks run."""
    p.add_argument(
        "--workers",
        type=positive_int,
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


def add_sampler_arg(p: argparse.ArgumentParser) -> None:
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


def report_list(title: str, items: list[str], limit: int = 10) -> None:
    print(f"{PROG}: {title}: {len(items)}", file=sys.stderr)
    for item in items[:limit]:
        print(f"  {item}", file=sys.stderr)
    if len(items) > limit:
        print(f"  ... and {len(items) - limit} more", file=sys.stderr)
