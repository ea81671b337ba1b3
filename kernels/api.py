"""Public entry point: `scaled_mm`, validation, backend choice by device capability."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from blockscaled.formats import BlockFormat
from blockscaled.qtensor import QTensor

from . import configs
from .decode import operand_codes

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


def _parts(x, device) -> Operand:
    if isinstance(x, QTensor):
        g = x.global_scale.reshape(1) if x.global_scale is not None else _one(device)
        # scales travel as raw bytes (kernels decode the bit fields); non-rowmajor layouts
        # as the flat buffer that `scale_offset` indexes
        scale = x.scale.view(torch.uint8)
        scale = scale if x.layout == "rowmajor" else scale.reshape(-1)
        return Operand(x.data, scale, g, x.fmt, x.layout)
    return Operand(x, x, _one(device), None, "rowmajor")


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
    `out` (optional) receives the result; `config` overrides the default Helion config.
    """
    pair, m, n, k = _check_args(a, b, out_dtype, bias)
    device = b.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    elif out.shape != (m, n) or out.dtype != out_dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous {out_dtype} tensor of shape ({m}, {n}) on {device}")
    backend = backend or select_backend(device)
    if backend != "dequant" and pair in DEQUANT_ONLY_PAIRS:
        backend = "dequant"
    a_parts, b_parts = _parts(a, device), _parts(b, device)
    bias_t = bias if bias is not None else out
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
    key = (backend, pair, m, n, k, _layout(a), b.layout, out_dtype, None if bias is None else bias.dtype, device, config)
    launch = _LAUNCHES.get(key)
    if launch is None:
        cfg = config if config is not None else configs.default_config(backend, pair, m, n, k, configs.arch_key(device))
        if backend == "dequant":
            # each dot needs K >= 16: a K-mod-8 split gives each of its 8 dots g * U / 8 elements
            cfg = configs.with_min_k_groups(cfg, -(-16 // (u // 8 if split else u)))
        launch = _LAUNCHES[key] = kernel.bind(args).compile_config(cfg)
    launch(*args)
    return out


_LAUNCHES: dict[tuple, object] = {}


def _layout(x) -> str | None:
    return x.layout if isinstance(x, QTensor) else None
