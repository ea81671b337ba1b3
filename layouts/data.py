"""Element-data layouts (`blockscaled.layouts`): which order a QTensor's `data` bytes hold.

| name         | formats    | stored shape of [rows, K]                  | read by                              |
|--------------|------------|--------------------------------------------|--------------------------------------|
| "k_order"    | fp4, fp8   | [rows, K/2] fp4 (even K in the low nibble), [rows, K] fp8 | every kernel; activations |
| "mma_m16k16" | fp4, fp8   | `mma_stored_shape(rows, K)`: rows to x128, K to x64, zero codes | the mma kernels (weights) |

"k_order" is the OCP / torch.float4_e2m1fn_x2 packing. "mma_m16k16" places each thread's
mma.sync A fragment in one word with the bits where the bf16 decode wants them
(`blockscaled.layouts.mma`: the arrangement, its inverse and the in-kernel decode).
"""

from __future__ import annotations

DATA_LAYOUTS = ("k_order", "mma_m16k16")


def check_data_layout(layout: str) -> None:
    """Raise a clear error if `layout` is not a data layout."""
    if layout not in DATA_LAYOUTS:
        raise ValueError(f"data_layout: expected one of {DATA_LAYOUTS}, got {layout!r}")
