"""`python -m bench.sass`: what the block_dot kernel's K loop compiles to on sm_90, with no GPU.

For each pair and config variant (the dicts `python -m bench.variants` takes) it builds the
plan that an H100 would run (sm90 config table, 132 SMs, PTX decodes), has Helion write the
Triton code, compiles it for sm_90 with Triton's bundled ptxas, disassembles it and counts
the instructions of the K loop: barriers and shared-memory traffic (layout conversions),
tensor-core and conversion instructions, scale arithmetic. It needs the CUDA backend of
Triton (any Triton wheel for Linux), not a GPU. Counts are per loop iteration of one
thread: SPANS pairs of scale blocks of BN weight rows per program.
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
from blockscaled.kernels import api, configs
from blockscaled.kernels.block_dot_mm import block_dot_mm_kernel

from .providers import FORMAT_PAIRS, make_operands

H100_SMS = 132
COUNTS = {  # column: SASS opcode pattern
    "BAR": r"BAR\b", "STS": r"STS\b", "LDS": r"LDS(M)?\b", "LDG": r"LDG(STS)?\b", "HMMA": r"HMMA\b",
    "F2FP": r"F2FP\b", "HMUL2/HFMA2": r"H(MUL|FMA)2\b", "FMUL/FFMA": r"F(MUL|FMA)\b", "LOP3": r"LOP3\b",
    "ISETP/FSEL": r"(ISETP|FSEL)\b",
}
TRITON_TYPES = {torch.uint8: "*u8", torch.bfloat16: "*bf16", torch.float8_e4m3fn: "*fp8e4nv", torch.float32: "*fp32", torch.int32: "*i32"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.sass", description=__doc__)
    p.add_argument("--format", nargs="+", default=["all"], choices=[*FORMAT_PAIRS, "all"])
    p.add_argument("-M", type=int, default=1)
    p.add_argument("-N", type=int, default=8192)
    p.add_argument("-K", type=int, default=8192)
    p.add_argument("--variants", type=json.loads, default=[{}], help="JSON list of config-table field dicts")
    p.add_argument("--keep", type=Path, default=None, help="folder for the .py, .ptx and .sass files")
    return p.parse_args(argv)


@contextlib.contextmanager
def planned_as_h100():
    """Plan as on an H100 from a CPU process: sm90 table, 132 SMs, NVIDIA dot dtypes."""
    saved = configs.arch_key, api._sm_count, api._block_dot_dtype
    configs.arch_key = lambda device: "sm90"
    api._sm_count = lambda device: H100_SMS
    api._block_dot_dtype = lambda fa, fb, bm, device, fold: saved[2](fa, fb, bm, torch.device("cuda"), fold)
    try:
        yield
    finally:
        configs.arch_key, api._sm_count, api._block_dot_dtype = saved


def loop_counts(sass: str) -> dict:
    """Instruction counts of the first loop: from a label to the first branch back to it."""
    for label in re.finditer(r"^(\.L_x_\d+):", sass, re.M):
        back = sass.find(f"BRA `({label.group(1)})", label.end())
        if back > 0:
            body = sass[label.end():back]
            break
    else:
        raise ValueError("no loop in the SASS (did the K loop unroll away? use a larger K)")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", body)
    counts = {"instr": len(ops)}
    for name, pattern in COUNTS.items():
        counts[name] = sum(bool(re.match(pattern, op)) for op in ops)
    return counts


def compile_sm90(code: str, args, cfg, folder: Path, name: str) -> dict:
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
    fn = module._helion_block_dot_mm_kernel
    names = list(fn.arg_names)
    tensors = dict(zip(inspect.signature(block_dot_mm_kernel.fn).parameters, args, strict=True))
    signature = {p: TRITON_TYPES[tensors[p].dtype] for p in names}
    src = ASTSource(fn=fn, signature=signature, constexprs={}, attrs={(i,): [["tt.divisibility", 16]] for i in range(len(names))})
    opts = {"num_warps": cfg.config.get("num_warps", 4), "num_stages": cfg.config.get("num_stages", 2)}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    (folder / f"{name}.ptx").write_text(kernel.asm["ptx"])
    (folder / f"{name}.cubin").write_bytes(kernel.asm["cubin"])
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    sass = subprocess.check_output([str(nvdisasm), "-c", str(folder / f"{name}.cubin")], text=True)
    (folder / f"{name}.sass").write_text(sass)
    return loop_counts(sass)


def main(argv=None):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):  # the interpreter's @triton.jit cannot compile
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.call([sys.executable, "-m", "bench.sass", *(sys.argv[1:] if argv is None else argv)], env=env,
                               cwd=Path(__file__).parent.parent)
    args = parse_args(argv)
    formats = list(FORMAT_PAIRS) if "all" in args.format else args.format
    folder = args.keep or Path(tempfile.mkdtemp(prefix="blockscaled_sass_"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'pair':12s} {'variant':44s} " + " ".join(f"{c:>6s}" for c in ["instr", *COUNTS]))
    for fmt in formats:
        pair = FORMAT_PAIRS[fmt]
        _, _, a, b = make_operands(pair, args.M, args.N, args.K, "cpu", seed=0)
        if b.fmt.is_packed:
            b = b.with_data_layout("block_pairs")
        a_parts, b_parts = api._parts(a, b.device), api._parts(b, b.device)
        for i, variant in enumerate(args.variants):
            with planned_as_h100():
                plan = api._block_dot_plan(bs.SUPPORTED_PAIRS[pair], a_parts, b_parts, b.data_layout, False, args.M,
                                           args.N, args.K, configs.freeze_entry(variant))
            out = torch.empty((args.M, args.N), dtype=torch.float32)
            ws, tickets = plan.workspace or (out, out)
            kargs = (a_parts.data, a_parts.scale, b_parts.data, b_parts.scale, a_parts.global_scale, b_parts.global_scale,
                     out, out, ws, tickets, *plan.consts)
            code = block_dot_mm_kernel.bind(kargs).to_triton_code(plan.cfg)
            counts = compile_sm90(code, kargs, plan.cfg, folder, f"{fmt.replace('-', '_')}_{i}")
            label = json.dumps(variant, sort_keys=True)
            print(f"{bs.SUPPORTED_PAIRS[pair]:12s} {label[:44]:44s} " + " ".join(f"{counts[c]:6d}" for c in ["instr", *COUNTS]))
    print(f"files: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
