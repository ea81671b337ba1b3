"""Pure-torch reference (`blockscaled.reference`): codecs, quantizers, fp64 matmul.

Independent of the kernels: nothing here calls a kernel or torch._scaled_mm.
"""

from .codecs import (
    E2M1_VALUES,
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    decode_elements,
    decode_scales,
    encode_e2m1,
    pack_fp4,
    unpack_fp4,
)
from .matmul import max_rel_err, scaled_mm
from .quantize import dequantize, mx_scale_floor, mx_scale_rceil, nvfp4_global_scale, quantize

__all__ = [
    "E2M1_VALUES",
    "decode_e2m1",
    "decode_e4m3",
    "decode_e8m0",
    "decode_elements",
    "decode_scales",
    "dequantize",
    "encode_e2m1",
    "max_rel_err",
    "mx_scale_floor",
    "mx_scale_rceil",
    "nvfp4_global_scale",
    "pack_fp4",
    "quantize",
    "scaled_mm",
    "unpack_fp4",
]
