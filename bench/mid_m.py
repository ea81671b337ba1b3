"""`python -m bench.mid_m`: a probe of Triton's own Hopper pipeline for fp4 weights at 128 <= M <= 1024 (issue #61).

Between decode and prefill the library runs `mma_m64_kernel` (M < 512: 0.5-0.6x of cuBLAS bf16 at M = 256 on an
H200) or decodes the weights to bf16 for cuBLAS (the dense plan: 0.62-0.66x at M = 512, 0.73-0.82x at 1024). There
cuBLAS bf16 is compute-bound, so a fused kernel must keep bf16 tensor cores about as busy as cuBLAS does while it
decodes. This probe asks whether Triton's generic pipeline can: TMA copies of the packed weights and of the
activation into a ring of STAGES slots behind mbarriers, the weight tile decoded in registers (E2M1 nibbles to
values, times the block scale, exact in bf16), and one `tl.dot` of [BN, 64] decoded weights against the
activation's [BM, 64] tile per 64 K. Weights are k_order (the portable layout: even K in the low nibble), so the
decode is elementwise and a join interleaves the nibbles; scales rowmajor.

It checks every variant's fp32 output against the fp64 reference, then times CUDA-graph replays over cold weight
copies against cuBLAS bf16 and the library's default plan in the same process. Without a GPU it compiles each
variant for sm_90 and prints the K loop's SASS counts and the TTGIR's wgmma / layout-conversion ops (`--sass`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

DEFAULT_VARIANTS = [{"bn": 128, "bm": 128, "stages": 3, "warps": 8, "split": 1},
                    {"bn": 128, "bm": 256, "stages": 3, "warps": 8, "split": 1},
                    {"bn": 64, "bm": 256, "stages": 4, "warps": 4, "split": 1}]


@triton.jit
def _e2m1(c):
    """E2M1 codes (int32, 0..15) -> fp32 values, exact, from the bits: a normal code (e1 e0 m) = (E, m), E >= 1, is
    2^(E - 1) x (1 + m / 2), fp32 exponent field E + 126 and mantissa bit m, so its bits are (code + 252) << 22; the
    subnormal code 1 is 0.5 = 252 << 22, code 0 is 0."""
    mag = c & 7
    bits = tl.where(mag < 2, mag * (252 << 22), (mag + 252) << 22) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def mid_m_kernel(w_desc, x_desc, scale, out, M, N, K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 BLOCK: tl.constexpr, NV: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr):
    """out[M, N] (+)= x[M, K] @ dequant(w)[N, K]^T for one [BN, BM] tile and this program's K part (fp32 atomics
    with SPLIT > 1, else a bf16 store). M tiles run fastest, so programs that share a weight tile run together."""
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BM)
    n_tiles = N // BN
    m0 = (pid % m_tiles) * BM
    n0 = (pid // m_tiles % n_tiles) * BN
    part = pid // (m_tiles * n_tiles)
    per_part: tl.constexpr = K // 64 // SPLIT  # SPLIT divides the 64-K steps (`launcher` checks)
    rows = n0 + tl.arange(0, BN)
    per: tl.constexpr = 64 // BLOCK  # scale blocks per 64 K
    acc = tl.zeros([BN, BM], tl.float32)
    for i in tl.range(0, per_part, num_stages=STAGES):
        k = (part * per_part + i) * 64
        b = w_desc.load([n0, k // 2]).to(tl.int32)  # [BN, 32] bytes: elements 2j (low nibble) and 2j + 1
        codes = tl.load(scale + rows[:, None] * (K // BLOCK) + k // BLOCK + tl.arange(0, per)[None, :])  # [BN, per]
        if NV:  # E4M3 block scales
            s = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:  # E8M0: 2^(code - 127), codes 1 .. 254
            s = (codes.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        # the 32 bytes of a row cover `per` blocks of BLOCK / 2 bytes each
        lo = tl.reshape(_e2m1(b & 15), [BN, per, 32 // per]) * s[:, :, None]
        hi = tl.reshape(_e2m1(b >> 4), [BN, per, 32 // per]) * s[:, :, None]
        w = tl.reshape(tl.join(tl.reshape(lo, [BN, 32]), tl.reshape(hi, [BN, 32])), [BN, 64]).to(tl.bfloat16)
        acc = tl.dot(w, x_desc.load([m0, k]).T, acc)
    cols = m0 + tl.arange(0, BM)
    ptrs = out + cols[None, :] * N + rows[:, None]
    mask = (cols < M)[None, :]
    if SPLIT > 1:
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(ptrs, acc.to(out.dtype.element_ty), mask=mask)


def launcher(x: torch.Tensor, b, v: dict):
    """A call of the probe on bf16 activations `x` [M, K] and k_order fp4 weights `b` (QTensor, rowmajor scales) with
    variant `v`; returns (call, out). The nvfp4 global scale is left out of the kernel (the caller's reference
    takes it out too: `unscaled`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = b.shape[0]
    bn, bm, split = v["bn"], v["bm"], v["split"]
    if n % bn or k % 64 or (k // 64) % split:
        raise ValueError(f"probe runs N % {bn} == 0, K % 64 == 0 in {split} equal parts; got {m} x {n} x {k}")
    w_desc = TensorDescriptor.from_tensor(b.data, [bn, 32])
    x_desc = TensorDescriptor.from_tensor(x, [bm, 64])
    scale = b.scale.view(torch.uint8)
    out = torch.empty(m, n, device=x.device, dtype=torch.float32 if split > 1 else torch.bfloat16)
    grid = (triton.cdiv(m, bm) * (n // bn) * split,)
    kwargs = dict(K=k, BN=bn, BM=bm, BLOCK=b.fmt.block_size, NV=b.fmt.global_scale, SPLIT=split,
                  STAGES=v["stages"], num_warps=v["warps"])

    def call():
        if split > 1:
            out.zero_()
        mid_m_kernel[grid](w_desc, x_desc, scale, out, m, n, **kwargs)

    return call, out


def sass_counts(v: dict, fmt: str = "mxfp4", m: int = 256, k: int = 8192, n: int = 8192) -> dict:
    """Compile variant `v` for sm_90 (no GPU needed): the K loop's SASS counts (`bench.sass.compiled_counts`) and
    the TTGIR's dot, wgmma-wait, shared-memory and layout-conversion ops."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .sass import compiled_counts

    bn, bm = v["bn"], v["bm"]
    nv = fmt == "nvfp4"
    sig = {"w_desc": f"tensordesc<u8[{bn}, 32]>", "x_desc": f"tensordesc<bf16[{bm}, 64]>", "scale": "*u8",
           "out": "*bf16" if v["split"] == 1 else "*fp32", "M": "i32", "N": "i32"}
    cx = {"K": k, "BN": bn, "BM": bm, "BLOCK": 16 if nv else 32, "NV": nv, "SPLIT": v["split"], "STAGES": v["stages"]}
    names = list(mid_m_kernel.arg_names)
    src = ASTSource(fn=mid_m_kernel, signature={**sig, **{a: "constexpr" for a in cx}},
                    constexprs={(names.index(a),): val for a, val in cx.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": v["warps"], "num_stages": v["stages"]})
    ttgir = kernel.asm["ttgir"]
    ops = {name: len(re.findall(pattern, ttgir)) for name, pattern in (
        ("wgmma", r"ttng\.warp_group_dot "), ("wgmma_wait", r"ttng\.warp_group_dot_wait"),
        ("convert_layout", r"ttg\.convert_layout"), ("local_alloc", r"ttg\.local_alloc"),
        ("local_load", r"ttg\.local_load"), ("tma_copy", r"async_tma_copy_global_to_local"))}
    waits = sorted(set(re.findall(r"warp_group_dot_wait [^{]*\{pendings = (\d+)", ttgir)))
    with tempfile.TemporaryDirectory() as folder:
        return {**compiled_counts(kernel, Path(folder), "mid_m"), **ops, "wait_pendings": waits}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.mid_m", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-M", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--format", default="mxfp4", choices=["mxfp4", "nvfp4"])
    p.add_argument("--variants", type=json.loads, default=DEFAULT_VARIANTS,
                   help='JSON list of {"bn", "bm", "stages", "warps", "split"}')
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and count the loop's SASS (no GPU)")
    p.add_argument("--copies", type=int, default=3, help="cold weight copies the timed graph cycles through")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.sass:
        from .sass import outside_interpreter

        status = outside_interpreter("bench.mid_m", argv)
        if status is not None:
            return status
        for v in args.variants:
            print(json.dumps({"variant": v, **sass_counts(v, args.format, args.M[0], args.K, args.N)}), flush=True)
        return 0
    import blockscaled as bs
    from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

    from .__main__ import time_ms

    n, k = args.N, args.K
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", generator=gen) for _ in range(args.copies)]
    qs = [bs.quantize(w, args.format, layout="rowmajor") for w in ws]
    fast = [bs.quantize_weight(w, args.format) for w in ws]
    bf16 = [w.to(torch.bfloat16) for w in ws]
    del ws
    failed = 0
    for m in args.M:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = ref_scaled_mm(x, qs[0])
        if qs[0].global_scale is not None:
            ref = ref / qs[0].global_scale.double()  # the probe leaves the global scale out
        bf16_us = time_ms(lambda: [torch.nn.functional.linear(x, w) for w in bf16], True) * 1e3 / len(bf16)
        lib_us = time_ms(lambda: [bs.scaled_mm(x, w) for w in fast], True) * 1e3 / len(fast)
        print(f"M={m} N={n} K={k} {args.format}: cublas_bf16 {bf16_us:.1f} us, library default {lib_us:.1f} us "
              f"({bf16_us / lib_us:.2f}x)", flush=True)
        for v in args.variants:
            name = json.dumps(v, sort_keys=True)
            try:
                calls = [launcher(x, q, v) for q in qs]
                calls[0][0]()
                err = max_rel_err(calls[0][1].float(), ref)
            except Exception as e:  # noqa: BLE001 - report the variant, keep going
                print(f"  {name} FAILED to run: {type(e).__name__}: {str(e)[:300]}", flush=True)
                failed += 1
                continue
            ok = err <= (1e-5 if v["split"] > 1 else 8e-3)  # bf16 out: one rounding
            failed += not ok
            us = time_ms(lambda calls=calls: [c() for c, _ in calls], True) * 1e3 / len(calls)
            print(f"  {name:70s} {us:7.1f} us {bf16_us / us:5.2f}x err={err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
