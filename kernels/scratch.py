"""Per-call scratch memory of a plan: split-K workspaces, tickets, predecoded activation rows.

A plan (pair, shape, layouts, device) is shared by every call that has its key, and calls can
overlap on the GPU: two Python threads, two streams, two CUDA graphs replayed side by side.
So no scratch tensor belongs to a plan. `Scratch.get` hands out tensors owned by the *stream*
the call is enqueued on, and while a CUDA graph is being captured by the *capture*:

| where the call runs         | tensors                                      | zeroed                            |
|-----------------------------|----------------------------------------------|-----------------------------------|
| eager, stream s             | one set per (plan, s), kept                  | once, when made; kernels leave 0  |
| capture c, stream s         | one set per (plan, c, s), from c's pool      | by a memset captured at first use |
| capture, id not readable    | fresh per call                               | by a memset captured per call     |

Work on one stream runs in order, so calls that share a set never overlap; two graphs never
share a set, and a graph's memset re-zeroes its set on every replay before the first kernel
that reads it (the kernels leave it zero for the next call in that graph). Dropping a capture's
set at any time is safe: later calls of that capture get a new zeroed set, and the freed block
returns to the graph's pool in stream order, as any intermediate tensor does.

Host cost: two raw queries (current stream, capturing) and one dict lookup per call that has
scratch; the capture rows add `cuStreamGetCaptureInfo` (at capture only, so nothing at replay).
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
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


# Sets kept for captures; more are made anew (correct, one more memset in that graph).
CAPTURE_SETS = 32

_eager: dict[tuple, Scratch] = {}
_captured: OrderedDict[tuple, Scratch] = OrderedDict()
_lock = threading.Lock()


def _make(spec: ScratchSpec, device: torch.device) -> Scratch:
    ws = torch.zeros(spec.sums, dtype=torch.float32, device=device) if spec.sums else None
    tickets = torch.zeros(spec.tickets, dtype=torch.int32, device=device) if spec.tickets else None
    rows = torch.empty(spec.rows, dtype=torch.bfloat16, device=device) if spec.rows else None
    return Scratch(ws, tickets, rows)


def get(key: tuple, spec: ScratchSpec, device: torch.device) -> Scratch:
    """The scratch of one call of plan `key` on the current stream of `device` (see the module's table)."""
    if device.type != "cuda":
        return _make(spec, device)
    stream = _current_stream(device)
    if not _capturing():
        found = _eager.get((key, stream))
        if found is None:
            with _lock:
                found = _eager.setdefault((key, stream), _make(spec, device))
        return found
    capture = capture_id(stream)
    if capture is None:
        return _make(spec, device)
    slot = (key, capture, stream)
    with _lock:
        found = _captured.get(slot)
        if found is None:
            found = _captured[slot] = _make(spec, device)  # the memset is captured: it runs at every replay
            while len(_captured) > CAPTURE_SETS:
                _captured.popitem(last=False)
        else:
            _captured.move_to_end(slot)
    return found


def _current_stream(device: torch.device) -> int:
    """The handle of the current stream of `device` (the raw query: `torch.cuda.current_stream` builds an object)."""
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def _capturing() -> bool:
    return torch._C._cuda_isCurrentStreamCapturing()


def clear() -> None:
    """Drop every kept set (tests; memory)."""
    with _lock:
        _eager.clear()
        _captured.clear()


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
