"""`python -m bench.kernel_times`: the GPU time of each kernel one `scaled_mm` call launches (torch.profiler).

`python -m bench` times whole calls by CUDA-graph replay over independent operand sets; where a call is two
kernels (the mma path's pre-pass and its matmul) that does not say which one moved. This profiles 50 calls on one
operand set (so the operands stay in L2: times are shorter than the graph's) and prints each kernel's mean duration,
by pair and config, e.g. `python -m bench.kernel_times -M 64 --format nvfp4 w4a16-nvfp4 --variants '[{}, {"predecode":
false}]'`. GPU only.
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

import blockscaled as bs

from .providers import FORMAT_PAIRS, make_operands

CALLS = 50


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.kernel_times", description=__doc__)
    p.add_argument("--format", nargs="+", default=["nvfp4"], choices=list(FORMAT_PAIRS))
    p.add_argument("-M", type=int, default=64)
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of mma config dicts ({} the default)")
    return p.parse_args(argv)


def kernel_times(a, b: bs.QTensor, config) -> dict[str, tuple[float, int]]:
    """{kernel name: (mean us, launches)} of CALLS calls of `scaled_mm(a, b)` on the mma backend, after 20 warm ones."""
    out = torch.empty(a.shape[0], b.shape[0], device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        bs.scaled_mm(a, b, out=out, config=config, backend="mma")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            bs.scaled_mm(a, b, out=out, config=config, backend="mma")
        torch.cuda.synchronize()
    times = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name].append(event.device_time)
    return {name: (sum(t) / len(t), len(t)) for name, t in sorted(times.items())}


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m bench.kernel_times: needs a CUDA GPU (it profiles the kernels' launches)")
    for fmt in args.format:
        _, _, a, b = make_operands(FORMAT_PAIRS[fmt], args.M, args.N, args.K, "cuda", 0)
        b = b.with_data_layout("mma_m16k16")
        for config in args.variants:
            times = kernel_times(a, b, config or None)
            print(f"M={args.M} N={args.N} K={args.K} {fmt:12s} {json.dumps(config):28s} "
                  + "  ".join(f"{name}: {us:.2f} us x{n}" for name, (us, n) in times.items()), flush=True)


if __name__ == "__main__":
    main()
