"""``variance-lab corrections``: closed form, Monte Carlo, --find-T, data, formats and bad input."""

import io
import itertools
import json
from pathlib import Path

import mpmath as mp
import numpy as np
import pandas as pd
import pytest

from variance_lab import corrections as co
from variance_lab.cli import main
from variance_lab.families import get_family
from variance_lab.rollouts import TokenBatch, save_batch

COLUMNS = ["T", "correction", "level", "mean_w", "bias", "var_w", "ess_frac", "frac_modified"]


def run_cli(capsys, *argv):
    """Run the command line and return its exit status, stdout and stderr."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_csv_is_the_closed_form(capsys):
    """The default CSV has the schema's columns and the closed-form mean weights."""
    rc, out, err = run_cli(capsys, "corrections", "--T", "10,100", "--format", "csv")
    assert rc == 0
    assert err == ""
    df = pd.read_csv(io.StringIO(out))
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    assert df.shape[0] == 6  # 2 T x the 3 default corrections
    ref = co.theory(get_family("lognormal", 1.0, 0.1), [10, 100], "seq-tis:3,seq-mask:3,icepop:5")
    np.testing.assert_allclose(df.mean_w, ref.mean_w, rtol=1e-15)


def test_find_T_line_and_column(capsys):
    """--find-T prints the length find_T returns, or that a correction never reaches 50 %."""
    rc, out, _ = run_cli(
        capsys,
        "corrections",
        "--mu",
        "1.012",
        "--sigma2",
        "0.01",
        "--find-T",
        "--correction",
        "seq-mask:3,icepop:5",
    )
    assert rc == 0
    T = co.find_T(get_family("lognormal", 1.012, 0.01), "seq-mask:3")
    assert f"- seq-mask:3: 50 % of sequences truncated or masked from T = {T:,} on" in out
    assert "- icepop:5: never reaches 50 %" in out


def test_monte_carlo_json_has_intervals_and_verdicts(capsys):
    """Monte Carlo JSON rows hold the estimate in its interval and a verdict; gamma has no closed form."""
    rc, out, _ = run_cli(
        capsys,
        "corrections",
        "--family",
        "gamma",
        "--n",
        "2000",
        "--T",
        "5,50",
        "--correction",
        "seq-tis:3,tis:2",
        "--format",
        "json",
    )
    assert rc == 0
    rows = json.loads(out)
    assert len(rows) == 4
    for r in rows:
        assert r["mc_mean_w_lo"] <= r["mc_mean_w"] <= r["mc_mean_w_hi"]
        assert isinstance(r["mc_reliable"], bool)
    assert "mean_w" not in rows[0]  # no closed form for gamma


def test_markdown_with_monte_carlo_notes(capsys):
    """The Markdown output shows the interval column and a note for an unreliable cell."""
    rc, out, _ = run_cli(capsys, "corrections", "--n", "2000", "--T", "100", "--correction", "geo-rs:0.9:1.1")
    assert rc == 0
    assert "MC mean_w [95% CI]" in out
    assert "UNRELIABLE" in out
    assert "- T = 100, geo-rs:0.9:1.1: Monte Carlo is UNRELIABLE: effective sample size" in out


def test_data_mismatch_ratio(tmp_path, capsys):
    """--data with --ratio mismatch evaluates a correction per length bucket of the file."""
    rng = np.random.default_rng(2)
    lens = rng.integers(5, 40, size=50)
    old = [-rng.exponential(1.0, size=k) for k in lens]
    roll = [o - rng.normal(0.0, 0.1, size=o.size) for o in old]
    roll = [np.minimum(r, 0.0) for r in roll]
    batch = TokenBatch.from_ragged(old, old, rollout_logp=roll)
    path = save_batch(batch, tmp_path / "b.jsonl")
    rc, out, _ = run_cli(
        capsys,
        "corrections",
        "--data",
        str(path),
        "--ratio",
        "mismatch",
        "--correction",
        "icepop:1.1",
        "--format",
        "csv",
        "--buckets",
        "5,20",
    )
    assert rc == 0
    df = pd.read_csv(io.StringIO(out))
    assert df.T_min.tolist() == [5, 20]
    d = batch.mismatch_log_ratio
    masked = np.abs(d) > np.log(1.1)
    assert df.n_seq.sum() == 50
    assert np.average(df.frac_modified, weights=[lens[lens < 20].sum(), lens[lens >= 20].sum()]) == (
        pytest.approx(masked.mean())
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--correction", "tis:-1"], "bad correction 'tis:-1'"),
        (["--family", "gamma"], "closed forms exist for lognormal ratios only"),
        (["--n", "1"], "--n must be 0"),
        (["--data", "/nonexistent/x.jsonl"], "no such file"),
        (["--threshold", "2"], "expected a number in (0, 1]"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    """Bad arguments give exit status 2, no stdout and one line on stderr with the message."""
    rc, out, err = run_cli(capsys, "corrections", *argv)
    assert rc == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_data_without_rollout_logp_and_ratio_mismatch(tmp_path, capsys):
    """--ratio mismatch on a file without rollout_logp is refused with exit status 2."""
    batch = TokenBatch.from_ragged([np.array([-1.0, -2.0])], [np.array([-1.1, -2.0])])
    path = save_batch(batch, tmp_path / "b.npz")
    rc, _, err = run_cli(capsys, "corrections", "--data", str(path), "--ratio", "mismatch")
    assert rc == 2
    assert "has no rollout_logp" in err


def test_out_file_is_written(tmp_path, capsys):
    """--out writes the table to the file, nothing to stdout, and says where on stderr (as table does)."""
    target = tmp_path / "c.md"
    rc, out, err = run_cli(capsys, "corrections", "--T", "10", "--out", str(target))
    assert rc == 0
    assert out == ""
    assert "seq-mask:3" in target.read_text()
    assert err.strip().endswith(f"wrote the table to {target}")


def test_random_scale_and_mixture_rows_say_quadrature_or_sum(capsys):
    """random-scale and lognormal-mixture need no --n: rows from quadrature or sums, method in the csv."""
    rc, out, _ = run_cli(
        capsys, "corrections", "--family", "random-scale", "--alpha", "2", "--T", "10",
        "--correction", "seq-tis:3,tis:2", "--format", "csv",
    )  # fmt: skip
    assert rc == 0
    df = pd.read_csv(io.StringIO(out))
    ref = co.theory(get_family("random-scale", 1.0, 0.1, alpha=2.0), [10], "seq-tis:3,tis:2")
    assert df.method.tolist() == ["quadrature", "quadrature"]
    np.testing.assert_allclose(df.mean_w, ref.mean_w, rtol=1e-12)
    rc, out, _ = run_cli(
        capsys, "corrections", "--family", "lognormal-mixture", "--components", "0.9:0:0.01,0.1:-0.1:0.3",
        "--T", "10", "--correction", "seq-mask:3,icepop:2", "--format", "csv",
    )  # fmt: skip
    assert rc == 0
    assert pd.read_csv(io.StringIO(out)).method.tolist() == ["multinomial sum", "closed form"]


def test_data_buckets_show_interval_and_prediction(tmp_path, capsys):
    """--data: each bucket's modified fraction with its 95 % interval, the fitted lognormal's prediction."""
    rng = np.random.default_rng(4)
    lens = rng.integers(5, 30, size=200)
    old = [-rng.exponential(1.0, size=int(n)) for n in lens]
    new = [np.minimum(o + rng.normal(0.0, 0.1, size=o.size), 0.0) for o in old]
    path = save_batch(TokenBatch.from_ragged(new, old), tmp_path / "b.npz")
    args = ("corrections", "--data", str(path), "--correction", "seq-mask:1.5,tis:1.1", "--buckets", "5,15")
    rc, out, _ = run_cli(capsys, *args, "--format", "csv")
    assert rc == 0
    df = pd.read_csv(io.StringIO(out))
    assert (df.frac_modified_lo <= df.frac_modified).all()
    assert (df.frac_modified <= df.frac_modified_hi).all()
    inside = (df.frac_modified_lo <= df.pred_frac_modified) & (df.pred_frac_modified <= df.frac_modified_hi)
    assert df.pred_inside.tolist() == inside.tolist()
    rc, out, _ = run_cli(capsys, *args)
    assert "prediction inside" in out
    assert "the lognormal fitted to these log-ratios" in out
    rc, out, _ = run_cli(capsys, *args, "--predict", "none", "--format", "csv")
    assert "pred_frac_modified" not in out
    rc, out, _ = run_cli(capsys, *args, "--predict", "mixture", "--format", "csv")
    assert rc == 0
    mix = pd.read_csv(io.StringIO(out))
    assert mix.pred_frac_modified.between(0, 1).all()
    assert not np.allclose(mix.pred_frac_modified, df.pred_frac_modified)  # another model, other numbers


@pytest.mark.parametrize(
    ("family", "extra", "title"),
    [
        ("random-scale", ["--alpha", "0.5"], "alpha = 0.5"),
        ("lognormal-mixture", ["--components", "0.9:0:0.001,0.1:-0.05:0.1"], "components = 0.9:0.0:0.001"),
    ],
)
def test_monte_carlo_for_the_new_families(capsys, family, extra, title):
    """Random-scale and mixture corrections by Monte Carlo: exit 0, the title names their parameters."""
    rc, out, err = run_cli(capsys, "corrections", "--family", family, *extra, "--n", "500", "--T", "5,50")
    assert rc == 0, err
    assert err == ""
    assert title in out.splitlines()[0]
    assert out.count("| 50 |") == 3  # the 3 default corrections at T = 50


def test_find_T_header_names_the_threshold(capsys):
    """The --find-T column's header names the share (30 %); CSV keeps find_T and adds the threshold."""
    argv = ["corrections", "--mu", "1.012", "--sigma2", "0.01", "--find-T", "--threshold", "0.3"]
    rc, out, _ = run_cli(capsys, *argv, "--correction", "seq-mask:3")
    assert rc == 0
    assert "first T with >= 30 % modified" in out
    rc, out, _ = run_cli(capsys, *argv, "--correction", "seq-mask:3", "--format", "csv")
    df = pd.read_csv(io.StringIO(out))
    assert df["find_T_threshold"].eq(0.3).all()
    assert df["find_T"].eq(co.find_T(get_family("lognormal", 1.012, 0.01), "seq-mask:3", 0.3)).all()


# ------------------------------------------------------------------------------- CTPO and M2PO
def _mp_ctpo_frac(el, eh, mu, s2, T):
    """(1/T) sum_t P(L_t outside [-EL sqrt t, EH sqrt t]), L_t ~ N(t m, t v), at 40 digits."""
    with mp.workdps(40):
        v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
        m = mp.log(mu) - v / 2
        total = mp.fsum(
            mp.ncdf(-el * mp.sqrt(t), t * m, mp.sqrt(t * v))
            + 1
            - mp.ncdf(eh * mp.sqrt(t), t * m, mp.sqrt(t * v))
            for t in range(1, T + 1)
        )
        return float(total / T)


def _mp_m2po_frac(tau, mu, s2):
    """P(y^2 > q) for the q with E[y^2 | y^2 <= q] = tau, y = log r ~ N(m, v): mpmath quad and findroot."""
    with mp.workdps(40):
        v = mp.log(1 + mp.mpf(s2) / mp.mpf(mu) ** 2)
        m, sd, tau = mp.log(mu) - v / 2, mp.sqrt(v), mp.mpf(tau)

        def g(s):
            return mp.quad(lambda y: (y * y - tau) * mp.npdf(y, m, sd), [-s, 0, s])

        s = mp.findroot(g, (mp.sqrt(tau) * (1 + mp.mpf(10) ** -30), 40 * sd), solver="anderson")
        return float(1 - (mp.ncdf(s, m, sd) - mp.ncdf(-s, m, sd)))


def test_ctpo_and_m2po_json_are_the_exact_fractions(capsys):
    """JSON frac_modified of ctpo (mean of the normal tails over t) and m2po (large-batch q) to 1e-9."""
    argv = ["corrections", "--family", "lognormal", "--mu", "1.0", "--sigma2", "0.1", "--T", "1,10,100,1000"]
    rc, out, err = run_cli(capsys, *argv, "--correction", "ctpo:0.5:0.3,m2po:0.04", "--format", "json")
    assert rc == 0, err
    rows = json.loads(out)
    m2po = _mp_m2po_frac(0.04, 1.0, 0.1)
    for r in rows:
        ref = _mp_ctpo_frac(0.5, 0.3, 1.0, 0.1, r["T"]) if r["correction"] == "ctpo:0.5:0.3" else m2po
        assert r["frac_modified"] == pytest.approx(ref, rel=1e-9), (r["correction"], r["T"])
        assert r["level"] == "token"
    assert [r["frac_seq_any"] is None for r in rows] == [
        True,
        False,
    ] * 4  # ctpo's crossing has no closed form


def test_ctpo_and_m2po_find_T(capsys):
    """--find-T: where ctpo's clipping binds at a position, and m2po's any-token length."""
    argv = ["corrections", "--find-T", "--correction", "ctpo:0.5:0.5,m2po:0.04", "--T", "10"]
    rc, out, _ = run_cli(capsys, *argv)
    assert rc == 0
    fam = get_family("lognormal", 1.0, 0.1)
    t_ctpo, t_m2po = co.find_T(fam, "ctpo:0.5:0.5"), co.find_T(fam, "m2po:0.04")
    assert f"- ctpo:0.5:0.5: 50 % of the tokens at position T clipped from T = {t_ctpo:,} on" in out
    assert f"- m2po:0.04: 50 % of sequences with a modified token from T = {t_m2po:,} on" in out
    assert (t_ctpo, t_m2po) == (110, 3)


def test_a_spec_without_theory_needs_monte_carlo(capsys):
    """Mixture ratios have no ctpo theory: without --n exit 2 and one line; with --n Monte Carlo only."""
    argv = [
        "corrections",
        "--family",
        "lognormal-mixture",
        "--components",
        "0.9:0:0.01,0.1:-0.05:0.1",
        "--T",
        "10",
    ]
    rc, out, err = run_cli(capsys, *argv, "--correction", "ctpo:0.5:0.5,m2po:0.01")
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "no theory for ctpo:0.5:0.5; pass --n N" in err
    rc, out, err = run_cli(
        capsys, *argv, "--correction", "ctpo:0.5:0.5,m2po:0.01:10", "--n", "200", "--format", "csv"
    )
    assert rc == 0, err
    df = pd.read_csv(io.StringIO(out))
    assert df.method.tolist() == ["Monte Carlo only", "closed form"]
    assert df.mc_frac_modified.notna().all()


def test_ctpo_and_m2po_on_the_shipped_smollm2_data(capsys):
    """--data on SmolLM2's top-p mismatch: ctpo's and m2po's fractions equal a plain loop over the file."""
    from variance_lab.rollouts.io import load_batch

    path = Path(__file__).resolve().parents[2] / "data" / "smollm2" / "smollm2_mismatch_top-p.jsonl.gz"
    argv = [
        "corrections",
        "--data",
        str(path),
        "--ratio",
        "mismatch",
        "--correction",
        "ctpo:0.5:0.5,m2po:0.04",
    ]
    rc, out, err = run_cli(capsys, *argv, "--format", "csv")
    assert rc == 0, err
    df = pd.read_csv(io.StringIO(out)).set_index("correction")
    batch = load_batch(path)
    y, off = batch.mismatch_log_ratio, batch.offsets
    clipped = []
    for a, b in itertools.pairwise(off):
        L = np.cumsum(y[a:b])
        t = np.arange(1, b - a + 1)
        clipped.append(np.abs(L) > 0.5 * np.sqrt(t))
    assert df.loc["ctpo:0.5:0.5", "frac_modified"] == pytest.approx(np.concatenate(clipped).mean(), rel=1e-12)
    masked = np.concatenate(
        [
            co.batch_mask(y[off[s] : off[min(s + 256, len(off) - 1)]], 0.04)
            for s in range(0, len(off) - 1, 256)
        ]
    )
    assert df.loc["m2po:0.04", "frac_modified"] == pytest.approx(masked.mean(), rel=1e-12)
    assert 0.05 < df.loc["m2po:0.04", "frac_modified"] < 0.2  # E[y^2] = 0.073 > 0.04: the mask binds here
    assert df.loc["ctpo:0.5:0.5", "frac_modified"] > 0.5  # a drift of -0.196 per token leaves the band
    rc, out, _ = run_cli(capsys, *argv, "--predict", "mixture")  # a mixture has no ctpo theory: n/a
    assert rc == 0
    ctpo_row = next(line for line in out.splitlines() if "| ctpo:0.5:0.5 |" in line)
    assert ctpo_row.endswith("| n/a | n/a |")
    assert "Rows without a prediction (n/a: no theory in the model): 1." in out


def test_sign_specs_closed_form_json_and_data(capsys):
    """topr/opsm/aspo give rows by sign: the closed form's in JSON, and the SmolLM2 file's advantages."""
    rc, out, _ = run_cli(
        capsys, "corrections", "--T", "10", "--correction", "topr,opsm:0.05,aspo", "--format", "json"
    )
    assert rc == 0
    rows = pd.DataFrame(json.loads(out)["rows"] if isinstance(json.loads(out), dict) else json.loads(out))
    th = co.theory(get_family("lognormal", 1.0, 0.1), [10], "topr,opsm:0.05,aspo")
    assert rows.correction.tolist() == th.correction.tolist()
    assert np.allclose(rows.frac_modified, th.frac_modified, rtol=1e-12, atol=0)
    data = Path(__file__).parents[2] / "data" / "smollm2" / "smollm2_stale_gspo.jsonl.gz"
    rc, out, err = run_cli(
        capsys, "corrections", "--data", str(data), "--correction", "topr", "--format", "csv"
    )
    assert rc == 0, err
    frame = pd.read_csv(io.StringIO(out))
    assert frame.correction.tolist() == ["topr", "topr [A>=0]", "topr [A<0]"]
    assert frame.n_seq.tolist() == [1024, 820, 204]
    rc, out, err = run_cli(
        capsys, "corrections", "--data", str(data), "--correction", "aspo", "--format", "csv"
    )
    assert rc == 0, err
    frame = pd.read_csv(io.StringIO(out))
    assert frame.correction.tolist() == ["aspo", "aspo [A>=0]", "aspo [A<0]"]
    assert frame.level.tolist() == ["token"] * 3
    assert frame.n_seq.tolist() == [1024, 820, 204]


def test_sign_specs_need_a_jsonl_file(tmp_path, capsys):
    """A file without the advantages (NPZ) is one line on stderr, exit 2; so is a JSONL file without them."""
    path = save_batch(
        TokenBatch.from_ragged([np.array([-1.0, -2.0])], [np.array([-1.1, -2.0])]), tmp_path / "r.npz"
    )
    rc, _, err = run_cli(capsys, "corrections", "--data", str(path), "--correction", "opsm:0.1")
    assert rc == 2
    assert "advantage" in err
    assert len(err.strip().splitlines()) == 1
    path = save_batch(
        TokenBatch.from_ragged([np.array([-1.0, -2.0])], [np.array([-1.1, -2.0])]), tmp_path / "r.jsonl"
    )
    rc, _, err = run_cli(capsys, "corrections", "--data", str(path), "--correction", "topr")
    assert rc == 2
    assert "'advantage' is missing" in err
    assert len(err.strip().splitlines()) == 1


def test_probability_aware_specs_json_keep_the_columns(capsys):
    """dppo-tv, dppo-kl, kpop: JSON rows with every other spec's columns, frac_modified the quadrature's."""
    argv = [
        "corrections",
        "--T",
        "1,50",
        "--correction",
        "icepop,dppo-tv,dppo-kl:0.02,kpop",
        "--format",
        "json",
    ]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    rows = json.loads(out)
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(rows[0]))}  # one set of columns
    th = co.theory(get_family("lognormal", 1.0, 0.1), [1, 50], "icepop,dppo-tv,dppo-kl:0.02,kpop")
    assert [r["correction"] for r in rows] == th.correction.tolist()
    np.testing.assert_allclose([r["frac_modified"] for r in rows], th.frac_modified, rtol=1e-15)
    law = "0.5:0.5"
    rc, out, _ = run_cli(capsys, *argv[:-2], "--token-prob", law, "--format", "json")
    th = co.theory(
        get_family("lognormal", 1.0, 0.1), [1, 50], argv[4], token_prob=co.TokenProbability(0.5, 0.5)
    )
    np.testing.assert_allclose([r["frac_modified"] for r in json.loads(out)], th.frac_modified, rtol=1e-15)


def test_probability_aware_find_T_and_monte_carlo(capsys):
    """--find-T answers for kpop; --n adds Monte Carlo to DPPO's three rows; the note names the law."""
    rc, out, err = run_cli(
        capsys, "corrections", "--find-T", "--correction", "kpop", "--T", "10", "--token-prob", "0.3"
    )
    assert rc == 0, err
    t = co.find_T(get_family("lognormal", 1.0, 0.1), "kpop", token_prob=co.TokenProbability.fixed(0.3))
    assert f"- kpop: 50 % of sequences with a modified token from T = {t:,} on" in out
    assert "the sampler's probability of each token: q = 0.3" in out
    argv = ["corrections", "--correction", "dppo-tv:0.05", "--T", "5", "--n", "200", "--format", "json"]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["correction"] for r in rows] == ["dppo-tv:0.05", "dppo-tv:0.05 [A>0]", "dppo-tv:0.05 [A<=0]"]
    assert all(r["mc_frac_modified_lo"] <= r["mc_frac_modified"] <= r["mc_frac_modified_hi"] for r in rows)


SMOLLM2 = Path(__file__).parents[2] / "data" / "smollm2" / "smollm2_mismatch_bf16.jsonl.gz"


def test_probability_aware_specs_on_the_shipped_smollm2_data(capsys):
    """--data: the sampler's log-probs feed the masks; rows by sign for DPPO, evaluate()'s numbers."""
    argv = [
        "corrections",
        "--data",
        str(SMOLLM2),
        "--ratio",
        "total",
        "--correction",
        "dppo-tv:0.05,kpop:0.01",
    ]
    rc, out, err = run_cli(capsys, *argv, "--format", "json")
    assert rc == 0, err
    rows = pd.DataFrame(json.loads(out))
    assert rows.correction.tolist() == [
        "dppo-tv:0.05",
        "dppo-tv:0.05 [A>0]",
        "dppo-tv:0.05 [A<=0]",
        "kpop:0.01",
    ]
    from variance_lab.rollouts import load_batch

    batch = load_batch(SMOLLM2)
    log_mu, log_r = batch.rollout_logp, batch.logp - batch.rollout_logp
    adv = np.array([json.loads(line)["advantage"] for line in __import__("gzip").open(SMOLLM2, "rt")])
    _, masked = co.apply_prob(co.parse("kpop:0.01"), log_r, log_mu)
    assert rows.set_index("correction").frac_modified["kpop:0.01"] == pytest.approx(masked.mean(), rel=1e-12)
    d = np.exp(batch.logp) - np.exp(log_mu)
    dppo = np.where(np.repeat(adv, batch.lengths) > 0, d > 0.05, d < -0.05)
    assert rows.set_index("correction").frac_modified["dppo-tv:0.05"] == pytest.approx(dppo.mean(), rel=1e-12)
    assert (rows.n_seq.tolist()[:3]) == [1024, int((adv > 0).sum()), int((adv <= 0).sum())]
    assert rows.pred_frac_modified.notna().all()


@pytest.mark.parametrize("by", ["p", "entropy"])
def test_data_by_p_and_entropy(capsys, by):
    """--by p / --by entropy: mask_by_bins' rows, in its columns, on the shipped SmolLM2 file."""
    argv = ["corrections", "--data", str(SMOLLM2), "--ratio", "total", "--correction", "kpop:0.01,icepop:1.2"]
    rc, out, err = run_cli(capsys, *argv, "--by", by, "--format", "json")
    assert rc == 0, err
    rows = pd.DataFrame(json.loads(out))
    assert list(rows.columns) == list(co.BIN_COLUMNS)
    assert (rows.by == by).all()
    assert rows.groupby("correction").n_tokens.sum().tolist() == [23331, 23331]
    rc, out, err = run_cli(capsys, *argv, "--by", by)
    assert rc == 0, err
    assert f"Masked fractions by {by}" in out
    assert "prediction inside" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--token-prob", "0:1"], "a must be > 0"),
        (["--token-prob", "1.5"], "(0, 1)"),
        (["--token-prob", "x"], "not a number"),
        (["--by", "p"], "--by needs --data"),
        (["--correction", "dppo-tv:2"], "the threshold DELTA must be in (0, 1)"),
        (["--family", "gamma", "--correction", "kpop"], "closed forms exist for lognormal ratios only"),
    ],
)
def test_probability_aware_bad_input_is_one_line(capsys, argv, message):
    """Bad --token-prob, --by without --data and bad thresholds: exit 2, one line."""
    rc, out, err = run_cli(capsys, "corrections", *argv)
    assert rc == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_find_T_of_sign_specs_is_on_their_overall_row(capsys):
    """--find-T with sign specs: the overall row carries find_T (the signs mixed), its sign rows none.

    It raised a KeyError on the sign rows' labels before.
    """
    rc, out, err = run_cli(
        capsys, "corrections", "--T", "10", "--correction", "aspo,opsm:0.02", "--find-T", "--format", "json"
    )
    assert rc == 0, err
    doc = json.loads(out)
    rows = pd.DataFrame(doc["rows"] if isinstance(doc, dict) else doc).set_index("correction")
    fam = get_family("lognormal", 1.0, 0.1)
    assert rows.loc["aspo", "find_T"] == co.find_T(fam, "aspo", 0.5) == 3
    assert rows.loc["opsm:0.02", "find_T"] == co.find_T(fam, "opsm:0.02", 0.5)
    assert rows.loc[["aspo [A>=0]", "aspo [A<0]", "opsm:0.02 [A<0]"], "find_T"].isna().all()


def _vcpo_reference(path, ratio):
    """VCPO's numbers from the API on a rollout file: ESS ratio, both factors, baseline gain."""
    from variance_lab.corrections import vcpo
    from variance_lab.ratios import segment_sums
    from variance_lab.rollouts.io import load_batch
    from variance_lab.rollouts.split import ratio_batch

    batch = load_batch(path)
    log_w = segment_sums(ratio_batch(batch, ratio).log_ratio, batch.offsets)
    rewards = np.array([json.loads(line)["reward"] for line in __import__("gzip").open(path, "rt")])
    ess = vcpo.ess_ratio(log_w)
    return (
        ess,
        vcpo.lr_scale(ess),
        vcpo.lr_scale(ess, rule="linear"),
        vcpo.baseline_gain(rewards, log_w, batch.group_index()),
    )


@pytest.mark.parametrize("ratio", ["update", "mismatch"])
def test_vcpo_on_the_shipped_smollm2_data(capsys, ratio):
    """--vcpo's JSON row is the API's ESS ratio, factors and baseline gain; the others' columns are kept."""
    argv = ["corrections", "--data", str(SMOLLM2), "--correction", "seq-tis:3", "--ratio", ratio]
    rc, plain, _ = run_cli(capsys, *argv, "--format", "json")
    rc2, out, err = run_cli(capsys, *argv, "--format", "json", "--vcpo")
    assert (rc, rc2, err) == (0, 0, "")
    rows = json.loads(out)
    assert rows[:-1] == json.loads(plain)
    row = rows[-1]
    ess, sqrt, linear, gain = _vcpo_reference(SMOLLM2, ratio)
    assert (row["correction"], row["ratio"], row["n_seq"]) == ("vcpo", ratio, 1024)
    np.testing.assert_allclose(
        [row["ess_ratio"], row["lr_scale_sqrt"], row["lr_scale_linear"], row["baseline_gain"]],
        [ess, sqrt, linear, gain],
        rtol=1e-12,
    )
    assert row["lr_scale_linear"] < row["lr_scale_sqrt"] < 1  # the two rules differ below ESS 1
    rc, text, _ = run_cli(capsys, *argv, "--vcpo")
    assert f"ESS ratio (sum w)^2 / (N sum w^2) = {ess:.4g};" in text
    assert f"min(1, ESS)^(1/2) = {sqrt:.4g}" in text
    assert f"= {gain:.4g}." in text


def test_vcpo_matches_the_ess_step_table(capsys):
    """On smollm2_onpolicy_gspo the text prints docs/guide/ess_step.md's digits: 0.9868, 0.9934, 1.042."""
    path = SMOLLM2.with_name("smollm2_onpolicy_gspo.jsonl.gz")
    rc, out, _ = run_cli(capsys, "corrections", "--data", str(path), "--correction", "seq-tis:3", "--vcpo")
    assert rc == 0
    assert "(sum w)^2 / (N sum w^2) = 0.9868;" in out
    assert "min(1, ESS)^(1/2) = 0.9934" in out
    assert "over the group mean (||g||^2 = 1) = 1.042." in out


def test_vcpo_without_rewards_or_prompts_says_so(tmp_path, capsys):
    """A file without prompt_id gets no baseline gain, and the row and the note say why."""
    path = tmp_path / "r.jsonl"
    recs = [{"id": i, "logp": [-0.1 * i, -0.2], "old_logp": [-0.1, -0.25]} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    argv = ["corrections", "--data", str(path), "--correction", "seq-tis:3", "--vcpo", "--predict", "none"]
    rc, out, _ = run_cli(capsys, *argv, "--format", "json")
    assert rc == 0
    row = json.loads(out)[-1]
    assert row["baseline_gain"] is None
    assert "prompt_id" in row["baseline_gain_note"]
    rc, out, _ = run_cli(capsys, *argv)
    assert "= none: the file has no prompt_id" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--vcpo"], "--vcpo needs --data FILE"),
        (["--vcpo", "--data", str(SMOLLM2), "--format", "csv"], "--vcpo prints in --format markdown or json"),
    ],
)
def test_vcpo_bad_use_is_one_line(capsys, extra, message):
    """--vcpo without --data, or with csv, is one line on stderr and exit 2."""
    rc, out, err = run_cli(capsys, "corrections", *extra)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1
    assert message in err
    assert "Traceback" not in err


TOP_P = SMOLLM2.parent / "smollm2_mismatch_top-p.jsonl.gz"


def test_cppo_monte_carlo_only_and_on_data(capsys):
    """Monte Carlo rows of cppo by sign, no theory; on the top-p file the rule's own count, no prediction."""
    argv = [
        "corrections",
        "--correction",
        "cppo,dppo-tv:0.2",
        "--T",
        "1,20",
        "--n",
        "300",
        "--sigma2",
        "0.5",
        "--format",
        "json",
    ]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    rows = pd.DataFrame(json.loads(out))
    assert (
        rows.correction.tolist()
        == ["cppo", "cppo [A>0]", "cppo [A<=0]", "dppo-tv:0.2", "dppo-tv:0.2 [A>0]", "dppo-tv:0.2 [A<=0]"] * 2
    )
    cppo = rows.correction.str.startswith("cppo")
    assert (rows.method[cppo] == "Monte Carlo only").all()
    assert rows.frac_modified[cppo].isna().all()
    assert rows.frac_modified[~cppo].notna().all()
    assert (rows.mc_frac_modified_lo <= rows.mc_frac_modified).all()
    first = rows[rows["T"] == 1].set_index("correction").mc_frac_modified
    assert first["cppo"] == first["dppo-tv:0.2"]  # token 1: the same draws, the same mask
    rc, out, err = run_cli(capsys, *argv[:2], "cppo", *argv[3:])  # alone: every other spec's columns
    assert rc == 0, err
    alone = pd.DataFrame(json.loads(out))
    assert list(alone.columns) == list(rows.columns)
    assert (alone.method == "Monte Carlo only").all()
    assert alone.frac_modified.isna().all()
    rc, out, err = run_cli(capsys, *argv[:-2])
    assert "cppo: Monte Carlo only" in out
    rc, out, err = run_cli(
        capsys,
        "corrections",
        "--data",
        str(TOP_P),
        "--ratio",
        "total",
        "--correction",
        "cppo",
        "--format",
        "json",
    )
    assert rc == 0, err
    rows = pd.DataFrame(json.loads(out)).set_index("correction")
    from variance_lab.rollouts import load_batch

    batch = load_batch(TOP_P)
    adv = np.array([json.loads(line)["advantage"] for line in __import__("gzip").open(TOP_P, "rt")])
    log_mu = batch.rollout_logp
    _, masked = co.apply_prob(
        co.parse("cppo"), batch.logp - log_mu, log_mu, np.repeat(adv, batch.lengths), offsets=batch.offsets
    )
    assert masked.sum() > 100
    assert rows.frac_modified["cppo"] == pytest.approx(masked.mean(), rel=1e-12)
    assert rows.pred_frac_modified.isna().all()
    rc, out, err = run_cli(
        capsys, "corrections", "--data", str(TOP_P), "--ratio", "total", "--correction", "cppo"
    )
    assert "cppo never masks them" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--correction", "cppo:0.2:1.5"], "the position-weight floor WMIN must lie in (0, 1]"),
        (["--correction", "cppo:0.2:0.8:-1"], "the prefix-budget floor DB must be >= 0"),
        (["--correction", "cppo:0"], "the threshold D of the weighted |pi - mu| must be > 0"),
        (["--correction", "cppo"], "no theory for cppo; pass --n N"),
        (["--correction", "cppo", "--n", "50", "--find-T"], "no closed form"),
    ],
)
def test_cppo_bad_input_is_one_line(capsys, argv, message):
    """Bad cppo parameters, cppo without --n, --find-T with cppo: exit 2, no stdout, one line on stderr."""
    rc, out, err = run_cli(capsys, "corrections", *argv)
    assert rc == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1
