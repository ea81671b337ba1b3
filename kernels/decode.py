"""Decode helpers: plain torch functions that Helion kernels call in their bodies.

They use integer and bit operations only (no lookup tables, no `cvt.e2m1x2`, which sm_90
rejects), so the same code runs inside a kernel on any GPU and on CPU tensors, where the
tests check them against `blockscaled.reference.codecs` over every code.
Inputs are int32 tensors holding the raw codes.
"""

from __future__ import annotations

import torch

from blockscaled.formats import SCALE_LAYOUTS, BlockFormat
from blockscaled.layouts.mma import NVFP4_BIAS

# Kernels take these small integers as `hl.constexpr` arguments (Helion kernels cannot
# close over Python objects); the wrapper derives them from the format descriptor.
ELEMENT_CODES = {"bf16": 0, "e2m1": 1, "e4m3": 2}
SCALE_CODES = {None: 0, "e8m0": 1, "e4m3": 2}
LAYOUT_CODES = {name: i for i, name in enumerate(SCALE_LAYOUTS)}

_F32_HALF = 0x3F000000  # 0.5
_F32_2_POW_M127 = 0x00400000  # 2^-127, E8M0 code 0 (an fp32 subnormal)
_F32_NAN = 0x7FC00000
_F32_NAN_VALUE = float("nan")
_SIGN_X2 = 0x80008000 - 2**32  # as int32
_MAG_X2 = 0x70007000
_HIGH_HALF = 0xFFFF0000 - 2**32
_TWO_POW_126 = 2.0**126


def e2m1_to_float32(code: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (0..15) -> float32, exact.

    Magnitudes >= 1 put the 3 magnitude bits under the fp32 exponent and fix the bias
    ((em << 22) + (126 << 23)); 0.5 (the one subnormal) and 0 are selected.
    """
    em = code & 7
    normal = (em << 22) + (126 << 23)
    bits = torch.where(em >= 2, normal, (em == 1).to(torch.int32) * _F32_HALF)
    return (bits | ((code & 8) << 28)).view(torch.float32)


def bf16x2_to_float32(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 words of two bf16 bit patterns -> (low half, high half) as float32, exact: a
    bf16 is the high half of the fp32 of equal value (one integer op each)."""
    return (words << 16).view(torch.float32), (words & _HIGH_HALF).view(torch.float32)


def e2m1x8_to_float32(words: torch.Tensor) -> list[torch.Tensor]:
    """int32 words of 8 E2M1 codes (code j in bits 4j..4j+3) -> 8 float32 tensors, exact.

    Two codes per integer sequence: after a shift, codes j and j+4 sit at bits 12-15 and
    28-31; (w & 0x80008000) | ((w & 0x70007000) >> 6) leaves the bf16 bit patterns of
    code * 2^-126 in both 16-bit halves (sign, exponent, mantissa land in place; 0.5
    becomes a subnormal). Each half moved into the high half of an fp32 is that value;
    one multiply by 2^126 (exact, subnormals are not flushed) gives the code's value.
    Costs about 3.5 integer ops per code against about 11 for `e2m1_to_float32`.
    """
    parts: list = [None] * 8
    for j in range(4):
        t = words << (4 * (3 - j))
        pair = (t & _SIGN_X2) | ((t & _MAG_X2) >> 6)
        low, high = bf16x2_to_float32(pair)
        parts[j], parts[j + 4] = low * _TWO_POW_126, high * _TWO_POW_126
    return parts


# PTX for `hl.inline_asm_elementwise(..., pack=4)`: $N is 4 bytes of E2M1 pairs; every
# output slot depends on its own byte only (the packing contract). Low nibbles go to the
# first output, high nibbles to the second.
# E2M1 -> E4M3 bit patterns of code * 2^-6: the 3 magnitude bits land under the low
# E4M3 exponent bits and the mantissa top bit (0.5 becomes the E4M3 subnormal 2^-7),
# the sign moves to bit 7. 9 integer ops per 8 codes: {lo} gets the low nibbles of the 4
# bytes of {x}, {hi} the high nibbles.
_E4M3_BYTES = (
    "shl.b32 t, {x}, 2; shl.b32 u, {x}, 4; and.b32 t, t, 0x1C1C1C1C; and.b32 u, u, 0x80808080; or.b32 {lo}, t, u; "
    "shr.b32 t, {x}, 2; and.b32 t, t, 0x1C1C1C1C; and.b32 u, {x}, 0x80808080; or.b32 {hi}, t, u; "
)
E2M1X2_TO_E4M3_PTX = "{ .reg .b32 t, u; " + _E4M3_BYTES.format(x="$2", lo="$0", hi="$1") + "}"
# E2M1 -> bf16, exact: prmt spreads bytes 0,1 (then 2,3) into the high bytes of the two
# 16-bit halves, the `e2m1x8_to_float32` pair trick leaves bf16(code * 2^-126), and one
# bf16x2 multiply by 2^126 (0x7E80, subnormals kept) gives the code's value.
# One bf16x2 pair of the high nibbles at bits 12-15 and 28-31 of {x} into output ${i}.
_BF16_PAIR = (
    "and.b32 v, {x}, 0x70007000; shr.b32 v, v, 6; and.b32 w, {x}, 0x80008000; or.b32 v, v, w; "
    "fma.rn.bf16x2 p, v, c, z; mov.b32 ${i}, p; "
)
# Input $4: 4 bytes of E2M1 pairs. Outputs $0,$1: low nibbles of bytes 0-1, 2-3 as bf16x2;
# $2,$3: high nibbles.
E2M1X2_TO_BF16_PTX = (
    "{ .reg .b32 t, u, v, w, c, z, p; mov.b32 c, 0x7E807E80; mov.b32 z, 0x80008000; "
    "prmt.b32 t, $4, 0, 0x1404; prmt.b32 u, $4, 0, 0x3424; "
    + _BF16_PAIR.format(x="t", i=2) + _BF16_PAIR.format(x="u", i=3)
    + "shl.b32 t, t, 4; shl.b32 u, u, 4; "
    + _BF16_PAIR.format(x="t", i=0) + _BF16_PAIR.format(x="u", i=1) + "}"
)


def _e2m1x8_via_e4m3(word: str, per_pair) -> str:
    """PTX decoding the 8 E2M1 codes of `word` through E4M3: the codes become E4M3 bytes of
    code * 2^-6 (9 integer ops), hardware converts each byte pair to f16x2 (exact), and
    `per_pair(reg, i)` consumes f16x2 pair i: K offsets (0, 2), (4, 6) of the word (low
    nibbles), then (1, 3), (5, 7) (high nibbles)."""
    return (
        "{ .reg .b32 t, u, lo, hi, p, s; .reg .b16 x, y; .reg .f32 f, g; "
        + _E4M3_BYTES.format(x=word, lo="lo", hi="hi")
        + "".join(
            f"mov.b32 {{x, y}}, {src}; cvt.rn.f16x2.e4m3x2 p, {half}; " + per_pair("p", i)
            for i, (src, half) in enumerate((("lo", "x"), ("lo", "y"), ("hi", "x"), ("hi", "y")))
        )
        + "}"
    )


# Outputs $0-$7: the codes of input $8 times 2^-6 as float32 (exact), K offsets 0, 2, 4, 6,
# 1, 3, 5, 7 of the word (the caller multiplies its result by 2^6).
E2M1X8_TO_F32_PTX = _e2m1x8_via_e4m3(
    "$8", lambda p, i: f"mov.b32 {{x, y}}, {p}; cvt.f32.f16 ${2 * i}, x; cvt.f32.f16 ${2 * i + 1}, y; "
)
# Outputs $0-$3: the f16x2 pairs of input $4 (times 2^-6, K offsets as `_e2m1x8_via_e4m3`).
E2M1X8_TO_F16X2_PTX = _e2m1x8_via_e4m3("$4", lambda p, i: f"mov.b32 ${i}, {p}; ")
# $0 = the dot of the 8 codes of word $1 with the 8 values of f16x2 pairs $2-$5 (as
# E2M1X8_TO_F16X2_PTX gives them), float32. f16 products and sums of E2M1 codes times 2^-6
# are exact (multiples of 2^-14, below 2^-4), so 4 f16x2 FMAs and one fp32 add replace 8
# conversions and 8 FFMAs.
E2M1X8_DOT_PTX = _e2m1x8_via_e4m3(
    "$1",
    lambda p, i: (f"mul.rn.f16x2 s, {p}, $2; " if i == 0 else f"fma.rn.f16x2 s, {p}, ${2 + i}, s; ")
    + ("mov.b32 {x, y}, s; cvt.f32.f16 f, x; cvt.f32.f16 g, y; add.f32 $0, f, g; " if i == 3 else ""),
)


def e8m0_to_float32(code: torch.Tensor) -> torch.Tensor:
    """E8M0 codes -> float32 2^(code - 127): the bit pattern is code << 23; 0 and 255 selected."""
    bits = torch.where(code == 0, _F32_2_POW_M127, torch.where(code == 255, _F32_NAN, code << 23))
    return bits.view(torch.float32)


def e4m3_to_float32(code: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes -> float32, exact: normals rebias the exponent (+120), subnormals m * 2^-9."""
    mag = code & 0x7F
    normal = ((mag << 20) + (120 << 23)).view(torch.float32)
    subnormal = (mag & 7).to(torch.float32) * 0.001953125
    value = torch.where(mag < 8, subnormal, normal)
    value = torch.where(mag == 0x7F, _F32_NAN_VALUE, value)
    return torch.where((code & 0x80) != 0, -value, value)


def e4m3_to_float32_by_multiply(code: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes -> float32, exact, as `e4m3_to_float32` in fewer instructions (sm_90 K loop of the mma
    kernel, nvfp4 x nvfp4, M = 16, 8192^2: 314 -> 307 per two windows): the sign and 7 magnitude bits
    placed as float32 bits (2^-120 times the value, a float32 subnormal for E4M3 subnormals) times 2^120.
    Only where a float32 multiply keeps subnormals (PTX mul.f32 without .ftz, as the NVIDIA kernels
    compile it; CPUs)."""
    mag = code & 0x7F
    value = ((mag << 20) | ((code & 0x80) << 24)).view(torch.float32) * 2.0**120
    return torch.where(mag == 0x7F, _F32_NAN_VALUE, value)


def decode_scale(code: torch.Tensor, scale_code: int) -> torch.Tensor:
    """Scale codes -> float32 by `SCALE_CODES` value."""
    if scale_code == SCALE_CODES["e8m0"]:
        return e8m0_to_float32(code)
    return e4m3_to_float32(code)


def operand_codes(fmt: BlockFormat | None, layout: str = "rowmajor") -> tuple[int, int, int, int]:
    """(element, scale, block, layout) constexpr codes for one operand; None means bf16."""
    if fmt is None:
        return ELEMENT_CODES["bf16"], SCALE_CODES[None], 1, 0
    return ELEMENT_CODES[fmt.element], SCALE_CODES[fmt.scale_encoding], fmt.block_size or 1, LAYOUT_CODES[layout]


# "mma_m16k16" weights (`blockscaled.layouts.mma`) -> mma.sync A fragments, exact.
# Inputs $16-$19: a window's 4 words (one per mma step; int32 for E2M1, int64 for E4M3), $20:
# the 16-bit factor word (R0 byte, R1 byte). Outputs $4s..$4s+3: step s's A registers (R0 j0/1,
# R1 j0/1, R0 j2/3, R1 j2/3) as bf16x2 of element * scale * 2^-shift. Integer ops place the
# codes as bf16(element * 2^-decode_shift): E2M1 11 per word of 8 (register 0's bits are in
# place, 1 and 2 shift by 3 and 6, 3 takes three shifts), E4M3 6 per 32 bits of 4 (registers
# 0 / 2 a mask, 1 / 3 two shifts, two masks and an or); one bf16x2 FMA with -0 (sm_80's exact
# multiply) per register applies the row's factor f = scale * 2^(decode_shift - shift),
# subnormals kept.
def _a_registers_e2m1(word: str, r: list[str]) -> str:
    """PTX: an E2M1 word of the "mma_m16k16" layout into registers r[0..3], each bf16x2(code * 2^-126); the bit
    placement is drawn in `blockscaled.layouts.mma`. 11 integer ops."""
    return " ".join([
        f"and.b32 {r[0]}, {word}, 0x81C081C0;",  # reg 0: its codes already sit under the bf16 fields
        f"shl.b32 t, {word}, 3;",
        f"and.b32 {r[1]}, t, 0x81C081C0;",  # reg 1: 3 bits up
        f"shl.b32 t, {word}, 6;",
        f"and.b32 {r[2]}, t, 0x81C081C0;",  # reg 2: 6 bits up
        f"shr.b32 t, {word}, 4;",
        f"and.b32 {r[3]}, t, 0x00C000C0;",  # reg 3: e0, m (bits 11, 10 -> 7, 6)
        f"shr.b32 t, {word}, 5;",
        "and.b32 t, t, 0x01000100;",
        f"or.b32 {r[3]}, {r[3]}, t;",  # reg 3: e1 (bit 13 -> 8)
        f"shl.b32 t, {word}, 1;",
        "and.b32 t, t, 0x80008000;",
        f"or.b32 {r[3]}, {r[3]}, t;",  # reg 3: sign (bit 14 -> 15)
    ]) + " "


def _a_registers_e4m3(word: str, r: list[str]) -> str:
    """PTX: an E4M3 int64 word of the "mma_m16k16" layout into registers r[0..3], each bf16x2(value * 2^-120):
    per 32-bit half, one register under the bf16 fields and one 4 bits off. 6 integer ops per half."""
    lines = [f"mov.b64 {{lo, hi}}, {word};"]  # the two 32-bit halves: registers 0, 1 and 2, 3
    for h, half in enumerate(("lo", "hi")):
        lines += [
            f"and.b32 {r[2 * h]}, {half}, 0x87F087F0;",  # sign at 15, exponent and mantissa at 4-10 of each half
            f"shl.b32 t, {half}, 4;",
            "and.b32 t, t, 0x80F080F0;",  # the other register's sign and low bits, 4 up
            f"shr.b32 u, {half}, 4;",
            "and.b32 u, u, 0x07000700;",  # and its high bits, 4 down
            f"or.b32 {r[2 * h + 1]}, t, u;",
        ]
    return " ".join(lines) + " "


def _mma_a_fragments(element: int, factor_shift: int, factor_bias: int) -> str:
    def factor(reg: str, sel: str) -> str:
        add = f"add.u32 {reg}, {reg}, {factor_bias * 0x10001:#x}; " if factor_bias else ""
        return f"prmt.b32 {reg}, $20, 0, {sel}; shl.b32 {reg}, {reg}, {factor_shift}; " + add

    place = _a_registers_e2m1 if element == ELEMENT_CODES["e2m1"] else _a_registers_e4m3
    steps = []
    for s in range(4):
        r = [f"r{4 * s + i}" for i in range(4)]
        steps.append(place(f"${16 + s}", r)
                     + "".join(f"fma.rn.bf16x2 {r[i]}, {r[i]}, {'f0' if i % 2 == 0 else 'f1'}, z; " for i in range(4)))
    regs = ", ".join(f"r{i}" for i in range(16))
    return (
        f"{{ .reg .b32 t, u, lo, hi, f0, f1, z, {regs}; mov.b32 z, 0x80008000; "
        + factor("f0", "0x4040") + factor("f1", "0x4141") + "".join(steps)
        + "".join(f"mov.b32 ${i}, r{i}; " for i in range(16)) + "}"
    )


# by (ELEMENT_CODES, SCALE_CODES) of the weights: E8M0 factor bytes are the bf16 exponent
# field; E4M3 (nvfp4) ones a 5-bit exponent over layouts.mma.NVFP4_BIAS and 3 mantissa bits
MMA_A_FRAGMENTS_PTX = {
    (ELEMENT_CODES["e2m1"], SCALE_CODES["e8m0"]): _mma_a_fragments(ELEMENT_CODES["e2m1"], 7, 0),
    (ELEMENT_CODES["e2m1"], SCALE_CODES["e4m3"]): _mma_a_fragments(ELEMENT_CODES["e2m1"], 4, NVFP4_BIAS << 7),
    (ELEMENT_CODES["e4m3"], SCALE_CODES["e8m0"]): _mma_a_fragments(ELEMENT_CODES["e4m3"], 7, 0),
}
# fp4 and fp8 activations -> mma.sync B fragments, exact. A lane's 16 K of a window (one
# int64 of fp4 codes, two of fp8 bytes) are its B column's k pairs: step s takes K 4s, 4s+1
# (first register, low half first) and 4s+2, 4s+3. Each register gets its two elements as bf16
# and then a bf16x2 FMA with -0 (exact) applies the factor `mma_b_factor`:
# - E2M1, per int32 word of 8 codes: the bf16 of each code's magnitude is a table lookup, prmt
#   selecting from 8 bytes by the code's 3 magnitude bits (one prmt gives the low bytes of 4
#   codes, one their high bytes); the sign bits, moved to bit 7 of a byte per code (3 ops), are
#   prmt-ed beside the high bytes and or-ed in, and prmt interleaves low and high bytes into the 4
#   registers: 17 integer ops per 8 codes. The placement of codes under the bf16 fields that it
#   replaced took 27, and a second FMA for E8M0 scales; sm_90 K loop at M = 16, 8192^2 (8 K slices,
#   two windows per iteration): nvfp4 x nvfp4 333 -> 329 instructions, mxfp4 x mxfp4 325 -> 314.
# - E4M3: prmt puts bytes 2r, 2r+1 under the halves: bf16(value * 2^-120), then an FMA by 2^120.
#   E4M3 has NaN codes (S.1111.111) where this gives 480: if any of the lane's 16 bytes is
#   one (bit 7 of (byte & 0x7F) + 1, 4 words OR-ed: 15 ops), its factor becomes NaN, so its
#   whole B column is NaN, as NaN * w spreads through the reference's row anyway.
# The factor is the block's scale (an E4M3 or E8M0 value as bf16, exact).
# E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bf16: their low bytes and high bytes, 8 each,
# as the two words prmt selects from
E2M1_BF16_LOW = (0xC0800000, 0xC0804000)
E2M1_BF16_HIGH = (0x3F3F3F00, 0x40404040)


def _e2m1_bf16_registers(word: str, out: list[str], factor: str) -> str:
    """PTX: the 8 E2M1 codes of `word` (K order) as bf16x2 registers `out` (K 0, 1 / 2, 3 / 4, 5 / 6, 7),
    each multiplied by `factor` (bf16x2; `z` holds -0)."""
    outs = iter(out)
    regs = (f"and.b32 m, {word}, 0x77777777; shr.b32 n, m, 16; shl.b32 e, {word}, 4; and.b32 e, e, 0x80808080; "
            f"and.b32 o, {word}, 0x80808080; ")
    for half, sel in (("m", "0x5140"), ("n", "0x7362")):  # codes 0-3, then 4-7
        regs += (f"prmt.b32 lo, tl0, tl1, {half}; prmt.b32 hi, th0, th1, {half}; prmt.b32 t, e, o, {sel}; "
                 "or.b32 hi, hi, t; ")
        regs += "".join(f"prmt.b32 t, lo, hi, {pair}; fma.rn.bf16x2 {next(outs)}, t, {factor}, z; "
                        for pair in ("0x5140", "0x7362"))
    return regs


def _mma_b_fragments(element: int, elements: int) -> str:
    fp4 = element == ELEMENT_CODES["e2m1"]
    words = [f"w{i}" for i in range(elements // (8 if fp4 else 4))]
    first_in = elements // 2  # the outputs come first
    if fp4 and elements == 8:
        loads = f"mov.b32 w0, ${first_in}; "
    else:  # int64 inputs, two words each
        loads = "".join(f"mov.b64 {{w{2 * i}, w{2 * i + 1}}}, ${first_in + i}; " for i in range(len(words) // 2))
    factor_in = f"${first_in + max(1, len(words) // 2)}"
    if fp4:
        factor = factor_in
        loads += "".join(f"mov.b32 {r}, {v:#x}; " for r, v in zip(("tl0", "tl1", "th0", "th1"),
                                                                    E2M1_BF16_LOW + E2M1_BF16_HIGH, strict=True))
    else:  # f = the factor, or NaN if a byte is an E4M3 NaN
        loads += ("mov.b32 e, 0; "
                  + "".join(f"and.b32 t, {w}, 0x7F7F7F7F; add.u32 t, t, 0x01010101; or.b32 e, e, t; " for w in words)
                  + f"and.b32 e, e, 0x80808080; setp.ne.u32 p, e, 0; selp.b32 f, 0x7FC07FC0, {factor_in}, p; ")
        factor = "f"
    regs = []
    for wi, word in enumerate(words):
        if fp4:
            regs.append(_e2m1_bf16_registers(word, [f"${4 * wi + k}" for k in range(4)], factor))
            continue
        for k in range(2):  # bytes 2k, 2k+1 under the two halves
            place = (f"prmt.b32 t, {word}, 0, {2 * k * 0x11 | (2 * k + 1) * 0x1100:#06x}; shl.b32 u, t, 4; "
                     "and.b32 u, u, 0x07F007F0; shl.b32 t, t, 8; and.b32 t, t, 0x80008000; ")
            regs.append(place + "or.b32 t, t, u; fma.rn.bf16x2 t, t, c, z; " + f"fma.rn.bf16x2 ${2 * wi + k}, t, {factor}, z; ")
    return (f"{{ .reg .b32 {', '.join(words)}, e, o, t, u, c, z, f, m, n, lo, hi, tl0, tl1, th0, th1; .reg .pred p; "
            + loads + f"mov.b32 z, 0x80008000; mov.b32 c, {0x7B80 * 0x10001:#x}; " + "".join(regs) + "}")


# by (ELEMENT_CODES, SCALE_CODES) of the activation and elements per thread: 16 (a lane's
# window: inputs $8 (fp8: $8, $9) the int64 words, then the bf16x2 factor; outputs $2s, $2s+1:
# step s's B registers) or 8 (a thread's share of the window for `MMA_SHARED_B_PTX`: input $4
# the fp4 int32 word or the fp8 int64, then the factor; outputs $0-$3 in K order).
MMA_B_FRAGMENTS_PTX = {
    (ELEMENT_CODES[e], SCALE_CODES[c], n): _mma_b_fragments(ELEMENT_CODES[e], n)
    for e, c in (("e2m1", "e8m0"), ("e2m1", "e4m3"), ("e4m3", "e8m0")) for n in (8, 16)
}


def mma_b_factor(code: torch.Tensor, scale_code: int) -> torch.Tensor:
    """Activation scale codes -> the bf16x2 factor (both halves) of `MMA_B_FRAGMENTS_PTX`: the
    E4M3 or E8M0 scale (2^-127 a bf16 subnormal), exact; NaN codes give NaN. A bf16 is the high
    half of the equal fp32."""
    value = e8m0_to_float32(code) if scale_code == SCALE_CODES["e8m0"] else e4m3_to_float32_by_multiply(code)
    bits = (value.view(torch.int32) >> 16) & 0xFFFF
    return bits | (bits << 16)


def _mma_steps(b_words: int, shared_offset: int | None = None) -> str:
    """$0-$3 = accumulators + the 4 mma steps: A registers $4-$19 (4 per step); B at $20:
    4 int64 (the 4 bf16 of a step), 8 int32 (2 per step) or, with `shared_offset`, the shared
    address of the lane's 8 registers less that offset (`MMA_M64_EXCHANGE_PTX`); accumulators
    after B."""
    acc = 21 if shared_offset is not None else 20 + b_words
    steps = []
    if shared_offset is not None:
        steps += [f"ld.shared.v4.b32 {{b{4 * h}, b{4 * h + 1}, b{4 * h + 2}, b{4 * h + 3}}}, [$20+{shared_offset + 16 * h}]; "
                  for h in range(2)]
    for s in range(4):
        if shared_offset is not None:
            b = f"b{2 * s}, b{2 * s + 1}"
        elif b_words == 4:
            b = "b0, b1"
            steps.append(f"mov.b64 {{b0, b1}}, ${20 + s}; ")
        else:
            b = f"${20 + 2 * s}, ${21 + 2 * s}"
        steps.append(
            f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{c0, c1, c2, c3}}, "
            f"{{${4 + 4 * s}, ${5 + 4 * s}, ${6 + 4 * s}, ${7 + 4 * s}}}, {{{b}}}, {{c0, c1, c2, c3}}; "
        )
    return (
        "{ .reg .b32 b<8>; .reg .f32 c0, c1, c2, c3; "
        + "".join(f"mov.b32 c{i}, ${acc + i}; " for i in range(4))
        + "".join(steps)
        + "mov.b32 $0, c0; mov.b32 $1, c1; mov.b32 $2, c2; mov.b32 $3, c3; }"
    )


# by B form: bf16 activations (4 int64 words) or decoded fp4 ones (8 int32 registers)
MMA_STEPS_PTX = {4: _mma_steps(4), 8: _mma_steps(8)}

# Shared B: a program's 128 threads write one window of the activation, as bf16 in K order,
# into shared memory (thread t: row (t >> 3) mod 8c, K 8 (t & 7) .. + 8, 16 bytes), wait at a
# CTA barrier and read back their lanes' B registers (row 8c + g, K 16q .. + 16: 32 bytes per
# column group c): one load and one decode of 8 elements per thread instead of each warp's
# 16 per column group. Rows are MMA_SHARED_B_ROW bytes apart (128 + 16, so the 16-byte reads
# of a quarter-warp, 2 rows x 4 lanes, fall on 8 distinct groups of 4 banks); two buffers
# alternate by window parity, so one barrier per window keeps a write from overtaking a read.
# Rows past 8 c of a thread's share repeat (M <= 8: threads 64-127 write what 0-63 write).
MMA_SHARED_B_ROW = 144


def shared_buffer_ptx(size: int, align: int = 16) -> str:
    """PTX of the shared address of a new `size`-byte buffer. Declared once, before a kernel's K
    loop, and passed to the asm in the loop: a `.shared` declared in the loop's own asm is one
    buffer per copy of it, and LLVM fully unrolls short loops (3 windows x 8 K slices x 18 KB
    went past the 48 KB of static shared memory)."""
    return f"{{ .shared .align {align} .b8 sb[{size}]; mov.u32 $0, sb; }}"


def shared_b_bytes(col_groups: int, slices: int) -> int:
    """Shared memory of `MMA_SHARED_B_PTX[col_groups, _, slices]`."""
    return 2 * 8 * col_groups * MMA_SHARED_B_ROW * slices


# Staged B (`mma_gemv_kernel` with STAGE_B: fp4 / fp8 activations, M <= 8, K split over the warps):
# before its K loop each warp decodes its own K range of the activation once, as bf16 in K order,
# into shared memory (row r at r * staged_b_row_bytes(K), 16 bytes past 2K so that 8 rows fall on
# distinct banks), and every window reads its lanes' B registers there with two ld.shared.v4: no
# per-window activation loads or decodes, and no CTA barrier (a warp reads only what it wrote,
# after `bar.warp.sync`, which orders the warp's shared-memory accesses).
def staged_b_row_bytes(k: int) -> int:
    """Bytes between two activation rows of a staged B buffer."""
    return 2 * k + 16


def staged_b_bytes(m: int, k: int) -> int:
    """Shared memory of a staged B buffer of m rows of K."""
    return m * staged_b_row_bytes(k)


def staged_b_chunks(m: int, steps: int) -> int:
    """16-K chunks that each lane of a warp stages: the warp's M x 4 steps over its 32 lanes, rounded up."""
    return -(-m * steps // 8)


def staged_b_chunk(lane, j: int, first, steps: int, m: int):
    """(activation row, 16-K chunk of the row) that `lane` of a warp stages as its j-th: of the
    warp's M x 4 steps chunks from window `first` on, lane l takes l, l + 32, ... (ints or tensors);
    where they do not fill the lanes' last round, lanes past the end start over (the same bytes,
    stored twice)."""
    chunk = j * 32 + lane
    if (m * steps) % 8:
        chunk = chunk % (4 * m * steps)
    return chunk // (4 * steps), first * 4 + chunk % (4 * steps)


def staged_b_offset(row, k16, k: int):
    """Byte offset of activation row `row`'s 16-K chunk `k16` (K 16 k16 .. + 16, 32 bytes of bf16)
    in a staged B buffer; window w's B registers of lane q are chunk 4 w + q."""
    return row * staged_b_row_bytes(k) + k16 * 32


def _staged_b_store(chunks: int, early: int) -> str:
    """Output $0: the buffer address (a token the window reads take, so that they come after);
    inputs: the lane's `chunks` x 8 B registers (16 decoded elements each), their byte offsets
    in the buffer, the buffer's address (`shared_buffer_ptx`), then `early` words loaded before the
    staging. Those are only waited for: where their xor is 0x7fc00001 the lane stores it to the first
    word of its first chunk, which its own next store overwrites (ptxas drops a load nothing uses)."""
    offsets, base = 1 + 8 * chunks, 1 + 9 * chunks
    wait = f"mov.b32 x, ${base + 1}; " + "".join(f"xor.b32 x, x, ${base + 1 + i}; " for i in range(1, early))
    wait += "setp.eq.u32 p, x, 0x7fc00001; @p st.shared.b32 [a], x; "
    stores = "".join(
        f"add.u32 a, ${base}, ${offsets + j}; " + (wait if j == 0 else "")
        + "".join(f"st.shared.v4.b32 [a+{16 * h}], {{{', '.join(f'${1 + 8 * j + 4 * h + i}' for i in range(4))}}}; "
                  for h in range(2))
        for j in range(chunks)
    )
    return "{ .reg .b32 a, x; .reg .pred p; " + stores + f"bar.warp.sync -1; mov.b32 $0, ${base}; }}"


# by 16-element chunks per lane (`staged_b_chunks`: at most 16 within MMA_STAGED_B_MAX_BYTES with 2 warps), waiting for
# the first window's 4 weight words and its factor word (`mma_gemv.staged_b`)
MMA_STAGED_B_STORE_PTX = {c: _staged_b_store(c, 5) for c in range(1, 17)}
# Outputs $0 .. $7: a lane's 8 B registers of a window (step s: $2s, $2s + 1), input: their shared address
MMA_STAGED_B_LOAD_PTX = "ld.shared.v4.b32 {$0, $1, $2, $3}, [$8]; ld.shared.v4.b32 {$4, $5, $6, $7}, [$8+16];"
# Largest staged B buffer: with the K-warp sums' (at most 7.7 KB at M <= 8) inside 48 KB of static shared
# memory, and 4 programs of 16 warps per SM (the K_WARPS rule's) inside the SM's 228 KB.
MMA_STAGED_B_MAX_BYTES = 32 * 1024 + 16

# K split over the warps of a program (`mma_gemv_kernel` with K_WARPS > 1): each group of
# `group` threads (a warp, or with shared B a K slice of 4 warps) holds partial sums of the same
# rows over its own K; groups 1 .. K_WARPS - 1 write theirs into shared memory (value j of group w
# at word group ((w - 1) n + j) + thread: a warp's 32 stores hit 32 banks), one CTA barrier, and
# group 0 adds them to its own. No global atomics, no ticket, one launch. `rounds` > 1 passes the
# n values in that many rounds through a buffer of n / rounds values per thread (a barrier after
# each round's adds too): static shared memory ends at 48 KB, which the shared B buffers share.
STATIC_SHARED_BYTES = 48 * 1024


# Loads of other groups' values issued before their adds, at most this many at a time. One register
# reused for every load (before) had ptxas run them as a chain of LDS -> FADD -> LDS, 30 at M = 1 with 16 warps
# and 56 at M = 16 with 8 K slices (sm_90 SASS), each waiting for its shared-memory round trip. H100, M = 16, 8192^2,
# one load / 8 at a time: +1-3% in all 7 pairs, bf16 x mxfp4 17.0 -> 16.5 us
# (bench/results/h100_mma_ksum_m16_n8192_k8192_0b62f40_2026-11-25.log).
K_WARP_SUM_LOADS = 8


def _k_warp_sum(values: int, k_warps: int, group: int = 32, rounds: int = 1) -> str:
    """Outputs $0 .. $(n - 1): inputs $n .. $(2n - 1) (fp32) summed over the K_WARPS groups of
    `group` threads of the program, in group order, valid in group 0 (the other groups get their own
    values back). Group 0 loads the others' values K_WARP_SUM_LOADS at a time before adding them."""
    n, per = values, values // rounds
    stride = 4 * group * per  # bytes between two groups' slices
    body = ""
    for r in range(rounds):
        js = range(r * per, (r + 1) * per)
        body += "".join(f"@p st.shared.f32 [w+{4 * group * (j - r * per)}], ${n + j}; " for j in js) + "bar.sync 0; "
        terms = [(s, j) for s in range(1, k_warps) for j in js]  # each value's adds in group order
        for start in range(0, len(terms), K_WARP_SUM_LOADS):
            batch = terms[start:start + K_WARP_SUM_LOADS]
            body += "".join(f"@!p ld.shared.f32 v{i}, [a+{stride * (s - 1) + 4 * group * (j - r * per)}]; "
                            for i, (s, j) in enumerate(batch))
            body += "".join(f"@!p add.f32 s{j}, s{j}, v{i}; " for i, (s, j) in enumerate(batch))
        body += "bar.sync 0; " if r < rounds - 1 else ""  # the reads before the next round's writes
    shift = group.bit_length() - 1
    return (
        f"{{ .shared .align 16 .b8 kr[{(k_warps - 1) * stride}]; .reg .b32 t, a, w; .reg .pred p; "
        f".reg .f32 v<{K_WARP_SUM_LOADS}>, s<{n}>; mov.u32 t, %tid.x; shr.u32 w, t, {shift}; setp.ne.u32 p, w, 0; "
        f"and.b32 t, t, {group - 1}; mov.u32 a, kr; mad.lo.u32 a, t, 4, a; "
        # group w > 0 writes at a + (w - 1) * stride
        f"mad.lo.u32 w, w, {stride}, a; sub.u32 w, w, {stride}; "
        + "".join(f"mov.b32 s{j}, ${n + j}; " for j in range(n))
        + body
        + "".join(f"mov.b32 ${j}, s{j}; " for j in range(n))
        + "}"
    )


def k_warp_sum_rounds(values: int, k_warps: int, group: int, other_bytes: int) -> int:
    """The fewest rounds (dividing `values`) whose `_k_warp_sum` buffer fits beside `other_bytes`
    of static shared memory."""
    return next(r for r in range(1, values + 1)
                if values % r == 0 and (k_warps - 1) * 4 * group * (values // r) + other_bytes <= STATIC_SHARED_BYTES)


# by (values per thread: `mma_gemv.output_slots`, warps or K slices, threads per group, rounds)
MMA_K_WARP_SUM_PTX = {(n, w, 32, 1): _k_warp_sum(n, w) for n in (2, 4, 6, 8, 12, 16) for w in (2, 4, 8, 16)} | {
    (n, w, 128, r): _k_warp_sum(n, w, 128, r) for n in (2, 4, 6, 8, 12, 16) for w in (2, 4, 8) for r in range(1, n + 1)
    if n % r == 0}


def _shared_b_slice(col_groups: int, slices: int) -> str:
    """PTX: with `slices` > 1, b += the K slice's two buffers (slice t >> 7) and s = its named barrier, 1 + slice."""
    size = 8 * col_groups * MMA_SHARED_B_ROW
    return "" if slices == 1 else f"shr.b32 s, t, 7; mad.lo.u32 b, s, {2 * size}, b; add.u32 s, s, 1; "


def _shared_b_store_address(col_groups: int, dst: str) -> str:
    """PTX: dst = b + where thread t writes, row (t >> 3) mod 8c at byte 16 (t & 7)."""
    return (f"shr.b32 u, t, 3; and.b32 u, u, {8 * col_groups - 1}; mad.lo.u32 a, u, {MMA_SHARED_B_ROW}, b; "
            f"and.b32 u, t, 7; shl.b32 u, u, 4; add.u32 {dst}, a, u; ")


def _shared_b_load_address(dst: str) -> str:
    """PTX: dst = b + where lane (g, q) of thread t reads, row g = lane >> 2 at byte 32 q."""
    return (f"bfe.u32 u, t, 2, 3; mad.lo.u32 a, u, {MMA_SHARED_B_ROW}, b; and.b32 u, t, 3; shl.b32 u, u, 5; "
            f"add.u32 {dst}, a, u; ")


def _shared_b_addresses(col_groups: int, slices: int = 1) -> str:
    """A thread's addresses for `_shared_b_exchange` (given), from %tid.x, made once before the K loop (made in the
    exchange every window they cost M = 16 nvfp4 x nvfp4 21 of 322 sm_90 instructions per two windows; as plain
    integer ops, not asm, ptxas made some of them again in the loop: 8 more): outputs $0 where it writes, $1 where its
    lane reads, both in the parity-0 buffer of its K slice (two 8c x MMA_SHARED_B_ROW buffers each), $2 the slice's
    named barrier (1 + slice; 0 with one slice); input $3 the address of a `shared_b_bytes(c, slices)` buffer
    (`shared_buffer_ptx`)."""
    return ("{ .reg .b32 t, a, b, u, s; mov.u32 t, %tid.x; mov.u32 b, $3; "
            + ("mov.u32 s, 0; " if slices == 1 else _shared_b_slice(col_groups, slices))
            + _shared_b_store_address(col_groups, "$0") + _shared_b_load_address("$1") + "mov.u32 $2, s; }")


def _shared_b_exchange(col_groups: int, wide: bool, slices: int = 1, given: bool = True) -> str:
    """Outputs $0 .. $(8 c - 1): the B registers of column groups 0 .. c - 1; inputs: the thread's 16 bytes (2 int64 if
    `wide`, else 4 int32), the window's parity, then, if `given`, `_shared_b_addresses`' three outputs; else the
    buffer's address, the addresses made here from %tid.x every window
    (two row groups per warp: held across the loop, they took 4 slices of mxfp8 x mxfp8 from 64 to 74 sm_90
    registers, past the 64 of the two 512-thread programs per SM that `plans.MMA_K_SLICES` counts). With one slice
    the program waits at the CTA barrier; with `slices` > 1 (K slices of a program, `mma_gemv_kernel` with
    K_WARPS > 1) each 128 threads exchange their own window in their own two buffers and wait at their own named
    barrier."""
    first, row = 8 * col_groups, MMA_SHARED_B_ROW
    n_in = 2 if wide else 4
    ins = ", ".join(f"${first + i}" for i in range(n_in))
    size = 8 * col_groups * row
    p, st, ld, bar = (f"${first + n_in + i}" for i in range(4))  # not given: st is the buffer
    loads = "".join(
        f"ld.shared.v4.b32 {{{', '.join(f'${8 * c + 4 * h + i}' for i in range(4))}}}, [a+{8 * c * row + 16 * h}]; "
        for c in range(col_groups) for h in range(2)
    )
    if given:
        store, load = f"mad.lo.u32 a, {p}, {size}, {st}; ", f"mad.lo.u32 a, {p}, {size}, {ld}; "
    else:
        store = (f"mov.u32 t, %tid.x; mov.u32 b, {st}; mad.lo.u32 b, {p}, {size}, b; "
                 + _shared_b_slice(col_groups, slices) + _shared_b_store_address(col_groups, "a"))
        load, bar = _shared_b_load_address("a"), "s"
    return (
        "{ .reg .b32 a, t, b, u, s; " + store + f"st.shared.v{n_in}.b{128 // n_in} [a], {{{ins}}}; "
        + ("bar.sync 0; " if slices == 1 else f"bar.sync {bar}, 128; ") + load + loads + "}"
    )


MMA_SHARED_B_ADDRESSES_PTX = {(c, s): _shared_b_addresses(c, s) for c in (1, 2) for s in (1, 2, 4, 8)}
# by (column groups, bf16 activation, K slices, addresses given)
MMA_SHARED_B_PTX = {(c, wide, s, given): _shared_b_exchange(c, wide, s, given) for c in (1, 2) for wide in (False, True)
                    for s in (1, 2, 4, 8) for given in (False, True)}


# 16 < M <= 64 (`mma_gemv.mma_m64_kernel`): the 256 threads of a program (8 warps) write one
# window of B, 64 activation rows as bf16 in K order (thread t: row t >> 2, K 16 (t & 3) .. + 16,
# 32 bytes: what the B registers of a lane hold, so the writes are `b_registers` of one lane
# each), wait at a CTA barrier and return the shared address of their lane's registers in
# column group 0 (row g, byte 32 q); `MMA_STEPS_M64_PTX[c]` reads column group c's 8 rows
# further. Rows MMA_SHARED_B_ROW bytes apart: the 16-byte writes and reads of a quarter-warp
# (2 rows x 4 lanes) fall on 8 distinct groups of 4 banks. Two buffers by window parity, as
# `MMA_SHARED_B_PTX`.
MMA_M64_B_ROWS = 64  # activation rows of one exchanged B window (one wgmma's N; two with 128-row programs)


def _m64_window_bytes(wgmma: bool, rows: int = MMA_M64_B_ROWS) -> int:
    """Bytes of one exchanged B window of `mma_m64_kernel`: `rows` rows of 64 bf16 (wgmma's core
    matrices, 128 bytes a row) or of MMA_SHARED_B_ROW bytes (padded rows read with ld.shared)."""
    return rows * (128 if wgmma else MMA_SHARED_B_ROW)


def m64_exchange_buffer(wgmma: bool, rows: int = MMA_M64_B_ROWS) -> tuple[int, int]:
    """(bytes, alignment) of the buffer of `MMA_M64_EXCHANGE_PTX` / `WGMMA_EXCHANGE_PTX` (`rows` 64) or
    `WGMMA_EXCHANGE_128_PTX` (128): two windows, aligned to 128 for wgmma's matrix descriptor."""
    return 2 * _m64_window_bytes(wgmma, rows), 128 if wgmma else 16


def _m64_exchange(wide: bool) -> str:
    """Output $0: the address; inputs: the thread's 32 bytes (4 int64 if `wide`, else 8
    int32), the window's parity, then the address of an `m64_exchange_buffer(False)` buffer
    (`shared_buffer_ptx`)."""
    row, n_in = MMA_SHARED_B_ROW, 4 if wide else 8
    size = _m64_window_bytes(False)
    vec = "v2.b64" if wide else "v4.b32"
    half = n_in // 2
    stores = "".join(
        f"st.shared.{vec} [a+{16 * h}], {{{', '.join(f'${1 + half * h + i}' for i in range(half))}}}; " for h in range(2)
    )
    return (
        f"{{ .reg .b32 t, a, b, u; mov.u32 t, %tid.x; mov.u32 b, ${2 + n_in}; "
        f"mad.lo.u32 b, ${1 + n_in}, {size}, b; "
        # write: row t >> 2, byte 32 (t & 3)
        f"shr.b32 u, t, 2; mad.lo.u32 a, u, {row}, b; and.b32 u, t, 3; shl.b32 u, u, 5; add.u32 a, a, u; "
        + stores + "bar.sync 0; "
        # read: row g = (t >> 2) & 7, byte 32 q
        + f"bfe.u32 u, t, 2, 3; mad.lo.u32 a, u, {row}, b; and.b32 u, t, 3; shl.b32 u, u, 5; add.u32 $0, a, u; }}"
    )


# by bf16 activation
MMA_M64_EXCHANGE_PTX = {wide: _m64_exchange(wide) for wide in (False, True)}
# by column group: its 4 mma steps with B read from the exchanged window
MMA_STEPS_M64_PTX = [_mma_steps(8, 8 * c * MMA_SHARED_B_ROW) for c in range(MMA_M64_B_ROWS // 8)]

# The same on sm_90a with wgmma (`mma_m64_kernel` with WGMMA): one wgmma.mma_async m64nNk16
# per 16 K of a warpgroup's 64 rows, A (the decoded weights) from registers as for mma.sync,
# B read by the tensor cores from shared memory. B's window is stored K-major without swizzle
# in 8-row x 16-byte core matrices: core matrix (row >> 3, k chunk j) at 1024 (row >> 3) + 128 j
# (LBO 128, SBO 1024 bytes), its rows 16 bytes apart. The weights' K order (layouts.mma: lane q
# of step s holds K 16q + 4s .. + 3 where mma.sync takes k 2q, 2q + 1, 2q + 8, 2q + 9) puts the
# writer's register 2s + h (K 16c + 4s + 2h, + 1 of row r, c = t & 3) at k 2c + 8h of step s:
# chunk 2s + h, bytes 4c .. + 3 of the row. A warp's 32 four-byte stores fill 128 contiguous bytes.
WGMMA_LBO, WGMMA_SBO = 128, 1024


def _wgmma_exchange(wide: bool, rows: int = MMA_M64_B_ROWS, shares: int | None = None) -> str:
    """Output $0: the window buffer's wgmma matrix descriptor (int64: start address >> 4, LBO
    >> 4 at bit 16, SBO >> 4 at bit 32, no swizzle); inputs: the thread's 8 B registers (4
    int64 if `wide`), with `rows` 128 then those of its row + 64 (stored 8 core-matrix rows further),
    the window's parity, then the address of an `m64_exchange_buffer(True, rows)` buffer
    (`shared_buffer_ptx`)."""
    size = _m64_window_bytes(True, rows)
    shares = shares or rows // MMA_M64_B_ROWS  # a thread's rows: t >> 2 (with 512 threads all 128), + 64 with two
    n_in = (4 if wide else 8) * shares
    regs = ("".join(f"mov.b64 {{w{2 * i}, w{2 * i + 1}}}, ${1 + i}; " for i in range(n_in)) if wide
            else "".join(f"mov.b32 w{i}, ${1 + i}; " for i in range(n_in)))
    stores = "".join(f"st.shared.b32 [a+{WGMMA_LBO * (j % 8) + 8 * WGMMA_SBO * (j // 8)}], w{j}; "
                     for j in range(8 * shares))
    return (
        f"{{ .reg .b32 t, a, b, u, lo, w<{8 * shares}>; mov.u32 t, %tid.x; mov.u32 b, ${2 + n_in}; "
        f"mad.lo.u32 b, ${1 + n_in}, {size}, b; " + regs
        # row r = t >> 2: 1024 (r >> 3) + 16 (r & 7); byte 4 (t & 3)
        + f"shr.b32 u, t, 5; mad.lo.u32 a, u, {WGMMA_SBO}, b; bfe.u32 u, t, 2, 3; mad.lo.u32 a, u, 16, a; "
        f"and.b32 u, t, 3; mad.lo.u32 a, u, 4, a; " + stores
        # the generic-proxy stores before the tensor cores' (async-proxy) reads, then the barrier
        + "fence.proxy.async.shared::cta; bar.sync 0; "
        # the start address: 14 bits of (address >> 4); sm_90 shared addresses carry the CTA's rank in a cluster at
        # bit 24 (not masked, it ran into the LBO field: garbage, or illegal addresses, in clusters of 2 .. 8)
        f"shr.b32 lo, b, 4; and.b32 lo, lo, 0x3fff; or.b32 lo, lo, {(WGMMA_LBO >> 4) << 16:#x}; "
        f"mov.b64 $0, {{lo, {WGMMA_SBO >> 4}}}; }}"
    )


def _wgmma_steps(col_groups: int) -> str:
    """$0 .. $(4c - 1) = accumulators + the window's 4 wgmma steps (N = 8c): A registers at
    $4c .. + 15 (4 per step, as `MMA_STEPS_PTX`), the descriptor at $4c + 16, accumulators
    after it. Accumulator 4 j + i is column group j's i (the mma.sync C layout per 8 columns)."""
    n, first = 4 * col_groups, 4 * col_groups
    d = ", ".join(f"d{i}" for i in range(n))
    steps = "".join(
        f"add.s64 e, ${first + 16}, {(2 * s * WGMMA_LBO) >> 4}; "
        f"wgmma.mma_async.sync.aligned.m64n{8 * col_groups}k16.f32.bf16.bf16 {{{d}}}, "
        f"{{{', '.join(f'${first + 4 * s + i}' for i in range(4))}}}, e, p, 1, 1, 0; "
        for s in range(4)
    )
    return (
        f"{{ .reg .f32 d<{n}>; .reg .b64 e; .reg .b32 one; .reg .pred p; mov.u32 one, 1; setp.ne.u32 p, one, 0; "
        + "".join(f"mov.b32 d{i}, ${first + 17 + i}; " for i in range(n))
        + "wgmma.fence.sync.aligned; " + steps + "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; "
        + "".join(f"mov.b32 ${i}, d{i}; " for i in range(n)) + "}"
    )


# by bf16 activation / by column groups (1 .. 8; mma_m64_kernel takes 3 .. 8)
WGMMA_EXCHANGE_PTX = {wide: _wgmma_exchange(wide) for wide in (False, True)}
# by (bf16 activation, shares a thread): 2 with 256 threads (rows r and r + 64), 1 with 512 (mma_m64_kernel's 16 warps)
WGMMA_EXCHANGE_128_PTX = {(wide, shares): _wgmma_exchange(wide, 2 * MMA_M64_B_ROWS, shares)
                          for wide in (False, True) for shares in (1, 2)}
WGMMA_STEPS_PTX = {c: _wgmma_steps(c) for c in range(1, MMA_M64_B_ROWS // 8 + 1)}


# Split-K of `mma_m64_kernel` summed in a thread-block cluster: the SPLIT programs of one output tile (the K parts,
# consecutive in the grid) launched as one cluster of SPLIT CTAs add their partial sums through distributed shared
# memory instead of fp32 atomics into a global workspace, a ticket and the last part's read-back (which cost about
# 6 of 35 us at M = 64, N = K = 8192 on the H100: docs/DECODE_NOTES.md, "Ablations"). Every CTA holds the same
# `values` accumulators per thread for the same output positions; CTA r owns values c r .. c r + c - 1 (c = values /
# split) of every thread. Each thread arrives once at the cluster barrier before its K loop (`CLUSTER_ARRIVE_PTX`,
# so no CTA writes into a peer that has not started) and its `MMA_CLUSTER_SUM_PTX` waits there before storing.
# The portable cluster size. Clusters of 16 (non-portable; Triton's launcher opts in) summed mma_gemv_kernel's split
# 16 at M = 16, 8192 x 28672 18-24% slower than the workspace atomics on the H100 (nvfp4 x nvfp4 68.1 against
# 55.7 us; bench/results/h100_mma_m16_cluster16_ab_n8192_k28672_69d2fae_2026-11-25.log).
CLUSTER_MAX_CTAS = 8
# Output $0: the CTA's cluster size (1 when launched without clusters); input: any 32-bit value (unused)
CLUSTER_ARRIVE_PTX = "barrier.cluster.arrive.relaxed.aligned; mov.u32 $0, %cluster_nctarank;"
# The other CTAs' arrivals at `CLUSTER_ARRIVE_PTX` (where no `MMA_CLUSTER_SUM_PTX` follows); output $0: 0
CLUSTER_WAIT_PTX = "barrier.cluster.wait.aligned; mov.u32 $0, 0;"

# Programmatic dependent launch (sm_90+; `launch.DirectLaunch` with `pdl`): a kernel launched with the programmatic
# stream serialization attribute may start while the kernel before it in the stream still runs, once every CTA of that
# one has executed `griddepcontrol.launch_dependents` (or exited); `griddepcontrol.wait` then blocks until that
# kernel has completed and its memory is visible. Without the attribute both are no-ops. Output $0 = input $1 (the
# thread's id: every address made from it, every load and store of the mma kernels, comes after the wait).
GRID_DEPENDENCY_WAIT_PTX = "griddepcontrol.wait; mov.b32 $0, $1;"
# Output $0 = input $1 (an accumulator, so it comes after the K loop that made it)
LAUNCH_DEPENDENTS_PTX = "griddepcontrol.launch_dependents; mov.b32 $0, $1;"

# Split-K sums of `mma_m64_kernel` in a workspace in fragment order (`mma_gemv.add_fragments`): a thread's 4
# accumulators of a column group at 16 contiguous bytes, so one vector reduction adds them (sm_90). $1 the address,
# $2-$5 the sums, $6 nonzero where the adds run (the CTA was launched without clusters); output $0: 0.
FRAGMENT_ADD_PTX = ("{ .reg .pred p; setp.ne.b32 p, $6, 0; @p red.relaxed.gpu.global.add.v4.f32 [$1], {$2, $3, $4, $5}; "
                    "mov.u32 $0, 0; }")
# The last part's read of a column group's totals at L2 (after the ticket's acquire): outputs $0-$3, address $4
FRAGMENT_LOAD_PTX = "ld.relaxed.gpu.global.v4.f32 {$0, $1, $2, $3}, [$4];"
# Zeros back over them for the next call: address $1; output $0: 0
FRAGMENT_ZERO_PTX = "st.global.v4.f32 [$1], {0f00000000, 0f00000000, 0f00000000, 0f00000000}; mov.u32 $0, 0;"


def cluster_sum_bytes(values: int, split: int, threads: int = 256) -> int:
    """Shared memory of `MMA_CLUSTER_SUM_PTX[values, split]`: a slot per other CTA of the values this one owns."""
    return (split - 1) * (values // split) * threads * 4


def _cluster_sum(values: int, split: int, threads: int = 256) -> str:
    """Outputs $0 .. $(c - 1): the thread's values c r .. c r + c - 1 (r = %cluster_ctarank) summed over the cluster's
    CTAs, its own first, then the others by rank; inputs $c .. $(c + values - 1): its fp32 values. Each CTA stores
    the values every other CTA owns into that CTA's buffer (`mapa`, st.shared::cluster) in the slot of its rank
    (ranks above the owner's one lower; within a slot vector v of thread t at v threads + t: a warp's stores are
    contiguous), waits at the cluster barrier (release / acquire) and adds its slots in order."""
    c = values // split
    width = next(w for w in (4, 2, 1) if c % w == 0)
    vec = f".v{width}" if width > 1 else ""
    slot = c * threads * 4

    def regs(names):
        return f"{{{', '.join(names)}}}" if width > 1 else names[0]

    body = ""
    for owner in range(split):
        body += (f"mov.u32 o, {owner}; setp.ne.u32 p, r, o; setp.gt.u32 q, r, o; selp.u32 s, 1, 0, q; sub.u32 s, r, s; "
                 f"mad.lo.u32 a, s, {slot}, b; mapa.shared::cluster.u32 d, a, o; ")
        body += "".join(f"@p st.shared::cluster{vec}.f32 [d+{v * threads * 4 * width}], "
                        f"{regs([f'${c + owner * c + v * width + i}' for i in range(width)])}; " for v in range(c // width))
        body += "".join(f"@!p mov.b32 y{k}, ${c + owner * c + k}; " for k in range(c))
    body += "barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned; "
    for s in range(split - 1):
        for v in range(c // width):
            body += f"ld.shared{vec}.f32 {regs([f'x{i}' for i in range(width)])}, [b+{s * slot + v * threads * 4 * width}]; "
            body += "".join(f"add.f32 y{v * width + i}, y{v * width + i}, x{i}; " for i in range(width))
    return (
        f"{{ .shared .align 16 .b8 cs[{cluster_sum_bytes(values, split, threads)}]; .reg .b32 t, r, o, s, a, b, d; "
        f".reg .pred p, q; .reg .f32 x<{width}>, y<{c}>; mov.u32 t, %tid.x; mov.u32 r, %cluster_ctarank; "
        f"mov.u32 b, cs; mad.lo.u32 b, t, {4 * width}, b; barrier.cluster.wait.aligned; "
        + body + "".join(f"mov.b32 ${k}, y{k}; " for k in range(c)) + "}"
    )


# by (values per thread, cluster size, threads per CTA): mma_m64_kernel 4 x column groups on 256 threads,
# mma_gemv_kernel 4 x row groups x column groups (4, 8 or 16) on 128
MMA_CLUSTER_SUM_PTX = {(4 * g, s, t): _cluster_sum(4 * g, s, t) for t, groups in ((256, MMA_M64_B_ROWS // 8), (128, 4))
                       for g in range(1, groups + 1) for s in (2, 4, 8) if 4 * g % s == 0}
