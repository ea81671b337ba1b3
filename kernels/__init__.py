"""Helion kernels (`blockscaled.kernels`)."""
