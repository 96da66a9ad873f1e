"""The arithmetic experiment: task, model, GSPO objective against the toolkit, runs, shipped data."""

import gzip
import importlib.util
import json
import math
import re
import shutil
import sys
from dataclasses import replace

import numpy as np
import pytest

from variance_lab.cli import main
from variance_lab.experiment import task
from variance_lab.experiment.figure import (
    DEFAULT_DATA,
    FIGURE_NAME,
    analyze_data,
    resampled_clip,
    save_experiment_figure,
    token_findings,
)
from variance_lab.experiment.files import (
    compare_files,
    read_sidecar,
    sidecar_path,
    version_differences,
    version_warning,
)
from variance_lab.provenance import TORCH_VERSIONS, numbers_sha256, versions
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import load_batch
from variance_lab.rollouts.weights import sequence_weights

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="pip install 'variance_lab[experiment]'")
SHIPPED_SIDECAR = sidecar_path(DEFAULT_DATA)
BF16_DATA = DEFAULT_DATA.with_name("arith_rollouts_bf16.jsonl.gz")
FIGURES = DEFAULT_DATA.parents[1] / "figures"


# --------------------------------------------------------------------------------------
# the task (no PyTorch)
# --------------------------------------------------------------------------------------
def test_problem_texts_and_reward():
    """A problem's prompt, response and total; the reward is 1 only for the right final answer."""
    p = task.Problem((3, 5, 2, 7))
    assert p.prompt == "a3b5c2d7:"
    assert p.response == "a3+b5=8,8+c2=10,10+d7=17."
    assert p.total == 17
    assert task.arith_reward(p, p.response) == 1.0
    assert task.arith_reward(p, p.response + "junk") == 1.0  # after the end token: ignored
    assert task.arith_reward(p, "a3+b5=8,8+c2=10,10+d7=18.") == 0.0  # wrong final answer
    assert task.arith_reward(p, "a3+b5=8,8+c2=10,10+d7=17") == 0.0  # truncated: no end token
    assert task.arith_reward(p, "17.") == 0.0
    assert task.arith_reward(p, "=.") == 0.0
    assert task.arith_reward(p, "=1+7.") == 0.0
    assert task.arith_reward(p, "x=9,=17.") == 1.0  # only the final answer counts
    np.testing.assert_array_equal(task.arith_rewards([p, p], [p.response, "."]), [1.0, 0.0])


def test_problem_validation_and_vocabulary():
    """Bad digit tuples raise; encode and decode round-trip and refuse text outside the vocabulary."""
    for bad in [(3,), (1, 10), tuple(range(1, 10)) * 6]:
        with pytest.raises(ValueError, match="digits"):
            task.Problem(bad)
    p = task.Problem(tuple(range(10)) * 5)
    ids = task.encode(p.prompt + p.response)
    assert task.PAD not in ids
    assert task.decode(ids) == p.prompt + p.response
    assert task.decode([task.PAD, *ids, task.PAD]) == p.prompt + p.response
    with pytest.raises(ValueError, match="not in the task's vocabulary"):
        task.encode("a3 b5")


def test_problems_are_deterministic_and_lengths_range_widely():
    """Problems repeat for a seed, and terms and response lengths span the requested range."""
    a = task.make_problems(np.random.default_rng(5), 400, 2, 32)
    b = task.make_problems(np.random.default_rng(5), 400, 2, 32)
    assert a == b
    n = np.array([p.n for p in a])
    assert n.min() == 2
    assert n.max() == 32
    assert 0.2 < np.mean(n < 6) < 0.5  # log-uniform: as many in 2..5 as in 6..17 or 18..32, roughly
    lengths = [len(p.response) for p in a]
    assert min(lengths) == 8
    assert 250 < max(lengths) <= task.max_response_length(32)
    assert all(len(p.response) <= task.max_response_length(p.n) for p in a)
    with pytest.raises(ValueError, match="n_min"):
        task.make_problems(np.random.default_rng(0), 3, 1, 5)


# --------------------------------------------------------------------------------------
# model and objective (PyTorch)
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_mod():
    """Return the torch module, or skip the test when PyTorch is not installed."""
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    import torch

    return torch


def _tiny_model(torch_mod, seed=0):
    from variance_lab.experiment.model import ModelConfig, TinyGPT

    return TinyGPT(
        ModelConfig(d_model=16, n_layer=2, n_head=2, d_ff=32, max_len=128),
        torch_mod.Generator().manual_seed(seed),
    ).double()


@needs_torch
def test_cached_forward_matches_full_forward(torch_mod):
    """The forward pass in pieces through the key-value cache equals the full forward pass."""
    model = _tiny_model(torch_mod)
    idx = torch_mod.randint(1, len(task.VOCAB), (3, 20), generator=torch_mod.Generator().manual_seed(1))
    with torch_mod.no_grad():
        full = model(idx)
        cache = model.new_cache(3, 20)
        parts = [model(idx[:, :7], cache), model(idx[:, 7:8], cache), model(idx[:, 8:20], cache)]
    torch_mod.testing.assert_close(torch_mod.cat(parts, dim=1), full, rtol=1e-12, atol=1e-12)
    assert torch_mod.all(full[..., task.PAD] == -math.inf)


@needs_torch
def test_generate_is_deterministic_and_respects_budgets(torch_mod):
    """Generation repeats for a generator seed, stays within each budget and stops at the end token."""
    from variance_lab.experiment.model import generate, token_log_probs

    model = _tiny_model(torch_mod)
    prompts = [task.encode(task.Problem(t).prompt) for t in [(1, 2), (3, 4, 5, 6), (7, 8, 9)]]
    budgets = [5, 9, 3]
    out = [generate(model, prompts, budgets, torch_mod.Generator().manual_seed(4)) for _ in range(2)]
    assert out[0] == out[1]
    eos = task.encode(task.EOS)[0]
    for resp, budget in zip(out[0], budgets, strict=True):
        assert 1 <= len(resp) <= budget
        assert task.PAD not in resp
        assert eos not in resp[:-1]  # stops at the first end token
    lp = token_log_probs(model, prompts, out[0])
    assert lp.shape == (3, max(map(len, out[0])))
    assert torch_mod.all(lp <= 0)
    with pytest.raises(ValueError, match="max_len"):
        generate(model, prompts, [200, 1, 1], torch_mod.Generator())


@needs_torch
def test_gspo_objective_matches_the_toolkit(torch_mod):
    """The training loss's GSPO log s, clip flags and loss equal the toolkit's sequence weights."""
    from variance_lab.experiment.train import gspo_loss

    rng = np.random.default_rng(3)
    lengths = np.array([1, 5, 40, 200, 17, 3])
    width = lengths.max()
    mask = (np.arange(width) < lengths[:, None]).astype(np.float64)
    old = -rng.exponential(1.0, (lengths.size, width))
    new = old + rng.normal(0.0, [[1e-4], [3e-4], [1e-3], [2e-3], [5e-5], [1e-2]], (lengths.size, width))
    new = np.minimum(new, 0.0)
    adv = torch_mod.tensor(rng.normal(size=lengths.size))
    loss, info = gspo_loss(torch_mod.tensor(new), torch_mod.tensor(old), torch_mod.tensor(mask), adv)
    w = sequence_weights(TokenBatch.from_padded(new, old, mask))
    np.testing.assert_allclose(info["log_s"].numpy(), w.log_G, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(info["clipped"].numpy(), w.clipped_gspo)
    assert 0 < w.clipped_gspo.sum() < lengths.size
    s, a = w.s, adv.numpy()
    want = -np.mean(np.minimum(s * a, np.clip(s, 1 - 3e-4, 1 + 4e-4) * a))
    assert float(loss) == pytest.approx(want, rel=1e-12)


@needs_torch
def test_gspo_clipping_stops_the_gradient(torch_mod):
    """A clipped sequence gets zero gradient; an unclipped one with positive advantage ascends."""
    from variance_lab.experiment.train import gspo_loss

    old = torch_mod.full((2, 4), -1.0, dtype=torch_mod.float64)
    new = (old + torch_mod.tensor([[1e-3], [1e-5]], dtype=torch_mod.float64)).requires_grad_()
    mask = torch_mod.ones(2, 4, dtype=torch_mod.float64)
    loss, info = gspo_loss(new, old, mask, torch_mod.tensor([1.0, 1.0], dtype=torch_mod.float64))
    loss.backward()
    assert info["clipped"].tolist() == [True, False]
    assert torch_mod.all(new.grad[0] == 0)
    assert torch_mod.all(new.grad[1] < 0)  # ascent raises logp


def test_group_advantages():
    """Group advantages are standardised rewards per group, zero for a group of equal rewards."""
    pytest.importorskip("torch")
    from variance_lab.experiment.train import ADVANTAGE_DDOF, ADVANTAGE_EPS
    from variance_lab.ratios import group_advantages

    assert (ADVANTAGE_EPS, ADVANTAGE_DDOF) == (1e-4, 0)
    adv = group_advantages(
        np.array([1.0, 0, 0, 1, 1, 1, 1, 1]), np.arange(8) // 4, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF
    )
    np.testing.assert_allclose(adv[:4], [1, -1, -1, 1], rtol=1e-3)
    np.testing.assert_array_equal(adv[4:], 0.0)


def test_settings_validation():
    """Settings round-trip through a dict; each out-of-range or unknown setting raises ValueError."""
    pytest.importorskip("torch")
    from variance_lab.experiment.train import ARITH_FULL, ARITH_QUICK, Settings

    assert Settings.from_dict(ARITH_QUICK.to_dict()) == ARITH_QUICK
    for bad, message in [
        ({"n_max": 60}, r"need 2 <= n_min <= n_max <= "),
        ({"n_min": 1}, r"need 2 <= n_min <= n_max <= "),
        ({"threads": 0}, r"settings threads out of range"),
        ({"sft_steps": 1.5}, r"settings sft_steps must be integers"),
        ({"d_model": 30, "n_head": 4}, r"n_head=4 must divide d_model=30"),
        ({"pg_minibatches": 20}, r"pg_minibatches must not exceed pg_prompts"),
        ({"clip_low": 1.0}, r"need 0 < clip_low < 1"),
        ({"pg_lr": 0.0}, r"learning rates > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            replace(ARITH_FULL, **bad)
    with pytest.raises(ValueError, match="unknown settings: bogus"):
        Settings.from_dict({**ARITH_FULL.to_dict(), "bogus": 1})


# --------------------------------------------------------------------------------------
# runs (PyTorch): the quick command end to end, determinism, --settings
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, torch_mod):
    """Run the quick experiment once for the module and return the path of its data set."""
    out = tmp_path_factory.mktemp("quick") / "rollouts.jsonl.gz"
    assert main(["experiment", "run", "--quick", "--quiet", "--seed", "3", "--out", str(out)]) == 0
    return out


@needs_torch
def test_quick_run_writes_a_valid_data_set(quick_run):
    """The quick run writes 48 valid sequences and a sidecar whose hash and summary match them."""
    batch = load_batch(quick_run)  # raises on any bad sequence
    assert batch.n_dropped == 0
    assert len(batch) == 48
    side = read_sidecar(sidecar_path(quick_run))
    assert side["seed"] == 3
    assert side["quick"] is True
    assert side["settings"]["seed"] == 3
    assert side["summary"]["n_tokens"] == batch.n_tokens
    assert side["summary"]["var_log_ratio"] > 0
    assert side["versions"]["cpu_capability"] == __import__("torch").backends.cpu.get_cpu_capability()
    assert side["versions"]["cpu"]  # the processor: float32 results depend on it
    with gzip.open(quick_run, "rt") as fh:
        records = [json.loads(line) for line in fh]
    assert numbers_sha256(records) == side["numbers_sha256"]
    rec = records[0]
    assert {"prompt", "response", "reward", "n_terms", "prompt_id", "sample"} <= set(rec)
    assert len(rec["logp"]) == len(rec["response"])
    assert 0.0 < sequence_weights(batch).gspo_clip_frac <= 1.0
    assert analyze_data(quick_run, n_boot=50).n_sequences == 48


@needs_torch
def test_rerun_from_the_sidecar_reproduces_the_numbers(quick_run, tmp_path, capsys):
    """A rerun from the sidecar's settings reproduces the data set exactly."""
    again = tmp_path / "again.jsonl.gz"
    args = ["experiment", "run", "--quiet", "--settings", str(sidecar_path(quick_run)), "--out", str(again)]
    assert main(args) == 0
    assert "wrote 48 sequences" in capsys.readouterr().out
    cmp = compare_files(quick_run, again)
    assert cmp["same_ids"]
    assert cmp["same_lengths"]
    assert cmp["max_abs_diff"] == 0.0
    assert (
        read_sidecar(sidecar_path(again))["numbers_sha256"]
        == read_sidecar(sidecar_path(quick_run))["numbers_sha256"]
    )


@needs_torch
def test_another_seed_gives_other_numbers(quick_run, tmp_path):
    """Another seed gives another numbers hash."""
    from variance_lab.experiment.collect import run_arith_experiment
    from variance_lab.experiment.train import ARITH_QUICK

    side = run_arith_experiment(replace(ARITH_QUICK, seed=4), tmp_path / "other.npz")
    assert side["numbers_sha256"] != read_sidecar(sidecar_path(quick_run))["numbers_sha256"]
    assert load_batch(tmp_path / "other.npz").n_tokens == side["summary"]["n_tokens"]


@needs_torch
def test_run_restores_torch_settings(torch_mod, tmp_path):
    """``deterministic_torch`` sets one thread and deterministic algorithms, then restores both."""
    from variance_lab.provenance import deterministic_torch

    before = torch_mod.get_num_threads(), torch_mod.are_deterministic_algorithms_enabled()
    with deterministic_torch(1):
        assert torch_mod.get_num_threads() == 1
        assert torch_mod.are_deterministic_algorithms_enabled()
    assert (torch_mod.get_num_threads(), torch_mod.are_deterministic_algorithms_enabled()) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "bogus=1"], "unknown setting"),
        (["--set", "sft_steps=x"], "expected an integer"),
        (["--set", "sft_steps"], "expected KEY=VALUE"),
        (["--set", "threads=0"], "out of range"),
        (["--out", "x.csv"], "must end in"),
        (["--out", "no/such/folder/x.jsonl"], "does not exist"),
        (["--settings", "missing.json"], "cannot read settings"),
        (["--settings", "s.json"], "exclude each other"),
    ],
)
def test_run_errors_are_one_line(args, message, capsys, monkeypatch, tmp_path):
    """Each bad ``experiment run`` option gives exit status 2 and one stderr line naming it."""
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text("{}")
    both = args == ["--settings", "s.json"]
    argv = ["experiment", "run", *args] + (["--quick"] if both else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_without_torch_the_run_names_the_extra(monkeypatch, capsys):
    """Without PyTorch, ``experiment run`` is one stderr line naming the extra to install."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert main(["experiment", "run", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'variance_lab[experiment]'" in err
    assert err.count("\n") == 1


# --------------------------------------------------------------------------------------
# --settings: a warning when the sidecar's versions or processor differ from this run's
# --------------------------------------------------------------------------------------
HERE = {
    "variance_lab": "0.2.0",
    "torch": "2.13.0+cpu",
    "numpy": "2.4.6",
    "python": "3.11.7",
    "machine": "x86_64",
    "cpu": "Intel(R) Xeon(R) Processor",
    "cpu_capability": "AVX512",
}


def test_equal_versions_give_no_difference():
    """The same versions give no difference and no warning; variance_lab's own version is not compared."""
    assert version_differences(dict(HERE), HERE) == []
    assert version_warning({**HERE, "variance_lab": "0.1.0"}, HERE, "s.json") is None


def test_a_differing_cpu_and_torch_are_both_named_with_both_values():
    """Each differing key comes as 'key: sidecar value -> this run's value', in key order."""
    there = {**HERE, "torch": "2.3.0", "cpu": "AMD EPYC 9654 96-Core Processor"}
    assert version_differences(there, HERE) == [
        "torch: 2.3.0 -> 2.13.0+cpu",
        "cpu: AMD EPYC 9654 96-Core Processor -> Intel(R) Xeon(R) Processor",
    ]
    message = version_warning(there, HERE, "data/x.json")
    assert message.startswith("warning: data/x.json was written with other versions")
    assert "(torch: 2.3.0 -> 2.13.0+cpu; cpu: AMD EPYC 9654 96-Core Processor -> " in message
    assert message.endswith("this data set will likely differ from the sidecar's")
    assert "\n" not in message


def test_keys_an_older_sidecar_lacks_are_not_recorded():
    """A sidecar older than cpu/cpu_capability: those are 'not recorded', and the data 'may' differ."""
    old = {k: v for k, v in HERE.items() if k not in ("cpu", "cpu_capability")}
    assert version_differences(old, HERE) == [
        "cpu: not recorded -> Intel(R) Xeon(R) Processor",
        "cpu_capability: not recorded -> AVX512",
    ]
    message = version_warning(old, HERE, "s.json")
    assert message.startswith("warning: s.json does not record all that this run's float32 numbers depend on")
    assert message.endswith("this data set may differ from the sidecar's")
    # a recorded difference besides them: 'will likely'
    assert "will likely differ" in version_warning({**old, "numpy": "1.26.4"}, HERE, "s.json")
    # a key neither side has is skipped; one this run lacks is 'unknown'
    assert version_differences({"torch": "2.3.0"}, {}, keys=("torch", "cpu")) == ["torch: 2.3.0 -> unknown"]
    assert version_differences({"cpu": ""}, {"cpu": "x"}, keys=("cpu",)) == ["cpu: '' -> x"]


@pytest.mark.parametrize("bad", [None, "2.3.0", ["torch"]])
def test_version_differences_refuse_a_non_dict(bad):
    """Versions that are not a dict raise a ValueError naming them."""
    with pytest.raises(ValueError, match=re.escape(f"recorded versions must be a dict, got {bad!r}")):
        version_differences(bad, HERE)


def _fake_run(calls):
    def run(settings, out, *, progress=None):
        calls.append(settings)
        timing = {"total": 1.0, "sft": 0.5, "pg": 0.25, "collect": 0.25}
        summary = {"n_sequences": 1, "n_tokens": 8, "length_min": 8, "length_max": 8, "mean_reward": 1.0}
        return {"summary": summary, "training": {"timing_s": timing}, "paths": [str(out), "side.json"]}

    return run


@pytest.mark.parametrize("change", ["other", "same", "plain settings"])
def test_run_from_a_sidecar_warns_when_its_versions_differ(change, torch_mod, monkeypatch, tmp_path, capsys):
    """``run --settings --quiet``: one stderr warning naming the differing keys, then the run, exit 0."""
    from variance_lab.experiment import collect
    from variance_lab.experiment.train import ARITH_QUICK

    calls = []
    # no training: only the warning path
    monkeypatch.setattr(collect, "run_arith_experiment", _fake_run(calls))
    here = versions(TORCH_VERSIONS)
    there = {**here, "torch": "0.0.0-test", "cpu": "Imaginary CPU"} if change == "other" else here
    side = {"settings": ARITH_QUICK.to_dict()}
    if change != "plain settings":
        side = {"kind": "variance_lab.experiment rollouts", **side, "versions": there}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(side))
    argv = ["experiment", "run", "--quiet", "--settings", str(path), "--out", str(tmp_path / "x.jsonl.gz")]
    assert main(argv) == 0
    assert calls == [ARITH_QUICK]  # the run went ahead with the sidecar's settings
    err = capsys.readouterr().err
    if change != "other":
        assert err == ""
        return
    assert err.count("\n") == 1
    assert err.startswith(f"variance-lab: warning: {path} was written with other versions")
    assert f"torch: 0.0.0-test -> {here['torch']}" in err
    assert f"cpu: Imaginary CPU -> {here['cpu']}" in err
    assert "numpy" not in err
    assert "will likely differ from the sidecar's" in err


def test_run_refuses_a_sidecar_whose_versions_are_not_an_object(torch_mod, monkeypatch, tmp_path, capsys):
    """A sidecar whose versions are not a JSON object: one stderr line naming the file, exit 2."""
    from variance_lab.experiment import collect
    from variance_lab.experiment.train import ARITH_QUICK

    calls = []
    monkeypatch.setattr(collect, "run_arith_experiment", _fake_run(calls))
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"settings": ARITH_QUICK.to_dict(), "versions": "2.3.0"}))
    assert main(["experiment", "run", "--settings", str(path), "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert f"--settings {str(path)!r}: 'versions' must be a JSON object, got '2.3.0'" in err
    assert err.count("\n") == 1
    assert calls == []


# --------------------------------------------------------------------------------------
# the shipped data set and its figure (no PyTorch)
# --------------------------------------------------------------------------------------
def test_shipped_data_set_is_valid_and_matches_its_sidecar():
    """The shipped data set loads cleanly, matches its sidecar's hash and rewards, under 4 MB."""
    side = read_sidecar(SHIPPED_SIDECAR)
    assert side["quick"] is False
    assert side["seed"] == side["settings"]["seed"]
    assert DEFAULT_DATA.stat().st_size < 4e6
    with gzip.open(DEFAULT_DATA, "rt") as fh:
        records = [json.loads(line) for line in fh]
    assert numbers_sha256(records) == side["numbers_sha256"]
    batch = load_batch(DEFAULT_DATA)
    assert batch.n_dropped == 0
    assert len(batch) == side["summary"]["n_sequences"]
    assert batch.lengths.min() < 16
    assert batch.lengths.max() > 256  # a handful to a few hundred tokens
    for rec in records[:50]:
        assert (
            task.arith_reward(task.Problem(tuple(int(c) for c in rec["prompt"][1:-1:2])), rec["response"])
            == rec["reward"]
        )


def test_analysis_of_the_shipped_data_and_its_figure(tmp_path):
    """The shipped data's figure writes its five files, with findings and a finite bucket table."""
    paths = save_experiment_figure(tmp_path, n_boot=200)
    assert [p.name for p in paths] == [
        f"{FIGURE_NAME}.pdf",
        f"{FIGURE_NAME}.png",
        f"{FIGURE_NAME}.csv",
        f"{FIGURE_NAME}_curves.csv",
        f"{FIGURE_NAME}.json",
    ]
    side = json.loads(paths[-1].read_text())
    assert side["findings"]["by_class"]["end"]["fraction"] > 0
    assert set(side["findings"]["by_reward"]) == {"0", "1"}
    assert side["data_set"]["numbers_sha256"] == read_sidecar(SHIPPED_SIDECAR)["numbers_sha256"]
    assert side["analysis"]["n_sequences"] == read_sidecar(SHIPPED_SIDECAR)["summary"]["n_sequences"]
    table = __import__("pandas").read_csv(paths[2])
    assert len(table) >= 5
    assert (table["n_seq"] > 20).all()
    assert (table["var_G"] > 0).all()
    assert np.isfinite(table["log10_var_P"]).all()


def test_resampled_clip_matches_iid_data_and_findings_count_tails():
    """On i.i.d. data the resampled clip fraction matches the observed one; findings count tails."""
    rng = np.random.default_rng(8)
    lengths = np.repeat([4, 40, 400], 300)
    d = [rng.normal(0.0, 1e-3, t) for t in lengths]
    batch = TokenBatch.from_ragged([np.minimum(x - 0.5, 0.0) for x in d], [np.full(x.size, -0.5) for x in d])
    observed = [sequence_weights(batch).clipped_gspo[lengths == t].mean() for t in (4, 40, 400)]
    np.testing.assert_allclose(resampled_clip(batch, n_rep=50, edges=[1, 10, 100, 1000]), observed, atol=0.06)
    found = token_findings(batch)
    assert abs(found["kurtosis"] - 3.0) < 0.2
    assert found["tail_tokens"]["fraction"] < 1e-3
    assert 0.01 < found["top_sequences"]["1%"] < found["top_sequences"]["10%"] < 1.0


def test_committed_figure_belongs_to_the_shipped_data():
    """The committed experiment figure's sidecar names the shipped data set and its files exist."""
    side = json.loads((FIGURES / f"{FIGURE_NAME}.json").read_text())
    assert side["data_set"]["numbers_sha256"] == read_sidecar(SHIPPED_SIDECAR)["numbers_sha256"]
    for name in side["files"].values():
        assert (FIGURES / name).is_file()


def test_figure_command_without_its_data_is_exit_status_2(tmp_path, capsys):
    """``experiment figure`` on a missing data file: one line, exit status 2, nothing written."""
    out = tmp_path / "o"
    assert main(["experiment", "figure", "--data", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "none.jsonl" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_figure_command(tmp_path, capsys):
    """``experiment figure`` writes five files; a missing data file is exit status 2.

    On the first 640 sequences (160 prompts) of the shipped data set, copied with its sidecar
    (about 38 s; save_experiment_figure itself, on all of the shipped data, is checked by
    test_analysis_of_the_shipped_data_and_its_figure in the default run).
    """
    subset = tmp_path / "data" / DEFAULT_DATA.name
    subset.parent.mkdir()
    with gzip.open(DEFAULT_DATA, "rt") as src, gzip.open(subset, "wt") as dst:
        for _, line in zip(range(640), src, strict=False):
            dst.write(line)
    shutil.copyfile(SHIPPED_SIDECAR, sidecar_path(subset))
    out = tmp_path / "out"
    assert main(["experiment", "figure", "--data", str(subset), "--out", str(out), "--n-boot", "20"]) == 0
    assert "wrote 5 files" in capsys.readouterr().out
    assert main(["experiment", "figure", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2


# --------------------------------------------------------------------------------------
# the shipped data set regenerated from its recorded seed and settings
# --------------------------------------------------------------------------------------
#: float32 rounding, relative: a few units of float32's epsilon (2**-23).
FLOAT32_ROUNDING = 8 * 2.0**-23


def _sft_losses(side: dict, steps: int) -> dict[int, float]:
    """Return the SFT losses a sidecar's settings log in their first ``steps`` steps, computed here."""
    from variance_lab.experiment.model import TinyGPT
    from variance_lab.experiment.train import Settings, sft, streams
    from variance_lab.provenance import deterministic_torch, torch_generator

    settings = Settings.from_dict(side["settings"])
    ss = streams(settings.seed)
    with deterministic_torch(settings.threads):
        model = TinyGPT(settings.model_config(), torch_generator(ss["init"]))
        log = sft(model, settings, np.random.default_rng(ss["sft"]), steps=steps)
    return {row["step"]: row["loss"] for row in log}


#: SFT steps the processor probe of :func:`_cannot_reproduce` trains (the log has every tenth).
PROBE_STEPS = 51


def _cannot_reproduce(side: dict, name: str) -> str | None:
    """Return why this machine cannot reproduce a sidecar's data set bit for bit, or None.

    Another torch version, or another processor (``cpu``, ``cpu_capability``), computes other
    last bits in float32, and training amplifies them into other samples. A sidecar written
    before sidecars named the processor (the shipped one) is probed instead: the first
    :data:`PROBE_STEPS` SFT steps must give its logged loss at step 0 to float32 rounding (a code
    change fails here), and at the first logged step where the loss differs it must differ by
    float32 rounding only (a code change would not), which means other arithmetic. (On one AMD
    EPYC the losses agreed to the bit up to step 10 and first differed at step 20, by one unit
    in the last place.)
    """
    here, there = versions(TORCH_VERSIONS), side["versions"]
    for key in ("torch", "cpu", "cpu_capability"):
        if key in there and there[key] != here[key]:
            return f"{name} was written with {key} {there[key]!r}; this machine has {here[key]!r}"
    if "cpu" in there:
        return None
    logged = {row["step"]: row["loss"] for row in side["training"]["sft"]}
    got = _sft_losses(side, PROBE_STEPS)
    assert got[0] == pytest.approx(logged[0], rel=FLOAT32_ROUNDING, abs=0)
    differ = [step for step in sorted(got) if step in logged and got[step] != logged[step]]
    if not differ:
        return None
    first = differ[0]
    # off by more than rounding where they first differ: a code change, not the processor
    assert got[first] == pytest.approx(logged[first], rel=FLOAT32_ROUNDING, abs=0)
    return (
        f"this processor's float32 arithmetic differs from the one that wrote {name} "
        f"(SFT loss at step {first}: {got[first]!r} here, {logged[first]!r} in its sidecar, the steps "
        "before equal), so training diverges; the data set reproduces only on the processor type "
        "that wrote it, which its sidecar (older than the cpu field) does not name"
    )


@needs_torch
def test_shipped_settings_start_at_the_shipped_sft_loss(torch_mod):
    """The shipped settings' first SFT loss (init, problems, forward pass) is the shipped log's."""
    side = read_sidecar(SHIPPED_SIDECAR)
    loss = _sft_losses(side, 1)[0]
    assert loss == pytest.approx(side["training"]["sft"][0]["loss"], rel=FLOAT32_ROUNDING, abs=0)


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("data", [DEFAULT_DATA, BF16_DATA], ids=["float32", "bfloat16"])
def test_shipped_training_log_reproduces(data):
    """Training from a shipped sidecar's settings logs its numbers: SFT losses, evaluations, GSPO.

    The two shipped data sets were written on different processors (the same code trains
    both: their settings differ only in the sampler), so on either kind one of them runs.
    """
    side = read_sidecar(sidecar_path(data))
    reason = _cannot_reproduce(side, data.name)
    if reason is not None:
        pytest.skip(reason)
    from variance_lab.experiment.train import Settings, train
    from variance_lab.provenance import deterministic_torch

    settings = Settings.from_dict(side["settings"])
    with deterministic_torch(settings.threads):
        log = train(settings).log
    for key in ("sft", "eval_after_sft", "pg", "eval_after_pg"):
        assert json.loads(json.dumps(log[key])) == side["training"][key], key


@pytest.mark.slow
@needs_torch
def test_shipped_data_set_reproduces_from_its_sidecar(tmp_path):
    """A full run from the shipped sidecar reproduces the shipped data set to 1e-9.

    Needs the torch version and processor type that wrote it (bit-identical float32
    kernels); the run sets the sidecar's thread count. Skipped, with the reason, elsewhere.
    """
    reason = _cannot_reproduce(read_sidecar(SHIPPED_SIDECAR), DEFAULT_DATA.name)
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / DEFAULT_DATA.name
    assert main(["experiment", "run", "--quiet", "--settings", str(SHIPPED_SIDECAR), "--out", str(out)]) == 0
    cmp = compare_files(DEFAULT_DATA, out)
    assert cmp["same_ids"]
    assert cmp["same_lengths"]
    assert cmp["max_abs_diff"] <= 1e-9 or cmp["max_rel_diff"] <= 1e-9, cmp


# --------------------------------------------------------------------------------------
# controlled mismatch: a bfloat16 sampler and its rollout_logp
# --------------------------------------------------------------------------------------
def test_sampler_log_probs_of_a_float64_model_are_its_scores(torch_mod):
    """A float64 sampler's log-probs equal the model's scores, and a temperature changes them."""
    from variance_lab.experiment.model import sampler_log_probs, score_responses

    model = _tiny_model(torch_mod).double()
    prompts = [task.encode("1+2="), task.encode("3+4+5=")]
    responses = [[5, 6, 7], [8, 9]]
    got = sampler_log_probs(model, prompts, responses).numpy()
    ref = score_responses(model, prompts, responses).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    hot = sampler_log_probs(model, prompts, responses, temperature=2.0).numpy()
    assert not np.allclose(hot[0, :3], ref[0, :3])  # the temperature enters


def test_settings_reject_an_unknown_sampler_dtype():
    """Settings refuse a sampler_dtype outside float32 and bfloat16."""
    from variance_lab.experiment.train import ARITH_QUICK

    with pytest.raises(ValueError, match="sampler_dtype must be one of float32, bfloat16, got 'fp8'"):
        replace(ARITH_QUICK, sampler_dtype="fp8")


@pytest.mark.parametrize("steps", [0, -1, 2.0, True, "3", 10**9])
def test_sft_rejects_a_bad_number_of_steps(steps, torch_mod):
    """sft(steps=) takes an integer from 1 to the schedule's sft_steps, else a ValueError naming it."""
    from variance_lab.experiment.train import ARITH_QUICK, sft

    with pytest.raises(ValueError, match=f"got {steps!r}"):
        sft(None, ARITH_QUICK, np.random.default_rng(0), steps=steps)


def test_bfloat16_sampler_records_rollout_logp(torch_mod, tmp_path):
    """A bfloat16 sampler run records small nonzero mismatches in rollout_logp and its sidecar."""
    out = tmp_path / "bf16.jsonl.gz"
    argv = ["experiment", "run", "--quick", "--quiet", "--seed", "3", "--set", "sampler_dtype=bfloat16"]
    assert main([*argv, "--out", str(out)]) == 0
    batch = load_batch(out)
    assert batch.has_rollout
    mis = batch.mismatch_log_ratio
    # bfloat16 keeps 8 bits of mantissa: the sampler's log-probs differ from float64 ones, a little
    assert 0 < np.abs(mis).max() < 0.5
    assert np.count_nonzero(mis) > 0.5 * mis.size
    side = read_sidecar(sidecar_path(out))
    assert side["settings"]["sampler_dtype"] == "bfloat16"
    assert "rollout_logp" in side["fields"]
    assert side["summary"]["var_mismatch_log_ratio"] == pytest.approx(mis.var(ddof=1), rel=1e-9)


# --------------------------------------------------------------------------------------
# the experiment figure's drawing (issue #25, item 4)
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_analysis():
    """Return the committed figure's per-bucket table and prediction curves (as the analysis wrote them)."""
    import pandas as pd

    return (
        pd.read_csv(FIGURES / f"{FIGURE_NAME}.csv"),
        pd.read_csv(FIGURES / f"{FIGURE_NAME}_curves.csv"),
    )


def _figure(small_analysis, **kw):
    import matplotlib

    matplotlib.use("Agg")
    from variance_lab.experiment.figure import experiment_figure

    table, curves = small_analysis
    return experiment_figure(table, curves, **kw)


def test_clip_panel_draws_the_observed_intervals(small_analysis):
    """The clip panel's observed points carry the table's gspo_clip_frac_lo/hi as vertical bars."""
    import matplotlib.pyplot as plt

    table = small_analysis[0]
    fig = _figure(small_analysis)
    try:
        clip_ax = fig.axes[2]
        bars = [c for c in clip_ax.containers if getattr(c, "has_yerr", False)]
        assert len(bars) == 1
        assert bars[0].has_xerr
        segments = bars[0].lines[2][-1].get_segments()  # the vertical bars, one per bucket
        ends = np.array([[seg[:, 1].min(), seg[:, 1].max()] for seg in segments])
        np.testing.assert_allclose(ends[:, 0], table["gspo_clip_frac_lo"], rtol=1e-12)
        np.testing.assert_allclose(ends[:, 1], table["gspo_clip_frac_hi"], rtol=1e-12)
        assert (ends[:, 1] > ends[:, 0]).all()
    finally:
        plt.close(fig)


def test_legend_and_panels_say_the_same_spread_and_the_interval_level(small_analysis):
    """No legend entry promises a spread ("within 10 %") the panels contradict; the level is named."""
    import matplotlib.pyplot as plt

    fig = _figure(small_analysis, level=0.9)
    try:
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert not any("within" in lab for lab in labels)
        assert any(lab.startswith("observed per bucket with its 90 % interval") for lab in labels)
        notes = [t.get_text() for ax in fig.axes for t in ax.texts]
        for note in notes:  # where the predictions are one line, the panel gives their spread
            assert re.fullmatch(r"the three predictions differ by at most \d+\.\d %", note)
        if any(lab.startswith("all three predictions") for lab in labels):
            assert notes
            assert "spread is given in each panel" in next(lab for lab in labels if "all three" in lab)
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"pg_iters": 4}, "the last of 4 GSPO iterations"),
        ({"pg_iters": 1}, "its one GSPO iteration"),
        (None, "its last GSPO step"),
    ],
)
def test_title_names_the_gspo_iteration_of_the_data(settings, expected):
    """The title says which GSPO iteration the ratios come from: the data set's last (four shipped)."""
    from variance_lab.experiment.figure import experiment_title

    title = experiment_title(settings)
    assert expected in title
    assert "one GSPO step" not in title


def test_shipped_figure_title_counts_the_shipped_iterations(small_analysis):
    """The shipped data set ran four GSPO iterations; the title drawn from its settings says so."""
    import matplotlib.pyplot as plt

    from variance_lab.experiment.figure import experiment_title

    iters = read_sidecar(SHIPPED_SIDECAR)["settings"]["pg_iters"]
    assert iters == 4
    fig = _figure(small_analysis, title=experiment_title(read_sidecar(SHIPPED_SIDECAR)["settings"]))
    try:
        assert "the last of 4 GSPO iterations" in fig.get_suptitle()
    finally:
        plt.close(fig)
