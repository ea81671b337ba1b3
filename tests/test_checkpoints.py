"""Quantized checkpoints in the wild (`blockscaled.checkpoints`): small safetensors files written in each published
layout, read back, and compared with a decode written here from each format's own description (not this project's
codecs): vLLM's `break_fp4_bytes` (low nibble first), ModelOpt's weight x weight_scale x weight_scale_2,
compressed-tensors' weight x weight_scale / weight_global_scale, gpt-oss's lut[blk & 0x0F] / lut[blk >> 4] and
ldexp(., scales - 127)."""

import pytest
import torch

safetensors_torch = pytest.importorskip("safetensors.torch")

import blockscaled as bs  # noqa: E402
from blockscaled import checkpoints  # noqa: E402
from blockscaled.nn import QuantizedLinear  # noqa: E402

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
N, K = 48, 128


def published_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] -> float64 [N, K]: element 2i in the low nibble of byte i, 2i + 1 in the high one."""
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).long()
    return E2M1[codes].reshape(packed.shape[0], -1)


def nvfp4_tensors(gen):
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    scale = (torch.rand(N, K // 16, generator=gen) * 6 + 0.02).to(torch.float8_e4m3fn)
    return packed, scale


def roundtrip(tmp_path, tensors):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    return safetensors_torch.load_file(str(path))


def test_modelopt_nvfp4(tmp_path, gen):
    packed, scale = nvfp4_tensors(gen)
    p = "model.layers.0.mlp.down_proj."
    bias = torch.randn(N, generator=gen)
    tensors = roundtrip(tmp_path, {p + "weight": packed, p + "weight_scale": scale,
                                   p + "weight_scale_2": torch.tensor(0.0123), p + "input_scale": torch.tensor(0.004),
                                   p + "bias": bias})
    g = torch.tensor(0.0123).double()  # the stored fp32 value
    want = (published_e2m1(packed).reshape(N, -1, 16) * scale.double()[..., None]).reshape(N, K) * g
    w, act = checkpoints.load_weight(tensors, p, "modelopt_nvfp4")
    torch.testing.assert_close(bs.dequantize(w, torch.float64), want, rtol=1e-15, atol=0)  # fp64 product order
    assert float(act) == float(torch.tensor(0.004))
    layer = checkpoints.load_linear(tensors, p, "modelopt_nvfp4", activation_format="nvfp4")
    assert isinstance(layer, QuantizedLinear) and layer.activation_global_scale == float(torch.tensor(0.004))
    torch.testing.assert_close(layer.bias, bias)
    x = torch.randn(3, K, generator=gen)
    ref = bs.reference.scaled_mm(bs.quantize(x, "nvfp4", global_scale=layer.activation_global_scale), w,
                                 bias=bias.to(torch.float32))
    assert bs.reference.max_rel_err(layer(x), ref) <= 1e-5


def test_compressed_tensors_nvfp4_global_scales_are_divisors(tmp_path, gen):
    packed, scale = nvfp4_tensors(gen)
    p = "layers.3.self_attn.q_proj."
    tensors = roundtrip(tmp_path, {p + "weight_packed": packed, p + "weight_scale": scale,
                                   p + "weight_global_scale": torch.tensor([448.0 * 6 / 3.5]),
                                   p + "input_global_scale": torch.tensor([250.0])})
    g = torch.tensor([448.0 * 6 / 3.5]).double()
    want = (published_e2m1(packed).reshape(N, -1, 16) * scale.double()[..., None] / g).reshape(N, K)
    w, act = checkpoints.load_weight(tensors, p, "compressed_tensors_nvfp4")
    got = bs.dequantize(w, torch.float64)
    # the stored divisor becomes an fp32 multiplier: within its one rounding (2^-24) of the published value
    assert float(((got - want).abs() / want.abs().clamp(min=1e-30)).max()) <= 2 ** -24
    assert float(act) == float(torch.tensor(1 / 250.0))
    assert checkpoints.load_linear(tensors, p, "compressed_tensors_nvfp4").activation_format is None


def test_gpt_oss_mxfp4(tmp_path, gen):
    blocks = torch.randint(0, 256, (2, N, K // 32, 16), generator=gen, dtype=torch.uint8)  # two experts
    scales = torch.randint(118, 136, (2, N, K // 32), generator=gen, dtype=torch.uint8)
    stored = roundtrip(tmp_path, {"block.0.mlp.mlp2_weight_blocks": blocks, "block.0.mlp.mlp2_weight_scales": scales})
    expert = 1
    tensors = {k: v[expert] for k, v in stored.items()}
    lut = E2M1[torch.stack((blocks[expert] & 0x0F, blocks[expert] >> 4), dim=-1).long()].reshape(N, K // 32, 32)
    want = torch.ldexp(lut, scales[expert].long()[..., None] - 127).reshape(N, K)
    w, act = checkpoints.load_weight(tensors, "block.0.mlp.mlp2_weight", "gpt_oss_mxfp4")
    assert act is None and w.fmt.name == "mxfp4"
    torch.testing.assert_close(bs.dequantize(w, torch.float64), want, rtol=0, atol=0)


def test_bad_checkpoints(gen):
    packed, scale = nvfp4_tensors(gen)
    with pytest.raises(ValueError, match="checkpoint_format: expected one of"):
        checkpoints.load_weight({}, "", "awq")
    with pytest.raises(KeyError, match="no 'x.weight_scale_2'"):
        checkpoints.load_weight({"x.weight": packed, "x.weight_scale": scale}, "x.", "modelopt_nvfp4")
    with pytest.raises(ValueError, match=r"x.weight_scale: expected \[48, 8\] block scales for x.weight \[48, 64\]"):
        checkpoints.load_weight({"x.weight": packed, "x.weight_scale": scale[:, :4], "x.weight_scale_2": torch.tensor(1.0)},
                                "x.", "modelopt_nvfp4")
    with pytest.raises(ValueError, match="x.weight_global_scale: expected a positive finite scale"):
        checkpoints.load_weight({"x.weight_packed": packed, "x.weight_scale": scale,
                                 "x.weight_global_scale": torch.tensor(0.0)}, "x.", "compressed_tensors_nvfp4")
    with pytest.raises(ValueError, match=r"m_blocks: expected uint8 \[N, K / 32, 16\]"):
        checkpoints.load_weight({"m_blocks": packed, "m_scales": packed}, "m", "gpt_oss_mxfp4")


@pytest.mark.parametrize("checkpoint_format", ["modelopt_nvfp4", "compressed_tensors_nvfp4"])
def test_load_model_into_a_model(tmp_path, gen, checkpoint_format):
    """A small model's linears written as an NVFP4 checkpoint of each format (codes and scales from
    `bs.quantize`), loaded into a fresh copy of the model: the same output as `quantize_model_` gives (ModelOpt:
    bit for bit; compressed-tensors: within its divisor's rounding), the layer without weights in the file kept."""
    import copy

    from torch import nn

    from blockscaled.nn import quantize_model_

    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 16))
    tensors = {}
    for name in ("0", "2"):
        q = bs.quantize(model.get_submodule(name).weight.detach(), "nvfp4")
        if checkpoint_format == "modelopt_nvfp4":
            tensors |= {f"{name}.weight": q.data, f"{name}.weight_scale": q.scale,
                        f"{name}.weight_scale_2": q.global_scale.reshape(1), f"{name}.input_scale": torch.tensor(0.01)}
        else:
            tensors |= {f"{name}.weight_packed": q.data, f"{name}.weight_scale": q.scale,
                        f"{name}.weight_global_scale": (1 / q.global_scale).reshape(1)}
    tensors = roundtrip(tmp_path, tensors)
    assert checkpoints.detect_format(tensors) == checkpoint_format
    want_model = copy.deepcopy(model)
    quantize_model_(want_model, "nvfp4", filter_fn=lambda name, _: name != "4")
    report = checkpoints.load_model_(model, tensors)
    assert report == {"0": "loaded", "2": "loaded", "4": "kept: no quantized weight in tensors"}
    x = torch.randn(5, 64, generator=gen)
    got, want = model(x), want_model(x)
    if checkpoint_format == "modelopt_nvfp4":
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:
        assert bs.reference.max_rel_err(got, want) <= 1e-6
    with pytest.raises(ValueError, match=r"tensors: 0. holds a \[48, 64\] weight, the model's 0 is \[48, 128\]"):
        checkpoints.load_model_(nn.Sequential(nn.Linear(128, 48)), tensors)


class _Attention(torch.nn.Module):
    """q / k / v of one input (Qwen2's biases optional) and the output projection, as a decoder layer calls them."""

    def __init__(self, bias: bool):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(64, n, bias=bias) for n in (64, 32, 32))
        self.o_proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.o_proj(self.q_proj(x) * torch.cat([self.k_proj(x), self.v_proj(x)], -1))


def _modelopt_tensors(module, names, shared: bool, input_scales=None) -> dict:
    """ModelOpt NVFP4 tensors of `module`'s linears `names`: with `shared`, the siblings quantized as one stacked
    weight (one weight_scale_2, as ModelOpt exports the shards of a fused layer), else each alone; biases too."""
    weights = [module.get_submodule(n).weight.detach() for n in names]
    if shared:
        q = bs.quantize(torch.cat(weights), "nvfp4")
        rows = [w.shape[0] for w in weights]
        parts = zip(q.data.split(rows), q.scale.split(rows), [q.global_scale] * len(names))
    else:
        parts = ((q.data, q.scale, q.global_scale) for q in (bs.quantize(w, "nvfp4") for w in weights))
    tensors = {}
    for i, (n, (data, scale, g)) in enumerate(zip(names, parts)):
        tensors |= {f"{n}.weight": data.contiguous(), f"{n}.weight_scale": scale.contiguous(),
                    f"{n}.weight_scale_2": g.reshape(1).clone(), f"{n}.input_scale": torch.tensor(
                        0.01 if input_scales is None else input_scales[i])}
        if module.get_submodule(n).bias is not None:
            tensors[f"{n}.bias"] = module.get_submodule(n).bias.detach().clone()
    return tensors


@pytest.mark.parametrize("bias", [False, True])
def test_load_model_fuses_siblings_that_share_a_global_scale(tmp_path, gen, bias, monkeypatch):
    """Siblings exported with one weight_scale_2 (ModelOpt's fused shards) load as one layer: the codes and scales
    stacked, each projection the separate layers' answer bit for bit (the biases the file's, not the module's,
    zeroed here); with their own global scales, or (W4A4) their own input scales, they load apart;
    `fuse_projections=False` loads every projection apart."""
    import copy

    torch.manual_seed(0)
    block = _Attention(bias)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    x = torch.randn(3, 64, generator=gen)
    tensors = roundtrip(tmp_path, _modelopt_tensors(block, names, shared=False) | _modelopt_tensors(
        block, names[:3], shared=True))
    fresh = copy.deepcopy(block)
    for n in names[:3] if bias else ():
        torch.nn.init.zeros_(fresh.get_submodule(n).bias)  # the file's biases are the ones taken
    fused, apart = copy.deepcopy(fresh), copy.deepcopy(fresh)
    report = checkpoints.load_model_(fused, tensors)
    assert report["k_proj"] == "loaded, fused into qkv_proj" and report["o_proj"] == "loaded"
    assert fused.qkv_proj.linear.out_features == 128 and fused.qkv_proj.linear.weight.global_scale.numel() == 1
    assert set(checkpoints.load_model_(apart, tensors, fuse_projections=False).values()) == {"loaded"}
    with torch.no_grad():
        torch.testing.assert_close(fused(x), apart(x), rtol=0, atol=0)
        for n in names[:3]:
            torch.testing.assert_close(fused.get_submodule(n)(x), apart.get_submodule(n)(x), rtol=0, atol=0)
    if bias:
        file_bias = torch.cat([tensors[f"{n}.bias"] for n in names[:3]])
        assert float(file_bias.abs().max()) > 0 and torch.equal(fused.qkv_proj.linear.bias, file_bias)
        assert torch.equal(apart.k_proj.bias, tensors["k_proj.bias"])

    own = roundtrip(tmp_path, _modelopt_tensors(block, names, shared=False))  # each its own weight_scale_2
    reads = []
    monkeypatch.setattr(checkpoints, "load_weight", lambda t, p, f, read=checkpoints.load_weight: (reads.append(p),
                                                                                                   read(t, p, f))[1])
    report = checkpoints.load_model_(copy.deepcopy(fresh), own)
    assert set(report.values()) == {"loaded"}
    assert sorted(reads) == sorted(f"{n}." for n in names)  # each weight read once: the global scales compared first
    monkeypatch.undo()
    inputs = roundtrip(tmp_path, _modelopt_tensors(block, names, shared=True, input_scales=(0.01, 0.02, 0.01, 0.01)))
    w4a4 = checkpoints.load_model_(copy.deepcopy(fresh), inputs, activation_format="nvfp4")
    assert set(w4a4.values()) == {"loaded"}  # one input, but the file gives it two static scales: kept apart
    w4a16 = checkpoints.load_model_(copy.deepcopy(fresh), inputs)  # the input scales unused: fused
    assert w4a16["v_proj"] == "loaded, fused into qkv_proj"


def test_gpt_oss_experts_load_into_the_model(tmp_path, gen):
    """gpt-oss's published MXFP4 experts (`<experts>.gate_up_proj_blocks` [E, 2I, H / 32, 16] with scales and
    biases, `down_proj_*`) load into transformers' GptOssExperts' place as a QuantizedExperts: its output is
    transformers' own eager experts loop on the weights decoded here as transformers' dequantizer does (low nibble
    first, 2^(scale - 127), then [E, rows, K] -> [E, K, rows]); only the experts are loaded."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from blockscaled.nn import QuantizedExperts

    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_local_experts=2, num_experts_per_tok=2,
                                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       vocab_size=256)
    config._experts_implementation = "eager"
    model = torch.nn.Module()
    model.mlp = torch.nn.Module()
    model.mlp.experts = GptOssExperts(config)
    model.mlp.proj = torch.nn.Linear(64, 64)
    tensors = {}
    for name, rows, k in (("gate_up_proj", 128, 64), ("down_proj", 64, 64)):
        tensors[f"mlp.experts.{name}_blocks"] = torch.randint(0, 256, (2, rows, k // 32, 16), generator=gen,
                                                              dtype=torch.uint8)
        tensors[f"mlp.experts.{name}_scales"] = torch.randint(122, 130, (2, rows, k // 32), generator=gen,
                                                              dtype=torch.uint8)
        tensors[f"mlp.experts.{name}_bias"] = torch.randn(2, rows, generator=gen)
    tensors = roundtrip(tmp_path, tensors)
    reference = GptOssExperts(config)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            blocks, scales = tensors[f"mlp.experts.{name}_blocks"], tensors[f"mlp.experts.{name}_scales"]
            lut = E2M1[torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()].reshape(*blocks.shape[:3], 32)
            dense = torch.ldexp(lut, scales.long()[..., None] - 127).reshape(*blocks.shape[:2], -1)
            getattr(reference, name).copy_(dense.transpose(1, 2))
            getattr(reference, f"{name}_bias").copy_(tensors[f"mlp.experts.{name}_bias"])
    report = checkpoints.load_model_(model, tensors)
    assert report == {"mlp.experts": "loaded experts"} and isinstance(model.mlp.experts, QuantizedExperts)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16).float()
    top_k = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]])
    weights = torch.rand(5, 2, generator=gen)
    with torch.no_grad():
        want, got = reference(x, top_k, weights), model.mlp.experts(x, top_k, weights)
    assert bs.reference.max_rel_err(got, want.double()) < 2e-2
    with pytest.raises(ValueError, match="module: expected transformers' gpt-oss experts layout"):
        checkpoints.load_experts(tensors, "mlp.experts.", torch.nn.Linear(4, 4))
