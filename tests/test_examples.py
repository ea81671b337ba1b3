"""The examples run as a user runs them (`python examples/<name>.py`) and check themselves against the fp64 reference."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("name", ["mma_decode", "dense_plan", "quantized_activations", "portable_dequant", "dot_scaled_codegen",
                                  "model_drop_in"])
def test_example_runs(name):
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    errs = [float(e) for e in re.findall(r"max_rel_err vs fp64 ([0-9.e+-]+)", r.stdout)]
    if name == "dot_scaled_codegen":
        assert "tl.dot_scaled(" in r.stdout
    else:
        assert errs and max(errs) <= 1e-5, r.stdout
