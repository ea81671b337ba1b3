"""Pure-torch quantizers and dequantizers (OCP MX v1.0 and NVFP4), CPU or GPU.

Operation order follows torchao 0.18 (`to_mx`, `nvfp4_quantize`) so the outputs match it
bit for bit; the deliberate differences are listed in the README and pinned by tests:
- RCEIL rounds the scale exponent up from the fp32 bit fields (exactly what the hardware
  `cvt.rp.satfinite.ue8m0x2.f32` does); torchao's eager fallback takes ceil(log2(.)) in
  fp32, which rounds some values just above a power of two down (|log2| > ~2^-24 ulp).
- NaN elements encode as fp4 code 0 / E4M3 0x7F (either sign bit); their block's scale is NaN (E8M0 255 / E4M3 0x7F),
  so the whole block dequantizes to NaN either way.
- nvfp4 on an all-zero tensor takes global scale 1.0 (torchao divides 0 by 0 -> NaN).
"""

from __future__ import annotations

import torch

from blockscaled.formats import BlockFormat, get_format
from blockscaled.layouts import to_layout

from .codecs import E8M0_BIAS, E8M0_NAN, decode_elements, decode_scales, encode_e2m1, pack_fp4

F32_MIN_NORMAL = 2.0**-126
E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6
SCALE_ROUNDINGS = ("floor", "rceil")


def _check_input(x: torch.Tensor, fmt: BlockFormat) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x: expected float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D [rows, K] tensor, got shape {tuple(x.shape)}")
    if x.shape[1] % fmt.block_size or x.shape[1] == 0:
        raise ValueError(f"x: K={x.shape[1]} must be a positive multiple of the {fmt.name} block size {fmt.block_size}")


def _e4m3_canonical_nan(x: torch.Tensor) -> torch.Tensor:
    """float32 (|x| <= 448 or NaN) -> float8_e4m3fn, NaN as 0x7F whatever its sign bit (x86 makes inf / inf -NaN,
    CUDA +NaN)."""
    codes = torch.where(torch.isnan(x), 0x7F, x.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32))
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def _encode_elements(scaled: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Scaled float32 values (already clamped) -> stored element data."""
    if fmt.element == "e2m1":
        return pack_fp4(encode_e2m1(scaled))
    return _e4m3_canonical_nan(scaled)


def mx_scale_floor(amax: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """OCP MX v1.0 scale: 2^(floor(log2(amax)) - emax), from the fp32 exponent field."""
    unbiased = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - fmt.elem_emax
    code = (unbiased.clamp(-E8M0_BIAS, E8M0_BIAS + 1) + E8M0_BIAS).to(torch.uint8)
    return torch.where(torch.isnan(amax), E8M0_NAN, code).to(torch.uint8)


def mx_scale_rceil(amax: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Scale 2^ceil(log2(amax / elem_max)), saturating; NaN -> 255, Inf -> 254."""
    descale = amax / fmt.elem_max
    bits = descale.view(torch.int32)
    exp_field = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    # normal d = 2^(e-127) * 1.m: e - 127, plus one unless m == 0. subnormal d = m * 2^-149
    # < 2^-126: -126 above 2^-127 (m > 2^22), else <= -127 (clamped below anyway).
    subnormal = torch.where(mantissa > 0x400000, -126, -127)
    ceil_log2 = torch.where(exp_field == 0, subnormal, exp_field - 127 + (mantissa != 0).to(torch.int32))
    code = (ceil_log2.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).to(torch.uint8)
    code = torch.where(torch.isinf(descale), 254, code)
    return torch.where(torch.isnan(descale), E8M0_NAN, code).to(torch.uint8)


def _quantize_mx(x: torch.Tensor, fmt: BlockFormat, scale_rounding: str):
    rows, k = x.shape
    blocks = x.to(torch.float32).reshape(rows, k // fmt.block_size, fmt.block_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    if scale_rounding == "floor":
        code = mx_scale_floor(amax, fmt)
        scale = (code.to(torch.int32) << 23).view(torch.float32).clamp(min=F32_MIN_NORMAL)
        scaled = blocks / scale
    else:
        code = mx_scale_rceil(amax, fmt)
        reciprocal = torch.exp2(E8M0_BIAS - code.to(torch.float32))
        reciprocal = torch.where(code == 0, 1.0, reciprocal)
        reciprocal = torch.where(code == 254, 2.0**-127, reciprocal)
        reciprocal = torch.where(code == E8M0_NAN, torch.nan, reciprocal)
        scaled = blocks * reciprocal
    scaled = scaled.clamp(-fmt.elem_max, fmt.elem_max).reshape(rows, k)
    return _encode_elements(scaled, fmt), code.reshape(rows, k // fmt.block_size).view(torch.float8_e8m0fnu), None


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor fp32 scale amax / (6 * 448); 1.0 for an all-zero tensor (and for one with no rows: a batch of no
    tokens)."""
    amax = x.to(torch.float32).abs().amax() if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    return torch.where(amax == 0, 1.0, amax / (6.0 * E4M3_MAX)).to(torch.float32)


def _quantize_nvfp4(x: torch.Tensor, fmt: BlockFormat, global_scale):
    rows, k = x.shape
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    blocks = x.to(torch.float32).reshape(rows, k // fmt.block_size, fmt.block_size)
    block_scale = blocks.abs().amax(dim=-1) / fmt.elem_max
    scale_fp8 = _e4m3_canonical_nan((block_scale / global_scale).clamp(E4M3_MIN_NORMAL, E4M3_MAX))
    reciprocal = (1.0 / global_scale) / scale_fp8.to(torch.float32)
    scaled = (blocks * reciprocal.unsqueeze(-1)).clamp(-fmt.elem_max, fmt.elem_max)
    return _encode_elements(scaled.reshape(rows, k), fmt), scale_fp8, global_scale


def check_quantize_args(x, fmt, scale_rounding: str, global_scale) -> BlockFormat:
    """The format descriptor of `fmt`, once `x`, `scale_rounding` and `global_scale` are checked against it (a
    tensor global scale is not read: that would wait on the device)."""
    fmt = get_format(fmt)
    if not fmt.is_scaled:
        raise ValueError(f"fmt: {fmt.name!r} is not a block-scaled format")
    _check_input(x, fmt)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding: expected one of {SCALE_ROUNDINGS}, got {scale_rounding!r}")
    if global_scale is None:
        return fmt
    if not fmt.global_scale:
        raise ValueError(f"global_scale: {fmt.name} has no global scale")
    if isinstance(global_scale, torch.Tensor):
        if global_scale.numel() != 1 or not global_scale.is_floating_point():
            raise ValueError(f"global_scale: expected one float value, got a {global_scale.dtype} tensor of shape "
                             f"{tuple(global_scale.shape)}")
        if global_scale.device != x.device and global_scale.device.type != "cpu":
            raise ValueError(f"global_scale: on {global_scale.device}, x on {x.device}; expected one device")
    elif not isinstance(global_scale, (int, float)) or not 0 < global_scale < float("inf"):
        raise ValueError(f"global_scale: expected a finite number > 0 or a one-element tensor, got {global_scale!r}")
    return fmt


def quantize(
    x: torch.Tensor,
    fmt: str | BlockFormat,
    *,
    scale_rounding: str = "floor",
    layout: str = "rowmajor",
    global_scale: torch.Tensor | float | None = None,
    data_layout: str = "k_order",
):
    """Quantize a [rows, K] float tensor to a `QTensor`.

    mxfp4/mxfp8: OCP MX v1.0 with `scale_rounding` "floor" (the spec's
    2^(floor(log2 amax) - emax)) or "rceil" (2^ceil(log2(amax / elem_max)), no
    saturation of the largest element). nvfp4: two-level, E4M3 block scales per 16 over
    an fp32 `global_scale` (default amax / (6 * 448)); `scale_rounding` does not apply.
    `layout` is the scale layout; `data_layout` the element order ("mma_m16k16" for the mma
    kernels' weights).
    """
    from blockscaled.qtensor import QTensor

    fmt = check_quantize_args(x, fmt, scale_rounding, global_scale)
    if fmt.global_scale:
        data, scale, g = _quantize_nvfp4(x, fmt, global_scale)
    else:
        data, scale, g = _quantize_mx(x, fmt, scale_rounding)
    q = QTensor(data, to_layout(scale, layout), fmt, layout, g, (x.shape[0], x.shape[1]))
    return q.with_data_layout(data_layout)


def dequantize(q, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """QTensor -> [rows, K] values = element * block scale (* global scale), in `dtype`.

    Each product is computed in float64, where it is exact, then rounded once to `dtype`.
    """
    fmt = q.fmt
    rows, k = q.shape
    elems = decode_elements(q.data_k_order(), fmt.element).to(torch.float64)
    scales = decode_scales(q.scale_rowmajor(), fmt.scale_encoding).to(torch.float64)
    values = elems.reshape(rows, k // fmt.block_size, fmt.block_size) * scales.unsqueeze(-1)
    if fmt.global_scale:
        values = values * q.global_scale.to(torch.float64)
    return values.reshape(rows, k).to(dtype)
