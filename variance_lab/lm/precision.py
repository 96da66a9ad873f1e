r"""Low-precision copies of a model: the sampler in bfloat16 or float16 against a float32 trainer.

Two ways to run a model in a 16-bit format:

- **native**: the weights cast to the format and every operation run by PyTorch's kernels
  for it (``model.to(torch.bfloat16)``), as an inference engine does. On x86 CPUs PyTorch
  runs bfloat16 and float16 matrix products through oneDNN; :func:`native_support` asks
  oneDNN whether the processor has them (``avx512_bf16``/``amx_bf16`` for bfloat16,
  ``avx512_fp16``/``amx_fp16`` for float16).
- **emulated**: float32 arithmetic with every weight rounded to the format and every
  module's floating output rounded to it (a forward hook on each module), the rounding
  :math:`\operatorname{fl}_{16}(x)` a 16-bit engine applies to what it stores. Accumulation
  inside a matrix product stays float32, as in the native kernels; what differs is the
  rounding inside fused operations (softmax, RMSNorm), which emulation does in float32.

:func:`low_precision_copy` returns either and says which (``"native"`` or ``"emulated"``);
the run's sidecar records it.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["DTYPES", "PRECISIONS", "low_precision_copy", "native_support", "round_weights"]

#: The precisions by name, and their torch dtypes.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = tuple(DTYPES)


def native_support(precision: str) -> bool:
    """Whether this CPU runs ``precision``'s matrix products natively (oneDNN's own check).

    Parameters
    ----------
    precision : {"fp32", "bf16", "fp16"}

    Returns
    -------
    bool
        Always True for ``"fp32"``.
    """
    _check(precision)
    if precision == "fp32":
        return True
    mkldnn = torch.ops.mkldnn
    probe = mkldnn._is_mkldnn_bf16_supported if precision == "bf16" else mkldnn._is_mkldnn_fp16_supported
    try:
        return bool(probe())
    except (RuntimeError, AttributeError):
        return False


def _check(precision: str) -> None:
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _round_output(dtype: torch.dtype):
    def hook(module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(dtype).to(output.dtype)
        if isinstance(output, tuple):
            return tuple(
                o.to(dtype).to(o.dtype) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in output
            )
        return output

    return hook


def low_precision_copy(model: torch.nn.Module, precision: str, mode: str = "auto"):
    """Return a copy of ``model`` that computes in ``precision``, and how it does.

    Parameters
    ----------
    model : torch.nn.Module
        A float32 model (left unchanged).
    precision : {"fp32", "bf16", "fp16"}
    mode : {"auto", "native", "emulated"}, optional
        ``"auto"``: native where :func:`native_support` says so, else emulated.

    Returns
    -------
    (torch.nn.Module, str)
        The copy (in ``eval()`` mode) and ``"native"`` or ``"emulated"`` (``"native"`` for fp32).
    """
    _check(precision)
    if mode not in ("auto", "native", "emulated"):
        raise ValueError(f"mode must be 'auto', 'native' or 'emulated', got {mode!r}")
    out = copy.deepcopy(model).eval()
    if precision == "fp32":
        return out, "native"
    dtype = DTYPES[precision]
    if mode == "native" or (mode == "auto" and native_support(precision)):
        return out.to(dtype), "native"
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(dtype).to(p.dtype))
    for module in out.modules():
        module.register_forward_hook(_round_output(dtype))
    return out, "emulated"


def round_weights(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    r"""Round every weight of ``model`` to ``precision`` in place (kept in its own dtype); return it.

    A trainer that starts from a checkpoint released in bfloat16 holds float32 master weights
    that are bfloat16 numbers. SmolLM2-135M-Instruct's GGUF file (Q4_1) dequantizes to float32
    values of which 8.1 % lie exactly halfway between two bfloat16 numbers (measured on the
    134,515,008 weights): a bfloat16 copy of an updated policy then rounds each of those up
    or down by the sign of its update, half a bfloat16 step (about :math:`10^{-4}` relative)
    against an update of the learning rate (:math:`10^{-6}`), which multiplies the update a
    hundredfold in the copy. Rounding :math:`\theta_0` first removes the ties, as a bfloat16
    release has none; bfloat16 numbers are float16 numbers too, away from float16's range ends.

    Parameters
    ----------
    model : torch.nn.Module
    precision : {"fp32", "bf16", "fp16"}
        ``"fp32"`` leaves the weights as they are.

    Returns
    -------
    torch.nn.Module
        ``model``.
    """
    _check(precision)
    if precision != "fp32":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(DTYPES[precision]).to(p.dtype))
    return model
