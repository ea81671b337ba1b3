"""`python -m bench.split_sums`: how long the split-K epilogue of `mma_m64_kernel` takes, and with vector reductions.

The M = 64 plans at N = K = 8192 and 8192 x 28672 split K over 4 programs (256 programs of 256 threads, about two per
SM) that add their fp32 sums into a workspace; the ablation of 6271ff1 put that epilogue at about 6 of 35 us at
8192^2 (docs/DECODE_NOTES.md, "Ablations"), without separating its parts. This probe runs only an epilogue, on that
grid (SPLIT parts of N / 128 output tiles, the parts last in the grid as the workspace path orders them), each thread
holding 32 sums as `mma_m64_kernel`'s accumulators (8 column groups x 4):

- `scalar`: 32 relaxed fp32 atomic adds per thread at the output's positions (`mma_gemv.add_groups`);
- `vector`: 8 `red.global.add.v4.f32` per thread, the workspace in fragment order (a thread's 4 sums of a column group
  at 16 contiguous bytes, a warp's 512 contiguous: `mma_gemv.add_fragments`, with its PTX);
- `none`: no adds (the launch alone);
- each with `ticket`: then the CTA barrier, the tile's ticket (acq_rel), and the last part reading the totals back
  at L2 (relaxed atomic adds of zero, or `ld.relaxed.gpu.global.v4`; for `none` the scalar path's), zeroing them and
  storing the bf16 outputs, as the kernel does (`store_sums`, `store_fragments`).

Before timing, one call of each ticket variant is checked against the sum of the parts' values computed on the host
(the outputs poisoned first), so both address maps are exercised. CUDA-graph replay, one process; cuBLAS bf16 at
M = 64 in the same process for scale.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from blockscaled.kernels.decode import FRAGMENT_ADD_PTX, FRAGMENT_LOAD_PTX, FRAGMENT_ZERO_PTX

# the kernel's PTX (Triton reads module globals in a jit function only as constexprs)
ADD_PTX, LOAD_PTX, ZERO_PTX = (tl.constexpr(ptx) for ptx in (FRAGMENT_ADD_PTX, FRAGMENT_LOAD_PTX, FRAGMENT_ZERO_PTX))

THREADS = 256  # a program of mma_m64_kernel: 8 warps of one 16-row group, 128 weight rows
GROUPS = 8  # column groups of 8 activation rows at M = 64


@triton.jit
def _value(t, part, c: tl.constexpr, i: tl.constexpr):
    """The sum thread t of `part` holds for column group c, accumulator i: small exact binary fractions, so that
    every order of the adds gives the same fp32 total."""
    return ((t * 32 + c * 4 + i) % 61).to(tl.float32) * 0.125 + part.to(tl.float32)


@triton.jit
def _output_index(t, tile, c: tl.constexpr, i: tl.constexpr, N: tl.constexpr):
    """`mma_gemv.out_index` of accumulator i of column group c: column 8 c + 2 q + (i & 1), row 16 warp + g + 8 (i >> 1)
    of the tile."""
    lane = t & 31
    col = 8 * c + 2 * (lane & 3) + (i & 1)
    row = tile * 128 + (t >> 5) * 16 + (lane >> 2) + 8 * (i >> 1)
    return col * N + row


@triton.jit
def _fragment_index(t, tile, c: tl.constexpr):
    """`mma_gemv.fragment_index` of thread t's 4 sums of column group c of the tile."""
    return ((tile * 8 + c) * 256 + t) * 4


@triton.jit
def _red_v4(ptr, a, b, c, d):
    return tl.inline_asm_elementwise(ADD_PTX, "=r,l,f,f,f,f,r", [ptr.to(tl.int64), a, b, c, d, a.to(tl.int32) * 0 + 1],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _ld_v4(ptr):
    return tl.inline_asm_elementwise(LOAD_PTX, "=f,=f,=f,=f,l", [ptr],
                                     dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=False, pack=1)


@triton.jit
def _st_zero_v4(ptr):
    return tl.inline_asm_elementwise(ZERO_PTX, "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def split_sums(workspace, tickets, out, N: tl.constexpr, SPLIT: tl.constexpr, MODE: tl.constexpr,
               TICKET: tl.constexpr):
    """One program: part pid // (N / 128) of output tile pid % (N / 128); adds its 32 sums per thread (MODE 1 `scalar`,
    2 `vector`, 0 nothing), and with TICKET the last part of the tile stores the totals into out (bf16, [64, N]) and
    zeros them."""
    pid = tl.program_id(0)
    rows: tl.constexpr = N // 128
    tile = pid % rows
    part = pid // rows
    t = tl.arange(0, 256)
    for c in tl.static_range(8):
        if MODE == 2:
            _red_v4(workspace + _fragment_index(t, tile, c), _value(t, part, c, 0), _value(t, part, c, 1),
                    _value(t, part, c, 2), _value(t, part, c, 3))
        elif MODE == 1:
            for i in tl.static_range(4):
                tl.atomic_add(workspace + _output_index(t, tile, c, i, N), _value(t, part, c, i), sem="relaxed")
    if MODE == 0:
        tl.store(out + pid * 256 + t, t.to(tl.bfloat16))
    if TICKET:
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets + tile, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            # every read first, as `mma_gemv.store_sums` (a read after a store waits for the round trips before it)
            zeros = tl.zeros([256], tl.float32)
            if MODE == 2:
                totals = ()
                for c in tl.static_range(8):
                    totals = totals + (_ld_v4(workspace + _fragment_index(t, tile, c)),)
                for c in tl.static_range(8):
                    for i in tl.static_range(4):
                        tl.store(out + _output_index(t, tile, c, i, N), totals[c][i].to(tl.bfloat16))
                    _st_zero_v4(workspace + _fragment_index(t, tile, c))
            else:
                totals = ()
                for c in tl.static_range(8):
                    for i in tl.static_range(4):
                        index = _output_index(t, tile, c, i, N)
                        totals = totals + (tl.atomic_add(workspace + index, zeros, sem="relaxed"),)
                for c in tl.static_range(8):
                    for i in tl.static_range(4):
                        index = _output_index(t, tile, c, i, N)
                        tl.store(out + index, totals[4 * c + i].to(tl.bfloat16))
                        tl.store(workspace + index, zeros)
            tl.store(tickets + tile, 0)


MODES = {"none": 0, "scalar": 1, "vector": 2}


def expected_out(n: int, split: int) -> torch.Tensor:
    """The [64, n] totals a ticket call stores: every part's `_value` summed, at `_output_index`."""
    t = torch.arange(THREADS).view(1, -1, 1, 1)
    tile = torch.arange(n // 128).view(-1, 1, 1, 1)
    c = torch.arange(GROUPS).view(1, 1, -1, 1)
    i = torch.arange(4).view(1, 1, 1, -1)
    lane = t & 31
    col = 8 * c + 2 * (lane & 3) + (i & 1)
    row = tile * 128 + (t >> 5) * 16 + (lane >> 2) + 8 * (i >> 1)
    base = ((t * 32 + c * 4 + i) % 61).float() * 0.125
    total = base * split + sum(range(split))
    out = torch.full((64 * n,), float("nan"))
    index = col * n + row
    out[index.reshape(-1)] = total.expand(index.shape).reshape(-1)
    return out.to(torch.bfloat16)


def call(n: int, split: int, mode: str, ticket: bool):
    """(a call of `split_sums` on the M = 64 grid of N = n, its outputs (workspace, tickets, out))."""
    workspace = torch.zeros(64 * n, device="cuda", dtype=torch.float32)
    tickets = torch.zeros(n // 128, device="cuda", dtype=torch.int32)
    out = torch.full((64 * n,), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    grid = (split * n // 128,)
    return (lambda: split_sums[grid](workspace, tickets, out, n, split, MODES[mode], ticket, num_warps=8)), (
        workspace, tickets, out)


def check(n: int, split: int, mode: str):
    """One ticket call of `mode` from a zero workspace: the outputs equal `expected_out`, and the workspace and
    tickets are zero again."""
    fn, (workspace, tickets, out) = call(n, split, mode, True)
    fn()
    torch.cuda.synchronize()
    want = expected_out(n, split)
    bad = (out.cpu() != want).sum().item()
    if bad or workspace.abs().sum().item() or tickets.abs().sum().item():
        raise AssertionError(f"{mode}: {bad} outputs differ from the host's sums, workspace sum "
                             f"{workspace.abs().sum().item()}, tickets {tickets.abs().sum().item()}")
    print(f"check {mode} with ticket, N = {n}, split {split}: every output equal to the host's sum, workspace and "
          "tickets zero again", flush=True)


def main(argv=None):
    from .__main__ import time_ms

    p = argparse.ArgumentParser(prog="python -m bench.split_sums", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-N", type=int, nargs="+", default=[8192])
    p.add_argument("--split", type=int, nargs="+", default=[4])
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs; python -m bench.split_sums", flush=True)
    for n in args.N:
        x = torch.randn(64, 8192, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, 8192, device="cuda", dtype=torch.bfloat16)
        cublas = time_ms(lambda: torch.nn.functional.linear(x, w), True)
        del w
        for split in args.split:
            for mode in ("scalar", "vector"):
                check(n, split, mode)
            print(f"\nN = {n}, M = 64, split {split}: {split * n // 128} programs of {THREADS} threads, "
                  f"{split * 64 * n * 4 / 1e6:.1f} MB of sums; cuBLAS bf16 (K = 8192) {cublas * 1e3:.1f} us",
                  flush=True)
            for ticket in (False, True):
                for mode in MODES:
                    fn, _ = call(n, split, mode, ticket)
                    ms = time_ms(fn, True)
                    print(f"  {mode:7s} {'with ticket' if ticket else 'adds only  '} {ms * 1e3:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
