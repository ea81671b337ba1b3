"""The quantized-tensor container: data, scales, format, scale layout, global scale."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .formats import BlockFormat, get_format
from blockscaled.layouts import (
    arrange_mma_codes,
    check_data_layout,
    element_codes,
    factor_bytes,
    from_layout,
    mma_stored_shape,
    pad_to,
    padded_scale_shape,
    stored_scale_shape,
    zero_scale_codes,
    to_layout,
    unarrange_mma_m16k16,
)
from blockscaled.layouts.mma import ELEMENTS


@dataclass(frozen=True)
class QTensor:
    """A block-scaled matrix of logical shape [rows, K] (weights follow nn.Linear: [N, K]).

    data:         fp4: uint8 [rows, K // 2], even-K element in the low nibble (view as
                  torch.float4_e2m1fn_x2 freely); mxfp8: float8_e4m3fn [rows, K]; in
                  k_order (above) unless `data_layout` says otherwise ("mma_m16k16" bytes
                  are bit-placed codes, not values: read them with `data_k_order()`).
    scale:        float8_e8m0fnu (mx) or float8_e4m3fn (nvfp4), stored in `layout`.
    fmt:          the format descriptor (or its name).
    layout:       "rowmajor", "swizzle_32_4_4", "cdna4_16" or "cdna4_32".
    global_scale: float32 scalar tensor for nvfp4, None otherwise.
    shape:        the logical (rows, K); `scale` always describes exactly this shape.
    data_layout:  element order, "k_order" (above) or "mma_m16k16" (fp4 and fp8: the
                  tensor-core decode kernel's weights, `blockscaled.layouts.mma`).
    stored_shape: the (rows, K) that `data` holds: `shape`, except "mma_m16k16" data, which
                  holds `mma_stored_shape(shape)` (rows to a multiple of 128, K of 64), the
                  padding all zero codes, so that any N and K take the mma kernels.
    """

    data: torch.Tensor
    scale: torch.Tensor
    fmt: BlockFormat
    layout: str = "rowmajor"
    global_scale: torch.Tensor | None = None
    shape: tuple[int, int] | None = None
    data_layout: str = "k_order"
    stored_shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        fmt = get_format(self.fmt)
        object.__setattr__(self, "fmt", fmt)
        if not fmt.is_scaled:
            raise ValueError(f"fmt: QTensor needs a block-scaled format, got {fmt.name!r}; pass bf16 as a plain tensor")
        padded_scale_shape(self.layout, 1, 1)  # raises on an unknown layout name
        if not isinstance(self.data, torch.Tensor) or self.data.dim() != 2:
            raise ValueError(f"data: expected a 2-D tensor, got {_describe(self.data)}")
        if self.data.dtype != fmt.storage_dtype:
            raise TypeError(f"data: {fmt.name} data must be {fmt.storage_dtype}, got {self.data.dtype}")
        check_data_layout(self.data_layout)
        stored_rows, cols = self.data.shape
        stored_k = cols * 2 if fmt.is_packed else cols
        if self.shape is None:
            object.__setattr__(self, "shape", (stored_rows, stored_k))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        rows, k = self.shape
        if k % fmt.block_size:
            raise ValueError(f"data: K={k} must be a multiple of the {fmt.name} block size {fmt.block_size}")
        stored = mma_stored_shape(rows, k) if self.data_layout == "mma_m16k16" else (rows, k)
        object.__setattr__(self, "stored_shape", stored)
        if (stored_rows, stored_k) != stored:
            raise ValueError(f"data: shape {tuple(self.data.shape)} does not hold logical {self.shape} in {fmt.name} "
                             f"{self.data_layout} (stored [rows, K] {list(stored)})")
        if not isinstance(self.scale, torch.Tensor):
            raise TypeError(f"scale: expected a tensor, got {type(self.scale).__name__}")
        if self.scale.dtype != fmt.scale_dtype:
            raise TypeError(f"scale: {fmt.name} scales must be {fmt.scale_dtype}, got {self.scale.dtype}")
        want = stored_scale_shape(self.layout, rows, k // fmt.block_size)
        if tuple(self.scale.shape) != want:
            raise ValueError(f"scale: layout {self.layout!r} needs shape {want} for data {self.shape}, got {tuple(self.scale.shape)}")
        if self.scale.device != self.data.device:
            raise ValueError(f"scale: on {self.scale.device}, data on {self.data.device}; expected one device")
        if fmt.global_scale:
            g = self.global_scale
            if not isinstance(g, torch.Tensor) or g.numel() != 1 or g.dtype != torch.float32:
                raise ValueError(f"global_scale: {fmt.name} needs a float32 scalar tensor, got {_describe(g)}")
            if g.device != self.data.device:
                raise ValueError(f"global_scale: on {g.device}, data on {self.data.device}; expected one device")
        elif self.global_scale is not None:
            raise ValueError(f"global_scale: {fmt.name} has no global scale, got {_describe(self.global_scale)}")

    @functools.cached_property
    def kernel_scale(self) -> torch.Tensor:
        """The scales as kernels index them: raw bytes (kernels decode the bit fields),
        [rows, K // block] for rowmajor, the flat stored buffer (what `scale_offset` indexes)
        for the other layouts. Cached: weights reach `scaled_mm` on every call, and caching
        cut its host time without the kernel launch from 28-33 us to 22-27 us per call
        (2-core CPU machine, 2026-11-22)."""
        scale = self.scale.view(torch.uint8)
        return scale if self.layout == "rowmajor" else scale.reshape(-1)

    @functools.cached_property
    def kernel_global_scale(self) -> torch.Tensor | None:
        """The global scale as kernels take it, a 1-element tensor (None without one); cached
        like `kernel_scale` (a reshape per operand and call cost ~2 us of host time)."""
        return None if self.global_scale is None else self.global_scale.reshape(1)

    @functools.cached_property
    def kernel_words(self) -> torch.Tensor:
        """"mma_m16k16" data as the mma kernels read it: flat words, one A fragment each (int32 of 8 fp4 codes,
        int64 of 8 fp8); cached like `kernel_scale` (a view per call costs ~1 us of host time)."""
        if self.data_layout != "mma_m16k16":
            raise ValueError(f"data_layout: the mma words belong to 'mma_m16k16' data, this is {self.data_layout!r}")
        return self.data.view(torch.int32 if ELEMENTS[self.fmt.element].word_bits == 32 else torch.int64).view(-1)

    @functools.cached_property
    def kernel_mma_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """"mma_m16k16" weights: (factor bytes as int16 words, float32 [1] post-scale =
        2^shift * global scale), see `blockscaled.layouts.mma`. Computed once per weight."""
        if self.data_layout != "mma_m16k16":
            raise ValueError(f"data_layout: the mma factors belong to 'mma_m16k16' data, this is {self.data_layout!r}")
        # the stored codes, padding included: a copy made by `dataclasses.replace` (a clone, `.to(device)`) has no
        # cached factors, and the logical codes of a padded weight are fewer than `_mma_factors` reshapes
        return self._mma_factors(element_codes(self._stored_k_order(), self.fmt.element))

    @property
    def kernel_mma_shift(self) -> int:
        """"mma_m16k16" weights: the exponent shift of their factors (the post-scale without a global scale is
        2^shift), set with `kernel_mma_factors`."""
        self.kernel_mma_factors
        return self.__dict__["kernel_mma_shift"]

    def _mma_factors(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`kernel_mma_factors` from this tensor's stored codes (`stored_shape`, padding included)."""
        rows, k = self.stored_shape
        zero = (codes.reshape(rows, -1, self.fmt.block_size) & ELEMENTS[self.fmt.element].magnitude_mask == 0).all(-1)
        scales = pad_to(self.scale_rowmajor().view(torch.uint8), rows, k // self.fmt.block_size).view(self.fmt.scale_dtype)
        stored, shift = factor_bytes(scales, self.fmt.scale_encoding, self.fmt.block_size, zero, self.fmt.element)
        self.__dict__["kernel_mma_shift"] = shift
        post = torch.full((1,), 2.0**shift, dtype=torch.float32, device=self.device)
        if self.global_scale is not None:
            post = post * self.global_scale.reshape(1)
        return stored.view(torch.int16), post

    @functools.cached_property
    def k_order_copy(self) -> QTensor:
        """This tensor with k_order data, made once: what kernels other than the mma decode
        kernel read when the weights are stored "mma_m16k16" (CPU, other GPUs, a backend named)."""
        return self.with_data_layout("k_order")

    @property
    def padded(self) -> bool:
        """Whether `data` holds zero padding beyond the logical shape (`stored_shape`)."""
        return self.stored_shape != self.shape

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def K(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.data.device

    def scale_rowmajor(self) -> torch.Tensor:
        """The logical scales [rows, K // block] regardless of the stored layout."""
        return from_layout(self.scale, self.layout, self.rows, self.K // self.fmt.block_size)

    def with_layout(self, layout: str) -> QTensor:
        """The same tensor with its scales stored in `layout` (data is shared)."""
        if layout == self.layout:
            return self
        padded_scale_shape(layout, 1, 1)
        return replace(self, scale=to_layout(self.scale_rowmajor(), layout), layout=layout)

    def _stored_k_order(self) -> torch.Tensor:
        """"mma_m16k16" data un-arranged to K order, padding kept (`stored_shape`)."""
        return unarrange_mma_m16k16(self.data, self.fmt.element).view(self.fmt.storage_dtype)

    def data_k_order(self) -> torch.Tensor:
        """The element data [rows, K] in "k_order" regardless of the stored data layout (padding dropped)."""
        if self.data_layout == "k_order":
            return self.data
        data = self._stored_k_order()
        rows, k = self.shape
        return data[:rows, : self.fmt.data_cols(k)].contiguous() if self.padded else data

    def with_data_layout(self, data_layout: str) -> QTensor:
        """The same tensor with its elements stored in `data_layout` (scales are shared).

        "mma_m16k16" is the pre-arranged weight layout of the mma kernels (most callers want
        `for_device` or `blockscaled.quantize_weight`, which choose it); arrange once per weight,
        not per call. Rows are padded to a multiple of 128 and K to one of 64 with zero codes.
        It keeps values, not codes: nvfp4 blocks of scale 0 get zero codes; it raises ValueError
        for scales its bf16 factors cannot hold (NaN, negative, E8M0 sets spanning over 2^126
        for fp4, 2^124 for fp8) and for fp8 NaN elements."""
        if data_layout == self.data_layout:
            return self
        check_data_layout(data_layout)
        data = self.data_k_order()
        if data_layout == "mma_m16k16":
            element = self.fmt.element
            rows, k = mma_stored_shape(*self.shape)
            codes = zero_scale_codes(element_codes(data, element), self.scale_rowmajor(), self.fmt.scale_encoding,
                                     self.fmt.block_size)
            codes = pad_to(codes, rows, k)
            arranged = arrange_mma_codes(codes, element).view(self.fmt.storage_dtype)
            arranged = replace(self, data=arranged, data_layout=data_layout, stored_shape=None)
            # check the scales now, and fill `kernel_mma_factors`' cache (where cached_property
            # keeps it) from the codes at hand rather than un-arranging the data again
            arranged.__dict__["kernel_mma_factors"] = arranged._mma_factors(codes)
            return arranged
        return replace(self, data=data, data_layout=data_layout, stored_shape=None)

    def for_device(self, device: torch.device | str | None = None) -> QTensor:
        """These weights on `device` (default: where they are), in the data layout the fastest
        kernel there reads (`blockscaled.kernels.weight_data_layout`): "mma_m16k16" on NVIDIA
        sm_80+, "k_order" elsewhere. Call once per weight; `data_layout` says what it chose."""
        from blockscaled.kernels import weight_data_layout

        moved = self if device is None else self.to(device)
        return moved.with_data_layout(weight_data_layout(moved.device))

    def to(self, device: torch.device | str) -> QTensor:
        g = None if self.global_scale is None else self.global_scale.to(device)
        return replace(self, data=self.data.to(device), scale=self.scale.to(device), global_scale=g)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from blockscaled.reference import dequantize

        return dequantize(self, dtype=dtype)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})"
    return type(x).__name__
