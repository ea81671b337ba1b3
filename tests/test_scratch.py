"""`kernels/scratch.py` without a GPU: which calls share a scratch set (the GPU runs test_concurrency_gpu.py)."""

import types

import pytest
import torch

from blockscaled.kernels import scratch
from blockscaled.kernels.scratch import ScratchSpec

CUDA = torch.device("cuda", 0)
SPEC = ScratchSpec(sums=8, tickets=2, rows=(2, 4, 16))


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream and capture queries answered by `state` (stream handle, capture id or None); every set
    made is a fresh object."""
    state = types.SimpleNamespace(stream=11, capture=None, made=0, inductor=False)

    def make(spec, device):
        state.made += 1
        return scratch.Scratch(object(), object(), object())

    monkeypatch.setattr(scratch, "_make", make)
    monkeypatch.setattr(scratch, "_make_outside_pools", make)
    monkeypatch.setattr(scratch, "_inductor_recording", lambda device, stream: state.inductor)
    monkeypatch.setattr(scratch, "_current_stream", lambda device: state.stream)
    monkeypatch.setattr(scratch, "_capturing", lambda: state.capture is not None)
    monkeypatch.setattr(scratch, "capture_id", lambda stream: state.capture if state.capture != "unreadable" else None)
    scratch.clear()
    yield state
    scratch.clear()


def test_eager_calls_share_a_set_per_stream_and_plan(fake_cuda):
    first = scratch.get("plan", SPEC, CUDA)
    assert scratch.get("plan", SPEC, CUDA) is first  # the same stream runs calls in order
    fake_cuda.stream = 12
    other_stream = scratch.get("plan", SPEC, CUDA)
    assert other_stream is not first
    assert scratch.get("other plan", SPEC, CUDA) not in (first, other_stream)
    fake_cuda.stream = 11
    assert scratch.get("plan", SPEC, CUDA) is first
    assert fake_cuda.made == 3


def test_captures_get_sets_of_their_own(fake_cuda):
    eager = scratch.get("plan", SPEC, CUDA)
    fake_cuda.capture = 1
    g1 = scratch.get("plan", SPEC, CUDA)
    assert g1 is not eager and scratch.get("plan", SPEC, CUDA) is g1  # calls in one graph run in order
    fake_cuda.capture = 2  # a second graph, captured on the same stream: never the first's set
    g2 = scratch.get("plan", SPEC, CUDA)
    assert g2 not in (eager, g1)
    fake_cuda.stream = 12  # a fork inside capture 2
    assert scratch.get("plan", SPEC, CUDA) not in (eager, g1, g2)
    fake_cuda.capture, fake_cuda.stream = None, 11
    assert scratch.get("plan", SPEC, CUDA) is eager


def test_capture_sets_are_kept_up_to_a_byte_bound_then_fresh_per_call(fake_cuda, monkeypatch):
    """A capture's set is never dropped (its graph may replay any time): past CAPTURE_BYTES, and where the capture id
    cannot be read, every call gets a fresh set (from the graph's pool, zeroed by a memset in the graph)."""
    monkeypatch.setattr(scratch, "CAPTURE_BYTES", 3 * scratch._nbytes(SPEC))
    kept = []
    for c in range(3):
        fake_cuda.capture = c
        kept.append(scratch.get("plan", SPEC, CUDA))
    fake_cuda.capture = 3
    made = fake_cuda.made
    assert scratch.get("plan", SPEC, CUDA) is not scratch.get("plan", SPEC, CUDA)
    assert fake_cuda.made == made + 2
    for c in range(3):  # none of the earlier captures lost its set
        fake_cuda.capture = c
        assert scratch.get("plan", SPEC, CUDA) is kept[c]
    fake_cuda.capture = "unreadable"
    assert scratch.get("plan", SPEC, CUDA) is not scratch.get("plan", SPEC, CUDA)
    assert fake_cuda.made == made + 4


def test_inductor_recording_gets_fresh_sets(fake_cuda):
    """CUDA-graph trees check that nothing in their pool outlives the graph's outputs: no kept set while recording."""
    fake_cuda.capture, fake_cuda.inductor = 7, True
    assert scratch.get("plan", SPEC, CUDA) is not scratch.get("plan", SPEC, CUDA)
    assert not scratch._captured


def test_inductor_recording_is_false_without_inductor(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert scratch._inductor_recording(CUDA, 11) is False


def test_inductor_trees_are_told_by_their_stream(monkeypatch):
    """The trees' manager captures on a stream of its own; a capture on any other stream keeps its sets."""
    import sys

    manager = types.SimpleNamespace(stream=types.SimpleNamespace(cuda_stream=99))
    trees = types.SimpleNamespace(get_manager=lambda index, create_if_none_exists: manager)
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    assert scratch._inductor_recording(CUDA, 99) is True
    assert scratch._inductor_recording(CUDA, 11) is False
    manager = None
    assert scratch._inductor_recording(CUDA, 99) is False


def test_set_bytes():
    assert scratch._nbytes(SPEC) == 4 * (8 + 2) + 2 * 2 * 4 * 16


def test_cpu_sets_are_made_per_call_with_zeroed_sums():
    work = scratch.get("plan", SPEC, torch.device("cpu"))
    assert work.workspace.dtype == torch.float32 and work.workspace.shape == (8,) and not work.workspace.any()
    assert work.tickets.dtype == torch.int32 and not work.tickets.any()
    assert work.rows.shape == (2, 4, 16) and work.rows.dtype == torch.bfloat16
    assert scratch.get("plan", ScratchSpec(rows=(1, 2, 16)), torch.device("cpu")).workspace is None


def test_capture_id_is_none_without_a_driver(monkeypatch):
    monkeypatch.setattr(scratch, "_get_capture_info", False)
    assert scratch.capture_id(0) is None
