"""`quantize_weight`: nn.Linear weights quantized once, in the layout the fastest kernel on their device reads."""

from __future__ import annotations

import torch

from .formats import BlockFormat
from .qtensor import QTensor


def quantize_weight(
    weight: torch.Tensor,
    fmt: str | BlockFormat,
    *,
    scale_rounding: str = "floor",
    layout: str = "rowmajor",
    global_scale: torch.Tensor | float | None = None,
    data_layout: str | None = None,
) -> QTensor:
    """Quantize weights [N, K] (on the device they will run on) for `scaled_mm`.

    The same codes and scales as `blockscaled.quantize`; `data_layout` None takes the device's
    fastest (`blockscaled.kernels.weight_data_layout`: "mma_m16k16" on NVIDIA sm_80 .. sm_90,
    padded internally for any N and K; "k_order" elsewhere). The result's `data_layout` says
    which; `QTensor.with_data_layout` converts.
    """
    from blockscaled.kernels import weight_data_layout
    from blockscaled.reference import quantize

    q = quantize(weight, fmt, scale_rounding=scale_rounding, layout=layout, global_scale=global_scale)
    if data_layout is None:
        data_layout = weight_data_layout(weight.device)
    return q.with_data_layout(data_layout)
