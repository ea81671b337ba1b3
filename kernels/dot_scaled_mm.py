"""Native block-scaled MMA through `hl.dot_scaled`: Blackwell (sm_100+) and AMD CDNA4 (gfx950).

Not run on hardware here (we have Hopper only, where `tl.dot_scaled` is a slow bf16
emulation and the nvfp4 form does not compile). Tests check the generated Triton code:
one `tl.dot_scaled` per K step with the formats' names and the scale layout indexed in
place. On gfx950 the scales arrive in the cdna4 shuffles and are read through
`scale_offset`, the same index function the layouts module tests against AMD's tutorial.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from blockscaled.formats import FORMATS

from .configs import KERNEL_SETTINGS
from .decode import LAYOUT_CODES
from .tiles import load_data, load_scale_codes

# hl.dot_scaled format strings, by constexpr index (both operands are block-scaled here:
# api.DEQUANT_ONLY_PAIRS sends bf16 activations and the mixed pair to dequant_mm)
DOT_FORMATS = ("e2m1", "e4m3")


@helion.kernel(**KERNEL_SETTINGS)
def dot_scaled_mm_kernel(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    a_global: torch.Tensor,
    b_global: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    K: hl.constexpr,
    U: hl.constexpr,
    A_FMT: hl.constexpr,
    A_EPB: hl.constexpr,
    A_BLOCK: hl.constexpr,
    A_LAYOUT: hl.constexpr,
    B_FMT: hl.constexpr,
    B_EPB: hl.constexpr,
    B_BLOCK: hl.constexpr,
    B_LAYOUT: hl.constexpr,
    HAS_BIAS: hl.constexpr,
) -> torch.Tensor:
    m = out.size(0)
    n = out.size(1)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for g in hl.tile((K + U - 1) // U):  # masked loads zero the tail past K
            a = load_data(a_data, tile_m, g, U, K, A_EPB)
            b = load_data(b_data, tile_n, g, U, K, B_EPB)
            a_s = load_scale_codes(a_scale, tile_m, m, g, U, K, A_BLOCK, A_LAYOUT)
            b_s = load_scale_codes(b_scale, tile_n, n, g, U, K, B_BLOCK, B_LAYOUT)
            acc = hl.dot_scaled(a, a_s, DOT_FORMATS[A_FMT], b.T, b_s, DOT_FORMATS[B_FMT], acc=acc)
        acc = acc * (a_global[0] * b_global[0])
        if HAS_BIAS:
            acc = acc + bias[tile_n].to(torch.float32).unsqueeze(0)
        out[tile_m, tile_n] = acc.to(out.dtype)
    return out


def _operand(fmt, layout):
    return DOT_FORMATS.index(fmt.dot_scaled_name), fmt.elems_per_byte, fmt.block_size, LAYOUT_CODES[layout]


def dot_scaled_args(a, b, bias, out, k, has_bias):
    """Kernel arguments from two `api.Operand`s."""
    u = FORMATS["mxfp4"].block_size  # one K step covers whole MX and nvfp4 blocks
    return (
        a.data, a.scale, b.data, b.scale, a.global_scale, b.global_scale, bias, out,
        k, u, *_operand(a.fmt, a.layout), *_operand(b.fmt, b.layout), has_bias,
    )
