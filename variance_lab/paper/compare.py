r"""Compare a rebuilt figure's data with the recorded data, number by number.

``variance-lab figures --check`` rebuilds each figure from its sidecar and reads both CSV
files. The SHA-256 in the sidecar stays a fingerprint (equal SHA-256: ``identical``); the
verdict comes from the numbers, since the last bit of a float64 result depends on the
processor (NumPy's SIMD paths for ``exp``/``log``, libm, FMA), not only on the code:

* text and boolean columns must be equal;
* every number computed without random draws (exact theory, the derivation's
  approximations, analyses of a shipped data set) must agree to :data:`RTOL` relative,
  :math:`|a - b| \le \mathrm{RTOL}\,\max(|a|, |b|)`;
* columns of a fitted model's predictions (``*_mix``, ``*_hier``, ``*_comb``:
  :data:`variance_lab.rollouts.predictions.FITTED_MODELS`) to :data:`FIT_RTOL` relative:
  their optimiser (BFGS on a finite-difference gradient) stops where the rounding noise of a
  log-likelihood summed over 10^5 tokens hides the slope, a point that moves with the
  processor's arithmetic by about 1e-3 of a standard error;
* Monte Carlo rows (``method == "monte_carlo"``) to :data:`RTOL`, where the sampler promises the
  same draws (:func:`sampler_promise`: same processor architecture, Python, NumPy and numba
  versions); otherwise their estimates (``value``, ``lo``, ``hi``) must agree within
  :math:`z\sqrt2\,\mathrm{se}` (:data:`Z`; two independent estimates with standard error
  ``se`` differ by :math:`\sqrt2\,\mathrm{se}` in standard deviation; without an ``se``
  column, the half width of the ``lo``-``hi`` interval over its normal quantile),
  ``log10_value`` within the same bound divided by :math:`|value|\ln 10`, and the ``se``
  itself (the yardstick) only as finite or not.

A file is ``identical`` (every cell equal), ``equal within tolerance`` (the largest relative
difference is reported) or ``differs`` (with the first offending cells).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special

from variance_lab.rollouts.predictions import FITTED_MODELS

__all__ = [
    "FIT_RTOL",
    "PROMISE_KEYS",
    "RTOL",
    "STATUSES",
    "FileComparison",
    "Z",
    "compare_frames",
    "sampler_promise",
]

#: A data file's verdicts, best first.
STATUSES = ("identical", "equal within tolerance", "differs")

#: Relative tolerance of every number computed without random draws: float64 rounding of a few
#: hundred operations. Measured between NumPy's AVX-512 and AVX2 paths on the committed figures:
#: 3.1e-13 at most (corrections_vs_T), most files below 1e-14.
RTOL = 1e-12
#: Relative tolerance of fitted-model predictions. Measured between the same two paths:
#: 8.2e-4 at most (``gmpo_clip_pred_hier``, a tail probability of 5e-9), 1.7e-5 for the GSPO
#: clip fraction; the predictions' own uncertainty is tens of percent.
FIT_RTOL = 1e-2
#: Monte Carlo estimates without the sampler's promise: within Z * sqrt(2) * se.
Z = 4.0
#: The sidecar ``versions`` on which the sampler's promise (same seed, same draws) rests.
PROMISE_KEYS = ("machine", "python", "numpy", "numba")

_SEPARATE = ("se",)


@dataclass(frozen=True)
class FileComparison:
    """The verdict on one data file: ``status``, one of :data:`STATUSES`."""

    name: str
    status: str
    max_rel: float = 0.0
    problems: tuple[str, ...] = ()
    max_rel_fitted: float = 0.0

    @property
    def ok(self) -> bool:
        """True unless the file differs."""
        return self.status != "differs"

    def line(self) -> str:
        """One line for the terminal."""
        if self.status == "identical":
            return f"{self.name}: identical"
        if self.status == "equal within tolerance":
            fitted = f", {self.max_rel_fitted:.2g} in fitted-model columns" if self.max_rel_fitted else ""
            return f"{self.name}: equal within tolerance (max relative difference {self.max_rel:.2g}{fitted})"
        return f"{self.name}: differs: " + "; ".join(self.problems)


def sampler_promise(recorded: dict, now: dict) -> bool:
    """Tell whether a sidecar's ``versions`` and this run's share :data:`PROMISE_KEYS` (all recorded).

    The engine's draws depend on (seed, chunk) alone and numba's Generator matches NumPy's
    bit for bit on one architecture and version; another version or architecture may draw
    other numbers, and then only the standard errors bound the difference.
    """
    return all(recorded.get(k) is not None and recorded.get(k) == now.get(k) for k in PROMISE_KEYS)


def _is_numeric(old: pd.Series, new: pd.Series) -> bool:
    def num(s):
        return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)

    return num(old) and num(new)


def _text(s: pd.Series) -> np.ndarray:
    return s.astype(object).where(s.notna(), "").astype(str).to_numpy()


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return |a - b| / max(|a|, |b|), 0 where both are equal (also both inf or both NaN)."""
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    finite = np.isfinite(a) & np.isfinite(b) & ~same
    scale = np.where(finite, np.maximum(np.abs(a), np.abs(b)), 1.0)
    diff = np.abs(np.where(finite, a, 0.0) - np.where(finite, b, 0.0))
    return np.where(same, 0.0, np.where(finite, diff / scale, np.inf))


def _standard_error(frame: pd.DataFrame, level: float) -> np.ndarray | None:
    if "se" in frame.columns:
        return frame["se"].to_numpy(float)
    if {"lo", "hi"} <= set(frame.columns):
        z = float(special.ndtri(0.5 + level / 2))
        return (frame["hi"].to_numpy(float) - frame["lo"].to_numpy(float)) / (2 * z)
    return None


def _mc_bound(col: str, old, new, rows: np.ndarray, level: float) -> np.ndarray | None:
    """Return the allowed |a - b| of Monte Carlo cells of ``col`` without the sampler's promise."""
    se_old, se_new = _standard_error(old, level), _standard_error(new, level)
    if se_old is None or col in _SEPARATE:
        return None
    se = np.fmax(se_old, se_new)
    bound = Z * math.sqrt(2.0) * se
    if col == "log10_value":
        v = np.fmax(np.abs(old["value"].to_numpy(float)), np.abs(new["value"].to_numpy(float)))
        bound = np.divide(bound, v * math.log(10.0), out=np.full_like(bound, np.nan), where=v > 0)
    return np.where(rows & np.isfinite(bound), bound, np.nan)


def _fitted(col: str) -> bool:
    return col.rpartition("_")[2] in FITTED_MODELS


def _numeric_problem(col: str, old, new, mc_rows, promise: bool, level: float) -> tuple[float, str | None]:
    a, b = old[col].to_numpy(float), new[col].to_numpy(float)
    rel = _rel(a, b)
    ok = rel <= (FIT_RTOL if _fitted(col) else RTOL)
    if not promise and mc_rows.any():
        bound = _mc_bound(col, old, new, mc_rows, level)
        if col in _SEPARATE:
            ok |= mc_rows & (np.isfinite(a) == np.isfinite(b))
        elif bound is not None:
            with np.errstate(invalid="ignore"):  # inf - inf: NaN, never within a bound
                ok |= mc_rows & (np.abs(a - b) <= bound)
    worst = float(np.max(rel[np.isfinite(rel)], initial=0.0))
    return worst, _problem(col, np.flatnonzero(~ok), a, b)


def _problem(col: str, bad: np.ndarray, a, b) -> str | None:
    if bad.size == 0:
        return None
    i = int(bad[0])
    old, new = (v.item() if isinstance(v, np.generic) else v for v in (a[i], b[i]))
    return f"column {col!r}: {bad.size} values differ (first: row {i}, {old!r} vs {new!r})"


def compare_frames(
    name: str, old: pd.DataFrame, new: pd.DataFrame, *, promise: bool, level: float = 0.95
) -> FileComparison:
    """Compare a recorded data frame ``old`` with its rebuild ``new`` (module docstring for the rules).

    Parameters
    ----------
    name : str
        The file's name, for the report.
    old, new : DataFrame
        The recorded and the rebuilt data.
    promise : bool
        Whether the sampler promises the same draws (:func:`sampler_promise`).
    level : float
        Confidence level of ``lo``-``hi`` intervals, read where a frame has no ``se``.

    Returns
    -------
    FileComparison
    """
    if list(old.columns) != list(new.columns):
        return FileComparison(
            name, "differs", math.inf, (f"columns {list(old.columns)} vs {list(new.columns)}",)
        )
    if len(old) != len(new):
        return FileComparison(name, "differs", math.inf, (f"{len(old)} rows vs {len(new)}",))
    mc_rows = (_text(old["method"]) == "monte_carlo") if "method" in old.columns else np.zeros(len(old), bool)
    identical, worst, worst_fit, problems = True, 0.0, 0.0, []
    for col in old.columns:
        if _is_numeric(old[col], new[col]):
            a, b = old[col].to_numpy(float), new[col].to_numpy(float)
            identical &= bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
            rel, problem = _numeric_problem(col, old, new, mc_rows, promise, level)
            if _fitted(col):
                worst_fit = max(worst_fit, rel)
            else:
                worst = max(worst, rel)
        else:
            a, b = _text(old[col]), _text(new[col])
            diff = np.flatnonzero(a != b)
            identical &= diff.size == 0
            problem = _problem(col, diff, a, b)
        if problem:
            problems.append(problem)
    if problems:
        return FileComparison(name, "differs", worst, tuple(problems), worst_fit)
    return FileComparison(name, "identical" if identical else "equal within tolerance", worst, (), worst_fit)
