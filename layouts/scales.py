"""Scale-factor layouts: forward, exact inverse, and the in-kernel index function.

Logical scales are S[rows, cols] with cols = K // block. Every layout pads with zero
codes; `padded_scale_shape` is the one place that says how far.

- "rowmajor":        S itself, [rows, cols].
- "swizzle_32_4_4":  PyTorch's SWIZZLE_32_4_4 = cuBLAS "128x4 blocked" = torchao
                     `to_blocked` = the Triton tutorial's 5D preshuffle, stored flat.
- "cdna4_32"/"cdna4_16": AMD CDNA4 (gfx950) scale shuffles for 32x32 / 16x16 MFMA,
                     stored [rows_p // 32, cols_p * 32].
"""

from __future__ import annotations

import torch


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


_PAD = {"rowmajor": (1, 1), "swizzle_32_4_4": (128, 4), "cdna4_16": (32, 8), "cdna4_32": (32, 8)}


def padded_scale_shape(layout: str, rows: int, cols: int) -> tuple[int, int]:
    """(rows_p, cols_p) of the logical scale matrix once padded for `layout`."""
    try:
        rm, cm = _PAD[layout]
    except KeyError:
        raise ValueError(
            f"layout: unknown scale layout {layout!r}; expected one of {sorted(_PAD)}"
        ) from None
    return _ceil_to(rows, rm), _ceil_to(cols, cm)


def stored_scale_shape(layout: str, rows: int, cols: int) -> tuple[int, ...]:
    """Shape of the stored scale tensor for logical scales [rows, cols]."""
    rows_p, cols_p = padded_scale_shape(layout, rows, cols)
    if layout == "rowmajor":
        return (rows, cols)
    if layout == "swizzle_32_4_4":
        return (rows_p * cols_p,)
    return (rows_p // 32, cols_p * 32)


def pad_to(scales: torch.Tensor, rows_p: int, cols_p: int) -> torch.Tensor:
    """[rows, cols] with zeros appended up to [rows_p, cols_p] (itself where it is that shape)."""
    rows, cols = scales.shape
    if (rows, cols) == (rows_p, cols_p):
        return scales
    out = torch.zeros((rows_p, cols_p), dtype=scales.dtype, device=scales.device)
    out[:rows, :cols] = scales
    return out


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    # Permutes on float8 dtypes are not implemented on every device; bytes always are.
    return t.view(torch.uint8) if t.element_size() == 1 else t


def swizzle_32_4_4_offset(r, c, cols: int):
    """Flat offset of logical scale (r, c) in the SWIZZLE_32_4_4 buffer.

    Works on Python ints and on integer tensors (this is what kernels call in their
    bodies). `cols` is the logical column count (K // block); padding is implied.
    """
    tiles_per_row = _ceil_to(cols, 4) // 4
    # shifts and masks, not // and %: on int32 tensors those cost sign fix-ups (r, c >= 0). sm_90 mma K loop,
    # M = 16, 8192^2, per two windows: nvfp4 x nvfp4 329 -> 314 instructions, mxfp4 x mxfp4 314 -> 301
    return (
        ((r >> 7) * tiles_per_row + (c >> 2)) * 512
        + (r & 31) * 16
        + ((r & 127) >> 5) * 4
        + (c & 3)
    )


def swizzle_32_4_4(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] -> flat buffer of rows_p * cols_p codes in SWIZZLE_32_4_4 order."""
    rows, cols = scales.shape
    rows_p, cols_p = padded_scale_shape("swizzle_32_4_4", rows, cols)
    padded = _as_bytes(pad_to(scales, rows_p, cols_p))
    # logical (rb*128 + q*32 + i, cb*4 + j) -> storage order (rb, cb, i, q, j)
    tiles = padded.view(rows_p // 128, 4, 32, cols_p // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(-1).view(scales.dtype)


def unswizzle_32_4_4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Exact inverse of `swizzle_32_4_4`: flat buffer -> [rows, cols]."""
    rows_p, cols_p = padded_scale_shape("swizzle_32_4_4", rows, cols)
    if flat.numel() != rows_p * cols_p:
        raise ValueError(
            f"flat: expected {rows_p * cols_p} scale codes for logical scales "
            f"[{rows}, {cols}] (padded to [{rows_p}, {cols_p}]), got {flat.numel()}"
        )
    tiles = _as_bytes(flat).reshape(rows_p // 128, cols_p // 4, 32, 4, 4)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(rows_p, cols_p)
    return padded[:rows, :cols].contiguous().view(flat.dtype)


def swizzle_32_4_4_5d(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The Triton tutorial's (rows_p//128, cols_p//4, 32, 4, 4) view of the same buffer."""
    rows_p, cols_p = padded_scale_shape("swizzle_32_4_4", rows, cols)
    return flat.view(rows_p // 128, cols_p // 4, 32, 4, 4)


# CDNA4: (view shape, permutation) for each MFMA size, as in AMD's Triton tutorial.
def _cdna4_plan(mfma_nonkdim: int, rows: int, cols: int):
    if mfma_nonkdim not in (16, 32):
        raise ValueError(f"mfma_nonkdim: expected 16 or 32, got {mfma_nonkdim!r}")
    rows_p, cols_p = padded_scale_shape(f"cdna4_{mfma_nonkdim}", rows, cols)
    if mfma_nonkdim == 32:
        view, perm = (rows_p // 32, 32, cols_p // 8, 4, 2, 1), (0, 2, 4, 1, 3, 5)
    else:
        view, perm = (rows_p // 32, 2, 16, cols_p // 8, 2, 4, 1), (0, 3, 5, 2, 4, 1, 6)
    return rows_p, cols_p, view, perm


def cdna4_shuffle(scales: torch.Tensor, mfma_nonkdim: int) -> torch.Tensor:
    """[rows, cols] -> [rows_p // 32, cols_p * 32] in AMD CDNA4 MFMA scale order."""
    rows, cols = scales.shape
    rows_p, cols_p, view, perm = _cdna4_plan(mfma_nonkdim, rows, cols)
    padded = _as_bytes(pad_to(scales, rows_p, cols_p))
    out = padded.view(view).permute(perm).contiguous().view(rows_p // 32, cols_p * 32)
    return out.view(scales.dtype)


def cdna4_unshuffle(shuffled: torch.Tensor, mfma_nonkdim: int, rows: int, cols: int) -> torch.Tensor:
    """Exact inverse of `cdna4_shuffle`."""
    rows_p, cols_p, view, perm = _cdna4_plan(mfma_nonkdim, rows, cols)
    if tuple(shuffled.shape) != (rows_p // 32, cols_p * 32):
        raise ValueError(
            f"shuffled: expected shape {(rows_p // 32, cols_p * 32)} for logical scales "
            f"[{rows}, {cols}], got {tuple(shuffled.shape)}"
        )
    inverse = [perm.index(i) for i in range(len(perm))]
    permuted_shape = [view[p] for p in perm]
    padded = _as_bytes(shuffled).reshape(permuted_shape).permute(inverse).reshape(rows_p, cols_p)
    return padded[:rows, :cols].contiguous().view(shuffled.dtype)


def cdna4_offset(r, c, cols: int, mfma_nonkdim: int):
    """Flat offset of logical scale (r, c) in the `cdna4_shuffle` output (ints or tensors)."""
    groups = _ceil_to(cols, 8) // 8
    r0, r1, c0, c1 = r >> 5, r & 31, c >> 3, c & 7  # as swizzle_32_4_4_offset: shifts, masks
    if mfma_nonkdim == 32:  # (r0, c0, c%2, r%32, (c%8)//2)
        return ((r0 * groups + c0) * 2 + (c1 & 1)) * 128 + r1 * 4 + (c1 >> 1)
    # 16: (r0, c0, c%4, r%16, (c%8)//4, (r%32)//16)
    return ((((r0 * groups + c0) * 4 + (c1 & 3)) * 16 + (r1 & 15)) * 2 + (c1 >> 2)) * 2 + (r1 >> 4)


def scale_offset(layout: str, r, c, cols: int):
    """Flat offset of logical scale (r, c) in the stored tensor of `layout` (kernels call this)."""
    if layout == "rowmajor":
        return r * cols + c
    if layout == "swizzle_32_4_4":
        return swizzle_32_4_4_offset(r, c, cols)
    return cdna4_offset(r, c, cols, int(layout.split("_")[1]))


def to_layout(scales: torch.Tensor, layout: str) -> torch.Tensor:
    """Row-major logical scales -> stored tensor in `layout`."""
    padded_scale_shape(layout, 1, 1)  # validates the name
    if layout == "rowmajor":
        return scales.contiguous()
    if layout == "swizzle_32_4_4":
        return swizzle_32_4_4(scales)
    return cdna4_shuffle(scales, int(layout.split("_")[1]))


def from_layout(stored: torch.Tensor, layout: str, rows: int, cols: int) -> torch.Tensor:
    """Stored scales in `layout` -> row-major logical scales [rows, cols]."""
    padded_scale_shape(layout, 1, 1)
    if layout == "rowmajor":
        return stored
    if layout == "swizzle_32_4_4":
        return unswizzle_32_4_4(stored, rows, cols)
    return cdna4_unshuffle(stored, int(layout.split("_")[1]), rows, cols)
