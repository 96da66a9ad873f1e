"""Seeded fuzz test of the readers: a mutated file loads or raises ValueError naming it, unpickling nothing.

Valid small files of each format the readers take (JSONL, ``.jsonl.gz``, Parquet, NPZ, a prime-rl
token export, a NeMo-RL dump, a slime ``.pt`` where torch is importable) are mutated with a seeded
:class:`numpy.random.Generator`: byte-level (truncation, flipped bytes, inserted nulls) and
structural (a field replaced by null, a wrong type, a huge integer, an id above int64, a non-finite
value, JSON nested 5,000 deep, a length mismatch, a pickled object inside an NPZ, an ``.npy`` named
``.npz``, a corrupt gzip stream, slime's sparse tensors and odd ``response_lengths``). Each file goes
through :func:`~variance_lab.rollouts.io.load_batch` (both ``on_bad``), through
:func:`~variance_lab.rollouts.presets.read_run` for the framework presets, and, for a subset, through
``variance-lab analyze`` in-process: exit status 0 or 2, one line on stderr when 2.

A pickled canary whose ``__reduce__`` makes a directory is planted in the pickle mutations: the
directory must never exist.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import pickle
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from variance_lab.cli import main
from variance_lab.rollouts.io import load_batch, write_records
from variance_lab.rollouts.presets import read_run

try:
    import torch
except ImportError:  # pragma: no cover - torch is in the dev extra
    torch = None

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # pragma: no cover - pyarrow is in the dev extra
    pa = pq = None

LIMIT_S = 20.0
DEEP = 5000


class Canary:
    """A pickled object whose unpickling makes the directory ``marker``: proof that it was loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):  # noqa: D105
        return (os.mkdir, (self.marker,))


# --------------------------------------------------------------------------------------
# valid files
# --------------------------------------------------------------------------------------
def _records(rng) -> list[dict]:
    recs = []
    for i in range(6):
        n = int(rng.integers(2, 5))
        logp = (-rng.exponential(0.5, n)).round(4).tolist()
        recs.append(
            {
                "id": i,
                "prompt_id": i // 2,
                "logp": logp,
                "old_logp": (np.array(logp) - 0.01).round(4).tolist(),
                "rollout_logp": (np.array(logp) - 0.02).round(4).tolist(),
                "mask": [0] + [1] * (n - 1),
            }
        )
    return recs


def _prime_records(rng) -> list[dict]:
    out = []
    for _ in range(3):
        cols = {k: [] for k in ("token_ids", "position_ids", "loss_mask", "advantages")}
        cols.update(trainer_logprobs=[], inference_logprobs=[])
        for _piece in range(2):
            n_prompt, n = 2, int(rng.integers(2, 4))
            lp = (-rng.exponential(0.5, n)).round(4).tolist()
            cols["token_ids"] += rng.integers(0, 1000, n_prompt + n).tolist()
            cols["position_ids"] += list(range(n_prompt + n))
            cols["loss_mask"] += [False] * n_prompt + [True] * n
            cols["advantages"] += [0.0] * n_prompt + [0.5] * n
            cols["trainer_logprobs"] += [0.0] * n_prompt + lp
            cols["inference_logprobs"] += [0.0] * n_prompt + [v - 0.01 for v in lp]
        out.append({"schema_version": 1, "step": 3, "rank": 0, **cols})
    return out


def _nemo_records(rng) -> list[dict]:
    out = []
    for i in range(6):
        n = int(rng.integers(3, 6))
        lp = (-rng.exponential(0.5, n)).round(4).tolist()
        out.append(
            {
                "idx": i // 2,
                "prev_logprobs": [[0.0, *lp[1:]]],
                "generation_logprobs": [[0.0, *[v - 0.01 for v in lp[1:]]]],
                "token_loss_mask": [[0] + [1] * (n - 1)],
                "advantages": [[0.5] * n],
                "token_ids": [rng.integers(0, 1000, n).tolist()],
            }
        )
    return out


def _slime_payload(rng) -> dict:
    samples = []
    for pos in range(4):
        n = int(rng.integers(2, 5))
        lp = torch.tensor((-rng.exponential(0.5, n)).tolist(), dtype=torch.float32)
        samples.append(
            {
                "sample_index": 10 + pos,
                "rollout_position": pos,
                "tokens": torch.arange(4 + n),
                "response_lengths": n,
                "log_probs": lp,
                "rollout_log_probs": (lp - 0.01).tolist(),
                "loss_masks": torch.ones(n, dtype=torch.int64),
                "advantages": torch.full((n,), 0.25),
            }
        )
    return {"format_version": 2, "rollout_id": 4, "rank": 0, "samples": samples}


# --------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------
def _bytes_mutation(rng, data: bytes) -> tuple[str, bytes]:
    kind = ("truncate", "flip", "nulls")[int(rng.integers(3))]
    if not data:
        return kind, data
    if kind == "truncate":
        return kind, data[: int(rng.integers(0, len(data)))]
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 8))):
        pos = int(rng.integers(len(buf)))
        if kind == "flip":
            buf[pos] ^= 1 << int(rng.integers(8))
        else:
            buf[pos : pos + int(rng.integers(1, 4))] = b"\x00" * int(rng.integers(1, 4))
    return kind, bytes(buf)


_DEEP_TOKEN = "__deep_nesting__"


def _json_values(rng) -> list:
    """Return the replacement values of a JSON mutation: nulls, wrong types, huge and non-finite numbers."""
    return [
        None,
        "x",
        True,
        {"a": 1},
        [],
        [[1.0]],
        10**400,
        -(10**400),
        2**64 + 5,
        -(2**63) - 1,
        math.nan,
        math.inf,
        -math.inf,
        1e308 * 10,
        -5e-324,
        [10**400, -0.5],
        [-(10**400)],
        [None, "x", True],
        [2**70],
        _DEEP_TOKEN,
        [[[-0.1]]],
        -0.0,
        1.5,
        int(rng.integers(-5, 5)),
    ]


def _mutate_json_records(rng, recs: list) -> tuple[str, list]:
    """Replace one field (or one list entry, or a whole record) by a hostile value, or resize a list."""
    recs = json.loads(json.dumps(recs))
    i = int(rng.integers(len(recs)))
    rec = recs[i]
    key = list(rec)[int(rng.integers(len(rec)))]
    choice = int(rng.integers(5))
    if choice == 0:  # length mismatch
        value = rec[key]
        target = value[0] if isinstance(value, list) and value and isinstance(value[0], list) else value
        if isinstance(target, list) and target:
            if rng.random() < 0.5:
                target.pop()
            else:
                target.append(target[-1])
        return f"resize {key}", recs
    values = _json_values(rng)
    new = values[int(rng.integers(len(values)))]
    if choice == 1 and isinstance(rec[key], list) and rec[key]:  # one entry of a list
        j = int(rng.integers(len(rec[key])))
        rec[key][j] = new
        return f"{key}[{j}] = {str(new)[:20]}", recs
    if choice == 2 and rng.random() < 0.2:
        recs[i] = new
        return f"record {i} = {str(new)[:20]}", recs
    if choice == 3 and rng.random() < 0.3:
        del rec[key]
        return f"del {key}", recs
    rec[key] = new
    return f"{key} = {str(new)[:20]}", recs


def _json_text(recs: list) -> str:
    deep = "[" * DEEP + "-0.5" + "]" * DEEP
    return "".join(json.dumps(r).replace(f'"{_DEEP_TOKEN}"', deep) + "\n" for r in recs)


def _write_json_family(rng, path: Path, recs: list) -> str:
    """Write a JSON Lines file (gzip when the name says so) of ``recs``, mutated; return what changed."""
    if rng.random() < 0.6:
        what, recs = _mutate_json_records(rng, recs)
        data = _json_text(recs).encode()
    else:
        what, data = _bytes_mutation(rng, _json_text(recs).encode())
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
        if rng.random() < 0.3:  # a corrupt gzip stream
            what2, data = _bytes_mutation(rng, data)
            what += f", gzip {what2}"
    path.write_bytes(data)
    return what


def _npz_arrays(rng, recs: list) -> dict:
    flat = rng.random() < 0.5
    tmp = {}
    lengths = np.array([len(r["logp"]) for r in recs])
    if flat:
        for f in ("logp", "old_logp", "rollout_logp", "mask"):
            tmp[f] = np.concatenate([np.asarray(r[f], dtype=np.float64) for r in recs])
        tmp["lengths"] = lengths
    else:
        width = int(lengths.max())
        for f in ("logp", "old_logp", "rollout_logp", "mask"):
            arr = np.zeros((len(recs), width))
            for i, r in enumerate(recs):
                arr[i, : len(r[f])] = r[f]
            tmp[f] = arr
        tmp["mask"][np.arange(width) >= lengths[:, None]] = 0
    tmp["id"] = np.arange(len(recs))
    tmp["prompt_id"] = np.arange(len(recs)) // 2
    return tmp


def _write_npz(rng, path: Path, recs: list, marker: Path) -> str:
    arrays = _npz_arrays(rng, recs)
    choice = int(rng.integers(7))
    key = list(arrays)[int(rng.integers(len(arrays)))]
    if choice == 0:  # a pickled object array inside
        arrays[key] = np.array([Canary(marker), 1], dtype=object)
        what = f"pickled {key}"
    elif choice == 1:  # an .npy file named .npz (plain, or holding a pickle)
        buf = io.BytesIO()
        obj = arrays["logp"] if rng.random() < 0.5 else np.array([Canary(marker)], dtype=object)
        np.save(buf, obj, allow_pickle=True)
        path.write_bytes(buf.getvalue())
        return f"npy named npz ({obj.dtype})"
    elif choice == 2:  # wrong dtype or shape
        options = [
            np.array(["a", "b"]),
            np.array([2**64 - 1, 5], dtype=np.uint64),
            np.array([1 + 2j]),
            np.zeros((2, 2, 2)),
            np.array(3.0),
            np.zeros(0),
            np.array([np.inf, np.nan]),
            np.array([True, False]),
        ]
        arrays[key] = options[int(rng.integers(len(options)))]
        what = f"{key} dtype {arrays[key].dtype} shape {arrays[key].shape}"
    elif choice == 3 and "lengths" in arrays:  # lengths that do not add up, negative or huge
        options = [
            arrays["lengths"] + 1,
            -arrays["lengths"],
            arrays["lengths"] * 10**12,
            arrays["lengths"][:-1],
        ]
        arrays["lengths"] = options[int(rng.integers(len(options)))]
        what = "lengths"
    elif choice == 4:
        del arrays[key]
        what = f"del {key}"
    else:
        what = "bytes"
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    if what == "bytes":
        what, data = _bytes_mutation(rng, data)
    path.write_bytes(data)
    return what


def _write_parquet(rng, path: Path, recs: list) -> str:
    if rng.random() < 0.5:
        what, recs = _mutate_json_records(rng, recs)
        recs = [r if isinstance(r, dict) else {"x": 1} for r in recs]
        cols = {k: [r.get(k) for r in recs] for k in dict.fromkeys(k for r in recs for k in r)}
        cols = {k: [None if v == _DEEP_TOKEN else v for v in col] for k, col in cols.items()}
        try:
            pq.write_table(pa.table(cols), path)
            return what
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass
    write_records(_records(rng), path)
    what, data = _bytes_mutation(rng, path.read_bytes())
    path.write_bytes(data)
    return what


def _mutate_slime(rng, payload: dict, marker: Path) -> str:
    s = payload["samples"][int(rng.integers(len(payload["samples"])))]
    key = list(s)[int(rng.integers(len(s)))]
    n = s["response_lengths"]
    options = [
        ("sparse", lambda: torch.tensor([-0.1] * 8).to_sparse()),
        ("[n]", lambda: [n]),
        ("tensor(n)", lambda: torch.tensor(n)),
        ("tensor([n])", lambda: torch.tensor([n])),
        ("inf", lambda: math.inf),
        ("nan", lambda: math.nan),
        ("2**70", lambda: 2**70),
        ("-1", lambda: -1),
        ("10**400", lambda: 10**400),
        ("None", lambda: None),
        ("str", lambda: "x"),
        ("2-D", lambda: torch.zeros(2, 2)),
        ("complex", lambda: torch.tensor([1 + 1j])),
        ("bool", lambda: True),
        ("empty", lambda: torch.zeros(0)),
        ("[None]", lambda: [None, -0.1]),
        ("nested", lambda: [[[-0.1]]]),
    ]
    if rng.random() < 0.5:
        key = ("response_lengths", "rollout_position", "log_probs", "loss_masks")[int(rng.integers(4))]
    name, make = options[int(rng.integers(len(options)))]
    s[key] = make()
    return f"{key} = {name}"


def _write_slime(rng, path: Path, marker: Path) -> str:
    payload = _slime_payload(rng)
    choice = rng.random()
    if choice < 0.1:
        payload["samples"][0]["log_probs"] = Canary(marker)
        what = "pickled object"
    elif choice < 0.2:
        payload = [payload] if rng.random() < 0.5 else {"format_version": 2, "samples": "x"}
        what = "not a dump"
    else:
        what = _mutate_slime(rng, payload, marker)
    torch.save(payload, path)
    if rng.random() < 0.25:
        what2, data = _bytes_mutation(rng, path.read_bytes())
        path.write_bytes(data)
        what += f", {what2}"
    return what


# --------------------------------------------------------------------------------------
# the harness
# --------------------------------------------------------------------------------------
FORMATS = ["jsonl", "jsonl.gz", "parquet", "npz", "prime-rl", "nemo-rl", "slime"]


def _make(fmt: str, rng, folder: Path, k: int, marker: Path) -> tuple[Path, str, str | None]:
    """Write mutated file ``k`` of format ``fmt``: (path, what was mutated, preset)."""
    if fmt in ("jsonl", "jsonl.gz"):
        path = folder / f"f{k}.{fmt}"
        return path, _write_json_family(rng, path, _records(rng)), None
    if fmt == "parquet":
        path = folder / f"f{k}.parquet"
        return path, _write_parquet(rng, path, _records(rng)), None
    if fmt == "npz":
        path = folder / f"f{k}.npz"
        return path, _write_npz(rng, path, _records(rng), marker), None
    if fmt == "prime-rl":
        path = folder / f"rank_{k}.jsonl"
        return path, _write_json_family(rng, path, _prime_records(rng)), "prime-rl"
    if fmt == "nemo-rl":
        path = folder / (f"train_data_step{k}.jsonl" + (".gz" if k % 4 == 0 else ""))
        return path, _write_json_family(rng, path, _nemo_records(rng)), "nemo-rl"
    path = folder / f"{k}.pt"
    return path, _write_slime(rng, path, marker), "slime"


def _timed(fn, name: str):
    """Run ``fn``: (None, seconds), or (the exception, seconds) unless it is a ValueError naming ``name``."""
    start = time.perf_counter()
    try:
        fn()
    except ValueError as exc:
        if name not in str(exc):
            return exc, time.perf_counter() - start
    except Exception as exc:
        return exc, time.perf_counter() - start
    return None, time.perf_counter() - start


def _calls(path: Path, preset: str | None):
    calls = [("load_batch", lambda: load_batch(path, preset=preset))]
    calls.append(("load_batch drop", lambda: load_batch(path, preset=preset, on_bad="drop")))
    if preset is not None:
        calls.append(("read_run", lambda: read_run(path, preset)))
    return calls


def _fuzz(fmt: str, n: int, seed: int, tmp_path: Path, capsys, cli_every: int) -> None:
    if fmt == "slime" and torch is None:
        pytest.skip("pip install torch")
    if fmt == "parquet" and pa is None:
        pytest.skip("pip install pyarrow")
    rng = np.random.default_rng([seed, FORMATS.index(fmt)])
    marker = tmp_path / "unpickled"
    failures = []
    for k in range(n):
        folder = tmp_path / f"m{k}"
        folder.mkdir()
        path, what, preset = _make(fmt, rng, folder, k, marker)
        for name, fn in _calls(path, preset):
            exc, seconds = _timed(fn, path.name)
            if exc is not None:
                failures.append(f"{path.name} [{what}] {name}: {type(exc).__name__}: {str(exc)[:120]}")
            if seconds > LIMIT_S:
                failures.append(f"{path.name} [{what}] {name}: took {seconds:.1f} s")
        if k % cli_every == 0:
            argv = ["analyze", str(path), "--n-boot", "0", "--folds", "0"]
            argv += [] if preset is None else ["--preset", preset]
            capsys.readouterr()
            start = time.perf_counter()
            try:
                status = main(argv)
            except BaseException as exc:
                failures.append(f"{path.name} [{what}] cli: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            seconds = time.perf_counter() - start
            err = capsys.readouterr().err.strip()
            if status not in (0, 2) or (status == 2 and (not err or "\n" in err)):
                failures.append(f"{path.name} [{what}] cli: exit {status}, stderr {err[:300]!r}")
            if seconds > LIMIT_S:
                failures.append(f"{path.name} [{what}] cli: took {seconds:.1f} s")
        assert not marker.exists(), f"{path.name} [{what}]: a pickled object was unpickled"
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_quick(fmt, tmp_path, capsys):
    """30 mutations per format: each file loads or raises ValueError, under 20 s, unpickling nothing."""
    _fuzz(fmt, 30, 2026, tmp_path, capsys, cli_every=3)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_slow(fmt, tmp_path, capsys):
    """1,000 mutations per format, as the quick run, the command line for every 10th file."""
    _fuzz(fmt, 1000, 35, tmp_path, capsys, cli_every=10)


def test_canary_would_be_seen(tmp_path):
    """The canary works: unpickling it makes its marker directory."""
    marker = tmp_path / "unpickled"
    pickle.loads(pickle.dumps(Canary(marker)))
    assert marker.is_dir()


# --------------------------------------------------------------------------------------
# regressions: one per defect the fuzzer found
# --------------------------------------------------------------------------------------
def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


_GOOD = '{"logp": [-0.5, -1.0], "old_logp": [-0.4, -1.1]}'


@pytest.mark.parametrize("damage", ["flip", "truncate", "not gzip"])
def test_corrupt_gzip_is_a_value_error(tmp_path, damage):
    """A .jsonl.gz that is not an intact gzip stream: ValueError naming the file (was zlib.error)."""
    data = gzip.compress(("\n".join([_GOOD] * 200) + "\n").encode())
    data = {
        "flip": data[:40] + bytes([data[40] ^ 0xFF]) + data[41:],
        "truncate": data[: len(data) // 2],
        "not gzip": b"plain text",
    }[damage]
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(
        ValueError, match=r"^r\.jsonl\.gz: not an intact gzip stream \(at or after line \d+: "
    ):
        load_batch(path)


def test_deep_nesting_is_invalid_json(tmp_path):
    """JSON nested 5,000 deep is a ValueError naming the line (was RecursionError)."""
    deep = "[" * DEEP + "-0.5" + "]" * DEEP
    path = _jsonl(tmp_path / "deep.jsonl", [_GOOD, f'{{"logp": {deep}, "old_logp": [-0.1]}}'])
    with pytest.raises(ValueError, match=r"^deep\.jsonl: line 2: invalid JSON \(nested too deep\)$"):
        load_batch(path)
    with pytest.raises(ValueError, match=r"deep\.jsonl: line 2: invalid JSON \(nested too deep\)"):
        read_run(path, "nemo-rl")


def test_integer_beyond_float64_is_bad_data(tmp_path):
    """A JSON integer like 10**400 in a log-prob list is a bad sequence (was OverflowError)."""
    path = _jsonl(tmp_path / "big.jsonl", [_GOOD, f'{{"id": "b", "logp": [-{10**400}], "old_logp": [-0.1]}}'])
    with pytest.raises(ValueError, match=r"id='b' .*field 'logp' holds an integer beyond the float64 range"):
        load_batch(path)
    batch = load_batch(path, on_bad="drop")
    assert len(batch) == 1
    assert batch.dropped[0].id == "b"


def test_ids_beyond_int64_are_kept_exactly(tmp_path):
    """Ids and prompt ids above the int64 range load, kept exactly (was OverflowError)."""
    big = 2**64 + 5
    lines = [f'{{"id": {big + i}, "prompt_id": {big}, "logp": [-0.5], "old_logp": [-0.4]}}' for i in range(2)]
    batch = load_batch(_jsonl(tmp_path / "ids.jsonl", lines))
    assert batch.ids.tolist() == [big, big + 1]
    assert batch.prompt_id.tolist() == [big, big]
    assert batch.group_index().tolist() == [0, 0]
    nemo = '{{"idx": {}, "prev_logprobs": [[-0.5]], "generation_logprobs": [[-0.4]]}}'
    path = _jsonl(tmp_path / "train_data_step1.jsonl", [nemo.format(big), nemo.format(big)])
    assert load_batch(path, preset="nemo-rl").ids.tolist() == [big, big]
    assert read_run(path, "nemo-rl").to_batch().ids.tolist() == [big, big]  # idx: an id, never a prompt


def test_npy_named_npz_and_pickles_are_refused(tmp_path):
    """An .npy named .npz is a ValueError (was TypeError); a pickled array is never unpickled."""
    marker = tmp_path / "unpickled"
    np.save(tmp_path / "a.npy", np.zeros(3))
    (tmp_path / "a.npz").write_bytes((tmp_path / "a.npy").read_bytes())
    with pytest.raises(ValueError, match=r"^a\.npz: a single \.npy array, not an \.npz archive"):
        load_batch(tmp_path / "a.npz")
    np.save(tmp_path / "p.npy", np.array([Canary(marker)], dtype=object), allow_pickle=True)
    (tmp_path / "p.npz").write_bytes((tmp_path / "p.npy").read_bytes())
    np.savez(tmp_path / "q.npz", logp=np.array([Canary(marker)], dtype=object), old_logp=np.zeros(1))
    for name in ("p.npz", "q.npz"):
        with pytest.raises(ValueError, match=rf"^{name[0]}\.npz: .*allow_pickle=False"):
            load_batch(tmp_path / name)
    assert not marker.exists()


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_broken_npz_and_parquet_are_value_errors(tmp_path, cut):
    """A cut or corrupt NPZ or Parquet file: ValueError naming it (was BadZipFile, OSError), file closed."""
    recs = [{"id": i, "logp": [-0.5, -0.2], "old_logp": [-0.4, -0.3]} for i in range(50)]
    for name, message in (
        ("r.npz", "not an intact .npz archive"),
        ("r.parquet", "not a readable Parquet file"),
    ):
        path = write_records(recs, tmp_path / name)
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * cut)])
        with pytest.raises(ValueError, match=rf"^r\.{name[2:]}: {message}"):
            load_batch(path)


def test_complex_arrays_are_value_errors(tmp_path):
    """A complex array in an NPZ is a ValueError, with no ComplexWarning first."""
    np.savez(tmp_path / "c.npz", logp=np.array([[-0.5 + 1j]]), old_logp=np.array([[-0.5]]))
    with pytest.raises(ValueError, match=r"logp must hold real numbers, got complex128"):
        load_batch(tmp_path / "c.npz")


def test_prime_rl_token_ids_that_are_not_ids_are_bad_data(tmp_path):
    """A NaN among prime-rl's token ids is the line's problem (was a RuntimeWarning on the int cast)."""
    rec = _prime_records(np.random.default_rng(0))[0]
    rec["token_ids"][3] = None
    path = _jsonl(tmp_path / "rank_0.jsonl", [json.dumps(rec)])
    with pytest.raises(ValueError, match=r"line 1: field 'token_ids'\[3\] = nan is not a token id"):
        load_batch(path, preset="prime-rl")


def test_cli_prints_one_line_and_no_warning(tmp_path, capsys):
    """On the command line a corrupt .gz or bad token ids give one line on stderr, no warning before it."""
    rec = _prime_records(np.random.default_rng(0))[0]
    rec["token_ids"][3] = 1.5
    prime = _jsonl(tmp_path / "rank_0.jsonl", [json.dumps(rec)])
    corrupt = tmp_path / "r.jsonl.gz"
    corrupt.write_bytes(gzip.compress(_GOOD.encode())[:-8])
    for argv in (["analyze", str(prime), "--preset", "prime-rl"], ["analyze", str(corrupt)]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main([*argv, "--n-boot", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert not caught
        assert err.count("\n") == 0
        assert err.startswith("variance-lab: error: ")


@pytest.mark.skipif(torch is None, reason="pip install torch")
def test_slime_odd_fields_are_bad_data(tmp_path):
    """slime: a sparse tensor, response_lengths [n], inf or 2**40, an oversized rollout_position.

    Each was a TypeError, OverflowError or MemoryError; now a bad sample, or (the position) an exact id.
    """
    cases = {
        "log_probs": (lambda s: torch.tensor([-0.1] * 8).to_sparse(), "is a torch.sparse_coo"),
        "response_lengths": (lambda s: [s["response_lengths"]], "'response_lengths' is not an integer >= 0"),
        "inf": (lambda s: math.inf, "'response_lengths' is not an integer >= 0"),
        "huge": (lambda s: 2**40, "length mismatch: response_lengths is 1099511627776"),
    }
    for name, (make, message) in cases.items():
        payload = _slime_payload(np.random.default_rng(1))
        sample = payload["samples"][1]
        key = name if name in sample else "response_lengths"
        if name == "huge":
            del sample["loss_masks"]
        sample[key] = make(sample)
        torch.save(payload, tmp_path / f"{name}.pt")
        with pytest.raises(ValueError, match=rf"^{name}\.pt: .*samples\[1\]: .*{re.escape(message)}"):
            load_batch(tmp_path / f"{name}.pt", preset="slime")
    payload = _slime_payload(np.random.default_rng(1))
    payload["samples"][2]["rollout_position"] = 2**70
    torch.save(payload, tmp_path / "pos.pt")
    assert load_batch(tmp_path / "pos.pt", preset="slime").ids.tolist() == [0, 1, 2**70, 3]
    (tmp_path / "cut.pt").write_bytes((tmp_path / "pos.pt").read_bytes()[:300])
    with pytest.raises(ValueError, match=r"^cut\.pt: not a file torch\.save wrote"):
        load_batch(tmp_path / "cut.pt", preset="slime")


@pytest.mark.parametrize("field", ["rollout_logp", "old_logp"])
def test_huge_finite_log_ratio_analyzes_quietly(tmp_path, capsys, field):
    """A finite log-prob of -9.2e18 is valid data: analyze reports inf, with no overflow warning.

    (rollouts/split.py's k3 and sequence chi2 took ``expm1`` of it, rollouts/statistics.py's mean_G
    ``exp``: a RuntimeWarning line.)
    """
    recs = [
        {"id": i, "logp": [-0.5, -0.2], "old_logp": [-0.4, -0.3], "rollout_logp": [-0.4, -0.2]}
        for i in range(6)
    ]
    recs[1][field][1] = -(2**63) - 1
    path = write_records(recs, tmp_path / "r.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["analyze", str(path), "--n-boot", "0", "--folds", "0"]) == 0
    assert not caught
    assert "inf" in capsys.readouterr().out


@pytest.mark.skipif(torch is None, reason="pip install torch")
def test_bad_token_ids_with_another_problem_are_not_cast(tmp_path):
    """A slime sample's tokens [NaN, ...] are its's problem, never cast to int64 (was a RuntimeWarning)."""
    payload = _slime_payload(np.random.default_rng(1))
    payload["samples"][0]["tokens"] = [None, -0.1]
    torch.save(payload, tmp_path / "tok.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"samples\[0\]: field 'tokens'\[0\] = nan is not a token id"):
            load_batch(tmp_path / "tok.pt", preset="slime")
    assert not caught


def test_every_reader_error_names_the_file(tmp_path):
    """Reader errors start with the file's name: a bad sequence (JSONL, Parquet, NPZ), a NeMo-RL dump."""
    recs = [{"id": "q", "logp": [-0.5, np.inf], "old_logp": [-0.4, -0.3]}]
    for name in ("r.jsonl", "r.parquet", "r.npz"):
        path = write_records(recs, tmp_path / name)
        with pytest.raises(ValueError, match=rf"^{re.escape(name)}: bad sequence id='q' \(index 0\)"):
            load_batch(path)
    line = '{"idx": 0, "prev_logprobs": [[-0.5]], "sample_loss_mask": [0.0]}'
    path = _jsonl(tmp_path / "train_data_step1.jsonl", [line])
    with pytest.raises(
        ValueError, match=r"^train_data_step1\.jsonl: every one of its 1 samples has sample_loss_mask 0"
    ):
        read_run(path, "nemo-rl")
