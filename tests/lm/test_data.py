"""The shipped pretrained-model runs in data/smollm2: complete, grouped, described by their sidecars."""

import json
from pathlib import Path

import numpy as np
import pytest

from variance_lab.lm.analysis import (
    kept_mass_table,
    length_profile,
    mismatch_by_entropy,
    read_lm_run,
    read_token_field,
    staleness_table,
)
from variance_lab.lm.model import GGUF_SHA256

DATA = Path(__file__).resolve().parents[2] / "data" / "smollm2"
AGGREGATIONS = ("gspo", "token-mean", "seq-mean-token-mean")


def _run(aggregation):
    return read_lm_run(DATA / f"smollm2_onpolicy_{aggregation}.jsonl.gz")


def test_the_shipped_files_fit_the_budget():
    """At most 10 MB in all."""
    assert sum(p.stat().st_size for p in DATA.iterdir()) <= 10 * 2**20


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_each_onpolicy_file_is_complete_and_grouped(aggregation):
    """>= 1,000 sequences in groups of 4, every field, a sidecar naming the run, loss and model."""
    batch, frame, side = _run(aggregation)
    assert len(batch) >= 1000
    assert batch.has_groups
    assert frame.groupby("prompt_id").size().eq(4).all()
    assert {"id", "prompt_id", "reward", "advantage"} <= set(frame.columns)
    assert (side["run"], side["aggregation"], side["sampler"]) == ("onpolicy", aggregation, "fp32")
    assert side["model"]["sha256"] == GGUF_SHA256
    assert 0.2 <= frame["reward"].mean() <= 0.8
    assert frame["length"].min() < 16
    assert frame["length"].max() > 200
    assert side["groups_with_advantage"][0] > 0
    assert np.abs(batch.log_ratio).max() > 0


def test_the_three_losses_share_rollouts_and_gspo_equals_grpo_at_the_first_step():
    """Same responses and old log-probs; GSPO and seq-mean-token-mean take the same first step.

    At ratio 1 nothing is clipped and both gradients are sum_i A_i / (G T_i) sum_t grad log pi:
    their new log-probs agree to the float32 noise of two backward passes (measured 6.1e-5),
    while token-mean's differ by far more.
    """
    (b_g, f_g, _), (b_t, _, _), (b_s, f_s, _) = (_run(a) for a in AGGREGATIONS)
    np.testing.assert_array_equal(b_g.old_logp, b_s.old_logp)
    np.testing.assert_array_equal(b_g.old_logp, b_t.old_logp)
    assert f_g["id"].tolist() == f_s["id"].tolist()
    same = np.abs(b_g.logp - b_s.logp).max()
    other = np.abs(b_g.logp - b_t.logp).max()
    assert same < 1e-3 < other


def test_long_responses_move_less_under_every_loss():
    """The update's RMS log-ratio at 128-256 tokens is under a fifth of that at 1-7 tokens."""
    for aggregation in AGGREGATIONS:
        prof = length_profile(_run(aggregation)[0]).set_index("T_min")
        assert prof.loc[128, "rms"] < 0.2 * prof.loc[1, "rms"]


SAMPLERS = ("bf16", "fp16", "top-p")


def _mismatch(sampler):
    return read_lm_run(DATA / f"smollm2_mismatch_{sampler}.jsonl.gz")


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_mismatch_file_is_complete_and_records_its_sampler(sampler):
    """>= 1,000 grouped sequences with the sampler's log-probs; the sidecar names run, sampler, arithmetic."""
    batch, frame, side = _mismatch(sampler)
    assert len(batch) >= 1000
    assert batch.has_rollout
    assert batch.has_groups
    assert frame.groupby("prompt_id").size().eq(4).all()
    assert (side["run"], side["sampler"]) == ("mismatch", sampler)
    assert side["sampler_arithmetic"] == "native"
    assert side["model"]["sha256"] == GGUF_SHA256
    assert frame["length"].min() < 16
    assert frame["length"].max() > 200
    assert np.abs(batch.mismatch_log_ratio).max() > 0


def test_the_top_p_mismatch_is_the_log_of_the_kept_mass():
    """old_logp - rollout_logp = log S per token (up to float32 and 7 digits); the mean is below 0."""
    path = DATA / "smollm2_mismatch_top-p.jsonl.gz"
    batch, _, _ = read_lm_run(path)
    table = kept_mass_table(batch, read_token_field(path, "log_kept_mass")).set_index("T_min")
    assert table.loc[0, "max_abs_diff"] < 1e-4
    assert table.loc[0, "mean_mismatch"] < 0
    # the mean differs from -mean log S by at most the largest per-token difference
    gap = abs(table.loc[0, "mean_mismatch"] + table.loc[0, "mean_neg_log_kept"])
    assert gap <= table.loc[0, "max_abs_diff"]


def test_the_bf16_sampler_mismatch_is_larger_than_the_update():
    """bf16 rounding moves the sampled tokens' log-probs more than one step of lr 1e-6 does."""
    batch, _, _ = _mismatch("bf16")
    assert batch.mismatch_log_ratio.std() > batch.log_ratio.std()


def test_fp16_rounds_finer_than_bf16():
    """fp16 keeps 10 mantissa bits to bf16's 7 (8 times finer): its mismatch's sd is under half bf16's."""
    bf16, fp16 = (_mismatch(s)[0].mismatch_log_ratio for s in ("bf16", "fp16"))
    assert 0 < fp16.std() < 0.5 * bf16.std()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_each_mismatch_file_has_the_entropy_of_every_token(sampler):
    """Every sequence's ids were recovered (scores reproduced to 1e-4): an entropy per token in [0, log V]."""
    path = DATA / f"smollm2_mismatch_{sampler}.jsonl.gz"
    batch, _, side = read_lm_run(path)
    recovery = side["entropy_recovery"]
    assert recovery["not found"] == 0
    assert recovery["encoded"] + recovery["searched"] == len(batch)
    assert recovery["max_abs_logp_diff"] <= recovery["tol"] == 1e-4
    h = read_token_field(path, "entropy")
    assert h.shape == batch.logp.shape
    assert np.all((h >= 0) & (h <= np.log(49152)))


def test_bf16_mismatch_sits_on_high_entropy_tokens():
    """Tokens where the trainer's entropy is under 0.5 nat carry a far smaller mismatch than those above 2."""
    path = DATA / "smollm2_mismatch_bf16.jsonl.gz"
    table = mismatch_by_entropy(read_lm_run(path)[0], read_token_field(path, "entropy")).set_index("h_lo")
    assert table.loc[0.0, "rms"] < 0.5 * table.loc[2.0, "rms"]


def test_the_stale_file_has_four_lags_and_staleness_grows():
    """256 sequences per lag 0..3; Var of log pi_theta/pi_behaviour is larger at lag 3 than at 0."""
    batch, frame, side = read_lm_run(DATA / "smollm2_stale_gspo.jsonl.gz")
    assert side["run"] == "stale"
    assert frame.groupby("policy_lag").size().to_dict() == {0: 256, 1: 256, 2: 256, 3: 256}
    assert batch.has_rollout
    assert batch.has_groups
    table = staleness_table(batch, frame["policy_lag"].to_numpy()).set_index("lag")
    assert table.loc[3, "var_token"] > table.loc[0, "var_token"]


PAIRED = DATA.parent / "smollm2_paired"


def test_paired_runs_pair_their_files_and_record_the_optimizer():
    """Each seed's files hold the same ids and tokens, name the on-policy file, record one AdamW."""
    from variance_lab.lm.paired_report import read_paired

    runs = read_paired(PAIRED)
    assert sorted(runs) == [("gspo", 0), ("gspo", 1), ("gspo", 2), ("token-mean", 0)]
    for (loss, seed), run in runs.items():
        sides = [json.loads(p.read_text()) for p in PAIRED.glob(f"smollm2_s{seed}_*.json")]
        sides = [s for s in sides if s["aggregation"] in (loss, None) and s["role"] != "length"]
        assert len(sides) == (7 if loss == "gspo" else 1)
        base = run["onpolicy"]
        assert {s["tokens_sha256"] for s in sides} == {sides[0]["tokens_sha256"]}
        for side in sides:
            assert side["optimizer"]["persistent"]
            assert side["settings"]["paired_base"] == "bf16"
            assert side["optimizer"]["update"] == 2 + (
                int(side["role"][-1]) if "stale" in side["role"] else 0
            )
            if side["role"] != "onpolicy":
                assert side["paired_with"] == f"smollm2_s{seed}_onpolicy_gspo.jsonl.gz"
                rows = run[side["role"]]
                assert [r["id"] for r in rows] == [r["id"] for r in base]
                assert [len(r["rollout_logp"]) for r in rows] == [len(r["logp"]) for r in base]


def test_each_paired_run_clips_within_a_factor_of_two_of_the_published_fraction():
    """Update K's clipped fraction, recomputed from the on-policy file, against its loss's published one.

    The rate was calibrated on the same data batch (``calibration`` in the sidecar, its rate the
    optimizer's): the fraction sits within a factor of 2 of the GSPO paper's for each loss.
    """
    from variance_lab.lm.paired import PUBLISHED_CLIP_FRACTIONS, clipped_fraction
    from variance_lab.lm.paired_report import read_paired

    for (loss, seed), run in read_paired(PAIRED).items():
        records = run["onpolicy"]
        found = clipped_fraction(
            loss, [np.asarray(r["logp"]) for r in records], [np.asarray(r["old_logp"]) for r in records]
        )
        target = PUBLISHED_CLIP_FRACTIONS[loss]
        assert target / 2 <= found <= 2 * target, (loss, seed, found)
        side = run["sidecar"]
        assert side["calibration"]["target"] == target
        assert side["optimizer"]["lr"] == float(f"{side['calibration']['lr']:.3g}")


def test_each_length_batch_shares_its_seeds_policies_and_the_buckets_hold_100_finished():
    """A GSPO seed's length batch: its on-policy file's optimizer, rate and policies; >= 100 per bucket.

    ``policy_check`` scored the on-policy file's first records under the length run's
    theta_{K-1} and theta_K: they agree within float32 scoring noise (other batch compositions
    move log-probs by up to about 2e-5), far below update K's own size (RMS about 4e-3).
    Pooled over the seeds, data and length batches, every bucket from 8-15 to 128-255 tokens
    holds at least 100 finished on-policy responses; the unfinished ones ran to the budget.
    """
    from variance_lab.experiment.files import sidecar_path
    from variance_lab.lm.compare import length_counts
    from variance_lab.lm.length import LENGTH_FIRST_ID, length_name
    from variance_lab.lm.paired_report import read_paired

    runs = read_paired(PAIRED)
    pooled = []
    for seed in (0, 1, 2):
        run = runs[("gspo", seed)]
        side = json.loads(sidecar_path(PAIRED / length_name(seed, "gspo")).read_text())
        base = json.loads((PAIRED / f"smollm2_s{seed}_onpolicy_gspo.json").read_text())
        assert side["same_policies_as"] == base["data_file"]
        assert side["optimizer"] == base["optimizer"]
        assert side["settings"]["update_lr"] == base["optimizer"]["lr"]
        drop = ("update_lr", "length_strata")
        assert {k: v for k, v in side["settings"].items() if k not in drop} == {
            k: v for k, v in base["settings"].items() if k not in drop
        }
        for field in ("old_logp", "logp"):
            check = side["policy_check"][field]
            assert check["tokens"] >= 100
            assert check["max_abs_diff"] <= 1e-4
        records = run["length"]
        assert min(r["prompt_id"] for r in records) >= LENGTH_FIRST_ID
        assert {r["task"] for r in records} == {"count"}
        pooled += run["onpolicy"] + records
    max_new = base["settings"]["max_new_tokens"]
    assert all(len(r["logp"]) == max_new for r in pooled if not r["finished"])
    counts = length_counts(
        np.array([len(r["logp"]) for r in pooled]),
        np.array([r["finished"] for r in pooled]),
        (8, 16, 32, 64, 128, 256),
    )
    for bucket in ("8-15", "16-31", "32-63", "64-127", "128-255"):
        assert counts[bucket] >= 100, (bucket, counts)


def test_data_stays_under_10_mb_and_the_tables_are_current():
    """data/ is under 10 MB; the README's and the guide's paired tables are what the files give."""
    import subprocess
    import sys

    size = sum(p.stat().st_size for p in DATA.parent.rglob("*") if p.is_file())
    assert size < 10e6
    tool = DATA.parents[1] / "tools" / "lm_paired_report.py"
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
