"""`python -m bench.dense`: the dense plan's weight decode against a device-to-device copy, and its chunk size.

1. `decode_weights` (`kernels/dense.py`) of [N, K] "mma_m16k16" weights to bf16: codes and factors read plus bf16
   written over the time, as a fraction of a device-to-device copy of as many bytes measured in the same process.
2. The dense plan at one M per `chunk_rows` (rows decoded per cuBLAS call), against cuBLAS bf16 in the same process.

Prints a table; the run's log goes to bench/results (no CSV rows: the plan's end-to-end rows come from
`python -m bench --providers cublas_bf16 blockscaled_dense ...`).
3. `--compile-sm90 FOLDER`: every variant of the decode kernel through Triton's sm_90 compiler, no GPU needed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

# whether this process runs under the Triton interpreter, read before bench.__main__ sets it on a CPU machine
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

import blockscaled as bs  # noqa: E402

from .__main__ import time_ms  # noqa: E402


def compile_sm90(folder: Path) -> int:
    """Every variant of the decode kernel (fp4 / fp8 words, E8M0 / E4M3 factors, global scales folded or not)
    through Triton's sm_90 compiler, no GPU needed; prints registers and spills per variant."""
    from blockscaled.kernels import dense

    from .sass import compile_launch

    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for fold in (True, False):
            b = bs.quantize(torch.randn(256, 1024), fmt, data_layout="mma_m16k16")
            out = torch.empty(256, 1024, dtype=torch.bfloat16)
            compile_launch(lambda: dense.decode_weights(b, 0, 256, out, torch.ones(1), fold), dense, folder,
                           f"dense_decode_{fmt}_{'folded' if fold else 'exact'}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["8192x8192", "28672x8192"], help="N x K")
    p.add_argument("--formats", nargs="+", default=["nvfp4", "mxfp4", "mxfp8"])
    p.add_argument("-M", type=int, default=2048, help="activation rows of the chunk-size table")
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 2048], help="chunk_rows (0: all)")
    p.add_argument("--configs", nargs="+", metavar="GROUPS,WINDOWS,WARPS", default=[],
                   help="also time the decode kernel with these configs (16-row groups x 64-K windows a program, warps)")
    p.add_argument("--compile-sm90", metavar="FOLDER", help="only compile every variant for sm_90 (no GPU) into FOLDER")
    args = p.parse_args(argv)
    if args.compile_sm90:
        from .sass import compile_sm90_command

        return compile_sm90_command("bench.dense", argv, _INTERPRETED, args.compile_sm90, compile_sm90)
    from blockscaled.kernels import dense
    from blockscaled.kernels.dense import decode_weights

    print(f"# {torch.cuda.get_device_name()}, {bs.__name__} dense plan")
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device="cuda")
        x = torch.randn(args.M, k, device="cuda", dtype=torch.bfloat16)
        wb = w.to(torch.bfloat16)
        t_bf16 = time_ms(lambda: torch.nn.functional.linear(x, wb), True)
        for fmt in args.formats:
            b = bs.quantize_weight(w, fmt)
            ns, ks = b.stored_shape
            out = torch.empty((ns, ks), dtype=torch.bfloat16, device="cuda")
            moved = b.data.numel() * b.data.element_size() + b.kernel_mma_factors[0].numel() * 2 + out.numel() * 2
            src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            t_copy = time_ms(lambda: dst.copy_(src), True)
            default = (dense.DENSE_GROUPS, dense.DENSE_WINDOWS, dense.DENSE_WARPS)
            for config in [default] + [tuple(int(v) for v in c.split(",")) for c in args.configs]:
                dense.DENSE_GROUPS, dense.DENSE_WINDOWS, dense.DENSE_WARPS = config
                dense._LAUNCHES.clear()
                t_dec = time_ms(lambda: decode_weights(b, 0, ns, out, None, True), True)  # graphs: GPU time alone
                print(f"{shape} {fmt:6s} decode g{config[0]}w{config[1]}x{config[2]} {t_dec * 1e3:8.1f} us, "
                      f"{moved / t_dec / 1e6:6.0f} GB/s, {t_copy / t_dec:.2f} of a copy of as many bytes "
                      f"({t_copy * 1e3:.1f} us)")
            dense.DENSE_GROUPS, dense.DENSE_WINDOWS, dense.DENSE_WARPS = default
            dense._LAUNCHES.clear()
            for rows in args.chunks:
                cfg = {"chunk_rows": rows} if rows else None
                o = torch.empty((args.M, n), dtype=torch.bfloat16, device="cuda")
                t = time_ms(lambda: bs.scaled_mm(x, b, out=o, backend="dense", config=cfg), True)
                t_eager = time_ms(lambda: bs.scaled_mm(x, b, out=o, backend="dense", config=cfg), False)
                print(f"{shape} {fmt:6s} M={args.M} chunk_rows={rows or ns:6d} {t * 1e3:8.1f} us (eager {t_eager * 1e3:.1f}), "
                      f"x cuBLAS bf16 {t_bf16 / t:.3f} ({t_bf16 * 1e3:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
