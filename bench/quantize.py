"""`python -m bench.quantize`: the quantize kernels against a device-to-device copy, and the time they add to a GEMM.

1. Quantize (`blockscaled.quantize` on the GPU, `kernels/quantize.py`) of a bf16 [rows, K] tensor per format:
   bytes read + written over the time, as a fraction of a device-to-device copy of the input measured in the same
   process (`frac_of_copy_bw`). nvfp4 twice: with a static global scale (a checkpoint's `input_scale`) and with
   the global scale computed on the device (one more pass over the input).
2. (`python -m bench --providers cublas_bf16 blockscaled blockscaled_dynamic` times the GEMM with it.)
3. `--compile-sm90 FOLDER`: every variant through Triton's sm_90 compiler, no GPU needed.

Rows go to bench/results/<gpu>_quantize.csv: DESIGN.md section 5's columns with pair `quantize_<format>` and
the extra column frac_of_copy_bw.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import itertools
import os
from pathlib import Path
import torch

# whether this process runs under the Triton interpreter, read before bench.__main__ sets it on a CPU machine
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

import blockscaled as bs  # noqa: E402
from blockscaled.kernels import quantize as _kq  # noqa: E402
from blockscaled.kernels.quantize import quantize_decoded  # noqa: E402
from blockscaled.reference import dequantize  # noqa: E402

from .__main__ import COLUMNS, RESULTS, git_commit, result_name, time_ms

FIELDS = COLUMNS + ["frac_of_copy_bw"]
EVERY_FORMAT = frozenset({"nvfp4", "mxfp4", "mxfp8"})  # `QUANTIZE_BLOCKS` with every format on the blocks kernel
CASES = (("nvfp4", "floor", True), ("nvfp4", "floor", False), ("mxfp4", "floor", False), ("mxfp4", "rceil", False),
         ("mxfp8", "floor", False), ("mxfp8", "rceil", False))


def compile_sm90(folder: Path) -> int:
    """Every variant of the quantize kernel (codes and scales or decoded rows, bf16 or fp32 in, each format; nvfp4 on
    decode rows, where every program reduces the whole input for its global scale; mxfp8 with the hardware's E4M3
    conversion) through Triton's sm_90 compiler, no GPU needed; prints registers and spills per variant."""
    from blockscaled.kernels import quantize as kq

    from .sass import compile_launch

    def both(x, fmt, stem, suffix="", codes=True, rows=True):  # the codes-and-scales kernel and the decoded-rows one
        f = bs.get_format(fmt)
        if codes:
            compile_launch(lambda: kq.quantize(x, f, "floor", "swizzle_32_4_4", None), kq, folder,
                           f"{stem}_codes{suffix}")
        if rows:
            compile_launch(lambda: kq.quantize_decoded(x, f, "floor", None), kq, folder, f"{stem}_decoded{suffix}")

    hw, blocks, pdl, pairs = kq._hw_e4m3, kq.QUANTIZE_BLOCKS, kq._pdl, kq._pairs
    kq.QUANTIZE_BLOCKS = frozenset()  # quantize_kernel up to the "_blocks" variants
    try:
        _compile_variants(kq, both)
    finally:
        kq._hw_e4m3, kq.QUANTIZE_BLOCKS, kq._pdl, kq._pairs = hw, blocks, pdl, pairs
    return 0


def _compile_variants(kq, both) -> None:
    """`compile_sm90`'s variants, each through `both`; the module's switches set here are restored by the caller."""
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for dtype in (torch.bfloat16, torch.float32):
            both(torch.randn(64, 1024, dtype=dtype), fmt, f"quantize_{fmt}_{str(dtype)[6:]}")
    rows = torch.randn(2, 8192, dtype=torch.bfloat16)
    assert rows.numel() <= kq.QUANTIZE_OWN_AMAX_ELEMENTS
    both(rows, "nvfp4", "quantize_nvfp4_bfloat16", "_own_amax")
    for way in ("barrier", "slots"):  # as at M = 16 on a GPU
        with amax_way(way):
            both(torch.randn(16, 8192, dtype=torch.bfloat16), "nvfp4", "quantize_nvfp4_bfloat16",
                 "_barrier_slots" if way == "slots" else "_barrier")
    kq._hw_e4m3 = lambda x, fmt: fmt.element == "e4m3"  # as on an sm_89+ GPU with QUANTIZE_HW_E4M3
    both(torch.randn(64, 1024, dtype=torch.bfloat16), "mxfp8", "quantize_mxfp8_bfloat16", "_hw_e4m3")
    # each block in one thread (nvfp4: the amax from a reduction launched first)
    kq.QUANTIZE_BLOCKS = EVERY_FORMAT
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        both(torch.randn(64, 8192, dtype=torch.bfloat16), fmt, f"quantize_{fmt}_bfloat16", "_blocks")
    kq._pdl = lambda x: True  # as on an sm_90+ GPU: the dependents' launch after the amax
    both(torch.randn(64, 8192, dtype=torch.bfloat16), "mxfp4", "quantize_mxfp4_bfloat16", "_blocks_pdl")
    with amax_way("barrier"):
        both(torch.randn(16, 8192, dtype=torch.bfloat16), "nvfp4", "quantize_nvfp4_bfloat16", "_barrier_pdl")
    # the mx formats over bf16 pairs as on an sm_90+ GPU, with PDL (`QUANTIZE_PAIRS`; mxfp8 codes: the hardware E4M3)
    kq._pairs = lambda x, fmt, rows_out: not rows_out if fmt.global_scale else rows_out or fmt.element == "e2m1"
    both(torch.randn(64, 8192, dtype=torch.bfloat16), "mxfp4", "quantize_mxfp4_bfloat16", "_pairs_pdl")
    both(torch.randn(64, 8192, dtype=torch.bfloat16), "mxfp8", "quantize_mxfp8_bfloat16", "_pairs_pdl", codes=False)
    # nvfp4 codes over bf16 pairs (`QUANTIZE_PAIRS_NVFP4`; its amax reduced by a launch first, as the blocks kernel's)
    both(torch.randn(64, 8192, dtype=torch.bfloat16), "nvfp4", "quantize_nvfp4_bfloat16", "_pairs_pdl", rows=False)


def _use_config(config) -> str:
    """Set the quantize kernel's config (rows, K elements, warps; None: the default) for the next calls; its label."""
    from blockscaled.kernels import quantize as kq

    if config is None:
        return ""
    kq.QUANTIZE_ROWS, kq.QUANTIZE_K, kq.QUANTIZE_WARPS = config
    kq._LAUNCHES.clear()
    return "[r{}k{}w{}]".format(*config)


_DEFAULT_BLOCKS = _kq.QUANTIZE_BLOCKS


def _use_kernel(kind) -> str:
    """Set `QUANTIZE_BLOCKS` and the bf16 pairs' switches for the next calls ("chunks": no format, "blocks": every
    format, both without the pairs; "pairs": the module's formats with the pairs wherever they run; None: as it
    is); its label."""
    from blockscaled.kernels import quantize as kq

    if kind is None:
        return ""
    if kind == "pairs":
        kq.QUANTIZE_BLOCKS, kq.QUANTIZE_PAIRS, kq.QUANTIZE_PAIRS_DECODED = _DEFAULT_BLOCKS, True, True
        kq.QUANTIZE_PAIRS_NVFP4 = True
    else:
        kq.QUANTIZE_BLOCKS = EVERY_FORMAT if kind == "blocks" else frozenset()
        kq.QUANTIZE_PAIRS = kq.QUANTIZE_PAIRS_DECODED = kq.QUANTIZE_PAIRS_NVFP4 = False
    return f"[{kind}]"


AMAX_WAYS = {  # nvfp4's device global scale, each way forced:
    # (QUANTIZE_OWN_AMAX_ELEMENTS, _barrier_programs, QUANTIZE_BARRIER_SLOTS)
    "own": (1 << 62, lambda d: 0, False), "barrier": (0, lambda d: 256, False), "slots": (0, lambda d: 256, True),
    "launched": (0, lambda d: 0, False)}


@contextlib.contextmanager
def amax_way(way: str):
    """`kernels.quantize._global_scale` forced to one of AMAX_WAYS inside the block."""
    from blockscaled.kernels import quantize as kq

    saved = kq.QUANTIZE_OWN_AMAX_ELEMENTS, kq._barrier_programs, kq.QUANTIZE_BARRIER_SLOTS
    kq.QUANTIZE_OWN_AMAX_ELEMENTS, kq._barrier_programs, kq.QUANTIZE_BARRIER_SLOTS = AMAX_WAYS[way]
    try:
        yield
    finally:
        kq.QUANTIZE_OWN_AMAX_ELEMENTS, kq._barrier_programs, kq.QUANTIZE_BARRIER_SLOTS = saved


def amax_ways(shapes) -> list[dict]:
    """nvfp4 with its global scale computed on the device, at decode rows, each way of `kernels.quantize._global_scale`
    forced, as `scaled_mm(..., activation_format="nvfp4")` runs it (`quantize_decoded`), by CUDA-graph replay; mxfp4
    beside it (no global scale). Each way's rows checked equal to the default's."""
    from blockscaled.kernels import quantize as kq

    rows_out = []
    nv, mx = bs.get_format("nvfp4"), bs.get_format("mxfp4")
    for shape in shapes:
        m, k = (int(v) for v in shape.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want, g_want = kq.quantize_decoded(x, nv, "floor", None)
        times = {"mxfp4": time_ms(lambda: kq.quantize_decoded(x, mx, "floor", None), True),
                 "nvfp4 static": time_ms(lambda: kq.quantize_decoded(x, nv, "floor", g_want), True)}
        for way in AMAX_WAYS:
            with amax_way(way):
                got, g = kq.quantize_decoded(x, nv, "floor", None)
                if not (torch.equal(got, want) and torch.equal(g, g_want)):
                    raise SystemExit(f"{shape} nvfp4 {way}: rows or global scale differ from the default's")
                times[f"nvfp4 {way}"] = time_ms(lambda: kq.quantize_decoded(x, nv, "floor", None), True)
        print(f"{shape} (decoded rows, CUDA graph): " + ", ".join(f"{n} {t * 1e3:.2f} us" for n, t in times.items()))
        rows_out += [dict(pair=f"quantize_{n.split()[0]}", M=m, K=k, median_ms=f"{t:.5f}",
                          provider="decoded_" + (n.split()[1] if " " in n else "floor")) for n, t in times.items()]
    return rows_out


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["8192x8192", "16384x8192"], help="rows x K")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--formats", nargs="+", choices=["nvfp4", "mxfp4", "mxfp8"], default=["nvfp4", "mxfp4", "mxfp8"])
    p.add_argument("--roundings", nargs="+", choices=["floor", "rceil"], default=["floor", "rceil"])
    p.add_argument("--kernels", nargs="+", choices=["chunks", "blocks", "pairs"],
                   help="time these codes-and-scales kernels (`quantize_kernel`, `quantize_blocks_kernel`) instead "
                        "of the one `QUANTIZE_BLOCKS` picks")
    p.add_argument("--decoded", action="store_true",
                   help="time the decoded rows (`quantize_decoded`, what `scaled_mm(..., activation_format=...)` "
                        "runs on the mma kernels: bf16 written) instead of codes and scales")
    p.add_argument("--configs", nargs="+", metavar="ROWS,K,WARPS",
                   help="time these kernel configs (rows x K elements a program, warps) instead of the default one")
    p.add_argument("--compile-sm90", metavar="FOLDER", help="only compile every variant for sm_90 (no GPU) into FOLDER")
    p.add_argument("--amax-ways", nargs="+", metavar="ROWSxK",
                   help="only time nvfp4's device global scale each way at these (decode) shapes (`amax_ways`)")
    args = p.parse_args(argv)
    if args.compile_sm90:
        from .sass import compile_sm90_command

        return compile_sm90_command("bench.quantize", argv, _INTERPRETED, args.compile_sm90, compile_sm90)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs else [None]
    gpu = torch.cuda.get_device_name()
    stamp = dict(date=datetime.date.today().isoformat(), commit=git_commit(), gpu=gpu, out_dtype="", provider="blockscaled",
                 tflops="", speedup_vs_bf16="", max_rel_err="")
    rows = []
    if args.amax_ways:
        args.shapes = []
        rows = [dict(stamp, N="", gbps="", frac_of_copy_bw="", **r) for r in amax_ways(args.amax_ways)]
    for shape in args.shapes:
        m, k = (int(v) for v in shape.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        copy_dst, refs = torch.empty_like(x), {}
        copy_ms = time_ms(lambda: copy_dst.copy_(x), False)
        copy_bw = 2 * x.numel() * 2 / copy_ms / 1e6
        print(f"{shape}: device-to-device copy {copy_ms * 1e3:.1f} us, {copy_bw:.0f} GB/s (read + write)")
        cases = [c for c in CASES if c[0] in args.formats and c[1] in args.roundings]
        for (fmt, rounding, static), config, kind in itertools.product(cases, configs, args.kernels or [None]):
            label_config = _use_config(config) + _use_kernel(kind)
            g = {"global_scale": bs.quantize(x, fmt).global_scale} if static else {}
            g_cpu = {k: v.cpu() for k, v in g.items()}
            if (fmt, rounding, static) not in refs:  # one reference per case, whatever the configs
                refs[fmt, rounding, static] = (bs.quantize(x.cpu(), fmt, scale_rounding=rounding, backend="reference",
                                                           **g_cpu) if m * k <= 2**26 else None)
            ref = refs[fmt, rounding, static]
            q = bs.quantize(x, fmt, scale_rounding=rounding, **g)
            if ref is not None and not (torch.equal(q.data.view(torch.uint8).cpu(), ref.data.view(torch.uint8))
                                        and torch.equal(q.scale.view(torch.uint8).cpu(), ref.scale.view(torch.uint8))):
                raise SystemExit(f"{fmt} {rounding}: the kernel's codes differ from the reference's")
            if args.decoded:  # the rows checked against the reference's codes, dequantized, over the global scale
                gs = g.get("global_scale")
                rows_out, _ = quantize_decoded(x, bs.get_format(fmt), rounding, gs)
                if ref is not None:
                    want = dequantize(ref, torch.float64)
                    want = (want / ref.global_scale.double() if ref.global_scale is not None else want).to(torch.bfloat16)
                    if not torch.equal(rows_out.cpu().nan_to_num(), want.nan_to_num()):
                        raise SystemExit(f"{fmt} {rounding}: the decoded rows differ from the reference's")
                ms = time_ms(lambda: quantize_decoded(x, bs.get_format(fmt), rounding, gs), False)
                nbytes = x.numel() * 4
                label_config += "[decoded]"
            else:
                ms = time_ms(lambda: bs.quantize(x, fmt, scale_rounding=rounding, **g), False)
                nbytes = x.numel() * 2 + q.data.numel() * q.data.element_size() + q.scale.numel()
            gbps = nbytes / ms / 1e6
            label = (f"{fmt} {rounding}" + (" static global scale" if static else " device global scale" if fmt == "nvfp4" else "")
                     + label_config)
            print(f"  {label:34s} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s  {gbps / copy_bw:.2f} of copy"
                  + ("  (codes = reference)" if ref is not None else ""))
            rows.append(dict(stamp, pair=f"quantize_{fmt}", M=m, N="", K=k,
                             median_ms=f"{ms:.5f}", gbps=f"{gbps:.1f}", frac_of_copy_bw=f"{gbps / copy_bw:.3f}",
                             provider=f"blockscaled_{rounding}" + ("_static_gs" if static else "") + label_config))
    if not args.no_record:
        path = RESULTS / f"{result_name(gpu)}_quantize.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n", extrasaction="ignore")
            if new:
                wr.writeheader()
            wr.writerows(rows)
        print(f"appended {len(rows)} rows to {path}")


if __name__ == "__main__":
    raise SystemExit(main())
