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
from .decode import ELEMENT_CODES, arranged_b_index, e4m3_to_float32, operand_codes
from .dequant_mm import apply_scale, load_e2m1
from .tiles import load_data

# K per program: 512 elements of 4 rows (a few KB of bf16 each; the kernel is a memory round trip)
DEQUANTIZE_K = 512
DEQUANTIZE_ROWS = 4
BF16_BLOCK = 32  # K per block of a bf16 activation (no scales; any divisor of DEQUANTIZE_K)


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
    ARRANGE: hl.constexpr,
) -> torch.Tensor:
    """The operand's elements times their block scales (bf16 activations: the elements), as bf16: into out
    [rows, K / BLOCK, BLOCK] in K order, or with ARRANGE into the flat arranged B of `mma_m64_kernel`'s bulk copies
    (`decode.arranged_b_index`; rows past the operand's, up to its last 64-row image, are left as they are)."""
    rows = data.size(0)
    for tile_r, g in hl.tile([rows, K // BLOCK]):
        values = apply_scale(load_elements(data, tile_r, g, BLOCK, K, ELEM), scale, tile_r, rows, g, BLOCK, K, SCALE,
                             BLOCK, LAYOUT, BLOCK).to(torch.bfloat16)
        if ARRANGE:
            r, k = tile_r.index.unsqueeze(1), (g.begin * BLOCK + hl.arange(g.block_size * BLOCK)).unsqueeze(0)
            hl.store(out, [arranged_b_index(r, k, K // 64)], values, extra_mask=(r < rows) & (k < K))
        else:
            out[tile_r, g, :] = values.reshape(tile_r.block_size, g.block_size, BLOCK)
    return out


def load_elements(data, rows_tile, g, BLOCK, K, ELEM):
    """Rows `rows_tile`, K blocks `g` of bf16, fp4 or fp8 data as float32 [rows, g * BLOCK] in K order, fp4 and fp8
    decoded from their bits (`decode`): exact for every code, NaN included, where a cast of fp8 data is not (the Triton
    interpreter's gave 480 for E4M3 NaN codes and other values for subnormals)."""
    if ELEM == ELEMENT_CODES["e2m1"]:
        return load_e2m1(data, rows_tile, g, BLOCK, K)
    if ELEM == ELEMENT_CODES["bf16"]:
        return load_data(data, rows_tile, g, BLOCK, K, 1).to(torch.float32)
    return e4m3_to_float32(load_data(data, rows_tile, g, BLOCK, K, 1).view(torch.uint8).to(torch.int32))


def dequantize_tensors(a: QTensor | torch.Tensor, out: torch.Tensor) -> tuple:
    """`dequantize_kernel`'s tensor arguments (data, scale codes, out) for activation `a`: a QTensor of k_order data,
    or bf16 [rows, K] (no scales: `out` in their place)."""
    return (a.data, a.kernel_scale, out) if isinstance(a, QTensor) else (a, out, out)


def dequantize_args(a: QTensor | torch.Tensor, out: torch.Tensor, arrange: bool = False) -> tuple:
    """`dequantize_kernel`'s arguments for activation `a` (`dequantize_tensors`) into `out`: bf16
    [rows, K / block, block], or with `arrange` the flat arranged B (`decode.arranged_b_elements`)."""
    if isinstance(a, QTensor):
        codes = operand_codes(a.fmt, a.layout)
    else:
        elem, no_scale, _, layout = operand_codes(None)
        codes = elem, no_scale, BF16_BLOCK, layout
    return (*dequantize_tensors(a, out), a.shape[1], *codes, int(arrange))


def dequantize_config(a: QTensor | torch.Tensor) -> helion.Config:
    """The kernel's one config: DEQUANTIZE_ROWS rows x DEQUANTIZE_K elements per program."""
    block = a.fmt.block_size if isinstance(a, QTensor) else BF16_BLOCK
    return helion.Config(block_sizes=[DEQUANTIZE_ROWS, DEQUANTIZE_K // block], num_warps=4, num_stages=1)
