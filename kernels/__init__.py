"""Helion kernels (`blockscaled.kernels`): one public entry, `scaled_mm`."""

from .api import OUT_DTYPES, SUPPORTED_PAIRS, scaled_mm, select_backend

__all__ = ["OUT_DTYPES", "SUPPORTED_PAIRS", "scaled_mm", "select_backend"]
