"""nvfp4 x nvfp4 on Helion's CuTe backend: Blackwell's block-scaled MMA (tcgen05 with E4M3 scale factors); bf16 x
nvfp4 as Helion's W4A16 example writes it (per-lane code there too: Helion 1.5.0 lowers no W4A16 contraction to MMA).

| operand   | stored as (QTensor)                   | the kernel reads                  | dtype            |
|-----------|---------------------------------------|-----------------------------------|------------------|
| a         | data [M, K / 2], k_order              | [M, K / 16, 8] (a view)           | float4_e2m1fn_x2 |
| a (W4A16) | bf16 [M, K], contiguous               | [M, K / 16, 16] (a view)          | bfloat16         |
| a scales  | rowmajor or swizzle_32_4_4, [M, K/16] | flat, indexed by `_scale_index`   | float8_e4m3fn    |
| b (N x K) | data [N, K / 2], k_order              | [K / 16, 8, N] (a permuted view)  | float4_e2m1fn_x2 |
| b scales  | rowmajor or swizzle_32_4_4, [N, K/16] | flat, indexed by `_scale_index`   | float8_e4m3fn    |
| out       | [M, N] fp32 from the kernel           | x both global scales, + bias, cast to out_dtype after |

Each byte holds two E2M1 codes, even K in the low nibble (`hl.float4_e2m1fn_x2_to_float32` returns (low, high)).
Helion 1.5.0 proves the contraction below block-scaled (8 byte pairs a 16-element group, one E4M3 scale a side and
group; `_compiler/cute/scaled_contraction.py`) and on sm_100 with `cute_scaled_mma` lowers it to its
`block_scaled_mma` plan: a prepare kernel gathers both operands and their scales through the proven addresses into a
per-call workspace, then a persistent tcgen05 kernel runs 128 x tile_n x tile_k tiles. The global scales stay out of
the kernel: the plan's epilogue takes a Python float (a host read of a device scalar every call), so they multiply
the fp32 output instead.

Not run on a GPU: we have no Blackwell, and on the Hopper image's torch 2.11 Helion's CuTe codegen fails
(`missing_torch_helpers`, docs/CUTE.md). `tests/test_cute_mm.py` generates
the sm_100 code on a CPU and evaluates the plan's addresses against the fp64 reference.
"""

from __future__ import annotations

import functools

import torch

import helion
import helion.language as hl

from blockscaled.qtensor import QTensor

from . import plans

# Helion's native tile (its third seed, `autotuner_heuristics/cute_block_scaled.py`): 128 x 256 x 256, clusters of
# 2 CTAs along M, persistent, 4 stages (5 with the fp32 output tile: 235,520 bytes of shared memory, over 232,448).
# Not tuned: nothing here has run on sm_100.
CUTE_CONFIG = dict(cute_scaled_mma=True, cute_collective_mma=False, cute_scaled_tile_n=256, cute_scaled_tile_k=256,
                   cute_scaled_stages=4, cute_scaled_cluster_m=2, cute_scaled_persistent=True)
CUTE_TILE = [128, 128, 16]  # the source tiles (M, N, K groups): the native plan sets its own
# Elsewhere (Hopper: no tcgen05) Helion lowers the same source to per-lane CuTe code: slow, and not a product path;
# `tests/test_cute_mm_gpu.py` runs it there so the backend's code path executes on a real GPU.
LANE_CONFIG = dict(block_sizes=[16, 16, 4], num_warps=4)


def _scale_index(r, c, cols, swizzled):
    """Flat offset of scale (r, c) of [rows, cols]: rowmajor, or SWIZZLE_32_4_4 (`layouts.swizzle_32_4_4_offset`)
    written with // and %, since Helion's scale-address proof declines the >> and & form."""
    if swizzled:
        tiles = (cols + 3) // 4
        return ((r // 128) * tiles + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return r * cols + c


def _nvfp4_body(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out: torch.Tensor,
                A_SWIZZLED: hl.constexpr, B_SWIZZLED: hl.constexpr) -> torch.Tensor:
    m, groups, _ = a.shape
    n = b.size(2)
    for row, col in hl.tile([m, n]):
        acc = hl.zeros([row, col], dtype=torch.float32)
        for group in hl.tile(groups):
            left = a_scale[_scale_index(row.index[:, None], group.index[None, :], groups, A_SWIZZLED)].to(torch.float32)
            right = b_scale[_scale_index(col.index[None, :], group.index[:, None], groups, B_SWIZZLED)].to(torch.float32)
            for byte in hl.static_range(8):
                a0, a1 = hl.float4_e2m1fn_x2_to_float32(a[row, group, byte])
                b0, b1 = hl.float4_e2m1fn_x2_to_float32(b[group, byte, col])
                acc = acc + ((a0.unsqueeze(2) * b0.unsqueeze(0) + a1.unsqueeze(2) * b1.unsqueeze(0))
                             * left.unsqueeze(2) * right.unsqueeze(0)).sum(1)
        out[row, col] = acc
    return out


def _w4a16_body(a: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out: torch.Tensor,
                B_SWIZZLED: hl.constexpr) -> torch.Tensor:
    m, groups, _ = a.shape
    n = b.size(2)
    for row, col in hl.tile([m, n]):
        acc = hl.zeros([row, col], dtype=torch.float32)
        for group in hl.tile(groups):
            right = b_scale[_scale_index(col.index[None, :], group.index[:, None], groups, B_SWIZZLED)].to(torch.float32)
            for byte in hl.static_range(8):
                b0, b1 = hl.float4_e2m1fn_x2_to_float32(b[group, byte, col])
                a0 = a[row, group, byte * 2].to(torch.float32)
                a1 = a[row, group, byte * 2 + 1].to(torch.float32)
                acc = acc + ((a0.unsqueeze(2) * b0.unsqueeze(0) + a1.unsqueeze(2) * b1.unsqueeze(0))
                             * right.unsqueeze(0)).sum(1)
        out[row, col] = acc
    return out


@functools.lru_cache(maxsize=None)
def w4a16_kernel() -> helion.Kernel:
    """bf16 x nvfp4 on the CuTe backend: per-lane code on every GPU (`LANE_CONFIG`); made on first use."""
    return helion.kernel(_w4a16_body, backend="cute", static_shapes=True, config=helion.Config(**LANE_CONFIG))


@functools.lru_cache(maxsize=None)
def nvfp4_kernel(native: bool = True) -> helion.Kernel:
    """The CuTe-backend kernel with the native block-scaled plan (sm_100), or per-lane code (`LANE_CONFIG`); made on
    first use."""
    config = helion.Config(block_sizes=CUTE_TILE, **CUTE_CONFIG) if native else helion.Config(**LANE_CONFIG)
    return helion.kernel(_nvfp4_body, backend="cute", static_shapes=True, config=config)


# scaled_mm's default for nvfp4 x nvfp4 on sm_100 where the CuTe extra is installed: off until the kernel has run on
# a Blackwell GPU against the reference (`hl.dot_scaled` on the Triton backend meanwhile). Set True to take it.
CUTE_DEFAULT_ON_SM100 = False


def cute_default(device: torch.device) -> bool:
    """Whether `scaled_mm` takes this backend without being asked: CUTE_DEFAULT_ON_SM100 on an NVIDIA sm_100 GPU with
    Helion's CuTe backend installed."""
    return CUTE_DEFAULT_ON_SM100 and _sm100(device) and cute_unavailable() is None


def _sm100(device: torch.device) -> bool:
    return plans._ptx_decodes(device) and plans._capability(device)[0] == 10


def cute_unavailable() -> str | None:
    """Why Helion's CuTe backend cannot run here (None: it can): the optional extra `helion[cute]`
    (nvidia-cutlass-dsl 4.7.0 for CUDA 13, apache-tvm-ffi), a torch built with CUDA >= 13, and a torch whose inductor
    has the CuTe DSL helpers Helion calls (`missing_torch_helpers`)."""
    from helion._compiler.cute.cutedsl_compat import _cute_backend_requirement_error

    reason = _cute_backend_requirement_error()
    if reason is None and missing_torch_helpers():
        reason = (f"Helion's CuTe backend calls torch inductor's CuteDSLOpOverrides."
                  f"{', .'.join(missing_torch_helpers())}, which torch {torch.__version__} lacks (torch 2.13 has them)")
    return reason


@functools.lru_cache(maxsize=None)
def missing_torch_helpers() -> tuple[str, ...]:
    """The `CuteDSLOpOverrides` helpers Helion's CuTe backend (its `_compiler/cute` sources) calls and this torch's
    inductor lacks: torch 2.11 (the GPU image's) lacks `_expected_tensor_val` and `_cast_expr`, and Helion's codegen
    fails inside them on every kernel here (`bench/results/h200_gpu_tests_cute_torch211_*.log`)."""
    import re
    from pathlib import Path

    import helion._compiler.cute as cute_pkg
    from torch._inductor.codegen.cutedsl.cutedsl_op_overrides import CuteDSLOpOverrides

    called = set()
    for path in Path(cute_pkg.__file__).parent.glob("*.py"):
        called.update(re.findall(r"(?<!\w)CuteDSLOpOverrides\.(\w+)", path.read_text()))
    return tuple(sorted(name for name in called if not hasattr(CuteDSLOpOverrides, name)))


def arguments(a, b: QTensor, acc: torch.Tensor) -> tuple:
    """The kernel's arguments: views of a and b (see the table above, no copies), the fp32 output, whether each
    quantized operand's scales are swizzled (`nvfp4_kernel`'s, or with a bf16 `a` `w4a16_kernel`'s)."""
    m, k = a.shape
    n = b.shape[0]
    groups = k // 16
    b_data = b.data.view(torch.float4_e2m1fn_x2).view(n, groups, 8).permute(1, 2, 0)
    b_swizzled = b.layout == "swizzle_32_4_4"
    if not isinstance(a, QTensor):
        return a.view(m, groups, 16), b_data, b.scale.reshape(-1), acc, b_swizzled
    a_data = a.data.view(torch.float4_e2m1fn_x2).view(m, groups, 8)
    return a_data, a.scale.reshape(-1), b_data, b.scale.reshape(-1), acc, a.layout == "swizzle_32_4_4", b_swizzled


def check_operands(a, b) -> None:
    """What the CuTe kernels read: b an nvfp4 QTensor with k_order data and rowmajor or swizzle_32_4_4 scales, a the
    same or a contiguous bf16 tensor (any K: the native plan pads its workspace to whole K tiles)."""
    for name, x in (("a", a), ("b", b)):
        if name == "a" and isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and x.is_contiguous():
            continue
        if not isinstance(x, QTensor) or x.fmt.name != "nvfp4" or x.data_layout != "k_order" or (
                x.layout not in ("rowmajor", "swizzle_32_4_4")):
            got = (f"{x.fmt.name} with {x.data_layout} data and {x.layout} scales" if isinstance(x, QTensor)
                   else f"a {x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__)
            also = " (a: or a contiguous bf16 tensor)" if name == "a" else ""
            raise ValueError(f"{name}: backend 'cute' takes nvfp4 QTensors with k_order data and rowmajor or "
                             f"swizzle_32_4_4 scales{also}, got {got}")


def cute_scaled_mm(a, b: QTensor, bias, out: torch.Tensor) -> torch.Tensor:
    """a @ b.T through `nvfp4_kernel` (or `w4a16_kernel`) into `out` (checked by the caller), then the global scales
    and bias."""
    check_operands(a, b)
    device = b.device
    if not _sm100(device):
        where = f"sm_{''.join(map(str, plans._capability(device)))}" if plans._ptx_decodes(device) else str(device)
        raise ValueError(f"backend: 'cute' runs on NVIDIA sm_100 (Blackwell: tcgen05's block-scaled MMA), got {where}")
    reason = cute_unavailable()
    if reason is not None:
        raise RuntimeError(f"backend: 'cute' needs Helion's CuTe backend (pip install 'helion[cute]'): {reason}")
    return run(a, b, bias, out, native=True)


def run(a, b: QTensor, bias, out: torch.Tensor, native: bool) -> torch.Tensor:
    """`nvfp4_kernel(native)` (or with a bf16 `a` `w4a16_kernel`) into an fp32 tile, then the global scales and bias,
    into `out`."""
    acc = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    quantized = isinstance(a, QTensor)
    (nvfp4_kernel(native) if quantized else w4a16_kernel())(*arguments(a, b, acc))
    for g in (a.global_scale if quantized else None, b.global_scale):
        if g is not None:
            acc.mul_(g)
    if bias is not None:
        acc.add_(bias.to(torch.float32))
    return out.copy_(acc)
