"""The fp64 oracle every kernel test diffs against."""

from __future__ import annotations

import torch

from .quantize import dequantize


def _operand_f64(x, name: str) -> torch.Tensor:
    from blockscaled.qtensor import QTensor

    if isinstance(x, QTensor):
        return dequantize(x, torch.float64)
    if isinstance(x, torch.Tensor) and x.dim() == 2:
        return x.to(torch.float64)
    raise TypeError(f"{name}: expected a QTensor or a 2-D tensor, got {type(x).__name__}")


def scaled_mm(a, b, out_dtype: torch.dtype = torch.float64, bias: torch.Tensor | None = None) -> torch.Tensor:
    """C = dequant(a) @ dequant(b)^T (+ bias) in float64, cast to `out_dtype`.

    a: QTensor or tensor [M, K]; b: QTensor or tensor [N, K]. Global scales are part of
    `dequantize`. Never calls a kernel or torch._scaled_mm.
    """
    a64, b64 = _operand_f64(a, "a"), _operand_f64(b, "b")
    if a64.shape[1] != b64.shape[1]:
        raise ValueError(f"b: K={b64.shape[1]} does not match a's K={a64.shape[1]}")
    out = a64 @ b64.T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out.to(out_dtype)


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (DESIGN.md section 5); inf when out has NaN/Inf where ref has none."""
    out64, ref64 = out.to(torch.float64), ref.to(torch.float64)
    denom = ref64.abs().max().clamp(min=torch.finfo(torch.float64).tiny)
    err = (out64 - ref64).abs()
    err = torch.where(torch.isnan(ref64) & torch.isnan(out64), 0.0, err)
    return float(torch.nan_to_num(err, nan=float("inf")).max() / denom)
