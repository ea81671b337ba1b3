"""Calls of one plan that overlap on the GPU: two threads, two streams, CUDA graphs side by side.

Each case shares one weight tensor (so one plan: pair, shape, layouts, device) between two
callers with activations of their own; every result is compared with its own fp64 reference.
Before `kernels/scratch.py`, plans owned their split-K workspace and predecoded rows, and on an
H200 nvfp4 x nvfp4 at M = 64, N = K = 8192 returned 14 wrong results of 60 this way.

Only the public API (and `config` keys that name a plan family) is used, so the file also runs
against older trees.
"""

import threading

import pytest
import torch

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

pytestmark = pytest.mark.gpu

CALLS = 30
BOUND = 1e-5  # fp32 output (tests/pairs.py TOLERANCE)
N = K = 8192

# (activation format, weight format, M, config): every plan family with a workspace or a pre-pass
CASES = {
    "split_k_workspace_m64": ("nvfp4", "nvfp4", 64, {"cluster": False, "predecode": False}),
    "predecode_m64": ("nvfp4", "nvfp4", 64, None),  # the default: predecode, then split-K in clusters
    "split_k_workspace_m32_mixed": ("mxfp8", "mxfp4", 32, {"cluster": False}),
    "split_k_workspace_m16": ("bf16", "mxfp4", 16, {"max_split": 8, "cluster": False}),
    "split_k_workspace_m1": ("bf16", "nvfp4", 1, {"max_split": 16, "cluster": False}),
    # every window's words loaded before the first mma ("preload"), split-K parts of 4 windows in the workspace
    "preload_split_k_workspace_m1": ("bf16", "nvfp4", 1, {"preload": True, "split": 32, "cluster": False}),
    # split-K in parts that differ by a window (128 windows / 3), as the rules split K / 64 that 8 does not divide
    "uneven_split_m16": ("nvfp4", "nvfp4", 16, {"split": 3, "cluster": False}),
    # fp4 activations decoded into the call's scratch rows at M = 1, as the rules run fp4 activations where the
    # unstaged tail plan would run (`plans.MMA_PREDECODE_TAIL`)
    "predecode_m1": ("nvfp4", "nvfp4", 1, {"predecode": True}),
    "cluster_sums_m16": ("nvfp4", "nvfp4", 16, {"max_split": 8}),
    "sixteen_warps_m256_split": ("nvfp4", "nvfp4", 256, {"warps": 16, "tile_m": 128, "split": 2}),
    "k_order_dequant": ("mxfp8", "mxfp8", 64, "dequant"),
    "dense_m512_chunks": ("nvfp4", "nvfp4", 512, "dense"),  # decoded weights: this call's, 4 chunks
    "default_m512": ("bf16", "nvfp4", 512, None),  # the default plan there: 16 warps on an H100 / H200
    # bf16 activations quantized in the call: nvfp4's global scale by the quantize kernel's grid barrier (its sync
    # buffer per stream / capture), then the decoded rows' pre-pass
    "quantize_in_the_call_m16": ("bf16:nvfp4", "nvfp4", 16, None),
    # ... by `quantize_blocks_kernel` (no grid barrier): mxfp4, and nvfp4 with a static global scale
    "quantize_in_the_call_blocks_m64": ("bf16:mxfp4", "mxfp4", 64, None),
    "quantize_in_the_call_static_m16": ("bf16:nvfp4:static", "nvfp4", 16, None),
}


class _InTheCall:
    """A bf16 activation that `scaled_mm` quantizes in the call (`activation_format`); `codes`, the same quantization
    as `bs.quantize` gives it, for the reference."""

    def __init__(self, x, fmt, static):
        # a static scale other than the amax's (448 * 6 / amax) so that a kernel deriving its own cannot match
        self.g = (x.float().abs().amax() / 1000).reshape(1) if static else None
        self.x, self.fmt, self.codes = x, fmt, bs.quantize(x, fmt, global_scale=self.g)


def _operands(fa, fb, m, seeds, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(1234)
    w = torch.randn(N, K, device=device, generator=gen)
    b = bs.quantize(w, fb)
    acts = []
    for seed in seeds:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, K, device=device, generator=g) * (1 + seed % 7)
        if ":" in fa:
            _, fmt, static = fa.split(":") + [""] * (fa.count(":") == 1)
            acts.append(_InTheCall(x.to(torch.bfloat16), fmt, static == "static"))
        else:
            acts.append(x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa))
    return acts, b


def _call(case, device="cuda"):
    """(scaled_mm closure over (a, out), the weights, the activations of two callers)."""
    fa, fb, m, config = CASES[case]
    acts, b = _operands(fa, fb, m, (1, 2), device)
    if config == "dequant":
        return (lambda a, out: bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend="dequant")), b, acts
    b = b.with_data_layout("mma_m16k16")
    if config == "dense":
        return (lambda a, out: bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend="dense",
                                            config={"chunk_rows": N // 4})), b, acts
    if isinstance(acts[0], _InTheCall):
        return (lambda a, out: bs.scaled_mm(a.x, b, activation_format=a.fmt, activation_global_scale=a.g,
                                            out_dtype=torch.float32, out=out, config=config)), b, acts
    return (lambda a, out: bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, config=config)), b, acts


def _poisoned(m):
    return [torch.full((m, N), float("nan"), device="cuda") for _ in range(CALLS)]


def _check(outs, a, b, who):
    ref = ref_scaled_mm(a.codes if isinstance(a, _InTheCall) else a, b)
    errs = [max_rel_err(o, ref) for o in outs]
    wrong = [i for i, e in enumerate(errs) if not e <= BOUND]
    assert not wrong, f"{who}: {len(wrong)} of {len(outs)} results wrong (max_rel_err up to {max(errs):.3g})"


@pytest.mark.parametrize("case", list(CASES))
def test_two_threads_two_streams(case):
    """The issue's scenario: two Python threads, each on its own stream, CALLS calls each."""
    fn, b, acts = _call(case)
    m = CASES[case][2]
    for a in acts:  # compile outside the race
        fn(a, torch.empty(m, N, device="cuda"))
    torch.cuda.synchronize()
    outs = [_poisoned(m) for _ in acts]
    start = threading.Barrier(len(acts))
    errors = []

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                start.wait()
                for out in outs[i]:
                    fn(acts[i], out)
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(acts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, a in enumerate(acts):
        _check(outs[i], a, b, f"{case} thread {i}")


@pytest.mark.parametrize("case", list(CASES))
def test_one_thread_alternating_streams(case):
    """One thread enqueues call after call on two streams in turn: they overlap on the GPU for certain."""
    fn, b, acts = _call(case)
    m = CASES[case][2]
    streams = [torch.cuda.Stream() for _ in acts]
    outs = [_poisoned(m) for _ in acts]
    torch.cuda.synchronize()
    for j in range(CALLS):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                fn(acts[i], outs[i][j])
    torch.cuda.synchronize()
    for i, a in enumerate(acts):
        _check(outs[i], a, b, f"{case} stream {i}")


@pytest.mark.parametrize("kept_sets", [True, False], ids=["kept_sets", "fresh_sets"])
@pytest.mark.parametrize("same_capture_stream", [False, True], ids=["captured_on_two_streams", "captured_on_one_stream"])
@pytest.mark.parametrize("case", ["split_k_workspace_m64", "predecode_m64", "split_k_workspace_m16", "dense_m512_chunks",
                                  "quantize_in_the_call_m16", "quantize_in_the_call_blocks_m64", "uneven_split_m16",
                                  "predecode_m1", "preload_split_k_workspace_m1"])
def test_two_graphs_replayed_side_by_side(case, same_capture_stream, kept_sets, monkeypatch):
    """Two CUDA graphs of the same plan (CALLS calls each), captured on two streams or on one, replayed at the same
    time on two streams, twice; then each graph replayed alone after the other's inputs changed. `fresh_sets`: no
    capture keeps a scratch set (kernels/scratch.py past its byte bound: a memset per call in the graph)."""
    if not kept_sets:
        from blockscaled.kernels import scratch

        monkeypatch.setattr(scratch, "CAPTURE_BYTES", 0, raising=False)
    fn, b, acts = _call(case)
    m = CASES[case][2]
    for a in acts:
        fn(a, torch.empty(m, N, device="cuda"))  # compile outside the capture
    torch.cuda.synchronize()
    outs = [_poisoned(m) for _ in acts]
    graphs = []
    capture_streams = [torch.cuda.Stream()] * 2 if same_capture_stream else [torch.cuda.Stream(), torch.cuda.Stream()]
    for i, a in enumerate(acts):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=capture_streams[i]):
            for out in outs[i]:
                fn(a, out)
        graphs.append(g)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in acts]
    for _ in range(2):
        for o in outs:
            for t in o:
                t.fill_(float("nan"))
        torch.cuda.synchronize()
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        torch.cuda.synchronize()
        for i, a in enumerate(acts):
            _check(outs[i], a, b, f"{case} graph {i}")


@pytest.mark.parametrize("case", ["split_k_workspace_m16", "predecode_m64", "quantize_in_the_call_m16",
                                  "dense_m512_chunks"])
def test_second_gpu_while_the_first_is_current(case):
    """A model split over GPUs calls layers whose tensors are on another GPU than the current one: every kernel of
    the call (quantize, predecode, mma, dense decode) must run on the tensors' GPU, on its current stream, and give
    the reference's result; the current device is left as it was."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, this machine has {torch.cuda.device_count()}")
    torch.cuda.set_device(0)
    fn, b, acts = _call(case, "cuda:1")
    m = CASES[case][2]
    for a in acts:  # the first call compiles, the second launches directly
        out = torch.full((m, N), float("nan"), device="cuda:1")
        y = fn(a, out)
        assert torch.cuda.current_device() == 0 and y.device == torch.device("cuda", 1)
        torch.cuda.synchronize(1)
        _check([y], a, b, case)
