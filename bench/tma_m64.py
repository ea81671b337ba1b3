"""`python -m bench.tma_m64`: a probe of Triton's own Hopper pipeline for bf16 x mxfp4 at M = 64.

`mma_m64_kernel` loads its weights and activation with per-thread loads one window ahead (registers hold what is in
flight) and exchanges the activation through shared memory behind a CTA barrier every window. Triton, given tensor
descriptors, does the other thing by itself: TMA copies of both operands into a ring of STAGES slots behind mbarriers
(no registers), the weights' bytes read from shared memory straight into wgmma's register-A layout (a `local_load`
into `dot_op`, no layout conversion: sm_90 TTGIR checked), and wgmma reading the activation from shared memory.

The weights are "block_pairs" (`blockscaled.layouts.data`): byte j of a 64-K window holds element j of the first
32-block (low nibble) and element j of the second (high nibble), so one elementwise decode (`E2M1X2_TO_BF16_PTX`)
gives the two blocks as two [BN, 32] operands, each times its row's E8M0 scale (exact in bf16), and two dots of K = 32
against the two halves of the activation window. Split-K parts add fp32 sums into a zeroed fp32 output.

It checks every variant's fp32 output against the fp64 reference, then times a CUDA graph of (zero the output, the
kernel) over cold weight copies against cuBLAS bf16 and the library's default plan in the same process. Without a GPU
it compiles each variant for sm_90 and prints the K loop's SASS counts (`--sass`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from blockscaled.kernels.decode import E2M1X2_TO_BF16_PTX

DECODE = tl.constexpr(E2M1X2_TO_BF16_PTX)
DEFAULT_VARIANTS = [{"bn": 128, "bk": 64, "stages": 4, "warps": 8, "split": 4}]


@triton.jit
def tma_m64_kernel(w_desc, x_desc, scale, out, N, K: tl.constexpr, M: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    """out[M, N] += x[M, K] @ dequant(w)[N, K]^T for the K part of this program (parts last, rows first)."""
    pid = tl.program_id(0)
    tiles = N // BN
    n0 = (pid % tiles) * BN
    part = pid // tiles
    steps = K // BK
    first = part * steps // SPLIT
    last = (part + 1) * steps // SPLIT
    rows = n0 + tl.arange(0, BN)
    acc = tl.zeros([BN, M], tl.float32)
    for step in tl.range(first, last, num_stages=STAGES, warp_specialize=WS):
        for p in tl.static_range(BK // 64):
            k = step * BK + 64 * p
            lo, hi = tl.inline_asm_elementwise(DECODE, "=r,=r,=r,=r,r", [w_desc.load([n0, k // 2])],
                                               dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
            # E8M0 -> bf16 2^(e - 127): the byte is the bf16 exponent field
            s0 = (tl.load(scale + rows * (K // 32) + k // 32).to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
            s1 = (tl.load(scale + rows * (K // 32) + k // 32 + 1).to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
            acc = tl.dot(lo * s0[:, None], x_desc.load([0, k]).T, acc)
            acc = tl.dot(hi * s1[:, None], x_desc.load([0, k + 32]).T, acc)
    cols = tl.arange(0, M)
    tl.atomic_add(out + cols[None, :] * N + rows[:, None], acc, sem="relaxed")


def launcher(x: torch.Tensor, b, v: dict):
    """A call of the probe on bf16 activations `x` [M, K] and mxfp4 weights `b` (QTensor, rowmajor scales, block_pairs
    data) with variant `v`; returns (call, out)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = b.shape[0]
    bn, bk, split = v["bn"], v["bk"], v["split"]
    if m != 64 or n % bn or k % bk or k // bk < split:
        raise ValueError(f"probe runs M = 64, N % {bn} == 0, K % {bk} == 0 with {split} parts; got {m} x {n} x {k}")
    w_desc = TensorDescriptor.from_tensor(b.data, [bn, 32])
    x_desc = TensorDescriptor.from_tensor(x, [m, 32])
    scale = b.kernel_scale
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    grid = (split * (n // bn),)
    kwargs = dict(K=k, M=m, BN=bn, BK=bk, SPLIT=split, STAGES=v["stages"], WS=v.get("ws", False),
                  num_warps=v["warps"])

    def call():
        out.zero_()
        tma_m64_kernel[grid](w_desc, x_desc, scale, out, n, **kwargs)

    return call, out


def sass_counts(v: dict, k: int = 8192, n: int = 8192) -> dict:
    """Compile variant `v` for sm_90 (no GPU needed) and count the K loop's SASS (`bench.sass.compiled_counts`)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .sass import compiled_counts

    bn = v["bn"]
    sig = {"w_desc": f"tensordesc<u8[{bn}, 32]>", "x_desc": "tensordesc<bf16[64, 32]>", "scale": "*u8",
           "out": "*fp32", "N": "i32"}
    cx = {"K": k, "M": 64, "BN": bn, "BK": v["bk"], "SPLIT": v["split"], "STAGES": v["stages"],
          "WS": v.get("ws", False)}
    names = list(tma_m64_kernel.arg_names)
    src = ASTSource(fn=tma_m64_kernel, signature={**sig, **{a: "constexpr" for a in cx}},
                    constexprs={(names.index(a),): val for a, val in cx.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": v["warps"], "num_stages": v["stages"]})
    with tempfile.TemporaryDirectory() as folder:
        return compiled_counts(kernel, Path(folder), "tma_m64")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.tma_m64", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--variants", type=json.loads, default=DEFAULT_VARIANTS,
                   help='JSON list of {"bn", "bk", "stages", "warps", "split", "ws"}')
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and count the loop's SASS (no GPU)")
    p.add_argument("--copies", type=int, default=4, help="cold weight copies the timed graph cycles through")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.sass:
        from .sass import outside_interpreter

        status = outside_interpreter("bench.tma_m64", argv)
        if status is not None:
            return status
        for v in args.variants:
            print(json.dumps({"variant": v, **sass_counts(v, args.K, args.N)}), flush=True)
        return 0
    import blockscaled as bs
    from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

    from .__main__ import time_ms

    m, n, k = 64, args.N, args.K
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    ws = [torch.randn(n, k, device="cuda", generator=gen) for _ in range(args.copies)]
    qs = [bs.quantize(w, "mxfp4", layout="rowmajor") for w in ws]
    del ws
    ref = ref_scaled_mm(x, qs[0])
    fns = [lambda w=w: torch.nn.functional.linear(x, w) for w in [torch.randn(n, k, device="cuda").to(torch.bfloat16)
                                                                   for _ in range(2)]]
    bf16_us = time_ms(lambda: [f() for f in fns], True) * 1e3 / 2
    del fns
    print(f"M={m} N={n} K={k} cublas_bf16 {bf16_us:.1f} us", flush=True)
    mma = [q.with_data_layout("mma_m16k16") for q in qs]
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in mma]
    err = max_rel_err(bs.scaled_mm(x, mma[0], out_dtype=torch.float32), ref)

    def library():
        for b, o in zip(mma, outs, strict=True):
            bs.scaled_mm(x, b, out=o)

    library()
    us = time_ms(library, True) * 1e3 / len(mma)
    print(f"library default (mma_m16k16) {us:7.1f} us {bf16_us / us:5.2f}x err={err:.1e}", flush=True)
    pairs = [q.with_data_layout("block_pairs") for q in qs]
    failed = 0
    for v in args.variants:
        name = json.dumps(v, sort_keys=True)
        try:
            calls = [launcher(x, b, v) for b in pairs]
            calls[0][0]()
            err = max_rel_err(calls[0][1], ref)
        except Exception as e:  # noqa: BLE001 - report the variant, keep going
            print(f"{name} FAILED to run: {type(e).__name__}: {str(e)[:300]}", flush=True)
            failed += 1
            continue
        ok = err <= 1e-5
        failed += not ok
        us = time_ms(lambda calls=calls: [c() for c, _ in calls], True) * 1e3 / len(calls)
        print(f"{name:80s} {us:7.1f} us {bf16_us / us:5.2f}x err={err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
