"""Run `blockscaled_gemm` through a TritonBench checkout's own runner and metrics.

    python -m bench.tritonbench --tritonbench /path/to/tritonbench [TritonBench args] [-- operator args]
    e.g. python -m bench.tritonbench --tritonbench ~/tritonbench --metrics latency,tflops,gbps,accuracy --pair all -M 1 16

TritonBench finds operators by module path (`tritonbench.operators.<name>`), so this
loads bench/tritonbench_op.py under that name and lets TritonBench's loader return it for
`--op blockscaled_gemm`; nothing is written into the checkout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

OP_NAME = "blockscaled_gemm"
OP_FILE = Path(__file__).with_name("tritonbench_op.py")
DEFAULT_TOLERANCE = ["--rtol", "1.6e-2", "--atol", "1e-2"]


def load_operator_module():
    """Import bench/tritonbench_op.py as `tritonbench.operators.blockscaled_gemm`."""
    name = f"tritonbench.operators.{OP_NAME}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, OP_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def register(run_module) -> None:
    """Make TritonBench's loader (and run.py's imported copy of it) return our Operator."""
    import tritonbench.operators as ops

    original = ops.load_opbench_by_name

    def load(op_name):
        if op_name.lower() == OP_NAME:
            module = load_operator_module()
            module.Operator.name = OP_NAME
            return module.Operator
        return original(op_name)

    ops.load_opbench_by_name = load
    run_module.load_opbench_by_name = load


def build_argv(argv):
    """Our flags -> TritonBench argv: --op added, default tolerances unless given."""
    tb_args = list(argv)
    if "--op" not in tb_args:
        tb_args = ["--op", OP_NAME] + tb_args
    if "--rtol" not in tb_args:
        tb_args += DEFAULT_TOLERANCE[:2]
    if "--atol" not in tb_args:
        tb_args += DEFAULT_TOLERANCE[2:]
    return tb_args


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--tritonbench" not in argv:
        sys.exit("--tritonbench: path to a TritonBench checkout is required (it is not on PyPI)")
    i = argv.index("--tritonbench")
    checkout = Path(argv[i + 1]).resolve()
    del argv[i : i + 2]
    if not (checkout / "run.py").exists() or not (checkout / "tritonbench").is_dir():
        sys.exit(f"--tritonbench: {checkout} is not a TritonBench checkout (no run.py / tritonbench/)")
    sys.path.insert(0, str(checkout))
    spec = importlib.util.spec_from_file_location("tritonbench_run", checkout / "run.py")
    run_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_module)
    register(run_module)
    run_module.run(build_argv(argv))


if __name__ == "__main__":
    main()
