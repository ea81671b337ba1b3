"""`python -m bench.host`: the host time of one `scaled_mm` call on the mma path, and what it is made of.

A decode-size kernel runs 15-30 us on an H100; without CUDA graphs the host's time per call decides how fast an
eager decode step runs. For each pair and M (N = K = 8192 by default) this prints microseconds per call, each the best
of --repeats rounds of --calls calls on one operand set:
- eager: back-to-back `scaled_mm(a, b, out=out)`, synchronized once at the end (warm L2); cublas_eager: `F.linear`
  on the bf16 weights the same way;
- host: the Python time of the same calls, not waiting for the GPU (at --calls 500 the launch queue does not fill);
  cublas_host: the same for `F.linear`;
- wrapper: `scaled_mm` with `api._mma_run` left out (validation, options, plan lookup);
- launcher: the plan's compiled launcher given the kernel's arguments (views of the operands): Helion's host
  function, `launch.DirectLaunch`, Triton's launcher; the path of a plan's first calls;
- addresses: `DirectLaunch.launch_addresses` given the operands' addresses, the path of later calls;
- run: Triton's C launcher alone as `DirectLaunch` calls it (tensors as addresses), and run_tensors: the same given
  the tensors (Triton then calls `data_ptr()` and `cuPointerGetAttribute` on each).
Columns that a tree does not have (an older checkout on PYTHONPATH, for an A / B) are left out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import blockscaled as bs
from blockscaled.kernels import api, launch, plans

from .__main__ import precompile
from .providers import FORMAT_PAIRS, make_operands

MMA_FORMATS = [f for f, pair in FORMAT_PAIRS.items() if bs.SUPPORTED_PAIRS[pair] in plans.MMA_PAIRS]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", nargs="+", default=MMA_FORMATS, choices=MMA_FORMATS)
    p.add_argument("-M", type=int, nargs="+", default=[1, 16])
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1, help="compile every cell in this many processes first")
    p.add_argument("--profile", type=int, default=0, metavar="LINES",
                   help="also profile --calls calls of each cell (cProfile) and print its LINES costliest functions")
    p.add_argument("--log", type=Path, default=None, help="append every line to this file too")
    return p.parse_args(argv)


def compile_mma(pair, m: int, n: int, k: int):
    """One call of the mma path for `pair` at [m, k] x [n, k]: its binary lands in Triton's on-disk cache."""
    _, _, a, b = make_operands(pair, m, n, k, "cuda", seed=0)
    bs.scaled_mm(a, b.with_data_layout("mma_m16k16"))
    torch.cuda.synchronize()


def per_call_us(fn, calls: int, repeats: int, wait: bool) -> float:
    """Best over `repeats` rounds of the time per call of `calls` calls of `fn`; with `wait` the GPU's work is
    waited for at the end of each round (inside the time), else only between rounds (outside it)."""
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if wait:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def profile(call, calls: int, lines: int) -> str:
    """cProfile of `calls` calls of `call`: its `lines` costliest functions by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(lines)
    return text.getvalue()


def operands(key, plan, a, b, bias, out) -> tuple:
    """The tensors `api._mma_run` passes for one call of `plan` (this call's scratch on the current stream)."""
    return api._mma_operands(plan, a, b, bias, out, api._work(key, plan, out.device))


def kernel_args(key, plan, a, b, bias, out) -> tuple:
    """The arguments `api._mma_run` gives the plan's compiled launcher."""
    return api._mma_args(plan, operands(key, plan, a, b, bias, out), out)


def captured_launch(call):
    """(the plan, its kernel arguments, the addresses of its operands or None, its `DirectLaunch`, the C-launcher
    call's prefix and arguments) of one call of `call`, which must take the mma path with a compiled plan that has
    launched directly."""
    seen = {}
    run_mma, direct_call = api._mma_run, launch.DirectLaunch.__call__

    def record_mma(key, plan, a, b, bias, out):
        plan = api._LAUNCHES[key]
        seen["plan"], seen["args"] = plan, kernel_args(key, plan, a, b, bias, out)
        seen["addresses"] = [t.data_ptr() for t in operands(key, plan, a, b, bias, out)]
        plan.launch(*seen["args"])  # through DirectLaunch.__call__
        return out

    def record_direct(self, triton_kernel, grid, *args, **kwargs):
        seen["direct"] = self, grid, args
        return direct_call(self, triton_kernel, grid, *args, **kwargs)

    api._mma_run, launch.DirectLaunch.__call__ = record_mma, record_direct
    try:
        call()
    finally:
        api._mma_run, launch.DirectLaunch.__call__ = run_mma, direct_call
    direct, grid, args = seen["direct"]
    stream = torch.cuda.current_stream().cuda_stream
    prefix = direct.prefix(grid, stream)
    return seen["plan"], seen["args"], seen.get("addresses"), direct, prefix, args


def without_launch(call):
    """`call` with `api._mma_run` left out (it returns `out` at once)."""
    def timed():
        run_mma, api._mma_run = api._mma_run, lambda key, plan, a, b, bias, out: out
        try:
            call()
        finally:
            api._mma_run = run_mma
    return timed


def host_row(fmt: str, m: int, n: int, k: int, calls: int, repeats: int, profile_lines: int = 0):
    x, w, a, b = make_operands(FORMAT_PAIRS[fmt], m, n, k, "cuda", seed=0)
    b = b.with_data_layout("mma_m16k16")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)

    def call():
        return bs.scaled_mm(a, b, out=out)

    for _ in range(3):  # compile; DirectLaunch's first (Triton) launch, its first direct one (and its binding)
        call()
    plan, args, addresses, direct, prefix, run_args = captured_launch(call)
    run = direct.launcher.launch
    pointers = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else t for t in run_args)
    # the wrapper's time without `_mma_run`, less the no-op's own patching
    patching = per_call_us(without_launch(lambda: None), calls, repeats, wait=False)
    row = {
        "eager": per_call_us(call, calls, repeats, wait=True),
        "cublas_eager": per_call_us(lambda: F.linear(xb, wb), calls, repeats, wait=True),
        "host": per_call_us(call, calls, repeats, wait=False),
        "cublas_host": per_call_us(lambda: F.linear(xb, wb), calls, repeats, wait=False),
        "wrapper": per_call_us(without_launch(call), calls, repeats, wait=False) - patching,
        "launcher": per_call_us(lambda: plan.launch(*args), calls, repeats, wait=False),
    }
    if addresses is not None:
        if not direct.launch_addresses(addresses):
            raise RuntimeError(f"{fmt} M={m}: the plan's DirectLaunch did not launch from addresses")
        row["addresses"] = per_call_us(lambda: direct.launch_addresses(addresses), calls, repeats, wait=False)
    row["run"] = per_call_us(lambda: run(*prefix, *pointers), calls, repeats, wait=False)
    row["run_tensors"] = per_call_us(lambda: run(*prefix, *run_args), calls, repeats, wait=False)
    return row, profile(call, calls, profile_lines) if profile_lines else ""


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.host times host work around CUDA launches: it needs a GPU")
    lines = []

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    emit(f"# {torch.cuda.get_device_name()}, N = {args.N}, K = {args.K}, us per call, best of {args.repeats} x "
         f"{args.calls} calls")
    if args.jobs > 1:
        precompile(compile_mma, [(FORMAT_PAIRS[f], m, args.N, args.K) for f in args.format for m in args.M], args.jobs)
    for fmt in args.format:
        for m in args.M:
            row, profiled = host_row(fmt, m, args.N, args.K, args.calls, args.repeats, args.profile)
            emit(f"{bs.SUPPORTED_PAIRS[FORMAT_PAIRS[fmt]]:12s} M={m:<3d} "
                 + " ".join(f"{name} {us:6.1f}" for name, us in row.items()))
            if profiled:
                emit("\n".join("#   " + line for line in profiled.strip().splitlines()))
    if args.log:
        with args.log.open("a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
