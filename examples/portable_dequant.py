"""The portable kernel (`blockscaled/kernels/dequant_mm.py`): k_order operands decoded tile by tile with integer
ops, then bf16 dots. What runs on the CPU interpreter, on GPUs without the mma kernels, and for k_order weights.

    python examples/portable_dequant.py
"""

import torch
from _common import DEVICE

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as reference

m, n, k = 33, 40, 96
for fa, fb in bs.SUPPORTED_PAIRS:
    x = torch.randn(m, k, device=DEVICE)
    a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa, layout="swizzle_32_4_4")
    w = bs.quantize(torch.randn(n, k, device=DEVICE), fb, layout="swizzle_32_4_4")  # k_order data
    y = bs.scaled_mm(a, w, out_dtype=torch.float32, backend="dequant")
    print(f"{fa:5s} x {fb:5s}: max_rel_err vs fp64 {max_rel_err(y, reference(a, w)):.2e}")
