"""Format descriptors: the single source of truth for every block-scaled format.

Adding a format is one `BlockFormat` entry in `FORMATS` plus one element decode helper
(reference: `blockscaled.reference.codecs`, kernels: `blockscaled.kernels.decode`).
Nothing else in the project re-derives a format from dtypes or shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class BlockFormat:
    """One element format with its block scale.

    name:            registry key ("nvfp4", "mxfp4", "mxfp8", "bf16").
    element:         element encoding ("e2m1", "e4m3", "bf16").
    storage_dtype:   dtype of `QTensor.data` (uint8 for packed fp4).
    elems_per_byte:  2 for packed fp4, 1 for fp8; 0 marks an unpacked 16-bit format.
    elem_max:        largest finite element magnitude.
    elem_emax:       exponent of the largest power of two representable (OCP MX emax).
    scale_dtype:     dtype of the block scales, None when unscaled.
    scale_encoding:  "e8m0" or "e4m3", None when unscaled.
    block_size:      elements along K that share one scale, None when unscaled.
    global_scale:    True when a per-tensor fp32 scale multiplies the block scales (nvfp4).
    dot_scaled_name: the format string `tl.dot_scaled` / `hl.dot_scaled` uses.
    """

    name: str
    element: str
    storage_dtype: torch.dtype
    elems_per_byte: int
    elem_max: float
    elem_emax: int
    scale_dtype: torch.dtype | None
    scale_encoding: str | None
    block_size: int | None
    global_scale: bool
    dot_scaled_name: str

    @property
    def is_scaled(self) -> bool:
        return self.block_size is not None

    @property
    def is_packed(self) -> bool:
        return self.elems_per_byte == 2

    def data_cols(self, k: int) -> int:
        """Columns of the stored data for a logical K."""
        return k // 2 if self.is_packed else k

    def scale_cols(self, k: int) -> int:
        """Columns of the logical (row-major) scale matrix for a logical K."""
        if self.block_size is None:
            raise ValueError(f"format {self.name!r} has no block scales")
        return k // self.block_size

    def bits_per_element(self) -> float:
        """Storage bits per logical element, scales included (the decode byte count)."""
        elem_bits = 8 / self.elems_per_byte if self.elems_per_byte else 16
        return elem_bits + (8 / self.block_size if self.block_size else 0)


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat(
            name="nvfp4",
            element="e2m1",
            storage_dtype=torch.uint8,
            elems_per_byte=2,
            elem_max=6.0,
            elem_emax=2,
            scale_dtype=torch.float8_e4m3fn,
            scale_encoding="e4m3",
            block_size=16,
            global_scale=True,
            dot_scaled_name="e2m1",
        ),
        BlockFormat(
            name="mxfp4",
            element="e2m1",
            storage_dtype=torch.uint8,
            elems_per_byte=2,
            elem_max=6.0,
            elem_emax=2,
            scale_dtype=torch.float8_e8m0fnu,
            scale_encoding="e8m0",
            block_size=32,
            global_scale=False,
            dot_scaled_name="e2m1",
        ),
        BlockFormat(
            name="mxfp8",
            element="e4m3",
            storage_dtype=torch.float8_e4m3fn,
            elems_per_byte=1,
            elem_max=448.0,
            elem_emax=8,
            scale_dtype=torch.float8_e8m0fnu,
            scale_encoding="e8m0",
            block_size=32,
            global_scale=False,
            dot_scaled_name="e4m3",
        ),
        BlockFormat(
            name="bf16",
            element="bf16",
            storage_dtype=torch.bfloat16,
            elems_per_byte=0,
            elem_max=float(torch.finfo(torch.bfloat16).max),
            elem_emax=127,
            scale_dtype=None,
            scale_encoding=None,
            block_size=None,
            global_scale=False,
            dot_scaled_name="bf16",
        ),
    )
}

SCALE_LAYOUTS = ("rowmajor", "swizzle_32_4_4", "cdna4_16", "cdna4_32")


def get_format(fmt: str | BlockFormat, *, arg: str = "fmt") -> BlockFormat:
    """Look a format up by name; raise a ValueError naming `arg` when it is unknown."""
    if isinstance(fmt, BlockFormat):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(
            f"{arg}: unknown format {fmt!r}; expected one of {sorted(FORMATS)}"
        ) from None
