"""Weights prepared for the device (`bs.quantize_weight`, `QTensor.for_device`) and the padding of "mma_m16k16"."""

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import api, plans
from blockscaled.layouts import mma_stored_shape
from blockscaled.reference import dequantize

FORMATS = ["nvfp4", "mxfp4", "mxfp8"]


@pytest.mark.parametrize("capability,layout", [((8, 0), "mma_m16k16"), ((8, 9), "mma_m16k16"), ((9, 0), "mma_m16k16"),
                                               ((10, 0), "k_order"), ((12, 0), "k_order"), ((7, 5), "k_order")])
def test_weight_layout_by_capability(monkeypatch, capability, layout):
    monkeypatch.setattr(plans, "_capability", lambda device: capability)
    monkeypatch.setattr(plans, "_ptx_decodes", lambda device: device.type == "cuda")
    assert api.weight_data_layout(torch.device("cuda", 0)) == layout
    assert api.weight_data_layout("cpu") == "k_order"


def test_weight_layout_off_nvidia(monkeypatch):
    monkeypatch.setattr(plans, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(plans, "_ptx_decodes", lambda device: False)  # AMD: no PTX
    assert api.weight_data_layout(torch.device("cuda", 0)) == "k_order"


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_weight_is_quantize_in_the_device_layout(fmt, gen):
    w = torch.randn(96, 128, generator=gen)
    q = bs.quantize_weight(w, fmt)
    assert q.data_layout == "k_order"  # the CPU's
    ref = bs.quantize(w, fmt)
    assert torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8))
    assert torch.equal(q.scale.view(torch.uint8), ref.scale.view(torch.uint8))
    arranged = bs.quantize_weight(w, fmt, data_layout="mma_m16k16", layout="swizzle_32_4_4")
    assert arranged.data_layout == "mma_m16k16" and arranged.layout == "swizzle_32_4_4"
    assert torch.equal(dequantize(arranged), dequantize(ref))
    assert q.for_device() is q  # already in the CPU's layout


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(200, 96), (64, 1024), (130, 2080), (128, 64), (1, 32)])
def test_mma_padding_round_trips(fmt, n, k, gen):
    """Any [N, K] arranges as "mma_m16k16": rows padded to x128 and K to x64 with zero codes, the logical shape and the
    scales unchanged, the k_order data and values recovered exactly, the factors of padded blocks harmless."""
    f = bs.FORMATS[fmt]
    k = max(k, f.block_size)
    q = bs.quantize(torch.randn(n, k, generator=gen) * 3, fmt)
    m = q.with_data_layout("mma_m16k16")
    stored = mma_stored_shape(n, k)
    assert stored == (-(-n // 128) * 128, -(-k // 64) * 64)
    assert m.shape == (n, k) and m.stored_shape == stored and m.padded == (stored != (n, k))
    assert tuple(m.data.shape) == (stored[0], f.data_cols(stored[1]))
    assert torch.equal(m.scale.view(torch.uint8), q.scale.view(torch.uint8))
    assert torch.equal(m.data_k_order().view(torch.uint8), q.data.view(torch.uint8))
    assert torch.equal(dequantize(m), dequantize(q))
    back = m.with_data_layout("k_order")
    assert back.shape == (n, k) and back.stored_shape == (n, k) and not back.padded
    assert torch.equal(back.data.view(torch.uint8), q.data.view(torch.uint8))
    factors, post = m.kernel_mma_factors
    assert factors.numel() * 2 == stored[0] * stored[1] // f.block_size and post.numel() == 1


def test_mma_data_of_the_wrong_stored_shape_is_refused():
    q = bs.quantize(torch.randn(200, 96), "mxfp4").with_data_layout("mma_m16k16")
    with pytest.raises(ValueError, match=r"data: .*stored \[rows, K\] \[256, 128\]"):
        bs.QTensor(q.data[:200], q.scale, "mxfp4", data_layout="mma_m16k16", shape=(200, 96))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4"])
def test_activation_padded_along_k_keeps_its_values(fmt, layout, gen):
    """What the mma path gives an activation whose K the weights pad: the same values, then zeros."""
    f = bs.FORMATS[fmt]
    k = 3 * 32
    a = bs.quantize(torch.randn(5, k, generator=gen), fmt, layout=layout)
    padded = api._pad_k(a, 128)
    assert padded.shape == (5, 128) and padded.layout == layout
    want = torch.nn.functional.pad(dequantize(a, torch.float64), (0, 128 - k))
    assert torch.equal(dequantize(padded, torch.float64), want)
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    assert torch.equal(api._pad_k(x, 128), torch.nn.functional.pad(x, (0, 128 - k)))
    assert f.block_size in (16, 32)


def test_padded_weights_take_the_portable_kernels_on_cpu(gen):
    """Off the GPU "mma_m16k16" weights (padded) run on their k_order copy: the logical shape, exact to the bound."""
    from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

    w = bs.quantize(torch.randn(40, 96, generator=gen), "mxfp4").with_data_layout("mma_m16k16")
    x = torch.randn(3, 96, generator=gen).to(torch.bfloat16)
    out = bs.scaled_mm(x, w, out_dtype=torch.float32)
    assert out.shape == (3, 40)
    assert max_rel_err(out, ref_scaled_mm(x, w)) <= 1e-5


def test_k_order_weights_on_a_gpu_warn_once(monkeypatch):
    """Weights quantized without the device's layout still run, with one warning per device naming the fast call."""
    monkeypatch.setattr(api, "weight_data_layout", lambda device: "mma_m16k16" if device.type == "cuda" else "k_order")
    monkeypatch.setattr(api, "_checked_k_order", set())
    with pytest.warns(UserWarning, match="b: k_order weights on cuda:0 .*quantize_weight"):
        api._warn_k_order_weights(torch.device("cuda", 0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        api._warn_k_order_weights(torch.device("cuda", 0))  # once
        api._warn_k_order_weights(torch.device("cpu"))  # the CPU's own layout
