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


# --------------------------------------------------------------------------------------
# --ratio: the ratio of the main table
# --------------------------------------------------------------------------------------
def _capture(seed=0, n=120):
    """Return a capture as the integrations and the frameworks' dumps write it: pi_old as logp, old_logp."""
    b = _batch(seed, n=n)
    return TokenBatch.from_flat(b.old_logp, b.old_logp, b.lengths, rollout_logp=b.rollout_logp)


def test_ratio_batch_keeps_positions_prompts_and_notes():
    """ratio_batch swaps the log-probs only: positions (holes), ids, prompts, dropped and notes stay."""
    from dataclasses import replace

    from variance_lab.rollouts.split import ratio_batch

    mask = [[1, 0, 1, 1], [1, 1, 0, 1]]
    logp = [[-0.5, 0.0, -0.2, -0.3], [-0.1, -0.4, 0.0, -0.6]]
    old = [[-0.4, 0.0, -0.25, -0.3], [-0.1, -0.5, 0.0, -0.5]]
    roll = [[-0.45, 0.0, -0.2, -0.35], [-0.2, -0.5, 0.0, -0.55]]
    b = TokenBatch.from_padded(np.array(logp), np.array(old), np.array(mask), rollout_logp=np.array(roll))
    b = replace(b, notes=("a note",))
    for ratio, top, bottom in (("mismatch", b.old_logp, b.rollout_logp), ("total", b.logp, b.rollout_logp)):
        r = ratio_batch(b, ratio)
        np.testing.assert_array_equal(r.log_ratio, top - bottom)
        np.testing.assert_array_equal(r.positions, [0, 2, 3, 0, 1, 3])
        assert r.notes == ("a note",)
        assert not r.has_rollout
    assert ratio_batch(b, "update") is b


def test_choose_ratio_names_a_file_without_an_update_ratio():
    """No --ratio: the update ratio, or the mismatch with a note where logp equals old_logp everywhere.

    Asked for, the update ratio of such a file is an error; so is a file without rollout_logp
    whose every ratio is 1, and a mismatch or total without rollout_logp.
    """
    from variance_lab.rollouts.split import choose_ratio, has_update_ratio

    full, cap = _batch(1, n=30), _capture(1, n=30)
    assert has_update_ratio(full)
    assert not has_update_ratio(cap)
    assert choose_ratio(full) == ("update", "")
    assert choose_ratio(full, "total") == ("total", "")
    ratio, text = choose_ratio(cap, name="run.parquet")
    assert ratio == "mismatch"
    assert text.startswith("run.parquet carries no update ratio: logp equals old_logp at every counted token")
    assert choose_ratio(cap, "mismatch") == ("mismatch", "")
    with pytest.raises(ValueError, match=r"--ratio update: run.parquet carries no update ratio"):
        choose_ratio(cap, "update", name="run.parquet")
    flat = TokenBatch.from_flat(cap.old_logp, cap.old_logp, cap.lengths)
    with pytest.raises(ValueError, match="no rollout_logp, so every ratio it holds is 1"):
        choose_ratio(flat)
    plain = TokenBatch.from_flat(full.logp, full.old_logp, full.lengths)
    with pytest.raises(ValueError, match=r"--ratio mismatch: the batch has no rollout_logp"):
        choose_ratio(plain, "mismatch")
    with pytest.raises(ValueError, match="ratio must be one of"):
        choose_ratio(full, "sum")


def test_analyze_ratio_selects_the_main_table():
    """analyze(ratio=...) tabulates the batch whose log-ratio is that ratio; the split is of the input."""
    from variance_lab.rollouts.split import ratio_batch

    b = _batch(2, n=200)
    for ratio in ("mismatch", "total"):
        res = analyze(b, n_boot=30, fit_models=False, folds=0, ratio=ratio)
        direct = analyze(ratio_batch(b, ratio), n_boot=30, fit_models=False, folds=0)
        pd_cols = ["n_seq", "var_log_P", "var_G", "var_G_lo", "var_G_hi", "gspo_clip_frac", "ppo_clip_frac"]
        np.testing.assert_array_equal(res.table[pd_cols].to_numpy(), direct.table[pd_cols].to_numpy())
        assert res.summary()["ratio"] == ratio
        assert res.split is not None
        assert direct.split is None
    upd = analyze(b, n_boot=0, fit_models=False, folds=0)
    assert upd.summary()["ratio_label"] == "the update ratio pi_theta/pi_old"


def test_cli_shows_a_captures_mismatch_not_zeros(tmp_path, capsys):
    """A capture (logp == old_logp): analyze's main table is the mismatch, with one note saying why.

    Before, its table was all zeros (the update ratio of pi_old over itself). --ratio update on
    it, and a file of ratios 1 without rollout_logp, are one-line errors with exit status 2.
    """
    from variance_lab.rollouts.io import save_batch

    cap = _capture(3, n=150)
    path = save_batch(cap, tmp_path / "capture.parquet")
    assert main(["analyze", str(path), "--n-boot", "20", "--folds", "0", "--table-format", "json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["summary"]["ratio"] == "mismatch"
    var_g = [row["var_G"] for row in doc["buckets"]]
    assert all(v > 0 for v in var_g)
    mis = (cap.old_logp - cap.rollout_logp).var(ddof=1)
    assert doc["summary"]["fit"]["sigma2_y"] == pytest.approx(mis, rel=1e-12)
    assert err.count("carries no update ratio") == 1
    assert main(["analyze", str(path), "--n-boot", "0", "--folds", "0"]) == 0
    out, err = capsys.readouterr()
    assert "Ratio analysed: the mismatch ratio pi_old/mu_rollout (mismatch)" in out
    assert err.count("note: capture.parquet carries no update ratio") == 1
    assert main(["analyze", str(path), "--n-boot", "0", "--folds", "0", "--ratio", "total"]) == 0
    out, err = capsys.readouterr()
    assert "Ratio analysed: the total ratio pi_theta/mu_rollout (total)" in out
    assert "carries no update ratio" not in err
    assert main(["analyze", str(path), "--n-boot", "0", "--ratio", "update"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--ratio update: capture.parquet carries no update ratio" in err
    ones = save_batch(TokenBatch.from_flat(cap.old_logp, cap.old_logp, cap.lengths), tmp_path / "ones.jsonl")
    assert main(["analyze", str(ones), "--n-boot", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "every ratio it holds is 1" in err
    plain = save_batch(_batch(4, n=40), tmp_path / "plain.jsonl")
    assert main(["analyze", str(plain), "--n-boot", "0", "--folds", "0"]) == 0
    out, err = capsys.readouterr()
    assert "Ratio analysed: the update ratio pi_theta/pi_old (update)" in out
    assert "update ratio" not in err


def test_split_of_a_file_read_in_pieces_is_the_loaded_batchs(tmp_path, write_dump):
    """A Parquet source's split (pieces of 11 rows, sums fed in pieces) is the loaded batch's, exactly."""
    import pandas as pd

    from variance_lab.rollouts.io import load_batch
    from variance_lab.rollouts.source import parquet_source

    path = write_dump(tmp_path / "d.parquet", np.random.default_rng(21), n=140, holes=True)
    whole = split_ratios(load_batch(path), checks=("tis:2", "icepop:5", "seq-mask:3", "gmpo"))
    pieces = split_ratios(parquet_source(path, rows=11), checks=("tis:2", "icepop:5", "seq-mask:3", "gmpo"))
    pd.testing.assert_frame_equal(whole.table, pieces.table, check_exact=True)
    assert (whole.shares, whole.line) == (pieces.shares, pieces.line)


def test_split_refuses_token_checks_of_whole_sequences():
    """CTPO and M2PO judge a token by its sequence or batch: not a token check of the split."""
    rng = np.random.default_rng(0)
    old = -rng.exponential(1.0, 50) - 0.01
    batch = TokenBatch.from_flat(old, old, [25, 25], rollout_logp=np.minimum(old + 0.01, 0))
    with pytest.raises(ValueError, match="ctpo"):
        split_ratios(batch, checks=("ctpo:0.5:0.5",))
