"""Every kernel pair through the Triton interpreter on CPU tensors (float32 compute dtype)."""

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels.decode import e2m1_to_float32, e4m3_to_float32, e4m3_to_float32_by_multiply, e8m0_to_float32
from blockscaled.reference import codecs
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

from pairs import PAIRS, dequantizes_every_code_and_scale, run_and_check

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter suite; the GPU runs test_kernels_gpu.py")


def test_e2m1x8_word_decode_every_code_in_every_slot():
    from blockscaled.kernels.decode import e2m1x8_to_float32

    codes = torch.arange(16, dtype=torch.int64)
    # word w holds code c in slot j and code (c + 5 * j) % 16 elsewhere: every code in every slot
    slots = torch.stack([(codes + 5 * j) % 16 for j in range(8)], dim=1)  # [16, 8]
    words = (slots << (4 * torch.arange(8))).sum(1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    parts = e2m1x8_to_float32(words)
    for j in range(8):
        want = codecs.decode_e2m1(slots[:, j].to(torch.uint8))
        assert torch.equal(parts[j].view(torch.int32), want.view(torch.int32)), j


def test_decode_helpers_match_reference_every_code():
    codes = torch.arange(256, dtype=torch.int32)
    fp4 = e2m1_to_float32(codes & 15)
    assert torch.equal(fp4.view(torch.int32), codecs.decode_e2m1((codes & 15).to(torch.uint8)).view(torch.int32))
    e8 = e8m0_to_float32(codes).view(torch.int32)
    assert torch.equal(e8, codecs.decode_e8m0(codes.to(torch.uint8)).view(torch.int32))
    want = codecs.decode_e4m3(codes.to(torch.uint8))
    ok = ~torch.isnan(want)
    for e4 in (e4m3_to_float32(codes), e4m3_to_float32_by_multiply(codes)):  # subnormals, -0 and NaN included
        assert torch.equal(torch.isnan(e4), torch.isnan(want))
        assert torch.equal(e4[ok].view(torch.int32), want[ok].view(torch.int32))


@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4", "cdna4_16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_dequantize_kernel_every_code_and_scale(fmt, layout):
    """`dequantize_kernel` against the reference value for value, every data byte and scale code but the E8M0 scales whose
    products are fp32 subnormals (the interpreter's float32 arithmetic flushed some of them; the GPU suite runs
    them all)."""
    dequantizes_every_code_and_scale(fmt, layout, "cpu", min_e8m0={"mxfp4": 2, "mxfp8": 10}.get(fmt, 0))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (33, 20, 96)])
def test_pairs_match_fp64_reference(pair, m, n, k, gen):
    run_and_check(pair, m, n, k, "cpu", gen)


@pytest.mark.parametrize("layout", ["swizzle_32_4_4", "cdna4_32", "cdna4_16"])
@pytest.mark.parametrize("pair", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"), ("bf16", "mxfp8")], ids=lambda p: f"{p[0]}x{p[1]}")
def test_scale_layouts_indexed_in_place(pair, layout, gen):
    run_and_check(pair, 17, 130, 64, "cpu", gen, layout=layout)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_out_dtypes_and_bias(out_dtype, gen):
    run_and_check(("bf16", "nvfp4"), 5, 24, 32, "cpu", gen, out_dtype=out_dtype, bias=True)


def test_k_is_one_block(gen):
    run_and_check(("nvfp4", "nvfp4"), 3, 18, 16, "cpu", gen)
    run_and_check(("bf16", "mxfp4"), 3, 18, 32, "cpu", gen)


def test_bad_arguments(gen):
    w = bs.quantize(torch.randn(8, 64, generator=gen), "mxfp4")
    x = torch.randn(4, 64, generator=gen)
    with pytest.raises(TypeError, match="a: a plain-tensor activation must be torch.bfloat16, got torch.float32"):
        bs.scaled_mm(x, w)
    with pytest.raises(ValueError, match="a: expected a contiguous tensor"):
        bs.scaled_mm(torch.randn(64, 4).to(torch.bfloat16).T, w)
    with pytest.raises(ValueError, match="the pair nvfp4 x mxfp4 is not supported; supported pairs: nvfp4 x nvfp4"):
        bs.scaled_mm(bs.quantize(x, "nvfp4"), w)
    with pytest.raises(ValueError, match="b: K=64 does not match a's K=32"):
        bs.scaled_mm(torch.randn(4, 32).to(torch.bfloat16), w)
    with pytest.raises(TypeError, match="b: expected a QTensor"):
        bs.scaled_mm(x.to(torch.bfloat16), torch.randn(8, 64))
    with pytest.raises(TypeError, match="out_dtype: expected one of"):
        bs.scaled_mm(x.to(torch.bfloat16), w, out_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"bias: expected a tensor of shape \(8,\)"):
        bs.scaled_mm(x.to(torch.bfloat16), w, bias=torch.zeros(4))
    with pytest.raises(ValueError, match=r"out: expected a contiguous torch.bfloat16 tensor of shape \(4, 8\)"):
        bs.scaled_mm(x.to(torch.bfloat16), w, out=torch.empty(4, 9, dtype=torch.bfloat16))
    meta_w = bs.QTensor(w.data.to("meta"), w.scale.to("meta"), "mxfp4")
    with pytest.raises(ValueError, match="b: on meta, a on cpu; expected one device"):
        bs.scaled_mm(x.to(torch.bfloat16), meta_w)
    xb = x.to(torch.bfloat16)
    square = bs.quantize(torch.randn(64, 64, generator=gen), "mxfp4")
    for out, name in ((xb, "a"), (torch.zeros(8, 64).to(torch.bfloat16)[:4], None)):  # a itself; a tensor of its own
        if name:
            with pytest.raises(ValueError, match="out: shares memory with a, which the kernels read while writing"):
                bs.scaled_mm(xb, square, out=out)
        else:
            torch.testing.assert_close(bs.scaled_mm(xb, square, out=out), ref_scaled_mm(xb, square).to(torch.bfloat16),
                                       rtol=1e-2, atol=1e-2)
    bias = torch.zeros(4 * 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out: shares memory with bias"):
        bs.scaled_mm(xb, square, bias=bias[:64], out=bias.view(4, 64))
    with pytest.raises(TypeError, match="config: backend 'dequant' takes a helion.Config .* got dict"):
        bs.scaled_mm(x.to(torch.bfloat16), w, config={"k_warps": 4})
    with pytest.raises(ValueError, match="backend: expected one of"):
        bs.scaled_mm(x[:0].to(torch.bfloat16), w, backend="fast")  # checked before the empty batch returns
    with pytest.raises(ValueError, match="x: K=0 must be a positive multiple of the mxfp4 block size 32"):
        bs.quantize(torch.randn(4, 0), "mxfp4", backend="kernel")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_a_batch_of_no_tokens(fmt, gen):
    """No rows (nn.Linear takes them: an empty batch, an expert no token chose): empty results, nothing launched; the
    kernel's quantize and the reference agree on the shapes, and nvfp4's global scale is 1, as for an all-zero input."""
    from blockscaled.kernels.quantize import quantize_decoded
    from blockscaled.nn import QuantizedLinear

    x = torch.randn(0, 64, generator=gen)
    for layout in ("rowmajor", "swizzle_32_4_4", "cdna4_16"):
        got, want = (bs.quantize(x, fmt, layout=layout, backend=b) for b in ("kernel", "reference"))
        assert got.data.shape == want.data.shape == (0, 64 if fmt == "mxfp8" else 32)
        assert got.scale.shape == want.scale.shape
        assert (got.global_scale is None) == (want.global_scale is None) == (fmt != "nvfp4")
        if fmt == "nvfp4":
            assert got.global_scale.item() == want.global_scale.item() == 1.0
    decoded, g = quantize_decoded(x.to(torch.bfloat16), bs.FORMATS[fmt], "floor", None)  # the mma kernels' rows
    assert decoded.shape == (0, 64) and g.tolist() == [1.0]
    linear = torch.nn.Linear(64, 24)
    weight_format = "mxfp4" if fmt == "mxfp8" else fmt
    for activation_format in (None, fmt):
        layer = QuantizedLinear.from_linear(linear, weight_format=weight_format, activation_format=activation_format)
        for shape in ((0, 64), (3, 0, 64)):
            assert layer(torch.randn(*shape, generator=gen)).shape == shape[:-1] + (24,)
    w = bs.quantize(torch.randn(24, 64, generator=gen), weight_format)
    out = torch.full((0, 24), float("nan"))
    assert bs.scaled_mm(x.to(torch.bfloat16), w, out_dtype=torch.float32, out=out) is out


def test_cpu_tensors_without_the_interpreter_are_refused_by_name(gen, monkeypatch):
    """On a machine whose kernels are compiled (no TRITON_INTERPRET), CPU operands are refused before a launch: Triton's
    launcher would fail on them naming no argument."""
    w = bs.quantize(torch.randn(8, 64, generator=gen), "mxfp4")
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"b: on cpu; the kernels run on a CUDA GPU, or on the CPU through Triton's "
                                         r"interpreter \(TRITON_INTERPRET=1\)"):
        bs.scaled_mm(x, w)
    with pytest.raises(ValueError, match="x: on cpu; the kernels run on a CUDA GPU"):
        bs.quantize(x, "mxfp4", backend="kernel")
    assert bs.quantize(x, "mxfp4").shape == (4, 64)  # the default on the CPU: the reference quantizer


@pytest.mark.parametrize("pair", [("bf16", "mxfp4"), ("mxfp8", "mxfp4")], ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 4])
def test_both_k_paths_for_fp4_weights(pair, m, gen):
    """M=1 splits K by K mod 8, M>1 with an unpacked A interleaves: both must be exact."""
    from blockscaled.kernels.api import _split_k8

    assert _split_k8(bs.FORMATS.get(pair[0]), bs.FORMATS[pair[1]], m) == (m == 1)
    run_and_check(pair, m, 24, 64, "cpu", gen, backend="dequant")


def test_second_call_skips_helion_bind(gen, monkeypatch):
    """The per-call host work is a dict lookup: bind() (0.35 ms on the H200 host) runs once per key."""
    from blockscaled.kernels.dequant_mm import dequant_mm_kernel

    run_and_check(("bf16", "mxfp8"), 3, 40, 64, "cpu", gen)
    monkeypatch.setattr(dequant_mm_kernel, "bind", lambda *a: pytest.fail("bind() called again"))
    run_and_check(("bf16", "mxfp8"), 3, 40, 64, "cpu", gen)  # same key, fresh tensors: exact again


FP4_WEIGHT_PAIRS = [p for p in PAIRS if bs.FORMATS[p[1]].is_packed]


def mocked_launches(monkeypatch):
    """`launch` with Triton's JIT launch and driver replaced: (jit calls, direct runs, current device, the compiled
    kernel the JIT launch returns, whose launcher appends its arguments to the runs)."""
    import types

    from triton.compiler.compiler import CompiledKernel

    from blockscaled.kernels import launch

    class Compiled(CompiledKernel):
        def __init__(self):  # what _init_handles would have loaded; the CudaLauncher's C launch appends its arguments
            self.module, self.function, self.packed_metadata = "module", "function", (4, 1, 1028)
            self._run = types.SimpleNamespace(launch=lambda *a: runs.append(a), global_scratch_size=0,
                                              global_scratch_align=1, profile_scratch_size=0,
                                              launch_cooperative_grid=False)

    runs, jit_calls, current = [], [], {"device": 0}
    compiled = Compiled()

    def jit(triton_kernel, grid, *args, num_warps, num_stages, **kwargs):
        jit_calls.append((grid, args, num_warps, num_stages, kwargs))
        return compiled

    monkeypatch.setattr(launch, "default_launcher", jit)
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: current["device"], get_current_stream=lambda device: 100 + device)))
    return jit_calls, runs, current, compiled


def test_direct_launch_binds_once_then_calls_the_launcher(monkeypatch):
    """DirectLaunch: Triton's JIT path on the first call, then the compiled kernel's launcher
    with the same arguments (tensors as their addresses) on the current stream; another alignment,
    a launch hook, Helion launch options or another device go back to the JIT path. With `cluster` the
    direct launches ask the launcher for clusters of that many CTAs (its packed metadata's num_ctas) over
    grid[0] / cluster, with `pdl` for programmatic dependent launches; a kernel with global scratch stays on the JIT
    path."""
    import types

    from triton import knobs

    from blockscaled.kernels import launch

    jit_calls, runs, current, compiled = mocked_launches(monkeypatch)
    kernel = types.SimpleNamespace(params=["x", "y", "n"], pre_run_hooks=[])
    x, y = torch.arange(8.0), torch.zeros(8)
    direct = launch.DirectLaunch()
    assert direct(kernel, (4,), x, y, 3, num_warps=4, num_stages=1) is compiled
    assert len(jit_calls) == 1 and runs == []
    assert direct(kernel, (4, 2), y, x, 5, num_warps=4, num_stages=1) is compiled
    # tensors as their addresses (Triton's launcher would look each one up with cuPointerGetAttribute)
    assert len(jit_calls) == 1 and runs == [(4, 2, 1, 100, "function", False, 0, None, None, (4, 1, 1028), None, None, None, y.data_ptr(),
                                             x.data_ptr(), 5)]
    assert runs[-1][:-3] == direct.prefix((4, 2), 100)  # the prefix `bench.host` launches with
    direct(kernel, (4,), x[1:], y, 3, num_warps=4, num_stages=1)  # x + 4 bytes: another specialization
    direct(kernel, (4,), x, y, 3, num_warps=4, num_stages=1, ptx_options="-v")
    knobs.runtime.launch_enter_hook.add(print)  # a profiler's hook
    try:
        direct(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    current["device"] = 1
    direct(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 5 and len(runs) == 1
    current["device"] = 0
    direct(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 5 and runs[-1] == (4, 1, 1, 100, "function", False, 0, None, None, (4, 1, 1028), None, None, None, x.data_ptr(),
                                                y.data_ptr(), 3)
    # a kernel whose launcher does not take every parameter positionally never goes direct
    other = launch.DirectLaunch()
    for _ in range(2):
        other(types.SimpleNamespace(params=["x", "y", "n", "BLOCK"], pre_run_hooks=[]), (4,), x, y, 3, num_warps=4,
              num_stages=1)
    assert len(jit_calls) == 7
    clustered = launch.DirectLaunch(cluster=4)
    for _ in range(2):
        clustered(kernel, (32,), x, y, 3, num_warps=8, num_stages=1)
    assert len(jit_calls) == 8 and runs[-1] == (8, 1, 1, 100, "function", False, 0, None, None, (4, 4, 1028), None,
                                                None, None, x.data_ptr(), y.data_ptr(), 3)
    # with pdl: the programmatic stream serialization flag of the C launcher
    dependent = launch.DirectLaunch(pdl=True)
    for _ in range(2):
        dependent(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 9 and runs[-1][5:7] == (False, 1) and runs[-1][-3:] == (x.data_ptr(), y.data_ptr(), 3)
    # a kernel that needs global scratch: Triton's path unless DIRECT_SCRATCH, then direct with a scratch of grid x
    # the CTA's bytes allocated per launch, its address in the launcher's global scratch slot
    compiled.run.global_scratch_size, compiled.run.global_scratch_align = 64, 128
    scratch = launch.DirectLaunch()
    for _ in range(2):
        scratch(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 11 and len(runs) == 4
    made = []
    monkeypatch.setattr(launch, "_scratch", lambda nbytes, device: made.append((nbytes, device)) or torch.empty(nbytes))
    monkeypatch.setattr(launch, "DIRECT_SCRATCH", True)
    scratch = launch.DirectLaunch()
    for _ in range(3):
        scratch(kernel, (4, 3), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 12 and len(runs) == 6 and made == [(4 * 3 * 64, 0)] * 2
    assert runs[-1][7] != runs[-1][8] is None and isinstance(runs[-1][7], int) and runs[-1][7] != 0
    compiled.run.global_scratch_align = 1024  # past what the allocator guarantees: Triton's path
    aligned_past = launch.DirectLaunch()
    for _ in range(2):
        aligned_past(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
    assert len(jit_calls) == 14 and len(runs) == 6


def test_direct_launch_from_addresses(monkeypatch):
    """DirectLaunch.bind after a direct launch maps each kernel argument to the first of the caller's tensors that is
    the same object (Helion's host function reorders and drops arguments); `launch_addresses` then launches with the
    caller's addresses in those places, on the last direct launch's grid (in clusters), and declines, launching
    nothing, before a binding, for another alignment, under a launch hook or on another device. It binds only right
    after a direct launch (not after one through Triton's path); integer arguments keep their values, and a tensor
    argument that is not among the caller's tensors leaves it unbound."""
    import types

    from triton import knobs

    from blockscaled.kernels import launch

    jit_calls, runs, current, _ = mocked_launches(monkeypatch)
    kernel = types.SimpleNamespace(params=["y", "x", "z"], pre_run_hooks=[])
    x, y = torch.arange(8.0), torch.zeros(8)
    direct = launch.DirectLaunch(cluster=2)
    assert not direct.launch_addresses([0, 0, 0])  # not bound
    # the JIT launch; a direct one bound with too few tensors; a direct one not bound; one through the JIT path
    # under a hook, after which nothing binds; a direct one: the host function passes (y, x, y) of the caller's
    # (x, y, y)
    for hooked, tensors in ((False, [x, y, y]), (False, [x]), (False, None), (True, [x, y, y]), (False, [x, y, y])):
        if hooked:
            knobs.runtime.launch_enter_hook.add(print)
        try:
            direct(kernel, (8, 3), y, x, y, num_warps=4, num_stages=1)
        finally:
            if hooked:
                knobs.runtime.launch_enter_hook.remove(print)
        if tensors is not None:
            direct.bind(tensors)
        assert (direct.sources is None) is (len(runs) < 3)
    assert direct.sources == (1, 0, 1) and direct.grid == (8, 3) and len(jit_calls) == 2 and len(runs) == 3
    assert direct.launch_addresses([4096, 8192, 12288])
    assert runs[-1] == (4, 3, 1, 100, "function", False, 0, None, None, (4, 2, 1028), None, None, None, 8192, 4096, 8192)
    assert not direct.launch_addresses([4096, 8200, 0])  # y's address 8-byte aligned: another specialization
    knobs.runtime.launch_enter_hook.add(print)
    try:
        assert not direct.launch_addresses([4096, 8192, 0])
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    current["device"] = 1
    assert not direct.launch_addresses([4096, 8192, 0])
    assert len(runs) == 4 and len(jit_calls) == 2
    # an integer argument (Helion passes some block sizes) is kept as it was launched; a tensor that is not among the
    # caller's leaves the launcher unbound
    scalar, stray = launch.DirectLaunch(), launch.DirectLaunch()
    for _ in range(2):
        scalar(kernel, (4,), x, y, 3, num_warps=4, num_stages=1)
        scalar.bind([x, y])
        stray(kernel, (4,), x, torch.zeros(8), 3, num_warps=4, num_stages=1)
        stray.bind([x, y])
    assert scalar.sources == (0, 1, None) and scalar.launch_addresses([4096, 8192]) and runs[-1][-3:] == (4096, 8192, 3)
    assert stray.sources is None and not stray.launch_addresses([4096, 8192])


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_dense_plan_matches_fp64_reference(pair, gen):
    """The dense plan (weights decoded from "mma_m16k16" to bf16, then a matmul) in chunks of 32 weight rows, N and K
    that the layout pads: bf16 out (global scales folded into the decoded weights) and fp32 out (exact weights)."""
    for out_dtype, bias in ((torch.bfloat16, True), (torch.float32, False)):
        run_and_check(pair, 5, 72, 96, "cpu", gen, out_dtype=out_dtype, bias=bias, data_layout="mma_m16k16",
                      backend="dense", config={"chunk_rows": 32})


def test_dense_plan_fp16_out_and_activation_format(gen):
    run_and_check(("nvfp4", "nvfp4"), 3, 40, 64, "cpu", gen, out_dtype=torch.float16, bias=True,
                  data_layout="mma_m16k16", backend="dense")
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = bs.quantize(torch.randn(24, 64, generator=gen), "nvfp4", data_layout="mma_m16k16")
    got = bs.scaled_mm(x, w, out_dtype=torch.float32, backend="dense", activation_format="nvfp4")
    ref = ref_scaled_mm(bs.quantize(x, "nvfp4"), w)
    assert max_rel_err(got, ref) <= 1e-5


def test_dense_plan_takes_a_bias_of_another_dtype(gen):
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = bs.quantize(torch.randn(24, 64, generator=gen), "mxfp4", data_layout="mma_m16k16")
    bias = torch.randn(24, generator=gen)  # fp32, bf16 out
    got = bs.scaled_mm(x, w, bias=bias, backend="dense")
    assert max_rel_err(got, ref_scaled_mm(x, w, bias=bias)) <= 8e-3


def test_dense_plan_bad_arguments(gen):
    w = bs.quantize(torch.randn(24, 64, generator=gen), "mxfp4")
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="backend: 'dense' reads weights in the 'mma_m16k16' data layout"):
        bs.scaled_mm(x, w, backend="dense")
    w = w.with_data_layout("mma_m16k16")
    with pytest.raises(ValueError, match=r"config: the dense plan takes keys \('chunk_rows',\), got \['overlap'\]"):
        bs.scaled_mm(x, w, backend="dense", config={"overlap": True})
    with pytest.raises(ValueError, match="config: chunk_rows must be a positive multiple of 16, got 20"):
        bs.scaled_mm(x, w, backend="dense", config={"chunk_rows": 20})


def test_dense_plan_chunks():
    """Rows a chunk: all of them up to DENSE_CHUNK_BYTES of bf16, else whole 128-row programs; a size given is taken
    (at most all rows)."""
    from blockscaled.kernels import dense

    assert dense.chunk_rows(8192, 8192, None) == 8192 and dense.chunk_rows(57344, 8192, None) == 16384
    assert dense.chunk_rows(1024, 64, {"chunk_rows": 208}) == 208
    assert dense.chunk_rows(128, 64, {"chunk_rows": 208}) == 128


def test_calls_on_another_gpu_make_it_current(monkeypatch):
    """`api.on_device`: a CUDA device other than the current one becomes current for the call (Triton and Helion
    launch on the current device and stream); the current device, the CPU or none: nothing. `scaled_mm` and the
    quantize kernel's entry take it with their operands' device (the two-GPU run: test_concurrency_gpu.py)."""
    import contextlib

    from blockscaled.kernels import api

    entered = []

    class Device:  # torch.cuda.device, recorded
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    for same in (torch.device("cuda", 0), torch.device("cpu"), None):
        assert isinstance(api.on_device(same), contextlib.nullcontext)
    with api.on_device(torch.device("cuda", 1)):
        pass
    assert entered == [torch.device("cuda", 1)]
    seen, real = [], api.on_device
    monkeypatch.setattr(api, "on_device", lambda device: seen.append(device) or real(device))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=gen)
    w = bs.quantize(torch.randn(32, 64, generator=gen), "mxfp4")
    bs.scaled_mm(x.to(torch.bfloat16), w)
    bs.quantize(x, "mxfp8", backend="kernel")
    assert seen == [torch.device("cpu")] * 2
