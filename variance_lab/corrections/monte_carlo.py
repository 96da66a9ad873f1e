r"""Monte Carlo effect of each correction at each T, for every family.

:func:`simulate_corrections` gives the columns of :func:`~variance_lab.corrections.theory` with
intervals and a verdict; :func:`simulate_positions` the fraction of tokens a token-level correction
modifies at each position (CTPO's clipped fraction by position, for any family).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from variance_lab._validate import check_n, check_seed, check_T
from variance_lab.corrections.probmask import apply_prob
from variance_lab.corrections.sign import apply_signed, sign_label, signs
from variance_lab.corrections.specs import parse_list
from variance_lab.corrections.tokenprob import TOKEN_PROB_DEFAULT, TokenProbability
from variance_lab.corrections.weights import apply_sequence, apply_tokens
from variance_lab.families import Family
from variance_lab.families.base import CODE_AR1, CODE_RANDOM_SCALE
from variance_lab.stats import KHAT_THRESHOLD, mean_interval, pareto_khat, wilson_interval, z_value

__all__ = [
    "CORRECTIONS_MC_COLUMNS",
    "MIN_ESS",
    "POSITION_MC_COLUMNS",
    "simulate_corrections",
    "simulate_positions",
]

#: Monte Carlo columns added by :func:`simulate_corrections`.
CORRECTIONS_MC_COLUMNS = (
    "mc_mean_w",
    "mc_mean_w_lo",
    "mc_mean_w_hi",
    "mc_var_w",
    "mc_ess_frac",
    "mc_frac_modified",
    "mc_frac_modified_lo",
    "mc_frac_modified_hi",
    "mc_frac_seq_any",
    "mc_khat",
    "mc_reliable",
    "mc_reason",
)


#: Effective draws below which a Monte Carlo row is flagged unreliable.
MIN_ESS = 100


class _Sums:
    """Mergeable sums of one (T, correction) cell: weights, modified flags and the log-weight tail.

    The intervals come from the spread of independent units: sequences, or for ``m2po`` batches of
    sequences (its mask couples the sequences of a batch), ``k`` of them.
    """

    def __init__(self, tail: int):
        self.tail = tail
        self.n = 0  # sequences
        self.k = 0  # independent units of the intervals (sequences, or m2po's batches)
        self.units = 0  # weights (sequences or tokens)
        self.w1 = self.w2 = 0.0  # sums of weights and squared weights over units
        self.m1 = self.m2 = 0.0  # sums over sequences of the per-sequence mean weight (token level)
        self.f1 = self.f2 = 0.0  # sums over sequences of the per-sequence modified fraction
        self.any = 0  # sequences with a modified weight
        self.log_top = np.empty(0)

    def add(self, w: np.ndarray, modified: np.ndarray, group: int = 1) -> None:
        """Add a chunk: ``w`` and ``modified`` of shape (sequences,) or (sequences, tokens).

        ``group``: consecutive sequences that form one independent unit (an ``m2po`` batch).
        """
        w2 = w if w.ndim == 2 else w[:, None]
        mod2 = modified if modified.ndim == 2 else modified[:, None]
        pm, pf = w2.mean(axis=1), mod2.mean(axis=1)
        if group > 1:
            pm, pf = pm.reshape(-1, group).mean(axis=1), pf.reshape(-1, group).mean(axis=1)
        self.k += pm.size
        self.n += w2.shape[0]
        self.units += w2.size
        self.w1 += float(w2.sum())
        self.w2 += float(np.square(w2).sum())
        self.m1 += float(pm.sum())
        self.m2 += float(np.square(pm).sum())
        self.f1 += float(pf.sum())
        self.f2 += float(np.square(pf).sum())
        self.any += int(mod2.any(axis=1).sum())
        with np.errstate(divide="ignore"):
            logs = np.concatenate([self.log_top, np.log(w2.ravel())])
        k = min(self.tail, logs.size)
        self.log_top = np.partition(logs, logs.size - k)[logs.size - k :]

    def estimates(self, ci: float) -> dict:
        n, units = self.k, self.units
        mean, m2 = self.w1 / units, self.w2 / units
        var_w = max(m2 - mean * mean, 0.0) * units / max(units - 1, 1)
        # the interval of the mean: between-sequence variance of per-sequence means (any dependence)
        pm = self.m1 / n
        lo, hi, _ = mean_interval(pm, max(self.m2 / n - pm * pm, 0.0) * n / (n - 1), n, ci)
        fm = self.f1 / n
        flo, fhi, _ = mean_interval(fm, max(self.f2 / n - fm * fm, 0.0) * n / (n - 1), n, ci)
        ess = mean * mean / m2 if m2 > 0 else math.nan
        m = int(min(units / 5, 3 * math.sqrt(units)))
        top = np.sort(self.log_top)[-(m + 1) :] if m >= 5 else np.empty(0)
        khat = pareto_khat(top) if top.size else math.nan
        reasons = []
        if not ess > 0:
            reasons.append("every sampled weight is 0 (all masked)")
        elif units * ess < MIN_ESS:
            reasons.append(f"effective sample size {units * ess:.3g} < {MIN_ESS}")
        if khat > KHAT_THRESHOLD:
            reasons.append(f"Pareto k-hat {khat:.2f} > {KHAT_THRESHOLD}: weights too heavy-tailed")
        return {
            "mc_mean_w": mean,
            "mc_mean_w_lo": float(lo),
            "mc_mean_w_hi": float(hi),
            "mc_var_w": var_w,
            "mc_ess_frac": ess,
            "mc_frac_modified": fm,
            "mc_frac_modified_lo": float(max(flo, 0.0)),
            "mc_frac_modified_hi": float(min(fhi, 1.0)),
            "mc_frac_seq_any": self.any / self.n,
            "mc_khat": khat,
            "mc_reliable": not reasons,
            "mc_reason": "; ".join(reasons),
        }


def _provenance(family: Family, n: int, seed: int, chunk_size: int, ci: float, law=None) -> dict:
    """Return what a Monte Carlo frame records of how it was drawn (``attrs["provenance"]``)."""
    out = {"family": family.describe(), "n": n, "seed": seed, "chunk_size": chunk_size, "ci": ci}
    if law is not None:
        out["token_prob"] = law.describe()
    return out


def _draw_tokens(code: int, params: np.ndarray, rng: np.random.Generator, n: int, T: int) -> np.ndarray:
    """(n, T) token log-ratios: one call for i.i.d. families, one path per row for AR(1) and random-scale."""
    from variance_lab.simulate.kernels import draw_log_r

    if code in (CODE_AR1, CODE_RANDOM_SCALE):  # each row its own path (its own state, or its own v)
        return np.stack([draw_log_r(code, params, rng, T) for _ in range(n)])
    return draw_log_r(code, params, rng, n * T).reshape(n, T)


def _labels(c) -> list[str]:
    """Return the ``correction`` labels of a spec's rows: three for a sign-dependent spec, else the spec."""
    return [sign_label(c, s) for s in signs(c)] if c.signed else [c.spec]


def _softplus(x):
    return np.logaddexp(0.0, x)


def _prob_weights(c, Y: np.ndarray, lq: np.ndarray, pos) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the weights and masked flags of a probability-aware mask from the tokens' log-odds and shifts.

    :math:`\operatorname{logit}\pi = \operatorname{logit} q + Y`. The token's log-probs and their
    complements come from the log-odds exactly (:mod:`variance_lab.corrections.tokenprob`); the
    divergences are taken exactly (``exact=True``).
    """
    log_mu, log1m_mu = -_softplus(-lq), -_softplus(lq)
    log_pi, log1m_pi = -_softplus(-(lq + Y)), -_softplus(lq + Y)
    adv = None if pos is None else np.where(pos, 1.0, -1.0)[:, None]
    return apply_prob(c, log_pi - log_mu, log_mu, adv, exact=True, log1m=(log1m_pi, log1m_mu))


def _chunk_cells(cs, grid, Y: np.ndarray, cells: dict, u=None, lq=None) -> None:
    """Add one chunk of token log-ratios ``Y`` (paths x max T) to every (T, correction) cell.

    ``u``: one uniform per path; a sign-dependent spec takes its positive sign where ``u < p``.
    ``lq``: the logit of each token's probability (paths x max T), for the probability-aware masks,
    whose family draws are then the shifts of the tokens' log-odds.
    """
    cum = np.cumsum(Y, axis=1)
    prob = {}
    for c in cs:  # token by token: computed once, read as prefixes (cppo's depend on T: below)
        if c.prob and c.kind != "cppo":
            pos = (u < c.p_positive) if c.signed else None
            prob[c.spec] = (*_prob_weights(c, Y, lq, pos), pos)
    for t in grid:
        log_p = cum[:, t - 1]
        for c in cs:
            if c.prob:
                if c.kind == "cppo":  # its weights and budget depend on the length: the first t tokens
                    pos = u < c.p_positive
                    w, mod = _prob_weights(c, Y[:, :t], lq[:, :t], pos)
                else:
                    w, mod, pos = prob[c.spec]
                parts = (slice(None), pos, ~pos) if c.signed else (slice(None),)
                for label, part in zip(_labels(c), parts, strict=True):
                    if w[part].size:
                        cells[(t, label)].add(w[part, :t], mod[part, :t])
                continue
            if c.signed:  # aspo: the tokens of a sequence take its sign
                pos = u < c.p_positive
                w, mod = apply_signed(c, Y[:, :t] if c.level == "token" else log_p, t, pos)
                for label, part in zip(_labels(c), (slice(None), pos, ~pos), strict=True):
                    if w[part].size:
                        cells[(t, label)].add(w[part], mod[part])
                continue
            if c.level == "sequence":
                w, mod = apply_sequence(c, log_p, t)
                cells[(t, c.spec)].add(w, mod)
                continue
            if c.kind == "m2po":  # batches of c.batch sequences; a partial last batch is left out
                rows = Y.shape[0] // c.batch * c.batch
                if rows:
                    wt, mod = apply_tokens(c, Y[:rows, :t])
                    cells[(t, c.spec)].add(wt, mod, group=c.batch)
                continue
            wt, mod = apply_tokens(c, Y[:, :t])
            if c.kind == "gmpo":  # one weight per sequence, modified flags per token
                w = np.exp(wt.mean(axis=1))
                cell = cells[(t, c.spec)]
                cell.add(w, np.zeros(w.shape, dtype=bool))
                cell.f1 += float(mod.mean(axis=1).sum())  # k counted by add: one unit a sequence
                cell.f2 += float(np.square(mod.mean(axis=1)).sum())
                cell.any += int(mod.any(axis=1).sum())
            else:
                cells[(t, c.spec)].add(wt, mod)


def simulate_corrections(
    family: Family, T, corrections, n, *, seed=0, ci: float = 0.95, chunk_size=None, token_prob=None
) -> pd.DataFrame:
    r"""Monte Carlo effect of each correction at each T, for any family, with intervals and a verdict.

    Draws ``n`` sequences of ``max(T)`` token log-ratios with the engine's kernel
    (:func:`variance_lab.simulate.kernels.draw_log_r`), chunk ``i`` from the generator
    ``PCG64(SeedSequence(seed, spawn_key=(i,)))``; every T reads the prefix of the same
    paths. Per (T, correction) it estimates the columns of :func:`theory` with ``ci``
    intervals for the mean weight (from the between-sequence variance of each sequence's
    mean weight, valid for dependent tokens too) and for the modified fraction, the Pareto
    :math:`\hat k` of the weights, and a verdict: a row is unreliable when the effective
    number of weights (units x ESS fraction) is below :data:`MIN_ESS` or :math:`\hat k > 0.7`.

    ``m2po`` masks over batches of ``B`` consecutive sequences of a chunk (its spec's batch):
    the chunk size is then a multiple of every such ``B`` (their least common multiple), its
    intervals come from the spread of the batches (``n`` must hold two batches at least), and a
    last batch of fewer than ``B`` sequences (when ``n`` is not a multiple) is left out of its rows.

    A sign-dependent spec (``topr``, ``opsm:DELTA``, ``aspo``) draws each sequence's sign after its tokens,
    independent of them: :math:`A \ge 0` with the spec's probability :math:`p`, from one uniform
    per sequence of the chunk's generator; it gives three rows (every sequence, :math:`A \ge 0`,
    :math:`A < 0`; :func:`~variance_lab.corrections.sign.sign_label`), the sign rows over the
    sequences of that sign.

    A probability-aware mask (``dppo-tv``, ``dppo-kl``, ``kpop``, ``cppo``) reads the family's draws as
    the shifts :math:`Y` of the tokens' log-odds and draws each token's probability from ``token_prob``
    after the signs (:mod:`variance_lab.corrections.tokenprob`: :math:`\operatorname{logit}\pi =
    \operatorname{logit} q + Y`, weight :math:`r = \pi/q` where kept); DPPO's and CPPO's rows are
    ``A>0`` and ``A<=0``. CPPO's mask at each T is computed on the first T tokens of each path (its
    position weights and its budget's 0.9 quantile are the sequence's), the exact rule of
    :func:`~variance_lab.corrections.cppo_mask`: the reference for its theory where that has no closed
    form (:mod:`variance_lab.corrections.cppo`).

    Parameters
    ----------
    family : Family
    T : int or array_like of int
    corrections : str or list
    n : int
        Sequences, >= 2.
    seed : int
    ci : float
    chunk_size : int, optional
        Sequences per chunk; default ``max(4, min(4096, 2**21 // max(T)))``, rounded down to a
        multiple of the ``m2po`` batches (at least one batch). With ``n``, ``seed`` and the
        specs it fixes every bit of the result.
    token_prob : TokenProbability, optional
        The law of each token's probability for the probability-aware masks (default
        :data:`~variance_lab.corrections.tokenprob.TOKEN_PROB_DEFAULT`).

    Returns
    -------
    pandas.DataFrame
        One row per (T, correction): ``T, correction, level`` and :data:`CORRECTIONS_MC_COLUMNS`.
    """
    from variance_lab.simulate.plan import chunk_generator

    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    grid = [int(t) for t in check_T(T, grid=True)]
    cs = parse_list(corrections)
    n = check_n(n)
    seed = check_seed(seed)
    z_value(ci)
    t_max = grid[-1]
    size = max(4, min(4096, 2**21 // t_max)) if chunk_size is None else check_n(chunk_size, minimum=1)
    batches = [c.batch for c in cs if c.kind == "m2po"]
    if batches:
        unit = math.lcm(*batches)
        if n < 2 * max(batches):  # the intervals need the spread of two batches at least
            raise ValueError(
                f"n = {n} is below two m2po batches of {max(batches)} sequences: no interval over batches"
            )
        size = max(unit, size // unit * unit)
    law = TOKEN_PROB_DEFAULT if token_prob is None else token_prob
    if not isinstance(law, TokenProbability):
        raise ValueError(f"token_prob must be a TokenProbability, got {token_prob!r}")
    code, params = family.sampler_params()
    tail = int(3 * math.sqrt(n * t_max)) + 2
    cells = {(t, label): _Sums(tail) for t in grid for c in cs for label in _labels(c)}
    signed = any(c.signed for c in cs)
    prob = any(c.prob for c in cs)
    for index, start in enumerate(range(0, n, size)):
        rng = chunk_generator(seed, index)
        Y = _draw_tokens(code, params, rng, min(size, n - start), t_max)
        u = rng.random(Y.shape[0]) if signed else None  # after the tokens: other specs' draws unchanged
        lq = law.draw_logit(rng, Y.shape) if prob else None  # after the signs
        _chunk_cells(cs, grid, Y, cells, u, lq)
    rows = [
        {"T": t, "correction": label, "level": c.level, **cells[(t, label)].estimates(ci)}
        for t in grid
        for c in cs
        for label in _labels(c)
    ]
    out = pd.DataFrame(rows, columns=["T", "correction", "level", *CORRECTIONS_MC_COLUMNS])
    out.attrs["provenance"] = _provenance(family, n, seed, size, ci, law if prob else None)
    return out


#: Columns of :func:`simulate_positions`.
POSITION_MC_COLUMNS = (
    "t",
    "correction",
    "mc_frac_modified",
    "mc_frac_modified_lo",
    "mc_frac_modified_hi",
    "mc_mean_w",
    "mc_mean_w_lo",
    "mc_mean_w_hi",
)


def simulate_positions(
    family: Family, correction, T: int, n, *, seed=0, ci: float = 0.95, chunk_size=None
) -> pd.DataFrame:
    r"""Monte Carlo fraction of tokens a token-level correction modifies at each position ``t = 1..T``.

    For ``ctpo`` this is the clipped fraction :math:`p_t` by position, for any family (its
    closed form for lognormal ratios is :func:`variance_lab.corrections.ctpo_positions`). The
    draws are :func:`simulate_corrections`' (same seeds, same chunks); at each position the
    ``n`` sequences are independent, so the fraction gets Wilson's score interval and the mean
    weight the normal interval of a mean.

    Parameters
    ----------
    family : Family
    correction : str or Correction
        A token-level spec other than ``m2po`` (whose mask couples a batch) and ``gmpo``
        (one weight per sequence).
    T : int
        The last position.
    n : int
        Sequences, >= 2.
    seed, ci, chunk_size
        As for :func:`simulate_corrections`.

    Returns
    -------
    pandas.DataFrame
        One row per position, columns :data:`POSITION_MC_COLUMNS`.
    """
    from variance_lab.simulate.plan import chunk_generator

    if not isinstance(family, Family):
        raise ValueError(f"family must be a variance_lab Family, got {family!r}")
    (c,) = parse_list([correction])
    if c.level != "token" or c.kind in ("m2po", "gmpo") or c.prob:
        raise ValueError(
            "simulate_positions takes a token-level correction other than m2po, gmpo and the "
            f"probability-aware masks (the same at every position), got {c.spec!r}"
        )
    t_max = int(check_T(T, grid=True)[-1])
    n = check_n(n)
    seed = check_seed(seed)
    z_value(ci)
    size = max(4, min(4096, 2**21 // t_max)) if chunk_size is None else check_n(chunk_size, minimum=1)
    code, params = family.sampler_params()
    count, w1, w2 = np.zeros(t_max), np.zeros(t_max), np.zeros(t_max)
    for index, start in enumerate(range(0, n, size)):
        Y = _draw_tokens(code, params, chunk_generator(seed, index), min(size, n - start), t_max)
        w, mod = apply_tokens(c, Y)
        count += mod.sum(axis=0)
        w1 += w.sum(axis=0)
        w2 += np.square(w).sum(axis=0)
    lo, hi = wilson_interval(count, n, ci)
    mean = w1 / n
    mlo, mhi, _ = mean_interval(mean, np.maximum(w2 / n - mean * mean, 0.0) * n / (n - 1), n, ci)
    out = pd.DataFrame(
        {
            "t": np.arange(1, t_max + 1),
            "correction": c.spec,
            "mc_frac_modified": count / n,
            "mc_frac_modified_lo": lo,
            "mc_frac_modified_hi": hi,
            "mc_mean_w": mean,
            "mc_mean_w_lo": mlo,
            "mc_mean_w_hi": mhi,
        },
        columns=list(POSITION_MC_COLUMNS),
    )
    out.attrs["provenance"] = _provenance(family, n, seed, size, ci)
    return out
