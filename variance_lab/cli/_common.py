"""What every subcommand shares: the error type, argument types, family and engine options, output.

Bad input raises :class:`CLIError` (or ``ValueError``); :func:`variance_lab.cli.main` prints it as one
line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from variance_lab._atomic import atomic_write
from variance_lab._memory import reuse_freed_memory  # noqa: F401 (the subcommands import it from here)
from variance_lab._validate import parse_integer
from variance_lab.families import FAMILIES, get_family
from variance_lab.progress import watched
from variance_lab.schema import EXECUTORS, SAMPLER_CHOICES

PROG = "variance-lab"


class CLIError(Exception):
    """Bad command-line input: reported as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, and help shows defaults."""

    def __init__(self, *args, formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):
        raise CLIError(f"{message} (see '{self.prog} --help')")


def add_subcommand(sub, name: str, run, *, help: str, description: str, **options) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` to the subparsers ``sub``, calling ``run(args)``; return its parser.

    ``help`` is its line in the parent's list of subcommands, ``description`` the text atop its own
    ``--help``; ``options`` go to ``add_parser`` as they are (``epilog``). The caller adds its
    arguments to the parser returned.
    """
    p = sub.add_parser(name, help=help, description=description, **options)
    p.set_defaults(func=run)
    return p


#: The Python API's words for an option and the command line's: an error raised by the API
#: names a keyword argument; printed by the command line it names the option.
CLI_WORDS = (
    ("pass on_bad='drop'", "pass --on-bad drop"),
    ("pass format= one of", "pass --format, one of"),
    ("use sampler='token' or 'auto'", "use --sampler token or auto"),
    ("edges must be", "--edges must be"),
    ("n_boot must be", "--n-boot must be"),
    ("level must be", "--level must be"),
    ("pass framework=", "pass --framework"),
    ("batch_size must be", "--batch-size must be"),
    ("threshold must be", "--threshold must be"),
    ("law_from ", "--law-from "),
    ("pass ratio=", "pass --ratio"),
)


def cli_words(text: str) -> str:
    """Return ``text`` in the command line's words.

    The API's keyword arguments are replaced by the command line's options (:data:`CLI_WORDS`)
    and tuples of choices written plainly (``('a', 'b')`` as ``a, b``).
    """
    for api, cli in CLI_WORDS:
        text = text.replace(api, cli)
    return _CHOICES.sub(lambda m: ", ".join(x.strip(" '\"") for x in m.group(1).split(",")), text)


_CHOICES = re.compile(r"\((\s*'[\w.-]+'(?:\s*,\s*'[\w.-]+')+\s*)\)")


def one_line(exc: BaseException) -> str:
    """Return the message of ``exc`` on one line in the command line's words.

    The words are those of :func:`cli_words`; a multi-line message is joined with ``; ``.
    """
    text = str(exc).strip() or type(exc).__name__
    return cli_words("; ".join(part.strip() for part in text.splitlines() if part.strip()))


def os_error_line(exc: OSError) -> str:
    """Format an ``OSError`` as one line: the file, then the system's reason (``Read-only file system``)."""
    reason = exc.strerror or one_line(exc)
    if exc.filename is None:
        return f"cannot write or read a file: {reason}"
    return f"{str(exc.filename)!r}: {reason}"


def int_grid(text: str, *, name: str = "--T", minimum: int | None = 1) -> list[int]:
    """Parse a grid of integers (``1,10,100``, ``1:1000:log20``, ``1e6``) by the one rule of every command.

    :func:`variance_lab.sweep.grid.parse_int_grid`: single values and range ends must be exact
    integers (``1e6`` is accepted, ``1.5`` refused with the reason), duplicates are merged and
    the values sorted. Raises :class:`CLIError` naming the option.
    """
    from variance_lab.sweep import grid

    try:
        return [int(v) for v in grid.parse_int_grid(text, name=name, minimum=minimum)]
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def int_arg(name: str, *, minimum: int | None = None):
    """Return an argparse type for one integer option by the one rule.

    The rule of :func:`variance_lab._validate.parse_integer`: ``1e6`` and ``1000000`` are the
    same, ``1.5`` is refused with the reason.
    """

    def parse(text: str) -> int:
        try:
            return parse_integer(text, name=name, minimum=minimum)
        except ValueError as exc:  # argparse names the option itself
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name}: ")) from None

    parse.__name__ = "integer"
    return parse


def arg_values(args: argparse.Namespace, names) -> dict:
    """Return ``{name: args.<name>}`` for each of ``names``: the options a command passes on as they are."""
    return {name: getattr(args, name) for name in names}


def add_int_arg(p: argparse.ArgumentParser, flag: str, *, minimum: int | None = None, **options) -> None:
    """Add the integer option ``flag`` by the one rule (:func:`int_arg`); ``options`` go to argparse."""
    p.add_argument(flag, type=int_arg(flag, minimum=minimum), **options)


def add_seed_arg(p: argparse.ArgumentParser, help: str, *, default: int | None = 0) -> None:
    """Add ``--seed``: an integer >= 0 by the one integer rule (:func:`int_arg`), with ``help``."""
    add_int_arg(p, "--seed", minimum=0, default=default, help=help)


def add_output_args(
    p: argparse.ArgumentParser,
    formats,
    *,
    option: str = "--format",
    out_help: str = "write to this file instead of standard output",
) -> None:
    """Add a table's output options: ``option`` (one of ``formats``, default markdown) and ``--out``.

    ``option`` is ``--table-format`` where ``--format`` already names the input's format (``analyze``).
    """
    p.add_argument(option, default="markdown", choices=formats, help="output format")
    p.add_argument("--out", default=None, help=out_help)


def float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def check_output(out: str | None, option: str = "--out", *, inputs=()) -> Path | None:
    """Check an output file before any work: not a directory, its folder exists and is writable.

    Called by every command before it computes, so that a bad path costs nothing; the write
    itself can still fail (a full disk, a file system such as ``/proc`` that refuses files),
    and then :func:`write_file` turns the error into one line. An output that is one of
    ``inputs`` (the same file under any name) is refused: inputs are never written.
    """
    if out is None:
        return None
    path = Path(out)
    for source in inputs:
        if path.exists() and Path(source).exists() and path.resolve() == Path(source).resolve():
            raise CLIError(
                f"{option} {out!r} is the input file: choose another name (inputs are never written)"
            )
    if path.is_dir():
        raise CLIError(f"{option} {out!r} is a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise CLIError(f"{option} {out!r}: folder {str(folder)!r} does not exist")
    if path.exists() and not path.is_file():
        return path  # a device such as /dev/null is written in place (atomic_write)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CLIError(f"{option} {out!r}: folder {str(folder)!r} is not writable")
    return path


def write_file(out: str | os.PathLike, write, option: str = "--out") -> Path:
    """Write with :func:`~variance_lab._atomic.atomic_write`, an ``OSError`` as one line.

    The line names ``option`` and the file (nothing is left behind: the temporary file is
    removed).
    """
    check_output(str(out), option)
    try:
        return atomic_write(out, write)
    except OSError as exc:
        raise CLIError(f"{option} {str(out)!r}: cannot write it: {exc.strerror or one_line(exc)}") from None


def say_wrote(what: str, path: str | None) -> None:
    """Say on standard error that ``what`` was written to ``path``; nothing when ``path`` is None."""
    if path is not None:
        print(f"{PROG}: wrote {what} to {path}", file=sys.stderr)


#: Notes of the running command (:func:`note`): printed once its output is written, dropped when it fails.
_NOTES: list[str] = []


def note(text: str) -> None:
    """Queue a note for standard error: printed by :func:`flush_notes` once the output is written.

    A command that fails after a note was queued prints its one-line error alone:
    :func:`variance_lab.cli.main` drops the queued notes (:func:`drop_notes`) and flushes them
    only when the command succeeds.
    """
    _NOTES.append(text)


def flush_notes() -> None:
    """Print the queued notes on standard error, ``note: TEXT`` each, and forget them."""
    for text in _NOTES:
        print(f"note: {text}", file=sys.stderr)
    _NOTES.clear()


def drop_notes() -> None:
    """Forget the queued notes (the command failed: its error is the one line on standard error)."""
    _NOTES.clear()


def write_output(text: str, out: str | None) -> None:
    """Print ``text``, or write it to ``out`` atomically.

    An existing file is only replaced once the new text is complete.
    """
    if out is None:
        sys.stdout.write(text)
        return
    write_file(out, lambda tmp: tmp.write_text(text))


def output_table(text: str, out: str | None, warnings=()) -> int:
    """Write a command's table (:func:`write_output`), then each warning, then where it went; return 0.

    Each of ``warnings`` (about what the table holds) is a line ``variance-lab: WARNING`` on
    standard error, after the table is written and before :func:`say_wrote` names its file.
    """
    write_output(text, out)
    for line in warnings:
        print(f"{PROG}: {line}", file=sys.stderr)
    say_wrote("the table", out)
    return 0


def add_family_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--family",
        default="lognormal",
        help=f"ratio family: {', '.join(FAMILIES)} (default: %(default)s)",
    )
    p.add_argument(
        "--mu",
        type=float_arg,
        default=None,
        help="mean of the ratio r; 1 if unset (lognormal-mixture: derived)",
    )
    p.add_argument(
        "--sigma2",
        type=float_arg,
        default=None,
        help="variance of the ratio r; 0.1 if unset (lognormal-mixture: derived)",
    )
    p.add_argument(
        "--q", type=float_arg, default=None, help="two-point only: P(r = lower value); 0.5 if unset"
    )
    p.add_argument(
        "--rho", type=float_arg, default=None, help="ar1 only: lag-one correlation of log r; 0 if unset"
    )
    p.add_argument(
        "--alpha",
        type=float_arg,
        default=None,
        help="random-scale only: gamma shape of the per-sequence log-ratio variance (small: strong "
        "heterogeneity); 1 if unset",
    )
    p.add_argument(
        "--components",
        default=None,
        metavar="W:M:V,...",
        help="lognormal-mixture only (required): components of log r, weight:mean:variance, weights "
        "summing to 1, e.g. 0.98:0:1e-8,0.02:-0.005:0.01; mu and sigma2 are derived",
    )


#: Extra family options of add_family_args, by family parameter name.
FAMILY_OPTIONS = ("q", "rho", "alpha", "components")


def family_from_args(args: argparse.Namespace):
    """Return the family named by ``--family --mu --sigma2``.

    Where given, ``--q --rho --alpha --components`` too.
    """
    extra = {k: getattr(args, k) for k in FAMILY_OPTIONS if getattr(args, k, None) is not None}
    name = args.family
    if name in FAMILIES and FAMILIES[name].derived_moments:
        if "components" not in extra:
            raise CLIError(f"--family {name} needs --components W:M:V,... (weight:mean:variance of log r)")
        given = [f"--{k}" for k in ("mu", "sigma2") if getattr(args, k, None) is not None]
        if given:
            raise CLIError(
                f"--family {name} derives mu and sigma2 from --components: drop {' and '.join(given)}"
            )
        return get_family(name, **extra)
    mu = 1.0 if args.mu is None else args.mu
    sigma2 = 0.1 if args.sigma2 is None else args.sigma2
    return get_family(name, mu, sigma2, **extra)


def family_extras(family) -> list[tuple[str, object]]:
    """Return the family's parameters besides mu and sigma2, as (name, value) pairs, for titles."""
    return [(k, v) for k, v in family.describe().items() if k not in ("family", "mu", "sigma2")]


GRID_EPILOG = (
    "Grid syntax (--mu, --sigma2, --T, --n): a comma list of numbers and ranges; a:b:N is N points "
    "spaced linearly from a to b, a:b:logN is N points spaced evenly in log from a to b (ends "
    "included). Values are sorted and deduplicated. --T and --n take integers: 1e6 is accepted, 1.5 is "
    "refused (never rounded); only the points inside a range are rounded to integers. "
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
    """Parse ``NAME=GRID`` for an extra family parameter (``rho=0:0.9:4``).

    Text parameters take a ``;``-separated list
    (``components=0.98:0:1e-8,0.02:-0.005:0.01;0.9:0:1e-8,0.1:0:1e-3``).
    """
    from variance_lab.sweep import grid

    name, sep, values = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=GRID, got {text!r}")
    if any(name.strip() in cls.text_parameters for cls in FAMILIES.values()):
        items = [v.strip() for v in values.split(";") if v.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"--param {name.strip()}: no value in {text!r}")
        return name.strip(), items
    try:
        return name.strip(), grid.parse_grid(values, name=f"--param {name.strip()}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """``--workers``: an integer >= 1 by the one integer rule."""
    return int_arg("--workers", minimum=1)(text)


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


def add_sampler_arg(p: argparse.ArgumentParser) -> None:
    """``--sampler``: token-level draws, or exact aggregate draws of log P_T at the grid points."""
    p.add_argument(
        "--sampler",
        choices=SAMPLER_CHOICES,
        default="token",
        help="Monte Carlo sampling: every token (the reference, all families); log P_T drawn at the T "
        "grid points from its exact law (aggregate: every family but gamma; one or two draws per "
        "grid point instead of max(T) per path: the same law, other draws); auto: aggregate where "
        "exact, token for gamma",
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Add the options :func:`engine_from_args` reads: ``--sampler``, then :func:`add_executor_args`'s."""
    add_sampler_arg(p)
    add_executor_args(p)


def engine_from_args(args: argparse.Namespace):
    """Return the :class:`~variance_lab.simulate.Engine` of ``--executor/--scheduler/--workers/--sampler``.

    Options a subcommand does not have take the engine's defaults. Raises ``ValueError``
    (exit status 2) for a contradictory choice, or a Dask executor without Dask.
    """
    from variance_lab.simulate import Engine  # loads numba: only when Monte Carlo runs

    return Engine(
        getattr(args, "executor", None),
        scheduler=getattr(args, "scheduler", None),
        workers=getattr(args, "workers", None),
        sampler=getattr(args, "sampler", "token"),
    )


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bar (none either when standard error is not a terminal)."""
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on standard error (there is none either when standard error is not a "
        "terminal: a log file or a pipe)",
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw a progress bar: not with ``--no-progress``, and only where someone watches.

    Someone watches standard error when it is a terminal (:func:`variance_lab.progress.watched`).
    """
    if getattr(args, "no_progress", False):
        return False
    return watched()


#: Estimated Monte Carlo time above which a run needs ``--yes`` (or a "y" on a terminal).
LONG_RUN_S = 3600.0
#: Estimated time from which the estimate is printed before the run starts.
SHOW_ESTIMATE_S = 60.0


#: Help of ``--yes``.
YES_HELP = (
    "start a Monte Carlo run estimated to take more than an hour without asking (without it "
    "such a run asks on a terminal and is refused elsewhere)"
)


def add_long_run_args(p: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` and ``--yes`` (start a run longer than :data:`LONG_RUN_S` without asking)."""
    add_progress_arg(p)
    p.add_argument("--yes", action="store_true", help=YES_HELP)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def confirm_long_run(seconds: float, what: str, args: argparse.Namespace) -> None:
    """Print the estimate of a long run on stderr.

    Above :data:`LONG_RUN_S` go on only with ``--yes`` or a "y" typed on a terminal, else raise
    :class:`CLIError` (nothing is started).
    """
    if seconds < SHOW_ESTIMATE_S:
        return
    estimate = f"{what}: estimated Monte Carlo time about {_duration(seconds)} (rough)"
    if seconds <= LONG_RUN_S or getattr(args, "yes", False):
        print(f"{PROG}: {estimate}", file=sys.stderr)
        return
    if sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty():
        print(f"{PROG}: {estimate}; start it? [y/N] ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() in ("y", "yes"):
            return
        raise CLIError("not started (answered no); pass --yes to start it without asking")
    raise CLIError(
        f"not started: {estimate}, more than {_duration(LONG_RUN_S)}; pass --yes to start it, "
        "or use fewer draws or shorter sequences"
    )


def report_list(title: str, items: list[str], limit: int = 10) -> None:
    print(f"{PROG}: {title}: {len(items)}", file=sys.stderr)
    for item in items[:limit]:
        print(f"  {item}", file=sys.stderr)
    if len(items) > limit:
        print(f"  ... and {len(items) - limit} more", file=sys.stderr)


def load_rollouts(
    file: str,
    *,
    format: str | None = None,
    on_bad: str = "raise",
    preset: str | None = None,
    streamed: bool = False,
):
    """Load the token batch of a rollout file; a missing or unreadable file is a one-line :class:`CLIError`.

    So is a missing optional reader (pyarrow, torch): the line names what to install.

    ``preset`` names a framework's dump format (:data:`variance_lab.rollouts.io.PRESET_NAMES`);
    ``streamed``: open it as a source instead (:func:`variance_lab.rollouts.source.open_rollouts`: a
    Parquet file read in pieces, never whole).
    """
    import zipfile

    from variance_lab.rollouts.io import load_batch
    from variance_lab.rollouts.source import open_rollouts

    path = Path(file)
    if not path.is_file():
        raise CLIError(f"{file}: no such file")
    errors: tuple[type[BaseException], ...] = (OSError, zipfile.BadZipFile, EOFError)
    try:
        import pyarrow as pa

        errors += (pa.ArrowException,)
    except ImportError:  # pragma: no cover - pyarrow is in the dev extra
        pass
    try:
        load = open_rollouts if streamed else load_batch
        return load(path, format=format, on_bad=on_bad, preset=preset)
    except ImportError as exc:  # pyarrow for Parquet, torch for slime's .pt: the message names the install
        raise CLIError(f"{file}: {str(exc).splitlines()[0]}") from None
    except errors as exc:
        raise CLIError(
            f"{file}: cannot read it as {format or 'its extension says'}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def add_quiet_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--quiet`` (alias ``--no-progress``): no progress lines on standard error."""
    p.add_argument(
        "--quiet", "--no-progress", action="store_true", help="no progress lines on standard error"
    )


def add_ratio_arg(parser, what: str) -> None:
    """Add ``--ratio`` (update, mismatch, total; unset: as ``rollouts.split.choose_ratio`` picks)."""
    parser.add_argument(
        "--ratio",
        default=None,
        choices=("update", "mismatch", "total"),
        help=f"{what}: update pi_theta/pi_old (logp - old_logp), mismatch pi_old/mu_rollout or total "
        "pi_theta/mu_rollout (both need rollout_logp). Default: update, or mismatch where the file carries "
        "no update ratio (logp equals old_logp at every token, as in the captures and the frameworks' "
        "dumps), with a note saying so",
    )
