"""`blockscaled.nn` and the custom ops on the GPU: the layer's default (fast) layout, torch.compile with inductor and
with CUDA graphs ("reduce-overhead"), a hand-captured CUDA graph replayed on new inputs, a checkpoint loaded onto the
GPU. Every result against the fp64 reference of the same codes (or the eager layer, where the codes are the same)."""

import pytest
import torch
from torch import nn

import blockscaled as bs
from blockscaled import checkpoints
from blockscaled.nn import QuantizedLinear, calibrate, quantize_model_
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

pytestmark = pytest.mark.gpu

N, K = 768, 1024
BF16_BOUND = 1e-2  # bf16 output of an fp32 accumulation (tests/pairs.py)


def _linear(gen, n=N, k=K, bias=True):
    layer = nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen).to(layer.weight))
        if bias:
            layer.bias.copy_(torch.randn(n, generator=gen).to(layer.bias))
    return layer


def _want(q: QuantizedLinear, x2: torch.Tensor) -> torch.Tensor:
    a = x2.to(torch.bfloat16) if q.activation_format is None else bs.quantize(
        x2, q.activation_format, global_scale=q.activation_global_scale)
    return ref_scaled_mm(a, q.weight).double() + (0 if q.bias is None else q.bias.double())


@pytest.mark.parametrize("m", [1, 16, 600])
@pytest.mark.parametrize("weight_format,activation_format",
                         [("nvfp4", None), ("mxfp4", None), ("mxfp8", None), ("nvfp4", "nvfp4"), ("mxfp4", "mxfp8")])
def test_layer_default_is_the_fast_layout_and_correct(weight_format, activation_format, m, gen):
    """A layer made as the README says gets the mma layout; M = 1 / 16 (decode kernels) and 600 (dense plan)."""
    q = QuantizedLinear.from_linear(_linear(gen), weight_format, activation_format=activation_format)
    assert q.weight.data_layout == "mma_m16k16"
    x = torch.randn(m, K, generator=gen).to("cuda", torch.bfloat16)
    y = q(x)
    assert y.dtype == torch.bfloat16 and y.shape == (m, N)
    assert max_rel_err(y, _want(q, x)) < BF16_BOUND


@pytest.mark.parametrize("weight_format,activation_format", [("nvfp4", None), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp8")])
def test_a_batch_of_no_tokens_gpu(weight_format, activation_format, gen):
    """An empty batch through the mma-layout layer (eager, then captured in a CUDA graph beside a 1-row call): an
    empty result, and the 1-row call against fp64 in both."""
    q = QuantizedLinear.from_linear(_linear(gen), weight_format, activation_format=activation_format)
    empty, one = torch.randn(0, K, device="cuda"), torch.randn(1, K, generator=gen).to("cuda", torch.bfloat16)
    assert q(empty).shape == (0, N) and q(empty.reshape(2, 0, K)).shape == (2, 0, N)
    want = q(one)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got_empty, got = q(empty), q(one)
    graph.replay()
    torch.cuda.synchronize()
    assert got_empty.shape == (0, N)
    assert max_rel_err(got, _want(q, one)) < BF16_BOUND and max_rel_err(want, _want(q, one)) < BF16_BOUND


def _model(gen, weight_format, activation_format):
    model = nn.Sequential(_linear(gen), nn.GELU(), _linear(gen, n=512, k=N, bias=False))
    report = quantize_model_(model, weight_format, activation_format=activation_format)
    assert set(report.values()) == {"quantized"}
    return model


@pytest.mark.parametrize("m", [16, 600])
def test_calibrated_static_scales_on_the_gpu(m, gen):
    """`calibrate` on the GPU (the amax kept on the device, one sync on leaving): each nvfp4-activation layer's static
    scale is its largest input's, and on the batch holding it the calibrated model gives the dynamic model's output
    exactly; on another batch the layers match the fp64 reference of the codes their static scale gives."""
    model = _model(gen, "nvfp4", "nvfp4")
    batches = [torch.randn(m, K, generator=gen).to("cuda", torch.bfloat16) * s for s in (1.0, 5.0, 0.25)]
    dynamic = model(batches[1])
    with calibrate(model) as scales:
        for b in batches:
            model(b)
    # amax / 2688 correctly rounded to fp32 (through fp64: exact for a quotient); not the tensor's `/` on the GPU,
    # which multiplies by the divisor's reciprocal (an ulp off for some amaxes: 0.0077194944 against 0.0077194939)
    want = float(torch.tensor(float(batches[1].float().abs().amax()) / 2688.0, dtype=torch.float32))
    assert set(scales) == {"0", "2"} and scales["0"] == want, (scales, want)
    assert torch.equal(model(batches[1]), dynamic)
    x = batches[2]
    assert max_rel_err(model[0](x), _want(model[0], x)) < BF16_BOUND


@pytest.mark.parametrize("pdl", [False, True], ids=["no_pdl", "inductor_pdl"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("weight_format,activation_format", [("nvfp4", None), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp8")])
def test_torch_compile_inductor_matches_eager(weight_format, activation_format, mode, pdl, gen):
    """fullgraph (the custom op: no graph break) with inductor; "reduce-overhead" replays CUDA graphs, so each new
    input must reach the kernels through the graph's static buffers. The linears are opaque ops (the same kernels
    as eager); only the GELU between them is inductor's, so the bound is bf16's. With inductor's programmatic
    dependent launch (`triton.enable_pdl`) its GELU kernel may start while the linear before it runs (ours launch with
    PDL at 16 rows and let the next kernel start after their K loop): it must wait for that linear's output, and the
    linear after it for the GELU's."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    model = _model(gen, weight_format, activation_format)
    with inductor_config.patch({"triton.enable_pdl": pdl}):
        compiled = torch.compile(model, fullgraph=True, mode=mode)
        for step in range(4):  # compile, warm-up, record, replay
            x = (torch.randn(16, K, generator=gen) * (1 + step)).to("cuda", torch.bfloat16)
            want = model(x)
            got = compiled(x).clone()
            assert max_rel_err(got, want.double()) < BF16_BOUND, f"step {step}"


@pytest.mark.parametrize("weight_format,activation_format",
                         [("nvfp4", None), ("mxfp4", "mxfp8"), ("nvfp4", "nvfp4"), ("nvfp4", "nvfp4:static")])
def test_hand_captured_cuda_graph_replays_new_inputs(weight_format, activation_format, gen):
    """As a serving engine captures decode: warm up on a side stream, capture, copy new inputs in, replay ("static":
    the nvfp4 activation scales calibrated first, as a checkpoint's input_scale gives them)."""
    model = _model(gen, weight_format, activation_format.partition(":")[0] if activation_format else None)
    if activation_format == "nvfp4:static":
        with calibrate(model), torch.no_grad():
            model(torch.randn(8, K, generator=gen).to("cuda", torch.bfloat16) * 4)
        assert all(m.activation_scale is not None for m in model if isinstance(m, QuantizedLinear))
    static_x = torch.randn(8, K, generator=gen).to("cuda", torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)
    for step in range(3):
        x = (torch.randn(8, K, generator=gen) * (2 + step)).to("cuda", torch.bfloat16)
        static_x.copy_(x)
        static_y.fill_(float("nan"))
        graph.replay()
        with torch.no_grad():
            want = model(x)
        assert max_rel_err(static_y, want.double()) < BF16_BOUND, f"replay {step}"


def test_quantized_on_the_host_then_moved(gen):
    """A model quantized on the host (k_order codes) and moved with `.to("cuda")` then `.to(torch.bfloat16)`, as users
    load and move models: the weights land in the GPU's layout, the codes and scales keep their dtypes, and the
    product is the fp64 reference of the same codes."""
    model = nn.Sequential(nn.Linear(K, N), nn.GELU(), nn.Linear(N, 512, bias=False))
    quantize_model_(model, "nvfp4", activation_format="nvfp4", filter_fn=lambda name, m: name == "0")
    quantize_model_(model, "mxfp8", filter_fn=lambda name, m: name == "2")
    assert {m.weight.data_layout for m in model if isinstance(m, QuantizedLinear)} == {"k_order"}
    model[0].activation_global_scale = 0.01
    dtypes = {name: b.dtype for name, b in model.named_buffers()}
    model.to("cuda").to(torch.bfloat16)
    assert {name: b.dtype for name, b in model.named_buffers()} == dtypes
    for m in (model[0], model[2]):
        assert m.weight.data_layout == "mma_m16k16" and m.weight.data.is_cuda
    assert model[0].activation_scale.is_cuda and model[2].activation_scale is None
    x = torch.randn(16, K, generator=gen).to("cuda", torch.bfloat16)
    h = model[0](x)
    assert max_rel_err(h, _want(model[0], x)) < BF16_BOUND
    y = model[2](model[1](h))
    assert max_rel_err(y, _want(model[2], model[1](h))) < BF16_BOUND


def test_checkpoint_loaded_onto_the_gpu(gen):
    """A ModelOpt NVFP4 linear (host tensors, as safetensors loads them) loaded with device="cuda": the mma layout,
    the same product as the fp64 reference of the checkpoint's own codes."""
    w = bs.quantize(torch.randn(N, K, generator=gen), "nvfp4")  # rowmajor codes, as checkpoints store them
    p = "model.layers.0.mlp.down_proj."
    tensors = {p + "weight": w.data, p + "weight_scale": w.scale, p + "weight_scale_2": w.global_scale.reshape(1),
               p + "input_scale": torch.tensor(0.02)}
    for activation_format in (None, "nvfp4"):
        layer = checkpoints.load_linear(tensors, p, "modelopt_nvfp4", activation_format=activation_format,
                                        device="cuda")
        assert layer.weight.device.type == "cuda" and layer.weight.data_layout == "mma_m16k16"
        x = torch.randn(16, K, generator=gen).to("cuda", torch.bfloat16)
        a = x if activation_format is None else bs.quantize(x, "nvfp4", global_scale=layer.activation_global_scale)
        want = ref_scaled_mm(a, w.to("cuda")).double()
        assert max_rel_err(layer(x), want) < BF16_BOUND


class _Attention(nn.Module):
    """q / k / v of one input, as a decoder layer calls them."""

    def __init__(self, gen):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (_linear(gen, n=n, bias=False) for n in (1024, 256, 256))

    def forward(self, x):
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)


@pytest.mark.parametrize("m", [1, 16])
def test_fused_projections_on_the_gpu(m, gen):
    """`fuse_projections` on the GPU: one mma call a group, the fp64 reference of the stacked layer's codes, eager and
    replayed in a hand-captured CUDA graph on a new input (the siblings' hand-off happens once, at capture)."""
    model = _Attention(gen)
    report = quantize_model_(model, "nvfp4", fuse_projections=True)
    assert set(report.values()) == {"quantized, fused into qkv_proj"}
    stacked = model.qkv_proj.linear
    x = torch.randn(m, K, generator=gen).to("cuda", torch.bfloat16)
    assert max_rel_err(model(x), _want(stacked, x)) < BF16_BOUND
    static_x = x.clone()
    model(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    new = torch.randn(m, K, generator=gen).to("cuda", torch.bfloat16)
    static_x.copy_(new)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert max_rel_err(static_y, _want(stacked, new)) < BF16_BOUND
    assert model.qkv_proj._stash is None
    # siblings on two streams (two threads sharing a model and an input): the second stream runs the layer again
    calls, forward = [], stacked.forward
    stacked.forward = lambda t: calls.append(t) or forward(t)
    streams = torch.cuda.Stream(), torch.cuda.Stream()
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(streams[0]):
        q = model.q_proj(new)
    with torch.cuda.stream(streams[1]):
        k = model.k_proj(new)
    torch.cuda.synchronize()
    assert len(calls) == 2
    assert max_rel_err(torch.cat([q, k], -1), _want(stacked, new)[:, :1280]) < BF16_BOUND


def test_quantized_experts_on_the_gpu():
    """`QuantizedExperts` (transformers 5's 3-D experts) on the GPU, nvfp4 weights in the device's layout: each token's
    output the routing-weighted sum over its two experts of down(silu(gate x) * up x), computed token by token in
    fp32 from the dequantized codes (not through the module's expert loop)."""
    from blockscaled.nn import QuantizedExperts

    class Experts(nn.Module):  # the layout transformers' Mixtral / Qwen MoE experts keep
        def __init__(self, e, i, h, gen):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h, generator=gen, device="cuda") / 32)
            self.down_proj = nn.Parameter(torch.randn(e, h, i, generator=gen, device="cuda") / 16)
            self.act_fn = nn.SiLU()

    gen = torch.Generator(device="cuda").manual_seed(0)
    experts = QuantizedExperts.from_experts(Experts(4, 512, K, gen), "nvfp4")
    assert experts.gate_up[0].weight.data_layout == "mma_m16k16"
    x = torch.randn(5, K, generator=gen, device="cuda").to(torch.bfloat16)
    top_k = torch.tensor([[0, 3], [3, 1], [2, 0], [1, 2], [3, 0]], device="cuda")
    weights = torch.rand(5, 2, generator=gen, device="cuda")
    got = experts(x, top_k, weights)
    gate_up = [bs.reference.dequantize(m.weight.k_order_copy).double() for m in experts.gate_up]
    down = [bs.reference.dequantize(m.weight.k_order_copy).double() for m in experts.down]
    want = torch.zeros(5, K, dtype=torch.float64, device="cuda")
    for t in range(5):
        for slot in range(2):
            e = int(top_k[t, slot])
            gate, up = (gate_up[e] @ x[t].double()).chunk(2)
            want[t] += weights[t, slot].double() * (down[e] @ (nn.functional.silu(gate) * up))
    assert got.dtype == torch.bfloat16 and max_rel_err(got, want) < 2e-2
    # captured in a CUDA graph (every expert on every token, no host read), replayed on new routing and tokens
    static_x, static_k, static_w = x.clone(), top_k.clone(), weights.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        experts(static_x, static_k, static_w)  # warm-up: the eager loop, plans compiled
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out = experts(static_x, static_k, static_w)
    static_x.copy_(torch.randn(5, K, generator=gen, device="cuda"))
    static_k.copy_(top_k.flip(1).roll(1, 0))
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = experts(static_x, static_k, static_w)  # the eager loop on the new inputs
    assert not torch.isnan(static_out).any() and max_rel_err(static_out.float(), want.float()) < 1e-2
