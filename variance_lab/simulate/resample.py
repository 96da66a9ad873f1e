r"""Bootstrap resamples of clusters drawn in a kernel: NumPy's multinomial draws, bit for bit, faster.

A bootstrap over :math:`G` prompts (:func:`~variance_lab.stats.cluster_counts`) draws each
resample's counts as ``rng.multinomial(G, [1/G] * G)``. NumPy draws a multinomial as
:math:`G - 1` binomials in turn (``random_multinomial`` in ``numpy/random/src/distributions/
distributions.c``): cell :math:`j` gets :math:`\mathrm{Binomial}(n_j, p_j)` of the :math:`n_j` draws
left, :math:`p_j = (1/G) / r_j` with :math:`r_j` the probability left (:math:`r_0 = 1`,
:math:`r_{j+1} = r_j - 1/G`, in floating point), and stops when none are left; each binomial with
:math:`n p \le 30` is drawn by inversion from one uniform (``random_binomial_inversion``:
:math:`q^n = e^{n \log q}`, then the probabilities of :math:`1, 2, \dots` by their ratios), the
others by BTPE. In a bootstrap the :math:`p_j` are the same in every resample and :math:`n_j`
stays near :math:`G - j`, so :func:`uniform_multinomial` computes each :math:`(j, n_j)`'s
:math:`q^n` once (the bound only where a draw comes near it) and draws the rest as NumPy does,
from the same uniforms (numba's ``Generator.random``, NumPy's ``next_double``) and numba's BTPE
(a port of NumPy's): the same
counts, and the generator left in the same state, about twice as fast.

:class:`ResampleGenerator` is a :class:`numpy.random.Generator` whose ``multinomial`` of equal
cells takes this path (any other draw is NumPy's own): the bootstraps of
:mod:`variance_lab.rollouts` draw through it (:func:`resample_rng`).
"""

from __future__ import annotations

import math

import numpy as np

from variance_lab.simulate._jit import kernel

__all__ = ["ResampleGenerator", "resample_rng", "uniform_multinomial"]

#: Largest number of cells whose (cell, draws left) values of q^n are kept (a table of about
#: 8 sqrt(G) entries a cell); beyond it each is computed when drawn.
_TABLE_CELLS = 4096


@kernel
def _cells(G, p_cell, p_inv, q_inv, log_q, flip):  # pragma: no cover - compiled
    """Each cell's binomial probability, as NumPy forms it (the probability left, less 1/G a cell)."""
    p = 1.0 / G
    remaining = 1.0
    for j in range(G - 1):
        p_cell[j] = p / remaining
        remaining -= p
        flip[j] = p_cell[j] > 0.5
        p_inv[j] = 1.0 - p_cell[j] if flip[j] else p_cell[j]
        q_inv[j] = 1.0 - p_inv[j]
        log_q[j] = np.log(q_inv[j])


@kernel
def _multinomial(rng, G, n_boot, out, cells, qn_tab, width):  # pragma: no cover - compiled
    """Write ``n_boot`` draws of Multinomial(G, [1/G] * G) into the rows of ``out`` (zeros), as NumPy."""
    p_cell, p_inv, q_inv, log_q, flip = cells
    for b in range(n_boot):
        left = G
        for j in range(G - 1):
            n = left
            pp = p_inv[j]
            if n == 0 or p_cell[j] == 0.0:
                c = 0
            elif pp * n > 30.0:  # BTPE: numba's port of NumPy's
                c = rng.binomial(n, p_cell[j])
            else:
                q = q_inv[j]
                k = n - (G - j) + width
                if width >= 0 and 0 <= k < 2 * width + 1:
                    qn = qn_tab[j, k]
                    if qn != qn:  # not yet computed
                        qn = np.exp(n * log_q[j])
                        qn_tab[j, k] = qn
                else:
                    qn = np.exp(n * log_q[j])
                small = min(n, 10)  # x <= min(n, 10) is within NumPy's bound, min(n, np + 10 sqrt(npq + 1))
                x = 0
                px = qn
                v = rng.random()
                while v > px:
                    x += 1
                    if x > small and x > min(n, n * pp + 10.0 * np.sqrt(n * pp * q + 1)):
                        x = 0
                        px = qn
                        v = rng.random()
                    else:
                        v -= px
                        px = ((n - x + 1) * pp * px) / (x * q)
                c = n - x if flip[j] else x
            out[b, j] = c
            left -= c
            if left <= 0:
                break
        if left > 0:
            out[b, G - 1] = left


def uniform_multinomial(rng: np.random.Generator, G: int, n_boot: int) -> np.ndarray:
    """Return ``rng.multinomial(G, np.full(G, 1.0 / G), size=n_boot)``, drawn in a kernel (module docstring).

    Parameters
    ----------
    rng : numpy.random.Generator
        Left in the state NumPy's draw leaves it in.
    G : int
        Cells, and draws per resample.
    n_boot : int
        Resamples.

    Returns
    -------
    ndarray of int64, shape ``(n_boot, G)``
    """
    G, n_boot = int(G), int(n_boot)
    out = np.zeros((n_boot, G), dtype=np.int64)
    if G < 1 or n_boot < 1:
        return out
    cells = (np.empty(G), np.empty(G), np.empty(G), np.empty(G), np.zeros(G, dtype=np.bool_))
    _cells(G, *cells)
    width = int(4 * math.sqrt(G)) + 16 if G <= _TABLE_CELLS else -1
    qn = np.full((max(G - 1, 1), 2 * width + 1 if width >= 0 else 1), np.nan)
    _multinomial(rng, G, n_boot, out, cells, qn, width)
    return out


class ResampleGenerator(np.random.Generator):
    """A :class:`numpy.random.Generator` whose multinomial of ``n`` equal cells and ``n`` draws is a kernel's.

    The draws are NumPy's, bit for bit (:func:`uniform_multinomial`); every other call is the
    base class's own.
    """

    def multinomial(self, n, pvals, size=None):
        """Draw as :meth:`numpy.random.Generator.multinomial`; a bootstrap's equal cells in a kernel."""
        p = np.asarray(pvals)
        rows = size if isinstance(size, int | np.integer) else None
        if isinstance(size, tuple) and len(size) == 1:
            rows = size[0]
        equal = p.ndim == 1 and p.dtype == np.float64 and p.size > 0 and np.all(p == 1.0 / p.size)
        if rows is not None and equal and isinstance(n, int | np.integer) and n == p.size:
            return uniform_multinomial(self, int(n), int(rows))
        return super().multinomial(n, pvals, size)


def resample_rng(seed) -> ResampleGenerator:
    """Return ``np.random.default_rng(seed)`` as a :class:`ResampleGenerator` (the same stream)."""
    return ResampleGenerator(np.random.PCG64(seed))
