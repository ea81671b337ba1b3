"""TritonBench operator `blockscaled_gemm` (loaded by bench/tritonbench.py as
`tritonbench.operators.blockscaled_gemm`, the module path TritonBench reads the name from).

Providers: `cublas_bf16` (baseline: F.linear on the dequantized operands in bf16), `blockscaled`
(this project, activations quantized before the timing), `blockscaled_dynamic` (the bf16 activation
quantized in every timed call, as a W4A4 / W8A8 model runs), `blockscaled_k_order` and
`blockscaled_dense` (yardsticks). Extra args: --pair {nvfp4xnvfp4, ..., all}, -M, --n, --k,
--llama. Accuracy uses TritonBench's assert_close with --rtol/--atol; the runner sets
rtol 1.6e-2 / atol 1e-2 when not given: both outputs round an fp32 sum to bf16 once, so
they may differ by one bf16 ulp (2^-7 relative) and a little summation order.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark, register_metric

import blockscaled as bs
from bench.providers import (FORMAT_PAIRS, LLAMA_SHAPES, OURS_LAYOUT, add_llama_argument, operand_bytes, ours_weights,
                              quantize_pair)

PAIRS = {bs.SUPPORTED_PAIRS[p]: p for p in FORMAT_PAIRS.values()}


def parse_extra(args):
    p = argparse.ArgumentParser(prog="blockscaled_gemm")
    p.add_argument("--pair", default="all", choices=[*PAIRS, "all"])
    p.add_argument("-M", type=int, nargs="+", default=[1, 16, 64, 4096])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    add_llama_argument(p)
    return p.parse_args(args or [])


class Operator(BenchmarkOperator):
    DEFAULT_METRICS = ["latency", "tflops", "gbps", "accuracy"]
    DEFAULT_PRECISION = "bf16"

    def __init__(self, tb_args, extra_args=None):
        super().__init__(tb_args, extra_args)
        self.opts = parse_extra(self.extra_args)

    def get_input_iter(self):
        # TritonBench's input_cast walks the inputs and accepts tensors and plain values
        # only, so inputs are the float tensors; the providers quantize them (untimed).
        pairs = list(PAIRS) if self.opts.pair == "all" else [self.opts.pair]
        nks = LLAMA_SHAPES[self.opts.llama] if self.opts.llama else [(self.opts.n, self.opts.k)]
        for i, (pair_name, (n, k), m) in enumerate((p, nk, m) for p in pairs for nk in nks for m in self.opts.M):
            gen = torch.Generator(device=self.device).manual_seed(i)
            # bf16 values: `blockscaled_dynamic` quantizes x in bf16 to the codes the other providers quantize
            x = torch.randn(m, k, device=self.device, generator=gen).to(torch.bfloat16).float()
            w = torch.randn(n, k, device=self.device, generator=gen)
            yield pair_name, x, w

    def get_x_val(self, example_inputs):
        pair_name, x, w = example_inputs
        return (pair_name, x.shape[0], w.shape[0], w.shape[1])

    def _operands(self, pair_name, x, w):
        return quantize_pair(PAIRS[pair_name], x.float(), w.float())

    @register_benchmark(baseline=True)
    def cublas_bf16(self, pair_name, x, w):
        """cuBLAS on the dequantized operands. element x block scale is exact in bf16; an
        nvfp4 global scale is not, so it multiplies the fp32 result instead (rounding the
        operands would cost more accuracy than the kernels under test lose)."""
        a, b = self._operands(pair_name, x, w)
        g = 1.0
        operands = []
        for t in (a, b):
            if isinstance(t, torch.Tensor):
                operands.append(t)
                continue
            if t.global_scale is not None:
                g = g * t.global_scale
                t = dataclasses.replace(t, global_scale=torch.ones_like(t.global_scale))
            operands.append(t.dequantize(torch.bfloat16))
        a_bf16, w_bf16 = operands
        if isinstance(g, float):
            return lambda: torch.nn.functional.linear(a_bf16, w_bf16)
        return lambda: (torch.nn.functional.linear(a_bf16, w_bf16).float() * g).to(torch.bfloat16)

    @register_benchmark()
    def blockscaled(self, pair_name, x, w):
        """What a user gets: weights prepared once for the device (`QTensor.for_device`, as
        `blockscaled.quantize_weight` does), the fastest kernel there."""
        a, b = self._operands(pair_name, x, w)
        b = ours_weights("blockscaled", b)
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16, device=w.device)
        return lambda: bs.scaled_mm(a, b, out=out)

    @register_benchmark()
    def blockscaled_dynamic(self, pair_name, x, w):
        """The bf16 activation quantized in every call (`scaled_mm(..., activation_format=...)`), weights for the
        device: the same codes as `blockscaled`'s activation, so the same result; bf16-activation pairs run as
        `blockscaled`."""
        fa = PAIRS[pair_name][0]
        _, b = self._operands(pair_name, x, w)
        b = ours_weights("blockscaled", b)
        xb = x.to(torch.bfloat16)
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16, device=w.device)
        fmt = None if fa == "bf16" else fa
        return lambda: bs.scaled_mm(xb, b, activation_format=fmt, out=out)

    @register_benchmark()
    def blockscaled_k_order(self, pair_name, x, w):
        """k_order weights: the portable kernels (CPU interpreter, other GPUs), as a yardstick."""
        a, b = self._operands(pair_name, x, w)
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16, device=w.device)
        return lambda: bs.scaled_mm(a, b, out=out)

    @register_benchmark()
    def blockscaled_dense(self, pair_name, x, w):
        """The weights decoded to bf16, then cuBLAS (`backend="dense"`): the fallback any user could write, at every
        M; the default takes it from M = 512 (`api._dense_runs`: from 1024 where the 16-warp mma tile fits one wave).
        Weights for the device as `blockscaled`'s."""
        a, b = self._operands(pair_name, x, w)
        b = ours_weights("blockscaled", b)
        if b.data_layout != "mma_m16k16":  # the plan decodes that layout; elsewhere it is not a choice
            b = b.with_data_layout("mma_m16k16")
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16, device=w.device)
        return lambda: bs.scaled_mm(a, b, out=out, backend="dense")

    @register_metric()
    def flops(self, fn_name, example_inputs, metrics):
        _, m, n, k = self.get_x_val(example_inputs)
        return 2.0 * m * n * k

    @register_metric()
    def gbps(self, fn, example_inputs, metrics):
        """Bytes each provider must read and write over its latency. TritonBench passes the
        benchmark callable, named by its `_name`."""
        provider = getattr(fn, "_name", fn)
        pair_name, m, n, k = self.get_x_val(example_inputs)
        if provider == "blockscaled_dynamic":  # the activation read in bf16
            nbytes = 2 * m * k + operand_bytes(PAIRS[pair_name][1], n, k)
        elif provider in OURS_LAYOUT:
            nbytes = operand_bytes(PAIRS[pair_name][0], m, k) + operand_bytes(PAIRS[pair_name][1], n, k)
        else:
            nbytes = 2 * (m * k + n * k)
        return (nbytes + 2 * m * n) / metrics.latency / 1e6
