"""The sm_100 / gfx950 `hl.dot_scaled` path, checked without that hardware: backend choice
and the Triton code Helion generates (no kernel is launched here)."""

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import api, configs
from blockscaled.kernels.dot_scaled_mm import dot_scaled_args, dot_scaled_mm_kernel


def _code(pair, layout, m=64, n=128, k=256):
    gen = torch.Generator().manual_seed(0)
    fa, fb = pair
    x = torch.randn(m, k, generator=gen)
    a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa, layout=layout)
    b = bs.quantize(torch.randn(n, k, generator=gen), fb, layout=layout)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    args = dot_scaled_args(api._parts(a, out.device), api._parts(b, out.device), out, out, k, False)
    cfg = configs.default_config("dot_scaled", api.SUPPORTED_PAIRS[pair], m, n, k, "sm100")
    return dot_scaled_mm_kernel.bind(args).to_triton_code(cfg)


@pytest.mark.parametrize("pair,fmts", [
    (("mxfp4", "mxfp4"), ("'e2m1'", "'e2m1'")),
    (("mxfp8", "mxfp8"), ("'e4m3'", "'e4m3'")),
    (("nvfp4", "nvfp4"), ("'e2m1'", "'e2m1'")),
])
def test_generated_code_uses_dot_scaled_with_the_formats(pair, fmts):
    code = _code(pair, "rowmajor")
    calls = [line for line in code.splitlines() if "tl.dot_scaled(" in line]
    assert len(calls) == 1, code
    assert fmts[0] in calls[0] and fmts[1] in calls[0]
    assert "tl.dot(" not in code  # no dequantize fallback


@pytest.mark.parametrize("layout,needle", [("swizzle_32_4_4", "512"), ("cdna4_32", "128"), ("cdna4_16", "16")])
def test_scales_indexed_in_place_for_each_layout(layout, needle):
    code = _code(("mxfp4", "mxfp4"), layout)
    assert "tl.dot_scaled(" in code
    # the scale loads index the flat buffer with the layout's offset arithmetic
    assert needle in code


def test_backend_selection_by_capability(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.version, "hip", None)
    for cap, want in [((8, 0), "dequant"), ((9, 0), "dequant"), ((10, 0), "dot_scaled"), ((12, 0), "dot_scaled")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=cap: c)
        assert api.select_backend(cuda) == want
    assert api.select_backend(torch.device("cpu")) == "dequant"

    class Props:
        gcnArchName = "gfx950:sramecc+:xnack-"

    monkeypatch.setattr(torch.version, "hip", "7.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: Props)
    assert api.select_backend(cuda) == "dot_scaled_cdna4"
    Props.gcnArchName = "gfx942"
    with pytest.raises(NotImplementedError, match="gfx942 has no block-scaled path"):
        api.select_backend(cuda)


def test_mixed_pair_cannot_be_expressed_in_helion_dot_scaled():
    """Helion 1.5.0 rejects e4m3 x packed e2m1 in hl.dot_scaled; the API routes the mixed
    pair (and bf16 activations) to the dequantize path instead (api.DEQUANT_ONLY_PAIRS)."""
    import helion

    with pytest.raises(helion.exc.InternalError, match="Mismatched K dimensions"):
        _code(("mxfp8", "mxfp4"), "rowmajor")
    assert "mxfp8xmxfp4" in api.DEQUANT_ONLY_PAIRS
