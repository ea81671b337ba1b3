"""Block-scaled rows to bf16 on the GPU: the mma path's "predecode" of fp4 / fp8 activations.

Above M = 16 the mma kernel decodes its activation once per program: at M = 64 each of the
programs of 128 weight rows decodes all 64 rows of its K part again, and for fp4 activations on
fp4 weights that doubles the K loop (sm_90, 8192^2: nvfp4 x nvfp4 195 instructions per window,
bf16 x nvfp4 124). Decoding the activation once, with a kernel of its own, lets the mma kernel run
its bf16-activation plan. Element x block scale is exact in bf16 (E2M1 has 2 significant bits,
E4M3 4, E8M0 is a power of two), so the decoded rows are the values the mma kernel's own decode
feeds its tensor cores; the nvfp4 global scale stays with the mma kernel's epilogue.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from blockscaled.qtensor import QTensor

from .configs import KERNEL_SETTINGS
from .decode import ELEMENT_CODES, e4m3_to_float32, operand_codes
from .dequant_mm import apply_scale, load_e2m1
from .tiles import load_data

# K per program: 512 elements of 4 rows (a few KB of bf16 each; the kernel is a memory round trip)
DEQUANTIZE_K = 512
DEQUANTIZE_ROWS = 4


@helion.kernel(**KERNEL_SETTINGS)
def dequantize_kernel(
    data: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    K: hl.constexpr,
    ELEM: hl.constexpr,
    SCALE: hl.constexpr,
    BLOCK: hl.constexpr,
    LAYOUT: hl.constexpr,
) -> torch.Tensor:
    """out [rows, K / BLOCK, BLOCK] (bf16) = the operand's elements times their block scales, in K order."""
    rows = out.size(0)
    for g, tile_r in hl.tile([K // BLOCK, rows]):  # K tiles fastest: programs that run together stream rows
        values = apply_scale(load_elements(data, tile_r, g, BLOCK, K, ELEM), scale, tile_r, rows, g, BLOCK, K, SCALE,
                             BLOCK, LAYOUT, BLOCK)
        out[tile_r, g, :] = values.reshape(tile_r.block_size, g.block_size, BLOCK).to(torch.bfloat16)
    return out


def load_elements(data, rows_tile, g, BLOCK, K, ELEM):
    """Rows `rows_tile`, K blocks `g` of fp4 or fp8 data as float32 [rows, g * BLOCK] in K order, decoded from their
    bits (`decode`): exact for every code, NaN included, where a cast of fp8 data is not (the Triton interpreter's
    gave 480 for E4M3 NaN codes and other values for subnormals)."""
    if ELEM == ELEMENT_CODES["e2m1"]:
        return load_e2m1(data, rows_tile, g, BLOCK, K)
    return e4m3_to_float32(load_data(data, rows_tile, g, BLOCK, K, 1).view(torch.uint8).to(torch.int32))


def dequantize_args(a: QTensor, out: torch.Tensor) -> tuple:
    """`dequantize_kernel`'s arguments for QTensor `a` (k_order data) into `out`, bf16 [rows, K / block, block]."""
    return (a.data, a.kernel_scale, out, a.K, *operand_codes(a.fmt, a.layout))


def dequantize_config(a: QTensor) -> helion.Config:
    """The kernel's one config: DEQUANTIZE_ROWS rows x DEQUANTIZE_K elements per program."""
    return helion.Config(block_sizes=[DEQUANTIZE_K // a.fmt.block_size, DEQUANTIZE_ROWS], num_warps=4, num_stages=1)
