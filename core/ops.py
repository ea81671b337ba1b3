"""`blockscaled.ops`: `torch.library` custom ops, so that `torch.compile` traces through this library.

| op                      | inputs                                                                 | output                     |
|-------------------------|------------------------------------------------------------------------|----------------------------|
| `blockscaled::linear`   | x [M, K]; the weight's data, scale, global scale (a QTensor's fields), its format, scale layout, data layout, N, K; bias; activation format, scale rounding, static activation global scale; out dtype | [M, N] out dtype |
| `blockscaled::quantize` | x [rows, K]; format, scale rounding, scale layout, global scale        | (data, scale, global [1])  |
| `blockscaled::decode_attention` | q [B, Hkv, G, D]; k, v [B, Hkv, S, D]; keep [B, S] or [B or 1, 1, 1, S] bool or None; scale | [B, Hkv, G, D] q's dtype   |
| `blockscaled::step_mask` | a model step's attention mask (any shape and dtype)                | a copy of it               |

Each has a fake (meta) implementation: shapes and dtypes only. `QuantizedLinear` calls `linear` while
`torch.compile` traces it (eager calls skip the dispatcher). The op rebuilds the weight's QTensor from its fields
once: weights registered by `register_weight` (every QuantizedLinear's) are looked up by storage, so the per-weight
caches (kernel views, mma factors) survive across calls.

The ops are defined on a `torch.library.Library` with one CompositeExplicitAutograd kernel each, not with
`torch.library.custom_op`: its per-call wrappers (autograd, device dispatch, alias check) cost 150-350 us of host
time a call on an H200 (torch 2.11), which left an inductor-compiled prefill host-bound. Inference only: neither op
has a derivative, and a call on inputs that require grad raises.
"""

from __future__ import annotations

import weakref

import torch

from .formats import get_format
from .layouts import stored_scale_shape
from .qtensor import QTensor

_WEIGHTS: dict[tuple, weakref.ref] = {}


def _key(data: torch.Tensor, scale: torch.Tensor) -> tuple:
    return data.device, data.data_ptr(), scale.data_ptr(), tuple(data.shape), tuple(scale.shape)


def register_weight(w: QTensor) -> None:
    """Let `linear` find `w` (and its caches) from its data and scale tensors."""
    _WEIGHTS[_key(w.data, w.scale)] = weakref.ref(w)


def _weight(data, scale, global_scale, fmt, layout, data_layout, n, k) -> QTensor:
    ref = _WEIGHTS.get(_key(data, scale))
    w = ref() if ref is not None else None
    if w is not None and w.data.dtype == data.dtype and w.fmt.name == fmt and w.shape == (n, k):
        return w
    w = QTensor(data, scale, get_format(fmt), layout, global_scale, (n, k), data_layout)
    register_weight(w)
    return w


_LIB = torch.library.Library("blockscaled", "DEF")
_LIB.define("linear(Tensor x, Tensor data, Tensor scale, Tensor? global_scale, Tensor? bias, str fmt, str layout, "
            "str data_layout, SymInt n, SymInt k, str? activation_format, str scale_rounding, "
            "Tensor? activation_global_scale, ScalarType out_dtype) -> Tensor")
_LIB.define("quantize(Tensor x, str fmt, str scale_rounding, str layout, Tensor? global_scale) -> "
            "(Tensor, Tensor, Tensor)")


def _no_grad_inputs(op: str, *tensors) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(f"blockscaled::{op} has no derivative (inference only); got an input that requires grad")


def linear(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
           bias: torch.Tensor | None, fmt: str, layout: str, data_layout: str, n: int, k: int,
           activation_format: str | None, scale_rounding: str, activation_global_scale: torch.Tensor | None,
           out_dtype: torch.dtype) -> torch.Tensor:
    """`linear_eager` with the weight given by its fields."""
    _no_grad_inputs("linear", x, bias, activation_global_scale)
    return linear_eager(x, _weight(data, scale, global_scale, fmt, layout, data_layout, n, k), bias, activation_format,
                        scale_rounding, activation_global_scale, out_dtype)


_LIB.impl("linear", linear, "CompositeExplicitAutograd")


@torch.library.register_fake("blockscaled::linear", lib=_LIB)
def _(x, data, scale, global_scale, bias, fmt, layout, data_layout, n, k, activation_format, scale_rounding,
      activation_global_scale, out_dtype):
    torch._check(x.dim() == 2 and x.shape[1] == k, lambda: f"x: expected [M, {k}], got {tuple(x.shape)}")
    return x.new_empty((x.shape[0], n), dtype=out_dtype)


def linear_eager(x: torch.Tensor, w: QTensor, bias, activation_format, scale_rounding, activation_global_scale,
                 out_dtype) -> torch.Tensor:
    """`scaled_mm(x, w, ...)`, the activation quantized in the call with `activation_format` (the quantization
    arguments are passed only then: `scaled_mm` refuses them without it)."""
    from blockscaled.kernels import scaled_mm

    if activation_format is None:
        return scaled_mm(x, w, out_dtype=out_dtype, bias=bias)
    return scaled_mm(x, w, out_dtype=out_dtype, bias=bias, activation_format=activation_format,
                     scale_rounding=scale_rounding, activation_global_scale=activation_global_scale)


def linear_call(x: torch.Tensor, w: QTensor, bias, activation_format, scale_rounding, activation_global_scale,
                out_dtype) -> torch.Tensor:
    """`torch.ops.blockscaled.linear` on QTensor `w`; a static `activation_global_scale` as a device tensor (a number
    would be copied to the device in every call, which a CUDA-graph capture refuses)."""
    return torch.ops.blockscaled.linear(x, w.data, w.scale, w.global_scale, bias, w.fmt.name, w.layout, w.data_layout,
                                        w.shape[0], w.shape[1], activation_format, scale_rounding,
                                        activation_global_scale, out_dtype)


def _quantize(x: torch.Tensor, fmt: str, scale_rounding: str, layout: str,
              global_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .weights import quantize as quantize_tensor

    _no_grad_inputs("quantize", x)
    q = quantize_tensor(x, fmt, scale_rounding=scale_rounding, layout=layout, global_scale=global_scale)
    g = q.global_scale.reshape(1) if q.global_scale is not None else torch.ones(1, dtype=torch.float32, device=x.device)
    return q.data, q.scale, g.clone()


_LIB.impl("quantize", _quantize, "CompositeExplicitAutograd")


@torch.library.register_fake("blockscaled::quantize", lib=_LIB)
def _(x, fmt, scale_rounding, layout, global_scale):
    f = get_format(fmt)
    rows, k = x.shape
    data = x.new_empty((rows, f.data_cols(k)), dtype=f.storage_dtype)
    scale = x.new_empty(stored_scale_shape(layout, rows, k // f.block_size), dtype=f.scale_dtype)
    return data, scale, x.new_empty((1,), dtype=torch.float32)


def quantize(x: torch.Tensor, fmt: str, *, scale_rounding: str = "floor", layout: str = "rowmajor",
             global_scale: torch.Tensor | None = None) -> QTensor:
    """`blockscaled.quantize` through the custom op (traceable by `torch.compile`); a k_order QTensor."""
    f = get_format(fmt)
    data, scale, g = torch.ops.blockscaled.quantize(x, f.name, scale_rounding, layout, global_scale)
    return QTensor(data, scale, f, layout, g.reshape(()) if f.global_scale else None, (x.shape[0], x.shape[1]))


_LIB.define("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? keep, float scale) -> Tensor")


def _decode_attention(q, k, v, keep, scale):
    from blockscaled.kernels.decode_attention import decode_attention

    _no_grad_inputs("decode_attention", q, k, v)
    return decode_attention(q, k, v, keep, scale)


_LIB.impl("decode_attention", _decode_attention, "CompositeExplicitAutograd")


@torch.library.register_fake("blockscaled::decode_attention", lib=_LIB)
def _(q, k, v, keep, scale):
    from blockscaled.kernels.decode_attention import supported

    why = supported(q, k, v, keep)
    torch._check(why is None, lambda: f"decode_attention: {why}")
    return torch.empty_like(q, memory_format=torch.contiguous_format)


_LIB.define("step_mask(Tensor mask) -> Tensor")


def _step_mask(mask):
    _no_grad_inputs("step_mask", mask)
    return mask.clone()


_LIB.impl("step_mask", _step_mask, "CompositeExplicitAutograd")


@torch.library.register_fake("blockscaled::step_mask", lib=_LIB)
def _(mask):
    return torch.empty_like(mask)
