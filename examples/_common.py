"""What the examples share: a device, the interpreter off the GPU, and a timing against cuBLAS bf16."""

import os

import torch

if not torch.cuda.is_available():  # Helion kernels run through the Triton interpreter on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def compare_with_cublas(fn, x, w_bf16):
    """Print fn's time and cuBLAS bf16's on the same shape (CUDA-graph replay); nothing off the GPU."""
    if DEVICE != "cuda":
        print("timings need a GPU")
        return
    import triton.testing as tt

    ours = tt.do_bench_cudagraph(fn, rep=50)
    bf16 = tt.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w_bf16), rep=50)
    print(f"{ours * 1e3:.1f} us, cuBLAS bf16 {bf16 * 1e3:.1f} us: {bf16 / ours:.2f}x (L2-warm weights)")
