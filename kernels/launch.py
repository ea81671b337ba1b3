"""Launching a compiled Helion kernel without Triton's per-call argument binding.

Triton's `JITFunction.run` binds and re-specializes every argument and looks the kernel up
on each call. For one `scaled_mm` cache key (dtypes, shapes, device and config fixed) the
only part of that specialization that can still change is the tensors' 16-byte alignment,
so `DirectLaunch` checks that and calls the CompiledKernel's launcher directly, optionally in
thread-block clusters (which Triton launches only for kernels compiled for several CTAs).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, NamedTuple

import torch
from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.runtime import driver

from helion.runtime import default_launcher


def interpreted() -> bool:
    """Whether Triton runs kernels through its interpreter (TRITON_INTERPRET=1, read by Triton at each launch): the only
    way the kernels take CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def device_error(name: str, t: torch.Tensor) -> str | None:
    """Why the kernels cannot take argument `name` on its device, or None: a CPU tensor reaching a compiled launch
    fails inside Triton's launcher ("Pointer argument ... cannot be accessed"), which names no argument."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted()):
        return None
    return (f"{name}: on {t.device}; the kernels run on a CUDA GPU, or on the CPU through Triton's interpreter "
            "(TRITON_INTERPRET=1)")


# Kernels with global scratch (Helion's device-side tensor descriptors: 128 bytes a CTA) launched directly too, the
# scratch allocated per launch from torch's caching allocator on the current stream as Triton's launcher does, instead
# of Triton's per-call path (10-25 us more host time a call, H200 machine). Off until a GPU run checks it: the tuned
# mxfp8 quantize configs (`kernels/tuned/nvidia_h200.json`) are the kernels it concerns.
DIRECT_SCRATCH = False
# torch's caching allocator hands out blocks aligned to 512 bytes
SCRATCH_ALIGN = 512


def _scratch(nbytes: int, device: int) -> torch.Tensor:
    """Global scratch for one launch (what Helion's Triton allocator makes for Triton's launcher)."""
    return torch.empty(nbytes, dtype=torch.int8, device=torch.device("cuda", device))


def _no_launch_hooks() -> bool:
    """Whether no launch hook is set (Triton 3.6 keeps them as empty HookChains)."""
    return all(hook is None or getattr(hook, "calls", None) == []
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class Launcher(NamedTuple):
    """What a direct launch passes Triton's C launcher besides the grid, the stream and the kernel's arguments."""
    launch: Callable  # Triton's C `launch`
    function: Any  # the CUfunction handle
    cooperative: bool
    pdl: int  # the programmatic stream serialization flag
    metadata: tuple  # (num_warps, CTAs per cluster, shared memory bytes)
    scratch: int = 0  # global scratch bytes a CTA, allocated per launch (DIRECT_SCRATCH)


class DirectLaunch:
    """A Helion `_launcher` for one cache key: the first call compiles and launches through
    Triton's JIT; later calls with the same alignment of every tensor argument, on the same
    current device, launch the kernel it returned directly. Anything else (launch hooks of a
    profiler, pre-run hooks, Helion launch options, another alignment or device) takes
    Triton's path. Direct launches pass each tensor as its address, without Triton's check that the
    address is device memory: the caller's tensors must be on the GPU (`scaled_mm` checks). With
    `cluster` > 1 the direct launches run consecutive programs of the grid's first dimension (a multiple
    of `cluster`) as thread-block clusters of that many CTAs; Triton's launches run without clusters, so
    such a kernel must be correct both ways. With `pdl` the direct launches are programmatic dependent launches
    (the programmatic stream serialization attribute): the kernel may start before the one ahead of it in the stream
    has finished, so it must execute `griddepcontrol.wait` before touching memory that kernel may write (the mma
    kernels' PDL); Triton's launches run without the attribute, where that wait returns at once."""

    def __init__(self, cluster: int = 1, pdl: bool = False):
        self.cluster = cluster
        self.pdl = pdl
        self.kernel = None
        self.device = None
        self.aligned = None
        self.launcher: Launcher | None = None
        self.triton_kernel = None
        self.last = None  # (grid, the tensor arguments' ids (None for others), their values) of the direct call just made
        self.grid = None
        self.sources = None  # each tensor argument's position among the caller's tensors, None for others (`bind`)
        self.constants = None  # the values of the other arguments (Helion's block sizes passed as arguments), by position

    def __call__(self, triton_kernel, grid, *args, num_warps, num_stages, **kwargs):
        # each tensor as its address: given a tensor, Triton's launcher calls its data_ptr() and cuPointerGetAttribute
        # on it, which the direct launch skips (the operands' devices were checked by `scaled_mm`)
        self.last = None
        values = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        aligned = tuple(v % 16 == 0 for v, a in zip(values, args) if isinstance(a, torch.Tensor))
        if kwargs or not self._applies(triton_kernel, aligned):
            kernel = default_launcher(triton_kernel, grid, *args, num_warps=num_warps, num_stages=num_stages, **kwargs)
            if (self.kernel is None and not kwargs and isinstance(kernel, CompiledKernel)
                    and len(args) == len(getattr(triton_kernel, "params", ()))):
                kernel._init_handles()
                run = kernel.run  # Triton's CudaLauncher: its C `launch` takes the PDL flag per call
                scratch = run.global_scratch_size  # profile scratch: only Triton's call allocates it
                if not run.profile_scratch_size and (not scratch or DIRECT_SCRATCH
                                                     and run.global_scratch_align <= SCRATCH_ALIGN):
                    self.kernel, self.device, self.aligned = kernel, driver.active.get_current_device(), aligned
                    self.triton_kernel = triton_kernel
                    num_warps, _, shared = kernel.packed_metadata  # (num_warps, num_ctas, shared): the launcher's clusters
                    self.launcher = Launcher(run.launch, kernel.function, run.launch_cooperative_grid, int(self.pdl),
                                             (num_warps, self.cluster, shared), scratch)
            return kernel
        self._run(grid, values)
        self.last = grid, tuple(id(a) if isinstance(a, torch.Tensor) else None for a in args), values
        return self.kernel

    def _applies(self, triton_kernel, aligned) -> bool:
        """Whether a direct launch of `triton_kernel` with tensors of this alignment applies now: compiled, the same
        alignment, no pre-run hook, no launch hook, the same current device."""
        return (self.kernel is not None and aligned == self.aligned and not getattr(triton_kernel, "pre_run_hooks", None)
                and _no_launch_hooks() and driver.active.get_current_device() == self.device)

    def prefix(self, grid, stream, scratch: int | None = None) -> tuple:
        """The C launcher's arguments before the kernel's: grid (in clusters), stream, function, cooperative, PDL, global
        scratch (an address, or none) and profile scratch (none), packed metadata, launch metadata and hooks (none)."""
        _, function, cooperative, pdl, metadata, _ = self.launcher
        return (grid[0] // self.cluster, *grid[1:], *(1,) * (3 - len(grid)), stream, function, cooperative, pdl,
                scratch, None, metadata, None, None, None)

    def _run(self, grid, values):
        # the scratch tensor lives until the launch is queued; the allocator reuses its block only in stream order
        scratch = _scratch(math.prod(grid) * self.launcher.scratch, self.device) if self.launcher.scratch else None
        self.launcher.launch(*self.prefix(grid, driver.active.get_current_stream(self.device),
                                          None if scratch is None else scratch.data_ptr()), *values)

    def bind(self, tensors) -> None:
        """Right after a direct launch, given the caller's tensors of that call (in the caller's order, before the
        Helion host function): map each tensor argument of the kernel to the first of them that is the same object and
        has the address it was launched with, and keep the other arguments' values (integers the host function passes,
        fixed for the cache key), so that `launch_addresses` launches with the tensors' addresses alone. Not bound
        where the last call was not a direct launch or a tensor argument is not among them (one the host function
        made)."""
        if self.last is None or self.sources is not None:
            return
        (grid, ids, values), self.last = self.last, None
        positions = {}
        for i, t in enumerate(tensors):
            positions.setdefault(id(t), i)
        sources = tuple(None if i is None else positions.get(i, -1) for i in ids)
        if -1 not in sources and all(tensors[s].data_ptr() == v for s, v in zip(sources, values) if s is not None):
            self.grid, self.sources, self.constants = grid, sources, values

    def launch_addresses(self, addresses) -> bool:
        """Launch the bound kernel (`bind`) with `addresses`, the caller's tensors' data pointers in `bind`'s order,
        skipping the Helion host function and the per-argument work of `__call__`; False, launching nothing, where
        the direct launch does not apply now (not bound, another alignment, a launch or pre-run hook, another
        device): the caller then calls as usual."""
        if self.sources is None:
            return False
        values = tuple(c if i is None else addresses[i] for i, c in zip(self.sources, self.constants))
        if not self._applies(self.triton_kernel, tuple(v % 16 == 0 for v, i in zip(values, self.sources) if i is not None)):
            return False
        self._run(self.grid, values)
        return True
