"""Quantizers bit for bit against torchao 0.18 on random and adversarial inputs."""

import pytest
import torch

import blockscaled as bs
from blockscaled.reference import codecs, scaled_mm

mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402

AO_ELEM = {"mxfp4": torch.float4_e2m1fn_x2, "mxfp8": torch.float8_e4m3fn}
AO_MODE = {"floor": ScaleCalculationMode.FLOOR, "rceil": ScaleCalculationMode.RCEIL}


def _adversarial(k: int, gen) -> torch.Tensor:
    """Rows of hostile blocks: zeros, huge, tiny, subnormal, out of range, NaN, Inf, -0."""
    base = torch.randn(12, k, generator=gen)
    base[0] = 0.0
    base[1] *= 1e30
    base[2] *= 1e-30
    base[3] *= 1e-40  # fp32 subnormals
    base[4] *= 1e6  # beyond every element format's range
    base[5, 3] = float("nan")
    base[6, 1] = float("inf")
    base[7, 2] = -float("inf")
    base[8] = -0.0
    base[9, :16] = 0.0  # one zero block next to a normal one
    base[10] = torch.tensor([2.0**e for e in range(k)]).clamp(max=1e38) * torch.sign(base[10])
    base[11] *= 2.0**-126
    return base


def _inputs(k: int, gen):
    return {
        "random": torch.randn(64, k, generator=gen) * torch.exp2(torch.randint(-20, 20, (64, 1), generator=gen).float()),
        "adversarial": _adversarial(k, gen),
        "bf16": torch.randn(32, k, generator=gen).to(torch.bfloat16),
    }


def _compare_blocks(ours_data, ours_scale, ao_data, ao_scale, nan_scale_code, block_bytes):
    """Scales equal byte for byte; data equal except in NaN-scale blocks (documented)."""
    s, sa = ours_scale.view(torch.uint8), ao_scale.view(torch.uint8)
    assert torch.equal(s, sa)
    nan_block = (s == nan_scale_code).repeat_interleave(block_bytes, dim=1)
    d, da = ours_data.view(torch.uint8), ao_data.view(torch.uint8)
    assert torch.equal(d[~nan_block], da[~nan_block])
    return int(nan_block.sum())


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("rounding", ["floor", "rceil"])
@pytest.mark.parametrize("kind", ["random", "adversarial", "bf16"])
def test_mx_matches_torchao(fmt, rounding, kind, gen):
    x = _inputs(64, gen)[kind]
    q = bs.quantize(x, fmt, scale_rounding=rounding)
    ao_scale, ao_data = mx.to_mx(x.contiguous(), AO_ELEM[fmt], 32, AO_MODE[rounding])
    block_bytes = 16 if fmt == "mxfp4" else 32
    n_nan = _compare_blocks(q.data, q.scale, ao_data.view(torch.uint8), ao_scale, 255, block_bytes)
    assert (n_nan > 0) == (kind == "adversarial")


@pytest.mark.parametrize("kind", ["random", "adversarial", "bf16"])
def test_nvfp4_matches_torchao(kind, gen):
    x = _inputs(64, gen)[kind]
    x = x[~torch.isnan(x).any(1)] if kind == "adversarial" else x  # NaN: see below
    x = x[x.abs().amax(1) < float("inf")]  # one Inf makes the whole tensor's scale Inf
    q = bs.quantize(x, "nvfp4")
    g = nv.per_tensor_amax_to_scale(x.float().abs().amax())
    assert torch.equal(q.global_scale, g)
    ao_scale, ao_data = nv.nvfp4_quantize(x.contiguous(), 16, g)
    _compare_blocks(q.data, q.scale, ao_data, ao_scale, 0x7F, 8)


def test_nvfp4_nan_inf_and_zero_tensor():
    x = torch.randn(4, 32)
    x[1, 5] = float("nan")
    assert torch.isnan(bs.quantize(x, "nvfp4").dequantize()).all()  # NaN amax poisons the tensor
    zeros = torch.zeros(4, 32)
    q = bs.quantize(zeros, "nvfp4")
    # Deliberate difference: torchao divides 0 by 0 here and returns NaN scales.
    assert q.global_scale.item() == 1.0 and torch.equal(q.dequantize(), zeros)
    ao_scale, _ = nv.nvfp4_quantize(zeros, 16, nv.per_tensor_amax_to_scale(zeros.abs().amax()))
    assert torch.isnan(ao_scale.float()).all()


def test_mx_nan_block_dequantizes_to_nan_inf_saturates():
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    for fmt in ("mxfp4", "mxfp8"):
        d = bs.quantize(x, fmt).dequantize()
        assert torch.isnan(d[0, :32]).all() and not torch.isnan(d[0, 32:]).any()


def test_rceil_rounds_up_exactly_where_torchao_eager_log2_rounds_down():
    # descale = amax / 6 = 2^100 * (1 + 2^-23): the exact ceil(log2) is 101. torchao's eager
    # fallback computes ceil(log2(descale)) in fp32, where log2 rounds to exactly 100.
    descale = torch.tensor(2.0**100) * (1 + 2.0**-23)
    x = torch.zeros(1, 32)
    x[0, 0] = descale * 6
    assert (x[0, 0] / 6) == descale
    q = bs.quantize(x, "mxfp4", scale_rounding="rceil")
    assert q.scale.view(torch.uint8).item() == 127 + 101
    ao_scale, _ = mx.to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.RCEIL)
    assert ao_scale.view(torch.uint8).item() == 127 + 100
    # With the exact scale the largest element is no longer saturated: |x| / scale <= 6.
    assert x.abs().max() / codecs.decode_e8m0(q.scale.view(torch.uint8)).max() <= 6


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_rceil_subnormal_descale_matches_torchao(fmt):
    # amax / elem_max just above, at, and below 2^-127, and at 2^-126: codes 1, 0, 0, 1
    elem_max = bs.FORMATS[fmt].elem_max
    d = torch.tensor([2.0**-127 * 1.5, 2.0**-127, 2.0**-128, 2.0**-126])
    x = torch.zeros(4, 32)
    x[:, 0] = d * elem_max
    assert torch.equal(x[:, 0] / elem_max, d)
    q = bs.quantize(x, fmt, scale_rounding="rceil")
    ao_scale, _ = mx.to_mx(x, AO_ELEM[fmt], 32, ScaleCalculationMode.RCEIL)
    assert q.scale.view(torch.uint8).flatten().tolist() == [1, 0, 0, 1]
    assert torch.equal(q.scale.view(torch.uint8), ao_scale.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4", "cdna4_16", "cdna4_32"])
def test_layouts_carry_the_same_scales(fmt, layout, gen):
    x = torch.randn(70, 96, generator=gen)
    q = bs.quantize(x, fmt)
    ql = bs.quantize(x, fmt, layout=layout)
    assert ql.layout == layout
    assert torch.equal(ql.scale_rowmajor().view(torch.uint8), q.scale.view(torch.uint8))
    assert torch.equal(ql.dequantize(), q.dequantize())
    assert torch.equal(q.with_layout(layout).scale.view(torch.uint8), ql.scale.view(torch.uint8))
    # the kernels' view of the scales: the stored bytes, flat for every layout but rowmajor; one
    # object per QTensor (cached), a fresh one for a new QTensor
    kernel = ql.kernel_scale
    assert kernel.dtype == torch.uint8 and kernel.data_ptr() == ql.scale.data_ptr()
    assert kernel.shape == (ql.scale.shape if layout == "rowmajor" else (ql.scale.numel(),))
    assert torch.equal(kernel.flatten(), ql.scale.view(torch.uint8).flatten())
    assert ql.kernel_scale is kernel and q.with_layout(layout).kernel_scale is not kernel
    # and of the global scale: 1 element, the same value and memory, cached; None without one
    g = ql.kernel_global_scale
    if ql.global_scale is None:
        assert g is None
    else:
        assert g.shape == (1,) and g.data_ptr() == ql.global_scale.data_ptr() and g.item() == ql.global_scale.item()
        assert ql.kernel_global_scale is g


def test_dequantize_definition(gen):
    x = torch.randn(8, 64, generator=gen)
    q = bs.quantize(x, "nvfp4")
    elems = codecs.decode_e2m1(codecs.unpack_fp4(q.data)).double()
    scales = codecs.decode_e4m3(q.scale).double().repeat_interleave(16, 1)
    want = elems * scales * q.global_scale.double()
    assert torch.equal(bs.dequantize(q, torch.float64), want)
    # the error is what the format allows: half the widest fp4 step (2 * scale, scale =
    # block amax / 6) plus the e4m3 rounding of the scale (<= 1/16 relative).
    block_amax = x.abs().reshape(8, 4, 16).amax(-1, keepdim=True)
    err = (q.dequantize() - x).abs().reshape(8, 4, 16)
    assert (err <= block_amax * (1 / 6 + 1 / 16)).all()


def test_reference_scaled_mm(gen):
    a = torch.randn(5, 64, generator=gen)
    w = bs.quantize(torch.randn(7, 64, generator=gen), "mxfp4")
    out = scaled_mm(a, w)
    assert out.dtype == torch.float64
    assert torch.allclose(out, a.double() @ w.dequantize(torch.float64).T, rtol=0, atol=0)
    with pytest.raises(ValueError, match="b: K=32 does not match a's K=64"):
        scaled_mm(a, bs.quantize(torch.randn(7, 32), "mxfp4"))


def test_quantize_bad_input():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="fmt: unknown format 'fp4'"):
        bs.quantize(x, "fp4")
    with pytest.raises(TypeError, match="x: expected float32, bfloat16 or float16, got torch.int32"):
        bs.quantize(x.int(), "mxfp4")
    with pytest.raises(ValueError, match="x: K=48 must be a positive multiple of the mxfp4 block size 32"):
        bs.quantize(torch.randn(4, 48), "mxfp4")
    with pytest.raises(ValueError, match=r"x: expected a 2-D \[rows, K\] tensor"):
        bs.quantize(torch.randn(64), "mxfp8")
    with pytest.raises(ValueError, match="scale_rounding: expected one of"):
        bs.quantize(x, "mxfp8", scale_rounding="even")
    with pytest.raises(ValueError, match="layout: unknown scale layout"):
        bs.quantize(x, "mxfp8", layout="blocked")
    with pytest.raises(ValueError, match="global_scale: mxfp8 has no global scale"):
        bs.quantize(x, "mxfp8", global_scale=1.0)
    with pytest.raises(ValueError, match="fmt: 'bf16' is not a block-scaled format"):
        bs.quantize(x, "bf16")


def test_qtensor_validation(gen):
    q = bs.quantize(torch.randn(4, 64, generator=gen), "nvfp4")
    with pytest.raises(TypeError, match="data: nvfp4 data must be torch.uint8"):
        bs.QTensor(q.data.view(torch.int8), q.scale, "nvfp4", global_scale=q.global_scale)
    with pytest.raises(TypeError, match="scale: nvfp4 scales must be torch.float8_e4m3fn"):
        bs.QTensor(q.data, q.scale.view(torch.uint8), "nvfp4", global_scale=q.global_scale)
    with pytest.raises(ValueError, match=r"scale: layout 'rowmajor' needs shape \(4, 4\)"):
        bs.QTensor(q.data, q.scale[:, :2], "nvfp4", global_scale=q.global_scale)
    with pytest.raises(ValueError, match=r"scale: layout 'swizzle_32_4_4' needs shape \(512,\)"):
        bs.QTensor(q.data, q.scale, "nvfp4", "swizzle_32_4_4", global_scale=q.global_scale)
    with pytest.raises(ValueError, match="global_scale: nvfp4 needs a float32 scalar tensor"):
        bs.QTensor(q.data, q.scale, "nvfp4")
    with pytest.raises(ValueError, match="layout: unknown scale layout"):
        bs.QTensor(q.data, q.scale, "nvfp4", "nope", q.global_scale)
    with pytest.raises(ValueError, match="data: K=40 must be a multiple of the nvfp4 block size 16"):
        bs.QTensor(q.data[:, :20], q.scale[:, :3], "nvfp4", global_scale=q.global_scale)
    with pytest.raises(ValueError, match="fmt: QTensor needs a block-scaled format"):
        bs.QTensor(q.data, q.scale, "bf16")
    # data is convertible to torch's fp4x2 dtype by view
    assert q.data.view(torch.float4_e2m1fn_x2).shape == (4, 32)
