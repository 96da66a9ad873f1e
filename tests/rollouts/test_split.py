"""The three-policy split: mismatch pi_old/mu_rollout and update pi_theta/pi_old, in analyze and the CLI."""

import io
import json

import numpy as np
import pytest

from variance_lab.cli import main
from variance_lab.rollouts import TokenBatch, analyze
from variance_lab.rollouts.split import split_ratios


def _batch(seed=0, n=400, s_mis=0.2, s_upd=0.05):
    rng = np.random.default_rng(seed)
    lens = rng.integers(4, 64, size=n)
    old = [-1.0 - rng.exponential(1.0, size=k) for k in lens]
    roll = [o - rng.normal(0.0, s_mis, size=o.size) for o in old]
    new = [o + rng.normal(0.0, s_upd, size=o.size) for o in old]
    return TokenBatch.from_ragged(new, old, rollout_logp=roll)


def test_statistics_match_their_definitions():
    """Each part's pooled statistics equal their definitions computed directly with NumPy."""
    batch = _batch()
    res = split_ratios(batch, [4, 16, 64])
    pooled = res.table[res.table.bucket == -1].set_index("part")
    for part, d in (
        ("mismatch", batch.old_logp - batch.rollout_logp),
        ("update", batch.logp - batch.old_logp),
        ("total", batch.logp - batch.rollout_logp),
    ):
        r = pooled.loc[part]
        rho = np.exp(d)
        assert r.mean_log_r == pytest.approx(d.mean(), rel=1e-12)
        assert r.var_log_r == pytest.approx(d.var(ddof=1), rel=1e-12)
        assert r.chi2_token == pytest.approx(np.mean(rho**2) - 1, rel=1e-10)
        assert r.k3_kl == pytest.approx(np.mean(rho - d - 1), rel=1e-10)
        assert r.ess_token == pytest.approx(rho.mean() ** 2 / np.mean(rho**2), rel=1e-12)
        logP = np.add.reduceat(d, batch.offsets[:-1])
        P = np.exp(logP)
        assert r.var_log_P == pytest.approx(logP.var(ddof=1), rel=1e-10)
        assert r.chi2_seq == pytest.approx(np.mean(P**2) - 1, rel=1e-9)
        assert r.ess_seq == pytest.approx(P.mean() ** 2 / np.mean(P**2), rel=1e-9)
        assert r["frac:icepop:5"] == pytest.approx(np.mean(np.abs(d) > np.log(5)))
        assert r["frac:seq-mask:3"] == pytest.approx(np.mean(P > 3))
        assert r.gspo_clip_frac == pytest.approx(
            np.mean((P ** (1 / batch.lengths) < 1 - 3e-4) | (P ** (1 / batch.lengths) > 1 + 4e-4))
        )
    assert sorted(res.table.bucket.unique().tolist()) == [-1, 0, 1]
    assert res.table[res.table.bucket >= 0].groupby("part").n_seq.sum().tolist() == [400, 400, 400]


@pytest.mark.parametrize(("s_mis", "s_upd", "dominant"), [(0.2, 0.05, "mismatch"), (0.02, 0.1, "update")])
def test_which_part_dominates(s_mis, s_upd, dominant):
    """The part with the larger variance dominates, with shares near the variances' fractions."""
    res = split_ratios(_batch(1, s_mis=s_mis, s_upd=s_upd))
    assert res.dominant == dominant
    # independent parts: shares are their variances over the sum, within sampling noise
    expect = {"mismatch": s_mis**2, "update": s_upd**2}
    tot = sum(expect.values())
    assert res.shares[dominant] == pytest.approx(expect[dominant] / tot, abs=0.02)
    assert res.line.startswith("The " + dominant)


def test_analyze_carries_the_split_and_renders_it():
    """``analyze`` carries the split into its summary, Markdown and JSON."""
    from variance_lab.report.analysis_table import render_analysis

    result = analyze(_batch(2), n_boot=50)
    summary = result.summary()
    assert summary["split"]["dominant"] == "mismatch"
    text = render_analysis(result.table, summary, "markdown")
    assert "Three policies" in text
    assert "The mismatch pi_old/mu_rollout dominates" in text
    doc = json.loads(render_analysis(result.table, summary, "json"))
    assert doc["summary"]["split"]["rows"][0]["part"] == "mismatch"


def test_without_rollout_logp_nothing_changes():
    """Without rollout_logp analyze has no split and split_ratios raises."""
    b = _batch(3)
    plain = TokenBatch.from_flat(b.logp, b.old_logp, b.lengths)
    result = analyze(plain, n_boot=0)
    assert result.split is None
    assert result.summary()["split"] is None
    with pytest.raises(ValueError, match="needs rollout_logp"):
        split_ratios(plain)


def test_cli_analyze_nemo_rl_preset(tmp_path, capsys):
    """``analyze --preset nemo-rl`` reports the dominating mismatch in Markdown and CSV."""
    rng = np.random.default_rng(4)
    lines = []
    for i in range(60):
        k = int(rng.integers(5, 40))
        prev = (-0.5 - rng.exponential(1.0, size=k)).tolist()
        gen = (np.array(prev) - rng.normal(0, 0.1, size=k)).tolist()
        lines.append(
            {
                "idx": i,
                "generation_logprobs": [[0.0, *gen]],
                "prev_logprobs": [[0.0, *prev]],
                "token_loss_mask": [[0] + [1] * k],
                "rewards": [1.0],
            }
        )
    path = tmp_path / "train_data_step1.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc = main(["analyze", str(path), "--preset", "nemo-rl", "--n-boot", "20"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "The mismatch pi_old/mu_rollout dominates: 100 %" in out
    rc = main(["analyze", str(path), "--preset", "nemo-rl", "--n-boot", "0", "--table-format", "csv"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "Three policies" in err
    assert "Three policies" not in out
    assert io.StringIO(out).readline().startswith("bucket")
