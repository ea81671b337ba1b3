"""Blackwell (sm_100) and AMD CDNA4: `hl.dot_scaled` on the native block-scaled MMA. Without that hardware, print
the Triton code Helion writes for it (one `tl.dot_scaled`, the scales indexed in place in their layout).

    python examples/dot_scaled_codegen.py
"""

import torch
from _common import DEVICE  # noqa: F401 - sets the interpreter up off the GPU

import blockscaled as bs
from blockscaled.kernels import api, configs
from blockscaled.kernels.dot_scaled_mm import dot_scaled_args, dot_scaled_mm_kernel

m, n, k = 64, 128, 256
a = bs.quantize(torch.randn(m, k), "mxfp4", layout="swizzle_32_4_4")
b = bs.quantize(torch.randn(n, k), "mxfp4", layout="swizzle_32_4_4")
out = torch.empty(m, n, dtype=torch.bfloat16)
args = dot_scaled_args(api._parts(a, out.device), api._parts(b, out.device), out, out, k, False)
code = dot_scaled_mm_kernel.bind(args).to_triton_code(configs.default_config("dot_scaled", "mxfp4xmxfp4", m, n, k, "sm100"))
print("\n".join(line for line in code.splitlines() if "dot_scaled(" in line or "tl.load" in line))
