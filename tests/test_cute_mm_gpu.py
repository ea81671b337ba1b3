"""The CuTe backend's nvfp4 x nvfp4 kernel (`kernels/cute_mm.py`) on a GPU, against the fp64 reference: the native
tcgen05 plan through `scaled_mm(..., backend="cute")` on sm_100, Helion's per-lane CuTe code of the same source on
other NVIDIA GPUs (Hopper), so the backend's code path runs somewhere real; bf16 x nvfp4 (per-lane code everywhere). Needs `helion[cute]` on the machine; the
device image lacks it, so it is carried there (docs/CUTE.md)."""

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import cute_mm
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

pytestmark = pytest.mark.gpu

BOUND = 1e-5  # fp32 output (tests/pairs.py TOLERANCE)


@pytest.mark.parametrize("activation", ["nvfp4", "bf16"])
@pytest.mark.parametrize("layout", ["swizzle_32_4_4", "rowmajor"])
@pytest.mark.parametrize("m,n,k", [(37, 72, 256), (128, 256, 1024), (5, 300, 80)])
def test_cute_nvfp4_gpu(activation, layout, m, n, k, gen):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    reason = cute_mm.cute_unavailable()
    if reason is not None:
        pytest.skip(f"Helion's CuTe backend is not installed here: {reason}")
    x = torch.randn(m, k, generator=gen).cuda() * torch.logspace(-3, 3, k // 16, device="cuda").repeat_interleave(16)
    a = bs.quantize(x, "nvfp4", layout=layout) if activation == "nvfp4" else x.to(torch.bfloat16)
    b = bs.quantize(torch.randn(n, k, generator=gen).cuda(), "nvfp4", layout=layout)
    bias = torch.randn(n, generator=gen).cuda()
    out = torch.full((m, n), float("nan"), device="cuda")
    if torch.cuda.get_device_capability()[0] == 10:
        bs.scaled_mm(a, b, out_dtype=torch.float32, bias=bias, out=out, backend="cute")
    else:
        cute_mm.run(a, b, bias, out, native=False)
    assert max_rel_err(out, ref_scaled_mm(a, b, bias=bias)) <= BOUND
