"""`python -m bench.model` on the tiny Llama config: a transformers model with every linear swapped, prefill and
greedy decode with a static KV cache, agreement with the bf16 model. (Llama-3-8B's dimensions and CUDA graphs are
the GPU's part of the same command.)"""

import math

import pytest

pytest.importorskip("transformers")

from bench import model as bench_model  # noqa: E402


def test_tiny_llama_runs_quantized_and_agrees_with_bf16():
    rows = bench_model.run(bench_model.parse_args(["--model", "tiny", "--formats", "mxfp4", "nvfp4:nvfp4",
                                                   "nvfp4:nvfp4:static", "mxfp4+lm_head", "--batch", "1", "--prefill",
                                                   "8", "--decode", "2", "--reps", "1", "--device", "cpu",
                                                   "--no-graphs"]))
    bf16, mx, w4a4, static, head = rows
    assert bf16["variant"] == "bf16" and float(bf16["token_agreement"]) == 1.0 and math.isinf(float(bf16["logits_sqnr_db"]))
    # fp4 weights of a random model: 17.7 dB and 6 of 8 tokens agreed when written; a broken layer gives ~0 dB and
    # chance agreement (1 / 256)
    assert mx["variant"] == "mxfp4" and float(mx["logits_sqnr_db"]) > 10 and float(mx["token_agreement"]) >= 0.5
    assert float(mx["decode_tokens_per_s"]) > 0 and mx["decode_mode"] == "eager"
    # each layer's output against torch's fp32 product of the same codes on the same input: bf16 outputs in another
    # summation order (bf16's 2^-9 relative rounding is ~54 dB); a wrong block scale gives under 20
    assert float(mx["kernel_sqnr_db"]) > 40 and float(w4a4["kernel_sqnr_db"]) > 40, (mx, w4a4)
    # calibrated static activation scales: the check quantizes with the layer's own scale
    assert static["variant"] == "nvfp4:nvfp4:static" and float(static["kernel_sqnr_db"]) > 40, static
    assert head["variant"] == "mxfp4+lm_head" and float(head["kernel_sqnr_db"]) > 40, head


def test_static_variants_are_calibrated_and_checked():
    """WEIGHT:nvfp4:static: every nvfp4-activation layer gets a calibrated scale; +lm_head quantizes the lm_head too
    (else it stays bf16); other suffixes are refused."""
    import torch

    from blockscaled.nn import QuantizedLinear

    config, base = bench_model.build("tiny", 1, torch.device("cpu"))
    prompt = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    q = bench_model.quantized(base, "nvfp4:nvfp4:static", prompt)
    scales = [m.activation_global_scale for m in q.modules() if isinstance(m, QuantizedLinear)]
    assert len(scales) == 4 and all(isinstance(s, float) and s > 0 for s in scales), scales  # qkv, gate_up fused
    assert not isinstance(q.lm_head, QuantizedLinear)
    assert isinstance(bench_model.quantized(base, "mxfp4+lm_head", prompt).lm_head, QuantizedLinear)
    for bad in ("nvfp4:mxfp8:static", "nvfp4:nvfp4:dynamic", "nvfp4::static", "nvfp4+embed"):
        with pytest.raises(ValueError, match="WEIGHT:nvfp4:static, each optionally with \\+lm_head"):
            bench_model.quantized(base, bad, prompt)


def test_variants_run_q_k_v_and_gate_up_as_one_layer_each_unless_separate():
    """The default (and "+fused", older records' name for it) on the Qwen2 family (biased q / k / v): 4 quantized
    layers a decoder layer, "+separate" 7; with MX weights (same codes fused or not) the same logits either way
    (calibrated scales on the fused layers: `test_static_variants_are_calibrated_and_checked`)."""
    import torch

    from blockscaled.nn import FusedProjections, QuantizedLinear

    config, base = bench_model.build("tiny-qwen2", 1, torch.device("cpu"))
    prompt = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    separate, fused, named = (bench_model.quantized(base, v, prompt)
                              for v in ("mxfp4+separate", "mxfp4", "mxfp4+fused"))
    assert sum(isinstance(m, QuantizedLinear) for m in separate.modules()) == 7
    assert sum(isinstance(m, QuantizedLinear) for m in fused.modules()) == 4
    assert sum(isinstance(m, FusedProjections) for m in named.modules()) == 2
    assert sum(isinstance(m, FusedProjections) for m in fused.modules()) == 2
    with torch.no_grad():
        assert torch.equal(fused(prompt).logits, separate(prompt).logits)
    rows = bench_model.run(bench_model.parse_args(["--model", "tiny-qwen2", "--layers", "1", "--formats", "mxfp4+separate",
                                                   "mxfp4", "--batch", "2", "--prefill", "8", "--decode", "3",
                                                   "--reps", "1", "--device", "cpu", "--no-graphs", "--no-record"]))
    _, apart, together = rows  # the same agreement with bf16 (prefill logits); decode ran through the KV cache
    assert together["variant"] == "mxfp4" and float(together["kernel_sqnr_db"]) > 40, together
    assert (together["token_agreement"], together["logits_sqnr_db"]) == (apart["token_agreement"], apart["logits_sqnr_db"])


def test_tiny_qwen2_compiled_runs_quantized(tmp_path):
    """The second family (Qwen2: biased q / k / v projections) under `--compile` (aot_eager: the CPU machine has no
    C++ compiler for inductor): every linear a custom op in the traced graph, the kernels' check as in eager; with
    `--profile`, each variant's prefill and decode tables."""
    import torch

    torch._dynamo.reset()
    rows = bench_model.run(bench_model.parse_args([
        "--model", "tiny-qwen2", "--layers", "1", "--formats", "nvfp4", "--batch", "2", "--prefill", "8", "--decode", "2",
        "--reps", "1", "--device", "cpu", "--no-graphs", "--compile", "aot_eager", "--profile", str(tmp_path)]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{part}_{variant}_aot_eager_b2.txt" for part in ("decode8", "prefill") for variant in ("bf16", "nvfp4")]
    for part in ("decode8", "prefill"):
        assert "Name" in (tmp_path / f"{part}_nvfp4_aot_eager_b2.txt").read_text()
    bf16, q = rows
    assert q["compile"] == "aot_eager" and q["decode_mode"] == "eager" and float(q["decode_tokens_per_s"]) > 0
    assert float(q["kernel_sqnr_db"]) > 40 and float(q["logits_sqnr_db"]) > 10, q
    _, model = bench_model.build("tiny-qwen2", 1, torch.device("cpu"))
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # the biased projections the family brings


def test_a_pair_that_does_not_exist_fails_when_the_model_is_quantized():
    import torch

    _, model = bench_model.build("tiny", 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="activation_format: nvfp4 activations on mxfp8 weights are not supported"):
        bench_model.quantized(model, "mxfp8:nvfp4")


def test_mixtral_experts_quantized_as_transformers_runs_them():
    """Mixtral's experts (transformers 5: 3-D gate_up_proj / down_proj) become a QuantizedExperts: its loop gives
    transformers' eager experts loop's answer with the same (dequantized) weights, for the tokens each expert was
    routed (a wrong expert, a swapped gate / up half or a lost routing weight is off by O(1)); the whole tiny model
    through bench.model, each expert layer checked against fp32 on the input it saw; a layout it cannot run stays."""
    import copy

    import torch

    from blockscaled.nn import QuantizedExperts, quantize_model_

    config, base = bench_model.build("tiny-mixtral", 1, torch.device("cpu"))
    experts = base.model.layers[0].mlp.experts
    q = copy.deepcopy(base)
    report = quantize_model_(q, "mxfp4")
    assert report["model.layers.0.mlp.experts"] == "quantized experts", report
    quantized = q.model.layers[0].mlp.experts
    assert isinstance(quantized, QuantizedExperts) and quantized.num_experts == 4
    reference = copy.deepcopy(experts).float()
    reference.config._experts_implementation = "eager"
    err = experts_error(reference, quantized, False, torch.Generator().manual_seed(0), 7)
    assert err < 2e-2, err  # the activation and the gated rows rounded to bf16 on their way into each layer
    rows = bench_model.run(bench_model.parse_args(["--model", "tiny-mixtral", "--layers", "1", "--formats", "mxfp4",
                                                   "--batch", "2", "--prefill", "8", "--decode", "2", "--reps", "1",
                                                   "--device", "cpu", "--no-graphs", "--no-record"]))
    assert rows[1]["variant"] == "mxfp4" and float(rows[1]["kernel_sqnr_db"]) > 40, rows[1]
    experts.has_bias = True  # a layout the loop does not run: kept, with the reason
    report = quantize_model_(copy.deepcopy(base), "mxfp4")
    assert report["model.layers.0.mlp.experts"].startswith("skipped: experts layout not supported"), report


def experts_error(reference, quantized, transposed: bool, gen, tokens: int) -> float:
    """Relative error of `quantized` (a QuantizedExperts) against transformers' experts module `reference` (its own
    eager loop) holding the dequantized codes, on `tokens` random bf16 rows, each routed to 2 of 4 experts."""
    import torch

    with torch.no_grad():
        for name, layers in (("gate_up_proj", quantized.gate_up), ("down_proj", quantized.down)):
            dense = torch.stack([bs_dequantize(m.weight) for m in layers])
            getattr(reference, name).copy_(dense.transpose(1, 2) if transposed else dense)
        x = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16).float()
        top_k = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(tokens)])
        weights = torch.rand(tokens, 2, generator=gen)
        want, got = reference(x, top_k, weights), quantized(x, top_k, weights)
    return float((got - want).abs().max() / want.abs().max())


def bs_dequantize(w):
    """A QTensor's values in fp32 (the reference codec's, not the kernels')."""
    import blockscaled as bs

    return bs.reference.dequantize(w.k_order_copy if w.data_layout != "k_order" else w).float()


def test_gpt_oss_experts_quantized_as_transformers_runs_them():
    """gpt-oss's experts (transposed [E, H, 2I] / [E, I, H] weights, biases, interleaved gate / up halves clamped by
    its own `_apply_gate`): QuantizedExperts quantizes each expert's transposed matrices with their biases and gates
    through the class's own function; transformers' eager loop on the dequantized weights gives the same answer."""
    import copy

    import torch
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from blockscaled.nn import QuantizedExperts

    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       vocab_size=256)
    config._experts_implementation = "eager"
    gen = torch.Generator().manual_seed(0)
    experts = GptOssExperts(config)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 8)
    assert QuantizedExperts.supported(experts) is None and QuantizedExperts.supported(experts, 32) is None
    # hidden 64, intermediate 96 (the transposed layout's dims read the other way round)
    assert QuantizedExperts.supported(experts, 64) == "hidden 64 or intermediate 96 is not a multiple of the block 64"
    quantized = QuantizedExperts.from_experts(experts, "mxfp4")
    assert experts.gate_up_proj.shape == (4, 64, 192)  # the module given is left as it was
    err = experts_error(copy.deepcopy(experts), quantized, True, gen, 6)
    assert err < 2e-2, err
    assert float(quantized.gate_up[1].bias.float().sub(experts.gate_up_proj_bias[1]).abs().max()) == 0
    rows = bench_model.run(bench_model.parse_args(["--model", "tiny-gpt-oss", "--layers", "1", "--formats", "mxfp4",
                                                   "--batch", "2", "--prefill", "8", "--decode", "2", "--reps", "1",
                                                   "--device", "cpu", "--no-graphs", "--no-record"]))
    assert rows[1]["variant"] == "mxfp4" and float(rows[1]["kernel_sqnr_db"]) > 40, rows[1]  # the model, end to end


def test_experts_without_a_host_read_compile_whole():
    """While torch.compile traces (or a CUDA graph captures), QuantizedExperts runs every expert on every token and
    weights its rows by the routing: the loop's answer (Mixtral's and gpt-oss's layouts), exact zeros for a token
    routed only to the padding index, and `torch.compile(fullgraph=True)` compiles it with no graph break."""
    import copy

    import torch
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from blockscaled.nn import QuantizedExperts, quantize_model_

    gen = torch.Generator().manual_seed(0)
    config, base = bench_model.build("tiny-mixtral", 1, torch.device("cpu"))
    q = copy.deepcopy(base)
    quantize_model_(q, "mxfp4")
    mixtral = q.model.layers[0].mlp.experts
    oss_config = transformers.GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4,
                                           num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=16, vocab_size=256)
    oss = GptOssExperts(oss_config)
    with torch.no_grad():
        for p in oss.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 8)
    for quantized in (mixtral, QuantizedExperts.from_experts(oss, "mxfp4")):
        assert isinstance(quantized, QuantizedExperts) and quantized.num_experts == 4
        hidden = quantized.gate_up[0].in_features
        x = torch.randn(5, hidden, generator=gen)
        top_k = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(5)])
        top_k[3] = 4  # routed to the padding index only (expert parallelism): no expert's rows
        weights = torch.rand(5, 2, generator=gen)
        with torch.no_grad():
            loop, every = quantized(x, top_k, weights), quantized.every_expert(x, top_k, weights)
            graphs = []
            compiled = torch.compile(quantized, fullgraph=True,
                                     backend=lambda gm, _: graphs.append(gm) or gm)(x, top_k, weights)
        assert float(loop.abs().max()) > 0 and torch.equal(every[3], torch.zeros_like(every[3]))
        torch.testing.assert_close(every, loop, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled, every, rtol=1e-5, atol=1e-6)
        assert len(graphs) == 1  # one graph: no break


def test_a_record_of_older_columns_gains_the_attention_column(tmp_path):
    """Rows recorded before `attention` existed ran transformers' sdpa: the file is rewritten with the column filled
    so, and the new row appended under the full header."""
    import csv

    old = [f for f in bench_model.FIELDS if f != "attention"]
    path = tmp_path / "h200_model.csv"
    path.write_text(",".join(old) + "\n" + ",".join(str(i) for i in range(len(old))) + "\n")
    row = {f: "x" for f in bench_model.FIELDS} | {"gpu": "NVIDIA H200", "attention": "packed_gqa"}
    assert bench_model.record([row], tmp_path) == path
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == bench_model.FIELDS
    assert rows[0]["attention"] == "sdpa" and rows[0]["date"] == "0" and rows[1]["attention"] == "packed_gqa"


def test_packed_gqa_attention_in_the_model_run(tmp_path):
    """`--attention packed_gqa`: every variant's decode attention is `blockscaled::decode_attention` (the decode
    profile names it), the rows say so, and the quantized variant agrees with bf16 as under sdpa."""
    import torch

    torch._dynamo.reset()
    rows = bench_model.run(bench_model.parse_args([
        "--model", "tiny", "--layers", "1", "--formats", "nvfp4", "--batch", "2", "--prefill", "8", "--decode", "2",
        "--reps", "1", "--device", "cpu", "--no-graphs", "--attention", "packed_gqa", "--profile", str(tmp_path)]))
    assert [r["attention"] for r in rows] == ["packed_gqa", "packed_gqa"]
    for variant in ("bf16", "nvfp4"):
        assert "blockscaled::decode_attention" in (tmp_path / f"decode8_{variant}_none_b2.txt").read_text()
        assert "blockscaled::decode_attention" not in (tmp_path / f"prefill_{variant}_none_b2.txt").read_text()
    assert float(rows[1]["kernel_sqnr_db"]) > 40 and float(rows[1]["logits_sqnr_db"]) > 10, rows[1]


def test_the_attention_column_says_where_the_decode_kernel_refuses_the_heads():
    """A model whose heads the decode kernel takes records "packed_gqa"; one it refuses (a head dim that is not a power
    of two) "packed_gqa->sdpa", where the packed attention falls back to SDPA. Every model of `bench.model` runs the
    kernel (Qwen2.5-7B's 7 query heads a key / value head included)."""
    import torch
    from types import SimpleNamespace

    for name, (_, cfg) in bench_model.CONFIGS.items():
        config = SimpleNamespace(**cfg)
        assert bench_model.decode_attention_refuses(config, torch.device("cpu")) is None, name
    odd = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=96)  # head dim 24
    assert "D = 24" in bench_model.decode_attention_refuses(odd, torch.device("cpu"))


def test_inductor_pdl_is_a_compile_option(monkeypatch):
    """`--compile inductor+pdl` compiles with inductor's programmatic dependent launch on (and only then); another
    suffix is refused by name."""
    import torch._inductor.config as inductor_config

    seen = []
    monkeypatch.setattr(bench_model, "_run", lambda args, on_row: seen.append(inductor_config.triton.enable_pdl) or [])
    monkeypatch.setattr(inductor_config.triton, "enable_pdl", False)
    bench_model.run(bench_model.parse_args(["--compile", "inductor+pdl"]))
    bench_model.run(bench_model.parse_args(["--compile", "inductor"]))
    assert seen == [True, False] and inductor_config.triton.enable_pdl is False
    with pytest.raises(SystemExit):
        bench_model.parse_args(["--compile", "inductor+fast"])
