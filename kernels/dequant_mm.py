"""Dequantize-in-registers GEMM for sm_80 / sm_90 (the path we can run).

One kernel for every pair: each operand is decoded tile by tile to float32 with integer
ops (`decode.py`), multiplied by its block scale (exact: element x scale fits in bf16),
cast to the compute dtype (bf16 on the GPU; float32 under the CPU interpreter, which
computes bf16 dots wrongly) and fed to `hl.dot` with fp32 accumulation. The K loop runs
over groups of U logical elements (U = the largest block of the two operands), so every
operand's packed bytes and scales line up on tile boundaries.

When an operand is packed fp4 the K tile is split by parity: sum_k a_k b_k =
a_even . b_even + a_odd . b_odd, so the low and high nibbles feed two dots directly
instead of being interleaved back into K order.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from .decode import ELEMENT_CODES, decode_scale, e2m1_to_float32
from .tiles import load_data, load_data_half, load_scale_codes


def apply_scale(values, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, PER_ROW_K):
    """values [rows, g*PER_ROW_K] covering K groups `g` -> times their block scales."""
    if SCALE == 0:
        return values
    codes = load_scale_codes(scale, rows_tile, n_rows, g, U, K, BLOCK, LAYOUT)
    s = decode_scale(codes.to(torch.int32), SCALE)
    per_block = BLOCK * PER_ROW_K // U
    blocks = values.reshape(rows_tile.block_size, g.block_size * (U // BLOCK), per_block) * s.unsqueeze(2)
    return blocks.reshape(rows_tile.block_size, g.block_size * PER_ROW_K)


def load_operand(data, scale, rows_tile, n_rows, g, U, K, ELEM, SCALE, BLOCK, LAYOUT):
    """Rows `rows_tile`, K groups `g` of one operand, dequantized to float32 [rows, g*U] in K order."""
    if ELEM == ELEMENT_CODES["e2m1"]:
        raw = load_data(data, rows_tile, g, U, K, 2).to(torch.int32)
        pairs = torch.stack([e2m1_to_float32(raw & 15), e2m1_to_float32(raw >> 4)], dim=2)
        values = pairs.reshape(rows_tile.block_size, g.block_size * U)
    else:
        values = load_data(data, rows_tile, g, U, K, 1).to(torch.float32)
    return apply_scale(values, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, U)


def load_operand_halves(data, scale, rows_tile, n_rows, g, U, K, ELEM, SCALE, BLOCK, LAYOUT):
    """(even K, odd K) halves of one operand, each float32 [rows, g*U/2], dequantized.

    Packed fp4 gives them for free (low / high nibbles), so no interleave (tl.join and a
    layout shuffle) is needed; unpacked operands load their even and odd columns.
    """
    if ELEM == ELEMENT_CODES["e2m1"]:
        raw = load_data(data, rows_tile, g, U, K, 2).to(torch.int32)
        even, odd = e2m1_to_float32(raw & 15), e2m1_to_float32(raw >> 4)
    else:
        even = load_data_half(data, rows_tile, g, U, K, 0).to(torch.float32)
        odd = load_data_half(data, rows_tile, g, U, K, 1).to(torch.float32)
    even = apply_scale(even, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, U // 2)
    odd = apply_scale(odd, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, U // 2)
    return even, odd


@helion.kernel(static_shapes=True)
def dequant_mm_kernel(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    a_global: torch.Tensor,
    b_global: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    K: hl.constexpr,
    U: hl.constexpr,
    A_ELEM: hl.constexpr,
    A_SCALE: hl.constexpr,
    A_BLOCK: hl.constexpr,
    A_LAYOUT: hl.constexpr,
    B_ELEM: hl.constexpr,
    B_SCALE: hl.constexpr,
    B_BLOCK: hl.constexpr,
    B_LAYOUT: hl.constexpr,
    HAS_BIAS: hl.constexpr,
    BF16_DOT: hl.constexpr,
    SPLIT_K_PARITY: hl.constexpr,
) -> torch.Tensor:
    m = out.size(0)
    n = out.size(1)
    compute = torch.bfloat16 if BF16_DOT else torch.float32
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for g in hl.tile(K // U):
            if SPLIT_K_PARITY:
                a0, a1 = load_operand_halves(a_data, a_scale, tile_m, m, g, U, K, A_ELEM, A_SCALE, A_BLOCK, A_LAYOUT)
                b0, b1 = load_operand_halves(b_data, b_scale, tile_n, n, g, U, K, B_ELEM, B_SCALE, B_BLOCK, B_LAYOUT)
                acc = hl.dot(a0.to(compute), b0.to(compute).T, acc=acc)
                acc = hl.dot(a1.to(compute), b1.to(compute).T, acc=acc)
            else:
                a = load_operand(a_data, a_scale, tile_m, m, g, U, K, A_ELEM, A_SCALE, A_BLOCK, A_LAYOUT)
                b = load_operand(b_data, b_scale, tile_n, n, g, U, K, B_ELEM, B_SCALE, B_BLOCK, B_LAYOUT)
                acc = hl.dot(a.to(compute), b.to(compute).T, acc=acc)
        acc = acc * (a_global[0] * b_global[0])
        if HAS_BIAS:
            acc = acc + bias[tile_n].to(torch.float32).unsqueeze(0)
        out[tile_m, tile_n] = acc.to(out.dtype)
    return out
