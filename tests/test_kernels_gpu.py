"""GPU suite (H100/H200): all 7 pairs x out dtypes x shapes, fresh inputs, poisoned outputs."""

import itertools

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import dense, plans
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

from pairs import (PAIRS, TOLERANCE, assert_split_k_workspaces_zero, backend_used, decodes_every_byte,
                   decodes_every_scale, dequantizes_every_code_and_scale, make_operands, mma_decodes_activation_nan,
                   mma_decodes_every_activation_code, mma_decodes_every_activation_scale, mma_plan_staged, mma_plan_tails,
                   mma_scale_code_sets, run_and_check)

pytestmark = pytest.mark.gpu

SHAPES = [(1, 257, 256), (127, 257, 512), (64, 8192, 8192), (4096, 4096, 4096)]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_pairs_fp32_out(pair, m, n, k, gen):
    run_and_check(pair, m, n, k, "cuda", gen)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m,n,k", [(1, 200, 96), (16, 4160, 2080), (64, 4100, 1024), (130, 1000, 352)])
def test_quantize_weight_takes_the_mma_kernels_at_any_shape(pair, m, n, k, gen):
    """The quick start's weights (`bs.quantize_weight`) are "mma_m16k16" on Hopper and every N and K runs the mma
    kernels (padded inside), fp32 within the bound; bf16 output with bias too."""
    run_and_check(pair, m, n, k, "cuda", gen, data_layout="default")
    assert backend_used(pair, m) == "mma"
    run_and_check(pair, m, n, k, "cuda", gen, out_dtype=torch.bfloat16, bias=True, data_layout="default")
    assert backend_used(pair, m) == "mma"
    assert bs.quantize_weight(torch.randn(n, k, device="cuda"), pair[1]).data_layout == "mma_m16k16"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_pairs_low_precision_out(pair, out_dtype, gen):
    run_and_check(pair, 127, 257, 512, "cuda", gen, out_dtype=out_dtype, bias=True)


@pytest.mark.parametrize("layout", ["swizzle_32_4_4", "cdna4_32"])
@pytest.mark.parametrize("pair", [("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"), ("bf16", "mxfp4")], ids=lambda p: f"{p[0]}x{p[1]}")
def test_swizzled_scales(pair, layout, gen):
    run_and_check(pair, 200, 300, 1024, "cuda", gen, layout=layout)


@pytest.mark.parametrize("pair", [("bf16", "nvfp4"), ("mxfp8", "mxfp8")], ids=lambda p: f"{p[0]}x{p[1]}")
def test_8192_cubed(pair, gen):
    run_and_check(pair, 8192, 8192, 8192, "cuda", gen)


MMA_PAIRS = [("bf16", "mxfp4"), ("bf16", "nvfp4"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"),
             ("bf16", "mxfp8"), ("mxfp8", "mxfp8")]


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_mma_pairs(pair, m, gen):
    """The tensor-core decode kernel ("mma_m16k16" weights, the default for them at M <= 16):
    split-K at the decode shape, one window without split, bias and bf16 out, one and two
    row groups per warp, B per warp or shared (loads one window ahead or not), narrow
    activations' scales in three layouts."""
    run_and_check(pair, m, 8192, 8192, "cuda", gen, data_layout="mma_m16k16")
    assert backend_used(pair, m) == "mma"
    # 1 or 2 16-row groups per warp, B per warp or per program (with it: window w + 1's words loaded
    # ahead or not), split and not
    for row_groups, (shared_b, ahead) in itertools.product((1, 2), ((False, 0), (True, 0), (True, 1))):
        config = {"row_groups": row_groups, "shared_b": shared_b, "ahead": ahead}
        run_and_check(pair, m, 2048, 2048, "cuda", gen, data_layout="mma_m16k16", config=config)
        run_and_check(pair, m, 256, 1024, "cuda", gen, data_layout="mma_m16k16", config={**config, "max_split": 1})
    assert_split_k_workspaces_zero()
    run_and_check(pair, m, 64, 64, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
    run_and_check(pair, m, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.float16, bias=True)
    assert backend_used(pair, m) == "mma"
    if pair[0] != "bf16":  # narrow activations' scales in place in every layout
        for layout in ("swizzle_32_4_4", "cdna4_16"):
            run_and_check(pair, m, 1024, 2048, "cuda", gen, layout=layout, data_layout="mma_m16k16")
            assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_launch_from_addresses(pair, gen):
    """After a plan's first two calls (Triton's launch, then a direct one that binds its `DirectLaunch`), calls
    launch from their operands' addresses alone (`api._mma_run`, `DirectLaunch.launch_addresses`): four calls of each
    plan, each with fresh operands (activation, weights, bias, poisoned output), match the reference: M = 1, split-K
    at M = 16 in the workspace and in clusters, M = 40 (mma_m64_kernel), with and without bias; the plan's launcher
    is bound after them and the workspace is zero."""
    from blockscaled.kernels import api

    cases = ((1, 2048, 2048, None, False), (16, 2048, 2048, {"split": 4}, False),
             (16, 10240, 2048, {"split": 4, "row_groups": 2, "shared_b": True}, True), (40, 1024, 2048, None, True))
    for m, n, k, config, bias in cases:
        out_dtype = torch.bfloat16 if bias else torch.float32
        for call in range(4):
            a, b = make_operands(pair, m, n, k, "cuda", gen, "rowmajor", "mma_m16k16")
            bias_t = torch.randn(n, generator=gen).to("cuda", out_dtype) if bias else None
            out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
            bs.scaled_mm(a, b, out_dtype=out_dtype, bias=bias_t, out=out, config=config)
            err = max_rel_err(out, ref_scaled_mm(a, b, bias=bias_t))
            assert err <= TOLERANCE[out_dtype], f"{pair} M={m} {n}x{k} {config} call {call}: max_rel_err {err:.3g}"
        options = plans.mma_options_for(config, a, b, m, n)
        (plan,) = [plan for key, plan in api._LAUNCHES.items()
                   if key[:5] == ("mma", bs.SUPPORTED_PAIRS[pair], m, n, k) and key[6] == out_dtype
                   and key[7] == (bias_t.dtype if bias else None) and key[-1] == options]
        assert plan.launch.keywords["_launcher"].sources is not None, (m, n, k, config)
    assert_split_k_workspaces_zero()


@pytest.mark.parametrize("pair", [("bf16", "nvfp4"), ("bf16", "mxfp8")], ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 16, 64])
def test_mma_pdl_chain(pair, m, gen):
    """Programmatic dependent launches (the default on sm_90 up to M = 16; asked for here at every M): each call of a chain reads the output of the call
    before it (y <- y @ W^T, N = K), which that call writes after letting the next one launch. Eagerly and replayed
    from a CUDA graph, with every output poisoned (NaN) first, each step matches the reference on its own input; the
    plan's launcher runs with PDL. (Each step scales the values by about 2^8: bf16 holds four.)"""
    from blockscaled.kernels import api

    n = k = 4096
    x, b = make_operands(pair, m, n, k, "cuda", gen, "rowmajor", "mma_m16k16")
    ys = [x] + [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(4)]

    def chain():
        for i in range(4):
            bs.scaled_mm(ys[i], b, out_dtype=torch.bfloat16, out=ys[i + 1], config={"pdl": True})

    def check(how):
        for i in range(4):
            err = max_rel_err(ys[i + 1], ref_scaled_mm(ys[i], b))
            assert err <= TOLERANCE[torch.bfloat16], f"{pair} M={m} {how} step {i}: max_rel_err {err:.3g}"

    for y in ys[1:]:
        y.fill_(float("nan"))
    chain()  # Triton's launch, then direct ones
    check("first")
    for y in ys[1:]:
        y.fill_(float("nan"))
    chain()  # launched from addresses
    check("eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for y in ys[1:]:
        y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check("graph")
    (plan,) = [plan for key, plan in api._LAUNCHES.items() if key[:5] == ("mma", bs.SUPPORTED_PAIRS[pair], m, n, k)]
    assert plans._mma_pdl(plan) and plan.launch.keywords["_launcher"].pdl

@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 9, 16])
def test_mma_k_warps(pair, m, gen):
    """K split over the warps of a program (k_warps > 1, summed in shared memory): 2 to 16
    warps, or with shared B 2 to 8 K slices of 4 warps (each slice exchanging its own B, one
    with windows loaded ahead), one and two row groups, one window per warp or slice (K = 64
    k_warps), two windows per loop iteration ("unroll": 2, with 8 slices and with split-K), bias and bf16 / fp16 out (that such plans take no split-K workspace is checked on
    the CPU, test_k_warps_options)."""
    for shared_b, k_warps, row_groups in [(False, k, r) for k in (2, 4, 16) for r in (1, 2)] + [
            (True, k, r) for k in (2, 4, 8) for r in (1, 2)]:
        config = {"k_warps": k_warps, "row_groups": row_groups, "shared_b": shared_b}
        run_and_check(pair, m, 2048, 2048, "cuda", gen, data_layout="mma_m16k16", config=config)
        run_and_check(pair, m, 256, 64 * k_warps, "cuda", gen, data_layout="mma_m16k16", config=config)
    run_and_check(pair, m, 2048, 4096, "cuda", gen, data_layout="mma_m16k16",
                  config={"k_warps": 4, "row_groups": 1, "shared_b": True, "ahead": 1})
    run_and_check(pair, m, 128, 1024, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"k_warps": 8, "shared_b": False})
    run_and_check(pair, m, 1024, 1536, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.float16, bias=True,
                  config={"k_warps": 8, "row_groups": 1, "shared_b": True})
    # two windows per loop iteration (the default with 8 slices for fp4 weights): 1, 3 (a remainder
    # iteration) and 4 windows per slice; and split-K with two row groups
    for k in (512, 1536, 2048):
        run_and_check(pair, m, 1024, k, "cuda", gen, data_layout="mma_m16k16",
                      config={"k_warps": 8, "row_groups": 1, "shared_b": True, "ahead": 1, "unroll": 2})
    run_and_check(pair, m, 2048, 2048, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"max_split": 4, "row_groups": 2, "shared_b": True, "ahead": 1, "unroll": 2})
    assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_m16_shape_defaults(pair, gen):
    """The M = 16 defaults that depend on the shape beyond 8192^2: at 57344 x 8192 split-K by 2 summed in clusters
    on sm_90 (`plans._mma_m16_cluster_split`), else 4 K slices of two row groups, and split-K with one
    window ahead for fp8 weights from K = 16384 (`plans.MMA_FP8_M16_AHEAD_K`; fp4 weights: none ahead), and at 4096^2 one
    row group, split 8 in clusters, one window ahead (`plans._mma_m16_one_group_split`), bias and bf16 out."""

    run_and_check(pair, 16, 57344, 8192, "cuda", gen, data_layout="mma_m16k16")
    clusters = plans._has_wgmma(torch.device("cuda"))
    assert mma_plan_tails(pair, 16, 57344, 8192) == {(2, 2, True, 0, 1, False) if clusters else (2, 1, True, 0, 4, False)}
    run_and_check(pair, 16, 1024, 16384, "cuda", gen, data_layout="mma_m16k16")
    (row_groups, split, shared_b, ahead, k_warps, _), = mma_plan_tails(pair, 16, 1024, 16384)
    assert (row_groups, shared_b, k_warps, ahead) == (2, True, 1, int(pair[1] == "mxfp8")) and split > 1
    run_and_check(pair, 16, 4096, 4096, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
    tail, = mma_plan_tails(pair, 16, 4096, 4096)
    assert tail == (1, 8, True, 1, 1, False) if clusters else tail[0] == 2  # (ROW_GROUPS, SPLIT, ...)
    assert backend_used(pair, 16) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 16, 64])
def test_mma_hints_either_way(pair, m, gen):
    """The L2 hints as Triton writes them and as inline PTX with policies made once ("hoist", the default only for fp4 /
    fp8 activations on fp4 weights at 1 < M <= 16): both at the default plan, split-K with B per warp, K slices with
    shared B, and at M = 64 mma_m64_kernel (no hints by default there)."""
    hints = [{"evict": True, "hoist": hoist} for hoist in (False, True)]
    for config in hints:
        run_and_check(pair, m, 2048, 4096, "cuda", gen, data_layout="mma_m16k16", config=config)
        if m <= 16:
            run_and_check(pair, m, 1024, 2048, "cuda", gen, data_layout="mma_m16k16",
                          config={**config, "max_split": 4, "row_groups": 1, "shared_b": False})
            run_and_check(pair, m, 1024, 2048, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                          config={**config, "k_warps": 8, "row_groups": 1, "shared_b": True, "ahead": 1, "unroll": 2})
    assert_split_k_workspaces_zero()
    assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 9, 16])
def test_mma_uneven_split(pair, m, gen):
    """Split-K factors that do not divide the K / 64 windows (parts of W / split or W / split + 1 windows): 3 to 31
    parts, one and two row groups, B per warp or shared, bias and bf16 out, 13 parts at M = 16, 10240 x 8192, and the
    default plan's at 31 windows."""
    for n, k, config in [(1024, 1984, {"split": 3}), (1024, 1984, {"split": 31}), (2048, 8192, {"split": 13}),
                         (2048, 8192, {"split": 13, "row_groups": 1, "shared_b": False}),
                         (256, 1024, {"split": 5, "row_groups": 1, "shared_b": True})]:
        run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", config=config)
    run_and_check(pair, m, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"split": 7})
    assert_split_k_workspaces_zero()
    if m == 16:
        run_and_check(pair, 16, 10240, 8192, "cuda", gen, data_layout="mma_m16k16", config={"split": 13})
        assert mma_plan_tails(pair, 16, 10240, 8192) == {(2, 13, True, 0, 1, False)}
    # by default where no split of 8 divides the windows (31; Qwen2.5-72B's 462): a split that does not divide them
    run_and_check(pair, m, 256, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
    splits = {tail[1] for tail in mma_plan_tails(pair, m, 256, 1984)}
    assert splits and all(31 % s for s in splits), splits
    assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 9, 16])
def test_mma_uneven_k_warps(pair, m, gen):
    """K warps that do not divide the K / 64 windows (`mma_gemv.tail_window`: every warp `steps` windows, then the
    first W mod k_warps one more, the others a zeroed B): Qwen2.5-7B's K = 3584 (56 windows: 16 warps of 3 or 4) and
    18944 (296: 16 of 18 or 19), 31 windows over 8 warps of one row group and 16 of two, with the L2 policies hoisted,
    bias and bf16 out; against the fp64 reference, into NaN-poisoned outputs."""
    for n, k, config in [(3584, 3584, {"k_warps": 16, "shared_b": False}),
                         (512, 18944, {"k_warps": 16, "shared_b": False}),
                         (1024, 1984, {"k_warps": 8, "shared_b": False, "row_groups": 1}),
                         (1024, 1984, {"k_warps": 16, "shared_b": False, "row_groups": 2, "hoist": True})]:
        run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", config=config)
    run_and_check(pair, m, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"k_warps": 4, "shared_b": False})
    if m == 1:  # by default at 8192 x 1984 (31 windows, >= 0.4 of a wave): 16 warps with a tail; fp4 / fp8
        # activations on fp4 weights over their rows decoded to bf16 first (`plans.MMA_PREDECODE_TAIL`)
        run_and_check(pair, 1, 8192, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
        assert {tail[-2] for tail in mma_plan_tails(pair, 1, 8192, 1984)} == {16}
    assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 9, 16])
def test_mma_preload(pair, m, gen):
    """Every window's words loaded before the first mma ("preload", `mma_gemv.preloaded_windows`): 16 warps of 4
    windows (Llama-3-8B's K = 4096), split-K programs of 4 (and at M = 1 of 7: K = 14336 over 32), 8 warps of 3 and a
    tail (31 windows), two row groups with the L2 policies hoisted, one window a warp with bias and bf16 out; against
    the fp64 reference, into NaN-poisoned outputs."""
    cases = [(1024, 4096, {"k_warps": 16, "row_groups": 1}), (512, 14336, {"split": 56, "row_groups": 1}),
             (1024, 1984, {"k_warps": 8, "row_groups": 1}), (1024, 2048, {"split": 16, "row_groups": 2, "hoist": True})]
    if m == 1:
        cases.append((512, 14336, {"split": 32, "row_groups": 1}))
    for n, k, config in cases:
        run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", config={**config, "preload": True})
    run_and_check(pair, m, 1024, 512, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"k_warps": 8, "row_groups": 1, "preload": True})
    assert_split_k_workspaces_zero()
    assert backend_used(pair, m) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_m64_uneven_split(pair, gen):
    """mma_m64_kernel with split-K factors that do not divide the K / 64 windows (parts of W / split or W / split + 1
    windows, loads past a part's end clamped to the last window): parts of 1 or 2 windows (30 of 31), 6 parts of 21 or
    22 windows 3 ahead with two windows per iteration (an odd count), 7 parts 2 ahead with scalar workspace adds, 3
    parts on mma.sync, bias and bf16 out, 128-row tiles (M = 128); M = 17, 40, 64, 128; the workspace zero after."""
    for m, n, k, config in [(64, 1024, 1984, {"split": 30}), (64, 256, 8192, {"split": 6, "ahead": 3, "unroll": 2}),
                            (17, 256, 1536, {"split": 7, "ahead": 2, "fragment_sums": False}),
                            (40, 512, 4096, {"split": 3, "wgmma": False}), (128, 256, 1984, {"split": 6})]:
        run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", config=config)
    run_and_check(pair, 64, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  config={"split": 7})
    assert_split_k_workspaces_zero()
    assert backend_used(pair, 64) == "mma"


@pytest.mark.parametrize("pair", MMA_PAIRS[2:5] + MMA_PAIRS[6:], ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 3, 8])
def test_mma_staged_b(pair, m, gen):
    """fp4 / fp8 activations staged in shared memory (each warp decodes its K range once): 1 to 16
    chunks of 16 K per lane (M x steps not a multiple of 8 too: the lanes start over), 2 to 16 warps, one and two row groups, the largest buffer (M = 1,
    K = 16384), bias and bf16 / fp16 out, swizzled scales; the default at M = 1 (8192^2) stages."""
    shapes = {1: [(2048, 8192, 16, 1), (256, 16384, 2, 2), (256, 1024, 2, 1), (2048, 4096, 16, 1)],
              3: [(2048, 2048, 4, 1), (256, 4096, 2, 2), (256, 2048, 8, 1)], 8: [(1024, 1024, 2, 2), (2048, 1536, 4, 1), (256, 1536, 2, 1)]}
    for n, k, k_warps, row_groups in shapes[m]:
        config = {"stage_b": True, "k_warps": k_warps, "row_groups": row_groups, "shared_b": False}
        run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", config=config)
    n, k, k_warps, _ = shapes[m][0]
    config = {"stage_b": True, "k_warps": k_warps, "shared_b": False}
    run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True, config=config)
    run_and_check(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.float16, bias=True, config=config)
    for layout in ("swizzle_32_4_4", "cdna4_16"):
        run_and_check(pair, m, n, k, "cuda", gen, layout=layout, data_layout="mma_m16k16", config=config)
    assert backend_used(pair, m) == "mma"
    if m == 1:
        run_and_check(pair, 1, 8192, 8192, "cuda", gen, data_layout="mma_m16k16")
        assert mma_plan_staged(pair, 1, 8192, 8192)


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [17, 40, 64])
def test_mma_m64_pairs(pair, m, gen):
    """16 < M <= 64 (mma_m64_kernel: 8 warps of 16 rows, one B window per program exchanged
    through shared memory; wgmma on sm_90, and mma.sync; 1 to 3 windows loaded ahead): split-K
    at the decode shape and at K = 16384 (two windows per K-loop iteration for fp4 weights), without
    split, bias and bf16 / fp16 out, narrow activations' scales in three layouts."""
    run_and_check(pair, m, 8192, 8192, "cuda", gen, data_layout="mma_m16k16")
    assert backend_used(pair, m) == "mma"
    run_and_check(pair, m, 256, 16384, "cuda", gen, data_layout="mma_m16k16")  # fp4 weights: two windows per iteration
    for wgmma, ahead in ((True, 1), (True, 2), (True, 3), (False, 1), (False, 3)):  # windows loaded ahead
        config = {"wgmma": wgmma, "ahead": ahead}
        run_and_check(pair, m, 2048, 2048, "cuda", gen, data_layout="mma_m16k16", config={"max_split": 4, **config})
        if ahead != 2:
            run_and_check(pair, m, 256, 1024, "cuda", gen, data_layout="mma_m16k16", config={"max_split": 1, **config})
    # 2 windows, fewer than 3 ahead: the loads wrap around
    run_and_check(pair, m, 128, 128, "cuda", gen, data_layout="mma_m16k16", config={"max_split": 1, "ahead": 3})
    for wgmma in (True, False):  # 3 windows: a loop LLVM unrolls, with one exchange buffer for every copy
        run_and_check(pair, m, 128, 192, "cuda", gen, data_layout="mma_m16k16", config={"max_split": 1, "wgmma": wgmma})
        run_and_check(pair, m, 128, 192, "cuda", gen, data_layout="mma_m16k16",  # unrolled by 2, a remainder window
                      config={"max_split": 1, "wgmma": wgmma, "unroll": 2})
    assert_split_k_workspaces_zero()
    run_and_check(pair, m, 128, 64, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
    run_and_check(pair, m, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.float16, bias=True)
    assert backend_used(pair, m) == "mma"
    if pair[0] != "bf16":
        for layout in ("swizzle_32_4_4", "cdna4_16"):
            run_and_check(pair, m, 1024, 2048, "cuda", gen, layout=layout, data_layout="mma_m16k16")
            assert backend_used(pair, m) == "mma"


def three_calls(pair, m, n, k, config, bias, gen):
    """Three calls of one mma shape and config against the reference (poisoned outputs; fp32 out, or bf16 with bias):
    the first launched by Triton, the next ones directly (in clusters where the plan takes them). Returns the options,
    the cached plan and its launcher."""
    from blockscaled.kernels import api

    a, b = make_operands(pair, m, n, k, "cuda", gen, "rowmajor", "mma_m16k16")
    out_dtype = torch.bfloat16 if bias else torch.float32
    bias_t = torch.randn(n, generator=gen).to("cuda", out_dtype) if bias else None
    ref = ref_scaled_mm(a, b, bias=bias_t)
    for call in range(3):
        out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
        bs.scaled_mm(a, b, out_dtype=out_dtype, bias=bias_t, out=out, config=config)
        err = max_rel_err(out, ref)
        assert err <= TOLERANCE[out_dtype], f"{pair} M={m} {n}x{k} {config} call {call}: max_rel_err {err:.3g}"
    options = plans.mma_options_for(config, a, b, m, n)
    name = bs.SUPPORTED_PAIRS[pair]
    (plan,) = [plan for key, plan in api._LAUNCHES.items() if key[:5] == ("mma", name, m, n, k) and key[-1] == options]
    return options, plan, plan.launch.keywords["_launcher"]


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [17, 40, 64])
def test_mma_m64_cluster_sums(pair, m, gen):
    """Split-K parts summed in thread-block clusters (`decode.MMA_CLUSTER_SUM_PTX`): a shape's first call runs
    through Triton's launch, without clusters (the workspace epilogue), the next ones directly in clusters of
    SPLIT CTAs where the plan takes them (more than MMA_CLUSTER_PROGRAMS_PER_SM programs per SM, the accumulators
    divisible by SPLIT, which is 2, 4 or 8); every call matches the reference (poisoned output): the decode shapes
    (8192^2: 256 programs of split 4, or 384 of split 6 where 3 per SM are counted; no clusters), split 2, 4 and 8 on grids that take them, with bias and bf16 out; the workspace stays
    zero."""

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clustered_splits = set()
    for n, k, config, bias in ((8192, 8192, None, False), (10240, 8192, None, False), (17024, 1024, {"max_split": 2}, True),
                               (8576, 2048, {"max_split": 4}, False), (4352, 2048, {"max_split": 8}, False)):
        _, plan, launcher = three_calls(pair, m, n, k, config, bias, gen)
        programs = n // 128 * plan.split
        clustered = (plan.split in (2, 4, 8) and programs > plans.MMA_CLUSTER_PROGRAMS_PER_SM * sms
                     and (4 * -(-m // 8)) % plan.split == 0)
        assert plan.consts.CLUSTER is clustered and launcher.cluster == (plan.split if clustered else 1), (m, n, plan.split)
        assert launcher.kernel is not None and launcher.launcher.metadata[1] == launcher.cluster  # the direct launch's
        clustered_splits |= {plan.split} if clustered else set()
    assert {2, 4} <= clustered_splits and (m != 64 or 8 in clustered_splits)
    assert_split_k_workspaces_zero()


def offset_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` that starts 8 bytes into its storage (8-byte, not 16-byte aligned)."""
    pad = 8 // t.element_size()
    flat = torch.empty(t.numel() + pad, device=t.device, dtype=t.dtype)[pad:]
    return flat.view(t.shape).copy_(t)


WIDE_B_PAIRS = [("bf16", "nvfp4"), ("bf16", "mxfp4"), ("bf16", "mxfp8"), ("mxfp8", "mxfp4"), ("mxfp8", "mxfp8")]


@pytest.mark.parametrize("pair", WIDE_B_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_m64_wide_b(pair, gen):
    """bf16 and fp8 activations above M = 16 load a thread's B share with 16-byte loads ("wide_b", the default where
    the activation's data is 16-byte aligned), and with 8-byte ones where it is not (data 8 bytes into its storage:
    the 16-byte loads would fault): both against the reference, with split-K, mma.sync, 3 windows ahead, 128-row
    tiles, bias and bf16 out; M = 17, 40, 64, 130."""

    for m, n, k, config in ((17, 1024, 2048, None), (40, 512, 4096, {"split": 3, "wgmma": False}),
                            (64, 1024, 2048, {"ahead": 3, "max_split": 2}), (64, 8192, 8192, None),
                            (130, 256, 1984, {"tile_m": 128})):
        a, b = make_operands(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16")
        shifted = (offset_copy(a) if pair[0] == "bf16" else
                   bs.QTensor(offset_copy(a.data), a.scale, a.fmt, a.layout, a.global_scale))
        ref = ref_scaled_mm(a, b)
        if pair[0] != "bf16":  # the kernel's own loads of the fp8 activation (not the rows of "predecode")
            config = {**(config or {}), "predecode": False}
        for x, wide in ((a, True), (shifted, False)):
            assert plans.mma_options_for(config, x, b, m, n).wide_b is wide
            out = torch.full((m, n), float("nan"), device="cuda")  # poison
            err = max_rel_err(bs.scaled_mm(x, b, out_dtype=torch.float32, out=out, config=config), ref)
            assert err <= TOLERANCE[torch.float32], (m, n, k, config, wide, err)
    run_and_check(pair, 64, 1024, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True)
    assert_split_k_workspaces_zero()


PREDECODE_PAIRS = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp4"), ("mxfp8", "mxfp8")]


@pytest.mark.parametrize("layout", ["rowmajor", "swizzle_32_4_4", "cdna4_16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_dequantize_kernel_every_code_and_scale(fmt, layout):
    """`dequantize_kernel` on the GPU: every data byte and every scale code, subnormal products included."""
    dequantizes_every_code_and_scale(fmt, layout, "cuda")


@pytest.mark.parametrize("pair", PREDECODE_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_predecode(pair, gen):
    """fp4 / fp8 activations decoded to bf16 rows by `dequantize_kernel` before the mma kernel ("predecode": the
    default above M = 16 on fp4 weights; given for fp8 weights and at M = 16), and decoded in the mma kernel
    ("predecode" False), each against the reference: M = 16, 17, 40 (split 3, swizzled scales), 64 at 8192^2, 130
    (128-row tiles); then one plan called with fresh activations (launched from their addresses), and replayed from a
    CUDA graph after the activation's values changed in place."""
    from blockscaled.kernels import api

    given = {} if bs.FORMATS[pair[1]].is_packed else {"predecode": True}
    for m, n, k, layout, config in ((16, 1024, 2048, "rowmajor", {"predecode": True}), (17, 1024, 2048, "rowmajor", given),
                                    (40, 512, 4096, "swizzle_32_4_4", {**given, "split": 3}),
                                    (64, 8192, 8192, "rowmajor", given), (130, 256, 1984, "rowmajor", {**given, "tile_m": 128})):
        a, b = make_operands(pair, m, n, k, "cuda", gen, layout, data_layout="mma_m16k16")
        ref = ref_scaled_mm(a, b)
        for cfg, predecoded in ((config or None, True), ({**config, "predecode": False}, False)):
            assert plans.mma_options_for(cfg, a, b, m, n).predecode is predecoded
            out = torch.full((m, n), float("nan"), device="cuda")  # poison
            err = max_rel_err(bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, config=cfg), ref)
            assert err <= TOLERANCE[torch.float32], (m, n, k, cfg, err)
    ran = {key[2] for key, plan in api._LAUNCHES.items()
           if key[1] == bs.SUPPORTED_PAIRS[pair] and getattr(plan, "predecode", None) and plan.predecode.launch is not None}
    assert ran >= {16, 17, 40, 64, 130}, ran
    # one plan, fresh activations each call; the decoded rows are the plan's, reused
    m, n, k = 64, 1024, 2048
    _, b = make_operands(pair, m, n, k, "cuda", gen, data_layout="mma_m16k16")
    bias = torch.randn(n, generator=gen).to("cuda").to(torch.bfloat16)
    for _ in range(3):
        a, _ = make_operands(pair, m, 8, k, "cuda", gen)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        err = max_rel_err(bs.scaled_mm(a, b, bias=bias, out=out, config=given or None), ref_scaled_mm(a, b, bias=bias))
        assert err <= TOLERANCE[torch.bfloat16], err
    options = plans.mma_options_for(given or None, a, b, m, n)
    (plan,) = [plan for key, plan in api._LAUNCHES.items()
               if key[1:5] == (bs.SUPPORTED_PAIRS[pair], m, n, k) and key[-1] == options]
    assert api._direct_launch(plan.predecode).sources is not None  # bound: launched from the operands' addresses
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bs.scaled_mm(a, b, bias=bias, out=out, config=given or None)
    fresh, _ = make_operands(pair, m, 8, k, "cuda", gen)
    a.data.copy_(fresh.data)
    a.scale.copy_(fresh.scale)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    err = max_rel_err(out, ref_scaled_mm(a, b, bias=bias))
    assert err <= TOLERANCE[torch.bfloat16], err
    assert_split_k_workspaces_zero()


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [65, 130, 256])
def test_mma_m64_tiles(pair, m, gen):
    """M > 64 on mma_m64_kernel (the default for "mma_m16k16" weights): a program per 64 (or, "tile_m",
    128) activation rows, the last tile partial at M = 65 and 130; split-K at the decode shape and without
    split, wgmma and mma.sync, two windows per iteration, bias and bf16 / fp16 out, narrow activations'
    scales in three layouts."""
    run_and_check(pair, m, 8192, 8192, "cuda", gen, data_layout="mma_m16k16")
    assert backend_used(pair, m) == "mma"
    for config in ({"max_split": 4}, {"max_split": 1, "wgmma": False}, {"max_split": 2, "ahead": 2, "unroll": 2},
                   {"tile_m": 128}, {"tile_m": 128, "max_split": 4, "unroll": 2}):
        run_and_check(pair, m, 1024, 2048, "cuda", gen, data_layout="mma_m16k16", backend="mma", config=config)
    assert_split_k_workspaces_zero()
    run_and_check(pair, m, 256, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  backend="mma")
    run_and_check(pair, m, 128, 64, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.float16, bias=True,
                  backend="mma")
    if pair[0] != "bf16":
        for layout in ("swizzle_32_4_4", "cdna4_16"):
            run_and_check(pair, m, 1024, 2048, "cuda", gen, layout=layout, data_layout="mma_m16k16", backend="mma")


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [65, 130, 256])
def test_mma_m64_sixteen_warps(pair, m, gen):
    """mma_m64_kernel with 16 warps ("warps": 16): 256 weight rows and 128 activation rows a program, each of the
    512 threads one row's share of the window; the last tile partial at M = 65 and 130, split-K through the workspace
    at output positions (even and uneven), two windows per iteration, bias and bf16 out, a ragged K."""
    for config in ({"warps": 16, "tile_m": 128, "max_split": 1}, {"warps": 16, "tile_m": 128, "split": 2},
                   {"warps": 16, "tile_m": 128, "split": 3, "unroll": 2}):
        run_and_check(pair, m, 1024, 2048, "cuda", gen, data_layout="mma_m16k16", backend="mma", config=config)
    assert_split_k_workspaces_zero()
    run_and_check(pair, m, 8192, 8192, "cuda", gen, data_layout="mma_m16k16", backend="mma",
                  config={"warps": 16, "tile_m": 128})
    run_and_check(pair, m, 512, 1984, "cuda", gen, data_layout="mma_m16k16", out_dtype=torch.bfloat16, bias=True,
                  backend="mma", config={"warps": 16, "tile_m": 128, "split": 2})


@pytest.mark.parametrize("pair", MMA_PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("m", [1, 17, 64, 65])
def test_mma_layout_at_ragged_n(pair, m, gen):
    """"mma_m16k16" weights at N % 64 != 0 and, past M = 16, at N % 128 != 0 (the layout pads N) take the mma kernels,
    not the k_order copy, and write only the N columns asked for."""
    run_and_check(pair, m, 1000 - 8 if m == 1 else 1024 + 64, 2048, "cuda", gen, data_layout="mma_m16k16")
    assert backend_used(pair, m) == "mma"



@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_mma_decodes_every_byte_and_scale(fmt):
    """Every code in every register slot and lane, and every scale code the layout holds
    (zero, negative and subnormal E4M3 scales; E8M0 codes over both halves of their range):
    exact."""
    decodes_every_byte(fmt, "cuda", "mma", data_layout="mma_m16k16")
    decodes_every_scale(fmt, "cuda", "mma", mma_scale_code_sets(fmt), data_layout="mma_m16k16")


@pytest.mark.parametrize("pair", MMA_PAIRS[2:5], ids=lambda p: f"{p[0]}x{p[1]}")
def test_mma_decodes_every_activation_code_and_scale(pair):
    """Narrow activations' B decode: every code at every window position in both column
    groups, every scale code (NaN, negative, zero, subnormal E4M3; E8M0 2..255): exact."""
    mma_decodes_every_activation_code(pair, "cuda")
    mma_decodes_every_activation_scale(pair, "cuda")
    if pair[0] == "mxfp8":
        mma_decodes_activation_nan("cuda")


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_dense_plan(pair, out_dtype, gen):
    """Weights decoded to bf16 then cuBLAS, in chunks of 256 rows, N and K the layout pads, with bias."""
    run_and_check(pair, 600, 1000, 992, "cuda", gen, out_dtype=out_dtype, bias=True, data_layout="default",
                  backend="dense", config={"chunk_rows": 256})


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_dense_plan_is_the_default_from_dense_min_m(pair, gen, monkeypatch):
    """From the first row count `api._dense_runs` gives the dense plan (DENSE_MIN_M, or where the 16-warp tile fits one
    wave past it) the default call takes it (one weight decode launch, no mma kernel); a row fewer, none."""
    from blockscaled.kernels import api, dense

    decode, calls = dense.decode_weights, []

    def counted(b, r0, rows, *rest):
        calls.append((r0, rows))
        return decode(b, r0, rows, *rest)

    monkeypatch.setattr(dense, "decode_weights", counted)
    first = next(m for m in range(api.DENSE_MIN_M, api.DENSE_MIN_M_SIXTEEN_WARPS + 1)  # (its rule: tests/test_mma_layout.py)
                 if api._dense_runs(f"{pair[0]}x{pair[1]}", m, 4096, torch.device("cuda")))
    run_and_check(pair, first - 1, 4096, 4096, "cuda", gen, data_layout="default")
    assert calls == []
    run_and_check(pair, first, 4096, 4096, "cuda", gen, data_layout="default")
    assert calls == [(0, 4096)]


def _tuned_cells() -> list:
    """One id per entry of the committed tables (`kernels/tuned/`): this GPU's table where a GPU is present (each cell
    compiles its own config, ~10 s: one id for all of a pair's 49 cells ran past a 10-minute device command), every
    table's otherwise (collected, then skipped for want of a GPU)."""
    from blockscaled.kernels import tuned

    gpus = ([tuned.gpu_key(torch.cuda.get_device_name())] if torch.cuda.is_available()
            else sorted(path.stem for path in tuned.TABLES.glob("*.json")))
    return [pytest.param(gpu, e, id=f"{gpu}-{e['pair']}-m{e['m']}-{e['n']}x{e['k']}")
            for gpu in gpus for e in tuned.table(gpu)]


@pytest.mark.parametrize("gpu,entry", _tuned_cells())
def test_tuned_cells_of_this_gpu(gpu, entry, gen):
    """A cell of this GPU's committed table (`kernels/tuned/`), called as a user calls it (the device's default
    weights, no config): the tuned config is the one taken, fp32 and bf16 out within the bound."""
    from blockscaled.kernels import api, tuned

    assert tuned.gpu_key(torch.cuda.get_device_name()) == gpu, "collected on another GPU model"
    pair = next(p for p in PAIRS if f"{p[0]}x{p[1]}" == entry["pair"])
    m, n, k = entry["m"], entry["n"], entry["k"]
    # which config the call takes depends on the operands' kinds and alignment, not their size: small stand-ins
    # (run_and_check makes the cell's own)
    a, b = make_operands(pair, m, 256, 128, "cuda", gen, data_layout="default")
    taken = api._tuned_options(gpu, entry["pair"], a, b, m, n, k)
    assert (taken is None) == (not entry["config"]), (entry, taken)
    run_and_check(pair, m, n, k, "cuda", gen, data_layout="default")
    run_and_check(pair, m, n, k, "cuda", gen, data_layout="default", out_dtype=torch.bfloat16, bias=True)
    assert backend_used(pair, m) == "mma"
