"""The "mma_m16k16" weight layout (CPU): round trip, scale factors, and the decode + mma
fragment mapping the GPU kernel relies on, emulated bit for bit against the reference."""

import functools
import itertools
import operator
import re
import struct

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import plans
from blockscaled.kernels.decode import ELEMENT_CODES
from blockscaled.layouts import arrange_mma_m16k16, factor_value, unarrange_mma_m16k16
from blockscaled.layouts.mma import ELEMENTS, SLOTS

from pairs import decodes_every_byte, decodes_every_scale, fp4_weights, mma_scale_code_sets, run_and_check

U32 = 0xFFFFFFFF



def _pdl(options):
    """(pdl, pdl_prefetch) of plan options."""
    return options.pdl, options.pdl_prefetch


def _wide_predecode(options):
    """(wide_b, predecode) of plan options."""
    return options.wide_b, options.predecode

def f32(x: float) -> float:
    """x rounded to float32, as the GPU's fp32 adds round (the PTX interpreters below)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def ptx_registers(word: torch.Tensor, element: str) -> list[torch.Tensor]:
    """The integer ops of `decode.MMA_A_FRAGMENTS_PTX` on the layout's words (E2M1: uint32 in
    int64 tensors, E4M3: int64): the four bf16x2 bit patterns of element * 2^-decode_shift."""
    if element == "e2m1":
        return [
            word & 0x81C081C0,
            (word << 3) & 0x81C081C0 & U32,
            (word << 6) & 0x81C081C0 & U32,
            ((word >> 4) & 0x00C000C0) | ((word >> 5) & 0x01000100) | ((word << 1) & 0x80008000 & U32),
        ]
    halves = (word & U32, (word >> 32) & U32)
    return [r for h in halves for r in (h & 0x87F087F0, ((h << 4) & 0x80F080F0) | ((h >> 4) & 0x07000700))]


def bf16_bits_value(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32).double()


def emulate_fragments(b: bs.QTensor) -> torch.Tensor:
    """W [N, K] as the kernel's mma.sync m16n8k16 steps see it: each lane's word decoded
    like the PTX, times its rows' factors, placed where the PTX ISA's A-fragment layout
    puts it (a0,a1: row g, k 2q, 2q+1; a2,a3: row g+8; a4..a7: k + 8), with the mma's
    logical k mapped to the activation K the lane loads (2q + i -> 16q + 4s + i,
    2q + 8 + i -> 16q + 4s + 2 + i). The stored (padded) rows and K are decoded too; the logical ones returned."""
    rows, cols = b.shape
    n, k = b.stored_shape
    factors, _ = b.kernel_mma_factors
    f = factor_value(factors.view(torch.uint8), b.fmt.scale_encoding)
    blocks = 64 // b.fmt.block_size
    f = f.double().reshape(n // 16, k // 64, blocks, 8, 2)
    raw = b.data.contiguous().view(torch.uint8)
    word = raw.view(torch.int32).to(torch.int64) & U32 if b.fmt.is_packed else raw.view(torch.int64)
    regs = ptx_registers(word.reshape(n // 16, k // 64, 4, 32), b.fmt.element)
    w = torch.full((n, k), float("nan"), dtype=torch.float64)
    for gr in range(n // 16):
        for win in range(k // 64):
            for s in range(4):
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    for reg, (row, kk) in enumerate([(g, 0), (g + 8, 0), (g, 2), (g + 8, 2)]):
                        bits = int(regs[reg][gr, win, s, lane])
                        factor = f[gr, win, q * blocks // 4, g, row // 8]
                        for half in range(2):
                            value = bf16_bits_value(torch.tensor((bits >> (16 * half)) & 0xFFFF)) * factor
                            w[16 * gr + row, 64 * win + 16 * q + 4 * s + kk + half] = value
    assert not w[rows:].any() and not w[:, cols:].any(), "padding decodes to nonzero values"
    return w[:rows, :cols]


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_fragments_decode_to_the_reference(fmt, gen):
    """Every weight the kernel's decode gives equals the reference dequantization times
    2^-shift, bit for bit (zero and subnormal nvfp4 scales included; fp8: every non-NaN
    byte, subnormals included)."""
    w = torch.randn(32, 128, generator=gen) * torch.exp2(torch.randint(-6, 7, (32, 1), generator=gen))
    q = bs.quantize(w * (2.0**10 if fmt == "mxfp8" else 1.0), fmt)
    scale = q.scale.view(torch.uint8).clone()
    data = q.data.view(torch.uint8).clone()
    if fmt == "nvfp4":
        scale[0, :4] = torch.tensor([0x00, 0x80, 0x03, 0x05], dtype=torch.uint8)  # +0, -0, subnormals
    if fmt == "mxfp8":
        every = torch.arange(256, dtype=torch.uint8)
        data[:2] = torch.where(every & 0x7F == 0x7F, 0x00, every).reshape(2, 128)
    q = bs.QTensor(data.view(q.data.dtype), scale.view(q.scale.dtype), fmt, global_scale=q.global_scale)
    b = q.with_data_layout("mma_m16k16")
    _, post = b.kernel_mma_factors
    place = ELEMENTS[q.fmt.element]
    shift = 7 if fmt == "nvfp4" else max(0, int(q.scale.view(torch.uint8).max()) + place.decode_shift - 254)
    assert shift > 0  # rows up to 2^6 (2^16 for mxfp8) reach E8M0 codes above 128 (134)
    assert post.item() == 2.0**shift * (1.0 if q.global_scale is None else q.global_scale.item())
    ref = bs.reference.codecs.decode_elements(q.data, q.fmt.element).double() * bs.reference.codecs.decode_scales(
        q.scale_rowmajor(), q.fmt.scale_encoding).double().repeat_interleave(q.fmt.block_size, 1)
    torch.testing.assert_close(emulate_fragments(b), ref * 2.0**-shift, rtol=0, atol=0)


def prmt(a, b, sel) -> torch.Tensor:
    """PTX prmt.b32 (default mode, bit 3 of each selector nibble clear) on uint32 words: each of a, b
    and sel an int or an int64 tensor."""
    a, b, sel = (torch.as_tensor(x, dtype=torch.int64) for x in (a, b, sel))
    out = torch.zeros(torch.broadcast_shapes(a.shape, b.shape, sel.shape), dtype=torch.int64)
    for i in range(4):
        src = (sel >> (4 * i)) & 7
        out |= (torch.where(src < 4, a, b) >> (8 * (src & 3)) & 0xFF) << (8 * i)
    return out


def emulate_b_registers(a: bs.QTensor) -> torch.Tensor:
    """fp4 / fp8 activations [M, K] as the kernel's B fragments hold them: each lane's 16
    elements decoded with the integer ops of `decode.MMA_B_FRAGMENTS_PTX`, times the factors
    of `decode.mma_b_factor` (the function the kernel calls; NaN for a lane whose fp8 bytes
    hold a NaN), at the K the mma pairs them with (step s, register r, half h: K = 16 q +
    4 s + 2 r + h of the window)."""
    from blockscaled.kernels.decode import E2M1_BF16_HIGH, E2M1_BF16_LOW, SCALE_CODES, mma_b_factor

    m, k = a.shape
    fp4 = a.fmt.is_packed
    scale_code = SCALE_CODES[a.fmt.scale_encoding]
    factor = mma_b_factor(a.scale_rowmajor().view(torch.uint8).to(torch.int32), scale_code) & 0xFFFF
    factor = bf16_bits_value(factor).repeat_interleave(a.fmt.block_size, 1)
    if not fp4:
        factor = factor * 2.0**120  # the first of fp8's two FMAs
    words = a.data.contiguous().view(torch.int32).to(torch.int64) & U32  # [M, K / 8 or K / 4]
    if not fp4:  # a NaN byte anywhere in a lane's 16 makes its factor NaN
        nan = ((((words & 0x7F7F7F7F) + 0x01010101) & 0x80808080) != 0).reshape(m, k // 16, 4).any(-1)
        factor = torch.where(nan.repeat_interleave(16, 1), float("nan"), factor)
    out = torch.full((m, k), float("nan"), dtype=torch.float64)
    for wi in range(words.shape[1]):
        w = words[:, wi]
        if fp4:  # magnitudes looked up 4 at a time, signs moved to bit 7 of a byte per code
            mag, even, odd = w & 0x77777777, (w << 4) & 0x80808080, w & 0x80808080
            regs = []
            for sel, half in ((0x5140, mag & 0xFFFF), (0x7362, mag >> 16)):
                lo = prmt(*E2M1_BF16_LOW, half)
                hi = prmt(*E2M1_BF16_HIGH, half) | prmt(even, odd, sel)
                regs += [prmt(lo, hi, 0x5140), prmt(lo, hi, 0x7362)]
        else:
            regs = [prmt(w, w, 2 * j * 0x11 | (2 * j + 1) * 0x1100) for j in range(2)]
            regs = [((t << 4) & 0x07F007F0) | ((t << 8) & 0x80008000) for t in regs]
        for j, r in enumerate(regs):
            for half in range(2):
                col = 2 * len(regs) * wi + 2 * j + half
                out[:, col] = bf16_bits_value((r >> (16 * half)) & 0xFFFF) * factor[:, col]
    return out


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_b_registers_decode_to_the_reference(fmt, gen):
    """Every activation value the kernel's B decode gives equals the reference dequantization
    (without the global scale), bit for bit: every code at every position,
    scales across their range (nvfp4: zero, negative, subnormal and NaN codes; E8M0: 0, 1,
    254 and 255; products in exact arithmetic, the GPU flushes values below 2^-126); fp8: a
    NaN byte turns its lane's 16 values NaN."""
    f = bs.FORMATS[fmt]
    k = 512
    cols = k // 2 if f.is_packed else k
    data = torch.randint(0, 256, (4, cols), generator=gen, dtype=torch.uint8)
    data[0, :256] = torch.arange(256, dtype=torch.uint8)  # every byte once
    if not f.is_packed:
        data[1:] = torch.where(data[1:] & 0x7F == 0x7F, 0x38, data[1:])  # NaN only in row 0
    if fmt == "nvfp4":
        codes = torch.randint(0, 256, (4, k // 16), generator=gen)
        codes[0, :6] = torch.tensor([0x00, 0x80, 0x03, 0x85, 0x7F, 0xFF])  # +-0, subnormals, NaN
    else:
        codes = torch.randint(100, 155, (4, k // 32), generator=gen)
        codes[0, :4] = torch.tensor([0, 1, 254, 255])
    g = torch.ones(()) if fmt == "nvfp4" else None
    a = bs.QTensor(data.view(f.storage_dtype), codes.to(torch.uint8).view(f.scale_dtype), fmt, global_scale=g)
    ref = bs.reference.codecs.decode_elements(a.data, f.element).double() * bs.reference.codecs.decode_scales(
        a.scale, f.scale_encoding).double().repeat_interleave(f.block_size, 1)
    if not f.is_packed:  # the lanes whose bytes hold a NaN
        ref = torch.where(ref.isnan().reshape(4, k // 16, 16).any(-1).repeat_interleave(16, 1), float("nan"), ref)
        assert ref[0].isnan().any() and not ref[1:].isnan().any()
    torch.testing.assert_close(emulate_b_registers(a), ref, rtol=0, atol=0, equal_nan=True)


def test_register_slots_tile_the_word():
    """The four registers' bit slots use each of the 16 bits of a half exactly once."""
    bits = sorted(p for slots in SLOTS for p in slots)
    assert bits == list(range(16))


def test_e4m3_positions_tile_the_word():
    """The four registers' E4M3 code bits use each of the 64 bits of the word exactly once."""
    bits = sorted(p for reg in ELEMENTS["e4m3"].positions for part in reg for p in part)
    assert bits == list(range(64))


@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
def test_round_trip(element, gen):
    data = torch.randint(0, 256, (48, 96 if element == "e2m1" else 192), generator=gen, dtype=torch.uint8)  # K = 192
    if element == "e4m3":
        data = torch.where(data & 0x7F == 0x7F, 0x38, data)
    arranged = arrange_mma_m16k16(data, element)
    assert arranged.shape == data.shape and not torch.equal(arranged, data)
    assert torch.equal(unarrange_mma_m16k16(arranged, element), data)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_values_kept(fmt, gen):
    q = bs.quantize(torch.randn(64, 256, generator=gen), fmt)
    m = q.with_data_layout("mma_m16k16")
    assert torch.equal(m.dequantize(), q.dequantize())
    assert torch.equal(m.k_order_copy.data, q.data) and m.k_order_copy.data_layout == "k_order"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_factors_of_a_padded_copy(fmt, gen):
    """A copy of padded "mma_m16k16" weights made without the arranging call's cached factors (`.to(device)`,
    `dataclasses.replace`) computes the same factors from its stored codes (576 x 7168 at M = 16 failed so: the
    logical codes reshaped as the padded rows)."""
    import dataclasses

    x = torch.randn(72, 224, generator=gen)
    x[3, :16] = 0  # a zero block: its factor comes from the codes
    m = bs.quantize(x, fmt).with_data_layout("mma_m16k16")
    assert m.padded and m.stored_shape == (128, 256)
    factors, post = m.kernel_mma_factors
    for copy in (dataclasses.replace(m, data=m.data.clone(), scale=m.scale.clone()), m.to("cpu")):
        assert "kernel_mma_factors" not in copy.__dict__ or copy is m
        f, p = copy.kernel_mma_factors
        assert torch.equal(f, factors) and torch.equal(p, post)
        assert copy.kernel_mma_shift == m.kernel_mma_shift


def test_bad_shapes_and_formats():
    """QTensor pads any [N, K] (tests/test_weights.py); the arrangement itself takes whole groups and windows."""
    with pytest.raises(ValueError, match="rows % 16"):
        arrange_mma_m16k16(torch.zeros(24, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="K % 64"):
        arrange_mma_m16k16(torch.zeros(32, 48, dtype=torch.uint8))
    with pytest.raises(ValueError, match="element: 'mma_m16k16' holds"):
        arrange_mma_m16k16(torch.zeros(16, 64, dtype=torch.uint8), "bf16")


def test_fp8_nan_elements_refused():
    data = torch.full((16, 64), 0x38, dtype=torch.uint8)
    data[7, 9] = 0xFF
    codes = torch.full((16, 2), 127, dtype=torch.uint8)
    with pytest.raises(ValueError, match="NaN elements"):
        fp4_weights(data, codes, "mxfp8", "mma_m16k16")


@pytest.mark.parametrize("fmt,nan", [("mxfp4", 255), ("nvfp4", 0x7F)])
def test_nan_scales_refused(fmt, nan):
    data = torch.full((16, 32), 0x22, dtype=torch.uint8)
    codes = torch.full((16, 64 // bs.FORMATS[fmt].block_size), 0x38 if fmt == "nvfp4" else 127, dtype=torch.uint8)
    codes[3, 1] = nan
    with pytest.raises(ValueError, match="NaN"):
        fp4_weights(data, codes, fmt, "mma_m16k16")
    data[3] = 0  # an all-zero block may carry any scale code
    fp4_weights(data, codes, fmt, "mma_m16k16")


def test_negative_nvfp4_scales_refused():
    data = torch.full((16, 32), 0x22, dtype=torch.uint8)
    codes = torch.full((16, 4), 0x38, dtype=torch.uint8)
    codes[5, 2] = 0xB8  # -1.0
    with pytest.raises(ValueError, match="negative E4M3"):
        fp4_weights(data, codes, "nvfp4", "mma_m16k16")


@pytest.mark.parametrize("fmt,low", [("mxfp4", 74), ("mxfp8", 76)])
def test_mx_scale_span_refused(fmt, low):
    """Codes up to 200 take shift 72 (E2M1) or 66 (E4M3); below shift + 2 (0.5 the smallest
    E2M1) or shift + 10 (2^-9 the smallest E4M3) the smallest element's product would leave
    bf16's normal range, so the layout refuses them."""
    one = 0x22 if fmt == "mxfp4" else 0x38
    data = torch.full((16, 32 if fmt == "mxfp4" else 64), one, dtype=torch.uint8)
    codes = torch.full((16, 2), 200, dtype=torch.uint8)
    codes[0, 0] = low - 1
    with pytest.raises(ValueError, match=f"E8M0 codes below {low}"):
        fp4_weights(data, codes, fmt, "mma_m16k16")
    codes[0, 0] = low
    fp4_weights(data, codes, fmt, "mma_m16k16")


def test_mma_backend_needs_the_layout(gen):
    a, b = torch.randn(1, 128).to(torch.bfloat16), bs.quantize(torch.randn(64, 128), "mxfp4")
    with pytest.raises(ValueError, match="mma_m16k16"):
        bs.scaled_mm(a, b, backend="mma")
    with pytest.raises(ValueError, match="backend: 'mma' runs"):  # no mma kernel on CPU
        bs.scaled_mm(a, b.with_data_layout("mma_m16k16"), backend="mma")


@pytest.mark.parametrize("pair", [("bf16", "mxfp4"), ("bf16", "nvfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"),
                                  ("bf16", "mxfp8"), ("mxfp8", "mxfp8")], ids=lambda p: f"{p[0]}x{p[1]}")
def test_other_kernels_read_the_k_order_copy(pair, gen):
    """On CPU (and for pairs or sizes the mma kernel does not run) "mma_m16k16" weights
    take the k_order path."""
    run_and_check(pair, 3, 64, 128, "cpu", gen, data_layout="mma_m16k16", bias=True)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_every_byte_and_scale_cpu(fmt):
    decodes_every_byte(fmt, "cpu", None, data_layout="mma_m16k16")
    decodes_every_scale(fmt, "cpu", None, mma_scale_code_sets(fmt), data_layout="mma_m16k16")


def test_split_fills_the_last_wave(monkeypatch):
    """One row group at M <= 8 and two at M = 16: the smallest split whose last wave is >= 90%
    full at 16 / 8 programs per SM (132 SMs: 2112 / 1056 resident programs), else the
    fullest; `max_split` alone takes the largest."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    shapes = [(8192, 8192), (10240, 8192), (57344, 8192), (8192, 28672), (1024, 1984)]
    one_group = {(n, k): plans._mma_split(k // 64, n // 64, 32, 16, cpu) for n, k in shapes}
    assert one_group == {(8192, 8192): 16, (10240, 8192): 32, (57344, 8192): 16, (8192, 28672): 16, (1024, 1984): 1}
    # 10240: 640 programs at split 8 and 1280 at 16 fill 0.61 of their last wave each: the first
    two_groups = {(n, k): plans._mma_split(k // 64, n // 128, 16, 8, cpu) for n, k in shapes}
    assert two_groups == {(8192, 8192): 16, (10240, 8192): 8, (57344, 8192): 16, (8192, 28672): 16, (1024, 1984): 1}
    assert plans._mma_split(128, 128, 32, 0, cpu) == 32 and plans._mma_split(128, 128, 8, 0, cpu) == 8
    with pytest.raises(ValueError, match="max_split"):
        plans._mma_options({"splits": 4}, 1, 8192, True)
    with pytest.raises(ValueError, match="row_groups"):
        plans._mma_options({"row_groups": 2}, 1, 64, True)
    with pytest.raises(ValueError, match="shared_b"):
        plans._mma_options({"shared_b": 1}, 16, 8192, True)
    # (max_split, programs per SM, row groups, shared B, wgmma, windows ahead, k_warps, stage_b: None = by the plan, unroll, tile_m, cluster,
    # split as given, L2 eviction hints, hoisted policies, PDL: None = by the plan, windows prefetched, fragment-order sums, wide B, predecode, warps, preload)
    assert plans._mma_options({"max_split": 8}, 1, 8192, True) == (8, 0, 2, True, False, 0, 1, False, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)
    assert plans._mma_options(None, 1, 8192, True) == (64, 0, 2, True, False, 0, 1, None, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)  # fp4 / fp8 activations: two row groups
    assert plans._mma_options(None, 1, 8192 + 64, True) == (32, 12, 1, True, False, 0, 1, None, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)  # N % 128 != 0: one, the wave rule
    # bf16 activations: one, B not shared, K over the warps by `_mma_k_warps` once K is known (0)
    assert plans._mma_options(None, 1, 8192, False) == (32, 16, 1, False, False, 0, 0, False, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)  # split-K as before if 1
    for narrow in (True, False):  # M = 16: two row groups, the wave rule, B shared; K slices by K (0)
        assert plans._mma_options(None, 16, 8192, narrow) == (16, 8, 2, True, False, 0, 0, False, 0, 64, True, 0, True, narrow, None, 2, False, False, False, 8, False)
        # fp8 weights: split up to 8, no wave rule, four windows prefetched; at M = 1 as fp4 weights
        assert plans._mma_options(None, 16, 8192, narrow, True) == (8, 0, 2, True, False, 0, 0, False, 0, 64, True, 0, True, False, None, 4, False, False, False, 8, False)
        assert plans._mma_options(None, 1, 8192, narrow, True) == plans._mma_options(None, 1, 8192, narrow)
    assert plans._mma_options(None, 16, 8192 + 64, True) == (8, 0, 1, True, False, 0, 0, False, 0, 64, True, 0, True, True, None, 2, False, False, False, 8, False)
    assert plans._mma_options({"max_split": 4}, 16, 8192, False).k_warps == 1
    assert plans._mma_options({"evict": False}, 16, 8192, False).evict is False
    with pytest.raises(ValueError, match="evict must be a bool"):
        plans._mma_options({"evict": 1}, 16, 8192, True)
    # hoisted policies: by default for fp4 / fp8 activations on fp4 weights at 1 < M <= 16, given or not with hints
    assert [plans._mma_options(None, m, 8192, True).hoist for m in (1, 2, 8, 16)] == [False, True, True, True]
    assert plans._mma_options({"evict": False}, 16, 8192, True).hoist is False
    assert plans._mma_options({"hoist": True}, 1, 8192, False).hoist is True
    # a config of only hint keys keeps the default plan: B staged by the plan at M = 1 (fp4 / fp8 activations)
    for hints in ({"hoist": True}, {"evict": False}):
        assert plans._mma_options(hints, 1, 8192, True).stage_b is None
    assert plans._mma_options({"k_warps": 8}, 1, 8192, True).stage_b is False
    with pytest.raises(ValueError, match="hoist applies to the eviction hints"):
        plans._mma_options({"evict": False, "hoist": True}, 16, 8192, True)
    with pytest.raises(ValueError, match="hoist must be a bool"):
        plans._mma_options({"hoist": 1}, 16, 8192, True)
    # programmatic dependent launch: on by default up to M = 16 (with two windows prefetched), given above; prefetch only
    # with it and at M <= 16
    assert [_pdl(plans._mma_options(None, m, 8192, True)) for m in (1, 16, 64)] == [(None, 2), (None, 2), (False, 0)]
    assert _pdl(plans._mma_options({"pdl": True}, 64, 8192, True)) == (True, 0)
    assert _pdl(plans._mma_options({"pdl": False}, 16, 8192, True)) == (False, 0)
    assert _pdl(plans._mma_options({"pdl_prefetch": 2}, 1, 8192, True)) == (True, 2)
    for bad, message in (({"pdl": 1}, "pdl must be a bool"), ({"pdl": False, "pdl_prefetch": 1}, "pdl_prefetch is"),
                         ({"pdl_prefetch": 5}, "pdl_prefetch is"), ({"pdl_prefetch": True}, "pdl_prefetch is")):
        with pytest.raises(ValueError, match=message):
            plans._mma_options(bad, 16, 8192, True)
    with pytest.raises(ValueError, match="pdl_prefetch is"):
        plans._mma_options({"pdl_prefetch": 1}, 64, 8192, True)
    assert plans._mma_options({"row_groups": 1, "shared_b": False}, 16, 8192, True) == (8, 0, 1, False, False, 0, 1, False, 0, 64, True, 0, True, True, None, 2, False, False, False, 8, False)
    # M > 16 (mma_m64_kernel, 128-row programs): only the split may differ
    # M > 16: the options count mma.sync's resident programs, the plan wgmma's where it runs (below)
    assert plans._mma_options(None, 64, 8192, False) == (plans.MMA_M64_MAX_SPLIT, 2, 1, True, True, plans.MMA_M64_AHEAD, 1, False, 0, 64, True, 0, False, False, False, 0, True, False, False, 8, False)  # (wide_b: `mma_options_for` checks the alignment)
    assert plans._mma_options({"max_split": 4, "row_groups": 1, "wgmma": False, "ahead": 3}, 17, 8192, True) == (4, 0, 1, True, False, 3, 1, False, 0, 64, True, 0, False, False, False, 0, True, False, True, 8, False)
    for bad in ({"row_groups": 2}, {"shared_b": False}):
        with pytest.raises(ValueError, match="above M = 16"):
            plans._mma_options(bad, 64, 8192, True)
    with pytest.raises(ValueError, match="wgmma must be a bool"):
        plans._mma_options({"wgmma": 1}, 64, 8192, True)
    with pytest.raises(ValueError, match="'wgmma' applies above M = 16"):
        plans._mma_options({"wgmma": True}, 16, 8192, True)
    # split-K sums in fragment order: the default above M = 16, a bool, refused at M <= 16 (mma_gemv_kernel)
    assert plans._mma_options({"fragment_sums": False}, 64, 8192, True).fragment_sums is False
    with pytest.raises(ValueError, match="fragment_sums must be a bool"):
        plans._mma_options({"fragment_sums": 1}, 64, 8192, True)
    with pytest.raises(ValueError, match="fragment_sums applies above M = 16"):
        plans._mma_options({"fragment_sums": True}, 16, 8192, True)
    assert plans._mma_options({"ahead": 1}, 16, 8192, False).ahead == 1  # M <= 16: 0, or 1 with shared B
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="ahead must be an int in 0 .. 1 at M = 16, got"):
            plans._mma_options({"ahead": bad}, 16, 8192, True)
    with pytest.raises(ValueError, match="ahead must be an int in 0 .. 0 at M = 1 without shared_b, got 1"):
        plans._mma_options({"ahead": 1, "shared_b": False}, 1, 8192, True)
    for bad in (0, 4, True, 2.0):
        with pytest.raises(ValueError, match="ahead must be an int in 1 .. 3 at M = 64, got"):
            plans._mma_options({"ahead": bad}, 64, 8192, True)
    # 2 programs per SM: 64 row programs x 4 fill 0.97 of 264; 80 x 8 the fullest, 0.81 (x 16: 0.97)
    m64 = {(n, k): plans._mma_split(k // 64, n // 128, plans.MMA_M64_MAX_SPLIT, 2, cpu) for n, k in shapes}
    assert m64 == {(8192, 8192): 4, (10240, 8192): 8, (57344, 8192): 4, (8192, 28672): 4, (1024, 1984): 1}
    # 3 (wgmma, 80 registers): 10240 x 8192 takes 4 (320 programs, 0.81 of 396; 8 ties and comes later)
    m64 = {(n, k): plans._mma_split(k // 64, n // 128, plans.MMA_M64_MAX_SPLIT, 3, cpu) for n, k in shapes}
    assert m64 == {(8192, 8192): 4, (10240, 8192): 4, (57344, 8192): 4, (8192, 28672): 4, (1024, 1984): 1}
    # uneven (mma_m64_kernel): where the power of two leaves one wave under 90% full, the largest factor that fits
    # one wave if it fills 90%: 64 row programs x 6 = 384 of 396; 80 x 4 = 320 stays (x 5 = 400 is a second wave);
    # 2 per SM: 64 x 4 already fills 0.97 of 264, 48 x 5 = 240 fills 0.91 where 48 x 4 filled 0.73
    m64 = {(n, k): plans._mma_split(k // 64, n // 128, plans.MMA_M64_MAX_SPLIT, 3, cpu, uneven=True) for n, k in shapes}
    assert m64 == {(8192, 8192): 6, (10240, 8192): 4, (57344, 8192): 4, (8192, 28672): 6, (1024, 1984): 1}
    assert [plans._mma_split(64, 48, 8, per_sm, cpu, uneven=True) for per_sm in (2, 3)] == [5, 8]
    assert plans._mma_split(128, 64, 8, 2, cpu, uneven=True) == 4 and plans._mma_split(128, 64, 4, 3, cpu, uneven=True) == 4
    # the plan: 3 with wgmma but for fp4 / fp8 activations on fp4 weights decoded in the kernel ("predecode" False), 2
    # with mma.sync; predecoded, they plan as bf16 activations
    bf16, nvfp4 = torch.randn(64, 8192).to(torch.bfloat16), bs.quantize(torch.randn(64, 8192), "nvfp4").with_data_layout("k_order")
    mxfp8 = bs.quantize(torch.randn(64, 8192), "mxfp8").with_data_layout("k_order")
    in_kernel = {"predecode": False}
    for has_wgmma, (x, w), config, split in [
            (True, (bf16, "mxfp4"), None, 4), (True, (mxfp8, "mxfp8"), None, 4), (True, (nvfp4, "nvfp4"), in_kernel, 8),
            (True, (mxfp8, "mxfp4"), in_kernel, 8), (True, (nvfp4, "nvfp4"), None, 4), (True, (mxfp8, "mxfp4"), None, 4),
            (False, (bf16, "mxfp4"), None, 8)]:
        monkeypatch.setattr(plans, "_has_wgmma", lambda device, has=has_wgmma: has)
        b = bs.quantize(torch.randn(128, 8192), w).with_data_layout("mma_m16k16")
        plan = plans._mma_plan(x, b, False, 64, 10240, 8192, plans.mma_options_for(config, x, b, 64, 10240))
        assert (plan.split, plan.consts.WGMMA) == (split, has_wgmma), (has_wgmma, w)
    # 8192^2: split 6 (uneven, in the workspace) where 3 per SM are counted, else 4
    for has_wgmma, (x, w), config, split in [
            (True, (bf16, "mxfp4"), None, 6), (True, (mxfp8, "mxfp8"), None, 6), (True, (nvfp4, "nvfp4"), in_kernel, 4),
            (True, (mxfp8, "mxfp4"), in_kernel, 4), (True, (nvfp4, "nvfp4"), None, 6), (False, (bf16, "mxfp4"), None, 4)]:
        monkeypatch.setattr(plans, "_has_wgmma", lambda device, has=has_wgmma: has)
        b = bs.quantize(torch.randn(128, 8192), w).with_data_layout("mma_m16k16")
        plan = plans._mma_plan(x, b, False, 64, 8192, 8192, plans.mma_options_for(config, x, b, 64, 8192))
        assert (plan.split, plan.consts[-7], plans._mma_cluster_size(plan)) == (split, split, 1), (has_wgmma, w)


@pytest.mark.parametrize("m, groups", [(40, 5), (130, 8)])
def test_m64_workspace_in_fragment_order(monkeypatch, m, groups):
    """mma_m64_kernel's split-K workspace holds, in fragment order (the default), 1024 sums (256 threads x 4) per
    column group of every output tile: at M = 40 five groups of 8 rows per 128 weight rows (M x N would be 40), at
    M = 130 three tiles of 64 rows, the last partial; with "fragment_sums" False M x N, at the outputs' positions."""

    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    x = torch.randn(m, 2048).to(torch.bfloat16)
    b = bs.quantize(torch.randn(1024, 2048), "mxfp4").with_data_layout("mma_m16k16")
    for fragment_sums, sums in ((True, 1024 // 128 * -(-m // 64) * groups * 1024), (False, m * 1024)):
        config = {"max_split": 4, "fragment_sums": fragment_sums}
        plan = plans._mma_plan(x, b, False, m, 1024, 2048, plans.mma_options_for(config, x, b, m, 1024))
        assert (plan.split, plan.consts.FRAGMENT_SUMS, plan.workspace.sums) == (4, fragment_sums, sums), config
        assert plan.consts.CLUSTER is False and plans._mma_cluster_size(plan) == 1  # 32 programs


def test_uneven_split(monkeypatch):
    """"split" gives the split-K factor itself; one that does not divide the windows runs parts of W / split or
    W / split + 1 windows, at M <= 16 never with windows loaded ahead (mma_m64_kernel, which always loads ahead, clamps
    its loads past a part's end to the last window instead: `mma_gemv.ahead_window`). The wave rule takes powers of two
    only (M = 16, 10240 x 8192: 8, `plans._mma_split`; 12 and 13 were timed and did not pay), except where no split of 8
    divides the windows and the plan loads none ahead (Qwen2.5-72B's 462 windows: 2 at most otherwise)."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    x, b = torch.randn(16, 8192).to(torch.bfloat16), bs.quantize(torch.randn(128, 8192), "mxfp4").with_data_layout("mma_m16k16")

    def plan(config, n=10240):
        return plans._mma_plan(x, b, False, 16, n, 8192, plans.mma_options_for(config, x, b, 16, n))

    cpu = torch.device("cpu")
    # 462 windows: 2 of even parts at most, with `parts` 4 (64 x 4 programs fill 0.97 of 264); 31: 1 -> 16; 140 (4 x 35):
    # 4 -> 32; 128: as before
    assert [plans._mma_split(w, rows, cap, per_sm, cpu) for w, rows, cap, per_sm in
            ((462, 64, 16, 2), (31, 4, 32, 0), (140, 24, 32, 0), (128, 64, 16, 2))] == [2, 1, 4, 4]
    assert [plans._mma_split(w, rows, cap, per_sm, cpu, parts=True) for w, rows, cap, per_sm in
            ((462, 64, 16, 2), (31, 4, 32, 0), (140, 24, 32, 0), (128, 64, 16, 2))] == [4, 16, 32, 4]
    x29568 = torch.randn(16, 29568).to(torch.bfloat16)
    b29568 = bs.quantize(torch.randn(128, 29568), "mxfp4").with_data_layout("mma_m16k16")
    for config, split in ((None, 16), ({"ahead": 1}, 2)):  # windows ahead: even parts only
        p = plans._mma_plan(x29568, b29568, False, 16, 8192, 29568, plans.mma_options_for(config, x29568, b29568, 16, 8192))
        assert p.split == split and p.consts.AHEAD == (config or {}).get("ahead", 0), config
    # fp8 weights, which load a window ahead from K = 16384 (MMA_FP8_M16_AHEAD_K), take uneven parts there instead
    b8 = bs.quantize(torch.randn(128, 29568), "mxfp8").with_data_layout("mma_m16k16")
    p = plans._mma_plan(x29568, b8, False, 16, 8192, 29568, plans.mma_options_for(None, x29568, b8, 16, 8192))
    assert (p.split, p.consts.AHEAD) == (plans.MMA_FP8_M16_MAX_SPLIT, 0)
    # (ROW_GROUPS, SPLIT, SHARED_B, AHEAD, K_WARPS, STAGE_B): the default is split-K by 8 with two row groups and shared B
    assert plan(None).consts[-6:] == (2, 8, True, 0, 1, False) and plan(None).split == 8
    assert plan({"split": 13}).consts[-6:] == (2, 13, True, 0, 1, False) and plan({"split": 13}).split == 13
    assert plan({"split": 7, "row_groups": 1, "shared_b": False}).consts[-6:] == (1, 7, False, 0, 1, False)
    assert plan({"split": 8, "ahead": 1}).consts[-6:] == (2, 8, True, 1, 1, False)  # divides: ahead may load
    for bad, match in [({"split": 7, "ahead": 1}, "with ahead 1 at M <= 16, divide them"),
                       ({"split": 129}, "at most the K / 64 = 128"),
                       ({"split": 0}, "split is an int >= 1"), ({"split": 4, "max_split": 4}, "without 'max_split'"),
                       ({"split": 2.0}, "split is an int"), ({"split": 4, "k_warps": 2}, "without 'max_split' or 'split'")]:
        with pytest.raises(ValueError, match=match):
            plan(bad)
    x64 = torch.randn(64, 8192).to(torch.bfloat16)
    for config, split in (({"split": 6}, 6), ({"split": 6, "ahead": 2}, 6), ({"split": 128}, 128), (None, 4)):
        m64 = plans._mma_plan(x64, b, False, 64, 8192, 8192, plans.mma_options_for(config, x64, b, 64, 8192))
        # no cluster sum of 6 parts (`decode.MMA_CLUSTER_SUM_PTX`)
        assert m64.split == split and m64.consts.SPLIT == split and m64.consts.CLUSTER is False, config
    with pytest.raises(ValueError, match="at most the K / 64 = 128"):
        plans._mma_plan(x64, b, False, 64, 8192, 8192, plans.mma_options_for({"split": 129}, x64, b, 64, 8192))


def test_m16_one_group_split(monkeypatch):
    """At 8 < M <= 16 on sm_90 (132 SMs), where two row groups would split K into the workspace on under 0.9 of a wave
    (4096^2, 6144 x 4096, 4096 x 14336), the plan takes one row group, split 8 summed in clusters and one window
    ahead; fp4 / fp8 activations on fp4 weights only up to K = 4096. The tuned Llama-3-70B shapes, a config with
    row groups, and grids too small for clusters keep two row groups."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    bf16, nvfp4 = torch.randn(16, 256).to(torch.bfloat16), bs.quantize(torch.randn(16, 256), "nvfp4").with_data_layout("k_order")
    mxfp8 = bs.quantize(torch.randn(16, 256), "mxfp8").with_data_layout("k_order")

    def tail(x, w, n, k, config=None):  # (CLUSTER, ROW_GROUPS, SPLIT, SHARED_B, AHEAD, K_WARPS, STAGE_B)
        b = bs.quantize(torch.randn(64, 256), w).with_data_layout("mma_m16k16")
        plan = plans._mma_plan(x, b, False, 16, n, k, plans.mma_options_for(config, x, b, 16, n))
        assert plan.split == plan.consts[-5]
        return plan.consts[-7:]

    one_group = (True, 1, 8, True, 1, 1, False)
    for x, w in ((bf16, "mxfp4"), (bf16, "nvfp4"), (nvfp4, "nvfp4"), (mxfp8, "mxfp4"), (bf16, "mxfp8"), (mxfp8, "mxfp8")):
        assert tail(x, w, 4096, 4096) == one_group, w  # two row groups: split 16 (fp8 weights 8) in the workspace
        assert tail(x, w, 4096, 14336) == (one_group if x is bf16 or w == "mxfp8" else (False, 2, 16, True, 0, 1, False))
        assert tail(x, w, 4096, 4096, {"row_groups": 2})[1:3] == (2, 16 if w != "mxfp8" else 8)
        assert tail(x, w, 8192, 28672)[:3] == ((False, 2, 16) if w != "mxfp8" else (True, 2, 8))  # 0.97 of a wave
        assert tail(x, w, 10240, 8192)[:3] == (True, 2, 8)  # already in clusters
        assert tail(x, w, 1024, 16384)[1] == 2  # one row group: 128 programs, too few for clusters
    assert tail(bf16, "mxfp4", 6144, 4096) == one_group
    assert tail(bf16, "mxfp8", 6144, 4096)[:3] == (True, 2, 8)  # fp8 weights: split 8 of two groups in clusters
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: False)  # no clusters: the workspace plan stays
    assert tail(bf16, "mxfp4", 4096, 4096)[:3] == (False, 2, 16)


def test_k_warps_options(monkeypatch):
    """K over the warps of a program: by default for bf16 activations at M = 1 only, 16 warps
    where their programs (4 per SM, 132 SMs) fill 0.5-1 wave (up to K = 4096: 0.45-1) or make >= 3, else 8,
    else (where the plan can take a tail) one that leaves a tail, from 0.4 of a wave, else split-K;
    given, it excludes max_split, must divide the windows (or, without shared or staged B and ahead, be at most
    their number: the first windows mod k_warps warps take one more) and, with shared B (K slices of 4 warps),
    is at most 8."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    shapes = [(8192, 8192), (10240, 8192), (57344, 8192), (8192, 28672), (1024, 8192), (1024, 1984), (4096, 4096),
              (4096, 14336), (3840, 4096), (3776, 4096)]
    # one row group: 512 / 640 / 3584 / 512 / 64 / 64 programs; 10240 at 16 warps: 1.21 waves, at 8: 0.61;
    # N = 4096 (256 programs, 0.48 of a wave) at K = 4096 only, 3840 (0.45) too, 3776 (0.447) not
    assert {(n, k): plans._mma_k_warps(k // 64, n // 16, cpu) for n, k in shapes} == {
        (8192, 8192): 16, (10240, 8192): 8, (57344, 8192): 16, (8192, 28672): 16, (1024, 8192): 1, (1024, 1984): 1,
        (4096, 4096): 16, (4096, 14336): 1, (3840, 4096): 16, (3776, 4096): 1}
    # where the plan can take a tail: the first k_warps that does not divide the windows, from 0.4 of a wave, only if
    # no dividing one passed (Qwen2.5-72B's 462 windows at 8192 rows: 0.97; 3584 x 3584: 56 windows, 0.42; 3584 x
    # 18944: 296 windows, 8 divides them at 0.21 waves; 4096 x 14336: both divide, neither passes: split-K stays)
    uneven = {(n, k): plans._mma_k_warps(k // 64, n // 16, cpu, uneven=True)
              for n, k in [*shapes, (8192, 29568), (3584, 3584), (3584, 18944), (3328, 3584), (1024, 1984)]}
    assert uneven == {
        (8192, 8192): 16, (10240, 8192): 8, (57344, 8192): 16, (8192, 28672): 16, (1024, 8192): 1, (1024, 1984): 1,
        (4096, 4096): 16, (4096, 14336): 1, (3840, 4096): 16, (3776, 4096): 1, (8192, 29568): 16, (3584, 3584): 16,
        (3584, 18944): 16, (3328, 3584): 1}  # 3328: 208 programs, 0.39 of a wave
    assert plans._mma_k_warps(462, 512, cpu) == 1  # without a tail: one warp (split-K over 462's divisors)
    assert plans._mma_options({"k_warps": 8}, 16, 8192, True) == (1, 0, 2, True, False, 0, 8, False, 0, 64, True, 0, True, True, None, 2, False, False, False, 8, False)  # shared B: 8 slices
    assert plans._mma_options({"k_warps": 16, "shared_b": False}, 16, 8192, True) == (1, 0, 2, False, False, 0, 16, False, 0, 64, True, 0, True, True, None, 2, False, False, False, 8, False)
    assert plans._mma_options({"k_warps": 4, "ahead": 1}, 1, 8192, True) == (1, 0, 2, True, False, 1, 4, False, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)
    assert plans._mma_options({"k_warps": 4, "row_groups": 1}, 1, 8192, False) == (1, 0, 1, False, False, 0, 4, False, 0, 64, True, 0, True, False, None, 2, False, False, False, 8, False)
    for narrow in (True, False):  # not by default: fp4 / fp8 activations at M = 1 (staged or split-K), a split or shared B asked for
        assert plans._mma_options(None, 1, 8192, True).k_warps == 1
        assert plans._mma_options(None, 3, 8192, narrow).k_warps == 0  # 1 < M <= 16: K slices or split-K by the plan
        assert plans._mma_options(None, 16, 8192, narrow).k_warps == 0
    assert plans._mma_options({"max_split": 16}, 1, 8192, False).k_warps == 1
    assert plans._mma_options({"shared_b": True}, 1, 8192, False).k_warps == 1
    assert plans._mma_options({"row_groups": 2}, 1, 8192, False).k_warps == 0
    for bad in (3, 32, 0, True, 2.0):
        with pytest.raises(ValueError, match="k_warps must be 1, 2, 4, 8 or 16"):
            plans._mma_options({"k_warps": bad}, 1, 8192, False)
    for bad, m in (({"k_warps": 4, "max_split": 4}, 1), ({"k_warps": 4}, 17)):
        with pytest.raises(ValueError, match="k_warps > 1 runs at M <= 16 without 'max_split'"):
            plans._mma_options(bad, m, 8192, True)
    for bad in ({"k_warps": 16}, {"k_warps": 16, "shared_b": True, "row_groups": 1}):
        with pytest.raises(ValueError, match="k_warps with shared_b is at most 8"):
            plans._mma_options(bad, 16, 8192, True)
    with pytest.raises(ValueError, match="ahead must be an int in 0 .. 0 at M = 1 without shared_b"):
        plans._mma_options({"k_warps": 4, "ahead": 1}, 1, 8192, False)
    a, b = torch.randn(1, 1984).to(torch.bfloat16), bs.quantize(torch.randn(64, 1984), "mxfp4").with_data_layout("mma_m16k16")
    plan = plans._mma_plan(a, b, False, 1, 64, 1984, plans._mma_options({"k_warps": 4}, 1, 64, False))
    assert (plan.consts[-2], plan.split, plan.workspace) == (4, 1, None)  # 31 windows: 7 + 1, 7 + 1, 7 + 1, 7
    b4 = bs.quantize(torch.randn(64, 1984), "nvfp4").with_data_layout("mma_m16k16")
    for config, m in (({"k_warps": 4, "shared_b": True, "row_groups": 1}, 16), ({"k_warps": 4, "stage_b": True, "shared_b": False, "row_groups": 1}, 1)):
        with pytest.raises(ValueError, match="k_warps 4 must divide the K / 64 = 31 windows, or with shared_b"):
            x = bs.quantize(torch.randn(m, 1984), "nvfp4").with_data_layout("k_order")
            plans._mma_plan(x, b4, False, m, 64, 1984, plans._mma_options(config, m, 64, True))
    with pytest.raises(ValueError, match="k_warps 16 must divide the K / 64 = 8 windows, or with"):
        plans._mma_plan(a[:, :512], bs.quantize(torch.randn(64, 512), "mxfp4").with_data_layout("mma_m16k16"), False,
                        1, 64, 512, plans._mma_options({"k_warps": 16}, 1, 64, False))
    plan = plans._mma_plan(a, b, False, 1, 64, 1984, plans._mma_options(None, 1, 64, False))
    # 31 windows: split-K in parts of 1 or 2 windows (no split of 8 divides them)
    assert plan.consts[-2] == 1 and plan.split == plans._mma_split(31, 1, 32, 16, cpu, parts=True) == 16
    # by default with a tail: bf16 activations at 8192 x 29568 (462 windows); fp4 activations too where split-K has no
    # 8-way split (462 % 8): on fp4 weights over the activation decoded to bf16 first (the bf16 plan), on fp8 weights
    # with B unstaged and unshared; not at 3584 x 3584 (56 windows: split 8)
    for fa, fb, n, k, want, predecoded in (("bf16", "nvfp4", 8192, 29568, (16, False), False),
                                           ("nvfp4", "nvfp4", 8192, 29568, (16, False), True),
                                           ("mxfp8", "mxfp8", 8192, 29568, (16, False), False),
                                           ("nvfp4", "nvfp4", 3584, 3584, (1, True), False)):
        w = bs.quantize(torch.randn(n, k), fb).with_data_layout("mma_m16k16")
        x = torch.randn(1, k).to(torch.bfloat16) if fa == "bf16" else bs.quantize(torch.randn(1, k), fa)
        plan = plans._mma_plan(x if fa != "bf16" else None, w, False, 1, n, k, plans.mma_options_for(None, x, w, 1, n))
        assert (plan.consts.K_WARPS, plan.consts.SHARED_B, plan.consts.STAGE_B) == (*want, False), (fa, n, k)
        assert (plan.split == 1) == (want[0] == 16) and (plan.predecode is not None) == predecoded, (fa, n, k)
        if predecoded:  # the bf16 rows of the activation in the call's scratch, as above M = 16
            assert plan.workspace.rows == (1, k // 16, 16) and plan.consts.ACT_ELEM == ELEMENT_CODES["bf16"]
    # resolved to k_warps > 1: split 1 and no workspace, although the options keep split-K's cap
    b = bs.quantize(torch.randn(8192, 1024), "mxfp4").with_data_layout("mma_m16k16")
    monkeypatch.setattr(plans, "_mma_k_warps", lambda windows, programs, device, uneven=False: 8)
    plan = plans._mma_plan(a[:, :1024], b, False, 1, 8192, 1024, plans._mma_options(None, 1, 8192, False))
    assert (plan.consts[-2], plan.split, plan.workspace, plan.cfg.config["num_warps"]) == (8, 1, None, 8)
    # K slices with shared B: 4 warps each, 64 rows per row group of the program
    x = bs.quantize(torch.randn(16, 1024), "nvfp4").with_data_layout("k_order")
    b = bs.quantize(torch.randn(8192, 1024), "nvfp4").with_data_layout("mma_m16k16")
    plan = plans._mma_plan(x, b, False, 16, 8192, 1024, plans._mma_options({"k_warps": 4, "row_groups": 1}, 16, 8192, True))
    assert (plan.consts[-4:], plan.split, plan.workspace, plan.cfg.config["num_warps"]) == ((True, 0, 4, False), 1, None, 16)


def test_k_slices_options(monkeypatch):
    """K slices by default at 1 < M <= 16 (132 SMs): 4 slices of two row groups where their programs
    (2 per SM) make >= 1 wave (at M > 8), else 8 of one row
    group where theirs (1 per SM) fill 0.9-1 wave, only at K <= 8192; else split-K. The plan
    takes the slices' row groups, split 1, no workspace and 16 / 32 warps, and with 8 slices for
    fp4 weights one window ahead and two windows per K-loop iteration (unless the config gives "unroll")."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    shapes = [(8192, 8192), (10240, 8192), (57344, 8192), (8192, 28672), (1024, 8192), (8448, 8192), (8192, 192)]
    # 57344: 448 programs of two groups = 1.7 waves; 8192: 128 of one = 0.97; 10240: 160 = 1.21, 80 = 0.30
    assert {(n, k): plans._mma_k_slices(k // 64, n, cpu) for n, k in shapes} == {
        (8192, 8192): (8, 1, 1, 2), (10240, 8192): None, (57344, 8192): (4, 2, 0, 1), (8192, 28672): None,
        (1024, 8192): None, (8448, 8192): (8, 1, 1, 2), (8192, 192): None}  # 3 windows: no 8 slices
    x = bs.quantize(torch.randn(16, 8192), "mxfp8").with_data_layout("k_order")
    for pair_b, n, expected in (("mxfp8", 8192, (8, 1, 32)), ("mxfp4", 8192, (8, 1, 32)), ("mxfp4", 57344, (4, 2, 16))):
        b = bs.quantize(torch.randn(64, 8192), pair_b).with_data_layout("mma_m16k16")
        plan = plans._mma_plan(x, b, False, 16, n, 8192, plans.mma_options_for(None, x, b, 16, n))
        row_groups, split, shared_b, ahead, k_warps, _ = plan.consts[-6:]
        assert (k_warps, row_groups, plan.cfg.config["num_warps"]) == expected and shared_b
        assert (split == 1) == (k_warps > 1) and (plan.workspace is None) == (k_warps > 1)
    bf16 = torch.randn(16, 8192).to(torch.bfloat16)
    b = bs.quantize(torch.randn(8192, 8192), "mxfp4").with_data_layout("mma_m16k16")
    plan = plans._mma_plan(bf16[:9], b, False, 9, 8192, 8192, plans.mma_options_for(None, bf16[:9], b, 9, 8192))
    assert plan.consts[-6:] == (1, 1, True, 1, 8, False) and plan.workspace is None  # 8 slices, bf16 x fp4: ahead 1
    for w in ("mxfp8", "mxfp4"):  # not for fp8 weights, nor at 4 slices
        for act, n in ((bf16, 8192), (x, 8192), (bf16, 57344), (x, 57344)):
            b = bs.quantize(torch.randn(64, 8192), w).with_data_layout("mma_m16k16")
            plan = plans._mma_plan(act, b, False, 16, n, 8192, plans.mma_options_for(None, act, b, 16, n))
            eight_on_fp4 = w == "mxfp4" and n == 8192  # 8 slices, any activation on fp4 weights: ahead 1, unroll 2
            # bf16 on fp8 weights at 8192^2: 4 slices of one row group, ahead 1, unroll 2 (MMA_BF16_FP8_M16_SLICES)
            four_bf16_fp8 = w == "mxfp8" and n == 8192 and act is bf16
            assert plan.consts[-3] == int(eight_on_fp4 or four_bf16_fp8), (w, n)
            assert plan.cfg.config.get("range_unroll_factors", [0, 1]) == [0, 1 + (eight_on_fp4 or four_bf16_fp8)], (w, n)
            if n == 8192:
                assert plan.consts[-2] == (4 if four_bf16_fp8 else 8) and plan.consts[-5] == 1, (w, act.dtype)
                assert plan.cfg.config["num_warps"] == (16 if four_bf16_fp8 else 32)
            if eight_on_fp4:  # a given unroll wins
                options = plans.mma_options_for({"unroll": 1}, act, b, 16, n)
                assert "range_unroll_factors" not in plans._mma_plan(act, b, False, 16, n, 8192, options).cfg.config
    for m, act in ((3, bf16[:3]), (8, bs.quantize(torch.randn(8, 8192), "nvfp4").with_data_layout("k_order"))):
        for w, n, expected in (("mxfp4", 8192, (1, 1, True, 1, 8)), ("mxfp8", 8192, (1, 1, True, 0, 8)),
                               ("mxfp4", 57344, None)):  # 1 < M <= 8: 8 slices with shared B, else split-K
            wb = bs.quantize(torch.randn(64, 8192), w).with_data_layout("mma_m16k16")
            plan = plans._mma_plan(act, wb, False, m, n, 8192, plans.mma_options_for(None, act, wb, m, n))
            assert plan.consts[-6:-1] == expected if expected else (plan.consts[-2] == 1 and plan.split > 1), (m, w, n)
    plan = plans._mma_plan(bf16, b, False, 16, 8192, 8192, plans.mma_options_for({"row_groups": 2}, bf16, b, 16, 8192))
    assert plan.consts[-2] == 1 and plan.split > 1  # a config that sets row_groups: split-K


def test_fp8_m16_ahead_options(monkeypatch):
    """fp8 weights on split-K at 8 < M <= 16 load one window ahead from K = MMA_FP8_M16_AHEAD_K (not
    below it, not fp4 weights, not at M <= 8, not where K slices run); a config that gives "ahead"
    (or anything that leaves the automatic plan) keeps its own, one that gives "unroll" only keeps the rule."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    threshold = plans.MMA_FP8_M16_AHEAD_K

    def tail(w, m, n, k, config=None, act="bf16"):
        b = bs.quantize(torch.randn(64, k), w).with_data_layout("mma_m16k16")
        a = torch.randn(m, k).to(torch.bfloat16) if act == "bf16" else bs.quantize(torch.randn(m, k), act).with_data_layout("k_order")
        plan = plans._mma_plan(a, b, False, m, n, k, plans.mma_options_for(config, a, b, m, n))
        row_groups, split, shared_b, ahead, k_warps, _ = plan.consts[-6:]
        return ahead, k_warps, split > 1

    for act in ("bf16", "mxfp8"):
        assert tail("mxfp8", 16, 8192, 28672, act=act) == (1, 1, True)
        assert tail("mxfp8", 16, 8192, threshold, act=act) == (1, 1, True)
        assert tail("mxfp8", 16, 8192, threshold - 64, act=act)[0] == 0
        assert tail("mxfp8", 16, 10240, 8192, act=act) == (0, 1, True)  # split-K, short K
        assert tail("mxfp8", 16, 57344, 8192, act=act) == (0, 4, False)  # K slices
        assert tail("mxfp4", 16, 8192, 28672, act=act) == (0, 1, True)
        assert tail("mxfp8", 8, 8192, 28672, act=act)[0] == 0
    assert tail("mxfp8", 16, 8192, 28672, {"ahead": 0}) == (0, 1, True)
    assert tail("mxfp8", 16, 8192, 28672, {"unroll": 2}) == (1, 1, True)


def test_stage_b_options(monkeypatch):
    """Staged B: by default for fp4 / fp8 activations at M = 1 (132 SMs) with `_mma_k_warps`'s warps,
    one row group and no shared B, where M x (2 K + 16) <= 32 KB + 16 and a lane stages at most 16
    chunks of 16 K (else the split-K default, as before); given, it needs fp4 / fp8
    activations at M <= 8, k_warps > 1 and no shared B, and a plan it fits."""

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    # (N, K): (k_warps, staged); 8192 x 28672: 57 KB; 1024 x 8192: 64 programs, split-K; K = 16384: the largest;
    # K = 4096: 4 windows per warp, lanes 16-31 stage chunks 0-15 again; 4096 x 14336: 0.48 of a wave, split-K
    expected = {(8192, 8192): (16, True), (10240, 8192): (8, True), (57344, 8192): (16, True), (8192, 28672): (1, False),
                (1024, 8192): (1, False), (8192, 16384): (16, True), (8192, 1024): (16, True), (4096, 4096): (16, True),
                (6144, 4096): (16, True), (28672, 4096): (16, True), (4096, 14336): (1, False)}
    for (n, k), want in expected.items():
        b = bs.quantize(torch.randn(64, k), "nvfp4").with_data_layout("mma_m16k16")
        options = plans._mma_options(None, 1, n, True)
        x = bs.quantize(torch.randn(1, k), "nvfp4").with_data_layout("k_order")
        plan = plans._mma_plan(x, b, False, 1, n, k, options)
        row_groups, split, shared_b, ahead, k_warps, staged = plan.consts[-6:]
        assert (k_warps, staged) == want, (n, k)
        if staged:
            assert (row_groups, split, shared_b, ahead, plan.workspace, plan.cfg.config["num_warps"]) == (
                1, 1, False, 0, None, k_warps)
        else:  # the split-K default of fp4 / fp8 activations: two row groups, shared B
            assert (row_groups, shared_b, k_warps) == (2, True, 1) and split > 1
    assert plans._mma_stage_b(1, 16384, 2) and not plans._mma_stage_b(1, 16384 + 64, 1) and not plans._mma_stage_b(2, 16384, 2)
    assert plans._mma_stage_b(3, 2048, 4) and plans._mma_stage_b(3, 2048, 8)  # 3 x 8 steps / 8 = 3 chunks a lane; 3 x 4 / 8: 2
    assert plans._mma_stage_b(1, 1024, 16) and not plans._mma_stage_b(1, 1024, 32)  # a window a warp; none
    given = {"stage_b": True, "k_warps": 4, "shared_b": False}
    assert plans._mma_options(given, 8, 8192, True) == (1, 0, 2, False, False, 0, 4, True, 0, 64, True, 0, True, True, None, 2, False, False, False, 8, False)  # two row groups unless given
    assert plans._mma_options({"k_warps": 4}, 1, 8192, True).stage_b is False  # another key given: not staged
    for bad, m, narrow in ((given, 9, True), (given, 1, False), ({**given, "k_warps": 1}, 1, True),
                           ({"stage_b": True, "k_warps": 4}, 1, True), ({"stage_b": True}, 1, True)):
        with pytest.raises(ValueError, match="stage_b runs fp4 / fp8 activations at M <= 8 with 'k_warps' > 1"):
            plans._mma_options(bad, m, 8192, narrow)
    with pytest.raises(ValueError, match="stage_b must be a bool"):
        plans._mma_options({**given, "stage_b": 1}, 1, 8192, True)
    b = bs.quantize(torch.randn(64, 16384), "nvfp4").with_data_layout("mma_m16k16")
    x2 = bs.quantize(torch.randn(2, 16384), "nvfp4").with_data_layout("k_order")
    with pytest.raises(ValueError, match=r"stage_b needs M x \(2 K \+ 16\) <= 32784 bytes"):
        plans._mma_plan(x2, b, False, 2, 64, 16384, plans._mma_options({**given, "k_warps": 2}, 2, 64, True))


def test_preload_options(monkeypatch):
    """"preload" (a warp's windows as straight-line code, every word loaded first): off by default; given, it takes B
    per warp (shared B off unless given) and the K warps or split of the plan, and is refused by name with shared or
    staged B, windows ahead, above M = 16, a split that does not divide the windows, or windows whose words pass
    MMA_PRELOAD_MAX_REGISTERS (bf16 x nvfp4 at M = 1: 13 registers a window, so 9 windows at most)."""
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    assert not plans._mma_options(None, 1, 8192, False).preload
    given = plans._mma_options({"preload": True}, 1, 4096, True)
    assert given.preload and not given.shared_b
    b = bs.quantize(torch.randn(64, 4096), "nvfp4").with_data_layout("mma_m16k16")
    x = torch.randn(1, 4096, dtype=torch.bfloat16)
    assert plans._mma_preload_registers(x, b, 1, 1) == 13
    plan = plans._mma_plan(x, b, False, 1, 4096, 4096, plans._mma_options({"preload": True}, 1, 4096, False))
    assert plan.consts.PRELOAD and plan.consts.K_WARPS == 16 and plan.split == 1  # the default's 16 warps, 4 windows each
    plan = plans._mma_plan(x, b, False, 1, 4096, 4096, plans._mma_options({"preload": True, "split": 8}, 1, 4096, False))
    assert plan.consts.PRELOAD and plan.split == 8 and plan.consts.K_WARPS == 1  # 8 windows a program
    for bad, m in (({"preload": True, "shared_b": True}, 1), ({"preload": True, "ahead": 1, "shared_b": True}, 16),
                   ({"preload": True}, 17), ({"preload": 1}, 1), ({"preload": True, "stage_b": True, "k_warps": 4}, 1)):
        with pytest.raises(ValueError, match="preload is a bool"):
            plans._mma_options(bad, m, 4096, True)
    for config in ({"split": 3}, {"split": 4}):  # 64 windows: 3 does not divide them; 4 leaves 16 a program (208 registers)
        with pytest.raises(ValueError, match="preload needs a split dividing the K / 64 = 64 windows"):
            plans._mma_plan(x, b, False, 1, 4096, 4096, plans._mma_options({**config, "preload": True}, 1, 4096, False))


def test_unroll_options():
    """"unroll" 1 or 2 unrolls the K loop (Helion's range_unroll_factors on the loop, index 1); other values
    are refused, naming the key. Above M = 16 fp4 weights take 2 by default from K = MMA_M64_UNROLL_K (16384),
    fp8 weights and shorter K 1; a given "unroll" wins."""

    b = bs.quantize(torch.randn(64, 1024), "mxfp4").with_data_layout("mma_m16k16")
    x = torch.randn(16, 1024, dtype=torch.bfloat16)
    for unroll in (1, 2):
        plan = plans._mma_plan(x, b, False, 16, 64, 1024, plans._mma_options({"unroll": unroll}, 16, 64, False))
        assert plan.cfg.config.get("range_unroll_factors", [0, 1]) == [0, unroll]
    x64 = torch.randn(64, 16384, dtype=torch.bfloat16)
    for w, k, config, expected in (("nvfp4", 16384, None, 2), ("mxfp4", 16384, None, 2), ("mxfp4", 16320, None, 1),
                                   ("mxfp8", 16384, None, 1), ("nvfp4", 16384, {"unroll": 1}, 1)):
        wb = bs.quantize(torch.randn(128, k), w).with_data_layout("mma_m16k16")
        plan = plans._mma_plan(x64[:, :k], wb, False, 64, 128, k, plans.mma_options_for(config, x64[:, :k], wb, 64, 128))
        assert plan.cfg.config.get("range_unroll_factors", [0, 1]) == [0, expected], (w, k, config)
    for bad in (0, 3, 2.0, True):
        with pytest.raises(ValueError, match="unroll must be 1 or 2"):
            plans._mma_options({"unroll": bad}, 16, 64, False)


def test_wide_b_options():
    """bf16 and fp8 activations above M = 16 take "wide_b" (16-byte loads of a thread's share) by default where their
    data is 16-byte aligned, else not (an activation 8 bytes into its storage); fp4 activations and M <= 16 never, nor with the eviction hints; a given True where it cannot run is refused, naming the key. The plan passes
    it as WIDE_B."""

    b = bs.quantize(torch.randn(128, 1024), "mxfp4").with_data_layout("mma_m16k16")
    x = torch.randn(64, 1024, dtype=torch.bfloat16)
    shifted = torch.randn(64 * 1024 + 4, dtype=torch.bfloat16)[4:].view(64, 1024)  # 8 bytes into its storage
    assert x.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 8
    xq, x4 = bs.quantize(x.float(), "mxfp8"), bs.quantize(x.float(), "nvfp4")
    assert plans.mma_options_for(None, x, b, 64, 128).wide_b is True
    assert plans.mma_options_for(None, shifted, b, 64, 128).wide_b is False
    # fp4 / fp8 activations on fp4 weights run the bf16 plan over rows decoded into a buffer of the plan's own
    assert _wide_predecode(plans.mma_options_for(None, xq, b, 64, 128)) == (True, True)
    assert _wide_predecode(plans.mma_options_for(None, x4, b, 64, 128)) == (True, True)
    assert plans.mma_options_for({"predecode": False}, xq, b, 64, 128).wide_b is True  # fp8: 16 bytes a thread
    assert plans.mma_options_for({"predecode": False}, x4, b, 64, 128).wide_b is False  # fp4: one 8-byte word
    assert plans.mma_options_for(None, x[:16], b, 16, 128).wide_b is False
    assert plans.mma_options_for({"wide_b": False}, x, b, 64, 128).wide_b is False
    assert plans.mma_options_for({"max_split": 2}, x, b, 64, 128).wide_b is True
    assert plans.mma_options_for({"evict": True}, x, b, 64, 128).wide_b is False  # the hinted loads
    plan = plans._mma_plan(x, b, False, 64, 128, 1024, plans.mma_options_for(None, x, b, 64, 128))
    assert plan.consts.WIDE_B is True
    for bad, a, m in (({"wide_b": True}, shifted, 64), ({"wide_b": True, "predecode": False}, x4, 64),
                      ({"wide_b": True}, x[:16], 16),
                      ({"wide_b": 1}, x, 64), ({"wide_b": True, "evict": True}, x, 64)):
        with pytest.raises(ValueError, match="wide_b is a bool"):
            plans.mma_options_for(bad, a, b, m, 128)


def test_predecode_options(monkeypatch):
    """fp4 / fp8 activations on fp4 weights above M = 16 are decoded to bf16 rows before the mma kernel by default
    ("predecode"), which then runs the bf16 plan: bf16 activation codes, its split and 16-byte loads, over rows of the
    plan's own; not at M <= 16, nor on fp8 weights, unless given; refused for bf16 activations or as a non-bool."""
    from blockscaled.kernels import api

    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    fp4_w = bs.quantize(torch.randn(256, 2048), "mxfp4").with_data_layout("mma_m16k16")
    fp8_w = bs.quantize(torch.randn(256, 2048), "mxfp8").with_data_layout("mma_m16k16")
    x = torch.randn(64, 2048)
    acts = {fmt: bs.quantize(x, fmt) for fmt in ("nvfp4", "mxfp4", "mxfp8")}
    for fmt, a in acts.items():
        for m in (17, 64):
            options = plans.mma_options_for(None, bs.quantize(x[:m], fmt), fp4_w, m, 256)
            assert options.predecode and options == plans.mma_options_for(None, x[:m].to(torch.bfloat16), fp4_w, m, 256)._replace(
                predecode=True), (fmt, m)
        assert not plans.mma_options_for(None, bs.quantize(x[:16], fmt), fp4_w, 16, 256).predecode
        assert not plans.mma_options_for(None, a, fp8_w, 64, 256).predecode
        assert plans.mma_options_for({"predecode": True}, a, fp8_w, 64, 256).predecode
        assert not plans.mma_options_for({"predecode": False}, a, fp4_w, 64, 256).predecode
        a16 = bs.quantize(x[:16], fmt)
        assert plans.mma_options_for({"predecode": True}, a16, fp4_w, 16, 256) == plans.mma_options_for(
            None, x[:16].to(torch.bfloat16), fp4_w, 16, 256)._replace(predecode=True)
        plan = plans._mma_plan(a, fp4_w, False, 64, 256, 2048, plans.mma_options_for(None, a, fp4_w, 64, 256))
        bf16_plan = plans._mma_plan(x.to(torch.bfloat16), fp4_w, False, 64, 256, 2048,
                                  plans.mma_options_for(None, x.to(torch.bfloat16), fp4_w, 64, 256))
        assert plan.consts == bf16_plan.consts and plan.predecode.launch is None
        shape = (64, 2048 // a.fmt.block_size, a.fmt.block_size)  # bf16 rows: per call, not the plan's (scratch.py)
        assert plan.workspace.rows == shape
        assert plan.workspace._replace(rows=None) == (bf16_plan.workspace or api.ScratchSpec())
        work = api.scratch.get(None, plan.workspace, torch.device("cpu"))
        assert work.rows.dtype == torch.bfloat16 and work.rows.shape == shape
        assert plans._mma_plan(a, fp4_w, False, 64, 256, 2048,
                             plans.mma_options_for({"predecode": False}, a, fp4_w, 64, 256)).predecode is None
    for bad, a in (({"predecode": True}, x.to(torch.bfloat16)), ({"predecode": 1}, acts["nvfp4"])):
        with pytest.raises(ValueError, match="predecode is a bool"):
            plans.mma_options_for(bad, a, fp4_w, 64, 256)
    with pytest.raises(ValueError, match="stage_b runs fp4 / fp8 activations"):  # the bf16 plan's keys only
        plans.mma_options_for({"predecode": True, "stage_b": True, "k_warps": 2, "shared_b": False},
                            bs.quantize(x[:1], "nvfp4"), fp4_w, 1, 256)


def test_tile_m_options(monkeypatch):
    """Above M = 64 a program takes 128 activation rows by default up to M = MMA_TILE_128_MAX_M (wgmma,
    one window ahead) and from MMA_M64_WARPS_16_MIN_M with 16 warps (N % 256 == 0), else 64, and 64 where the device has no wgmma; the plan counts its programs over M
    for the wave rule (2 resident per SM with 128 rows; above M = 128 no split from half a wave). Other values,
    M <= 64, mma.sync and other "ahead" are refused, naming the key."""

    assert plans.MMA_TILE_128_MAX_M == 128
    for m, config, expected in ((65, {}, 128), (128, {}, 128), (129, {}, 64), (4096, {}, 128), (4096, {"warps": 8}, 64), (100, {"ahead": 2}, 64),
                                (100, {"wgmma": False}, 64), (300, {"tile_m": 128}, 128), (128, {"tile_m": 64}, 64)):
        assert plans._mma_options(config, m, 256, False).tile_m == expected, (m, config)
    b = bs.quantize(torch.randn(256, 1024), "mxfp4").with_data_layout("mma_m16k16")
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    for m, tile_m in ((300, 128), (300, 64), (100, 128)):
        x = torch.randn(m, 1024, dtype=torch.bfloat16)
        plan = plans._mma_plan(x, b, False, m, 256, 1024, plans._mma_options({"tile_m": tile_m, "max_split": 1}, m, 256, False))
        assert plan.consts.TILE_M == tile_m and plan.split == 1
        assert (plan.consts.WGMMA, plan.consts.AHEAD) == (True, 1)
    # 128 rows: 2 resident per SM for the wave rule whatever the pair (127 registers): 10240 x 8192 splits by 8
    x = torch.randn(128, 1024, dtype=torch.bfloat16)
    plan = plans._mma_plan(x, b, False, 128, 10240, 8192, plans._mma_options({}, 128, 10240, False))
    assert plan.consts[-4] == 128 and plans.MMA_M64_TILE_128_PROGRAMS_PER_SM == 2 and plan.split == 8
    plan = plans._mma_plan(x, b, False, 128, 10240, 8192, plans._mma_options({"tile_m": 64}, 128, 10240, False))
    assert plan.split == plans._mma_split(128, 160, plans.MMA_M64_MAX_SPLIT, plans.MMA_M64_PROGRAMS_PER_SM[True, False], None)
    # above M = 128 no split from half a wave of programs (bf16 activations: 3 resident per SM, 396 on 132 SMs; 8 warps)
    for m, n, split in ((192, 8192, 2), (192, 10240, 1), (256, 8192, 1), (1024, 8192, 1), (1024, 10240, 1)):
        x = torch.randn(m, 1024, dtype=torch.bfloat16)
        plan = plans._mma_plan(x, b, False, m, n, 8192, plans._mma_options({"warps": 8}, m, n, False))
        assert (plan.consts[-4], plan.split) == (64, split), (m, n)
    plan = plans._mma_plan(x, b, False, 1024, 10240, 8192, plans._mma_options({"max_split": 4}, 1024, 10240, False))
    assert plan.split == 4  # a config's max_split: the largest
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: False)  # mma.sync: 64 rows per program
    plan = plans._mma_plan(x, b, False, 100, 256, 1024, plans._mma_options({}, 100, 256, False))
    assert plan.consts[-4] == 64 and plan.consts[-6] is False
    for bad, m in (({"tile_m": 96}, 100), ({"tile_m": 128}, 64), ({"tile_m": 128, "wgmma": False}, 100),
                   ({"tile_m": 128, "ahead": 2}, 100), ({"tile_m": 128.0}, 100)):
        with pytest.raises(ValueError, match="tile_m must be 64, or 128"):
            plans._mma_options(bad, m, 256, False)


def test_sixteen_warps_options(monkeypatch):
    """"warps": 16 (mma_m64_kernel with 256 weight rows and 128 activation rows a program): only with tile_m 128 (M >
    64, wgmma, ahead 1) on N % 256 == 0, without the fragment-order workspace or cluster sums (laid out for 256
    threads); the plan runs 16 warps, the WARPS constant, a program per 256 x 128 and the wave rule with one program
    an SM (M = 256, 8192^2: 64 programs, split 2). The default from MMA_M64_WARPS_16_MIN_M rows on N % 256 == 0
    unless the config names warps, tile_m, fragment_sums or cluster; 8 warps and 64 rows where wgmma does not run."""
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    b = bs.quantize(torch.randn(8192, 1024), "mxfp4").with_data_layout("mma_m16k16")
    x = torch.randn(256, 1024, dtype=torch.bfloat16)
    assert plans._mma_options({}, 256, 8192, False).warps == plans.MMA_M64_WARPS == 8
    options = plans._mma_options({"warps": 16, "tile_m": 128}, 256, 8192, False)
    assert (options.warps, options.fragment_sums, options.cluster) == (16, False, False)
    plan = plans._mma_plan(x, b, False, 256, 8192, 8192, options)
    assert (plan.consts.WARPS, plan.consts.TILE_M, plan.cfg.config["num_warps"], plan.split) == (16, 128, 16, 2)
    assert plan.workspace.sums == 256 * 8192 and plan.workspace.tickets == 64  # at the outputs' positions, a ticket a tile
    eight = plans._mma_plan(x, b, False, 256, 8192, 8192, plans._mma_options({"tile_m": 128}, 256, 8192, False))
    assert (eight.consts.WARPS, eight.cfg.config["num_warps"]) == (8, 8)
    for bad, m in (({"warps": 16}, 256), ({"warps": 16, "tile_m": 128}, 64), ({"warps": 12, "tile_m": 128}, 256),
                   ({"warps": 16, "tile_m": 128, "fragment_sums": True}, 256),
                   ({"warps": 16, "tile_m": 128, "cluster": True}, 256), ({"warps": 16.0, "tile_m": 128}, 256)):
        with pytest.raises(ValueError, match="warps is 8, or 16 with tile_m 128|tile_m must be 64, or 128"):
            plans._mma_options(bad, m, 8192, False)
    with pytest.raises(ValueError, match="warps 16 runs wgmma with tile_m 128 on N % 256 == 0"):
        plans._mma_plan(x, b, False, 256, 8192 + 128, 8192, plans._mma_options({"warps": 16, "tile_m": 128}, 256, 8192 + 128, False))
    low = plans.MMA_M64_WARPS_16_MIN_M
    for config, m, n, expected in (({}, low, 8192, (16, 128)), ({}, 4 * low, 8192, (16, 128)),
                                   ({}, low - 1, 8192, (8, 64)), ({}, low, 8192 + 128, (8, 64)),
                                   ({"tile_m": 128}, low, 8192, (8, 128)), ({"cluster": True}, low, 8192, (8, 64)),
                                   ({"split": 2}, low, 8192, (16, 128)), ({"wgmma": False}, low, 8192, (8, 64))):
        options = plans._mma_options(config, m, n, False)
        assert (options.warps, options.tile_m) == expected, (config, m, n)
    x = torch.randn(low, 1024, dtype=torch.bfloat16)
    plan = plans._mma_plan(x, b, False, low, 8192, 8192, plans._mma_options({}, low, 8192, False))
    assert (plan.consts.WARPS, plan.consts.TILE_M, plan.split) == (16, 128, 1)  # 128 programs: one wave unsplit
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: False)  # mma.sync: 8 warps, 64 rows
    plan = plans._mma_plan(x, b, False, low, 8192, 8192, plans._mma_options({}, low, 8192, False))
    assert (plan.consts.WARPS, plan.consts.TILE_M) == (8, 64)


def test_dense_plan_rows(monkeypatch):
    """The default call's dense plan from DENSE_MIN_M rows, except below DENSE_MIN_M_SIXTEEN_WARPS where the 16-warp
    tile runs (wgmma, N % 256 == 0) with 3/4 to one wave of programs (N / 256 x M / 128, one an SM; 132 SMs here)."""
    from blockscaled.kernels import api

    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    device = torch.device("cuda")
    assert (api.DENSE_MIN_M, plans.MMA_M64_WARPS_16_MIN_M, api.DENSE_MIN_M_SIXTEEN_WARPS, api.SIXTEEN_WARPS_MIN_WAVE) == (
        512, 512, 1024, 0.75)
    for wgmma, m, n, dense in ((True, 511, 8192, False), (True, 512, 8192, False),  # 128 programs
                               (True, 513, 8192, True), (True, 768, 8192, True),  # 160, 192
                               (True, 1023, 4096, False), (True, 1024, 4096, True),  # 128, past the rows
                               (True, 512, 4096, True), (True, 768, 4096, True),  # 64, 96: under 3/4 of a wave
                               (True, 896, 4096, False),  # 112 programs
                               (True, 512, 10240, True), (True, 512, 8192 + 128, True), (False, 512, 8192, True),
                               (False, 511, 8192, False)):
        monkeypatch.setattr(plans, "_has_wgmma", lambda device: wgmma)
        assert api._dense_runs("bf16xmxfp4", m, n, device) == dense, (wgmma, m, n)


def test_cluster_options(monkeypatch):
    """mma_m64_kernel sums its split-K parts in a thread-block cluster (CLUSTER, its last constexpr) with wgmma,
    more than 2 programs per SM, split 2 .. 8 dividing the 4 x column groups accumulators, 64 activation rows per
    program; not without split, with "cluster": False, mma.sync, 128 rows, split 16 or at most 2 programs per SM
    (N = 8192, split 4: 256 programs on 132 SMs) or 6 parts (the default there: no cluster sum of 6); "cluster" is refused when not a bool. mma_gemv_kernel (M <= 16,
    CLUSTER its 7th constexpr from the end) by the same rule with its 4 x row groups x column groups accumulators:
    M = 16, 10240 x 8192 (split 8, 640 programs), fp8 weights at 8192 x 28672 (split 8, 512) and M <= 8 with 4 or 8
    accumulators in clusters of as many (one per CTA); not the K-slice plans (no split), split 16 (fp4 weights at
    8192 x 28672) or a split that does not divide the accumulators (M = 1, one row group, split 8)."""

    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    assert plans.MMA_CLUSTER_PROGRAMS_PER_SM == 2
    for m, n, config, split, cluster in ((64, 10240, {}, 4, True), (64, 10240, {"max_split": 8}, 8, True),
                                         (64, 57344, {"max_split": 2}, 2, True), (64, 8192, {"max_split": 4}, 4, False),
                                         (64, 8192, {}, 6, False),
                                         (64, 8192, {"max_split": 8}, 8, True), (64, 10240, {"cluster": False}, 4, False),
                                         (64, 10240, {"max_split": 1}, 1, False),
                                         (64, 10240, {"max_split": 4, "wgmma": False}, 4, False),
                                         (64, 10240, {"max_split": 16}, 16, False), (17, 10240, {"max_split": 4}, 4, True),
                                         (17, 10240, {"max_split": 8}, 8, False), (40, 10240, {"max_split": 4}, 4, True),
                                         (100, 10240, {"max_split": 4}, 4, False),
                                         (100, 10240, {"max_split": 4, "tile_m": 64}, 4, True)):
        b = bs.quantize(torch.randn(n, 128), "mxfp4").with_data_layout("mma_m16k16")
        x = torch.randn(m, 128, dtype=torch.bfloat16)
        plan = plans._mma_plan(x, b, False, m, n, 8192, plans._mma_options(config, m, n, False))
        assert (plan.split, plan.consts.CLUSTER) == (split, cluster), (m, n, config)
    for bad, m in (({"cluster": 1}, 16), ({"cluster": 1}, 64)):
        with pytest.raises(ValueError, match="cluster must be a bool"):
            plans._mma_options(bad, m, 8192, False)
    for m, n, k, w, config, split, cluster in ((16, 10240, 8192, "mxfp4", None, 8, True),
                                               (16, 10240, 8192, "mxfp4", {"cluster": False, "max_split": 8}, 8, False),
                                               (16, 8192, 28672, "mxfp8", None, 8, True),
                                               (16, 8192, 28672, "mxfp4", None, 16, False),
                                               (16, 8192, 8192, "mxfp4", None, 1, False),
                                               (16, 57344, 8192, "mxfp4", None, 2, True),  # not 4 K slices of two
                                               (12, 57344, 8192, "mxfp4", None, 2, True),
                                               (16, 57344, 8192, "mxfp8", None, 2, True),
                                               (16, 57344, 8192, "mxfp4", {"cluster": False}, 1, False),
                                               (8, 57344, 8192, "mxfp4", None, 16, False),  # one column group
                                               (9, 10240, 8192, "mxfp4", {"split": 4}, 4, True),
                                               (16, 4096, 8192, "mxfp4", {"split": 4}, 4, False),  # 128 programs
                                               (1, 10240, 8192, "mxfp4", {"max_split": 8, "row_groups": 1}, 8, False),
                                               (1, 10240, 8192, "mxfp4", {"max_split": 4, "row_groups": 1}, 4, True),
                                               (4, 10240, 8192, "mxfp4", {"max_split": 8, "row_groups": 2}, 8, True),
                                               (1, 10240, 8192, "mxfp4", {"max_split": 2, "row_groups": 1}, 2, True),
                                               (4, 10240, 8192, "mxfp4", {"max_split": 4, "row_groups": 2}, 4, True)):
        b = bs.quantize(torch.randn(128, k), w).with_data_layout("mma_m16k16")
        x = torch.randn(m, k).to(torch.bfloat16)
        plan = plans._mma_plan(x, b, False, m, n, k, plans.mma_options_for(config, x, b, m, n))
        assert (plan.split, plan.consts[-7], plans._mma_cluster_size(plan)) == (split, cluster, split if cluster else 1), (
            m, n, k, w, config)
    monkeypatch.setattr(plans, "_has_wgmma", lambda device: False)  # not sm_90: no clusters
    x = torch.randn(16, 8192).to(torch.bfloat16)
    plan = plans._mma_plan(x, b, False, 16, 10240, 8192, plans.mma_options_for(None, x, b, 16, 10240))
    assert plan.consts[-7] is False and plan.split == 8
    plan = plans._mma_plan(x, b, False, 16, 57344, 8192, plans.mma_options_for(None, x, b, 16, 57344))
    assert plan.split == 1 and plan.consts[-2] == 4  # 4 K slices of two row groups


def test_m16_cluster_split_by_pair(monkeypatch):
    """At M = 16, 57344 x 8192 on sm_90 every pair runs split-K by 2 in clusters of two row groups instead of 4 K
    slices of two."""

    monkeypatch.setattr(plans, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(plans, "_sm_count", lambda device: 132)
    for act_fmt, w in (("bf16", "mxfp4"), ("bf16", "nvfp4"), ("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp4"),
                       ("mxfp8", "mxfp8"), ("bf16", "mxfp8")):
        b = bs.quantize(torch.randn(128, 8192), w).with_data_layout("mma_m16k16")
        x = torch.randn(16, 8192)
        a = x.to(torch.bfloat16) if act_fmt == "bf16" else bs.quantize(x, act_fmt).with_data_layout("k_order")
        plan = plans._mma_plan(a, b, False, 16, 57344, 8192, plans.mma_options_for(None, a, b, 16, 57344))
        row_groups, split, _, ahead, k_warps, _ = plan.consts[-6:]
        assert (k_warps, split, plan.consts[-7]) == (1, 2, True) and row_groups == 2 and ahead == 0, (act_fmt, w)
        assert plan.workspace is not None and plan.cfg.config["num_warps"] == 4


def run_staged_b(m: int, k: int, k_warps: int):
    """Interpret `MMA_STAGED_B_STORE_PTX` for every lane of every warp of a program (bytes labelled
    (warp, row, 16-K chunk) of the chunk the lane decoded, by `staged_b_chunk`, at `staged_b_offset`),
    then `MMA_STAGED_B_LOAD_PTX` for every lane and window of each warp: the bytes each read."""
    from blockscaled.kernels.decode import (MMA_STAGED_B_LOAD_PTX, MMA_STAGED_B_STORE_PTX, staged_b_bytes, staged_b_chunk,
                                            staged_b_chunks, staged_b_offset)

    steps = k // 64 // k_warps
    chunks = staged_b_chunks(m, steps)
    wraps = chunks * 8 != m * steps  # lanes past the warp's last chunk store its first ones again
    ptx = MMA_STAGED_B_STORE_PTX[chunks]
    assert "bar.sync" not in ptx and ptx.count("bar.warp.sync -1;") == 1 and ptx.index("bar.warp") > ptx.rindex("st.shared")
    memory, size = {}, staged_b_bytes(m, k)
    for warp, lane in itertools.product(range(k_warps), range(32)):
        first = warp * steps
        ins = {}
        for j in range(chunks):
            row, k16 = staged_b_chunk(lane, j, first, steps, m)
            ins |= {f"${1 + 8 * j + i}": [(warp, row, k16, 4 * i + b) for b in range(4)] for i in range(8)}
            ins[f"${1 + 8 * chunks + j}"] = staged_b_offset(row, k16, k)
        ins[f"${1 + 9 * chunks}"] = 0  # the buffer's address
        # the first window's 5 words, which the store only waits for: every third lane's xor to 0x7fc00001, so
        # that its guarded store runs (and must be overwritten by the lane itself)
        early = [(warp * 32 + lane) * 7919 + i for i in range(4)]
        early.append(functools.reduce(operator.xor, early, 0x7fc00001 if lane % 3 == 0 else 0x7fc00000))
        ins |= {f"${2 + 9 * chunks + i}": word for i, word in enumerate(early)}
        regs, own = {}, set()  # own: bytes of this lane's guarded store, not yet overwritten
        for line in (x.strip() for x in ptx.strip()[1:-1].split(";")):
            if line.startswith("add.u32"):
                dst, x, y = line.split(None, 1)[1].split(", ")
                regs[dst] = ins[x] + ins[y]
            elif line.startswith(("mov.b32 x", "xor.b32")):
                dst, *srcs = line.split(None, 1)[1].split(", ")
                regs[dst] = functools.reduce(operator.xor, (regs[v] if v in regs else ins[v] for v in srcs))
            elif line.startswith("setp.eq.u32"):
                dst, x, y = line.split(None, 1)[1].split(", ")
                regs[dst] = regs[x] == int(y, 0)
            elif line.startswith("@p st.shared.b32"):
                assert regs["p"] == (lane % 3 == 0) and line == "@p st.shared.b32 [a], x"
                if regs["p"]:
                    own = {regs["a"] + b for b in range(4)}
                    assert wraps or not own & set(memory), "the guarded store over another lane's bytes"
                    memory |= {addr: "early" for addr in own}
            elif line.startswith("st.shared.v4.b32"):
                base, off, values = re.match(r"st\.shared\.v4\.b32 \[(\w+)\+(\d+)\], \{([^}]*)\}", line).groups()
                addr = regs[base] + int(off)
                assert addr % 16 == 0 and 0 <= addr and addr + 16 <= size
                for i, v in enumerate(values.split(", ")):
                    for b, label in enumerate(ins[v]):
                        assert (addr + 4 * i + b not in memory or addr + 4 * i + b in own
                                or (wraps and memory[addr + 4 * i + b] == label)), "a byte written twice"
                        own.discard(addr + 4 * i + b)
                        memory[addr + 4 * i + b] = label
        assert not own, "the guarded store not overwritten by the lane"
    assert "early" not in memory.values()
    reads = {}
    loads = re.findall(r"ld\.shared\.v4\.b32 \{([^}]*)\}, \[\$8(?:\+(\d+))?\]", MMA_STAGED_B_LOAD_PTX)
    for warp, lane, w in itertools.product(range(k_warps), range(32), range(steps)):
        g, q = lane >> 2, lane & 3
        row, win = min(g, m - 1), warp * steps + w
        addr = staged_b_offset(row, 4 * win + q, k)
        out = {}
        for outs, off in loads:
            for i, o in enumerate(outs.split(", ")):
                out[int(o[1:])] = [memory.get(addr + int(off or 0) + 4 * i + b) for b in range(4)]
        reads[warp, lane, win] = [out[r] for r in range(8)]
    return memory, size, reads


@pytest.mark.parametrize("m,k,k_warps", [(1, 8192, 16), (1, 16384, 2), (3, 2048, 4), (8, 1536, 2), (8, 1024, 2),
                                         (1, 4096, 16), (1, 14336, 16), (3, 2048, 8), (1, 1024, 16)])
def test_staged_b_gives_each_lane_its_b(m, k, k_warps):
    """Staged B, its PTX run for every lane of every warp: each warp writes each 16-K chunk of each
    activation row in its K range (where M x steps is not a multiple of 8 the lanes past the end store
    the first chunks again, the same data), inside the buffer; each lane (g, q) of each warp reads, in
    every window w of its range, the 8 registers of row min(g, M - 1) at K 64 w + 16 q in order
    (registers 2s, 2s + 1: step s), all written by its own warp (no barrier across warps)."""
    memory, size, reads = run_staged_b(m, k, k_warps)
    steps = k // 64 // k_warps
    assert len(memory) == 2 * m * k and size == m * (2 * k + 16)
    for (warp, lane, win), regs in reads.items():
        row = min(lane >> 2, m - 1)
        for i, word in enumerate(regs):
            assert word == [(warp, row, 4 * win + (lane & 3), 4 * i + b) for b in range(4)], (warp, lane, win, i)
        assert win // steps == warp


@pytest.mark.parametrize("values,k_warps,group,rounds", [(2, 2, 32, 1), (4, 16, 32, 1), (6, 4, 32, 1), (16, 16, 32, 1),
                                                          (12, 8, 32, 1), (4, 8, 128, 1), (16, 4, 128, 2), (8, 8, 128, 4)])
def test_k_warp_sum_adds_every_warp(values, k_warps, group, rounds, gen):
    """`decode.MMA_K_WARP_SUM_PTX`, run for the k_warps groups of `group` threads of a program
    (a small interpreter of the instructions it uses, fp32 adds rounded as the GPU's; every
    thread runs to a barrier before any goes past it): thread t < group gets value j of thread t
    summed over the groups, in group order; the others keep their own; every shared access is
    aligned and inside the declared buffer, every round writes each word of it once,
    nothing is read that was not written in the same round, and group 0's loads go out in batches."""
    from blockscaled.kernels.decode import K_WARP_SUM_LOADS, MMA_K_WARP_SUM_PTX

    body = MMA_K_WARP_SUM_PTX[values, k_warps, group, rounds].strip()[1:-1]
    size = int(re.search(r"\.shared \.align 16 \.b8 kr\[(\d+)\];", body).group(1))
    code = [s.strip() for s in body.split(";") if s.strip() and not s.strip().startswith((".shared", ".reg"))]
    barriers = [i for i, line in enumerate(code) if line == "bar.sync 0"]
    assert len(barriers) == 2 * rounds - 1
    phases = [code[a + 1:b] for a, b in zip([-1, *barriers], [*barriers, len(code)], strict=True)]
    # group 0 issues its loads K_WARP_SUM_LOADS at a time, into distinct registers, before adding them (one register
    # reused had ptxas wait for every load in turn)
    for phase in phases[1::2]:
        ops = [line.split()[1] for line in phase if line.startswith("@!p")]
        first_add = ops.index("add.f32")
        assert first_add == min(K_WARP_SUM_LOADS, (k_warps - 1) * values // rounds), ops
        assert len({line.split()[2] for line in phase if "ld.shared" in line}) == min(K_WARP_SUM_LOADS, len(ops) // 2)
    threads = group * k_warps
    inputs = [[f32(x) for x in row] for row in torch.randn(threads, values, generator=gen).tolist()]
    memory, outputs = {}, [[None] * values for _ in range(threads)]
    alu = {"shr.u32": lambda x, y: x >> y, "and.b32": lambda x, y: x & y, "sub.u32": lambda x, y: (x - y) & U32}

    def run(tid, lines, regs, written):
        def val(operand):
            if operand.startswith("$"):
                return inputs[tid][int(operand[1:]) - values]
            return regs[operand] if operand in regs else int(operand, 0)

        for line in lines:
            guard, line = re.match(r"(@!?p )?(.*)", line).groups()
            if guard and (guard == "@p ") != regs["p"]:
                continue
            op, args = line.split(None, 1)
            if op in ("st.shared.f32", "ld.shared.f32"):
                base, offset = re.search(r"\[(\w+)\+(\d+)\]", args).groups()
                addr = regs[base] + int(offset)
                assert addr % 4 == 0 and 0 <= addr < size, (op, addr)
                if op.startswith("st"):
                    assert addr not in written, addr
                    memory[addr] = val(args.split(", ")[1])
                    written.add(addr)
                else:
                    assert addr in memory, addr
                    regs[args.split(",")[0]] = memory[addr]
                continue
            dst, *srcs = args.split(", ")
            if op == "mov.u32":
                regs[dst] = tid if srcs[0] == "%tid.x" else 0  # the buffer's address: 0
            elif op == "mov.b32" and dst.startswith("$"):
                outputs[tid][int(dst[1:])] = regs[srcs[0]]
            elif op == "mov.b32":
                regs[dst] = val(srcs[0])
            elif op == "setp.ne.u32":
                regs[dst] = val(srcs[0]) != val(srcs[1])
            elif op == "mad.lo.u32":
                regs[dst] = (val(srcs[0]) * val(srcs[1]) + val(srcs[2])) & U32
            elif op == "add.f32":
                regs[dst] = f32(val(srcs[0]) + val(srcs[1]))
            else:
                regs[dst] = alu[op](val(srcs[0]), val(srcs[1]))
        return regs

    regs = [{} for _ in range(threads)]
    for phase in phases:
        written = set()
        for t in range(threads):
            run(t, phase, regs[t], written)
        assert not written or len(written) * 4 == size  # a round's writes: every word once
    for t in range(threads):
        if t < group:
            expected = []
            for j in range(values):
                total = inputs[t][j]
                for w in range(1, k_warps):
                    total = f32(total + inputs[group * w + t][j])
                expected.append(total)
            assert outputs[t] == expected, t
        else:
            assert outputs[t] == inputs[t], t


def test_k_warp_sum_fits_static_shared_memory():
    """Every mma_gemv_kernel plan with k_warps > 1 finds its sum PTX, and with it and its shared
    B buffers fits in the 48 KB of static shared memory (M = 16, two row groups, 8 slices: the
    16 sums pass in 8 rounds of 2)."""
    from blockscaled.kernels.decode import MMA_K_WARP_SUM_PTX, STATIC_SHARED_BYTES, k_warp_sum_rounds, shared_b_bytes
    from blockscaled.kernels.mma_gemv import output_slots, program_row_warps

    for m, row_groups, shared_b in itertools.product(range(1, 17), (1, 2), (False, True)):
        col_groups = -(-m // 8)
        for k_warps in (2, 4, 8) if shared_b else (2, 4, 8, 16):
            n = len(output_slots(m, row_groups, col_groups))
            group = 32 * program_row_warps(k_warps, shared_b)
            exchange = shared_b_bytes(col_groups, k_warps) if shared_b else 0
            rounds = k_warp_sum_rounds(n, k_warps, group, exchange)
            ptx = MMA_K_WARP_SUM_PTX[n, k_warps, group, rounds]
            size = int(re.search(r"kr\[(\d+)\]", ptx).group(1))
            assert size + exchange <= STATIC_SHARED_BYTES, (m, row_groups, k_warps)
    assert k_warp_sum_rounds(16, 8, 128, shared_b_bytes(2, 8)) == 8


def run_shared_b_exchange(ptx: str, parity: int, first_input: int, threads: int = 128, reads: tuple[str, ...] = (),
                          size: int | None = None, rank: int = 0, given=None):
    """Run the PTX of `decode.MMA_SHARED_B_PTX` (or its `MMA_SHARED_B_ADDRESSES_PTX`), `MMA_M64_EXCHANGE_PTX` or
    `WGMMA_EXCHANGE_PTX` for the threads of a program, its instructions as written (a small interpreter for the
    ones it uses): every thread up to the barrier (if any), its input bytes ($first_input on, in order)
    labelled (thread, byte offset in its inputs), other inputs from `given` (thread -> {operand: value}) or,
    the first `mad.lo.u32` operand, the window's parity, then every thread after the barrier, then the `reads`
    (PTX of `ld.shared` instructions, such as those of `MMA_STEPS_M64_PTX`) with $20 = the
    thread's $0. Returns each thread's loaded registers (4 labels each), the bytes written
    (address: label), the size of the buffer (declared, or `size` for a buffer passed in as an
    address: then 0, with the CTA's `rank` in a cluster at bit 24 as sm_90 shared addresses carry it; memory is
    addressed by the low 24 bits) and each thread's registers."""
    body = ptx.strip()[1:-1]
    size = size or int(re.search(r"\.shared \.align \d+ \.b8 sb\[(\d+)\];", body).group(1))
    address = re.search(r"mov\.u32 b, (\$\d+);", body)  # a buffer passed in
    code = [s.strip() for s in body.split(";") if s.strip() and not s.strip().startswith((".shared", ".reg", "fence"))]
    # at most one, where every thread waits
    barrier = next((i for i, line in enumerate(code) if line.startswith("bar.sync")), len(code))
    memory, outputs = {}, [[] for _ in range(threads)]
    alu = {"shr.b32": lambda x, y: x >> y, "and.b32": lambda x, y: x & y, "shl.b32": lambda x, y: x << y,
           "add.u32": lambda x, y: x + y, "or.b32": lambda x, y: x | y}
    parity_operand = re.search(r"mad\.lo\.u32 \w+, (\$\d+),", body)
    parity_operand = parity_operand and parity_operand.group(1)

    def run(tid, lines, regs):
        def val(operand):
            if operand == parity_operand:
                return parity
            if address and operand == address.group(1):
                return rank << 24
            return regs[operand] if operand in regs else int(operand, 0)

        def labels(operand, width):  # an input's bytes, or a register holding some
            if operand.startswith("$"):
                return [(tid, width * (int(operand[1:]) - first_input) + b) for b in range(width)]
            return regs[operand]

        for line in lines:
            op, args = line.split(None, 1)
            if op.startswith(("st.shared", "ld.shared")):
                vec, bits = re.match(r"[sl][td]\.shared(?:\.v(\d))?\.b(\d+)", op).groups()
                vec, width = int(vec or 1), int(bits) // 8
                base, offset = re.search(r"\[([\w$]+)(?:\+(\d+))?\]", args).groups()
                addr = regs[base] + int(offset or 0)
                assert addr >> 24 == (rank if address else 0)
                addr &= 0xFFFFFF
                assert addr % (vec * width) == 0 and 0 <= addr and addr + vec * width <= size, (op, addr)
                if op.startswith("st"):
                    values = [x for o in re.search(r"\], \{?([^}]*)\}?$", args).group(1).split(", ") for x in labels(o, width)]
                    memory.update({addr + i: value for i, value in enumerate(values)})
                else:
                    outputs[tid] += [[memory.get(addr + 4 * i + byte) for byte in range(4)] for i in range(vec * width // 4)]
                continue
            if op == "mov.b64" and args.startswith("{"):  # an int64 input into two 32-bit registers
                lo, hi, src = re.match(r"\{(\w+), (\w+)\}, (\$\d+)", args).groups()
                regs[lo], regs[hi] = labels(src, 8)[:4], labels(src, 8)[4:]
                continue
            dst, *srcs = args.split(", ", 1) if op == "mov.b64" else args.split(", ")
            if op == "mov.b64":  # the descriptor: {low, high} words
                low, high = re.match(r"\{(\w+), (\w+)\}", srcs[0]).groups()
                regs[dst] = val(low) | val(high) << 32
            elif op == "mov.b32":
                regs[dst] = labels(srcs[0], 4)
            elif op == "mov.u32":
                regs[dst] = val(srcs[0])
            elif op == "mad.lo.u32":
                regs[dst] = val(srcs[0]) * val(srcs[1]) + val(srcs[2])
            elif op == "bfe.u32":
                regs[dst] = (val(srcs[0]) >> val(srcs[1])) & ((1 << val(srcs[2])) - 1)
            else:
                regs[dst] = alu[op](val(srcs[0]), val(srcs[1]))
        return regs

    regs = [run(t, code[:barrier], {"%tid.x": t, "sb": 0, **(given(t) if given else {})})
            for t in range(threads)]  # every store first
    for t in range(threads):
        run(t, code[barrier + 1:], regs[t])
    for read in reads:
        lines = [s.strip() for s in read.split(";") if s.strip().startswith("ld.shared")]
        for t in range(threads):
            run(t, lines, {"$20": regs[t]["$0"]})
    return outputs, memory, size, regs


@pytest.mark.parametrize("col_groups", [1, 2])
@pytest.mark.parametrize("wide", [False, True], ids=["decoded", "bf16"])
@pytest.mark.parametrize("slices", [1, 2, 8])
@pytest.mark.parametrize("given", [True, False], ids=["addresses_given", "addresses_made"])
def test_shared_b_exchange_gives_each_lane_its_b(col_groups, wide, slices, given):
    """The shared-B PTX, run for 128 threads per K slice: thread t writes K 8 (t & 7) .. + 8 of
    B row (t >> 3) mod 8c; every lane (g, q) of every warp reads back, per column group c, the
    16 K 16q .. 16q + 15 of row 8c + g in K order, which is what each warp's own B registers
    hold, written by its own slice. The two buffers (window parity) of every slice lie inside
    the declared array and do not overlap; one slice waits at the CTA barrier, more at their
    own named barriers of 128 threads (1 + slice). Given: the addresses come from `MMA_SHARED_B_ADDRESSES_PTX`, run once
    per thread, as the kernel runs it before its K loop (one row group); else the exchange makes them (two)."""
    from blockscaled.kernels.decode import MMA_SHARED_B_ADDRESSES_PTX, MMA_SHARED_B_PTX, shared_b_bytes

    ptx = MMA_SHARED_B_PTX[col_groups, wide, slices, given]
    n_in = 2 if wide else 4
    bar = f"${8 * col_groups + n_in + 3}" if given else "s"
    assert ("bar.sync 0;" in ptx) == (slices == 1) and (f"bar.sync {bar}, 128;" in ptx) == (slices > 1)
    size = shared_b_bytes(col_groups, slices)
    if given:
        *_, made = run_shared_b_exchange(MMA_SHARED_B_ADDRESSES_PTX[col_groups, slices], 0, 4, 128 * slices, size=size)
        assert all(made[t]["$2"] == (0 if slices == 1 else 1 + (t >> 7)) for t in range(128 * slices))
    else:  # the buffer's address (0) alone
        made = [{"$0": 0}] * (128 * slices)
    inputs = [{f"${8 * col_groups + n_in + 1 + i}": made[t][f"${i}"] for i in range(3 if given else 1)}
              for t in range(128 * slices)]
    written = []
    for parity in (0, 1):
        outputs, memory, size, _ = run_shared_b_exchange(ptx, parity, 8 * col_groups, 128 * slices, size=size,
                                                         given=inputs.__getitem__)
        addresses = set(memory)
        written.append(addresses)
        assert size == 2 * 8 * col_groups * 144 * slices  # per slice two buffers of 8c rows, 144 bytes apart
        for tid, regs in enumerate(outputs):
            lane = tid & 31
            g, q = lane >> 2, lane & 3
            assert len(regs) == 8 * col_groups
            for c in range(col_groups):
                for i, word in enumerate(regs[8 * c: 8 * c + 8]):
                    k_byte = 32 * q + 4 * i  # the bf16 bytes of K 16 q + 2 i and + 1
                    writer = word[0][0]
                    assert (writer >> 3) % (8 * col_groups) == 8 * c + g and writer & 7 == k_byte // 16
                    assert writer >> 7 == tid >> 7  # the reader's slice
                    assert word == [(writer, k_byte % 16 + b) for b in range(4)]
    assert written[0] and not written[0] & written[1]


@pytest.mark.parametrize("wide", [False, True], ids=["decoded", "bf16"])
def test_m64_exchange_gives_each_lane_its_b(wide):
    """The M <= 64 exchange, run for 256 threads, then each column group's shared reads of
    `MMA_STEPS_M64_PTX`: thread t writes the 32 bytes of one lane's B registers (row t >> 2,
    K 16 (t & 3) .. + 16); every lane (g, q) of every warp reads, per column group c, the 32
    bytes of row 8c + g at K 16q, in order: thread 4 (8c + g) + q's. The two buffers lie inside
    the declared array and do not overlap."""
    from blockscaled.kernels.decode import MMA_M64_EXCHANGE_PTX, MMA_STEPS_M64_PTX, m64_exchange_buffer

    written = []
    for parity in (0, 1):
        outputs, memory, size, _ = run_shared_b_exchange(MMA_M64_EXCHANGE_PTX[wide], parity, 1, 256, MMA_STEPS_M64_PTX,
                                                         size=m64_exchange_buffer(False)[0])
        addresses = set(memory)
        written.append(addresses)
        assert size == 2 * 64 * 144 and len(addresses) == 64 * 128
        for tid, regs in enumerate(outputs):
            g, q = (tid & 31) >> 2, tid & 3
            assert len(regs) == 8 * 8
            for c in range(8):
                writer = 4 * (8 * c + g) + q
                assert regs[8 * c: 8 * c + 8] == [[(writer, 4 * i + b) for b in range(4)] for i in range(8)]
    assert not written[0] & written[1]


@pytest.mark.parametrize("rank", [0, 3])
@pytest.mark.parametrize("wide", [False, True], ids=["decoded", "bf16"])
def test_wgmma_exchange_gives_each_step_its_b(wide, rank):
    """The wgmma exchange, run for 256 threads, then read as wgmma reads a K-major,
    unswizzled B through the descriptor it returns (element (n, k) of step s at start + 16 s
    + SBO (n >> 3) + LBO (k >> 3) + 16 (n & 7) + 2 (k & 7), the layout the H100 tests passed
    with): logical k = 2q + (j & 1) + 8 (j >> 1) of step s must be K 16q + 4s + j of row n, as
    the weights' K order (mma.sync's B registers) has it: bytes 2 (j & 1) of the writer's
    register 2s + (j >> 1), writer 4n + q. Every thread gets the same descriptor; the two
    buffers lie inside the declared array and do not overlap; also for a CTA of rank 3 in a cluster (its shared
    addresses carry the rank at bit 24, which the descriptor's 14-bit start field must not)."""
    from blockscaled.kernels.decode import WGMMA_EXCHANGE_PTX, m64_exchange_buffer

    written = []
    for parity in (0, 1):
        _, memory, size, regs = run_shared_b_exchange(WGMMA_EXCHANGE_PTX[wide], parity, 1, 256, size=m64_exchange_buffer(True)[0],
                                                      rank=rank)
        written.append(set(memory))
        assert size == 2 * 64 * 128 and len(memory) == 64 * 128
        (descriptor,) = {r["$0"] for r in regs}
        lbo, sbo = (descriptor >> 16 & 0x3FFF) << 4, (descriptor >> 32 & 0x3FFF) << 4
        assert descriptor >> 46 == 0  # base offset 0, no swizzle
        for s, n, q, j in itertools.product(range(4), range(64), range(4), range(4)):
            start = ((descriptor + 16 * s) & 0x3FFF) << 4
            k = 2 * q + (j & 1) + 8 * (j >> 1)
            at = start + sbo * (n >> 3) + lbo * (k >> 3) + 16 * (n & 7) + 2 * (k & 7)
            register = 2 * s + (j >> 1)
            assert [memory.get(at + b) for b in range(2)] == [(4 * n + q, 4 * register + 2 * (j & 1) + b) for b in range(2)]
    assert not written[0] & written[1]


@pytest.mark.parametrize("values,split,threads", [(32, 2, 256), (32, 4, 256), (32, 8, 256), (12, 2, 256), (12, 4, 256),
                                                  (20, 4, 256), (8, 8, 256), (16, 8, 128), (16, 2, 128), (8, 4, 128),
                                                  (4, 4, 128)])
def test_cluster_sum_adds_every_cta(values, split, threads, gen):
    """`decode.MMA_CLUSTER_SUM_PTX`, run for the 256 (mma_m64_kernel) or 128 (mma_gemv_kernel) threads of each CTA of
    a cluster of `split` (a small
    interpreter of the instructions it uses, fp32 adds rounded as the GPU's; every thread of the cluster runs to
    the cluster barrier before any goes past it): thread t of CTA r gets its values c r .. c r + c - 1 summed
    over the CTAs, its own first, then the others by rank; each CTA's buffer is written once per word by the
    other CTAs' remote stores, every access aligned and inside it, nothing read that was not written."""
    from blockscaled.kernels.decode import MMA_CLUSTER_SUM_PTX, cluster_sum_bytes

    own = values // split
    body = MMA_CLUSTER_SUM_PTX[values, split, threads].strip()[1:-1]
    size = int(re.search(r"\.shared \.align 16 \.b8 cs\[(\d+)\];", body).group(1))
    assert size == cluster_sum_bytes(values, split, threads)
    code = [s.strip() for s in body.split(";") if s.strip() and not s.strip().startswith((".shared", ".reg"))]
    assert code.count("barrier.cluster.wait.aligned") == 2 and code.count("barrier.cluster.arrive.aligned") == 1
    barrier = code.index("barrier.cluster.arrive.aligned")
    assert code[barrier + 1] == "barrier.cluster.wait.aligned" and "barrier.cluster.wait.aligned" in code[:barrier]
    phases = code[:barrier], code[barrier + 2:]
    inputs = [[[f32(x) for x in row] for row in torch.randn(threads, values, generator=gen).tolist()]
              for _ in range(split)]
    memory = [{} for _ in range(split)]  # per CTA: byte address -> fp32
    outputs = [[[None] * own for _ in range(threads)] for _ in range(split)]
    alu = {"sub.u32": lambda x, y: (x - y) & U32}

    def run(rank, tid, lines, regs):
        def val(operand):
            if operand.startswith("$"):
                return inputs[rank][tid][int(operand[1:]) - own]
            return regs[operand] if operand in regs else int(operand, 0)

        for line in lines:
            guard, line = re.match(r"(@!?p )?(.*)", line).groups()
            if guard and (guard == "@p ") != regs["p"]:
                continue
            if line == "barrier.cluster.wait.aligned":
                continue  # every thread arrived before its K loop
            op, args = line.split(None, 1)
            access = re.match(r"(st|ld)\.shared(::cluster)?(?:\.v(\d))?\.f32$", op)
            if access:
                kind, remote, width = access.group(1), access.group(2), int(access.group(3) or 1)
                base, offset = re.search(r"\[(\w+)\+(\d+)\]", args).groups()
                target, addr = regs[base] if remote else (rank, regs[base])
                addr += int(offset)
                assert addr % (4 * width) == 0 and 0 <= addr and addr + 4 * width <= size, (op, addr)
                names = re.findall(r"[$\w]+", args.split("]")[1] if kind == "st" else args.split("[")[0])
                assert len(names) == width
                for i, name in enumerate(names):
                    if kind == "st":
                        assert remote and target != rank and addr + 4 * i not in memory[target], "a word written twice"
                        memory[target][addr + 4 * i] = val(name)
                    else:
                        assert addr + 4 * i in memory[rank], "read before written"
                        regs[name] = memory[rank][addr + 4 * i]
                continue
            dst, *srcs = args.split(", ")
            if op == "mov.u32":  # the buffer's address: 0
                special = {"%tid.x": tid, "%cluster_ctarank": rank, "cs": 0}
                regs[dst] = special[srcs[0]] if srcs[0] in special else val(srcs[0])
            elif op == "mov.b32" and dst.startswith("$"):
                outputs[rank][tid][int(dst[1:])] = regs[srcs[0]]
            elif op == "mov.b32":
                regs[dst] = val(srcs[0])
            elif op in ("setp.ne.u32", "setp.gt.u32"):
                x, y = val(srcs[0]), val(srcs[1])
                regs[dst] = x != y if op == "setp.ne.u32" else x > y
            elif op == "selp.u32":
                regs[dst] = val(srcs[0]) if regs[srcs[2]] else val(srcs[1])
            elif op == "mad.lo.u32":
                regs[dst] = (val(srcs[0]) * val(srcs[1]) + val(srcs[2])) & U32
            elif op == "mapa.shared::cluster.u32":
                regs[dst] = (val(srcs[1]), val(srcs[0]))  # (CTA, address in it)
            elif op == "add.f32":
                regs[dst] = f32(val(srcs[0]) + val(srcs[1]))
            else:
                regs[dst] = alu[op](val(srcs[0]), val(srcs[1]))
        return regs

    regs = {(r, t): {} for r in range(split) for t in range(threads)}
    for phase in phases:
        for (r, t), state in regs.items():
            run(r, t, phase, state)
        if phase is phases[0]:
            assert all(len(m) * 4 == size for m in memory), "a buffer word not written"
    for r, t in regs:
        expected = []
        for k in range(own):
            j = r * own + k
            total = inputs[r][t][j]
            for other in (s for s in range(split) if s != r):
                total = f32(total + inputs[other][t][j])
            expected.append(total)
        assert outputs[r][t] == expected, (r, t)


def test_pdl_by_plan(monkeypatch):
    """Left to the plan, PDL is on at M <= 16 but off for E8M0-scaled fp4 / fp8 activations on fp4 weights at
    1 < M <= 16 where a program runs more than `MMA_PDL_MX_ACT_MAX_WINDOWS` windows (split 16 at 8192 x 28672: 28,
    split 2 at 57344 x 8192: 64, measured slower with PDL); on where they run 16 (10240 x 8192 split 8, the 8 K slices
    at 8192^2), at M = 1, for nvfp4 and bf16 activations and for fp8 weights; "pdl" or "pdl_prefetch" given decide."""
    for name, value in (("_sm_count", lambda device: 132), ("_has_wgmma", lambda device: True),
                        ("_has_pdl", lambda device: True)):
        monkeypatch.setattr(plans, name, value)
    x = torch.randn(16, 256)
    acts = {fmt: bs.quantize(x, fmt).with_data_layout("k_order") for fmt in ("mxfp4", "mxfp8", "nvfp4")}
    acts["bf16"] = x.to(torch.bfloat16)
    weights = {fmt: bs.quantize(torch.randn(64, 256), fmt).with_data_layout("mma_m16k16") for fmt in ("mxfp4", "mxfp8")}

    def pdl(act, weight, m, n, k, config=None):
        a, b = acts[act], weights[weight]
        plan = plans._mma_plan(a, b, False, m, n, k, plans.mma_options_for(config, a, b, m, n))
        windows = k // 64 // (plan.split * plan.consts[-2])  # a program's (K_WARPS: a warp's) windows
        return plan.consts.PDL, windows

    on = 1 + plans.MMA_PDL_PREFETCH[False, 2]
    for act in ("mxfp4", "mxfp8"):
        assert pdl(act, "mxfp4", 16, 8192, 28672) == (0, 28)
        assert pdl(act, "mxfp4", 16, 57344, 8192) == (0, 64)
        assert pdl(act, "mxfp4", 16, 10240, 8192) == (on, 16)
        assert pdl(act, "mxfp4", 16, 8192, 8192) == (on, 16)
        assert pdl(act, "mxfp4", 1, 8192, 28672)[0] == 1 + plans.MMA_PDL_PREFETCH[False, 1]
        assert pdl(act, "mxfp4", 16, 8192, 28672, {"pdl": True})[0] == on
        assert pdl(act, "mxfp4", 16, 8192, 28672, {"pdl_prefetch": 1})[0] == 2
        assert pdl(act, "mxfp4", 16, 8192, 28672, {"evict": True})[0] == 0  # a config without them: by the plan
    assert pdl("mxfp8", "mxfp8", 16, 8192, 28672)[0] == 1 + plans.MMA_PDL_PREFETCH[True, 2]  # fp8 weights
    assert pdl("mxfp8", "mxfp8", 1, 8192, 28672)[0] == 1 + plans.MMA_PDL_PREFETCH[True, 1]
    for act in ("nvfp4", "bf16"):
        assert pdl(act, "mxfp4", 16, 8192, 28672)[0] == on


def test_launch_only_configs_keep_the_default_plan(monkeypatch):
    """"pdl" and "pdl_prefetch" change how a plan launches, not the plan: a config of only them plans as no config does
    (staged B at M = 1 for fp4 activations, K warps, K slices, split-K in clusters, mma_m64_kernel) but for the
    kernel's PDL constant (0 off, 1 + the prefetched windows on; off by default above M = 16)."""
    for name, value in (("_sm_count", lambda device: 132), ("_has_wgmma", lambda device: True),
                        ("_has_pdl", lambda device: True)):
        monkeypatch.setattr(plans, name, value)
    bf16 = torch.randn(16, 256).to(torch.bfloat16)
    nvfp4 = bs.quantize(torch.randn(16, 256), "nvfp4").with_data_layout("k_order")
    b = bs.quantize(torch.randn(64, 256), "nvfp4").with_data_layout("mma_m16k16")

    def plan(x, m, n, k, config=None):
        return plans._mma_plan(x, b, False, m, n, k, plans.mma_options_for(config, x, b, m, n))

    for x, m, n, k in ((nvfp4, 1, 8192, 8192), (bf16, 1, 8192, 8192), (bf16, 16, 8192, 8192), (nvfp4, 16, 10240, 8192),
                       (bf16, 64, 8192, 8192)):
        default, off = plan(x, m, n, k), plan(x, m, n, k, {"pdl": False})
        variants = [(off, 0), (plan(x, m, n, k, {"pdl_prefetch": 0}), 1) if m <= 16 else (plan(x, m, n, k, {"pdl": True}), 1)]
        assert default.consts.PDL == (1 + plans.MMA_PDL_PREFETCH[False, plans._mma_column_groups(m)] if m <= 16 else 0)
        for other, pdl in variants:
            assert other.consts.PDL == pdl
            assert other.consts._replace(PDL=0) == default.consts._replace(PDL=0), (m, n, k, pdl)
            assert (other.split, other.cfg) == (default.split, default.cfg)
    assert plan(nvfp4, 1, 8192, 8192).consts[-1] is True  # staged B
