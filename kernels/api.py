"""Public entry point: `scaled_mm`, validation, backend choice by device capability."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

import helion

from blockscaled.formats import BlockFormat
from blockscaled.qtensor import QTensor

from . import configs
from .decode import (CLUSTER_MAX_CTAS, MMA_CLUSTER_SUM_PTX, MMA_M64_B_ROWS, MMA_STAGED_B_MAX_BYTES, MMA_STAGED_B_STORE_PTX,
                     STATIC_SHARED_BYTES, cluster_sum_bytes, m64_exchange_buffer, operand_codes, staged_b_bytes,
                     staged_b_chunks)
from .launch import DirectLaunch

# (a, b) format names -> pair name used in results and configs.
SUPPORTED_PAIRS = {
    ("nvfp4", "nvfp4"): "nvfp4xnvfp4",
    ("mxfp4", "mxfp4"): "mxfp4xmxfp4",
    ("mxfp8", "mxfp8"): "mxfp8xmxfp8",
    ("mxfp8", "mxfp4"): "mxfp8xmxfp4",
    ("bf16", "nvfp4"): "bf16xnvfp4",
    ("bf16", "mxfp4"): "bf16xmxfp4",
    ("bf16", "mxfp8"): "bf16xmxfp8",
}
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Pairs that take the dequantize path on every device. mixed: Helion 1.5.0's hl.dot_scaled
# compares the stored K of both operands, so fp8 x packed fp4 cannot be expressed
# ("Mismatched K dimensions for dot"). bf16 activations: hl.dot_scaled takes no None
# scale, and native block-scaled MMA needs both operands narrow anyway (tl.dot_scaled
# would upcast the weights to bf16 in software, which is what the dequantize path does).
DEQUANT_ONLY_PAIRS = ("mxfp8xmxfp4", "bf16xnvfp4", "bf16xmxfp4", "bf16xmxfp8")


def select_backend(device: torch.device) -> str:
    """"dequant" (sm_80/sm_90, CPU interpreter), "dot_scaled" (sm_100+), "dot_scaled_cdna4" (gfx950)."""
    if device.type != "cuda":
        return "dequant"
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        if "gfx950" in arch:
            return "dot_scaled_cdna4"
        raise NotImplementedError(f"a: AMD {arch} has no block-scaled path here; gfx950 (CDNA4) is supported")
    major, _ = torch.cuda.get_device_capability(device)
    return "dot_scaled" if major >= 10 else "dequant"


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability, looked up once: `scaled_mm` asks on every call."""
    return torch.cuda.get_device_capability(device)


def _fmt_name(x) -> str:
    return x.fmt.name if isinstance(x, QTensor) else "bf16"


def _check_args(a, b, out_dtype, bias) -> tuple[str, int, int, int]:
    if not isinstance(b, QTensor):
        raise TypeError(f"b: expected a QTensor (weights [N, K]), got {type(b).__name__}")
    if isinstance(a, torch.Tensor):
        if a.dtype != torch.bfloat16:
            raise TypeError(f"a: a plain-tensor activation must be torch.bfloat16, got {a.dtype}")
        if a.dim() != 2:
            raise ValueError(f"a: expected a 2-D [M, K] tensor, got shape {tuple(a.shape)}")
        if not a.is_contiguous():
            raise ValueError("a: expected a contiguous tensor (row-major [M, K])")
    elif not isinstance(a, QTensor):
        raise TypeError(f"a: expected a QTensor or a bf16 tensor [M, K], got {type(a).__name__}")
    key = (_fmt_name(a), b.fmt.name)
    if key not in SUPPORTED_PAIRS:
        pairs = ", ".join(f"{x} x {y}" for x, y in SUPPORTED_PAIRS)
        raise ValueError(f"a, b: the pair {key[0]} x {key[1]} is not supported; supported pairs: {pairs}")
    m, k = (a.shape[0], a.shape[1])
    n, kb = b.shape
    if k != kb:
        raise ValueError(f"b: K={kb} does not match a's K={k}")
    if a.device != b.device:
        raise ValueError(f"b: on {b.device}, a on {a.device}; expected one device")
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, QTensor) and not (t.data.is_contiguous() and t.scale.is_contiguous()):
            raise ValueError(f"{name}: data and scale must be contiguous")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {OUT_DTYPES}, got {out_dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,):
            raise ValueError(f"bias: expected a tensor of shape ({n},), got {getattr(bias, 'shape', type(bias).__name__)}")
        if bias.device != b.device:
            raise ValueError(f"bias: on {bias.device}, b on {b.device}; expected one device")
    return SUPPORTED_PAIRS[key], m, n, k


@functools.lru_cache(maxsize=None)
def _one(device: torch.device) -> torch.Tensor:
    return torch.ones(1, dtype=torch.float32, device=device)


class Operand(NamedTuple):
    """One operand as the kernels take it; fmt is None for a bf16 activation."""

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    fmt: BlockFormat | None
    layout: str


def _parts(x, device, words=False) -> Operand:
    """`words`: the data as int32 words (what gemv reads: 8 fp4, 4 fp8 or 2 bf16 elements each)."""
    if isinstance(x, QTensor):
        g = x.kernel_global_scale if x.global_scale is not None else _one(device)
        return Operand(x.kernel_words if words else x.data, x.kernel_scale, g, x.fmt, x.layout)
    return Operand(x.view(torch.int32) if words else x, x, _one(device), None, "rowmajor")


# The small-M block-dot kernel (block_dot_mm.py): weights in the "block_pairs" data layout
# take it at every M (the other kernels read k_order only); fp8 weights up to this M.
BLOCK_DOT_MAX_M = 64


def _block_dot_wins(pair: str, m: int, k: int, fb: BlockFormat) -> bool:
    """k_order weights: fp8 weights at 1 < M <= 64 and mxfp8 x mxfp8 at M = 1. Measured
    on an H100 (N = K = 8192, bench/results/h100_block_dot_probe.log), block_dot against
    dequant_mm as a fraction of cuBLAS bf16: M=16 mxfp8 1.12x vs 0.93x, bf16 x mxfp8
    1.16x vs 1.00x; M=64 0.62x vs 0.32x, 0.62x vs 0.35x; M=1 mxfp8 1.16x vs 1.10x but
    bf16 x mxfp8 0.99x vs 1.28x. fp4 weights in k_order would need an interleave here:
    pre-arrange them (`QTensor.with_data_layout("block_pairs")`) instead."""
    if fb.is_packed or k % (2 * fb.block_size) or m > BLOCK_DOT_MAX_M:
        return False
    return m > 1 or pair == "mxfp8xmxfp8"


def _block_dot_dtype(fa: BlockFormat | None, fb: BlockFormat, block_m: int, device: torch.device, fold: bool) -> int:
    """DOT code: fp8 dots when both operands are MX and A is narrow (every value then is
    E4M3 times a power of two) and the M tile stays below 32, bf16 dots otherwise; float32
    where the PTX decode cannot run (CPU interpreter, AMD).

    From BM = 32 Triton uses Hopper's fp8 wgmma (sm_90 SASS: QGMMA.64 at M = 17, a 32-row tile;
    HMMA.16816 at a 16-row one), whose accumulator keeps fewer bits: H100, fp32 output,
    max_rel_err 4.9e-5 at M = 64 (mxfp8 x mxfp8, K = 8192) and 4.6e-5 at M = 17 (N = 1088,
    K = 2048) against 1e-7 with the mma.sync fp8 dots at BM = 16
    (bench/results/h100_gpu_tests_block_dot_2026-11-22.log, h100_gpu_tests_mma_fp8_*_2026-11-23.log).
    `fold` (scales multiplied into the decoded operands) needs bf16: scaled values leave E4M3."""
    from .block_dot_mm import DOT_CODES

    if not _ptx_decodes(device):
        return DOT_CODES["float32"]
    both_mx = fa is not None and fa.scale_encoding == "e8m0" and fb.scale_encoding == "e8m0"
    return DOT_CODES["float8_e4m3fn" if both_mx and block_m < 32 and not fold else "bfloat16"]


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _split_k(tiles: int, steps: int, max_split: int, programs_per_sm: int, device: torch.device) -> int:
    """Split-K factor: the largest power of two <= max_split that divides the K steps and
    keeps the grid within `programs_per_sm` programs per SM. Measured on an H100 (N = K =
    8192, M = 1, mxfp8 x mxfp4, 128 output tiles): split 1 0.58x, 2 1.04x, 4 1.53x of cuBLAS
    bf16; 8 instead of 4 programs per SM (split 16 instead of 8) moved fp4 weights by -6% to
    +3% (bench/results/h100_block_dot_fold_probe_2026-11-22.log). Where that cap held the
    split low (M = 1, N = 10240: 80 tiles, split 4; N = 57344: 448 tiles, split 1; ncu showed
    0.65 waves and 22% achieved occupancy at 8192^2), 16 programs per SM and split up to 16
    gained 19-44% for the five fp4-weight pairs, and moved 8192^2 and 8192 x 28672 by -2% to
    +11% (bench/results/h100_block_dot_split16_probe_2026-11-22.log)."""
    split = 1
    while split * 2 <= max_split and steps % (split * 2) == 0 and tiles * split * 2 <= programs_per_sm * _sm_count(device):
        split *= 2
    return split


def _split_k8(fa: BlockFormat | None, fb: BlockFormat, m: int) -> bool:
    """Decode fp4 weights 8 codes per int32 word into 8 dots (K mod 8) instead of
    interleaving them back into K order.

    An unpacked A then needs 8 strided loads; with the 2-way version of this split
    (H200, N = K = 8192, bench/results/h200.csv, commits 3d31e97 vs 200319a) strided A
    loads lost from M=16 on (bf16 x mxfp4: 0.15x vs 0.27x of cuBLAS bf16) and won at M=1
    (0.61x vs 0.27x); with both operands fp4 the split won at every M.
    """
    packed_a = fa is not None and fa.is_packed
    return fb.is_packed and (packed_a or m == 1)


def scaled_mm(
    a: QTensor | torch.Tensor,
    b: QTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config=None,
    backend: str | None = None,
) -> torch.Tensor:
    """C[M, N] = global_a * global_b * dequant(a) @ dequant(b)^T (+ bias).

    a: QTensor [M, K] or a bf16 tensor (W4A16/W8A16); b: QTensor [N, K] (nn.Linear weights).
    Any M, N >= 1; K a multiple of the formats' block sizes (checked by QTensor).
    `out` (optional) receives the result; `config` overrides the default Helion config, or,
    for the block_dot and gemv backends, may be a dict of config-table fields laid over the
    default entry (`configs.ENTRY_FIELDS`: {"config": {...}, "fold": True, "spans": 4, ...}),
    for the mma backend a dict of plan keys, each described in `_mma_options` (which refuses any other);
    `backend` ("dequant", "block_dot", "gemv", "mma", "dot_scaled", "dot_scaled_cdna4") overrides
    the choice by device and shape.
    """
    pair, m, n, k = _check_args(a, b, out_dtype, bias)
    device = b.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    elif out.shape != (m, n) or out.dtype != out_dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous {out_dtype} tensor of shape ({m}, {n}) on {device}")
    if b.data_layout == "mma_m16k16":
        if backend in (None, "mma") and _mma_runs(pair, a, m, n, device):
            backend = "mma"
        elif backend == "mma":
            raise ValueError(f"backend: 'mma' runs {MMA_PAIRS} with N % 64 == 0 (M > {MMA_WARP_M}: N % 128 == 0) on "
                             f"NVIDIA sm_80+, k_order activations; got {pair}, M={m}, N={n} on {device}")
        else:  # the other pairs, N % 128 != 0 above M = 16, CPU: the other kernels read the k_order copy
            b = b.k_order_copy
    elif backend == "mma":
        raise ValueError(f"backend: 'mma' reads weights in the 'mma_m16k16' data layout; b is {b.data_layout!r}")
    if backend is None:
        backend = select_backend(device)
        if backend != "dequant" and pair in DEQUANT_ONLY_PAIRS:
            backend = "dequant"
        if b.data_layout == "block_pairs" or (backend == "dequant" and _block_dot_wins(pair, m, k, b.fmt)):
            backend = "block_dot"
        elif backend == "dequant" and m == 1 and b.fmt.is_packed:
            # H100, M = 1, the four Llama-3-70B shapes (bench/results/h100.csv, 2a26452): fp4
            # weights 2.02x-2.62x of cuBLAS bf16 against 1.03x-2.24x with block_dot on
            # block_pairs; fp8 weights (044822e) 1.28x-1.35x, below dequant_mm / block_dot at
            # N >= 10240
            backend = "gemv"
    elif backend not in ("block_dot", "mma") and b.data_layout != "k_order":
        raise ValueError(f"backend: {backend!r} reads k_order data; b is {b.data_layout!r} (use backend='block_dot')")
    if backend == "mma":
        options = mma_options_for(config, a, b, m, n)
        key = (backend, pair, m, n, k, _layout(a), out_dtype, None if bias is None else bias.dtype, device, options)
        plan = _LAUNCHES.get(key) or _mma_plan(a, b, bias is not None, m, n, k, options)
        return _mma_run(key, plan, a, b, bias, out)
    words = backend == "gemv"  # gemv reads every operand as int32 words
    a_parts, b_parts = _parts(a, device, words), _parts(b, device, words)
    bias_t = bias if bias is not None else out
    if isinstance(config, dict):
        if backend not in configs.ENTRY_FIELDS:
            raise ValueError(f"config: a dict of config-table fields applies to the block_dot and gemv backends, not {backend!r}")
        config = configs.freeze_entry(config, backend)
    key = (backend, pair, m, n, k, _layout(a), b.layout, b.data_layout, out_dtype, None if bias is None else bias.dtype, device, config)
    if backend == "block_dot":
        plan = _LAUNCHES.get(key) or _block_dot_plan(pair, a_parts, b_parts, b.data_layout, bias is not None, m, n, k, config)
        return _split_k_run(key, plan, _block_dot_kernel, a_parts, b_parts, bias, out)
    if backend == "gemv":
        plan = _LAUNCHES.get(key) or _gemv_plan(pair, a_parts, b_parts, bias is not None, m, n, k, config)
        return _split_k_run(key, plan, _gemv_kernel, a_parts, b_parts, bias, out)
    if backend == "dequant":
        from .dequant_mm import dequant_mm_kernel as kernel
        fa, fb = a_parts.fmt, b_parts.fmt
        u = max(f.block_size for f in (fa, fb) if f is not None)
        split = _split_k8(fa, fb, m)

        def data(op: Operand):  # the K-mod-8 split reads packed fp4 as int32 words of 8 codes
            return op.data.view(torch.int32) if split and op.fmt is not None and op.fmt.is_packed else op.data

        args = (
            data(a_parts), a_parts.scale, data(b_parts), b_parts.scale, a_parts.global_scale, b_parts.global_scale,
            bias_t, out, k, u, *operand_codes(fa, a_parts.layout), *operand_codes(fb, b_parts.layout),
            bias is not None, device.type == "cuda", split,
        )
    else:
        from .dot_scaled_mm import dot_scaled_args, dot_scaled_mm_kernel as kernel
        args = dot_scaled_args(a_parts, b_parts, bias_t, out, k, bias is not None)
    # Helion's bind() re-derives the specialization from every argument on each call
    # (~0.35 ms of host time per call, measured on an H200 against 0.08 ms of kernel at
    # M=1). Everything it specializes on is fixed by this key (shapes follow from pair,
    # m, n, k and the layouts; validation enforced contiguity and dtypes), so the
    # compiled launcher is looked up once and then called directly.
    launch = _LAUNCHES.get(key)
    if launch is None:
        cfg = config if config is not None else configs.default_config(backend, pair, m, n, k, configs.arch_key(device))
        if backend == "dequant":
            # each dot needs K >= 16: a K-mod-8 split gives each of its 8 dots g * U / 8 elements
            cfg = configs.with_min_k_groups(cfg, -(-16 // (u // 8 if split else u)))
        launch = _LAUNCHES[key] = _compile(kernel, args, cfg, device)
    launch(*args)
    return out


_LAUNCHES: dict[tuple, object] = {}


def _compile(kernel, args, cfg, device: torch.device, cluster: int = 1, pdl: bool = False):
    """The compiled launcher of one cache key; on CUDA it launches through `DirectLaunch`
    after its first call (Triton's per-call argument binding skipped; in clusters of `cluster` CTAs; with `pdl`
    as a programmatic dependent launch)."""
    launch = kernel.bind(args).compile_config(cfg)
    return functools.partial(launch, _launcher=DirectLaunch(cluster, pdl)) if device.type == "cuda" else launch


class Predecode(NamedTuple):
    """An mma plan's decode of its fp4 / fp8 activation (`dequantize.dequantize_kernel`) before the mma kernel."""

    launch: object  # the compiled launcher (None until the plan's first call)
    rows: torch.Tensor  # the decoded activation, bf16 [M, K / block, block], one buffer per plan (as the workspace)


class SplitKPlan(NamedTuple):
    """What one block_dot or gemv cache key launches; `launch` is None until first compiled."""

    launch: object
    cfg: object
    consts: tuple  # the kernel's constexpr arguments, in its signature order
    split: int  # split-K factor
    fold: bool  # block_dot: scales multiplied into the decoded operands
    m_pad: int  # rows the M loop runs over (>= M)
    workspace: tuple | None  # split > 1: zeroed float32 [m_pad, N] and int32 tickets, one per tile
    predecode: Predecode | None = None  # mma: the activation's decode to bf16 before the kernel


def _split_k_workspace(m_pad: int, n: int, block_m: int, block_n: int, split: int, device) -> tuple | None:
    """What `split_k` needs for SPLIT > 1: zeros that every call leaves zero.
    One per plan (pair, shape, layouts, device): two calls of one plan must not run at the
    same time on two streams."""
    if split == 1:
        return None
    tiles = (-(-m_pad // block_m), -(-n // block_n))
    return torch.zeros((m_pad, n), dtype=torch.float32, device=device), torch.zeros(tiles, dtype=torch.int32, device=device)


def _block_dot_kernel():
    from .block_dot_mm import block_dot_mm_kernel

    return block_dot_mm_kernel


def _gemv_kernel():
    from .gemv import gemv_kernel

    return gemv_kernel


def _split_k_run(key, plan: SplitKPlan, kernel, a: Operand, b: Operand, bias, out):
    """Launch a block_dot or gemv plan (split-K inside the kernel: `split_k`)."""
    ws, tickets = plan.workspace if plan.split > 1 else (out, out)
    args = (a.data, a.scale, b.data, b.scale, a.global_scale, b.global_scale, bias if bias is not None else out, out, ws,
            tickets, *plan.consts)
    if plan.launch is None:
        plan = _LAUNCHES[key] = plan._replace(launch=_compile(kernel(), args, plan.cfg, out.device))
    plan.launch(*args)
    return out


def _table_entry(backend, pair, m, k, device, config):
    """(entry, Helion config): the table entry with a frozen field dict laid over it."""
    entry = configs.table_entry(backend, pair, m, k, configs.arch_key(device))
    if isinstance(config, tuple):  # config-table fields laid over the entry
        entry, config = {**entry, **dict(configs.thaw_entry(config))}, None
    return entry, config if config is not None else configs.entry_config(entry)


def _ptx_decodes(device: torch.device) -> bool:
    """Whether kernels decode with inline PTX there (NVIDIA GPUs; not the CPU interpreter, not AMD)."""
    return device.type == "cuda" and torch.version.hip is None


def _has_pdl(device: torch.device) -> bool:
    """Whether the device runs programmatic dependent launch (`griddepcontrol`: sm_90 and later)."""
    return _ptx_decodes(device) and _capability(device) >= (9, 0)


def _has_wgmma(device: torch.device) -> bool:
    """Whether the device runs wgmma (sm_90, Hopper; Blackwell has tcgen05 instead)."""
    return _ptx_decodes(device) and _capability(device) == (9, 0)


def _gemv_plan(pair: str, a: Operand, b: Operand, has_bias, m, n, k, config) -> SplitKPlan:
    """The SplitKPlan of one gemv cache key, not yet compiled."""
    entry, cfg = _table_entry("gemv", pair, m, k, b.data.device, config)
    block = b.fmt.block_size
    blocks = max(s for s in (1, 2, 4, 8, 16, 32, 64) if s <= entry.get("blocks", 1) and (k // block) % s == 0)
    tiles = m * -(-n // cfg.config["block_sizes"][0])
    split = _split_k(tiles, k // (block * blocks), entry.get("max_split", 1), entry.get("programs_per_sm", 4), b.data.device)
    a_elem, a_scale, _, a_layout = operand_codes(a.fmt, a.layout)
    b_elem, b_scale, _, b_layout = operand_codes(b.fmt, b.layout)
    consts = (k, block, a_elem, a_scale, a_layout, b_elem, b_scale, b_layout, has_bias, _ptx_decodes(b.data.device), blocks, split,
              bool(entry.get("prefetch", False)))
    workspace = _split_k_workspace(m, n, 1, cfg.config["block_sizes"][0], split, b.data.device)
    return SplitKPlan(None, cfg, consts, split, False, m, workspace)


def _block_dot_plan(pair: str, a: Operand, b: Operand, data_layout, has_bias, m, n, k, config):
    """The SplitKPlan of one block_dot cache key, not yet compiled."""
    from .block_dot_mm import DOT_CODES

    block = b.fmt.block_size
    if k % (2 * block):
        raise ValueError(f"b: the block_dot backend needs K % {2 * block} == 0 (pairs of {b.fmt.name} blocks), got K={k}")
    entry, cfg = _table_entry("block_dot", pair, m, k, b.data.device, config)
    spans = max(s for s in (1, 2, 4, 8) if s <= entry.get("spans", 1) and (k // (2 * block)) % s == 0)
    bm, bn = cfg.config["block_sizes"][:2]
    tiles = -(-m // bm) * -(-n // bn)
    split = _split_k(tiles, k // (2 * block * spans), entry.get("max_split", 1), entry.get("programs_per_sm", 4), b.data.device)
    fold = bool(entry.get("fold", False))
    m_pad = max(m, bm) if entry.get("pad_m", False) else m
    # the M tile Triton gets: the config's, or the next power of two of the rows it covers
    dot = _block_dot_dtype(a.fmt, b.fmt, min(bm, 1 << (m_pad - 1).bit_length()), b.data.device, fold)
    narrow_fp4 = sum(f is not None and f.is_packed for f in (a.fmt, b.fmt))
    a_elem, a_scale, _, a_layout = operand_codes(a.fmt, a.layout)
    b_elem, b_scale, _, b_layout = operand_codes(b.fmt, b.layout)
    consts = (
        k, block, a_elem, a_scale, a_layout, b_elem, b_scale, b_layout, data_layout == "block_pairs", has_bias,
        dot, 6 * narrow_fp4 if dot == DOT_CODES["float8_e4m3fn"] else 0, spans, split, fold, m, m_pad,
    )
    return SplitKPlan(None, cfg, consts, split, fold, m_pad, _split_k_workspace(m_pad, n, bm, bn, split, b.data.device))


# The tensor-core decode kernel (mma_gemv.py): fp4 or fp8 weights in the "mma_m16k16" layout, bf16,
# fp4 or fp8 activations (k_order data, any scale layout). Up to MMA_WARP_M (two column groups
# of 8) `mma_gemv_kernel`, whose warps each take their own B; above it `mma_m64_kernel`: 8 warps of
# 16 rows each, one B window of 64 activation rows exchanged through shared memory (a program per 64
# rows of the activation, so any M: H100, N = K = 8192, x cuBLAS bf16, M = 128 / 256 / 1024 / 4096
# 0.68-0.82x / 0.45-0.58x / 0.43-0.54x / 0.46-0.53x against 0.10-0.20x / 0.10-0.22x / 0.16-0.39x /
# 0.16-0.37x for the other kernels on the k_order copy, bench/results/h100_mma_m64_tiles_5aee332_2026-11-24.log).
MMA_PAIRS = ("bf16xmxfp4", "bf16xnvfp4", "mxfp4xmxfp4", "nvfp4xnvfp4", "mxfp8xmxfp4", "bf16xmxfp8", "mxfp8xmxfp8")
MMA_WARP_M = 16
MMA_M64_PROGRAM_ROWS = 128  # weight rows per program of mma_m64_kernel (8 warps x 16)
# Split-K cap by (column groups, row groups per warp). H100, bf16 x fp4, the four Llama-3-70B
# shapes, one row group, caps 8 / 16 / 32 / 64 (bench/results/h100_mma_split_probe_a299590_2026-11-22.log):
# M = 1: 32 fastest at three shapes (e.g. 57344 x 8192 96 / 100 / 96 / 100 us), 16 at 8192^2
# (21 / 17 / 18 / 18 us); M = 16 with one row group: 8 fastest at all four (8192^2 28 / 37 / 35 /
# 40 us). M = 16 with two row groups: 16 under the wave rule (below).
MMA_MAX_SPLIT = {(1, 1): 32, (1, 2): 64, (2, 1): 8, (2, 2): 16}
# Resident programs per SM (4 warps each) by (narrow activation, column groups, row groups) of
# the kernels whose split follows the wave rule: the smallest split whose last wave is >= 90%
# full, else the fullest. From the sm_90 registers (`python -m bench.sass --backend mma`,
# N = K = 8192; tests/test_bench.py checks them): one row group at M <= 8 30-32 registers
# (16 programs), 38 for nvfp4 x nvfp4 (12; one group only where N % 128 != 0); two at M = 16
# 55-64 (8).
# - M <= 8, one group (bench/results/h100_mma_split_probe_a299590_2026-11-22.log): the slow
#   cells had a short last wave (10240 x 8192 at split 16: 2560 programs = 1.21 waves, 2.57x
#   against 2.98x at 32).
# - M = 16, two groups (h100_mma_m16_variants_8458078_2026-11-23.log), split 8 / 16 x cuBLAS
#   bf16: 10240 x 8192 (80 row programs: 1280 at split 16 = 1.21 waves) mxfp8 x mxfp4 2.23 /
#   1.64x, bf16 x mxfp4 2.19 / 1.90x; 8192 x 28672 (64 row programs, 1024 = 0.97 waves)
#   mxfp4 x mxfp4 1.90 / 2.25x, bf16 x mxfp4 2.22 / 2.90x; 57344 x 8192 within 2%.
MMA_PROGRAMS_PER_SM = {(False, 1, 1): 16, (True, 1, 1): 12, (False, 2, 2): 8, (True, 2, 2): 8}
# Row groups per warp by (narrow activation, column groups): two groups share one B decode,
# and at M = 16 one activation load for 32 rows.
# H100, M = 1, the four Llama-3-70B shapes (10240 / 57344 / 8192^2 x 28672 / 8192^2), one group
# with the wave rule against two with split up to 64, x cuBLAS bf16:
# - nvfp4 x nvfp4 (bench/results/h100_mma_row_groups_probe_11d9604_2026-11-22.log): 2.46 /
#   2.81 / 2.52 / 2.14x against 2.79 / 3.18 / 2.56 / 2.42x.
# - bf16 x nvfp4 (h100_mma_row_groups_probe_1430831_2026-11-22.log): 2.72 / 3.06 / 3.20 /
#   2.74x against 2.62 / 3.23 / 3.02 / 2.45x (its B is 4 loads, no decode, to share).
# M = 16, split up to 8, one group against two (h100_mma_m16_variants_8458078_2026-11-23.log,
# after the loads-first K loop): nvfp4 x nvfp4 1.79 / 2.01 / 1.62 / 1.58x against 2.22 / 2.57 /
# 2.12 / 1.62x, bf16 x nvfp4 2.03 / 2.10 / 2.15 / 1.84x against 2.15 / 2.45 / 2.17 / 1.79x.
MMA_ROW_GROUPS = {(False, 1): 1, (True, 1): 2, (False, 2): 2, (True, 2): 2}
# B shared through shared memory by (narrow activation, column groups): one load and decode
# of a window's B per program instead of one per warp. sm_90 K loop (N = K = 8192,
# `python -m bench.sass --backend mma`): M = 16 fp4 / fp8 activations 326-355 -> 247-255
# instructions per window, bf16 191 -> 202 with 12 global loads instead of 18; M = 1 fp4 /
# fp8 259 -> 248, bf16 103 -> 115. H100, x cuBLAS bf16, 10240 x 8192 / 57344 x 8192 /
# 8192 x 28672 / 8192^2 (bench/results/h100_mma_shared_b_8bb731a_2026-11-23.log):
# - M = 16, without -> with: nvfp4 x nvfp4 2.27 / 2.56 / 2.32 / 2.07x -> 2.53 / 2.76 / 2.84 /
#   2.14x, mxfp4 x mxfp4 1.81 / 2.23 / 2.24 / 2.17x -> 2.46 / 2.83 / 3.02 / 2.17x, bf16 x mxfp4
#   2.25 / 2.53 / 2.87 / 1.95x -> 2.60 / 2.84 / 3.12 / 2.15x (faster or equal in all 20 cells).
# - M = 1, fp4 / fp8 activations: within -1% .. +3% in 11 of 12 cells, mxfp4 x mxfp4
#   8192 x 28672 2.86 -> 3.41x. bf16 at M = 1 (more instructions, no decode to share): not timed.
MMA_SHARED_B = {(False, 1): False, (True, 1): True, (False, 2): True, (True, 2): True}
# mma_m64_kernel (M > MMA_WARP_M): split-K cap and resident programs per SM (8 warps each, 80-112
# registers) by narrow activation, for the wave rule. H100, M = 64, x cuBLAS bf16, the wave rule
# with caps 16 / 8 (bench/results/h100_mma_m64_split_77707b8_2026-11-23.log): 10240 x 8192 (80
# row programs: split 16, 1280 programs, against 8, 640) 0.87-0.92x / 0.99-1.15x; where the rule
# takes 4 (8192^2, 57344 x 8192, 8192 x 28672) 4 beat 8 and 16 in 12 of 16 cells.
# Resident programs by (wgmma, fp4 / fp8 activations on fp4 weights): wgmma programs take 78-80
# registers (3 per SM), mma.sync ones 83-88 (2). Counting 3 changes one shape of the four, 10240 x
# 8192 (80 row programs: split 4, 320 programs, 0.81 of a wave, instead of 8). H100, M = 64, x cuBLAS
# bf16, split 8 / 4 there (bench/results/h100_mma_m64_split4_10240_7729809_2026-11-24.log): bf16 x
# mxfp4 1.20 / 1.33x, bf16 x nvfp4 1.21 / 1.30x, bf16 x mxfp8 1.02 / 1.23x, mxfp8 x mxfp8 1.02 /
# 1.13x; but nvfp4 x nvfp4 1.33 / 1.19x, mxfp4 x mxfp4 1.37 / 1.29x, mxfp8 x mxfp4 1.35 / 1.26x
# (204 instructions per window against 117-195: a third program on 56 of the SMs
# lengthens the slowest). So those three keep counting 2.
MMA_M64_MAX_SPLIT = 8
MMA_M64_PROGRAMS_PER_SM = {(True, False): 3, (True, True): 2, (False, False): 2, (False, True): 2}
# With 128 activation rows per program every pair takes 127 sm_90 registers (M = 128, N = K = 8192): 2 programs per
# SM. Counting 3 for bf16 activations and fp8 weights had split 10240 x 8192 at M = 128 by 4 (320 programs) instead of
# 8. H100, x cuBLAS bf16, split 4 / 8 (bench/results/h100_mma_m128_split_n10240_k8192_45df7b8_2026-11-24.log): bf16 x
# mxfp4 0.62 / 0.71x, bf16 x nvfp4 0.62 / 0.71x, mxfp8 x mxfp8 0.69 / 0.75x, bf16 x mxfp8 0.71 / 0.68x.
MMA_M64_TILE_128_PROGRAMS_PER_SM = 2
# Above M = MMA_TILE_128_MAX_M (programs of 64 activation rows over M) no split-K once the programs fill
# MMA_M64_UNSPLIT_WAVES of a wave: the split's fp32 workspace adds grow with M (M x N x split x 4 bytes), and the wave
# rule had split 8192^2 at M = 256 / 1024 by 4 and 10240 x 8192 at M = 192 by 8. H100, x cuBLAS bf16, the rule /
# split 1 (bench/results/h100_mma_m256_split*_b588c23_2026-11-24.log, h100_mma_m192_m1024_split1_*_b588c23_...):
# M = 256, 8192^2: bf16 x nvfp4 0.50 / 0.61x, bf16 x mxfp4 0.52 / 0.62x, mxfp8 x mxfp8 0.46 / 0.54x; 8192 x 28672: bf16
# x mxfp4 0.56 / 0.63x, mxfp8 x mxfp8 0.48 / 0.48x; M = 192, 10240 x 8192 (240 programs, 0.61 of a wave): bf16 x
# mxfp4 0.65 / 0.84x, mxfp8 x mxfp8 0.60 / 0.72x; M = 1024: 0.47 / 0.55x and 0.43 / 0.46x (8192^2), 0.50 / 0.53x and
# 0.42 / 0.45x (10240 x 8192). Below half a wave the split still wins: M = 192, 8192^2 (192 programs, 0.48 of a
# wave; split 2) 0.71 / 0.61x and 0.64 / 0.56x.
MMA_M64_UNSPLIT_WAVES = 0.5
# mma_m64_kernel's split-K sums in the workspace (where they do not sum in clusters: 8192^2 and 8192 x 28672 at M = 64,
# and every first call) in fragment order, one `red.global.add.v4.f32` per thread and column group instead of four
# scalar adds at the outputs' positions (`mma_gemv.add_fragments`). H100, the epilogue alone on the M = 64 grid of
# N = 8192, split 4 (256 programs of 256 threads, 8.4 MB of sums; bench/results/h100_split_sums_7a33b07_2026-11-27.log):
# the adds 5.80 -> 4.00 us, with the ticket and the last part's read-back 13.21 -> 8.20 us (launch alone 1.13). The
# kernel at M = 64, x cuBLAS bf16, scalar / fragment order, A / B / A / B in one process per shape, every cell checked
# in fp32 (bench/results/h100_mma_m64_fragment_sums_ab_n8192_k{8192,28672}_e79d0d2_2026-11-27.log): 8192^2 faster for
# all 7 pairs by 2.3-3.5 us (nvfp4 x nvfp4 1.41 -> 1.50-1.54x, bf16 x mxfp4 1.45 -> 1.57x, bf16 x mxfp8 1.17 -> 1.28x);
# 8192 x 28672 by 3.1-5.3 us (nvfp4 x nvfp4 1.76 -> 1.85x, bf16 x mxfp4 1.90 -> 1.96x, mxfp8 x mxfp8 1.40 -> 1.46x).
MMA_M64_FRAGMENT_SUMS = True
# mma_m64_kernel loads a thread's 32 bytes of bf16 activation per window with two 16-byte loads (WIDE_B, config
# "wide_b"; `mma_gemv.wide_words`) where the activation's data is 16-byte aligned, instead of four of 8: half the
# load instructions and L1 tag lookups of a stream that ncu had at 82% of L1's throughput (bf16 x mxfp4, M = 64,
# 8192^2: bench/results/h100_ncu_mma_m64_bf16xmxfp4_47a1124_2026-11-27.txt); fp8 activations' 16 bytes in one instead
# of two. H100, M = 64, without / with twice in one process, every cell checked in fp32
# (bench/results/h100_mma_m64_wide_b_ab_n8192_k{8192,28672}_84f8d4c_..., ..._wide_b_fp8act_ab_..._ff1901d_...), us:
# 8192^2 bf16 x nvfp4 29.9 -> 28.3, bf16 x mxfp4 29.2 -> 28.0, bf16 x mxfp8 37.4 -> 37.2, mxfp8 x mxfp4 33.5 / 33.3 ->
# 32.4 / 32.3, mxfp8 x mxfp8 36.3 -> 36.4; 8192 x 28672 bf16 x nvfp4 84.8 / 86.9 -> 78.4 / 79.2, bf16 x mxfp4 83.0 /
# 83.3 -> 76.4 / 76.5, bf16 x mxfp8 100.2 -> 100.1, mxfp8 x mxfp4 95.1 / 94.5 -> 94.2 / 93.9, mxfp8 x mxfp8 104.7 /
# 104.5 -> 103.9 / 104.0.
MMA_M64_WIDE_B = True
# mma_m64_kernel's wave rule may take a split-K factor that does not divide the K windows (`_mma_split`'s `uneven`):
# where the power of two leaves one wave of programs under 90% full, the largest factor that still fits one wave.
# At M = 64, 8192^2 and 8192 x 28672 (64 row programs) that is 6 instead of 4 (384 programs for 396 places) for the
# pairs counted 3 per SM (bf16 activations, mxfp8 x mxfp8); split 5 (320) was slower than 4 for all 7 pairs. H100,
# x cuBLAS bf16, split 4 / 6 / 4 / 6 in one process per shape, every cell checked in fp32
# (bench/results/h100_mma_m64_uneven_split_n8192_k{8192,28672}_e7a1b85_2026-11-27.log), us: 8192^2 bf16 x nvfp4
# 31.8 / 30.0 / 31.7 / 30.0, bf16 x mxfp4 30.8 / 29.2 / 30.7 / 29.2, bf16 x mxfp8 38.3 / 37.1 / 38.3 / 37.1, mxfp8 x
# mxfp8 38.4 / 36.3 / 38.2 / 36.3; 8192 x 28672 90.0 / 84.0 / 89.6 / 84.1, 87.5 / 83.3 / 87.6 / 82.6, 106.6 / 99.2 /
# 106.9 / 98.9, 118.2 / 103.8 / 118.4 / 105.2. The pairs counted 2 keep 4 (256 programs fill 0.97 of 264): with 6,
# nvfp4 x nvfp4 was as fast at 8192^2 and 3% slower at 8192 x 28672, mxfp4 x mxfp4 5% faster and 6% slower. The
# rule also takes 5 instead of 4 at 6144 x 4096 (48 row programs) for those pairs at M = 17 .. 64 and every pair at
# M = 65 .. 128: faster in every cell timed (h100_mma_m{64,128}_uneven_split*_n6144_k4096_{db9f1d9,361f87a}_*.log;
# M = 64 nvfp4 x nvfp4 17.1 / 18.3 us, M = 128 bf16 x mxfp8 29.4 / 31.7 us).
MMA_M64_UNEVEN_SPLIT = True
# Windows whose words are loaded ahead of the one multiplied (AHEAD): mma_m64_kernel 1 .. 3,
# mma_gemv_kernel 0 or, with shared B (its barrier keeps the loads in place), 1.
MMA_M64_AHEAD = 1
MMA_AHEAD = 0
# fp8 weights at 8 < M <= 16 (a window is twice the bytes of fp4's): split up to 8, no wave rule.
# H100, M = 16, x cuBLAS bf16, default (wave rule, cap 16) / cap 8 / cap 4
# (bench/results/h100_mma_fp8_m16_split_2026-11-23.log): 8192^2 mxfp8 x mxfp8 1.43 / 1.53 / 1.28x,
# bf16 x mxfp8 1.43 / 1.56 / 1.35x; 57344 x 8192 1.66 / 1.74 / 1.83x, 1.66 / 1.80 / 1.82x.
MMA_FP8_M16_MAX_SPLIT = 8
# Split-K factors that do not divide the K / 64 windows (config "split": parts of W / split or W / split + 1 windows)
# are not taken by the wave rule: the fuller last wave did not pay. H100, M = 16, 10240 x 8192 (80 row programs, 8
# resident per SM: split 8 fills 0.61 of a wave, 12 0.91, 13 0.98), x cuBLAS bf16, split 8 / 13 / 12 / 8 in one process
# (bench/results/h100_mma_uneven_split_ab_n10240_k8192_8d98a82_2026-11-25.log): bf16 x mxfp4 2.59 / 2.62 / 2.64 /
# 2.61x, bf16 x nvfp4 2.53 / 2.53 / 2.55 / 2.54x, nvfp4 x nvfp4 2.52 / 2.57 / 2.55 / 2.52x, mxfp4 x mxfp4 2.50 / 2.28 /
# 2.23 / 2.53x, mxfp8 x mxfp4 2.45 / 2.24 / 2.19 / 2.46x, mxfp8 x mxfp8 1.78 / 1.57 / 1.54 / 1.78x, bf16 x mxfp8 1.80 /
# 1.57 / 1.54 / 1.80x. What that shape pays instead is the split-K epilogue's ticket and read-back: without them
# (timing-only probe, the relaxed adds kept) 2-3 us of 25-37 us (h100_mma_m16_epilogue_ablation_n10240_k8192_8d98a82_
# 2026-11-25.log: bf16 x mxfp4 25.3 -> 22.3 us, nvfp4 x nvfp4 26.0 -> 24.1, mxfp8 x mxfp8 36.9 -> 33.7; the adds alone
# cost nothing: 22.6 / 23.9 / 33.5 us with plain stores instead).
# fp8 weights at 8 < M <= 16 on split-K load one window ahead (AHEAD 1) from K = MMA_FP8_M16_AHEAD_K. H100, M = 16,
# x cuBLAS bf16, ahead 0 / 1 in one process, two processes each: 8192 x 28672 (split 8, 56 windows per program;
# h100_mma_near_miss_m16_28672{,_fp8_again}_902c692_2026-11-24.log) mxfp8 x mxfp8 1.73 / 1.81x and 1.78 / 1.86x,
# bf16 x mxfp8 1.82 / 1.86x and 1.81 / 1.85x; 10240 x 8192 (16 windows per program,
# h100_mma_near_miss_m16_10240_fp8_902c692_2026-11-24.log) 1.78 / 1.73x and 1.79 / 1.72x: the word loaded ahead pays
# where programs run long K loops. K between 8192 and 28672 was not timed; 16384 is a boundary between the two.
MMA_FP8_M16_AHEAD_K = 16384
# K split over the warps of a program (K_WARPS, `mma_gemv_kernel`) for bf16 activations at M = 1:
# one launch with no global atomics or tickets. The split-K epilogue (relaxed adds, a CTA barrier,
# the acq_rel ticket, the last program's reads) cost 0.7-3.6 us of 15-19 us at 8192^2
# (bench/results/h100_probe_fixed_cost_83d66b2_2026-11-23.log: the same kernel without it).
# H100, M = 1, one row group, x cuBLAS bf16, split-K default / k_warps 8 / 16, 10240 x 8192 /
# 57344 x 8192 / 8192 x 28672 / 8192^2 (h100_mma_k_warps_m1{,b}_2026-11-23.log; the split-K column
# ran a loop 526ff11 had slowed, bench/DECODE_NOTES.md: at 3ff6825 bf16 x mxfp4 read 2.98 / 3.24 /
# 3.40 / 2.90x):
# - bf16 x mxfp4 2.85 / 3.35 / 2.93, 3.24 / 3.63 / 3.64, 3.25 / 3.24 / 3.49, 2.73 / 2.86 / 3.04x
# - bf16 x nvfp4 2.72 / 3.18 / 2.78, 3.18 / 3.53 / 3.59, 3.09 / 3.03 / 3.28, 2.61 / 2.74 / 2.94x
# - bf16 x mxfp8 1.85 / 1.87 / 1.83, 2.00 / 2.06 / 2.09, 1.95 / 1.73 / 1.98, 1.78 / 1.67 / 1.84x
# 16 warps lose where their programs (4 per SM at <= 32 registers) make 1.2 waves (10240 x 8192),
# 8 warps where theirs fill half of one (8192 x 28672). So: the first of MMA_K_WARPS whose
# programs fill 0.5 to 1 wave or make >= 3 waves, else split-K (`_mma_k_warps`). Not taken:
# fp4 / fp8 activations with B decoded by each warp every window (nvfp4 x nvfp4 at 2.48-3.18x
# default against 2.14-3.10x; staged once per warp they take it: `_mma_stage_b`) and M = 16 (B read
# once per warp: 0.88-3.04x against 2.12-3.11x, h100_mma_k_warps_m16_2026-11-23.log).
MMA_K_WARPS = (16, 8)
# Up to K = 4096 (64 windows) 16 warps from 0.45 of a wave: at 4096^2 (256 programs, 0.48 of a wave) they
# beat split-K (H100, M = 1, split-K / 16 warps, bench/results/h100_mma_staged_wrap_m1_llama8b_be87657_2026-11-27.log):
# bf16 x nvfp4 6.3 / 4.5 us, bf16 x mxfp4 5.8 / 4.5, bf16 x mxfp8 9.4 / 8.4; staged (`_mma_stage_b`) nvfp4 x nvfp4
# 6.1-6.7 / 5.5, mxfp8 x mxfp8 10.4-10.6 / 8.1. At 4096 x 14336 (0.48 too) they do not: bf16 x nvfp4 15.2 /
# 15.3, bf16 x mxfp4 14.7 / 14.7, bf16 x mxfp8 23.6 / 24.6; staged nvfp4 x nvfp4 15.1 / 16.1, mxfp8 x mxfp4
# 14.7 / 15.6, mxfp8 x mxfp8 23.6 / 23.4.
MMA_K_WARPS_SHORT_WINDOWS = 64
MMA_K_WARPS_SHORT_MIN_WAVES = 0.45
# K slices with shared B at 8 < M <= 16 (K_WARPS slices of 4 warps, `_mma_k_slices`) for bf16
# activations and fp8 weights: no split-K epilogue, whose atomics grow with the split (16 at
# 57344 x 8192). H100, M = 16, x cuBLAS bf16, split-K default / 8 slices of one row group / 4
# of two, 10240 x 8192 / 57344 x 8192 / 8192 x 28672 / 8192^2
# (bench/results/h100_mma_k_slices_m16_8a4604e_2026-11-23.log):
# - bf16 x mxfp4 2.60 / 1.91 / 1.87, 2.93 / 2.80 / 3.22, 3.07 / 2.94 / 1.60, 2.07 / 2.52 / 1.49x
# - mxfp8 x mxfp8 1.77 / 1.39 / 1.56, 1.79 / 1.86 / 2.02, 1.77 / 1.78 / 1.34, 1.52 / 1.67 / 1.26x
# - nvfp4 x nvfp4 2.51 / 1.59 / 1.66, 2.86 / 2.36 / 2.79, 2.82 / 2.48 / 1.36, 2.06 / 2.11 / 1.24x
# So: 4 slices of two row groups where their programs (64 registers x 512 threads: 2 per SM) make
# >= 1 wave, 8 of one where theirs (1024 threads) fill 0.9-1 wave, and only at K <= 8192: at
# 8192 x 28672 the split-K epilogue is a small share of the K loop and 8 slices lost 4% for
# bf16 x mxfp4. Not taken then: fp4 activations with fp4 weights (nvfp4 x nvfp4 within -2% .. +3% where
# the rule would take slices; with one window ahead they take 8 slices, below), M = 1 (h100_mma_k_slices_m1_8a4604e_2026-11-23.log: fp4 / fp8
# activations 0.92x-3.36x against the split-K default's 1.76x-3.45x, within 2% at best).
# 8 slices of one row group load one window ahead (AHEAD 1) for fp4 weights: H100, M = 16, 8192^2, x
# cuBLAS bf16, ahead 0 / 1 (h100_mma_m16_slices_ahead_7729809_2026-11-24.log): bf16 x mxfp4 2.53 / 2.66x,
# bf16 x nvfp4 2.46 / 2.56x; fp8 weights lose (bf16 x mxfp8 1.73 / 1.67x, mxfp8 x mxfp8 1.68 / 1.64x:
# twice the words carried). fp4 / fp8 activations on fp4 weights take 8 slices too, with ahead: split-K /
# 8 slices / with ahead (h100_mma_m16_narrow_slices_9adf1af_2026-11-24.log) nvfp4 x nvfp4 2.14 / 2.11 /
# 2.21x, mxfp4 x mxfp4 2.10 / 2.16 / 2.27x, mxfp8 x mxfp4 2.13 / 2.15 / 2.28x. They lost with 4 slices of two
# then (nvfp4 x nvfp4 at 57344 x 8192 2.86 -> 2.79x, 8389b77) and gain with them since the 9b4b358 loop: H100,
# M = 16, 57344 x 8192, x cuBLAS bf16, split-K / 4 slices of two, two processes
# (h100_mma_near_miss_m16_57344{,_again}_902c692_2026-11-24.log): nvfp4 x nvfp4 2.85 / 3.06x and 2.84 / 3.04x,
# mxfp4 x mxfp4 3.02 / 3.04x and 3.00 / 3.01x, mxfp8 x mxfp4 3.00 / 3.01x and 2.96 / 3.00x (59-63 sm_90
# registers: 2 programs per SM); with ahead 1 2.77-2.89x, with unroll 2 3.03 / 3.09 / 2.64x. So every pair takes
# them where the rule does (8 < M <= 16). 1 < M <= 8 takes 8 slices as well (h100_mma_m4_m8_slices_
# 9adf1af_2026-11-24.log, 8192^2, split-K / 8 slices / with ahead): M = 8 nvfp4 x nvfp4 1.86 / 2.22 /
# 2.42x, mxfp8 x mxfp4 1.86 / 2.47 / 2.57x, bf16 x mxfp4 2.56 / 2.75 / 2.84x, mxfp8 x mxfp8 1.34 / 1.74 /
# 1.67x, bf16 x mxfp8 1.62 / 1.77 / 1.71x; M = 4 nvfp4 x nvfp4 2.24 / 2.23 / 2.45x, bf16 x mxfp4 2.68 / 2.75
# / 2.85x, mxfp8 x mxfp8 1.53 / 1.76 / 1.70x. 4 slices of two were not timed there.
# 8 slices of one row group also run two windows per K-loop iteration for fp4 weights ("unroll": 2, LLVM
# unrolls the loop): the window's address arithmetic and loop control are shared by two windows (sm_90, 8192^2,
# M = 16: bf16 x mxfp4 125 -> 106 instructions per window at 60 registers, nvfp4 x nvfp4 178 -> 167 at 64).
# H100, 8192^2, x cuBLAS bf16, unroll 1 / 2 (h100_mma_unroll_m8_m16_m64_debc389_2026-11-24.log): M = 16
# nvfp4 x nvfp4 2.22 / 2.31x, mxfp4 x mxfp4 2.30 / 2.46x, mxfp8 x mxfp4 2.28 / 2.44x, bf16 x nvfp4 2.54 /
# 2.70x, bf16 x mxfp4 2.65 / 2.84x; M = 8 +4-7% for the same five. fp8 weights: M = 16 -2% (mxfp8 x mxfp8
# 1.69 / 1.66x), M = 8 +1-2%. Split-K at M = 16 (two row groups) and M = 1 compile to as many instructions
# per window unrolled; M = 64 gained 0-4% at 10240 x 8192 and 57344 x 8192 and mxfp8 x mxfp8 lost 22% at
# 10240 x 8192 (84 registers): `MMA_UNROLL` 1 elsewhere.
# (slices, row groups, resident, waves low, high, ahead for fp4 weights, unroll for fp4 weights)
MMA_K_SLICES = ((4, 2, 2, 1.0, float("inf"), 0, 1), (8, 1, 1, 0.9, 1.0, 1, 2))
# bf16 activations on fp8 weights at 8 < M <= 16, where 8 K slices of one row group would run (8192^2): 4 slices of one
# row group instead (512-thread programs, one per SM), one window ahead and two per K-loop iteration. H100, M = 16,
# 8192^2, bf16 x mxfp8, 8 slices (the default) / 4 slices, twice in one process
# (bench/results/h100_mma_m16_ahead_fp8_n8192_k8192_2a1a0d7_2026-11-26.log): 27.6 / 26.4 us and 27.5 / 26.4 us
# (1.74x -> 1.81-1.82x of cuBLAS bf16; 28.0 -> 26.8 us in h100_mma_m16_ahead_slices_n8192_k8192_897d47b_2026-11-26.log);
# as the default, old / new / old / new in one process each (h100_mma_m16_bf16_fp8_slices_ab_n8192_k8192_d037a47_
# 2026-11-26.log) 27.8 / 26.8 / 27.7 / 26.8 us, 1.73x -> 1.78-1.79x; with ahead 0 or one window per iteration
# 28.6-32.6 us. mxfp8 x mxfp8 takes 27.3-27.5 us either way (keeps 8 slices); fp4 weights lose 1-3 us with 4 slices.
# (slices, ahead, unroll)
MMA_BF16_FP8_M16_SLICES = (4, 1, 2)
MMA_K_SLICES_MAX_WINDOWS = 128
# Windows per K-loop iteration (Helion's range_unroll_factors on the K loop) outside `MMA_K_SLICES`.
MMA_UNROLL = 1
# mma_m64_kernel (16 < M <= 64) runs two windows per iteration for fp4 weights from K = MMA_M64_UNROLL_K. H100,
# M = 64, x cuBLAS bf16, unroll 1 / 2 in one process: at 8192 x 28672 (h100_mma_unroll_m64_95237af_2026-11-24.log)
# bf16 x nvfp4 1.51 / 1.89x, bf16 x mxfp4 1.52 / 1.92x, mxfp8 x mxfp4 1.66 / 1.76x, mxfp4 x mxfp4 1.75 / 1.79x,
# nvfp4 x nvfp4 1.68 / 1.68x; at 8192^2, 10240 x 8192 (h100_mma_unroll_m64_8192_10240_c7804d5_2026-11-24.log)
# and 57344 x 8192 every fp4-weight cell within -4% .. +3%. fp8 weights lose (mxfp8 x mxfp8 at 10240 x 8192
# 1.14 / 0.90x, 84 registers) or stay within 2%: one window. K between 8192 and 28672 was not timed.
MMA_M64_UNROLL_K = 16384
# Activation rows per mma_m64_kernel program above M = 64 ("tile_m"): 128 (the weights decoded once for two
# wgmma) up to M = MMA_TILE_128_MAX_M, else 64. H100, N = K = 8192, x cuBLAS bf16, 64 / 128
# (bench/results/h100_mma_m64_tile_m_*_08fdd0c_2026-11-24.log): M = 128 faster for all 7 pairs (nvfp4 x nvfp4
# 0.80 / 0.88x, bf16 x mxfp8 0.68 / 0.87x: +6% .. +29%); M = 256 slower for the 4 pairs timed (nvfp4 x
# nvfp4 0.57 / 0.45x: 194 registers, one program per SM where the wave rule counts 2), M = 4096 -12% .. +16%.
MMA_TILE_128_MAX_M = 128
# Static shared memory for mma_m64_kernel's cluster sums and B windows: 48 KB less room for Triton's own (1 KB at
# M = 64, sm_90).
MMA_CLUSTER_SHARED_BYTES = STATIC_SHARED_BYTES - 4096
# mma_m64_kernel sums its split-K parts in thread-block clusters only above this many programs per SM: the hardware
# places a cluster's CTAs within one GPC, and grids that the CTA scheduler spreads at two per SM lost in clusters.
# H100, M = 64, x cuBLAS bf16, cluster / workspace atomics in one process, every cell checked in fp32:
# - 256 programs (split 4; bench/results/h100_mma_m64_cluster_occupancy_df421c0u_2026-11-24.log, the workspace
#   path then with the K parts first in the grid): 8192^2 nvfp4 x nvfp4 1.24 / 1.33x, bf16 x mxfp4 1.34 / 1.39x;
#   8192 x 28672 1.38 / 1.82x, 1.15 / 1.91x. The atomics kernel launched in clusters of 4 took 47.4 us against 36.8
#   (h100_mma_m64_cluster_launch_n8192_k8192_df421c0_2026-11-24.log), and capping residency at two per SM (dynamic
#   shared memory) made the clusters slower still (0.99x / 1.03x at 8192^2).
# - 320 and 640 programs (10240 x 8192, split 4 for bf16 activations and fp8 weights, 8 for fp4 / fp8 activations on
#   fp4 weights; h100_mma_m64_cluster_n10240_k8192_b085d76_2026-11-25.log): faster in all 7 pairs, bf16 x mxfp4 1.34 ->
#   1.65x, mxfp8 x mxfp8 1.12 -> 1.36x, nvfp4 x nvfp4 1.32 -> 1.37x.
# - 1792 programs (57344 x 8192, split 4; h100_mma_m64_cluster_n57344_k8192_93dd6fb_2026-11-25.log): faster in all 7,
#   nvfp4 x nvfp4 1.56 -> 1.80x, bf16 x mxfp8 1.32 -> 1.57x.
MMA_CLUSTER_PROGRAMS_PER_SM = 2
# mma_gemv_kernel (M <= 16) sums its split-K parts in thread-block clusters too (same rule, `_mma_gemv_cluster`): the
# workspace epilogue's ticket and read-back cost 2-3 us of 25-37 us at M = 16, 10240 x 8192 on the H100 (split 8;
# bench/results/h100_mma_m16_epilogue_ablation_n10240_k8192_8d98a82_2026-11-25.log). H100, M = 16, x cuBLAS bf16,
# workspace / cluster / workspace / cluster in one process, every cell checked in fp32
# (bench/results/h100_mma_m16_cluster_ab_133595e_2026-11-25.log): 10240 x 8192 (split 8, 640 programs) bf16 x mxfp4
# 2.59 / 2.86 / 2.60 / 2.87x, bf16 x nvfp4 2.51 / 2.77 / 2.55 / 2.78x, mxfp4 x mxfp4 2.51 / 2.66 / 2.53 / 2.69x,
# mxfp8 x mxfp4 2.44 / 2.65 / 2.48 / 2.66x, nvfp4 x nvfp4 2.51 / 2.59 / 2.53 / 2.61x, mxfp8 x mxfp8 1.78 / 1.93 /
# 1.79 / 1.94x, bf16 x mxfp8 1.79 / 1.96 / 1.79 / 1.95x; 8192 x 28672, fp8 weights (split 8, 512 programs) mxfp8 x
# mxfp8 1.84 / 1.88 / 1.85 / 1.88x, bf16 x mxfp8 1.78 / 1.81 / 1.78 / 1.81x.
MMA_GEMV_CLUSTER = True
# L2 eviction hints on the mma kernels' loads (`mma_gemv.eviction`): the weights, read once, evict_first; the
# activation, read again by every program, evict_last. H100, N = K = 8192, without / with / without, one process each
# (bench/results/h100_mma_evict_hints_ab_n8192_k8192_686f17d_2026-11-26.log), us: M = 1 bf16 x nvfp4 15.9 / 15.7 / 15.9,
# bf16 x mxfp4 15.3 / 15.2 / 15.4, nvfp4 x nvfp4 16.0 / 15.9 / 15.9; M = 16 bf16 x nvfp4 17.2 / 16.9 / 17.2, mxfp4 x
# mxfp4 18.2 / 17.8 / 18.0, mxfp8 x mxfp8 27.4 / 26.9 / 27.4, bf16 x mxfp8 27.3 / 27.0 / 27.3, bf16 x mxfp4 16.4 /
# 16.6 / 16.4, nvfp4 x nvfp4 and mxfp8 x mxfp4 within 0.1; M = 64 nvfp4 x nvfp4 34.7 / 33.7 / 34.7, bf16 x nvfp4 34.2 /
# 33.4 / 34.2, bf16 x mxfp4 33.8 in all three. Each hinted load costs sm_90 instructions (its cache policy: M = 1 91 ->
# 97 per window for nvfp4 x nvfp4, 92 -> 103 for bf16 x nvfp4; M = 16 bf16 x mxfp4 212 -> 246 per two windows).
# The default at M <= 16 only: in mma_m64_kernel (M > 16) ptxas then issues the K loop's loads of mxfp4 x mxfp4,
# mxfp8 x mxfp4 and mxfp8 x mxfp8 after the B exchange's fence (sm_90 `early` 1-2 -> 0 at M = 64, 8192^2), the
# schedule that cost mxfp8 x mxfp4 18% at 4053425 (tests/test_bench.py), and those pairs were not timed with hints.
MMA_EVICT = True
# Programmatic dependent launch (`launch.DirectLaunch` with `pdl`, sm_90+): the mma kernels read %tid.x after
# `griddepcontrol.wait` and touch no memory before it, and let the next kernel launch after their K loop
# (`mma_gemv.launch_dependents`). Launched so, a call may start its CTAs while the kernel before it in the stream (or
# CUDA graph) finishes, as SMs come free, and waits for that kernel's results before its first load; after a kernel
# that does not trigger early (most torch kernels) it starts when that one ends, as without. Measured: see
# bench/DECODE_NOTES.md, "Programmatic dependent launch".
MMA_PDL = True  # at M <= MMA_WARP_M; above it off by default (mma_m64_kernel, M = 64, 8192^2: 34.9 -> 41.5 us)
# but not for E8M0-scaled (mx) fp4 / fp8 activations on fp4 weights at 1 < M <= 16 where a program's K loop runs more
# than this many windows. H100, M = 16, back to back, us, PDL on / off (twice each, one process per shape,
# bench/results/h100_mma_pdl_*ab_m16_*_a2b8dee_2026-11-27.log), mxfp4 x mxfp4 and mxfp8 x mxfp4: 8192 x 28672 (split
# 16, 28 windows a program) 54.6-55.6 / 52.9-53.8; 57344 x 8192 (split 2, 64 windows) 101.4-106.0 / 100.6-102.7;
# but 10240 x 8192 (split 8, 16 windows) 23.4-23.8 / 23.6-24.3 and 8192^2 (8 K slices, 16 windows a warp) 16.7-17.1 /
# 17.0-17.5. nvfp4 x nvfp4 (E4M3 scales) lost nothing there (53.5-53.7 / 54.2-54.3 at 8192 x 28672).
MMA_PDL_MX_ACT_MAX_WINDOWS = 16
MMA_PDL_CONST = 12  # PDL's position among the mma kernels' constexprs (`_mma_plan`): 0 off, 1 + "pdl_prefetch" on
# Windows of weights each warp asks L2 for before its grid wait (config "pdl_prefetch"), by (fp8 weights, activation
# column groups): 4 only for fp8 weights at 8 < M <= 16. H100, back to back, one process per shape, A / B / A / B, us
# (bench/results/h100_mma_pdl_prefetch*_{57e57c7,2e21ad0}_2026-11-27.log):
# - fp4 weights, M = 16, prefetch 2 / 3 / 4 / 2: every pair slower with 3 or 4 at 8192^2 and 10240 x 8192 (nvfp4 x
#   nvfp4 17.3 / 17.4 / 17.4 / 17.2 and 24.0 / 24.2 / 24.9 / 23.9).
# - fp8 weights, M = 16, 2 / 4 / 2 / 4: mxfp8 x mxfp8 at 8192^2 25.1 / 24.2 / 25.1 / 24.1, at 8192 x 28672 85.1 / 84.4 /
#   85.0 / 84.3, bf16 x mxfp8 at 8192^2 26.5 / 26.2 / 26.3 / 26.1; 10240 x 8192 and 57344 x 8192 0.3-0.7 us faster with 4.
# - fp8 weights, M = 1 and 8 (other plans), 2 / 4 / 2 / 4 at 8192 x 28672: mxfp8 x mxfp8 79.4 / 85.8 / 79.3 / 85.7 (M = 1)
#   and 83.9 / 89.1 / 84.1 / 89.2 (M = 8), bf16 x mxfp8 80.4 / 80.9 / 80.2 / 80.9 and 83.5 / 83.6 / 83.4 / 83.6;
#   at 8192^2, M = 1 bf16 x mxfp8 22.5 / 22.0 / 22.5 / 22.0.
MMA_PDL_PREFETCH = {(False, 1): 2, (False, 2): 2, (True, 1): 2, (True, 2): 4}
# config keys that change how a plan launches, not the plan: a config of only these keeps the default plan
LAUNCH_ONLY_KEYS = {"pdl", "pdl_prefetch"}


# fp4 / fp8 activations on fp4 weights above M = 16 are decoded to bf16 by a kernel of their own
# (`dequantize.dequantize_kernel`), and the mma kernel runs the bf16-activation plan ("predecode"): mma_m64_kernel
# decodes its activation once per program, N / 128 times over (sm_90 K loop at 8192^2, M = 64: nvfp4 x nvfp4 195
# instructions per window, predecoded 128). H100, default / predecode, us, two runs each in one process
# (bench/results/h100_mma_predecode_ab_n*_k8192_eed34c5_2026-11-27.log): 8192^2 M = 32 nvfp4 x nvfp4 27.3 / 25.3,
# mxfp4 x mxfp4 27.2 / 24.7, mxfp8 x mxfp4 28.2 / 24.7; M = 64 32.1 / 30.5, 32.6 / 29.4, 32.1 / 29.3; 10240 x 8192
# M = 32 34.5 / 31.2, 41.1 / 30.6, 34.9 / 30.4, M = 64 43.5 / 35.8, 42.9 / 35.0. Not at M <= 16 (0.2-1.2 us slower
# with the second launch), nor for fp8 weights (mxfp8 x mxfp8 0.3-3.1 us slower at M = 16, 32 and 64; bf16 x mxfp8
# is no faster than mxfp8 x mxfp8 in the records either).
MMA_PREDECODE_MIN_M = MMA_WARP_M


def _mma_predecode(m: int, narrow: bool, fp8_weights: bool) -> bool:
    """The default of "predecode": fp4 / fp8 activations on fp4 weights above MMA_PREDECODE_MIN_M rows."""
    return narrow and not fp8_weights and m > MMA_PREDECODE_MIN_M


def _mma_hoist(m: int, narrow: bool, fp8_weights: bool) -> bool:
    """Where the hinted loads run as inline PTX with their cache policies made once (`mma_gemv.hinted_loads`): Triton
    writes a load's policy anew for each load, 11 sm_90 instructions per K-loop iteration at M = 16 (that and the
    exchange's addresses made once: 322 -> 286 for nvfp4 x nvfp4, 246 -> 208 for bf16 x mxfp4). H100, old / new / old
    in one process each (bench/results/h100_mma_m{1,16}_hoisted_addresses_policies_ab_*_4d221fb_2026-11-26.log), us:
    M = 16, 8192^2, nvfp4 x nvfp4 18.7 / 17.8 / 18.6, mxfp4 x mxfp4 18.1 / 17.1 / 18.0, mxfp8 x mxfp4 18.1 / 17.3 /
    18.4, bf16 x mxfp4 16.4 / 16.1 / 16.6, bf16 x mxfp8 27.1 / 27.7 / 27.0; 10240 x 8192 (new / old) fp4 x fp4
    24.3 / 25.1, 23.5 / 24.4, 23.9 / 24.6, bf16 x mxfp4 22.9 / 22.4; M = 1, 8192^2, fp4 x fp4 within 0.1-0.2, bf16
    x nvfp4 15.7 / 16.8 / 15.7 and bf16 x mxfp4 15.2 / 16.5 / 15.2 (ptxas issued a weight load after the decode had
    begun). So fp4 and fp8 activations on fp4 weights at 1 < M <= 16."""
    return narrow and not fp8_weights and 1 < m <= MMA_WARP_M


def _mma_runs(pair: str, a, m: int, n: int, device: torch.device) -> bool:
    return (pair in MMA_PAIRS and n % (64 if m <= MMA_WARP_M else MMA_M64_PROGRAM_ROWS) == 0
            and _mma_activation(a) and _ptx_decodes(device)
            and _capability(device) >= (8, 0))


def _mma_activation(a) -> bool:
    """Whether the mma kernel reads this activation: bf16, or fp4 / fp8 with k_order data."""
    return not isinstance(a, QTensor) or a.data_layout == "k_order"


def _mma_column_groups(m: int) -> int:
    """B operands of 8 activation rows each (the kernel's COL_GROUPS): 8 per 64-row tile above M = 64."""
    return -(-min(m, MMA_M64_B_ROWS) // 8)


class MmaOptions(NamedTuple):
    max_split: int  # split-K cap
    programs_per_sm: int  # resident programs per SM for the wave rule (`_mma_split`); 0: the largest split
    row_groups: int  # 16-row groups per warp (ROW_GROUPS)
    shared_b: bool  # the program's threads decode B once and share it through shared memory
    wgmma: bool  # M > MMA_WARP_M: wgmma where the device has it (else mma.sync)
    ahead: int  # windows loaded ahead (AHEAD)
    k_warps: int  # warps (K slices of 4 warps with shared B) splitting K inside a program (K_WARPS; > 1: split 1)
    stage_b: bool | None  # each warp decodes its K range of B into shared memory once (STAGE_B); None: by the plan
    unroll: int  # windows per K-loop iteration (LLVM unrolls the loop by this factor); 0: by the plan
    tile_m: int  # M > MMA_M64_B_ROWS: activation rows per program of mma_m64_kernel (TILE_M: 64, or 128 with wgmma)
    cluster: bool  # split-K: the split parts sum in a thread-block cluster where they can (CLUSTER)
    split: int  # split-K factor as given (any 1 .. K / 64 at M <= MMA_WARP_M without ahead); 0: by max_split and the rule
    evict: bool  # L2 eviction hints: weights evict_first, activation evict_last (EVICT)
    hoist: bool  # with evict: hinted loads in inline PTX, their policies made once before the K loop (EVICT 2)
    pdl: bool | None  # programmatic dependent launch where the device has it (PDL, `launch.DirectLaunch`); None: by the plan
    pdl_prefetch: int  # with pdl at M <= MMA_WARP_M: windows of weights each warp asks L2 for before the grid wait
    fragment_sums: bool  # M > MMA_WARP_M, split-K in the workspace: sums in fragment order, vector reductions (FRAGMENT_SUMS)
    wide_b: bool = False  # M > MMA_WARP_M, bf16 / fp8 activations: a thread's B share in 16-byte loads (WIDE_B)
    predecode: bool = False  # fp4 / fp8 activations decoded to bf16 by a kernel of their own, then the bf16 plan


def _mma_options(config, m: int, n: int, narrow: bool, fp8_weights: bool = False, aligned: bool = False) -> MmaOptions:
    """`config` may be a dict with "max_split": n (then the largest split up to n, instead of
    `MMA_MAX_SPLIT` and, where `MMA_PROGRAMS_PER_SM` has the case, the wave rule),
    "row_groups": 1 or 2 (default `MMA_ROW_GROUPS` by `narrow` (fp4 / fp8 activations) and
    column groups; 2 needs N % 128 == 0; fp8 weights at 8 < M <= 16: split cap
    `MMA_FP8_M16_MAX_SPLIT`, no wave rule),
    "shared_b": bool (default `MMA_SHARED_B`), "ahead":
    0 or, with shared B, 1 (window w + 1's words loaded before window w's; default MMA_AHEAD) and
    "k_warps": 1, 2, 4, 8 or 16 (> 1: a program is that many warps on one row group (two with
    row_groups 2), or with shared B that many K slices of 4 warps on 4 row groups (pairs), up to 8,
    each over its share of K, summed in shared memory: no split-K across programs, so no
    "max_split"; default once K is known: `_mma_k_warps` for bf16 activations at M = 1,
    `_mma_k_slices` (which sets row_groups, shared_b and ahead too) at 1 < M <= 16, where the config
    sets none of max_split, row_groups, shared_b and ahead; else 1) and
    "stage_b": bool (fp4 / fp8 activations at M <= 8 with "k_warps" > 1 and without shared B: each warp
    decodes its K range of the activation once, into shared memory; default at M = 1 for them where
    the config sets none of the other keys: by `_mma_stage_b` once K is known, else False) and
    "unroll": 1 or 2 (windows per iteration of the K loop, which LLVM unrolls; default `MMA_UNROLL` by
    the plan) and "split": n (split-K into exactly n parts instead of "max_split" and the rule, in parts of W / n or
    W / n + 1 of the K / 64 windows W; at M <= MMA_WARP_M one that does not divide W only without "ahead") and
    "cluster": bool (default `MMA_GEMV_CLUSTER`: split-K parts sum in a thread-block cluster where
    `_mma_gemv_cluster` allows it; False: workspace atomics) and "evict": bool (default `MMA_EVICT` up to M = 16,
    False above: the weights' loads evict_first in L2, the activation's evict_last; any M) and "hoist": bool (with
    evict: those loads in inline PTX whose cache policies are made once, before the K loop; default `_mma_hoist`) and
    "pdl": bool (default `MMA_PDL` up to M = 16 where `_mma_pdl_by_plan` allows it, False above: programmatic
    dependent launch where the device has it; any M) and "pdl_prefetch":
    0 .. 4 (with pdl at M <= 16, which it turns on: windows of weights each warp asks L2 for before its grid wait;
    default `MMA_PDL_PREFETCH`: 2, and 4 for fp8 weights at 8 < M <= 16).
    Above M = MMA_WARP_M (`mma_m64_kernel`) only "max_split" or "split", "wgmma": bool (default True:
    wgmma on sm_90, mma.sync elsewhere; False: mma.sync), "ahead": 1 .. 3 (windows loaded
    ahead, default MMA_M64_AHEAD), "unroll", "cluster": bool (default True: with wgmma, the split-K parts of an
    output tile sum in a thread-block cluster where `_mma_cluster` allows it; False: workspace atomics),
    "fragment_sums": bool (default `MMA_M64_FRAGMENT_SUMS`: the workspace in fragment order, one vector reduction per
    4 sums; False: scalar atomic adds at the outputs' positions), "wide_b": bool (default `MMA_M64_WIDE_B` for bf16
    and fp8 activations whose data is 16-byte aligned (`aligned`): 16-byte loads of a thread's B share) and, above
    M = 64, "tile_m": 64 or 128 (activation rows per program; 128 with wgmma and ahead 1: one decode of the weights
    for two wgmma) may be given: one row group per warp, B shared. At any M, for fp4 / fp8 activations, "predecode":
    bool (default `_mma_predecode`: on fp4 weights above M = 16): the activation decoded to bf16 rows by a kernel of
    its own (`dequantize.dequantize_kernel`) before the mma kernel, which then runs the bf16-activation options and
    plan (`mma_options_for` lays the other keys over those)."""
    if config is None:
        return _default_mma_options(m, n, narrow, fp8_weights, aligned)
    keys = {"max_split", "split", "row_groups", "shared_b", "wgmma", "ahead", "k_warps", "stage_b", "unroll", "tile_m",
            "cluster", "evict", "hoist", "pdl", "pdl_prefetch", "fragment_sums", "wide_b", "predecode"}
    if not isinstance(config, dict) or not set(config) <= keys:
        raise ValueError("config: the mma backend takes a dict of 'max_split', 'split', 'row_groups', 'shared_b', 'wgmma', "
                         f"'ahead', 'k_warps', 'stage_b', 'unroll', 'tile_m', 'cluster', 'evict', 'hoist', 'pdl', "
                         f"'pdl_prefetch', 'fragment_sums', 'wide_b' and 'predecode', or None, got {config!r}")
    predecode = config.get("predecode", _mma_predecode(m, narrow, fp8_weights))
    if type(predecode) is not bool or (predecode and not narrow):
        raise ValueError(f"config: predecode is a bool, True only for fp4 / fp8 activations, got {config!r}")
    split = config.get("split", 0)
    if "split" in config and (type(split) is not int or split < 1 or "max_split" in config):
        raise ValueError(f"config: split is an int >= 1, without 'max_split', got {config!r} at M = {m}")
    wide_m = m > MMA_WARP_M
    auto = (m == 1 and not narrow and not set(config) & {"max_split", "split", "shared_b", "ahead"}) or (
        1 < m <= MMA_WARP_M and not set(config) & {"max_split", "split", "shared_b", "ahead", "row_groups"})
    k_warps = config.get("k_warps", 0 if auto else 1)  # 0: by `_mma_k_warps` / `_mma_k_slices` once K is known
    if "k_warps" in config and (k_warps not in (1, 2, 4, 8, 16) or type(k_warps) is not int):
        raise ValueError(f"config: k_warps must be 1, 2, 4, 8 or 16, got {k_warps!r}")
    if k_warps > 1 and (wide_m or "max_split" in config or split > 1):
        raise ValueError(f"config: k_warps > 1 runs at M <= {MMA_WARP_M} without 'max_split' or 'split' (split 1), got {config!r} "
                         f"at M = {m}")
    if wide_m:
        if config.get("row_groups", 1) != 1 or config.get("shared_b", True) is not True:
            raise ValueError(f"config: above M = {MMA_WARP_M} the mma kernel runs row_groups 1 with shared_b True, "
                             f"got {config!r}")
        # the mma.sync count; the plan takes wgmma's where the device runs it
        programs_per_sm = MMA_M64_PROGRAMS_PER_SM[False, narrow and not fp8_weights]
        row_groups, default_split, shared_b = 1, MMA_M64_MAX_SPLIT, True
    else:
        if "wgmma" in config:
            raise ValueError(f"config: 'wgmma' applies above M = {MMA_WARP_M}, got it at M = {m}")
        col_groups = _mma_column_groups(m)
        row_groups = int(config.get("row_groups", MMA_ROW_GROUPS[narrow, col_groups] if n % 128 == 0 else 1))
        if row_groups not in (1, 2) or n % (64 * row_groups):
            raise ValueError(f"config: row_groups must be 1 or 2 with N % (64 * row_groups) == 0, got {row_groups} at N={n}")
        default_split = MMA_MAX_SPLIT[col_groups, row_groups]
        programs_per_sm = MMA_PROGRAMS_PER_SM.get((narrow, col_groups, row_groups), 0)
        if fp8_weights and col_groups == 2:
            default_split, programs_per_sm = MMA_FP8_M16_MAX_SPLIT, 0
        shared_b = config.get("shared_b", MMA_SHARED_B[narrow, col_groups])
    max_split = int(config.get("max_split", default_split if k_warps <= 1 else 1))
    if max_split < 1:
        raise ValueError(f"config: max_split must be >= 1, got {max_split}")
    wgmma, cluster = config.get("wgmma", wide_m), config.get("cluster", wide_m or MMA_GEMV_CLUSTER)
    evict = config.get("evict", MMA_EVICT and not wide_m)
    hoist = config.get("hoist", evict is True and _mma_hoist(m, narrow, fp8_weights))
    pdl = config.get("pdl", MMA_PDL and not wide_m)
    fragment_sums = config.get("fragment_sums", wide_m and MMA_M64_FRAGMENT_SUMS)
    for name, value in (("shared_b", shared_b), ("wgmma", wgmma), ("cluster", cluster), ("evict", evict), ("hoist", hoist),
                        ("pdl", pdl), ("fragment_sums", fragment_sums)):
        if not isinstance(value, bool):
            raise ValueError(f"config: {name} must be a bool, got {value!r}")
    if fragment_sums and not wide_m:
        raise ValueError(f"config: fragment_sums applies above M = {MMA_WARP_M}, got {config!r} at M = {m}")
    pdl_prefetch = config.get("pdl_prefetch",
                              MMA_PDL_PREFETCH[fp8_weights, _mma_column_groups(m)] if pdl and not wide_m else 0)
    if type(pdl_prefetch) is not int or not 0 <= pdl_prefetch <= 4 or (pdl_prefetch and (not pdl or wide_m)):
        raise ValueError(f"config: pdl_prefetch is an int in 0 .. 4, with pdl at M <= {MMA_WARP_M}, got {config!r} at M = {m}")
    if pdl and not {"pdl", "pdl_prefetch"} & set(config):
        pdl = None  # by the plan (`_mma_pdl_by_plan`)
    if hoist and not evict:
        raise ValueError(f"config: hoist applies to the eviction hints, which evict False turns off, got {config!r}")
    ahead = config.get("ahead", MMA_M64_AHEAD if wide_m else MMA_AHEAD)
    low, high = (1, 3) if wide_m else (0, int(shared_b))
    if type(ahead) is not int or not low <= ahead <= high:
        raise ValueError(f"config: ahead must be an int in {low} .. {high} at M = {m}"
                         f"{'' if wide_m or shared_b else ' without shared_b'}, got {ahead!r}")
    if shared_b and k_warps > 8:  # (above MMA_WARP_M k_warps > 1 was refused)
        raise ValueError(f"config: k_warps with shared_b is at most 8 (slices of 4 warps, 32 in all), got {config!r}")
    stage_b = config.get("stage_b", None if m == 1 and narrow and not set(config) - LAUNCH_ONLY_KEYS else False)
    if stage_b is not None and not isinstance(stage_b, bool):
        raise ValueError(f"config: stage_b must be a bool, got {stage_b!r}")
    if stage_b and not (narrow and not wide_m and _mma_column_groups(m) == 1 and k_warps > 1 and not shared_b):
        raise ValueError("config: stage_b runs fp4 / fp8 activations at M <= 8 with 'k_warps' > 1 and 'shared_b' False, "
                         f"got {config!r} at M = {m}{'' if narrow else ' with bf16 activations'}")
    unroll = config.get("unroll", 0)
    if "unroll" in config and (unroll not in (1, 2) or type(unroll) is not int):
        raise ValueError(f"config: unroll must be 1 or 2, got {unroll!r}")
    tile_128 = m > MMA_M64_B_ROWS and wgmma and ahead == 1  # where 128 activation rows per program can run
    tile_m = config.get("tile_m", 2 * MMA_M64_B_ROWS if tile_128 and m <= MMA_TILE_128_MAX_M else MMA_M64_B_ROWS)
    if type(tile_m) is not int or tile_m not in (MMA_M64_B_ROWS, 2 * MMA_M64_B_ROWS) or (
            tile_m > MMA_M64_B_ROWS and not tile_128):
        raise ValueError(f"config: tile_m must be 64, or 128 above M = 64 with wgmma and ahead 1, got {config!r} "
                         f"at M = {m}")
    # (the 16-byte loads carry no L2 eviction hint: with "evict" the four hinted ones)
    wide_b = config.get("wide_b", MMA_M64_WIDE_B and wide_m and aligned and not evict)
    if "wide_b" in config and (type(wide_b) is not bool or (wide_b and (not wide_m or not aligned or evict))):
        raise ValueError(f"config: wide_b is a bool, True only above M = {MMA_WARP_M} with bf16 or fp8 activations whose "
                         f"data is 16-byte aligned and without evict, got {config!r} at M = {m}")
    return MmaOptions(max_split, 0 if "max_split" in config or k_warps > 1 else programs_per_sm, row_groups, shared_b,
                      wgmma, ahead, k_warps, stage_b, unroll, tile_m, cluster, split, evict, hoist, pdl, pdl_prefetch,
                      fragment_sums, wide_b, predecode)


def mma_options_for(config, a, b: QTensor, m: int, n: int) -> MmaOptions:
    """`_mma_options` for activation `a` [m, K] and "mma_m16k16" weights `b` [n, K] (what
    `scaled_mm` runs); bf16 and fp8 activations above M = 16 are checked for 16-byte alignment (`MMA_M64_WIDE_B`)."""
    narrow = isinstance(a, QTensor)
    # `aligned`: activation data that 16-byte loads of a thread's share may read (bf16 and fp8, not fp4: one word)
    aligned = m > MMA_WARP_M and not (narrow and a.fmt.is_packed) and (a.data if narrow else a).data_ptr() % 16 == 0
    options = _mma_options(config, m, n, narrow, not b.fmt.is_packed, aligned)
    if options.predecode:  # the bf16-activation options, over rows that the plan allocates (16-byte aligned)
        rest = {key: value for key, value in config.items() if key != "predecode"} if config else None
        options = _mma_options(rest or None, m, n, False, not b.fmt.is_packed, m > MMA_WARP_M)._replace(predecode=True)
    return options


@functools.lru_cache(maxsize=None)
def _default_mma_options(m: int, n: int, narrow: bool, fp8_weights: bool, aligned: bool = False) -> MmaOptions:
    """`_mma_options` without a config, once per shape: it runs on every call. With this and
    the flat `kernel_words`, the mma path of `scaled_mm` without the launch went from 146,837
    to 94,340 x86 instructions per call (callgrind, bf16 x nvfp4, M = 1, 2-core CPU machine)."""
    return _mma_options({}, m, n, narrow, fp8_weights, aligned)


def _mma_split(windows: int, row_programs: int, max_split: int, programs_per_sm: int, device: torch.device,
               unsplit_waves: float = 0, uneven: bool = False) -> int:
    """Split-K factor: a power of two <= max_split dividing the 64-K windows; the largest, or
    with `programs_per_sm` resident the smallest whose last wave of programs is >= 90% full
    (else the fullest), and 1 where the unsplit programs fill `unsplit_waves` (if given) of a wave.
    With `uneven` (mma_m64_kernel), where that split leaves one wave under 90% full, the largest factor
    <= max_split whose programs still fit one wave if they fill 90% of it (`MMA_M64_UNEVEN_SPLIT`)."""
    splits = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= max_split and windows % s == 0]
    if not programs_per_sm:
        return splits[-1]
    resident = programs_per_sm * _sm_count(device)
    if unsplit_waves and row_programs >= unsplit_waves * resident:
        return 1

    def fill(s):
        waves = row_programs * s / resident
        return waves / -(-waves // 1)

    split = next((s for s in splits if fill(s) >= 0.9), max(splits, key=fill))
    one_wave = min(max_split, windows, resident // row_programs)
    if uneven and row_programs * split < 0.9 * resident <= row_programs * one_wave:
        return one_wave
    return split


def _mma_k_warps(windows: int, programs: int, device: torch.device) -> int:
    """K_WARPS by `MMA_K_WARPS`: the first that divides the windows and whose `programs` (64 // k_warps
    resident per SM: <= 32 registers, `tests/test_bench.py`) fill 0.5 (up to MMA_K_WARPS_SHORT_WINDOWS
    windows: MMA_K_WARPS_SHORT_MIN_WAVES) to 1 wave or make >= 3; else 1."""
    least = MMA_K_WARPS_SHORT_MIN_WAVES if windows <= MMA_K_WARPS_SHORT_WINDOWS else 0.5
    for k_warps in MMA_K_WARPS:
        waves = programs / (64 // k_warps * _sm_count(device))
        if windows % k_warps == 0 and (least <= waves <= 1 or waves >= 3):
            return k_warps
    return 1


def _mma_k_slices(windows: int, n: int, device: torch.device, two_groups: bool = True) -> tuple[int, int, int, int] | None:
    """(K slices, row groups, ahead and unroll for fp4 weights) at 1 < M <= 16 by `MMA_K_SLICES`: 4 slices of two
    row groups where their programs (2 resident per SM) make at least one wave (only if `two_groups`:
    8 < M <= 16), else 8 of one where theirs (1 per SM)
    fill 0.9 to 1 wave; only up to MMA_K_SLICES_MAX_WINDOWS windows. Else None: split-K."""
    sms = _sm_count(device)
    if windows <= MMA_K_SLICES_MAX_WINDOWS:
        for slices, row_groups, resident, low, high, ahead, unroll in MMA_K_SLICES:
            if row_groups == 2 and not two_groups:
                continue
            programs = n // (64 * row_groups)
            if windows % slices == 0 and n % (64 * row_groups) == 0 and low <= programs / (resident * sms) <= high:
                return slices, row_groups, ahead, unroll
    return None


# At 8 < M <= 16, where 4 K slices of two row groups would run (their 512-thread programs make >= 1 wave: 57344 x 8192,
# 448 programs at 2 per SM = 1.7 waves), split-K by the wave rule up to CLUSTER_MAX_CTAS (split 2 there: 896 programs
# of 128 threads, 0.85 of one wave) summed in clusters, where `_mma_gemv_cluster` allows it (`_mma_m16_cluster_split`).
# H100, M = 16, 57344 x 8192, x cuBLAS bf16, slices / split 2 / slices in one process
# (bench/results/h100_mma_m16_cluster_split_ab_n57344_k8192_1dac280_2026-11-25.log): nvfp4 x nvfp4 2.92 / 3.06 / 2.89x,
# mxfp4 x mxfp4 2.90 / 3.20 / 2.88x, mxfp8 x mxfp4 2.86 / 3.16 / 2.86x, bf16 x nvfp4 3.00 / 3.17 / 2.95x, bf16 x mxfp4
# 3.07 / 3.36 / 3.08x; mxfp8 x mxfp8 (h100_mma_m16_fp8_split2_ab_n57344_k8192_949c0f4_2026-11-25.log) 1.77 / 1.97 /
# 1.78x; bf16 x mxfp8 (h100_mma_m16_bf16_mxfp8_split2_ab_n57344_k8192_69d2fae_2026-11-25.log) 166.8 / 165.3 / 166.7 us.
# At 8192 x 28672 (split 16 with workspace atomics, 1024 programs) split 8 in clusters (512) lost for fp4 weights:
# 2.43-2.64x against 2.88-3.07x (h100_mma_m16_cluster_split_ab_n8192_k28672_1dac280_2026-11-25.log); so did split 16
# in clusters of 16 (2.36-2.53x against 2.91-3.10x, `decode.CLUSTER_MAX_CTAS`) and split 8 of one row group in
# clusters of 8, one accumulator per CTA (1.80-1.91x; at 10240 x 8192 2.05-2.22x against 2.60-2.88x, at 8192^2
# 1.64-1.74x against 2.54-2.91x: h100_mma_m16_one_group_cluster_ab_n*_acc9176_2026-11-25.log).
def _mma_m16_cluster_split(windows: int, n: int, row_groups: int, narrow: bool, cluster: bool,
                           device: torch.device) -> int:
    """At 8 < M <= 16 (two column groups): the split-K factor of programs of 4 warps on
    `row_groups` row groups (the wave rule with `MMA_PROGRAMS_PER_SM`, at most CLUSTER_MAX_CTAS) where its parts sum
    in thread-block clusters (`_mma_gemv_cluster`, if `cluster`), else 0."""
    row_programs = n // (64 * row_groups)
    split = _mma_split(windows, row_programs, CLUSTER_MAX_CTAS, MMA_PROGRAMS_PER_SM[narrow, 2, row_groups], device)
    return split if cluster and _mma_gemv_cluster(split, _mma_gemv_values(row_groups, 2), row_programs * split, device) else 0


# At 8 < M <= 16, where split-K of two-row-group programs would sum in the workspace on less than
# MMA_ONE_GROUP_FILL of a wave (N = 4096 and 6144 at K = 4096, N = 4096 at K = 14336: split 16, 0.5-0.7 of a wave;
# fp8 weights split 8), one row group per warp with split-K in thread-block clusters and one window ahead instead:
# twice the programs, no workspace atomics. H100, M = 16, us, default / that, one process per shape:
# - 4096^2 (bench/results/h100_mma_m16_variants_n4096_k4096_713bc5c_2026-11-27.log, cuBLAS bf16 15.9 us, split 8 in
#   clusters of 8): nvfp4 x nvfp4 10.3 / 8.2, bf16 x mxfp4 9.4 / 7.2, bf16 x mxfp8 12.0 / 9.5, mxfp8 x mxfp8 12.5 / 9.7;
#   without ahead 8.2 / 8.0 / 9.7 / 10.8, split 4 12.4-13.8, 8 K slices of one row group 8.6-10.7, two row groups at
#   split 8 9.9-12.5.
# - 6144 x 4096 (h100_mma_m16_one_group_ab_n6144_k4096_31c9ef2_2026-11-27.log, cuBLAS 21.1 us): nvfp4 x nvfp4 12.5 /
#   11.1, mxfp4 x mxfp4 12.7 / 10.9, mxfp8 x mxfp4 13.0 / 10.7, bf16 x nvfp4 13.0 / 9.5, bf16 x mxfp4 12.7 / 9.3 (fp8
#   weights there already sum in clusters: unchanged).
# - 4096 x 14336 (h100_mma_m16_one_group_ab_n4096_k14336_31c9ef2_2026-11-27.log, cuBLAS 44.6 us): bf16 x nvfp4 20.7 /
#   19.3, bf16 x mxfp4 19.7 / 19.0, bf16 x mxfp8 30.7 / 25.2, mxfp8 x mxfp8 32.3 / 25.8; but fp4 / fp8 activations on
#   fp4 weights 20.0 / 20.9 (nvfp4 x nvfp4), 20.8 / 20.8, 20.0 / 20.8 (mxfp8 x mxfp4): one row group decodes the
#   shared B window for half the weight rows, and over 224 windows that costs more than the workspace. So those pairs
#   take it up to MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS (K = 4096, the one K where they gained; between 4096 and 14336
#   not timed).
# The tuned Llama-3-70B shapes do not take it: their two-row-group split-K fills 0.97 of a wave (8192 x 28672) or
# sums in clusters (10240 x 8192), and there one row group lost (the comment above `_mma_m16_cluster_split`).
MMA_ONE_GROUP_FILL = 0.9
MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS = 64


def _mma_m16_one_group_split(windows: int, n: int, m: int, narrow: bool, fp4_on_fp4: bool, options: MmaOptions,
                             device: torch.device) -> int:
    """At 8 < M <= 16 with two row groups by default: the split-K factor (<= CLUSTER_MAX_CTAS, dividing the windows)
    of programs of one row group summed in clusters, where the two-row-group split by `options` would sum in the
    workspace on less than MMA_ONE_GROUP_FILL of a wave (`MMA_PROGRAMS_PER_SM` resident) and the clusters can run
    (fp4 / fp8 activations on fp4 weights: up to MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS windows); else 0."""
    if (_mma_column_groups(m) != 2 or options.row_groups != 2 or not options.cluster  # (two row groups: N % 128 == 0)
            or (fp4_on_fp4 and windows > MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS)):
        return 0
    pairs = n // 128
    split = _mma_split(windows, pairs, options.max_split, options.programs_per_sm, device)
    resident = MMA_PROGRAMS_PER_SM[narrow, 2, 2] * _sm_count(device)
    if (_mma_gemv_cluster(split, _mma_gemv_values(2, 2), pairs * split, device)
            or pairs * split >= MMA_ONE_GROUP_FILL * resident):
        return 0
    split = _mma_split(windows, n // 64, CLUSTER_MAX_CTAS, 0, device)
    return split if _mma_gemv_cluster(split, _mma_gemv_values(1, 2), n // 64 * split, device) else 0


# Staged B for fp4 / fp8 activations at M = 1 (`mma_gemv.staged_b`): each warp decodes its K range of the
# activation into shared memory once, so they run the K_WARPS loop of bf16 activations with B read from
# shared memory (sm_90, N = K = 8192: nvfp4 x nvfp4 89 instructions per 32 weights at 29 registers,
# against 246 per 64 for split-K with B exchanged per window). H100, M = 1, x cuBLAS bf16, split-K with
# shared B (the default before) / staged, 8192^2 / 10240 x 8192 / 57344 x 8192
# (bench/results/h100_mma_staged_b_m1_2fd43e4_2026-11-24.log): nvfp4 x nvfp4 2.51 / 2.89, 2.90 / 3.08,
# 3.25 / 3.39x; mxfp4 x mxfp4 2.62 / 3.00, 2.99 / 3.23, 3.35 / 3.57x; mxfp8 x mxfp4 2.61 / 2.99, 2.99 /
# 3.18, 3.32 / 3.57x; mxfp8 x mxfp8 1.73 / 1.81, 1.94 / 1.96, 1.99 / 2.03x. 8192 x 28672 (57 KB of B)
# keeps split-K. Asking L2 for each warp's whole weight range before the loop (prefetch.global.L2) took
# 9-37% longer in all 28 cells at M = 1 (h100_mma_prefetch_m1_7ae20b4_2026-11-24.log): not kept.
def _mma_stage_b(m: int, k: int, k_warps: int) -> bool:
    """Whether a staged B (`mma_gemv.staged_b`) of M rows fits: at most MMA_STAGED_B_MAX_BYTES, and
    at most 16 16-element chunks a lane (`staged_b_chunks`: M x steps / 8, rounded up)."""
    steps = k // 64 // k_warps
    return k_warps > 1 and staged_b_bytes(m, k) <= MMA_STAGED_B_MAX_BYTES and staged_b_chunks(m, steps) in MMA_STAGED_B_STORE_PTX


def _mma_plan(a, b: QTensor, has_bias: bool, m: int, n: int, k: int, options: MmaOptions) -> SplitKPlan:
    """The SplitKPlan of one mma cache key: split-K over the 64-K windows, one program per
    64 * row_groups rows (M > MMA_WARP_M: MMA_M64_PROGRAM_ROWS rows, 8 warps), or with k_warps > 1
    one program of k_warps warps per 16 * row_groups rows (with shared B k_warps K slices of 4
    warps per 64 * row_groups rows) and no split. Where the options leave k_warps 0 it comes from
    `_mma_k_slices` at 1 < M <= 16 (with its row groups, shared B, and for fp4 weights its ahead and, unless
    the options give one, its unroll;
    split-K where it gives none: of one row group in clusters with one window ahead where
    `_mma_m16_one_group_split` says so, else one window ahead for fp8 weights at 8 < M <= 16 from K =
    MMA_FP8_M16_AHEAD_K),
    else from `_mma_k_warps`. Above M = MMA_WARP_M fp4 weights take two
    windows per K-loop iteration from K = MMA_M64_UNROLL_K, unless the options give "unroll", and above M =
    MMA_TILE_128_MAX_M no split once the programs fill MMA_M64_UNSPLIT_WAVES of a wave. Where they
    leave stage_b None (fp4 / fp8 activations at M = 1), B is staged with one row group, no shared B and
    `_mma_k_warps`'s warps where `_mma_stage_b` allows it."""
    if options.predecode:  # the bf16-activation plan, over the activation decoded into a buffer of the plan's own
        rows = torch.empty((m, k // a.fmt.block_size, a.fmt.block_size), dtype=torch.bfloat16, device=b.device)
        plan = _mma_plan(None, b, has_bias, m, n, k, options._replace(predecode=False))
        return plan._replace(predecode=Predecode(None, rows))
    wide_m = m > MMA_WARP_M
    fp4_on_fp4 = isinstance(a, QTensor) and b.fmt.is_packed  # fp4 / fp8 activations on fp4 weights
    if options.stage_b is None:
        k_warps = _mma_k_warps(k // 64, n // 16, b.device)
        staged = _mma_stage_b(m, k, k_warps)
        options = options._replace(stage_b=staged, **(dict(row_groups=1, shared_b=False, ahead=0, k_warps=k_warps,
                                                           max_split=1, programs_per_sm=0) if staged else {}))
    if options.stage_b and not _mma_stage_b(m, k, options.k_warps):
        raise ValueError(f"config: stage_b needs M x (2 K + 16) <= {MMA_STAGED_B_MAX_BYTES} bytes and M x K / 64 / k_warps "
                         f"from 1 to 128 (a warp's 16-K chunks over 32 lanes, at most 16 each), got M = {m}, K = {k}, k_warps {options.k_warps}")
    if not options.k_warps and m > 1:  # 1 < M <= 16: K slices or split-K
        slices = _mma_k_slices(k // 64, n, b.device, _mma_column_groups(m) == 2)
        narrow = isinstance(a, QTensor)
        cluster_split = (slices and slices[1] == 2
                         and _mma_m16_cluster_split(k // 64, n, slices[1], narrow, options.cluster, b.device))
        if cluster_split:  # split-K in clusters instead of 4 K slices of two row groups
            options = options._replace(k_warps=1, split=cluster_split, row_groups=slices[1])
        elif slices:
            slices, row_groups, *fp4_tail = slices
            ahead, unroll = fp4_tail if b.fmt.is_packed else (0, 1)
            if (slices, row_groups) == (8, 1) and not (b.fmt.is_packed or narrow) and _mma_column_groups(m) == 2:
                slices, ahead, unroll = MMA_BF16_FP8_M16_SLICES
            options = options._replace(k_warps=slices, row_groups=row_groups, shared_b=True, ahead=ahead,
                                       unroll=options.unroll or unroll)
        elif one_group := _mma_m16_one_group_split(k // 64, n, m, narrow, fp4_on_fp4, options, b.device):
            options = options._replace(k_warps=1, row_groups=1, split=one_group, ahead=1)
        else:  # split-K; fp8 weights at 8 < M <= 16 with long K load one window ahead
            fp8_ahead = not b.fmt.is_packed and _mma_column_groups(m) == 2 and k >= MMA_FP8_M16_AHEAD_K
            options = options._replace(k_warps=1, ahead=1 if fp8_ahead else options.ahead)
    elif not options.k_warps:
        options = options._replace(k_warps=_mma_k_warps(k // 64, n // (16 * options.row_groups), b.device))
    if (k // 64) % options.k_warps:
        raise ValueError(f"config: k_warps {options.k_warps} must divide the K / 64 = {k // 64} windows")
    from .mma_gemv import fragment_workspace_sums, program_row_warps  # per cache key, not per call

    wgmma = wide_m and options.wgmma and _has_wgmma(b.device)
    if not wgmma:  # 128 activation rows per program take wgmma's second descriptor
        options = options._replace(tile_m=MMA_M64_B_ROWS)
    if wide_m and options.programs_per_sm:  # the wave rule: resident programs of the kernel that runs
        options = options._replace(programs_per_sm=MMA_M64_TILE_128_PROGRAMS_PER_SM if options.tile_m > MMA_M64_B_ROWS
                                   else MMA_M64_PROGRAMS_PER_SM[wgmma, fp4_on_fp4])
    row_warps = program_row_warps(options.k_warps, options.shared_b)
    # mma_m64_kernel: a program per 128 weight rows and tile_m activation rows
    row_programs = (n // MMA_M64_PROGRAM_ROWS * -(-m // options.tile_m) if wide_m
                    else n // (16 * row_warps * options.row_groups))
    if options.split and (options.split > k // 64 or (k // 64 % options.split and options.ahead and not wide_m)):
        raise ValueError(f"config: split {options.split} must be at most the K / 64 = {k // 64} windows and, with "
                         f"ahead {options.ahead} at M <= {MMA_WARP_M}, divide them")
    split = options.split or (1 if options.k_warps > 1 else _mma_split(
        k // 64, row_programs, options.max_split, options.programs_per_sm, b.device,
        MMA_M64_UNSPLIT_WAVES if m > MMA_TILE_128_MAX_M else 0, wide_m and MMA_M64_UNEVEN_SPLIT))
    act_elem, act_scale, block_a, a_layout = operand_codes(a.fmt, a.layout) if isinstance(a, QTensor) else operand_codes(None)
    cluster = options.cluster and (
        wgmma and _mma_cluster(m, split, options.tile_m, row_programs * split, b.device) if wide_m
        else _mma_gemv_cluster(split, _mma_gemv_values(options.row_groups, _mma_column_groups(m)), row_programs * split,
                               b.device))
    # EVICT and PDL after HAS_BIAS; the kernels' last constexprs: mma_m64_kernel's SPLIT, WGMMA, AHEAD, TILE_M, CLUSTER,
    # FRAGMENT_SUMS, WIDE_B; mma_gemv_kernel's CLUSTER, ROW_GROUPS, SPLIT, SHARED_B, AHEAD, K_WARPS, STAGE_B
    tail = ((split, wgmma, options.ahead, options.tile_m, cluster, options.fragment_sums, options.wide_b) if wide_m
            else (cluster, options.row_groups, split, options.shared_b, options.ahead, options.k_warps, options.stage_b))
    w_elem, w_scale = operand_codes(b.fmt)[:2]
    consts = (m, n, k, b.fmt.block_size, w_elem, w_scale, act_elem, act_scale, block_a, a_layout, has_bias,
              2 if options.hoist else int(options.evict),
              1 + options.pdl_prefetch if _mma_pdl_by_plan(options.pdl, a, b, m, k // 64 // (split * options.k_warps))
              and _has_pdl(b.device) else 0,
              _mma_column_groups(m), *tail)
    workspace = None
    if split > 1:  # mma_m64_kernel's fragment order: its column groups (COL_GROUPS x TILE_M / 64) of every output tile
        sums = (fragment_workspace_sums(row_programs, _mma_column_groups(m) * options.tile_m // MMA_M64_B_ROWS)
                if wide_m and options.fragment_sums else m * n)
        workspace = (torch.zeros(sums, dtype=torch.float32, device=b.device),
                     torch.zeros(row_programs, dtype=torch.int32, device=b.device))
    unroll = options.unroll or (2 if wide_m and b.fmt.is_packed and k >= MMA_M64_UNROLL_K else MMA_UNROLL)
    cfg = helion.Config(block_sizes=[], num_warps=8 if wide_m else row_warps * options.k_warps, num_stages=1,
                        **({"range_unroll_factors": [0, unroll]} if unroll > 1 else {}))
    return SplitKPlan(None, cfg, consts, split, False, m, workspace)


def _cluster_sum_runs(split: int, values: int, threads: int, programs: int, device: torch.device) -> bool:
    """Whether SPLIT parts can sum `values` accumulators per thread of `threads`-thread CTAs in one thread-block
    cluster (`decode.MMA_CLUSTER_SUM_PTX`): split 2 .. CLUSTER_MAX_CTAS dividing them (one per CTA included), and
    more than MMA_CLUSTER_PROGRAMS_PER_SM programs per SM."""
    return (1 < split <= CLUSTER_MAX_CTAS and (values, split, threads) in MMA_CLUSTER_SUM_PTX
            and programs > MMA_CLUSTER_PROGRAMS_PER_SM * _sm_count(device))


def _mma_cluster(m: int, split: int, tile_m: int, programs: int, device: torch.device) -> bool:
    """Whether mma_m64_kernel's SPLIT parts of an output tile sum in a thread-block cluster: `_cluster_sum_runs` with
    its 4 x column groups accumulators on 256 threads, 64 activation rows per program, and the sums' slots beside
    the B windows in static shared memory."""
    values = 4 * _mma_column_groups(m)
    return (tile_m == MMA_M64_B_ROWS and _cluster_sum_runs(split, values, 256, programs, device)
            and cluster_sum_bytes(values, split) + m64_exchange_buffer(True)[0] <= MMA_CLUSTER_SHARED_BYTES)


def _mma_gemv_values(row_groups: int, col_groups: int) -> int:
    """fp32 accumulators per thread of mma_gemv_kernel: 4 per row group and column group."""
    return 4 * row_groups * col_groups


def _mma_gemv_cluster(split: int, values: int, programs: int, device: torch.device) -> bool:
    """Whether mma_gemv_kernel's SPLIT parts of a row of programs sum in a thread-block cluster (`MMA_GEMV_CLUSTER`):
    sm_90 and `_cluster_sum_runs` with its `values` accumulators on 128 threads."""
    return _has_wgmma(device) and _cluster_sum_runs(split, values, 128, programs, device)


def _mma_pdl_by_plan(pdl: bool | None, a, b: QTensor, m: int, windows: int) -> bool:
    """PDL as the options give it, or where they leave it to the plan (None) on, but off for E8M0-scaled fp4 / fp8
    activations on fp4 weights at 1 < M <= MMA_WARP_M whose programs run more than MMA_PDL_MX_ACT_MAX_WINDOWS
    windows each."""
    if pdl is not None:
        return pdl
    mx_act = isinstance(a, QTensor) and a.fmt.scale_encoding == "e8m0" and b.fmt.is_packed
    return not (mx_act and 1 < m <= MMA_WARP_M and windows > MMA_PDL_MX_ACT_MAX_WINDOWS)


def _mma_pdl(plan: SplitKPlan) -> bool:
    """Whether an mma plan's kernel waits for the grid before it (its PDL) and so launches with PDL."""
    return plan.consts[MMA_PDL_CONST] > 0


# CLUSTER's place among the constexprs of the two mma kernels (the tails of `_mma_plan`)
MMA_M64_CLUSTER_CONST, MMA_GEMV_CLUSTER_CONST = -3, -7


def _mma_cluster_size(plan: SplitKPlan) -> int:
    """CTAs per thread-block cluster of an mma plan's launch: its split where it sums in clusters, else 1."""
    return plan.split if plan.consts[MMA_M64_CLUSTER_CONST if plan.m_pad > MMA_WARP_M else MMA_GEMV_CLUSTER_CONST] else 1


def mma_kernel(m: int):
    """The mma kernel that runs M rows of activations."""
    from .mma_gemv import mma_gemv_kernel, mma_m64_kernel  # here, not per call: 1.3-2 us of the wrapper's 8-10 (README)

    return mma_m64_kernel if m > MMA_WARP_M else mma_gemv_kernel


def _mma_operands(plan: SplitKPlan, a, b: QTensor, bias, out) -> tuple:
    """The mma kernels' tensor arguments as stored, in their order: the activation (data, scale codes, post-scale;
    bf16: itself, `out` and 1), the weights' words, factors and post-scale, bias (or `out`), `out`, workspace and
    tickets (or `out`)."""
    factors, post = b.kernel_mma_factors
    ws, tickets = plan.workspace or (out, out)
    if isinstance(a, QTensor):  # predecoded: the plan's bf16 rows, the global scale still a's
        x, xs = (plan.predecode.rows, out) if plan.predecode is not None else (a.data, a.kernel_scale)
        x_post = a.kernel_global_scale if a.global_scale is not None else _one(b.device)
    else:
        x, xs, x_post = a, out, _one(b.device)
    return x, xs, x_post, b.kernel_words, factors, post, bias if bias is not None else out, out, ws, tickets


def _mma_args(plan: SplitKPlan, operands: tuple, out) -> tuple:
    """The kernel's arguments from `_mma_operands`: all flat, the activation as int64 words, then the plan's
    constants."""
    flat = out.view(-1)
    x, xs, *rest = operands
    return (x.view(torch.int64).view(-1), flat if xs is out else xs.view(-1), *(flat if t is out else t for t in rest),
            *plan.consts)


def _mma_run(key, plan: SplitKPlan, a, b: QTensor, bias, out):
    """Launch one call of an mma plan. After the plan's first direct launch its `DirectLaunch` is bound to these
    operands' positions, and later calls launch with their addresses alone (`DirectLaunch.launch_addresses`): no
    views, no Helion host function."""
    if plan.predecode is not None:
        plan = _predecode_run(key, plan, a)
    operands = _mma_operands(plan, a, b, bias, out)
    if _launch_bound(plan, operands):
        return out
    args = _mma_args(plan, operands, out)
    if plan.launch is None:
        plan = _LAUNCHES[key] = plan._replace(launch=_compile(mma_kernel(plan.m_pad), args, plan.cfg, out.device,
                                                              _mma_cluster_size(plan), _mma_pdl(plan)))
    _launch_and_bind(plan, args, len(operands))
    return out


def _predecode_run(key, plan: SplitKPlan, a: QTensor) -> SplitKPlan:
    """Decode activation `a` into the plan's bf16 rows (`Predecode`), launched from the operands' addresses once bound,
    as `_mma_run`; returns the plan, compiled."""
    pre = plan.predecode
    operands = (a.data, a.kernel_scale, pre.rows)
    if _launch_bound(pre, operands):
        return plan
    from .dequantize import dequantize_args, dequantize_config, dequantize_kernel  # not on the bound path above

    args = dequantize_args(a, pre.rows)
    if pre.launch is None:
        pre = pre._replace(launch=_compile(dequantize_kernel, args, dequantize_config(a), pre.rows.device))
        plan = _LAUNCHES[key] = plan._replace(predecode=pre)
    _launch_and_bind(pre, args, len(operands))
    return plan


def _launch_bound(plan: SplitKPlan | Predecode, operands) -> bool:
    """Launch a compiled plan's kernel from the operands' addresses alone where its `DirectLaunch` is bound to them
    (`DirectLaunch.launch_addresses`); False, launching nothing, where it is not (then `_launch_and_bind`)."""
    direct = _direct_launch(plan)
    return direct is not None and direct.launch_addresses([t.data_ptr() for t in operands])


def _launch_and_bind(plan: SplitKPlan | Predecode, args, count: int) -> None:
    """Launch a compiled plan's kernel with all its arguments, then bind its `DirectLaunch` (if any) to the first
    `count` of them, the caller's tensors, so that `_launch_bound` launches the next calls."""
    plan.launch(*args)
    direct = _direct_launch(plan)
    if direct is not None:
        direct.bind(args[:count])


def _direct_launch(plan: SplitKPlan | Predecode) -> DirectLaunch | None:
    """The `DirectLaunch` of a compiled plan's launcher (`_compile`; None before it or off CUDA)."""
    return plan.launch.keywords["_launcher"] if isinstance(plan.launch, functools.partial) else None


def _layout(x) -> str | None:
    return x.layout if isinstance(x, QTensor) else None
