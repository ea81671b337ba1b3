"""`python -m bench.attention`: a decode step's grouped-query attention at batch 1 (Llama-3-8B's by default: 32 query
heads on 8 key / value heads, D = 128, a 2124-key static cache of which 2100 are kept), every layer's cache its own
(past L2), all layers in one CUDA graph; microseconds a layer and the largest error against fp64, for transformers'
compiled path (the cache copied per query head, then SDPA), SDPA on the packed heads, the packed heads in plain
torch (two bmm and a softmax), and `blockscaled::decode_attention` (split along the keys), eager and under inductor."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def variants(B, H, HKV, D, S, scale):
    G = H // HKV

    def unpacked_sdpa(q, k, v, m):
        k = k[:, :, None].expand(B, HKV, G, S, D).reshape(B, H, S, D)
        v = v[:, :, None].expand(B, HKV, G, S, D).reshape(B, H, S, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)

    def packed_sdpa(q, k, v, m):
        return F.scaled_dot_product_attention(q.reshape(B, HKV, G, D), k, v, attn_mask=m, scale=scale).reshape(B, H, 1, D)

    def packed_math(q, k, v, m):
        s = torch.matmul(q.reshape(B, HKV, G, D), k.transpose(-1, -2)).float() * scale
        return torch.matmul(torch.softmax(s.masked_fill(~m, float("-inf")), -1).to(v.dtype), v).reshape(B, H, 1, D)

    def split_keys(q, k, v, m):
        return torch.ops.blockscaled.decode_attention(q.reshape(B, HKV, G, D), k, v, m[:, 0, 0, :].expand(B, S),
                                                      scale).reshape(B, H, 1, D)

    return {"unpacked_sdpa": unpacked_sdpa, "packed_sdpa": packed_sdpa, "packed_math": packed_math,
            "split_keys": split_keys}


def compile_sm90(folder: Path, shape=(1, 32, 8, 128, 2124, 2100)) -> int:
    """`--compile-sm90`: both kernels of `decode_attention` at `shape`, compiled for sm_90 (no GPU), counted."""
    from blockscaled.kernels import decode_attention as da

    from .sass import compile_sm90 as compile_one, planned_as_h100, recorded_launches

    B, H, HKV, D, S, kept = shape
    q = torch.randn(B, HKV, H // HKV, D, dtype=torch.bfloat16)
    k, v = torch.randn(B, HKV, S, D, dtype=torch.bfloat16), torch.randn(B, HKV, S, D, dtype=torch.bfloat16)
    keep = (torch.arange(S) < kept)[None, :].expand(B, S)
    with planned_as_h100():  # the split of 132 SMs
        launches = recorded_launches(lambda: da.decode_attention(q, k, v, keep), da)
    for kernel, args, cfg in launches:
        name = kernel.fn.__name__
        counts = compile_one(kernel.bind(args).to_triton_code(cfg), kernel.fn, args, cfg, folder, name)
        print(f"{name:20s} sm_90: {counts['regs']} registers, {counts['spill']} spilled, {counts['smem']} B shared")
    return 0


def graph_us(f, q, ks, vs, mask, reps: int = 20) -> float:
    """Microseconds a layer of `f` over every layer's cache, the layers captured in one CUDA graph."""
    for i in range(2):
        f(q, ks[i], vs[i], mask)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(len(ks)):
            f(q, ks[i], vs[i], mask)
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps / len(ks) * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__)
    p.add_argument("--shape", type=int, nargs=6, default=[1, 32, 8, 128, 2124, 2100], metavar=("B", "H", "HKV", "D", "S", "KEPT"))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--compile", nargs="+", default=["none", "inductor"])
    p.add_argument("--split", nargs=2, type=int, action="append", metavar=("PROGRAMS_PER_SM", "BLOCK_KEYS"),
                   help="time split_keys with these settings of kernels.decode_attention too (repeatable)")
    p.add_argument("--compile-sm90", type=Path, metavar="FOLDER",
                   help="only compile decode_attention's kernels at --shape for sm_90 (no GPU)")
    args = p.parse_args(argv)
    if args.compile_sm90:
        from .sass import compile_sm90_command

        return compile_sm90_command("bench.attention", argv, os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                    args.compile_sm90, lambda folder: compile_sm90(folder, tuple(args.shape)))
    import blockscaled  # noqa: F401 - registers blockscaled::decode_attention

    B, H, HKV, D, S, kept = args.shape
    dev, scale = "cuda", D ** -0.5
    gen = torch.Generator(device="cpu").manual_seed(0)
    ks = [torch.randn(B, HKV, S, D, generator=gen).to(dev, torch.bfloat16) for _ in range(args.layers)]
    vs = [torch.randn(B, HKV, S, D, generator=gen).to(dev, torch.bfloat16) for _ in range(args.layers)]
    q = torch.randn(B, H, 1, D, generator=gen).to(dev, torch.bfloat16)
    mask = (torch.arange(S, device=dev) < kept).view(1, 1, 1, S)
    qq = q.double().reshape(B, HKV, H // HKV, D)
    ref = (torch.softmax((qq @ ks[0].double().transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), -1)
           @ vs[0].double()).reshape(B, H, 1, D)
    print(f"{torch.cuda.get_device_name()}: B={B} H={H} HKV={HKV} D={D} S={S} kept={kept}, {args.layers} layers a graph")
    from blockscaled.kernels import decode_attention as da

    default = (da.PROGRAMS_PER_SM, da.BLOCK_KEYS, da.DECODE_ATTENTION_PDL)
    fns = variants(B, H, HKV, D, S, scale)
    split_keys = fns["split_keys"]
    runs = [(backend, name, fn, default) for backend in args.compile for name, fn in fns.items()]
    # the kernels launched without programmatic dependent launch (each starts when the one before has ended)
    runs += [("none", "split_keys_no_pdl" if default[2] else "split_keys_pdl", split_keys, default[:2] + (not default[2],))]
    runs += [("none", f"split_keys{tuple(split)}", split_keys, tuple(split) + default[2:]) for split in args.split or []]
    for backend, name, fn, split in runs:
        da.PROGRAMS_PER_SM, da.BLOCK_KEYS, da.DECODE_ATTENTION_PDL = split
        f = fn if backend == "none" else torch.compile(fn, backend=backend, dynamic=False)
        try:
            err = ((f(q, ks[0], vs[0], mask).double() - ref).abs().max() / ref.abs().max()).item()
            us = graph_us(f, q, ks, vs, mask)
            print(f"{backend:9s} {name:20s} {us:8.2f} us a layer  max_rel_err {err:.2e}")
        except Exception as e:  # noqa: BLE001 - one variant's failure is a row, the others still run
            print(f"{backend:9s} {name:20s} failed: {type(e).__name__}: {str(e)[:200]}")
    da.PROGRAMS_PER_SM, da.BLOCK_KEYS, da.DECODE_ATTENTION_PDL = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
