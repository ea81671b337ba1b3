"""M = 1 (decode) on CUDA cores: every weight byte read once, no tensor cores, no M padding.

At M = 1 a tensor-core dot wastes 15 of its 16 rows, and feeding it costs a layout
conversion of every decoded weight tile through shared memory (block_dot's K loop at M = 1:
36 barriers, 90 shared stores per iteration). This kernel multiplies decoded weights by the
activation row in registers instead:

- Every operand is read as int32 words (8 fp4, 4 fp8 or 2 bf16 elements each): a word
  stays one register from load to decode, also across the K loop.
- fp4 words decode through E4M3 (`decode.E2M1X8_TO_F32_PTX`: 9 integer ops per 8 codes,
  then hardware e4m3x2 -> f16x2 -> f32), exact values times 2^-6 that the kernel undoes
  once per output. The activation is loaded per word position, so nothing is interleaved.
- Products are summed per word in FFMA chains, per scale block, then multiplied once by
  the block's scale(s). fp4 x fp4 multiplies in f16x2 instead (`E2M1X8_DOT_PTX`: exact,
  4 f16x2 FMAs per word).
- The next step's weights and scale codes load before this step's arithmetic; `PREFETCH`
  keeps them there (a CTA barrier; ptxas sinks them to the loop's end otherwise).
- SPLIT programs share one output tile along K (`split_k`), so all SMs stream weights.

sm_90 K loop (`python -m bench.sass --backend gemv`, default plans), instructions per
weight: bf16 x mxfp4 5.0, mxfp4 x mxfp4 4.3 (5.4 and 6.5 with the bf16x2 decode and
split 16 of 044822e; split 8 costs ~50 more per iteration than 16); H100, M = 1,
the four Llama-3-70B shapes: 2.1x-2.7x of cuBLAS bf16 for fp4 weights
(bench/results/h100.csv at 2a26452, h100_gemv_decode_probe_2026-11-22.log for ab58937).
On CPU (the Triton interpreter) and AMD the decode uses integer ops (PTX == 0).
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .decode import (
    E2M1X8_DOT_PTX,
    E2M1X8_TO_F16X2_PTX,
    E2M1X8_TO_F32_PTX,
    ELEMENT_CODES,
    SCALE_CODES,
    bf16x2_to_float32,
    decode_scale,
    e2m1x8_to_float32,
    e4m3_to_float32,
)
from .split_k import add_part, store_sum
from .tiles import load_scale_range

E2M1 = ELEMENT_CODES["e2m1"]
BF16 = ELEMENT_CODES["bf16"]
E4M3 = ELEMENT_CODES["e4m3"]


# K offsets, within one int32 word, of the values `word_values` returns, in order.
E2M1_WORD_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the PTX: low nibbles of bytes 0-3, then high nibbles
E2M1_SCALE = 2.0**-6  # `word_values` gives E2M1 codes times this (exact); the kernel undoes it once


def word_values(words, ELEM, PTX):
    """int32 words -> float32 values: 8 per word for E2M1 (in `E2M1_WORD_ORDER`, times
    E2M1_SCALE), 4 for E4M3, 2 for bf16 (in K order); all exact."""
    if ELEM == E2M1:
        if PTX:
            return hl.inline_asm_elementwise(
                E2M1X8_TO_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [words], dtype=(torch.float32,) * 8, is_pure=True, pack=1
            )
        parts = e2m1x8_to_float32(words)
        return [parts[k] * E2M1_SCALE for k in E2M1_WORD_ORDER]
    if ELEM == BF16:
        return bf16x2_to_float32(words)
    return [e4m3_values(((words >> (8 * i)) & 0xFF).to(torch.uint8), PTX) for i in range(4)]


def e4m3_values(codes, PTX):
    """uint8 E4M3 codes (fp8 elements or nvfp4 scales) -> float32, exact: in hardware on the
    GPU (2 instructions against ~12 integer ops and selects)."""
    if PTX:
        return codes.view(torch.float8_e4m3fn).to(torch.float32)
    return e4m3_to_float32(codes.to(torch.int32))


def value_scale(ELEM):
    """What `word_values` multiplied this operand's values by. Undone on the total, so
    partial sums sit 2^6 (2^12 for fp4 x fp4) lower: results below ~2^-114 of fp32 would
    lose bits to subnormals first."""
    return E2M1_SCALE if ELEM == E2M1 else 1.0


def word_order(ELEM):
    """K offsets of `word_values` within one word."""
    return E2M1_WORD_ORDER if ELEM == E2M1 else tuple(range(4 if ELEM == E4M3 else 2))


def load_words(data, rows_tile, first_word, count, stride, offset):
    """int32 words first_word + c * stride + offset of each row, c = 0 .. count - 1."""
    return hl.load(data, [rows_tile, (first_word + hl.arange(count)) * stride + offset])


def k_values(data, rows_tile, first, count, GROUP, ORDER, ELEM, PTX):
    """Values of one operand at K = GROUP * (first + c) + ORDER[j], c = 0 .. count - 1: a
    list over j of float32 [rows, count]."""
    per_word = len(word_order(ELEM))
    values = [None] * GROUP
    for w in range(GROUP // per_word):
        decoded = word_values(load_words(data, rows_tile, first, count, GROUP // per_word, w), ELEM, PTX)
        for k, v in zip(word_order(ELEM), decoded):
            values[w * per_word + k] = v
    return [values[k] for k in ORDER]


def block_sums(prod, rows_tile, BLOCKS):
    """[rows, BLOCKS * c] -> [rows, BLOCKS]: the sum of each block's c columns."""
    return prod.reshape(rows_tile.block_size, BLOCKS, prod.size(1) // BLOCKS).sum(2)


def block_products(a_data, b_words, tile_m, tile_n, first_word, BLOCK, BLOCKS, A_ELEM, B_ELEM, PTX):
    """Weight x activation products of BLOCKS scale blocks (`b_words`: their weight words,
    [rows, words]), summed per block: float32 [rows, BLOCKS]. The products of one word
    chain into FFMAs (one FMUL, then one FFMA per value), then the words of a block add."""
    if PTX and A_ELEM == E2M1 and B_ELEM == E2M1:  # both fp4: exact f16x2 products per word
        a_pairs = hl.inline_asm_elementwise(
            E2M1X8_TO_F16X2_PTX, "=r,=r,=r,=r,r", [load_words(a_data, tile_m, first_word, b_words.size(1), 1, 0)],
            dtype=(torch.int32,) * 4, is_pure=True, pack=1,
        )
        prod = hl.inline_asm_elementwise(
            E2M1X8_DOT_PTX, "=r,r,r,r,r,r", [b_words, *a_pairs], dtype=torch.float32, is_pure=True, pack=1
        )
        return block_sums(prod, tile_n, BLOCKS)
    order = word_order(B_ELEM)
    w = word_values(b_words, B_ELEM, PTX)
    a = k_values(a_data, tile_m, first_word, b_words.size(1), len(order), order, A_ELEM, PTX)
    prod = w[0] * a[0]
    for j in range(1, len(order)):
        prod = prod + w[j] * a[j]
    return block_sums(prod, tile_n, BLOCKS)


def scale_values(codes, SCALE, PTX):
    """Raw scale codes -> float32."""
    if SCALE == SCALE_CODES["e4m3"]:
        return e4m3_values(codes, PTX)
    return decode_scale(codes.to(torch.int32), SCALE)


def block_factors(a_scale, b_codes, tile_m, m, first, K, BLOCK, BLOCKS, A_SCALE, A_LAYOUT, B_SCALE, PTX):
    """sa * sb of blocks first .. first + BLOCKS - 1 (`b_codes`: the weights' raw scale
    codes): float32 [rows, BLOCKS] (sb for a bf16 A)."""
    sb = scale_values(b_codes, B_SCALE, PTX)
    if A_SCALE == 0:
        return sb
    a_codes = load_scale_range(a_scale, tile_m, m, first, BLOCKS, K, BLOCK, A_LAYOUT)
    return sb * scale_values(a_codes, A_SCALE, PTX)


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
    PREFETCH: hl.constexpr,
) -> torch.Tensor:
    """C into `out`, one row of A per program row. SPLIT > 1: SPLIT programs share each
    output tile (`split_k`: float32 `workspace` like `out`, int32 `tickets`
    [M, N tiles], both zero)."""
    m = out.size(0)
    n = out.size(1)
    steps = K // (BLOCK * BLOCKS) // SPLIT  # loop steps per program, BLOCKS scale blocks each
    words = BLOCKS * BLOCK // len(word_order(B_ELEM))  # weight words per row and step
    for tile_m, tile_n, part in hl.tile([m, n, SPLIT], block_size=[1, None, 1]):
        acc = hl.zeros([tile_n, BLOCKS], dtype=torch.float32)
        # The weights and scale codes of step i + 1 load before step i's arithmetic, so each
        # program streams while it computes; the last step reloads itself (an L1 hit)
        # rather than branching. ptxas keeps them there only with PREFETCH (a CTA barrier
        # after them), which costs 16-30 registers per thread (python -m bench.sass).
        start = part.begin * steps
        b_words = load_words(b_data, tile_n, start * words, words, 1, 0)
        b_codes = load_scale_range(b_scale, tile_n, n, start * BLOCKS, BLOCKS, K, BLOCK, B_LAYOUT)
        for step in hl.tile(steps, block_size=1):
            after = part.begin * steps + step.begin + 1 - (step.begin + 1) // steps
            words_next = load_words(b_data, tile_n, after * words, words, 1, 0)
            codes_next = load_scale_range(b_scale, tile_n, n, after * BLOCKS, BLOCKS, K, BLOCK, B_LAYOUT)
            if PREFETCH:  # without the barrier ptxas sinks these loads to the loop's end
                hl.inline_triton("tl.debug_barrier()", args=(), output_like=None)
            now = part.begin * steps + step.begin
            sums = block_products(a_data, b_words, tile_m, tile_n, now * words, BLOCK, BLOCKS, A_ELEM, B_ELEM, PTX)
            acc = acc + sums * block_factors(
                a_scale, b_codes, tile_m, m, now * BLOCKS, K, BLOCK, BLOCKS, A_SCALE, A_LAYOUT, B_SCALE, PTX
            )
            b_words = words_next
            b_codes = codes_next
        total = acc.sum(1) * (a_global[0] * b_global[0]) / (value_scale(A_ELEM) * value_scale(B_ELEM))
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
