r"""The tidy data of the figures of the 2025-26 methods: sign-dependent weights, VCPO's ESS step, the bounds.

Each frame has the panel schema of :data:`variance_lab.report.threshold_figure.THRESHOLD_COLUMNS`
(``panel, series, x, method, value, lo, hi, reliable``); ``method`` is ``"exact"`` (closed form),
``"bound"`` (a published bound), ``"monte_carlo"`` (with its interval and verdict) or ``"data"``
(the shipped SmolLM2 rollouts, ``data/smollm2/``; categorical panels number their series
``x = 0, 1, ...``).

- :func:`sign_frame` (figure ``sign_weights``): bias and variance of TOPR, OPSM and ASPO by the
  advantage's sign against T (:func:`variance_lab.corrections.theory` and
  :func:`~variance_lab.corrections.simulate_corrections`), and their bias by sign on the group
  advantages of a shipped file (:func:`~variance_lab.corrections.evaluate`).
- :func:`vcpo_frame` (figure ``vcpo_ess``): VCPO's large-batch ESS ratio against T by lag and by
  family (:func:`variance_lab.corrections.vcpo.ess_limit`), the minibatch's mean
  (:func:`~variance_lab.corrections.vcpo.simulate_ess_ratio`), and VCPO's baseline gain over the
  group mean on the shipped files (:func:`~variance_lab.corrections.vcpo.baseline_gain`).
- :func:`speed_bounds_frame` (figure ``speed_bounds``): :mod:`variance_lab.theory.speed_bounds`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab import corrections
from variance_lab.corrections import vcpo
from variance_lab.experiment.names import DATA_DIR
from variance_lab.families import get_family
from variance_lab.theory import speed_bounds

__all__ = ["family_label", "panel_row", "rollout_file", "sign_frame", "speed_bounds_frame", "vcpo_frame"]

_NAN = math.nan


def panel_row(panel, series, x, method, value, lo=_NAN, hi=_NAN, reliable=True) -> dict:
    """Return one tidy row of the panel schema (``panel, series, x, method, value, lo, hi, reliable``).

    ``series`` is written as text, ``x``, ``value``, ``lo`` and ``hi`` as floats (no interval: NaN),
    ``reliable`` as a bool.
    """
    return {
        "panel": panel,
        "series": str(series),
        "x": float(x),
        "method": method,
        "value": float(value),
        "lo": float(lo),
        "hi": float(hi),
        "reliable": bool(reliable),
    }


def family_label(spec: list, *, sigma2: bool = True) -> str:
    r"""Return the legend label of a ``[name, mu, sigma2, {extra}]`` family entry of the parameters.

    A mixture is named by its minority components (``mixture: 2 % at v = 0.5``); ``sigma2=False``
    leaves out :math:`\sigma^2` (a panel whose families share it).
    """
    name, _mu, s2, *extra = spec
    extra = extra[0] if extra else {}
    if name == "lognormal-mixture":
        comps = sorted(get_family(name, None, None, **extra).components, reverse=True)[1:]
        return "mixture: " + ", ".join(f"{100 * w:g} % at $v$ = {v:g}" for w, _, v in comps)
    shape = "".join(f", {k} {v:g}" for k, v in extra.items())
    return f"{name}, $\\sigma^2$ {s2:g}{shape}" if sigma2 else f"{name}{shape}"


def _family(spec: list):
    name, mu, s2, *extra = spec
    return get_family(name, mu, s2, **(extra[0] if extra else {}))


def rollout_file(name: str) -> Path:
    """Return a shipped rollout file (a bare name: in ``data/smollm2/`` of the source tree) or a path."""
    path = Path(name)
    if not path.is_absolute() and path.parent == Path():
        path = DATA_DIR / "smollm2" / path
    return path


def _rollouts(name: str, ratio: str, fields: tuple[str, ...]):
    """(batch, log-ratios, {field: one value per sequence}) of a JSONL rollout file."""
    from variance_lab._jsonl import iter_jsonl
    from variance_lab.rollouts.io import load_batch
    from variance_lab.rollouts.records import sequence_values
    from variance_lab.rollouts.split import ratio_batch

    path = rollout_file(name)
    batch = load_batch(path)
    values = {f: sequence_values((rec for _, rec in iter_jsonl(path)), f, batch) for f in fields}
    return batch, ratio_batch(batch, ratio).log_ratio, values


# --------------------------------------------------------------------------------------------- sign
def sign_frame(params: dict) -> pd.DataFrame:
    r"""Tidy rows of the ``sign_weights`` figure.

    Panels ``bias`` and ``var``: :math:`E[w] - E[X]` and :math:`\operatorname{Var}(w)` of each spec
    of ``specs`` by sign (series ``SPEC [A>=0]``, ``SPEC [A<0]``) against ``T``, closed form
    (lognormal ``mu``, ``sigma2``), and Monte Carlo at ``mc_T`` (``n`` sequences, ``seed``,
    intervals at ``ci``; the bias interval is the mean's less the exact :math:`E[X]`). Panel
    ``data``: the bias by sign on ``data`` (``ratio`` of its tokens, each sequence's
    ``advantage``), with the 95 % bootstrap interval over prompts of :func:`corrections.evaluate`.
    """
    p = params
    family = get_family(p["family"], p["mu"], p["sigma2"])
    specs = list(p["specs"])
    signs = corrections.SIGNS[1:]
    th = corrections.theory(family, p["T"], specs).set_index(["correction", "T"])
    rows = []
    for spec in specs:
        for sign in signs:
            label = corrections.sign_label(corrections.parse(spec), sign)
            for t in p["T"]:
                r = th.loc[(label, int(t))]
                rows += [
                    panel_row("bias", label, t, "exact", r.bias),
                    panel_row("var", label, t, "exact", r.var_w),
                ]
    if p.get("n"):
        mc = corrections.simulate_corrections(
            family, p["mc_T"], specs, int(p["n"]), seed=int(p["seed"]), ci=float(p["ci"])
        )
        base = corrections.theory(family, p["mc_T"], specs).set_index(["correction", "T"]).mean_base
        for r in mc.itertuples(index=False):
            if not r.correction.endswith("]"):
                continue  # the by-sign rows only
            b = base[(r.correction, r.T)]
            lo, hi = r.mc_mean_w_lo - b, r.mc_mean_w_hi - b
            rows.append(
                panel_row("bias", r.correction, r.T, "monte_carlo", r.mc_mean_w - b, lo, hi, r.mc_reliable)
            )
            rows.append(
                panel_row("var", r.correction, r.T, "monte_carlo", r.mc_var_w, reliable=r.mc_reliable)
            )
    if p.get("data"):
        batch, log_r, values = _rollouts(p["data"], p["ratio"], ("advantage",))
        groups = batch.group_index() if batch.has_groups else None
        ev = corrections.evaluate(
            log_r, batch.offsets, specs, advantages=values["advantage"], groups=groups, ci=float(p["ci"])
        ).set_index("correction")
        k = 0
        for spec in specs:
            for sign in signs:
                label = corrections.sign_label(corrections.parse(spec), sign)
                e = ev.loc[label]
                lo, hi = e.mean_w_lo - e.mean_base, e.mean_w_hi - e.mean_base
                rows.append(panel_row("data", label, k, "data", e.bias, lo, hi))
                k += 1
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------- vcpo
def vcpo_frame(params: dict) -> pd.DataFrame:
    r"""Tidy rows of the ``vcpo_ess`` figure.

    Panel ``lag``: :math:`\rho_k(T)` of the lognormal (``mu``, ``sigma2``) for each lag of ``lags``
    (series ``lag k``, exact), and the mean of :math:`\hat\rho_N` over ``batches`` minibatches of
    ``N`` sequences at ``mc_T`` (Monte Carlo, ``seed``, normal intervals at ``ci``). Panel
    ``family``: :math:`\rho_1(T)` for each ``[name, mu, sigma2, {extra}]`` of ``families``.
    Panel ``baseline``: :func:`vcpo.baseline_gain` on each file of ``data`` (the update ratio's
    :math:`\log P_T`, the records' ``reward``, the prompts as groups), series the file's name.
    """
    p = params
    family = get_family(p["family"], p["mu"], p["sigma2"])
    rows = []
    for lag in p["lags"]:
        series = f"lag {int(lag)}"
        rho = vcpo.ess_limit(family, p["T"], lag=int(lag))
        rows += [panel_row("lag", series, t, "exact", v) for t, v in zip(p["T"], rho, strict=True)]
        if p.get("batches"):
            mc = vcpo.simulate_ess_ratio(
                family,
                p["mc_T"],
                int(p["N"]),
                int(p["batches"]),
                lag=int(lag),
                seed=int(p["seed"]),
                level=float(p["ci"]),
            )
            rows += [
                panel_row("lag", series, t, "monte_carlo", m, lo, hi)
                for t, m, lo, hi in zip(p["mc_T"], mc["mean"], mc["lo"], mc["hi"], strict=True)
            ]
    for spec in p["families"]:
        rho = vcpo.ess_limit(_family(spec), p["T"])
        label = family_label(spec, sigma2=False)
        rows += [panel_row("family", label, t, "exact", v) for t, v in zip(p["T"], rho, strict=True)]
    for k, name in enumerate(p.get("data") or []):
        batch, log_r, values = _rollouts(name, "update", ("reward",))
        log_w = np.add.reduceat(log_r, batch.offsets[:-1])
        gain = vcpo.baseline_gain(values["reward"], log_w, batch.group_index())
        run = Path(name).name.split(".")[0].removeprefix("smollm2_")
        rows.append(panel_row("baseline", run, k, "data", gain))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------- bounds
def speed_bounds_frame(params: dict) -> pd.DataFrame:
    r"""Tidy rows of the ``speed_bounds`` figure (:mod:`variance_lab.theory.speed_bounds`).

    For each ``[name, mu, sigma2, {extra}]`` of ``families`` (series its label): panel ``bias``,
    token-level IS's largest bias :math:`B_T` (``exact``) and :math:`2T^2\Delta_{\max}`
    (``bound``) at ``T``; panel ``var``, :math:`\operatorname{Var}(P_T)` and
    :math:`(1 + \chi^2_{\max})^T - 1`; panel ``ratio``, bound / exact of both (series
    ``LABEL: bias`` and ``LABEL: variance``); panel ``crossover``, the length from which
    sequence-level IS's standard error over ``n`` sequences exceeds :math:`B_T`
    (:func:`~variance_lab.theory.speed_bounds.crossover`, up to ``T_max``; NaN beyond it is left
    out), exact and as the bounds say.
    """
    p = params
    rows = []
    for spec in p["families"]:
        family, label = _family(spec), family_label(spec)
        f = speed_bounds.bounds_frame(family, p["T"])
        for r in f.itertuples(index=False):
            rows += [
                panel_row("bias", label, r.T, "exact", r.token_bias),
                panel_row("bias", label, r.T, "bound", r.token_bias_bound),
                panel_row("var", label, r.T, "exact", r.var_P),
                panel_row("var", label, r.T, "bound", r.var_P_bound),
                panel_row(
                    "ratio", f"{label}: variance", r.T, "exact", 10 ** (r.log10_var_P_bound - r.log10_var_P)
                ),
            ]
            if r.token_bias > 0:
                rows.append(
                    panel_row("ratio", f"{label}: bias", r.T, "exact", r.token_bias_bound / r.token_bias)
                )
        cross = speed_bounds.crossover(family, p["n"], T_max=int(p["T_max"]))
        for key, method in (("exact", "exact"), ("bound", "bound")):
            rows += [
                panel_row("crossover", label, n, method, t)
                for n, t in zip(cross["n"], cross[key], strict=True)
                if np.isfinite(t)
            ]
    return pd.DataFrame(rows)
