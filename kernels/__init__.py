"""Helion kernels (`blockscaled.kernels`): one public entry, `scaled_mm`."""

from .api import BACKENDS, OUT_DTYPES, SUPPORTED_PAIRS, scaled_mm, select_backend, weight_data_layout

__all__ = ["BACKENDS", "OUT_DTYPES", "SUPPORTED_PAIRS", "scaled_mm", "select_backend", "weight_data_layout"]
