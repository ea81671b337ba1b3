"""`python -m bench`: validate every selected kernel against the fp64 reference, then
(with --bench, on a GPU) time this project and the baselines in one process.

Rows go to bench/results/<gpu>.csv in the format of DESIGN.md section 5; a PNG plot of
speedup vs cuBLAS bf16 goes beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # kernels run through the Triton interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import blockscaled as bs  # noqa: E402
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm  # noqa: E402

from .providers import (  # noqa: E402
    FORMAT_PAIRS,
    LLAMA_SHAPES,
    OURS_LAYOUT,
    Unsupported,
    add_llama_argument,
    model_shapes,
    blockscaled_fn,
    dynamic_fn,
    compile_cell,
    copy_fn,
    cublas_bf16_fn,
    gemlite_fn,
    make_operands,
    operand_bytes,
    ours_weights,
    scaled_mm_fp8_fn,
    triton_dot_scaled_fn,
    weight_layouts,
)
from .read_floor import read_fn  # noqa: E402

RESULTS = Path(__file__).parent / "results"
COLUMNS = "date,commit,gpu,pair,M,N,K,out_dtype,provider,median_ms,tflops,gbps,speedup_vs_bf16,max_rel_err".split(",")
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
# providers that compute from exactly our quantized operands: their max_rel_err is recorded
EXACT_PROVIDERS = (*OURS_LAYOUT, "triton_dot_scaled")
# this project's providers whose CSV rows keep their own name (the others read "blockscaled")
FORCED_OR_DYNAMIC = ("blockscaled_dynamic", "blockscaled_mma_plan", "blockscaled_dense")
PROVIDERS = (*OURS_LAYOUT, "cublas_bf16", "scaled_mm_fp8_rowwise", "scaled_mm_fp8_blockwise", "triton_dot_scaled",
             "gemlite", "d2d_copy_weights", "read_weights")
# yardsticks that move the weight bytes only (no activation, no output)
WEIGHT_ONLY = ("d2d_copy_weights", "read_weights")
# the CSV's columns after DESIGN.md's
EXTRA_COLUMNS = ["timing", "plain_ms", "weights_layout"]


def csv_provider(prov: str, device="cpu") -> dict:
    """The CSV's `provider` and `weights_layout` of a provider of this module: DESIGN.md section 5 names this
    project's rows "blockscaled" whatever layout their weights take (`weights_layout`: the layout on `device`, empty
    for the others); with the activation quantized in the call, "blockscaled_dynamic"."""
    if prov not in OURS_LAYOUT:
        return dict(provider=prov, weights_layout="")
    layout = OURS_LAYOUT[prov]
    # issue #60's rows; the plans forced by name keep their provider's name
    name = prov if prov in FORCED_OR_DYNAMIC else "blockscaled"
    return dict(provider=name, weights_layout=bs.kernels.weight_data_layout(device) if layout == "default" else layout)


def provider_label(row: dict) -> str:
    """A CSV row's provider as printed and plotted: this project's with its weights' layout."""
    return f"{row['provider']}[{row['weights_layout']}]" if row.get("weights_layout") else row["provider"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--format", nargs="+", default=["all"], choices=[*FORMAT_PAIRS, "all"],
                   help="one or more pairs (one process: --jobs compiles all their cells at once)")
    p.add_argument("-M", type=int, nargs="+", default=None, help="rows of A (default: 1 16 128 on GPU)")
    p.add_argument("-N", type=int, default=None)
    p.add_argument("-K", type=int, default=None)
    p.add_argument("--K_range", type=int, nargs=2, metavar=("A", "B"))
    p.add_argument("--K_step", type=int, default=512)
    add_llama_argument(p)
    p.add_argument("--models", nargs="+", help="every linear shape (N, K) of these models (MODEL_SHAPES: "
                   "llama3-8b, llama3-70b, llama3-405b, qwen2.5-7b, qwen2.5-32b, qwen2.5-72b, mistral-large, mixtral-8x7b, "
                   "mixtral-8x22b, deepseek-v3)")
    p.add_argument("--bench", action="store_true", help="time providers (needs a GPU)")
    p.add_argument("--out_dtype", default="bf16", choices=list(OUT_DTYPES))
    p.add_argument("--no-record", action="store_true", help="do not append to bench/results")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder for <gpu>.csv and the plot")
    p.add_argument("--copies", type=int, default=8, help="most independent input sets to rotate through (cache-cold timing)")
    p.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS),
                   help="providers to time (default: all; cublas_bf16 gives the speedup column)")
    p.add_argument("--jobs", type=int, default=1,
                   help="with --bench: compile every cell's kernels in this many processes first (fills Triton's on-disk cache)")
    p.add_argument("--plot", type=Path, metavar="CSV", help="only draw the plot of recorded rows (of --commit) beside CSV")
    p.add_argument("--commit", help="with --plot: the commit whose rows to draw (default: the last row's)")
    return p.parse_args(argv)


def shapes(args, on_gpu):
    ms = args.M or ([1, 16, 128] if on_gpu else [1, 33])
    if args.llama:
        nks = LLAMA_SHAPES[args.llama]
    elif args.models:
        nks = model_shapes(args.models)
    elif args.K_range:
        nks = [(args.N or 8192, k) for k in range(args.K_range[0], args.K_range[1] + 1, args.K_step)]
    else:
        default = 8192 if on_gpu else 64
        nks = [(args.N or default, args.K or default)]
    return [(m, n, k) for n, k in nks for m in ms]


def time_ms(fn, use_graph, rep=25):
    """Median ms of `fn`: by CUDA-graph replay (10 replays of a graph of ~rep ms of calls) or
    by plain launches. At rep=100 a cell still took 23 s on the H100 machine with its kernels
    precompiled (--jobs 12, 2026-11-22): each provider captured a graph of thousands of calls
    and replayed it for 1 s. At 25 ms a replay still averages hundreds of calls."""
    import triton.testing as tt

    if use_graph:
        return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return tt.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def progress(items):
    """A tqdm bar over the shapes when tqdm is installed (stderr, so the table stays clean)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="shapes", file=sys.stderr)


def git_commit():
    """BLOCKSCALED_COMMIT when set, else git's HEAD. Set it on a copied tree: the GPU machine's
    copy carried a .git whose HEAD was an older commit, which labeled 572 H100 rows wrongly
    (relabeled from the run logs, 2026-11-22)."""
    if os.environ.get("BLOCKSCALED_COMMIT"):
        return os.environ["BLOCKSCALED_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, text=True).strip()
    except Exception:  # noqa: BLE001 - a copy without .git: say it
        return "unknown"


def main(argv=None):
    args = parse_args(argv)
    if args.plot:
        return plot_csv(args.plot, args.commit)
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    out_dtype = OUT_DTYPES[args.out_dtype]
    pairs = list(FORMAT_PAIRS.values()) if "all" in args.format else [FORMAT_PAIRS[f] for f in dict.fromkeys(args.format)]
    gpu = torch.cuda.get_device_name() if on_gpu else "cpu"
    stamp = dict(date=datetime.date.today().isoformat(), commit=git_commit(), gpu=gpu)
    if args.bench and not on_gpu:
        print("--bench: timings need a GPU; validating only.")
    rows, failed = [], []
    cells = shapes(args, on_gpu)
    if args.bench and on_gpu:
        if args.jobs > 1:
            precompile(compile_cell, [(pair, m, n, k, out_dtype, "cuda") for m, n, k in cells for pair in pairs], args.jobs)
        print_header()
    for n_shape, (m, n, k) in enumerate(progress(cells)):
        for pair in pairs:
            pair_name = bs.SUPPORTED_PAIRS[pair]
            x, w, a, b = make_operands(pair, m, n, k, device, seed=1000 + n_shape)
            ref = ref_scaled_mm(a, b)
            weights = weight_layouts(b)
            ok = True
            for data_layout, bw in weights.items():
                try:
                    err = max_rel_err(bs.scaled_mm(a, bw, out_dtype=out_dtype), ref)
                except Exception as e:  # noqa: BLE001 - report, keep going with the other shapes
                    print(f"validate {pair_name:12s} M={m:<5d} N={n:<6d} K={k:<6d} {data_layout}: FAILED to run: {type(e).__name__}: {str(e)[:200]}")
                    ok = False
                    continue
                status = "ok" if err <= TOLERANCE[out_dtype] else "FAIL"
                print(f"validate {pair_name:12s} M={m:<5d} N={n:<6d} K={k:<6d} {args.out_dtype} {data_layout:11s}: max_rel_err={err:.2e} {status}")
                ok = ok and status == "ok"
            if not ok:
                failed.append(pair_name)
                continue
            if not (args.bench and on_gpu):
                continue
            copies = cold_copies(ours_bytes(pair, m, n, k, out_dtype), args.copies)
            operands = [(x, w, a, b)] + [make_operands(pair, m, n, k, device, seed=7 * i + n_shape) for i in range(1, copies)]
            shape_rows = bench_shape(pair, pair_name, m, n, k, operands, out_dtype, ref, stamp, args.providers)
            for r in shape_rows:
                print_row(r)
            if not args.no_record:
                record(shape_rows, gpu, args.results)  # each shape as it finishes: a cut-off run keeps its rows
            rows += shape_rows
    if rows and not args.no_record:
        plot(rows, args.results / f"{result_name(gpu)}_latest.png")
    if failed:
        print(f"validation FAILED for {sorted(set(failed))}")
        return 1
    if not on_gpu:
        print("validation passed on CPU (Triton interpreter); timings need a GPU: rerun there with --bench")
    return 0


def precompile(compile_fn, work, jobs, deadline: float | None = None):
    """Run compile_fn(*item) for every work item, each (pair, M, N, K, ...), in up to `jobs`
    processes before timing, so that the binaries land in Triton's on-disk cache. Static
    shapes give each cell its own kernels, and generating + compiling them was half of a
    cell's time in one process (58 s cold, 30 s with Triton's cache warm, mxfp8 x mxfp4 at
    8192^2 on the H100 machine, 2026-11-22). The timing process still generates Helion's code
    but loads the binaries. A cell that fails to compile here fails its validation next.
    On a GPU the items running at once hold at most 0.9 of its free memory, each counted at 28 bytes a weight
    element and 512 MB (a cell's quantize and dense plan peaked at ~24; 4 processes of 106496 x 16384 at 16 ran out
    of an H200's 140 GB, 2026-12-01): items start in order, each as soon as it fits beside the running ones (one
    alone always does), so one large cell no longer holds every small one to its count of processes (12 cells with
    16384 x 53248 among them: 5 processes, 248 s, 2026-12-01). `deadline` (a `time.time()`): the items not started
    by then are dropped (those running finish), so that a bounded run spends its time on cells it times (a fresh
    H200 machine compiled 3 cells' candidates in 12 processes for over 150 s, 2026-12-01)."""
    on_gpu = torch.cuda.is_available()
    need = [28 * n * k + 2**29 if on_gpu else 0 for _, _, n, k, *_ in work]
    budget = int(0.9 * torch.cuda.mem_get_info()[0]) if on_gpu else 0
    if on_gpu and work:
        jobs = max(1, min(jobs, budget // min(need)))
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be initialized again in a forked child
    pending, running, in_use, dropped = list(range(len(work))), {}, 0, 0
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        while pending or running:
            if pending and deadline not in (None, float("inf")) and time.time() >= deadline:
                dropped, pending = len(pending), []
                print(f"precompile: deadline reached, {dropped} items not started (they compile when timed, if "
                      "reached)")
            for i in list(pending):  # never more than `jobs`, so a submitted item starts at once
                if len(running) == jobs:
                    break
                if running and on_gpu and in_use + need[i] > budget:
                    continue
                pending.remove(i)
                running[pool.submit(compile_fn, *work[i])] = i
                in_use += need[i]
            if not running:
                break
            wait = None if not pending or deadline in (None, float("inf")) else max(0.0, deadline - time.time())
            done, _ = concurrent.futures.wait(running, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                i = running.pop(fut)
                in_use -= need[i]
                pair, m, n, k, *rest = work[i]
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - shown here, the cell's validation reports it
                    label = "".join(f" {json.dumps(r)}" for r in rest if isinstance(r, dict))  # a variant's fields
                    print(f"precompile {bs.SUPPORTED_PAIRS[pair]} M={m} N={n} K={k}{label}: {type(e).__name__}: "
                          f"{str(e)[:200]}")
    print(f"precompiled {len(work) - dropped} cells in {time.perf_counter() - start:.0f} s with {jobs} processes",
          flush=True)


def cold_copies(nbytes, most):
    """Independent input sets that a call moving `nbytes` cycles through so that repeated
    runs move more than twice the L2 cache (HBM, not L2); at least 1, at most `most`."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return min(most, max(1, math.ceil(2 * l2 / nbytes)))


def ours_bytes(pair, m, n, k, out_dtype):
    """Bytes one call of ours moves: both operands and the output (the fewest of any provider)."""
    return operand_bytes(pair[0], m, k) + operand_bytes(pair[1], n, k) + m * n * torch.finfo(out_dtype).bits / 8


def bench_shape(pair, pair_name, m, n, k, operands, out_dtype, ref, stamp, selected=PROVIDERS):
    """Time every provider on one shape. `operands` is a list of independent (x, w, a, b)
    sets: each provider cycles through as many as it takes for its bytes to exceed twice
    the L2 cache, so repeated runs read HBM, not L2 (fp4 weights of 8192^2 fit in an
    H200's 60 MB L2)."""
    use_graph = m <= 64
    flops = 2.0 * m * n * k
    out_bytes = m * n * torch.finfo(out_dtype).bits / 8
    ours = operand_bytes(pair[0], m, k) + operand_bytes(pair[1], n, k)
    fp8 = float(m * k + n * k)
    providers = {  # name: (builder(x, w, a, b), bytes one call must read)
        "blockscaled": (lambda x, w, a, b: blockscaled_fn(a, ours_weights("blockscaled", b), out_dtype), ours),
        "blockscaled_k_order": (lambda x, w, a, b: blockscaled_fn(a, b, out_dtype), ours),
        # one plan at every M: the mma decode kernels, and the dense plan (decode to bf16, then cuBLAS)
        "blockscaled_mma_plan": (lambda x, w, a, b: blockscaled_fn(a, ours_weights("blockscaled", b), out_dtype, "mma"),
                                 ours),
        "blockscaled_dense": (lambda x, w, a, b: blockscaled_fn(a, ours_weights("blockscaled", b), out_dtype, "dense"),
                              ours),
        # the bf16 activation quantized on every call (`activation_format`): its bytes read in bf16
        "blockscaled_dynamic": (lambda x, w, a, b: dynamic_fn(x, ours_weights("blockscaled", b), pair[0], out_dtype),
                                ours - operand_bytes(pair[0], m, k) + 2.0 * m * k),
        "cublas_bf16": (lambda x, w, a, b: cublas_bf16_fn(x, w, out_dtype), 2.0 * (m * k + n * k)),
        "scaled_mm_fp8_rowwise": (lambda x, w, a, b: scaled_mm_fp8_fn(x, w, out_dtype, "rowwise"), fp8),
        "scaled_mm_fp8_blockwise": (lambda x, w, a, b: scaled_mm_fp8_fn(x, w, out_dtype, "blockwise"), fp8),
        "triton_dot_scaled": (lambda x, w, a, b: triton_dot_scaled_fn(a, b, out_dtype), ours),
        "gemlite": (lambda x, w, a, b: gemlite_fn(x, w, pair), ours),
        # read + write of the weight bytes: the achievable-bandwidth yardstick of this run
        "d2d_copy_weights": (lambda x, w, a, b: copy_fn(b), 2.0 * operand_bytes(pair[1], n, k)),
        # a read of the weight bytes on the fastest grid of `python -m bench.read_floor`: the floor of any kernel
        "read_weights": (lambda x, w, a, b: read_fn(b), operand_bytes(pair[1], n, k)),
    }
    assert set(providers) == set(PROVIDERS)
    times, errs = {}, {}
    for prov, (build, nbytes) in providers.items():
        if prov not in selected:
            continue
        try:
            copies = cold_copies(nbytes + out_bytes, len(operands))
            fns = [build(*ops) for ops in operands[:copies]]
        except Unsupported as e:
            print(f"  {prov}: unsupported here: {e}")
            continue

        def run_all(fns=fns):
            for f in fns:
                f()

        run_all()
        torch.cuda.synchronize()
        errs[prov] = max_rel_err(fns[0](), ref) if prov in EXACT_PROVIDERS else None
        times[prov] = (
            time_ms(run_all, use_graph) / copies,
            time_ms(run_all, False) / copies if use_graph else None,
            nbytes + (0 if prov in WEIGHT_ONLY else out_bytes),
        )
    bf16_ms = times.get("cublas_bf16", (None,))[0]
    rows = []
    for prov, (ms, plain_ms, nbytes) in times.items():
        rows.append(dict(stamp, pair=pair_name, M=m, N=n, K=k, out_dtype=str(out_dtype).split(".")[1], **csv_provider(prov, operands[0][3].device),
                         median_ms=f"{ms:.5f}", tflops=f"{flops / ms / 1e9:.2f}", gbps=f"{nbytes / ms / 1e6:.1f}",
                         speedup_vs_bf16=f"{bf16_ms / ms:.3f}" if bf16_ms else "",
                         max_rel_err=f"{errs[prov]:.2e}" if errs[prov] is not None else "",
                         timing="cudagraph" if use_graph else "plain",
                         plain_ms=f"{plain_ms:.5f}" if plain_ms else ""))
    return rows


def print_header():
    print(f"{'pair':12s} {'M':>5s} {'N':>6s} {'K':>6s} {'provider':24s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} {'vs bf16':>8s} {'err':>9s}")


def print_row(r):
    print(f"{r['pair']:12s} {r['M']:5d} {r['N']:6d} {r['K']:6d} {provider_label(r):24s} {r['median_ms']:>9s} {r['tflops']:>8s} {r['gbps']:>8s} {r['speedup_vs_bf16']:>8s} {r['max_rel_err']:>9s}")


def result_name(gpu):
    return "h200" if "H200" in gpu else "h100" if "H100" in gpu else gpu.lower().replace(" ", "_")


def record(rows, gpu, folder=RESULTS):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result_name(gpu)}.csv"
    fields = COLUMNS + EXTRA_COLUMNS
    new = not path.exists()
    if not new:
        header = path.open().readline().strip().split(",")
        if header != fields:
            raise SystemExit(f"{path}: header {header} is not {fields}; migrate the file first")
    with path.open("a", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        if new:
            wr.writeheader()
        wr.writerows(rows)
    print(f"appended {len(rows)} rows to {path}")


def plot_csv(path, commit=None):
    """Draw the plot of one commit's rows of a results CSV (a run split over several commands)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    commit = commit or rows[-1]["commit"]
    rows = [{**r, "M": int(r["M"]), "N": int(r["N"]), "K": int(r["K"])} for r in rows if r["commit"] == commit]
    if not rows:
        raise SystemExit(f"{path}: no rows of commit {commit}")
    plot(rows, path.with_name(f"{path.stem}_{commit}.png"))
    return 0


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    pairs = sorted({r["pair"] for r in rows if r["speedup_vs_bf16"]})
    nks = sorted({(r["N"], r["K"]) for r in rows if r["speedup_vs_bf16"]})
    if not pairs:
        return
    fig, axes = plt.subplots(len(pairs), len(nks), figsize=(3.2 * len(nks) + 1, 2.4 * len(pairs) + 0.5), squeeze=False, sharey=True)
    series = {}  # one line per provider in each (pair, shape) panel: speedup vs cuBLAS bf16 against M
    for r in rows:
        if r["speedup_vs_bf16"] and r["provider"] not in ("cublas_bf16", "d2d_copy_weights"):
            series.setdefault((r["pair"], (r["N"], r["K"]), provider_label(r)), []).append((r["M"], float(r["speedup_vs_bf16"])))
    providers = sorted({prov for _, _, prov in series})
    colors = {prov: plt.get_cmap("tab10")(i % 10) for i, prov in enumerate(providers)}  # one color per provider in every panel
    for (pair, nk, prov), pts in sorted(series.items()):
        ax = axes[pairs.index(pair)][nks.index(nk)]
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov, color=colors[prov])
    for i, pair in enumerate(pairs):
        for j, (n, k) in enumerate(nks):
            ax = axes[i][j]
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pair} N={n} K={k}", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[-1][0].set_xlabel("M")
    axes[0][0].set_ylabel("speedup vs cuBLAS bf16")
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
