"""blockscaled: block-scaled matmul kernels in Helion.

    import blockscaled as bs
    w = bs.quantize(weight, "nvfp4", layout="swizzle_32_4_4")
    y = bs.scaled_mm(x_bf16, w)            # bf16 x nvfp4 (W4A16)
"""

from .formats import FORMATS, SCALE_LAYOUTS, BlockFormat, get_format
from .qtensor import QTensor
from blockscaled.reference import dequantize, quantize
from blockscaled.kernels import SUPPORTED_PAIRS, scaled_mm

__all__ = ["FORMATS", "SCALE_LAYOUTS", "BlockFormat", "QTensor", "dequantize", "get_format", "quantize", "scaled_mm", "SUPPORTED_PAIRS"]
