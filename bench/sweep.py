"""`python -m bench.sweep`: time a bounded list of Helion configs per (pair, M) on the GPU and
print the best as JSON entries for kernels/configs/<arch>.json (no autotuner at call time)."""

from __future__ import annotations

import argparse
import json

import helion
import torch

import blockscaled as bs
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

from .__main__ import time_ms
from .providers import FORMAT_PAIRS, cublas_bf16_fn, make_operands

SMALL_M = [
    {"block_sizes": [16, 64, 4], "num_warps": 4, "num_stages": 3},
    {"block_sizes": [16, 32, 4], "num_warps": 4, "num_stages": 4},
    {"block_sizes": [16, 32, 8], "num_warps": 4, "num_stages": 3},
    {"block_sizes": [16, 16, 8], "num_warps": 2, "num_stages": 4},
    {"block_sizes": [16, 64, 8], "num_warps": 8, "num_stages": 3},
    {"block_sizes": [16, 128, 2], "num_warps": 4, "num_stages": 4},
]
LARGE_M = [
    {"block_sizes": [128, 128, 2], "num_warps": 8, "num_stages": 3},
    {"block_sizes": [128, 128, 1], "num_warps": 4, "num_stages": 4},
    {"block_sizes": [128, 256, 1], "num_warps": 8, "num_stages": 3},
    {"block_sizes": [64, 128, 2], "num_warps": 4, "num_stages": 4},
    {"block_sizes": [128, 64, 2], "num_warps": 4, "num_stages": 3},
    {"block_sizes": [256, 128, 1], "num_warps": 8, "num_stages": 3},
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--format", nargs="+", default=["w4a16-mxfp4", "nvfp4", "mxfp8"])
    p.add_argument("-M", type=int, nargs="+", default=[16, 4096])
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    args = p.parse_args()
    best = []
    for fmt in args.format:
        pair = FORMAT_PAIRS[fmt]
        for m in args.M:
            x, w, a, b = make_operands(pair, m, args.N, args.K, "cuda", seed=m)
            graph = m <= 64
            bf16 = time_ms(cublas_bf16_fn(x, w, torch.bfloat16), graph)
            ref = ref_scaled_mm(a, b)
            out = torch.empty(m, args.N, dtype=torch.bfloat16, device="cuda")
            results = []
            for cfg in SMALL_M if m <= 64 else LARGE_M:
                try:
                    c = helion.Config(**cfg)
                    bs.scaled_mm(a, b, out=out, config=c)
                    err = max_rel_err(out, ref)
                    ms = time_ms(lambda a=a, b=b, out=out, c=c: bs.scaled_mm(a, b, out=out, config=c), graph)
                except Exception as e:  # noqa: BLE001 - a config that fails to compile is skipped
                    print(f"{fmt} M={m} {cfg}: failed {type(e).__name__}: {str(e)[:100]}", flush=True)
                    continue
                results.append((ms, cfg))
                print(f"{fmt} M={m} {cfg}: {ms:.4f} ms = {bf16 / ms:.3f}x bf16 (err {err:.1e})", flush=True)
            ms, cfg = min(results, key=lambda r: r[0])
            best.append({"pairs": [bs.SUPPORTED_PAIRS[pair]], "max_m": m, "config": cfg, "measured": f"{ms:.4f} ms, {bf16 / ms:.3f}x cuBLAS bf16"})
    print("BEST " + json.dumps(best))


if __name__ == "__main__":
    main()
