"""`python -m bench.targets`: issue #62's decode target read off a GPU's recorded rows, no GPU needed.

    python -m bench.targets [--results bench/results] [--gpu h200] [--models llama3-8b ... | all] [-M 1 16]

For each pair and M: the geometric mean over the models' linear shapes (`bench.providers.MODEL_SHAPES`) of the
recorded speedup against cuBLAS bf16 (the `blockscaled` provider on the `--layout` the dispatcher picks, the latest
row of each cell in `<gpu>.csv`), the lowest and highest cell, the cells under the floor where cuBLAS bf16 takes at
least 20 us, and the cells never measured. The target: fp4 weights >= 3.0x geometric mean with no cell under 2.2x
where cuBLAS bf16 takes >= 20 us, fp8 weights >= 1.8x geometric mean. A row records one process's run of one commit;
the summary names the commits and dates it mixes.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from .__main__ import RESULTS
from .providers import MODEL_SHAPES

# (geometric mean, floor of any cell where cuBLAS bf16 takes >= FLOOR_US) by the weights' element (#62)
TARGETS = {"fp4": (3.0, 2.2), "fp8": (1.8, None)}
FLOOR_US = 20.0
DEFAULT_PAIRS = ["bf16xnvfp4", "nvfp4xnvfp4", "bf16xmxfp4", "mxfp4xmxfp4", "mxfp8xmxfp4", "bf16xmxfp8", "mxfp8xmxfp8"]


def weight_element(pair: str) -> str:
    """"fp4" or "fp8": the element of the pair's weights (its second operand)."""
    return "fp8" if pair.endswith("mxfp8") else "fp4"


def latest_cells(rows, layout: str) -> dict:
    """{(pair, M, N, K, provider): row}: the last CUDA-graph, bf16-out row of each cell in file order (rows are
    appended as runs finish), our provider's on `layout` only."""
    cells = {}
    for r in rows:
        if r["timing"] != "cudagraph" or r["out_dtype"] != "bfloat16":
            continue
        if r["provider"] == "blockscaled" and r.get("weights_layout", "") != layout:
            continue
        cells[(r["pair"], int(r["M"]), int(r["N"]), int(r["K"]), r["provider"])] = r
    return cells


def summarize(rows, shapes, pairs, ms, layout: str = "mma_m16k16") -> list[dict]:
    """One dict per (pair, M) with any measured cell: n, geomean, lo / hi (shape, speedup), under (the cells under the
    floor where cuBLAS took >= FLOOR_US), missing (shapes), commits / dates (of our rows), and target / met."""
    cells = latest_cells(rows, layout)
    out = []
    for pair in pairs:
        geo_target, floor = TARGETS[weight_element(pair)]
        for m in ms:
            got, under, missing, stamps = [], [], [], set()
            for n, k in shapes:
                ours = cells.get((pair, m, n, k, "blockscaled"))
                if ours is None:
                    missing.append((n, k))
                    continue
                speedup = float(ours["speedup_vs_bf16"])
                got.append(((n, k), speedup))
                stamps.add((ours["date"], ours["commit"]))
                cublas = cells.get((pair, m, n, k, "cublas_bf16"))
                if floor is not None and cublas is not None and float(cublas["median_ms"]) * 1e3 >= FLOOR_US \
                        and speedup < floor:
                    under.append(((n, k), speedup))
            if not got:
                continue
            geomean = math.exp(sum(math.log(s) for _, s in got) / len(got))
            out.append(dict(pair=pair, m=m, n=len(got), geomean=geomean, lo=min(got, key=lambda c: c[1]),
                            hi=max(got, key=lambda c: c[1]), under=under, missing=missing,
                            commits=sorted({c for _, c in stamps}), dates=sorted({d for d, _ in stamps}),
                            target=(geo_target, floor),
                            met=not missing and geomean >= geo_target and not under))
    return out


def shape_name(shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--gpu", default="h200", help="the CSV's name: bench/results/<gpu>.csv (h100, h200, ...)")
    p.add_argument("--models", nargs="+", default=["all"], help=f"MODEL_SHAPES names or all: {', '.join(MODEL_SHAPES)}")
    p.add_argument("-M", type=int, nargs="+", default=[1, 16])
    p.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS)
    p.add_argument("--layout", default="mma_m16k16", help="our rows' weights layout (the dispatcher's on Hopper)")
    args = p.parse_args(argv)
    names = list(MODEL_SHAPES) if "all" in args.models else args.models
    unknown = [n for n in names if n not in MODEL_SHAPES]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; known: {', '.join(MODEL_SHAPES)}")
    path = args.results / f"{args.gpu}.csv"
    if not path.exists():
        raise SystemExit(f"--gpu {args.gpu}: no {path}")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    shapes = list(dict.fromkeys(s for n in names for s in MODEL_SHAPES[n]))
    print(f"{path}: {len(shapes)} shapes of {', '.join(names)}; x cuBLAS bf16, latest row a cell")
    for s in summarize(rows, shapes, args.pairs, args.M, args.layout):
        geo_target, floor = s["target"]
        verdict = "met" if s["met"] else "NOT met" + (" (cells missing)" if s["missing"] else "")
        print(f"{s['pair']:12s} M={s['m']:<3d} {s['n']:3d} cells  geomean {s['geomean']:.2f}x (target {geo_target})"
              f"  lowest {s['lo'][1]:.2f} at {shape_name(s['lo'][0])}  highest {s['hi'][1]:.2f} at "
              f"{shape_name(s['hi'][0])}  {verdict}")
        if floor is not None and s["under"]:
            print(f"    under {floor}x where cuBLAS bf16 >= {FLOOR_US:.0f} us: "
                  + ", ".join(f"{shape_name(c)} {v:.2f}" for c, v in s["under"]))
        if s["missing"]:
            print(f"    not measured: {', '.join(map(shape_name, s['missing']))}")
        print(f"    rows of {', '.join(s['commits'])} ({s['dates'][0]} .. {s['dates'][-1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
