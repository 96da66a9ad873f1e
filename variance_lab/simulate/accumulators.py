r"""Mergeable accumulators of :math:`P_T`, :math:`G_T` and :math:`\log P_T`, one set per T.

For every T of the grid an accumulator holds

* the number of paths :math:`n`;
* for :math:`X \in \{P_T, G_T\}`, with :math:`y = \log X` (:math:`y = \log P_T` or
  :math:`\log P_T / T`): a **shift** :math:`h = \max(\text{largest } y \text{ seen}, \rho)`
  and the power sums :math:`S_k = \sum_i d_i^k`, :math:`k = 1..4`, of the deviations

  .. math::

      d_i = e^{y_i - h} - e^{\rho - h} = e^{\rho - h}\,\operatorname{expm1}(y_i - \rho),

  :math:`X_i - e^{\rho}` in units of :math:`e^h`, about a fixed reference
  :math:`\rho` close to :math:`\log E[X]`. Every :math:`|d_i|` is at most about 1, so
  nothing overflows however far :math:`P_T` spans (hundreds of orders of magnitude at
  large T), and the largest terms never underflow. Centring at :math:`e^\rho` keeps the
  digits of the central moments where the spread is small (:math:`\operatorname{Var}(G_T)`
  is about :math:`10^{-7}` around a mean of 0.95 at large T: raw power sums would
  cancel them away). Where :math:`\log X` is widely spread (its variance
  :math:`s^2 \operatorname{Var}(\log P_T) > 1`) a fixed centre would sit far from most values and cost
  the small ones their digits, so there :math:`\rho = -\infty` (no centring,
  :math:`d_i = e^{y_i - h}`): the sums are then the raw shifted power sums, which is
  harmless because the relative variance is large;
* plain power sums of :math:`\log P_T - T\mu_y` (:math:`\mu_y = E[\log r]`);
* the tail sample: the largest :math:`\min(M, n)` values of :math:`\log P_T`, sorted in
  descending order (:func:`variance_lab.simulate.plan.tail_size`), and its **floor**: a
  chunk of a large run keeps only its share of the tail
  (:func:`variance_lab.simulate.plan.chunk_tail_keep`), and records the smallest value it
  kept; the values it dropped lie at or below that floor.

**Merging** two accumulators with shifts :math:`h_a, h_b` moves both to
:math:`h = \max(h_a, h_b)`: the deviations are homogeneous in :math:`e^{-h}`, so
:math:`S_k \mapsto e^{k(h_a - h)} S_k`, then the sums add. The tails merge into the
largest :math:`M` of their union, and the floors to their maximum. The merged tail is
exactly the largest :math:`M` values of all paths when its smallest value is at or above
the floor (:meth:`Accumulator.tail_complete`): every dropped value then lies at or below
the :math:`M`-th largest, and copies of equal values are interchangeable. Merging is
exact up to rounding, and merging the same accumulators in the same order always gives
the same bits.

The layout of the arrays (index 0 is :math:`P_T`, 1 is :math:`G_T`, 2 is
:math:`\log P_T`): ``shift``, ``log_ref``: shape ``(2, nT)``; ``sums``: ``(3, nT, 4)``;
``ref_logP``: ``(nT,)``; ``tail``: ``(nT, m)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

import mpmath
import numpy as np

from variance_lab._validate import check_T
from variance_lab.families import Family
from variance_lab.simulate._jit import kernel

__all__ = ["LOG_P", "Accumulator", "AccumulatorSpec", "G", "P", "merge", "merge_all", "merge_into"]

#: Index of each accumulated quantity in ``sums`` (and in ``shift``, ``log_ref``).
P, G, LOG_P = 0, 1, 2

_POWERS = np.arange(1, 5)


@dataclass(frozen=True, eq=False)
class AccumulatorSpec:
    r"""What every accumulator of one run shares: the T grid, the references, the tail size.

    Attributes
    ----------
    T : ndarray of int64
        Sorted T grid.
    log_ref : ndarray, shape (2, nT)
        :math:`\rho` of :math:`P_T` (row 0) and of :math:`G_T` (row 1); ``-inf`` means
        no centring.
    ref_logP : ndarray, shape (nT,)
        Centre of :math:`\log P_T`, :math:`T\mu_y`.
    tail : int
        Largest values of :math:`\log P_T` kept per T.
    """

    T: np.ndarray
    log_ref: np.ndarray
    ref_logP: np.ndarray
    tail: int

    @classmethod
    def from_family(cls, family: Family, T, tail: int) -> AccumulatorSpec:
        r"""Compute the references from the family's cumulant generating function of :math:`\log P_T`.

        :math:`\rho_P = \log E[P_T]` and :math:`\rho_G = \log E[G_T]`
        (``family.cgf_sum_mp`` at :math:`s = 1` and :math:`1/T`), each used only where the
        variance of :math:`\log X` (:math:`V_T = \operatorname{Var}(\log P_T)`, resp.
        :math:`V_T/T^2`) is at most 1; :math:`T\mu_y = E[\log P_T]` for :math:`\log P_T`.
        """
        grid = check_T(T, grid=True)
        log_ref = np.empty((2, grid.size))
        if family.degenerate:  # the very floats the kernel computes: zero variance stays exactly 0
            lp = grid * family.sampler_params()[1][0]
            log_ref[P], log_ref[G] = lp, lp * (1.0 / grid)
            return cls(T=grid, log_ref=log_ref, ref_logP=lp, tail=int(tail))
        with mpmath.workdps(30):
            for j, t in enumerate(grid.tolist()):
                v = _var_log_p(family, t)
                log_ref[P, j] = float(family.cgf_sum_mp(t, 1)) if v <= 1.0 else -np.inf
                log_ref[G, j] = float(family.cgf_sum_mp(t, mpmath.mpf(1) / t)) if v <= t * t else -np.inf
        return cls(T=grid, log_ref=log_ref, ref_logP=grid.astype(float) * family.mean_log, tail=int(tail))

    def empty(self) -> Accumulator:
        """Return an accumulator of zero paths."""
        nT = self.T.size
        return Accumulator(
            spec=self,
            count=0,
            shift=self.log_ref.copy(),
            sums=np.zeros((3, nT, 4)),
            tail=np.empty((nT, 0)),
        )

    def compatible(self, other: AccumulatorSpec) -> bool:
        """Return True when accumulators of the two specs can be merged."""
        return self is other or (
            self.tail == other.tail
            and np.array_equal(self.T, other.T)
            and np.array_equal(self.log_ref, other.log_ref)
            and np.array_equal(self.ref_logP, other.ref_logP)
        )


@dataclass(eq=False)
class Accumulator:
    r"""Moments and tail of ``count`` paths at every T of ``spec.T`` (see the module docstring).

    Attributes
    ----------
    spec : AccumulatorSpec
    count : int
        Paths accumulated.
    shift : ndarray, shape (2, nT)
        :math:`h` of :math:`P_T` and :math:`G_T`.
    sums : ndarray, shape (3, nT, 4)
        Power sums :math:`S_1..S_4` of the deviations of :math:`P_T`, :math:`G_T`,
        :math:`\log P_T`.
    tail : ndarray, shape (nT, m)
        The largest ``m = min(spec.tail, count)`` values of :math:`\log P_T`, descending
        (when :meth:`tail_complete`; a chunk's own tail may be shorter, see ``tail_floor``).
    tail_floor : ndarray, shape (nT,), or None
        Per T, the largest value a chunk may have dropped from its tail (its smallest kept
        value); ``None`` when nothing was dropped.
    """

    spec: AccumulatorSpec
    count: int
    shift: np.ndarray
    sums: np.ndarray
    tail: np.ndarray
    tail_floor: np.ndarray | None = None
    #: Room for the whole tail, ``(nT, spec.tail)``, of a running accumulator whose ``tail``
    #: is still growing: ``tail`` is then its first columns (:func:`merge_into`).
    _room: np.ndarray | None = field(default=None, init=False, repr=False)

    @property
    def T(self) -> np.ndarray:
        """Sequence lengths T of the grid, in the spec's order."""
        return self.spec.T

    def centre(self) -> np.ndarray:
        r""":math:`e^{\rho - h}`, shape (2, nT): the reference in units of :math:`e^h` (0: none)."""
        with np.errstate(invalid="ignore"):
            c = np.exp(self.spec.log_ref - self.shift)
        return np.where(np.isneginf(self.spec.log_ref), 0.0, c)

    def merge(self, other: Accumulator) -> Accumulator:
        """Return this accumulator merged with ``other`` (a new object; see :func:`merge`)."""
        return merge(self, other)

    def tail_complete(self) -> np.ndarray:
        r"""Return, per T, whether ``tail`` is exactly the largest ``min(spec.tail, count)`` values.

        True when nothing was dropped, or when the tail is full and its smallest value is
        at or above ``tail_floor`` (every dropped value is then at or below the kept
        ones). For i.i.d. paths a chunk's share of the tail
        (:func:`variance_lab.simulate.plan.chunk_tail_keep`) makes False a
        :math:`< 10^{-30}` event per chunk and T; it is checked, never assumed
        (:func:`variance_lab.simulate.estimates.estimate` raises on it).
        """
        nT = self.T.size
        if self.tail_floor is None:
            return np.ones(nT, dtype=bool)
        if self.tail.shape[1] != min(self.spec.tail, self.count):
            return np.zeros(nT, dtype=bool)
        return self.tail[:, -1] >= self.tail_floor


def _var_log_p(family: Family, T: int) -> float:
    r""":math:`\operatorname{Var}(\log P_T)` under ``family``.

    :math:`T\sigma_y^2` for i.i.d. ratios, the family's ``var_sum_mp(T)`` where it has one
    (correlated ratios, AR(1)).
    """
    var_sum = getattr(family, "var_sum_mp", None)
    return float(var_sum(T)) if var_sum is not None else T * family.var_log


def _rescaled(acc: Accumulator, shift: np.ndarray) -> np.ndarray:
    """``acc.sums`` with the P and G parts moved to the common ``shift`` (>= acc.shift)."""
    f = np.exp(acc.shift - shift)  # <= 1; both finite once count > 0
    out = acc.sums.copy()
    out[:2] *= f[:, :, None] ** _POWERS
    return out


def merge(a: Accumulator, b: Accumulator) -> Accumulator:
    r"""Merge two accumulators of the same spec: ``a`` first, then ``b``.

    Shifts move to their maximum (power sums rescaled by :math:`e^{k(h_a-h)}`), sums
    add, tails merge into the largest ``spec.tail`` values of their union. Exact up to
    rounding; the same inputs in the same order give the same bits.

    Raises
    ------
    ValueError
        If the accumulators have different specs (T grid, references or tail size).
    """
    if not a.spec.compatible(b.spec):
        raise ValueError("cannot merge accumulators of different T grids, references or tail sizes")
    if b.count == 0:
        return _copy(a)
    if a.count == 0:
        return _copy(b)
    shift = np.maximum(a.shift, b.shift)
    sums = _rescaled(a, shift) + _rescaled(b, shift)
    m = min(a.spec.tail, a.tail.shape[1] + b.tail.shape[1])
    tail = np.empty((a.T.size, m))
    _merge_tails(a.tail, b.tail, tail)
    floors = [f for f in (a.tail_floor, b.tail_floor) if f is not None]
    floor = np.maximum(*floors) if len(floors) == 2 else (floors[0].copy() if floors else None)
    return Accumulator(
        spec=a.spec, count=a.count + b.count, shift=shift, sums=sums, tail=tail, tail_floor=floor
    )


def merge_into(a: Accumulator, b: Accumulator) -> Accumulator:
    """Merge ``b`` into ``a`` in place, and return ``a``: the same bits as :func:`merge`.

    For a running accumulator that the caller owns (executors, :func:`merge_all`): a
    chunk's few tail values are merged into it in place, instead of a new ``nT x M`` tail
    per chunk (on a dense grid that copy cost a tenth of the chunk itself). While the tail
    grows, it lives in the first columns of one ``nT x M`` array allocated at the first
    merge (``_room``), so that no old and new tail are ever held together: at
    :math:`T = 1..1000`, :math:`n = 10^6` (:math:`M = 3001`) that pair was 48 MB.
    Falls back to :func:`merge` (a new object) when either side is empty.
    """
    if not a.spec.compatible(b.spec):
        raise ValueError("cannot merge accumulators of different T grids, references or tail sizes")
    if b.count == 0 or a.count == 0:
        return merge(a, b)
    na = a.tail.shape[1]
    m = min(a.spec.tail, na + b.tail.shape[1])
    shift = np.maximum(a.shift, b.shift)
    a.sums = _rescaled(a, shift) + _rescaled(b, shift)
    a.shift = shift
    if b.tail.shape[1] == 0:
        pass
    elif m == na:
        _merge_tails_inplace(a.tail, b.tail)
    else:
        room = a._room
        if room is None or a.tail.base is not room:
            room = np.empty((a.T.size, a.spec.tail))
            room[:, :na] = a.tail
            a._room = room
        _merge_tails_grow(room, na, b.tail, m)
        a.tail = room[:, :m]
        if m == room.shape[1]:
            a._room = None  # full: ``tail`` is the whole (contiguous) array from now on
    floors = [f for f in (a.tail_floor, b.tail_floor) if f is not None]
    a.tail_floor = np.maximum(*floors) if len(floors) == 2 else (floors[0].copy() if floors else None)
    a.count += b.count
    return a


def merge_all(accs) -> Accumulator:
    """Merge accumulators left to right, in the order given (chunk order)."""
    accs = list(accs)
    if not accs:
        raise ValueError("merge_all needs at least one accumulator")
    return reduce(merge_into, accs[1:], _copy(accs[0]))


def _copy(acc: Accumulator) -> Accumulator:
    return Accumulator(
        spec=acc.spec,
        count=acc.count,
        shift=acc.shift.copy(),
        sums=acc.sums.copy(),
        tail=acc.tail.copy(),
        tail_floor=None if acc.tail_floor is None else acc.tail_floor.copy(),
    )


@kernel
def _merge_tails(a, b, out):  # pragma: no cover - compiled
    """Row-wise: the largest ``out.shape[1]`` values of two descending rows, descending.

    Merges until one row runs out (or ``out`` is full), then copies the rest of the
    other in one loop without comparisons: merging a chunk's short tail into a long
    running one costs little more than a copy. (A loop, not a slice assignment: the
    slice's shape check and its error message cost numba 3 s of compiling on a 2-core
    machine, more than the rest of the function.)
    """
    m = out.shape[1]
    na, nb = a.shape[1], b.shape[1]
    for j in range(out.shape[0]):
        ia = 0
        ib = 0
        k = 0
        while k < m and ia < na and ib < nb:
            if a[j, ia] >= b[j, ib]:
                out[j, k] = a[j, ia]
                ia += 1
            else:
                out[j, k] = b[j, ib]
                ib += 1
            k += 1
        while k < m and ia < na:  # b ran out (k = ia + ib and m <= na + nb: no bounds to check)
            out[j, k] = a[j, ia]
            ia += 1
            k += 1
        while k < m:  # a ran out
            out[j, k] = b[j, ib]
            ib += 1
            k += 1


@kernel
def _merge_tails_grow(room, na, b, m):  # pragma: no cover - compiled
    """Row-wise: the largest ``m`` of ``room[:, :na]`` and ``b`` (both descending), into ``room[:, :m]``.

    ``na <= m <= na + b.shape[1]``. A merge from the back, with :func:`_merge_tails`' rule
    for ties (the value of ``room`` first), so the bits are those of :func:`_merge_tails`:
    the ``na + nb - m`` smallest of the union are passed over first, then every write
    lands at or beyond the last value of ``room`` still to be read.
    """
    nb = b.shape[1]
    for j in range(room.shape[0]):
        i = na - 1
        k = nb - 1
        drop = na + nb - m
        w = m - 1
        while k >= 0:
            if i >= 0 and room[j, i] < b[j, k]:
                v = room[j, i]
                i -= 1
            else:
                v = b[j, k]
                k -= 1
            if drop > 0:
                drop -= 1
            else:
                room[j, w] = v
                w -= 1
        # drop <= nb is used up before b runs out; room[j, :i + 1] is already in place (w == i)


@kernel
def _merge_tails_inplace(a, b):  # pragma: no cover - compiled
    """Row-wise: the largest ``a.shape[1]`` values of ``a`` and ``b`` (both descending), into ``a``.

    ``r`` values of ``b`` enter (``b[r-1] > a[M-r]``, found from the top), then a merge from
    the back shifts only the values of ``a`` below the highest one that entered.
    """
    M = a.shape[1]
    nb = b.shape[1]
    for j in range(a.shape[0]):
        r = 0
        while r < nb and r < M and b[j, r] > a[j, M - 1 - r]:
            r += 1
        i = M - 1 - r  # last value of a that stays
        k = r - 1  # last value of b that enters
        w = M - 1
        while k >= 0:
            if i >= 0 and a[j, i] < b[j, k]:
                a[j, w] = a[j, i]
                i -= 1
            else:
                a[j, w] = b[j, k]
                k -= 1
            w -= 1
