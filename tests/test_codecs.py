"""Codecs: exhaustive over every code, bit-exact against torch and torchao."""

import pytest
import torch

from blockscaled.reference import codecs

ao_kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")

# DESIGN.md section 2: the E2M1 code table, written from the spec.
SPEC_E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]


def test_e2m1_table_matches_spec():
    got = codecs.decode_e2m1(torch.arange(16, dtype=torch.uint8))
    assert got.tolist() == SPEC_E2M1
    assert torch.signbit(got[8])  # code 8 is -0


def test_e2m1_decode_matches_torchao():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(codecs.decode_e2m1(codes), ao_kernels.f4_unpacked_to_f32(codes))


def test_e2m1_round_trip_every_code():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(codecs.encode_e2m1(codecs.decode_e2m1(codes)), codes)


def _all_bf16_as_f32():
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(torch.bfloat16).to(torch.float32)


def test_e2m1_encode_matches_torchao_every_bf16_and_random(gen):
    x = torch.cat([_all_bf16_as_f32(), torch.randn(200_000, generator=gen) * 4])
    x = x[~torch.isnan(x)]  # NaN: see test_e2m1_encode_nan
    assert torch.equal(codecs.encode_e2m1(x), ao_kernels.f32_to_f4_unpacked(x))


def test_e2m1_encode_ties_to_even_and_saturates():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 1e30, float("inf"), -5.0, -0.1])
    want = [0, 2, 2, 4, 4, 6, 6, 7, 7, 8 + 6, 8]
    assert codecs.encode_e2m1(mids).tolist() == want
    ulp = torch.nextafter(mids[:7], torch.full((7,), 100.0))
    assert codecs.encode_e2m1(ulp).tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_e2m1_encode_nan():
    assert codecs.encode_e2m1(torch.tensor([float("nan"), -float("nan")])).tolist() == [0, 0]


def test_fp4_packing_even_element_in_low_nibble():
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    packed = codecs.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0xF3]]
    assert torch.equal(codecs.unpack_fp4(packed), codes)
    # torch's own fp4x2 dtype has the same convention (view, no copy).
    assert packed.view(torch.float4_e2m1fn_x2).shape == (1, 2)


def test_fp4_packing_matches_torchao_every_byte():
    codes = torch.stack(torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij"), -1)
    codes = codes.reshape(-1, 2).to(torch.uint8)
    assert torch.equal(codecs.pack_fp4(codes).reshape(-1), ao_kernels.pack_uint4(codes).reshape(-1))
    assert torch.equal(codecs.unpack_fp4(codecs.pack_fp4(codes)), codes)


def test_e8m0_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    got = codecs.decode_e8m0(codes)
    assert torch.isnan(got[255]) and not torch.isnan(got[:255]).any()
    # DESIGN.md: the fp32 bit pattern of code c >= 1 is c << 23; code 0 is 2^-127.
    assert torch.equal(got[1:255].view(torch.int32), torch.arange(1, 255, dtype=torch.int32) << 23)
    assert got[0].item() == 2.0**-127
    same = codecs.decode_e8m0(codes.view(torch.float8_e8m0fnu))
    assert torch.equal(same.view(torch.int32), got.view(torch.int32))


def test_e4m3_every_code_matches_torch_cast():
    codes = torch.arange(256, dtype=torch.uint8)
    got = codecs.decode_e4m3(codes)
    want = codes.view(torch.float8_e4m3fn).to(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert nan.nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert torch.equal(got[~nan], want[~nan])
    assert got[~nan].max().item() == 448.0 and got[1].item() == 2.0**-9
