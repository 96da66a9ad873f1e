r"""The numbers of the paired runs, per seed with prompt-clustered intervals, and their spread over seeds.

A folder of paired runs (:func:`~variance_lab.lm.paired.write_paired`, one seed and loss per
run) is read by its sidecars. Every quantity below is a ratio of per-sequence sums over the
sequences of one run, so its interval resamples prompts
(:func:`~variance_lab.stats.bootstrap.cluster_ratio`; a prompt's responses share it):

- a clipped fraction: tokens whose weight (GSPO: the sequence's) lies outside the loss's band
  (:func:`~variance_lab.lm.paired.clipped_fraction`) over all tokens;
- an RMS :math:`\sqrt{\sum_t d_t^2 / N}` of per-token log-ratios :math:`d_t` (the update
  :math:`\log\pi_{\theta_K} - \log\pi_{\theta_{K-1}}`, a sampler's mismatch
  :math:`\log\pi_{\theta_{K-1}} - \log\mu`, the staleness
  :math:`\log\pi_{\theta_{K-1+l}} - \log\pi_{\theta_{K-1}}`); its interval is the square root
  of the interval of the mean square;
- a ratio of two RMS on the same tokens (bf16 over fp16), the square root of a ratio of sums;
- a mean (the top-p sampler's log kept mass; the reward).

The update's RMS by length bucket, and the length counts, pool the data batch with each seed's
length batch when its folder holds one (:mod:`variance_lab.lm.length`: the same policies
:math:`\theta_{K-1}` and :math:`\theta_K`, prompt ids of their own); every other quantity is the
data batch's.

:func:`seed_rows` gives each quantity per seed with its interval, and
:func:`~variance_lab.lm.compare.seed_spread` over the seeds; :func:`markdown` writes them as a table.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from variance_lab._jsonl import read_jsonl
from variance_lab.lm.compare import length_counts, seed_spread
from variance_lab.lm.paired import clipped_fraction
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.stats.bootstrap import cluster_counts, cluster_ratio

__all__ = ["markdown", "read_paired", "run_quantities", "seed_rows"]

#: Length buckets of finished responses (tokens): 1-7, 8-15, ..., 128-255.
_EDGES = (1, 8, 16, 32, 64, 128, 256)

#: The buckets ``ratio_update_length`` compares: finished 8-15 tokens against 128-255.
_SHORT_LONG = ("8-15", "128-255")

#: What each quantity is (the table's second column), in the tables' order.
_MEANING = {
    "reward": "mean reward (exact match)",
    "clip_update": "tokens clipped by update K (its loss's band)",
    "rms_update": "RMS of update K's token log-ratio",
    "ratio_update_length": "update K's RMS, finished 8-15 tokens / 128-255 tokens",
    "rms_bf16": "RMS of the bf16 copy's mismatch",
    "rms_fp16": "RMS of the fp16 copy's mismatch",
    "ratio_bf16_fp16": "bf16 RMS / fp16 RMS, same tokens",
    "ratio_bf16_update": "bf16 RMS / update K's RMS, same tokens",
    "ratio_fp16_update": "fp16 RMS / update K's RMS, same tokens",
    "topp_outside": "tokens outside top-p's kept set",
    "topp_log_kept": "mean log S_t, top-p's kept mass",
    "topp_mismatch": "mean top-p mismatch (kept tokens)",
    "ratio_stale": "staleness RMS at L updates / at 1, same tokens",
}


def _order(name: str) -> tuple:
    """Sort key: the fixed names in :data:`_MEANING`'s order, length buckets by length, lags by lag."""
    for i, fixed in enumerate(_MEANING):
        if name == fixed:
            return (i, 0)
        if name.startswith(fixed + "_"):
            tail = name.removeprefix(fixed + "_")
            number = tail.removeprefix("lag").split("-")[0]
            return (i, int(number) if number.isdigit() else 10**6)
    lag = name.removeprefix("rms_stale_lag")
    return (len(_MEANING), int(lag) if lag.isdigit() else 0)


def _describe(name: str) -> str:
    if name in _MEANING:
        return _MEANING[name]
    if name.startswith("ratio_stale_lag"):
        return f"staleness RMS at {name.removeprefix('ratio_stale_lag')} updates / at 1, same tokens"
    if name.startswith("clip_update_lag"):
        return f"tokens clipped by update K + {name.removeprefix('clip_update_lag')}"
    if name.startswith("rms_stale_lag"):
        lag = name.removeprefix("rms_stale_lag")
        return (
            f"RMS of the staleness at {lag} updates"
            if lag != "1"
            else "RMS of the staleness at 1 update (= update K)"
        )
    if name == "rms_update_unfinished":
        return "update K's RMS, unfinished responses (data + length batch)"
    return f"update K's RMS, finished, {name.removeprefix('rms_update_')} tokens (data + length batch)"


def read_paired(folder) -> dict:
    """Return ``{(aggregation, seed): {role: records, "sidecar": ...}}`` for every paired file in ``folder``.

    ``"sidecar"`` is the on-policy file's (the first one read where a run has none).

    Parameters
    ----------
    folder : str or Path

    Returns
    -------
    dict
    """
    out: dict = {}
    for side in sorted(Path(folder).glob("*.json")):
        meta = json.loads(side.read_text())
        if meta.get("run") != "paired":
            continue
        run = out.setdefault((meta["aggregation"], int(meta["seed"])), {"sidecar": meta})
        run[meta["role"]] = read_jsonl(side.parent / meta["data_file"])
        if meta["role"] == "onpolicy":
            run["sidecar"] = meta
    if not out:
        raise ValueError(f"no paired runs (sidecars with run 'paired') in {str(folder)!r}")
    return out


def _per_sequence(records, field):
    return [np.asarray(r[field], dtype=float) for r in records]


def _interval(num, den, groups, *, n_boot, seed, root=False, proportion=False) -> dict:
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    r = cluster_ratio(
        num, den, groups, n_boot=n_boot, level=0.95, rng=np.random.default_rng(seed), proportion=proportion
    )
    value, lo, hi = num.sum() / den.sum(), r["lo"], r["hi"]
    if root:
        value, lo, hi = np.sqrt(value), np.sqrt(lo), np.sqrt(hi)
    return {"value": float(value), "lo": float(lo), "hi": float(hi)}


def _rms(d, groups, keep=None, **boot):
    keep = [np.ones(x.size, bool) for x in d] if keep is None else keep
    num = [float((x[k] ** 2).sum()) for x, k in zip(d, keep, strict=True)]
    den = [float(k.sum()) for k in keep]
    used = np.array(den) > 0
    return _interval(np.array(num)[used], np.array(den)[used], np.asarray(groups)[used], root=True, **boot)


def _clip_counts(aggregation, logp, old):
    """Per sequence, the tokens :func:`clipped_fraction` counts as clipped."""
    return np.array(
        [clipped_fraction(aggregation, [a], [b]) * a.size for a, b in zip(logp, old, strict=True)]
    )


def run_quantities(run: dict, aggregation: str, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Return every quantity one run's files measure, each ``{"value", "lo", "hi"}``, and its length counts.

    Parameters
    ----------
    run : dict
        ``{role: records}`` of one seed and loss (:func:`read_paired`); a ``length`` role
        joins the data batch in the length buckets.
    aggregation : str
    n_boot, seed : int, optional
        The bootstrap's resamples and seed.

    Returns
    -------
    dict
    """
    base = run["onpolicy"]
    groups = np.array([r["prompt_id"] for r in base])
    lengths = np.array([len(r["logp"]) for r in base])
    logp, old = _per_sequence(base, "logp"), _per_sequence(base, "old_logp")
    boot = {"n_boot": n_boot, "seed": seed}
    d = [a - b for a, b in zip(logp, old, strict=True)]
    out = {
        "reward": _interval([r["reward"] for r in base], np.ones(len(base)), groups, proportion=True, **boot),
        "clip_update": _interval(_clip_counts(aggregation, logp, old), lengths, groups, **boot),
        "rms_update": _rms(d, groups, **boot),
    }
    pooled = base + run.get("length", [])  # the length buckets pool the length batch
    out |= _by_length(pooled, **boot)
    m = {}
    for name in ("bf16", "fp16"):
        if f"mismatch_{name}" in run:
            rows = run[f"mismatch_{name}"]
            m[name] = [a - b for a, b in zip(old, _per_sequence(rows, "rollout_logp"), strict=True)]
            out[f"rms_{name}"] = _rms(m[name], groups, **boot)
    squares = {name: [float((x**2).sum()) for x in v] for name, v in m.items()}
    squares["update"] = [float((x**2).sum()) for x in d]
    for a, b in (("bf16", "fp16"), ("bf16", "update"), ("fp16", "update")):
        if a in squares and b in squares:
            out[f"ratio_{a}_{b}"] = _interval(squares[a], squares[b], groups, root=True, **boot)
    if "mismatch_top-p" in run:
        rows = run["mismatch_top-p"]
        mask = [np.asarray(r["mask"], bool) for r in rows]
        out["topp_outside"] = _interval([(~k).sum() for k in mask], lengths, groups, **boot)
        kept_s = _per_sequence(rows, "log_kept_mass")
        mt = [a - b for a, b in zip(old, _per_sequence(rows, "rollout_logp"), strict=True)]
        n_kept = [k.sum() for k in mask]
        out["topp_log_kept"] = _interval(
            [s[k].sum() for s, k in zip(kept_s, mask, strict=True)], n_kept, groups, **boot
        )
        out["topp_mismatch"] = _interval(
            [x[k].sum() for x, k in zip(mt, mask, strict=True)], n_kept, groups, **boot
        )
    lag = 1
    while f"stale_lag{lag}" in run:
        rows = run[f"stale_lag{lag}"]
        o, b = _per_sequence(rows, "old_logp"), _per_sequence(rows, "rollout_logp")
        stale = [x - y for x, y in zip(o, b, strict=True)]
        out[f"rms_stale_lag{lag}"] = _rms(stale, groups, **boot)
        counts = _clip_counts(aggregation, _per_sequence(rows, "logp"), o)
        out[f"clip_update_lag{lag}"] = _interval(counts, lengths, groups, **boot)
        lag += 1
    if lag > 2:  # the staleness at the largest lag L over that at lag 1 (update K), on the same tokens
        out[f"ratio_stale_lag{lag - 1}"] = _interval(
            [float((x**2).sum()) for x in stale], squares["update"], groups, root=True, **boot
        )
    counts = length_counts(
        np.array([len(r["logp"]) for r in pooled]),
        np.array([bool(r["finished"]) for r in pooled]),
        _EDGES[1:],
    )
    return {"quantities": out, "lengths": counts}


def _by_length(records, **boot) -> dict:
    """Update K's RMS per length bucket of finished responses, and over the unfinished ones."""
    groups = np.array([r["prompt_id"] for r in records])
    finished = np.array([bool(r["finished"]) for r in records])
    logp, old = _per_sequence(records, "logp"), _per_sequence(records, "old_logp")
    d = [a - b for a, b in zip(logp, old, strict=True)]
    bucket, edges = length_buckets([x.size for x in d], np.asarray(_EDGES))
    masks = {
        f"{lo}-{hi - 1}": finished & (bucket == j) for j, (lo, hi) in enumerate(itertools.pairwise(edges))
    }
    out = {}
    for name, mask in (*masks.items(), ("unfinished", ~finished)):
        if mask.sum() >= 2:
            keep = [np.full(x.size, m) for x, m in zip(d, mask, strict=True)]
            out[f"rms_update_{name}"] = _rms(d, groups, keep, **boot)
    short, long = (masks[name] for name in _SHORT_LONG)
    if short.sum() >= 2 and long.sum() >= 2:
        squares = np.array([float((x**2).sum()) for x in d])
        sizes = np.array([float(x.size) for x in d])
        out["ratio_update_length"] = _ratio_of_means(squares, sizes, short, long, groups, **boot)
    return out


def _ratio_of_means(y, x, a, b, groups, *, n_boot: int, seed: int) -> dict:
    r"""Return the RMS over the units ``a`` over that over ``b``, with its interval.

    :math:`R = \sqrt{(\sum_a y / \sum_a x) / (\sum_b y / \sum_b x)}`, :math:`y` a unit's sum of
    squares and :math:`x` its tokens. Prompts are resampled together for both
    (:func:`~variance_lab.stats.bootstrap.cluster_counts`); the interval is
    :math:`\log R \pm t_{0.975, G-1}\, s^* \sqrt{G/(G-1)}`, :math:`s^*` the resamples' sd of
    :math:`\log R` and :math:`G` the prompts of ``a`` or of ``b``, whichever has fewer. With 20
    prompts a bucket the percentile interval covered 92.6 %, this one with all prompts' :math:`G`
    (40) 94.2 % (2,000 runs each); its coverage is tested in ``tests/lm/test_paired_report.py``.
    """
    from scipy.stats import t as student

    W = cluster_counts(groups, n_boot, np.random.default_rng(seed)).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 0.5 * np.log((W @ (y * a) / (W @ (x * a))) / (W @ (y * b) / (W @ (x * b))))
    r = r[np.isfinite(r)]
    center = 0.5 * np.log((y[a].sum() / x[a].sum()) / (y[b].sum() / x[b].sum()))
    g = np.asarray(groups)
    G = min(np.unique(g[a]).size, np.unique(g[b]).size)
    half = student.ppf(0.975, G - 1) * np.std(r, ddof=1) * np.sqrt(G / (G - 1))
    return {
        "value": float(np.exp(center)),
        "lo": float(np.exp(center - half)),
        "hi": float(np.exp(center + half)),
    }


def seed_rows(folder, aggregation: str = "gspo", *, n_boot: int = 2000) -> dict:
    """Return each quantity of the runs of one loss: per seed with its interval, and the spread over seeds.

    Parameters
    ----------
    folder : str or Path
    aggregation : str, optional
    n_boot : int, optional

    Returns
    -------
    dict
        ``{"seeds": [...], "per_seed": {seed: run_quantities(...)}, "spread": {name: seed_spread
        or None when fewer than two seeds}, "lengths_pooled": {...}}``.
    """
    runs = {s: r for (agg, s), r in read_paired(folder).items() if agg == aggregation}
    if not runs:
        raise ValueError(f"no paired runs of aggregation {aggregation!r} in {str(folder)!r}")
    per = {s: run_quantities(r, aggregation, n_boot=n_boot, seed=s) for s, r in sorted(runs.items())}
    names = sorted(set().union(*(p["quantities"] for p in per.values())), key=_order)
    spread = {}
    for name in names:
        values = [p["quantities"][name]["value"] for p in per.values() if name in p["quantities"]]
        spread[name] = seed_spread(values) if len(values) >= 2 else None
    pooled = {k: sum(p["lengths"][k] for p in per.values()) for k in next(iter(per.values()))["lengths"]}
    return {"seeds": sorted(per), "per_seed": per, "spread": spread, "lengths_pooled": pooled}


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def markdown(rows: dict) -> str:
    """Return a Markdown table: one line per quantity, a column per seed (value [interval]), the spread.

    Parameters
    ----------
    rows : dict
        :func:`seed_rows`' result.

    Returns
    -------
    str
    """
    seeds = rows["seeds"]
    head = "| quantity | what | " + " | ".join(f"seed {s} [95 % CI]" for s in seeds) + " | mean (sd), seeds |"
    lines = [head, "|---" * (len(seeds) + 3) + "|"]
    for name, spread in rows["spread"].items():
        cells = []
        for s in seeds:
            q = rows["per_seed"][s]["quantities"].get(name)
            cells.append("" if q is None else f"{_fmt(q['value'])} [{_fmt(q['lo'])}, {_fmt(q['hi'])}]")
        tail = "" if spread is None else f"{_fmt(spread['mean'])} ({_fmt(spread['sd'])})"
        lines.append(f"| `{name}` | {_describe(name)} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(lines) + "\n"
