"""`quantize`: block-scaled quantization (the Helion kernel on a GPU); `quantize_weight`: nn.Linear weights
quantized once, in the layout the fastest kernel on their device reads."""

from __future__ import annotations

import torch

from .formats import BlockFormat
from .qtensor import QTensor


def quantize_weight(weight: torch.Tensor, fmt: str | BlockFormat, *, data_layout: str | None = None, **options) -> QTensor:
    """Quantize weights [N, K] (on the device they will run on) for `scaled_mm`.

    The same codes and scales as `blockscaled.quantize(weight, fmt, **options)` (`scale_rounding`, `layout`,
    `global_scale`); `data_layout` None takes the device's
    fastest (`blockscaled.kernels.weight_data_layout`: "mma_m16k16" on NVIDIA sm_80 .. sm_90,
    padded internally for any N and K; "k_order" elsewhere). The result's `data_layout` says
    which; `QTensor.with_data_layout` converts.
    """
    q = quantize(weight, fmt, **options)
    return q.for_device() if data_layout is None else q.with_data_layout(data_layout)


QUANTIZE_BACKENDS = ("kernel", "reference")


def quantize(x: torch.Tensor, fmt: str | BlockFormat, *, scale_rounding: str = "floor", layout: str = "rowmajor",
             global_scale: torch.Tensor | float | None = None, data_layout: str = "k_order",
             backend: str | None = None) -> QTensor:
    """Quantize `x` [rows, K] (bf16, fp16 or fp32) to a `QTensor`: the same codes and scales, bit for bit, as
    `blockscaled.reference.quantize` (its docstring defines the formats, the roundings and NaN / Inf).

    | argument       | values                                       | default                                   |
    |----------------|----------------------------------------------|-------------------------------------------|
    | scale_rounding | "floor" (OCP MX), "rceil" (mx formats)       | "floor"                                   |
    | layout         | "rowmajor", "swizzle_32_4_4", "cdna4_16/32"  | "rowmajor": the scales as stored          |
    | global_scale   | nvfp4: a number > 0 or a one-element tensor  | amax / (6 * 448), computed on the device  |
    | data_layout    | "k_order", "mma_m16k16"                      | "k_order" (activations)                   |
    | backend        | "kernel" (`kernels/quantize.py`), "reference" | "kernel" on CUDA, else "reference"       |

    Nothing waits on the host: a tensor `global_scale` (a checkpoint's `input_scale`) is read by the kernel."""
    from blockscaled.reference.quantize import check_quantize_args, quantize as reference_quantize

    if backend is None:
        backend = "kernel" if isinstance(x, torch.Tensor) and x.is_cuda else "reference"
    if backend not in QUANTIZE_BACKENDS:
        raise ValueError(f"backend: expected one of {QUANTIZE_BACKENDS} or None, got {backend!r}")
    if backend == "reference":
        return reference_quantize(x, fmt, scale_rounding=scale_rounding, layout=layout, global_scale=global_scale,
                                  data_layout=data_layout)
    fmt = check_quantize_args(x, fmt, scale_rounding, global_scale)
    from blockscaled.kernels.api import on_device
    from blockscaled.kernels.launch import device_error
    from blockscaled.kernels.quantize import quantize as kernel_quantize

    if why := device_error("x", x):
        raise ValueError(why)

    with on_device(x.device):  # the kernel launches on the current device: x's, where x is on another GPU
        data, scale, g = kernel_quantize(x, fmt, scale_rounding, layout, global_scale)
    q = QTensor(data, scale, fmt, layout, g, (x.shape[0], x.shape[1]))
    return q if data_layout == "k_order" else q.with_data_layout(data_layout)
