"""Image baselines: a drawing change shows up as a failed comparison.

Each figure is drawn with the paper style from small, fixed theory data (no Monte Carlo run:
where a figure shows Monte Carlo points, they are fixed made-up rows; about a second each) and
compared with ``tests/baseline/NAME.png`` by
:func:`matplotlib.testing.compare.compare_images` (RMS tolerance :data:`TOL` on 0-255
grey levels). After a deliberate change, look at the new images and refresh the baselines:

    VARIANCE_LAB_UPDATE_BASELINES=1 python -m pytest tests/report/test_figure_baselines.py  # make baselines

then commit ``tests/baseline/``. A failed comparison leaves ``NAME-failed-diff.png`` in the
test's temporary folder.
"""

import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.testing.compare import compare_images

from variance_lab import theory
from variance_lab.families import get_family
from variance_lab.report import figures as plots
from variance_lab.report.analysis_figure import analysis_figure
from variance_lab.report.clip_figure import clip_figure

BASELINE = Path(__file__).parents[1] / "baseline"
UPDATE_ENV = "VARIANCE_LAB_UPDATE_BASELINES"
#: RMS difference allowed (0-255 scale): font hinting differences pass, a moved line does not.
TOL = 2.0
DPI = 80
VAR_G = ["var_G", "var_G_lognormal", "var_G_delta", "var_G_naive"]


def _tidy(family, mu, sigma2, T, quantities):
    return theory.tidy(get_family(family, mu, sigma2), T, quantities=quantities)


def run_frames(small=(3, 4)):
    """Return made-up frames of a run: one row per step, one per step and bucket (no analysis behind them)."""
    steps, buckets = [], []
    for s in range(1, 9):
        for j, (lo, hi) in enumerate(((16, 31), (32, 63), (64, 127))):
            var = 2e-5 * (1 + 0.15 * s) / 2**j
            buckets.append(
                {"step": s, "T_lo": lo, "T_hi": hi, "n_seq": 12 if j == 0 and s in small else 60 + 10 * j,
                 "var_G": var, "var_G_lo": var / 1.3, "var_G_hi": var * 1.4,
                 "gspo_clip_frac": 0.2 + 0.05 * s + 0.1 * j, "ppo_clip_frac": 1e-3 * (1 + 0.3 * s) * (1 + j),
                 "khat_P": 0.2 + 0.06 * s + 0.1 * j}
            )  # fmt: skip
        steps.append(
            {"step": s, "gspo_clip_frac": 0.25 + 0.05 * s, "ppo_clip_frac": 1.5e-3 * (1 + 0.3 * s),
             "khat_P": 0.3 + 0.07 * s, "mismatch_k3_kl": 1e-4 * 1.4**s}
        )  # fmt: skip
    return pd.DataFrame(steps), pd.DataFrame(buckets)


def _variance_panels():
    """Theory, and fixed made-up Monte Carlo points of each verdict: reliable, marginal, unreliable."""
    frame = _tidy("lognormal", 1.0, 0.1, [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], ["var_P", *VAR_G])
    exact = frame[(frame["method"] == "exact")].set_index(["statistic", "T"])["value"]
    verdicts = {1: "", 10: "marginal: interval", 100: "unreliable: too few draws", 1000: "unreliable: k-hat"}
    shrink = {1: 1.0, 10: 1.0, 100: 0.3, 1000: 1e-40}  # flagged points below the line, as in practice
    rows = [
        {**frame.iloc[0].to_dict(), "T": t, "statistic": stat, "method": "monte_carlo",
         "value": v, "log10_value": np.log10(v), "lo": v / w, "hi": v * w,
         "reliable": stat == "var_G" or reason == "", "reason": "" if stat == "var_G" else reason}
        for t, reason in verdicts.items()
        for stat, w in (("var_P", 1.25), ("var_G", 1.01))
        for v in [exact[(stat, t)] * (shrink[t] if stat == "var_P" else 1.0)]
    ]  # fmt: skip
    frame = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    return plots.variance_panels(frame, n=1000, style="paper")


def _ratio_vs_T():
    T = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    frame = pd.concat([_tidy("lognormal", m, 0.1, T, ["var_ratio"]) for m in (0.9, 1.0, 1.1)])
    return plots.ratio_vs_T(frame, style="paper")


def _grid(T, statistic):
    mus, s2s = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2), (0.01, 0.03, 0.1, 0.3, 1.0)
    return pd.concat([_tidy("lognormal", m, s2, T, [statistic]) for m in mus for s2 in s2s])


def _heatmap_var_P():
    return plots.heatmap(_grid([100], "var_P"), "var_P", T=100, style="paper")


def _decay_boundary():
    return plots.decay_boundary(_grid([10, 100], "var_P"), (10, 100), style="paper")


def _approx_error():
    T = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    frame = pd.concat([_tidy(f, 1.0, 0.1, T, VAR_G) for f in ("lognormal", "gamma", "two-point")])
    return plots.approx_error(frame, style="paper")


def _mc_frontier():
    T = list(range(1, 60)) + list(range(60, 2001, 20))
    series = [("lognormal", 1.0, 0.01), ("lognormal", 1.0, 0.1), ("gamma", 1.0, 0.1)]
    frame = pd.concat([_tidy(f, m, s2, T, ["n_needed_P"]) for f, m, s2 in series])
    return plots.mc_frontier(frame, [10.0**k for k in range(2, 13)], style="paper")


def _corrections_vs_T():
    """Draw four corrections' closed forms, and fixed made-up experiment points on a fitted lognormal."""
    from variance_lab import corrections as co
    from variance_lab.report import corrections_figure

    specs = "seq-tis:3,seq-mask:3,tis:2,gmpo"
    rows = []

    def add(frame, method):
        for r in frame.itertuples(index=False):
            for stat, v in (("rel_bias", r.bias / r.mean_base), ("ess_frac", r.ess_frac)):
                lo, hi = (v - 0.05, min(v + 0.03, 1.0)) if method == "experiment" else (float("nan"),) * 2
                rows.append(
                    {"T": r.T, "correction": r.correction, "statistic": stat, "method": method,
                     "value": v, "lo": lo, "hi": hi, "reliable": True}
                )  # fmt: skip

    add(
        co.theory(get_family("lognormal", 1.0, 0.1), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], specs),
        "exact",
    )
    fit = get_family("lognormal", 1.0, 0.02)
    add(co.theory(fit, [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 346], specs), "experiment_fit")
    add(co.theory(fit, [11, 23, 45, 90, 176, 283], specs), "experiment")
    return corrections_figure.corrections_vs_T(pd.DataFrame(rows), title="lognormal", style="paper")


def _clip_fractions():
    """Observed against predicted clip fractions from a fixed per-bucket table (the six models of analyze)."""
    obs = {"gspo": [0.1, 0.35, 0.54, 0.41, 0.69], "ppo": [9e-4, 2e-3, 2.4e-3, 1e-3, 0.0]}
    table = pd.DataFrame(
        {
            "T_lo": [8, 16, 32, 64, 128],
            "T_hi": [15, 31, 63, 127, 255],
            "gspo_clip_frac": obs["gspo"],
            "gspo_clip_frac_lo": [0.075, 0.3, 0.49, 0.36, 0.58],
            "gspo_clip_frac_hi": [0.14, 0.4, 0.59, 0.46, 0.78],
            "gspo_clip_pred_iid": [0.95, 0.92, 0.88, 0.83, 0.71],
            "gspo_clip_pred_emp": [float("nan")] * 5,
            "gspo_clip_pred_corr": [0.94, 0.91, 0.87, 0.82, 0.70],
            "gspo_clip_pred_mix": [0.5, 0.75, 0.84, 0.82, 0.71],
            "gspo_clip_pred_hier": [0.62, 0.56, 0.5, 0.44, 0.34],
            "gspo_clip_pred_comb": [0.15, 0.3, 0.5, 0.45, 0.6],
            "ppo_clip_frac": obs["ppo"],
            "ppo_clip_frac_lo": [0.0, 1e-3, 1.8e-3, 7.8e-4, 0.0],
            "ppo_clip_frac_hi": [2.1e-3, 3e-3, 3.1e-3, 1.5e-3, 4e-4],
            "ppo_clip_pred_iid": [1.5e-31] * 5,
            "ppo_clip_pred_emp": [1e-3] * 5,
            "ppo_clip_pred_corr": [1.5e-31] * 5,
            "ppo_clip_pred_mix": [5e-5] * 5,
            "ppo_clip_pred_hier": [5.2e-5, 4.5e-5, 4e-5, 3.6e-5, 3.2e-5],
            "ppo_clip_pred_comb": [8e-4, 1.5e-3, 2e-3, 1.2e-3, 3e-4],
        }
    )
    return clip_figure(table, style="paper", title="made-up rollouts")


def _analysis_figure():
    """Draw the analyze command's figure from a fixed per-bucket table and prediction curves (no bootstrap).

    Var(P_T): the three predictions coincide (one line and its note), one point hollow (small ESS);
    Var(G_T): three lines apart.
    """
    T_lo, T_hi = np.array([8, 16, 32, 64, 128]), np.array([15, 31, 63, 127, 255])
    T_mean = np.sqrt(T_lo * T_hi)
    s2 = 0.004
    log_p = np.log10(np.expm1(s2 * T_mean))
    log_g = np.log10(s2 / T_mean)
    table = pd.DataFrame(
        {
            "T_min": T_lo, "T_mean": T_mean, "T_max": T_hi, "n_seq": [350, 340, 420, 440, 420],
            "ess_P": [340.0, 320.0, 380.0, 300.0, 20.0],
            "log10_var_P": log_p + np.array([0.1, -0.05, 0.2, -0.1, -0.6]),
            "log10_var_P_lo": log_p - 0.3, "log10_var_P_hi": log_p + 0.4,
            "log10_var_G": log_g + np.array([0.05, 0.1, -0.05, 0.0, 0.08]),
            "log10_var_G_lo": log_g - 0.15, "log10_var_G_hi": log_g + 0.2,
        }
    )  # fmt: skip
    T = np.unique(np.geomspace(8, 255, 40).round())
    curves = []
    for model, dp, f in (("iid", 0.0, 1.0), ("emp", 0.01, 0.8), ("corr", -0.01, 1.6)):
        log_pt, var_g = np.log10(np.expm1(s2 * T)) + dp, f * s2 / T
        curves.append(pd.DataFrame({"T": T, "model": model, "log10_var_P": log_pt, "var_G": var_g}))
    curves = pd.concat(curves, ignore_index=True).assign(log10_var_G=lambda d: np.log10(d["var_G"]))
    return analysis_figure(table, curves, level=0.95, style="paper")


def _thresholds():
    """CTPO's clipped fraction by position, M2PO's masked fraction by tau: closed forms, made-up points."""
    from variance_lab import corrections as co
    from variance_lab.report.threshold_figure import threshold_figure

    fam = get_family("lognormal", 1.0, 0.1)
    rows = []

    def add(panel, series, x, method, value, lo=float("nan"), hi=float("nan"), reliable=True):
        rows.append({"panel": panel, "series": series, "x": x, "method": method, "value": value,
                     "lo": lo, "hi": hi, "reliable": reliable})  # fmt: skip

    t = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    for spec in ("ctpo:0.5:0.5", "ctpo:1:1"):
        pos = co.ctpo_positions(fam, spec, 1000).set_index("t").frac_clipped
        for x in t:
            add("ctpo", spec, x, "exact", pos[x])
        for x in (1, 10, 100):
            add("ctpo", spec, x, "monte_carlo", pos[x] + 0.01, pos[x] - 0.01, pos[x] + 0.03, x != 100)
        add("ctpo", spec, co.find_T(fam, spec, 0.5), "binding", 0.5)
    taus = [0.003, 0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.2]
    th = co.theory(fam, [1], [f"m2po:{x}" for x in taus]).frac_modified
    for x, f in zip(taus, th, strict=True):
        add("m2po", "large-batch limit", x, "exact", f)
        add("m2po", "batch of 16 tokens", x, "monte_carlo", f + 0.02, f + 0.005, f + 0.035)
    return threshold_figure(pd.DataFrame(rows), title="lognormal", style="paper")


def _prob_masks():
    """Masked fractions at fixed q (quadrature lines, made-up Monte Carlo points), made-up bins, CPPO by T."""
    from variance_lab import corrections as co
    from variance_lab.report.probmask_figure import cppo_series, prob_mask_figure

    fam = get_family("lognormal", 1.0, 0.1)
    rows = []

    def add(panel, series, x, method, value, lo=float("nan"), hi=float("nan"), reliable=True):
        rows.append({"panel": panel, "series": series, "x": x, "method": method, "value": value,
                     "lo": lo, "hi": hi, "reliable": reliable})  # fmt: skip

    for q in (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.95, 0.98):
        th = co.theory(fam, [1], "dppo-tv,kpop", token_prob=co.TokenProbability.fixed(q))
        for r in th.itertuples():
            if r.correction != "dppo-tv":
                add("q", r.correction, q, "exact", r.frac_modified)
    add("q", "kpop", 0.5, "monte_carlo", 0.004, 0.003, 0.005)
    add("q", "dppo-tv [A>0]", 0.2, "monte_carlo", 0.01, 0.008, 0.012, False)
    for spec, shape in (("dppo-tv", 0.4), ("kpop", 0.6), ("icepop", -0.1)):
        for x, value in zip(
            (0.005, 0.05, 0.3, 0.7, 0.95, 0.995), np.linspace(0.05, 0.5, 6) ** (1 + shape), strict=True
        ):
            add("p", spec, x, "observed", value, value * 0.7, value * 1.3)
            add("entropy", spec, 5 * x, "observed", value / 2, value * 0.35, value * 0.65)
    # (d) CPPO against T: the figure's exact values at the default spec (rounded), made-up Monte Carlo
    for s2, dppo, alone, limit, mc in (
        (
            0.1,
            5.24e-4,
            (5.24e-4, 2.55e-4, 2.30e-4, 2.24e-4, 2.23e-4),
            2.23e-4,
            (5.4e-4, 1.3e-3, 5.3e-4, 2.6e-4),
        ),
        (0.5, 0.0209, (0.0209, 0.0153, 0.0153, 0.0152, 0.0152), 0.5, (0.021, 0.076, 0.22, 0.39)),
    ):
        for T, a in zip((1, 3, 10, 100, 1000), alone, strict=True):
            add("T", cppo_series("dppo-tv:0.2", s2), T, "exact", dppo)
            add("T", cppo_series("threshold alone", s2), T, "exact", a)
        for T in (1, 1000):
            add("T", cppo_series("limit", s2), T, "limit", limit)
        for T, v in zip((1, 10, 100, 1000), mc, strict=True):
            add("T", cppo_series("cppo", s2), T, "monte_carlo", v, v * 0.85, v * 1.15, T < 1000 or s2 == 0.5)
    return prob_mask_figure(pd.DataFrame(rows), title="lognormal", style="paper")


def _add_rows(frame, rows):
    cols = ["panel", "series", "x", "method", "value", "lo", "hi", "reliable"]
    return pd.concat([frame, pd.DataFrame(rows, columns=cols)], ignore_index=True)


T_SMALL = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]


def _sign_weights():
    """TOPR, OPSM and ASPO by sign: closed forms, made-up Monte Carlo and data points."""
    from variance_lab.paper.method_frames import sign_frame
    from variance_lab.report.method_figures import sign_figure

    params = {
        "family": "lognormal",
        "mu": 1.0,
        "sigma2": 0.1,
        "specs": ["topr", "opsm:0.05", "aspo"],
        "T": T_SMALL,
    }
    frame = sign_frame(params)
    exact = frame.set_index(["panel", "series", "x"]).value
    rows = [
        (
            "bias",
            "topr [A<0]",
            t,
            "monte_carlo",
            exact[("bias", "topr [A<0]", t)] + 0.01,
            exact[("bias", "topr [A<0]", t)] - 0.02,
            exact[("bias", "topr [A<0]", t)] + 0.04,
            t != 100,
        )
        for t in (1, 10, 100)
    ]
    rows += [("var", "aspo [A>=0]", 10, "monte_carlo", 0.34, float("nan"), float("nan"), True)]
    labels = ["topr [A>=0]", "topr [A<0]", "opsm:0.05 [A>=0]", "opsm:0.05 [A<0]", "aspo [A>=0]", "aspo [A<0]"]
    bias = [-0.003, -0.011, 0.0, -0.021, -0.0005, -0.001]
    rows += [
        ("data", s, k, "data", b, b - 0.008, b + 0.006, True)
        for k, (s, b) in enumerate(zip(labels, bias, strict=True))
    ]
    return sign_figure(_add_rows(frame, rows), title="lognormal", data_title="stale_gspo, update ratio",
                       style="paper")  # fmt: skip


def _vcpo_ess():
    """VCPO's ESS ratio by lag and by family (exact), made-up minibatch means and baseline gains."""
    from variance_lab.paper.method_frames import vcpo_frame
    from variance_lab.report.method_figures import vcpo_figure

    params = {"family": "lognormal", "mu": 1.0, "sigma2": 1e-3, "lags": [1, 4], "T": T_SMALL,
              "families": [["lognormal", 1.0, 1e-3], ["ar1", 1.0, 1e-3, {"rho": 0.5}]]}  # fmt: skip
    frame = vcpo_frame(params)
    rows = [
        ("lag", "lag 1", t, "monte_carlo", v, v - 0.01, v + 0.01, True)
        for t, v in ((100, 0.91), (1000, 0.44))
    ]
    rows += [("baseline", run, k, "data", g, float("nan"), float("nan"), True)
             for k, (run, g) in enumerate((("onpolicy_gspo", 1.042), ("mismatch_bf16", 1.035)))]  # fmt: skip
    return vcpo_figure(_add_rows(frame, rows), title="lognormal", style="paper")


def _speed_bounds():
    """Draw the bounds of "When Speed Kills Stability" against the exact values: one state, a mixture."""
    from variance_lab.paper.method_frames import speed_bounds_frame
    from variance_lab.report.method_figures import bounds_figure

    mix = {"components": "0.98:-0.0005:0.001,0.02:-0.25:0.5"}
    params = {"families": [["lognormal", 1.0, 0.01], ["lognormal-mixture", None, None, mix]], "T": T_SMALL,
              "n": [10.0, 100.0, 1000.0, 10000.0], "T_max": 1500}  # fmt: skip
    return bounds_figure(speed_bounds_frame(params), style="paper")


def _run_figure():
    """Draw the figure of a run from fixed made-up step and bucket frames (8 steps, 3 buckets).

    The shortest bucket has too few sequences in steps 3 and 4 (a gap in its lines).
    """
    from variance_lab.report.run_figure import run_figure

    steps, buckets = run_frames()
    return run_figure(steps, buckets, style="paper")


FIGURES = {
    "prob_masks": _prob_masks,
    "sign_weights": _sign_weights,
    "vcpo_ess": _vcpo_ess,
    "speed_bounds": _speed_bounds,
    "thresholds": _thresholds,
    "corrections_vs_T": _corrections_vs_T,
    "variance_panels": _variance_panels,
    "ratio_vs_T": _ratio_vs_T,
    "heatmap_var_P": _heatmap_var_P,
    "decay_boundary": _decay_boundary,
    "approx_error": _approx_error,
    "mc_frontier": _mc_frontier,
    "clip_fractions": _clip_fractions,
    "analysis_figure": _analysis_figure,
    "run_figure": _run_figure,
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_matches_its_baseline(name, tmp_path):
    """The figure matches its committed PNG baseline within the image tolerance."""
    fig = FIGURES[name]()
    actual = tmp_path / f"{name}.png"
    try:
        fig.savefig(actual, dpi=DPI)
    finally:
        plt.close(fig)
    expected = BASELINE / f"{name}.png"
    if os.environ.get(UPDATE_ENV) == "1":
        BASELINE.mkdir(exist_ok=True)
        shutil.copyfile(actual, expected)
        return
    assert expected.is_file(), f"no baseline {expected}: run with {UPDATE_ENV}=1 and commit it"
    result = compare_images(str(expected), str(actual), tol=TOL)
    assert result is None, result


def test_a_changed_drawing_fails_the_comparison(tmp_path):
    """The comparison is sensitive: a thicker line alone exceeds the tolerance."""
    name = "ratio_vs_T"
    expected = BASELINE / f"{name}.png"
    if not expected.is_file():
        pytest.fail(f"no baseline {expected}")
    T = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    frame = pd.concat([_tidy("lognormal", m, 0.1, T, ["var_ratio"]) for m in (0.9, 1.0, 1.1)])
    fig = plots.ratio_vs_T(frame, style="paper", lw=3.0)
    actual = tmp_path / f"{name}.png"
    fig.savefig(actual, dpi=DPI)
    plt.close(fig)
    assert compare_images(str(expected), str(actual), tol=TOL) is not None
