r"""Every family's draw code, per token and per grid step, keyed by the ``families.base.CODE_*`` codes.

A leaf of :mod:`variance_lab.simulate`: it imports only the jit helper, NumPy and the
sampler codes of :mod:`variance_lab.families`. The token kernels
(:mod:`~variance_lab.simulate.kernels`) and the aggregate kernel
(:mod:`~variance_lab.simulate.aggregate`) both draw through it, and so does everything
else that draws log-ratios (:func:`draw_log_r`, the paper's histograms), so a family's
sampler lives in one place. Each family's module in :mod:`variance_lab.families` gives its
code and parameters (:meth:`~variance_lab.families.Family.sampler_params`); the draws
themselves are here because they are numba kernels, compiled through the engine's one jit
helper (:mod:`variance_lab.simulate._jit`), which the families, a floor below, cannot import.

**Token draws.** The running sum of a path is kept in each family's cheapest exact form
(its *raw* sum), and turned into :math:`\log P_t` only at the grid points
(:func:`log_p`):

* ``CODE_DEGENERATE``: nothing summed; :math:`\log P_t = t \log\mu`.
* ``CODE_LOGNORMAL``: :math:`Z \sim N(0, 1)` summed; :math:`\log P_t = t m + s \sum Z`.
* ``CODE_GAMMA``: :math:`\log \Gamma_k` summed, :math:`\Gamma_k \sim \mathrm{Gamma}(k, 1)`;
  :math:`\log P_t = t \log\theta + \sum \log\Gamma_k`.
* ``CODE_TWO_POINT``: :math:`1\{U < q\}` summed (count :math:`c`);
  :math:`\log P_t = c \log a + (t - c)\log b`.
* ``CODE_AR1``: :math:`e_t = \rho e_{t-1} + s\sqrt{1-\rho^2} Z_t`, :math:`e_1 = s Z_1`
  (stationary) summed; :math:`\log P_t = t m + \sum e`.
* ``CODE_RANDOM_SCALE``: the path's variance :math:`v = \theta\,\Gamma_\alpha`, drawn at its
  first token and kept; :math:`\sqrt v\,Z - v/2` summed (the deviations of
  :math:`\log r \sim N(\log\mu - v/2, v)` from :math:`\log\mu`);
  :math:`\log P_t = t \log\mu + \sum`.
* ``CODE_MIXTURE``: :math:`\log r` itself summed; per token one uniform :math:`U` picks the
  first component :math:`j` with :math:`U < c_j` (cumulative weights), then
  :math:`\log r = m_j + s_j Z`; :math:`\log P_t = \sum`.

The parameters ``par`` are those of :meth:`variance_lab.families.Family.sampler_params`,
whose table gives each code's layout (each family's module computes its own).

For a small gamma shape :math:`k < 1`, :math:`\Gamma_k` itself underflows to 0 (its log to
:math:`-\infty`) with non-negligible probability, so its log is drawn as
:math:`\log\Gamma_{k+1} + \log(U)/k` with :math:`U \in (0, 1]` (Marsaglia and Tsang's
boost), which is always finite. Two families' tokens are not independent, and a path
carries a state :math:`e` from token to token and block to block (``NaN`` before its first
token; :func:`path_state` says which): AR(1) its last deviation, random-scale its variance
:math:`v`. ``standard_gamma`` with a small shape :math:`\alpha` may return
:math:`v = 0` (its draw underflows): that is a path with :math:`\log r = \log\mu` exactly,
never a NaN or an infinity, since no log of :math:`v` is taken.

**Aggregate draws** (:func:`aggregate_paths`): :math:`\log P_T` at the grid points from its
exact law given the previous grid point, one or two draws per grid point, with the
per-step coefficients of :func:`variance_lab.simulate.aggregate.aggregate_table` (the
laws are written out there): lognormal :math:`N(\Delta m, \Delta s^2)`, two-point
:math:`K \sim \mathrm{Binomial}(\Delta, q)` low values, AR(1) a bivariate normal step of
the block sum and the last deviation, random-scale :math:`v` at the path start and then
:math:`N(\Delta(\log\mu - v/2), \Delta v)` per step, mixture the component counts by
sequential binomials and then one :math:`N(\sum_j c_j m_j, \sum_j c_j s_j^2)`, degenerate
nothing drawn. Gamma has none. The
two-point count is drawn by inversion of a tabulated CDF (one uniform,
:func:`_binomial_from_table`) where the table has the step, else by ``binomial``.
"""

from __future__ import annotations

import numpy as np

from variance_lab.families.base import (
    CODE_AR1,
    CODE_DEGENERATE,
    CODE_GAMMA,
    CODE_LOGNORMAL,
    CODE_MIXTURE,
    CODE_RANDOM_SCALE,
    CODE_TWO_POINT,
)
from variance_lab.simulate._jit import kernel

__all__ = [
    "AGGREGATE_CODES",
    "KNOWN_CODES",
    "aggregate_paths",
    "check_code",
    "draw_log_r",
    "draw_raw",
    "draw_raw4",
    "log_p",
    "path_state",
    "token4",
]

#: Sampler codes the kernels draw from (:meth:`variance_lab.families.Family.sampler_params`).
KNOWN_CODES = frozenset(
    {CODE_DEGENERATE, CODE_LOGNORMAL, CODE_GAMMA, CODE_TWO_POINT, CODE_AR1, CODE_RANDOM_SCALE, CODE_MIXTURE}
)
#: Codes whose sum of log-ratios :func:`aggregate_paths` draws exactly (every family but gamma).
AGGREGATE_CODES = KNOWN_CODES - {CODE_GAMMA}


def check_code(code) -> int:
    """``code`` as an int if the kernels know it, else ``ValueError`` naming it."""
    if int(code) not in KNOWN_CODES:
        raise ValueError(f"unknown sampler code {code!r}; the kernels know {sorted(KNOWN_CODES)}")
    return int(code)


# --------------------------------------------------------------------------------------
# token draws
# --------------------------------------------------------------------------------------
@kernel
def path_state(code):  # pragma: no cover - compiled
    """Return True for families whose paths carry a state ``e`` (AR(1), random-scale): drawn one by one."""
    return code in (CODE_AR1, CODE_RANDOM_SCALE)


@kernel
def _mixture_token(par, k, rng):  # pragma: no cover - compiled
    """One mixture log-ratio: the first component j with ``U < c_j``, then ``m_j + s_j Z``."""
    u = rng.random()
    j = 0
    while j < k - 1 and u >= par[1 + j]:
        j += 1
    return par[1 + k + j] + par[1 + 2 * k + j] * rng.standard_normal()


@kernel
def draw_raw(code, par, rng, m, e):  # pragma: no cover - compiled
    """Sum of ``m`` per-token draws in the family's raw form (see the module table).

    ``e`` is the path's state (NaN at the start of a path; ignored by the i.i.d.
    families): AR(1) the deviation of the path's last token, random-scale the path's
    variance :math:`v`, drawn with its first token. Returns ``(sum, state after the m tokens)``.
    """
    acc = 0.0
    if code == CODE_LOGNORMAL:
        for _ in range(m):
            acc += rng.standard_normal()
    elif code == CODE_GAMMA:
        k = par[0]
        if k >= 1.0:
            for _ in range(m):
                acc += np.log(rng.standard_gamma(k))
        else:
            k1 = k + 1.0
            inv_k = 1.0 / k
            for _ in range(m):
                acc += np.log(rng.standard_gamma(k1)) + np.log1p(-rng.random()) * inv_k
    elif code == CODE_TWO_POINT:
        q = par[0]
        for _ in range(m):
            if rng.random() < q:
                acc += 1.0
    elif code == CODE_AR1 and m > 0:
        s, rho = par[1], par[2]
        c = s * np.sqrt(1.0 - rho * rho)
        first = 0
        if np.isnan(e):  # a path's first token: the stationary marginal N(0, s^2)
            e = s * rng.standard_normal()
            acc += e
            first = 1
        for _ in range(first, m):
            e = rho * e + c * rng.standard_normal()
            acc += e
    elif code == CODE_RANDOM_SCALE and m > 0:
        if np.isnan(e):  # a path's first token: its variance v = theta Gamma(alpha, 1), >= 0
            e = par[2] * rng.standard_gamma(par[1])
        z = 0.0
        for _ in range(m):
            z += rng.standard_normal()
        acc = np.sqrt(e) * z - 0.5 * m * e
    elif code == CODE_MIXTURE:
        k = np.int64(par[0])
        for _ in range(m):
            acc += _mixture_token(par, k, rng)
    return acc, e


@kernel
def log_p(code, par, t, raw):  # pragma: no cover - compiled
    r""":math:`\log P_t` from the raw running sum after ``t`` tokens (see the module table)."""
    if code == CODE_DEGENERATE:
        return t * par[0]
    if code == CODE_LOGNORMAL:
        return t * par[0] + par[1] * raw
    if code == CODE_GAMMA:
        return t * par[1] + raw
    if code == CODE_TWO_POINT:
        return raw * par[1] + (t - raw) * par[2]
    if code == CODE_MIXTURE:
        return raw
    return t * par[0] + raw  # CODE_AR1, CODE_RANDOM_SCALE


@kernel
def token4(code, par, rng):  # pragma: no cover - compiled
    """One raw token draw for each of 4 paths, in path order (i.i.d. families only)."""
    if code == CODE_LOGNORMAL:
        return rng.standard_normal(), rng.standard_normal(), rng.standard_normal(), rng.standard_normal()
    return (
        draw_raw(code, par, rng, 1, np.nan)[0],
        draw_raw(code, par, rng, 1, np.nan)[0],
        draw_raw(code, par, rng, 1, np.nan)[0],
        draw_raw(code, par, rng, 1, np.nan)[0],
    )


@kernel
def draw_raw4(code, par, rng, m):  # pragma: no cover - compiled
    """Raw sums of ``m`` tokens for a batch of 4 paths, token-major (4 running sums in registers).

    Interleaving four independent running sums lets the CPU overlap their additions with
    the generator's work; the draws go to paths 0, 1, 2, 3, 0, 1, ... in stream order.
    (i.i.d. families only: AR(1) and random-scale paths go one by one, :func:`draw_raw`.)
    """
    a0 = a1 = a2 = a3 = 0.0
    if code == CODE_LOGNORMAL:
        for _ in range(m):
            a0 += rng.standard_normal()
            a1 += rng.standard_normal()
            a2 += rng.standard_normal()
            a3 += rng.standard_normal()
    elif code != CODE_DEGENERATE:
        for _ in range(m):
            d0, d1, d2, d3 = token4(code, par, rng)
            a0 += d0
            a1 += d1
            a2 += d2
            a3 += d3
    return a0, a1, a2, a3


# --------------------------------------------------------------------------------------
# aggregate draws
# --------------------------------------------------------------------------------------
@kernel
def _binomial_from_table(table, j, u):  # pragma: no cover - compiled
    r"""Return the two-point count :math:`K = \min\{k : u < F(k)\}` of grid step ``j`` (as a float).

    Row ``j`` of the two-point table (:func:`variance_lab.simulate.aggregate.aggregate_table`)
    holds ``size`` CDF values :math:`F(0..\Delta)` from column 2 and the guide
    ``g[i] = min{k : F(k) > i/size}`` after them: the search starts at
    ``g[floor(u size)]`` and moves up while :math:`F(k) \le u` (about one step), or down
    while :math:`F(k-1) > u` (only where rounding put ``u size`` one bucket high).
    """
    size = np.int64(table[j, 1])
    k = np.int64(table[j, 2 + size + min(np.int64(u * size), size - 1)])
    while table[j, 2 + k] <= u:
        k += 1
    while k > 0 and table[j, 1 + k] > u:
        k -= 1
    return float(k)


@kernel
def aggregate_paths(code, par, grid, table, independent, rng, out, b):  # pragma: no cover - compiled
    r"""``b`` paths' :math:`\log P_T` at every grid point by aggregate draws, into ``out[:, :b]``.

    Column ``i`` of ``out`` is path ``i``, row ``j`` is ``T = grid[j]`` (the layout the
    block reduction reads, :func:`variance_lab.simulate.block.reduce_columns`).
    ``table`` holds the per-step coefficients of
    :func:`variance_lab.simulate.aggregate.aggregate_table` (lognormal: :math:`\sqrt{\Delta}`;
    two-point: :math:`\Delta` and its inversion table; mixture: :math:`\Delta`;
    AR(1): :math:`\alpha, \beta, \ell_{11}, \ell_{21}, \ell_{22}`;
    random-scale: :math:`\Delta, \sqrt{\Delta}`).
    Paths one after another, grid points in order; with ``independent`` each point is
    drawn afresh. A block of paths per call, not one: a call with array arguments costs
    reference-count updates, as much as the draws of a short path.
    """
    nT = grid.size
    if code == CODE_LOGNORMAL:  # log P_t = t m + s * raw
        m, s = par[0], par[1]
        for i in range(b):
            raw = 0.0
            for j in range(nT):
                z = table[j, 0] * rng.standard_normal()
                raw = z if independent else raw + z
                out[j, i] = grid[j] * m + s * raw
    elif code == CODE_TWO_POINT:  # raw = number of low values
        for i in range(b):
            raw = 0.0
            for j in range(nT):
                if table[j, 1] > 0.0:  # an inversion table: one uniform
                    k = _binomial_from_table(table, j, rng.random())
                else:
                    k = float(rng.binomial(np.int64(table[j, 0]), par[0]))
                raw = k if independent else raw + k
                out[j, i] = log_p(code, par, grid[j], raw)
    elif code == CODE_AR1:  # raw = sum of deviations, e = the last one
        for i in range(b):
            raw = 0.0
            e = 0.0
            for j in range(nT):
                z1 = rng.standard_normal()
                if independent:
                    raw = table[j, 2] * z1
                else:
                    raw += table[j, 0] * e + table[j, 2] * z1
                    if j + 1 < nT:
                        e = table[j, 1] * e + table[j, 3] * z1 + table[j, 4] * rng.standard_normal()
                out[j, i] = log_p(code, par, grid[j], raw)
    elif code == CODE_RANDOM_SCALE:  # raw = sum of (log r - log mu); v per path (independent: per point)
        alpha, theta = par[1], par[2]
        for i in range(b):
            raw = 0.0
            v = 0.0
            for j in range(nT):
                if j == 0 or independent:
                    v = theta * rng.standard_gamma(alpha)
                d = np.sqrt(v) * table[j, 1] * rng.standard_normal() - 0.5 * table[j, 0] * v
                raw = d if independent else raw + d
                out[j, i] = log_p(code, par, grid[j], raw)
    elif code == CODE_MIXTURE:  # raw = log P; component counts, then one Gaussian
        k = np.int64(par[0])
        for i in range(b):
            raw = 0.0
            for j in range(nT):
                left = np.int64(table[j, 0])
                mean = 0.0
                var = 0.0
                for c in range(k):
                    if left == 0:
                        break
                    cnt = left if c == k - 1 else rng.binomial(left, par[1 + 3 * k + c])
                    left -= cnt
                    s = par[1 + 2 * k + c]
                    mean += cnt * par[1 + k + c]
                    var += cnt * (s * s)
                d = mean + np.sqrt(var) * rng.standard_normal()
                raw = d if independent else raw + d
                out[j, i] = raw
    else:  # CODE_DEGENERATE
        for i in range(b):
            for j in range(nT):
                out[j, i] = log_p(code, par, grid[j], 0.0)


# --------------------------------------------------------------------------------------
# single tokens
# --------------------------------------------------------------------------------------
@kernel
def _draw_log_r_kernel(code, par, rng, out):  # pragma: no cover - compiled
    e = np.nan
    for i in range(out.size):
        raw, e = draw_raw(code, par, rng, 1, e)
        out[i] = log_p(code, par, 1, raw)


def draw_log_r(code: int, params: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    r"""``size`` consecutive tokens' :math:`\log r` of one sequence from the family ``(code, params)``.

    i.i.d. draws for every family but AR(1), whose draws form one stationary AR(1) path,
    and random-scale, whose draws share one variance :math:`v` (one sequence: i.i.d.
    given :math:`v`, not i.i.d.). Drawn one token at a time, as the kernels draw a single path.

    Parameters
    ----------
    code : int
        Sampler code, :meth:`variance_lab.families.Family.sampler_params`.
    params : ndarray
        Sampler parameters (float64).
    rng : numpy.random.Generator
        The stream; advanced in place.
    size : int
        Number of tokens.

    Returns
    -------
    ndarray of float64

    Raises
    ------
    ValueError
        For an unknown ``code``.
    """
    out = np.empty(int(size))
    _draw_log_r_kernel(check_code(code), np.ascontiguousarray(params, dtype=np.float64), rng, out)
    return out
