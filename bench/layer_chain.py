"""`python -m bench.layer_chain`: a decode step's linear layers alone, in the model's order, as one CUDA graph.

    python -m bench.layer_chain [--llama 8b | 70b] [--format w4a16-nvfp4 ...] [-M 1] [--layers 32]

What a model's step pays for its GEMMs, which single-call benchmarks do not show: each layer's calls (q / k / v
fused, o, gate / up fused, down: `bench.providers.LLAMA_SHAPES`) with every layer's own weights (past L2, as in a
model), captured back to back and replayed, against cuBLAS bf16 on the same shapes in the same process. Rows:
microseconds a step for the whole chain, with the mma kernels' PDL on (the default) and off (`plans.MMA_PDL`), and
each shape's microseconds a call inside a chain of that shape alone; `x bf16` is cuBLAS's time over ours. An M = 1
call costs ~3 us beyond its bytes alone (`docs/RECORDS.md`, 2026-12-01); the chain says how much of that a step
still pays. Each shape's first layer is checked against the fp64 reference first. GPU only.
"""

from __future__ import annotations

import argparse

import torch

import blockscaled as bs
from blockscaled.kernels import plans
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

from .__main__ import time_ms
from .providers import FORMAT_PAIRS, LLAMA_SHAPES, make_operands, ours_weights

BOUND = 1e-2  # bf16 out of an fp32 accumulation (tests/pairs.py)


def step_order(shapes: list[tuple[int, int]], layers: int) -> list[tuple[int, int]]:
    """(layer, shape index) of each call of a step: every layer's shapes in the model's order, layer by layer."""
    return [(layer, s) for layer in range(layers) for s in range(len(shapes))]


def graph_us(calls) -> float:
    """Microseconds of one pass over `calls` (no-argument callables) by CUDA-graph replay (`bench.__main__.time_ms`)."""
    return time_ms(lambda: [call() for call in calls], True) * 1e3


def chain_us(call, weights, order, layers: int) -> tuple[float, list[float]]:
    """(microseconds a step, and a call of each shape inside a chain of that shape alone) of `call(w)` (a no-argument
    callable multiplying by weights `w`) over `weights[layer][shape]` in `order`."""
    step = graph_us([call(weights[layer][s]) for layer, s in order])
    each = [graph_us([call(row[s]) for row in weights]) / layers for s in range(len(weights[0]))]
    return step, each


def row(label: str, shapes, step: float, each: list[float], extra: str = "") -> str:
    return f"{label:20s} step {step:9.1f} us  " + "  ".join(
        f"{n}x{k} {us:6.2f}" for (n, k), us in zip(shapes, each)) + extra


def set_mma_pdl(on: bool) -> None:
    """`plans.MMA_PDL`, with the option caches it feeds emptied (`plans.clear_option_caches`): the default and the
    tuned options are cached per shape, so a flag flipped after a first call would change nothing."""
    plans.MMA_PDL = on
    plans.clear_option_caches()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.layer_chain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama", choices=list(LLAMA_SHAPES), default="8b")
    p.add_argument("--format", nargs="+", default=["w4a16-nvfp4"], choices=list(FORMAT_PAIRS))
    p.add_argument("-M", type=int, default=1)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--shapes", nargs="+", help="NxK shapes of a layer, in order, instead of --llama's")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # the CPU test's
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.layer_chain times CUDA graphs: it needs a CUDA GPU")
    dev = args.device
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else LLAMA_SHAPES[args.llama]
    order = step_order(shapes, args.layers)
    name = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(f"{name}: shapes {shapes}, M = {args.M}, {args.layers} layers")
    xs = {k: torch.randn(args.M, k, device=dev).to(torch.bfloat16) for _, k in shapes}
    dense = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) for n, k in shapes] for _ in range(args.layers)]
    cublas, cublas_each = chain_us(lambda w: lambda: torch.mm(xs[w.shape[1]], w.t()), dense, order, args.layers)
    del dense
    print(row("cublas_bf16", shapes, cublas, cublas_each))
    for fmt in args.format:
        pair = FORMAT_PAIRS[fmt]
        acts, weights = {}, [[None] * len(shapes) for _ in range(args.layers)]
        for layer, s in order:
            n, k = shapes[s]
            _, _, a, b = make_operands(pair, args.M, n, k, dev, seed=1000 * layer + s)  # (the fp32 w dropped)
            weights[layer][s] = ours_weights("blockscaled", b)
            if layer == 0:  # one activation per K (a step's are fresh, and small); the first layer checked
                acts[k] = a
                err = max_rel_err(bs.scaled_mm(a, weights[0][s]), ref_scaled_mm(a, b))
                if not err < BOUND:
                    raise SystemExit(f"{fmt} {n}x{k}: max_rel_err {err:.2e} against fp64, bound {BOUND}")
        pdl = plans.MMA_PDL
        try:
            for on in (True, False):
                set_mma_pdl(on)
                step, each = chain_us(lambda w: lambda: bs.scaled_mm(acts[w.shape[1]], w), weights, order, args.layers)
                print(row(f"{fmt}{'' if on else ' no_pdl'}", shapes, step, each, f"  x bf16 {cublas / step:.2f}"))
        finally:
            set_mma_pdl(pdl)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
