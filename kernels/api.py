"""Public entry point: `scaled_mm`, validation, backend choice by device capability."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import NamedTuple

import torch

import helion

from blockscaled.formats import BlockFormat
from blockscaled.layouts import pad_to, to_layout
from blockscaled.qtensor import QTensor

from . import configs, cute_mm, plans, scratch, tuned
from .decode import operand_codes
from .launch import DirectLaunch, device_error
from .plans import (MMA_PAIRS, MmaOptions, MmaPlan, Predecode, _aligned, _mma_cluster_size, _mma_pdl,
                   _mma_plan, _options_of, mma_kernel, mma_options_for)

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
    if why := device_error("b", b.data):
        raise ValueError(why)
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


def _bytes_spanned(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses `t`'s elements lie in (strides as given; nothing for an empty tensor)."""
    if t.numel() == 0:
        return 0, 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _overlap(out: torch.Tensor, a, b: QTensor, bias) -> str | None:
    """Why `out` cannot receive the result: it shares memory with an operand, which the kernels read while they write
    (a wrong result, not an error, if let through)."""
    lo, hi = _bytes_spanned(out)
    operands = [("b", b.data), ("b", b.scale), ("bias", bias)]
    operands += [("a", a.data), ("a", a.scale)] if isinstance(a, QTensor) else [("a", a)]
    for name, t in operands:
        if t is not None and t.device == out.device:
            t_lo, t_hi = _bytes_spanned(t)
            if t_lo < hi and lo < t_hi:
                return f"out: shares memory with {name}, which the kernels read while writing out; pass a separate tensor"
    return None


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
        g = x.kernel_global_scale if x.global_scale is not None else _one(device)
        return Operand(x.data, x.kernel_scale, g, x.fmt, x.layout)
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
    activation_format: str | None = None,
    scale_rounding: str = "floor",
    activation_global_scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """C[M, N] = global_a * global_b * dequant(a) @ dequant(b)^T (+ bias).

    a: QTensor [M, K] (k_order) or a bf16 tensor (W4A16 / W8A16); b: QTensor [N, K]
    (nn.Linear weights), fastest as `blockscaled.quantize_weight` or `QTensor.for_device`
    prepare it. Any M >= 0 (no rows: an empty result, nothing launched), N >= 1; K a multiple of the formats'
    block sizes (checked by QTensor).
    `out` (optional) receives the result. `config`: for the mma kernels a dict of plan keys
    (`_mma_options` lists them and refuses any other), else a Helion config. `backend` ("mma",
    "dense", "dequant", "dot_scaled", "dot_scaled_cdna4", "cute") overrides the choice by device and layout; "dense"
    (weights decoded to bf16, then cuBLAS; the default from DENSE_MIN_M rows on) takes a config dict of
    `dense.PLAN_KEYS`; "cute" (nvfp4 x nvfp4 on sm_100 through Helion's CuTe backend and its tcgen05 block-scaled plan, bf16 x
    nvfp4 as per-lane CuTe code, `kernels/cute_mm.py`; needs `helion[cute]`; not run on a GPU yet) takes no config.
    Calls may overlap (threads, streams, CUDA graphs): no call shares mutable memory with
    another that can run at the same time (`kernels/scratch.py`).

    With `activation_format` ("nvfp4", "mxfp4", "mxfp8") `a` is the float activation (bf16, fp16 or fp32 [M, K]),
    quantized on every call as `blockscaled.quantize(a, activation_format, scale_rounding=scale_rounding,
    global_scale=activation_global_scale)` would (nvfp4: its global scale computed on the device unless given, a
    checkpoint's `input_scale`): the same codes and scales, then the GEMM. On the mma kernels the quantize kernel
    writes the quantized activation already decoded to bf16 (element x block scale, exact) for their
    bf16-activation plan, the global scale applied in their epilogue: one launch before the GEMM.
    """
    with on_device(b.device if isinstance(b, QTensor) else None):
        return _scaled_mm(a, b, out_dtype, bias, out, config, backend, activation_format, scale_rounding,
                          activation_global_scale)


def on_device(device: torch.device | None):
    """The context that makes `device` current for a call's launches: Triton and Helion launch on the current device
    and its current stream (and `scratch` keys its buffers by that stream), so a call on another GPU than the current
    one (a model split over GPUs) runs under `torch.cuda.device(device)`; otherwise nothing (one device lookup)."""
    if device is not None and device.type == "cuda" and device.index is not None and (
            device.index != torch.cuda.current_device()):
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _scaled_mm(a, b, out_dtype, bias, out, config, backend, activation_format, scale_rounding,
               activation_global_scale) -> torch.Tensor:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
    a_post = None
    if activation_format is not None:
        a, a_post = _quantized_activation(a, b, activation_format, scale_rounding, activation_global_scale, backend)
    elif activation_global_scale is not None or scale_rounding != "floor":
        raise ValueError("scale_rounding, activation_global_scale: they apply only with activation_format")
    pair, m, n, k = _check_args(a, b, out_dtype, bias)
    device = b.device
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    elif out.shape != (m, n) or out.dtype != out_dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous {out_dtype} tensor of shape ({m}, {n}) on {device}")
    elif why := _overlap(out, a, b, bias):
        raise ValueError(why)
    if m == 0:  # a batch of no tokens (nn.Linear takes one): nothing to launch
        return out
    if backend is None and pair == "nvfp4xnvfp4" and cute_mm.cute_default(device):
        backend = "cute"
    if backend == "cute":
        if config is not None:
            raise ValueError(f"config: backend 'cute' takes none (its plan is `cute_mm.CUTE_CONFIG`), got {config!r}")
        return cute_mm.cute_scaled_mm(a, b, bias, out)
    if b.data_layout == "mma_m16k16":
        if backend == "dense" or (backend is None and _mma_runs(pair, a, device) and _dense_runs(pair, m, n, device)):
            if pair not in MMA_PAIRS or not _mma_activation(a):
                raise ValueError(f"backend: 'dense' runs {MMA_PAIRS} with k_order activations; got {pair}")
            from .dense import dense_mm

            return dense_mm(a, b, m, n, k, out_dtype, bias, out, config, a_post)
        if backend in (None, "mma") and _mma_runs(pair, a, device):
            backend = "mma"
        elif backend == "mma":
            raise ValueError(f"backend: 'mma' runs {MMA_PAIRS} on NVIDIA sm_80+ with k_order activations; got {pair} "
                             f"on {device}")
        else:  # CPU, other GPUs, or a backend asked for by name: the other kernels read the k_order copy
            b = b.k_order_copy
    elif backend in ("mma", "dense"):
        raise ValueError(f"backend: {backend!r} reads weights in the 'mma_m16k16' data layout; b is {b.data_layout!r} "
                         "(prepare them with blockscaled.quantize_weight or QTensor.for_device)")
    elif backend is None:
        _warn_k_order_weights(device)
    if backend is None:
        backend = select_backend(device)
        if backend != "dequant" and pair in DEQUANT_ONLY_PAIRS:
            backend = "dequant"
    if backend == "mma":
        return _mma_call(pair, a, b, m, n, k, out_dtype, bias, out, config, a_post)
    if config is not None and not isinstance(config, helion.Config):
        raise TypeError(f"config: backend {backend!r} takes a helion.Config (plan dicts are the 'mma' and 'dense' "
                        f"backends'), got {type(config).__name__} {config!r}")
    a_parts, b_parts = _parts(a, device), _parts(b, device)
    bias_t = bias if bias is not None else out
    key = (backend, pair, m, n, k, _layout(a), b.layout, b.data_layout, out_dtype, None if bias is None else bias.dtype, device, config)
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
BACKENDS = ("dequant", "mma", "dense", "dot_scaled", "dot_scaled_cdna4", "cute")


def weight_data_layout(device: torch.device | str) -> str:
    """The data layout of weights whose fastest kernel on `device` is the mma decode kernel:
    "mma_m16k16" on NVIDIA sm_80 .. sm_90 (Ampere, Ada, Hopper), else "k_order" (the CPU
    interpreter, AMD, and Blackwell, whose native block-scaled MMA reads k_order operands)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return "mma_m16k16" if plans._ptx_decodes(device) and (8, 0) <= plans._capability(device) < (10, 0) else "k_order"


_checked_k_order = set()  # devices whose first k_order weights were checked (`_warn_k_order_weights`)


def _warn_k_order_weights(device: torch.device) -> None:
    """Once per device, at its first call with k_order weights: warn where the mma kernels would run (those weights
    take the portable kernels instead)."""
    if device in _checked_k_order:
        return
    _checked_k_order.add(device)
    if weight_data_layout(device) == "mma_m16k16":
        warnings.warn(f"b: k_order weights on {device} take the portable kernels; weights prepared with "
                      "blockscaled.quantize_weight (or QTensor.for_device) take the mma kernels, 3x faster at decode",
                      stacklevel=3)


def _quantized_activation(x, b, fmt_name: str, scale_rounding: str, global_scale, backend: str | None):
    """`scaled_mm`'s float activation `x` quantized to `fmt_name`: (bf16 rows of element x block scale, the global
    scale [1]) where the mma kernels will run, else (the QTensor, None)."""
    from blockscaled.formats import FORMATS
    from blockscaled.reference.quantize import check_quantize_args

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"a: with activation_format, a is the float activation [M, K], got {type(x).__name__}")
    if fmt_name not in FORMATS or not FORMATS[fmt_name].is_scaled:
        raise ValueError(f"activation_format: expected one of 'nvfp4', 'mxfp4', 'mxfp8' or None, got {fmt_name!r}")
    if not isinstance(b, QTensor):
        raise TypeError(f"b: expected a QTensor (weights [N, K]), got {type(b).__name__}")
    if (fmt_name, b.fmt.name) not in SUPPORTED_PAIRS:
        pairs = ", ".join(f"{x} x {y}" for x, y in SUPPORTED_PAIRS if x != "bf16")
        raise ValueError(f"activation_format: {fmt_name} activations on {b.fmt.name} weights are not supported; "
                         f"supported pairs: {pairs}")
    if x.dim() == 2 and x.shape[1] != b.shape[1]:
        raise ValueError(f"b: K={b.shape[1]} does not match a's K={x.shape[1]}")
    if x.device != b.device:  # before the quantize kernel, which runs on b's device
        raise ValueError(f"b: on {b.device}, a on {x.device}; expected one device")
    try:
        fmt = check_quantize_args(x, fmt_name, scale_rounding, global_scale)
    except (TypeError, ValueError) as e:  # the same checks as blockscaled.quantize, naming scaled_mm's argument
        raise type(e)(str(e).replace("x:", "a:", 1)) from None
    pair = SUPPORTED_PAIRS[fmt_name, b.fmt.name]
    # Decoded rows wherever the mma kernels run, M = 1 included: quantizing mxfp8 to codes there (the fp8-activation
    # plan) ran 20.5 us against the rows' 20.3 (H200, 8192^2, bench/results/h200_activation_codes_direct_scratch_ab_*).
    rows = backend == "dense" or backend in (None, "mma") and _mma_runs(pair, x, x.device)
    if b.data_layout == "mma_m16k16" and rows:
        from .quantize import quantize_decoded

        return quantize_decoded(x, fmt, scale_rounding, global_scale)
    from blockscaled.weights import quantize

    return quantize(x, fmt, scale_rounding=scale_rounding, global_scale=global_scale), None


def _mma_call(pair, a, b: QTensor, m, n, k, out_dtype, bias, out, config, a_post=None):
    """The mma kernel on weights stored "mma_m16k16", padding included (`QTensor.stored_shape`): an activation whose K
    the weights pad gets zero columns, and where they pad N the kernel writes [M, stored N] and the first N columns
    are copied out (one more launch; only for N % 128 != 0 or K % 64 != 0)."""
    n_run, k_run = b.stored_shape
    if k_run != k:
        a = _pad_k(a, k_run)
    if n_run == n:
        return _mma_launch(pair, a, b, m, n, k_run, out_dtype, bias, out, config, a_post)
    bias = None if bias is None else torch.nn.functional.pad(bias, (0, n_run - n))
    full = torch.empty((m, n_run), dtype=out_dtype, device=out.device)
    _mma_launch(pair, a, b, m, n_run, k_run, out_dtype, bias, full, config, a_post)
    return out.copy_(full[:, :n])


def _mma_launch(pair, a, b: QTensor, m, n, k, out_dtype, bias, out, config, a_post=None):
    """`a_post`: a bf16 activation's post-scale ([1] fp32: a quantized activation's global scale), else 1. Without
    a config, the GPU's tuned table's (`tuned.config_for`) where it has one that this shape takes."""
    gpu = _tuned_gpu(b.device) if config is None and b.device.type == "cuda" else None
    options = _tuned_options(gpu, pair, a, b, m, n, k) if gpu is not None else None
    if options is None:
        options = mma_options_for(config, a, b, m, n)
    key = ("mma", pair, m, n, k, _layout(a), out_dtype, None if bias is None else bias.dtype, b.device, options)
    plan = _LAUNCHES.get(key) or _mma_plan(a, b, bias is not None, m, n, k, options)
    return _mma_run(key, plan, a, b, bias, out, a_post)


def _tuned_options(gpu: str, pair: str, a, b: QTensor, m: int, n: int, k: int) -> MmaOptions | None:
    """The options of the GPU's tuned config for this call (`tuned.config_for`), None where the table has none or
    the shape refuses its config (a neighbour's split above K / 64, ...): the default plan then."""
    narrow = isinstance(a, QTensor)
    return _tuned_options_of(gpu, pair, m, n, k, narrow, not b.fmt.is_packed, _aligned(a, m))


@functools.lru_cache(maxsize=4096)
def _tuned_options_of(gpu: str, pair: str, m: int, n: int, k: int, narrow: bool, fp8_weights: bool,
                      aligned: bool) -> MmaOptions | None:
    """`_tuned_options` once per cell: a given config's checks run ~6 us of Python, on every call of a tuned shape
    before this cache (2-core CPU machine)."""
    config = tuned.config_for(gpu, pair, m, n, k)
    if config is None:
        return None
    try:
        options = _options_of(config, m, n, narrow, fp8_weights, aligned)
    except ValueError:
        return None
    return options if options.split <= k // 64 else None


plans.OPTION_CACHES.append(_tuned_options_of)


def _pad_k(a, k: int):
    """Activation `a` [M, K0] with zero elements appended up to K (scales of the new blocks: code 0, any value would do)."""
    if not isinstance(a, QTensor):
        return pad_to(a, a.shape[0], k)
    f = a.fmt
    data = pad_to(a.data.view(torch.uint8), a.rows, f.data_cols(k)).view(f.storage_dtype)
    scales = pad_to(a.scale_rowmajor().view(torch.uint8), a.rows, k // f.block_size).view(f.scale_dtype)
    return QTensor(data, to_layout(scales, a.layout), f, a.layout, a.global_scale)


def _compile(kernel, args, cfg, device: torch.device, cluster: int = 1, pdl: bool = False):
    """The compiled launcher of one cache key; on CUDA it launches through `DirectLaunch`
    after its first call (Triton's per-call argument binding skipped; in clusters of `cluster` CTAs; with `pdl`
    as a programmatic dependent launch)."""
    launch = kernel.bind(args).compile_config(cfg)
    return functools.partial(launch, _launcher=DirectLaunch(cluster, pdl)) if device.type == "cuda" else launch


def _launch_cached(cache: dict, key, kernel, args, config, device: torch.device, pdl: bool = False) -> None:
    """Launch `kernel(*args)` through the launcher `cache` holds for `key`, compiled (`_compile`) with `config()` at
    its first call: the pre-pass kernels' one path (quantize, dense decode, activation decode, decode attention);
    `pdl`: as a programmatic dependent launch (the kernel waits for the one before it: `launch.DirectLaunch`)."""
    launch = cache.get(key)
    if launch is None:
        launch = cache[key] = _compile(kernel, args, config(), device, pdl=pdl)
    launch(*args)


@functools.lru_cache(maxsize=None)
def _tuned_gpu(device: torch.device) -> str | None:
    """The GPU's key in `kernels/tuned/`, None where it has no table (then a call costs this one lookup)."""
    key = tuned.gpu_key(torch.cuda.get_device_name(device))
    return key if tuned.table(key) or tuned.rules(key) or tuned.quantize_table(key) else None


def _mma_runs(pair: str, a, device: torch.device) -> bool:
    return pair in MMA_PAIRS and _mma_activation(a) and plans._ptx_decodes(device) and plans._capability(device) >= (8, 0)


# The dense plan (`dense.py`: weights decoded to bf16, then cuBLAS) from DENSE_MIN_M activation rows on. H200, 8192^2,
# x cuBLAS bf16, mma_m64 / dense (bench/results/h200_bench_m256_8192_dense_mma_n8192_k8192_08d5118_2026-11-28.log):
# M = 256 0.50-0.59 / 0.26-0.54 (the decode pass costs more than the in-loop decode), M = 512 0.43-0.52 / 0.62-0.66.
# Below DENSE_MIN_M_SIXTEEN_WARPS, mma_m64_kernel's 16-warp tile instead where it runs (wgmma, N % 256 == 0) and its
# N / 256 x M / 128 programs (one an SM) fill SIXTEEN_WARPS_MIN_WAVE .. 1 wave: 8192^2, M = 512 (128 programs on 132
# SMs) 16 warps / dense 0.67-0.81 / 0.69-0.76x over the 7 pairs (6 won); M = 768 (192 programs) 0.53-0.66 /
# 0.79-0.87x; M = 1024 0.79-0.80 / 0.83-0.88x (bench/results/h200_warps16_mid_m_8192_{de6264b,
# all_pairs_9d7b1c0}_2026-11-29.log). Under 3/4 of a wave is unmeasured (at M = 256, 64 programs ran 0.62-0.71x).
DENSE_MIN_M = 512
DENSE_MIN_M_SIXTEEN_WARPS = 1024
SIXTEEN_WARPS_MIN_WAVE = 0.75


def _dense_runs(pair: str, m: int, n: int, device: torch.device) -> bool:
    """Whether `scaled_mm` takes the dense plan by default (on a GPU where the mma kernels run)."""
    if m < DENSE_MIN_M:
        return False
    programs = plans._m64_sixteen_warps_programs(m, n)
    return not (programs and m < DENSE_MIN_M_SIXTEEN_WARPS and plans._has_wgmma(device)
                and SIXTEEN_WARPS_MIN_WAVE <= programs / plans._sm_count(device) <= 1)


def _mma_activation(a) -> bool:
    """Whether the mma kernel reads this activation: bf16, or fp4 / fp8 with k_order data."""
    return not isinstance(a, QTensor) or a.data_layout == "k_order"


def _mma_operands(plan: MmaPlan, a, b: QTensor, bias, out, work: scratch.Scratch | None, a_post=None) -> tuple:
    """The mma kernels' tensor arguments as stored, in their order: the activation (data, scale codes, post-scale;
    bf16: itself, `out` and 1), the weights' words, factors and post-scale, bias (or `out`), `out`, workspace and
    tickets (this call's scratch, or `out`)."""
    factors, post = b.kernel_mma_factors
    ws, tickets = (work.workspace, work.tickets) if work is not None and work.workspace is not None else (out, out)
    if isinstance(a, QTensor):  # predecoded: this call's bf16 rows, the global scale still a's
        x, xs = (work.rows, out) if plan.predecode is not None else (a.data, a.kernel_scale)
        x_post = a.kernel_global_scale if a.global_scale is not None else _one(b.device)
    else:
        x, xs, x_post = a, out, _one(b.device) if a_post is None else a_post
    return x, xs, x_post, b.kernel_words, factors, post, bias if bias is not None else out, out, ws, tickets


def _mma_args(plan: MmaPlan, operands: tuple, out) -> tuple:
    """The kernel's arguments from `_mma_operands`: all flat, the activation as int64 words, then the plan's
    constants."""
    flat = out.view(-1)
    x, xs, *rest = operands
    return (x.view(torch.int64).view(-1), flat if xs is out else xs.view(-1), *(flat if t is out else t for t in rest),
            *plan.consts)


def _work(key, plan: MmaPlan, device: torch.device) -> scratch.Scratch | None:
    """This call's scratch of `plan` (`scratch.get`), None for a plan that needs none."""
    return scratch.get(key, plan.workspace, device) if plan.workspace is not None else None


def _mma_run(key, plan: MmaPlan, a, b: QTensor, bias, out, a_post=None):
    """Launch one call of an mma plan. After the plan's first direct launch its `DirectLaunch` is bound to these
    operands' positions, and later calls launch with their addresses alone (`DirectLaunch.launch_addresses`): no
    views, no Helion host function. Workspace, tickets and predecoded rows are this call's (`scratch.get`: per
    stream, per CUDA-graph capture), never the plan's: calls of one plan may overlap."""
    work = _work(key, plan, out.device)
    if plan.predecode is not None:
        plan = _predecode_run(key, plan, a, work.rows)
    operands = _mma_operands(plan, a, b, bias, out, work, a_post)
    if _launch_bound(plan, operands):
        return out
    args = _mma_args(plan, operands, out)
    if plan.launch is None:
        plan = _LAUNCHES[key] = plan._replace(launch=_compile(mma_kernel(plan.m), args, plan.cfg, out.device,
                                                              _mma_cluster_size(plan), _mma_pdl(plan)))
    _launch_and_bind(plan, args, len(operands))
    return out


def _predecode_run(key, plan: MmaPlan, a: QTensor, rows: torch.Tensor) -> MmaPlan:
    """Decode activation `a` into `rows` (this call's bf16 scratch, `Predecode`), launched from the operands' addresses
    once bound, as `_mma_run`; returns the plan, compiled."""
    pre = plan.predecode
    operands = (a.data, a.kernel_scale, rows)
    if _launch_bound(pre, operands):
        return plan
    from .dequantize import dequantize_args, dequantize_config, dequantize_kernel  # not on the bound path above

    args = dequantize_args(a, rows)
    if pre.launch is None:
        pre = pre._replace(launch=_compile(dequantize_kernel, args, dequantize_config(a), rows.device))
        plan = _LAUNCHES[key] = plan._replace(predecode=pre)
    _launch_and_bind(pre, args, len(operands))
    return plan


def _launch_bound(plan: MmaPlan | Predecode, operands) -> bool:
    """Launch a compiled plan's kernel from the operands' addresses alone where its `DirectLaunch` is bound to them
    (`DirectLaunch.launch_addresses`); False, launching nothing, where it is not (then `_launch_and_bind`)."""
    direct = _direct_launch(plan)
    return direct is not None and direct.launch_addresses([t.data_ptr() for t in operands])


def _launch_and_bind(plan: MmaPlan | Predecode, args, count: int) -> None:
    """Launch a compiled plan's kernel with all its arguments, then bind its `DirectLaunch` (if any) to the first
    `count` of them, the caller's tensors, so that `_launch_bound` launches the next calls."""
    plan.launch(*args)
    direct = _direct_launch(plan)
    if direct is not None:
        direct.bind(args[:count])


def _direct_launch(plan: MmaPlan | Predecode) -> DirectLaunch | None:
    """The `DirectLaunch` of a compiled plan's launcher (`_compile`; None before it or off CUDA)."""
    return plan.launch.keywords["_launcher"] if isinstance(plan.launch, functools.partial) else None


def _layout(x) -> str | None:
    return x.layout if isinstance(x, QTensor) else None
