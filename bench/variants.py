"""`python -m bench.variants`: check and time mma plan variants in one process.

Each variant is a dict of mma plan keys (`blockscaled.kernels.plans._mma_options` lists them), e.g.
'[{}, {"max_split": 8}, {"k_warps": 8, "shared_b": true}]'; `{}` is the default plan and
{"backend": null} `scaled_mm`'s own choice. Weights are arranged "mma_m16k16" (`--data_layout
k_order` times the portable kernels with {"backend": "dequant"}). For every M, pair and variant it
checks an fp32 output against the fp64 reference (bound 1e-5), then on a GPU times a CUDA graph over
independent operand sets (cache-cold) against cuBLAS bf16 timed the same way in the same process. On
a CPU it only checks, at small shapes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # kernels run through the Triton interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import blockscaled as bs  # noqa: E402
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm  # noqa: E402

from .__main__ import cold_copies, ours_bytes, precompile, time_ms  # noqa: E402
from .providers import FORMAT_PAIRS, LLAMA_SHAPES, add_llama_argument, cublas_bf16_fn, make_operands  # noqa: E402

FP32_BOUND = 1e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", nargs="+", default=["all"], choices=[*FORMAT_PAIRS, "all"])
    p.add_argument("-M", type=int, nargs="+", default=None, help="rows of A (default: 1 16 on GPU, 3 on CPU)")
    p.add_argument("-N", type=int, default=None, help="default: 8192 on GPU, 32 on CPU")
    p.add_argument("-K", type=int, default=None, help="default: 8192 on GPU, 256 on CPU")
    add_llama_argument(p, " instead of -N/-K (GPU only)")
    p.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of config-table field dicts")
    p.add_argument("--data_layout", default="mma_m16k16", choices=["k_order", "mma_m16k16"], help="layout of the weights")
    p.add_argument("--copies", type=int, default=3, help="most independent operand sets per timing")
    p.add_argument("--log", type=Path, default=None, help="append every line to this file too")
    p.add_argument("--jobs", type=int, default=1, help="GPU: compile every cell and variant in this many processes first")
    p.add_argument("--between", action="store_true",
                   help="GPU: a one-element torch kernel before every call (ours and cuBLAS's), as a model's elementwise "
                        "op before a linear layer: such a kernel does not let the next one start early, so it bounds "
                        "what programmatic dependent launch ('pdl') saves outside back-to-back calls")
    return p.parse_args(argv)


def weights_as(b, data_layout):
    return b.with_data_layout(data_layout)


def backend_and_fields(variant):
    """A variant dict as `scaled_mm`'s backend (mma unless named; null: `scaled_mm`'s choice) and
    config fields (None if there are none)."""
    return variant.get("backend", "mma"), {key: v for key, v in variant.items() if key != "backend"} or None


def compile_variant(pair, m, n, k, data_layout, variant, device="cuda"):
    """Run one variant once at both output dtypes the timing process uses, so that its
    binaries land in Triton's on-disk cache (as `bench --jobs`); nothing is checked here."""
    _, _, a, b = make_operands(pair, m, n, k, device, seed=0)
    backend, fields = backend_and_fields(variant)
    for out_dtype in (torch.float32, torch.bfloat16):
        bs.scaled_mm(a, weights_as(b, data_layout), out_dtype=out_dtype, backend=backend, config=fields)
    torch.cuda.synchronize()


def variant_shapes(args, on_gpu):
    """The (N, K) shapes to run: the Llama-3 ones with --llama, else -N/-K or the defaults."""
    if args.llama:
        if not on_gpu:
            raise SystemExit("--llama: the Llama shapes are for timing and need a GPU; on a CPU use small -N/-K")
        return LLAMA_SHAPES[args.llama]
    return [(args.N or (8192 if on_gpu else 32), args.K or (8192 if on_gpu else 256))]


def main(argv=None):
    args = parse_args(argv)
    if not isinstance(args.variants, list) or not all(isinstance(v, dict) for v in args.variants):
        raise SystemExit("--variants: expected a JSON list of objects")
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    formats = list(FORMAT_PAIRS) if "all" in args.format else args.format
    log = args.log.open("a") if args.log else None

    def say(line):
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()

    cells = list(itertools.product(variant_shapes(args, on_gpu), args.M or ([1, 16] if on_gpu else [3])))
    if on_gpu and args.jobs > 1:
        precompile(compile_variant, [(FORMAT_PAIRS[fmt], m, n, k, args.data_layout, v) for (n, k), m in cells
                                     for fmt in formats for v in args.variants], args.jobs)
    failed = 0
    scratch = torch.zeros(1, device=device)
    between = (lambda: scratch.add_(1.0)) if args.between else (lambda: None)
    for (n, k), m in cells:
        bf16_ms = None
        if on_gpu:
            fns = [cublas_bf16_fn(torch.randn(m, k, device=device), torch.randn(n, k, device=device), torch.bfloat16)
                   for _ in range(2)]
            bf16_ms = time_ms(lambda fns=fns: [(between(), f()) for f in fns], True) / 2
            say(f"M={m} N={n} K={k} cublas_bf16 {bf16_ms * 1e3:.1f} us")
            del fns
        for fmt in formats:
            pair = FORMAT_PAIRS[fmt]
            copies = cold_copies(ours_bytes(pair, m, n, k, torch.bfloat16), args.copies) if on_gpu else 1
            sets = [make_operands(pair, m, n, k, device, seed=s) for s in range(copies)]
            a = [s[2] for s in sets]
            b = [weights_as(s[3], args.data_layout) for s in sets]
            ref = ref_scaled_mm(a[0], b[0])
            for variant in args.variants:
                backend, fields = backend_and_fields(variant)
                name = f"M={m} {bs.SUPPORTED_PAIRS[pair]:12s} {json.dumps(variant, sort_keys=True):60s}"
                try:
                    # the first call launches through Triton, the second directly (`kernels/launch.py`; in clusters
                    # where the plan sums split-K parts in them): both checked
                    err = max(max_rel_err(bs.scaled_mm(a[0], b[0], out_dtype=torch.float32, backend=backend,
                                                       config=fields), ref) for _ in range(2))
                except Exception as e:  # noqa: BLE001 - report the variant, keep going with the others
                    say(f"{name} FAILED to run: {type(e).__name__}: {str(e)[:300]}")
                    failed += 1
                    continue
                status = "ok" if err <= FP32_BOUND else "FAIL"
                failed += status != "ok"
                if not on_gpu:
                    say(f"{name} err={err:.1e} {status}")
                    continue
                outs = [torch.empty(m, n, dtype=torch.bfloat16, device=device) for _ in sets]

                def run_all(outs=outs, backend=backend, fields=fields, a=a, b=b):
                    for ai, bi, oi in zip(a, b, outs, strict=True):
                        between()
                        bs.scaled_mm(ai, bi, out=oi, backend=backend, config=fields)

                run_all()  # compile the bf16-output specialization outside the graph capture
                torch.cuda.synchronize()
                us = time_ms(run_all, True) / copies * 1e3
                say(f"{name} {us:7.1f} us {bf16_ms * 1e3 / us:5.2f}x err={err:.1e} {status}")
            del sets, a, b
    if log:
        log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
