"""Element-data layouts of packed fp4 (and fp8 for "mma_m16k16") (`blockscaled.layouts`): forward and exact inverse.

- "k_order":     byte i of a row holds elements 2i (low nibble) and 2i+1 (high nibble):
                 the OCP / torch.float4_e2m1fn_x2 packing every kernel reads by default.
- "block_pairs": K is cut into pairs of scale blocks (2 * block elements); byte j of a pair
                 holds element j of its first block (low nibble) and element j of its
                 second block (high nibble). One 4-byte decode then yields two K-contiguous
                 blocks with no interleave: the decode kernel's weight layout (Marlin-style
                 pre-arrangement of static weights, done once).
- "mma_m16k16":  mma.sync A fragments with the bits placed for a bf16 decode, 16-row
                 groups (`blockscaled.layouts.mma`): the tensor-core decode kernel's weights,
                 fp4 and (the one layout here that takes them) fp8.
"""

from __future__ import annotations

import torch

from .fp4 import unpack_codes
from .mma import check_mma_shape

DATA_LAYOUTS = ("k_order", "block_pairs", "mma_m16k16")


def check_data_layout(layout: str, k: int, block: int, packed: bool, rows: int = 0) -> None:
    """Raise a clear error if `layout` cannot hold [rows, K=`k`] elements of this format."""
    if layout not in DATA_LAYOUTS:
        raise ValueError(f"data_layout: expected one of {DATA_LAYOUTS}, got {layout!r}")
    if layout == "mma_m16k16":
        check_mma_shape(rows, k)
    if layout == "block_pairs":
        if not packed:
            raise ValueError("data_layout: 'block_pairs' applies to packed fp4 formats only")
        if k % (2 * block):
            raise ValueError(f"data_layout: 'block_pairs' needs K % {2 * block} == 0 (pairs of {block}-blocks), got K={k}")


def _codes(data: torch.Tensor) -> torch.Tensor:
    """[rows, K/2] bytes -> [rows, K/2, 2] nibbles (low, high)."""
    return unpack_codes(data).reshape(*data.shape, 2)


def pair_blocks(data: torch.Tensor, block: int) -> torch.Tensor:
    """k_order bytes [rows, K/2] -> block_pairs bytes [rows, K/2]."""
    rows, half = data.shape
    pairs = _codes(data).reshape(rows, half // block, 2, block)  # [rows, pair, which block, j]
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(rows, half).contiguous()


def unpair_blocks(data: torch.Tensor, block: int) -> torch.Tensor:
    """block_pairs bytes [rows, K/2] -> k_order bytes [rows, K/2] (inverse of `pair_blocks`)."""
    rows, half = data.shape
    elems = _codes(data).reshape(rows, half // block, block, 2).transpose(2, 3)  # [rows, pair, which, j]
    elems = elems.reshape(rows, half, 2)  # K order, two per byte
    return (elems[..., 0] | (elems[..., 1] << 4)).contiguous()
