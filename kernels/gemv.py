"""M = 1 (decode) on CUDA cores: every weight byte read once, no tensor cores, no M padding.

At M = 1 a tensor-core dot wastes 15 of its 16 rows, and feeding it costs a layout
conversion of every decoded weight tile through shared memory (block_dot's K loop at M = 1:
36 barriers, 90 shared stores per iteration). This kernel multiplies decoded weights by the
activation row in fp32 registers instead:

- fp4 weights in k_order: one PTX sequence per 4 bytes decodes 8 codes to fp32 (exact:
  bf16 pair trick, one bf16x2 multiply per 2 codes, then the bf16 halves as fp32), low
  nibbles (even K) and high nibbles (odd K) apart. The activation row is split the same
  way (bf16 read as int32 words of two elements), so nothing is interleaved.
- Products are summed per scale block in FFMA chains, then each block sum is multiplied
  once by its scale(s).
- SPLIT programs share one output tile along K (`split_k`), so all SMs stream weights.

sm_90 K loop (`python -m bench.sass --backend gemv`): 5.4 instructions per weight for bf16
x mxfp4 against 7.2 for block_dot; H100, M = 1, Llama-3-70B shapes: 1.82x-2.40x of cuBLAS
bf16 for fp4 weights (bench/results/h100.csv, commit 044822e). On CPU (the Triton
interpreter) and AMD the decode uses integer ops to float32 (PTX == 0).
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .decode import E2M1X2_TO_F32_PTX, ELEMENT_CODES, SCALE_CODES, bf16x2_to_float32, decode_scale, e2m1_to_float32
from .split_k import add_part, store_sum
from .tiles import load_scale_range

E2M1 = ELEMENT_CODES["e2m1"]
BF16 = ELEMENT_CODES["bf16"]


def decode_e2m1_float32(raw, PTX):
    """uint8 [rows, c] of E2M1 pairs -> float32 (low nibbles, high nibbles), exact."""
    if PTX:
        return hl.inline_asm_elementwise(
            E2M1X2_TO_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [raw], dtype=(torch.float32, torch.float32), is_pure=True, pack=4
        )
    codes = raw.to(torch.int32)
    return e2m1_to_float32(codes & 15), e2m1_to_float32(codes >> 4)


def k_pairs(data, rows_tile, first, cols, BLOCK, ELEM, PTX):
    """Elements 2c and 2c + 1 of K, for the c = 0 .. cols-1 from block `first` on, of one
    operand: two float32 [rows, cols]. A bf16 operand comes as int32 words of two
    elements (one integer op each then, where a bf16 -> fp32 cast takes two)."""
    col = first * (BLOCK // 2) + hl.arange(cols)
    if ELEM == E2M1:
        return decode_e2m1_float32(hl.load(data, [rows_tile, col]), PTX)
    if ELEM == BF16:
        return bf16x2_to_float32(hl.load(data, [rows_tile, col]))
    values = hl.load(data, [rows_tile, first * BLOCK + hl.arange(2 * cols)]).to(torch.float32)
    return hl.split(values.reshape(rows_tile.block_size, cols, 2))


def block_sums(prod, rows_tile, BLOCKS):
    """[rows, BLOCKS * c] -> [rows, BLOCKS]: the sum of each block's c columns."""
    return prod.reshape(rows_tile.block_size, BLOCKS, prod.size(1) // BLOCKS).sum(2)


def block_products(a_data, b_data, tile_m, tile_n, first, BLOCK, BLOCKS, A_ELEM, B_ELEM, PTX):
    """Weight x activation products of blocks first .. first + BLOCKS - 1, summed per
    block: float32 [rows, BLOCKS]. Even and odd K are summed apart: each sum then compiles
    to a chain of FFMAs (one sum of w0 a0 + w1 a1 costs an FMUL, FFMA and FADD per pair)."""
    cols = BLOCKS * BLOCK // 2
    w0, w1 = k_pairs(b_data, tile_n, first, cols, BLOCK, B_ELEM, PTX)
    a0, a1 = k_pairs(a_data, tile_m, first, cols, BLOCK, A_ELEM, PTX)
    return block_sums(w0 * a0, tile_n, BLOCKS) + block_sums(w1 * a1, tile_n, BLOCKS)


def block_scales(scale, rows_tile, n_rows, first, K, BLOCK, BLOCKS, SCALE, LAYOUT, PTX):
    """float32 scales of blocks first .. first + BLOCKS - 1: [rows, BLOCKS]. On the GPU an
    E4M3 scale converts in hardware (2 instructions against ~12 integer ops and selects)."""
    codes = load_scale_range(scale, rows_tile, n_rows, first, BLOCKS, K, BLOCK, LAYOUT)
    if PTX and SCALE == SCALE_CODES["e4m3"]:
        return codes.view(torch.float8_e4m3fn).to(torch.float32)
    return decode_scale(codes.to(torch.int32), SCALE)


def block_factors(a_scale, b_scale, tile_m, tile_n, m, n, first, K, BLOCK, BLOCKS, A_SCALE, A_LAYOUT, B_SCALE, B_LAYOUT, PTX):
    """sa * sb of blocks first .. first + BLOCKS - 1: float32 [rows, BLOCKS] (sb for a bf16 A)."""
    sb = block_scales(b_scale, tile_n, n, first, K, BLOCK, BLOCKS, B_SCALE, B_LAYOUT, PTX)
    if A_SCALE == 0:
        return sb
    return sb * block_scales(a_scale, tile_m, m, first, K, BLOCK, BLOCKS, A_SCALE, A_LAYOUT, PTX)


@helion.kernel(**KERNEL_SETTINGS)
def gemv_kernel(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    a_global: torch.Tensor,
    b_global: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    tickets: torch.Tensor,
    K: hl.constexpr,
    BLOCK: hl.constexpr,
    A_ELEM: hl.constexpr,
    A_SCALE: hl.constexpr,
    A_LAYOUT: hl.constexpr,
    B_ELEM: hl.constexpr,
    B_SCALE: hl.constexpr,
    B_LAYOUT: hl.constexpr,
    HAS_BIAS: hl.constexpr,
    PTX: hl.constexpr,
    BLOCKS: hl.constexpr,
    SPLIT: hl.constexpr,
) -> torch.Tensor:
    """C into `out`, one row of A per program row. SPLIT > 1: SPLIT programs share each
    output tile (`split_k`: float32 `workspace` like `out`, int32 `tickets`
    [M, N tiles], both zero)."""
    m = out.size(0)
    n = out.size(1)
    steps = K // (BLOCK * BLOCKS) // SPLIT  # loop steps per program, BLOCKS scale blocks each
    for tile_m, tile_n, part in hl.tile([m, n, SPLIT], block_size=[1, None, 1]):
        acc = hl.zeros([tile_n, BLOCKS], dtype=torch.float32)
        for step in hl.tile(steps, block_size=1):
            first = (part.begin * steps + step.begin) * BLOCKS
            sums = block_products(a_data, b_data, tile_m, tile_n, first, BLOCK, BLOCKS, A_ELEM, B_ELEM, PTX)
            acc = acc + sums * block_factors(
                a_scale, b_scale, tile_m, tile_n, m, n, first, K, BLOCK, BLOCKS, A_SCALE, A_LAYOUT, B_SCALE, B_LAYOUT, PTX
            )
        total = acc.sum(1) * (a_global[0] * b_global[0])
        if HAS_BIAS:
            if part.begin == 0:
                total = total + bias[tile_n].to(torch.float32)
        if SPLIT == 1:
            out[tile_m, tile_n] = total.unsqueeze(0).to(out.dtype)
        else:
            ticket = add_part(workspace, tickets, tile_m, tile_n, total.unsqueeze(0))
            if ticket == SPLIT - 1:
                store_sum(out, workspace, tickets, tile_m, tile_n)
    return out
