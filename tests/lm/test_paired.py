"""The paired run: calibration, the clip rule at its bounds, and the files on a tiny random Llama."""

import gzip
import json
import math

import numpy as np
import pytest

from variance_lab.lm.paired import calibrate_lr, clipped_fraction, paired_names, tokens_sha256
from variance_lab.ratios import GSPO_EPS


def test_calibration_interpolates_a_power_law_exactly():
    """For f = c lr^2, log-log interpolation between the bracketing rates is exact."""
    found = calibrate_lr(lambda lr: 1e10 * lr**2, 0.15, [1e-6, 3e-6, 1e-5, 3e-5])
    assert found["lr"] == pytest.approx(math.sqrt(0.15 / 1e10), rel=1e-12)
    assert [lr for lr, _ in found["tried"]] == [1e-6, 3e-6, 1e-5]  # stops at the bracket


@pytest.mark.parametrize(
    ("target", "lrs", "message"),
    [
        (0.9, [1e-6, 3e-6], r"no two learning rates bracket the target 0.9: tried \[\[1e-06, 0.01"),
        (0.0, [1e-6, 1e-5], "target must be in"),
        (0.1, [1e-5, 1e-6], "increasing positive rates"),
        (0.1, [1e-5], "at least two"),
    ],
)
def test_calibration_names_what_went_wrong(target, lrs, message):
    """No bracket, a target outside (0, 1), rates not increasing."""
    with pytest.raises(ValueError, match=message):
        calibrate_lr(lambda lr: 1e10 * lr**2, target, lrs)


def test_gspo_counts_tokens_of_clipped_sequences_and_keeps_a_weight_at_a_bound():
    """A sequence whose weight is exactly 1 + eps_high is inside; one a little past it is clipped."""
    at = math.log1p(GSPO_EPS[1])
    while np.exp(at) != 1 + GSPO_EPS[1]:  # the log whose exp is the bound, to the last bit
        at = np.nextafter(at, 1.0 if np.exp(at) < 1 + GSPO_EPS[1] else 0.0)
    old = [np.zeros(2), np.zeros(4), np.zeros(4)]
    new = [np.full(2, at), np.full(4, at + 1e-12), np.zeros(4)]  # means of 2 and 4 equal values are exact
    assert clipped_fraction("gspo", new, old) == 4 / 10
    tokens = [np.array([math.log(0.8), math.log(0.79), 0.0]), np.array([math.log(1.28), math.log(1.29)])]
    assert clipped_fraction("token-mean", tokens, [np.zeros(3), np.zeros(2)]) == 2 / 5
    with pytest.raises(ValueError, match="same number of sequences"):
        clipped_fraction("gspo", new, old[:2])


def test_the_fingerprint_sees_a_changed_or_moved_token():
    """Same tokens, same digest; one token changed, or moved across the sequence boundary, another."""
    a = tokens_sha256([[1, 2], [3]])
    assert a == tokens_sha256([[1, 2], [3]])
    assert a != tokens_sha256([[1, 2], [4]])
    assert a != tokens_sha256([[1], [2, 3]])


pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")

from variance_lab.lm import runs as runs_mod  # noqa: E402
from variance_lab.lm.model import load_model  # noqa: E402
from variance_lab.lm.paired import run_paired, write_paired  # noqa: E402
from variance_lab.lm.settings import LMSettings  # noqa: E402
from variance_lab.lm.tiny import write_tiny_llama  # noqa: E402
from variance_lab.rollouts import load_batch  # noqa: E402

TINY = LMSettings(
    run="paired",
    n_prompts=3,
    group_size=2,
    max_new_tokens=10,
    train_prompts=2,
    max_words=4,
    threads=1,
    lr=1e-2,
    updates=2,
    lags=2,
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Run the tiny paired run once (every second response rewarded) and write its files."""
    mp = pytest.MonkeyPatch()
    mp.setattr(runs_mod, "rewards", lambda prompts, texts, match: np.arange(len(texts)) % 2.0)
    model, tok = load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=2))
    run = run_paired(model, tok, TINY)
    folder = tmp_path_factory.mktemp("paired")
    sides = write_paired(run, TINY, folder, model_info={"name": "tiny"}, calibration={"lr": 1e-2})
    mp.undo()
    return run, folder, sides


def _read(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def test_every_file_holds_the_same_ids_and_tokens_and_names_its_pair(written):
    """One name per role; the same ids and lengths; paired_with and tokens_sha256 tie them together."""
    run, folder, sides = written
    names = paired_names(0, "gspo", ("bf16", "fp16", "top-p"), 2)
    assert sorted(p.name for p in folder.glob("*.jsonl.gz")) == sorted(names.values())
    base = _read(folder / names["onpolicy"])
    assert len(base) == TINY.n_prompts * TINY.group_size
    for side in sides:
        recs = _read(side["paths"][0])
        assert [r["id"] for r in recs] == [r["id"] for r in base]
        assert [len(r["logp"]) for r in recs] == [len(r["old_logp"]) for r in base]
        assert side["tokens_sha256"] == tokens_sha256(run.batch.samples.tokens)
        assert side["paired_with"] == (None if side["role"] == "onpolicy" else names["onpolicy"])
        lag = int(side["role"].removeprefix("stale_lag")) if "lag" in side["role"] else 0
        assert side["optimizer"]["persistent"]
        assert side["optimizer"]["update"] == TINY.updates + lag
        load_batch(side["paths"][0])  # the toolkit reads each


def test_the_chain_links_the_files(written):
    """Lag l's old policy is lag l-1's new one; the mismatch files share the on-policy ratios."""
    _, folder, _ = written
    names = paired_names(0, "gspo", ("bf16", "fp16", "top-p"), 2)
    base = _read(folder / names["onpolicy"])
    lag1, lag2 = _read(folder / names["stale_lag1"]), _read(folder / names["stale_lag2"])
    for b, one, two in zip(base, lag1, lag2, strict=True):
        assert one["old_logp"] == b["logp"]
        assert two["old_logp"] == one["logp"]
        assert one["rollout_logp"] == two["rollout_logp"] == b["old_logp"]
        assert b["finished"] in (True, False)
        assert "prompt" in b
        assert "prompt" not in one
    for name in ("bf16", "fp16", "top-p"):
        for b, m in zip(base, _read(folder / names[f"mismatch_{name}"]), strict=True):
            assert m["logp"] == b["logp"]
            assert m["old_logp"] == b["old_logp"]


def test_top_p_masks_exactly_the_tokens_it_never_draws(written):
    """Mask 0 where the top-p sampler's log-prob is -inf; elsewhere old_logp - rollout_logp = log S."""
    run, folder, _ = written
    lp, kept = run.samplers["top-p"]
    recs = _read(folder / paired_names(0, "gspo")["mismatch_top-p"])
    for i, rec in enumerate(recs):
        assert rec["mask"] == [int(v) for v in np.isfinite(lp[i])]
        inside = np.isfinite(lp[i])
        np.testing.assert_allclose((run.scores[0][i] - lp[i])[inside], np.asarray(kept[i])[inside], atol=2e-6)


def test_calibrated_update_takes_the_uncalibrated_runs_minibatch(tmp_path, monkeypatch):
    """Calibrating to the fraction the plain run's update K clips picks its rate; the runs agree bit for bit.

    The calibration draws update K's minibatch before the forks and the run then takes update K on
    it, so a calibration that lands on ``settings.lr`` reproduces the uncalibrated run exactly.
    """
    from dataclasses import replace

    from variance_lab.lm.paired import clipped_fraction

    settings = replace(TINY, lr=1e-5, lags=1)
    monkeypatch.setattr(runs_mod, "rewards", lambda prompts, texts, match: np.arange(len(texts)) % 2.0)
    model, tok = load_model(write_tiny_llama(tmp_path, seed=2))
    plain = run_paired(model, tok, settings)
    target = clipped_fraction(settings.aggregation, plain.scores[1], plain.scores[0])
    assert 0 < target < 1
    run = run_paired(model, tok, settings, lrs=[settings.lr, 1.0], target=target)
    assert run.calibration["tried"][0] == [settings.lr, target]
    assert run.calibration["update"] == settings.updates
    assert [o["lr"] for o in run.optimizer] == [o["lr"] for o in plain.optimizer] == [settings.lr] * 2
    for a, b in zip(run.scores, plain.scores, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_calibration_and_a_given_update_rate_are_refused_together(tmp_path):
    """``update_lr`` and ``lrs`` both name update K's rate: the run refuses before it starts."""
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"update_lr=0\.001 and calibration rates"):
        run_paired(None, None, replace(TINY, update_lr=1e-3), lrs=[1e-3, 1e-2])
