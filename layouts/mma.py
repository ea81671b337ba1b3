"""The "mma_m16k16" fp4 / fp8 weight layout: mma.sync A fragments, ready to decode in registers.

`kernels/mma_gemv.py` multiplies fp4 weights on bf16 tensor cores (mma.sync m16n8k16) at
decode sizes. Each thread of a warp holds the A fragment of one 16-row x 16-K tile in four
bf16x2 registers; this layout stores those 8 codes as the int32 word the thread loads, with
the bits already where the decode wants them:

- Rows are cut into groups of 16, K into windows of 64, a window into 4 steps of 16.
  Word (group gr, window w, step s, lane l) with l = 4g + q holds rows R0 = 16 gr + g and
  R1 = R0 + 8 at K = 64 w + 16 q + 4 s + j, j = 0..3 (so a lane's 16 K of a window are
  contiguous: one scale block, and one contiguous activation load). The words are stored
  in that order [gr, w, s, l], so a warp's load of one step is 128 contiguous bytes.
- The word's four registers are (R0, j 0/1), (R1, j 0/1), (R0, j 2/3), (R1, j 2/3), the
  lower j in the low 16 bits. In each 16-bit half the code's bits (sign, e1, e0, m) sit at
  `SLOTS[reg]`; register 0's slots are bf16's sign and the lowest exponent and highest
  mantissa bits, so `word & 0x81C081C0` is bf16(code * 2^-126) (the E2M1 subnormal lands on
  the bf16 subnormal). Registers 1 and 2 are the same after a shift left by 3 and 6,
  register 3 takes three shifts: 11 integer ops per 8 codes (`decode.MMA_A_FRAGMENTS_PTX`).
  Each 16-bit half of an E2M1 word, code of register r as (s.r, e1.r, e0.r, m.r):

      bit   15   14   13   12   11   10    9    8    7    6    5    4    3    2    1    0
            s.0  s.3  e1.3 s.1  e0.3 m.3  s.2  e1.0 e0.0 m.0  e1.1 e0.1 m.1  e1.2 e0.2 m.2
      bf16  sign [---------- exponent (8 bits) ----------]  [------- mantissa (7) --------]

      reg 0 = word & 0x81C0                      (s.0 -> 15, e1 e0 m.0 stay at 8 7 6)
      reg 1 = (word << 3) & 0x81C0               (12 -> 15, 5 4 3 -> 8 7 6)
      reg 2 = (word << 6) & 0x81C0               (9 -> 15, 2 1 0 -> 8 7 6)
      reg 3 = (word >> 4) & 0x00C0 | (word >> 5) & 0x0100 | (word << 1) & 0x8000
                                                 (11 10 -> 7 6, 13 -> 8, 14 -> 15)

The scales become one byte per (row, block), `factor_bytes`: the exponent field (mx) or a
normalized 5-bit exponent and 3 mantissa bits (nvfp4) of the bf16 factor
f = scale * 2^(126 - shift), which one bf16x2 multiply applies to the decoded code
(code * 2^-126 * f = code * scale * 2^-shift, exact); the kernel multiplies its fp32 result
by 2^shift. Stored [gr, w, block of the window, g, R0/R1], so a lane loads its two rows'
bytes as one 16-bit word.

mxfp8 weights (E4M3) take the same fragments, 8 bytes per word (`ELEMENTS["e4m3"]`): the low
32 bits hold registers 0 and 1, the high 32 bits 2 and 3. Register 0's codes sit under the
bf16 fields (sign at bit 15, exponent and mantissa at bits 4-10 of each half: bf16(value *
2^-120), subnormals on bf16 subnormals), so `word & 0x87F087F0` is it; register 1's fill the
16 other bits so that `((word << 4) & 0x80F080F0) | ((word >> 4) & 0x07000700)` moves them
there: 6 integer ops per 4 codes, against 11 per 8 for E2M1. E4M3 factors are
f = scale * 2^(120 - shift).
"""

from __future__ import annotations

import torch

from .fp4 import pack_codes, unpack_codes

GROUP_ROWS = 16
WINDOW_K = 64
# E2M1: bit positions (sign, e1, e0, m) of a code in each 16-bit half of the four registers.
SLOTS = ((15, 8, 7, 6), (12, 5, 4, 3), (9, 2, 1, 0), (14, 13, 11, 10))
# Per register: (row half 0 = R0 / 1 = R1, first j of its two K).
_REGS = ((0, 0), (1, 0), (0, 2), (1, 2))
NVFP4_SHIFT = 7  # nvfp4: f = scale * 2^119 in bf16 for every finite E4M3 scale
NVFP4_BIAS = 237  # bf16 exponent field of a stored nvfp4 factor byte's exponent 0


def _e4m3_position(reg: int, part: int, bit: int) -> int:
    """Where bit `bit` (7 = sign) of an E4M3 code of register `reg`, half `part` sits in its 64-bit
    word: under bf16's field (sign 15, bits 0-6 at 4-10) for registers 0 and 2; registers 1 and 3
    come from 4 bits lower (targets 4-7 and 15) or 4 higher (targets 8-10) of the same 32 bits."""
    t = 15 if bit == 7 else 4 + bit
    if reg % 2:
        t = t + 4 if 8 <= t <= 10 else t - 4
    return 32 * (reg // 2) + 16 * part + t


class Placement:
    """How one element encoding sits in the layout's words: code bits, word bits, the bit
    position of every code bit by (register, half), and the decoded bf16's exponent offset
    (the decode gives bf16(value * 2^-decode_shift)) and smallest nonzero exponent."""

    def __init__(self, code_bits: int, word_bits: int, position, decode_shift: int, min_exp: int):
        self.code_bits, self.word_bits, self.decode_shift, self.min_exp = code_bits, word_bits, decode_shift, min_exp
        self.positions = tuple(
            tuple(tuple(position(reg, part, bit) for bit in range(code_bits)) for part in range(2)) for reg in range(4)
        )

    @property
    def magnitude_mask(self) -> int:
        return (1 << (self.code_bits - 1)) - 1


ELEMENTS = {
    "e2m1": Placement(4, 32, lambda reg, part, bit: SLOTS[reg][3 - bit] + 16 * part, 126, -1),
    "e4m3": Placement(8, 64, _e4m3_position, 120, -9),
}


# The stored shape pads rows to whole programs of the widest mma kernel (128 weight rows) and K to
# whole 64-K windows, so every N and K takes the mma kernels; the padding is zero codes.
PAD_ROWS = 128


def mma_stored_shape(rows: int, k: int) -> tuple[int, int]:
    """The [rows, K] that "mma_m16k16" data of logical [rows, K] holds: zero codes appended."""
    return -(-rows // PAD_ROWS) * PAD_ROWS, -(-k // WINDOW_K) * WINDOW_K


def holds_shape(rows: int, k: int) -> bool:
    """Whether [rows, K] cuts into whole 16-row groups and 64-K windows."""
    return rows % GROUP_ROWS == 0 and k % WINDOW_K == 0


def holds(element: str, rows: int, k: int) -> bool:
    """Whether [rows, K] elements of this encoding can be stored "mma_m16k16"."""
    return element in ELEMENTS and holds_shape(rows, k)


def check_mma_shape(rows: int, k: int) -> None:
    if not holds_shape(rows, k):
        raise ValueError(
            f"data_layout: 'mma_m16k16' needs rows % {GROUP_ROWS} == 0 and K % {WINDOW_K} == 0, got [{rows}, {k}]"
        )


def _placement(element: str) -> Placement:
    if element not in ELEMENTS:
        raise ValueError(f"element: 'mma_m16k16' holds {sorted(ELEMENTS)} elements, got {element!r}")
    return ELEMENTS[element]


def element_codes(data: torch.Tensor, element: str) -> torch.Tensor:
    """k_order data bytes -> int64 codes [rows, K] (E2M1 unpacked from [rows, K/2])."""
    codes = data.view(torch.uint8).to(torch.int64)
    return unpack_codes(codes) if _placement(element).code_bits == 4 else codes


def element_bytes(codes: torch.Tensor, element: str) -> torch.Tensor:
    """Codes [rows, K] -> k_order uint8 bytes (inverse of `element_codes`)."""
    return pack_codes(codes) if _placement(element).code_bits == 4 else codes.to(torch.uint8).contiguous()


def _fragments(codes: torch.Tensor) -> torch.Tensor:
    """codes [rows, K] -> [gr, w, s, g, q, half R0/R1, j] (a view in the layout's order)."""
    rows, k = codes.shape
    c = codes.reshape(rows // 16, 2, 8, k // 64, 4, 4, 4)  # gr, half, g, w, q, s, j
    return c.permute(0, 3, 5, 2, 4, 1, 6)


def _word_bytes(word: torch.Tensor, word_bits: int) -> torch.Tensor:
    """int64 words (the low `word_bits` bits used) -> their little-endian bytes."""
    if word_bits == 32:
        word = word.to(torch.uint32)
    return word.view(torch.uint8)


def arrange_mma_m16k16(data: torch.Tensor, element: str = "e2m1") -> torch.Tensor:
    """k_order bytes -> "mma_m16k16" uint8 bytes of the same shape: E2M1 [rows, K/2] or E4M3
    [rows, K] (any 1-byte dtype). Raises ValueError for E4M3 NaN codes (no bf16 holds them
    in place)."""
    return arrange_mma_codes(element_codes(data, element), element)


def arrange_mma_codes(codes: torch.Tensor, element: str) -> torch.Tensor:
    """Codes [rows, K] (`element_codes`) -> "mma_m16k16" uint8 bytes [rows, K * code bits / 8]
    (`arrange_mma_m16k16` without reading the codes out of k_order bytes)."""
    place = _placement(element)
    rows, k = codes.shape
    check_mma_shape(rows, k)
    if place.code_bits == 8 and bool(((codes & 0x7F) == 0x7F).any()):
        raise ValueError("data: NaN elements (E4M3 0x7F / 0xFF) cannot be arranged as 'mma_m16k16'; keep k_order")
    frag = _fragments(codes)
    word = torch.zeros(frag.shape[:5], dtype=torch.int64, device=codes.device)
    for reg, (row_half, j0) in enumerate(_REGS):
        for part in range(2):
            code = frag[..., row_half, j0 + part]
            for bit, pos in enumerate(place.positions[reg][part]):
                word |= ((code >> bit) & 1) << pos
    return _word_bytes(word, place.word_bits).reshape(rows, k * place.code_bits // 8).contiguous()


def unarrange_mma_m16k16(data: torch.Tensor, element: str = "e2m1") -> torch.Tensor:
    """"mma_m16k16" bytes -> k_order uint8 bytes (inverse of `arrange_mma_m16k16`)."""
    place = _placement(element)
    rows = data.shape[0]
    k = data.shape[1] * 8 // place.code_bits
    check_mma_shape(rows, k)
    raw = data.contiguous().view(torch.uint8)
    word = (raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) if place.word_bits == 32 else raw.view(torch.int64)
    word = word.reshape(rows // 16, k // 64, 4, 8, 4)
    frag = torch.zeros((*word.shape, 2, 4), dtype=torch.int64, device=data.device)
    for reg, (row_half, j0) in enumerate(_REGS):
        for part in range(2):
            code = torch.zeros_like(word)
            for bit, pos in enumerate(place.positions[reg][part]):
                code |= ((word >> pos) & 1) << bit
            frag[..., row_half, j0 + part] = code
    codes = frag.permute(0, 5, 3, 1, 4, 2, 6).reshape(rows, k)  # back to gr, half, g, w, q, s, j
    return element_bytes(codes, element)


def factor_bytes(scales: torch.Tensor, encoding: str, block: int, codes_zero: torch.Tensor,
                 element: str = "e2m1") -> tuple[torch.Tensor, int]:
    """Row-major scale codes [rows, K/block] -> (factor bytes in the layout's order, shift).

    `codes_zero`: bool [rows, K/block], True where every code of the block is +-0 (such
    blocks may hold any factor). Raises ValueError for scales the bf16 factor cannot hold:
    NaN codes, and E8M0 sets spanning more than bf16's exponents allow (2^126 for E2M1,
    2^124 for E4M3 elements; see below).
    """
    place = _placement(element)
    rows, cols = scales.shape
    b = scales.view(torch.uint8).to(torch.int32)
    if encoding == "e8m0":
        if bool(((b == 255) & ~codes_zero).any()):
            raise ValueError("scale: NaN scale codes (255) cannot be arranged as 'mma_m16k16'; keep k_order")
        # the factor's bf16 exponent field is code + decode_shift - shift <= 254
        shift = max(0, int(torch.where(codes_zero, 0, b).max()) + place.decode_shift - 254)
        # every nonzero element * scale * 2^-shift must be a bf16 normal (>= 2^-126) to stay exact
        low = shift + 1 - place.min_exp
        if bool(((b < low) & ~codes_zero).any()):
            raise ValueError(
                f"scale: E8M0 codes below {low} (scales under 2^{low - 127}) next to codes up to "
                f"{shift + 254 - place.decode_shift} do not fit 'mma_m16k16' exactly (bf16 holds element * scale * "
                "2^-shift); keep k_order"
            )
        stored = torch.where(codes_zero, 127, b + place.decode_shift - shift)
    elif encoding == "e4m3":
        if element != "e2m1":
            raise ValueError(f"encoding: 'mma_m16k16' takes E4M3 scales with E2M1 elements (nvfp4), got {element!r}")
        if bool((((b & 0x7F) == 0x7F) & ~codes_zero).any()):
            raise ValueError("scale: NaN scale codes cannot be arranged as 'mma_m16k16'; keep k_order")
        shift = NVFP4_SHIFT
        e, m = (b >> 3) & 15, b & 7
        p = torch.where(m >= 4, 2, torch.where(m >= 2, 1, 0))  # subnormals m * 2^-9, normalized
        exp = torch.where(e > 0, e - 7, p - 9)
        mant = torch.where(e > 0, m, (m << (3 - p)) & 7)
        stored = torch.where(codes_zero | ((b & 0x7F) == 0), 0, ((exp + 9) << 3) | mant)
    else:
        raise ValueError(f"encoding: unknown scale encoding {encoding!r}")
    per_window = WINDOW_K // block
    out = stored.reshape(rows // 16, 2, 8, cols // per_window, per_window).permute(0, 3, 4, 2, 1)
    return out.to(torch.uint8).contiguous().reshape(-1), shift


def factor_value(stored: torch.Tensor, encoding: str) -> torch.Tensor:
    """Stored factor bytes -> the float32 factor f (scale * 2^(decode_shift - shift)), exact;
    what the kernel's bf16 factor holds."""
    b = stored.to(torch.int32)
    if encoding == "e8m0":
        bits = b << 23
    else:
        bits = ((b << 4) + (NVFP4_BIAS << 7)) << 16
    return bits.view(torch.float32)


def zero_scale_codes(codes: torch.Tensor, scales: torch.Tensor, encoding: str, block: int) -> torch.Tensor:
    """Codes [rows, K] with the codes of E4M3 blocks of scale +-0 set to 0 (their values are 0
    either way; the factor byte has no zero). Raises ValueError for negative E4M3 scales of
    blocks with nonzero codes (the factor byte has no sign)."""
    rows, k = codes.shape
    if encoding != "e4m3":
        return codes
    b = scales.view(torch.uint8).to(torch.int32)[..., None]
    c = torch.where((b & 0x7F) == 0, 0, codes.reshape(rows, k // block, block))
    if bool((((b & 0x80) != 0) & ((c & 7) != 0)).any()):
        raise ValueError("scale: negative E4M3 scales cannot be arranged as 'mma_m16k16' (its factors are unsigned); keep k_order")
    return c.reshape(rows, k)
