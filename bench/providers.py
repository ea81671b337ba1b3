"""Timed providers: this project and baselines, each built once per shape, then timed."""

from __future__ import annotations

import warnings

import torch

import blockscaled as bs

# --format choices -> pairs (a format, b format)
FORMAT_PAIRS = {
    "nvfp4": ("nvfp4", "nvfp4"),
    "mxfp4": ("mxfp4", "mxfp4"),
    "mxfp8": ("mxfp8", "mxfp8"),
    "mixed": ("mxfp8", "mxfp4"),
    "w4a16-nvfp4": ("bf16", "nvfp4"),
    "w4a16-mxfp4": ("bf16", "mxfp4"),
    "w8a16-mxfp8": ("bf16", "mxfp8"),
}


# Llama-3-70B linear layers (N, K), and the square 8192 reference shape
LLAMA_70B = [(10240, 8192), (57344, 8192), (8192, 28672), (8192, 8192)]
# Llama-3-8B's: fused q / k / v, the attention output, fused gate / up, down
LLAMA_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
# `--llama [70b | 8b]` of the bench commands
LLAMA_SHAPES = {"70b": LLAMA_70B, "8b": LLAMA_8B}

# (hidden, intermediate, attention heads, key / value heads, head dim) from each model's published config.json;
# Mixtral's intermediate is an expert's (its w1 / w3 fused, w2)
TRANSFORMERS = {
    "llama3-8b": (4096, 14336, 32, 8, 128), "llama3-70b": (8192, 28672, 64, 8, 128),
    "llama3-405b": (16384, 53248, 128, 8, 128), "qwen2.5-7b": (3584, 18944, 28, 4, 128),
    "qwen2.5-32b": (5120, 27648, 40, 8, 128),
    "qwen2.5-72b": (8192, 29568, 64, 8, 128), "mistral-large": (12288, 28672, 96, 8, 128),
    "mixtral-8x7b": (4096, 14336, 32, 8, 128), "mixtral-8x22b": (6144, 16384, 48, 8, 128),
}


def transformer_shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """A decoder layer's linears (N, K): fused q / k / v, the attention output, fused gate / up, down."""
    return [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * intermediate, hidden),
            (hidden, intermediate)]


# `--models NAME ...`: every linear shape of these models (#62's list). DeepSeek-V3's dense layers: its MLA
# projections (q_a, q_b: 128 heads of 128 + 64, kv_a with the 64-wide rope key, kv_b: 128 heads of 128 + 128, o) and the
# MLP of its first three layers (hidden 7168, intermediate 18432)
MODEL_SHAPES = {name: transformer_shapes(*cfg) for name, cfg in TRANSFORMERS.items()}
MODEL_SHAPES["deepseek-v3"] = [(1536, 7168), (24576, 1536), (576, 7168), (32768, 512), (7168, 16384), (36864, 7168),
                               (7168, 18432)]


def model_shapes(names) -> list[tuple[int, int]]:
    """The (N, K) shapes of `names` (MODEL_SHAPES keys), each once, in order."""
    unknown = [n for n in names if n not in MODEL_SHAPES]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; known: {', '.join(MODEL_SHAPES)}")
    return list(dict.fromkeys(shape for n in names for shape in MODEL_SHAPES[n]))


def add_llama_argument(parser, extra: str = ""):
    """`--llama` (the Llama-3-70B shapes) or `--llama 8b` (Llama-3-8B's) on a bench command's parser."""
    parser.add_argument("--llama", nargs="?", const="70b", choices=sorted(LLAMA_SHAPES),
                        help=f"the four Llama-3 linear shapes (N, K) of 70b (the default) or 8b{extra}")


def operand_bytes(fmt_name: str, rows: int, k: int) -> float:
    """Bytes one operand occupies in memory (elements + scales) for the bandwidth metric."""
    return rows * k * bs.FORMATS[fmt_name].bits_per_element() / 8


class Unsupported(Exception):
    """A provider that cannot run here; the message says why."""


def quantize_pair(pair, x, w):
    """Activations and weights of one pair: bf16 or QTensor (swizzled scales) for a, QTensor for b."""
    fa, fb = pair
    a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa, layout="swizzle_32_4_4")
    return a, bs.quantize(w, fb, layout="swizzle_32_4_4")


def make_operands(pair, m, n, k, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    # bf16 values: the activation `blockscaled_dynamic` quantizes (x in bf16) gives a's codes exactly
    x = torch.randn(m, k, device=device, generator=gen, dtype=torch.float32).to(torch.bfloat16).float()
    w = torch.randn(n, k, device=device, generator=gen, dtype=torch.float32)
    return (x, w, *quantize_pair(pair, x, w))


def weight_layouts(b):
    """The weights `b` (k_order) as each of this project's providers validates and times them (`ours_weights`), by
    `OURS_LAYOUT` name."""
    return {OURS_LAYOUT[provider]: ours_weights(provider, b) for provider in OURS_LAYOUT}


def compile_cell(pair, m, n, k, out_dtype, device):
    """Run this project's kernels once for one pair and shape (every weight layout), so that
    their compiled binaries land in Triton's on-disk cache. Nothing is checked here: the
    timing process validates every cell itself."""
    _, _, a, b = make_operands(pair, m, n, k, device, seed=0)
    for bw in weight_layouts(b).values():
        bs.scaled_mm(a, bw, out_dtype=out_dtype)
    bw = ours_weights("blockscaled", b)
    if bw.data_layout == "mma_m16k16":  # the plans the mma_plan and dense providers force
        for backend in ("mma", "dense"):
            bs.scaled_mm(a, bw, out_dtype=out_dtype, backend=backend)
    if b.data.is_cuda:
        torch.cuda.synchronize()


def blockscaled_fn(a, b, out_dtype, backend=None):
    """`scaled_mm` on the plan it picks, or on `backend` ("mma": the decode kernels at any M; "dense": weights
    decoded to bf16 then cuBLAS, the fallback any user could write)."""
    m, n = a.shape[0], b.shape[0]
    if backend == "mma" and not bs.kernels.api._mma_runs(bs.SUPPORTED_PAIRS[(_fmt(a), b.fmt.name)], a, b.device):
        raise Unsupported("the mma kernels run on NVIDIA sm_80+")
    out = torch.empty((m, n), dtype=out_dtype, device=b.device)
    return lambda: bs.scaled_mm(a, b, out_dtype=out_dtype, out=out, backend=backend)


def _fmt(a) -> str:
    return "bf16" if isinstance(a, torch.Tensor) else a.fmt.name


def dynamic_fn(x, b, fmt_name: str, out_dtype):
    """`scaled_mm` of the bf16 activation `x` quantized to `fmt_name` on every call (`activation_format`)."""
    if fmt_name == "bf16":
        raise Unsupported("bf16 activations are not quantized")
    x = x.to(torch.bfloat16)
    out = torch.empty((x.shape[0], b.shape[0]), dtype=out_dtype, device=b.device)
    return lambda: bs.scaled_mm(x, b, out_dtype=out_dtype, out=out, activation_format=fmt_name)


def cublas_bf16_fn(x, w, out_dtype):
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    return lambda: torch.nn.functional.linear(xb, wb)


def scaled_mm_fp8_fn(x, w, out_dtype, kind):
    """cuBLAS fp8 through torch._scaled_mm: rowwise, or DeepSeek-style blockwise
    (1x128 activations, 128x128 weights; sm_90 only, scales in the strides cuBLAS wants)."""
    if not x.is_cuda or torch.cuda.get_device_capability() < (8, 9):
        raise Unsupported("torch._scaled_mm fp8 needs sm_89+")
    m, k = x.shape
    n = w.shape[0]
    if kind == "rowwise":
        sa = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        sb = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        xa, wb = (x / sa).to(torch.float8_e4m3fn), (w / sb).to(torch.float8_e4m3fn)
        sb = sb.T
    else:
        if k % 512 or n % 128:
            raise Unsupported("blockwise 1x128/128x128 needs K % 512 == 0 and N % 128 == 0")
        rows = -(-m // 4) * 4  # cuBLAS wants the 1x128 scale rows in multiples of 4
        xp = torch.nn.functional.pad(x, (0, 0, 0, rows - m))
        sa = xp.reshape(rows, k // 128, 128).abs().amax(-1).clamp(min=1e-12) / 448
        wt = w.reshape(n // 128, 128, k // 128, 128)
        sb = wt.abs().amax((1, 3)).clamp(min=1e-12) / 448  # [N/128, K/128]
        xa = (xp.reshape(rows, k // 128, 128) / sa[..., None]).reshape(rows, k).to(torch.float8_e4m3fn)
        wb = (wt / sb[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
        sa = sa.t().contiguous().t()  # [M, K/128], M-major
        sb = sb.t()  # [K/128, N/128] view of the [N/128, K/128] buffer
    odt = out_dtype if out_dtype != torch.float32 else torch.bfloat16
    try:
        torch._scaled_mm(xa, wb.T, sa, sb, out_dtype=odt)
    except Exception as e:  # noqa: BLE001 - report the library's reason
        raise Unsupported(f"torch._scaled_mm {kind}: {str(e).splitlines()[0][:120]}") from e
    return lambda: torch._scaled_mm(xa, wb.T, sa, sb, out_dtype=odt)


# gemlite 0.6.0 helper class per pair (its own quantizer; a timing peer, not an accuracy one)
GEMLITE_CLASSES = {
    ("mxfp4", "mxfp4"): "A4W4_MXFP_dynamic",
    ("mxfp8", "mxfp8"): "A8W8_MXFP_dynamic",
    ("mxfp8", "mxfp4"): "A8W4_MXFP_dynamic",
    ("bf16", "mxfp4"): "A16W4_MXFP",
    ("bf16", "nvfp4"): "A16W4_NVFP",
    ("nvfp4", "nvfp4"): "A4W4_NVFP_dynamic",
}


def gemlite_fn(x, w, pair):
    try:
        from gemlite import helper
    except ImportError as e:
        raise Unsupported("gemlite is not installed (pip install gemlite)") from e
    name = GEMLITE_CLASSES.get(pair)
    if name is None:
        raise Unsupported(f"gemlite has no kernel for {pair[0]} x {pair[1]}")
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16, device=w.device)
    with torch.no_grad():
        lin.weight.copy_(w)
    xb = x.to(torch.bfloat16)
    try:
        layer = getattr(helper, name)(device=str(w.device), dtype=torch.bfloat16).from_linear(lin)
        layer(xb)
    except Exception as e:  # noqa: BLE001 - gemlite's own failure (e.g. NVFP on sm_90), reported
        raise Unsupported(f"gemlite {name}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}") from e
    return lambda: layer(xb)


# this project's providers (`python -m bench`, the TritonBench operator) by the weights they time: "default" is the
# layout `blockscaled.quantize_weight` gives on the device (`blockscaled.kernels.weight_data_layout`)
OURS_LAYOUT = {"blockscaled": "default", "blockscaled_k_order": "k_order", "blockscaled_dynamic": "default",
               "blockscaled_mma_plan": "default", "blockscaled_dense": "default"}
# the k_order provider times the portable kernels on purpose: its one-time warning would only repeat per process
warnings.filterwarnings("ignore", message="b: k_order weights on", category=UserWarning)


def ours_weights(provider, b):
    """Weights `b` (k_order) as this project's `provider` times them."""
    return b.for_device() if OURS_LAYOUT[provider] == "default" else b


def weight_bytes(b) -> torch.Tensor:
    """The bytes of QTensor `b` (data, then scales) as one flat uint8 tensor: what the weight yardsticks move."""
    return torch.cat([b.data.view(torch.uint8).reshape(-1), b.scale.view(torch.uint8).reshape(-1)])


def copy_fn(b):
    """Device-to-device copy of the weight bytes (data + scales): the bandwidth yardstick."""
    src = weight_bytes(b)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _dot_scaled_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K,
               A_FMT: tl.constexpr, B_FMT: tl.constexpr, A_DIV: tl.constexpr, B_DIV: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_A_SCALE: tl.constexpr):
        """The Triton block-scaled tutorial's loop: one tl.dot_scaled per K step, row-major
        operands, row-major E8M0 scales [rows, K/32]; A_DIV/B_DIV = elements per byte."""
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * (K // A_DIV) + (k0 // A_DIV + tl.arange(0, BK // A_DIV))[None, :], mask=rm[:, None] < M)
            b = tl.load(b_ptr + rn[:, None] * (K // B_DIV) + (k0 // B_DIV + tl.arange(0, BK // B_DIV))[None, :], mask=rn[:, None] < N)
            ks = k0 // 32 + tl.arange(0, BK // 32)
            sb = tl.load(bs_ptr + rn[:, None] * (K // 32) + ks[None, :], mask=rn[:, None] < N)
            if HAS_A_SCALE:
                sa = tl.load(as_ptr + rm[:, None] * (K // 32) + ks[None, :], mask=rm[:, None] < M)
                acc = tl.dot_scaled(a, sa, A_FMT, b.T, sb, B_FMT, acc)
            else:
                acc = tl.dot_scaled(a, None, A_FMT, b.T, sb, B_FMT, acc)
        c = c_ptr + rm[:, None] * N + rn[None, :]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    return kernel


def triton_dot_scaled_fn(a, b, out_dtype):
    """A `tl.dot_scaled` kernel like Triton's block-scaled tutorial, for the MX pairs (and
    bf16 x MX) wherever it compiles. On sm_90 Triton emulates it (upcast to bf16 + mma)."""
    if not b.data.is_cuda:
        raise Unsupported("needs a GPU")
    if b.fmt.scale_encoding != "e8m0" or (not isinstance(a, torch.Tensor) and a.fmt.scale_encoding != "e8m0"):
        raise Unsupported("tl.dot_scaled with E4M3 (nvfp4) scales does not compile on sm_90 (ANCHORS.md); MX pairs only")
    import triton

    kernel = _dot_scaled_kernel()
    m, k = a.shape
    n = b.shape[0]
    if isinstance(a, torch.Tensor):
        a_data, a_scale, a_fmt, a_div = a, a, "bf16", 1
    else:
        a_data, a_scale, a_fmt, a_div = a.data, a.scale_rowmajor().view(torch.uint8), a.fmt.element, a.fmt.elems_per_byte
    b_data, b_scale = b.data_k_order(), b.scale_rowmajor().view(torch.uint8)
    out = torch.empty((m, n), dtype=out_dtype, device=b.device)
    bm = 16 if m <= 16 else 64 if m <= 64 else 128
    grid = (triton.cdiv(m, bm), triton.cdiv(n, 128))

    def run():
        kernel[grid](a_data, a_scale, b_data, b_scale, out, m, n, k, a_fmt, b.fmt.element, a_div, b.fmt.elems_per_byte,
                     bm, 128, 128, not isinstance(a, torch.Tensor), num_warps=4 if bm < 128 else 8, num_stages=3)
        return out

    try:
        run()
    except Exception as e:  # noqa: BLE001 - Triton's compile error is the reason
        raise Unsupported(f"tl.dot_scaled {a_fmt} x {b.fmt.element}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}") from e
    return run
