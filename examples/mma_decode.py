"""W4A16 at decode sizes: fp4 weights prepared once, bf16 activations, the mma kernels on NVIDIA sm_80 .. sm_90.

    python examples/mma_decode.py [M] [N] [K]
"""

import sys

import torch
from _common import DEVICE, compare_with_cublas

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as reference

m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (16, 4096 if DEVICE == "cuda" else 256, 4096 if DEVICE == "cuda" else 128)
weight = torch.randn(n, k, device=DEVICE)
x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)

w = bs.quantize_weight(weight, "nvfp4")  # the device's layout: "mma_m16k16" on Hopper
y = bs.scaled_mm(x, w, out_dtype=torch.float32)
print(f"weights {w.data_layout}, stored {w.stored_shape}; max_rel_err vs fp64 {max_rel_err(y, reference(x, w)):.2e}")
compare_with_cublas(lambda: bs.scaled_mm(x, w), x, weight.to(torch.bfloat16))
