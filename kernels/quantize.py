"""Quantization on the GPU: nvfp4, mxfp4 and mxfp8 in two Helion kernels, bit-exact with `reference.quantize`:
`quantize_kernel` (a block over 2-4 lanes; nvfp4's own-amax and grid-barrier variants, mxfp8) and
`quantize_blocks_kernel` (a block in one thread; nvfp4 and mxfp4 elsewhere, `QUANTIZE_BLOCKS`; mxfp4 codes from bf16
on sm_90+ over words of two bf16, `QUANTIZE_PAIRS`; nvfp4's opt-in, `QUANTIZE_PAIRS_NVFP4`). Configs: the module's
defaults, or the GPU's table (`kernels/tuned/<gpu>.json`, `python -m bench.autotune --quantize`). On sm_90+ each
program lets the next kernel launch early (`QUANTIZE_PDL`): the mma kernels launched with PDL overlap it.

| operand        | shape                          | dtype                        | notes                                    |
|----------------|--------------------------------|------------------------------|------------------------------------------|
| x              | [rows, K]                      | bf16, fp16, fp32             | read as [rows, K / chunk, chunk]         |
| data (out)     | [rows, K / 2] / [rows, K]      | uint8 (E2M1 pairs) / E4M3    | k_order: even K in the low nibble        |
| scale (out)    | the layout's stored shape      | E8M0 (mx) / E4M3 (nvfp4)     | written in place through `scale_offset`  |
| global_scale   | [1]                            | fp32 (nvfp4)                 | read on the device: no host sync         |

Every rounding is the reference's, done in integer arithmetic or IEEE fp32 addition where a float cast could differ
between the GPU and the Triton interpreter: the E8M0 exponent from the fp32 bit fields, fp32 -> E4M3
round-to-nearest-even from the bits (subnormals by adding 2^14), E2M1 from the bits of 2|y| rounded to one mantissa
bit (below 1 by adding 2^23), and nvfp4's three divisions as IEEE `div_rn` (Triton's `/` on fp32 is `div.full.f32`, 2 ulp). NaN: a block with a NaN gets the NaN scale code
(E8M0 255, E4M3 0x7F) and its elements encode as +0 (fp4) or 0x7F (fp8), whatever the NaN's sign bit.
"""

from __future__ import annotations

import struct
import warnings
from typing import NamedTuple

import torch

import helion
import helion.language as hl

from blockscaled.formats import SCALE_LAYOUTS, BlockFormat
from blockscaled.layouts import padded_scale_shape, scale_offset, stored_scale_shape

from . import api, plans, scratch, tuned
from .api import _launch_cached, _one
from .configs import KERNEL_SETTINGS
from .decode import LAUNCH_DEPENDENTS_PTX, LAYOUT_CODES, e2m1_to_float32, e4m3_to_float32, e8m0_to_float32

# 8 rows x 512 elements a program: a 2-8 KB read, whole 128-byte lines per row (H200 timing: bench/quantize.py)
QUANTIZE_ROWS = 8
QUANTIZE_K = 512
QUANTIZE_WARPS = 4


def _div_rn(a, b):
    """IEEE fp32 division rounded to nearest even, as torch divides on CPU and GPU."""
    return hl.inline_triton("tl.math.div_rn({0}, {1})", args=(a, b), output_like=a)


def _f32(bits):
    return bits.view(torch.float32)


def _e8m0_scale(amax, FP8: bool, RCEIL: bool, SHORT: bool = False):
    """(E8M0 code, the multiplier its elements are scaled by) per block from amax >= 0 (NaN: code 255).
    floor: 2^(floor(log2 amax) - emax), the multiplier 1 / max(scale, 2^-126) (0 where the scale is Inf);
    rceil: 2^ceil(log2(amax / elem_max)), the multiplier as the reference's (1 at code 0, NaN at 255). With SHORT
    (amax a bf16 value: 8 significant bits) rceil's code comes from amax's bits, no division: amax / elem_max rounded
    to fp32 lands on a power of two only where it is one, so its ceil(log2) is amax's exponent - emax, plus 1 where
    amax's significand is above elem_max's (1.5 for E2M1, 1.75 for E4M3); below fp32's normal range that gives code
    1 exactly where amax / elem_max > 2^-127, as the division's subnormal does."""
    if FP8:  # E4M3: emax 8, largest 448 = 1.75 x 2^8
        emax = 8
        elem_max = 448.0
        elem_mantissa = 0x600000
    else:  # E2M1: emax 2, largest 6 = 1.5 x 2^2
        emax = 2
        elem_max = 6.0
        elem_mantissa = 0x400000
    nan = amax != amax
    if RCEIL:
        if SHORT:
            bits = amax.view(torch.int32)
            exp_field = (bits >> 23) & 0xFF
            ceil_log2 = exp_field - 127 - emax + ((bits & 0x7FFFFF) > elem_mantissa).to(torch.int32)
        else:
            descale = _div_rn(amax, torch.full_like(amax, elem_max))
            bits = descale.view(torch.int32)
            exp_field = (bits >> 23) & 0xFF
            mantissa = bits & 0x7FFFFF
            subnormal = (mantissa > 0x400000).to(torch.int32) - 127  # d < 2^-126: -126 above 2^-127, else <= -127
            ceil_log2 = torch.where(exp_field == 0, subnormal, exp_field - 127 + (mantissa != 0).to(torch.int32))
        code = torch.clamp(ceil_log2, -127, 127) + 127
        code = torch.where(exp_field == 255, 254, code)  # Inf (NaN below)
        multiplier = _f32(torch.where(code == 254, 0x400000, (254 - code) << 23))
        multiplier = torch.where(code == 0, 1.0, multiplier)
        code = torch.where(nan, 255, code)
        multiplier = torch.where(nan, float("nan"), multiplier)
    else:
        unbiased = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - emax
        code = torch.where(nan, 255, torch.clamp(unbiased, -127, 128) + 127)
        # 1 / 2^(code - 127) for code 1 .. 253 (code <= 253 - emax here but for NaN), 2^126 at code 0
        multiplier = _f32(torch.where(code == 0, 253 << 23, (254 - code) << 23))
        multiplier = torch.where(nan, 0.0, multiplier)  # v / Inf: finite -> 0, NaN and Inf -> NaN
    return code, multiplier


def _nvfp4_scale(amax, gs, inv_g):
    """(E4M3 code, the multiplier its elements are scaled by) per block from amax >= 0 (NaN: code 0x7F, multiplier
    NaN) and the global scale `gs` with `inv_g` = 1 / gs: s = amax / 6 / gs, clamped to E4M3's normal range, its
    code, and (1 / gs) / the code's value, each division rounded as torch rounds it."""
    s = _div_rn(_div_rn(amax, torch.full_like(amax, 6.0)), gs)
    s = torch.where(s != s, s, torch.clamp(s, 0.015625, 448.0))
    code = _e4m3_bits(s)
    s_value = _f32(((code & 0x7F) << 20) + (120 << 23))  # the code's value (normal: s >= 2^-6)
    return code, torch.where(code == 0x7F, float("nan"), _div_rn(inv_g, s_value))


def _e4m3_bits(y):
    """fp32 -> E4M3 byte (int32), round to nearest even, saturating at 448 (Inf too); NaN -> 0x7F, sign dropped.

    Normal (|y| >= 2^-6): rebias the exponent (127 -> 7) and round the 23-bit mantissa to 3 at bit 20.
    Subnormal: |y| rounded to a multiple of 2^-9 by adding 2^14 (whose fp32 ulp is 2^-9; the addition rounds to
    nearest even): the sum's mantissa is the code, 8 carrying into 0x08. (An input below fp32's normal range rounds
    to 0 whether or not the GPU flushes it.) The saturation is one integer minimum of the magnitude's bits: a float
    clamp that keeps NaN took two compares and two selects an element on sm_90."""
    bits = y.view(torch.int32)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    nan = a > 0x7F800000
    a = torch.clamp(a, max=0x43E00000)  # 448.0
    normal = (a + 0x7FFFF + ((a >> 20) & 1) - (120 << 23)) >> 20
    subnormal = (a.view(torch.float32) + 16384.0).view(torch.int32) - 0x46800000  # 2^14 + k 2^-9: mantissa k, no F2I
    code = torch.where(a >= 0x3C800000, normal, subnormal) | sign
    return torch.where(nan, 0x7F, code)


def _e4m3_codes(y, HW_E4M3: bool):
    """`_e4m3_bits` of y, or with HW_E4M3 (sm_89+) from the hardware's conversion, two elements an instruction:
    cvt.rn.satfinite rounds to nearest even and saturates at 448 as `_e4m3_bits` does; a NaN's code is made 0x7F
    here whatever its sign (the hardware keeps it)."""
    if not HW_E4M3:
        return _e4m3_bits(y)
    # $1 = element 2i, $2 = element 2i + 1; cvt puts its first source in the upper byte
    code = hl.inline_asm_elementwise("cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,r,r", [y], dtype=torch.uint8,
                                     is_pure=True, pack=2)
    return torch.where(y != y, 0x7F, code.to(torch.int32))


def _e2m1_codes(y):
    """fp32 -> E2M1 code (int32), nearest, ties to even, saturating at 6; -0 keeps its sign, NaN -> 0.

    One fp32 addition rounds |y| (at most 6: E2M1 saturates) to E2M1's spacing in its binade: with 2^e the binade
    (e = 0, 1, 2; |y| below 1 taken as e = 0, E2M1's subnormal spacing 0.5), |y| + 2^(e + 22) has an ulp of
    2^(e - 1), so the sum's bits less 2^(e + 22)'s are q = |y| / 2^(e - 1) rounded to nearest even, and the code is
    q + 2e (q's parity is the code's: ties go to even codes). Against the two-path rounding it replaces (2|y| rounded
    by adding 2^23 below 1, the bits rounded to one mantissa bit above; each path then selected) 784 -> 744 sm_90
    instructions a thread for mxfp4, 1176 -> 1128 for nvfp4 (`bench.quantize --compile-sm90`, bf16 in, 32 elements a
    thread)."""
    a = torch.minimum(torch.abs(y), torch.full_like(y, 6.0))  # (a NaN's code is set below)
    binade = torch.clamp(a.view(torch.int32) & 0x7F800000, min=0x3F800000)  # 2^e: 1.0, 2.0 or 4.0
    magic = binade + (22 << 23)  # 2^(e + 22)
    q = (a + magic.view(torch.float32)).view(torch.int32) - magic
    code = q + (binade >> 22) - 254  # (binade >> 22) - 254 = 2e
    sign = (y.view(torch.int32) >> 28) & 0x8
    return torch.where(y != y, 0, code | sign)


def _as_float32(t, BF16_BITS: bool):
    """Loaded input as fp32: bf16 as its int16 bits, widened by a shift (exact for subnormals, which the interpreter's
    cast flushes), other dtypes by a cast."""
    return (t.to(torch.int32) << 16).view(torch.float32) if BF16_BITS else t.to(torch.float32)


def _global_from_amax(amax):
    """nvfp4's global scale from the input's amax: amax / (6 * 448), 1 for an all-zero input
    (`reference.nvfp4_global_scale`)."""
    return torch.where(amax == 0, 1.0, _div_rn(amax, torch.full_like(amax, 2688.0)))


def _scale_value(code, NV: bool):
    """The block scales' values (fp32) from their codes: E4M3 (nvfp4) or E8M0."""
    return e4m3_to_float32(code) if NV else e8m0_to_float32(code)


def _element_values(scaled, FP8: bool, HW_E4M3: bool):
    """The values (fp32) of the element codes that `scaled` (elements over their block's scale) rounds to."""
    return e4m3_to_float32(_e4m3_codes(scaled, HW_E4M3)) if FP8 else e2m1_to_float32(_e2m1_codes(scaled))


def _dependents_may_launch(value, PDL: bool):
    """`value` after `griddepcontrol.launch_dependents` (`decode.LAUNCH_DEPENDENTS_PTX`; with PDL, sm_90+): once every
    program has passed it, the kernel after this one in the stream, if launched with PDL (the mma kernels reading the
    rows), starts its CTAs and their weight prefetch; its `griddepcontrol.wait` still waits for this whole kernel and
    its writes. Called on the blocks' amax: after the loads, before the stores."""
    if not PDL:
        return value
    return hl.inline_asm_elementwise(LAUNCH_DEPENDENTS_PTX, "=r,r", [value], dtype=torch.float32, is_pure=False, pack=1)


@helion.kernel(**KERNEL_SETTINGS)
def quantize_kernel(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor,
    global_out: torch.Tensor,
    sync: torch.Tensor,
    decoded: torch.Tensor,
    NV: hl.constexpr,
    FP8: hl.constexpr,
    RCEIL: hl.constexpr,
    LAYOUT: hl.constexpr,
    DECODED: hl.constexpr,
    BF16_BITS: hl.constexpr,
    FROM_AMAX: hl.constexpr,
    OWN_AMAX: hl.constexpr,
    SYNC_AMAX: hl.constexpr,
    HW_E4M3: hl.constexpr,
    BLOCK: hl.constexpr,
    SLOTS: hl.constexpr,
    PDL: hl.constexpr,
) -> torch.Tensor:
    """x [rows, K / C, C] (chunks of C = a power of two of blocks) -> data [rows, K / C, C (/ 2 packed)] and the flat
    scale buffer, or with DECODED, bf16 `decoded` [rows, K / C, C] = element x block scale (exact in bf16; the nvfp4 global scale
    not applied), what `dequantize.dequantize_kernel` makes of that data and scale. With FROM_AMAX (nvfp4 without
    a given global scale) `global_scale` holds the input's amax, or with OWN_AMAX (small inputs) every program reduces
    the whole input itself, or with SYNC_AMAX (every program resident at once) the programs combine their own amaxes
    in `sync` (int32 [SLOTS + 1], zero on entry and left zero) and wait for each other (`_barrier_programs`): 1, by an
    atomic maximum and a count of arrivals; 2, each program's amax in a slot of its own, flagged by the sign bit, all
    read in one vector of atomics a turn (no fence and no count on the way in); every program derives the scale from
    the amax and the first writes it to `global_out`."""
    rows, chunks, chunk = x.size(0), x.size(1), x.size(2)
    per_chunk = chunk // BLOCK
    groups = chunks * per_chunk
    # one chunk a program (config), chunks fastest: programs that run together stream whole rows; each load and store
    # is a row's contiguous chunk (a [rows, K / BLOCK, BLOCK] view had Triton spread a warp's lanes over rows)
    for tile_c, tile_r in hl.tile([chunks, rows], block_size=[1, None]):
        row_tiles = (rows + tile_r.block_size - 1) // tile_r.block_size
        programs = chunks * row_tiles
        v = _as_float32(x[tile_r, tile_c, :], BF16_BITS).reshape(tile_r.block_size, tile_c.block_size * per_chunk, BLOCK)
        # each block's index in the row (tile_c is one chunk: config)
        blocks = (tile_c.index[:, None] * per_chunk + hl.arange(per_chunk)[None, :]).reshape(tile_c.block_size * per_chunk)
        # the largest magnitude by its bits, one integer reduction: non-negative floats order as their bits, and a
        # NaN's are above Inf's, so a block with a NaN gets a NaN amax as the reference's does (Triton's float max
        # drops NaN)
        amax = _dependents_may_launch(torch.amax(v.view(torch.int32) & 0x7FFFFFFF, dim=-1).view(torch.float32), PDL)
        if NV:
            if OWN_AMAX:  # the whole input's amax by its bits, as above, 8 rows x one chunk at a time
                top = hl.zeros([chunk], dtype=torch.int32)
                for whole_r, whole_c in hl.tile([rows, chunks], block_size=[8, 1]):
                    if BF16_BITS:
                        w = x[whole_r, whole_c, :].to(torch.int32) << 16
                    else:
                        w = x[whole_r, whole_c, :].to(torch.float32).view(torch.int32)
                    top = torch.maximum(top, torch.amax(torch.amax(w & 0x7FFFFFFF, dim=0), dim=0))
                gs = torch.full_like(amax, 1.0) * torch.amax(top, dim=0).view(torch.float32)
            elif SYNC_AMAX:  # a grid barrier over the programs' own amaxes (their bits)
                mine = torch.amax(torch.amax(amax.view(torch.int32), dim=1), dim=0)
                if SYNC_AMAX == 2:  # [program] its amax's bits | 0x80000000 (written), [SLOTS] departures (at the end)
                    hl.store(sync, [tile_c.begin * row_tiles + tile_r.begin // tile_r.block_size], mine | -2147483648)
                    slot = hl.arange(SLOTS)
                    seen = hl.atomic_add(sync, [slot], torch.zeros_like(slot), sem="relaxed")  # at L2, never stale L1
                    while torch.sum(((seen >= 0) & (slot < programs)).to(torch.int32)) > 0:
                        seen = hl.atomic_add(sync, [slot], torch.zeros_like(slot), sem="relaxed")
                    top = torch.amax(torch.where(slot < programs, seen & 0x7FFFFFFF, 0), dim=0)
                else:  # [0] the amax's bits (atomic max), [1] arrivals, [2] departures
                    hl.atomic_max(sync, [0], mine, sem="relaxed")
                    hl.atomic_add(sync, [1], 1, sem="release")  # after this program's amax (one thread issues both)
                    seen = hl.atomic_add(sync, [1], 0, sem="acquire")
                    while seen < programs:
                        seen = hl.atomic_add(sync, [1], 0, sem="acquire")
                    top = hl.atomic_add(sync, [0], 0, sem="acquire")
                    if hl.atomic_add(sync, [2], 1, sem="acq_rel") == programs - 1:  # the last to leave: reads done
                        hl.store(sync, [0], 0)
                        hl.store(sync, [1], 0)
                        hl.store(sync, [2], 0)
                gs = torch.full_like(amax, 1.0) * top.view(torch.float32)
            else:  # the given global scale, or the amax a reduction launched before this kernel left there
                gs = torch.full_like(amax, 1.0) * global_scale[0]
            if FROM_AMAX:
                gs = _global_from_amax(gs)
                first = (tile_r.index[:, None] == 0) & (blocks[None, :] == 0)
                hl.store(global_out, [tile_r.index[:, None] * 0 + blocks[None, :] * 0], gs, extra_mask=first)
            code, multiplier = _nvfp4_scale(amax, gs, _div_rn(torch.full_like(amax, 1.0), gs))
        else:
            code, multiplier = _e8m0_scale(amax, FP8, RCEIL)
        scaled = v * multiplier[:, :, None]
        if DECODED:
            values = _element_values(scaled, FP8, HW_E4M3) * _scale_value(code, NV)[:, :, None]
            decoded[tile_r, tile_c, :] = values.reshape(tile_r.block_size, tile_c.block_size, chunk).to(torch.bfloat16)
        elif FP8:
            data[tile_r, tile_c, :] = _e4m3_codes(scaled, HW_E4M3).reshape(tile_r.block_size, tile_c.block_size, chunk).to(torch.uint8)
        else:
            codes = _e2m1_codes(scaled).reshape(tile_r.block_size, tile_c.block_size, chunk // 2, 2)
            low, high = hl.split(codes)
            data[tile_r, tile_c, :] = (low | (high << 4)).to(torch.uint8)
        if not DECODED:
            r = tile_r.index[:, None]
            c = blocks[None, :]
            off = scale_offset(SCALE_LAYOUTS[LAYOUT], r, c, groups)
            hl.store(scale, [off], code.to(torch.uint8), extra_mask=(r < rows) & (c < groups))
        if NV and SYNC_AMAX == 2:  # the last to leave clears the slots: every program has read them
            if hl.atomic_add(sync, [SLOTS], 1, sem="acq_rel") == programs - 1:
                hl.store(sync, [hl.arange(SLOTS)], hl.zeros([SLOTS], dtype=torch.int32))
                hl.store(sync, [SLOTS], 0)
    return data


def _block_parts(x, tile_r, tile_b, PARTS: int, BF16_BITS: bool) -> list:
    """A tile's blocks as PARTS fp32 [rows, blocks, 8] tensors, one load each (x: [rows, blocks, PARTS, 8])."""
    return [_as_float32(x[tile_r, tile_b, p, :], BF16_BITS) for p in range(PARTS)]


def _block_amax(parts: list):
    """Each block's largest magnitude by its bits, in its thread (NaN above Inf: a block with a NaN gets a NaN amax)."""
    top = torch.amax(parts[0].view(torch.int32) & 0x7FFFFFFF, dim=-1)
    for part in parts[1:]:
        top = torch.maximum(top, torch.amax(part.view(torch.int32) & 0x7FFFFFFF, dim=-1))
    return top.view(torch.float32)


def _store_block_codes(data, tile_r, tile_b, parts: list, multiplier, FP8: bool, HW_E4M3: bool) -> None:
    """The elements (each part times `multiplier`, [rows, blocks, 1]) as codes into `data`: fp8 [rows, blocks, PARTS,
    8] uint8, one store a part; fp4 [rows, blocks, PARTS / 2] int64, 8 codes summed into an int32 in the thread (code
    j at bits 4j) and two of them an int64."""
    if FP8:
        for p, part in enumerate(parts):
            data[tile_r, tile_b, p, :] = _e4m3_codes(part * multiplier, HW_E4M3).to(torch.uint8)
        return
    shifts = hl.arange(8) * 4
    words = [torch.sum(_e2m1_codes(part * multiplier) << shifts[None, None, :], dim=-1) for part in parts]
    for w in range(len(words) // 2):
        data[tile_r, tile_b, w] = (words[2 * w].to(torch.int64) & 0xFFFFFFFF) | (words[2 * w + 1].to(torch.int64) << 32)


# bf16 pairs (`quantize_blocks_kernel` with PAIRS): two bf16 elements in one 32-bit word, each op one instruction
# for both (sm_90: add / sub / mul .bf16x2, max.u16x2). An mx block's multiplier is a power of two, so x times it is
# exact in bf16 (as in fp32, whose result the reference rounds), and one bf16 addition rounds |y| to the element
# grid: in binade 2^e, |y| + 2^(e + 7 - MANTISSA) has an ulp of 2^(e - MANTISSA), the grid's spacing there (below the
# smallest normal binade, the subnormal spacing), rounded to nearest even as `_e2m1_codes` / `_e4m3_bits` round.
#
#   word:   | 31 ........ 16 | 15 ......... 0 |
#           |  element 2i+1  |   element 2i   |     (little-endian: the even element in the low half)
#   code:   |  0..0  s c c c |  0..0  s c c c |     (E2M1 per half before the nibbles are packed)
BF16X2_SIGNS = 0x80008000
BF16X2_MAGNITUDES = 0x7FFF7FFF
BF16X2_EXPONENTS = 0x7F807F80


def _bf16x2(op: str, a, b):
    """`op`.bf16x2 (PTX: "mul.rn", "add.rn", "sub.rn", "min", "max") of two words of bf16 pairs, lane by lane."""
    return hl.inline_asm_elementwise(f"{op}.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=torch.int32, is_pure=True,
                                     pack=1)


def _bf16x2_const(value: float, like):
    """The word of two bf16 `value`s (positive, exact in bf16: an fp32 whose low 16 bits are zero), shaped like `like`."""
    half = struct.unpack("<I", struct.pack("<f", value))[0] >> 16
    return torch.full_like(like, half << 16 | half)


def _max_u16x2(a, b):
    """max.u16x2: the larger of each 16-bit lane of two words, as unsigned integers."""
    return hl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=torch.int32, is_pure=True, pack=1)


def _pairs_amax(parts: list):
    """Each block's largest magnitude (fp32) from its words of bf16 pairs: the halves' bits maximized as u16 lanes
    (NaN above Inf, as `_block_amax`), then the two halves of the last word."""
    top = parts[0] & BF16X2_MAGNITUDES
    for part in parts[1:]:
        top = _max_u16x2(top, part & BF16X2_MAGNITUDES)
    top = torch.amax(torch.maximum(top & 0xFFFF, (top >> 16) & 0xFFFF), dim=-1)
    return (top << 16).view(torch.float32)


def _pairs_rounded(y, FP8: bool):
    """(|y| rounded to the element grid, the magic word added) per bf16 lane of `y` (NaN: 6 / 448, the block's NaN
    scale decides): min(|y|, largest), then + 2^(e + 7 - MANTISSA) with 2^e the binade of max(|y|, smallest normal)."""
    if FP8:  # E4M3: 3 mantissa bits, normal from 2^-6, largest 448
        largest, smallest, shift = 448.0, 2.0**-6, 4
    else:  # E2M1: 1 mantissa bit, normal from 1, largest 6
        largest, smallest, shift = 6.0, 1.0, 6
    a = _bf16x2("min", y & BF16X2_MAGNITUDES, _bf16x2_const(largest, y))
    magic = (_bf16x2("max", a, _bf16x2_const(smallest, y)) & BF16X2_EXPONENTS) + (shift << 7 | shift << 23)
    return _bf16x2("add.rn", a, magic), magic


def _pairs_decoded(part, multiplier, scale_value, FP8: bool):
    """The decoded words (element value x block scale, bf16 pairs) of one part's words `part` [rows, blocks, 4]:
    `multiplier` and `scale_value` words of bf16 pairs [rows, blocks, 1]; each product exact (powers of two)."""
    y = _bf16x2("mul.rn", part, multiplier)
    rounded, magic = _pairs_rounded(y, FP8)
    return _bf16x2("mul.rn", _bf16x2("sub.rn", rounded, magic) | (y & BF16X2_SIGNS), scale_value)


def _lanes(value: int) -> int:
    """A 16-bit value in both lanes of a word."""
    return value | value << 16


def _lane_e2m1_bytes(y, op, MANTISSA: int, BIAS: int):
    """E2M1 codes of words `y` of two 16-bit floats with MANTISSA mantissa bits and exponent bias BIAS (bf16: 7, 127,
    `op` `_bf16x2`; f16: 10, 15, `_f16x2`): each word's two codes in its low byte (the low lane's in the low nibble).
    min(|y|, 6) + 2^(e + MANTISSA - 1), 2^e the binade of max(|y|, 1), has an ulp of 2^(e - 1), E2M1's spacing there:
    the sum less that magic is q, rounded to nearest even, and the code q + 2e. A NaN lane gets code 0 (as
    `_e2m1_codes`), -0 keeps its sign."""
    shift = _lanes((MANTISSA - 1) << MANTISSA)
    magnitude = y & BF16X2_MAGNITUDES
    nan = (magnitude + _lanes((1 << MANTISSA) - 1)) & BF16X2_SIGNS  # bit 15 of a lane: above Inf's bits
    six = torch.full_like(y, _lanes((BIAS + 2) << MANTISSA | 1 << (MANTISSA - 1)))
    a = op("min", op("max", magnitude, torch.zeros_like(y)), six)  # max(NaN, 0) = 0
    binade = op("max", a, torch.full_like(y, _lanes(BIAS << MANTISSA))) & _lanes(0x7FFF >> MANTISSA << MANTISSA)
    magic = binade + shift
    # code = q + 2e: q = rounded - magic (the grid step), 2e = (binade >> (MANTISSA - 1)) - 2 BIAS
    code = op("add.rn", a, magic) - magic + ((magic - shift) >> (MANTISSA - 1)) - _lanes(2 * BIAS)
    code = code | ((((y & ~nan) & BF16X2_SIGNS) >> 12) & 0x00080008)  # the sign at bit 3 of each lane
    return (code | (code >> 12)) & 0xFF


def _pairs_e2m1_bytes(part, multiplier):
    """One part's E2M1 codes from its words `part` [rows, blocks, 4] (`_lane_e2m1_bytes` on the bf16 products, exact:
    the multiplier is a power of two), int32 [rows, blocks, 4]. A NaN lane only in a NaN block: x NaN, Inf times the
    floor rounding's 0, or the rceil rounding's NaN multiplier."""
    return _lane_e2m1_bytes(_bf16x2("mul.rn", part, multiplier), _bf16x2, 7, 127)


# nvfp4 over bf16 pairs: its multiplier is not a power of two, so each element's product is the reference's fp32 one;
# the two products of a word are then converted to an f16 pair rounding to odd (the fp32 bits below f16's mantissa
# ORed into its last bit, then truncated: `cvt.rz`), which keeps every E2M1 decision of the fp32 value (f16 has 9
# more mantissa bits than E2M1, and a value off the f16 grid stays off it on the side it was), and the E2M1 rounding
# runs on the f16 lanes as on bf16's (`_lane_e2m1_bytes`; checked on 20M fp32 values, every one within 2^14 ulps of
# an E2M1 decision point included: `tests/test_quantize_kernel.py`).
#
#   fp32 y:  | s | exponent (8) | 10 f16 mantissa bits | 13 bits | -> bit 13 |= (13 bits != 0), then truncated
F16_ROUND_TO_ODD_LOW = 0x1FFF  # the 13 fp32 mantissa bits below an f16's


def _f16x2(op: str, a, b):
    """`op`.f16x2 (PTX: "add.rn", "min", "max") of two words of f16 pairs, lane by lane."""
    return hl.inline_asm_elementwise(f"{op}.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=torch.int32, is_pure=True,
                                     pack=1)


def _f16x2_rz(high, low):
    """cvt.rz.f16x2.f32: fp32 `high` and `low` (int32 bits) truncated to f16, `high` in the word's upper half."""
    return hl.inline_asm_elementwise("cvt.rz.f16x2.f32 $0, $1, $2;", "=r,r,r", [high, low], dtype=torch.int32,
                                     is_pure=True, pack=1)


def _round_to_odd_f16(bits):
    """fp32 bits whose truncation to f16 rounds to odd: bit 13 (f16's last mantissa bit) set where any below is."""
    return bits | (((bits & F16_ROUND_TO_ODD_LOW) + F16_ROUND_TO_ODD_LOW) & (F16_ROUND_TO_ODD_LOW + 1))


def _pairs_nvfp4_bytes(part, multiplier):
    """`_pairs_e2m1_bytes` for nvfp4: `part` [rows, blocks, 4] words of bf16 pairs, `multiplier` the blocks' fp32
    multipliers [rows, blocks, 1]; the products in fp32 (as the reference), then E2M1 on f16 lanes (above)."""
    y_low = (part << 16).view(torch.float32) * multiplier
    y_high = (part & -65536).view(torch.float32) * multiplier
    h = _f16x2_rz(_round_to_odd_f16(y_high.view(torch.int32)), _round_to_odd_f16(y_low.view(torch.int32)))
    return _lane_e2m1_bytes(h, _f16x2, 10, 15)


def _pair_parts(x, tile_r, tile_b, PARTS: int) -> list:
    """A tile's blocks as PARTS int32 [rows, blocks, 4] words of bf16 pairs, one 16-byte load each."""
    return [x[tile_r, tile_b, p, :] for p in range(PARTS)]


def _store_pairs_codes(data, tile_r, tile_b, words: list, multiplier, NV: bool = False) -> None:
    """`_store_block_codes`'s fp4 data from words of bf16 pairs: each part's 8 codes an int32, two an int64 (NV: the
    fp32 multiplier, `_pairs_nvfp4_bytes`)."""
    shifts = hl.arange(4) * 8
    fp4 = [torch.sum((_pairs_nvfp4_bytes(w, multiplier) if NV else _pairs_e2m1_bytes(w, multiplier))
                     << shifts[None, None, :], dim=-1) for w in words]
    for w in range(len(fp4) // 2):
        data[tile_r, tile_b, w] = (fp4[2 * w].to(torch.int64) & 0xFFFFFFFF) | (fp4[2 * w + 1].to(torch.int64) << 32)


def _pairs_word(e8m0_bits):
    """A block's power-of-two (or 0 / NaN) fp32 multiplier or scale value as a word of two bf16 (its low 16 bits are
    zero), [rows, blocks]."""
    bits = e8m0_bits.view(torch.int32)
    return bits | ((bits >> 16) & 0xFFFF)


@helion.kernel(**KERNEL_SETTINGS)
def quantize_blocks_kernel(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor,
    global_out: torch.Tensor,
    decoded: torch.Tensor,
    NV: hl.constexpr,
    FP8: hl.constexpr,
    RCEIL: hl.constexpr,
    LAYOUT: hl.constexpr,
    DECODED: hl.constexpr,
    BF16_BITS: hl.constexpr,
    FROM_AMAX: hl.constexpr,
    HW_E4M3: hl.constexpr,
    PARTS: hl.constexpr,
    PDL: hl.constexpr,
    PAIRS: hl.constexpr,
) -> torch.Tensor:
    """`quantize_kernel`'s codes and scales, or with DECODED its bf16 rows (`decoded` [rows, blocks, PARTS, 8]), where
    it needs no amax of its own or grid barrier, with every block in one thread: x [rows, blocks, PARTS, 8] is read as PARTS loads of [rows, blocks, 8] (8 contiguous elements a thread
    each, a warp's lanes over consecutive blocks), so each block's amax, scale and packing stay in its thread: no
    shuffle, no layout conversion through shared memory, and the per-block arithmetic once per block, not once per 8
    elements. data: fp4 [rows, blocks, PARTS // 2] int64 (each int64 16 codes, code j in bits 4j..4j+3), fp8 [rows,
    blocks, PARTS, 8] uint8. With PAIRS (mx formats, bf16 in: `QUANTIZE_PAIRS`) x is int32 [rows, blocks, PARTS, 4]
    (bf16 pairs) and so is `decoded`: each op on two elements (`_pairs_decoded`, `_pairs_e2m1_bytes`)."""
    rows, blocks = x.size(0), x.size(1)
    for tile_r, tile_b in hl.tile([rows, blocks]):
        if PAIRS:  # words of two bf16
            words = _pair_parts(x, tile_r, tile_b, PARTS)
            amax = _dependents_may_launch(_pairs_amax(words), PDL)
        else:
            parts = _block_parts(x, tile_r, tile_b, PARTS, BF16_BITS)
            amax = _dependents_may_launch(_block_amax(parts), PDL)
        if NV:  # the global scale and its reciprocal once a program (a scalar), not once a block
            g = global_scale[0]
            if FROM_AMAX:
                g = _global_from_amax(g)
                first = (tile_r.index[:, None] == 0) & (tile_b.index[None, :] == 0)
                hl.store(global_out, [tile_r.index[:, None] * 0 + tile_b.index[None, :] * 0],
                         torch.full_like(amax, 1.0) * g, extra_mask=first)
            inv_g = _div_rn(torch.full_like(g, 1.0), g)
            code, multiplier = _nvfp4_scale(amax, torch.full_like(amax, 1.0) * g, torch.full_like(amax, 1.0) * inv_g)
        else:
            code, multiplier = _e8m0_scale(amax, FP8, RCEIL, PAIRS)
        if PAIRS and NV:  # nvfp4 codes: fp32 products, E2M1 on f16 pairs (`_pairs_nvfp4_bytes`)
            _store_pairs_codes(data, tile_r, tile_b, words, multiplier[:, :, None], True)
        elif PAIRS:
            m2 = _pairs_word(multiplier)[:, :, None]
            if DECODED:
                s2 = _pairs_word(_scale_value(code, False))[:, :, None]
                for p in hl.static_range(PARTS):
                    decoded[tile_r, tile_b, p, :] = _pairs_decoded(words[p], m2, s2, FP8)
            else:  # E2M1 codes (E4M3's: the hardware's conversion, HW_E4M3)
                _store_pairs_codes(data, tile_r, tile_b, words, m2)
        elif DECODED:
            scale_value = _scale_value(code, NV)[:, :, None]
            for p in hl.static_range(PARTS):
                values = _element_values(parts[p] * multiplier[:, :, None], FP8, HW_E4M3) * scale_value
                decoded[tile_r, tile_b, p, :] = values.to(torch.bfloat16)
        else:
            _store_block_codes(data, tile_r, tile_b, parts, multiplier[:, :, None], FP8, HW_E4M3)
        if not DECODED:
            r = tile_r.index[:, None]
            c = tile_b.index[None, :]
            hl.store(scale, [scale_offset(SCALE_LAYOUTS[LAYOUT], r, c, blocks)], code.to(torch.uint8),
                     extra_mask=(r < rows) & (c < blocks))
    return data


def quantize_config(fmt: BlockFormat) -> helion.Config:
    """QUANTIZE_ROWS rows x one chunk (`_chunk`: up to QUANTIZE_K elements) a program, QUANTIZE_WARPS warps
    (`bench.quantize --configs` times others)."""
    return helion.Config(block_sizes=[QUANTIZE_ROWS], num_warps=QUANTIZE_WARPS, num_stages=1)


def quantize_blocks_config(fmt: BlockFormat, blocks: int) -> helion.Config:
    """`quantize_blocks_kernel`: QUANTIZE_ROWS rows x QUANTIZE_K elements of a row (fewer where K is shorter) a
    program, QUANTIZE_WARPS warps."""
    per_row = min(QUANTIZE_K // fmt.block_size, 1 << (blocks - 1).bit_length())
    return helion.Config(block_sizes=[QUANTIZE_ROWS, per_row], num_warps=QUANTIZE_WARPS, num_stages=1)


# The formats whose codes and scales, and decoded rows, come from `quantize_blocks_kernel` (each block in one thread)
# instead of `quantize_kernel` (a block over 2-4 lanes) where no grid barrier or own amax is needed. H200, 16384 x
# 8192 bf16, fraction of a device-to-device copy's bandwidth, chunks -> blocks (`bench.quantize --kernels chunks
# blocks`): nvfp4 static scale 0.51 -> 0.59, mxfp4 floor / rceil 0.59 / 0.55 -> 0.61 / 0.60; mxfp8 0.97 -> 0.87
# (mxfp8's lanes already hold whole 16-byte loads of one block; one thread a block halves its loads in flight).
QUANTIZE_BLOCKS = frozenset({"nvfp4", "mxfp4"})

_LAUNCHES: dict[tuple, object] = {}


# nvfp4 without a global scale: up to this many input elements every program of the kernel reduces the whole input
# for its amax (at most 32 KB of bf16 more per program, from L2); above it, the grid barrier where every program is
# resident, else a reduction launched first. H200, decoded rows, own / barrier / launched: 1 x 8192 1.74 / 3.29 /
# 4.18 us, 4 x 8192 15.2 / 4.34 / 7.39 us (bench.quantize --amax-ways).
QUANTIZE_OWN_AMAX_ELEMENTS = 16384


class _Amax(NamedTuple):
    """How the kernel gets its global scale: `g_in` its [1] fp32 input (read unless OWN_AMAX / SYNC_AMAX), `g` the
    global scale [1] after the kernel, `sync` the SYNC_AMAX buffer (else `g`, not read), and the constexprs."""

    g_in: torch.Tensor
    g: torch.Tensor
    sync: torch.Tensor
    from_amax: bool = False
    own: bool = False
    barrier: int = 0  # SYNC_AMAX: 0, or 1 / 2 (see quantize_kernel)
    slots: int = 1  # SLOTS: a power of two >= the programs (SYNC_AMAX 2; else 1, unused)


def _global_scale(x: torch.Tensor, fmt: BlockFormat, global_scale) -> _Amax:
    """Given (a number, or a tensor: not read here), or for nvfp4 without one derived by the kernel into a new tensor
    from the input's amax: for inputs of at most QUANTIZE_OWN_AMAX_ELEMENTS every program's own reduction; where every
    program is resident at once (`_barrier_programs`) each program's own part and a grid barrier; else one reduction
    launched here. mx formats: 1, unused."""
    if not fmt.global_scale:
        return _Amax(_one(x.device), _one(x.device), _one(x.device))
    if global_scale is None:
        if x.numel() == 0:  # no rows, nothing launched: 1, as for an all-zero input (`reference.nvfp4_global_scale`);
            g = torch.ones(1, dtype=torch.float32, device=x.device)  # its own tensor: the result holds it, not `_one`'s
            return _Amax(g, g, g)
        out = torch.empty(1, dtype=torch.float32, device=x.device)
        if x.numel() <= QUANTIZE_OWN_AMAX_ELEMENTS:
            return _Amax(_one(x.device), out, out, from_amax=True, own=True)
        rows, k = x.shape
        programs = -(-rows // QUANTIZE_ROWS) * (k // _chunk(k, fmt))
        if programs <= _barrier_programs(x.device):
            sync = scratch.get(("quantize_sync", x.device), scratch.ScratchSpec(tickets=MAX_BARRIER_PROGRAMS + 1),
                               x.device).tickets
            if QUANTIZE_BARRIER_SLOTS:
                return _Amax(_one(x.device), out, sync, from_amax=True, barrier=2, slots=1 << (programs - 1).bit_length())
            return _Amax(_one(x.device), out, sync, from_amax=True, barrier=1)
        return _Amax(torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1), out, out, from_amax=True)
    if isinstance(global_scale, torch.Tensor):
        g = global_scale.to(device=x.device, dtype=torch.float32).reshape(1)
    else:  # a number: a fill kernel, not a host-to-device copy (a sync, and refused inside a CUDA-graph capture)
        g = torch.full((1,), float(global_scale), dtype=torch.float32, device=x.device)
    return _Amax(g, g, g)


# The grid barrier by slots (SYNC_AMAX 2) instead of an atomic maximum and a count of arrivals (1). Off: H200, decoded
# rows, count / slots, us: 16 x 8192 4.53 / 4.40, 16 x 28672 4.73 / 5.19, 32 x 8192 4.57 / 4.79 (static scale 2.5-2.7;
# bench/results/h200_quantize_amax_ways_86ca1e5_2026-11-29.log). Both pass the GPU tests.
QUANTIZE_BARRIER_SLOTS = False
MAX_BARRIER_PROGRAMS = 256


def _barrier_programs(device: torch.device) -> int:
    """The most programs SYNC_AMAX's grid barrier waits for: all must be resident at once. One a GPU SM (its programs
    hold 4 warps; a kernel launched after this one can take an SM only once every program has passed its dependents'
    trigger, `_dependents_may_launch`, so is running), at most MAX_BARRIER_PROGRAMS; one in the Triton interpreter,
    which runs programs one after another."""
    return min(plans._sm_count(device), MAX_BARRIER_PROGRAMS) if device.type == "cuda" else 1


# mxfp8's element codes from the hardware's fp32 -> E4M3 conversion (sm_89+) instead of integer rounding: 672 -> 432
# sm_90 instructions a thread (64 x 1024, bf16 in); H200, floor, bf16 in, 8192^2: 103.6 -> 55.1 us (0.49 -> 0.93 of a
# copy), 16384 x 8192: 141.9 -> 101.7 us (bench/results/h200_quantize_hw_e4m3_de6264b_2026-11-29.log).
QUANTIZE_HW_E4M3 = True


# Each program lets the next kernel launch once it has its blocks' amax (`_dependents_may_launch`): the mma kernel
# after it, launched with PDL, then overlaps its launch and weight prefetch with the quantize kernel's rest. H200,
# 8192^2, `scaled_mm(x_bf16, w, activation_format=...)` in CUDA graphs, off -> on: M = 16 nvfp4 20.30 -> 19.21 us,
# mxfp4 17.84 -> 17.07, mxfp8 x mxfp4 17.63 -> 16.68; M = 1 within 0.4 us (h200_bench_dynamic_pdl_*_effe469).
QUANTIZE_PDL = True


def _pdl(x: torch.Tensor) -> bool:
    """The kernels' PDL: let the next kernel launch early (`_dependents_may_launch`) on an NVIDIA sm_90+ GPU with
    QUANTIZE_PDL (never in the interpreter, never on AMD, whose capabilities read 9.4 / 9.5 but take no PTX)."""
    return QUANTIZE_PDL and plans._has_pdl(x.device)


def _hw_e4m3(x: torch.Tensor, fmt: BlockFormat) -> bool:
    """The kernel's HW_E4M3: E4M3 elements on an NVIDIA sm_89+ GPU with QUANTIZE_HW_E4M3 (never in the interpreter,
    never on AMD: its PTX conversion)."""
    return (QUANTIZE_HW_E4M3 and fmt.element == "e4m3" and plans._ptx_decodes(x.device)
            and plans._capability(x.device) >= (8, 9))


# mxfp4 codes from bf16 on sm_90+ in words of two bf16 (`_pairs_e2m1_bytes`): 624 -> 400 sm_90 instructions a thread
# of 32 elements (384 since its rounding is nvfp4's too, `_lane_e2m1_bytes`: one redundant AND fewer; not re-timed);
# H200, 16384 x 8192, blocks -> pairs: floor 132.4 -> 105.8 us (0.63 -> 0.79 of a copy), rceil 140.8 -> 107.8
# (bench/results/h200_quantize_pairs_codes_e761f36_2026-11-30.log).
QUANTIZE_PAIRS = True
# The decoded rows (`_pairs_decoded`, mxfp4 and mxfp8) the same way: 840 / 728 -> 264 instructions, but slower: H200,
# 16384 x 8192, mxfp4 floor 180.3 -> 198.9 us, mxfp8 floor 163.3 (quantize_kernel) -> 198.9; at 8192^2 every mx case
# ~105 us against 85-94 (h200_quantize_pairs_decoded_e761f36). Off: not instruction-bound there (not understood yet).
QUANTIZE_PAIRS_DECODED = False
# nvfp4 codes over bf16 pairs (`_pairs_nvfp4_bytes`): 920 -> 864 sm_90 instructions a thread of 32 elements (the
# products stay fp32; a block's three divisions stay); off until timed on a GPU (its exactness is checked on the CPU
# through an emulation of the PTX, `test_nvfp4_pairs_round_every_bf16_as_the_reference`).
QUANTIZE_PAIRS_NVFP4 = False


def _pairs(x: torch.Tensor, fmt: BlockFormat, rows_out: bool) -> bool:
    """Whether `quantize_blocks_kernel` runs over bf16 pairs (PAIRS): bf16 in, an mx format (a power-of-two
    multiplier: exact in bf16), E2M1 codes (QUANTIZE_PAIRS) or decoded rows (QUANTIZE_PAIRS_DECODED), or nvfp4 codes
    (QUANTIZE_PAIRS_NVFP4: fp32 products, f16 lanes rounded to odd; the caller checks the blocks kernel runs), an
    NVIDIA sm_90+ GPU (add / mul .bf16x2, max.u16x2; never the interpreter), more than one block a row
    (`_blocks_kernel_runs`) and 4-byte aligned rows."""
    wanted = (QUANTIZE_PAIRS_DECODED and not fmt.global_scale if rows_out
              else QUANTIZE_PAIRS_NVFP4 if fmt.global_scale else QUANTIZE_PAIRS and fmt.element == "e2m1")
    return (wanted and x.dtype == torch.bfloat16 and plans._has_pdl(x.device)
            and x.shape[1] // fmt.block_size > 1
            and (not x.is_contiguous() or x.data_ptr() % 4 == 0))  # (a non-contiguous x is copied, aligned)


def _format_flags(fmt: BlockFormat) -> tuple[bool, bool]:
    """The kernel's NV (nvfp4: E4M3 scales over a global scale) and FP8 (E4M3 elements) constexprs; neither: mxfp4.
    (Booleans: Helion passes module-level constants compared in the kernel as arguments, so both branches compile.)"""
    return fmt.global_scale, fmt.element == "e4m3"


def _chunk(k: int, fmt: BlockFormat) -> int:
    """Elements of K a program takes: blocks times the largest power of two that divides K's blocks, up to
    QUANTIZE_K (a power of two for Triton; K = 8192: 512)."""
    blocks = k // fmt.block_size
    return fmt.block_size * min(blocks & -blocks, max(1, QUANTIZE_K // fmt.block_size))


def _chunks(t: torch.Tensor, k: int, fmt: BlockFormat) -> torch.Tensor:
    """[rows, K'] (K' = K, or K / 2 packed) as the kernel indexes it: [rows, K / chunk, chunk']."""
    return t.view(t.shape[0], k // _chunk(k, fmt), -1)


def _blocks(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """x [rows, K] as the kernel reads it: [rows, K / chunk, chunk], bf16 as int16 bits."""
    x = _chunks(x.contiguous(), x.shape[1], fmt)
    return x.view(torch.int16) if x.dtype == torch.bfloat16 else x


def _blocks_kernel_runs(fmt: BlockFormat, amax: _Amax, cols: int) -> bool:
    """Whether `quantize_blocks_kernel` runs the call: `fmt` in QUANTIZE_BLOCKS, no own amax or grid barrier, and more
    than one block a row (one is a size-1 dim, which Helion's generated code fails on)."""
    return fmt.name in QUANTIZE_BLOCKS and not amax.own and not amax.barrier and cols > 1


def _launch_blocks(x, fmt: BlockFormat, amax: _Amax, scale_rounding: str, hw: bool, pdl: bool, data=None, scale=None,
                   layout: str = "rowmajor", decoded=None, pairs: bool = False) -> None:
    """`quantize_blocks_kernel` on x [rows, K] (contiguous): the codes into `data` (k_order) and `scale` (`layout`),
    or the rows into `decoded` (bf16 [rows, K]); with `pairs` (`_pairs`) over words of two bf16."""
    rows, k = x.shape
    cols, parts = k // fmt.block_size, fmt.block_size // 8
    per_part = 4 if pairs else 8
    xb = (x.view(torch.int32) if pairs else x.view(torch.int16) if x.dtype == torch.bfloat16 else x)
    xb = xb.view(rows, cols, parts, per_part)
    rows_out = decoded is not None
    if rows_out:  # the codes' arguments unread: the global scale stands in for them
        decoded = (decoded.view(torch.int32) if pairs else decoded).view(rows, cols, parts, per_part)
        data, scale = amax.g, amax.g
    else:
        data = (data.view(torch.uint8).view(rows, cols, parts, 8) if fmt.element == "e4m3"
                else data.view(torch.int64).view(rows, cols, parts // 2))
        scale, decoded = scale.view(torch.uint8).view(-1), amax.g
    args = (xb, data, scale, amax.g_in, amax.g, decoded, *_format_flags(fmt), scale_rounding == "rceil",
            LAYOUT_CODES[layout], rows_out, x.dtype == torch.bfloat16, amax.from_amax, hw, parts, pdl, pairs)
    key = ("blocks", fmt.name, rows, k, x.dtype, scale_rounding, layout, rows_out, x.device, amax.from_amax, hw, pdl,
           pairs)
    _launch_tuned(key, quantize_blocks_kernel, args, fmt, rows_out, x, quantize_blocks_config(fmt, cols))


def _launch(args: tuple, fmt: BlockFormat, key: tuple, x: torch.Tensor, amax: _Amax, decoded: bool) -> None:
    if amax.barrier:  # every program resident: never a tuned config (more programs could wait forever)
        _launch_cached(_LAUNCHES, key, quantize_kernel, args, lambda: quantize_config(fmt), x.device)
    else:
        _launch_tuned(key, quantize_kernel, args, fmt, decoded, x, quantize_config(fmt))


def table_name(kernel, args: tuple) -> str:
    """A quantize launch's kernel as the tuned table names it: `quantize_blocks_kernel` over bf16 pairs (its last
    argument, PAIRS) is "quantize_blocks_kernel[pairs]" (its own loads: a config's per-load fields differ)."""
    return kernel.name + "[pairs]" if kernel is quantize_blocks_kernel and args[-1] else kernel.name


def _launch_tuned(key: tuple, kernel, args: tuple, fmt: BlockFormat, decoded: bool, x: torch.Tensor,
                  default: helion.Config) -> None:
    """`kernel(*args)` with the GPU's tuned config for this input (`tuned.quantize_config_for`: `python -m
    bench.autotune --quantize`), else `default`; a table config that fails to compile or launch warns once and the
    default runs (a hand-edited or stale table never fails a call)."""
    if key not in _LAUNCHES:
        gpu = _tuned_gpu(x.device)
        found = gpu and tuned.quantize_config_for(gpu, table_name(kernel, args), fmt.name, decoded, str(x.dtype)[6:],
                                                  *x.shape)
        if found:
            try:
                return _launch_cached(_LAUNCHES, key, kernel, args, lambda: helion.Config.from_dict(found), x.device)
            except Exception as e:  # noqa: BLE001 - any compile or launch error of the table's config
                _LAUNCHES.pop(key, None)  # compiled, then failed to launch: not kept
                warnings.warn(f"kernels/tuned/{gpu}.json: the {kernel.name} config {found} failed "
                              f"({type(e).__name__}: {str(e)[:200]}); the default config runs instead", stacklevel=3)
    _launch_cached(_LAUNCHES, key, kernel, args, lambda: default, x.device)


def _tuned_gpu(device: torch.device) -> str | None:
    """The GPU's table key (`api._tuned_gpu`); None off a CUDA device."""
    return api._tuned_gpu(device) if device.type == "cuda" else None


def quantize(x: torch.Tensor, fmt: BlockFormat, scale_rounding: str, layout: str, global_scale):
    """(data, scale, global scale) of `x` [rows, K] (checked by the caller) from `quantize_kernel`, as
    `reference.quantize` makes them: data in k_order, scales stored in `layout` (zero padding included)."""
    rows, k = x.shape
    cols = k // fmt.block_size
    amax = _global_scale(x, fmt, global_scale)
    hw, pdl = _hw_e4m3(x, fmt), _pdl(x)
    data = torch.empty((rows, fmt.data_cols(k)), dtype=fmt.storage_dtype, device=x.device)
    padded = padded_scale_shape(layout, rows, cols) != (rows, cols)
    scale = (torch.zeros if padded else torch.empty)(stored_scale_shape(layout, rows, cols), dtype=fmt.scale_dtype,
                                                    device=x.device)
    if rows == 0:  # a batch of no tokens: nothing to launch
        return data, scale, amax.g.reshape(()) if fmt.global_scale else None
    blocks = _blocks_kernel_runs(fmt, amax, cols)
    # (nvfp4 over pairs where the blocks kernel runs: a global scale given or the input's amax reduced first)
    pairs = _pairs(x, fmt, False) and (blocks or not fmt.global_scale)
    if pairs or blocks:
        _launch_blocks(x.contiguous(), fmt, amax, scale_rounding, hw, pdl, data=data, scale=scale, layout=layout,
                       pairs=pairs)
        return data, scale, amax.g.reshape(()) if fmt.global_scale else None
    args = (_blocks(x, fmt), _chunks(data.view(torch.uint8), k, fmt), scale.view(torch.uint8).view(-1), amax.g_in,
            amax.g, amax.sync, amax.g, *_format_flags(fmt), scale_rounding == "rceil", LAYOUT_CODES[layout], False,
            x.dtype == torch.bfloat16, amax.from_amax, amax.own, amax.barrier, hw, fmt.block_size, amax.slots, pdl)
    _launch(args, fmt, (fmt.name, rows, k, x.dtype, scale_rounding, layout, x.device, False, *amax[3:], hw, pdl), x,
            amax, False)
    return data, scale, amax.g.reshape(()) if fmt.global_scale else None


def quantize_decoded(x: torch.Tensor, fmt: BlockFormat, scale_rounding: str, global_scale):
    """(bf16 [rows, K] of element x block scale, the global scale [1]) of `x` quantized as `quantize` does, in one
    launch: what the mma kernels' bf16-activation plans read (`scaled_mm(..., activation_format=...)`)."""
    rows, k = x.shape
    cols = k // fmt.block_size
    amax = _global_scale(x, fmt, global_scale)
    hw, pdl = _hw_e4m3(x, fmt), _pdl(x)
    decoded = torch.empty((rows, k), dtype=torch.bfloat16, device=x.device)
    if rows == 0:
        return decoded, amax.g
    pairs = _pairs(x, fmt, True)
    if pairs or _blocks_kernel_runs(fmt, amax, cols):
        _launch_blocks(x.contiguous(), fmt, amax, scale_rounding, hw, pdl, decoded=decoded, pairs=pairs)
        return decoded, amax.g
    args = (_blocks(x, fmt), amax.g, amax.g, amax.g_in, amax.g, amax.sync, _chunks(decoded, k, fmt), *_format_flags(fmt),
            scale_rounding == "rceil", LAYOUT_CODES["rowmajor"], True, x.dtype == torch.bfloat16, amax.from_amax,
            amax.own, amax.barrier, hw, fmt.block_size, amax.slots, pdl)
    _launch(args, fmt, (fmt.name, rows, k, x.dtype, scale_rounding, "rowmajor", x.device, True, *amax[3:], hw, pdl),
            x, amax, True)
    return decoded, amax.g
