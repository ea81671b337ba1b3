"""Timed providers: this project and baselines, each built once per shape, then timed."""

from __future__ import annotations

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


class Unsupported(Exception):
    """A provider that cannot run here; the message says why."""


def make_operands(pair, m, n, k, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, generator=gen, dtype=torch.float32)
    w = torch.randn(n, k, device=device, generator=gen, dtype=torch.float32)
    fa, fb = pair
    a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa, layout="swizzle_32_4_4")
    b = bs.quantize(w, fb, layout="swizzle_32_4_4")
    return x, w, a, b


def blockscaled_fn(a, b, out_dtype):
    m, n = a.shape[0], b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=b.device)
    return lambda: bs.scaled_mm(a, b, out_dtype=out_dtype, out=out)


def cublas_bf16_fn(x, w, out_dtype):
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    return lambda: torch.nn.functional.linear(xb, wb)


def scaled_mm_fp8_fn(x, w, out_dtype, kind):
    if not x.is_cuda or torch.cuda.get_device_capability() < (8, 9):
        raise Unsupported("torch._scaled_mm fp8 needs sm_89+")
    if kind == "rowwise":
        sa = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        sb = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        xa, wb = (x / sa).to(torch.float8_e4m3fn), (w / sb).to(torch.float8_e4m3fn)
        sb = sb.T.contiguous()
    else:
        m, k = x.shape
        n = w.shape[0]
        if k % 128 or n % 128:
            raise Unsupported("blockwise 1x128/128x128 needs K and N multiples of 128")
        sa = x.reshape(m, k // 128, 128).abs().amax(-1).clamp(min=1e-12) / 448
        wt = w.reshape(n // 128, 128, k // 128, 128)
        sb = wt.abs().amax((1, 3)).clamp(min=1e-12) / 448
        xa = (x.reshape(m, k // 128, 128) / sa[..., None]).reshape(m, k).to(torch.float8_e4m3fn)
        wb = (wt / sb[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
        # cuBLAS wants the 1x128 scales M-major (outer dim stride 1), 128x128 as [K/128, N/128]
        sa = sa.T.contiguous().T
        sb = sb.T.contiguous()
    odt = out_dtype if out_dtype != torch.float32 else torch.bfloat16
    try:
        torch._scaled_mm(xa, wb.T, sa, sb, out_dtype=odt)
    except Exception as e:  # noqa: BLE001 - report the library's reason
        raise Unsupported(f"torch._scaled_mm {kind}: {str(e).splitlines()[0][:120]}") from e
    return lambda: torch._scaled_mm(xa, wb.T, sa, sb, out_dtype=odt)


def gemlite_fn(x, w, pair):
    try:
        import gemlite  # noqa: F401
    except ImportError as e:
        raise Unsupported("gemlite is not installed (pip install gemlite)") from e
    raise Unsupported("gemlite is installed but its provider is not wired into this CLI yet")


def triton_dot_scaled_fn(pair):
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (10, 0):
        raise Unsupported("tl.dot_scaled is emulated on sm_90 (DESIGN.md: 110-200 TFLOP/s); timed only on sm_100+")
    raise Unsupported("no sm_100 GPU here")
