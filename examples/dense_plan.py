"""Prefill sizes: the dense plan (`blockscaled/kernels/dense.py`) decodes "mma_m16k16" weights to bf16 a chunk of
rows at a time, then cuBLAS multiplies. The default from M = 512 (`kernels.api.DENSE_MIN_M`); forced here by name.

    python examples/dense_plan.py [M] [N] [K]
"""

import sys

import torch
from _common import DEVICE, compare_with_cublas

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as reference

m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (2048, 8192, 8192) if DEVICE == "cuda" else (40, 96, 128)
weight = torch.randn(n, k, device=DEVICE)
x = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
w = bs.quantize_weight(weight, "mxfp4", data_layout="mma_m16k16")

# fp32 out keeps the decoded weights exact (bf16 out with nvfp4 folds the global scale into them: one more rounding)
y = bs.scaled_mm(x, w, out_dtype=torch.float32, backend="dense", config={"chunk_rows": n // 2})
print(f"{m} x {n} x {k}, 2 chunks: max_rel_err vs fp64 {max_rel_err(y, reference(x, w)):.2e}")
compare_with_cublas(lambda: bs.scaled_mm(x, w, backend="dense"), x, weight.to(torch.bfloat16))
