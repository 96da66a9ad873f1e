"""What every subcommand shares (variance_lab.cli._common).

One integer rule, output checks, file-system errors as one line, the command line's words,
the long-run estimate, and a parser that builds without loading the heavy modules.
"""

import errno
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from variance_lab.cli import _common as common
from variance_lab.cli import build_parser, main

#: Every integer option of every subcommand, with the arguments it needs to parse.
INTEGER_OPTIONS = [
    (["table"], "--T"),
    (["table"], "--n"),
    (["table"], "--seed"),
    (["table"], "--workers"),
    (["sweep"], "--T"),
    (["sweep"], "--n"),
    (["sweep"], "--seed"),
    (["sweep"], "--workers"),
    (["analyze", "x.jsonl"], "--edges"),
    (["analyze", "x.jsonl"], "--n-boot"),
    (["analyze", "x.jsonl"], "--seed"),
    (["figures"], "--workers"),
    (["experiment", "run"], "--seed"),
    (["experiment", "figure"], "--n-boot"),
    (["experiment", "figure"], "--seed"),
]


def _value(args, option):
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    return [int(v) for v in value] if not isinstance(value, int) else value


@pytest.mark.parametrize(("prefix", "option"), INTEGER_OPTIONS)
def test_every_integer_option_accepts_exact_integers(prefix, option):
    """Every integer option parses 1e1, 10, 10.0 and 1_0 as the integer 10."""
    for text in ("1e1", "10", "10.0", "1_0"):
        value = _value(build_parser().parse_args([*prefix, option, text]), option)
        assert value in (10, [10]), (option, text, value)


@pytest.mark.parametrize(("prefix", "option"), INTEGER_OPTIONS)
def test_every_integer_option_refuses_fractions(prefix, option, capsys):
    """Every integer option refuses 1.5 with one line on stderr naming the option, exit status 2."""
    assert main([*prefix, option, "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'1.5' is not an integer (integers are never rounded)" in err
    assert option in err


@pytest.mark.parametrize(
    ("prefix", "option"), [(p, o) for p, o in INTEGER_OPTIONS if o in ("--T", "--edges")]
)
def test_integer_lists_are_sorted_and_merged(prefix, option):
    """Integer lists come back sorted with equal values merged."""
    assert _value(build_parser().parse_args([*prefix, option, "10,1e1,1,10.0"]), option) == [1, 10]


def test_int_grid_errors_are_cli_errors():
    """int_grid raises CLIError naming the option for a fraction and for a value below 1."""
    with pytest.raises(common.CLIError, match=r"--T: '1.5' is not an integer"):
        common.int_grid("1,1.5", name="--T")
    with pytest.raises(common.CLIError, match=r"--T: values must be integers >= 1, got 0"):
        common.int_grid("0,5", name="--T")


def test_cli_words():
    """cli_words turns API keyword wording (on_bad=, format=, sampler=) into command-line flags."""
    assert common.cli_words("x; pass on_bad='drop' to skip") == "x; pass --on-bad drop to skip"
    assert (
        common.cli_words("pass format= one of ('jsonl', 'parquet', 'npz')")
        == "pass --format, one of jsonl, parquet, npz"
    )
    assert common.cli_words("use sampler='token' or 'auto'") == "use --sampler token or auto"


def test_check_output(tmp_path):
    """check_output accepts a new file and refuses a directory, a missing folder and the input file."""
    assert common.check_output(None) is None
    assert common.check_output(str(tmp_path / "a.md")) == tmp_path / "a.md"
    with pytest.raises(common.CLIError, match="is a directory"):
        common.check_output(str(tmp_path))
    with pytest.raises(common.CLIError, match="does not exist"):
        common.check_output(str(tmp_path / "no" / "a.md"))
    source = tmp_path / "in.jsonl"
    source.write_text("x")
    with pytest.raises(common.CLIError, match="is the input file"):
        common.check_output(str(tmp_path / "." / "in.jsonl"), inputs=(str(source),))


def test_write_file_turns_a_read_only_file_system_into_one_line(tmp_path, monkeypatch):
    """The write fails with EROFS and so does the clean-up: the first error, as one line, nothing left."""

    def refuse(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr("pathlib.Path.unlink", refuse)
    target = tmp_path / "x.md"
    with pytest.raises(common.CLIError) as info:
        common.write_file(target, lambda tmp: refuse(tmp))
    assert str(info.value) == f"--out {str(target)!r}: cannot write it: Read-only file system"
    assert list(tmp_path.iterdir()) == []


def test_os_errors_reach_the_user_as_one_line(capsys, monkeypatch):
    """An OSError while writing reaches stderr as one line with exit status 2."""

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "somewhere")

    monkeypatch.setattr("variance_lab.cli._common.write_output", refuse)  # under output_table
    assert main(["table", "--n", "0", "--T", "1"]) == 2
    assert capsys.readouterr().err == "variance-lab: error: 'somewhere': No space left on device\n"


def test_long_runs_need_yes(capsys):
    """Runs over a minute print an estimate; over an hour they need --yes off a terminal."""
    args = build_parser().parse_args(["table"])
    common.confirm_long_run(10.0, "short", args)  # under a minute: silent
    assert capsys.readouterr().err == ""
    common.confirm_long_run(600.0, "ten minutes", args)  # shown, not asked
    assert (
        capsys.readouterr().err
        == "variance-lab: ten minutes: estimated Monte Carlo time about 10 min (rough)\n"
    )
    with pytest.raises(common.CLIError, match=r"about 2\.0 h \(rough\), more than 60 min; pass --yes"):
        common.confirm_long_run(7200.0, "long", args)  # stdin is not a terminal under pytest
    args = build_parser().parse_args(["table", "--yes"])
    common.confirm_long_run(7200.0, "long", args)
    assert "about 2.0 h" in capsys.readouterr().err


def test_monte_carlo_estimate_follows_the_plan():
    """estimate_run_seconds is n times the longest path's token cost over the workers' rate."""
    from variance_lab import get_family
    from variance_lab.simulate.engine import estimate_run_seconds
    from variance_lab.simulate.plan import TOKEN_COST, WORK_RATE

    fam = get_family("gamma", 1.0, 0.1)
    seconds = estimate_run_seconds(fam, [1, 1000], 10**6, sampler="token", workers=2)
    assert seconds == pytest.approx(10**6 * 1000 * TOKEN_COST[2] / (2 * WORK_RATE))


#: Modules that building the parser (and ``--help``) must not load: each takes a large part of a
#: second, and only running a subcommand needs them.
HEAVY_MODULES = (
    "matplotlib",
    "numba",
    "scipy.optimize",
    "scipy.stats",
    "variance_lab.corrections",
    "variance_lab.experiment.figure",
    "variance_lab.paper.frames",
    "variance_lab.paper.pipeline",
    "variance_lab.rollouts.analysis",
    "variance_lab.rollouts.models",
    "variance_lab.simulate",
    "variance_lab.sweep.run",
    "torch",
    "transformers",
    "variance_lab.lm.runs",
)


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter on this source tree; return its standard output."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_building_the_parser_loads_no_heavy_module():
    """build_parser() reads its choices and names from light modules: no matplotlib, numba, scipy.optimize."""
    out = _fresh_python(
        "import sys\n"
        "from variance_lab.cli import build_parser\n"
        "build_parser().format_help()\n"
        f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


@pytest.mark.parametrize("package", ["variance_lab", "variance_lab.rollouts", "variance_lab.sweep"])
def test_lazy_packages_export_every_name(package):
    """Every name of a lazy package's __all__ imports, is listed by dir(), and unknown names still fail."""
    out = _fresh_python(
        f"import importlib\nmod = importlib.import_module({package!r})\n"
        "missing = [n for n in mod.__all__ if not hasattr(mod, n) or n not in dir(mod)]\n"
        f"exec('from {package} import ' + ', '.join(mod.__all__))\n"
        "print(missing)\n"
    )
    assert out.strip() == "[]"
    mod = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        mod.no_such_name  # noqa: B018


def test_lazy_names_are_the_submodules_objects():
    """A lazily re-exported name is the very object of the module that defines it."""
    import variance_lab
    from variance_lab import rollouts, sweep
    from variance_lab.rollouts import analysis, batch, io
    from variance_lab.sweep import run

    assert variance_lab.theory is importlib.import_module("variance_lab.theory")
    assert rollouts.analyze is analysis.analyze
    assert rollouts.TokenBatch is batch.TokenBatch
    assert rollouts.load_batch is io.load_batch
    assert sweep.sweep is run.sweep
    assert sweep.SweepInterrupted is run.SweepInterrupted


def test_a_note_comes_after_the_output_or_not_at_all(tmp_path, capsys, monkeypatch):
    """A note queued by a command is printed once its output is written; a failure drops it (one line)."""
    from variance_lab.cli import analyze as analyze_cli

    f = tmp_path / "same.jsonl"
    f.write_text(
        "".join(
            json.dumps({"logp": [-0.5, -1.0, -0.2], "old_logp": [-0.6, -0.9, -0.25]}) + "\n" for _ in range(4)
        )
    )
    assert main(["analyze", str(f), "--n-boot", "0"]) == 0
    err = capsys.readouterr().err
    assert "note: " in err
    assert "prompt_id" in err

    def refuse(text, out):
        raise OSError(30, "Read-only file system", "x.md")

    monkeypatch.setattr(analyze_cli, "write_output", refuse)
    assert main(["analyze", str(f), "--n-boot", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("variance-lab: error: 'x.md': Read-only file system")


@pytest.mark.parametrize("command", [["experiment", "run"], ["experiment", "entropy", "x.jsonl.gz"]])
@pytest.mark.parametrize("flag", ["--quiet", "--no-progress"])
def test_quiet_is_one_argument_with_two_spellings(command, flag):
    """add_quiet_arg: --quiet and --no-progress both set ``quiet``; without either it is off."""
    parser = build_parser()
    assert parser.parse_args([*command, flag]).quiet is True
    assert parser.parse_args(command).quiet is False
