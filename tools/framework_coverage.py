"""Measure how far each framework mirror lies from its framework's own outputs, from the fixtures.

The fixtures of ``tests/data/frameworks/`` hold what each framework's own code returned (written
by ``tools/*_fixtures.py``); this script reads them through the loaders of
``tests/frameworks/test_*.py``, runs each mirror as its test runs it, and prints, per framework,
dtype and family of outputs, the worst difference: for values the largest relative difference
(over the values the framework gave as non-zero; where it lies) and the largest absolute one,
for decisions (masks, zeroed weights, kept sequences) how many differ of how many. "float32"
compares with the framework run in float32 (the dtype real runs use); "float64" with the
framework run in float64 (the float64 fixtures, or the framework's float64 run of the same
inputs, which the mirrors that decide in float32, as their framework does, are compared with only
where that run made the same decisions). The guide quotes the texts of ``docs/measurements.json``
named ``coverage_*``; they are these numbers.

Usage::

    python tools/framework_coverage.py           # print the table and the texts
    python tools/framework_coverage.py --write   # rewrite the coverage_* entries of docs/measurements.json
    python tools/framework_coverage.py --check   # exit 1, naming the keys, while they differ
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "frameworks"
MEASUREMENTS = ROOT / "docs" / "measurements.json"
FRAMEWORKS = ("verl", "trl", "nemo_rl", "prime_rl", "slime", "openrlhf", "areal")


def _load(name: str):
    """Import ``tests/frameworks/<name>.py`` (a test module or the conftest) by its path."""
    spec = importlib.util.spec_from_file_location(f"_coverage_{name}", TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Values:
    """Running worst differences of one family of values from the framework's."""

    n: int = 0
    rel: float = 0.0
    abs: float = 0.0
    where: str = ""
    where_abs: str = ""
    nonfinite: int = 0  # inf/NaN where the framework has another value

    def add(self, got, want, where: str = "") -> None:
        """Compare ``got`` with the framework's ``want`` (same shape); ``where`` names them."""
        g = np.asarray(got, dtype=np.float64).ravel()
        w = np.asarray(want, dtype=np.float64).ravel()
        assert g.shape == w.shape, (g.shape, w.shape, where)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        finite = np.isfinite(g) & np.isfinite(w)
        self.nonfinite += int(np.sum(~same & ~finite))
        self.n += g.size
        with np.errstate(invalid="ignore"):
            d = np.where(same | ~finite, 0.0, np.abs(g - w))
        if d.max(initial=0.0) > self.abs:
            self.abs, self.where_abs = float(d.max()), where
        nz = finite & (w != 0)
        if nz.any():
            r = d[nz] / np.abs(w[nz])
            if r.max() > self.rel:
                self.rel, self.where = float(r.max()), where


@dataclass
class Decisions:
    """How many of the mirror's decisions differ from the framework's."""

    n: int = 0
    differ: int = 0

    def add(self, got, want) -> None:
        """Count the decisions (truth values, same shape) of ``got`` that are not ``want``'s."""
        g, w = np.asarray(got, dtype=bool).ravel(), np.asarray(want, dtype=bool).ravel()
        assert g.shape == w.shape
        self.n += g.size
        self.differ += int(np.sum(g != w))


class Report:
    """Tallies by (dtype, family), in the order first seen."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], Values | Decisions] = {}

    def values(self, dtype: str, family: str) -> Values:
        """Return the :class:`Values` tally of ``family`` in ``dtype``."""
        return self.tallies.setdefault((dtype, family), Values())

    def decisions(self, dtype: str, family: str) -> Decisions:
        """Return the :class:`Decisions` tally of ``family`` in ``dtype``."""
        return self.tallies.setdefault((dtype, family), Decisions())


# --------------------------------------------------------------------------------------
# one function per framework, each running the mirror as its test does
# --------------------------------------------------------------------------------------
def measure_verl() -> Report:
    """Measure verl 0.9.1: ``verl.*`` (float64), ``verl_dtypes.*`` (float32/float64, int64/bool masks)."""
    from variance_lab.frameworks import verl

    t, r = _load("test_verl"), Report()
    b = t.load_batch()
    old, rollout, mask = t._inputs(b)
    valid = mask > 0
    for case, setting in t.META["cases"].items():
        w = modified = None
        if case == "offpolicy_no_rollout":
            metrics = verl.compute_offpolicy_metrics(old, None, mask)
        else:
            w, modified, metrics = verl.compute_rollout_correction_and_rejection_mask(
                old, rollout, mask, **setting["kwargs"]
            )
        for k, v in setting["metrics"].items():
            r.values("float64", "fractions" if t._is_exact(k) else "metrics").add(metrics[k], v, _short(k))
        if modified is not None:
            want = np.unpackbits(b[f"{case}/mask"], count=int(valid.sum())).astype(bool)
            r.decisions("float64", "`response_mask`").add(modified[valid] > 0.5, want)
        if f"{case}/weights" in b:
            r.values("float64", "`rollout_is_weights`").add(w[valid], b[f"{case}/weights"])
    batches, arrays = t.load_dtype_batches()
    for combo, key in t._dtype_cases():
        lp, mk = combo.split("/")
        old, rollout, mask = batches[lp, key.split("/", 1)[0]]
        setting = t.DTYPES["combos"][combo][key]
        w, modified, metrics = verl.compute_rollout_correction_and_rejection_mask(
            old, rollout, mask.astype(mk), **setting["kwargs"]
        )
        for k, v in setting["metrics"].items():
            fam = "fractions" if t._is_exact(k) else "metrics"
            r.values(lp, fam).add(metrics[k], v, _short(k))
        valid = mask > 0
        want = np.unpackbits(arrays[f"{combo}/{key}/mask"], count=int(valid.sum())).astype(bool)
        r.decisions(lp, "`response_mask`").add(modified[valid] != 0, want)
        if f"{combo}/{key}/weights" in arrays:
            r.values(lp, "`rollout_is_weights`").add(w[valid], arrays[f"{combo}/{key}/weights"])
    return r


def measure_trl() -> Report:
    """Measure TRL 1.16.0: ``trl.*`` (float64) and ``trl_dtypes.*`` (float32 and float64 batches)."""
    from variance_lab.frameworks import trl

    t, r = _load("test_trl"), Report()
    b = t.load_batch()
    for thr in t.META["off_policy_thresholds"]:
        got = trl.get_off_policy_mask(b["advantages"], b["old"], b["rollout"], b["mask"], thr)
        r.decisions("float64", "`get_off_policy_mask`").add(got != 0, b[f"off_policy_mask/{thr!r}"] != 0)
    for name, kwargs in t.META["gamma_cases"].items():
        for with_is in (False, True):
            rho = np.minimum(np.exp((b["old"] - b["rollout"]) * b["mask"]), 3.0) if with_is else None
            got = trl.get_gamma_weights(b["advantages"], b["update"], b["mask"], rho, **kwargs)
            r.values("float64", "`get_gamma_weights`").add(got, b[f"gamma/{name}/{with_is}"])
    meta = t.DTYPE_META
    for row in t.DTYPE_BATCHES:
        dt = str(row["dtype"])
        for i, (mode, lo, hi) in enumerate(meta["is_settings"]):
            ratio, metrics = trl.vllm_importance_sampling_correction(
                row["old"], row["sampling"], row["mask"], mode, lo, hi, tool_mask=row["tool"]
            )
            own = row["own/is_ratio"][i]
            r.decisions(dt, "ratios zeroed").add(ratio.ravel() == 0, own == 0)
            r.values(dt, "IS ratios").add(ratio, own, mode)
            got = [metrics[k] for k in meta["metrics"]]
            r.values(dt, "`sampling/` metrics").add(got, row["own/is_metrics"][i], mode)
        loss_mask = row["mask"] if row["tool"] is None else row["mask"] * row["tool"]
        for i, thr in enumerate(row["thresholds"]):
            keep = trl.get_off_policy_mask(row["adv"], row["new"], row["sampling"], loss_mask, thr)
            r.decisions(dt, "`get_off_policy_mask`").add(keep.ravel() != 0, row["own/off_policy"][i] != 0)
        j = 0
        for _, kwargs in meta["gamma_cases"]:
            for setting in (None, 4, 6):  # the rows of is_settings whose ratio TRL's gamma runs took
                rho = None
                if setting is not None:
                    rho = row["own/is_ratio"][setting].reshape(row["mask"].shape).astype(row["dtype"])
                phi = trl.get_gamma_weights(row["adv"], row["new"] - row["old"], loss_mask, rho, **kwargs)
                own = row["own/gamma"][j]
                big = own > 1e-30  # float32 subnormals left out, as the test does
                r.values(dt, "`get_gamma_weights`").add(phi.ravel()[big], own[big])
                j += 1
    return r


def measure_nemo_rl() -> Report:
    """Measure NeMo-RL 7ea279a: ``nemo_rl.*``, ``ClippedPGLossFn`` run in float32 and in float64.

    Its logged metrics and the per-token weights ``__call__`` holds as it returns, at the unmasked
    tokens (every row with sequence-level ratios).
    """
    t, r = _load("test_nemo_rl"), Report()
    for row in t.load_settings():
        w, got, _ = t._mirror(row)
        want, want64 = row["metrics32"], row["metrics64"]
        big = np.abs(row["prev"].astype(float) - row["gen"]).max() > 80  # float32 exp overflows
        oob = want.get("is_oob_ratio", 0.0), want64.get("is_oob_ratio", 0.0)
        same = abs(oob[0] - oob[1]) <= 1e-6 * abs(oob[1])  # the float64 run counted the same tokens
        seq = row["options"].get("sequence_level_importance_ratios", False)
        inside = np.ones(w.shape, dtype=bool) if seq else row["tm"] > 0  # every row, or the tokens
        w32, w64 = row["weights32"][inside], row["weights64"][inside]
        r.decisions("float32", "weights zeroed").add(w[inside] == 0, w32 == 0)
        r.values("float32", "`actor_importance_weights`").add(w[inside], w32)
        if same and not big:  # and where the float64 run zeroed the same weights
            agree = (w64 == 0) == (w32 == 0)
            r.values("float64", "`actor_importance_weights`").add(w[inside][agree], w64[agree])
        for k, v in want.items():
            fam = "fractions" if k in ("is_oob_ratio", "num_valid_samples") else "metrics"
            r.values("float32", fam).add(got[k], v, k)
            if same and not big:
                r.values("float64", fam).add(got[k], want64[k], k)
    return r


def measure_prime_rl() -> Report:
    """Measure prime-rl 559b447 (``prime_rl.*``) and ``IcePopLoss`` of PR #3526 (``prime_rl_icepop.*``)."""
    from variance_lab.frameworks import prime_rl

    t, r = _load("test_prime_rl"), Report()
    for s in t.SETTINGS:
        o, loss = s["options"], s["loss"]
        w = s["rl_weights"] if s["has_rl_weights"] else None
        if loss == "default":
            keep, got = prime_rl.dppo_mask(
                s["trainer"], s["inference"], s["advantages"], s["mask"], o["dppo_mask_low"],
                o["dppo_mask_high"], rl_weights=w, per_sample=True,
            )  # fmt: skip
        else:
            keep, got = prime_rl.ipo_mask(
                s["trainer"], s["inference"], s["mask"], o["ipo_threshold"], rl_weights=w, per_sample=True
            )
        differ = (keep > 0) != (s["rl_keep32"] > 0)
        r.decisions("float32", f"`{loss}_loss_fn` mask").add(keep > 0, s["rl_keep32"] > 0)
        same = bool((s["rl_keep32"] == s["rl_keep64"]).all())
        rows = ~differ.any(axis=1)[s["rl_ran"] > 0]  # a sample whose mask differs: left out, as the test does
        for k in (k for k in s["m32"] if not k.startswith("ref_kl")):
            fam = "fractions" if k in t.FRACTIONS else "metrics"
            g, v32, v64 = np.asarray(got[k])[rows], s["m32"][k][rows], s["m64"][k][rows]
            r.values("float32", fam).add(g, v32, k)
            if same:
                r.values("float64", fam).add(g, v64, k)
        if s["has_ref_kl_weights"]:
            keep, got = prime_rl.ref_kl_mask(
                s["trainer"], s["inference"], s["ref"], s["ref_kl_weights"], per_sample=True
            )
            r.decisions("float32", "`ref_kl_loss_fn` mask").add(keep > 0, s["ref_keep32"] > 0)
            same = bool((s["ref_keep32"] == s["ref_keep64"]).all())
            for k in (k for k in s["m32"] if k.startswith("ref_kl")):
                fam = "fractions" if k.removeprefix("ref_kl/") in t.FRACTIONS else "metrics"
                r.values("float32", fam).add(got[k], s["m32"][k], k)
                if same:
                    r.values("float64", fam).add(got[k], s["m64"][k], k)
    names, settings = t._icepop_settings()
    for s in settings:
        keep, per_sample = prime_rl.icepop_mask(
            s["trainer"], s["inference"], s["mask"], *s["band"], per_sample=True
        )
        r.decisions("float32", "`IcePopLoss` mask").add(keep > 0, s["keep32"])
        same = bool((s["keep32"] == s["keep64"]).all())
        for j, k in enumerate(names):
            fam = "fractions" if k == "is_masked" else "`IcePopLoss` metrics"
            v32, v64 = s["m32"][:, j], s["m64"][:, j]
            r.values("float32", fam).add(per_sample[k], v32, k)
            if same:
                r.values("float64", fam).add(per_sample[k], v64, k)
    return r


def measure_slime() -> Report:
    """Measure slime 624b824: ``slime.*``, its TIS/IcePop functions and ``mis.py`` in float32 and float64."""
    from variance_lab.frameworks import slime, slime_mis

    conftest, r = _load("conftest"), Report()
    for row in conftest.load_slime_settings():
        o, keep = row["options"], None
        common = {"calculate_per_token_loss": row["per_token"], "rollout_ids": row["rollout_ids"]}
        if row["kind"] == "tis":
            w, got = slime.tis_metrics(row["old"], row["rollout"], row["mask"], row["new"], **o, **common)
        else:
            w, keep, got = slime_mis.compute_mis_weights(
                row["old"], row["rollout"], row["mask"], **o, **common
            )
        inside = row["inside"]
        if keep is not None:
            r.decisions("float32", "`mis.py` rejection mask").add(keep[inside] > 0, row["keep"] > 0)
        if w is not None:
            label = "tis_metrics" if row["kind"] == "tis" else "compute_mis_weights"
            r.values("float32", "weights").add(w[inside], row["weights32"], label)
        want, want64 = row["metrics32"], row["metrics64"]
        fractions = conftest.fraction_names(want)
        same = all(want64[k] == want[k] for k in fractions)  # slime's float64 run counted the same
        for k, v in want.items():
            fam = "fractions" if k in fractions else "metrics"
            r.values("float32", fam).add(got[k], v, k)
            if same:
                r.values("float64", fam).add(got[k], want64[k], k)
    return r


def measure_openrlhf() -> Report:
    """Measure OpenRLHF 3c3be62: ``openrlhf.*``, ``PolicyLoss`` on float32/float64 log-probs and casts."""
    from variance_lab.frameworks import openrlhf

    t, r = _load("test_openrlhf"), Report()
    for row in t.SETTINGS:
        dt, inside, kw = str(row["dtype"]), row["inside"], t._kwargs(row["options"])
        got = openrlhf.policy_loss_metrics(
            row["new"], row["old"], row["adv"], row["mask"], row["rollout"], **kw
        )
        f32 = dt == "float32"
        r.values(dt, "`ratio`").add(got["ratio"][inside], row["ratio"])
        if row["coef"] is not None:
            c = got["vllm_is"][inside]
            r.decisions(dt, "coefficients zeroed").add(c == 0, row["coef"] == 0)
            r.values(dt, "`vllm_is` coefficients").add(c, row["coef"])
        for k, v in row["scalars"].items():
            if k == "vllm_kl" and not t._logs_vllm_kl(kw):
                continue
            fam = "fractions" if k == "ppo_clip_ratio" else "metrics"
            r.values(dt, fam).add(got[k], v, k)
        if f32:  # OpenRLHF's float64 run of the same inputs
            cast = {k: row[k].astype(np.float64) for k in ("new", "old", "adv", "rollout")}
            got = openrlhf.policy_loss_metrics(
                cast["new"], cast["old"], cast["adv"], row["mask"], cast["rollout"], **kw
            )
            for k, v in row["scalars64"].items():
                if k == "vllm_kl" and not t._logs_vllm_kl(kw):
                    continue
                r.values("float64", "fractions" if k == "ppo_clip_ratio" else "metrics").add(got[k], v, k)
    return r


def measure_areal() -> Report:
    """Measure AReaL 4aef98d: ``areal.*``, the M2PO mask on float32 and float64 log-probs."""
    from variance_lab.frameworks import areal

    t, r = _load("test_areal"), Report()
    for row in t.SETTINGS:
        got, stats = areal.m2po_loss_mask(row["old"], row["prox"], row["mask"], row["tau"])
        dt, inside = str(row["dtype"]), np.asarray(row["mask"]) != 0
        y = (row["old"] - row["prox"])[inside]
        tied = np.unique(y * y).size < y.size
        r.decisions(dt, "tokens masked, tied squares" if tied else "tokens masked, distinct squares").add(
            got[inside], row["kept"][inside]
        )
        a, b = t._masked_per_value(got, row), t._masked_per_value(row["kept"], row)
        differ = [a.get(v, 0) != b.get(v, 0) for v in sorted(set(a) | set(b))]
        r.decisions(dt, "tokens masked per square value").add(differ, np.zeros(len(differ), dtype=bool))
        r.values(dt, "fractions").add(stats["n_valid_tokens"], row["kept"].sum(), "n_valid_tokens")
    return r


def _short(key: str) -> str:
    """Return a metric's name without verl's ``rollout_corr/`` prefix."""
    return key.removeprefix("rollout_corr/")


def measure() -> dict[str, Report]:
    """Return each framework's :class:`Report`."""
    return {fw: globals()[f"measure_{fw}"]() for fw in FRAMEWORKS}


# --------------------------------------------------------------------------------------
# printing and the texts of docs/measurements.json
# --------------------------------------------------------------------------------------
def _g(x: float) -> str:
    """Two significant digits, 0 as 0."""
    return "0" if x == 0 else f"{x:.1e}"


def table(reports: dict[str, Report]) -> str:
    """One line per framework, dtype and family."""
    lines = ["framework | dtype | family | compared | worst relative (where) | worst absolute | differ"]
    for fw, rep in reports.items():
        for (dt, fam), tally in rep.tallies.items():
            if isinstance(tally, Values):
                line = (
                    f"{fw} | {dt} | {fam} | {tally.n} | {_g(tally.rel)} ({tally.where}) | {_g(tally.abs)} | "
                )
                line += f"{tally.nonfinite} non-finite differ" if tally.nonfinite else ""
            else:
                line = f"{fw} | {dt} | {fam} | {tally.n} | | | {tally.differ} of {tally.n}"
            lines.append(line)
    return "\n".join(lines)


def _slug(label: str) -> str:
    """Return ``label`` as a field name (word characters and underscores)."""
    return re.sub(r"\W+", "_", label).strip("_")


def entry(report: Report, dtype: str) -> dict | None:
    """Return the ``coverage_<framework>_<dtype>`` measurement: ``{"template": ..., "values": {...}}``.

    One piece per family: values give their worst relative difference (where) and worst absolute
    one, fractions and counts whether every one is the framework's exactly (``==``; otherwise the
    worst relative difference and where), decisions how many of how many differ.
    """
    pieces, values = [], {}
    order = {Values: 0, Decisions: 2}
    tallies = sorted(
        ((fam, t) for (dt, fam), t in report.tallies.items() if dt == dtype),
        key=lambda ft: (1 if ft[0] == "fractions" else order[type(ft[1])], ft[0].strip("`")),
    )
    for fam, t in tallies:
        slug = _slug(fam)
        if isinstance(t, Decisions):
            pieces.append(f"{fam}: {{{slug}_differ}} of {{{slug}_n}} differ")
            values.update({f"{slug}_differ": f"{t.differ:,}", f"{slug}_n": f"{t.n:,}"})
        elif fam == "fractions":
            if t.rel == 0 and t.abs == 0 and not t.nonfinite:  # every one equal (==) to the framework's
                pieces.append("fractions and counts: exact")
            else:
                pieces.append(
                    f"fractions and counts: not exact, {{{slug}_rel}} relative (`{{{slug}_where}}`)"
                )
                values.update({f"{slug}_rel": _g(t.rel), f"{slug}_where": t.where})
        else:
            rel = f"{{{slug}_rel}} relative"
            if t.where and _slug(t.where) != slug:
                rel += f" (`{{{slug}_where}}`)"
                values[f"{slug}_where"] = t.where
            absolute = f"{{{slug}_abs}} absolute"
            if t.where_abs != t.where:
                absolute += f" (`{{{slug}_abs_where}}`)"
                values[f"{slug}_abs_where"] = t.where_abs
            values.update({f"{slug}_rel": _g(t.rel), f"{slug}_abs": _g(t.abs)})
            piece = f"{fam}: {rel}, {absolute}"
            if t.nonfinite:
                piece += f", {{{slug}_nonfinite}} inf or NaN differ"
                values[f"{slug}_nonfinite"] = str(t.nonfinite)
            pieces.append(piece)
    return {"template": "; ".join(pieces), "values": values} if pieces else None


def measurements(reports: dict[str, Report]) -> dict[str, dict]:
    """Return every ``coverage_<framework>_<dtype>`` measurement (:func:`entry`)."""
    out = {}
    for fw, rep in reports.items():
        for dt in ("float64", "float32"):
            e = entry(rep, dt)
            if e is not None:
                out[f"coverage_{fw}_{dt}"] = e
    return out


def drift(measured: dict[str, dict], documented: dict[str, dict]) -> list[str]:
    """Keys whose documented measurement differs from the measured one (or is missing, or extra).

    The families, the counts of decisions and whether fractions are exact must be equal; a worst
    difference (``*_rel``, ``*_abs``) may differ by a factor of 2, or both lie below 1e-12, and
    where it lies (``*_where``) may differ: float64 rounding on another machine (another ``exp``,
    another order of summation) moves a worst difference at the level of float64 rounding.
    """

    def close(a: str, b: str) -> bool:
        x, y = float(a), float(b)
        return x == y or max(x, y) <= 1e-12 or (min(x, y) > 0 and max(x, y) / min(x, y) <= 2.0)

    def shape(template: str) -> str:
        return re.sub(r" \(`\{\w+_where\}`\)", "", template)

    out = []
    for key, new in measured.items():
        doc = documented.get(key)
        if doc is None or shape(doc.get("template", "")) != shape(new["template"]):
            out.append(key)
            continue
        for field, value in new["values"].items():
            if field.endswith("_where"):
                continue
            want = doc["values"].get(field)
            numeric = field.endswith(("_rel", "_abs"))
            if want is None or not (close(value, want) if numeric else value == want):
                out.append(key)
                break
    out += [k for k in documented if k.startswith("coverage_") and k not in measured]
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the measurements, or write or check the coverage_* entries of docs/measurements.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--write", action="store_true", help="rewrite docs/measurements.json's coverage_* entries"
    )
    group.add_argument("--check", action="store_true", help="exit 1 while docs/measurements.json's differ")
    args = parser.parse_args(argv)
    reports = measure()
    measured = measurements(reports)
    data = json.loads(MEASUREMENTS.read_text())
    numbers = data["numbers"]
    if args.check:
        stale = drift(measured, numbers)
        if stale:
            print(f"docs/measurements.json differs from the fixtures for {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    if args.write:
        for k in [k for k in numbers if k.startswith("coverage_")]:
            del numbers[k]
        how = (
            "python tools/framework_coverage.py --write: the mirrors against the fixtures of "
            "tests/data/frameworks/ (2-core AMD EPYC Zen 4 KVM VM, Python 3.11.7, NumPy 2.4.6)"
        )
        numbers.update({k: {**v, "how": how} for k, v in measured.items()})
        MEASUREMENTS.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return 0
    print(table(reports))
    print()
    for k, v in measured.items():
        print(k, "=", v["template"].format(**v["values"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
