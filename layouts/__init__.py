"""Scale layouts and fp4 / fp8 data layouts (`blockscaled.layouts`)."""

from .fp4 import pack_codes, unpack_codes
from .data import DATA_LAYOUTS, check_data_layout
from .mma import (arrange_mma_codes, arrange_mma_m16k16, element_bytes, element_codes, factor_bytes, factor_value,
                  mma_stored_shape, zero_scale_codes, unarrange_mma_m16k16)
from .scales import (
    cdna4_offset,
    cdna4_shuffle,
    cdna4_unshuffle,
    from_layout,
    pad_to,
    padded_scale_shape,
    scale_offset,
    stored_scale_shape,
    swizzle_32_4_4,
    swizzle_32_4_4_5d,
    swizzle_32_4_4_offset,
    to_layout,
    unswizzle_32_4_4,
)

__all__ = [
    "DATA_LAYOUTS",
    "check_data_layout",
    "arrange_mma_codes",
    "arrange_mma_m16k16",
    "unarrange_mma_m16k16",
    "element_bytes",
    "element_codes",
    "factor_bytes",
    "factor_value",
    "mma_stored_shape",
    "zero_scale_codes",
    "pack_codes",
    "unpack_codes",
    "cdna4_offset",
    "cdna4_shuffle",
    "cdna4_unshuffle",
    "from_layout",
    "pad_to",
    "padded_scale_shape",
    "scale_offset",
    "stored_scale_shape",
    "swizzle_32_4_4",
    "swizzle_32_4_4_5d",
    "swizzle_32_4_4_offset",
    "to_layout",
    "unswizzle_32_4_4",
]
