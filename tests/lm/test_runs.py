"""The three runs end to end on a tiny random Llama: records, sidecar, and the toolkit's loader."""

import gzip
import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="pip install 'variance_lab[lm]'")

from variance_lab.experiment.files import sidecar_path
from variance_lab.lm import runs as runs_mod
from variance_lab.lm.model import load_model
from variance_lab.lm.runs import LM_SIDECAR_KIND, default_name, run_lm_experiment
from variance_lab.lm.settings import LM_QUICK, LMSettings
from variance_lab.lm.tiny import write_tiny_llama
from variance_lab.rollouts import load_batch

#: Small enough for a second or two per run on one core.
TINY = LMSettings(
    n_prompts=4, group_size=2, max_new_tokens=12, train_prompts=2, max_words=4, threads=1, lr=1e-2
)


@pytest.fixture(autouse=True)
def varied_rewards(monkeypatch):
    """Reward every second response (a random model never answers right), so each group has an advantage."""
    monkeypatch.setattr(runs_mod, "rewards", lambda prompts, texts, match: np.arange(len(texts)) % 2.0)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Return the tiny model, its tokenizer and its description."""
    model, tok = load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=2))
    return model, tok, {"name": "tiny random Llama"}


def _read(path):
    """Return the records of a .jsonl.gz file."""
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def _run(loaded, tmp_path, **changes):
    settings = LMSettings(**{**TINY.to_dict(), **changes})
    out = tmp_path / default_name(settings)
    side = run_lm_experiment(settings, out, loaded=loaded)
    return settings, out, side, _read(out)


@pytest.mark.parametrize("aggregation", ["gspo", "token-mean", "seq-mean-token-mean"])
def test_onpolicy_run_writes_a_loadable_data_set(loaded, tmp_path, aggregation):
    """Onpolicy run writes a loadable data set."""
    settings, out, side, records = _run(loaded, tmp_path, aggregation=aggregation)
    batch = load_batch(out)
    assert len(batch) == settings.n_prompts * settings.group_size == len(records)
    assert batch.prompt_id is not None
    assert len(np.unique(batch.prompt_id)) == settings.n_prompts
    for rec in records:
        assert {"id", "prompt_id", "logp", "old_logp", "reward", "advantage"} <= set(rec)
        assert "rollout_logp" not in rec
        assert len(rec["entropy"]) == len(rec["logp"])
        assert 0 < min(rec["entropy"]) <= max(rec["entropy"]) <= np.log(259) + 1e-6
        assert "policy_lag" not in rec
        assert len(rec["logp"]) == len(rec["old_logp"]) >= 1
    # the update moved the policy: some log-ratio is nonzero
    assert np.abs(batch.logp - batch.old_logp).max() > 0
    saved = json.loads(sidecar_path(out).read_text())
    assert saved["kind"] == LM_SIDECAR_KIND
    assert saved["run"] == "onpolicy"
    assert saved["aggregation"] == aggregation
    assert saved["settings"] == settings.to_dict()
    assert saved["wall_time_s"] > 0
    assert saved["versions"]["transformers"]
    assert side["summary"]["n_sequences"] == len(records)
    assert side["groups_with_advantage"] == [settings.train_prompts] * 2
    assert side["data_groups_with_advantage"] == [settings.n_prompts] * 2
    assert side["rollouts_shared"] is False
    # the first minibatch is other prompts: its ids follow the data batch's
    assert "first minibatch" in side["fields"]["logp"]


def test_the_three_aggregations_share_their_rollouts(loaded, tmp_path):
    """The three aggregations share their rollouts; a shared cache changes no number."""
    runs = [_run(loaded, tmp_path, aggregation=a)[3] for a in ("gspo", "token-mean")]
    for a, b in zip(*runs, strict=True):
        assert a["response"] == b["response"]
        assert a["old_logp"] == b["old_logp"]
    assert any(a["logp"] != b["logp"] for a, b in zip(*runs, strict=True))
    cache: dict = {}
    (tmp_path / "shared").mkdir()
    for aggregation in ("gspo", "token-mean"):
        settings = LMSettings(**{**TINY.to_dict(), "aggregation": aggregation})
        side = run_lm_experiment(
            settings, tmp_path / "shared" / default_name(settings), loaded=loaded, cache=cache
        )
        alone = json.loads(sidecar_path(tmp_path / default_name(settings)).read_text())
        assert side["numbers_sha256"] == alone["numbers_sha256"]
        assert side["rollouts_shared"] is (aggregation == "token-mean")
    assert len([k for k in cache if k != "loaded"]) == 1


@pytest.mark.parametrize("sampler", ["bf16", "fp16", "top-p"])
def test_mismatch_run_records_the_sampler(loaded, tmp_path, sampler):
    """Mismatch run records the sampler."""
    _settings, out, side, records = _run(loaded, tmp_path, run="mismatch", sampler=sampler)
    batch = load_batch(out)
    assert batch.rollout_logp is not None
    assert side["sampler"] == sampler
    mismatch = batch.old_logp - batch.rollout_logp
    if sampler == "top-p":
        kept = np.concatenate([r["log_kept_mass"] for r in records])
        assert np.all(kept <= 0)
        # renormalised: old - rollout = log S per token, up to the sampler's float32 rounding
        np.testing.assert_allclose(mismatch, kept, atol=5e-5)
        assert "top-p 0.9 / top-k 50" in side["fields"]["rollout_logp"]
    else:
        assert side["sampler_arithmetic"] in ("native", "emulated")
        assert np.abs(mismatch).max() > 0


def test_stale_run_has_every_lag(loaded, tmp_path):
    """Stale run has every lag."""
    settings, out, _side, records = _run(
        loaded, tmp_path, run="stale", n_prompts=8, train_prompts=4, group_size=4
    )
    lags = np.array([r["policy_lag"] for r in records])
    assert sorted(set(lags)) == list(range(settings.lags + 1))
    assert np.bincount(lags).tolist() == [settings.n_prompts // 4 * settings.group_size] * 4
    batch = load_batch(out)
    staleness = [np.abs(np.subtract(r["old_logp"], r["rollout_logp"])).max() for r in records]
    # lag 0 was sampled by the trainer's own policy: no staleness beyond float32 noise from
    # scoring in other minibatches; every older part has some
    assert all(s < 1e-4 for s, lag in zip(staleness, lags, strict=True) if lag == 0)
    assert all(s > 1e-3 for s, lag in zip(staleness, lags, strict=True) if lag > 0)
    assert len(np.unique(batch.prompt_id)) == settings.n_prompts


def test_reruns_are_identical(loaded, tmp_path):
    """Reruns are identical."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = (_run(loaded, tmp_path / name)[2] for name in "ab")
    assert a["numbers_sha256"] == b["numbers_sha256"]
    assert a["summary"]["mean_reward"] > 0


def test_digits_round_the_written_log_probs(loaded, tmp_path):
    """Digits round the written log probs."""
    records = _run(loaded, tmp_path, digits=3)[3]
    values = [v for r in records for v in r["logp"]]
    assert all(float(f"{v:.3g}") == v for v in values)


def test_quick_preset_and_names():
    """Quick preset and names."""
    assert LM_QUICK.n_prompts * LM_QUICK.group_size == 32
    assert (
        default_name(LMSettings(run="mismatch", sampler="top-p"), quick=True)
        == "smollm2_mismatch_top-p_quick.jsonl.gz"
    )
    assert default_name(LMSettings()) == "smollm2_onpolicy_gspo.jsonl.gz"
