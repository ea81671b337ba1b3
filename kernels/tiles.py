"""Tile loaders shared by the kernels: packed data columns and scale codes for K groups.

The K loop of every kernel runs over groups of U logical elements; these helpers turn a
group tile `g` into masked loads of one operand's bytes and scale codes, with the scale
layout indexed in place through `blockscaled.layouts.scale_offset`.
"""

from __future__ import annotations

import helion.language as hl

from blockscaled.formats import SCALE_LAYOUTS
from blockscaled.layouts import scale_offset


def load_data(data, rows_tile, g, U, K, ELEMS_PER_WORD):
    """Stored columns of K groups `g`: [rows, g*U / ELEMS_PER_WORD], zero past K.
    ELEMS_PER_WORD is 1 (fp8/bf16), 2 (fp4 bytes) or 8 (fp4 as int32 words)."""
    width = U // ELEMS_PER_WORD
    col = g.begin * width + hl.arange(g.block_size * width)
    return hl.load(data, [rows_tile, col], extra_mask=col < K // ELEMS_PER_WORD)


def load_data_strided(data, rows_tile, g, U, K, STRIDE, OFFSET):
    """Logical columns OFFSET, OFFSET + STRIDE, ... of K groups `g` of an unpacked operand:
    [rows, g*U / STRIDE], zero past K."""
    col = g.begin * U + STRIDE * hl.arange(g.block_size * (U // STRIDE)) + OFFSET
    return hl.load(data, [rows_tile, col], extra_mask=col < K)


def load_scale_codes(scale, rows_tile, n_rows, g, U, K, BLOCK, LAYOUT):
    """Raw scale codes (uint8) of K groups `g`: [rows, g*U / BLOCK], zero outside."""
    per_group = U // BLOCK
    return load_scale_range(scale, rows_tile, n_rows, g.begin * per_group, g.block_size * per_group, K, BLOCK, LAYOUT)


def load_scale_range(scale, rows_tile, n_rows, first, count, K, BLOCK, LAYOUT):
    """Raw scale codes (uint8) of blocks first .. first+count-1: [rows, count], zero outside."""
    sc = first + hl.arange(count)
    in_k = sc < K // BLOCK
    r = rows_tile.index.unsqueeze(1)
    if LAYOUT == 0:
        return hl.load(scale, [rows_tile, sc], extra_mask=in_k & (r < n_rows))
    off = scale_offset(SCALE_LAYOUTS[LAYOUT], r, sc.unsqueeze(0), K // BLOCK)
    return hl.load(scale, [off], extra_mask=in_k & (r < n_rows))
