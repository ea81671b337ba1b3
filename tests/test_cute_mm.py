"""The CuTe backend's nvfp4 x nvfp4 kernel (`kernels/cute_mm.py`) without a Blackwell GPU.

Helion generates its sm_100 code on this CPU (the target's capability, SM count and CUDA version stood in, as
Helion's own CuTe tests do). The `block_scaled_mma` plan it emits lists the byte and scale addresses its prepare
kernel gathers into the tcgen05 workspace; evaluating them over our tensors and multiplying what they select must
give the fp64 reference. Needs the CuTe DSL (`helion[cute]`, pinned in requirements/ci.txt); no GPU.
"""

from __future__ import annotations

import ast
import contextlib
from unittest.mock import patch

import pytest
import torch

import helion

pytest.importorskip("cutlass.cute", reason="the CuTe DSL (helion[cute]) is not installed: requirements/ci.txt pins it")

import blockscaled as bs  # noqa: E402
from blockscaled.kernels import api, cute_mm, plans  # noqa: E402
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm  # noqa: E402
from blockscaled.reference.codecs import decode_e2m1, decode_e4m3  # noqa: E402


@contextlib.contextmanager
def target(capability=(10, 0), sms=148):
    """Code generation for a GPU of `capability` and `sms` SMs, with CUDA 13, on this machine."""
    with contextlib.ExitStack() as stack:
        for name, value in (("helion.runtime.kernel.target_device_capability", capability),
                            ("helion._compiler.compile_environment.target_device_capability", capability),
                            ("helion.runtime.get_num_sm", sms), ("helion._compat._is_hip", False)):
            stack.enter_context(patch(name, return_value=value))
        stack.enter_context(patch.object(torch.version, "cuda", "13.0"))
        yield


def generated(a, b, m, n, swizzled=None):
    """(source, plan) of the kernel bound to a, b and an [m, n] fp32 output, generated for sm_100; `swizzled`
    overrides both scale-layout flags."""
    args = cute_mm.arguments(a, b, torch.empty(m, n))
    if swizzled is not None:
        args = (*args[:5], swizzled, swizzled)
    with target():
        bound = cute_mm.nvfp4_kernel()._bind_isolated(args)
        source = bound.to_code(helion.Config(block_sizes=cute_mm.CUTE_TILE, **cute_mm.CUTE_CONFIG))
    plans = [ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
             and any(getattr(t, "attr", None) == "_helion_cute_wrapper_plans" for t in node.targets)]
    assert len(plans) == 1 and len(plans[0]) == 1, "one wrapper plan"
    return source, plans[0][0]


class _Cutlass:
    """The names the plan's address expressions use, as plain integer arithmetic on torch tensors."""

    Int32 = Int64 = staticmethod(lambda x: x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int64))


def _at(expr: str, rows: int, groups: int) -> torch.Tensor:
    """An address expression of (row, group) over every row and group: int64 [rows, groups]."""
    coords = {"row": torch.arange(rows)[:, None], "group": torch.arange(groups)[None, :], "cutlass": _Cutlass}
    return torch.broadcast_to(eval(expr, coords), (rows, groups))  # the plan's own strings, from Helion


def _side(plan, side: str, x, rows: int, groups: int) -> torch.Tensor:
    """What the prepare kernel gathers for one operand through the plan's addresses, decoded: fp64 [rows, K] of
    element x block scale."""
    data = x.data.view(torch.uint8).reshape(-1)
    assert plan[f"{side}_span"] <= data.numel()
    scales = decode_e4m3(x.scale.view(torch.uint8).reshape(-1)[_at(plan[f"{side}_scale_address"], rows, groups)])
    out = torch.empty(rows, groups, 8, 2, dtype=torch.float64)
    for i, expr in enumerate(plan[f"{side}_byte_addresses"]):
        byte = data[_at(expr, rows, groups)]
        out[:, :, i, 0] = decode_e2m1(byte & 15).double()  # even K: the low nibble
        out[:, :, i, 1] = decode_e2m1(byte >> 4).double()
    return (out * scales.double()[:, :, None, None]).reshape(rows, groups * 16)


def plan_product(plan, a, b) -> torch.Tensor:
    """The fp64 product the plan's gathered operands make, times both global scales (applied after the kernel)."""
    m, k = a.shape
    n = b.shape[0]
    prod = _side(plan, "lhs", a, m, k // 16) @ _side(plan, "rhs", b, n, k // 16).T
    return prod * a.global_scale.double() * b.global_scale.double()


def _operands(m, n, k, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, k // 16).repeat_interleave(16)  # scales that matter
    w = torch.randn(n, k, generator=g)
    return bs.quantize(x, "nvfp4", layout=layout), bs.quantize(w, "nvfp4", layout=layout)


@pytest.mark.parametrize("layout", ["swizzle_32_4_4", "rowmajor"])
@pytest.mark.parametrize("m,n,k", [(37, 72, 256), (128, 256, 1024), (200, 136, 576), (5, 300, 80)])
def test_sm100_plan_is_block_scaled_and_computes_the_reference(layout, m, n, k):
    """For sm_100 Helion takes the native path (one `block_scaled_mma` plan, the device function an empty body: no
    per-element decode left), with our M, N, K and the tile of CUTE_CONFIG; the plan's gathered operands multiply to
    the fp64 reference."""
    a, b = _operands(m, n, k, layout)
    source, plan = generated(a, b, m, n)
    assert plan["kind"] == "block_scaled_mma"
    assert (plan["m"], plan["n"], plan["k"]) == (m, n, k)
    assert (plan["bn"], plan["bk"], plan["stages"], plan["cluster_m"]) == (256, 256, 4, 2)
    kernels = [f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and any(
        ast.unparse(d) == "cute.kernel" for d in f.decorator_list)]
    assert len(kernels) == 1 and all(isinstance(s, ast.Pass) for s in kernels[0].body)
    assert max_rel_err(plan_product(plan, a, b), ref_scaled_mm(a, b)) < 1e-12


def test_sm100a_compiles_without_a_gpu(tmp_path):
    """The plan's tcgen05 kernel (Helion's `Sm100BlockScaledGemm` with our shape and tile) compiled by the CuTe DSL
    for sm_100a on this CPU: PTX with the nvfp4 block-scaled MMA (16-element blocks, a CTA pair) and a cubin. (Helion
    compiles it at the first launch; here it is compiled on its own, with fake tensors.)"""
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings.driver import CUstream
    from cutlass.cute.runtime import make_fake_compact_tensor
    from helion._compiler.cute.block_scaled_runtime import Sm100BlockScaledGemm

    a, b = _operands(128, 256, 1024, "swizzle_32_4_4")
    _, plan = generated(a, b, 128, 256)
    gemm = Sm100BlockScaledGemm(*(plan[key] for key in ("m", "n", "k", "bn", "bk", "stages", "cluster_m",
                                                         "persistent", "num_sm")), ())
    assert gemm.workspace_bytes == plan["workspace_bytes"]
    workspace = make_fake_compact_tensor(cutlass.Uint8, (gemm.workspace_bytes,), assumed_align=16)
    out = make_fake_compact_tensor(cutlass.Float32, (128, 256), stride_order=(1, 0), assumed_align=16)
    cute.compile(gemm, workspace, out, cutlass.Float32(1.0), CUstream(0),
                 options=f"--gpu-arch sm_100a --keep-ptx --keep-cubin --dump-dir {tmp_path}")
    (ptx,), (cubin,) = tmp_path.glob("*.ptx"), tmp_path.glob("*.cubin")
    text = ptx.read_text()
    assert ".target sm_100a" in text
    assert text.count("tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.block16") >= 1
    assert cubin.stat().st_size > 10_000


def test_the_plan_follows_the_scale_layout():
    """The emulation can fail: swizzled scales read as rowmajor (the wrong flag) give another product."""
    a, b = _operands(200, 136, 576, "swizzle_32_4_4")
    _, plan = generated(a, b, 200, 136, swizzled=False)
    assert plan["kind"] == "block_scaled_mma"
    assert max_rel_err(plan_product(plan, a, b), ref_scaled_mm(a, b)) > 1e-2


def test_the_fp32_tile_takes_four_stages():
    """With five stages the fp32 output tile leaves no room (235,520 bytes of shared memory): Helion declines."""
    a, b = _operands(37, 72, 256, "swizzle_32_4_4")
    with target():
        bound = cute_mm.nvfp4_kernel()._bind_isolated(cute_mm.arguments(a, b, torch.empty(37, 72)))
        with pytest.raises(helion.exc.BackendUnsupported, match="block-scaled contraction proof declined"):
            bound.to_code(helion.Config(block_sizes=cute_mm.CUTE_TILE, **{**cute_mm.CUTE_CONFIG, "cute_scaled_stages": 5}))


def test_hopper_takes_lanes_not_the_native_plan():
    """For sm_90 the native plan is refused naming SM100, and the lane config generates per-element CuTe code (what
    `tests/test_cute_mm_gpu.py` runs on an H100 / H200)."""
    a, b = _operands(37, 72, 256, "swizzle_32_4_4")
    args = cute_mm.arguments(a, b, torch.empty(37, 72))
    with target((9, 0), 132):
        bound = cute_mm.nvfp4_kernel()._bind_isolated(args)
        with pytest.raises(helion.exc.InvalidConfig, match="SM100"):
            bound.to_code(helion.Config(block_sizes=cute_mm.CUTE_TILE, **cute_mm.CUTE_CONFIG))
        source = cute_mm.nvfp4_kernel(native=False)._bind_isolated(args).to_code(helion.Config(**cute_mm.LANE_CONFIG))
    assert "block_scaled_mma" not in source and "cute.arch.load" in source


def test_w4a16_is_per_lane_code_on_sm100():
    """bf16 x nvfp4 written as Helion's W4A16 example writes it: for sm_100 Helion 1.5.0 emits per-element CuTe code
    (loads and FMAs a lane, no tcgen05 and no block-scaled plan), so on Blackwell it is a slow path, opt-in only."""
    _, b = _operands(64, 256, 1024, "swizzle_32_4_4")
    x = torch.randn(64, 1024, dtype=torch.bfloat16)
    with target():
        source = cute_mm.w4a16_kernel()._bind_isolated(cute_mm.arguments(x, b, torch.empty(64, 256))).to_code(
            helion.Config(**cute_mm.LANE_CONFIG))
    assert "tcgen05" not in source and "block_scaled_mma" not in source and "cute.arch.load" in source
    with pytest.raises(ValueError, match="runs on NVIDIA sm_100"):
        bs.scaled_mm(x, b, backend="cute")


def test_backend_cute_refuses_what_it_cannot_run():
    """Other formats and layouts, a strided activation, a config, a device that is not sm_100: each named (and
    `check_operands` on its own, for callers past `scaled_mm`'s checks)."""
    a, b = _operands(4, 8, 256, "swizzle_32_4_4")
    cases = [((bs.quantize(torch.randn(4, 256), "mxfp8"), bs.quantize(torch.randn(8, 256), "mxfp4")),
              {}, "a: backend 'cute' takes nvfp4 QTensors"),
             ((a, b.with_data_layout("mma_m16k16")), {}, "b: backend 'cute' takes nvfp4 QTensors with k_order data"),
             ((torch.randn(256, 4, dtype=torch.bfloat16).T, b), {}, "a: expected a contiguous tensor"),
             ((torch.randn(4, 256, dtype=torch.bfloat16), b), {}, "backend: 'cute' runs on NVIDIA sm_100"),
             ((a, b), {"config": {"stages": 4}}, "config: backend 'cute' takes none"),
             ((a, b), {}, "backend: 'cute' runs on NVIDIA sm_100")]
    for (x, w), kw, message in cases:
        with pytest.raises(ValueError, match=message):
            bs.scaled_mm(x, w, backend="cute", **kw)
    for x in (torch.randn(4, 256, dtype=torch.float16), torch.randn(256, 4, dtype=torch.bfloat16).T):
        with pytest.raises(ValueError, match=r"a: backend 'cute' .*\(a: or a contiguous bf16 tensor\), got a"):
            cute_mm.check_operands(x, b)


def test_default_choice_by_capability(monkeypatch):
    """scaled_mm takes the CuTe backend by itself only with CUTE_DEFAULT_ON_SM100, on sm_100, with the extra."""
    device = torch.device("cuda", 0)
    monkeypatch.setattr(plans, "_capability", lambda d: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    for default, capability, reason, expected in ((True, (10, 0), None, True), (False, (10, 0), None, False),
                                                  (True, (9, 0), None, False), (True, (12, 0), None, False),
                                                  (True, (10, 0), "no CuTe DSL", False)):
        monkeypatch.setattr(cute_mm, "CUTE_DEFAULT_ON_SM100", default)
        monkeypatch.setattr(cute_mm, "cute_unavailable", lambda: reason)
        assert cute_mm.cute_default(device) is expected, (default, capability, reason)
    assert "cute" in api.BACKENDS


def test_missing_extra_is_named(monkeypatch):
    """On sm_100 without the CuTe DSL: a RuntimeError naming the extra, before anything launches."""
    a, b = _operands(4, 8, 256, "swizzle_32_4_4")
    monkeypatch.setattr(cute_mm, "cute_unavailable", lambda: "the CuTe DSL is not importable")
    monkeypatch.setattr(plans, "_capability", lambda d: (10, 0))
    fake = torch.device("cuda", 0)
    monkeypatch.setattr(type(b), "device", property(lambda self: fake))
    with pytest.raises(RuntimeError, match=r"pip install 'helion\[cute\]'\): the CuTe DSL is not importable"):
        cute_mm.cute_scaled_mm(a, b, None, torch.empty(4, 8))


def test_a_torch_without_the_helpers_helion_calls_is_named(monkeypatch):
    """torch 2.11's inductor lacks CuteDSLOpOverrides helpers that Helion 1.5.0's CuTe codegen calls (found on the
    GPU image: every kernel failed inside codegen): `cute_unavailable` names them and the torch version, so
    `backend="cute"` refuses with that reason instead of failing inside Helion."""
    from torch._inductor.codegen.cutedsl.cutedsl_op_overrides import CuteDSLOpOverrides

    import helion._compiler.cute.cutedsl_compat as compat

    monkeypatch.setattr(compat, "_cute_backend_requirement_error", lambda: None)
    cute_mm.missing_torch_helpers.cache_clear()
    try:
        if not cute_mm.missing_torch_helpers():  # torch 2.13 (CI's)
            assert cute_mm.cute_unavailable() is None
        monkeypatch.delattr(CuteDSLOpOverrides, "_cast_expr")
        monkeypatch.delattr(CuteDSLOpOverrides, "_expected_tensor_val")
        cute_mm.missing_torch_helpers.cache_clear()
        assert cute_mm.missing_torch_helpers() == ("_cast_expr", "_expected_tensor_val")
        reason = cute_mm.cute_unavailable()
        assert "CuteDSLOpOverrides._cast_expr, ._expected_tensor_val" in reason and torch.__version__ in reason
    finally:
        cute_mm.missing_torch_helpers.cache_clear()
