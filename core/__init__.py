"""blockscaled: block-scaled matmul kernels in Helion.

    import blockscaled as bs
    w = bs.quantize_weight(weight, "nvfp4")   # once; the fastest layout for weight.device
    y = bs.scaled_mm(x_bf16, w)               # bf16 x nvfp4 (W4A16)
"""

from .formats import FORMATS, SCALE_LAYOUTS, BlockFormat, get_format
from .qtensor import QTensor
from .weights import quantize, quantize_weight
from blockscaled.reference import dequantize
from blockscaled.kernels import SUPPORTED_PAIRS, scaled_mm
from . import ops  # noqa: E402,F401 - registers the torch.library custom ops

__all__ = ["FORMATS", "SCALE_LAYOUTS", "BlockFormat", "QTensor", "SUPPORTED_PAIRS", "dequantize", "get_format", "quantize",
           "quantize_weight", "scaled_mm"]
