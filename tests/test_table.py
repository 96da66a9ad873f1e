"""The comparison table: formats, column names, errata, and the command line around it."""

import csv
import io
import json
import math
import subprocess
import sys

import pytest

from variance_lab import theory
from variance_lab.cli import main
from variance_lab.families import get_family
from variance_lab.report.table import SEED_PRINTED, errata, format_number, render

SPEC_COLUMNS = [
    "T",
    "var_P",
    "log10_var_P",
    "var_G",
    "log10_var_G",
    "var_G_lognormal",
    "var_G_delta",
    "var_G_seed",
    "mean_G",
    "bias_G",
    "mse_G",
    "ratio",
    "ess_frac_P",
    "n_needed_P",
    "n_needed_G",
]


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_default_markdown_table(capsys):
    rc, out, err = run_cli(capsys, "table")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    rows = [ln for ln in lines if ln.startswith("| 1") and ln.count("|") > 10]
    assert [r.split("|")[1].strip() for r in rows[:4]] == ["1", "10", "100", "1000"]
    assert "| 1000 | 2.470e+41 | 8.666e-05 |" in out
    assert "Errata against the seed's printed table" in out
    assert "| 10 | 1.59 | 1.594 | -0.2 % | 0.01 | 0.008789 | +13.8 % | 159 | 181.3 | -12.3 % |" in out


def test_csv_columns_and_values(capsys):
    rc, out, _ = run_cli(capsys, "table", "--format", "csv", "--T", "1,10,1000000")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0])[: len(SPEC_COLUMNS)] == SPEC_COLUMNS
    fam = get_family("lognormal", 1.0, 0.1)
    assert float(rows[1]["var_P"]) == theory.var_P(fam, 10)  # written with 17 digits: exact round trip
    assert float(rows[2]["var_P"]) == math.inf
    assert float(rows[2]["log10_var_P"]) == pytest.approx(1e6 * math.log10(1.1), rel=1e-12)


def test_json_columns_and_overflow_is_null(capsys):
    rc, out, _ = run_cli(capsys, "table", "--format", "json", "--T", "10,1000000", "--family", "gamma")
    assert rc == 0
    rows = json.loads(out)
    assert list(rows[0])[: len(SPEC_COLUMNS)] == SPEC_COLUMNS
    assert rows[1]["var_P"] is None and rows[1]["log10_var_P"] == pytest.approx(41392.685158, rel=1e-9)
    assert rows[0]["var_G"] == pytest.approx(theory.var_G(get_family("gamma", 1, 0.1), 10), rel=1e-15)


def test_latex(capsys):
    rc, out, _ = run_cli(capsys, "table", "--format", "latex")
    assert rc == 0
    assert out.startswith(r"\begin{tabular}") and out.rstrip().endswith(r"\end{tabular}")
    assert r"Var(P\_T)" in out


def test_out_file_written_and_kept_on_error(tmp_path, capsys):
    target = tmp_path / "table.md"
    assert run_cli(capsys, "table", "--out", str(target))[0] == 0
    first = target.read_text()
    assert "Errata" in first
    rc, out, err = run_cli(capsys, "table", "--out", str(target), "--mu", "-1")
    assert rc == 2 and target.read_text() == first  # nothing already written is lost
    assert not [p for p in tmp_path.iterdir() if p.name != "table.md"]  # no temp files left


def test_errata_only_for_seed_parameters():
    fam = get_family("lognormal", 1.0, 0.2)
    assert errata(theory.summary(fam, [10]), 1.0, 0.2) == ""
    assert errata(theory.summary(get_family("lognormal", 1, 0.1), [7]), 1.0, 0.1) == ""
    assert set(SEED_PRINTED) == {1, 10, 100, 1000}


@pytest.mark.parametrize(
    "value,log10,text",
    [
        (0.1, -1.0, "0.1"),
        (13779.6, 4.14, "1.378e+04"),
        (math.inf, 41392.685158, "4.843e+41392"),
        (0.0, -41.39, "4.074e-42"),
        (math.inf, 2.99999999999, "1.000e+03"),
        (math.nan, None, "n/a"),
        (True, None, "yes"),
    ],
)
def test_format_number(value, log10, text):
    assert format_number(value, log10) == text


def test_render_rejects_unknown_format():
    with pytest.raises(ValueError, match="unknown table format 'html'"):
        render(theory.summary(get_family("lognormal", 1, 0.1), [1]), "html")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["table", "--mu", "0"], "mu must be > 0, got 0.0"),
        (["table", "--mu", "nan"], "mu must be finite, got nan"),
        (["table", "--sigma2", "-1"], "sigma2 must be >= 0, got -1.0"),
        (["table", "--T", "0,10"], "T must be integers >= 1, got 0"),
        (["table", "--T", "1,x"], "expected integers separated by commas, got 'x'"),
        (["table", "--family", "cauchy"], "unknown family 'cauchy'"),
        (["table", "--family", "two-point", "--sigma2", "1"], "two-point family cannot reach sigma2=1.0"),
        (["table", "--format", "html"], "invalid choice: 'html'"),
        (["table", "--family", "gamma", "--rho", "0.5"], "family 'gamma' has no parameter 'rho'"),
        (["table", "--family", "ar1", "--rho", "1"], "ar1 rho must lie in (-1, 1), got 1.0"),
        (["table", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_cli_bad_input_one_line_exit_2(capsys, argv, needle):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and err.startswith("variance-lab: error: ")


def test_console_script_subprocess_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "variance_lab.cli", "table", "--mu", "-2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == "variance-lab: error: mu must be > 0, got -2.0\n"
    assert "Traceback" not in proc.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("variance-lab ")
