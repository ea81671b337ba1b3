"""Packed fp4 bytes <-> codes, for the data layouts: the even-K code in the low nibble."""

from __future__ import annotations

import torch


def unpack_codes(data: torch.Tensor) -> torch.Tensor:
    """Bytes [rows, K/2] -> codes [rows, K] (same dtype)."""
    return torch.stack([data & 15, data >> 4], dim=-1).reshape(data.shape[0], -1)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Codes [rows, K] (0..15, any integer dtype) -> uint8 bytes [rows, K/2] (inverse of `unpack_codes`)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).contiguous()
