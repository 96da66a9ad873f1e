r"""What the pretrained-model runs answer: length profiles, a one-line update model, mismatch, staleness.

Everything here reads a run's records (:func:`read_lm_run`) and returns tidy frames; nothing needs
PyTorch. Lengths are bucketed by :data:`EDGES` (``[1, 8), [8, 16), ..., [128, 257)``).

**The one-line model of the update.** One optimizer step :math:`\Delta\theta` changes a token's
log-prob by :math:`\log r_t \approx \langle \nabla_\theta \log \pi(y_t), \Delta\theta \rangle`.
Through the output layer, :math:`\nabla_z \log \operatorname{softmax}(z)_y = e_y - \pi`, so a
change :math:`\delta z` of the logits moves it by :math:`(e_y - \pi) \cdot \delta z`; with
:math:`\delta z` of a common scale :math:`s` in every direction,

.. math::

    \operatorname{sd}(\log r_t) \approx s \, \lVert e_{y_t} - \pi_t \rVert, \qquad
    (1 - p_t) \le \lVert e_{y_t} - \pi_t \rVert \le \sqrt{2} \, (1 - p_t),

where :math:`p_t = \pi_{\text{old}}(y_t)`. So :func:`length_profile` predicts each bucket's
root mean square log-ratio as :math:`c \sqrt{\overline{(1 - p_t)^2}}`, with the one scale
:math:`c` of the run fitted over all its tokens (:func:`update_scale`): the loss aggregation
enters only through :math:`c` and through which tokens the step moves, so a bucket whose
observed RMS departs from the prediction is one the aggregation treats differently.

**Mismatch against update** (:func:`variance_shares`): a sequence's total log-ratio
:math:`\log \pi_\theta / \mu = U + M` splits into the update :math:`U = \sum_t (\log \pi_\theta -
\log \pi_{\text{old}})` and the mismatch :math:`M = \sum_t (\log \pi_{\text{old}} - \log \mu)`;
:math:`\operatorname{Var}(U + M) = \operatorname{Var} U + \operatorname{Var} M + 2 \operatorname{Cov}(U, M)`,
reported as shares of the total, per bucket, for the sums (the product ratio) and the means
(GSPO's length-normalised ratio).

**Staleness** (:func:`staleness_table`, :func:`fit_lag_law`): per policy lag, the variance of
the token log-ratio :math:`\log \pi_\theta / \pi_{\text{behaviour}}`, Kong's effective sample
size, the clip fractions and the corrections' modified fractions; a least-squares law
:math:`y = a + b \ell` or :math:`a + b \ell + c \ell^2` in the lag :math:`\ell`, with
:math:`R^2`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from variance_lab._jsonl import read_jsonl
from variance_lab.corrections.data import evaluate
from variance_lab.experiment.files import sidecar_path
from variance_lab.ratios import variance_split
from variance_lab.rollouts.batch import TokenBatch
from variance_lab.rollouts.io import load_batch
from variance_lab.rollouts.split import RATIOS, ratio_batch
from variance_lab.rollouts.statistics import length_buckets
from variance_lab.rollouts.weights import GSPO_RANGE, PPO_RANGE
from variance_lab.stats import kong_ess

__all__ = [
    "EDGES",
    "LARGE",
    "RATIOS",
    "STALE_CORRECTIONS",
    "fit_lag_law",
    "kept_mass_table",
    "length_profile",
    "mismatch_by_entropy",
    "mismatch_by_probability",
    "ratio_batch",
    "read_lm_run",
    "read_records",
    "read_token_field",
    "staleness_table",
    "update_scale",
    "variance_shares",
]

#: Length buckets ``[EDGES[j], EDGES[j+1])``: 1-7, 8-15, 16-31, 32-63, 64-127, 128-256 tokens.
EDGES = (1, 8, 16, 32, 64, 128, 257)
#: A token is "large" when :math:`|\log r_t|` exceeds this (the arithmetic run's threshold).
LARGE = 0.01
#: The corrections whose modified fractions :func:`staleness_table` reports: token TIS truncating at
#: 2 (verl's ``rollout_is_threshold``), IcePop's [0.5, 5] band, and a sequence mask of the product
#: ratio outside [0.5, 2].
STALE_CORRECTIONS = ("tis:2", "icepop:0.5:5", "seq-mask:0.5:2")
_SEQUENCE_FIELDS = ("id", "prompt_id", "task", "reward", "advantage", "policy_lag", "finished")


def read_records(path) -> list[dict]:
    """Return the records of a ``.jsonl`` or ``.jsonl.gz`` file, blank lines skipped.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    list of dict
    """
    return read_jsonl(path)


def read_lm_run(path) -> tuple[TokenBatch, pd.DataFrame, dict]:
    """Load a run: its batch, one row per sequence of the record fields, and its sidecar.

    Parameters
    ----------
    path : str or Path
        A ``.jsonl.gz`` written by :func:`variance_lab.lm.runs.run_lm_experiment`.

    Returns
    -------
    (TokenBatch, pandas.DataFrame, dict)
        The frame has ``length`` and whichever of ``id``, ``prompt_id``, ``task``, ``reward``,
        ``advantage``, ``policy_lag``, ``finished`` the records hold; the sidecar is ``{}``
        when there is none.
    """
    path = Path(path)
    batch = load_batch(path)
    records = read_records(path)
    frame = pd.DataFrame([{k: r[k] for k in _SEQUENCE_FIELDS if k in r} for r in records])
    frame["length"] = batch.lengths
    side = sidecar_path(path)
    sidecar = json.loads(side.read_text()) if side.is_file() else {}
    return batch, frame, sidecar


def read_token_field(path, field: str) -> np.ndarray:
    """Return one per-token field of a run's records (e.g. ``log_kept_mass``), flat in record order.

    Parameters
    ----------
    path : str or Path
        A ``.jsonl.gz`` or ``.jsonl`` of records.
    field : str
        A list-valued field every record holds.

    Returns
    -------
    numpy.ndarray
        float64, the records' lists concatenated (aligned with a batch's flat tokens when each
        list has the record's length).
    """
    path = Path(path)
    records = read_records(path)
    if not records:
        raise ValueError(f"{path}: no records")
    for number, record in enumerate(records, start=1):
        if field not in record:
            raise ValueError(f"{path}: record {number} has no field {field!r}")
    return np.concatenate([np.asarray(record[field], dtype=float) for record in records])


def kept_mass_table(batch: TokenBatch, log_kept_mass, edges=EDGES) -> pd.DataFrame:
    r"""Tabulate a top-p/top-k sampler's mismatch against the log of its kept mass, per length bucket.

    The sampler draws from :math:`\tilde\pi = \pi / S` on its kept set, so a sampled token's
    mismatch log-ratio is :math:`m_t = \log \pi_{\text{old}}(y_t) - \log \tilde\pi(y_t) =
    \log S_t \le 0`: the trainer's ratio :math:`\pi/\tilde\pi` sits below 1 by the kept mass,
    and :math:`\log(\tilde\pi/\pi) = -\log S_t` (the sign TRL #6789 reports).

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp`` (the processed log-probs).
    log_kept_mass : array_like of float
        :math:`\log S_t` per token, flat, aligned with the batch (:func:`read_token_field`).
    edges : sequence of int, optional

    Returns
    -------
    pandas.DataFrame
        One row for all tokens (``T_min`` = ``T_max`` = 0) and one per non-empty bucket:
        ``n_sequences``, ``n_tokens``, ``mean_mismatch`` (:math:`\overline{m_t}`),
        ``mean_neg_log_kept`` (:math:`-\overline{\log S_t}`), ``max_abs_diff``
        (:math:`\max_t |m_t - \log S_t|`, float32 rounding), ``share_processed`` (tokens with
        :math:`S_t < 1`), and ``mean_seq_mismatch``, the mean over sequences of
        :math:`\frac1T \sum_t m_t` (GSPO's log-ratio).
    """
    if not batch.has_rollout:
        raise ValueError("kept_mass_table needs rollout_logp (the sampler's processed log-probs)")
    log_s = np.asarray(log_kept_mass, dtype=float)
    if log_s.shape != (batch.n_tokens,):
        raise ValueError(
            f"log_kept_mass must hold one value per token ({batch.n_tokens}), got shape {log_s.shape}"
        )
    m = batch.mismatch_log_ratio
    seq_mean = np.add.reduceat(m, batch.offsets[:-1]) / batch.lengths
    bucket, edges = _buckets(batch, edges)
    seg = batch.segment
    selections = [(0, 0, np.ones(len(batch), dtype=bool))]
    selections += [(int(edges[j]), int(edges[j + 1] - 1), bucket == j) for j in range(len(edges) - 1)]
    rows = []
    for lo, hi, sel in selections:
        if not sel.any():
            continue
        tok = sel[seg]
        rows.append(
            {
                "T_min": lo,
                "T_max": hi,
                "n_sequences": int(sel.sum()),
                "n_tokens": int(tok.sum()),
                "mean_mismatch": float(m[tok].mean()),
                "mean_neg_log_kept": float(-log_s[tok].mean()),
                "max_abs_diff": float(np.max(np.abs(m[tok] - log_s[tok]))),
                "share_processed": float(np.mean(log_s[tok] < 0)),
                "mean_seq_mismatch": float(seq_mean[sel].mean()),
            }
        )
    return pd.DataFrame(rows)


def _buckets(batch: TokenBatch, edges) -> tuple[np.ndarray, np.ndarray]:
    return length_buckets(batch.lengths, np.asarray(edges, dtype=np.int64))


def update_scale(batch: TokenBatch) -> float:
    r"""Return the one-line model's scale :math:`c = \sqrt{\overline{d_t^2} / \overline{(1 - p_t)^2}}`.

    Parameters
    ----------
    batch : TokenBatch
        :math:`d_t` = ``logp - old_logp``, :math:`p_t` = ``exp(old_logp)``.

    Returns
    -------
    float
    """
    d, q = batch.log_ratio, 1.0 - np.exp(batch.old_logp)
    den = float(np.mean(q * q))
    if den == 0.0:
        raise ValueError("every token has old probability 1: the one-line model has nothing to scale")
    return float(np.sqrt(np.mean(d * d) / den))


def length_profile(batch: TokenBatch, edges=EDGES, *, large: float = LARGE) -> pd.DataFrame:
    r"""Profile the update's token log-ratio :math:`d_t` by length bucket against the one-line model.

    Parameters
    ----------
    batch : TokenBatch
    edges : sequence of int, optional
    large : float, optional
        The threshold of a large token, :math:`|d_t| > \text{large}`.

    Returns
    -------
    pandas.DataFrame
        One row per non-empty bucket: ``T_min``, ``T_max``, ``n_sequences``, ``n_tokens``,
        ``mean``, ``rms`` of :math:`d_t`; ``share_large`` and ``rms_large`` (the RMS of the
        large tokens, NaN without any); ``rms_pred`` = :math:`c \sqrt{\overline{(1 - p_t)^2}}`
        (:func:`update_scale`) and ``obs_over_pred``; ``sd_seq_mean``, the standard deviation
        of a sequence's mean :math:`d_t` (GSPO's log-ratio).
    """
    bucket, edges = _buckets(batch, edges)
    c = update_scale(batch)
    d, q = batch.log_ratio, 1.0 - np.exp(batch.old_logp)
    seg = batch.segment
    means = np.add.reduceat(d, batch.offsets[:-1]) / batch.lengths
    rows = []
    for j in range(len(edges) - 1):
        sel = bucket == j
        if not sel.any():
            continue
        tok = sel[seg]
        dj, big = d[tok], np.abs(d[tok]) > large
        rms = float(np.sqrt(np.mean(dj * dj)))
        pred = c * float(np.sqrt(np.mean(q[tok] ** 2)))
        rows.append(
            {
                "T_min": int(edges[j]),
                "T_max": int(edges[j + 1] - 1),
                "n_sequences": int(sel.sum()),
                "n_tokens": int(tok.sum()),
                "mean": float(dj.mean()),
                "rms": rms,
                "share_large": float(big.mean()),
                "rms_large": float(np.sqrt(np.mean(dj[big] ** 2))) if big.any() else float("nan"),
                "rms_pred": pred,
                "obs_over_pred": rms / pred if pred > 0 else float("nan"),
                "sd_seq_mean": float(np.std(means[sel], ddof=1)) if sel.sum() > 1 else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def _shares(u: np.ndarray, m: np.ndarray) -> dict:
    """Shares of Var(U + M) (:func:`variance_lab.ratios.variance_split`, ``ddof=1``)."""
    v = variance_split(u, m, ddof=1)
    return {
        "var_total": v.total,
        "share_update": v.share_a,
        "share_mismatch": v.share_b,
        "share_cross": v.share_cross,
    }


def variance_shares(batch: TokenBatch, edges=EDGES) -> pd.DataFrame:
    r"""Shares of :math:`\operatorname{Var}(U + M)` from the update, the mismatch and their covariance.

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp``.
    edges : sequence of int, optional

    Returns
    -------
    pandas.DataFrame
        Per bucket with at least 2 sequences and per ``scale`` (``"sum"``: :math:`U, M`, the
        log of the product ratio; ``"mean"``: :math:`U/T, M/T`, GSPO's): ``var_total``,
        ``share_update``, ``share_mismatch``, ``share_cross`` (they add to 1).
    """
    if not batch.has_rollout:
        raise ValueError("variance_shares needs rollout_logp (the sampler's log-probs)")
    bucket, edges = _buckets(batch, edges)
    starts = batch.offsets[:-1]
    u = np.add.reduceat(batch.log_ratio, starts)
    m = np.add.reduceat(batch.mismatch_log_ratio, starts)
    rows = []
    for j in range(len(edges) - 1):
        sel = bucket == j
        if sel.sum() < 2:
            continue
        head = {"T_min": int(edges[j]), "T_max": int(edges[j + 1] - 1), "n_sequences": int(sel.sum())}
        rows.append({**head, "scale": "sum", **_shares(u[sel], m[sel])})
        length = batch.lengths[sel]
        rows.append({**head, "scale": "mean", **_shares(u[sel] / length, m[sel] / length)})
    return pd.DataFrame(rows)


def mismatch_by_probability(batch: TokenBatch, bins=(0.0, 0.1, 0.5, 0.9, 0.99, 1.0)) -> pd.DataFrame:
    r"""Where the mismatch :math:`m_t = \log \pi_{\text{old}} - \log \mu` sits, by sampler probability.

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp``; :math:`\mu_t` = ``exp(rollout_logp)``.
    bins : sequence of float, optional
        Increasing edges in [0, 1]; a token with :math:`\mu_t` in ``[bins[k], bins[k+1])``
        (the last bin closed) falls in bin ``k``.

    Returns
    -------
    pandas.DataFrame
        Per bin: ``p_lo``, ``p_hi``, ``n_tokens``, ``share_tokens``, ``mean``, ``rms`` of
        :math:`m_t`, and ``share_sq``, the bin's share of :math:`\sum_t m_t^2`.
    """
    if not batch.has_rollout:
        raise ValueError("mismatch_by_probability needs rollout_logp (the sampler's log-probs)")
    bins = np.asarray(bins, dtype=float)
    if bins.ndim != 1 or bins.size < 2 or np.any(np.diff(bins) <= 0) or bins[0] < 0 or bins[-1] > 1:
        raise ValueError(f"bins must be increasing edges in [0, 1], at least two, got {bins.tolist()!r}")
    table = _binned(batch.mismatch_log_ratio, np.exp(batch.rollout_logp), bins)
    return table.rename(columns={"lo": "p_lo", "hi": "p_hi"})


def mismatch_by_entropy(
    batch: TokenBatch, entropy, bins=(0.0, 0.5, 1.0, 2.0, 4.0, 6.0, np.inf)
) -> pd.DataFrame:
    r"""Where the mismatch :math:`m_t = \log \pi_{\text{old}} - \log \mu` sits, by the old policy's entropy.

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp``.
    entropy : array_like
        :math:`H_t \ge 0` (nats) of :math:`\pi_{\text{old}}(\cdot \mid x, y_{<t})`, one per token of
        ``batch`` in its flat order (a run's ``entropy`` field, :func:`read_token_field`).
    bins : sequence of float, optional
        Increasing edges from 0; a token with :math:`H_t` in ``[bins[k], bins[k+1])`` (the last
        bin closed) falls in bin ``k``.

    Returns
    -------
    pandas.DataFrame
        Per bin: ``h_lo``, ``h_hi``, ``n_tokens``, ``share_tokens``, ``mean``, ``rms`` of
        :math:`m_t`, and ``share_sq``, the bin's share of :math:`\sum_t m_t^2`.
    """
    if not batch.has_rollout:
        raise ValueError("mismatch_by_entropy needs rollout_logp (the sampler's log-probs)")
    h = np.asarray(entropy, dtype=float)
    if h.shape != batch.logp.shape:
        raise ValueError(f"entropy has shape {h.shape}, the batch has {batch.logp.shape[0]} tokens")
    if not np.all(np.isfinite(h) & (h >= 0)):
        bad = float(h[~(np.isfinite(h) & (h >= 0))][0])
        raise ValueError(f"entropy must be finite and >= 0, got {bad!r}")
    bins = np.asarray(bins, dtype=float)
    if bins.ndim != 1 or bins.size < 2 or np.any(np.diff(bins) <= 0) or bins[0] != 0:
        raise ValueError(f"bins must be increasing edges from 0, at least two, got {bins.tolist()!r}")
    return _binned(batch.mismatch_log_ratio, h, bins).rename(columns={"lo": "h_lo", "hi": "h_hi"})


def _binned(m: np.ndarray, x: np.ndarray, bins: np.ndarray) -> pd.DataFrame:
    r"""Mean, RMS and share of :math:`\sum m^2` of ``m`` in the bins of ``x`` (last bin closed)."""
    k = np.clip(np.searchsorted(bins, x, side="right") - 1, 0, bins.size - 2)
    total = float(np.sum(m * m))
    rows = []
    for j in range(bins.size - 1):
        sel = k == j
        mj = m[sel]
        rows.append(
            {
                "lo": float(bins[j]),
                "hi": float(bins[j + 1]),
                "n_tokens": int(sel.sum()),
                "share_tokens": float(sel.mean()),
                "mean": float(mj.mean()) if sel.any() else float("nan"),
                "rms": float(np.sqrt(np.mean(mj * mj))) if sel.any() else float("nan"),
                "share_sq": float(np.sum(mj * mj) / total) if total > 0 else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def _lag_row(log_r: np.ndarray, offsets: np.ndarray, groups, seed: int) -> dict:
    lengths = np.diff(offsets)
    log_p = np.add.reduceat(log_r, offsets[:-1])
    log_g = log_p / lengths
    n = lengths.size
    ess = {"ess_frac_seq": kong_ess(log_p) / n, "ess_frac_gspo": kong_ess(log_g) / n}
    ppo = (log_r < np.log(PPO_RANGE[0])) | (log_r > np.log(PPO_RANGE[1]))
    gspo = (log_g < np.log(GSPO_RANGE[0])) | (log_g > np.log(GSPO_RANGE[1]))
    row = {
        "n_sequences": int(n),
        "var_token": float(np.var(log_r, ddof=1)),
        "sd_seq_mean": float(np.std(log_g, ddof=1)),
        **ess,
        "gspo_clip": float(gspo.mean()),
        "ppo_clip": float(ppo.mean()),
    }
    fracs = evaluate(log_r, offsets, list(STALE_CORRECTIONS), groups=groups, seed=seed)
    for spec, frac in zip(STALE_CORRECTIONS, fracs["frac_modified"], strict=True):
        row[f"{spec.split(':')[0]}_modified"] = float(frac)
    return row


def staleness_table(batch: TokenBatch, lag, *, seed: int = 0) -> pd.DataFrame:
    r"""Per policy lag: the spread of :math:`\log \pi_\theta / \pi_{\text{behaviour}}` and what it does.

    Parameters
    ----------
    batch : TokenBatch
        With ``rollout_logp`` (the behaviour policy's log-probs); the token log-ratio is
        ``logp - rollout_logp`` (:attr:`~variance_lab.rollouts.batch.TokenBatch.total_log_ratio`).
    lag : array_like of int
        Each sequence's policy lag (>= 0).
    seed : int, optional
        Root seed of the corrections' bootstrap intervals (not reported here).

    Returns
    -------
    pandas.DataFrame
        One row per lag, ascending: ``lag``, ``n_sequences``, ``var_token``, ``sd_seq_mean``,
        ``ess_frac_seq`` and ``ess_frac_gspo`` (Kong's :math:`(\sum w)^2 / (n \sum w^2)` of the
        product and GSPO weights), ``gspo_clip`` (sequences), ``ppo_clip`` (tokens), and
        ``tis_modified``, ``icepop_modified``, ``seq-mask_modified`` (:data:`STALE_CORRECTIONS`).
    """
    if not batch.has_rollout:
        raise ValueError("staleness_table needs rollout_logp (the behaviour policy's log-probs)")
    lag = np.asarray(lag)
    if lag.shape != batch.lengths.shape or not np.issubdtype(lag.dtype, np.integer) or np.any(lag < 0):
        raise ValueError(f"lag must hold one integer >= 0 per sequence ({len(batch)}), got {lag!r}")
    rows = []
    for value in np.unique(lag):
        sub = batch.select(np.flatnonzero(lag == value))
        groups = sub.prompt_id if sub.has_groups else None
        rows.append({"lag": int(value), **_lag_row(sub.total_log_ratio, sub.offsets, groups, seed)})
    return pd.DataFrame(rows)


def fit_lag_law(lag, y, degree: int = 1) -> dict:
    r"""Least squares :math:`y = \sum_{k \le \text{degree}} a_k \ell^k` in the lag, with its :math:`R^2`.

    Parameters
    ----------
    lag, y : array_like of float
        Same length, more points than ``degree + 1``.
    degree : {1, 2}, optional

    Returns
    -------
    dict
        ``coef`` (:math:`a_0, a_1, \dots`), ``r2`` and ``rmse`` (root mean square residual).
    """
    if degree not in (1, 2):
        raise ValueError(f"degree must be 1 or 2, got {degree!r}")
    x, y = np.asarray(lag, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size <= degree + 1:
        raise ValueError(f"lag and y must be 1-D of one length > {degree + 1}, got {x.shape} and {y.shape}")
    design = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return {"coef": [float(c) for c in coef], "r2": r2, "rmse": float(np.sqrt(np.mean(resid**2)))}
