"""Fast theory: the suite's ``theory`` and ``sweep`` sections (issue #16).

``theory``
    Points per second of :func:`variance_lab.theory.grid` (float64, mpmath only where the
    float path cannot certify a point) against the mpmath path (``precise=True``) on the
    same points, per family, in one run; the share of points the float path certified; a
    notebook slider move (the four curves of one panel of notebook 02).
``sweep``
    A 1,000-cell theory-only sweep: its compute (:func:`variance_lab.sweep.run.compute_theory`,
    plan included) apart from the store's writes (the rest of :func:`variance_lab.sweep.sweep`).

Every row is printed with the load average at the time (``/proc/loadavg``): the machine
may be shared, and CPU-time rates move much less with load than wall-clock ones.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

SEED_GRID = (1, 10, 100, 1000)

#: (family, shape) timed; each over mu x sigma2 x T of the issue's accuracy domain.
FAMILIES = (
    ("lognormal", {}),
    ("gamma", {}),
    ("two-point", {"q": 0.5}),
    ("ar1", {"rho": 0.5}),
    ("random-scale", {"alpha": 1.0}),
)
TARGET_POINTS_PER_S = 1e5


def load() -> str:
    """Return the 1-minute load average, as ``/proc/loadavg`` has it."""
    try:
        with open("/proc/loadavg") as fh:
            return fh.read().split()[0]
    except OSError:  # pragma: no cover - not Linux
        return "?"


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _axes(name: str, quick: bool):
    mus = np.linspace(0.5, 2.0, 10 if quick else 40)
    top = 0.9 * 0.25 if name == "two-point" else 10.0  # two-point (q = 1/2) needs sigma2 < mu^2
    s2s = np.geomspace(1e-3, top, 10 if quick else 50)
    Ts = np.unique(np.geomspace(1, 1e6, 20).round().astype(int))
    return mus, s2s, Ts


def grid_speed(rep, quick: bool, repeats: int) -> None:
    """Float path against mpmath, points per second, per family, in one run."""
    for name, shape in FAMILIES:
        _family_speed(rep, name, shape, quick, repeats)
    _mixture_speed(rep, quick, repeats)


def _mixtures(count: int) -> list[str]:
    """Two-component mixtures like the issue's: a narrow bulk and a sparse wide component."""
    out = []
    for p in np.geomspace(1e-3, 0.3, count).tolist():
        v = 0.01 + 0.5 * p
        out.append(f"{1 - p!r}:0:1e-8,{p!r}:{-v / 2!r}:{v!r}")
    return out


def _mixture_speed(rep, quick: bool, repeats: int) -> None:
    """lognormal-mixture: one float call per mixture (vectorised over T) against mpmath."""
    from variance_lab import theory

    comps = _mixtures(20 if quick else 200)
    Ts = _axes("lognormal-mixture", quick)[2]
    points = len(comps) * len(Ts)
    theory.grid("lognormal-mixture", components=comps[:2], T=Ts)  # imports, caches
    runs = [_timed(lambda: theory.grid("lognormal-mixture", components=comps, T=Ts)) for _ in range(repeats)]
    df = runs[-1][0]
    fast_wall, fast_cpu = float(np.median([r[1] for r in runs])), float(np.median([r[2] for r in runs]))
    slow = comps[:: max(1, len(comps) // (4 if quick else 12))]
    _, _, slow_cpu = _timed(lambda: theory.grid("lognormal-mixture", components=slow, T=Ts, precise=True))
    slow_pts = len(slow) * len(Ts)
    print(
        f"[theory] lognormal-mixture: {len(comps)} mixtures x {len(Ts)} T (1..1e6) = {points} points; "
        f"mpmath on {slow_pts} of them (load {load()})"
    )
    name = "lognormal-mixture"
    rate_cpu = points / fast_cpu
    rep.add("theory", f"{name}: theory.grid points/s (CPU time)", rate_cpu, "1/s")
    rep.add("theory", f"{name}: theory.grid points/s (wall)", points / fast_wall, "1/s")
    rep.add("theory", f"{name}: mpmath (precise=True) points/s (CPU time)", slow_pts / slow_cpu, "1/s")
    rep.add("theory", f"{name}: float path / mpmath speed (CPU time)", rate_cpu / (slow_pts / slow_cpu), "x")
    rep.add("theory", f"{name}: share of points certified in float64", 1.0 - float(df["precise"].mean()), "")


def _family_speed(rep, name: str, shape: dict, quick: bool, repeats: int) -> None:
    from variance_lab import theory

    n_slow = 4 if quick else 12  # (mu, sigma2) pairs timed with mpmath
    mus, s2s, Ts = _axes(name, quick)
    points = len(mus) * len(s2s) * len(Ts)
    theory.grid(name, mu=mus[:2], sigma2=s2s[:2], T=Ts, **shape)  # imports, caches
    runs = [_timed(lambda: theory.grid(name, mu=mus, sigma2=s2s, T=Ts, **shape)) for _ in range(repeats)]
    df = runs[-1][0]
    fast_wall, fast_cpu = float(np.median([r[1] for r in runs])), float(np.median([r[2] for r in runs]))
    certified = 1.0 - float(df["precise"].mean())
    slow_mu = mus[np.linspace(0, len(mus) - 1, n_slow).round().astype(int)]
    slow_s2 = s2s[np.linspace(0, len(s2s) - 1, n_slow).round().astype(int)]
    slow_pts = n_slow * len(Ts)

    def slow():
        for m, s2 in zip(slow_mu, slow_s2, strict=True):
            theory.grid(name, mu=m, sigma2=s2, T=Ts, precise=True, **shape)

    _, _, slow_cpu = _timed(slow)
    print(
        f"[theory] {name} {shape or ''}: {len(mus)} mu x {len(s2s)} sigma2 x {len(Ts)} T (1..1e6) = "
        f"{points} points; mpmath on {slow_pts} of them (load {load()})"
    )
    rate_cpu = points / fast_cpu
    ok = rate_cpu >= TARGET_POINTS_PER_S if name in ("lognormal", "gamma") else None
    tgt = ">= 1e5" if ok is not None else ""
    rep.add("theory", f"{name}: theory.grid points/s (CPU time)", rate_cpu, "1/s", tgt, ok)
    rep.add("theory", f"{name}: theory.grid points/s (wall)", points / fast_wall, "1/s")
    rep.add("theory", f"{name}: mpmath (precise=True) points/s (CPU time)", slow_pts / slow_cpu, "1/s")
    rep.add("theory", f"{name}: float path / mpmath speed (CPU time)", rate_cpu / (slow_pts / slow_cpu), "x")
    rep.add("theory", f"{name}: share of points certified in float64", certified, "")


def slider(rep, repeats: int) -> None:
    """One move of notebook 02's slider: the four log10 curves of a panel over its T line."""
    from variance_lab import get_family, theory
    from variance_lab.paper.sizes import sizes

    T = list(sizes(quick=False).T_line)

    def move():
        for name, mu, s2 in (("lognormal", 1.0, 0.1), ("gamma", 1.1, 0.3), ("two-point", 0.9, 0.2)):
            f = get_family(name, mu, s2)
            theory.var_P(f, T, log10=True)
            theory.ess_frac_P(f, T, log10=True)
            theory.var_G(f, T, log10=True)
            theory.value("var_G_naive", f, T, log10=True)

    move()
    walls = [_timed(move)[1] / 3 for _ in range(repeats)]
    print(f"[theory] notebook 02 slider: the four curves of one panel over {len(T)} lengths (load {load()})")
    w = float(np.median(walls))
    rep.add("theory", "slider move: one panel's theory (wall)", w, "s", "< 0.2", w < 0.2, quick_ok=True)


def theory_sweep(rep, cells: int) -> None:
    """Time a theory-only sweep: compute (plan and batch) apart from the store's writes."""
    from variance_lab.sweep import plan, sweep
    from variance_lab.sweep.run import compute_theory

    n_mu = 10
    mus = list(np.linspace(0.9, 1.1, n_mu))
    sigma2s = list(np.geomspace(0.01, 1.0, cells // n_mu))
    what = f"lognormal, {n_mu} mu x {len(sigma2s)} sigma2, T grid {SEED_GRID}"
    print(f"[sweep] theory only, {what} (load {load()})")
    compute_theory(plan("lognormal", mus[:2], sigma2s[:2], SEED_GRID).cells)  # imports
    the_plan, plan_wall, plan_cpu = _timed(lambda: plan("lognormal", mus, sigma2s, SEED_GRID))
    _, comp_wall, comp_cpu = _timed(lambda: compute_theory(the_plan.cells))
    with tempfile.TemporaryDirectory() as d:
        res, wall, _cpu = _timed(
            lambda: sweep(
                "lognormal", mus, sigma2s, SEED_GRID, 0, store=os.path.join(d, "s.sqlite"), progress=False
            )
        )
    n = len(res.computed)
    compute_s = plan_cpu + comp_cpu
    rep.add(
        "sweep", f"{n} theory cells: compute, plan included (CPU time)", compute_s, "s", "< 1", compute_s < 1
    )
    rep.add("sweep", f"{n} theory cells: compute, plan included (wall)", plan_wall + comp_wall, "s")
    rep.add("sweep", "  the whole sweep into a temporary store (wall)", wall, "s")
    rep.add(
        "sweep", "  of which the store's writes and reads (wall, the rest)", wall - plan_wall - comp_wall, "s"
    )
    rep.add("sweep", "  cells per second, whole sweep (wall)", n / wall, "1/s")
