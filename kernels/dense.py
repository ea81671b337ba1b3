"""The dense plan for large M: weights decoded to bf16 in chunks of rows, each chunk multiplied by cuBLAS.

Above a few hundred activation rows a bf16 GEMM is tensor-core bound, so every exact decode-to-bf16 path is capped
near cuBLAS bf16; what a quantized GEMM adds is the decode. Decoding the weights once per call (codes read, bf16
written, read back by cuBLAS) runs at 0.93-0.95 of a device-to-device copy's bandwidth (H200, 45 us at 8192^2 fp4),
so the plan reaches 0.88-0.98x of cuBLAS bf16 at M = 2048 and 0.98-1.03x at M = 8192 (H200, 8192^2), where the
mma_m64 kernel's in-loop decode gave 0.47-0.66x (`api.DENSE_MIN_M`; `python -m bench.dense`).

| operand          | shape                                   | dtype                    | notes                               |
|------------------|-----------------------------------------|--------------------------|-------------------------------------|
| words            | [N / 16, K / 64, 128 (, 2)]             | int32 (E2M1 x 8) / int32 pairs (E4M3 x 8) | "mma_m16k16" (`layouts/mma.py`) |
| factors          | [N / 16 * K / 64 * blocks per window * 8] | int16 (R0, R1 bytes)   | `QTensor.kernel_mma_factors`        |
| post, a_post     | [1]                                     | fp32                     | 2^shift x weight global; act. global |
| out (a chunk)    | [rows, K] = [rows / 16, 2, 8, K / 64, 64] | bf16                  | row-major, K order                  |

A word (group gr, window w, step s, lane 4g + q) holds rows 16 gr + g (+ 8) at K = 64 w + 16 q + 4 s + j: its four
bf16x2 registers (`layouts.mma`), times the block's factor and the post-scale, are 8 of those elements. With
FOLD the global scales are multiplied in before the one rounding to bf16 (fp32 products, then bf16: within 2^-9
of each weight); without it the bf16 values are exact and the caller applies the global scales to an fp32 result.
"""

from __future__ import annotations

import functools

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .decode import bf16x2_to_float32

_E2M1_FIELDS = 0x81C081C0 - 2**32  # as int32: sign, e1, e0, m of the code under bf16's fields, both halves
_E4M3_FIELDS = 0x87F087F0 - 2**32
_E4M3_LOW_UP = 0x80F080F0 - 2**32
_SIGN_X2 = 0x80008000 - 2**32
_NV_FACTOR_BIAS = 237 << 7  # layouts.mma.NVFP4_BIAS under the bf16 exponent field

# 16 rows x 512 K a program, 4 warps: 4 KB of fp4 words in, 16 KB of bf16 out (H200, 8192^2: 0.93-0.95 of a copy;
# 32 rows or 1024 K a program 0.75 for fp8 words)
DENSE_GROUPS = 1
DENSE_WINDOWS = 8
DENSE_WARPS = 4


def _registers_e2m1(w):
    """int32 words -> their 4 registers, each bf16x2(code * 2^-126) (`layouts.mma`'s drawing)."""
    r3 = ((w >> 4) & 0x00C000C0) | ((w >> 5) & 0x01000100) | ((w << 1) & _SIGN_X2)
    return w & _E2M1_FIELDS, (w << 3) & _E2M1_FIELDS, (w << 6) & _E2M1_FIELDS, r3


def _registers_e4m3(lo, hi):
    """The two int32 halves of E4M3 words -> 4 registers, each bf16x2(value * 2^-120)."""
    def pair(half):
        return half & _E4M3_FIELDS, ((half << 4) & _E4M3_LOW_UP) | ((half >> 4) & 0x07000700)

    r0, r1 = pair(lo)
    r2, r3 = pair(hi)
    return r0, r1, r2, r3


def _factor_float32(byte, NV: bool):
    """Factor bytes (int32 0..255) -> the fp32 factor f (`layouts.mma.factor_value`), exact."""
    if NV:
        return (((byte << 4) + _NV_FACTOR_BIAS) << 16).view(torch.float32)
    return (byte << 23).view(torch.float32)


@helion.kernel(**KERNEL_SETTINGS)
def dense_decode_kernel(
    words: torch.Tensor,
    factors: torch.Tensor,
    post: torch.Tensor,
    a_post: torch.Tensor,
    out: torch.Tensor,
    FP8: hl.constexpr,
    NV: hl.constexpr,
    PER_WINDOW: hl.constexpr,
    FOLD: hl.constexpr,
) -> torch.Tensor:
    """out[gr, half, g, w, 16 q + 4 s + j] (bf16) = element x factor x post (x a_post with FOLD) of word
    [gr, w, 32 s + 4 g + q]."""
    groups, windows = out.size(0), out.size(3)
    # K tiles vary fastest: programs that run together stream whole rows, not one column band of 16 KB-strided rows
    for tile_w, tile_gr in hl.tile([windows, groups]):
        # the words as stored (128 contiguous a window: coalesced), then in the output's order [gr, g, w, q, s]
        if FP8:
            raw = words[tile_gr, tile_w, :, :].reshape(tile_gr.block_size, tile_w.block_size, 4, 8, 4, 2)
            lo, hi = hl.split(raw.permute(0, 3, 1, 4, 2, 5))
            regs = _registers_e4m3(lo, hi)
        else:
            raw = words[tile_gr, tile_w, :].reshape(tile_gr.block_size, tile_w.block_size, 4, 8, 4)
            regs = _registers_e2m1(raw.permute(0, 3, 1, 4, 2))
        # the lane's block: q for 16-element blocks (4 a window), q // 2 for 32
        gr = tile_gr.index[:, None, None, None]
        g = hl.arange(8)[None, :, None, None]
        w = tile_w.index[None, None, :, None]
        q = hl.arange(4)[None, None, None, :]
        off = ((gr * windows + w) * PER_WINDOW + q * PER_WINDOW // 4) * 8 + g
        pair = hl.load(factors, [off]).to(torch.int32)[:, :, :, :, None]
        mul = post[0]
        if FOLD:
            mul = mul * a_post[0]
        f0 = _factor_float32(pair & 0xFF, NV)
        f1 = _factor_float32((pair >> 8) & 0xFF, NV)
        # register i holds row half i % 2 at j = 2 (i // 2) + (0: low, 1: high 16 bits)
        v = [bf16x2_to_float32(r) for r in regs]
        for half, f in ((0, f0), (1, f1)):
            first, second = v[half], v[half + 2]
            # register x factor is element x scale x 2^-shift (in range: f alone may be near fp32's top), then x post
            j01 = torch.stack([first[0] * f * mul, first[1] * f * mul], dim=5)
            j23 = torch.stack([second[0] * f * mul, second[1] * f * mul], dim=5)
            # stored as 64 contiguous K a window: a store of [.., q, s, j] dims coalesced across rows instead (0.17 of
            # a copy's bandwidth, H200)
            vals = torch.stack([j01, j23], dim=5).reshape(tile_gr.block_size, 8, tile_w.block_size, 64)
            out[tile_gr, half, :, tile_w, :] = vals.to(torch.bfloat16)
    return out


def dense_decode_config() -> helion.Config:
    return helion.Config(block_sizes=[DENSE_WINDOWS, DENSE_GROUPS], num_warps=DENSE_WARPS, num_stages=1)


# Weight rows decoded per cuBLAS call: all of them up to DENSE_CHUNK_BYTES of bf16 (the workspace is this call's,
# from the stream's allocator), else chunks of whole 128-row programs. Chunks cost little: H200, M = 2048, 8192^2 and
# 28672 x 8192, 2048-row chunks against one 0.99-1.01x (bench/results/h200_dense_decode_chunks_08d5118_2026-11-28.log).
DENSE_CHUNK_BYTES = 256 << 20
# Chunk i + 1 decoded on a side stream while cuBLAS multiplies chunk i (two buffers, events) did not pay: H200, M =
# 2048, 8192^2 nvfp4 441.7 us in one chunk against 441.9 in four overlapped, Llama-3-8B's shapes 0.91-1.07x the
# in-order speed (bench/results/h200_dense_overlap_0cb04ac_2026-11-30.log): cuBLAS holds every SM, so the decode waits.
PLAN_KEYS = ("chunk_rows",)

_LAUNCHES: dict[tuple, object] = {}


def chunk_rows(n_stored: int, k_stored: int, config: dict | None) -> int:
    """Weight rows per chunk: `config["chunk_rows"]` (a multiple of 16) or the default rule above."""
    from .plans import MMA_WARP_M

    if config:
        unknown = set(config) - set(PLAN_KEYS)
        if unknown:
            raise ValueError(f"config: the dense plan takes keys {PLAN_KEYS}, got {sorted(unknown)}")
        rows = config.get("chunk_rows", n_stored)
        if not isinstance(rows, int) or rows <= 0 or rows % MMA_WARP_M:
            raise ValueError(f"config: chunk_rows must be a positive multiple of {MMA_WARP_M}, got {rows!r}")
        return min(rows, n_stored)
    fit = max(128, DENSE_CHUNK_BYTES // (2 * k_stored) // 128 * 128)
    return min(n_stored, fit)


def decode_weights(b, r0: int, rows: int, out: torch.Tensor, a_post: torch.Tensor | None, fold: bool) -> torch.Tensor:
    """Weight rows [r0, r0 + rows) of "mma_m16k16" QTensor `b` (multiples of 16, within its stored rows) decoded into
    bf16 `out` [rows, stored K]: element x block scale x 2^shift, times both global scales with `fold`."""
    from blockscaled.layouts.mma import ELEMENTS, WINDOW_K
    from .api import _launch_cached, _one

    n_stored, k_stored = b.stored_shape
    windows = k_stored // WINDOW_K
    fp8 = ELEMENTS[b.fmt.element].word_bits == 64
    per_window = WINDOW_K // b.fmt.block_size
    words = b.data.view(torch.int32)
    words = words.view(n_stored // 16, windows, 128, 2) if fp8 else words.view(n_stored // 16, windows, 128)
    words = words[r0 // 16:(r0 + rows) // 16]
    per_group = windows * per_window * 8
    factors, post = b.kernel_mma_factors
    factors = factors[r0 // 16 * per_group:(r0 + rows) // 16 * per_group]
    if not fold:  # the exact bf16 values: the global scale (if any) stays with the caller
        post = _power_of_two(out.device, b.kernel_mma_shift)
    args = (words, factors, post, a_post if a_post is not None else _one(out.device),
            out.view(rows // 16, 2, 8, windows, 64), fp8, b.fmt.global_scale, per_window,
            fold and a_post is not None)
    _launch_cached(_LAUNCHES, (b.fmt.name, rows, k_stored, out.device, args[-1]), dense_decode_kernel, args,
                   dense_decode_config, out.device)
    return out


@functools.lru_cache(maxsize=None)
def _power_of_two(device: torch.device, shift: int) -> torch.Tensor:
    """2^shift as a [1] fp32 tensor on `device`, made once (like `api._one`)."""
    return torch.full((1,), 2.0**shift, dtype=torch.float32, device=device)


def dense_mm(a, b, m: int, n: int, k: int, out_dtype: torch.dtype, bias, out: torch.Tensor, config,
             a_post: torch.Tensor | None = None) -> torch.Tensor:
    """`scaled_mm` on the dense plan: activation `a` (bf16 [M, K], or a k_order QTensor decoded to bf16 rows here,
    exact) times "mma_m16k16" weights `b` decoded chunk by chunk (`decode_weights`), each chunk one cuBLAS call.
    bf16 out: the global scales are folded into the decoded weights (one rounding each), the bias into cuBLAS's
    epilogue. fp32 / fp16 out: exact bf16 weights, an fp32 product, then the global scales and bias (fp16 out
    would not hold bf16-rounded weights' error)."""
    from blockscaled.qtensor import QTensor

    if isinstance(a, QTensor):
        a, a_post = _activation_rows(a), a.kernel_global_scale
    n_stored, k_stored = b.stored_shape
    rows_per_chunk = chunk_rows(n_stored, k_stored, config)
    fold = out_dtype == torch.bfloat16
    g = None
    if not fold and (b.global_scale is not None or a_post is not None):
        g = b.kernel_global_scale if b.global_scale is not None else None
        g = a_post if g is None else (g if a_post is None else g * a_post)
    work = torch.empty((min(rows_per_chunk, n_stored), k_stored), dtype=torch.bfloat16, device=out.device)
    for r0 in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, -(-(n - r0) // 16) * 16)
        w = decode_weights(b, r0, rows, work[:rows], a_post, fold)
        cols = min(rows, n - r0)
        wt = w[:cols, :k].t()
        dst = out[:, r0:r0 + cols]
        chunk_bias = None if bias is None else bias[r0:r0 + cols]
        if fold:
            if chunk_bias is not None and chunk_bias.dtype != out_dtype:  # cuBLAS's epilogue takes the output's dtype
                chunk_bias = chunk_bias.to(out_dtype)
            if chunk_bias is None:
                torch.mm(a, wt, out=dst)
            else:
                torch.addmm(chunk_bias, a, wt, out=dst)
            continue
        r = torch.mm(a, wt, out_dtype=torch.float32) if a.is_cuda else torch.mm(a.float(), wt.float())
        if g is not None:
            r.mul_(g)
        if chunk_bias is not None:
            r.add_(chunk_bias)
        dst.copy_(r)
    return out


def _activation_rows(a) -> torch.Tensor:
    """A k_order fp4 / fp8 QTensor activation as bf16 [M, K] rows of element x block scale (exact; the global scale
    not applied), by `dequantize.dequantize_kernel`."""
    from .api import _launch_cached
    from .dequantize import dequantize_args, dequantize_config, dequantize_kernel

    rows = torch.empty((a.rows, a.K), dtype=torch.bfloat16, device=a.device)
    args = dequantize_args(a, rows.view(a.rows, -1, a.fmt.block_size))
    _launch_cached(_LAUNCHES, ("activation", a.fmt.name, a.layout, a.rows, a.K, a.device), dequantize_kernel, args,
                   lambda: dequantize_config(a), a.device)
    return rows
