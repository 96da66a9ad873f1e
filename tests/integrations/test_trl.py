"""TRL capture: a stand-in of TRL's shapes and flow (no TRL), and a real GRPOTrainer run where TRL is.

The stand-in copies what the mixin relies on in ``trl/trainer/grpo_trainer.py`` of TRL 1.16.0:
``_prepare_inputs`` generates every ``steps_per_generation * num_iterations`` micro-steps, shuffles
the batch's rows and splits them into ``steps_per_generation`` slices (lines 1538-1546); the loss
(``_compute_loss``) computes the slice's log-probs with ``_get_per_token_logps_and_entropies``
(line 3030); ``global_step`` rises after each ``gradient_accumulation_steps`` micro-steps, and the
step's log carries the new value.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from variance_lab.integrations.recorder import ParquetRecorder
from variance_lab.integrations.trl import CaptureLogProbs, record_trl_batch, trl_prompt_ids
from variance_lab.rollouts.io import load_batch


def _table(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()


def _capture_note(path) -> dict:
    import pyarrow.parquet as pq

    return json.loads(pq.read_schema(path).metadata[b"variance_lab.capture"])


def _logps(completion_ids):
    """Return the stand-in policy's token log-probs: a fixed function of the token ids (row order visible)."""
    return -0.01 * (1.0 + np.asarray(completion_ids, dtype=np.float64))


class _StandInGRPOTrainer:
    """TRL's flow around the mixin's hooks, on NumPy arrays; ``old`` says whether batches hold pi_old."""

    def __init__(
        self,
        *,
        per_device=4,
        num_generations=2,
        grad_accum=1,
        steps_per_generation=1,
        old=False,
        vllm=False,
        seed=0,
        out=None,
    ):
        self.num_generations = num_generations
        self.out = out or (lambda name, a: a)  # how the batch holds each array (torch tensors in a test)
        self.args = SimpleNamespace(
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=grad_accum,
            steps_per_generation=steps_per_generation,
        )
        self.old = old or vllm  # with vLLM's correction TRL always computes pi_old
        self.vllm = vllm
        self.rng = np.random.default_rng(seed)
        self.state = SimpleNamespace(global_step=0)
        self.model = SimpleNamespace(training=True)
        self.accelerator = SimpleNamespace(process_index=0)
        self.generated = []  # each generation batch, in generation order
        self.logged_steps = []
        self._step = 0
        self._buffered = None
        self._next_id = 0

    def _generate_and_score_completions(self, inputs):
        b = self.args.per_device_train_batch_size * self.args.steps_per_generation
        c = 5
        ids = self._next_id + np.arange(b * c).reshape(b, c)
        self._next_id += b * c
        lengths = self.rng.integers(1, c + 1, size=b)
        out = {
            "completion_ids": ids,
            "completion_mask": (np.arange(c) < lengths[:, None]).astype(np.int64),
            "advantages": self.rng.normal(size=b),
            "num_items_in_batch": int(lengths.sum()),
        }
        if self.old:
            out["old_per_token_logps"] = _logps(ids)
        if self.vllm:
            out["sampling_per_token_logps"] = _logps(ids) - 0.002
        self.generated.append({k: v for k, v in out.items()})
        return {k: self.out(k, v) if isinstance(v, np.ndarray) else v for k, v in out.items()}

    def _prepare_inputs(self):
        spg = self.args.steps_per_generation
        if self._step % spg == 0 or self._buffered is None:
            batch = self._generate_and_score_completions(None)
            perm = self.rng.permutation(len(batch["completion_ids"]))
            batch = {k: v[perm] if hasattr(v, "shape") else v for k, v in batch.items()}
            n = len(perm) // spg
            self._buffered = [
                {k: v[i * n : (i + 1) * n] if hasattr(v, "shape") else v for k, v in batch.items()}
                for i in range(spg)
            ]
        return self._buffered[self._step % spg]

    def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
        return self.out("per_token_logps", _logps(np.asarray(input_ids))), None, None

    def _compute_loss(self, model, inputs):
        per_token_logps, _, _ = self._get_per_token_logps_and_entropies(model, inputs["completion_ids"])
        old = inputs.get("old_per_token_logps")
        old = per_token_logps if old is None else old
        return (per_token_logps - old).sum()

    def train(self, max_steps=2):
        self.state.global_step = 0  # a new TrainerState, as transformers makes for each train()
        for _ in range(max_steps):
            for _ in range(self.args.gradient_accumulation_steps):
                self._compute_loss(self.model, self._prepare_inputs())
                self._step += 1
            self.state.global_step += 1
            self.logged_steps.append(self.state.global_step)
        return "done"


class _Trainer(CaptureLogProbs, _StandInGRPOTrainer):
    pass


def test_prompt_ids_follow_trls_grouping_across_processes():
    """A process's rows get the prompt of their place in the gathered batch, grouped as TRL's view(-1, G)."""
    n_proc, per_proc, g = 3, 4, 3  # 12 rows, 4 prompts: groups straddle the processes
    gathered = np.arange(n_proc * per_proc).reshape(-1, g)  # TRL: rewards.view(-1, num_generations)
    prompt_of_row = np.repeat(np.arange(gathered.shape[0]), g)
    for p in range(n_proc):
        ids = trl_prompt_ids(per_proc, g, generation=7, process_index=p)
        expected = [f"7-{k}" for k in prompt_of_row[p * per_proc : (p + 1) * per_proc]]
        assert ids.tolist() == expected
    assert trl_prompt_ids(4, 2).tolist() == ["0-0", "0-0", "0-1", "0-1"]
    with pytest.raises(ValueError, match="num_generations must be an integer >= 1, got 0"):
        trl_prompt_ids(4, 0)
    with pytest.raises(ValueError, match="process_index must be an integer >= 0, got -1"):
        trl_prompt_ids(4, 2, process_index=-1)


@pytest.mark.parametrize(("grad_accum", "steps_per_generation"), [(1, 1), (2, 2), (4, 2)])
def test_defaults_record_the_loss_log_probs_in_generation_order(tmp_path, grad_accum, steps_per_generation):
    """No old_per_token_logps (TRL's defaults): the loss's log-probs are recorded, in generation order.

    The stand-in shuffles each batch and splits it over micro-steps as TRL does; every row must come
    back to its place, with its mask, advantage, group and the step TRL logs it under.
    """
    path = tmp_path / "trl.parquet"
    trainer = _Trainer(
        capture_path=path, per_device=2, grad_accum=grad_accum, steps_per_generation=steps_per_generation
    )
    assert trainer.train(max_steps=3) == "done"
    gens = trainer.generated
    assert len(gens) == 3 * grad_accum // steps_per_generation
    rows = 2 * steps_per_generation
    table = _table(path)
    gens_per_step = grad_accum // steps_per_generation
    assert table["step"] == [1 + k // gens_per_step for k in range(len(gens)) for _ in range(rows)]
    assert set(table["step"]) == set(trainer.logged_steps)
    assert table["prompt_id"] == [f"{k}-{i // 2}" for k in range(len(gens)) for i in range(rows)]
    batch = load_batch(path)
    masks = np.concatenate([gen["completion_mask"] for gen in gens]) == 1
    expected = np.concatenate([_logps(gen["completion_ids"]) for gen in gens])[masks]
    np.testing.assert_array_equal(batch.logp, expected)
    np.testing.assert_array_equal(batch.old_logp, expected)  # the update ratio is 1 by construction
    first_adv = [a[0] for a in table["advantages"]]
    np.testing.assert_array_equal(first_adv, np.concatenate([gen["advantages"] for gen in gens]))
    assert batch.has_groups
    note = _capture_note(path)
    assert note["old_logp"].startswith("the loss's per_token_logps")
    assert "by construction" in note["update_ratio"]
    (missing,) = note["missing"]  # pi_theta is pi_old here: only the engine's log-probs are missing
    assert missing.startswith("rollout_logp")
    assert note["num_generations"] == 2


@pytest.mark.parametrize("vllm", [False, True])
def test_batches_with_old_logps_are_recorded_at_generation(tmp_path, vllm):
    """With old_per_token_logps (num_iterations > 1, vLLM): recorded as generated, step = global_step + 1."""
    path = tmp_path / "trl.parquet"
    trainer = _Trainer(capture_path=path, per_device=4, grad_accum=1, old=True, vllm=vllm)
    trainer.train(max_steps=2)
    table = _table(path)
    assert table["step"] == [1] * 4 + [2] * 4
    assert table["prompt_id"] == ["0-0", "0-0", "0-1", "0-1", "1-0", "1-0", "1-1", "1-1"]
    gens = trainer.generated
    masks = np.concatenate([gen["completion_mask"] for gen in gens]) == 1
    np.testing.assert_array_equal(
        load_batch(path).logp, np.concatenate([gen["old_per_token_logps"] for gen in gens])[masks]
    )
    note = _capture_note(path)
    assert note["old_logp"] == "old_per_token_logps of the generation batch"
    assert note["missing"][0].startswith("rollout_logp") != vllm
    if vllm:
        mismatch = load_batch(path).mismatch_log_ratio
        np.testing.assert_allclose(mismatch, 0.002, rtol=1e-9)


@pytest.mark.parametrize("old", [False, True])
def test_a_second_train_appends_to_the_file(tmp_path, old):
    """train() twice: one complete file with both runs' rows, ids counting on, groups never shared."""
    path = tmp_path / "trl.parquet"
    trainer = _Trainer(capture_path=path, per_device=4, old=old)
    trainer.train(max_steps=2)
    first = _table(path)
    trainer.train(max_steps=1)
    table = _table(path)
    assert table["id"] == list(range(12))
    assert table["step"] == [1] * 4 + [2] * 4 + [1] * 4  # TRL counts steps from 1 again
    assert {k: v[:8] for k, v in table.items()} == first
    assert len(set(table["prompt_id"])) == 6
    assert len(load_batch(path)) == 12
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_batch_left_half_trained_keeps_the_rows_the_loss_saw(tmp_path):
    """Training stopped inside a batch (an error in the loss): the rows seen are written, the file whole."""

    class Failing(_Trainer):
        calls = 0

        def _compute_loss(self, model, inputs):
            Failing.calls += 1
            if Failing.calls == 2:
                raise RuntimeError("out of memory")
            return super()._compute_loss(model, inputs)

    path = tmp_path / "trl.parquet"
    trainer = Failing(capture_path=path, per_device=2, grad_accum=2, steps_per_generation=2)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.train(max_steps=1)
    (gen,) = trainer.generated
    first_slice = trainer._buffered[0]["completion_ids"][:, 0]
    seen = np.flatnonzero(np.isin(gen["completion_ids"][:, 0], first_slice))  # rows in generation order
    table = _table(path)
    assert table["prompt_id"] == [f"0-{i // 2}" for i in seen]
    mask = gen["completion_mask"][seen] == 1
    np.testing.assert_array_equal(load_batch(path).logp, _logps(gen["completion_ids"][seen])[mask])


def test_evaluation_batches_are_not_recorded(tmp_path):
    """A batch generated with the model in eval mode leaves the file and the group count alone."""
    path = tmp_path / "trl.parquet"
    trainer = _Trainer(capture_path=path, per_device=2, old=True)
    trainer.model.training = False
    trainer._generate_and_score_completions(None)
    trainer.model.training = True
    trainer.train(max_steps=1)
    assert _table(path)["prompt_id"] == ["0-0", "0-0"]


def test_record_trl_batch_without_old_logps_says_where_they_are(tmp_path):
    """Called by hand on a batch without pi_old: one ValueError naming the file, the step and the mixin."""
    with ParquetRecorder(tmp_path / "t.parquet") as rec:
        with pytest.raises(
            ValueError, match=r"t\.parquet: step 3: the TRL batch has no 'old_per_token_logps'.*mixin"
        ):
            record_trl_batch(rec, {"completion_mask": np.ones((2, 3))}, step=3)
        assert rec.n_rows == 0


@pytest.mark.torch
@pytest.mark.parametrize("old", [False, True])
def test_torch_tensors_and_bfloat16_are_recorded_exactly(tmp_path, old):
    """Torch tensors (TRL's): the loss's float32 or the batch's bfloat16 values, as float64 exactly."""
    torch = pytest.importorskip("torch", reason="pip install torch")
    dtypes = {"old_per_token_logps": torch.bfloat16, "per_token_logps": torch.float32}

    def as_tensor(name, a):
        return torch.tensor(a, dtype=dtypes.get(name, torch.float64 if a.dtype.kind == "f" else torch.int64))

    path = tmp_path / "trl.parquet"
    trainer = _Trainer(
        capture_path=path, per_device=2, grad_accum=2, steps_per_generation=2, old=old, out=as_tensor
    )
    trainer.train(max_steps=2)
    gens = trainer.generated
    masks = np.concatenate([gen["completion_mask"] for gen in gens]) == 1
    rounded = dtypes["old_per_token_logps" if old else "per_token_logps"]
    expected = torch.cat([torch.tensor(_logps(g["completion_ids"]), dtype=rounded).double() for g in gens])
    batch = load_batch(path)
    np.testing.assert_array_equal(batch.logp, expected.numpy()[masks])
    assert not np.array_equal(batch.logp, np.concatenate([_logps(g["completion_ids"]) for g in gens])[masks])
    table = _table(path)
    assert table["advantages"][0] == [gens[0]["advantages"][0]] * len(table["advantages"][0])


def test_tool_mask_multiplies_the_completion_mask(tmp_path):
    """tool_mask (tool output inside a completion) is left out of the mask, as TRL's loss leaves it out."""
    path = tmp_path / "t.parquet"
    out = {
        "completion_mask": np.ones((2, 4), dtype=np.int64),
        "tool_mask": np.array([[1, 0, 1, 1], [1, 0, 1, 1]]),
        "old_per_token_logps": np.full((2, 4), -0.3),
    }
    with ParquetRecorder(path) as rec:
        record_trl_batch(rec, out, step=7)
        with pytest.raises(ValueError, match=r"step 8: tool_mask has shape \(2, 3\)"):
            record_trl_batch(rec, {**out, "tool_mask": np.ones((2, 3))}, step=8)
    np.testing.assert_array_equal(load_batch(path).positions, [0, 2, 3, 0, 2, 3])


def _tiny_grpo(tmp_path, capture_path, **config):
    """Return a real TRL GRPOTrainer on CPU (a 1-layer GPT-2, 14 tokens, 8 prompts) and what it scored.

    The reward function, called by TRL inside ``_generate_and_score_completions``, keeps what
    it sees (prompts, completion ids, rewards) and scores each completion with the model as it is
    then, independently of TRL (one forward pass per completion, prompt and completion unpadded).
    """
    torch = pytest.importorskip("torch", reason="pip install torch")
    trl = pytest.importorskip("trl", reason="pip install trl: the real GRPOTrainer run needs TRL")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("abcdefghij ")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(vocab),
            n_positions=32,
            n_embd=16,
            n_layer=1,
            n_head=2,
            **no_dropout,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=0,
        )
    )
    seen = []

    def reward(prompts, completion_ids, **kwargs):
        rewards = [float(sum(ids) % 7) for ids in completion_ids]
        with torch.no_grad():
            for prompt, ids, r in zip(prompts, completion_ids, rewards, strict=True):
                p = tokenizer(text=prompt)["input_ids"]
                logits = model(torch.tensor([p + list(ids)])).logits[0, len(p) - 1 : -1].double()
                logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
                seen.append({"prompt": prompt, "reward": r, "logp": logp.numpy()})
        return rewards

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
        max_completion_length=6, learning_rate=0.05, logging_steps=1, report_to=[], use_cpu=True,
        seed=0, save_strategy="no", **config,
    )  # fmt: skip

    class Trainer(CaptureLogProbs, trl.GRPOTrainer):
        pass

    prompts = ["abc", "def", "ghi", "jab", "cde", "fgh", "ija", "bcd"]  # one length: no prompt padding
    trainer = Trainer(
        model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer, capture_path=capture_path,
    )  # fmt: skip
    return trainer, seen


_TRL_DEPRECATIONS = (
    "ignore:`(is_)?gradient_checkpointing:FutureWarning"  # transformers 5.25, called by TRL 1.16
)


@pytest.mark.torch
@pytest.mark.filterwarnings(_TRL_DEPRECATIONS)
@pytest.mark.parametrize(
    ("config", "has_old"),
    [
        ({"gradient_accumulation_steps": 2, "max_steps": 2}, False),  # TRL's defaults: num_iterations=1
        ({"num_iterations": 2, "max_steps": 4}, True),  # old_per_token_logps in the batch
    ],
)
def test_a_real_grpo_trainer_run_is_captured(tmp_path, config, has_old):
    """TRL 1.16.0 on CPU: train() twice; the file holds TRL's groups, steps and log-probs of every batch.

    - groups: rows of one prompt_id answer one prompt, and the advantages in the file are TRL's
      group-normalised rewards (r - mean) / (std + 1e-4) over those rows;
    - steps: the file's steps are the steps of TRL's log that carry the batch's ``reward``;
    - log-probs: the recorded logp of every counted token equals the model's, scored independently
      when the batch was generated (to float32 rounding), so rows were not mixed up by TRL's shuffle;
    - a second train() appends to the same complete file.
    """
    path = tmp_path / "capture.parquet"
    trainer, seen = _tiny_grpo(tmp_path, path, **config)
    trainer.train()
    table = _table(path)
    logged = [h["step"] for h in trainer.state.log_history if "reward" in h]
    assert sorted(set(table["step"])) == logged
    assert len(table["id"]) == len(seen)
    batch = load_batch(path)
    assert batch.has_groups
    groups = {}
    for i, pid in enumerate(table["prompt_id"]):
        groups.setdefault(pid, []).append(i)
    assert all(len(rows) == 2 for rows in groups.values())
    for rows in groups.values():
        assert len({seen[i]["prompt"] for i in rows}) == 1
        r = np.array([seen[i]["reward"] for i in rows])
        adv = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
        np.testing.assert_allclose([table["advantages"][i][0] for i in rows], adv, rtol=1e-5, atol=1e-6)
    for i, row in enumerate(table["logp"]):
        np.testing.assert_allclose(row, seen[i]["logp"][: len(row)], rtol=0, atol=2e-6)
        assert len(row) == sum(table["mask"][i])  # completion tokens up to and including <eos>
    note = _capture_note(path)
    assert note["old_logp"].startswith("old_per_token_logps" if has_old else "the loss's per_token_logps")
    assert note["trl_version"] == "1.16.0"

    n_first = len(table["id"])
    trainer.args.max_steps = 1
    trainer.train()
    again, new = _table(path), trainer.args.generation_batch_size  # one generation batch more
    assert again["id"] == list(range(n_first + new))
    assert {k: v[:n_first] for k, v in again.items()} == table
    assert again["step"][n_first:] == [1] * new  # a new TrainerState: TRL's log counts from 1 again
    assert not set(again["prompt_id"][:n_first]) & set(again["prompt_id"][n_first:])
    assert len(seen) == n_first + new
