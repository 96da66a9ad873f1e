r"""Logged sequence metrics predicted from a per-token law, and judged: can a batch estimate them.

At length :math:`L`, :math:`\log P_L \sim N(mL, s^2L)` under the token law
(:class:`~variance_lab.frameworks.tokenlaw.TokenLaw`). Each framework's sequence metric is a
batch average of :math:`f(\log P)` (over sequences, or weighted by length over tokens, as the
framework does; :data:`~variance_lab.frameworks.logfiles.SEQUENCE_METRICS`):
``chi2_seq`` (:math:`f = e^{2\operatorname{clip}(\log P, \pm 20)}`, minus 1), a truncated mean
(:math:`\min(P, C)`, non-finite weights 0 as NeMo-RL), a masked mean (:math:`P\,1\{P \le C\}`,
TRL's ``sequence_mask``), the fraction above :math:`C`, and verl's token-weighted Kong ESS of
:math:`\min(P, C)`, :math:`(\sum_i L_i w_i)^2 / (\sum_i L_i \sum_i L_i w_i^2)` (its draws
needed from the simulated batches' spread). :func:`predict_steps` draws ``n_batches``
batches of B sequences once (lengths resampled from the run's length distribution, standard
normals :math:`Z`), sets :math:`\log P = mL + s\sqrt L\,Z` for each step's law, and reports the
median and the central ``level`` interval of the value a batch would log: where a logged value
falls outside it (:func:`agreement`), the law does not describe the run.

**The verdict: can a batch of B sequences estimate it at all.** The quantity a metric
estimates is its expectation (``target``; for ``chi2_seq`` the untruncated
:math:`E[P^2] - 1 = \overline{e^{L(2m + 2s^2)}} - 1`, what verl's name promises). The draws
needed for a relative standard error ``target_rel`` are
:math:`n = \operatorname{Var}(f)/(\text{target\_rel}\cdot E f)^2` (for ``chi2_seq``:
:math:`(E[P^4]/E[P^2]^2 - 1)/\text{target\_rel}^2`, all from closed forms mixed over the lengths;
length-weighted metrics by the delta method). The verdict is ``reliable`` when :math:`n \le B`,
``marginal`` when the relative standard error :math:`\text{target\_rel}\sqrt{n/B}` lies between
``target_rel`` and 1, ``unreliable`` above 1 or when, for an unbounded summand, the Pareto
:math:`\hat k` its B summands show (the median over the first 40 simulated batches,
:func:`variance_lab.stats.pareto_khat_rows`) exceeds PSIS's limit
:math:`\min(1 - 1/\log_{10} B, 0.7)` (:func:`variance_lab.simulate.estimates.khat_limit`).

**A fraction near 0.** The fraction of sequences above :math:`C` has no useful relative error
when a batch expects fewer than one such sequence (:math:`Bp < 1`): the reason then says how
many a batch expects, and that a batch that logs 0 of B bounds :math:`p` below :math:`3/B` (the
rule of three, 95 %), not its size. A fraction that is exactly 0 under the law
(:math:`s^2 = 0`) is logged exactly: ``reliable``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from variance_lab import stats
from variance_lab.frameworks.logfiles import SequenceMetric
from variance_lab.frameworks.tokenlaw import TokenLaw, log_partial_moment
from variance_lab.frameworks.verl import SAFETY_BOUND
from variance_lab.report.table import format_number, format_pow10
from variance_lab.simulate.estimates import khat_limit

__all__ = ["LOGGED_RTOL", "N_KHAT", "agreement", "length_sampler", "predict", "predict_steps"]

#: Relative tolerance of :func:`agreement` at an interval's ends. Logged numbers are float32:
#: verl's metrics are float32 tensors' ``.item()``, TensorBoard's ``add_scalar`` stores a float32,
#: and float32's spacing is :math:`2^{-23} = 1.2\cdot 10^{-7}` relative; a value within a few
#: roundings of an end (an ESS logged as 1 against a predicted 0.99999999) is inside.
LOGGED_RTOL = 1e-6

#: Simulated batches whose summands' Pareto :math:`\hat k` is taken (the median is reported).
N_KHAT = 40

#: Elements of log P simulated at once (a chunk of steps' batches; 1 MB of float64: in cache).
_CHUNK = 2**17


# --------------------------------------------------------------------------------------
# lengths
# --------------------------------------------------------------------------------------
def length_sampler(lengths=None, quantiles=None):
    r"""Return ``draw(rng, shape) -> lengths`` and the lengths' representative grid.

    ``lengths``: a sample of sequence lengths (a dump), drawn from with replacement.
    ``quantiles``: lengths at evenly spaced probabilities from 0 to 1 (one value: every
    sequence has it; ``8000,10000``: uniform between them), interpolated linearly.

    Returns
    -------
    (draw, grid)
        ``grid`` is 256 or fewer lengths, equally likely, standing for the distribution in the
        closed forms.
    """
    if (lengths is None) == (quantiles is None):
        raise ValueError("give either lengths (a sample) or quantiles")
    src = np.asarray(lengths if lengths is not None else quantiles, dtype=float).ravel()
    if src.size == 0 or not np.all(np.isfinite(src)) or np.any(src < 1):
        bad = src[~(np.isfinite(src) & (src >= 1))]
        raise ValueError(f"lengths must be >= 1, got {bad[0] if bad.size else 'none'!r}")
    if lengths is not None:
        sample = np.sort(src)

        def draw(rng, shape):
            return sample[rng.integers(0, sample.size, size=shape)]

        grid = sample if sample.size <= 256 else np.quantile(sample, (np.arange(256) + 0.5) / 256)
        return draw, grid
    q = np.asarray(src, dtype=float)
    if np.any(np.diff(q) < 0):
        raise ValueError(f"length quantiles must not decrease, got {q.tolist()!r}")
    probs = np.linspace(0.0, 1.0, q.size) if q.size > 1 else np.array([0.0])

    def qf(u):
        return np.interp(u, probs, q) if q.size > 1 else np.full(np.shape(u), q[0])

    def draw(rng, shape):
        return np.round(qf(rng.random(shape)))

    return draw, np.round(qf((np.arange(256) + 0.5) / 256))


# --------------------------------------------------------------------------------------
# closed forms, per step (rows) and length (columns)
# --------------------------------------------------------------------------------------
def _log_moments(kind: str, M, S, bound: float | None, j: int) -> np.ndarray:
    r"""Log :math:`E[f^j]` per length (the target's f: for ``chi2_seq`` :math:`P^2`, unclamped)."""
    inf = math.inf
    if kind == "chi2_seq":
        return 2.0 * j * np.asarray(M) + 0.5 * (2.0 * j) ** 2 * np.asarray(S) ** 2
    lc = math.log(bound)
    below = log_partial_moment(float(j), M, S, -inf, lc)
    above = log_partial_moment(0.0, M, S, lc, inf)
    if kind in ("trunc_mean", "ess_trunc"):
        return np.logaddexp(below, j * lc + above)
    if kind == "masked_mean":
        return below
    return above


def _mix(log_values: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """Log of the mean over the length grid (last axis) of exp(log_values), weighted by exp(log_w)."""
    return special.logsumexp(log_values + log_w, axis=-1) - special.logsumexp(log_w)


def _targets(metric: SequenceMetric, m, s2, grid, bound, target_rel: float):
    """Return (target, log10 target, log10 draws needed) per step, from closed forms mixed over lengths."""
    grid = np.asarray(grid, float)
    M, S = m[:, None] * grid, np.sqrt(s2[:, None] * grid)
    lw = np.log(grid) if metric.weighting == "token" else np.zeros(grid.size)
    l1 = _log_moments(metric.kind, M, S, bound, 1)
    l2 = _log_moments(metric.kind, M, S, bound, 2)
    log_mean = _mix(l1, lw)  # E[L f] / E[L] (or E f)
    ln10 = math.log(10)
    if metric.kind == "ess_trunc":  # (E[L w])^2 / (E[L] E[L w^2]); draws needed: from the simulation
        log_ess = 2 * log_mean - _mix(l2, lw)
        return np.exp(log_ess), log_ess / ln10, np.full(m.size, math.nan)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        if metric.weighting == "token":  # delta method: Var(L (f - mu)) / (E L)^2
            mu = np.exp(log_mean)[:, None]
            var = (grid**2 * (np.exp(l2) - 2 * mu * np.exp(l1) + mu * mu)).mean(axis=-1) / grid.mean() ** 2
            log_var = np.where(var > 0, np.log(np.where(var > 0, var, 1.0)), -np.inf)
        else:
            log_second = _mix(l2, lw)
            gap = 2 * log_mean - log_second  # log(E f)^2 - log E f^2 <= 0
            log_var = np.where(gap < 0, log_second + np.log(-np.expm1(np.minimum(gap, 0.0))), -np.inf)
        log10_needed = np.where(
            log_mean > -np.inf, (log_var - 2 * log_mean - 2 * math.log(target_rel)) / ln10, np.inf
        )
        if metric.kind == "chi2_seq":
            target = np.where(log_mean < 700, np.expm1(np.minimum(log_mean, 700.0)), np.inf)
            log10_target = np.where(
                log_mean > 1, log_mean / ln10, np.where(target > 0, np.log10(np.abs(target)), np.nan)
            )
        else:
            target = np.exp(log_mean)
            log10_target = log_mean / ln10
    return target, log10_target, log10_needed


# --------------------------------------------------------------------------------------
# simulation, a chunk of steps at once
# --------------------------------------------------------------------------------------
def _exp(x: np.ndarray, cache: dict) -> np.ndarray:
    """Return P = e^x of a chunk, once for all its metrics (inf past 709, 0 below -745: both capped)."""
    if "exp" not in cache:
        with np.errstate(over="ignore", under="ignore"):
            cache["exp"] = np.exp(x)
    return cache["exp"]


def _batch_values(metric: SequenceMetric, x: np.ndarray, L: np.ndarray, bound, cache: dict) -> np.ndarray:
    r"""Return the value each simulated batch logs (x: log P, shape (steps, batches, B); L: (batches, B)).

    ``cache`` holds what the metrics of one chunk share: :math:`P`, ``x > log C``,
    :math:`\min(P, C)` and its (length-weighted) batch sum.
    """
    if metric.kind == "chi2_seq":  # e^(2 clip(log P, +-20)) = clip(P, e^-20, e^20)^2
        f = np.clip(_exp(x, cache), math.exp(-SAFETY_BOUND), math.exp(SAFETY_BOUND))
        f *= f
        return f.mean(axis=-1) - 1.0
    lc = math.log(bound)
    token = metric.weighting == "token"
    if metric.kind in ("frac_above", "masked_mean") and ("above", lc) not in cache:
        cache["above", lc] = x > lc
    if metric.kind == "frac_above":
        above = cache["above", lc]
        return np.einsum("kbi,bi->kb", above, L) / L.sum(axis=-1) if token else above.mean(axis=-1)
    if metric.kind == "masked_mean":  # P 1{P <= C}
        f = np.where(cache["above", lc], 0.0, _exp(x, cache))
        return np.einsum("kbi,bi->kb", f, L) / L.sum(axis=-1) if token else f.mean(axis=-1)
    if ("trunc", lc) not in cache:  # min(P, C)
        cache["trunc", lc] = np.minimum(_exp(x, cache), bound)
    f = cache["trunc", lc]
    key = ("sum", lc, token)
    if key not in cache:
        cache[key] = np.einsum("kbi,bi->kb", f, L) if token else f.sum(axis=-1)
    if metric.kind == "ess_trunc":  # Kong's ESS over tokens: (sum L w)^2 / (sum L * sum L w^2)
        return cache[key] ** 2 / (L.sum(axis=-1) * np.einsum("kbi,bi,kbi->kb", f, L, f))
    return cache[key] / (L.sum(axis=-1) if token else x.shape[-1])


def _khat_tail(B: int) -> int:
    """Values of a batch's top tail that its Pareto k-hat is fitted to (PSIS: min(B/5, 3 sqrt B) + 1)."""
    return math.ceil(min(0.2 * B, 3.0 * math.sqrt(B))) + 1


def _top_tails(x: np.ndarray) -> np.ndarray:
    """Return the largest log-summands of chi2_seq in the first :data:`N_KHAT` batches, per step."""
    B = x.shape[-1]
    tail = _khat_tail(B)
    top = np.partition(x[:, :N_KHAT], B - tail, axis=-1)[..., B - tail :]  # clip and 2x keep the order
    return 2.0 * np.clip(top, -SAFETY_BOUND, SAFETY_BOUND)


def _median_khat(tops: np.ndarray) -> np.ndarray:
    """Median over batches of the Pareto k-hat of each batch's top tail (shape (steps, batches, tail))."""
    k, n_rows, tail = tops.shape
    ks = stats.pareto_khat_rows(tops.reshape(-1, tail)).reshape(k, n_rows)
    ks = np.sort(np.where(np.isfinite(ks), ks, np.nan), axis=1)  # NaN last
    n = np.isfinite(ks).sum(axis=1)
    lo = np.take_along_axis(ks, np.maximum((n - 1) // 2, 0)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ks, np.minimum(n // 2, n_rows - 1)[:, None], axis=1)[:, 0]
    return np.where(n > 0, (lo + hi) / 2, math.nan)


# --------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------
def _count(log10_value: float) -> str:
    """Format a number from its log10, beyond the float range too (``format_number``)."""
    value = 10.0**log10_value if log10_value < 300 else math.inf
    return format_number(value, log10=log10_value, digits=2)


def _judge(metric, B: int, bound, target: float, log10_target: float, log10_needed: float, khat, limit, rel):
    """Return (verdict, reason, log10 relative standard error) of one step's metric."""
    log10_rel_se = math.log10(rel) + 0.5 * (log10_needed - math.log10(B))
    heavy = math.isfinite(khat) and khat > limit
    if metric.kind == "frac_above" and (target == 0.0 and log10_target == -math.inf):
        return (
            "reliable",
            f"no sequence can exceed C = {bound:g} under this law: every batch logs 0, exactly",
            -math.inf,
        )
    if heavy or log10_rel_se > 0.0:
        verdict = "unreliable"
    elif log10_needed > math.log10(B):
        verdict = "marginal"
    else:
        verdict = "reliable"
    if metric.kind == "frac_above" and log10_target + math.log10(B) < 0.0:  # a batch expects < 1 above C
        zero = math.exp(B * math.log1p(-min(10.0**log10_target, 1.0)))  # P(a batch logs 0 of B)
        reason = (
            f"a batch of {B} expects {_count(log10_target + math.log10(B))} sequences above C = {bound:g} "
            f"(P(P > C) = {_count(log10_target)}): {zero:.0%} of batches log 0 of {B}, which bounds the "
            f"fraction below {3 / B:.3g} (95 %, rule of three), not its size"
        )
    else:
        rel_se = f"{10**log10_rel_se:.2g}" if log10_rel_se < 3 else format_pow10(log10_rel_se)
        needs = format_pow10(log10_needed)
        reason = f"relative standard error {rel_se} with {B} sequences; {rel:.0%} needs {needs}"
    if heavy:
        reason += f"; Pareto k-hat of its summands {khat:.2f} > {limit:.2f}"
    return verdict, reason, log10_rel_se


def agreement(logged, lo, hi) -> np.ndarray:
    """Where logged values fall against predicted intervals, ends included within :data:`LOGGED_RTOL`.

    Returns ``inside``, ``below``, ``above`` or ``not logged`` (NaN) per value.
    """
    logged, lo, hi = np.broadcast_arrays(*(np.asarray(a, float) for a in (logged, lo, hi)))
    below = logged < lo - LOGGED_RTOL * np.abs(lo)
    above = logged > hi + LOGGED_RTOL * np.abs(hi)
    out = np.where(below, "below", np.where(above, "above", "inside")).astype(object)
    out[np.isnan(logged)] = "not logged"
    return out


# --------------------------------------------------------------------------------------
# predictions
# --------------------------------------------------------------------------------------
def predict_steps(
    m,
    s2,
    metrics,
    batch_size: int,
    draws: tuple[np.ndarray, np.ndarray],
    grid,
    *,
    bound: float | None = None,
    level: float = 0.9,
    target_rel: float = 0.1,
) -> dict[str, dict[str, np.ndarray]]:
    r"""Predict and judge sequence metrics at many steps' token laws at once (the module docstring).

    Parameters
    ----------
    m, s2 : array_like
        Each step's law :math:`N(m, s^2)`.
    metrics : sequence of SequenceMetric
    batch_size : int
        B, the sequences of a batch.
    draws : (Z, L)
        Standard normals and lengths of the simulated batches, shape ``(n_batches, B)`` each,
        shared by every step and metric (common random numbers).
    grid : array_like
        The lengths standing for the distribution in the closed forms (:func:`length_sampler`).
    bound : float, optional
        C of the truncated, masked and fraction metrics (default: each metric's).
    level, target_rel : float
        The intervals' level; the relative standard error a batch must reach.

    Returns
    -------
    dict
        Metric name -> arrays over the steps: ``predicted``, ``lo``, ``hi``, ``target``,
        ``log10_target``, ``n_needed``, ``log10_n_needed``, ``rel_se``, ``khat``, ``khat_limit``,
        ``verdict``, ``reason`` (:func:`predict`'s keys).
    """
    m, s2 = np.asarray(m, float).ravel(), np.asarray(s2, float).ravel()
    s = np.sqrt(s2)
    Z, L = (np.asarray(a, float) for a in draws[:2])
    B = int(batch_size)
    bounds = {mt.name: mt.bound if bound is None else bound for mt in metrics}
    for mt in metrics:
        if mt.kind != "chi2_seq" and (bounds[mt.name] is None or not bounds[mt.name] > 0):
            raise ValueError(f"{mt.name}: needs a bound C > 0, got {bounds[mt.name]!r}")
    K, n_batches = m.size, Z.shape[0]
    W = np.sqrt(L) * Z
    alpha = (1.0 - level) / 2.0
    limit = float(khat_limit(B)) if B > 1 else math.nan
    tail = _khat_tail(B)
    fit_khat = any(mt.kind == "chi2_seq" for mt in metrics) and tail >= 6
    spread = {mt.name: np.empty((4, K)) for mt in metrics}  # lo, median, hi, sd of the batch values
    khat = np.full(K, math.nan)
    per = max(1, _CHUNK // Z.size)  # steps simulated at once
    block = max(per, min(512, 2**22 // (N_KHAT * tail)))  # steps whose batch values are kept at once
    for b0 in range(0, K, block):
        b1 = min(K, b0 + block)
        values = {mt.name: np.empty((b1 - b0, n_batches)) for mt in metrics}
        tops = np.empty((b1 - b0, min(N_KHAT, n_batches), tail)) if fit_khat else None
        for i in range(b0, b1, per):
            sl, rows = slice(i, min(i + per, b1)), slice(i - b0, min(i + per, b1) - b0)
            x = s[sl, None, None] * W
            x += m[sl, None, None] * L
            cache: dict = {}
            for mt in metrics:
                values[mt.name][rows] = _batch_values(mt, x, L, bounds[mt.name], cache)
            if fit_khat:
                tops[rows] = _top_tails(x)
        for mt in metrics:
            v = values[mt.name]
            spread[mt.name][:3, b0:b1] = np.quantile(v, [alpha, 0.5, 1.0 - alpha], axis=1)
            if mt.kind == "ess_trunc":
                spread[mt.name][3, b0:b1] = np.std(v, axis=1, ddof=1)
        if fit_khat:  # the fits of the block's tails, a few hundred rows a pass
            khat[b0:b1] = _median_khat(tops)
    khats = {mt.name: khat if mt.kind == "chi2_seq" else np.full(K, math.nan) for mt in metrics}
    out = {}
    for mt in metrics:
        lo, med, hi, sd = spread[mt.name]
        parts = [  # closed forms over the length grid, 512 steps at a time
            _targets(mt, m[i : i + 512], s2[i : i + 512], grid, bounds[mt.name], target_rel)
            for i in range(0, K, 512)
        ]
        target, log10_target, log10_needed = (np.concatenate(a) for a in zip(*parts, strict=True))
        if mt.kind == "ess_trunc":  # a ratio of batch sums: its spread over the simulated batches
            with np.errstate(divide="ignore", invalid="ignore"):
                log10_needed = np.where(
                    (sd > 0) & (target != 0),
                    math.log10(B) + 2 * np.log10(sd / (target_rel * np.abs(target))),
                    np.where(sd == 0, -np.inf, np.inf),
                )
        judged = [
            _judge(mt, B, bounds[mt.name], *args, limit, target_rel)
            for args in zip(target, log10_target, log10_needed, khats[mt.name], strict=True)
        ]
        log10_rel = np.array([j[2] for j in judged])
        out[mt.name] = {
            "predicted": med,
            "lo": lo,
            "hi": hi,
            "target": target,
            "log10_target": log10_target,
            "n_needed": np.where(log10_needed < 300, 10.0 ** np.minimum(log10_needed, 300.0), np.inf),
            "log10_n_needed": log10_needed,
            "rel_se": np.where(log10_rel < 300, 10.0 ** np.minimum(log10_rel, 300.0), np.inf),
            "khat": khats[mt.name],
            "khat_limit": np.full(K, limit),
            "verdict": np.array([j[0] for j in judged], dtype=object),
            "reason": np.array([j[1] for j in judged], dtype=object),
        }
    return out


def predict(
    law: TokenLaw,
    metric: SequenceMetric,
    batch_size: int,
    draw_lengths,
    grid,
    *,
    bound: float | None = None,
    level: float = 0.9,
    n_batches: int = 400,
    target_rel: float = 0.1,
    seed: int = 0,
    _draws: tuple[np.ndarray, ...] | None = None,
) -> dict:
    r"""Predict one logged sequence metric of a batch of ``batch_size`` sequences under ``law``.

    Returns
    -------
    dict
        ``predicted`` (median over ``n_batches`` simulated batches), ``lo``, ``hi`` (their central
        ``level`` interval), ``target`` (the expectation the metric estimates) and
        ``log10_target``, ``n_needed`` (draws for a relative standard error ``target_rel``) and
        ``log10_n_needed``, ``rel_se`` (the relative standard error of one batch's estimate),
        ``khat`` (the summands' median Pareto :math:`\hat k`; NaN for a bounded summand),
        ``khat_limit``, ``verdict`` (``reliable``: ``n_needed`` at most B; ``marginal``: a
        relative standard error between ``target_rel`` and 1; ``unreliable``: above 1, or
        :math:`\hat k` above the limit) and ``reason``.
    """
    if _draws is None:
        rng = np.random.default_rng(np.random.SeedSequence(seed))
        Z = rng.standard_normal((n_batches, batch_size))
        _draws = (Z, draw_lengths(rng, (n_batches, batch_size)))
    res = predict_steps(
        [law.m],
        [law.s2],
        [metric],
        batch_size,
        _draws[:2],
        grid,
        bound=bound,
        level=level,
        target_rel=target_rel,
    )[metric.name]
    return {k: (v[0] if k in ("verdict", "reason") else float(v[0])) for k, v in res.items()}
