"""Per-call scratch memory of a plan: split-K workspaces, tickets, predecoded activation rows.

A plan (pair, shape, layouts, device) is shared by every call that has its key, and calls can
overlap on the GPU: two Python threads, two streams, two CUDA graphs replayed side by side.
So no scratch tensor belongs to a plan. `Scratch.get` hands out tensors owned by the *stream*
the call is enqueued on, and while a CUDA graph is being captured by the *capture*:

| where the call runs            | tensors                                        | zeroed                           |
|--------------------------------|------------------------------------------------|----------------------------------|
| eager, stream s                | one set per (plan, s), kept, outside any pool  | once, when made; kernels leave 0 |
| capture c, stream s            | one set per (plan, c, s), from c's pool, kept  | by a memset captured at first use|
| capture, id not readable;      | fresh per call, from the graph's pool          | by a memset captured per call    |
| inductor's CUDA-graph trees;   |                                                |                                  |
| kept sets over CAPTURE_BYTES   |                                                |                                  |

Work on one stream runs in order, so calls that share a set never overlap; two graphs never
share a set, and a graph's memset re-zeroes its set on every replay before the first kernel
that reads it (the kernels leave it zero for the next call in that graph). A capture's set is
never dropped (were its block reused by a later capture sharing the pool, replays could
overlap), so kept sets are bounded by bytes.

Eager sets are made in a helper thread: while inductor's CUDA-graph trees ("reduce-overhead")
warm up they route every allocation of the calling thread into the graph's pool and require
that nothing there outlive the graph's outputs (`check_memory_pool`); a set kept in that pool
failed it. While they record, calls get fresh sets for the same reason.

Host cost: two raw queries (current stream, capturing) and one dict lookup per call that has
scratch; the capture rows add `cuStreamGetCaptureInfo` (at capture only, so nothing at replay).
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from typing import NamedTuple

import torch


class ScratchSpec(NamedTuple):
    """What one call of a plan needs: float32 sums and int32 tickets that are zero on entry (the kernel leaves them
    zero), and bf16 activation rows (written before they are read)."""

    sums: int = 0
    tickets: int = 0
    rows: tuple[int, ...] | None = None


class Scratch(NamedTuple):
    workspace: torch.Tensor | None
    tickets: torch.Tensor | None
    rows: torch.Tensor | None


# Bytes of sets kept for captures (never freed); past it a call's set is fresh with a memset in its graph (correct,
# a memset more per call at replay). A set is M x N x 4 bytes of sums and tickets (+ M x K x 2 of predecoded rows),
# one per plan (shape) per graph: a decode graph of Llama-3-70B at M = 16 keeps 4 sets, 3 MB of sums.
CAPTURE_BYTES = 1 << 30

_eager: dict[tuple, Scratch] = {}
_captured: dict[tuple, Scratch] = {}
_captured_bytes = 0
_lock = threading.Lock()


def _make(spec: ScratchSpec, device: torch.device) -> Scratch:
    ws = torch.zeros(spec.sums, dtype=torch.float32, device=device) if spec.sums else None
    tickets = torch.zeros(spec.tickets, dtype=torch.int32, device=device) if spec.tickets else None
    rows = torch.empty(spec.rows, dtype=torch.bfloat16, device=device) if spec.rows else None
    return Scratch(ws, tickets, rows)


def _nbytes(spec: ScratchSpec) -> int:
    rows = 2 * math.prod(spec.rows) if spec.rows else 0
    return 4 * (spec.sums + spec.tickets) + rows


def _make_outside_pools(spec: ScratchSpec, device: torch.device) -> Scratch:
    """A set made, zeroed and synchronized in a helper thread on its own stream: outside the memory pool that
    inductor's CUDA-graph trees route this thread's allocations to while they warm up. Never during a capture: a
    global-mode capture (torch.cuda.graph's default) is invalidated by another thread's allocation or sync."""
    box: dict = {}

    def work():
        try:
            with torch.cuda.device(device):
                stream = torch.cuda.Stream(device)
                with torch.cuda.stream(stream):
                    box["set"] = _make(spec, device)
                stream.synchronize()
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            box["error"] = e

    helper = threading.Thread(target=work, name="blockscaled-scratch")
    helper.start()
    helper.join()
    if "error" in box:
        raise box["error"]
    return box["set"]


def get(key: tuple, spec: ScratchSpec, device: torch.device) -> Scratch:
    """The scratch of one call of plan `key` on the current stream of `device` (see the module's table)."""
    global _captured_bytes
    if device.type != "cuda":
        return _make(spec, device)
    stream = _current_stream(device)
    if not _capturing():
        found = _eager.get((key, stream))
        if found is None:
            with _lock:
                found = _eager.get((key, stream))
                if found is None:
                    found = _eager[(key, stream)] = _make_outside_pools(spec, device)
        return found
    capture = capture_id(stream)
    if capture is None or _inductor_recording(device, stream):
        return _make(spec, device)
    slot = (key, capture, stream)
    with _lock:
        found = _captured.get(slot)
        if found is None:
            if _captured_bytes + _nbytes(spec) > CAPTURE_BYTES:
                return _make(spec, device)
            found = _captured[slot] = _make(spec, device)  # its memset is captured: it runs at every replay
            _captured_bytes += _nbytes(spec)
    return found


def _inductor_recording(device: torch.device, stream: int) -> bool:
    """Whether inductor's CUDA-graph trees ("reduce-overhead") are capturing on `stream`: they require that nothing
    in their pool outlive the graph's outputs (`check_memory_pool`), so a kept set is refused there. Told by the
    stream (the trees capture on their manager's own; its `in_recording` turns true only after the capture)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:
        manager = trees.get_manager(device.index if device.index is not None else torch.cuda.current_device(),
                                    create_if_none_exists=False)
        return manager is not None and manager.stream.cuda_stream == stream
    except Exception:  # noqa: BLE001 - inductor internals that moved: no kept set, which is always correct
        return True


def _current_stream(device: torch.device) -> int:
    """The handle of the current stream of `device` (the raw query: `torch.cuda.current_stream` builds an object)."""
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def _capturing() -> bool:
    return torch._C._cuda_isCurrentStreamCapturing()


def clear() -> None:
    """Drop every kept set (tests; memory): no graph captured before may replay afterwards."""
    global _captured_bytes
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the sets were used on other streams than the one they were made on
    with _lock:
        _eager.clear()
        _captured.clear()
        _captured_bytes = 0


_get_capture_info = None


def capture_id(stream: int) -> int | None:
    """The id of the capture under way on `stream` (unique in the process), from the driver's
    `cuStreamGetCaptureInfo`; None where it cannot be read."""
    global _get_capture_info
    if _get_capture_info is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuStreamGetCaptureInfo  # the first three parameters are the same in every version
        except (OSError, AttributeError):
            _get_capture_info = False
            return None
        fn.restype = ctypes.c_int
        _get_capture_info = fn
    if _get_capture_info is False:
        return None
    status, ident = ctypes.c_int(0), ctypes.c_uint64(0)
    null = ctypes.c_void_p(0)
    err = _get_capture_info(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(ident), null, null, null, null)
    return int(ident.value) if err == 0 and status.value == 1 else None  # 1: CU_STREAM_CAPTURE_STATUS_ACTIVE
