r"""NumPy's sums, bit for bit, over data that arrives in pieces: the numerics of the streaming pass.

``analyze`` reads a framework's dump once per pass, a row group at a time, and never holds all
its tokens (:mod:`variance_lab.rollouts.summaries`). Every number it reports must still be the
one that NumPy's whole-array reductions gave (``tests/rollouts/test_shipped_analysis.py``), so
the sums here are NumPy's own, reproduced in kernels:

- **Pairwise summation.** ``np.add.reduce`` of a contiguous float64 array of :math:`n` values
  is :math:`0 + S(0, n)` with NumPy's pairwise sum :math:`S` (``numpy/_core/src/umath/
  loops_utils.h.src``, ``@TYPE@_pairwise_sum``): fewer than 8 values are added in order from
  :math:`-0`; up to 128 go to 8 accumulators, 8 values a step, combined as
  :math:`((r_0 + r_1) + (r_2 + r_3)) + ((r_4 + r_5) + (r_6 + r_7))`, the rest added in order;
  more are split at :math:`n_2 = \lfloor n/2 \rfloor - (\lfloor n/2 \rfloor \bmod 8)` and
  :math:`S(0, n) = S(0, n_2) + S(n_2, n - n_2)`. ``np.add.reduceat`` adds a segment's first
  value to the pairwise sum of the rest. The tree depends on :math:`n` alone, so a
  :class:`PairwiseSums` that knows each sum's :math:`n` reproduces it from values fed in any
  pieces: :func:`pairwise_plan` lists the tree's leaves in order, each with the number of
  additions that complete after it.
- **Exact segment sums.** :func:`~variance_lab.ratios.segment_sums` splits every value into a
  high part on a grid fixed by the largest :math:`|x|` and the longest segment (whose sums are
  exact in any order) and a remainder summed by ``np.add.reduceat``; :func:`split_sums` does
  the same per sequence from the scale of :func:`~variance_lab.ratios.segment_split_scale`,
  which the streaming pass takes from maxima gathered in an earlier pass.

The kernels use IEEE arithmetic only (no fused multiply-add, no reassociation); values that need
a transcendental function (``exp``, ``expm1``) are computed by NumPy on the pieces and fed here,
since NumPy's vectorised functions need not round as the C library's do.
"""

from __future__ import annotations

import numpy as np

from variance_lab.simulate._jit import kernel

__all__ = [
    "INTERLEAVED",
    "PLAIN",
    "SQUARED_DEVIATION",
    "PairwiseSums",
    "pairwise_plan",
    "pairwise_sum",
    "segment_totals",
    "split_sums",
    "tree_sums",
]

#: NumPy's ``PW_BLOCKSIZE``: a pairwise sum of at most this many values is one leaf.
_BLOCK = 128
#: Depth of the pairwise tree's stack: enough for 2^63 values.
_DEPTH = 64

#: What :func:`split_sums` sums per sequence: the values ``a`` themselves, the interleaved values
#: ``(a_1, -b_1, a_2, -b_2, ...)`` (a difference of cross-entropies without a rounded difference)
#: or ``(a - c)^2`` about a centre ``c`` per sequence.
PLAIN, INTERLEAVED, SQUARED_DEVIATION = 0, 1, 2


# --------------------------------------------------------------------------------------
# the pairwise sum
# --------------------------------------------------------------------------------------
@kernel
def _leaf(a, lo, n):  # pragma: no cover - compiled
    """NumPy's pairwise sum of ``a[lo:lo + n]``, ``n <= 128`` (one leaf of the tree)."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    stop = n - n % 8
    while i < stop:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@kernel
def _pairwise(a, lo, n):  # pragma: no cover - compiled
    """NumPy's pairwise sum of ``a[lo:lo + n]`` (the tree walked with a stack, left first)."""
    if n <= _BLOCK:
        return _leaf(a, lo, n)
    node_lo = np.empty(_DEPTH, dtype=np.int64)
    node_n = np.empty(_DEPTH, dtype=np.int64)
    node_done = np.zeros(_DEPTH, dtype=np.int64)  # 0: nothing summed, 1: left summed
    left = np.empty(_DEPTH)
    top = 0
    node_lo[0], node_n[0], node_done[0] = lo, n, 0
    value = 0.0
    while top >= 0:
        m = node_n[top]
        if m <= _BLOCK:
            value = _leaf(a, node_lo[top], m)
            top -= 1
        elif node_done[top] == 0:  # descend into the left half
            h = m // 2
            h -= h % 8
            node_done[top] = 1
            node_lo[top + 1], node_n[top + 1], node_done[top + 1] = node_lo[top], h, 0
            top += 1
            continue
        elif node_done[top] == 1:  # left half summed: descend into the right half
            h = m // 2
            h -= h % 8
            left[top] = value
            node_done[top] = 2
            node_lo[top + 1], node_n[top + 1], node_done[top + 1] = node_lo[top] + h, m - h, 0
            top += 1
            continue
        else:  # both halves summed
            value = left[top] + value
            top -= 1
        while top >= 0 and node_done[top] == 2:  # finish the parents whose right half this was
            value = left[top] + value
            top -= 1
    return value


def pairwise_sum(a: np.ndarray) -> float:
    """Return ``np.add.reduce(a)`` of a 1-D float64 array, as a kernel computes it (for checking).

    Parameters
    ----------
    a : ndarray of float64, 1-D

    Returns
    -------
    float
    """
    a = np.ascontiguousarray(a, dtype=np.float64)
    return 0.0 + float(_pairwise(a, 0, a.size))


@kernel
def _segment_totals(a, offsets, out):  # pragma: no cover - compiled
    for s in range(offsets.size - 1):
        out[s] = 0.0 + _pairwise(a, offsets[s], offsets[s + 1] - offsets[s])


def segment_totals(a: np.ndarray, offsets) -> np.ndarray:
    """Return ``np.add.reduce`` of each segment ``a[offsets[s]:offsets[s + 1]]`` (each one's ``np.sum``).

    Unlike ``np.add.reduceat``, which adds a segment's first value to the pairwise sum of the rest.

    Parameters
    ----------
    a : ndarray of float64, 1-D
    offsets : array_like of int
        ``n + 1`` non-decreasing offsets (an empty segment sums to 0.0).

    Returns
    -------
    ndarray of float64, shape ``(n,)``
    """
    a = np.ascontiguousarray(a, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    out = np.empty(max(offsets.size - 1, 0))
    _segment_totals(a, offsets, out)
    return out


@kernel
def _tree_values(x, mode, mu, scale, zmax, mean_dev2):  # pragma: no cover - compiled
    """Return (the first value, the high part or u, (y - mu)^2) made of one element (:func:`tree_sums`)."""
    if mode == 1:  # the low part of the exact split (the high parts' sum is exact in any order)
        hi = np.rint(x * scale) / scale
        return x - hi, hi, 0.0
    z = x - mu
    if mode == 2:  # (y - mu)^2
        return z * z, 0.0, z * z
    d = z * z - mean_dev2  # ((y - mu)^2 - its mean)^2, and u = (y - mu) / zmax for the powers
    return d * d, z / zmax, 0.0


@kernel
def _add_in_order(
    h, lo, hi, mode, mu, scale, zmax, mean_dev2, K, res, hi_sum, least, most
):  # pragma: no cover
    """Add the values made of ``h[lo:hi]`` to ``res`` one at a time, in order (a leaf's short form).

    How NumPy's leaf adds all of fewer than 8 values, and the values after its last block of 8
    (:func:`_tree_sums`); each power ``u^k`` the previous one times ``u``. Returns
    ``(hi_sum, least, most)`` with the values' high parts added and their least and largest
    ``(y - mu)^2`` taken in.
    """
    for i in range(lo, hi):
        v, w, d2 = _tree_values(h[i], mode, mu, scale, zmax, mean_dev2)
        hi_sum += w
        least, most = min(least, d2), max(most, d2)
        res[0] += v
        p = w
        for k in range(1, K):
            res[k] += p
            p *= w
    return hi_sum, least, most


@kernel
def _tree_sums(h, sizes, adds, mode, mu, scale, zmax, mean_dev2, K, out):  # pragma: no cover
    """Pairwise sums (the tree ``sizes``, ``adds``) of ``K`` values made of each ``h[i]`` (:func:`tree_sums`).

    Eight values at a time, as NumPy's leaves add them (each power ``u^k`` the previous one times
    ``u``). Returns the high parts' sum (mode 1); mode 2 writes the least and largest value after
    the sum.
    """
    stack = np.empty((_DEPTH, K))
    r = np.empty((K, 8))
    res = np.empty(K)
    u8 = np.empty(8)
    p8 = np.empty(8)
    least, most = np.inf, -np.inf
    hi_sum = 0.0
    sp = 0
    pos = 0
    for leaf in range(sizes.size):
        n = sizes[leaf]
        if n < 8:
            for k in range(K):
                res[k] = -0.0
            hi_sum, least, most = _add_in_order(
                h, pos, pos + n, mode, mu, scale, zmax, mean_dev2, K, res, hi_sum, least, most
            )
        else:
            stop = n - n % 8
            for i in range(0, stop, 8):
                for j in range(8):
                    v, w, d2 = _tree_values(h[pos + i + j], mode, mu, scale, zmax, mean_dev2)
                    if i == 0:
                        r[0, j] = v
                    else:
                        r[0, j] += v
                    u8[j] = w
                    p8[j] = w
                    least, most = min(least, d2), max(most, d2)
                if mode == 1:
                    for j in range(8):
                        hi_sum += u8[j]
                if i == 0:
                    for k in range(1, K):
                        r[k, :] = p8
                        p8 *= u8
                else:
                    _add_powers(r, p8, u8, K)
            for k in range(K):
                res[k] = ((r[k, 0] + r[k, 1]) + (r[k, 2] + r[k, 3])) + (
                    (r[k, 4] + r[k, 5]) + (r[k, 6] + r[k, 7])
                )
            hi_sum, least, most = _add_in_order(
                h, pos + stop, pos + n, mode, mu, scale, zmax, mean_dev2, K, res, hi_sum, least, most
            )
        for k in range(K):
            stack[sp, k] = res[k]
        sp += 1
        for _ in range(adds[leaf]):
            sp -= 1
            for k in range(K):
                stack[sp - 1, k] = stack[sp - 1, k] + stack[sp, k]
        pos += n
    for k in range(K):
        out[k] = stack[0, k]
    if mode == 2:
        out[K], out[K + 1] = least, most
    return hi_sum if mode == 1 else 0.0


@kernel
def _add_powers(r, p8, u8, K):  # pragma: no cover - compiled
    """Add ``p8``, then ``p8 * u8``, ... to rows 1 .. K-1 of ``r`` (eight lanes at once)."""
    for k in range(1, K):
        for j in range(8):
            r[k, j] += p8[j]
            p8[j] *= u8[j]


def tree_sums(h: np.ndarray, mode: int, *, mu=0.0, scale=1.0, zmax=1.0, mean_dev2=0.0, terms: int = 0):
    r"""Return NumPy's pairwise sums over ``h`` of values made from each element, without making them.

    ``mode`` 1: the low parts :math:`l_i = h_i - \operatorname{rint}(h_i s)/s` (``scale`` :math:`s`)
    and, returned beside, the exact sum of the high parts; 2: :math:`(h_i - \mu)^2`; 3:
    :math:`((h_i - \mu)^2 - \bar d)^2` (``mean_dev2`` :math:`\bar d`) and ``terms`` powers
    :math:`u_i, u_i^2, \dots` of :math:`u_i = (h_i - \mu)/z_{max}`, each power the previous one
    times :math:`u_i`, as NumPy's ``power *= u``. Each sum is the pairwise sum of the whole array of
    those values (``np.add.reduce`` less its 0.0), bit for bit: the arithmetic per element is
    NumPy's, one IEEE operation at a time.

    Returns
    -------
    (ndarray of float64, float)
        The ``1 + terms`` sums (mode 2: the sum, then the least and largest value), and the high
        parts' sum (mode 1).
    """
    h = np.ascontiguousarray(h, dtype=np.float64)
    sizes, adds = pairwise_plan(h.size)
    K = 1 + (int(terms) if mode == 3 else 0)
    out = np.empty(K + (2 if mode == 2 else 0))
    hi = _tree_sums(h, sizes, adds, int(mode), float(mu), float(scale), float(zmax), float(mean_dev2), K, out)
    return out, float(hi)


@kernel
def _plan_into(n, sizes, adds):  # pragma: no cover - compiled
    """Write the leaves of the pairwise tree of ``n`` values in order; return their count."""
    stack_n = np.empty(_DEPTH, dtype=np.int64)
    stack_extra = np.empty(_DEPTH, dtype=np.int64)
    top = 0
    stack_n[0], stack_extra[0] = n, 0
    count = 0
    while top >= 0:
        m, extra = stack_n[top], stack_extra[top]
        top -= 1
        if m <= _BLOCK:
            sizes[count] = m
            adds[count] = extra
            count += 1
        else:
            h = m // 2
            h -= h % 8
            top += 1  # right half, with this node's addition after its last leaf
            stack_n[top], stack_extra[top] = m - h, extra + 1
            top += 1  # left half, visited first
            stack_n[top], stack_extra[top] = h, 0
    return count


def pairwise_plan(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the leaves of NumPy's pairwise tree of ``n`` values: (sizes, additions after each).

    Leaf ``j`` sums the next ``sizes[j]`` values; after it, ``adds[j]`` pairs of partial sums are
    added, the two on top of the stack each time (a post-order walk of the tree). ``n = 0`` has one
    empty leaf (the sum -0.0, as NumPy's pairwise sum of nothing).

    Parameters
    ----------
    n : int
        Number of values, >= 0.

    Returns
    -------
    (sizes, adds) : tuple of ndarray of int64
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    cap = n // 64 + 2  # every leaf but a root leaf holds at least 64 values
    sizes, adds = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
    count = _plan_into(n, sizes, adds)
    return sizes[:count].copy(), adds[:count].copy()


@kernel
def _feed(
    values, run_start, run_len, run_sum, plan_size, plan_add, plan_at, state, buf, stack
):  # pragma: no cover
    """Feed ``values[run_start[k]:run_start[k] + run_len[k]]`` to sum ``run_sum[k]``, for each run in order.

    ``state[r]`` holds sum r's next leaf, the values of it buffered, its stack height and whether
    its first value is still to be set apart (:class:`PairwiseSums`).
    """
    for k in range(run_start.size):
        r = run_sum[k]
        i = run_start[k]
        end = i + run_len[k]
        if i < end and state[r, 3] == 1:  # the first value goes apart (np.add.reduceat)
            stack[r, _DEPTH - 1] = values[i]
            state[r, 3] = 2
            i += 1
        leaf, fill, sp = state[r, 0], state[r, 1], state[r, 2]
        base = plan_at[r]
        while i < end:
            size = plan_size[base + leaf]
            if fill == 0 and end - i >= size:  # a whole leaf in this run: sum it in place
                s = _leaf(values, i, size)
                i += size
            else:
                take = min(size - fill, end - i)
                for t in range(take):
                    buf[r, fill + t] = values[i + t]
                fill += take
                i += take
                if fill < size:
                    break
                s = _leaf(buf[r], 0, size)
                fill = 0
            stack[r, sp] = s
            sp += 1
            for _ in range(plan_add[base + leaf]):
                sp -= 1
                stack[r, sp - 1] = stack[r, sp - 1] + stack[r, sp]
            leaf += 1
        state[r, 0], state[r, 1], state[r, 2] = leaf, fill, sp


class PairwiseSums:
    """Sums of float64 values fed in pieces, each bit for bit as NumPy sums the whole array at once.

    Sum ``r`` is told its number of values ``sizes[r]`` beforehand (the tree depends on it). Values
    arrive through :meth:`feed` (one sum) or :meth:`feed_runs` (runs of one array, each to a
    sum, in order); a sum's values must arrive in their order. :meth:`total` gives
    ``np.add.reduce`` of what was fed (``np.sum``, the numerator of ``np.mean``),
    :meth:`reduceat` the first value plus the pairwise sum of the rest (``np.add.reduceat`` of one
    segment: the sums made with ``first_apart=True``).

    Parameters
    ----------
    sizes : array_like of int
        Values each sum will be fed.
    first_apart : bool or array_like of bool
        Per sum: set its first value apart (:meth:`reduceat`).
    """

    def __init__(self, sizes, first_apart=False) -> None:
        sizes = np.asarray(sizes, dtype=np.int64).ravel()
        apart = np.broadcast_to(np.asarray(first_apart, dtype=bool), sizes.shape)
        if np.any(sizes < 0) or np.any(apart & (sizes < 1)):
            raise ValueError("sizes must be >= 0 (>= 1 for a sum whose first value is apart)")
        self.sizes = sizes
        plans = {}
        sizes_in_tree = sizes - apart
        for n in np.unique(sizes_in_tree).tolist():
            plans[n] = pairwise_plan(n)
        at, offset, parts = {}, 0, []
        for n, (s, a) in plans.items():
            at[n] = offset
            offset += s.size
            parts.append((s, a))
        self._plan_size = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        self._plan_add = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        self._plan_at = np.array([at[n] for n in sizes_in_tree.tolist()], dtype=np.int64)
        self._plan_len = np.array([plans[n][0].size for n in sizes_in_tree.tolist()], dtype=np.int64)
        self._state = np.zeros((sizes.size, 4), dtype=np.int64)
        self._state[:, 3] = apart
        self._buf = np.empty((sizes.size, _BLOCK))
        self._stack = np.empty((sizes.size, _DEPTH))
        self._fed = np.zeros(sizes.size, dtype=np.int64)

    def __len__(self) -> int:
        """Return the number of sums."""
        return self.sizes.size

    def feed(self, r: int, values) -> None:
        """Feed the next values of sum ``r``."""
        v = np.ascontiguousarray(values, dtype=np.float64).ravel()
        self.feed_runs(v, np.array([0]), np.array([v.size]), np.array([r]))

    def feed_runs(self, values, starts, lengths, sums) -> None:
        """Feed run ``k``, ``values[starts[k]:][:lengths[k]]``, to sum ``sums[k]``, each ``k`` in order."""
        v = np.ascontiguousarray(values, dtype=np.float64)
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        sums = np.asarray(sums, dtype=np.int64)
        np.add.at(self._fed, sums, lengths)
        if np.any(self._fed > self.sizes):
            raise ValueError("a sum was fed more values than its size")
        _feed(
            v,
            starts,
            lengths,
            sums,
            self._plan_size,
            self._plan_add,
            self._plan_at,
            self._state,
            self._buf,
            self._stack,
        )

    def _pairwise(self) -> np.ndarray:
        if np.any(self._fed != self.sizes):
            raise ValueError("a sum was fed fewer values than its size")
        out = np.empty(self.sizes.size)
        for r in range(self.sizes.size):
            if self._plan_len[r] and self._state[r, 2] == 1:
                out[r] = self._stack[r, 0]
            else:  # no value in the tree: NumPy's pairwise sum of nothing
                out[r] = -0.0
        return out

    def total(self) -> np.ndarray:
        """Return each sum as ``np.add.reduce`` gives it: 0.0 + the pairwise sum of every value fed."""
        if np.any(self._state[:, 3] != 0):
            raise ValueError("total() of a sum with its first value apart: use reduceat()")
        return 0.0 + self._pairwise()

    def reduceat(self) -> np.ndarray:
        """Return each sum as ``np.add.reduceat`` gives a segment: first value + pairwise sum of the rest."""
        if np.any(self._state[:, 3] != 2):
            raise ValueError("reduceat() needs every sum made with first_apart=True and fed")
        return self._stack[:, _DEPTH - 1] + self._pairwise()


# --------------------------------------------------------------------------------------
# exact sums per sequence (ratios.segment_sums, one sequence at a time)
# --------------------------------------------------------------------------------------
@kernel
def _split_sums(a, b, offsets, seqs, centres, scale, mode, out):  # pragma: no cover - compiled
    """Per sequence ``seqs[j]`` (of ``offsets``), the exact-split sum of its values (:func:`split_sums`)."""
    longest = 0
    for j in range(seqs.size):
        s = seqs[j]
        longest = max(longest, offsets[s + 1] - offsets[s])
    width = 2 * longest if mode == 1 else longest
    lo_part = np.empty(max(width, 1))
    for j in range(seqs.size):
        s = seqs[j]
        start, T = offsets[s], offsets[s + 1] - offsets[s]
        if scale == 0.0:  # every value of the set is 0: segment_sums returns zeros
            out[j] = 0.0
            continue
        n = 2 * T if mode == 1 else T
        hi_sum = 0.0
        for t in range(n):
            if mode == 1:
                x = a[start + t // 2] if t % 2 == 0 else -b[start + t // 2]
            elif mode == 0:
                x = a[start + t]
            else:
                d = a[start + t] - centres[j]
                x = d * d
            h = np.rint(x * scale) / scale
            hi_sum += h  # exact: every partial sum is a multiple of 1/scale below 2^53/scale
            lo_part[t] = x - h
        out[j] = hi_sum + (lo_part[0] + _pairwise(lo_part, 1, n - 1))


def split_sums(a, b, offsets, seqs, scale: float, *, mode: int = PLAIN, centres=None) -> np.ndarray:
    r"""Per sequence, the sum that :func:`~variance_lab.ratios.segment_sums` gives it, at a known scale.

    The values summed over sequence ``s`` (tokens ``offsets[s]:offsets[s+1]``) are ``a``
    (:data:`PLAIN`), ``(a_1, -b_1, a_2, -b_2, ...)`` (:data:`INTERLEAVED`) or ``(a - c_s)^2``
    (:data:`SQUARED_DEVIATION`, ``centres``). ``scale`` is
    :func:`~variance_lab.ratios.segment_split_scale` of the whole set the sums belong to (its
    largest :math:`|x|` and longest segment), so the result is ``segment_sums`` of that set, bit
    for bit, for the sequences given.

    Parameters
    ----------
    a : ndarray of float64
        Token values.
    b : ndarray of float64 or None
        The second values of :data:`INTERLEAVED` (None otherwise).
    offsets : ndarray of int64
        Sequence boundaries in ``a`` and ``b``.
    seqs : ndarray of int64
        The sequences to sum (indices into ``offsets``).
    scale : float
        The split's scale, 0 when every value of the set is 0.
    mode : int
        :data:`PLAIN`, :data:`INTERLEAVED` or :data:`SQUARED_DEVIATION`.
    centres : ndarray of float64, optional
        One centre per entry of ``seqs`` (:data:`SQUARED_DEVIATION`).

    Returns
    -------
    ndarray of float64, shape ``(len(seqs),)``
    """
    seqs = np.asarray(seqs, dtype=np.int64)
    c = np.zeros(seqs.size) if centres is None else np.ascontiguousarray(centres, dtype=np.float64)
    out = np.empty(seqs.size)
    _split_sums(
        np.ascontiguousarray(a, dtype=np.float64),
        np.zeros(0) if b is None else np.ascontiguousarray(b, dtype=np.float64),
        np.asarray(offsets, dtype=np.int64),
        seqs,
        c,
        float(scale),
        int(mode),
        out,
    )
    return out
