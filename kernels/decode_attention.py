"""Grouped-query attention of one query token per sequence over a static KV cache, split along the keys
(flash-decoding): the decode step's attention without copying the cache per query head.

At batch 1 a decode step has one query row per head; an attention kernel tiled by query rows and heads runs 8-32
programs (Llama-3-8B: 32 heads on 8 key / value heads) and reads the whole cache through them. Here each program
takes one key / value head and CHUNK keys, for all G query heads of that key / value head (so the cache is read
once, not G times), and a second kernel merges the chunks' softmax partials.

| tensor        | shape                  | dtype          | notes                                              |
|---------------|------------------------|----------------|----------------------------------------------------|
| q             | [B, Hkv, G, D]         | bf16/fp16/fp32 | the G query heads of each key / value head        |
| k, v          | [B, Hkv, S, D]         | q's            | the cache (S = its length; any strides, D last)    |
| keep          | [B, S] or [B or 1, 1, 1, S] | bool      | keys attended (the static cache's mask, 4-D as    |
|               |                        |                | transformers passes it: viewed as [B, S] inside)  |
| out           | [B, Hkv, G, D]         | q's            | softmax(q k^T x scale, keys kept) v                |

fp32 scores, softmax and sums (the products of bf16 values are exact in fp32), the probabilities rounded to the
cache's dtype for the value MMA (as flash attention's); any G >= 2 (Helion 1.5.0 stores a size-1 G as a scalar; G is
padded to a power of two >= 16 query rows: Qwen2.5-7B's 7, Mistral-Large's 12), D a power of two >= 16. A row with no
key kept gives NaN, as the fp64 reference's softmax (torch 2.13's SDPA gives 0 there on a CPU; a decode step always
keeps its own key).
"""

from __future__ import annotations

import math

import torch

import helion
import helion.language as hl

from .configs import KERNEL_SETTINGS
from .launch import device_error, interpreted

_LAUNCHES: dict = {}

# keys a program reads per step: a [GP, D] x [D, 64] score MMA and a [GP, 64] x [64, D] value MMA, 32 KB of bf16
# cache (keys and values) in flight per step
BLOCK_KEYS = 64
# programs per SM the split aims for (H200, 8B decode shape: 8.7-9.7 us a layer over 2-16, so not critical)
PROGRAMS_PER_SM = 4
# the query rows of an MMA: G query heads padded to a power of two >= 16 (the smallest MMA tile); padded rows are zeros,
# never stored
MIN_ROWS = 16
# Both kernels launched with programmatic dependent launch on sm_90+ (`_grid_wait`, `_dependents_may_launch`): each
# may start while the kernel before it in the stream ends, and lets the one after it start once its loads are done.
DECODE_ATTENTION_PDL = True


def _grid_wait(PDL):
    """`griddepcontrol.wait` (Triton's `gdc_wait`, with PDL), before the kernel's first load: the kernel before this
    one in the stream has completed and its writes are visible after it (inductor's kernels rely on the same order)."""
    if PDL:
        hl.inline_triton("tl.extra.cuda.gdc_wait()", args=(), output_like=None)


def _dependents_may_launch(PDL):
    """`griddepcontrol.launch_dependents` (with PDL), after the kernel's loads: the kernel after this one, if launched
    with PDL, may start its CTAs up to its own wait, which still waits for all of this kernel (so where the compiler
    places it changes only when that kernel starts)."""
    if PDL:
        hl.inline_triton("tl.extra.cuda.gdc_launch_dependents()", args=(), output_like=None)


def _exp2(x):
    """2^x by `tl.math.exp2` (ex2.approx on the GPU): Helion writes torch.exp2 as libdevice's, which the Triton
    interpreter (3.6) returns untyped."""
    return hl.inline_triton("tl.math.exp2({0})", args=(x,), output_like=x)


# dot_precision="ieee": fp32 caches get fp32 products (tf32 keeps 10 of fp32's 23 mantissa bits); bf16 / fp16 dots
# are exact products with fp32 sums either way
@helion.kernel(**KERNEL_SETTINGS, dot_precision="ieee")
def _partials_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, m_out: torch.Tensor,
                     l_out: torch.Tensor, acc_out: torch.Tensor, scale: float, CHUNK: hl.constexpr,
                     BLOCK: hl.constexpr, ROWS: hl.constexpr, PDL: hl.constexpr) -> torch.Tensor:
    """Chunk c of key / value head (b, h): m_out[b, h, c] (the largest kept score, base 2, -inf if none), l_out (sum
    of 2^(score - m)), acc_out (sum of 2^(score - m) v). Scores and sums fp32; the probabilities enter the value MMA
    in the cache's dtype (as flash attention's)."""
    B, HKV, G, D = q.shape
    S = k.size(2)
    for tile_b, tile_h, tile_c, tile_g in hl.tile([B, HKV, S, G], block_size=[1, 1, CHUNK, ROWS]):
        _grid_wait(PDL)
        b, h = tile_b.begin, tile_h.begin
        qt = q[b, h, tile_g, :]  # [ROWS, D]: rows past G masked to zero
        m_i = hl.full([tile_g], float("-inf"), dtype=torch.float32)
        l_i = hl.zeros([tile_g], dtype=torch.float32)
        acc = hl.zeros([tile_g, D], dtype=torch.float32)
        # a fixed count of steps (bounds from tile_c.end are a runtime range the Triton interpreter cannot run); keys
        # past S read the last one again (in bounds) and count as not kept
        for tile_j in hl.tile(CHUNK, block_size=BLOCK):
            idx = tile_c.begin + tile_j.index
            kept = idx < S
            idx = torch.where(kept, idx, S - 1)
            kt = k[b, h, idx, :]  # [BLOCK, D]
            vt = v[b, h, idx, :]  # loaded beside the keys: both in flight at once
            s = hl.dot(qt, kt.T, out_dtype=torch.float32) * (scale * 1.4426950408889634)  # x log2(e): base 2 for
            # exp2 (a literal: Helion passes module constants as extra arguments)
            s = torch.where((keep[b, idx] & kept)[None, :], s, float("-inf"))
            m_new = torch.maximum(m_i, s.amax(-1))
            m_use = torch.where(m_new == float("-inf"), 0.0, m_new)  # no key kept yet: every exp below is 0
            p = _exp2(s - m_use[:, None])
            alpha = _exp2(m_i - m_use)
            l_i = l_i * alpha + p.sum(-1)
            acc = hl.dot(p.to(vt.dtype), vt, acc=acc * alpha[:, None])
            m_i = m_new
        c = tile_c.begin // CHUNK
        _dependents_may_launch(PDL)
        m_out[b, h, c, tile_g] = m_i
        l_out[b, h, c, tile_g] = l_i
        acc_out[b, h, c, tile_g, :] = acc
    return acc_out


@helion.kernel(**KERNEL_SETTINGS)
def _merge_kernel(m_in: torch.Tensor, l_in: torch.Tensor, acc_in: torch.Tensor, out: torch.Tensor,
                  SPLITS_P2: hl.constexpr, PDL: hl.constexpr) -> torch.Tensor:
    """out[b, h, g] = sum_c 2^(m_c - M) acc_c / sum_c 2^(m_c - M) l_c, M the largest m_c: a program per query head."""
    B, HKV, splits, G = m_in.shape
    for tile_b, tile_h, tile_g in hl.tile([B, HKV, G], block_size=[1, 1, 1]):
        _grid_wait(PDL)
        b, h, g = tile_b.begin, tile_h.begin, tile_g.begin
        for tile_c in hl.tile(splits, block_size=SPLITS_P2):
            real = tile_c.index < splits
            m = torch.where(real, m_in[b, h, tile_c, g], float("-inf"))
            top = m.amax(0)
            top = torch.where(top == float("-inf"), 0.0, top)
            w = torch.where(real, _exp2(m - top), 0.0)
            l_sum = (w * l_in[b, h, tile_c, g]).sum(0)
            acc = (w[:, None] * acc_in[b, h, tile_c, g, :]).sum(0)
            _dependents_may_launch(PDL)
            out[b, h, g, :] = (acc / l_sum).to(out.dtype)
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None) -> str | None:
    """Why `decode_attention` does not take these operands, or None."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        return f"q [B, Hkv, G, D] and k, v [B, Hkv, S, D] expected, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    B, HKV, G, D = q.shape
    if k.shape[0] != B or k.shape[1] != HKV or k.shape[3] != D:
        return f"k {tuple(k.shape)} does not match q {tuple(q.shape)}"
    if D & (D - 1) or D < 16 or G < 2:
        return f"G = {G} and D = {D}: G >= 2 (grouped heads) and D a power of two >= 16 (an MMA's depth) expected"
    if k.shape[2] < 2:
        return f"S = {k.shape[2]}: at least 2 keys expected (Helion 1.5.0 collapses a size-1 dimension)"
    if k.device != q.device or v.device != q.device or (keep is not None and keep.device != q.device):
        return (f"q, k, v, keep on one device expected, got {q.device}, {k.device}, {v.device}, "
                f"{None if keep is None else keep.device}")
    if why := device_error("q", q):
        return why
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"bf16, fp16 or fp32 q, k, v of one dtype expected, got {q.dtype}, {k.dtype}, {v.dtype}"
    S = k.shape[2]
    if keep is not None and (keep.dtype != torch.bool or (keep.shape != (B, S) and (
            keep.dim() != 4 or keep.shape[0] not in (1, B) or tuple(keep.shape[1:]) != (1, 1, S)))):
        return (f"keep: a bool [B, S] = [{B}, {S}] or [B or 1, 1, 1, S] mask expected, got {keep.dtype} "
                f"{tuple(keep.shape)}")
    return None


def _keys_kept(keep: torch.Tensor, batch: int) -> torch.Tensor:
    """`keep` as [B, S] (a view: a 4-D mask is passed whole by `blockscaled.attention`, so that inductor makes the
    one mask of a step once rather than a [B, S] copy for each layer)."""
    return keep if keep.dim() == 2 else keep[:, 0, 0, :].expand(batch, keep.shape[-1])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T x scale, keys `keep`) v for q [B, Hkv, G, D] over k, v [B, Hkv, S, D]: the table above."""
    why = supported(q, k, v, keep)
    if why:
        raise ValueError(f"decode_attention: {why}")
    B, HKV, G, D = q.shape
    S = k.shape[2]
    keep = torch.ones(B, S, dtype=torch.bool, device=q.device) if keep is None else _keys_kept(keep, B)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    from . import plans
    from .api import _launch_cached

    if q.dtype == torch.bfloat16 and interpreted():
        # Triton 3.6's interpreter gets bf16 tl.dot wrong (a 16 x 16 product off by 1e10): bf16 runs as fp32 there
        # (on the GPU the bf16 path is tested at the 8B shape). Remove when the interpreter multiplies bf16.
        return decode_attention(q.float(), k.float(), v.float(), keep, scale).to(q.dtype)
    chunk = max(BLOCK_KEYS, _pow2(-(-S * B * HKV // (PROGRAMS_PER_SM * plans._sm_count(q.device)))))
    splits = -(-S // chunk)
    m = torch.empty(B, HKV, splits, G, dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    acc = torch.empty(B, HKV, splits, G, D, dtype=torch.float32, device=q.device)
    out = torch.empty(B, HKV, G, D, dtype=q.dtype, device=q.device)
    pdl = DECODE_ATTENTION_PDL and plans._has_pdl(q.device)
    key = (tuple(q.shape), S, q.dtype, q.device, k.stride(), v.stride(), keep.stride(), scale, chunk, BLOCK_KEYS, pdl)
    _launch_cached(_LAUNCHES, ("partials", key), _partials_kernel,
                   (q, k, v, keep, m, l_, acc, scale, chunk, BLOCK_KEYS, max(MIN_ROWS, _pow2(G)), pdl), _config, q.device,
                   pdl)
    _launch_cached(_LAUNCHES, ("merge", key), _merge_kernel, (m, l_, acc, out, _pow2(splits), pdl), _config, q.device,
                   pdl)
    return out


def _config() -> helion.Config:
    return helion.Config(block_sizes=[], num_warps=4, num_stages=2)


def decode_attention_reference(q, k, v, keep=None, scale=None) -> torch.Tensor:
    """The same in fp64 by torch."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if keep is not None:
        s = s.masked_fill(~_keys_kept(keep, q.shape[0])[:, None, None, :], float("-inf"))
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)
