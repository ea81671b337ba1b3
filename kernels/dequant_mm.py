"""Dequantize-in-registers GEMM for sm_80 / sm_90 (the path we can run).

One kernel for every pair: each operand is decoded tile by tile to float32 with integer
ops (`decode.py`), multiplied by its block scale (exact: element x scale fits in bf16),
cast to the compute dtype (bf16 on the GPU; float32 under the CPU interpreter, which
computes bf16 dots wrongly) and fed to `hl.dot` with fp32 accumulation. The K loop runs
over groups of U logical elements (U = the largest block of the two operands), so every
operand's packed bytes and scales line up on tile boundaries.

With packed fp4 weights the K tile can be split by K mod 8 (SPLIT_K8): sum_k a_k b_k =
sum_j a[j::8] . b[j::8], so each int32 word of 8 codes feeds 8 dots directly, decoded two
codes per integer op sequence, instead of being interleaved back into K order.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .decode import ELEMENT_CODES, decode_scale, e2m1_to_float32, e2m1x8_to_float32
from .tiles import load_data, load_data_strided, load_scale_codes


def block_scales(scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT):
    """Decoded float32 block scales of K groups `g`: [rows, g*U / BLOCK]."""
    codes = load_scale_codes(scale, rows_tile, n_rows, g, U, K, BLOCK, LAYOUT)
    return decode_scale(codes.to(torch.int32), SCALE)


def apply_scale(values, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, PER_ROW_K):
    """values [rows, g*PER_ROW_K] covering K groups `g` -> times their block scales."""
    if SCALE == 0:
        return values
    s = block_scales(scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT)
    per_block = BLOCK * PER_ROW_K // U
    blocks = values.reshape(rows_tile.block_size, g.block_size * (U // BLOCK), per_block) * s.unsqueeze(2)
    return blocks.reshape(rows_tile.block_size, g.block_size * PER_ROW_K)


def load_e2m1(data, rows_tile, g, U, K):
    """Rows `rows_tile`, K groups `g` of packed fp4 (even K in the low nibble) as float32 [rows, g*U] in K order."""
    raw = load_data(data, rows_tile, g, U, K, 2).to(torch.int32)
    pairs = torch.stack([e2m1_to_float32(raw & 15), e2m1_to_float32(raw >> 4)], dim=2)
    return pairs.reshape(rows_tile.block_size, g.block_size * U)


def load_operand(data, scale, rows_tile, n_rows, g, U, K, ELEM, SCALE, BLOCK, LAYOUT):
    """Rows `rows_tile`, K groups `g` of one operand, dequantized to float32 [rows, g*U] in K order."""
    if ELEM == ELEMENT_CODES["e2m1"]:
        values = load_e2m1(data, rows_tile, g, U, K)
    else:
        values = load_data(data, rows_tile, g, U, K, 1).to(torch.float32)
    return apply_scale(values, scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, U)


def scale_per_column(scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, COLS_PER_BLOCK):
    """Block scales of K groups `g` as float32 [rows, g*U/BLOCK*COLS_PER_BLOCK]: each scale
    repeated for the COLS_PER_BLOCK columns it covers."""
    s = block_scales(scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT)
    ones = hl.full([rows_tile, g.block_size * (U // BLOCK), COLS_PER_BLOCK], 1.0, dtype=torch.float32)
    return (ones * s.unsqueeze(2)).reshape(rows_tile.block_size, g.block_size * (U // BLOCK) * COLS_PER_BLOCK)


def load_operand_eighths(data, scale, rows_tile, n_rows, g, U, K, ELEM, SCALE, BLOCK, LAYOUT):
    """One operand as 8 float32 tensors [rows, g*U/8]; tensor j holds the K indices = j mod 8.

    Packed fp4 is read as int32 words of 8 codes and decoded two at a time
    (`e2m1x8_to_float32`), with no interleave back into K order; unpacked operands load
    their 8 strided column sets. Each part is multiplied by its block scales.
    """
    if ELEM == ELEMENT_CODES["e2m1"]:
        words = load_data(data, rows_tile, g, U, K, 8)
        parts = e2m1x8_to_float32(words)
    else:
        parts = [load_data_strided(data, rows_tile, g, U, K, 8, j).to(torch.float32) for j in range(8)]
    if SCALE == 0:
        return parts
    s = scale_per_column(scale, rows_tile, n_rows, g, U, K, SCALE, BLOCK, LAYOUT, BLOCK // 8)
    return [p * s for p in parts]


def dot_eighths(acc, a_parts, b_parts, compute):
    """acc + sum over j of a_j @ b_j^T: the K-order dot product regrouped by K mod 8."""
    for a_j, b_j in zip(a_parts, b_parts, strict=True):
        acc = hl.dot(a_j.to(compute), b_j.to(compute).T, acc=acc)
    return acc


@helion.kernel(**KERNEL_SETTINGS)
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
    SPLIT_K8: hl.constexpr,
) -> torch.Tensor:
    m = out.size(0)
    n = out.size(1)
    compute = torch.bfloat16 if BF16_DOT else torch.float32
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for g in hl.tile(K // U):
            if SPLIT_K8:
                a_parts = load_operand_eighths(a_data, a_scale, tile_m, m, g, U, K, A_ELEM, A_SCALE, A_BLOCK, A_LAYOUT)
                b_parts = load_operand_eighths(b_data, b_scale, tile_n, n, g, U, K, B_ELEM, B_SCALE, B_BLOCK, B_LAYOUT)
                acc = dot_eighths(acc, a_parts, b_parts, compute)
            else:
                a = load_operand(a_data, a_scale, tile_m, m, g, U, K, A_ELEM, A_SCALE, A_BLOCK, A_LAYOUT)
                b = load_operand(b_data, b_scale, tile_n, n, g, U, K, B_ELEM, B_SCALE, B_BLOCK, B_LAYOUT)
                acc = hl.dot(a.to(compute), b.to(compute).T, acc=acc)
        acc = acc * (a_global[0] * b_global[0])
        if HAS_BIAS:
            acc = acc + bias[tile_n].to(torch.float32).unsqueeze(0)
        out[tile_m, tile_n] = acc.to(out.dtype)
    return out
