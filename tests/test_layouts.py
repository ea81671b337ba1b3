"""Scale layouts: bit-exact against torchao, the seeds' formulas, and round trips."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockscaled import layouts

ao_utils = pytest.importorskip("torchao.prototype.mx_formats.utils")


def _codes(rows, cols, gen):
    return torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=gen)


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 4), (130, 5), (256, 64), (300, 7), (33, 130)])
def test_swizzle_matches_torchao_to_blocked(rows, cols, gen):
    s = _codes(rows, cols, gen)
    assert torch.equal(layouts.swizzle_32_4_4(s), ao_utils.to_blocked(s).flatten())


def test_swizzle_float8_dtype_kept(gen):
    s = _codes(128, 4, gen).view(torch.float8_e8m0fnu)
    out = layouts.swizzle_32_4_4(s)
    assert out.dtype == torch.float8_e8m0fnu
    assert torch.equal(layouts.unswizzle_32_4_4(out, 128, 4).view(torch.uint8), s.view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 400), cols=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_swizzle_offset_formula_round_trip_and_padding(rows, cols, seed):
    s = _codes(rows, cols, torch.Generator().manual_seed(seed))
    flat = layouts.swizzle_32_4_4(s)
    rows_p, cols_p = layouts.padded_scale_shape("swizzle_32_4_4", rows, cols)
    assert flat.numel() == rows_p * cols_p
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    # DESIGN.md's offset formula, written out independently of the module.
    design = ((r // 128) * (cols_p // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    assert torch.equal(layouts.swizzle_32_4_4_offset(r, c, cols), design)
    assert torch.equal(flat[design], s)
    assert layouts.swizzle_32_4_4_offset(rows - 1, cols - 1, cols) == design[-1, -1].item()
    mask = torch.ones(flat.numel(), dtype=torch.bool)
    mask[design.flatten()] = False
    assert (flat[mask] == 0).all()  # padding is zero codes
    assert torch.equal(layouts.unswizzle_32_4_4(flat, rows, cols), s)


def test_swizzle_5d_is_the_triton_tutorial_preshuffle(gen):
    rows, cols = 256, 12
    s = _codes(rows, cols, gen)
    # The Triton block-scaled tutorial's preshuffle of a [rows, cols] scale matrix.
    tutorial = s.reshape(rows // 128, 4, 32, cols // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    flat = layouts.swizzle_32_4_4(s)
    view = layouts.swizzle_32_4_4_5d(flat, rows, cols)
    assert view.data_ptr() == flat.data_ptr()
    assert torch.equal(view, tutorial)


def _amd_tutorial_shuffle(scales, mfma_nonkdim):
    # AMD's Triton tutorial (DESIGN.md section 2).
    rows, cols = scales.shape
    if mfma_nonkdim == 32:
        s = scales.view(rows // 32, 32, cols // 8, 4, 2, 1).permute(0, 2, 4, 1, 3, 5)
    else:
        s = scales.view(rows // 32, 2, 16, cols // 8, 2, 4, 1).permute(0, 3, 5, 2, 4, 1, 6)
    return s.contiguous().reshape(rows // 32, cols * 32)


@pytest.mark.parametrize("mfma", [16, 32])
@pytest.mark.parametrize("rows,cols", [(32, 8), (64, 16), (256, 40)])
def test_cdna4_shuffle_matches_amd_tutorial(mfma, rows, cols, gen):
    s = _codes(rows, cols, gen)
    out = layouts.cdna4_shuffle(s, mfma)
    assert torch.equal(out, _amd_tutorial_shuffle(s, mfma))
    assert torch.equal(layouts.cdna4_unshuffle(out, mfma, rows, cols), s)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 100), cols=st.integers(1, 30), mfma=st.sampled_from([16, 32]))
def test_cdna4_round_trip_with_padding(rows, cols, mfma):
    s = _codes(rows, cols, torch.Generator().manual_seed(rows * 31 + cols))
    out = layouts.cdna4_shuffle(s, mfma)
    rows_p, cols_p = layouts.padded_scale_shape(f"cdna4_{mfma}", rows, cols)
    assert out.shape == (rows_p // 32, cols_p * 32)
    assert torch.equal(layouts.cdna4_unshuffle(out, mfma, rows, cols), s)


def test_layout_errors():
    with pytest.raises(ValueError, match="layout: unknown scale layout 'blocked'"):
        layouts.to_layout(torch.zeros(4, 4, dtype=torch.uint8), "blocked")
    with pytest.raises(ValueError, match="mfma_nonkdim: expected 16 or 32"):
        layouts.cdna4_shuffle(torch.zeros(32, 8, dtype=torch.uint8), 64)
    with pytest.raises(ValueError, match="flat: expected 512 scale codes"):
        layouts.unswizzle_32_4_4(torch.zeros(100, dtype=torch.uint8), 128, 4)
    with pytest.raises(ValueError, match="shuffled: expected shape"):
        layouts.cdna4_unshuffle(torch.zeros(2, 8, dtype=torch.uint8), 32, 32, 8)


@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4", "cdna4_16", "cdna4_32"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (64, 16), (130, 9), (257, 33)])
def test_scale_offset_indexes_every_layout(layout, rows, cols, gen):
    """The in-kernel index function finds every logical scale in the stored buffer."""
    s = _codes(rows, cols, gen)
    stored = layouts.to_layout(s, layout).reshape(-1)
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    off = layouts.scale_offset(layout, r, c, cols)
    assert torch.equal(stored[off], s)
    assert off.unique().numel() == rows * cols  # no two scales share a slot


# ---- fp4 data layouts ----

