"""Shared helpers for the kernel tests: build operands for a pair, run, compare."""

import itertools

import torch

import blockscaled as bs
from blockscaled.layouts import pack_codes
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

PAIRS = list(bs.SUPPORTED_PAIRS)

# max_rel_err bound per output dtype. Every element x scale product is exact in bf16 and
# the dot accumulates in fp32 (DESIGN.md section 2), so fp32 output sits at fp32 summation
# error; bf16/fp16 outputs add one rounding of the output (2^-9 / 2^-12 relative).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}
# The Triton interpreter casts fp32 -> bf16 by truncation, not round-to-nearest (checked
# on triton 3.6): one output rounding can cost 2^-8 instead of 2^-9 there.
CPU_TOLERANCE = {**TOLERANCE, torch.bfloat16: 8e-3}
# The dense plan with bf16 output folds nvfp4's global scales into the decoded bf16 weights: each weight is rounded
# once more (2^-9 relative), besides the output's rounding; measured up to 4.1e-3 (H200, 600 x 1000 x 992).
DENSE_FOLDED_TOLERANCE = 8e-3
# and under the interpreter, whose truncating casts bias both roundings toward zero (they no longer average out)
CPU_DENSE_FOLDED_TOLERANCE = 1.6e-2


def make_operands(pair, m, n, k, device, gen, layout="rowmajor", data_layout="k_order"):
    fa, fb = pair
    x = torch.randn(m, k, generator=gen).to(device)
    w = torch.randn(n, k, generator=gen).to(device)
    # vary magnitudes per row so block scales differ across blocks
    w = w * torch.exp2(torch.randint(-4, 5, (n, 1), generator=gen)).to(device)
    a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa, layout=layout)
    if data_layout == "default":  # what a user gets: the device's layout (`bs.quantize_weight`)
        return a, bs.quantize_weight(w, fb, layout=layout)
    b = bs.quantize(w, fb, layout=layout, data_layout=data_layout)
    return a, b


def run_and_check(pair, m, n, k, device, gen, out_dtype=torch.float32, layout="rowmajor", bias=False,
                  data_layout="k_order", backend=None, config=None):
    a, b = make_operands(pair, m, n, k, device, gen, layout, data_layout)
    bias_t = torch.randn(n, generator=gen).to(device).to(out_dtype) if bias else None
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)  # poison
    got = bs.scaled_mm(a, b, out_dtype=out_dtype, bias=bias_t, out=out, backend=backend, config=config)
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "kernel left elements unwritten (NaN poison survived)"
    ref = ref_scaled_mm(a, b, bias=bias_t)
    err = max_rel_err(got, ref)
    tol = (TOLERANCE if torch.device(device).type == "cuda" else CPU_TOLERANCE)[out_dtype]
    if backend == "dense" and out_dtype == torch.bfloat16 and "nvfp4" in pair:
        tol = max(tol, DENSE_FOLDED_TOLERANCE if torch.device(device).type == "cuda" else CPU_DENSE_FOLDED_TOLERANCE)
    assert err <= tol, f"{pair} {m}x{n}x{k} {out_dtype}: max_rel_err {err:.3g}"
    return err


def backend_used(pair, m):
    """The backend of the most recent launch cached for this pair and M."""
    from blockscaled.kernels import api

    name = bs.SUPPORTED_PAIRS[pair]
    return [key[0] for key in api._LAUNCHES if key[1] == name and key[2] == m][-1]


def mma_plan_tails(pair, m, n, k):
    """The last 6 constexprs (ROW_GROUPS, SPLIT, SHARED_B, AHEAD, K_WARPS, STAGE_B) of the mma_gemv plans
    cached for this pair and shape."""
    from blockscaled.kernels import api

    name = bs.SUPPORTED_PAIRS[pair]
    return {plan.consts[-6:] for key, plan in api._LAUNCHES.items() if key[:5] == ("mma", name, m, n, k)}


def mma_plan_staged(pair, m, n, k):
    """Whether the mma plans cached for this pair and shape stage B (their last constexpr, STAGE_B)."""
    return {tail[-1] for tail in mma_plan_tails(pair, m, n, k)} == {True}


def decodes_every_byte(fmt, device, backend, data_layout="k_order"):
    """Row r of fp4 / fp8 weights repeats byte r ("mma_m16k16" fp8, which holds no NaN: 1.0 for
    the NaN bytes); one-hot activations pick the low (even K) and high (odd K) nibble of
    every fp4 byte, or the fp8 byte, at K positions of every word, register slot and lane:
    each output is one code times its scale, exact."""
    f = bs.FORMATS[fmt]
    k = 4 * f.block_size
    data = torch.arange(256, dtype=torch.uint8, device=device).unsqueeze(1).expand(256, f.data_cols(k)).contiguous()
    if not f.is_packed and data_layout == "mma_m16k16":
        data = torch.where(data & 0x7F == 0x7F, 0x38, data)
    scales = torch.full((256, k // f.block_size), 0.5, device=device).to(f.scale_dtype)
    b = bs.QTensor(data.view(f.storage_dtype), scales, fmt,
                   global_scale=torch.ones((), device=device) if fmt == "nvfp4" else None)
    b = b.with_data_layout(data_layout)
    for col in (0, 1, 2, 3, 5, 18, 39, k - 2, k - 1):
        a = torch.zeros(1, k, dtype=torch.bfloat16, device=device)
        a[0, col] = 3.0
        out = torch.full((1, 256), float("nan"), device=device)  # poison
        bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend=backend)
        torch.testing.assert_close(out, ref_scaled_mm(a, b).float(), rtol=0, atol=0)


def raw_qtensor(data, scale_codes, fmt):
    """QTensor of k_order `data` bytes and raw scale codes (global scale 1 for nvfp4)."""
    f = bs.FORMATS[fmt]
    g = torch.ones((), device=data.device) if fmt == "nvfp4" else None
    return bs.QTensor(data.view(f.storage_dtype), scale_codes.to(torch.uint8).contiguous().view(f.scale_dtype), fmt,
                      global_scale=g)


def fp4_weights(data, scale_codes, fmt, data_layout):
    """`raw_qtensor` of fp4 (or fp8) weights, stored in `data_layout`."""
    return raw_qtensor(data, scale_codes, fmt).with_data_layout(data_layout)


def decodes_every_scale(fmt, device, backend, code_sets=(range(256),), data_layout="k_order"):
    """Row r of fp4 / fp8 weights holds 1.0 everywhere and scale code r of a set in every
    block (default: all 256, NaN codes included); a one-hot activation picks one element:
    each output is that scale, exact (NaN where the scale is NaN)."""
    f = bs.FORMATS[fmt]
    k = 4 * f.block_size
    one = 0x22 if f.is_packed else 0x38  # E2M1 1.0 in both nibbles, E4M3 1.0
    data = torch.full((256, f.data_cols(k)), one, dtype=torch.uint8, device=device)
    for codes in code_sets:
        codes = torch.as_tensor(codes, dtype=torch.int32).to(torch.uint8).to(device).unsqueeze(1).expand(256, k // f.block_size)
        b = fp4_weights(data, codes, fmt, data_layout)
        a = torch.zeros(1, k, dtype=torch.bfloat16, device=device)
        a[0, k - 1] = 1.0
        out = torch.full((1, 256), 12345.5, device=device)  # poison: neither NaN nor any scale
        bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend=backend)
        torch.testing.assert_close(out, ref_scaled_mm(a, b).float(), rtol=0, atol=0, equal_nan=True)


def dequantizes_every_code_and_scale(fmt, layout, device, min_e8m0=0):
    """`dequantize_kernel` (the mma path's "predecode") gives the reference's element x block scale as bf16, value for
    value, NaN for NaN: every data byte and every scale code (E8M0 codes below `min_e8m0` raised to it), in changing
    neighbours, 5 rows over programs of 4."""
    from blockscaled.kernels.dequantize import dequantize_args, dequantize_config, dequantize_kernel
    from blockscaled.reference import dequantize

    f = bs.FORMATS[fmt]
    rows, k = 5, 1024
    data = ((torch.arange(rows * f.data_cols(k)) * 7) % 256).to(torch.uint8).view(rows, -1)
    scale = ((torch.arange(rows * k // f.block_size) * 3) % 256).to(torch.uint8).view(rows, -1)
    if f.scale_dtype == torch.float8_e8m0fnu:
        scale = scale.clamp(min=min_e8m0)
    q = bs.QTensor(data.view(f.storage_dtype), scale.view(f.scale_dtype), fmt,
                   global_scale=torch.ones(()) if fmt == "nvfp4" else None).with_layout(layout).to(device)
    out = torch.full((rows, k // f.block_size, f.block_size), float("nan"), dtype=torch.bfloat16, device=device)  # poison
    args = dequantize_args(q, out)
    dequantize_kernel.bind(args).compile_config(dequantize_config(q))(*args)
    want = dequantize(q, torch.float64).cpu()
    torch.testing.assert_close(out.view(rows, k).cpu(), want.to(torch.bfloat16), rtol=0, atol=0, equal_nan=True)


def assert_split_k_workspaces_zero():
    """Every split-K workspace and ticket set handed out so far (`kernels/scratch.py`) is zero again (the next call
    on that stream adds into it)."""
    from blockscaled.kernels import scratch

    torch.cuda.synchronize()
    sets = [work for work in scratch._eager.values() if work.workspace is not None]
    assert sets, "no split-K plan ran"
    for work in sets:
        for t in (work.workspace, work.tickets):
            assert not t.any(), f"split-K {t.dtype} workspace left non-zero"


def mma_scale_code_sets(fmt):
    """Scale codes one "mma_m16k16" tensor can hold, 256 rows each: every finite
    non-negative E4M3 code (zero and subnormals included) twice, or E8M0 codes over the lower
    and the upper end of their range: 2..128 and 128..254 for fp4 elements (the bf16 factor
    holds a 2^126 span per tensor), 10..134 and 130..254 for fp8 (2^124)."""
    from blockscaled.layouts.mma import ELEMENTS

    r = torch.arange(256, dtype=torch.int32)
    if fmt == "nvfp4":
        return [torch.where((r & 0x7F) == 0x7F, 0x38, r & 0x7F)]
    place = ELEMENTS[bs.FORMATS[fmt].element]
    low, span = 1 - place.min_exp, 254 - place.decode_shift - (1 - place.min_exp)
    return [low + r * span // 255, 254 - span + r * span // 255]


def picking_weights(fmt, n, k, stride, device):
    """fp4 "mma_m16k16" weights [n, K] with E2M1 1.0 at (r, stride * r) and zeros elsewhere,
    scales 1: output column r of a product is the activation element at K = stride * r."""
    f = bs.FORMATS[fmt]
    codes = torch.zeros(n, k, dtype=torch.uint8, device=device)
    codes[torch.arange(n, device=device), stride * torch.arange(n, device=device)] = 2
    return fp4_weights(pack_codes(codes), unit_scales(f, n, k, device), fmt, "mma_m16k16")


def unit_scales(f, rows, k, device):
    """Scale codes of 1.0 for [rows, K] of format `f`."""
    return torch.full((rows, k // f.block_size), 0x38 if f.scale_encoding == "e4m3" else 127, dtype=torch.uint8, device=device)


def mma_decodes_every_activation_code(pair, device):
    """fp4 / fp8 activations on the mma kernel: 16 rows over K = 512 (fp4) or 1024 (fp8) put
    every code at every position of a 64-K window (every nibble or byte, lane, step and
    register) and in both column groups (M = 16, each B path), staged (M = 8, twice), and at M = 64 in all eight;
    picking weights return each element, exact. fp8 NaN bytes (which turn their whole output
    row NaN) are left to `..._activation_nan`."""
    fa, fb = pair
    f = bs.FORMATS[fa]
    r = torch.arange(64, device=device).unsqueeze(1)
    if f.is_packed:
        k = 512
        j = torch.arange(256, device=device).unsqueeze(0)
        low = ((j >> 5) + 8 * (r % 2)) % 16
        data = low | ((low + 5 + r // 2) % 16) << 4
    else:
        k = 1024
        data = (torch.arange(k, device=device).unsqueeze(0) // 64 + 16 * r) % 256
        data = torch.where(data & 0x7F == 0x7F, 0x38, data)
    b = picking_weights(fb, k, k, 1, device)
    # each warp's B or the program's, staged (rows 0-7 and 8-15: fp8's two signs), and mma_m64_kernel's
    staged = {"stage_b": True, "k_warps": 2, "shared_b": False, "row_groups": 1}
    runs = [*((range(m), {"shared_b": shared}) for m, shared in itertools.product((1, 16), (False, True))),
            (range(8), staged), (range(8, 16), staged), (range(64), {})]
    for rows, config in runs:
        m = len(rows)
        a = raw_qtensor(data.to(torch.uint8)[rows.start:rows.stop].contiguous(), unit_scales(f, m, k, device), fa)
        out = torch.full((m, k), float("nan"), device=device)  # poison
        bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend="mma", config=config)
        torch.testing.assert_close(out, ref_scaled_mm(a, b).float(), rtol=0, atol=0)


def mma_decodes_every_activation_scale(pair, device):
    """Activations of value 1.0 on the mma kernel with scale code 128 r + i in block i of row
    r (all finite codes; E8M0 codes 0 and 1 read as 2 and 3: mma.sync flushes values below
    2^-126, see `kernels/mma_gemv.py`); picking weights return each block's scale, exact. Two
    more rows hold one NaN scale code each (E8M0: one row): the reference's rows are NaN
    throughout, and so must the kernel's be."""
    fa, fb = pair
    f = bs.FORMATS[fa]
    k = 128 * f.block_size
    codes = torch.arange(256, device=device)
    nan = torch.tensor([0x7F, 0xFF] if f.scale_encoding == "e4m3" else [255], device=device)
    unit = unit_scales(f, 1, f.block_size, device).item()
    codes = torch.where(torch.isin(codes, nan) | (codes < (2 if f.scale_encoding == "e8m0" else 0)), unit, codes)
    nan_rows = unit_scales(f, len(nan), k, device).to(codes.dtype)
    nan_rows[:, 5] = nan
    one = 0x22 if f.is_packed else 0x38
    rows = 2 + len(nan)
    a = raw_qtensor(torch.full((rows, k // 2 if f.is_packed else k), one, dtype=torch.uint8, device=device),
                    torch.cat([codes.reshape(2, 128), nan_rows]), fa)
    b = picking_weights(fb, 128, k, f.block_size, device)
    ref = ref_scaled_mm(a, b).float()
    assert ref[2:].isnan().all() and not ref[:2].isnan().any()
    staged = {"stage_b": True, "k_warps": 2, "shared_b": False, "row_groups": 1}
    for config in ({"shared_b": False}, {"shared_b": True}, staged):
        out = torch.full((rows, 128), 12345.5, device=device)  # poison: neither NaN nor any scale
        bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend="mma", config=config)
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


def mma_decodes_activation_nan(device):
    """An fp8 NaN byte in one activation row: that output row is NaN, the others exact."""
    a_data = torch.full((3, 256), 0x38, dtype=torch.uint8, device=device)
    a_data[1, 77] = 0xFF
    a = raw_qtensor(a_data, unit_scales(bs.FORMATS["mxfp8"], 3, 256, device), "mxfp8")
    b = picking_weights("mxfp4", 256, 256, 1, device)
    ref = ref_scaled_mm(a, b).float()
    assert ref[1].isnan().all() and not ref[[0, 2]].isnan().any()
    for shared_b in (False, True):
        out = torch.full((3, 256), 12345.5, device=device)
        bs.scaled_mm(a, b, out_dtype=torch.float32, out=out, backend="mma", config={"shared_b": shared_b})
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
