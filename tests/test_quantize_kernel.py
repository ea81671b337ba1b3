"""The quantize kernel (`kernels/quantize.py`) bit for bit against the reference quantizer, and `scaled_mm` with
`activation_format` against quantize-then-GEMM. CPU: the Triton interpreter; GPU: the same checks at size."""

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels.quantize import quantize_decoded
from blockscaled.reference import dequantize, max_rel_err, scaled_mm as ref_scaled_mm

CASES = [("nvfp4", "floor"), ("mxfp4", "floor"), ("mxfp4", "rceil"), ("mxfp8", "floor"), ("mxfp8", "rceil")]
ALL_FORMATS = frozenset({"nvfp4", "mxfp4", "mxfp8"})
cuda = pytest.mark.gpu
# the kernel on CPU tensors runs through the Triton interpreter, which a machine with a GPU does not set
interpreter = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test; the GPU runs the *_gpu ones")


def _hostile(rows: int, k: int, gen, device="cpu") -> torch.Tensor:
    """Random magnitudes over 2^-40 .. 2^40 per element, then rows of hostile blocks: zeros, NaN, +-Inf, -0, fp32
    subnormals, values past every format's range, exact E2M1 / E4M3 midpoints (the ties), huge and tiny."""
    x = torch.randn(rows, k, generator=gen) * torch.exp2(torch.randint(-40, 40, (rows, k), generator=gen).float())
    hostile = [torch.zeros(k), torch.full((k,), -0.0), torch.randn(k, generator=gen) * 1e-40,
               torch.randn(k, generator=gen) * 1e30, torch.randn(k, generator=gen) * 1e6]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * (k // 8))  # midpoints once scaled by 1
    hostile.append(ties * torch.where(torch.arange(k) % 3 == 0, -1.0, 1.0))
    hostile.append(torch.tensor([1.0 + 2.0**-4 + 2.0**-5 * (i % 2) for i in range(k)]) * 2.0**-8)  # E4M3 ties
    for i, row in enumerate(hostile[: rows]):
        x[i] = row
    if rows > 10:
        x[8, 3], x[9, 1], x[10, 2] = float("nan"), float("inf"), -float("inf")
    return x.to(device)


def _assert_same_codes(q, r):
    assert torch.equal(q.data.view(torch.uint8).cpu(), r.data.view(torch.uint8).cpu()), "element codes differ"
    assert torch.equal(q.scale.view(torch.uint8).cpu(), r.scale.view(torch.uint8).cpu()), "scale codes differ"
    if r.global_scale is not None:  # NaN where the input has one
        torch.testing.assert_close(q.global_scale.cpu().reshape(()), r.global_scale.cpu().reshape(()), rtol=0, atol=0,
                                   equal_nan=True)


def _set_kernel_kind(kind: str, monkeypatch) -> str:
    from blockscaled.kernels import quantize as kq

    if kind == "pairs":  # the module's choice, bf16 pairs wherever they run (codes and decoded rows)
        monkeypatch.setattr(kq, "QUANTIZE_PAIRS", True)
        monkeypatch.setattr(kq, "QUANTIZE_PAIRS_DECODED", True)
        return kind
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS", False)
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_DECODED", False)
    monkeypatch.setattr(kq, "QUANTIZE_BLOCKS", ALL_FORMATS if kind == "blocks" else frozenset())
    return kind


@pytest.fixture(params=["chunks", "blocks"])
def kernel_kind(request, monkeypatch):
    """Both quantize kernels: `quantize_kernel` (a block over 2-4 lanes) and `quantize_blocks_kernel` (a block in one
    thread, `QUANTIZE_BLOCKS`), where the call takes no grid barrier and no own amax. (The interpreter never takes
    the bf16 pairs: `gpu_kernel_kind`.)"""
    return _set_kernel_kind(request.param, monkeypatch)


@pytest.fixture(params=["chunks", "blocks", "pairs"])
def gpu_kernel_kind(request, monkeypatch):
    """`kernel_kind` on the GPU, and the bf16-pairs path of `quantize_blocks_kernel` (mx formats from bf16 on
    sm_90+: `QUANTIZE_PAIRS`; other inputs take the module's choice there)."""
    return _set_kernel_kind(request.param, monkeypatch)


@interpreter
@pytest.mark.parametrize("fmt,rounding,layout,gs", [
    ("nvfp4", "floor", "swizzle_32_4_4", None), ("nvfp4", "floor", "cdna4_32", 0.02), ("mxfp4", "floor", "rowmajor", None),
    ("mxfp4", "rceil", "swizzle_32_4_4", None), ("mxfp8", "floor", "cdna4_16", None), ("mxfp8", "rceil", "rowmajor", None)])
def test_kernel_codes_equal_the_reference_cpu(fmt, rounding, layout, gs, gen, kernel_kind):
    """19 rows (not a whole tile, not a whole swizzle group), fp32, bf16 and fp16 in: every code and scale byte the
    reference's. (Every layout with every format on the GPU.)"""
    x = _hostile(19, 128, gen)
    if fmt == "nvfp4" and gs is None:
        x[8, 3] = 1.0  # a NaN anywhere makes nvfp4's global scale NaN: every code 0 (tested on GPU)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        q = bs.quantize(xd, fmt, scale_rounding=rounding, layout=layout, global_scale=gs, backend="kernel")
        r = bs.quantize(xd, fmt, scale_rounding=rounding, layout=layout, global_scale=gs, backend="reference")
        _assert_same_codes(q, r)


@interpreter
@pytest.mark.parametrize("rows,k", [(5, 96), (9, 160), (1, 32), (1, 64), (2, 3968)])
def test_kernel_codes_at_odd_shapes_cpu(rows, k, gen, kernel_kind):
    """Rows under a tile, blocks a row not a power of two, one block a row (the blocks kernel leaves it to the other):
    every code and scale byte the reference's, each format, both scale layouts."""
    x = (torch.randn(rows, k, generator=gen) * 4).to(torch.bfloat16)
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for layout in ("rowmajor", "swizzle_32_4_4"):
            gs = 0.02 if fmt == "nvfp4" else None
            q = bs.quantize(x, fmt, layout=layout, global_scale=gs, backend="kernel")
            _assert_same_codes(q, bs.quantize(x, fmt, layout=layout, global_scale=gs, backend="reference"))


def _nvfp4_device_global_scale_every_way(way, with_nan, gen, monkeypatch, device):
    """nvfp4 without a global scale: the input's amax reduced by every program itself (inputs up to
    QUANTIZE_OWN_AMAX_ELEMENTS), by each program over its own part and combined behind a grid barrier (every program
    resident: on the GPU 3 programs of 8 rows, in the interpreter one program of 32 rows; by a count of arrivals or by
    flagged slots), or by a reduction launched
    first: the same codes, scales and global scale as the reference's, in `quantize` and in `quantize_decoded` (19
    rows: the programs' reads end past the input); a NaN anywhere makes the global scale NaN. Three calls each (the
    barrier's buffer must be left zero for the next)."""
    from blockscaled.kernels import quantize as kq

    barrier = way.startswith("barrier")
    monkeypatch.setattr(kq, "QUANTIZE_OWN_AMAX_ELEMENTS", 1 << 30 if way == "own_amax" else 0)
    monkeypatch.setattr(kq, "_barrier_programs", lambda d: kq.MAX_BARRIER_PROGRAMS if barrier else 0)
    monkeypatch.setattr(kq, "QUANTIZE_BARRIER_SLOTS", way == "barrier_slots")
    if barrier and device == "cpu":
        monkeypatch.setattr(kq, "QUANTIZE_ROWS", 32)
        monkeypatch.setattr(kq, "_LAUNCHES", {})
    x = _hostile(19, 128, gen)
    x[8, 3], x[9, 1], x[10, 2] = 1.0, 1.0, 1.0  # (the hostile NaN and Infs would decide the amax wherever it is read)
    x[18, 127] = 1e35  # the amax (above row 3's 1e30 ones) in the last row and column: the reads' tail
    if with_nan:
        x[18, 126] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        for scale in (1.0, 0.5, 2.0):
            xd = (x * scale).to(device=device, dtype=dtype)
            amax = kq._global_scale(xd, bs.get_format("nvfp4"), None)
            assert (amax.own, amax.barrier) == (way == "own_amax", {"barrier": 1, "barrier_slots": 2}.get(way, 0))
            q = bs.quantize(xd, "nvfp4", layout="swizzle_32_4_4", backend="kernel")
            r = bs.quantize(xd, "nvfp4", layout="swizzle_32_4_4", backend="reference")
            _assert_same_codes(q, r)
            assert bool(r.global_scale.isnan()) == with_nan
            rows, g = quantize_decoded(xd, bs.get_format("nvfp4"), "floor", None)
            torch.testing.assert_close(g.reshape(()), r.global_scale.reshape(()), rtol=0, atol=0, equal_nan=True)
            if not with_nan:
                want = (dequantize(r, torch.float64) / r.global_scale.double()).to(torch.bfloat16)
                assert torch.equal(rows.nan_to_num(), want.nan_to_num())


EVERY_WAY = [pytest.mark.parametrize("way", ["own_amax", "barrier", "barrier_slots", "amax_launched_first"]),
             pytest.mark.parametrize("with_nan", [False, True], ids=["finite", "a_nan"])]


@interpreter
@EVERY_WAY[0]
@EVERY_WAY[1]
def test_nvfp4_device_global_scale_every_way_cpu(way, with_nan, gen, monkeypatch):
    _nvfp4_device_global_scale_every_way(way, with_nan, gen, monkeypatch, "cpu")


@pytest.mark.parametrize("with_nan", [False, True], ids=["finite", "a_nan"])
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=interpreter), pytest.param("cuda", marks=cuda)])
def test_nvfp4_amax_launched_first_by_the_blocks_kernel(with_nan, device, gen, monkeypatch):
    """`quantize_blocks_kernel` with nvfp4's global scale from the amax a reduction left (FROM_AMAX): the same codes,
    scales and global scale as the reference's, the first program writing the scale."""
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(kq, "QUANTIZE_BLOCKS", ALL_FORMATS)
    launched = []
    real = kq._launch_cached

    def spy(cache, key, kernel, args, config, device):
        launched.append(kernel)
        return real(cache, key, kernel, args, config, device)

    monkeypatch.setattr(kq, "_launch_cached", spy)
    _nvfp4_device_global_scale_every_way("amax_launched_first", with_nan, gen, monkeypatch, device)
    assert kq.quantize_blocks_kernel in launched


@cuda
@EVERY_WAY[0]
@EVERY_WAY[1]
def test_nvfp4_device_global_scale_every_way_gpu(way, with_nan, gen, monkeypatch):
    _nvfp4_device_global_scale_every_way(way, with_nan, gen, monkeypatch, "cuda")


@interpreter
@pytest.mark.parametrize("fmt,rounding", CASES)
def test_decoded_rows_are_the_dequantized_codes_cpu(fmt, rounding, gen, kernel_kind):
    """`quantize_decoded` (the fused pre-pass of `activation_format`) = dequantize(reference quantize) / global scale,
    in bf16, value for value (+-0 compare equal: the kernel's negation is 0 - x)."""
    x = _hostile(13, 64, gen).to(torch.float16)
    gs = 0.05 if fmt == "nvfp4" else None
    r = bs.quantize(x, fmt, scale_rounding=rounding, global_scale=gs, backend="reference")
    want = dequantize(r, torch.float64)
    if r.global_scale is not None:
        want = want / r.global_scale.double()
    want = want.to(torch.bfloat16)
    rows, g = quantize_decoded(x, bs.get_format(fmt), rounding, gs)
    assert torch.equal(rows.isnan(), want.isnan())
    assert torch.equal(rows.nan_to_num(), want.nan_to_num())
    assert float(g) == float(torch.tensor(gs or 1.0, dtype=torch.float32))


def test_e2m1_rounding_equals_the_reference_on_every_bf16_and_next_to_every_tie():
    """The quantize kernel's E2M1 rounding (|y| rounded to its binade's spacing by one fp32 addition), run
    as torch on CPU, against `reference.codecs.encode_e2m1` (seven midpoint comparisons): every bf16 bit pattern as
    fp32 (NaN, +-Inf, subnormals, -0 included), each midpoint with the fp32 values 4 ulps either side, and 2^20
    normal fp32 values."""
    from blockscaled.kernels.quantize import _e2m1_codes
    from blockscaled.reference.codecs import encode_e2m1

    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 1.0, 2.0, 4.0, 0.5])
    near = (mids.view(torch.int32)[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).view(torch.float32)
    fp32 = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)) * 4  # full fp32 mantissas (fp32 inputs)
    y = torch.cat([every_bf16, near.flatten(), -near.flatten(), fp32])
    assert torch.equal(_e2m1_codes(y).to(torch.uint8), encode_e2m1(y))


def test_e4m3_rounding_equals_torch_on_every_bf16_and_next_to_every_subnormal_tie():
    """The quantize kernel's fp32 -> E4M3 byte (normal: the bits rounded at bit 20; subnormal: |y| rounded to 2^-9 by
    adding 2^14; saturating at 448) against torch's float8_e4m3fn cast (nearest, ties to even) of y clamped to +-448,
    for every bf16 pattern (Inf and past 448 included), the fp32 values 3 ulps around each subnormal midpoint, the
    normal boundary and 448's rounding boundary, and fp32 subnormals; NaN gives 0x7F."""
    from blockscaled.kernels.quantize import _e4m3_bits

    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    ties = torch.tensor([(i + 0.5) * 2.0**-9 for i in range(8)] + [2.0**-6, 2.0**-7, 448.0, 464.0, 1e-40, 1e-45])
    near = (ties.view(torch.int32)[:, None] + torch.arange(-3, 4, dtype=torch.int32)[None, :]).view(torch.float32)
    y = torch.cat([every_bf16, near.flatten(), -near.flatten()])
    got = _e4m3_bits(y) & 0xFF
    want = torch.where(y.isnan(), 0x7F, y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32))
    assert (y.abs() > 448).sum() > 30000 and y.isinf().sum() == 2  # the saturating range is in the test
    assert torch.equal(got, want), y[got != want][:8]


def _emulate_pairs(monkeypatch):
    """The PTX of the bf16-pairs path (`quantize.QUANTIZE_PAIRS`) as torch on CPU: add / sub / mul .bf16x2 as
    bf16 torch arithmetic (one rounding of the exact result: the operands here leave no double rounding through
    fp32), min / max .bf16x2 returning the non-NaN operand (torch.fmin / fmax, as PTX's min / max without .NaN),
    max.u16x2 on the 16-bit lanes. What runs on the GPU is checked there (`test_pairs_every_bf16_pattern_gpu`)."""
    from blockscaled.kernels import quantize as kq

    ops = {"mul.rn": torch.mul, "add.rn": torch.add, "sub.rn": torch.sub, "min": torch.fmin, "max": torch.fmax}

    def bf16x2(op, a, b):
        a, b = torch.broadcast_tensors(a, b)
        return ops[op](a.contiguous().view(torch.bfloat16), b.contiguous().view(torch.bfloat16)).view(torch.int32)

    def max_u16x2(a, b):
        a, b = torch.broadcast_tensors(a, b)
        lanes = torch.maximum(a.contiguous().view(torch.int16).int() & 0xFFFF, b.contiguous().view(torch.int16).int() & 0xFFFF)
        return lanes.to(torch.int16).view(torch.int32)

    f16_ops = {"add.rn": torch.add, "min": torch.fmin, "max": torch.fmax}

    def f16x2(op, a, b):  # (an f16 sum of two f16 values is exact in fp32 first: one rounding)
        a, b = torch.broadcast_tensors(a, b)
        return f16_ops[op](a.contiguous().view(torch.float16), b.contiguous().view(torch.float16)).view(torch.int32)

    def f16x2_rz(high, low):  # fp32 bits truncated to f16 (past f16's range: its largest, as cvt.rz gives)
        def rz(bits):
            t = bits.contiguous().view(torch.float32)
            r = t.to(torch.float16)
            down = r.float().abs() > t.abs()  # rounded away from zero: one f16 step back
            return torch.where(down, r.view(torch.int16) - 1, r.view(torch.int16)).int() & 0xFFFF
        high, low = torch.broadcast_tensors(high, low)
        return rz(low) | (rz(high) << 16)

    monkeypatch.setattr(kq, "_bf16x2", bf16x2)
    monkeypatch.setattr(kq, "_max_u16x2", max_u16x2)
    monkeypatch.setattr(kq, "_f16x2", f16x2)
    monkeypatch.setattr(kq, "_f16x2_rz", f16x2_rz)
    return kq


@pytest.mark.parametrize("multiplier", [1.0, 1 / 3, 0.1, 6.1e-5, 2.0**-133, 3.4e3, 7.9e28, 1e-30, float("nan")])
def test_nvfp4_pairs_round_every_bf16_as_the_reference(multiplier, monkeypatch):
    """nvfp4 codes over bf16 pairs (`_pairs_nvfp4_bytes`: fp32 products, f16 pairs rounded to odd, E2M1 on the f16
    lanes), emulated on CPU, against the reference's fp32 arithmetic: every bf16 pattern x times fp32 multipliers that
    are not powers of two (a NaN block's NaN included): the E2M1 codes of clamp(x m, +-6) (NaN products: code 0), -0
    keeping its sign. Then the rounding to odd alone against the reference on fp32 values within 2^14 ulps of every
    E2M1 decision point and of the f16 range's end (65504), where a plain f16 rounding would decide some wrong."""
    from blockscaled.reference.codecs import encode_e2m1

    kq = _emulate_pairs(monkeypatch)
    x = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)  # every bf16, exactly in fp32
    words = x.to(torch.bfloat16).view(torch.int32).reshape(1, -1, 4)
    m = torch.tensor([[[multiplier]]], dtype=torch.float32)
    y = x * multiplier
    codes = kq._pairs_nvfp4_bytes(words, m).flatten()
    got = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten().to(torch.uint8)
    want = torch.where(y.isnan(), 0, encode_e2m1(y.clamp(-6.0, 6.0)).to(torch.int32)).to(torch.uint8)
    assert torch.equal(got, want), (x[got != want][:8], got[got != want][:8], want[got != want][:8])

    points = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 65504.0]
    near = torch.cat([torch.tensor([p], dtype=torch.float32).view(torch.int32) + torch.arange(-(1 << 14), 1 << 14)
                      for p in points]).view(torch.float32)
    near = torch.cat([near, -near])
    words = near.view(torch.int32).reshape(1, -1, 1)  # as if the products: multiplier 1 on words of two fp32 ...
    pairs = kq._f16x2_rz(kq._round_to_odd_f16(words[:, 1::2]), kq._round_to_odd_f16(words[:, 0::2]))
    lanes = pairs.view(torch.float16).flatten().float()  # ... the f16 pairs the kernel rounds
    assert torch.equal(encode_e2m1(lanes.clamp(-6.0, 6.0)), encode_e2m1(near.clamp(-6.0, 6.0)))
    plain = near.to(torch.float16).float()  # round to nearest: some decisions change (so the test can fail)
    assert not torch.equal(encode_e2m1(plain.clamp(-6.0, 6.0)), encode_e2m1(near.clamp(-6.0, 6.0)))


@pytest.mark.parametrize("multiplier", [2.0**-127, 2.0**-126, 2.0**-40, 0.25, 1.0, 8.0, 2.0**60, 2.0**126, 0.0])
def test_bf16_pairs_round_every_bf16_as_the_reference(multiplier, monkeypatch):
    """The pairs path's per-element rounding (`_pairs_e2m1_bytes`, `_pairs_decoded`), emulated on CPU, against the
    reference's fp32 arithmetic: every bf16 pattern x times each power-of-two block multiplier (the range an E8M0
    scale's reciprocal takes, its subnormal 2^-127 and the floor rounding's 0 of a NaN block included): the E2M1 codes
    of clamp(x m, +-6) (NaN products: code 0), and the decoded E2M1 and E4M3 values (a scale value of 1), where the
    product is not NaN (a NaN block's scale value makes its rows NaN)."""
    from blockscaled.reference.codecs import decode_e2m1, encode_e2m1

    kq = _emulate_pairs(monkeypatch)
    x = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)  # every bf16, exactly in fp32
    words = x.to(torch.bfloat16).view(torch.int32).reshape(-1, 4, 4)  # [blocks, 4 words, ...] of pairs: 16 a row
    words = words.reshape(1, -1, 4)
    m2 = kq._pairs_word(torch.tensor([[multiplier]], dtype=torch.float32))[:, :, None]
    y = x * multiplier
    codes = kq._pairs_e2m1_bytes(words, m2).flatten()
    got = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten().to(torch.uint8)
    want = torch.where(y.isnan(), 0, encode_e2m1(y.clamp(-6.0, 6.0)).to(torch.int32)).to(torch.uint8)
    assert torch.equal(got, want), (x[got != want][:8], got[got != want][:8], want[got != want][:8])
    one = kq._pairs_word(torch.ones(1, 1))[:, :, None]
    finite = ~y.isnan()
    for fp8 in (False, True):
        rows = kq._pairs_decoded(words, m2, one, fp8).view(torch.bfloat16).flatten().float()
        want = (y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() if fp8
                else decode_e2m1(encode_e2m1(y.clamp(-6.0, 6.0)))).to(torch.bfloat16).float()
        assert torch.equal(rows[finite], want[finite]), (fp8, x[finite][rows[finite] != want[finite]][:8])


def test_pairs_run_where_documented(monkeypatch):
    """`_pairs` on an sm_90+ GPU (stood in for): bf16 mxfp4 codes by default, decoded rows only with
    QUANTIZE_PAIRS_DECODED (mxfp8's too), never nvfp4 (its multiplier is not a power of two), fp16 / fp32, rows of one
    block or rows not 4-byte aligned; never without the GPU (the interpreter has no PTX)."""
    from blockscaled.kernels import plans, quantize as kq

    mx4, mx8, nv = (bs.get_format(f) for f in ("mxfp4", "mxfp8", "nvfp4"))
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    assert not kq._pairs(x, mx4, False)  # the CPU
    monkeypatch.setattr(plans, "_has_pdl", lambda device: True)
    assert kq._pairs(x, mx4, False) and not kq._pairs(x, mx4, True) and not kq._pairs(x, mx8, False)
    assert not kq._pairs(x, nv, False) and not kq._pairs(x.float(), mx4, False) and not kq._pairs(x.half(), mx4, False)
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_NVFP4", True)  # nvfp4 codes only where asked (off until timed)
    assert kq._pairs(x, nv, False) and not kq._pairs(x, nv, True)
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_NVFP4", False)
    assert not kq._pairs(x[:, :32], mx4, False)  # one block a row
    assert kq._pairs(x[:, 64:], mx4, False)  # not contiguous: copied
    assert not kq._pairs(torch.zeros(4 * 128 + 1, dtype=torch.bfloat16)[1:].view(4, 128), mx4, False)  # 2-byte aligned
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_DECODED", True)
    assert kq._pairs(x, mx4, True) and kq._pairs(x, mx8, True) and not kq._pairs(x, nv, True)
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS", False)
    assert not kq._pairs(x, mx4, False) and kq._pairs(x, mx4, True)


def test_bf16_amax_rceil_scale_without_a_division():
    """rceil's E8M0 code from a bf16 amax's bits (`_e8m0_scale(..., SHORT=True)`, what the pairs path runs) against
    the reference's fp32 division, for every non-negative bf16 amax (subnormals, Inf and NaN included), E2M1 and
    E4M3; and its multiplier against the division's path."""
    from blockscaled.kernels.quantize import _e8m0_scale
    from blockscaled.reference import mx_scale_rceil

    amax = (torch.arange(1 << 15, dtype=torch.int32) << 16).view(torch.float32)  # sign bit clear: every |bf16|
    for fp8, fmt in ((False, "mxfp4"), (True, "mxfp8")):
        code, multiplier = _e8m0_scale(amax, fp8, True, True)
        want = mx_scale_rceil(amax, bs.get_format(fmt)).to(torch.int32)
        assert torch.equal(code, want), amax[code != want][:8]
        reciprocal = torch.exp2(127 - want.double())  # the reference's multiplier (1 at code 0, 2^-127 at 254)
        reciprocal = torch.where(want == 0, 1.0, torch.where(want == 255, float("nan"), reciprocal)).float()
        torch.testing.assert_close(multiplier, reciprocal, rtol=0, atol=0, equal_nan=True)


def test_quantize_errors_name_the_argument():
    x = torch.randn(4, 64)
    cases = [(dict(global_scale=0.0), "global_scale"), (dict(global_scale=float("inf")), "global_scale"),
             (dict(global_scale=torch.ones(2)), "global_scale"), (dict(layout="columns"), "layout"),
             (dict(scale_rounding="up"), "scale_rounding")]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            bs.quantize(x, "nvfp4", backend="kernel", **kwargs)
    with pytest.raises(ValueError, match="backend"):
        bs.quantize(x, "nvfp4", backend="fast")
    with pytest.raises(ValueError, match="global_scale"):
        bs.quantize(x, "mxfp4", global_scale=1.0, backend="kernel")
    with pytest.raises(TypeError, match="x:"):
        bs.quantize(x.to(torch.int32), "mxfp4", backend="kernel")


def test_scaled_mm_activation_format_errors():
    w = bs.quantize(torch.randn(32, 64), "mxfp4")
    with pytest.raises(ValueError, match="activation_format"):
        bs.scaled_mm(torch.randn(2, 64), w, activation_format="int8")
    with pytest.raises(ValueError, match="activation_format: nvfp4 activations on mxfp4"):
        bs.scaled_mm(torch.randn(2, 64), w, activation_format="nvfp4")
    with pytest.raises(TypeError, match="a:"):
        bs.scaled_mm(bs.quantize(torch.randn(2, 64), "mxfp4"), w, activation_format="mxfp4")
    with pytest.raises(ValueError, match="b: K=64"):
        bs.scaled_mm(torch.randn(2, 96), w, activation_format="mxfp4")
    with pytest.raises(TypeError, match="a: expected float32"):
        bs.scaled_mm(torch.randn(2, 64).to(torch.int32), w, activation_format="mxfp4")
    with pytest.raises(ValueError, match="activation_global_scale"):
        bs.scaled_mm(torch.randn(2, 64).bfloat16(), w, activation_global_scale=1.0)
    with pytest.raises(ValueError, match="b: on cpu, a on meta"):  # named before any kernel runs on b's device
        bs.scaled_mm(torch.randn(2, 64, device="meta"), w, activation_format="mxfp4")


@interpreter
def test_scaled_mm_activation_format_cpu(gen):
    """On the CPU the activation is quantized (reference) then multiplied: the fp64 reference of those operands."""
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    w = bs.quantize(torch.randn(48, 64, generator=gen), "mxfp4")
    y = bs.scaled_mm(x, w, activation_format="mxfp8", scale_rounding="rceil", out_dtype=torch.float32)
    a = bs.quantize(x, "mxfp8", scale_rounding="rceil")
    assert max_rel_err(y, ref_scaled_mm(a, w)) < 1e-5


def test_activation_format_quantizes_to_decoded_rows_where_mma_runs(gen, monkeypatch):
    """Where the mma kernels run, `activation_format` quantizes to decoded rows (element x block scale, bf16): the
    values of `blockscaled.quantize`'s codes and scales, at M = 1 as at M = 2."""
    from blockscaled.kernels import api

    monkeypatch.setattr(api, "_mma_runs", lambda pair, a, device: True)  # as on an sm_90 GPU
    w = bs.quantize(torch.randn(48, 64, generator=gen), "mxfp8").with_data_layout("mma_m16k16")
    for m in (1, 2):
        x = torch.randn(m, 64, generator=gen).to(torch.bfloat16)
        got, post = api._quantized_activation(x, w, "mxfp8", "floor", None, None)
        want = bs.quantize(x, "mxfp8")
        assert got.dtype == torch.bfloat16 and torch.equal(got, dequantize(want, torch.float64).to(torch.bfloat16))


# ---- GPU ----

@cuda
@pytest.mark.parametrize("fmt,rounding", CASES)
@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4", "cdna4_32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernel_codes_equal_the_reference_gpu(fmt, rounding, layout, dtype, gen, gpu_kernel_kind):
    """At size, odd rows, NaN included (nvfp4 too: its device global scale turns NaN, as the reference's)."""
    x = _hostile(1000, 4096, gen).to(dtype)
    q = bs.quantize(x.cuda(), fmt, scale_rounding=rounding, layout=layout)
    r = bs.quantize(x, fmt, scale_rounding=rounding, layout=layout)  # the reference, on the CPU
    _assert_same_codes(q, r)


@cuda
@pytest.mark.parametrize("hw", [True, False], ids=["hardware", "integer"])
@pytest.mark.parametrize("rounding", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_hardware_e4m3_equals_the_reference_gpu(hw, rounding, dtype, gen, monkeypatch, gpu_kernel_kind):
    """mxfp8 both ways on the GPU: with `QUANTIZE_HW_E4M3` (the default; the hardware's cvt.rn.satfinite.e4m3x2, two
    elements an instruction, byte order and NaN's code made by the kernel) and with the integer rounding the
    interpreter runs: codes, scales and decoded rows the reference's on the hostile rows, and every bf16 pattern once
    as a row (past 448, Inf, NaN of both signs, subnormals)."""
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(kq, "QUANTIZE_HW_E4M3", hw)
    assert kq._hw_e4m3(torch.empty(1, device="cuda"), bs.get_format("mxfp8")) == hw
    every_bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32).reshape(2048, 32)
    for x in (_hostile(1000, 4096, gen).to(dtype), every_bf16.to(dtype)):
        q = bs.quantize(x.cuda(), "mxfp8", scale_rounding=rounding, layout="swizzle_32_4_4")
        r = bs.quantize(x, "mxfp8", scale_rounding=rounding, layout="swizzle_32_4_4")
        _assert_same_codes(q, r)
        rows, _ = quantize_decoded(x.cuda(), bs.get_format("mxfp8"), rounding, None)
        want = dequantize(r, torch.float64).to(torch.bfloat16)
        assert torch.equal(rows.cpu().isnan(), want.isnan())
        assert torch.equal(rows.cpu().nan_to_num(), want.nan_to_num())


@cuda
@pytest.mark.parametrize("rounding", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_pairs_every_bf16_pattern_gpu(fmt, rounding, gen, monkeypatch):
    """The bf16-pairs path as the GPU runs it (`QUANTIZE_PAIRS`: add / sub / mul .bf16x2, max.u16x2): every bf16
    pattern once, as rows of 64 (NaN of both signs and payloads, +-Inf, subnormals, past every range), then the
    hostile rows and the same patterns shuffled into blocks of mixed magnitude; mxfp4's codes and scales, and both
    formats' decoded rows, against the reference."""
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(kq, "QUANTIZE_PAIRS", True)
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_DECODED", True)
    every = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32).to(torch.bfloat16)
    shuffled = every[torch.randperm(1 << 16, generator=gen)]
    f = bs.get_format(fmt)
    for x in (every.reshape(1024, 64), shuffled.reshape(256, 256), _hostile(1000, 4096, gen).to(torch.bfloat16)):
        xc = x.cuda()
        assert kq._pairs(xc, f, True) and kq._pairs(xc, f, False) == (fmt == "mxfp4")
        r = bs.quantize(x, fmt, scale_rounding=rounding, layout="swizzle_32_4_4")
        if fmt == "mxfp4":
            _assert_same_codes(bs.quantize(xc, fmt, scale_rounding=rounding, layout="swizzle_32_4_4"), r)
        rows, _ = quantize_decoded(xc, f, rounding, None)
        want = dequantize(r, torch.float64).to(torch.bfloat16)
        assert torch.equal(rows.cpu().isnan(), want.isnan())
        assert torch.equal(rows.cpu().nan_to_num(), want.nan_to_num())


@cuda
@pytest.mark.parametrize("global_scale", [None, 0.01, 3e-7], ids=["device", "given", "given_small"])
def test_nvfp4_pairs_every_bf16_pattern_gpu(global_scale, gen, monkeypatch):
    """nvfp4 codes over bf16 pairs as the GPU runs them (`QUANTIZE_PAIRS_NVFP4`: fp32 products, cvt.rz.f16x2 rounded
    to odd, E2M1 on f16 lanes): every bf16 pattern once as rows of 64, shuffled into mixed blocks, and the hostile
    rows, codes and scales against the reference, with the input's global scale (reduced by a launch first) or a
    given one (3e-7: products far past E2M1's range, and past f16's, saturating)."""
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_NVFP4", True)
    # the device's global scale by a reduction launched first (the blocks kernel's way: no grid barrier, no own amax)
    monkeypatch.setattr(kq, "QUANTIZE_OWN_AMAX_ELEMENTS", 0)
    monkeypatch.setattr(kq, "_barrier_programs", lambda device: 0)
    every = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32).to(torch.bfloat16)
    finite = every[~every.isnan() & ~every.isinf()]  # (a NaN or Inf input makes the device's global scale NaN / Inf)
    rows = finite[: finite.numel() // 256 * 256]
    hostile = _hostile(1000, 4096, gen).to(torch.bfloat16)
    for x in (rows.reshape(-1, 64), rows[torch.randperm(rows.numel(), generator=gen)].reshape(-1, 256),
              hostile if global_scale is not None else hostile.nan_to_num(0.0, 0.0, 0.0)):
        r = bs.quantize(x, "nvfp4", layout="swizzle_32_4_4", global_scale=global_scale)
        kq._LAUNCHES.clear()
        _assert_same_codes(bs.quantize(x.cuda(), "nvfp4", layout="swizzle_32_4_4", global_scale=global_scale), r)
        # the launch was the pairs kernel's (its key: "blocks", the format, rows, K, ..., PAIRS last)
        assert [k[-1] for k in kq._LAUNCHES if k[:4] == ("blocks", "nvfp4", *x.shape)] == [True], list(kq._LAUNCHES)


@cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_decoded_rows_gpu(fmt, gen, gpu_kernel_kind):
    x = _hostile(77, 2048, gen).to(torch.bfloat16)
    r = bs.quantize(x, fmt, global_scale=0.01 if fmt == "nvfp4" else None)
    want = dequantize(r, torch.float64) / (r.global_scale.double() if r.global_scale is not None else 1.0)
    rows, _ = quantize_decoded(x.cuda(), bs.get_format(fmt), "floor", 0.01 if fmt == "nvfp4" else None)
    want = want.to(torch.bfloat16)
    assert torch.equal(rows.cpu().isnan(), want.isnan())
    assert torch.equal(rows.cpu().nan_to_num(), want.nan_to_num())


DYNAMIC_PAIRS = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp4"), ("mxfp8", "mxfp8")]


@cuda
@pytest.mark.parametrize("fa,fb", DYNAMIC_PAIRS)
@pytest.mark.parametrize("m", [1, 16, 64, 300, 600])
def test_scaled_mm_activation_format_gpu(fa, fb, m, gen, gpu_kernel_kind):
    """The fused path (quantize kernel writing decoded rows, the bf16-activation plan) against quantize-then-GEMM:
    the fp64 reference of the same codes, and where both run the same plan (predecode: fp4 / fp8 activations on fp4
    weights above M = 16, up to the dense plan's M = 512) bit for bit. M = 600: the rows, then the dense plan (the
    weights decoded, cuBLAS) after the quantize kernel's early dependents' launch."""
    n, k = 384, 1024
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    w = bs.quantize_weight(torch.randn(n, k, generator=gen).cuda(), fb)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = bs.scaled_mm(x, w, activation_format=fa, out=out)
    a = bs.quantize(x, fa)
    y_two = bs.scaled_mm(a, w)
    assert max_rel_err(y, ref_scaled_mm(a, w)) < 8e-3
    assert max_rel_err(y, y_two) < 8e-3
    if 16 < m < 512 and fb != "mxfp8":
        assert torch.equal(y, y_two)


@cuda
def test_scaled_mm_activation_format_graph_and_static_scale(gen):
    """nvfp4 x nvfp4 with the global scale computed on the device, and with a static one (a tensor, not read on the
    host), captured in a CUDA graph and replayed on new inputs."""
    x = torch.randn(16, 2048, generator=gen).to(torch.bfloat16).cuda()
    w = bs.quantize_weight(torch.randn(512, 2048, generator=gen).cuda(), "nvfp4")
    static = torch.tensor([0.004], device="cuda")
    outs = [torch.empty(16, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for i, gs in enumerate((None, static)):  # warm up (compile) outside the capture
        bs.scaled_mm(x, w, activation_format="nvfp4", activation_global_scale=gs, out=outs[i])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i, gs in enumerate((None, static)):
            bs.scaled_mm(x, w, activation_format="nvfp4", activation_global_scale=gs, out=outs[i])
    x.copy_(torch.randn(16, 2048, generator=gen).to(torch.bfloat16).cuda())
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for o, gs in zip(outs, (None, static)):
        a = bs.quantize(x, "nvfp4", global_scale=gs)
        assert max_rel_err(o, ref_scaled_mm(a, w)) < 8e-3


@cuda
@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp4")])
def test_repeated_calls_new_tensors_gpu(fa, fb, gen):
    """After their first calls the quantize kernel and the GEMM launch bound to their operands' addresses (no Helion
    host function): each call with a new activation (new addresses) still gets its own codes and result."""
    w = bs.quantize_weight(torch.randn(256, 512, generator=gen).cuda(), fb)
    for _ in range(4):
        x = (torch.randn(3, 512, generator=gen) * 10).to(torch.bfloat16).cuda()
        a = bs.quantize(x, fa)
        _assert_same_codes(a, bs.quantize(x.cpu(), fa))
        y = bs.scaled_mm(x, w, activation_format=fa)
        assert max_rel_err(y, ref_scaled_mm(a, w)) < 8e-3


@cuda
@pytest.mark.parametrize("slots", [False, True], ids=["count", "slots"])
@pytest.mark.parametrize("rows,k", [(16, 8192), (16, 28672), (5, 8192)])
def test_nvfp4_grid_barrier_at_decode_rows_streams_and_graphs(rows, k, slots, monkeypatch):
    """nvfp4 with its global scale from the device at decode rows, where the programs meet at a grid barrier (32, 112
    and 16 programs): the reference's codes, scales and global scale eagerly, from two streams that overlap (each
    stream its own barrier buffer: `scratch.get`), and from a CUDA graph of three calls replayed twice on new inputs."""
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(kq, "QUANTIZE_BARRIER_SLOTS", slots)
    assert kq._global_scale(torch.ones(rows, k, device="cuda"), bs.get_format("nvfp4"), None).barrier == 1 + slots
    gen = torch.Generator().manual_seed(rows * k)
    inputs = [(torch.randn(rows, k, generator=gen) * 4.0 ** (i % 5 - 2)).to(torch.bfloat16) for i in range(6)]
    refs = [bs.quantize(x, "nvfp4", backend="reference") for x in inputs]
    gpu = [x.cuda() for x in inputs]
    for x, r in zip(gpu, refs):
        _assert_same_codes(bs.quantize(x, "nvfp4", backend="kernel"), r)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for i in range(24):
        with torch.cuda.stream(streams[i % 2]):
            outs.append((i % 6, bs.quantize(gpu[i % 6], "nvfp4", backend="kernel")))
    torch.cuda.synchronize()
    for i, q in outs:
        _assert_same_codes(q, refs[i])
    static = [torch.empty_like(gpu[0]) for _ in range(3)]
    for s, x in zip(static, gpu):
        s.copy_(x)
    for s, x in zip(static, gpu):  # warm-up outside the capture
        bs.quantize(s, "nvfp4", backend="kernel")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = [bs.quantize(s, "nvfp4", backend="kernel") for s in static]
    for first in (3, 0):
        for j, s in enumerate(static):
            s.copy_(gpu[first + j])
        graph.replay()
        torch.cuda.synchronize()
        for j, q in enumerate(captured):
            _assert_same_codes(q, refs[first + j])


@pytest.mark.parametrize("hip,capability,want", [(None, (9, 0), (True, True)), (None, (8, 9), (False, True)),
                                                 (None, (8, 0), (False, False)), ("6.2", (9, 4), (False, False)),
                                                 ("6.2", (9, 5), (False, False))])
def test_ptx_switches_only_on_nvidia(hip, capability, want, monkeypatch):
    """The quantize kernels' inline PTX (the dependents' early launch, sm_90+; the E4M3 conversion, sm_89+) only on
    NVIDIA GPUs: an AMD GPU's capability reads 9.4 (MI300) or 9.5 (MI355) and takes no PTX."""
    import types

    from blockscaled.kernels import plans
    from blockscaled.kernels import quantize as kq

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(plans, "_capability", lambda device: capability)
    x = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert (kq._pdl(x), kq._hw_e4m3(x, bs.get_format("mxfp8"))) == want
    assert not kq._pdl(types.SimpleNamespace(device=torch.device("cpu")))


def _tuned_quantize_entries() -> list:
    from blockscaled.kernels import tuned

    return [pytest.param(path.stem, e, id=f"{path.stem}-{e['kernel']}-{e['format']}-"
                         f"{'decoded' if e['decoded'] else 'codes'}-{e['rows']}x{e['k']}")
            for path in sorted(tuned.TABLES.glob("*.json")) for e in tuned.quantize_table(path.stem) if e["config"]]


@cuda
@pytest.mark.parametrize("direct_scratch", [False, True], ids=["scratch_by_triton", "scratch_direct"])
@pytest.mark.parametrize("gpu,entry", _tuned_quantize_entries())
def test_tuned_quantize_configs_equal_the_reference(gpu, entry, direct_scratch, gen, monkeypatch):
    """Every committed tuned quantize config (`kernels/tuned/<gpu>.json`, Helion's search, checked bit for bit only at
    the rows it was tuned at) is the one compiled, and equals the reference on hostile inputs at every row count that
    takes it (1 and 3 rows, around the tuned rows, and past them), for both roundings of the mx formats (the table's
    key has none); each launched twice (the second launch direct, into memory poisoned before), with the global
    scratch of device-side tensor descriptors allocated by Triton's launcher or by `launch.DIRECT_SCRATCH`."""
    from blockscaled.kernels import api as kapi, launch, quantize as kq, tuned

    if tuned.gpu_key(torch.cuda.get_device_name()) != gpu:
        pytest.skip(f"an entry of {gpu}'s table; this is {torch.cuda.get_device_name()}")
    monkeypatch.setattr(launch, "DIRECT_SCRATCH", direct_scratch)
    fmt, k = entry["format"], entry["k"]
    compiled = []
    real = kapi._compile
    monkeypatch.setattr(kapi, "_compile", lambda kernel, args, cfg, *rest, **kw: compiled.append(dict(cfg)) or
                        real(kernel, args, cfg, *rest, **kw))
    monkeypatch.setattr(kq, "QUANTIZE_BLOCKS", kq.QUANTIZE_BLOCKS | {fmt} if entry["kernel"].startswith("quantize_blocks_kernel")
                        else kq.QUANTIZE_BLOCKS - {fmt})
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS", entry["kernel"] == "quantize_blocks_kernel[pairs]")
    monkeypatch.setattr(kq, "QUANTIZE_PAIRS_DECODED", entry["kernel"] == "quantize_blocks_kernel[pairs]")
    rows_taking_it = [r for r in sorted({1, 3, entry["rows"] - 1, entry["rows"], entry["rows"] + 5, 2 * entry["rows"] + 7})
                      if r > 0 and tuned.quantize_config_for(gpu, entry["kernel"], fmt, entry["decoded"], "bfloat16",
                                                             r, k) == entry["config"]]
    assert entry["rows"] in rows_taking_it
    for rows in rows_taking_it:
        monkeypatch.setattr(kq, "_LAUNCHES", {})
        compiled.clear()
        x = _hostile(rows, k, gen).to(torch.bfloat16)
        if fmt == "nvfp4":
            x = x.nan_to_num(0.0, 0.0, 0.0)  # a finite global scale, so the rows compare
        xg = x.cuda()
        for rounding in ("floor",) if fmt == "nvfp4" else ("floor", "rceil"):
            r = bs.quantize(x, fmt, scale_rounding=rounding)  # the reference, on the CPU
            want = (dequantize(r, torch.float64) / (r.global_scale.double() if r.global_scale is not None else 1.0))
            want = want.to(torch.bfloat16)
            for _ in range(2):
                poison = torch.full((rows * k * 2,), 255, dtype=torch.uint8, device="cuda")
                del poison  # its block is the next allocation of that size (the rows): they start as NaN bytes
                if entry["decoded"]:
                    got, _ = quantize_decoded(xg, bs.get_format(fmt), rounding, None)
                    assert torch.equal(got.cpu().isnan(), want.isnan()), (rows, rounding)
                    assert torch.equal(got.cpu().nan_to_num(), want.nan_to_num()), (rows, rounding)
                else:
                    _assert_same_codes(bs.quantize(xg, fmt, scale_rounding=rounding), r)
        assert entry["config"] in [{k2: v for k2, v in c.items() if k2 in entry["config"]} for c in compiled], rows
