"""`python -m bench.read_floor`: how fast a kernel can read the decode shapes' weight bytes on this GPU.

A Triton kernel that only reads (16-byte loads, the xor of each program's words stored so that the loads stay) over
grids of several shapes: programs of 4, 8 or 16 warps, one or two loads per thread per step, from a quarter of a wave
(each program looping over a long chunk) to many waves of one step each. CUDA-graph replay over copies past 2x L2, next
to cuBLAS bf16 at M = 1 and 16 and a device-to-device copy, one process. The fastest grid is the `read_weights`
provider of `python -m bench` (`read_fn`): the floor a decode kernel's ratio to cuBLAS bf16 is measured against.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from .providers import operand_bytes, weight_bytes

# The grid of `read_fn`: 8 warps, two 16-byte loads per thread, one step per program (8 KB), so 4608 programs at
# N = K = 8192 for nvfp4 weights. H100, that shape: 13.75 us (the fastest of the sweep) against 13.9-14.4 us for one
# full wave of programs that loop and 14.8-20.0 us for a quarter wave (bench/results/h100_read_floor_3155e8a_2026-11-25.log).
READ_WARPS = 8
READ_LOADS = 2


@triton.jit
def read_words(words, out, n_words, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Each program reads CHUNK int32 words (BLOCK per step) and stores their xor at out[program]."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(0, CHUNK, BLOCK):
        offs = pid.to(tl.int64) * CHUNK + i + tl.arange(0, BLOCK)
        acc ^= tl.load(words + offs, mask=offs < n_words, other=0)
    tl.store(out + pid, tl.xor_sum(acc, 0))


def step_words(warps: int, loads: int) -> int:
    """int32 words a program of `warps` warps reads per step: `loads` 16-byte loads per thread."""
    return warps * 32 * 4 * loads


def read_launcher(words: torch.Tensor, warps: int, loads: int, programs: int):
    """A call of `read_words` over the int32 `words` by about `programs` programs of `warps` warps, `loads` 16-byte
    loads per thread per step; returns (call, out): out[:grid] holds the programs' xors after a call."""
    block = step_words(warps, loads)
    chunk = triton.cdiv(triton.cdiv(words.numel(), programs), block) * block
    grid = triton.cdiv(words.numel(), chunk)
    out = torch.empty(grid, device=words.device, dtype=torch.int32)
    return (lambda: read_words[(grid,)](words, out, words.numel(), chunk, block, num_warps=warps)), out


def xor_all(t: torch.Tensor) -> int:
    """The xor of every int32 of `t` (pairwise halving)."""
    t = t.reshape(-1)
    while t.numel() > 1:
        if t.numel() % 2:
            t = torch.cat([t, t.new_zeros(1)])
        t = t[0::2] ^ t[1::2]
    return int(t)


def checked_read(words: torch.Tensor, warps: int = READ_WARPS, loads: int = READ_LOADS, programs: int | None = None):
    """`read_launcher`, called once and checked: the programs' xors together must be the xor of every word."""
    call, out = read_launcher(words, warps, loads, programs or triton.cdiv(words.numel(), step_words(warps, loads)))
    call()
    if xor_all(out) != xor_all(words):
        raise AssertionError(f"read_words ({warps} warps, {loads} loads, {out.numel()} programs) missed words")
    return call


def weight_words(b) -> torch.Tensor:
    """The weight bytes of QTensor `b` (data and scales) as one int32 buffer (zero-padded to 4 bytes)."""
    raw = weight_bytes(b)
    return torch.nn.functional.pad(raw, (0, -raw.numel() % 4)).view(torch.int32)


def read_fn(b):
    """The `read_weights` provider: a read of `b`'s bytes by `read_words` on the `READ_*` grid."""
    return checked_read(weight_words(b))


def main(argv=None):
    from .__main__ import cold_copies, time_ms

    p = argparse.ArgumentParser(prog="python -m bench.read_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["8192x8192:nvfp4", "8192x8192:mxfp4", "10240x8192:nvfp4",
                                                    "8192x8192:mxfp8"], help="NxK:format of the weights")
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs; python -m bench.read_floor", flush=True)
    for shape in args.shapes:
        nk, fmt = shape.split(":")
        n, k = map(int, nk.split("x"))
        x = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        cublas = {m: time_ms(lambda m=m: torch.nn.functional.linear(x[:m], w), True) for m in (1, 16)}
        del w
        nbytes = int(operand_bytes(fmt, n, k))
        copies = cold_copies(nbytes, 8)
        bufs = [torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device="cuda", dtype=torch.int32) for _ in range(copies)]
        dst = [torch.empty_like(b) for b in bufs]
        # the copy moves twice the bytes: its TB/s below count the weight bytes once, as for the reads
        times = {"d2d copy (reads and writes)": time_ms(lambda: [d.copy_(s) for d, s in zip(dst, bufs)], True) / copies}
        del dst
        for warps in (4, 8, 16):
            for loads in (1, 2):
                wave = sms * 64 // warps  # programs resident at 64 warps per SM
                for waves in (0.25, 1, None):
                    programs = round(wave * waves) if waves else None
                    calls = [checked_read(b, warps, loads, programs) for b in bufs]
                    label = f"{warps} warps, {loads} loads, " + (f"{waves} wave" if waves else "one step per program")
                    times[label] = time_ms(lambda: [c() for c in calls], True) / copies
        del bufs
        print(f"\n{n} x {k} {fmt}: {nbytes / 1e6:.1f} MB, {copies} copies; cuBLAS bf16 M = 1 {cublas[1] * 1e3:.1f} us, "
              f"M = 16 {cublas[16] * 1e3:.1f} us", flush=True)
        for label, ms in times.items():
            print(f"  {label:40s} {ms * 1e3:7.2f} us {nbytes / ms / 1e9:5.2f} TB/s   x cuBLAS bf16 M = 1 "
                  f"{cublas[1] / ms:.2f}, M = 16 {cublas[16] / ms:.2f}", flush=True)


if __name__ == "__main__":
    main()
