r"""Exact aggregate sampling: :math:`\log P_T` drawn at the grid points, not token by token.

Where the sum of :math:`\Delta` log-ratios has a law that can be drawn exactly, a path
needs one draw (two for AR(1)) per grid point instead of one per token: the cost per
path is proportional to the number of grid points, not to the largest T. With the sorted
grid :math:`T_1 < \dots < T_k`, :math:`T_0 = 0` and :math:`\Delta_j = T_j - T_{j-1}`, each
path draws the increment of :math:`\log P` over block :math:`j` given what it has drawn
so far (``independent=True``: :math:`\log P_{T_j}` itself, afresh for every :math:`j`):

============  ========================================================================
family        increment of :math:`\log P` over :math:`\Delta` tokens
============  ========================================================================
degenerate    :math:`\Delta \log\mu` (nothing drawn)
lognormal     :math:`\Delta m + s\sqrt{\Delta}\,Z`, i.e. :math:`N(\Delta m, \Delta s^2)`
two-point     :math:`K \log a + (\Delta - K) \log b`, :math:`K \sim \mathrm{Binomial}(\Delta, q)`
AR(1)         :math:`\Delta m + S`, with :math:`(S, L)` bivariate normal given the state (below)
random-scale  :math:`\Delta(\log\mu - v/2) + \sqrt{\Delta v}\,Z`, i.e.
              :math:`N(\Delta(\log\mu - v/2), \Delta v)` given the path's :math:`v` (below)
mixture       :math:`\sum_j C_j m_j + \sqrt{\sum_j C_j s_j^2}\,Z` with the component counts
              :math:`(C_1, \dots, C_K) \sim \mathrm{Multinomial}(\Delta, w)` (below)
gamma         none: the sum of logs of gamma variates has no law to draw from; token only
============  ========================================================================

**AR(1).** The deviations :math:`e_t = \log r_t - m` follow
:math:`e_t = \rho e_{t-1} + c Z_t`, :math:`c = s\sqrt{1 - \rho^2}`, stationary
:math:`N(0, s^2)`. Given the deviation :math:`e` of the last token before a block of
:math:`\Delta` tokens, the block's sum :math:`S = \sum_{i=1}^{\Delta} e_i` and its last
deviation :math:`L = e_\Delta` are jointly Gaussian:
:math:`e_i = \rho^i e + c\sum_{k \le i} \rho^{i-k} Z_k`, so

.. math::

    E[S \mid e] = \alpha e, \quad \alpha = \frac{\rho(1-\rho^\Delta)}{1-\rho}, \qquad
    E[L \mid e] = \beta e, \quad \beta = \rho^\Delta,

    \operatorname{Var}(S \mid e) = \frac{c^2}{(1-\rho)^2}\sum_{k=1}^{\Delta}(1-\rho^k)^2
      = \frac{c^2}{(1-\rho)^2}\Bigl[\Delta - \frac{2\rho(1-\rho^\Delta)}{1-\rho}
        + \frac{\rho^2(1-\rho^{2\Delta})}{1-\rho^2}\Bigr],

    \operatorname{Cov}(S, L \mid e) = \frac{c^2}{1-\rho}\sum_{k=1}^{\Delta}(1-\rho^k)\rho^{k-1}
      = \frac{c^2}{1-\rho}\Bigl[\frac{1-\rho^\Delta}{1-\rho} - \frac{\rho(1-\rho^{2\Delta})}{1-\rho^2}\Bigr],
    \qquad
    \operatorname{Var}(L \mid e) = s^2 (1 - \rho^{2\Delta}).

The first block starts from the stationary law, :math:`e \sim N(0, s^2)` unobserved:
:math:`\alpha = \beta = 0` and the unconditional covariance, the conditional one plus
:math:`s^2 (\alpha, \beta)^\top(\alpha, \beta)`
(:math:`\operatorname{Var} S = V_\Delta`, :func:`variance_lab.families.lognormal.ar1_var_sum`). A path draws
:math:`S = \alpha e + \ell_{11} Z_1` and :math:`e \leftarrow \beta e + \ell_{21} Z_1 + \ell_{22} Z_2`
with the Cholesky factor :math:`\ell` of the 2 x 2 covariance (no :math:`Z_2` at the last
grid point, whose :math:`L` is never needed). The coefficients are computed per grid step
in 50-digit arithmetic (:func:`aggregate_table`: the closed forms cancel badly in float64
when :math:`\rho \to 1`).

**Two-point.** :math:`K \sim \mathrm{Binomial}(\Delta, q)` is drawn by inversion with one
uniform :math:`U` per draw: :math:`K = \min\{k : U < F_\Delta(k)\}`, with the binomial
CDF :math:`F_\Delta` tabulated once per grid step (summed in 30 digits, each value
correctly rounded; :math:`F_\Delta(\Delta) = 1` exactly) and a guide table
(Chen and Asau 1974: the first :math:`k` with :math:`F_\Delta(k) > i/(\Delta+1)`, from
which the search starts at :math:`i = \lfloor U(\Delta+1) \rfloor`, so that a draw costs
about two comparisons whatever :math:`\Delta`). Exact in law up to the resolution of
the 53-bit uniform (each probability rounded to a multiple of :math:`2^{-53}`), as the
Generator's own samplers are. Steps longer than :data:`TWO_POINT_TABLE_MAX` tokens (or
beyond the table's memory budget, :data:`TWO_POINT_TABLE_VALUES` values per grid) use
the Generator's ``binomial`` (NumPy's inversion / BTPE algorithms), exact in law, as all
steps did before. The table draws 3.1e7 counts/s against binomial's 6.6e6 on the
derivation's grid 1, 10, 100, 1000 (4.6 x) and 2.0e7 on every T from 1 to 1000 (1.7 x)
(``python -m benchmarks --only aggregate``, one thread, CPU time, shared 2-core machine).
Where NumPy's ``binomial`` itself inverts (:math:`q \le 1/2` and :math:`\Delta q < 30`)
the counts come out as before, uniform for uniform (up to rounding at the CDF's steps);
elsewhere the same seed now draws other counts from the same law.

**Random-scale.** A path draws its variance :math:`v = \theta\,\Gamma_\alpha` once, at its
first grid point (``independent``: afresh at every grid point, each a new sequence); given
:math:`v` its tokens are i.i.d. :math:`N(\log\mu - v/2, v)`, so the block's sum is
:math:`N(\Delta(\log\mu - v/2), \Delta v)` and the blocks are independent given :math:`v`:
one normal per grid point. Read over the grid, the path has the joint law of the token
path: :math:`\operatorname{Cov}(\log P_{T_1}, \log P_{T_2}) = T_1 E[v] + T_1 T_2
\operatorname{Var}(v)/4` for :math:`T_1 \le T_2`.

**Mixture.** Given which component each of the :math:`\Delta` tokens came from, the block's
sum is Gaussian with the counted means and variances added up; the counts are
multinomial, drawn as sequential binomials :math:`C_j \sim \mathrm{Binomial}(\Delta -
C_1 - \dots - C_{j-1}, p_j)`, :math:`p_j = w_j/(w_j + \dots + w_K)`, the last component
taking what is left (and none drawn once nothing is left). :math:`K + 1` draws per grid
point at most, whatever :math:`\Delta`.

Draws and the paths they feed are fixed by the chunk alone (one path at a time, grid
points in order), so the sampler keeps the engine's determinism: bit-identical results
for any number of workers. The two samplers give different bits but the same law; the
token sampler stays the reference (``tests/simulate/test_aggregate.py`` compares them).
"""

from __future__ import annotations

from functools import lru_cache

import mpmath
import numpy as np

from variance_lab.families.base import (
    CODE_AR1,
    CODE_LOGNORMAL,
    CODE_MIXTURE,
    CODE_RANDOM_SCALE,
    CODE_TWO_POINT,
)
from variance_lab.families.lognormal import ar1_var_sum
from variance_lab.schema import SAMPLER_CHOICES
from variance_lab.simulate._jit import kernel
from variance_lab.simulate.block import BlockState, reduce_columns
from variance_lab.simulate.draws import AGGREGATE_CODES, aggregate_paths

__all__ = [
    "EXACT_CODES",
    "aggregate_table",
    "has_exact_aggregate",
    "resolve_sampler",
    "run_aggregate",
]

#: Family codes whose sum of log-ratios the aggregate sampler draws exactly.
EXACT_CODES = AGGREGATE_CODES

#: Longest grid step (tokens) whose two-point binomial is drawn from a table.
TWO_POINT_TABLE_MAX = 1024
#: Values a two-point table may hold per grid (2 MiB); beyond it longer steps use ``binomial``.
TWO_POINT_TABLE_VALUES = 1 << 18


def has_exact_aggregate(code: int) -> bool:
    """Return True when the family of sampler ``code`` has an exact aggregate sampler."""
    return int(code) in EXACT_CODES


def resolve_sampler(sampler, code: int, family_name: str = "") -> str:
    """Return the sampler a run uses: ``"token"`` or ``"aggregate"``.

    ``"auto"`` is aggregate where it is exact (every family but gamma), token elsewhere;
    ``"aggregate"`` for a family without an exact aggregate raises ``ValueError``.
    """
    if sampler not in SAMPLER_CHOICES:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLER_CHOICES)}, got {sampler!r}")
    if sampler == "token":
        return "token"
    if has_exact_aggregate(code):
        return "aggregate"
    if sampler == "auto":
        return "token"
    name = f"the {family_name} family" if family_name else f"sampler code {code}"
    raise ValueError(
        f"{name} has no exact aggregate sampler (the sum of log-ratios has no law to draw from); "
        "use sampler='token' or 'auto'"
    )


def _ar1_rows(s: float, rho: float, steps, independent: bool) -> np.ndarray:
    """Rows ``[alpha, beta, l11, l21, l22]`` per grid step of the AR(1) aggregate (50 digits).

    In a private mpmath context: mpmath's global precision is shared by every thread, and
    worker threads (or Dask's) may build tables while others compute.
    """
    ctx = mpmath.MPContext()
    ctx.dps = 50
    out = np.zeros((len(steps), 5))
    s2, r = ctx.mpf(s) ** 2, ctx.mpf(rho)
    c2 = s2 * (1 - r * r)

    for j, d in enumerate(steps):
        if independent:
            out[j, 2] = float(ctx.sqrt(ar1_var_sum(s2, r, d)))  # V_d: the sum of d deviations
            continue
        rd, r2d = r**d, r ** (2 * d)
        alpha, beta = r * (1 - rd) / (1 - r), rd
        vs = c2 / (1 - r) ** 2 * (d - 2 * r * (1 - rd) / (1 - r) + r * r * (1 - r2d) / (1 - r * r))
        csl = c2 / (1 - r) * ((1 - rd) / (1 - r) - r * (1 - r2d) / (1 - r * r))
        vl = s2 * (1 - r2d)
        if j == 0:  # from the stationary law: add s^2 (alpha, beta)(alpha, beta)^T, then forget e
            vs, csl, vl = vs + s2 * alpha**2, csl + s2 * alpha * beta, vl + s2 * beta**2
            alpha, beta = ctx.mpf(0), ctx.mpf(0)
        l11 = ctx.sqrt(vs)
        l21 = csl / l11
        l22 = ctx.sqrt(max(vl - l21 * l21, ctx.mpf(0)))
        out[j] = [float(alpha), float(beta), float(l11), float(l21), float(l22)]
    return out


def _binomial_cdf(d: int, q: float) -> np.ndarray:
    r""":math:`F(k) = \sum_{i \le k} \binom{d}{i} q^i (1-q)^{d-i}`, :math:`k = 0..d`, each correctly rounded.

    Summed in 30-digit arithmetic (a private mpmath context, as :func:`_ar1_rows`) with the
    recurrence :math:`p_{k+1} = p_k \frac{d-k}{k+1} \frac{q}{1-q}`, :math:`p_0 = (1-q)^d`;
    :math:`F(d) = 1` exactly.
    """
    ctx = mpmath.MPContext()
    ctx.dps = 30
    mq = ctx.mpf(q)
    ratio = mq / (1 - mq)
    p = (1 - mq) ** d
    cum = ctx.mpf(0)
    out = np.empty(d + 1)
    for k in range(d + 1):
        cum += p
        out[k] = float(cum)
        p = p * (d - k) / (k + 1) * ratio
    out[d] = 1.0
    return out


def _two_point_rows(q: float, steps) -> np.ndarray:
    r"""Per step :math:`\Delta`: ``[Delta, size, F(0..Delta), guide(0..Delta)]``, or ``[Delta, 0]``.

    ``size = Delta + 1`` values of the CDF :math:`F(k) = P(K \le k)` of
    :math:`K \sim \mathrm{Binomial}(\Delta, q)` (nondecreasing, :math:`F(\Delta) = 1`),
    then as many guide entries ``g[i] = min{k : F(k) > i / size}``. Steps above the cap
    (:data:`TWO_POINT_TABLE_MAX`, lowered so that the table keeps to
    :data:`TWO_POINT_TABLE_VALUES` values) get ``size = 0``: the kernel then calls the
    Generator's ``binomial`` (no table).
    """
    steps = np.asarray(steps, dtype=np.int64)
    budget = (TWO_POINT_TABLE_VALUES // max(1, steps.size) - 4) // 2
    cap = min(TWO_POINT_TABLE_MAX, max(1, budget))
    tabulated = [int(d) for d in steps if d <= cap]
    width = max(5, 2 + 2 * (max(tabulated, default=0) + 1))
    out = np.zeros((steps.size, width))
    out[:, 0] = steps
    cdfs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, d in enumerate(int(v) for v in steps):
        if d > cap:
            continue
        if d not in cdfs:
            F = _binomial_cdf(d, q)
            edges = np.arange(d + 1) / (d + 1)
            guide = np.searchsorted(F, edges, side="right")  # first k with F(k) > i/(d+1)
            cdfs[d] = (F, guide.astype(np.float64))
        F, guide = cdfs[d]
        out[j, 1] = d + 1
        out[j, 2 : d + 3] = F
        out[j, d + 3 : 2 * d + 4] = guide
    return out


@lru_cache(maxsize=64)
def _table_cached(code: int, params: bytes, grid: bytes, independent: bool) -> np.ndarray:
    par = np.frombuffer(params, dtype=np.float64)
    T = np.frombuffer(grid, dtype=np.int64)
    steps = T if independent else np.diff(T, prepend=0)
    out = np.zeros((T.size, 5))
    if code == CODE_LOGNORMAL:
        out[:, 0] = np.sqrt(steps.astype(np.float64))
    elif code == CODE_TWO_POINT:
        out = _two_point_rows(float(par[0]), steps)
    elif code == CODE_MIXTURE:
        out[:, 0] = steps
    elif code == CODE_RANDOM_SCALE:
        out[:, 0] = steps
        out[:, 1] = np.sqrt(steps.astype(np.float64))
    elif code == CODE_AR1:
        out = _ar1_rows(float(par[1]), float(par[2]), [int(d) for d in steps], independent)
    out.setflags(write=False)
    return out


def aggregate_table(code: int, params, grid, independent: bool) -> np.ndarray:
    r"""Per grid step, what the aggregate kernel needs: an array of shape ``(nT, 5)`` (two-point: wider).

    Steps are :math:`\Delta_j = T_j - T_{j-1}` (``independent``: :math:`T_j`).
    Lognormal: column 0 is :math:`\sqrt{\Delta_j}`; two-point: column 0 is :math:`\Delta_j`,
    column 1 the size of its inversion table, then the table (:func:`_two_point_rows`); mixture:
    column 0 is :math:`\Delta_j`; random-scale: columns 0 and 1 are :math:`\Delta_j` and
    :math:`\sqrt{\Delta_j}`;
    AR(1): :math:`[\alpha, \beta, \ell_{11}, \ell_{21}, \ell_{22}]` (module docstring;
    ``independent``: column 2 is :math:`\sqrt{V_{T_j}}`); degenerate: zeros. Cached per
    process (read-only arrays).
    """
    par = np.ascontiguousarray(params, dtype=np.float64)
    T = np.ascontiguousarray(grid, dtype=np.int64)
    return _table_cached(int(code), par.tobytes(), T.tobytes(), bool(independent))


@kernel
def _aggregate_kernel(code, par, table, independent, n_paths, rng, st):  # pragma: no cover - compiled
    """Simulate ``n_paths`` paths by aggregate draws at the grid points; reduce them in blocks.

    Each block of paths is drawn by :func:`variance_lab.simulate.draws.aggregate_paths`
    into the fill buffer ``st.X`` and reduced at once
    (:func:`variance_lab.simulate.block.reduce_columns`).
    """
    X = st.X
    B = X.shape[1]
    done = 0
    while done < n_paths:
        b = min(B, n_paths - done)
        aggregate_paths(code, par, st.grid, table, independent, rng, X, b)
        reduce_columns(b, st)
        done += b


def run_aggregate(
    code: int, params, independent: bool, n_paths: int, rng: np.random.Generator, st: BlockState
):
    """Fill the chunk state ``st`` with ``n_paths`` paths drawn by the aggregate sampler.

    Parameters
    ----------
    code : int
        Sampler code; one of :data:`EXACT_CODES`.
    params : ndarray
        Sampler parameters (float64).
    independent : bool
        Fresh draws at every grid point.
    n_paths : int
    rng : numpy.random.Generator
        The chunk's stream; advanced in place.
    st : BlockState
        The chunk's state (:func:`variance_lab.simulate.block.new_state`), filled in place.

    Raises
    ------
    ValueError
        For a family without an exact aggregate sampler.
    """
    code = int(code)
    if not has_exact_aggregate(code):
        raise ValueError(f"sampler code {code} has no exact aggregate sampler; use the token sampler")
    table = aggregate_table(code, params, st.grid, independent)
    _aggregate_kernel(code, params, table, bool(independent), int(n_paths), rng, st)
