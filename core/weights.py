"""`quantize_weight`: nn.Linear weights quantized once, in the layout the fastest kernel on their device reads."""

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
    from blockscaled.reference import quantize

    q = quantize(weight, fmt, **options)
    return q.for_device() if data_layout is None else q.with_data_layout(data_layout)
