"""`python -m bench.sass`: what the small-M kernels' K loop compiles to on sm_90, with no GPU.

For each pair and config variant (the dicts `python -m bench.variants` takes) it builds the
plan that an H100 would run (132 SMs, PTX decodes) for `mma_gemv_kernel` (mma_m16k16 weights,
bf16, fp4 or fp8 activations; at M > 16 `mma_m64_kernel`; variants: {"max_split": n, "row_groups":
r, "shared_b": b, "wgmma": w, "ahead": a, "k_warps": k, "unroll": u}), has
Helion write the Triton code, compiles it for sm_90 with Triton's bundled ptxas,
disassembles it and counts the instructions of the K loop: all of them, per weight element
(`per_w`), barriers and shared-memory traffic (layout conversions), tensor-core and
conversion instructions, scale arithmetic, and the global loads issued before the loop's first fence or
barrier (`early`). It needs the CUDA backend of Triton (any Triton
wheel for Linux), not a GPU. Counts are per loop iteration of one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import blockscaled as bs
from blockscaled.kernels import api, configs, plans

from .providers import FORMAT_PAIRS, make_operands

H100_SMS = 132
H100_REGS_PER_SM = 65536  # what Helion caps maxnreg x threads per program by
COUNTS = {  # column: SASS opcode pattern
    "BAR": r"BAR\b", "STS": r"STS\b", "LDS": r"LDS(M)?\b", "LDG": r"LDG(STS)?\b", "HMMA": r"HMMA\b", "HGMMA": r"[HQ]GMMA\b",
    "F2FP": r"F2FP\b", "HMUL2/HFMA2": r"H(MUL|FMA)2\b", "FMUL/FFMA": r"F(MUL|FMA)\b", "LOP3": r"LOP3\b",
    "ISETP/FSEL": r"(ISETP|FSEL)\b",
}
COLUMNS = ["instr", "per_w", *COUNTS, "early", "pre", "regs", "spill", "smem", "rt", "ep_rt"]  # what main prints per variant
TRITON_TYPES = {torch.bool: "*i1", torch.uint8: "*u8", torch.bfloat16: "*bf16", torch.float8_e4m3fn: "*fp8e4nv", torch.float32: "*fp32", torch.int32: "*i32",
                torch.int16: "*i16", torch.int64: "*i64", torch.float16: "*fp16"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.sass", description=__doc__)
    p.add_argument("--format", nargs="+", default=["all"], choices=[*FORMAT_PAIRS, "all"])
    p.add_argument("-M", type=int, default=1)
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--backend", default="mma", choices=["mma"], help="the mma kernels (the only ones counted)")
    p.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of config-table field dicts")
    p.add_argument("--keep", type=Path, default=None, help="folder for the .py, .ptx and .sass files")
    return p.parse_args(argv)


@contextlib.contextmanager
def planned_as_h100():
    """Plan and generate code as on an H100 from a CPU process: sm90 table, 132 SMs, PTX decodes and NVIDIA dot
    dtypes, and Helion's CUDA-only config checks and options (without a GPU Helion drops `maxnreg` silently, so a
    config it refuses on the GPU, such as `maxnreg` without a persistent pid_type, would compile here)."""
    import helion._compat
    import helion.autotuner.config_spec as spec

    replaced = [(configs, "arch_key", lambda device: "sm90"), (plans, "_sm_count", lambda device: H100_SMS),
                (plans, "_ptx_decodes", lambda device: True), (plans, "_has_wgmma", lambda device: True),
                (plans, "_has_pdl", lambda device: True),
                (helion._compat, "_supports_maxnreg", lambda: True),
                (spec, "_regs_per_block", lambda: H100_REGS_PER_SM)]
    with contextlib.ExitStack() as restore:
        for owner, name, value in replaced:
            restore.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, value)
        yield


def instructions(sass: str) -> list[tuple[str, str]]:
    """(opcode, operands) of each SASS instruction, predicates dropped."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", sass)


def loop_counts(sass: str) -> dict:
    """Instruction counts of the first loop (from a label to the first branch back to it), its
    global reads in sequence (`rt`, `serial_reads`), those of the code after it (`ep_rt`) and the global loads
    before it (`pre`: with staged B at M = 1, the first window's 5 weight words and the activation's 2)."""
    for label in re.finditer(r"^(\.L_x_\d+):", sass, re.M):
        back = sass.find(f"BRA `({label.group(1)})", label.end())
        if back > 0:
            body = sass[label.end():back]
            break
    else:
        raise ValueError("no loop in the SASS (did the K loop unroll away? use a larger K)")
    code = instructions(body)
    ops = [op for op, _ in code]
    counts = {"instr": len(ops), "rt": serial_reads(code), "early": early_loads(ops)}
    for name, pattern in COUNTS.items():
        counts[name] = sum(bool(re.match(pattern, op)) for op in ops)
    pre = sum(bool(re.match(COUNTS["LDG"], op)) for op, _ in instructions(sass[:label.start()]))
    return {**counts, "pre": pre, "ep_rt": serial_reads(instructions(sass[back:]))}


def early_loads(ops: list[str]) -> int:
    """Global loads of the loop issued before its first fence or barrier (MEMBAR, BAR): those the B exchange does not
    hold back. mma_m64_kernel, mxfp8 x mxfp4 at M = 64: 2 of 9 in the 36.0-us build, 0 in the 42.4-us one of 4053425,
    whose instruction count per window was no higher (docs/DECODE_NOTES.md, 2026-11-25)."""
    fence = next((i for i, op in enumerate(ops) if re.match(r"(MEM)?BAR\b", op)), len(ops))
    return sum(bool(re.match(COUNTS["LDG"], op)) for op in ops[:fence])


def serial_reads(code: list[tuple[str, str]]) -> int:
    """Global reads (LDG, ATOMG with a result) in sequence: a read issued after an instruction
    touched the register of an earlier read that is still in flight had to wait for that
    read's round trip. In one K-loop iteration: the memory round trips a warp waits for in
    sequence per iteration (1: every load issued before any is used); after the loop: those
    of the split-K epilogue (ticket, then the sums read back)."""
    batches, pending = 0, set()
    for op, operands in code:
        regs = re.findall(r"\bR(\d+)\b", operands)
        if set(regs) & pending:  # the scoreboard waits for every read in flight
            pending = set()
        if re.match(r"(LDG|ATOMG)\b", op):
            batches += not pending
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            pending |= {str(int(regs[0]) + i) for i in range(width)}  # the destination (ATOMG: after PT)
    return batches


def compile_sm90(code: str, kernel_fn, args, cfg, folder: Path, name: str) -> dict:
    """Compile Helion's Triton code for sm_90 and count the loop's SASS instructions."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = folder / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, f"_helion_{kernel_fn.__name__}")
    names = list(fn.arg_names)
    tensors = dict(zip(inspect.signature(kernel_fn).parameters, args, strict=True))
    # reduction sizes Helion passes as constexpr arguments (`_RDIM_SIZE_4 = 16` in the host code)
    dims = {k: int(v) for k, v in re.findall(r"^\s*(_RDIM_SIZE_\d+) = (\d+)$", code, re.M)}
    # and sizes derived from block sizes (`_SHAPE_DIM = 32 * _BLOCK_SIZE_0`), evaluated in the host code's order
    known = {k: int(v) for k, v in re.findall(r"^\s*(_BLOCK_SIZE_\d+) = (\d+)$", code, re.M)}
    for dim, expr in re.findall(r"^\s*(_SHAPE_DIM\w*) = ([\w *+]+)$", code, re.M):
        known[dim] = dims[dim] = int(eval(expr, {"__builtins__": {}}, known))  # noqa: S307 - Helion's own host code
    # persistent pid types: the programs the host launches per SM count, as on an H100
    for multiplier in re.findall(r"^\s*_NUM_SM = helion\.runtime\.get_num_sm\([^)]*\)(?: \* (\d+))?$", code, re.M):
        dims["_NUM_SM"] = H100_SMS * int(multiplier or 1)
    signature = {p: "constexpr" if p in dims else "fp32" if isinstance(tensors.get(p), float) else
                 TRITON_TYPES[tensors[p].dtype] for p in names}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in dims.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, p in enumerate(names) if p not in dims})
    opts = {"num_warps": cfg.config.get("num_warps", 4), "num_stages": cfg.config.get("num_stages", 2),
            **({"maxnreg": cfg.config["maxnreg"]} if cfg.config.get("maxnreg") else {})}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return compiled_counts(kernel, folder, name)


def compile_sm90_command(module: str, argv, interpreted: bool, folder: str, compile_all) -> int | None:
    """`python -m <module> --compile-sm90 FOLDER`: `compile_all(Path(FOLDER))` outside the Triton interpreter (whose
    @triton.jit cannot compile for sm_90: under it, a child process without it). `interpreted`: whether the module's
    process ran under it before bench.__main__'s import set it on a CPU machine."""
    if interpreted:
        return outside_interpreter(module, argv)
    os.environ.pop("TRITON_INTERPRET", None)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return compile_all(Path(folder))


def recorded_launches(run, module) -> list[tuple]:
    """(kernel, arguments, config) of each pre-pass launch `run()` makes through `kernels.api._compile` (with
    `module`'s launcher cache emptied), recorded instead of compiled or launched."""
    from unittest import mock

    from blockscaled.kernels import launch

    seen = []
    # (CPU tensors pass the kernels' device check, `launch.device_error`, as under the interpreter: nothing launches)
    with mock.patch.object(api, "_compile", lambda kernel, a, cfg, *_, **__: seen.append((kernel, a, cfg)) or (lambda *_: None)), \
            mock.patch.object(module, "_LAUNCHES", {}), mock.patch.object(launch, "interpreted", lambda: True):
        run()
    return seen


def compile_launch(run, module, folder: Path, name: str) -> dict:
    """Compile for sm_90 (no GPU) the one pre-pass kernel `run()` would launch: `kernels.api._compile` records its
    arguments and config instead (with `module`'s launcher cache emptied), then `compile_sm90`; prints and returns
    the counts."""
    (kernel, args, cfg), = recorded_launches(run, module)
    counts = compile_sm90(kernel.bind(args).to_triton_code(cfg), kernel, args, cfg, folder, name)
    print(f"{name:32s} compiled for sm_90: {counts['regs']} registers, {counts['spill']} spilled, "
          f"{counts['smem']} B shared, {len(instructions((folder / f'{name}.sass').read_text()))} instructions")
    return counts


def compiled_counts(kernel, folder: Path, name: str) -> dict:
    """The K-loop counts (`loop_counts`), registers, spills and shared memory of a Triton kernel compiled for sm_90,
    its .ttgir, .ptx, .cubin and .sass written into `folder` as `name`.*."""
    import triton

    (folder / f"{name}.ttgir").write_text(kernel.asm["ttgir"])  # layouts and their conversions
    (folder / f"{name}.ptx").write_text(kernel.asm["ptx"])
    (folder / f"{name}.cubin").write_bytes(kernel.asm["cubin"])
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    sass = subprocess.check_output([str(nvdisasm), "-c", str(folder / f"{name}.cubin")], text=True)
    (folder / f"{name}.sass").write_text(sass)
    # registers per thread decide how many programs fit on an SM; LOCAL > 0 means spills
    usage = subprocess.check_output([str(nvdisasm.with_name("cuobjdump")), "-res-usage", str(folder / f"{name}.cubin")],
                                    text=True)
    regs, local, static = (int(re.search(rf"\b{key}:(\d+)", usage).group(1)) for key in ("REG", "LOCAL", "SHARED"))
    # shared memory per program (static, as declared in inline PTX, and Triton's dynamic) decides it too
    return {**loop_counts(sass), "regs": regs, "spill": local, "smem": static + kernel.metadata.shared}


def outside_interpreter(module: str, argv) -> int | None:
    """Under the Triton interpreter (whose @triton.jit cannot compile for sm_90) run `python -m module argv` in a child
    process without it and return its exit status; None when not under the interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return None
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.call([sys.executable, "-m", module, *(sys.argv[1:] if argv is None else argv)], env=env,
                           cwd=Path(__file__).parent.parent)


def mma_kernel_code(args, a, b, variant):
    """kernel_code of the mma backend: `a` the activation (bf16 or QTensor), `b` the
    "mma_m16k16" QTensor, `variant` may set any `_mma_options` key; 32 weights per thread,
    row group and window."""
    with planned_as_h100():
        options = plans.mma_options_for(variant or None, a, b, args.M, args.N)
        mma_plan = plans._mma_plan(a, b, False, args.M, args.N, args.K, options)
        out = torch.empty(args.M, args.N, dtype=torch.bfloat16)
        kargs = api._mma_args(mma_plan, api._mma_operands(mma_plan, a, b, None, out, api._work(None, mma_plan, out.device)),
                              out)
        kernel = plans.mma_kernel(args.M)
        code = kernel.bind(kargs).to_triton_code(mma_plan.cfg)
    row_groups = dict(zip(inspect.signature(kernel.fn).parameters, kargs)).get("ROW_GROUPS", 1)  # as the plan resolved it
    return code, kernel.fn, kargs, mma_plan, 32 * row_groups


def main(argv=None):
    status = outside_interpreter("bench.sass", argv)
    if status is not None:
        return status
    args = parse_args(argv)
    formats = list(FORMAT_PAIRS) if "all" in args.format else args.format
    folder = args.keep or Path(tempfile.mkdtemp(prefix="blockscaled_sass_"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'pair':12s} {'variant':44s} " + " ".join(f"{c:>6s}" for c in COLUMNS))
    for fmt in formats:
        pair = FORMAT_PAIRS[fmt]
        _, _, a, b = make_operands(pair, args.M, args.N, args.K, "cpu", seed=0)
        b = b.with_data_layout("mma_m16k16")
        for i, variant in enumerate(args.variants):
            code, kernel_fn, kargs, plan, weights = mma_kernel_code(args, a, b, variant)
            counts = compile_sm90(code, kernel_fn, kargs, plan.cfg, folder, f"{fmt.replace('-', '_')}_{i}")
            label = json.dumps(variant, sort_keys=True)
            per_w = f"{counts['instr'] / weights:6.2f}"
            print(f"{bs.SUPPORTED_PAIRS[pair]:12s} {label[:44]:44s} {counts['instr']:6d} {per_w} "
                  + " ".join(f"{counts[c]:6d}" for c in COLUMNS[2:]))
    print(f"files: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
