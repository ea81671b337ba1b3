"""`python -m bench.autotune`: a bounded search of the mma kernels' plan knobs on the GPU it finds; the fastest
config per (pair, M, N, K) goes to `kernels/tuned/<gpu>.json`, which `scaled_mm` reads (`kernels/tuned.py`).

    python -m bench.autotune --pairs nvfp4 w4a16-nvfp4 --shapes 8192x8192 4096x14336 -M 1 16 [--deadline 500]

- Candidates (`candidates`): the keys of `scaled_mm`'s mma `config` that the plans otherwise choose by rule, on a
  small grid per M; a candidate the shape refuses is skipped, and each is checked against the fp64 reference (bf16
  out, into a NaN-poisoned buffer: the timed call's own kernel) before it is timed. The default plan (`config={}`:
  the rules, no table) is timed alike.
- Compiles: each candidate is its own kernel (its knobs are constants), and compiling took ~90 s of a cell's time in
  one process (H200, M = 1, 15 candidates); `--jobs N` compiles every cell's candidates in N processes first
  (`bench.__main__.precompile`: Triton's on-disk cache), so the timing process only loads them.
- Times: bf16 out, CUDA-graph replay (`bench.__main__.time_ms`) over as many copies of the weights as move twice
  the L2 (`bench.__main__.cold_copies`), so each call reads HBM as in a model. A config is kept only where it beats
  the default by more than `KEEP_MARGIN` (else the entry holds None: the default stays). Entries written before
  2026-11-29 were timed on L2-warm weights (no "cold"): a run tunes their cells again and replaces them.
- Resumable: cells already in the table (timed cold) are skipped (`--retune`: not) and the table is written after
  every cell, so a run cut at the device's time limit keeps what it finished; `--deadline` stops starting new cells
  (and compiles: `--jobs`) that many seconds after the command starts.

The quantize kernels' Helion configs, by Helion's own autotuner (block sizes, warps, stages, indexing, ...):

    python -m bench.autotune --quantize nvfp4 mxfp4 mxfp8 --rows 1 16 2048 --shapes 8192x8192 [--budget 60]

- Each (format, codes or decoded rows, rows, K) is the launch `blockscaled.quantize` (codes, rowmajor scales) or
  `scaled_mm(..., activation_format=...)` (decoded rows) makes for a bf16 [rows, K] input, captured, then
  `kernel.autotune(args)` at Helion's "quick" effort within `--budget` seconds, Helion's accuracy check on.
- The config found must write every output (codes, scales, rows, nvfp4's global scale; each poisoned first) bit for
  bit as the default config does, and beat it by `KEEP_MARGIN` (CUDA-graph replay), else the entry holds None.
- nvfp4's grid-barrier variant (decode rows without a static global scale) is not tuned: its programs must all be
  resident at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

import blockscaled as bs
from blockscaled.kernels import api, plans, tuned
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

from .providers import FORMAT_PAIRS, make_operands

# a tuned config must beat the default by this much: run-to-run noise of a CUDA-graph median is ~1%
KEEP_MARGIN = 0.02
BOUND = 4e-3  # bf16 out against fp64: one output rounding (tests/pairs.py); a wrong split or slice is off by O(1)


def candidates(m: int) -> list[dict]:
    """The configs tried at M rows (before the shape's own checks)."""
    # the L2 hints made once ("hoist") or not at all ("evict" off): 12 fewer sm_90 instructions a window at M = 1 and
    # ~24 an iteration at M = 16 for bf16 activations, but one weight load issued later; hoisting was 7-8% slower for
    # bf16 x fp4 at M = 1 on an H100 (memory-bound there), while an H200 issues on 2/3 of its cycles in these loops
    hints = [{"hoist": True}, {"evict": False}]
    # 16 warps on K without shared B: where 16 does not divide the K / 64 windows (Qwen2.5-7B's 56 and 296) the
    # first W mod 16 take one more (`mma_gemv.tail_window`); with fp4 / fp8 activations at M = 1 the only 16-warp
    # plans, staged (the default at 8192^2) or not, which the wave rule leaves out below half a wave (4096 x 14336)
    sixteen = {"k_warps": 16, "shared_b": False}
    # fp4 / fp8 activations decoded to bf16 rows first, then the bf16 plan (refused for bf16 activations)
    predecode = [{"predecode": True}]
    # every window's words loaded before the first mma: H200, 4096 x 4096, bf16 x nvfp4 5.0 -> 4.3 us, where the 16-warp
    # programs fill under a wave; 3-17% slower at the other three Llama-3-8B shapes (its registers cost programs)
    preload = [{"preload": True}, {"preload": True, "hoist": True}]
    if m == 1:  # a fixed split never beat the cap's wave rule (H200, 4 cells of 8B shapes): not tried
        return ([{"k_warps": w} for w in (2, 4, 8, 16)] + [{"max_split": s} for s in (8, 16, 32, 64)] + hints
                + [{"hoist": True, "k_warps": 16}, sixteen | {"stage_b": False},
                   sixteen | {"stage_b": False, "hoist": True}, sixteen | {"stage_b": True}]
                + predecode + [sixteen | {"predecode": True}] + preload)
    if m <= plans.MMA_WARP_M:
        return ([{"k_warps": w, "shared_b": True, "ahead": a, "unroll": u} for w in (4, 8) for a in (0, 1) for u in (1, 2)]
                + [{"max_split": s} for s in (4, 8, 16, 32)] + [{"row_groups": g} for g in (1, 2)] + hints
                + [sixteen | {"row_groups": 1}] + predecode)
    # above 64 rows, 128 activation rows a program with split-K too: the activation is re-read from L2 once per 128
    # weight rows whatever the tile, the weights once per tile_m rows (M = 256, 8192^2, tile_m 64: ~411 MB a call)
    # and 16 warps (256 weight rows: the activation's re-reads halved too, docs/MID_M.md)
    wide = ([{"tile_m": 128, "split": s} for s in (1, 2, 3, 4)] + [{"tile_m": 128, "warps": 16, "split": s}
                                                                    for s in (1, 2, 3, 4)]
            if m > plans.MMA_M64_B_ROWS else [])
    return ([{"split": s} for s in (1, 2, 3, 4, 6, 8)] + [{"ahead": a} for a in (1, 2, 3)]
            + [{"unroll": u} for u in (1, 2)] + [{"tile_m": 64}] + wide)


def valid(config: dict, a, b, m: int, n: int, k: int) -> bool:
    """Whether `config` passes the mma backend's checks at this shape (and its split divides into K / 64)."""
    try:
        plans.mma_options_for(config, a, b, m, n)
    except ValueError:
        return False
    return config.get("split", 1) <= k // 64


def cell(pair: tuple[str, str], m: int, n: int, k: int, device) -> tuple:
    """One cell's operands (activation, "mma_m16k16" weights) and its configs: the default ({}) and every valid
    candidate."""
    _, _, a, b = make_operands(pair, m, n, k, device, seed=7)
    b = b.with_data_layout("mma_m16k16")
    return a, b, [{}] + [c for c in candidates(m) if valid(c, a, b, m, n, k)]


def tune_cell(pair: tuple[str, str], m: int, n: int, k: int, measure, device="cuda", log=print, call=bs.scaled_mm) -> dict:
    """One table entry: every valid candidate checked, then timed by `measure(fn) -> ms` (`call`: `scaled_mm`, or a
    stand-in where the mma kernels cannot run)."""
    a, b, configs = cell(pair, m, n, k, device)
    ref = ref_scaled_mm(a, b)
    name = api.SUPPORTED_PAIRS[pair]
    weights = cold_weights(b)
    times = {}
    out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    for config in configs:
        key = json.dumps(config, sort_keys=True)
        try:
            out.fill_(float("nan"))
            err = max_rel_err(call(a, b, backend="mma", config=config, out=out), ref)
            if not err <= BOUND:
                log(f"{name} M={m} {n}x{k} {key}: max_rel_err {err:.3g} > {BOUND}: skipped")
                continue
            for w in weights[1:]:  # each copy's first call outside the timing (its caches)
                call(a, w, backend="mma", config=config, out=out)

            def calls(c=config):
                for w in weights:
                    call(a, w, backend="mma", config=c, out=out)

            times[key] = measure(calls) * 1e3 / len(weights)
        except Exception as e:  # noqa: BLE001 - a candidate that cannot compile or launch is skipped, and said
            log(f"{name} M={m} {n}x{k} {key}: {type(e).__name__}: {str(e)[:200]}")
    if "{}" not in times:
        raise RuntimeError(f"{name} M={m} {n}x{k}: the default plan did not run (see the log above)")
    default_us = times.pop("{}")
    best_key = min(times, key=times.get) if times else None
    keep = best_key is not None and times[best_key] < default_us * (1 - KEEP_MARGIN)
    entry = dict(pair=name, m=m, n=n, k=k, config=json.loads(best_key) if keep else None,
                 us=round(times[best_key] if keep else default_us, 2), default_us=round(default_us, 2), cold=True)
    log(f"{name} M={m} {n}x{k}: default {default_us:.2f} us, best {best_key} {times.get(best_key, float('nan')):.2f} us"
        f" -> {entry['config']}")
    # every candidate's time, fastest first: the data a rule for shapes off the table is fitted to
    log(f"{name} M={m} {n}x{k} all (us): " + "; ".join(f"{key} {us:.2f}" for key, us in sorted(times.items(),
                                                                                              key=lambda kv: kv[1])))
    return entry


def cold_weights(b) -> list:
    """`b` and copies of it: on a GPU as many as move twice the L2 per round (at most 16), else `b` alone."""
    if not b.data.is_cuda:
        return [b]
    from .__main__ import cold_copies
    from .providers import weight_bytes

    copies = cold_copies(weight_bytes(b).numel(), 16)
    return [b] + [dataclasses.replace(b, data=b.data.clone(), scale=b.scale.clone()) for _ in range(copies - 1)]


def compile_cell(pair: tuple[str, str], m: int, n: int, k: int, device="cuda") -> None:
    """Every valid candidate of one cell run once (bf16 out), so that its binary lands in Triton's on-disk cache."""
    a, b, configs = cell(pair, m, n, k, device)
    for config in configs:
        try:
            bs.scaled_mm(a, b, backend="mma", config=config)
        except Exception:  # noqa: BLE001 - the timing process checks, skips and logs it
            pass
    torch.cuda.synchronize()


def cell_key(e: dict) -> tuple:
    return e["pair"], e["m"], e["n"], e["k"]


def finished(path: Path, retune: bool = False) -> tuple[list[dict], set[tuple]]:
    """The table's entries at `path` (none if absent) and the cells (pair name, M, N, K) of those timed on cold
    weights: an entry timed L2-warm (before 2026-11-29, no "cold") is tuned again and replaced; with `retune` every
    cell is (after the candidates change)."""
    entries = read_section(path, "entries")
    return entries, set() if retune else {cell_key(e) for e in entries if e.get("cold")}


def run(pairs, shapes, ms, path: Path, measure, deadline: float = float("inf"), device="cuda", log=print,
        call=bs.scaled_mm, retune: bool = False) -> list[dict]:
    """Tune every (pair, shape, M) not yet in the table at `path` (`retune`: every one), writing it after each;
    returns its entries."""
    entries, done = finished(path, retune)
    start = time.time()
    for pair in pairs:
        for n, k in shapes:
            for m in ms:
                if (api.SUPPORTED_PAIRS[pair], m, n, k) in done:
                    continue
                if time.time() - start > deadline:
                    log(f"deadline: {api.SUPPORTED_PAIRS[pair]} M={m} {n}x{k} and later cells not started")
                    return entries
                entry = tune_cell(pair, m, n, k, measure, device, log, call)
                entries = [e for e in entries if cell_key(e) != cell_key(entry)] + [entry]
                entries.sort(key=lambda e: (e["pair"], e["n"], e["k"], e["m"]))
                write_table(path, "entries", entries)
    return entries


def read_section(path: Path, section: str) -> list[dict]:
    """The table's `section` ("entries": the mma plans, "quantize") at `path`; none if absent."""
    return json.loads(path.read_text()).get(section, []) if path.exists() else []


def write_table(path: Path, section: str, entries: list[dict]) -> None:
    """`entries` as the table's `section` ("entries": the mma plans, "quantize"), the other section kept."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[section] = entries
    data.setdefault("entries", [])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    tuned.clear_caches()


QUANTIZE_OUTPUTS = ("data", "scale", "global_out", "decoded")  # the quantize kernels' parameters they write


def quantize_launch(fmt: str, rows: int, k: int, decoded: bool, device="cuda"):
    """(kernel, args, default config) of the quantize launch for a bf16 [rows, k] input (random, seeded), as
    `blockscaled.quantize` (codes) or `scaled_mm(..., activation_format=fmt)` (decoded rows) makes it; captured, not
    run. None for nvfp4's grid-barrier variant."""
    from blockscaled.kernels import quantize as kq

    gen = torch.Generator(device=device).manual_seed(rows * 131 + k)
    x = (torch.randn(rows, k, device=device, generator=gen) * 3).to(torch.bfloat16)
    f = bs.get_format(fmt)
    if kq._global_scale(x, f, None).barrier:
        return None
    seen = []
    real, real_gpu = kq._launch_cached, kq._tuned_gpu
    kq._launch_cached = lambda cache, key, kernel, args, config, dev: seen.append((kernel, args, config()))
    kq._tuned_gpu = lambda dev: None  # the default config's launch, also where the table has an entry of fewer rows
    try:
        if decoded:
            kq.quantize_decoded(x, f, "floor", None)
        else:
            kq.quantize(x, f, "floor", "rowmajor", None)
    finally:
        kq._launch_cached, kq._tuned_gpu = real, real_gpu
    return seen[-1]


def written(kernel, args) -> list[int]:
    """Indices of the arguments `kernel` writes (QUANTIZE_OUTPUTS), once each, leaving out placeholders that are the
    input or the given global scale."""
    import inspect

    names = list(inspect.signature(kernel.fn).parameters)
    inputs = {args[names.index("x")].data_ptr(), args[names.index("global_scale")].data_ptr()}
    out, seen = [], set()
    for i, name in enumerate(names):
        if name in QUANTIZE_OUTPUTS and args[i].data_ptr() not in inputs | seen:
            out.append(i)
            seen.add(args[i].data_ptr())
    return out


def outputs_of(launch, args, outs: list[int]) -> list[torch.Tensor]:
    """What `launch(*args)` writes into `args[outs]`, each poisoned (every byte 0xFF: NaN codes and scales) before."""
    for i in outs:
        args[i].view(torch.uint8).fill_(255)
    launch(*args)
    if args[outs[0]].is_cuda:
        torch.cuda.synchronize()
    return [args[i].clone() for i in outs]


def tune_quantize(fmt: str, rows: int, k: int, decoded: bool, measure, budget: int, device="cuda", log=print,
                  done=frozenset()) -> dict | None:
    """One quantize entry: Helion's autotuner on the captured launch, the config found checked bit for bit against
    the default's outputs and timed against it by `measure(fn) -> ms`. None where the launch is not tuned, or its
    kernel's entry (`quantize_key`) is in `done`."""
    from blockscaled.kernels.api import _compile
    from blockscaled.kernels.quantize import table_name

    captured = quantize_launch(fmt, rows, k, decoded, device)
    what = f"quantize {fmt} {'decoded rows' if decoded else 'codes'} {rows}x{k}"
    if captured is None:
        log(f"{what}: the grid barrier's variant: not tuned")
        return None
    kernel, args, default = captured
    kernel_key = table_name(kernel, args)
    if (kernel_key, fmt, decoded, "bfloat16", rows, k) in done:  # the kernel the call runs now, not a former one
        return None
    bound = kernel.bind(args)
    knobs = dict(autotune_effort="quick", autotune_budget_seconds=budget, autotune_progress_bar=False,
                 # Helion's search starts from its own default config (75 us at nvfp4 2048 x 8192, H200) unless seeded
                 # with the kernel's (28.7 us): the search is then for its neighbours.
                 autotune_seed_configs=[default],
                 # Some of the search space does not compile (Helion's reduction loops over the blocks' reshape):
                 # skipped, not fatal; a config that takes over 8 s to compile is not one to keep (the default: 0.1 s).
                 autotune_ignore_errors=True, autotune_compile_timeout=8)
    saved = {name: getattr(bound.settings, name) for name in knobs}
    for name, value in knobs.items():
        setattr(bound.settings, name, value)
    try:
        best = bound.autotune(args, force=True)
    finally:
        for name, value in saved.items():
            setattr(bound.settings, name, value)
    outs = written(kernel, args)
    launches = {"default": _compile(kernel, args, default, torch.device(device)),
                "tuned": _compile(kernel, args, best, torch.device(device))}
    want, got = (outputs_of(launches[name], args, outs) for name in ("default", "tuned"))
    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(want, got))
    times = {name: measure(lambda f=launch: f(*args)) * 1e3 for name, launch in launches.items()}
    keep = same and times["tuned"] < times["default"] * (1 - KEEP_MARGIN)
    entry = dict(kernel=kernel_key, format=fmt, decoded=decoded, dtype="bfloat16", rows=rows, k=k,
                 config=dict(best.config) if keep else None, us=round(times["tuned" if keep else "default"], 2),
                 default_us=round(times["default"], 2))
    log(f"{what}: default {times['default']:.2f} us, Helion's {times['tuned']:.2f} us"
        f"{'' if same else ' (outputs differ: refused)'} -> {entry['config']}")
    return entry


def quantize_key(e: dict) -> tuple:
    return e["kernel"], e["format"], e["decoded"], e["dtype"], e["rows"], e["k"]


def run_quantize(formats, outputs, rows_list, ks, path: Path, measure, budget: int, deadline: float = float("inf"),
                 device="cuda", log=print) -> list[dict]:
    """Tune every (format, output, rows, K) whose launch is not yet in the table's quantize section, writing it after
    each; returns the section."""
    entries = read_section(path, "quantize")
    done = {quantize_key(e) for e in entries}
    start = time.time()
    for fmt in formats:
        for decoded in outputs:
            for k in ks:
                for rows in rows_list:
                    if time.time() - start > deadline:
                        log(f"deadline: quantize {fmt} {rows}x{k} and later launches not started")
                        return entries
                    entry = tune_quantize(fmt, rows, k, decoded, measure, budget, device, log, done)
                    if entry is None:
                        continue
                    entries = [e for e in entries if quantize_key(e) != quantize_key(entry)] + [entry]
                    entries.sort(key=quantize_key)
                    write_table(path, "quantize", entries)
    return entries


def cell_shapes(shapes: list[str], models: list[str]) -> list[tuple[int, int]]:
    """--shapes (NxK) then --models' shapes, each once; 8192 x 8192 when neither is given."""
    from .providers import model_shapes

    given = [tuple(int(v) for v in s.split("x")) for s in shapes] + model_shapes(models)
    return list(dict.fromkeys(given)) or [(8192, 8192)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", nargs="+", choices=list(FORMAT_PAIRS), default=list(FORMAT_PAIRS))
    p.add_argument("--shapes", nargs="+", default=[], help="NxK weight shapes (default, without --models: 8192x8192)")
    p.add_argument("--models", nargs="+", default=[], help="every linear shape of these models (bench.providers."
                   "MODEL_SHAPES: llama3-8b ... deepseek-v3)")
    p.add_argument("-M", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no new cell starts")
    p.add_argument("--table", type=Path, help="default: kernels/tuned/<gpu>.json")
    p.add_argument("--jobs", type=int, default=1, help="processes compiling the candidates before timing")
    p.add_argument("--retune", action="store_true", help="tune the cells the table already has too (replaced)")
    p.add_argument("--quantize", nargs="+", choices=["nvfp4", "mxfp4", "mxfp8"],
                   help="instead of mma plans: these formats' quantize kernels, by Helion's autotuner (K from --shapes)")
    p.add_argument("--outputs", nargs="+", choices=["decoded", "codes"], default=["decoded", "codes"])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 16, 2048], help="with --quantize: input rows")
    p.add_argument("--budget", type=int, default=60, help="with --quantize: seconds of Helion's search a launch")
    args = p.parse_args(argv)
    shapes = cell_shapes(args.shapes, args.models)
    if not torch.cuda.is_available():
        raise SystemExit("bench.autotune times kernels: it needs a CUDA GPU")
    from .__main__ import precompile, time_ms

    path = args.table or tuned.TABLES / f"{tuned.gpu_key(torch.cuda.get_device_name())}.json"
    if args.quantize:
        ks = list(dict.fromkeys(k for _, k in shapes))
        entries = run_quantize(args.quantize, [o == "decoded" for o in args.outputs], args.rows, ks, path,
                               lambda fn: time_ms(fn, True), args.budget, args.deadline)
        print(f"{len(entries)} quantize entries in {path}")
        return 0
    start = time.time()  # --deadline counts from here: the precompile's time is the run's too
    if args.jobs > 1:
        _, done = finished(path, args.retune)
        work = [(FORMAT_PAIRS[f], m, n, k, "cuda") for f in args.pairs for n, k in shapes for m in args.M
                if (api.SUPPORTED_PAIRS[FORMAT_PAIRS[f]], m, n, k) not in done]
        precompile(compile_cell, work, args.jobs, deadline=start + args.deadline)
    entries = run([FORMAT_PAIRS[f] for f in args.pairs], shapes, args.M, path, lambda fn: time_ms(fn, True),
                  args.deadline - (time.time() - start), retune=args.retune)
    print(f"{len(entries)} entries in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
