"""Small-M (decode) GEMM: one tensor-core dot per pair of scale blocks, scales on the results.

At M <= 64 the time goes to weight bytes and to the CUDA-core work per weight element,
not to the dot. This kernel keeps that work small:

- K runs in pairs of scale blocks. fp4 weights in the "block_pairs" data layout hold a
  pair in one row of BLOCK bytes (low nibbles: first block, high: second), so one PTX
  sequence per 4 bytes decodes 8 codes into two K-contiguous blocks, with no interleave.
- fp4 -> E4M3 (code * 2^-6, 9 integer ops per 8 codes) feeds fp8 dots when both operands
  are MX and A is fp8 or fp4; otherwise fp4 -> bf16 (exact, ~2.5 ops per code) feeds bf16
  dots. fp8 weights feed fp8 dots unchanged.
- Block scales multiply each [BM, BN] dot result (BM / BLOCK multiplies per weight
  element at most) instead of every decoded element.
- SPLIT programs share one output tile along K (`split_k`), so all SMs stream
  weights.
- FOLD (bf16 dots only): the scales multiply the decoded blocks instead (one bf16 multiply
  per element), and the dots chain on the accumulator. H100, N = K = 8192, M = 1: nvfp4 x
  nvfp4 0.73x -> 0.98x of cuBLAS bf16, bf16 x nvfp4 0.87x -> 1.00x, bf16 x mxfp4 1.44x ->
  1.55x; fp8 dots (mxfp8 x mxfp4) lose, 1.51x -> 1.35x
  (bench/results/h100_block_dot_fold_probe_2026-11-22.log).

On CPU (the Triton interpreter) and AMD the same loop decodes with integer ops to float32
(DOT == 0): the PTX is NVIDIA-only and the interpreter cannot run inline assembly.
H100 measurements that chose this design: bench/results/h100_block_dot_probe.log.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .decode import E2M1X2_TO_BF16_PTX, E2M1X2_TO_E4M3_PTX, ELEMENT_CODES, decode_scale, e2m1_to_float32
from .split_k import add_part, store_sum
from .tiles import load_scale_range

# DOT constexpr: the dtype both operands reach the dot in
DOT_CODES = {"float32": 0, "bfloat16": 1, "float8_e4m3fn": 2}


def decode_e2m1_bytes(raw, DOT):
    """uint8 [rows, c] of E2M1 pairs -> (low nibbles, high nibbles) in the dot dtype
    (E4M3 ones are code * 2^-6; the caller undoes it once on the accumulator)."""
    if DOT == 2:
        return hl.inline_asm_elementwise(
            E2M1X2_TO_E4M3_PTX, "=r,=r,r", [raw], dtype=(torch.float8_e4m3fn, torch.float8_e4m3fn), is_pure=True, pack=4
        )
    if DOT == 1:
        return hl.inline_asm_elementwise(
            E2M1X2_TO_BF16_PTX, "=r,=r,=r,=r,r", [raw], dtype=(torch.bfloat16, torch.bfloat16), is_pure=True, pack=4
        )
    codes = raw.to(torch.int32)
    return e2m1_to_float32(codes & 15), e2m1_to_float32(codes >> 4)


def rows_below(rows_tile, ROWS, PADDED):
    """Mask of the tile's rows that exist (< ROWS) where the loop runs past them, else None."""
    return rows_tile.index.unsqueeze(1) < ROWS if PADDED else None


def load_block(data, rows_tile, block, BLOCK, ELEM, DOT, rows_mask):
    """Scale block `block` of a k_order operand, in K order: [rows, BLOCK] in the dot dtype."""
    if ELEM == ELEMENT_CODES["e2m1"]:
        col = block * (BLOCK // 2) + hl.arange(BLOCK // 2)
        lo, hi = decode_e2m1_bytes(hl.load(data, [rows_tile, col], extra_mask=rows_mask), DOT)
        return torch.stack([lo, hi], dim=2).reshape(rows_tile.block_size, BLOCK)
    col = block * BLOCK + hl.arange(BLOCK)
    values = hl.load(data, [rows_tile, col], extra_mask=rows_mask)
    if DOT == 2:
        return values
    return values.to(torch.bfloat16 if DOT == 1 else torch.float32)


def load_block_pair(data, rows_tile, pair, BLOCK, ELEM, PAIRED, DOT, rows_mask=None):
    """Blocks 2*pair and 2*pair + 1 of one operand: two [rows, BLOCK] in the dot dtype
    (rows outside `rows_mask` read as zero)."""
    if PAIRED:
        return decode_e2m1_bytes(hl.load(data, [rows_tile, pair * BLOCK + hl.arange(BLOCK)], extra_mask=rows_mask), DOT)
    return (
        load_block(data, rows_tile, 2 * pair, BLOCK, ELEM, DOT, rows_mask),
        load_block(data, rows_tile, 2 * pair + 1, BLOCK, ELEM, DOT, rows_mask),
    )


def pair_scales(scale, rows_tile, n_rows, pair, K, BLOCK, SCALE, LAYOUT):
    """float32 scales of blocks 2*pair and 2*pair + 1: two [rows]."""
    codes = load_scale_range(scale, rows_tile, n_rows, 2 * pair, 2, K, BLOCK, LAYOUT)
    return hl.split(decode_scale(codes.to(torch.int32), SCALE))


def fold_pair_scales(x0, x1, scale, rows_tile, n_rows, pair, K, BLOCK, SCALE, LAYOUT):
    """Blocks 2*pair and 2*pair + 1 of one operand times their scales, in the dot dtype.
    Exact in bf16 while the product stays in bf16's normal range (2^-126 .. 2^128): E2M1 x
    E4M3 scale has at most 6 significant bits, E4M3 x E8M0 at most 4, and bf16 keeps 8.
    Only MX blocks with scales near 2^+-127 leave that range."""
    if SCALE == 0:
        return x0, x1
    s0, s1 = pair_scales(scale, rows_tile, n_rows, pair, K, BLOCK, SCALE, LAYOUT)
    return x0 * s0.to(x0.dtype).unsqueeze(1), x1 * s1.to(x1.dtype).unsqueeze(1)


def pair_factors(a_scale, b_scale, tile_m, tile_n, m, n, pair, K, BLOCK, A_SCALE, A_LAYOUT, B_SCALE, B_LAYOUT):
    """What the two dot results of a block pair are multiplied by: sa * sb ([BM, BN]),
    or sb ([1, BN]) for a bf16 A."""
    b0, b1 = pair_scales(b_scale, tile_n, n, pair, K, BLOCK, B_SCALE, B_LAYOUT)
    if A_SCALE == 0:
        return b0.unsqueeze(0), b1.unsqueeze(0)
    a0, a1 = pair_scales(a_scale, tile_m, m, pair, K, BLOCK, A_SCALE, A_LAYOUT)
    return a0.unsqueeze(1) * b0.unsqueeze(0), a1.unsqueeze(1) * b1.unsqueeze(0)


@helion.kernel(**KERNEL_SETTINGS)
def block_dot_mm_kernel(
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
    B_PAIRED: hl.constexpr,
    HAS_BIAS: hl.constexpr,
    DOT: hl.constexpr,
    GAIN_LOG2: hl.constexpr,
    SPANS: hl.constexpr,
    SPLIT: hl.constexpr,
    FOLD: hl.constexpr,
    M: hl.constexpr,
    M_PAD: hl.constexpr,
) -> torch.Tensor:
    """C[:M] into `out`. The loop runs over M_PAD >= M rows, so that a small M fills whole
    M tiles instead of Triton padding every dot (rows from M on read as zero; stores skip
    them). SPLIT > 1: SPLIT programs share each output tile (`split_k`: float32
    `workspace` [M_PAD, N], int32 `tickets` [M tiles, N tiles], both zero)."""
    rows = M_PAD
    n = out.size(1)
    groups = K // (2 * BLOCK * SPANS) // SPLIT  # loop steps per program, SPANS block pairs each
    for tile_m, tile_n, part in hl.tile([rows, n, SPLIT], block_size=[None, None, 1]):
        real_rows = rows_below(tile_m, M, rows > M)  # A loads and C stores skip rows from M on
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for step in hl.tile(groups, block_size=1):
            for j in hl.static_range(SPANS):
                pair = (part.begin * groups + step.begin) * SPANS + j
                a0, a1 = load_block_pair(a_data, tile_m, pair, BLOCK, A_ELEM, 0, DOT, real_rows)
                b0, b1 = load_block_pair(b_data, tile_n, pair, BLOCK, B_ELEM, B_PAIRED, DOT)
                if FOLD:
                    a0, a1 = fold_pair_scales(a0, a1, a_scale, tile_m, M, pair, K, BLOCK, A_SCALE, A_LAYOUT)
                    b0, b1 = fold_pair_scales(b0, b1, b_scale, tile_n, n, pair, K, BLOCK, B_SCALE, B_LAYOUT)
                    acc = hl.dot(a1, b1.T, acc=hl.dot(a0, b0.T, acc=acc))
                else:
                    s0, s1 = pair_factors(a_scale, b_scale, tile_m, tile_n, M, n, pair, K, BLOCK, A_SCALE, A_LAYOUT, B_SCALE, B_LAYOUT)
                    acc = acc + hl.dot(a0, b0.T) * s0 + hl.dot(a1, b1.T) * s1
        acc = acc * (a_global[0] * b_global[0] * (2.0**GAIN_LOG2))
        if HAS_BIAS:
            if part.begin == 0:
                acc = acc + bias[tile_n].to(torch.float32).unsqueeze(0)
        if SPLIT == 1:
            hl.store(out, [tile_m, tile_n], acc.to(out.dtype), extra_mask=real_rows)
        else:
            ticket = add_part(workspace, tickets, tile_m, tile_n, acc)
            if ticket == SPLIT - 1:
                store_sum(out, workspace, tickets, tile_m, tile_n, real_rows)
    return out
