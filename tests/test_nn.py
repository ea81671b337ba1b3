"""`blockscaled.nn` on the CPU (Triton interpreter): nn.Linear's contract, state_dict round trip, in-place swap."""

import io

import pytest
import torch
from torch import nn

import blockscaled as bs
from blockscaled.nn import QuantizedLinear, calibrate, quantize_model_
from blockscaled.reference import max_rel_err, scaled_mm as ref_scaled_mm

interpreter = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test (the layer on CPU tensors)")


def _linear(k=64, n=48, bias=True, gen=None):
    layer = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(n, generator=gen))
    return layer


@interpreter
@pytest.mark.parametrize("activation_format", [None, "nvfp4"])
def test_forward_follows_nn_linear_contract(activation_format, gen):
    """3-D and non-contiguous inputs, fp32 / fp16 / bf16 in and out, bias: the fp64 reference of the same codes."""
    linear = _linear(gen=gen)
    q = QuantizedLinear.from_linear(linear, "nvfp4", activation_format=activation_format)
    x = torch.randn(2, 5, 64 * 2, generator=gen)[..., ::2]  # [2, 5, 64], not contiguous
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        y = q(xd)
        assert y.shape == (2, 5, 48) and y.dtype == dtype
        x2 = xd.reshape(10, 64)
        a = x2.to(torch.bfloat16) if activation_format is None else bs.quantize(x2, activation_format)
        want = ref_scaled_mm(a, q.weight).double() + linear.bias.detach().double()
        assert max_rel_err(y.reshape(10, 48), want) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


@interpreter
def test_state_dict_round_trip(gen):
    q = QuantizedLinear.from_linear(_linear(gen=gen), "mxfp4", activation_format="mxfp8", scale_rounding="rceil")
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    other = QuantizedLinear.from_linear(_linear(k=32, n=16, bias=True), "nvfp4")  # another size and format
    other.load_state_dict(torch.load(buf, weights_only=False))
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(other(x), q(x))
    assert other.weight.fmt.name == "mxfp4" and other.activation_format == "mxfp8" and other.scale_rounding == "rceil"
    assert "weight_format=mxfp4" in repr(other) and "in_features=64, out_features=48" in repr(other)


@interpreter
def test_static_scale_is_a_device_buffer_and_survives_round_trips(gen, monkeypatch):
    """A static activation scale reaches the op as the layer's float32 [1] buffer (no number copied to the device in
    each call: a host sync, refused inside a CUDA-graph capture), follows `.to()`, a state_dict round trip and a
    compiled graph, and is checked when set."""
    q = QuantizedLinear.from_linear(_linear(gen=gen), "nvfp4", activation_format="nvfp4")
    assert q.activation_scale is None
    q.activation_global_scale = 0.01
    assert q.activation_scale.dtype == torch.float32 and q.activation_scale.tolist() == [float(torch.tensor(0.01))]
    assert "activation_scale" not in q.state_dict()  # the float is in the extra state
    import blockscaled.nn as bnn

    seen, real = [], bnn.linear_eager
    monkeypatch.setattr(bnn, "linear_eager", lambda *args: seen.append(args[5]) or real(*args))
    x = torch.randn(3, 64, generator=gen)
    y = q(x)
    monkeypatch.undo()
    assert seen and seen[0] is q.activation_scale
    want = ref_scaled_mm(bs.quantize(x, "nvfp4", global_scale=0.01), q.weight).double() + q.bias.double()
    assert max_rel_err(y, want) < 1e-5
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    other = QuantizedLinear.from_linear(_linear(gen=gen), "nvfp4", activation_format="nvfp4")
    other.load_state_dict(torch.load(buf, weights_only=False))
    assert other.activation_global_scale == q.activation_global_scale and torch.equal(other(x), y)
    assert torch.equal(other.to(torch.device("cpu")).activation_scale, q.activation_scale)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(q, fullgraph=True, backend="aot_eager")(x), y)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="activation_global_scale"):
            q.activation_global_scale = bad
    q.activation_global_scale = None
    assert q.activation_scale is None


@interpreter
def test_dtype_casts_leave_the_codes_and_moves_rebuild_the_weight(gen):
    """`model.to(torch.bfloat16)` / `.half()` (what users do to a whole model) cast the bias and leave the codes,
    scales and static scale as they are, so the state_dict still loads; a move (here `_apply` with copies, as `.to`
    makes on another device) rebuilds the weight from the moved buffers."""
    model = nn.Sequential(_linear(gen=gen), nn.ReLU(), _linear(48, 32, gen=gen))
    quantize_model_(model, "mxfp8", filter_fn=lambda name, m: name == "0")
    quantize_model_(model, "nvfp4", activation_format="nvfp4", filter_fn=lambda name, m: name == "2")
    model[2].activation_global_scale = 0.02
    codes = {name: b.clone() for name, b in model.named_buffers()}
    x = torch.randn(3, 64, generator=gen)
    model.to(torch.bfloat16)
    for name, b in model.named_buffers():  # the same dtype and bits
        bits = codes[name].reshape(-1).view(torch.uint8)
        assert b.dtype == codes[name].dtype and torch.equal(b.reshape(-1).view(torch.uint8), bits), name
    assert model[0].bias.dtype == torch.bfloat16
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    model.float()
    other = nn.Sequential(_linear(gen=gen), nn.ReLU(), _linear(48, 32, gen=gen))
    quantize_model_(other, "mxfp8", filter_fn=lambda name, m: name == "0")
    quantize_model_(other, "nvfp4", activation_format="nvfp4", filter_fn=lambda name, m: name == "2")
    other.load_state_dict(torch.load(buf, weights_only=False))
    other.float()
    assert torch.equal(other(x), model(x))  # the same codes, and the same bias (through bf16 in both)
    old, before = {name: b for name, b in model.named_buffers()}, model(x)
    model._apply(lambda t: t.clone())
    for layer, prefix in ((model[0], "0."), (model[2], "2.")):
        assert layer.weight.data is layer.weight_data is not old[prefix + "weight_data"]
        assert layer.weight.scale is layer.weight_scale
    assert torch.equal(model(x), before)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    model.to("meta").to_empty(device="cpu")  # as loaders initialize: no codes to arrange until the state_dict
    model.load_state_dict(torch.load(buf, weights_only=False))
    assert torch.equal(model(x), before)


def _calibration_model(gen):
    """nvfp4 activations on layers 0 and 2, weight-only layer 4, mxfp8 activations on layer 6."""
    model = nn.Sequential(_linear(64, 32, gen=gen), nn.ReLU(), _linear(32, 32, gen=gen), nn.ReLU(),
                          _linear(32, 32, gen=gen), nn.ReLU(), _linear(32, 16, gen=gen))
    quantize_model_(model, "nvfp4", activation_format="nvfp4", filter_fn=lambda name, m: name in ("0", "2"))
    quantize_model_(model, "nvfp4", filter_fn=lambda name, m: name == "4")
    quantize_model_(model, "mxfp8", activation_format="mxfp8", filter_fn=lambda name, m: name == "6")
    return model


@interpreter
def test_calibrate_sets_the_scale_the_largest_input_would_get(gen):
    """Each nvfp4-activation layer's scale = reference.nvfp4_global_scale of everything it saw; on the batch with the
    largest |x| the calibrated layer gives exactly the per-call (dynamic) result; other layers untouched."""
    from blockscaled.reference.quantize import nvfp4_global_scale

    model = _calibration_model(gen)
    batches = [torch.randn(3, 64, generator=gen) * s for s in (0.5, 7.0, 2.0)]
    seen = {"0": [], "2": []}
    hooks = [model[int(n)].register_forward_pre_hook(lambda m, a, n=n: seen[n].append(a[0].detach())) for n in seen]
    dynamic = [model[:3](b) for b in batches]  # layer 2's output, each batch quantized by its own amax
    with calibrate(model) as scales:
        for b in batches:
            model(b)
    for h in hooks:
        h.remove()
    assert set(scales) == {"0", "2"}
    for name in ("0", "2"):
        want = float(nvfp4_global_scale(torch.cat(seen[name][3:])))  # the calibration calls (after the dynamic ones)
        assert scales[name] == want == model[int(name)].activation_global_scale, name
    assert model[4].activation_global_scale is None and model[6].activation_global_scale is None
    assert torch.equal(model[:3](batches[1]), dynamic[1])  # batch 1 (x 7) holds layer 0's amax and layer 2's


@interpreter
def test_calibrate_leaves_scales_on_errors_and_unreached_layers(gen):
    """A NaN among a layer's inputs: ValueError naming it, no scale set; an exception in the block: scales as they
    were; a layer no call reached keeps its scale."""
    model = _calibration_model(gen)
    model[2].activation_global_scale = 0.25
    with calibrate(model) as scales:
        model[0](torch.randn(2, 64, generator=gen))  # layer 2 never called
    assert set(scales) == {"0"} and model[2].activation_global_scale == 0.25
    before = {n: model[n].activation_global_scale for n in (0, 2)}
    x = torch.randn(2, 64, generator=gen)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"calibrate: non-finite activations \(NaN or Inf\) reached 0"):
        with calibrate(model):
            model[0](x)
    assert {n: model[n].activation_global_scale for n in (0, 2)} == before
    with pytest.raises(RuntimeError, match="stop"):
        with calibrate(model):
            model(torch.randn(2, 64, generator=gen))
            raise RuntimeError("stop")
    assert {n: model[n].activation_global_scale for n in (0, 2)} == before
    assert not model[0]._forward_pre_hooks  # hooks removed every time


@interpreter
def test_quantize_model_swaps_eligible_linears_and_reports_the_rest(gen):
    model = nn.Sequential(_linear(64, 32, gen=gen), nn.ReLU(), _linear(32, 40, gen=gen), _linear(40, 8, gen=gen))
    x = torch.randn(4, 64, generator=gen)
    report = quantize_model_(model, "mxfp4", filter_fn=lambda name, m: name != "2")
    assert report["0"] == "quantized" and report["2"] == "skipped: filter_fn"
    assert report["3"].startswith("skipped: in_features 40 is not a multiple of the block 32")
    assert isinstance(model[0], QuantizedLinear) and type(model[2]) is nn.Linear and type(model[3]) is nn.Linear
    assert model(x).shape == (4, 8)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="weight"):
        QuantizedLinear(torch.zeros(4, 4))
    with pytest.raises(TypeError, match="linear"):
        QuantizedLinear.from_linear(nn.Conv1d(1, 1, 1), "nvfp4")
    q = QuantizedLinear(bs.quantize(torch.randn(16, 32), "nvfp4"))
    with pytest.raises(ValueError, match=r"x: expected \[..., in_features = 32\], got shape \(2, 31\)"):
        q(torch.randn(2, 31))
    with pytest.raises(ValueError, match=r"x: expected \[..., in_features = 32\], got shape \(\)"):
        q(torch.tensor(1.0))
    with pytest.raises(ValueError, match="linear: in_features = 40 must be a multiple of the nvfp4 block size 16"):
        QuantizedLinear.from_linear(nn.Linear(40, 8), "nvfp4")
    with pytest.raises(TypeError, match="filter_fn: expected a callable"):
        quantize_model_(nn.Sequential(nn.Linear(32, 32)), "nvfp4", filter_fn="0")
    with pytest.raises(TypeError, match="x:"):
        q(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="activation_format"):
        QuantizedLinear(bs.quantize(torch.randn(16, 32), "nvfp4"), activation_format="bf16")


def test_custom_ops_pass_opcheck(gen):
    """`torch.library.opcheck`: the fake (meta) implementation against the real one, dispatch under AOT, autograd
    registration. (Not its test_schema: that one does arithmetic on the inputs, which CPU float8 tensors refuse.)"""
    from blockscaled import ops

    checks = ("test_faketensor", "test_aot_dispatch_static", "test_autograd_registration")

    w = bs.quantize(torch.randn(24, 64, generator=gen), "nvfp4")
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(24, generator=gen).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.blockscaled.linear, (x, w.data, w.scale, w.global_scale, bias, "nvfp4", w.layout,
                                                         w.data_layout, 24, 64, None, "floor", None, torch.bfloat16), test_utils=checks)
    xf = torch.randn(3, 64, generator=gen)
    torch.library.opcheck(torch.ops.blockscaled.linear, (xf, w.data, w.scale, w.global_scale, None, "nvfp4", w.layout,
                                                         w.data_layout, 24, 64, "nvfp4", "floor", torch.tensor([0.01]), torch.float32),
                          test_utils=checks)
    for fmt, layout in (("nvfp4", "swizzle_32_4_4"), ("mxfp4", "rowmajor")):
        torch.library.opcheck(torch.ops.blockscaled.quantize, (xf, fmt, "floor", layout, None), test_utils=checks)
    torch.library.opcheck(torch.ops.blockscaled.step_mask, (torch.rand(2, 1, 1, 9, generator=gen) < 0.5,),
                          test_utils=checks)
    # inference only: an input that requires grad is refused by name, not differentiated wrongly
    with pytest.raises(RuntimeError, match="blockscaled::linear has no derivative"):
        torch.ops.blockscaled.linear(xf.requires_grad_(), w.data, w.scale, w.global_scale, None, "nvfp4", w.layout,
                                     w.data_layout, 24, 64, "nvfp4", "floor", None, torch.float32)
    with pytest.raises(RuntimeError, match="blockscaled::quantize has no derivative"):
        torch.ops.blockscaled.quantize(xf, "mxfp4", "floor", "rowmajor", None)
    xf = xf.detach()
    q = ops.quantize(xf, "mxfp8", scale_rounding="rceil")
    ref = bs.quantize(xf, "mxfp8", scale_rounding="rceil")
    assert torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8))
    assert torch.equal(q.scale.view(torch.uint8), ref.scale.view(torch.uint8))


@pytest.mark.parametrize("activation_format", [None, "nvfp4"])
def test_torch_compile_fullgraph_matches_eager(activation_format, gen):
    """A model of QuantizedLinears under `torch.compile(fullgraph=True)` (no graph break: the custom op), the same
    result as eager. The aot_eager backend traces with the fake implementation and needs no C++ compiler (the CPU
    machine); inductor and CUDA graphs are the GPU's part."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 32, bias=False))
    report = quantize_model_(model, "mxfp4" if activation_format is None else "nvfp4", activation_format=activation_format)
    x = torch.randn(2, 3, 64, generator=gen)
    want = model(x)
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    graphs = []
    torch._dynamo.reset()
    torch.compile(model, fullgraph=True, backend=lambda gm, _: graphs.append(gm.code) or gm)(x)
    quantized = sum(v == "quantized" for v in report.values())  # mxfp4 skips the 48-wide layer (block 32)
    assert graphs[0].count("torch.ops.blockscaled.linear(") == quantized >= 1  # each quantized layer one op node


class _Block(nn.Module):
    """A decoder layer's projections as Llama calls them: q, k, v of one input, then gate and up of another."""

    def __init__(self, gen, k=64, bias=False):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (_linear(k, n, bias=bias, gen=gen) for n in (64, 32, 32))
        self.gate_proj, self.up_proj = _linear(k, 96, bias=False, gen=gen), _linear(k, 96, bias=False, gen=gen)
        self.o_proj = _linear(64, k, bias=False, gen=gen)

    def forward(self, x):
        q, kk, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = self.o_proj(q * torch.cat([kk, v], -1).view(*x.shape[:-1], 2, 32).flip(-2).reshape(*x.shape[:-1], 64))
        return self.up_proj(h) * nn.functional.silu(self.gate_proj(h))


def _count_calls(monkeypatch) -> list:
    calls = []
    forward = QuantizedLinear.forward
    monkeypatch.setattr(QuantizedLinear, "forward", lambda self, x: calls.append(self) or forward(self, x))
    return calls


@interpreter
@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_separate_layers(bias, gen, monkeypatch):
    """`fuse_projections` (the default): q / k / v and gate / up each one QuantizedLinear (one kernel) over their
    stacked weights; MX weights quantize to the same codes either way, so the block's output is the separate layers'
    bit for bit (bias included); 3 calls instead of 6; the report names the fused layer; a state_dict round trip into
    a fresh fused copy."""
    import copy

    block = _Block(gen, bias=bias)
    separate, fused = copy.deepcopy(block), copy.deepcopy(block)
    quantize_model_(separate, "mxfp4", fuse_projections=False)
    report = quantize_model_(fused, "mxfp4")
    assert report["k_proj"] == "quantized, fused into qkv_proj" and report["up_proj"] == "quantized, fused into gate_up_proj"
    assert report["o_proj"] == "quantized" and fused.qkv_proj.linear.out_features == 128
    x = torch.randn(2, 3, 64, generator=gen)
    calls = _count_calls(monkeypatch)
    with torch.no_grad():
        want = separate(x)
        n_separate = len(calls)
        got = fused(x)
    assert n_separate == 6 and len(calls) - n_separate == 3
    assert torch.equal(got, want)
    again = copy.deepcopy(block)
    quantize_model_(again, "mxfp4", fuse_projections=True)
    again.load_state_dict(fused.state_dict())
    assert "qkv_proj.linear.weight_data" in fused.state_dict() and "q_proj.weight_data" not in fused.state_dict()
    with torch.no_grad():
        assert torch.equal(again(x), want)


@interpreter
def test_fused_nvfp4_shares_the_stacked_weights_global_scale(gen):
    """nvfp4: one global scale for the stacked weight (its amax), so each projection equals the fp64 product of the
    stacked layer's codes (not of its own layer's)."""
    block = _Block(gen)
    quantize_model_(block, "nvfp4", fuse_projections=True)
    x = torch.randn(5, 64, generator=gen)
    stacked = block.qkv_proj.linear.weight
    want = ref_scaled_mm(x.to(torch.bfloat16), stacked).double()
    with torch.no_grad():
        got = torch.cat([block.q_proj(x), block.k_proj(x), block.v_proj(x)], -1)
    assert stacked.global_scale.numel() == 1 and max_rel_err(got, want) < 1e-2


@interpreter
def test_a_fused_projection_runs_again_for_another_input_or_one_written_in_place(gen, monkeypatch):
    """A sibling takes the fused output only for the same tensor, unmodified, once: another input, an in-place write
    since, a sibling called twice or out of order run the layer again (each answer the layer's own on its input)."""
    import copy

    block = _Block(gen)
    quantize_model_(block, "mxfp8", fuse_projections=True)
    stacked = copy.deepcopy(block.qkv_proj.linear)
    x = torch.randn(3, 64, generator=gen)

    def own(name, t):  # the projection on `t` from a fresh run of the stacked layer
        i = block.qkv_proj.names.index(name)
        start = sum(block.qkv_proj.sizes[:i])
        return stacked(t)[..., start:start + block.qkv_proj.sizes[i]]

    calls = []
    forward = block.qkv_proj.linear.forward
    monkeypatch.setattr(block.qkv_proj.linear, "forward", lambda t: calls.append(t) or forward(t))
    with torch.no_grad():
        q = block.q_proj(x)
        x.add_(1.0)  # written in place after q_proj read it
        k = block.k_proj(x)
        assert len(calls) == 2 and torch.equal(k, own("k_proj", x)) and not torch.equal(q, own("q_proj", x))
        v = block.v_proj(x.clone())  # another tensor
        assert torch.equal(v, own("v_proj", x)) and len(calls) == 3
        block.v_proj(x), block.v_proj(x)  # twice: the second runs the layer again
        assert len(calls) == 5
        block.v_proj(x), block.q_proj(x), block.k_proj(x)  # out of order, each once: one run
        assert len(calls) == 6 and block.qkv_proj._stash is None  # all three took it: nothing kept


def test_projections_that_differ_are_not_fused(gen):
    """Siblings unlike each other (bias on some, another input size) or one of them filtered out: quantized apart."""
    block = _Block(gen)
    block.k_proj = _linear(64, 32, bias=True, gen=gen)  # bias where q and v have none
    block.gate_proj = _linear(64, 96, gen=gen)
    report = quantize_model_(block, "mxfp4", fuse_projections=True, filter_fn=lambda name, m: name != "gate_proj")
    assert report["q_proj"] == report["k_proj"] == "quantized" and report["up_proj"] == "quantized"
    assert report["gate_proj"] == "skipped: filter_fn" and not hasattr(block, "qkv_proj")


def test_fused_projections_compile_to_one_op_a_group(gen):
    """Under `torch.compile(fullgraph=True)` the siblings' hand-off is traced away: one `blockscaled.linear` node for
    q / k / v and one for gate / up (and o_proj's), the result eager's, no recompilation on a new input."""
    torch._dynamo.reset()
    block = _Block(gen)
    quantize_model_(block, "mxfp4", fuse_projections=True)
    x = torch.randn(2, 64, generator=gen)
    graphs = []
    compiled = torch.compile(block, fullgraph=True, backend=lambda gm, _: graphs.append(gm.code) or gm)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x), rtol=0, atol=0)
        x2 = torch.randn(2, 64, generator=gen)
        torch.testing.assert_close(compiled(x2), block(x2), rtol=0, atol=0)
    assert len(graphs) == 1 and graphs[0].count("torch.ops.blockscaled.linear(") == 3
    assert block.qkv_proj._stash is None and block.gate_up_proj._stash is None


def test_experts_modules_the_loop_cannot_run_are_skipped():
    """3-D experts whose forward takes the hidden states alone (Llama 4's: every expert on every token) or whose
    weights are not of a known layout stay as they are, with the reason in the report."""

    class AllTokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(2, 64, 32))
            self.down_proj = nn.Parameter(torch.randn(2, 32, 16))
            self.act_fn = nn.SiLU()

        def forward(self, hidden_states):
            return hidden_states

    class Routed(AllTokens):
        def forward(self, hidden_states, top_k_index, top_k_weights):
            return hidden_states

    model = nn.Module()
    model.a, model.b = AllTokens(), Routed()
    report = quantize_model_(model, "mxfp4")
    assert report["a"] == "skipped: experts forward not (hidden_states, top_k_index, top_k_weights)"
    assert report["b"].startswith("skipped: experts layout not supported") and "(2, 64, 32)" in report["b"]
    assert type(model.a) is AllTokens and type(model.b) is Routed
