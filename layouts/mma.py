"""The "mma_m16k16" fp4 weight layout: mma.sync A fragments, ready to decode in registers.

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

The scales become one byte per (row, block), `factor_bytes`: the exponent field (mx) or a
normalized 5-bit exponent and 3 mantissa bits (nvfp4) of the bf16 factor
f = scale * 2^(126 - shift), which one bf16x2 multiply applies to the decoded code
(code * 2^-126 * f = code * scale * 2^-shift, exact); the kernel multiplies its fp32 result
by 2^shift. Stored [gr, w, block of the window, g, R0/R1], so a lane loads its two rows'
bytes as one 16-bit word.
"""

from __future__ import annotations

import torch

from .fp4 import pack_codes, unpack_codes

GROUP_ROWS = 16
WINDOW_K = 64
# Bit positions (sign, e1, e0, m) of a code in each 16-bit half of the four registers.
SLOTS = ((15, 8, 7, 6), (12, 5, 4, 3), (9, 2, 1, 0), (14, 13, 11, 10))
# Per register: (row half 0 = R0 / 1 = R1, first j of its two K).
_REGS = ((0, 0), (1, 0), (0, 2), (1, 2))
NVFP4_SHIFT = 7  # nvfp4: f = scale * 2^119 in bf16 for every finite E4M3 scale
NVFP4_BIAS = 237  # bf16 exponent field of a stored nvfp4 factor byte's exponent 0


def holds_shape(rows: int, k: int) -> bool:
    """Whether [rows, K] cuts into whole 16-row groups and 64-K windows."""
    return rows % GROUP_ROWS == 0 and k % WINDOW_K == 0


def check_mma_shape(rows: int, k: int) -> None:
    if not holds_shape(rows, k):
        raise ValueError(
            f"data_layout: 'mma_m16k16' needs rows % {GROUP_ROWS} == 0 and K % {WINDOW_K} == 0, got [{rows}, {k}]"
        )


def _fragments(codes: torch.Tensor) -> torch.Tensor:
    """codes [rows, K] -> [gr, w, s, g, q, half R0/R1, j] (a view in the layout's order)."""
    rows, k = codes.shape
    c = codes.reshape(rows // 16, 2, 8, k // 64, 4, 4, 4)  # gr, half, g, w, q, s, j
    return c.permute(0, 3, 5, 2, 4, 1, 6)


def arrange_mma_m16k16(data: torch.Tensor) -> torch.Tensor:
    """k_order fp4 bytes [rows, K/2] -> "mma_m16k16" bytes [rows, K/2] (same size)."""
    rows, half = data.shape
    check_mma_shape(rows, 2 * half)
    frag = _fragments(unpack_codes(data))
    word = torch.zeros(frag.shape[:5], dtype=torch.int64, device=data.device)
    for reg, (row_half, j0) in enumerate(_REGS):
        for part in range(2):
            code = frag[..., row_half, j0 + part].to(torch.int64)
            for bit, pos in zip((3, 2, 1, 0), SLOTS[reg]):
                word |= ((code >> bit) & 1) << (pos + 16 * part)
    return word.to(torch.uint32).view(torch.uint8).reshape(rows, half).contiguous()


def unarrange_mma_m16k16(data: torch.Tensor) -> torch.Tensor:
    """"mma_m16k16" bytes [rows, K/2] -> k_order bytes (inverse of `arrange_mma_m16k16`)."""
    rows, half = data.shape
    k = 2 * half
    check_mma_shape(rows, k)
    word = data.contiguous().view(torch.int32).to(torch.int64).reshape(rows // 16, k // 64, 4, 8, 4)
    frag = torch.zeros((*word.shape, 2, 4), dtype=torch.int64, device=data.device)
    for reg, (row_half, j0) in enumerate(_REGS):
        for part in range(2):
            code = torch.zeros_like(word)
            for bit, pos in zip((3, 2, 1, 0), SLOTS[reg]):
                code |= ((word >> (pos + 16 * part)) & 1) << bit
            frag[..., row_half, j0 + part] = code
    codes = frag.permute(0, 5, 3, 1, 4, 2, 6).reshape(rows, k)  # back to gr, half, g, w, q, s, j
    return pack_codes(codes)


def factor_bytes(scales: torch.Tensor, encoding: str, block: int, codes_zero: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Row-major scale codes [rows, K/block] -> (factor bytes in the layout's order, shift).

    `codes_zero`: bool [rows, K/block], True where every code of the block is +-0 (such
    blocks may hold any factor). Raises ValueError for scales the bf16 factor cannot hold:
    NaN codes, and E8M0 sets spanning more than 2^126 (see below).
    """
    rows, cols = scales.shape
    b = scales.view(torch.uint8).to(torch.int32)
    if encoding == "e8m0":
        if bool(((b == 255) & ~codes_zero).any()):
            raise ValueError("scale: NaN scale codes (255) cannot be arranged as 'mma_m16k16'; keep k_order")
        shift = max(0, int(torch.where(codes_zero, 0, b).max()) - 128)
        # every nonzero code * scale * 2^-shift must be a bf16 normal (>= 2^-126) to stay exact
        if bool(((b < shift + 2) & ~codes_zero).any()):
            raise ValueError(
                f"scale: E8M0 codes below {shift + 2} (scales under 2^{shift - 125}) next to codes up to {shift + 128} "
                "do not fit 'mma_m16k16' exactly (bf16 holds code * scale * 2^-shift); keep k_order"
            )
        stored = torch.where(codes_zero, 127, b + 126 - shift)
    elif encoding == "e4m3":
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
    """Stored factor bytes -> the float32 factor f (scale * 2^(126 - shift)), exact; what the
    kernel's bf16 factor holds."""
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
