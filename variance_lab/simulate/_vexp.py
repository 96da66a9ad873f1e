r"""Vectorisable :math:`e^z` and :math:`e^z - 1` over arrays, bit-identical on every x86-64 CPU.

The accumulators turn every :math:`\log P_T` (and :math:`\log P_T / T`) into a deviation
:math:`e^{y-h}` or :math:`c\,\operatorname{expm1}(y-\rho)`: two exponentials per path
and grid point. A call of libm's ``exp`` / ``expm1`` costs about as much as the normal
draw itself and blocks SIMD; this module computes them with plain arithmetic that
LLVM turns into 4-wide AVX2 code (2-wide SSE2 elsewhere), the same bits either way
(no fast-math, no FMA contraction: the result depends on the code alone, not on the
CPU or on how the loop is vectorised).

**Method** (Cody and Waite reduction, as in fdlibm). For :math:`w` clamped to
:math:`[-708, 709]`,

.. math::

    k = \operatorname{round}(w / \ln 2), \qquad
    r = (w - k\,\ell_{hi}) - k\,\ell_{lo} \in [-\tfrac{\ln 2}{2}, \tfrac{\ln 2}{2}],

with :math:`\ell_{hi} + \ell_{lo} = \ln 2` and :math:`\ell_{hi}` carrying 11 trailing
zero bits (so :math:`k\,\ell_{hi}` is exact for :math:`|k| < 2^{11}`);
:math:`p = \operatorname{expm1}(r) = r + r^2 q(r)` from its Taylor series to degree 13
(truncation error below :math:`10^{-17}` relative), :math:`q` evaluated by Estrin's scheme
(pairs, then the powers :math:`r^2, r^4, r^8`: a short dependency chain, so that
successive vectors overlap), and with :math:`e = 2^k` built from its bits,

.. math::

    e^w = e\,p + e, \qquad e^w - 1 = e\,p + (e - 1),

:math:`e - 1` being exact for :math:`|k| \le 52`. The rounding of :math:`k` uses the
:math:`1.5 \cdot 2^{52}` shifter, whose low mantissa bits then hold :math:`k` (no
float-to-integer conversion, which AVX2 lacks). Accuracy: within 2 ulp of the
correctly rounded value over the whole range, and as relatively accurate as
``expm1`` near 0 (where :math:`k = 0`, :math:`e^w - 1 = p`).

The argument must lie in :math:`[-708, 709]`: :func:`exp_minus` assumes it (the
accumulators check a block's range once and skip the clamp, which shortens the
dependency chain of the vector loop), :func:`exp_minus_clamped` clamps it. The clamp
matters only at the ends: :math:`e^w` for :math:`w < -708` comes out as
:math:`e^{-708} \approx 3 \cdot 10^{-308}` instead of a smaller or zero value, which
the accumulators' sums (whose largest term is about 1) cannot see; callers handle
:math:`w > 709` themselves (the accumulators fall back to libm there).
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import intrinsic

from variance_lab.simulate._jit import kernel

__all__ = ["W_MAX", "W_MIN", "exp_minus", "exp_minus_clamped"]

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's ln2_hi: 11 trailing zero bits
_LN2_LO = 1.90821492927058770002e-10
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52: round(x) appears in the low mantissa bits of x + SHIFTER
_EXP_BITS = 1023 - int(np.float64(_SHIFTER).view(np.int64))  # bits(x + SHIFTER) + this = k + 1023
#: Smallest and largest argument of :func:`exp_minus` (beyond them, clamp or use libm).
W_MIN = -708.0
W_MAX = 709.0

_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = (
    1.0 / math.factorial(k) for k in range(2, 14)
)


def _bitcast(source, target, name: str):
    """Return a numba intrinsic that reinterprets the bits of a ``source`` value as ``target`` (free).

    Parameters
    ----------
    source, target : numba.types.Type
        Types of equal width (here float64 and int64, IEEE-754 bits).
    name : str
        The intrinsic's name.

    Returns
    -------
    numba.extending.intrinsic
    """

    def typer(typingctx, x):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


#: The IEEE-754 bits of a float64, as an int64, and back.
_bits = _bitcast(types.float64, types.int64, "_bits")
_from_bits = _bitcast(types.int64, types.float64, "_from_bits")


@kernel
def exp_minus(w, minus):  # pragma: no cover - compiled
    r""":math:`e^w - \text{minus}` (minus is 0 or 1) for ``w`` in ``[-708, W_MAX]`` (not checked)."""
    kd = w * _LOG2E + _SHIFTER
    k = kd - _SHIFTER
    r = (w - k * _LN2_HI) - k * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    q0 = (_C2 + _C3 * r) + (_C4 + _C5 * r) * r2
    q1 = (_C6 + _C7 * r) + (_C8 + _C9 * r) * r2
    q2 = (_C10 + _C11 * r) + (_C12 + _C13 * r) * r2
    p = r + r2 * ((q0 + q1 * r4) + q2 * (r4 * r4))
    e = _from_bits((_bits(kd) + _EXP_BITS) << 52)
    return e * p + (e - minus)


@kernel
def exp_minus_clamped(w, minus):  # pragma: no cover - compiled
    """:func:`exp_minus` of ``w`` clamped to ``[-708, W_MAX]``."""
    w = w if w > W_MIN else W_MIN
    w = w if w < W_MAX else W_MAX
    return exp_minus(w, minus)
