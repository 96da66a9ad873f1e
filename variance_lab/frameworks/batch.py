r"""Padded batches as the frameworks hold them: 2-D float64 arrays and a 0/1 mask, checked once.

Every mirror in :mod:`variance_lab.frameworks` takes NumPy arrays of shape ``(B, T)`` (B
sequences padded to T positions) and a 0/1 mask of the same shape, and returns float64. Values
at padded positions are never read: they are set to 0 before any arithmetic, as the frameworks'
``masked_sum`` does (``torch.where(mask, values, 0)``), so NaN or -inf padding is harmless.

The frameworks compute in their tensors' dtype (float32 log-probabilities in most runs). Most
mirrors compute in float64: they agree with a framework run in float64 to :math:`10^{-9}` relative
(the fixtures' check), with a float32 run to float32's precision (about :math:`10^{-7}` relative
per operation), and a fraction can differ by one token where a ratio lies within rounding of a
bound. A :class:`MeanRule` with ``dtypes="torch"`` instead follows torch's dtypes
(:func:`torch_dtypes`), so that a mirror fed the framework's own dtypes (float32 log-probs, an
int64 or bool mask) computes as the framework does (the verl mirror).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from variance_lab.ratios import CLOSED, BoundRule
from variance_lab.stats import group_labels

__all__ = [
    "COUNTS",
    "MEAN_DTYPES",
    "POOLINGS",
    "SAMPLE_MEAN",
    "MeanRule",
    "as_mask",
    "as_values",
    "exp64",
    "exp_float32",
    "exp_like",
    "log_float32",
    "masked_mean",
    "masked_sum",
    "padded",
    "sort_descending",
    "torch_dtypes",
    "torch_mask",
    "torch_rule",
]

#: How a framework's masked mean divides: by the count plus an epsilon, by the count clamped to at
#: least 1, by the sum of each row's count clamped to at least 1 (slime's token count with
#: ``calculate_per_token_loss``: an empty row adds 1), or by the count itself (an empty mask gives
#: NaN).
COUNTS = ("eps", "at_least_one", "row_at_least_one", "exact")
#: What a framework's batch mean pools: every masked token of the batch at once, or each sample's
#: mean first and then the mean over the samples (long and short sequences weigh the same).
POOLINGS = ("tokens", "samples")
#: The dtypes a masked mean computes in: float64 throughout, or those torch gives the inputs'
#: dtypes (:func:`torch_dtypes`).
MEAN_DTYPES = ("float64", "torch")


def torch_dtypes(values_dtype, mask_dtype) -> tuple[np.dtype, np.dtype]:
    r"""Return the dtypes torch gives ``(values * mask).sum()`` and ``mask.sum() + eps``.

    torch multiplies a float tensor by a bool or integer mask in the float's dtype and by a float
    mask in the wider of the two; it sums a bool or integer mask into an int64 count, and an
    int64 count plus a Python float is a tensor of its default dtype, float32. So for an int64,
    bool or float32 mask the divisor of ``masked_mean`` is :math:`\mathrm{fl}_{32}(c + 10^{-8})
    = c` for every count :math:`1 \le c < 2^{24}` (float32's half ulp at 1 is
    :math:`6\cdot10^{-8}`), and :math:`\mathrm{fl}_{32}(10^{-8})` for an empty row; only a
    float64 mask keeps :math:`c + 10^{-8}`. (Checked on torch 2.13.0: ``(m.sum() + 1e-8).dtype``
    is float32 for int64, bool and float32 masks, float64 for a float64 mask.)

    Values that are flags (bool or integer: ``is_masked``, ``(w > hi).int()``) are counted: torch
    sums a bool or integer product into int64 (a float mask makes it the mask's float), and
    divides an integer by an integer or a float32 count in its default dtype, float32, so that a
    fraction of counts :math:`k/n` is the float32 quotient :math:`\mathrm{fl}_{32}(k/n)` (for
    :math:`k, n < 2^{24}`, both exact in float32; :meth:`MeanRule.divide`).

    Parameters
    ----------
    values_dtype : numpy dtype
        float32 or float64; bool or an integer for flags.
    mask_dtype : numpy dtype
        bool, an integer, float32 or float64.

    Returns
    -------
    (np.dtype, np.dtype)
        The dtype of the masked sum (and of the quotient, for float values) and that of the count
        plus epsilon (and of the quotient, for flags).
    """
    v, m = np.dtype(values_dtype), np.dtype(mask_dtype)
    if v.kind in "biu":
        return (np.dtype(np.int64), np.dtype(np.float32)) if m.kind in "biu" else (m, m)
    if m.kind in "biu":
        return v, np.dtype(np.float32)
    return np.promote_types(v, m), m


def as_mask(mask, name: str = "response_mask", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Return a 0/1 mask as float64, or ``ValueError`` naming the bad value.

    Parameters
    ----------
    mask : array_like
        0/1 (or bool) values, 2-D.
    name : str
        The argument's name, for the error message.
    shape : tuple of int, optional
        The shape it must have.
    """
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"{name} must be 2-D (batch, positions), got shape {m.shape}")
    if shape is not None and m.shape != shape:
        raise ValueError(f"{name} has shape {m.shape}, expected {shape}")
    m = m.astype(np.float64)
    bad = ~((m == 0.0) | (m == 1.0))
    if bad.any():
        raise ValueError(f"{name} must hold only 0 and 1, got {m[bad].flat[0]!r}")
    return m


def torch_mask(mask, name: str = "response_mask") -> np.ndarray:
    """Check a 0/1 mask (:func:`as_mask`); return it in the dtype torch computes with (bool, int64, float).

    A bool mask stays bool, any integer mask is int64 (the dtype of a ``torch.long`` mask; an
    int32 one promotes the same way against float tensors), a float32 mask float32 and anything
    else float64, so that :func:`torch_dtypes` gives the products and counts the framework forms.
    """
    raw = np.asarray(mask)
    m = as_mask(raw, name)
    if raw.dtype == np.bool_:
        return m.astype(np.bool_)
    if raw.dtype.kind in "iu":
        return m.astype(np.int64)
    return m.astype(np.float32) if raw.dtype == np.float32 else m


def as_values(
    values, mask: np.ndarray, name: str, *, allow_nan: bool = False, keep_float32: bool = False
) -> np.ndarray:
    """Return ``values`` as float64 of the mask's shape with padding set to 0; ``ValueError`` if bad.

    Values inside the mask must be finite (or NaN, with ``allow_nan``: TRL's marker of a token
    vLLM could not score); those outside it are ignored. With ``keep_float32`` a float32 input
    stays float32 (a mirror that computes in the framework's dtype); anything else is float64.
    """
    v = np.asarray(values)
    v = v if keep_float32 and v.dtype == np.float32 else np.asarray(v, dtype=np.float64)
    if v.shape != mask.shape:
        raise ValueError(f"{name} has shape {v.shape}, expected {mask.shape} (the mask's)")
    inside = mask > 0
    ok = np.isfinite(v[inside]) | (np.isnan(v[inside]) if allow_nan else False)
    if not np.all(ok):
        bad = v[inside][~ok][0]
        raise ValueError(f"{name} holds a non-finite value inside the mask: {bad!r}")
    return np.where(inside, v, v.dtype.type(0.0))


def masked_sum(values: np.ndarray, mask: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    r""":math:`\sum m v` over ``axis``, padding read as 0 (verl's ``masked_sum``)."""
    return (np.where(mask > 0, values, 0.0) * mask).sum(axis=axis, keepdims=keepdims)


@dataclass(frozen=True)
class MeanRule:
    r"""A framework's masked mean: how it divides by the count and what it pools.

    With ``pooling="tokens"`` the mean over ``axis`` is
    :math:`\sum m v / d(\sum m)`; with ``pooling="samples"`` (and ``axis=None``) it is
    :math:`\frac1B \sum_i \sum_t m_{it} v_{it} / d(\sum_t m_{it})`, where the divisor is
    :math:`d(c) = c + \varepsilon` (``count="eps"``), :math:`\max(c, 1)` (``"at_least_one"``) or
    :math:`c` (``"exact"``). ``count="row_at_least_one"`` clamps each row's count before the rows
    are pooled: pooled over tokens the divisor is :math:`\sum_i \max(\sum_t m_{it}, 1)` (an
    empty row adds 1), per row and pooled over samples it is :math:`\max(c, 1)`. Padding is read
    as 0 (:func:`masked_sum`).

    With ``groups`` (pooling over samples, ``axis=None``) the rows of one group are one sample:
    :math:`\frac1G \sum_g \sum_{i \in g} \sum_t m_{it} v_{it} / d(\sum_{i \in g} \sum_t m_{it})`
    over the :math:`G` distinct groups (slime's per-rollout mean, where one rollout may emit
    several samples).

    With ``dtypes="float64"`` the arithmetic is NumPy's on the arrays given (float64 for the
    mirrors' float64 inputs). With ``dtypes="torch"`` it is torch's (:func:`torch_dtypes`): the
    products and the sum in the values' dtype (a float mask of wider dtype promotes), the count
    plus :math:`\varepsilon` in float32 for a bool, integer or float32 mask, where
    :math:`c + 10^{-8}` rounds to :math:`c`, and in float64 for a float64 mask; flags (bool or
    integer values) are counted in int64 and their fraction is the float32 quotient of the two
    counts, as torch's true division of integers gives it.

    Attributes
    ----------
    count : {"eps", "at_least_one", "row_at_least_one", "exact"}
    eps : float
        The :math:`\varepsilon` of ``count="eps"`` (verl's and NeMo-RL's :math:`10^{-8}`).
    pooling : {"tokens", "samples"}
    dtypes : {"float64", "torch"}
    """

    count: str = "eps"
    eps: float = 1e-8
    pooling: str = "tokens"
    dtypes: str = "float64"

    def __post_init__(self):
        """Check the count, the pooling and the dtypes."""
        if self.count not in COUNTS:
            raise ValueError(f"count must be one of {COUNTS}, got {self.count!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.dtypes not in MEAN_DTYPES:
            raise ValueError(f"dtypes must be one of {MEAN_DTYPES}, got {self.dtypes!r}")

    def divide(self, total, count):
        r"""Return ``total`` over the rule's divisor of ``count`` (NaN for an empty exact mean).

        Under ``dtypes="torch"`` ``count`` is the mask's own sum (an integer count for a bool or
        integer mask) and the divisor is formed in :func:`torch_dtypes`' count dtype; an integer
        ``total`` (a count of flags) is divided in that dtype too, as torch's true division of
        integers gives its default dtype: :math:`\mathrm{fl}_{32}(k / n)`, float32, for an
        integer or float32 count.
        """
        if self.dtypes == "torch":
            total, count = np.asarray(total), np.asarray(count)
            _, cdt = torch_dtypes(total.dtype, count.dtype)
            count = count.astype(cdt)
            if total.dtype.kind in "biu":
                total = total.astype(cdt)
            eps, one = cdt.type(self.eps), cdt.type(1.0)
        else:
            eps, one = self.eps, 1.0
        if self.count == "eps":
            return total / (count + eps)
        if self.count in ("at_least_one", "row_at_least_one"):
            return total / np.maximum(count, one)
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / count

    def sum(self, values, mask, axis=None, keepdims: bool = False):
        r"""Return :math:`\sum m v` over ``axis`` (:func:`masked_sum`); in torch's dtype under ``"torch"``."""
        if self.dtypes == "float64":
            return masked_sum(values, mask, axis, keepdims=keepdims)
        values, mask = np.asarray(values), np.asarray(mask)
        sdt, _ = torch_dtypes(values.dtype, mask.dtype)
        v = np.where(mask != 0, values, values.dtype.type(0)).astype(sdt)
        return (v * mask.astype(sdt)).sum(axis=axis, keepdims=keepdims, dtype=sdt)

    def mean(self, values, mask, axis=None, keepdims: bool = False, groups=None):
        """Return the masked mean of ``values`` over ``axis`` under this rule (see the class).

        ``groups`` (shape ``(B,)``, one id per row) pools the rows of each group into one sample;
        it needs ``pooling="samples"`` and ``axis=None``.
        """
        if groups is not None:
            return self._group_mean(values, mask, axis, groups)
        if self.pooling == "samples" and axis is None:
            return np.mean(self.divide(self.sum(values, mask, -1), mask.sum(axis=-1)))
        total = self.sum(values, mask, axis, keepdims=keepdims)
        if self.count == "row_at_least_one" and axis is None:
            return self.divide(total, np.maximum(mask.sum(axis=-1), 1.0).sum())
        if self.count == "row_at_least_one" and axis not in (-1, mask.ndim - 1):
            raise ValueError(
                f"count 'row_at_least_one' pools whole rows: axis must be None or -1, got {axis!r}"
            )
        return self.divide(total, mask.sum(axis=axis, keepdims=keepdims))

    def _group_mean(self, values, mask, axis, groups):
        if self.pooling != "samples" or axis is not None:
            raise ValueError(
                f"groups pool rows into samples: they need pooling='samples' and axis=None, "
                f"got pooling={self.pooling!r}, axis={axis!r}"
            )
        g = np.asarray(groups)
        if g.shape != mask.shape[:1]:
            raise ValueError(f"groups has shape {g.shape}, expected ({mask.shape[0]},): one id per row")
        index, _ = group_labels(g, g.size)
        totals = np.bincount(index, weights=masked_sum(values, mask, -1))
        counts = np.bincount(index, weights=mask.sum(axis=-1))
        return np.mean(self.divide(totals, counts))


#: A mean per sample (its count clamped to at least 1), then the mean over the samples: a long and
#: a short sequence weigh the same (prime-rl's ``_safe_mean`` per sample, slime's per-rollout mean).
#: In torch's dtypes: float values as given, and a fraction of bool or integer flags over a bool
#: or integer mask the float32 quotient of the two counts (``torch.clamp_min(mask.sum(), 1)`` is
#: int64, and int64 / int64 is float32), as both frameworks compute it.
SAMPLE_MEAN = MeanRule("at_least_one", 0.0, "samples", "torch")

#: :func:`torch_rule`'s rules, by dtype and space (one object each).
_TORCH_RULES = {
    (dt, space): BoundRule(CLOSED, space, dt) for dt in ("float64", "float32") for space in ("value", "log")
}


def torch_rule(dtype, space: str = "value") -> BoundRule:
    """Return the bound rule of torch comparing a tensor of ``dtype`` with a Python bound.

    torch compares ``x < lo``, ``x > hi`` (and clamps) in the tensor's dtype, the Python float
    cast to it: on a float32 tensor the bound is rounded to float32 first. A value exactly at a
    bound is kept (modified only beyond it). ``space="log"`` labels a log-ratio compared with
    bounds given as logs (on float32, each the float32 log of :func:`log_float32`, as ``torch.log``
    of the bound as a tensor); the comparison is the same.

    Parameters
    ----------
    dtype : numpy dtype
        The tensor's: float32 compares in float32, any other dtype in float64.
    space : {"value", "log"}

    Returns
    -------
    BoundRule
        ``BoundRule(CLOSED, space, "float32" or "float64")``, the same object for the same arguments.
    """
    if space not in ("value", "log"):
        raise ValueError(f"space must be 'value' or 'log', got {space!r}")
    return _TORCH_RULES[("float32" if np.dtype(dtype) == np.float32 else "float64", space)]


def masked_mean(values: np.ndarray, mask: np.ndarray, axis=None, eps: float = 1e-8) -> np.ndarray:
    r""":math:`\sum m v / (\sum m + \varepsilon)`: verl's ``masked_mean``, :math:`\varepsilon = 10^{-8}`.

    The :math:`\varepsilon` changes a 4-token mean by a relative :math:`2.5\cdot10^{-9}`, so the
    mirrors keep it to agree with the frameworks' logs to :math:`10^{-9}`.
    """
    return MeanRule("eps", eps).mean(values, mask, axis)


def exp_float32(x) -> np.ndarray:
    r"""Return :math:`e^x` of ``x`` in float32 as the frameworks' torch computes it (``inf`` on overflow).

    The frameworks take their float32 exponentials with torch, whose float32 ``exp`` (2.13, CPU) is
    the correctly rounded value on 99.0 % of :math:`10^7` inputs uniform in [-25, 25] and one ulp
    off on the rest (NumPy's float32 ``exp``: 61 %). So the mirror calls torch's ``exp`` where
    torch is installed, and rounds the float64 exponential of the float32 input otherwise (then a
    value can differ from the framework's by one ulp).
    """
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    torch = _torch()
    if torch is not None:
        return torch.exp(torch.from_numpy(np.array(x32, copy=True))).numpy().reshape(x32.shape)
    with np.errstate(over="ignore"):
        return np.exp(x32.astype(np.float64)).astype(np.float32)


def sort_descending(x) -> np.ndarray:
    """Return the order ``torch.sort(x, descending=True)`` gives a 1-D array: its ``indices``.

    Among equal values torch's CPU sort keeps the order of appearance up to 16 values and not
    beyond (torch 2.13.0), so the mirror calls torch's own sort where torch is installed (the
    order the frameworks' CPU runs give; a GPU's may differ again) and NumPy's stable sort
    otherwise (the same order but among ties).
    """
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"sort_descending takes a 1-D array, got shape {x.shape}")
    torch = _torch()
    if torch is not None:
        return torch.sort(torch.from_numpy(np.array(x, copy=True)), descending=True).indices.numpy()
    return np.argsort(-x, kind="stable")


def _torch():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def log_float32(x) -> np.float32:
    r"""Return :math:`\log x` as ``torch.log(torch.tensor(x))`` takes it: ``x`` and its log in float32.

    The correctly rounded float32 log of ``float32(x)``: torch's (2.13, CPU) for every power of
    ten from :math:`10^{-12}` to :math:`10^{-1}` (mis.yaml's veto :math:`10^{-4}` among them).
    """
    return np.float32(np.log(np.float64(np.float32(x))))


def exp_like(x) -> np.ndarray:
    r"""Return :math:`e^x` in the dtype of ``x`` (float32 or float64), ``inf`` on overflow, as torch does.

    float64: NumPy's exp. float32: :func:`exp_float32`, the correctly rounded value; torch's own
    float32 exp on a CPU differs from it by one ulp on about 1 % of inputs (1.0 % of
    :math:`2\cdot10^6` uniform on [-20, 20], torch 2.13.0, AVX512) and NumPy's float32 exp on
    39 %; on a GPU a framework uses CUDA's. A weight within one ulp of a threshold can therefore
    fall on either side in the framework itself.
    """
    x = np.asarray(x)
    if x.dtype == np.float32:
        return exp_float32(x)
    with np.errstate(over="ignore"):
        return np.exp(x)


def exp64(x) -> np.ndarray:
    r""":math:`e^x` in float64, ``inf`` where a float32 :math:`e^x` overflows (:math:`x > 88.72`)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(np.isinf(exp_float32(x)), np.inf, np.exp(x))


def padded(offsets, *values) -> tuple[np.ndarray, ...]:
    r"""Return ``(mask, *arrays)``: flat per-token values padded to ``(B, T)``, as the frameworks hold them.

    Parameters
    ----------
    offsets : array_like of int, shape (B + 1,)
        Sequence ``i`` is ``values[offsets[i]:offsets[i+1]]`` (a
        :class:`~variance_lab.rollouts.batch.TokenBatch`'s ``offsets``), non-decreasing from 0.
    *values : array_like, shape (offsets[-1],)
        Flat token values (``batch.old_logp``, ``batch.rollout_logp``, ...).

    Returns
    -------
    tuple of ndarray
        The 0/1 mask of shape ``(B, T)``, :math:`T = \max_i L_i`, then each array padded with 0.
    """
    off = np.asarray(offsets)
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or np.any(np.diff(off) < 0):
        raise ValueError(
            f"offsets must be non-decreasing from 0 with at least 2 entries, got {off[:5].tolist()!r}"
        )
    lengths = np.diff(off)
    T = int(lengths.max())
    mask = np.arange(T)[None, :] < lengths[:, None]
    out = [mask.astype(np.float64)]
    for v in values:
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (int(off[-1]),):
            raise ValueError(f"values have shape {v.shape}, expected ({int(off[-1])},) from the offsets")
        a = np.zeros(mask.shape)
        a[mask] = v  # row-major order of the mask is the flat order
        out.append(a)
    return tuple(out)
