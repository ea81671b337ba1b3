"""Element and scale codecs in pure torch (CPU or GPU), written for clarity, not speed.

These are the oracles: tests check them exhaustively over every code, and the kernels'
decode helpers are checked against them.
"""

from __future__ import annotations

import torch

# E2M1 codes 0..15 (sign bit 3, exponent bits 2..1, mantissa bit 0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Midpoints between consecutive E2M1 magnitudes [0, .5, 1, 1.5, 2, 3, 4, 6] and whether a
# value exactly on the midpoint rounds up: ties go to the even code (mantissa bit 0).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIE_UP = (False, True, False, True, False, True, False)

E8M0_NAN = 255
E8M0_BIAS = 127


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (low 4 bits used) -> float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[(codes & 0xF).long()]


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float32 -> E2M1 codes (uint8), round to nearest, ties to even, saturating at 6.

    The sign is kept for every input, zero included (-0.0 and -0.1 give code 8).
    NaN encodes as +0 (code 0): quantizers give a NaN block a NaN scale, which is what
    carries the NaN through dequantization.
    """
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for mid, tie_up in zip(_E2M1_MIDPOINTS, _E2M1_TIE_UP, strict=True):
        code += (mag >= mid if tie_up else mag > mid).to(torch.uint8)
    sign = torch.signbit(x) & ~torch.isnan(x)
    return code | (sign.to(torch.uint8) << 3)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes -> [..., K // 2] bytes; the even-K element goes in the LOW nibble.

    This is torch.float4_e2m1fn_x2's, cuBLAS's and Triton's convention.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: last dimension must be even to pack fp4, got {codes.shape[-1]}")
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # (not -1: no rows is a shape too)
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K // 2] bytes -> [..., K] uint8 codes (inverse of `pack_fp4`)."""
    packed = packed.view(torch.uint8)
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def decode_e8m0(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8 or float8_e8m0fnu) -> float32 2^(code - 127); code 255 -> NaN.

    Code 0 is 2^-127, an fp32 subnormal (exactly representable).
    """
    c = codes.view(torch.uint8).to(torch.float64)
    value = torch.exp2(c - E8M0_BIAS)
    return torch.where(c == E8M0_NAN, torch.nan, value).to(torch.float32)


def decode_e4m3(codes: torch.Tensor) -> torch.Tensor:
    """E4M3 (float8_e4m3fn) bytes -> float32, from the bit fields (no torch cast).

    Exponent bias 7, subnormals m * 2^-9, no infinity, |code| == 0x7F is NaN.
    """
    b = codes.view(torch.uint8).to(torch.int32)
    sign = torch.where((b & 0x80) != 0, -1.0, 1.0).to(torch.float64)
    e = (b >> 3) & 0xF
    m = (b & 0x7).to(torch.float64)
    normal = (1.0 + m / 8) * torch.exp2((e - 7).to(torch.float64))
    subnormal = m / 8 * 2.0**-6
    value = sign * torch.where(e == 0, subnormal, normal)
    return torch.where((b & 0x7F) == 0x7F, torch.nan, value).to(torch.float32)


def decode_elements(data: torch.Tensor, element: str) -> torch.Tensor:
    """Stored element data -> float32 values, by the format's element encoding."""
    if element == "e2m1":
        return decode_e2m1(unpack_fp4(data))
    if element == "e4m3":
        return decode_e4m3(data)
    if element == "bf16":
        return data.to(torch.float32)
    raise ValueError(f"element: unknown element encoding {element!r}")


def decode_scales(scales: torch.Tensor, encoding: str) -> torch.Tensor:
    """Stored scale codes -> float32 values, by the format's scale encoding."""
    if encoding == "e8m0":
        return decode_e8m0(scales)
    if encoding == "e4m3":
        return decode_e4m3(scales)
    raise ValueError(f"encoding: unknown scale encoding {encoding!r}")
