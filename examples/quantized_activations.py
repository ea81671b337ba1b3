"""W4A4 / W4A8: activations quantized to nvfp4 or mxfp8, once (`bs.quantize`: the Helion kernel on a GPU) or in every
call (`activation_format`: on the mma kernels the quantize kernel writes the decoded bf16 rows their bf16-activation
plan reads, `blockscaled/kernels/quantize.py`).

    python examples/quantized_activations.py [M]
"""

import sys

import torch
from _common import DEVICE, compare_with_cublas

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as reference

m = int(sys.argv[1]) if len(sys.argv) > 1 else 64
n = k = 4096 if DEVICE == "cuda" else 128
weight, x = torch.randn(n, k, device=DEVICE), torch.randn(m, k, device=DEVICE)
for fa, fb in (("nvfp4", "nvfp4"), ("mxfp8", "mxfp4")):
    a, w = bs.quantize(x, fa), bs.quantize_weight(weight, fb)
    y = bs.scaled_mm(a, w, out_dtype=torch.float32)
    y_dynamic = bs.scaled_mm(x, w, activation_format=fa, out_dtype=torch.float32)  # the same codes, quantized in the call
    print(f"{fa} x {fb}: max_rel_err vs fp64 {max_rel_err(y, reference(a, w)):.2e}, "
          f"quantized in the call {max_rel_err(y_dynamic, reference(a, w)):.2e}")
    compare_with_cublas(lambda: bs.scaled_mm(a, w), x.to(torch.bfloat16), weight.to(torch.bfloat16))
# nvfp4 with a static activation scale (a checkpoint's input scale, or `blockscaled.nn.calibrate` on a model): no amax
# pass in the call; here the scale this input's own amax gives, so the codes are the dynamic call's
g = float(x.abs().amax()) / (6 * 448)
w = bs.quantize_weight(weight, "nvfp4")
y_static = bs.scaled_mm(x, w, activation_format="nvfp4", activation_global_scale=g, out_dtype=torch.float32)
print(f"nvfp4 x nvfp4, static activation scale: max_rel_err vs fp64 "
      f"{max_rel_err(y_static, reference(bs.quantize(x, 'nvfp4', global_scale=g), w)):.2e}")
